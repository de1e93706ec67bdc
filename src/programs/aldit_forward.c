/* aldit_forward.c — the aldit-forward tool: the CPU fp32 model's forward alone, on given weights and packed inputs, to HDF5. */
#include "config.h"
#include "core/check.h"
#include "deck/deck.h"
#include "io/h5util.h"
#include "io/store.h"
#include "model/model.h"
#include "model/ops_cpu.h"
#include "train/checkpoint.h"

#include <errno.h>
#include <getopt.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: aldit-forward --weights FILE --input FILE --output FILE [--deck FILE] [--self-check]\n"
    "                     [section.key=value ...]\n"
    "\n"
    "Run the CPU fp32 model's forward once on a packed micro-batch and write the prediction.\n"
    "The model's dims are the deck's [model] section (defaults, --deck FILE, then overrides such as\n"
    "model.dim=64), text_padding included: with wan (the default) each caption is zero-padded to text_len\n"
    "rows and attended whole, as in training; with trim the given rows only. Its weights come from FILE, a dataset per Wan parameter name at the root (an aldit\n"
    "checkpoint or converted Wan weights), or Wan or diffusers safetensors (a file or its index.json), as\n"
    "[model] init reads them. An aldit checkpoint's /model\n"
    "attributes (dims, eps, qk_norm, ...) must equal the deck's, as for a resume: a difference is refused.\n"
    "\n"
    "input FILE (HDF5; docs/model.md, section Parity):\n"
    "  /shapes   integer [B, 4]   frames, height, width (latent units) and text_len of each sample;\n"
    "            model.family = hunyuanvideo15: [B, 6], then its ByT5 and image rows (text_2_len, image_len)\n"
    "  /latents  float [sum C*F*H*W]  the model's input x_t of each sample, [C, F, H, W], back to back\n"
    "  /sigma    float [B]        noise level of each sample; timestep t = 1000 * sigma (fp32)\n"
    "  /text     float [sum text_len*text_dim]  text embeddings [text_len, text_dim], back to back\n"
    "  /text_2, /image  hunyuanvideo15: float [sum text_2_len*text_2_dim], [sum image_len*image_dim]\n"
    "            (ByT5 and SigLIP rows; absent = none); its captions are never padded, its /latents are the\n"
    "            whole input: in_dim = x_t, condition latent, mask channels\n"
    "output FILE: /output float32 [sum out_dim*F*H*W] (the prediction [out_dim, F, H, W] per sample, back\n"
    "  to back) and /shapes as given; written as FILE.tmp, then renamed. FILE (and FILE.tmp) may be absent\n"
    "  or a regular file, which is replaced; a directory, symbolic link or named pipe there is refused.\n"
    "\n"
    "  --self-check  also run the model's own loss forward (model_forward_loss with x0 = noise = x_t, so\n"
    "                the target is 0 and each loss is the mean square of the prediction) and fail when it\n"
    "                differs from this program's output by more than 1e-5 (relative)\n"
    "  --help, --version\n"
    "\n"
    "exit status: 0 ok; 1 an I/O error or a failed self-check; 2 a bad command line, deck, weights or input.\n";

typedef struct {
    const char *weights, *input, *output, *deck;
    int self_check;
    int n_overrides;
    char **overrides;
} options;

static int usage_error(const char *message, const char *what)
{
    fprintf(stderr, "aldit-forward: %s%s\n(aldit-forward --help shows the usage)\n", message, what ? what : "");
    return ALDIT_EXIT_USAGE;
}

/* 0 and *opts filled; -1 after --help/--version (printed); otherwise the exit status of a usage error. */
static int parse_options(int argc, char **argv, options *opts)
{
    static const struct option long_options[] = {
        {"weights", required_argument, NULL, 'w'}, {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},  {"deck", required_argument, NULL, 'd'},
        {"self-check", no_argument, NULL, 's'},    {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0}};
    memset(opts, 0, sizeof *opts);
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
        switch (c) {
        case 'w': opts->weights = optarg; break;
        case 'i': opts->input = optarg; break;
        case 'o': opts->output = optarg; break;
        case 'd': opts->deck = optarg; break;
        case 's': opts->self_check = 1; break;
        case 'h': fputs(usage_text, stdout); return -1;
        case 'V': printf("aldit-forward %s\n", PACKAGE_VERSION); return -1;
        case ':': return usage_error("missing value of ", argv[optind - 1]);
        default: return usage_error("unknown option ", argv[optind - 1]);
        }
    }
    if (!opts->weights) return usage_error("--weights FILE is required", NULL);
    if (!opts->input) return usage_error("--input FILE is required", NULL);
    if (!opts->output) return usage_error("--output FILE is required", NULL);
    for (int i = optind; i < argc; i++)
        if (!strchr(argv[i], '=')) return usage_error("not a section.key=value override: ", argv[i]);
    opts->n_overrides = argc - optind;
    opts->overrides = argv + optind;
    return 0;
}

/* ---- input ------------------------------------------------------------------------------------------ */

/* Read dataset `name` of `file` (rank `rank`, any integer or float type) converted to `memory_type`;
   *count receives its element count and dims (rank 2 only) its shape. Bad input ends with exit 2. */
static void *read_dataset(hid_t file, const char *path, const char *name, int rank, hid_t memory_type,
                          size_t element_bytes, hsize_t dims[2], int64_t *count)
{
    h5_auto_print saved = h5_quiet_begin();
    hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
    h5_quiet_end(saved);
    if (dataset < 0) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: no dataset %s", path, name);
    hid_t type = H5Dget_type(dataset), space = H5Dget_space(dataset);
    H5T_class_t type_class = H5Tget_class(type);
    if (type_class != H5T_INTEGER && type_class != H5T_FLOAT)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: %s is not a number dataset", path, name);
    int found_rank = H5Sget_simple_extent_ndims(space);
    if (found_rank != rank)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: %s has %d dimensions, expected %d", path, name, found_rank, rank);
    hsize_t shape[2] = {0, 1};
    H5_CHECK(H5Sget_simple_extent_dims(space, shape, NULL));
    *count = (int64_t)(shape[0] * (rank == 2 ? shape[1] : 1));
    if (dims) { dims[0] = shape[0]; dims[1] = shape[1]; }
    void *data = xmalloc((size_t)(*count > 0 ? *count : 1) * element_bytes);
    if (*count > 0 && H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        ALDIT_FATAL("%s: cannot read %s", path, name);
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(dataset);
    return data;
}

typedef struct {
    int n_samples, columns;   /* columns of /shapes: 4, or 6 for hunyuanvideo15 */
    int32_t *frames, *height, *width, *text_len, *text_2_len, *image_len;
    float *latents, *sigma, *text, *text_2, *image;
    int64_t *shapes;   /* [B, columns] as read, copied to the output */
} forward_input;

/* An optional float dataset (NULL and *count 0 where the file has none). */
static float *read_optional(hid_t file, const char *path, const char *name, int64_t *count)
{
    *count = 0;
    h5_auto_print saved = h5_quiet_begin();
    const int exists = H5Lexists(file, name, H5P_DEFAULT) > 0;
    h5_quiet_end(saved);
    return exists ? read_dataset(file, path, name, 1, H5T_NATIVE_FLOAT, sizeof(float), NULL, count) : NULL;
}

static void check_finite(const char *path, const char *name, const float *values, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(values[i])) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: %s[%lld] is not finite", path, name, (long long)i);
}

/* Read and check the packed micro-batch against the model (shapes, counts, sigma in [0, 1], finite values). */
static void read_input(const char *path, const model *m, forward_input *in)
{
    h5_auto_print saved = h5_quiet_begin();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    h5_quiet_end(saved);
    if (file < 0) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: cannot open as HDF5", path);
    hsize_t dims[2];
    int64_t n_shapes, n_latents, n_sigma, n_text, n_text_2, n_image;
    in->columns = m->family == FAMILY_WAN ? 4 : 6;
    in->shapes = read_dataset(file, path, "shapes", 2, H5T_NATIVE_INT64, sizeof(int64_t), dims, &n_shapes);
    if ((int)dims[1] != in->columns || dims[0] < 1)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /shapes is [%llu, %llu], expected [samples >= 1, %d] for model.family "
                         "= %s", path, (unsigned long long)dims[0], (unsigned long long)dims[1], in->columns,
                         m->family == FAMILY_WAN ? "wan" : "hunyuanvideo15");
    int B = in->n_samples = (int)dims[0];
    in->latents = read_dataset(file, path, "latents", 1, H5T_NATIVE_FLOAT, sizeof(float), NULL, &n_latents);
    in->sigma = read_dataset(file, path, "sigma", 1, H5T_NATIVE_FLOAT, sizeof(float), NULL, &n_sigma);
    in->text = read_dataset(file, path, "text", 1, H5T_NATIVE_FLOAT, sizeof(float), NULL, &n_text);
    in->text_2 = read_optional(file, path, "text_2", &n_text_2);
    in->image = read_optional(file, path, "image", &n_image);
    H5Fclose(file);
    if (n_sigma != B) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /sigma has %lld values for %d samples", path, (long long)n_sigma, B);
    int32_t *columns[6] = {in->frames = xmalloc((size_t)B * sizeof(int32_t)),
                           in->height = xmalloc((size_t)B * sizeof(int32_t)),
                           in->width = xmalloc((size_t)B * sizeof(int32_t)),
                           in->text_len = xmalloc((size_t)B * sizeof(int32_t)),
                           in->text_2_len = xcalloc((size_t)B, sizeof(int32_t)),
                           in->image_len = xcalloc((size_t)B, sizeof(int32_t))};
    int64_t want_latents = 0, want_text = 0, want_text_2 = 0, want_image = 0;
    for (int b = 0; b < B; b++) {
        for (int c = 0; c < in->columns; c++) {
            int64_t value = in->shapes[b * in->columns + c];
            if (value < (c >= 3 ? 0 : 1) || value > 65536)
                ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /shapes row %d column %d is %lld, out of range", path, b, c,
                                 (long long)value);
            columns[c][b] = (int32_t)value;
        }
        if (in->text_len[b] > m->text_len)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: sample %d has %d text tokens, the model's text_len is %d", path, b,
                             in->text_len[b], m->text_len);
        if (!(in->sigma[b] >= 0.0f && in->sigma[b] <= 1.0f))
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: sample %d has sigma %g outside [0, 1]", path, b, in->sigma[b]);
        want_latents += (int64_t)m->in_dim * in->frames[b] * in->height[b] * in->width[b];
        want_text += (int64_t)in->text_len[b] * m->text_dim;
        want_text_2 += (int64_t)in->text_2_len[b] * m->text_2_dim;
        want_image += (int64_t)in->image_len[b] * m->image_dim;
    }
    if (n_text_2 != want_text_2 || n_image != want_image)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /text_2 and /image have %lld and %lld values, the ByT5 and image lengths "
                         "(text_2_dim %d, image_dim %d) need %lld and %lld", path, (long long)n_text_2,
                         (long long)n_image, m->text_2_dim, m->image_dim, (long long)want_text_2, (long long)want_image);
    check_finite(path, "/text_2", in->text_2, n_text_2);
    check_finite(path, "/image", in->image, n_image);
    if (n_latents != want_latents)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /latents has %lld values, the shapes (in_dim %d) need %lld", path,
                         (long long)n_latents, m->in_dim, (long long)want_latents);
    if (n_text != want_text)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /text has %lld values, the text lengths (text_dim %d) need %lld",
                         path, (long long)n_text, m->text_dim, (long long)want_text);
    for (int64_t i = 0; i < n_latents; i++)
        if (!isfinite(in->latents[i])) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /latents[%lld] is not finite", path, (long long)i);
    for (int64_t i = 0; i < n_text; i++)
        if (!isfinite(in->text[i])) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "%s: /text[%lld] is not finite", path, (long long)i);
}

/* [model] text_padding = wan: every caption as text_len rows, its own followed by zero rows, as the training
   data reader hands captions to the model (docs/model.md, Packing). */
static void pad_text(const model *m, forward_input *in)
{
    int64_t row_values = m->text_dim;
    float *padded = xcalloc((size_t)in->n_samples * m->text_len * row_values, sizeof(float));
    int64_t offset = 0;
    for (int b = 0; b < in->n_samples; b++) {
        memcpy(padded + (int64_t)b * m->text_len * row_values, in->text + offset,
               (size_t)(in->text_len[b] * row_values) * sizeof(float));
        offset += in->text_len[b] * row_values;
        in->text_len[b] = m->text_len;
    }
    free(in->text);
    in->text = padded;
}

static void free_input(forward_input *in)
{
    free(in->frames); free(in->height); free(in->width); free(in->text_len); free(in->text_2_len); free(in->image_len);
    free(in->latents); free(in->sigma); free(in->text); free(in->text_2); free(in->image); free(in->shapes);
}

/* ---- forward ---------------------------------------------------------------------------------------- */

static const float *weight(const model *m, const char *name)
{
    const param_info *p = model_find_param(m, name);
    ALDIT_CHECK(p, "model has no parameter %s", name);
    return m->weights + p->offset;
}

/* y = Linear(x) with the parameters `prefix`.weight / `prefix`.bias. */
static void linear(const model *m, const char *prefix, const float *x, int64_t n_rows, int in_dim, int out_dim, float *y)
{
    char name[128];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const float *w = weight(m, name);
    snprintf(name, sizeof name, "%s.bias", prefix);
    cpu_linear_fwd(x, n_rows, in_dim, out_dim, w, weight(m, name), y);
}

/* The model's forward on the packed batch, the same computation as model.c's loss forward up to the
   prediction: embeddings, model_block_forward for every block, the modulated head. Writes out_dim*F*H*W
   values per sample, [out_dim, F, H, W], back to back. */
static void forward(model *m, const forward_input *in, float *output)
{
    int B = in->n_samples, D = m->dim;
    int64_t n_text;
    int64_t N = model_pack(m, B, in->frames, in->height, in->width, in->text_len, &n_text);
    int64_t *token_start = xmalloc((size_t)(B + 1) * sizeof(int64_t));
    float *tokens = xmalloc((size_t)(N * m->patch_in) * sizeof(float));
    token_start[0] = 0;
    int64_t latent_offset = 0;
    for (int b = 0; b < B; b++) {
        int64_t S = (int64_t)(in->frames[b] / m->patch_t) * (in->height[b] / m->patch_h) * (in->width[b] / m->patch_w);
        token_start[b + 1] = token_start[b] + S;
        cpu_patchify(in->latents + latent_offset, m->in_dim, in->frames[b], in->height[b], in->width[b], m->patch_t,
                     m->patch_h, m->patch_w, 0, tokens + token_start[b] * m->patch_in);
        latent_offset += (int64_t)m->in_dim * in->frames[b] * in->height[b] * in->width[b];
    }
    float *x = xmalloc((size_t)(N * D) * sizeof(float)), *x_next = xmalloc((size_t)(N * D) * sizeof(float));
    float *text_hidden = xmalloc((size_t)((n_text > 0 ? n_text : 1) * D) * sizeof(float));
    float *context = xmalloc((size_t)((n_text > 0 ? n_text : 1) * D) * sizeof(float));
    float *timesteps = xmalloc((size_t)B * sizeof(float)), *sinusoid = xmalloc((size_t)B * m->freq_dim * sizeof(float));
    float *time_hidden = xmalloc((size_t)B * D * sizeof(float)), *e = xmalloc((size_t)B * D * sizeof(float));
    float *e0 = xmalloc((size_t)B * 6 * D * sizeof(float));

    /* patches; text: Linear, GELU-tanh, Linear; time: sinusoid(1000 sigma), Linear, SiLU, Linear; e0 = Linear(SiLU(e)) */
    linear(m, "patch_embedding", tokens, N, m->patch_in, D, x);
    linear(m, "text_embedding.0", in->text, n_text, m->text_dim, D, text_hidden);
    cpu_gelu_tanh_fwd(text_hidden, n_text * D, text_hidden);
    linear(m, "text_embedding.2", text_hidden, n_text, D, D, context);
    for (int b = 0; b < B; b++) timesteps[b] = 1000.0f * in->sigma[b];
    cpu_sinusoidal_embedding(timesteps, B, m->freq_dim, sinusoid);
    linear(m, "time_embedding.0", sinusoid, B, m->freq_dim, D, time_hidden);
    cpu_silu_fwd(time_hidden, (int64_t)B * D, time_hidden);
    linear(m, "time_embedding.2", time_hidden, B, D, D, e);
    cpu_silu_fwd(e, (int64_t)B * D, time_hidden);
    linear(m, "time_projection.1", time_hidden, B, D, 6 * D, e0);

    for (int l = 0; l < m->num_layers; l++) {
        model_block_forward(m, l, x, e0, context, x_next);
        float *swap = x; x = x_next; x_next = swap;
    }

    /* head: LN(x) (1 + head.modulation[1] + e) + head.modulation[0] + e, then Linear; then unpatchify */
    const float *head_mod = weight(m, "head.modulation");
    float *shift = xmalloc((size_t)B * D * sizeof(float)), *scale = xmalloc((size_t)B * D * sizeof(float));
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < D; c++) {
            shift[b * D + c] = head_mod[c] + e[b * D + c];
            scale[b * D + c] = head_mod[D + c] + e[b * D + c];
        }
    float *mean = xmalloc((size_t)N * sizeof(float)), *rstd = xmalloc((size_t)N * sizeof(float));
    cpu_ln_modulate_fwd(x, N, D, token_start, B, shift, scale, m->eps, x_next, mean, rstd);
    float *pred = xmalloc((size_t)(N * m->patch_out) * sizeof(float));
    linear(m, "head.head", x_next, N, D, m->patch_out, pred);
    int64_t output_offset = 0;
    for (int b = 0; b < B; b++) {
        cpu_unpatchify(pred + token_start[b] * m->patch_out, m->out_dim, in->frames[b], in->height[b], in->width[b],
                       m->patch_t, m->patch_h, m->patch_w, 1, output + output_offset);
        output_offset += (int64_t)m->out_dim * in->frames[b] * in->height[b] * in->width[b];
    }
    free(token_start); free(tokens); free(x); free(x_next); free(text_hidden); free(context); free(timesteps);
    free(sinusoid); free(time_hidden); free(e); free(e0); free(shift); free(scale); free(mean); free(rstd); free(pred);
}

/* Each sample's first out_dim channels (x_t) of its input; NULL when another channel is not zero (the loss
   builds its input with zero condition channels: the self-check needs text-to-video samples). */
static float *first_channels(const model *m, const forward_input *in)
{
    int64_t in_at = 0, out_at = 0, total = 0;
    for (int b = 0; b < in->n_samples; b++) total += (int64_t)m->out_dim * in->frames[b] * in->height[b] * in->width[b];
    float *x = xmalloc((size_t)total * sizeof(float));
    for (int b = 0; b < in->n_samples; b++) {
        const int64_t volume = (int64_t)in->frames[b] * in->height[b] * in->width[b];
        for (int64_t i = volume * m->out_dim; i < volume * m->in_dim; i++)
            if (in->latents[in_at + i] != 0.0f)
                ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "--self-check: sample %d has condition channels (image-to-video): the "
                                 "loss forward takes text-to-video inputs only; leave --self-check out", b);
        memcpy(x + out_at, in->latents + in_at, (size_t)(volume * m->out_dim) * sizeof(float));
        in_at += volume * m->in_dim;
        out_at += volume * m->out_dim;
    }
    return x;
}

/* model_forward_loss with x0 = noise = x_t (target 0): each sample's loss is the mean square of the model's
   own prediction; compare with this program's output. 0 when they agree to 1e-5 (relative). */
static int self_check(model *m, const forward_input *in, const float *output)
{
    /* the loss takes x0 and eps with out_dim channels (the rest of a hunyuanvideo15 input is zero there) */
    const float *x0 = in->latents;
    float *first = NULL;
    if (m->in_dim != m->out_dim) x0 = first = first_channels(m, in);
    model_batch batch = {in->n_samples, in->frames, in->height, in->width, in->text_len, x0, x0, in->sigma, in->text,
                         1, 0, NULL, in->text_2_len, in->image_len, in->text_2, in->image, NULL};
    double *loss = xmalloc((size_t)in->n_samples * sizeof(double));
    model_forward_loss(m, &batch, loss);
    free(first);
    int bad = 0;
    int64_t offset = 0;
    for (int b = 0; b < in->n_samples; b++) {
        int64_t n = (int64_t)m->out_dim * in->frames[b] * in->height[b] * in->width[b];
        double sum_sq = 0.0;
        for (int64_t i = 0; i < n; i++) sum_sq += (double)output[offset + i] * output[offset + i];
        double mine = sum_sq / (double)n, diff = fabs(mine - loss[b]) / fmax(fabs(loss[b]), 1e-30);
        printf("self-check sample %d: mean square %.9g, model_forward_loss %.9g, relative difference %.3g\n", b,
               mine, loss[b], diff);
        if (!(diff <= 1e-5)) bad++;
        offset += n;
    }
    free(loss);
    return bad;
}

/* ---- output ----------------------------------------------------------------------------------------- */

/* Refuses --output (before any work) when it or its .tmp exists and is not a regular file: the rename
   that publishes the output would fail on a directory or replace a symbolic link or a named pipe. */
static void check_output_path(const char *path)
{
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    const char *paths[2] = {path, temporary};
    for (int i = 0; i < 2; i++) {
        const char *kind = store_not_a_regular_file(paths[i]);
        if (kind)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "--output %s: %s exists and is %s; aldit-forward replaces only regular "
                             "files: move it away or give another --output", path, paths[i], kind);
    }
}

/* One dataset `name` of `type` holding `values` (memory type `memory_type`), rank 1 or 2. 0 on success. */
static int write_dataset(hid_t file, const char *name, hid_t type, hid_t memory_type, int rank, const hsize_t *dims,
                         const void *values)
{
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t dataset = space < 0 ? -1 : H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int failed = dataset < 0 || H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0;
    if (dataset >= 0 && H5Dclose(dataset) < 0) failed = 1;
    if (space >= 0) H5Sclose(space);
    return failed;
}

/* Writes PATH.tmp, then renames it to PATH. On any failure the temporary file is removed and the job ends
   (exit 1) naming the file, the step and errno's text. */
static void write_output(const char *path, const forward_input *in, const float *output, int64_t n_output)
{
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    h5_auto_print saved = h5_quiet_begin();
    errno = 0;
    hid_t file = H5Fcreate(temporary, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        h5_quiet_end(saved);
        ALDIT_FATAL("%s: cannot create: %s", temporary, errno ? strerror(errno) : "HDF5 error");
    }
    hsize_t n = (hsize_t)n_output, shape[2] = {(hsize_t)in->n_samples, (hsize_t)in->columns};
    errno = 0;
    int failed = write_dataset(file, "output", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, &n, output) ||
                 write_dataset(file, "shapes", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, shape, in->shapes);
    if (H5Fclose(file) < 0) failed = 1;
    int write_errno = errno;
    h5_quiet_end(saved);
    if (failed) {
        unlink(temporary);
        ALDIT_FATAL("%s: cannot write: %s (removed it)", temporary, write_errno ? strerror(write_errno) : "HDF5 error");
    }
    if (rename(temporary, path) != 0) {
        int rename_errno = errno;
        unlink(temporary);
        ALDIT_FATAL("%s: cannot rename to %s: %s (removed it)", temporary, path, strerror(rename_errno));
    }
}

int main(int argc, char **argv)
{
    options opts;
    int status = parse_options(argc, argv, &opts);
    if (status) return status < 0 ? 0 : status;
    deck config;
    deck_defaults(&config);
    if (deck_load(&config, opts.deck, opts.n_overrides, opts.overrides, stderr)) return ALDIT_EXIT_USAGE;
    if (config.run.threads > 0) cpu_set_threads(config.run.threads);
    check_output_path(opts.output);
    if (checkpoint_check_model(opts.weights, &config, stderr)) {
        fprintf(stderr, "aldit-forward: give the [model] the weights were trained with (--deck FILE or model.KEY=VALUE)\n");
        return ALDIT_EXIT_USAGE;
    }
    model m;
    model_create(&m, &config);
    if (checkpoint_load_weights(opts.weights, &m, stderr)) return ALDIT_EXIT_USAGE;
    forward_input in;
    read_input(opts.input, &m, &in);
    if (m.family == FAMILY_WAN && config.model.text_padding == TEXT_PADDING_WAN) pad_text(&m, &in);
    int64_t n_output = 0;
    for (int b = 0; b < in.n_samples; b++) n_output += (int64_t)m.out_dim * in.frames[b] * in.height[b] * in.width[b];
    float *output = xmalloc((size_t)n_output * sizeof(float));
    if (m.family == FAMILY_WAN) {
        forward(&m, &in, output);
    } else {
        model_batch batch = {.n_samples = in.n_samples, .frames = in.frames, .height = in.height, .width = in.width,
                             .text_len = in.text_len, .latents = in.latents, .sigma = in.sigma, .text = in.text,
                             .text_2_len = in.text_2_len, .text_2 = in.text_2, .image_len = in.image_len,
                             .image = in.image};
        model_predict(&m, &batch, output);
    }
    if (opts.self_check && self_check(&m, &in, output)) {
        fprintf(stderr, "aldit-forward: self-check FAILED: the output differs from model_forward_loss\n");
        status = ALDIT_EXIT_ERROR;
    }
    write_output(opts.output, &in, output, n_output);
    printf("aldit-forward: %d samples, %lld output values -> %s\n", in.n_samples, (long long)n_output, opts.output);
    free(output);
    free_input(&in);
    model_free(&m);
    return status;
}
