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
   sharing it, every [model] key that shapes the network, [train] recompute and attention, whether the
   micro-batches were packed and the time target (which decides the shapes timed at full depth), the family, [train]
   precision and how the timing is done (on random weights and data: a file timed on zeros, before, is not reused). Cached timings
   are reused only under the same key. */
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

/* ---- the timing pass: models of one and two blocks scaled to the model's depth, the cheap shapes and a few
   checks of the scaling timed at full depth ------------------------------------------------------------------ */

/* Checks of the scaling on shapes that stay scaled otherwise (the costliest that fit the budget); the share of the
   time target ([balance] calibrate_seconds) that full-depth timings may take in all, and the share of what the
   passes on 1 and 2 blocks left of it; the least seconds between two progress lines. */
enum { CALIBRATION_MAX_CHECKS = 2 };
#define CALIBRATION_FULL_DEPTH_SHARE (1.0 / 3.0)
#define CALIBRATION_FULL_DEPTH_REST 0.75
#define CALIBRATION_PROGRESS_EVERY 5.0

/* Seconds of a micro-batch on the model of num_layers blocks from its seconds on models of one and of two blocks
   with the same dims, embeddings, head and recomputation: t1 + (num_layers - 1) (t2 - t1). Every block costs the
   same wherever it sits, so t2 - t1 is one block's forward + backward and, with recompute = block, its re-run
   forward (the model of L blocks re-runs L - 1 of them, never the last: the 2-block model one, the 1-block model
   none), and t1 is one block plus the rest (embeddings, head, loss, staging). A negative difference (noise on a
   micro-batch too small to time) counts as 0. -1 when either is not a timing (<= 0) or num_layers < 1. */
double calibration_depth_seconds(double one_block, double two_blocks, int num_layers);

/* Timings on the models of 1 and 2 blocks, whose difference the scaling multiplies by the depth less one: a
   micro-batch there is timed again while its timings sum to under CALIBRATION_REPEAT_SECONDS, at most
   CALIBRATION_MAX_REPEATS times in all, and the least of them counts (a shape's first call on a model just built
   can run slow; docs/balancer.md). The full-depth pass times once: no scaling multiplies its error. */
#define CALIBRATION_REPEAT_SECONDS 0.5
enum { CALIBRATION_MAX_REPEATS = 4 };

/* 1 when a micro-batch timed n_timed times (at least once), its timings summing to timed_seconds, is due another
   timing under repeat_seconds (0: never): while the sum is under it and n_timed is under CALIBRATION_MAX_REPEATS. */
int calibration_repeat_due(int n_timed, double timed_seconds, double repeat_seconds);

/* The work of a model of `layers` blocks in block forwards: 3 per block (forward + backward) and, with
   recompute_block, 1 per re-run forward (all but the last block). For the progress' time left. */
double calibration_depth_work(int layers, int recompute_block);

/* The predicted seconds that full-depth timings may take when the passes on 1 and 2 blocks took `elapsed` of a
   target of target_seconds: CALIBRATION_FULL_DEPTH_SHARE of the target, at most CALIBRATION_FULL_DEPTH_REST of what
   is left of it, at least 0. */
double calibration_full_depth_budget(double target_seconds, double elapsed);

/* What the timing pass of a model deeper than two blocks does with a shape. */
typedef enum {
    CALIBRATION_SCALED = 0,   /* its seconds scaled from the models of 1 and 2 blocks (or not timed at all) */
    CALIBRATION_AT_DEPTH = 1, /* cheap: timed at full depth in place of the scaling */
    CALIBRATION_CHECK = 2     /* costly: timed at full depth to check the scaling of the shapes left scaled */
} calibration_role;

/* The shapes to time at full depth, by their predicted (scaled) seconds (<= 0: not timed, never picked): the
   cheapest first while their running total stays within half of budget_seconds (the cheapest whatever it costs;
   small micro-batches are where the scaling is least reliable, and they cost little), then, CALIBRATION_MAX_CHECKS
   times, the costliest other whose seconds fit what the budget leaves. role[i] gets each shape's role; order[]
   the indices of the picked ones, the cheap ones cheapest first, then the checks; returns how many were picked.
   Ties go to the lower index. */
int calibration_pick_full_depth(const double *predicted, int n, double budget_seconds, int *role, int *order);

/* Seconds left of work of which done_work units took `elapsed` seconds and left_work units remain (any unit that
   scales with the time). -1 while nothing is done. */
double calibration_seconds_left(double elapsed, double done_work, double left_work);

/* 1 when a progress line is due at `now`: at least `every` seconds after the last one (or the start). */
int calibration_line_due(double now, double last_line, double every);

/* A progress line, without a newline: "calibration: shape k/n (F x H x W, C per micro-batch) on L block(s), about
   T s left"; `full_depth` 1 says "full depth k/n ... at L blocks" (the pass at the model's depth). seconds_left < 0:
   "time left unknown". */
void calibration_progress_text(char *text, size_t text_size, int full_depth, int k, int n,
                               const calibration_entry *shape, int layers, double seconds_left);

/* One full-depth timing of a shape that the scaling predicted: the shape's index, its role (CALIBRATION_AT_DEPTH
   or CALIBRATION_CHECK), its scaled and its measured seconds. */
typedef struct {
    int shape;
    calibration_role role;
    double predicted, measured;
} calibration_check;

/* How far a prediction is off: predicted / measured - 1 (0 when measured is not a timing). */
double calibration_misfit(double predicted, double measured);

/* The text rows the start-up calibration times the index-th picked shape with, given the shortest, mean and longest
   caption among the store's samples of that shape: the mean where the text's length enters the cost only with the
   video's (Wan: d S L + e L, and captions padded alike), but, where the text joins the attention (joint_text, MMDiT:
   a + b N + c N^2 + d L^2 + e L), the shortest for even and the longest for odd indices, so that the timings also
   vary L against S and fix the text's own terms (d, e) apart from a. */
int32_t calibration_text_rows(int joint_text, int index, int32_t shortest, int32_t mean, int32_t longest);

/* The scaling's misfits as text, without a newline, n_scaled the shapes left scaled: "misfit of the scaling at L
   blocks: worst -25.3% (1 x 56 x 32, 32 per micro-batch) of the 14 cheapest shapes timed there; checks of the 6
   scaled: +4.0% (5 x 60 x 104, 32 per micro-batch), +3.1% (...); worst 25.3%" ("none scaled" when n_scaled is 0,
   "6 scaled, not checked" when no check fitted). Returns the worst |misfit| of all. */
double calibration_misfit_text(char *text, size_t text_size, const calibration_check *checks, int n_checks,
                               const calibration_entry *entries, int layers, int n_scaled);

/* ---- the whole timing pass ---------------------------------------------------------------------------------- */

/* Told after each shape of a timing call, with its position among the call's shapes. */
typedef void (*calibration_progress_fn)(void *context, int position);

/* Collective: the seconds of one forward + backward of each of n micro-batches on a model of `layers` blocks,
   averaged over the ranks: micro-batch k is entry shapes[k]'s (its copies; -1 where copies is 0), timed after a
   warm-up call of it when warm_up is 1, and again as calibration_repeat_due says under repeat_seconds (the least
   timing counts); progress(progress_context, k) after each (backend_ops.time_shapes). */
typedef void (*calibration_time_fn)(void *context, int layers, const int *shapes, int n, int warm_up,
                                    double repeat_seconds, double *seconds, calibration_progress_fn progress,
                                    void *progress_context);

typedef struct {
    int num_layers;                         /* the model's depth */
    int recompute_block;                    /* [train] recompute = block (the progress' weights) */
    double target_seconds;                  /* [balance] calibrate_seconds: what the whole pass aims to take */
    calibration_time_fn time;
    void *context;                          /* time's */
    void (*agree)(void *bytes, size_t size); /* collective: rank 0's bytes to every rank (NULL: one rank) */
    double (*clock)(void);                  /* seconds, for the progress and the budget */
    FILE *progress;                         /* the progress lines (rank 0's stdout; NULL: none) */
} calibration_timer;

/* Collective: each entry's seconds at full depth (-1 where copies is 0). A model of at most 2 blocks is timed
   as it is, after warm-ups; returns 0. A deeper one is timed on models of 1 block (after warm-ups: they build the
   plans) and of 2 blocks, scaled by calibration_depth_seconds; then the shapes calibration_pick_full_depth picks
   within calibration_full_depth_budget (target_seconds, the seconds spent so far; rank 0 decides) are timed on the
   full model, cheapest first, and their measured seconds replace the scaled ones: checks[] (room for n_entries)
   holds the scaled and the measured seconds of each; returns how many. A call without warm-ups runs its first
   micro-batch once more before it, untimed (a model's first call pays one-off costs). Progress: a line saying what
   is timed, then calibration_progress_text lines at most every CALIBRATION_PROGRESS_EVERY seconds, their time left
   weighed by seed[i] (the deck's FLOP-seeded seconds of entry i's micro-batch at full depth, 0 where not timed) and
   calibration_depth_work, at the rate measured so far, and a line saying which shapes run at full depth. */
int calibration_time(const calibration_timer *timer, calibration_entry *entries, int n_entries, const double *seed,
                     calibration_check *checks);

#endif
