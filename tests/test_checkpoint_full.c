/* test_checkpoint_full.c — a disk that fills during a checkpoint write: an error with errno's text, no temporary file, the previous checkpoint intact, nothing left open in HDF5 (no crash at exit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "checkpoint_test_util.h"

#include "train/checkpoint.h"
#include "core/check.h"
#include "core/rng.h"
#include "deck/deck.h"
#include "model/model.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void tiny_deck(deck *config, const char *run_dir)
{
    char dir_key[DECK_PATH_MAX + 16];
    snprintf(dir_key, sizeof dir_key, "run.dir=%s", run_dir);
    char *overrides[] = {dir_key, "model.ffn_dim=32", "model.num_layers=1", "model.dim=16", "model.num_heads=2",
                         "model.text_len=8", "model.text_dim=8", "model.freq_dim=16", "checkpoint.keep=1"};
    deck_defaults(config);
    assert_int_equal(deck_load(config, NULL, (int)(sizeof overrides / sizeof overrides[0]), overrides, stderr), 0);
}

typedef struct {
    model net;
    float *adam_m, *adam_v;
    unsigned char blob[29];
    double rank_seconds[2];
    checkpoint_state state;
} run_state;

static void make_state(run_state *r, const deck *config, int64_t step, uint64_t seed)
{
    model_create(&r->net, config);
    model_init_random(&r->net, seed);
    r->adam_m = malloc((size_t)r->net.n_weights * sizeof(float));
    r->adam_v = malloc((size_t)r->net.n_weights * sizeof(float));
    uint64_t stream = seed;
    for (int64_t i = 0; i < r->net.n_weights; i++) {
        r->adam_m[i] = (float)rng_normal(&stream);
        r->adam_v[i] = (float)rng_uniform(&stream);
    }
    for (size_t i = 0; i < sizeof r->blob; i++) r->blob[i] = (unsigned char)rng_below(&stream, 256);
    r->rank_seconds[0] = 0.5;
    r->rank_seconds[1] = 0.25;
    r->state = (checkpoint_state){.step = step, .epoch = 0, .seed = seed, .adam_m = r->adam_m, .adam_v = r->adam_v,
                                  .balancer_state = r->blob, .balancer_bytes = sizeof r->blob,
                                  .rank_seconds = r->rank_seconds, .n_ranks = 2};
}

static void free_state(run_state *r)
{
    model_free(&r->net);
    free(r->adam_m);
    free(r->adam_v);
}

static int is_mounted(const char *dir); /* with the fixtures, below */

static void remove_tree(const char *dir)
{
    char command[2 * DECK_PATH_MAX];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    assert_int_equal(system(command), 0);
}

/* After a failed write of step `failed_step`: no .tmp, no file of that step, HDF5 holds nothing open, and
   the checkpoint of `good_step` (the only one, keep = 1) loads with the saved weights. */
static void assert_previous_intact(const deck *config, const run_state *saved, int64_t good_step, int64_t failed_step)
{
    char checkpoints[DECK_PATH_MAX + 16], path[2 * DECK_PATH_MAX];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", config->run.dir);
    assert_int_equal(count_files(checkpoints, ".tmp"), 0);
    assert_int_equal(count_files(checkpoints, ".h5"), 1);
    checkpoint_path(config, failed_step, path, sizeof path);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
    char found[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_find_latest(config, found, sizeof found, stderr), 1);
    checkpoint_path(config, good_step, path, sizeof path);
    assert_string_equal(found, path);
    run_state loaded;
    make_state(&loaded, config, 0, 5);
    checkpoint_state state = {.adam_m = loaded.adam_m, .adam_v = loaded.adam_v};
    assert_int_equal(checkpoint_load(found, config, &loaded.net, &state, stderr), 0);
    assert_int_equal(state.step, good_step);
    assert_memory_equal(loaded.adam_v, saved->adam_v, (size_t)saved->net.n_weights * sizeof(float));
    free(state.balancer_state);
    free(state.rank_seconds);
    free_state(&loaded);
}

static void set_file_size_limit(rlim_t bytes)
{
    struct rlimit limit;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &limit), 0);
    limit.rlim_cur = bytes == RLIM_INFINITY ? limit.rlim_max : bytes;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &limit), 0);
}

/* No root needed: a file-size limit (RLIMIT_FSIZE, writes past it fail with EFBIG) stands in for a disk
   that fills while checkpoint_save writes, after its free-space check passed. Every limit from 4 KiB up
   to the checkpoint's size, so the failure falls in the header, a tensor, the state or the final flush. */
static void test_write_fails_at_any_point(void **state)
{
    const char *dir = *state;
    deck config;
    tiny_deck(&config, dir);
    run_state saved;
    make_state(&saved, &config, 1, 77);
    char path[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);
    struct stat info;
    assert_int_equal(stat(path, &info), 0);
    signal(SIGXFSZ, SIG_IGN);
    int n_failed = 0;
    for (off_t limit = 4096; limit < info.st_size; limit += 4096) {
        saved.state.step = 2;
        FILE *errors = tmpfile();
        set_file_size_limit((rlim_t)limit);
        int status = checkpoint_save(&config, &saved.net, &saved.state, NULL, 0, errors);
        set_file_size_limit(RLIM_INFINITY);
        assert_int_not_equal(status, 0);
        char *message = captured(errors);
        fclose(errors);
        assert_non_null(strstr(message, "step_00000002.h5.tmp: "));
        assert_non_null(strstr(message, strerror(EFBIG)));
        free(message);
        assert_previous_intact(&config, &saved, 1, 2);
        n_failed++;
    }
    assert_true(n_failed >= 4);
    signal(SIGXFSZ, SIG_DFL);
    free_state(&saved);
}

/* Fills the file system holding `filler` to the last block with that one file. */
static void fill_disk(const char *filler)
{
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    char block[4096];
    memset(block, 0x5a, sizeof block);
    while (write(fd, block, sizeof block) > 0) {}
    assert_int_equal(errno, ENOSPC);
    close(fd);
}

/* As root: a real 2 MiB tmpfs that another writer fills after the writer's free-space check passed. */
static void test_tmpfs_fills_during_write(void **state)
{
    const char *dir = *state;
    if (!is_mounted(dir)) skip(); /* needs root and a mountable tmpfs; test_write_fails_at_any_point covers the failure without */
    deck config;
    tiny_deck(&config, dir);
    run_state saved;
    make_state(&saved, &config, 10, 78);
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, NULL, 0, stderr), 0);

    FILE *errors = tmpfile();
    checkpoint_writer *w = checkpoint_writer_open(&config, &saved.net, 20, CHECKPOINT_TRAINING_GROUPS, 64, errors);
    assert_non_null(w);
    char filler[DECK_PATH_MAX + 16];
    snprintf(filler, sizeof filler, "%s/filler", dir);
    fill_disk(filler);
    const float *sources[] = {saved.net.weights, saved.adam_m, saved.adam_v};
    int status = 0;
    for (int g = 0; g < 3 && status == 0; g++)
        for (int p = 0; p < saved.net.n_params && status == 0; p++)
            status = checkpoint_write_tensor(w, (checkpoint_group)g, saved.net.params[p].name,
                                             sources[g] + saved.net.params[p].offset);
    saved.state.step = 20;
    if (status == 0) status = checkpoint_write_state(w, &saved.state);
    assert_int_not_equal(checkpoint_writer_commit(w, NULL, 0), 0); /* fails wherever the space ran out */
    char *message = captured(errors);
    fclose(errors);
    assert_non_null(strstr(message, "step_00000020.h5.tmp: "));
    assert_non_null(strstr(message, strerror(ENOSPC)));
    free(message);
    assert_int_equal(unlink(filler), 0);
    assert_previous_intact(&config, &saved, 10, 20);

    /* with the disk full from the start the write is refused before HDF5 creates anything */
    fill_disk(filler);
    errors = tmpfile();
    saved.state.step = 30;
    assert_int_not_equal(checkpoint_save(&config, &saved.net, &saved.state, NULL, 0, errors), 0);
    message = captured(errors);
    fclose(errors);
    assert_non_null(strstr(message, "not enough free space for the checkpoint"));
    free(message);
    assert_int_equal(unlink(filler), 0);
    assert_previous_intact(&config, &saved, 10, 30);

    free_state(&saved);
}

/* Fixtures: a fresh folder, and for the tmpfs test a 2 MiB tmpfs mounted on it (when permitted); the
   teardown removes both even when an assertion failed halfway. */
#define TMPFS_MARK "/.aldit-tmpfs"
static int is_mounted(const char *dir)
{
    char mark[DECK_PATH_MAX];
    snprintf(mark, sizeof mark, "%s" TMPFS_MARK, dir);
    return access(mark, F_OK) == 0;
}

static int make_folder(void **state)
{
    char *dir = strdup("/tmp/aldit-test-checkpoint-full-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    *state = dir;
    return 0;
}

static int make_tmpfs(void **state)
{
    if (make_folder(state) != 0) return -1;
    const char *dir = *state;
    if (geteuid() == 0 && mount("tmpfs", dir, "tmpfs", 0, "size=2m") == 0) {
        char mark[DECK_PATH_MAX];
        snprintf(mark, sizeof mark, "%s" TMPFS_MARK, dir);
        FILE *file = fopen(mark, "w");
        if (!file) return -1;
        fclose(file);
    }
    return 0;
}

static int remove_folder(void **state)
{
    char *dir = *state;
    if (is_mounted(dir) && umount2(dir, MNT_DETACH) != 0) return -1;
    remove_tree(dir);
    free(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_fails_at_any_point, make_folder, remove_folder),
        cmocka_unit_test_setup_teardown(test_tmpfs_fills_during_write, make_tmpfs, remove_folder),
    };
    /* the program's own exit status is part of the test: HDF5 crashed at exit on a file left open */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
