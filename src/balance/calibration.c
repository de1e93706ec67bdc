/* calibration.c — reading and writing the start-up calibration's cached timings (calibration.txt in the run folder). */
#include "config.h"
#include "balance/calibration.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* The file, line by line:
     # aldit start-up calibration: forward + backward seconds of packed micro-batches (delete to time again)
     key <calibration_key's text>
     shapes <n>
     <frames> <height> <width> <text_len> <copies> <seconds>     (n lines, in the caller's order)
   Lines are at most CALIBRATION_LINE_MAX bytes. */
enum { CALIBRATION_LINE_MAX = CALIBRATION_KEY_MAX + 64 };
static const char header_line[] =
    "# aldit start-up calibration: forward + backward seconds of packed micro-batches (delete to time again)\n";

void calibration_key(const deck *config, const char *device, int ranks_per_gpu, char *key, size_t key_size)
{
    snprintf(key, key_size,
             "aldit %s | %s | %d rank(s) per GPU | model dim %d ffn %d heads %d layers %d in %d out %d "
             "patch %dx%dx%d text %d x %d freq %d qk_norm %d cross_attn_norm %d | recompute %s attention %s | "
             "packed %d",
             PACKAGE_VERSION, device, ranks_per_gpu, config->model.dim, config->model.ffn_dim,
             config->model.num_heads, config->model.num_layers, config->model.in_dim, config->model.out_dim,
             config->model.patch_t, config->model.patch_h, config->model.patch_w, config->model.text_len,
             config->model.text_dim, config->model.freq_dim, config->model.qk_norm, config->model.cross_attn_norm,
             deck_recompute_name(config->train.recompute), deck_attention_name(config->train.attention),
             config->balance.calibrate_packed);
    for (char *c = key; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' '; /* one line in the file */
}

/* Read the next line without its newline into `line` (counting it in *line_number); 0 at the end of the
   file or for a line longer than the buffer. */
static int read_line(FILE *file, char *line, size_t line_size, int *line_number)
{
    ++*line_number;
    if (!fgets(line, (int)line_size, file)) return 0;
    const size_t length = strlen(line);
    if (length > 0 && line[length - 1] == '\n') line[length - 1] = '\0';
    else if (!feof(file)) return 0;
    return 1;
}

/* calibration_load's reading of an open file: the cached seconds of each entry into seconds[]. */
static calibration_cache_status parse_cache(FILE *file, const char *path, const char *key,
                                            const calibration_entry *entries, int n_entries, double *seconds)
{
    char line[CALIBRATION_LINE_MAX], extra;
    int line_number = 0;
    if (!read_line(file, line, sizeof line, &line_number) || strncmp(line, header_line, strlen(header_line) - 1) != 0) {
        aldit_warn("%s:%d: not an aldit calibration file (delete it to time the shapes again)", path, line_number);
        return CALIBRATION_CACHE_CORRUPT;
    }
    if (!read_line(file, line, sizeof line, &line_number) || strncmp(line, "key ", 4) != 0) {
        aldit_warn("%s:%d: expected the line \"key ...\"", path, line_number);
        return CALIBRATION_CACHE_CORRUPT;
    }
    if (strcmp(line + 4, key) != 0) return CALIBRATION_CACHE_STALE;
    int n_cached = -1;
    if (!read_line(file, line, sizeof line, &line_number) || sscanf(line, "shapes %d %c", &n_cached, &extra) != 1 ||
        n_cached < 0) {
        aldit_warn("%s:%d: expected the line \"shapes N\"", path, line_number);
        return CALIBRATION_CACHE_CORRUPT;
    }
    if (n_cached != n_entries) return CALIBRATION_CACHE_STALE;
    for (int i = 0; i < n_entries; i++) {
        calibration_entry cached;
        if (!read_line(file, line, sizeof line, &line_number) ||
            sscanf(line, "%d %d %d %d %d %lf %c", &cached.frames, &cached.height, &cached.width, &cached.text_len,
                   &cached.copies, &cached.seconds, &extra) != 6) {
            aldit_warn("%s:%d: expected \"frames height width text_len copies seconds\" (shape %d of %d)", path,
                       line_number, i + 1, n_entries);
            return CALIBRATION_CACHE_CORRUPT;
        }
        if (cached.copies < 0 || !isfinite(cached.seconds) || (cached.copies > 0 && !(cached.seconds > 0))) {
            aldit_warn("%s:%d: %d copies timed at %g s is not a timing", path, line_number, cached.copies,
                       cached.seconds);
            return CALIBRATION_CACHE_CORRUPT;
        }
        const calibration_entry *want = &entries[i];
        if (cached.frames != want->frames || cached.height != want->height || cached.width != want->width ||
            cached.text_len != want->text_len || cached.copies != want->copies)
            return CALIBRATION_CACHE_STALE;
        seconds[i] = cached.copies > 0 ? cached.seconds : -1.0;
    }
    if (fgetc(file) != EOF) {
        aldit_warn("%s:%d: more lines than the %d shapes it announces", path, line_number + 1, n_entries);
        return CALIBRATION_CACHE_CORRUPT;
    }
    return CALIBRATION_CACHE_HIT;
}

calibration_cache_status calibration_load(const char *path, const char *key, calibration_entry *entries,
                                          int n_entries)
{
    FILE *file = fopen(path, "r");
    if (!file) {
        if (errno == ENOENT) return CALIBRATION_CACHE_MISSING;
        aldit_warn("%s: cannot read the cached calibration (%s); timing the shapes again", path, strerror(errno));
        return CALIBRATION_CACHE_CORRUPT;
    }
    /* all or nothing: the entries change only on a hit */
    double *seconds = xmalloc((size_t)(n_entries > 0 ? n_entries : 1) * sizeof *seconds);
    const calibration_cache_status status = parse_cache(file, path, key, entries, n_entries, seconds);
    if (status == CALIBRATION_CACHE_HIT)
        for (int i = 0; i < n_entries; i++) entries[i].seconds = seconds[i];
    free(seconds);
    fclose(file);
    return status;
}

int calibration_save(const char *path, const char *key, const calibration_entry *entries, int n_entries)
{
    const size_t tmp_size = strlen(path) + sizeof ".tmp";
    char *tmp_path = xmalloc(tmp_size);
    snprintf(tmp_path, tmp_size, "%s.tmp", path);
    FILE *file = fopen(tmp_path, "w");
    if (!file) {
        aldit_warn("cannot write the calibration cache %s: %s (the run goes on without it)", tmp_path,
                   strerror(errno));
        free(tmp_path);
        return -1;
    }
    int failed = fputs(header_line, file) < 0 || fprintf(file, "key %s\nshapes %d\n", key, n_entries) < 0;
    for (int i = 0; i < n_entries && !failed; i++) {
        const calibration_entry *e = &entries[i];
        failed = fprintf(file, "%d %d %d %d %d %.17g\n", e->frames, e->height, e->width, e->text_len, e->copies,
                         e->copies > 0 ? e->seconds : -1.0) < 0;
    }
    failed |= fflush(file) != 0;
    failed |= fclose(file) != 0;
    if (failed || rename(tmp_path, path) != 0) {
        aldit_warn("cannot write the calibration cache %s: %s (the run goes on without it)", path, strerror(errno));
        remove(tmp_path);
        free(tmp_path);
        return -1;
    }
    free(tmp_path);
    return 0;
}
