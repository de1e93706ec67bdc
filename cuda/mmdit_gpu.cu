// mmdit_gpu.cu — HunyuanVideo-1.5's MMDiT on one GPU: the family's workspace, small kernels, and the packed forward/backward of the rectified-flow loss.
//
// The order of operations is mmdit.c's (the oracle). The video and text streams keep their rows in two packed
// buffers: each stream's LN-modulate (lnmod), GEMMs (cuBLASLt), per-head q/k RMSNorm (+ RoPE on video, fused.h's
// fused_head_norm_rope) and MLP run over its buffer whole. The joint attention gathers q, k and v of both streams
// into the joint layout (mmdit_gpu.h: each sample's [video; text] rows contiguous; samples on cuDNN from a tile
// boundary with zero rows to their last whole tile) and scatters the output back; the backward gathers the
// output's gradient and scatters dq, dk, dv. The gather costs two passes over 3 (N + L) rows per block against the
// block's GEMMs' 24 D + 4 F values per row; it buys one cuDNN plan per tile count (a layout of the streams' own
// buffers could not give the samples whole tiles) and keeps both streams' GEMMs one call each.
//
// Everything per sample (the time embedding, the modulation Linears of every block, the refiner's conditioning and
// gates, the head's) runs in fp32 on the B rows: time_embed on fp32 weights (time_weights), the rest on the bf16
// copies (their weights lie in the blocks and the embeddings, which a sharded state gathers in bf16).
//
// With block recomputation a block keeps its two inputs (x_in, c_in, bf16) and its modulation vectors; the other
// activations of every block share one set. Walking back, after block l's backward block l - 1's forward is re-run
// from its kept inputs (the same kernels on the same values: the results are those of GPU_RECOMPUTE_NONE), with
// the parameter source's calls in model_gpu.cu's order.
#include "cuda/carver.cuh"
#include "cuda/mmdit_gpu.h"

#include "config.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/attention.h"
#ifdef HAVE_CUDNN
#include "cuda/attention_cudnn.h"
#endif
#include "cuda/fused.h"
#include "cuda/kernels_misc.h"
#include "cuda/lnmod.h"

extern "C" {
#include "model/ops_cpu.h"
}

namespace {

// ---- small kernels ---------------------------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kTile = 128;   // cuDNN's whole tiles (ATTENTION_CUDNN_TILE where built with cuDNN)
#ifdef HAVE_CUDNN
static_assert(kTile == ATTENTION_CUDNN_TILE, "the joint layout's tile is cuDNN's");
#endif

unsigned blocks_for(int64_t n) { return gpu_grid_blocks(n, kThreads, 1048576); }

#define FOR_EACH_INDEX(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ __forceinline__ float bf(gpu_bf16 bits) { return __uint_as_float((uint32_t)bits << 16); }

__device__ __forceinline__ gpu_bf16 to_bf(float value)
{
    const __nv_bfloat16 rounded = __float2bfloat16_rn(value);
    return *reinterpret_cast<const gpu_bf16 *>(&rounded);
}

// The sample whose rows [start[b], start[b+1]) hold `row` (start: n + 1 non-decreasing offsets).
__device__ __forceinline__ int sample_of(const int64_t *start, int n, int64_t row)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (start[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Patchify: tokens_in [N, cols] bf16 holds x_t = (1 - sigma) x0 + sigma noise in the first out_dim channels' values
// (c, p, q, r); past them the condition latent and the mask: zeros for a text-to-video sample, and for an
// image-to-video one (i2v[b] = 1) x0's first latent frame in the condition channels and 1 in the mask on that frame
// (the CPU model's put_condition); zeros in the GEMM's padding columns. x0_tokens and noise_tokens [N, patch_out]
// fp32 in the same (c, p, q, r) order, the head's (channel-major). A member of a sequence-parallel group patchifies
// its rows only: first[b] is the index within sample b of its first row here (NULL: 0, the whole micro-batch).
struct patchify_args {
    const float *x0, *noise, *sigma;
    const int64_t *token_start, *latent_start, *first;
    const int32_t *shape, *i2v;
    int n_samples, out_dim, patch_t, patch_h, patch_w, patch_in, cols;
    int64_t n_tokens;
    gpu_bf16 *tokens_in;
    float *x0_tokens, *noise_tokens;
};

__global__ void patchify_kernel(const patchify_args a)
{
    const int volume = a.patch_t * a.patch_h * a.patch_w, patch_out = a.out_dim * volume;
    FOR_EACH_INDEX(i, a.n_tokens * a.cols) {
        const int64_t token = i / a.cols;
        const int col = (int)(i % a.cols);
        if (col >= 2 * patch_out + volume) {
            a.tokens_in[i] = 0;
            continue;
        }
        const int b = sample_of(a.token_start, a.n_samples, token);
        const int64_t local = token - a.token_start[b] + (a.first ? a.first[b] : 0);
        const int f = a.shape[3 * b], h = a.shape[3 * b + 1], w = a.shape[3 * b + 2];
        const int gh = h / a.patch_h, gw = w / a.patch_w;
        const int64_t fi = local / ((int64_t)gh * gw), hi = (local / gw) % gh, wi = local % gw;
        const int c = col / volume, rem = col % volume;
        const int p = rem / (a.patch_h * a.patch_w), q = (rem / a.patch_w) % a.patch_h, r = rem % a.patch_w;
        const int64_t frame = fi * a.patch_t + p;
        if (col >= patch_out) {   // condition channel c - out_dim, or the mask (c = 2 out_dim): frame 0 of an I2V sample
            float value = 0.0f;
            if (a.i2v[b] && frame == 0)
                value = c == 2 * a.out_dim ? 1.0f
                        : a.x0[a.latent_start[b] + (((int64_t)(c - a.out_dim) * f) * h + hi * a.patch_h + q) * w +
                               wi * a.patch_w + r];
            a.tokens_in[i] = to_bf(value);
            continue;
        }
        const int64_t at = a.latent_start[b] + (((int64_t)c * f + frame) * h + hi * a.patch_h + q) * w +
                           wi * a.patch_w + r;
        const float sigma = a.sigma[b], x0 = a.x0[at], eps = a.noise[at];
        a.tokens_in[i] = to_bf((1.0f - sigma) * x0 + sigma * eps);
        a.x0_tokens[token * patch_out + col] = x0;
        a.noise_tokens[token * patch_out + col] = eps;
    }
}

// y = x W^T + b over a few fp32 rows (one per sample) with a bf16 weight [out, in]. chunk > 0: y (and dy) is
// chunk-major [out / chunk][rows][chunk] (modulation vectors): output o of row r at row_offset(o) + r * row_stride.
__device__ __forceinline__ int64_t row_offset(int o, int rows, int out, int chunk)
{
    return chunk > 0 ? (int64_t)(o / chunk) * rows * chunk + o % chunk : o;
}

__device__ __forceinline__ int64_t row_stride(int out, int chunk) { return chunk > 0 ? chunk : out; }

__device__ __forceinline__ void unpack8(const uint4 v, float f[8])
{
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[2 * k] = __uint_as_float(words[k] << 16);
        f[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
}

// The tiled forms (in a multiple of 8, 16-byte aligned weight and x): a block's warps take kLinOuts outputs each;
// the rows go in tiles of kLinRows, the inputs in chunks of kLinCols staged in shared memory, one 8-value vector of
// each output's weight per lane and chunk: the weight is read once per row tile, x once per block and row tile.
constexpr int kLinRows = 8, kLinOuts = 8, kLinCols = 256, kLinWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) rows_linear_fwd_tiled_kernel(const float *x, int rows, int in, int out,
                                                                         const gpu_bf16 *weight, const gpu_bf16 *bias,
                                                                         int chunk, float *y)
{
    __shared__ __align__(16) float xs[kLinRows][kLinCols];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int o0 = (blockIdx.x * kLinWarps + warp) * kLinOuts;
    for (int r0 = 0; r0 < rows; r0 += kLinRows) {
        const int nr = min(kLinRows, rows - r0);
        float acc[kLinOuts][kLinRows];
#pragma unroll
        for (int j = 0; j < kLinOuts; ++j)
#pragma unroll
            for (int r = 0; r < kLinRows; ++r) acc[j][r] = 0.0f;
        for (int c0 = 0; c0 < in; c0 += kLinCols) {
            __syncthreads();
            for (int k = threadIdx.x; k < kLinRows * kLinCols / 4; k += kThreads) {
                const int r = k / (kLinCols / 4), c = (k % (kLinCols / 4)) * 4;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r < nr && c0 + c < in) v = *reinterpret_cast<const float4 *>(x + (int64_t)(r0 + r) * in + c0 + c);
                *reinterpret_cast<float4 *>(&xs[r][c]) = v;
            }
            __syncthreads();
            const int col = c0 + lane * 8;
            if (col >= in) continue;
            float xv[kLinRows][8];
#pragma unroll
            for (int r = 0; r < kLinRows; ++r)
#pragma unroll
                for (int k = 0; k < 8; ++k) xv[r][k] = xs[r][lane * 8 + k];
#pragma unroll
            for (int j = 0; j < kLinOuts; ++j) {
                if (o0 + j >= out) break;
                float w[8];
                unpack8(*reinterpret_cast<const uint4 *>(weight + (int64_t)(o0 + j) * in + col), w);
#pragma unroll
                for (int r = 0; r < kLinRows; ++r)
#pragma unroll
                    for (int k = 0; k < 8; ++k) acc[j][r] += xv[r][k] * w[k];
            }
        }
#pragma unroll
        for (int j = 0; j < kLinOuts; ++j)
#pragma unroll
            for (int r = 0; r < kLinRows; ++r) {
                float sum = acc[j][r];
                for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
                const int o = o0 + j;
                if (lane == 0 && r < nr && o < out)
                    y[row_offset(o, rows, out, chunk) + (int64_t)(r0 + r) * row_stride(out, chunk)] = sum + bf(bias[o]);
            }
    }
}

// Any in and alignment: one warp per output, its lanes over the inputs, rows in turn.
__global__ void rows_linear_fwd_kernel(const float *x, int rows, int in, int out, const gpu_bf16 *weight,
                                       const gpu_bf16 *bias, int chunk, float *y)
{
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t o = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; o < out; o += warps) {
        const gpu_bf16 *w = weight + o * in;
        for (int r = 0; r < rows; ++r) {
            float sum = 0.0f;
            for (int i = lane; i < in; i += 32) sum += x[(int64_t)r * in + i] * bf(w[i]);
            for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
            if (lane == 0) y[row_offset((int)o, rows, out, chunk) + (int64_t)r * row_stride(out, chunk)] = sum + bf(bias[o]);
        }
    }
}

// dW[o, i] += sum_r dy[r, o] x[r, i]; db[o] += sum_r dy[r, o] (rows in order). `quads`: four inputs per thread
// (in a multiple of 4, x and dW 16-byte aligned), else one.
__global__ void rows_linear_dweight_kernel(const float *x, const float *dy, int rows, int in, int out, int chunk,
                                           int quads, float *dweight, float *dbias)
{
    const int width = quads ? 4 : 1, per_row = in / width;
    const int64_t stride = row_stride(out, chunk);
    FOR_EACH_INDEX(k, (int64_t)out * per_row) {
        const int o = (int)(k / per_row), i = (int)(k % per_row) * width;
        const float *d = dy + row_offset(o, rows, out, chunk);
        float *dw = dweight + (int64_t)o * in + i;
        if (quads) {
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int r = 0; r < rows; ++r) {
                const float g = d[r * stride];
                const float4 v = *reinterpret_cast<const float4 *>(x + (int64_t)r * in + i);
                sum.x += g * v.x; sum.y += g * v.y; sum.z += g * v.z; sum.w += g * v.w;
            }
            float4 w = *reinterpret_cast<float4 *>(dw);
            w.x += sum.x; w.y += sum.y; w.z += sum.z; w.w += sum.w;
            *reinterpret_cast<float4 *>(dw) = w;
        } else {
            float sum = 0.0f;
            for (int r = 0; r < rows; ++r) sum += d[r * stride] * x[(int64_t)r * in + i];
            *dw += sum;
        }
        if (i == 0) {
            float bias_sum = 0.0f;
            for (int r = 0; r < rows; ++r) bias_sum += d[r * stride];
            dbias[o] += bias_sum;
        }
    }
}

// dx[r, i] (+)= sum_o dy[r, o] W[o, i], the outputs cut into `slices` ranges (threads enough for the GPU with few
// rows): partial[slice][r][i], then their sum in slice order (deterministic). The tiled form (in a multiple of 8,
// a 16-byte aligned weight): a thread takes 8 inputs of a tile of kLinRows rows, reading each weight vector once per
// row tile; grid (in / 8 x slices, row tiles).
__global__ void __launch_bounds__(kThreads) rows_linear_dx_tiled_kernel(const float *dy, int rows, int in, int out,
                                                                        int chunk, const gpu_bf16 *weight, int slices,
                                                                        float *partial)
{
    const int vecs = in / 8;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)vecs * slices) return;
    const int slice = (int)(t / vecs), i = (int)(t % vecs) * 8, r0 = blockIdx.y * kLinRows;
    const int nr = min(kLinRows, rows - r0);
    const int first = (int)((int64_t)out * slice / slices), last = (int)((int64_t)out * (slice + 1) / slices);
    const int64_t stride = row_stride(out, chunk);
    float acc[kLinRows][8];
#pragma unroll
    for (int r = 0; r < kLinRows; ++r)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[r][k] = 0.0f;
    for (int o = first; o < last; ++o) {
        float w[8];
        unpack8(*reinterpret_cast<const uint4 *>(weight + (int64_t)o * in + i), w);
        const float *d = dy + row_offset(o, rows, out, chunk) + (int64_t)r0 * stride;
#pragma unroll
        for (int r = 0; r < kLinRows; ++r) {
            const float g = r < nr ? d[r * stride] : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[r][k] += g * w[k];
        }
    }
    const int64_t n = (int64_t)rows * in;
#pragma unroll
    for (int r = 0; r < kLinRows; ++r) {
        if (r >= nr) break;
        float *p = partial + slice * n + (int64_t)(r0 + r) * in + i;
        *reinterpret_cast<float4 *>(p) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        *reinterpret_cast<float4 *>(p + 4) = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
    }
}

__global__ void rows_linear_dx_partial_kernel(const float *dy, int rows, int in, int out, int chunk,
                                              const gpu_bf16 *weight, int slices, float *partial)
{
    const int64_t n = (int64_t)rows * in, stride = row_stride(out, chunk);
    FOR_EACH_INDEX(k, slices * n) {
        const int slice = (int)(k / n), r = (int)(k % n / in), i = (int)(k % in);
        const int first = (int)((int64_t)out * slice / slices), last = (int)((int64_t)out * (slice + 1) / slices);
        float sum = 0.0f;
        for (int o = first; o < last; ++o)
            sum += dy[row_offset(o, rows, out, chunk) + r * stride] * bf(weight[(int64_t)o * in + i]);
        partial[k] = sum;
    }
}

__global__ void rows_linear_dx_sum_kernel(const float *partial, int slices, int64_t n, int accumulate, float *dx)
{
    FOR_EACH_INDEX(k, n) {
        float sum = 0.0f;
        for (int slice = 0; slice < slices; ++slice) sum += partial[slice * n + k];
        dx[k] = accumulate ? dx[k] + sum : sum;
    }
}

__global__ void silu_bf16_kernel(const gpu_bf16 *x, int64_t n, gpu_bf16 *y)
{
    FOR_EACH_INDEX(i, n) {
        const float v = bf(x[i]);
        y[i] = to_bf(v / (1.0f + expf(-v)));
    }
}

__global__ void silu_bf16_bwd_kernel(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n, gpu_bf16 *dx)
{
    FOR_EACH_INDEX(i, n) {
        const float v = bf(x[i]), s = 1.0f / (1.0f + expf(-v));
        dx[i] = to_bf(bf(dy[i]) * s * (1.0f + v * (1.0f - s)));
    }
}

__global__ void gelu_erf_kernel(const gpu_bf16 *x, int64_t n, gpu_bf16 *y)
{
    FOR_EACH_INDEX(i, n) {
        const float v = bf(x[i]);
        y[i] = to_bf(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
    }
}

__global__ void gelu_erf_bwd_kernel(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n, gpu_bf16 *dx)
{
    FOR_EACH_INDEX(i, n) {
        const float v = bf(x[i]);
        const float d = 0.5f * (1.0f + erff(v * 0.70710678118654752f)) + v * 0.39894228040143268f * expf(-0.5f * v * v);
        dx[i] = to_bf(bf(dy[i]) * d);
    }
}

// An affine LayerNorm's weight and bias (bf16 [dim]) as LN-modulate vectors for n samples: shift = bias,
// scale = weight - 1 (exact for weights in [0.5, 2]).
__global__ void affine_vectors_kernel(const gpu_bf16 *weight, const gpu_bf16 *bias, int n_samples, int dim,
                                      float *shift, float *scale)
{
    FOR_EACH_INDEX(i, (int64_t)n_samples * dim) {
        const int c = (int)(i % dim);
        shift[i] = bf(bias[c]);
        scale[i] = bf(weight[c]) - 1.0f;
    }
}

// out = x + y * gate_b per row of sample b (out may be x).
__global__ void gated_residual_kernel(const gpu_bf16 *x, const gpu_bf16 *y, const float *gate, const int64_t *start,
                                      int n_samples, int64_t n_rows, int dim, gpu_bf16 *out)
{
    FOR_EACH_INDEX(i, n_rows * dim) {
        const int64_t row = i / dim;
        const int b = sample_of(start, n_samples, row);
        out[i] = to_bf(bf(x[i]) + bf(y[i]) * gate[(int64_t)b * dim + i % dim]);
    }
}

// dy = dout * gate_b.
__global__ void gated_residual_dy_kernel(const gpu_bf16 *dout, const float *gate, const int64_t *start, int n_samples,
                                         int64_t n_rows, int dim, gpu_bf16 *dy)
{
    FOR_EACH_INDEX(i, n_rows * dim) {
        const int b = sample_of(start, n_samples, i / dim);
        dy[i] = to_bf(bf(dout[i]) * gate[(int64_t)b * dim + i % dim]);
    }
}

// dgate[b, c] = sum over b's rows of dout * y, in two passes: each sample's rows cut into `parts` equal ranges,
// partial[b][part][c] over a range (rows in order, two columns a thread: dim even), then the parts summed in order.
__global__ void gate_sum_partial_kernel(const gpu_bf16 *dout, const gpu_bf16 *y, const int64_t *start, int n_samples,
                                        int dim, int parts, float *partial)
{
    const int pairs = dim / 2;
    FOR_EACH_INDEX(i, (int64_t)n_samples * parts * pairs) {
        const int64_t bp = i / pairs;
        const int c = (int)(i % pairs) * 2, b = (int)(bp / parts), part = (int)(bp % parts);
        const int64_t n = start[b + 1] - start[b];
        const int64_t lo = start[b] + n * part / parts, hi = start[b] + n * (part + 1) / parts;
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
        for (int64_t r = lo; r < hi; ++r) {
            const uint32_t g = *reinterpret_cast<const uint32_t *>(dout + r * dim + c);
            const uint32_t v = *reinterpret_cast<const uint32_t *>(y + r * dim + c);
            s0 += __uint_as_float(g << 16) * __uint_as_float(v << 16);
            s1 += __uint_as_float(g & 0xffff0000u) * __uint_as_float(v & 0xffff0000u);
        }
        partial[bp * dim + c] = s0;
        partial[bp * dim + c + 1] = s1;
    }
}

__global__ void parts_sum_kernel(const float *partial, int n_groups, int parts, int dim, int accumulate, float *out)
{
    FOR_EACH_INDEX(i, (int64_t)n_groups * dim) {
        const int64_t g = i / dim;
        const int c = (int)(i % dim);
        float sum = 0.0f;
        for (int part = 0; part < parts; ++part) sum += partial[(g * parts + part) * dim + c];
        out[i] = accumulate ? out[i] + sum : sum;
    }
}

// pooled[b, c] = mean of the caption's rows (double sums, as the CPU model).
__global__ void pool_mean_kernel(const float *text, const int64_t *start, int n_samples, int dim, float *pooled)
{
    FOR_EACH_INDEX(i, (int64_t)n_samples * dim) {
        const int b = (int)(i / dim), c = (int)(i % dim);
        double sum = 0.0;
        for (int64_t r = start[b]; r < start[b + 1]; ++r) sum += text[r * dim + c];
        const int64_t n = start[b + 1] - start[b];
        pooled[i] = n > 0 ? (float)(sum / (double)n) : 0.0f;
    }
}

// The joint layout: row j holds video row map[j] (< n_video), text row map[j] - n_video, or zeros (map -1).
__global__ void joint_gather_kernel(const int32_t *map, int64_t n_joint, const uint4 *video, const uint4 *text,
                                    int64_t n_video, int vecs, uint4 *joint)
{
    FOR_EACH_INDEX(i, n_joint * vecs) {
        const int64_t j = i / vecs, v = i % vecs, src = map[j];
        joint[i] = src < 0 ? make_uint4(0, 0, 0, 0) : src < n_video ? video[src * vecs + v] : text[(src - n_video) * vecs + v];
    }
}

__global__ void joint_scatter_kernel(const int32_t *map, int64_t n_joint, const uint4 *joint, int64_t n_video, int vecs,
                                     uint4 *video, uint4 *text)
{
    FOR_EACH_INDEX(i, n_joint * vecs) {
        const int64_t j = i / vecs, v = i % vecs, src = map[j];
        if (src < 0) continue;
        if (src < n_video) video[src * vecs + v] = joint[i];
        else text[(src - n_video) * vecs + v] = joint[i];
    }
}

// The exchange of a sequence-parallel group: a member's rows of both streams (video [n_video, D], then text) split by
// columns, part q [n][D/k] holding columns [q D/k, (q+1) D/k) (16-byte vectors: D/k a multiple of 8); and back.
__global__ void split_streams_kernel(const uint4 *video, const uint4 *text, int64_t n_video, int64_t n, int vecs,
                                     int parts, uint4 *out)
{
    const int part_vecs = vecs / parts;
    FOR_EACH_INDEX(i, n * vecs) {
        const int64_t r = i / vecs;
        const int v = (int)(i % vecs);
        out[((int64_t)(v / part_vecs) * n + r) * part_vecs + v % part_vecs] = r < n_video ? video[i] : text[i - n_video * vecs];
    }
}

__global__ void join_streams_kernel(const uint4 *in, int64_t n_video, int64_t n, int vecs, int parts, uint4 *video,
                                    uint4 *text)
{
    const int part_vecs = vecs / parts;
    FOR_EACH_INDEX(i, n * vecs) {
        const int64_t r = i / vecs;
        const int v = (int)(i % vecs);
        const uint4 value = in[((int64_t)(v / part_vecs) * n + r) * part_vecs + v % part_vecs];
        if (r < n_video) video[i] = value;
        else text[i - n_video * vecs] = value;
    }
}

// The joint text: row r is source kind(map[r]) (0 Qwen, 1 ByT5, 2 image), its row row(map[r]), plus the kind's type
// embedding (fp32 [3, dim]).
constexpr int kKindShift = 29;
__host__ __device__ __forceinline__ int32_t text_code(int kind, int64_t row) { return (int32_t)(((int64_t)kind << kKindShift) | row); }

__global__ void text_assemble_kernel(const int32_t *map, int64_t n_text, int dim, const gpu_bf16 *qwen,
                                     const gpu_bf16 *byt5, const gpu_bf16 *image, const float *type, gpu_bf16 *out)
{
    FOR_EACH_INDEX(i, n_text * dim) {
        const int64_t r = i / dim;
        const int c = (int)(i % dim), kind = map[r] >> kKindShift;
        const int64_t row = map[r] & ((1 << kKindShift) - 1);
        const gpu_bf16 *src = kind == 0 ? qwen : kind == 1 ? byt5 : image;
        out[i] = to_bf(bf(src[row * dim + c]) + type[kind * dim + c]);
    }
}

__global__ void text_split_kernel(const int32_t *map, int64_t n_text, int dim, const gpu_bf16 *d_text, gpu_bf16 *d_qwen,
                                  gpu_bf16 *d_byt5, gpu_bf16 *d_image)
{
    FOR_EACH_INDEX(i, n_text * dim) {
        const int64_t r = i / dim;
        const int c = (int)(i % dim), kind = map[r] >> kKindShift;
        const int64_t row = map[r] & ((1 << kKindShift) - 1);
        gpu_bf16 *dst = kind == 0 ? d_qwen : kind == 1 ? d_byt5 : d_image;
        dst[row * dim + c] = d_text[i];
    }
}

// d_type[kind, c] += sum over the rows of that kind, in two passes: the rows cut into `parts` equal ranges,
// partial[kind][part][c] over a range (rows in order), then parts_sum_kernel.
__global__ void type_grad_partial_kernel(const int32_t *map, int64_t n_text, int dim, int parts, const gpu_bf16 *d_text,
                                         float *partial)
{
    FOR_EACH_INDEX(i, (int64_t)parts * dim) {
        const int part = (int)(i / dim), c = (int)(i % dim);
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
        for (int64_t r = n_text * part / parts; r < n_text * (part + 1) / parts; ++r) {
            const int kind = map[r] >> kKindShift;
            const float v = bf(d_text[r * dim + c]);
            s0 += kind == 0 ? v : 0.0f;
            s1 += kind == 1 ? v : 0.0f;
            s2 += kind == 2 ? v : 0.0f;
        }
        partial[(int64_t)part * dim + c] = s0;
        partial[((int64_t)parts + part) * dim + c] = s1;
        partial[((int64_t)2 * parts + part) * dim + c] = s2;
    }
}

// dst [rows, wide] = src [rows, narrow] and zero columns; and back: dst [rows, narrow] += src [rows, wide]'s columns.
__global__ void pad_columns_kernel(const gpu_bf16 *src, int64_t rows, int narrow, int wide, gpu_bf16 *dst)
{
    FOR_EACH_INDEX(i, rows * wide) {
        const int64_t r = i / wide;
        const int c = (int)(i % wide);
        dst[i] = c < narrow ? src[r * narrow + c] : (gpu_bf16)0;
    }
}

__global__ void add_columns_kernel(const float *src, int64_t rows, int narrow, int wide, float *dst)
{
    FOR_EACH_INDEX(i, rows * narrow) dst[i] += src[(i / narrow) * wide + i % narrow];
}

#define LAUNCH(kernel, n, ...)                                              \
    do {                                                                    \
        if ((n) > 0) kernel<<<blocks_for(n), kThreads, 0, stream>>>(__VA_ARGS__); \
        CUDA_CHECK_LAUNCH();                                                \
    } while (0)

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void rows_linear_fwd(const float *x, int rows, int in, int out, const gpu_bf16 *w, const layout_linear &lin, int chunk,
                     float *y, cudaStream_t stream)
{
    if (rows <= 0) return;
    const gpu_bf16 *weight = w + lin.weight;
    if (in % 8 == 0 && aligned16(weight) && aligned16(x)) {
        const int per_block = kLinWarps * kLinOuts;
        rows_linear_fwd_tiled_kernel<<<(out + per_block - 1) / per_block, kThreads, 0, stream>>>(x, rows, in, out, weight,
                                                                                               w + lin.bias, chunk, y);
    } else {
        rows_linear_fwd_kernel<<<blocks_for((int64_t)out * 32), kThreads, 0, stream>>>(x, rows, in, out, weight,
                                                                                     w + lin.bias, chunk, y);
    }
    CUDA_CHECK_LAUNCH();
}

// dW, db added into g (the unit's gradients); dx (NULL: none) overwritten or added into, through partial sums over
// slices of the outputs in `scratch` (enough threads for the GPU, as many as its bytes hold).
void rows_linear_bwd(const float *x, const float *dy, int rows, int in, int out, const gpu_bf16 *w, float *g,
                     const layout_linear &lin, int chunk, float *dx, int accumulate, void *scratch, size_t scratch_bytes,
                     cudaStream_t stream)
{
    const int quads = in % 4 == 0 && aligned16(x) && aligned16(g + lin.weight);
    LAUNCH(rows_linear_dweight_kernel, (int64_t)out * (quads ? in / 4 : in), x, dy, rows, in, out, chunk, quads,
           g + lin.weight, g + lin.bias);
    if (!dx || rows <= 0) return;
    const gpu_bf16 *weight = w + lin.weight;
    const int tiled = in % 8 == 0 && aligned16(weight);
    const int64_t n = (int64_t)rows * in, room = (int64_t)(scratch_bytes / sizeof(float)) / n;
    ALDIT_CHECK(room >= 1, "gpu model: the scratch holds no [%d, %d] partial sum", rows, in);
    // the tiled form: about 64k threads over the inputs' vectors and the row tiles, each slice at least 16 outputs
    const int64_t tiles = (rows + kLinRows - 1) / kLinRows, want = 65536 / ((int64_t)in / 8 * tiles) + 1;
    const int64_t most = tiled ? (want < out / 16 ? want : out / 16) : 64;
    const int slices = (int)(room < most ? room : most < 1 ? 1 : most);
    float *partial = static_cast<float *>(scratch);
    if (tiled) {
        const dim3 grid((unsigned)((in / 8 * (int64_t)slices + kThreads - 1) / kThreads), (unsigned)tiles);
        rows_linear_dx_tiled_kernel<<<grid, kThreads, 0, stream>>>(dy, rows, in, out, chunk, weight, slices, partial);
        CUDA_CHECK_LAUNCH();
    } else {
        LAUNCH(rows_linear_dx_partial_kernel, slices * n, dy, rows, in, out, chunk, weight, slices, partial);
    }
    LAUNCH(rows_linear_dx_sum_kernel, n, partial, slices, n, accumulate, dx);
}

// Parts for a two-pass sum over `rows` rows in `groups` groups: about 8 rows a part (threads enough for a GPU with few
// long samples), at most 256 parts a group and as many as the scratch holds ([groups][parts][dim] floats).
int sum_parts(int64_t rows, int groups, int dim, size_t scratch_bytes)
{
    const int64_t room = (int64_t)(scratch_bytes / sizeof(float)) / ((int64_t)groups * dim);
    int64_t parts = rows / ((int64_t)groups * 8) + 1;
    parts = parts > 256 ? 256 : parts;
    parts = parts > room ? room : parts;
    ALDIT_CHECK(parts >= 1, "gpu model: the scratch holds no [%d, %d] partial sum", groups, dim);
    return (int)parts;
}

// ---- the workspace ---------------------------------------------------------------------------------------------

// One stream's activations of one block (bf16 rows unless noted); "kept" under block recomputation.
struct stream_saved {
    gpu_bf16 *x_in;                                   // kept: the block's input rows
    float *mod;                                       // kept: [6][B][D] shift, scale, gate (attention), (MLP)
    gpu_bf16 *h1, *q_pre, *k_pre, *a, *y_attn, *x1, *h2, *y_ff;   // [n, D]
    gpu_bf16 *ff_pre, *ff_act;                        // [n, F]
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; // [n]
    float *q_rstd, *k_rstd;                           // [n, H]
};

// A block's joint attention: q, k, v and the output in the joint layout, [rows, heads * head_dim] bf16, and the
// log-sum-exps [rows, heads] fp32 (head-major [heads, rows] per sample on cuDNN); every head alone, a sequence-parallel
// member's heads in a group. Their gradients: of the output, q, k and v.
struct joint_tensors {
    gpu_bf16 *q, *k, *v, *a;
    float *lse;
};

struct joint_grads {
    gpu_bf16 *o, *q, *k, *v;
};

struct block_saved {
    stream_saved v, t;               // video, text
    joint_tensors j;                 // [J, D], [J, H]
};

struct refiner_saved {
    gpu_bf16 *r_in, *n1, *q, *k, *v, *attn, *y_attn, *r1, *n2, *y_ff;   // [Q, D]
    gpu_bf16 *ff_pre, *ff_act;                                          // [Q, 4D]
    float *n1_mean, *n1_rstd, *n2_mean, *n2_rstd, *lse;                 // [Q], [Q, H]
    float *gates;                                                       // [2][B][D] msa, mlp
    float *shift1, *scale1, *shift2, *scale2;                           // [B, D] the affine norms as modulation
};

// One stream's scratch: forward q, k, v (before the gather) and backward gradients.
struct stream_scratch {
    gpu_bf16 *tq, *tk, *tv, *d_res, *d_h, *d_y, *d_t;   // [n, D]
    gpu_bf16 *d_ff;                                      // [n, F]
    float *d_mod;                                        // [6][B][D]
};

// Sequence parallelism (Ulysses) of the current micro-batch (model.h: batch->sp_size = k > 1): this member's slices
// of both streams' rows, the exchange's counts, and the group buffers: the joint attention over every sample whole for
// this member's heads (the head layout), in a device allocation of their own grown to the largest group micro-batch
// seen (layout_gpu_split_bytes bounds it; the workspace holds the member's video rows and the whole joint text).
struct group_state {
    const seqpar_gpu_group *group;       // NULL: this rank alone
    int k, p, capacity;                  // group size, this member, the host arrays' k
    int64_t n_video, n_text;             // the micro-batch's video and joint text rows, whole
    int64_t *video_slice, *text_slice;   // host [k + 1]: each member's first video and first text row
    int64_t *counts;                     // host [4k]: an exchange's counts and displacements
    int64_t *whole_tok, *whole_txt;      // host [B + 1]: the samples' rows in the whole micro-batch
    int32_t *positions;                  // host [n_video, 3]: RoPE grid indices of every video row
    int64_t positions_capacity;
    int32_t *map_pinned;                 // host [n_joint]: the head layout's joint map (rows of `recv`, -1 a zero row)
    int64_t map_capacity;
    int64_t *tables_pinned;              // host [2B + 1]: first (each sample's first row here, within it), whole_pred
    // device
    char *arena;
    size_t arena_bytes;
    joint_tensors *sets;                 // [layers]: [n_joint, D/k], [n_joint, H/k]; one set under block recomputation
    joint_grads grads;                   // [n_joint, D/k]
    gpu_bf16 *recv;                      // [3][n_video + n_text][D/k]: every row in member order, this member's heads
    gpu_bf16 *send;                      // [3][k][own rows][D/k]: this member's rows split by columns
    float *latents, *noise;              // the micro-batch's samples whole
    int64_t *tables;                     // tables_pinned on the device: first [B], whole_pred [B + 1]
    int32_t *map;                        // map_pinned on the device
};

// Per-micro-batch tables (the same layout in pinned host memory and on the device).
struct batch_tables {
    int64_t *tok, *txt, *qwen, *byt5, *image, *latent_start, *pred_start, *own;   // [B + 1]
    int64_t *spans;                                                               // {0, Q}, {0, G}, {0, I}
    int32_t *shape, *positions, *joint_map, *text_map, *i2v;                      // [B, 3], [N, 3], [J], [L], [B]
    float *sigma, *sinusoid;                                                      // [B], [B, freq_dim]
};

// A stream's parameters (offsets from a block's start).
struct stream_offsets {
    layout_linear mod, q, k, v, o, ff_in, ff_out;
    int64_t norm_q, norm_k;
};

} // namespace

struct mmdit_gpu {
    // dims
    int D, F, H, hd, layers, out_dim, patch_t, patch_h, patch_w, patch_in, patch_cols, patch_out;
    int text_len, T, T2, IM, FQ, axes[3];
    float eps;
    model_layout layout;
    int64_t head_first, time_first;
    // capacity
    int64_t N, L, J;
    int B;
    gpu_recompute recompute;
    // device workspace
    char *arena;
    size_t arena_bytes, scratch_bytes, tables_bytes;
    block_saved *saved;
    refiner_saved refiner[LAYOUT_MMDIT_REFINER_LAYERS];
    stream_scratch sv, st;
    float *latents, *noise, *text_f32, *text2_f32, *image_f32;
    gpu_bf16 *text, *text2, *image, *tokens_in;
    float *x0_tokens, *noise_tokens;
    float *t_pre, *t_act, *temb, *temb_silu, *rt_pre, *rt_act, *rp_pre, *rp_act, *cvec, *cvec_silu, *tmp;   // [B, D]
    float *pooled, *head_mod, *sample_loss;
    float *d_temb_silu, *d_temb, *d_tb, *d_cvec_silu, *d_cvec, *d_head_mod, *d_gates, *d_shift, *d_scale;
    float *byt5_shift, *byt5_scale, *image_shift, *image_scale, *image_out_shift, *image_out_scale;
    gpu_bf16 *r_final, *g_norm, *g1_pre, *g1_act, *g2_pre, *g2_act, *g_out;
    gpu_bf16 *i_norm, *i1_pre, *i1_act, *i2, *i_out;
    float *g_mean, *g_rstd, *i_mean, *i_rstd, *i_mean2, *i_rstd2;
    gpu_bf16 *x_final, *c_final, *head_h, *pred, *d_pred;
    float *head_mean, *head_rstd;
    joint_grads d_joint;                 // [J, D]
    gpu_bf16 *d_r, *d_g, *d_i, *d_rff, *d_g1, *d_g2, *d_gin, *d_i1, *d_iin;
    gpu_bf16 *w_pad;
    float *dw_pad;
    void *scratch;
    batch_tables dev;
    // host staging
    char *tables_pinned;
    batch_tables host;
    float *latents_pinned, *noise_pinned, *text_pinned, *text2_pinned, *image_pinned, *loss_pinned;
    int32_t *grid;                    // [3][B] host
    float *timesteps;                 // [B] host
    int *on_cudnn;                    // [B] host: the sample's joint attention runs on cuDNN
    int64_t *joint_start, *joint_rows;   // [B] host: its first joint row, rows (padded on cuDNN)
    // the current micro-batch: its video and joint text rows here (in a group this member's, from text_lo of the
    // whole joint text), the caption sources' (whole), the joint layout's
    int n_samples, n_own;
    int64_t n, n_text, text_lo, n_qwen, n_byt5, n_image, n_joint, own_rows;
    group_state sp;
    double enqueue_seconds;
};

namespace {

// ---- carving -----------------------------------------------------------------------------------------------------

void carve_tables(carver &c, batch_tables &t, int64_t N, int B, int64_t L, int64_t J, int FQ)
{
    int64_t **starts[] = {&t.tok, &t.txt, &t.qwen, &t.byt5, &t.image, &t.latent_start, &t.pred_start, &t.own};
    for (int64_t **p : starts) *p = c.take<int64_t>(B + 1);
    t.spans = c.take<int64_t>(6);
    t.shape = c.take<int32_t>(3 * (int64_t)B);
    t.positions = c.take<int32_t>(3 * N);
    t.joint_map = c.take<int32_t>(J);
    t.text_map = c.take<int32_t>(L);
    t.i2v = c.take<int32_t>(B);
    t.sigma = c.take<float>(B);
    t.sinusoid = c.take<float>((int64_t)B * FQ);
}

void carve_stream_kept(carver &c, stream_saved &s, int64_t n, int64_t B, int64_t D)
{
    s.x_in = c.take<gpu_bf16>(n * D);
    s.mod = c.take<float>(6 * B * D);
}

void carve_stream_rest(carver &c, stream_saved &s, int64_t n, int64_t D, int64_t F, int64_t H)
{
    gpu_bf16 **rows[] = {&s.h1, &s.q_pre, &s.k_pre, &s.a, &s.y_attn, &s.x1, &s.h2, &s.y_ff};
    for (gpu_bf16 **p : rows) *p = c.take<gpu_bf16>(n * D);
    s.ff_pre = c.take<gpu_bf16>(n * F);
    s.ff_act = c.take<gpu_bf16>(n * F);
    float **stats[] = {&s.ln1_mean, &s.ln1_rstd, &s.ln2_mean, &s.ln2_rstd};
    for (float **p : stats) *p = c.take<float>(n);
    s.q_rstd = c.take<float>(n * H);
    s.k_rstd = c.take<float>(n * H);
}

void carve_rest(carver &c, block_saved &s, const mmdit_gpu *mm)
{
    carve_stream_rest(c, s.v, mm->N, mm->D, mm->F, mm->H);
    carve_stream_rest(c, s.t, mm->L, mm->D, mm->F, mm->H);
    gpu_bf16 **joint[] = {&s.j.q, &s.j.k, &s.j.v, &s.j.a};
    for (gpu_bf16 **p : joint) *p = c.take<gpu_bf16>(mm->J * mm->D);
    s.j.lse = c.take<float>(mm->J * mm->H);
}

void carve_refiner(carver &c, refiner_saved &s, int64_t L, int64_t B, int64_t D, int64_t H)
{
    gpu_bf16 **rows[] = {&s.r_in, &s.n1, &s.q, &s.k, &s.v, &s.attn, &s.y_attn, &s.r1, &s.n2, &s.y_ff};
    for (gpu_bf16 **p : rows) *p = c.take<gpu_bf16>(L * D);
    s.ff_pre = c.take<gpu_bf16>(L * LAYOUT_MMDIT_REFINER_MLP_RATIO * D);
    s.ff_act = c.take<gpu_bf16>(L * LAYOUT_MMDIT_REFINER_MLP_RATIO * D);
    float **stats[] = {&s.n1_mean, &s.n1_rstd, &s.n2_mean, &s.n2_rstd};
    for (float **p : stats) *p = c.take<float>(L);
    s.lse = c.take<float>(L * H);
    s.gates = c.take<float>(2 * B * D);
    float **vectors[] = {&s.shift1, &s.scale1, &s.shift2, &s.scale2};
    for (float **p : vectors) *p = c.take<float>(B * D);
}

void carve_scratch(carver &c, stream_scratch &s, int64_t n, int64_t B, int64_t D, int64_t F)
{
    gpu_bf16 **rows[] = {&s.tq, &s.tk, &s.tv, &s.d_res, &s.d_h, &s.d_y, &s.d_t};
    for (gpu_bf16 **p : rows) *p = c.take<gpu_bf16>(n * D);
    s.d_ff = c.take<gpu_bf16>(n * F);
    s.d_mod = c.take<float>(6 * B * D);
}

// Every workspace pointer (or, with c.base NULL, the count): the pieces model_layout_memory's GPU formula for the
// family counts (model/layout.c, mmdit_gpu_workspace), in its order.
void carve(mmdit_gpu *mm, carver &c)
{
    const int64_t N = mm->N, L = mm->L, B = mm->B, D = mm->D, F = mm->F, H = mm->H, E = LAYOUT_MMDIT_BYT5_HIDDEN;
    const int64_t R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D;
    for (int l = 0; l < mm->layers; ++l) {
        carve_stream_kept(c, mm->saved[l].v, N, B, D);
        carve_stream_kept(c, mm->saved[l].t, L, B, D);
        if (mm->recompute == GPU_RECOMPUTE_NONE) carve_rest(c, mm->saved[l], mm);
    }
    if (mm->recompute == GPU_RECOMPUTE_BLOCK && mm->layers > 0) {
        block_saved shared = {};
        carve_rest(c, shared, mm);
        for (int l = 0; l < mm->layers; ++l) {
            block_saved &s = mm->saved[l];
            const stream_saved v = s.v, t = s.t;
            s = shared;
            s.v.x_in = v.x_in;
            s.v.mod = v.mod;
            s.t.x_in = t.x_in;
            s.t.mod = t.mod;
        }
    }
    for (int i = 0; i < LAYOUT_MMDIT_REFINER_LAYERS; ++i) carve_refiner(c, mm->refiner[i], L, B, D, H);
    carve_scratch(c, mm->sv, N, B, D, F);
    carve_scratch(c, mm->st, L, B, D, F);
    // the batch
    mm->latents = c.take<float>(N * mm->patch_out);
    mm->noise = c.take<float>(N * mm->patch_out);
    mm->text_f32 = c.take<float>(L * mm->T);
    mm->text2_f32 = c.take<float>(L * mm->T2);
    mm->image_f32 = c.take<float>(L * mm->IM);
    mm->text = c.take<gpu_bf16>(L * mm->T);
    mm->text2 = c.take<gpu_bf16>(L * mm->T2);
    mm->image = c.take<gpu_bf16>(L * mm->IM);
    mm->tokens_in = c.take<gpu_bf16>(N * mm->patch_cols);
    mm->x0_tokens = c.take<float>(N * mm->patch_out);
    mm->noise_tokens = c.take<float>(N * mm->patch_out);
    // per sample
    float **per_sample[] = {&mm->t_pre, &mm->t_act, &mm->temb, &mm->temb_silu, &mm->rt_pre, &mm->rt_act, &mm->rp_pre,
                            &mm->rp_act, &mm->cvec, &mm->cvec_silu, &mm->tmp, &mm->d_temb_silu, &mm->d_temb,
                            &mm->d_tb, &mm->d_cvec_silu, &mm->d_cvec};
    for (float **p : per_sample) *p = c.take<float>(B * D);
    mm->pooled = c.take<float>(B * mm->T);
    float **per_sample_2d[] = {&mm->head_mod, &mm->d_head_mod, &mm->d_gates};
    for (float **p : per_sample_2d) *p = c.take<float>(2 * B * D);
    mm->sample_loss = c.take<float>(B);
    mm->d_shift = c.take<float>(B * D + mm->T2 + mm->IM);
    mm->d_scale = c.take<float>(B * D + mm->T2 + mm->IM);
    mm->byt5_shift = c.take<float>(mm->T2);
    mm->byt5_scale = c.take<float>(mm->T2);
    mm->image_shift = c.take<float>(mm->IM);
    mm->image_scale = c.take<float>(mm->IM);
    mm->image_out_shift = c.take<float>(D);
    mm->image_out_scale = c.take<float>(D);
    // the caption sources
    mm->r_final = c.take<gpu_bf16>(L * D);
    mm->g_norm = c.take<gpu_bf16>(L * mm->T2);
    gpu_bf16 **hidden[] = {&mm->g1_pre, &mm->g1_act, &mm->g2_pre, &mm->g2_act};
    for (gpu_bf16 **p : hidden) *p = c.take<gpu_bf16>(L * E);
    mm->g_out = c.take<gpu_bf16>(L * D);
    gpu_bf16 **image_rows[] = {&mm->i_norm, &mm->i1_pre, &mm->i1_act};
    for (gpu_bf16 **p : image_rows) *p = c.take<gpu_bf16>(L * mm->IM);
    mm->i2 = c.take<gpu_bf16>(L * D);
    mm->i_out = c.take<gpu_bf16>(L * D);
    float **text_stats[] = {&mm->g_mean, &mm->g_rstd, &mm->i_mean, &mm->i_rstd, &mm->i_mean2, &mm->i_rstd2};
    for (float **p : text_stats) *p = c.take<float>(L);
    // head
    mm->x_final = c.take<gpu_bf16>(N * D);
    mm->head_h = c.take<gpu_bf16>(N * D);
    mm->c_final = c.take<gpu_bf16>(L * D);
    mm->pred = c.take<gpu_bf16>(N * mm->patch_out);
    mm->d_pred = c.take<gpu_bf16>(N * mm->patch_out);
    mm->head_mean = c.take<float>(N);
    mm->head_rstd = c.take<float>(N);
    // backward
    gpu_bf16 **joint[] = {&mm->d_joint.o, &mm->d_joint.q, &mm->d_joint.k, &mm->d_joint.v};
    for (gpu_bf16 **p : joint) *p = c.take<gpu_bf16>(mm->J * D);
    gpu_bf16 **sources[] = {&mm->d_r, &mm->d_g, &mm->d_i};
    for (gpu_bf16 **p : sources) *p = c.take<gpu_bf16>(L * D);
    mm->d_rff = c.take<gpu_bf16>(L * R);
    mm->d_g1 = c.take<gpu_bf16>(L * E);
    mm->d_g2 = c.take<gpu_bf16>(L * E);
    mm->d_gin = c.take<gpu_bf16>(L * mm->T2);
    mm->d_i1 = c.take<gpu_bf16>(L * mm->IM);
    mm->d_iin = c.take<gpu_bf16>(L * mm->IM);
    mm->w_pad = c.take<gpu_bf16>(D * mm->patch_cols);
    mm->dw_pad = c.take<float>(D * mm->patch_cols);
    carve_tables(c, mm->dev, N, mm->B, L, mm->J, mm->FQ);
    mm->scratch = c.take<char>((int64_t)mm->scratch_bytes);
}

// The largest workspace a backward op asks for at this capacity.
size_t scratch_needed(const mmdit_gpu *mm)
{
    const size_t sizes[] = {
        lnmod_bwd_workspace_bytes(mm->N, mm->D, mm->B),
        lnmod_residual_bwd_workspace_bytes(mm->N, mm->D, mm->B),
        lnmod_bwd_workspace_bytes(mm->L, mm->D, mm->B),
        lnmod_residual_bwd_workspace_bytes(mm->L, mm->D, mm->B),
        lnmod_bwd_workspace_bytes(mm->L, mm->T2, 1),
        lnmod_bwd_workspace_bytes(mm->L, mm->IM, 1),
        fused_head_norm_rope_bwd_workspace_bytes(mm->N, mm->H, mm->hd),
        fused_head_norm_rope_bwd_workspace_bytes(mm->L, mm->H, mm->hd),
        attention_bwd_workspace_bytes(mm->J, mm->H),
        fused_flow_loss_workspace_bytes(mm->B),
    };
    size_t largest = 0;
    for (size_t s : sizes) largest = s > largest ? s : largest;
    return largest;
}

template <typename T> T *pinned(int64_t count)
{
    void *p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, (size_t)(count > 0 ? count : 1) * sizeof(T)));
    return static_cast<T *>(p);
}

// Every setting the kernels cannot run, as one clear error.
void check_supported(const model *m)
{
    const int patch_out = m->patch_out, E = LAYOUT_MMDIT_BYT5_HIDDEN;
    const int widths[] = {m->dim, m->ffn_dim, m->text_dim, m->text_2_dim, m->image_dim, patch_out, m->head_dim};
    for (int w : widths)
        if (w % 8 || w <= 0)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model (hunyuanvideo15): dim %d, ffn_dim %d, text_dim %d, text_2_dim "
                             "%d, image_dim %d, out_dim x patch %d and head_dim %d must be positive multiples of 8",
                             m->dim, m->ffn_dim, m->text_dim, m->text_2_dim, m->image_dim, patch_out, m->head_dim);
    if (m->dim > LNMOD_MAX_DIM || m->text_2_dim > LNMOD_MAX_DIM || m->image_dim > LNMOD_MAX_DIM)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model (hunyuanvideo15): dim, text_2_dim and image_dim must be at most %d",
                         LNMOD_MAX_DIM);
    if (!attention_head_dim_supported(m->head_dim))
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model (hunyuanvideo15): head dim %d is not supported by the attention "
                         "kernels (a multiple of 16 up to %d)", m->head_dim, ATTENTION_MAX_HEAD_DIM);
    const int linears[][2] = {{m->dim, m->dim}, {m->dim, m->ffn_dim}, {m->ffn_dim, m->dim}, {m->text_dim, m->dim},
                              {m->dim, 4 * m->dim}, {4 * m->dim, m->dim}, {m->text_2_dim, E}, {E, E}, {E, m->dim},
                              {m->image_dim, m->image_dim}, {m->image_dim, m->dim}, {m->dim, patch_out}};
    for (size_t i = 0; i < sizeof linears / sizeof linears[0]; ++i)
        if (!gemm_linear_supported(linears[i][0], linears[i][1]))
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model (hunyuanvideo15): a %d -> %d linear layer is not supported by "
                             "the GEMMs", linears[i][0], linears[i][1]);
    for (int i = 0; i < m->n_params; ++i)
        if (m->params[i].offset % 8)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "gpu model (hunyuanvideo15): parameter %s starts at value %lld, not a "
                             "multiple of 8", m->params[i].name, (long long)m->params[i].offset);
}

} // namespace

extern "C" mmdit_gpu *mmdit_gpu_describe(const model *m, int64_t max_tokens, int max_samples, int64_t max_text,
                                         gpu_recompute recompute, int64_t device_scratch_bytes, size_t *arena_bytes)
{
    ALDIT_CHECK(m->family == FAMILY_HUNYUANVIDEO15, "gpu model: mmdit_gpu for another family");
    check_supported(m);
    ALDIT_CHECK(max_tokens > 0 && max_samples > 0 && max_samples <= 65535 && max_text >= 0,
                "gpu model: capacity of %lld tokens, %d samples (at most 65535), %lld text rows must be positive",
                (long long)max_tokens, max_samples, (long long)max_text);
    mmdit_gpu *mm = static_cast<mmdit_gpu *>(xcalloc(1, sizeof(mmdit_gpu)));
    mm->D = m->dim;
    mm->F = m->ffn_dim;
    mm->H = m->num_heads;
    mm->hd = m->head_dim;
    mm->layers = m->num_layers;
    mm->out_dim = m->out_dim;
    mm->patch_t = m->patch_t;
    mm->patch_h = m->patch_h;
    mm->patch_w = m->patch_w;
    mm->patch_in = m->patch_in;
    mm->patch_cols = (m->patch_in + 7) / 8 * 8;
    mm->patch_out = m->patch_out;
    mm->text_len = m->text_len;
    mm->T = m->text_dim;
    mm->T2 = m->text_2_dim;
    mm->IM = m->image_dim;
    mm->FQ = m->freq_dim;
    const int pairs = m->head_dim / 2, t = m->rope_axes_t / 2;
    mm->axes[0] = t;
    mm->axes[1] = mm->axes[2] = (pairs - t) / 2;
    mm->eps = m->eps;
    mm->layout = m->layout;
    mm->head_first = m->layout.blocks_offset + (int64_t)m->num_layers * m->layout.block_stride;
    mm->time_first = m->layout.gpu_time_first;
    ALDIT_CHECK(mm->time_first > 0 && m->layout.mmdit.cond_type > mm->time_first &&
                m->layout.mmdit.time_2.bias > mm->time_first,
                "gpu model: the parameter table's order is not the one the GPU model reads its parameters in");
    mm->N = max_tokens;
    mm->B = max_samples;
    mm->L = max_text > 0 ? max_text : (int64_t)max_samples * m->text_len;
    mm->J = layout_mmdit_joint_rows(mm->N, mm->B, mm->L);
    ALDIT_CHECK(mm->J < ((int64_t)1 << 31) && mm->N + mm->L < ((int64_t)1 << 29),
                "gpu model: a capacity of %lld tokens and %lld text rows is too large", (long long)mm->N, (long long)mm->L);
    ALDIT_CHECK(recompute == GPU_RECOMPUTE_NONE || recompute == GPU_RECOMPUTE_BLOCK,
                "gpu model: unknown recomputation mode %d", (int)recompute);
    mm->recompute = recompute;
    mm->saved = static_cast<block_saved *>(xcalloc((size_t)(mm->layers > 0 ? mm->layers : 1), sizeof(block_saved)));
    // the arena is the layout's memory formula at this capacity (model/layout.h): what the balancer plans with
    mm->scratch_bytes = (size_t)layout_gpu_scratch_bytes(&m->layout, device_scratch_bytes, mm->J, mm->B);
    ALDIT_CHECK(scratch_needed(mm) <= mm->scratch_bytes, "gpu model (hunyuanvideo15): the backward ops ask for %zu "
                "bytes of scratch, more than the %zu of the memory formula", scratch_needed(mm), mm->scratch_bytes);
    const layout_memory memory = model_layout_memory(&m->layout, LAYOUT_BACKEND_GPU,
                                                     recompute == GPU_RECOMPUTE_BLOCK ? RECOMPUTE_BLOCK : RECOMPUTE_NONE,
                                                     device_scratch_bytes);
    mm->arena_bytes = (size_t)layout_memory_bytes(&memory, mm->N, mm->B, mm->L);
    carver count = {nullptr, 0};
    carve(mm, count);
    ALDIT_CHECK(count.used <= mm->arena_bytes, "gpu model (hunyuanvideo15): the workspace carves %zu bytes, more than "
                "the %zu of the memory formula (model/layout.c and mmdit_gpu.cu disagree)", count.used, mm->arena_bytes);
    *arena_bytes = mm->arena_bytes;
    return mm;
}

extern "C" void mmdit_gpu_allocate(mmdit_gpu *mm)
{
    CUDA_CHECK(cudaMalloc(&mm->arena, mm->arena_bytes));
    // Poisoned (all bits set is NaN in bf16 and fp32): a value read before it is written shows up as NaN.
    CUDA_CHECK(cudaMemset(mm->arena, 0xff, mm->arena_bytes));
    carver assign = {mm->arena, 0};
    carve(mm, assign);
    carver tables = {nullptr, 0};
    carve_tables(tables, mm->host, mm->N, mm->B, mm->L, mm->J, mm->FQ);
    mm->tables_bytes = tables.used;
    mm->tables_pinned = pinned<char>((int64_t)mm->tables_bytes);
    tables = {mm->tables_pinned, 0};
    carve_tables(tables, mm->host, mm->N, mm->B, mm->L, mm->J, mm->FQ);
    mm->latents_pinned = pinned<float>(mm->N * mm->patch_out);
    mm->noise_pinned = pinned<float>(mm->N * mm->patch_out);
    mm->text_pinned = pinned<float>(mm->L * mm->T);
    mm->text2_pinned = pinned<float>(mm->L * mm->T2);
    mm->image_pinned = pinned<float>(mm->L * mm->IM);
    mm->loss_pinned = pinned<float>(mm->B);
    mm->grid = static_cast<int32_t *>(xmalloc(3 * (size_t)mm->B * sizeof(int32_t)));
    mm->timesteps = static_cast<float *>(xmalloc((size_t)mm->B * sizeof(float)));
    mm->on_cudnn = static_cast<int *>(xmalloc((size_t)mm->B * sizeof(int)));
    mm->joint_start = static_cast<int64_t *>(xmalloc(2 * (size_t)mm->B * sizeof(int64_t)));
    mm->joint_rows = mm->joint_start + mm->B;
}

extern "C" void mmdit_gpu_free(mmdit_gpu *mm)
{
    if (!mm) return;
    if (mm->arena) CUDA_CHECK(cudaFree(mm->arena));   // a described-only model touches no device (aldit --check)
    float *pinned_arrays[] = {mm->latents_pinned, mm->noise_pinned, mm->text_pinned, mm->text2_pinned, mm->image_pinned,
                              mm->loss_pinned};
    for (float *p : pinned_arrays)
        if (p) CUDA_CHECK(cudaFreeHost(p));
    if (mm->tables_pinned) CUDA_CHECK(cudaFreeHost(mm->tables_pinned));
    free(mm->grid);
    free(mm->timesteps);
    free(mm->on_cudnn);
    free(mm->joint_start);
    free(mm->saved);
    group_state &sp = mm->sp;
    if (sp.arena) CUDA_CHECK(cudaFree(sp.arena));
    if (sp.map_pinned) CUDA_CHECK(cudaFreeHost(sp.map_pinned));
    if (sp.tables_pinned) CUDA_CHECK(cudaFreeHost(sp.tables_pinned));
    free(sp.video_slice);
    free(sp.counts);
    free(sp.whole_tok);
    free(sp.positions);
    free(sp.sets);
    free(mm);
}

extern "C" double mmdit_gpu_enqueue_seconds(const mmdit_gpu *mm)
{
    return mm->enqueue_seconds;
}

namespace {

// ---- staging a micro-batch ------------------------------------------------------------------------------------

int32_t length_of(const int32_t *lengths, int b) { return lengths ? lengths[b] : 0; }

// One sample's sizes checked as the CPU model checks them (the same messages, exit 2).
void check_sample(const mmdit_gpu *mm, const model_batch *batch, int b)
{
    const int32_t f = batch->frames[b], h = batch->height[b], w = batch->width[b];
    if (f <= 0 || h <= 0 || w <= 0 || f % mm->patch_t || h % mm->patch_h || w % mm->patch_w)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has latent %dx%dx%d, not a positive "
                         "multiple of the patch %dx%dx%d", b, f, h, w, mm->patch_t, mm->patch_h, mm->patch_w);
    if (batch->text_len[b] < 1 || batch->text_len[b] > mm->text_len)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has %d Qwen text tokens (1..%d "
                         "allowed: the refiner pools over them)", b, batch->text_len[b], mm->text_len);
    if (length_of(batch->text_2_len, b) < 0 || length_of(batch->image_len, b) < 0)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has a negative ByT5 or image length", b);
    const float sigma = batch->sigma[b];
    if (!(sigma >= 0.0f && sigma <= 1.0f))
        ALDIT_FATAL("model: sample %d of the micro-batch has sigma %g outside [0, 1]", b, sigma);
}

// The row tables of every sample's video, joint text and sources.
void row_tables(mmdit_gpu *mm, const model_batch *batch)
{
    batch_tables &t = mm->host;
    const int B = batch->n_samples;
    t.tok[0] = t.txt[0] = t.qwen[0] = t.byt5[0] = t.image[0] = t.latent_start[0] = t.pred_start[0] = 0;
    for (int b = 0; b < B; ++b) {
        check_sample(mm, batch, b);
        const int32_t f = batch->frames[b], h = batch->height[b], w = batch->width[b];
        int32_t *grid = mm->grid;
        grid[b] = f / mm->patch_t;
        grid[B + b] = h / mm->patch_h;
        grid[2 * B + b] = w / mm->patch_w;
        const int64_t S = (int64_t)grid[b] * grid[B + b] * grid[2 * B + b];
        const int64_t Q = batch->text_len[b], G = length_of(batch->text_2_len, b), I = length_of(batch->image_len, b);
        t.tok[b + 1] = t.tok[b] + S;
        t.txt[b + 1] = t.txt[b] + I + G + Q;
        t.qwen[b + 1] = t.qwen[b] + Q;
        t.byt5[b + 1] = t.byt5[b] + G;
        t.image[b + 1] = t.image[b] + I;
        t.latent_start[b + 1] = t.latent_start[b] + (int64_t)mm->out_dim * f * h * w;
        t.pred_start[b + 1] = t.tok[b + 1] * mm->patch_out;
        t.shape[3 * b] = f;
        t.shape[3 * b + 1] = h;
        t.shape[3 * b + 2] = w;
        t.sigma[b] = batch->sigma[b];
        t.i2v[b] = batch->i2v && batch->i2v[b] ? 1 : 0;
        mm->timesteps[b] = 1000.0f * batch->sigma[b];
    }
    mm->n_samples = B;
    mm->n = t.tok[B];
    mm->n_text = t.txt[B];
    mm->n_qwen = t.qwen[B];
    mm->n_byt5 = t.byt5[B];
    mm->n_image = t.image[B];
    mm->text_lo = 0;
    const int64_t spans[6] = {0, mm->n_qwen, 0, mm->n_byt5, 0, mm->n_image};
    memcpy(t.spans, spans, sizeof spans);
}

// The joint layout (mmdit_gpu.h) of the whole micro-batch: samples on our own kernel packed from row 0, then those on
// cuDNN, each from a tile boundary over its whole tiles (where each sample's rows go; joint_map says which row is which).
void joint_layout(mmdit_gpu *mm, const mmdit_gpu_env *env)
{
    batch_tables &t = mm->host;
    const int B = mm->n_samples;
    int64_t at = 0;
    mm->n_own = 0;
    t.own[0] = 0;
    for (int b = 0; b < B; ++b) {
        const int64_t rows = t.tok[b + 1] - t.tok[b] + t.txt[b + 1] - t.txt[b];
        mm->on_cudnn[b] = 0;
#ifdef HAVE_CUDNN
        mm->on_cudnn[b] = env->use_cudnn && env->cudnn && rows >= env->cudnn_min_tokens;
#else
        (void)env;
#endif
        if (mm->on_cudnn[b]) continue;
        mm->joint_start[b] = at;
        mm->joint_rows[b] = rows;
        at += rows;
        t.own[++mm->n_own] = at;
    }
    mm->own_rows = at;
    at = (at + kTile - 1) / kTile * kTile;
    for (int b = 0; b < B; ++b) {
        if (!mm->on_cudnn[b]) continue;
        const int64_t rows = t.tok[b + 1] - t.tok[b] + t.txt[b + 1] - t.txt[b];
        mm->joint_start[b] = at;
#ifdef HAVE_CUDNN
        mm->joint_rows[b] = attention_cudnn_padded_rows(rows);
#else
        mm->joint_rows[b] = rows;
#endif
        at += (mm->joint_rows[b] + kTile - 1) / kTile * kTile;
    }
    mm->n_joint = at;
}

// map[j] names the row joint row j reads (-1: a zero pad row): alone, video row r is row r and text row r row
// n + r of the gather's sources; in a group (whole rows, this member's heads) the exchange's rows in member order,
// member q's video rows then its text rows (see sp_to_heads): video row r of member q's slice is row text_slice[q] + r,
// text row r row video_slice[q + 1] + r.
void joint_map(const mmdit_gpu *mm, int32_t *map)
{
    const batch_tables &t = mm->host;
    const group_state &sp = mm->sp;
    const int64_t *tok = sp.group ? sp.whole_tok : t.tok, *txt = sp.group ? sp.whole_txt : t.txt;
    for (int64_t j = 0; j < mm->n_joint; ++j) map[j] = -1;
    int video_owner = 0, text_owner = 0;   // rows in order: each row's member only moves forward
    for (int b = 0; b < mm->n_samples; ++b) {
        const int64_t S = tok[b + 1] - tok[b], L = txt[b + 1] - txt[b], first = mm->joint_start[b];
        for (int64_t i = 0; i < S; ++i) {
            const int64_t r = tok[b] + i;
            if (!sp.group) {
                map[first + i] = (int32_t)r;
                continue;
            }
            while (r >= sp.video_slice[video_owner + 1]) ++video_owner;
            map[first + i] = (int32_t)(sp.text_slice[video_owner] + r);
        }
        for (int64_t i = 0; i < L; ++i) {
            const int64_t r = txt[b] + i;
            if (!sp.group) {
                map[first + S + i] = (int32_t)(mm->n + r);
                continue;
            }
            while (r >= sp.text_slice[text_owner + 1]) ++text_owner;
            map[first + S + i] = (int32_t)(sp.video_slice[text_owner + 1] + r);
        }
    }
}

// The joint text rows' sources: per sample [image; ByT5; Qwen].
void text_map(mmdit_gpu *mm)
{
    batch_tables &t = mm->host;
    for (int b = 0; b < mm->n_samples; ++b) {
        int64_t row = t.txt[b];
        for (int64_t i = t.image[b]; i < t.image[b + 1]; ++i) t.text_map[row++] = text_code(2, i);
        for (int64_t i = t.byt5[b]; i < t.byt5[b + 1]; ++i) t.text_map[row++] = text_code(1, i);
        for (int64_t i = t.qwen[b]; i < t.qwen[b + 1]; ++i) t.text_map[row++] = text_code(0, i);
    }
}

void copy_in(float *pinned_rows, float *device_rows, const float *src, int64_t n, cudaStream_t stream)
{
    if (n <= 0) return;
    cpu_copy(pinned_rows, src, (size_t)n * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(device_rows, pinned_rows, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream));
}

// The rows this rank holds against its capacity: its video rows (in a group its member's slice) and the whole joint
// text (every member runs the caption sources and the token refiner over all of it).
void check_capacity(const mmdit_gpu *mm, int64_t video_rows, int64_t text_rows)
{
    if (video_rows > mm->N || text_rows > mm->L)
        ALDIT_FATAL("gpu model: a micro-batch of %lld tokens%s and %lld text rows exceeds the %lld and %lld the model was "
                    "created for", (long long)video_rows, mm->sp.group ? " on this member of its group" : "",
                    (long long)text_rows, (long long)mm->N, (long long)mm->L);
}

// ---- sequence parallelism: the member's slices and the group buffers ---------------------------------------------

// The host arrays of a group of k members for micro-batches of up to B samples (grown once).
void sp_host_arrays(mmdit_gpu *mm, int k)
{
    group_state &sp = mm->sp;
    if (k > sp.capacity) {
        sp.capacity = k;
        sp.video_slice = static_cast<int64_t *>(xrealloc(sp.video_slice, 2 * (size_t)(k + 1) * sizeof(int64_t)));
        sp.counts = static_cast<int64_t *>(xrealloc(sp.counts, 4 * (size_t)k * sizeof(int64_t)));
    }
    sp.text_slice = sp.video_slice + sp.capacity + 1;
    if (!sp.whole_tok) {
        sp.whole_tok = static_cast<int64_t *>(xmalloc(2 * (size_t)(mm->B + 1) * sizeof(int64_t)));
        sp.whole_txt = sp.whole_tok + mm->B + 1;
        sp.tables_pinned = pinned<int64_t>(2 * (int64_t)mm->B + 1);
        sp.sets = static_cast<joint_tensors *>(xcalloc((size_t)(mm->layers > 0 ? mm->layers : 1), sizeof(joint_tensors)));
    }
}

// RoPE positions of this member's video rows: each row's grid indices within its whole sample.
void sp_positions(mmdit_gpu *mm, int64_t video_lo, int64_t n_video)
{
    group_state &sp = mm->sp;
    const int B = mm->n_samples;
    if (sp.n_video > sp.positions_capacity) {
        sp.positions_capacity = sp.n_video;
        sp.positions = static_cast<int32_t *>(xrealloc(sp.positions, (size_t)sp.n_video * 3 * sizeof(int32_t)));
    }
    cpu_rope_positions(B, mm->grid, mm->grid + B, mm->grid + 2 * B, sp.positions);
    memcpy(mm->host.positions, sp.positions + 3 * video_lo, (size_t)(3 * n_video) * sizeof(int32_t));
}

// With the whole micro-batch's tables and joint layout in place: this member's slices (model.h: video rows
// [p Tv/k, (p+1) Tv/k), joint text rows [p Tt/k, (p+1) Tt/k)), the head layout's joint map, the RoPE positions of its
// video rows, the samples' rows here (tok, txt, pred_start: clamped) and the device tables' host side (each sample's
// first video row here, within it; its whole element offsets for the loss). mm->n and mm->n_text become the
// member's rows.
void sp_slice(mmdit_gpu *mm, const model_batch *batch)
{
    group_state &sp = mm->sp;
    batch_tables &t = mm->host;
    const int B = mm->n_samples;
    sp.k = batch->sp_size;
    sp.p = batch->sp_rank;
    sp_host_arrays(mm, sp.k);
    sp.n_video = mm->n;
    sp.n_text = mm->n_text;
    for (int q = 0; q <= sp.k; ++q) {
        sp.video_slice[q] = sp.n_video * q / sp.k;
        sp.text_slice[q] = sp.n_text * q / sp.k;
    }
    const int64_t video_lo = sp.video_slice[sp.p], n_video = sp.video_slice[sp.p + 1] - video_lo;
    const int64_t text_lo = sp.text_slice[sp.p], n_text = sp.text_slice[sp.p + 1] - text_lo;
    check_capacity(mm, n_video, sp.n_text);
    memcpy(sp.whole_tok, t.tok, (size_t)(B + 1) * sizeof(int64_t));
    memcpy(sp.whole_txt, t.txt, (size_t)(B + 1) * sizeof(int64_t));
    if (mm->n_joint > sp.map_capacity) {
        if (sp.map_pinned) CUDA_CHECK(cudaFreeHost(sp.map_pinned));
        sp.map_pinned = pinned<int32_t>(mm->n_joint);
        sp.map_capacity = mm->n_joint;
    }
    joint_map(mm, sp.map_pinned);
    sp_positions(mm, video_lo, n_video);
    int64_t *first = sp.tables_pinned, *whole_pred = first + B;
    for (int b = 0; b <= B; ++b) {
        const int64_t row = sp.whole_tok[b] - video_lo, text_row = sp.whole_txt[b] - text_lo;
        t.tok[b] = row < 0 ? 0 : row > n_video ? n_video : row;
        t.txt[b] = text_row < 0 ? 0 : text_row > n_text ? n_text : text_row;
        t.pred_start[b] = t.tok[b] * mm->patch_out;
        whole_pred[b] = sp.whole_tok[b] * mm->patch_out;
        if (b < B) first[b] = video_lo + t.tok[b] - sp.whole_tok[b];
    }
    mm->n = n_video;
    mm->n_text = n_text;
    mm->text_lo = text_lo;
}

// The group buffers of this micro-batch (c.base NULL: count the bytes): the pieces layout_gpu_split_bytes counts for
// the family, in its order. Per block (one set under block recomputation, which re-runs the exchange with the block)
// the joint layout's q, k, v, output and log-sum-exps at this member's heads; their gradients; the exchange's rows.
void carve_sp(mmdit_gpu *mm, carver &c)
{
    group_state &sp = mm->sp;
    const int64_t J = mm->n_joint, Dk = mm->D / sp.k, Hk = mm->H / sp.k, T = sp.n_video + sp.n_text;
    const int sets = mm->recompute == GPU_RECOMPUTE_BLOCK ? 1 : mm->layers;
    carve_head_sets(c, sp.sets, &joint_tensors::a, mm->layers, sets, J, Dk, Hk);
    gpu_bf16 **grads[] = {&sp.grads.o, &sp.grads.q, &sp.grads.k, &sp.grads.v};
    for (gpu_bf16 **p : grads) *p = c.take<gpu_bf16>(J * Dk);
    sp.recv = c.take<gpu_bf16>(3 * T * Dk);
    sp.send = c.take<gpu_bf16>(3 * (mm->n + mm->n_text) * mm->D);
    const int64_t values = mm->host.latent_start[mm->n_samples];
    sp.latents = c.take<float>(values);
    sp.noise = c.take<float>(values);
    sp.tables = c.take<int64_t>(2 * (int64_t)mm->n_samples + 1);
    sp.map = c.take<int32_t>(J);
}

// Grow the group buffers' allocation to this micro-batch (cudaMalloc: the device is waited for then) and carve it.
void sp_buffers(mmdit_gpu *mm)
{
    group_state &sp = mm->sp;
    const int64_t Hk = mm->H / sp.k, T = sp.n_video + sp.n_text;
    if (attention_bwd_workspace_bytes(mm->own_rows, (int)Hk) > mm->scratch_bytes)
        ALDIT_FATAL("gpu model (hunyuanvideo15): a micro-batch of %lld tokens and %lld text rows on a group of %d ranks "
                    "needs more attention scratch than the model's capacity gives", (long long)sp.n_video,
                    (long long)sp.n_text, sp.k);
    carver count = {nullptr, 0};
    carve_sp(mm, count);
    // the plan kept room for it by the layout's formula (its cuDNN term is the attention buffer's, apart)
    const deck_recompute mode = mm->recompute == GPU_RECOMPUTE_BLOCK ? RECOMPUTE_BLOCK : RECOMPUTE_NONE;
    const int64_t cudnn = 4 * Hk * layout_mmdit_joint_rows(T, mm->n_samples, 0) * (mm->hd + 1);
    const int64_t planned = layout_gpu_split_bytes(&mm->layout, mode, T, mm->n_samples, sp.k) - cudnn;
    ALDIT_CHECK((int64_t)count.used <= planned, "gpu model (hunyuanvideo15): the group buffers of a micro-batch of %lld "
                "joint rows on %d ranks take %zu bytes, the memory formula (layout_gpu_split_bytes) says %lld",
                (long long)T, sp.k, count.used, (long long)planned);
    if (count.used > sp.arena_bytes) {
        CUDA_CHECK(cudaFree(sp.arena));
        CUDA_CHECK(cudaMalloc(&sp.arena, count.used));
        CUDA_CHECK(cudaMemset(sp.arena, 0, count.used));   // finite values where a loopback group leaves parts unsent
        sp.arena_bytes = count.used;
    }
    carver assign = {sp.arena, 0};
    carve_sp(mm, assign);
}

// The device tables of the slice, the joint map and the whole samples' latents and noise, queued on `stream` (the
// batch's arrays are the caller's pageable memory: the copies are staged by the driver).
void sp_copy_inputs(mmdit_gpu *mm, const model_batch *batch, cudaStream_t stream)
{
    const group_state &sp = mm->sp;
    const int B = mm->n_samples;
    const size_t latent_bytes = (size_t)mm->host.latent_start[B] * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(sp.tables, sp.tables_pinned, (2 * (size_t)B + 1) * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(sp.map, sp.map_pinned, (size_t)mm->n_joint * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream));
    CUDA_CHECK(cudaMemcpyAsync(sp.latents, batch->latents, latent_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaMemcpyAsync(sp.noise, batch->noise, latent_bytes, cudaMemcpyHostToDevice, stream));
}

// Check and lay out the batch, fill the pinned tables and inputs and queue their copies. In a group (env->group,
// which model_gpu.cu resolved and checked as for Wan) the tables are this member's rows and the joint layout's the
// whole micro-batch's.
void stage(mmdit_gpu *mm, const mmdit_gpu_env *env, const model_batch *batch, cudaStream_t stream)
{
    const int B = batch->n_samples;
    ALDIT_CHECK(B > 0, "model: a micro-batch needs at least one sample (got %d)", B);
    if (B > mm->B)
        ALDIT_FATAL("gpu model: a micro-batch of %d samples exceeds the %d the model was created for", B, mm->B);
    ALDIT_CHECK(batch->sp_size <= 1 || env->group, "gpu model (hunyuanvideo15): a micro-batch for a group of %d ranks "
                "without the group's communicator", batch->sp_size);
    mm->sp.group = batch->sp_size > 1 ? env->group : nullptr;
    row_tables(mm, batch);
    check_capacity(mm, mm->sp.group ? 0 : mm->n, mm->n_text);   // a member's video rows: at its slice (sp_slice)
    joint_layout(mm, env);
    text_map(mm);
    if (mm->sp.group) {
        sp_slice(mm, batch);
        sp_buffers(mm);
    } else {
        ALDIT_CHECK(mm->n_joint <= mm->J, "gpu model: the joint layout takes %lld rows, more than the %lld of the "
                    "capacity", (long long)mm->n_joint, (long long)mm->J);
        joint_map(mm, mm->host.joint_map);
        cpu_rope_positions(B, mm->grid, mm->grid + B, mm->grid + 2 * B, mm->host.positions);
    }
    cpu_sinusoidal_embedding(mm->timesteps, B, mm->FQ, mm->host.sinusoid);
    CUDA_CHECK(cudaMemcpyAsync(mm->dev.tok, mm->tables_pinned, mm->tables_bytes, cudaMemcpyHostToDevice, stream));
    if (mm->sp.group) {
        sp_copy_inputs(mm, batch, stream);
    } else {
        const int64_t values = mm->host.latent_start[B];
        copy_in(mm->latents_pinned, mm->latents, batch->latents, values, stream);
        copy_in(mm->noise_pinned, mm->noise, batch->noise, values, stream);
    }
    copy_in(mm->text_pinned, mm->text_f32, batch->text, mm->n_qwen * mm->T, stream);
    if (mm->n_byt5 > 0) copy_in(mm->text2_pinned, mm->text2_f32, batch->text_2, mm->n_byt5 * mm->T2, stream);
    if (mm->n_image > 0) copy_in(mm->image_pinned, mm->image_f32, batch->image, mm->n_image * mm->IM, stream);
}

// ---- layers ------------------------------------------------------------------------------------------------------

layout_linear shifted(layout_linear lin, int64_t by) { return {lin.weight + by, lin.bias + by}; }

void linear_fwd(const mmdit_gpu_env *env, const gpu_bf16 *w, const gpu_bf16 *x, int64_t rows, int in, int out,
                layout_linear lin, gpu_bf16 *y, cudaStream_t stream)
{
    if (rows > 0) gemm_linear_fwd(env->gemm, x, rows, in, out, w + lin.weight, w + lin.bias, GEMM_EPILOGUE_BIAS, y,
                                  nullptr, stream);
}

void linear_gelu_fwd(const mmdit_gpu_env *env, const gpu_bf16 *w, const gpu_bf16 *x, int64_t rows, int in, int out,
                     layout_linear lin, gpu_bf16 *pre, gpu_bf16 *act, cudaStream_t stream)
{
    if (rows > 0) gemm_linear_fwd(env->gemm, x, rows, in, out, w + lin.weight, w + lin.bias,
                                  GEMM_EPILOGUE_GELU_AUX_BIAS, act, pre, stream);
}

// dW, db added into g; dx (NULL: none) overwritten or added into; gelu_input: dx is the GELU-tanh input's gradient.
void linear_bwd(const mmdit_gpu_env *env, const gpu_bf16 *w, float *g, const gpu_bf16 *x, const gpu_bf16 *dy,
                int64_t rows, int in, int out, layout_linear lin, const gpu_bf16 *gelu_input, gpu_bf16 *dx,
                int accumulate_dx, cudaStream_t stream)
{
    if (rows <= 0) return;
    gemm_linear_bwd_weight(env->gemm, x, dy, rows, in, out, g + lin.weight, g + lin.bias, 1, stream);
    if (dx) gemm_linear_bwd_data(env->gemm, dy, rows, in, out, w + lin.weight, gelu_input, dx, accumulate_dx, stream);
}

float *chunk(float *table, int c, int B, int D) { return table + (int64_t)c * B * D; }

void gated_residual(const gpu_bf16 *x, const gpu_bf16 *y, const float *gate, const int64_t *start, int B, int64_t rows,
                    int D, gpu_bf16 *out, cudaStream_t stream)
{
    LAUNCH(gated_residual_kernel, rows * D, x, y, gate, start, B, rows, D, out);
}

// dy = dout gate_b and dgate_b = sum of dout y over b's rows (the residual's own gradient, dout, passes on).
void gated_residual_bwd(const gpu_bf16 *dout, const gpu_bf16 *y, const float *gate, const int64_t *start, int B,
                        int64_t rows, int D, gpu_bf16 *dy, float *dgate, void *scratch, size_t scratch_bytes,
                        cudaStream_t stream)
{
    LAUNCH(gated_residual_dy_kernel, rows * D, dout, gate, start, B, rows, D, dy);
    ALDIT_CHECK(D % 2 == 0, "gpu model: the gate's sum takes an even width (got %d)", D);
    const int parts = sum_parts(rows, B, D, scratch_bytes);
    float *partial = static_cast<float *>(scratch);
    LAUNCH(gate_sum_partial_kernel, (int64_t)B * parts * (D / 2), dout, y, start, B, D, parts, partial);
    LAUNCH(parts_sum_kernel, (int64_t)B * D, partial, B, parts, D, 0, dgate);
}

// The joint layout's rows [n_joint, width] from the map's sources: row map[j] of video (< n_video) or of text (the
// rest, from n_video on); zeros for the pad rows. Alone the sources are the two streams' rows at every head (the
// workspace's map, width D); in a group the exchange's rows in member order at this member's heads (the group's map,
// width D/k: video and text are then the same buffer).
void joint_gather(const mmdit_gpu *mm, const int32_t *map, const gpu_bf16 *video, const gpu_bf16 *text,
                  int64_t n_video, int width, gpu_bf16 *joint, cudaStream_t stream)
{
    const int vecs = width / 8;
    LAUNCH(joint_gather_kernel, mm->n_joint * vecs, map, mm->n_joint, reinterpret_cast<const uint4 *>(video),
           reinterpret_cast<const uint4 *>(text), n_video, vecs, reinterpret_cast<uint4 *>(joint));
}

void joint_scatter(const mmdit_gpu *mm, const int32_t *map, const gpu_bf16 *joint, int64_t n_video, int width,
                   gpu_bf16 *video, gpu_bf16 *text, cudaStream_t stream)
{
    const int vecs = width / 8;
    LAUNCH(joint_scatter_kernel, mm->n_joint * vecs, map, mm->n_joint, reinterpret_cast<const uint4 *>(joint), n_video,
           vecs, reinterpret_cast<uint4 *>(video), reinterpret_cast<uint4 *>(text));
}

// Sample b's joint rows S + L, whole (in a group too).
int64_t joint_length(const mmdit_gpu *mm, int b)
{
    const batch_tables &t = mm->host;
    const group_state &sp = mm->sp;
    const int64_t *tok = sp.group ? sp.whole_tok : t.tok, *txt = sp.group ? sp.whole_txt : t.txt;
    return tok[b + 1] - tok[b] + txt[b + 1] - txt[b];
}

// The joint attention of a block at `heads` heads (every head alone; a member's H/k in a group): our own kernel over
// the packed samples, cuDNN over the others' whole tiles.
void joint_attention_fwd(const mmdit_gpu *mm, const mmdit_gpu_env *env, const joint_tensors &j, int heads,
                         cudaStream_t stream)
{
    const int hd = mm->hd;
    if (mm->n_own > 0)
        attention_fwd(j.q, j.k, j.v, heads, hd, mm->dev.own, mm->dev.own, mm->n_own, mm->own_rows, mm->own_rows, j.a,
                      j.lse, stream);
#ifdef HAVE_CUDNN
    for (int b = 0; b < mm->n_samples; ++b) {
        if (!mm->on_cudnn[b]) continue;
        const int64_t first = mm->joint_start[b], at = first * heads * hd, padded = mm->joint_rows[b];
        const int64_t rows = joint_length(mm, b);
        if (padded > rows)
            attention_cudnn_fwd_padded(env->cudnn, j.q + at, j.k + at, j.v + at, rows, padded, heads, hd, j.a + at,
                                       j.lse + first * heads, stream);
        else
            attention_cudnn_fwd(env->cudnn, j.q + at, j.k + at, j.v + at, rows, heads, hd, j.a + at,
                                j.lse + first * heads, stream);
    }
#else
    (void)env;
#endif
}

void joint_attention_bwd(const mmdit_gpu *mm, const mmdit_gpu_env *env, const joint_tensors &j, const joint_grads &g,
                         int heads, cudaStream_t stream)
{
    const int hd = mm->hd;
    if (mm->n_own > 0)
        attention_bwd(j.q, j.k, j.v, j.a, g.o, j.lse, heads, hd, mm->dev.own, mm->dev.own, mm->n_own, mm->own_rows,
                      mm->own_rows, g.q, g.k, g.v, mm->scratch, stream);
#ifdef HAVE_CUDNN
    for (int b = 0; b < mm->n_samples; ++b) {
        if (!mm->on_cudnn[b]) continue;
        const int64_t first = mm->joint_start[b], at = first * heads * hd, padded = mm->joint_rows[b];
        const int64_t rows = joint_length(mm, b);
        if (padded > rows)
            attention_cudnn_bwd_padded(env->cudnn, j.q + at, j.k + at, j.v + at, j.a + at, g.o + at,
                                       j.lse + first * heads, rows, padded, heads, hd, g.q + at, g.k + at, g.v + at,
                                       stream);
        else
            attention_cudnn_bwd(env->cudnn, j.q + at, j.k + at, j.v + at, j.a + at, g.o + at, j.lse + first * heads,
                                rows, heads, hd, g.q + at, g.k + at, g.v + at, stream);
    }
#else
    (void)env;
#endif
}

// ---- sequence parallelism: the exchange over heads (Ulysses) ---------------------------------------------------

// Member q's rows in the exchange's member order: its video slice, then its text slice.
int64_t member_rows(const group_state &sp, int q)
{
    return sp.video_slice[q + 1] - sp.video_slice[q] + sp.text_slice[q + 1] - sp.text_slice[q];
}

int64_t member_first(const group_state &sp, int q) { return sp.video_slice[q] + sp.text_slice[q]; }

// The member's rows of n tensors of both streams (video[i] [n, D], text[i] [n_text, D]) -> recv[i] [Tv + Tt, D/k] (every
// row in member order, this member's heads): columns [q D/k, (q+1) D/k) of its rows go to member q, which places them
// at this member's rows.
void sp_to_heads(mmdit_gpu *mm, const gpu_bf16 *const *video, const gpu_bf16 *const *text, gpu_bf16 *const *recv,
                 int n, cudaStream_t stream)
{
    group_state &sp = mm->sp;
    const int k = sp.k, vecs = mm->D / 8;
    const int64_t rows = mm->n + mm->n_text, Dk = mm->D / k;
    const gpu_bf16 *send[3];
    for (int i = 0; i < n; ++i) {
        gpu_bf16 *packed = sp.send + i * rows * mm->D;
        LAUNCH(split_streams_kernel, rows * vecs, reinterpret_cast<const uint4 *>(video[i]),
               reinterpret_cast<const uint4 *>(text[i]), mm->n, rows, vecs, k, reinterpret_cast<uint4 *>(packed));
        send[i] = packed;
    }
    int64_t *c = sp.counts;
    for (int q = 0; q < k; ++q) {
        c[q] = rows * Dk;
        c[k + q] = q * rows * Dk;
        c[2 * k + q] = member_rows(sp, q) * Dk;
        c[3 * k + q] = member_first(sp, q) * Dk;
    }
    seqpar_gpu_alltoall_bf16(sp.group, n, send, c, c + k, recv, c + 2 * k, c + 3 * k, stream);
}

// The reverse of sp_to_heads: recv[i] [Tv + Tt, D/k] -> the member's rows video[i] [n, D], text[i] [n_text, D].
void sp_to_tokens(mmdit_gpu *mm, const gpu_bf16 *const *recv, gpu_bf16 *const *video, gpu_bf16 *const *text, int n,
                  cudaStream_t stream)
{
    group_state &sp = mm->sp;
    const int k = sp.k, vecs = mm->D / 8;
    const int64_t rows = mm->n + mm->n_text, Dk = mm->D / k;
    gpu_bf16 *back[3];
    for (int i = 0; i < n; ++i) back[i] = sp.send + i * rows * mm->D;
    int64_t *c = sp.counts;
    for (int q = 0; q < k; ++q) {
        c[q] = member_rows(sp, q) * Dk;
        c[k + q] = member_first(sp, q) * Dk;
        c[2 * k + q] = rows * Dk;
        c[3 * k + q] = q * rows * Dk;
    }
    seqpar_gpu_alltoall_bf16(sp.group, n, recv, c, c + k, back, c + 2 * k, c + 3 * k, stream);
    for (int i = 0; i < n; ++i)
        LAUNCH(join_streams_kernel, rows * vecs, reinterpret_cast<const uint4 *>(back[i]), mm->n, rows, vecs, k,
               reinterpret_cast<uint4 *>(video[i]), reinterpret_cast<uint4 *>(text[i]));
}

// The exchange's rows of tensor i (0..2) in the group buffers.
gpu_bf16 *sp_recv(const mmdit_gpu *mm, int i)
{
    const group_state &sp = mm->sp;
    return sp.recv + i * (sp.n_video + sp.n_text) * (mm->D / sp.k);
}

// Block l's joint attention of the streams' q, k, v (sv, st: tq, tk, tv) into the streams' outputs a: alone over the
// joint layout at every head; in a group q, k, v go to the head owners, each attends for its heads over every sample
// whole, and the output comes back.
void attention_fwd_block(mmdit_gpu *mm, const mmdit_gpu_env *env, int l, block_saved &s, cudaStream_t stream)
{
    if (!mm->sp.group) {
        const int32_t *map = mm->dev.joint_map;
        joint_gather(mm, map, mm->sv.tq, mm->st.tq, mm->n, mm->D, s.j.q, stream);
        joint_gather(mm, map, mm->sv.tk, mm->st.tk, mm->n, mm->D, s.j.k, stream);
        joint_gather(mm, map, mm->sv.tv, mm->st.tv, mm->n, mm->D, s.j.v, stream);
        joint_attention_fwd(mm, env, s.j, mm->H, stream);
        joint_scatter(mm, map, s.j.a, mm->n, mm->D, s.v.a, s.t.a, stream);
        return;
    }
    const group_state &sp = mm->sp;
    const joint_tensors &j = sp.sets[l];
    const int64_t T = sp.n_video + sp.n_text;
    const int Dk = mm->D / sp.k;
    gpu_bf16 *const recv[] = {sp_recv(mm, 0), sp_recv(mm, 1), sp_recv(mm, 2)};
    const gpu_bf16 *const video[] = {mm->sv.tq, mm->sv.tk, mm->sv.tv}, *const text[] = {mm->st.tq, mm->st.tk, mm->st.tv};
    sp_to_heads(mm, video, text, recv, 3, stream);
    gpu_bf16 *const joint[] = {j.q, j.k, j.v};
    for (int i = 0; i < 3; ++i) joint_gather(mm, sp.map, recv[i], recv[i], T, Dk, joint[i], stream);
    joint_attention_fwd(mm, env, j, mm->H / sp.k, stream);
    joint_scatter(mm, sp.map, j.a, T, Dk, recv[0], recv[0], stream);
    gpu_bf16 *const video_out[] = {s.v.a}, *const text_out[] = {s.t.a};
    sp_to_tokens(mm, recv, video_out, text_out, 1, stream);
}

// Its backward: from the output's gradient in the streams' d_t, dq, dk, dv into their tq, tk, tv (in a group the
// output's gradient goes to the head owners and dq, dk, dv come back).
void attention_bwd_block(mmdit_gpu *mm, const mmdit_gpu_env *env, int l, const block_saved &s, cudaStream_t stream)
{
    if (!mm->sp.group) {
        const int32_t *map = mm->dev.joint_map;
        const joint_grads &g = mm->d_joint;
        joint_gather(mm, map, mm->sv.d_t, mm->st.d_t, mm->n, mm->D, g.o, stream);
        joint_attention_bwd(mm, env, s.j, g, mm->H, stream);
        joint_scatter(mm, map, g.q, mm->n, mm->D, mm->sv.tq, mm->st.tq, stream);
        joint_scatter(mm, map, g.k, mm->n, mm->D, mm->sv.tk, mm->st.tk, stream);
        joint_scatter(mm, map, g.v, mm->n, mm->D, mm->sv.tv, mm->st.tv, stream);
        return;
    }
    const group_state &sp = mm->sp;
    const joint_grads &g = sp.grads;
    const int64_t T = sp.n_video + sp.n_text;
    const int Dk = mm->D / sp.k;
    gpu_bf16 *const recv[] = {sp_recv(mm, 0), sp_recv(mm, 1), sp_recv(mm, 2)};
    const gpu_bf16 *const video_out[] = {mm->sv.d_t}, *const text_out[] = {mm->st.d_t};
    sp_to_heads(mm, video_out, text_out, recv, 1, stream);
    joint_gather(mm, sp.map, recv[0], recv[0], T, Dk, g.o, stream);
    joint_attention_bwd(mm, env, sp.sets[l], g, mm->H / sp.k, stream);
    const gpu_bf16 *const grads[] = {g.q, g.k, g.v};
    for (int i = 0; i < 3; ++i) joint_scatter(mm, sp.map, grads[i], T, Dk, recv[i], recv[i], stream);
    gpu_bf16 *const video[] = {mm->sv.tq, mm->sv.tk, mm->sv.tv}, *const text[] = {mm->st.tq, mm->st.tk, mm->st.tv};
    sp_to_tokens(mm, recv, video, text, 3, stream);
}

// ---- the dual-stream block ---------------------------------------------------------------------------------------

// One stream's rows, parameters and scratch.
struct stream_view {
    int64_t n;
    const int64_t *start;          // device [B + 1]
    stream_offsets off;
    const int32_t *positions;      // device [n, 3]; NULL: no RoPE (text)
    stream_scratch *sc;
};

stream_view video_view(mmdit_gpu *mm)
{
    const layout_mmdit_block &b = mm->layout.mmdit_block;
    return {mm->n, mm->dev.tok, {b.norm1, b.to_q, b.to_k, b.to_v, b.to_out, b.ff_in, b.ff_out, b.norm_q, b.norm_k},
            mm->dev.positions, &mm->sv};
}

stream_view text_view(mmdit_gpu *mm)
{
    const layout_mmdit_block &b = mm->layout.mmdit_block;
    return {mm->n_text, mm->dev.txt,
            {b.norm1_context, b.add_q, b.add_k, b.add_v, b.to_add_out, b.ff_context_in, b.ff_context_out,
             b.norm_added_q, b.norm_added_k},
            nullptr, &mm->st};
}

// Modulation, LN-modulate and the q, k, v projections of one stream: q, k (after the per-head RMSNorm and, on video,
// RoPE) and v into the stream's scratch tq, tk, tv.
void stream_qkv_fwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *w, const stream_view &v, stream_saved &s,
                    cudaStream_t stream)
{
    const int B = mm->n_samples, D = mm->D, H = mm->H, hd = mm->hd;
    rows_linear_fwd(mm->temb_silu, B, D, 6 * D, w, v.off.mod, D, s.mod, stream);
    lnmod_fwd(s.x_in, v.n, D, v.start, B, chunk(s.mod, 0, B, D), chunk(s.mod, 1, B, D), mm->eps, s.h1, s.ln1_mean,
              s.ln1_rstd, stream);
    linear_fwd(env, w, s.h1, v.n, D, D, v.off.q, s.q_pre, stream);
    linear_fwd(env, w, s.h1, v.n, D, D, v.off.k, s.k_pre, stream);
    linear_fwd(env, w, s.h1, v.n, D, D, v.off.v, v.sc->tv, stream);
    fused_head_norm_rope_fwd(s.q_pre, v.n, H, hd, w + v.off.norm_q, mm->eps, v.positions, mm->axes,
                             LAYOUT_MMDIT_ROPE_THETA, v.sc->tq, s.q_rstd, stream);
    fused_head_norm_rope_fwd(s.k_pre, v.n, H, hd, w + v.off.norm_k, mm->eps, v.positions, mm->axes,
                             LAYOUT_MMDIT_ROPE_THETA, v.sc->tk, s.k_rstd, stream);
}

// The output projection, gated residual + LN-modulate, MLP and its gated residual into out.
void stream_out_fwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *w, const stream_view &v, stream_saved &s,
                    gpu_bf16 *out, cudaStream_t stream)
{
    const int B = mm->n_samples, D = mm->D, F = mm->F;
    linear_fwd(env, w, s.a, v.n, D, D, v.off.o, s.y_attn, stream);
    lnmod_residual_fwd(s.x_in, s.y_attn, v.n, D, v.start, B, chunk(s.mod, 2, B, D), chunk(s.mod, 3, B, D),
                       chunk(s.mod, 4, B, D), mm->eps, s.x1, s.h2, s.ln2_mean, s.ln2_rstd, stream);
    linear_gelu_fwd(env, w, s.h2, v.n, D, F, v.off.ff_in, s.ff_pre, s.ff_act, stream);
    linear_fwd(env, w, s.ff_act, v.n, F, D, v.off.ff_out, s.y_ff, stream);
    gated_residual(s.x1, s.y_ff, chunk(s.mod, 5, B, D), v.start, B, v.n, D, out, stream);
}

int forward_next(const mmdit_gpu *mm, int layer) { return layer + 1 < mm->layers ? layer + 1 : layer - 1; }

// Block l's forward from its kept inputs into the next block's (or the head's).
void block_forward(mmdit_gpu *mm, const mmdit_gpu_env *env, int l, bool recomputing, cudaStream_t stream)
{
    const gpu_model_params &p = *env->params;
    const gpu_bf16 *w = p.block_weights(p.context, l, recomputing ? l - 1 : forward_next(mm, l), stream);
    block_saved &s = mm->saved[l];
    const stream_view video = video_view(mm), text = text_view(mm);
    stream_qkv_fwd(mm, env, w, video, s.v, stream);
    stream_qkv_fwd(mm, env, w, text, s.t, stream);
    attention_fwd_block(mm, env, l, s, stream);
    const bool last = l + 1 == mm->layers;
    stream_out_fwd(mm, env, w, video, s.v, last ? mm->x_final : mm->saved[l + 1].v.x_in, stream);
    stream_out_fwd(mm, env, w, text, s.t, last ? mm->c_final : mm->saved[l + 1].t.x_in, stream);
}

// From d(out) in sc->d_res: the MLP branch, the attention's residual + LN backward (sc->d_res becomes d x_in's
// residual part) and the output projection's: d(attention output) into sc->d_t.
void stream_out_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *w, float *g, const stream_view &v,
                    const stream_saved &s, cudaStream_t stream)
{
    const int B = mm->n_samples, D = mm->D, F = mm->F;
    stream_scratch &sc = *v.sc;
    gated_residual_bwd(sc.d_res, s.y_ff, chunk(s.mod, 5, B, D), v.start, B, v.n, D, sc.d_y, chunk(sc.d_mod, 5, B, D),
                       mm->scratch, mm->scratch_bytes, stream);
    linear_bwd(env, w, g, s.ff_act, sc.d_y, v.n, F, D, v.off.ff_out, s.ff_pre, sc.d_ff, 0, stream);
    linear_bwd(env, w, g, s.h2, sc.d_ff, v.n, D, F, v.off.ff_in, nullptr, sc.d_h, 0, stream);
    lnmod_residual_bwd(s.x1, s.y_attn, sc.d_h, sc.d_res, v.n, D, v.start, B, chunk(s.mod, 2, B, D),
                       chunk(s.mod, 4, B, D), s.ln2_mean, s.ln2_rstd, sc.d_res, sc.d_y, chunk(sc.d_mod, 3, B, D),
                       chunk(sc.d_mod, 4, B, D), chunk(sc.d_mod, 2, B, D), mm->scratch, stream);
    linear_bwd(env, w, g, s.a, sc.d_y, v.n, D, D, v.off.o, nullptr, sc.d_t, 0, stream);
}

// From dq, dk, dv in the stream's tq, tk, tv: the norms, projections, the first LN-modulate (its input's gradient
// added into sc->d_res) and the modulation Linear (d temb_silu added into).
void stream_qkv_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *w, float *g, const stream_view &v,
                    const stream_saved &s, cudaStream_t stream)
{
    const int B = mm->n_samples, D = mm->D, H = mm->H, hd = mm->hd;
    stream_scratch &sc = *v.sc;
    fused_head_norm_rope_bwd(s.q_pre, sc.tq, v.n, H, hd, w + v.off.norm_q, v.positions, mm->axes,
                             LAYOUT_MMDIT_ROPE_THETA, s.q_rstd, sc.tq, g + v.off.norm_q, mm->scratch, stream);
    fused_head_norm_rope_bwd(s.k_pre, sc.tk, v.n, H, hd, w + v.off.norm_k, v.positions, mm->axes,
                             LAYOUT_MMDIT_ROPE_THETA, s.k_rstd, sc.tk, g + v.off.norm_k, mm->scratch, stream);
    linear_bwd(env, w, g, s.h1, sc.tq, v.n, D, D, v.off.q, nullptr, sc.d_h, 0, stream);
    linear_bwd(env, w, g, s.h1, sc.tk, v.n, D, D, v.off.k, nullptr, sc.d_h, 1, stream);
    linear_bwd(env, w, g, s.h1, sc.tv, v.n, D, D, v.off.v, nullptr, sc.d_h, 1, stream);
    lnmod_bwd(s.x_in, sc.d_h, v.n, D, v.start, B, chunk(s.mod, 1, B, D), s.ln1_mean, s.ln1_rstd, sc.d_t,
              chunk(sc.d_mod, 0, B, D), chunk(sc.d_mod, 1, B, D), mm->scratch, stream);
    misc_add_bf16(sc.d_res, sc.d_t, v.n * D, sc.d_res, stream);
    rows_linear_bwd(mm->temb_silu, sc.d_mod, B, D, 6 * D, w, g, v.off.mod, D, mm->d_temb_silu, 1, mm->scratch,
                    mm->scratch_bytes, stream);
}

void grads_ready(const mmdit_gpu_env *env, int64_t first, int64_t count, cudaStream_t stream)
{
    if (env->grads_ready && count > 0) env->grads_ready(env->grads_ready_context, first, count, stream);
}

// Block l's backward: the streams' d_res hold the gradients of its outputs and become those of its inputs.
void block_backward(mmdit_gpu *mm, const mmdit_gpu_env *env, int l, cudaStream_t stream)
{
    const gpu_model_params &p = *env->params;
    const gpu_bf16 *w = p.block_weights(p.context, l, l - 1, stream);
    float *g = p.block_grads(p.context, l, stream);
    const block_saved &s = mm->saved[l];
    const stream_view video = video_view(mm), text = text_view(mm);
    stream_out_bwd(mm, env, w, g, video, s.v, stream);
    stream_out_bwd(mm, env, w, g, text, s.t, stream);
    attention_bwd_block(mm, env, l, s, stream);
    stream_qkv_bwd(mm, env, w, g, video, s.v, stream);
    stream_qkv_bwd(mm, env, w, g, text, s.t, stream);
    const int64_t first = mm->layout.blocks_offset + (int64_t)l * mm->layout.block_stride;
    grads_ready(env, first, mm->layout.block_stride, stream);
    if (l > 0 && mm->recompute == GPU_RECOMPUTE_BLOCK) block_forward(mm, env, l - 1, true, stream);
}

// ---- conditioning: time, the token refiner, ByT5, image ----------------------------------------------------------

const float *time_value(const mmdit_gpu *mm, const float *tw, int64_t offset) { return tw + (offset - mm->time_first); }

void time_fwd(mmdit_gpu *mm, const float *tw, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int B = mm->n_samples, D = mm->D;
    misc_linear_f32_fwd(mm->dev.sinusoid, B, mm->FQ, D, time_value(mm, tw, e.time_1.weight),
                        time_value(mm, tw, e.time_1.bias), mm->t_pre, stream);
    misc_silu_f32_fwd(mm->t_pre, (int64_t)B * D, mm->t_act, stream);
    misc_linear_f32_fwd(mm->t_act, B, D, D, time_value(mm, tw, e.time_2.weight), time_value(mm, tw, e.time_2.bias),
                        mm->temb, stream);
    misc_silu_f32_fwd(mm->temb, (int64_t)B * D, mm->temb_silu, stream);
}

// The refiner's conditioning: its own time embedding plus the projected mean of each caption's Qwen rows.
void refiner_conditioning_fwd(mmdit_gpu *mm, const gpu_bf16 *ew, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int B = mm->n_samples, D = mm->D;
    LAUNCH(pool_mean_kernel, (int64_t)B * mm->T, mm->text_f32, mm->dev.qwen, B, mm->T, mm->pooled);
    rows_linear_fwd(mm->dev.sinusoid, B, mm->FQ, D, ew, e.refiner_time_1, 0, mm->rt_pre, stream);
    misc_silu_f32_fwd(mm->rt_pre, (int64_t)B * D, mm->rt_act, stream);
    rows_linear_fwd(mm->rt_act, B, D, D, ew, e.refiner_time_2, 0, mm->cvec, stream);
    rows_linear_fwd(mm->pooled, B, mm->T, D, ew, e.refiner_text_1, 0, mm->rp_pre, stream);
    misc_silu_f32_fwd(mm->rp_pre, (int64_t)B * D, mm->rp_act, stream);
    rows_linear_fwd(mm->rp_act, B, D, D, ew, e.refiner_text_2, 0, mm->tmp, stream);
    misc_accumulate_f32(mm->tmp, (int64_t)B * D, mm->cvec, stream);
    misc_silu_f32_fwd(mm->cvec, (int64_t)B * D, mm->cvec_silu, stream);
}

void refiner_block_fwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, int i, gpu_bf16 *r_out,
                       cudaStream_t stream)
{
    const layout_refiner_block &rb = mm->layout.mmdit.refiner[i];
    refiner_saved &s = mm->refiner[i];
    const int B = mm->n_samples, D = mm->D, R = LAYOUT_MMDIT_REFINER_MLP_RATIO * mm->D;
    const int64_t Q = mm->n_qwen;
    const int64_t *rows = mm->dev.qwen;
    rows_linear_fwd(mm->cvec_silu, B, D, 2 * D, ew, rb.ada, D, s.gates, stream);
    LAUNCH(affine_vectors_kernel, (int64_t)B * D, ew + rb.norm1_weight, ew + rb.norm1_bias, B, D, s.shift1, s.scale1);
    LAUNCH(affine_vectors_kernel, (int64_t)B * D, ew + rb.norm2_weight, ew + rb.norm2_bias, B, D, s.shift2, s.scale2);
    lnmod_fwd(s.r_in, Q, D, rows, B, s.shift1, s.scale1, mm->eps, s.n1, s.n1_mean, s.n1_rstd, stream);
    linear_fwd(env, ew, s.n1, Q, D, D, rb.q, s.q, stream);
    linear_fwd(env, ew, s.n1, Q, D, D, rb.k, s.k, stream);
    linear_fwd(env, ew, s.n1, Q, D, D, rb.v, s.v, stream);
    attention_fwd(s.q, s.k, s.v, mm->H, mm->hd, rows, rows, B, Q, Q, s.attn, s.lse, stream);
    linear_fwd(env, ew, s.attn, Q, D, D, rb.o, s.y_attn, stream);
    lnmod_residual_fwd(s.r_in, s.y_attn, Q, D, rows, B, s.gates, s.shift2, s.scale2, mm->eps, s.r1, s.n2, s.n2_mean,
                       s.n2_rstd, stream);
    linear_fwd(env, ew, s.n2, Q, D, R, rb.ff_in, s.ff_pre, stream);
    LAUNCH(silu_bf16_kernel, Q * R, s.ff_pre, Q * R, s.ff_act);
    linear_fwd(env, ew, s.ff_act, Q, R, D, rb.ff_out, s.y_ff, stream);
    gated_residual(s.r1, s.y_ff, s.gates + (int64_t)B * D, rows, B, Q, D, r_out, stream);
}

// An affine LayerNorm (eps 1e-5) of all `rows` rows of width `dim` (one range: spans {0, rows}).
void affine_ln_fwd(mmdit_gpu *mm, const gpu_bf16 *ew, int64_t weight, int64_t bias, const gpu_bf16 *x, int64_t rows,
                   int dim, const int64_t *span, float *shift, float *scale, gpu_bf16 *y, float *mean, float *rstd,
                   cudaStream_t stream)
{
    LAUNCH(affine_vectors_kernel, (int64_t)dim, ew + weight, ew + bias, 1, dim, shift, scale);
    lnmod_fwd(x, rows, dim, span, 1, shift, scale, (float)LAYOUT_MMDIT_EMBEDDER_EPS, y, mean, rstd, stream);
    (void)mm;
}

// Its backward: the weight's and bias' gradients added into g; the input's gradient into dx.
void affine_ln_bwd(mmdit_gpu *mm, float *g, int64_t weight, int64_t bias, const gpu_bf16 *x, const gpu_bf16 *dy,
                   int64_t rows, int dim, const int64_t *span, const float *scale, const float *mean, const float *rstd,
                   gpu_bf16 *dx, cudaStream_t stream)
{
    lnmod_bwd(x, dy, rows, dim, span, 1, scale, mean, rstd, dx, mm->d_shift, mm->d_scale, mm->scratch, stream);
    misc_accumulate_f32(mm->d_scale, dim, g + weight, stream);
    misc_accumulate_f32(mm->d_shift, dim, g + bias, stream);
}

void byt5_fwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int64_t G = mm->n_byt5;
    const int E = LAYOUT_MMDIT_BYT5_HIDDEN;
    misc_f32_to_bf16(mm->text2_f32, G * mm->T2, mm->text2, stream);
    affine_ln_fwd(mm, ew, e.byt5_norm_weight, e.byt5_norm_bias, mm->text2, G, mm->T2, mm->dev.spans + 2, mm->byt5_shift,
                  mm->byt5_scale, mm->g_norm, mm->g_mean, mm->g_rstd, stream);
    linear_fwd(env, ew, mm->g_norm, G, mm->T2, E, e.byt5_1, mm->g1_pre, stream);
    LAUNCH(gelu_erf_kernel, G * E, mm->g1_pre, G * E, mm->g1_act);
    linear_fwd(env, ew, mm->g1_act, G, E, E, e.byt5_2, mm->g2_pre, stream);
    LAUNCH(gelu_erf_kernel, G * E, mm->g2_pre, G * E, mm->g2_act);
    linear_fwd(env, ew, mm->g2_act, G, E, mm->D, e.byt5_3, mm->g_out, stream);
}

void image_fwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int64_t I = mm->n_image;
    const int IM = mm->IM, D = mm->D;
    misc_f32_to_bf16(mm->image_f32, I * IM, mm->image, stream);
    affine_ln_fwd(mm, ew, e.image_norm_in_weight, e.image_norm_in_bias, mm->image, I, IM, mm->dev.spans + 4,
                  mm->image_shift, mm->image_scale, mm->i_norm, mm->i_mean, mm->i_rstd, stream);
    linear_fwd(env, ew, mm->i_norm, I, IM, IM, e.image_1, mm->i1_pre, stream);
    LAUNCH(gelu_erf_kernel, I * IM, mm->i1_pre, I * IM, mm->i1_act);
    linear_fwd(env, ew, mm->i1_act, I, IM, D, e.image_2, mm->i2, stream);
    affine_ln_fwd(mm, ew, e.image_norm_out_weight, e.image_norm_out_bias, mm->i2, I, D, mm->dev.spans + 4,
                  mm->image_out_shift, mm->image_out_scale, mm->i_out, mm->i_mean2, mm->i_rstd2, stream);
}

// ---- the whole model ---------------------------------------------------------------------------------------------

// Embeddings, blocks and head; ends with the per-sample losses and, unless loss_only, the prediction's gradient.
void forward(mmdit_gpu *mm, const mmdit_gpu_env *env, float grad_scale, bool loss_only, cudaStream_t stream)
{
    const gpu_model_params &p = *env->params;
    const layout_mmdit &e = mm->layout.mmdit;
    const int B = mm->n_samples, D = mm->D;
    const int64_t N = mm->n, L = mm->n_text, Q = mm->n_qwen;
    const gpu_bf16 *ew = p.embedding_weights, *hw = p.head_weights;
    const float *tw = p.time_weights(p.context, 0, stream);

    // in a group the member's rows of the whole samples (first: sp_slice's device table)
    const group_state &sp = mm->sp;
    patchify_args pa = {sp.group ? sp.latents : mm->latents, sp.group ? sp.noise : mm->noise, mm->dev.sigma, mm->dev.tok,
                        mm->dev.latent_start, sp.group ? sp.tables : nullptr, mm->dev.shape, mm->dev.i2v, B,
                        mm->out_dim, mm->patch_t, mm->patch_h, mm->patch_w, mm->patch_in, mm->patch_cols, N,
                        mm->tokens_in, mm->x0_tokens, mm->noise_tokens};
    LAUNCH(patchify_kernel, N * mm->patch_cols, pa);
    misc_f32_to_bf16(mm->text_f32, Q * mm->T, mm->text, stream);

    time_fwd(mm, tw, stream);
    refiner_conditioning_fwd(mm, ew, stream);
    linear_fwd(env, ew, mm->text, Q, mm->T, D, e.refiner_proj_in, mm->refiner[0].r_in, stream);
    for (int i = 0; i < LAYOUT_MMDIT_REFINER_LAYERS; ++i)
        refiner_block_fwd(mm, env, ew, i, i + 1 < LAYOUT_MMDIT_REFINER_LAYERS ? mm->refiner[i + 1].r_in : mm->r_final,
                          stream);
    if (mm->n_byt5 > 0) byt5_fwd(mm, env, ew, stream);
    if (mm->n_image > 0) image_fwd(mm, env, ew, stream);
    gpu_bf16 *x = mm->layers > 0 ? mm->saved[0].v.x_in : mm->x_final;
    gpu_bf16 *c = mm->layers > 0 ? mm->saved[0].t.x_in : mm->c_final;
    // the text stream's rows: in a group the member's slice of the joint text (from text_lo)
    LAUNCH(text_assemble_kernel, L * D, mm->dev.text_map + mm->text_lo, L, D, mm->r_final, mm->g_out, mm->i_out,
           time_value(mm, tw, e.cond_type), c);
    // the patch embedding: its weight [D, patch_in] padded to whole 16-byte rows for the GEMM
    LAUNCH(pad_columns_kernel, (int64_t)D * mm->patch_cols, ew + e.patch.weight, (int64_t)D, mm->patch_in,
           mm->patch_cols, mm->w_pad);
    if (N > 0)
        gemm_linear_fwd(env->gemm, mm->tokens_in, N, mm->patch_cols, D, mm->w_pad, ew + e.patch.bias,
                        GEMM_EPILOGUE_BIAS, x, nullptr, stream);

    for (int l = 0; l < mm->layers; ++l) block_forward(mm, env, l, false, stream);

    // head: AdaLayerNormContinuous, (scale, shift) = Linear(SiLU(temb)) in that order, then proj_out
    const layout_linear norm_out = shifted(e.norm_out, -mm->head_first), proj_out = shifted(e.proj_out, -mm->head_first);
    rows_linear_fwd(mm->temb_silu, B, D, 2 * D, hw, norm_out, D, mm->head_mod, stream);
    lnmod_fwd(mm->x_final, N, D, mm->dev.tok, B, chunk(mm->head_mod, 1, B, D), chunk(mm->head_mod, 0, B, D), mm->eps,
              mm->head_h, mm->head_mean, mm->head_rstd, stream);
    linear_fwd(env, hw, mm->head_h, N, D, mm->patch_out, proj_out, mm->pred, stream);
    if (sp.group)   // this member's part of each sample's mean: divided by the whole sample's count (whole_pred)
        fused_flow_loss_part_bf16(mm->pred, mm->x0_tokens, mm->noise_tokens, mm->dev.pred_start, sp.tables + B, B,
                                  grad_scale, mm->sample_loss, loss_only ? nullptr : mm->d_pred, mm->scratch, stream);
    else
        fused_flow_loss_bf16(mm->pred, mm->x0_tokens, mm->noise_tokens, mm->dev.pred_start, B, grad_scale,
                             mm->sample_loss, loss_only ? nullptr : mm->d_pred, mm->scratch, stream);
}

// The refiner block's backward: d_r (the gradient of its output) becomes its input's; d cvec_silu added into.
void refiner_block_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, float *grads, int i,
                       cudaStream_t stream)
{
    const layout_refiner_block &rb = mm->layout.mmdit.refiner[i];
    const refiner_saved &s = mm->refiner[i];
    const int B = mm->n_samples, D = mm->D, R = LAYOUT_MMDIT_REFINER_MLP_RATIO * mm->D;
    const int64_t Q = mm->n_qwen;
    const int64_t *rows = mm->dev.qwen;
    stream_scratch &sc = mm->st;
    gpu_bf16 *dr = mm->d_r;
    gated_residual_bwd(dr, s.y_ff, s.gates + (int64_t)B * D, rows, B, Q, D, sc.d_y, mm->d_gates + (int64_t)B * D,
                       mm->scratch, mm->scratch_bytes, stream);
    linear_bwd(env, ew, grads, s.ff_act, sc.d_y, Q, R, D, rb.ff_out, nullptr, mm->d_rff, 0, stream);
    LAUNCH(silu_bf16_bwd_kernel, Q * R, s.ff_pre, mm->d_rff, Q * R, mm->d_rff);
    linear_bwd(env, ew, grads, s.n2, mm->d_rff, Q, D, R, rb.ff_in, nullptr, sc.d_h, 0, stream);
    lnmod_residual_bwd(s.r1, s.y_attn, sc.d_h, dr, Q, D, rows, B, s.gates, s.scale2, s.n2_mean, s.n2_rstd, dr, sc.d_y,
                       mm->d_shift, mm->d_scale, mm->d_gates, mm->scratch, stream);
    misc_sum_samples_into(mm->d_scale, B, D, grads + rb.norm2_weight, stream);
    misc_sum_samples_into(mm->d_shift, B, D, grads + rb.norm2_bias, stream);
    linear_bwd(env, ew, grads, s.attn, sc.d_y, Q, D, D, rb.o, nullptr, sc.d_t, 0, stream);
    attention_bwd(s.q, s.k, s.v, s.attn, sc.d_t, s.lse, mm->H, mm->hd, rows, rows, B, Q, Q, sc.tq, sc.tk, sc.tv,
                  mm->scratch, stream);
    linear_bwd(env, ew, grads, s.n1, sc.tq, Q, D, D, rb.q, nullptr, sc.d_h, 0, stream);
    linear_bwd(env, ew, grads, s.n1, sc.tk, Q, D, D, rb.k, nullptr, sc.d_h, 1, stream);
    linear_bwd(env, ew, grads, s.n1, sc.tv, Q, D, D, rb.v, nullptr, sc.d_h, 1, stream);
    lnmod_bwd(s.r_in, sc.d_h, Q, D, rows, B, s.scale1, s.n1_mean, s.n1_rstd, sc.d_t, mm->d_shift, mm->d_scale,
              mm->scratch, stream);
    misc_sum_samples_into(mm->d_scale, B, D, grads + rb.norm1_weight, stream);
    misc_sum_samples_into(mm->d_shift, B, D, grads + rb.norm1_bias, stream);
    misc_add_bf16(dr, sc.d_t, Q * D, dr, stream);
    rows_linear_bwd(mm->cvec_silu, mm->d_gates, B, D, 2 * D, ew, grads, rb.ada, D, mm->d_cvec_silu, 1, mm->scratch,
                    mm->scratch_bytes, stream);
}

void byt5_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, float *grads, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int64_t G = mm->n_byt5;
    const int E = LAYOUT_MMDIT_BYT5_HIDDEN;
    linear_bwd(env, ew, grads, mm->g2_act, mm->d_g, G, E, mm->D, e.byt5_3, nullptr, mm->d_g2, 0, stream);
    LAUNCH(gelu_erf_bwd_kernel, G * E, mm->g2_pre, mm->d_g2, G * E, mm->d_g2);
    linear_bwd(env, ew, grads, mm->g1_act, mm->d_g2, G, E, E, e.byt5_2, nullptr, mm->d_g1, 0, stream);
    LAUNCH(gelu_erf_bwd_kernel, G * E, mm->g1_pre, mm->d_g1, G * E, mm->d_g1);
    linear_bwd(env, ew, grads, mm->g_norm, mm->d_g1, G, mm->T2, E, e.byt5_1, nullptr, mm->d_gin, 0, stream);
    affine_ln_bwd(mm, grads, e.byt5_norm_weight, e.byt5_norm_bias, mm->text2, mm->d_gin, G, mm->T2, mm->dev.spans + 2,
                  mm->byt5_scale, mm->g_mean, mm->g_rstd, mm->g_norm, stream);
}

void image_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, float *grads, cudaStream_t stream)
{
    const layout_mmdit &e = mm->layout.mmdit;
    const int64_t I = mm->n_image;
    const int IM = mm->IM, D = mm->D;
    gpu_bf16 *d_i2 = mm->st.d_t;
    affine_ln_bwd(mm, grads, e.image_norm_out_weight, e.image_norm_out_bias, mm->i2, mm->d_i, I, D, mm->dev.spans + 4,
                  mm->image_out_scale, mm->i_mean2, mm->i_rstd2, d_i2, stream);
    linear_bwd(env, ew, grads, mm->i1_act, d_i2, I, IM, D, e.image_2, nullptr, mm->d_i1, 0, stream);
    LAUNCH(gelu_erf_bwd_kernel, I * IM, mm->i1_pre, mm->d_i1, I * IM, mm->d_i1);
    linear_bwd(env, ew, grads, mm->i_norm, mm->d_i1, I, IM, IM, e.image_1, nullptr, mm->d_iin, 0, stream);
    affine_ln_bwd(mm, grads, e.image_norm_in_weight, e.image_norm_in_bias, mm->image, mm->d_iin, I, IM,
                  mm->dev.spans + 4, mm->image_scale, mm->i_mean, mm->i_rstd, mm->i_norm, stream);
}

// The refiner's conditioning (bf16 weights) and the time path (fp32, time_weights), from d cvec_silu and
// d temb_silu.
void conditioning_bwd(mmdit_gpu *mm, const mmdit_gpu_env *env, const gpu_bf16 *ew, float *grads, cudaStream_t stream)
{
    const gpu_model_params &p = *env->params;
    const layout_mmdit &e = mm->layout.mmdit;
    const int B = mm->n_samples, D = mm->D, FQ = mm->FQ;
    const int64_t BD = (int64_t)B * D;
    misc_silu_f32_bwd(mm->cvec, mm->d_cvec_silu, BD, mm->d_cvec, stream);
    rows_linear_bwd(mm->rt_act, mm->d_cvec, B, D, D, ew, grads, e.refiner_time_2, 0, mm->d_tb, 0, mm->scratch,
                    mm->scratch_bytes, stream);
    misc_silu_f32_bwd(mm->rt_pre, mm->d_tb, BD, mm->d_tb, stream);
    rows_linear_bwd(mm->dev.sinusoid, mm->d_tb, B, FQ, D, ew, grads, e.refiner_time_1, 0, nullptr, 0, mm->scratch,
                    mm->scratch_bytes, stream);
    rows_linear_bwd(mm->rp_act, mm->d_cvec, B, D, D, ew, grads, e.refiner_text_2, 0, mm->d_tb, 0, mm->scratch,
                    mm->scratch_bytes, stream);
    misc_silu_f32_bwd(mm->rp_pre, mm->d_tb, BD, mm->d_tb, stream);
    rows_linear_bwd(mm->pooled, mm->d_tb, B, mm->T, D, ew, grads, e.refiner_text_1, 0, nullptr, 0, mm->scratch,
                    mm->scratch_bytes, stream);
    const float *tw = p.time_weights(p.context, 1, stream);
    misc_silu_f32_bwd(mm->temb, mm->d_temb_silu, BD, mm->d_temb, stream);
    misc_linear_f32_bwd(mm->t_act, mm->d_temb, B, D, D, time_value(mm, tw, e.time_2.weight), mm->d_tb,
                        grads + e.time_2.weight, grads + e.time_2.bias, stream);
    misc_silu_f32_bwd(mm->t_pre, mm->d_tb, BD, mm->d_tb, stream);
    misc_linear_f32_bwd(mm->dev.sinusoid, mm->d_tb, B, FQ, D, time_value(mm, tw, e.time_1.weight), nullptr,
                        grads + e.time_1.weight, grads + e.time_1.bias, stream);
}

// The ranges reported after the blocks': the head's, then the embeddings'.
void head_and_embedding_grads_ready(const mmdit_gpu *mm, const mmdit_gpu_env *env, cudaStream_t stream)
{
    grads_ready(env, mm->head_first, mm->layout.n_weights - mm->head_first, stream);
    grads_ready(env, 0, mm->layout.blocks_offset, stream);
}

void backward(mmdit_gpu *mm, const mmdit_gpu_env *env, cudaStream_t stream)
{
    const gpu_model_params &p = *env->params;
    const layout_mmdit &e = mm->layout.mmdit;
    const int B = mm->n_samples, D = mm->D;
    const int64_t N = mm->n, L = mm->n_text, Q = mm->n_qwen;
    const gpu_bf16 *ew = p.embedding_weights, *hw = p.head_weights;

    // head: d_pred into the video stream's d_res (the last block's output gradient); the text's is zero
    const layout_linear norm_out = shifted(e.norm_out, -mm->head_first), proj_out = shifted(e.proj_out, -mm->head_first);
    linear_bwd(env, hw, p.head_grads, mm->head_h, mm->d_pred, N, D, mm->patch_out, proj_out, nullptr, mm->sv.d_h, 0,
               stream);
    lnmod_bwd(mm->x_final, mm->sv.d_h, N, D, mm->dev.tok, B, chunk(mm->head_mod, 0, B, D), mm->head_mean, mm->head_rstd,
              mm->sv.d_res, chunk(mm->d_head_mod, 1, B, D), chunk(mm->d_head_mod, 0, B, D), mm->scratch, stream);
    rows_linear_bwd(mm->temb_silu, mm->d_head_mod, B, D, 2 * D, hw, p.head_grads, norm_out, D, mm->d_temb_silu, 0,
                    mm->scratch, mm->scratch_bytes, stream);
    CUDA_CHECK(cudaMemsetAsync(mm->st.d_res, 0, (size_t)(L * D) * sizeof(gpu_bf16), stream));

    for (int l = mm->layers - 1; l >= 0; --l) block_backward(mm, env, l, stream);

    // embeddings: the patch (its padded weight's gradient, then the real columns), the joint text's sources
    float *grads = p.embedding_grads(p.context, stream);
    CUDA_CHECK(cudaMemsetAsync(mm->dw_pad, 0, (size_t)D * mm->patch_cols * sizeof(float), stream));
    if (N > 0)
        gemm_linear_bwd_weight(env->gemm, mm->tokens_in, mm->sv.d_res, N, mm->patch_cols, D, mm->dw_pad,
                               grads + e.patch.bias, 1, stream);
    LAUNCH(add_columns_kernel, (int64_t)D * mm->patch_in, mm->dw_pad, (int64_t)D, mm->patch_in, mm->patch_cols,
           grads + e.patch.weight);
    // the text stream's rows back to their sources; in a group only the member's slice (from text_lo), the other
    // members' rows zero: the sources, refiner and conditioning, run whole on every member, then give its parts
    if (mm->sp.group) {
        CUDA_CHECK(cudaMemsetAsync(mm->d_r, 0, (size_t)(Q * D) * sizeof(gpu_bf16), stream));
        CUDA_CHECK(cudaMemsetAsync(mm->d_g, 0, (size_t)(mm->n_byt5 * D) * sizeof(gpu_bf16), stream));
        CUDA_CHECK(cudaMemsetAsync(mm->d_i, 0, (size_t)(mm->n_image * D) * sizeof(gpu_bf16), stream));
    }
    const int32_t *text_map = mm->dev.text_map + mm->text_lo;
    const int parts = sum_parts(L, 3, D, mm->scratch_bytes);
    float *partial = static_cast<float *>(mm->scratch);
    LAUNCH(type_grad_partial_kernel, (int64_t)parts * D, text_map, L, D, parts, mm->st.d_res, partial);
    LAUNCH(parts_sum_kernel, (int64_t)3 * D, partial, 3, parts, D, 1, grads + e.cond_type);
    LAUNCH(text_split_kernel, L * D, text_map, L, D, mm->st.d_res, mm->d_r, mm->d_g, mm->d_i);
    if (mm->n_image > 0) image_bwd(mm, env, ew, grads, stream);
    if (mm->n_byt5 > 0) byt5_bwd(mm, env, ew, grads, stream);
    CUDA_CHECK(cudaMemsetAsync(mm->d_cvec_silu, 0, (size_t)B * D * sizeof(float), stream));
    for (int i = LAYOUT_MMDIT_REFINER_LAYERS - 1; i >= 0; --i) refiner_block_bwd(mm, env, ew, grads, i, stream);
    linear_bwd(env, ew, grads, mm->text, mm->d_r, Q, mm->T, D, e.refiner_proj_in, nullptr, nullptr, 0, stream);
    conditioning_bwd(mm, env, ew, grads, stream);
    head_and_embedding_grads_ready(mm, env, stream);
}

double wait_for_losses(mmdit_gpu *mm, double *sample_loss, cudaStream_t stream)
{
    CUDA_CHECK(cudaMemcpyAsync(mm->loss_pinned, mm->sample_loss, (size_t)mm->n_samples * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    gpu_stream_wait(stream);
    double total = 0.0;
    for (int b = 0; b < mm->n_samples; ++b) {
        if (sample_loss) sample_loss[b] = mm->loss_pinned[b];
        total += mm->loss_pinned[b];
    }
    return total;
}

} // namespace

extern "C" double mmdit_gpu_forward_backward(mmdit_gpu *mm, const mmdit_gpu_env *env, const model_batch *batch,
                                             float grad_scale, double *sample_loss, cudaStream_t stream)
{
    timespec queue_start, queue_end;
    clock_gettime(CLOCK_MONOTONIC, &queue_start);
    stage(mm, env, batch, stream);
    forward(mm, env, grad_scale, false, stream);
    backward(mm, env, stream);
    clock_gettime(CLOCK_MONOTONIC, &queue_end);
    mm->enqueue_seconds = (double)(queue_end.tv_sec - queue_start.tv_sec) + 1e-9 * (queue_end.tv_nsec - queue_start.tv_nsec);
    return wait_for_losses(mm, sample_loss, stream);
}

extern "C" double mmdit_gpu_forward_loss(mmdit_gpu *mm, const mmdit_gpu_env *env, const model_batch *batch,
                                         double *sample_loss, cudaStream_t stream)
{
    stage(mm, env, batch, stream);
    forward(mm, env, 0.0f, true, stream);
    return wait_for_losses(mm, sample_loss, stream);
}

extern "C" void mmdit_gpu_grads_ready_all(const mmdit_gpu *mm, const mmdit_gpu_env *env, cudaStream_t stream)
{
    // the calls forward and backward make, in their order
    const gpu_model_params &p = *env->params;
    p.time_weights(p.context, 0, stream);
    for (int l = 0; l < mm->layers; ++l) p.block_weights(p.context, l, forward_next(mm, l), stream);
    for (int l = mm->layers - 1; l >= 0; --l) {
        p.block_weights(p.context, l, l - 1, stream);
        p.block_grads(p.context, l, stream);
        grads_ready(env, mm->layout.blocks_offset + (int64_t)l * mm->layout.block_stride, mm->layout.block_stride, stream);
        if (l > 0 && mm->recompute == GPU_RECOMPUTE_BLOCK) p.block_weights(p.context, l - 1, l - 2, stream);
    }
    p.embedding_grads(p.context, stream);
    p.time_weights(p.context, 1, stream);
    head_and_embedding_grads_ready(mm, env, stream);
}
