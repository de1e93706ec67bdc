/* test_objective.c — the flow objective's draws (train/prefetch.h): sigma's laws and shift against their quantiles, the image-to-video share, determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "train/prefetch.h"

enum { DRAWS = 200000 };

static int compare_floats(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The shifted sigma at quantile q of u: shift u / (1 + (shift - 1) u). */
static double shifted(double u, double shift) { return shift * u / (1.0 + (shift - 1.0) * u); }

/* Quantiles 0.1, 0.5 and 0.9 of DRAWS sigmas (ids 0.., epoch 3) against the law's: uniform u has them at q,
   logit-normal u at sigmoid(z_q) (z_0.1 = -1.2815516, moved into [1e-5, 1 - 1e-5] as the official trainer does). */
static void check_quantiles(prefetch_noise noise)
{
    float *sigma = malloc(DRAWS * sizeof *sigma);
    for (int64_t id = 0; id < DRAWS; id++) {
        sigma[id] = prefetch_sigma(&noise, 3, id);
        assert_true(sigma[id] > 0.0f && sigma[id] < 1.0f);
    }
    qsort(sigma, DRAWS, sizeof *sigma, compare_floats);
    const double q[3] = {0.1, 0.5, 0.9}, z[3] = {-1.2815516, 0.0, 1.2815516};
    for (int k = 0; k < 3; k++) {
        const double u = noise.logit_normal ? 1e-5 + (1.0 - 2e-5) / (1.0 + exp(-z[k])) : q[k];
        const double want = shifted(u, noise.timestep_shift), got = sigma[(int)(q[k] * DRAWS)];
        print_message("# %s shift %g: quantile %.1f of sigma %.4f, the law's %.4f\n",
                      noise.logit_normal ? "logit-normal" : "uniform", noise.timestep_shift, q[k], got, want);
        assert_true(fabs(got - want) < 0.005);
    }
    free(sigma);
}

static void test_sigma_laws(void **state)
{
    (void)state;
    check_quantiles((prefetch_noise){.noise_seed = 11, .timestep_shift = 3.0, .logit_normal = 1});
    check_quantiles((prefetch_noise){.noise_seed = 11, .timestep_shift = 3.0, .logit_normal = 0});
    check_quantiles((prefetch_noise){.noise_seed = 12, .timestep_shift = 5.0, .logit_normal = 0});
}

/* The same (seed, epoch, id) gives the same draws; another epoch or seed others. */
static void test_determinism(void **state)
{
    (void)state;
    const prefetch_noise a = {.noise_seed = 7, .timestep_shift = 3.0, .logit_normal = 1, .i2v_share = 0.5};
    prefetch_noise b = a;
    int same_epoch = 0, other_epoch = 0, other_seed = 0;
    b.noise_seed = 8;
    for (int64_t id = 0; id < 1000; id++) {
        same_epoch += prefetch_sigma(&a, 2, id) == prefetch_sigma(&a, 2, id) &&
                      prefetch_i2v(&a, 2, id, 1) == prefetch_i2v(&a, 2, id, 1);
        other_epoch += prefetch_sigma(&a, 2, id) == prefetch_sigma(&a, 3, id);
        other_seed += prefetch_sigma(&a, 2, id) == prefetch_sigma(&b, 2, id);
    }
    assert_int_equal(same_epoch, 1000);
    assert_true(other_epoch < 5 && other_seed < 5);
}

/* Of the eligible samples, the share drawn as image-to-video is i2v_share (binomial: 4 standard deviations);
   an ineligible sample, and any sample under share 0, never is; under share 1, every eligible one is. */
static void test_i2v_share(void **state)
{
    (void)state;
    const double shares[3] = {0.3, 0.5, 1.0};
    for (int k = 0; k < 3; k++) {
        const prefetch_noise noise = {.noise_seed = 5, .timestep_shift = 3.0, .logit_normal = 1, .i2v_share = shares[k]};
        int64_t drawn = 0, ineligible = 0;
        for (int64_t id = 0; id < DRAWS; id++) {
            drawn += prefetch_i2v(&noise, 1, id, 1);
            ineligible += prefetch_i2v(&noise, 1, id, 0);
        }
        const double share = (double)drawn / DRAWS, tolerance = 4.0 * sqrt(shares[k] * (1 - shares[k]) / DRAWS) + 1e-12;
        print_message("# i2v_share %.1f: %.4f of %d eligible samples drawn\n", shares[k], share, DRAWS);
        assert_true(fabs(share - shares[k]) <= tolerance);
        assert_int_equal(ineligible, 0);
    }
    const prefetch_noise none = {.noise_seed = 5, .timestep_shift = 3.0, .i2v_share = 0.0};
    for (int64_t id = 0; id < 1000; id++) assert_int_equal(prefetch_i2v(&none, 1, id, 1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigma_laws),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_i2v_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
