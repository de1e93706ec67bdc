/* test_cuda_gemm.c — cmocka tests of the cuBLASLt linear layer (forward with bias / GELU epilogues, dx with and
   without the GELU gradient, fp32 dW and db accumulation) against cpu_linear_fwd/bwd and cpu_gelu_tanh_* on the same
   bf16-rounded inputs, through cuBLASLt's fused epilogues and through gemm.cu's own kernels, with autotuning on and
   off. */
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
#include "cuda/gemm.h"
#include "cuda/gpu.h"
#include "model/ops_cpu.h"
#include "core/rng.h"

static const double kBf16Tolerance = 1e-2; /* relative error ||gpu - cpu|| / ||cpu|| of bf16 outputs */
static const double kFp32Tolerance = 1e-4; /* dW, db: exact bf16 products summed in fp32 (a bf16 output: ~2e-3) */
static const double kNearZeroBound = 1e-6; /* the error's bound where the reference is ~0 */

/* A linear layer's shape; check_rows / check_outs: rows of y, dx and rows of dW compared against the CPU
   (half from the start, half from the end; 0 = all), which keeps the CPU reference of the large shapes small. */
typedef struct {
    const char *name;
    int64_t n_rows;
    int in_dim, out_dim;
    int64_t check_rows;
    int check_outs;
} shape;

static const shape kSmallShapes[] = {
    {"quick start: 37 rows, 64 -> 128", 37, 64, 128, 0, 0},
    {"1 row, 136 -> 72", 1, 136, 72, 0, 0},
    {"3 rows, 72 -> 136", 3, 72, 136, 0, 0},
    {"129 rows, 136 -> 264", 129, 136, 264, 0, 0},
    {"517 rows, 264 -> 40", 517, 264, 40, 0, 0},
};
static const shape kWanUp = {"Wan-1.3B FFN up: 1000 rows, 1536 -> 8960", 1000, 1536, 8960, 64, 64};
static const shape kWanDown = {"Wan-1.3B FFN down: 1000 rows, 8960 -> 1536", 1000, 8960, 1536, 64, 64};
static const shape kWanAttn = {"Wan-1.3B attention projection: 1000 rows, 1536 -> 1536", 1000, 1536, 1536, 64, 64};

static uint64_t g_seed = 0x6e6d6d5eedull;
static cudaStream_t g_stream = 0; /* the stream every GPU call of the checks goes on */
/* The contexts the checks run through: [0] plain GEMMs + gemm.cu's own epilogue kernels (the path of shapes without
   a fused algorithm), [1] cuBLASLt's fused epilogues (the model's). main makes them with autotuning on. */
static gemm_context *g_gemm[2];

/* Host tensor of uniform values with standard deviation `spread`, rounded to bf16, and its bf16 bits. */
static float *random_uniform_bf16(size_t n, double spread, gpu_bf16 **bits)
{
    float *values = xmalloc((n ? n : 1) * sizeof *values);
    *bits = xmalloc((n ? n : 1) * sizeof **bits);
    const double half_width = spread * 1.7320508075688772;
    for (size_t i = 0; i < n; ++i) {
        (*bits)[i] = gpu_bf16_from_float((float)(half_width * (2.0 * rng_uniform(&g_seed) - 1.0)));
        values[i] = gpu_float_from_bf16((*bits)[i]);
    }
    return values;
}

/* The indices compared out of n: all when check is 0 or >= n, else check/2 from the start and the rest from the end. */
static int64_t *checked_indices(int64_t n, int64_t check, int64_t *n_checked)
{
    *n_checked = check <= 0 || check >= n ? n : check;
    int64_t *index = xmalloc((size_t)(*n_checked ? *n_checked : 1) * sizeof *index);
    const int64_t head = *n_checked == n ? n : *n_checked / 2;
    for (int64_t i = 0; i < *n_checked; ++i) index[i] = i < head ? i : n - (*n_checked - i);
    return index;
}

/* Rows index[0..n_index) of a row-major [*, cols] matrix, packed. */
static float *gather_rows(const float *matrix, int cols, const int64_t *index, int64_t n_index)
{
    float *out = xmalloc((size_t)(n_index ? n_index : 1) * cols * sizeof *out);
    for (int64_t i = 0; i < n_index; ++i) memcpy(out + i * cols, matrix + index[i] * cols, (size_t)cols * sizeof *out);
    return out;
}

static void case_name_of(char *text, size_t capacity, const shape *s, const char *detail, int fused)
{
    static const char *const paths[] = {"own kernels", "fused epilogues"};
    snprintf(text, capacity, "%s, %s, %s", s->name, detail, paths[fused]);
}

/* Forward with each epilogue: y (and the GELU pre-activation) against cpu_linear_fwd (+ cpu_gelu_tanh_fwd). */
static void check_forward(const shape *s, gemm_epilogue epilogue)
{
    const int64_t rows = s->n_rows;
    const int in = s->in_dim, out = s->out_dim;
    const size_t n_x = (size_t)rows * in, n_y = (size_t)rows * out, n_w = (size_t)out * in;
    gpu_bf16 *x_bits, *w_bits, *b_bits;
    float *x = random_uniform_bf16(n_x, 1.0, &x_bits);
    float *w = random_uniform_bf16(n_w, 1.0 / sqrt((double)in), &w_bits);
    float *b = random_uniform_bf16((size_t)out, 0.5, &b_bits);
    const int gelu = epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS;

    int64_t n_check;
    int64_t *rows_checked = checked_indices(rows, s->check_rows, &n_check);
    float *x_sub = gather_rows(x, in, rows_checked, n_check);
    float *pre_ref = xmalloc((size_t)(n_check ? n_check : 1) * out * sizeof *pre_ref);
    float *y_ref = xmalloc((size_t)(n_check ? n_check : 1) * out * sizeof *y_ref);
    cpu_linear_fwd(x_sub, n_check, in, out, w, epilogue == GEMM_EPILOGUE_NONE ? NULL : b, pre_ref);
    if (gelu) cpu_gelu_tanh_fwd(pre_ref, n_check * out, y_ref);
    else memcpy(y_ref, pre_ref, (size_t)n_check * out * sizeof *y_ref);

    gpu_bf16 *d_x = device_upload(x_bits, n_x * sizeof *x_bits), *d_w = device_upload(w_bits, n_w * sizeof *w_bits);
    gpu_bf16 *d_b = device_upload(b_bits, (size_t)out * sizeof *b_bits);
    static const char *const names[] = {"no epilogue", "bias", "bias + GELU"};
    for (int fused = 1; fused >= 0; --fused) {
        char case_name[200];
        case_name_of(case_name, sizeof case_name, s, names[epilogue], fused);
        gpu_bf16 *d_y = device_poisoned(n_y * sizeof *d_y);
        gpu_bf16 *d_pre = gelu ? device_poisoned(n_y * sizeof *d_pre) : NULL;
        gemm_linear_fwd(g_gemm[fused], d_x, rows, in, out, d_w, epilogue == GEMM_EPILOGUE_NONE ? NULL : d_b, epilogue,
                        d_y, d_pre, g_stream);
        CUDA_CHECK(cudaDeviceSynchronize());
        float *got = download_bf16(d_y, n_y);
        expect_finite("gemm_linear_fwd y", case_name, got, n_y);
        float *got_sub = gather_rows(got, out, rows_checked, n_check);
        expect_close("gemm_linear_fwd y", case_name, got_sub, y_ref, (size_t)n_check * out, kBf16Tolerance,
                     kNearZeroBound);
        free(got), free(got_sub);
        if (gelu) {
            got = download_bf16(d_pre, n_y);
            expect_finite("gemm_linear_fwd pre_gelu", case_name, got, n_y);
            got_sub = gather_rows(got, out, rows_checked, n_check);
            expect_close("gemm_linear_fwd pre_gelu", case_name, got_sub, pre_ref, (size_t)n_check * out,
                         kBf16Tolerance, kNearZeroBound);
            free(got), free(got_sub);
            CUDA_CHECK(cudaFree(d_pre));
        }
        CUDA_CHECK(cudaFree(d_y));
    }
    void *host[] = {x_bits, w_bits, b_bits, x, w, b, rows_checked, x_sub, pre_ref, y_ref};
    void *device[] = {d_x, d_w, d_b};
    free_host_buffers(host, sizeof host / sizeof *host);
    free_device_buffers(device, sizeof device / sizeof *device);
}

/* dx = dy W, optionally times gelu'(gelu_input) or added into an existing dx. */
static void check_backward_data(const shape *s, int with_gelu, int accumulate)
{
    const int64_t rows = s->n_rows;
    const int in = s->in_dim, out = s->out_dim;
    const size_t n_x = (size_t)rows * in, n_y = (size_t)rows * out, n_w = (size_t)out * in;
    gpu_bf16 *dy_bits, *w_bits, *gin_bits, *dx0_bits;
    float *dy = random_uniform_bf16(n_y, 1.0, &dy_bits);
    float *w = random_uniform_bf16(n_w, 1.0 / sqrt((double)out), &w_bits);
    float *gelu_input = random_uniform_bf16(with_gelu ? n_x : 0, 1.5, &gin_bits);
    float *dx0 = random_uniform_bf16(accumulate ? n_x : 0, 1.0, &dx0_bits);

    int64_t n_check;
    int64_t *rows_checked = checked_indices(rows, s->check_rows, &n_check);
    float *w_t = xmalloc(n_w * sizeof *w_t); /* [in, out]: dx = dy · W is a forward with weight W^T */
    for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) w_t[(size_t)i * out + o] = w[(size_t)o * in + i];
    float *dy_sub = gather_rows(dy, out, rows_checked, n_check);
    float *dx_ref = xmalloc((size_t)(n_check ? n_check : 1) * in * sizeof *dx_ref);
    cpu_linear_fwd(dy_sub, n_check, out, in, w_t, NULL, dx_ref);
    if (with_gelu) {
        float *gin_sub = gather_rows(gelu_input, in, rows_checked, n_check);
        cpu_gelu_tanh_bwd(gin_sub, dx_ref, n_check * in, dx_ref);
        free(gin_sub);
    }
    if (accumulate) {
        float *dx0_sub = gather_rows(dx0, in, rows_checked, n_check);
        for (size_t i = 0; i < (size_t)n_check * in; ++i) dx_ref[i] += dx0_sub[i];
        free(dx0_sub);
    }

    gpu_bf16 *d_dy = device_upload(dy_bits, n_y * sizeof *dy_bits), *d_w = device_upload(w_bits, n_w * sizeof *w_bits);
    gpu_bf16 *d_gin = device_upload(gin_bits, (with_gelu ? n_x : 0) * sizeof *gin_bits);
    for (int fused = 1; fused >= 0; --fused) {
        char case_name[200];
        case_name_of(case_name, sizeof case_name, s,
                     with_gelu ? "GELU gradient" : accumulate ? "added into dx" : "plain", fused);
        gpu_bf16 *d_dx =
            accumulate ? device_upload(dx0_bits, n_x * sizeof *dx0_bits) : device_poisoned(n_x * sizeof *d_dx);
        gemm_linear_bwd_data(g_gemm[fused], d_dy, rows, in, out, d_w, with_gelu ? d_gin : NULL, d_dx, accumulate,
                             g_stream);
        CUDA_CHECK(cudaDeviceSynchronize());
        float *got = download_bf16(d_dx, n_x);
        expect_finite("gemm_linear_bwd_data dx", case_name, got, n_x);
        float *got_sub = gather_rows(got, in, rows_checked, n_check);
        expect_close("gemm_linear_bwd_data dx", case_name, got_sub, dx_ref, (size_t)n_check * in, kBf16Tolerance,
                     kNearZeroBound);
        free(got), free(got_sub);
        CUDA_CHECK(cudaFree(d_dx));
    }
    void *host[] = {dy_bits, w_bits, gin_bits, dx0_bits, dy, w, gelu_input, dx0, rows_checked, w_t, dy_sub, dx_ref};
    void *device[] = {d_dy, d_w, d_gin};
    free_host_buffers(host, sizeof host / sizeof *host);
    free_device_buffers(device, sizeof device / sizeof *device);
}

/* dW = dy^T x and db = column sums of dy in fp32: overwritten into NaN-poisoned buffers, or accumulated twice
   (two micro-batches) onto existing values of the same size as one contribution. */
static void check_backward_weight(const shape *s, int with_bias, int accumulate)
{
    const int64_t rows = s->n_rows;
    const int in = s->in_dim, out = s->out_dim;
    const size_t n_x = (size_t)rows * in, n_y = (size_t)rows * out, n_w = (size_t)out * in;
    gpu_bf16 *x_bits, *dy_bits;
    float *x = random_uniform_bf16(n_x, 1.0, &x_bits);
    float *dy = random_uniform_bf16(n_y, 1.0, &dy_bits);
    const double contribution = sqrt((double)(rows > 0 ? rows : 1)); /* spread of one dy^T x entry */
    float *dw0 = random_normal_f32(&g_seed, accumulate ? n_w : 0, 0.0, contribution);
    float *db0 = random_normal_f32(&g_seed, accumulate ? (size_t)out : 0, 0.0, contribution);

    int64_t n_check;
    int64_t *outs_checked = checked_indices(out, s->check_outs, &n_check);
    const int outs = (int)n_check;
    float *dy_cols = xmalloc((n_y ? n_y : 1) * sizeof *dy_cols); /* dy's checked columns, [rows, outs] */
    for (int64_t r = 0; r < rows; ++r)
        for (int j = 0; j < outs; ++j) dy_cols[r * outs + j] = dy[r * out + outs_checked[j]];
    float *dw_ref = xcalloc((size_t)outs * in, sizeof *dw_ref), *db_ref = xcalloc((size_t)outs, sizeof *db_ref);
    cpu_linear_bwd(x, dy_cols, rows, in, outs, NULL, NULL, 0, dw_ref, db_ref);
    const int n_calls = accumulate ? 2 : 1;
    for (int j = 0; j < outs; ++j) {
        const int64_t o = outs_checked[j];
        for (int i = 0; i < in; ++i)
            dw_ref[(size_t)j * in + i] = n_calls * dw_ref[(size_t)j * in + i] + (accumulate ? dw0[o * in + i] : 0.0f);
        db_ref[j] = n_calls * db_ref[j] + (accumulate ? db0[o] : 0.0f);
    }

    gpu_bf16 *d_x = device_upload(x_bits, n_x * sizeof *x_bits), *d_dy = device_upload(dy_bits, n_y * sizeof *dy_bits);
    for (int fused = 1; fused >= 0; --fused) {
        char case_name[200];
        case_name_of(case_name, sizeof case_name, s,
                     accumulate ? (with_bias ? "dW, db accumulated twice" : "dW accumulated twice")
                                : (with_bias ? "dW, db overwritten" : "dW overwritten"), fused);
        float *d_dw = accumulate ? device_upload(dw0, n_w * sizeof *dw0) : device_poisoned(n_w * sizeof *d_dw);
        float *d_db = with_bias ? (accumulate ? device_upload(db0, (size_t)out * sizeof *db0)
                                              : device_poisoned((size_t)out * sizeof *d_db))
                                : NULL;
        for (int call = 0; call < n_calls; ++call)
            gemm_linear_bwd_weight(g_gemm[fused], d_x, d_dy, rows, in, out, d_dw, d_db, accumulate, g_stream);
        CUDA_CHECK(cudaDeviceSynchronize());
        float *got = download_f32(d_dw, n_w);
        expect_finite("gemm_linear_bwd_weight dweight", case_name, got, n_w);
        float *got_sub = gather_rows(got, in, outs_checked, outs);
        expect_close("gemm_linear_bwd_weight dweight", case_name, got_sub, dw_ref, (size_t)outs * in, kFp32Tolerance,
                     kNearZeroBound);
        free(got), free(got_sub);
        if (with_bias) {
            got = download_f32(d_db, (size_t)out);
            got_sub = gather_rows(got, 1, outs_checked, outs);
            expect_close("gemm_linear_bwd_weight dbias", case_name, got_sub, db_ref, (size_t)outs, kFp32Tolerance,
                         kNearZeroBound);
            free(got), free(got_sub);
            CUDA_CHECK(cudaFree(d_db));
        }
        CUDA_CHECK(cudaFree(d_dw));
    }
    void *host[] = {x_bits, dy_bits, x, dy, dw0, db0, outs_checked, dy_cols, dw_ref, db_ref};
    void *device[] = {d_x, d_dy};
    free_host_buffers(host, sizeof host / sizeof *host);
    free_device_buffers(device, sizeof device / sizeof *device);
}

/* Every path of one shape. */
static void check_all_paths(const shape *s)
{
    for (int e = GEMM_EPILOGUE_NONE; e <= GEMM_EPILOGUE_GELU_AUX_BIAS; ++e) check_forward(s, (gemm_epilogue)e);
    check_backward_data(s, 0, 0);
    check_backward_data(s, 0, 1);
    check_backward_data(s, 1, 0);
    for (int with_bias = 0; with_bias <= 1; ++with_bias)
        for (int accumulate = 0; accumulate <= 1; ++accumulate) check_backward_weight(s, with_bias, accumulate);
}

static void test_small_shapes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kSmallShapes / sizeof kSmallShapes[0]; ++i) check_all_paths(&kSmallShapes[i]);
}

/* The FFN of a Wan-1.3B block on 1000 rows: up with bias + GELU, down with bias, the GELU gradient in the down
   layer's dx, both weight gradients with their biases; and a 1536 x 1536 projection. */
static void test_wan_ffn(void **state)
{
    (void)state;
    check_forward(&kWanUp, GEMM_EPILOGUE_GELU_AUX_BIAS);
    check_forward(&kWanDown, GEMM_EPILOGUE_BIAS);
    check_backward_data(&kWanDown, 1, 0);
    check_backward_data(&kWanUp, 0, 0);
    check_backward_weight(&kWanUp, 1, 1);
    check_backward_weight(&kWanDown, 1, 0);
}

static void test_wan_attention(void **state)
{
    (void)state;
    check_forward(&kWanAttn, GEMM_EPILOGUE_BIAS);
    check_backward_data(&kWanAttn, 0, 1);
    check_backward_weight(&kWanAttn, 1, 1);
}

/* No rows: nothing written by the forward and dx; dW and db zeroed when overwriting, untouched when adding. */
static void test_empty_batch(void **state)
{
    (void)state;
    const int in = 64, out = 128;
    const size_t n_w = (size_t)out * in;
    float *dw0 = random_normal_f32(&g_seed, n_w, 0.0, 1.0), *db0 = random_normal_f32(&g_seed, (size_t)out, 0.0, 1.0);
    gpu_bf16 *d_w = device_poisoned(n_w * sizeof *d_w), *d_act = device_poisoned(16 * sizeof *d_act);
    float *d_dw = device_upload(dw0, n_w * sizeof *dw0), *d_db = device_upload(db0, (size_t)out * sizeof *db0);
    gemm_linear_fwd(g_gemm[1], d_act, 0, in, out, d_w, d_w, GEMM_EPILOGUE_BIAS, d_act, NULL, g_stream);
    gemm_linear_bwd_data(g_gemm[1], d_act, 0, in, out, d_w, NULL, d_act, 0, g_stream);
    gemm_linear_bwd_weight(g_gemm[1], d_act, d_act, 0, in, out, d_dw, d_db, 1, g_stream);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *got = download_f32(d_dw, n_w);
    assert_memory_equal(got, dw0, n_w * sizeof *got);
    free(got);
    got = download_f32(d_db, (size_t)out);
    assert_memory_equal(got, db0, (size_t)out * sizeof *got);
    free(got);
    gemm_linear_bwd_weight(g_gemm[1], d_act, d_act, 0, in, out, d_dw, d_db, 0, g_stream);
    CUDA_CHECK(cudaDeviceSynchronize());
    got = download_f32(d_dw, n_w);
    for (size_t i = 0; i < n_w; ++i) assert_true(got[i] == 0.0f);
    free(got);
    got = download_f32(d_db, (size_t)out);
    for (int i = 0; i < out; ++i) assert_true(got[i] == 0.0f);
    free(got);
    void *host[] = {dw0, db0};
    void *device[] = {d_w, d_act, d_dw, d_db};
    free_host_buffers(host, 2);
    free_device_buffers(device, 4);
}

static void test_supported_shapes(void **state)
{
    (void)state;
    assert_true(gemm_linear_supported(64, 128));
    assert_true(gemm_linear_supported(8960, 1536));
    assert_false(gemm_linear_supported(60, 128));
    assert_false(gemm_linear_supported(64, 4));
    assert_false(gemm_linear_supported(0, 8));
}

/* The FLOP counter counts 2·m·n·k per GEMM, and a second call of one shape reuses its cached plan. */
static void test_stats_and_plan_cache(void **state)
{
    (void)state;
    const int64_t rows = 45;
    const int in = 128, out = 256;
    gpu_bf16 *d_x = device_poisoned((size_t)rows * in * 2), *d_w = device_poisoned((size_t)out * in * 2);
    gpu_bf16 *d_b = device_poisoned((size_t)out * 2), *d_y = device_poisoned((size_t)rows * out * 2);
    CUDA_CHECK(cudaMemset(d_x, 0, (size_t)rows * in * 2));
    CUDA_CHECK(cudaMemset(d_w, 0, (size_t)out * in * 2));
    CUDA_CHECK(cudaMemset(d_b, 0, (size_t)out * 2));
    gemm_stats start, before, after;
    gemm_get_stats(g_gemm[1], &start);
    gemm_linear_fwd(g_gemm[1], d_x, rows, in, out, d_w, d_b, GEMM_EPILOGUE_BIAS, d_y, NULL, g_stream);
    gemm_get_stats(g_gemm[1], &before);
    assert_int_equal(before.gemms, start.gemms + 1);
    assert_true(before.flops - start.flops == gemm_linear_flops(rows, in, out));
    gemm_linear_fwd(g_gemm[1], d_x, rows, in, out, d_w, d_b, GEMM_EPILOGUE_BIAS, d_y, NULL, g_stream);
    gemm_get_stats(g_gemm[1], &after);
    assert_int_equal(after.gemms, before.gemms + 1);
    assert_int_equal(after.heuristic_queries, before.heuristic_queries);
    gemm_linear_fwd(g_gemm[1], d_x, rows - 1, in, out, d_w, d_b, GEMM_EPILOGUE_BIAS, d_y, NULL, g_stream);
    gemm_get_stats(g_gemm[1], &after);
    assert_int_equal(after.heuristic_queries, before.heuristic_queries + 1);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *got = download_bf16(d_y, (size_t)rows * out);
    for (size_t i = 0; i < (size_t)rows * out; ++i) assert_true(got[i] == 0.0f);
    free(got);
    void *device[] = {d_x, d_w, d_b, d_y};
    free_device_buffers(device, 4);
}

/* Calls alternating between two non-blocking streams (the shared workspace is ordered by an event). */
static void test_two_streams(void **state)
{
    (void)state;
    cudaStream_t streams[2];
    for (int i = 0; i < 2; ++i) CUDA_CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    for (int round = 0; round < 2; ++round) {
        g_stream = streams[round];
        check_forward(&kSmallShapes[0], GEMM_EPILOGUE_GELU_AUX_BIAS);
        g_stream = streams[1 - round];
        check_backward_weight(&kSmallShapes[3], 1, 1);
    }
    g_stream = 0;
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 2; ++i) CUDA_CHECK(cudaStreamDestroy(streams[i]));
}

/* With autotuning off (gemm_create's autotune = 0, as in a default run; main turns it on for the tests above), the
   heuristic's first algorithms give the same results within tolerance, and no plan is timed. */
static void test_autotune_off(void **state)
{
    (void)state;
    gemm_context *tuned[2] = {g_gemm[0], g_gemm[1]};
    for (int fused = 0; fused < 2; ++fused) g_gemm[fused] = gemm_create(0, fused);
    check_forward(&kWanAttn, GEMM_EPILOGUE_BIAS);
    check_backward_data(&kWanDown, 1, 0);
    check_backward_weight(&kWanAttn, 1, 1);
    for (int fused = 0; fused < 2; ++fused) {
        gemm_stats stats;
        gemm_get_stats(g_gemm[fused], &stats);
        assert_int_equal(stats.tuned, 0);
        assert_true(stats.heuristic_queries > 0);
        gemm_free(g_gemm[fused]);
        g_gemm[fused] = tuned[fused];
    }
}

/* A TAP comment on which path cuBLASLt took (fused epilogues it had no algorithm for fall back to the own kernels,
   which the tests above check too), the counters reset, then the contexts freed. */
static void test_report_and_free(void **state)
{
    (void)state;
    for (int fused = 1; fused >= 0; --fused) {
        gemm_stats stats;
        gemm_get_stats(g_gemm[fused], &stats);
        printf("# gemm, %s: %lld cuBLASLt calls, %lld plans built, %lld calls without the fused epilogue they asked "
               "for; %lld plans autotuned (%lld to another than the heuristic's first choice), %lld left untuned for "
               "want of memory\n", fused ? "fused epilogues" : "own kernels", (long long)stats.gemms,
               (long long)stats.heuristic_queries, (long long)stats.unfused, (long long)stats.tuned,
               (long long)stats.tuned_not_first, (long long)stats.untuned);
        assert_true(stats.gemms > 0);
        assert_true(fused || stats.unfused == 0);
        gemm_reset_stats(g_gemm[fused]);
        gemm_get_stats(g_gemm[fused], &stats);
        assert_int_equal(stats.gemms, 0);
        gemm_free(g_gemm[fused]);
        g_gemm[fused] = NULL;
    }
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    /* the tuned plans are the ones to check; test_autotune_off checks the heuristic's first */
    for (int fused = 0; fused < 2; ++fused) g_gemm[fused] = gemm_create(1, fused);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supported_shapes), cmocka_unit_test(test_small_shapes),
        cmocka_unit_test(test_wan_ffn),          cmocka_unit_test(test_wan_attention),
        cmocka_unit_test(test_empty_batch),      cmocka_unit_test(test_stats_and_plan_cache),
        cmocka_unit_test(test_two_streams),      cmocka_unit_test(test_autotune_off),
        cmocka_unit_test(test_report_and_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
