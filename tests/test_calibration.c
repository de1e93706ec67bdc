/* test_calibration.c — cmocka tests of the start-up calibration: the cache (its key, round trips, stale and corrupt files, atomic writes), the scaling from models of one and two blocks to the depth, the full-depth checks and the progress lines. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "balance/calibration.h"
#include "deck/deck.h"

enum { N_SHAPES = 3 };

/* Three shapes as calibrate_on_gpu makes them: two timed, one beyond the capacity. */
static void timed_entries(calibration_entry *entries)
{
    entries[0] = (calibration_entry){.frames = 1, .height = 32, .width = 32, .text_len = 48, .copies = 32, .seconds = 0.125};
    entries[1] = (calibration_entry){.frames = 21, .height = 60, .width = 104, .text_len = 64, .copies = 1,
                                     .seconds = 1.0 / 3.0};
    entries[2] = (calibration_entry){.frames = 33, .height = 96, .width = 96, .text_len = 64, .copies = 0, .seconds = -1.0};
}

/* The shapes and copies of `entries` with their seconds unknown, as the caller asks for them. */
static void asked_entries(calibration_entry *entries)
{
    timed_entries(entries);
    for (int i = 0; i < N_SHAPES; i++) entries[i].seconds = 0.0;
}

/* Each file test's fixture: a scratch folder (mkdtemp) with the cache's path in it, the entries as
   timed and as asked for. */
typedef struct {
    char folder[64], path[128];
    calibration_entry timed[N_SHAPES], asked[N_SHAPES];
} scratch;

static int make_scratch(void **state)
{
    scratch *s = calloc(1, sizeof *s);
    if (!s) return -1;
    snprintf(s->folder, sizeof s->folder, "/tmp/aldit_calibration_XXXXXX");
    if (!mkdtemp(s->folder)) return -1;
    snprintf(s->path, sizeof s->path, "%s/%s", s->folder, CALIBRATION_FILE);
    timed_entries(s->timed);
    asked_entries(s->asked);
    *state = s;
    return 0;
}

static int remove_scratch(void **state)
{
    scratch *s = *state;
    char tmp_path[160];
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", s->path);
    remove(s->path);
    remove(tmp_path);
    rmdir(s->folder);
    free(s);
    return 0;
}

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    assert_true(fputs(text, file) >= 0);
    assert_int_equal(fclose(file), 0);
}

static void test_key_names_what_the_timings_depend_on(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    char key[CALIBRATION_KEY_MAX], same[CALIBRATION_KEY_MAX], other[CALIBRATION_KEY_MAX];
    calibration_key(&config, "NVIDIA H200, 132 SMs", 1, key, sizeof key);
    calibration_key(&config, "NVIDIA H200, 132 SMs", 1, same, sizeof same);
    assert_string_equal(key, same);
    assert_null(strchr(key, '\n'));
    assert_non_null(strstr(key, "NVIDIA H200"));
    calibration_key(&config, "NVIDIA H100, 132 SMs", 1, other, sizeof other);
    assert_string_not_equal(key, other);
    calibration_key(&config, "NVIDIA H200, 132 SMs", 2, other, sizeof other);
    assert_string_not_equal(key, other);
    deck changed = config;
    changed.model.num_layers += 1;
    calibration_key(&changed, "NVIDIA H200, 132 SMs", 1, other, sizeof other);
    assert_string_not_equal(key, other);
    changed = config;
    changed.train.recompute = RECOMPUTE_BLOCK;
    calibration_key(&changed, "NVIDIA H200, 132 SMs", 1, other, sizeof other);
    assert_string_not_equal(key, other);
    changed = config;
    changed.balance.calibrate_packed = !config.balance.calibrate_packed;
    calibration_key(&changed, "NVIDIA H200, 132 SMs", 1, other, sizeof other);
    assert_string_not_equal(key, other);
    changed = config; /* what the timings do not depend on leaves the key alone */
    changed.train.lr *= 2;
    changed.run.seed += 1;
    calibration_key(&changed, "NVIDIA H200, 132 SMs", 1, other, sizeof other);
    assert_string_equal(key, other);
}

static void test_round_trip(void **state)
{
    scratch *s = *state;
    calibration_entry *timed = s->timed, *asked = s->asked;
    assert_int_equal(calibration_load(s->path, "k", asked, N_SHAPES), CALIBRATION_CACHE_MISSING);
    assert_int_equal(calibration_save(s->path, "k", timed, N_SHAPES), 0);
    char tmp_path[160];
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", s->path);
    assert_int_equal(access(tmp_path, F_OK), -1); /* renamed into place */
    assert_int_equal(calibration_load(s->path, "k", asked, N_SHAPES), CALIBRATION_CACHE_HIT);
    for (int i = 0; i < N_SHAPES; i++) {
        assert_int_equal(asked[i].copies, timed[i].copies);
        assert_true(asked[i].seconds == timed[i].seconds); /* %.17g: the same double back */
    }
    /* saving again replaces the file */
    timed[0].seconds = 0.25;
    assert_int_equal(calibration_save(s->path, "k", timed, N_SHAPES), 0);
    assert_int_equal(calibration_load(s->path, "k", asked, N_SHAPES), CALIBRATION_CACHE_HIT);
    assert_true(asked[0].seconds == 0.25);
}

static void test_stale_cache_is_not_used(void **state)
{
    scratch *s = *state;
    calibration_entry *asked = s->asked;
    assert_int_equal(calibration_save(s->path, "key of one device", s->timed, N_SHAPES), 0);
    assert_int_equal(calibration_load(s->path, "key of another", asked, N_SHAPES), CALIBRATION_CACHE_STALE);
    asked_entries(asked);
    assert_int_equal(calibration_load(s->path, "key of one device", asked, N_SHAPES - 1), CALIBRATION_CACHE_STALE);
    asked_entries(asked);
    asked[0].copies = 16; /* another memory budget packs other micro-batches */
    assert_int_equal(calibration_load(s->path, "key of one device", asked, N_SHAPES), CALIBRATION_CACHE_STALE);
    asked_entries(asked);
    asked[1].width = 112;
    assert_int_equal(calibration_load(s->path, "key of one device", asked, N_SHAPES), CALIBRATION_CACHE_STALE);
    for (int i = 0; i < N_SHAPES; i++) assert_true(asked[i].seconds == 0.0); /* nothing filled in */
}

static void test_corrupt_cache_is_reported(void **state)
{
    scratch *s = *state;
    const char *path = s->path;
    calibration_entry *asked = s->asked;
    static const char header[] =
        "# aldit start-up calibration: forward + backward seconds of packed micro-batches (delete to time again)\n";
    const char *bodies[] = {
        "not a calibration file\n",
        "key k\nshapes 3\n1 32 32 48 32 0.125\n21 60 104 64 1 0.333\n",              /* truncated */
        "key k\nshapes 3\n1 32 32 48 32 0.125\n21 60 104 64 1 x\n33 96 96 64 0 -1\n",  /* not a number */
        "key k\nshapes 3\n1 32 32 48 32 -0.5\n21 60 104 64 1 0.333\n33 96 96 64 0 -1\n", /* negative time */
        "key k\nshapes 3\n1 32 32 48 32 0.125\n21 60 104 64 1 0.333\n33 96 96 64 0 -1\nextra\n",
        "key k\nshapes three\n",
        "nokey\n",
    };
    for (size_t b = 0; b < sizeof bodies / sizeof *bodies; b++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", b == 0 ? "" : header, bodies[b]);
        write_text(path, text);
        asked_entries(asked);
        assert_int_equal(calibration_load(path, "k", asked, N_SHAPES), CALIBRATION_CACHE_CORRUPT);
        for (int i = 0; i < N_SHAPES; i++) assert_true(asked[i].seconds == 0.0);
    }
    /* the same lines, whole and well formed, are a hit */
    write_text(path, "# aldit start-up calibration: forward + backward seconds of packed micro-batches (delete to time again)\n"
                     "key k\nshapes 3\n1 32 32 48 32 0.125\n21 60 104 64 1 0.5\n33 96 96 64 0 -1\n");
    asked_entries(asked);
    assert_int_equal(calibration_load(path, "k", asked, N_SHAPES), CALIBRATION_CACHE_HIT);
    assert_true(asked[1].seconds == 0.5 && asked[2].seconds == -1.0);
}

static void test_unwritable_folder_is_a_warning(void **state)
{
    (void)state;
    calibration_entry timed[N_SHAPES];
    timed_entries(timed);
    assert_int_equal(calibration_save("/nonexistent-aldit-folder/" CALIBRATION_FILE, "k", timed, N_SHAPES), -1);
}

/* ---- scaling, checks, progress ---- */

static void test_depth_scaling(void **state)
{
    (void)state;
    /* a model of L blocks that takes E + L B + (L - 1) R (R: a block's re-run forward, never the last block's) */
    const double fixed = 0.04, block = 0.3, rerun = 0.1;
    const double one = fixed + block, two = fixed + 2 * block + rerun;
    for (int layers = 1; layers <= 40; layers++)
        assert_float_equal(calibration_depth_seconds(one, two, layers), fixed + layers * block + (layers - 1) * rerun,
                           1e-12);
    assert_float_equal(calibration_depth_seconds(0.3, 0.5, 30), 0.3 + 29 * 0.2, 1e-12);
    assert_true(calibration_depth_seconds(0.3, 0.5, 1) == 0.3);
    assert_float_equal(calibration_depth_seconds(0.3, 0.5, 2), 0.5, 1e-15);
    assert_true(calibration_depth_seconds(0.3, 0.29, 30) == 0.3); /* noise: no negative block */
    assert_true(calibration_depth_seconds(-1.0, 0.5, 30) == -1.0);
    assert_true(calibration_depth_seconds(0.3, 0.0, 30) == -1.0);
    assert_true(calibration_depth_seconds(0.3, 0.5, 0) == -1.0);
    assert_true(calibration_depth_work(1, 0) == 3.0 && calibration_depth_work(1, 1) == 3.0);
    assert_true(calibration_depth_work(2, 1) == 7.0 && calibration_depth_work(30, 1) == 119.0);
    assert_true(calibration_depth_work(30, 0) == 90.0 && calibration_depth_work(0, 1) == 0.0);
}

static void test_pick_checks(void **state)
{
    (void)state;
    int picked[CALIBRATION_MAX_CHECKS];
    const double predicted[] = {0.2, -1.0, 3.0, 12.0, 6.0, 0.5};
    assert_int_equal(calibration_pick_checks(predicted, 6, 10.0, picked), 2);
    assert_int_equal(picked[0], 0); /* the cheapest */
    assert_int_equal(picked[1], 4); /* the costliest in the 9.8 s left */
    assert_int_equal(calibration_pick_checks(predicted, 6, 3.2, picked), 2);
    assert_int_equal(picked[1], 2);
    assert_int_equal(calibration_pick_checks(predicted, 6, 0.1, picked), 1); /* the cheapest whatever it costs */
    assert_int_equal(picked[0], 0);
    const double none[] = {-1.0, 0.0};
    assert_int_equal(calibration_pick_checks(none, 2, 10.0, picked), 0);
    const double ties[] = {1.0, 1.0, 1.0};
    assert_int_equal(calibration_pick_checks(ties, 3, 10.0, picked), 2);
    assert_int_equal(picked[0], 0);
    assert_int_equal(picked[1], 1);
}

static void test_time_left_and_lines(void **state)
{
    (void)state;
    assert_float_equal(calibration_seconds_left(10.0, 2.0, 3.0), 15.0, 1e-12);
    assert_true(calibration_seconds_left(10.0, 0.0, 3.0) == -1.0);
    assert_true(calibration_seconds_left(10.0, 2.0, -1.0) == 0.0);
    assert_true(calibration_line_due(10.0, 5.0, 5.0));
    assert_false(calibration_line_due(9.99, 5.0, 5.0));
    const calibration_entry shape = {.frames = 13, .height = 60, .width = 104, .text_len = 64, .copies = 28};
    char text[256];
    calibration_progress_text(text, sizeof text, 0, 5, 22, &shape, 1, 30.2);
    assert_string_equal(text, "calibration: shape 5/22 (13 x 60 x 104, 28 per micro-batch) on 1 block, about 31 s left");
    calibration_progress_text(text, sizeof text, 1, 1, 2, &shape, 30, 4.0);
    assert_string_equal(text, "calibration: check 1/2 (13 x 60 x 104, 28 per micro-batch) at 30 blocks, about 4 s left");
    calibration_progress_text(text, sizeof text, 0, 1, 22, &shape, 2, -1.0);
    assert_string_equal(text, "calibration: shape 1/22 (13 x 60 x 104, 28 per micro-batch) on 2 blocks, time left unknown");
    const calibration_entry entries[] = {{1, 32, 32, 64, 32, 0.1}, {9, 60, 104, 64, 6, 2.0}};
    const calibration_check checks[] = {{0, 0.1024, 0.1}, {1, 1.9, 2.0}};
    assert_float_equal(calibration_misfit(1.9, 2.0), -0.05, 1e-12);
    assert_true(calibration_misfit(1.0, -1.0) == 0.0);
    assert_float_equal(calibration_misfit_text(text, sizeof text, checks, 2, entries, 30), 0.05, 1e-12);
    assert_string_equal(text, "misfit at 30 blocks +2.4% (1 x 32 x 32, 32 per micro-batch), -5.0% (9 x 60 x 104, 6 "
                              "per micro-batch); worst 5.0%");
}

/* A fake device for calibration_time: entry i's micro-batch takes seed[i] * work(layers) / work(L) seconds, that
   is exactly E + L B + (L - 1) R with E = 0, B = 3 and R = 1 units, except at full depth, where it takes
   FULL_DEPTH_EXCESS more (the misfit the checks must report); a warm-up call takes as long again. Its clock is the
   seconds spent so far. */
#define FAKE_LAYERS 30
#define FULL_DEPTH_EXCESS 0.03
enum { FAKE_SHAPES = 5, FAKE_MAX_CALLS = 4 };
static const double fake_seed[FAKE_SHAPES] = {0.5, 4.0, 0.0, 8.0, 300.0};
static const calibration_entry fake_shapes[FAKE_SHAPES] = {
    {1, 32, 32, 64, 32, -1.0}, {5, 60, 104, 64, 16, -1.0}, {33, 96, 96, 64, 0, -1.0}, {9, 96, 96, 64, 6, -1.0},
    {21, 60, 104, 64, 4, -1.0}};

typedef struct {
    int num_layers;
    double clock;
    int n_calls;
    int layers[FAKE_MAX_CALLS], n[FAKE_MAX_CALLS], warm_up[FAKE_MAX_CALLS];
} fake_device;
static fake_device fake;

static double fake_seconds(int layers, int i)
{
    if (fake_shapes[i].copies == 0) return -1.0;
    const double seconds = fake_seed[i] * calibration_depth_work(layers, 1) / calibration_depth_work(fake.num_layers, 1);
    return layers == fake.num_layers && layers > 2 ? seconds * (1.0 + FULL_DEPTH_EXCESS) : seconds;
}

static void fake_time(void *context, int layers, const int *shapes, int n, int warm_up, double *seconds,
                      calibration_progress_fn progress, void *progress_context)
{
    (void)context;
    assert_true(fake.n_calls < FAKE_MAX_CALLS);
    fake.layers[fake.n_calls] = layers;
    fake.n[fake.n_calls] = n;
    fake.warm_up[fake.n_calls++] = warm_up;
    for (int k = 0; k < n; k++) {
        seconds[k] = fake_seconds(layers, shapes[k]);
        if (seconds[k] > 0.0) fake.clock += (warm_up ? 2.0 : 1.0) * seconds[k];
        progress(progress_context, k);
    }
}

static double fake_clock(void) { return fake.clock; }

/* The time left as the fake device spends it, after unit `k` (1-based) of the call the line names. */
static double true_time_left(int check, int k, int layers, const int *checked, int n_checked)
{
    double spent = 0.0, total = 0.0;
    for (int i = 0; i < FAKE_SHAPES; i++) { /* 1 block with warm-ups, then 2 blocks */
        const double pass0 = fake_shapes[i].copies ? 2.0 * fake_seconds(1, i) : 0.0;
        const double pass1 = fake_shapes[i].copies ? fake_seconds(2, i) : 0.0;
        total += pass0 + pass1;
        if (!check && layers == 1 && i < k) spent += pass0;
        if (check || layers == 2) spent += pass0;
        if (check || (layers == 2 && i < k)) spent += pass1;
    }
    for (int c = 0; c < n_checked; c++) {
        total += fake_seconds(FAKE_LAYERS, checked[c]);
        if (check && c < k) spent += fake_seconds(FAKE_LAYERS, checked[c]);
    }
    return total - spent;
}

static void test_timing_pass(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.num_layers = FAKE_LAYERS;
    FILE *lines = tmpfile();
    assert_non_null(lines);
    calibration_timer timer = {.num_layers = FAKE_LAYERS, .recompute_block = 1, .time = fake_time,
                               .clock = fake_clock, .progress = lines};
    calibration_entry entries[FAKE_SHAPES];
    memcpy(entries, fake_shapes, sizeof entries);
    calibration_check checks[CALIBRATION_MAX_CHECKS];
    const int n_checks = calibration_time(&timer, entries, FAKE_SHAPES, fake_seed, checks);

    /* 1 block after warm-ups, 2 blocks, then the checks at full depth, without warm-ups */
    assert_int_equal(fake.n_calls, 3);
    assert_true(fake.layers[0] == 1 && fake.n[0] == FAKE_SHAPES && fake.warm_up[0] == 1);
    assert_true(fake.layers[1] == 2 && fake.n[1] == FAKE_SHAPES && fake.warm_up[1] == 0);
    assert_true(fake.layers[2] == FAKE_LAYERS && fake.n[2] == 2 && fake.warm_up[2] == 0);
    /* the cheapest (0.5 s) and the costliest other within the 9.5 s left (8 s; 300 s is not checked) */
    assert_int_equal(n_checks, 2);
    assert_int_equal(checks[0].shape, 0);
    assert_int_equal(checks[1].shape, 3);
    const double excess = 1.0 + FULL_DEPTH_EXCESS;
    assert_float_equal(checks[0].predicted, 0.5, 1e-12);
    assert_float_equal(checks[1].measured, 8.0 * excess, 1e-12);
    assert_float_equal(calibration_misfit(checks[1].predicted, checks[1].measured), 1.0 / excess - 1.0, 1e-12);
    /* scaled where not checked, measured where checked, -1 where not timed */
    assert_float_equal(entries[0].seconds, 0.5 * excess, 1e-12);
    assert_float_equal(entries[1].seconds, 4.0, 1e-12);
    assert_true(entries[2].seconds == -1.0);
    assert_float_equal(entries[3].seconds, 8.0 * excess, 1e-12);
    assert_float_equal(entries[4].seconds, 300.0, 1e-9);
    for (int i = 0; i < FAKE_SHAPES; i++) assert_int_equal(entries[i].copies, fake_shapes[i].copies);

    /* the lines: what is timed, then progress at most every 5 s, each with the time the fake device had left */
    rewind(lines);
    char line[512];
    assert_non_null(fgets(line, sizeof line, lines));
    assert_string_equal(line, "calibration: timing 5 sample shapes on models of 1 and 2 blocks, scaled to 30 blocks, "
                              "then up to 2 of them at 30 blocks to check\n");
    const int checked[] = {0, 3};
    const double total = true_time_left(0, 0, 1, checked, 2);
    assert_float_equal(total, fake.clock, 1e-9);
    int n_lines = 0;
    double last_spent = 0.0;
    while (fgets(line, sizeof line, lines)) {
        char what[16], unit[16], kind[8];
        int k, n, frames, height, width, copies, layers, left;
        assert_int_equal(sscanf(line, "calibration: %15s %d/%d (%d x %d x %d, %d per micro-batch) %7s %d %15s about %d s "
                                "left", what, &k, &n, &frames, &height, &width, &copies, kind, &layers, unit, &left), 11);
        const int check = strcmp(what, "check") == 0;
        const double truly_left = true_time_left(check, k, layers, checked, 2);
        /* ceil, and the checks taken as scaled (3% short of what they take) */
        assert_true(fabs(left - truly_left) <= 1.0 + FULL_DEPTH_EXCESS * 8.5);
        assert_true(total - truly_left - last_spent >= CALIBRATION_PROGRESS_EVERY - 1e-9); /* rate-limited */
        last_spent = total - truly_left;
        n_lines++;
    }
    assert_true(n_lines >= 2 && n_lines <= (int)(total / CALIBRATION_PROGRESS_EVERY));
    fclose(lines);
}

static void test_shallow_model_is_timed_as_it_is(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.num_layers = 2;
    calibration_timer timer = {.num_layers = 2, .recompute_block = 1, .time = fake_time, .clock = fake_clock};
    calibration_entry entries[FAKE_SHAPES];
    memcpy(entries, fake_shapes, sizeof entries);
    calibration_check checks[CALIBRATION_MAX_CHECKS];
    assert_int_equal(calibration_time(&timer, entries, FAKE_SHAPES, fake_seed, checks), 0);
    assert_int_equal(fake.n_calls, 1);
    assert_true(fake.layers[0] == 2 && fake.warm_up[0] == 1);
    for (int i = 0; i < FAKE_SHAPES; i++) assert_true(entries[i].seconds == fake_seconds(2, i));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_names_what_the_timings_depend_on),
        cmocka_unit_test_setup_teardown(test_round_trip, make_scratch, remove_scratch),
        cmocka_unit_test_setup_teardown(test_stale_cache_is_not_used, make_scratch, remove_scratch),
        cmocka_unit_test_setup_teardown(test_corrupt_cache_is_reported, make_scratch, remove_scratch),
        cmocka_unit_test(test_unwritable_folder_is_a_warning),
        cmocka_unit_test(test_depth_scaling),
        cmocka_unit_test(test_pick_checks),
        cmocka_unit_test(test_time_left_and_lines),
        cmocka_unit_test(test_timing_pass),
        cmocka_unit_test(test_shallow_model_is_timed_as_it_is),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
