/* gemm.h — linear layers on cuBLASLt: y = x·W^T + b with bias / GELU epilogues and the backward GEMMs (dx, fp32 dW and db), bf16 or FP8 data, fp32 accumulation. */
#ifndef ALDIT_GEMM_H
#define ALDIT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Conventions (those of cpu_linear_fwd/bwd in ops_cpu.h, the oracle):
   - x [n_rows, in_dim], y and dy [n_rows, out_dim]: row-major bf16 activations (a packed micro-batch).
   - weight [out_dim, in_dim] (PyTorch Linear): the bf16 copy of the parameter; bias [out_dim] bf16.
   - dweight [out_dim, in_dim] and dbias [out_dim]: fp32 master gradients.
   - All pointers are device memory; everything is queued on `stream`, nothing synchronises the host.
   - Products are bf16 x bf16 on the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F, fp32
     alpha/beta); bf16 outputs are rounded once, at the end.

   Shapes: in_dim and out_dim must be multiples of 8 and every pointer 16-byte aligned (cudaMalloc
   gives 256): they are the leading dimensions of the bf16 matrices, and cuBLASLt's tensor-core kernels
   need 16-byte aligned columns; the GELU aux matrix needs its leading dimension divisible by 8 too.
   Anything else ends the job with a message naming the call and the shape (gemm_linear_supported says
   beforehand). n_rows is free (odd counts and 0 are fine).

   Column-major mapping (cuBLASLt is column-major; a row-major [r, c] matrix is a column-major c x r
   matrix with leading dimension c). With m, n, k the cuBLASLt sizes, D = op(A)·op(B) (+ C):
     forward   y_cm [out, rows] = (W_cm [in, out])^T · x_cm [in, rows]
               m = out_dim, n = n_rows, k = in_dim; A = weight, TRANSA = T, lda = in_dim;
               B = x, TRANSB = N, ldb = in_dim; D = y, ldd = out_dim; bias = a length-m vector
               (one value per row of D = per column of y), which is what the BIAS epilogue adds.
     dx        dx_cm [in, rows] = W_cm [in, out] · dy_cm [out, rows]
               m = in_dim, n = n_rows, k = out_dim; A = weight, N, lda = in_dim; B = dy, N,
               ldb = out_dim; D = dx, ldd = in_dim.
     dW        dW_cm [in, out] = x_cm [in, rows] · (dy_cm [out, rows])^T, i.e. dW = dy^T x row-major
               m = in_dim, n = out_dim, k = n_rows; A = x, N, lda = in_dim; B = dy, TRANSB = T,
               ldb = out_dim; C = D = dweight (fp32), ldd = in_dim; the BGRADB epilogue reduces op(B)
               over k, giving one value per column of D: db[o] = sum over rows of dy[r, o].
   The GELU aux matrix (pre-activation) has D's layout in the forward of the first FFN linear
   (out_dim x rows, ld out_dim) and D's layout in the dx GEMM of the second (its in_dim x rows): the
   same [n_rows, ffn] row-major tensor, so the forward's aux feeds the backward's DGELU directly.

   Epilogue paths: the bias, GELU (with its aux output) and GELU gradient run inside cuBLASLt's kernels
   (epilogues BIAS, GELU_AUX_BIAS, DGELU); the bias gradient always comes from gemm.cu's deterministic
   column sum (16-byte loads, per-chunk partials, then a fixed-order final pass; on the H200 cuBLASLt runs
   its BGRADB epilogue as a separate, slower kernel). Where cuBLASLt reports no algorithm for a fused
   epilogue at some shape (or in a context made with fused_epilogues = 0), the call runs the plain GEMM
   (BIAS for the GELU forward) and gemm.cu's own kernels: GELU, GELU gradient. The bias gradient is
   fp32. The GELU gradient is not fused with the bias gradient (DGELU_BGRAD would give it in bf16); the bias of the
   layer before the GELU gets its gradient from that layer's own dW call (the column sums of its dy,
   which is the DGELU output), in fp32. A Wan FFN (x [rows, D] -> up -> GELU -> down -> y):
     forward:  gemm_linear_fwd(g, x, rows, D, F, w_up, b_up, GEMM_EPILOGUE_GELU_AUX_BIAS, h, pre, s);
               gemm_linear_fwd(g, h, rows, F, D, w_down, b_down, GEMM_EPILOGUE_BIAS, y, NULL, s);
     backward: gemm_linear_bwd_weight(g, h, dy, rows, F, D, dw_down, db_down, 1, s);
               gemm_linear_bwd_data(g, dy, rows, F, D, w_down, pre, dpre, 0, s);      (dpre = d loss / d pre)
               gemm_linear_bwd_weight(g, x, dpre, rows, D, F, dw_up, db_up, 1, s);
               gemm_linear_bwd_data(g, dpre, rows, D, F, w_up, NULL, dx, 0, s);

   State: a gemm_context (gemm_create) holds everything, for the GPU current when it was made: one cuBLASLt
   handle, one plan cache and a 32 MiB workspace (plus scratch for the bias gradients) per stream, for up to 4
   streams, so that GEMMs queued on different streams can run at once. A fifth stream takes over the least
   recently used stream's workspace and first waits (an event, no host sync) for that stream's last call. A plan
   (matmul descriptor, layouts and the algorithm, see gemm_create) is cached per (GEMM kind, m, n, k, epilogue,
   pointer alignments); a bounded table, least recently used entries replaced. Every call must run on the
   context's GPU (fatal otherwise). Not thread-safe: one host thread per context. */

typedef struct gemm_context gemm_context;

/* A context on the current GPU. autotune ([train] autotune): a plan, built on the first call of a shape, asks
   cuBLASLt's heuristic for up to 8 algorithms and times each on that first call's own operands (a
   synchronisation of the stream; a temporary copy of D where the call adds into it), keeping the fastest for the
   plan's later calls; 0: the heuristic's first algorithm, no timing, the same in every run (timings decide, so two
   tuned runs may pick different algorithms and round differently). fused_epilogues: 1 runs the epilogues inside
   cuBLASLt where it has an algorithm for them (what the model uses); 0 always takes the plain GEMM + own-kernel
   path that otherwise serves only shapes without one (so that tests can compare the two). */
gemm_context *gemm_create(int autotune, int fused_epilogues);
/* Free the context's handle, workspaces, scratch and plans (waits for its GPU). NULL is a no-op. */
void gemm_free(gemm_context *context);

typedef enum {
    GEMM_EPILOGUE_NONE = 0,      /* y = x W^T                                                          */
    GEMM_EPILOGUE_BIAS,          /* y = x W^T + b                                                      */
    GEMM_EPILOGUE_GELU_AUX_BIAS, /* pre = x W^T + b, written to pre_gelu (bf16, [n_rows, out_dim]);
                                    y = gelu_tanh(pre) (PyTorch's approximate='tanh')                  */
} gemm_epilogue;

/* 1 when in_dim and out_dim meet the shape rules above, else 0. */
int gemm_linear_supported(int in_dim, int out_dim);

/* Forward. bias: NULL only with GEMM_EPILOGUE_NONE. pre_gelu: only with GELU_AUX_BIAS (else NULL).
   y must not alias x. */
void gemm_linear_fwd(gemm_context *context, const gpu_bf16 *x, int64_t n_rows, int in_dim, int out_dim,
                     const gpu_bf16 *weight, const gpu_bf16 *bias, gemm_epilogue epilogue, gpu_bf16 *y, gpu_bf16 *pre_gelu,
                     cudaStream_t stream);

/* Backward to the input: dx = dy · weight, [n_rows, in_dim]; overwritten, or added into when
   accumulate_dx (beta = 1 on the bf16 dx: a tensor that feeds several linears, e.g. q, k and v).
   gelu_input (may be NULL): the layer's input x was gelu_tanh(gelu_input), [n_rows, in_dim] (the
   pre_gelu the previous linear's forward wrote); dx is then the gradient with respect to gelu_input,
   (dy · weight) * gelu_tanh'(gelu_input) (epilogue DGELU); not combinable with accumulate_dx. */
void gemm_linear_bwd_data(gemm_context *context, const gpu_bf16 *dy, int64_t n_rows, int in_dim, int out_dim,
                          const gpu_bf16 *weight, const gpu_bf16 *gelu_input, gpu_bf16 *dx, int accumulate_dx, cudaStream_t stream);

/* Backward to the parameters: dweight (+)= dy^T · x (fp32 [out_dim, in_dim]) and, when dbias is not
   NULL, dbias (+)= column sums of dy (fp32 [out_dim]). accumulate: added into (beta = 1: micro-batches
   of one step accumulate in place, the convention of cpu_linear_bwd); 0: overwritten. */
void gemm_linear_bwd_weight(gemm_context *context, const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows,
                            int in_dim, int out_dim, float *dweight, float *dbias, int accumulate, cudaStream_t stream);

/* ---- FP8 (cuda/fp8.h makes the operands) ----------------------------------------------------------------
   The same three GEMMs with FP8 operands, each with its per-tensor scale_inv (a device fp32, fp8.h: the value an
   FP8 byte q stands for is q * scale_inv), bf16 outputs (fp32 for dW), fp32 accumulation: cuBLASLt's
   CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER multiply the product by both scale_inv before the bias is added.
   Hopper's FP8 kernels take only the TN layout (both operands contiguous along the reduction), so:
     forward  y  [rows, out]  = x8 [rows, in] (E4M3) . w8 [out, in]^T (E4M3)        (TN as the bf16 forward)
     dgrad    dx [rows, in]   = dy8 [rows, out] (E5M2) . wt8 [in, out]^T (E4M3)     (wt8: W transposed)
     wgrad    dW [out, in]   (+)= dyt8 [out, P] (E5M2) . xt8 [in, P]^T (E4M3)       (x and dy transposed, rows
              padded with zeros to P = gemm_fp8_padded_rows(rows), cuBLASLt's multiple of 16 for k)
   Fast accumulation (FP8 products summed in the tensor core's reduced-precision accumulator before fp32) is on in
   the forward and dgrad, off in wgrad, whose reduction runs over all rows. The bias and GELU epilogues are those of
   the bf16 calls (same fallbacks); the GELU gradient (gelu_input) is always the own pass after the GEMM (cuBLASLt's
   FP8 DGELU epilogue runs as a slow separate kernel); the bias gradient is not computed here (gemm_column_sums of the bf16 dy, or
   fp8_quantize_dbias in the pass that casts dy, as the model does). in_dim and out_dim
   must be multiples of 16 (gemm_fp8_supported), pointers 16-byte aligned. */
int gemm_fp8_supported(int in_dim, int out_dim);
int64_t gemm_fp8_padded_rows(int64_t n_rows);
/* epilogue: BIAS or GELU_AUX_BIAS (bias required). */
void gemm_fp8_fwd(gemm_context *context, const uint8_t *x8, const float *x_scale_inv, int64_t n_rows, int in_dim,
                  int out_dim, const uint8_t *w8, const float *w_scale_inv, const gpu_bf16 *bias, gemm_epilogue epilogue,
                  gpu_bf16 *y, gpu_bf16 *pre_gelu, cudaStream_t stream);
/* The FFN's first linear with its GELU emitting the next GEMM's FP8 input directly (no bf16 output, no cast pass):
   pre_gelu = x W^T + b (bf16, as GELU_AUX_BIAS), y8 = E4M3(gelu(pre) * y_scale) [rows, out] (cuBLASLt's D scale,
   saturating) and *y_amax = max |gelu(pre)| over the call (set, not accumulated: cuBLASLt's AMAX_D). Returns 0, with
   nothing queued, where cuBLASLt has no algorithm for it (or the context was made with fused_epilogues = 0): the
   caller then takes gemm_fp8_fwd's bf16 output and casts it. */
int gemm_fp8_fwd_gelu_fp8(gemm_context *context, const uint8_t *x8, const float *x_scale_inv, int64_t n_rows,
                          int in_dim, int out_dim, const uint8_t *w8, const float *w_scale_inv, const gpu_bf16 *bias,
                          const float *y_scale, uint8_t *y8, gpu_bf16 *pre_gelu, float *y_amax, cudaStream_t stream);
void gemm_fp8_bwd_data(gemm_context *context, const uint8_t *dy8, const float *dy_scale_inv, int64_t n_rows, int in_dim,
                       int out_dim, const uint8_t *wt8, const float *w_scale_inv, const gpu_bf16 *gelu_input,
                       gpu_bf16 *dx, int accumulate_dx, cudaStream_t stream);
void gemm_fp8_bwd_weight(gemm_context *context, const uint8_t *xt8, const float *x_scale_inv, const uint8_t *dyt8,
                         const float *dy_scale_inv, int64_t padded_rows, int in_dim, int out_dim, float *dweight,
                         int accumulate, cudaStream_t stream);
/* out [cols] (+)= column sums of dy [n_rows, cols] (bf16, cols a multiple of 8): the deterministic sums
   gemm_linear_bwd_weight gives the bias gradient with. */
void gemm_column_sums(gemm_context *context, const gpu_bf16 *dy, int64_t n_rows, int cols, float *out, int accumulate,
                      cudaStream_t stream);

/* FLOPs of one of the three GEMMs of a linear layer: 2 · n_rows · in_dim · out_dim. */
double gemm_linear_flops(int64_t n_rows, int in_dim, int out_dim);

/* The context's counters since it was made or last reset. */
typedef struct {
    double flops;              /* 2·m·n·k of every GEMM issued */
    int64_t gemms;             /* cublasLtMatmul calls */
    int64_t heuristic_queries; /* plans built (cache misses) */
    int64_t unfused;           /* calls that wanted a fused epilogue and ran the own kernels instead
                                  because cuBLASLt had no algorithm for it (not counting a
                                  context made with fused_epilogues = 0) */
    int64_t tuned;             /* plans whose candidates were timed (autotune) */
    int64_t tuned_not_first;   /* ... where another than the heuristic's first won */
    int64_t untuned;           /* plans left at the heuristic's first: no room for the copy of D */
} gemm_stats;
void gemm_get_stats(const gemm_context *context, gemm_stats *stats);
void gemm_reset_stats(gemm_context *context);

#ifdef __cplusplus
}
#endif

#endif
