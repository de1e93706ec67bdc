/* checkpoint.h — HDF5 checkpoints: weights under Wan names, AdamW moments, step, seed, model dims, balancer state. */
#ifndef ALDIT_CHECKPOINT_H
#define ALDIT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "deck/deck.h"
#include "model/model.h"

/* Format version written into the root attribute `aldit_checkpoint_version`; the reader accepts only this. */
#define CHECKPOINT_FORMAT_VERSION 1

/* Everything of a run's state besides the weights (which live in the model). */
typedef struct {
    int64_t step;                  /* optimizer steps completed */
    int64_t epoch;                 /* epoch of the last completed step */
    int64_t steps_per_epoch;       /* as planned at the run's start (the LR schedule's); 0 = not recorded */
    uint64_t seed;                 /* [run] seed: with (epoch, sample id) it keys all noise and timesteps */
    float *adam_m, *adam_v;        /* AdamW moments, n_weights each (load fills caller-owned arrays) */
    unsigned char *balancer_state; /* the balancer's saved state (load allocates it; release with free) */
    size_t balancer_bytes;
    /* Measured compute seconds per rank of the last step, not yet given to the balancer when its state
       was saved (a resumed run observes them after its first draw, as the uninterrupted run did). */
    double *rank_seconds;          /* load allocates it (release with free) */
    int n_ranks;
} checkpoint_state;

/* <config->run.dir>/checkpoints/step_NNNNNNNN.h5 for `step`. */
void checkpoint_path(const deck *config, int64_t step, char *path, size_t path_size);

/* One process (rank 0): write the checkpoint of `state->step` to its path plus ".tmp", fsync, rename into
   place, then delete all but the newest [checkpoint] keep checkpoints and any stale .tmp files. On failure
   prints "PATH: message" to `errors`, removes the temporary file, leaves earlier checkpoints untouched and
   returns non-zero. The final path is copied to `path_out` (may be NULL). */
int checkpoint_save(const deck *config, const model *m, const checkpoint_state *state,
                    char *path_out, size_t path_size, FILE *errors);

/* Newest complete checkpoint in <run dir>/checkpoints: 1 and its path when found, 0 when there is none.
   Temporary (.tmp) and unreadable files are skipped with a warning on `warnings`; -1 (and an error on
   `warnings`) when there are checkpoints but none can be read. */
int checkpoint_find_latest(const deck *config, char *path, size_t path_size, FILE *warnings);

/* Read a full checkpoint: weights into m->weights, moments into state->adam_m/adam_v (caller-owned,
   n_weights each), step/epoch/seed and the balancer blob (allocated). The model dims recorded in the file
   must equal the deck's and every parameter must be present with its shape; otherwise a message naming
   the file and the mismatching key or parameter goes to `errors` and the return is non-zero. */
int checkpoint_load(const char *path, const deck *config, model *m, checkpoint_state *state, FILE *errors);

/* Weights only ([model] init = FILE): a dataset named after each parameter at the file's root (an aldit
   checkpoint, or converted official weights), any float type. Every name and shape is checked; the first
   missing or mis-shaped parameter is named in the message to `errors` (non-zero return). */
int checkpoint_load_weights(const char *path, model *m, FILE *errors);

/* The same checks without reading the values (m may be a table from model_create_table): for --check. */
int checkpoint_check_weights(const char *path, const model *m, FILE *errors);

#endif
