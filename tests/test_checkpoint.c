/* test_checkpoint.c — checkpoint round trip, tensor-by-tensor API, atomic writes, keep-K pruning, resume selection, model, eps and shape checks, checksums, finite init. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "checkpoint_test_util.h"

#include "train/checkpoint.h"
#include "core/check.h"
#include "deck/deck.h"
#include "model/model.h"
#include "core/rng.h"

#include <dirent.h>
#include <hdf5.h>
#include <math.h>
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
    assert_null(state.fp8_state); /* a bf16 run's checkpoint has no /run/fp8_scaling */
    assert_int_equal(state.fp8_bytes, 0);
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

/* One stored bit of dataset `name` flipped in place: bit `bit` of byte `byte` of its first chunk (or, for a
   contiguous dataset, of its data), found with HDF5 and written with plain stdio. */
static void flip_stored_bit(const char *path, const char *name, long byte, int bit)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t set = H5Dopen2(file, name, H5P_DEFAULT);
    assert_true(set >= 0);
    hid_t create = H5Dget_create_plist(set);
    haddr_t address = HADDR_UNDEF;
    if (H5Pget_layout(create) == H5D_CHUNKED) {
        hsize_t offset[H5S_MAX_RANK], n_bytes = 0;
        unsigned filter_mask = 0;
        hid_t space = H5Dget_space(set);
        assert_true(H5Dget_chunk_info(set, space, 0, offset, &filter_mask, &address, &n_bytes) >= 0);
        H5Sclose(space);
        assert_true((hsize_t)byte + 4 < n_bytes); /* inside the data, not the checksum after it */
    } else {
        address = H5Dget_offset(set);
    }
    assert_true(address != HADDR_UNDEF);
    H5Pclose(create);
    H5Dclose(set);
    H5Fclose(file);
    FILE *raw = fopen(path, "r+b");
    assert_non_null(raw);
    assert_int_equal(fseek(raw, (long)address + byte, SEEK_SET), 0);
    int value = fgetc(raw);
    assert_true(value >= 0);
    assert_int_equal(fseek(raw, (long)address + byte, SEEK_SET), 0);
    assert_int_equal(fputc(value ^ (1 << bit), raw), value ^ (1 << bit));
    assert_int_equal(fclose(raw), 0);
}

static void copy_file(const char *from, const char *to)
{
    char command[8 * DECK_PATH_MAX];
    snprintf(command, sizeof command, "cp '%s' '%s'", from, to);
    assert_int_equal(system(command), 0);
}

/* checkpoint_load's message for `path` (expected to fail), as a string (caller frees). */
static char *load_failure(const char *path, const deck *config, run_state *into)
{
    FILE *errors = tmpfile();
    checkpoint_state state = {.adam_m = into->adam_m, .adam_v = into->adam_v};
    assert_int_not_equal(checkpoint_load(path, config, &into->net, &state, errors), 0);
    free(state.balancer_state);
    free(state.rank_seconds);
    char *message = captured(errors);
    fclose(errors);
    return message;
}

static void test_tensor_api(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state saved;
    make_state(&saved, &config, 7, 41);
    model table; /* names and shapes only, as a sharded writer has them */
    model_create_table(&table, &config);
    assert_null(table.weights);

    /* each tensor from its own buffer, parameters in reverse order and the groups interleaved */
    checkpoint_writer *w = checkpoint_writer_open(&config, &table, 7, CHECKPOINT_TRAINING_GROUPS, 64, stderr);
    assert_non_null(w);
    for (int p = table.n_params - 1; p >= 0; p--) {
        const param_info *param = &table.params[p];
        float *copy = malloc((size_t)param->n_elements * sizeof(float));
        const float *sources[] = {saved.adam_v, saved.net.weights, saved.adam_m};
        const checkpoint_group groups[] = {CHECKPOINT_ADAM_V, CHECKPOINT_WEIGHTS, CHECKPOINT_ADAM_M};
        for (int g = 0; g < 3; g++) {
            memcpy(copy, sources[g] + param->offset, (size_t)param->n_elements * sizeof(float));
            assert_int_equal(checkpoint_write_tensor(w, groups[g], param->name, copy), 0);
        }
        free(copy);
    }
    unsigned char fp8[37]; /* an FP8 scaling state: an opaque blob under /run/fp8_scaling */
    for (size_t i = 0; i < sizeof fp8; i++) fp8[i] = (unsigned char)(3 * i + 1);
    saved.state.fp8_state = fp8;
    saved.state.fp8_bytes = sizeof fp8;
    assert_int_equal(checkpoint_write_state(w, &saved.state), 0);
    char path[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_writer_commit(w, path, sizeof path), 0);

    /* the whole-model load sees what the whole-model save would have written */
    run_state loaded;
    make_state(&loaded, &config, 0, 5);
    checkpoint_state state = {.adam_m = loaded.adam_m, .adam_v = loaded.adam_v};
    assert_int_equal(checkpoint_load(path, &config, &loaded.net, &state, stderr), 0);
    size_t weight_bytes = (size_t)saved.net.n_weights * sizeof(float);
    assert_memory_equal(loaded.net.weights, saved.net.weights, weight_bytes);
    assert_memory_equal(loaded.adam_m, saved.adam_m, weight_bytes);
    assert_memory_equal(loaded.adam_v, saved.adam_v, weight_bytes);
    assert_int_equal(state.step, 7);
    assert_memory_equal(state.balancer_state, saved.blob, sizeof saved.blob);
    assert_int_equal(state.fp8_bytes, sizeof fp8);
    assert_memory_equal(state.fp8_state, fp8, sizeof fp8);
    free(state.balancer_state);
    free(state.rank_seconds);
    free(state.fp8_state);

    /* tensor by tensor back, with the misuses named */
    checkpoint_reader *r = checkpoint_reader_open(path, &config, &table, stderr);
    assert_non_null(r);
    assert_true(checkpoint_reader_has(r, CHECKPOINT_ADAM_M));
    assert_false(checkpoint_reader_has(r, CHECKPOINT_EMA));
    const param_info *ffn = model_find_param(&table, "blocks.0.ffn.0.weight");
    assert_non_null(ffn);
    float *values = malloc((size_t)ffn->n_elements * sizeof(float));
    assert_int_equal(checkpoint_read_tensor(r, CHECKPOINT_ADAM_V, ffn->name, values), 0);
    assert_memory_equal(values, saved.adam_v + ffn->offset, (size_t)ffn->n_elements * sizeof(float));
    FILE *errors = tmpfile();
    checkpoint_reader *quiet = checkpoint_reader_open(path, &config, &table, errors);
    assert_int_not_equal(checkpoint_read_tensor(quiet, CHECKPOINT_EMA, ffn->name, values), 0);
    assert_int_not_equal(checkpoint_read_tensor(quiet, CHECKPOINT_WEIGHTS, "blocks.9.ffn.0.weight", values), 0);
    checkpoint_reader_close(quiet);
    char *message = captured(errors);
    assert_non_null(strstr(message, "missing group /ema (needed for /ema/blocks.0.ffn.0.weight)"));
    assert_non_null(strstr(message, "/blocks.9.ffn.0.weight: the model has no such parameter"));
    free(message);
    fclose(errors);
    checkpoint_state read_back = {0};
    assert_int_equal(checkpoint_read_state(r, &read_back), 0);
    assert_int_equal(read_back.seed, 41);
    assert_int_equal(read_back.n_ranks, 3);
    assert_int_equal(read_back.fp8_bytes, sizeof fp8);
    free(read_back.balancer_state);
    free(read_back.rank_seconds);
    free(read_back.fp8_state);
    checkpoint_reader_close(r);
    free(values);

    /* a writer that misses one moment does not commit: no step 8, no .tmp, and with keep = 1 step 7 stays */
    config.checkpoint.keep = 1;
    errors = tmpfile();
    w = checkpoint_writer_open(&config, &table, 8, CHECKPOINT_TRAINING_GROUPS, 64, errors);
    assert_non_null(w);
    for (int p = 0; p < table.n_params; p++) {
        const param_info *param = &table.params[p];
        assert_int_equal(checkpoint_write_tensor(w, CHECKPOINT_WEIGHTS, param->name, saved.net.weights + param->offset), 0);
        assert_int_equal(checkpoint_write_tensor(w, CHECKPOINT_ADAM_M, param->name, saved.adam_m + param->offset), 0);
        if (p != 2)
            assert_int_equal(checkpoint_write_tensor(w, CHECKPOINT_ADAM_V, param->name, saved.adam_v + param->offset), 0);
    }
    saved.state.step = 8;
    assert_int_equal(checkpoint_write_state(w, &saved.state), 0);
    assert_int_not_equal(checkpoint_writer_commit(w, NULL, 0), 0);
    message = captured(errors);
    char expected[256];
    snprintf(expected, sizeof expected, "not committed: tensor /optim/v/%s was not written", table.params[2].name);
    assert_non_null(strstr(message, expected));
    free(message);
    fclose(errors);
    char checkpoints[DECK_PATH_MAX + 16], other[2 * DECK_PATH_MAX];
    snprintf(checkpoints, sizeof checkpoints, "%s/checkpoints", dir);
    assert_int_equal(count_files(checkpoints, ".tmp"), 0);
    assert_int_equal(count_files(checkpoints, ".h5"), 1);
    assert_int_equal(access(path, R_OK), 0);

    /* misuses fail the writer (later calls do nothing), abort leaves nothing behind */
    errors = tmpfile();
    w = checkpoint_writer_open(&config, &table, 9, CHECKPOINT_GROUP_BIT(CHECKPOINT_WEIGHTS), 0, errors);
    assert_non_null(w);
    const param_info *first = &table.params[0];
    assert_int_equal(checkpoint_write_tensor(w, CHECKPOINT_WEIGHTS, first->name, saved.net.weights), 0);
    assert_int_not_equal(checkpoint_write_tensor(w, CHECKPOINT_WEIGHTS, first->name, saved.net.weights), 0);
    assert_int_not_equal(checkpoint_write_tensor(w, CHECKPOINT_ADAM_M, first->name, saved.adam_m), 0);
    checkpoint_writer_abort(w);
    message = captured(errors);
    snprintf(expected, sizeof expected, "tensor /%s written twice", first->name);
    assert_non_null(strstr(message, expected));
    assert_null(strstr(message, "not announced")); /* only the first failure is reported */
    free(message);
    fclose(errors);
    errors = tmpfile();
    w = checkpoint_writer_open(&config, &table, 9, CHECKPOINT_GROUP_BIT(CHECKPOINT_WEIGHTS), 0, errors);
    assert_int_not_equal(checkpoint_write_tensor(w, CHECKPOINT_ADAM_M, first->name, saved.adam_m), 0);
    checkpoint_writer_abort(w);
    message = captured(errors);
    assert_non_null(strstr(message, "its group was not announced"));
    free(message);
    fclose(errors);
    checkpoint_path(&config, 9, other, sizeof other);
    assert_int_not_equal(access(other, F_OK), 0);
    assert_int_equal(count_files(checkpoints, ".tmp"), 0);
    assert_int_equal(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0); /* nothing left open in HDF5 */

    model_free(&table);
    free_state(&saved);
    free_state(&loaded);
    remove_tree(dir);
    free(dir);
}

/* One flipped bit in a stored weight or moment fails the load and names the tensor; without the
   filter (older files) the same flip loads unnoticed. */
static void test_checksum_names_damaged_tensor(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state saved, loaded;
    make_state(&saved, &config, 3, 17);
    make_state(&loaded, &config, 0, 5);
    char path[2 * DECK_PATH_MAX], damaged[2 * DECK_PATH_MAX + 16];
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);
    snprintf(damaged, sizeof damaged, "%s/damaged.h5", dir);

    /* the lowest mantissa bit of element 5 of a weight: a change of one ulp */
    copy_file(path, damaged);
    flip_stored_bit(damaged, "blocks.0.ffn.0.weight", 5 * 4 + 0, 0);
    char *message = load_failure(damaged, &config, &loaded);
    assert_non_null(strstr(message, damaged));
    assert_non_null(strstr(message, "tensor /blocks.0.ffn.0.weight is damaged: its Fletcher-32 checksum"));
    free(message);
    /* the same file as [model] init: the load and the --check both name it */
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(damaged, &loaded.net, errors), 0);
    model table;
    model_create_table(&table, &config);
    assert_int_not_equal(checkpoint_check_weights(damaged, &table, errors), 0);
    message = captured(errors);
    const char *hit = strstr(message, "tensor /blocks.0.ffn.0.weight is damaged");
    assert_non_null(hit);
    assert_non_null(strstr(hit + 1, "tensor /blocks.0.ffn.0.weight is damaged"));
    free(message);
    fclose(errors);

    /* an exponent bit (bit 30) of element 3 of a second moment */
    copy_file(path, damaged);
    flip_stored_bit(damaged, "optim/v/blocks.0.self_attn.q.weight", 3 * 4 + 3, 6);
    message = load_failure(damaged, &config, &loaded);
    assert_non_null(strstr(message, "tensor /optim/v/blocks.0.self_attn.q.weight is damaged"));
    free(message);
    /* a weights-only read never touches the moments */
    assert_int_equal(checkpoint_load_weights(damaged, &loaded.net, stderr), 0);

    /* and a bit of the balancer state */
    copy_file(path, damaged);
    flip_stored_bit(damaged, "run/balancer_state", 11, 2);
    message = load_failure(damaged, &config, &loaded);
    assert_non_null(strstr(message, "reading /run/balancer_state failed: Fletcher-32 checksum mismatch"));
    free(message);

    /* the undamaged original still loads */
    checkpoint_state state = {.adam_m = loaded.adam_m, .adam_v = loaded.adam_v};
    assert_int_equal(checkpoint_load(path, &config, &loaded.net, &state, stderr), 0);
    free(state.balancer_state);
    free(state.rank_seconds);
    model_free(&table);
    free_state(&saved);
    free_state(&loaded);
    remove_tree(dir);
    free(dir);
}

/* Every dataset of `path` rewritten contiguous (no filter) and /model's eps removed: a checkpoint as
   aldit wrote them before checksums and eps were recorded. */
typedef struct { char names[512][128]; int n_names; } dataset_list;

static herr_t list_dataset(hid_t root, const char *name, const H5O_info_t *info, void *data)
{
    (void)root;
    dataset_list *list = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    assert_true(list->n_names < 512);
    snprintf(list->names[list->n_names++], sizeof list->names[0], "%s", name);
    return 0;
}

static void make_contiguous(hid_t file, const char *name)
{
    hid_t set = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t space = H5Dget_space(set), type = H5Dget_type(set);
    size_t n_bytes = (size_t)H5Sget_simple_extent_npoints(space) * H5Tget_size(type);
    void *values = malloc(n_bytes > 0 ? n_bytes : 1);
    if (n_bytes > 0) assert_true(H5Dread(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    H5Dclose(set);
    assert_true(H5Ldelete(file, name, H5P_DEFAULT) >= 0);
    set = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(set >= 0);
    if (n_bytes > 0) assert_true(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    free(values);
    H5Dclose(set);
    H5Tclose(type);
    H5Sclose(space);
}

static void make_legacy(const char *path)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(file >= 0);
    dataset_list *list = calloc(1, sizeof *list);
    assert_true(H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, list_dataset, list) >= 0);
    assert_true(list->n_names > 10);
    for (int i = 0; i < list->n_names; i++) make_contiguous(file, list->names[i]);
    free(list);
    assert_true(H5Adelete_by_name(file, "model", "eps", H5P_DEFAULT) >= 0);
    H5Fclose(file);
}

static void test_legacy_and_eps(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config, other_eps;
    tiny_deck(&config, dir, 32, 1);
    tiny_deck(&other_eps, dir, 32, 1);
    other_eps.model.eps = 1e-5;
    run_state saved, loaded;
    make_state(&saved, &config, 4, 23);
    make_state(&loaded, &config, 0, 5);
    char path[2 * DECK_PATH_MAX], legacy[2 * DECK_PATH_MAX + 16];
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);

    /* resuming with another eps is refused with both values */
    char *message = load_failure(path, &other_eps, &loaded);
    assert_non_null(strstr(message, "model.eps is 1e-06 in the checkpoint, 1e-05 in the deck"));
    free(message);

    /* a checkpoint without checksums and without eps still loads, under any eps, exactly */
    snprintf(legacy, sizeof legacy, "%s/legacy.h5", dir);
    copy_file(path, legacy);
    make_legacy(legacy);
    checkpoint_state state = {.adam_m = loaded.adam_m, .adam_v = loaded.adam_v};
    assert_int_equal(checkpoint_load(legacy, &other_eps, &loaded.net, &state, stderr), 0);
    size_t weight_bytes = (size_t)saved.net.n_weights * sizeof(float);
    assert_memory_equal(loaded.net.weights, saved.net.weights, weight_bytes);
    assert_memory_equal(loaded.adam_v, saved.adam_v, weight_bytes);
    assert_memory_equal(state.balancer_state, saved.blob, sizeof saved.blob);
    free(state.balancer_state);
    free(state.rank_seconds);
    /* ... and there a flipped bit goes unnoticed: what the checksums are for */
    flip_stored_bit(legacy, "blocks.0.ffn.0.weight", 5 * 4, 0);
    assert_int_equal(checkpoint_load_weights(legacy, &loaded.net, stderr), 0);
    const param_info *ffn = model_find_param(&saved.net, "blocks.0.ffn.0.weight");
    assert_true(loaded.net.weights[ffn->offset + 5] != saved.net.weights[ffn->offset + 5]);
    free_state(&saved);
    free_state(&loaded);
    remove_tree(dir);
    free(dir);
}

/* An init file (contiguous datasets at the root, as converted weights are) with a NaN or an Inf: the
   check and the load name the parameter and the index. */
static void write_init_file(const char *path, const model *m, const float *weights)
{
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0);
    for (int p = 0; p < m->n_params; p++) {
        const param_info *param = &m->params[p];
        hsize_t dims[MODEL_MAX_NDIM];
        for (int d = 0; d < param->ndim; d++) dims[d] = (hsize_t)param->shape[d];
        hid_t space = H5Screate_simple(param->ndim, dims, NULL);
        hid_t set = H5Dcreate2(file, param->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, weights + param->offset) >= 0);
        H5Dclose(set);
        H5Sclose(space);
    }
    H5Fclose(file);
}

static void test_init_must_be_finite(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state r;
    make_state(&r, &config, 0, 31);
    model table;
    model_create_table(&table, &config);
    char path[DECK_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/init.h5", dir);
    write_init_file(path, &r.net, r.net.weights);
    assert_int_equal(checkpoint_check_weights(path, &table, stderr), 0);

    const param_info *ffn = model_find_param(&table, "blocks.0.ffn.0.weight"); /* [32, 16] */
    const float bad[] = {NAN, INFINITY};
    const char *const expected[] = {
        "parameter blocks.0.ffn.0.weight has a non-finite value (nan) at [3, 7] (element 55)",
        "parameter blocks.0.ffn.0.weight has a non-finite value (inf) at [3, 7] (element 55)"};
    for (int i = 0; i < 2; i++) {
        float kept = r.net.weights[ffn->offset + 3 * 16 + 7];
        r.net.weights[ffn->offset + 3 * 16 + 7] = bad[i];
        write_init_file(path, &r.net, r.net.weights);
        r.net.weights[ffn->offset + 3 * 16 + 7] = kept;
        FILE *errors = tmpfile();
        assert_int_not_equal(checkpoint_check_weights(path, &table, errors), 0);
        assert_int_not_equal(checkpoint_load_weights(path, &r.net, errors), 0);
        char *message = captured(errors);
        const char *hit = strstr(message, expected[i]);
        assert_non_null(hit);
        assert_non_null(strstr(hit + 1, expected[i])); /* from both */
        assert_non_null(strstr(message, path));
        free(message);
        fclose(errors);
    }
    model_free(&table);
    free_state(&r);
    remove_tree(dir);
    free(dir);
}

/* issue 35: a checkpoint to resume with a non-finite moment or EMA value is refused naming the tensor (at load and
   by --check's checkpoint_check_resumable); an EMA that a deck with ema_decay off would drop is refused naming the
   ema_decay to set (accepted with ema_drop); another text_padding or seed is named. */
static char *resumable_failure(const char *path, const deck *config, const model *table)
{
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_check_resumable(path, config, table, errors), 0);
    char *message = captured(errors);
    fclose(errors);
    return message;
}

/* A checkpoint of run_state r with an EMA (the weights, with `bad` at blocks.0.ffn.0.weight [3, 7]). */
static void write_with_ema(const deck *config, run_state *r, const model *table, float bad, char *path, size_t size)
{
    const unsigned groups = CHECKPOINT_TRAINING_GROUPS | CHECKPOINT_GROUP_BIT(CHECKPOINT_EMA);
    checkpoint_writer *w = checkpoint_writer_open(config, table, r->state.step, groups, 64, stderr);
    assert_non_null(w);
    const param_info *ffn = model_find_param(table, "blocks.0.ffn.0.weight");
    for (int p = 0; p < table->n_params; p++) {
        const param_info *param = &table->params[p];
        const float *sources[] = {r->net.weights, r->adam_m, r->adam_v, r->net.weights};
        for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) {
            float *copy = malloc((size_t)param->n_elements * sizeof(float));
            memcpy(copy, sources[g] + param->offset, (size_t)param->n_elements * sizeof(float));
            if (g == CHECKPOINT_EMA && param == ffn) copy[3 * 16 + 7] = bad;
            assert_int_equal(checkpoint_write_tensor(w, (checkpoint_group)g, param->name, copy), 0);
            free(copy);
        }
    }
    assert_int_equal(checkpoint_write_state(w, &r->state), 0);
    assert_int_equal(checkpoint_writer_commit(w, path, size), 0);
}

static void test_resume_checks(void **unused)
{
    (void)unused;
    char *dir = make_run_dir();
    deck config;
    tiny_deck(&config, dir, 32, 1);
    run_state saved, loaded;
    make_state(&saved, &config, 4, 23);
    make_state(&loaded, &config, 0, 5);
    config.run.seed = 23;
    model table;
    model_create_table(&table, &config);
    const param_info *ffn = model_find_param(&table, "blocks.0.ffn.0.weight"); /* [32, 16] */
    char path[2 * DECK_PATH_MAX];
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);
    assert_int_equal(checkpoint_check_resumable(path, &config, &table, stderr), 0);

    /* another text_padding or seed: named */
    deck other = config;
    other.model.text_padding = TEXT_PADDING_TRIM;
    char *message = resumable_failure(path, &other, &table);
    assert_non_null(strstr(message, "model.text_padding is wan in the checkpoint, trim in the deck"));
    free(message);
    other = config;
    other.run.seed = 24;
    message = resumable_failure(path, &other, &table);
    assert_non_null(strstr(message, "was written with [run] seed = 23, the deck says 24"));
    free(message);

    /* a NaN in a moment: the load and --check name the tensor and where */
    saved.adam_m[ffn->offset + 3 * 16 + 7] = NAN;
    saved.state.step = 5;
    assert_int_equal(checkpoint_save(&config, &saved.net, &saved.state, path, sizeof path, stderr), 0);
    const char *expected = "tensor /optim/m/blocks.0.ffn.0.weight has a non-finite value (nan) at [3, 7] (element 55)";
    message = load_failure(path, &config, &loaded);
    assert_non_null(strstr(message, expected));
    assert_non_null(strstr(message, path));
    free(message);
    message = resumable_failure(path, &config, &table);
    assert_non_null(strstr(message, expected));
    free(message);
    saved.adam_m[ffn->offset + 3 * 16 + 7] = 0.5f;

    /* an Inf in the EMA: named where the deck keeps an EMA */
    config.train.ema_decay = 0.9;
    saved.state.step = 6;
    write_with_ema(&config, &saved, &table, INFINITY, path, sizeof path);
    message = resumable_failure(path, &config, &table);
    assert_non_null(strstr(message, "tensor /ema/blocks.0.ffn.0.weight has a non-finite value (inf) at [3, 7]"));
    free(message);

    /* a finite EMA with ema_decay off: refused naming the run's ema_decay, unless ema_drop */
    saved.state.step = 7;
    write_with_ema(&config, &saved, &table, 0.25f, path, sizeof path);
    assert_int_equal(checkpoint_check_resumable(path, &config, &table, stderr), 0);
    other = config;
    other.train.ema_decay = 0.0;
    message = resumable_failure(path, &other, &table);
    assert_non_null(strstr(message, "holds an EMA of the weights (/ema), but [train] ema_decay is off: resuming would "
                                    "drop it. Set [train] ema_decay = 0.9 (its run's) to keep it, or [train] ema_drop = on"));
    free(message);
    other.train.ema_drop = 1;
    assert_int_equal(checkpoint_check_resumable(path, &other, &table, stderr), 0);

    model_free(&table);
    free_state(&saved);
    free_state(&loaded);
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
        cmocka_unit_test(test_tensor_api),
        cmocka_unit_test(test_checksum_names_damaged_tensor),
        cmocka_unit_test(test_legacy_and_eps),
        cmocka_unit_test(test_init_must_be_finite),
        cmocka_unit_test(test_resume_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
