/* attention_cudnn.h — cuDNN fused attention (self and cross) for one sample through cuDNN's C backend API (unified SDPA forward, composite backward graph), plans cached by shape in a caller-owned context. */
#ifndef ALDIT_ATTENTION_CUDNN_H
#define ALDIT_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Built only when configure finds cuDNN (HAVE_CUDNN). The semantics are attention_fwd / attention_bwd's
   (attention.h) for ONE sample whose seq_len_q query rows attend to its seq_len_kv key/value rows
   (cross-attention: the sample's tokens to its own text rows; self-attention is seq_len_kv == seq_len_q):
   non-causal softmax attention with scores scaled by 1/sqrt(head_dim), bf16 in and out, fp32 accumulation;
   no padding, no atomics in the forward.
   - q, out, dout, dq: bf16 [seq_len_q, num_heads * head_dim]; k, v, dk, dv: bf16 [seq_len_kv, num_heads *
     head_dim]; row-major (head h in columns [h * head_dim, (h + 1) * head_dim)), i.e. one sample's slices of
     the packed rows. Device memory, 16-byte aligned.
   - stats: fp32 [num_heads, seq_len_q] — HEAD-MAJOR (cuDNN's layout, not attention.h's lse [rows, heads]):
     the natural log of the sum of exp(scaled scores) per head and query row, written by the forward and
     read by the backward of the same sample. Device memory, 16-byte aligned.
   - head_dim: a multiple of 8 from 8 to 128; num_heads, seq_len_q, seq_len_kv >= 1.
   State lives in an attention_cudnn context (attention_cudnn_create), for the GPU current when it was made (a
   call on another GPU is fatal); one host thread per context. Execution plans are built on first use of a
   (direction, seq_len_q, seq_len_kv, num_heads, head_dim) and cached in the context (the last
   ATTENTION_CUDNN_PLAN_SLOTS shapes, least recently used out; a build takes 0.04-1 s on an H200; a training run
   needs four plans per (tokens, text length) pair of its long samples: 512 slots hold the 17 long shapes of
   inputs/mixed.lengths at several text lengths, and the MMDiT family's two plans per joint tile count, 82 of them in
   a 300-sample HunyuanVideo-1.5 store). The context keeps one device buffer for cuDNN's workspace and,
   in the backward, the fp32 softmax-sum [num_heads, seq_len_q] and fp32 dQ accumulator [num_heads, seq_len_q,
   head_dim]: about 4 * num_heads * seq_len_q * (head_dim + 1) bytes plus the plan's workspace — the query rows
   set its size — and, where the backward splits the query rows (below), 8 * batches * seq_len_kv * num_heads *
   head_dim bytes more; grown (cudaFree + cudaMalloc, which synchronises the device) when a longer sample comes.
   The backward's dQ goes through atomic adds: it is not bitwise reproducible. Work is queued on `stream`. A
   cuDNN failure is fatal, naming file:line, the call, cuDNN's status and its last error message. */
#define ATTENTION_CUDNN_PLAN_SLOTS 512

typedef struct attention_cudnn attention_cudnn;

/* A context on the current GPU (no cuDNN call yet: the handle is made at the first call that needs one).
   autotune ([train] autotune): cuDNN's heuristics pick an engine and knob values (tile shapes, ...) by a model.
   With autotuning, the first plan of each size class — direction, heads, head_dim, at most 1024 keys or more, and
   floor(log2(sqrt(seq_len_q * seq_len_kv))) from tune_least_rows (<= 0: ATTENTION_CUDNN_TUNE_LEAST_ROWS) on — also
   builds the heuristics' other configurations and the first one's engine with each knob swept over its range; its
   first call times them all (a synchronisation of the stream; about 2-4 runs each) and keeps the fastest; later
   plans of the class use the winner's engine and knobs where they build. Smaller shapes keep the heuristics'
   first. Timings decide, so runs may differ in which configuration they use. 0: the heuristics' first, the same
   in every run. */
#define ATTENTION_CUDNN_TUNE_LEAST_ROWS 4096
attention_cudnn *attention_cudnn_create(int autotune, int64_t tune_least_rows);
/* Free the plans, the buffer and the cuDNN handle (waits for the GPU). NULL is a no-op. */
void attention_cudnn_free(attention_cudnn *context);

/* 1 when cuDNN (newer than 9.15.0: older ones need a padding-mask workaround in the backward for key lengths
   that are not multiples of 128) is loaded, a GPU is present and the forward and backward plans build for
   this head count and head_dim, for self-attention and for cross-attention to a key length that is not a
   multiple of 64 (tried once per context at small lengths, then remembered); 0 otherwise, after one warning saying why. */
int attention_cudnn_available(attention_cudnn *context, int num_heads, int head_dim);

/* out = softmax(q k^T / sqrt(head_dim)) v per head, and stats for the backward. */
void attention_cudnn_cross_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                               int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim, gpu_bf16 *out,
                               float *stats, cudaStream_t stream);

/* dq, dk, dv (bf16, overwritten) from dout and the forward's out and stats. */
void attention_cudnn_cross_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                               const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats, int64_t seq_len_q,
                               int64_t seq_len_kv, int num_heads, int head_dim, gpu_bf16 *dq, gpu_bf16 *dk,
                               gpu_bf16 *dv, cudaStream_t stream);

/* Self-attention over whole tiles. On an H200, cuDNN's kernels run a sequence whose length is not a
   multiple of ATTENTION_CUDNN_TILE slower than the next multiple, though that has more rows
   (docs/PERFORMANCE.md, "Session 5"; a padding mask recovers little of it). These calls run the
   attention of one sample of seq_len rows on padded_rows = attention_cudnn_padded_rows(seq_len) rows instead,
   the rows past seq_len being ZERO in q, k and v (the caller zeroes them: this suits a sample whose buffers
   have the rows to spare, e.g. the last of a packed micro-batch), with the same results:
   - zero keys score 0, so each adds exp(0) = 1 to every row's softmax sum, and zero values add nothing to its
     output: the forward runs cuDNN's plan for padded_rows rows, then rescales each real row's out by
     Z / (Z - P) and its stats to log(Z - P) (Z = exp(stats), P = padded_rows - seq_len), which are the
     unpadded attention's. fp32 arithmetic; exact unless the real keys' sum is tiny against P (a row whose
     every score is below about -3 on a 75,600-key sample): where Z - P < Z / 4096 the row's out and stats
     are set to NaN, so that the step fails loudly instead of losing precision.
   - the backward, given those out and stats and dout with ZERO pad rows, gives the real rows' dq, dk, dv
     exactly: the zero keys add nothing to dq, and the pad query rows (zero dout) nothing to dk, dv.
   out, dout, dq, dk, dv span padded_rows rows (the pad rows of out, dq, dk, dv get scratch values); stats is
   [num_heads, padded_rows], head-major. */
#define ATTENTION_CUDNN_TILE 128
int64_t attention_cudnn_padded_rows(int64_t seq_len);
void attention_cudnn_fwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                                int64_t seq_len, int64_t padded_rows, int num_heads, int head_dim, gpu_bf16 *out,
                                float *stats, cudaStream_t stream);
/* The forward's correction alone (what attention_cudnn_fwd_padded does after its cuDNN call): out [padded_rows,
   num_heads, head_dim] and stats [num_heads, padded_rows] of a forward run on padded_rows rows of which the rows past
   seq_len were zero in q, k and v (any such forward, e.g. cuda/attention_fp8.h's, its output in bf16) become the
   unpadded attention's. Nothing is done where padded_rows == seq_len. */
void attention_cudnn_rescale_padded(gpu_bf16 *out, float *stats, int64_t seq_len, int64_t padded_rows, int num_heads,
                                    int head_dim, cudaStream_t stream);
void attention_cudnn_bwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                                const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats, int64_t seq_len,
                                int64_t padded_rows, int num_heads, int head_dim, gpu_bf16 *dq, gpu_bf16 *dk,
                                gpu_bf16 *dv, cudaStream_t stream);

/* Self-attention: the calls above with seq_len_kv = seq_len_q = seq_len. */
void attention_cudnn_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                         int64_t seq_len, int num_heads, int head_dim, gpu_bf16 *out, float *stats, cudaStream_t stream);
void attention_cudnn_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                         const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats, int64_t seq_len, int num_heads,
                         int head_dim, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv, cudaStream_t stream);

/* The backward of a shape with few keys (at most 1024: cross-attention to the text) splits the query rows into
   2, 4 or 8 batches of at least 512 rows against copies of the keys, so that cuDNN's grid, laid over key tiles,
   fills the GPU; the batches' dK and dV come out as bf16 pieces, added up in fp32 in order (no atomics) before the
   rounding to bf16. */
#define ATTENTION_CUDNN_MOST_QUERY_BATCHES 8

/* Build, if not cached yet, the forward and backward plans a call of this shape uses (the self-attention's on padded
   rows: seq_len_q = seq_len_kv = attention_cudnn_padded_rows(seq_len)), so that the call builds none; autotuning, where
   on, still runs at the class's first call. Returns the plans built (fatal where one does not build). */
int attention_cudnn_prepare(attention_cudnn *context, int64_t seq_len_q, int64_t seq_len_kv, int num_heads,
                            int head_dim);

/* The one-time work done inside calls so far: execution plans built (each a cuDNN finalize on the host, 0.04-1 s)
   and the host seconds the builds and the autotuning rounds took (a round synchronises the stream). */
void attention_cudnn_setup_stats(const attention_cudnn *context, int64_t *plans_built, double *seconds);

/* One line per size class the context tuned: the shape that was timed, its candidates, the heuristics' first and
   the kept configuration (engine index, knob type=value) with their least times. */
void attention_cudnn_tuning_report(const attention_cudnn *context, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
