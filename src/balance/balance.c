/* balance.c — the balancer: epoch orders, the equal_tokens / dual bucket batches, the global packer
   (longest first into the least loaded rank bin, small samples poured to a level, gap filling from the
   pool, swap refinement), micro-batches under the memory budget, checkpoint state, the per-step scatter
   and the online refit. */
#include "balance/balance.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"
#include "core/rng.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PENDING_STEPS = 8 };              /* assigned steps whose measured times may still come */
enum { REFINE_ITERATIONS = 64 };         /* max-bin moves / swaps per step */
enum { REFINE_SWAP_PAIRS = 1 << 14 };    /* item pairs a swap search may look at */
enum { QUEUE_BUCKETS = 4096 };           /* buckets of the queue of bins by load (see queue_init) */
/* Radix sorts: 11-bit digits; item costs are sorted on their top 22 bits as floats (8 exponent and
   14 mantissa bits: costs within 6e-5 of each other tie), bin loads on all 31 bits of theirs. */
enum { RADIX_BITS = 11, RADIX_DIGITS = 1 << RADIX_BITS, RADIX_MAX_PASSES = 3 };
enum { COST_KEY_PASSES = 2, LOAD_KEY_PASSES = 3 };
/* 2: six cost features (the attention split). A version-1 state (five) still loads: c' takes c's value and the refit
   window, five features wide, is dropped (the refit starts again from the coefficients). */
enum { STATE_VERSION = 2, STATE_VERSION_FIVE_FEATURES = 1, FIVE_FEATURES = 5 };
static const uint64_t state_magic = 0x314c41424c444c41ull;  /* "ALDLBAL1" */
/* In budget mode a rank's budget holds at least this many of the costliest sample, so one long
   sample never decides a step's length by itself (see docs/balancer.md). */
static const double budget_floor_samples = 1.0;
/* Samples costing at most this fraction of a rank's mean load are poured to a level, not placed one by one. */
static const double small_item_fraction = 1.0 / 32;
/* A per-sample model error below this is not planned for (timer jitter; saves the margin arithmetic). */
static const double negligible_sample_error = 0.01;
/* Refinement stops once the largest and smallest bins are this close (relative to the largest). */
static const double refine_tolerance = 1e-3;

/* A sample as the packer handles it: what the balancer knows, and its position in the sample array.
   Epoch orders and the pool hold these by value, so a step reads memory front to back. */
typedef struct { balance_sample sample; int64_t index; } balance_entry;

struct balancer {
    deck_strategy strategy;
    int n_ranks;
    int64_t global_batch;         /* samples per step (global); 0 = budget mode */
    int64_t pool_capacity;        /* lookahead samples (global, budget mode) */
    uint64_t seed;
    int calibrate;
    double mem_budget;
    double compute_budget_config; /* deck value; 0 = derive from the equal_tokens batches */
    double mem_fill;              /* global, derived budget: fill this fraction of mem_budget (0 = off) */
    double all_mem;               /* activation bytes of the active samples, summed */
    int64_t max_tokens;           /* T_max of the equal_tokens buckets */
    double dual_p_config;         /* deck value; 0 = fit from the cost model */
    int64_t n_samples;
    balance_sample *samples;
    int64_t n_active;             /* samples in every epoch (not skipped) */
    int64_t *active;              /* their positions in `samples`, ascending */
    int64_t n_skipped;
    uint64_t samples_hash;
    cost_model cm;
    cost_features all_features;   /* of the active samples */
    /* distinct token counts of the active samples ("buckets"), ascending */
    int n_buckets;
    int32_t *bucket_tokens;
    int32_t *bucket_max_text;
    int64_t *bucket_count;
    int *sample_bucket;           /* per sample; -1 when skipped */
    cost_features typical_batch;  /* mean features of an equal_tokens batch: the derived budget */
    double dual_p, dual_scale, dual_comp_budget;
    double max_sample_cost;
    /* position in the run */
    int64_t step, epoch, position;
    balance_entry *order;         /* this epoch's order */
    balance_entry *pool;          /* global: drawn from the order, not yet assigned, oldest first */
    int64_t pool_count;
    cost_features remaining;      /* features of the pool + the unseen rest of the epoch */
    /* equal_tokens / dual: this epoch's batches */
    int64_t n_batches, next_batch;
    int64_t *batch_start;
    balance_entry *batch_samples;
    /* per-rank features of assigned steps awaiting their measured times */
    cost_features *pending;
    double *pending_square;       /* per rank: sum of its samples' squared predicted costs */
    int pending_head, pending_count;
    /* estimated per-sample relative error of the cost model (half-width of a uniform error), and the
       part the packer plans for (0 while the estimate is negligible) */
    double error_estimate, sample_error;
    /* packing scratch, per item of a step */
    balance_entry *item_entry;
    double *item_cost;
    int *item_bin;
    int32_t *item_next;           /* per-bin linked lists */
    int32_t *slot_item;           /* the items in the order of the assignment (rank by rank) */
    uint64_t *sort_values, *sort_scratch;   /* (key << 32 | item) for the radix sorts */
    /* per bin */
    int32_t *bin_head;
    int64_t *bin_start;           /* n_ranks + 1 */
    double *bin_load;             /* planned load (see planned_load); n_ranks + 1, the last infinite */
    double *bin_sum, *bin_square; /* predicted seconds of the bin's samples, and of their squares */
    double spread_quantile;       /* z / sqrt(3), z = sqrt(2 ln R) (see planned_load) */
    uint64_t *bin_order, *bin_order_scratch;   /* bins sorted by load (the pour), (key << 32 | bin) */
    double *rank_error, *rank_ratio, *rank_scratch;   /* per rank: the error estimate's scratch */
    int32_t *queue_head, *queue_next;     /* bins in a bucket queue on load (see queue_init) */
    int32_t *swap_item;           /* REFINE_SWAP_PAIRS: the refinement's smallest-bin items and costs */
    double *swap_cost;
    int queue_lowest;             /* lowest bucket that may be non-empty */
    double queue_low, queue_per_bucket;
    int64_t *scratch, *scratch2;
    balance_entry *entry_scratch;
};

/* ---- random order -------------------------------------------------------------------------------- */

enum { STREAM_ORDER = 1, STREAM_BATCHES = 2 };

/* Fisher-Yates with a generator seeded by (seed, epoch, stream): epoch e's order = shuffle(seed, e). */
static void shuffle(int64_t *items, int64_t n_items, uint64_t seed, int64_t epoch, uint64_t stream)
{
    uint64_t state = rng_hash(rng_hash(seed, stream), (uint64_t)epoch);
    for (int64_t i = n_items - 1; i > 0; i--) {
        int64_t j = (int64_t)(((unsigned __int128)rng_next_u64(&state) * (uint64_t)(i + 1)) >> 64);
        int64_t t = items[i]; items[i] = items[j]; items[j] = t;
    }
}

/* ---- small helpers ------------------------------------------------------------------------------- */

static double entry_cost(const balancer *b, const balance_entry *entry)
{
    return cost_model_predict(&b->cm, entry->sample.tokens, entry->sample.text_len);
}

static void features_add_sample(const balancer *b, cost_features *features, const balance_sample *sample)
{
    cost_features_add(&b->cm, features, sample->tokens, sample->text_len);
}

static void features_sub(cost_features *features, const cost_features *minus)
{
    for (int j = 0; j < COST_N_FEATURES; j++) features->value[j] -= minus->value[j];
}

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
static double base_compute_budget(const balancer *b)
{
    if (b->compute_budget_config > 0) return b->compute_budget_config;
    return cost_model_predict_features(&b->cm, &b->typical_batch);
}

/* The costliest sample with its error margin: no rank's step can be planned shorter. */
static double max_planned_sample(const balancer *b)
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
    return fmax(fmax(base_compute_budget(b), budget_floor_samples * max_planned_sample(b)), memory_fill_cost(b));
}

void balancer_set_mem_fill(balancer *b, double fraction) { b->mem_fill = fraction; }

/* ---- buckets and the bucket strategies ------------------------------------------------------------- */

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

static void build_buckets(balancer *b)
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

/* dual: cost(S) ~ k S^p over the dataset (least squares in log-log, weighted by bucket counts, unless
   the deck fixes p), M_comp = base compute budget / k, so B S^p <= M_comp is B cost(S) <~ budget. */
static void fit_dual(balancer *b)
{
    double weight_sum = 0, x_mean = 0, y_mean = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        double w = (double)b->bucket_count[k];
        weight_sum += w;
        x_mean += w * log((double)b->bucket_tokens[k]);
        y_mean += w * log(cost_model_predict(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k]));
    }
    x_mean /= weight_sum;
    y_mean /= weight_sum;
    double sxx = 0, sxy = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        double w = (double)b->bucket_count[k];
        double x = log((double)b->bucket_tokens[k]) - x_mean;
        double y = log(cost_model_predict(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k])) - y_mean;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    b->dual_p = b->dual_p_config > 0 ? b->dual_p_config : (sxx > 0 ? sxy / sxx : 1.0);
    b->dual_scale = exp(y_mean - b->dual_p * x_mean);
    b->dual_comp_budget = base_compute_budget(b) / b->dual_scale;
}

static int64_t dual_batch(const balancer *b, int k)
{
    double by_mem = b->mem_budget / cost_model_mem(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k]);
    double by_comp = b->dual_comp_budget / pow((double)b->bucket_tokens[k], b->dual_p);
    double size = floor(fmin(by_mem, by_comp));
    return size >= 1 ? (int64_t)size : 1;
}

/* Mean features of an equal_tokens batch over the dataset: the derived compute budget's shape. */
static void derive_typical_batch(balancer *b)
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
static void build_batches(balancer *b)
{
    int64_t *bucket_fill = xcalloc((size_t)b->n_buckets + 1, sizeof(int64_t));
    for (int k = 0; k < b->n_buckets; k++) bucket_fill[k + 1] = bucket_fill[k] + b->bucket_count[k];
    balance_entry *grouped = b->entry_scratch;
    for (int64_t i = 0; i < b->n_active; i++) grouped[bucket_fill[b->sample_bucket[b->order[i].index]]++] = b->order[i];
    int64_t *cut_start = b->scratch2;
    b->n_batches = 0;
    int64_t offset = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        int64_t size = b->strategy == STRATEGY_DUAL ? dual_batch(b, k) : equal_tokens_batch(b, k);
        for (int64_t first = 0; first < b->bucket_count[k]; first += size) cut_start[b->n_batches++] = offset + first;
        offset += b->bucket_count[k];
    }
    cut_start[b->n_batches] = b->n_active;
    int64_t *batch_order = b->scratch;
    for (int64_t i = 0; i < b->n_batches; i++) batch_order[i] = i;
    shuffle(batch_order, b->n_batches, b->seed, b->epoch, STREAM_BATCHES);
    int64_t written = 0;
    for (int64_t i = 0; i < b->n_batches; i++) {
        b->batch_start[i] = written;
        for (int64_t j = cut_start[batch_order[i]]; j < cut_start[batch_order[i] + 1]; j++) b->batch_samples[written++] = grouped[j];
    }
    b->batch_start[b->n_batches] = written;
    b->next_batch = 0;
    free(bucket_fill);
}

static void start_epoch(balancer *b, int64_t epoch)
{
    b->epoch = epoch;
    b->position = 0;
    b->pool_count = 0;
    int64_t *shuffled = b->scratch;
    memcpy(shuffled, b->active, (size_t)b->n_active * sizeof(int64_t));
    shuffle(shuffled, b->n_active, b->seed, epoch, STREAM_ORDER);
    for (int64_t i = 0; i < b->n_active; i++) b->order[i] = (balance_entry){b->samples[shuffled[i]], shuffled[i]};
    b->remaining = b->all_features;
    if (b->strategy != STRATEGY_GLOBAL) build_batches(b);
}

/* ---- the global packer ----------------------------------------------------------------------------- */

/* Stable LSD radix sort of `values` on their bits 32 .. 32 + RADIX_BITS * passes, ascending (the low 32
   bits carry what is sorted). Returns the buffer holding the result: `values` or `scratch`. */
static uint64_t *radix_sort_high(uint64_t *values, uint64_t *scratch, int64_t n_values, int passes)
{
    uint32_t count[RADIX_MAX_PASSES][RADIX_DIGITS];
    memset(count, 0, (size_t)passes * sizeof(count[0]));
    const uint64_t mask = RADIX_DIGITS - 1;
    for (int64_t i = 0; i < n_values; i++)
        for (int pass = 0; pass < passes; pass++) count[pass][(values[i] >> (32 + pass * RADIX_BITS)) & mask]++;
    for (int pass = 0; pass < passes; pass++) {
        uint32_t offset = 0;
        for (int d = 0; d < RADIX_DIGITS; d++) { uint32_t c = count[pass][d]; count[pass][d] = offset; offset += c; }
        const int shift = 32 + pass * RADIX_BITS;
        for (int64_t i = 0; i < n_values; i++) scratch[count[pass][(values[i] >> shift) & mask]++] = values[i];
        uint64_t *t = values; values = scratch; scratch = t;
    }
    return values;
}

/* A non-negative value's sort key: its float bits (which order like the values), the top `bits` of 31. */
static uint64_t float_key(double value, int bits)
{
    const float rounded = (float)value;
    uint32_t key;
    memcpy(&key, &rounded, sizeof(key));
    return (uint64_t)((key & 0x7fffffffu) >> (31 - bits));
}

/* The bins by ascending load (ties: lower bin first), each as (key << 32 | bin). */
static const uint64_t *bins_by_load(balancer *b)
{
    for (int r = 0; r < b->n_ranks; r++) b->bin_order[r] = float_key(b->bin_load[r], 31) << 32 | (uint64_t)r;
    return radix_sort_high(b->bin_order, b->bin_order_scratch, b->n_ranks, LOAD_KEY_PASSES);
}

/* The bins in a bucket queue on load: QUEUE_BUCKETS buckets over [low, high] (loads above share the
   last), each a list of bins in ascending load ended by the sentinel bin n_ranks (of infinite load).
   While a queue is in use only the least loaded bin gains load (and loads never fall), so the lowest
   non-empty bucket only moves up and its first bin is the least loaded: about O(1) per placement,
   against a heap's O(log R) of unpredictable branches. */
static int queue_bucket(const balancer *b, double load)
{
    const double k = (load - b->queue_low) * b->queue_per_bucket;
    return k < QUEUE_BUCKETS - 1 ? (k > 0 ? (int)k : 0) : QUEUE_BUCKETS - 1;
}

static void queue_init(balancer *b, double low, double high)
{
    b->queue_low = low;
    b->queue_per_bucket = high > low ? QUEUE_BUCKETS / (high - low) : 0;
    for (int k = 0; k < QUEUE_BUCKETS; k++) b->queue_head[k] = b->n_ranks;
    for (int bin = b->n_ranks - 1; bin >= 0; bin--) {   /* each before the bins of as much load: ties lower bin first */
        const double load = b->bin_load[bin];
        int32_t *link = &b->queue_head[queue_bucket(b, load)];
        while (b->bin_load[*link] < load) link = &b->queue_next[*link];
        b->queue_next[bin] = *link;
        *link = bin;
    }
    b->queue_lowest = 0;
}

/* The least loaded bin. */
static int queue_least(balancer *b)
{
    while (b->queue_head[b->queue_lowest] == b->n_ranks) b->queue_lowest++;
    return b->queue_head[b->queue_lowest];
}

/* The bin queue_least gave gained load: move it to its place (before the bins of its bucket with as
   much load or more). */
static void queue_raise_least(balancer *b)
{
    const int bin = b->queue_head[b->queue_lowest];
    b->queue_head[b->queue_lowest] = b->queue_next[bin];
    const double load = b->bin_load[bin];
    int32_t *link = &b->queue_head[queue_bucket(b, load)];
    while (b->bin_load[*link] < load) link = &b->queue_next[*link];
    b->queue_next[bin] = *link;
    *link = bin;
}

/* The smallest and largest bin loads; returns their sum. */
static double bins_load_range(const balancer *b, double *min_load, double *max_load)
{
    double sum = b->bin_load[0];
    *min_load = *max_load = b->bin_load[0];
    for (int r = 1; r < b->n_ranks; r++) {
        *min_load = fmin(*min_load, b->bin_load[r]);
        *max_load = fmax(*max_load, b->bin_load[r]);
        sum += b->bin_load[r];
    }
    return sum;
}

/* The load the packer balances: a bin's predicted seconds plus a margin for the model's per-sample
   error e (sample_error, the half-width of a uniform relative error): with independent errors the
   bin's time spreads by e/sqrt(3) * sqrt(sum c_i^2), and the slowest of R bins sits about
   z = sqrt(2 ln R) spreads high, but never more than e * sum c_i (every sample off by +e): the margin is
   e * min(z/sqrt(3) * sqrt(sum c_i^2), sum c_i). Without a measured error it is the prediction. See
   docs/balancer.md, "Robustness". */
static double planned(const balancer *b, double sum, double square)
{
    if (b->sample_error <= 0) return sum;
    const double spread_square = b->spread_quantile * b->spread_quantile * square;   /* no root when it is capped */
    return sum + b->sample_error * (spread_square >= sum * sum ? sum : sqrt(spread_square));
}

static double planned_load(const balancer *b, int bin) { return planned(b, b->bin_sum[bin], b->bin_square[bin]); }

/* How fast planned() grows with a small item's cost: 1 + e where the margin is capped at e * sum, else
   about 1 (a small item hardly moves sqrt(sum c_i^2)). */
static double planned_growth(const balancer *b, double sum, double square)
{
    if (b->sample_error <= 0) return 1.0;
    return b->spread_quantile * b->spread_quantile * square >= sum * sum ? 1.0 + b->sample_error : 1.0;
}

/* Put an item into a bin's list and load. */
static void assign_item(balancer *b, int32_t item, int bin)
{
    b->item_bin[item] = bin;
    b->item_next[item] = b->bin_head[bin];
    b->bin_head[bin] = item;
    b->bin_sum[bin] += b->item_cost[item];
    b->bin_square[bin] += b->item_cost[item] * b->item_cost[item];
    b->bin_load[bin] = planned_load(b, bin);
}

static void unlink_item(balancer *b, int32_t item)
{
    int bin = b->item_bin[item];
    int32_t *link = &b->bin_head[bin];
    while (*link != item) link = &b->item_next[*link];
    *link = b->item_next[item];
    b->bin_sum[bin] -= b->item_cost[item];
    b->bin_square[bin] = fmax(b->bin_square[bin] - b->item_cost[item] * b->item_cost[item], 0.0);
    b->bin_load[bin] = planned_load(b, bin);
}

/* An item's sort value: (key << 32 | item), the key descending with its cost. */
static uint64_t item_sort_value(int64_t item, double cost)
{
    const int bits = COST_KEY_PASSES * RADIX_BITS;
    return ((((uint64_t)1 << bits) - 1) - float_key(cost, bits)) << 32 | (uint64_t)item;
}

/* Items 0..n_items-1 (their sort values written by select_item) by decreasing cost, ties oldest first. */
static const uint64_t *sort_items_by_cost(balancer *b, int64_t n_items)
{
    return radix_sort_high(b->sort_values, b->sort_scratch, n_items, COST_KEY_PASSES);
}

static int32_t sorted_item(const uint64_t *sorted, int64_t i) { return (int32_t)(uint32_t)sorted[i]; }

/* Pour small items (largest first) into the bins, least loaded first, each bin up to the common water
   level that the items' total reaches; an item goes to the current bin while it overshoots the level
   by less than half its cost. `small_total` is the items' total cost. Returns how many items were poured
   (the first ones), and their cost in `poured_cost`. */
static int64_t pour_small_items(balancer *b, const uint64_t *items, int64_t n_small, double small_total,
                                double *poured_cost)
{
    if (n_small == 0) return 0;
    const int n_ranks = b->n_ranks;
    const uint64_t *bins = bins_by_load(b);
    /* level: the k least loaded bins filled to L, with L <= the next; bin r's planned load grows by g_r
       per second of cost (1 + e where its margin is e times its sum, else about 1), so it takes
       (L - load_r) / g_r of the small items' total: L = (total + sum of load_r / g_r) / sum of 1 / g_r */
    double weighted_loads = 0, weights = 0, level = 0;
    int below = 0;
    while (below < n_ranks) {
        const int bin = (int)(uint32_t)bins[below];
        const double weight = 1.0 / planned_growth(b, b->bin_sum[bin], b->bin_square[bin]);
        weighted_loads += weight * b->bin_load[bin];
        weights += weight;
        below++;
        level = (small_total + weighted_loads) / weights;
        if (below == n_ranks || level <= b->bin_load[(uint32_t)bins[below]]) break;
    }
    int64_t poured = 0;
    double total = 0;
    const double max_growth = 1.0 + b->sample_error;   /* planned(sum, ...) <= max_growth * sum */
    for (int current = 0; current < below && poured < n_small; current++) {
        const int bin = (int)(uint32_t)bins[current];
        double sum = b->bin_sum[bin], square = b->bin_square[bin];
        const double sum_before = sum;
        int32_t head = b->bin_head[bin];
        for (; poured < n_small; poured++) {
            const int32_t item = sorted_item(items, poured);
            const double cost = b->item_cost[item];
            if (max_growth * sum + 0.5 * cost > level && planned(b, sum, square) + 0.5 * cost > level) break;
            b->item_bin[item] = bin;
            b->item_next[item] = head;
            head = item;
            sum += cost;
            square += cost * cost;
        }
        total += sum - sum_before;
        b->bin_sum[bin] = sum;
        b->bin_square[bin] = square;
        b->bin_load[bin] = planned(b, sum, square);
        b->bin_head[bin] = head;
    }
    *poured_cost = total;
    return poured;
}

/* Lower the largest bin by moving one of its items to the smallest bin, or swapping one with a smaller
   item of the smallest bin, choosing the change that lands closest to the middle of the gap. */
static void refine_bins(balancer *b)
{
    for (int iteration = 0; iteration < REFINE_ITERATIONS; iteration++) {
        int max_bin = 0, min_bin = 0;
        for (int r = 1; r < b->n_ranks; r++) {
            if (b->bin_load[r] > b->bin_load[max_bin]) max_bin = r;
            if (b->bin_load[r] < b->bin_load[min_bin]) min_bin = r;
        }
        double gap = b->bin_load[max_bin] - b->bin_load[min_bin];
        if (!(gap > refine_tolerance * b->bin_load[max_bin])) return;
        int32_t best_from = -1, best_to = -1;
        double best_distance = gap / 2;   /* a change of size delta in (0, gap) helps; best near gap/2 */
        int n_swap = 0;                   /* the smallest bin's items (as many as the pairs may reach), in a row */
        for (int32_t to = b->bin_head[min_bin]; to >= 0 && n_swap < REFINE_SWAP_PAIRS; to = b->item_next[to]) {
            b->swap_item[n_swap] = to;
            b->swap_cost[n_swap++] = b->item_cost[to];
        }
        int64_t pairs = 0;
        for (int32_t from = b->bin_head[max_bin]; from >= 0; from = b->item_next[from]) {
            double move = b->item_cost[from];
            if (move < gap && fabs(move - gap / 2) < best_distance) { best_distance = fabs(move - gap / 2); best_from = from; best_to = -1; }
            for (int k = 0; k < n_swap && pairs < REFINE_SWAP_PAIRS; k++, pairs++) {
                double delta = move - b->swap_cost[k];
                if (delta > 0 && delta < gap && fabs(delta - gap / 2) < best_distance) {
                    best_distance = fabs(delta - gap / 2);
                    best_from = from;
                    best_to = b->swap_item[k];
                }
            }
        }
        if (best_from < 0) return;
        const double old_max = b->bin_load[max_bin];
        unlink_item(b, best_from);
        assign_item(b, best_from, min_bin);
        if (best_to >= 0) {
            unlink_item(b, best_to);
            assign_item(b, best_to, max_bin);
        }
        if (fmax(b->bin_load[max_bin], b->bin_load[min_bin]) >= old_max) {   /* the margins ate the gain: undo */
            if (best_to >= 0) {
                unlink_item(b, best_to);
                assign_item(b, best_to, min_bin);
            }
            unlink_item(b, best_from);
            assign_item(b, best_from, max_bin);
            return;
        }
    }
}

/* The step's candidate k: the pool's samples first, then the epoch order's from `position` on; NULL
   past the end of the epoch. (The order is read in place: copying it into the pool first would double
   the memory traffic of a step.) */
static const balance_entry *candidate(const balancer *b, int64_t k)
{
    if (k < b->pool_count) return &b->pool[k];
    const int64_t at = b->position + (k - b->pool_count);
    return at < b->n_active ? &b->order[at] : NULL;
}

static void add_item(balancer *b, int64_t item, const balance_entry *entry, double cost)
{
    b->item_entry[item] = *entry;
    b->item_cost[item] = cost;
}

/* An item of the step's selection, which is sorted by cost. */
static void select_item(balancer *b, int64_t item, const balance_entry *entry, double cost)
{
    add_item(b, item, entry, cost);
    b->sort_values[item] = item_sort_value(item, cost);
}

/* The step is done with candidates 0 .. scanned-1, of which it passed over `n_kept`, now at the pool's
   front: the pool keeps them, oldest first, then the pool's samples not looked at. */
static void pool_keep(balancer *b, int64_t n_kept, int64_t scanned)
{
    if (scanned <= b->pool_count) {
        const int64_t n_rest = b->pool_count - scanned;
        memmove(b->pool + n_kept, b->pool + scanned, (size_t)n_rest * sizeof(balance_entry));
        b->pool_count = n_kept + n_rest;
    } else {
        b->position += scanned - b->pool_count;
        b->pool_count = n_kept;
    }
}

/* Budget mode: offer the pool's samples after the step's `n_items`, oldest first, to the least loaded
   bin, which takes a sample if it stays under the largest bin's load; the pool keeps those not taken,
   oldest first, up to [balance] pool of them. Returns the new number of items. */
static int64_t fill_gaps(balancer *b, int64_t n_items)
{
    double min_load, max_load;
    bins_load_range(b, &min_load, &max_load);
    int64_t n_kept = 0;   /* pool samples passed over, compacted to the pool's front */
    int64_t scanned = n_items;
    if (max_load > min_load) {
        queue_init(b, min_load, max_load);
        const balance_entry *entry;
        for (; scanned - n_items < b->pool_capacity && (entry = candidate(b, scanned)); scanned++) {
            const double cost = entry_cost(b, entry);
            const int bin = queue_least(b);
            if (b->bin_load[bin] + cost <= max_load) {
                add_item(b, n_items, entry, cost);
                assign_item(b, (int32_t)n_items++, bin);
                queue_raise_least(b);
            } else {
                b->pool[n_kept++] = *entry;   /* n_kept <= scanned - n_items: never overwrites an unread one */
            }
        }
    }
    pool_keep(b, n_kept, scanned);
    return n_items;
}

/* Items by_cost[first .. end) (largest first) each into the least loaded bin; `largest` is an upper
   bound of their costs and `total` their sum. */
static void place_least_loaded(balancer *b, const uint64_t *by_cost, int64_t first, int64_t end, double largest,
                               double total)
{
    if (first >= end) return;
    double min_load, max_load;
    const double load_sum = bins_load_range(b, &min_load, &max_load);
    /* a bin that takes an item was the least loaded, so at most the mean: none grows past the final
       mean load plus the largest item (each raising a planned load by at most 1 + e times its cost);
       the bins above share the last bucket */
    const double growth = 1.0 + b->sample_error;
    queue_init(b, min_load, (load_sum + growth * total) / b->n_ranks + growth * largest);
    for (int64_t i = first; i < end; i++) {
        assign_item(b, sorted_item(by_cost, i), queue_least(b));
        queue_raise_least(b);
    }
}

/* Packs the step's samples into the bins (item_bin, and bin_head lists for the refinement). Returns
   the number of items (numbered oldest first). */
static int64_t global_pack(balancer *b)
{
    if (b->pool_count == 0 && b->position >= b->n_active) start_epoch(b, b->epoch + 1);
    const int n_ranks = b->n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        b->bin_load[r] = b->bin_sum[r] = b->bin_square[r] = 0;
        b->bin_head[r] = -1;
    }
    /* 1. selection: the oldest samples, up to the step's target (a fixed count, or the remaining cost
          spread evenly over the steps the budget implies, so the epoch's last steps stay balanced) */
    int64_t n_items = 0;
    int take_all = 0;
    double selected = 0;
    if (b->global_batch > 0) {
        const balance_entry *entry;
        for (; n_items < b->global_batch && (entry = candidate(b, n_items)); n_items++) {
            const double cost = entry_cost(b, entry);
            selected += cost;
            select_item(b, n_items, entry, cost);
        }
    } else {
        /* steps left at the budget, but never so many that a rank's share drops below the costliest
           sample (which would then decide the step's length alone) */
        double remaining_cost = cost_model_predict_features(&b->cm, &b->remaining);
        double steps_left = fmin(ceil(remaining_cost / ((double)n_ranks * balancer_compute_budget(b)) - 1e-9),
                                 floor(remaining_cost / ((double)n_ranks * max_planned_sample(b))));
        take_all = !(steps_left > 1);   /* also when a degenerate model predicts nothing */
        const double target = take_all ? INFINITY : remaining_cost / steps_left;
        const balance_entry *entry;
        for (; (entry = candidate(b, n_items)); n_items++) {
            const double cost = entry_cost(b, entry);
            if (n_items > 0 && selected + cost > target) break;
            selected += cost;
            select_item(b, n_items, entry, cost);
        }
    }
    /* 2. longest predicted cost first, each into the least loaded bin; the many small samples at the
          end are poured to a common level instead, which is what placing them one by one would do at
          a fraction of its cost */
    const uint64_t *by_cost = sort_items_by_cost(b, n_items);
    const double small_cost = small_item_fraction * selected / n_ranks;
    int64_t n_large = 0;
    double large_cost = 0;
    for (; n_large < n_items && b->item_cost[sorted_item(by_cost, n_large)] > small_cost; n_large++)
        large_cost += b->item_cost[sorted_item(by_cost, n_large)];
    /* the first n_ranks go one to a bin (all are empty), the rest each to the least loaded */
    const int64_t n_first = n_large < n_ranks ? n_large : n_ranks;
    double first_cost = 0;
    for (int64_t i = 0; i < n_first; i++) {
        const int32_t item = sorted_item(by_cost, i);
        first_cost += b->item_cost[item];
        assign_item(b, item, (int)i);
    }
    if (n_large > n_first)
        place_least_loaded(b, by_cost, n_first, n_large, b->item_cost[sorted_item(by_cost, n_first)],
                           large_cost - first_cost);
    /* the pour stops short of its level where the bins' loads grow faster than their items' costs (the
       planned margins) or items overshoot it: the rest, the smallest, go one by one to the least loaded */
    const double small_cost_total = fmax(selected - large_cost, 0.0);
    double poured_cost = 0;
    const int64_t n_poured = pour_small_items(b, by_cost + n_large, n_items - n_large, small_cost_total, &poured_cost);
    const int64_t n_placed = n_large + n_poured;
    if (n_placed < n_items)
        place_least_loaded(b, by_cost, n_placed, n_items, b->item_cost[sorted_item(by_cost, n_placed)],
                           fmax(small_cost_total - poured_cost, 0.0));
    /* 3. budget mode: fill the bins' gaps below the largest with pool samples that fit */
    if (b->global_batch == 0 && !take_all) n_items = fill_gaps(b, n_items);
    else pool_keep(b, 0, n_items);
    /* 4. swap refinement between the largest bin and the others */
    refine_bins(b);
    return n_items;
}

/* ---- the assignment --------------------------------------------------------------------------------- */

static void assignment_reserve(balance_assignment *out, int n_ranks, int64_t n_ids, int64_t n_micro)
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
    }
}

void balance_assignment_free(balance_assignment *a)
{
    free(a->ids); free(a->indices); free(a->rank_start); free(a->rank_micro_start);
    free(a->micro_start); free(a->predicted_seconds); free(a->peak_mem_bytes);
    memset(a, 0, sizeof(*a));
}

/* Append rank `rank`'s samples, entries[picks[k]] for k < n_samples (entries[k] when picks is NULL), to
   `out` from slot `first` on; cut them into micro-batches under the memory budget (next fit in their
   order: the epoch order for global, one bucket's batch for the others), and note the rank's peak
   memory, predicted seconds and features, and (unless cost_squares is NULL) the sum of its samples'
   squared predicted costs. */
static void append_rank(const balancer *b, balance_assignment *out, int rank, const balance_entry *entries,
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
    assignment_reserve(out, n_ranks, n_items, n_items);
    int64_t *next = b->bin_start;   /* bin r's slots start at next[r]; then its next free slot */
    memset(next, 0, ((size_t)n_ranks + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n_items; i++) next[b->item_bin[i] + 1]++;
    for (int r = 0; r < n_ranks; r++) next[r + 1] += next[r];
    for (int r = 0; r < n_ranks; r++) out->rank_start[r] = next[r];
    for (int64_t i = 0; i < n_items; i++) b->slot_item[next[b->item_bin[i]]++] = (int32_t)i;
    for (int r = 0; r < n_ranks; r++) {
        const int64_t first = out->rank_start[r];
        append_rank(b, out, r, b->item_entry, b->slot_item + first, next[r] - first, first, n_micro, &features[r],
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
    assignment_reserve(out, b->n_ranks, 0, 0);
    if (b->strategy == STRATEGY_GLOBAL) {
        const int64_t n_items = global_pack(b);
        out->epoch = b->epoch;
        append_packed(b, out, n_items, features, cost_squares, &n_micro);
        n_ids = n_items;
    } else {
        if (b->next_batch >= b->n_batches) start_epoch(b, b->epoch + 1);
        out->epoch = b->epoch;
        for (int r = 0; r < b->n_ranks; r++) {
            int64_t first = 0, count = 0;
            if (b->next_batch < b->n_batches) {
                first = b->batch_start[b->next_batch];
                count = b->batch_start[b->next_batch + 1] - first;
                b->next_batch++;
            }
            assignment_reserve(out, b->n_ranks, n_ids + count, n_micro + count);
            append_rank(b, out, r, b->batch_samples + first, NULL, count, n_ids, &n_micro, &features[r],
                        &cost_squares[r]);
            n_ids += count;
        }
    }
    out->rank_start[b->n_ranks] = n_ids;
    out->rank_micro_start[b->n_ranks] = (int)n_micro;
    out->micro_start[n_micro] = n_ids;
    out->global_samples = n_ids;
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
        if (bytes <= b->mem_budget) { b->active[b->n_active++] = i; continue; }
        if (n_over++ >= max_reported) continue;
        char line[512], need[32], budget[32];
        format_size(bytes, need, sizeof need);
        format_size(b->mem_budget, budget, sizeof budget);
        snprintf(line, sizeof(line), "sample %lld: %d tokens (+%d text tokens) need %s of activations (recompute = %s), "
                 "over the memory budget of %s per rank (at most %lld tokens fit)",
                 (long long)sample->id, sample->tokens, sample->text_len, need,
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
                "mem_budget, or set [balance] oversize = skip\n", (long long)n_over,
                advise_recompute ? " set [train] recompute = block," : "");
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
    b->pool_capacity = config->balance.pool;
    b->seed = config->run.seed;
    b->calibrate = config->balance.calibrate;
    b->mem_budget = mem_budget_bytes;
    b->compute_budget_config = config->balance.compute_budget;
    b->mem_fill = config->balance.mem_fill;
    b->max_tokens = config->balance.max_tokens;
    b->dual_p_config = config->balance.dual_p;
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
    build_buckets(b);
    derive_typical_batch(b);
    update_max_sample_cost(b);
    fit_dual(b);
    start_epoch(b, 0);
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
    free(b->queue_head); free(b->queue_next); free(b->swap_item); free(b->swap_cost); free(b->pending); free(b->pending_square);
    free(b);
}

int balancer_calibrate(balancer *b, int n_observations, const cost_features *features, const double *seconds)
{
    if (!cost_model_calibrate(&b->cm, n_observations, features, seconds)) return 0;
    update_max_sample_cost(b);
    fit_dual(b);
    return 1;
}

const cost_model *balancer_cost_model(const balancer *b) { return &b->cm; }
int64_t balancer_epoch_samples(const balancer *b) { return b->n_active; }
int64_t balancer_skipped(const balancer *b) { return b->n_skipped; }
double balancer_dual_p(const balancer *b) { return b->dual_p; }

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

void balancer_start_at_epoch(balancer *b, int64_t epoch)
{
    start_epoch(b, epoch > 0 ? epoch : 0);
}

int balancer_load_state(balancer *b, const void *buffer, size_t n_bytes)
{
    state_cursor c = {.bytes = (unsigned char *)buffer, .size = n_bytes};
    const uint64_t magic = (uint64_t)get_i64(&c);
    const int64_t version = get_i64(&c);
    if (magic != state_magic || (version != STATE_VERSION && version != STATE_VERSION_FIVE_FEATURES)) {
        aldit_warn("balance: the checkpoint's balancer state is not a version-%d balancer state", STATE_VERSION);
        return 1;
    }
    int64_t strategy = get_i64(&c), n_samples = get_i64(&c);
    uint64_t hash = (uint64_t)get_i64(&c), seed = (uint64_t)get_i64(&c);
    int64_t saved_ranks = get_i64(&c);
    if (strategy != b->strategy || n_samples != b->n_samples || hash != b->samples_hash || seed != b->seed) {
        aldit_warn("balance: the checkpoint's balancer state belongs to another run (strategy %s vs %s, %lld vs %lld "
                   "samples, %s store index, seed %llu vs %llu)",
                   strategy >= STRATEGY_GLOBAL && strategy <= STRATEGY_EQUAL_TOKENS ? deck_strategy_name((deck_strategy)strategy) : "?",
                   deck_strategy_name(b->strategy),
                   (long long)n_samples, (long long)b->n_samples, hash == b->samples_hash ? "same" : "different",
                   (unsigned long long)seed, (unsigned long long)b->seed);
        return 1;
    }
    int64_t step = get_i64(&c), epoch = get_i64(&c), position = get_i64(&c), next_batch = get_i64(&c);
    int64_t pool_count = get_i64(&c);
    if (c.failed || epoch < 0 || position < 0 || position > b->n_active || pool_count < 0 || pool_count > position) {
        aldit_warn("balance: the checkpoint's balancer state is truncated or inconsistent");
        return 1;
    }
    start_epoch(b, epoch);
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
    const int n_features = version == STATE_VERSION ? COST_N_FEATURES : FIVE_FEATURES;
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
enum { MESSAGE_HEADER = 5 }; /* step, epoch, global samples, micro-batches, the most micro-batches of any rank */

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
            int64_t count = MESSAGE_HEADER + n_micro + 1 + (a->rank_start[r + 1] - a->rank_start[r]);
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
            memcpy(message + MESSAGE_HEADER + n_micro + 1, a->ids + a->rank_start[r],
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
                    MESSAGE_HEADER + message[3] + 1 <= received,
                "balance: malformed assignment message (%d values)", received);
    mine->step = message[0];
    mine->epoch = message[1];
    mine->global_samples = message[2];
    mine->n_micro = (int)message[3];
    mine->max_micro = (int)message[4];
    mine->n_samples = received - MESSAGE_HEADER - mine->n_micro - 1;
    if (mine->n_micro + 1 > mine->capacity_micro) {
        mine->capacity_micro = mine->n_micro + 1;
        mine->micro_start = xrealloc(mine->micro_start, (size_t)mine->capacity_micro * sizeof(int));
    }
    if (mine->n_samples > mine->capacity_ids || !mine->ids) {
        mine->capacity_ids = mine->n_samples > 0 ? mine->n_samples : 1;
        mine->ids = xrealloc(mine->ids, (size_t)mine->capacity_ids * sizeof(int64_t));
    }
    for (int m = 0; m <= mine->n_micro; m++) mine->micro_start[m] = (int)message[MESSAGE_HEADER + m];
    ALDIT_CHECK(mine->micro_start[mine->n_micro] == mine->n_samples, "balance: assignment message's micro-batches "
                "cover %d of %d samples", mine->micro_start[mine->n_micro], mine->n_samples);
    memcpy(mine->ids, message + MESSAGE_HEADER + mine->n_micro + 1, (size_t)mine->n_samples * sizeof(int64_t));
}

void rank_assignment_free(rank_assignment *mine)
{
    free(mine->ids); free(mine->micro_start); free(mine->message);
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
