/* calibration.c — the start-up calibration's cached timings (calibration.txt in the run folder), its scaling from models of one and two blocks to the model's depth, and its progress text. */
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

/* ---- scaling, checks, progress -------------------------------------------------------------------------- */

double calibration_depth_seconds(double one_block, double two_blocks, int num_layers)
{
    if (!(one_block > 0.0) || !(two_blocks > 0.0) || num_layers < 1) return -1.0;
    const double per_block = two_blocks > one_block ? two_blocks - one_block : 0.0;
    return one_block + (num_layers - 1) * per_block;
}

double calibration_depth_work(int layers, int recompute_block)
{
    if (layers < 1) return 0.0;
    return 3.0 * layers + (recompute_block ? layers - 1 : 0);
}

/* The timed shape with the most predicted seconds within `limit`, other than `skip` (-1 when none). */
static int costliest_within(const double *predicted, int n, double limit, int skip)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (i != skip && predicted[i] > 0.0 && predicted[i] <= limit && (best < 0 || predicted[i] > predicted[best]))
            best = i;
    return best;
}

int calibration_pick_checks(const double *predicted, int n, double budget_seconds, int *picked)
{
    int cheapest = -1;
    for (int i = 0; i < n; i++)
        if (predicted[i] > 0.0 && (cheapest < 0 || predicted[i] < predicted[cheapest])) cheapest = i;
    if (cheapest < 0) return 0;
    picked[0] = cheapest;
    int n_picked = 1;
    if (CALIBRATION_MAX_CHECKS > 1) {
        int other = costliest_within(predicted, n, budget_seconds - predicted[cheapest], cheapest);
        if (other >= 0) picked[n_picked++] = other;
    }
    return n_picked;
}

double calibration_seconds_left(double elapsed, double done_work, double left_work)
{
    if (!(done_work > 0.0)) return -1.0;
    return elapsed * (left_work > 0.0 ? left_work : 0.0) / done_work;
}

int calibration_line_due(double now, double last_line, double every) { return now - last_line >= every; }

void calibration_progress_text(char *text, size_t text_size, int check, int k, int n, const calibration_entry *shape,
                               int layers, double seconds_left)
{
    char left[48];
    if (seconds_left < 0.0) snprintf(left, sizeof left, "time left unknown");
    else snprintf(left, sizeof left, "about %.0f s left", ceil(seconds_left));
    snprintf(text, text_size, "calibration: %s %d/%d (%d x %d x %d, %d per micro-batch) %s %d block%s, %s",
             check ? "check" : "shape", k, n, (int)shape->frames, (int)shape->height, (int)shape->width,
             shape->copies, check ? "at" : "on", layers, layers == 1 ? "" : "s", left);
}

double calibration_misfit(double predicted, double measured)
{
    return measured > 0.0 ? predicted / measured - 1.0 : 0.0;
}

double calibration_misfit_text(char *text, size_t text_size, const calibration_check *checks, int n_checks,
                               const calibration_entry *entries, int layers)
{
    double worst = 0.0;
    size_t used = (size_t)snprintf(text, text_size, "misfit at %d blocks", layers);
    for (int c = 0; c < n_checks; c++) {
        const double misfit = calibration_misfit(checks[c].predicted, checks[c].measured);
        if (fabs(misfit) > worst) worst = fabs(misfit);
        const calibration_entry *e = &entries[checks[c].shape];
        if (used < text_size)
            used += (size_t)snprintf(text + used, text_size - used, "%s %+.1f%% (%d x %d x %d, %d per micro-batch)",
                                     c == 0 ? "" : ",", 100.0 * misfit, (int)e->frames, (int)e->height, (int)e->width,
                                     e->copies);
    }
    if (used < text_size) snprintf(text + used, text_size - used, "; worst %.1f%%", 100.0 * worst);
    return worst;
}

/* ---- the whole timing pass -------------------------------------------------------------------------------- */

/* A calibration_time's progress: the work done and left in units of each shape's seed seconds at full depth,
   times calibration_depth_work of the model timed over that of the whole depth (the first call's warm-ups
   double its work). */
typedef struct {
    const calibration_timer *timer;
    const calibration_entry *entries;
    int n_entries;
    const double *seed;
    int n_passes;                    /* 1: timed at full depth; 3: on 1 and 2 blocks, then the checks */
    int pass;                        /* the call running: 0, 1 or 2 (the checks) */
    const calibration_check *checks; /* pass 2 */
    int n_checks;
    double started, last_line, done_work;
} calibration_watch;

static int pass_layers(const calibration_watch *w, int pass)
{
    return w->n_passes == 1 || pass == 2 ? w->timer->num_layers : pass + 1;
}

static double pass_work(const calibration_watch *w, int pass, int i)
{
    const int recompute = w->timer->recompute_block;
    const double depth = calibration_depth_work(pass_layers(w, pass), recompute) /
                         calibration_depth_work(w->timer->num_layers, recompute);
    return (pass == 0 ? 2.0 : 1.0) * w->seed[i] * depth;
}

/* Seconds left after `position` of the current call: passes 0 and 1 at the rate of the work done so far, with the
   checks as calibration_pick_checks would pick them at that rate; the checks by their scaled seconds. */
static double watch_seconds_left(const calibration_watch *w, int position, double elapsed)
{
    double left = 0.0;
    if (w->pass == 2) {
        for (int c = position + 1; c < w->n_checks; c++) left += w->checks[c].predicted;
        return left;
    }
    double left_work = 0.0;
    for (int i = position + 1; i < w->n_entries; i++) left_work += pass_work(w, w->pass, i);
    if (w->pass == 0 && w->n_passes == 3)
        for (int i = 0; i < w->n_entries; i++) left_work += pass_work(w, 1, i);
    left = calibration_seconds_left(elapsed, w->done_work, left_work);
    if (left >= 0.0 && w->n_passes == 3) {
        double *predicted = xmalloc((size_t)w->n_entries * sizeof *predicted);
        for (int i = 0; i < w->n_entries; i++)
            predicted[i] = w->seed[i] > 0.0 ? w->seed[i] * elapsed / w->done_work : -1.0;
        int picked[CALIBRATION_MAX_CHECKS];
        const int n_picked = calibration_pick_checks(predicted, w->n_entries, CALIBRATION_CHECK_SECONDS, picked);
        for (int c = 0; c < n_picked; c++) left += predicted[picked[c]];
        free(predicted);
    }
    return left;
}

/* calibration_progress_fn: count the shape done; print a line when one is due (not after the last: the caller's
   final line follows). */
static void watch_progress(void *context, int position)
{
    calibration_watch *w = context;
    const int check = w->pass == 2;
    if (!check) w->done_work += pass_work(w, w->pass, position);
    const int last_pass = check || w->n_passes == 1;
    if (!w->timer->progress || (last_pass && position + 1 == (check ? w->n_checks : w->n_entries))) return;
    const double now = w->timer->clock();
    if (!calibration_line_due(now, w->last_line, CALIBRATION_PROGRESS_EVERY)) return;
    w->last_line = now;
    char text[256];
    calibration_progress_text(text, sizeof text, check, position + 1, check ? w->n_checks : w->n_entries,
                              &w->entries[check ? w->checks[position].shape : position], pass_layers(w, w->pass),
                              watch_seconds_left(w, position, now - w->started));
    fprintf(w->timer->progress, "%s\n", text);
    fflush(w->timer->progress);
}

static void announce(const calibration_timer *timer, int n_entries)
{
    if (!timer->progress) return;
    const int layers = timer->num_layers;
    if (layers <= 2) fprintf(timer->progress, "calibration: timing %d sample shapes at %d block%s\n", n_entries, layers,
                             layers == 1 ? "" : "s");
    else fprintf(timer->progress, "calibration: timing %d sample shapes on models of 1 and 2 blocks, scaled to %d "
                 "blocks, then up to %d of them at %d blocks to check\n", n_entries, layers, CALIBRATION_MAX_CHECKS,
                 layers);
    fflush(timer->progress);
}

int calibration_time(const calibration_timer *timer, calibration_entry *entries, int n_entries, const double *seed,
                     calibration_check *checks)
{
    const int num_layers = timer->num_layers;
    calibration_watch w = {.timer = timer, .entries = entries, .n_entries = n_entries, .seed = seed,
                           .n_passes = num_layers > 2 ? 3 : 1};
    const size_t n_bytes = (size_t)(n_entries > 0 ? n_entries : 1) * sizeof(double);
    int *all = xmalloc((size_t)(n_entries > 0 ? n_entries : 1) * sizeof *all);
    double *one = xmalloc(n_bytes), *two = xmalloc(n_bytes);
    for (int i = 0; i < n_entries; i++) all[i] = i;
    announce(timer, n_entries);
    w.started = w.last_line = timer->clock();
    timer->time(timer->context, pass_layers(&w, 0), all, n_entries, 1, one, watch_progress, &w);
    int n_checks = 0;
    if (w.n_passes == 1) {
        for (int i = 0; i < n_entries; i++) entries[i].seconds = entries[i].copies > 0 ? one[i] : -1.0;
    } else {
        w.pass = 1;
        timer->time(timer->context, 2, all, n_entries, 0, two, watch_progress, &w);
        for (int i = 0; i < n_entries; i++)
            entries[i].seconds = entries[i].copies > 0 ? calibration_depth_seconds(one[i], two[i], num_layers) : -1.0;
        for (int i = 0; i < n_entries; i++) one[i] = entries[i].seconds; /* the scaled seconds */
        int picked[CALIBRATION_MAX_CHECKS] = {0};
        n_checks = calibration_pick_checks(one, n_entries, CALIBRATION_CHECK_SECONDS, picked);
        if (timer->agree) { /* rank 0 decides: every rank times the same micro-batches */
            timer->agree(&n_checks, sizeof n_checks);
            timer->agree(picked, sizeof picked);
        }
        double measured[CALIBRATION_MAX_CHECKS];
        for (int c = 0; c < n_checks; c++) checks[c] = (calibration_check){picked[c], one[picked[c]], -1.0};
        w.pass = 2;
        w.checks = checks;
        w.n_checks = n_checks;
        if (n_checks > 0) timer->time(timer->context, num_layers, picked, n_checks, 0, measured, watch_progress, &w);
        for (int c = 0; c < n_checks; c++) {
            checks[c].measured = measured[c];
            if (measured[c] > 0.0) entries[picked[c]].seconds = measured[c];
        }
    }
    free(all);
    free(one);
    free(two);
    return n_checks;
}
