// model_gpu.cu — the Wan 2.1 DiT on one GPU: parameters in three flat buffers, a workspace for one micro-batch, forward/backward of the rectified-flow loss.
//
// The order of operations follows src/model.c (the oracle). What differs is how the residual stream is
// cut: every residual add is fused with the LayerNorm that reads its result (lnmod_residual_fwd), so
// the ops form one chain across blocks:
//   block l:  [x_in_l, h1]  = x2_{l-1} + y_ffn_{l-1} * e5_{l-1},  LN-modulate(e0_l, e1_l)   (l = 0: LN only)
//             [x1, n3]      = x_in + y_attn * e2,                  affine LN (norm3) as LN-modulate
//             [x2, h2]      = x1 + y_cross * 1,                    LN-modulate(e3, e4)
//   head:     [x_final, hh] = x2_last + y_ffn_last * e5_last,      LN-modulate(head shift, scale)
// The backward walks the same chain in reverse; lnmod_residual_bwd hands the gradient of each gated
// branch (dy_prev) and its gate's gradient back, so a block's e5 gradient arrives while the next block
// (or the head) is undone. Per-sample modulation gradients are kept per layer and reduced into the
// modulation parameters and d(e0) once the blocks are done.
//
// With block recomputation (GPU_RECOMPUTE_BLOCK) every block keeps only what block_saved marks as kept
// (its input x_in, its first LayerNorm's statistics, its modulation vectors) and the other activations of
// all blocks share one set of buffers. Walking back, the backward of block l ends at the LayerNorm that
// opened it, whose residual backward needs block l - 1's FFN output: so block l - 1's forward is re-run
// from its kept x_in right there (block_forward, recomputing), and its own backward follows. A re-run
// opens with lnmod_fwd on the kept x_in where the forward ran lnmod_residual_fwd: the same LayerNorm of
// the same stored bf16 rows (lnmod.h), so every activation, the loss and the gradients are those of
// GPU_RECOMPUTE_NONE, bit for bit.
#include "cuda/carver.cuh"
#include "cuda/model_gpu.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/attention.h"
#ifdef HAVE_CUDNN
#include "cuda/attention_cudnn.h"
#include "cuda/attention_fp8.h"
#endif
#include "cuda/fused.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/kernels_misc.h"
#include "cuda/lnmod.h"
#include "cuda/mmdit_gpu.h"
#include "cuda/seqpar_gpu.h"

extern "C" {
#include "model/ops_cpu.h"
}

namespace {

// Rows the self-attention's tensors have past the capacity: cuDNN runs the last sample over whole tiles
// (attention_dispatch_fwd). The layout's memory formula counts them (model/layout.h).
constexpr int64_t kTileSlack = LAYOUT_GPU_TILE_SLACK_ROWS;
#ifdef HAVE_CUDNN
static_assert(kTileSlack >= ATTENTION_CUDNN_TILE - 1, "room for the last sample's partial tile");
#endif

// Parameter offsets come from the host model's layout table (model_layout): the same table its param_info
// entries are computed from.
using linear_offsets = layout_linear;

struct block_offsets : layout_block {  // the tensors' offsets from the block's first value
    int64_t first, end; // the block's parameters are values [first, end) of the flat buffers
};

// What one block keeps from its forward for its backward (bf16 rows unless noted). With block
// recomputation only the fields marked "kept" are the block's own; the others point into buffers that
// all blocks share (layout_arena).
struct block_saved {
    gpu_bf16 *x_in;                            // [N, D] kept: block input (after the previous block's FFN residual)
    gpu_bf16 *h1;                              // [N, D] x_in LN-modulated
    gpu_bf16 *q_pre, *k_pre, *q, *k, *v;       // [N, D] projections; q, k after RMSNorm + RoPE
    gpu_bf16 *attn, *y_attn;                   // [N, D] attention output, o projection
    gpu_bf16 *x1, *n3;                         // [N, D] after the gated residual; norm3(x1)
    gpu_bf16 *cq_pre, *cq;                     // [N, D] cross-attention queries
    gpu_bf16 *ck_pre, *ck, *cv;                // [L, D] keys and values from the text
    gpu_bf16 *cattn, *y_cross;                 // [N, D]
    gpu_bf16 *x2, *h2;                         // [N, D] after the cross-attention residual; LN-modulated
    gpu_bf16 *ffn_pre, *ffn_act, *y_ffn;       // [N, F] before / after GELU; [N, D]
    float *modulation;                         // [6][B][D] kept: e = blocks.l.modulation + e0, chunk-major
    float *n3_shift, *n3_scale;                // [B, D] kept: norm3's bias and weight - 1 per sample
    float *d_modulation;                       // [6][B][D] kept: gradient of `modulation`
    float *ln1_mean, *ln1_rstd;                                             // [N] kept
    float *n3_mean, *n3_rstd, *ln2_mean, *ln2_rstd;                         // [N]
    float *q_rstd, *k_rstd, *cq_rstd, *ck_rstd;                             // [N] ([L] for ck)
    float *attn_lse, *cattn_lse;                                            // [N, H]
};

// Per-micro-batch tables computed on the host; the same byte layout in pinned host memory and on the device.
struct batch_tables {
    int64_t *token_start, *text_start, *latent_start, *pred_start;   // [B + 1]
    int32_t *latent_shape;                                           // [B, 3] frames, height, width (latent units)
    int32_t *positions;                                              // [N, 3] RoPE grid indices
    float *sigma, *sinusoid;                                         // [B], [B, freq_dim]
};

struct batch_dims {
    int64_t n_tokens, n_text, n_latent_values;
    int n_samples;
};

// One block's self-attention tensors in a sequence-parallel group's head layout: every row of the micro-batch, this
// member's heads (plus kTileSlack rows for cuDNN's whole tiles, as the row layout's).
struct sp_heads {
    gpu_bf16 *q, *k, *v, *attn;   // [T + kTileSlack, D / k]
    float *lse;                   // [T + kTileSlack, H / k]
};

// Sequence parallelism (Ulysses) of the current micro-batch (model.h's model_batch.sp_size > 1): this member's slice
// of the packed rows, the exchange's counts, and the head layout's buffers in a device allocation of their own,
// grown to the largest group micro-batch seen (the workspace's formula counts the member's rows only).
struct sp_state {
    const seqpar_gpu *groups;              // gpu_model_set_seqpar
    const seqpar_gpu_group *group;         // the current micro-batch's group; NULL: this rank alone
    int size, rank, capacity;              // k, this member, the host arrays' k
    int64_t n_total, row_lo;               // rows of the micro-batch; this member's first
    int64_t *slice_start, *counts;         // host [k + 1] each member's first row; [4k] an exchange's counts
    int64_t *sample_start;                 // host [B + 1] the samples' rows in the whole micro-batch
    int32_t *positions;                    // host [T, 3] RoPE grid indices of every row
    int64_t positions_capacity;
    int64_t *tables_pinned;                // host: sample_start [B + 1], token_first [B], whole_pred [B + 1]
    // device
    char *arena;
    size_t arena_bytes;
    sp_heads *heads;                       // [num_layers]; one shared set under block recomputation
    gpu_bf16 *d_attn, *d_q, *d_k, *d_v;    // [T + kTileSlack, D / k] the backward's
    gpu_bf16 *xchg;                        // [3][N][D] the exchange's packed rows
    float *latents, *noise;                // the micro-batch's samples whole
    int64_t *tables;                       // device copy of tables_pinned
};

// FP8 of the Wan block's large linears (gpu_model_set_precision): per block kFp8Linears linears of three scaled
// tensors each (input E4M3, weight E4M3, output gradient E5M2), and one GEMM's FP8 operands at a time.
enum Fp8Linear { kSelfQ, kSelfK, kSelfV, kSelfO, kCrossQ, kCrossO, kFfnIn, kFfnOut, kFp8Linears };
enum Fp8Role { kFp8Input, kFp8Weight, kFp8Grad, kFp8Roles };
// [train] fp8_attention: the scaled tensors of a block's FP8 self-attention, after every linear's: its inputs q, k, v
// and output o, the probabilities s (E4M3), the output gradient do, the scores' gradient dp and dq, dk, dv (E5M2).
enum Fp8AttnRole { kAttnQ, kAttnK, kAttnV, kAttnO, kAttnS, kAttnDO, kAttnDP, kAttnDQ, kAttnDK, kAttnDV, kFp8AttnRoles };
struct fp8_linears {
    fp8_scaling *scaling;  // tensor (layer * kFp8Linears + linear) * kFp8Roles + role
    uint8_t *x8, *xt8;     // the input [rows, in] and its transpose [in, padded rows]
    uint8_t *g8, *gt8;     // the output gradient [rows, out] and its transpose [out, padded rows]
    uint8_t *w8, *wt8;     // the weight [out, in] and its transpose [in, out]
    float *amax_d;         // the FFN's first GEMM's AMAX_D (device, one float)
    float *partials;       // the bias gradients' per-tile column sums (fp8_quantize_dbias)
    bool act_ready;        // g8 holds the FFN's GELU output in E4M3, which its first GEMM emitted (the forward)
    const gpu_bf16 *dgelu_pre;  // the backward: the FFN's second linear left its dx as the GELU output's gradient;
                                // the first one's cast of dy applies the GELU's derivative at this input
    // [train] fp8_attention: cuDNN's FP8 self-attention (NULL: off), one sample's operands at a time
    attention_fp8 *attention;
    bool attention_backward;    // the backward too (fp8_attention = on), else only the forward
    uint8_t *q8, *k8, *v8, *o8, *do8, *dq8, *dk8, *dv8;
    float *probe_stats;         // the first step's probe forward writes its stats here, not into the saved ones
    float *attn_scales;         // a call's scales array (attention_fp8.h), ATTENTION_FP8_SCALE_FLOATS
    int64_t attention_refused;  // calls cuDNN refused (run in bf16 instead)
    size_t bytes;
};

} // namespace


struct gpu_model {
    // dims, copied from the host model
    int dim, ffn_dim, num_heads, head_dim, num_layers;
    int in_dim, patch_t, patch_h, patch_w, patch_in, patch_out;
    int text_len, text_dim, freq_dim;
    float eps;
    int64_t n_weights;
    // capacity
    int64_t max_tokens, max_text;
    int max_samples;
    gpu_recompute recompute;
    model_layout layout;   // the host model's table (layout_gpu_split_bytes checks the head layout's arena by it)
    // parameters: the model's own flat buffers, the host table's offsets (NULL when created without them)
    float *master, *grads;
    gpu_bf16 *working;
    // where the forward/backward reads and writes them (gpu_model_set_params; by default the own buffers)
    gpu_model_params params;
    const float **own_modulation, **own_norm3;         // [num_layers]: the default params' fp32 pointers
    // offsets: the embeddings' and the time path's in the flat buffer; the head's from head_first; a block's
    // (blocks[l], the same for every l) from the block's first value
    linear_offsets patch, text_in, text_out, time_in, time_out, time_projection, head;
    int64_t head_modulation;
    int64_t time_first, head_first;                    // the time path [time_first, blocks_offset); the head from head_first
    block_offsets *blocks;
    // activations and scratch, carved from one allocation
    char *arena;
    size_t arena_bytes;
    block_saved *saved;
    float *latents, *noise, *text_f32;                 // the batch as copied over
    gpu_bf16 *text;                                    // [L, text_dim]
    gpu_bf16 *tokens_in;                               // [N, patch_in] x_t, patchified
    float *x0_tokens, *noise_tokens;                   // [N, patch_out] in the head's output order
    gpu_bf16 *text_pre, *text_act, *context;           // [L, D]
    float *time_pre, *time_act, *time_emb, *time_silu; // [B, D]
    float *e0;                                         // [B, 6D]
    float *head_shift, *head_scale, *head_mean, *head_rstd;
    float *ones;                                       // [B, D] the ungated residual's gate
    gpu_bf16 *x_final, *head_h;                        // [N, D]
    gpu_bf16 *pred, *d_pred;                           // [N, patch_out]
    float *sample_loss;                                // [B]
    gpu_bf16 *d_x, *d_h, *d_y, *d_t, *d_q, *d_k, *d_v; // [N, D]
    gpu_bf16 *d_ffn;                                   // [N, F]
    gpu_bf16 *d_ck, *d_cv, *d_ctx_part, *d_context_bf16, *d_text_pre;   // [L, D]
    float *d_context;                                  // [L, D] fp32 sum over the layers
    float *d_n3_shift, *d_n3_scale, *d_unused_gate, *d_head_shift, *d_head_scale, *d_time_emb, *d_time_b;  // [B, D]
    float *d_e0;                                       // [B, 6D]
    void *scratch;                                     // backward workspaces of the fused ops (one at a time)
    size_t scratch_bytes;
    batch_tables tables_device;
    // host staging (pinned)
    char *tables_pinned;
    size_t tables_bytes;
    batch_tables tables_host;
    float *latents_pinned, *noise_pinned, *text_pinned, *loss_pinned;
    int32_t *grid_frames, *grid_height, *grid_width;   // [B] tokens per axis (host)
    float *timesteps_host;                             // [B]
    // self-attention of samples of at least cudnn_min_tokens tokens goes to cuDNN (gpu_model_set_attention), the
    // last sample of a micro-batch over whole tiles
    int use_cudnn;
    int64_t cudnn_min_tokens;
    // the model's GEMM and cuDNN contexts: handles, plan caches, autotuning (gpu_model_set_autotune)
    gemm_context *gemm;
    struct attention_cudnn *cudnn;  // NULL without cuDNN
    // host seconds the last forward_backward call took to queue its work (gpu_model_enqueue_seconds)
    double enqueue_seconds;
    // told as each range of the gradients is final in a forward_backward call (gpu_model_set_grads_ready)
    gpu_grads_ready_fn grads_ready;
    void *grads_ready_context;
    // sequence parallelism (gpu_model_set_seqpar; sp.group NULL for a micro-batch of this rank alone)
    sp_state sp;
    // [train] precision = fp8: the block's large linears in FP8 (gpu_model_set_precision); NULL in bf16
    fp8_linears *fp8;
    // the family's block code when it is not Wan's (cuda/mmdit_gpu.h: hunyuanvideo15); NULL: the code below
    mmdit_gpu *family;
};

namespace {

// Every setting the kernels below cannot run, as one clear error.
void check_supported(const model *m)
{
    if (!m->qk_norm || !m->cross_attn_norm)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE,
                         "gpu model: qk_norm = %d, cross_attn_norm = %d: the CUDA backend needs both on (Wan 2.1); "
                         "use the cpu device for other settings",
                         m->qk_norm, m->cross_attn_norm);
    if (m->in_dim != m->out_dim)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: the flow-matching loss needs in_dim (%d) == out_dim (%d)",
                         m->in_dim, m->out_dim);
    if (m->dim % 8 || m->dim > LNMOD_MAX_DIM || m->dim > FUSED_QK_MAX_DIM)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: dim %d must be a multiple of 8 up to %d", m->dim,
                         LNMOD_MAX_DIM < FUSED_QK_MAX_DIM ? LNMOD_MAX_DIM : FUSED_QK_MAX_DIM);
    if (!attention_head_dim_supported(m->head_dim))
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: head dim %d (dim / num_heads) is not supported by the attention "
                         "kernels (a multiple of 16 up to %d)", m->head_dim, ATTENTION_MAX_HEAD_DIM);
    const int linears[][2] = {{m->patch_in, m->dim}, {m->text_dim, m->dim}, {m->dim, m->dim},
                              {m->dim, m->ffn_dim}, {m->ffn_dim, m->dim}, {m->dim, m->patch_out}};
    for (size_t i = 0; i < sizeof linears / sizeof linears[0]; ++i)
        if (!gemm_linear_supported(linears[i][0], linears[i][1]))
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: a %d -> %d linear layer is not supported by the GEMMs "
                             "(dims must be multiples of 8: check ffn_dim, text_dim and the patch)",
                             linears[i][0], linears[i][1]);
    // The GEMMs read weights straight out of the flat bf16 buffer: every tensor must start 16-byte aligned.
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].offset % 8)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: parameter %s starts at value %lld, not a multiple of 8 "
                             "(all sizes must be multiples of 8)", m->params[i].name, (long long)m->params[i].offset);
}

void layout_tables(carver &c, batch_tables &t, int64_t max_tokens, int max_samples, int freq_dim)
{
    t.token_start = c.take<int64_t>(max_samples + 1);
    t.text_start = c.take<int64_t>(max_samples + 1);
    t.latent_start = c.take<int64_t>(max_samples + 1);
    t.pred_start = c.take<int64_t>(max_samples + 1);
    t.latent_shape = c.take<int32_t>(3 * (int64_t)max_samples);
    t.positions = c.take<int32_t>(3 * max_tokens);
    t.sigma = c.take<float>(max_samples);
    t.sinusoid = c.take<float>((int64_t)max_samples * freq_dim);
}

// The part of a block's activations that block recomputation keeps (block_saved: "kept").
void layout_kept(carver &c, block_saved &s, int64_t N, int64_t B, int64_t D)
{
    s.x_in = c.take<gpu_bf16>(N * D);
    s.modulation = c.take<float>(6 * B * D);
    s.d_modulation = c.take<float>(6 * B * D);
    s.n3_shift = c.take<float>(B * D);
    s.n3_scale = c.take<float>(B * D);
    s.ln1_mean = c.take<float>(N);
    s.ln1_rstd = c.take<float>(N);
}

// The rest: what block recomputation rebuilds.
// The self-attention's q, k, v, attn and attn_lse have kTileSlack rows more (attention_dispatch_fwd).
void layout_recomputed(carver &c, block_saved &s, int64_t N, int64_t L, int64_t D, int64_t F, int64_t H)
{
    gpu_bf16 **rows[] = {&s.h1, &s.q_pre, &s.k_pre, &s.y_attn, &s.x1, &s.n3, &s.cq_pre,
                         &s.cq, &s.cattn, &s.y_cross, &s.x2, &s.h2, &s.y_ffn};
    for (gpu_bf16 **p : rows) *p = c.take<gpu_bf16>(N * D);
    gpu_bf16 **tiled[] = {&s.q, &s.k, &s.v, &s.attn};
    for (gpu_bf16 **p : tiled) *p = c.take<gpu_bf16>((N + kTileSlack) * D);
    s.ck_pre = c.take<gpu_bf16>(L * D);
    s.ck = c.take<gpu_bf16>(L * D);
    s.cv = c.take<gpu_bf16>(L * D);
    s.ffn_pre = c.take<gpu_bf16>(N * F);
    s.ffn_act = c.take<gpu_bf16>(N * F);
    float **stats[] = {&s.n3_mean, &s.n3_rstd, &s.ln2_mean, &s.ln2_rstd, &s.q_rstd, &s.k_rstd, &s.cq_rstd};
    for (float **p : stats) *p = c.take<float>(N);
    s.ck_rstd = c.take<float>(L);
    s.attn_lse = c.take<float>((N + kTileSlack) * H);
    s.cattn_lse = c.take<float>(N * H);
}

// Assign every workspace pointer (or, with c.base NULL, count the bytes) for the model's capacity and
// recomputation mode.
void layout_arena(gpu_model *gm, carver &c)
{
    const int64_t N = gm->max_tokens, L = gm->max_text, B = gm->max_samples, D = gm->dim, F = gm->ffn_dim,
                  H = gm->num_heads;
    for (int l = 0; l < gm->num_layers; ++l) {
        layout_kept(c, gm->saved[l], N, B, D);
        if (gm->recompute == GPU_RECOMPUTE_NONE) layout_recomputed(c, gm->saved[l], N, L, D, F, H);
    }
    if (gm->recompute == GPU_RECOMPUTE_BLOCK && gm->num_layers > 0) {
        block_saved shared = {};
        layout_recomputed(c, shared, N, L, D, F, H);
        for (int l = 0; l < gm->num_layers; ++l) {
            block_saved &s = gm->saved[l];
            const block_saved kept = s;
            s = shared;
            s.x_in = kept.x_in;
            s.modulation = kept.modulation;
            s.d_modulation = kept.d_modulation;
            s.n3_shift = kept.n3_shift;
            s.n3_scale = kept.n3_scale;
            s.ln1_mean = kept.ln1_mean;
            s.ln1_rstd = kept.ln1_rstd;
        }
    }
    gm->latents = c.take<float>(N * gm->patch_in);
    gm->noise = c.take<float>(N * gm->patch_in);
    gm->text_f32 = c.take<float>(L * gm->text_dim);
    gm->text = c.take<gpu_bf16>(L * gm->text_dim);
    gm->tokens_in = c.take<gpu_bf16>(N * gm->patch_in);
    gm->x0_tokens = c.take<float>(N * gm->patch_out);
    gm->noise_tokens = c.take<float>(N * gm->patch_out);
    gm->text_pre = c.take<gpu_bf16>(L * D);
    gm->text_act = c.take<gpu_bf16>(L * D);
    gm->context = c.take<gpu_bf16>(L * D);
    float **per_sample[] = {&gm->time_pre, &gm->time_act, &gm->time_emb, &gm->time_silu, &gm->head_shift,
                            &gm->head_scale, &gm->ones, &gm->d_n3_shift, &gm->d_n3_scale, &gm->d_unused_gate,
                            &gm->d_head_shift, &gm->d_head_scale, &gm->d_time_emb, &gm->d_time_b};
    for (float **p : per_sample) *p = c.take<float>(B * D);
    gm->e0 = c.take<float>(B * 6 * D);
    gm->d_e0 = c.take<float>(B * 6 * D);
    gm->head_mean = c.take<float>(N);
    gm->head_rstd = c.take<float>(N);
    gm->x_final = c.take<gpu_bf16>(N * D);
    gm->head_h = c.take<gpu_bf16>(N * D);
    gm->pred = c.take<gpu_bf16>(N * gm->patch_out);
    gm->d_pred = c.take<gpu_bf16>(N * gm->patch_out);
    gm->sample_loss = c.take<float>(B);
    gpu_bf16 **grads_nd[] = {&gm->d_x, &gm->d_h, &gm->d_y};
    for (gpu_bf16 **p : grads_nd) *p = c.take<gpu_bf16>(N * D);
    gpu_bf16 **grads_tiled[] = {&gm->d_t, &gm->d_q, &gm->d_k, &gm->d_v};  // self-attention's (attention_dispatch_fwd)
    for (gpu_bf16 **p : grads_tiled) *p = c.take<gpu_bf16>((N + kTileSlack) * D);
    gm->d_ffn = c.take<gpu_bf16>(N * F);
    gpu_bf16 **grads_ld[] = {&gm->d_ck, &gm->d_cv, &gm->d_ctx_part, &gm->d_context_bf16, &gm->d_text_pre};
    for (gpu_bf16 **p : grads_ld) *p = c.take<gpu_bf16>(L * D);
    gm->d_context = c.take<float>(L * D);
    layout_tables(c, gm->tables_device, gm->max_tokens, gm->max_samples, gm->freq_dim);
    gm->scratch = c.take<char>((int64_t)gm->scratch_bytes);
}

// The largest workspace any backward op asks for at these row counts.
size_t scratch_bytes_for(const gpu_model *gm, int64_t n_tokens, int64_t n_text, int n_samples)
{
    const size_t sizes[] = {
        lnmod_bwd_workspace_bytes(n_tokens, gm->dim, n_samples),
        lnmod_residual_bwd_workspace_bytes(n_tokens, gm->dim, n_samples),
        fused_qk_norm_rope_bwd_workspace_bytes(n_tokens, gm->dim),
        fused_qk_norm_rope_bwd_workspace_bytes(n_text, gm->dim),
        attention_bwd_workspace_bytes(n_tokens, gm->num_heads),
        fused_flow_loss_workspace_bytes(n_samples),
    };
    size_t largest = 0;
    for (size_t s : sizes) largest = s > largest ? s : largest;
    return largest;
}

template <typename T> T *pinned_alloc(int64_t count)
{
    void *p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, (size_t)(count > 0 ? count : 1) * sizeof(T)));
    return static_cast<T *>(p);
}

// ---- sequence parallelism: the member's slice and the head layout's buffers -------------------------------------

// The group that runs a micro-batch with sp_size > 1 (NULL for this rank alone), checked as the CPU model checks it.
const seqpar_gpu_group *sp_group_of(const gpu_model *gm, const model_batch *batch)
{
    const int k = batch->sp_size;
    if (k <= 1) return nullptr;
    ALDIT_CHECK(batch->sp_rank >= 0 && batch->sp_rank < k, "model: member %d of a group of %d ranks", batch->sp_rank, k);
    if (gm->num_heads % k != 0)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: a sequence-parallel group of %d ranks needs num_heads (%d) to be a "
                         "multiple of it: use a group size that divides the heads", k, gm->num_heads);
    const seqpar_gpu_group *group = seqpar_gpu_get(gm->sp.groups, k);
    if (!group)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model: a micro-batch for a sequence-parallel group of %d ranks, but no "
                         "NCCL communicator was made for groups of %d (the GPU exchange needs aldit built with NCCL "
                         "and more than one rank); set [balance] sp = off", k, k);
    ALDIT_CHECK(seqpar_gpu_rank(group) == batch->sp_rank, "model: the micro-batch names member %d of a group of %d "
                "ranks, but this rank is member %d", batch->sp_rank, k, seqpar_gpu_rank(group));
    return group;
}

// The host arrays of a group of k members for micro-batches of up to max_samples samples (grown once).
void sp_host_arrays(gpu_model *gm, int k)
{
    sp_state &sp = gm->sp;
    if (k > sp.capacity) {
        sp.capacity = k;
        sp.slice_start = static_cast<int64_t *>(xrealloc(sp.slice_start, (size_t)(k + 1) * sizeof(int64_t)));
        sp.counts = static_cast<int64_t *>(xrealloc(sp.counts, 4 * (size_t)k * sizeof(int64_t)));
    }
    if (!sp.sample_start) {
        sp.sample_start = static_cast<int64_t *>(xmalloc((size_t)(gm->max_samples + 1) * sizeof(int64_t)));
        sp.tables_pinned = pinned_alloc<int64_t>(3 * (int64_t)gm->max_samples + 2);
        sp.heads = static_cast<sp_heads *>(xcalloc((size_t)(gm->num_layers > 0 ? gm->num_layers : 1), sizeof(sp_heads)));
    }
}

// With the host tables of the whole micro-batch in place: this member's slice [p T/k, (p+1) T/k) (model.h), the
// samples' rows within it (token_start, pred_start; clamped), and the device tables' host side: the whole rows
// (sample_start), each sample's first token here (token_first) and its whole element count's offsets (whole_pred).
void sp_slice(gpu_model *gm, int B)
{
    sp_state &sp = gm->sp;
    batch_tables &t = gm->tables_host;
    sp_host_arrays(gm, sp.size);
    memcpy(sp.sample_start, t.token_start, (size_t)(B + 1) * sizeof(int64_t));
    sp.n_total = sp.sample_start[B];
    for (int p = 0; p <= sp.size; ++p) sp.slice_start[p] = sp.n_total * p / sp.size;
    sp.row_lo = sp.slice_start[sp.rank];
    const int64_t n_rows = sp.slice_start[sp.rank + 1] - sp.row_lo;
    int64_t *whole = sp.tables_pinned, *first = whole + B + 1, *whole_pred = first + B;
    for (int b = 0; b <= B; ++b) {
        const int64_t row = sp.sample_start[b] - sp.row_lo;
        t.token_start[b] = row < 0 ? 0 : row > n_rows ? n_rows : row;
        t.pred_start[b] = t.token_start[b] * gm->patch_out;
        whole[b] = sp.sample_start[b];
        whole_pred[b] = sp.sample_start[b] * gm->patch_out;
        if (b < B) first[b] = sp.row_lo + t.token_start[b] - sp.sample_start[b];
    }
}

// RoPE positions of this member's rows: each row's grid indices within its whole sample.
void sp_positions(gpu_model *gm, int B)
{
    sp_state &sp = gm->sp;
    if (sp.n_total > sp.positions_capacity) {
        sp.positions_capacity = sp.n_total;
        sp.positions = static_cast<int32_t *>(xrealloc(sp.positions, (size_t)sp.n_total * 3 * sizeof(int32_t)));
    }
    cpu_rope_positions(B, gm->grid_frames, gm->grid_height, gm->grid_width, sp.positions);
    const int64_t n_rows = sp.slice_start[sp.rank + 1] - sp.row_lo;
    memcpy(gm->tables_host.positions, sp.positions + sp.row_lo * 3, (size_t)(n_rows * 3) * sizeof(int32_t));
}

// The head layout's buffers for this micro-batch (c.base NULL: count the bytes): per block, or one set under block
// recomputation, which re-runs the exchange with the block.
void layout_sp(gpu_model *gm, carver &c, const batch_dims &d)
{
    sp_state &sp = gm->sp;
    const int64_t rows = sp.n_total + kTileSlack, Dk = gm->dim / sp.size, Hk = gm->num_heads / sp.size;
    const int sets = gm->recompute == GPU_RECOMPUTE_BLOCK ? 1 : gm->num_layers;
    carve_head_sets(c, sp.heads, &sp_heads::attn, gm->num_layers, sets, rows, Dk, Hk);
    gpu_bf16 **grads[] = {&sp.d_attn, &sp.d_q, &sp.d_k, &sp.d_v};
    for (gpu_bf16 **p : grads) *p = c.take<gpu_bf16>(rows * Dk);
    sp.xchg = c.take<gpu_bf16>(3 * d.n_tokens * gm->dim);
    sp.latents = c.take<float>(d.n_latent_values);
    sp.noise = c.take<float>(d.n_latent_values);
    sp.tables = c.take<int64_t>(3 * (int64_t)d.n_samples + 2);
}

// Grow the head layout's allocation to this micro-batch and carve it.
void sp_buffers(gpu_model *gm, const batch_dims &d)
{
    sp_state &sp = gm->sp;
    carver count = {nullptr, 0};
    layout_sp(gm, count, d);
    // the plan kept room for it by the layout's formula (exact where this member holds ceil(N / k) rows; its cuDNN
    // term is the attention buffer's, apart)
    const deck_recompute mode = gm->recompute == GPU_RECOMPUTE_BLOCK ? RECOMPUTE_BLOCK : RECOMPUTE_NONE;
    const int64_t cudnn = 4 * (gm->num_heads / sp.size) * (sp.n_total + kTileSlack) * (gm->dim / gm->num_heads + 1);
    const int64_t planned = layout_gpu_split_bytes(&gm->layout, mode, sp.n_total, d.n_samples, sp.size) - cudnn;
    ALDIT_CHECK((int64_t)count.used <= planned, "gpu model: the group buffers of a micro-batch of %lld tokens on %d "
                "ranks take %zu bytes, the memory formula (layout_gpu_split_bytes) says %lld",
                (long long)sp.n_total, sp.size, count.used, (long long)planned);
    if (count.used > sp.arena_bytes) {
        CUDA_CHECK(cudaFree(sp.arena));
        CUDA_CHECK(cudaMalloc(&sp.arena, count.used));
        CUDA_CHECK(cudaMemset(sp.arena, 0, count.used));   // finite values where a loopback group leaves parts unsent
        sp.arena_bytes = count.used;
    }
    carver assign = {sp.arena, 0};
    layout_sp(gm, assign, d);
}

// The device tables of the slice (sp_slice) and the whole samples' latents and noise, queued on `stream` (the batch's
// arrays are the caller's pageable memory: the copies are staged by the driver).
void sp_copy_inputs(gpu_model *gm, const model_batch *batch, const batch_dims &d, cudaStream_t stream)
{
    sp_state &sp = gm->sp;
    const size_t latent_bytes = (size_t)d.n_latent_values * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(sp.tables, sp.tables_pinned, (3 * (size_t)d.n_samples + 2) * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(sp.latents, batch->latents, latent_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(sp.noise, batch->noise, latent_bytes, cudaMemcpyHostToDevice, stream));
}

// Check the batch as model_pack and prepare_batch do (same messages), fill the host tables and the
// pinned copies, and queue the copies to the device. In a group the tables are this member's rows.
batch_dims stage_batch(gpu_model *gm, const model_batch *batch, cudaStream_t stream)
{
    const int B = batch->n_samples;
    ALDIT_CHECK(B > 0, "model: a micro-batch needs at least one sample (got %d)", B);
    if (B > gm->max_samples)
        ALDIT_FATAL("gpu model: a micro-batch of %d samples exceeds the %d the model was created for", B,
                    gm->max_samples);
    gm->sp.group = sp_group_of(gm, batch);
    gm->sp.size = gm->sp.group ? batch->sp_size : 1;
    gm->sp.rank = gm->sp.group ? batch->sp_rank : 0;
    batch_tables &t = gm->tables_host;
    t.token_start[0] = t.text_start[0] = t.latent_start[0] = t.pred_start[0] = 0;
    for (int b = 0; b < B; ++b) {
        const int32_t frames = batch->frames[b], height = batch->height[b], width = batch->width[b];
        if (frames <= 0 || height <= 0 || width <= 0 || frames % gm->patch_t || height % gm->patch_h ||
            width % gm->patch_w)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE,
                             "model: sample %d of the micro-batch has latent %dx%dx%d, not a positive multiple of "
                             "the patch %dx%dx%d",
                             b, frames, height, width, gm->patch_t, gm->patch_h, gm->patch_w);
        if (batch->text_len[b] < 0 || batch->text_len[b] > gm->text_len)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has %d text tokens (0..%d allowed)",
                             b, batch->text_len[b], gm->text_len);
        gm->grid_frames[b] = frames / gm->patch_t;
        gm->grid_height[b] = height / gm->patch_h;
        gm->grid_width[b] = width / gm->patch_w;
        const int64_t tokens = (int64_t)gm->grid_frames[b] * gm->grid_height[b] * gm->grid_width[b];
        t.token_start[b + 1] = t.token_start[b] + tokens;
        t.text_start[b + 1] = t.text_start[b] + batch->text_len[b];
        t.latent_start[b + 1] = t.latent_start[b] + (int64_t)gm->in_dim * frames * height * width;
        t.pred_start[b + 1] = t.token_start[b + 1] * gm->patch_out;
        t.latent_shape[3 * b] = frames;
        t.latent_shape[3 * b + 1] = height;
        t.latent_shape[3 * b + 2] = width;
    }
    if (gm->sp.group) sp_slice(gm, B);
    batch_dims dims;
    dims.n_samples = B;
    dims.n_tokens = t.token_start[B];
    dims.n_text = t.text_start[B];
    dims.n_latent_values = t.latent_start[B];
    if (dims.n_tokens > gm->max_tokens || dims.n_text > gm->max_text)
        ALDIT_FATAL("gpu model: a micro-batch of %lld tokens and %lld text rows exceeds the %lld and %lld the model "
                    "was created for", (long long)dims.n_tokens, (long long)dims.n_text, (long long)gm->max_tokens,
                    (long long)gm->max_text);
    for (int b = 0; b < B; ++b) {
        const float sigma = batch->sigma[b];
        if (!(sigma >= 0.0f && sigma <= 1.0f))
            ALDIT_FATAL("model: sample %d of the micro-batch has sigma %g outside [0, 1]", b, sigma);
        t.sigma[b] = sigma;
        gm->timesteps_host[b] = 1000.0f * sigma;
    }
    if (gm->sp.group) sp_positions(gm, B);
    else cpu_rope_positions(B, gm->grid_frames, gm->grid_height, gm->grid_width, t.positions);
    cpu_sinusoidal_embedding(gm->timesteps_host, B, gm->freq_dim, t.sinusoid);
    // Sizes the device workspace was not made for would be a bug here, not a bad batch.
    ALDIT_CHECK(scratch_bytes_for(gm, dims.n_tokens, dims.n_text, B) <= gm->scratch_bytes,
                "gpu model: backward workspace too small for %lld tokens", (long long)dims.n_tokens);
    if (gm->sp.group) {  // the head layout's attention backward: all T rows, H/k heads
        if (attention_bwd_workspace_bytes(gm->sp.n_total, gm->num_heads / gm->sp.size) > gm->scratch_bytes)
            ALDIT_FATAL("gpu model: a micro-batch of %lld tokens on a group of %d ranks needs more attention scratch "
                        "than the model's capacity of %lld tokens per rank gives", (long long)gm->sp.n_total,
                        gm->sp.size, (long long)gm->max_tokens);
        sp_buffers(gm, dims);
        sp_copy_inputs(gm, batch, dims, stream);
    }

    const size_t latent_bytes = (size_t)dims.n_latent_values * sizeof(float);
    const size_t text_bytes = (size_t)dims.n_text * gm->text_dim * sizeof(float);
    cpu_copy(gm->text_pinned, batch->text, text_bytes);
    CUDA_CHECK(cudaMemcpyAsync(gm->tables_device.token_start, gm->tables_pinned, gm->tables_bytes,
                               cudaMemcpyHostToDevice, stream));
    if (!gm->sp.group) {  // in a group the whole samples went to the group's buffers (sp_copy_inputs)
        cpu_copy(gm->latents_pinned, batch->latents, latent_bytes);
        cpu_copy(gm->noise_pinned, batch->noise, latent_bytes);
        CUDA_CHECK(cudaMemcpyAsync(gm->latents, gm->latents_pinned, latent_bytes, cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(gm->noise, gm->noise_pinned, latent_bytes, cudaMemcpyHostToDevice, stream));
    }
    if (text_bytes)
        CUDA_CHECK(cudaMemcpyAsync(gm->text_f32, gm->text_pinned, text_bytes, cudaMemcpyHostToDevice, stream));
    return dims;
}

} // namespace

namespace {

// y = x W^T + b with the bf16 copies of a Linear's parameters (lin's offsets into the unit's weights w).
void linear_fwd(const gpu_model *gm, const gpu_bf16 *w, const gpu_bf16 *x, int64_t n_rows, int in_dim, int out_dim,
                linear_offsets lin, gpu_bf16 *y, cudaStream_t stream)
{
    gemm_linear_fwd(gm->gemm, x, n_rows, in_dim, out_dim, w + lin.weight, w + lin.bias, GEMM_EPILOGUE_BIAS, y, nullptr,
                    stream);
}

// act = gelu_tanh(pre), pre = x W^T + b (both kept for the backward).
void linear_gelu_fwd(const gpu_model *gm, const gpu_bf16 *w, const gpu_bf16 *x, int64_t n_rows, int in_dim,
                     int out_dim, linear_offsets lin, gpu_bf16 *pre, gpu_bf16 *act, cudaStream_t stream)
{
    gemm_linear_fwd(gm->gemm, x, n_rows, in_dim, out_dim, w + lin.weight, w + lin.bias, GEMM_EPILOGUE_GELU_AUX_BIAS,
                    act, pre, stream);
}

// dW, db added into the unit's fp32 gradients g; dx (skipped when NULL) overwritten or, with accumulate_dx, added
// into; with gelu_input, dx is the gradient of the GELU's input instead (see gemm.h).
void linear_bwd(gpu_model *gm, const gpu_bf16 *w, float *g, const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows,
                int in_dim, int out_dim, linear_offsets lin, const gpu_bf16 *gelu_input, gpu_bf16 *dx,
                int accumulate_dx, cudaStream_t stream)
{
    gemm_linear_bwd_weight(gm->gemm, x, dy, n_rows, in_dim, out_dim, g + lin.weight, g + lin.bias, 1, stream);
    if (dx) gemm_linear_bwd_data(gm->gemm, dy, n_rows, in_dim, out_dim, w + lin.weight, gelu_input, dx, accumulate_dx,
                                 stream);
}

// ---- the block's large linears in bf16 or FP8 ([train] precision) ----------------------------------------

int fp8_tensor(int layer, int linear, int role)
{
    return (layer * kFp8Linears + linear) * kFp8Roles + role;
}

// Self k and v read the input q read (h1): its FP8 copy and scale, made once by q's call, serve all three.
int fp8_input_owner(int linear)
{
    return linear == kSelfK || linear == kSelfV ? kSelfQ : linear;
}

// y = x W^T + b (pre: with the GELU epilogue, pre = x W^T + b and y = gelu(pre)) of block `layer`'s linear `which`:
// bf16, or FP8 operands cast here (the input once for self q, k, v; the weight on each use).
void block_linear_fwd(const gpu_model *gm, int layer, int which, const gpu_bf16 *w, const gpu_bf16 *x, int64_t n_rows,
                      int in_dim, int out_dim, linear_offsets lin, gpu_bf16 *y, gpu_bf16 *pre, cudaStream_t stream)
{
    const gemm_epilogue epilogue = pre ? GEMM_EPILOGUE_GELU_AUX_BIAS : GEMM_EPILOGUE_BIAS;
    fp8_linears *f = gm->fp8;
    if (!f) {
        gemm_linear_fwd(gm->gemm, x, n_rows, in_dim, out_dim, w + lin.weight, w + lin.bias, epilogue, y, pre, stream);
        return;
    }
    const int input = fp8_tensor(layer, fp8_input_owner(which), kFp8Input), weight = fp8_tensor(layer, which, kFp8Weight);
    // the FFN's second linear reads the E4M3 copy of the GELU output its first one emitted, where it did
    const bool emitted = which == kFfnOut && f->act_ready;
    f->act_ready = false;
    const uint8_t *x8 = emitted ? f->g8 : f->x8;
    if (fp8_input_owner(which) == which && !emitted)
        fp8_quantize(f->scaling, input, x, n_rows, in_dim, f->x8, nullptr, 0, stream);
    fp8_quantize(f->scaling, weight, w + lin.weight, out_dim, in_dim, f->w8, nullptr, 0, stream);
    // the FFN's first linear: its GELU output straight to E4M3 at the second's input scale (from the second step on:
    // the first casts by its own amax), the bf16 output not written; else bf16 and a cast before the second
    if (which == kFfnIn && fp8_scaling_updates(f->scaling) > 0) {
        const int act = fp8_tensor(layer, kFfnOut, kFp8Input);
        if (gemm_fp8_fwd_gelu_fp8(gm->gemm, x8, fp8_scale_inv(f->scaling, input), n_rows, in_dim, out_dim, f->w8,
                                  fp8_scale_inv(f->scaling, weight), w + lin.bias, fp8_scale(f->scaling, act), f->g8,
                                  pre, f->amax_d, stream)) {
            fp8_record_amax(f->scaling, act, f->amax_d, stream);
            f->act_ready = true;
            return;
        }
    }
    gemm_fp8_fwd(gm->gemm, x8, fp8_scale_inv(f->scaling, input), n_rows, in_dim, out_dim, f->w8,
                 fp8_scale_inv(f->scaling, weight), w + lin.bias, epilogue, y, pre, stream);
}

// The backward of block_linear_fwd: dW, db added into g; dx (skipped when NULL) overwritten or added into; with
// gelu_input, dx is the gradient of the GELU's input (as linear_bwd). FP8: dy cast to E5M2 with its transpose and db
// (its column sums) in one pass, the input's transpose (once for self q, k, v: q's backward comes first), the
// weight's transpose. The FFN's second linear gives dx without the DGELU epilogue (cuBLASLt runs its FP8 one as a
// separate pass several times the GEMM's own time: docs/PERFORMANCE.md, session 19); the first linear's cast of dy
// applies gelu_tanh' in the same pass (fp8_quantize_dbias_dgelu).
void block_linear_bwd(gpu_model *gm, int layer, int which, const gpu_bf16 *w, float *g, const gpu_bf16 *x,
                      const gpu_bf16 *dy, int64_t n_rows, int in_dim, int out_dim, linear_offsets lin,
                      const gpu_bf16 *gelu_input, gpu_bf16 *dx, int accumulate_dx, cudaStream_t stream)
{
    fp8_linears *f = gm->fp8;
    if (!f) {
        linear_bwd(gm, w, g, x, dy, n_rows, in_dim, out_dim, lin, gelu_input, dx, accumulate_dx, stream);
        return;
    }
    const int64_t padded = gemm_fp8_padded_rows(n_rows);
    const int input = fp8_tensor(layer, fp8_input_owner(which), kFp8Input), weight = fp8_tensor(layer, which, kFp8Weight);
    const int grad = fp8_tensor(layer, which, kFp8Grad);
    const gpu_bf16 *dgelu_pre = which == kFfnIn ? f->dgelu_pre : nullptr;
    f->dgelu_pre = nullptr;
    if (dgelu_pre)
        fp8_quantize_dbias_dgelu(f->scaling, grad, dy, dgelu_pre, n_rows, out_dim, f->g8, f->gt8, padded, g + lin.bias,
                                 f->partials, stream);
    else
        fp8_quantize_dbias(f->scaling, grad, dy, n_rows, out_dim, f->g8, f->gt8, padded, g + lin.bias, f->partials,
                           stream);
    if (which == kFfnOut && gelu_input)  // its input is gelu(pre): cast from pre (the forward may not have kept it)
        fp8_quantize_gelu(f->scaling, input, gelu_input, n_rows, in_dim, nullptr, f->xt8, padded, stream);
    else if (fp8_input_owner(which) == which)
        fp8_quantize(f->scaling, input, x, n_rows, in_dim, nullptr, f->xt8, padded, stream);
    gemm_fp8_bwd_weight(gm->gemm, f->xt8, fp8_scale_inv(f->scaling, input), f->gt8, fp8_scale_inv(f->scaling, grad),
                        padded, in_dim, out_dim, g + lin.weight, 1, stream);
    if (!dx) return;
    fp8_quantize(f->scaling, weight, w + lin.weight, out_dim, in_dim, nullptr, f->wt8, out_dim, stream);
    const bool defer_dgelu = which == kFfnOut && gelu_input != nullptr;
    gemm_fp8_bwd_data(gm->gemm, f->g8, fp8_scale_inv(f->scaling, grad), n_rows, in_dim, out_dim, f->wt8,
                      fp8_scale_inv(f->scaling, weight), defer_dgelu ? nullptr : gelu_input, dx, accumulate_dx, stream);
    if (defer_dgelu) f->dgelu_pre = gelu_input;
}

// The fp32 value of the time path at flat offset `offset` (time_first <= offset < blocks_offset), of the time path's
// weights `time_w` (from gpu_model_params.time_weights).
const float *time_weight(const gpu_model *gm, const float *time_w, int64_t offset)
{
    return time_w + (offset - gm->time_first);
}

// The block that asks for its weights after block `layer`'s forward (-1: none): the next one, and after the
// last the one before it (the backward starts with the last block, which is in place).
int forward_next(const gpu_model *gm, int layer)
{
    return layer + 1 < gm->num_layers ? layer + 1 : layer - 1;
}

// Block `layer`'s bf16 weights for the work queued from now (gpu_block_weights_fn), `next` the block asked for after it.
const gpu_bf16 *block_weights(const gpu_model *gm, int layer, int next, cudaStream_t stream)
{
    return gm->params.block_weights(gm->params.context, layer, next, stream);
}

float *chunk_of(float *table, int chunk, const batch_dims &d, int dim)
{
    return table + (int64_t)chunk * d.n_samples * dim;
}

// ---- attention dispatch (attention-cudnn) ------------------------------------------------------------------
// Self-attention (each sample's tokens attend to its own tokens) and cross-attention (to its own text rows)
// go through one dispatch. A sample of at least cudnn_min_tokens tokens that has key rows (cross-attention:
// the model's full text_len of them, see sample_on_cudnn) runs on cuDNN, whose stats (head-major [H, S], see
// attention_cudnn.h) fill that sample's slice of the lse buffer; its backward reads them back, as the
// dispatch is the same both ways. The other samples run on our own kernel in maximal runs of consecutive
// samples: its kernels take absolute row offsets, so a run passes its piece of the device offset tables.
// A cross-attention sample without text stays on our own kernel (zero output).

enum attention_kind { kSelfAttention, kCrossAttention };

// The query rows and heads one attention runs over: the micro-batch's token rows with every head, or, in a
// sequence-parallel group's self-attention, every row of the whole micro-batch with this member's heads.
struct attention_rows {
    int heads, width;                      // heads of the layout; values per row (heads * head_dim)
    int64_t n_rows;                        // rows of the micro-batch (cuDNN's tile padding lies past them)
    const int64_t *start, *device_start;   // [B + 1] each sample's rows: host, device
};

attention_rows token_rows(const gpu_model *gm, const batch_dims &d)
{
    return {gm->num_heads, gm->dim, d.n_tokens, gm->tables_host.token_start, gm->tables_device.token_start};
}

// The key/value row offsets of an attention: the query rows (self) or the text rows (cross).
const int64_t *key_start(const gpu_model *gm, const attention_rows &r, attention_kind kind, bool device)
{
    if (kind == kSelfAttention) return device ? r.device_start : r.start;
    return device ? gm->tables_device.text_start : gm->tables_host.text_start;
}

// cuDNN wants 16-byte aligned stats: the slice starts start[b] * heads floats into the lse buffer.
// Cross-attention goes to cuDNN only with the model's full text_len (Wan pads every caption to it): cuDNN
// needs a plan per (tokens, keys) pair, and captions of varying lengths would build plans (0.04-1 s each)
// for most samples (much slower epochs with captions of varying length).
bool sample_on_cudnn(const gpu_model *gm, const attention_rows &r, attention_kind kind, int b)
{
    const int64_t *start = r.start, *keys = key_start(gm, r, kind, false);
    const int64_t n_keys = keys[b + 1] - keys[b];
    return gm->use_cudnn && start[b + 1] - start[b] >= gm->cudnn_min_tokens && n_keys > 0 &&
           (kind == kSelfAttention || n_keys == gm->text_len) && start[b] * r.heads % 4 == 0;
}

#ifdef HAVE_CUDNN
// The rows cuDNN runs sample b's self-attention on: whole tiles (attention_cudnn.h) when it is the last sample of
// the batch and its length is not a multiple of the tile (the rows past it are then free: the self-attention's
// tensors have kTileSlack rows past the capacity), else its own length. Forward and backward decide alike.
int64_t cudnn_self_rows(const attention_rows &r, int n_samples, int b)
{
    const int64_t rows = r.start[b + 1] - r.start[b];
    return b == n_samples - 1 ? attention_cudnn_padded_rows(rows) : rows;
}

// Zero rows [n_rows, n_rows + pad_rows) of each of the `count` row buffers of r.width columns.
void zero_pad_rows(gpu_bf16 *const *buffers, int count, const attention_rows &r, int64_t pad_rows,
                   cudaStream_t stream)
{
    for (int i = 0; i < count; ++i)
        CUDA_CHECK(cudaMemsetAsync(buffers[i] + r.n_rows * r.width, 0, (size_t)(pad_rows * r.width) * sizeof(gpu_bf16),
                                   stream));
}

// ---- [train] fp8_attention: a sample's self-attention through cuDNN's FP8 SDPA (attention_fp8.h) -----------------
// Block `layer`'s q, k, v (and in the backward o, do) are cast to FP8 at their tensors' scales (delayed scaling, with
// the linears' in one set), cuDNN runs the sample over the same rows as the bf16 call (padded to whole tiles where
// that one is), and its FP8 outputs come back to the bf16 buffers the rest of the block reads (o rescaled for the
// padding as attention_cudnn_fwd_padded's). Before the set's first update (a run's first step) the step runs bf16 and
// the forward's FP8 calls only probe: their amaxes of s and o (which cuDNN takes before quantizing); the backward runs
// no FP8 graph: the bf16 tensors' amaxes of do, dq, dk, dv and a bound for dp start the histories, so that the second
// step finds scales for every tensor.

int fp8_attn_tensor(const gpu_model *gm, int layer, int role)
{
    return gm->num_layers * kFp8Linears * kFp8Roles + layer * kFp8AttnRoles + role;
}

bool fp8_attention_on(const gpu_model *gm, int fp8_layer, attention_kind kind)
{
    return fp8_layer >= 0 && kind == kSelfAttention && gm->fp8 && gm->fp8->attention;
}

// The call's scales array from block `layer`'s tensors (the amax slots zero).
void load_attention_scales(const gpu_model *gm, int layer, cudaStream_t stream)
{
    const fp8_scaling *sc = gm->fp8->scaling;
    auto inv = [&](int role) { return fp8_scale_inv(sc, fp8_attn_tensor(gm, layer, role)); };
    auto scale = [&](int role) { return fp8_scale(sc, fp8_attn_tensor(gm, layer, role)); };
    const float *sources[ATTENTION_FP8_SLOTS] = {};
    sources[ATTENTION_FP8_DESCALE_Q] = inv(kAttnQ), sources[ATTENTION_FP8_DESCALE_K] = inv(kAttnK);
    sources[ATTENTION_FP8_DESCALE_V] = inv(kAttnV), sources[ATTENTION_FP8_DESCALE_O] = inv(kAttnO);
    sources[ATTENTION_FP8_DESCALE_DO] = inv(kAttnDO), sources[ATTENTION_FP8_DESCALE_S] = inv(kAttnS);
    sources[ATTENTION_FP8_DESCALE_DP] = inv(kAttnDP);
    sources[ATTENTION_FP8_SCALE_S] = scale(kAttnS), sources[ATTENTION_FP8_SCALE_O] = scale(kAttnO);
    sources[ATTENTION_FP8_SCALE_DP] = scale(kAttnDP), sources[ATTENTION_FP8_SCALE_DQ] = scale(kAttnDQ);
    sources[ATTENTION_FP8_SCALE_DK] = scale(kAttnDK), sources[ATTENTION_FP8_SCALE_DV] = scale(kAttnDV);
    attention_fp8_load_scales(gm->fp8->attn_scales, sources, stream);
}

// The amaxes a call wrote into its scales array (the slots of `roles`, by role) into block `layer`'s running amaxes.
void record_attention_amaxes(gpu_model *gm, int layer, const int *slots, const int *roles, int n, cudaStream_t stream)
{
    for (int i = 0; i < n; ++i)
        fp8_record_amax(gm->fp8->scaling, fp8_attn_tensor(gm, layer, roles[i]), gm->fp8->attn_scales + 4 * slots[i],
                        stream);
}

// rows x width bf16 values of x as block `layer`'s tensor `role` into out8 [padded x width] (rows past `rows` zero).
void cast_attention_input(gpu_model *gm, int layer, int role, const gpu_bf16 *x, int64_t rows, int64_t padded,
                          int width, uint8_t *out8, cudaStream_t stream)
{
    fp8_quantize(gm->fp8->scaling, fp8_attn_tensor(gm, layer, role), x, rows, width, out8, nullptr, 0, stream);
    if (padded > rows)
        CUDA_CHECK(cudaMemsetAsync(out8 + rows * width, 0, (size_t)((padded - rows) * width), stream));
}

// q, k, v of `padded` rows (the pad rows zero) into the scratch's q8, k8, v8.
void cast_attention_qkv(gpu_model *gm, int layer, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                        int64_t padded, int width, cudaStream_t stream)
{
    fp8_linears *f = gm->fp8;
    cast_attention_input(gm, layer, kAttnQ, q, padded, padded, width, f->q8, stream);
    cast_attention_input(gm, layer, kAttnK, k, padded, padded, width, f->k8, stream);
    cast_attention_input(gm, layer, kAttnV, v, padded, padded, width, f->v8, stream);
}

// Sample rows [at, at + rows) of the self-attention in FP8 (padded rows: those cuDNN runs, whose rows past `rows`
// are zero in q, k, v): out (padded rows, bf16) and lse (head-major [H, padded]) as attention_cudnn_fwd_padded's.
// probe: only the amaxes (out and lse untouched). false where cuDNN refuses the shape (nothing written).
bool fp8_self_attention_fwd(gpu_model *gm, int layer, const attention_rows &r, const gpu_bf16 *q, const gpu_bf16 *k,
                            const gpu_bf16 *v, int64_t rows, int64_t padded, gpu_bf16 *out, float *lse, bool probe,
                            cudaStream_t stream)
{
    fp8_linears *f = gm->fp8;
    const int W = r.width;
    cast_attention_qkv(gm, layer, q, k, v, padded, W, stream);
    load_attention_scales(gm, layer, stream);
    if (!attention_fp8_fwd(f->attention, ATTENTION_FP8_ROWS, f->q8, f->k8, f->v8, padded, r.heads, gm->head_dim, f->o8,
                           probe ? f->probe_stats : lse, f->attn_scales, stream)) {
        ++f->attention_refused;
        return false;
    }
    const int slots[] = {ATTENTION_FP8_AMAX_S, ATTENTION_FP8_AMAX_O}, roles[] = {kAttnS, kAttnO};
    record_attention_amaxes(gm, layer, slots, roles, 2, stream);
    if (probe) return true;
    fp8_dequantize(f->scaling, fp8_attn_tensor(gm, layer, kAttnO), f->o8, padded * W, out, stream);
    attention_cudnn_rescale_padded(out, lse, rows, padded, r.heads, gm->head_dim, stream);
    return true;
}

// The backward of fp8_self_attention_fwd: dq, dk, dv (padded rows, bf16; the pad rows scratch) from out, lse and the
// output gradient dout (pad rows zero). probe (the first step, after the bf16 backward wrote dq, dk, dv): no FP8 graph
// runs (it was most of the first step's extra time): the amaxes of do, dq, dk, dv from the bf16 tensors, and dp's
// bounded, |dP| <= 2 head_dim max|dO| max|V| (dP = dO V^T and the softmax backward's dO.O term, |O| <= max|V|): E5M2's
// range holds the slack (the history keeps it for its length). Nothing written. false where cuDNN refuses the shape.
bool fp8_self_attention_bwd(gpu_model *gm, int layer, const attention_rows &r, const gpu_bf16 *q, const gpu_bf16 *k,
                            const gpu_bf16 *v, const gpu_bf16 *out, const gpu_bf16 *dout, const float *lse,
                            int64_t rows, int64_t padded, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv, bool probe,
                            cudaStream_t stream)
{
    fp8_linears *f = gm->fp8;
    const int W = r.width;
    const int slots[] = {ATTENTION_FP8_AMAX_DP, ATTENTION_FP8_AMAX_DQ, ATTENTION_FP8_AMAX_DK, ATTENTION_FP8_AMAX_DV};
    const int roles[] = {kAttnDP, kAttnDQ, kAttnDK, kAttnDV};
    gpu_bf16 *const grads[] = {dq, dk, dv};
    if (probe) {  // no FP8 graph: dP's amax bounded from dO's and V's (V's from this step's forward probe)
        fp8_record_amax_of(f->scaling, fp8_attn_tensor(gm, layer, kAttnDO), dout, rows * W, stream);
        fp8_record_amax_bound(f->scaling, fp8_attn_tensor(gm, layer, kAttnDP), fp8_attn_tensor(gm, layer, kAttnDO),
                              fp8_attn_tensor(gm, layer, kAttnV), 2.0f * (float)gm->head_dim, stream);
        for (int i = 0; i < 3; ++i)
            fp8_record_amax_of(f->scaling, fp8_attn_tensor(gm, layer, roles[1 + i]), grads[i], rows * W, stream);
        return true;
    }
    cast_attention_qkv(gm, layer, q, k, v, padded, W, stream);
    cast_attention_input(gm, layer, kAttnO, out, rows, padded, W, f->o8, stream);
    cast_attention_input(gm, layer, kAttnDO, dout, padded, padded, W, f->do8, stream);
    load_attention_scales(gm, layer, stream);
    if (!attention_fp8_bwd(f->attention, ATTENTION_FP8_ROWS, f->q8, f->k8, f->v8, f->o8, f->do8, lse, padded, r.heads,
                           gm->head_dim, f->dq8, f->dk8, f->dv8, f->attn_scales, stream)) {
        ++f->attention_refused;
        return false;
    }
    uint8_t *const grads8[] = {f->dq8, f->dk8, f->dv8};
    record_attention_amaxes(gm, layer, slots, roles, 4, stream);
    for (int i = 0; i < 3; ++i)
        fp8_dequantize(f->scaling, fp8_attn_tensor(gm, layer, roles[1 + i]), grads8[i], padded * W, grads[i], stream);
    return true;
}
#endif

// The end of the run of samples that starts at `first` (a sample on cuDNN is a run of one).
int run_end(const gpu_model *gm, const attention_rows &r, attention_kind kind, int n_samples, int first)
{
    if (sample_on_cudnn(gm, r, kind, first)) return first + 1;
    int end = first + 1;
    while (end < n_samples && !sample_on_cudnn(gm, r, kind, end)) ++end;
    return end;
}

// out and lse ([rows, heads] as attention.h's; head-major per sample on cuDNN) from q (the rows of r) and k, v
// (key rows of `kind`). q, k, v are not const: a last sample run over whole tiles has their rows past the
// batch's zeroed. fp8_layer: the block whose FP8 self-attention tensors a sample on cuDNN uses where [train]
// fp8_attention is on (-1: bf16).
void attention_dispatch_fwd(gpu_model *gm, const attention_rows &r, int n_samples, attention_kind kind, int fp8_layer,
                            gpu_bf16 *q, gpu_bf16 *k, gpu_bf16 *v, gpu_bf16 *out, float *lse, cudaStream_t stream)
{
    const int H = r.heads, hd = gm->head_dim;
    const int64_t *start = r.start, *device_start = r.device_start;
    const int64_t *keys = key_start(gm, r, kind, false), *device_keys = key_start(gm, r, kind, true);
    for (int b = 0, end = 0; b < n_samples; b = end) {
        end = run_end(gm, r, kind, n_samples, b);
#ifdef HAVE_CUDNN
        if (sample_on_cudnn(gm, r, kind, b)) {
            const int64_t at = start[b] * r.width, key_at = keys[b] * r.width, rows = start[end] - start[b];
            const int64_t padded = kind == kSelfAttention ? cudnn_self_rows(r, n_samples, b) : rows;
            if (padded > rows) {
                gpu_bf16 *const inputs[] = {q, k, v};
                zero_pad_rows(inputs, 3, r, padded - rows, stream);
            }
            const bool fp8 = fp8_attention_on(gm, fp8_layer, kind);
            const bool steady = fp8 && fp8_scaling_updates(gm->fp8->scaling) > 0;
            if (steady && fp8_self_attention_fwd(gm, fp8_layer, r, q + at, k + at, v + at, rows, padded, out + at,
                                                 lse + start[b] * H, false, stream))
                continue;
            if (padded > rows) {
                attention_cudnn_fwd_padded(gm->cudnn, q + at, k + at, v + at, rows, padded, H, hd, out + at, lse + start[b] * H,
                                           stream);
            } else {
                attention_cudnn_cross_fwd(gm->cudnn, q + at, k + key_at, v + key_at, rows, keys[end] - keys[b], H, hd, out + at,
                                          lse + start[b] * H, stream);
            }
            if (fp8 && !steady)  // the first step: the FP8 call's amaxes only
                fp8_self_attention_fwd(gm, fp8_layer, r, q + at, k + at, v + at, rows, padded, out + at,
                                       lse + start[b] * H, true, stream);
            continue;
        }
#endif
        attention_fwd(q, k, v, H, hd, device_start + b, device_keys + b, end - b, start[end], keys[end], out, lse,
                      stream);
    }
}

// dq (the rows of r), dk, dv (key rows of `kind`) from the output gradient dout (its pad rows are zeroed where a
// last sample runs over whole tiles); fp8_layer as attention_dispatch_fwd's (the backward in FP8 only with
// fp8_attention = on).
void attention_dispatch_bwd(gpu_model *gm, const attention_rows &r, int n_samples, attention_kind kind, int fp8_layer,
                            const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, const gpu_bf16 *out,
                            gpu_bf16 *dout, const float *lse, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv,
                            cudaStream_t stream)
{
    const int H = r.heads, hd = gm->head_dim;
    const int64_t *start = r.start, *device_start = r.device_start;
    const int64_t *keys = key_start(gm, r, kind, false), *device_keys = key_start(gm, r, kind, true);
    for (int b = 0, end = 0; b < n_samples; b = end) {
        end = run_end(gm, r, kind, n_samples, b);
#ifdef HAVE_CUDNN
        if (sample_on_cudnn(gm, r, kind, b)) {
            const int64_t at = start[b] * r.width, key_at = keys[b] * r.width, rows = start[end] - start[b];
            const int64_t padded = kind == kSelfAttention ? cudnn_self_rows(r, n_samples, b) : rows;
            if (padded > rows) {  // q, k, v still have zero pad rows from the forward; the output gradient's too
                gpu_bf16 *const output_grad[] = {dout};
                zero_pad_rows(output_grad, 1, r, padded - rows, stream);
            }
            const bool fp8 = fp8_attention_on(gm, fp8_layer, kind) && gm->fp8->attention_backward;
            const bool steady = fp8 && fp8_scaling_updates(gm->fp8->scaling) > 0;
            if (steady && fp8_self_attention_bwd(gm, fp8_layer, r, q + at, k + at, v + at, out + at, dout + at,
                                                 lse + start[b] * H, rows, padded, dq + at, dk + at, dv + at, false,
                                                 stream))
                continue;
            if (padded > rows) {
                attention_cudnn_bwd_padded(gm->cudnn, q + at, k + at, v + at, out + at, dout + at, lse + start[b] * H, rows,
                                           padded, H, hd, dq + at, dk + at, dv + at, stream);
            } else {
                attention_cudnn_cross_bwd(gm->cudnn, q + at, k + key_at, v + key_at, out + at, dout + at, lse + start[b] * H,
                                          rows, keys[end] - keys[b], H, hd, dq + at, dk + key_at, dv + key_at, stream);
            }
            if (fp8 && !steady)  // the first step: the FP8 call's amaxes only
                fp8_self_attention_bwd(gm, fp8_layer, r, q + at, k + at, v + at, out + at, dout + at, lse + start[b] * H,
                                       rows, padded, dq + at, dk + at, dv + at, true, stream);
            continue;
        }
#endif
        attention_bwd(q, k, v, out, dout, lse, H, hd, device_start + b, device_keys + b, end - b, start[end],
                      keys[end], dq, dk, dv, gm->scratch, stream);
    }
}

// ---- sequence parallelism: the exchange over heads (Ulysses) ---------------------------------------------------

// Every row of the micro-batch with this member's heads: the self-attention's rows in a group.
attention_rows head_rows(const gpu_model *gm)
{
    const sp_state &sp = gm->sp;
    return {gm->num_heads / sp.size, gm->dim / sp.size, sp.n_total, sp.sample_start, sp.tables};
}

// local[i] [N, D] (this member's rows, every head) -> all[i] [T, D/k] (every row, this member's heads): columns
// [p D/k, (p+1) D/k) of the rows go to member p, which places them at this member's rows.
void sp_to_heads(gpu_model *gm, const batch_dims &d, const gpu_bf16 *const *local, gpu_bf16 *const *all, int n,
                 cudaStream_t stream)
{
    sp_state &sp = gm->sp;
    const int k = sp.size;
    const int64_t N = d.n_tokens, D = gm->dim, Dk = D / k;
    const gpu_bf16 *send[3];
    for (int i = 0; i < n; ++i) {
        misc_split_columns_bf16(local[i], N, (int)D, k, sp.xchg + i * N * D, stream);
        send[i] = sp.xchg + i * N * D;
    }
    int64_t *c = sp.counts;
    for (int p = 0; p < k; ++p) {
        c[p] = N * Dk;
        c[k + p] = p * N * Dk;
        c[2 * k + p] = (sp.slice_start[p + 1] - sp.slice_start[p]) * Dk;
        c[3 * k + p] = sp.slice_start[p] * Dk;
    }
    seqpar_gpu_alltoall_bf16(sp.group, n, send, c, c + k, all, c + 2 * k, c + 3 * k, stream);
}

// The reverse of sp_to_heads: all[i] [T, D/k] -> local[i] [N, D].
void sp_to_tokens(gpu_model *gm, const batch_dims &d, const gpu_bf16 *const *all, gpu_bf16 *const *local, int n,
                  cudaStream_t stream)
{
    sp_state &sp = gm->sp;
    const int k = sp.size;
    const int64_t N = d.n_tokens, D = gm->dim, Dk = D / k;
    gpu_bf16 *recv[3];
    for (int i = 0; i < n; ++i) recv[i] = sp.xchg + i * N * D;
    int64_t *c = sp.counts;
    for (int p = 0; p < k; ++p) {
        c[p] = (sp.slice_start[p + 1] - sp.slice_start[p]) * Dk;
        c[k + p] = sp.slice_start[p] * Dk;
        c[2 * k + p] = N * Dk;
        c[3 * k + p] = p * N * Dk;
    }
    seqpar_gpu_alltoall_bf16(sp.group, n, all, c, c + k, recv, c + 2 * k, c + 3 * k, stream);
    for (int i = 0; i < n; ++i) misc_join_columns_bf16(recv[i], N, (int)D, k, local[i], stream);
}

// Block l's self-attention of s.q, s.k, s.v (after RMSNorm and RoPE) into s.attn: alone, over this rank's samples;
// in a group, over every row for this member's heads between the two exchanges.
void self_attention_fwd(gpu_model *gm, const batch_dims &d, int l, block_saved &s, cudaStream_t stream)
{
    if (!gm->sp.group) {
        attention_dispatch_fwd(gm, token_rows(gm, d), d.n_samples, kSelfAttention, l, s.q, s.k, s.v, s.attn,
                               s.attn_lse, stream);
        return;
    }
    const sp_heads &h = gm->sp.heads[l];
    const gpu_bf16 *const rows[] = {s.q, s.k, s.v};
    gpu_bf16 *const heads[] = {h.q, h.k, h.v};
    sp_to_heads(gm, d, rows, heads, 3, stream);
    attention_dispatch_fwd(gm, head_rows(gm), d.n_samples, kSelfAttention, l, h.q, h.k, h.v, h.attn, h.lse, stream);
    const gpu_bf16 *const out_heads[] = {h.attn};
    gpu_bf16 *const out_rows[] = {s.attn};
    sp_to_tokens(gm, d, out_heads, out_rows, 1, stream);
}

// dq, dk, dv into gm->d_q, d_k, d_v (this rank's rows) from the output gradient in gm->d_t; in a group the output
// gradient goes to the head owners and dq, dk, dv come back.
void self_attention_bwd(gpu_model *gm, const batch_dims &d, int l, const block_saved &s, cudaStream_t stream)
{
    if (!gm->sp.group) {
        attention_dispatch_bwd(gm, token_rows(gm, d), d.n_samples, kSelfAttention, l, s.q, s.k, s.v, s.attn, gm->d_t,
                               s.attn_lse, gm->d_q, gm->d_k, gm->d_v, stream);
        return;
    }
    sp_state &sp = gm->sp;
    const sp_heads &h = sp.heads[l];
    const gpu_bf16 *const dout_rows[] = {gm->d_t};
    gpu_bf16 *const dout_heads[] = {sp.d_attn};
    sp_to_heads(gm, d, dout_rows, dout_heads, 1, stream);
    attention_dispatch_bwd(gm, head_rows(gm), d.n_samples, kSelfAttention, l, h.q, h.k, h.v, h.attn, sp.d_attn, h.lse,
                           sp.d_q, sp.d_k, sp.d_v, stream);
    const gpu_bf16 *const grads_heads[] = {sp.d_q, sp.d_k, sp.d_v};
    gpu_bf16 *const grads_rows[] = {gm->d_q, gm->d_k, gm->d_v};
    sp_to_tokens(gm, d, grads_heads, grads_rows, 3, stream);
}

void cross_attention_fwd(gpu_model *gm, const batch_dims &d, block_saved &s, cudaStream_t stream)
{
    attention_dispatch_fwd(gm, token_rows(gm, d), d.n_samples, kCrossAttention, -1, s.cq, s.ck, s.cv, s.cattn,
                           s.cattn_lse, stream);
}

// dq into gm->d_q, dk and dv of the text rows into gm->d_ck, d_cv, from the output gradient in gm->d_t.
void cross_attention_bwd(gpu_model *gm, const batch_dims &d, const block_saved &s, cudaStream_t stream)
{
    attention_dispatch_bwd(gm, token_rows(gm, d), d.n_samples, kCrossAttention, -1, s.cq, s.ck, s.cv, s.cattn, gm->d_t,
                           s.cattn_lse, gm->d_q, gm->d_ck, gm->d_cv, stream);
}
// ---- end of the attention dispatch -----------------------------------------------------------------------

// Block l's forward from its input (x2, y_ffn of block l - 1 or, for block 0 and when `recomputing`, the
// kept x_in) to its FFN output y_ffn, into gm->saved[l].
void block_forward(gpu_model *gm, const batch_dims &d, int l, bool recomputing, cudaStream_t stream)
{
    const int64_t N = d.n_tokens, L = d.n_text;
    const int B = d.n_samples, D = gm->dim, F = gm->ffn_dim, H = gm->num_heads, hd = gm->head_dim;
    const batch_tables &t = gm->tables_device;
    const float eps = gm->eps;
    const block_offsets &bo = gm->blocks[l];
    block_saved &s = gm->saved[l];
    // the weights for this block's work; a re-run (inside block l + 1's backward) is followed by block l's backward
    const gpu_bf16 *w = block_weights(gm, l, recomputing ? l - 1 : forward_next(gm, l), stream);
    float *mod[6];
    for (int c = 0; c < 6; ++c) mod[c] = chunk_of(s.modulation, c, d, D);

    // x_in = x2 + y_ffn e5 of the block before; h1 = LN(x_in) (1 + e1) + e0. A re-run starts from the kept
    // x_in: the same LayerNorm of the same bf16 rows as lnmod_residual_fwd's (lnmod.h)
    if (l == 0 || recomputing) {
        lnmod_fwd(s.x_in, N, D, t.token_start, B, mod[0], mod[1], eps, s.h1, s.ln1_mean, s.ln1_rstd, stream);
    } else {
        const block_saved &p = gm->saved[l - 1];
        lnmod_residual_fwd(p.x2, p.y_ffn, N, D, t.token_start, B, chunk_of(p.modulation, 5, d, D), mod[0], mod[1],
                           eps, s.x_in, s.h1, s.ln1_mean, s.ln1_rstd, stream);
    }

    // self-attention: q, k RMSNorm + 3D RoPE; each sample attends to its own tokens
    block_linear_fwd(gm, l, kSelfQ, w, s.h1, N, D, D, bo.self_q, s.q_pre, nullptr, stream);
    block_linear_fwd(gm, l, kSelfK, w, s.h1, N, D, D, bo.self_k, s.k_pre, nullptr, stream);
    block_linear_fwd(gm, l, kSelfV, w, s.h1, N, D, D, bo.self_v, s.v, nullptr, stream);
    fused_qk_norm_rope_fwd(s.q_pre, N, H, hd, w + bo.self_norm_q, eps, t.positions, s.q, s.q_rstd,
                           stream);
    fused_qk_norm_rope_fwd(s.k_pre, N, H, hd, w + bo.self_norm_k, eps, t.positions, s.k, s.k_rstd,
                           stream);
    self_attention_fwd(gm, d, l, s, stream);
    block_linear_fwd(gm, l, kSelfO, w, s.attn, N, D, D, bo.self_o, s.y_attn, nullptr, stream);

    // x1 = x_in + y_attn e2; n3 = norm3(x1) (affine LN as LN-modulate with shift = bias, scale = weight - 1)
    lnmod_residual_fwd(s.x_in, s.y_attn, N, D, t.token_start, B, mod[2], s.n3_shift, s.n3_scale, eps, s.x1, s.n3,
                       s.n3_mean, s.n3_rstd, stream);

    // cross-attention: each sample's tokens attend to its own text rows; q, k RMSNorm (no RoPE)
    block_linear_fwd(gm, l, kCrossQ, w, s.n3, N, D, D, bo.cross_q, s.cq_pre, nullptr, stream);
    fused_qk_norm_rope_fwd(s.cq_pre, N, H, hd, w + bo.cross_norm_q, eps, nullptr, s.cq, s.cq_rstd,
                           stream);
    if (L > 0) {
        linear_fwd(gm, w, gm->context, L, D, D, bo.cross_k, s.ck_pre, stream);
        fused_qk_norm_rope_fwd(s.ck_pre, L, H, hd, w + bo.cross_norm_k, eps, nullptr, s.ck, s.ck_rstd,
                               stream);
        linear_fwd(gm, w, gm->context, L, D, D, bo.cross_v, s.cv, stream);
    }
    cross_attention_fwd(gm, d, s, stream);
    block_linear_fwd(gm, l, kCrossO, w, s.cattn, N, D, D, bo.cross_o, s.y_cross, nullptr, stream);

    // x2 = x1 + y_cross (gate 1); h2 = LN(x2) (1 + e4) + e3
    lnmod_residual_fwd(s.x1, s.y_cross, N, D, t.token_start, B, gm->ones, mod[3], mod[4], eps, s.x2, s.h2,
                       s.ln2_mean, s.ln2_rstd, stream);

    // FFN: Linear, GELU-tanh (epilogue), Linear; its gated residual opens the next block
    block_linear_fwd(gm, l, kFfnIn, w, s.h2, N, D, F, bo.ffn_in, s.ffn_act, s.ffn_pre, stream);
    block_linear_fwd(gm, l, kFfnOut, w, s.ffn_act, N, F, D, bo.ffn_out, s.y_ffn, nullptr, stream);
}

// Embeddings, blocks and head; ends with the per-sample losses and, unless loss_only, the gradient of the
// prediction.
void forward(gpu_model *gm, const batch_dims &d, float grad_scale, bool loss_only, cudaStream_t stream)
{
    const int64_t N = d.n_tokens, L = d.n_text;
    const int B = d.n_samples, D = gm->dim;
    const batch_tables &t = gm->tables_device;
    const float eps = gm->eps;

    // inputs: x_t patchified (and x0, noise in the head's order for the loss), the text in bf16
    const sp_state &sp = gm->sp;
    if (sp.group)  // this member's rows of each sample: from token_first (sp_slice's device tables)
        misc_patchify_flow_rows(sp.latents, sp.noise, B, t.latent_start, t.token_start, sp.tables + B + 1,
                                t.latent_shape, t.sigma, d.n_latent_values, gm->in_dim, gm->patch_t, gm->patch_h,
                                gm->patch_w, gm->tokens_in, gm->x0_tokens, gm->noise_tokens, stream);
    else
        misc_patchify_flow(gm->latents, gm->noise, B, t.latent_start, t.token_start, t.latent_shape, t.sigma,
                           d.n_latent_values, gm->in_dim, gm->patch_t, gm->patch_h, gm->patch_w, gm->tokens_in,
                           gm->x0_tokens, gm->noise_tokens, stream);
    misc_f32_to_bf16(gm->text_f32, L * gm->text_dim, gm->text, stream);

    // embeddings: patches; text (Linear, GELU-tanh, Linear); time in fp32 (sinusoid, Linear, SiLU, Linear), projection
    const gpu_model_params &p = gm->params;
    gpu_bf16 *x_embedded = gm->num_layers > 0 ? gm->saved[0].x_in : gm->x_final;
    linear_fwd(gm, p.embedding_weights, gm->tokens_in, N, gm->patch_in, D, gm->patch, x_embedded, stream);
    if (L > 0) {
        linear_gelu_fwd(gm, p.embedding_weights, gm->text, L, gm->text_dim, D, gm->text_in, gm->text_pre, gm->text_act,
                        stream);
        linear_fwd(gm, p.embedding_weights, gm->text_act, L, D, D, gm->text_out, gm->context, stream);
    }
    const float *tw = p.time_weights(p.context, 0, stream);
    misc_linear_f32_fwd(t.sinusoid, B, gm->freq_dim, D, time_weight(gm, tw, gm->time_in.weight),
                        time_weight(gm, tw, gm->time_in.bias), gm->time_pre, stream);
    misc_silu_f32_fwd(gm->time_pre, (int64_t)B * D, gm->time_act, stream);
    misc_linear_f32_fwd(gm->time_act, B, D, D, time_weight(gm, tw, gm->time_out.weight),
                        time_weight(gm, tw, gm->time_out.bias), gm->time_emb, stream);
    misc_silu_f32_fwd(gm->time_emb, (int64_t)B * D, gm->time_silu, stream);
    misc_linear_f32_fwd(gm->time_silu, B, D, 6 * D, time_weight(gm, tw, gm->time_projection.weight),
                        time_weight(gm, tw, gm->time_projection.bias), gm->e0, stream);
    for (int l = 0; l < gm->num_layers; ++l) {
        block_saved &s = gm->saved[l];
        misc_block_modulation(p.block_modulation[l], gm->e0, B, D, s.modulation, stream);
        misc_affine_as_modulation(p.block_norm3[l], p.block_norm3[l] + D, B, D, s.n3_shift, s.n3_scale, stream);
    }
    misc_head_modulation(p.head_modulation, gm->time_emb, B, D, gm->head_shift, gm->head_scale, stream);
    misc_fill_f32(gm->ones, (int64_t)B * D, 1.0f, stream);

    for (int l = 0; l < gm->num_layers; ++l) block_forward(gm, d, l, false, stream);

    // head: x_final = x2 + y_ffn e5 of the last block; LN modulated by head.modulation + e; Linear
    if (gm->num_layers > 0) {
        const block_saved &p = gm->saved[gm->num_layers - 1];
        lnmod_residual_fwd(p.x2, p.y_ffn, N, D, t.token_start, B, chunk_of(p.modulation, 5, d, D), gm->head_shift,
                           gm->head_scale, eps, gm->x_final, gm->head_h, gm->head_mean, gm->head_rstd, stream);
    } else {
        lnmod_fwd(gm->x_final, N, D, t.token_start, B, gm->head_shift, gm->head_scale, eps, gm->head_h, gm->head_mean,
                  gm->head_rstd, stream);
    }
    linear_fwd(gm, p.head_weights, gm->head_h, N, D, gm->patch_out, gm->head, gm->pred, stream);
    if (sp.group)  // this member's part of each sample's mean: divided by the whole sample's count (whole_pred)
        fused_flow_loss_part_bf16(gm->pred, gm->x0_tokens, gm->noise_tokens, t.pred_start, sp.tables + 2 * B + 1, B,
                                  grad_scale, gm->sample_loss, loss_only ? nullptr : gm->d_pred, gm->scratch, stream);
    else
        fused_flow_loss_bf16(gm->pred, gm->x0_tokens, gm->noise_tokens, t.pred_start, B, grad_scale, gm->sample_loss,
                             loss_only ? nullptr : gm->d_pred, gm->scratch, stream);
}

// Tell the caller that gradient values [first, first + count) are final for this call (gpu_model_set_grads_ready).
void grads_ready(const gpu_model *gm, int64_t first, int64_t count, cudaStream_t stream)
{
    if (gm->grads_ready && count > 0) gm->grads_ready(gm->grads_ready_context, first, count, stream);
}

// The ranges the backward reports after the blocks': the head's (the values after the last block), then the
// embeddings' (before the first).
void head_and_embedding_grads_ready(const gpu_model *gm, cudaStream_t stream)
{
    const int64_t blocks_first = gm->num_layers > 0 ? gm->blocks[0].first : gm->n_weights;
    const int64_t blocks_end = gm->num_layers > 0 ? gm->blocks[gm->num_layers - 1].end : gm->n_weights;
    grads_ready(gm, blocks_end, gm->n_weights - blocks_end, stream);
    grads_ready(gm, 0, blocks_first, stream);
}

// Backward of everything `forward` did, from d_pred; parameter gradients are added into the params' gradients
// (a block's: those its block_grads gave), and the caller is told as each block's range, then the head's and
// the embeddings', is final.
void backward(gpu_model *gm, const batch_dims &d, cudaStream_t stream)
{
    const int64_t N = d.n_tokens, L = d.n_text;
    const int B = d.n_samples, D = gm->dim, F = gm->ffn_dim, H = gm->num_heads, hd = gm->head_dim;
    const batch_tables &t = gm->tables_device;
    const gpu_model_params &params = gm->params;
    void *scratch = gm->scratch;

    // head; then the residual of the last block's FFN, which the head's LN opened
    linear_bwd(gm, params.head_weights, params.head_grads, gm->head_h, gm->d_pred, N, D, gm->patch_out, gm->head,
               nullptr, gm->d_h, 0, stream);
    if (gm->num_layers > 0) {
        block_saved &p = gm->saved[gm->num_layers - 1];
        lnmod_residual_bwd(gm->x_final, p.y_ffn, gm->d_h, nullptr, N, D, t.token_start, B,
                           chunk_of(p.modulation, 5, d, D), gm->head_scale, gm->head_mean, gm->head_rstd, gm->d_x,
                           gm->d_y, gm->d_head_shift, gm->d_head_scale, chunk_of(p.d_modulation, 5, d, D), scratch,
                           stream);
    } else {
        lnmod_bwd(gm->x_final, gm->d_h, N, D, t.token_start, B, gm->head_scale, gm->head_mean, gm->head_rstd, gm->d_x,
                  gm->d_head_shift, gm->d_head_scale, scratch, stream);
    }
    misc_head_modulation_bwd(gm->d_head_shift, gm->d_head_scale, B, D, params.head_grads + gm->head_modulation,
                             gm->d_time_emb, stream);
    if (L > 0) CUDA_CHECK(cudaMemsetAsync(gm->d_context, 0, (size_t)(L * D) * sizeof(float), stream));
    CUDA_CHECK(cudaMemsetAsync(gm->d_e0, 0, (size_t)B * 6 * D * sizeof(float), stream));

    // blocks, last to first. On entry d_x = dL/dx2 and d_y = dL/dy_ffn of block l.
    for (int l = gm->num_layers - 1; l >= 0; --l) {
        const block_offsets &bo = gm->blocks[l];
        block_saved &s = gm->saved[l];
        // this block's weights and the gradients its backward adds into, until grads_ready reports them
        const gpu_bf16 *w = block_weights(gm, l, l - 1, stream);
        float *g = params.block_grads(params.context, l, stream);
        float *mod[6], *d_mod[6];
        for (int c = 0; c < 6; ++c) {
            mod[c] = chunk_of(s.modulation, c, d, D);
            d_mod[c] = chunk_of(s.d_modulation, c, d, D);
        }

        // FFN: the second Linear's dx comes out as the gradient of the GELU's input (DGELU epilogue)
        block_linear_bwd(gm, l, kFfnOut, w, g, s.ffn_act, gm->d_y, N, F, D, bo.ffn_out, s.ffn_pre, gm->d_ffn, 0, stream);
        block_linear_bwd(gm, l, kFfnIn, w, g, s.h2, gm->d_ffn, N, D, F, bo.ffn_in, nullptr, gm->d_h, 0, stream);
        // x2 = x1 + y_cross, h2 = LN-modulate(x2): d_x becomes dL/dx1, d_y dL/dy_cross
        lnmod_residual_bwd(s.x2, s.y_cross, gm->d_h, gm->d_x, N, D, t.token_start, B, gm->ones, mod[4], s.ln2_mean,
                           s.ln2_rstd, gm->d_x, gm->d_y, d_mod[3], d_mod[4], gm->d_unused_gate, scratch, stream);

        // cross-attention
        block_linear_bwd(gm, l, kCrossO, w, g, s.cattn, gm->d_y, N, D, D, bo.cross_o, nullptr, gm->d_t, 0, stream);
        cross_attention_bwd(gm, d, s, stream);
        if (L > 0) {
            linear_bwd(gm, w, g, gm->context, gm->d_cv, L, D, D, bo.cross_v, nullptr, gm->d_ctx_part, 0,
                             stream);
            fused_qk_norm_rope_bwd(s.ck_pre, gm->d_ck, L, H, hd, w + bo.cross_norm_k, nullptr, s.ck_rstd,
                                   gm->d_ck, g + bo.cross_norm_k, scratch, stream);
            linear_bwd(gm, w, g, gm->context, gm->d_ck, L, D, D, bo.cross_k, nullptr, gm->d_ctx_part, 1,
                             stream);
            misc_accumulate_bf16(gm->d_ctx_part, L * D, gm->d_context, stream);
        }
        fused_qk_norm_rope_bwd(s.cq_pre, gm->d_q, N, H, hd, w + bo.cross_norm_q, nullptr, s.cq_rstd, gm->d_q,
                               g + bo.cross_norm_q, scratch, stream);
        block_linear_bwd(gm, l, kCrossQ, w, g, s.n3, gm->d_q, N, D, D, bo.cross_q, nullptr, gm->d_h, 0, stream);
        // x1 = x_in + y_attn e2, n3 = norm3(x1): d_x becomes dL/dx_in, d_y dL/dy_attn; norm3's weight and
        // bias gradients are the per-sample dscale and dshift summed over the samples
        lnmod_residual_bwd(s.x1, s.y_attn, gm->d_h, gm->d_x, N, D, t.token_start, B, mod[2], s.n3_scale, s.n3_mean,
                           s.n3_rstd, gm->d_x, gm->d_y, gm->d_n3_shift, gm->d_n3_scale, d_mod[2], scratch, stream);
        misc_sum_samples_into(gm->d_n3_scale, B, D, g + bo.norm3_weight, stream);
        misc_sum_samples_into(gm->d_n3_shift, B, D, g + bo.norm3_bias, stream);

        // self-attention
        block_linear_bwd(gm, l, kSelfO, w, g, s.attn, gm->d_y, N, D, D, bo.self_o, nullptr, gm->d_t, 0, stream);
        self_attention_bwd(gm, d, l, s, stream);
        fused_qk_norm_rope_bwd(s.q_pre, gm->d_q, N, H, hd, w + bo.self_norm_q, t.positions, s.q_rstd, gm->d_q,
                               g + bo.self_norm_q, scratch, stream);
        fused_qk_norm_rope_bwd(s.k_pre, gm->d_k, N, H, hd, w + bo.self_norm_k, t.positions, s.k_rstd, gm->d_k,
                               g + bo.self_norm_k, scratch, stream);
        block_linear_bwd(gm, l, kSelfQ, w, g, s.h1, gm->d_q, N, D, D, bo.self_q, nullptr, gm->d_h, 0, stream);
        block_linear_bwd(gm, l, kSelfK, w, g, s.h1, gm->d_k, N, D, D, bo.self_k, nullptr, gm->d_h, 1, stream);
        block_linear_bwd(gm, l, kSelfV, w, g, s.h1, gm->d_v, N, D, D, bo.self_v, nullptr, gm->d_h, 1, stream);

        // h1 = LN-modulate(x_in): with l > 0, x_in = x2 + y_ffn e5 of block l - 1, whose gradients come out
        // here. With block recomputation block l - 1's activations are rebuilt first: this needs its y_ffn,
        // and its own backward comes next. Block l's statistics, modulation and x_in are kept; d_* untouched.
        if (l > 0) {
            if (gm->recompute == GPU_RECOMPUTE_BLOCK) block_forward(gm, d, l - 1, true, stream);
            block_saved &p = gm->saved[l - 1];
            lnmod_residual_bwd(s.x_in, p.y_ffn, gm->d_h, gm->d_x, N, D, t.token_start, B,
                               chunk_of(p.modulation, 5, d, D), mod[1], s.ln1_mean, s.ln1_rstd, gm->d_x, gm->d_y,
                               d_mod[0], d_mod[1], chunk_of(p.d_modulation, 5, d, D), scratch, stream);
        } else {
            lnmod_bwd(s.x_in, gm->d_h, N, D, t.token_start, B, mod[1], s.ln1_mean, s.ln1_rstd, gm->d_t, d_mod[0],
                      d_mod[1], scratch, stream);
            misc_add_bf16(gm->d_x, gm->d_t, N * D, gm->d_x, stream);
        }
        // block l's modulation gradient is complete now (chunk 5 came from block l + 1 or the head), and with
        // it every gradient of the block's parameters
        misc_block_modulation_bwd(s.d_modulation, B, D, g + bo.modulation, gm->d_e0, stream);
        grads_ready(gm, bo.first, bo.end - bo.first, stream);
    }

    // embeddings: d_x is now the gradient of the patch embedding's output
    const gpu_bf16 *embedding_w = params.embedding_weights;
    float *grads = params.embedding_grads(params.context, stream);
    linear_bwd(gm, embedding_w, grads, gm->tokens_in, gm->d_x, N, gm->patch_in, D, gm->patch, nullptr, nullptr, 0,
               stream);
    if (L > 0) {
        misc_f32_to_bf16(gm->d_context, L * D, gm->d_context_bf16, stream);
        linear_bwd(gm, embedding_w, grads, gm->text_act, gm->d_context_bf16, L, D, D, gm->text_out, gm->text_pre,
                   gm->d_text_pre, 0, stream);
        linear_bwd(gm, embedding_w, grads, gm->text, gm->d_text_pre, L, gm->text_dim, D, gm->text_in, nullptr, nullptr,
                   0, stream);
    }

    // time path (fp32): e0 (its gradient summed over the blocks above) feeds every block's modulation; e
    // feeds the head's and the projection
    const float *tw = params.time_weights(params.context, 1, stream);
    misc_linear_f32_bwd(gm->time_silu, gm->d_e0, B, D, 6 * D, time_weight(gm, tw, gm->time_projection.weight),
                        gm->d_time_b, grads + gm->time_projection.weight, grads + gm->time_projection.bias, stream);
    misc_silu_f32_bwd(gm->time_emb, gm->d_time_b, (int64_t)B * D, gm->d_time_b, stream);
    misc_accumulate_f32(gm->d_time_b, (int64_t)B * D, gm->d_time_emb, stream);
    misc_linear_f32_bwd(gm->time_act, gm->d_time_emb, B, D, D, time_weight(gm, tw, gm->time_out.weight), gm->d_time_b,
                        grads + gm->time_out.weight, grads + gm->time_out.bias, stream);
    misc_silu_f32_bwd(gm->time_pre, gm->d_time_b, (int64_t)B * D, gm->d_time_b, stream);
    misc_linear_f32_bwd(t.sinusoid, gm->d_time_b, B, gm->freq_dim, D, time_weight(gm, tw, gm->time_in.weight), nullptr,
                        grads + gm->time_in.weight, grads + gm->time_in.bias, stream);
    head_and_embedding_grads_ready(gm, stream);
}

} // namespace

// ---- public API ------------------------------------------------------------------------------------

namespace {

// A gpu_model with its dims, capacity, parameter offsets and workspace size set, nothing allocated on the device.
gpu_model *describe_family(const model *m, int64_t max_tokens, int max_samples, int64_t max_text,
                           gpu_recompute recompute);

gpu_model *describe(const model *m, int64_t max_tokens, int max_samples, int64_t max_text, gpu_recompute recompute)
{
    if (m->family != FAMILY_WAN) return describe_family(m, max_tokens, max_samples, max_text, recompute);
    check_supported(m);
    ALDIT_CHECK(max_tokens > 0 && max_samples > 0 && max_samples <= 65535 && max_text >= 0,
                "gpu model: capacity of %lld tokens, %d samples (at most 65535), %lld text rows must be positive",
                (long long)max_tokens, max_samples, (long long)max_text);
    gpu_model *gm = static_cast<gpu_model *>(xcalloc(1, sizeof(gpu_model)));
    gm->dim = m->dim;
    gm->ffn_dim = m->ffn_dim;
    gm->num_heads = m->num_heads;
    gm->head_dim = m->head_dim;
    gm->num_layers = m->num_layers;
    gm->in_dim = m->in_dim;
    gm->patch_t = m->patch_t;
    gm->patch_h = m->patch_h;
    gm->patch_w = m->patch_w;
    gm->patch_in = m->patch_in;
    gm->patch_out = m->patch_out;
    gm->text_len = m->text_len;
    gm->text_dim = m->text_dim;
    gm->freq_dim = m->freq_dim;
    gm->eps = m->eps;
    gm->n_weights = m->n_weights;
    gm->max_tokens = max_tokens;
    gm->max_samples = max_samples;
    gm->max_text = max_text > 0 ? max_text : (int64_t)max_samples * m->text_len;
    ALDIT_CHECK(recompute == GPU_RECOMPUTE_NONE || recompute == GPU_RECOMPUTE_BLOCK,
                "gpu model: unknown recomputation mode %d", (int)recompute);
    gm->recompute = recompute;

    const model_layout &layout = m->layout;
    gm->layout = layout;
    gm->patch = layout.patch;
    gm->text_in = layout.text_in;
    gm->text_out = layout.text_out;
    gm->time_in = layout.time_in;
    gm->time_out = layout.time_out;
    gm->time_projection = layout.time_projection;
    gm->time_first = layout.time_in.weight;
    gm->head_first = layout.blocks_offset + (int64_t)m->num_layers * layout.block_stride;
    gm->head = {layout.head.weight - gm->head_first, layout.head.bias - gm->head_first};
    gm->head_modulation = layout.head_modulation - gm->head_first;
    // The parameter sets the model reads in pieces (gpu_model_params): the time path one range at the end of the
    // embeddings, norm3's bias right after its weight, the head after the last block.
    const int64_t D = m->dim;
    ALDIT_CHECK(layout.time_in.bias > gm->time_first && layout.time_out.weight > gm->time_first &&
                layout.time_projection.weight > gm->time_first &&
                layout.time_projection.bias + 6 * D == layout.blocks_offset &&
                layout.block.norm3_bias == layout.block.norm3_weight + D && gm->head_modulation >= 0 &&
                gm->head.weight >= 0 && gm->head.bias >= 0,
                "gpu model: the parameter table's order is not the one the GPU model reads its parameters in");
    gm->blocks = static_cast<block_offsets *>(xcalloc((size_t)(m->num_layers > 0 ? m->num_layers : 1),
                                                      sizeof(block_offsets)));
    // Each block's parameters lie back to back, one stride apart; the gradient all-reduce relies on it
    // (gpu_model_set_grads_ready). Its tensors' offsets are from its first value (block_weights, block_grads).
    for (int l = 0; l < m->num_layers; ++l) {
        block_offsets &bo = gm->blocks[l];
        static_cast<layout_block &>(bo) = layout.block;
        bo.first = layout.blocks_offset + (int64_t)l * layout.block_stride;
        bo.end = bo.first + layout.block_stride;
    }
    gm->saved = static_cast<block_saved *>(xcalloc((size_t)(m->num_layers > 0 ? m->num_layers : 1),
                                                   sizeof(block_saved)));
    // The arena is the layout's memory formula for this capacity (model/layout.h): what the balancer plans with.
    const int64_t device_scratch = gpu_model_device_scratch_bytes(m);
    gm->scratch_bytes = (size_t)layout_gpu_scratch_bytes(&layout, device_scratch, gm->max_tokens, gm->max_samples);
    ALDIT_CHECK(scratch_bytes_for(gm, gm->max_tokens, gm->max_text, gm->max_samples) <= gm->scratch_bytes,
                "gpu model: the backward ops ask for %zu bytes of scratch, more than the %zu of the memory formula",
                scratch_bytes_for(gm, gm->max_tokens, gm->max_text, gm->max_samples), gm->scratch_bytes);
    const layout_memory memory = model_layout_memory(&layout, LAYOUT_BACKEND_GPU,
                                                     recompute == GPU_RECOMPUTE_BLOCK ? RECOMPUTE_BLOCK : RECOMPUTE_NONE,
                                                     device_scratch);
    gm->arena_bytes = (size_t)layout_memory_bytes(&memory, gm->max_tokens, gm->max_samples, gm->max_text);
    carver count = {nullptr, 0};
    layout_arena(gm, count);
    ALDIT_CHECK(count.used <= gm->arena_bytes, "gpu model: the workspace carves %zu bytes, more than the %zu of the "
                "memory formula (model/layout.c and layout_arena disagree)", count.used, gm->arena_bytes);
    return gm;
}

// Another family's model (cuda/mmdit_gpu.h): its block code holds the workspace; the gpu_model keeps what every
// family shares (dims, capacity, the parameter buffers and source, the contexts).
gpu_model *describe_family(const model *m, int64_t max_tokens, int max_samples, int64_t max_text,
                           gpu_recompute recompute)
{
    gpu_model *gm = static_cast<gpu_model *>(xcalloc(1, sizeof(gpu_model)));
    gm->family = mmdit_gpu_describe(m, max_tokens, max_samples, max_text, recompute, gpu_model_device_scratch_bytes(m),
                                    &gm->arena_bytes);
    gm->dim = m->dim;
    gm->num_heads = m->num_heads;
    gm->head_dim = m->head_dim;
    gm->num_layers = m->num_layers;
    gm->n_weights = m->n_weights;
    gm->max_tokens = max_tokens;
    gm->max_samples = max_samples;
    gm->recompute = recompute;
    const model_layout &layout = m->layout;
    gm->time_first = layout.gpu_time_first;
    gm->head_first = layout.blocks_offset + (int64_t)m->num_layers * layout.block_stride;
    const size_t layers = (size_t)(m->num_layers > 0 ? m->num_layers : 1);
    gm->blocks = static_cast<block_offsets *>(xcalloc(layers, sizeof(block_offsets)));
    for (int l = 0; l < m->num_layers; ++l) {
        gm->blocks[l].first = layout.blocks_offset + (int64_t)l * layout.block_stride;
        gm->blocks[l].end = gm->blocks[l].first + layout.block_stride;
    }
    gm->saved = static_cast<block_saved *>(xcalloc(layers, sizeof(block_saved)));
    return gm;
}

// What the family's block code borrows from the model for a call.
mmdit_gpu_env family_env(const gpu_model *gm)
{
    return {gm->gemm, gm->cudnn, gm->use_cudnn, gm->cudnn_min_tokens, &gm->params, gm->grads_ready,
            gm->grads_ready_context, nullptr};
}

} // namespace

int64_t gpu_model_device_scratch_bytes(const model *host_model)
{
    // At this many rows every backward op's grid is as large as the GPU keeps resident: what remains of its
    // workspace past the formula's per-token and per-sample terms is the device's constant.
    const int64_t huge = (int64_t)1 << 40, D = host_model->dim;
    const int64_t parts[] = {
        (int64_t)lnmod_residual_bwd_workspace_bytes(huge, (int)D, 1) - 12 * D,
        (int64_t)lnmod_bwd_workspace_bytes(huge, (int)D, 1) - 8 * D,
        (int64_t)fused_qk_norm_rope_bwd_workspace_bytes(huge, (int)D),
        4 * 2048,  // fused_flow_loss: at most 2048 + B - 1 partial sums
    };
    int64_t largest = 0;
    for (int64_t part : parts) largest = part > largest ? part : largest;
    return largest;
}

size_t gpu_model_workspace_bytes_with_recompute(const model *host_model, int64_t max_tokens, int max_samples,
                                                int64_t max_text, gpu_recompute recompute)
{
    gpu_model *gm = describe(host_model, max_tokens, max_samples, max_text, recompute);
    const size_t bytes = gm->arena_bytes;
    mmdit_gpu_free(gm->family);
    free(gm->blocks);
    free(gm->saved);
    free(gm);
    return bytes;
}

size_t gpu_model_workspace_bytes(const model *host_model, int64_t max_tokens, int max_samples, int64_t max_text)
{
    return gpu_model_workspace_bytes_with_recompute(host_model, max_tokens, max_samples, max_text, GPU_RECOMPUTE_NONE);
}

namespace {

// The model's GEMM and cuDNN contexts, on the current GPU (the model's).
void make_contexts(gpu_model *gm, int gemm_autotune, int attention_autotune)
{
    gm->gemm = gemm_create(gemm_autotune, 1);
#ifdef HAVE_CUDNN
    gm->cudnn = attention_cudnn_create(attention_autotune, 0);
#else
    (void)attention_autotune;
#endif
}

void free_contexts(gpu_model *gm)
{
    gemm_free(gm->gemm);
    gm->gemm = nullptr;
#ifdef HAVE_CUDNN
    attention_cudnn_free(gm->cudnn);
    gm->cudnn = nullptr;
#endif
}

} // namespace

namespace {

// The default parameter source: the model's own whole buffers.
const gpu_bf16 *own_block_weights(void *context, int layer, int next, cudaStream_t stream)
{
    (void)next;
    (void)stream;
    const gpu_model *gm = static_cast<const gpu_model *>(context);
    return gm->working + gm->blocks[layer].first;
}

float *own_block_grads(void *context, int layer, cudaStream_t stream)
{
    (void)stream;
    const gpu_model *gm = static_cast<const gpu_model *>(context);
    return gm->grads + gm->blocks[layer].first;
}

float *own_embedding_grads(void *context, cudaStream_t stream)
{
    (void)stream;
    return static_cast<const gpu_model *>(context)->grads;
}

const float *own_time_weights(void *context, int backward, cudaStream_t stream)
{
    (void)backward;
    (void)stream;
    const gpu_model *gm = static_cast<const gpu_model *>(context);
    return gm->master + gm->time_first;
}

// Allocate the whole master, bf16 and gradient buffers and point the parameters at them.
void own_params(gpu_model *gm)
{
    const size_t n = (size_t)gm->n_weights, layers = (size_t)(gm->num_layers > 0 ? gm->num_layers : 1);
    CUDA_CHECK(cudaMalloc(&gm->master, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&gm->grads, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&gm->working, n * sizeof(gpu_bf16)));
    CUDA_CHECK(cudaMemset(gm->master, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(gm->grads, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(gm->working, 0, n * sizeof(gpu_bf16)));
    gm->own_modulation = static_cast<const float **>(xcalloc(layers, sizeof(float *)));
    gm->own_norm3 = static_cast<const float **>(xcalloc(layers, sizeof(float *)));
    for (int l = 0; l < gm->num_layers; ++l) {
        gm->own_modulation[l] = gm->master + gm->blocks[l].first + gm->blocks[l].modulation;
        gm->own_norm3[l] = gm->master + gm->blocks[l].first + gm->blocks[l].norm3_weight;
    }
    gpu_model_params &p = gm->params;
    p.embedding_weights = gm->working;
    p.head_weights = gm->working + gm->head_first;
    p.head_grads = gm->grads + gm->head_first;
    p.head_modulation = gm->master + gm->head_first + gm->head_modulation;
    p.block_modulation = gm->own_modulation;
    p.block_norm3 = gm->own_norm3;
    p.block_weights = own_block_weights;
    p.block_grads = own_block_grads;
    p.embedding_grads = own_embedding_grads;
    p.time_weights = own_time_weights;
    p.context = gm;
}

// The model's workspace, staging and contexts (both ways of creating it).
gpu_model *create(const model *m, int64_t max_tokens, int max_samples, int64_t max_text, gpu_recompute recompute,
                  bool with_params)
{
    gpu_model *gm = describe(m, max_tokens, max_samples, max_text, recompute);
    if (with_params) own_params(gm);
    if (gm->family) {
        mmdit_gpu_allocate(gm->family);
        make_contexts(gm, 0, 0);
        gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 0);
        return gm;
    }
    CUDA_CHECK(cudaMalloc(&gm->arena, gm->arena_bytes));
    // Poisoned (all bits set is NaN in bf16 and fp32): a value read before it is written shows up as NaN.
    CUDA_CHECK(cudaMemset(gm->arena, 0xff, gm->arena_bytes));
    carver assign = {gm->arena, 0};
    layout_arena(gm, assign);

    carver tables = {nullptr, 0};
    layout_tables(tables, gm->tables_host, gm->max_tokens, gm->max_samples, gm->freq_dim);
    gm->tables_bytes = tables.used;
    gm->tables_pinned = pinned_alloc<char>((int64_t)gm->tables_bytes);
    tables.base = gm->tables_pinned;
    tables.used = 0;
    layout_tables(tables, gm->tables_host, gm->max_tokens, gm->max_samples, gm->freq_dim);
    gm->latents_pinned = pinned_alloc<float>(gm->max_tokens * gm->patch_in);
    gm->noise_pinned = pinned_alloc<float>(gm->max_tokens * gm->patch_in);
    gm->text_pinned = pinned_alloc<float>(gm->max_text * gm->text_dim);
    gm->loss_pinned = pinned_alloc<float>(gm->max_samples);
    gm->grid_frames = static_cast<int32_t *>(xmalloc(3 * (size_t)max_samples * sizeof(int32_t)));
    gm->grid_height = gm->grid_frames + max_samples;
    gm->grid_width = gm->grid_frames + 2 * (size_t)max_samples;
    gm->timesteps_host = static_cast<float *>(xmalloc((size_t)max_samples * sizeof(float)));
    make_contexts(gm, 0, 0);
    gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 0);
    return gm;
}

} // namespace

gpu_model *gpu_model_create_with_recompute(const model *host_model, int64_t max_tokens, int max_samples,
                                           int64_t max_text, gpu_recompute recompute)
{
    return create(host_model, max_tokens, max_samples, max_text, recompute, true);
}

gpu_model *gpu_model_create_without_params(const model *host_model, int64_t max_tokens, int max_samples,
                                           int64_t max_text, gpu_recompute recompute)
{
    return create(host_model, max_tokens, max_samples, max_text, recompute, false);
}

void gpu_model_set_params(gpu_model *gm, const gpu_model_params *params)
{
    ALDIT_CHECK(!gm->master, "gpu model: gpu_model_set_params on a model that holds its own parameters");
    // the fp32 reads of Wan's head and blocks (head.modulation, each block's modulation and norm3); the other family
    // reads none of its weights in fp32 but the time path (layout's gpu_head_fp32 and gpu_block_fp32: count 0)
    const bool fp32_reads = gm->family == nullptr;
    ALDIT_CHECK(params->embedding_weights && params->head_weights && params->head_grads && params->block_weights &&
                params->block_grads && params->embedding_grads && params->time_weights &&
                (!fp32_reads || (params->head_modulation &&
                                 (gm->num_layers == 0 || (params->block_modulation && params->block_norm3)))),
                "gpu model: gpu_model_set_params needs every pointer and every function");
    gm->params = *params;
}

gpu_model *gpu_model_create(const model *host_model, int64_t max_tokens, int max_samples, int64_t max_text)
{
    return gpu_model_create_with_recompute(host_model, max_tokens, max_samples, max_text, GPU_RECOMPUTE_NONE);
}

void gpu_model_set_seqpar(gpu_model *gm, const seqpar_gpu *groups)
{
    gm->sp.groups = groups;
}

void gpu_model_set_grads_ready(gpu_model *gm, gpu_grads_ready_fn ready, void *context)
{
    gm->grads_ready = ready;
    gm->grads_ready_context = context;
}

void gpu_model_grads_ready_all(const gpu_model *gm, cudaStream_t stream)
{
    if (gm->family) {
        const mmdit_gpu_env env = family_env(gm);
        mmdit_gpu_grads_ready_all(gm->family, &env, stream);
        return;
    }
    // the calls block_forward and backward make, in their order
    const gpu_model_params &p = gm->params;
    p.time_weights(p.context, 0, stream);
    for (int l = 0; l < gm->num_layers; ++l) block_weights(gm, l, forward_next(gm, l), stream);
    for (int l = gm->num_layers - 1; l >= 0; --l) {
        block_weights(gm, l, l - 1, stream);
        p.block_grads(p.context, l, stream);
        if (l > 0 && gm->recompute == GPU_RECOMPUTE_BLOCK) block_weights(gm, l - 1, l - 2, stream);
        grads_ready(gm, gm->blocks[l].first, gm->blocks[l].end - gm->blocks[l].first, stream);
    }
    p.embedding_grads(p.context, stream);
    p.time_weights(p.context, 1, stream);
    head_and_embedding_grads_ready(gm, stream);
}

int gpu_model_set_attention(gpu_model *gm, gpu_attention_choice choice, int64_t min_cudnn_tokens)
{
    ALDIT_CHECK(min_cudnn_tokens >= 0, "gpu model: min_cudnn_tokens %lld is negative", (long long)min_cudnn_tokens);
    gm->cudnn_min_tokens = min_cudnn_tokens > 0 ? min_cudnn_tokens : GPU_ATTENTION_CUDNN_MIN_TOKENS;
    gm->use_cudnn = 0;
#ifdef HAVE_CUDNN
    if (choice != GPU_ATTENTION_OWN) gm->use_cudnn = attention_cudnn_available(gm->cudnn, gm->num_heads, gm->head_dim);
    if (choice == GPU_ATTENTION_CUDNN && !gm->use_cudnn)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "[train] attention = cudnn, but cuDNN attention is not available for %d "
                         "heads of head_dim %d on this GPU (the warning above says why); use auto or own",
                         gm->num_heads, gm->head_dim);
#else
    if (choice == GPU_ATTENTION_CUDNN)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "[train] attention = cudnn, but aldit was built without cuDNN (configure "
                         "--with-cudnn); use auto or own");
#endif
    return gm->use_cudnn;
}

void gpu_model_setup_stats(const gpu_model *gm, int64_t *plans_built, double *seconds)
{
#ifdef HAVE_CUDNN
    attention_cudnn_setup_stats(gm->cudnn, plans_built, seconds);
#else
    (void)gm;
    *plans_built = 0;
    *seconds = 0.0;
#endif
}

#ifdef HAVE_CUDNN
namespace {
// Sorts v[0..n) longest first and keeps each value once; returns how many remain.
int64_t distinct_longest_first(int64_t *v, int64_t n)
{
    qsort(v, (size_t)n, sizeof(int64_t), [](const void *a, const void *b) {
        const int64_t x = *static_cast<const int64_t *>(a), y = *static_cast<const int64_t *>(b);
        return (x < y) - (x > y);
    });
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i)
        if (kept == 0 || v[i] != v[kept - 1]) v[kept++] = v[i];
    return kept;
}

// The plans of one length: the joint family's self-attention on whole tiles; Wan's self-attention at the length and
// on whole tiles (the last sample of a micro-batch runs padded, the others not) and its cross-attention to the
// text_len caption rows where the sample's captions are that long (sample_on_cudnn). `has_text` is 1 when it is.
int prepare_length(gpu_model *gm, int64_t rows, int has_text)
{
    const int64_t padded = attention_cudnn_padded_rows(rows);
    if (gm->family) return attention_cudnn_prepare(gm->cudnn, padded, padded, gm->num_heads, gm->head_dim);
    int built = attention_cudnn_prepare(gm->cudnn, rows, rows, gm->num_heads, gm->head_dim);
    if (padded != rows) built += attention_cudnn_prepare(gm->cudnn, padded, padded, gm->num_heads, gm->head_dim);
    if (has_text) built += attention_cudnn_prepare(gm->cudnn, rows, gm->text_len, gm->num_heads, gm->head_dim);
    if (gm->fp8 && gm->fp8->attention) {  // [train] fp8_attention: its forward (and backward) at the same rows
        const int backward = gm->fp8->attention_backward;
        built += attention_fp8_prepare(gm->fp8->attention, ATTENTION_FP8_ROWS, rows, gm->num_heads, gm->head_dim,
                                       backward);
        if (padded != rows)
            built += attention_fp8_prepare(gm->fp8->attention, ATTENTION_FP8_ROWS, padded, gm->num_heads, gm->head_dim,
                                           backward);
    }
    return built;
}
}  // namespace
#endif

int64_t gpu_model_prepare(gpu_model *gm, const int32_t *tokens, const int32_t *text_rows, int64_t n)
{
#ifdef HAVE_CUDNN
    if (!gm->use_cudnn || !gm->cudnn || n <= 0) return 0;
    // a length's key: its rows (the joint family's on whole tiles, the only shape it runs, so that lengths sharing
    // tiles take one place in the budget), times 2, plus 1 where a Wan sample of it has full-length captions
    // (cross-attention); longest first, a length's key with captions before the one without, which it covers
    int64_t *keys = static_cast<int64_t *>(xmalloc((size_t)n * sizeof(int64_t)));
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t joint = (int64_t)tokens[i] + text_rows[i];
        if ((gm->family ? joint : tokens[i]) < gm->cudnn_min_tokens) continue;
        keys[kept++] = gm->family ? 2 * attention_cudnn_padded_rows(joint)
                                  : 2 * (int64_t)tokens[i] + (text_rows[i] == gm->text_len);
    }
    kept = distinct_longest_first(keys, kept);
    const int per_length = gm->family ? 2 : 6;   // bf16 plans (forward and backward) a length may take (FP8
                                                 // attention's, at most 4, have slots of their own)
    int64_t built = 0, planned = 0;
    for (int64_t i = 0; i < kept && planned + per_length <= ATTENTION_CUDNN_PLAN_SLOTS / 2; ++i) {
        if (i > 0 && keys[i] / 2 == keys[i - 1] / 2) continue;
        planned += per_length;
        built += prepare_length(gm, keys[i] / 2, (int)(keys[i] % 2));
    }
    free(keys);
    return built;
#else
    (void)gm, (void)tokens, (void)text_rows, (void)n;
    return 0;
#endif
}

double gpu_model_enqueue_seconds(const gpu_model *gm)
{
    if (gm->family) return mmdit_gpu_enqueue_seconds(gm->family);
    return gm->enqueue_seconds;
}

void gpu_model_set_autotune(gpu_model *gm, int gemm_autotune, int attention_autotune)
{
    free_contexts(gm);
    make_contexts(gm, gemm_autotune, attention_autotune);
}

struct gpu_model_contexts {
    gemm_context *gemm;
    struct attention_cudnn *cudnn;
};

gpu_model_contexts *gpu_model_take_contexts(gpu_model *gm)
{
    gpu_model_contexts *contexts = static_cast<gpu_model_contexts *>(xmalloc(sizeof *contexts));
    contexts->gemm = gm->gemm;
    contexts->cudnn = gm->cudnn;
    gm->gemm = nullptr;
    gm->cudnn = nullptr;
    return contexts;
}

void gpu_model_give_contexts(gpu_model *gm, gpu_model_contexts *contexts)
{
    if (!contexts) return;
    free_contexts(gm);
    gm->gemm = contexts->gemm;
    gm->cudnn = contexts->cudnn;
    free(contexts);
}

void gpu_model_free(gpu_model *gm)
{
    if (!gm) return;
    free_contexts(gm);
    if (gm->family) {  // its workspace and staging are the family's; the parameter buffers the model's
        mmdit_gpu_free(gm->family);
        float *owned[] = {gm->master, gm->grads};
        for (float *p : owned)
            if (p) CUDA_CHECK(cudaFree(p));
        if (gm->working) CUDA_CHECK(cudaFree(gm->working));
        free(gm->own_modulation);
        free(gm->own_norm3);
        free(gm->blocks);
        free(gm->saved);
        free(gm);
        return;
    }
    CUDA_CHECK(cudaFree(gm->master));
    CUDA_CHECK(cudaFree(gm->grads));
    CUDA_CHECK(cudaFree(gm->working));
    free(gm->own_modulation);
    free(gm->own_norm3);
    CUDA_CHECK(cudaFree(gm->arena));
    CUDA_CHECK(cudaFreeHost(gm->tables_pinned));
    CUDA_CHECK(cudaFreeHost(gm->latents_pinned));
    CUDA_CHECK(cudaFreeHost(gm->noise_pinned));
    CUDA_CHECK(cudaFreeHost(gm->text_pinned));
    CUDA_CHECK(cudaFreeHost(gm->loss_pinned));
    CUDA_CHECK(cudaFree(gm->sp.arena));
    if (gm->sp.tables_pinned) CUDA_CHECK(cudaFreeHost(gm->sp.tables_pinned));
    free(gm->sp.slice_start);
    free(gm->sp.counts);
    free(gm->sp.sample_start);
    free(gm->sp.positions);
    free(gm->sp.heads);
    free(gm->grid_frames);
    free(gm->timesteps_host);
    free(gm->blocks);
    free(gm->saved);
    gpu_model_set_precision(gm, 0, 1, 0, 0);
    free(gm);
}

gpu_model_buffers gpu_model_get_buffers(const gpu_model *gm)
{
    gpu_model_buffers buffers;
    buffers.n_weights = gm->n_weights;
    buffers.master = gm->master;
    buffers.working = gm->working;
    buffers.grads = gm->grads;
    return buffers;
}

size_t gpu_model_device_bytes(const gpu_model *gm)
{
    const size_t params = gm->master ? (size_t)gm->n_weights * (2 * sizeof(float) + sizeof(gpu_bf16)) : 0;
    return params + gm->arena_bytes;
}

namespace {

void check_own_params(const gpu_model *gm, const char *what)
{
    if (!gm->master) ALDIT_FATAL("gpu model: %s on a model created without its parameters", what);
}

} // namespace

void gpu_model_upload_weights(gpu_model *gm, const float *weights)
{
    check_own_params(gm, "gpu_model_upload_weights");
    CUDA_CHECK(cudaMemcpy(gm->master, weights, (size_t)gm->n_weights * sizeof(float), cudaMemcpyHostToDevice));
    gpu_model_refresh_working(gm, 0);
    CUDA_CHECK(cudaStreamSynchronize(0));
}

void gpu_model_download_weights(const gpu_model *gm, float *weights)
{
    check_own_params(gm, "gpu_model_download_weights");
    CUDA_CHECK(cudaMemcpy(weights, gm->master, (size_t)gm->n_weights * sizeof(float), cudaMemcpyDeviceToHost));
}

void gpu_model_download_grads(const gpu_model *gm, float *grads)
{
    check_own_params(gm, "gpu_model_download_grads");
    CUDA_CHECK(cudaMemcpy(grads, gm->grads, (size_t)gm->n_weights * sizeof(float), cudaMemcpyDeviceToHost));
}

void gpu_model_refresh_working(gpu_model *gm, cudaStream_t stream)
{
    check_own_params(gm, "gpu_model_refresh_working");
    misc_f32_to_bf16(gm->master, gm->n_weights, gm->working, stream);
}

void gpu_model_zero_grads(gpu_model *gm, cudaStream_t stream)
{
    check_own_params(gm, "gpu_model_zero_grads");
    CUDA_CHECK(cudaMemsetAsync(gm->grads, 0, (size_t)gm->n_weights * sizeof(float), stream));
}

// The per-sample losses of the call queued on `stream` to the host (sample_loss may be NULL); returns their sum.
static double wait_for_losses(gpu_model *gm, int n_samples, double *sample_loss, cudaStream_t stream)
{
    CUDA_CHECK(cudaMemcpyAsync(gm->loss_pinned, gm->sample_loss, (size_t)n_samples * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    gpu_stream_wait(stream);  // a sharded state's collectives are on this stream's path: watched
    double total = 0.0;
    for (int b = 0; b < n_samples; ++b) {
        if (sample_loss) sample_loss[b] = gm->loss_pinned[b];
        total += gm->loss_pinned[b];
    }
    return total;
}

double gpu_model_forward_backward(gpu_model *gm, const model_batch *batch, float grad_scale, double *sample_loss,
                                  cudaStream_t stream)
{
    timespec queue_start, queue_end;
    clock_gettime(CLOCK_MONOTONIC, &queue_start);
    ALDIT_CHECK(gm->params.block_weights, "gpu model: a forward_backward before gpu_model_set_params");
    if (gm->family) {
        mmdit_gpu_env env = family_env(gm);
        env.group = sp_group_of(gm, batch);   // checked as for Wan
        return mmdit_gpu_forward_backward(gm->family, &env, batch, grad_scale, sample_loss, stream);
    }
    const batch_dims dims = stage_batch(gm, batch, stream);
    forward(gm, dims, grad_scale, false, stream);
    backward(gm, dims, stream);
    clock_gettime(CLOCK_MONOTONIC, &queue_end);
    gm->enqueue_seconds = (double)(queue_end.tv_sec - queue_start.tv_sec) + 1e-9 * (queue_end.tv_nsec - queue_start.tv_nsec);
    return wait_for_losses(gm, dims.n_samples, sample_loss, stream);
}

double gpu_model_forward_loss(gpu_model *gm, const model_batch *batch, double *sample_loss, cudaStream_t stream)
{
    if (batch->n_samples == 0) { // the parameter source's calls of a forward (forward's), computing nothing
        ALDIT_CHECK(gm->params.block_weights, "gpu model: a forward before gpu_model_set_params");
        gm->params.time_weights(gm->params.context, 0, stream);
        for (int l = 0; l < gm->num_layers; ++l) block_weights(gm, l, forward_next(gm, l), stream);
        return 0.0;
    }
    if (gm->family) {
        mmdit_gpu_env env = family_env(gm);
        env.group = sp_group_of(gm, batch);
        return mmdit_gpu_forward_loss(gm->family, &env, batch, sample_loss, stream);
    }
    const batch_dims dims = stage_batch(gm, batch, stream);
    forward(gm, dims, 0.0f, true, stream);
    return wait_for_losses(gm, dims.n_samples, sample_loss, stream);
}

// ---- FP8 of the block's large linears ---------------------------------------------------------------------

namespace {

// The FP8 scratch for `max_rows` rows: input, gradient and their transposes at the widest linear (ffn_dim), the
// widest weight and its transpose, the bias gradients' partial sums and a float for a GEMM's AMAX_D; as allocated,
// each piece rounded up to 256 bytes.
size_t fp8_scratch_bytes(int64_t dim, int64_t ffn_dim, int64_t max_rows, size_t *pieces)
{
    const int64_t wide = dim > ffn_dim ? dim : ffn_dim, padded = gemm_fp8_padded_rows(max_rows);
    const size_t act = (size_t)(padded * wide + 255) / 256 * 256;
    const size_t weight = (size_t)(dim * ffn_dim + 255) / 256 * 256;
    const size_t partials = (fp8_dbias_partials_floats(padded, (int)wide) * sizeof(float) + 255) / 256 * 256;
    if (pieces) pieces[0] = act, pieces[1] = weight, pieces[2] = partials;
    return 4 * act + 2 * weight + partials + 256;  // + the AMAX_D float
}

// [train] fp8_attention's scratch: one sample's q, k, v, o, do, dq, dk, dv in FP8 at up to max_rows rows and the
// cuDNN tile's slack (a sequence-parallel member's every row with its heads is no more bytes), the probe's stats and
// a call's scales array; each piece rounded up to 256 bytes (pieces: one operand's and the stats', may be NULL).
size_t fp8_attention_bytes(int64_t dim, int num_heads, int64_t max_rows, size_t *pieces)
{
    const int64_t rows = max_rows + kTileSlack;
    const size_t one = (size_t)(rows * dim + 255) / 256 * 256;
    const size_t stats = (size_t)(rows * num_heads * (int64_t)sizeof(float) + 255) / 256 * 256;
    const size_t scales = (ATTENTION_FP8_SCALE_FLOATS * sizeof(float) + 255) / 256 * 256;
    if (pieces) pieces[0] = one, pieces[1] = stats;
    return 8 * one + stats + scales;
}

// The FP8 self-attention's context and scratch (fp8_linears' attention fields), `backward` as fp8_attention = on.
void make_fp8_attention(gpu_model *gm, fp8_linears *f, bool backward)
{
    ALDIT_CHECK(gm->head_dim == 128, "gpu model: [train] fp8_attention needs head_dim 128 (cuDNN's FP8 attention on "
                "Hopper); this model's is %d (model.dim / model.num_heads): set train.fp8_attention = off",
                gm->head_dim);
    ALDIT_CHECK(gm->use_cudnn && gm->cudnn, "gpu model: [train] fp8_attention runs the samples that run on cuDNN, "
                "and cuDNN attention is off or not available ([train] attention, the build): set train.fp8_attention "
                "= off");
    size_t pieces[2];
    const size_t bytes = fp8_attention_bytes(gm->dim, gm->num_heads, gm->max_tokens, pieces);
    uint8_t *base = nullptr;
    CUDA_CHECK(cudaMalloc(&base, bytes));
    uint8_t **operands[] = {&f->q8, &f->k8, &f->v8, &f->o8, &f->do8, &f->dq8, &f->dk8, &f->dv8};
    for (int i = 0; i < 8; ++i) *operands[i] = base + i * pieces[0];
    f->probe_stats = reinterpret_cast<float *>(base + 8 * pieces[0]);
    f->attn_scales = reinterpret_cast<float *>(base + 8 * pieces[0] + pieces[1]);
    f->attention = attention_fp8_create();
    f->attention_backward = backward;
    f->bytes += bytes;
}

void free_fp8(gpu_model *gm)
{
    if (!gm->fp8) return;
    fp8_scaling_free(gm->fp8->scaling);
    if (gm->fp8->attention) {
        attention_fp8_free(gm->fp8->attention);
        CUDA_CHECK(cudaFree(gm->fp8->q8));
    }
    CUDA_CHECK(cudaFree(gm->fp8->x8));
    free(gm->fp8);
    gm->fp8 = nullptr;
}

}  // namespace

size_t gpu_model_fp8_bytes(const model *host_model, int64_t max_tokens, int attention)
{
    return fp8_scratch_bytes(host_model->dim, host_model->ffn_dim, max_tokens, nullptr) +
           (attention ? fp8_attention_bytes(host_model->dim, host_model->num_heads, max_tokens, nullptr) : 0);
}

void gpu_model_set_precision(gpu_model *gm, int fp8, int amax_history, int margin, int attention)
{
    free_fp8(gm);
    if (!fp8) return;
    int major = 0, minor = 0;
    ALDIT_CHECK(fp8_gpu_supported(&major, &minor), "gpu model: [train] precision = fp8 needs a GPU of compute capability "
                "8.9 or more (FP8 tensor cores); this one is %d.%d: set [train] precision = bf16", major, minor);
    ALDIT_CHECK(gemm_fp8_supported(gm->dim, gm->ffn_dim), "gpu model: [train] precision = fp8 needs model.dim (%d) and "
                "model.ffn_dim (%d) multiples of 16 (cuBLASLt's FP8 GEMMs)", gm->dim, gm->ffn_dim);
    ALDIT_CHECK(attention >= 0 && attention <= 2, "gpu model: fp8 attention mode %d (0 off, 1 forward, 2 both)",
                attention);
    fp8_linears *f = static_cast<fp8_linears *>(xcalloc(1, sizeof *f));
    const int n_linear = gm->num_layers * kFp8Linears * kFp8Roles;
    const int n = n_linear + (attention ? gm->num_layers * kFp8AttnRoles : 0);
    fp8_format *formats = static_cast<fp8_format *>(xmalloc((size_t)(n > 0 ? n : 1) * sizeof *formats));
    for (int t = 0; t < n_linear; ++t) formats[t] = t % kFp8Roles == kFp8Grad ? FP8_E5M2 : FP8_E4M3;
    for (int t = n_linear; t < n; ++t) formats[t] = (t - n_linear) % kFp8AttnRoles < kAttnDO ? FP8_E4M3 : FP8_E5M2;
    f->scaling = n > 0 ? fp8_scaling_create(n, formats, amax_history, margin) : nullptr;
    free(formats);
    size_t pieces[3];
    f->bytes = fp8_scratch_bytes(gm->dim, gm->ffn_dim, gm->max_tokens, pieces);
    uint8_t *base = nullptr;
    CUDA_CHECK(cudaMalloc(&base, f->bytes));
    f->x8 = base, f->xt8 = base + pieces[0], f->g8 = base + 2 * pieces[0], f->gt8 = base + 3 * pieces[0];
    f->w8 = base + 4 * pieces[0], f->wt8 = base + 4 * pieces[0] + pieces[1];
    f->partials = reinterpret_cast<float *>(base + 4 * pieces[0] + 2 * pieces[1]);
    f->amax_d = reinterpret_cast<float *>(base + 4 * pieces[0] + 2 * pieces[1] + pieces[2]);
    if (attention && gm->num_layers > 0) make_fp8_attention(gm, f, attention == 2);
    gm->fp8 = f;
}

int64_t gpu_model_fp8_attention_refused(const gpu_model *gm)
{
    return gm->fp8 ? gm->fp8->attention_refused : 0;
}

int gpu_model_precision_fp8(const gpu_model *gm)
{
    return gm->fp8 != nullptr;
}

void gpu_model_fp8_step(gpu_model *gm, cudaStream_t stream)
{
    if (gm->fp8 && gm->fp8->scaling) fp8_scaling_update(gm->fp8->scaling, stream);
}

void gpu_model_fp8_fresh(gpu_model *gm, cudaStream_t stream)
{
    if (gm->fp8 && gm->fp8->scaling && fp8_scaling_updates(gm->fp8->scaling) == 0)
        fp8_scaling_reset(gm->fp8->scaling, stream);
}

void gpu_model_fp8_steady(gpu_model *gm, cudaStream_t stream)
{
    if (gm->fp8 && gm->fp8->scaling && fp8_scaling_updates(gm->fp8->scaling) == 0)
        fp8_scaling_update(gm->fp8->scaling, stream);
}

void gpu_model_fp8_restart(gpu_model *gm, cudaStream_t stream)
{
    if (gm->fp8 && gm->fp8->scaling) fp8_scaling_reset(gm->fp8->scaling, stream);
}

float *gpu_model_fp8_amax(gpu_model *gm, int *count)
{
    const bool any = gm->fp8 && gm->fp8->scaling;
    *count = any ? (int)fp8_scaling_amax_floats(gm->fp8->scaling) : 0;
    return any ? fp8_scaling_amax(gm->fp8->scaling) : nullptr;
}

size_t gpu_model_fp8_state_bytes(const gpu_model *gm)
{
    return gm->fp8 && gm->fp8->scaling ? fp8_scaling_state_bytes(gm->fp8->scaling) : 0;
}

void gpu_model_fp8_save(const gpu_model *gm, void *blob, cudaStream_t stream)
{
    if (gpu_model_fp8_state_bytes(gm) > 0) fp8_scaling_save(gm->fp8->scaling, blob, stream);
}

int gpu_model_fp8_load(gpu_model *gm, const void *blob, size_t bytes, char *why, size_t why_size)
{
    if (gpu_model_fp8_state_bytes(gm) == 0) {
        snprintf(why, why_size, "this model runs in bf16 and keeps no FP8 scaling state");
        return 1;
    }
    return fp8_scaling_load(gm->fp8->scaling, blob, bytes, why, why_size);
}

fp8_scaling *gpu_model_fp8_scaling(gpu_model *gm)
{
    return gm->fp8 ? gm->fp8->scaling : nullptr;
}
