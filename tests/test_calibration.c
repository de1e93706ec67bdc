/* test_calibration.c — cmocka tests of the start-up calibration: the cache (its key, round trips, stale and corrupt files, atomic writes), the scaling from models of one and two blocks to the depth, the choice of the shapes timed at full depth, the progress lines and the cost model's fit to packed timings. */
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
#include "balance/costmodel.h"
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
    changed = config; /* another target times other shapes at full depth */
    changed.balance.calibrate_seconds = 120;
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

static void test_full_depth_budget(void **state)
{
    (void)state;
    assert_float_equal(calibration_full_depth_budget(60.0, 30.0), 20.0, 1e-12);  /* a third of the target */
    assert_float_equal(calibration_full_depth_budget(60.0, 40.0), 15.0, 1e-12);  /* 3/4 of the 20 s left */
    assert_true(calibration_full_depth_budget(60.0, 70.0) == 0.0);
    assert_true(calibration_full_depth_budget(0.0, 10.0) == 0.0);
    assert_float_equal(calibration_full_depth_budget(300.0, 30.0), 100.0, 1e-12);
}

/* The picks' roles and order against what the rule gives by hand. */
static void expect_picks(const double *predicted, int n, double budget, int want_n, const int *want_order,
                         const int *want_role)
{
    int role[8], order[8];
    assert_int_equal(calibration_pick_full_depth(predicted, n, budget, role, order), want_n);
    for (int c = 0; c < want_n; c++) assert_int_equal(order[c], want_order[c]);
    for (int i = 0; i < n; i++) assert_int_equal(role[i], want_role[i]);
}

static void test_pick_full_depth(void **state)
{
    (void)state;
    enum { S = CALIBRATION_SCALED, A = CALIBRATION_AT_DEPTH, C = CALIBRATION_CHECK };
    const double predicted[] = {0.2, -1.0, 3.0, 12.0, 6.0, 0.5, 1.0};
    /* 24 s: the cheap ones up to 12 s (0.2 + 0.5 + 1 + 3 + 6 = 10.7), then the costliest in the 13.3 s left */
    expect_picks(predicted, 7, 24.0, 6, (const int[]){0, 5, 6, 2, 4, 3}, (const int[]){A, S, A, C, A, A, A});
    /* 12 s: the cheap ones up to 6 s (4.7), the 6 s shape in the 7.3 s left, nothing in the 1.3 s after it */
    expect_picks(predicted, 7, 12.0, 5, (const int[]){0, 5, 6, 2, 4}, (const int[]){A, S, A, S, C, A, A});
    /* 10 s: 4.7 s of cheap ones; neither 6 s nor 12 s fits the 5.3 s left: both stay scaled, unchecked */
    expect_picks(predicted, 7, 10.0, 4, (const int[]){0, 5, 6, 2}, (const int[]){A, S, A, S, S, A, A});
    /* no budget: the cheapest whatever it costs */
    expect_picks(predicted, 7, 0.0, 1, (const int[]){0}, (const int[]){A, S, S, S, S, S, S});
    expect_picks(predicted, 7, 0.1, 1, (const int[]){0}, (const int[]){A, S, S, S, S, S, S});
    /* everything fits half the budget: all at full depth, nothing left to check */
    expect_picks(predicted, 7, 100.0, 6, (const int[]){0, 5, 6, 2, 4, 3}, (const int[]){A, S, A, A, A, A, A});
    /* at most CALIBRATION_MAX_CHECKS checks, each the costliest that fits what is left: 9 s of 17, then 8 of 8 */
    const double two[] = {1.0, 2.0, 8.0, 9.0, 30.0, 100.0};
    expect_picks(two, 6, 20.0, 4, (const int[]){0, 1, 3, 2}, (const int[]){A, A, C, C, S, S});
    const double none[] = {-1.0, 0.0};
    expect_picks(none, 2, 10.0, 0, NULL, (const int[]){S, S});
    const double ties[] = {1.0, 1.0, 1.0}; /* ties go to the lower index */
    expect_picks(ties, 3, 2.5, 2, (const int[]){0, 1}, (const int[]){A, C, S});
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
    assert_string_equal(text, "calibration: full depth 1/2 (13 x 60 x 104, 28 per micro-batch) at 30 blocks, about 4 s "
                              "left");
    calibration_progress_text(text, sizeof text, 0, 1, 22, &shape, 2, -1.0);
    assert_string_equal(text, "calibration: shape 1/22 (13 x 60 x 104, 28 per micro-batch) on 2 blocks, time left unknown");
    const calibration_entry entries[] = {{1, 32, 32, 64, 32, 0.1}, {1, 56, 32, 64, 32, 0.2}, {9, 60, 104, 64, 6, 2.0},
                                         {13, 64, 64, 64, 4, 3.0}};
    const calibration_check checks[] = {{0, CALIBRATION_AT_DEPTH, 0.1024, 0.1}, {1, CALIBRATION_AT_DEPTH, 0.15, 0.2},
                                        {2, CALIBRATION_CHECK, 1.9, 2.0}, {3, CALIBRATION_CHECK, 3.03, 3.0}};
    assert_float_equal(calibration_misfit(1.9, 2.0), -0.05, 1e-12);
    assert_true(calibration_misfit(1.0, -1.0) == 0.0);
    assert_float_equal(calibration_misfit_text(text, sizeof text, checks, 4, entries, 30, 6), 0.25, 1e-12);
    assert_string_equal(text, "misfit of the scaling at 30 blocks: worst -25.0% (1 x 56 x 32, 32 per micro-batch) of "
                              "the 2 cheapest shapes timed there; checks of the 6 scaled: -5.0% (9 x 60 x 104, 6 "
                              "per micro-batch), +1.0% (13 x 64 x 64, 4 per micro-batch); worst 25.0%");
    assert_float_equal(calibration_misfit_text(text, sizeof text, checks, 2, entries, 30, 0), 0.25, 1e-12);
    assert_string_equal(text, "misfit of the scaling at 30 blocks: worst -25.0% (1 x 56 x 32, 32 per micro-batch) of "
                              "the 2 cheapest shapes timed there; none scaled; worst 25.0%");
    assert_float_equal(calibration_misfit_text(text, sizeof text, checks, 1, entries, 30, 3), 0.024, 1e-12);
    assert_string_equal(text, "misfit of the scaling at 30 blocks: worst +2.4% (1 x 32 x 32, 32 per micro-batch) of "
                              "the cheapest shape timed there; 3 scaled, not checked; worst 2.4%");
    char small[24];
    calibration_misfit_text(small, sizeof small, checks, 4, entries, 30, 6); /* cut, not overrun */
    assert_int_equal(strlen(small), sizeof small - 1);
}

/* A fake device for calibration_time: entry i's micro-batch takes seed[i] * work(layers) / work(L) seconds, that
   is exactly E + L B + (L - 1) R with E = 0, B = 3 and R = 1 units, except at full depth, where it takes
   FULL_DEPTH_EXCESS more (the misfit the checks must report); a warm-up call takes as long again. The first
   micro-batch run on a model in a call (a warm-up or not) takes FIRST_CALL seconds more (one-off costs of a model
   just built), which must reach no timing. Its clock is the seconds spent so far. */
#define FAKE_LAYERS 30
#define FULL_DEPTH_EXCESS 0.03
#define FIRST_CALL 0.4
enum { FAKE_SHAPES = 5, FAKE_MAX_CALLS = 4, FAKE_MAX_RUNS = 32 };
static const double fake_seed[FAKE_SHAPES] = {0.5, 4.0, 0.0, 8.0, 300.0};
static const calibration_entry fake_shapes[FAKE_SHAPES] = {
    {1, 32, 32, 64, 32, -1.0}, {5, 60, 104, 64, 16, -1.0}, {33, 96, 96, 64, 0, -1.0}, {9, 96, 96, 64, 6, -1.0},
    {21, 60, 104, 64, 4, -1.0}};

typedef struct {
    int num_layers;
    double clock;
    int n_calls;
    int layers[FAKE_MAX_CALLS], n[FAKE_MAX_CALLS], warm_up[FAKE_MAX_CALLS], first[FAKE_MAX_CALLS];
    double repeat[FAKE_MAX_CALLS];
    /* the clock after each micro-batch a call reports (its call, its position in the call) */
    int n_runs, run_call[FAKE_MAX_RUNS], run_position[FAKE_MAX_RUNS];
    double run_clock[FAKE_MAX_RUNS];
} fake_device;
static fake_device fake;

static double fake_seconds(int layers, int i)
{
    if (fake_shapes[i].copies == 0) return -1.0;
    const double seconds = fake_seed[i] * calibration_depth_work(layers, 1) / calibration_depth_work(fake.num_layers, 1);
    return layers == fake.num_layers && layers > 2 ? seconds * (1.0 + FULL_DEPTH_EXCESS) : seconds;
}

static void fake_time(void *context, int layers, const int *shapes, int n, int warm_up, double repeat_seconds,
                      double *seconds, calibration_progress_fn progress, void *progress_context)
{
    (void)context;
    assert_true(fake.n_calls < FAKE_MAX_CALLS);
    const int call = fake.n_calls++;
    fake.repeat[call] = repeat_seconds;
    fake.layers[call] = layers;
    fake.n[call] = n;
    fake.warm_up[call] = warm_up;
    fake.first[call] = shapes[0];
    for (int k = 0; k < n; k++) {
        seconds[k] = fake_seconds(layers, shapes[k]);
        if (seconds[k] > 0.0) {
            fake.clock += (warm_up ? 2.0 : 1.0) * seconds[k] + (k == 0 ? FIRST_CALL : 0.0);
            if (k == 0 && !warm_up) seconds[k] += FIRST_CALL; /* timed cold */
        }
        assert_true(fake.n_runs < FAKE_MAX_RUNS);
        fake.run_call[fake.n_runs] = call, fake.run_position[fake.n_runs] = k, fake.run_clock[fake.n_runs++] = fake.clock;
        progress(progress_context, k);
    }
}

static double fake_clock(void) { return fake.clock; }

/* The clock after micro-batch k (1-based, warm-ups of a call not counted) of the call on `layers` blocks. */
static double clock_after(int layers, int k)
{
    for (int r = 0; r < fake.n_runs; r++) {
        const int call = fake.run_call[r];
        if (fake.layers[call] == layers && fake.run_position[r] - (fake.warm_up[call] ? 0 : 1) == k - 1)
            return fake.run_clock[r];
    }
    fail_msg("no micro-batch %d on %d blocks", k, layers);
    return 0.0;
}

static void test_timing_pass(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.num_layers = FAKE_LAYERS;
    FILE *lines = tmpfile();
    assert_non_null(lines);
    calibration_timer timer = {.num_layers = FAKE_LAYERS, .recompute_block = 1, .target_seconds = 60.0,
                               .time = fake_time, .clock = fake_clock, .progress = lines};
    calibration_entry entries[FAKE_SHAPES];
    memcpy(entries, fake_shapes, sizeof entries);
    calibration_check checks[FAKE_SHAPES];
    const int n_full = calibration_time(&timer, entries, FAKE_SHAPES, fake_seed, checks);

    /* 1 block after warm-ups, 2 blocks, then the picked shapes at full depth, cheapest first; the calls without
       warm-ups run their first micro-batch once more first */
    assert_int_equal(fake.n_calls, 3);
    assert_true(fake.layers[0] == 1 && fake.n[0] == FAKE_SHAPES && fake.warm_up[0] == 1);
    assert_true(fake.layers[1] == 2 && fake.n[1] == FAKE_SHAPES + 1 && fake.warm_up[1] == 0 && fake.first[1] == 0);
    assert_true(fake.layers[2] == FAKE_LAYERS && fake.n[2] == n_full + 1 && fake.warm_up[2] == 0 && fake.first[2] == 0);
    /* the passes that are scaled repeat their short timings; the full-depth pass times once */
    assert_true(fake.repeat[0] == CALIBRATION_REPEAT_SECONDS && fake.repeat[1] == CALIBRATION_REPEAT_SECONDS);
    assert_true(fake.repeat[2] == 0.0);
    /* the passes on 1 and 2 blocks took 2 (0.5 + 4 + 8 + 300) 3 / 119 + (0.5 + 0.5 + 4 + 8 + 300) 7 / 119 s and
       their first calls' 2 x 0.4 s: 35.0 s, which leaves a budget of 3/4 of 25 s, 18.8 s. The cheap ones within
       half of it: 0.5 + 4 s (not 8 s more); the costliest in the 14.3 s left: 8 s; 300 s stays scaled */
    const double passes = 2.0 * 312.5 * 3.0 / 119.0 + 313.0 * 7.0 / 119.0 + 2.0 * FIRST_CALL;
    const double budget = calibration_full_depth_budget(60.0, passes);
    assert_true(budget > 12.5 && budget < 25.0);
    assert_int_equal(n_full, 3);
    const int want_shape[] = {0, 1, 3};
    const calibration_role want_role[] = {CALIBRATION_AT_DEPTH, CALIBRATION_AT_DEPTH, CALIBRATION_CHECK};
    const double excess = 1.0 + FULL_DEPTH_EXCESS;
    for (int c = 0; c < n_full; c++) {
        assert_int_equal(checks[c].shape, want_shape[c]);
        assert_int_equal(checks[c].role, want_role[c]);
        assert_float_equal(checks[c].predicted, fake_seed[want_shape[c]], 1e-12);          /* no one-off cost */
        assert_float_equal(checks[c].measured, fake_seed[want_shape[c]] * excess, 1e-12); /* nor here */
        assert_float_equal(calibration_misfit(checks[c].predicted, checks[c].measured), 1.0 / excess - 1.0, 1e-12);
    }
    /* measured where timed at full depth, scaled elsewhere, -1 where not timed */
    assert_float_equal(entries[0].seconds, 0.5 * excess, 1e-12);
    assert_float_equal(entries[1].seconds, 4.0 * excess, 1e-12);
    assert_true(entries[2].seconds == -1.0);
    assert_float_equal(entries[3].seconds, 8.0 * excess, 1e-12);
    assert_float_equal(entries[4].seconds, 300.0, 1e-9);
    for (int i = 0; i < FAKE_SHAPES; i++) assert_int_equal(entries[i].copies, fake_shapes[i].copies);

    /* the lines: what is timed, progress at most every 5 s with the time the fake device had left, which shapes
       run at full depth */
    rewind(lines);
    char line[512];
    assert_non_null(fgets(line, sizeof line, lines));
    assert_string_equal(line, "calibration: timing 5 sample shapes on models of 1 and 2 blocks, then the cheapest and "
                              "up to 2 checks at 30 blocks within the time target (60 s), the others scaled to 30 "
                              "blocks\n");
    const double total = fake.clock;
    int n_lines = 0, announced = 0;
    double last_spent = 0.0;
    while (fgets(line, sizeof line, lines)) {
        if (strcmp(line, "calibration: 3 shapes at 30 blocks (the 2 cheapest and 1 check, about 13 s), 1 scaled\n") ==
            0) {
            assert_false(announced);
            announced = 1;
            continue;
        }
        char what[16], unit[16], kind[8];
        int k, n, frames, height, width, copies, layers, left;
        const int full_depth = strncmp(line, "calibration: full depth ", 24) == 0;
        const char *rest = full_depth ? line + 24 : line + 13;
        if (!full_depth) assert_int_equal(sscanf(rest, "%15s", what), 1);
        assert_int_equal(sscanf(full_depth ? rest : rest + strlen(what) + 1, "%d/%d (%d x %d x %d, %d per micro-batch) "
                                "%7s %d %15s about %d s left", &k, &n, &frames, &height, &width, &copies, kind,
                                &layers, unit, &left), 10);
        assert_true(full_depth == announced);
        const double spent = clock_after(layers, k), truly_left = total - spent;
        /* ceil; the full-depth pass taken as scaled (3% short) and without the one-off costs */
        assert_true(fabs(left - truly_left) <= 1.0 + FULL_DEPTH_EXCESS * 12.5 + 2.0 * FIRST_CALL);
        assert_true(spent - last_spent >= CALIBRATION_PROGRESS_EVERY - 1e-9); /* rate-limited */
        last_spent = spent;
        n_lines++;
    }
    assert_true(announced);
    assert_true(n_lines >= 2 && n_lines <= (int)(total / CALIBRATION_PROGRESS_EVERY));
    fclose(lines);
}

/* A time target of 0 times only the cheapest shape at full depth; a large one every shape. */
static void test_timing_pass_follows_the_target(void **state)
{
    (void)state;
    const double targets[] = {0.0, 2000.0};
    const int want_full[] = {1, 4};
    for (int t = 0; t < 2; t++) {
        memset(&fake, 0, sizeof fake);
        fake.num_layers = FAKE_LAYERS;
        calibration_timer timer = {.num_layers = FAKE_LAYERS, .recompute_block = 1, .target_seconds = targets[t],
                                   .time = fake_time, .clock = fake_clock};
        calibration_entry entries[FAKE_SHAPES];
        memcpy(entries, fake_shapes, sizeof entries);
        calibration_check checks[FAKE_SHAPES];
        assert_int_equal(calibration_time(&timer, entries, FAKE_SHAPES, fake_seed, checks), want_full[t]);
        assert_int_equal(checks[0].shape, 0);
        for (int c = 0; c < want_full[t]; c++) assert_int_equal(checks[c].role, CALIBRATION_AT_DEPTH);
        for (int i = 0; i < FAKE_SHAPES; i++) /* measured at full depth, or exactly scaled */
            if (i != 2) assert_float_equal(entries[i].seconds, fake_seconds(i == 0 || t == 1 ? FAKE_LAYERS : 1, i) *
                                           (i == 0 || t == 1 ? 1.0 : calibration_depth_work(FAKE_LAYERS, 1) / 3.0), 1e-9);
    }
}

static void test_shallow_model_is_timed_as_it_is(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.num_layers = 2;
    calibration_timer timer = {.num_layers = 2, .recompute_block = 1, .target_seconds = 60.0, .time = fake_time,
                               .clock = fake_clock};
    calibration_entry entries[FAKE_SHAPES];
    memcpy(entries, fake_shapes, sizeof entries);
    calibration_check checks[FAKE_SHAPES];
    assert_int_equal(calibration_time(&timer, entries, FAKE_SHAPES, fake_seed, checks), 0);
    assert_int_equal(fake.n_calls, 1);
    assert_true(fake.layers[0] == 2 && fake.warm_up[0] == 1 && fake.n[0] == FAKE_SHAPES);
    for (int i = 0; i < FAKE_SHAPES; i++) assert_true(entries[i].seconds == fake_seconds(2, i));
}

/* ---- the cost model's fit to the timings ---- */

/* Wan-1.3B's dims, 30 blocks, recompute = block, as the 30-layer calibration runs it. */
static deck wan_deck(void)
{
    deck config;
    deck_defaults(&config);
    config.model.dim = 1536, config.model.ffn_dim = 8960, config.model.num_heads = 12, config.model.num_layers = 30;
    config.model.text_len = 512, config.model.text_dim = 4096;
    config.balance.recompute = config.train.recompute = RECOMPUTE_BLOCK;
    return config;
}

/* inputs/mixed.lengths' 22 shapes in latent frames x height x width, their tokens after the 1x2x2 patchify */
enum { MIXED_SHAPES = 22 };
static int64_t mixed_tokens(int i)
{
    static const int shape[MIXED_SHAPES][3] = {
        {1, 32, 32}, {1, 32, 56}, {1, 56, 32}, {1, 64, 64}, {1, 48, 64}, {1, 64, 48}, {1, 60, 104}, {1, 104, 60},
        {1, 96, 96}, {1, 54, 96}, {5, 32, 32}, {9, 32, 32}, {13, 32, 56}, {5, 60, 104}, {9, 60, 104}, {13, 64, 64},
        {9, 96, 96}, {17, 64, 64}, {21, 60, 104}, {17, 96, 96}, {33, 54, 96}, {33, 96, 96}};
    return (int64_t)shape[i][0] * (shape[i][1] / 2) * (shape[i][2] / 2);
}

/* Timings of packed micro-batches (copies: as many of a shape as 250k tokens hold, 1 to 32; every sample padded to
   512 text rows) by a known per-sample law (the FLOP seed with slower GEMMs, faster attention and a per-sample
   constant) plus a fixed cost per micro-batch; the cost model fitted to them as balancer_calibrate fits it. */
static void fit_mixed(cost_model *cm, const deck *config, double per_micro_batch, double inflate_first,
                      cost_features *features, double *seconds, double *truth)
{
    cost_model_init(cm, config);
    const double law[COST_N_FEATURES] = {3e-4, 1.4 * cm->seed_coef[1], 0.7 * cm->seed_coef[2], cm->seed_coef[3],
                                         1.2 * cm->seed_coef[4]};
    for (int i = 0; i < MIXED_SHAPES; i++) {
        const int64_t tokens = mixed_tokens(i);
        int copies = (int)(250000 / tokens);
        copies = copies < 1 ? 1 : copies > 32 ? 32 : copies;
        memset(&features[i], 0, sizeof features[i]);
        for (int c = 0; c < copies; c++) cost_features_add(cm, &features[i], tokens, 512);
        truth[i] = per_micro_batch;
        for (int j = 0; j < COST_N_FEATURES; j++) truth[i] += law[j] * features[i].value[j];
        seconds[i] = i == 0 ? inflate_first * truth[i] : truth[i];
    }
    assert_int_equal(cost_model_calibrate(cm, MIXED_SHAPES, features, seconds), 1);
}

/* The fit of a law it can express, plus a fixed cost per micro-batch it cannot (the per-sample constant absorbs
   it, amortised over the copies): every timed shape within 1%, and the misfit reported is the worst shape's. */
static void test_fit_of_packed_timings(void **state)
{
    (void)state;
    const deck config = wan_deck();
    cost_model cm;
    cost_features features[MIXED_SHAPES];
    double seconds[MIXED_SHAPES], truth[MIXED_SHAPES];
    fit_mixed(&cm, &config, 0.05, 1.0, features, seconds, truth);
    int at = -2;
    const double worst = cost_model_worst_misfit(&cm, MIXED_SHAPES, features, seconds, &at);
    assert_true(worst < 0.01);
    assert_true(at >= 0 && at < MIXED_SHAPES);
    for (int i = 0; i < MIXED_SHAPES; i++)
        assert_true(fabs(cost_model_predict_features(&cm, &features[i]) / seconds[i] - 1.0) <= worst);
    cost_model_free(&cm);
    /* none timed: 0, no index */
    cost_model_init(&cm, &config);
    const double untimed[2] = {-1.0, 0.0};
    assert_true(cost_model_worst_misfit(&cm, 2, features, untimed, &at) == 0.0 && at == -1);
    cost_model_free(&cm);
}

/* One bad timing (the smallest shape's 15 times too long: the 2-block model's cold first call, scaled by 29) is
   the worst misfit, named as such, while the robust fit keeps the other shapes within 0.5% of the truth. */
static void test_fit_names_a_bad_timing(void **state)
{
    (void)state;
    const deck config = wan_deck();
    cost_model cm;
    cost_features features[MIXED_SHAPES];
    double seconds[MIXED_SHAPES], truth[MIXED_SHAPES];
    fit_mixed(&cm, &config, 0.05, 15.0, features, seconds, truth);
    int at = -1;
    const double worst = cost_model_worst_misfit(&cm, MIXED_SHAPES, features, seconds, &at);
    assert_int_equal(at, 0);
    assert_true(worst > 0.8);
    for (int i = 1; i < MIXED_SHAPES; i++) /* a plain least squares: the next shapes 4% off */
        assert_true(fabs(cost_model_predict_features(&cm, &features[i]) / truth[i] - 1.0) < 0.005);
    cost_model_free(&cm);
}

/* A device whose short samples (under 1024 tokens) run attention on a kernel of their own at 3.3x the S^2 cost, as
   our flash attention against cuDNN's on an H200: a cost model told the split (attention_split_tokens) fits every
   shape within 1%; one that is not told cannot (the short and the long S^2 share one coefficient). */
static void test_fit_learns_the_attention_split(void **state)
{
    (void)state;
    const deck config = wan_deck();
    double worst[2];
    for (int told = 0; told < 2; told++) {
        cost_model cm, truth_model;
        cost_model_init(&cm, &config);
        cost_model_init(&truth_model, &config);
        cm.attention_split_tokens = told ? 1024 : 0;
        truth_model.attention_split_tokens = 1024;
        memcpy(truth_model.coef, cm.seed_coef, sizeof truth_model.coef);
        truth_model.coef[0] = 2e-3, truth_model.coef[1] *= 1.4, truth_model.coef[5] = 3.3 * truth_model.coef[2];
        cost_features features[MIXED_SHAPES] = {0}, truth_features[MIXED_SHAPES] = {0};
        double seconds[MIXED_SHAPES];
        int n_short = 0;
        for (int i = 0; i < MIXED_SHAPES; i++) {
            const int64_t tokens = mixed_tokens(i);
            n_short += tokens < 1024;
            for (int c = 0; c < 32; c++) {
                cost_features_add(&cm, &features[i], tokens, 512);
                cost_features_add(&truth_model, &truth_features[i], tokens, 512);
            }
            seconds[i] = cost_model_predict_features(&truth_model, &truth_features[i]);
            /* the features and the per-sample prediction agree */
            assert_float_equal(seconds[i], 32 * cost_model_predict(&truth_model, tokens, 512), 1e-12 * seconds[i]);
            /* a short sample's S^2 is feature 5, a long one's feature 2 */
            if (told) assert_true(tokens < 1024 ? features[i].value[2] == 0.0 && features[i].value[5] > 0.0
                                                : features[i].value[5] == 0.0 && features[i].value[2] > 0.0);
            else assert_true(features[i].value[5] == 0.0);
        }
        assert_true(n_short >= 4 && n_short < MIXED_SHAPES - 4);
        cost_model_calibrate(&cm, MIXED_SHAPES, features, seconds);
        worst[told] = cost_model_worst_misfit(&cm, MIXED_SHAPES, features, seconds, NULL);
        if (told) assert_true(fabs(cm.coef[5] / cm.coef[2] - 3.3) < 0.1);
        cost_model_free(&cm);
        cost_model_free(&truth_model);
    }
    assert_true(worst[1] < 0.01);
    assert_true(worst[0] > 0.03);
}

/* Repeats: while the timings sum to under the threshold, at most CALIBRATION_MAX_REPEATS in all; never with 0. */
static void test_repeat_due(void **state)
{
    (void)state;
    assert_true(calibration_repeat_due(1, 0.1, 0.5));
    assert_true(calibration_repeat_due(3, 0.3, 0.5));
    assert_false(calibration_repeat_due(CALIBRATION_MAX_REPEATS, 0.3, 0.5));
    assert_false(calibration_repeat_due(1, 0.5, 0.5));
    assert_false(calibration_repeat_due(2, 0.6, 0.5));
    assert_false(calibration_repeat_due(1, 0.01, 0.0));
    assert_false(calibration_repeat_due(0, 0.0, 0.5));
}

/* The text rows a timed shape gets: its mean caption where only the video attends (Wan); where the text joins the
   attention the shortest and longest in turn, so that L varies against S over the timings. */
static void test_text_rows_by_family(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) assert_int_equal(calibration_text_rows(0, i, 50, 512, 1000), 512);
    assert_int_equal(calibration_text_rows(1, 0, 50, 512, 1000), 50);
    assert_int_equal(calibration_text_rows(1, 1, 50, 512, 1000), 1000);
    assert_int_equal(calibration_text_rows(1, 6, 50, 512, 1000), 50);
    assert_int_equal(calibration_text_rows(1, 7, 77, 77, 77), 77);
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
        cmocka_unit_test(test_full_depth_budget),
        cmocka_unit_test(test_pick_full_depth),
        cmocka_unit_test(test_time_left_and_lines),
        cmocka_unit_test(test_timing_pass),
        cmocka_unit_test(test_timing_pass_follows_the_target),
        cmocka_unit_test(test_shallow_model_is_timed_as_it_is),
        cmocka_unit_test(test_fit_of_packed_timings),
        cmocka_unit_test(test_fit_names_a_bad_timing),
        cmocka_unit_test(test_fit_learns_the_attention_split),
        cmocka_unit_test(test_repeat_due),
        cmocka_unit_test(test_text_rows_by_family),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
