/* rng.h — aldit's one random-number source: splitmix64 streams and counter-based draws (header only). */
#ifndef ALDIT_RNG_H
#define ALDIT_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64 step: a sequential stream from a 64-bit state. */
static inline uint64_t rng_next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Counter-based draw: the same (key, counter) gives the same bits on every rank and every run, so noise
   and timesteps can be tied to (seed, epoch, sample id) instead of to which rank holds a sample. */
static inline uint64_t rng_hash(uint64_t key, uint64_t counter)
{
    uint64_t state = key ^ (counter * 0xD1B54A32D192ED03ull);
    rng_next_u64(&state);
    return rng_next_u64(&state);
}

/* Derive a stream key from up to three identifiers (e.g. seed, epoch, sample id). */
static inline uint64_t rng_key(uint64_t a, uint64_t b, uint64_t c)
{
    return rng_hash(rng_hash(a, b), c);
}

/* Uniform double in [0, 1) from 53 random bits. */
static inline double rng_uniform(uint64_t *state) { return (double)(rng_next_u64(state) >> 11) * 0x1.0p-53; }

/* Uniform integer in [0, n) (n > 0), Lemire's multiply-shift (bias below 2^-32 for n < 2^32). */
static inline uint64_t rng_below(uint64_t *state, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)rng_next_u64(state) * n) >> 64);
}

/* Two independent standard normals by Box–Muller: the first is returned, the second stored. */
static inline double rng_normal_pair(uint64_t *state, double *second)
{
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    const double radius = sqrt(-2.0 * log(u1)), angle = 6.283185307179586 * u2;
    *second = radius * sin(angle);
    return radius * cos(angle);
}

/* Standard normal by Box–Muller (one of the pair). */
static inline double rng_normal(uint64_t *state)
{
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
