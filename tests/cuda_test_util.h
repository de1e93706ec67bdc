/* cuda_test_util.h — what the CUDA test programs share: the TAP skip plan, device buffers (uploaded, NaN-poisoned,
   downloaded), random bf16-rounded host data, and the relative-error comparisons with finiteness checks. */
#ifndef ALDIT_CUDA_TEST_UTIL_H
#define ALDIT_CUDA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Print the TAP plan "1..0 # SKIP <reason>" and return the exit status of a skipped test program: 0 under make check
   (CMOCKA_MESSAGE_OUTPUT=TAP, where a skipped file is that plan), 77 when run by hand (automake's skip status). */
int skip_test_program(const char *reason);

#ifdef HAVE_CUDA

#include "cuda/gpu.h"
#include "cuda/model_gpu.h"
#include "model/model.h"

/* A device copy of n_bytes of host memory (at least 16 bytes allocated, so empty tensors get a valid pointer). */
void *device_upload(const void *host, size_t n_bytes);

/* A device buffer of n_bytes (at least 16) poisoned with NaN: all bits set is NaN in bf16, fp32 and fp64, so a
   value never written cannot pass. Both it and device_upload wait for their copy or fill to finish: kernels on
   non-blocking streams do not wait for the default stream. */
void *device_poisoned(size_t n_bytes);

/* Set n_bytes of a device buffer to NaN again (nothing when n_bytes is 0). */
void device_poison(void *device, size_t n_bytes);

/* n device values copied to a new host array (n + 1 allocated, so n = 0 is fine); free() it. */
float *download_f32(const float *device, size_t n);
gpu_bf16 *download_bf16_bits(const gpu_bf16 *device, size_t n);
/* n device bf16 values widened to floats. */
float *download_bf16(const gpu_bf16 *device, size_t n);

/* cudaFree / free of each of n buffers. */
void free_device_buffers(void **buffers, size_t n);
void free_host_buffers(void **buffers, size_t n);

/* n values normal(mean, spread) from *seed, rounded to bf16: the values as floats (returned) and their bits in
   *bits (both n + 1 long; free() both). */
float *random_normal_bf16(uint64_t *seed, size_t n, double mean, double spread, gpu_bf16 **bits);
/* n fp32 values normal(mean, spread) from *seed (n + 1 allocated). */
float *random_normal_f32(uint64_t *seed, size_t n, double mean, double spread);

/* ||got - want|| / ||want|| over n values (||got - want|| when want is all zero); NaN when a value is NaN. */
double relative_l2_error(const float *got, const float *want, size_t n);

/* How many of the n values are NaN or infinite. */
size_t count_nonfinite(const float *values, size_t n);

/* Fails the cmocka test unless every one of the n values is finite ("WHAT (CASE): element I is V (not written or not
   finite)"): the whole output, nothing left unwritten. */
void expect_finite(const char *what, const char *case_name, const float *got, size_t n);

/* Fails the cmocka test unless every value of got is finite and relative_l2_error(got, want) <= tolerance; where
   ||want||^2 <= 1e-12 the bound is near_zero_bound instead (pass tolerance to keep one bound). */
void expect_close(const char *what, const char *case_name, const float *got, const float *want, size_t n,
                  double tolerance, double near_zero_bound);

/* expect_close for outputs that may hold -inf: where want is -inf, got must be -inf too, and those values are left
   out of the error (attention's lse of a row with no keys). */
void expect_close_or_neg_inf(const char *what, const char *case_name, const float *got, const float *want, size_t n,
                             double tolerance, double near_zero_bound);

/* The GPU model (gm, holding m's weights) against the CPU model m, its oracle, on one micro-batch: loss, per-sample
   losses and every parameter's gradient (grad_scale 1 / samples), relative to the CPU's within loss_tolerance and
   gradient_tolerance (the whole gradient and each parameter's; a bias whose exact gradient is zero — softmax ignores
   a bias added to every key where no norm follows, so its CPU norm is under 1e-6 of its layer's weight gradient's —
   against that weight gradient's norm), no value not finite; then the same call again gives the same loss within
   1e-5 and adds the same gradient within 1e-3. Prints every figure (TAP comments) before failing the cmocka test
   with the first that is off. At most 16 samples. */
void expect_gpu_matches_cpu(const char *case_name, model *m, gpu_model *gm, const model_batch *batch,
                            double loss_tolerance, double gradient_tolerance);

/* [train] prebuild's contract on one micro-batch: gpu_model_prepare(gm, tokens, text_rows, n) builds `expected`
   plans, a second call none, and then gm's forward and backward of batch build none of their own (setup_stats). */
void expect_prepared_plans(gpu_model *gm, const int32_t *tokens, const int32_t *text_rows, int n, int64_t expected,
                           const model_batch *batch);

/* Milliseconds per call of `repeats` calls of fn(context) timed with events on stream 0, after one warm-up call. */
double gpu_milliseconds_per_call(void (*fn)(void *), void *context, int repeats);

#endif /* HAVE_CUDA */

#endif
