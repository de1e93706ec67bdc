/* aldit_store.c — the aldit-store tool: make (synth, pack), inspect (info) and check (verify) latent stores. */
#include "config.h"
#include "core/check.h"
#include "io/lengths.h"
#include "core/rng.h"
#include "io/store.h"
#include "deck/deck.h"
#include "train/train.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Exit status: 0 success, 1 a bad store, bad input data or an I/O error, 2 a bad command line or length spec. */
enum { EXIT_BAD_DATA = ALDIT_EXIT_ERROR, EXIT_BAD_USAGE = ALDIT_EXIT_USAGE };

/* Patch used for token counts in `info` (Wan 2.1: 1 x 2 x 2). */
enum { PATCH_T = 1, PATCH_H = 2, PATCH_W = 2 };

static const char usage_text[] =
    "usage: aldit-store COMMAND [OPTIONS]\n"
    "\n"
    "Make, inspect and check aldit latent stores (HDF5; format in docs/store.md).\n"
    "\n"
    "commands:\n"
    "  synth --spec FILE --samples N --out FILE [--seed S] [--draw-seed T] [--text-len L] [--text-dim D]\n"
    "        [--precision bf16|f16|f32] [--channels C] [--text-2-dim D2 --image-dim D3 [--text-2-len G]\n"
    "        [--image-len I]]\n"
    "      a synthetic mixed-mode store: shapes drawn from the length spec FILE; each sample's latent is a\n"
    "      smooth pattern set by a class that its text embedding encodes, so a model can learn it.\n"
    "      --seed sets the classes' patterns, --draw-seed the samples drawn from them (shapes, classes,\n"
    "      noise): another T with the same S makes held-out samples of the same classes.\n"
    "      A spec line's caption field (MIN-MAX, see docs/balancer.md) draws that bucket's caption lengths, at\n"
    "      most --text-len. Defaults: --seed 0 --draw-seed S --text-len 32 (lengths vary in [L/2, L] where the\n"
    "      spec gives none) --text-dim 4096 --precision bf16 --channels 16. --text-2-dim and --image-dim add the\n"
    "      caption sources of hunyuanvideo15 (random rows): 0 to G ByT5 rows per sample (default 8), I SigLIP\n"
    "      rows per video (default 4; none for images).\n"
    "  pack --out FILE [--precision bf16|f16|f32] DIR\n"
    "      a store from DIR/NAME.npy latents [C, F, H, W] and DIR/NAME.text.npy text embeddings [L, D]\n"
    "      (float16/32/64, little-endian, C order); samples in byte order of NAME. With DIR/NAME.text_2.npy\n"
    "      [G, D2] and DIR/NAME.image.npy [I, D3] (G, I may be 0) for every sample: the caption sources.\n"
    "  info FILE\n"
    "      counts, images vs videos, shape and token histograms (patch 1x2x2), bytes, precision.\n"
    "  verify [--deck DECK] FILE\n"
    "      reads every sample: index ranges and shapes, finite values, stored checksums (the caption\n"
    "      sources' too); with --deck, also that the store's dims fit the deck's model.\n"
    "\n"
    "  --help, --version\n"
    "\n"
    "exit status: 0 ok; 1 bad store, bad input data or I/O error; 2 bad command line or length spec.\n";

/* "s" after a count other than one: "1 video", "2 videos". */
static const char *plural(int64_t count) { return count == 1 ? "" : "s"; }

__attribute__((format(printf, 1, 2)))
static int usage_error(const char *format, ...)
{
    va_list args;
    fputs("aldit-store: ", stderr);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputs("\n(aldit-store --help shows the usage)\n", stderr);
    return EXIT_BAD_USAGE;
}

/* ---- command-line options: `--name value` or `--name=value`, through getopt_long ------------------ */

typedef struct { const char *name; const char **value; } option_slot;

enum { MAX_SLOTS = 16 };

/* Fills the slots from argv (argv[0] is the command); other words go to `positional` (at most
   max_positional), in order; `--` ends the options. Returns 0 or the usage exit code. */
static int parse_options(int argc, char **argv, option_slot *slots, int n_slots, const char **positional,
                         int max_positional, int *n_positional)
{
    struct option options[MAX_SLOTS + 1] = {{0}};
    for (int i = 0; i < n_slots && i < MAX_SLOTS; i++)
        options[i] = (struct option){.name = slots[i].name, .has_arg = required_argument, .val = 256 + i};
    *n_positional = 0;
    opterr = 0;
    optind = 0; /* 0: glibc resets all of getopt's state */
    for (;;) {
        int word = optind == 0 ? 1 : optind, option = getopt_long(argc, argv, "-:", options, NULL);
        if (option == -1) break;
        if (option == 1) {
            if (*n_positional == max_positional) return usage_error("unexpected argument '%s'", optarg);
            positional[(*n_positional)++] = optarg;
        } else if (option >= 256 && option < 256 + n_slots) {
            *slots[option - 256].value = optarg;
        } else if (option == ':') {
            return usage_error("option --%s needs a value", optopt >= 256 && optopt < 256 + n_slots ?
                                                             slots[optopt - 256].name : "?");
        } else {
            const char *text = argv[word], *equals = strchr(text, '=');
            if (strncmp(text, "--", 2) != 0) return usage_error("unknown option '-%c'", optopt);
            return usage_error("unknown option '%.*s'", equals ? (int)(equals - text) : (int)strlen(text), text);
        }
    }
    for (int i = optind; i < argc; i++) { /* the words after "--" */
        if (*n_positional == max_positional) return usage_error("unexpected argument '%s'", argv[i]);
        positional[(*n_positional)++] = argv[i];
    }
    return 0;
}

/* Integer option in [low, high]; 0 or exit code. */
static int parse_integer(const char *name, const char *text, int64_t low, int64_t high, int64_t *value)
{
    char *end = NULL;
    errno = 0;
    long long parsed = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || parsed < low || parsed > high)
        return usage_error("--%s '%s' is not an integer in [%lld, %lld]", name, text, (long long)low, (long long)high);
    *value = parsed;
    return 0;
}

static int parse_precision(const char *text, store_precision *precision)
{
    if (text && store_precision_parse(text, precision)) return usage_error("--precision '%s': use bf16, f16 or f32", text);
    return 0;
}

/* ---- synth ------------------------------------------------------------------------------------- */

/* Classes of the synthetic data: the text embedding says which one, the latent pattern follows from it. */
enum { SYNTH_CLASSES = 8, SYNTH_WAVES = 2 };

typedef struct {
    double amplitude[SYNTH_WAVES], cycles_f[SYNTH_WAVES], cycles_h[SYNTH_WAVES], cycles_w[SYNTH_WAVES], phase[SYNTH_WAVES];
} synth_wave; /* per class and channel: a sum of low-frequency sinusoids over normalised (f, h, w) */

typedef struct {
    int32_t channels, text_len_max, text_dim;
    synth_wave *waves;       /* [SYNTH_CLASSES][channels] */
    float *text_patterns;    /* [SYNTH_CLASSES][text_len_max][text_dim] */
} synth_model;

static void synth_model_create(synth_model *m, uint64_t seed, int32_t channels, int32_t text_len_max, int32_t text_dim)
{
    static const double cycle_choices[4] = {0.5, 1.0, 1.5, 2.0};
    m->channels = channels;
    m->text_len_max = text_len_max;
    m->text_dim = text_dim;
    m->waves = xmalloc((size_t)SYNTH_CLASSES * (size_t)channels * sizeof *m->waves);
    size_t pattern_values = (size_t)text_len_max * (size_t)text_dim;
    m->text_patterns = xmalloc((size_t)SYNTH_CLASSES * pattern_values * sizeof *m->text_patterns);
    for (int k = 0; k < SYNTH_CLASSES; k++) {
        uint64_t state = rng_hash(seed, 100 + (uint64_t)k);
        for (int c = 0; c < channels; c++) {
            synth_wave *wave = &m->waves[k * channels + c];
            for (int j = 0; j < SYNTH_WAVES; j++) {
                wave->amplitude[j] = (0.4 + 0.5 * rng_uniform(&state)) / (1 + j);
                wave->cycles_f[j] = cycle_choices[rng_next_u64(&state) % 4];
                wave->cycles_h[j] = cycle_choices[rng_next_u64(&state) % 4];
                wave->cycles_w[j] = cycle_choices[rng_next_u64(&state) % 4] * (j % 2 ? -1.0 : 1.0);
                wave->phase[j] = 6.283185307179586 * rng_uniform(&state);
            }
        }
        float *pattern = m->text_patterns + (size_t)k * pattern_values;
        for (size_t i = 0; i < pattern_values; i++) pattern[i] = (float)rng_normal(&state);
    }
}

static void synth_model_free(synth_model *m)
{
    free(m->waves);
    free(m->text_patterns);
}

/* One sample of class `k`: latent [C, F, H, W] and text [text_len, D], plus small noise from `state`. */
static void synth_sample(const synth_model *m, int k, int32_t frames, int32_t height, int32_t width, int32_t text_len,
                         uint64_t *state, float *latent, float *text)
{
    const double two_pi = 6.283185307179586, noise = 0.05;
    float *value = latent;
    for (int c = 0; c < m->channels; c++) {
        const synth_wave *wave = &m->waves[k * m->channels + c];
        for (int32_t f = 0; f < frames; f++)
            for (int32_t h = 0; h < height; h++) {
                double base[SYNTH_WAVES];
                for (int j = 0; j < SYNTH_WAVES; j++)
                    base[j] = wave->phase[j] + two_pi * (wave->cycles_f[j] * f / frames + wave->cycles_h[j] * h / height);
                for (int32_t w = 0; w < width; w++) {
                    double sum = 0.0;
                    for (int j = 0; j < SYNTH_WAVES; j++)
                        sum += wave->amplitude[j] * sin(base[j] + two_pi * wave->cycles_w[j] * w / width);
                    *value++ = (float)(sum + noise * (2.0 * rng_uniform(state) - 1.0));
                }
            }
    }
    const float *pattern = m->text_patterns + (size_t)k * (size_t)m->text_len_max * (size_t)m->text_dim;
    for (int64_t i = 0; i < (int64_t)text_len * m->text_dim; i++)
        text[i] = pattern[i] + (float)(0.1 * rng_normal(state));
}

static int command_synth(int argc, char **argv)
{
    const char *spec = NULL, *samples_text = NULL, *out = NULL, *seed_text = "0", *text_len_text = "32",
               *text_dim_text = "4096", *precision_text = "bf16", *channels_text = "16", *draw_seed_text = NULL,
               *text_2_dim_text = NULL, *text_2_len_text = "8", *image_dim_text = NULL, *image_len_text = "4";
    option_slot slots[] = {{"spec", &spec}, {"samples", &samples_text}, {"out", &out}, {"seed", &seed_text},
                           {"text-len", &text_len_text}, {"text-dim", &text_dim_text},
                           {"precision", &precision_text}, {"channels", &channels_text}, {"draw-seed", &draw_seed_text},
                           {"text-2-dim", &text_2_dim_text}, {"text-2-len", &text_2_len_text},
                           {"image-dim", &image_dim_text}, {"image-len", &image_len_text}};
    const char *positional[1];
    int n_positional = 0, status = parse_options(argc, argv, slots, 13, positional, 0, &n_positional);
    if (status) return status;
    if (!spec || !samples_text || !out) return usage_error("synth needs --spec FILE, --samples N and --out FILE");
    if (!text_2_dim_text != !image_dim_text)
        return usage_error("synth: the caption sources need both --text-2-dim and --image-dim (or neither)");
    int64_t n_samples = 0, text_len = 0, text_dim = 0, channels = 0, seed = 0, draw_seed = 0;
    int64_t text_2_dim = 0, text_2_len = 0, image_dim = 0, image_len = 0;
    store_precision precision = STORE_BF16;
    if ((status = parse_integer("samples", samples_text, 1, INT64_C(1) << 40, &n_samples)) ||
        (status = parse_integer("seed", seed_text, 0, INT64_MAX, &seed)) ||
        (status = parse_integer("draw-seed", draw_seed_text ? draw_seed_text : seed_text, 0, INT64_MAX, &draw_seed)) ||
        (status = parse_integer("text-len", text_len_text, 1, 1 << 16, &text_len)) ||
        (status = parse_integer("text-dim", text_dim_text, 1, 1 << 16, &text_dim)) ||
        (status = parse_integer("channels", channels_text, 1, 4096, &channels)) ||
        (status = parse_precision(precision_text, &precision)) ||
        (status = parse_integer("text-2-len", text_2_len_text, 0, 1 << 16, &text_2_len)) ||
        (status = parse_integer("image-len", image_len_text, 0, 1 << 16, &image_len)) ||
        (text_2_dim_text && (status = parse_integer("text-2-dim", text_2_dim_text, 1, 1 << 16, &text_2_dim))) ||
        (image_dim_text && (status = parse_integer("image-dim", image_dim_text, 1, 1 << 16, &image_dim))))
        return status;

    length_bucket *buckets = NULL;
    int n_buckets = 0;
    if (lengths_load(spec, &buckets, &n_buckets, stderr)) return EXIT_BAD_USAGE;
    for (int b = 0; b < n_buckets; b++)
        if (buckets[b].text_max > text_len) {
            fprintf(stderr, "aldit-store: %s: a bucket's captions reach %d text tokens, more than --text-len %lld\n", spec,
                    buckets[b].text_max, (long long)text_len);
            free(buckets);
            return EXIT_BAD_USAGE;
        }
    int32_t *frames = xmalloc((size_t)n_samples * sizeof *frames), *height = xmalloc((size_t)n_samples * sizeof *height),
            *width = xmalloc((size_t)n_samples * sizeof *width), *caption = xmalloc((size_t)n_samples * sizeof *caption);
    lengths_draw_text(buckets, n_buckets, n_samples, (uint64_t)draw_seed, frames, height, width, caption);
    int64_t max_latent = 0, n_images = 0;
    for (int64_t i = 0; i < n_samples; i++) {
        int64_t elements = channels * frames[i] * height[i] * width[i];
        if (elements > max_latent) max_latent = elements;
        n_images += frames[i] == 1;
    }

    synth_model model;
    synth_model_create(&model, (uint64_t)seed, (int32_t)channels, (int32_t)text_len, (int32_t)text_dim);
    float *latent = xmalloc((size_t)max_latent * sizeof *latent), *text = xmalloc((size_t)(text_len * text_dim) * sizeof *text);
    store_writer *writer = store_writer_create(out, (int32_t)text_dim, precision, stderr);
    status = writer ? 0 : EXIT_BAD_DATA;
    if (writer && text_2_dim > 0 && store_writer_enable_sources(writer, (int32_t)text_2_dim, (int32_t)image_dim)) {
        store_writer_discard(writer);
        writer = NULL;
        status = EXIT_BAD_DATA;
    }
    float *text_2 = xmalloc((size_t)(text_2_len * text_2_dim + 1) * sizeof *text_2);
    float *image = xmalloc((size_t)(image_len * image_dim + 1) * sizeof *image);
    uint64_t state = rng_hash((uint64_t)draw_seed, 7), source_state = rng_hash((uint64_t)draw_seed, 9);
    int32_t text_len_min = (int32_t)((text_len + 1) / 2);
    for (int64_t i = 0; writer && i < n_samples; i++) {
        int k = (int)(rng_next_u64(&state) % SYNTH_CLASSES);
        int32_t sample_text_len = text_len_min + (int32_t)(rng_next_u64(&state) % (uint64_t)(text_len - text_len_min + 1));
        if (caption[i] > 0) sample_text_len = caption[i]; /* the spec's (the draw above keeps the stream as it was) */
        synth_sample(&model, k, frames[i], height[i], width[i], sample_text_len, &state, latent, text);
        int failed;
        if (text_2_dim > 0) { /* ByT5 rows: 0 to text_2_len; SigLIP rows: image_len for a video, none for an image */
            int32_t sample_text_2_len = (int32_t)(rng_next_u64(&source_state) % (uint64_t)(text_2_len + 1));
            int32_t sample_image_len = frames[i] > 1 ? (int32_t)image_len : 0;
            for (int64_t v = 0; v < (int64_t)sample_text_2_len * text_2_dim; v++) text_2[v] = (float)rng_normal(&source_state);
            for (int64_t v = 0; v < (int64_t)sample_image_len * image_dim; v++) image[v] = (float)rng_normal(&source_state);
            failed = store_writer_add_sources(writer, (int32_t)channels, frames[i], height[i], width[i], latent,
                                              sample_text_len, text, sample_text_2_len, text_2, sample_image_len, image);
        } else {
            failed = store_writer_add(writer, (int32_t)channels, frames[i], height[i], width[i], latent, sample_text_len, text);
        }
        if (failed) {
            store_writer_discard(writer);
            writer = NULL;
            status = EXIT_BAD_DATA;
        }
    }
    if (writer && store_writer_close(writer)) status = EXIT_BAD_DATA;
    if (status == 0)
        printf("aldit-store: wrote %s: %" PRId64 " sample%s (%" PRId64 " image%s, %" PRId64 " video%s), %s, text_dim %" PRId64
               ", %d classes\n", out, n_samples, plural(n_samples), n_images, plural(n_images), n_samples - n_images,
               plural(n_samples - n_images), store_precision_name(precision), text_dim,
               SYNTH_CLASSES);
    free(latent);
    free(text);
    free(text_2);
    free(image);
    synth_model_free(&model);
    free(frames);
    free(height);
    free(width);
    free(caption);
    free(buckets);
    return status;
}

/* ---- pack: .npy files (format: numpy.lib.format, versions 1-3) ---------------------------------- */

typedef struct {
    int ndim;
    int64_t shape[8];
    int64_t n_values;
    int value_bytes;      /* 2, 4 or 8: little-endian IEEE float */
    long data_offset;
} npy_header;

/* Finds `'key':` (or "key":) in a header dict and returns the text after it, or NULL. */
static const char *npy_find_key(const char *dict, const char *key)
{
    char quoted[2][64];
    snprintf(quoted[0], sizeof quoted[0], "'%s'", key);
    snprintf(quoted[1], sizeof quoted[1], "\"%s\"", key);
    for (int q = 0; q < 2; q++) {
        const char *at = strstr(dict, quoted[q]);
        if (!at) continue;
        at += strlen(quoted[q]);
        while (*at == ' ') at++;
        if (*at != ':') return NULL;
        at++;
        while (*at == ' ') at++;
        return at;
    }
    return NULL;
}

/* Parses the header of an open .npy file; 0 ok, else prints "PATH: why" to stderr. */
static int npy_read_header(FILE *file, const char *path, npy_header *header)
{
    unsigned char prefix[12];
    if (fread(prefix, 1, 10, file) != 10 || memcmp(prefix, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "%s: not a .npy file (no \\x93NUMPY magic)\n", path);
        return 1;
    }
    int major = prefix[6];
    uint32_t header_length;
    long dict_offset;
    if (major == 1) {
        header_length = (uint32_t)prefix[8] | (uint32_t)prefix[9] << 8;
        dict_offset = 10;
    } else if (major == 2 || major == 3) {
        if (fread(prefix + 10, 1, 2, file) != 2) { fprintf(stderr, "%s: truncated .npy header\n", path); return 1; }
        header_length = (uint32_t)prefix[8] | (uint32_t)prefix[9] << 8 | (uint32_t)prefix[10] << 16 | (uint32_t)prefix[11] << 24;
        dict_offset = 12;
    } else {
        fprintf(stderr, "%s: .npy format version %d is not supported (1, 2 or 3)\n", path, major);
        return 1;
    }
    if (header_length > 1u << 20) { fprintf(stderr, "%s: .npy header of %u bytes is implausible\n", path, header_length); return 1; }
    char *dict = xmalloc(header_length + 1);
    int failed = fread(dict, 1, header_length, file) != header_length;
    dict[failed ? 0 : header_length] = '\0';
    const char *descr = failed ? NULL : npy_find_key(dict, "descr");
    const char *fortran = failed ? NULL : npy_find_key(dict, "fortran_order");
    const char *shape = failed ? NULL : npy_find_key(dict, "shape");
    if (failed) {
        fprintf(stderr, "%s: truncated .npy header\n", path);
    } else if (!descr || !fortran || !shape) {
        failed = fprintf(stderr, "%s: .npy header lacks descr, fortran_order or shape: %s\n", path, dict) > 0;
    } else if (strncmp(fortran, "False", 5) != 0) {
        failed = fprintf(stderr, "%s: Fortran-order arrays are not supported (save with C order)\n", path) > 0;
    } else {
        char type[8] = "";
        if (sscanf(descr + 1, "%7[^'\"]", type) != 1 || (strcmp(type, "<f2") && strcmp(type, "<f4") && strcmp(type, "<f8"))) {
            failed = fprintf(stderr, "%s: dtype %s is not supported (little-endian float16, float32 or float64)\n", path,
                             type[0] ? type : "?") > 0;
        } else {
            header->value_bytes = type[2] - '0';
        }
    }
    if (!failed) {
        const char *at = shape;
        header->ndim = 0;
        header->n_values = 1;
        if (*at++ != '(') failed = 1;
        while (!failed) {
            while (*at == ' ' || *at == ',') at++;
            if (*at == ')') break;
            char *end = NULL;
            long long extent = strtoll(at, &end, 10);
            if (end == at || extent < 0 || extent > (1LL << 40) || header->ndim == 8) { failed = 1; break; }
            header->shape[header->ndim++] = extent;
            header->n_values *= extent;
            if (header->n_values > (INT64_C(1) << 40)) { failed = 1; break; }
            at = end;
        }
        if (failed) fprintf(stderr, "%s: cannot read the shape in the .npy header: %s\n", path, dict);
    }
    free(dict);
    header->data_offset = dict_offset + (long)header_length;
    return failed;
}

/* Reads a whole .npy file as fp32 with the expected number of dimensions; 0 ok. *values is malloc'ed. */
/* allow_empty: a caption source's part (NAME.text_2.npy, NAME.image.npy) may hold no rows, [0, D]. */
static int npy_load(const char *path, int expected_ndim, npy_header *header, float **values, int allow_empty)
{
    *values = NULL;
    FILE *file = fopen(path, "rb");
    if (!file) { fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno)); return 1; }
    int failed = npy_read_header(file, path, header);
    if (!failed && header->ndim != expected_ndim) {
        fprintf(stderr, "%s: array has %d dimensions, expected %d (%s)\n", path, header->ndim, expected_ndim,
                expected_ndim == 4 ? "latent [C, F, H, W]" : "text [L, D]");
        failed = 1;
    }
    if (!failed && header->n_values == 0 && !(allow_empty && header->shape[1] > 0)) {
        fprintf(stderr, "%s: array is empty\n", path);
        failed = 1;
    }
    struct stat info;
    if (!failed && fstat(fileno(file), &info) == 0 &&
        info.st_size < header->data_offset + header->n_values * header->value_bytes) {
        fprintf(stderr, "%s: truncated: the header promises %" PRId64 " bytes of data, the file holds %lld\n", path,
                header->n_values * header->value_bytes, (long long)(info.st_size - header->data_offset));
        failed = 1;
    }
    if (!failed) {
        size_t n = (size_t)header->n_values, width = (size_t)header->value_bytes;
        unsigned char *raw = xmalloc(n * width + 1);
        float *out = xmalloc(n * sizeof *out + sizeof *out);
        if (fread(raw, width, n, file) != n) {
            fprintf(stderr, "%s: read error\n", path);
            failed = 1;
        }
        for (size_t i = 0; !failed && i < n; i++) {
            if (width == 2) {
                out[i] = store_f16_to_f32((uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8));
            } else if (width == 4) {
                memcpy(&out[i], raw + 4 * i, 4);
            } else {
                double wide;
                memcpy(&wide, raw + 8 * i, 8);
                out[i] = (float)wide;
            }
        }
        free(raw);
        if (failed) free(out); else *values = out;
    }
    fclose(file);
    return failed;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int ends_with(const char *text, const char *suffix)
{
    size_t n = strlen(text), m = strlen(suffix);
    return n > m && strcmp(text + n - m, suffix) == 0;
}

/* Sample names in DIR: NAME for NAME.npy (not NAME.text.npy), sorted; checks every partner exists. */
static int pack_list(const char *directory, char ***names_out, int64_t *n_names_out)
{
    DIR *folder = opendir(directory);
    if (!folder) { fprintf(stderr, "%s: cannot open folder: %s\n", directory, strerror(errno)); return 1; }
    char **latents = NULL, **texts = NULL;
    int64_t n_latents = 0, n_texts = 0, capacity_latents = 0, capacity_texts = 0;
    for (struct dirent *entry = readdir(folder); entry; entry = readdir(folder)) {
        const char *name = entry->d_name;
        if (!ends_with(name, ".npy") || ends_with(name, ".text_2.npy") || ends_with(name, ".image.npy")) continue;
        int is_text = ends_with(name, ".text.npy");
        size_t stem = strlen(name) - (is_text ? 9 : 4);
        char ***list = is_text ? &texts : &latents;
        int64_t *count = is_text ? &n_texts : &n_latents, *capacity = is_text ? &capacity_texts : &capacity_latents;
        if (*count == *capacity) {
            *capacity = *capacity ? 2 * *capacity : 64;
            *list = xrealloc(*list, (size_t)*capacity * sizeof **list);
        }
        char *copy = xmalloc(stem + 1);
        memcpy(copy, name, stem);
        copy[stem] = '\0';
        (*list)[(*count)++] = copy;
    }
    closedir(folder);
    if (n_latents) qsort(latents, (size_t)n_latents, sizeof *latents, compare_names);
    if (n_texts) qsort(texts, (size_t)n_texts, sizeof *texts, compare_names);
    int64_t n_problems = 0;
    for (int64_t i = 0, j = 0; i < n_latents || j < n_texts;) {
        int order = i == n_latents ? 1 : j == n_texts ? -1 : strcmp(latents[i], texts[j]);
        if (order == 0) { i++; j++; continue; }
        if (n_problems++ < 20) {
            if (order < 0) fprintf(stderr, "%s/%s.npy: no text partner %s.text.npy\n", directory, latents[i], latents[i]);
            else fprintf(stderr, "%s/%s.text.npy: no latent partner %s.npy\n", directory, texts[j], texts[j]);
        }
        if (order < 0) i++; else j++;
    }
    if (n_latents == 0 && n_texts == 0) fprintf(stderr, "%s: no .npy files (expected NAME.npy and NAME.text.npy)\n", directory);
    for (int64_t j = 0; j < n_texts; j++) free(texts[j]);
    free(texts);
    if (n_problems || n_latents == 0) {
        if (n_problems > 20) fprintf(stderr, "%s: %" PRId64 " unmatched files in all\n", directory, n_problems);
        for (int64_t i = 0; i < n_latents; i++) free(latents[i]);
        free(latents);
        return 1;
    }
    *names_out = latents;
    *n_names_out = n_latents;
    return 0;
}

/* A sample's caption sources, DIR/NAME.text_2.npy [G, D2] and DIR/NAME.image.npy [I, D3] (G, I may be 0), their
   widths those of the first sample (*widths, set from it when 0). 0 ok; else the file is named. */
static int pack_sources(const char *directory, const char *name, int32_t *widths, npy_header *text_2_header,
                        float **text_2, npy_header *image_header, float **image)
{
    size_t size = strlen(directory) + strlen(name) + 16;
    char *paths[2] = {xmalloc(size), xmalloc(size)};
    snprintf(paths[0], size, "%s/%s.text_2.npy", directory, name);
    snprintf(paths[1], size, "%s/%s.image.npy", directory, name);
    npy_header *headers[2] = {text_2_header, image_header};
    float **values[2] = {text_2, image};
    int failed = 0;
    for (int k = 0; k < 2 && !failed; k++) {
        failed = npy_load(paths[k], 2, headers[k], values[k], 1);
        if (!failed && headers[k]->shape[1] > (1 << 20)) {
            fprintf(stderr, "%s: width %" PRId64 " too large for a store\n", paths[k], headers[k]->shape[1]);
            failed = 1;
        } else if (!failed && widths[k] && headers[k]->shape[1] != widths[k]) {
            fprintf(stderr, "%s: width %" PRId64 " differs from %d of the first sample\n", paths[k], headers[k]->shape[1],
                    widths[k]);
            failed = 1;
        }
        if (!failed) widths[k] = (int32_t)headers[k]->shape[1];
    }
    free(paths[0]);
    free(paths[1]);
    return failed;
}

/* 1 when DIR/NAME.text_2.npy or DIR/NAME.image.npy exists. When the first sample has one, the store gets the caption
   sources and every sample needs both parts; when it has none, no other sample may have one. */
static int has_source_parts(const char *directory, const char *name)
{
    size_t size = strlen(directory) + strlen(name) + 16;
    char *path = xmalloc(size);
    struct stat info;
    snprintf(path, size, "%s/%s.text_2.npy", directory, name);
    int found = stat(path, &info) == 0;
    snprintf(path, size, "%s/%s.image.npy", directory, name);
    found = found || stat(path, &info) == 0;
    free(path);
    return found;
}

static int command_pack(int argc, char **argv)
{
    const char *out = NULL, *precision_text = "bf16";
    option_slot slots[] = {{"out", &out}, {"precision", &precision_text}};
    const char *positional[1];
    int n_positional = 0, status = parse_options(argc, argv, slots, 2, positional, 1, &n_positional);
    if (status) return status;
    if (!out || n_positional != 1) return usage_error("pack needs --out FILE and one folder DIR");
    store_precision precision = STORE_BF16;
    if ((status = parse_precision(precision_text, &precision))) return status;
    const char *directory = positional[0];
    char **names = NULL;
    int64_t n_names = 0;
    if (pack_list(directory, &names, &n_names)) return EXIT_BAD_DATA;

    store_writer *writer = NULL;
    int32_t text_dim = 0, source_widths[2] = {0, 0};
    int32_t *sources = has_source_parts(directory, names[0]) ? source_widths : NULL;
    size_t path_size = strlen(directory) + 1024;
    char *latent_path = xmalloc(path_size), *text_path = xmalloc(path_size);
    for (int64_t i = 0; i < n_names && status == 0; i++) {
        snprintf(latent_path, path_size, "%s/%s.npy", directory, names[i]);
        snprintf(text_path, path_size, "%s/%s.text.npy", directory, names[i]);
        npy_header latent_header, text_header, source_headers[2];
        float *latent = NULL, *text = NULL, *text_2 = NULL, *image = NULL;
        if (!sources && has_source_parts(directory, names[i])) {
            fprintf(stderr, "%s/%s: has caption source parts (.text_2.npy, .image.npy), but the first sample %s has none: "
                    "give every sample both or none\n", directory, names[i], names[0]);
            status = EXIT_BAD_DATA;
            break;
        }
        if (npy_load(latent_path, 4, &latent_header, &latent, 0) || npy_load(text_path, 2, &text_header, &text, 0) ||
            (sources && pack_sources(directory, names[i], sources, &source_headers[0], &text_2, &source_headers[1], &image))) {
            status = EXIT_BAD_DATA;
        } else if (latent_header.shape[0] > 4096 || latent_header.shape[1] > 65536 || latent_header.shape[2] > 65536 ||
                   latent_header.shape[3] > 65536 || text_header.shape[0] > (1 << 20) || text_header.shape[1] > (1 << 20)) {
            fprintf(stderr, "%s: shape too large for a store\n", latent_path);
            status = EXIT_BAD_DATA;
        } else if (writer && text_header.shape[1] != text_dim) {
            fprintf(stderr, "%s: text width %" PRId64 " differs from %d of the first sample (%s/%s.text.npy)\n", text_path,
                    text_header.shape[1], text_dim, directory, names[0]);
            status = EXIT_BAD_DATA;
        } else {
            if (!writer) {
                text_dim = (int32_t)text_header.shape[1];
                writer = store_writer_create(out, text_dim, precision, stderr);
                if (!writer || (sources && store_writer_enable_sources(writer, sources[0], sources[1]))) status = EXIT_BAD_DATA;
            }
            const int32_t shape[4] = {(int32_t)latent_header.shape[0], (int32_t)latent_header.shape[1],
                                      (int32_t)latent_header.shape[2], (int32_t)latent_header.shape[3]};
            int failed = status != 0;
            if (!failed && sources)
                failed = store_writer_add_sources(writer, shape[0], shape[1], shape[2], shape[3], latent,
                                                  (int32_t)text_header.shape[0], text, (int32_t)source_headers[0].shape[0],
                                                  text_2, (int32_t)source_headers[1].shape[0], image);
            else if (!failed)
                failed = store_writer_add(writer, shape[0], shape[1], shape[2], shape[3], latent,
                                          (int32_t)text_header.shape[0], text);
            if (failed && writer) {
                fprintf(stderr, "%s: cannot add this sample (see above)\n", latent_path);
                status = EXIT_BAD_DATA;
            }
        }
        free(latent);
        free(text);
        free(text_2);
        free(image);
    }
    if (writer) {
        if (status) store_writer_discard(writer);
        else if (store_writer_close(writer)) status = EXIT_BAD_DATA;
    }
    if (status == 0)
        printf("aldit-store: wrote %s: %" PRId64 " samples from %s, %s, text_dim %d%s\n", out, n_names, directory,
               store_precision_name(precision), text_dim, sources ? ", with caption sources" : "");
    for (int64_t i = 0; i < n_names; i++) free(names[i]);
    free(names);
    free(latent_path);
    free(text_path);
    return status;
}

/* ---- info ------------------------------------------------------------------------------------ */

typedef struct { int32_t frames, height, width; int64_t count, tokens; } shape_count;

static int compare_shapes(const void *a, const void *b)
{
    const shape_count *x = a, *y = b;
    if (x->tokens != y->tokens) return x->tokens < y->tokens ? -1 : 1;
    if (x->frames != y->frames) return x->frames - y->frames;
    if (x->height != y->height) return x->height - y->height;
    return x->width - y->width;
}

static int compare_counts_descending(const void *a, const void *b)
{
    const shape_count *x = a, *y = b;
    return x->count != y->count ? (x->count > y->count ? -1 : 1) : compare_shapes(a, b);
}

static void print_bar(int64_t count, int64_t largest)
{
    int length = largest ? (int)((40 * count + largest - 1) / largest) : 0;
    for (int i = 0; i < length; i++) putchar('#');
    putchar('\n');
}

/* Power-of-two bin of a token count: 0 holds S = 0, b >= 1 holds [2^(b-1), 2^b). */
static int token_bin(int64_t tokens)
{
    int bin = 0;
    while (tokens > 0) { bin++; tokens >>= 1; }
    return bin;
}

static int command_info(int argc, char **argv)
{
    const char *positional[1];
    int n_positional = 0, status = parse_options(argc, argv, NULL, 0, positional, 1, &n_positional);
    if (status) return status;
    if (n_positional != 1) return usage_error("info needs one store FILE");
    store s;
    if (store_open(&s, positional[0], stderr)) return EXIT_BAD_DATA;

    enum { MAX_SHAPES_SHOWN = 40 };
    shape_count *shapes = xmalloc((size_t)s.n_samples * sizeof *shapes);
    int64_t n_shapes = 0, n_images = 0, total_tokens = 0, min_tokens = INT64_MAX, max_tokens = 0, n_odd = 0;
    int64_t min_text = INT64_MAX, max_text = 0, total_text = 0, bins[64] = {0};
    double image_tokens = 0, image_square = 0, total_square = 0;
    for (int64_t id = 0; id < s.n_samples; id++) {
        const store_sample *sample = &s.samples[id];
        int64_t tokens = store_sample_tokens(sample, PATCH_T, PATCH_H, PATCH_W);
        n_images += sample->frames == 1;
        n_odd += sample->height % PATCH_H != 0 || sample->width % PATCH_W != 0;
        total_tokens += tokens;
        total_square += (double)tokens * (double)tokens;
        if (sample->frames == 1) { image_tokens += (double)tokens; image_square += (double)tokens * (double)tokens; }
        if (tokens < min_tokens) min_tokens = tokens;
        if (tokens > max_tokens) max_tokens = tokens;
        if (sample->text_len < min_text) min_text = sample->text_len;
        if (sample->text_len > max_text) max_text = sample->text_len;
        total_text += sample->text_len;
        bins[token_bin(tokens)]++;
        shapes[n_shapes] = (shape_count){sample->frames, sample->height, sample->width, 1, tokens};
        n_shapes++;
    }
    /* Collapse equal shapes. */
    qsort(shapes, (size_t)n_shapes, sizeof *shapes, compare_shapes);
    int64_t n_unique = 0;
    for (int64_t i = 0; i < n_shapes; i++) {
        if (n_unique && compare_shapes(&shapes[n_unique - 1], &shapes[i]) == 0) shapes[n_unique - 1].count++;
        else shapes[n_unique++] = shapes[i];
    }
    struct stat file_info;
    long long file_bytes = stat(s.path, &file_info) == 0 ? (long long)file_info.st_size : -1;

    printf("store        %s\n", s.path);
    printf("format       version %d; latents %s, text %s; %d channels; text_dim %d\n", STORE_FORMAT_VERSION,
           store_precision_name(s.latent_precision), store_precision_name(s.text_precision), s.latent_channels, s.text_dim);
    printf("samples      %" PRId64 " (%" PRId64 " image%s, %" PRId64 " video%s)\n", s.n_samples, n_images, plural(n_images),
           s.n_samples - n_images, plural(s.n_samples - n_images));
    printf("tokens       total %" PRId64 ", min %" PRId64 ", mean %.1f, max %" PRId64 " (patch %dx%dx%d)\n", total_tokens,
           min_tokens, (double)total_tokens / (double)s.n_samples, max_tokens, PATCH_T, PATCH_H, PATCH_W);
    printf("images share %.1f%% of samples, %.1f%% of tokens, %.1f%% of sum(S^2) (attention cost)\n",
           100.0 * (double)n_images / (double)s.n_samples, total_tokens ? 100.0 * image_tokens / (double)total_tokens : 0.0,
           total_square > 0 ? 100.0 * image_square / total_square : 0.0);
    printf("text_len     min %" PRId64 ", mean %.1f, max %" PRId64 "\n", min_text, (double)total_text / (double)s.n_samples,
           max_text);
    printf("bytes        %lld on disk; values: latents %lld, text %lld\n", file_bytes,
           (long long)s.latents_length * store_precision_bytes(s.latent_precision),
           (long long)s.text_length * store_precision_bytes(s.text_precision));
    if (s.has_sources) {
        int64_t total_2 = 0, max_2 = 0, with_image = 0, max_image = 0;
        for (int64_t id = 0; id < s.n_samples; id++) {
            total_2 += s.sources[id].text_2_len;
            if (s.sources[id].text_2_len > max_2) max_2 = s.sources[id].text_2_len;
            with_image += s.sources[id].image_len > 0;
            if (s.sources[id].image_len > max_image) max_image = s.sources[id].image_len;
        }
        printf("sources      text_2 (ByT5) %s, %d wide: mean %.1f, max %" PRId64 " rows; image (SigLIP) %s, %d wide: %" PRId64
               " sample%s with rows, max %" PRId64 "; values %lld bytes\n", store_precision_name(s.text_2_precision),
               s.text_2_dim, (double)total_2 / (double)s.n_samples, max_2, store_precision_name(s.image_precision),
               s.image_dim, with_image, plural(with_image), max_image,
               (long long)s.text_2_length * store_precision_bytes(s.text_2_precision) +
               (long long)s.image_length * store_precision_bytes(s.image_precision));
    }
    if (n_odd)
        printf("warning      %" PRId64 " samples have a height or width not divisible by the patch (%d x %d)\n", n_odd,
               PATCH_H, PATCH_W);

    printf("\nshapes (latent frames x height x width): %" PRId64 " distinct\n", n_unique);
    int64_t n_shown = n_unique < MAX_SHAPES_SHOWN ? n_unique : MAX_SHAPES_SHOWN;
    if (n_unique > MAX_SHAPES_SHOWN) { /* keep the most frequent, shown in token order */
        qsort(shapes, (size_t)n_unique, sizeof *shapes, compare_counts_descending);
        qsort(shapes, (size_t)n_shown, sizeof *shapes, compare_shapes);
    }
    int64_t largest_count = 0;
    for (int64_t i = 0; i < n_shown; i++) if (shapes[i].count > largest_count) largest_count = shapes[i].count;
    printf("  %5s %5s %5s %9s %9s\n", "F", "H", "W", "tokens", "samples");
    for (int64_t i = 0; i < n_shown; i++) {
        printf("  %5d %5d %5d %9" PRId64 " %9" PRId64 " ", shapes[i].frames, shapes[i].height, shapes[i].width,
               shapes[i].tokens, shapes[i].count);
        print_bar(shapes[i].count, largest_count);
    }
    if (n_unique > n_shown) printf("  ... %" PRId64 " rarer shapes not shown\n", n_unique - n_shown);

    printf("\ntokens per sample (power-of-two bins)\n");
    int64_t largest_bin = 0;
    int first_bin = 64, last_bin = 0;
    for (int b = 0; b < 64; b++) {
        if (!bins[b]) continue;
        if (bins[b] > largest_bin) largest_bin = bins[b];
        if (b < first_bin) first_bin = b;
        last_bin = b;
    }
    for (int b = first_bin; b <= last_bin; b++) {
        if (b == 0) printf("  %21s %9" PRId64 " ", "0", bins[b]);
        else printf("  [%8" PRId64 ", %8" PRId64 ") %9" PRId64 " ", INT64_C(1) << (b - 1), INT64_C(1) << b, bins[b]);
        print_bar(bins[b], largest_bin);
    }
    free(shapes);
    store_close(&s);
    return 0;
}

/* ---- verify ---------------------------------------------------------------------------------- */

/* With --deck: the store's dims against the deck's model (train_store_fits, what training checks at start). */
static int verify_against_deck(const store *s, const char *deck_path)
{
    deck config;
    deck_defaults(&config);
    if (deck_load(&config, deck_path, 0, NULL, stderr) != 0) return usage_error("verify: the deck %s has errors (above)", deck_path);
    char problem[512];
    if (!train_store_fits(s, &config, problem, sizeof problem)) return 0;
    fprintf(stderr, "aldit-store: verify: %s: FAILED: does not fit the model of %s: %s\n", s->path, deck_path, problem);
    return EXIT_BAD_DATA;
}

static int command_verify(int argc, char **argv)
{
    const char *deck_path = NULL;
    option_slot slots[] = {{"deck", &deck_path}};
    const char *positional[1];
    int n_positional = 0, status = parse_options(argc, argv, slots, 1, positional, 1, &n_positional);
    if (status) return status;
    if (n_positional != 1) return usage_error("verify needs one store FILE");
    const char *path = positional[0];
    store s;
    if (store_open(&s, path, stderr)) {
        fprintf(stderr, "aldit-store: verify: %s: FAILED (cannot open the store)\n", path);
        return EXIT_BAD_DATA;
    }
    if (deck_path && (status = verify_against_deck(&s, deck_path)) != 0) {
        store_close(&s);
        return status;
    }
    enum { MAX_REPORTED = 20 };
    float *latent = xmalloc((size_t)s.max_latent_elements * sizeof *latent);
    float *text = xmalloc((size_t)s.max_text_elements * sizeof *text);
    float *text_2 = xmalloc((size_t)(s.max_text_2_elements + 1) * sizeof *text_2);
    float *image = xmalloc((size_t)(s.max_image_elements + 1) * sizeof *image);
    FILE *quiet = fopen("/dev/null", "w"); /* messages after the first MAX_REPORTED bad samples are only counted */
    int64_t n_bad = 0;
    for (int64_t id = 0; id < s.n_samples; id++) {
        FILE *errors = n_bad < MAX_REPORTED || !quiet ? stderr : quiet;
        int bad = store_verify_sample(&s, id, latent, text, errors);
        if (!bad && s.has_sources) bad = store_verify_sources(&s, id, text_2, image, errors);
        n_bad += bad;
    }
    if (quiet) fclose(quiet);
    if (n_bad) {
        fprintf(stderr, "aldit-store: verify: %s: FAILED: %" PRId64 " of %" PRId64 " samples are bad\n", path, n_bad, s.n_samples);
        status = EXIT_BAD_DATA;
    } else {
        printf("aldit-store: verify: %s: OK (%" PRId64 " samples, shapes, finite values and checksums checked%s%s%s)\n",
               path, s.n_samples, s.has_sources ? "; caption sources too" : "", deck_path ? "; fits " : "",
               deck_path ? deck_path : "");
    }
    free(latent);
    free(text);
    free(text_2);
    free(image);
    store_close(&s);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage_error("no command given");
    const char *command = argv[1];
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0 || strcmp(command, "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(command, "--version") == 0) {
        printf("aldit-store (%s) %s, store format version %d\n", PACKAGE_NAME, PACKAGE_VERSION, STORE_FORMAT_VERSION);
        return 0;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    }
    /* each command parses argv from the command word on (argv[0] for getopt_long) */
    if (strcmp(command, "synth") == 0) return command_synth(argc - 1, argv + 1);
    if (strcmp(command, "pack") == 0) return command_pack(argc - 1, argv + 1);
    if (strcmp(command, "info") == 0) return command_info(argc - 1, argv + 1);
    if (strcmp(command, "verify") == 0) return command_verify(argc - 1, argv + 1);
    return usage_error("unknown command '%s'", command);
}
