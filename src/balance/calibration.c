/* calibration.c — the start-up calibration's cached timings (calibration.txt in the run folder), its scaling from models of one and two blocks to the model's depth, the choice of the shapes timed at full depth, and its progress text. */
#include "config.h"
#include "balance/calibration.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
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
             "packed %d target %g s | family %s precision %s | timed on random weights and data",
             PACKAGE_VERSION, device, ranks_per_gpu, config->model.dim, config->model.ffn_dim,
             config->model.num_heads, config->model.num_layers, config->model.in_dim, config->model.out_dim,
             config->model.patch_t, config->model.patch_h, config->model.patch_w, config->model.text_len,
             config->model.text_dim, config->model.freq_dim, config->model.qk_norm, config->model.cross_attn_norm,
             deck_recompute_name(config->train.recompute), deck_attention_name(config->train.attention),
             config->balance.calibrate_packed, config->balance.calibrate_seconds, deck_family_name(config->model.family),
             config->train.precision == PRECISION_FP8 ? "fp8" : "bf16");
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

int calibration_repeat_due(int n_timed, double timed_seconds, double repeat_seconds)
{
    return n_timed >= 1 && n_timed < CALIBRATION_MAX_REPEATS && timed_seconds < repeat_seconds;
}

double calibration_depth_work(int layers, int recompute_block)
{
    if (layers < 1) return 0.0;
    return 3.0 * layers + (recompute_block ? layers - 1 : 0);
}

double calibration_full_depth_budget(double target_seconds, double elapsed)
{
    const double budget = fmin(CALIBRATION_FULL_DEPTH_SHARE * target_seconds,
                               CALIBRATION_FULL_DEPTH_REST * (target_seconds - elapsed));
    return budget > 0.0 ? budget : 0.0;
}

/* The unpicked timed shape with the least predicted seconds (-1 when none). */
static int cheapest_left(const double *predicted, int n, const int *picked)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!picked[i] && predicted[i] > 0.0 && (best < 0 || predicted[i] < predicted[best])) best = i;
    return best;
}

/* The unpicked timed shape with the most predicted seconds within `limit` (-1 when none). */
static int costliest_within(const double *predicted, int n, double limit, const int *picked)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!picked[i] && predicted[i] > 0.0 && predicted[i] <= limit && (best < 0 || predicted[i] > predicted[best]))
            best = i;
    return best;
}

int calibration_pick_full_depth(const double *predicted, int n, double budget_seconds, int *role, int *order)
{
    int *picked = xcalloc((size_t)(n > 0 ? n : 1), sizeof *picked);
    for (int i = 0; i < n; i++) role[i] = CALIBRATION_SCALED;
    int n_picked = 0;
    double total = 0.0;
    for (;;) { /* the cheap ones */
        const int next = cheapest_left(predicted, n, picked);
        if (next < 0 || (n_picked > 0 && total + predicted[next] > 0.5 * budget_seconds)) break;
        picked[next] = 1, role[next] = CALIBRATION_AT_DEPTH, order[n_picked++] = next;
        total += predicted[next];
    }
    for (int c = 0; c < CALIBRATION_MAX_CHECKS; c++) { /* the checks of the scaled ones */
        const int next = costliest_within(predicted, n, budget_seconds - total, picked);
        if (next < 0) break;
        picked[next] = 1, role[next] = CALIBRATION_CHECK, order[n_picked++] = next;
        total += predicted[next];
    }
    free(picked);
    return n_picked;
}

double calibration_seconds_left(double elapsed, double done_work, double left_work)
{
    if (!(done_work > 0.0)) return -1.0;
    return elapsed * (left_work > 0.0 ? left_work : 0.0) / done_work;
}

int calibration_line_due(double now, double last_line, double every) { return now - last_line >= every; }

void calibration_progress_text(char *text, size_t text_size, int full_depth, int k, int n,
                               const calibration_entry *shape, int layers, double seconds_left)
{
    char left[48];
    if (seconds_left < 0.0) snprintf(left, sizeof left, "time left unknown");
    else snprintf(left, sizeof left, "about %.0f s left", ceil(seconds_left));
    snprintf(text, text_size, "calibration: %s %d/%d (%d x %d x %d, %d per micro-batch) %s %d block%s, %s",
             full_depth ? "full depth" : "shape", k, n, (int)shape->frames, (int)shape->height, (int)shape->width,
             shape->copies, full_depth ? "at" : "on", layers, layers == 1 ? "" : "s", left);
}

double calibration_misfit(double predicted, double measured)
{
    return measured > 0.0 ? predicted / measured - 1.0 : 0.0;
}

int32_t calibration_text_rows(int joint_text, int index, int32_t shortest, int32_t mean, int32_t longest)
{
    if (!joint_text) return mean;
    return index % 2 ? longest : shortest;
}

/* Append to text at *used (a no-op once full). */
static void append(char *text, size_t text_size, size_t *used, const char *format, ...)
{
    if (*used >= text_size) return;
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(text + *used, text_size - *used, format, args);
    va_end(args);
    if (n > 0) *used += (size_t)n;
}

static void append_misfit(char *text, size_t text_size, size_t *used, const calibration_check *check,
                          const calibration_entry *entries)
{
    const calibration_entry *e = &entries[check->shape];
    append(text, text_size, used, "%+.1f%% (%d x %d x %d, %d per micro-batch)",
           100.0 * calibration_misfit(check->predicted, check->measured), (int)e->frames, (int)e->height,
           (int)e->width, e->copies);
}

double calibration_misfit_text(char *text, size_t text_size, const calibration_check *checks, int n_checks,
                               const calibration_entry *entries, int layers, int n_scaled)
{
    double worst = 0.0, worst_cheap = -1.0;
    int n_cheap = 0, n_costly = 0, cheap = -1;
    for (int c = 0; c < n_checks; c++) {
        const double misfit = fabs(calibration_misfit(checks[c].predicted, checks[c].measured));
        if (misfit > worst) worst = misfit;
        if (checks[c].role == CALIBRATION_CHECK) {
            n_costly++;
            continue;
        }
        n_cheap++;
        if (misfit > worst_cheap) worst_cheap = misfit, cheap = c;
    }
    size_t used = 0;
    text[0] = '\0';
    append(text, text_size, &used, "misfit of the scaling at %d blocks: ", layers);
    if (cheap >= 0) {
        append(text, text_size, &used, "worst ");
        append_misfit(text, text_size, &used, &checks[cheap], entries);
        if (n_cheap == 1) append(text, text_size, &used, " of the cheapest shape timed there; ");
        else append(text, text_size, &used, " of the %d cheapest shapes timed there; ", n_cheap);
    }
    if (n_scaled == 0) append(text, text_size, &used, "none scaled");
    else if (n_costly == 0) append(text, text_size, &used, "%d scaled, not checked", n_scaled);
    else {
        append(text, text_size, &used, "checks of the %d scaled: ", n_scaled);
        for (int c = 0, k = 0; c < n_checks; c++)
            if (checks[c].role == CALIBRATION_CHECK) {
                append(text, text_size, &used, k++ ? ", " : "");
                append_misfit(text, text_size, &used, &checks[c], entries);
            }
    }
    append(text, text_size, &used, "; worst %.1f%%", 100.0 * worst);
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
    int deep;             /* 1: on 1 and 2 blocks, then the picked shapes at full depth; 0: at full depth only */
    int pass;             /* the call running: 0 (1 block, or the only one), 1 (2 blocks) or 2 (full depth) */
    const int *which;     /* the call's shapes (indices of entries), n_which of them */
    int n_which;
    int offset;           /* 1 when the call runs a warm-up of which[0] first (its position 0) */
    const double *scaled; /* pass 2: the scaled seconds of each entry */
    double started, last_line, done_work;
} calibration_watch;

static int pass_layers(const calibration_watch *w, int pass)
{
    return !w->deep || pass == 2 ? w->timer->num_layers : pass + 1;
}

static double pass_work(const calibration_watch *w, int pass, int i)
{
    const int recompute = w->timer->recompute_block;
    const double depth = calibration_depth_work(pass_layers(w, pass), recompute) /
                         calibration_depth_work(w->timer->num_layers, recompute);
    return (pass == 0 ? 2.0 : 1.0) * w->seed[i] * depth;
}

/* Predicted seconds of the full-depth pass when it would be decided `elapsed` seconds from the start, with
   the seconds of each shape at full depth taken as its seed seconds at `rate`. */
static double full_depth_seconds(const calibration_watch *w, double rate, double elapsed)
{
    double *predicted = xmalloc((size_t)w->n_entries * sizeof *predicted);
    int *role = xmalloc((size_t)w->n_entries * sizeof *role), *order = xmalloc((size_t)w->n_entries * sizeof *order);
    for (int i = 0; i < w->n_entries; i++) predicted[i] = w->seed[i] > 0.0 ? w->seed[i] * rate : -1.0;
    const int n_picked = calibration_pick_full_depth(
        predicted, w->n_entries, calibration_full_depth_budget(w->timer->target_seconds, elapsed), role, order);
    double seconds = 0.0;
    for (int c = 0; c < n_picked; c++) seconds += predicted[order[c]];
    free(predicted);
    free(role);
    free(order);
    return seconds;
}

/* Seconds left after shape k of the current call: passes 0 and 1 at the rate of the work done so far, with the
   full-depth pass as calibration_pick_full_depth would pick it at that rate; the full-depth pass by the scaled
   seconds of the shapes it has left. */
static double watch_seconds_left(const calibration_watch *w, int k, double elapsed)
{
    double left = 0.0;
    if (w->pass == 2) {
        for (int j = k + 1; j < w->n_which; j++) left += w->scaled[w->which[j]];
        return left;
    }
    double left_work = 0.0;
    for (int j = k + 1; j < w->n_which; j++) left_work += pass_work(w, w->pass, w->which[j]);
    if (w->pass == 0 && w->deep)
        for (int i = 0; i < w->n_entries; i++) left_work += pass_work(w, 1, i);
    left = calibration_seconds_left(elapsed, w->done_work, left_work);
    if (left >= 0.0 && w->deep) left += full_depth_seconds(w, elapsed / w->done_work, elapsed + left);
    return left;
}

/* calibration_progress_fn: count the shape done; print a line when one is due (not after the last: the caller's
   final line follows). A call's warm-up (position 0 when offset is 1) counts for nothing. */
static void watch_progress(void *context, int position)
{
    calibration_watch *w = context;
    const int k = position - w->offset;
    if (k < 0) return;
    const int full_depth = w->pass == 2;
    if (!full_depth) w->done_work += pass_work(w, w->pass, w->which[k]);
    const int last_pass = full_depth || !w->deep;
    if (!w->timer->progress || (last_pass && k + 1 == w->n_which)) return;
    const double now = w->timer->clock();
    if (!calibration_line_due(now, w->last_line, CALIBRATION_PROGRESS_EVERY)) return;
    w->last_line = now;
    char text[256];
    calibration_progress_text(text, sizeof text, full_depth && w->deep, k + 1, w->n_which, &w->entries[w->which[k]],
                              pass_layers(w, w->pass), watch_seconds_left(w, k, now - w->started));
    fprintf(w->timer->progress, "%s\n", text);
    fflush(w->timer->progress);
}

/* One timing call of pass w->pass: the n shapes of which[] on a model of that pass' blocks, their seconds into
   seconds[]. With warm_up 0 the first micro-batch runs once more before them, untimed. */
static void time_call(calibration_watch *w, int warm_up, const int *which, int n, double *seconds)
{
    if (n < 1) return;
    const calibration_timer *timer = w->timer;
    w->which = which;
    w->n_which = n;
    w->offset = warm_up ? 0 : 1;
    int *list = xmalloc((size_t)(n + 1) * sizeof *list);
    double *timed = xmalloc((size_t)(n + 1) * sizeof *timed);
    list[0] = which[0];
    memcpy(list + w->offset, which, (size_t)n * sizeof *list);
    const double repeat = w->deep && w->pass < 2 ? CALIBRATION_REPEAT_SECONDS : 0.0; /* the passes that are scaled */
    timer->time(timer->context, pass_layers(w, w->pass), list, n + w->offset, warm_up, repeat, timed, watch_progress, w);
    memcpy(seconds, timed + w->offset, (size_t)n * sizeof *seconds);
    free(list);
    free(timed);
}

static void announce(const calibration_timer *timer, int n_entries)
{
    if (!timer->progress) return;
    const int layers = timer->num_layers;
    if (layers <= 2) fprintf(timer->progress, "calibration: timing %d sample shapes at %d block%s\n", n_entries, layers,
                             layers == 1 ? "" : "s");
    else fprintf(timer->progress, "calibration: timing %d sample shapes on models of 1 and 2 blocks, then the "
                 "cheapest and up to %d checks at %d blocks within the time target (%.0f s), the others scaled to "
                 "%d blocks\n", n_entries, CALIBRATION_MAX_CHECKS, layers, timer->target_seconds, layers);
    fflush(timer->progress);
}

/* The line that says which shapes the full-depth pass times. */
static void announce_full_depth(const calibration_timer *timer, const int *role, const double *scaled, int n_entries)
{
    if (!timer->progress) return;
    int n_cheap = 0, n_checks = 0, n_scaled = 0;
    double seconds = 0.0;
    for (int i = 0; i < n_entries; i++) {
        if (!(scaled[i] > 0.0)) continue;
        n_cheap += role[i] == CALIBRATION_AT_DEPTH;
        n_checks += role[i] == CALIBRATION_CHECK;
        n_scaled += role[i] == CALIBRATION_SCALED;
        if (role[i] != CALIBRATION_SCALED) seconds += scaled[i];
    }
    char cheap[32] = "the cheapest", costly[32] = "";
    if (n_cheap != 1) snprintf(cheap, sizeof cheap, "the %d cheapest", n_cheap);
    if (n_checks > 0) snprintf(costly, sizeof costly, " and %d check%s", n_checks, n_checks == 1 ? "" : "s");
    fprintf(timer->progress, "calibration: %d shape%s at %d blocks (%s%s, about %.0f s), %d scaled\n",
            n_cheap + n_checks, n_cheap + n_checks == 1 ? "" : "s", timer->num_layers, cheap, costly, ceil(seconds),
            n_scaled);
    fflush(timer->progress);
}

int calibration_time(const calibration_timer *timer, calibration_entry *entries, int n_entries, const double *seed,
                     calibration_check *checks)
{
    const int num_layers = timer->num_layers;
    calibration_watch w = {.timer = timer, .entries = entries, .n_entries = n_entries, .seed = seed,
                           .deep = num_layers > 2};
    const size_t n_room = (size_t)(n_entries > 0 ? n_entries : 1);
    int *all = xmalloc(n_room * sizeof *all), *role = xmalloc(n_room * sizeof *role),
        *order = xmalloc(n_room * sizeof *order);
    double *one = xmalloc(n_room * sizeof *one), *two = xmalloc(n_room * sizeof *two),
           *scaled = xmalloc(n_room * sizeof *scaled);
    for (int i = 0; i < n_entries; i++) all[i] = i;
    announce(timer, n_entries);
    w.started = w.last_line = timer->clock();
    time_call(&w, 1, all, n_entries, one);
    int n_full = 0;
    if (!w.deep) {
        for (int i = 0; i < n_entries; i++) entries[i].seconds = entries[i].copies > 0 ? one[i] : -1.0;
    } else {
        w.pass = 1;
        time_call(&w, 0, all, n_entries, two);
        for (int i = 0; i < n_entries; i++) {
            scaled[i] = entries[i].copies > 0 ? calibration_depth_seconds(one[i], two[i], num_layers) : -1.0;
            entries[i].seconds = scaled[i];
        }
        n_full = calibration_pick_full_depth(
            scaled, n_entries, calibration_full_depth_budget(timer->target_seconds, timer->clock() - w.started), role,
            order);
        if (timer->agree) { /* rank 0 decides: every rank times the same micro-batches */
            timer->agree(&n_full, sizeof n_full);
            timer->agree(role, n_room * sizeof *role);
            timer->agree(order, n_room * sizeof *order);
        }
        announce_full_depth(timer, role, scaled, n_entries);
        w.pass = 2;
        w.scaled = scaled;
        time_call(&w, 0, order, n_full, one); /* one[c]: the measured seconds of order[c] */
        for (int c = 0; c < n_full; c++) {
            const int i = order[c];
            checks[c] = (calibration_check){i, (calibration_role)role[i], scaled[i], one[c]};
            if (one[c] > 0.0) entries[i].seconds = one[c];
        }
    }
    free(all);
    free(role);
    free(order);
    free(one);
    free(two);
    free(scaled);
    return n_full;
}
