/* test_safetensors.c — safetensors in and out: checkpoint -> Wan / diffusers safetensors -> [model] init -> checkpoint to the bit, sharded sets, folders, bf16 export, bf16/fp16 input, and damaged, truncated, incomplete, mis-shaped and non-finite files refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "checkpoint_test_util.h"

#include "core/check.h"
#include "core/rng.h"
#include "deck/deck.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/wan_names.h"
#include "train/checkpoint.h"
#include "train/export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_SIZE (2 * DECK_PATH_MAX)

static void tiny_deck(deck *config, const char *run_dir)
{
    char dir_key[DECK_PATH_MAX + 16];
    snprintf(dir_key, sizeof dir_key, "run.dir=%s", run_dir);
    char *overrides[] = {dir_key, "model.ffn_dim=32", "model.num_layers=2", "model.dim=16", "model.num_heads=2",
                         "model.text_len=8", "model.text_dim=8", "model.freq_dim=16"};
    deck_defaults(config);
    assert_int_equal(deck_load(config, NULL, (int)(sizeof overrides / sizeof overrides[0]), overrides, stderr), 0);
}

static char *make_dir(void)
{
    char *dir = strdup("/tmp/aldit-test-safetensors-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_tree(const char *dir)
{
    char command[PATH_SIZE + 16];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    assert_int_equal(system(command), 0);
}

/* Every value random and non-zero (so that a tensor read from the wrong place shows), from `seed`. */
static void fill(float *values, int64_t n, uint64_t seed)
{
    uint64_t stream = seed;
    for (int64_t i = 0; i < n; i++) values[i] = (float)rng_normal(&stream);
}

/* A complete checkpoint of `config` at step 7 with weights `w` and EMA `ema` (moments random). */
static void write_checkpoint(const deck *config, const model *table, const float *w, const float *ema, char *path)
{
    const unsigned groups = CHECKPOINT_TRAINING_GROUPS | CHECKPOINT_GROUP_BIT(CHECKPOINT_EMA);
    checkpoint_writer *writer = checkpoint_writer_open(config, table, 7, groups, 64, stderr);
    assert_non_null(writer);
    float *moment = malloc((size_t)table->n_weights * sizeof(float));
    fill(moment, table->n_weights, 5);
    for (int p = 0; p < table->n_params; p++) {
        const param_info *param = &table->params[p];
        const float *sources[] = {w, moment, moment, ema};
        for (int g = 0; g < CHECKPOINT_N_GROUPS; g++)
            assert_int_equal(checkpoint_write_tensor(writer, (checkpoint_group)g, param->name, sources[g] + param->offset), 0);
    }
    free(moment);
    double seconds[1] = {1.0};
    unsigned char blob[4] = {1, 2, 3, 4};
    checkpoint_state state = {.step = 7, .epoch = 1, .seed = 3, .balancer_state = blob, .balancer_bytes = 4,
                              .rank_seconds = seconds, .n_ranks = 1};
    assert_int_equal(checkpoint_write_state(writer, &state), 0);
    assert_int_equal(checkpoint_writer_commit(writer, path, PATH_SIZE), 0);
}

static char *read_whole(const char *path, long *size)
{
    FILE *in = fopen(path, "rb");
    assert_non_null(in);
    fseek(in, 0, SEEK_END);
    *size = ftell(in);
    rewind(in);
    char *bytes = malloc((size_t)*size + 1);
    assert_int_equal(fread(bytes, 1, (size_t)*size, in), (size_t)*size);
    fclose(in);
    return bytes;
}

static void assert_same_file(const char *a, const char *b)
{
    long size_a, size_b;
    char *bytes_a = read_whole(a, &size_a), *bytes_b = read_whole(b, &size_b);
    assert_int_equal(size_a, size_b);
    assert_memory_equal(bytes_a, bytes_b, (size_t)size_a);
    free(bytes_a);
    free(bytes_b);
}

/* HDF5 checkpoint -> safetensors (Wan and diffusers names, weights and EMA) -> [model] init -> checkpoint -> the same
   safetensors again: every value equal to the bit, the files byte for byte. */
static void test_round_trip(void **unused)
{
    (void)unused;
    char *dir = make_dir(), run2[PATH_SIZE], path[PATH_SIZE], again[PATH_SIZE], out[PATH_SIZE], out2[PATH_SIZE];
    deck config, config2;
    tiny_deck(&config, dir);
    snprintf(run2, sizeof run2, "%s/run2", dir);
    tiny_deck(&config2, run2);
    model table, loaded;
    model_create_table(&table, &config);
    model_create(&loaded, &config);
    float *w = malloc((size_t)table.n_weights * sizeof(float)), *ema = malloc((size_t)table.n_weights * sizeof(float));
    fill(w, table.n_weights, 11);
    fill(ema, table.n_weights, 12);
    write_checkpoint(&config, &table, w, ema, path);
    for (int names = 0; names < 2; names++) {
        for (int use_ema = 0; use_ema < 2; use_ema++) {
            export_options opts = {.names = (wan_names)names, .ema = use_ema, .dtype = SAFETENSORS_F32};
            snprintf(out, sizeof out, "%s/out-%d-%d", dir, names, use_ema);
            assert_int_equal(export_safetensors(path, &config, &table, &opts, out, NULL, stderr), 0);
            char file[PATH_SIZE + 64];
            snprintf(file, sizeof file, "%s/%s", out, EXPORT_SINGLE_FILE);
            memset(loaded.weights, 0, (size_t)loaded.n_weights * sizeof(float));
            assert_int_equal(checkpoint_load_weights(file, &loaded, stderr), 0);
            assert_memory_equal(loaded.weights, use_ema ? ema : w, (size_t)table.n_weights * sizeof(float));
            /* the names are the format's */
            safetensors *set = safetensors_open(file, stderr);
            assert_non_null(set);
            assert_int_equal(safetensors_count(set), table.n_params);
            assert_non_null(safetensors_find(set, names ? "blocks.1.attn2.to_out.0.weight" : "blocks.1.cross_attn.o.weight"));
            assert_non_null(safetensors_find(set, names ? "proj_out.bias" : "head.head.bias"));
            safetensors_close(set);
            /* the loaded weights saved as a checkpoint and exported again: the same bytes */
            checkpoint_state state = {.step = 1, .seed = 3, .n_ranks = 0};
            float *zeros = calloc((size_t)table.n_weights, sizeof(float));
            state.adam_m = state.adam_v = zeros;
            assert_int_equal(checkpoint_save(&config2, &loaded, &state, again, sizeof again, stderr), 0);
            free(zeros);
            opts.ema = 0;
            snprintf(out2, sizeof out2, "%s/again", dir);
            assert_int_equal(export_safetensors(again, &config2, &table, &opts, out2, NULL, stderr), 0);
            char file2[PATH_SIZE + 64];
            snprintf(file2, sizeof file2, "%s/%s", out2, EXPORT_SINGLE_FILE);
            assert_same_file(file, file2);
            snprintf(file, sizeof file, "%s/%s", out, EXPORT_CONFIG_FILE);
            long size;
            char *text = read_whole(file, &size);
            text[size] = '\0';
            assert_non_null(strstr(text, names ? "\"WanTransformer3DModel\"" : "\"WanModel\""));
            assert_non_null(strstr(text, names ? "\"num_layers\": 2" : "\"num_layers\": 2"));
            free(text);
        }
    }
    free(w);
    free(ema);
    model_free(&table);
    model_free(&loaded);
    remove_tree(dir);
    free(dir);
}

/* Shards of at most 4 KiB with their index, read by the index; an index naming the wrong shard is refused. */
static void test_sharded(void **unused)
{
    (void)unused;
    char *dir = make_dir(), path[PATH_SIZE], out[PATH_SIZE], index[PATH_SIZE + 64];
    deck config;
    tiny_deck(&config, dir);
    model table, loaded;
    model_create_table(&table, &config);
    model_create(&loaded, &config);
    float *w = malloc((size_t)table.n_weights * sizeof(float));
    fill(w, table.n_weights, 21);
    write_checkpoint(&config, &table, w, w, path);
    for (int names = 0; names < 2; names++) {
        export_options opts = {.names = (wan_names)names, .dtype = SAFETENSORS_F32, .shard_bytes = 4096};
        snprintf(out, sizeof out, "%s/sharded-%d", dir, names);
        assert_int_equal(export_safetensors(path, &config, &table, &opts, out, NULL, stderr), 0);
        assert_true(count_files(out, ".safetensors") > 2);
        snprintf(index, sizeof index, "%s/%s", out, EXPORT_INDEX_FILE);
        memset(loaded.weights, 0, (size_t)loaded.n_weights * sizeof(float));
        assert_int_equal(checkpoint_load_weights(index, &loaded, stderr), 0);
        assert_memory_equal(loaded.weights, w, (size_t)table.n_weights * sizeof(float));
        memset(loaded.weights, 0, (size_t)loaded.n_weights * sizeof(float));
        assert_int_equal(checkpoint_load_weights(out, &loaded, stderr), 0); /* the folder: read by its index */
        assert_memory_equal(loaded.weights, w, (size_t)table.n_weights * sizeof(float));
    }
    /* a shard gone: refused naming it */
    char shard[PATH_SIZE + 64], moved[PATH_SIZE + 64];
    snprintf(shard, sizeof shard, "%s/diffusion_pytorch_model-00002-of-%05d.safetensors", out,
             count_files(out, ".safetensors"));
    snprintf(moved, sizeof moved, "%s/moved", dir);
    assert_int_equal(rename(shard, moved), 0);
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(index, &loaded, errors), 0);
    char *gone = captured(errors);
    if (!strstr(gone, shard) || !strstr(gone, "cannot open: No such file or directory"))
        fail_msg("a missing shard, got: %s", gone);
    free(gone);
    fclose(errors);
    assert_int_equal(rename(moved, shard), 0);
    /* the index says blocks.0.modulation is in the first shard, which does not hold it */
    long size;
    char *text = read_whole(index, &size);
    text[size] = '\0';
    char *entry = strstr(text, "\"blocks.0.scale_shift_table\": \"diffusion_pytorch_model-");
    assert_non_null(entry);
    memcpy(strstr(entry, "-of-") - 5, "00001", 5);
    FILE *rewrite = fopen(index, "w");
    fputs(text, rewrite);
    fclose(rewrite);
    free(text);
    errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(index, &loaded, errors), 0);
    char *message = captured(errors);
    assert_non_null(strstr(message, "the index names tensor blocks.0.scale_shift_table in "));
    assert_non_null(strstr(message, "00001-of-"));
    free(message);
    fclose(errors);
    free(w);
    model_free(&table);
    model_free(&loaded);
    remove_tree(dir);
    free(dir);
}

/* --dtype bf16: every value rounded to bf16 (within 2^-8 relative, low 16 bits zero), read back through a folder
   holding the single file; a folder with neither file nor index is refused naming both. */
static void test_bf16_and_folders(void **unused)
{
    (void)unused;
    char *dir = make_dir(), path[PATH_SIZE], out[PATH_SIZE];
    deck config;
    tiny_deck(&config, dir);
    model table, loaded;
    model_create_table(&table, &config);
    model_create(&loaded, &config);
    float *w = malloc((size_t)table.n_weights * sizeof(float));
    fill(w, table.n_weights, 41);
    write_checkpoint(&config, &table, w, w, path);
    export_options opts = {.names = WAN_NAMES_DIFFUSERS, .dtype = SAFETENSORS_BF16};
    snprintf(out, sizeof out, "%s/bf16", dir);
    assert_int_equal(export_safetensors(path, &config, &table, &opts, out, NULL, stderr), 0);
    assert_int_equal(checkpoint_load_weights(out, &loaded, stderr), 0);
    for (int64_t i = 0; i < table.n_weights; i++) {
        uint32_t bits;
        memcpy(&bits, &loaded.weights[i], sizeof bits);
        assert_int_equal(bits & 0xffffu, 0);
        assert_true(fabsf(loaded.weights[i] - w[i]) <= fabsf(w[i]) * 0x1p-8f);
    }
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_load_weights(dir, &loaded, errors), 0);
    char *message = captured(errors);
    assert_non_null(strstr(message, "a folder without diffusion_pytorch_model.safetensors or "
                                    "diffusion_pytorch_model.safetensors.index.json"));
    free(message);
    fclose(errors);
    free(w);
    model_free(&table);
    model_free(&loaded);
    remove_tree(dir);
    free(dir);
}

/* A safetensors file of the table's tensors under `naming`, with values w, less parameter `skip`, parameter `reshape`
   as [1, n]. */
static void write_file(const char *path, const model *table, const float *w, const char *skip, const char *reshape,
                       wan_names naming)
{
    int n = 0;
    const char **names = calloc((size_t)table->n_params, sizeof *names);
    char(*mapped)[160] = calloc((size_t)table->n_params, sizeof *mapped);
    int *ndims = calloc((size_t)table->n_params, sizeof(int));
    int64_t(*shapes)[SAFETENSORS_MAX_NDIM] = calloc((size_t)table->n_params, sizeof *shapes);
    const float **values = malloc((size_t)table->n_params * sizeof *values);
    for (int p = 0; p < table->n_params; p++) {
        const param_info *param = &table->params[p];
        if (skip && strcmp(param->name, skip) == 0) continue;
        assert_int_equal(wan_name_in(naming, param->name, mapped[n], sizeof mapped[n]), 0);
        names[n] = mapped[n];
        ndims[n] = param->ndim;
        for (int d = 0; d < param->ndim; d++) shapes[n][d] = param->shape[d];
        if (reshape && strcmp(param->name, reshape) == 0) shapes[n][0] = 1, shapes[n][1] = param->n_elements;
        values[n++] = w + param->offset;
    }
    safetensors_writer *writer = safetensors_writer_open(path, n, names, ndims, (const int64_t(*)[SAFETENSORS_MAX_NDIM])shapes,
                                                         SAFETENSORS_F32, stderr);
    assert_non_null(writer);
    for (int i = 0; i < n; i++) assert_int_equal(safetensors_writer_put(writer, values[i]), 0);
    assert_int_equal(safetensors_writer_close(writer), 0);
    free(names);
    free(mapped);
    free(ndims);
    free(shapes);
    free(values);
}

/* The message of a refused [model] init, from both --check's reading and the load. */
static char *refusal(const char *path, model *m)
{
    FILE *errors = tmpfile();
    assert_int_not_equal(checkpoint_check_weights(path, m, errors), 0);
    assert_int_not_equal(checkpoint_load_weights(path, m, errors), 0);
    char *message = captured(errors);
    fclose(errors);
    return message;
}

static void assert_refused(const char *path, model *m, const char *expected)
{
    char *message = refusal(path, m);
    if (!strstr(message, expected) || !strstr(message, path))
        fail_msg("expected \"%s\" naming %s, got: %s", expected, path, message);
    free(message);
}

static void test_refusals(void **unused)
{
    (void)unused;
    char *dir = make_dir(), path[PATH_SIZE];
    deck config;
    tiny_deck(&config, dir);
    model m;
    model_create(&m, &config);
    float *w = malloc((size_t)m.n_weights * sizeof(float));
    fill(w, m.n_weights, 31);
    snprintf(path, sizeof path, "%s/init.safetensors", dir);

    write_file(path, &m, w, "blocks.1.ffn.2.bias", NULL, WAN_NAMES_WAN);
    assert_refused(path, &m, "missing tensor blocks.1.ffn.2.bias (parameter blocks.1.ffn.2.bias; the file has Wan names)");

    write_file(path, &m, w, NULL, "blocks.0.ffn.0.weight", WAN_NAMES_WAN);
    assert_refused(path, &m, "parameter blocks.0.ffn.0.weight (tensor blocks.0.ffn.0.weight) has shape [1, 512] in the "
                             "file, the model expects [32, 16]");

    const param_info *ffn = model_find_param(&m, "blocks.0.ffn.0.weight");
    float kept = w[ffn->offset + 55];
    w[ffn->offset + 55] = NAN;
    write_file(path, &m, w, NULL, NULL, WAN_NAMES_WAN);
    assert_refused(path, &m, "parameter blocks.0.ffn.0.weight has a non-finite value (nan) at [3, 7] (element 55)");
    w[ffn->offset + 55] = kept;

    /* truncated: the last tensor's data is cut */
    write_file(path, &m, w, NULL, NULL, WAN_NAMES_WAN);
    struct stat info;
    assert_int_equal(stat(path, &info), 0);
    assert_int_equal(truncate(path, info.st_size - 10), 0);
    assert_refused(path, &m, "truncated: the data of tensor head.head.bias ends at byte");

    /* a damaged header: a character of the JSON changed in the entry of blocks.0.ffn.0.bias */
    write_file(path, &m, w, NULL, NULL, WAN_NAMES_WAN);
    FILE *file = fopen(path, "r+b");
    char head[4096] = "";
    assert_true(fread(head, 1, sizeof head - 1, file) > 0);
    const char *entry = strstr(head + 8, "\"blocks.0.ffn.0.bias\":{");
    assert_non_null(entry);
    fseek(file, strstr(entry, "\"shape\":[") - head + 8, SEEK_SET);
    fputc('}', file);
    fclose(file);
    assert_refused(path, &m, "damaged safetensors header: ");
    assert_refused(path, &m, ", in the entry of tensor blocks.0.ffn.0.bias)");

    /* a header whose offsets do not match the shape */
    file = fopen(path, "wb");
    const char header[] = "{\"patch_embedding.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}";
    uint64_t length = sizeof header - 1;
    fwrite(&length, 8, 1, file);
    fwrite(header, 1, length, file);
    for (int i = 0; i < 24; i++) fputc(0, file);
    fclose(file);
    assert_refused(path, &m, "tensor patch_embedding.weight: data_offsets span 20 bytes, shape and dtype F32 need 24");

    /* diffusers names: the missing tensor, the shape and the NaN named by both names */
    write_file(path, &m, w, "blocks.1.ffn.2.bias", NULL, WAN_NAMES_DIFFUSERS);
    assert_refused(path, &m, "missing tensor blocks.1.ffn.net.2.bias (parameter blocks.1.ffn.2.bias; the file has "
                             "diffusers names)");
    write_file(path, &m, w, NULL, "blocks.0.ffn.0.weight", WAN_NAMES_DIFFUSERS);
    assert_refused(path, &m, "parameter blocks.0.ffn.0.weight (tensor blocks.0.ffn.net.0.proj.weight) has shape [1, 512]");
    w[ffn->offset + 55] = INFINITY;
    write_file(path, &m, w, NULL, NULL, WAN_NAMES_DIFFUSERS);
    assert_refused(path, &m, "parameter blocks.0.ffn.0.weight (tensor blocks.0.ffn.net.0.proj.weight) has a non-finite "
                             "value (inf) at [3, 7] (element 55)");
    w[ffn->offset + 55] = kept;
    write_file(path, &m, w, NULL, NULL, WAN_NAMES_DIFFUSERS);
    assert_int_equal(checkpoint_load_weights(path, &m, stderr), 0);
    assert_memory_equal(m.weights, w, (size_t)m.n_weights * sizeof(float));
    free(w);
    model_free(&m);
    remove_tree(dir);
    free(dir);
}

/* bf16 written rounds to nearest even and reads back exactly; F16 and F64 input convert to fp32. */
static void test_dtypes(void **unused)
{
    (void)unused;
    char *dir = make_dir(), path[PATH_SIZE];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    const char *names[] = {"a"};
    int ndims[] = {1};
    const int64_t shapes[1][SAFETENSORS_MAX_NDIM] = {{4}};
    const float values[] = {1.0f, 1.00390625f, 1.01171875f, -3.5e-3f}; /* 1 + 2^-8 ties down to even; 1 + 3*2^-8 up */
    safetensors_writer *writer = safetensors_writer_open(path, 1, names, ndims, shapes, SAFETENSORS_BF16, stderr);
    assert_int_equal(safetensors_writer_put(writer, values), 0);
    assert_int_equal(safetensors_writer_close(writer), 0);
    safetensors *set = safetensors_open(path, stderr);
    float back[4];
    assert_int_equal(safetensors_read_f32(set, safetensors_find(set, "a"), back, stderr), 0);
    assert_true(back[0] == 1.0f && back[1] == 1.0f && back[2] == 1.015625f);
    assert_float_equal(back[3], -3.5e-3f, 2e-5);
    safetensors_close(set);

    FILE *file = fopen(path, "wb");
    const char header[] = "{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]},"
                          "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[10,18]},"
                          "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[18,22]}}";
    uint64_t length = sizeof header - 1;
    const uint16_t halves[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
    const double wide = 0.1;
    fwrite(&length, 8, 1, file);
    fwrite(header, 1, length, file);
    fwrite(halves, 2, 5, file);
    fwrite(&wide, 8, 1, file);
    fwrite(&(int32_t){7}, 4, 1, file);
    fclose(file);
    set = safetensors_open(path, stderr);
    assert_non_null(set);
    float h[5], d;
    assert_int_equal(safetensors_read_f32(set, safetensors_find(set, "h"), h, stderr), 0);
    assert_true(h[0] == 1.0f && h[1] == -2.0f && h[2] == 65504.0f && h[3] == ldexpf(1.0f, -24) && isinf(h[4]));
    assert_int_equal(safetensors_read_f32(set, safetensors_find(set, "d"), &d, stderr), 0);
    assert_true(d == 0.1f);
    FILE *errors = tmpfile();
    assert_int_not_equal(safetensors_read_f32(set, safetensors_find(set, "i"), &d, errors), 0);
    char *message = captured(errors);
    assert_non_null(strstr(message, "tensor i is I32, not floating point"));
    free(message);
    fclose(errors);
    safetensors_close(set);
    remove_tree(dir);
    free(dir);
}

/* The name table both ways, on every parameter of a model, and a name it does not know. */
static void test_names(void **unused)
{
    (void)unused;
    deck config;
    tiny_deck(&config, "/tmp");
    model table;
    model_create_table(&table, &config);
    for (int p = 0; p < table.n_params; p++) {
        char diffusers[160], back[160];
        assert_int_equal(wan_name_to_diffusers(table.params[p].name, diffusers, sizeof diffusers), 0);
        assert_true(wan_name_is_diffusers(diffusers) || strcmp(diffusers, "patch_embedding.weight") == 0 ||
                    strcmp(diffusers, "patch_embedding.bias") == 0 || strstr(diffusers, "norm2."));
        assert_int_equal(wan_name_from_diffusers(diffusers, back, sizeof back), 0);
        assert_string_equal(back, table.params[p].name);
    }
    char out[160];
    assert_int_equal(wan_name_to_diffusers("blocks.3.self_attn.o.weight", out, sizeof out), 0);
    assert_string_equal(out, "blocks.3.attn1.to_out.0.weight");
    assert_int_equal(wan_name_to_diffusers("head.modulation", out, sizeof out), 0);
    assert_string_equal(out, "scale_shift_table");
    assert_int_equal(wan_name_from_diffusers("blocks.12.ffn.net.0.proj.bias", out, sizeof out), 0);
    assert_string_equal(out, "blocks.12.ffn.0.bias");
    assert_int_not_equal(wan_name_to_diffusers("img_emb.proj.0.weight", out, sizeof out), 0);
    model_free(&table);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),      cmocka_unit_test(test_dtypes),  cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_sharded),    cmocka_unit_test(test_refusals), cmocka_unit_test(test_bf16_and_folders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
