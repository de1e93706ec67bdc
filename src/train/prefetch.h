/* prefetch.h — the background reader: reads the next step's samples from the store, and draws their noise and
   timesteps, while this step computes. */
#ifndef ALDIT_PREFETCH_H
#define ALDIT_PREFETCH_H

#include <stdint.h>

#include "io/store.h"

/* One rank's samples of one step, fp32, back to back in the order of `ids`. */
typedef struct {
    int n_samples;
    int64_t *ids;          /* store sample ids */
    int64_t *latent_start; /* n_samples + 1 offsets (elements) into latents */
    int64_t *text_start;   /* n_samples + 1 offsets (elements) into text */
    float *latents;        /* [C, F, H, W] per sample */
    float *text;           /* [text_len, text_dim] per sample */
    float *noise;          /* epsilon of the flow objective, the layout of latents */
    float *sigma;          /* per sample, in (0, 1) */
    /* The caption sources (a store with them; else every length 0): ByT5 rows [text_2_len, text_2_dim] and SigLIP
       rows [image_len, image_dim] back to back from text_2_start / image_start (n_samples + 1 element offsets).
       i2v: 1 when the sample trains as image-to-video (prefetch_noise's i2v_share of the videos that have SigLIP
       rows); image_len is the stored count for those and 0 for the rest (text-to-video takes no image rows). */
    int64_t *text_2_start, *image_start;
    int32_t *text_2_len, *image_len;
    unsigned char *i2v;
    float *text_2, *image;
    unsigned char *failed; /* per sample: 1 when its read failed (its values are not to be used) */
    int n_failed;          /* samples whose read failed */
    int samples_capacity;
    int64_t latents_capacity, text_capacity, text_2_capacity, image_capacity;
    float *scratch;        /* a text-to-video sample's SigLIP rows, read for the checksum alone */
    int64_t scratch_capacity;
} sample_batch;

typedef struct prefetcher prefetcher;

/* How each sample's noise, timestep and task are drawn: from streams keyed by (noise_seed, epoch, sample id) (and
   the noise's chunk of PREFETCH_NOISE_CHUNK values, drawn in parallel), so they do not depend on which rank
   reads the sample; sigma = shift u / (1 + (shift - 1) u), with u ~ U(0, 1) (uniform) or, with logit_normal,
   u = 1e-5 + (1 - 2e-5) / (1 + exp(-n)), n ~ N(0, 1) (HunyuanVideo-1.5's train.py). A video (frames > 1) whose
   store row has SigLIP rows trains as image-to-video with probability i2v_share (its own stream). */
enum { PREFETCH_NOISE_CHUNK = 1 << 16 };
typedef struct {
    uint64_t noise_seed;
    double timestep_shift;
    int logit_normal;      /* u from the logit-normal law instead of the uniform one */
    double i2v_share;      /* of the videos with SigLIP rows, the share trained as image-to-video */
    int threads;           /* OpenMP threads drawing noise */
} prefetch_noise;

/* The draws of one sample (what the prefetcher gives it): its sigma and whether it trains as image-to-video
   (eligible: a video whose store row has SigLIP rows). The same on every rank. */
float prefetch_sigma(const prefetch_noise *noise, int64_t epoch, int64_t id);
int prefetch_i2v(const prefetch_noise *noise, int64_t epoch, int64_t id, int eligible);

/* A reader over an open store. With text_rows > 0 each sample's text is handed out as text_rows rows: its stored
   rows followed by zero rows (text_start steps by text_rows * text_dim; a store sample may not have more rows);
   with 0, as stored. With background = 0 every read happens inside prefetch_finish (no thread).
   With verify = 1 each sample's stored bytes are checked against its CRC-32 in the index as well
   (store_verify_sample; else store_read_sample, which checks only that the values are finite). A store with
   caption sources also has each sample's ByT5 and SigLIP rows read (and with verify, their checksum checked). */
prefetcher *prefetch_create(const store *source, int32_t text_rows, int background, int verify, prefetch_noise noise);

/* Begin reading these samples of `epoch` (the ids are copied) into the buffer not handed out by the last
   prefetch_finish, and drawing their noise and timesteps. Only one read may be in flight. */
void prefetch_start(prefetcher *p, const int64_t *ids, int n_ids, int64_t epoch);

/* Wait for the read begun by the last prefetch_start and return its samples; the seconds spent waiting go
   to *wait_seconds. The batch stays valid until the next prefetch_start after the next prefetch_finish
   (two buffers). A sample whose read failed (checksum, non-finite values, I/O; the store's message naming it
   went to stderr) is flagged in batch->failed and counted in batch->n_failed; the others are read. */
const sample_batch *prefetch_finish(prefetcher *p, double *wait_seconds);

/* Leave the failed samples out of the batch prefetch_finish returned last: the others move up (ids, offsets,
   latents, text, noise, sigma, sources), and `micro_start` (n_micro + 1 offsets of micro-batches into the batch)
   follows them, micro-batches left empty being dropped. Returns the new number of micro-batches. */
int prefetch_drop_failed(prefetcher *p, int *micro_start, int n_micro);

/* Block until no read is in flight (the store's HDF5 library is not thread-safe: call this before other
   HDF5 work such as writing a checkpoint). The finished read is still returned by prefetch_finish. */
void prefetch_drain(prefetcher *p);

void prefetch_destroy(prefetcher *p);

#endif
