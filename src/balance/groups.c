/* groups.c — the group planner ([balance] sp): the global packer's step where a sample too costly for the step's
   per-rank budget (the batch's mean work) or too large for one rank's memory runs on an aligned group of k ranks
   (the smallest k whose split cost and memory fit), the groups placed first, the other samples packed around them. */
#include "balance/strategy.h"
#include "core/check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int balance_sp_limit(const deck *config, int n_ranks)
{
    if (config->balance.strategy != STRATEGY_GLOBAL || config->balance.sp == 1) return 1;
    const int largest = config->balance.sp > 1 ? config->balance.sp : 1 << 30;
    const int node = config->balance.ranks_per_node;   /* 0: every rank on one node */
    int k = 1;
    while (2 * k <= largest && 2 * k <= n_ranks && config->model.num_heads % (2 * k) == 0 && (node == 0 || node % (2 * k) == 0))
        k *= 2;
    return k;
}

/* The group size for one sample: the smallest k (1, 2, 4, ... up to sp_max) whose split cost fits `budget` and whose
   split memory fits the memory budget; where none does, the k of least split cost among those within memory (the
   step's budget then rises to it). Its split cost goes to *cost. 0 when no k fits the memory. */
static int choose_group(const balancer *b, const balance_sample *sample, double budget, double *cost)
{
    int best = 0;
    double best_cost = INFINITY;
    for (int k = 1; k <= b->sp_max; k *= 2) {
        if (cost_model_mem_split(&b->cm, sample->tokens, sample->text_len, k) > b->mem_budget) continue;
        const double split = cost_model_predict_split(&b->cm, sample->tokens, sample->text_len, k);
        if (split <= budget) { *cost = split; return k; }
        if (split < best_cost) { best_cost = split; best = k; }
    }
    *cost = best_cost;
    return best;
}

/* The aligned block of k ranks (base % k == 0) whose most loaded rank is the least loaded (ties: the lowest base). */
static int least_loaded_block(const balancer *b, int k)
{
    int best_base = 0;
    double best_load = INFINITY;
    for (int base = 0; base + k <= b->n_ranks; base += k) {
        double load = 0;
        for (int r = base; r < base + k; r++) load = fmax(load, b->bin_load[r]);
        if (load < best_load) { best_load = load; best_base = base; }
    }
    return best_base;
}

/* Choose every item's group (item_group, 1 for most) at the per-rank budget `budget`; the grouped items go to
   group_items, k descending and then cost descending (by_cost's order). Returns the per-rank seconds the budget had
   to rise by for an item no group brings within it (0 when none). */
static double choose_groups(balancer *b, const uint64_t *by_cost, int64_t n_items, double budget)
{
    double raise = 0;
    b->n_group_items = 0;
    for (int64_t i = 0; i < n_items; i++) {
        const int32_t item = sorted_item(by_cost, i);
        double split = b->item_cost[item];
        const int k = choose_group(b, &b->item_entry[item].sample, budget, &split);
        ALDIT_CHECK(k >= 1, "balance: sample %lld fits no group's memory (checked at start-up)",
                    (long long)b->item_entry[item].sample.id);
        b->item_group[item] = k;
        b->item_split_cost[item] = split;
        if (split > budget) raise = fmax(raise, split - budget);
        if (k > 1) b->group_items[b->n_group_items++] = item;
    }
    /* k descending, stable (cost descending within a k) */
    int64_t n_sorted = 0;
    int32_t *sorted = b->group_scratch;
    for (int k = b->sp_max; k >= 2; k /= 2)
        for (int64_t g = 0; g < b->n_group_items; g++)
            if (b->item_group[b->group_items[g]] == k) sorted[n_sorted++] = b->group_items[g];
    memcpy(b->group_items, sorted, (size_t)n_sorted * sizeof(int32_t));
    return raise;
}

/* Each grouped item, in group_items' order, onto the aligned block least loaded at its most loaded rank; every
   member's load grows by the item's split cost. */
static void place_groups(balancer *b)
{
    for (int64_t g = 0; g < b->n_group_items; g++) {
        const int32_t item = b->group_items[g];
        const int k = b->item_group[item], base = least_loaded_block(b, k);
        b->item_bin[item] = base;
        for (int r = base; r < base + k; r++) balance_bin_add_load(b, r, b->item_split_cost[item]);
    }
}

/* The items of one rank alone, largest first, into the least loaded bin (after the groups). */
static void place_singles(balancer *b, const uint64_t *by_cost, int64_t n_items)
{
    int64_t n_single = 0;
    double total = 0;
    for (int64_t i = 0; i < n_items; i++) {
        const int32_t item = sorted_item(by_cost, i);
        if (b->item_group[item] != 1) continue;
        b->single_values[n_single++] = by_cost[i];
        total += b->item_cost[item];
    }
    if (n_single > 0)
        balance_place_least_loaded(b, b->single_values, 0, n_single, b->item_cost[sorted_item(b->single_values, 0)],
                                   total);
}

int64_t balance_group_pack(balancer *b)
{
    int take_all = 0;
    double selected = 0;
    const int64_t n_selected = balance_global_select(b, &selected, &take_all);
    const uint64_t *by_cost = balance_sort_items_by_cost(b, n_selected);
    const double budget = selected / b->n_ranks;
    const double raise = choose_groups(b, by_cost, n_selected, budget);
    b->sp_raise = budget > 0 ? raise / budget : 0;
    if (raise > 0) b->sp_raised_steps++;
    b->sp_raise_max = fmax(b->sp_raise_max, b->sp_raise);
    place_groups(b);
    place_singles(b, by_cost, n_selected);
    const int64_t n_items = balance_pack_finish(b, n_selected, take_all);
    for (int64_t i = n_selected; i < n_items; i++) {   /* the gap fill's samples run on one rank */
        b->item_group[i] = 1;
        b->item_split_cost[i] = b->item_cost[i];
    }
    return n_items;
}

/* ---- the assignment ---------------------------------------------------------------------------------------- */

/* group_items in the assignment's order: k descending, then base rank, then the planner's order (insertion sort:
   the items are already by k descending and planner order). */
static void order_groups(balancer *b)
{
    int32_t *items = b->group_items;
    for (int64_t g = 1; g < b->n_group_items; g++) {
        const int32_t item = items[g];
        int64_t at = g;
        while (at > 0 && b->item_group[items[at - 1]] == b->item_group[item] && b->item_bin[items[at - 1]] > b->item_bin[item]) {
            items[at] = items[at - 1];
            at--;
        }
        items[at] = item;
    }
}

/* Rank `rank`'s grouped micro-batches (one sample each) from slot *slot and micro-batch *micro on; their features
   (each sample's divided by its k), split seconds and largest split memory. */
static void append_rank_groups(const balancer *b, balance_assignment *out, int rank, int64_t *slot, int64_t *micro,
                               cost_features *features, double *seconds, double *peak)
{
    *features = (cost_features){{0}};
    *seconds = *peak = 0;
    for (int64_t g = 0; g < b->n_group_items; g++) {
        const int32_t item = b->group_items[g];
        const int k = b->item_group[item], base = b->item_bin[item];
        if (rank < base || rank >= base + k) continue;
        const balance_entry *entry = &b->item_entry[item];
        out->micro_start[*micro] = *slot;
        out->micro_group[(*micro)++] = k;
        out->indices[*slot] = entry->index;
        out->ids[(*slot)++] = entry->sample.id;
        cost_features one = {{0}};
        cost_features_add(&b->cm, &one, entry->sample.tokens, entry->sample.text_len);
        for (int j = 0; j < COST_N_FEATURES; j++) features->value[j] += one.value[j] / k;
        *seconds += b->item_split_cost[item];
        *peak = fmax(*peak, cost_model_mem_split(&b->cm, entry->sample.tokens, entry->sample.text_len, k));
    }
}

void balance_append_groups(balancer *b, balance_assignment *out, int64_t n_items, cost_features *features,
                           double *cost_squares, int64_t *n_ids, int64_t *n_micro)
{
    const int n_ranks = b->n_ranks;
    int64_t total = n_items;
    for (int64_t g = 0; g < b->n_group_items; g++) total += b->item_group[b->group_items[g]] - 1;
    balance_assignment_reserve(out, n_ranks, total, total);
    order_groups(b);
    /* the singles rank by rank, oldest first (a counting sort; items are numbered oldest first) */
    int64_t *next = b->bin_start;
    memset(next, 0, ((size_t)n_ranks + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n_items; i++) if (b->item_group[i] == 1) next[b->item_bin[i] + 1]++;
    for (int r = 0; r < n_ranks; r++) next[r + 1] += next[r];
    for (int64_t i = 0; i < n_items; i++) if (b->item_group[i] == 1) b->slot_item[next[b->item_bin[i]]++] = (int32_t)i;
    int64_t slot = 0, micro = 0, single_first = 0;
    cost_features taken = {{0}};
    for (int r = 0; r < n_ranks; r++) {
        const int64_t rank_first = slot, micro_first = micro, n_single = next[r] - single_first;
        cost_features grouped;
        double grouped_seconds, grouped_peak;
        append_rank_groups(b, out, r, &slot, &micro, &grouped, &grouped_seconds, &grouped_peak);
        balance_append_rank(b, out, r, b->item_entry, b->slot_item + single_first, n_single, slot, &micro,
                            &features[r], NULL);
        for (int j = 0; j < COST_N_FEATURES; j++) taken.value[j] += features[r].value[j];
        out->predicted_seconds[r] += grouped_seconds;
        out->peak_mem_bytes[r] = fmax(out->peak_mem_bytes[r], grouped_peak);
        for (int j = 0; j < COST_N_FEATURES; j++) features[r].value[j] += grouped.value[j];
        out->rank_start[r] = rank_first;
        out->rank_micro_start[r] = (int)micro_first;
        cost_squares[r] = b->bin_square[r];
        slot += n_single;
        single_first = next[r];
    }
    for (int64_t g = 0; g < b->n_group_items; g++) {   /* each grouped sample once */
        const balance_sample *sample = &b->item_entry[b->group_items[g]].sample;
        cost_features_add(&b->cm, &taken, sample->tokens, sample->text_len);
    }
    features_sub(&b->remaining, &taken);
    *n_ids = slot;
    *n_micro = micro;
}
