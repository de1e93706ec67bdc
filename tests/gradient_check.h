/* gradient_check.h — finite-difference gradient checking and random fills shared by the model's tests (include after cmocka.h). */
#ifndef ALDIT_TEST_GRADIENT_CHECK_H
#define ALDIT_TEST_GRADIENT_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* Deterministic values in [-scale, scale). */
static inline float test_random(uint64_t *state, float scale)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return scale * (float)(2.0 * ((double)(z >> 11) / 9007199254740992.0) - 1.0);
}

static inline void fill_random(float *values, int64_t n, uint64_t seed, float scale)
{
    uint64_t state = seed;
    for (int64_t i = 0; i < n; i++) values[i] = test_random(&state, scale);
}

/* J = sum_i weight_i * y_i in double: the scalar whose gradient a backward with dy = weight computes. */
static inline double weighted_sum(const float *y, const float *weight, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)weight[i] * y[i];
    return sum;
}

/* The scalar objective at the current values of the inputs. */
typedef double (*objective_fn)(void *context);

/* Central differences of `objective` with respect to values[i] (each perturbed by +-step, then restored)
   for at most max_checks entries (all of them when n_values <= max_checks, else an evenly spread,
   seeded subset), compared with analytic[i]. Returns ||numeric - analytic|| / max(||numeric||, ||analytic||)
   over the checked entries. A gradient that is zero on every checked entry proves nothing: that returns 1
   (a failure), so the inputs of a check must be random enough to give every entry a gradient. */
static inline double gradient_error(objective_fn objective, void *context, float *values, const float *analytic,
                                    int64_t n_values, int max_checks, float step, uint64_t seed)
{
    double diff_sq = 0.0, numeric_sq = 0.0, analytic_sq = 0.0;
    uint64_t state = seed;
    int n_checks = n_values <= max_checks ? (int)n_values : max_checks;
    for (int c = 0; c < n_checks; c++) {
        int64_t i = c;
        if (n_values > max_checks) {
            double u = 0.5 + 0.5 * test_random(&state, 1.0f);
            i = (int64_t)(((double)c + u) * (double)n_values / max_checks);
            if (i >= n_values) i = n_values - 1;
        }
        float saved = values[i];
        values[i] = saved + step;
        double plus = objective(context);
        values[i] = saved - step;
        double minus = objective(context);
        values[i] = saved;
        double numeric = (plus - minus) / (2.0 * step);
        diff_sq += (numeric - analytic[i]) * (numeric - analytic[i]);
        numeric_sq += numeric * numeric;
        analytic_sq += (double)analytic[i] * analytic[i];
    }
    double norm = sqrt(numeric_sq > analytic_sq ? numeric_sq : analytic_sq);
    return norm == 0.0 ? 1.0 : sqrt(diff_sq) / norm;
}

/* Relative tolerance on the norm of the difference for fp32 central differences. */
#define GRADIENT_TOLERANCE 1e-2

#define ASSERT_GRADIENT(what, error) do { \
    double error_ = (error); \
    print_message("# %-40s relative error %.2e\n", (what), error_); \
    assert_true(error_ < GRADIENT_TOLERANCE); \
} while (0)

#endif
