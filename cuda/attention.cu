// attention.cu — flash attention (forward, backward) on packed variable-length samples with mma.sync bf16 tensor cores.
//
// FlashAttention-2 scheme. Every kernel runs 4 warps; a CTA owns one tile of rows of one sample and one
// head (blockIdx.y), and each warp owns 16 rows of that tile. The tiles of all samples are numbered back
// to back (a sample of n rows has ceil(n / tile) tiles); the grid is sized from the total row count plus
// one tile per sample, so it bounds the real tile count without reading the device offsets, and CTAs
// past the last tile return at once. Tiles stream through shared memory by cp.async (rows past the
// sample's end are zero-filled, never read); fragments come out of shared memory by ldmatrix and go
// through mma.m16n8k16 (bf16 in, fp32 accumulators). A padded row stride of head_dim + 8 values keeps
// ldmatrix free of bank conflicts.
// - forward: a CTA holds 64 query rows; it walks the sample's keys in tiles of 64 with the online
//   softmax (scores in log2 units), K of the next tile loading while the current softmax and P·V run.
// - backward: delta = rowsum(dout * out) first; then one kernel per 64 key rows accumulates dK and dV
//   over the sample's queries (32 at a time, double-buffered), and one kernel per 64 query rows
//   accumulates dQ over the sample's keys (64 at a time, double-buffered). Every output value is
//   written by one thread once: no atomics, reproducible bits.
#include "cuda/attention.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

namespace {

constexpr int kThreads = 128;  // 4 warps of 16 rows each
constexpr int kWarpRows = 16;  // rows of one mma tile
constexpr int kFwdQ = 64;      // forward: query rows per CTA
constexpr int kFwdKv = 64;     // forward: key rows per step
constexpr int kDkvKv = 64;     // dK/dV kernel: key rows per CTA
constexpr int kDkvQ = 32;      // dK/dV kernel: query rows per step
constexpr int kDqQ = 64;       // dQ kernel: query rows per CTA (and the delta kernel's tile)
constexpr int kDqKv = 64;      // dQ kernel: key rows per step
constexpr int kDeltaThreads = 256;  // delta kernel: (row, head) pairs per CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- warp-level primitives: cp.async, ldmatrix, mma.sync, bf16 packing, quad reductions ----------------

__device__ __forceinline__ uint32_t shared_address(const void *pointer)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void cp_async_16(void *shared, const void *global)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)), "l"(global)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `kPending` of this thread's most recent cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and receives in
// reg[j] the pair (row l / 4, columns 2 (l % 4), +1) of matrix j (with .trans: of matrix j transposed).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&reg)[4], const void *row_address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                 : "r"(shared_address(row_address))
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&reg)[4], const void *row_address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(reg[0]), "=r"(reg[1]), "=r"(reg[2]), "=r"(reg[3])
                 : "r"(shared_address(row_address))
                 : "memory");
}

// acc (16x8 fp32) += a (16x16 bf16, row-major) * b (16x8 bf16, column-major).
// Lane l, g = l / 4, t = l % 4: a = {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)},
// b = {(k 2t..2t+1, n g), (k 2t+8.., n g)}, acc = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_bf16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, `low` in the low half (the lower column of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high)
{
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const uint32_t *>(&pair);
}

__device__ __forceinline__ float bf16_low(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_high(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

// Reductions over the 4 lanes (a quad) that hold one row of an mma accumulator.
__device__ __forceinline__ float quad_max(float value)
{
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, 1));
    return fmaxf(value, __shfl_xor_sync(kFullMask, value, 2));
}

__device__ __forceinline__ float quad_sum(float value)
{
    value += __shfl_xor_sync(kFullMask, value, 1);
    return value + __shfl_xor_sync(kFullMask, value, 2);
}

// ---- tiles -------------------------------------------------------------------------------------------

// Real rows in step `step` of a walk over n_rows rows in steps of step_rows (the last step may be short).
__device__ __forceinline__ int rows_in_step(int64_t n_rows, int64_t step, int step_rows)
{
    return static_cast<int>(min(n_rows - step * step_rows, static_cast<int64_t>(step_rows)));
}

// Tile number `tile` of the back-to-back numbering of all samples' tiles of `tile_rows` rows: its sample,
// first row and number of real rows. False past the last tile.
__device__ bool find_tile(const int64_t *row_start, int n_samples, int tile_rows, int64_t tile, int *sample,
                          int64_t *first_row, int *n_rows)
{
    for (int b = 0; b < n_samples; ++b) {
        const int64_t rows = row_start[b + 1] - row_start[b];
        const int64_t tiles = (rows + tile_rows - 1) / tile_rows;
        if (tile < tiles) {
            *sample = b;
            *first_row = row_start[b] + tile * tile_rows;
            *n_rows = rows_in_step(rows, tile, tile_rows);
            return true;
        }
        tile -= tiles;
    }
    return false;
}

// Queue the copy of one head's slice (columns [column, column + D)) of rows [first_row, first_row + n_valid)
// into a shared tile of kRows rows of stride D + 8; rows from n_valid on are zero-filled with plain stores.
// The caller commits the group and waits for it (and syncs) before reading.
template <int kRows, int D>
__device__ __forceinline__ void load_tile(uint16_t *tile, const uint16_t *source, int64_t row_stride, int64_t first_row,
                                          int n_valid, int column)
{
    constexpr int kChunks = D / 8;  // 16-byte chunks per row
    for (int chunk = threadIdx.x; chunk < kRows * kChunks; chunk += kThreads) {
        const int row = chunk / kChunks, part = chunk % kChunks;
        uint16_t *destination = tile + row * (D + 8) + part * 8;
        if (row < n_valid)
            cp_async_16(destination, source + (first_row + row) * row_stride + column + part * 8);
        else
            *reinterpret_cast<uint4 *>(destination) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// Addresses for ldmatrix_x4 in a shared tile of stride D + 8 (lane = threadIdx.x % 32):
// A operand, rows [row0, row0 + 16) x columns [col0, col0 + 16) of a row-major tile -> an mma `a`.
template <int D>
__device__ __forceinline__ const uint16_t *a_fragment_address(const uint16_t *tile, int row0, int col0, int lane)
{
    return tile + (row0 + lane % 8 + ((lane / 8) & 1) * 8) * (D + 8) + col0 + (lane / 16) * 8;
}

// B operand of two n-tiles from a tile stored [n][k] (B = tile^T): rows n0..n0+15, columns k0..k0+15;
// reg {0, 1} is the `b` of n-tile n0..n0+7, reg {2, 3} that of n0+8..n0+15.
template <int D>
__device__ __forceinline__ const uint16_t *b_fragment_address(const uint16_t *tile, int n0, int k0, int lane)
{
    return tile + (n0 + lane % 8 + (lane / 16) * 8) * (D + 8) + k0 + ((lane / 8) & 1) * 8;
}

// B operand of two n-tiles from a tile stored [k][n] (B = tile), for ldmatrix_x4_trans: rows k0..k0+15,
// columns n0..n0+15; reg {0, 1} is the `b` of n-tile n0..n0+7, reg {2, 3} that of n0+8..n0+15.
template <int D>
__device__ __forceinline__ const uint16_t *bt_fragment_address(const uint16_t *tile, int k0, int n0, int lane)
{
    return tile + (k0 + lane % 8 + ((lane / 8) & 1) * 8) * (D + 8) + n0 + (lane / 16) * 8;
}

// The accumulators of two adjacent n-tiles (16 rows x 16 columns) as the `a` operand of the next product.
__device__ __forceinline__ void accumulators_to_a(const float (&left)[4], const float (&right)[4], uint32_t (&a)[4])
{
    a[0] = pack_bf16x2(left[0], left[1]);
    a[1] = pack_bf16x2(left[2], left[3]);
    a[2] = pack_bf16x2(right[0], right[1]);
    a[3] = pack_bf16x2(right[2], right[3]);
}

// Write a warp's 16 x D accumulator rows (scaled) as bf16 to rows first_row + row0 + (0..15) of `out`
// (only the first n_valid rows of the tile), head columns at `column`.
template <int D>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 8][4], float scale_low, float scale_high,
                                           uint16_t *out, int64_t row_stride, int64_t first_row, int row0,
                                           int n_valid, int column, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + g + half * 8;
        if (row >= n_valid) continue;
        const float scale = half ? scale_high : scale_low;
        uint16_t *destination = out + (first_row + row) * row_stride + column + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
            *reinterpret_cast<uint32_t *>(destination + nt * 8) =
                pack_bf16x2(acc[nt][2 * half] * scale, acc[nt][2 * half + 1] * scale);
    }
}

// Zero one head's slice of rows [first_row, first_row + n_rows) (outputs of rows with nothing to attend).
template <int D>
__device__ void zero_rows(uint16_t *out, int64_t row_stride, int64_t first_row, int n_rows, int column)
{
    for (int chunk = threadIdx.x; chunk < n_rows * (D / 8); chunk += kThreads)
        *reinterpret_cast<uint4 *>(out + (first_row + chunk / (D / 8)) * row_stride + column + (chunk % (D / 8)) * 8) =
            make_uint4(0u, 0u, 0u, 0u);
}

// ---- forward -----------------------------------------------------------------------------------------

template <int D>
constexpr size_t fwd_shared_bytes()
{
    return static_cast<size_t>(kFwdQ + 2 * kFwdKv) * (D + 8) * sizeof(uint16_t);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                         const int64_t *__restrict__ q_row_start, const int64_t *__restrict__ kv_row_start,
                         int n_samples, int num_heads, float scale_log2, uint16_t *__restrict__ out,
                         float *__restrict__ lse)
{
    constexpr int kStride = D + 8;
    extern __shared__ uint4 shared_vectors[];
    uint16_t *tile_q = reinterpret_cast<uint16_t *>(shared_vectors);
    uint16_t *tile_k = tile_q + kFwdQ * kStride;
    uint16_t *tile_v = tile_k + kFwdKv * kStride;

    int sample, n_q;
    int64_t q_first;
    if (!find_tile(q_row_start, n_samples, kFwdQ, blockIdx.x, &sample, &q_first, &n_q)) return;
    const int head = blockIdx.y, column = head * D;
    const int64_t row_stride = static_cast<int64_t>(num_heads) * D;
    const int64_t kv_begin = kv_row_start[sample], n_kv = kv_row_start[sample + 1] - kv_begin;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int row0 = warp * kWarpRows;

    if (n_kv == 0) {  // nothing to attend: zero output, lse = -inf (as the CPU reference)
        zero_rows<D>(out, row_stride, q_first, n_q, column);
        for (int row = threadIdx.x; row < n_q; row += kThreads) lse[(q_first + row) * num_heads + head] = -INFINITY;
        return;
    }
    const int n_kv_tiles = static_cast<int>((n_kv + kFwdKv - 1) / kFwdKv);

    load_tile<kFwdQ, D>(tile_q, q, row_stride, q_first, n_q, column);
    load_tile<kFwdKv, D>(tile_k, k, row_stride, kv_begin, rows_in_step(n_kv, 0, kFwdKv), column);
    cp_async_commit();

    uint32_t q_fragments[D / 16][4];
    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY};  // running max of the scores in log2 units, rows g and g + 8
    float row_sum[2] = {0.0f, 0.0f};            // this lane's part of the running sum of 2^(score - max)

    for (int kv_tile = 0; kv_tile < n_kv_tiles; ++kv_tile) {
        const int64_t kv_first = kv_begin + static_cast<int64_t>(kv_tile) * kFwdKv;
        const int kv_valid = rows_in_step(n_kv, kv_tile, kFwdKv);
        load_tile<kFwdKv, D>(tile_v, v, row_stride, kv_first, kv_valid, column);
        cp_async_commit();
        cp_async_wait<1>();  // Q (first step) and this step's K have landed; V may still be in flight
        __syncthreads();
        if (kv_tile == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                ldmatrix_x4(q_fragments[kk], a_fragment_address<D>(tile_q, row0, kk * 16, lane));
        }

        float s[kFwdKv / 8][4];
#pragma unroll
        for (int nt = 0; nt < kFwdKv / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < kFwdKv / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, b_fragment_address<D>(tile_k, np * 16, kk * 16, lane));
                mma_bf16(s[2 * np], q_fragments[kk], b[0], b[1]);
                mma_bf16(s[2 * np + 1], q_fragments[kk], b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with K: the next step's K may load
        if (kv_tile + 1 < n_kv_tiles)
            load_tile<kFwdKv, D>(tile_k, k, row_stride, kv_first + kFwdKv, rows_in_step(n_kv, kv_tile + 1, kFwdKv),
                                 column);
        cp_async_commit();  // possibly empty: keeps the group count the same on every step

        if (kv_valid < kFwdKv) {  // key columns past the sample's end take no part
#pragma unroll
            for (int nt = 0; nt < kFwdKv / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (nt * 8 + 2 * t + (e & 1) >= kv_valid) s[nt][e] = -INFINITY;
        }
        // Online softmax: every row has at least one real key in this step, so the new max is finite.
        float step_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kFwdKv / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) step_max[e >> 1] = fmaxf(step_max[e >> 1], s[nt][e]);
        float rescale[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float new_max = fmaxf(row_max[half], quad_max(step_max[half]) * scale_log2);
            rescale[half] = exp2f(row_max[half] - new_max);  // 0 on the first step (max was -inf)
            row_max[half] = new_max;
            row_sum[half] *= rescale[half];
        }
#pragma unroll
        for (int nt = 0; nt < kFwdKv / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] * scale_log2 - row_max[e >> 1]);
                s[nt][e] = p;
                row_sum[e >> 1] += p;
            }
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[nt][e] *= rescale[e >> 1];

        cp_async_wait<1>();  // this step's V has landed; the next K may still be in flight
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kFwdKv / 16; ++kk) {
            uint32_t p_fragment[4];
            accumulators_to_a(s[2 * kk], s[2 * kk + 1], p_fragment);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, bt_fragment_address<D>(tile_v, kk * 16, np * 16, lane));
                mma_bf16(o[2 * np], p_fragment, b[0], b[1]);
                mma_bf16(o[2 * np + 1], p_fragment, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with V: the next step's V may load
    }

    float inverse_sum[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        row_sum[half] = quad_sum(row_sum[half]);
        inverse_sum[half] = 1.0f / row_sum[half];
    }
    store_rows<D>(o, inverse_sum[0], inverse_sum[1], out, row_stride, q_first, row0, n_q, column, lane);
    if (t == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = row0 + lane / 4 + half * 8;
            if (row < n_q) lse[(q_first + row) * num_heads + head] = row_max[half] * kLn2 + logf(row_sum[half]);
        }
    }
}

// ---- backward ----------------------------------------------------------------------------------------

// delta[r, h] = sum over the head's columns of dout * out (fp32) for the rows r of the samples' query tiles of kDqQ
// rows (find_tile: CTA x takes tile x), one thread per (row, head) of the tile, kDeltaThreads per CTA y; rows
// outside the samples (those before the first sample of a slice of the offsets) are neither read nor written.
__global__ void attention_bwd_delta_kernel(const uint16_t *__restrict__ out, const uint16_t *__restrict__ dout,
                                           const int64_t *__restrict__ q_row_start, int n_samples, int num_heads,
                                           int head_dim, float *__restrict__ delta)
{
    int sample, n_q;
    int64_t q_first;
    if (!find_tile(q_row_start, n_samples, kDqQ, blockIdx.x, &sample, &q_first, &n_q)) return;
    const int64_t local = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
    if (local >= static_cast<int64_t>(n_q) * num_heads) return;
    // [rows, heads * head_dim] row-major: (row, head) starts at element (row * heads + head) * head_dim.
    const int64_t pair = q_first * num_heads + local;
    const uint4 *out_vectors = reinterpret_cast<const uint4 *>(out + pair * head_dim);
    const uint4 *dout_vectors = reinterpret_cast<const uint4 *>(dout + pair * head_dim);
    float sum = 0.0f;
    for (int i = 0; i < head_dim / 8; ++i) {
        const uint4 o = out_vectors[i], d = dout_vectors[i];
        const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) sum += bf16_low(ow[j]) * bf16_low(dw[j]) + bf16_high(ow[j]) * bf16_high(dw[j]);
    }
    delta[pair] = sum;
}

template <int D>
constexpr size_t dkv_shared_bytes()
{
    return static_cast<size_t>(2 * kDkvKv + 4 * kDkvQ) * (D + 8) * sizeof(uint16_t) + 4 * kDkvQ * sizeof(float);
}

// dK and dV of 64 key rows of one sample and head, over all the sample's query rows, 32 per step.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dkv_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                             const uint16_t *__restrict__ v, const uint16_t *__restrict__ dout,
                             const float *__restrict__ lse, const float *__restrict__ delta,
                             const int64_t *__restrict__ q_row_start, const int64_t *__restrict__ kv_row_start,
                             int n_samples, int num_heads, float scale, float scale_log2, uint16_t *__restrict__ dk,
                             uint16_t *__restrict__ dv)
{
    constexpr int kStride = D + 8;
    extern __shared__ uint4 shared_vectors[];
    uint16_t *tile_k = reinterpret_cast<uint16_t *>(shared_vectors);
    uint16_t *tile_v = tile_k + kDkvKv * kStride;
    uint16_t *tile_q = tile_v + kDkvKv * kStride;  // [2][kDkvQ][kStride]: double-buffered query steps
    uint16_t *tile_dout = tile_q + 2 * kDkvQ * kStride;
    float *step_lse = reinterpret_cast<float *>(tile_dout + 2 * kDkvQ * kStride);  // [2][kDkvQ], log2 units
    float *step_delta = step_lse + 2 * kDkvQ;                                      // [2][kDkvQ]

    int sample, n_kv;
    int64_t kv_first;
    if (!find_tile(kv_row_start, n_samples, kDkvKv, blockIdx.x, &sample, &kv_first, &n_kv)) return;
    const int head = blockIdx.y, column = head * D;
    const int64_t row_stride = static_cast<int64_t>(num_heads) * D;
    const int64_t q_begin = q_row_start[sample], n_q = q_row_start[sample + 1] - q_begin;
    const int n_q_steps = static_cast<int>((n_q + kDkvQ - 1) / kDkvQ);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int row0 = warp * kWarpRows;

    // Queue query step `step` into buffer `buffer`; rows past the sample get lse = +inf, so their
    // probabilities are exactly 0, and delta = 0.
    auto load_query_step = [&](int step, int buffer) {
        const int64_t first = q_begin + static_cast<int64_t>(step) * kDkvQ;
        const int valid = rows_in_step(n_q, step, kDkvQ);
        load_tile<kDkvQ, D>(tile_q + buffer * kDkvQ * kStride, q, row_stride, first, valid, column);
        load_tile<kDkvQ, D>(tile_dout + buffer * kDkvQ * kStride, dout, row_stride, first, valid, column);
        for (int row = threadIdx.x; row < kDkvQ; row += kThreads) {
            const bool real = row < valid;
            step_lse[buffer * kDkvQ + row] = real ? lse[(first + row) * num_heads + head] * kLog2e : INFINITY;
            step_delta[buffer * kDkvQ + row] = real ? delta[(first + row) * num_heads + head] : 0.0f;
        }
    };

    load_tile<kDkvKv, D>(tile_k, k, row_stride, kv_first, n_kv, column);
    load_tile<kDkvKv, D>(tile_v, v, row_stride, kv_first, n_kv, column);
    if (n_q_steps > 0) load_query_step(0, 0);
    cp_async_commit();

    float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[nt][e] = dv_acc[nt][e] = 0.0f;

    for (int step = 0; step < n_q_steps; ++step) {
        const int buffer = step & 1;
        if (step + 1 < n_q_steps) load_query_step(step + 1, buffer ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // this step's queries (and on the first step K, V) have landed
        __syncthreads();
        const uint16_t *q_step = tile_q + buffer * kDkvQ * kStride;
        const uint16_t *dout_step = tile_dout + buffer * kDkvQ * kStride;
        const float *lse_step = step_lse + buffer * kDkvQ, *delta_step = step_delta + buffer * kDkvQ;

        // S^T = K Q^T and dP^T = V dO^T: this warp's 16 key rows x the step's 32 query columns.
        float st[kDkvQ / 8][4], dpt[kDkvQ / 8][4];
#pragma unroll
        for (int nt = 0; nt < kDkvQ / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a_k[4], a_v[4];
            ldmatrix_x4(a_k, a_fragment_address<D>(tile_k, row0, kk * 16, lane));
            ldmatrix_x4(a_v, a_fragment_address<D>(tile_v, row0, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < kDkvQ / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, b_fragment_address<D>(q_step, np * 16, kk * 16, lane));
                mma_bf16(st[2 * np], a_k, b[0], b[1]);
                mma_bf16(st[2 * np + 1], a_k, b[2], b[3]);
                ldmatrix_x4(b, b_fragment_address<D>(dout_step, np * 16, kk * 16, lane));
                mma_bf16(dpt[2 * np], a_v, b[0], b[1]);
                mma_bf16(dpt[2 * np + 1], a_v, b[2], b[3]);
            }
        }
        // P^T = 2^(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - delta);
        // element e of n-tile nt is query nt * 8 + 2t + (e & 1).
#pragma unroll
        for (int nt = 0; nt < kDkvQ / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int query = nt * 8 + 2 * t + (e & 1);
                const float p = exp2f(st[nt][e] * scale_log2 - lse_step[query]);
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - delta_step[query]);
            }
        // dV += P^T dO and dK += dS^T Q over the step's 32 queries.
#pragma unroll
        for (int kk = 0; kk < kDkvQ / 16; ++kk) {
            uint32_t a_p[4], a_ds[4];
            accumulators_to_a(st[2 * kk], st[2 * kk + 1], a_p);
            accumulators_to_a(dpt[2 * kk], dpt[2 * kk + 1], a_ds);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, bt_fragment_address<D>(dout_step, kk * 16, np * 16, lane));
                mma_bf16(dv_acc[2 * np], a_p, b[0], b[1]);
                mma_bf16(dv_acc[2 * np + 1], a_p, b[2], b[3]);
                ldmatrix_x4_trans(b, bt_fragment_address<D>(q_step, kk * 16, np * 16, lane));
                mma_bf16(dk_acc[2 * np], a_ds, b[0], b[1]);
                mma_bf16(dk_acc[2 * np + 1], a_ds, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer: step + 2 may load into it
    }
    cp_async_wait<0>();  // nothing left in flight at exit (a sample without queries never waited)

    store_rows<D>(dk_acc, scale, scale, dk, row_stride, kv_first, row0, n_kv, column, lane);
    store_rows<D>(dv_acc, 1.0f, 1.0f, dv, row_stride, kv_first, row0, n_kv, column, lane);
}

template <int D>
constexpr size_t dq_shared_bytes()
{
    return static_cast<size_t>(2 * kDqQ + 4 * kDqKv) * (D + 8) * sizeof(uint16_t);
}

// dQ of 64 query rows of one sample and head, over all the sample's key rows, 64 per step.
template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dq_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k,
                            const uint16_t *__restrict__ v, const uint16_t *__restrict__ dout,
                            const float *__restrict__ lse, const float *__restrict__ delta,
                            const int64_t *__restrict__ q_row_start, const int64_t *__restrict__ kv_row_start,
                            int n_samples, int num_heads, float scale, float scale_log2, uint16_t *__restrict__ dq)
{
    constexpr int kStride = D + 8;
    extern __shared__ uint4 shared_vectors[];
    uint16_t *tile_q = reinterpret_cast<uint16_t *>(shared_vectors);
    uint16_t *tile_dout = tile_q + kDqQ * kStride;
    uint16_t *tile_k = tile_dout + kDqQ * kStride;  // [2][kDqKv][kStride]: double-buffered key steps
    uint16_t *tile_v = tile_k + 2 * kDqKv * kStride;

    int sample, n_q;
    int64_t q_first;
    if (!find_tile(q_row_start, n_samples, kDqQ, blockIdx.x, &sample, &q_first, &n_q)) return;
    const int head = blockIdx.y, column = head * D;
    const int64_t row_stride = static_cast<int64_t>(num_heads) * D;
    const int64_t kv_begin = kv_row_start[sample], n_kv = kv_row_start[sample + 1] - kv_begin;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int row0 = warp * kWarpRows;

    if (n_kv == 0) {  // no keys: the output did not depend on q
        zero_rows<D>(dq, row_stride, q_first, n_q, column);
        return;
    }
    const int n_kv_steps = static_cast<int>((n_kv + kDqKv - 1) / kDqKv);

    // lse (log2 units) and delta of this lane's rows g and g + 8; rows past the sample: p = 0.
    float row_lse[2], row_delta[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + lane / 4 + half * 8;
        const bool real = row < n_q;
        row_lse[half] = real ? lse[(q_first + row) * num_heads + head] * kLog2e : INFINITY;
        row_delta[half] = real ? delta[(q_first + row) * num_heads + head] : 0.0f;
    }

    auto load_key_step = [&](int step, int buffer) {
        const int64_t first = kv_begin + static_cast<int64_t>(step) * kDqKv;
        const int valid = rows_in_step(n_kv, step, kDqKv);
        load_tile<kDqKv, D>(tile_k + buffer * kDqKv * kStride, k, row_stride, first, valid, column);
        load_tile<kDqKv, D>(tile_v + buffer * kDqKv * kStride, v, row_stride, first, valid, column);
    };
    load_tile<kDqQ, D>(tile_q, q, row_stride, q_first, n_q, column);
    load_tile<kDqQ, D>(tile_dout, dout, row_stride, q_first, n_q, column);
    load_key_step(0, 0);
    cp_async_commit();

    float dq_acc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) dq_acc[nt][0] = dq_acc[nt][1] = dq_acc[nt][2] = dq_acc[nt][3] = 0.0f;

    for (int step = 0; step < n_kv_steps; ++step) {
        const int buffer = step & 1;
        if (step + 1 < n_kv_steps) load_key_step(step + 1, buffer ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // this step's keys (and on the first step Q, dO) have landed
        __syncthreads();
        const uint16_t *k_step = tile_k + buffer * kDqKv * kStride;
        const uint16_t *v_step = tile_v + buffer * kDqKv * kStride;
        const int kv_valid = rows_in_step(n_kv, step, kDqKv);

        // S = Q K^T and dP = dO V^T: this warp's 16 query rows x the step's 64 key columns.
        float s[kDqKv / 8][4], dp[kDqKv / 8][4];
#pragma unroll
        for (int nt = 0; nt < kDqKv / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t a_q[4], a_dout[4];
            ldmatrix_x4(a_q, a_fragment_address<D>(tile_q, row0, kk * 16, lane));
            ldmatrix_x4(a_dout, a_fragment_address<D>(tile_dout, row0, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < kDqKv / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4(b, b_fragment_address<D>(k_step, np * 16, kk * 16, lane));
                mma_bf16(s[2 * np], a_q, b[0], b[1]);
                mma_bf16(s[2 * np + 1], a_q, b[2], b[3]);
                ldmatrix_x4(b, b_fragment_address<D>(v_step, np * 16, kk * 16, lane));
                mma_bf16(dp[2 * np], a_dout, b[0], b[1]);
                mma_bf16(dp[2 * np + 1], a_dout, b[2], b[3]);
            }
        }
        // dS = P (dP - delta), P = 2^(S scale log2e - lse log2e); keys past the sample's end: P = 0.
#pragma unroll
        for (int nt = 0; nt < kDqKv / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool real = nt * 8 + 2 * t + (e & 1) < kv_valid;
                const float p = real ? exp2f(s[nt][e] * scale_log2 - row_lse[e >> 1]) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - row_delta[e >> 1]);
            }
        // dQ += dS K over the step's 64 keys.
#pragma unroll
        for (int kk = 0; kk < kDqKv / 16; ++kk) {
            uint32_t a_ds[4];
            accumulators_to_a(s[2 * kk], s[2 * kk + 1], a_ds);
#pragma unroll
            for (int np = 0; np < D / 16; ++np) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, bt_fragment_address<D>(k_step, kk * 16, np * 16, lane));
                mma_bf16(dq_acc[2 * np], a_ds, b[0], b[1]);
                mma_bf16(dq_acc[2 * np + 1], a_ds, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer: step + 2 may load into it
    }
    store_rows<D>(dq_acc, scale, scale, dq, row_stride, q_first, row0, n_q, column, lane);
}

// ---- host side ---------------------------------------------------------------------------------------

// Call body(std::integral_constant<int, D>) with D = head_dim (16, 32, ..., 128).
template <typename Body>
void with_head_dim(int head_dim, Body &&body)
{
    switch (head_dim) {
    case 16: body(std::integral_constant<int, 16>()); break;
    case 32: body(std::integral_constant<int, 32>()); break;
    case 48: body(std::integral_constant<int, 48>()); break;
    case 64: body(std::integral_constant<int, 64>()); break;
    case 80: body(std::integral_constant<int, 80>()); break;
    case 96: body(std::integral_constant<int, 96>()); break;
    case 112: body(std::integral_constant<int, 112>()); break;
    case 128: body(std::integral_constant<int, 128>()); break;
    default: ALDIT_FATAL("attention: head_dim %d is not supported (a multiple of 16 from 16 to %d)", head_dim,
                         ATTENTION_MAX_HEAD_DIM);
    }
}

// CTAs of a grid over tiles of `tile_rows` rows: at least the number of tiles of any split of n_rows
// rows into n_samples samples.
unsigned tile_grid(int64_t n_rows, int n_samples, int tile_rows)
{
    const int64_t ctas = n_rows / tile_rows + n_samples;
    ALDIT_CHECK(ctas <= INT32_MAX, "attention: %lld rows in %d samples need more CTAs than a grid holds",
                (long long)n_rows, n_samples);
    return static_cast<unsigned>(ctas);
}

void check_sizes(const char *function, int num_heads, int head_dim, int n_samples, int64_t n_q_rows,
                 int64_t n_kv_rows)
{
    ALDIT_CHECK(attention_head_dim_supported(head_dim),
                "%s: head_dim %d is not supported (a multiple of 16 from 16 to %d)", function, head_dim,
                ATTENTION_MAX_HEAD_DIM);
    ALDIT_CHECK(num_heads >= 1 && num_heads <= 65535, "%s: num_heads %d is out of range (1 to 65535)", function,
                num_heads);
    ALDIT_CHECK(n_samples >= 0 && n_q_rows >= 0 && n_kv_rows >= 0,
                "%s: negative sizes (n_samples %d, n_q_rows %lld, n_kv_rows %lld)", function, n_samples,
                (long long)n_q_rows, (long long)n_kv_rows);
}

// A device tensor the call will touch (needed): not NULL and 16-byte aligned.
void check_tensor(const char *function, const char *name, const void *pointer, bool needed)
{
    ALDIT_CHECK(!needed || (pointer != nullptr && reinterpret_cast<uintptr_t>(pointer) % 16 == 0),
                "%s: %s is NULL or not 16-byte aligned (%p)", function, name, pointer);
}

double sample_pairs(const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples)
{
    double pairs = 0.0;
    for (int b = 0; b < n_samples; ++b)
        pairs += static_cast<double>(q_row_start[b + 1] - q_row_start[b]) *
                 static_cast<double>(kv_row_start[b + 1] - kv_row_start[b]);
    return pairs;
}

}  // namespace

extern "C" int attention_head_dim_supported(int head_dim)
{
    return head_dim >= 16 && head_dim <= ATTENTION_MAX_HEAD_DIM && head_dim % 16 == 0;
}

extern "C" void attention_fwd(const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, int num_heads, int head_dim,
                              const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples,
                              int64_t n_q_rows, int64_t n_kv_rows, gpu_bf16 *out, float *lse, cudaStream_t stream)
{
    const char *function = "attention_fwd";
    check_sizes(function, num_heads, head_dim, n_samples, n_q_rows, n_kv_rows);
    if (n_samples == 0 || n_q_rows == 0) return;
    check_tensor(function, "q", q, true);
    check_tensor(function, "out", out, true);
    check_tensor(function, "lse", lse, true);
    check_tensor(function, "k", k, n_kv_rows > 0);
    check_tensor(function, "v", v, n_kv_rows > 0);
    ALDIT_CHECK(q_row_start != nullptr && kv_row_start != nullptr, "%s: row offsets are NULL", function);
    const float scale_log2 = kLog2e / sqrtf(static_cast<float>(head_dim));
    const dim3 grid(tile_grid(n_q_rows, n_samples, kFwdQ), static_cast<unsigned>(num_heads));
    with_head_dim(head_dim, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        constexpr size_t shared_bytes = fwd_shared_bytes<D>();
        CUDA_CHECK(cudaFuncSetAttribute(attention_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
        attention_fwd_kernel<D><<<grid, kThreads, shared_bytes, stream>>>(q, k, v, q_row_start, kv_row_start, n_samples,
                                                                         num_heads, scale_log2, out, lse);
        CUDA_CHECK_LAUNCH();
    });
}

extern "C" size_t attention_bwd_workspace_bytes(int64_t n_q_rows, int num_heads)
{
    return static_cast<size_t>(n_q_rows > 0 ? n_q_rows : 0) * static_cast<size_t>(num_heads > 0 ? num_heads : 0) *
           sizeof(float);
}

extern "C" void attention_bwd(const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, const gpu_bf16 *out,
                              const gpu_bf16 *dout, const float *lse, int num_heads, int head_dim,
                              const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples,
                              int64_t n_q_rows, int64_t n_kv_rows, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv,
                              void *workspace, cudaStream_t stream)
{
    const char *function = "attention_bwd";
    check_sizes(function, num_heads, head_dim, n_samples, n_q_rows, n_kv_rows);
    if (n_samples == 0 || (n_q_rows == 0 && n_kv_rows == 0)) return;
    const bool any_q = n_q_rows > 0, both = n_q_rows > 0 && n_kv_rows > 0;
    check_tensor(function, "q", q, both);
    check_tensor(function, "k", k, both);
    check_tensor(function, "v", v, both);
    check_tensor(function, "out", out, any_q);
    check_tensor(function, "dout", dout, any_q);
    check_tensor(function, "lse", lse, both);
    check_tensor(function, "workspace", workspace, any_q);
    check_tensor(function, "dq", dq, any_q);
    check_tensor(function, "dk", dk, n_kv_rows > 0);
    check_tensor(function, "dv", dv, n_kv_rows > 0);
    ALDIT_CHECK(q_row_start != nullptr && kv_row_start != nullptr, "%s: row offsets are NULL", function);
    const float scale = 1.0f / sqrtf(static_cast<float>(head_dim)), scale_log2 = scale * kLog2e;
    float *delta = static_cast<float *>(workspace);
    with_head_dim(head_dim, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        if (n_q_rows > 0) {
            const dim3 grid(tile_grid(n_q_rows, n_samples, kDqQ),
                            static_cast<unsigned>((kDqQ * num_heads + kDeltaThreads - 1) / kDeltaThreads));
            attention_bwd_delta_kernel<<<grid, kDeltaThreads, 0, stream>>>(out, dout, q_row_start, n_samples,
                                                                          num_heads, D, delta);
            CUDA_CHECK_LAUNCH();
        }
        if (n_kv_rows > 0) {  // every key row's dK and dV, zeros where no query attends
            constexpr size_t shared_bytes = dkv_shared_bytes<D>();
            CUDA_CHECK(cudaFuncSetAttribute(attention_bwd_dkv_kernel<D>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
            const dim3 grid(tile_grid(n_kv_rows, n_samples, kDkvKv), static_cast<unsigned>(num_heads));
            attention_bwd_dkv_kernel<D><<<grid, kThreads, shared_bytes, stream>>>(
                q, k, v, dout, lse, delta, q_row_start, kv_row_start, n_samples, num_heads, scale, scale_log2, dk, dv);
            CUDA_CHECK_LAUNCH();
        }
        if (n_q_rows > 0) {
            constexpr size_t shared_bytes = dq_shared_bytes<D>();
            CUDA_CHECK(cudaFuncSetAttribute(attention_bwd_dq_kernel<D>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
            const dim3 grid(tile_grid(n_q_rows, n_samples, kDqQ), static_cast<unsigned>(num_heads));
            attention_bwd_dq_kernel<D><<<grid, kThreads, shared_bytes, stream>>>(
                q, k, v, dout, lse, delta, q_row_start, kv_row_start, n_samples, num_heads, scale, scale_log2, dq);
            CUDA_CHECK_LAUNCH();
        }
    });
}

extern "C" double attention_fwd_flops(const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples,
                                      int num_heads, int head_dim)
{
    return 4.0 * sample_pairs(q_row_start, kv_row_start, n_samples) * head_dim * num_heads;
}

extern "C" double attention_bwd_flops(const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples,
                                      int num_heads, int head_dim)
{
    return 2.5 * attention_fwd_flops(q_row_start, kv_row_start, n_samples, num_heads, head_dim);
}
