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
    float *adam_m, *adam_v;        /* AdamW moments, n_weights each (whole-model functions only; load fills
                                      caller-owned arrays; the tensor API ignores them) */
    unsigned char *balancer_state; /* the balancer's saved state (load allocates it; release with free) */
    size_t balancer_bytes;
    /* Measured compute seconds per rank of the last step, not yet given to the balancer when its state
       was saved (a resumed run observes them after its first draw, as the uninterrupted run did). */
    double *rank_seconds;          /* load allocates it (release with free) */
    int n_ranks;
    /* [train] precision = fp8: the backend's FP8 delayed-scaling state (backend_ops.get_fp8_state, an opaque blob
       under /run/fp8_scaling); NULL and 0 where the run keeps none (bf16) or the file has none. Load allocates it
       (release with free). */
    unsigned char *fp8_state;
    size_t fp8_bytes;
} checkpoint_state;

/* The tensor groups of a checkpoint; each holds one dataset per parameter, named as in Wan's state_dict. */
typedef enum {
    CHECKPOINT_WEIGHTS, /* /<name>: the weights (the only group of a [model] init file) */
    CHECKPOINT_ADAM_M,  /* /optim/m/<name>: AdamW first moment */
    CHECKPOINT_ADAM_V,  /* /optim/v/<name>: AdamW second moment */
    CHECKPOINT_EMA,     /* /ema/<name>: an exponential moving average of the weights (optional) */
    CHECKPOINT_N_GROUPS
} checkpoint_group;

#define CHECKPOINT_GROUP_BIT(group) (1u << (group))
/* What a resumable checkpoint holds: weights and both moments. */
#define CHECKPOINT_TRAINING_GROUPS \
    (CHECKPOINT_GROUP_BIT(CHECKPOINT_WEIGHTS) | CHECKPOINT_GROUP_BIT(CHECKPOINT_ADAM_M) | CHECKPOINT_GROUP_BIT(CHECKPOINT_ADAM_V))

/* <config->run.dir>/checkpoints/step_NNNNNNNN.h5 for `step`. */
void checkpoint_path(const deck *config, int64_t step, char *path, size_t path_size);

/* ---- writing tensor by tensor (one process: rank 0) ----------------------------------------------
   open, then in any order checkpoint_write_tensor for every parameter of every group in `groups` and
   checkpoint_write_state once, then commit (or abort). Every tensor dataset is stored chunked with
   HDF5's Fletcher-32 checksum. The first failure (disk full, quota, I/O error, a bad call) prints
   "TMP_PATH: what failed: reason" (errno's text for a failed write) to the writer's `errors`; later
   calls on that writer then do nothing and return non-zero, and commit discards the file. HDF5's
   library state stays clean either way: no file is left open to crash the library at exit. */
typedef struct checkpoint_writer checkpoint_writer;

/* Creates <run dir>/checkpoints/step_NNNNNNNN.h5.tmp (and the folders) for `step`, with the format,
   the model dims and eps of `config`, and the resolved deck. `table` (model_create_table suffices; its
   weights are not used) names the parameters and their shapes and must outlive the writer. `groups`:
   the CHECKPOINT_GROUP_BITs the caller will write (commit requires every parameter of each). Refuses,
   before creating anything in HDF5, when the file system has less free space than the tensors plus
   `state_bytes` (the balancer blob and rank seconds) plus metadata, with both sizes in the message.
   NULL on failure (message on `errors`). */
checkpoint_writer *checkpoint_writer_open(const deck *config, const model *table, int64_t step, unsigned groups,
                                          size_t state_bytes, FILE *errors);

/* Writes parameter `name` of `group` from `values`: its n_elements floats in row-major Wan shape.
   Errors: a name not in the table, a group not announced at open, a tensor written twice, a failed write. */
int checkpoint_write_tensor(checkpoint_writer *w, checkpoint_group group, const char *name, const float *values);

/* Writes step, epoch, steps_per_epoch, seed, the balancer blob and the rank seconds of `state` (its
   adam_m/adam_v are ignored). state->step must be the step given to open. */
int checkpoint_write_state(checkpoint_writer *w, const checkpoint_state *state);

/* Checks that every announced tensor and the state were written (else names the first missing one),
   writes the completion mark, flushes, closes, fsyncs, renames the file into place, syncs the folder,
   then deletes all but the newest [checkpoint] keep complete checkpoints and any stale .tmp files.
   On any failure the temporary file is removed, earlier checkpoints stay untouched and the return is
   non-zero. Always releases the writer. The final path is copied to `path_out` (may be NULL). */
int checkpoint_writer_commit(checkpoint_writer *w, char *path_out, size_t path_size);

/* Closes and removes the temporary file and releases the writer (NULL: nothing). Never fails. */
void checkpoint_writer_abort(checkpoint_writer *w);

/* ---- reading tensor by tensor ------------------------------------------------------------------
   Every failure prints "PATH: what: reason" to the reader's `errors` and returns non-zero. A tensor
   whose stored Fletcher-32 checksum does not match its bytes fails with a message naming the tensor
   ("... fails its Fletcher-32 checksum: the file is damaged"); files written without the filter (older
   checkpoints, converted weights) are read unchecked. */
typedef struct checkpoint_reader checkpoint_reader;

/* A checkpoint to resume from: opens `path` and checks the format version, the completion mark, the
   model dims, eps and text_padding recorded in /model against `config` (a file without eps or text_padding,
   written before they were recorded, is accepted). `table`: as for the writer, must outlive the reader. NULL on failure. */
checkpoint_reader *checkpoint_reader_open(const char *path, const deck *config, const model *table, FILE *errors);

/* A [model] init file: any HDF5 file with a dataset per Wan parameter name at its root (an aldit
   checkpoint, or converted weights; only CHECKPOINT_WEIGHTS need be there), or safetensors weights (io/safetensors.h:
   one file, or a sharded set by its *.safetensors.index.json) under Wan's names or diffusers' WanTransformer3DModel
   names (model/wan_names.h; a file using any name only diffusers has is read by diffusers' names). Safetensors are
   told from HDF5 by their content; their header is checked whole at open (a damaged header or a truncated file is
   refused there, naming the file and the tensor). Nothing else is checked at open; every tensor read through it is
   checked for name, shape and finiteness, as for any reader (a safetensors file has weights only: has() is 0 for the
   other groups). NULL on failure (a missing file is named with errno's text). */
checkpoint_reader *checkpoint_reader_open_init(const char *path, const model *table, FILE *errors);

/* The model a weights file was trained as, against `config`: when `path` has a /model group (an aldit
   checkpoint) its recorded dims and eps must equal the deck's, the check checkpoint_reader_open makes (the
   first difference named with both values: "model.num_layers is 2 in the checkpoint, 1 in the deck");
   a file without /model (converted weights, safetensors) passes. Non-zero, with the message on `errors`, on a
   difference or a file that cannot be opened as HDF5. */
int checkpoint_check_model(const char *path, const deck *config, FILE *errors);

/* The model dims and eps an aldit checkpoint recorded in /model, as deck overrides ("model.dim=1536", ...,
   "model.eps=1e-06") for deck_load, which validates them as any deck value: the dims of a file to export without a
   deck. `overrides` has room for CHECKPOINT_MODEL_OVERRIDES strings. Returns their number, or -1 with a message
   naming the file when it is not HDF5 or has no complete /model (converted weights, safetensors: the caller must
   give the dims). */
#define CHECKPOINT_MODEL_OVERRIDES 16
#define CHECKPOINT_OVERRIDE_CHARS 64
int checkpoint_model_overrides(const char *path, char (*overrides)[CHECKPOINT_OVERRIDE_CHARS], FILE *errors);

/* 1 when the file has the group `group` (for CHECKPOINT_WEIGHTS: always), else 0. */
int checkpoint_reader_has(const checkpoint_reader *r, checkpoint_group group);

/* Reads parameter `name` of `group` into `values` (n_elements floats, row-major Wan shape) after
   checking that the dataset exists, is floating point (any float type, converted to fp32) and has the
   table's shape; a mismatch names both shapes. Every value must be finite: the first NaN or Inf is named
   with the file, the tensor (/optim/m/..., /ema/...; "parameter NAME" for a weight) and its index. */
int checkpoint_read_tensor(checkpoint_reader *r, checkpoint_group group, const char *name, float *values);

/* step, epoch, seed, steps_per_epoch (0 when the file predates it), the balancer blob and the rank
   seconds into `state` (blob and seconds allocated: release with free; adam_m/adam_v untouched). */
int checkpoint_read_state(checkpoint_reader *r, checkpoint_state *state);

/* The checks a resume makes on an open checkpoint beyond checkpoint_reader_open's, before any tensor is read:
   the moments /optim/m and /optim/v present, the run state readable (read into `state` as checkpoint_read_state:
   release its allocations with free, whatever the outcome), [run] seed as recorded, and an EMA (/ema) kept only
   where [train] ema_decay is on or [train] ema_drop says to drop it (the message names the ema_decay of the
   file's recorded deck). 0, or 1 after an error on the reader's `errors` naming the file and what to set. */
int checkpoint_check_resume(checkpoint_reader *r, const deck *config, checkpoint_state *state);

/* --check's resume: checkpoint_reader_open and checkpoint_check_resume on `path`, then every tensor a resume
   reads (weights, moments, and /ema where ema_decay is on and the file has it) read into a scratch buffer the
   size of the largest parameter, so that checksums, shapes and finiteness are checked as the run would.
   0, or 1 after the first failure on `errors`. */
int checkpoint_check_resumable(const char *path, const deck *config, const model *table, FILE *errors);

void checkpoint_reader_close(checkpoint_reader *r); /* NULL: nothing */

/* ---- whole-model functions (one process holds the whole model), built on the tensor API --------- */

/* Writes the checkpoint of `state->step`: m's weights, state->adam_m/adam_v and the state, through a
   writer (so: atomically, keep-K, refused early without room). On failure prints "PATH: message" to
   `errors`, removes the temporary file, leaves earlier checkpoints untouched and returns non-zero. The
   final path is copied to `path_out` (may be NULL). */
int checkpoint_save(const deck *config, const model *m, const checkpoint_state *state,
                    char *path_out, size_t path_size, FILE *errors);

/* Newest complete checkpoint in <run dir>/checkpoints: 1 and its path when found, 0 when there is none.
   Temporary (.tmp) and unreadable files are skipped with a warning on `warnings`; -1 (and an error on
   `warnings`) when there are checkpoints but none can be read. (Checksums are verified on load only.) */
int checkpoint_find_latest(const deck *config, char *path, size_t path_size, FILE *warnings);

/* Reads a full checkpoint: weights into m->weights, moments into state->adam_m/adam_v (caller-owned,
   n_weights each), the state as checkpoint_read_state. The checks of checkpoint_reader_open and
   checkpoint_read_tensor apply; the first failure (named file and key, parameter or damaged tensor)
   goes to `errors` and the return is non-zero. */
int checkpoint_load(const char *path, const deck *config, model *m, checkpoint_state *state, FILE *errors);

/* Weights only ([model] init = FILE) into m->weights, through checkpoint_reader_open_init: every
   parameter present with its shape, checksums (where stored) intact, every value finite; the first
   failure is named in the message to `errors` (non-zero return). */
int checkpoint_load_weights(const char *path, model *m, FILE *errors);

/* The same checks for --check (m may be a table from model_create_table): reads each tensor into a
   scratch buffer the size of the largest parameter, so the values' checksums and finiteness are
   checked too, not only names and shapes. */
int checkpoint_check_weights(const char *path, const model *m, FILE *errors);

#endif
