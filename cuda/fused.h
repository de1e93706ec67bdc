/* fused.h — fused CUDA ops of the training step: q/k RMSNorm + 3D RoPE, AdamW with global-norm clipping, rectified-flow mixing and loss. */
#ifndef ALDIT_FUSED_H
#define ALDIT_FUSED_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"
#include "model/optim.h" /* adamw_step (a plain struct: no C linkage needed in CUDA sources) */

#ifdef __cplusplus
extern "C" {
#endif

/* All pointers are device memory unless a comment says otherwise; everything is queued on `stream` and
   nothing synchronises the host. Reductions go through per-block partials in a caller-given workspace
   and a final pass in a fixed order: the results are bitwise reproducible on one GPU. */

/* ---- q/k RMSNorm + 3D RoPE ------------------------------------------------------------------------
   x, y, dy, dx: [n_rows, dim] bf16 row-major, dim = num_heads * head_dim, a multiple of 8 up to
   FUSED_QK_MAX_DIM; head_dim even. weight: bf16 [dim] (Wan's norm_q / norm_k, the bf16 copy of the
   parameter). rstd: fp32 [n_rows], saved by the forward for the backward.
   positions: int32 [n_rows, 3] (f, h, w) grid indices of each row, as cpu_rope_positions writes them
   (compute them once per micro-batch on the host and copy them over); NULL = RMSNorm only (cross-
   attention). Forward: y = RoPE(x * rstd * weight), rstd = 1 / sqrt(mean(x^2) + eps), with Wan's split
   of each head into frame / row / column pairs exactly as cpu_rope_fwd (theta 10000); math in fp32,
   one rounding to bf16 at the end. y may be x. */
#define FUSED_QK_MAX_DIM 8192
void fused_qk_norm_rope_fwd(const gpu_bf16 *x, int64_t n_rows, int num_heads, int head_dim,
                            const gpu_bf16 *weight, float eps, const int32_t *positions, gpu_bf16 *y,
                            float *rstd, cudaStream_t stream);

/* Backward of fused_qk_norm_rope_fwd: dx (bf16, overwritten; may be dy or x) and dweight (fp32 [dim],
   ADDED into, like every parameter gradient of the CPU ops). workspace: at least
   fused_qk_norm_rope_bwd_workspace_bytes(n_rows, dim) bytes of device memory. */
size_t fused_qk_norm_rope_bwd_workspace_bytes(int64_t n_rows, int dim);
void fused_qk_norm_rope_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows, int num_heads,
                            int head_dim, const gpu_bf16 *weight, const int32_t *positions,
                            const float *rstd, gpu_bf16 *dx, float *dweight, void *workspace,
                            cudaStream_t stream);

/* The same per head (HunyuanVideo-1.5's q/k norms): x, y, dy, dx [n_tokens, num_heads * head_dim] bf16 rows,
   each head normalised on its own (rstd fp32 [n_tokens * num_heads], token-major; weight bf16 [head_dim], shared by
   the heads), then, with positions (int32 [n_tokens, 3], one per token; NULL = RMSNorm only, the text stream), RoPE
   with axis_pairs[0] pairs by frame, [1] by row, [2] by column (summing to head_dim / 2) at the given theta, exactly
   as cpu_rmsnorm_fwd over the heads followed by cpu_rope_axes_fwd. head_dim a multiple of 8. dweight (fp32
   [head_dim]) is ADDED into. workspace: fused_head_norm_rope_bwd_workspace_bytes bytes. */
void fused_head_norm_rope_fwd(const gpu_bf16 *x, int64_t n_tokens, int num_heads, int head_dim,
                              const gpu_bf16 *weight, float eps, const int32_t *positions, const int axis_pairs[3],
                              double theta, gpu_bf16 *y, float *rstd, cudaStream_t stream);
size_t fused_head_norm_rope_bwd_workspace_bytes(int64_t n_tokens, int num_heads, int head_dim);
void fused_head_norm_rope_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_tokens, int num_heads, int head_dim,
                              const gpu_bf16 *weight, const int32_t *positions, const int axis_pairs[3], double theta,
                              const float *rstd, gpu_bf16 *dx, float *dweight, void *workspace, cudaStream_t stream);

/* ---- gradient norm, clipping and AdamW ----------------------------------------------------------- */

/* *sumsq = sum of values[i]^2 in double (fp64 per thread, a fixed grid of per-block partials, then one
   block): the same bits on every GPU. workspace: fused_sumsq_workspace_bytes() bytes. */
size_t fused_sumsq_workspace_bytes(void);
void fused_sumsq(const float *values, int64_t n_values, double *sumsq, void *workspace, cudaStream_t stream);

/* The step's gradient scale from the squared norm of the UNSCALED summed gradients, on the device:
   norm = base_scale * sqrt(*sumsq) (the norm optim_global_norm would give for the scaled gradients;
   base_scale is 1 / global_samples), clip = max_norm / (norm + 1e-6) when max_norm > 0 and
   norm > max_norm (else 1), *grad_scale = base_scale * clip. A non-finite norm gives a NaN
   *grad_scale, which makes fused_adamw skip the step. grad_norm (device double, may be NULL) receives
   the norm for the log. */
void fused_clip_scale(const double *sumsq, double base_scale, double max_norm, float *grad_scale,
                      double *grad_norm, cudaStream_t stream);

/* One AdamW step over n_values fp32 master weights in place, exactly optim_adamw's update (bias-
   corrected moments, decoupled weight decay w *= 1 - lr * weight_decay) on the gradient
   g = grad * grad_scale * (*grad_scale_device when not NULL). m, v: fp32 moments, in place.
   weight_bf16: the bf16 copy of the updated master weights (NULL = none). When the effective scale is
   not finite nothing is written (the step is skipped on the device, see fused_clip_scale). */
void fused_adamw(const adamw_step *hyper, double weight_decay, float *master, gpu_bf16 *weight_bf16,
                 const float *grad, float *m, float *v, int64_t n_values, float grad_scale,
                 const float *grad_scale_device, cudaStream_t stream);

/* ---- rectified flow ----------------------------------------------------------------------------------
   Element-wise over a packed micro-batch: sample b owns elements [sample_start[b], sample_start[b+1])
   (int64 device array of n_samples + 1 values, non-decreasing, from 0). x0, noise: fp32 in the layout
   the caller needs (for the loss, the same order as the prediction, i.e. the head's output order). */

/* x_t = (1 - sigma_b) * x0 + sigma_b * noise in fp32, rounded to bf16. sigma: fp32 [n_samples]. */
void fused_flow_mix(const float *x0, const float *noise, const int64_t *sample_start, int n_samples,
                    const float *sigma, gpu_bf16 *x_t, cudaStream_t stream);

/* Per-sample MSE against the target noise - x0: sample_loss[b] = sum((pred - target)^2) / n_b (fp32
   [n_samples]; 0 for an empty sample), with fp32 per-thread and per-block sums and an fp64 final sum in
   a fixed order. d_pred = grad_scale * 2 * (pred - target) / n_b, the gradient of the sum of the
   per-sample losses, written in the prediction's own type (bf16 for the bf16 head GEMM, fp32 for the
   fp32 one); NULL = loss only; d_pred may be pred. workspace: fused_flow_loss_workspace_bytes(n_samples). */
size_t fused_flow_loss_workspace_bytes(int n_samples);
void fused_flow_loss_bf16(const gpu_bf16 *pred, const float *x0, const float *noise, const int64_t *sample_start,
                          int n_samples, float grad_scale, float *sample_loss, gpu_bf16 *d_pred, void *workspace,
                          cudaStream_t stream);
/* The same for a slice of each sample's elements (a member of a sequence-parallel group): sample b's elements here
   are [sample_start[b], sample_start[b+1]), but its loss and gradient divide by the whole sample's count,
   whole_start[b+1] - whole_start[b] (int64 device [n_samples + 1]): the members' sample_loss and d_pred add up to the
   whole sample's. A sample with no element here gets 0. */
void fused_flow_loss_part_bf16(const gpu_bf16 *pred, const float *x0, const float *noise, const int64_t *sample_start,
                               const int64_t *whole_start, int n_samples, float grad_scale, float *sample_loss,
                               gpu_bf16 *d_pred, void *workspace, cudaStream_t stream);
void fused_flow_loss_f32(const float *pred, const float *x0, const float *noise, const int64_t *sample_start,
                         int n_samples, float grad_scale, float *sample_loss, float *d_pred, void *workspace,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
