/* shard.h — how the training state is split across ranks ([train] shard): each rank's slice of the one flat parameter array, and the state's bytes per rank in each mode. */
#ifndef ALDIT_SHARD_H
#define ALDIT_SHARD_H

#include <stdint.h>

#include "deck/deck.h"

/* The flat array of n_values parameters (the layout's order) cut into n_ranks contiguous slices of `shard` values
   (ceil(n_values / n_ranks); the last slices may be shorter or empty): this rank owns [first, first + count).
   comm.h's shard collectives use the same cut. */
typedef struct {
    deck_shard mode;   /* never SHARD_AUTO */
    int64_t n_values, shard, first, count;
    int rank, n_ranks;
} shard_layout;

shard_layout shard_layout_of(deck_shard mode, int64_t n_values, int rank, int n_ranks);

/* The training state's bytes on one rank, by what it holds. */
typedef struct {
    double weights;    /* the weights the model computes with (CPU: fp32; GPU: bf16), whole or gathered */
    double gathered;   /* GPU, full: the bf16 weights of the blocks gathered at once (0 elsewhere) */
    double gradients;  /* the step's gradients (and, sharded, this rank's slice of their sum) */
    double master;     /* fp32 master weights apart from `weights` (0 where they are the same array) */
    double moments;    /* AdamW m and v, fp32 */
} shard_bytes;

double shard_bytes_total(const shard_bytes *bytes);

/* The mode name for messages: "none", "optimizer", "gradients", "full". */
const char *shard_mode_name(deck_shard mode);

/* One line for the summaries: "  state      shard = optimizer over 3 ranks: weights 1.2 GiB, ..." (newline ended). */
void shard_describe(deck_shard mode, int n_ranks, const shard_bytes *bytes, int chosen_by_auto, char *text,
                    size_t text_size);

#endif
