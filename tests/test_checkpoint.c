/* test_checkpoint.c — checkpoint round trip, atomic writes, keep-K pruning, resume selection, model and shape checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "train/checkpoint.h"
#include "core/check.h"
#include "deck/deck.h"
#include "model/model.h"
#include "core/rng.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A tiny model deck (ffn_dim and num_layers as given) with its run folder in `run_dir`. */
static void tiny_deck(deck *config, const char *run_dir, int ffn_dim, int num_layers)
{
    char dir_key[DECK_PATH_MAX + 16], ffn_key[32], layers_key[32];
    snprintf(dir_key, sizeof dir_key, "run.dir=%s", run_dir);
    snprintf(ffn_key, sizeof ffn_key, "model.ffn_dim=%d", ffn_dim);
    snprintf(layers_key, sizeof layers_key, "model.num_layers=%d", num_layers);
    char *overrides[] = {dir_key, ffn_key, layers_key, "model.dim=16", "model.num_heads=2", "model.text_len=8",
                         "model.text_dim=8", "model.freq_dim=16", "checkpoint.keep=2"};
    deck_defaults(config);
    assert_int_equal(deck_load(config, NULL, (int)(sizeof overrides / sizeof overrides[0]), overrides, stderr), 0);
}

static char *make_run_dir(void)
{
    char *dir = strdup("/tmp/aldit-test-checkpoint-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_tree(const char *dir)
{
    char command[2 * DECK_PATH_MAX];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    assert_int_equal(system(command), 0);
}

/* Model with random weights plus random moments and a balancer blob, all derived from `seed`. */
typedef struct {
    model net;
    float *adam_m, *adam_v;
    unsigned char blob[37];
    double rank_seconds[3];
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
    for (int rank = 0; rank < 3; rank++) r->rank_seconds[rank] = rng_uniform(&stream);
    r->state = (checkpoint_state){.step = step, .epoch = step / 3, .seed = seed, .adam_m = r->adam_m,
                                  .adam_v = r->adam_v, .balancer_state = r->blob, .balancer_bytes = sizeof r->blob,
                                  .rank_seconds = r->rank_seconds, .n_ranks = 3};
}

static void free_state(run_state *r)
{
    model_free(&r->net);
    free(r->adam_m);
    free(r->adam_v);
}

/* Everything written to `errors` so far, as a string (caller frees). */
static char *captured(FILE *errors)
{
    long n_bytes = ftell(errors);
    char *text = calloc((size_t)n_bytes + 1, 1);
    rewind(errors);
    assert_int_equal(fread(text, 1, (size_t)n_bytes, errors), (size_t)n_bytes);
    return text;
}

static int count_files(const char *dir, const char *suffix)
{
    DIR *listing = opendir(dir);
    assert_non_null(listing);
    int n_files = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        size_t length = strlen(entry->d_name), suffix_length = strlen(suffix);
        if (length >= suffix_length && strcmp(entry->d_name + length - suffix_length, suffix) == 0) n_files++;
    }
    closedir(listing);
    return n_files;
}

static void test_round_trip(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state saved;
    make_state(&saved, &config, 12, 99);
    char path[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);
    assert_non_null(strstr(path, "checkpoints/step_00000012.h5"));

    char found[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_find_latest(&config, found, sizeof found, stderr), 1);
    assert_string_equal(found, path);

    run_state loaded;
    make_state(&loaded, &config, 0, 5); /* different contents, overwritten by the load */
    checkpoint_state state = {.adam_m = loaded.adam_m, .adam_v = loaded.adam_v};
    assert_int_equal(checkpoint_load(found, &config, &loaded.net, &state, stderr), 0);
    assert_int_equal(state.step, 12);
    assert_int_equal(state.epoch, 4);
    assert_int_equal(state.seed, 99);
    size_t weight_bytes = (size_t)saved.net.n_weights * sizeof(float);
    assert_memory_equal(loaded.net.weights, saved.net.weights, weight_bytes);
    assert_memory_equal(loaded.adam_m, saved.adam_m, weight_bytes);
    assert_memory_equal(loaded.adam_v, saved.adam_v, weight_bytes);
    assert_int_equal(state.balancer_bytes, sizeof saved.blob);
    assert_memory_equal(state.balancer_state, saved.blob, sizeof saved.blob);
    assert_int_equal(state.n_ranks, 3);
    assert_memory_equal(state.rank_seconds, saved.rank_seconds, sizeof saved.rank_seconds);
    free(state.balancer_state);
    free(state.rank_seconds);

    /* the same file serves as weights-only init */
    model_init_random(&loaded.net, 1234);
    assert_int_equal(checkpoint_load_weights(found, &loaded.net, stderr), 0);
    assert_memory_equal(loaded.net.weights, saved.net.weights, weight_bytes);
    free_state(&saved);
    free_state(&loaded);
    remove_tree(dir);
    free(dir);
}

static void test_atomic_and_resume_selection(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state first;
    make_state(&first, &config, 1, 3);
    assert_int_equal(checkpoint_save(&config, &first.net, &first.state, NULL, 0, stderr), 0);
    char checkpoints[DECK_PATH_MAX + 16];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", dir);
    assert_int_equal(count_files(checkpoints, ".tmp"), 0);

    /* a write that fails (its temporary name is taken by a folder) leaves step 1 intact */
    char blocked[DECK_PATH_MAX + 64];
    snprintf(blocked, sizeof blocked, "%s/step_00000002.h5.tmp", checkpoints);
    assert_int_equal(mkdir(blocked, 0777), 0);
    first.state.step = 2;
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_save(&config, &first.net, &first.state, NULL, 0, errors), 0);
    char *message = captured(errors);
    assert_non_null(strstr(message, "step_00000002.h5.tmp"));
    free(message);
    fclose(errors);

    /* an unreadable newer file is skipped too; resume picks step 1 and says why it skipped the others */
    char garbage[DECK_PATH_MAX + 64];
    snprintf(garbage, sizeof garbage, "%s/step_00000009.h5", checkpoints);
    FILE *junk = fopen(garbage, "w");
    fputs("not hdf5", junk);
    fclose(junk);
    char found[2 * DECK_PATH_MAX];
    FILE *warnings = tmpfile();
    assert_int_equal(checkpoint_find_latest(&config, found, sizeof found, warnings), 1);
    assert_non_null(strstr(found, "step_00000001.h5"));
    message = captured(warnings);
    assert_non_null(strstr(message, "ignoring unreadable checkpoint"));
    assert_non_null(strstr(message, "step_00000009.h5"));
    assert_non_null(strstr(message, "ignoring incomplete checkpoint"));
    free(message);
    fclose(warnings);

    checkpoint_state state = {.adam_m = first.adam_m, .adam_v = first.adam_v};
    assert_int_equal(checkpoint_load(found, &config, &first.net, &state, stderr), 0);
    assert_int_equal(state.step, 1);
    free(state.balancer_state);
    free(state.rank_seconds);

    /* once step 1 is truncated too, no checkpoint is readable: an error, not a fresh start */
    assert_int_equal(truncate(found, 4096), 0);
    warnings = tmpfile();
    assert_int_equal(checkpoint_find_latest(&config, found, sizeof found, warnings), -1);
    message = captured(warnings);
    assert_non_null(strstr(message, "none of the 2 checkpoint(s) in"));
    assert_non_null(strstr(message, "can be read"));
    free(message);
    fclose(warnings);
    rmdir(blocked);
    free_state(&first);
    remove_tree(dir);
    free(dir);
}

static void test_keep_newest(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1); /* keep = 2 */
    run_state r;
    make_state(&r, &config, 0, 8);
    for (int64_t step = 10; step <= 40; step += 10) {
        r.state.step = step;
        assert_int_equal(checkpoint_save(&config, &r.net, &r.state, NULL, 0, stderr), 0);
    }
    char checkpoints[DECK_PATH_MAX + 16], path[2 * DECK_PATH_MAX];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", dir);
    assert_int_equal(count_files(checkpoints, ".h5"), 2);
    checkpoint_path(&config, 30, path, sizeof path);
    assert_int_equal(access(path, R_OK), 0);
    checkpoint_path(&config, 40, path, sizeof path);
    assert_int_equal(access(path, R_OK), 0);
    checkpoint_path(&config, 20, path, sizeof path);
    assert_int_not_equal(access(path, R_OK), 0);

    /* a truncated checkpoint neither counts towards keep nor goes: after step 50, steps 30 and 50 (the two
       newest complete ones) and the broken 40 remain */
    checkpoint_path(&config, 40, path, sizeof path);
    assert_int_equal(truncate(path, 4096), 0);
    r.state.step = 50;
    assert_int_equal(checkpoint_save(&config, &r.net, &r.state, NULL, 0, stderr), 0);
    assert_int_equal(count_files(checkpoints, ".h5"), 3);
    for (int64_t step = 30; step <= 50; step += 10) {
        checkpoint_path(&config, step, path, sizeof path);
        assert_int_equal(access(path, R_OK), 0);
    }
    free_state(&r);
    remove_tree(dir);
    free(dir);
}

static void test_rejects_other_model(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck small, wider;
    tiny_deck(&small, dir, 32, 1);
    tiny_deck(&wider, dir, 48, 1);
    run_state saved, other;
    make_state(&saved, &small, 5, 2);
    make_state(&other, &wider, 0, 2);
    char path[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_save(&small, &saved.net, &saved.state, path, sizeof path, stderr), 0);

    /* resume: the recorded dims must match the deck */
    FILE *errors = tmpfile();
    checkpoint_state state = {.adam_m = other.adam_m, .adam_v = other.adam_v};
    assert_int_not_equal(checkpoint_load(path, &wider, &other.net, &state, errors), 0);
    char *message = captured(errors);
    assert_non_null(strstr(message, "model.ffn_dim is 32 in the checkpoint, 48 in the deck"));
    free(message);
    fclose(errors);

    /* init from weights only: the first mis-shaped parameter is named with both shapes */
    errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(path, &other.net, errors), 0);
    message = captured(errors);
    assert_non_null(strstr(message, "blocks.0.ffn.0.weight has shape [32, 16] in the file, the model expects [48, 16]"));
    free(message);
    fclose(errors);

    /* a deeper model: the first parameter the file lacks is named */
    deck deeper;
    tiny_deck(&deeper, dir, 32, 2);
    model deep;
    model_create(&deep, &deeper);
    errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(path, &deep, errors), 0);
    message = captured(errors);
    assert_non_null(strstr(message, "missing dataset /blocks.1."));
    free(message);
    fclose(errors);
    model_free(&deep);

    /* not a file at all */
    errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights("/nonexistent/weights.h5", &other.net, errors), 0);
    message = captured(errors);
    assert_non_null(strstr(message, "/nonexistent/weights.h5: cannot open ([model] init): No such file or directory"));
    free(message);
    fclose(errors);
    free_state(&saved);
    free_state(&other);
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_atomic_and_resume_selection),
        cmocka_unit_test(test_keep_newest),
        cmocka_unit_test(test_rejects_other_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
