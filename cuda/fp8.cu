// fp8.cu — FP8 casts from bf16 with their amax, and the delayed-scaling state and its per-step update (fp8.h).
#include "cuda/fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda/bf16vec.cuh"
#include "cuda/colsum.cuh"
#include "cuda/gelu.cuh"

namespace {

constexpr int kStateVersion = 2;   // 2: scale, scale_inv and amax one 16-byte slot per tensor (1: packed)
// Floats per tensor in the scale, scale_inv and amax arrays: each tensor's value on a 16-byte boundary, which
// cuBLASLt's FP8 kernels require of the scale pointers (a 4-byte-aligned one: status 15, not supported, on every
// algorithm; H200, cuBLASLt 13.1).
constexpr int kSlot = FP8_SLOT_FLOATS;
constexpr int kHeaderWords = 6;  // version, n_tensors, history_len, margin, position, updates
constexpr int kCastThreads = 256;
constexpr int kCastMaxBlocks = 4096;
constexpr int kTile = 32;        // transpose tile: kTile x kTile values, block kTile x kTileRows threads
constexpr int kTileRows = 8;
constexpr int kUpdateThreads = 128;
constexpr int kWideTile = 64;      // the vectorised transpose: kWideTile x kWideTile values a block,
constexpr int kWideThreads = 256;  // 16-byte loads (8 bf16) and 8-byte stores (8 FP8) along rows of x and of out_t
constexpr int kWideVecs = kWideTile / 8;  // vectors of 8 across a tile
static_assert(kWideTile * kWideVecs == 2 * kWideThreads, "two vectors a thread, 32 rows apart, in the same columns");

}  // namespace

struct fp8_scaling {
    int n, history_len, margin, position;
    int64_t updates;
    fp8_format *formats;   // host [n]
    int *formats_device;   // device [n]
    float *state;          // device: scale, scale_inv, amax [n][kSlot] each (value first), history [n][history_len]
};

namespace {

float *scale_of(const fp8_scaling *s) { return s->state; }
float *scale_inv_of(const fp8_scaling *s) { return s->state + (size_t)kSlot * s->n; }
float *amax_of(const fp8_scaling *s) { return s->state + (size_t)2 * kSlot * s->n; }
float *history_of(const fp8_scaling *s) { return s->state + (size_t)3 * kSlot * s->n; }
size_t state_floats(const fp8_scaling *s) { return (size_t)s->n * (size_t)(3 * kSlot + s->history_len); }

__host__ __device__ float format_max(int format) { return format == FP8_E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX; }

// fp8.h's rule, on host and device alike (IEEE division and ldexp: the same bits on both).
__host__ __device__ float scale_rule(float m, int format, int margin, float previous)
{
    if (!(m > 0.0f) || !isfinite(m)) return previous;
    const float scale = ldexpf(format_max(format) / m, -margin);
    return isfinite(scale) && scale > 0.0f ? scale : previous;
}

// What a cast casts of its bf16 input x (and, for kGeluGrad, of the GELU input pre at the same place): x itself;
// gelu_tanh(x); or x * gelu_tanh'(pre), the gradient of a GELU's input from that of its output.
enum class CastOf { kValue, kGelu, kGeluGrad };

template <CastOf OF>
__device__ __forceinline__ float input_value(float x, float pre)
{
    if constexpr (OF == CastOf::kGelu) return gelu_tanh(x);
    if constexpr (OF == CastOf::kGeluGrad) return x * gelu_tanh_grad(pre);
    (void)pre;
    return x;
}

// The 8 values of vector i that a cast of kind OF casts (pre read only for kGeluGrad).
template <CastOf OF>
__device__ __forceinline__ void load_values(const uint4 *__restrict__ x, const uint4 *__restrict__ pre, int64_t i,
                                            float (&v)[kVecElems])
{
    float p[kVecElems] = {0, 0, 0, 0, 0, 0, 0, 0};
    unpack8(x[i], v);
    if constexpr (OF == CastOf::kGeluGrad) unpack8(pre[i], p);
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) v[j] = input_value<OF>(v[j], p[j]);
}

__device__ __forceinline__ uint8_t to_fp8(float v, int format)
{
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

// max |x| over a block into *amax (non-negative floats order as their bits do).
__device__ void block_amax_into(float local, float *amax)
{
    __shared__ float warps[32];
    for (int offset = 16; offset > 0; offset >>= 1) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, offset));
    const int threads = blockDim.x * blockDim.y, id = threadIdx.y * blockDim.x + threadIdx.x;
    if (id % 32 == 0) warps[id / 32] = local;
    __syncthreads();
    if (id == 0) {
        float m = 0.0f;
        for (int w = 0; w < (threads + 31) / 32; ++w) m = fmaxf(m, warps[w]);
        if (m > 0.0f) atomicMax(reinterpret_cast<unsigned int *>(amax), __float_as_uint(m));
    }
}

// Where the value is NaN, fmaxf ignores it; a NaN input makes the amax at least the largest finite magnitude seen.
template <CastOf OF>
__global__ void amax_kernel(const uint4 *__restrict__ x, const uint4 *__restrict__ pre, int64_t n_vecs,
                            float *__restrict__ amax)
{
    float local = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        float f[kVecElems];
        load_values<OF>(x, pre, i, f);
#pragma unroll
        for (int j = 0; j < kVecElems; ++j) local = fmaxf(local, fabsf(f[j]));
    }
    block_amax_into(local, amax);
}

// Current scaling (before the first update): scale and scale_inv of tensor t from its running amax.
__global__ void scale_from_amax_kernel(float *__restrict__ state, int n, int t, int format, int margin)
{
    float *scale = state + t * kSlot, *scale_inv = scale + kSlot * n, *amax = scale + 2 * kSlot * n;
    *scale = scale_rule(*amax, format, margin, *scale);
    *scale_inv = 1.0f / *scale;
}

// out[i] = fp8(x[i] * scale), 8 values per thread and step; the amax of x into *amax.
template <CastOf OF>
__global__ void cast_kernel(const uint4 *__restrict__ x, int64_t n_vecs, const float *__restrict__ scale_p, int format,
                            uint2 *__restrict__ out, float *__restrict__ amax)
{
    const float scale = *scale_p;
    float local = 0.0f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        float f[kVecElems];
        unpack8(x[i], f);
        uint8_t q[kVecElems];
#pragma unroll
        for (int j = 0; j < kVecElems; ++j) {
            const float v = input_value<OF>(f[j], 0.0f);
            local = fmaxf(local, fabsf(v));
            q[j] = to_fp8(v * scale, format);
        }
        uint2 packed;
        memcpy(&packed, q, sizeof packed);
        out[i] = packed;
    }
    block_amax_into(local, amax);
}

// Tile (blockIdx.y, blockIdx.x) of kTile rows x kTile columns: out (when not NULL) [rows, cols] and out_t [cols, ld_t],
// the rows from `rows` to ld_t zero in out_t.
template <CastOf OF>
__global__ void __launch_bounds__(kTile *kTileRows)
    cast_transpose_kernel(const __nv_bfloat16 *__restrict__ x, int64_t rows, int cols, const float *__restrict__ scale_p,
                          int format, uint8_t *__restrict__ out, uint8_t *__restrict__ out_t, int64_t ld_t,
                          float *__restrict__ amax)
{
    __shared__ uint8_t tile[kTile][kTile + 4];
    const float scale = *scale_p;
    const int64_t r0 = (int64_t)blockIdx.y * kTile;
    const int c0 = blockIdx.x * kTile;
    const int c = c0 + threadIdx.x;
    float local = 0.0f;
    for (int dr = threadIdx.y; dr < kTile; dr += kTileRows) {
        const int64_t r = r0 + dr;
        uint8_t q = 0;
        if (r < rows && c < cols) {
            const float v = input_value<OF>(__bfloat162float(x[r * cols + c]), 0.0f);
            local = fmaxf(local, fabsf(v));
            q = to_fp8(v * scale, format);
            if (out) out[r * cols + c] = q;
        }
        tile[dr][threadIdx.x] = q;
    }
    __syncthreads();
    // thread x writes row-of-out_t c0 + dc, column r0 + x
    for (int dc = threadIdx.y; dc < kTile; dc += kTileRows) {
        const int64_t col = r0 + threadIdx.x;
        if (c0 + dc < cols && col < ld_t) out_t[(int64_t)(c0 + dc) * ld_t + col] = tile[threadIdx.x][dc];
    }
    block_amax_into(local, amax);
}

// cast_transpose_kernel with whole vectors, where cols and ld_t are multiples of 8: tile (blockIdx.y, blockIdx.x) of
// kWideTile rows x kWideTile columns; a thread casts vectors of 8 values of x's rows (16-byte loads, 8-byte stores
// to out) into the shared tile, then writes vectors of 8 bytes of out_t's rows from it. partials (may be NULL):
// [row tiles][cols], the column sums of the values cast over the tile's rows (each thread's two rows, then the 32
// threads of a column added in order: the same bits on every run). pre: the GELU input, for kGeluGrad (else NULL).
template <CastOf OF>
__global__ void __launch_bounds__(kWideThreads)
    cast_transpose_wide_kernel(const uint4 *__restrict__ x, const uint4 *__restrict__ pre, int64_t rows, int cols,
                               const float *__restrict__ scale_p,
                               int format, uint2 *__restrict__ out, uint8_t *__restrict__ out_t, int64_t ld_t,
                               float *__restrict__ amax, float *__restrict__ partials)
{
    __shared__ uint8_t tile[kWideTile][kWideTile + 8];  // [row of x][column of x]; +8: rows start on other banks
    __shared__ float column_parts[kWideThreads / kWideVecs][kWideTile];  // [row pair][column] (partials only)
    float part[kVecElems] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float scale = *scale_p;
    const int64_t r0 = (int64_t)blockIdx.y * kWideTile;
    const int c0 = blockIdx.x * kWideTile;
    const int col_vecs = cols / 8;
    float local = 0.0f;
    for (int v = threadIdx.x; v < kWideTile * kWideVecs; v += kWideThreads) {
        const int dr = v / kWideVecs, dv = v % kWideVecs;
        const int64_t r = r0 + dr;
        const int cv = c0 / 8 + dv;
        uint8_t q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < rows && cv < col_vecs) {
            float f[kVecElems];
            load_values<OF>(x, pre, r * col_vecs + cv, f);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) {
                const float value = f[j];
                part[j] += value;
                local = fmaxf(local, fabsf(value));
                q[j] = to_fp8(value * scale, format);
            }
            if (out) {
                uint2 packed;
                memcpy(&packed, q, sizeof packed);
                out[r * col_vecs + cv] = packed;
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) tile[dr][dv * 8 + j] = q[j];
    }
    if (partials) {
        const int pair = threadIdx.x / kWideVecs, dv = threadIdx.x % kWideVecs;
#pragma unroll
        for (int j = 0; j < kVecElems; ++j) column_parts[pair][dv * 8 + j] = part[j];
    }
    __syncthreads();
    if (partials && threadIdx.x < kWideTile && c0 + (int)threadIdx.x < cols) {
        float sum = 0.0f;
        for (int pair = 0; pair < kWideThreads / kWideVecs; ++pair) sum += column_parts[pair][threadIdx.x];
        partials[(int64_t)blockIdx.y * cols + c0 + threadIdx.x] = sum;
    }
    // out_t row c0 + dc, columns r0 + 8 dv ... + 7: column dc of tile rows 8 dv ... 8 dv + 7
    for (int v = threadIdx.x; v < kWideTile * kWideVecs; v += kWideThreads) {
        const int dc = v / kWideVecs, dv = v % kWideVecs;
        const int64_t col = r0 + 8 * dv;
        if (c0 + dc >= cols || col >= ld_t) continue;
        uint8_t q[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = tile[8 * dv + j][dc];
        uint2 packed;
        memcpy(&packed, q, sizeof packed);
        *reinterpret_cast<uint2 *>(out_t + (int64_t)(c0 + dc) * ld_t + col) = packed;
    }
    block_amax_into(local, amax);
}

__device__ __forceinline__ float from_fp8(uint8_t q, int format)
{
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, format == FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

// out[i] = bf16(decode(in[i]) * scale_inv), 8 values per thread and step.
__global__ void dequantize_kernel(const uint2 *__restrict__ in, int64_t n_vecs, const float *__restrict__ scale_inv_p,
                                  int format, uint4 *__restrict__ out)
{
    const float scale_inv = *scale_inv_p;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        uint8_t q[8];
        const uint2 packed = in[i];
        memcpy(q, &packed, sizeof q);
        float f[kVecElems];
#pragma unroll
        for (int j = 0; j < kVecElems; ++j) f[j] = from_fp8(q[j], format) * scale_inv;
        out[i] = pack8(f);
    }
}

// Every tensor: the running amax into the history's slot `position`, then the scale from the history.
__global__ void update_kernel(float *__restrict__ state, const int *__restrict__ formats, int n, int history_len,
                              int position, int margin)
{
    float *history = state + (int64_t)3 * kSlot * n;
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        float *scale = state + (int64_t)t * kSlot, *scale_inv = scale + (int64_t)kSlot * n;
        float *amax = scale + (int64_t)2 * kSlot * n;
        float *h = history + (int64_t)t * history_len;
        h[position] = *amax;
        *amax = 0.0f;
        float m = 0.0f;
        for (int i = 0; i < history_len; ++i)
            if (isfinite(h[i])) m = fmaxf(m, h[i]);
        *scale = scale_rule(m, formats[t], margin, *scale);
        *scale_inv = 1.0f / *scale;
    }
}

// *amax (the running amax of a tensor) = max(*amax, *value): a value another kernel (a GEMM's AMAX_D) set.
__global__ void record_amax_kernel(float *__restrict__ amax, const float *__restrict__ value)
{
    const float v = *value;
    if (v > 0.0f) atomicMax(reinterpret_cast<unsigned int *>(amax), __float_as_uint(v));
}

// amax[dst] = max(amax[dst], factor * amax[a] * amax[b]), the three a set's running amaxes (a finite, positive bound).
__global__ void record_amax_bound_kernel(float *__restrict__ amax, int dst, int a, int b, float factor)
{
    const float v = factor * amax[(size_t)a * kSlot] * amax[(size_t)b * kSlot];
    if (v > 0.0f && isfinite(v))
        atomicMax(reinterpret_cast<unsigned int *>(amax + (size_t)dst * kSlot), __float_as_uint(v));
}

__global__ void init_kernel(float *__restrict__ state, int n, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        state[i] = i < (size_t)2 * kSlot * n ? 1.0f : 0.0f;  // scale and scale_inv 1, amax and history 0
}

void check_tensor(const fp8_scaling *s, int tensor, const char *call)
{
    ALDIT_CHECK(s != NULL, "%s: no FP8 scaling state", call);
    ALDIT_CHECK(tensor >= 0 && tensor < s->n, "%s: tensor %d of a set of %d", call, tensor, s->n);
}

}  // namespace

extern "C" float fp8_format_max(fp8_format format) { return format_max(format); }

extern "C" float fp8_scale_for(float m, fp8_format format, int margin, float previous)
{
    return scale_rule(m, format, margin, previous);
}

extern "C" fp8_scaling *fp8_scaling_create(int n_tensors, const fp8_format *formats, int history_len, int margin)
{
    ALDIT_CHECK(n_tensors > 0 && history_len >= 1 && margin >= 0,
                "fp8_scaling_create: n_tensors %d, history_len %d, margin %d", n_tensors, history_len, margin);
    fp8_scaling *s = (fp8_scaling *)xcalloc(1, sizeof *s);
    s->n = n_tensors;
    s->history_len = history_len;
    s->margin = margin;
    s->formats = (fp8_format *)xmalloc((size_t)n_tensors * sizeof *s->formats);
    memcpy(s->formats, formats, (size_t)n_tensors * sizeof *formats);
    int *host_formats = (int *)xmalloc((size_t)n_tensors * sizeof *host_formats);
    for (int t = 0; t < n_tensors; ++t) host_formats[t] = (int)formats[t];
    CUDA_CHECK(cudaMalloc(&s->formats_device, (size_t)n_tensors * sizeof *s->formats_device));
    CUDA_CHECK(cudaMemcpy(s->formats_device, host_formats, (size_t)n_tensors * sizeof *host_formats,
                          cudaMemcpyHostToDevice));
    free(host_formats);
    CUDA_CHECK(cudaMalloc(&s->state, state_floats(s) * sizeof(float)));
    init_kernel<<<gpu_grid_blocks((int64_t)state_floats(s), 256, 1024), 256>>>(s->state, s->n, state_floats(s));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    return s;
}

extern "C" void fp8_scaling_free(fp8_scaling *s)
{
    if (!s) return;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(s->state));
    CUDA_CHECK(cudaFree(s->formats_device));
    free(s->formats);
    free(s);
}

extern "C" int fp8_scaling_count(const fp8_scaling *s) { return s->n; }
extern "C" float *fp8_scaling_amax(fp8_scaling *s) { return amax_of(s); }
extern "C" int64_t fp8_scaling_amax_floats(const fp8_scaling *s) { return (int64_t)kSlot * s->n; }
extern "C" int64_t fp8_scaling_updates(const fp8_scaling *s) { return s->updates; }
extern "C" int fp8_scaling_position(const fp8_scaling *s) { return s->position; }

extern "C" const float *fp8_scale_inv(const fp8_scaling *s, int tensor)
{
    check_tensor(s, tensor, "fp8_scale_inv");
    return scale_inv_of(s) + (size_t)tensor * kSlot;
}

namespace {

template <CastOf OF>
void quantize(fp8_scaling *s, int tensor, const gpu_bf16 *x, int64_t rows, int cols, uint8_t *out, uint8_t *out_t,
              int64_t ld_t, cudaStream_t stream, const char *call, float *dbias = nullptr, float *partials = nullptr,
              const gpu_bf16 *pre = nullptr)
{
    ALDIT_CHECK((OF == CastOf::kGeluGrad) == (pre != nullptr) && (uintptr_t)pre % 16 == 0,
                "%s: the GELU input is %s", call, pre ? "misaligned or not asked for" : "missing");
    ALDIT_CHECK(OF != CastOf::kGeluGrad || (out_t && ld_t % 8 == 0 && (uintptr_t)out_t % 8 == 0),
                "%s: needs out_t with ld_t a multiple of 8, 8-byte aligned", call);
    ALDIT_CHECK(!dbias || (partials && out_t && ld_t % 8 == 0 && (uintptr_t)out_t % 8 == 0),
                "%s: the bias gradient needs out_t with ld_t a multiple of 8 and partials", call);
    check_tensor(s, tensor, call);
    ALDIT_CHECK(rows >= 0 && cols > 0 && cols % 8 == 0, "%s: rows %lld, cols %d (a multiple of 8)", call,
                (long long)rows, cols);
    ALDIT_CHECK(out || out_t, "%s: no output", call);
    ALDIT_CHECK(!out_t || ld_t >= rows, "%s: ld_t %lld < rows %lld", call, (long long)ld_t, (long long)rows);
    ALDIT_CHECK(((uintptr_t)x % 16) == 0 && (!out || (uintptr_t)out % 8 == 0), "%s: x or out misaligned", call);
    const int format = (int)s->formats[tensor];
    float *amax = amax_of(s) + (size_t)tensor * kSlot;
    const float *scale = scale_of(s) + (size_t)tensor * kSlot;
    const int64_t n_vecs = rows * cols / 8;
    if (s->updates == 0 && n_vecs > 0) {  // no history yet: this cast's own amax sets the scale
        amax_kernel<OF><<<gpu_grid_blocks(n_vecs, kCastThreads, kCastMaxBlocks), kCastThreads, 0, stream>>>(
            (const uint4 *)x, (const uint4 *)pre, n_vecs, amax);
        CUDA_CHECK_LAUNCH();
        scale_from_amax_kernel<<<1, 1, 0, stream>>>(s->state, s->n, tensor, format, s->margin);
        CUDA_CHECK_LAUNCH();
    }
    if (out_t && ld_t % 8 == 0 && (uintptr_t)out_t % 8 == 0) {
        const int64_t row_tiles = (ld_t + kWideTile - 1) / kWideTile;  // ld_t >= rows
        ALDIT_CHECK(row_tiles <= 65535, "%s: %lld rows, more than the transposing grid takes (65535 x %d)", call,
                    (long long)rows, kWideTile);
        if (row_tiles == 0) return;  // no rows: nothing to add to dbias either
        const dim3 grid((unsigned)((cols + kWideTile - 1) / kWideTile), (unsigned)row_tiles);
        cast_transpose_wide_kernel<OF><<<grid, kWideThreads, 0, stream>>>(
            (const uint4 *)x, (const uint4 *)pre, rows, cols, scale, format, (uint2 *)out, out_t, ld_t, amax, partials);
        CUDA_CHECK_LAUNCH();
        if (dbias) {
            column_partials_kernel<<<(cols + kPartialColumns - 1) / kPartialColumns, kPartialThreads, 0, stream>>>(
                partials, (int)row_tiles, cols, dbias, 1);
            CUDA_CHECK_LAUNCH();
        }
    } else if constexpr (OF != CastOf::kGeluGrad) {  // (kGeluGrad takes the branch above: checked on entry)
        if (out_t) {
            const int64_t row_tiles = ((rows > ld_t ? rows : ld_t) + kTile - 1) / kTile;
            ALDIT_CHECK(row_tiles <= 65535, "%s: %lld rows, more than the transposing grid takes (65535 x %d)", call,
                        (long long)rows, kTile);
            if (row_tiles == 0) return;
            const dim3 grid((unsigned)((cols + kTile - 1) / kTile), (unsigned)row_tiles);
            cast_transpose_kernel<OF><<<grid, dim3(kTile, kTileRows), 0, stream>>>(
                (const __nv_bfloat16 *)x, rows, cols, scale, format, out, out_t, ld_t, amax);
            CUDA_CHECK_LAUNCH();
        } else if (n_vecs > 0) {
            cast_kernel<OF><<<gpu_grid_blocks(n_vecs, kCastThreads, kCastMaxBlocks), kCastThreads, 0, stream>>>(
                (const uint4 *)x, n_vecs, scale, format, (uint2 *)out, amax);
            CUDA_CHECK_LAUNCH();
        }
    }
}

}  // namespace

extern "C" void fp8_quantize(fp8_scaling *s, int tensor, const gpu_bf16 *x, int64_t rows, int cols, uint8_t *out,
                             uint8_t *out_t, int64_t ld_t, cudaStream_t stream)
{
    quantize<CastOf::kValue>(s, tensor, x, rows, cols, out, out_t, ld_t, stream, "fp8_quantize");
}

extern "C" void fp8_quantize_gelu(fp8_scaling *s, int tensor, const gpu_bf16 *pre, int64_t rows, int cols, uint8_t *out,
                                  uint8_t *out_t, int64_t ld_t, cudaStream_t stream)
{
    quantize<CastOf::kGelu>(s, tensor, pre, rows, cols, out, out_t, ld_t, stream, "fp8_quantize_gelu");
}

extern "C" size_t fp8_dbias_partials_floats(int64_t ld_t, int cols)
{
    return (size_t)((ld_t + kWideTile - 1) / kWideTile) * (size_t)cols;
}

extern "C" void fp8_quantize_dbias(fp8_scaling *s, int tensor, const gpu_bf16 *dy, int64_t rows, int cols, uint8_t *out,
                                   uint8_t *out_t, int64_t ld_t, float *dbias, float *partials, cudaStream_t stream)
{
    quantize<CastOf::kValue>(s, tensor, dy, rows, cols, out, out_t, ld_t, stream, "fp8_quantize_dbias", dbias, partials);
}

extern "C" void fp8_quantize_dbias_dgelu(fp8_scaling *s, int tensor, const gpu_bf16 *dy, const gpu_bf16 *pre,
                                         int64_t rows, int cols, uint8_t *out, uint8_t *out_t, int64_t ld_t,
                                         float *dbias, float *partials, cudaStream_t stream)
{
    quantize<CastOf::kGeluGrad>(s, tensor, dy, rows, cols, out, out_t, ld_t, stream, "fp8_quantize_dbias_dgelu", dbias,
                                partials, pre);
}

extern "C" const float *fp8_scale(const fp8_scaling *s, int tensor)
{
    check_tensor(s, tensor, "fp8_scale");
    return scale_of(s) + (size_t)tensor * kSlot;
}

extern "C" void fp8_dequantize(const fp8_scaling *s, int tensor, const uint8_t *in, int64_t n, gpu_bf16 *out,
                               cudaStream_t stream)
{
    check_tensor(s, tensor, "fp8_dequantize");
    ALDIT_CHECK(n >= 0 && n % 8 == 0 && (uintptr_t)in % 8 == 0 && (uintptr_t)out % 16 == 0,
                "fp8_dequantize: %lld values (a multiple of 8), in %p (8-byte aligned), out %p (16-byte aligned)",
                (long long)n, (const void *)in, (void *)out);
    const int64_t n_vecs = n / 8;
    if (n_vecs == 0) return;
    dequantize_kernel<<<gpu_grid_blocks(n_vecs, kCastThreads, kCastMaxBlocks), kCastThreads, 0, stream>>>(
        (const uint2 *)in, n_vecs, scale_inv_of(s) + (size_t)tensor * kSlot, (int)s->formats[tensor], (uint4 *)out);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fp8_record_amax_of(fp8_scaling *s, int tensor, const gpu_bf16 *x, int64_t n, cudaStream_t stream)
{
    check_tensor(s, tensor, "fp8_record_amax_of");
    ALDIT_CHECK(n >= 0 && n % 8 == 0 && (uintptr_t)x % 16 == 0, "fp8_record_amax_of: %lld values (a multiple of 8), "
                "x %p (16-byte aligned)", (long long)n, (const void *)x);
    const int64_t n_vecs = n / 8;
    if (n_vecs == 0) return;
    amax_kernel<CastOf::kValue><<<gpu_grid_blocks(n_vecs, kCastThreads, kCastMaxBlocks), kCastThreads, 0, stream>>>(
        (const uint4 *)x, nullptr, n_vecs, amax_of(s) + (size_t)tensor * kSlot);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fp8_record_amax(fp8_scaling *s, int tensor, const float *value, cudaStream_t stream)
{
    check_tensor(s, tensor, "fp8_record_amax");
    record_amax_kernel<<<1, 1, 0, stream>>>(amax_of(s) + (size_t)tensor * kSlot, value);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fp8_record_amax_bound(fp8_scaling *s, int tensor, int a, int b, float factor, cudaStream_t stream)
{
    check_tensor(s, tensor, "fp8_record_amax_bound");
    check_tensor(s, a, "fp8_record_amax_bound");
    check_tensor(s, b, "fp8_record_amax_bound");
    ALDIT_CHECK(factor > 0.0f && isfinite(factor), "fp8_record_amax_bound: factor %g (finite, > 0)", (double)factor);
    record_amax_bound_kernel<<<1, 1, 0, stream>>>(amax_of(s), tensor, a, b, factor);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fp8_scaling_reset(fp8_scaling *s, cudaStream_t stream)
{
    init_kernel<<<gpu_grid_blocks((int64_t)state_floats(s), 256, 1024), 256, 0, stream>>>(s->state, s->n,
                                                                                       state_floats(s));
    CUDA_CHECK_LAUNCH();
    s->position = 0;
    s->updates = 0;
}

extern "C" void fp8_scaling_update(fp8_scaling *s, cudaStream_t stream)
{
    update_kernel<<<(s->n + kUpdateThreads - 1) / kUpdateThreads, kUpdateThreads, 0, stream>>>(
        s->state, s->formats_device, s->n, s->history_len, s->position, s->margin);
    CUDA_CHECK_LAUNCH();
    s->position = (s->position + 1) % s->history_len;
    s->updates += 1;
}

extern "C" size_t fp8_scaling_state_bytes(const fp8_scaling *s)
{
    return kHeaderWords * sizeof(int64_t) + state_floats(s) * sizeof(float);
}

extern "C" void fp8_scaling_save(const fp8_scaling *s, void *blob, cudaStream_t stream)
{
    const int64_t header[kHeaderWords] = {kStateVersion, s->n, s->history_len, s->margin, s->position, s->updates};
    memcpy(blob, header, sizeof header);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy((char *)blob + sizeof header, s->state, state_floats(s) * sizeof(float),
                          cudaMemcpyDeviceToHost));
}

extern "C" int fp8_scaling_load(fp8_scaling *s, const void *blob, size_t bytes, char *why, size_t why_size)
{
    int64_t header[kHeaderWords];
    if (bytes < sizeof header) {
        snprintf(why, why_size, "%zu bytes of FP8 scaling state, this model's take %zu", bytes,
                 fp8_scaling_state_bytes(s));
        return 1;
    }
    // the header first: a state of another history length or version is named as such, not by its size
    memcpy(header, blob, sizeof header);
    if (header[0] != kStateVersion || header[1] != s->n || header[2] != s->history_len || header[3] != s->margin ||
        header[4] < 0 || header[4] >= s->history_len || header[5] < 0) {
        snprintf(why, why_size, "FP8 scaling state of version %lld, %lld tensors, history %lld, margin %lld; this run "
                 "has version %d, %d tensors (more with [train] fp8_attention on), history %d ([train] "
                 "fp8_amax_history), margin %d ([train] fp8_margin)",
                 (long long)header[0], (long long)header[1], (long long)header[2], (long long)header[3],
                 kStateVersion, s->n, s->history_len, s->margin);
        return 1;
    }
    if (bytes != fp8_scaling_state_bytes(s)) {
        snprintf(why, why_size, "%zu bytes of FP8 scaling state, this model's take %zu", bytes,
                 fp8_scaling_state_bytes(s));
        return 1;
    }
    s->position = (int)header[4];
    s->updates = header[5];
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(s->state, (const char *)blob + sizeof header, state_floats(s) * sizeof(float),
                          cudaMemcpyHostToDevice));
    return 0;
}

extern "C" void fp8_scaling_download(const fp8_scaling *s, float *scale, float *scale_inv, float *amax, float *history)
{
    CUDA_CHECK(cudaDeviceSynchronize());
    const size_t n = (size_t)s->n, one = sizeof(float), slot = kSlot * sizeof(float);   // a value per slot
    if (scale) CUDA_CHECK(cudaMemcpy2D(scale, one, scale_of(s), slot, one, n, cudaMemcpyDeviceToHost));
    if (scale_inv) CUDA_CHECK(cudaMemcpy2D(scale_inv, one, scale_inv_of(s), slot, one, n, cudaMemcpyDeviceToHost));
    if (amax) CUDA_CHECK(cudaMemcpy2D(amax, one, amax_of(s), slot, one, n, cudaMemcpyDeviceToHost));
    if (history) CUDA_CHECK(cudaMemcpy(history, history_of(s), n * one * (size_t)s->history_len, cudaMemcpyDeviceToHost));
}

extern "C" int fp8_gpu_supported(int *major, int *minor)
{
    int device = 0, ma = 0, mi = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, device));
    if (major) *major = ma;
    if (minor) *minor = mi;
    return ma > 8 || (ma == 8 && mi >= 9);
}
