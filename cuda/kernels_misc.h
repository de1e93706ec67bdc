/* kernels_misc.h — the small CUDA kernels of the GPU model: casts, patchify + flow mixing, the fp32 time path, modulation tables and their gradients, element-wise helpers, the weights' EMA. */
#ifndef ALDIT_KERNELS_MISC_H
#define ALDIT_KERNELS_MISC_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* All pointers are device memory; everything is queued on `stream`; nothing synchronises the host.
   Per-sample tables are fp32 [n_samples, dim] (sample-major); sums over samples run in a fixed order,
   so results are bitwise reproducible. */

/* ---- casts and element-wise ---------------------------------------------------------------------- */

/* dst = bf16(src), round to nearest even. */
void misc_f32_to_bf16(const float *src, int64_t n, gpu_bf16 *dst, cudaStream_t stream);
/* dst[i] = value. */
void misc_fill_f32(float *dst, int64_t n, float value, cudaStream_t stream);
/* out = a + b in fp32, rounded to bf16 (out may be a or b). */
void misc_add_bf16(const gpu_bf16 *a, const gpu_bf16 *b, int64_t n, gpu_bf16 *out, cudaStream_t stream);
/* dst += src (fp32 accumulator of bf16 values). */
void misc_accumulate_bf16(const gpu_bf16 *src, int64_t n, float *dst, cudaStream_t stream);
/* dst += src (fp32). */
void misc_accumulate_f32(const float *src, int64_t n, float *dst, cudaStream_t stream);

/* One update of the weights' EMA in place, after the step's AdamW: ema = (float)(decay * ema + (1 - decay) * w),
   in double without fused multiply-adds, so the bits are model/optim.h's optim_ema's. gate (device fp32, e.g. the
   step's clip scale from fused_clip_scale; NULL = none): when it is not finite the AdamW step was skipped on the
   device, and so is this (nothing written). */
void misc_ema_update(float *ema, const float *weights, int64_t n, double decay, const float *gate,
                     cudaStream_t stream);

/* ---- patchify and rectified-flow inputs ------------------------------------------------------------
   latents, noise: fp32, sample b's [channels, frames_b, height_b, width_b] values from latent_start[b]
   (n_samples + 1 int64 offsets). token_start: n_samples + 1 int64 token offsets. latent_shape:
   int32 [n_samples, 3] (frames, height, width) in latent units, multiples of the patch. sigma: fp32
   [n_samples]. Writes, for every token (f-major, then h, then w, samples back to back):
   x_t = bf16((1 - sigma_b) * x0 + sigma_b * noise) in the patch embedding's order (c, p, q, r), and
   x0 and noise (fp32) in the head's output order (p, q, r, c), which the flow loss compares against. */
void misc_patchify_flow(const float *latents, const float *noise, int n_samples, const int64_t *latent_start,
                        const int64_t *token_start, const int32_t *latent_shape, const float *sigma,
                        int64_t n_latent_values, int channels, int patch_t, int patch_h, int patch_w,
                        gpu_bf16 *x_t_tokens, float *x0_tokens, float *noise_tokens, cudaStream_t stream);
/* The same for a slice of each sample's tokens (a member of a sequence-parallel group): sample b's rows in the
   output are [token_start[b], token_start[b+1]) and hold its tokens token_first[b], token_first[b] + 1, ... (its
   index among the sample's tokens, f-major; int64 [n_samples], device); its other tokens are not written. latents
   and noise hold every sample whole. */
void misc_patchify_flow_rows(const float *latents, const float *noise, int n_samples, const int64_t *latent_start,
                             const int64_t *token_start, const int64_t *token_first, const int32_t *latent_shape,
                             const float *sigma, int64_t n_latent_values, int channels, int patch_t, int patch_h,
                             int patch_w, gpu_bf16 *x_t_tokens, float *x0_tokens, float *noise_tokens,
                             cudaStream_t stream);

/* ---- the sequence-parallel exchange's layouts (Ulysses) ------------------------------------------------
   split: src [n_rows, dim] (bf16 rows, every head) -> dst [parts][n_rows][dim / parts]: part p holds columns
   [p dim/parts, (p+1) dim/parts) of every row, contiguous, as the all-to-all sends it to member p. join: the reverse
   (src packed, dst rows). dim / parts a multiple of 8; both 16-byte aligned; src and dst must not overlap. */
void misc_split_columns_bf16(const gpu_bf16 *src, int64_t n_rows, int dim, int parts, gpu_bf16 *dst,
                             cudaStream_t stream);
void misc_join_columns_bf16(const gpu_bf16 *src, int64_t n_rows, int dim, int parts, gpu_bf16 *dst,
                            cudaStream_t stream);

/* ---- fp32 linear layers over a few rows (the time embedding and projection, one row per sample) ----
   y = x W^T + b: x [n_rows, in_dim], weight [out_dim, in_dim], bias [out_dim] (NULL = none). */
void misc_linear_f32_fwd(const float *x, int n_rows, int in_dim, int out_dim, const float *weight,
                         const float *bias, float *y, cudaStream_t stream);
/* dx = dy W (overwritten; skipped when NULL); dweight += dy^T x; dbias += column sums of dy. */
void misc_linear_f32_bwd(const float *x, const float *dy, int n_rows, int in_dim, int out_dim, const float *weight,
                         float *dx, float *dweight, float *dbias, cudaStream_t stream);
/* SiLU on fp32: y = x sigmoid(x) (y may be x); dx = dy * silu'(x) (dx may be dy). */
void misc_silu_f32_fwd(const float *x, int64_t n, float *y, cudaStream_t stream);
void misc_silu_f32_bwd(const float *x, const float *dy, int64_t n, float *dx, cudaStream_t stream);

/* ---- modulation tables ------------------------------------------------------------------------------ */

/* Wan's e = blocks.i.modulation + e0, chunk-major: modulation[(chunk * n_samples + b) * dim + c] =
   param[chunk * dim + c] + e0[b * 6 * dim + chunk * dim + c]. param [6, dim], e0 [n_samples, 6 * dim]. */
void misc_block_modulation(const float *param, const float *e0, int n_samples, int dim, float *modulation,
                           cudaStream_t stream);
/* Its backward for one block: d_param[chunk * dim + c] += sum_b d_modulation[chunk][b][c];
   d_e0[b * 6 * dim + chunk * dim + c] += d_modulation[chunk][b][c]. */
void misc_block_modulation_bwd(const float *d_modulation, int n_samples, int dim, float *d_param, float *d_e0,
                               cudaStream_t stream);

/* The head's shift_b = param[0] + e_b and scale_b = param[1] + e_b (param [2, dim], e: time embedding
   [n_samples, dim], without SiLU as Wan). Backward: d_param[0] += sum_b dshift_b, d_param[1] += sum_b
   dscale_b, d_e[b] = dshift_b + dscale_b (overwritten). */
void misc_head_modulation(const float *param, const float *e, int n_samples, int dim, float *shift, float *scale,
                          cudaStream_t stream);
void misc_head_modulation_bwd(const float *dshift, const float *dscale, int n_samples, int dim, float *d_param,
                              float *d_e, cudaStream_t stream);

/* An affine LayerNorm (weight, bias [dim]) as a LayerNorm-Modulate with the same vectors for every sample:
   shift_b = bias, scale_b = weight - 1 (exact for weights in [0.5, 2], and 1 + (w - 1) = w). */
void misc_affine_as_modulation(const float *weight, const float *bias, int n_samples, int dim, float *shift,
                               float *scale, cudaStream_t stream);
/* dst[c] += sum_b src[b * dim + c] (e.g. a LayerNorm weight's gradient from per-sample dscale). */
void misc_sum_samples_into(const float *src, int n_samples, int dim, float *dst, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
