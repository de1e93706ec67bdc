/* safetensors.c — safetensors files and sharded sets read as fp32 (header checked with jansson at open), and written from fp32. */
#include "io/safetensors.h"
#include "core/check.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian values in place: a big-endian host needs byte swaps"
#endif

/* A header longer than this is refused as damaged (the format's own readers use the same bound). */
#define HEADER_MAX_BYTES ((uint64_t)100 << 20)
/* Values converted per read call. */
#define STAGING_ELEMENTS ((int64_t)1 << 18)
#define INDEX_SUFFIX ".safetensors.index.json"

typedef struct {
    char *path;
    int fd;
    int64_t data_start, size; /* first data byte (8 + header length), file size */
} st_file;

typedef struct {
    safetensors_tensor info;
    int file;               /* index into the set's files */
    int64_t begin, end;     /* data_offsets, relative to the file's data_start */
} st_entry;

struct safetensors {
    st_file *files;
    int n_files;
    st_entry *entries;
    int n_entries, capacity;
};

static const struct { const char *name; safetensors_dtype dtype; int bytes; } dtypes[] = {
    {"F32", SAFETENSORS_F32, 4}, {"F16", SAFETENSORS_F16, 2}, {"BF16", SAFETENSORS_BF16, 2},
    {"F64", SAFETENSORS_F64, 8}, {"I64", SAFETENSORS_OTHER, 8}, {"U64", SAFETENSORS_OTHER, 8},
    {"I32", SAFETENSORS_OTHER, 4}, {"U32", SAFETENSORS_OTHER, 4}, {"I16", SAFETENSORS_OTHER, 2},
    {"U16", SAFETENSORS_OTHER, 2}, {"I8", SAFETENSORS_OTHER, 1}, {"U8", SAFETENSORS_OTHER, 1},
    {"BOOL", SAFETENSORS_OTHER, 1}, {"F8_E4M3", SAFETENSORS_OTHER, 1}, {"F8_E5M2", SAFETENSORS_OTHER, 1},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

int safetensors_dtype_bytes(safetensors_dtype dtype)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == dtype && dtype != SAFETENSORS_OTHER) return dtypes[i].bytes;
    return 0;
}

static int ends_with(const char *text, const char *suffix)
{
    size_t n = strlen(text), m = strlen(suffix);
    return n >= m && strcmp(text + n - m, suffix) == 0;
}

/* ---- conversions ------------------------------------------------------------------------------------ */

static float bf16_to_f32(uint16_t bits)
{
    uint32_t word = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &word, sizeof value);
    return value;
}

static float f16_to_f32(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16, exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    uint32_t word;
    if (exponent == 0x1f) {
        word = sign | 0x7f800000u | (mantissa << 13); /* Inf, NaN */
    } else if (exponent != 0) {
        word = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        word = sign;
    } else { /* subnormal: shift the mantissa up until its leading one is the implicit bit */
        int shift = 0;
        while (!(mantissa & 0x400u)) mantissa <<= 1, shift++;
        word = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float value;
    memcpy(&value, &word, sizeof value);
    return value;
}

static uint16_t f32_to_bf16(float value)
{
    uint32_t word;
    memcpy(&word, &value, sizeof word);
    if ((word & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((word >> 16) | 0x40u); /* NaN stays NaN */
    word += 0x7fffu + ((word >> 16) & 1u);                                            /* nearest, ties to even */
    return (uint16_t)(word >> 16);
}

/* n raw values of `dtype` at `raw` into fp32. */
static void convert_to_f32(safetensors_dtype dtype, const unsigned char *raw, int64_t n, float *values)
{
    for (int64_t i = 0; i < n; i++) {
        if (dtype == SAFETENSORS_F32) {
            memcpy(&values[i], raw + 4 * i, 4);
        } else if (dtype == SAFETENSORS_F64) {
            double wide;
            memcpy(&wide, raw + 8 * i, 8);
            values[i] = (float)wide;
        } else {
            uint16_t bits;
            memcpy(&bits, raw + 2 * i, 2);
            values[i] = dtype == SAFETENSORS_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
        }
    }
}

/* ---- the header --------------------------------------------------------------------------------------- */

static int header_error(const char *path, FILE *errors, const char *name, const char *what)
{
    if (name) fprintf(errors, "%s: damaged safetensors header: tensor %s: %s\n", path, name, what);
    else fprintf(errors, "%s: damaged safetensors header: %s\n", path, what);
    return 1;
}

/* A JSON integer in [0, INT64_MAX], or -1. */
static int64_t json_count(const json_t *item)
{
    if (!json_is_integer(item)) return -1;
    json_int_t value = json_integer_value(item);
    return value < 0 ? -1 : (int64_t)value;
}

static int parse_dtype(const char *path, FILE *errors, const char *name, const json_t *item, st_entry *e, int *bytes)
{
    if (!json_is_string(item)) return header_error(path, errors, name, "\"dtype\" is not a string");
    const char *text = json_string_value(item);
    for (int i = 0; i < N_DTYPES; i++) {
        if (strcmp(text, dtypes[i].name) != 0) continue;
        e->info.dtype_name = dtypes[i].name;
        e->info.dtype = dtypes[i].dtype;
        *bytes = dtypes[i].bytes;
        return 0;
    }
    char what[96];
    snprintf(what, sizeof what, "unknown dtype \"%.40s\"", text);
    return header_error(path, errors, name, what);
}

static int parse_shape(const char *path, FILE *errors, const char *name, const json_t *item, st_entry *e)
{
    if (!json_is_array(item) || json_array_size(item) > SAFETENSORS_MAX_NDIM)
        return header_error(path, errors, name, "\"shape\" is not an array of at most 8 sizes");
    e->info.ndim = (int)json_array_size(item);
    e->info.n_elements = 1;
    for (int d = 0; d < e->info.ndim; d++) {
        int64_t size = json_count(json_array_get(item, (size_t)d));
        if (size < 0) return header_error(path, errors, name, "a size of \"shape\" is not a non-negative integer");
        if (size > 0 && e->info.n_elements > INT64_MAX / 8 / size)
            return header_error(path, errors, name, "\"shape\" is too large");
        e->info.shape[d] = size;
        e->info.n_elements *= size;
    }
    return 0;
}

static int parse_offsets(const char *path, FILE *errors, const char *name, const json_t *item, st_entry *e, int bytes)
{
    if (!json_is_array(item) || json_array_size(item) != 2)
        return header_error(path, errors, name, "\"data_offsets\" is not [begin, end]");
    e->begin = json_count(json_array_get(item, 0));
    e->end = json_count(json_array_get(item, 1));
    if (e->begin < 0 || e->end < e->begin)
        return header_error(path, errors, name, "\"data_offsets\" are not 0 <= begin <= end");
    if (e->end - e->begin != e->info.n_elements * bytes) {
        char what[160];
        snprintf(what, sizeof what, "data_offsets span %" PRId64 " bytes, shape and dtype %s need %" PRId64,
                 e->end - e->begin, e->info.dtype_name, e->info.n_elements * bytes);
        return header_error(path, errors, name, what);
    }
    return 0;
}

static st_entry *add_entry(safetensors *set)
{
    if (set->n_entries == set->capacity) {
        set->capacity = set->capacity ? 2 * set->capacity : 64;
        set->entries = xrealloc(set->entries, (size_t)set->capacity * sizeof *set->entries);
    }
    st_entry *e = &set->entries[set->n_entries++];
    memset(e, 0, sizeof *e);
    return e;
}

/* One header entry "name": {"dtype", "shape", "data_offsets"} appended to the set, its data within the file. */
static int parse_entry(safetensors *set, int file, const char *name, const json_t *item, FILE *errors)
{
    const st_file *f = &set->files[file];
    if (!json_is_object(item)) return header_error(f->path, errors, name, "not an object");
    if (safetensors_find(set, name)) return header_error(f->path, errors, name, "named twice in the set");
    st_entry *e = add_entry(set);
    e->info.name = xmalloc(strlen(name) + 1);
    strcpy((char *)e->info.name, name);
    e->info.file = f->path;
    e->file = file;
    int bytes = 0;
    if (parse_dtype(f->path, errors, name, json_object_get(item, "dtype"), e, &bytes) ||
        parse_shape(f->path, errors, name, json_object_get(item, "shape"), e) ||
        parse_offsets(f->path, errors, name, json_object_get(item, "data_offsets"), e, bytes))
        return 1;
    if (f->data_start + e->end > f->size) {
        fprintf(errors, "%s: truncated: the data of tensor %s ends at byte %" PRId64 ", the file has %" PRId64
                " bytes (copy the file again)\n", f->path, name, f->data_start + e->end, f->size);
        return 1;
    }
    return 0;
}

/* The name of the tensor whose entry holds byte `position` of a compact header (the last `"NAME":{` before it),
   into `name`; "" when there is none. */
static void entry_before(const char *text, size_t position, char *name, size_t size)
{
    name[0] = '\0';
    for (size_t i = position; i >= 2 && i < SIZE_MAX; i--) {
        if (text[i] != '{' || text[i - 1] != ':' || text[i - 2] != '"') continue;
        size_t end = i - 2, start = end;
        while (start > 0 && text[start - 1] != '"') start--;
        if (start > 0) snprintf(name, size, "%.*s", (int)(end - start), text + start);
        return;
    }
}

static void json_syntax_error(const st_file *f, const char *text, const json_error_t *why, FILE *errors)
{
    char name[128];
    entry_before(text, (size_t)why->position, name, sizeof name);
    fprintf(errors, "%s: damaged safetensors header: %s (line %d, column %d%s%s)\n", f->path, why->text, why->line,
            why->column, name[0] ? ", in the entry of tensor " : "", name);
}

/* The header of an open file, as a JSON object (NULL after a message); sets f->data_start. */
static json_t *load_header(st_file *f, FILE *errors)
{
    unsigned char prefix[8];
    if (f->size < 8 || pread(f->fd, prefix, 8, 0) != 8) {
        fprintf(errors, "%s: not a safetensors file: shorter than its 8-byte header length\n", f->path);
        return NULL;
    }
    uint64_t length;
    memcpy(&length, prefix, 8);
    if (length > HEADER_MAX_BYTES || length > (uint64_t)f->size - 8) {
        fprintf(errors, "%s: damaged safetensors header: its length (%" PRIu64 " bytes) exceeds the file's %" PRId64
                " bytes\n", f->path, length, f->size);
        return NULL;
    }
    f->data_start = 8 + (int64_t)length;
    char *text = xmalloc((size_t)length + 1);
    json_t *root = NULL;
    if (pread(f->fd, text, (size_t)length, 8) == (ssize_t)length) {
        json_error_t why;
        root = json_loadb(text, (size_t)length, JSON_REJECT_DUPLICATES, &why);
        text[length] = '\0';
        if (!root) json_syntax_error(f, text, &why, errors);
        if (root && !json_is_object(root)) {
            header_error(f->path, errors, NULL, "not a JSON object");
            json_decref(root);
            root = NULL;
        }
    } else {
        fprintf(errors, "%s: reading the safetensors header failed: %s\n", f->path, strerror(errno));
    }
    free(text);
    return root;
}

/* Opens file `path` into the set (its index returned in *file) and parses its header. */
static int add_file(safetensors *set, const char *path, int *file, FILE *errors)
{
    set->files = xrealloc(set->files, (size_t)(set->n_files + 1) * sizeof *set->files);
    st_file *f = &set->files[set->n_files];
    *f = (st_file){.path = xmalloc(strlen(path) + 1), .fd = open(path, O_RDONLY | O_CLOEXEC)};
    strcpy(f->path, path);
    *file = set->n_files++;
    struct stat info;
    if (f->fd < 0 || fstat(f->fd, &info) != 0) {
        fprintf(errors, "%s: cannot open: %s\n", path, strerror(errno));
        return 1;
    }
    f->size = (int64_t)info.st_size;
    json_t *root = load_header(f, errors);
    if (!root) return 1;
    const char *name;
    json_t *item;
    int status = 0;
    json_object_foreach(root, name, item) {
        if (status == 0 && strcmp(name, "__metadata__") != 0) status = parse_entry(set, *file, name, item, errors);
    }
    json_decref(root);
    return status;
}

/* ---- sharded sets ---------------------------------------------------------------------------------------- */

/* The shard `file` of an index at `index_path`: a path relative to the index's folder (no other folder). */
static int shard_path(const char *index_path, const char *file, char *path, size_t size, FILE *errors)
{
    if (strchr(file, '/') || strcmp(file, "..") == 0 || file[0] == '\0') {
        fprintf(errors, "%s: the weight_map names \"%s\": shards must be files beside the index\n", index_path, file);
        return 1;
    }
    const char *slash = strrchr(index_path, '/');
    int folder = slash ? (int)(slash - index_path) + 1 : 0;
    if (snprintf(path, size, "%.*s%s", folder, index_path, file) >= (int)size) {
        fprintf(errors, "%s: the path of shard %s is too long\n", index_path, file);
        return 1;
    }
    return 0;
}

static int open_shard(safetensors *set, const char *index_path, const char *file, FILE *errors)
{
    char path[PATH_MAX];
    if (shard_path(index_path, file, path, sizeof path, errors)) return 1;
    for (int i = 0; i < set->n_files; i++)
        if (strcmp(set->files[i].path, path) == 0) return 0;
    int index;
    return add_file(set, path, &index, errors);
}

/* Every name of the weight_map present in the shard it names. */
static int check_weight_map(const safetensors *set, const char *index_path, json_t *map, FILE *errors)
{
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        const safetensors_tensor *t = safetensors_find(set, name);
        char path[PATH_MAX];
        shard_path(index_path, json_string_value(file), path, sizeof path, errors);
        if (t && strcmp(t->file, path) == 0) continue;
        fprintf(errors, "%s: the index names tensor %s in %s, which does not hold it\n", index_path, name, path);
        return 1;
    }
    return 0;
}

static int open_index(safetensors *set, const char *path, FILE *errors)
{
    json_error_t why;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &why);
    if (!root) {
        if (access(path, R_OK) != 0) fprintf(errors, "%s: cannot open: %s\n", path, strerror(errno));
        else fprintf(errors, "%s: damaged safetensors index: %s (line %d, column %d)\n", path, why.text, why.line,
                     why.column);
        return 1;
    }
    json_t *map = json_object_get(root, "weight_map");
    int status = json_is_object(map) ? 0 : 1;
    if (status) fprintf(errors, "%s: damaged safetensors index: no \"weight_map\" object\n", path);
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        if (status) break;
        if (!json_is_string(file)) {
            fprintf(errors, "%s: damaged safetensors index: the file of %s is not a string\n", path, name);
            status = 1;
        } else {
            status = open_shard(set, path, json_string_value(file), errors);
        }
    }
    if (status == 0) status = check_weight_map(set, path, map, errors);
    json_decref(root);
    return status;
}

/* ---- the reading API ------------------------------------------------------------------------------------ */

static int is_folder(const char *path)
{
    struct stat info;
    return stat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

/* The set a folder holds: its index, else its single file. */
static int open_folder(safetensors *set, const char *dir, FILE *errors)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_INDEX_FILE);
    if (access(path, F_OK) == 0) return open_index(set, path, errors);
    snprintf(path, sizeof path, "%s/%s", dir, SAFETENSORS_SINGLE_FILE);
    int file;
    if (access(path, F_OK) == 0) return add_file(set, path, &file, errors);
    fprintf(errors, "%s: a folder without %s or %s\n", dir, SAFETENSORS_SINGLE_FILE, SAFETENSORS_INDEX_FILE);
    return 1;
}

int safetensors_probe(const char *path)
{
    if (ends_with(path, INDEX_SUFFIX) || is_folder(path)) return 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    unsigned char head[9];
    ssize_t got = pread(fd, head, sizeof head, 0);
    close(fd);
    return got == (ssize_t)sizeof head && head[8] == '{';
}

safetensors *safetensors_open(const char *path, FILE *errors)
{
    safetensors *set = xcalloc(1, sizeof *set);
    int file, status = is_folder(path)                ? open_folder(set, path, errors)
                       : ends_with(path, INDEX_SUFFIX) ? open_index(set, path, errors)
                                                       : add_file(set, path, &file, errors);
    if (status == 0) return set;
    safetensors_close(set);
    return NULL;
}

void safetensors_close(safetensors *set)
{
    if (!set) return;
    for (int i = 0; i < set->n_files; i++) {
        if (set->files[i].fd >= 0) close(set->files[i].fd);
        free(set->files[i].path);
    }
    for (int i = 0; i < set->n_entries; i++) free((char *)set->entries[i].info.name);
    free(set->files);
    free(set->entries);
    free(set);
}

int safetensors_count(const safetensors *set) { return set->n_entries; }

const safetensors_tensor *safetensors_at(const safetensors *set, int i) { return &set->entries[i].info; }

const safetensors_tensor *safetensors_find(const safetensors *set, const char *name)
{
    for (int i = 0; i < set->n_entries; i++)
        if (strcmp(set->entries[i].info.name, name) == 0) return &set->entries[i].info;
    return NULL;
}

int safetensors_read_f32(const safetensors *set, const safetensors_tensor *t, float *values, FILE *errors)
{
    const st_entry *e = (const st_entry *)t; /* info is the entry's first member */
    const st_file *f = &set->files[e->file];
    int bytes = safetensors_dtype_bytes(t->dtype);
    if (bytes == 0) {
        fprintf(errors, "%s: tensor %s is %s, not floating point (F32, F16, BF16 or F64)\n", f->path, t->name,
                t->dtype_name);
        return 1;
    }
    unsigned char *raw = xmalloc((size_t)STAGING_ELEMENTS * (size_t)bytes);
    int status = 0;
    for (int64_t first = 0; first < t->n_elements && status == 0; first += STAGING_ELEMENTS) {
        int64_t n = t->n_elements - first < STAGING_ELEMENTS ? t->n_elements - first : STAGING_ELEMENTS;
        ssize_t got = pread(f->fd, raw, (size_t)(n * bytes), (off_t)(f->data_start + e->begin + first * bytes));
        if (got != (ssize_t)(n * bytes)) {
            fprintf(errors, "%s: reading tensor %s failed: %s\n", f->path, t->name,
                    got < 0 ? strerror(errno) : "the file ended early (was it truncated since it was opened?)");
            status = 1;
        } else {
            convert_to_f32(t->dtype, raw, n, values + first);
        }
    }
    free(raw);
    return status;
}

/* ---- writing -------------------------------------------------------------------------------------------- */

struct safetensors_writer {
    char *path;
    FILE *out;
    FILE *errors;
    safetensors_dtype dtype;
    int n_tensors, next;
    int64_t *n_elements;
};

static json_t *header_json(int n, const char *const *names, const int *ndims,
                           const int64_t (*shapes)[SAFETENSORS_MAX_NDIM], safetensors_dtype dtype, int64_t *counts)
{
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    int64_t offset = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        counts[i] = 1;
        for (int d = 0; d < ndims[i]; d++) {
            json_array_append_new(shape, json_integer(shapes[i][d]));
            counts[i] *= shapes[i][d];
        }
        int64_t end = offset + counts[i] * safetensors_dtype_bytes(dtype);
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtype == SAFETENSORS_BF16 ? "BF16" : "F32", "shape",
                                  shape, "data_offsets", (json_int_t)offset, (json_int_t)end);
        if (!entry || json_object_set_new(root, names[i], entry) != 0) {
            json_decref(root);
            return NULL;
        }
        offset = end;
    }
    return root;
}

static int write_header(safetensors_writer *w, json_t *root)
{
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return 1;
    uint64_t length = strlen(text), padded = (length + 7) / 8 * 8;
    int status = fwrite(&padded, 8, 1, w->out) != 1 || fwrite(text, 1, length, w->out) != length;
    for (uint64_t i = length; i < padded && status == 0; i++) status = fputc(' ', w->out) == EOF;
    free(text);
    return status;
}

safetensors_writer *safetensors_writer_open(const char *path, int n_tensors, const char *const *names,
                                            const int *ndims, const int64_t (*shapes)[SAFETENSORS_MAX_NDIM],
                                            safetensors_dtype dtype, FILE *errors)
{
    if (dtype != SAFETENSORS_F32 && dtype != SAFETENSORS_BF16) {
        fprintf(errors, "%s: safetensors files are written as F32 or BF16 only\n", path);
        return NULL;
    }
    safetensors_writer *w = xcalloc(1, sizeof *w);
    *w = (safetensors_writer){.path = xmalloc(strlen(path) + 1), .errors = errors, .dtype = dtype,
                              .n_tensors = n_tensors, .n_elements = xmalloc((size_t)(n_tensors + 1) * sizeof(int64_t))};
    strcpy(w->path, path);
    w->out = fopen(path, "wb");
    if (!w->out) {
        fprintf(errors, "%s: cannot create: %s\n", path, strerror(errno));
        safetensors_writer_abort(w);
        return NULL;
    }
    json_t *root = header_json(n_tensors, names, ndims, shapes, dtype, w->n_elements);
    int status = !root || write_header(w, root);
    json_decref(root);
    if (status == 0) return w;
    fprintf(errors, "%s: writing the safetensors header failed: %s\n", path,
            root ? strerror(errno) : "a tensor name is not UTF-8 or is given twice");
    safetensors_writer_abort(w);
    return NULL;
}

int safetensors_writer_put(safetensors_writer *w, const float *values)
{
    if (w->next >= w->n_tensors) {
        fprintf(w->errors, "%s: more tensors put than the header announced (%d)\n", w->path, w->n_tensors);
        return 1;
    }
    int64_t n = w->n_elements[w->next++];
    int status = 0;
    if (w->dtype == SAFETENSORS_F32) {
        status = fwrite(values, sizeof(float), (size_t)n, w->out) != (size_t)n;
    } else { /* converted a staging buffer at a time */
        uint16_t *bits = xmalloc((size_t)STAGING_ELEMENTS * sizeof *bits);
        for (int64_t first = 0; first < n && status == 0; first += STAGING_ELEMENTS) {
            int64_t count = n - first < STAGING_ELEMENTS ? n - first : STAGING_ELEMENTS;
            for (int64_t i = 0; i < count; i++) bits[i] = f32_to_bf16(values[first + i]);
            status = fwrite(bits, sizeof *bits, (size_t)count, w->out) != (size_t)count;
        }
        free(bits);
    }
    if (status) fprintf(w->errors, "%s: writing tensor %d failed: %s\n", w->path, w->next - 1, strerror(errno));
    return status;
}

static void writer_free(safetensors_writer *w)
{
    free(w->path);
    free(w->n_elements);
    free(w);
}

int safetensors_writer_close(safetensors_writer *w)
{
    int status = 0;
    if (w->next != w->n_tensors) {
        fprintf(w->errors, "%s: %d of %d tensors written\n", w->path, w->next, w->n_tensors);
        status = 1;
    } else if (fflush(w->out) != 0 || fsync(fileno(w->out)) != 0) {
        fprintf(w->errors, "%s: flushing failed: %s\n", w->path, strerror(errno));
        status = 1;
    }
    if (fclose(w->out) != 0 && status == 0) {
        fprintf(w->errors, "%s: closing failed: %s\n", w->path, strerror(errno));
        status = 1;
    }
    w->out = NULL;
    if (status) unlink(w->path);
    writer_free(w);
    return status;
}

void safetensors_writer_abort(safetensors_writer *w)
{
    if (!w) return;
    if (w->out) {
        fclose(w->out);
        unlink(w->path);
    }
    writer_free(w);
}

int safetensors_write_index(const char *path, int n_tensors, const char *const *names, const char *const *files,
                            int64_t total_bytes, FILE *errors)
{
    json_t *map = json_object();
    for (int i = 0; i < n_tensors; i++) json_object_set_new(map, names[i], json_string(files[i]));
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total_bytes, "weight_map", map);
    FILE *out = fopen(path, "w");
    int status = !out || json_dumpf(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 || fputc('\n', out) == EOF ||
                 fflush(out) != 0 || fsync(fileno(out)) != 0;
    if (out && fclose(out) != 0) status = 1;
    if (status) fprintf(errors, "%s: writing the safetensors index failed: %s\n", path, strerror(errno));
    json_decref(root);
    return status;
}
