/* calibration.h — the GPU start-up calibration's timings, kept in the run folder (calibration.txt) so that a restarted or requeued run on the same device and model skips the timing pass. */
#ifndef ALDIT_CALIBRATION_H
#define ALDIT_CALIBRATION_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "deck/deck.h"

/* The file's name inside [run] dir. Deleting it makes the next run time the shapes again. */
#define CALIBRATION_FILE "calibration.txt"
enum { CALIBRATION_KEY_MAX = 1024 };

/* One timed shape: a micro-batch of `copies` samples of it (0: beyond the GPU model's capacity, not timed,
   seconds -1) and the seconds of its forward + backward, the mean over ranks. */
typedef struct {
    int32_t frames, height, width, text_len;
    int copies;
    double seconds;
} calibration_entry;

/* What the timings depend on, as one line of text: aldit's version, the GPU (its description), the ranks
   sharing it, every [model] key that shapes the network, [train] recompute and attention, and whether the
   micro-batches were packed. Cached timings are reused only under the same key. */
void calibration_key(const deck *config, const char *device, int ranks_per_gpu, char *key, size_t key_size);

typedef enum {
    CALIBRATION_CACHE_HIT,     /* same key, shapes and copies: every entry's seconds filled in */
    CALIBRATION_CACHE_MISSING, /* no such file */
    CALIBRATION_CACHE_STALE,   /* another key, other shapes or other copies (time them again) */
    CALIBRATION_CACHE_CORRUPT  /* unreadable or malformed: a warning names the file and line */
} calibration_cache_status;

/* Read `path` and, when it holds timings for `key` and exactly the shapes and copies of `entries`, fill in
   their seconds. Nothing else of `entries` changes. */
calibration_cache_status calibration_load(const char *path, const char *key, calibration_entry *entries,
                                          int n_entries);

/* Write the entries under `key` to `path` atomically (a temporary file in the same folder, then a rename).
   Returns 0, or -1 after a warning naming the file (the run goes on without a cache). */
int calibration_save(const char *path, const char *key, const calibration_entry *entries, int n_entries);

/* ---- the timing pass: models of one and two blocks scaled to the model's depth, checked at full depth ------ */

/* Shapes timed at full depth as well, to check the scaling; the predicted seconds those checks may take in all
   (the cheapest shape is checked whatever it costs); the least seconds between two progress lines. */
enum { CALIBRATION_MAX_CHECKS = 2 };
#define CALIBRATION_CHECK_SECONDS 10.0
#define CALIBRATION_PROGRESS_EVERY 5.0

/* Seconds of a micro-batch on the model of num_layers blocks from its seconds on models of one and of two blocks
   with the same dims, embeddings, head and recomputation: t1 + (num_layers - 1) (t2 - t1). Every block costs the
   same wherever it sits, so t2 - t1 is one block's forward + backward and, with recompute = block, its re-run
   forward (the model of L blocks re-runs L - 1 of them, never the last: the 2-block model one, the 1-block model
   none), and t1 is one block plus the rest (embeddings, head, loss, staging). A negative difference (noise on a
   micro-batch too small to time) counts as 0. -1 when either is not a timing (<= 0) or num_layers < 1. */
double calibration_depth_seconds(double one_block, double two_blocks, int num_layers);

/* The work of a model of `layers` blocks in block forwards: 3 per block (forward + backward) and, with
   recompute_block, 1 per re-run forward (all but the last block). For the progress' time left. */
double calibration_depth_work(int layers, int recompute_block);

/* The shapes to time at full depth as well, by their predicted seconds (<= 0: not timed, never picked): the
   cheapest, then the costliest other whose seconds fit what budget_seconds leaves after it. Writes their indices
   into picked[] (cheapest first) and returns how many (0 to CALIBRATION_MAX_CHECKS). Ties go to the lower index. */
int calibration_pick_checks(const double *predicted, int n, double budget_seconds, int *picked);

/* Seconds left of work of which done_work units took `elapsed` seconds and left_work units remain (any unit that
   scales with the time). -1 while nothing is done. */
double calibration_seconds_left(double elapsed, double done_work, double left_work);

/* 1 when a progress line is due at `now`: at least `every` seconds after the last one (or the start). */
int calibration_line_due(double now, double last_line, double every);

/* A progress line, without a newline: "calibration: shape k/n (F x H x W, C per micro-batch) on L block(s), about
   T s left"; `check` 1 says "check k/n ... at L blocks" (a full-depth timing). seconds_left < 0: "time left
   unknown". */
void calibration_progress_text(char *text, size_t text_size, int check, int k, int n, const calibration_entry *shape,
                               int layers, double seconds_left);

/* One full-depth check of the scaling: the shape's index, its scaled and its measured seconds. */
typedef struct {
    int shape;
    double predicted, measured;
} calibration_check;

/* How far a prediction is off: predicted / measured - 1 (0 when measured is not a timing). */
double calibration_misfit(double predicted, double measured);

/* The checks as text, without a newline: "misfit at L blocks +1.2% (1 x 32 x 32, 32 per micro-batch), -2.5% (...);
   worst 2.5%". Returns the worst |misfit|. */
double calibration_misfit_text(char *text, size_t text_size, const calibration_check *checks, int n_checks,
                               const calibration_entry *entries, int layers);

/* ---- the whole timing pass ---------------------------------------------------------------------------------- */

/* Told after each shape of a timing call, with its position among the call's shapes. */
typedef void (*calibration_progress_fn)(void *context, int position);

/* Collective: the seconds of one forward + backward of each of n micro-batches on a model of `layers` blocks,
   averaged over the ranks: micro-batch k is entry shapes[k]'s (its copies; -1 where copies is 0), timed after a
   warm-up call of it when warm_up is 1; progress(progress_context, k) after each (backend_ops.time_shapes). */
typedef void (*calibration_time_fn)(void *context, int layers, const int *shapes, int n, int warm_up, double *seconds,
                                    calibration_progress_fn progress, void *progress_context);

typedef struct {
    int num_layers;                         /* the model's depth */
    int recompute_block;                    /* [train] recompute = block (the progress' weights) */
    calibration_time_fn time;
    void *context;                          /* time's */
    void (*agree)(void *bytes, size_t size); /* collective: rank 0's bytes to every rank (NULL: one rank) */
    double (*clock)(void);                  /* seconds, for the progress */
    FILE *progress;                         /* the progress lines (rank 0's stdout; NULL: none) */
} calibration_timer;

/* Collective: each entry's seconds at full depth (-1 where copies is 0). A model of at most 2 blocks is timed
   as it is. A deeper one is timed on models of 1 block (after warm-ups) and of 2 blocks (none: the plans are
   kept), scaled by calibration_depth_seconds; then the shapes calibration_pick_checks picks (rank 0 decides) are
   timed at full depth, and their measured seconds replace the scaled ones: checks[] (at most
   CALIBRATION_MAX_CHECKS; returns how many) holds both. Progress: a line saying what is timed, then
   calibration_progress_text lines at most every CALIBRATION_PROGRESS_EVERY seconds, their time left weighed by
   seed[i] (the deck's FLOP-seeded seconds of entry i's micro-batch at full depth, 0 where not timed) and
   calibration_depth_work, at the rate measured so far. */
int calibration_time(const calibration_timer *timer, calibration_entry *entries, int n_entries, const double *seed,
                     calibration_check *checks);

#endif
