/* cuda_test_util.c — the helpers the CUDA test programs share (cuda_test_util.h): skip plan, device buffers, random
   bf16 data, relative-error checks that fail the running cmocka test, a GPU model against its CPU oracle. */
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

int skip_test_program(const char *reason)
{
    printf("1..0 # SKIP %s\n", reason);
    const char *output = getenv("CMOCKA_MESSAGE_OUTPUT");
    return output && strcmp(output, "TAP") == 0 ? 0 : 77;
}

#ifdef HAVE_CUDA

#include <math.h>

#include "core/check.h"
#include "core/rng.h"

void *device_upload(const void *host, size_t n_bytes)
{
    void *device = NULL;
    CUDA_CHECK(cudaMalloc(&device, n_bytes > 0 ? n_bytes : 16));
    if (n_bytes > 0) CUDA_CHECK(cudaMemcpy(device, host, n_bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    return device;
}

void *device_poisoned(size_t n_bytes)
{
    void *device = NULL;
    CUDA_CHECK(cudaMalloc(&device, n_bytes > 0 ? n_bytes : 16));
    CUDA_CHECK(cudaMemset(device, 0xff, n_bytes > 0 ? n_bytes : 16));
    CUDA_CHECK(cudaDeviceSynchronize());
    return device;
}

void device_poison(void *device, size_t n_bytes)
{
    if (n_bytes > 0) CUDA_CHECK(cudaMemset(device, 0xff, n_bytes));
}

float *download_f32(const float *device, size_t n)
{
    float *host = xmalloc((n + 1) * sizeof *host);
    if (n > 0) CUDA_CHECK(cudaMemcpy(host, device, n * sizeof *host, cudaMemcpyDeviceToHost));
    return host;
}

gpu_bf16 *download_bf16_bits(const gpu_bf16 *device, size_t n)
{
    gpu_bf16 *bits = xmalloc((n + 1) * sizeof *bits);
    if (n > 0) CUDA_CHECK(cudaMemcpy(bits, device, n * sizeof *bits, cudaMemcpyDeviceToHost));
    return bits;
}

float *download_bf16(const gpu_bf16 *device, size_t n)
{
    gpu_bf16 *bits = download_bf16_bits(device, n);
    float *host = xmalloc((n + 1) * sizeof *host);
    for (size_t i = 0; i < n; ++i) host[i] = gpu_float_from_bf16(bits[i]);
    free(bits);
    return host;
}

void free_device_buffers(void **buffers, size_t n)
{
    for (size_t i = 0; i < n; ++i) CUDA_CHECK(cudaFree(buffers[i]));
}

void free_host_buffers(void **buffers, size_t n)
{
    for (size_t i = 0; i < n; ++i) free(buffers[i]);
}

float *random_normal_bf16(uint64_t *seed, size_t n, double mean, double spread, gpu_bf16 **bits)
{
    float *values = xmalloc((n + 1) * sizeof *values);
    *bits = xmalloc((n + 1) * sizeof **bits);
    for (size_t i = 0; i < n; ++i) {
        (*bits)[i] = gpu_bf16_from_float((float)(mean + spread * rng_normal(seed)));
        values[i] = gpu_float_from_bf16((*bits)[i]);
    }
    return values;
}

float *random_normal_f32(uint64_t *seed, size_t n, double mean, double spread)
{
    float *values = xmalloc((n + 1) * sizeof *values);
    for (size_t i = 0; i < n; ++i) values[i] = (float)(mean + spread * rng_normal(seed));
    return values;
}

double relative_l2_error(const float *got, const float *want, size_t n)
{
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double)got[i] - (double)want[i];
        diff2 += d * d;
        ref2 += (double)want[i] * want[i];
    }
    return sqrt(diff2) / (ref2 > 0.0 ? sqrt(ref2) : 1.0);
}

size_t count_nonfinite(const float *values, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) count += !isfinite(values[i]);
    return count;
}

void expect_finite(const char *what, const char *case_name, const float *got, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(got[i]))
            fail_msg("%s (%s): element %zu is %g (not written or not finite)", what, case_name, i, got[i]);
}

/* expect_close and expect_close_or_neg_inf; allow_neg_inf: a -inf in want asks for -inf in got. */
static void expect_close_where(const char *what, const char *case_name, const float *got, const float *want, size_t n,
                               double tolerance, double near_zero_bound, int allow_neg_inf)
{
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (allow_neg_inf && isinf(want[i]) && want[i] < 0) {
            if (!(isinf(got[i]) && got[i] < 0))
                fail_msg("%s (%s): element %zu is %g, want -inf (a sample without keys)", what, case_name, i, got[i]);
            continue;
        }
        if (!isfinite(got[i]))
            fail_msg("%s (%s): element %zu is %g (not written or not finite), want %g", what, case_name, i, got[i],
                     want[i]);
        const double d = (double)got[i] - (double)want[i];
        diff2 += d * d;
        ref2 += (double)want[i] * want[i];
    }
    const double error = sqrt(diff2) / (ref2 > 0.0 ? sqrt(ref2) : 1.0);
    if (!(error <= (ref2 > 1e-12 ? tolerance : near_zero_bound)))
        fail_msg("%s (%s): relative error %.3e over %zu values (tolerance %.0e)", what, case_name, error, n, tolerance);
}

void expect_close(const char *what, const char *case_name, const float *got, const float *want, size_t n,
                  double tolerance, double near_zero_bound)
{
    expect_close_where(what, case_name, got, want, n, tolerance, near_zero_bound, 0);
}

void expect_close_or_neg_inf(const char *what, const char *case_name, const float *got, const float *want, size_t n,
                             double tolerance, double near_zero_bound)
{
    expect_close_where(what, case_name, got, want, n, tolerance, near_zero_bound, 1);
}

double gpu_milliseconds_per_call(void (*fn)(void *), void *context, int repeats)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    fn(context);
    CUDA_CHECK(cudaEventRecord(start, 0));
    for (int r = 0; r < repeats; ++r) fn(context);
    CUDA_CHECK(cudaEventRecord(stop, 0));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return ms / repeats;
}


/* ---- a GPU model against the CPU model ---------------------------------------------------------------------- */

static double l2_norm(const float *x, int64_t n)
{
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += (double)x[j] * x[j];
    return sqrt(sum);
}

static double l2_distance(const float *x, const float *y, int64_t n)
{
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
    return sqrt(sum);
}

/* What parameter i's gradient error is relative to (expect_gpu_matches_cpu): its CPU gradient's norm, or, for a bias
   whose CPU gradient is under 1e-6 of its layer's weight gradient (exactly zero but for roundoff), that weight
   gradient's norm. */
static double reference_norm(const model *m, const float *grads, int i, double norm)
{
    const char *name = m->params[i].name;
    const size_t length = strlen(name);
    if (length < 5 || strcmp(name + length - 5, ".bias") != 0) return norm;
    for (int w = 0; w < m->n_params; ++w) {
        const char *other = m->params[w].name;
        if (strlen(other) != length + 2 || strncmp(other, name, length - 4) != 0 || strcmp(other + length - 4, "weight"))
            continue;
        const double weight = l2_norm(grads + m->params[w].offset, m->params[w].n_elements);
        return norm < 1e-6 * weight ? weight : norm;
    }
    return norm;
}

typedef struct {
    const char *name;
    double error, norm;
} param_error;

static int by_error_descending(const void *a, const void *b)
{
    const double ea = ((const param_error *)a)->error, eb = ((const param_error *)b)->error;
    return ea < eb ? 1 : (ea > eb ? -1 : 0);
}

void expect_prepared_plans(gpu_model *gm, const int32_t *tokens, const int32_t *text_rows, int n, int64_t expected,
                           const model_batch *batch)
{
    const int64_t built = gpu_model_prepare(gm, tokens, text_rows, n);
    printf("# prepared: %lld plan(s) for %d sample(s), %lld expected\n", (long long)built, n, (long long)expected);
    assert_int_equal(built, expected);
    assert_int_equal(gpu_model_prepare(gm, tokens, text_rows, n), 0);
    int64_t before, after;
    double seconds;
    gpu_model_setup_stats(gm, &before, &seconds);
    gpu_model_forward_backward(gm, batch, 1.0f, NULL, 0);
    gpu_model_setup_stats(gm, &after, &seconds);
    assert_int_equal(after, before);
}

enum { kMostSamples = 16 };

void expect_gpu_matches_cpu(const char *case_name, model *m, gpu_model *gm, const model_batch *batch,
                            double loss_tolerance, double gradient_tolerance)
{
    const int B = batch->n_samples;
    assert_true(B > 0 && B <= kMostSamples);
    const float grad_scale = 1.0f / (float)B;
    const size_t n = (size_t)m->n_weights;
    float *grads_cpu = xcalloc(n, sizeof(float));
    double loss_cpu_sample[kMostSamples], loss_gpu_sample[kMostSamples], loss_again_sample[kMostSamples];
    const double loss_cpu = model_forward_backward(m, batch, grads_cpu, grad_scale, loss_cpu_sample);
    const double loss_gpu = gpu_model_forward_backward(gm, batch, grad_scale, loss_gpu_sample, 0);
    float *grads_gpu = xmalloc(n * sizeof(float));
    gpu_model_download_grads(gm, grads_gpu);

    printf("# %s: loss cpu %.6f gpu %.6f (relative error %.2e)\n", case_name, loss_cpu, loss_gpu,
           fabs(loss_gpu - loss_cpu) / fabs(loss_cpu));
    for (int b = 0; b < B; ++b) printf("#   sample %d: cpu %.6f gpu %.6f\n", b, loss_cpu_sample[b], loss_gpu_sample[b]);
    const size_t nonfinite = count_nonfinite(grads_gpu, n);
    const double whole = relative_l2_error(grads_gpu, grads_cpu, n);
    param_error *errors = xmalloc((size_t)m->n_params * sizeof(param_error));
    for (int i = 0; i < m->n_params; ++i) {
        const param_info *p = &m->params[i];
        errors[i].name = p->name;
        errors[i].norm = l2_norm(grads_cpu + p->offset, p->n_elements);
        errors[i].error = l2_distance(grads_gpu + p->offset, grads_cpu + p->offset, p->n_elements) /
                          reference_norm(m, grads_cpu, i, errors[i].norm);
    }
    qsort(errors, (size_t)m->n_params, sizeof *errors, by_error_descending);
    printf("# %s: gradient relative error %.2e over %zu values (cpu norm %.3e, %zu not finite); worst parameters:\n",
           case_name, whole, n, l2_norm(grads_cpu, (int64_t)n), nonfinite);
    for (int i = 0; i < m->n_params && i < 8; ++i)
        printf("#   %-70s %.2e (cpu norm %.3e)\n", errors[i].name, errors[i].error, errors[i].norm);

    /* the same call again: the same loss, and it ADDS the same gradient (bf16 rounding flips allowed) */
    const double loss_again = gpu_model_forward_backward(gm, batch, grad_scale, loss_again_sample, 0);
    float *grads_twice = xmalloc(n * sizeof(float));
    gpu_model_download_grads(gm, grads_twice);
    for (size_t i = 0; i < n; ++i) grads_gpu[i] *= 2.0f;
    const size_t nonfinite_twice = count_nonfinite(grads_twice, n);
    const double accumulate_error = relative_l2_error(grads_twice, grads_gpu, n);
    printf("# %s: second call: loss %.9g vs %.9g, gradient vs twice the first %.2e\n", case_name, loss_again, loss_gpu,
           accumulate_error);

    /* asserts after the report, so that a failure shows every figure above */
    if (!(fabs(loss_gpu - loss_cpu) <= loss_tolerance * fabs(loss_cpu)))
        fail_msg("%s: loss gpu %g vs cpu %g", case_name, loss_gpu, loss_cpu);
    for (int b = 0; b < B; ++b)
        if (!(fabs(loss_gpu_sample[b] - loss_cpu_sample[b]) <= loss_tolerance * fabs(loss_cpu_sample[b])))
            fail_msg("%s: sample %d loss gpu %g vs cpu %g", case_name, b, loss_gpu_sample[b], loss_cpu_sample[b]);
    if (nonfinite > 0) fail_msg("%s: %zu gradient values not finite", case_name, nonfinite);
    if (!(whole <= gradient_tolerance)) fail_msg("%s: gradient relative error %.3e", case_name, whole);
    if (!(errors[0].error <= gradient_tolerance))
        fail_msg("%s: gradient of %s: relative error %.3e", case_name, errors[0].name, errors[0].error);
    if (!(fabs(loss_again - loss_gpu) <= 1e-5 * fabs(loss_gpu)))
        fail_msg("%s: the same batch gave loss %.9g, then %.9g", case_name, loss_gpu, loss_again);
    if (!(accumulate_error <= 1e-3) || nonfinite_twice)
        fail_msg("%s: a second call did not add the same gradient (relative error %.3e)", case_name, accumulate_error);
    free(errors);
    free(grads_twice);
    free(grads_gpu);
    free(grads_cpu);
}

#endif /* HAVE_CUDA */
