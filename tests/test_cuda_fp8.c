/* test_cuda_fp8.c — cmocka tests of the FP8 path of issue 34: the casts (cuda/fp8.h) against a host decoding of their
   bytes, the delayed-scaling update against a host reference (bit for bit) and its save/load, and each FP8 GEMM
   (gemm.h: forward with bias and GELU epilogues, dgrad plain, with DGELU and added into dx, wgrad added into dW)
   through the real casts against the exact product of the same bf16 inputs, within bounds derived from E4M3/E5M2
   rounding (below). Skips without a GPU, or on one below compute capability 8.9.

   The bounds. Round to nearest in a format with p mantissa bits turns a value x of the normal range into
   x (1 + d) with |d| <= u = 2^-(p+1): E4M3 (p = 3) u = 2^-4, E5M2 (p = 2) u = 2^-3. Within a binade the absolute
   error is uniform on [-ulp/2, ulp/2] and ulp <= 2 u |x|, so E[d] = 0 and E[d^2] <= u^2 / 3. An output of a GEMM,
   y = sum_i a_i b_i over K terms, computed from the cast operands, errs by e = sum_i a_i b_i (d_i + f_i + d_i f_i): to
   first order a sum of K independent zero-mean terms of variance (u_a^2 + u_b^2) / 3 (a_i b_i)^2, so with
   S = sqrt(sum_i (a_i b_i)^2) and sigma = sqrt((u_a^2 + u_b^2) / 3):
     statistical:  |e| <= z sigma S,   z = 6 (K >= 64 terms make e near Gaussian; a 6-sigma excess has odds ~2e-9 per
                   element, and the model's variance is an upper bound), and over a whole output
                   0.25 sigma ||S|| <= ||e|| <= 1.25 sigma ||S|| (the lower end shows FP8 rounding really happened:
                   bf16 operands would err ~30x less);
     worst case:   |e| <= (u_a + u_b + u_a u_b) sum_i |a_i b_i| <= (u_a + u_b + u_a u_b) sqrt(K) S, every rounding
                   aligned: the sqrt(K) accumulation bound, asserted too.
   Both get the bf16 output's own rounding, 2^-8 |y|, and the fast accumulation of the forward and dgrad (FP8
   products summed in the tensor core's reduced-precision accumulator before fp32): 2^-11 sum_i |a_i b_i|, far below
   the FP8 term. wgrad (fp32 output, no fast accumulation) gets neither. The scales come from the operands' own amax
   (the first use of a fresh scaling set), so the values sit in the normal range: subnormals are not modelled.

   The model (cuda/model_gpu.h with gpu_model_set_precision): on a tiny Wan model (dim 64, FFN 128, 2 blocks) over a
   packed batch, fp8 against bf16 from the same weights: the loss within 2 eps + eps^2 and the whole gradient within
   sqrt(eps_f^2 + eps_b^2 + sigma_w^2) relative L2, where eps_f = sqrt(2 G) sigma_fwd bounds an activation's error
   (G = 16 FP8 linears, each erring by at most sigma_fwd = sqrt(2/3) 2^-4 of its output, its input's error as large
   again), eps_b = sqrt(2 G) sigma_dgrad the output gradient's (sigma_dgrad = sigma_wgrad = sqrt((2^-8 + 2^-6) / 3)),
   sigma_w = sigma_wgrad the weight gradient GEMM's own, and eps = eps_f for the loss (|dL| <= L (2 eps rho +
   eps^2 rho^2) by Cauchy-Schwarz, rho = rms(prediction) / sqrt(L) <= 1 for a model whose prediction is uncorrelated
   with the target). Exact: in fp8, block recomputation gives the losses and gradients of none bit for bit, a second
   call the same loss (the scales fixed within a step), and a model given another's saved scaling state (after a
   step's update) computes the same loss and gradients bit for bit as that one. */
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
#include "core/rng.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/gpu.h"
#include "cuda/model_gpu.h"
#include "deck/deck.h"
#include "model/model.h"

static const double kU[2] = {0x1p-4, 0x1p-3}; /* unit roundoff of E4M3, E5M2 */
static const double kZ = 6.0;                 /* sigmas of the statistical element bound */
static const double kBf16Out = 0x1p-8;        /* a bf16 output's rounding */
static const double kFastAccumulation = 0x1p-11;
/* fp32's GELU gradient (the DGELU epilogue's) against the double reference, absolute: in the negative tail 1 + tanh(u)
   cancels in fp32 (to exactly 0 for u below about -9, x below about -5.4, where the reference is still ~1e-8), and the
   H200's epilogue returned exactly 0 for an element whose reference gradient was just above 1e-6 (x near -4.9, where
   1 + tanh(u) is ~2e-7, a few fp32 steps of tanh near -1). 1e-5 covers that tail with margin and stays four orders
   below E5M2's unit roundoff, the gradient's own error. */
static const double kGeluGradAbs = 1e-5;

static uint64_t g_seed = 0xf8f8f8f8ull;
static gemm_context *g_gemm;

typedef struct {
    const char *name;
    int64_t rows;
    int in_dim, out_dim;
    int64_t check_rows; /* rows of y / dx compared (half from each end; 0: all), dW rows compared likewise */
} shape;

static const shape kShapes[] = {
    {"37 rows, 64 -> 128 (rows padded to 48 in wgrad)", 37, 64, 128, 0},
    {"Wan-1.3B attention: 1000 rows, 1536 -> 1536", 1000, 1536, 1536, 32},
    {"Wan-1.3B FFN up: 300 rows, 1536 -> 8960", 300, 1536, 8960, 16},
    {"Wan-1.3B FFN down: 300 rows, 8960 -> 1536", 300, 8960, 1536, 16},
};

/* n values normal(0, spread) rounded to bf16: floats (returned) and bits. */
static float *random_bf16(size_t n, double spread, gpu_bf16 **bits)
{
    uint64_t seed = g_seed++;
    return random_normal_bf16(&seed, n, 0.0, spread, bits);
}

/* The value of an E4M3 (bias 7, 3 mantissa bits) or E5M2 (bias 15, 2 bits) byte (NaN and infinity not decoded). */
static double fp8_decode(uint8_t byte, int e5m2)
{
    const int mantissa_bits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const int exponent = (byte & 0x7f) >> mantissa_bits, mantissa = byte & ((1 << mantissa_bits) - 1);
    const double fraction = (double)mantissa / (double)(1 << mantissa_bits);
    const double magnitude = exponent == 0 ? ldexp(fraction, 1 - bias) : ldexp(1.0 + fraction, exponent - bias);
    return byte & 0x80 ? -magnitude : magnitude;
}

static int64_t row_of(int64_t i, int64_t rows, int64_t check)
{
    if (check <= 0 || check >= rows) return i;
    return i < check / 2 ? i : rows - (check - i);
}

static int64_t checked_count(int64_t rows, int64_t check) { return check <= 0 || check >= rows ? rows : check; }

/* The error of one GEMM output against the bounds above; accumulates the whole output's norms. */
typedef struct {
    double sigma, worst_u, fast;
    double err2, s2, ref2;
    int64_t n;
    const char *what, *case_name;
} bound_check;

static bound_check bounds_for(int format_a, int format_b, int bf16_out, const char *what, const char *case_name)
{
    const double ua = kU[format_a], ub = kU[format_b];
    bound_check b = {sqrt((ua * ua + ub * ub) / 3.0), ua + ub + ua * ub, bf16_out ? kFastAccumulation : 0.0, 0, 0, 0, 0,
                     what, case_name};
    return b;
}

/* got against ref = sum a_i b_i with S = sqrt(sum (a_i b_i)^2), A = sum |a_i b_i|; out_scale: got and ref are further
   multiplied by it (a GELU gradient), plus_ref: added to both exactly (a bias, an earlier dx). */
static void check_element(bound_check *b, double got, double ref, double S, double A, double out_scale, double plus_ref,
                          int bf16_out)
{
    const double want = ref * out_scale + plus_ref, err = fabs(got - want);
    const double rounding = bf16_out ? kBf16Out * fabs(want) + 1e-30 : 1e-6 * fabs(want) + 1e-30;
    const double fast = b->fast * A * fabs(out_scale);
    const double gelu_tail = out_scale != 1.0 ? kGeluGradAbs * fabs(ref) : 0.0;   /* a GELU gradient's scale */
    const double statistical = kZ * b->sigma * S * fabs(out_scale) + fast + rounding + gelu_tail;
    const double worst = b->worst_u * A * fabs(out_scale) + fast + rounding + gelu_tail;
    if (!(err <= statistical) || !(err <= worst))
        fail_msg("%s (%s): element %lld is %.8g, want %.8g: error %.3g above the %s bound %.3g", b->what, b->case_name,
                 (long long)b->n, got, want, err, err > worst ? "worst-case" : "statistical",
                 err > worst ? worst : statistical);
    b->err2 += (got - want) * (got - want);
    b->s2 += S * S * out_scale * out_scale;
    b->ref2 += want * want;
    b->n++;
}

static void check_norms(const bound_check *b, int bf16_out)
{
    const double err = sqrt(b->err2), s = sqrt(b->s2), ref = sqrt(b->ref2);
    const double upper = 1.25 * b->sigma * s + (bf16_out ? kBf16Out : 1e-6) * ref + b->fast * sqrt((double)b->n) * s;
    const double lower = 0.25 * b->sigma * s;
    printf("# %s (%s): ||e|| / (sigma ||S||) = %.3f over %lld values\n", b->what, b->case_name, err / (b->sigma * s),
           (long long)b->n);
    if (!(err <= upper && err >= lower))
        fail_msg("%s (%s): ||error|| = %.4g outside [%.4g, %.4g] (0.25 and 1.25 sigma ||S||, sigma = %.4g)", b->what,
                 b->case_name, err, lower, upper, b->sigma);
}

/* sum, S and A of a_i b_i for i < K, a with stride sa, b with stride sb. */
static void dot_stats(const float *a, int64_t sa, const float *b, int64_t sb, int64_t K, double *sum, double *S, double *A)
{
    double s = 0.0, s2 = 0.0, sa_ = 0.0;
    for (int64_t i = 0; i < K; ++i) {
        const double p = (double)a[i * sa] * (double)b[i * sb];
        s += p, s2 += p * p, sa_ += fabs(p);
    }
    *sum = s, *S = sqrt(s2), *A = sa_;
}

static double gelu_tanh(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
static double gelu_tanh_grad(double v)
{
    const double t = tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

/* A fresh scaling set of the tensors a GEMM casts: 0 input (E4M3), 1 weight (E4M3), 2 gradient (E5M2), and 3 an
   output a GEMM writes in E4M3. */
static fp8_scaling *fresh_scaling(void)
{
    const fp8_format formats[4] = {FP8_E4M3, FP8_E4M3, FP8_E5M2, FP8_E4M3};
    return fp8_scaling_create(4, formats, 16, 0);
}

/* ---- casts ------------------------------------------------------------------------------------------------ */

/* Casts of each format into out and out_t at once; the shapes take the vectorised transpose (ld_t a multiple of 8: one
   row tile and a partial column tile, then several of each) and the per-value one (ld_t = rows = 45). */
static void test_cast(void **state)
{
    (void)state;
    static const struct { int64_t rows; int cols; int64_t ld_t; } shapes[] = {{45, 96, 48}, {45, 96, 45}, {130, 200, 144}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; ++k)
        for (int format = 0; format < 2; ++format) {
            const int64_t rows = shapes[k].rows, ld_t = shapes[k].ld_t;
            const int cols = shapes[k].cols;
            const size_t n = (size_t)rows * cols;
            gpu_bf16 *bits;
            float *x = random_bf16(n, 3.0, &bits);
            x[7] = 0.0f, bits[7] = gpu_bf16_from_float(0.0f);
            const fp8_format formats[1] = {(fp8_format)format};
            fp8_scaling *s = fp8_scaling_create(1, formats, 4, 0);
            gpu_bf16 *d_x = device_upload(bits, n * sizeof *bits);
            uint8_t *d_q = device_poisoned(n), *d_t = device_poisoned((size_t)cols * ld_t);
            fp8_quantize(s, 0, d_x, rows, cols, d_q, d_t, ld_t, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            uint8_t *q = xmalloc(n), *t = xmalloc((size_t)cols * ld_t);
            CUDA_CHECK(cudaMemcpy(q, d_q, n, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(t, d_t, (size_t)cols * ld_t, cudaMemcpyDeviceToHost));
            float scale, scale_inv, amax;
            fp8_scaling_download(s, &scale, &scale_inv, &amax, NULL);
            double want_amax = 0.0;
            for (size_t i = 0; i < n; ++i) want_amax = fmax(want_amax, fabs(x[i]));
            assert_true(amax == (float)want_amax);
            assert_true(scale == fp8_scale_for(amax, (fp8_format)format, 0, 1.0f)); /* current scaling: no update yet */
            assert_true(scale_inv == 1.0f / scale);
            for (int64_t r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c) {
                    const double v = x[r * cols + c], got = fp8_decode(q[r * cols + c], format) * scale_inv;
                    /* nearest: at most u |v|, or half the subnormal spacing (2^-10, 2^-17) times scale_inv */
                    const double tolerance = kU[format] * fabs(v) + ldexp(1.0, format ? -17 : -10) * scale_inv;
                    if (!(fabs(got - v) <= tolerance * (1 + 1e-6)))
                        fail_msg("cast %s: (%lld, %d) = %.6g decodes to %.6g", format ? "E5M2" : "E4M3", (long long)r,
                                 c, v, got);
                    if (t[(int64_t)c * ld_t + r] != q[r * cols + c])
                        fail_msg("cast %s, %lld x %d, ld_t %lld: out_t (%d, %lld) is %d, out (%lld, %d) is %d",
                                 format ? "E5M2" : "E4M3", (long long)rows, cols, (long long)ld_t, c, (long long)r,
                                 t[(int64_t)c * ld_t + r], (long long)r, c, q[r * cols + c]);
                }
            for (int c = 0; c < cols; ++c)
                for (int64_t r = rows; r < ld_t; ++r) assert_int_equal(t[(int64_t)c * ld_t + r], 0);
            void *host[] = {x, bits, q, t};
            void *device[] = {d_x, d_q, d_t};
            free_host_buffers(host, 4);
            free_device_buffers(device, 3);
            fp8_scaling_free(s);
        }
}

/* fp8_quantize_gelu: the cast of gelu_tanh(pre), decoded against the host's gelu of the same bf16 pre (fp32 tanhf on
   the device: 1e-6 relative besides E4M3's rounding); out and out_t the same bytes; the amax max |gelu|. */
static void test_cast_gelu(void **state)
{
    (void)state;
    const int64_t rows = 45, ld_t = 48;
    const int cols = 96;
    const size_t n = (size_t)rows * cols;
    gpu_bf16 *bits;
    float *pre = random_bf16(n, 2.0, &bits);
    const fp8_format formats[1] = {FP8_E4M3};
    fp8_scaling *s = fp8_scaling_create(1, formats, 4, 0);
    gpu_bf16 *d_pre = device_upload(bits, n * sizeof *bits);
    uint8_t *d_q = device_poisoned(n), *d_t = device_poisoned((size_t)cols * ld_t);
    fp8_quantize_gelu(s, 0, d_pre, rows, cols, d_q, d_t, ld_t, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    uint8_t *q = xmalloc(n), *t = xmalloc((size_t)cols * ld_t);
    CUDA_CHECK(cudaMemcpy(q, d_q, n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(t, d_t, (size_t)cols * ld_t, cudaMemcpyDeviceToHost));
    float scale_inv, amax;
    fp8_scaling_download(s, NULL, &scale_inv, &amax, NULL);
    double want_amax = 0.0;
    for (size_t i = 0; i < n; ++i) want_amax = fmax(want_amax, fabs(gelu_tanh(pre[i])));
    assert_true(fabs(amax - want_amax) <= 1e-6 * want_amax);
    for (int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const double g = gelu_tanh(pre[r * cols + c]), got = fp8_decode(q[r * cols + c], 0) * scale_inv;
            const double tolerance = (kU[0] + 1e-6) * fabs(g) + 0x1p-10 * scale_inv + 1e-7;
            if (!(fabs(got - g) <= tolerance))
                fail_msg("gelu cast: (%lld, %d): gelu(%.6g) = %.6g decodes to %.6g", (long long)r, c, pre[r * cols + c],
                         g, got);
            assert_int_equal(t[(int64_t)c * ld_t + r], q[r * cols + c]);
        }
    void *host[] = {pre, bits, q, t};
    void *device[] = {d_pre, d_q, d_t};
    free_host_buffers(host, 4);
    free_device_buffers(device, 3);
    fp8_scaling_free(s);
}

/* fp8_quantize_dbias: the same bytes as fp8_quantize, and the column sums of dy added into dbias (against the host's
   double sums: fp32 sums of 64 rows a tile, then of the tiles, err by at most ~(64 + tiles) 2^-24 of the absolute
   sum), over one and several row tiles and a partial column tile. */
static void test_cast_dbias(void **state)
{
    (void)state;
    static const struct { int64_t rows; int cols; } shapes[] = {{45, 96}, {300, 200}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; ++k) {
        const int64_t rows = shapes[k].rows, ld_t = gemm_fp8_padded_rows(rows);
        const int cols = shapes[k].cols;
        const size_t n = (size_t)rows * cols;
        gpu_bf16 *bits;
        float *dy = random_bf16(n, 1e-3, &bits);
        uint64_t seed = g_seed++;
        float *db0 = random_normal_f32(&seed, (size_t)cols, 0.0, 1e-2);
        const fp8_format formats[1] = {FP8_E5M2};
        fp8_scaling *a = fp8_scaling_create(1, formats, 4, 0), *b = fp8_scaling_create(1, formats, 4, 0);
        gpu_bf16 *d_dy = device_upload(bits, n * sizeof *bits);
        uint8_t *q[2] = {device_poisoned(n), device_poisoned(n)};
        uint8_t *t[2] = {device_poisoned((size_t)cols * ld_t), device_poisoned((size_t)cols * ld_t)};
        float *d_db = device_upload(db0, (size_t)cols * sizeof(float));
        float *partials = device_poisoned(fp8_dbias_partials_floats(ld_t, cols) * sizeof(float));
        fp8_quantize(a, 0, d_dy, rows, cols, q[0], t[0], ld_t, 0);
        fp8_quantize_dbias(b, 0, d_dy, rows, cols, q[1], t[1], ld_t, d_db, partials, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        unsigned char *host_q[2], *host_t[2];
        for (int i = 0; i < 2; ++i) {
            host_q[i] = xmalloc(n), host_t[i] = xmalloc((size_t)cols * ld_t);
            CUDA_CHECK(cudaMemcpy(host_q[i], q[i], n, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(host_t[i], t[i], (size_t)cols * ld_t, cudaMemcpyDeviceToHost));
        }
        assert_memory_equal(host_q[0], host_q[1], n);
        assert_memory_equal(host_t[0], host_t[1], (size_t)cols * ld_t);
        float *db = download_f32(d_db, (size_t)cols);
        const double tiles = (double)((ld_t + 63) / 64);
        for (int c = 0; c < cols; ++c) {
            double want = db0[c], absolute = fabs(db0[c]);
            for (int64_t r = 0; r < rows; ++r) want += dy[r * cols + c], absolute += fabs(dy[r * cols + c]);
            if (!(fabs(db[c] - want) <= (64.0 + tiles + 2.0) * 0x1p-24 * absolute))
                fail_msg("dbias (%lld x %d): column %d is %.9g, want %.9g", (long long)rows, cols, c, db[c], want);
        }
        void *host[] = {dy, bits, db0, db, host_q[0], host_q[1], host_t[0], host_t[1]};
        void *device[] = {d_dy, q[0], q[1], t[0], t[1], d_db, partials};
        free_host_buffers(host, 8);
        free_device_buffers(device, 7);
        fp8_scaling_free(a), fp8_scaling_free(b);
    }
}

/* fp8_quantize_dbias_dgelu: the cast of v = dy * gelu_tanh'(pre) (fp32 on the device; against the double reference
   within kGeluGradAbs |dy| besides E5M2's rounding), out and out_t the same bytes (pad columns of out_t zero), the
   amax max |v|, and db0 + the column sums of v added into dbias (the bound of test_cast_dbias on sum |v|, plus
   kGeluGradAbs sum |dy| for the products' own error), over one and several row tiles and a partial column tile. */
static void test_cast_dbias_dgelu(void **state)
{
    (void)state;
    static const struct { int64_t rows; int cols; } shapes[] = {{45, 96}, {300, 200}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; ++k) {
        const int64_t rows = shapes[k].rows, ld_t = gemm_fp8_padded_rows(rows);
        const int cols = shapes[k].cols;
        const size_t n = (size_t)rows * cols;
        gpu_bf16 *dy_bits, *pre_bits;
        float *dy = random_bf16(n, 1e-3, &dy_bits), *pre = random_bf16(n, 2.0, &pre_bits);
        uint64_t seed = g_seed++;
        float *db0 = random_normal_f32(&seed, (size_t)cols, 0.0, 1e-2);
        const fp8_format formats[1] = {FP8_E5M2};
        fp8_scaling *s = fp8_scaling_create(1, formats, 4, 0);
        gpu_bf16 *d_dy = device_upload(dy_bits, n * sizeof *dy_bits), *d_pre = device_upload(pre_bits, n * sizeof *pre_bits);
        uint8_t *d_q = device_poisoned(n), *d_t = device_poisoned((size_t)cols * ld_t);
        float *d_db = device_upload(db0, (size_t)cols * sizeof(float));
        float *partials = device_poisoned(fp8_dbias_partials_floats(ld_t, cols) * sizeof(float));
        fp8_quantize_dbias_dgelu(s, 0, d_dy, d_pre, rows, cols, d_q, d_t, ld_t, d_db, partials, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        uint8_t *q = xmalloc(n), *t = xmalloc((size_t)cols * ld_t);
        CUDA_CHECK(cudaMemcpy(q, d_q, n, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(t, d_t, (size_t)cols * ld_t, cudaMemcpyDeviceToHost));
        float scale_inv, amax;
        fp8_scaling_download(s, NULL, &scale_inv, &amax, NULL);
        double want_amax = 0.0, most_dy = 0.0;
        for (size_t i = 0; i < n; ++i) {
            want_amax = fmax(want_amax, fabs(dy[i] * gelu_tanh_grad(pre[i])));
            most_dy = fmax(most_dy, fabs(dy[i]));
        }
        assert_true(fabs(amax - want_amax) <= kGeluGradAbs * most_dy);
        for (int64_t r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) {
                const int64_t i = r * cols + c;
                const double v = dy[i] * gelu_tanh_grad(pre[i]), got = fp8_decode(q[i], 1) * scale_inv;
                const double tolerance = kU[1] * fabs(v) + kGeluGradAbs * fabs(dy[i]) + 0x1p-17 * scale_inv;
                if (!(fabs(got - v) <= tolerance * (1 + 1e-6)))
                    fail_msg("dgelu cast (%lld x %d): (%lld, %d) = %.6g decodes to %.6g", (long long)rows, cols,
                             (long long)r, c, v, got);
                assert_int_equal(t[(int64_t)c * ld_t + r], q[i]);
            }
        for (int c = 0; c < cols; ++c)
            for (int64_t r = rows; r < ld_t; ++r) assert_int_equal(t[(int64_t)c * ld_t + r], 0);
        float *db = download_f32(d_db, (size_t)cols);
        const double tiles = (double)((ld_t + 63) / 64);
        for (int c = 0; c < cols; ++c) {
            double want = db0[c], absolute = fabs(db0[c]), dy_sum = 0.0;
            for (int64_t r = 0; r < rows; ++r) {
                const double v = dy[r * cols + c] * gelu_tanh_grad(pre[r * cols + c]);
                want += v, absolute += fabs(v), dy_sum += fabs(dy[r * cols + c]);
            }
            if (!(fabs(db[c] - want) <= (64.0 + tiles + 2.0) * 0x1p-24 * absolute + kGeluGradAbs * dy_sum))
                fail_msg("dgelu dbias (%lld x %d): column %d is %.9g, want %.9g", (long long)rows, cols, c, db[c], want);
        }
        void *host[] = {dy, dy_bits, pre, pre_bits, db0, db, q, t};
        void *device[] = {d_dy, d_pre, d_q, d_t, d_db, partials};
        free_host_buffers(host, 8);
        free_device_buffers(device, 6);
        fp8_scaling_free(s);
    }
}

/* ---- delayed scaling -------------------------------------------------------------------------------------- */

/* Steps of casts of tensors with known amax (0 for some: the scale is kept), then updates, against a host replay. */
/* fp8_record_amax_bound: tensor 0's running amax = max(itself, factor * amax[1] * amax[2]) in fp32 as the host's
   product; a larger amax kept; a zero product records nothing. */
static void test_amax_bound(void **state)
{
    (void)state;
    enum { kTensors = 4, kN = 64 };
    const fp8_format formats[kTensors] = {FP8_E5M2, FP8_E5M2, FP8_E4M3, FP8_E4M3};
    fp8_scaling *s = fp8_scaling_create(kTensors, formats, 4, 0);
    gpu_bf16 bits[kN];
    gpu_bf16 *d_x = device_poisoned(kN * sizeof *bits);
    const float peaks[2] = {0.0371f, 2.75f};
    float seen[2] = {0.0f, 0.0f};
    for (int t = 0; t < 2; ++t) {
        for (int i = 0; i < kN; ++i) {
            bits[i] = gpu_bf16_from_float(peaks[t] * (i == 5 + t ? -1.0f : (float)rng_uniform(&g_seed) * 0.9f));
            seen[t] = fmaxf(seen[t], fabsf(gpu_float_from_bf16(bits[i])));
        }
        CUDA_CHECK(cudaMemcpy(d_x, bits, sizeof bits, cudaMemcpyHostToDevice));
        fp8_record_amax_of(s, 1 + t, d_x, kN, 0);
    }
    const float factor = 256.0f, want = factor * seen[0] * seen[1];
    fp8_record_amax_bound(s, 0, 1, 2, factor, 0);
    float amax[kTensors];
    fp8_scaling_download(s, NULL, NULL, amax, NULL);
    printf("# amax bound: %.9g (host %.9g) from %.9g and %.9g\n", amax[0], want, amax[1], amax[2]);
    assert_true(amax[1] == seen[0] && amax[2] == seen[1] && amax[0] == want);
    fp8_record_amax_bound(s, 0, 1, 2, 1.0f, 0);   /* smaller: kept */
    fp8_record_amax_bound(s, 3, 0, 3, 2.0f, 0);   /* amax[3] is 0: nothing */
    fp8_scaling_download(s, NULL, NULL, amax, NULL);
    assert_true(amax[0] == want && amax[3] == 0.0f);
    CUDA_CHECK(cudaFree(d_x));
    fp8_scaling_free(s);
}

static void test_delayed_scaling(void **state)
{
    (void)state;
    enum { kTensors = 3, kHistory = 4, kSteps = 9, kCols = 64, kRows = 8 };
    const fp8_format formats[kTensors] = {FP8_E4M3, FP8_E5M2, FP8_E4M3};
    const int margin = 1;
    fp8_scaling *s = fp8_scaling_create(kTensors, formats, kHistory, margin);
    float host_scale[kTensors] = {1, 1, 1}, host_amax[kTensors] = {0}, host_history[kTensors][kHistory] = {{0}};
    int position = 0;
    gpu_bf16 *bits = xmalloc(kRows * kCols * sizeof *bits);
    gpu_bf16 *d_x = device_poisoned(kRows * kCols * sizeof *bits);
    uint8_t *d_q = device_poisoned(kRows * kCols);
    unsigned char *saved = NULL;
    float saved_scale[kTensors];
    for (int step = 0; step < kSteps; ++step) {
        for (int t = 0; t < kTensors; ++t) {
            /* two casts per step (two micro-batches); tensor 2 casts zeros at steps 2 to 6 */
            for (int call = 0; call < 2; ++call) {
                const double peak = (t == 2 && step >= 2 && step <= 6) ? 0.0 : ldexp(1.0, (step * 3 + t * 5) % 11 - 4) * (1 + call);
                for (int i = 0; i < kRows * kCols; ++i)
                    bits[i] = gpu_bf16_from_float((float)(peak * (i == 17 ? -1.0 : rng_uniform(&g_seed) * 0.5)));
                float amax_call = 0.0f;
                for (int i = 0; i < kRows * kCols; ++i) amax_call = fmaxf(amax_call, fabsf(gpu_float_from_bf16(bits[i])));
                CUDA_CHECK(cudaMemcpy(d_x, bits, kRows * kCols * sizeof *bits, cudaMemcpyHostToDevice));
                fp8_quantize(s, t, d_x, kRows, kCols, d_q, NULL, 0, 0);
                host_amax[t] = fmaxf(host_amax[t], amax_call);
                if (step == 0) host_scale[t] = fp8_scale_for(host_amax[t], formats[t], margin, host_scale[t]);
            }
        }
        if (step == 5) { /* a checkpoint between steps: saved here, restored after step 7, the replay follows it */
            saved = xmalloc(fp8_scaling_state_bytes(s));
            fp8_scaling_save(s, saved, 0);
            memcpy(saved_scale, host_scale, sizeof saved_scale);
        }
        fp8_scaling_update(s, 0);
        for (int t = 0; t < kTensors; ++t) {
            host_history[t][position] = host_amax[t];
            host_amax[t] = 0.0f;
            float m = 0.0f;
            for (int i = 0; i < kHistory; ++i) m = fmaxf(m, host_history[t][i]);
            host_scale[t] = fp8_scale_for(m, formats[t], margin, host_scale[t]);
        }
        position = (position + 1) % kHistory;
        float scale[kTensors], scale_inv[kTensors], amax[kTensors], history[kTensors * kHistory];
        fp8_scaling_download(s, scale, scale_inv, amax, history);
        assert_int_equal(fp8_scaling_position(s), position);
        assert_int_equal(fp8_scaling_updates(s), step + 1);
        for (int t = 0; t < kTensors; ++t) {
            if (scale[t] != host_scale[t] || scale_inv[t] != 1.0f / host_scale[t] || amax[t] != 0.0f)
                fail_msg("step %d tensor %d: scale %.9g (host %.9g), scale_inv %.9g, amax %.9g", step, t, scale[t],
                         host_scale[t], scale_inv[t], amax[t]);
            assert_memory_equal(history + t * kHistory, host_history[t], sizeof host_history[t]);
        }
    }
    /* tensor 2's zeros (steps 2-6) fell out of a 4-step history by step 8 only partly: its scale followed the rule */
    assert_true(host_scale[2] != 1.0f);
    /* restore the state saved before step 5's update: the device state and the counters come back */
    char why[256];
    assert_int_equal(fp8_scaling_load(s, saved, fp8_scaling_state_bytes(s) - 1, why, sizeof why), 1);
    assert_int_equal(fp8_scaling_load(s, saved, fp8_scaling_state_bytes(s), why, sizeof why), 0);
    unsigned char *again = xmalloc(fp8_scaling_state_bytes(s));
    fp8_scaling_save(s, again, 0);
    assert_memory_equal(again, saved, fp8_scaling_state_bytes(s));
    assert_int_equal(fp8_scaling_updates(s), 5);
    float scale[kTensors];
    fp8_scaling_download(s, scale, NULL, NULL, NULL);
    assert_memory_equal(scale, saved_scale, sizeof scale);
    free(again), free(saved), free(bits);
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_q));
    fp8_scaling_free(s);
}

/* ---- GEMMs -------------------------------------------------------------------------------------------------- */

/* Forward: y = x W^T + b (and the GELU variant: pre against the bound, y = gelu(pre) to bf16). */
static void check_forward(const shape *sh, int gelu)
{
    const int64_t rows = sh->rows;
    const int in = sh->in_dim, out = sh->out_dim;
    gpu_bf16 *x_bits, *w_bits, *b_bits;
    float *x = random_bf16((size_t)rows * in, 1.0, &x_bits);
    float *w = random_bf16((size_t)out * in, 1.0 / sqrt((double)in), &w_bits);
    float *b = random_bf16((size_t)out, 0.5, &b_bits);
    gpu_bf16 *d_x = device_upload(x_bits, (size_t)rows * in * 2), *d_w = device_upload(w_bits, (size_t)out * in * 2);
    gpu_bf16 *d_b = device_upload(b_bits, (size_t)out * 2);
    uint8_t *x8 = device_poisoned((size_t)rows * in), *w8 = device_poisoned((size_t)out * in);
    gpu_bf16 *d_y = device_poisoned((size_t)rows * out * 2), *d_pre = gelu ? device_poisoned((size_t)rows * out * 2) : NULL;
    fp8_scaling *s = fresh_scaling();
    fp8_quantize(s, 0, d_x, rows, in, x8, NULL, 0, 0);
    fp8_quantize(s, 1, d_w, out, in, w8, NULL, 0, 0);
    gemm_fp8_fwd(g_gemm, x8, fp8_scale_inv(s, 0), rows, in, out, w8, fp8_scale_inv(s, 1), d_b,
                 gelu ? GEMM_EPILOGUE_GELU_AUX_BIAS : GEMM_EPILOGUE_BIAS, d_y, d_pre, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *y = download_bf16(d_y, (size_t)rows * out), *pre = gelu ? download_bf16(d_pre, (size_t)rows * out) : NULL;
    char case_name[160];
    snprintf(case_name, sizeof case_name, "%s%s", sh->name, gelu ? ", bias + GELU" : ", bias");
    bound_check bc = bounds_for(0, 0, 1, gelu ? "gemm_fp8_fwd pre_gelu" : "gemm_fp8_fwd y", case_name);
    const int64_t n_check = checked_count(rows, sh->check_rows);
    for (int64_t i = 0; i < n_check; ++i) {
        const int64_t r = row_of(i, rows, sh->check_rows);
        for (int o = 0; o < out; ++o) {
            double sum, S, A;
            dot_stats(x + r * in, 1, w + (int64_t)o * in, 1, in, &sum, &S, &A);
            const float got = gelu ? pre[r * out + o] : y[r * out + o];
            check_element(&bc, got, sum, S, A, 1.0, b[o], 1);
            if (gelu) { /* the epilogue takes gelu of the fp32 pre, this of its bf16 rounding: a 2^-8 |pre| apart */
                const double p = pre[r * out + o], want = gelu_tanh(p);
                if (!(fabs(y[r * out + o] - want) <= kBf16Out * (fabs(want) + fabs(gelu_tanh_grad(p) * p)) + 1e-6))
                    fail_msg("gemm_fp8_fwd y (%s): gelu(%.6g) = %.6g, got %.6g", case_name, pre[r * out + o], want,
                             y[r * out + o]);
            }
        }
    }
    check_norms(&bc, 1);
    expect_finite("gemm_fp8_fwd y", case_name, y, (size_t)rows * out);
    void *host[] = {x, x_bits, w, w_bits, b, b_bits, y, pre};
    void *device[] = {d_x, d_w, d_b, x8, w8, d_y, d_pre};
    free_host_buffers(host, 8);
    free_device_buffers(device, gelu ? 7 : 6);
    fp8_scaling_free(s);
}

/* The FFN's first GEMM with its GELU output in E4M3 (gemm_fp8_fwd_gelu_fp8): pre against the bound, the E4M3 output
   against gelu of the exact pre: the GEMM's bound times max |gelu'| = 1.13 plus E4M3's own rounding (u = 2^-4 of the value, or
   half the subnormal spacing, 2^-10, times scale_inv), and the amax it reports against the host's. The output scale
   is that of a cast of the host's gelu values (their own amax, as a delayed scale would have it). */
static void check_forward_fp8_out(const shape *sh)
{
    const int64_t rows = sh->rows;
    const int in = sh->in_dim, out = sh->out_dim;
    gpu_bf16 *x_bits, *w_bits, *b_bits;
    float *x = random_bf16((size_t)rows * in, 1.0, &x_bits);
    float *w = random_bf16((size_t)out * in, 1.0 / sqrt((double)in), &w_bits);
    float *b = random_bf16((size_t)out, 0.5, &b_bits);
    const int64_t n_check = checked_count(rows, sh->check_rows);
    double *ref = xmalloc((size_t)n_check * out * sizeof *ref), *S = xmalloc((size_t)n_check * out * sizeof *S);
    double *A = xmalloc((size_t)n_check * out * sizeof *A), host_amax = 0.0;
    gpu_bf16 *gelu_bits = xmalloc((size_t)n_check * out * sizeof *gelu_bits);
    for (int64_t i = 0; i < n_check; ++i)
        for (int o = 0; o < out; ++o) {
            const int64_t r = row_of(i, rows, sh->check_rows), k = i * out + o;
            dot_stats(x + r * in, 1, w + (int64_t)o * in, 1, in, &ref[k], &S[k], &A[k]);
            ref[k] += b[o];
            host_amax = fmax(host_amax, fabs(gelu_tanh(ref[k])));
            gelu_bits[k] = gpu_bf16_from_float((float)gelu_tanh(ref[k]));
        }
    gpu_bf16 *d_x = device_upload(x_bits, (size_t)rows * in * 2), *d_w = device_upload(w_bits, (size_t)out * in * 2);
    gpu_bf16 *d_b = device_upload(b_bits, (size_t)out * 2);
    gpu_bf16 *d_gelu = device_upload(gelu_bits, (size_t)n_check * out * 2), *d_pre = device_poisoned((size_t)rows * out * 2);
    uint8_t *x8 = device_poisoned((size_t)rows * in), *w8 = device_poisoned((size_t)out * in);
    uint8_t *y8 = device_poisoned((size_t)rows * out), *scratch8 = device_poisoned((size_t)n_check * out);
    float *d_amax = device_poisoned(sizeof(float));
    fp8_scaling *s = fresh_scaling();
    fp8_quantize(s, 0, d_x, rows, in, x8, NULL, 0, 0);
    fp8_quantize(s, 1, d_w, out, in, w8, NULL, 0, 0);
    fp8_quantize(s, 3, d_gelu, n_check, out, scratch8, NULL, 0, 0); /* the output's scale from the host's values */
    const int done = gemm_fp8_fwd_gelu_fp8(g_gemm, x8, fp8_scale_inv(s, 0), rows, in, out, w8, fp8_scale_inv(s, 1), d_b,
                                           fp8_scale(s, 3), y8, d_pre, d_amax, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (!done) {
        printf("# gemm_fp8_fwd_gelu_fp8 (%s): cuBLASLt has no algorithm; the model casts the bf16 GELU output instead\n",
               sh->name);
    } else {
        float *pre = download_bf16(d_pre, (size_t)rows * out), *amax = download_f32(d_amax, 1);
        uint8_t *q = xmalloc((size_t)rows * out);
        CUDA_CHECK(cudaMemcpy(q, y8, (size_t)rows * out, cudaMemcpyDeviceToHost));
        float scale_inv;
        CUDA_CHECK(cudaMemcpy(&scale_inv, fp8_scale_inv(s, 3), sizeof scale_inv, cudaMemcpyDeviceToHost));
        char case_name[160];
        snprintf(case_name, sizeof case_name, "%s, GELU output in E4M3", sh->name);
        bound_check bc = bounds_for(0, 0, 1, "gemm_fp8_fwd_gelu_fp8 pre_gelu", case_name);
        for (int64_t i = 0; i < n_check; ++i) {
            const int64_t r = row_of(i, rows, sh->check_rows);
            for (int o = 0; o < out; ++o) {
                const int64_t k = i * out + o;
                check_element(&bc, pre[r * out + o], ref[k] - b[o], S[k], A[k], 1.0, b[o], 1);
                const double want = gelu_tanh(ref[k]), got = fp8_decode(q[r * out + o], 0) * scale_inv;
                const double gemm = kZ * bc.sigma * S[k] + kFastAccumulation * A[k] + kBf16Out * fabs(ref[k]);
                /* |gelu'| <= 1.13 anywhere (its largest value, near 1.5) */
                const double bound = (1.13 * gemm) * (1.0 + kU[0]) + kU[0] * fabs(want) + 0x1p-10 * scale_inv + 1e-6;
                if (!(fabs(got - want) <= bound))
                    fail_msg("%s: element (%lld, %d) decodes to %.6g, gelu(pre) = %.6g (bound %.3g)", case_name,
                             (long long)r, o, got, want, bound);
            }
        }
        check_norms(&bc, 1);
        printf("# %s: AMAX_D %.6g, host max |gelu| over the checked rows %.6g\n", case_name, amax[0], host_amax);
        if (!(amax[0] >= host_amax * (1.0 - 0x1p-4) && amax[0] <= host_amax * 2.0 + 1.0))
            fail_msg("%s: AMAX_D %.6g against the host's %.6g (of its rows)", case_name, amax[0], host_amax);
        free(pre), free(amax), free(q);
    }
    void *host[] = {x, x_bits, w, w_bits, b, b_bits, ref, S, A, gelu_bits};
    void *device[] = {d_x, d_w, d_b, d_gelu, d_pre, x8, w8, y8, scratch8, d_amax};
    free_host_buffers(host, 10);
    free_device_buffers(device, 10);
    fp8_scaling_free(s);
}

/* dgrad: dx = dy W (E5M2 x E4M3 through W's transpose), plain, times gelu'(gin), or added into dx0. */
static void check_dgrad(const shape *sh, int with_gelu, int accumulate)
{
    const int64_t rows = sh->rows;
    const int in = sh->in_dim, out = sh->out_dim;
    gpu_bf16 *dy_bits, *w_bits, *g_bits, *dx0_bits;
    float *dy = random_bf16((size_t)rows * out, 1e-3, &dy_bits);
    float *w = random_bf16((size_t)out * in, 1.0 / sqrt((double)out), &w_bits);
    float *gin = random_bf16(with_gelu ? (size_t)rows * in : 1, 1.5, &g_bits);
    float *dx0 = random_bf16(accumulate ? (size_t)rows * in : 1, 1e-3, &dx0_bits);
    gpu_bf16 *d_dy = device_upload(dy_bits, (size_t)rows * out * 2), *d_w = device_upload(w_bits, (size_t)out * in * 2);
    gpu_bf16 *d_gin = device_upload(g_bits, (with_gelu ? (size_t)rows * in : 1) * 2);
    gpu_bf16 *d_dx = accumulate ? device_upload(dx0_bits, (size_t)rows * in * 2) : device_poisoned((size_t)rows * in * 2);
    uint8_t *g8 = device_poisoned((size_t)rows * out), *gt8 = device_poisoned((size_t)out * gemm_fp8_padded_rows(rows));
    uint8_t *wt8 = device_poisoned((size_t)out * in);
    fp8_scaling *s = fresh_scaling();
    fp8_quantize(s, 2, d_dy, rows, out, g8, gt8, gemm_fp8_padded_rows(rows), 0);
    fp8_quantize(s, 1, d_w, out, in, NULL, wt8, out, 0);
    gemm_fp8_bwd_data(g_gemm, g8, fp8_scale_inv(s, 2), rows, in, out, wt8, fp8_scale_inv(s, 1),
                      with_gelu ? d_gin : NULL, d_dx, accumulate, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *dx = download_bf16(d_dx, (size_t)rows * in);
    char case_name[160];
    snprintf(case_name, sizeof case_name, "%s, %s", sh->name, with_gelu ? "GELU gradient" : accumulate ? "added" : "plain");
    bound_check bc = bounds_for(1, 0, 1, "gemm_fp8_bwd_data dx", case_name);
    const int64_t n_check = checked_count(rows, sh->check_rows);
    for (int64_t i = 0; i < n_check; ++i) {
        const int64_t r = row_of(i, rows, sh->check_rows);
        for (int c = 0; c < in; ++c) {
            double sum, S, A;
            dot_stats(dy + r * out, 1, w + c, in, out, &sum, &S, &A);
            const double scale = with_gelu ? gelu_tanh_grad(gin[r * in + c]) : 1.0;
            check_element(&bc, dx[r * in + c], sum, S, A, scale, accumulate ? dx0[r * in + c] : 0.0, 1);
        }
    }
    check_norms(&bc, 1);
    void *host[] = {dy, dy_bits, w, w_bits, gin, g_bits, dx0, dx0_bits, dx};
    void *device[] = {d_dy, d_w, d_gin, d_dx, g8, gt8, wt8};
    free_host_buffers(host, 9);
    free_device_buffers(device, 7);
    fp8_scaling_free(s);
}

/* wgrad: dW += dy^T x (E4M3 x^T, E5M2 dy^T, rows padded with zeros), fp32, no fast accumulation. */
static void check_wgrad(const shape *sh)
{
    const int64_t rows = sh->rows, padded = gemm_fp8_padded_rows(rows);
    const int in = sh->in_dim, out = sh->out_dim;
    gpu_bf16 *x_bits, *dy_bits;
    float *x = random_bf16((size_t)rows * in, 1.0, &x_bits);
    float *dy = random_bf16((size_t)rows * out, 1e-3, &dy_bits);
    uint64_t seed = g_seed++;
    float *dw0 = random_normal_f32(&seed, (size_t)out * in, 0.0, 1e-3);
    gpu_bf16 *d_x = device_upload(x_bits, (size_t)rows * in * 2), *d_dy = device_upload(dy_bits, (size_t)rows * out * 2);
    float *d_dw = device_upload(dw0, (size_t)out * in * sizeof(float));
    uint8_t *xt8 = device_poisoned((size_t)in * padded), *gt8 = device_poisoned((size_t)out * padded);
    uint8_t *g8 = device_poisoned((size_t)rows * out);
    fp8_scaling *s = fresh_scaling();
    fp8_quantize(s, 0, d_x, rows, in, NULL, xt8, padded, 0);
    fp8_quantize(s, 2, d_dy, rows, out, g8, gt8, padded, 0);
    gemm_fp8_bwd_weight(g_gemm, xt8, fp8_scale_inv(s, 0), gt8, fp8_scale_inv(s, 2), padded, in, out, d_dw, 1, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    float *dw = download_f32(d_dw, (size_t)out * in);
    char case_name[160];
    snprintf(case_name, sizeof case_name, "%s, added into dW", sh->name);
    bound_check bc = bounds_for(0, 1, 0, "gemm_fp8_bwd_weight dW", case_name);
    const int64_t n_check = checked_count(out, sh->check_rows);
    for (int64_t i = 0; i < n_check; ++i) {
        const int64_t o = row_of(i, out, sh->check_rows);
        for (int c = 0; c < in; ++c) {
            double sum, S, A;
            dot_stats(dy + o, out, x + c, in, rows, &sum, &S, &A);
            check_element(&bc, dw[o * in + c], sum, S, A, 1.0, dw0[o * in + c], 0);
        }
    }
    check_norms(&bc, 0);
    void *host[] = {x, x_bits, dy, dy_bits, dw0, dw};
    void *device[] = {d_x, d_dy, d_dw, xt8, gt8, g8};
    free_host_buffers(host, 6);
    free_device_buffers(device, 6);
    fp8_scaling_free(s);
}

static void test_forward(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; ++i) {
        check_forward(&kShapes[i], 0);
        check_forward(&kShapes[i], 1);
        check_forward_fp8_out(&kShapes[i]);
    }
}

static void test_dgrad(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; ++i) {
        check_dgrad(&kShapes[i], 0, 0);
        check_dgrad(&kShapes[i], 1, 0);
        check_dgrad(&kShapes[i], 0, 1);
    }
}

static void test_wgrad(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; ++i) check_wgrad(&kShapes[i]);
}

/* The bias gradient's column sums equal gemm_linear_bwd_weight's (the same kernels). */
static void test_column_sums(void **state)
{
    (void)state;
    const int64_t rows = 300;
    const int cols = 136;
    gpu_bf16 *bits;
    float *dy = random_bf16((size_t)rows * cols, 1.0, &bits);
    gpu_bf16 *d_dy = device_upload(bits, (size_t)rows * cols * 2);
    float *d_sum = device_poisoned(cols * sizeof(float));
    gemm_column_sums(g_gemm, d_dy, rows, cols, d_sum, 0, 0);
    float *sum = download_f32(d_sum, cols);
    for (int c = 0; c < cols; ++c) {
        double want = 0.0;
        for (int64_t r = 0; r < rows; ++r) want += dy[r * cols + c];
        assert_true(fabs(sum[c] - want) <= 1e-5 * (1.0 + fabs(want)) * sqrt((double)rows));
    }
    void *host[] = {dy, bits, sum};
    void *device[] = {d_dy, d_sum};
    free_host_buffers(host, 3);
    free_device_buffers(device, 2);
}

/* ---- the model in fp8 ------------------------------------------------------------------------------------- */

typedef struct {
    model_batch batch;
    int32_t frames[3], height[3], width[3], text_len[3];
    float sigma[3];
    float *latents, *noise, *text;
} fp8_batch;

/* The tiny Wan model (dim 64, FFN 128, 4 heads, 16 text tokens of 32) with `layers` blocks, gaussian weights. */
static void fp8_tiny_model(model *m, int layers)
{
    deck config;
    deck_defaults(&config);
    config.model.dim = 64;
    config.model.ffn_dim = 128;
    config.model.num_heads = 4;
    config.model.num_layers = layers;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.freq_dim = 32;
    model_create(m, &config);
    model_init_gaussian(m, 0xf8f8ull, 0.1f);
}

/* n (up to 3) samples packed of the given latent shapes and text rows, sigma 0.2, 0.5, 0.9. */
static void fp8_make_batch_of(const model *m, fp8_batch *fb, int n, const int32_t *frames, const int32_t *height,
                              const int32_t *width, const int32_t *text)
{
    memset(fb, 0, sizeof *fb);
    assert_true(n >= 1 && n <= 3);
    const float sigma[3] = {0.2f, 0.5f, 0.9f};
    memcpy(fb->frames, frames, n * sizeof *frames), memcpy(fb->height, height, n * sizeof *height);
    memcpy(fb->width, width, n * sizeof *width), memcpy(fb->text_len, text, n * sizeof *text);
    memcpy(fb->sigma, sigma, sizeof sigma);
    int64_t n_latent = 0, n_text = 0;
    for (int b = 0; b < n; ++b) {
        n_latent += (int64_t)m->in_dim * frames[b] * height[b] * width[b];
        n_text += (int64_t)text[b] * m->text_dim;
    }
    uint64_t seed = 0xba7c4ull;
    fb->latents = random_normal_f32(&seed, (size_t)n_latent, 0.0, 1.0);
    fb->noise = random_normal_f32(&seed, (size_t)n_latent, 0.0, 1.0);
    fb->text = random_normal_f32(&seed, (size_t)n_text, 0.0, 1.0);
    fb->batch.n_samples = n;
    fb->batch.frames = fb->frames, fb->batch.height = fb->height, fb->batch.width = fb->width;
    fb->batch.text_len = fb->text_len, fb->batch.sigma = fb->sigma;
    fb->batch.latents = fb->latents, fb->batch.noise = fb->noise, fb->batch.text = fb->text;
}

/* 3 samples packed: 1x8x8 (16 tokens), 3x4x6 (18), 2x6x10 (30); 16, 5 and 11 text rows. */
static void fp8_make_batch(const model *m, fp8_batch *fb)
{
    const int32_t frames[3] = {1, 3, 2}, height[3] = {8, 4, 6}, width[3] = {8, 6, 10}, text[3] = {16, 5, 11};
    fp8_make_batch_of(m, fb, 3, frames, height, width, text);
}

static void fp8_free_batch(fp8_batch *fb)
{
    free(fb->latents), free(fb->noise), free(fb->text);
}

/* A GPU model of m (fp8 or bf16, recomputation as given) with m's weights and zero gradients. */
static gpu_model *fp8_gpu_model(const model *m, int fp8, gpu_recompute recompute)
{
    gpu_model *gm = gpu_model_create_with_recompute(m, 256, 4, 0, recompute);
    gpu_model_set_precision(gm, fp8, 16, 0, 0);
    gpu_model_upload_weights(gm, m->weights);
    gpu_model_zero_grads(gm, 0);
    return gm;
}

static float *fp8_grads(const gpu_model *gm, const model *m)
{
    float *g = xmalloc((size_t)m->n_weights * sizeof *g);
    gpu_model_download_grads(gm, g);
    return g;
}

static int64_t count_differing(const float *a, const float *b, int64_t n)
{
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) differing += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return differing;
}

static void test_model_against_bf16(void **state)
{
    (void)state;
    model m;
    fp8_tiny_model(&m, 2);
    fp8_batch fb;
    fp8_make_batch(&m, &fb);
    const double sigma_fwd = sqrt(2.0 / 3.0) * kU[0], sigma_bwd = sqrt((kU[0] * kU[0] + kU[1] * kU[1]) / 3.0);
    const double G = 8.0 * m.num_layers, eps_f = sqrt(2.0 * G) * sigma_fwd, eps_b = sqrt(2.0 * G) * sigma_bwd;
    const double loss_bound = 2.0 * eps_f + eps_f * eps_f;
    const double grad_bound = sqrt(eps_f * eps_f + eps_b * eps_b + sigma_bwd * sigma_bwd);
    double loss[2];
    float *grads[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
        gpu_model *gm = fp8_gpu_model(&m, fp8, GPU_RECOMPUTE_NONE);
        loss[fp8] = gpu_model_forward_backward(gm, &fb.batch, 1.0f / 3.0f, NULL, 0);
        grads[fp8] = fp8_grads(gm, &m);
        gpu_model_free(gm);
    }
    const double loss_error = fabs(loss[1] - loss[0]) / fabs(loss[0]);
    const double grad_error = relative_l2_error(grads[1], grads[0], (size_t)m.n_weights);
    printf("# model fp8 vs bf16: loss %.6f vs %.6f (relative %.2e, bound %.2f); gradient relative L2 %.3e (bound %.2f)\n",
           loss[1], loss[0], loss_error, loss_bound, grad_error, grad_bound);
    expect_finite("fp8 model gradient", "2 blocks", grads[1], (size_t)m.n_weights);
    assert_true(loss_error <= loss_bound);
    assert_true(grad_error <= grad_bound);
    assert_true(count_differing(grads[0], grads[1], m.n_weights) > 0); /* the FP8 path ran */
    free(grads[0]), free(grads[1]);
    fp8_free_batch(&fb);
    model_free(&m);
}

/* The same after a step and its update: the delayed scales in use and the FFN's GELU emitting E4M3 directly (where
   cuBLASLt has the algorithm), within the same bounds of bf16 (the weights unchanged: no optimizer here). */
static void test_model_delayed_against_bf16(void **state)
{
    (void)state;
    model m;
    fp8_tiny_model(&m, 2);
    fp8_batch fb;
    fp8_make_batch(&m, &fb);
    const double sigma_fwd = sqrt(2.0 / 3.0) * kU[0], sigma_bwd = sqrt((kU[0] * kU[0] + kU[1] * kU[1]) / 3.0);
    const double G = 8.0 * m.num_layers, eps_f = sqrt(2.0 * G) * sigma_fwd, eps_b = sqrt(2.0 * G) * sigma_bwd;
    gpu_model *bf16 = fp8_gpu_model(&m, 0, GPU_RECOMPUTE_NONE), *fp8 = fp8_gpu_model(&m, 1, GPU_RECOMPUTE_NONE);
    const double loss_bf16 = gpu_model_forward_backward(bf16, &fb.batch, 1.0f / 3.0f, NULL, 0);
    float *g_bf16 = fp8_grads(bf16, &m);
    gpu_model_forward_backward(fp8, &fb.batch, 1.0f / 3.0f, NULL, 0);
    gpu_model_fp8_step(fp8, 0);
    gpu_model_zero_grads(fp8, 0);
    const double loss_fp8 = gpu_model_forward_backward(fp8, &fb.batch, 1.0f / 3.0f, NULL, 0);
    float *g_fp8 = fp8_grads(fp8, &m);
    const double loss_error = fabs(loss_fp8 - loss_bf16) / fabs(loss_bf16);
    const double grad_error = relative_l2_error(g_fp8, g_bf16, (size_t)m.n_weights);
    printf("# model fp8 (delayed scales) vs bf16: loss %.6f vs %.6f (relative %.2e); gradient relative L2 %.3e\n",
           loss_fp8, loss_bf16, loss_error, grad_error);
    expect_finite("fp8 model gradient, delayed scales", "2 blocks", g_fp8, (size_t)m.n_weights);
    assert_true(loss_error <= 2.0 * eps_f + eps_f * eps_f);
    assert_true(grad_error <= sqrt(eps_f * eps_f + eps_b * eps_b + sigma_bwd * sigma_bwd));
    free(g_bf16), free(g_fp8);
    gpu_model_free(bf16), gpu_model_free(fp8);
    fp8_free_batch(&fb);
    model_free(&m);
}

static void test_model_recompute_and_repeat(void **state)
{
    (void)state;
    model m;
    fp8_tiny_model(&m, 4);
    fp8_batch fb;
    fp8_make_batch(&m, &fb);
    /* per mode: a first step (casts by their own amax), a repeat of it after gpu_model_fp8_fresh, the update, a step
       on the delayed scales */
    double loss[2], again[2], delayed[2];
    float *grads[2];
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    for (int i = 0; i < 2; ++i) {
        gpu_model *gm = fp8_gpu_model(&m, 1, modes[i]);
        loss[i] = gpu_model_forward_backward(gm, &fb.batch, 1.0f / 3.0f, NULL, 0);
        /* the first call's casts recorded amaxes that later casts of the same tensors scale by (the FFN activation's
           fused FP8 output is cast at scale 1 first, by its recorded amax after): forgotten, as before a run's first
           step, the repeat is the first call again */
        gpu_model_fp8_fresh(gm, 0);
        again[i] = gpu_model_forward_backward(gm, &fb.batch, 1.0f / 3.0f, NULL, 0);
        gpu_model_fp8_step(gm, 0);
        gpu_model_zero_grads(gm, 0);
        delayed[i] = gpu_model_forward_backward(gm, &fb.batch, 1.0f / 3.0f, NULL, 0);
        grads[i] = fp8_grads(gm, &m);
        gpu_model_free(gm);
    }
    const int64_t differing = count_differing(grads[0], grads[1], m.n_weights);
    printf("# fp8 recompute block vs none: first step %.9g vs %.9g (repeated: %.9g), delayed scales %.9g vs %.9g, "
           "%lld gradient values differ\n", loss[1], loss[0], again[0], delayed[1], delayed[0], (long long)differing);
    assert_true(loss[1] == loss[0] && again[0] == loss[0] && again[1] == loss[1]);
    assert_true(delayed[1] == delayed[0]);
    assert_int_equal(differing, 0);
    free(grads[0]), free(grads[1]);
    fp8_free_batch(&fb);
    model_free(&m);
}

/* Model A: two steps (forward_backward, update); its state loaded into a fresh model B; both run the same batch. */
static void test_model_state_restore(void **state)
{
    (void)state;
    model m;
    fp8_tiny_model(&m, 2);
    fp8_batch fb;
    fp8_make_batch(&m, &fb);
    gpu_model *a = fp8_gpu_model(&m, 1, GPU_RECOMPUTE_NONE), *b = fp8_gpu_model(&m, 1, GPU_RECOMPUTE_NONE);
    for (int step = 0; step < 2; ++step) { /* gradients 6 times those below: other E5M2 scales than their own */
        gpu_model_forward_backward(a, &fb.batch, 2.0f, NULL, 0);
        gpu_model_fp8_step(a, 0);
    }
    const size_t bytes = gpu_model_fp8_state_bytes(a);
    assert_true(bytes > 0 && bytes == gpu_model_fp8_state_bytes(b));
    unsigned char *blob = xmalloc(bytes);
    gpu_model_fp8_save(a, blob, 0);
    char why[256];
    assert_int_equal(gpu_model_fp8_load(b, blob, bytes - 8, why, sizeof why), 1);
    assert_int_equal(gpu_model_fp8_load(b, blob, bytes, why, sizeof why), 0);
    gpu_model_zero_grads(a, 0);
    gpu_model_zero_grads(b, 0);
    const double loss_a = gpu_model_forward_backward(a, &fb.batch, 1.0f / 3.0f, NULL, 0);
    const double loss_b = gpu_model_forward_backward(b, &fb.batch, 1.0f / 3.0f, NULL, 0);
    float *ga = fp8_grads(a, &m), *gb = fp8_grads(b, &m);
    const int64_t differing = count_differing(ga, gb, m.n_weights);
    printf("# fp8 state restored: loss %.9g vs %.9g, %lld gradient values differ\n", loss_b, loss_a, (long long)differing);
    assert_true(loss_a == loss_b);
    assert_int_equal(differing, 0);
    /* a fresh model (scales from each cast's own amax) computes otherwise: the delayed scales were in use */
    gpu_model *c = fp8_gpu_model(&m, 1, GPU_RECOMPUTE_NONE);
    const double loss_c = gpu_model_forward_backward(c, &fb.batch, 1.0f / 3.0f, NULL, 0);
    float *gc = fp8_grads(c, &m);
    const int64_t differing_c = count_differing(ga, gc, m.n_weights);
    printf("# a fresh fp8 model: loss %.9g, %lld gradient values differ from the restored one's\n", loss_c,
           (long long)differing_c);
    assert_true(differing_c > 0);
    free(ga), free(gb), free(gc), free(blob);
    gpu_model_free(a), gpu_model_free(b), gpu_model_free(c);
    fp8_free_batch(&fb);
    model_free(&m);
}

/* ---- [train] fp8_attention ------------------------------------------------------------------------------------ */

/* A model with cuDNN's FP8 attention's head_dim (dim 256, 2 heads of 128, FFN 512, 2 blocks) in fp8 with the given
   attention mode, every sample of 16 tokens or more on cuDNN. */
static gpu_model *attention_model(const model *m, int attention, gpu_recompute recompute)
{
    gpu_model *gm = gpu_model_create_with_recompute(m, 512, 4, 64, recompute);
    assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 16), 1);
    gpu_model_set_precision(gm, 1, 16, 0, attention);
    gpu_model_upload_weights(gm, m->weights);
    gpu_model_zero_grads(gm, 0);
    return gm;
}

/* Step 1 (the probe: bf16 attention, FP8 calls for their amaxes only), the update, step 2; the losses, step 2's
   gradients and whether step 1's gradients equal `first` (NULL: not compared; *first_equal 1). */
static float *two_steps(gpu_model *gm, const model *m, const fp8_batch *fb, double loss[2], const float *first,
                        int *first_equal)
{
    loss[0] = gpu_model_forward_backward(gm, &fb->batch, 0.5f, NULL, 0);
    float *g1 = fp8_grads(gm, m);
    *first_equal = !first || count_differing(first, g1, m->n_weights) == 0;
    free(g1);
    gpu_model_fp8_step(gm, 0);
    gpu_model_zero_grads(gm, 0);
    loss[1] = gpu_model_forward_backward(gm, &fb->batch, 0.5f, NULL, 0);
    return fp8_grads(gm, m);
}

/* The FP8 self-attention (fp8 GEMMs in all runs): two samples on cuDNN, 128 tokens (whole tiles) and 88 (the last,
   run over 128 rows with the padding's rescale). Step 1 equals the GEMMs-only model's to the bit (the probe writes
   nothing the model reads) and leaves every attention tensor of both blocks an amax (scale != 1 after the update);
   step 2 runs FP8 attention (no call refused) within bounds of the GEMMs-only run derived from E4M3/E5M2 rounding of
   the attention's operands (q, k, v, p: four E4M3 roundings in the forward; do, dp and the outputs two E5M2 more in
   the backward, per block, beside the GEMMs' bounds of test_model_against_bf16); forward-only differs from both;
   recompute = block equals none to the bit. */
static void test_model_fp8_attention(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.model.dim = 256, config.model.ffn_dim = 512, config.model.num_heads = 2, config.model.num_layers = 2;
    config.model.text_len = 16, config.model.text_dim = 32, config.model.freq_dim = 32;
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 0xa77e5ull, 0.05f);
    fp8_batch fb;
    const int32_t frames[2] = {2, 1}, height[2] = {16, 16}, width[2] = {16, 22}, text[2] = {16, 9};
    fp8_make_batch_of(&m, &fb, 2, frames, height, width, text);

    double loss_ref[2], loss_att[2], loss_fwd[2], loss_blk[2];
    int equal_ref, equal_att, equal_fwd, equal_blk;
    gpu_model *ref = attention_model(&m, 0, GPU_RECOMPUTE_NONE);
    loss_ref[0] = gpu_model_forward_backward(ref, &fb.batch, 0.5f, NULL, 0);
    float *g1_ref = fp8_grads(ref, &m);
    gpu_model_free(ref);
    ref = attention_model(&m, 0, GPU_RECOMPUTE_NONE);
    float *g_ref = two_steps(ref, &m, &fb, loss_ref, g1_ref, &equal_ref);
    gpu_model *att = attention_model(&m, 2, GPU_RECOMPUTE_NONE);
    float *g_att = two_steps(att, &m, &fb, loss_att, g1_ref, &equal_att);
    gpu_model *fwd = attention_model(&m, 1, GPU_RECOMPUTE_NONE);
    float *g_fwd = two_steps(fwd, &m, &fb, loss_fwd, g1_ref, &equal_fwd);
    gpu_model *blk = attention_model(&m, 2, GPU_RECOMPUTE_BLOCK);
    float *g_blk = two_steps(blk, &m, &fb, loss_blk, g1_ref, &equal_blk);

    /* every attention tensor of both blocks was recorded by step 1 */
    const int n_linear = m.num_layers * 8 * 3, n_tensors = n_linear + m.num_layers * 10;
    fp8_scaling *sc = gpu_model_fp8_scaling(att);
    assert_int_equal(fp8_scaling_count(sc), n_tensors);
    float *scales = xmalloc((size_t)n_tensors * sizeof *scales);
    fp8_scaling_download(sc, scales, NULL, NULL, NULL);
    int unrecorded = 0;
    for (int t = n_linear; t < n_tensors; ++t) unrecorded += scales[t] == 1.0f;
    free(scales);

    const double sigma_fwd = sqrt(2.0 / 3.0) * kU[0], sigma_bwd = sqrt((kU[0] * kU[0] + kU[1] * kU[1]) / 3.0);
    const double G = 8.0 * m.num_layers, L = m.num_layers;
    const double attn_f = sqrt(4.0 / 3.0) * kU[0], attn_b = sqrt((4.0 * kU[0] * kU[0] + 3.0 * kU[1] * kU[1]) / 3.0);
    const double eps_f = sqrt(2.0 * G * sigma_fwd * sigma_fwd + 2.0 * L * attn_f * attn_f);
    const double eps_b = sqrt(2.0 * G * sigma_bwd * sigma_bwd + 2.0 * L * attn_b * attn_b);
    const double loss_bound = 2.0 * eps_f + eps_f * eps_f, grad_bound = sqrt(eps_f * eps_f + eps_b * eps_b);
    const double loss_error = fabs(loss_att[1] - loss_ref[1]) / fabs(loss_ref[1]);
    const double grad_error = relative_l2_error(g_att, g_ref, (size_t)m.n_weights);
    const double fwd_error = relative_l2_error(g_fwd, g_ref, (size_t)m.n_weights);
    printf("# fp8 attention: step 1 equal to the GEMMs-only model's: %s (forward-only %s, recompute block %s); "
           "%d attention tensors without an amax; refused calls %lld, %lld, %lld\n", equal_att ? "yes" : "no",
           equal_fwd ? "yes" : "no", equal_blk ? "yes" : "no", unrecorded, (long long)gpu_model_fp8_attention_refused(att),
           (long long)gpu_model_fp8_attention_refused(fwd), (long long)gpu_model_fp8_attention_refused(blk));
    printf("# step 2 against the GEMMs-only model: loss %.6f vs %.6f (relative %.2e, bound %.2f); gradient relative "
           "L2 %.3e (bound %.2f); forward only %.3e; recompute block: loss %.9g vs %.9g, %lld values differ\n",
           loss_att[1], loss_ref[1], loss_error, loss_bound, grad_error, grad_bound, fwd_error, loss_blk[1],
           loss_att[1], (long long)count_differing(g_blk, g_att, m.n_weights));
    assert_true(equal_ref && equal_att && equal_fwd && equal_blk);
    assert_true(loss_att[0] == loss_ref[0] && loss_fwd[0] == loss_ref[0]);
    assert_int_equal(unrecorded, 0);
    assert_int_equal(gpu_model_fp8_attention_refused(att), 0);
    assert_int_equal(gpu_model_fp8_attention_refused(fwd), 0);
    expect_finite("fp8 attention gradient", "2 blocks", g_att, (size_t)m.n_weights);
    assert_true(loss_error <= loss_bound);
    assert_true(grad_error <= grad_bound);
    assert_true(fwd_error <= grad_bound);
    assert_true(count_differing(g_att, g_ref, m.n_weights) > 0);  /* FP8 attention ran in step 2 */
    assert_true(count_differing(g_fwd, g_ref, m.n_weights) > 0 && count_differing(g_fwd, g_att, m.n_weights) > 0);
    assert_true(loss_blk[1] == loss_att[1]);
    assert_int_equal(count_differing(g_blk, g_att, m.n_weights), 0);
    free(g1_ref), free(g_ref), free(g_att), free(g_fwd), free(g_blk);
    gpu_model_free(ref), gpu_model_free(att), gpu_model_free(fwd), gpu_model_free(blk);
    fp8_free_batch(&fb);
    model_free(&m);
}

int main(void)
{
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    gpu_select(0);
    int major = 0, minor = 0;
    if (!fp8_gpu_supported(&major, &minor)) {
        char why[96];
        snprintf(why, sizeof why, "GPU of compute capability %d.%d has no FP8 tensor cores (8.9 or more)", major, minor);
        return skip_test_program(why);
    }
    g_gemm = gemm_create(0, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cast),    cmocka_unit_test(test_cast_gelu), cmocka_unit_test(test_cast_dbias),
        cmocka_unit_test(test_cast_dbias_dgelu),   cmocka_unit_test(test_amax_bound),
        cmocka_unit_test(test_delayed_scaling), cmocka_unit_test(test_forward),
        cmocka_unit_test(test_dgrad),   cmocka_unit_test(test_wgrad),           cmocka_unit_test(test_column_sums),
        cmocka_unit_test(test_model_against_bf16), cmocka_unit_test(test_model_delayed_against_bf16),
        cmocka_unit_test(test_model_recompute_and_repeat),
        cmocka_unit_test(test_model_state_restore),
        cmocka_unit_test(test_model_fp8_attention),
    };
    const int status = cmocka_run_group_tests(tests, NULL, NULL);
    gemm_free(g_gemm);
    return status;
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
