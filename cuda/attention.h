/* attention.h — flash attention on the GPU over packed variable-length samples (forward and backward, bf16, fp32 accumulation). */
#ifndef ALDIT_ATTENTION_H
#define ALDIT_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The semantics are cpu_attention_fwd / cpu_attention_bwd's (src/ops_cpu.h): non-causal softmax
   attention with scores scaled by 1/sqrt(head_dim), where the query rows of sample b,
   [q_row_start[b], q_row_start[b+1]), attend only to its key/value rows [kv_row_start[b], kv_row_start[b+1])
   (self-attention: the same offsets; cross-attention: each sample's own text rows). No padding.
   - q, out, dout, dq: bf16 [n_q_rows, num_heads * head_dim]; k, v, dk, dv: bf16 [n_kv_rows, num_heads * head_dim],
     row-major, head h in columns [h * head_dim, (h + 1) * head_dim). Device memory, 16-byte aligned.
   - q_row_start, kv_row_start: n_samples + 1 int64 offsets in DEVICE memory, non-decreasing absolute row
     numbers of q / k (a sample may have 0 query or 0 key rows). They usually start at 0; a caller may pass
     a slice of a longer offsets array to run a subset of samples, with n_q_rows / n_kv_rows at least the
     last offset (the grid is sized by them; tiles outside the samples return at once). They are not read back to the
     host (no synchronisation), so they are not checked: keep them right.
   - lse: fp32 [n_q_rows, num_heads] (the CPU oracle's layout), natural log of the sum of exp(scaled scores)
     of each query row and head; a row of a sample with no key rows gets -INFINITY and a zero output row.
   - head_dim: a multiple of 16 from 16 to ATTENTION_MAX_HEAD_DIM; num_heads from 1 to 65535.
   Everything is queued on `stream`; nothing synchronises the host. Outputs must not alias inputs.
   Arithmetic: tensor-core bf16 products with fp32 accumulation; softmax statistics in fp32; the
   probabilities enter the second product rounded to bf16. The backward writes every output once, with no
   atomics: its results are bitwise reproducible. */
#define ATTENTION_MAX_HEAD_DIM 128

/* 1 when the kernels handle this head_dim, 0 otherwise. */
int attention_head_dim_supported(int head_dim);

/* out = softmax(q k^T / sqrt(head_dim)) v per sample and head, and lse for the backward. */
void attention_fwd(const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, int num_heads, int head_dim,
                   const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples, int64_t n_q_rows,
                   int64_t n_kv_rows, gpu_bf16 *out, float *lse, cudaStream_t stream);

/* Gradients dq, dk, dv (bf16, overwritten; key rows no query attends to get zeros) from dout and the
   forward's out and lse; the probabilities are recomputed from q, k and lse. workspace: at least
   attention_bwd_workspace_bytes(n_q_rows, num_heads) bytes of device memory (it holds rowsum(dout * out)). */
size_t attention_bwd_workspace_bytes(int64_t n_q_rows, int num_heads);
void attention_bwd(const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, const gpu_bf16 *out,
                   const gpu_bf16 *dout, const float *lse, int num_heads, int head_dim, const int64_t *q_row_start,
                   const int64_t *kv_row_start, int n_samples, int64_t n_q_rows, int64_t n_kv_rows, gpu_bf16 *dq,
                   gpu_bf16 *dk, gpu_bf16 *dv, void *workspace, cudaStream_t stream);

/* Floating-point operations for benchmarks, from HOST copies of the offsets: forward
   4 * S_q * S_kv * head_dim * num_heads summed over samples (the two matrix products), backward 2.5 times that. */
double attention_fwd_flops(const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples, int num_heads,
                           int head_dim);
double attention_bwd_flops(const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples, int num_heads,
                           int head_dim);

#ifdef __cplusplus
}
#endif

#endif
