/* shard.h — how the training state is split across ranks ([train] shard): which values of the one flat parameter array each rank holds, and the state's bytes per rank in each mode. */
#ifndef ALDIT_SHARD_H
#define ALDIT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "deck/deck.h"
#include "model/layout.h"

/* The flat array of n_values parameters (the layout's order) is cut by units: contiguous ranges, each cut into
   n_ranks pieces of ceil(unit / n_ranks) values (the last pieces shorter or empty); rank r holds piece r of every
   unit. Units: [0, lead), then n_blocks of block_stride values each, then the rest (lead or rest may be empty).
   One unit (shard_layout_of: lead = n_values, no blocks) is the flat cut the CPU backend and comm.h's shard
   collectives use; shard_layout_units cuts the embeddings, each block and the head apart (the CUDA backend: a
   block's gather and reduce-scatter are then one call with equal pieces). Mode none: every rank holds every value. */
typedef struct {
    deck_shard mode;   /* never SHARD_AUTO */
    int64_t n_values;
    int64_t lead, block_stride; /* unit boundaries */
    int n_blocks;
    int rank, n_ranks;
    int64_t held;      /* values this rank holds (the sum of its pieces; n_values in mode none) */
    int64_t first, count; /* one unit: this rank's range [first, first + count) (mode none: the whole array) */
} shard_layout;

shard_layout shard_layout_of(deck_shard mode, int64_t n_values, int rank, int n_ranks);
shard_layout shard_layout_units(deck_shard mode, const model_layout *layout, int rank, int n_ranks);

/* The part of [first, first + count) that `rank` holds: *own_first, *own_count (0 where none). The range must lie
   inside one unit (one parameter tensor always does); fatal otherwise. */
void shard_owned(const shard_layout *layout, int rank, int64_t first, int64_t count, int64_t *own_first,
                 int64_t *own_count);

/* The training state's bytes on one rank, by what it holds (model/layout.h's formula). */
typedef layout_state_bytes shard_bytes;

double shard_bytes_total(const shard_bytes *bytes);

/* The mode name for messages: "none", "optimizer", "gradients", "full". */
const char *shard_mode_name(deck_shard mode);

/* One line for the summaries: "  state      shard = optimizer over 3 ranks: weights 1.2 GiB, ..." (newline ended). */
void shard_describe(deck_shard mode, int n_ranks, const shard_bytes *bytes, int chosen_by_auto, char *text,
                    size_t text_size);

#endif
