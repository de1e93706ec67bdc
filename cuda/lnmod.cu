// lnmod.cu — fused LayerNorm-Modulate kernels (D-tile coalesced reduction), their backward and the gated-residual variant.
//
// Each row is read once as 16-byte vectors of 8 bf16, spread over a group of TPR threads (32, 64, 128 or 256: the
// narrowest whose threads hold at most 4 vectors in the plain forward, 8 in the residual forward, 5 in the backward,
// 4 in the residual backward), VPT vectors per thread kept in registers; the row's moments are reduced in fp32
// warp -> block. A block holds 256 threads, i.e. 256 / TPR row groups that walk their rows together, the next row's
// loads in flight where there is room (a persistent grid of as many blocks as are resident: the plain forward takes
// interleaved steps of rows, the other kernels one contiguous chunk per block). The forwards stage their rows: each
// row group's next row travels to shared memory by cp.async while the current one is reduced, and the block keeps
// its sample's modulation vectors in shared memory (the staged section below says why); the register forward, which
// loads rows straight into registers, runs only where a block's shared memory cannot hold one stage. The backward keeps
// the per-sample column sums (dshift, dscale, dgate) in registers while the chunk stays inside one sample, adds the
// row groups up in shared memory when it leaves the sample, and writes one partial per (chunk, sample) to the
// workspace; a last pass adds the partials of each sample in chunk order.
#include "cuda/lnmod.h"

#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/bf16vec.cuh"

namespace {

constexpr int kBlockThreads = 256;  // threads of every row kernel
constexpr unsigned kFullMask = 0xffffffffu;

// 8 consecutive floats of a modulation vector (16-byte aligned: dim is a multiple of 8).
__device__ __forceinline__ void load8(const float *p, float (&f)[kVecElems])
{
    const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
    const float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

// ---- row reductions over the TPR threads of a row group (threadIdx.x), one group per threadIdx.y ------
// Butterflies with a commutative combine leave every lane with the bitwise same value, and the
// cross-warp step adds the warps in a fixed order, so all threads of a row use identical statistics.
// With TPR > 32 they contain __syncthreads(): every thread of the block must call them.

template <int TPR, int N>
__device__ __forceinline__ void row_sum(float (&v)[N], float *scratch)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], offset);
    if constexpr (TPR > 32) {
        constexpr int kWarps = TPR / 32;
        float *group = scratch + threadIdx.y * kWarps * N;
        if (threadIdx.x % 32 == 0)
#pragma unroll
            for (int i = 0; i < N; ++i) group[(threadIdx.x / 32) * N + i] = v[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < N; ++i) {
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) total += group[w * N + i];
            v[i] = total;
        }
        __syncthreads();
    }
}

// Count, mean and sum of squared deviations of a set of values (Chan et al.'s parallel combination,
// written symmetrically so that combine(a, b) and combine(b, a) are bitwise equal).
struct Moments {
    float count, mean, m2;
};

__device__ __forceinline__ Moments combine(const Moments &a, const Moments &b)
{
    const float count = a.count + b.count;
    if (count == 0.0f) return a;
    const float delta = b.mean - a.mean;
    return {count, (a.count * a.mean + b.count * b.mean) / count, a.m2 + b.m2 + delta * delta * (a.count * b.count / count)};
}

template <int TPR>
__device__ __forceinline__ Moments row_moments(Moments m, float *scratch)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const Moments other = {__shfl_xor_sync(kFullMask, m.count, offset), __shfl_xor_sync(kFullMask, m.mean, offset),
                               __shfl_xor_sync(kFullMask, m.m2, offset)};
        m = combine(m, other);
    }
    if constexpr (TPR > 32) {
        constexpr int kWarps = TPR / 32;
        float *group = scratch + threadIdx.y * kWarps * 3;
        if (threadIdx.x % 32 == 0) {
            float *mine = group + (threadIdx.x / 32) * 3;
            mine[0] = m.count; mine[1] = m.mean; mine[2] = m.m2;
        }
        __syncthreads();
        m = {group[0], group[1], group[2]};
#pragma unroll
        for (int w = 1; w < kWarps; ++w) m = combine(m, {group[3 * w], group[3 * w + 1], group[3 * w + 2]});
        __syncthreads();
    }
    return m;
}

// ---- rows -> samples ------------------------------------------------------------------------------

// The sample holding `row`: the last b with row_start[b] <= row (this skips samples of zero rows).
__device__ __forceinline__ int sample_of_row(const int64_t *row_start, int n_samples, int64_t row)
{
    int lo = 0, hi = n_samples - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(row_start + mid) <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Move `sample` forward to the sample of `row` (rows only grow along a chunk).
__device__ __forceinline__ void advance_sample(const int64_t *row_start, int n_samples, int64_t row, int &sample)
{
    while (sample + 1 < n_samples && __ldg(row_start + sample + 1) <= row) ++sample;
}

// ---- forward -------------------------------------------------------------------------------------

struct FwdArgs {
    const uint4 *x, *y_prev;             // y_prev: residual variant only
    const float *gate, *shift, *scale;   // gate: residual variant only
    const int64_t *row_start;
    int n_samples, dim;
    int64_t n_rows, rows_per_block;
    float eps;
    bool interleaved;                    // rows in steps interleaved across blocks, not one chunk per block
    int stages;                          // staged kernel: rows in flight per row group
    uint4 *x_new, *y;                    // x_new: residual variant only
    float *mean, *rstd;
};

// Load row `row` (when valid) as VPT vectors per thread.
template <int TPR, int VPT>
__device__ __forceinline__ void load_row(const uint4 *base, int64_t row, bool valid, int nvec, uint4 (&v)[VPT])
{
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int vec = threadIdx.x + i * TPR;
        if (valid && vec < nvec) v[i] = base[row * nvec + vec];
    }
}

// The end of both forward kernels for a valid row (row_vec = row * nvec): its statistics (the group's first
// thread) and y = (x - mean) * rstd * (1 + scale) + shift from this thread's vectors xv, where
// modulation(v, sc, sh) gives the sample's scale (with SCALE_PLUS_ONE 1 + scale, as the staged kernel keeps it) and
// shift of vector v. Each kernel keeps the arithmetic it had before they shared this
// loop (the register kernel compiles to the same machine code), which matters: ptxas's register allocation is
// sensitive to its shape (a variant that computed row * nvec here took the 6-vector register kernel from 99
// registers to 80 with spills), and an add of 1 per element cost the staged kernel 3 points of copy bandwidth at
// D = 5120 (H200).
template <int TPR, int VPT, bool SCALE_PLUS_ONE, class Modulation>
__device__ __forceinline__ void store_normalized(const FwdArgs &a, int64_t row, int64_t row_vec, int nvec,
                                                 const uint4 (&xv)[VPT], float mean, float rstd,
                                                 const Modulation &modulation)
{
    if (threadIdx.x == 0) {
        a.mean[row] = mean;
        a.rstd[row] = rstd;
    }
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = threadIdx.x + i * TPR;
        if (v < nvec) {
            float f[kVecElems], sc[kVecElems], sh[kVecElems];
            unpack8(xv[i], f);
            modulation(v, sc, sh);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j)
                f[j] = (f[j] - mean) * rstd * (SCALE_PLUS_ONE ? sc[j] : 1.0f + sc[j]) + sh[j];
            a.y[row_vec + v] = pack8(f);
        }
    }
}

// scale and shift of sample vector `v` (8 values each) from global memory.
__device__ __forceinline__ void load_modulation(const FwdArgs &a, int64_t mod_offset, int v, float (&sc)[kVecElems],
                                                float (&sh)[kVecElems])
{
    load8(a.scale + mod_offset + v * kVecElems, sc);
    load8(a.shift + mod_offset + v * kVecElems, sh);
}

// The register forward (where a block's shared memory cannot hold the staged kernel's stage below): the plain
// one keeps the next row's x in flight while it reduces and writes the current one; the residual variant already
// has two input rows in flight and would run out of registers.
template <int TPR, int VPT, bool RESIDUAL>
__global__ void __launch_bounds__(kBlockThreads) lnmod_fwd_kernel(const FwdArgs a)
{
    constexpr int kRows = kBlockThreads / TPR;
    constexpr bool kPrefetch = !RESIDUAL;
    __shared__ float scratch[kRows * (TPR / 32) * 3];
    const int nvec = a.dim / kVecElems;
    // This block's rows: steps of kRows rows, either through one contiguous chunk or, interleaved, the
    // steps blockIdx.x, blockIdx.x + gridDim.x, ... of all rows.
    const int64_t stride = a.interleaved ? (int64_t)gridDim.x * kRows : kRows;
    const int64_t begin = a.interleaved ? (int64_t)blockIdx.x * kRows : (int64_t)blockIdx.x * a.rows_per_block;
    const int64_t end = a.interleaved ? a.n_rows : min(begin + a.rows_per_block, a.n_rows);
    if (begin >= end) return;
    int sample = sample_of_row(a.row_start, a.n_samples, begin);

    uint4 xv[VPT];
    uint4 next[kPrefetch ? VPT : 1];
    if constexpr (kPrefetch)
        load_row<TPR, VPT>(a.x, begin + threadIdx.y, begin + threadIdx.y < end, nvec, xv);
    for (int64_t base = begin; base < end; base += stride) {
        const int64_t row = base + threadIdx.y;
        const bool valid = row < end;
        if (valid) advance_sample(a.row_start, a.n_samples, row, sample);
        const int64_t row_vec = row * nvec;
        const int64_t mod_offset = (int64_t)sample * a.dim;

        if constexpr (kPrefetch) {
            load_row<TPR, VPT>(a.x, row + stride, row + stride < end, nvec, next);
        } else {
            uint4 pv[VPT];
            load_row<TPR, VPT>(a.x, row, valid, nvec, xv);
            load_row<TPR, VPT>(a.y_prev, row, valid, nvec, pv);
#pragma unroll
            for (int i = 0; i < VPT; ++i) {
                const int v = threadIdx.x + i * TPR;
                if (valid && v < nvec) {
                    float xf[kVecElems], pf[kVecElems], gf[kVecElems];
                    unpack8(xv[i], xf);
                    unpack8(pv[i], pf);
                    load8(a.gate + mod_offset + v * kVecElems, gf);
#pragma unroll
                    for (int j = 0; j < kVecElems; ++j) xf[j] += pf[j] * gf[j];
                    xv[i] = pack8(xf);
                    a.x_new[row_vec + v] = xv[i];
                }
            }
        }

        // This thread's moments (two passes over its registers), then the row's.
        Moments m = {0.0f, 0.0f, 0.0f};
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (valid && v < nvec) {
                float f[kVecElems];
                unpack8(xv[i], f);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) sum += f[j];
                m.count += kVecElems;
            }
        }
        if (m.count > 0.0f) m.mean = sum / m.count;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (valid && v < nvec) {
                float f[kVecElems];
                unpack8(xv[i], f);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) m.m2 += (f[j] - m.mean) * (f[j] - m.mean);
            }
        }
        m = row_moments<TPR>(m, scratch);
        if (valid) {
            const auto modulation = [&](int v, float (&sc)[kVecElems], float (&sh)[kVecElems]) {
                load_modulation(a, mod_offset, v, sc, sh);
            };
            store_normalized<TPR, VPT, false>(a, row, row_vec, nvec, xv, m.mean,
                                              rsqrtf(m.m2 / (float)a.dim + a.eps), modulation);
        }
        if constexpr (kPrefetch)
#pragma unroll
            for (int i = 0; i < VPT; ++i) xv[i] = next[i];
    }
}

// ---- forward, staged ----------------------------------------------------------------------------------
// The inputs of the next `stages` rows of each row group (kFwdStages) travel to shared memory by
// cp.async (16 bytes a thread, cached in L2 only) while the current row is reduced from registers, with
// fewer row registers than the register kernel (64 a thread instead of ~99 at D = 1536, 3072), so more blocks
// fit. The block keeps its current sample's (1 + scale), shift (and gate) in shared memory: a
// row no longer re-reads 8 (12) bytes of fp32 modulation per element through L1/L2 against its 4 (8) bytes
// of DRAM traffic. The row's statistics take two butterflies of one float (the sum, then the squared
// deviations from the exact mean) instead of five rounds of moment merges with divisions; row groups wider
// than a warp meet at their own named barrier, not the whole block's.

constexpr int kFwdStages = 1;  // rows in flight per row group (fastest: docs/PERFORMANCE.md, tables 3b and 3c)

__device__ __forceinline__ void copy_async16(uint4 *shared_dst, const uint4 *global_src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(shared_dst)),
                 "l"(__cvta_generic_to_global(global_src))
                 : "memory");
}

__device__ __forceinline__ void copy_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Makes `value` computed before the asm statements that follow, which the compiler keeps after this one.
__device__ __forceinline__ void computed_before_next_asm(float value)
{
    asm volatile("" ::"f"(value));
}

// Wait until at most `pending` (< kFwdStages) of this thread's newest copy groups are still in flight.
__device__ __forceinline__ void copy_async_wait(int pending)
{
    static_assert(kFwdStages <= 3, "one case per pending count");
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    }
}

// Copy this thread's vectors of row `row` (when valid) into its slots (slot[i * TPR] for vector i).
template <int TPR, int VPT>
__device__ __forceinline__ void copy_row_async(const uint4 *base, int64_t row, bool valid, int nvec, uint4 *slot)
{
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int vec = threadIdx.x + i * TPR;
        if (valid && vec < nvec) copy_async16(slot + i * TPR, base + row * nvec + vec);
    }
}

// The named barrier 1 + threadIdx.y of this thread's row group of TPR > 32 threads. The ids are constants so
// that ptxas reserves only those: an SM holds 64 barriers, and 16 a block would cap it at 4 blocks.
template <int TPR>
__device__ __forceinline__ void group_barrier()
{
    static_assert(TPR > 32 && kBlockThreads / TPR <= 4, "one case per row group");
    switch (threadIdx.y) {
    case 0: __barrier_sync_count(1, TPR); break;
    case 1: __barrier_sync_count(2, TPR); break;
    case 2: __barrier_sync_count(3, TPR); break;
    default: __barrier_sync_count(4, TPR); break;
    }
}

// Sum of v over this thread's row group (all of its threads call it; each gets the bitwise same value): a
// butterfly in each warp, then (TPR > 32) the warps' sums added in a fixed order through `warp_sums`
// (TPR / 32 floats of this group), behind the group's named barrier.
template <int TPR>
__device__ __forceinline__ float group_sum(float v, float *warp_sums)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    if constexpr (TPR > 32) {
        if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
        group_barrier<TPR>();
        v = warp_sums[0];
#pragma unroll
        for (int w = 1; w < TPR / 32; ++w) v += warp_sums[w];
    }
    return v;
}

// The staged modulation: vector `which` (0: 1 + scale, 1: shift, 2: gate) of one sample as float4 halves,
// [which][half][nvec], so that consecutive lanes read consecutive 16 bytes.
__device__ __forceinline__ void staged8(const float4 *staged, int which, int nvec, int v, float (&f)[kVecElems])
{
    const float4 lo = staged[(2 * which) * nvec + v], hi = staged[(2 * which + 1) * nvec + v];
    f[0] = lo.x; f[1] = lo.y; f[2] = lo.z; f[3] = lo.w;
    f[4] = hi.x; f[5] = hi.y; f[6] = hi.z; f[7] = hi.w;
}

// Stage sample `sample`'s modulation vectors (every thread of the block takes part).
template <bool RESIDUAL>
__device__ __forceinline__ void stage_modulation(const FwdArgs &a, int sample, int nvec, float4 *staged)
{
    const float *const vectors[3] = {a.scale, a.shift, a.gate};
    const int64_t offset = (int64_t)sample * a.dim;
    const int thread = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
    for (int which = 0; which < (RESIDUAL ? 3 : 2); ++which)
        for (int k = thread; k < 2 * nvec; k += kBlockThreads) {  // float4 k: half k % 2 of 16-byte vector k / 2
            float4 q = __ldg(reinterpret_cast<const float4 *>(vectors[which] + offset) + k);
            if (which == 0) q.x += 1.0f, q.y += 1.0f, q.z += 1.0f, q.w += 1.0f;
            staged[(2 * which + k % 2) * nvec + k / 2] = q;
        }
}

// Dynamic shared memory of the staged kernel: row slots [stages][inputs][kBlockThreads * VPT] uint4, the
// staged modulation [2 or 3][2][nvec] float4, the row groups' warp sums [2][kBlockThreads / 32] float.
constexpr size_t staged_slot_bytes(bool residual, int vpt)
{
    return (residual ? 2 : 1) * (size_t)kBlockThreads * vpt * sizeof(uint4);
}
constexpr size_t staged_fixed_bytes(bool residual, int dim)
{
    return (residual ? 3 : 2) * (size_t)dim * sizeof(float) + 2 * (kBlockThreads / 32) * sizeof(float);
}

template <int TPR, int VPT, bool RESIDUAL>
__global__ void __launch_bounds__(kBlockThreads, RESIDUAL ? 3 : 4) lnmod_fwd_staged_kernel(const FwdArgs a)
{
    constexpr int kRows = kBlockThreads / TPR, kWarps = TPR / 32;
    constexpr int kSlotVecs = kBlockThreads * VPT;  // one input's slots in one stage
    constexpr int kStageVecs = (RESIDUAL ? 2 : 1) * kSlotVecs;
    extern __shared__ uint4 staged_shared[];
    const int nvec = a.dim / kVecElems, stages = a.stages;
    uint4 *const my_slots = staged_shared + threadIdx.y * VPT * TPR + threadIdx.x;
    float4 *const staged = reinterpret_cast<float4 *>(staged_shared + stages * kStageVecs);
    float *const warp_sums = reinterpret_cast<float *>(staged + (RESIDUAL ? 3 : 2) * 2 * nvec) + threadIdx.y * kWarps;
    const int64_t stride = a.interleaved ? (int64_t)gridDim.x * kRows : kRows;
    const int64_t begin = a.interleaved ? (int64_t)blockIdx.x * kRows : (int64_t)blockIdx.x * a.rows_per_block;
    const int64_t end = a.interleaved ? a.n_rows : min(begin + a.rows_per_block, a.n_rows);
    if (begin >= end) return;

    for (int s = 0; s < stages; ++s) {
        const int64_t row = begin + s * stride + threadIdx.y;
        copy_row_async<TPR, VPT>(a.x, row, row < end, nvec, my_slots + s * kStageVecs);
        if constexpr (RESIDUAL) copy_row_async<TPR, VPT>(a.y_prev, row, row < end, nvec, my_slots + s * kStageVecs + kSlotVecs);
        copy_async_commit();
    }
    int block_sample = sample_of_row(a.row_start, a.n_samples, begin), staged_sample = -1, stage = 0;
    for (int64_t base = begin; base < end; base += stride) {
        advance_sample(a.row_start, a.n_samples, base, block_sample);
        if (block_sample != staged_sample) {  // block-uniform
            __syncthreads();  // every row of the block is done with the vectors staged before
            stage_modulation<RESIDUAL>(a, block_sample, nvec, staged);
            __syncthreads();
            staged_sample = block_sample;
        }
        const int64_t row = base + threadIdx.y;
        const bool valid = row < end;
        int sample = block_sample;
        if (valid) advance_sample(a.row_start, a.n_samples, row, sample);
        const bool from_staged = sample == staged_sample;  // else (a row past a sample end) read global memory
        const int64_t row_vec = row * nvec, mod_offset = (int64_t)sample * a.dim;

        copy_async_wait(stages - 1);  // this row's copies have landed
        uint4 *const slot = my_slots + stage * kStageVecs;
        uint4 xv[VPT];
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (valid && v < nvec) {
                xv[i] = slot[i * TPR];
                float xf[kVecElems];
                if constexpr (RESIDUAL) {
                    float pf[kVecElems], gf[kVecElems];
                    unpack8(xv[i], xf);
                    unpack8(slot[kSlotVecs + i * TPR], pf);
                    if (from_staged) staged8(staged, 2, nvec, v, gf);
                    else load8(a.gate + mod_offset + v * kVecElems, gf);
#pragma unroll
                    for (int j = 0; j < kVecElems; ++j) xf[j] += pf[j] * gf[j];
                    xv[i] = pack8(xf);
                    a.x_new[row_vec + v] = xv[i];
                }
                unpack8(xv[i], xf);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) sum += xf[j];
            }
        }
        // Every value read from the slots is in the sum, so the reads are done: refill them with the row
        // `stages` steps on.
        computed_before_next_asm(sum);
        const int64_t ahead = row + stages * stride;
        copy_row_async<TPR, VPT>(a.x, ahead, ahead < end, nvec, slot);
        if constexpr (RESIDUAL) copy_row_async<TPR, VPT>(a.y_prev, ahead, ahead < end, nvec, slot + kSlotVecs);
        copy_async_commit();
        stage = stage + 1 == stages ? 0 : stage + 1;

        const float mean = group_sum<TPR>(sum, warp_sums) / (float)a.dim;
        float m2 = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (valid && v < nvec) {
                float f[kVecElems];
                unpack8(xv[i], f);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) m2 += (f[j] - mean) * (f[j] - mean);
            }
        }
        const float rstd = rsqrtf(group_sum<TPR>(m2, warp_sums + kBlockThreads / 32) / (float)a.dim + a.eps);
        if (valid) {
            const auto modulation = [&](int v, float (&scale1)[kVecElems], float (&sh)[kVecElems]) {
                if (from_staged) {
                    staged8(staged, 0, nvec, v, scale1);
                    staged8(staged, 1, nvec, v, sh);
                } else {
                    load_modulation(a, mod_offset, v, scale1, sh);
#pragma unroll
                    for (int j = 0; j < kVecElems; ++j) scale1[j] += 1.0f;
                }
            };
            store_normalized<TPR, VPT, true>(a, row, row_vec, nvec, xv, mean, rstd, modulation);
        }
    }
}

// ---- backward ------------------------------------------------------------------------------------

struct BwdArgs {
    const uint4 *x, *dy, *y_prev, *d_x_new;  // y_prev, d_x_new: residual variant only (d_x_new may be NULL)
    const float *gate, *scale, *mean, *rstd;
    const int64_t *row_start;
    int n_samples, dim;
    int64_t n_rows, rows_per_block, slots;
    uint4 *dx, *dy_prev;                     // dy_prev: residual variant only
    float *partial;                          // [n_sums][slots][dim]; (chunk k, sample b) -> slot k + b
};

// One thread's share of a backward row: x, dy (, y_prev, d_x_new) and the row's statistics.
template <int VPT, bool RESIDUAL>
struct BwdRow {
    uint4 x[VPT], dy[VPT];
    uint4 y_prev[RESIDUAL ? VPT : 1], d_x_new[RESIDUAL ? VPT : 1];
    float mean, rstd;
};

template <int TPR, int VPT, bool RESIDUAL>
__device__ __forceinline__ void load_bwd_row(const BwdArgs &a, int nvec, int64_t row, bool valid, BwdRow<VPT, RESIDUAL> &r)
{
    load_row<TPR, VPT>(a.x, row, valid, nvec, r.x);
    load_row<TPR, VPT>(a.dy, row, valid, nvec, r.dy);
    if constexpr (RESIDUAL) {
        load_row<TPR, VPT>(a.y_prev, row, valid, nvec, r.y_prev);
        if (a.d_x_new) load_row<TPR, VPT>(a.d_x_new, row, valid, nvec, r.d_x_new);
        else
#pragma unroll
            for (int i = 0; i < VPT; ++i) r.d_x_new[i] = make_uint4(0, 0, 0, 0);
    }
    r.mean = valid ? a.mean[row] : 0.0f;
    r.rstd = valid ? a.rstd[row] : 0.0f;
}

// Backward of one row (when `mine`; every thread of the block takes part in the row reduction): writes
// dx (, dy_prev) and adds the row into this thread's column sums.
template <int TPR, int VPT, bool RESIDUAL>
__device__ __forceinline__ void bwd_row(const BwdArgs &a, int nvec, int64_t row, bool mine, int sample,
                                        const BwdRow<VPT, RESIDUAL> &r, float *scratch,
                                        float (&acc)[RESIDUAL ? 3 : 2][VPT][kVecElems])
{
    const int64_t row_vec = row * nvec, mod_offset = (int64_t)sample * a.dim;
    float sums[2] = {0.0f, 0.0f};  // sum of g and of g * xhat, g = dy * (1 + scale)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = threadIdx.x + i * TPR;
        if (mine && v < nvec) {
            float xf[kVecElems], df[kVecElems], sc[kVecElems];
            unpack8(r.x[i], xf);
            unpack8(r.dy[i], df);
            load8(a.scale + mod_offset + v * kVecElems, sc);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) {
                const float g = df[j] * (1.0f + sc[j]);
                sums[0] += g;
                sums[1] += g * ((xf[j] - r.mean) * r.rstd);
            }
        }
    }
    row_sum<TPR, 2>(sums, scratch);
    const float mean_g = sums[0] / (float)a.dim, mean_gx = sums[1] / (float)a.dim;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = threadIdx.x + i * TPR;
        if (mine && v < nvec) {
            float xf[kVecElems], df[kVecElems], sc[kVecElems], out[kVecElems];
            unpack8(r.x[i], xf);
            unpack8(r.dy[i], df);
            load8(a.scale + mod_offset + v * kVecElems, sc);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) {
                const float xhat = (xf[j] - r.mean) * r.rstd;
                out[j] = r.rstd * (df[j] * (1.0f + sc[j]) - mean_g - xhat * mean_gx);
                acc[0][i][j] += df[j];
                acc[1][i][j] += df[j] * xhat;
            }
            if constexpr (RESIDUAL) {
                float pf[kVecElems], rf[kVecElems], gf[kVecElems];
                unpack8(r.y_prev[i], pf);
                unpack8(r.d_x_new[i], rf);
                load8(a.gate + mod_offset + v * kVecElems, gf);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) {
                    out[j] += rf[j];
                    acc[2][i][j] += out[j] * pf[j];
                    pf[j] = out[j] * gf[j];
                }
                a.dy_prev[row_vec + v] = pack8(pf);
            }
            a.dx[row_vec + v] = pack8(out);
        }
    }
}

template <int TPR, int VPT, bool RESIDUAL>
__global__ void __launch_bounds__(kBlockThreads) lnmod_bwd_kernel(const BwdArgs a)
{
    constexpr int kRows = kBlockThreads / TPR;
    constexpr int kSums = RESIDUAL ? 3 : 2;  // dshift, dscale (, dgate)
    constexpr bool kPrefetch = !RESIDUAL;     // next row in flight (the residual variant lacks the registers)
    __shared__ float scratch[kRows * (TPR / 32) * 2];
    __shared__ float4 gather[kRows > 1 ? kBlockThreads * 2 : 1];
    const int nvec = a.dim / kVecElems;
    const int64_t chunk = blockIdx.x;
    const int64_t begin = chunk * a.rows_per_block;
    const int64_t end = min(begin + a.rows_per_block, a.n_rows);
    if (begin >= end) return;

    float acc[kSums][VPT][kVecElems];
#pragma unroll
    for (int s = 0; s < kSums; ++s)
#pragma unroll
        for (int i = 0; i < VPT; ++i)
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) acc[s][i][j] = 0.0f;

    // Add the row groups' column sums (fixed order) and write them as the partial of (chunk, sample).
    auto flush = [&](int sample) {
        const int64_t slot = chunk + sample;
#pragma unroll
        for (int s = 0; s < kSums; ++s) {
            float *out = a.partial + ((int64_t)s * a.slots + slot) * a.dim;
#pragma unroll
            for (int i = 0; i < VPT; ++i) {
                const int v = threadIdx.x + i * TPR;
                if constexpr (kRows == 1) {
                    if (v < nvec) {
                        float4 *o = reinterpret_cast<float4 *>(out + v * kVecElems);
                        o[0] = make_float4(acc[s][i][0], acc[s][i][1], acc[s][i][2], acc[s][i][3]);
                        o[1] = make_float4(acc[s][i][4], acc[s][i][5], acc[s][i][6], acc[s][i][7]);
                    }
                } else {
                    const int t = threadIdx.y * TPR + threadIdx.x;
                    gather[2 * t] = make_float4(acc[s][i][0], acc[s][i][1], acc[s][i][2], acc[s][i][3]);
                    gather[2 * t + 1] = make_float4(acc[s][i][4], acc[s][i][5], acc[s][i][6], acc[s][i][7]);
                    __syncthreads();
                    if (threadIdx.y == 0 && v < nvec) {
                        float4 lo = gather[2 * threadIdx.x], hi = gather[2 * threadIdx.x + 1];
                        for (int r = 1; r < kRows; ++r) {
                            const float4 l = gather[2 * (r * TPR + threadIdx.x)], h = gather[2 * (r * TPR + threadIdx.x) + 1];
                            lo.x += l.x; lo.y += l.y; lo.z += l.z; lo.w += l.w;
                            hi.x += h.x; hi.y += h.y; hi.z += h.z; hi.w += h.w;
                        }
                        float4 *o = reinterpret_cast<float4 *>(out + v * kVecElems);
                        o[0] = lo;
                        o[1] = hi;
                    }
                    __syncthreads();
                }
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) acc[s][i][j] = 0.0f;
            }
        }
    };

    int my_sample = sample_of_row(a.row_start, a.n_samples, begin);
    int last_sample = my_sample;   // sample of the step's last row: the same in every thread
    int block_sample = my_sample;  // the sample the column sums in registers belong to

    BwdRow<VPT, RESIDUAL> current;
    BwdRow<kPrefetch ? VPT : 1, false> next;
    if constexpr (kPrefetch) load_bwd_row<TPR, VPT>(a, nvec, begin + threadIdx.y, begin + threadIdx.y < end, current);

    for (int64_t base = begin; base < end; base += kRows) {
        const int64_t row = base + threadIdx.y;
        const bool valid = row < end;
        if (valid) advance_sample(a.row_start, a.n_samples, row, my_sample);
        advance_sample(a.row_start, a.n_samples, min(base + kRows, end) - 1, last_sample);
        if constexpr (kPrefetch) load_bwd_row<TPR, VPT>(a, nvec, row + kRows, row + kRows < end, next);
        else load_bwd_row<TPR, VPT>(a, nvec, row, valid, current);

        if (block_sample == last_sample) {
            // The whole step lies in the sample whose column sums the registers hold.
            bwd_row<TPR, VPT>(a, nvec, row, valid, block_sample, current, scratch, acc);
        } else {
            // The step crosses into later samples: one pass per sample, each on that sample's rows
            // (read again: they are in cache) and flushing the sums of all but the last.
            for (int sample = block_sample;; ++sample) {
                const bool mine = valid && my_sample == sample;
                BwdRow<VPT, RESIDUAL> again;
                load_bwd_row<TPR, VPT>(a, nvec, row, mine, again);
                bwd_row<TPR, VPT>(a, nvec, row, mine, sample, again, scratch, acc);
                if (sample == last_sample) break;
                flush(sample);
            }
        }
        block_sample = last_sample;
        if constexpr (kPrefetch) {
#pragma unroll
            for (int i = 0; i < VPT; ++i) current.x[i] = next.x[i], current.dy[i] = next.dy[i];
            current.mean = next.mean, current.rstd = next.rstd;
        }
    }
    flush(block_sample);
}

// Per-sample column sums from the partials, in chunk order: threadIdx.x picks a column, threadIdx.y a
// stride of chunks; the strides are then added in order. Samples without rows get zeros.
constexpr int kSumCols = 32, kSumLanes = 16;

__global__ void __launch_bounds__(kSumCols * kSumLanes)
    column_sums_kernel(const float *partial, int64_t slots, const int64_t *row_start, int dim, int64_t rows_per_block,
                       float *out0, float *out1, float *out2)
{
    __shared__ float lanes[kSumLanes][kSumCols];
    const int col = blockIdx.x * kSumCols + threadIdx.x;
    const int sample = blockIdx.y;
    const int which = blockIdx.z;
    const int64_t first_row = row_start[sample], end_row = row_start[sample + 1];
    float total = 0.0f;
    if (col < dim && end_row > first_row) {
        const int64_t first_chunk = first_row / rows_per_block, last_chunk = (end_row - 1) / rows_per_block;
        const float *p = partial + ((int64_t)which * slots + sample) * dim + col;
#pragma unroll 4
        for (int64_t k = first_chunk + threadIdx.y; k <= last_chunk; k += kSumLanes) total += p[k * dim];
    }
    lanes[threadIdx.y][threadIdx.x] = total;
    __syncthreads();
    if (threadIdx.y == 0 && col < dim) {
        for (int l = 1; l < kSumLanes; ++l) total += lanes[l][threadIdx.x];
        float *out = which == 0 ? out0 : which == 1 ? out1 : out2;
        out[(int64_t)sample * dim + col] = total;
    }
}

// ---- launch plans ----------------------------------------------------------------------------------

// Vectors per thread compiled for each kernel (about the most its registers hold without spilling: the
// forward holds x (and y_prev), the backward also two (three) column sums of 8 floats per vector), and
// the plain forward's limit (fastest: docs/PERFORMANCE.md, table 3b; under the staged kernel's
// 64-register bound 5 or more vectors spill in groups of 64 and 128 threads).
constexpr int kResidualFwdMaxVpt = 8, kFwdMaxVpt = 4, kBwdMaxVpt = 5, kResidualBwdMaxVpt = 4, kWidestVpt = 4;

// Row-group width and vectors per thread for a row of `dim`: the narrowest group (a warp first) whose
// threads hold at most `limit` vectors each, else the widest group (256 threads, at most 4 vectors).
struct RowShape {
    int tpr, vpt;
};

RowShape row_shape(int dim, int limit, const char *what)
{
    ALDIT_CHECK(dim >= kVecElems && dim <= LNMOD_MAX_DIM && dim % kVecElems == 0,
                "%s: dim %d must be a multiple of %d between %d and %d", what, dim, kVecElems, kVecElems, LNMOD_MAX_DIM);
    const int nvec = dim / kVecElems;
    for (int tpr : {32, 64, 128}) {
        const int vpt = (nvec + tpr - 1) / tpr;
        if (vpt <= limit) return {tpr, vpt};
    }
    return {kBlockThreads, (nvec + kBlockThreads - 1) / kBlockThreads};
}

// A persistent grid: as many blocks as fit on the GPU at once, each with one contiguous chunk of rows. Without a GPU
// (a workspace sized for a plan) the grid that fills every thread slot of the planning GPU (gpu.h's GPU_PLAN_SMS).
constexpr int kPlanThreadsPerSm = 2048;
struct GridPlan {
    int64_t blocks, rows_per_block;
};

template <class Kernel>
GridPlan grid_plan(Kernel kernel, int &occupancy_cache, int64_t n_rows, int rows_per_step, size_t shared_bytes = 0)
{
    int64_t resident = 0;
    if (occupancy_cache == 0 && gpu_count() == 0) {
        // sized without a GPU (aldit --check on a login node): every thread slot of the planning GPU's SMs
        resident = (int64_t)gpu_attribute(cudaDevAttrMultiProcessorCount) * (kPlanThreadsPerSm / kBlockThreads);
    } else {
        if (occupancy_cache == 0)
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy_cache, kernel, kBlockThreads,
                                                                     shared_bytes));
        const int sms = gpu_attribute(cudaDevAttrMultiProcessorCount);
        resident = (int64_t)(occupancy_cache > 0 ? occupancy_cache : 1) * sms;
    }
    if (n_rows <= 0) return {0, rows_per_step};
    int64_t rows_per_block = (n_rows + resident - 1) / resident;
    rows_per_block = (rows_per_block + rows_per_step - 1) / rows_per_step * rows_per_step;
    return {(n_rows + rows_per_block - 1) / rows_per_block, rows_per_block};
}

// Calls op.template run<TPR, VPT>() for the instantiation that matches `shape`.
template <int TPR, int VPT, int MAX_VPT, class Op>
void dispatch_vpt(int vpt, Op &op)
{
    if constexpr (VPT <= MAX_VPT) {
        if (vpt == VPT) op.template run<TPR, VPT>();
        else dispatch_vpt<TPR, VPT + 1, MAX_VPT>(vpt, op);
    } else {
        ALDIT_FATAL("lnmod: no kernel for %d vectors per thread", vpt);
    }
}

template <int MAX_VPT, class Op>
void dispatch(RowShape shape, Op &op)
{
    switch (shape.tpr) {
    case 32: dispatch_vpt<32, 1, MAX_VPT>(shape.vpt, op); break;
    case 64: dispatch_vpt<64, 1, MAX_VPT>(shape.vpt, op); break;
    case 128: dispatch_vpt<128, 1, MAX_VPT>(shape.vpt, op); break;
    default: dispatch_vpt<kBlockThreads, 1, (MAX_VPT < kWidestVpt ? MAX_VPT : kWidestVpt)>(shape.vpt, op);
    }
}

// How many of the staged forward's kFwdStages stages fit in a block's shared memory on the current device (at
// H100/H200's 227 KiB they do: at most 96 KiB of modulation and 64 KiB of slots at LNMOD_MAX_DIM, at 8 vectors a
// thread; 0 where they do not: the register kernel then).
int staged_stages_that_fit(bool residual, int vpt, int dim)
{
    const int shared_max = gpu_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    const size_t fixed_bytes = staged_fixed_bytes(residual, dim), slot_bytes = staged_slot_bytes(residual, vpt);
    int stages = kFwdStages;
    while (stages > 0 && fixed_bytes + stages * slot_bytes > (size_t)shared_max) --stages;
    return stages;
}

template <bool RESIDUAL>
struct FwdOp {
    FwdArgs args;
    cudaStream_t stream;
    // The staged kernel where its stages fit (lnmod_fwd_plan_for says the same), else the register kernel.
    template <int TPR, int VPT>
    void run()
    {
        args.stages = staged_stages_that_fit(RESIDUAL, VPT, args.dim);
        if (args.stages > 0) run_staged<TPR, VPT>();
        else run_registers<TPR, VPT>();
    }

    template <int TPR, int VPT>
    void run_registers()
    {
        static int occupancy = 0;
        auto kernel = lnmod_fwd_kernel<TPR, VPT, RESIDUAL>;
        const GridPlan plan = grid_plan(kernel, occupancy, args.n_rows, kBlockThreads / TPR);
        if (plan.blocks == 0) return;
        args.rows_per_block = plan.rows_per_block;
        kernel<<<(unsigned)plan.blocks, dim3(TPR, kBlockThreads / TPR), 0, stream>>>(args);
        CUDA_CHECK_LAUNCH();
    }

    // The staged kernel with args.stages stages, which fit (staged_stages_that_fit).
    template <int TPR, int VPT>
    void run_staged()
    {
        static int occupancy = 0;
        static size_t occupancy_bytes = 0;  // the dynamic shared memory `occupancy` was found for
        auto kernel = lnmod_fwd_staged_kernel<TPR, VPT, RESIDUAL>;
        const size_t bytes = staged_fixed_bytes(RESIDUAL, args.dim) + args.stages * staged_slot_bytes(RESIDUAL, VPT);
        if (bytes != occupancy_bytes) {
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
            occupancy = 0, occupancy_bytes = bytes;
        }
        const GridPlan plan = grid_plan(kernel, occupancy, args.n_rows, kBlockThreads / TPR, bytes);
        if (plan.blocks == 0) return;
        args.rows_per_block = plan.rows_per_block;
        kernel<<<(unsigned)plan.blocks, dim3(TPR, kBlockThreads / TPR), bytes, stream>>>(args);
        CUDA_CHECK_LAUNCH();
    }
};

template <bool RESIDUAL>
struct BwdOp {
    BwdArgs args;
    cudaStream_t stream;
    float *out[3];
    bool plan_only;
    GridPlan plan;
    template <int TPR, int VPT>
    void run()
    {
        static int occupancy = 0;
        auto kernel = lnmod_bwd_kernel<TPR, VPT, RESIDUAL>;
        plan = grid_plan(kernel, occupancy, args.n_rows, kBlockThreads / TPR);
        if (plan_only) return;
        args.rows_per_block = plan.rows_per_block;
        args.slots = plan.blocks + args.n_samples;
        if (plan.blocks > 0) {
            kernel<<<(unsigned)plan.blocks, dim3(TPR, kBlockThreads / TPR), 0, stream>>>(args);
            CUDA_CHECK_LAUNCH();
        }
        if (args.n_samples > 0) {
            const dim3 grid((args.dim + kSumCols - 1) / kSumCols, args.n_samples, RESIDUAL ? 3 : 2);
            column_sums_kernel<<<grid, dim3(kSumCols, kSumLanes), 0, stream>>>(
                args.partial, args.slots, args.row_start, args.dim, args.rows_per_block, out[0], out[1], out[2]);
            CUDA_CHECK_LAUNCH();
        }
    }
};

void check_sizes(const char *what, int64_t n_rows, int n_samples)
{
    ALDIT_CHECK(n_rows >= 0 && n_samples >= 0, "%s: bad sizes (%lld rows, %d samples)", what, (long long)n_rows, n_samples);
    ALDIT_CHECK(n_samples > 0 || n_rows == 0, "%s: %lld rows but no samples", what, (long long)n_rows);
    ALDIT_CHECK(n_samples < 65536, "%s: %d samples in one call (at most 65535)", what, n_samples);
}

void check_rows(const char *what, int64_t n_rows, int n_samples, const int64_t *row_start)
{
    check_sizes(what, n_rows, n_samples);
    ALDIT_CHECK(row_start != nullptr, "%s: row_start is NULL", what);
}

void check_aligned(const char *what, const char *name, const void *p)
{
    ALDIT_CHECK(p != nullptr && (uintptr_t)p % 16 == 0, "%s: %s must be a 16-byte aligned device pointer", what, name);
}

size_t bwd_workspace_bytes(int64_t n_rows, int dim, int n_samples, bool residual)
{
    const char *what = residual ? "lnmod_residual_bwd_workspace_bytes" : "lnmod_bwd_workspace_bytes";
    check_sizes(what, n_rows, n_samples);
    BwdArgs args = {};
    args.n_rows = n_rows;
    args.dim = dim;
    GridPlan plan;
    if (residual) {
        BwdOp<true> op = {args, nullptr, {}, true, {}};
        dispatch<kResidualBwdMaxVpt>(row_shape(dim, kResidualBwdMaxVpt, what), op);
        plan = op.plan;
    } else {
        BwdOp<false> op = {args, nullptr, {}, true, {}};
        dispatch<kBwdMaxVpt>(row_shape(dim, kBwdMaxVpt, what), op);
        plan = op.plan;
    }
    return (size_t)(plan.blocks + n_samples) * (size_t)dim * sizeof(float) * (residual ? 3 : 2);
}

}  // namespace

extern "C" lnmod_fwd_plan lnmod_fwd_plan_for(int dim, int residual)
{
    const RowShape shape = row_shape(dim, residual ? kResidualFwdMaxVpt : kFwdMaxVpt, "lnmod_fwd_plan_for");
    const int stages = staged_stages_that_fit(residual != 0, shape.vpt, dim);
    return {stages > 0 ? stages : LNMOD_FWD_REGISTER_KERNEL, shape.tpr, shape.vpt};
}

extern "C" void lnmod_fwd(const gpu_bf16 *x, int64_t n_rows, int dim, const int64_t *row_start, int n_samples,
                          const float *shift, const float *scale, float eps, gpu_bf16 *y, float *mean, float *rstd,
                          cudaStream_t stream)
{
    const char *what = "lnmod_fwd";
    check_rows(what, n_rows, n_samples, row_start);
    const RowShape shape = row_shape(dim, kFwdMaxVpt, what);
    if (n_rows == 0) return;
    check_aligned(what, "x", x), check_aligned(what, "y", y), check_aligned(what, "shift", shift);
    check_aligned(what, "scale", scale);
    ALDIT_CHECK(mean && rstd, "%s: mean and rstd are required", what);
    FwdArgs args = {};
    args.x = reinterpret_cast<const uint4 *>(x);
    args.shift = shift, args.scale = scale, args.row_start = row_start;
    args.n_samples = n_samples, args.dim = dim, args.n_rows = n_rows, args.eps = eps;
    args.y = reinterpret_cast<uint4 *>(y), args.mean = mean, args.rstd = rstd;
    args.interleaved = true;
    FwdOp<false> op = {args, stream};
    dispatch<kFwdMaxVpt>(shape, op);
}

extern "C" void lnmod_residual_fwd(const gpu_bf16 *x, const gpu_bf16 *y_prev, int64_t n_rows, int dim,
                                   const int64_t *row_start, int n_samples, const float *gate, const float *shift,
                                   const float *scale, float eps, gpu_bf16 *x_new, gpu_bf16 *y, float *mean,
                                   float *rstd, cudaStream_t stream)
{
    const char *what = "lnmod_residual_fwd";
    check_rows(what, n_rows, n_samples, row_start);
    const RowShape shape = row_shape(dim, kResidualFwdMaxVpt, what);
    if (n_rows == 0) return;
    check_aligned(what, "x", x), check_aligned(what, "y_prev", y_prev), check_aligned(what, "gate", gate);
    check_aligned(what, "shift", shift), check_aligned(what, "scale", scale);
    check_aligned(what, "x_new", x_new), check_aligned(what, "y", y);
    ALDIT_CHECK(mean && rstd, "%s: mean and rstd are required", what);
    FwdArgs args = {};
    args.x = reinterpret_cast<const uint4 *>(x), args.y_prev = reinterpret_cast<const uint4 *>(y_prev);
    args.gate = gate, args.shift = shift, args.scale = scale, args.row_start = row_start;
    args.n_samples = n_samples, args.dim = dim, args.n_rows = n_rows, args.eps = eps;
    args.x_new = reinterpret_cast<uint4 *>(x_new), args.y = reinterpret_cast<uint4 *>(y);
    args.mean = mean, args.rstd = rstd;
    FwdOp<true> op = {args, stream};
    dispatch<kResidualFwdMaxVpt>(shape, op);
}

extern "C" size_t lnmod_bwd_workspace_bytes(int64_t n_rows, int dim, int n_samples)
{
    return bwd_workspace_bytes(n_rows, dim, n_samples, false);
}

extern "C" size_t lnmod_residual_bwd_workspace_bytes(int64_t n_rows, int dim, int n_samples)
{
    return bwd_workspace_bytes(n_rows, dim, n_samples, true);
}

extern "C" void lnmod_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows, int dim, const int64_t *row_start,
                          int n_samples, const float *scale, const float *mean, const float *rstd, gpu_bf16 *dx,
                          float *dshift, float *dscale, void *workspace, cudaStream_t stream)
{
    const char *what = "lnmod_bwd";
    check_rows(what, n_rows, n_samples, row_start);
    const RowShape shape = row_shape(dim, kBwdMaxVpt, what);
    if (n_samples == 0) return;
    check_aligned(what, "dshift", dshift), check_aligned(what, "dscale", dscale);
    check_aligned(what, "workspace", workspace);
    if (n_rows > 0) {
        check_aligned(what, "x", x), check_aligned(what, "dy", dy), check_aligned(what, "dx", dx);
        check_aligned(what, "scale", scale);
        ALDIT_CHECK(mean && rstd, "%s: mean and rstd are required", what);
    }
    BwdArgs args = {};
    args.x = reinterpret_cast<const uint4 *>(x), args.dy = reinterpret_cast<const uint4 *>(dy);
    args.scale = scale, args.mean = mean, args.rstd = rstd, args.row_start = row_start;
    args.n_samples = n_samples, args.dim = dim, args.n_rows = n_rows;
    args.dx = reinterpret_cast<uint4 *>(dx), args.partial = static_cast<float *>(workspace);
    BwdOp<false> op = {args, stream, {dshift, dscale, nullptr}, false, {}};
    dispatch<kBwdMaxVpt>(shape, op);
}

extern "C" void lnmod_residual_bwd(const gpu_bf16 *x_new, const gpu_bf16 *y_prev, const gpu_bf16 *dy,
                                   const gpu_bf16 *d_x_new, int64_t n_rows, int dim, const int64_t *row_start,
                                   int n_samples, const float *gate, const float *scale, const float *mean,
                                   const float *rstd, gpu_bf16 *dx, gpu_bf16 *dy_prev, float *dshift, float *dscale,
                                   float *dgate, void *workspace, cudaStream_t stream)
{
    const char *what = "lnmod_residual_bwd";
    check_rows(what, n_rows, n_samples, row_start);
    const RowShape shape = row_shape(dim, kResidualBwdMaxVpt, what);
    if (n_samples == 0) return;
    check_aligned(what, "dshift", dshift), check_aligned(what, "dscale", dscale), check_aligned(what, "dgate", dgate);
    check_aligned(what, "workspace", workspace);
    if (n_rows > 0) {
        check_aligned(what, "x_new", x_new), check_aligned(what, "y_prev", y_prev), check_aligned(what, "dy", dy);
        check_aligned(what, "dx", dx), check_aligned(what, "dy_prev", dy_prev);
        check_aligned(what, "gate", gate), check_aligned(what, "scale", scale);
        if (d_x_new) check_aligned(what, "d_x_new", d_x_new);
        ALDIT_CHECK(mean && rstd, "%s: mean and rstd are required", what);
    }
    BwdArgs args = {};
    args.x = reinterpret_cast<const uint4 *>(x_new), args.dy = reinterpret_cast<const uint4 *>(dy);
    args.y_prev = reinterpret_cast<const uint4 *>(y_prev), args.d_x_new = reinterpret_cast<const uint4 *>(d_x_new);
    args.gate = gate, args.scale = scale, args.mean = mean, args.rstd = rstd, args.row_start = row_start;
    args.n_samples = n_samples, args.dim = dim, args.n_rows = n_rows;
    args.dx = reinterpret_cast<uint4 *>(dx), args.dy_prev = reinterpret_cast<uint4 *>(dy_prev);
    args.partial = static_cast<float *>(workspace);
    BwdOp<true> op = {args, stream, {dshift, dscale, dgate}, false, {}};
    dispatch<kResidualBwdMaxVpt>(shape, op);
}
