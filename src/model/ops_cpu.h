/* ops_cpu.h — the fp32 CPU reference ops of the DiT (forward and backward), the oracle for the CUDA code. */
#ifndef ALDIT_OPS_CPU_H
#define ALDIT_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

/* Conventions for every op below.
   - Activations are row-major [n_rows, width]; a packed micro-batch holds its samples back to back,
     and sample b owns rows [sample_row_start[b], sample_row_start[b+1]) (n_samples+1 offsets).
   - Backward: gradients of activations (dx, dq, ...) are OVERWRITTEN unless the op says otherwise;
     gradients of parameters (dweight, dbias) are ADDED into, so a whole model accumulates in place.
   - Outputs must not alias inputs unless the op says they may.
   - Statistics and reductions are fp32 or better, in a fixed order that does not depend on the thread count. */

/* memcpy over the rank's OpenMP threads (cpu_set_threads) in 1 MiB pieces, for copies of 8 MiB or more (a GPU model
   staging a micro-batch's captions and latents into pinned memory: one core's copy is a few GB/s); memcpy below. */
void cpu_copy(void *dst, const void *src, size_t bytes);

/* y = x · weight^T + bias: x [n_rows, in_dim], weight [out_dim, in_dim] (PyTorch Linear), bias [out_dim]
   or NULL, y [n_rows, out_dim]. CBLAS sgemm when built with it, plain loops otherwise. */
void cpu_linear_fwd(const float *x, int64_t n_rows, int in_dim, int out_dim, const float *weight,
                    const float *bias, float *y);
/* dx = dy · weight (overwritten, or added into when accumulate_dx; skipped when dx is NULL);
   dweight += dy^T · x; dbias += column sums of dy (skipped when NULL). */
void cpu_linear_bwd(const float *x, const float *dy, int64_t n_rows, int in_dim, int out_dim,
                    const float *weight, float *dx, int accumulate_dx, float *dweight, float *dbias);

/* GELU with the tanh approximation (PyTorch approximate='tanh'); y may alias x, dx may alias dy. */
void cpu_gelu_tanh_fwd(const float *x, int64_t n, float *y);
void cpu_gelu_tanh_bwd(const float *x, const float *dy, int64_t n, float *dx);
/* GELU exact (PyTorch's default nn.GELU(): x Phi(x), erf computed in double); y may alias x, dx may alias dy. */
void cpu_gelu_erf_fwd(const float *x, int64_t n, float *y);
void cpu_gelu_erf_bwd(const float *x, const float *dy, int64_t n, float *dx);
/* SiLU: y = x * sigmoid(x); y may alias x, dx may alias dy. */
void cpu_silu_fwd(const float *x, int64_t n, float *y);
void cpu_silu_bwd(const float *x, const float *dy, int64_t n, float *dx);

/* LayerNorm over the last dim: y = (x - mean) * rstd * weight + bias; weight and bias NULL = no affine.
   mean and rstd ([n_rows]) are saved for the backward. */
void cpu_layernorm_fwd(const float *x, int64_t n_rows, int dim, const float *weight, const float *bias,
                       float eps, float *y, float *mean, float *rstd);
/* dx overwritten; dweight, dbias added into (ignored when weight is NULL). */
void cpu_layernorm_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const float *weight,
                       const float *mean, const float *rstd, float *dx, float *dweight, float *dbias);

/* y = LN(x) * (1 + scale_b) + shift_b; rows of sample b are [sample_row_start[b], sample_row_start[b+1]);
   LN without affine, fp32 statistics; mean/rstd saved per row for the backward.
   shift, scale: [n_samples, dim]. */
void cpu_ln_modulate_fwd(const float *x, int64_t n_rows, int dim, const int64_t *sample_row_start, int n_samples,
                         const float *shift, const float *scale, float eps, float *y, float *mean, float *rstd);
/* dx overwritten; dshift, dscale ([n_samples, dim]) overwritten with the per-sample column sums. */
void cpu_ln_modulate_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const int64_t *sample_row_start,
                         int n_samples, const float *scale, const float *mean, const float *rstd,
                         float *dx, float *dshift, float *dscale);

/* RMSNorm over the last dim (Wan's WanRMSNorm): y = x * rsqrt(mean(x^2) + eps) * weight; rstd saved. */
void cpu_rmsnorm_fwd(const float *x, int64_t n_rows, int dim, const float *weight, float eps, float *y,
                     float *rstd);
/* dx overwritten (may alias dy); dweight added into. */
void cpu_rmsnorm_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const float *weight,
                     const float *rstd, float *dx, float *dweight);

/* 3D rotary embedding of Wan 2.1. Rows are [n_rows, num_heads * head_dim]; each head's head_dim values
   are head_dim/2 adjacent (real, imaginary) pairs. With c = head_dim/2, the first c - 2*(c/3) pairs
   rotate by the token's frame index, the next c/3 by its row, the last c/3 by its column (head_dim 128:
   44/42/42 values). Pair j of a part with n_part pairs rotates by position * theta^(-j / n_part),
   theta = 10000. positions: [n_rows, 3] (f, h, w) grid indices. y may alias x. head_dim must be even. */
void cpu_rope_fwd(const float *x, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                  float *y);
/* The rotation's transpose: dx = R^T dy (dx overwritten, may alias dy). */
void cpu_rope_bwd(const float *dy, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                  float *dx);
/* The same rotation with the axes' split and theta given (HunyuanVideo-1.5: 8, 28, 28 pairs of head_dim 128,
   theta 256): pairs [0, axis_pairs[0]) rotate by the frame, the next axis_pairs[1] by the row, the last
   axis_pairs[2] by the column (their sum must be head_dim/2: fatal otherwise); pair j of an axis with n pairs
   by position * theta^(-j / n). cpu_rope_fwd is this with Wan's split and theta 10000. */
void cpu_rope_axes_fwd(const float *x, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                       const int axis_pairs[3], double theta, float *y);
void cpu_rope_axes_bwd(const float *dy, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                       const int axis_pairs[3], double theta, float *dx);
/* (f, h, w) of every token of a packed micro-batch: sample b's grid is frames[b] x height[b] x width[b]
   tokens (after patchify), flattened f-major then h then w, samples back to back. */
void cpu_rope_positions(int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                        int32_t *positions);

/* Softmax attention over packed variable-length samples: the query rows of sample b,
   [q_row_start[b], q_row_start[b+1]), attend to its key/value rows [kv_row_start[b], kv_row_start[b+1])
   only (self-attention: the same offsets; cross-attention: the sample's own text rows). q, out:
   [n_q_rows, num_heads * head_dim]; k, v: [n_kv_rows, num_heads * head_dim]; scores scaled by
   1/sqrt(head_dim), softmax computed max-subtracted. lse [n_q_rows, num_heads] keeps the log-sum-exp
   of each row's scores for the backward. A sample with no key rows gets zero output. */
void cpu_attention_fwd(const float *q, const float *k, const float *v, int num_heads, int head_dim,
                       const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples, float *out,
                       float *lse);
/* dq, dk, dv overwritten (recomputes the probabilities from q, k and lse). */
void cpu_attention_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                       const float *lse, int num_heads, int head_dim, const int64_t *q_row_start,
                       const int64_t *kv_row_start, int n_samples, float *dq, float *dk, float *dv);

/* Gated residual with a per-sample gate: x[r] += y[r] * gate_b (in place), gate [n_samples, dim]. */
void cpu_gated_residual_fwd(float *x, const float *y, int dim, const int64_t *sample_row_start, int n_samples,
                            const float *gate);
/* Given dx (gradient of the updated x): dy = dx * gate_b (overwritten), dgate ([n_samples, dim])
   overwritten with the per-sample column sums of dx * y. The residual's own dx passes through unchanged. */
void cpu_gated_residual_bwd(const float *dx, const float *y, int dim, const int64_t *sample_row_start,
                            int n_samples, const float *gate, float *dy, float *dgate);

/* Sinusoidal timestep embedding of Wan: out[i] = [cos(t_i * w_0..w_{h-1}), sin(t_i * w_0..w_{h-1})],
   h = freq_dim/2, w_j = 10000^(-j/h), computed in double. Its input is not trained: no backward. */
void cpu_sinusoidal_embedding(const float *timesteps, int n, int freq_dim, float *out);

/* Patchify one sample [channels, frames, height, width] into tokens [S, channels*pt*ph*pw],
   S = (frames/pt)*(height/ph)*(width/pw), token order f-major then h then w. Within a token the values
   are ordered (c, p, q, r) when channel_last = 0 (the Conv3d weight order of patch_embedding) and
   (p, q, r, c) when channel_last = 1 (the head's output order that Wan's unpatchify reads).
   A permutation: its backward is cpu_unpatchify with the same arguments, and vice versa. */
void cpu_patchify(const float *video, int channels, int frames, int height, int width, int patch_t,
                  int patch_h, int patch_w, int channel_last, float *tokens);
/* The inverse of cpu_patchify: tokens back to [channels, frames, height, width]. */
void cpu_unpatchify(const float *tokens, int channels, int frames, int height, int width, int patch_t,
                    int patch_h, int patch_w, int channel_last, float *video);

/* Threads for the CPU ops: OpenMP's and, with OpenBLAS, its own pool (sized alike so that ranks sharing
   a node do not oversubscribe it). */
void cpu_set_threads(int n_threads);

#endif
