/* calibration.h — the GPU start-up calibration's timings, kept in the run folder (calibration.txt) so that a restarted or requeued run on the same device and model skips the timing pass. */
#ifndef ALDIT_CALIBRATION_H
#define ALDIT_CALIBRATION_H

#include <stddef.h>
#include <stdint.h>

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

#endif
