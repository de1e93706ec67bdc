/* prefetch.c — double-buffered sample reading and noise drawing in a background thread (one read in flight). */
#include "train/prefetch.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Sample i's timestep and noise, from its own streams (the same numbers on any rank, in any order): the
   timestep from the sample's key, each chunk of its noise from a stream of its own, chunks in parallel. */
static void draw_noise(const prefetcher *p, sample_batch *slot, int i)
{
    const double shift = p->noise.timestep_shift;
    const uint64_t key = rng_key(p->noise.noise_seed, (uint64_t)p->epoch, (uint64_t)slot->ids[i]);
    uint64_t stream = key;
    double u = ((double)(rng_next_u64(&stream) >> 11) + 0.5) * 0x1.0p-53; /* in (0, 1) */
    slot->sigma[i] = (float)(shift * u / (1.0 + (shift - 1.0) * u));
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
    for (int i = 0; i < slot->n_samples; i++) {
        slot->failed[i] = read(p->source, slot->ids[i], slot->latents + slot->latent_start[i],
                               slot->text + slot->text_start[i], stderr) != 0;
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
    int64_t latent_end = 0, text_end = 0;
    for (int i = 0; i < slot->n_samples; i++) {
        if (slot->failed[i]) continue;
        const int64_t latents = slot->latent_start[i + 1] - slot->latent_start[i];
        const int64_t text = slot->text_start[i + 1] - slot->text_start[i];
        memmove(slot->latents + latent_end, slot->latents + slot->latent_start[i], (size_t)latents * sizeof(float));
        memmove(slot->noise + latent_end, slot->noise + slot->latent_start[i], (size_t)latents * sizeof(float));
        memmove(slot->text + text_end, slot->text + slot->text_start[i], (size_t)text * sizeof(float));
        slot->ids[kept] = slot->ids[i];
        slot->sigma[kept] = slot->sigma[i];
        slot->failed[kept] = 0;
        slot->latent_start[kept] = latent_end;
        slot->text_start[kept] = text_end;
        latent_end += latents;
        text_end += text;
        kept++;
    }
    slot->latent_start[kept] = latent_end;
    slot->text_start[kept] = text_end;
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
    }
    free(p);
}
