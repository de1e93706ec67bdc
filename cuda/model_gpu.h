/* model_gpu.h — the Wan 2.1 DiT on one GPU: fp32 master weights, bf16 working copies, fp32 gradients, packed forward/backward of the rectified-flow loss. */
#ifndef ALDIT_MODEL_GPU_H
#define ALDIT_MODEL_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"
#include "cuda/seqpar_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "model/model.h" /* plain C without its own linkage block */

/* The GPU twin of a CPU `model` (src/model.h), which stays the source of the dims and of the parameter
   table: every flat device buffer below has the host table's offsets (param_info.offset), so a gradient
   all-reduce, a norm and AdamW run over one buffer each, and a checkpoint maps name by name.
   Precision: bf16 weights and activations in the GEMMs, attention and the fused norms; fp32 statistics,
   accumulators, modulation vectors and the whole time-embedding path (B rows, on the fp32 masters).
   Activations live in a workspace sized once for the largest micro-batch the caller will pass; how many
   of them are kept for the backward is the recomputation mode (gpu_recompute below).
   Needs qk_norm = 1 and cross_attn_norm = 1 (Wan 2.1's settings), in_dim == out_dim, dim and ffn_dim
   multiples of 8, head_dim a multiple of 16 up to 128. */
typedef struct gpu_model gpu_model;

typedef struct {
    int64_t n_weights;   /* = host model's n_weights */
    float *master;       /* fp32 [n_weights], device: the weights AdamW updates */
    gpu_bf16 *working;   /* bf16 [n_weights], device: the copy the forward/backward reads */
    float *grads;        /* fp32 [n_weights], device: gradients, ADDED into by gpu_model_forward_backward */
} gpu_model_buffers;

/* Activation recomputation ([train] recompute; the caller maps deck_recompute):
   NONE: every block keeps all its activations for the backward: about 2 * num_layers * (18 dim + 2 ffn_dim)
   bytes per token (plus 3 * 2 dim per text row and layer).
   BLOCK: a block keeps only its input (the bf16 residual stream x_in, 2 dim bytes per token), its LayerNorm
   statistics (8 bytes per token) and its per-sample modulation vectors; one block's activations (about
   2 * (17 dim + 2 ffn_dim) bytes per token) are shared by all blocks. The backward re-runs each block's
   forward from its kept input (all but the last block, whose activations are still there) just before it
   needs them, with the same kernels on the same inputs: loss and gradients are those of NONE, bit for bit.
   It costs one more forward of num_layers - 1 blocks. */
typedef enum { GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK } gpu_recompute;

/* Allocate everything on the current GPU (gpu_select first) for micro-batches of at most
   max_tokens tokens (after patchify), max_samples samples and max_text text rows in all (0 means
   max_samples * text_len), keeping activations as `recompute` says. A larger micro-batch is a fatal error
   naming the sizes. Weights and gradients start at zero: upload weights next. The model's dims and table
   are read now; host_model->weights is not. Fatal (naming what) when a setting is unsupported or memory
   runs out. gpu_model_create is this with GPU_RECOMPUTE_NONE. */
gpu_model *gpu_model_create_with_recompute(const model *host_model, int64_t max_tokens, int max_samples,
                                           int64_t max_text, gpu_recompute recompute);
gpu_model *gpu_model_create(const model *host_model, int64_t max_tokens, int max_samples, int64_t max_text);
void gpu_model_free(gpu_model *gm);

/* Where the forward/backward finds the parameters: the model's own whole buffers (gpu_model_create), or what a
   caller that holds the training state itself (a sharded one, cuda/shard_gpu.h) says with gpu_model_set_params.
   With the flat parameter array's parts (model_layout): the embeddings [0, blocks_offset), block l
   [blocks_offset + l block_stride, + block_stride), the head [head_first = blocks_offset + num_layers block_stride,
   n_weights), and within the embeddings the time path [time_first = time_in.weight, blocks_offset):
   - bf16 weights the GEMMs and norms read: the embeddings' (embedding_weights[i] is value i) and the head's
     (head_weights[i] is value head_first + i), whole; a block's from block_weights;
   - fp32 weights the time path and the modulations read (in fp32, on the B rows of a micro-batch): the time path's
     from time_weights, head.modulation [2 dim], each block's modulation [6 dim] and norm3.weight followed by
     norm3.bias [2 dim] (block_modulation[l], block_norm3[l]: num_layers pointers each);
   - fp32 gradients the backward ADDS into: the head's (as its weights), the embeddings' from embedding_grads, a
     block's from block_grads.
   block_weights(context, layer, next, stream): called on the host as the model is about to queue block `layer`'s
   forward, re-run or backward on `stream`; returns its bf16 weights (block_stride values, the block's own offsets)
   for the work queued on `stream` from now until it asks for another block's (the pointer may be reused then).
   `next` is the block it will ask for after this one (-1: none in this call), for a prefetch.
   block_grads(context, layer, stream): called just after block_weights as block `layer`'s backward begins; returns
   the fp32 array (block_stride values) its gradients are added into from now until gpu_grads_ready_fn reports
   the block's range.
   embedding_grads(context, stream): called as the embeddings' backward begins (after the first block's range is
   reported); returns the fp32 array (blocks_offset values, embedding_grads[i] is value i) the embeddings' gradients
   are added into from now until gpu_grads_ready_fn reports their range.
   time_weights(context, backward, stream): called as the time path's forward (backward 0: the first call of a
   forward, before any block_weights) and its backward (backward 1: after embedding_grads) are about to be queued;
   returns its fp32 weights (blocks_offset - time_first values, time_weights[i] is value time_first + i) for the time
   path's work queued from now (the model asks again before the next).
   All are called in the same order on every call with the same model (gpu_model_grads_ready_all replays them). */
typedef const gpu_bf16 *(*gpu_block_weights_fn)(void *context, int layer, int next, cudaStream_t stream);
typedef float *(*gpu_block_grads_fn)(void *context, int layer, cudaStream_t stream);
typedef float *(*gpu_embedding_grads_fn)(void *context, cudaStream_t stream);
typedef const float *(*gpu_time_weights_fn)(void *context, int backward, cudaStream_t stream);
typedef struct {
    const gpu_bf16 *embedding_weights, *head_weights;
    const float *head_modulation;
    const float *const *block_modulation, *const *block_norm3;  /* arrays the caller keeps while they are set */
    float *head_grads;
    gpu_block_weights_fn block_weights;
    gpu_block_grads_fn block_grads;
    gpu_embedding_grads_fn embedding_grads;
    gpu_time_weights_fn time_weights;
    void *context;
} gpu_model_params;

/* gpu_model_create_with_recompute without the parameter buffers (master, bf16 and gradients: 10 bytes per
   parameter fewer): gpu_model_set_params must come before the first forward_backward; upload, download,
   refresh_working, zero_grads and get_buffers are not available (fatal; get_buffers gives NULLs). */
gpu_model *gpu_model_create_without_params(const model *host_model, int64_t max_tokens, int max_samples,
                                           int64_t max_text, gpu_recompute recompute);
/* Fatal on a model with its own buffers, or when a pointer or function is missing. */
void gpu_model_set_params(gpu_model *gm, const gpu_model_params *params);
/* Device bytes of the activation workspace gpu_model_create_with_recompute allocates for this capacity and
   mode, without allocating anything: exactly layout_memory_bytes of model_layout_memory(host_model->layout,
   LAYOUT_BACKEND_GPU, recompute, gpu_model_device_scratch_bytes(host_model)) at (max_tokens, max_samples,
   max_text), the one memory formula the balancer plans with (model/layout.h). Weights, bf16 copies and
   gradients add 10 bytes per parameter. gpu_model_workspace_bytes: GPU_RECOMPUTE_NONE. */
size_t gpu_model_workspace_bytes_with_recompute(const model *host_model, int64_t max_tokens, int max_samples,
                                                int64_t max_text, gpu_recompute recompute);
size_t gpu_model_workspace_bytes(const model *host_model, int64_t max_tokens, int max_samples, int64_t max_text);
/* The part of the backward scratch that depends on the current GPU (its SM count and the kernels' occupancy,
   not the micro-batch): the memory formula's device_scratch_bytes. Needs the GPU selected. */
int64_t gpu_model_device_scratch_bytes(const model *host_model);

/* Which kernels run self- and cross-attention ([train] attention in the deck; the caller maps deck_attention):
   AUTO: cuDNN's fused attention for samples of at least min_cudnn_tokens tokens (for cross-attention: whose
   text has the model's full text_len rows, as Wan pads captions; other lengths would each need their own
   plans) when aldit was built with cuDNN and its plans build for this model's heads
   (attention_cudnn_available), our own kernel otherwise; CUDNN: the same, but a fatal error (exit 2) when
   cuDNN is not there; OWN: our own kernel only. min_cudnn_tokens 0 means GPU_ATTENTION_CUDNN_MIN_TOKENS.
   Returns 1 when cuDNN will serve long samples. gpu_model_create sets AUTO with the default threshold.
   cuDNN keeps its own device buffer, outside gpu_model_device_bytes: about 4 * num_heads * S * (head_dim + 1)
   bytes plus its plans' workspace for the longest sample S it served (S query rows; cross-attention's
   backward needs no more than self-attention's: see attention_cudnn.h). */
typedef enum { GPU_ATTENTION_AUTO, GPU_ATTENTION_CUDNN, GPU_ATTENTION_OWN } gpu_attention_choice;
#define GPU_ATTENTION_CUDNN_MIN_TOKENS 1024
int gpu_model_set_attention(gpu_model *gm, gpu_attention_choice choice, int64_t min_cudnn_tokens);
/* Autotuning ([train] autotune sets both; off at gpu_model_create): whether the model's GEMMs (gemm_create's
   autotune) and its cuDNN attention (attention_cudnn_create's) time their candidate configurations on first use and
   keep the fastest. Drops the plans built so far (set it before the first step). cuDNN runs the self-attention of a micro-batch's last
   sample over whole tiles of ATTENTION_CUDNN_TILE rows, zero-padded (attention_cudnn_fwd_padded), and the
   backward runs in order on the caller's stream. */
void gpu_model_set_autotune(gpu_model *gm, int gemm_autotune, int attention_autotune);
/* The model's GEMM and cuDNN contexts (handles, plan caches, cuDNN's buffer, their autotuning), handed from one
   model to the next of the same dims and settings on the same GPU and host thread, so that the later model runs the
   shapes the earlier one ran without building their plans again (the start-up calibration's models of one and two
   blocks, then the training model), though the two models never exist at once. gpu_model_take_contexts leaves the
   model without contexts: it may only be freed then. gpu_model_give_contexts frees the model's own and takes these
   (NULL: none taken, a no-op). */
typedef struct gpu_model_contexts gpu_model_contexts;
gpu_model_contexts *gpu_model_take_contexts(gpu_model *gm);
void gpu_model_give_contexts(gpu_model *gm, gpu_model_contexts *contexts);
/* Host seconds the last gpu_model_forward_backward call spent queuing its work (staging the batch, every
   launch), before it waited for the GPU: where this approaches the GPU's time the step is launch-bound. */
double gpu_model_enqueue_seconds(const gpu_model *gm);
/* The cuDNN execution plans its attention context has built so far and the host seconds of those builds and their
   autotuning (attention_cudnn_setup_stats); 0 and 0 without cuDNN. */
void gpu_model_setup_stats(const gpu_model *gm, int64_t *plans_built, double *seconds);
/* Before the steps: the cuDNN plans of these samples' attention shapes (tokens[i] video tokens, text_rows[i] caption
   rows as the model takes them), as a micro-batch of this model alone (no group) would build them at first use. The
   hunyuanvideo15 family: each sample's joint length N = tokens + text_rows on whole tiles (two plans a length). Wan:
   each sample's self-attention over its tokens, at that length and on whole tiles (the last sample of a micro-batch
   runs so), and its cross-attention where text_rows is the model's text_len (up to six plans a length). Lengths
   where they reach the model's cuDNN threshold (gpu_model_set_attention), the longest first, while their plans fit
   half of ATTENTION_CUDNN_PLAN_SLOTS. Returns the plans built (0 without cuDNN or with its attention off). */
int64_t gpu_model_prepare(gpu_model *gm, const int32_t *tokens, const int32_t *text_rows, int64_t n);

/* Gradient readiness, for an all-reduce that overlaps the backward (src/gradsync.h): while `ready` is set,
   each gpu_model_forward_backward call calls ready(context, first, count, stream) on the calling thread as
   soon as the work that completes gradient values [first, first + count) has been queued on `stream`:
   each block's parameters in turn, last block first, then the head's, then the embeddings' (patch, text,
   time, time projection). The ranges are disjoint and cover all n_weights values once per call; the rest
   of the call's work queued on `stream` does not touch them again. NULL turns it off (the default). */
typedef void (*gpu_grads_ready_fn)(void *context, int64_t first, int64_t count, cudaStream_t stream);
void gpu_model_set_grads_ready(gpu_model *gm, gpu_grads_ready_fn ready, void *context);
/* Make every call to the parameter source (block_weights, block_grads, embedding_grads, time_weights) and report every range, in
   the order a forward_backward call would, computing nothing: for a rank with no micro-batch in a step (or fewer
   than another rank), whose collectives must be the same calls as the others'. */
void gpu_model_grads_ready_all(const gpu_model *gm, cudaStream_t stream);

/* Precision of the Wan block's large linears ([train] precision; bf16 at creation): fp8 = 1 runs self q/k/v/o,
   cross q/o and the FFN's two linears of every block with FP8 operands through cuBLASLt (gemm.h's FP8 section): the
   forward E4M3 input x E4M3 weight, dgrad E5M2 output gradient x E4M3 weight, wgrad E4M3 input x E5M2 gradient, bf16
   outputs and fp32 weight gradients; the cross-attention's k/v of the text rows, embeddings, time and text MLPs,
   modulation, norms, RoPE, attention, gates and the head stay as they are. Each of those linears has three scaled
   tensors (input, weight, output gradient; self k and v share q's input) under delayed scaling (cuda/fp8.h) with an
   amax history of amax_history steps and the given margin; the casts run just before each GEMM from the bf16
   tensors the model already keeps (a separate pass over each GEMM input; the weights on every use, the input again in
   the backward), into a scratch of its own, gpu_model_fp8_bytes(host_model, max_tokens) bytes outside the workspace.
   The exception, from the second step on: the FFN's first GEMM emits its GELU output in E4M3 at the second's input
   scale, with its amax (gemm_fp8_fwd_gelu_fp8; where cuBLASLt has no algorithm for it, the cast as above), and the
   bf16 GELU output (saved ffn_act) is then not written: the backward casts the second linear's input from the kept
   pre-activation (fp8_quantize_gelu) in either case.
   attention ([train] fp8_attention; 0 off, 1 forward, 2 both directions): the self-attention of the samples that run
   on cuDNN also in FP8 (cuda/attention_fp8.h; E4M3 q, k, v, o and probabilities, E5M2 do, dp, dq, dk, dv), with ten
   more scaled tensors per block in the same set after the linears'; the bf16 q, k, v, o and their gradients stay
   what the rest of the block reads and keeps (cast in, decoded out, each a pass over the sample's rows), and the
   self-attention's stats are cuDNN's FP8 ones. Before the set's first update (a run's first step) the attention runs
   bf16 and the FP8 calls only record their amaxes. A shape cuDNN refuses runs bf16 (counted:
   gpu_model_fp8_attention_refused). Fatal unless head_dim is 128 and cuDNN attention is on (gpu_model_set_attention
   first); cross-attention stays bf16.
   Fatal on a GPU below compute capability 8.9 or when dim or ffn_dim is not a multiple of 16. fp8 = 0 frees it
   all (the scaling state is lost). */
void gpu_model_set_precision(gpu_model *gm, int fp8, int amax_history, int margin, int attention);
size_t gpu_model_fp8_bytes(const model *host_model, int64_t max_tokens, int attention);
int64_t gpu_model_fp8_attention_refused(const gpu_model *gm);
int gpu_model_precision_fp8(const gpu_model *gm);
/* The step's delayed-scaling update (fp8_scaling_update), queued on `stream`: once per optimizer step, after it.
   Nothing in bf16. */
void gpu_model_fp8_step(gpu_model *gm, cudaStream_t stream);
/* Before the first step of a run that restored no scaling state (none restored: no update done yet), forget what casts
   so far recorded (fp8_scaling_reset; start-up warm-ups). Nothing in bf16 or once an update was done or restored. */
void gpu_model_fp8_fresh(gpu_model *gm, cudaStream_t stream);
/* For timing (start-up calibration): where no update was done yet, one update from what the casts recorded so far, so
   that later calls run as training's steps after the first do (delayed scaling: one pass per cast, the FFN's GELU
   emitted in FP8) rather than at the first step's current scaling. gpu_model_fp8_restart then forgets it all (the
   scaling state of a model not yet trained). Nothing in bf16. */
void gpu_model_fp8_steady(gpu_model *gm, cudaStream_t stream);
void gpu_model_fp8_restart(gpu_model *gm, cudaStream_t stream);
/* The running amaxes of the step (fp8_scaling_amax; device, *count values; NULL and 0 in bf16), for a max over the
   data-parallel ranks before gpu_model_fp8_step, so that every rank scales alike. */
float *gpu_model_fp8_amax(gpu_model *gm, int *count);
/* The scaling state for checkpoints (fp8_scaling_save/load): its size (0 in bf16), a copy (waits for `stream`),
   and a restore (1 and why on a mismatch). */
size_t gpu_model_fp8_state_bytes(const gpu_model *gm);
void gpu_model_fp8_save(const gpu_model *gm, void *blob, cudaStream_t stream);
int gpu_model_fp8_load(gpu_model *gm, const void *blob, size_t bytes, char *why, size_t why_size);
/* The model's scaling set (NULL in bf16), for tests: tensor (layer * 8 + linear) * 3 + role, linear in the order
   self q, k, v, o, cross q, o, FFN in, out; role input, weight, gradient; with fp8 attention then layers * 24 +
   layer * 10 + role, role q, k, v, o, s, do, dp, dq, dk, dv. */
struct fp8_scaling *gpu_model_fp8_scaling(gpu_model *gm);

gpu_model_buffers gpu_model_get_buffers(const gpu_model *gm);
/* Device bytes this model holds: weights, bf16 copies, gradients (where it has its own) and the workspace (not its
   cuBLASLt and cuDNN contexts'). */
size_t gpu_model_device_bytes(const gpu_model *gm);

/* Host fp32 weights [n_weights] -> master and bf16 copies. Synchronous. */
void gpu_model_upload_weights(gpu_model *gm, const float *weights);
/* Master weights -> host [n_weights]. Synchronous. */
void gpu_model_download_weights(const gpu_model *gm, float *weights);
/* Gradients -> host [n_weights]. Synchronous. */
void gpu_model_download_grads(const gpu_model *gm, float *grads);
/* Refresh the bf16 copies from the masters (after the masters were written on the device). */
void gpu_model_refresh_working(gpu_model *gm, cudaStream_t stream);
void gpu_model_zero_grads(gpu_model *gm, cudaStream_t stream);

/* Sequence parallelism (Ulysses): the groups' NCCL communicators (cuda/seqpar_gpu.h, made once at start-up) a
   micro-batch with sp_size = k > 1 runs on (seqpar_gpu_get(groups, k)); NULL (the default): none, and such a
   micro-batch is refused (exit 2). The model keeps the pointer. */
void gpu_model_set_seqpar(gpu_model *gm, const seqpar_gpu *groups);

/* model_forward_backward on the GPU: the same batch (host memory, as in model.h), the same checks (a bad
   shape is a fatal error naming the sample, exit status 2), the same semantics: returns the SUM of the
   per-sample losses, writes each into sample_loss (host, may be NULL) and ADDS grad_scale * gradient into
   the fp32 gradient buffer. With batch->sp_size = k > 1 (every member of the group calls it, with the same whole
   batch) member p computes rows [p T/k, (p+1) T/k) of the T packed tokens, as model.h's CPU model: everything per
   row on its rows (RoPE at each row's position in its whole sample), self-attention over every row for heads
   [p H/k, (p+1) H/k) between two all-to-alls on the group's stream (seqpar_gpu_alltoall_bf16: q, k, v out, the
   output back; the backward mirrors them; block recomputation re-runs them), and the loss, sample_loss and
   gradients are this member's PARTS (summed over the group: k = 1's, to bf16 rounding). The capacity (max_tokens)
   bounds the member's rows (and the whole micro-batch's T rows at H/k heads, the attention backward's scratch). The
   head layout's buffers are a device allocation of their own, outside the workspace's formula, grown on the first
   micro-batch that needs more (cudaMalloc: the device is waited for then): per block kept (one block under
   GPU_RECOMPUTE_BLOCK) q, k, v, output [T, D/k] bf16 and log-sum-exps [T, H/k] fp32, plus four [T, D/k] for the
   backward, three [N, D] packing buffers (N the member's rows) and the whole samples' latents and noise (fp32).
   hunyuanvideo15 splits both streams, its video rows and its joint text rows, the same way (cuda/mmdit_gpu.h says how,
   and what its group buffers hold). The batch is staged through pinned host memory and copied on `stream`;
   RoPE positions, row offsets and sinusoids are computed on the host. Work is queued on `stream`, and the
   call waits for it once at the end (to return the loss); the gradients are complete then. */
double gpu_model_forward_backward(gpu_model *gm, const model_batch *batch, float grad_scale, double *sample_loss,
                                  cudaStream_t stream);
/* The same loss, forward only (validation): the batch staged and checked as above, the forward's kernels, the
   per-sample losses into sample_loss (may be NULL) and their sum returned; no gradient of the prediction, no
   backward, the gradient buffer and the grads_ready callback untouched. Waits for its work. A batch of no
   samples (n_samples 0, no arrays read) computes nothing, returns 0 and makes the parameter source's calls a
   forward makes (time_weights, then block_weights of each block), in their order: for a rank with fewer
   validation micro-batches than another, whose collectives (a sharded state's gathers) must be the same calls
   as the others'. */
double gpu_model_forward_loss(gpu_model *gm, const model_batch *batch, double *sample_loss, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
