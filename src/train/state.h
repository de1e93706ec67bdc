/* state.h — the training state between checkpoint files and the backend, one tensor at a time: rank 0 reads or writes the file, every rank sets or gets only the values it holds, so no rank holds a whole fp32 array of a sharded state. */
#ifndef ALDIT_STATE_H
#define ALDIT_STATE_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "train/checkpoint.h"

/* Collective, before the backend's start: each state group of `dev` whose CHECKPOINT_GROUP_BIT is in `groups` is
   read tensor by tensor from rank 0's `reader` (the other ranks pass NULL) and sent to the ranks that hold its
   values (every rank where the state is not sharded); BACKEND_WEIGHTS, when not in `groups`, starts as
   model_init_random_param of `seed` (each rank makes the tensors it holds a part of). Groups left out stay as the
   backend starts them (moments zero). `table` names the parameters (a table suffices). Returns 0 on every rank, or
   1 on every rank after rank 0 printed the failure (the file and tensor). */
int state_load(backend *dev, const model *table, checkpoint_reader *reader, unsigned groups, uint64_t seed);

/* Collective, between steps: every tensor of each group in `groups` gathered from the ranks that hold it and
   written through rank 0's `writer` (others pass NULL); after each tensor rank 0 broadcasts its outcome, so every
   collective of the stream spans at most one tensor's write. Returns, on every rank, 0 or non-zero after the
   writer's first failure (rank 0 printed it; the stream stops there on every rank). */
int state_save(const backend *dev, const model *table, checkpoint_writer *writer, unsigned groups);

#endif
