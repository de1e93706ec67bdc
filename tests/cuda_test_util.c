/* cuda_test_util.c — the helpers the CUDA test programs share (cuda_test_util.h): skip plan, device buffers, random
   bf16 data, relative-error checks that fail the running cmocka test. */
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

#endif /* HAVE_CUDA */
