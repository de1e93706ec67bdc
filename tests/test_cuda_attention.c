/* test_cuda_attention.c — cmocka tests of the CUDA flash attention (forward and backward) against cpu_attention_fwd/bwd
   on bf16-rounded random inputs over packed variable-length samples, self- and cross-attention, plus a speed line. */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_test_util.h"

#ifdef HAVE_CUDA

#include "cuda/attention.h"
#include "core/check.h"
#include "cuda/gpu.h"
#include "model/ops_cpu.h"
#include "core/rng.h"

static const double kTolerance = 1e-2; /* relative error ||gpu - cpu|| / ||cpu|| of bf16 paths */
/* Where the reference is ~0 (dq of a sample with one key: the softmax gradient cancels exactly) the bound is
   absolute: the GPU's cancellation leaves rounding residue of D = rowsum(dO * O) computed from the bf16 output
   (1.8e-6 seen on an H200). */
static const double kNearZeroBound = 1e-4;

enum { kMaxSamples = 8 };

/* A packed batch: query and key/value rows of each sample (self-attention: the same lengths). */
typedef struct {
    const char *name;
    int n_samples;
    int q_rows[kMaxSamples];
    int kv_rows[kMaxSamples];
} layout;

static uint64_t g_seed = 0xa77e5eed2026ull;

/* Row offsets of a layout's queries and keys. */
static void layout_offsets(const layout *l, int64_t *q_row_start, int64_t *kv_row_start)
{
    q_row_start[0] = kv_row_start[0] = 0;
    for (int b = 0; b < l->n_samples; ++b) {
        q_row_start[b + 1] = q_row_start[b] + l->q_rows[b];
        kv_row_start[b + 1] = kv_row_start[b] + l->kv_rows[b];
    }
}

/* Forward (out, lse) and backward (dq, dk, dv) against the CPU reference on the same bf16 inputs. The
   backward is fed the reference's out (rounded to bf16) and lse, so each direction is checked on its own;
   a second backward must give the same bits. */
static void check_attention(const layout *l, int num_heads, int head_dim)
{
    int64_t q_row_start[kMaxSamples + 1], kv_row_start[kMaxSamples + 1];
    layout_offsets(l, q_row_start, kv_row_start);
    const int n_samples = l->n_samples;
    const int64_t n_q_rows = q_row_start[n_samples], n_kv_rows = kv_row_start[n_samples];
    const size_t width = (size_t)num_heads * head_dim;
    const size_t n_q = (size_t)n_q_rows * width, n_kv = (size_t)n_kv_rows * width;
    const size_t n_lse = (size_t)n_q_rows * num_heads;

    gpu_bf16 *q_bits, *k_bits, *v_bits, *dout_bits;
    float *q = random_normal_bf16(&g_seed, n_q, 0.0, 1.0, &q_bits);
    float *k = random_normal_bf16(&g_seed, n_kv, 0.0, 1.0, &k_bits);
    float *v = random_normal_bf16(&g_seed, n_kv, 0.0, 1.0, &v_bits);
    float *dout = random_normal_bf16(&g_seed, n_q, 0.0, 1.0, &dout_bits);
    float *out_ref = xmalloc((n_q + 1) * sizeof *out_ref), *lse_ref = xmalloc((n_lse + 1) * sizeof *lse_ref);
    cpu_attention_fwd(q, k, v, num_heads, head_dim, q_row_start, kv_row_start, n_samples, out_ref, lse_ref);
    gpu_bf16 *out_bits = xmalloc((n_q + 1) * sizeof *out_bits);
    float *out_rounded = xmalloc((n_q + 1) * sizeof *out_rounded);
    for (size_t i = 0; i < n_q; ++i) {
        out_bits[i] = gpu_bf16_from_float(out_ref[i]);
        out_rounded[i] = gpu_float_from_bf16(out_bits[i]);
    }
    float *dq_ref = xmalloc((n_q + 1) * sizeof *dq_ref), *dk_ref = xmalloc((n_kv + 1) * sizeof *dk_ref);
    float *dv_ref = xmalloc((n_kv + 1) * sizeof *dv_ref);
    cpu_attention_bwd(q, k, v, out_rounded, dout, lse_ref, num_heads, head_dim, q_row_start, kv_row_start, n_samples,
                      dq_ref, dk_ref, dv_ref);

    int64_t *d_q_row_start = device_upload(q_row_start, (n_samples + 1) * sizeof *q_row_start);
    int64_t *d_kv_row_start = device_upload(kv_row_start, (n_samples + 1) * sizeof *kv_row_start);
    gpu_bf16 *d_q = device_upload(q_bits, n_q * sizeof *q_bits), *d_k = device_upload(k_bits, n_kv * sizeof *k_bits);
    gpu_bf16 *d_v = device_upload(v_bits, n_kv * sizeof *v_bits);
    gpu_bf16 *d_dout = device_upload(dout_bits, n_q * sizeof *dout_bits);
    gpu_bf16 *d_out_ref = device_upload(out_bits, n_q * sizeof *out_bits);
    float *d_lse_ref = device_upload(lse_ref, n_lse * sizeof *lse_ref);
    gpu_bf16 *d_out = device_poisoned(n_q * sizeof *d_out);
    float *d_lse = device_poisoned(n_lse * sizeof *d_lse);
    gpu_bf16 *d_dq = device_poisoned(n_q * sizeof *d_dq), *d_dk = device_poisoned(n_kv * sizeof *d_dk);
    gpu_bf16 *d_dv = device_poisoned(n_kv * sizeof *d_dv);
    const size_t workspace_bytes = attention_bwd_workspace_bytes(n_q_rows, num_heads);
    void *d_workspace = device_poisoned(workspace_bytes);

    attention_fwd(d_q, d_k, d_v, num_heads, head_dim, d_q_row_start, d_kv_row_start, n_samples, n_q_rows, n_kv_rows,
                  d_out, d_lse, 0);
    attention_bwd(d_q, d_k, d_v, d_out_ref, d_dout, d_lse_ref, num_heads, head_dim, d_q_row_start, d_kv_row_start,
                  n_samples, n_q_rows, n_kv_rows, d_dq, d_dk, d_dv, d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[200];
    snprintf(case_name, sizeof case_name, "%s, %d heads, head_dim %d", l->name, num_heads, head_dim);
    float *got = download_bf16(d_out, n_q);
    expect_close_or_neg_inf("attention_fwd out", case_name, got, out_ref, n_q, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_lse, n_lse);
    expect_close_or_neg_inf("attention_fwd lse", case_name, got, lse_ref, n_lse, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dq, n_q);
    expect_close_or_neg_inf("attention_bwd dq", case_name, got, dq_ref, n_q, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dk, n_kv);
    expect_close_or_neg_inf("attention_bwd dk", case_name, got, dk_ref, n_kv, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dv, n_kv);
    expect_close_or_neg_inf("attention_bwd dv", case_name, got, dv_ref, n_kv, kTolerance, kNearZeroBound);
    free(got);

    /* No atomics: a second backward over poisoned outputs gives the same bits. */
    gpu_bf16 *first[3] = {download_bf16_bits(d_dq, n_q), download_bf16_bits(d_dk, n_kv),
                          download_bf16_bits(d_dv, n_kv)};
    device_poison(d_dq, n_q * sizeof *d_dq);
    device_poison(d_dk, n_kv * sizeof *d_dk);
    device_poison(d_dv, n_kv * sizeof *d_dv);
    attention_bwd(d_q, d_k, d_v, d_out_ref, d_dout, d_lse_ref, num_heads, head_dim, d_q_row_start, d_kv_row_start,
                  n_samples, n_q_rows, n_kv_rows, d_dq, d_dk, d_dv, d_workspace, 0);
    gpu_bf16 *second[3] = {download_bf16_bits(d_dq, n_q), download_bf16_bits(d_dk, n_kv),
                           download_bf16_bits(d_dv, n_kv)};
    const size_t sizes[3] = {n_q, n_kv, n_kv};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i) {
        if (memcmp(first[i], second[i], sizes[i] * sizeof(gpu_bf16)) != 0)
            fail_msg("attention_bwd %s (%s): a second run gave different bits", names[i], case_name);
        free(first[i]);
        free(second[i]);
    }

    void *device_buffers[] = {d_q_row_start, d_kv_row_start, d_q, d_k, d_v, d_dout, d_out_ref, d_lse_ref,
                              d_out, d_lse, d_dq, d_dk, d_dv, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {q_bits, k_bits, v_bits, dout_bits, q, k, v, dout, out_ref, lse_ref, out_bits,
                            out_rounded, dq_ref, dk_ref, dv_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

/* Self-attention: samples of 1 row, lengths that are not multiples of the 64- and 32-row tiles, an empty sample. */
static const layout kSelfLayouts[] = {
    {"1 sample of 1 row", 1, {1}, {1}},
    {"5 samples (1,17,64,130,300 rows)", 5, {1, 17, 64, 130, 300}, {1, 17, 64, 130, 300}},
    {"4 samples (65,0,33,1 rows)", 4, {65, 0, 33, 1}, {65, 0, 33, 1}},
};
/* Cross-attention: each sample's queries attend to its own text rows; a sample without text (zero output,
   lse -inf, zero dq) and a sample with text but no queries (zero dk, dv). */
static const layout kCrossLayouts[] = {
    {"cross, 4 samples (300,64,1,130 rows; 1,5,16,512 text)", 4, {300, 64, 1, 130}, {1, 5, 16, 512}},
    {"cross, 4 samples (17,40,0,9 rows; 0,16,7,512 text)", 4, {17, 40, 0, 9}, {0, 16, 7, 512}},
};

static void run_layouts(const layout *layouts, size_t n_layouts, int num_heads, int head_dim)
{
    for (size_t i = 0; i < n_layouts; ++i) check_attention(&layouts[i], num_heads, head_dim);
}

#define N_OF(array) (sizeof(array) / sizeof((array)[0]))

static void test_self_head_dim_16(void **state)
{
    (void)state;
    run_layouts(kSelfLayouts, N_OF(kSelfLayouts), 12, 16);
}

static void test_self_head_dim_64(void **state)
{
    (void)state;
    run_layouts(kSelfLayouts, N_OF(kSelfLayouts), 3, 64);
}

static void test_self_head_dim_128(void **state)
{
    (void)state;
    run_layouts(kSelfLayouts, N_OF(kSelfLayouts), 2, 128);
}

/* The other head dims the kernels are built for, on one layout each. */
static void test_self_other_head_dims(void **state)
{
    (void)state;
    static const int dims[] = {32, 48, 80, 96, 112};
    for (size_t i = 0; i < N_OF(dims); ++i) check_attention(&kSelfLayouts[1 + i % 2], 1 + (int)i % 3, dims[i]);
}

static void test_cross(void **state)
{
    (void)state;
    run_layouts(kCrossLayouts, N_OF(kCrossLayouts), 4, 16);
    run_layouts(kCrossLayouts, N_OF(kCrossLayouts), 1, 64);
    run_layouts(kCrossLayouts, N_OF(kCrossLayouts), 2, 128);
}

/* Not an assertion beyond finiteness: forward and backward speed at one sample of S = 16384, 12 heads,
   head_dim 128 (Wan-1.3B's self-attention), printed as a TAP comment. */
static void test_speed(void **state)
{
    (void)state;
    const int num_heads = 12, head_dim = 128, repeats = 5;
    const int64_t rows = 16384;
    const int64_t row_start[2] = {0, rows};
    const size_t n = (size_t)rows * num_heads * head_dim;
    gpu_bf16 *host = xmalloc((n + 3) * sizeof *host);
    for (size_t i = 0; i < n + 3; ++i) host[i] = gpu_bf16_from_float((float)(2.0 * rng_uniform(&g_seed) - 1.0));
    gpu_bf16 *tensors[4];
    for (int i = 0; i < 4; ++i) tensors[i] = device_upload(host + i, n * sizeof *host); /* q, k, v, dout differ */
    free(host);
    int64_t *d_row_start = device_upload(row_start, sizeof row_start);
    gpu_bf16 *d_out = device_poisoned(n * sizeof *d_out), *d_dq = device_poisoned(n * sizeof *d_dq);
    gpu_bf16 *d_dk = device_poisoned(n * sizeof *d_dk), *d_dv = device_poisoned(n * sizeof *d_dv);
    float *d_lse = device_poisoned((size_t)rows * num_heads * sizeof *d_lse);
    void *d_workspace = device_poisoned(attention_bwd_workspace_bytes(rows, num_heads));
    cudaEvent_t start, middle, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&middle));
    CUDA_CHECK(cudaEventCreate(&stop));

    for (int pass = 0; pass < 2; ++pass) { /* pass 0 warms up */
        const int count = pass == 0 ? 1 : repeats;
        CUDA_CHECK(cudaEventRecord(start, 0));
        for (int r = 0; r < count; ++r)
            attention_fwd(tensors[0], tensors[1], tensors[2], num_heads, head_dim, d_row_start, d_row_start, 1, rows,
                          rows, d_out, d_lse, 0);
        CUDA_CHECK(cudaEventRecord(middle, 0));
        for (int r = 0; r < count; ++r)
            attention_bwd(tensors[0], tensors[1], tensors[2], d_out, tensors[3], d_lse, num_heads, head_dim,
                          d_row_start, d_row_start, 1, rows, rows, d_dq, d_dk, d_dv, d_workspace, 0);
        CUDA_CHECK(cudaEventRecord(stop, 0));
        CUDA_CHECK(cudaEventSynchronize(stop));
    }
    float fwd_ms = 0.0f, bwd_ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&fwd_ms, start, middle));
    CUDA_CHECK(cudaEventElapsedTime(&bwd_ms, middle, stop));
    fwd_ms /= repeats;
    bwd_ms /= repeats;
    const double fwd_flops = attention_fwd_flops(row_start, row_start, 1, num_heads, head_dim);
    const double bwd_flops = attention_bwd_flops(row_start, row_start, 1, num_heads, head_dim);
    printf("# attention S=%lld heads=%d head_dim=%d: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s)\n",
           (long long)rows, num_heads, head_dim, fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, bwd_ms,
           bwd_flops / (bwd_ms * 1e-3) / 1e12);
    fflush(stdout);

    char speed_case[64];
    snprintf(speed_case, sizeof speed_case, "S=%lld speed case", (long long)rows);
    float *lse = download_f32(d_lse, (size_t)rows * num_heads);
    expect_finite("attention_fwd lse", speed_case, lse, (size_t)rows * num_heads);
    free(lse);
    float *dq = download_bf16(d_dq, n);
    expect_finite("attention_bwd dq", speed_case, dq, n);
    free(dq);

    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(middle));
    CUDA_CHECK(cudaEventDestroy(stop));
    void *device_buffers[] = {tensors[0], tensors[1], tensors[2], tensors[3], d_row_start, d_out, d_dq, d_dk, d_dv,
                              d_lse, d_workspace};
    free_device_buffers(device_buffers, N_OF(device_buffers));
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_head_dim_16),  cmocka_unit_test(test_self_head_dim_64),
        cmocka_unit_test(test_self_head_dim_128), cmocka_unit_test(test_self_other_head_dims),
        cmocka_unit_test(test_cross),             cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
