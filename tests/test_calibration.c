/* test_calibration.c — cmocka tests of the start-up calibration cache: its key, round trips, stale and corrupt files, atomic writes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_names_what_the_timings_depend_on),
        cmocka_unit_test_setup_teardown(test_round_trip, make_scratch, remove_scratch),
        cmocka_unit_test_setup_teardown(test_stale_cache_is_not_used, make_scratch, remove_scratch),
        cmocka_unit_test_setup_teardown(test_corrupt_cache_is_reported, make_scratch, remove_scratch),
        cmocka_unit_test(test_unwritable_folder_is_a_warning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
