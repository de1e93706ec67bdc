/* strategy.h — inside the balancer: its state (struct balancer) and what balance.c shares with the strategy files
   (equal_tokens.c, dual.c, packer.c). Not for use outside src/balance/. */
#ifndef ALDIT_BALANCE_STRATEGY_H
#define ALDIT_BALANCE_STRATEGY_H

#include <stdint.h>

#include "balance/balance.h"
#include "balance/costmodel.h"

enum { REFINE_ITERATIONS = 64 };         /* max-bin moves / swaps per step */
enum { REFINE_SWAP_PAIRS = 1 << 14 };    /* item pairs a swap search may look at */
enum { QUEUE_BUCKETS = 4096 };           /* buckets of the queue of bins by load (see queue_init in packer.c) */
enum { STREAM_ORDER = 1, STREAM_BATCHES = 2 };   /* the random streams of balance_shuffle */

/* A sample as the packer handles it: what the balancer knows, and its position in the sample array.
   Epoch orders and the pool hold these by value, so a step reads memory front to back. */
typedef struct { balance_sample sample; int64_t index; } balance_entry;

struct balancer {
    deck_strategy strategy;
    int n_ranks;
    int64_t global_batch;         /* samples per step (global); 0 = budget mode (unless global_tokens) */
    int64_t global_tokens;        /* tokens per step (global; the oldest samples up to it); 0 = off */
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
    /* sequence-parallel groups (groups.c) */
    int sp_max;                   /* the largest group a sample may get (balance_sp_limit; 1: off) */
    int sp_deck;                  /* [balance] sp as the deck has it (0 auto, 1 off, K): part of the state's identity */
    int32_t *item_group;          /* per item: the size of the group that runs it (1: one rank) */
    double *item_split_cost;      /* per item: its predicted seconds per member rank (cost_model_predict_split) */
    int32_t *group_items;         /* the step's grouped items (item_bin holds a grouped item's base rank) */
    int32_t *group_scratch;
    int64_t n_group_items;
    uint64_t *single_values;      /* the sort values of the step's items of one rank, by decreasing cost */
    double sp_raise;              /* this step: how far the per-rank budget rose over the batch's mean (relative) */
    double sp_raise_max;          /* the largest rise so far */
    int64_t sp_raised_steps;      /* steps whose budget rose */
};


static inline double entry_cost(const balancer *b, const balance_entry *entry)
{
    return cost_model_predict(&b->cm, entry->sample.tokens, entry->sample.text_len);
}

static inline void features_add_sample(const balancer *b, cost_features *features, const balance_sample *sample)
{
    cost_features_add(&b->cm, features, sample->tokens, sample->text_len);
}

static inline void features_sub(cost_features *features, const cost_features *minus)
{
    for (int j = 0; j < COST_N_FEATURES; j++) features->value[j] -= minus->value[j];
}

/* balance.c: the shared part. */
/* Fisher-Yates with a generator seeded by (seed, epoch, stream): epoch e's order = shuffle(seed, e). */
void balance_shuffle(int64_t *items, int64_t n_items, uint64_t seed, int64_t epoch, uint64_t stream);
/* Start epoch `epoch`: its order, the pool emptied, the bucket strategies' batches built. */
void balance_start_epoch(balancer *b, int64_t epoch);
/* Per-rank compute budget of the derived kind: the mean predicted cost of an equal_tokens batch (or the deck's). */
double balance_base_compute_budget(const balancer *b);
/* The costliest sample with its error margin: no rank's step can be planned shorter. */
double balance_max_planned_sample(const balancer *b);

/* The assignment (balance.c): room for n_ids ids and n_micro micro-batches; one rank's samples, entries[picks[k]] for
   k < n_samples (entries[k] when picks is NULL), from slot `first` on, cut into micro-batches of one rank under the
   memory budget, with the rank's peak memory, predicted seconds and features (and, unless cost_squares is NULL, the
   sum of its samples' squared predicted costs). */
void balance_assignment_reserve(balance_assignment *out, int n_ranks, int64_t n_ids, int64_t n_micro);
void balance_append_rank(const balancer *b, balance_assignment *out, int rank, const balance_entry *entries,
                         const int32_t *picks, int64_t n_samples, int64_t first, int64_t *n_micro,
                         cost_features *features, double *cost_squares);

/* equal_tokens.c: the buckets (distinct token counts) and the bucket strategies' batches. */
void balance_build_buckets(balancer *b);
/* Mean features of an equal_tokens batch over the dataset: the derived compute budget's shape. */
void balance_derive_typical_batch(balancer *b);
/* This epoch's batches (equal_tokens or dual sizes), their order shuffled. */
void balance_build_batches(balancer *b);

/* dual.c: the dual strategy's fit of cost ~ scale S^p and its batch size for bucket k. */
void balance_fit_dual(balancer *b);
int64_t balance_dual_batch(const balancer *b, int k);

/* packer.c: the global packer. Packs the step's samples into the rank bins (item_bin, bin_head lists); returns
   the number of items (numbered oldest first). */
int64_t balance_global_pack(balancer *b);
/* Its parts, which the group planner (groups.c) shares. The step's selection: empty bins, the oldest samples up
   to global_batch or global_tokens (or, in budget mode, the step's share of the epoch's remaining cost) as items 0 .. n-1 with their
   sort values; returns n, their predicted seconds in *selected_cost and whether budget mode takes all that is left. */
int64_t balance_global_select(balancer *b, double *selected_cost, int *take_all);
/* The selected items (their sort values) by decreasing cost, ties oldest first. */
const uint64_t *balance_sort_items_by_cost(balancer *b, int64_t n_items);
static inline int32_t sorted_item(const uint64_t *sorted, int64_t i) { return (int32_t)(uint32_t)sorted[i]; }
/* Items by_cost[first .. end) (largest first) each into the least loaded bin; `largest` bounds their costs and
   `total` is their sum. */
void balance_place_least_loaded(balancer *b, const uint64_t *by_cost, int64_t first, int64_t end, double largest,
                                double total);
/* Add `cost` seconds of work that no item of the bin's list carries (a group's share) to bin `bin`'s load. */
void balance_bin_add_load(balancer *b, int bin, double cost);
/* Budget mode: fill the bins' gaps from the pool (else the pool keeps what the step did not take); then the swap
   refinement. Returns the number of items. */
int64_t balance_pack_finish(balancer *b, int64_t n_items, int take_all);

/* groups.c: the global packer with sequence-parallel groups (sp_max > 1): the selection, each item's group
   (item_group; a grouped item's base rank in item_bin), the groups placed, then the items of one rank, then the
   finish. Returns the number of items. */
int64_t balance_group_pack(balancer *b);
/* Write the packed step to `out`: per rank its grouped micro-batches first (one sample each, k descending, then the
   group's base rank, then the planner's order), then its own samples cut under the memory budget; features per rank
   (a grouped sample's divided by its k) for the refit; the ids and micro-batches written in *n_ids and *n_micro. */
void balance_append_groups(balancer *b, balance_assignment *out, int64_t n_items, cost_features *features,
                           double *cost_squares, int64_t *n_ids, int64_t *n_micro);

#endif
