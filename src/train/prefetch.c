/* prefetch.c — double-buffered sample reading and noise drawing in a background thread (one read in flight). */
#include "train/prefetch.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tag of a sample's image-to-video draw, hashed into its key so that it never shares the sigma's stream. */
#define I2V_STREAM_TAG 0x693276ull /* "i2v" */

struct prefetcher {
    const store *source;
    int background;
    int verify;           /* check each sample's CRC-32 (store_verify_sample) */
    int32_t text_rows;    /* > 0: every sample's text padded with zero rows to this many */
    prefetch_noise noise;
    int64_t epoch;        /* of the samples being read */
    sample_batch slots[2];
    int filling;          /* slot the current (or last) read goes into */
    int in_flight;        /* a thread is reading (background mode) */
    int pending;          /* a read was started and not yet handed out by prefetch_finish */
    pthread_t thread;
};

prefetcher *prefetch_create(const store *source, int32_t text_rows, int background, int verify, prefetch_noise noise)
{
    prefetcher *p = xcalloc(1, sizeof *p);
    p->source = source;
    p->text_rows = text_rows;
    p->background = background;
    p->verify = verify;
    p->noise = noise;
    return p;
}

/* Size the slot for these ids (offsets from the store index) and copy them in. */
static void layout_slot(const store *source, int32_t text_rows, sample_batch *slot, const int64_t *ids, int n_ids)
{
    /* the starts need n_ids + 1 entries: a rank's first batch may be empty (fewer samples than ranks) */
    if (n_ids > slot->samples_capacity || !slot->latent_start) {
        slot->samples_capacity = n_ids;
        slot->ids = xrealloc(slot->ids, (size_t)n_ids * sizeof *slot->ids);
        slot->latent_start = xrealloc(slot->latent_start, (size_t)(n_ids + 1) * sizeof *slot->latent_start);
        slot->text_start = xrealloc(slot->text_start, (size_t)(n_ids + 1) * sizeof *slot->text_start);
        slot->sigma = xrealloc(slot->sigma, (size_t)n_ids * sizeof *slot->sigma);
        slot->failed = xrealloc(slot->failed, (size_t)(n_ids > 0 ? n_ids : 1));
        slot->text_2_start = xrealloc(slot->text_2_start, (size_t)(n_ids + 1) * sizeof *slot->text_2_start);
        slot->image_start = xrealloc(slot->image_start, (size_t)(n_ids + 1) * sizeof *slot->image_start);
        slot->text_2_len = xrealloc(slot->text_2_len, (size_t)(n_ids > 0 ? n_ids : 1) * sizeof *slot->text_2_len);
        slot->image_len = xrealloc(slot->image_len, (size_t)(n_ids > 0 ? n_ids : 1) * sizeof *slot->image_len);
        slot->i2v = xrealloc(slot->i2v, (size_t)(n_ids > 0 ? n_ids : 1));
    }
    slot->n_samples = n_ids;
    slot->n_failed = 0;
    slot->latent_start[0] = slot->text_start[0] = 0;
    for (int i = 0; i < n_ids; i++) {
        ALDIT_CHECK(ids[i] >= 0 && ids[i] < source->n_samples, "sample id %lld is outside the store %s (%lld samples)",
                    (long long)ids[i], source->path, (long long)source->n_samples);
        const store_sample *sample = &source->samples[ids[i]];
        slot->ids[i] = ids[i];
        slot->latent_start[i + 1] = slot->latent_start[i] + store_sample_latent_elements(sample);
        ALDIT_CHECK(sample->text_len <= text_rows || text_rows == 0, "sample %lld of %s has %d text rows, more than "
                    "the %d it is padded to", (long long)ids[i], source->path, sample->text_len, text_rows);
        slot->text_start[i + 1] = slot->text_start[i] + (text_rows > 0 ? (int64_t)text_rows * source->text_dim
                                                                         : store_sample_text_elements(source, sample));
    }
    if (slot->latent_start[n_ids] > slot->latents_capacity) {
        slot->latents_capacity = slot->latent_start[n_ids];
        free(slot->latents);
        free(slot->noise);
        slot->latents = xmalloc((size_t)slot->latents_capacity * sizeof *slot->latents);
        slot->noise = xmalloc((size_t)slot->latents_capacity * sizeof *slot->noise);
    }
    if (slot->text_start[n_ids] > slot->text_capacity) {
        slot->text_capacity = slot->text_start[n_ids];
        free(slot->text);
        slot->text = xmalloc((size_t)slot->text_capacity * sizeof *slot->text);
    }
}

/* The sources' lengths and offsets of the slot's samples, and each sample's task (drawn now: a text-to-video sample
   takes no image rows). */
static void layout_sources(const prefetcher *p, sample_batch *slot)
{
    const store *source = p->source;
    slot->text_2_start[0] = slot->image_start[0] = 0;
    for (int i = 0; i < slot->n_samples; i++) {
        const int64_t id = slot->ids[i];
        const int eligible = source->has_sources && source->samples[id].frames > 1 && source->sources[id].image_len > 0;
        slot->i2v[i] = (unsigned char)prefetch_i2v(&p->noise, p->epoch, id, eligible);
        slot->text_2_len[i] = source->has_sources ? source->sources[id].text_2_len : 0;
        slot->image_len[i] = slot->i2v[i] ? source->sources[id].image_len : 0;
        slot->text_2_start[i + 1] = slot->text_2_start[i] + store_sample_text_2_elements(source, id);
        slot->image_start[i + 1] = slot->image_start[i] + (slot->i2v[i] ? store_sample_image_elements(source, id) : 0);
    }
    const int n = slot->n_samples;
    if (slot->text_2_start[n] > slot->text_2_capacity || !slot->text_2) {
        slot->text_2_capacity = slot->text_2_start[n];
        free(slot->text_2);
        slot->text_2 = xmalloc((size_t)(slot->text_2_capacity + 1) * sizeof *slot->text_2);
    }
    if (slot->image_start[n] > slot->image_capacity || !slot->image) {
        slot->image_capacity = slot->image_start[n];
        free(slot->image);
        slot->image = xmalloc((size_t)(slot->image_capacity + 1) * sizeof *slot->image);
    }
    if (source->max_image_elements > slot->scratch_capacity) {
        slot->scratch_capacity = source->max_image_elements;
        free(slot->scratch);
        slot->scratch = xmalloc((size_t)slot->scratch_capacity * sizeof *slot->scratch);
    }
}

float prefetch_sigma(const prefetch_noise *noise, int64_t epoch, int64_t id)
{
    uint64_t stream = rng_key(noise->noise_seed, (uint64_t)epoch, (uint64_t)id);
    double u;
    if (noise->logit_normal) u = 1e-5 + (1.0 - 2e-5) / (1.0 + exp(-rng_normal(&stream)));
    else u = ((double)(rng_next_u64(&stream) >> 11) + 0.5) * 0x1.0p-53; /* in (0, 1) */
    const double shift = noise->timestep_shift;
    return (float)(shift * u / (1.0 + (shift - 1.0) * u));
}

int prefetch_i2v(const prefetch_noise *noise, int64_t epoch, int64_t id, int eligible)
{
    if (!eligible || noise->i2v_share <= 0.0) return 0;
    uint64_t stream = rng_hash(rng_key(noise->noise_seed, (uint64_t)epoch, (uint64_t)id), I2V_STREAM_TAG);
    return rng_uniform(&stream) < noise->i2v_share;
}

/* Sample i's timestep and noise, from its own streams (the same numbers on any rank, in any order): the
   timestep from the sample's key, each chunk of its noise from a stream of its own, chunks in parallel. */
static void draw_noise(const prefetcher *p, sample_batch *slot, int i)
{
    const uint64_t key = rng_key(p->noise.noise_seed, (uint64_t)p->epoch, (uint64_t)slot->ids[i]);
    slot->sigma[i] = prefetch_sigma(&p->noise, p->epoch, slot->ids[i]);
    const int64_t first = slot->latent_start[i], n_values = slot->latent_start[i + 1] - first;
    const int64_t n_chunks = (n_values + PREFETCH_NOISE_CHUNK - 1) / PREFETCH_NOISE_CHUNK;
    #pragma omp parallel for schedule(static) num_threads(p->noise.threads) if (n_chunks > 1)
    for (int64_t chunk = 0; chunk < n_chunks; chunk++) {
        uint64_t chunk_stream = rng_hash(key, (uint64_t)chunk + 1);
        const int64_t begin = first + chunk * PREFETCH_NOISE_CHUNK;
        const int64_t end = begin + PREFETCH_NOISE_CHUNK < first + n_values ? begin + PREFETCH_NOISE_CHUNK : first + n_values;
        int64_t e = begin;
        for (; e + 1 < end; e += 2) {
            double second;
            slot->noise[e] = (float)rng_normal_pair(&chunk_stream, &second);
            slot->noise[e + 1] = (float)second;
        }
        if (e < end) slot->noise[e] = (float)rng_normal(&chunk_stream);
    }
}

static void *read_slot(void *arg)
{
    prefetcher *p = arg;
    sample_batch *slot = &p->slots[p->filling];
    /* HDF5 reads one after another (the library is not thread-safe), then the noise */
    int (*const read)(const store *, int64_t, float *, float *, FILE *) =
        p->verify ? store_verify_sample : store_read_sample;
    int (*const read_sources)(const store *, int64_t, float *, float *, FILE *) =
        p->verify ? store_verify_sources : store_read_sources;
    for (int i = 0; i < slot->n_samples; i++) {
        slot->failed[i] = read(p->source, slot->ids[i], slot->latents + slot->latent_start[i],
                               slot->text + slot->text_start[i], stderr) != 0;
        /* a text-to-video sample's image rows: read for their checksum (verify), not kept; not read without it */
        float *image = slot->i2v[i] ? slot->image + slot->image_start[i] : p->verify ? slot->scratch : NULL;
        if (!slot->failed[i] && p->source->has_sources)
            slot->failed[i] = read_sources(p->source, slot->ids[i], slot->text_2 + slot->text_2_start[i], image,
                                           stderr) != 0;
        slot->n_failed += slot->failed[i];
    }
    for (int i = 0; i < slot->n_samples && p->text_rows > 0; i++) { /* the zero rows after the stored ones */
        const int64_t stored = store_sample_text_elements(p->source, &p->source->samples[slot->ids[i]]);
        float *padding = slot->text + slot->text_start[i] + stored;
        memset(padding, 0, (size_t)(slot->text_start[i + 1] - slot->text_start[i] - stored) * sizeof *padding);
    }
    for (int i = 0; i < slot->n_samples; i++) draw_noise(p, slot, i);
    return NULL;
}

void prefetch_start(prefetcher *p, const int64_t *ids, int n_ids, int64_t epoch)
{
    ALDIT_CHECK(!p->pending, "prefetch_start: the previous read was not finished");
    p->filling ^= 1;
    p->epoch = epoch;
    layout_slot(p->source, p->text_rows, &p->slots[p->filling], ids, n_ids);
    layout_sources(p, &p->slots[p->filling]);
    p->pending = 1;
    if (p->background) {
        int status = pthread_create(&p->thread, NULL, read_slot, p);
        ALDIT_CHECK(status == 0, "cannot start the prefetch thread (pthread_create returned %d)", status);
        p->in_flight = 1;
    }
}

void prefetch_drain(prefetcher *p)
{
    if (!p->in_flight) return;
    int status = pthread_join(p->thread, NULL);
    ALDIT_CHECK(status == 0, "pthread_join of the prefetch thread returned %d", status);
    p->in_flight = 0;
}

const sample_batch *prefetch_finish(prefetcher *p, double *wait_seconds)
{
    ALDIT_CHECK(p->pending, "prefetch_finish without prefetch_start");
    double started = comm_time();
    if (p->background) prefetch_drain(p);
    else read_slot(p);
    *wait_seconds = comm_time() - started;
    p->pending = 0;
    return &p->slots[p->filling];
}

int prefetch_drop_failed(prefetcher *p, int *micro_start, int n_micro)
{
    sample_batch *slot = &p->slots[p->filling];
    if (slot->n_failed == 0) return n_micro;
    /* the micro-batch boundaries in kept samples; empty micro-batches are dropped */
    int kept_micro = 0;
    for (int m = 0, sample = 0, kept = 0; m <= n_micro; m++) {
        for (; sample < micro_start[m]; sample++) kept += !slot->failed[sample];
        if (m == 0 || kept > micro_start[kept_micro]) micro_start[m == 0 ? 0 : ++kept_micro] = kept;
    }
    int kept = 0;
    int64_t latent_end = 0, text_end = 0, text_2_end = 0, image_end = 0;
    for (int i = 0; i < slot->n_samples; i++) {
        if (slot->failed[i]) continue;
        const int64_t latents = slot->latent_start[i + 1] - slot->latent_start[i];
        const int64_t text = slot->text_start[i + 1] - slot->text_start[i];
        const int64_t text_2 = slot->text_2_start[i + 1] - slot->text_2_start[i];
        const int64_t image = slot->image_start[i + 1] - slot->image_start[i];
        memmove(slot->latents + latent_end, slot->latents + slot->latent_start[i], (size_t)latents * sizeof(float));
        memmove(slot->noise + latent_end, slot->noise + slot->latent_start[i], (size_t)latents * sizeof(float));
        memmove(slot->text + text_end, slot->text + slot->text_start[i], (size_t)text * sizeof(float));
        memmove(slot->text_2 + text_2_end, slot->text_2 + slot->text_2_start[i], (size_t)text_2 * sizeof(float));
        memmove(slot->image + image_end, slot->image + slot->image_start[i], (size_t)image * sizeof(float));
        slot->ids[kept] = slot->ids[i];
        slot->sigma[kept] = slot->sigma[i];
        slot->text_2_len[kept] = slot->text_2_len[i];
        slot->image_len[kept] = slot->image_len[i];
        slot->i2v[kept] = slot->i2v[i];
        slot->failed[kept] = 0;
        slot->latent_start[kept] = latent_end;
        slot->text_start[kept] = text_end;
        slot->text_2_start[kept] = text_2_end;
        slot->image_start[kept] = image_end;
        latent_end += latents;
        text_end += text;
        text_2_end += text_2;
        image_end += image;
        kept++;
    }
    slot->latent_start[kept] = latent_end;
    slot->text_start[kept] = text_end;
    slot->text_2_start[kept] = text_2_end;
    slot->image_start[kept] = image_end;
    slot->n_samples = kept;
    slot->n_failed = 0;
    return kept_micro;
}

void prefetch_destroy(prefetcher *p)
{
    if (!p) return;
    prefetch_drain(p);
    for (int s = 0; s < 2; s++) {
        free(p->slots[s].ids);
        free(p->slots[s].latent_start);
        free(p->slots[s].text_start);
        free(p->slots[s].latents);
        free(p->slots[s].text);
        free(p->slots[s].noise);
        free(p->slots[s].sigma);
        free(p->slots[s].failed);
        free(p->slots[s].text_2_start);
        free(p->slots[s].image_start);
        free(p->slots[s].text_2_len);
        free(p->slots[s].image_len);
        free(p->slots[s].i2v);
        free(p->slots[s].text_2);
        free(p->slots[s].image);
        free(p->slots[s].scratch);
    }
    free(p);
}
