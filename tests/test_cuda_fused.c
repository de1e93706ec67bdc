/* test_cuda_fused.c — cmocka tests of the fused CUDA ops (q/k RMSNorm + RoPE (Wan's and HunyuanVideo-1.5's per head), gradient norm, clipping, AdamW,
   flow mixing and loss) against the fp32 CPU ops and host loops, on fresh random inputs, outputs poisoned with NaN. */
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

#include <math.h>

#include "core/check.h"
#include "cuda/fused.h"
#include "cuda/gpu.h"
#include "model/ops_cpu.h"
#include "core/rng.h"

static const float kEps = 1e-6f;
static const double kBf16Tolerance = 1e-2;  /* relative error ||gpu - cpu|| / ||cpu|| of bf16 outputs */
static const double kFp32Tolerance = 1e-5;  /* the same for outputs that stay fp32 all the way */
static const double kNearZeroBound = 1e-6;  /* the error's bound where the reference is ~0 */

static uint64_t g_seed = 0xf05ed0c0ffeeull;

/* ---- host <-> device helpers ------------------------------------------------------------------- */

static double download_f64(const double *device)
{
    double host;
    CUDA_CHECK(cudaMemcpy(&host, device, sizeof host, cudaMemcpyDeviceToHost));
    return host;
}

/* ---- RMSNorm + RoPE ------------------------------------------------------------------------------ */

/* A packed micro-batch of video grids (frames x height x width tokens per sample). */
typedef struct {
    const char *name;
    int n_samples;
    int32_t frames[4], height[4], width[4];
} grid_batch;

static const grid_batch kGridBatches[] = {
    {"3 samples (2x3x5, 1x4x4, 3x2x7)", 3, {2, 1, 3}, {3, 4, 2}, {5, 4, 7}},
    {"3 samples (21x2x3, 1x3x80, 1x45x2): large positions", 3, {21, 1, 1}, {2, 3, 45}, {3, 80, 2}},
    {"1 sample of 1 token", 1, {1}, {1}, {1}},
};

/* Forward then backward of fused_qk_norm_rope against cpu_rmsnorm_* composed with cpu_rope_*.
   with_rope = 0: positions NULL (RMSNorm only). in_place: y written over x, dx over dy. */
static void check_qk(const grid_batch *batch, int num_heads, int head_dim, int with_rope, int in_place)
{
    const int dim = num_heads * head_dim;
    int64_t n_rows = 0;
    for (int b = 0; b < batch->n_samples; ++b) n_rows += (int64_t)batch->frames[b] * batch->height[b] * batch->width[b];
    const size_t n = (size_t)n_rows * dim;
    int32_t *positions = xmalloc((size_t)n_rows * 3 * sizeof *positions);
    cpu_rope_positions(batch->n_samples, batch->frames, batch->height, batch->width, positions);

    gpu_bf16 *x_bits, *dy_bits, *w_bits;
    float *x = random_normal_bf16(&g_seed, n, 0.0, 1.5, &x_bits);
    float *dy = random_normal_bf16(&g_seed, n, 0.0, 1.0, &dy_bits);
    float *weight = random_normal_bf16(&g_seed, (size_t)dim, 0.0, 0.6, &w_bits);
    for (int c = 0; c < dim; ++c) { /* Wan's norm weights sit around 1 */
        w_bits[c] = gpu_bf16_from_float(1.0f + weight[c]);
        weight[c] = gpu_float_from_bf16(w_bits[c]);
    }
    float *dweight_start = random_normal_f32(&g_seed, (size_t)dim, 0.0, 1.0);

    float *normed = xmalloc((n + 1) * sizeof *normed), *y_ref = xmalloc((n + 1) * sizeof *y_ref);
    float *rstd_ref = xmalloc((size_t)(n_rows + 1) * sizeof *rstd_ref), *g = xmalloc((n + 1) * sizeof *g);
    float *dx_ref = xmalloc((n + 1) * sizeof *dx_ref), *dweight_ref = xmalloc((size_t)dim * sizeof *dweight_ref);
    memcpy(dweight_ref, dweight_start, (size_t)dim * sizeof *dweight_ref);
    cpu_rmsnorm_fwd(x, n_rows, dim, weight, kEps, normed, rstd_ref);
    if (with_rope) cpu_rope_fwd(normed, n_rows, num_heads, head_dim, positions, y_ref);
    else memcpy(y_ref, normed, n * sizeof *y_ref);
    if (with_rope) cpu_rope_bwd(dy, n_rows, num_heads, head_dim, positions, g);
    else memcpy(g, dy, n * sizeof *g);
    cpu_rmsnorm_bwd(x, g, n_rows, dim, weight, rstd_ref, dx_ref, dweight_ref);

    gpu_bf16 *d_x = device_upload(x_bits, n * sizeof *x_bits), *d_dy = device_upload(dy_bits, n * sizeof *dy_bits);
    /* The weight at an address that is only 2-byte aligned, as a parameter inside a flat bf16 buffer may be. */
    gpu_bf16 *d_weight_buffer = device_poisoned(((size_t)dim + 1) * sizeof *d_weight_buffer);
    CUDA_CHECK(cudaMemcpy(d_weight_buffer + 1, w_bits, (size_t)dim * sizeof *w_bits, cudaMemcpyHostToDevice));
    int32_t *d_positions = device_upload(positions, (size_t)n_rows * 3 * sizeof *positions);
    float *d_dweight = device_upload(dweight_start, (size_t)dim * sizeof *dweight_start);
    gpu_bf16 *d_y = in_place ? d_x : device_poisoned(n * sizeof *d_y);
    gpu_bf16 *d_dx = in_place ? d_dy : device_poisoned(n * sizeof *d_dx);
    float *d_rstd = device_poisoned((size_t)n_rows * sizeof *d_rstd);
    const size_t workspace_bytes = fused_qk_norm_rope_bwd_workspace_bytes(n_rows, dim);
    void *d_workspace = device_poisoned(workspace_bytes);
    /* In place, the forward overwrites x: the backward then reads a second copy. */
    gpu_bf16 *d_x_saved = in_place ? device_upload(x_bits, n * sizeof *x_bits) : d_x;

    const int32_t *rope_positions = with_rope ? d_positions : NULL;
    fused_qk_norm_rope_fwd(d_x, n_rows, num_heads, head_dim, d_weight_buffer + 1, kEps, rope_positions, d_y, d_rstd, 0);
    fused_qk_norm_rope_bwd(d_x_saved, d_dy, n_rows, num_heads, head_dim, d_weight_buffer + 1, rope_positions, d_rstd,
                           d_dx, d_dweight, d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[200];
    snprintf(case_name, sizeof case_name, "%d heads x %d, %s%s%s", num_heads, head_dim, batch->name,
             with_rope ? "" : ", no RoPE", in_place ? ", in place" : "");
    float *got = download_bf16(d_y, n);
    expect_close("qk_norm_rope_fwd y", case_name, got, y_ref, n, kBf16Tolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_rstd, (size_t)n_rows);
    expect_close("qk_norm_rope_fwd rstd", case_name, got, rstd_ref, (size_t)n_rows, kFp32Tolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dx, n);
    expect_close("qk_norm_rope_bwd dx", case_name, got, dx_ref, n, kBf16Tolerance, kNearZeroBound);
    free(got);
    /* dweight is added into: compare what was added (fp32 sums of the same bf16 inputs) with what the CPU added. */
    float *first_dweight = download_f32(d_dweight, (size_t)dim);
    float *added = xmalloc((size_t)dim * sizeof *added), *added_ref = xmalloc((size_t)dim * sizeof *added_ref);
    for (int c = 0; c < dim; ++c) {
        added[c] = first_dweight[c] - dweight_start[c];
        added_ref[c] = dweight_ref[c] - dweight_start[c];
    }
    expect_close("qk_norm_rope_bwd dweight", case_name, added, added_ref, (size_t)dim, 1e-4, kNearZeroBound);
    free(added);
    free(added_ref);

    /* The column sums are reduced in a fixed order: a second run from the same start gives the same bits. */
    if (!in_place) {
        CUDA_CHECK(cudaMemcpy(d_dweight, dweight_start, (size_t)dim * sizeof *dweight_start, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(d_workspace, 0xff, workspace_bytes));
        fused_qk_norm_rope_bwd(d_x, d_dy, n_rows, num_heads, head_dim, d_weight_buffer + 1, rope_positions, d_rstd,
                               d_dx, d_dweight, d_workspace, 0);
        float *again = download_f32(d_dweight, (size_t)dim);
        if (memcmp(again, first_dweight, (size_t)dim * sizeof *again) != 0)
            fail_msg("qk_norm_rope_bwd dweight (%s): a second run gave different bits", case_name);
        free(again);
    }
    free(first_dweight);

    if (in_place) CUDA_CHECK(cudaFree(d_x_saved));
    else {
        void *outputs[] = {d_y, d_dx};
        free_device_buffers(outputs, 2);
    }
    void *device_buffers[] = {d_x, d_dy, d_weight_buffer, d_positions, d_dweight, d_rstd, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {positions, x_bits, dy_bits, w_bits, x, dy, weight, dweight_start, normed, y_ref,
                            rstd_ref, g, dx_ref, dweight_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

static void run_grid_batches(int num_heads, int head_dim)
{
    for (size_t i = 0; i < sizeof kGridBatches / sizeof kGridBatches[0]; ++i)
        check_qk(&kGridBatches[i], num_heads, head_dim, 1, (int)(i == 2));
    check_qk(&kGridBatches[0], num_heads, head_dim, 0, 0);
}

/* Wan-1.3B's q/k (12 heads of 128), its 14B's (40 heads of 128), and other row shapes. */
static void test_qk_dim1536_head128(void **state) { (void)state; run_grid_batches(12, 128); }
static void test_qk_dim1536_head16(void **state) { (void)state; run_grid_batches(96, 16); }
static void test_qk_dim64_head16(void **state) { (void)state; run_grid_batches(4, 16); }
static void test_qk_dim3072_head128(void **state) { (void)state; run_grid_batches(24, 128); }
static void test_qk_dim5120_head128(void **state) { (void)state; run_grid_batches(40, 128); }
/* FUSED_QK_MAX_DIM: the backward's shared memory (sums and weight) is 48 KiB, past the default limit. */
static void test_qk_dim8192_head128(void **state) { (void)state; run_grid_batches(64, 128); }
/* Heads that are not a multiple of 8 values: vectors straddle heads and each vector has its own angles. */
static void test_qk_odd_heads(void **state)
{
    (void)state;
    run_grid_batches(4, 24);
    run_grid_batches(2, 12);
    run_grid_batches(100, 20);
}

/* Many rows: several row groups per block and the backward's full grid of partials. */
static void test_qk_many_rows(void **state)
{
    (void)state;
    const grid_batch batch = {"2 samples (5x30x40, 2x17x23)", 2, {5, 2}, {30, 17}, {40, 23}};
    check_qk(&batch, 12, 128, 1, 0);
    check_qk(&batch, 2, 64, 1, 1);
}

/* fused_head_norm_rope (HunyuanVideo-1.5's q/k: each head normalised on its own with a head_dim-wide weight, RoPE
   with the given axes and theta 256) against cpu_rmsnorm_* over the heads composed with cpu_rope_axes_*. */
static void check_head_qk(const grid_batch *batch, int num_heads, int head_dim, int t_pairs, int with_rope)
{
    const int dim = num_heads * head_dim, axes[3] = {t_pairs, (head_dim / 2 - t_pairs) / 2, (head_dim / 2 - t_pairs) / 2};
    const double theta = 256.0;
    int64_t n_tokens = 0;
    for (int b = 0; b < batch->n_samples; ++b) n_tokens += (int64_t)batch->frames[b] * batch->height[b] * batch->width[b];
    const int64_t n_heads = n_tokens * num_heads;
    const size_t n = (size_t)n_tokens * dim;
    int32_t *positions = xmalloc((size_t)n_tokens * 3 * sizeof *positions);
    cpu_rope_positions(batch->n_samples, batch->frames, batch->height, batch->width, positions);
    gpu_bf16 *x_bits, *dy_bits, *w_bits;
    float *x = random_normal_bf16(&g_seed, n, 0.0, 1.5, &x_bits);
    float *dy = random_normal_bf16(&g_seed, n, 0.0, 1.0, &dy_bits);
    float *weight = random_normal_bf16(&g_seed, (size_t)head_dim, 0.0, 0.6, &w_bits);
    for (int c = 0; c < head_dim; ++c) {
        w_bits[c] = gpu_bf16_from_float(1.0f + weight[c]);
        weight[c] = gpu_float_from_bf16(w_bits[c]);
    }
    float *normed = xmalloc((n + 1) * sizeof *normed), *y_ref = xmalloc((n + 1) * sizeof *y_ref);
    float *rstd_ref = xmalloc((size_t)(n_heads + 1) * sizeof *rstd_ref), *g = xmalloc((n + 1) * sizeof *g);
    float *dx_ref = xmalloc((n + 1) * sizeof *dx_ref), *dweight_ref = xcalloc((size_t)head_dim, sizeof *dweight_ref);
    cpu_rmsnorm_fwd(x, n_heads, head_dim, weight, kEps, normed, rstd_ref);
    if (with_rope) cpu_rope_axes_fwd(normed, n_tokens, num_heads, head_dim, positions, axes, theta, y_ref);
    else memcpy(y_ref, normed, n * sizeof *y_ref);
    if (with_rope) cpu_rope_axes_bwd(dy, n_tokens, num_heads, head_dim, positions, axes, theta, g);
    else memcpy(g, dy, n * sizeof *g);
    cpu_rmsnorm_bwd(x, g, n_heads, head_dim, weight, rstd_ref, dx_ref, dweight_ref);

    gpu_bf16 *d_x = device_upload(x_bits, n * sizeof *x_bits), *d_dy = device_upload(dy_bits, n * sizeof *dy_bits);
    gpu_bf16 *d_weight = device_upload(w_bits, (size_t)head_dim * sizeof *w_bits);
    int32_t *d_positions = device_upload(positions, (size_t)n_tokens * 3 * sizeof *positions);
    float *d_dweight = device_poisoned((size_t)head_dim * sizeof *d_dweight);   /* added into from zero */
    CUDA_CHECK(cudaMemset(d_dweight, 0, (size_t)head_dim * sizeof *d_dweight));
    gpu_bf16 *d_y = device_poisoned(n * sizeof *d_y), *d_dx = device_poisoned(n * sizeof *d_dx);
    float *d_rstd = device_poisoned((size_t)n_heads * sizeof *d_rstd);
    void *d_workspace = device_poisoned(fused_head_norm_rope_bwd_workspace_bytes(n_tokens, num_heads, head_dim));
    const int32_t *rope_positions = with_rope ? d_positions : NULL;
    fused_head_norm_rope_fwd(d_x, n_tokens, num_heads, head_dim, d_weight, kEps, rope_positions, axes, theta, d_y,
                             d_rstd, 0);
    fused_head_norm_rope_bwd(d_x, d_dy, n_tokens, num_heads, head_dim, d_weight, rope_positions, axes, theta, d_rstd,
                             d_dx, d_dweight, d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    char case_name[200];
    snprintf(case_name, sizeof case_name, "per head: %d heads x %d, %d frame pairs, %s%s", num_heads, head_dim, t_pairs,
             batch->name, with_rope ? "" : ", no RoPE");
    float *got = download_bf16(d_y, n);
    expect_close("head_norm_rope_fwd y", case_name, got, y_ref, n, kBf16Tolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_rstd, (size_t)n_heads);
    expect_close("head_norm_rope_fwd rstd", case_name, got, rstd_ref, (size_t)n_heads, kFp32Tolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dx, n);
    expect_close("head_norm_rope_bwd dx", case_name, got, dx_ref, n, kBf16Tolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_dweight, (size_t)head_dim);
    expect_close("head_norm_rope_bwd dweight", case_name, got, dweight_ref, (size_t)head_dim, 1e-4, kNearZeroBound);
    free(got);
    void *device_buffers[] = {d_x, d_dy, d_weight, d_positions, d_dweight, d_y, d_dx, d_rstd, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {positions, x_bits, dy_bits, w_bits, x, dy, weight, normed, y_ref, rstd_ref, g, dx_ref,
                            dweight_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

/* HunyuanVideo-1.5's heads (16 of 128, RoPE 8/28/28 pairs), the tiny test model's (4 of 16, 2/3/3), and no RoPE. */
static void test_head_norm_rope(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kGridBatches / sizeof kGridBatches[0]; ++i) {
        check_head_qk(&kGridBatches[i], 16, 128, 8, 1);
        check_head_qk(&kGridBatches[i], 4, 16, 2, 1);
    }
    check_head_qk(&kGridBatches[0], 16, 128, 8, 0);
}

/* ---- gradient norm, clipping, AdamW ---------------------------------------------------------------- */

static void test_sumsq_and_clip(void **state)
{
    (void)state;
    const size_t n = 3000007;
    float *values = random_normal_f32(&g_seed, n + 1, 0.0, 0.01);
    double want[2] = {0.0, 0.0}; /* over values[0..n) and values[1..n] */
    for (size_t i = 0; i < n; ++i) want[0] += (double)values[i] * values[i];
    want[1] = want[0] - (double)values[0] * values[0] + (double)values[n] * values[n];

    float *d_values = device_upload(values, (n + 1) * sizeof *values);
    void *d_workspace = device_poisoned(fused_sumsq_workspace_bytes());
    double *d_sumsq = device_poisoned(sizeof *d_sumsq), *d_norm = device_poisoned(sizeof *d_norm);
    float *d_scale = device_poisoned(sizeof *d_scale);
    for (int offset = 0; offset < 2; ++offset) { /* 16-byte aligned, then not */
        fused_sumsq(d_values + offset, (int64_t)n, d_sumsq, d_workspace, 0);
        const double got = download_f64(d_sumsq);
        if (!(fabs(got - want[offset]) <= 1e-12 * want[offset]))
            fail_msg("fused_sumsq (offset %d): %.17g, want %.17g", offset, got, want[offset]);
        CUDA_CHECK(cudaMemset(d_sumsq, 0xff, sizeof *d_sumsq));
        fused_sumsq(d_values + offset, (int64_t)n, d_sumsq, d_workspace, 0);
        const double again = download_f64(d_sumsq);
        if (memcmp(&again, &got, sizeof got) != 0) fail_msg("fused_sumsq (offset %d): a second run gave different bits", offset);
    }
    fused_sumsq(d_values, 0, d_sumsq, d_workspace, 0);
    assert_true(download_f64(d_sumsq) == 0.0);

    /* Clipping: norm = base * sqrt(sumsq); clipped when over max_norm; a non-finite norm gives NaN. */
    fused_sumsq(d_values, (int64_t)n, d_sumsq, d_workspace, 0);
    const double base = 0.125, norm = base * sqrt(want[0]);
    const double max_norms[] = {0.0, norm * 2.0, norm * 0.5};
    for (size_t k = 0; k < sizeof max_norms / sizeof max_norms[0]; ++k) {
        fused_clip_scale(d_sumsq, base, max_norms[k], d_scale, d_norm, 0);
        float got_scale;
        CUDA_CHECK(cudaMemcpy(&got_scale, d_scale, sizeof got_scale, cudaMemcpyDeviceToHost));
        const double got_norm = download_f64(d_norm);
        const double want_scale = max_norms[k] > 0.0 && norm > max_norms[k] ? base * max_norms[k] / (norm + 1e-6) : base;
        if (!(fabs(got_norm - norm) <= 1e-12 * norm)) fail_msg("fused_clip_scale norm %.17g, want %.17g", got_norm, norm);
        if (!(fabs(got_scale - want_scale) <= 1e-6 * want_scale))
            fail_msg("fused_clip_scale (max_norm %g): scale %.9g, want %.9g", max_norms[k], got_scale, want_scale);
    }
    const double infinite = INFINITY;
    CUDA_CHECK(cudaMemcpy(d_sumsq, &infinite, sizeof infinite, cudaMemcpyHostToDevice));
    fused_clip_scale(d_sumsq, base, 1.0, d_scale, NULL, 0);
    float got_scale;
    CUDA_CHECK(cudaMemcpy(&got_scale, d_scale, sizeof got_scale, cudaMemcpyDeviceToHost));
    assert_true(isnan(got_scale));

    void *device_buffers[] = {d_values, d_workspace, d_sumsq, d_norm, d_scale};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    free(values);
}

/* optim_adamw's update written out on the host, with the gradient scaled first. */
static void host_adamw(const adamw_step *hyper, double weight_decay, float scale, float *w, const float *grad,
                       float *m, float *v, size_t n)
{
    const float beta1 = (float)hyper->beta1, beta2 = (float)hyper->beta2, eps = (float)hyper->eps;
    const float lr = (float)hyper->lr, decay = (float)(1.0 - hyper->lr * weight_decay);
    const float m_correction = (float)(1.0 / (1.0 - pow(hyper->beta1, (double)hyper->step)));
    const float v_correction = (float)(1.0 / (1.0 - pow(hyper->beta2, (double)hyper->step)));
    for (size_t i = 0; i < n; ++i) {
        const float g = grad[i] * scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        w[i] = w[i] * decay - lr * (m[i] * m_correction) / (sqrtf(v[i] * v_correction) + eps);
    }
}

/* offset: elements into each buffer (1 = not 16-byte aligned: the one-by-one path). device_scale: also pass a
   device scale (0.5); NaN there must leave everything untouched. */
static void check_adamw(size_t n, int offset, int with_copy, float device_scale)
{
    const adamw_step hyper = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .step = 7};
    const double weight_decay = 0.1;
    const float grad_scale = 0.25f;
    const size_t total = n + (size_t)offset;
    float *w = random_normal_f32(&g_seed, total, 0.0, 0.05), *grad = random_normal_f32(&g_seed, total, 0.0, 1.0);
    float *m = random_normal_f32(&g_seed, total, 0.0, 0.1);
    float *v = random_normal_f32(&g_seed, total, 0.0, 0.01);
    for (size_t i = 0; i < total; ++i) v[i] = v[i] * v[i];
    float *w_ref = xmalloc((total + 1) * sizeof *w_ref), *m_ref = xmalloc((total + 1) * sizeof *m_ref);
    float *v_ref = xmalloc((total + 1) * sizeof *v_ref);
    memcpy(w_ref, w, total * sizeof *w);
    memcpy(m_ref, m, total * sizeof *m);
    memcpy(v_ref, v, total * sizeof *v);
    const int skipped = isnan(device_scale);
    if (!skipped)
        host_adamw(&hyper, weight_decay, grad_scale * (isfinite(device_scale) ? device_scale : 1.0f), w_ref + offset,
                   grad + offset, m_ref + offset, v_ref + offset, n);

    float *d_w = device_upload(w, total * sizeof *w), *d_grad = device_upload(grad, total * sizeof *grad);
    float *d_m = device_upload(m, total * sizeof *m), *d_v = device_upload(v, total * sizeof *v);
    gpu_bf16 *d_copy = device_poisoned(total * sizeof *d_copy);
    float *d_scale = device_upload(&device_scale, sizeof device_scale);
    fused_adamw(&hyper, weight_decay, d_w + offset, with_copy ? d_copy + offset : NULL, d_grad + offset, d_m + offset,
                d_v + offset, (int64_t)n, grad_scale, isinf(device_scale) ? NULL : d_scale, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[160];
    snprintf(case_name, sizeof case_name, "%zu values, offset %d%s, device scale %g", n, offset,
             with_copy ? ", bf16 copy" : "", device_scale);
    float *got_w = download_f32(d_w, total), *got_m = download_f32(d_m, total), *got_v = download_f32(d_v, total);
    if (skipped) {
        if (memcmp(got_w, w, total * sizeof *w) || memcmp(got_m, m, total * sizeof *m) || memcmp(got_v, v, total * sizeof *v))
            fail_msg("fused_adamw (%s): a NaN scale must leave the weights and moments untouched", case_name);
    } else {
        expect_close("fused_adamw master", case_name, got_w, w_ref, total, kFp32Tolerance, kNearZeroBound);
        expect_close("fused_adamw m", case_name, got_m, m_ref, total, kFp32Tolerance, kNearZeroBound);
        expect_close("fused_adamw v", case_name, got_v, v_ref, total, kFp32Tolerance, kNearZeroBound);
        /* The update itself, not only the weights: ||w_gpu - w_ref|| small next to ||w_ref - w||. */
        double diff2 = 0.0, step2 = 0.0;
        for (size_t i = 0; i < total; ++i) {
            diff2 += ((double)got_w[i] - w_ref[i]) * ((double)got_w[i] - w_ref[i]);
            step2 += ((double)w_ref[i] - w[i]) * ((double)w_ref[i] - w[i]);
        }
        if (!(sqrt(diff2) <= 1e-4 * sqrt(step2)))
            fail_msg("fused_adamw (%s): update off by %.3e relative", case_name, sqrt(diff2 / step2));
        if (offset > 0 && (got_w[0] != w[0] || got_m[0] != m[0] || got_v[0] != v[0]))
            fail_msg("fused_adamw (%s): wrote before its range", case_name);
    }
    if (with_copy && !skipped) {
        float *copy = download_bf16(d_copy + offset, n);
        for (size_t i = 0; i < n; ++i)
            if (copy[i] != gpu_float_from_bf16(gpu_bf16_from_float(got_w[offset + i])))
                fail_msg("fused_adamw (%s): bf16 copy %zu is %g, master %g", case_name, i, copy[i], got_w[offset + i]);
        free(copy);
    }

    void *device_buffers[] = {d_w, d_grad, d_m, d_v, d_copy, d_scale};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {w, grad, m, v, w_ref, m_ref, v_ref, got_w, got_m, got_v};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

static void test_adamw(void **state)
{
    (void)state;
    check_adamw(1000003, 0, 1, 0.5f);      /* vector path with a tail of 3 */
    check_adamw(1000003, 1, 1, 0.5f);      /* misaligned: one by one */
    check_adamw(4096, 0, 0, INFINITY);     /* no device scale (passed as NULL), no copy */
    check_adamw(1, 0, 1, 2.0f);
    check_adamw(77777, 0, 1, NAN);         /* skipped step */
}

/* Norm, clip and AdamW chained on the device, as a training step runs them, against the host's chain. */
static void test_clipped_step(void **state)
{
    (void)state;
    const size_t n = 200000;
    const adamw_step hyper = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 1};
    float *w = random_normal_f32(&g_seed, n, 0.0, 0.05), *grad = random_normal_f32(&g_seed, n, 0.0, 3.0);
    float *m = xcalloc(n, sizeof *m), *v = xcalloc(n, sizeof *v);
    float *w_ref = xmalloc(n * sizeof *w_ref), *m_ref = xcalloc(n, sizeof *m_ref), *v_ref = xcalloc(n, sizeof *v_ref);
    memcpy(w_ref, w, n * sizeof *w);
    const double base = 1.0 / 6.0, max_norm = 1.0;
    double sum_sq = 0.0;
    for (size_t i = 0; i < n; ++i) sum_sq += (double)grad[i] * grad[i];
    const double norm = base * sqrt(sum_sq);
    assert_true(norm > max_norm);
    host_adamw(&hyper, 0.0, (float)(base * max_norm / (norm + 1e-6)), w_ref, grad, m_ref, v_ref, n);

    float *d_w = device_upload(w, n * sizeof *w), *d_grad = device_upload(grad, n * sizeof *grad);
    float *d_m = device_upload(m, n * sizeof *m), *d_v = device_upload(v, n * sizeof *v);
    void *d_workspace = device_poisoned(fused_sumsq_workspace_bytes());
    double *d_sumsq = device_poisoned(sizeof *d_sumsq);
    float *d_scale = device_poisoned(sizeof *d_scale);
    fused_sumsq(d_grad, (int64_t)n, d_sumsq, d_workspace, 0);
    fused_clip_scale(d_sumsq, base, max_norm, d_scale, NULL, 0);
    fused_adamw(&hyper, 0.0, d_w, NULL, d_grad, d_m, d_v, (int64_t)n, 1.0f, d_scale, 0);
    float *got = download_f32(d_w, n);
    expect_close("clipped step master", "200000 values", got, w_ref, n, kFp32Tolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_m, n);
    expect_close("clipped step m", "200000 values", got, m_ref, n, kFp32Tolerance, kNearZeroBound);
    free(got);

    void *device_buffers[] = {d_w, d_grad, d_m, d_v, d_workspace, d_sumsq, d_scale};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {w, grad, m, v, w_ref, m_ref, v_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

/* ---- rectified flow ------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int n_samples;
    int64_t elements[6];
} flow_batch;

static const flow_batch kFlowBatches[] = {
    {"5 samples (1920, 64, 0, 32000, 37 values)", 5, {1920, 64, 0, 32000, 37}},
    {"1 sample of 75600 tokens x 64", 1, {75600 * 64}},
    {"6 samples (1 value, 4096x64, 100, 3, 64x64, 8191)", 6, {1, 4096 * 64, 100, 3, 64 * 64, 8191}},
};

/* pred_f32: the fp32 prediction (else bf16); in_place: d_pred written over pred. */
static void check_flow(const flow_batch *batch, int pred_f32, int in_place)
{
    const int n_samples = batch->n_samples;
    int64_t start[7];
    start[0] = 0;
    for (int b = 0; b < n_samples; ++b) start[b + 1] = start[b] + batch->elements[b];
    const size_t n = (size_t)start[n_samples];
    float *x0 = random_normal_f32(&g_seed, n, 0.0, 1.0), *noise = random_normal_f32(&g_seed, n, 0.0, 1.0);
    float *sigma = xmalloc(sizeof(float) * 6);
    for (int b = 0; b < n_samples; ++b) sigma[b] = (float)rng_uniform(&g_seed);
    gpu_bf16 *pred_bits;
    float *pred = random_normal_bf16(&g_seed, n, 0.0, 1.3, &pred_bits); /* bf16 values: exact in both paths */
    const float grad_scale = 0.2f;

    float *x_t_ref = xmalloc((n + 1) * sizeof *x_t_ref), *d_pred_ref = xmalloc((n + 1) * sizeof *d_pred_ref);
    float loss_ref[6];
    for (int b = 0; b < n_samples; ++b) {
        double sum_sq = 0.0;
        const float coef = start[b + 1] > start[b] ? grad_scale * 2.0f / (float)(start[b + 1] - start[b]) : 0.0f;
        for (int64_t i = start[b]; i < start[b + 1]; ++i) {
            x_t_ref[i] = (1.0f - sigma[b]) * x0[i] + sigma[b] * noise[i];
            const float diff = pred[i] - (noise[i] - x0[i]);
            sum_sq += (double)diff * diff;
            d_pred_ref[i] = coef * diff;
        }
        loss_ref[b] = start[b + 1] > start[b] ? (float)(sum_sq / (double)(start[b + 1] - start[b])) : 0.0f;
    }

    int64_t *d_start = device_upload(start, (size_t)(n_samples + 1) * sizeof *start);
    float *d_x0 = device_upload(x0, n * sizeof *x0), *d_noise = device_upload(noise, n * sizeof *noise);
    float *d_sigma = device_upload(sigma, (size_t)n_samples * sizeof *sigma);
    void *d_pred = pred_f32 ? device_upload(pred, n * sizeof *pred) : device_upload(pred_bits, n * sizeof *pred_bits);
    const size_t pred_bytes = n * (pred_f32 ? sizeof(float) : sizeof(gpu_bf16));
    void *d_grad = in_place ? d_pred : device_poisoned(pred_bytes);
    gpu_bf16 *d_x_t = device_poisoned(n * sizeof *d_x_t);
    float *d_loss = device_poisoned((size_t)n_samples * sizeof *d_loss);
    void *d_workspace = device_poisoned(fused_flow_loss_workspace_bytes(n_samples));

    fused_flow_mix(d_x0, d_noise, d_start, n_samples, d_sigma, d_x_t, 0);
    if (pred_f32) fused_flow_loss_f32(d_pred, d_x0, d_noise, d_start, n_samples, grad_scale, d_loss, d_grad, d_workspace, 0);
    else fused_flow_loss_bf16(d_pred, d_x0, d_noise, d_start, n_samples, grad_scale, d_loss, d_grad, d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[200];
    snprintf(case_name, sizeof case_name, "%s, %s prediction%s", batch->name, pred_f32 ? "fp32" : "bf16",
             in_place ? ", gradient over it" : "");
    float *got = download_bf16(d_x_t, n);
    expect_close("flow_mix x_t", case_name, got, x_t_ref, n, kBf16Tolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_loss, (size_t)n_samples);
    expect_close("flow_loss sample_loss", case_name, got, loss_ref, (size_t)n_samples, kFp32Tolerance, kNearZeroBound);
    for (int b = 0; b < n_samples; ++b) /* each sample on its own, not only the whole vector */
        if (!(fabsf(got[b] - loss_ref[b]) <= 1e-5f * loss_ref[b]))
            fail_msg("flow_loss (%s): sample %d loss %.9g, want %.9g", case_name, b, got[b], loss_ref[b]);
    free(got);
    got = pred_f32 ? download_f32(d_grad, n) : download_bf16(d_grad, n);
    expect_close("flow_loss d_pred", case_name, got, d_pred_ref, n, pred_f32 ? kFp32Tolerance : kBf16Tolerance,
                 kNearZeroBound);
    free(got);

    if (!in_place) CUDA_CHECK(cudaFree(d_grad));
    void *device_buffers[] = {d_start, d_x0, d_noise, d_sigma, d_pred, d_x_t, d_loss, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {x0, noise, sigma, pred_bits, pred, x_t_ref, d_pred_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

static void test_flow(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kFlowBatches / sizeof kFlowBatches[0]; ++i) {
        check_flow(&kFlowBatches[i], 0, 0);
        check_flow(&kFlowBatches[i], 1, 0);
        check_flow(&kFlowBatches[i], (int)(i % 2), 1);
    }
}

/* Many small samples: far more samples than the grid gives each one blocks. */
static void test_flow_many_samples(void **state)
{
    (void)state;
    flow_batch batch = {"6 samples of 0..300 values", 6, {0}};
    for (int round = 0; round < 4; ++round) {
        for (int b = 0; b < 6; ++b) batch.elements[b] = (int64_t)rng_below(&g_seed, 301);
        check_flow(&batch, round % 2, round / 2);
    }
}

/* Empty inputs queue nothing and touch nothing. */
static void test_empty(void **state)
{
    (void)state;
    const adamw_step hyper = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = 1};
    float *d_dweight = device_poisoned(64 * sizeof *d_dweight);
    fused_qk_norm_rope_fwd(NULL, 0, 4, 16, NULL, kEps, NULL, NULL, NULL, 0);
    fused_qk_norm_rope_bwd(NULL, NULL, 0, 4, 16, NULL, NULL, NULL, NULL, d_dweight, NULL, 0);
    fused_adamw(&hyper, 0.1, NULL, NULL, NULL, NULL, NULL, 0, 1.0f, NULL, 0);
    fused_flow_mix(NULL, NULL, NULL, 0, NULL, NULL, 0);
    fused_flow_loss_bf16(NULL, NULL, NULL, NULL, 0, 1.0f, NULL, NULL, NULL, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *got = download_f32(d_dweight, 64);
    for (int c = 0; c < 64; ++c) assert_true(isnan(got[c])); /* still the poison */
    free(got);
    CUDA_CHECK(cudaFree(d_dweight));
    assert_true(fused_flow_loss_workspace_bytes(0) == 0);
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qk_dim1536_head128), cmocka_unit_test(test_qk_dim1536_head16),
        cmocka_unit_test(test_qk_dim64_head16),    cmocka_unit_test(test_qk_dim3072_head128),
        cmocka_unit_test(test_qk_dim5120_head128), cmocka_unit_test(test_qk_dim8192_head128),
        cmocka_unit_test(test_qk_odd_heads),       cmocka_unit_test(test_head_norm_rope),
        cmocka_unit_test(test_qk_many_rows),       cmocka_unit_test(test_sumsq_and_clip),
        cmocka_unit_test(test_adamw),              cmocka_unit_test(test_clipped_step),
        cmocka_unit_test(test_flow),               cmocka_unit_test(test_flow_many_samples),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
