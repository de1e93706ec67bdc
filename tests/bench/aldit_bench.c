/* aldit_bench.c — aldit-bench: GPU microbenchmarks (device copy bandwidth; LayerNorm-Modulate forward and backward,
   plain and gated-residual, in GB/s against their byte floors and as % of the copy bandwidth of the same run). */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu.h"
#include "lnmod.h"
#include "rng.h"

enum { kMaxDims = 8 };

typedef struct {
    int n_samples;
    int64_t rows_per_sample;
    int n_dims;
    int dims[kMaxDims];
    int repeats;           /* timed groups; the median group is reported */
    int launches_per_group;
    lnmod_tuning tuning;   /* zeros: the defaults */
    const char *json_path;
} bench_options;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: aldit-bench [--samples B] [--rows S] [--dims D1,D2,...] [--repeats N] [--max-vpt F,B,R]\n"
            "                   [--fwd-order chunk|interleave] [--fwd-streaming 0|1] [--json FILE]\n"
            "  Device copy bandwidth and LayerNorm-Modulate (forward, backward, gated-residual variants) on\n"
            "  B packed samples of S rows each (default B=2, S=32760, D=1536,3072,5120; N=21 timed groups of 10\n"
            "  launches, median reported). --max-vpt, --fwd-order and --fwd-streaming set the kernels' tuning\n"
            "  knobs (lnmod_tune in cuda/lnmod.h). --json also writes the figures to FILE.\n");
}

static long parse_long(const char *text, const char *option, long low, long high)
{
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (!text[0] || *end || value < low || value > high) {
        fprintf(stderr, "aldit-bench: %s %s: expected an integer from %ld to %ld\n", option, text, low, high);
        exit(ALDIT_EXIT_USAGE);
    }
    return value;
}

static bench_options parse_options(int argc, char **argv)
{
    bench_options o = {2, 32760, 3, {1536, 3072, 5120}, 21, 10, {0, 0, 0, 0, 0}, NULL};
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "aldit-bench: %s: missing value or unknown option\n", arg);
            usage(stderr);
            exit(ALDIT_EXIT_USAGE);
        }
        const char *value = argv[++i];
        if (!strcmp(arg, "--samples")) o.n_samples = (int)parse_long(value, arg, 1, 4096);
        else if (!strcmp(arg, "--rows")) o.rows_per_sample = parse_long(value, arg, 1, 1L << 22);
        else if (!strcmp(arg, "--repeats")) o.repeats = (int)parse_long(value, arg, 1, 1000);
        else if (!strcmp(arg, "--json")) o.json_path = value;
        else if (!strcmp(arg, "--max-vpt")) {
            if (sscanf(value, "%d,%d,%d", &o.tuning.max_vpt_fwd, &o.tuning.max_vpt_bwd, &o.tuning.max_vpt_residual_bwd) != 3) {
                fprintf(stderr, "aldit-bench: --max-vpt %s: expected three integers F,B,R\n", value);
                exit(ALDIT_EXIT_USAGE);
            }
        } else if (!strcmp(arg, "--fwd-order")) {
            if (strcmp(value, "chunk") && strcmp(value, "interleave")) {
                fprintf(stderr, "aldit-bench: --fwd-order %s: expected chunk or interleave\n", value);
                exit(ALDIT_EXIT_USAGE);
            }
            o.tuning.fwd_chunked = !strcmp(value, "chunk");
        } else if (!strcmp(arg, "--fwd-streaming")) o.tuning.fwd_streaming = (int)parse_long(value, arg, 0, 1);
        else if (!strcmp(arg, "--dims")) {
            char *copy = strdup(value), *save = NULL;
            o.n_dims = 0;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (o.n_dims == kMaxDims) {
                    fprintf(stderr, "aldit-bench: --dims %s: at most %d dims\n", value, kMaxDims);
                    exit(ALDIT_EXIT_USAGE);
                }
                long dim = parse_long(item, "--dims", 8, LNMOD_MAX_DIM);
                if (dim % 8) {
                    fprintf(stderr, "aldit-bench: --dims %s: %ld is not a multiple of 8\n", value, dim);
                    exit(ALDIT_EXIT_USAGE);
                }
                o.dims[o.n_dims++] = (int)dim;
            }
            free(copy);
        } else {
            fprintf(stderr, "aldit-bench: unknown option %s\n", arg);
            usage(stderr);
            exit(ALDIT_EXIT_USAGE);
        }
    }
    return o;
}

static int compare_floats(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* What one timed operation launches; `context` carries its buffers. */
typedef void (*bench_op)(void *context, cudaStream_t stream);

/* Median over `repeats` groups of milliseconds per launch; each group queues launches_per_group launches
   between two events, so host-side launch work overlaps the device work as it does in a training step. */
static double time_op(bench_op op, void *context, const bench_options *o, cudaStream_t stream)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; ++i) op(context, stream);
    float *ms = xmalloc((size_t)o->repeats * sizeof *ms);
    for (int r = 0; r < o->repeats; ++r) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < o->launches_per_group; ++i) op(context, stream);
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
        ms[r] /= (float)o->launches_per_group;
    }
    qsort(ms, (size_t)o->repeats, sizeof *ms, compare_floats);
    const double median = ms[o->repeats / 2];
    free(ms);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median;
}

typedef struct {
    void *dst;
    const void *src;
    size_t n_bytes;
} copy_context;

static void run_copy(void *context, cudaStream_t stream)
{
    copy_context *c = context;
    CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, c->n_bytes, cudaMemcpyDeviceToDevice, stream));
}

/* Device tensors of one LN-modulate shape. */
typedef struct {
    int64_t n_rows;
    int dim, n_samples;
    int64_t *row_start;
    gpu_bf16 *x, *y_prev, *dy, *d_res, *x_new, *y, *dx, *dy_prev;
    float *shift, *scale, *gate, *mean, *rstd, *dshift, *dscale, *dgate;
    void *workspace;
} lnmod_context;

static void run_fwd(void *context, cudaStream_t stream)
{
    lnmod_context *c = context;
    lnmod_fwd(c->x, c->n_rows, c->dim, c->row_start, c->n_samples, c->shift, c->scale, 1e-6f, c->y, c->mean, c->rstd,
              stream);
}

static void run_bwd(void *context, cudaStream_t stream)
{
    lnmod_context *c = context;
    lnmod_bwd(c->x, c->dy, c->n_rows, c->dim, c->row_start, c->n_samples, c->scale, c->mean, c->rstd, c->dx, c->dshift,
              c->dscale, c->workspace, stream);
}

static void run_residual_fwd(void *context, cudaStream_t stream)
{
    lnmod_context *c = context;
    lnmod_residual_fwd(c->x, c->y_prev, c->n_rows, c->dim, c->row_start, c->n_samples, c->gate, c->shift, c->scale,
                       1e-6f, c->x_new, c->y, c->mean, c->rstd, stream);
}

static void run_residual_bwd(void *context, cudaStream_t stream)
{
    lnmod_context *c = context;
    lnmod_residual_bwd(c->x_new, c->y_prev, c->dy, c->d_res, c->n_rows, c->dim, c->row_start, c->n_samples, c->gate,
                       c->scale, c->mean, c->rstd, c->dx, c->dy_prev, c->dshift, c->dscale, c->dgate, c->workspace,
                       stream);
}

static void *device_alloc(size_t n_bytes)
{
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, n_bytes));
    return p;
}

/* A device bf16 tensor of n random values: the host pattern `random_bits` (n + shift values) read from `shift`
   on, so that tensors differ without drawing new numbers for each. */
static gpu_bf16 *device_random_bf16(const gpu_bf16 *random_bits, size_t n, size_t shift)
{
    gpu_bf16 *p = device_alloc(n * sizeof *p);
    CUDA_CHECK(cudaMemcpy(p, random_bits + shift, n * sizeof *p, cudaMemcpyHostToDevice));
    return p;
}

static float *device_random_f32(size_t n, uint64_t *rng, double spread)
{
    float *host = xmalloc(n * sizeof *host);
    for (size_t i = 0; i < n; ++i) host[i] = (float)(spread * (2.0 * rng_uniform(rng) - 1.0));
    float *p = device_alloc(n * sizeof *p);
    CUDA_CHECK(cudaMemcpy(p, host, n * sizeof *p, cudaMemcpyHostToDevice));
    free(host);
    return p;
}

typedef struct {
    const char *name;
    bench_op op;
    double bytes_per_row_elem; /* bf16 row tensors moved: bytes per (row, column) */
    double bytes_per_row;      /* mean, rstd */
    double bytes_per_sample_elem; /* modulation vectors read and per-sample gradients written */
} op_spec;

int main(int argc, char **argv)
{
    const bench_options o = parse_options(argc, argv);
    if (gpu_count() == 0) {
        fprintf(stderr, "aldit-bench: no GPU visible (cudaGetDeviceCount found none)\n");
        return ALDIT_EXIT_ERROR;
    }
    gpu_select(0);
    lnmod_tune(&o.tuning);
    char device[256];
    gpu_describe(device, sizeof device);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    /* Copy bandwidth: 2 GiB read + 2 GiB written per copy. */
    copy_context copy = {NULL, NULL, (size_t)2 << 30};
    copy.dst = device_alloc(copy.n_bytes);
    void *copy_src = device_alloc(copy.n_bytes);
    CUDA_CHECK(cudaMemset(copy_src, 0x5a, copy.n_bytes));
    copy.src = copy_src;
    const double copy_ms = time_op(run_copy, &copy, &o, stream);
    const double copy_gbs = 2.0 * (double)copy.n_bytes / (copy_ms * 1e6);
    CUDA_CHECK(cudaFree(copy.dst));
    CUDA_CHECK(cudaFree(copy_src));

    printf("aldit-bench on %s\n", device);
    printf("device copy (cudaMemcpy D2D, 2 GiB, read + write): %.3f ms, %.0f GB/s\n", copy_ms, copy_gbs);
    printf("LayerNorm-Modulate, B=%d samples x S=%lld rows (%lld rows), bf16 rows, fp32 statistics and modulation;"
           "\n  tuning: --max-vpt %d,%d,%d --fwd-order %s --fwd-streaming %d (0 = default)\n", o.n_samples,
           (long long)o.rows_per_sample, (long long)(o.n_samples * o.rows_per_sample), o.tuning.max_vpt_fwd,
           o.tuning.max_vpt_bwd, o.tuning.max_vpt_residual_bwd, o.tuning.fwd_chunked ? "chunk" : "interleave",
           o.tuning.fwd_streaming);
    printf("%-6s %-14s %10s %12s %10s %9s\n", "D", "op", "ms", "floor MB", "GB/s", "% copy");

    const op_spec specs[] = {
        {"fwd", run_fwd, 4.0, 8.0, 8.0},                   /* x, y; mean, rstd; shift, scale */
        {"bwd", run_bwd, 6.0, 8.0, 12.0},                  /* x, dy, dx; mean, rstd; scale, dshift, dscale */
        {"residual_fwd", run_residual_fwd, 8.0, 8.0, 12.0}, /* x, y_prev, x_new, y; gate, shift, scale */
        {"residual_bwd", run_residual_bwd, 12.0, 8.0, 20.0}, /* x_new, y_prev, dy, d_x_new, dx, dy_prev */
    };
    const int n_specs = (int)(sizeof specs / sizeof specs[0]);
    double results[kMaxDims][4][2];

    const int64_t n_rows = o.n_samples * o.rows_per_sample;
    int max_dim = 0;
    for (int d = 0; d < o.n_dims; ++d) max_dim = o.dims[d] > max_dim ? o.dims[d] : max_dim;
    const size_t max_n = (size_t)n_rows * (size_t)max_dim, pattern_extra = 4096;
    uint64_t rng = 0xbe4c4a1d17ull;
    gpu_bf16 *pattern = xmalloc((max_n + pattern_extra) * sizeof *pattern);
    for (size_t i = 0; i < max_n + pattern_extra; ++i)
        pattern[i] = gpu_bf16_from_float((float)(4.0 * rng_uniform(&rng) - 1.5));
    int64_t *row_start_host = xmalloc((size_t)(o.n_samples + 1) * sizeof *row_start_host);
    for (int b = 0; b <= o.n_samples; ++b) row_start_host[b] = b * o.rows_per_sample;

    for (int d = 0; d < o.n_dims; ++d) {
        lnmod_context c = {0};
        c.n_rows = n_rows, c.dim = o.dims[d], c.n_samples = o.n_samples;
        const size_t n = (size_t)n_rows * (size_t)c.dim, n_mod = (size_t)c.n_samples * (size_t)c.dim;
        c.row_start = device_alloc((size_t)(c.n_samples + 1) * sizeof *c.row_start);
        CUDA_CHECK(cudaMemcpy(c.row_start, row_start_host, (size_t)(c.n_samples + 1) * sizeof *c.row_start,
                              cudaMemcpyHostToDevice));
        c.x = device_random_bf16(pattern, n, 0);
        c.y_prev = device_random_bf16(pattern, n, 1011);
        c.dy = device_random_bf16(pattern, n, 2029);
        c.d_res = device_random_bf16(pattern, n, 3037);
        c.x_new = device_alloc(n * sizeof *c.x_new), c.y = device_alloc(n * sizeof *c.y);
        c.dx = device_alloc(n * sizeof *c.dx), c.dy_prev = device_alloc(n * sizeof *c.dy_prev);
        c.shift = device_random_f32(n_mod, &rng, 0.5), c.scale = device_random_f32(n_mod, &rng, 0.5);
        c.gate = device_random_f32(n_mod, &rng, 0.5);
        c.mean = device_alloc((size_t)n_rows * sizeof *c.mean), c.rstd = device_alloc((size_t)n_rows * sizeof *c.rstd);
        c.dshift = device_alloc(n_mod * sizeof *c.dshift), c.dscale = device_alloc(n_mod * sizeof *c.dscale);
        c.dgate = device_alloc(n_mod * sizeof *c.dgate);
        size_t workspace_bytes = lnmod_bwd_workspace_bytes(n_rows, c.dim, c.n_samples);
        const size_t residual_bytes = lnmod_residual_bwd_workspace_bytes(n_rows, c.dim, c.n_samples);
        c.workspace = device_alloc(residual_bytes > workspace_bytes ? residual_bytes : workspace_bytes);
        run_fwd(&c, stream);           /* mean and rstd for the plain backward */
        run_residual_fwd(&c, stream);  /* x_new for the residual backward (mean, rstd now of x_new: same cost) */
        CUDA_CHECK(cudaStreamSynchronize(stream));

        for (int s = 0; s < n_specs; ++s) {
            const double ms = time_op(specs[s].op, &c, &o, stream);
            const double bytes = specs[s].bytes_per_row_elem * (double)n + specs[s].bytes_per_row * (double)n_rows +
                                 specs[s].bytes_per_sample_elem * (double)n_mod;
            const double gbs = bytes / (ms * 1e6);
            results[d][s][0] = ms;
            results[d][s][1] = gbs;
            printf("%-6d %-14s %10.4f %12.1f %10.0f %8.1f%%\n", c.dim, specs[s].name, ms, bytes / 1e6, gbs,
                   100.0 * gbs / copy_gbs);
        }
        void *buffers[] = {c.row_start, c.x, c.y_prev, c.dy, c.d_res, c.x_new, c.y, c.dx, c.dy_prev, c.shift, c.scale,
                           c.gate, c.mean, c.rstd, c.dshift, c.dscale, c.dgate, c.workspace};
        for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) CUDA_CHECK(cudaFree(buffers[i]));
    }
    CUDA_CHECK(cudaStreamDestroy(stream));

    if (o.json_path) {
        FILE *json = fopen(o.json_path, "w");
        if (!json) ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "--json %s: cannot open for writing", o.json_path);
        fprintf(json, "{\"device\": \"%s\", \"copy_gbs\": %.1f, \"samples\": %d, \"rows_per_sample\": %lld, \"lnmod\": [",
                device, copy_gbs, o.n_samples, (long long)o.rows_per_sample);
        for (int d = 0; d < o.n_dims; ++d)
            for (int s = 0; s < n_specs; ++s)
                fprintf(json, "%s\n  {\"dim\": %d, \"op\": \"%s\", \"ms\": %.5f, \"gbs\": %.1f, \"pct_copy\": %.1f}",
                        d || s ? "," : "", o.dims[d], specs[s].name, results[d][s][0], results[d][s][1],
                        100.0 * results[d][s][1] / copy_gbs);
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    free(pattern);
    free(row_start_host);
    return 0;
}
