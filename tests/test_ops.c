/* test_ops.c — every CPU op: backward checked by central finite differences, forward checked on hand-computed cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/ops_cpu.h"
#include "gradient_check.h"

#define STEP 1e-2f        /* finite-difference step */
#define MAX_CHECKS 400    /* entries checked per tensor */

static float *random_array(int64_t n, uint64_t seed, float scale)
{
    float *values = malloc((size_t)n * sizeof(float));
    assert_non_null(values);
    fill_random(values, n, seed, scale);
    return values;
}

static float *zero_array(int64_t n)
{
    float *values = calloc((size_t)n, sizeof(float));
    assert_non_null(values);
    return values;
}

/* ---- linear ------------------------------------------------------------------------------------- */

typedef struct { float *x, *weight, *bias, *y, *out_weight; int64_t n_rows; int in_dim, out_dim; } linear_case;

static double linear_objective(void *context)
{
    linear_case *t = context;
    cpu_linear_fwd(t->x, t->n_rows, t->in_dim, t->out_dim, t->weight, t->bias, t->y);
    return weighted_sum(t->y, t->out_weight, t->n_rows * t->out_dim);
}

/* cpu_copy: every byte in place, below its parallel size, at it and past it with a tail shorter than a piece, and at
   an odd offset; on 1 and on 4 threads (the last test: it leaves 4 set). */
static void test_copy(void **state)
{
    (void)state;
    const size_t sizes[] = {0, 1, 4097, (size_t)8 << 20, ((size_t)9 << 20) + 12345};
    for (int threads = 1; threads <= 4; threads += 3) {
        cpu_set_threads(threads);
        for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
            const size_t n = sizes[c];
            unsigned char *src = malloc(n + 1), *dst = malloc(n + 3);
            assert_non_null(src);
            assert_non_null(dst);
            for (size_t i = 0; i < n + 1; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
            memset(dst, 0xa5, n + 3);
            cpu_copy(dst + 1, src + 1, n);
            assert_true(dst[0] == 0xa5 && dst[n + 1] == 0xa5 && dst[n + 2] == 0xa5);
            assert_memory_equal(dst + 1, src + 1, n);
            free(src);
            free(dst);
        }
    }
}

static void test_linear(void **state)
{
    (void)state;
    linear_case t = {.n_rows = 5, .in_dim = 7, .out_dim = 6};
    t.x = random_array(t.n_rows * t.in_dim, 1, 1.0f);
    t.weight = random_array(t.out_dim * t.in_dim, 2, 1.0f);
    t.bias = random_array(t.out_dim, 3, 1.0f);
    t.out_weight = random_array(t.n_rows * t.out_dim, 4, 1.0f);
    t.y = zero_array(t.n_rows * t.out_dim);
    float *dx = zero_array(t.n_rows * t.in_dim), *dweight = zero_array(t.out_dim * t.in_dim);
    float *dbias = zero_array(t.out_dim);
    cpu_linear_bwd(t.x, t.out_weight, t.n_rows, t.in_dim, t.out_dim, t.weight, dx, 0, dweight, dbias);
    ASSERT_GRADIENT("linear dx", gradient_error(linear_objective, &t, t.x, dx, t.n_rows * t.in_dim, MAX_CHECKS, STEP, 5));
    ASSERT_GRADIENT("linear dweight",
                    gradient_error(linear_objective, &t, t.weight, dweight, t.out_dim * t.in_dim, MAX_CHECKS, STEP, 6));
    ASSERT_GRADIENT("linear dbias", gradient_error(linear_objective, &t, t.bias, dbias, t.out_dim, MAX_CHECKS, STEP, 7));

    /* parameter gradients and (on request) dx accumulate */
    float *dx2 = malloc((size_t)(t.n_rows * t.in_dim) * sizeof(float));
    float *dweight2 = malloc((size_t)(t.out_dim * t.in_dim) * sizeof(float)), *dbias2 = malloc((size_t)t.out_dim * sizeof(float));
    for (int64_t i = 0; i < t.n_rows * t.in_dim; i++) dx2[i] = 2.0f;
    for (int64_t i = 0; i < t.out_dim * t.in_dim; i++) dweight2[i] = 1.0f;
    for (int i = 0; i < t.out_dim; i++) dbias2[i] = -1.0f;
    cpu_linear_bwd(t.x, t.out_weight, t.n_rows, t.in_dim, t.out_dim, t.weight, dx2, 1, dweight2, dbias2);
    for (int64_t i = 0; i < t.n_rows * t.in_dim; i++) assert_float_equal(dx2[i], 2.0f + dx[i], 1e-5);
    for (int64_t i = 0; i < t.out_dim * t.in_dim; i++) assert_float_equal(dweight2[i], 1.0f + dweight[i], 1e-5);
    for (int i = 0; i < t.out_dim; i++) assert_float_equal(dbias2[i], -1.0f + dbias[i], 1e-5);

    /* y = x W^T + b by hand */
    const float x[2] = {1, 2}, weight[6] = {1, 0, 0, 1, 1, 1}, bias[3] = {0.5f, 0, -1};
    float y[3];
    cpu_linear_fwd(x, 1, 2, 3, weight, bias, y);
    assert_float_equal(y[0], 1.5f, 0);
    assert_float_equal(y[1], 2.0f, 0);
    assert_float_equal(y[2], 2.0f, 0);
    free(t.x); free(t.weight); free(t.bias); free(t.out_weight); free(t.y);
    free(dx); free(dweight); free(dbias); free(dx2); free(dweight2); free(dbias2);
}

/* A gradient check must fail on a wrong gradient: scaled by 5%, or two entries swapped (a layout bug). */
static void test_wrong_gradient_fails(void **state)
{
    (void)state;
    linear_case t = {.n_rows = 4, .in_dim = 5, .out_dim = 3};
    t.x = random_array(t.n_rows * t.in_dim, 11, 1.0f);
    t.weight = random_array(t.out_dim * t.in_dim, 12, 1.0f);
    t.bias = random_array(t.out_dim, 13, 1.0f);
    t.out_weight = random_array(t.n_rows * t.out_dim, 14, 1.0f);
    t.y = zero_array(t.n_rows * t.out_dim);
    int64_t n = t.out_dim * t.in_dim;
    float *dweight = zero_array(n);
    cpu_linear_bwd(t.x, t.out_weight, t.n_rows, t.in_dim, t.out_dim, t.weight, NULL, 0, dweight, NULL);
    ASSERT_GRADIENT("linear dweight (right)", gradient_error(linear_objective, &t, t.weight, dweight, n, MAX_CHECKS, STEP, 1));
    for (int64_t i = 0; i < n; i++) dweight[i] *= 1.05f;
    double scaled = gradient_error(linear_objective, &t, t.weight, dweight, n, MAX_CHECKS, STEP, 1);
    for (int64_t i = 0; i < n; i++) dweight[i] /= 1.05f;
    float swap = dweight[0];
    dweight[0] = dweight[1];
    dweight[1] = swap;
    double swapped = gradient_error(linear_objective, &t, t.weight, dweight, n, MAX_CHECKS, STEP, 1);
    print_message("# wrong gradients: scaled %.2e, swapped %.2e (must be >= %.0e)\n", scaled, swapped,
                  GRADIENT_TOLERANCE);
    assert_true(scaled >= GRADIENT_TOLERANCE);
    assert_true(swapped >= GRADIENT_TOLERANCE);
    free(t.x); free(t.weight); free(t.bias); free(t.out_weight); free(t.y); free(dweight);
}

/* ---- elementwise activations -------------------------------------------------------------------- */

typedef struct { float *x, *y, *out_weight; int64_t n; void (*forward)(const float *, int64_t, float *); } unary_case;

static double unary_objective(void *context)
{
    unary_case *t = context;
    t->forward(t->x, t->n, t->y);
    return weighted_sum(t->y, t->out_weight, t->n);
}

static void check_unary(const char *what, void (*forward)(const float *, int64_t, float *),
                        void (*backward)(const float *, const float *, int64_t, float *))
{
    unary_case t = {.n = 64, .forward = forward};
    t.x = random_array(t.n, 21, 4.0f);
    t.out_weight = random_array(t.n, 22, 1.0f);
    t.y = zero_array(t.n);
    float *dx = zero_array(t.n);
    backward(t.x, t.out_weight, t.n, dx);
    ASSERT_GRADIENT(what, gradient_error(unary_objective, &t, t.x, dx, t.n, MAX_CHECKS, 1e-3f, 23));
    free(t.x); free(t.y); free(t.out_weight); free(dx);
}

static void test_gelu_tanh(void **state)
{
    (void)state;
    check_unary("gelu_tanh dx", cpu_gelu_tanh_fwd, cpu_gelu_tanh_bwd);
    const float x[4] = {0.0f, 1.0f, -1.0f, 10.0f};
    float y[4];
    cpu_gelu_tanh_fwd(x, 4, y);
    assert_float_equal(y[0], 0.0f, 0);
    assert_float_equal(y[1], 0.841192f, 1e-5);    /* 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) */
    assert_float_equal(y[2], -0.158808f, 1e-5);
    assert_float_equal(y[3], 10.0f, 1e-5);
}

static void test_gelu_erf(void **state)
{
    (void)state;
    check_unary("gelu_erf dx", cpu_gelu_erf_fwd, cpu_gelu_erf_bwd);
    const float x[4] = {0.0f, 1.0f, -1.0f, 10.0f};
    float y[4];
    cpu_gelu_erf_fwd(x, 4, y);
    assert_float_equal(y[0], 0.0f, 0);
    assert_float_equal(y[1], 0.8413447f, 1e-6);   /* Phi(1), not the tanh form's 0.841192 */
    assert_float_equal(y[2], -0.1586553f, 1e-6);
    assert_float_equal(y[3], 10.0f, 1e-5);
}

static void test_silu(void **state)
{
    (void)state;
    check_unary("silu dx", cpu_silu_fwd, cpu_silu_bwd);
    const float x[2] = {0.0f, 1.0f};
    float y[2];
    cpu_silu_fwd(x, 2, y);
    assert_float_equal(y[0], 0.0f, 0);
    assert_float_equal(y[1], 0.7310586f, 1e-6);
}

/* ---- LayerNorm, LayerNorm-modulate, RMSNorm ----------------------------------------------------- */

typedef struct { float *x, *weight, *bias, *y, *mean, *rstd, *out_weight; int64_t n_rows; int dim; } norm_case;

static double layernorm_objective(void *context)
{
    norm_case *t = context;
    cpu_layernorm_fwd(t->x, t->n_rows, t->dim, t->weight, t->bias, 1e-6f, t->y, t->mean, t->rstd);
    return weighted_sum(t->y, t->out_weight, t->n_rows * t->dim);
}

static void check_layernorm(int affine, int dim)
{
    norm_case t = {.n_rows = 4, .dim = dim};
    int64_t n = t.n_rows * dim;
    t.x = random_array(n, 31, 2.0f);
    for (int64_t i = 0; i < n; i++) t.x[i] += 0.5f;   /* a non-zero mean */
    t.weight = affine ? random_array(dim, 32, 1.0f) : NULL;
    t.bias = affine ? random_array(dim, 33, 1.0f) : NULL;
    t.out_weight = random_array(n, 34, 1.0f);
    t.y = zero_array(n);
    t.mean = zero_array(t.n_rows);
    t.rstd = zero_array(t.n_rows);
    float *dx = zero_array(n), *dweight = zero_array(dim), *dbias = zero_array(dim);
    layernorm_objective(&t);
    cpu_layernorm_bwd(t.x, t.out_weight, t.n_rows, dim, t.weight, t.mean, t.rstd, dx, dweight, dbias);
    ASSERT_GRADIENT(affine ? "layernorm (affine) dx" : "layernorm dx",
                    gradient_error(layernorm_objective, &t, t.x, dx, n, MAX_CHECKS, STEP, 35));
    if (affine) {
        ASSERT_GRADIENT("layernorm dweight", gradient_error(layernorm_objective, &t, t.weight, dweight, dim, MAX_CHECKS, STEP, 36));
        ASSERT_GRADIENT("layernorm dbias", gradient_error(layernorm_objective, &t, t.bias, dbias, dim, MAX_CHECKS, STEP, 37));
    }
    /* without affine: each row has mean 0 and variance 1 (up to eps) */
    if (!affine)
        for (int64_t r = 0; r < t.n_rows; r++) {
            double sum = 0, sum_sq = 0;
            for (int c = 0; c < dim; c++) {
                sum += t.y[r * dim + c];
                sum_sq += (double)t.y[r * dim + c] * t.y[r * dim + c];
            }
            assert_true(fabs(sum / dim) < 1e-5);
            assert_true(fabs(sum_sq / dim - 1.0) < 1e-4);
        }
    free(t.x); free(t.weight); free(t.bias); free(t.out_weight); free(t.y); free(t.mean); free(t.rstd);
    free(dx); free(dweight); free(dbias);
}

static void test_layernorm(void **state)
{
    (void)state;
    check_layernorm(0, 10);
    check_layernorm(1, 70);   /* more than one block of the column reduction */
}

typedef struct {
    float *x, *shift, *scale, *y, *mean, *rstd, *out_weight;
    int64_t n_rows; int dim, n_samples; const int64_t *row_start;
} modulate_case;

static double ln_modulate_objective(void *context)
{
    modulate_case *t = context;
    cpu_ln_modulate_fwd(t->x, t->n_rows, t->dim, t->row_start, t->n_samples, t->shift, t->scale, 1e-6f, t->y,
                        t->mean, t->rstd);
    return weighted_sum(t->y, t->out_weight, t->n_rows * t->dim);
}

static void test_ln_modulate(void **state)
{
    (void)state;
    static const int64_t row_start[4] = {0, 3, 4, 8};
    modulate_case t = {.n_rows = 8, .dim = 9, .n_samples = 3, .row_start = row_start};
    int64_t n = t.n_rows * t.dim, n_mod = (int64_t)t.n_samples * t.dim;
    t.x = random_array(n, 41, 2.0f);
    t.shift = random_array(n_mod, 42, 1.0f);
    t.scale = random_array(n_mod, 43, 1.0f);
    t.out_weight = random_array(n, 44, 1.0f);
    t.y = zero_array(n);
    t.mean = zero_array(t.n_rows);
    t.rstd = zero_array(t.n_rows);
    float *dx = zero_array(n), *dshift = zero_array(n_mod), *dscale = zero_array(n_mod);
    ln_modulate_objective(&t);
    cpu_ln_modulate_bwd(t.x, t.out_weight, t.n_rows, t.dim, row_start, t.n_samples, t.scale, t.mean, t.rstd, dx,
                        dshift, dscale);
    ASSERT_GRADIENT("ln_modulate dx", gradient_error(ln_modulate_objective, &t, t.x, dx, n, MAX_CHECKS, STEP, 45));
    ASSERT_GRADIENT("ln_modulate dshift", gradient_error(ln_modulate_objective, &t, t.shift, dshift, n_mod, MAX_CHECKS, STEP, 46));
    ASSERT_GRADIENT("ln_modulate dscale", gradient_error(ln_modulate_objective, &t, t.scale, dscale, n_mod, MAX_CHECKS, STEP, 47));

    /* zero shift and scale: exactly LayerNorm without affine */
    memset(t.shift, 0, (size_t)n_mod * sizeof(float));
    memset(t.scale, 0, (size_t)n_mod * sizeof(float));
    ln_modulate_objective(&t);
    float *plain = zero_array(n), *mean = zero_array(t.n_rows), *rstd = zero_array(t.n_rows);
    cpu_layernorm_fwd(t.x, t.n_rows, t.dim, NULL, NULL, 1e-6f, plain, mean, rstd);
    assert_memory_equal(plain, t.y, (size_t)n * sizeof(float));
    free(t.x); free(t.shift); free(t.scale); free(t.out_weight); free(t.y); free(t.mean); free(t.rstd);
    free(dx); free(dshift); free(dscale); free(plain); free(mean); free(rstd);
}

static double rmsnorm_objective(void *context)
{
    norm_case *t = context;
    cpu_rmsnorm_fwd(t->x, t->n_rows, t->dim, t->weight, 1e-6f, t->y, t->rstd);
    return weighted_sum(t->y, t->out_weight, t->n_rows * t->dim);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    norm_case t = {.n_rows = 5, .dim = 8};
    int64_t n = t.n_rows * t.dim;
    t.x = random_array(n, 51, 2.0f);
    t.weight = random_array(t.dim, 52, 1.0f);
    t.out_weight = random_array(n, 53, 1.0f);
    t.y = zero_array(n);
    t.rstd = zero_array(t.n_rows);
    float *dx = zero_array(n), *dweight = zero_array(t.dim);
    rmsnorm_objective(&t);
    cpu_rmsnorm_bwd(t.x, t.out_weight, t.n_rows, t.dim, t.weight, t.rstd, dx, dweight);
    ASSERT_GRADIENT("rmsnorm dx", gradient_error(rmsnorm_objective, &t, t.x, dx, n, MAX_CHECKS, STEP, 54));
    ASSERT_GRADIENT("rmsnorm dweight", gradient_error(rmsnorm_objective, &t, t.weight, dweight, t.dim, MAX_CHECKS, STEP, 55));
    /* in place (dx over dy) gives the same gradients */
    float *in_place = malloc((size_t)n * sizeof(float)), *dweight_in_place = zero_array(t.dim);
    memcpy(in_place, t.out_weight, (size_t)n * sizeof(float));
    cpu_rmsnorm_bwd(t.x, in_place, t.n_rows, t.dim, t.weight, t.rstd, in_place, dweight_in_place);
    assert_memory_equal(in_place, dx, (size_t)n * sizeof(float));
    assert_memory_equal(dweight_in_place, dweight, (size_t)t.dim * sizeof(float));
    free(in_place);
    free(dweight_in_place);
    /* by hand: x = (3, 4), weight 1: rms = sqrt(12.5) */
    const float x[2] = {3, 4}, ones[2] = {1, 1};
    float y[2], rstd;
    cpu_rmsnorm_fwd(x, 1, 2, ones, 0.0f, y, &rstd);
    assert_float_equal(y[0], 3.0 / sqrt(12.5), 1e-6);
    assert_float_equal(y[1], 4.0 / sqrt(12.5), 1e-6);
    free(t.x); free(t.weight); free(t.out_weight); free(t.y); free(t.rstd); free(dx); free(dweight);
}

/* ---- RoPE --------------------------------------------------------------------------------------- */

typedef struct { float *x, *y, *out_weight; int64_t n_rows; int num_heads, head_dim; const int32_t *positions; } rope_case;

static double rope_objective(void *context)
{
    rope_case *t = context;
    cpu_rope_fwd(t->x, t->n_rows, t->num_heads, t->head_dim, t->positions, t->y);
    return weighted_sum(t->y, t->out_weight, t->n_rows * t->num_heads * t->head_dim);
}

static void test_rope(void **state)
{
    (void)state;
    const int32_t frames[2] = {2, 1}, height[2] = {2, 3}, width[2] = {3, 2};
    int32_t positions[18 * 3];
    cpu_rope_positions(2, frames, height, width, positions);
    /* token 7 of sample 0 is (f 1, h 0, w 1); sample 1 starts again at (0, 0, 0) */
    assert_int_equal(positions[7 * 3], 1);
    assert_int_equal(positions[7 * 3 + 1], 0);
    assert_int_equal(positions[7 * 3 + 2], 1);
    assert_int_equal(positions[12 * 3] + positions[12 * 3 + 1] + positions[12 * 3 + 2], 0);
    assert_int_equal(positions[17 * 3 + 1], 2);

    rope_case t = {.n_rows = 18, .num_heads = 2, .head_dim = 12, .positions = positions};
    int64_t n = t.n_rows * t.num_heads * t.head_dim;
    t.x = random_array(n, 61, 1.0f);
    t.out_weight = random_array(n, 62, 1.0f);
    t.y = zero_array(n);
    float *dx = zero_array(n);
    cpu_rope_bwd(t.out_weight, t.n_rows, t.num_heads, t.head_dim, positions, dx);
    ASSERT_GRADIENT("rope dx", gradient_error(rope_objective, &t, t.x, dx, n, MAX_CHECKS, STEP, 63));

    /* position (0,0,0) is the identity; a rotation keeps every pair's length */
    rope_objective(&t);
    for (int i = 0; i < 24; i++) assert_float_equal(t.y[i], t.x[i], 0);
    for (int64_t pair = 0; pair < n / 2; pair++) {
        double before = hypot(t.x[2 * pair], t.x[2 * pair + 1]), after = hypot(t.y[2 * pair], t.y[2 * pair + 1]);
        assert_true(fabs(before - after) < 1e-5);
    }

    /* head_dim 12 = 6 pairs, 2 per axis; pair 1 of the frame axis turns by f * 10000^(-1/2) */
    const int32_t at_frame_one[3] = {1, 0, 0};
    float unit[12] = {0}, turned[12];
    unit[2] = 1.0f;
    cpu_rope_fwd(unit, 1, 1, 12, at_frame_one, turned);
    assert_float_equal(turned[2], cos(0.01), 1e-7);
    assert_float_equal(turned[3], sin(0.01), 1e-7);

    /* head_dim 128: pairs 0..21 follow the frame, 22..42 the row, 43..63 the column (44/42/42 values) */
    float ones[128], out[128];
    for (int i = 0; i < 128; i++) ones[i] = 1.0f;
    for (int axis = 0; axis < 3; axis++) {
        int32_t position[3] = {0, 0, 0};
        position[axis] = 1;
        cpu_rope_fwd(ones, 1, 1, 128, position, out);
        for (int pair = 0; pair < 64; pair++) {
            int expected_axis = pair < 22 ? 0 : pair < 43 ? 1 : 2;
            int moved = out[2 * pair] != 1.0f || out[2 * pair + 1] != 1.0f;
            assert_int_equal(moved, expected_axis == axis);
        }
    }
    free(t.x); free(t.out_weight); free(t.y); free(dx);
}

/* The axes' split and theta given (HunyuanVideo-1.5's form): head_dim 16 as 2, 3, 3 pairs, theta 256. */
typedef struct { rope_case base; int axes[3]; double theta; } rope_axes_case;

static double rope_axes_objective(void *context)
{
    rope_axes_case *t = context;
    cpu_rope_axes_fwd(t->base.x, t->base.n_rows, t->base.num_heads, t->base.head_dim, t->base.positions, t->axes,
                      t->theta, t->base.y);
    return weighted_sum(t->base.y, t->base.out_weight, t->base.n_rows * t->base.num_heads * t->base.head_dim);
}

static void test_rope_axes(void **state)
{
    (void)state;
    const int32_t frames[1] = {2}, height[1] = {3}, width[1] = {2};
    int32_t positions[12 * 3];
    cpu_rope_positions(1, frames, height, width, positions);
    rope_axes_case t = {.base = {.n_rows = 12, .num_heads = 2, .head_dim = 16, .positions = positions},
                        .axes = {2, 3, 3}, .theta = 256.0};
    const int64_t n = 12 * 2 * 16;
    t.base.x = random_array(n, 71, 1.0f);
    t.base.out_weight = random_array(n, 72, 1.0f);
    t.base.y = zero_array(n);
    float *dx = zero_array(n);
    cpu_rope_axes_bwd(t.base.out_weight, 12, 2, 16, positions, t.axes, t.theta, dx);
    ASSERT_GRADIENT("rope_axes dx", gradient_error(rope_axes_objective, &t, t.base.x, dx, n, MAX_CHECKS, STEP, 73));

    /* pair 1 of the row axis (pair 3 of the head) turns by h * 256^(-1/3); the frame's pairs stay */
    const int32_t at_row_two[3] = {0, 2, 0};
    float unit[16] = {0}, turned[16];
    unit[6] = 1.0f;
    cpu_rope_axes_fwd(unit, 1, 1, 16, at_row_two, t.axes, t.theta, turned);
    assert_float_equal(turned[6], cos(2.0 * pow(256.0, -1.0 / 3.0)), 1e-7);
    assert_float_equal(turned[7], sin(2.0 * pow(256.0, -1.0 / 3.0)), 1e-7);
    /* Wan's own split and theta give cpu_rope_fwd's output to the bit */
    const int wan_axes[3] = {4, 2, 2};
    float *wan = zero_array(n);
    cpu_rope_fwd(t.base.x, 12, 2, 16, positions, wan);
    cpu_rope_axes_fwd(t.base.x, 12, 2, 16, positions, wan_axes, 10000.0, t.base.y);
    assert_memory_equal(wan, t.base.y, (size_t)n * sizeof(float));
    free(t.base.x); free(t.base.out_weight); free(t.base.y); free(dx); free(wan);
}

/* ---- attention ---------------------------------------------------------------------------------- */

typedef struct {
    float *q, *k, *v, *out, *lse, *out_weight;
    int num_heads, head_dim, n_samples; const int64_t *q_rows, *kv_rows;
} attention_case;

static double attention_objective(void *context)
{
    attention_case *t = context;
    cpu_attention_fwd(t->q, t->k, t->v, t->num_heads, t->head_dim, t->q_rows, t->kv_rows, t->n_samples, t->out, t->lse);
    return weighted_sum(t->out, t->out_weight, t->q_rows[t->n_samples] * t->num_heads * t->head_dim);
}

static void check_attention(const char *what, const int64_t *q_rows, const int64_t *kv_rows, int n_samples)
{
    attention_case t = {.num_heads = 2, .head_dim = 4, .n_samples = n_samples, .q_rows = q_rows, .kv_rows = kv_rows};
    int width = t.num_heads * t.head_dim;
    int64_t n_q = q_rows[n_samples] * width, n_kv = kv_rows[n_samples] * width;
    t.q = random_array(n_q, 71, 1.5f);
    t.k = random_array(n_kv, 72, 1.5f);
    t.v = random_array(n_kv, 73, 1.0f);
    t.out_weight = random_array(n_q, 74, 1.0f);
    t.out = zero_array(n_q);
    t.lse = zero_array(q_rows[n_samples] * t.num_heads);
    float *dq = zero_array(n_q), *dk = zero_array(n_kv), *dv = zero_array(n_kv);
    attention_objective(&t);
    cpu_attention_bwd(t.q, t.k, t.v, t.out, t.out_weight, t.lse, t.num_heads, t.head_dim, q_rows, kv_rows, n_samples,
                      dq, dk, dv);
    char name[64];
    snprintf(name, sizeof(name), "%s dq", what);
    ASSERT_GRADIENT(name, gradient_error(attention_objective, &t, t.q, dq, n_q, MAX_CHECKS, STEP, 75));
    snprintf(name, sizeof(name), "%s dk", what);
    ASSERT_GRADIENT(name, gradient_error(attention_objective, &t, t.k, dk, n_kv, MAX_CHECKS, STEP, 76));
    snprintf(name, sizeof(name), "%s dv", what);
    ASSERT_GRADIENT(name, gradient_error(attention_objective, &t, t.v, dv, n_kv, MAX_CHECKS, STEP, 77));

    /* each sample alone gives bit-identical rows: nothing leaks between packed samples */
    attention_objective(&t);   /* the outputs at the unperturbed inputs */
    for (int b = 0; b < n_samples; b++) {
        int64_t q_alone[2] = {0, q_rows[b + 1] - q_rows[b]}, kv_alone[2] = {0, kv_rows[b + 1] - kv_rows[b]};
        float *out_alone = zero_array(q_alone[1] * width + 1), *lse_alone = zero_array(q_alone[1] * t.num_heads + 1);
        cpu_attention_fwd(t.q + q_rows[b] * width, t.k + kv_rows[b] * width, t.v + kv_rows[b] * width, t.num_heads,
                          t.head_dim, q_alone, kv_alone, 1, out_alone, lse_alone);
        assert_memory_equal(out_alone, t.out + q_rows[b] * width, (size_t)(q_alone[1] * width) * sizeof(float));
        free(out_alone);
        free(lse_alone);
    }
    free(t.q); free(t.k); free(t.v); free(t.out_weight); free(t.out); free(t.lse); free(dq); free(dk); free(dv);
}

static void test_self_attention(void **state)
{
    (void)state;
    static const int64_t rows[4] = {0, 3, 5, 9};
    check_attention("self-attention", rows, rows, 3);
}

static void test_cross_attention(void **state)
{
    (void)state;
    static const int64_t q_rows[4] = {0, 3, 5, 9}, kv_rows[4] = {0, 2, 5, 9};
    check_attention("cross-attention", q_rows, kv_rows, 3);

    /* a sample without text tokens gets zero output and zero gradients */
    static const int64_t q_one[2] = {0, 2}, kv_none[2] = {0, 0};
    float q[16], out[16], lse[4], dq[16];
    fill_random(q, 16, 78, 1.0f);
    cpu_attention_fwd(q, NULL, NULL, 2, 4, q_one, kv_none, 1, out, lse);
    cpu_attention_bwd(q, NULL, NULL, out, q, lse, 2, 4, q_one, kv_none, 1, dq, NULL, NULL);
    for (int i = 0; i < 16; i++) {
        assert_float_equal(out[i], 0.0f, 0);
        assert_float_equal(dq[i], 0.0f, 0);
    }
}

/* Softmax is max-subtracted: huge scores give the value of the best key, not Inf/NaN. */
static void test_attention_stable_softmax(void **state)
{
    (void)state;
    static const int64_t q_rows[2] = {0, 1}, kv_rows[2] = {0, 3};
    float q[2] = {1000.0f, 0.0f}, k[6] = {1.0f, 0.0f, 50.0f, 0.0f, -50.0f, 0.0f}, v[6] = {1, 2, 3, 4, 5, 6};
    float out[2], lse[1];
    cpu_attention_fwd(q, k, v, 1, 2, q_rows, kv_rows, 1, out, lse);
    assert_float_equal(out[0], 3.0f, 1e-6);
    assert_float_equal(out[1], 4.0f, 1e-6);
    assert_true(isfinite(lse[0]));
    assert_float_equal(lse[0], 50000.0f / sqrtf(2.0f), 1.0f);
}

/* ---- gated residual ----------------------------------------------------------------------------- */

typedef struct { float *x, *y, *gate, *x_out, *out_weight; int dim, n_samples; const int64_t *row_start; } gate_case;

static double gate_objective(void *context)
{
    gate_case *t = context;
    int64_t n = t->row_start[t->n_samples] * t->dim;
    memcpy(t->x_out, t->x, (size_t)n * sizeof(float));
    cpu_gated_residual_fwd(t->x_out, t->y, t->dim, t->row_start, t->n_samples, t->gate);
    return weighted_sum(t->x_out, t->out_weight, n);
}

static void test_gated_residual(void **state)
{
    (void)state;
    static const int64_t row_start[3] = {0, 4, 6};
    gate_case t = {.dim = 7, .n_samples = 2, .row_start = row_start};
    int64_t n = 6 * t.dim, n_gate = 2 * t.dim;
    t.x = random_array(n, 81, 1.0f);
    t.y = random_array(n, 82, 1.0f);
    t.gate = random_array(n_gate, 83, 1.0f);
    t.out_weight = random_array(n, 84, 1.0f);
    t.x_out = zero_array(n);
    float *dy = zero_array(n), *dgate = zero_array(n_gate);
    cpu_gated_residual_bwd(t.out_weight, t.y, t.dim, row_start, t.n_samples, t.gate, dy, dgate);
    ASSERT_GRADIENT("gated_residual dy", gradient_error(gate_objective, &t, t.y, dy, n, MAX_CHECKS, STEP, 85));
    ASSERT_GRADIENT("gated_residual dgate", gradient_error(gate_objective, &t, t.gate, dgate, n_gate, MAX_CHECKS, STEP, 86));
    /* by hand: row 5 (sample 1) = x + y * gate_1 */
    gate_objective(&t);
    for (int c = 0; c < t.dim; c++)
        assert_float_equal(t.x_out[5 * t.dim + c], t.x[5 * t.dim + c] + t.y[5 * t.dim + c] * t.gate[t.dim + c], 1e-7);
    free(t.x); free(t.y); free(t.gate); free(t.out_weight); free(t.x_out); free(dy); free(dgate);
}

/* ---- sinusoidal embedding, patchify ------------------------------------------------------------- */

static void test_sinusoidal_embedding(void **state)
{
    (void)state;
    const float timesteps[3] = {0.0f, 1.0f, 500.0f};
    float out[3 * 8];
    cpu_sinusoidal_embedding(timesteps, 3, 8, out);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            double angle = timesteps[i] * pow(10000.0, -j / 4.0);
            assert_float_equal(out[i * 8 + j], cos(angle), 1e-6);       /* first half cos */
            assert_float_equal(out[i * 8 + 4 + j], sin(angle), 1e-6);   /* second half sin */
        }
    assert_float_equal(out[0], 1.0f, 0);
    assert_float_equal(out[4], 0.0f, 0);
    assert_float_equal(out[8 + 4], sin(1.0), 1e-7);
}

static void test_patchify(void **state)
{
    (void)state;
    enum { C = 3, F = 2, H = 4, W = 6, N_VALUES = C * F * H * W };
    float video[N_VALUES], tokens[N_VALUES], back[N_VALUES], probe[N_VALUES], adjoint[N_VALUES];
    for (int i = 0; i < N_VALUES; i++) video[i] = (float)i;
    /* video (c 2, f 1, h 3, w 4) is token (1, 1, 2) = 11, patch offset (p 0, q 1, r 0) */
    float value = video[((2 * F + 1) * H + 3) * W + 4];
    for (int channel_last = 0; channel_last <= 1; channel_last++) {
        cpu_patchify(video, C, F, H, W, 1, 2, 2, channel_last, tokens);
        int inner = channel_last ? ((0 * 2 + 1) * 2 + 0) * C + 2 : 2 * 4 + (0 * 2 + 1) * 2 + 0;
        assert_float_equal(tokens[11 * 12 + inner], value, 0);
        cpu_unpatchify(tokens, C, F, H, W, 1, 2, 2, channel_last, back);
        assert_memory_equal(back, video, sizeof(video));
        /* the backward of patchify is unpatchify: <P x, y> = <x, P^T y> */
        fill_random(probe, N_VALUES, 91, 1.0f);
        cpu_unpatchify(probe, C, F, H, W, 1, 2, 2, channel_last, adjoint);
        assert_float_equal(weighted_sum(tokens, probe, N_VALUES), weighted_sum(video, adjoint, N_VALUES), 1e-3);
    }
    /* a temporal patch too */
    cpu_patchify(video, C, F, H, W, 2, 2, 3, 1, tokens);
    cpu_unpatchify(tokens, C, F, H, W, 2, 2, 3, 1, back);
    assert_memory_equal(back, video, sizeof(video));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_wrong_gradient_fails),
        cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_ln_modulate),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_axes),
        cmocka_unit_test(test_self_attention),
        cmocka_unit_test(test_cross_attention),
        cmocka_unit_test(test_attention_stable_softmax),
        cmocka_unit_test(test_gated_residual),
        cmocka_unit_test(test_sinusoidal_embedding),
        cmocka_unit_test(test_patchify),
        cmocka_unit_test(test_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
