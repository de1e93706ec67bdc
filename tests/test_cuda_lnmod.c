/* test_cuda_lnmod.c — cmocka tests of the CUDA LayerNorm-Modulate kernels (plain and gated-residual, forward and
   backward) against the fp32 CPU reference on fresh random bf16 inputs over packed variable-length layouts. */
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

#include "core/check.h"
#include "cuda/gpu.h"
#include "cuda/lnmod.h"
#include "model/ops_cpu.h"
#include "core/rng.h"

static const float kEps = 1e-6f;
static const double kTolerance = 1e-2; /* relative error ||gpu - cpu|| / ||cpu|| of bf16 paths */
static const double kNearZeroBound = 1e-6; /* the error's bound where the reference is ~0 */

/* A packed layout: rows of each sample, back to back. */
typedef struct {
    const char *name;
    int n_samples;
    int rows[8];
} layout;

/* Small samples, 1-row samples and an empty one; every D runs these. */
static const layout kSmallLayouts[] = {
    {"1 sample of 1 row", 1, {1}},
    {"6 samples (1,37,0,200,1,90 rows)", 6, {1, 37, 0, 200, 1, 90}},
    {"3 samples (64,1,129 rows)", 3, {64, 1, 129}},
};
/* Long samples: several rows per block and samples that end inside a block's chunk. */
static const layout kLongLayouts[] = {
    {"5 samples (1,2500,1,3,2495 rows)", 5, {1, 2500, 1, 3, 2495}},
    {"4 samples (3001,0,1499,700 rows)", 4, {3001, 0, 1499, 700}},
};

static uint64_t g_seed = 0x5eed1234abcdull;

/* Row offsets of a layout; returns the total number of rows. */
static int64_t layout_offsets(const layout *l, int64_t *row_start)
{
    row_start[0] = 0;
    for (int b = 0; b < l->n_samples; ++b) row_start[b + 1] = row_start[b] + l->rows[b];
    return row_start[l->n_samples];
}

/* Plain LayerNorm-Modulate: forward then backward, each against cpu_ln_modulate_*. */
static void check_plain(const layout *l, int dim)
{
    int64_t row_start[9];
    const int64_t n_rows = layout_offsets(l, row_start);
    const int n_samples = l->n_samples;
    const size_t n = (size_t)n_rows * dim, n_mod = (size_t)n_samples * dim;
    gpu_bf16 *x_bits, *dy_bits;
    float *x = random_normal_bf16(&g_seed, n, 2.5, 1.5, &x_bits); /* an offset mean tests the variance's accuracy */
    float *dy = random_normal_bf16(&g_seed, n, 0.0, 1.0, &dy_bits);
    float *shift = random_normal_f32(&g_seed, n_mod, 0.0, 0.5), *scale = random_normal_f32(&g_seed, n_mod, 0.0, 0.5);

    float *y_ref = xmalloc((n + 1) * sizeof *y_ref), *mean_ref = xmalloc((n_rows + 1) * sizeof *mean_ref);
    float *rstd_ref = xmalloc((n_rows + 1) * sizeof *rstd_ref), *dx_ref = xmalloc((n + 1) * sizeof *dx_ref);
    float *dshift_ref = xmalloc((n_mod + 1) * sizeof *dshift_ref), *dscale_ref = xmalloc((n_mod + 1) * sizeof *dscale_ref);
    cpu_ln_modulate_fwd(x, n_rows, dim, row_start, n_samples, shift, scale, kEps, y_ref, mean_ref, rstd_ref);
    cpu_ln_modulate_bwd(x, dy, n_rows, dim, row_start, n_samples, scale, mean_ref, rstd_ref, dx_ref, dshift_ref, dscale_ref);

    int64_t *d_row_start = device_upload(row_start, (n_samples + 1) * sizeof *row_start);
    gpu_bf16 *d_x = device_upload(x_bits, n * sizeof *x_bits), *d_dy = device_upload(dy_bits, n * sizeof *dy_bits);
    float *d_shift = device_upload(shift, n_mod * sizeof *shift), *d_scale = device_upload(scale, n_mod * sizeof *scale);
    gpu_bf16 *d_y = device_poisoned(n * sizeof *d_y), *d_dx = device_poisoned(n * sizeof *d_dx);
    float *d_mean = device_poisoned(n_rows * sizeof *d_mean), *d_rstd = device_poisoned(n_rows * sizeof *d_rstd);
    float *d_dshift = device_poisoned(n_mod * sizeof *d_dshift), *d_dscale = device_poisoned(n_mod * sizeof *d_dscale);
    const size_t workspace_bytes = lnmod_bwd_workspace_bytes(n_rows, dim, n_samples);
    void *d_workspace = device_poisoned(workspace_bytes);

    lnmod_fwd(d_x, n_rows, dim, d_row_start, n_samples, d_shift, d_scale, kEps, d_y, d_mean, d_rstd, 0);
    lnmod_bwd(d_x, d_dy, n_rows, dim, d_row_start, n_samples, d_scale, d_mean, d_rstd, d_dx, d_dshift, d_dscale,
              d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[160];
    snprintf(case_name, sizeof case_name, "D=%d, %s", dim, l->name);
    float *got = download_bf16(d_y, n);
    expect_close("lnmod_fwd y", case_name, got, y_ref, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_mean, n_rows);
    expect_close("lnmod_fwd mean", case_name, got, mean_ref, n_rows, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_rstd, n_rows);
    expect_close("lnmod_fwd rstd", case_name, got, rstd_ref, n_rows, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dx, n);
    expect_close("lnmod_bwd dx", case_name, got, dx_ref, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_dshift, n_mod);
    expect_close("lnmod_bwd dshift", case_name, got, dshift_ref, n_mod, kTolerance, kNearZeroBound);
    float *first_dshift = got;
    got = download_f32(d_dscale, n_mod);
    expect_close("lnmod_bwd dscale", case_name, got, dscale_ref, n_mod, kTolerance, kNearZeroBound);

    /* The column sums are reduced in a fixed order: a second run gives the same bits. */
    CUDA_CHECK(cudaMemset(d_dshift, 0xff, n_mod * sizeof *d_dshift));
    lnmod_bwd(d_x, d_dy, n_rows, dim, d_row_start, n_samples, d_scale, d_mean, d_rstd, d_dx, d_dshift, d_dscale,
              d_workspace, 0);
    float *again = download_f32(d_dshift, n_mod);
    if (n_mod > 0 && memcmp(again, first_dshift, n_mod * sizeof *again) != 0)
        fail_msg("lnmod_bwd dshift (%s): a second run gave different bits", case_name);
    free(again);
    free(first_dshift);
    free(got);

    void *device_buffers[] = {d_row_start, d_x, d_dy, d_shift, d_scale, d_y, d_dx, d_mean, d_rstd, d_dshift, d_dscale, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {x_bits, dy_bits, x, dy, shift, scale, y_ref, mean_ref, rstd_ref, dx_ref, dshift_ref, dscale_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

/* Gated residual + LayerNorm-Modulate: x_new = x + y_prev * gate_b, then the plain op on x_new; the reference
   composes cpu_ln_modulate_* with the residual written out here. in_place: x_new written over x;
   with_residual_grad: a gradient d_x_new arrives from the residual stream (else NULL). */
static void check_residual(const layout *l, int dim, int in_place, int with_residual_grad)
{
    int64_t row_start[9];
    const int64_t n_rows = layout_offsets(l, row_start);
    const int n_samples = l->n_samples;
    const size_t n = (size_t)n_rows * dim, n_mod = (size_t)n_samples * dim;
    gpu_bf16 *x_bits, *prev_bits, *dy_bits, *dres_bits;
    float *x = random_normal_bf16(&g_seed, n, 1.0, 1.0, &x_bits);
    float *y_prev = random_normal_bf16(&g_seed, n, 0.0, 2.0, &prev_bits);
    float *dy = random_normal_bf16(&g_seed, n, 0.0, 1.0, &dy_bits);
    float *d_res = random_normal_bf16(&g_seed, n, 0.0, 0.5, &dres_bits);
    float *gate = random_normal_f32(&g_seed, n_mod, 0.0, 0.7), *shift = random_normal_f32(&g_seed, n_mod, 0.0, 0.5);
    float *scale = random_normal_f32(&g_seed, n_mod, 0.0, 0.5);

    float *x_new = xmalloc((n + 1) * sizeof *x_new);
    for (int b = 0; b < n_samples; ++b)
        for (int64_t r = row_start[b]; r < row_start[b + 1]; ++r)
            for (int d = 0; d < dim; ++d) {
                const size_t i = (size_t)r * dim + d;
                x_new[i] = gpu_float_from_bf16(gpu_bf16_from_float(x[i] + y_prev[i] * gate[(size_t)b * dim + d]));
            }
    float *y_ref = xmalloc((n + 1) * sizeof *y_ref), *mean_ref = xmalloc((n_rows + 1) * sizeof *mean_ref);
    float *rstd_ref = xmalloc((n_rows + 1) * sizeof *rstd_ref), *dx_ref = xmalloc((n + 1) * sizeof *dx_ref);
    float *dshift_ref = xmalloc((n_mod + 1) * sizeof *dshift_ref), *dscale_ref = xmalloc((n_mod + 1) * sizeof *dscale_ref);
    float *dprev_ref = xmalloc((n + 1) * sizeof *dprev_ref), *dgate_ref = xcalloc(n_mod + 1, sizeof *dgate_ref);
    cpu_ln_modulate_fwd(x_new, n_rows, dim, row_start, n_samples, shift, scale, kEps, y_ref, mean_ref, rstd_ref);
    cpu_ln_modulate_bwd(x_new, dy, n_rows, dim, row_start, n_samples, scale, mean_ref, rstd_ref, dx_ref, dshift_ref,
                        dscale_ref);
    for (int b = 0; b < n_samples; ++b)
        for (int64_t r = row_start[b]; r < row_start[b + 1]; ++r)
            for (int d = 0; d < dim; ++d) {
                const size_t i = (size_t)r * dim + d, m = (size_t)b * dim + d;
                if (with_residual_grad) dx_ref[i] += d_res[i];
                dprev_ref[i] = dx_ref[i] * gate[m];
                dgate_ref[m] += dx_ref[i] * y_prev[i];
            }

    int64_t *d_row_start = device_upload(row_start, (n_samples + 1) * sizeof *row_start);
    gpu_bf16 *d_x = device_upload(x_bits, n * sizeof *x_bits), *d_prev = device_upload(prev_bits, n * sizeof *prev_bits);
    gpu_bf16 *d_dy = device_upload(dy_bits, n * sizeof *dy_bits), *d_dres = device_upload(dres_bits, n * sizeof *dres_bits);
    float *d_gate = device_upload(gate, n_mod * sizeof *gate), *d_shift = device_upload(shift, n_mod * sizeof *shift);
    float *d_scale = device_upload(scale, n_mod * sizeof *scale);
    gpu_bf16 *d_x_new = in_place ? d_x : device_poisoned(n * sizeof *d_x_new);
    gpu_bf16 *d_y = device_poisoned(n * sizeof *d_y), *d_dx = device_poisoned(n * sizeof *d_dx);
    gpu_bf16 *d_dprev = device_poisoned(n * sizeof *d_dprev);
    float *d_mean = device_poisoned(n_rows * sizeof *d_mean), *d_rstd = device_poisoned(n_rows * sizeof *d_rstd);
    float *d_dshift = device_poisoned(n_mod * sizeof *d_dshift), *d_dscale = device_poisoned(n_mod * sizeof *d_dscale);
    float *d_dgate = device_poisoned(n_mod * sizeof *d_dgate);
    const size_t workspace_bytes = lnmod_residual_bwd_workspace_bytes(n_rows, dim, n_samples);
    void *d_workspace = device_poisoned(workspace_bytes);

    lnmod_residual_fwd(d_x, d_prev, n_rows, dim, d_row_start, n_samples, d_gate, d_shift, d_scale, kEps, d_x_new, d_y,
                       d_mean, d_rstd, 0);
    /* With a residual gradient, dx is written over it (the in-place use the API allows). */
    gpu_bf16 *d_dx_out = with_residual_grad ? d_dres : d_dx;
    lnmod_residual_bwd(d_x_new, d_prev, d_dy, with_residual_grad ? d_dres : NULL, n_rows, dim, d_row_start, n_samples,
                       d_gate, d_scale, d_mean, d_rstd, d_dx_out, d_dprev, d_dshift, d_dscale, d_dgate, d_workspace, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    char case_name[200];
    snprintf(case_name, sizeof case_name, "D=%d, %s%s%s", dim, l->name, in_place ? ", x_new over x" : "",
             with_residual_grad ? ", with d_x_new" : "");
    float *got = download_bf16(d_x_new, n);
    expect_close("lnmod_residual_fwd x_new", case_name, got, x_new, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_y, n);
    expect_close("lnmod_residual_fwd y", case_name, got, y_ref, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_rstd, n_rows);
    expect_close("lnmod_residual_fwd rstd", case_name, got, rstd_ref, n_rows, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dx_out, n);
    expect_close("lnmod_residual_bwd dx", case_name, got, dx_ref, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_bf16(d_dprev, n);
    expect_close("lnmod_residual_bwd dy_prev", case_name, got, dprev_ref, n, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_dshift, n_mod);
    expect_close("lnmod_residual_bwd dshift", case_name, got, dshift_ref, n_mod, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_dscale, n_mod);
    expect_close("lnmod_residual_bwd dscale", case_name, got, dscale_ref, n_mod, kTolerance, kNearZeroBound);
    free(got);
    got = download_f32(d_dgate, n_mod);
    expect_close("lnmod_residual_bwd dgate", case_name, got, dgate_ref, n_mod, kTolerance, kNearZeroBound);
    free(got);

    if (!in_place) CUDA_CHECK(cudaFree(d_x_new));
    void *device_buffers[] = {d_row_start, d_x, d_prev, d_dy, d_dres, d_gate, d_shift, d_scale, d_y, d_dx, d_dprev,
                              d_mean, d_rstd, d_dshift, d_dscale, d_dgate, d_workspace};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {x_bits, prev_bits, dy_bits, dres_bits, x, y_prev, dy, d_res, gate, shift, scale, x_new,
                            y_ref, mean_ref, rstd_ref, dx_ref, dshift_ref, dscale_ref, dprev_ref, dgate_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

static void run_layouts(int dim, int residual)
{
    const size_t n_small = sizeof kSmallLayouts / sizeof kSmallLayouts[0];
    const size_t n_long = sizeof kLongLayouts / sizeof kLongLayouts[0];
    for (size_t i = 0; i < n_small + (dim <= 3072 ? n_long : 0); ++i) {
        const layout *l = i < n_small ? &kSmallLayouts[i] : &kLongLayouts[i - n_small];
        if (residual) check_residual(l, dim, (int)(i % 3 == 1), (int)(i % 2 == 1));
        else check_plain(l, dim);
    }
}

#define DIM_TESTS(D)                                                  \
    static void test_plain_##D(void **state) { (void)state; run_layouts(D, 0); } \
    static void test_residual_##D(void **state) { (void)state; run_layouts(D, 1); }
DIM_TESTS(64)
DIM_TESTS(136)
DIM_TESTS(1536)
DIM_TESTS(3072)
DIM_TESTS(5120)
DIM_TESTS(8192)

/* Many small samples (0 to 20 rows each): sample boundaries inside nearly every row group. */
static void test_many_samples(void **state)
{
    (void)state;
    layout l = {"", 8, {0}};
    for (int round = 0; round < 4; ++round) {
        for (int b = 0; b < 8; ++b) l.rows[b] = (int)rng_below(&g_seed, 21);
        l.rows[round] += 1; /* never all empty */
        l.name = "8 samples of 0..20 rows";
        check_plain(&l, round % 2 ? 1536 : 5120);
        check_residual(&l, round % 2 ? 5120 : 1536, 0, 1);
    }
}

/* What lnmod_fwd_plan_for reports for rows of `dim`: the staged kernel with 1 stage (the register kernel only on a
   device whose block shared memory cannot hold that stage, not an H100/H200); a row group of 32 to 256 threads
   that covers the row, each thread holding at most 4 vectors in the plain forward and 8 in the residual one (up to
   4 in 256-thread groups, which take any row), and no narrower group would do. */
static void check_plan(int dim, int residual)
{
    const lnmod_fwd_plan plan = lnmod_fwd_plan_for(dim, residual);
    const char *what = residual ? "residual_fwd" : "fwd";
    if (plan.stages != 1 && plan.stages != LNMOD_FWD_REGISTER_KERNEL)
        fail_msg("%s plan (D=%d): %d stages, want 1 (or the register kernel)", what, dim, plan.stages);
    const int limit = residual ? 8 : 4;
    const int tpr = plan.threads_per_row, vpt = plan.vectors_per_thread, nvec = dim / 8;
    /* (the last test: half as many threads would hold at most `limit` vectors each) */
    if ((tpr != 32 && tpr != 64 && tpr != 128 && tpr != 256) || vpt < 1 || (vpt - 1) * tpr >= nvec ||
        tpr * vpt < nvec || vpt > (tpr == 256 ? 4 : limit) || (tpr > 32 && (nvec + tpr / 2 - 1) / (tpr / 2) <= limit))
        fail_msg("%s plan (D=%d, limit %d): %d threads x %d vectors", what, dim, limit, tpr, vpt);
}

/* The Wan widths' plans (lnmod.h): the staged kernel with 1 stage for both forwards, the plain one at most 4
   vectors a thread, the residual one 8; and the rules of check_plan at other widths. */
static void test_plans(void **state)
{
    (void)state;
    static const struct {
        int dim, residual;
        lnmod_fwd_plan plan;
    } expected[] = {
        {1536, 0, {1, 64, 3}}, {3072, 0, {1, 128, 3}}, {5120, 0, {1, 256, 3}},
        {1536, 1, {1, 32, 6}}, {3072, 1, {1, 64, 6}},  {5120, 1, {1, 128, 5}},
    };
    for (size_t k = 0; k < sizeof expected / sizeof expected[0]; ++k) {
        const lnmod_fwd_plan got = lnmod_fwd_plan_for(expected[k].dim, expected[k].residual);
        if (memcmp(&got, &expected[k].plan, sizeof got) != 0)
            fail_msg("%s plan (D=%d): %d stages, %d threads x %d vectors (want %d, %d x %d)",
                     expected[k].residual ? "residual_fwd" : "fwd", expected[k].dim, got.stages, got.threads_per_row,
                     got.vectors_per_thread, expected[k].plan.stages, expected[k].plan.threads_per_row,
                     expected[k].plan.vectors_per_thread);
    }
    static const int dims[] = {8, 64, 136, 1536, 2056, 3072, 5120, 8192};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; ++d) {
        check_plan(dims[d], 0);
        check_plan(dims[d], 1);
    }
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_64),      cmocka_unit_test(test_residual_64),
        cmocka_unit_test(test_plain_136),     cmocka_unit_test(test_residual_136),
        cmocka_unit_test(test_plain_1536),    cmocka_unit_test(test_residual_1536),
        cmocka_unit_test(test_plain_3072),    cmocka_unit_test(test_residual_3072),
        cmocka_unit_test(test_plain_5120),    cmocka_unit_test(test_residual_5120),
        cmocka_unit_test(test_plain_8192),    cmocka_unit_test(test_residual_8192),
        cmocka_unit_test(test_many_samples),  cmocka_unit_test(test_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
