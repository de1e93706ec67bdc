/* lnmod.h — fused LayerNorm-Modulate on the GPU: forward, backward and the gated-residual variant (bf16 rows, fp32 statistics). */
#ifndef ALDIT_LNMOD_H
#define ALDIT_LNMOD_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Layout shared by every function here (all pointers are device memory, 16-byte aligned as cudaMalloc
   gives; at most 65535 samples per call):
   - rows: n_rows x dim bf16, row-major; the samples of a packed micro-batch lie back to back, and the
     rows of sample b are [row_start[b], row_start[b+1]); row_start holds n_samples + 1 int64 values,
     row_start[0] = 0, non-decreasing, row_start[n_samples] = n_rows (a sample may have 0 rows);
   - modulation vectors shift, scale, gate: fp32 [n_samples, dim] (Wan computes its time modulation in
     fp32; these are tiny next to the rows, so fp32 costs nothing and keeps 1 + scale exact);
   - mean, rstd: fp32 [n_rows], the row statistics of the forward (LN without affine, biased variance:
     rstd = 1 / sqrt(var + eps)), which the backward reads;
   - per-sample gradients dshift, dscale, dgate: fp32 [n_samples, dim], overwritten (not accumulated);
   - dim: a multiple of 8 from 8 to LNMOD_MAX_DIM.
   Everything is queued on `stream`; nothing synchronises the host. Column sums are reduced through
   per-block partials in `workspace` and a final pass in fixed order: results are bitwise reproducible. */
#define LNMOD_MAX_DIM 8192

/* y = LN(x) * (1 + scale_b) + shift_b. */
void lnmod_fwd(const gpu_bf16 *x, int64_t n_rows, int dim, const int64_t *row_start, int n_samples,
               const float *shift, const float *scale, float eps, gpu_bf16 *y, float *mean, float *rstd,
               cudaStream_t stream);

/* Backward of lnmod_fwd: dx (bf16, overwritten), dshift_b = sum of dy over b's rows,
   dscale_b = sum of dy * LN(x). workspace: lnmod_bwd_workspace_bytes() bytes of device memory. */
size_t lnmod_bwd_workspace_bytes(int64_t n_rows, int dim, int n_samples);
void lnmod_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows, int dim, const int64_t *row_start,
               int n_samples, const float *scale, const float *mean, const float *rstd, gpu_bf16 *dx,
               float *dshift, float *dscale, void *workspace, cudaStream_t stream);

/* Gated residual then LayerNorm-Modulate, in one pass over the rows:
   x_new = x + y_prev * gate_b (rounded to bf16 and written; x_new may be x itself), then
   y = LN(x_new) * (1 + scale_b) + shift_b, with the statistics taken on the stored bf16 x_new. */
void lnmod_residual_fwd(const gpu_bf16 *x, const gpu_bf16 *y_prev, int64_t n_rows, int dim,
                        const int64_t *row_start, int n_samples, const float *gate, const float *shift,
                        const float *scale, float eps, gpu_bf16 *x_new, gpu_bf16 *y, float *mean, float *rstd,
                        cudaStream_t stream);

/* Backward of lnmod_residual_fwd. dy: gradient of y; d_x_new: gradient reaching x_new from its other
   uses (the residual stream further on; NULL means zero). Writes dx = d_x_new + (LN-modulate backward
   of dy), the gradient of x (dx may be d_x_new itself), dy_prev = dx * gate_b, and per sample dshift,
   dscale and dgate_b = sum of dx * y_prev (dx in fp32, before rounding). */
size_t lnmod_residual_bwd_workspace_bytes(int64_t n_rows, int dim, int n_samples);
void lnmod_residual_bwd(const gpu_bf16 *x_new, const gpu_bf16 *y_prev, const gpu_bf16 *dy,
                        const gpu_bf16 *d_x_new, int64_t n_rows, int dim, const int64_t *row_start,
                        int n_samples, const float *gate, const float *scale, const float *mean,
                        const float *rstd, gpu_bf16 *dx, gpu_bf16 *dy_prev, float *dshift, float *dscale,
                        float *dgate, void *workspace, cudaStream_t stream);

/* The kernels. The plain and the residual forward each run the staged kernel: each row group's next row travels to
   shared memory by cp.async while the current row is reduced from registers, and the block keeps its current
   sample's modulation vectors in shared memory. On a device whose block shared memory cannot hold that (not an
   H100/H200) they run the register kernel instead, which loads rows straight into registers (the plain one with
   the next row in flight). A row is spread over the narrowest thread group (32, 64, 128, 256 threads) whose threads
   hold at most 4 16-byte vectors of it in the plain forward, 8 in the residual forward, 5 in the backward and 4 in
   the residual backward (256 threads: at most 4). The plain forward's blocks take interleaved steps of rows; the
   residual forward and the backward one contiguous chunk per block. */
#define LNMOD_FWD_REGISTER_KERNEL (-1)

/* The kernel that lnmod_fwd (residual = 0) or lnmod_residual_fwd (residual = 1) runs on rows of `dim` on the
   current device: stages is LNMOD_FWD_REGISTER_KERNEL for the register kernel, else the
   staged kernel's rows in flight (after the shared-memory fallback); the row-group width (threads) and the
   16-byte vectors each of its threads holds. For logs, aldit-bench and tests. */
typedef struct {
    int stages, threads_per_row, vectors_per_thread;
} lnmod_fwd_plan;
lnmod_fwd_plan lnmod_fwd_plan_for(int dim, int residual);

#ifdef __cplusplus
}
#endif

#endif
