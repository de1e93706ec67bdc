/* ulysses.h — Ulysses sequence parallelism's pieces both CPU model families share: a group's check against the model, the split of a stream's packed rows over its members, and the all-to-all exchange between rows and heads. */
#ifndef ALDIT_ULYSSES_H
#define ALDIT_ULYSSES_H

#include <stdint.h>

#include "core/comm.h"
#include "model/model.h"

/* The batch's group against the model: nothing for sp_size 0 or 1; for k > 1 k divides num_heads (fatal, exit 2,
   otherwise) and batch->sp_group is this member's communicator of size k with sp_rank its place (fatal otherwise). */
void ulysses_check_group(const model *m, const model_batch *batch);

/* The split of a stream's `total` packed rows over k members: member p holds [starts[p], starts[p + 1]) with
   starts[p] = p * total / k (integer division: uneven slices, no padding); starts has k + 1 entries. */
void ulysses_split(int64_t total, int k, int64_t *starts);

/* Rows to heads: `local` holds this member's rows of the stream split by `starts` (its group's k + 1 entries), each
   `width` wide over every head; `all` receives every row of the stream, width / k wide: the columns
   [p * width / k, (p + 1) * width / k) of member p (this member's heads). Collective over the group. Scratch: xchg
   (this member's rows * width floats) and counts (4 k). width must be a multiple of k. */
void ulysses_to_heads(const comm_group *group, const int64_t *starts, int64_t width, const float *local, float *all,
                      float *xchg, int64_t *counts);
/* Its reverse, heads to rows: `all` [every row, width / k] -> `local` [this member's rows, width]. */
void ulysses_to_rows(const comm_group *group, const int64_t *starts, int64_t width, const float *all, float *local,
                     float *xchg, int64_t *counts);

#endif
