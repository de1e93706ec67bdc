/* equal_tokens.c — the bucket baseline: samples grouped by token count ("buckets"), cut into batches of
   max_tokens / S samples (dual.c's sizes for the dual strategy), one batch per rank, batch order shuffled. */
#include "balance/strategy.h"
#include "core/check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int compare_by_tokens(const void *left, const void *right, void *context)
{
    const balance_sample *samples = context;
    int64_t a = *(const int64_t *)left, b = *(const int64_t *)right;
    if (samples[a].tokens != samples[b].tokens) return samples[a].tokens < samples[b].tokens ? -1 : 1;
    return (a > b) - (a < b);
}

/* Stable merge sort of int64 sample positions with a comparison that takes a context. */
static void sort_positions(int64_t *items, int64_t n_items, int64_t *scratch,
                           int (*compare)(const void *, const void *, void *), void *context)
{
    for (int64_t width = 1; width < n_items; width *= 2) {
        for (int64_t lo = 0; lo < n_items; lo += 2 * width) {
            int64_t mid = lo + width < n_items ? lo + width : n_items;
            int64_t hi = lo + 2 * width < n_items ? lo + 2 * width : n_items;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) scratch[k++] = compare(&items[j], &items[i], context) < 0 ? items[j++] : items[i++];
            while (i < mid) scratch[k++] = items[i++];
            while (j < hi) scratch[k++] = items[j++];
        }
        memcpy(items, scratch, (size_t)n_items * sizeof(int64_t));
    }
}

void balance_build_buckets(balancer *b)
{
    int64_t *sorted = b->scratch, *scratch = b->scratch2;
    memcpy(sorted, b->active, (size_t)b->n_active * sizeof(int64_t));
    sort_positions(sorted, b->n_active, scratch, compare_by_tokens, b->samples);
    b->n_buckets = 0;
    b->bucket_tokens = xmalloc((size_t)b->n_active * sizeof(int32_t));
    b->bucket_max_text = xmalloc((size_t)b->n_active * sizeof(int32_t));
    b->bucket_count = xmalloc((size_t)b->n_active * sizeof(int64_t));
    for (int64_t i = 0; i < b->n_samples; i++) b->sample_bucket[i] = -1;
    for (int64_t i = 0; i < b->n_active; i++) {
        const balance_sample *sample = &b->samples[sorted[i]];
        if (b->n_buckets == 0 || b->bucket_tokens[b->n_buckets - 1] != sample->tokens) {
            b->bucket_tokens[b->n_buckets] = sample->tokens;
            b->bucket_max_text[b->n_buckets] = 0;
            b->bucket_count[b->n_buckets] = 0;
            b->n_buckets++;
        }
        int k = b->n_buckets - 1;
        b->sample_bucket[sorted[i]] = k;
        b->bucket_count[k]++;
        if (sample->text_len > b->bucket_max_text[k]) b->bucket_max_text[k] = sample->text_len;
    }
}

static int64_t equal_tokens_batch(const balancer *b, int k)
{
    int64_t size = b->bucket_tokens[k] > 0 ? b->max_tokens / b->bucket_tokens[k] : 1;
    return size > 0 ? size : 1;
}


/* Mean features of an equal_tokens batch over the dataset: the derived compute budget's shape. */
void balance_derive_typical_batch(balancer *b)
{
    int64_t n_batches = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        int64_t size = equal_tokens_batch(b, k);
        n_batches += (b->bucket_count[k] + size - 1) / size;
    }
    for (int j = 0; j < COST_N_FEATURES; j++) b->typical_batch.value[j] = b->all_features.value[j] / (double)n_batches;
}

/* This epoch's batches: the order grouped by bucket (stable), cut into batches of the bucket's size,
   the last partial batch of a bucket kept, then the batch order shuffled. */
void balance_build_batches(balancer *b)
{
    int64_t *bucket_fill = xcalloc((size_t)b->n_buckets + 1, sizeof(int64_t));
    for (int k = 0; k < b->n_buckets; k++) bucket_fill[k + 1] = bucket_fill[k] + b->bucket_count[k];
    balance_entry *grouped = b->entry_scratch;
    for (int64_t i = 0; i < b->n_active; i++) grouped[bucket_fill[b->sample_bucket[b->order[i].index]]++] = b->order[i];
    int64_t *cut_start = b->scratch2;
    b->n_batches = 0;
    int64_t offset = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        int64_t size = b->strategy == STRATEGY_DUAL ? balance_dual_batch(b, k) : equal_tokens_batch(b, k);
        for (int64_t first = 0; first < b->bucket_count[k]; first += size) cut_start[b->n_batches++] = offset + first;
        offset += b->bucket_count[k];
    }
    cut_start[b->n_batches] = b->n_active;
    int64_t *batch_order = b->scratch;
    for (int64_t i = 0; i < b->n_batches; i++) batch_order[i] = i;
    balance_shuffle(batch_order, b->n_batches, b->seed, b->epoch, STREAM_BATCHES);
    int64_t written = 0;
    for (int64_t i = 0; i < b->n_batches; i++) {
        b->batch_start[i] = written;
        for (int64_t j = cut_start[batch_order[i]]; j < cut_start[batch_order[i] + 1]; j++) b->batch_samples[written++] = grouped[j];
    }
    b->batch_start[b->n_batches] = written;
    b->next_batch = 0;
    free(bucket_fill);
}
