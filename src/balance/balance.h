/* balance.h — the load balancer: per-step sample assignment to ranks (equal_tokens, dual, global), its
   checkpointable state, the scatter of each rank's list and the online refit of the cost model. */
#ifndef ALDIT_BALANCE_H
#define ALDIT_BALANCE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "balance/costmodel.h"
#include "deck/deck.h"

/* What the balancer knows of a sample. */
typedef struct { int64_t id; int32_t tokens; int32_t text_len; } balance_sample;

/* One step's assignment for all ranks (built on rank 0). Rank r holds ids[rank_start[r] .. rank_start[r+1]);
   its micro-batches are m = rank_micro_start[r] .. rank_micro_start[r+1]-1, micro-batch m holding
   ids[micro_start[m] .. micro_start[m+1]). Empty ranks have no micro-batch.
   micro_group[m] is the size k of the sequence-parallel group that runs micro-batch m together (1: its rank alone).
   A micro-batch of a group of k > 1 (the aligned ranks base .. base+k-1, base % k == 0) appears in the list of every
   member, with the same ids; every rank lists its grouped micro-batches first, in one global order (k descending,
   then the group's base rank, then the planner's order), and global_samples counts each sample once. */
typedef struct {
    int64_t step;                 /* 0, 1, ... over the whole run */
    int64_t epoch;                /* epoch every sample of this step belongs to */
    int64_t global_samples;       /* samples over all ranks (the loss divisor) */
    int n_ranks;
    int64_t *ids;                 /* sample ids (balance_sample.id), rank by rank, micro-batch by micro-batch */
    int64_t *indices;             /* the same samples as positions in the balancer's sample array */
    int64_t *rank_start;          /* n_ranks + 1 */
    int *rank_micro_start;        /* n_ranks + 1 */
    int64_t *micro_start;         /* total micro-batches + 1 */
    int32_t *micro_group;         /* per micro-batch: the size of the group that runs it (1: one rank alone) */
    double *predicted_seconds;    /* per rank, by the cost model the balancer used */
    double *peak_mem_bytes;       /* per rank: predicted activation bytes of its largest micro-batch */
    int64_t capacity_ids, capacity_micro;
} balance_assignment;

/* What one rank receives each step. */
typedef struct {
    int64_t step, epoch, global_samples;
    int n_samples;
    int64_t *ids;
    int n_micro;
    int max_micro;                /* the most micro-batches any rank has this step (collectives per micro-batch) */
    int *micro_start;             /* n_micro + 1 offsets into ids */
    int32_t *micro_group;         /* n_micro: each micro-batch's group size (balance_assignment.micro_group) */
    int capacity_ids, capacity_micro, capacity_message;
    int64_t *message;             /* receive buffer */
} rank_assignment;

typedef struct balancer balancer;

/* Rank 0: build a balancer over `samples` (copied) for `n_ranks` ranks with an activation-memory
   budget per rank of `mem_budget_bytes`. Its memory model is the deck's analytic one (cost_model_init)
   or, when `memory` is not NULL, that cost model's activation bytes per sample, token and text token
   (the CUDA backend passes the GPU model's own: its backend_plan's memory model). A sample whose memory alone
   exceeds the budget ends the job (exit 2) naming it, or with [balance] oversize = skip is left out with
   a warning. */
balancer *balancer_create(const deck *config, const balance_sample *samples, int64_t n_samples, int n_ranks,
                          double mem_budget_bytes, const cost_model *memory);
/* The same, but errors (oversize samples, no samples) are printed to `errors` and NULL is returned. */
balancer *balancer_create_checked(const deck *config, const balance_sample *samples, int64_t n_samples, int n_ranks,
                                  double mem_budget_bytes, const cost_model *memory, FILE *errors);
void balancer_free(balancer *b);

/* Next step's assignment for all ranks. Epochs roll over by themselves; a step never mixes epochs. */
void balancer_next(balancer *b, balance_assignment *out);
void balance_assignment_free(balance_assignment *a);

/* Checkpoint state: position, epoch, pool, cost model and refit window. Loading into a balancer built
   from the same deck and samples (any rank count) gives the same future assignments. Returns 0 on
   success; on a malformed buffer or a mismatch (other samples, strategy or seed) prints why to stderr
   and returns non-zero. */
size_t balancer_state_bytes(const balancer *b);
void balancer_save_state(const balancer *b, void *buffer);
int balancer_load_state(balancer *b, const void *buffer, size_t n_bytes);
/* A warm start onto a changed store ([checkpoint] resume_data = changed): in place of a saved state, begin epoch
   `epoch`'s order (the count goes on from the checkpoint's, so the order and the samples' noise are new). Call
   before the first balancer_next. */
void balancer_start_at_epoch(balancer *b, int64_t epoch);

/* Collective: rank 0 passes the step's assignment (others NULL); every rank receives its own part into
   `mine` (start from a zeroed struct; buffers grow as needed; free with rank_assignment_free), micro_group with it.
   A group size that is not a power of two is fatal (a malformed message). */
void balance_scatter(const balance_assignment *all_on_root, rank_assignment *mine);
void rank_assignment_free(rank_assignment *mine);

/* The order inside each micro-batch of `mine` for a device that runs its last sample's self-attention on whole tiles
   of `tile` rows (backend_plan.last_sample_tile): the sample of most tokens among those of at least min_tokens whose
   length is not a multiple of the tile moves to the micro-batch's end, the others keeping their order; nothing moves
   where there is no such sample or it is last already, or where tile <= 0. tokens[i] is the token count of
   mine->ids[i] and moves with it. The same assignment always gives the same order. */
void rank_assignment_order_whole_tiles(rank_assignment *mine, int64_t *tokens, int64_t tile, int64_t min_tokens);

/* Rank 0: measured per-rank compute seconds of an assigned step. Observations are matched to
   assignments in order (the oldest step not yet observed), so the loop may assign step t+1 before
   observing step t. Refits the cost model when [balance] calibrate is on. */
void balancer_observe(balancer *b, const double *rank_seconds);

/* Start-up calibration: each (features, seconds) pair is a timed sample (or set of samples); the cost model is
   fitted to them robustly (cost_model_calibrate: each enters the online refit's window as a step of one rank, with
   the weight its error gives it) and refit at once (the dual strategy's fit follows it). Returns 1 when the
   coefficients changed. */
int balancer_calibrate(balancer *b, int n_observations, const cost_features *features, const double *seconds);

/* Replace [balance] mem_fill, which balancer_create takes from the deck (the CPU trainer sets 0: host
   memory is not what limits a CPU rank's step). Call before the first balancer_next. */
void balancer_set_mem_fill(balancer *b, double fraction);

/* Introspection for logs, the simulator and tests. */
const cost_model *balancer_cost_model(const balancer *b);
int64_t balancer_epoch_samples(const balancer *b);   /* samples per epoch (skipped ones left out) */
int64_t balancer_skipped(const balancer *b);         /* samples left out as oversize */
double balancer_compute_budget(const balancer *b);   /* predicted seconds per rank per step (global, budget mode) */
double balancer_dual_p(const balancer *b);           /* exponent p of the dual strategy */
/* Sequence-parallel groups ([balance] sp; the global strategy only, see docs/balancer.md). The largest group a sample
   may get: the largest power of two k <= sp (auto: no bound), <= n_ranks, dividing model.num_heads and
   [balance] ranks_per_node (so that an aligned block never spans two nodes; auto: all ranks on one node, the trainer
   passes the node's rank count); 1 when sp is off or the strategy another. */
int balance_sp_limit(const deck *config, int n_ranks);
int balancer_sp_max(const balancer *b);             /* balance_sp_limit of the balancer's deck and ranks */
/* With groups the step's per-rank budget is the batch's mean predicted work; where no group brings a sample within it
   the budget rises to that sample's least split cost. The last step's rise and the largest so far (relative to the
   step's mean work; 0: none), and the steps whose budget rose, since the balancer was made or loaded. */
double balancer_sp_last_raise(const balancer *b);
double balancer_sp_raise_max(const balancer *b);
int64_t balancer_sp_raised_steps(const balancer *b);
/* Largest sample tokens that fit the memory budget with `text_len` text tokens. */
int64_t balancer_max_tokens_in_budget(const cost_model *cm, double mem_budget_bytes, int64_t text_len);

/* The activation budget below which training is of no use: [balance] mem_budget where the deck sets one, else
   the activation bytes (cost_model_mem) of the largest of the samples, alone. [train] shard = auto is the least
   sharding whose budget holds it, on every backend and in aldit-sim. */
double balance_least_useful_budget(const deck *config, const cost_model *cm, const balance_sample *samples,
                                   int64_t n_samples);

#endif
