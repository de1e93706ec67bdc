/* packer.c — the global packer: the step's samples longest first into the least loaded rank bin, small samples
   poured to a level, gap filling from the pool (budget mode), swap refinement. */
#include "balance/strategy.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Radix sorts: 11-bit digits; item costs are sorted on their top 22 bits as floats (8 exponent and
   14 mantissa bits: costs within 6e-5 of each other tie), bin loads on all 31 bits of theirs. */
enum { RADIX_BITS = 11, RADIX_DIGITS = 1 << RADIX_BITS, RADIX_MAX_PASSES = 3 };
enum { COST_KEY_PASSES = 2, LOAD_KEY_PASSES = 3 };
/* Samples costing at most this fraction of a rank's mean load are poured to a level, not placed one by one. */
static const double small_item_fraction = 1.0 / 32;
/* Refinement stops once the largest and smallest bins are this close (relative to the largest). */
static const double refine_tolerance = 1e-3;

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

void balance_bin_add_load(balancer *b, int bin, double cost)
{
    b->bin_sum[bin] += cost;
    b->bin_square[bin] += cost * cost;
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
const uint64_t *balance_sort_items_by_cost(balancer *b, int64_t n_items)
{
    return radix_sort_high(b->sort_values, b->sort_scratch, n_items, COST_KEY_PASSES);
}


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
            /* with groups (sp) a sample over one rank's memory waits in the pool for a step that selects it */
            const int fits = b->sp_max <= 1 || cost_model_mem(&b->cm, entry->sample.tokens, entry->sample.text_len) <= b->mem_budget;
            if (b->bin_load[bin] + cost <= max_load && fits) {
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
void balance_place_least_loaded(balancer *b, const uint64_t *by_cost, int64_t first, int64_t end, double largest,
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
int64_t balance_global_select(balancer *b, double *selected_cost, int *take_all_out)
{
    if (b->pool_count == 0 && b->position >= b->n_active) balance_start_epoch(b, b->epoch + 1);
    const int n_ranks = b->n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        b->bin_load[r] = b->bin_sum[r] = b->bin_square[r] = 0;
        b->bin_head[r] = -1;
    }
    /* the oldest samples, up to the step's target (a fixed count, or the remaining cost spread evenly over the
       steps the budget implies, so the epoch's last steps stay balanced) */
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
    } else if (b->global_tokens > 0) {
        int64_t tokens = 0;
        const balance_entry *entry;
        for (; (entry = candidate(b, n_items)); n_items++) {
            if (n_items > 0 && tokens + entry->sample.tokens > b->global_tokens) break;
            tokens += entry->sample.tokens;
            const double cost = entry_cost(b, entry);
            selected += cost;
            select_item(b, n_items, entry, cost);
        }
    } else {
        /* steps left at the budget, but never so many that a rank's share drops below the costliest
           sample (which would then decide the step's length alone) */
        double remaining_cost = cost_model_predict_features(&b->cm, &b->remaining);
        double steps_left = fmin(ceil(remaining_cost / ((double)n_ranks * balancer_compute_budget(b)) - 1e-9),
                                 floor(remaining_cost / ((double)n_ranks * balance_max_planned_sample(b))));
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
    *selected_cost = selected;
    *take_all_out = take_all;
    return n_items;
}

int64_t balance_pack_finish(balancer *b, int64_t n_items, int take_all)
{
    /* budget mode: fill the bins' gaps below the largest with pool samples that fit */
    if (b->global_batch == 0 && b->global_tokens == 0 && !take_all) n_items = fill_gaps(b, n_items);
    else pool_keep(b, 0, n_items);
    /* swap refinement between the largest bin and the others */
    refine_bins(b);
    return n_items;
}

int64_t balance_global_pack(balancer *b)
{
    const int n_ranks = b->n_ranks;
    /* 1. selection */
    int take_all = 0;
    double selected = 0;
    int64_t n_items = balance_global_select(b, &selected, &take_all);
    /* 2. longest predicted cost first, each into the least loaded bin; the many small samples at the
          end are poured to a common level instead, which is what placing them one by one would do at
          a fraction of its cost */
    const uint64_t *by_cost = balance_sort_items_by_cost(b, n_items);
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
        balance_place_least_loaded(b, by_cost, n_first, n_large, b->item_cost[sorted_item(by_cost, n_first)],
                           large_cost - first_cost);
    /* the pour stops short of its level where the bins' loads grow faster than their items' costs (the
       planned margins) or items overshoot it: the rest, the smallest, go one by one to the least loaded */
    const double small_cost_total = fmax(selected - large_cost, 0.0);
    double poured_cost = 0;
    const int64_t n_poured = pour_small_items(b, by_cost + n_large, n_items - n_large, small_cost_total, &poured_cost);
    const int64_t n_placed = n_large + n_poured;
    if (n_placed < n_items)
        balance_place_least_loaded(b, by_cost, n_placed, n_items, b->item_cost[sorted_item(by_cost, n_placed)],
                           fmax(small_cost_total - poured_cost, 0.0));
    /* 3. budget mode: fill the bins' gaps below the largest with pool samples that fit; 4. swap refinement */
    return balance_pack_finish(b, n_items, take_all);
}
