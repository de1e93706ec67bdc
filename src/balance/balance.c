/* balance.c — the balancer's shared part: its state and creation, epoch orders, the dispatch to the strategies
   (equal_tokens.c, dual.c, packer.c), micro-batches under the memory budget, checkpoint state, the per-step
   scatter and the online refit. */
#include "balance/balance.h"
#include "balance/strategy.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PENDING_STEPS = 8 };              /* assigned steps whose measured times may still come */
/* 2: six cost features (the attention split). A version-1 state (five) still loads: c' takes c's value and the refit
   window, five features wide, is dropped (the refit starts again from the coefficients). */
/* 3: [balance] sp in the header (a version-2 state, from before groups, loads as sp = off). */
enum { STATE_VERSION = 3, STATE_VERSION_NO_SP = 2, STATE_VERSION_FIVE_FEATURES = 1, FIVE_FEATURES = 5 };
static const uint64_t state_magic = 0x314c41424c444c41ull;  /* "ALDLBAL1" */
/* In budget mode a rank's budget holds at least this many of the costliest sample, so one long
   sample never decides a step's length by itself (see docs/balancer.md). */
static const double budget_floor_samples = 1.0;
/* A per-sample model error below this is not planned for (timer jitter; saves the margin arithmetic). */
static const double negligible_sample_error = 0.01;

/* ---- random order -------------------------------------------------------------------------------- */

void balance_shuffle(int64_t *items, int64_t n_items, uint64_t seed, int64_t epoch, uint64_t stream)
{
    uint64_t state = rng_hash(rng_hash(seed, stream), (uint64_t)epoch);
    for (int64_t i = n_items - 1; i > 0; i--) {
        int64_t j = (int64_t)(((unsigned __int128)rng_next_u64(&state) * (uint64_t)(i + 1)) >> 64);
        int64_t t = items[i]; items[i] = items[j]; items[j] = t;
    }
}

/* ---- budgets ------------------------------------------------------------------------------------- */

static void update_max_sample_cost(balancer *b)
{
    b->max_sample_cost = 0;
    for (int k = 0; k < b->n_buckets; k++)
        b->max_sample_cost = fmax(b->max_sample_cost, cost_model_predict(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k]));
}

int64_t balancer_max_tokens_in_budget(const cost_model *cm, double mem_budget_bytes, int64_t text_len)
{
    double free_bytes = mem_budget_bytes - cm->mem_per_sample - cm->mem_per_text_token * (double)text_len;
    return free_bytes > 0 ? (int64_t)floor(free_bytes / cm->mem_per_token) : 0;
}

/* Per-rank compute budget of the derived kind: the mean predicted cost of an equal_tokens batch. */
double balance_base_compute_budget(const balancer *b)
{
    if (b->compute_budget_config > 0) return b->compute_budget_config;
    return cost_model_predict_features(&b->cm, &b->typical_batch);
}

/* The costliest sample with its error margin: no rank's step can be planned shorter. */
double balance_max_planned_sample(const balancer *b)
{
    return b->max_sample_cost * (1.0 + b->sample_error * fmin(b->spread_quantile, 1.0));
}

/* Predicted seconds of a micro-batch of the active samples' average mix (cost per byte over them all)
   that fills mem_fill of the memory budget: a rank given less leaves its memory, and with it the size of
   its GEMMs, unused. 0 unless global derives its budget. */
static double memory_fill_cost(const balancer *b)
{
    if (b->strategy != STRATEGY_GLOBAL || b->compute_budget_config > 0 || !(b->mem_fill > 0) || !(b->all_mem > 0))
        return 0.0;
    return b->mem_fill * b->mem_budget * cost_model_predict_features(&b->cm, &b->all_features) / b->all_mem;
}

double balancer_compute_budget(const balancer *b)
{
    return fmax(fmax(balance_base_compute_budget(b), budget_floor_samples * balance_max_planned_sample(b)), memory_fill_cost(b));
}

void balancer_set_mem_fill(balancer *b, double fraction) { b->mem_fill = fraction; }

/* ---- epochs -------------------------------------------------------------------------------------- */

void balance_start_epoch(balancer *b, int64_t epoch)
{
    b->epoch = epoch;
    b->position = 0;
    b->pool_count = 0;
    int64_t *shuffled = b->scratch;
    memcpy(shuffled, b->active, (size_t)b->n_active * sizeof(int64_t));
    balance_shuffle(shuffled, b->n_active, b->seed, epoch, STREAM_ORDER);
    for (int64_t i = 0; i < b->n_active; i++) b->order[i] = (balance_entry){b->samples[shuffled[i]], shuffled[i]};
    b->remaining = b->all_features;
    if (b->strategy != STRATEGY_GLOBAL) balance_build_batches(b);
}

/* ---- the assignment --------------------------------------------------------------------------------- */

void balance_assignment_reserve(balance_assignment *out, int n_ranks, int64_t n_ids, int64_t n_micro)
{
    if (out->n_ranks != n_ranks) {
        out->rank_start = xrealloc(out->rank_start, ((size_t)n_ranks + 1) * sizeof(int64_t));
        out->rank_micro_start = xrealloc(out->rank_micro_start, ((size_t)n_ranks + 1) * sizeof(int));
        out->predicted_seconds = xrealloc(out->predicted_seconds, (size_t)n_ranks * sizeof(double));
        out->peak_mem_bytes = xrealloc(out->peak_mem_bytes, (size_t)n_ranks * sizeof(double));
        out->n_ranks = n_ranks;
    }
    if (n_ids > out->capacity_ids) {
        out->capacity_ids = n_ids + n_ids / 2;
        out->ids = xrealloc(out->ids, (size_t)out->capacity_ids * sizeof(int64_t));
        out->indices = xrealloc(out->indices, (size_t)out->capacity_ids * sizeof(int64_t));
    }
    if (n_micro + 1 > out->capacity_micro) {
        out->capacity_micro = n_micro + 1 + (n_micro + 1) / 2;
        out->micro_start = xrealloc(out->micro_start, (size_t)out->capacity_micro * sizeof(int64_t));
        out->micro_group = xrealloc(out->micro_group, (size_t)out->capacity_micro * sizeof(int32_t));
    }
}

void balance_assignment_free(balance_assignment *a)
{
    free(a->ids); free(a->indices); free(a->rank_start); free(a->rank_micro_start);
    free(a->micro_start); free(a->micro_group); free(a->predicted_seconds); free(a->peak_mem_bytes);
    memset(a, 0, sizeof(*a));
}

/* Append rank `rank`'s samples, entries[picks[k]] for k < n_samples (entries[k] when picks is NULL), to
   `out` from slot `first` on; cut them into micro-batches under the memory budget (next fit in their
   order: the epoch order for global, one bucket's batch for the others), and note the rank's peak
   memory, predicted seconds and features, and (unless cost_squares is NULL) the sum of its samples'
   squared predicted costs. */
void balance_append_rank(const balancer *b, balance_assignment *out, int rank, const balance_entry *entries,
                         const int32_t *picks, int64_t n_samples, int64_t first, int64_t *n_micro,
                         cost_features *features, double *cost_squares)
{
    out->rank_start[rank] = first;
    out->rank_micro_start[rank] = (int)*n_micro;
    int64_t *indices = out->indices + first, *ids = out->ids + first, *micro_start = out->micro_start, micro = *n_micro;
    double micro_mem = 0, peak = 0, squares = 0, token_squares = 0, short_squares = 0, token_text = 0;
    int64_t tokens_sum = 0, text_sum = 0;   /* exact, and cheaper than cost_features_add */
    for (int64_t k = 0; k < n_samples; k++) {
        const balance_entry *entry = &entries[picks ? picks[k] : k];
        indices[k] = entry->index;
        ids[k] = entry->sample.id;
        const int32_t tokens = entry->sample.tokens, text_len = entry->sample.text_len;
        const double bytes = cost_model_mem(&b->cm, tokens, text_len);
        if (k == 0 || micro_mem + bytes > b->mem_budget) {
            out->micro_group[micro] = 1;
            micro_start[micro++] = first + k;
            micro_mem = 0;
        }
        micro_mem += bytes;
        if (micro_mem > peak) peak = micro_mem;
        tokens_sum += tokens;
        text_sum += text_len;
        if (tokens < b->cm.attention_split_tokens) short_squares += (double)tokens * tokens;
        else token_squares += (double)tokens * tokens;
        token_text += (double)tokens * text_len;
        if (cost_squares) {
            const double cost = cost_model_predict(&b->cm, tokens, text_len);
            squares += cost * cost;
        }
    }
    *n_micro = micro;
    *features = (cost_features){{(double)n_samples, (double)tokens_sum, token_squares, token_text, (double)text_sum,
                                 short_squares}};
    out->peak_mem_bytes[rank] = peak;
    out->predicted_seconds[rank] = cost_model_predict_features(&b->cm, features);
    if (cost_squares) *cost_squares = squares;
}

/* global: write the packed items to `out` rank by rank, oldest first within each (a counting sort over
   the items, which are numbered oldest first); the bins already hold their sums of squared costs. */
static void append_packed(balancer *b, balance_assignment *out, int64_t n_items, cost_features *features,
                          double *cost_squares, int64_t *n_micro)
{
    const int n_ranks = b->n_ranks;
    balance_assignment_reserve(out, n_ranks, n_items, n_items);
    int64_t *next = b->bin_start;   /* bin r's slots start at next[r]; then its next free slot */
    memset(next, 0, ((size_t)n_ranks + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n_items; i++) next[b->item_bin[i] + 1]++;
    for (int r = 0; r < n_ranks; r++) next[r + 1] += next[r];
    for (int r = 0; r < n_ranks; r++) out->rank_start[r] = next[r];
    for (int64_t i = 0; i < n_items; i++) b->slot_item[next[b->item_bin[i]]++] = (int32_t)i;
    for (int r = 0; r < n_ranks; r++) {
        const int64_t first = out->rank_start[r];
        balance_append_rank(b, out, r, b->item_entry, b->slot_item + first, next[r] - first, first, n_micro, &features[r],
                    NULL);
        cost_squares[r] = b->bin_square[r];
        features_sub(&b->remaining, &features[r]);
    }
}

/* Offset of a new pending step's per-rank records in pending / pending_square. */
static size_t pending_slot(balancer *b)
{
    if (b->pending_count == PENDING_STEPS) {   /* never observed: forget the oldest */
        b->pending_head = (b->pending_head + 1) % PENDING_STEPS;
        b->pending_count--;
    }
    int slot = (b->pending_head + b->pending_count++) % PENDING_STEPS;
    return (size_t)slot * (size_t)b->n_ranks;
}

void balancer_next(balancer *b, balance_assignment *out)
{
    const size_t pending = pending_slot(b);
    cost_features *features = &b->pending[pending];
    double *cost_squares = &b->pending_square[pending];
    int64_t n_ids = 0, n_micro = 0;
    balance_assignment_reserve(out, b->n_ranks, 0, 0);
    int64_t n_samples = 0;
    if (b->strategy == STRATEGY_GLOBAL && b->sp_max > 1) {
        n_samples = balance_group_pack(b);
        out->epoch = b->epoch;
        balance_append_groups(b, out, n_samples, features, cost_squares, &n_ids, &n_micro);
    } else if (b->strategy == STRATEGY_GLOBAL) {
        const int64_t n_items = balance_global_pack(b);
        out->epoch = b->epoch;
        append_packed(b, out, n_items, features, cost_squares, &n_micro);
        n_ids = n_items;
    } else {
        if (b->next_batch >= b->n_batches) balance_start_epoch(b, b->epoch + 1);
        out->epoch = b->epoch;
        for (int r = 0; r < b->n_ranks; r++) {
            int64_t first = 0, count = 0;
            if (b->next_batch < b->n_batches) {
                first = b->batch_start[b->next_batch];
                count = b->batch_start[b->next_batch + 1] - first;
                b->next_batch++;
            }
            balance_assignment_reserve(out, b->n_ranks, n_ids + count, n_micro + count);
            balance_append_rank(b, out, r, b->batch_samples + first, NULL, count, n_ids, &n_micro, &features[r],
                        &cost_squares[r]);
            n_ids += count;
        }
    }
    out->rank_start[b->n_ranks] = n_ids;
    out->rank_micro_start[b->n_ranks] = (int)n_micro;
    out->micro_start[n_micro] = n_ids;
    out->global_samples = b->sp_max > 1 ? n_samples : n_ids;
    out->step = b->step++;
}

/* ---- creation ---------------------------------------------------------------------------------------- */

static uint64_t hash_samples(const balance_sample *samples, int64_t n_samples)
{
    uint64_t hash = 0xCBF29CE484222325ull;
    for (int64_t i = 0; i < n_samples; i++) {
        uint64_t words[3] = {(uint64_t)samples[i].id, (uint64_t)(uint32_t)samples[i].tokens, (uint64_t)(uint32_t)samples[i].text_len};
        for (int w = 0; w < 3; w++) { hash ^= words[w]; hash *= 0x100000001B3ull; hash ^= hash >> 29; }
    }
    return hash;
}

/* Keep the samples that fit the memory budget; the others are skipped with a warning (`skip`) or
   reported as errors. Returns the number of errors. */
static int64_t check_oversize(balancer *b, deck_oversize oversize, FILE *errors)
{
    const int max_reported = 10;
    int64_t n_over = 0;
    b->n_active = 0;
    for (int64_t i = 0; i < b->n_samples; i++) {
        const balance_sample *sample = &b->samples[i];
        double bytes = cost_model_mem(&b->cm, sample->tokens, sample->text_len);
        if (bytes <= b->mem_budget || cost_model_mem_split(&b->cm, sample->tokens, sample->text_len, b->sp_max) <= b->mem_budget) {
            b->active[b->n_active++] = i;
            continue;
        }
        if (n_over++ >= max_reported) continue;
        char line[512], need[32], budget[32], split[96] = "";
        format_size(bytes, need, sizeof need);
        format_size(b->mem_budget, budget, sizeof budget);
        if (b->sp_max > 1) {
            char per_rank[32];
            format_size(cost_model_mem_split(&b->cm, sample->tokens, sample->text_len, b->sp_max), per_rank,
                        sizeof per_rank);
            snprintf(split, sizeof(split), " (%s per rank split over the largest group, %d ranks)", per_rank, b->sp_max);
        }
        snprintf(line, sizeof(line), "sample %lld: %d tokens (+%d text tokens) need %s of activations%s (recompute = %s), "
                 "over the memory budget of %s per rank (at most %lld tokens fit one rank)",
                 (long long)sample->id, sample->tokens, sample->text_len, need, split,
                 b->cm.recompute_block ? "block" : "none", budget,
                 (long long)balancer_max_tokens_in_budget(&b->cm, b->mem_budget, sample->text_len));
        if (oversize == OVERSIZE_SKIP) aldit_warn("balance: skipping %s", line);
        else if (errors) fprintf(errors, "aldit: balance: %s\n", line);
    }
    if (n_over > max_reported && (oversize == OVERSIZE_SKIP || errors)) {
        if (oversize == OVERSIZE_SKIP) aldit_warn("balance: ... and %lld more oversize samples", (long long)(n_over - max_reported));
        else fprintf(errors, "aldit: balance: ... and %lld more oversize samples\n", (long long)(n_over - max_reported));
    }
    if (oversize == OVERSIZE_SKIP) {
        b->n_skipped = n_over;
        if (n_over > 0) aldit_warn("balance: %lld of %lld samples skipped as oversize", (long long)n_over, (long long)b->n_samples);
        return 0;
    }
    /* recomputation is the GPU backend's alone: advised only where the memory model is the GPU's and it is off */
    const int advise_recompute = b->cm.backend == LAYOUT_BACKEND_GPU && !b->cm.recompute_block;
    if (n_over > 0 && errors)
        fprintf(errors, "aldit: balance: %lld samples exceed the memory budget: lower their size,%s raise [balance] "
                "mem_budget,%s or set [balance] oversize = skip\n", (long long)n_over,
                advise_recompute ? " set [train] recompute = block," : "",
                b->sp_max > 1 ? "" : " set [balance] sp = auto (global strategy: split a sample over a group of ranks),");
    return n_over;
}

/* Zeroed memory written now, so that steps do not pay for its first-touch page faults. */
static void *touched_alloc(size_t n_items, size_t item_bytes)
{
    void *memory = xmalloc(n_items * item_bytes);
    memset(memory, 0, n_items * item_bytes);
    return memory;
}

balancer *balancer_create_checked(const deck *config, const balance_sample *samples, int64_t n_samples, int n_ranks,
                                  double mem_budget_bytes, const cost_model *memory, FILE *errors)
{
    if (n_samples <= 0 || n_samples >= INT32_MAX || n_ranks <= 0 || !(mem_budget_bytes > 0)) {
        if (errors) fprintf(errors, "aldit: balance: need samples (%lld), ranks (%d) and a memory budget (%g bytes)\n",
                            (long long)n_samples, n_ranks, mem_budget_bytes);
        return NULL;
    }
    for (int64_t i = 0; i < n_samples; i++) {
        if (samples[i].tokens <= 0 || samples[i].text_len < 0) {
            if (errors) fprintf(errors, "aldit: balance: sample %lld has %d tokens and %d text tokens\n",
                                (long long)samples[i].id, samples[i].tokens, samples[i].text_len);
            return NULL;
        }
    }
    balancer *b = xcalloc(1, sizeof(*b));
    b->strategy = config->balance.strategy;
    b->n_ranks = n_ranks;
    b->global_batch = config->balance.global_batch;
    b->global_tokens = config->balance.global_tokens;
    b->pool_capacity = config->balance.pool;
    b->seed = config->run.seed;
    b->calibrate = config->balance.calibrate;
    b->mem_budget = mem_budget_bytes;
    b->compute_budget_config = config->balance.compute_budget;
    b->mem_fill = config->balance.mem_fill;
    b->max_tokens = config->balance.max_tokens;
    b->dual_p_config = config->balance.dual_p;
    b->sp_deck = config->balance.sp;
    b->sp_max = balance_sp_limit(config, n_ranks);
    b->n_samples = n_samples;
    b->samples = xmalloc((size_t)n_samples * sizeof(balance_sample));
    memcpy(b->samples, samples, (size_t)n_samples * sizeof(balance_sample));
    b->samples_hash = hash_samples(samples, n_samples);
    cost_model_init(&b->cm, config);
    if (memory) cost_model_copy_memory(&b->cm, memory);
    b->active = xmalloc((size_t)n_samples * sizeof(int64_t));
    if (check_oversize(b, config->balance.oversize, errors) > 0 || b->n_active == 0) {
        if (b->n_active == 0 && errors) fprintf(errors, "aldit: balance: no sample fits the memory budget\n");
        balancer_free(b);
        return NULL;
    }
    /* per-sample working arrays */
    const size_t n_active = (size_t)b->n_active;
    b->sample_bucket = xmalloc((size_t)n_samples * sizeof(int));
    b->order = touched_alloc(n_active, sizeof(balance_entry));
    b->scratch = touched_alloc(n_active + 1, sizeof(int64_t));
    b->scratch2 = touched_alloc(n_active + 1, sizeof(int64_t));
    b->entry_scratch = touched_alloc(n_active, sizeof(balance_entry));
    if (b->strategy == STRATEGY_GLOBAL) {
        b->pool = touched_alloc(n_active, sizeof(balance_entry));
        b->item_entry = touched_alloc(n_active, sizeof(balance_entry));
        b->item_cost = touched_alloc(n_active, sizeof(double));
        b->item_bin = touched_alloc(n_active, sizeof(int));
        b->item_next = touched_alloc(n_active, sizeof(int32_t));
        b->slot_item = touched_alloc(n_active, sizeof(int32_t));
        b->sort_values = touched_alloc(n_active, sizeof(uint64_t));
        b->sort_scratch = touched_alloc(n_active, sizeof(uint64_t));
        if (b->sp_max > 1) {
            b->item_group = touched_alloc(n_active, sizeof(int32_t));
            b->item_split_cost = touched_alloc(n_active, sizeof(double));
            b->group_items = touched_alloc(n_active, sizeof(int32_t));
            b->group_scratch = touched_alloc(n_active, sizeof(int32_t));
            b->single_values = touched_alloc(n_active, sizeof(uint64_t));
        }
    } else {
        b->batch_start = touched_alloc(n_active + 1, sizeof(int64_t));
        b->batch_samples = touched_alloc(n_active, sizeof(balance_entry));
    }
    b->bin_head = xmalloc((size_t)n_ranks * sizeof(int32_t));
    b->bin_start = xmalloc(((size_t)n_ranks + 1) * sizeof(int64_t));
    b->bin_load = xmalloc(((size_t)n_ranks + 1) * sizeof(double));
    b->bin_load[n_ranks] = INFINITY;   /* the queue's sentinel */
    b->bin_sum = xmalloc((size_t)n_ranks * sizeof(double));
    b->bin_square = xmalloc((size_t)n_ranks * sizeof(double));
    b->spread_quantile = sqrt(2.0 * log(n_ranks > 2 ? (double)n_ranks : 2.0) / 3.0);
    b->bin_order = xmalloc((size_t)n_ranks * sizeof(uint64_t));
    b->bin_order_scratch = xmalloc((size_t)n_ranks * sizeof(uint64_t));
    b->rank_error = xmalloc((size_t)n_ranks * sizeof(double));
    b->rank_ratio = xmalloc((size_t)n_ranks * sizeof(double));
    b->rank_scratch = xmalloc((size_t)n_ranks * sizeof(double));
    b->queue_head = xmalloc(QUEUE_BUCKETS * sizeof(int32_t));
    b->swap_item = xmalloc(REFINE_SWAP_PAIRS * sizeof(int32_t));
    b->swap_cost = xmalloc(REFINE_SWAP_PAIRS * sizeof(double));
    b->queue_next = xmalloc((size_t)n_ranks * sizeof(int32_t));
    b->pending = xcalloc((size_t)PENDING_STEPS * (size_t)n_ranks, sizeof(cost_features));
    b->pending_square = xcalloc((size_t)PENDING_STEPS * (size_t)n_ranks, sizeof(double));
    for (int64_t i = 0; i < b->n_active; i++) {
        const balance_sample *sample = &b->samples[b->active[i]];
        features_add_sample(b, &b->all_features, sample);
        b->all_mem += cost_model_mem(&b->cm, sample->tokens, sample->text_len);
    }
    balance_build_buckets(b);
    balance_derive_typical_batch(b);
    update_max_sample_cost(b);
    balance_fit_dual(b);
    balance_start_epoch(b, 0);
    return b;
}

balancer *balancer_create(const deck *config, const balance_sample *samples, int64_t n_samples, int n_ranks,
                          double mem_budget_bytes, const cost_model *memory)
{
    balancer *b = balancer_create_checked(config, samples, n_samples, n_ranks, mem_budget_bytes, memory, stderr);
    if (!b) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "balance: cannot assign the samples (see above)");
    return b;
}

void balancer_free(balancer *b)
{
    if (!b) return;
    cost_model_free(&b->cm);
    free(b->samples); free(b->active); free(b->sample_bucket);
    free(b->bucket_tokens); free(b->bucket_max_text); free(b->bucket_count);
    free(b->order); free(b->pool); free(b->batch_start); free(b->batch_samples);
    free(b->item_entry); free(b->item_cost); free(b->item_bin); free(b->item_next);
    free(b->sort_values); free(b->sort_scratch); free(b->slot_item);
    free(b->scratch); free(b->scratch2); free(b->entry_scratch);
    free(b->bin_order); free(b->bin_order_scratch); free(b->rank_error); free(b->rank_ratio); free(b->rank_scratch);
    free(b->bin_head); free(b->bin_start); free(b->bin_load); free(b->bin_sum); free(b->bin_square);
    free(b->item_group); free(b->item_split_cost); free(b->group_items); free(b->group_scratch); free(b->single_values);
    free(b->queue_head); free(b->queue_next); free(b->swap_item); free(b->swap_cost); free(b->pending); free(b->pending_square);
    free(b);
}

int balancer_calibrate(balancer *b, int n_observations, const cost_features *features, const double *seconds)
{
    if (!cost_model_calibrate(&b->cm, n_observations, features, seconds)) return 0;
    update_max_sample_cost(b);
    balance_fit_dual(b);
    return 1;
}

const cost_model *balancer_cost_model(const balancer *b) { return &b->cm; }
int64_t balancer_epoch_samples(const balancer *b) { return b->n_active; }
int64_t balancer_skipped(const balancer *b) { return b->n_skipped; }
double balancer_dual_p(const balancer *b) { return b->dual_p; }
int balancer_sp_max(const balancer *b) { return b->sp_max; }
double balancer_sp_last_raise(const balancer *b) { return b->sp_raise; }
double balancer_sp_raise_max(const balancer *b) { return b->sp_raise_max; }
int64_t balancer_sp_raised_steps(const balancer *b) { return b->sp_raised_steps; }

/* ---- online refit ------------------------------------------------------------------------------------ */

/* Per-sample error of the model from one step: a rank's relative error e_r (measured / predicted - 1,
   less the step's median, which the refit absorbs) has variance sigma^2 sum c_i^2 / (sum c_i)^2 when each
   sample is off by an independent relative error of variance sigma^2. The robust mean of
   e_r^2 (sum c)^2 / sum c^2 estimates sigma^2; the error's half-width as a uniform one is sqrt(3) sigma. */
static void estimate_sample_error(balancer *b, const cost_features *features, const double *cost_squares,
                                  const double *rank_seconds)
{
    double *error = b->rank_error, *ratio = b->rank_ratio, *scratch = b->rank_scratch;
    int n_ranks = 0;
    for (int r = 0; r < b->n_ranks; r++) {
        double predicted = cost_model_predict_features(&b->cm, &features[r]);
        if (!(predicted > 0) || !(rank_seconds[r] > 0) || !isfinite(rank_seconds[r]) || !(cost_squares[r] > 0)) continue;
        error[n_ranks] = rank_seconds[r] / predicted - 1.0;
        ratio[n_ranks++] = predicted * predicted / cost_squares[r];
    }
    if (n_ranks >= 4) {
        memcpy(scratch, error, (size_t)n_ranks * sizeof(double));
        const double center = cost_median_in_place(scratch, n_ranks);
        for (int k = 0; k < n_ranks; k++) error[k] = (error[k] - center) * (error[k] - center) * ratio[k];
        memcpy(scratch, error, (size_t)n_ranks * sizeof(double));
        const double cutoff = 10.0 * cost_median_in_place(scratch, n_ranks);   /* stragglers are not model error */
        double sum = 0;
        int n_used = 0;
        for (int k = 0; k < n_ranks; k++) if (error[k] <= cutoff) { sum += error[k]; n_used++; }
        const double half_width = sqrt(3.0 * sum / n_used);
        b->error_estimate = b->error_estimate > 0 ? 0.7 * b->error_estimate + 0.3 * half_width : half_width;
        b->sample_error = b->error_estimate >= negligible_sample_error ? b->error_estimate : 0.0;
    }
}

void balancer_observe(balancer *b, const double *rank_seconds)
{
    if (b->pending_count == 0) return;
    const size_t pending = (size_t)b->pending_head * (size_t)b->n_ranks;
    b->pending_head = (b->pending_head + 1) % PENDING_STEPS;
    b->pending_count--;
    if (!b->calibrate) return;
    estimate_sample_error(b, &b->pending[pending], &b->pending_square[pending], rank_seconds);
    cost_model_observe_step(&b->cm, b->n_ranks, &b->pending[pending], rank_seconds);
    if (cost_model_refit(&b->cm)) update_max_sample_cost(b);
}

/* ---- checkpoint state -------------------------------------------------------------------------------- */

/* The state is a sequence of 8-byte words (native byte order): a header naming what it belongs to, the
   position in the run, the pool, the cost model and its refit window, the steps awaiting times. */
typedef struct { unsigned char *bytes; size_t offset, size; int failed; } state_cursor;

static void put_word(state_cursor *c, const void *word)
{
    if (c->bytes) memcpy(c->bytes + c->offset, word, 8);
    c->offset += 8;
}
static void put_i64(state_cursor *c, int64_t value) { put_word(c, &value); }
static void put_f64(state_cursor *c, double value) { put_word(c, &value); }

static void get_word(state_cursor *c, void *word)
{
    if (c->failed || c->offset + 8 > c->size) { c->failed = 1; memset(word, 0, 8); return; }
    memcpy(word, c->bytes + c->offset, 8);
    c->offset += 8;
}
static int64_t get_i64(state_cursor *c) { int64_t value; get_word(c, &value); return value; }
static double get_f64(state_cursor *c) { double value; get_word(c, &value); return value; }

static void put_features(state_cursor *c, const cost_features *features)
{
    for (int j = 0; j < COST_N_FEATURES; j++) put_f64(c, features->value[j]);
}
/* n_features: the state's (5 in a version-1 state, which had no attention split: feature 5 reads as 0) */
static void get_features(state_cursor *c, cost_features *features, int n_features)
{
    for (int j = 0; j < COST_N_FEATURES; j++) features->value[j] = j < n_features ? get_f64(c) : 0.0;
}

static void write_state(const balancer *b, state_cursor *c)
{
    put_i64(c, (int64_t)state_magic);
    put_i64(c, STATE_VERSION);
    put_i64(c, b->strategy);
    put_i64(c, b->n_samples);
    put_i64(c, (int64_t)b->samples_hash);
    put_i64(c, (int64_t)b->seed);
    put_i64(c, b->sp_deck);
    put_i64(c, b->n_ranks);
    put_i64(c, b->step);
    put_i64(c, b->epoch);
    put_i64(c, b->position);
    put_i64(c, b->next_batch);
    put_i64(c, b->pool_count);
    for (int64_t i = 0; i < b->pool_count; i++) put_i64(c, b->pool[i].index);
    for (int j = 0; j < COST_N_FEATURES; j++) put_f64(c, b->cm.coef[j]);
    put_f64(c, b->error_estimate);
    put_f64(c, b->sample_error);
    size_t n_window = cost_model_window_doubles(&b->cm);
    put_i64(c, (int64_t)n_window);
    if (c->bytes) {
        double *window = xmalloc(n_window * sizeof(double));
        cost_model_window_save(&b->cm, window);
        for (size_t k = 0; k < n_window; k++) put_f64(c, window[k]);
        free(window);
    } else {
        c->offset += 8 * n_window;
    }
    put_i64(c, b->pending_count);
    for (int k = 0; k < b->pending_count; k++) {
        const size_t slot = (size_t)((b->pending_head + k) % PENDING_STEPS) * (size_t)b->n_ranks;
        for (int r = 0; r < b->n_ranks; r++) {
            put_features(c, &b->pending[slot + (size_t)r]);
            put_f64(c, b->pending_square[slot + (size_t)r]);
        }
    }
}

size_t balancer_state_bytes(const balancer *b)
{
    state_cursor c = {0};
    write_state(b, &c);
    return c.offset;
}

void balancer_save_state(const balancer *b, void *buffer)
{
    state_cursor c = {.bytes = buffer};
    write_state(b, &c);
}

/* [balance] sp as a deck spells it (0 auto, 1 off, K); static text for the values a deck allows. */
static const char *sp_word(int64_t sp)
{
    static const char *const powers[] = {"2", "4", "8", "16", "32", "64", "128", "256", "512", "1024"};
    if (sp == 0) return "auto";
    if (sp == 1) return "off";
    for (int j = 0; j < 10; j++) if (sp == (int64_t)2 << j) return powers[j];
    return "?";
}

void balancer_start_at_epoch(balancer *b, int64_t epoch)
{
    balance_start_epoch(b, epoch > 0 ? epoch : 0);
}

int balancer_load_state(balancer *b, const void *buffer, size_t n_bytes)
{
    state_cursor c = {.bytes = (unsigned char *)buffer, .size = n_bytes};
    const uint64_t magic = (uint64_t)get_i64(&c);
    const int64_t version = get_i64(&c);
    if (magic != state_magic || version < STATE_VERSION_FIVE_FEATURES || version > STATE_VERSION) {
        aldit_warn("balance: the checkpoint's balancer state is not a version-%d balancer state", STATE_VERSION);
        return 1;
    }
    int64_t strategy = get_i64(&c), n_samples = get_i64(&c);
    uint64_t hash = (uint64_t)get_i64(&c), seed = (uint64_t)get_i64(&c);
    const int64_t sp = version >= STATE_VERSION ? get_i64(&c) : 1;
    int64_t saved_ranks = get_i64(&c);
    if (strategy != b->strategy || n_samples != b->n_samples || hash != b->samples_hash || seed != b->seed ||
        sp != b->sp_deck) {
        aldit_warn("balance: the checkpoint's balancer state belongs to another run (strategy %s vs %s, %lld vs %lld "
                   "samples, %s store index, seed %llu vs %llu, balance.sp %s vs %s)",
                   strategy >= STRATEGY_GLOBAL && strategy <= STRATEGY_EQUAL_TOKENS ? deck_strategy_name((deck_strategy)strategy) : "?",
                   deck_strategy_name(b->strategy),
                   (long long)n_samples, (long long)b->n_samples, hash == b->samples_hash ? "same" : "different",
                   (unsigned long long)seed, (unsigned long long)b->seed, sp_word(sp), sp_word(b->sp_deck));
        return 1;
    }
    int64_t step = get_i64(&c), epoch = get_i64(&c), position = get_i64(&c), next_batch = get_i64(&c);
    int64_t pool_count = get_i64(&c);
    if (c.failed || epoch < 0 || position < 0 || position > b->n_active || pool_count < 0 || pool_count > position) {
        aldit_warn("balance: the checkpoint's balancer state is truncated or inconsistent");
        return 1;
    }
    balance_start_epoch(b, epoch);
    if (b->strategy != STRATEGY_GLOBAL && (next_batch < 0 || next_batch > b->n_batches)) {
        aldit_warn("balance: the checkpoint's balancer state has batch %lld of %lld", (long long)next_batch, (long long)b->n_batches);
        return 1;
    }
    b->step = step;
    b->position = position;
    b->next_batch = next_batch;
    b->pool_count = pool_count;
    for (int64_t i = 0; i < pool_count && !c.failed; i++) {
        int64_t index = get_i64(&c);
        if (index < 0 || index >= b->n_samples || b->sample_bucket[index] < 0) c.failed = 1;
        else b->pool[i] = (balance_entry){b->samples[index], index};
    }
    const int n_features = version >= STATE_VERSION_NO_SP ? COST_N_FEATURES : FIVE_FEATURES;
    for (int j = 0; j < n_features; j++) b->cm.coef[j] = get_f64(&c);
    if (n_features < COST_N_FEATURES) b->cm.coef[5] = b->cm.coef[2];
    b->error_estimate = get_f64(&c);
    b->sample_error = get_f64(&c);
    if (!(b->sample_error >= 0) || !isfinite(b->sample_error) || !(b->error_estimate >= 0)) c.failed = 1;
    int64_t n_window = get_i64(&c);
    if (c.failed || n_window < 1 || (size_t)n_window > (n_bytes - c.offset) / 8) c.failed = 1;
    else {
        double *window = xmalloc((size_t)n_window * sizeof(double));
        for (int64_t k = 0; k < n_window; k++) window[k] = get_f64(&c);
        if (n_features == COST_N_FEATURES && cost_model_window_load(&b->cm, window, (size_t)n_window) != 0) c.failed = 1;
        free(window);
    }
    int64_t pending_count = get_i64(&c);
    b->pending_head = 0;
    b->pending_count = 0;
    for (int64_t k = 0; k < pending_count && !c.failed; k++) {
        /* kept only for the same rank count (the measured times that come belong to those ranks) */
        const int keep = saved_ranks == b->n_ranks;
        const size_t slot = keep ? pending_slot(b) : 0;
        for (int64_t r = 0; r < saved_ranks; r++) {
            cost_features features;
            get_features(&c, &features, n_features);
            double square = get_f64(&c);
            if (keep) { b->pending[slot + (size_t)r] = features; b->pending_square[slot + (size_t)r] = square; }
        }
    }
    if (c.failed || c.offset != n_bytes) {
        aldit_warn("balance: the checkpoint's balancer state is truncated or inconsistent");
        return 1;
    }
    /* what is left of the epoch: the pool and the order from `position` on */
    b->remaining = (cost_features){{0}};
    for (int64_t i = 0; i < b->pool_count; i++) features_add_sample(b, &b->remaining, &b->pool[i].sample);
    for (int64_t i = b->position; i < b->n_active; i++) features_add_sample(b, &b->remaining, &b->order[i].sample);
    update_max_sample_cost(b);
    return 0;
}

/* ---- distribution ------------------------------------------------------------------------------------- */

/* Message to one rank: [step, epoch, global_samples, n_micro, n_micro + 1 offsets into its ids, ids...]. */
enum { MESSAGE_HEADER = 5 }; /* step, epoch, global samples, micro-batches, the most micro-batches of any rank;
                                then n_micro + 1 micro-batch offsets, n_micro group sizes and the ids */

/* Moves entry `from` of ids and tokens to position `to` (>= from), the entries between one place forward. */
static void move_to(int64_t *ids, int64_t *tokens, int from, int to)
{
    const int64_t id = ids[from], count = tokens[from];
    memmove(ids + from, ids + from + 1, (size_t)(to - from) * sizeof *ids);
    memmove(tokens + from, tokens + from + 1, (size_t)(to - from) * sizeof *tokens);
    ids[to] = id;
    tokens[to] = count;
}

void rank_assignment_order_whole_tiles(rank_assignment *mine, int64_t *tokens, int64_t tile, int64_t min_tokens)
{
    if (tile <= 0) return;
    for (int m = 0; m < mine->n_micro; m++) {
        const int first = mine->micro_start[m], end = mine->micro_start[m + 1];
        int best = -1;
        for (int i = first; i < end; i++)
            if (tokens[i] >= min_tokens && tokens[i] % tile != 0 && (best < 0 || tokens[i] > tokens[best])) best = i;
        if (best >= 0 && best != end - 1) move_to(mine->ids, tokens, best, end - 1);
    }
}

void balance_scatter(const balance_assignment *all_on_root, rank_assignment *mine)
{
    int64_t *send = NULL;
    int *counts = NULL, *displs = NULL;
    if (all_on_root) {
        const balance_assignment *a = all_on_root;
        int64_t total = 0;
        counts = xmalloc((size_t)a->n_ranks * sizeof(int));
        displs = xmalloc((size_t)a->n_ranks * sizeof(int));
        for (int r = 0; r < a->n_ranks; r++) {
            int64_t n_micro = a->rank_micro_start[r + 1] - a->rank_micro_start[r];
            int64_t count = MESSAGE_HEADER + 2 * n_micro + 1 + (a->rank_start[r + 1] - a->rank_start[r]);
            ALDIT_CHECK(total + count < INT32_MAX, "balance: a step's assignment does not fit one MPI message");
            counts[r] = (int)count;
            displs[r] = (int)total;
            total += count;
        }
        send = xmalloc((size_t)total * sizeof(int64_t));
        int64_t max_micro = 0;
        for (int r = 0; r < a->n_ranks; r++)
            if (a->rank_micro_start[r + 1] - a->rank_micro_start[r] > max_micro)
                max_micro = a->rank_micro_start[r + 1] - a->rank_micro_start[r];
        for (int r = 0; r < a->n_ranks; r++) {
            int64_t *message = send + displs[r];
            int n_micro = a->rank_micro_start[r + 1] - a->rank_micro_start[r];
            message[0] = a->step;
            message[1] = a->epoch;
            message[2] = a->global_samples;
            message[3] = n_micro;
            message[4] = max_micro;
            for (int m = 0; m <= n_micro; m++)
                message[MESSAGE_HEADER + m] = (n_micro > 0 ? a->micro_start[a->rank_micro_start[r] + m] : a->rank_start[r]) - a->rank_start[r];
            for (int m = 0; m < n_micro; m++)
                message[MESSAGE_HEADER + n_micro + 1 + m] = a->micro_group[a->rank_micro_start[r] + m];
            memcpy(message + MESSAGE_HEADER + 2 * n_micro + 1, a->ids + a->rank_start[r],
                   (size_t)(a->rank_start[r + 1] - a->rank_start[r]) * sizeof(int64_t));
        }
    }
    /* the count first, so the receive buffer can grow to fit */
    int my_count = comm_scatter_int(counts);
    if (my_count > mine->capacity_message) {
        mine->capacity_message = my_count;
        mine->message = xrealloc(mine->message, (size_t)my_count * sizeof(int64_t));
    }
    int received = comm_scatterv_i64(send, counts, displs, mine->message, mine->capacity_message);
    free(send); free(counts); free(displs);
    const int64_t *message = mine->message;
    ALDIT_CHECK(received >= MESSAGE_HEADER + 1 && message[3] >= 0 && message[4] >= message[3] &&
                    MESSAGE_HEADER + 2 * message[3] + 1 <= received,
                "balance: malformed assignment message (%d values)", received);
    mine->step = message[0];
    mine->epoch = message[1];
    mine->global_samples = message[2];
    mine->n_micro = (int)message[3];
    mine->max_micro = (int)message[4];
    mine->n_samples = received - MESSAGE_HEADER - 2 * mine->n_micro - 1;
    if (mine->n_micro + 1 > mine->capacity_micro) {
        mine->capacity_micro = mine->n_micro + 1;
        mine->micro_start = xrealloc(mine->micro_start, (size_t)mine->capacity_micro * sizeof(int));
        mine->micro_group = xrealloc(mine->micro_group, (size_t)mine->capacity_micro * sizeof(int32_t));
    }
    if (mine->n_samples > mine->capacity_ids || !mine->ids) {
        mine->capacity_ids = mine->n_samples > 0 ? mine->n_samples : 1;
        mine->ids = xrealloc(mine->ids, (size_t)mine->capacity_ids * sizeof(int64_t));
    }
    for (int m = 0; m <= mine->n_micro; m++) mine->micro_start[m] = (int)message[MESSAGE_HEADER + m];
    ALDIT_CHECK(mine->micro_start[mine->n_micro] == mine->n_samples, "balance: assignment message's micro-batches "
                "cover %d of %d samples", mine->micro_start[mine->n_micro], mine->n_samples);
    for (int m = 0; m < mine->n_micro; m++) {
        const int64_t k = message[MESSAGE_HEADER + mine->n_micro + 1 + m];
        ALDIT_CHECK(k >= 1 && k <= INT32_MAX && (k & (k - 1)) == 0, "balance: assignment message's micro-batch %d has "
                    "a group of %lld ranks (not a power of two)", m, (long long)k);
        mine->micro_group[m] = (int32_t)k;
    }
    memcpy(mine->ids, message + MESSAGE_HEADER + 2 * mine->n_micro + 1, (size_t)mine->n_samples * sizeof(int64_t));
}

void rank_assignment_free(rank_assignment *mine)
{
    free(mine->ids); free(mine->micro_start); free(mine->micro_group); free(mine->message);
    memset(mine, 0, sizeof(*mine));
}

double balance_least_useful_budget(const deck *config, const cost_model *cm, const balance_sample *samples,
                                   int64_t n_samples)
{
    if (config->balance.mem_budget > 0.0) return config->balance.mem_budget;
    double largest = 0.0;
    for (int64_t i = 0; i < n_samples; i++)
        largest = fmax(largest, cost_model_mem(cm, samples[i].tokens, samples[i].text_len));
    return largest;
}
