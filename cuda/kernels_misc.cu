// kernels_misc.cu — the small CUDA kernels of the GPU model: casts, patchify + flow mixing, the fp32 time path, modulation tables and their gradients, the weights' EMA.
//
// None of these is on the hot path of a block (they touch per-sample vectors, the 64 values of a token's
// patch, or are element-wise passes the big fused ops could not absorb), so they favour plain, exact code:
// fp32 math, sums over samples and rows in a fixed order, no atomics.
#include "cuda/kernels_misc.h"

#include <cuda_bf16.h>
#include <math.h>

namespace {

constexpr int kThreads = 256;

unsigned int blocks_for(int64_t n)
{
    return gpu_grid_blocks(n, kThreads, 1048576);
}

__device__ __forceinline__ float to_float(gpu_bf16 bits) { return __uint_as_float((uint32_t)bits << 16); }

__device__ __forceinline__ gpu_bf16 to_bf16(float value)
{
    const __nv_bfloat16 rounded = __float2bfloat16_rn(value);
    return *reinterpret_cast<const gpu_bf16 *>(&rounded);
}

// Grid-stride loops: every kernel below covers n with whatever grid blocks_for gives.
#define FOR_EACH_INDEX(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__global__ void f32_to_bf16_kernel(const float *src, int64_t n, gpu_bf16 *dst)
{
    FOR_EACH_INDEX(i, n) dst[i] = to_bf16(src[i]);
}

__global__ void fill_f32_kernel(float *dst, int64_t n, float value)
{
    FOR_EACH_INDEX(i, n) dst[i] = value;
}

__global__ void add_bf16_kernel(const gpu_bf16 *a, const gpu_bf16 *b, int64_t n, gpu_bf16 *out)
{
    FOR_EACH_INDEX(i, n) out[i] = to_bf16(to_float(a[i]) + to_float(b[i]));
}

__global__ void accumulate_bf16_kernel(const gpu_bf16 *src, int64_t n, float *dst)
{
    FOR_EACH_INDEX(i, n) dst[i] += to_float(src[i]);
}

__global__ void accumulate_f32_kernel(const float *src, int64_t n, float *dst)
{
    FOR_EACH_INDEX(i, n) dst[i] += src[i];
}

// Rounded as optim_ema on the host: two products and a sum in double, each rounded (no fma), then to fp32.
__global__ void ema_update_kernel(float *ema, const float *weights, int64_t n, double keep, double take, const float *gate)
{
    if (gate && !isfinite(*gate)) return;
    FOR_EACH_INDEX(i, n)
    ema[i] = __double2float_rn(__dadd_rn(__dmul_rn(keep, (double)ema[i]), __dmul_rn(take, (double)weights[i])));
}

__global__ void silu_fwd_kernel(const float *x, int64_t n, float *y)
{
    FOR_EACH_INDEX(i, n) y[i] = x[i] / (1.0f + expf(-x[i]));
}

__global__ void silu_bwd_kernel(const float *x, const float *dy, int64_t n, float *dx)
{
    FOR_EACH_INDEX(i, n)
    {
        const float s = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

// The sample that owns `index` in the n_samples + 1 non-decreasing offsets `start` (the last b with
// start[b] <= index; empty samples are skipped over).
__device__ __forceinline__ int owner_of(const int64_t *start, int n_samples, int64_t index)
{
    int low = 0, high = n_samples - 1;
    while (low < high) {
        const int mid = (low + high + 1) / 2;
        if (start[mid] <= index) low = mid;
        else high = mid - 1;
    }
    return low;
}

// One thread per latent value (reads coalesced, writes scattered into the token rows).
__global__ void patchify_flow_kernel(const float *latents, const float *noise, int n_samples,
                                     const int64_t *latent_start, const int64_t *token_start,
                                     const int32_t *latent_shape, const float *sigma, int64_t n_values, int channels,
                                     int patch_t, int patch_h, int patch_w, const int64_t *token_first,
                                     gpu_bf16 *x_t_tokens, float *x0_tokens, float *noise_tokens)
{
    const int patch_volume = patch_t * patch_h * patch_w;
    const int64_t token_values = (int64_t)channels * patch_volume;
    FOR_EACH_INDEX(i, n_values)
    {
        const int b = owner_of(latent_start, n_samples, i);
        const int frames = latent_shape[3 * b], height = latent_shape[3 * b + 1], width = latent_shape[3 * b + 2];
        int64_t local = i - latent_start[b];
        const int x = (int)(local % width);
        local /= width;
        const int y = (int)(local % height);
        local /= height;
        const int f = (int)(local % frames);
        const int c = (int)(local / frames);
        const int grid_h = height / patch_h, grid_w = width / patch_w;
        int64_t token = ((int64_t)(f / patch_t) * grid_h + y / patch_h) * grid_w + x / patch_w;
        if (token_first) {  // a slice of the sample's tokens: [token_first[b], + its rows)
            token -= token_first[b];
            if (token < 0 || token >= token_start[b + 1] - token_start[b]) continue;
        }
        token += token_start[b];
        const int offset = ((f % patch_t) * patch_h + y % patch_h) * patch_w + x % patch_w;
        const float x0 = latents[i], eps = noise[i], s = sigma[b];
        x_t_tokens[token * token_values + (int64_t)c * patch_volume + offset] = to_bf16((1.0f - s) * x0 + s * eps);
        const int64_t channel_last = token * token_values + (int64_t)offset * channels + c;
        x0_tokens[channel_last] = x0;
        noise_tokens[channel_last] = eps;
    }
}

// y[r, o]: one warp per output column o, all rows; lanes stride over in_dim, then a butterfly.
__global__ void linear_f32_fwd_kernel(const float *x, int n_rows, int in_dim, int out_dim, const float *weight,
                                      const float *bias, float *y)
{
    const int o = (int)((blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (o >= out_dim) return;
    const float *w = weight + (int64_t)o * in_dim;
    for (int r = 0; r < n_rows; ++r) {
        const float *row = x + (int64_t)r * in_dim;
        float sum = 0.0f;
        for (int i = lane; i < in_dim; i += 32) sum += row[i] * w[i];
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        if (lane == 0) y[(int64_t)r * out_dim + o] = sum + (bias ? bias[o] : 0.0f);
    }
}

// dx[r, i] = sum_o dy[r, o] W[o, i]: a block of 32 x 8 threads takes 32 columns i of row r; its 8 thread
// rows take every 8th o, and the 8 partial sums are added in shared memory in a fixed order.
constexpr int kDxSplit = 8;
__global__ void linear_f32_dx_kernel(const float *dy, int in_dim, int out_dim, const float *weight, float *dx)
{
    __shared__ float partial[kDxSplit][32];
    const int i = blockIdx.x * 32 + threadIdx.x, r = blockIdx.y;
    float sum = 0.0f;
    if (i < in_dim)
        for (int o = threadIdx.y; o < out_dim; o += kDxSplit)
            sum += dy[(int64_t)r * out_dim + o] * weight[(int64_t)o * in_dim + i];
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && i < in_dim) {
        float total = 0.0f;
        for (int k = 0; k < kDxSplit; ++k) total += partial[k][threadIdx.x];
        dx[(int64_t)r * in_dim + i] = total;
    }
}

// dweight[o, i] += sum_r dy[r, o] x[r, i] (one thread per weight), dbias[o] += sum_r dy[r, o] (i == 0).
__global__ void linear_f32_dw_kernel(const float *x, const float *dy, int n_rows, int in_dim, int out_dim,
                                     float *dweight, float *dbias)
{
    FOR_EACH_INDEX(index, (int64_t)in_dim * out_dim)
    {
        const int64_t o = index / in_dim, i = index % in_dim;
        float sum = 0.0f, bias_sum = 0.0f;
        for (int r = 0; r < n_rows; ++r) {
            const float g = dy[(int64_t)r * out_dim + o];
            sum += g * x[(int64_t)r * in_dim + i];
            bias_sum += g;
        }
        dweight[index] += sum;
        if (dbias && i == 0) dbias[o] += bias_sum;
    }
}

__global__ void block_modulation_kernel(const float *param, const float *e0, int n_samples, int dim,
                                        float *modulation)
{
    FOR_EACH_INDEX(index, (int64_t)6 * n_samples * dim)
    {
        const int c = (int)(index % dim);
        const int64_t chunk_sample = index / dim;
        const int b = (int)(chunk_sample % n_samples), chunk = (int)(chunk_sample / n_samples);
        modulation[index] = param[chunk * dim + c] + e0[(int64_t)b * 6 * dim + chunk * dim + c];
    }
}

__global__ void block_modulation_bwd_kernel(const float *d_modulation, int n_samples, int dim, float *d_param,
                                            float *d_e0)
{
    FOR_EACH_INDEX(index, (int64_t)6 * dim)
    {
        const int chunk = (int)(index / dim), c = (int)(index % dim);
        float sum = 0.0f;
        for (int b = 0; b < n_samples; ++b) {
            const float g = d_modulation[((int64_t)chunk * n_samples + b) * dim + c];
            sum += g;
            d_e0[(int64_t)b * 6 * dim + index] += g;
        }
        d_param[index] += sum;
    }
}

__global__ void head_modulation_kernel(const float *param, const float *e, int n_samples, int dim, float *shift,
                                       float *scale)
{
    FOR_EACH_INDEX(index, (int64_t)n_samples * dim)
    {
        const int c = (int)(index % dim);
        shift[index] = param[c] + e[index];
        scale[index] = param[dim + c] + e[index];
    }
}

__global__ void head_modulation_bwd_kernel(const float *dshift, const float *dscale, int n_samples, int dim,
                                           float *d_param, float *d_e)
{
    FOR_EACH_INDEX(c, (int64_t)dim)
    {
        float sum_shift = 0.0f, sum_scale = 0.0f;
        for (int b = 0; b < n_samples; ++b) {
            const int64_t index = (int64_t)b * dim + c;
            sum_shift += dshift[index];
            sum_scale += dscale[index];
            d_e[index] = dshift[index] + dscale[index];
        }
        d_param[c] += sum_shift;
        d_param[dim + c] += sum_scale;
    }
}

__global__ void affine_as_modulation_kernel(const float *weight, const float *bias, int n_samples, int dim,
                                            float *shift, float *scale)
{
    FOR_EACH_INDEX(index, (int64_t)n_samples * dim)
    {
        const int c = (int)(index % dim);
        shift[index] = bias[c];
        scale[index] = weight[c] - 1.0f;
    }
}

__global__ void sum_samples_into_kernel(const float *src, int n_samples, int dim, float *dst)
{
    FOR_EACH_INDEX(c, (int64_t)dim)
    {
        float sum = 0.0f;
        for (int b = 0; b < n_samples; ++b) sum += src[(int64_t)b * dim + c];
        dst[c] += sum;
    }
}

} // namespace

void misc_f32_to_bf16(const float *src, int64_t n, gpu_bf16 *dst, cudaStream_t stream)
{
    if (n <= 0) return;
    f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
    CUDA_CHECK_LAUNCH();
}

void misc_fill_f32(float *dst, int64_t n, float value, cudaStream_t stream)
{
    if (n <= 0) return;
    fill_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, n, value);
    CUDA_CHECK_LAUNCH();
}

void misc_ema_update(float *ema, const float *weights, int64_t n, double decay, const float *gate,
                     cudaStream_t stream)
{
    if (n <= 0) return;
    ema_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ema, weights, n, decay, 1.0 - decay, gate);
    CUDA_CHECK_LAUNCH();
}

void misc_add_bf16(const gpu_bf16 *a, const gpu_bf16 *b, int64_t n, gpu_bf16 *out, cudaStream_t stream)
{
    if (n <= 0) return;
    add_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, out);
    CUDA_CHECK_LAUNCH();
}

void misc_accumulate_bf16(const gpu_bf16 *src, int64_t n, float *dst, cudaStream_t stream)
{
    if (n <= 0) return;
    accumulate_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
    CUDA_CHECK_LAUNCH();
}

void misc_accumulate_f32(const float *src, int64_t n, float *dst, cudaStream_t stream)
{
    if (n <= 0) return;
    accumulate_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, n, dst);
    CUDA_CHECK_LAUNCH();
}

void misc_silu_f32_fwd(const float *x, int64_t n, float *y, cudaStream_t stream)
{
    if (n <= 0) return;
    silu_fwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
    CUDA_CHECK_LAUNCH();
}

void misc_silu_f32_bwd(const float *x, const float *dy, int64_t n, float *dx, cudaStream_t stream)
{
    if (n <= 0) return;
    silu_bwd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, dy, n, dx);
    CUDA_CHECK_LAUNCH();
}

void misc_patchify_flow(const float *latents, const float *noise, int n_samples, const int64_t *latent_start,
                        const int64_t *token_start, const int32_t *latent_shape, const float *sigma,
                        int64_t n_latent_values, int channels, int patch_t, int patch_h, int patch_w,
                        gpu_bf16 *x_t_tokens, float *x0_tokens, float *noise_tokens, cudaStream_t stream)
{
    if (n_latent_values <= 0 || n_samples <= 0) return;
    patchify_flow_kernel<<<blocks_for(n_latent_values), kThreads, 0, stream>>>(
        latents, noise, n_samples, latent_start, token_start, latent_shape, sigma, n_latent_values, channels, patch_t,
        patch_h, patch_w, nullptr, x_t_tokens, x0_tokens, noise_tokens);
    CUDA_CHECK_LAUNCH();
}

void misc_patchify_flow_rows(const float *latents, const float *noise, int n_samples, const int64_t *latent_start,
                             const int64_t *token_start, const int64_t *token_first, const int32_t *latent_shape,
                             const float *sigma, int64_t n_latent_values, int channels, int patch_t, int patch_h,
                             int patch_w, gpu_bf16 *x_t_tokens, float *x0_tokens, float *noise_tokens,
                             cudaStream_t stream)
{
    if (n_latent_values <= 0 || n_samples <= 0) return;
    patchify_flow_kernel<<<blocks_for(n_latent_values), kThreads, 0, stream>>>(
        latents, noise, n_samples, latent_start, token_start, latent_shape, sigma, n_latent_values, channels, patch_t,
        patch_h, patch_w, token_first, x_t_tokens, x0_tokens, noise_tokens);
    CUDA_CHECK_LAUNCH();
}

namespace {

// 16-byte pieces of bf16 rows: columns come in blocks of 8 values.
constexpr int kPieceValues = 8;

// dst [parts][n_rows][dim / parts] <- src [n_rows][dim], or back (join).
__global__ void split_columns_kernel(const uint4 *src, int64_t n_rows, int dim, int parts, uint4 *dst, int join)
{
    const int piece_cols = dim / kPieceValues, part_cols = piece_cols / parts;
    FOR_EACH_INDEX(i, n_rows * piece_cols)
    {
        const int64_t row = i / piece_cols;
        const int col = (int)(i % piece_cols), part = col / part_cols;
        const int64_t packed = ((int64_t)part * n_rows + row) * part_cols + col % part_cols;
        if (join) dst[i] = src[packed];
        else dst[packed] = src[i];
    }
}

} // namespace

void misc_split_columns_bf16(const gpu_bf16 *src, int64_t n_rows, int dim, int parts, gpu_bf16 *dst,
                             cudaStream_t stream)
{
    if (n_rows <= 0) return;
    split_columns_kernel<<<blocks_for(n_rows * (dim / kPieceValues)), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4 *>(src), n_rows, dim, parts, reinterpret_cast<uint4 *>(dst), 0);
    CUDA_CHECK_LAUNCH();
}

void misc_join_columns_bf16(const gpu_bf16 *src, int64_t n_rows, int dim, int parts, gpu_bf16 *dst,
                            cudaStream_t stream)
{
    if (n_rows <= 0) return;
    split_columns_kernel<<<blocks_for(n_rows * (dim / kPieceValues)), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4 *>(src), n_rows, dim, parts, reinterpret_cast<uint4 *>(dst), 1);
    CUDA_CHECK_LAUNCH();
}

void misc_linear_f32_fwd(const float *x, int n_rows, int in_dim, int out_dim, const float *weight,
                         const float *bias, float *y, cudaStream_t stream)
{
    if (n_rows <= 0 || out_dim <= 0) return;
    linear_f32_fwd_kernel<<<blocks_for((int64_t)out_dim * 32), kThreads, 0, stream>>>(x, n_rows, in_dim, out_dim,
                                                                                        weight, bias, y);
    CUDA_CHECK_LAUNCH();
}

void misc_linear_f32_bwd(const float *x, const float *dy, int n_rows, int in_dim, int out_dim, const float *weight,
                         float *dx, float *dweight, float *dbias, cudaStream_t stream)
{
    if (n_rows <= 0) return;
    if (dx) {
        const dim3 grid((unsigned int)((in_dim + 31) / 32), (unsigned int)n_rows), block(32, kDxSplit);
        linear_f32_dx_kernel<<<grid, block, 0, stream>>>(dy, in_dim, out_dim, weight, dx);
        CUDA_CHECK_LAUNCH();
    }
    linear_f32_dw_kernel<<<blocks_for((int64_t)in_dim * out_dim), kThreads, 0, stream>>>(x, dy, n_rows, in_dim,
                                                                                           out_dim, dweight, dbias);
    CUDA_CHECK_LAUNCH();
}

void misc_block_modulation(const float *param, const float *e0, int n_samples, int dim, float *modulation,
                           cudaStream_t stream)
{
    block_modulation_kernel<<<blocks_for((int64_t)6 * n_samples * dim), kThreads, 0, stream>>>(param, e0, n_samples,
                                                                                                 dim, modulation);
    CUDA_CHECK_LAUNCH();
}

void misc_block_modulation_bwd(const float *d_modulation, int n_samples, int dim, float *d_param, float *d_e0,
                               cudaStream_t stream)
{
    block_modulation_bwd_kernel<<<blocks_for((int64_t)6 * dim), kThreads, 0, stream>>>(d_modulation, n_samples, dim,
                                                                                         d_param, d_e0);
    CUDA_CHECK_LAUNCH();
}

void misc_head_modulation(const float *param, const float *e, int n_samples, int dim, float *shift, float *scale,
                          cudaStream_t stream)
{
    head_modulation_kernel<<<blocks_for((int64_t)n_samples * dim), kThreads, 0, stream>>>(param, e, n_samples, dim,
                                                                                            shift, scale);
    CUDA_CHECK_LAUNCH();
}

void misc_head_modulation_bwd(const float *dshift, const float *dscale, int n_samples, int dim, float *d_param,
                              float *d_e, cudaStream_t stream)
{
    head_modulation_bwd_kernel<<<blocks_for(dim), kThreads, 0, stream>>>(dshift, dscale, n_samples, dim, d_param,
                                                                          d_e);
    CUDA_CHECK_LAUNCH();
}

void misc_affine_as_modulation(const float *weight, const float *bias, int n_samples, int dim, float *shift,
                               float *scale, cudaStream_t stream)
{
    affine_as_modulation_kernel<<<blocks_for((int64_t)n_samples * dim), kThreads, 0, stream>>>(
        weight, bias, n_samples, dim, shift, scale);
    CUDA_CHECK_LAUNCH();
}

void misc_sum_samples_into(const float *src, int n_samples, int dim, float *dst, cudaStream_t stream)
{
    sum_samples_into_kernel<<<blocks_for(dim), kThreads, 0, stream>>>(src, n_samples, dim, dst);
    CUDA_CHECK_LAUNCH();
}
