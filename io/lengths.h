/* lengths.h — length specs (weighted latent shapes, one bucket per line), seeded shape draws and the small PRNG behind them. */
#ifndef ALDIT_LENGTHS_H
#define ALDIT_LENGTHS_H

#include <stdint.h>
#include <stdio.h>

/* Largest frames / height / width a length spec may give (latent units). */
#define LENGTHS_MAX_DIM 65536
/* Largest sum of a spec's weights: weights are relative, and a sum past this (or one that overflows to
   infinity) would make the draw pick one bucket whatever the others' weights. */
#define LENGTHS_MAX_WEIGHT_SUM 1e15

/* Largest caption length (text tokens) a length spec may give. */
#define LENGTHS_MAX_TEXT 65536

/* latent units: F_lat, H_lat, W_lat; the caption's text tokens drawn uniformly from [text_min, text_max] (both 0:
   the line gives none, the user of the draw decides, e.g. [model] text_len) */
typedef struct { double weight; int32_t frames, height, width, text_min, text_max; } length_bucket;

/* Parse a length spec (one bucket per line: `weight frames height width [text]`, '#' comments, blank lines ok).
   Weights are positive finite numbers (relative, need not sum to 1) whose sum is at most
   LENGTHS_MAX_WEIGHT_SUM (the line where the running sum passes it is reported); frames, height and
   width are integers in [1, LENGTHS_MAX_DIM]. The optional fifth field gives the bucket's caption lengths in text
   tokens: `L` (every caption L tokens) or `MIN-MAX` (each sample's drawn uniformly from MIN to MAX, both included),
   integers in [1, LENGTHS_MAX_TEXT], MIN <= MAX. Errors "FILE:LINE: message" to `errors` (every bad line is
   reported); returns the number of errors (0 = ok, and then *buckets holds *n_buckets >= 1 entries
   the caller frees). */
int lengths_load(const char *path, length_bucket **buckets, int *n_buckets, FILE *errors);

/* Draw n_samples shapes from the buckets with probability proportional to weight, deterministic in seed. */
void lengths_draw(const length_bucket *buckets, int n_buckets, int64_t n_samples, uint64_t seed,
                  int32_t *frames, int32_t *height, int32_t *width);
/* lengths_draw's shapes (the same, for the same seed) and, in text[], each sample's caption length drawn from its
   bucket's range (a stream of its own, so the shapes do not depend on the captions), 0 where the bucket gives none. */
void lengths_draw_text(const length_bucket *buckets, int n_buckets, int64_t n_samples, uint64_t seed,
                       int32_t *frames, int32_t *height, int32_t *width, int32_t *text);

#endif
