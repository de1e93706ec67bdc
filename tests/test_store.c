/* test_store.c — cmocka tests of the latent store (conversions, round trips in every precision, the index,
   every error a reader can meet, foreign types, strings and filters, the writer's refusals) and of length
   specs (parser errors with line numbers, weight overflow, seeded draws). */
#include "io/lengths.h"
#include "core/rng.h"
#include "io/store.h"

#include <hdf5.h>
#include <zlib.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* ---- per-test temporary folder in the build directory ------------------------------------------ */

typedef struct { char dir[256]; char path[512]; } test_folder;

static int folder_setup(void **state)
{
    test_folder *folder = calloc(1, sizeof *folder);
    snprintf(folder->dir, sizeof folder->dir, "test_store.tmp.XXXXXX");
    if (!folder || !mkdtemp(folder->dir)) return -1;
    snprintf(folder->path, sizeof folder->path, "%s/store.h5", folder->dir);
    *state = folder;
    return 0;
}

static int folder_teardown(void **state)
{
    test_folder *folder = *state;
    DIR *dir = opendir(folder->dir);
    if (dir) {
        char path[600];
        for (struct dirent *entry = readdir(dir); entry; entry = readdir(dir)) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", folder->dir, entry->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    rmdir(folder->dir);
    free(folder);
    return 0;
}

static const char *top_srcdir(void)
{
    const char *dir = getenv("top_srcdir");
    return dir && dir[0] ? dir : ALDIT_TOP_SRCDIR;
}

/* ---- a store of random samples, kept in memory for comparison -------------------------------------- */

enum { TEXT_DIM = 5, CHANNELS = 3 };

typedef struct {
    int n_samples;
    int32_t frames[64], height[64], width[64], text_len[64];
    float *latent[64], *text[64];
} sample_set;

static void sample_set_make(sample_set *set, int n_samples, uint64_t seed)
{
    uint64_t state = seed;
    set->n_samples = n_samples;
    for (int i = 0; i < n_samples; i++) {
        set->frames[i] = 1 + (int32_t)(rng_next_u64(&state) % 4);
        set->height[i] = 1 + (int32_t)(rng_next_u64(&state) % 9);
        set->width[i] = 1 + (int32_t)(rng_next_u64(&state) % 9);
        set->text_len[i] = 1 + (int32_t)(rng_next_u64(&state) % 7);
        int64_t n_latent = (int64_t)CHANNELS * set->frames[i] * set->height[i] * set->width[i];
        int64_t n_text = (int64_t)set->text_len[i] * TEXT_DIM;
        set->latent[i] = malloc((size_t)n_latent * sizeof(float));
        set->text[i] = malloc((size_t)n_text * sizeof(float));
        for (int64_t j = 0; j < n_latent; j++) set->latent[i][j] = (float)(6.0 * rng_uniform(&state) - 3.0);
        for (int64_t j = 0; j < n_text; j++) set->text[i][j] = (float)rng_normal(&state);
    }
}

static void sample_set_free(sample_set *set)
{
    for (int i = 0; i < set->n_samples; i++) {
        free(set->latent[i]);
        free(set->text[i]);
    }
}

static void write_set(const char *path, const sample_set *set, store_precision precision)
{
    store_writer *writer = store_writer_create(path, TEXT_DIM, precision, stderr);
    assert_non_null(writer);
    for (int i = 0; i < set->n_samples; i++)
        assert_int_equal(store_writer_add(writer, CHANNELS, set->frames[i], set->height[i], set->width[i], set->latent[i],
                                          set->text_len[i], set->text[i]), 0);
    assert_int_equal(store_writer_close(writer), 0);
}

/* Writes a default 12-sample bf16 store at the folder's path. */
static void write_default_store(const test_folder *folder)
{
    sample_set set;
    sample_set_make(&set, 12, 42);
    write_set(folder->path, &set, STORE_BF16);
    sample_set_free(&set);
}

/* store_open must fail and its message must contain every given fragment. */
static void expect_open_error(const char *path, const char *fragment, const char *fragment2)
{
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    store s;
    int status = store_open(&s, path, errors);
    fclose(errors);
    if (status == 0) store_close(&s);
    assert_int_not_equal(status, 0);
    if (!strstr(messages, fragment) || (fragment2 && !strstr(messages, fragment2)))
        fail_msg("message '%s' lacks '%s' / '%s'", messages, fragment, fragment2 ? fragment2 : "");
    free(messages);
}

/* Opens the store read-write with HDF5 directly (to damage it on purpose). */
static hid_t open_rw(const char *path)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(file >= 0);
    return file;
}

/* ---- conversions and checksums ------------------------------------------------------------------ */

static float from_bits(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static void test_bf16_conversion(void **state)
{
    (void)state;
    assert_int_equal(store_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(store_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(store_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie -> even */
    assert_int_equal(store_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie -> even (up) */
    assert_int_equal(store_f32_to_bf16(from_bits(0x3f808001u)), 0x3f81); /* above the tie -> up */
    assert_true(isnan(store_bf16_to_f32(store_f32_to_bf16(NAN))));
    for (uint32_t bits = 0; bits < 0x10000u; bits++) { /* every finite bf16 survives the round trip */
        if ((bits & 0x7f80u) == 0x7f80u) continue;
        assert_int_equal(store_f32_to_bf16(store_bf16_to_f32((uint16_t)bits)), bits);
    }
}

static void test_f16_conversion(void **state)
{
    (void)state;
    assert_int_equal(store_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(store_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(store_f32_to_f16(0.1f), 0x2e66);
    assert_int_equal(store_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(store_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(store_f32_to_f16(65520.0f), 0x7c00);          /* rounds to infinity */
    assert_int_equal(store_f32_to_f16(0x1.0p-24f), 0x0001);        /* smallest subnormal */
    assert_int_equal(store_f32_to_f16(0x1.0p-25f), 0x0000);        /* tie -> even (zero) */
    assert_int_equal(store_f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(store_f32_to_f16(0x1.ff8p-15f), 0x03ff);      /* largest subnormal */
    assert_int_equal(store_f32_to_f16(0x1.ffcp-15f), 0x0400);      /* tie -> even: up into the normals */
    assert_int_equal(store_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00); /* tie -> even */
    assert_int_equal(store_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02); /* tie -> even (up) */
    for (uint32_t bits = 0; bits < 0x10000u; bits++) {
        if ((bits & 0x7c00u) == 0x7c00u) continue;
        assert_int_equal(store_f32_to_f16(store_f16_to_f32((uint16_t)bits)), bits);
    }
}

static void test_crc32(void **state)
{
    (void)state;
    assert_int_equal(store_crc32(0, "123456789", 9), 0xcbf43926u); /* the standard check value */
    assert_int_equal(store_crc32(store_crc32(0, "1234", 4), "56789", 5), 0xcbf43926u);
    assert_int_equal(store_crc32(0, "", 0), 0);
    /* zlib's crc32 gives the same values, over any lengths and split points (stores written before verify) */
    static unsigned char bytes[4099];
    uint64_t random_state = 99;
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)rng_next_u64(&random_state);
    for (size_t length = 0; length < sizeof bytes; length += 1 + length / 3) {
        uint32_t expected = (uint32_t)crc32(0L, bytes, (uInt)length);
        assert_int_equal(store_crc32(0, bytes, length), expected);
        size_t split = length / 3;
        assert_int_equal(store_crc32(store_crc32(0, bytes, split), bytes + split, length - split), expected);
    }
}

/* ---- round trips --------------------------------------------------------------------------------- */

/* Writes 40 samples of many shapes in `precision`, reads them back, checks the values within `relative`. */
static void round_trip(const test_folder *folder, store_precision precision, double relative, double absolute)
{
    sample_set set;
    sample_set_make(&set, 40, 7 + (uint64_t)precision);
    write_set(folder->path, &set, precision);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    assert_int_equal(s.n_samples, 40);
    assert_int_equal(s.text_dim, TEXT_DIM);
    assert_int_equal(s.latent_channels, CHANNELS);
    assert_int_equal(s.latent_precision, precision);
    assert_int_equal(s.text_precision, precision);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float));
    float *text = malloc((size_t)s.max_text_elements * sizeof(float));
    for (int i = 0; i < set.n_samples; i++) {
        const store_sample *sample = &s.samples[i];
        assert_int_equal(sample->frames, set.frames[i]);
        assert_int_equal(sample->height, set.height[i]);
        assert_int_equal(sample->width, set.width[i]);
        assert_int_equal(sample->text_len, set.text_len[i]);
        assert_int_equal(store_verify_sample(&s, i, latent, text, stderr), 0);
        for (int64_t j = 0; j < store_sample_latent_elements(sample); j++) {
            double expected = set.latent[i][j], error = fabs(latent[j] - expected);
            if (error > relative * fabs(expected) + absolute)
                fail_msg("sample %d latent %lld: %g read back as %g", i, (long long)j, expected, (double)latent[j]);
        }
        for (int64_t j = 0; j < store_sample_text_elements(&s, sample); j++) {
            double expected = set.text[i][j], error = fabs(text[j] - expected);
            if (error > relative * fabs(expected) + absolute)
                fail_msg("sample %d text %lld: %g read back as %g", i, (long long)j, expected, (double)text[j]);
        }
    }
    free(latent);
    free(text);
    store_close(&s);
    sample_set_free(&set);
}

static void test_round_trip_f32_exact(void **state) { round_trip(*state, STORE_F32, 0.0, 0.0); }
/* Round to nearest: relative error at most 2^-p for p significand bits (bf16: 8, f16: 11; f16 subnormals: 2^-25). */
static void test_round_trip_bf16(void **state) { round_trip(*state, STORE_BF16, 0x1.0p-8, 0.0); }
static void test_round_trip_f16(void **state) { round_trip(*state, STORE_F16, 0x1.0p-11, 0x1.0p-25); }

static void test_index_offsets_and_checksums(void **state)
{
    const test_folder *folder = *state;
    sample_set set;
    sample_set_make(&set, 20, 99);
    write_set(folder->path, &set, STORE_F32);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    int64_t latent_offset = 0, text_offset = 0, max_latent = 0;
    for (int i = 0; i < set.n_samples; i++) {
        const store_sample *sample = &s.samples[i];
        int64_t n_latent = store_sample_latent_elements(sample), n_text = store_sample_text_elements(&s, sample);
        assert_int_equal(sample->channels, CHANNELS);
        assert_int_equal(sample->latent_offset, latent_offset); /* back to back, in order */
        assert_int_equal(sample->text_offset, text_offset);
        uint32_t crc = store_crc32(0, set.latent[i], (size_t)n_latent * 4); /* f32: stored bytes = the input */
        assert_int_equal(sample->checksum, store_crc32(crc, set.text[i], (size_t)n_text * 4));
        assert_int_equal(store_sample_tokens(sample, 1, 1, 1), (int64_t)sample->frames * sample->height * sample->width);
        latent_offset += n_latent;
        text_offset += n_text;
        if (n_latent > max_latent) max_latent = n_latent;
    }
    assert_int_equal(s.latents_length, latent_offset);
    assert_int_equal(s.text_length, text_offset);
    assert_int_equal(s.max_latent_elements, max_latent);
    /* Only one part may be read. */
    float *values = malloc((size_t)max_latent * sizeof(float));
    assert_int_equal(store_read_sample(&s, 3, values, NULL, stderr), 0);
    assert_memory_equal(values, set.latent[3], (size_t)store_sample_latent_elements(&s.samples[3]) * 4);
    assert_int_equal(store_read_sample(&s, 3, NULL, values, stderr), 0);
    assert_memory_equal(values, set.text[3], (size_t)store_sample_text_elements(&s, &s.samples[3]) * 4);
    free(values);
    store_close(&s);
    store_close(&s); /* closing twice is harmless */
    sample_set_free(&set);
}

static void test_tokens(void **state)
{
    (void)state;
    store_sample largest = {.channels = 16, .frames = 33, .height = 96, .width = 96};
    assert_int_equal(store_sample_tokens(&largest, 1, 2, 2), 76032);
    store_sample image = {.channels = 16, .frames = 1, .height = 32, .width = 32};
    assert_int_equal(store_sample_tokens(&image, 1, 2, 2), 256);
}

/* ---- writer ------------------------------------------------------------------------------------- */

static void test_writer_publishes_atomically(void **state)
{
    const test_folder *folder = *state;
    char temporary[600];
    snprintf(temporary, sizeof temporary, "%s.tmp", folder->path);
    float latent[CHANNELS * 4] = {0}, text[TEXT_DIM] = {1, 2, 3, 4, 5};
    store_writer *writer = store_writer_create(folder->path, TEXT_DIM, STORE_BF16, stderr);
    assert_non_null(writer);
    assert_int_equal(store_writer_add(writer, CHANNELS, 1, 2, 2, latent, 1, text), 0);
    assert_int_equal(access(folder->path, F_OK), -1); /* nothing under the real name yet */
    assert_int_equal(access(temporary, F_OK), 0);
    assert_int_equal(store_writer_close(writer), 0);
    assert_int_equal(access(folder->path, F_OK), 0);
    assert_int_equal(access(temporary, F_OK), -1);
}

static void test_writer_rejects_bad_samples(void **state)
{
    const test_folder *folder = *state;
    char temporary[600];
    snprintf(temporary, sizeof temporary, "%s.tmp", folder->path);
    float latent[CHANNELS * 4] = {0}, text[TEXT_DIM] = {0};
    FILE *quiet = fopen("/dev/null", "w");

    store_writer *writer = store_writer_create(folder->path, TEXT_DIM, STORE_F16, quiet);
    latent[5] = 1e6f; /* does not fit f16 */
    assert_int_not_equal(store_writer_add(writer, CHANNELS, 1, 2, 2, latent, 1, text), 0);
    assert_int_not_equal(store_writer_close(writer), 0); /* a failed add poisons the file */
    assert_int_equal(access(folder->path, F_OK), -1);
    assert_int_equal(access(temporary, F_OK), -1);

    writer = store_writer_create(folder->path, TEXT_DIM, STORE_BF16, quiet);
    latent[5] = NAN;
    assert_int_not_equal(store_writer_add(writer, CHANNELS, 1, 2, 2, latent, 1, text), 0);
    store_writer_discard(writer);
    latent[5] = 0.0f;

    writer = store_writer_create(folder->path, TEXT_DIM, STORE_BF16, quiet);
    assert_int_equal(store_writer_add(writer, CHANNELS, 1, 2, 2, latent, 1, text), 0);
    assert_int_not_equal(store_writer_add(writer, CHANNELS - 1, 1, 2, 2, latent, 1, text), 0); /* channels differ */
    store_writer_discard(writer);

    writer = store_writer_create(folder->path, TEXT_DIM, STORE_BF16, quiet);
    assert_int_not_equal(store_writer_add(writer, CHANNELS, 1, 2, 2, latent, 0, text), 0); /* text_len >= 1 */
    store_writer_discard(writer);

    writer = store_writer_create(folder->path, TEXT_DIM, STORE_BF16, quiet);
    assert_int_not_equal(store_writer_close(writer), 0); /* no samples */
    assert_int_equal(access(folder->path, F_OK), -1);
    assert_int_equal(access(temporary, F_OK), -1);

    assert_null(store_writer_create(folder->path, 0, STORE_BF16, quiet)); /* bad text_dim */
    fclose(quiet);
}

/* ---- reader errors ------------------------------------------------------------------------------ */

static void test_missing_file(void **state)
{
    const test_folder *folder = *state;
    expect_open_error(folder->path, folder->path, "No such file");
}

static void test_not_hdf5(void **state)
{
    const test_folder *folder = *state;
    FILE *file = fopen(folder->path, "w");
    fputs("these are not the latents you are looking for\n", file);
    fclose(file);
    expect_open_error(folder->path, folder->path, "not an HDF5 file");
}

static void test_missing_dataset(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    hid_t file = open_rw(folder->path);
    assert_true(H5Ldelete(file, "/text", H5P_DEFAULT) >= 0);
    assert_true(H5Fclose(file) >= 0);
    expect_open_error(folder->path, "dataset /text is missing", NULL);
}

static void test_misshaped_index(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    hid_t file = open_rw(folder->path);
    assert_true(H5Ldelete(file, "/index", H5P_DEFAULT) >= 0);
    hsize_t dims[2] = {12, 5};
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t index = H5Dcreate2(file, "/index", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(index >= 0);
    H5Dclose(index);
    H5Sclose(space);
    assert_true(H5Fclose(file) >= 0);
    expect_open_error(folder->path, "/index has 5 columns", NULL);
}

static void test_misshaped_latents(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    hid_t file = open_rw(folder->path);
    assert_true(H5Ldelete(file, "/latents", H5P_DEFAULT) >= 0);
    hsize_t dims[2] = {10, 10};
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t latents = H5Dcreate2(file, "/latents", H5T_STD_U16LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(latents >= 0);
    H5Dclose(latents);
    H5Sclose(space);
    assert_true(H5Fclose(file) >= 0);
    expect_open_error(folder->path, "/latents has 2 dimensions, expected 1", NULL);
}

/* Rewrites a root attribute: an integer when `text` is NULL, else a string. */
static void set_root_attribute(const char *path, const char *name, int64_t value, const char *text)
{
    hid_t file = open_rw(path);
    assert_true(H5Adelete(file, name) >= 0);
    hid_t space = H5Screate(H5S_SCALAR), type = text ? H5Tcopy(H5T_C_S1) : H5Tcopy(H5T_STD_I64LE);
    if (text) H5Tset_size(type, strlen(text));
    hid_t attribute = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(attribute >= 0);
    assert_true(H5Awrite(attribute, text ? type : H5T_NATIVE_INT64, text ? (const void *)text : (const void *)&value) >= 0);
    H5Aclose(attribute);
    H5Tclose(type);
    H5Sclose(space);
    assert_true(H5Fclose(file) >= 0);
}

static void test_version_mismatch(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    set_root_attribute(folder->path, "aldit_store_version", 2, NULL);
    expect_open_error(folder->path, "store format version 2", "reads version 1");
}

static void test_dtype_mismatch(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder); /* bf16: uint16 data */
    set_root_attribute(folder->path, "latent_dtype", 0, "f32");
    expect_open_error(folder->path, "/latents holds uint16 values", "latent_dtype = f32 needs float32");
    set_root_attribute(folder->path, "latent_dtype", 0, "f64");
    expect_open_error(folder->path, "latent_dtype is 'f64'", NULL);
}

static void test_corrupt_index_out_of_range(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    hid_t file = open_rw(folder->path);
    hid_t index = H5Dopen2(file, "/index", H5P_DEFAULT);
    int64_t rows[12][STORE_INDEX_COLUMNS];
    assert_true(H5Dread(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
    rows[1][5] = INT64_C(1) << 40; /* latent_offset far past the end */
    assert_true(H5Dwrite(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
    H5Dclose(index);
    assert_true(H5Fclose(file) >= 0);
    expect_open_error(folder->path, "/index row 1 (sample 1)", "outside /latents");
}

static void test_out_of_range_id(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float));
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    assert_int_not_equal(store_read_sample(&s, 12, latent, NULL, errors), 0);
    assert_int_not_equal(store_read_sample(&s, -1, latent, NULL, errors), 0);
    fclose(errors);
    assert_non_null(strstr(messages, "sample id 12 out of range (the store holds 12 samples)"));
    assert_non_null(strstr(messages, "sample id -1 out of range"));
    free(messages);
    free(latent);
    store_close(&s);
}

static void test_truncated_file(void **state)
{
    const test_folder *folder = *state;
    sample_set set;
    sample_set_make(&set, 40, 5);
    write_set(folder->path, &set, STORE_F32);
    sample_set_free(&set);
    struct stat info;
    assert_int_equal(stat(folder->path, &info), 0);
    /* Every cut must give an error, never a crash. */
    const double fractions[] = {0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.9999};
    for (size_t i = 0; i < sizeof fractions / sizeof *fractions; i++) {
        assert_int_equal(truncate(folder->path, (off_t)(fractions[i] * (double)info.st_size)), 0);
        expect_open_error(folder->path, folder->path, fractions[i] == 0.0 ? "not an HDF5 file" : NULL);
    }
    write_default_store(folder);
    assert_int_equal(stat(folder->path, &info), 0);
    assert_int_equal(truncate(folder->path, info.st_size / 2), 0);
    expect_open_error(folder->path, "truncated", NULL);

    /* Cut under an open store (HDF5 then reads zeros or fails): verify names the damaged sample. */
    write_default_store(folder);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    int64_t last = s.n_samples - 1;
    assert_int_equal(truncate(folder->path, (off_t)(s.samples[last].latent_offset * 2)), 0);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float));
    float *text = malloc((size_t)s.max_text_elements * sizeof(float));
    char *messages = NULL, expected[64];
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    assert_int_not_equal(store_verify_sample(&s, last, latent, text, errors), 0);
    fclose(errors);
    snprintf(expected, sizeof expected, "sample %lld: ", (long long)last);
    if (!strstr(messages, folder->path) || !strstr(messages, expected)) fail_msg("message: %s", messages);
    free(messages);
    free(latent);
    free(text);
    store_close(&s);
}

/* Overwrites latent element `element` (stored bits) of the store, optionally fixing the checksum. */
static void damage_latent(const char *path, int64_t element, uint16_t bits)
{
    hid_t file = open_rw(path), latents = H5Dopen2(file, "/latents", H5P_DEFAULT);
    hid_t space = H5Dget_space(latents);
    hsize_t start[1] = {(hsize_t)element}, count[1] = {1};
    hid_t memory = H5Screate_simple(1, count, NULL);
    assert_true(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL) >= 0);
    assert_true(H5Dwrite(latents, H5T_NATIVE_UINT16, memory, space, H5P_DEFAULT, &bits) >= 0);
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(latents);
    assert_true(H5Fclose(file) >= 0);
}

static void test_checksum_mismatch(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    int64_t element = s.samples[4].latent_offset + 2;
    store_close(&s);
    damage_latent(folder->path, element, 0x4049); /* 3.14 in bf16: finite, but not what was written */

    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float));
    float *text = malloc((size_t)s.max_text_elements * sizeof(float));
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    int n_bad = 0;
    for (int64_t id = 0; id < s.n_samples; id++) n_bad += store_verify_sample(&s, id, latent, text, errors);
    assert_int_equal(store_read_sample(&s, 4, latent, text, errors), 0); /* a plain read does not check */
    fclose(errors);
    assert_int_equal(n_bad, 1);
    assert_non_null(strstr(messages, "sample 4: checksum mismatch"));
    free(messages);
    free(latent);
    free(text);
    store_close(&s);
}

static void test_nonfinite_value(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    int64_t element = s.samples[2].latent_offset + 1;
    /* Fix the checksum so that only the value check can find the problem. */
    int64_t n_latent = store_sample_latent_elements(&s.samples[2]), n_text = store_sample_text_elements(&s, &s.samples[2]);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float));
    float *text = malloc((size_t)s.max_text_elements * sizeof(float));
    assert_int_equal(store_read_sample(&s, 2, latent, text, stderr), 0);
    store_close(&s);
    uint16_t *raw_latent = malloc((size_t)n_latent * 2), *raw_text = malloc((size_t)n_text * 2);
    for (int64_t i = 0; i < n_latent; i++) raw_latent[i] = store_f32_to_bf16(latent[i]);
    for (int64_t i = 0; i < n_text; i++) raw_text[i] = store_f32_to_bf16(text[i]);
    raw_latent[1] = 0x7f80; /* +inf */
    uint32_t crc = store_crc32(store_crc32(0, raw_latent, (size_t)n_latent * 2), raw_text, (size_t)n_text * 2);
    damage_latent(folder->path, element, 0x7f80);
    hid_t file = open_rw(folder->path), index = H5Dopen2(file, "/index", H5P_DEFAULT);
    int64_t rows[12][STORE_INDEX_COLUMNS];
    assert_true(H5Dread(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
    rows[2][7] = crc;
    assert_true(H5Dwrite(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
    H5Dclose(index);
    assert_true(H5Fclose(file) >= 0);

    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    assert_int_not_equal(store_verify_sample(&s, 2, latent, text, errors), 0);
    fclose(errors);
    assert_non_null(strstr(messages, "sample 2: latent element 1 is not finite"));
    free(messages);
    /* a plain read (what training does) refuses it too, naming the file and the sample */
    errors = open_memstream(&messages, &size);
    assert_int_not_equal(store_read_sample(&s, 2, latent, NULL, errors), 0);
    assert_int_equal(store_read_sample(&s, 2, NULL, text, errors), 0);
    fclose(errors);
    assert_non_null(strstr(messages, folder->path));
    assert_non_null(strstr(messages, "sample 2: latent element 1 is not finite (corrupt data)"));
    free(messages);
    free(raw_latent);
    free(raw_text);
    free(latent);
    free(text);
    store_close(&s);
}

/* A store written with plain HDF5 calls the way h5py writes (variable-length string attributes, float16
   data, no `columns` attribute) must open: the documented format is all a writer needs. */
static void test_foreign_writer(void **state)
{
    const test_folder *folder = *state;
    hid_t file = H5Fcreate(folder->path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(file >= 0);
    hid_t half = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(half, 15, 10, 5, 0, 10);
    H5Tset_size(half, 2);
    H5Tset_ebias(half, 15);
    /* two samples: [2,1,1,2] latents with 1 and 2 text tokens of width 3 */
    float latent_values[8] = {1, 2, 3, 4, -1, -2, 0.5f, 0.25f}, text_values[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    hsize_t n_latent[1] = {8}, n_text[1] = {9}, index_dims[2] = {2, STORE_INDEX_COLUMNS};
    hid_t space = H5Screate_simple(1, n_latent, NULL);
    hid_t latents = H5Dcreate2(file, "latents", half, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(latents, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, latent_values) >= 0);
    H5Dclose(latents);
    H5Sclose(space);
    space = H5Screate_simple(1, n_text, NULL);
    hid_t text = H5Dcreate2(file, "text", half, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(text, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, text_values) >= 0);
    H5Dclose(text);
    H5Sclose(space);
    uint16_t raw_latent[8], raw_text[9];
    for (int i = 0; i < 8; i++) raw_latent[i] = store_f32_to_f16(latent_values[i]);
    for (int i = 0; i < 9; i++) raw_text[i] = store_f32_to_f16(text_values[i]);
    int64_t rows[2][STORE_INDEX_COLUMNS] = {
        {2, 1, 1, 2, 1, 0, 0, store_crc32(store_crc32(0, raw_latent, 8), raw_text, 6)},
        {2, 1, 1, 2, 2, 4, 3, store_crc32(store_crc32(0, raw_latent + 4, 8), raw_text + 3, 12)}};
    space = H5Screate_simple(2, index_dims, NULL);
    hid_t index = H5Dcreate2(file, "index", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(H5Dwrite(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0);
    H5Dclose(index);
    H5Sclose(space);
    space = H5Screate(H5S_SCALAR);
    hid_t string_type = H5Tcopy(H5T_C_S1);
    H5Tset_size(string_type, H5T_VARIABLE);
    H5Tset_cset(string_type, H5T_CSET_UTF8);
    const char *names[2] = {"latent_dtype", "text_dtype"}, *f16 = "f16";
    for (int i = 0; i < 2; i++) {
        hid_t attribute = H5Acreate2(file, names[i], string_type, space, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(H5Awrite(attribute, string_type, &f16) >= 0);
        H5Aclose(attribute);
    }
    const char *int_names[3] = {"aldit_store_version", "text_dim", "latent_channels"};
    int64_t int_values[3] = {1, 3, 2};
    for (int i = 0; i < 3; i++) {
        hid_t attribute = H5Acreate2(file, int_names[i], H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(H5Awrite(attribute, H5T_NATIVE_INT64, &int_values[i]) >= 0);
        H5Aclose(attribute);
    }
    H5Tclose(string_type);
    H5Sclose(space);
    H5Tclose(half);
    assert_true(H5Fclose(file) >= 0);

    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    assert_int_equal(s.n_samples, 2);
    assert_int_equal(s.latent_precision, STORE_F16);
    float latent[4], text_out[6];
    assert_int_equal(store_verify_sample(&s, 1, latent, text_out, stderr), 0);
    assert_memory_equal(latent, latent_values + 4, sizeof latent);
    assert_memory_equal(text_out, text_values + 3, sizeof text_out);
    store_close(&s);
}

static void write_text(const char *path, const char *text);

/* Replaces dataset `name` (1-D) by one of `type` holding the same values converted (HDF5's conversion),
   chunked with `filter` in its pipeline when filter > 0. */
static void replace_values(const char *path, const char *name, hid_t type, H5Z_filter_t filter)
{
    hid_t file = open_rw(path), dataset = H5Dopen2(file, name, H5P_DEFAULT), old_space = H5Dget_space(dataset);
    hsize_t n = (hsize_t)H5Sget_simple_extent_npoints(old_space);
    H5Sclose(old_space);
    hid_t space = H5Screate_simple(1, &n, NULL);
    double *values = malloc((size_t)n * sizeof *values);
    assert_true(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    H5Dclose(dataset);
    assert_true(H5Ldelete(file, name, H5P_DEFAULT) >= 0);
    hid_t create = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[1] = {64};
    if (filter > 0) {
        assert_true(H5Pset_chunk(create, 1, chunk) >= 0);
        assert_true(H5Pset_filter(create, filter, H5Z_FLAG_MANDATORY, 0, NULL) >= 0);
    }
    dataset = H5Dcreate2(file, name, type, space, H5P_DEFAULT, create, H5P_DEFAULT);
    assert_true(dataset >= 0);
    assert_true(H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
    H5Dclose(dataset);
    H5Pclose(create);
    H5Sclose(space);
    assert_true(H5Fclose(file) >= 0);
    free(values);
}

/* An int16 (or any other integer or float) /latents or /text is refused, naming the dataset, its type and
   the one the precision needs: HDF5 would otherwise convert the values silently into wrong ones. */
static void test_values_type_mismatch(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder); /* bf16 */
    replace_values(folder->path, "/latents", H5T_STD_I16LE, 0);
    expect_open_error(folder->path, "/latents holds int16 values", "latent_dtype = bf16 needs uint16");
    write_default_store(folder);
    replace_values(folder->path, "/text", H5T_STD_U32LE, 0);
    expect_open_error(folder->path, "/text holds uint32 values", "text_dtype = bf16 needs uint16");

    sample_set set;
    sample_set_make(&set, 6, 3);
    write_set(folder->path, &set, STORE_F32);
    replace_values(folder->path, "/latents", H5T_IEEE_F64LE, 0);
    expect_open_error(folder->path, "/latents holds float64", "latent_dtype = f32 needs float32");
    write_set(folder->path, &set, STORE_F16);
    hid_t bfloat = H5Tcopy(H5T_IEEE_F32LE); /* a 16-bit float that is not IEEE half: bfloat16 as a float type */
    assert_true(H5Tset_fields(bfloat, 15, 7, 8, 0, 7) >= 0 && H5Tset_size(bfloat, 2) >= 0 && H5Tset_ebias(bfloat, 127) >= 0);
    replace_values(folder->path, "/text", bfloat, 0);
    H5Tclose(bfloat);
    expect_open_error(folder->path, "/text holds float16 (8 exponent, 7 mantissa bits)", "needs float16 (IEEE half)");
    write_set(folder->path, &set, STORE_F16);
    replace_values(folder->path, "/text", H5T_IEEE_F32BE, 0); /* big-endian f32 for f16: still the wrong type */
    expect_open_error(folder->path, "/text holds float32", "text_dtype = f16");
    /* the right type in the other byte order is fine: HDF5 converts it */
    write_set(folder->path, &set, STORE_F32);
    replace_values(folder->path, "/latents", H5T_IEEE_F32BE, 0);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float)), *text = malloc((size_t)s.max_text_elements * sizeof(float));
    for (int64_t id = 0; id < s.n_samples; id++) assert_int_equal(store_verify_sample(&s, id, latent, text, stderr), 0);
    free(latent);
    free(text);
    store_close(&s);
    sample_set_free(&set);
}

/* Writes string attribute `name` on the object at `object_path`: variable-length when size is 0, else
   fixed-length of `size` bytes with `pad`; in character set `cset`. */
static void set_string_attribute(const char *path, const char *object_path, const char *name, const char *value,
                                 size_t size, H5T_str_t pad, H5T_cset_t cset)
{
    hid_t file = open_rw(path), object = H5Oopen(file, object_path, H5P_DEFAULT);
    assert_true(object >= 0);
    if (H5Aexists(object, name) > 0) assert_true(H5Adelete(object, name) >= 0);
    hid_t space = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1);
    assert_true(H5Tset_size(type, size ? size : H5T_VARIABLE) >= 0 && H5Tset_cset(type, cset) >= 0);
    if (size) assert_true(H5Tset_strpad(type, pad) >= 0);
    hid_t attribute = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(attribute >= 0);
    char padded[256];
    memset(padded, pad == H5T_STR_SPACEPAD ? ' ' : 0, sizeof padded);
    memcpy(padded, value, strlen(value));
    assert_true(H5Awrite(attribute, type, size ? (const void *)padded : (const void *)&value) >= 0);
    H5Aclose(attribute);
    H5Tclose(type);
    H5Sclose(space);
    H5Oclose(object);
    assert_true(H5Fclose(file) >= 0);
}

/* Fixed-length (any padding) and variable-length string attributes, ASCII or UTF-8, all read: the root
   precision names and /index's columns (h5py writes str as variable-length UTF-8, bytes as fixed-length). */
static void test_string_attributes(void **state)
{
    const test_folder *folder = *state;
    const struct { size_t size; H5T_str_t pad; H5T_cset_t cset; } kinds[] = {
        {0, H5T_STR_NULLTERM, H5T_CSET_UTF8},  {0, H5T_STR_NULLTERM, H5T_CSET_ASCII}, {4, H5T_STR_NULLPAD, H5T_CSET_ASCII},
        {5, H5T_STR_NULLTERM, H5T_CSET_ASCII}, {8, H5T_STR_NULLPAD, H5T_CSET_UTF8},   {8, H5T_STR_SPACEPAD, H5T_CSET_ASCII},
    };
    enum { N_KINDS = sizeof kinds / sizeof *kinds };
    /* first /index's columns in each kind (the root's as aldit writes them), then the root attributes */
    for (size_t k = 0; k < 2 * N_KINDS; k++) {
        size_t kind = k % N_KINDS;
        write_default_store(folder);
        if (k >= N_KINDS) {
            set_string_attribute(folder->path, "/", "latent_dtype", "bf16", kinds[kind].size, kinds[kind].pad, kinds[kind].cset);
            set_string_attribute(folder->path, "/", "text_dtype", "bf16", kinds[kind].size, kinds[kind].pad, kinds[kind].cset);
        } else {
            size_t columns_size = kinds[kind].size ? strlen(STORE_INDEX_COLUMN_NAMES) + kinds[kind].size : 0;
            set_string_attribute(folder->path, "/index", "columns", STORE_INDEX_COLUMN_NAMES, columns_size, kinds[kind].pad,
                                 kinds[kind].cset);
        }
        char *messages = NULL;
        size_t size = 0;
        FILE *errors = open_memstream(&messages, &size);
        store s;
        int status = store_open(&s, folder->path, errors);
        fclose(errors);
        if (status != 0) fail_msg("%s, string kind %zu (size %zu, pad %d, cset %d): %s", k >= N_KINDS ? "root" : "columns",
                                  kind, kinds[kind].size, (int)kinds[kind].pad, (int)kinds[kind].cset, messages);
        assert_int_equal(s.latent_precision, STORE_BF16);
        store_close(&s);
        free(messages);
    }
    /* a wrong value is still named */
    write_default_store(folder);
    set_string_attribute(folder->path, "/index", "columns", "channels,frames", 0, H5T_STR_NULLTERM, H5T_CSET_UTF8);
    expect_open_error(folder->path, "/index columns are 'channels,frames'", NULL);
}

/* Rewrites /index with element type `type`, keeping the values' low 32 bits where it is 32 bits wide
   (what numpy's astype(int32) does). */
static void rewrite_index(const char *path, hid_t type, int64_t rows[][STORE_INDEX_COLUMNS], int n_rows)
{
    hid_t file = open_rw(path);
    assert_true(H5Ldelete(file, "/index", H5P_DEFAULT) >= 0);
    hsize_t dims[2] = {(hsize_t)n_rows, STORE_INDEX_COLUMNS};
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t index = H5Dcreate2(file, "/index", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(index >= 0);
    int32_t *narrow = malloc((size_t)n_rows * STORE_INDEX_COLUMNS * sizeof *narrow);
    for (int i = 0; i < n_rows * STORE_INDEX_COLUMNS; i++) narrow[i] = (int32_t)(uint32_t)rows[i / STORE_INDEX_COLUMNS][i % STORE_INDEX_COLUMNS];
    assert_true(H5Dwrite(index, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, narrow) >= 0);
    free(narrow);
    H5Dclose(index);
    H5Sclose(space);
    assert_true(H5Fclose(file) >= 0);
}

/* An int32 /index holds checksums >= 2^31 wrapped to negative numbers: they are read as unsigned and verify. */
static void test_int32_index_checksums(void **state)
{
    const test_folder *folder = *state;
    write_default_store(folder);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    int64_t rows[12][STORE_INDEX_COLUMNS];
    int n_high = 0;
    for (int i = 0; i < 12; i++) {
        const store_sample *x = &s.samples[i];
        int64_t row[STORE_INDEX_COLUMNS] = {x->channels, x->frames, x->height, x->width, x->text_len, x->latent_offset,
                                            x->text_offset, x->checksum};
        memcpy(rows[i], row, sizeof row);
        n_high += x->checksum >= UINT32_C(0x80000000);
    }
    store_close(&s);
    assert_true(n_high > 0); /* the seed gives some checksums >= 2^31 */
    rewrite_index(folder->path, H5T_STD_I32LE, rows, 12);
    assert_int_equal(store_open(&s, folder->path, stderr), 0);
    float *latent = malloc((size_t)s.max_latent_elements * sizeof(float)), *text = malloc((size_t)s.max_text_elements * sizeof(float));
    for (int64_t id = 0; id < s.n_samples; id++) {
        assert_int_equal(s.samples[id].checksum, (uint32_t)rows[id][7]);
        assert_int_equal(store_verify_sample(&s, id, latent, text, stderr), 0);
    }
    free(latent);
    free(text);
    store_close(&s);
    rewrite_index(folder->path, H5T_STD_I16LE, rows, 12); /* too narrow for a checksum */
    expect_open_error(folder->path, "/index holds int16 values", "needs 32 bits");
}

/* A stand-in for a compression filter this HDF5 lacks (h5py's lzf is filter 32000): registered while the
   store is written, unregistered before it is read. */
static size_t identity_filter(unsigned int flags, size_t n_values, const unsigned int values[], size_t n_bytes,
                              size_t *buffer_size, void **buffer)
{
    (void)flags; (void)n_values; (void)values; (void)buffer_size; (void)buffer;
    return n_bytes;
}

static void test_unavailable_filter(void **state)
{
    const test_folder *folder = *state;
    enum { FILTER_LZF = 32000 };
    const H5Z_class2_t filter = {H5Z_CLASS_T_VERS, FILTER_LZF, 1, 1, "lzf", NULL, NULL, identity_filter};
    assert_true(H5Zregister(&filter) >= 0);
    write_default_store(folder);
    replace_values(folder->path, "/text", H5T_STD_U16LE, FILTER_LZF);
    store s;
    assert_int_equal(store_open(&s, folder->path, stderr), 0); /* fine while the filter is there */
    store_close(&s);
    assert_true(H5Zunregister(FILTER_LZF) >= 0);
    expect_open_error(folder->path, "/text is stored through HDF5 filter 32000 (lzf)", "cannot decode");
}

/* The writer replaces only regular files: a directory, a symbolic link or a FIFO at PATH (or PATH.tmp) is
   refused by name and left as it was. */
static void test_writer_refuses_non_regular_out(void **state)
{
    const test_folder *folder = *state;
    char target[600], link_path[600], temporary[600];
    assert_int_equal(mkdir(folder->path, 0700), 0);
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    assert_null(store_writer_create(folder->path, TEXT_DIM, STORE_BF16, errors));
    fclose(errors);
    assert_non_null(strstr(messages, folder->path));
    assert_non_null(strstr(messages, "exists and is a directory"));
    free(messages);
    assert_int_equal(rmdir(folder->path), 0);

    snprintf(target, sizeof target, "%s/target", folder->dir);
    snprintf(link_path, sizeof link_path, "%s/link.h5", folder->dir);
    write_text(target, "keep me\n");
    assert_int_equal(symlink("target", link_path), 0);
    errors = open_memstream(&messages, &size);
    assert_null(store_writer_create(link_path, TEXT_DIM, STORE_BF16, errors));
    fclose(errors);
    assert_non_null(strstr(messages, "link.h5: exists and is a symbolic link"));
    free(messages);
    snprintf(temporary, sizeof temporary, "%s.tmp", folder->path); /* a symlink as the temporary file */
    assert_int_equal(symlink("target", temporary), 0);
    errors = open_memstream(&messages, &size);
    assert_null(store_writer_create(folder->path, TEXT_DIM, STORE_BF16, errors));
    fclose(errors);
    assert_non_null(strstr(messages, "store.h5.tmp: exists and is a symbolic link"));
    free(messages);
    struct stat info;
    assert_int_equal(stat(target, &info), 0);
    assert_int_equal(info.st_size, 8); /* untouched */
    unlink(temporary);
    unlink(link_path);

    assert_int_equal(mkfifo(link_path, 0600), 0); /* (a device node needs root; a FIFO is not a regular file either) */
    errors = open_memstream(&messages, &size);
    assert_null(store_writer_create(link_path, TEXT_DIM, STORE_BF16, errors));
    fclose(errors);
    assert_non_null(strstr(messages, "link.h5: exists and is a named pipe"));
    free(messages);
    unlink(link_path);
}

/* A store that cannot fit (here: past the file size limit, as a full disk would be) fails at the sample
   that would not fit, with errno's text naming the file, and leaves no file behind. */
static void test_writer_file_too_large(void **state)
{
    const test_folder *folder = *state;
    struct rlimit saved, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small = saved;
    small.rlim_cur = 3u << 20; /* 3 MiB: a few chunks */
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < small.rlim_cur) skip();
    void (*previous)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    char *messages = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&messages, &size);
    store_writer *writer = store_writer_create(folder->path, TEXT_DIM, STORE_F32, errors);
    assert_non_null(writer);
    enum { VALUES = 1 << 18 };
    float *latent = calloc(VALUES, sizeof(float)), text[TEXT_DIM] = {0};
    int failed_at = -1;
    for (int i = 0; i < 8 && failed_at < 0; i++)
        if (store_writer_add(writer, 1, 1, 512, 512, latent, 1, text)) failed_at = i;
    int closed = store_writer_close(writer);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, previous);
    fclose(errors);
    assert_true(failed_at > 0);
    assert_int_not_equal(closed, 0);
    if (!strstr(messages, "store.h5.tmp: ") || !strstr(messages, strerror(EFBIG))) fail_msg("message: %s", messages);
    free(messages);
    free(latent);
    assert_int_not_equal(access(folder->path, F_OK), 0);
    char temporary[600];
    snprintf(temporary, sizeof temporary, "%s.tmp", folder->path);
    assert_int_not_equal(access(temporary, F_OK), 0);
}

/* ---- length specs -------------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *file = fopen(path, "w");
    assert_non_null(file);
    fputs(text, file);
    fclose(file);
}

/* lengths_load with its messages captured. */
static int load_spec(const char *path, length_bucket **buckets, int *n_buckets, char **messages)
{
    size_t size = 0;
    FILE *errors = open_memstream(messages, &size);
    int n_errors = lengths_load(path, buckets, n_buckets, errors);
    fclose(errors);
    return n_errors;
}

static void test_lengths_good(void **state)
{
    const test_folder *folder = *state;
    write_text(folder->path, "# a comment\n\n  3 1 32 32   # images\n0.5\t33 96 96\r\n1e-3 5 60 104\n");
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    char *messages = NULL;
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 0);
    assert_string_equal(messages, "");
    assert_int_equal(n_buckets, 3);
    assert_true(buckets[0].weight == 3.0 && buckets[0].frames == 1 && buckets[0].height == 32 && buckets[0].width == 32);
    assert_true(buckets[1].weight == 0.5 && buckets[1].frames == 33 && buckets[1].height == 96 && buckets[1].width == 96);
    assert_true(buckets[2].weight == 1e-3 && buckets[2].frames == 5 && buckets[2].height == 60 && buckets[2].width == 104);
    free(buckets);
    free(messages);
}

static void test_lengths_errors_name_lines(void **state)
{
    const test_folder *folder = *state;
    write_text(folder->path,
               "# header\n"
               "1 1 32 32\n"
               "1 1 32\n"           /* line 3: too few fields */
               "0 1 32 32\n"        /* line 4: zero weight */
               "1 1 32 32 7 8\n"    /* line 5: too many fields */
               "1 1.5 32 32\n"      /* line 6: non-integer frames */
               "1 1 0 32\n"         /* line 7: height 0 */
               "abc 1 32 32\n"      /* line 8: weight not a number */
               "1 1 32 99999999\n"  /* line 9: width too large */
               "nan 1 2 2\n"        /* line 10: weight not finite */
               "1 1 2 2 0\n"        /* line 11: caption length 0 */
               "1 1 2 2 900-50\n"   /* line 12: MIN > MAX */
               "1 1 2 2 50-\n"      /* line 13: no MAX */
               "1 1 2 2 -5\n"       /* line 14: no MIN */
               "1 1 2 2 5x\n"       /* line 15: not an integer */
               "1 1 2 2 1-70000\n"); /* line 16: past LENGTHS_MAX_TEXT */
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    char *messages = NULL, expected[700];
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 14);
    assert_null(buckets);
    assert_int_equal(n_buckets, 0);
    const char *fragments[] = {":3: expected 4 or 5 fields", ":4: weight '0' is not a positive", ":5: expected 4 or 5 fields",
                               ":6: frames '1.5' is not an integer", ":7: height '0'", ":8: weight 'abc'",
                               ":9: width '99999999'", ":10: weight 'nan'", ":11: text '0' is not a caption length",
                               ":12: text '900-50'", ":13: text '50-'", ":14: text '-5'", ":15: text '5x'",
                               ":16: text '1-70000'"};
    for (size_t i = 0; i < sizeof fragments / sizeof *fragments; i++) {
        snprintf(expected, sizeof expected, "%s%s", folder->path, fragments[i]);
        if (!strstr(messages, expected)) fail_msg("messages lack '%s':\n%s", expected, messages);
    }
    free(messages);
}

/* Weights that overflow (or sum past LENGTHS_MAX_WEIGHT_SUM) would let one bucket take every draw. */
static void test_lengths_weight_overflow(void **state)
{
    const test_folder *folder = *state;
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    char *messages = NULL, expected[600];
    /* 1e308 + 1.7e308 overflows to infinity: reported once, at the first line past the limit */
    write_text(folder->path, "# weight frames height width\n1 1 2 2\n1e308 1 4 4\n1.7e308 1 8 8\n");
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 1);
    snprintf(expected, sizeof expected, "%s:3: the weights so far sum to 1e+308, more than 1e+15", folder->path);
    if (!strstr(messages, expected)) fail_msg("messages lack '%s':\n%s", expected, messages);
    assert_null(buckets);
    free(messages);
    write_text(folder->path, "6e14 1 2 2\n6e14 1 4 4\n"); /* each weight fine, the sum not */
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 1);
    snprintf(expected, sizeof expected, "%s:2: the weights so far sum to 1.2e+15, more than 1e+15", folder->path);
    if (!strstr(messages, expected)) fail_msg("messages lack '%s':\n%s", expected, messages);
    free(messages);
    write_text(folder->path, "1e14 1 2 2\n1e-3 1 4 4\n"); /* large but fine */
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 0);
    assert_int_equal(n_buckets, 2);
    free(buckets);
    free(messages);
}

static void test_lengths_missing_and_empty(void **state)
{
    const test_folder *folder = *state;
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    char *messages = NULL;
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 1);
    assert_non_null(strstr(messages, "cannot open length spec"));
    free(messages);
    write_text(folder->path, "# only comments\n\n");
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 1);
    assert_non_null(strstr(messages, "no buckets"));
    free(messages);
}

/* The optional fifth field: a caption length or a range, drawn per sample uniformly over the range (both ends
   included), without changing the shapes drawn; a bucket without it gives 0. */
static void test_lengths_text(void **state)
{
    const test_folder *folder = *state;
    write_text(folder->path, "1 1 4 4 50-1000  # images\n1 5 8 8 77\n1 2 2 2\n");
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    char *messages = NULL;
    assert_int_equal(load_spec(folder->path, &buckets, &n_buckets, &messages), 0);
    assert_int_equal(n_buckets, 3);
    assert_true(buckets[0].text_min == 50 && buckets[0].text_max == 1000);
    assert_true(buckets[1].text_min == 77 && buckets[1].text_max == 77);
    assert_true(buckets[2].text_min == 0 && buckets[2].text_max == 0);
    enum { N = 30000 };
    static int32_t f1[N], h1[N], w1[N], f2[N], h2[N], w2[N], text[N];
    lengths_draw(buckets, 3, N, 5, f1, h1, w1);
    lengths_draw_text(buckets, 3, N, 5, f2, h2, w2, text);
    assert_memory_equal(f1, f2, sizeof f1);
    assert_memory_equal(h1, h2, sizeof h1);
    assert_memory_equal(w1, w2, sizeof w1);
    int64_t in_images = 0, low = 0, high = 0, smallest = 1 << 30, largest = 0;
    double sum = 0;
    for (int i = 0; i < N; i++) {
        if (f2[i] == 5) assert_int_equal(text[i], 77);
        if (f2[i] == 2) assert_int_equal(text[i], 0);
        if (f2[i] != 1) continue;
        assert_true(text[i] >= 50 && text[i] <= 1000);
        in_images++;
        sum += text[i];
        low += text[i] < 525;
        high += text[i] >= 525;
        if (text[i] < smallest) smallest = text[i];
        if (text[i] > largest) largest = text[i];
    }
    assert_true(smallest == 50 && largest == 1000);   /* ~10 draws per value: both ends drawn */
    assert_true(fabs(sum / (double)in_images - 525.0) < 10.0);   /* uniform: mean 525 (sd 274 / sqrt(10000)) */
    assert_true(llabs(low - high) < in_images / 20);
    free(buckets);
    free(messages);
}

static void test_lengths_draw(void **state)
{
    (void)state;
    length_bucket buckets[2] = {{1.0, 1, 4, 4, 0, 0}, {3.0, 2, 8, 8, 0, 0}};
    enum { N = 20000 };
    static int32_t f1[N], h1[N], w1[N], f2[N], h2[N], w2[N];
    lengths_draw(buckets, 2, N, 11, f1, h1, w1);
    lengths_draw(buckets, 2, N, 11, f2, h2, w2);
    assert_memory_equal(f1, f2, sizeof f1); /* same seed, same draws */
    assert_memory_equal(w1, w2, sizeof w1);
    int n_second = 0;
    for (int i = 0; i < N; i++) {
        assert_true((f1[i] == 1 && h1[i] == 4 && w1[i] == 4) || (f1[i] == 2 && h1[i] == 8 && w1[i] == 8));
        n_second += f1[i] == 2;
    }
    assert_true(fabs((double)n_second / N - 0.75) < 0.02); /* by weight */
    lengths_draw(buckets, 2, N, 12, f2, h2, w2);
    assert_memory_not_equal(f1, f2, sizeof f1);          /* another seed, other draws */
}

static void test_shipped_specs(void **state)
{
    (void)state;
    char path[1024];
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    snprintf(path, sizeof path, "%s/inputs/mixed.lengths", top_srcdir());
    assert_int_equal(lengths_load(path, &buckets, &n_buckets, stderr), 0);
    int64_t max_tokens = 0, min_tokens = INT64_MAX;
    int n_images = 0, n_videos = 0;
    for (int b = 0; b < n_buckets; b++) {
        store_sample shape = {.channels = 16, .frames = buckets[b].frames, .height = buckets[b].height, .width = buckets[b].width};
        int64_t tokens = store_sample_tokens(&shape, 1, 2, 2);
        if (tokens > max_tokens) max_tokens = tokens;
        if (tokens < min_tokens) min_tokens = tokens;
        n_images += buckets[b].frames == 1;
        n_videos += buckets[b].frames > 1;
        assert_int_equal(buckets[b].height % 2, 0);
        assert_int_equal(buckets[b].width % 2, 0);
    }
    assert_int_equal(max_tokens, 76032); /* 768x768, 129 frames */
    assert_int_equal(min_tokens, 256);   /* 256x256 image */
    assert_true(n_images >= 5 && n_videos >= 5);
    free(buckets);
    snprintf(path, sizeof path, "%s/inputs/quickstart.lengths", top_srcdir());
    assert_int_equal(lengths_load(path, &buckets, &n_buckets, stderr), 0);
    for (int b = 0; b < n_buckets; b++) {
        store_sample shape = {.channels = 16, .frames = buckets[b].frames, .height = buckets[b].height, .width = buckets[b].width};
        int64_t tokens = store_sample_tokens(&shape, 1, 2, 2);
        assert_true(tokens >= 4 && tokens <= 48);
    }
    free(buckets);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_f16_conversion),
        cmocka_unit_test(test_crc32),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test_setup_teardown(test_round_trip_f32_exact, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_bf16, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_f16, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_index_offsets_and_checksums, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_writer_publishes_atomically, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_writer_rejects_bad_samples, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_not_hdf5, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_missing_dataset, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_misshaped_index, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_misshaped_latents, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_version_mismatch, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_dtype_mismatch, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_index_out_of_range, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range_id, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_truncated_file, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_checksum_mismatch, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_value, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_foreign_writer, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_values_type_mismatch, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_string_attributes, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_int32_index_checksums, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_unavailable_filter, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_writer_refuses_non_regular_out, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_writer_file_too_large, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_lengths_weight_overflow, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_lengths_good, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_lengths_errors_name_lines, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_lengths_missing_and_empty, folder_setup, folder_teardown),
        cmocka_unit_test_setup_teardown(test_lengths_text, folder_setup, folder_teardown),
        cmocka_unit_test(test_lengths_draw),
        cmocka_unit_test(test_shipped_specs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
