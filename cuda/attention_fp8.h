/* attention_fp8.h — cuDNN's FP8 fused attention (per-tensor scales, E4M3 forward, E5M2 gradients) for one sample through cuDNN's C backend API: the measurement of issue 34 and the self-attention of [train] fp8_attention. */
#ifndef ALDIT_ATTENTION_FP8_H
#define ALDIT_ATTENTION_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Built only when configure finds cuDNN (HAVE_CUDNN). Self-attention of ONE sample of seq_len rows, non-causal,
   scores scaled by 1/sqrt(head_dim), the graphs cudnn-frontend builds for its FP8 SDPA on Hopper (cuDNN >= 9.1;
   there the backward's outputs must be FP8 and head_dim 128):
   - forward:  S = (Q Kᵀ)·scale·dQ·dK; P = softmax(S) (stats = max + log sum, fp32 head-major [num_heads,
     seq_len]); amax_S = max|P|; O = (quantize_E4M3(P·scale_S) V)·dS·dV, written as E4M3 O·scale_O, amax_O = max|O|.
   - backward: D = rowsum(dO·O)·d_dO·d_O; P = exp(S − stats); dV = (quantize(P·scale_S)ᵀ dO)·dS·d_dO;
     dP = (dO Vᵀ)·d_dO·dV_descale − D; dS = P·dP·scale; amax_dP = max|dS|; dQ = (quantize_E5M2(dS·scale_dP) K)·...;
     dK = (quantize(dS·scale_dP)ᵀ Q)·...; each of dQ, dK, dV written as E5M2 (value·its scale) with its amax.
   Tensors (device memory, 16-byte aligned): q, k, v, out: E4M3 [seq_len, num_heads, head_dim] (aldit's packed
   rows) under ATTENTION_FP8_ROWS, or [num_heads, seq_len, head_dim] under ATTENTION_FP8_HEAD_MAJOR; dout, dq, dk,
   dv: E5M2 in the same layout; stats fp32 [num_heads, seq_len].
   scales: device memory of ATTENTION_FP8_SCALE_FLOATS floats; the scalar of slot i (enum below) sits at
   scales[4 * i] (16-byte aligned for cuDNN). The calls read the scale slots and write the amax slots of their
   direction; a real training path would keep these per tensor with an amax history (issue 34, item 2).
   Plans are built on first use of a (direction, layout, seq_len, num_heads, head_dim) and cached in the context
   (ATTENTION_FP8_PLAN_SLOTS, oldest out). Work is queued on `stream`. A configuration cuDNN refuses (no engine,
   a plan that does not finalize, a plan whose execution cuDNN declines) is not fatal: the call returns 0 and
   attention_fp8_error says why; 1 when the work was queued. Other cuDNN failures (making the handle, descriptors)
   and bad arguments are fatal, naming file:line. */
#define ATTENTION_FP8_PLAN_SLOTS 256

typedef enum { ATTENTION_FP8_ROWS = 0, ATTENTION_FP8_HEAD_MAJOR = 1 } attention_fp8_layout;

enum attention_fp8_slot {
    ATTENTION_FP8_DESCALE_Q, ATTENTION_FP8_DESCALE_K, ATTENTION_FP8_DESCALE_V, ATTENTION_FP8_DESCALE_O,
    ATTENTION_FP8_DESCALE_DO, ATTENTION_FP8_DESCALE_S, ATTENTION_FP8_DESCALE_DP, ATTENTION_FP8_SCALE_S,
    ATTENTION_FP8_SCALE_O, ATTENTION_FP8_SCALE_DP, ATTENTION_FP8_SCALE_DQ, ATTENTION_FP8_SCALE_DK,
    ATTENTION_FP8_SCALE_DV, ATTENTION_FP8_AMAX_S, ATTENTION_FP8_AMAX_O, ATTENTION_FP8_AMAX_DP, ATTENTION_FP8_AMAX_DQ,
    ATTENTION_FP8_AMAX_DK, ATTENTION_FP8_AMAX_DV, ATTENTION_FP8_SLOTS
};
#define ATTENTION_FP8_SCALE_FLOATS (4 * ATTENTION_FP8_SLOTS)

typedef struct attention_fp8 attention_fp8;

/* A context on the current GPU (the cuDNN handle is made at the first call). */
attention_fp8 *attention_fp8_create(void);
/* Frees the plans, the workspace and the handle (waits for the GPU). NULL is a no-op. */
void attention_fp8_free(attention_fp8 *context);

/* The forward and the backward above; 1 when queued, 0 when cuDNN refuses the configuration. */
int attention_fp8_fwd(attention_fp8 *context, attention_fp8_layout layout, const void *q, const void *k,
                      const void *v, int64_t seq_len, int num_heads, int head_dim, void *out, float *stats,
                      float *scales, cudaStream_t stream);
int attention_fp8_bwd(attention_fp8 *context, attention_fp8_layout layout, const void *q, const void *k,
                      const void *v, const void *out, const void *dout, const float *stats, int64_t seq_len,
                      int num_heads, int head_dim, void *dq, void *dk, void *dv, float *scales, cudaStream_t stream);

/* Builds, if not cached yet, the forward plan of the shape (and the backward's with backward = 1), and grows the
   context's workspace to what they take, so that a call of it builds and allocates nothing; returns the plans built
   (a refused one is not counted: its calls return 0). */
int attention_fp8_prepare(attention_fp8 *context, attention_fp8_layout layout, int64_t seq_len, int num_heads,
                          int head_dim, int backward);

/* Fills a call's scales array (device) from values elsewhere on the device: slot i takes *sources[i] (NULL: 0, as an
   amax slot should be before a call), in one launch queued on `stream`. For a caller that keeps each tensor's scale
   with an amax history (delayed scaling, cuda/fp8.h) and hands each call the current values. */
void attention_fp8_load_scales(float *scales, const float *const sources[ATTENTION_FP8_SLOTS], cudaStream_t stream);

/* Why the last refused call was refused (the cuDNN call, its status and last error message); "" if none was. */
const char *attention_fp8_error(const attention_fp8 *context);

#ifdef __cplusplus
}
#endif

#endif
