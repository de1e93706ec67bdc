// fused.cu — fused CUDA ops of the training step: q/k RMSNorm + 3D RoPE, gradient norm and AdamW, rectified-flow mixing and loss.
//
// RMSNorm + RoPE: each row is read once as 16-byte vectors of 8 bf16 spread over a row group of TPR
// threads (32 up to dim 1024, then 64, 128, 256 threads so that a thread holds at most 4 vectors); a
// block of 256 threads works on 256 / TPR rows at a time. A vector's 8 values are 4 complex pairs of
// one head (dim and head_dim multiples of 8 keep heads whole) or of two heads; a thread's successive
// vectors lie TPR * 8 columns apart, so when head_dim divides that they sit at the same place in their
// heads and share the same 4 rotation angles, computed once per row. The backward keeps dweight's
// column sums in registers, adds the row groups in shared memory at the end, writes one partial per
// block, and a last pass adds the blocks' partials in a fixed order.
#include "cuda/fused.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "cuda/bf16vec.cuh"
#include "cuda/colsum.cuh"

#include <type_traits>

namespace {

constexpr int kBlockThreads = 256;  // threads of every kernel here but the tiny ones
constexpr int kMaxVecsPerThread = 4;
constexpr size_t kDefaultDynamicShared = 40 * 1024;  // dynamic shared memory that needs no opt-in (limit: 48 KiB less the static)
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kNegLog2Theta = -13.287712379549449f;  // -log2(10000), RoPE's theta

// ---- reductions ------------------------------------------------------------------------------------

// Sum over the TPR threads of a row group (threadIdx.x; one group per threadIdx.y). The butterfly leaves
// every lane with the same bits; with TPR > 32 the warps are added in a fixed order through `scratch`
// (kBlockThreads / 32 floats) and __syncthreads(): every thread of the block must call it.
template <int TPR>
__device__ __forceinline__ float row_sum(float value, float *scratch)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
    if constexpr (TPR > 32) {
        constexpr int kWarps = TPR / 32;
        float *group = scratch + threadIdx.y * kWarps;
        if (threadIdx.x % 32 == 0) group[threadIdx.x / 32] = value;
        __syncthreads();
        value = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) value += group[w];
        __syncthreads();
    }
    return value;
}

// Sum over a 1-D block of kBlockThreads threads, in a fixed order; the result is valid in thread 0.
template <typename T>
__device__ __forceinline__ T block_sum(T value)
{
    __shared__ T warp_sums[kBlockThreads / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
    __syncthreads();
    T total = 0;
    if (threadIdx.x == 0)
#pragma unroll
        for (int w = 0; w < kBlockThreads / 32; ++w) total += warp_sums[w];
    return total;
}

// ---- RoPE angles -----------------------------------------------------------------------------------

// sin and cos of an angle of moderate size (|angle| < 2^20 rad; RoPE's are at most the largest grid index):
// reduced by whole turns with 2 pi in two fp32 parts (hi + lo), then the fast intrinsic, which is accurate to
// about 2^-21 on [-pi, pi]. Unlike sincosf it has no slow path for huge arguments, so it needs no stack.
__device__ __forceinline__ void sincos_moderate(float angle, float &sin_out, float &cos_out)
{
    const float turns = rintf(angle * 0.15915494309189535f);
    float reduced = fmaf(-turns, 6.28318548202514648f, angle);  // hi: the fp32 nearest 2 pi
    reduced = fmaf(-turns, -1.7484555314695172e-7f, reduced);   // lo: 2 pi - hi
    __sincosf(reduced, &sin_out, &cos_out);
}

// cos and sin of the 4 pairs of the vector that starts at column `column` (a multiple of 8), for a row at
// grid position (f, h, w). Pair j of a head (n_pairs = head_dim / 2) belongs to the frame part (the first
// rope_first pairs), then the row part (rope_second pairs) and the column part (the rest) and turns by
// position * theta^(-local / part_pairs), as cpu_rope_axes_fwd (Wan's split: rope_first = n_pairs - 2 (n_pairs / 3),
// rope_second = n_pairs / 3, theta 10000). direction -1 gives the inverse rotation.
__device__ __forceinline__ void rope_angles(int column, int head_dim, int rope_first, int rope_second,
                                            float neg_log2_theta, const int (&position)[3], float direction,
                                            float (&cos_a)[4], float (&sin_a)[4])
{
    const int n_pairs = head_dim / 2, first = rope_first, second = rope_second, third = n_pairs - first - second;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int pair = ((column + 2 * k) % head_dim) / 2;
        int at, local, part;  // at: the position along the pair's axis (selected, not indexed: no local memory)
        if (pair < first) { at = position[0]; local = pair; part = first; }
        else if (pair < first + second) { at = position[1]; local = pair - first; part = second; }
        else { at = position[2]; local = pair - first - second; part = third; }
        const float frequency = exp2f(neg_log2_theta * (float)local / (float)part);
        sincos_moderate((float)at * frequency, sin_a[k], cos_a[k]);
        sin_a[k] *= direction;
    }
}

// Rotate the 4 (real, imaginary) pairs of a vector in place.
__device__ __forceinline__ void rotate_pairs(float (&f)[kVecElems], const float (&cos_a)[4], const float (&sin_a)[4])
{
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float re = f[2 * k], im = f[2 * k + 1];
        f[2 * k] = re * cos_a[k] - im * sin_a[k];
        f[2 * k + 1] = re * sin_a[k] + im * cos_a[k];
    }
}

// ---- RMSNorm + RoPE --------------------------------------------------------------------------------

struct QkArgs {
    const uint4 *x, *dy;           // dy: backward only
    const unsigned short *weight;  // bf16 bits
    const int32_t *positions;      // NULL: no RoPE; row r's position is positions[(r / position_div) * 3 ...]
    int position_div;              // 1, or the heads of a token when each row is one head (fused_head_norm_rope)
    int rope_first, rope_second;   // the frame and row parts' pairs (rope_angles)
    float neg_log2_theta;
    const float *rstd_in;          // backward only
    int64_t n_rows;
    int dim, head_dim;
    float eps;
    uint4 *out;                    // y (forward) or dx (backward)
    float *rstd_out;               // forward only
    float *partial;                // backward only: [gridDim.x][dim] column sums of dweight
    cudaStream_t stream_;          // host side only: the launch's stream
};

// VPT vectors of row `row` per thread (zeros where the row or the vector does not exist).
template <int TPR, int VPT>
__device__ __forceinline__ void load_row(const uint4 *base, int64_t row, bool valid, int nvec, uint4 (&v)[VPT])
{
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int vec = threadIdx.x + i * TPR;
        v[i] = valid && vec < nvec ? base[row * nvec + vec] : make_uint4(0, 0, 0, 0);
    }
}

// This thread's vectors of the weight, read as single values: a parameter in a flat bf16 buffer may
// start at any even address.
template <int TPR, int VPT>
__device__ __forceinline__ void load_weight(const unsigned short *weight, int nvec, uint4 (&v)[VPT])
{
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int vec = threadIdx.x + i * TPR;
        uint32_t w[4] = {0, 0, 0, 0};
        if (vec < nvec)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                w[j] = (uint32_t)__ldg(weight + vec * kVecElems + 2 * j) |
                       ((uint32_t)__ldg(weight + vec * kVecElems + 2 * j + 1) << 16);
        v[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

__device__ __forceinline__ void load_position(const int32_t *positions, int64_t row, int position_div, bool valid,
                                              int (&position)[3])
{
    const int64_t token = row / position_div;
#pragma unroll
    for (int axis = 0; axis < 3; ++axis) position[axis] = positions && valid ? __ldg(positions + token * 3 + axis) : 0;
}

// A grid of resident blocks strides over the row groups; each thread loads its vectors of the next row
// group before it reduces and writes the current one, so that a row's loads are in flight during the
// previous row's work. Up to 3 vectors per thread the registers allow 3 resident blocks per SM.
template <int TPR, int VPT>
__global__ void __launch_bounds__(kBlockThreads, VPT <= 3 ? 3 : 2) qk_norm_rope_fwd_kernel(const QkArgs a)
{
    constexpr int kRows = kBlockThreads / TPR;
    __shared__ float scratch[kBlockThreads / 32];
    const int nvec = a.dim / kVecElems;
    const bool shared_angles = (TPR * kVecElems) % a.head_dim == 0;
    const int64_t stride = (int64_t)gridDim.x * kRows;
    uint4 wv[VPT];
    load_weight<TPR, VPT>(a.weight, nvec, wv);
    uint4 next[VPT];
    const int64_t first_row = (int64_t)blockIdx.x * kRows + threadIdx.y;
    load_row<TPR, VPT>(a.x, first_row, first_row < a.n_rows, nvec, next);

    for (int64_t base = (int64_t)blockIdx.x * kRows; base < a.n_rows; base += stride) {
        const int64_t row = base + threadIdx.y;
        const bool valid = row < a.n_rows;
        uint4 xv[VPT];
#pragma unroll
        for (int i = 0; i < VPT; ++i) xv[i] = next[i];
        load_row<TPR, VPT>(a.x, row + stride, row + stride < a.n_rows, nvec, next);
        int position[3];
        load_position(a.positions, row, a.position_div, valid, position);

        float sum_sq = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            float f[kVecElems];
            unpack8(xv[i], f);  // zeros outside the row
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) sum_sq += f[j] * f[j];
        }
        sum_sq = row_sum<TPR>(sum_sq, scratch);
        if (!valid) continue;  // every thread of the block has taken part in row_sum
        const float rstd = rsqrtf(sum_sq / (float)a.dim + a.eps);
        if (threadIdx.x == 0) a.rstd_out[row] = rstd;

        float cos_a[4], sin_a[4];
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (v >= nvec) break;
            float f[kVecElems], w[kVecElems];
            unpack8(xv[i], f);
            unpack8(wv[i], w);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) f[j] = f[j] * rstd * w[j];
            if (a.positions) {
                if (i == 0 || !shared_angles) rope_angles(v * kVecElems, a.head_dim, a.rope_first, a.rope_second, a.neg_log2_theta, position, 1.0f, cos_a, sin_a);
                rotate_pairs(f, cos_a, sin_a);
            }
            a.out[row * nvec + v] = pack8(f);
        }
    }
}

// With u = x * rstd, y = R(u * weight): g = R^T dy, dweight += g * u, and
// dx = rstd * (g * weight - x * rstd^2 * mean(g * weight * x)).
// The dweight sums of each row group live in shared memory (each thread adds into its own columns of its
// group's row), not in registers: 3 blocks of 256 threads stay resident per SM up to 3 vectors per thread.
template <int TPR, int VPT>
__global__ void __launch_bounds__(kBlockThreads, VPT <= 3 ? 3 : 2) qk_norm_rope_bwd_kernel(const QkArgs a)
{
    constexpr int kRows = kBlockThreads / TPR;
    __shared__ float scratch[kBlockThreads / 32];
    extern __shared__ float4 group_sums4[];  // [kRows][dim] floats, then the weight's nvec vectors
    float *group_sums = reinterpret_cast<float *>(group_sums4);
    const int nvec = a.dim / kVecElems;
    const bool shared_angles = (TPR * kVecElems) % a.head_dim == 0;
    uint4 *weight_vecs = reinterpret_cast<uint4 *>(group_sums4 + (size_t)kRows * (a.dim / 4));
    if (threadIdx.y == 0) {
        uint4 wv[VPT];
        load_weight<TPR, VPT>(a.weight, nvec, wv);
#pragma unroll
        for (int i = 0; i < VPT; ++i)
            if (threadIdx.x + i * TPR < nvec) weight_vecs[threadIdx.x + i * TPR] = wv[i];
    }
    float4 *my_sums = group_sums4 + (size_t)threadIdx.y * (a.dim / 4);  // this row group's dweight sums
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int v = threadIdx.x + i * TPR;
        if (v < nvec) my_sums[2 * v] = my_sums[2 * v + 1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();  // the weight's vectors are in shared memory

    for (int64_t base = (int64_t)blockIdx.x * kRows; base < a.n_rows; base += (int64_t)gridDim.x * kRows) {
        const int64_t row = base + threadIdx.y;
        const bool valid = row < a.n_rows;
        uint4 xv[VPT], dyv[VPT];
        load_row<TPR, VPT>(a.x, row, valid, nvec, xv);
        load_row<TPR, VPT>(a.dy, row, valid, nvec, dyv);
        int position[3];
        load_position(a.positions, row, a.position_div, valid, position);
        const float rstd = valid ? a.rstd_in[row] : 0.0f;

        // g = R^T dy is formed twice (for the row sum, then for dx) rather than kept: fewer registers, more
        // resident blocks. With shared angles cos_a, sin_a of the first vector serve every vector.
        float cos_a[4], sin_a[4];
        float sum_gwx = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            float g[kVecElems], f[kVecElems], w[kVecElems];
            unpack8(dyv[i], g);  // zeros outside the row
            if (a.positions && v < nvec) {
                if (i == 0 || !shared_angles) rope_angles(v * kVecElems, a.head_dim, a.rope_first, a.rope_second, a.neg_log2_theta, position, -1.0f, cos_a, sin_a);
                rotate_pairs(g, cos_a, sin_a);
            }
            unpack8(xv[i], f);
            unpack8(v < nvec ? weight_vecs[v] : make_uint4(0, 0, 0, 0), w);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) sum_gwx += g[j] * w[j] * f[j];
            if (valid && v < nvec) {
                float4 lo = my_sums[2 * v], hi = my_sums[2 * v + 1];
                lo.x += g[0] * f[0] * rstd, lo.y += g[1] * f[1] * rstd, lo.z += g[2] * f[2] * rstd, lo.w += g[3] * f[3] * rstd;
                hi.x += g[4] * f[4] * rstd, hi.y += g[5] * f[5] * rstd, hi.z += g[6] * f[6] * rstd, hi.w += g[7] * f[7] * rstd;
                my_sums[2 * v] = lo, my_sums[2 * v + 1] = hi;
            }
        }
        sum_gwx = row_sum<TPR>(sum_gwx, scratch);
        if (!valid) continue;
        const float coef = sum_gwx / (float)a.dim * rstd * rstd;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
            const int v = threadIdx.x + i * TPR;
            if (v >= nvec) break;
            float g[kVecElems], f[kVecElems], w[kVecElems];
            unpack8(dyv[i], g);
            if (a.positions) {
                if (!shared_angles) rope_angles(v * kVecElems, a.head_dim, a.rope_first, a.rope_second, a.neg_log2_theta, position, -1.0f, cos_a, sin_a);
                rotate_pairs(g, cos_a, sin_a);
            }
            unpack8(xv[i], f);
            unpack8(weight_vecs[v], w);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) f[j] = rstd * (g[j] * w[j] - f[j] * coef);
            a.out[row * nvec + v] = pack8(f);
        }
    }

    // This block's partial of dweight: the row groups' sums added in group order.
    __syncthreads();
    for (int column = threadIdx.y * TPR + threadIdx.x; column < a.dim; column += kBlockThreads) {
        float total = 0.0f;
        for (int group = 0; group < kRows; ++group) total += group_sums[group * a.dim + column];
        a.partial[(int64_t)blockIdx.x * a.dim + column] = total;
    }
}

// Row-group width: the fewest threads (32 .. 256) that hold a row in at most kMaxVecsPerThread vectors each.
int threads_per_row(int dim)
{
    int tpr = 32;
    while (dim / kVecElems > kMaxVecsPerThread * tpr) tpr *= 2;
    return tpr;
}

template <int N>
using Int = std::integral_constant<int, N>;

// Call launch(Int<TPR>, Int<VPT>) for the row shape of `dim`.
template <int TPR, typename Launch>
void with_vecs(int vpt, Launch &&launch)
{
    switch (vpt) {
    case 1: launch(Int<TPR>{}, Int<1>{}); break;
    case 2: launch(Int<TPR>{}, Int<2>{}); break;
    case 3: launch(Int<TPR>{}, Int<3>{}); break;
    default: launch(Int<TPR>{}, Int<4>{}); break;
    }
}

template <typename Launch>
void with_row_shape(int dim, Launch &&launch)
{
    const int tpr = threads_per_row(dim), nvec = dim / kVecElems, vpt = (nvec + tpr - 1) / tpr;
    switch (tpr) {
    case 32: with_vecs<32>(vpt, launch); break;
    case 64: with_vecs<64>(vpt, launch); break;
    case 128: with_vecs<128>(vpt, launch); break;
    default: with_vecs<256>(vpt, launch); break;
    }
}

void check_qk_shape(const char *op, int64_t n_rows, int num_heads, int head_dim)
{
    ALDIT_CHECK(n_rows >= 0, "%s: n_rows %lld is negative", op, (long long)n_rows);
    ALDIT_CHECK(num_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                "%s: need num_heads > 0 and an even head_dim > 0 (got %d heads of %d)", op, num_heads, head_dim);
    const int64_t dim = (int64_t)num_heads * head_dim;
    ALDIT_CHECK(dim % kVecElems == 0 && dim <= FUSED_QK_MAX_DIM,
                "%s: dim = %d heads x %d = %lld must be a multiple of %d up to %d", op, num_heads, head_dim,
                (long long)dim, kVecElems, FUSED_QK_MAX_DIM);
}

void check_rows_aligned(const char *op, const char *name, const void *rows)
{
    ALDIT_CHECK(reinterpret_cast<uintptr_t>(rows) % 16 == 0, "%s: %s (%p) is not 16-byte aligned", op, name, rows);
}

// Blocks of the backward: at least kMinRowsPerBlock rows each (the partials stay small next to the rows),
// at most as many as the device holds at once at full occupancy (8 blocks of 256 threads per SM); the
// launch takes the fewer of these and the blocks its kernel can keep resident (resident_blocks).
constexpr int64_t kMinRowsPerBlock = 16;
constexpr int kMaxBlocksPerSm = 2048 / kBlockThreads;

int sm_count()
{
    return gpu_attribute(cudaDevAttrMultiProcessorCount);
}

// Resident blocks per SM of one kernel (kBlockThreads threads) at one dynamic shared-memory size, asked
// from the runtime once per launch site and size: a launch site keeps one of these in a static.
struct Residency {
    const void *kernel;
    size_t shared_bytes;
    int per_sm;
};

int64_t resident_blocks(Residency &cache, const void *kernel, size_t shared_bytes)
{
    if (cache.kernel != kernel || cache.shared_bytes != shared_bytes || cache.per_sm < 1) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cache.per_sm, kernel, kBlockThreads, shared_bytes));
        cache.kernel = kernel;
        cache.shared_bytes = shared_bytes;
        if (cache.per_sm < 1) cache.per_sm = 1;
    }
    return (int64_t)sm_count() * cache.per_sm;
}

int64_t qk_bwd_block_bound(int64_t n_rows)
{
    const int64_t wanted = (n_rows + kMinRowsPerBlock - 1) / kMinRowsPerBlock;
    const int64_t most = (int64_t)sm_count() * kMaxBlocksPerSm;
    return wanted < 1 ? 1 : wanted < most ? wanted : most;
}

// ---- AdamW and the gradient norm -------------------------------------------------------------------

struct AdamwArgs {
    float *master, *m, *v;
    __nv_bfloat16 *weight_bf16;  // NULL: no copy
    const float *grad;
    const float *grad_scale_device;
    int64_t n_values;
    float grad_scale, beta1, beta2, eps, lr, decay, m_correction, v_correction;
};

// optim_adamw's update of one weight, with the gradient already scaled.
__device__ __forceinline__ void adamw_update(const AdamwArgs &a, float g, float &w, float &m, float &v)
{
    m = a.beta1 * m + (1.0f - a.beta1) * g;
    v = a.beta2 * v + (1.0f - a.beta2) * g * g;
    const float m_hat = m * a.m_correction, v_hat = v * a.v_correction;
    w = w * a.decay - a.lr * m_hat / (sqrtf(v_hat) + a.eps);
}

// VECTOR: every array 16-byte aligned (8-byte for the bf16 copy); groups of 4 weights per thread, the
// last n_values % 4 taken one by one.
template <bool VECTOR>
__global__ void __launch_bounds__(kBlockThreads) adamw_kernel(const AdamwArgs a)
{
    const float scale = a.grad_scale * (a.grad_scale_device ? *a.grad_scale_device : 1.0f);
    if (!isfinite(scale)) return;
    const int64_t thread = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t scalar_begin = 0;
    if constexpr (VECTOR) {
        const int64_t n_groups = a.n_values / 4;
        for (int64_t k = thread; k < n_groups; k += stride) {
            float4 w = reinterpret_cast<const float4 *>(a.master)[k];
            float4 m = reinterpret_cast<const float4 *>(a.m)[k];
            float4 v = reinterpret_cast<const float4 *>(a.v)[k];
            const float4 g = __ldcs(reinterpret_cast<const float4 *>(a.grad) + k);
            adamw_update(a, g.x * scale, w.x, m.x, v.x);
            adamw_update(a, g.y * scale, w.y, m.y, v.y);
            adamw_update(a, g.z * scale, w.z, m.z, v.z);
            adamw_update(a, g.w * scale, w.w, m.w, v.w);
            reinterpret_cast<float4 *>(a.master)[k] = w;
            reinterpret_cast<float4 *>(a.m)[k] = m;
            reinterpret_cast<float4 *>(a.v)[k] = v;
            if (a.weight_bf16) {
                __nv_bfloat162 low = __floats2bfloat162_rn(w.x, w.y), high = __floats2bfloat162_rn(w.z, w.w);
                reinterpret_cast<uint2 *>(a.weight_bf16)[k] =
                    make_uint2(*reinterpret_cast<uint32_t *>(&low), *reinterpret_cast<uint32_t *>(&high));
            }
        }
        scalar_begin = n_groups * 4;
    }
    for (int64_t i = scalar_begin + thread; i < a.n_values; i += stride) {
        float w = a.master[i], m = a.m[i], v = a.v[i];
        adamw_update(a, a.grad[i] * scale, w, m, v);
        a.master[i] = w;
        a.m[i] = m;
        a.v[i] = v;
        if (a.weight_bf16) a.weight_bf16[i] = __float2bfloat16_rn(w);
    }
}

// A fixed grid, so the partials and their order do not depend on the GPU.
constexpr int kSumsqBlocks = 1024;

__global__ void __launch_bounds__(kBlockThreads) sumsq_partial_kernel(const float *values, int64_t n_values,
                                                                      bool vector, double *partial)
{
    const int64_t thread = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    double sum = 0.0;
    int64_t scalar_begin = 0;
    if (vector) {
        const int64_t n_groups = n_values / 4;
        for (int64_t k = thread; k < n_groups; k += stride) {
            const float4 g = __ldg(reinterpret_cast<const float4 *>(values) + k);
            sum += (double)g.x * g.x + (double)g.y * g.y + (double)g.z * g.z + (double)g.w * g.w;
        }
        scalar_begin = n_groups * 4;
    }
    for (int64_t i = scalar_begin + thread; i < n_values; i += stride) sum += (double)values[i] * values[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kBlockThreads) sumsq_final_kernel(const double *partial, double *sumsq)
{
    double sum = 0.0;
    for (int k = threadIdx.x; k < kSumsqBlocks; k += kBlockThreads) sum += partial[k];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *sumsq = sum;
}

__global__ void clip_scale_kernel(const double *sumsq, double base_scale, double max_norm, float *grad_scale,
                                  double *grad_norm)
{
    const double norm = base_scale * sqrt(*sumsq);
    double scale = base_scale;
    if (!isfinite(norm)) scale = NAN;
    else if (max_norm > 0.0 && norm > max_norm) scale = base_scale * (max_norm / (norm + 1e-6));
    *grad_scale = (float)scale;
    if (grad_norm) *grad_norm = norm;
}

bool aligned(const void *pointer, uintptr_t bytes)
{
    return (reinterpret_cast<uintptr_t>(pointer) % bytes) == 0;
}

// Grid of an element-wise pass over n values: enough blocks to fill the device a few times, no more.
unsigned elementwise_blocks(int64_t n_values)
{
    return gpu_grid_blocks(n_values, kBlockThreads, (int64_t)sm_count() * kMaxBlocksPerSm * 4);
}

// ---- rectified flow --------------------------------------------------------------------------------
// Grid (blocks per sample, n_samples): the blocks of sample b stride through its elements together.

int blocks_per_sample(int n_samples)
{
    const int wanted = (2048 + n_samples - 1) / n_samples;
    return wanted < 1 ? 1 : wanted > 256 ? 256 : wanted;
}

void check_samples(const char *op, int n_samples)
{
    ALDIT_CHECK(n_samples >= 0 && n_samples <= 65535, "%s: n_samples %d outside [0, 65535]", op, n_samples);
}

__global__ void __launch_bounds__(kBlockThreads) flow_mix_kernel(const float *x0, const float *noise,
                                                                 const int64_t *sample_start, const float *sigma,
                                                                 __nv_bfloat16 *x_t)
{
    const int sample = blockIdx.y;
    const int64_t end = sample_start[sample + 1];
    const float s = sigma[sample];
    for (int64_t i = sample_start[sample] + (int64_t)blockIdx.x * kBlockThreads + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * kBlockThreads)
        x_t[i] = __float2bfloat16_rn((1.0f - s) * __ldcs(x0 + i) + s * __ldcs(noise + i));
}

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
template <typename T> __device__ __forceinline__ T from_float(float value);
template <> __device__ __forceinline__ float from_float<float>(float value) { return value; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }

// partial[sample][blockIdx.x]: this block's sum of squared errors over its share of the sample.
template <typename Pred>
__global__ void __launch_bounds__(kBlockThreads) flow_loss_kernel(const Pred *pred, const float *x0, const float *noise,
                                                                  const int64_t *sample_start,
                                                                  const int64_t *whole_start, float grad_scale,
                                                                  Pred *d_pred, float *partial)
{
    const int sample = blockIdx.y;
    const int64_t begin = sample_start[sample], end = sample_start[sample + 1];
    const int64_t n = whole_start ? whole_start[sample + 1] - whole_start[sample] : end - begin;
    const float coef = end > begin ? grad_scale * 2.0f / (float)n : 0.0f;
    float sum = 0.0f;
    for (int64_t i = begin + (int64_t)blockIdx.x * kBlockThreads + threadIdx.x; i < end;
         i += (int64_t)gridDim.x * kBlockThreads) {
        const float diff = to_float(pred[i]) - (__ldcs(noise + i) - __ldcs(x0 + i));
        sum += diff * diff;
        if (d_pred) d_pred[i] = from_float<Pred>(coef * diff);
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[(int64_t)sample * gridDim.x + blockIdx.x] = sum;
}

// One warp per sample adds the sample's block partials in fp64 in a fixed order.
__global__ void flow_loss_final_kernel(const float *partial, int n_partials, const int64_t *sample_start,
                                       const int64_t *whole_start, float *sample_loss)
{
    const int sample = blockIdx.x;
    double sum = 0.0;
    for (int k = threadIdx.x; k < n_partials; k += 32) sum += partial[(int64_t)sample * n_partials + k];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    if (threadIdx.x == 0) {
        const int64_t n = sample_start[sample + 1] - sample_start[sample];
        const int64_t whole = whole_start ? whole_start[sample + 1] - whole_start[sample] : n;
        sample_loss[sample] = n > 0 ? (float)(sum / (double)whole) : 0.0f;
    }
}

template <typename Pred>
void flow_loss(const Pred *pred, const float *x0, const float *noise, const int64_t *sample_start,
               const int64_t *whole_start, int n_samples, float grad_scale, float *sample_loss, Pred *d_pred,
               void *workspace, cudaStream_t stream)
{
    check_samples("fused_flow_loss", n_samples);
    if (n_samples == 0) return;
    const int per_sample = blocks_per_sample(n_samples);
    float *partial = static_cast<float *>(workspace);
    flow_loss_kernel<Pred><<<dim3(per_sample, n_samples), kBlockThreads, 0, stream>>>(
        pred, x0, noise, sample_start, whole_start, grad_scale, d_pred, partial);
    CUDA_CHECK_LAUNCH();
    flow_loss_final_kernel<<<n_samples, 32, 0, stream>>>(partial, per_sample, sample_start, whole_start, sample_loss);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

// ---- wrappers --------------------------------------------------------------------------------------

namespace {

// Wan's RoPE split of a head (rope_angles) and theta 10000; positions one per row.
void wan_rope(QkArgs &a, int head_dim)
{
    const int n_pairs = head_dim / 2;
    a.position_div = 1;
    a.rope_first = n_pairs - 2 * (n_pairs / 3);
    a.rope_second = n_pairs / 3;
    a.neg_log2_theta = kNegLog2Theta;
}

// HunyuanVideo-1.5's: every row one head (position_div heads per token), the given axes and theta.
void axes_rope(QkArgs &a, int num_heads, int head_dim, const int axis_pairs[3], double theta)
{
    ALDIT_CHECK(axis_pairs[0] >= 0 && axis_pairs[1] >= 0 && axis_pairs[2] >= 0 &&
                axis_pairs[0] + axis_pairs[1] + axis_pairs[2] == head_dim / 2 && theta > 1.0,
                "fused_head_norm_rope: axes of %d, %d, %d pairs and theta %g do not fit head_dim %d", axis_pairs[0],
                axis_pairs[1], axis_pairs[2], theta, head_dim);
    a.position_div = num_heads;
    a.rope_first = axis_pairs[0];
    a.rope_second = axis_pairs[1];
    a.neg_log2_theta = (float)-log2(theta);
}

void qk_fwd_launch(const QkArgs &a)
{
    with_row_shape(a.dim, [&](auto tpr, auto vpt) {
        constexpr int kTpr = decltype(tpr)::value, kRows = kBlockThreads / kTpr;
        const auto kernel = qk_norm_rope_fwd_kernel<kTpr, decltype(vpt)::value>;
        static Residency residency;
        const int64_t groups = (a.n_rows + kRows - 1) / kRows;
        const int64_t most = resident_blocks(residency, reinterpret_cast<const void *>(kernel), 0);
        const unsigned blocks = (unsigned)(groups < most ? groups : most);
        kernel<<<blocks, dim3(kTpr, kRows), 0, a.stream_>>>(a);
    });
    CUDA_CHECK_LAUNCH();
}

void qk_bwd_launch(QkArgs &a, float *dweight)
{
    int n_blocks = (int)qk_bwd_block_bound(a.n_rows);  // the workspace holds this many partials
    with_row_shape(a.dim, [&](auto tpr, auto vpt) {
        constexpr int kTpr = decltype(tpr)::value, kRows = kBlockThreads / kTpr;
        const auto kernel = qk_norm_rope_bwd_kernel<kTpr, decltype(vpt)::value>;
        static Residency residency;
        // the row groups' sums (kRows * dim floats, at most 8192) and the weight (dim bf16): up to 48 KiB, past
        // the default limit of dynamic shared memory (48 KiB less the static) near FUSED_QK_MAX_DIM
        const size_t shared_bytes = (size_t)kRows * a.dim * sizeof(float) + (size_t)a.dim * sizeof(gpu_bf16);
        if (shared_bytes > kDefaultDynamicShared)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
        const int64_t resident = resident_blocks(residency, reinterpret_cast<const void *>(kernel), shared_bytes);
        if (resident < n_blocks) n_blocks = (int)resident;
        kernel<<<n_blocks, dim3(kTpr, kRows), shared_bytes, a.stream_>>>(a);
    });
    CUDA_CHECK_LAUNCH();
    column_partials_kernel<<<(a.dim + kPartialColumns - 1) / kPartialColumns, kPartialThreads, 0, a.stream_>>>(
        a.partial, n_blocks, a.dim, dweight, 1);
    CUDA_CHECK_LAUNCH();
}

QkArgs qk_fwd_args(const gpu_bf16 *x, int64_t n_rows, int dim, int head_dim, const gpu_bf16 *weight, float eps,
                   const int32_t *positions, gpu_bf16 *y, float *rstd, cudaStream_t stream)
{
    QkArgs a = {};
    a.x = reinterpret_cast<const uint4 *>(x);
    a.weight = weight;
    a.positions = positions;
    a.n_rows = n_rows;
    a.dim = dim;
    a.head_dim = head_dim;
    a.eps = eps;
    a.out = reinterpret_cast<uint4 *>(y);
    a.rstd_out = rstd;
    a.stream_ = stream;
    return a;
}

QkArgs qk_bwd_args(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows, int dim, int head_dim, const gpu_bf16 *weight,
                   const int32_t *positions, const float *rstd, gpu_bf16 *dx, void *workspace, cudaStream_t stream)
{
    QkArgs a = {};
    a.x = reinterpret_cast<const uint4 *>(x);
    a.dy = reinterpret_cast<const uint4 *>(dy);
    a.weight = weight;
    a.positions = positions;
    a.rstd_in = rstd;
    a.n_rows = n_rows;
    a.dim = dim;
    a.head_dim = head_dim;
    a.out = reinterpret_cast<uint4 *>(dx);
    a.partial = static_cast<float *>(workspace);
    a.stream_ = stream;
    return a;
}

}  // namespace

extern "C" void fused_qk_norm_rope_fwd(const gpu_bf16 *x, int64_t n_rows, int num_heads, int head_dim,
                                       const gpu_bf16 *weight, float eps, const int32_t *positions, gpu_bf16 *y,
                                       float *rstd, cudaStream_t stream)
{
    const char *op = "fused_qk_norm_rope_fwd";
    check_qk_shape(op, n_rows, num_heads, head_dim);
    if (n_rows == 0) return;
    check_rows_aligned(op, "x", x);
    check_rows_aligned(op, "y", y);
    QkArgs a = qk_fwd_args(x, n_rows, num_heads * head_dim, head_dim, weight, eps, positions, y, rstd, stream);
    wan_rope(a, head_dim);
    qk_fwd_launch(a);
}

extern "C" size_t fused_qk_norm_rope_bwd_workspace_bytes(int64_t n_rows, int dim)
{
    return (size_t)qk_bwd_block_bound(n_rows) * (size_t)(dim > 0 ? dim : 0) * sizeof(float);
}

extern "C" void fused_qk_norm_rope_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_rows, int num_heads,
                                       int head_dim, const gpu_bf16 *weight, const int32_t *positions,
                                       const float *rstd, gpu_bf16 *dx, float *dweight, void *workspace,
                                       cudaStream_t stream)
{
    const char *op = "fused_qk_norm_rope_bwd";
    check_qk_shape(op, n_rows, num_heads, head_dim);
    if (n_rows == 0) return;
    check_rows_aligned(op, "x", x);
    check_rows_aligned(op, "dy", dy);
    check_rows_aligned(op, "dx", dx);
    QkArgs a = qk_bwd_args(x, dy, n_rows, num_heads * head_dim, head_dim, weight, positions, rstd, dx, workspace, stream);
    wan_rope(a, head_dim);
    qk_bwd_launch(a, dweight);
}

extern "C" void fused_head_norm_rope_fwd(const gpu_bf16 *x, int64_t n_tokens, int num_heads, int head_dim,
                                         const gpu_bf16 *weight, float eps, const int32_t *positions,
                                         const int axis_pairs[3], double theta, gpu_bf16 *y, float *rstd,
                                         cudaStream_t stream)
{
    const char *op = "fused_head_norm_rope_fwd";
    check_qk_shape(op, n_tokens, num_heads, head_dim);
    if (n_tokens == 0) return;
    check_rows_aligned(op, "x", x);
    check_rows_aligned(op, "y", y);
    QkArgs a = qk_fwd_args(x, n_tokens * num_heads, head_dim, head_dim, weight, eps, positions, y, rstd, stream);
    if (positions) axes_rope(a, num_heads, head_dim, axis_pairs, theta);
    else a.position_div = 1;
    qk_fwd_launch(a);
}

extern "C" size_t fused_head_norm_rope_bwd_workspace_bytes(int64_t n_tokens, int num_heads, int head_dim)
{
    return fused_qk_norm_rope_bwd_workspace_bytes(n_tokens * num_heads, head_dim);
}

extern "C" void fused_head_norm_rope_bwd(const gpu_bf16 *x, const gpu_bf16 *dy, int64_t n_tokens, int num_heads,
                                         int head_dim, const gpu_bf16 *weight, const int32_t *positions,
                                         const int axis_pairs[3], double theta, const float *rstd, gpu_bf16 *dx,
                                         float *dweight, void *workspace, cudaStream_t stream)
{
    const char *op = "fused_head_norm_rope_bwd";
    check_qk_shape(op, n_tokens, num_heads, head_dim);
    if (n_tokens == 0) return;
    check_rows_aligned(op, "x", x);
    check_rows_aligned(op, "dy", dy);
    check_rows_aligned(op, "dx", dx);
    QkArgs a = qk_bwd_args(x, dy, n_tokens * num_heads, head_dim, head_dim, weight, positions, rstd, dx, workspace,
                           stream);
    if (positions) axes_rope(a, num_heads, head_dim, axis_pairs, theta);
    else a.position_div = 1;
    qk_bwd_launch(a, dweight);
}

extern "C" size_t fused_sumsq_workspace_bytes(void)
{
    return kSumsqBlocks * sizeof(double);
}

extern "C" void fused_sumsq(const float *values, int64_t n_values, double *sumsq, void *workspace, cudaStream_t stream)
{
    ALDIT_CHECK(n_values >= 0, "fused_sumsq: n_values %lld is negative", (long long)n_values);
    double *partial = static_cast<double *>(workspace);
    sumsq_partial_kernel<<<kSumsqBlocks, kBlockThreads, 0, stream>>>(values, n_values, aligned(values, 16), partial);
    CUDA_CHECK_LAUNCH();
    sumsq_final_kernel<<<1, kBlockThreads, 0, stream>>>(partial, sumsq);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fused_clip_scale(const double *sumsq, double base_scale, double max_norm, float *grad_scale,
                                 double *grad_norm, cudaStream_t stream)
{
    clip_scale_kernel<<<1, 1, 0, stream>>>(sumsq, base_scale, max_norm, grad_scale, grad_norm);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fused_adamw(const adamw_step *hyper, double weight_decay, float *master, gpu_bf16 *weight_bf16,
                            const float *grad, float *m, float *v, int64_t n_values, float grad_scale,
                            const float *grad_scale_device, cudaStream_t stream)
{
    ALDIT_CHECK(n_values >= 0, "fused_adamw: n_values %lld is negative", (long long)n_values);
    ALDIT_CHECK(hyper->step >= 1, "fused_adamw: step %lld must be 1 or more", (long long)hyper->step);
    if (n_values == 0) return;
    AdamwArgs a = {};
    a.master = master;
    a.m = m;
    a.v = v;
    a.weight_bf16 = reinterpret_cast<__nv_bfloat16 *>(weight_bf16);
    a.grad = grad;
    a.grad_scale_device = grad_scale_device;
    a.n_values = n_values;
    a.grad_scale = grad_scale;
    // The constants exactly as optim_adamw computes them.
    a.beta1 = (float)hyper->beta1;
    a.beta2 = (float)hyper->beta2;
    a.eps = (float)hyper->eps;
    a.lr = (float)hyper->lr;
    a.decay = (float)(1.0 - hyper->lr * weight_decay);
    a.m_correction = (float)(1.0 / (1.0 - pow(hyper->beta1, (double)hyper->step)));
    a.v_correction = (float)(1.0 / (1.0 - pow(hyper->beta2, (double)hyper->step)));
    const bool vector = aligned(master, 16) && aligned(m, 16) && aligned(v, 16) && aligned(grad, 16) &&
                        aligned(weight_bf16, 8);
    const unsigned blocks = elementwise_blocks(vector ? (n_values + 3) / 4 : n_values);
    if (vector) adamw_kernel<true><<<blocks, kBlockThreads, 0, stream>>>(a);
    else adamw_kernel<false><<<blocks, kBlockThreads, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

extern "C" void fused_flow_mix(const float *x0, const float *noise, const int64_t *sample_start, int n_samples,
                               const float *sigma, gpu_bf16 *x_t, cudaStream_t stream)
{
    check_samples("fused_flow_mix", n_samples);
    if (n_samples == 0) return;
    flow_mix_kernel<<<dim3(blocks_per_sample(n_samples), n_samples), kBlockThreads, 0, stream>>>(
        x0, noise, sample_start, sigma, reinterpret_cast<__nv_bfloat16 *>(x_t));
    CUDA_CHECK_LAUNCH();
}

extern "C" size_t fused_flow_loss_workspace_bytes(int n_samples)
{
    return n_samples > 0 ? (size_t)n_samples * blocks_per_sample(n_samples) * sizeof(float) : 0;
}

extern "C" void fused_flow_loss_bf16(const gpu_bf16 *pred, const float *x0, const float *noise,
                                     const int64_t *sample_start, int n_samples, float grad_scale, float *sample_loss,
                                     gpu_bf16 *d_pred, void *workspace, cudaStream_t stream)
{
    flow_loss(reinterpret_cast<const __nv_bfloat16 *>(pred), x0, noise, sample_start, nullptr, n_samples, grad_scale,
              sample_loss, reinterpret_cast<__nv_bfloat16 *>(d_pred), workspace, stream);
}

extern "C" void fused_flow_loss_part_bf16(const gpu_bf16 *pred, const float *x0, const float *noise,
                                          const int64_t *sample_start, const int64_t *whole_start, int n_samples,
                                          float grad_scale, float *sample_loss, gpu_bf16 *d_pred, void *workspace,
                                          cudaStream_t stream)
{
    flow_loss(reinterpret_cast<const __nv_bfloat16 *>(pred), x0, noise, sample_start, whole_start, n_samples,
              grad_scale, sample_loss, reinterpret_cast<__nv_bfloat16 *>(d_pred), workspace, stream);
}

extern "C" void fused_flow_loss_f32(const float *pred, const float *x0, const float *noise, const int64_t *sample_start,
                                    int n_samples, float grad_scale, float *sample_loss, float *d_pred, void *workspace,
                                    cudaStream_t stream)
{
    flow_loss(pred, x0, noise, sample_start, nullptr, n_samples, grad_scale, sample_loss, d_pred, workspace, stream);
}
