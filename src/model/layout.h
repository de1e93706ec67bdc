/* layout.h — the one description of each model family's memory (Wan 2.1's DiT, HunyuanVideo-1.5's MMDiT): its parameter tensors (names, shapes, offsets in the one flat fp32 allocation, the per-block stride) and the exact bytes of a micro-batch's activations on each backend. */
#ifndef ALDIT_LAYOUT_H
#define ALDIT_LAYOUT_H

#include <stdint.h>
#include <stdio.h>

#include "deck/deck.h"

/* patch_embedding.weight is the one 5-D parameter: [dim, in_dim, patch_t, patch_h, patch_w]. */
#define LAYOUT_MAX_NDIM 5
/* Distinct tensors a family's table describes (Wan: 11 embedding tensors, at most 29 of one block, 3 of the head;
   HunyuanVideo-1.5: 69, 32 and 4). */
#define LAYOUT_MAX_TENSORS 112
/* HunyuanVideo-1.5's constants that its diffusers class fixes: refiner blocks, the ByT5 projection's hidden width,
   the refiner's MLP ratio, the type embeddings (Qwen, ByT5, image), RoPE theta, LayerNorm eps of the embedders. */
#define LAYOUT_MMDIT_REFINER_LAYERS 2
#define LAYOUT_MMDIT_BYT5_HIDDEN 2048
#define LAYOUT_MMDIT_REFINER_MLP_RATIO 4
#define LAYOUT_MMDIT_TYPES 3
#define LAYOUT_MMDIT_ROPE_THETA 256.0
#define LAYOUT_MMDIT_EMBEDDER_EPS 1e-5
/* Rows the GPU model's self-attention tensors have past the micro-batch's tokens: cuDNN runs the last
   sample over whole tiles (model_gpu.cu checks that this covers ATTENTION_CUDNN_TILE - 1). */
#define LAYOUT_GPU_TILE_SLACK_ROWS 128
/* The GPU model carves its workspace in pieces aligned to this many bytes; the CPU model in 64. */
#define LAYOUT_GPU_ALIGN 256
#define LAYOUT_CPU_ALIGN 64

/* The dims the layout depends on (a deck's [model] section). */
typedef struct {
    int64_t dim, ffn_dim, num_heads, num_layers, in_dim, out_dim, patch_t, patch_h, patch_w, text_dim, freq_dim;
    int qk_norm, cross_attn_norm;
    deck_family family;
    int64_t text_2_dim, image_dim;    /* hunyuanvideo15 only */
} layout_dims;

/* How a tensor starts (model_init_random says what each means). */
typedef enum { LAYOUT_INIT_XAVIER, LAYOUT_INIT_NORMAL_STD, LAYOUT_INIT_MODULATION, LAYOUT_INIT_ZERO, LAYOUT_INIT_ONE } layout_init;
/* For a Linear's weight: the rows it multiplies in the forward (its FLOPs are 2 * elements per row). */
typedef enum { LAYOUT_ROWS_NONE, LAYOUT_ROWS_TOKENS, LAYOUT_ROWS_TEXT, LAYOUT_ROWS_SAMPLES } layout_rows;

typedef struct { int64_t weight, bias; } layout_linear;   /* offsets into the flat buffers */
typedef struct { int64_t offset, count; } layout_range;     /* count values from offset */

/* Offsets of one block's tensors; -1 = absent (no qk_norm, no cross_attn_norm). */
typedef struct {
    int64_t modulation;
    layout_linear self_q, self_k, self_v, self_o;
    int64_t self_norm_q, self_norm_k, norm3_weight, norm3_bias;
    layout_linear cross_q, cross_k, cross_v, cross_o;
    int64_t cross_norm_q, cross_norm_k;
    layout_linear ffn_in, ffn_out;
} layout_block;

/* HunyuanVideo-1.5 (diffusers' HunyuanVideo15Transformer3DModel): a refiner block's offsets, the embeddings' and
   head's, one dual-stream block's (from the block's start). */
typedef struct {
    int64_t norm1_weight, norm1_bias, norm2_weight, norm2_bias;
    layout_linear q, k, v, o, ff_in, ff_out, ada;
} layout_refiner_block;

typedef struct {
    layout_linear patch;
    int64_t image_norm_in_weight, image_norm_in_bias, image_norm_out_weight, image_norm_out_bias;
    layout_linear image_1, image_2;
    layout_linear refiner_time_1, refiner_time_2, refiner_text_1, refiner_text_2, refiner_proj_in;
    layout_refiner_block refiner[LAYOUT_MMDIT_REFINER_LAYERS];
    int64_t byt5_norm_weight, byt5_norm_bias;
    layout_linear byt5_1, byt5_2, byt5_3, time_1, time_2;
    int64_t cond_type;
    layout_linear norm_out, proj_out;
} layout_mmdit;

typedef struct {
    layout_linear norm1, norm1_context;
    int64_t norm_q, norm_k;
    layout_linear to_q, to_k, to_v, add_k, add_v, add_q, to_out, to_add_out;
    int64_t norm_added_q, norm_added_k;
    layout_linear ff_in, ff_out, ff_context_in, ff_context_out;
} layout_mmdit_block;

typedef struct {
    const char *name;                 /* the family's state_dict name; a block's without its "blocks.<l>." */
    int ndim;
    int64_t shape[LAYOUT_MAX_NDIM];   /* PyTorch shape; entries past ndim are 0 */
    int64_t n_elements;
    int64_t offset;                   /* embeddings and head: in the flat buffer; a block's: from the block's start */
    layout_init init;
    layout_rows rows;
} layout_tensor;

/* The table: tensors in the family's state_dict order, the embeddings' (tensors [0, n_embedding)), one block's
   ([n_embedding, n_embedding + n_block), repeated num_layers times), the head's (the rest). */
typedef struct {
    layout_dims dims;
    const char *block_prefix;         /* a block tensor's state_dict name is block_prefix + "<l>." + its name */
    int n_tensors, n_embedding, n_block;
    layout_tensor tensors[LAYOUT_MAX_TENSORS];
    int n_params;                     /* state_dict entries: n_tensors - n_block + num_layers * n_block */
    int64_t n_weights;                /* values in the flat buffer */
    int64_t blocks_offset;            /* block l's tensors start at blocks_offset + l * block_stride */
    int64_t block_stride;
    layout_linear patch, text_in, text_out, time_in, time_out, time_projection, head;
    int64_t head_modulation;
    layout_block block;               /* offsets from a block's start */
    layout_mmdit mmdit;               /* hunyuanvideo15: the embeddings' and head's offsets */
    layout_mmdit_block mmdit_block;   /* hunyuanvideo15: offsets from a block's start */
    /* What the GPU model reads in fp32 (gpu_model_params; a sharded state keeps these values whole): the time path
       [gpu_time_first, blocks_offset) (Wan: time_embedding.0 to time_projection; hunyuanvideo15: time_embed's two
       Linears and cond_type_embed), the head's range (Wan: head.modulation; hunyuanvideo15: none, count 0) and
       two ranges of every block, offsets from its start (Wan: modulation, norm3 weight and bias; hunyuanvideo15:
       none). */
    int64_t gpu_time_first;
    layout_range gpu_head_fp32, gpu_block_fp32[2];
} model_layout;

/* 1 when the family has a GPU model (wan: cuda/model_gpu.cu; hunyuanvideo15: cuda/mmdit_gpu.cu), 0 when it
   runs on the CPU only ([run] device = auto then means cpu). */
int layout_family_on_gpu(deck_family family);
/* 1 when the family's models run a micro-batch on a sequence-parallel group (wan, hunyuanvideo15), 0 when not yet:
   training then plans no groups ([balance] sp runs as off), while aldit-sim still plans them. */
int layout_family_sequence_parallel(deck_family family);
/* How a family's attention sees the text, for the balancer's cost by length (docs/balancer.md): joint_text 1 where the
   text rows join each block's self-attention (MMDiT: one attention over the sample's [video; text], so that the
   length a sample's attention and GEMMs see is N = S + L), 0 where the video attends to them by cross-attention
   (Wan); text_attention_layers: the text's own self-attention layers outside the blocks, over its L rows
   (HunyuanVideo-1.5's token refiner: LAYOUT_MMDIT_REFINER_LAYERS; Wan: 0). */
typedef struct { int joint_text; int text_attention_layers; } layout_attention;
layout_attention layout_family_attention(deck_family family);
/* The deck's [model] dims. */
layout_dims layout_dims_of(const deck *config);
/* Build the table for these dims (no allocation). */
void model_layout_init(model_layout *layout, const layout_dims *dims);
/* Block `layer`'s tensors' offsets in the flat buffer (Wan; hunyuanvideo15). Fields of the other family are
   meaningless. */
layout_block model_layout_block(const model_layout *layout, int layer);
layout_mmdit_block model_layout_mmdit_block(const model_layout *layout, int layer);
/* State_dict entry `index` (0 <= index < n_params): its tensor, and *layer (-1 outside the blocks) and
   *offset (in the flat buffer). */
const layout_tensor *model_layout_param(const model_layout *layout, int index, int *layer, int64_t *offset);

/* Forward FLOPs of one sample that the table's Linear layers do (2 per weight value and row), split by
   the rows they multiply: all blocks' per token and per text row, the embeddings' and head's per token,
   per text row and per sample. */
typedef struct {
    double block_per_token, block_per_text, outside_per_token, outside_per_text, outside_per_sample;
} layout_gemm_flops;
layout_gemm_flops model_layout_gemm_flops(const model_layout *layout);

/* ---- memory --------------------------------------------------------------------------------------
   The workspace of a micro-batch of N tokens, B samples and L text rows in all is, in bytes, exactly
       fixed + per_token * N + per_sample * B + per_text * L
   on either backend:
   LAYOUT_BACKEND_CPU: the fp32 CPU model (model.c), which keeps every activation of every block (it has
     no recomputation): its arena, RoPE positions and per-sample row tables. The CPU model's own count
     of what it carves for a micro-batch (model_workspace_bytes) is at most this, and short of it only by
     the alignment padding `fixed` allows for (LAYOUT_CPU_ALIGN - 4 bytes per piece).
   LAYOUT_BACKEND_GPU: the GPU model's arena (model_gpu.cu), sized with this very formula for its
     capacity (N, B, L): bf16 activations and fp32 statistics as gpu_recompute keeps them, the batch as
     copied over, the per-micro-batch tables and the backward scratch. The scratch depends on the GPU (its
     SM count) through a constant, device_scratch_bytes (gpu_model_device_scratch_bytes; 0 where no GPU
     is known: then `fixed` is short of the device's by that, the coefficients are the same).
   hunyuanvideo15 (text rows L are its joint text: image, ByT5 and Qwen tokens): the CPU count is an upper bound
   (the costliest source's values per text row); the GPU arena (cuda/mmdit_gpu.cu, carve) sizes every source's
   rows by L and the joint attention's by layout_mmdit_joint_rows, exactly this formula.
   The coefficients are what the balancer plans with (cost_model_mem: per_sample + per_token S +
   per_text L a sample); `fixed` is counted once per rank, in the plan of the GPU. */
typedef enum { LAYOUT_BACKEND_CPU, LAYOUT_BACKEND_GPU } layout_backend;
typedef struct { int64_t fixed, per_token, per_sample, per_text; } layout_memory;

/* recompute: RECOMPUTE_BLOCK keeps a block's input, first LayerNorm statistics and modulation vectors
   per block and one set of the rest (GPU only: the CPU model ignores it and keeps everything). */
layout_memory model_layout_memory(const model_layout *layout, layout_backend backend, deck_recompute recompute,
                                  int64_t device_scratch_bytes);
int64_t layout_memory_bytes(const layout_memory *memory, int64_t tokens, int64_t samples, int64_t text);
/* The GPU model's backward scratch for a capacity of N tokens and B samples (part of the GPU memory above):
   device_scratch_bytes + 4 num_heads N (attention) + 12 dim B (the LayerNorm backward's per-sample sums). */
int64_t layout_gpu_scratch_bytes(const model_layout *layout, int64_t device_scratch_bytes, int64_t tokens,
                                 int64_t samples);
/* hunyuanvideo15's GPU joint attention layout: rows for N video tokens, L text rows and B samples, each sample on
   cuDNN from a whole tile with its last tile whole (cuda/mmdit_gpu.h): N + L + 128 (B + 1). Its backward scratch
   is layout_gpu_scratch_bytes at these rows in place of N. */
int64_t layout_mmdit_joint_rows(int64_t tokens, int64_t samples, int64_t text);

/* The GPU model's buffers for a micro-batch of N tokens in B whole samples run by a sequence-parallel group of k
   ranks (k > 1), on each member, apart from its workspace (model_gpu.cu's head layout, grown to the largest such
   micro-batch), in bytes: per block (one set under RECOMPUTE_BLOCK) q, k, v and the attention output over all N rows
   (+ the tile slack) for H/k heads, bf16, and their log-sum-exp, fp32; their four gradients once; the exchange's
   staging of 3 x dim values for the member's rows (at most ceil(N / k)); the whole samples' latents and noise
   (fp32); the row tables (3B + 2 int64); each piece aligned; plus cuDNN's attention buffer for the head layout
   (4 (H/k) rows (head_dim + 1) bytes over the N rows and slack: an upper bound of what it grows to).
   hunyuanvideo15 (cuda/mmdit_gpu.cu's group buffers): `tokens` is the micro-batch's joint length S + L (video tokens
   and joint text rows together), the same pieces over its joint attention layout (layout_mmdit_joint_rows) at D/k
   columns, the exchange's buffers of both streams and the joint map. */
int64_t layout_gpu_split_bytes(const model_layout *layout, deck_recompute recompute, int64_t tokens, int64_t samples,
                               int k);

/* ---- the training state ------------------------------------------------------------------------------
   Bytes of the training state on one rank, by what it holds, for [train] shard = `mode` (resolved: not auto) over
   n_ranks ranks, with the weights' EMA when `ema` is 1 ([train] ema_decay > 0): the one formula both backends allocate by and plan with (aldit --check, aldit-sim, the balancer's
   budget). n = n_weights, L = num_layers, b = block_stride, e = n - L b (embeddings and head), s = the values a rank
   holds of a sharded array, as backend/shard.h cuts it: CPU: ceil(n / R) (one unit); GPU: the sum over the units
   (embeddings, each block, head) of ceil(unit / R) (pieces padded to equal size).
   CPU (its fp32 weights are the master): none: weights 4n, gradients 4n, moments 8n; optimizer: moments 8s;
     gradients and full: also gradients 4n + 4s (the step's, and this rank's slice of their sum; full gathers the
     whole model for a step on the host).
   GPU: none: weights 2n (bf16), gradients 4n (fp32), master 4n, moments 8n; optimizer: master 4s + 4f, moments 8s;
     gradients: also gradients 4 (h + 2 max(b, m)) + 4 s (the head's whole, two staging slots that take a block's
     or the embeddings', this rank's slice of the sum); full: also weights 2 e (only the embeddings' and head's bf16
     stay whole) and gathered 2 * 2 b (two bf16 slots of one block's weights). In the sharded GPU modes n, e, b and
     the embeddings m and head h (e = m + h) count each unit padded to R equal pieces (R ceil(unit / R): what one
     in-place all-gather or reduce-scatter of it takes; the same at R = 1; b = 0 without blocks), and
     f = layout_gpu_fp32_read_values, the fp32 weights the GPU model reads in fp32 kept whole (in full without the
     time path, which is all-gathered into a staging slot when the model needs it).
   Either backend, with the EMA: ema 4 s (fp32, held as the master is; 4 n in mode none). */
typedef struct {
    double weights;    /* the weights the model computes with (CPU: fp32; GPU: bf16), whole or gathered */
    double gathered;   /* GPU, full: the bf16 weights of the blocks gathered at once (0 elsewhere) */
    double gradients;  /* the step's gradients (and, sharded, this rank's slice of their sum) */
    double master;     /* fp32 master weights apart from `weights` (0 where they are the same array) */
    double moments;    /* AdamW m and v, fp32 */
    double ema;        /* the weights' exponential moving average, fp32 (0 without [train] ema_decay) */
} layout_state_bytes;

layout_state_bytes model_layout_state_bytes(const model_layout *layout, layout_backend backend, deck_shard mode,
                                            int n_ranks, int ema);
double layout_state_total(const layout_state_bytes *bytes);
/* f above: the values the GPU model reads in fp32 (gpu_model_params) kept whole under `mode` (sharded): the
   layout's gpu_head_fp32 and every block's gpu_block_fp32 (Wan: head.modulation, 2 dim, and each block's modulation
   and norm3, 8 dim; hunyuanvideo15: none) and, but in full, the time path [gpu_time_first, blocks_offset). */
int64_t layout_gpu_fp32_read_values(const model_layout *layout, deck_shard mode);
/* s above: the values of one sharded array a rank holds (the largest over ranks), as shard.h cuts it. */
int64_t layout_shard_values(const model_layout *layout, layout_backend backend, int n_ranks);

#endif
