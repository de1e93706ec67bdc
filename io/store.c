/* store.c — the HDF5 latent store: format checks, index read and broadcast, fp32 sample reads, checksummed writer. */
#include "io/store.h"
#include "core/check.h"
#include "core/comm.h"
#include "io/h5util.h"

#include <hdf5.h>
#include <zlib.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "the store keeps HDF5 handles as int64_t (HDF5 >= 1.10)");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the store's checksums are defined over little-endian bytes; this host is big-endian"
#endif

/* Limits that keep every product of index fields inside int64 and reject nonsense from a corrupt index. */
enum { MAX_CHANNELS = 4096, MAX_DIM = 65536, MAX_TEXT_LEN = 1 << 20, MAX_TEXT_DIM = 1 << 20 };
/* Elements per chunk of /latents and /text (512 KiB of bf16, 1 MiB of f32). */
#define CHUNK_ELEMENTS ((hsize_t)1 << 18)
/* Bad index rows printed before the rest are only counted. */
#define MAX_REPORTED_ROWS 10

/* ---- precision names and conversions ------------------------------------------------------------ */

const char *store_precision_name(store_precision precision)
{
    switch (precision) {
    case STORE_BF16: return "bf16";
    case STORE_F16: return "f16";
    case STORE_F32: return "f32";
    }
    return "?";
}

int store_precision_parse(const char *name, store_precision *precision)
{
    for (int p = STORE_BF16; p <= STORE_F32; p++) {
        if (strcmp(name, store_precision_name((store_precision)p)) == 0) {
            *precision = (store_precision)p;
            return 0;
        }
    }
    return 1;
}

int store_precision_bytes(store_precision precision) { return precision == STORE_F32 ? 4 : 2; }

uint16_t store_f32_to_bf16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

float store_bf16_to_f32(uint16_t bits)
{
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

uint16_t store_f32_to_f16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x0200u : 0u));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (magnitude < 0x38800000u) /* below 2^-14: subnormal, a multiple of 2^-24 (exact scaling, rint rounds to even) */
        return (uint16_t)(sign | (uint16_t)lrintf(fabsf(value) * 16777216.0f));
    magnitude -= (uint32_t)(127 - 15) << 23;
    magnitude += 0x0fffu + ((magnitude >> 13) & 1u);
    return (uint16_t)(sign | (magnitude >> 13));
}

float store_f16_to_f32(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
    uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    uint32_t wide;
    if (exponent == 0) {
        float magnitude = (float)mantissa * 0x1.0p-24f;
        memcpy(&wide, &magnitude, sizeof wide);
        wide |= sign;
    } else if (exponent == 31) {
        wide = sign | 0x7f800000u | (mantissa << 13);
    } else {
        wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* ---- CRC-32 ------------------------------------------------------------------------------------- */

uint32_t store_crc32(uint32_t crc, const void *bytes, size_t n_bytes)
{
    const Bytef *data = bytes;
    uLong value = crc;
    while (n_bytes > 0) { /* zlib takes uInt lengths: feed it at most 1 GiB at a time */
        uInt piece = n_bytes > (size_t)1 << 30 ? (uInt)1 << 30 : (uInt)n_bytes;
        value = crc32(value, data, piece);
        data += piece;
        n_bytes -= piece;
    }
    return (uint32_t)value;
}

/* ---- sample geometry ---------------------------------------------------------------------------- */

int64_t store_sample_tokens(const store_sample *sample, int patch_t, int patch_h, int patch_w)
{
    return (int64_t)(sample->frames / patch_t) * (sample->height / patch_h) * (sample->width / patch_w);
}

int64_t store_sample_latent_elements(const store_sample *sample)
{
    return (int64_t)sample->channels * sample->frames * sample->height * sample->width;
}

int64_t store_sample_text_elements(const store *s, const store_sample *sample)
{
    return (int64_t)sample->text_len * s->text_dim;
}

int64_t store_sample_text_2_elements(const store *s, int64_t id)
{
    return s->sources ? (int64_t)s->sources[id].text_2_len * s->text_2_dim : 0;
}

int64_t store_sample_image_elements(const store *s, int64_t id)
{
    return s->sources ? (int64_t)s->sources[id].image_len * s->image_dim : 0;
}

/* ---- HDF5 error handling: HDF5's own stack printing is off while the store works; we print ours ---- */

typedef struct { char message[256]; int system_errno; } h5_error_found;

/* Keeps the innermost description, and the first `errno = N` a file driver put in any of them. */
static herr_t keep_innermost(unsigned depth, const H5E_error2_t *error, void *found_pointer)
{
    h5_error_found *found = found_pointer;
    if (depth == 0 && error->desc) snprintf(found->message, sizeof found->message, "%s", error->desc);
    const char *at = error->desc ? strstr(error->desc, "errno = ") : NULL;
    if (at && !found->system_errno) found->system_errno = atoi(at + 8);
    return 0;
}

/* The innermost description on HDF5's error stack (the most specific one), then clear the stack. When a
   system call failed beneath HDF5 (a write on a full disk), the message is that errno's text instead. */
static void h5_last_error(char message[256])
{
    h5_error_found found = {.message = "no HDF5 error message"};
    if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &found) < 0) snprintf(found.message, 256, "unknown HDF5 error");
    if (found.system_errno > 0) snprintf(message, 256, "%s", strerror(found.system_errno));
    else snprintf(message, 256, "%s", found.message);
    H5Eclear2(H5E_DEFAULT);
}

/* Print "PATH: message" and return 1. */
__attribute__((format(printf, 3, 4)))
static int report(FILE *errors, const char *path, const char *format, ...)
{
    va_list args;
    fprintf(errors, "%s: ", path);
    va_start(args, format);
    vfprintf(errors, format, args);
    va_end(args);
    fputc('\n', errors);
    return 1;
}

/* Print "PATH: message (HDF5: innermost HDF5 message)" and return 1. */
__attribute__((format(printf, 3, 4)))
static int report_h5(FILE *errors, const char *path, const char *format, ...)
{
    char h5_message[256];
    h5_last_error(h5_message);
    va_list args;
    fprintf(errors, "%s: ", path);
    va_start(args, format);
    vfprintf(errors, format, args);
    va_end(args);
    fprintf(errors, " (HDF5: %s)\n", h5_message);
    return 1;
}

/* A 16-bit IEEE half type (what h5py writes for numpy float16). Caller closes it. */
static hid_t half_type_create(void)
{
    hid_t type = H5Tcopy(H5T_IEEE_F32LE);
    if (type < 0) return -1;
    if (H5Tset_fields(type, 15, 10, 5, 0, 10) < 0 || H5Tset_size(type, 2) < 0 || H5Tset_ebias(type, 15) < 0) {
        H5Tclose(type);
        return -1;
    }
    return type;
}

/* The in-memory type we read and write a precision's values with (the raw stored bit patterns). */
static hid_t memory_type_create(store_precision precision)
{
    switch (precision) {
    case STORE_BF16: return H5Tcopy(H5T_NATIVE_UINT16);
    case STORE_F16: return half_type_create();
    case STORE_F32: return H5Tcopy(H5T_NATIVE_FLOAT);
    }
    return -1;
}

/* ---- reading attributes ------------------------------------------------------------------------- */

/* Opens root attribute `name` if present: >0 handle, 0 when missing (message printed), <0 on error. */
static hid_t open_root_attribute(hid_t file, const char *name, const char *path, FILE *errors)
{
    htri_t exists = H5Aexists_by_name(file, "/", name, H5P_DEFAULT);
    if (exists < 0) { report_h5(errors, path, "cannot look up root attribute %s", name); return -1; }
    if (exists == 0) { report(errors, path, "root attribute %s is missing (not an aldit store?)", name); return 0; }
    hid_t attribute = H5Aopen_by_name(file, "/", name, H5P_DEFAULT, H5P_DEFAULT);
    if (attribute < 0) report_h5(errors, path, "cannot open root attribute %s", name);
    return attribute;
}

/* Checks that attribute holds a single value of `expected_class`. 0 ok. */
static int check_attribute_shape(hid_t attribute, H5T_class_t expected_class, const char *name, const char *path,
                                 FILE *errors)
{
    hid_t type = H5Aget_type(attribute), space = H5Aget_space(attribute);
    int failed = 0;
    if (type < 0 || space < 0) {
        failed = report_h5(errors, path, "cannot query root attribute %s", name);
    } else if (H5Tget_class(type) != expected_class) {
        failed = report(errors, path, "root attribute %s has the wrong type (expected %s)", name,
                        expected_class == H5T_INTEGER ? "an integer" : "a string");
    } else if (H5Sget_simple_extent_npoints(space) != 1) {
        failed = report(errors, path, "root attribute %s must hold one value", name);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    return failed;
}

static int read_int_attribute(hid_t file, const char *name, int64_t *value, const char *path, FILE *errors)
{
    hid_t attribute = open_root_attribute(file, name, path, errors);
    if (attribute <= 0) return 1;
    int failed = check_attribute_shape(attribute, H5T_INTEGER, name, path, errors);
    if (!failed && H5Aread(attribute, H5T_NATIVE_INT64, value) < 0)
        failed = report_h5(errors, path, "cannot read root attribute %s", name);
    if (H5Aclose(attribute) < 0 && !failed) failed = report_h5(errors, path, "cannot close root attribute %s", name);
    return failed;
}

/* Reads one string attribute value, fixed- or variable-length, ASCII or UTF-8, any padding (h5py writes
   Python str as variable-length UTF-8, numpy bytes as fixed-length): trailing NULs and spaces dropped.
   `what` names it in messages ("root attribute latent_dtype"). 0 ok. */
static int read_string_value(hid_t attribute, const char *what, char *value, size_t value_size, const char *path,
                             FILE *errors)
{
    hid_t file_type = H5Aget_type(attribute), memory_type = -1;
    if (file_type < 0) return report_h5(errors, path, "cannot query %s", what);
    htri_t variable = H5Tis_variable_str(file_type);
    H5T_cset_t cset = H5Tget_cset(file_type);
    size_t size = H5Tget_size(file_type);
    int failed = 0;
    if (variable < 0 || cset < 0) {
        failed = report_h5(errors, path, "cannot query %s", what);
    } else if (!variable && (size == 0 || size >= value_size)) {
        failed = report(errors, path, "%s: a string of %zu bytes is longer than expected", what, size);
    } else {
        /* read through a memory type of the file's own character set: HDF5 converts no character sets */
        memory_type = H5Tcopy(H5T_C_S1);
        char *text = NULL;
        if (memory_type < 0 || H5Tset_cset(memory_type, cset) < 0 ||
            H5Tset_size(memory_type, variable ? H5T_VARIABLE : size + 1) < 0 ||
            H5Tset_strpad(memory_type, H5T_STR_NULLTERM) < 0 ||
            H5Aread(attribute, memory_type, variable ? (void *)&text : (void *)value) < 0) {
            failed = report_h5(errors, path, "cannot read %s", what);
        } else if (variable) {
            snprintf(value, value_size, "%s", text ? text : "");
            if (text && H5free_memory(text) < 0) failed = report_h5(errors, path, "cannot free %s", what);
        }
    }
    if (!failed) {
        size_t length = strlen(value);
        while (length > 0 && value[length - 1] == ' ') value[--length] = '\0';
    }
    if (memory_type >= 0) H5Tclose(memory_type);
    H5Tclose(file_type);
    return failed;
}

/* Reads a root string attribute (one value). */
static int read_string_attribute(hid_t file, const char *name, char *value, size_t value_size, const char *path,
                                 FILE *errors)
{
    hid_t attribute = open_root_attribute(file, name, path, errors);
    if (attribute <= 0) return 1;
    char what[96];
    snprintf(what, sizeof what, "root attribute %s", name);
    int failed = check_attribute_shape(attribute, H5T_STRING, name, path, errors) ||
                 read_string_value(attribute, what, value, value_size, path, errors);
    if (H5Aclose(attribute) < 0 && !failed) failed = report_h5(errors, path, "cannot close root attribute %s", name);
    return failed;
}

static int read_precision_attribute(hid_t file, const char *name, store_precision *precision, const char *path,
                                    FILE *errors)
{
    char value[64];
    if (read_string_attribute(file, name, value, sizeof value, path, errors)) return 1;
    if (store_precision_parse(value, precision))
        return report(errors, path, "root attribute %s is '%s'; expected bf16, f16 or f32", name, value);
    return 0;
}

/* ---- opening ------------------------------------------------------------------------------------ */

static void handles_reset(store *s) { s->h5_file = s->h5_latents = s->h5_text = s->h5_text_2 = s->h5_image = -1; }

static int open_file(store *s, const char *path, FILE *errors)
{
    if (strlen(path) >= sizeof s->path) return report(errors, path, "path longer than %zu characters", sizeof s->path - 1);
    snprintf(s->path, sizeof s->path, "%s", path);
    struct stat info;
    if (stat(path, &info) != 0) return report(errors, path, "cannot open store: %s", strerror(errno));
    if (!S_ISREG(info.st_mode)) return report(errors, path, "not a regular file");
    htri_t is_hdf5 = H5Fis_hdf5(path);
    if (is_hdf5 < 0) return report_h5(errors, path, "cannot read the file");
    if (is_hdf5 == 0) return report(errors, path, "not an HDF5 file");
    s->h5_file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (s->h5_file < 0) return report_h5(errors, path, "cannot open as HDF5 (truncated or corrupt file?)");
    return 0;
}

/* Opens a dataset after checking it exists and is a dataset. `access` may be H5P_DEFAULT. */
static hid_t open_dataset(hid_t file, const char *name, hid_t access, const char *path, FILE *errors)
{
    htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
    if (exists < 0) { report_h5(errors, path, "cannot look up dataset %s", name); return -1; }
    if (exists == 0) { report(errors, path, "dataset %s is missing", name); return -1; }
    hid_t object = H5Oopen(file, name, H5P_DEFAULT);
    if (object < 0) { report_h5(errors, path, "cannot open %s", name); return -1; }
    H5I_type_t kind = H5Iget_type(object);
    if (H5Oclose(object) < 0) { report_h5(errors, path, "cannot close %s", name); return -1; }
    if (kind != H5I_DATASET) { report(errors, path, "%s is not a dataset", name); return -1; }
    hid_t dataset = H5Dopen2(file, name, access);
    if (dataset < 0) report_h5(errors, path, "cannot open dataset %s", name);
    return dataset;
}

/* Dimensions of a dataset, checking its rank. 0 ok. */
static int dataset_dims(hid_t dataset, const char *name, int expected_rank, hsize_t *dims, const char *path, FILE *errors)
{
    hid_t space = H5Dget_space(dataset);
    if (space < 0) return report_h5(errors, path, "cannot query the shape of %s", name);
    int failed = 0, rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0) failed = report_h5(errors, path, "cannot query the shape of %s", name);
    else if (rank != expected_rank) failed = report(errors, path, "%s has %d dimensions, expected %d", name, rank, expected_rank);
    else if (H5Sget_simple_extent_dims(space, dims, NULL) < 0) failed = report_h5(errors, path, "cannot query the shape of %s", name);
    if (H5Sclose(space) < 0 && !failed) failed = report_h5(errors, path, "cannot close the dataspace of %s", name);
    return failed;
}

/* Names an HDF5 element type the way numpy would ("int16", "uint16", "float16", "float64"), or describes it. */
static void type_name(hid_t type, char *name, size_t name_size)
{
    H5T_class_t type_class = H5Tget_class(type);
    size_t bits = 8 * H5Tget_size(type);
    if (type_class == H5T_INTEGER) {
        snprintf(name, name_size, "%sint%zu", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    } else if (type_class == H5T_FLOAT) {
        size_t sign_position, exponent_position, exponent_size, mantissa_position, mantissa_size;
        if (H5Tget_fields(type, &sign_position, &exponent_position, &exponent_size, &mantissa_position, &mantissa_size) < 0)
            snprintf(name, name_size, "%zu-bit float", bits);
        else
            snprintf(name, name_size, "float%zu (%zu exponent, %zu mantissa bits)", bits, exponent_size, mantissa_size);
    } else {
        static const char *const classes[] = {"time", "string", "bitfield", "opaque", "compound", "reference", "enum",
                                               "variable-length", "array"};
        int index = (int)type_class - (int)H5T_TIME;
        snprintf(name, name_size, "%s", index >= 0 && index < 9 ? classes[index] : "unknown-type");
    }
}

/* 1 when `type` is exactly what `precision` stores (either byte order: HDF5 converts it on reading). */
static int type_matches(hid_t type, store_precision precision)
{
    H5T_class_t type_class = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    if (precision == STORE_BF16) return type_class == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE;
    if (type_class != H5T_FLOAT || size != (size_t)store_precision_bytes(precision)) return 0;
    size_t sign_position, exponent_position, exponent_size, mantissa_position, mantissa_size;
    if (H5Tget_fields(type, &sign_position, &exponent_position, &exponent_size, &mantissa_position, &mantissa_size) < 0)
        return 0;
    size_t bias = H5Tget_ebias(type);
    if (precision == STORE_F16)
        return sign_position == 15 && exponent_position == 10 && exponent_size == 5 && mantissa_position == 0 &&
               mantissa_size == 10 && bias == 15;
    return sign_position == 31 && exponent_position == 23 && exponent_size == 8 && mantissa_position == 0 &&
           mantissa_size == 23 && bias == 127;
}

/* /latents and /text must hold exactly the precision's element type: an int16 or float64 dataset read as
   bf16 or f32 would give wrong values (HDF5 converts silently). */
static int check_values_type(hid_t dataset, const char *name, const char *attribute_name, store_precision precision,
                             const char *path, FILE *errors)
{
    hid_t type = H5Dget_type(dataset);
    if (type < 0) return report_h5(errors, path, "cannot query the type of %s", name);
    int failed = 0;
    if (!type_matches(type, precision)) {
        char found[96];
        type_name(type, found, sizeof found);
        failed = report(errors, path, "%s holds %s values, but %s = %s needs %s", name, found, attribute_name,
                        store_precision_name(precision),
                        precision == STORE_BF16 ? "uint16 (bfloat16 bit patterns)"
                                                : precision == STORE_F16 ? "float16 (IEEE half)" : "float32 (IEEE single)");
    }
    H5Tclose(type);
    return failed;
}

/* Every filter in the dataset's pipeline (compression, shuffle, ...) must be available to this HDF5 for
   decoding; otherwise the store would open and fail only at the first sample in a filtered chunk. */
static int check_filters(hid_t dataset, const char *name, const char *path, FILE *errors)
{
    hid_t create = H5Dget_create_plist(dataset);
    if (create < 0) return report_h5(errors, path, "cannot query the creation properties of %s", name);
    int n_filters = H5Pget_nfilters(create), failed = 0;
    if (n_filters < 0) failed = report_h5(errors, path, "cannot query the filters of %s", name);
    for (int i = 0; i < n_filters && !failed; i++) {
        unsigned int flags = 0, config = 0;
        size_t n_values = 0;
        char filter_name[128] = "";
        H5Z_filter_t filter = H5Pget_filter2(create, (unsigned)i, &flags, &n_values, NULL, sizeof filter_name, filter_name,
                                             &config);
        if (filter < 0) { failed = report_h5(errors, path, "cannot query filter %d of %s", i, name); break; }
        htri_t available = H5Zfilter_avail(filter);
        unsigned int info = 0;
        if (available > 0 && H5Zget_filter_info(filter, &info) < 0) available = -1;
        if (available <= 0 || !(info & H5Z_FILTER_CONFIG_DECODE_ENABLED))
            failed = report(errors, path, "%s is stored through HDF5 filter %d%s%s%s, which this HDF5 cannot decode "
                                          "(rewrite the store without it, or install the filter plugin)",
                            name, (int)filter, filter_name[0] ? " (" : "", filter_name, filter_name[0] ? ")" : "");
    }
    H5Pclose(create);
    H5Eclear2(H5E_DEFAULT);
    return failed;
}

/* Opens /latents or /text: 1-D, element type matching `precision`. Sets *length. */
static int open_values(hid_t file, const char *name, const char *attribute_name, store_precision precision,
                       hid_t *dataset, int64_t *length, const char *path, FILE *errors)
{
    /* Reads are small and random: no chunk cache, so HDF5 reads only the selected bytes of a chunk. */
    hid_t access = H5Pcreate(H5P_DATASET_ACCESS);
    if (access < 0 || H5Pset_chunk_cache(access, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT) < 0) {
        if (access >= 0) H5Pclose(access);
        return report_h5(errors, path, "cannot set up access to %s", name);
    }
    *dataset = open_dataset(file, name, access, path, errors);
    H5Pclose(access);
    if (*dataset < 0) return 1;
    hsize_t dims[1];
    if (dataset_dims(*dataset, name, 1, dims, path, errors)) return 1;
    *length = (int64_t)dims[0];
    return check_filters(*dataset, name, path, errors) || check_values_type(*dataset, name, attribute_name, precision, path, errors);
}

static int read_attributes(store *s, FILE *errors)
{
    int64_t version = 0, text_dim = 0, channels = 0;
    if (read_int_attribute(s->h5_file, "aldit_store_version", &version, s->path, errors)) return 1;
    if (version != STORE_FORMAT_VERSION)
        return report(errors, s->path, "store format version %lld, this aldit reads version %d",
                      (long long)version, STORE_FORMAT_VERSION);
    if (read_precision_attribute(s->h5_file, "latent_dtype", &s->latent_precision, s->path, errors) ||
        read_precision_attribute(s->h5_file, "text_dtype", &s->text_precision, s->path, errors) ||
        read_int_attribute(s->h5_file, "text_dim", &text_dim, s->path, errors) ||
        read_int_attribute(s->h5_file, "latent_channels", &channels, s->path, errors))
        return 1;
    if (text_dim < 1 || text_dim > MAX_TEXT_DIM)
        return report(errors, s->path, "root attribute text_dim = %lld is outside [1, %d]", (long long)text_dim, MAX_TEXT_DIM);
    if (channels < 1 || channels > MAX_CHANNELS)
        return report(errors, s->path, "root attribute latent_channels = %lld is outside [1, %d]", (long long)channels, MAX_CHANNELS);
    s->text_dim = (int32_t)text_dim;
    s->latent_channels = (int32_t)channels;
    return 0;
}

static int open_value_datasets(store *s, FILE *errors)
{
    return open_values(s->h5_file, "/latents", "latent_dtype", s->latent_precision, &s->h5_latents, &s->latents_length,
                       s->path, errors) ||
           open_values(s->h5_file, "/text", "text_dtype", s->text_precision, &s->h5_text, &s->text_length, s->path, errors);
}

/* Checks that the optional `columns` attribute of an index dataset (`name`), if present, names `expected`. */
static int check_columns(hid_t index, const char *name, const char *expected, const char *path, FILE *errors)
{
    htri_t exists = H5Aexists(index, "columns");
    if (exists < 0) return report_h5(errors, path, "cannot look up %s attribute columns", name);
    if (exists == 0) return 0;
    hid_t attribute = H5Aopen(index, "columns", H5P_DEFAULT);
    if (attribute < 0) return report_h5(errors, path, "cannot open %s attribute columns", name);
    hid_t file_type = H5Aget_type(attribute), space = H5Aget_space(attribute);
    char columns[256] = "", what[64];
    snprintf(what, sizeof what, "%s attribute columns", name);
    int failed = 0;
    if (file_type < 0 || space < 0) failed = report_h5(errors, path, "cannot query %s", what);
    else if (H5Tget_class(file_type) != H5T_STRING) failed = report(errors, path, "%s is not a string", what);
    else if (H5Sget_simple_extent_npoints(space) != 1) failed = report(errors, path, "%s must hold one value", what);
    else failed = read_string_value(attribute, what, columns, sizeof columns, path, errors);
    if (!failed && strcmp(columns, expected) != 0)
        failed = report(errors, path, "%s columns are '%s'; expected '%s'", name, columns, expected);
    if (space >= 0) H5Sclose(space);
    if (file_type >= 0) H5Tclose(file_type);
    H5Aclose(attribute);
    return failed;
}

/* An index dataset must hold integers of at least 32 bits (the checksum column); *wraps = 1 for a 32-bit signed one,
   whose checksums of 2^31 and above were stored wrapped to negative values. */
static int check_index_type(hid_t index, const char *name, int *wraps, const char *path, FILE *errors)
{
    hid_t type = H5Dget_type(index);
    int failed = 0;
    if (type < 0) failed = report_h5(errors, path, "cannot query the type of %s", name);
    else if (H5Tget_class(type) != H5T_INTEGER) failed = report(errors, path, "%s does not hold integers", name);
    else if (H5Tget_size(type) < 4) {
        char found[96];
        type_name(type, found, sizeof found);
        failed = report(errors, path, "%s holds %s values; the checksum column needs 32 bits (int64, uint32 or int32)",
                        name, found);
    } else *wraps = H5Tget_size(type) == 4 && H5Tget_sign(type) != H5T_SGN_NONE;
    if (type >= 0) H5Tclose(type);
    return failed;
}

/* Checks one index row against the attributes and dataset lengths; returns 1 (and prints unless quiet). */
static int check_row(const store *s, int64_t id, const int64_t *row, int print, FILE *errors)
{
    char why[256] = "";
    int64_t channels = row[0], frames = row[1], height = row[2], width = row[3], text_len = row[4];
    int64_t latent_offset = row[5], text_offset = row[6], checksum = row[7];
    if (channels != s->latent_channels)
        snprintf(why, sizeof why, "channels %lld differ from latent_channels %d", (long long)channels, s->latent_channels);
    else if (frames < 1 || frames > MAX_DIM || height < 1 || height > MAX_DIM || width < 1 || width > MAX_DIM)
        snprintf(why, sizeof why, "shape %lld x %lld x %lld is outside [1, %d]", (long long)frames, (long long)height,
                 (long long)width, MAX_DIM);
    else if (text_len < 1 || text_len > MAX_TEXT_LEN)
        snprintf(why, sizeof why, "text_len %lld is outside [1, %d]", (long long)text_len, MAX_TEXT_LEN);
    else if (checksum < 0 || checksum > (int64_t)UINT32_MAX)
        snprintf(why, sizeof why, "checksum %lld is not a 32-bit value", (long long)checksum);
    else {
        int64_t latent_count = channels * frames * height * width, text_count = text_len * s->text_dim;
        if (latent_offset < 0 || latent_offset > s->latents_length - latent_count)
            snprintf(why, sizeof why, "latent range [%lld, %lld) is outside /latents (length %lld)",
                     (long long)latent_offset, (long long)(latent_offset + latent_count), (long long)s->latents_length);
        else if (text_offset < 0 || text_offset > s->text_length - text_count)
            snprintf(why, sizeof why, "text range [%lld, %lld) is outside /text (length %lld)", (long long)text_offset,
                     (long long)(text_offset + text_count), (long long)s->text_length);
    }
    if (!why[0]) return 0;
    if (print) report(errors, s->path, "/index row %lld (sample %lld): %s (truncated or corrupt index)", (long long)id,
                      (long long)id, why);
    return 1;
}

static int read_index(store *s, FILE *errors)
{
    hid_t index = open_dataset(s->h5_file, "/index", H5P_DEFAULT, s->path, errors);
    if (index < 0) return 1;
    hsize_t dims[2];
    int64_t *rows = NULL;
    int failed = dataset_dims(index, "/index", 2, dims, s->path, errors) || check_filters(index, "/index", s->path, errors) ||
                 check_columns(index, "/index", STORE_INDEX_COLUMN_NAMES, s->path, errors);
    int wraps = 0; /* a 32-bit signed index: checksums >= 2^31 were stored wrapped to negative values */
    if (!failed && dims[1] != STORE_INDEX_COLUMNS)
        failed = report(errors, s->path, "/index has %llu columns, expected %d (%s)", (unsigned long long)dims[1],
                        STORE_INDEX_COLUMNS, STORE_INDEX_COLUMN_NAMES);
    if (!failed && dims[0] == 0) failed = report(errors, s->path, "/index holds no samples");
    if (!failed && dims[0] > (hsize_t)s->latents_length) /* every sample holds at least one latent value */
        failed = report(errors, s->path, "/index has %llu rows but /latents only %lld values (corrupt index)",
                        (unsigned long long)dims[0], (long long)s->latents_length);
    if (!failed) failed = check_index_type(index, "/index", &wraps, s->path, errors);
    if (!failed) {
        rows = xmalloc((size_t)dims[0] * STORE_INDEX_COLUMNS * sizeof *rows);
        if (H5Dread(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) < 0)
            failed = report_h5(errors, s->path, "cannot read /index (truncated or corrupt file?)");
    }
    if (H5Dclose(index) < 0 && !failed) failed = report_h5(errors, s->path, "cannot close /index");
    if (failed) { free(rows); return 1; }

    int64_t n_samples = (int64_t)dims[0], n_bad = 0;
    for (int64_t id = 0; wraps && id < n_samples; id++) { /* read the checksum's 32 bits as unsigned */
        int64_t *checksum = &rows[id * STORE_INDEX_COLUMNS + 7];
        if (*checksum < 0) *checksum += INT64_C(1) << 32;
    }
    for (int64_t id = 0; id < n_samples; id++)
        n_bad += check_row(s, id, rows + id * STORE_INDEX_COLUMNS, n_bad < MAX_REPORTED_ROWS, errors);
    if (n_bad > MAX_REPORTED_ROWS)
        report(errors, s->path, "... %lld bad index rows in all", (long long)n_bad);
    if (n_bad) { free(rows); return 1; }

    s->n_samples = n_samples;
    s->samples = xmalloc((size_t)n_samples * sizeof *s->samples);
    for (int64_t id = 0; id < n_samples; id++) {
        const int64_t *row = rows + id * STORE_INDEX_COLUMNS;
        store_sample *sample = &s->samples[id];
        *sample = (store_sample){.channels = (int32_t)row[0], .frames = (int32_t)row[1], .height = (int32_t)row[2],
                                 .width = (int32_t)row[3], .text_len = (int32_t)row[4], .latent_offset = row[5],
                                 .text_offset = row[6], .checksum = (uint32_t)row[7]};
        int64_t latent_count = store_sample_latent_elements(sample), text_count = store_sample_text_elements(s, sample);
        if (latent_count > s->max_latent_elements) s->max_latent_elements = latent_count;
        if (text_count > s->max_text_elements) s->max_text_elements = text_count;
    }
    free(rows);
    return 0;
}

/* ---- the caption sources (optional: all of these objects or none) ---------------------------------- */

static const char *const source_objects[] = {"text_2_dim", "text_2_dtype", "image_dim", "image_dtype", "/text_2", "/image",
                                             "/index_sources"};
enum { N_SOURCE_OBJECTS = sizeof source_objects / sizeof source_objects[0] };

/* Which of the source objects the file has: sets *has_sources, or reports the first missing one of a partial set. */
static int find_sources(store *s, FILE *errors)
{
    int present[N_SOURCE_OBJECTS], n_present = 0;
    for (int i = 0; i < N_SOURCE_OBJECTS; i++) {
        const char *name = source_objects[i];
        htri_t exists = name[0] == '/' ? H5Lexists(s->h5_file, name, H5P_DEFAULT)
                                       : H5Aexists_by_name(s->h5_file, "/", name, H5P_DEFAULT);
        if (exists < 0) return report_h5(errors, s->path, "cannot look up %s", name);
        present[i] = exists > 0;
        n_present += present[i];
    }
    s->has_sources = n_present == N_SOURCE_OBJECTS;
    if (n_present == 0 || s->has_sources) return 0;
    int have = 0, missing = 0;
    while (!present[have]) have++;
    while (present[missing]) missing++;
    return report(errors, s->path, "the caption sources are incomplete: %s%s is missing, but the store has %s%s (all of "
                  "text_2_dim, text_2_dtype, image_dim, image_dtype, /text_2, /image, /index_sources, or none)",
                  source_objects[missing][0] == '/' ? "" : "root attribute ", source_objects[missing],
                  source_objects[have][0] == '/' ? "" : "root attribute ", source_objects[have]);
}

static int read_source_attributes(store *s, FILE *errors)
{
    int64_t dims[2] = {0, 0};
    if (read_int_attribute(s->h5_file, "text_2_dim", &dims[0], s->path, errors) ||
        read_precision_attribute(s->h5_file, "text_2_dtype", &s->text_2_precision, s->path, errors) ||
        read_int_attribute(s->h5_file, "image_dim", &dims[1], s->path, errors) ||
        read_precision_attribute(s->h5_file, "image_dtype", &s->image_precision, s->path, errors))
        return 1;
    for (int i = 0; i < 2; i++)
        if (dims[i] < 1 || dims[i] > MAX_TEXT_DIM)
            return report(errors, s->path, "root attribute %s = %lld is outside [1, %d]", i ? "image_dim" : "text_2_dim",
                          (long long)dims[i], MAX_TEXT_DIM);
    s->text_2_dim = (int32_t)dims[0];
    s->image_dim = (int32_t)dims[1];
    return 0;
}

static int open_source_datasets(store *s, FILE *errors)
{
    return open_values(s->h5_file, "/text_2", "text_2_dtype", s->text_2_precision, &s->h5_text_2, &s->text_2_length,
                       s->path, errors) ||
           open_values(s->h5_file, "/image", "image_dtype", s->image_precision, &s->h5_image, &s->image_length, s->path,
                       errors);
}

/* Checks one /index_sources row; returns 1 (and prints unless quiet). */
static int check_sources_row(const store *s, int64_t id, const int64_t *row, int print, FILE *errors)
{
    char why[256] = "";
    const char *names[2] = {"text_2", "image"};
    const int64_t widths[2] = {s->text_2_dim, s->image_dim}, lengths[2] = {s->text_2_length, s->image_length};
    for (int k = 0; k < 2 && !why[0]; k++) {
        const int64_t len = row[2 * k], offset = row[2 * k + 1], count = len * widths[k];
        if (len < 0 || len > MAX_TEXT_LEN)
            snprintf(why, sizeof why, "%s_len %lld is outside [0, %d]", names[k], (long long)len, MAX_TEXT_LEN);
        else if (offset < 0 || offset > lengths[k] - count)
            snprintf(why, sizeof why, "%s range [%lld, %lld) is outside /%s (length %lld)", names[k], (long long)offset,
                     (long long)(offset + count), names[k], (long long)lengths[k]);
    }
    if (!why[0] && (row[4] < 0 || row[4] > (int64_t)UINT32_MAX))
        snprintf(why, sizeof why, "checksum %lld is not a 32-bit value", (long long)row[4]);
    if (!why[0]) return 0;
    if (print) report(errors, s->path, "/index_sources row %lld (sample %lld): %s (truncated or corrupt index)",
                      (long long)id, (long long)id, why);
    return 1;
}

/* Reads /index_sources (integer, [n_samples, 5], its columns attribute if present naming ours) into s->sources. */
static int read_index_sources(store *s, FILE *errors)
{
    hid_t index = open_dataset(s->h5_file, "/index_sources", H5P_DEFAULT, s->path, errors);
    if (index < 0) return 1;
    hsize_t dims[2];
    int failed = dataset_dims(index, "/index_sources", 2, dims, s->path, errors) ||
                 check_filters(index, "/index_sources", s->path, errors) ||
                 check_columns(index, "/index_sources", STORE_SOURCES_COLUMN_NAMES, s->path, errors);
    if (!failed && (dims[1] != STORE_SOURCES_COLUMNS || dims[0] != (hsize_t)s->n_samples))
        failed = report(errors, s->path, "/index_sources is [%llu, %llu], expected [%lld, %d] (a row per sample of /index: "
                        "%s)", (unsigned long long)dims[0], (unsigned long long)dims[1], (long long)s->n_samples,
                        STORE_SOURCES_COLUMNS, STORE_SOURCES_COLUMN_NAMES);
    int wraps = 0;
    if (!failed) failed = check_index_type(index, "/index_sources", &wraps, s->path, errors);
    int64_t *rows = NULL;
    if (!failed) {
        rows = xmalloc((size_t)dims[0] * STORE_SOURCES_COLUMNS * sizeof *rows);
        if (H5Dread(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) < 0)
            failed = report_h5(errors, s->path, "cannot read /index_sources (truncated or corrupt file?)");
    }
    if (H5Dclose(index) < 0 && !failed) failed = report_h5(errors, s->path, "cannot close /index_sources");
    if (failed) { free(rows); return 1; }
    int64_t n_bad = 0;
    for (int64_t id = 0; id < s->n_samples; id++) {
        int64_t *row = rows + id * STORE_SOURCES_COLUMNS;
        if (wraps && row[4] < 0) row[4] += INT64_C(1) << 32;
        n_bad += check_sources_row(s, id, row, n_bad < MAX_REPORTED_ROWS, errors);
    }
    if (n_bad > MAX_REPORTED_ROWS) report(errors, s->path, "... %lld bad /index_sources rows in all", (long long)n_bad);
    if (n_bad) { free(rows); return 1; }
    s->sources = xmalloc((size_t)s->n_samples * sizeof *s->sources);
    for (int64_t id = 0; id < s->n_samples; id++) {
        const int64_t *row = rows + id * STORE_SOURCES_COLUMNS;
        s->sources[id] = (store_sources){.text_2_len = (int32_t)row[0], .text_2_offset = row[1],
                                         .image_len = (int32_t)row[2], .image_offset = row[3], .checksum = (uint32_t)row[4]};
        if (store_sample_text_2_elements(s, id) > s->max_text_2_elements) s->max_text_2_elements = store_sample_text_2_elements(s, id);
        if (store_sample_image_elements(s, id) > s->max_image_elements) s->max_image_elements = store_sample_image_elements(s, id);
    }
    free(rows);
    return 0;
}

static int read_sources(store *s, FILE *errors)
{
    if (find_sources(s, errors)) return 1;
    if (!s->has_sources) return 0;
    return read_source_attributes(s, errors) || open_source_datasets(s, errors) || read_index_sources(s, errors);
}

int store_open(store *s, const char *path, FILE *errors)
{
    memset(s, 0, sizeof *s);
    handles_reset(s);
    h5_auto_print saved = h5_quiet_begin();
    int failed = open_file(s, path, errors) || read_attributes(s, errors) || open_value_datasets(s, errors) ||
                 read_index(s, errors) || read_sources(s, errors);
    h5_quiet_end(saved);
    if (failed) store_close(s);
    return failed;
}

void store_close(store *s)
{
    h5_auto_print saved = h5_quiet_begin();
    if (s->h5_latents > 0 && H5Dclose(s->h5_latents) < 0) aldit_warn("%s: cannot close /latents", s->path);
    if (s->h5_text > 0 && H5Dclose(s->h5_text) < 0) aldit_warn("%s: cannot close /text", s->path);
    if (s->h5_text_2 > 0 && H5Dclose(s->h5_text_2) < 0) aldit_warn("%s: cannot close /text_2", s->path);
    if (s->h5_image > 0 && H5Dclose(s->h5_image) < 0) aldit_warn("%s: cannot close /image", s->path);
    if (s->h5_file > 0 && H5Fclose(s->h5_file) < 0) aldit_warn("%s: cannot close the file", s->path);
    H5Eclear2(H5E_DEFAULT);
    h5_quiet_end(saved);
    handles_reset(s);
    free(s->samples);
    free(s->sources);
    s->samples = NULL;
    s->sources = NULL;
    s->n_samples = 0;
    s->has_sources = 0;
}

/* What rank 0 broadcasts before the index rows. */
typedef struct {
    int32_t failed, text_dim, latent_channels, latent_precision, text_precision;
    int32_t has_sources, text_2_dim, image_dim, text_2_precision, image_precision;
    int64_t n_samples, latents_length, text_length, max_latent_elements, max_text_elements;
    int64_t text_2_length, image_length, max_text_2_elements, max_image_elements;
} store_header;

void store_open_bcast(store *s, const char *path)
{
    int rank = comm_rank();
    store_header header = {0};
    if (rank == 0) {
        header.failed = store_open(s, path, stderr);
        header.text_dim = s->text_dim;
        header.latent_channels = s->latent_channels;
        header.latent_precision = (int32_t)s->latent_precision;
        header.text_precision = (int32_t)s->text_precision;
        header.n_samples = s->n_samples;
        header.latents_length = s->latents_length;
        header.text_length = s->text_length;
        header.max_latent_elements = s->max_latent_elements;
        header.max_text_elements = s->max_text_elements;
        header.has_sources = s->has_sources;
        header.text_2_dim = s->text_2_dim;
        header.image_dim = s->image_dim;
        header.text_2_precision = (int32_t)s->text_2_precision;
        header.image_precision = (int32_t)s->image_precision;
        header.text_2_length = s->text_2_length;
        header.image_length = s->image_length;
        header.max_text_2_elements = s->max_text_2_elements;
        header.max_image_elements = s->max_image_elements;
    }
    comm_bcast_bytes(&header, sizeof header);
    if (header.failed) {
        if (rank == 0) fprintf(stderr, "aldit: error: cannot use the latent store %s (see above)\n", path);
        comm_finalize();
        exit(ALDIT_EXIT_USAGE);
    }
    int failed = 0;
    if (rank != 0) {
        memset(s, 0, sizeof *s);
        handles_reset(s);
        s->text_dim = header.text_dim;
        s->latent_channels = header.latent_channels;
        s->latent_precision = (store_precision)header.latent_precision;
        s->text_precision = (store_precision)header.text_precision;
        s->n_samples = header.n_samples;
        s->max_latent_elements = header.max_latent_elements;
        s->max_text_elements = header.max_text_elements;
        s->samples = xmalloc((size_t)header.n_samples * sizeof *s->samples);
        s->has_sources = header.has_sources;
        s->text_2_dim = header.text_2_dim;
        s->image_dim = header.image_dim;
        s->text_2_precision = (store_precision)header.text_2_precision;
        s->image_precision = (store_precision)header.image_precision;
        s->max_text_2_elements = header.max_text_2_elements;
        s->max_image_elements = header.max_image_elements;
        if (s->has_sources) s->sources = xmalloc((size_t)header.n_samples * sizeof *s->sources);
        h5_auto_print saved = h5_quiet_begin();
        failed = open_file(s, path, stderr) || open_value_datasets(s, stderr) ||
                 (s->has_sources && open_source_datasets(s, stderr));
        h5_quiet_end(saved);
        if (!failed && (s->latents_length != header.latents_length || s->text_length != header.text_length ||
                        s->text_2_length != header.text_2_length || s->image_length != header.image_length))
            failed = report(stderr, path, "rank %d sees different /latents, /text, /text_2 or /image lengths than rank 0 "
                                          "(not the same file on every node?)", rank);
        if (failed) fprintf(stderr, "aldit: error: rank %d cannot open the latent store %s\n", rank, path);
    }
    comm_bcast_bytes(s->samples, (size_t)header.n_samples * sizeof *s->samples);
    if (header.has_sources) comm_bcast_bytes(s->sources, (size_t)header.n_samples * sizeof *s->sources);
    if (comm_allreduce_or_int(failed)) {
        store_close(s);
        comm_finalize();
        exit(ALDIT_EXIT_USAGE);
    }
}

/* ---- reading samples ---------------------------------------------------------------------------- */

/* Reads `count` stored values starting at `offset` of `dataset` into `raw` as their stored bit patterns. */
static int read_raw(const store *s, hid_t dataset, const char *name, store_precision precision, int64_t offset,
                    int64_t count, void *raw, int64_t id, FILE *errors)
{
    hsize_t start[1] = {(hsize_t)offset}, counts[1] = {(hsize_t)count};
    hid_t file_space = H5Dget_space(dataset), memory_space = H5Screate_simple(1, counts, NULL);
    hid_t memory_type = memory_type_create(precision);
    int failed = 0;
    if (file_space < 0 || memory_space < 0 || memory_type < 0 ||
        H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, counts, NULL) < 0 ||
        H5Dread(dataset, memory_type, memory_space, file_space, H5P_DEFAULT, raw) < 0)
        failed = report_h5(errors, s->path, "sample %lld: cannot read %s elements [%lld, %lld) (truncated or corrupt file?)",
                           (long long)id, name, (long long)offset, (long long)(offset + count));
    if (memory_type >= 0) H5Tclose(memory_type);
    if (memory_space >= 0) H5Sclose(memory_space);
    if (file_space >= 0) H5Sclose(file_space);
    return failed;
}

/* Widens `count` 16-bit stored values at the start of `values` to fp32 in place (back to front, so no
   value is overwritten before it is read). */
static void widen_in_place(float *values, int64_t count, store_precision precision)
{
    const uint16_t *raw = (const uint16_t *)values;
    if (precision == STORE_F32) return;
    for (int64_t i = count - 1; i >= 0; i--) {
        uint16_t bits = raw[i];
        values[i] = precision == STORE_BF16 ? store_bf16_to_f32(bits) : store_f16_to_f32(bits);
    }
}

/* Reads one sample; when `checksum` is not NULL it receives the CRC-32 of the stored bytes. */
static int read_sample(const store *s, int64_t id, float *latent, float *text, uint32_t *checksum, FILE *errors)
{
    if (id < 0 || id >= s->n_samples)
        return report(errors, s->path, "sample id %lld out of range (the store holds %lld samples)", (long long)id,
                      (long long)s->n_samples);
    const store_sample *sample = &s->samples[id];
    int64_t latent_count = store_sample_latent_elements(sample), text_count = store_sample_text_elements(s, sample);
    uint32_t crc = 0;
    h5_auto_print saved = h5_quiet_begin();
    int failed = 0;
    if (latent) {
        failed = read_raw(s, s->h5_latents, "/latents", s->latent_precision, sample->latent_offset, latent_count, latent,
                          id, errors);
        if (!failed && checksum)
            crc = store_crc32(crc, latent, (size_t)latent_count * (size_t)store_precision_bytes(s->latent_precision));
        if (!failed) widen_in_place(latent, latent_count, s->latent_precision);
    }
    if (text && !failed) {
        failed = read_raw(s, s->h5_text, "/text", s->text_precision, sample->text_offset, text_count, text, id, errors);
        if (!failed && checksum)
            crc = store_crc32(crc, text, (size_t)text_count * (size_t)store_precision_bytes(s->text_precision));
        if (!failed) widen_in_place(text, text_count, s->text_precision);
    }
    h5_quiet_end(saved);
    if (checksum) *checksum = crc;
    return failed;
}

/* Index of the first non-finite value, or -1. */
static int64_t first_nonfinite(const float *values, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (!isfinite(values[i])) return i;
    return -1;
}

/* Reports the first value of a sample just read that is not finite (the format allows none); either part
   may be NULL (not read). */
static int check_finite(const store *s, int64_t id, const float *latent, const float *text, FILE *errors)
{
    const store_sample *sample = &s->samples[id];
    int64_t bad = latent ? first_nonfinite(latent, store_sample_latent_elements(sample)) : -1;
    if (bad >= 0)
        return report(errors, s->path, "sample %lld: latent element %lld is not finite (corrupt data)", (long long)id,
                      (long long)bad);
    bad = text ? first_nonfinite(text, store_sample_text_elements(s, sample)) : -1;
    if (bad >= 0)
        return report(errors, s->path, "sample %lld: text element %lld is not finite (corrupt data)", (long long)id,
                      (long long)bad);
    return 0;
}

int store_read_sample(const store *s, int64_t id, float *latent, float *text, FILE *errors)
{
    return read_sample(s, id, latent, text, NULL, errors) || check_finite(s, id, latent, text, errors);
}

int store_verify_sample(const store *s, int64_t id, float *latent, float *text, FILE *errors)
{
    uint32_t crc = 0;
    if (read_sample(s, id, latent, text, &crc, errors)) return 1;
    const store_sample *sample = &s->samples[id];
    if (crc != sample->checksum)
        return report(errors, s->path, "sample %lld: checksum mismatch (index says 0x%08x, stored bytes give 0x%08x): "
                                       "corrupt data", (long long)id, (unsigned)sample->checksum, (unsigned)crc);
    return check_finite(s, id, latent, text, errors);
}

/* Reads one sample's sources; when `checksum` is not NULL it receives the CRC-32 of the stored bytes. */
static int read_sources_of(const store *s, int64_t id, float *text_2, float *image, uint32_t *checksum, FILE *errors)
{
    if (!s->has_sources) return report(errors, s->path, "the store holds no caption sources (/text_2, /image)");
    if (id < 0 || id >= s->n_samples)
        return report(errors, s->path, "sample id %lld out of range (the store holds %lld samples)", (long long)id,
                      (long long)s->n_samples);
    const store_sources *row = &s->sources[id];
    const int64_t counts[2] = {store_sample_text_2_elements(s, id), store_sample_image_elements(s, id)};
    const int64_t offsets[2] = {row->text_2_offset, row->image_offset};
    const hid_t datasets[2] = {s->h5_text_2, s->h5_image};
    const store_precision precisions[2] = {s->text_2_precision, s->image_precision};
    float *values[2] = {text_2, image};
    const char *names[2] = {"/text_2", "/image"};
    uint32_t crc = 0;
    int failed = 0;
    h5_auto_print saved = h5_quiet_begin();
    for (int k = 0; k < 2 && !failed; k++) {
        if (!values[k] || counts[k] == 0) continue;
        failed = read_raw(s, datasets[k], names[k], precisions[k], offsets[k], counts[k], values[k], id, errors);
        if (!failed && checksum) crc = store_crc32(crc, values[k], (size_t)counts[k] * (size_t)store_precision_bytes(precisions[k]));
        if (!failed) widen_in_place(values[k], counts[k], precisions[k]);
    }
    h5_quiet_end(saved);
    if (checksum) *checksum = crc;
    for (int k = 0; k < 2 && !failed; k++) {
        int64_t bad = values[k] ? first_nonfinite(values[k], counts[k]) : -1;
        if (bad >= 0)
            failed = report(errors, s->path, "sample %lld: %s element %lld is not finite (corrupt data)", (long long)id,
                            names[k], (long long)bad);
    }
    return failed;
}

int store_read_sources(const store *s, int64_t id, float *text_2, float *image, FILE *errors)
{
    return read_sources_of(s, id, text_2, image, NULL, errors);
}

int store_verify_sources(const store *s, int64_t id, float *text_2, float *image, FILE *errors)
{
    uint32_t crc = 0;
    if (read_sources_of(s, id, text_2, image, &crc, errors)) return 1;
    if (crc != s->sources[id].checksum)
        return report(errors, s->path, "sample %lld: /index_sources checksum mismatch (index says 0x%08x, the stored "
                      "/text_2 and /image bytes give 0x%08x): corrupt data", (long long)id,
                      (unsigned)s->sources[id].checksum, (unsigned)crc);
    return 0;
}

/* ---- writer ------------------------------------------------------------------------------------- */

struct store_writer {
    char path[1024], temporary_path[1040];
    FILE *errors;
    store_precision precision;
    int32_t text_dim, channels;     /* channels: of the first sample (every sample must match) */
    hid_t file, latents, text, memory_type;
    int64_t latents_length, text_length;
    int64_t n_samples, capacity;
    int64_t *index;                 /* n_samples rows of STORE_INDEX_COLUMNS */
    int sources;                    /* the store holds the caption sources (store_writer_enable_sources) */
    int32_t text_2_dim, image_dim;
    hid_t text_2, image;
    int64_t text_2_length, image_length;
    int64_t *index_sources;         /* n_samples rows of STORE_SOURCES_COLUMNS (with sources) */
    int32_t pending_text_2_len, pending_image_len;   /* the sources store_writer_add_sources hands store_writer_add */
    const float *pending_text_2, *pending_image;
    void *scratch;                  /* stored bit patterns of one sample's values */
    size_t scratch_bytes;
    int failed;                     /* an add failed: close refuses to publish the file */
};

static hid_t stored_type(store_precision precision)
{
    switch (precision) {
    case STORE_BF16: return H5Tcopy(H5T_STD_U16LE);
    case STORE_F16: return half_type_create();
    case STORE_F32: return H5Tcopy(H5T_IEEE_F32LE);
    }
    return -1;
}

static hid_t create_values_dataset(store_writer *w, const char *name)
{
    hsize_t dims[1] = {0}, max_dims[1] = {H5S_UNLIMITED}, chunk[1] = {CHUNK_ELEMENTS};
    hid_t space = H5Screate_simple(1, dims, max_dims), create = H5Pcreate(H5P_DATASET_CREATE);
    hid_t access = H5Pcreate(H5P_DATASET_ACCESS), type = stored_type(w->precision), dataset = -1;
    if (space >= 0 && create >= 0 && access >= 0 && type >= 0 && H5Pset_chunk(create, 1, chunk) >= 0 &&
        H5Pset_chunk_cache(access, 521, 8u << 20, H5D_CHUNK_CACHE_W0_DEFAULT) >= 0)
        dataset = H5Dcreate2(w->file, name, type, space, H5P_DEFAULT, create, access);
    if (dataset < 0) report_h5(w->errors, w->temporary_path, "cannot create dataset %s", name);
    if (type >= 0) H5Tclose(type);
    if (access >= 0) H5Pclose(access);
    if (create >= 0) H5Pclose(create);
    if (space >= 0) H5Sclose(space);
    return dataset;
}

/* Closes every handle of the writer (quietly: used on success and failure paths). 0 if all closed; else
   `message` holds the first failure's HDF5 message (each later call clears HDF5's error stack). */
static int writer_close_handles(store_writer *w, char message[256])
{
    int failed = 0;
    hid_t *handles[6] = {&w->memory_type, &w->latents, &w->text, &w->text_2, &w->image, &w->file};
    for (int i = 0; i < 6; i++) {
        hid_t handle = *handles[i];
        if (handle <= 0) continue;
        herr_t status = i == 0 ? H5Tclose(handle) : i == 5 ? H5Fclose(handle) : H5Dclose(handle);
        if (status < 0 && !failed++) h5_last_error(message);
        *handles[i] = -1;
    }
    return failed;
}

static void writer_free(store_writer *w)
{
    free(w->index);
    free(w->index_sources);
    free(w->scratch);
    free(w);
}

/* The writer replaces only regular files: a rename over a directory, a symbolic link or a device node
   would lose or redirect it. */
const char *store_not_a_regular_file(const char *path)
{
    struct stat info;
    if (lstat(path, &info) != 0 || S_ISREG(info.st_mode)) return NULL;
    if (S_ISDIR(info.st_mode)) return "a directory";
    if (S_ISLNK(info.st_mode)) return "a symbolic link";
    if (S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode)) return "a device";
    if (S_ISFIFO(info.st_mode)) return "a named pipe";
    if (S_ISSOCK(info.st_mode)) return "a socket";
    return "not a regular file";
}

/* Refuses `path` (the store or its temporary file) when it exists and is not a regular file. */
static int check_replaceable(const char *path, FILE *errors)
{
    const char *kind = store_not_a_regular_file(path);
    if (kind) return report(errors, path, "exists and is %s; the store writer replaces only regular files", kind);
    return 0;
}

store_writer *store_writer_create(const char *path, int32_t text_dim, store_precision precision, FILE *errors)
{
    if (strlen(path) >= sizeof ((store_writer *)0)->path) {
        report(errors, path, "path too long");
        return NULL;
    }
    if (text_dim < 1 || text_dim > MAX_TEXT_DIM) {
        report(errors, path, "text_dim %d is outside [1, %d]", text_dim, MAX_TEXT_DIM);
        return NULL;
    }
    char temporary_path[sizeof ((store_writer *)0)->temporary_path];
    snprintf(temporary_path, sizeof temporary_path, "%s.tmp", path);
    if (check_replaceable(path, errors) || check_replaceable(temporary_path, errors)) return NULL;
    store_writer *w = xcalloc(1, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->temporary_path, sizeof w->temporary_path, "%s", temporary_path);
    w->errors = errors;
    w->precision = precision;
    w->text_dim = text_dim;
    w->file = w->latents = w->text = w->memory_type = w->text_2 = w->image = -1;
    h5_auto_print saved = h5_quiet_begin();
    w->file = H5Fcreate(w->temporary_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int failed = 0;
    if (w->file < 0) failed = report_h5(errors, w->temporary_path, "cannot create the file");
    if (!failed) {
        w->latents = create_values_dataset(w, "/latents");
        w->text = w->latents < 0 ? -1 : create_values_dataset(w, "/text");
        w->memory_type = memory_type_create(precision);
        failed = w->latents < 0 || w->text < 0 || w->memory_type < 0;
        if (w->memory_type < 0 && w->text >= 0) report_h5(errors, w->temporary_path, "cannot create a memory type");
    }
    if (failed) {
        int created = w->file >= 0;
        char ignored[256];
        writer_close_handles(w, ignored);
        H5Eclear2(H5E_DEFAULT);
        if (created) unlink(w->temporary_path);
        writer_free(w);
        w = NULL;
    }
    h5_quiet_end(saved);
    return w;
}

/* Converts `count` fp32 values to the stored precision in w->scratch, checking each is finite and representable. */
static int convert_values(store_writer *w, const float *values, int64_t count, const char *what)
{
    size_t bytes = (size_t)count * (size_t)store_precision_bytes(w->precision);
    if (bytes > w->scratch_bytes) {
        free(w->scratch);
        w->scratch = xmalloc(bytes);
        w->scratch_bytes = bytes;
    }
    uint16_t *narrow = w->scratch;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(values[i]))
            return report(w->errors, w->path, "sample %lld: %s element %lld is not finite", (long long)w->n_samples, what,
                          (long long)i);
        if (w->precision == STORE_BF16) {
            narrow[i] = store_f32_to_bf16(values[i]);
            if ((narrow[i] & 0x7f80u) == 0x7f80u)
                return report(w->errors, w->path, "sample %lld: %s element %lld = %g overflows bf16", (long long)w->n_samples,
                              what, (long long)i, (double)values[i]);
        } else if (w->precision == STORE_F16) {
            narrow[i] = store_f32_to_f16(values[i]);
            if ((narrow[i] & 0x7c00u) == 0x7c00u)
                return report(w->errors, w->path, "sample %lld: %s element %lld = %g does not fit f16 (largest 65504)",
                              (long long)w->n_samples, what, (long long)i, (double)values[i]);
        }
    }
    if (w->precision == STORE_F32) memcpy(w->scratch, values, bytes);
    return 0;
}

/* Appends w->scratch (`count` values) to `dataset` whose current length is *length. */
static int append_values(store_writer *w, hid_t dataset, const char *name, int64_t *length, int64_t count)
{
    hsize_t start[1] = {(hsize_t)*length}, counts[1] = {(hsize_t)count}, new_length[1] = {(hsize_t)(*length + count)};
    hid_t file_space = -1, memory_space = -1;
    int failed = H5Dset_extent(dataset, new_length) < 0 || (file_space = H5Dget_space(dataset)) < 0 ||
                 (memory_space = H5Screate_simple(1, counts, NULL)) < 0 ||
                 H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, counts, NULL) < 0 ||
                 H5Dwrite(dataset, w->memory_type, memory_space, file_space, H5P_DEFAULT, w->scratch) < 0;
    if (failed) report_h5(w->errors, w->temporary_path, "sample %lld: cannot write %s", (long long)w->n_samples, name);
    if (memory_space >= 0) H5Sclose(memory_space);
    if (file_space >= 0) H5Sclose(file_space);
    if (!failed) *length += count;
    return failed;
}

/* Bytes the finished file may take after `latents_length` and `text_length` values and `n_rows` index rows:
   whole chunks (HDF5 allocates chunks whole), the index, and generous room for HDF5's own metadata. */
static int64_t writer_size_estimate(const store_writer *w, int64_t latents_length, int64_t text_length, int64_t n_rows)
{
    int64_t chunk = (int64_t)CHUNK_ELEMENTS, chunks = (latents_length + chunk - 1) / chunk + (text_length + chunk - 1) / chunk;
    if (w->sources) chunks += (w->text_2_length + chunk) / chunk + (w->image_length + chunk) / chunk;
    return chunks * chunk * store_precision_bytes(w->precision) +
           n_rows * (STORE_INDEX_COLUMNS + (w->sources ? STORE_SOURCES_COLUMNS : 0)) * 8 + chunks * 64 + ((int64_t)64 << 10);
}

/* Checks, before HDF5 is asked to write them, that `latent_count` and `text_count` more values (and the index)
   fit the file system's free space and the file size limit (ulimit -f): HDF5 buffers writes and, when one
   fails only at close, cannot close the file cleanly. Reports errno's text naming the file; 0 when they fit
   or when the file system does not say. */
static int writer_check_space(store_writer *w, int64_t latent_count, int64_t text_count)
{
    int64_t n_rows = w->n_samples + (latent_count > 0);
    int64_t need = writer_size_estimate(w, w->latents_length + latent_count, w->text_length + text_count, n_rows);
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && (uint64_t)need > (uint64_t)limit.rlim_cur)
        return report(w->errors, w->temporary_path, "%s: sample %lld would grow the store to about %lld bytes, past the "
                      "file size limit of %llu bytes (ulimit -f)", strerror(EFBIG), (long long)w->n_samples,
                      (long long)need, (unsigned long long)limit.rlim_cur);
    struct stat info;
    struct statvfs file_system;
    if (stat(w->temporary_path, &info) != 0 || statvfs(w->temporary_path, &file_system) != 0 || file_system.f_blocks == 0)
        return 0; /* cannot tell: a failed write is reported by HDF5 */
    int64_t held = (int64_t)info.st_blocks * 512, free_bytes = (int64_t)file_system.f_bavail * (int64_t)file_system.f_frsize;
    if (need - held > free_bytes)
        return report(w->errors, w->temporary_path, "%s: %s %lld needs about %lld more bytes, %lld are free",
                      strerror(ENOSPC), latent_count > 0 ? "sample" : "the index of samples 0 to", (long long)(w->n_samples - (latent_count == 0)),
                      (long long)(need - held), (long long)free_bytes);
    return 0;
}

int store_writer_enable_sources(store_writer *w, int32_t text_2_dim, int32_t image_dim)
{
    if (w->failed) return 1;
    if (w->n_samples > 0 || w->sources)
        return w->failed = report(w->errors, w->path, "the caption sources must be enabled once, before the first sample");
    if (text_2_dim < 1 || text_2_dim > MAX_TEXT_DIM || image_dim < 1 || image_dim > MAX_TEXT_DIM)
        return w->failed = report(w->errors, w->path, "text_2_dim %d or image_dim %d is outside [1, %d]", text_2_dim,
                                  image_dim, MAX_TEXT_DIM);
    h5_auto_print saved = h5_quiet_begin();
    w->text_2 = create_values_dataset(w, "/text_2");
    w->image = w->text_2 < 0 ? -1 : create_values_dataset(w, "/image");
    h5_quiet_end(saved);
    if (w->text_2 < 0 || w->image < 0) return w->failed = 1;
    w->sources = 1;
    w->text_2_dim = text_2_dim;
    w->image_dim = image_dim;
    return 0;
}

/* Appends one sample's sources (the sample being added as number w->n_samples): values, then its index row. */
static int writer_append_sources(store_writer *w, int32_t text_2_len, const float *text_2, int32_t image_len,
                                 const float *image)
{
    const int64_t counts[2] = {(int64_t)text_2_len * w->text_2_dim, (int64_t)image_len * w->image_dim};
    const int64_t offsets[2] = {w->text_2_length, w->image_length};
    const float *values[2] = {text_2, image};
    const hid_t datasets[2] = {w->text_2, w->image};
    int64_t *lengths[2] = {&w->text_2_length, &w->image_length};
    const char *names[2] = {"/text_2", "/image"};
    uint32_t crc = 0;
    h5_auto_print saved = h5_quiet_begin();
    int failed = 0;
    for (int k = 0; k < 2 && !failed; k++) {
        if (counts[k] == 0) continue;
        failed = convert_values(w, values[k], counts[k], names[k] + 1);
        if (!failed) crc = store_crc32(crc, w->scratch, (size_t)counts[k] * (size_t)store_precision_bytes(w->precision));
        failed = failed || append_values(w, datasets[k], names[k], lengths[k], counts[k]);
    }
    h5_quiet_end(saved);
    if (failed) return 1;
    w->index_sources = xrealloc(w->index_sources, (size_t)w->capacity * STORE_SOURCES_COLUMNS * sizeof *w->index_sources);
    int64_t *row = w->index_sources + w->n_samples * STORE_SOURCES_COLUMNS;
    row[0] = text_2_len; row[1] = offsets[0]; row[2] = image_len; row[3] = offsets[1]; row[4] = crc;
    return 0;
}

int store_writer_add_sources(store_writer *w, int32_t channels, int32_t frames, int32_t height, int32_t width,
                             const float *latent, int32_t text_len, const float *text, int32_t text_2_len,
                             const float *text_2, int32_t image_len, const float *image)
{
    if (w->failed) return 1;
    if (!w->sources)
        return w->failed = report(w->errors, w->path, "sample %lld: the writer holds no caption sources "
                                  "(store_writer_enable_sources)", (long long)w->n_samples);
    if (text_2_len < 0 || text_2_len > MAX_TEXT_LEN || image_len < 0 || image_len > MAX_TEXT_LEN)
        return w->failed = report(w->errors, w->path, "sample %lld: text_2_len %d or image_len %d is outside [0, %d]",
                                  (long long)w->n_samples, text_2_len, image_len, MAX_TEXT_LEN);
    w->pending_text_2_len = text_2_len;
    w->pending_image_len = image_len;
    w->pending_text_2 = text_2;
    w->pending_image = image;
    int failed = store_writer_add(w, channels, frames, height, width, latent, text_len, text);
    w->pending_text_2_len = w->pending_image_len = 0;
    w->pending_text_2 = w->pending_image = NULL;
    return failed;
}

int store_writer_add(store_writer *w, int32_t channels, int32_t frames, int32_t height, int32_t width,
                     const float *latent, int32_t text_len, const float *text)
{
    if (w->failed) return 1;
    long long id = (long long)w->n_samples;
    if (channels < 1 || channels > MAX_CHANNELS || frames < 1 || frames > MAX_DIM || height < 1 || height > MAX_DIM ||
        width < 1 || width > MAX_DIM)
        return w->failed = report(w->errors, w->path, "sample %lld: latent shape [%d, %d, %d, %d] is outside [1..%d, 1..%d]",
                                  id, channels, frames, height, width, MAX_CHANNELS, MAX_DIM);
    if (w->n_samples > 0 && channels != w->channels)
        return w->failed = report(w->errors, w->path, "sample %lld: %d channels, but the store's samples have %d", id,
                                  channels, w->channels);
    if (text_len < 1 || text_len > MAX_TEXT_LEN)
        return w->failed = report(w->errors, w->path, "sample %lld: text_len %d is outside [1, %d]", id, text_len, MAX_TEXT_LEN);
    int64_t latent_count = (int64_t)channels * frames * height * width, text_count = (int64_t)text_len * w->text_dim;
    size_t value_bytes = (size_t)store_precision_bytes(w->precision);
    int64_t latent_offset = w->latents_length, text_offset = w->text_length;

    const int64_t source_count = (int64_t)w->pending_text_2_len * w->text_2_dim + (int64_t)w->pending_image_len * w->image_dim;
    if (writer_check_space(w, latent_count, text_count + source_count)) return w->failed = 1;
    h5_auto_print saved = h5_quiet_begin();
    int failed = convert_values(w, latent, latent_count, "latent");
    uint32_t crc = failed ? 0 : store_crc32(0, w->scratch, (size_t)latent_count * value_bytes);
    failed = failed || append_values(w, w->latents, "/latents", &w->latents_length, latent_count) ||
             convert_values(w, text, text_count, "text");
    if (!failed) crc = store_crc32(crc, w->scratch, (size_t)text_count * value_bytes);
    failed = failed || append_values(w, w->text, "/text", &w->text_length, text_count);
    h5_quiet_end(saved);
    if (failed) return w->failed = 1;

    if (w->n_samples == w->capacity) {
        w->capacity = w->capacity ? 2 * w->capacity : 1024;
        w->index = xrealloc(w->index, (size_t)w->capacity * STORE_INDEX_COLUMNS * sizeof *w->index);
    }
    if (w->sources && writer_append_sources(w, w->pending_text_2_len, w->pending_text_2, w->pending_image_len,
                                            w->pending_image))
        return w->failed = 1;
    int64_t *row = w->index + w->n_samples * STORE_INDEX_COLUMNS;
    row[0] = channels; row[1] = frames; row[2] = height; row[3] = width; row[4] = text_len;
    row[5] = latent_offset; row[6] = text_offset; row[7] = crc;
    w->channels = channels;
    w->n_samples++;
    return 0;
}

static int write_int_attribute(hid_t location, const char *name, int64_t value)
{
    hid_t space = H5Screate(H5S_SCALAR), attribute = -1;
    int failed = space < 0 || (attribute = H5Acreate2(location, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
                 H5Awrite(attribute, H5T_NATIVE_INT64, &value) < 0;
    if (attribute >= 0 && H5Aclose(attribute) < 0) failed = 1;
    if (space >= 0) H5Sclose(space);
    return failed;
}

static int write_string_attribute(hid_t location, const char *name, const char *value)
{
    hid_t space = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1), attribute = -1;
    int failed = space < 0 || type < 0 || H5Tset_size(type, strlen(value)) < 0 || H5Tset_strpad(type, H5T_STR_NULLPAD) < 0 ||
                 (attribute = H5Acreate2(location, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
                 H5Awrite(attribute, type, value) < 0;
    if (attribute >= 0 && H5Aclose(attribute) < 0) failed = 1;
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    return failed;
}

/* /index_sources and the sources' root attributes. */
static int write_index_sources(store_writer *w)
{
    hsize_t dims[2] = {(hsize_t)w->n_samples, STORE_SOURCES_COLUMNS};
    hid_t space = H5Screate_simple(2, dims, NULL), index = -1;
    const char *precision = store_precision_name(w->precision);
    int failed = space < 0 ||
                 (index = H5Dcreate2(w->file, "/index_sources", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                     H5P_DEFAULT)) < 0 ||
                 H5Dwrite(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, w->index_sources) < 0 ||
                 write_string_attribute(index, "columns", STORE_SOURCES_COLUMN_NAMES);
    if (index >= 0 && H5Dclose(index) < 0) failed = 1;
    if (space >= 0) H5Sclose(space);
    return failed || write_int_attribute(w->file, "text_2_dim", w->text_2_dim) ||
           write_string_attribute(w->file, "text_2_dtype", precision) ||
           write_int_attribute(w->file, "image_dim", w->image_dim) ||
           write_string_attribute(w->file, "image_dtype", precision);
}

static int write_index(store_writer *w)
{
    hsize_t dims[2] = {(hsize_t)w->n_samples, STORE_INDEX_COLUMNS};
    hid_t space = H5Screate_simple(2, dims, NULL), index = -1;
    int failed = space < 0 ||
                 (index = H5Dcreate2(w->file, "/index", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
                 H5Dwrite(index, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, w->index) < 0 ||
                 write_string_attribute(index, "columns", STORE_INDEX_COLUMN_NAMES);
    if (index >= 0 && H5Dclose(index) < 0) failed = 1;
    if (space >= 0) H5Sclose(space);
    const char *precision = store_precision_name(w->precision);
    failed = failed || (w->sources && write_index_sources(w));
    failed = failed || write_int_attribute(w->file, "aldit_store_version", STORE_FORMAT_VERSION) ||
             write_string_attribute(w->file, "latent_dtype", precision) ||
             write_string_attribute(w->file, "text_dtype", precision) ||
             write_int_attribute(w->file, "text_dim", w->text_dim) ||
             write_int_attribute(w->file, "latent_channels", w->channels);
    return failed;
}

/* fsync the finished temporary file so the rename publishes complete data. */
static int sync_file(const char *path)
{
    int descriptor = open(path, O_RDONLY);
    if (descriptor < 0) return 1;
    int failed = fsync(descriptor) != 0;
    return close(descriptor) != 0 || failed;
}

int store_writer_close(store_writer *w)
{
    int failed = w->failed;
    if (!failed && w->n_samples == 0) failed = report(w->errors, w->path, "no samples were added; a store needs at least one");
    h5_auto_print saved = h5_quiet_begin();
    if (!failed) failed = writer_check_space(w, 0, 0);
    if (!failed && write_index(w)) failed = report_h5(w->errors, w->temporary_path, "cannot write /index and the attributes");
    char message[256];
    if (writer_close_handles(w, message) && !failed)
        failed = report(w->errors, w->temporary_path, "cannot close the file (HDF5: %s)", message);
    H5Eclear2(H5E_DEFAULT);
    h5_quiet_end(saved);
    if (!failed) failed = check_replaceable(w->path, w->errors);
    if (!failed && sync_file(w->temporary_path))
        failed = report(w->errors, w->temporary_path, "cannot sync to disk: %s", strerror(errno));
    if (!failed && rename(w->temporary_path, w->path) != 0)
        failed = report(w->errors, w->path, "cannot rename %s into place: %s", w->temporary_path, strerror(errno));
    if (failed) unlink(w->temporary_path);
    writer_free(w);
    return failed;
}

void store_writer_discard(store_writer *w)
{
    h5_auto_print saved = h5_quiet_begin();
    char ignored[256];
    writer_close_handles(w, ignored);
    H5Eclear2(H5E_DEFAULT);
    h5_quiet_end(saved);
    unlink(w->temporary_path);
    writer_free(w);
}
