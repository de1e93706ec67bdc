/* mmdit_gpu.h — HunyuanVideo-1.5's MMDiT on one GPU (the hunyuanvideo15 family's block code behind model_gpu.h): bf16 activations, fp32 statistics, packed forward/backward of the rectified-flow loss. */
#ifndef ALDIT_MMDIT_GPU_H
#define ALDIT_MMDIT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gemm.h"
#include "cuda/model_gpu.h"

/* cuda/model_gpu.cu owns the gpu_model (its parameters, contexts, attention choice, readiness callback) and hands
   the family's calls here when the host model's family is hunyuanvideo15; everything below is only for it.
   The semantics are model_gpu.h's (gpu_model_forward_backward, gpu_model_forward_loss, gpu_model_grads_ready_all,
   gpu_model_params' parameter source and its call order) with mmdit.h's CPU model as the oracle:
   - the parameter source: the embeddings' and head's bf16 weights whole, a block's through block_weights and its
     gradients through block_grads, the embeddings' gradients through embedding_grads; time_weights gives the fp32
     values of [layout.gpu_time_first, blocks_offset): time_embed's two Linears and cond_type_embed, read in fp32.
     head_modulation, block_modulation and block_norm3 are not read (the family's per-block fp32 reads are none:
     its modulations are Linears of the block's own bf16 weights, run in fp32 on the B rows).
   - layout: every sample's video rows and its joint text rows [image; ByT5; Qwen] in two packed buffers (one per
     stream: the per-stream GEMMs, LN-modulate and RMSNorm run over each buffer whole); the joint attention reads
     q, k, v gathered into a third layout, each sample's [video; text] rows contiguous, samples on our own kernel
     packed first, samples on cuDNN (mmdit_gpu_env.use_cudnn, joint length >= cudnn_min_tokens) after them, each
     from a multiple of ATTENTION_CUDNN_TILE rows and run over whole tiles with zero rows past it (the gather writes
     the zeros), so that cuDNN builds one plan per tile count rather than one per (video, caption) length.
   - the batch: model.h's, with text_2 / image (NULL or lengths 0: none); the input's channels past out_dim are
     zero (text-to-video), as the CPU model's loss.
   - sequence parallelism (Ulysses; batch->sp_size = k > 1 with env->group, every member calling with the whole
     batch): of the micro-batch's Tv packed video rows and Tt packed joint text rows, member p holds video rows
     [p Tv/k, (p+1) Tv/k) and text rows [p Tt/k, (p+1) Tt/k) (integer division, uneven slices, no padding) and runs
     everything per row on them (LN-modulate, projections, q/k RMSNorm, RoPE at each video row's position in its whole
     sample, MLPs, gates, head, loss). The joint attention: q, k, v of both streams go all-to-all over heads
     (seqpar_gpu_alltoall_bf16 on the group's stream, one exchange for both streams, rows in member order), member p
     attends for heads [p H/k, (p+1) H/k) over every sample's whole [video; text] in the joint layout above (its own
     kernel and cuDNN as alone), and the output comes back; the backward mirrors it, block recomputation re-runs it.
     Every member runs the whole micro-batch's time embedding, token refiner, pooled conditioning, modulation vectors
     and caption sources, keeps its own text rows, and back-propagates only its rows' gradients through them: its
     loss, per-sample losses and gradients are PARTS that sum over the group to k = 1's (to bf16 rounding). The
     capacity's tokens bound the member's video rows, its text rows the WHOLE joint text. The group buffers (the
     joint layout at H/k heads per block kept, their gradients, the exchange's rows, the whole samples' latents and
     noise, the joint map) are a device allocation of their own, within layout_gpu_split_bytes at the micro-batch's
     joint length Tv + Tt (checked), grown (cudaMalloc) on the first micro-batch that needs more. */
typedef struct mmdit_gpu mmdit_gpu;

/* What the owning gpu_model lends each call. */
typedef struct {
    gemm_context *gemm;
    struct attention_cudnn *cudnn;   /* NULL without cuDNN */
    int use_cudnn;
    int64_t cudnn_min_tokens;
    const gpu_model_params *params;
    gpu_grads_ready_fn grads_ready;  /* NULL: off */
    void *grads_ready_context;
    const seqpar_gpu_group *group;   /* the micro-batch's sequence-parallel group (model_gpu.cu checks it); NULL: alone */
} mmdit_gpu_env;

#ifdef __cplusplus
extern "C" {
#endif

/* The family's model for this capacity (tokens, samples, joint text rows: max_text 0 means max_samples *
   text_len) and recomputation mode, nothing allocated on the device yet; fatal (exit 2) naming an unsupported
   setting. *arena_bytes: the device workspace it will allocate, exactly model_layout_memory's GPU formula at this
   capacity (model/layout.h). */
mmdit_gpu *mmdit_gpu_describe(const model *host_model, int64_t max_tokens, int max_samples, int64_t max_text,
                              gpu_recompute recompute, int64_t device_scratch_bytes, size_t *arena_bytes);
/* Allocate the workspace and the pinned staging (on the current GPU). */
void mmdit_gpu_allocate(mmdit_gpu *mm);
/* Free everything (a described-only model too). NULL is a no-op. */
void mmdit_gpu_free(mmdit_gpu *mm);

double mmdit_gpu_forward_backward(mmdit_gpu *mm, const mmdit_gpu_env *env, const model_batch *batch,
                                  float grad_scale, double *sample_loss, cudaStream_t stream);
double mmdit_gpu_forward_loss(mmdit_gpu *mm, const mmdit_gpu_env *env, const model_batch *batch,
                              double *sample_loss, cudaStream_t stream);
/* The parameter source's calls and the readiness reports of one forward_backward, computing nothing. */
void mmdit_gpu_grads_ready_all(const mmdit_gpu *mm, const mmdit_gpu_env *env, cudaStream_t stream);
/* Host seconds the last forward_backward spent queuing its work. */
double mmdit_gpu_enqueue_seconds(const mmdit_gpu *mm);

#ifdef __cplusplus
}
#endif

#endif
