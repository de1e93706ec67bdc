/* fp8_bench.c — issue 34's measurement on one GPU: cuBLASLt FP8 GEMMs against bf16 at a Wan block's linear shapes (forward, dgrad, wgrad) and cuDNN FP8 fused attention against bf16 (forward, backward), one sample per call, in one run; prints one line per case and writes them as JSON lines for tests/bench/fp8_table.py. */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "cuda/gpu.h"
#include "io/lengths.h"
#ifdef HAVE_CUDNN
#include "cuda/attention_cudnn.h"
#include "cuda/attention_fp8.h"
#endif

enum { kMaxList = 8, kExitSkip = 77 };
static const size_t kWorkspaceBytes = (size_t)32 << 20; /* cuBLASLt's, as cuda/gemm.c gives it */
static const double kGroupMs = 20.0;                     /* a timed group lasts about this long */

typedef struct {
    const char *name;
    int dim, ffn_dim, heads;
} wan_model;
static const wan_model kModels[] = {{"1.3b", 1536, 8960, 12}, {"14b", 5120, 13824, 40}};
enum { kHeadDim = 128, kTile = 128 /* ATTENTION_CUDNN_TILE */ };

typedef struct {
    int run_gemm, run_attention;
    int n_seq;
    int64_t seq[kMaxList];
    int use_model[2];
    int repeats;
    int text_rows;
    const char *spec, *json_path;
    int64_t epoch_samples;
    uint64_t draw_seed;
} options;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fp8_bench [--sections gemm,attention] [--seq S1,S2,...] [--wan 1.3b,14b] [--repeats N]\n"
            "                 [--text-rows T] [--spec FILE --samples N --draw-seed S] [--json FILE]\n"
            "  gemm: per Wan model (--wan; default both) and M tokens (--seq; default 4096,16384,32768,75600), the\n"
            "    block's linears on its tokens (attn: self q/k/v/o and cross q/o, 6 of K = N = dim; FFN up: dim -> ffn;\n"
            "    FFN down: ffn -> dim; not the cross k/v on the text rows) on cuBLASLt, each\n"
            "    pass in bf16 and FP8 with per-tensor scales (A and B scale pointers, 1.0):\n"
            "      fwd   y = x W^T: bf16 TN; FP8 E4M3 x E4M3 -> bf16, fast accumulation on and off;\n"
            "      dgrad dx = dy W: bf16 NN as cuda/gemm.h; FP8 needs TN on Hopper, so it reads W^T (an E4M3 copy made\n"
            "            with the weight's cast) against dy in E5M2 -> bf16, fast accumulation on and off;\n"
            "      wgrad dW += dy^T x (fp32): bf16 NT as cuda/gemm.h; FP8 TN reads x^T (E4M3) and dy^T (E5M2), the\n"
            "            transposed copies a fused cast-transpose writes, fast accumulation off.\n"
            "  attention: per model's heads (12 or 40, head_dim 128) and S (each --seq rounded up to whole tiles of 128\n"
            "    rows, as aldit runs a long sample), one sample: cuDNN bf16 self-attention (S x S)\n"
            "    and cross-attention (S x T text rows, T = --text-rows, default 512) through cuda/attention_cudnn.h,\n"
            "    and FP8 self-attention through cuda/attention_fp8.h (E4M3 Q, K, V, O; E5M2 dO, dQ, dK, dV; aldit's\n"
            "    packed row layout, else head-major when cuDNN refuses that); a refused configuration is printed. At the\n"
            "    first S, FP8 against bf16 on the same inputs (relative RMS error of O, dQ, dK, dV).\n"
            "  --spec/--samples/--draw-seed: the epoch the projection prices (the shapes aldit-store synth draws with\n"
            "    the same arguments), written to the JSON. --repeats: timed groups per case (median; default 5).\n"
            "--sections none: no GPU work, only the JSON's epoch. Any other section needs a GPU (exit 77 without one).\n");
}

static void usage_error(const char *message, const char *value)
{
    fprintf(stderr, "fp8_bench: %s%s%s (fp8_bench --help)\n", message, value ? ": " : "", value ? value : "");
    exit(ALDIT_EXIT_USAGE);
}

static long parse_long(const char *text, const char *option, long low, long high)
{
    char *end = NULL;
    const long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < low || value > high) {
        fprintf(stderr, "fp8_bench: %s %s: expected an integer from %ld to %ld (fp8_bench --help)\n", option, text,
                low, high);
        exit(ALDIT_EXIT_USAGE);
    }
    return value;
}

static int parse_seq(const char *text, int64_t *seq)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", text);
    int n = 0;
    for (char *item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
        if (n == kMaxList) usage_error("--seq: at most 8 lengths", text);
        seq[n++] = parse_long(item, "--seq", 1, 1L << 20);
    }
    if (n == 0) usage_error("--seq: no lengths", text);
    return n;
}

static void parse_list(const char *text, const char *const *names, int n_names, int *flags, const char *option)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", text);
    memset(flags, 0, (size_t)n_names * sizeof *flags);
    for (char *item = strtok(copy, ","); item; item = strtok(NULL, ",")) {
        int found = 0;
        for (int i = 0; i < n_names; ++i)
            if (strcmp(item, names[i]) == 0) flags[i] = found = 1;
        if (!found) usage_error(option, item);
    }
}

static options parse_options(int argc, char **argv)
{
    options o = {1, 1, 4, {4096, 16384, 32768, 75600}, {1, 1}, 5, 512, NULL, NULL, 800, 11};
    static const struct option long_options[] = {
        {"sections", required_argument, 0, 's'}, {"seq", required_argument, 0, 'q'},
        {"wan", required_argument, 0, 'w'},      {"repeats", required_argument, 0, 'r'},
        {"text-rows", required_argument, 0, 't'}, {"spec", required_argument, 0, 'p'},
        {"samples", required_argument, 0, 'n'},  {"draw-seed", required_argument, 0, 'd'},
        {"json", required_argument, 0, 'j'},     {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    static const char *const sections[] = {"gemm", "attention", "none"}, *const models[] = {"1.3b", "14b"};
    int c, flags[3];
    while ((c = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        switch (c) {
        case 's': parse_list(optarg, sections, 3, flags, "--sections: unknown section"); o.run_gemm = flags[0];
                  o.run_attention = flags[1]; break;
        case 'q': o.n_seq = parse_seq(optarg, o.seq); break;
        case 'w': parse_list(optarg, models, 2, o.use_model, "--wan: unknown model (1.3b, 14b)"); break;
        case 'r': o.repeats = (int)parse_long(optarg, "--repeats", 1, 1000); break;
        case 't': o.text_rows = (int)parse_long(optarg, "--text-rows", 1, 1 << 16); break;
        case 'p': o.spec = optarg; break;
        case 'n': o.epoch_samples = parse_long(optarg, "--samples", 1, 1L << 30); break;
        case 'd': o.draw_seed = (uint64_t)parse_long(optarg, "--draw-seed", 0, 1L << 62); break;
        case 'j': o.json_path = optarg; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(ALDIT_EXIT_USAGE);
        }
    }
    if (optind < argc) usage_error("unexpected argument", argv[optind]);
    return o;
}

/* ---- device buffers --------------------------------------------------------------------------------------- */

/* n bytes of device memory holding a host pattern of pattern_bytes repeated (doubling device copies). */
static void *device_pattern(size_t n, const void *pattern, size_t pattern_bytes)
{
    void *buffer = NULL;
    CUDA_CHECK(cudaMalloc(&buffer, n));
    const size_t first = n < pattern_bytes ? n : pattern_bytes;
    CUDA_CHECK(cudaMemcpy(buffer, pattern, first, cudaMemcpyHostToDevice));
    for (size_t done = first; done < n;) {
        const size_t step = done < n - done ? done : n - done;
        CUDA_CHECK(cudaMemcpy((char *)buffer + done, buffer, step, cudaMemcpyDeviceToDevice));
        done += step;
    }
    return buffer;
}

enum { kPatternBytes = 1 << 20 };

/* Random bf16 in [-1, 1], E4M3 and E5M2 values of magnitude 2^-3 ... 2^1 (no NaN or infinity), fp32 zeros. */
static void *random_bf16(size_t n, uint64_t seed)
{
    static gpu_bf16 pattern[kPatternBytes / 2];
    uint64_t state = rng_hash(seed, 1);
    for (size_t i = 0; i < sizeof pattern / sizeof *pattern; ++i)
        pattern[i] = gpu_bf16_from_float((float)(2.0 * rng_uniform(&state) - 1.0));
    return device_pattern(n * sizeof(gpu_bf16), pattern, sizeof pattern);
}
/* The FP8 pattern of (e5m2, seed): bytes of random sign, exponent 2^-3 ... 2^1 and mantissa. */
static void fp8_pattern(uint8_t *pattern, int e5m2, uint64_t seed)
{
    uint64_t state = rng_hash(seed, 2);
    for (size_t i = 0; i < kPatternBytes; ++i) {
        const uint64_t r = rng_next_u64(&state);
        const unsigned sign = (unsigned)(r & 1) << 7, exponent = (unsigned)((r >> 1) % 5), mantissa = (unsigned)(r >> 8);
        pattern[i] = (uint8_t)(e5m2 ? sign | (exponent + 12) << 2 | (mantissa & 3)
                                    : sign | (exponent + 4) << 3 | (mantissa & 7));
    }
}

/* The value of an E4M3 (bias 7, 3 mantissa bits) or E5M2 (bias 15, 2 bits) byte; NaN and infinity not decoded. */
static float fp8_value(uint8_t byte, int e5m2)
{
    const int mantissa_bits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    const int exponent = (byte & 0x7f) >> mantissa_bits, mantissa = byte & ((1 << mantissa_bits) - 1);
    const float fraction = (float)mantissa / (float)(1 << mantissa_bits);
    const float magnitude = exponent == 0 ? ldexpf(fraction, 1 - bias) : ldexpf(1.0f + fraction, exponent - bias);
    return byte & 0x80 ? -magnitude : magnitude;
}

static void *random_fp8(size_t n, int e5m2, uint64_t seed)
{
    static uint8_t pattern[kPatternBytes];
    fp8_pattern(pattern, e5m2, seed);
    return device_pattern(n, pattern, sizeof pattern);
}

/* n bf16 holding exactly the values random_fp8(n, e5m2, seed) holds (every E4M3 and E5M2 value is a bf16). */
static void *decoded_bf16(size_t n, int e5m2, uint64_t seed)
{
    static uint8_t pattern[kPatternBytes];
    static gpu_bf16 values[kPatternBytes];
    fp8_pattern(pattern, e5m2, seed);
    for (size_t i = 0; i < kPatternBytes; ++i) values[i] = gpu_bf16_from_float(fp8_value(pattern[i], e5m2));
    return device_pattern(n * sizeof(gpu_bf16), values, sizeof values);
}

static void *zeros(size_t n_bytes)
{
    void *buffer = NULL;
    CUDA_CHECK(cudaMalloc(&buffer, n_bytes));
    CUDA_CHECK(cudaMemset(buffer, 0, n_bytes));
    return buffer;
}

/* ---- timing ------------------------------------------------------------------------------------------------- */

typedef int (*bench_op)(void *context, cudaStream_t stream); /* 1: queued; 0: refused */

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Milliseconds of `launches` launches between two events; -1 when one of them was refused. */
static double time_launches(bench_op op, void *context, int launches, cudaStream_t stream)
{
    cudaEvent_t start, stop;
    int queued = 1;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < launches; ++i) queued &= op(context, stream);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return queued ? ms : -1.0;
}

/* Median milliseconds per launch over `repeats` groups, after a first launch (plans, refusal) and a probe that
   sizes the groups to about kGroupMs; -1 when any launch is refused (a refused launch queues nothing, so its
   group's time would not be the operation's). */
static double time_op(bench_op op, void *context, int repeats, cudaStream_t stream)
{
    if (!op(context, stream)) return -1.0;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double probe = time_launches(op, context, 1, stream);
    if (probe < 0.0) return -1.0;
    int launches = probe > 0.0 ? (int)(kGroupMs / probe) : 100;
    launches = launches < 1 ? 1 : launches > 100 ? 100 : launches;
    double *ms = xmalloc((size_t)repeats * sizeof *ms);
    int refused = 0;
    for (int r = 0; r < repeats; ++r) {
        const double group = time_launches(op, context, launches, stream);
        refused |= group < 0.0;
        ms[r] = group / launches;
    }
    qsort(ms, (size_t)repeats, sizeof *ms, compare_doubles);
    const double median = ms[repeats / 2];
    free(ms);
    return refused ? -1.0 : median;
}

static double tflops(double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e9) : 0.0; }

/* ---- the JSON ------------------------------------------------------------------------------------------------ */

/* JSON lines: a header, one object per case, the epoch; each line flushed as it is written, so that a run cut
   short leaves the cases it measured. */
static FILE *g_json;

static void json_item_start(void)
{
    if (g_json) fputc('{', g_json);
}
static void json_item_end(void)
{
    if (!g_json) return;
    fputs("}\n", g_json);
    fflush(g_json);
}

/* ---- GEMMs ------------------------------------------------------------------------------------------------- */

/* One cuBLASLt GEMM, column-major: D (m x n) = alpha op(A) op(B) + beta C, C = D. */
typedef struct {
    cublasLtHandle_t handle;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
    cublasLtMatmulHeuristicResult_t algo;
    const void *a, *b;
    void *d, *workspace;
    float alpha, beta;
    char refusal[160];
} gemm_case;

typedef struct {
    cudaDataType_t a_type, b_type, d_type;
    cublasOperation_t trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldd;
    int fast_accumulation, scaled; /* scaled: FP8, A and B scale pointers */
    float beta;
} gemm_shape;

/* Builds the case (its plan: descriptors and cuBLASLt's first heuristic algorithm); refusal says why not. */
static int gemm_case_init(gemm_case *g, cublasLtHandle_t handle, const gemm_shape *s, const void *a, const void *b,
                          void *d, const float *unit_scale, void *workspace)
{
    memset(g, 0, sizeof *g);
    g->handle = handle;
    g->a = a;
    g->b = b;
    g->d = d;
    g->workspace = workspace;
    g->alpha = 1.0f;
    g->beta = s->beta;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &s->trans_a, sizeof s->trans_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &s->trans_b, sizeof s->trans_b));
    if (s->scaled) {
        const int8_t fast = (int8_t)s->fast_accumulation;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &unit_scale,
                                                    sizeof unit_scale));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &unit_scale,
                                                    sizeof unit_scale));
    }
    const int a_transposed = s->trans_a == CUBLAS_OP_T, b_transposed = s->trans_b == CUBLAS_OP_T;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->a_layout, s->a_type, a_transposed ? s->k : s->m,
                                            a_transposed ? s->m : s->k, s->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->b_layout, s->b_type, b_transposed ? s->n : s->k,
                                            b_transposed ? s->k : s->n, s->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g->d_layout, s->d_type, s->m, s->n, s->ldd));
    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &kWorkspaceBytes, sizeof kWorkspaceBytes));
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, g->desc, g->a_layout, g->b_layout, g->d_layout,
                                                                 g->d_layout, preference, 1, &g->algo, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
        snprintf(g->refusal, sizeof g->refusal, "cuBLASLt: no algorithm (%s)",
                 status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(status) : "none found");
    return g->refusal[0] == '\0';
}

static void gemm_case_free(gemm_case *g)
{
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->a_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->b_layout));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(g->d_layout));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(g->desc));
}

static int run_gemm_case(void *context, cudaStream_t stream)
{
    gemm_case *g = context;
    if (g->refusal[0]) return 0;
    CUBLAS_CHECK(cublasLtMatmul(g->handle, g->desc, &g->alpha, g->a, g->a_layout, g->b, g->b_layout, &g->beta, g->d,
                                g->d_layout, g->d, g->d_layout, &g->algo.algo, g->workspace, kWorkspaceBytes, stream));
    return 1;
}

/* The buffers of one (model, M): activations big enough for M x ffn, bf16 and FP8; weights of ffn x dim. */
typedef struct {
    void *x, *y, *dy, *x8, *x8_t, *dy8, *dy8_t, *w, *w8, *w8_t, *dw;
    float *unit_scale;
    void *workspace;
    cublasLtHandle_t handle;
} gemm_buffers;

typedef struct {
    const char *name;
    int64_t k, n; /* in, out features */
    int count;    /* uses per block */
} linear_kind;

/* The shape of pass `pass` (0 fwd, 1 dgrad, 2 wgrad) in bf16 (fp8 0) or FP8 for M rows of a K -> N linear. */
static gemm_shape shape_of(int pass, int fp8, int fast, int64_t M, int64_t K, int64_t N)
{
    const cudaDataType_t bf16 = CUDA_R_16BF, e4m3 = CUDA_R_8F_E4M3, e5m2 = CUDA_R_8F_E5M2;
    const cublasOperation_t T = CUBLAS_OP_T, Nn = CUBLAS_OP_N;
    gemm_shape s;
    if (pass == 0) { /* y_cm [N, M] = W^T-op · x: TN in both precisions */
        s = (gemm_shape){fp8 ? e4m3 : bf16, fp8 ? e4m3 : bf16, bf16, T, Nn, N, M, K, K, K, N, fast, fp8, 0.0f};
    } else if (pass == 1) { /* dx_cm [K, M]: bf16 A = W (K x N, lda K), N; FP8 A = W^T stored [K, N] row-major, T */
        s = fp8 ? (gemm_shape){e4m3, e5m2, bf16, T, Nn, K, M, N, N, N, K, fast, 1, 0.0f}
                : (gemm_shape){bf16, bf16, bf16, Nn, Nn, K, M, N, K, N, K, 0, 0, 0.0f};
    } else { /* dW_cm [K, N] += x · dy^T: bf16 NT; FP8 A = x^T [K, M] row-major, T; B = dy^T [N, M] row-major, N */
        s = fp8 ? (gemm_shape){e4m3, e5m2, CUDA_R_32F, T, Nn, K, N, M, M, M, K, fast, 1, 1.0f}
                : (gemm_shape){bf16, bf16, CUDA_R_32F, Nn, T, K, N, M, K, N, K, 0, 0, 1.0f};
    }
    return s;
}

/* The operands of the pass: (a, b, d). */
static void operands_of(const gemm_buffers *b, int pass, int fp8, const void **a_out, const void **b_out, void **d_out)
{
    if (pass == 0) {
        *a_out = fp8 ? b->w8 : b->w;
        *b_out = fp8 ? b->x8 : b->x;
        *d_out = b->y;
    } else if (pass == 1) {
        *a_out = fp8 ? b->w8_t : b->w;
        *b_out = fp8 ? b->dy8 : b->dy;
        *d_out = b->y; /* dx [M, K]: the y buffer, free in this pass */
    } else {
        *a_out = fp8 ? b->x8_t : b->x;
        *b_out = fp8 ? b->dy8_t : b->dy;
        *d_out = b->dw;
    }
}

static const char *const kPassNames[] = {"fwd", "dgrad", "wgrad"};
static const char *const kVariantNames[] = {"bf16", "fp8", "fp8_fast"};

/* Times one (pass, variant) of a linear and prints / records it. */
static void time_gemm(const options *o, gemm_buffers *b, const char *model, int64_t M, const linear_kind *lin, int pass,
                      int variant, cudaStream_t stream)
{
    const int fp8 = variant > 0, fast = variant == 2;
    const gemm_shape s = shape_of(pass, fp8, fast, M, lin->k, lin->n);
    const void *a, *bb;
    void *d;
    operands_of(b, pass, fp8, &a, &bb, &d);
    gemm_case g;
    gemm_case_init(&g, b->handle, &s, a, bb, d, b->unit_scale, b->workspace);
    const double ms = time_op(run_gemm_case, &g, o->repeats, stream);
    const double flops = 2.0 * (double)M * (double)lin->k * (double)lin->n;
    if (ms < 0.0)
        printf("gemm %-4s M %6lld %-4s %-5s %-8s refused: %s\n", model, (long long)M, lin->name, kPassNames[pass],
               kVariantNames[variant], g.refusal);
    else
        printf("gemm %-4s M %6lld %-4s %-5s %-8s %9.3f ms %7.1f TFLOP/s\n", model, (long long)M, lin->name,
               kPassNames[pass], kVariantNames[variant], ms, tflops(flops, ms));
    json_item_start();
    if (g_json)
        fprintf(g_json, "\"section\": \"gemm\", \"model\": \"%s\", \"M\": %lld, \"linear\": \"%s\", \"K\": %lld, \"N\": %lld, "
                "\"count\": %d, \"pass\": \"%s\", \"variant\": \"%s\", \"ms\": %.6f, \"tflops\": %.3f%s%s%s",
                model, (long long)M, lin->name, (long long)lin->k, (long long)lin->n, lin->count, kPassNames[pass],
                kVariantNames[variant], ms, tflops(flops, ms), ms < 0.0 ? ", \"refused\": \"" : "",
                ms < 0.0 ? g.refusal : "", ms < 0.0 ? "\"" : "");
    json_item_end();
    gemm_case_free(&g);
}

static void gemm_buffers_create(gemm_buffers *b, int64_t M, const wan_model *w)
{
    const size_t acts = (size_t)M * (size_t)w->ffn_dim, weights = (size_t)w->ffn_dim * (size_t)w->dim;
    const float one = 1.0f;
    b->x = random_bf16(acts, 1);
    b->y = zeros(acts * sizeof(gpu_bf16));
    b->dy = random_bf16(acts, 2);
    b->x8 = random_fp8(acts, 0, 3);
    b->x8_t = random_fp8(acts, 0, 4);
    b->dy8 = random_fp8(acts, 1, 5);
    b->dy8_t = random_fp8(acts, 1, 6);
    b->w = random_bf16(weights, 7);
    b->w8 = random_fp8(weights, 0, 8);
    b->w8_t = random_fp8(weights, 0, 9);
    b->dw = zeros(weights * sizeof(float));
    b->unit_scale = zeros(16);
    CUDA_CHECK(cudaMemcpy(b->unit_scale, &one, sizeof one, cudaMemcpyHostToDevice));
    b->workspace = zeros(kWorkspaceBytes);
}

static void gemm_buffers_free(gemm_buffers *b)
{
    void *all[] = {b->x, b->y, b->dy, b->x8, b->x8_t, b->dy8, b->dy8_t, b->w, b->w8, b->w8_t, b->dw, b->unit_scale,
                   b->workspace};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) CUDA_CHECK(cudaFree(all[i]));
}

static void run_gemm_section(const options *o, cudaStream_t stream)
{
    cublasLtHandle_t handle;
    CUBLAS_CHECK(cublasLtCreate(&handle));
    for (int m = 0; m < 2; ++m) {
        if (!o->use_model[m]) continue;
        const wan_model *w = &kModels[m];
        const linear_kind lins[] = {{"attn", w->dim, w->dim, 6}, {"up", w->dim, w->ffn_dim, 1},
                                    {"down", w->ffn_dim, w->dim, 1}};
        for (int si = 0; si < o->n_seq; ++si) {
            gemm_buffers b;
            gemm_buffers_create(&b, o->seq[si], w);
            b.handle = handle;
            for (int l = 0; l < 3; ++l)
                for (int pass = 0; pass < 3; ++pass)
                    for (int variant = 0; variant < 3; ++variant)
                        if (!(pass == 2 && variant == 2)) /* wgrad: fast accumulation off */
                            time_gemm(o, &b, w->name, o->seq[si], &lins[l], pass, variant, stream);
            gemm_buffers_free(&b);
        }
    }
    CUBLAS_CHECK(cublasLtDestroy(handle));
}

/* ---- attention -------------------------------------------------------------------------------------------- */

#ifdef HAVE_CUDNN
typedef struct {
    attention_cudnn *bf16;
    attention_fp8 *fp8;
    attention_fp8_layout layout;
    int64_t S, kv_rows;
    int heads;
    void *q, *k, *v, *o, *d_o, *dq, *dk, *dv; /* bf16 (self: kv_rows = S) */
    void *q8, *k8, *v8, *o8, *do8, *dq8, *dk8, *dv8;
    float *stats, *scales;
} attention_case;

static int run_bf16_fwd(void *context, cudaStream_t stream)
{
    attention_case *c = context;
    attention_cudnn_cross_fwd(c->bf16, c->q, c->k, c->v, c->S, c->kv_rows, c->heads, kHeadDim, c->o, c->stats, stream);
    return 1;
}
static int run_bf16_bwd(void *context, cudaStream_t stream)
{
    attention_case *c = context;
    attention_cudnn_cross_bwd(c->bf16, c->q, c->k, c->v, c->o, c->d_o, c->stats, c->S, c->kv_rows, c->heads, kHeadDim,
                              c->dq, c->dk, c->dv, stream);
    return 1;
}
static int run_fp8_fwd(void *context, cudaStream_t stream)
{
    attention_case *c = context;
    return attention_fp8_fwd(c->fp8, c->layout, c->q8, c->k8, c->v8, c->S, c->heads, kHeadDim, c->o8, c->stats,
                             c->scales, stream);
}
static int run_fp8_bwd(void *context, cudaStream_t stream)
{
    attention_case *c = context;
    return attention_fp8_bwd(c->fp8, c->layout, c->q8, c->k8, c->v8, c->o8, c->do8, c->stats, c->S, c->heads, kHeadDim,
                             c->dq8, c->dk8, c->dv8, c->scales, stream);
}

static void record_attention(const attention_case *c, const char *kind, const char *precision, const char *layout,
                             double fwd_ms, double bwd_ms, const char *refusal)
{
    const double flops = 4.0 * (double)c->S * (double)c->kv_rows * c->heads * kHeadDim;
    printf("attention %2d heads S %6lld x %6lld %-5s %-4s fwd ", c->heads, (long long)c->S, (long long)c->kv_rows, kind,
           precision);
    if (fwd_ms < 0.0) printf("refused");
    else printf("%9.3f ms %6.1f TFLOP/s", fwd_ms, tflops(flops, fwd_ms));
    printf("  bwd ");
    if (bwd_ms < 0.0) printf("refused");
    else printf("%9.3f ms %6.1f TFLOP/s", bwd_ms, tflops(2.5 * flops, bwd_ms));
    printf("%s%s%s\n", layout[0] ? " (" : "", layout, layout[0] ? " layout)" : "");
    if (refusal && refusal[0]) printf("  cuDNN refused: %s\n", refusal);
    json_item_start();
    if (!g_json) return;
    fprintf(g_json, "\"section\": \"attention\", \"heads\": %d, \"head_dim\": %d, \"S\": %lld, \"kv_rows\": %lld, "
            "\"kind\": \"%s\", \"precision\": \"%s\", \"layout\": \"%s\", \"fwd_ms\": %.6f, \"bwd_ms\": %.6f",
            c->heads, kHeadDim, (long long)c->S, (long long)c->kv_rows, kind, precision, layout, fwd_ms, bwd_ms);
    if (refusal && refusal[0]) {
        fprintf(g_json, ", \"refused\": \"");
        for (const char *p = refusal; *p; ++p) fputc(*p == '"' || *p == '\\' || (unsigned char)*p < 32 ? '\'' : *p, g_json);
        fputc('"', g_json);
    }
    json_item_end();
}

/* Scales that keep P, O and dS inside FP8's range at the check's S (P <= 1 to E4M3's 448; O ~ 0.03; dS ~ 1e-3);
   the other slots are 1. */
static const struct { int slot, descale; float scale; } kCheckScales[] = {
    {ATTENTION_FP8_SCALE_S, ATTENTION_FP8_DESCALE_S, 448.0f},
    {ATTENTION_FP8_SCALE_O, ATTENTION_FP8_DESCALE_O, 16.0f},
    {ATTENTION_FP8_SCALE_DP, ATTENTION_FP8_DESCALE_DP, 1024.0f}};

static void attention_buffers(attention_case *c, int64_t S, int64_t kv_max, int heads)
{
    const size_t q_rows = (size_t)S * heads * kHeadDim, kv = (size_t)kv_max * heads * kHeadDim;
    /* the bf16 inputs hold the FP8 inputs' values, so that check_fp8_attention compares the same attention */
    c->q = decoded_bf16(q_rows, 0, 15); c->k = decoded_bf16(kv, 0, 16); c->v = decoded_bf16(kv, 0, 17);
    c->o = zeros(q_rows * 2); c->d_o = decoded_bf16(q_rows, 1, 19);
    c->dq = zeros(q_rows * 2); c->dk = zeros(kv * 2); c->dv = zeros(kv * 2);
    c->q8 = random_fp8(q_rows, 0, 15); c->k8 = random_fp8(q_rows, 0, 16); c->v8 = random_fp8(q_rows, 0, 17);
    c->o8 = random_fp8(q_rows, 0, 18); c->do8 = random_fp8(q_rows, 1, 19);
    c->dq8 = zeros(q_rows); c->dk8 = zeros(q_rows); c->dv8 = zeros(q_rows);
    c->stats = zeros((size_t)heads * S * sizeof(float));
    float scales[ATTENTION_FP8_SCALE_FLOATS];
    for (int i = 0; i < ATTENTION_FP8_SCALE_FLOATS; ++i) scales[i] = 1.0f;
    for (int i = 0; i < (int)(sizeof kCheckScales / sizeof *kCheckScales); ++i) {
        scales[4 * kCheckScales[i].slot] = kCheckScales[i].scale;
        scales[4 * kCheckScales[i].descale] = 1.0f / kCheckScales[i].scale;
    }
    c->scales = zeros(sizeof scales);
    CUDA_CHECK(cudaMemcpy(c->scales, scales, sizeof scales, cudaMemcpyHostToDevice));
}

static void attention_buffers_free(attention_case *c)
{
    void *all[] = {c->q, c->k, c->v, c->o, c->d_o, c->dq, c->dk, c->dv, c->q8, c->k8, c->v8, c->o8, c->do8, c->dq8,
                   c->dk8, c->dv8, c->stats, c->scales};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) CUDA_CHECK(cudaFree(all[i]));
}

/* ||fp8 / scale - bf16|| / ||bf16|| over n values (device buffers). */
static double relative_rms(const void *bf16, const void *fp8, int e5m2, float scale, size_t n)
{
    gpu_bf16 *want = xmalloc(n * sizeof *want);
    uint8_t *got = xmalloc(n);
    CUDA_CHECK(cudaMemcpy(want, bf16, n * sizeof *want, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got, fp8, n, cudaMemcpyDeviceToHost));
    double error = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double w = gpu_float_from_bf16(want[i]), d = fp8_value(got[i], e5m2) / scale - w;
        error += d * d;
        norm += w * w;
    }
    free(want);
    free(got);
    return norm > 0.0 ? sqrt(error / norm) : INFINITY;
}

/* Whether the FP8 graphs compute the attention the bf16 one does: both directions on the same inputs (the bf16
   buffers hold the FP8 values), packed-row layout; prints and records the relative RMS errors of O, dQ, dK, dV.
   E4M3 keeps 3 mantissa bits, E5M2 2 (relative rounding up to 1/16 and 1/8), so a few percent is expected; an
   error near 1 or above means the graph is not the same attention, and its timing is not a measurement of it. */
static void check_fp8_attention(attention_case *c, cudaStream_t stream)
{
    c->kv_rows = c->S;
    c->layout = ATTENTION_FP8_ROWS;
    run_bf16_fwd(c, stream);
    run_bf16_bwd(c, stream);
    if (!run_fp8_fwd(c, stream) || !run_fp8_bwd(c, stream)) return;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const size_t n = (size_t)c->S * c->heads * kHeadDim;
    const double o = relative_rms(c->o, c->o8, 0, 16.0f, n), dq = relative_rms(c->dq, c->dq8, 1, 1.0f, n),
                 dk = relative_rms(c->dk, c->dk8, 1, 1.0f, n), dv = relative_rms(c->dv, c->dv8, 1, 1.0f, n);
    const int same = o < 0.5 && dq < 0.5 && dk < 0.5 && dv < 0.5;
    printf("  FP8 against bf16 on the same inputs, S %lld, %d heads (relative RMS error): O %.4f dQ %.4f dK %.4f "
           "dV %.4f%s\n", (long long)c->S, c->heads, o, dq, dk, dv,
           same ? "" : "  WARNING: not the same attention (error >= 0.5): its timing does not measure it");
    json_item_start();
    if (g_json)
        fprintf(g_json, "\"section\": \"attention_check\", \"heads\": %d, \"S\": %lld, \"o\": %.6f, \"dq\": %.6f, "
                "\"dk\": %.6f, \"dv\": %.6f, \"same\": %d", c->heads, (long long)c->S, o, dq, dk, dv, same);
    json_item_end();
}

/* FP8 self-attention of the case: the packed-row layout, else head-major; the forward's stats feed the backward. The
   first layout whose forward and backward both run is recorded, else the first whose forward runs. */
static void time_fp8_attention(attention_case *c, const options *o, cudaStream_t stream)
{
    static const char *const layouts[] = {"rows", "head-major"};
    char refusal[2048] = "";
    double kept_fwd = -1.0;
    int kept_layout = -1;
    for (int layout = 0; layout < 2; ++layout) {
        c->layout = (attention_fp8_layout)layout;
        const double fwd = time_op(run_fp8_fwd, c, o->repeats, stream);
        const double bwd = fwd < 0.0 ? -1.0 : time_op(run_fp8_bwd, c, o->repeats, stream);
        if (fwd < 0.0 || bwd < 0.0)
            snprintf(refusal + strlen(refusal), sizeof refusal - strlen(refusal), "%s%s, %s layout: %s",
                     refusal[0] ? " | " : "", fwd < 0.0 ? "forward" : "backward", layouts[layout],
                     attention_fp8_error(c->fp8));
        if (bwd >= 0.0) {
            record_attention(c, "self", "fp8", layouts[layout], fwd, bwd, refusal);
            return;
        }
        if (fwd >= 0.0 && kept_layout < 0) {
            kept_fwd = fwd;
            kept_layout = layout;
        }
    }
    record_attention(c, "self", "fp8", kept_layout < 0 ? "" : layouts[kept_layout], kept_fwd, -1.0, refusal);
}

/* bf16 attention of the case against kv_rows keys (self: S, cross: the text rows), forward then backward. */
static void time_bf16_attention(attention_case *c, const options *o, const char *kind, int64_t kv_rows,
                                cudaStream_t stream)
{
    c->kv_rows = kv_rows;
    const double fwd = time_op(run_bf16_fwd, c, o->repeats, stream);
    const double bwd = time_op(run_bf16_bwd, c, o->repeats, stream);
    record_attention(c, kind, "bf16", "", fwd, bwd, NULL);
}

/* Per model: bf16 at every S, then FP8 at every S (so that a failure in the FP8 graphs leaves every bf16 figure). */
static void run_attention_section(const options *o, cudaStream_t stream)
{
    for (int m = 0; m < 2; ++m) {
        if (!o->use_model[m]) continue;
        attention_case c;
        memset(&c, 0, sizeof c);
        c.bf16 = attention_cudnn_create(0, 0);
        c.fp8 = attention_fp8_create();
        c.heads = kModels[m].heads;
        for (int fp8 = 0; fp8 < 2; ++fp8)
            for (int si = 0; si < o->n_seq; ++si) {
                c.S = (o->seq[si] + kTile - 1) / kTile * kTile; /* whole tiles, as aldit runs its long samples */
                attention_buffers(&c, c.S, c.S > o->text_rows ? c.S : o->text_rows, c.heads);
                if (!fp8) {
                    time_bf16_attention(&c, o, "self", c.S, stream);
                    time_bf16_attention(&c, o, "cross", o->text_rows, stream);
                } else {
                    c.kv_rows = c.S;
                    time_fp8_attention(&c, o, stream);
                    if (si == 0) check_fp8_attention(&c, stream); /* the shortest S: cheap, P well inside E4M3 */
                }
                CUDA_CHECK(cudaStreamSynchronize(stream));
                attention_buffers_free(&c);
            }
        attention_fp8_free(c.fp8);
        attention_cudnn_free(c.bf16);
    }
}
#else
static void run_attention_section(const options *o, cudaStream_t stream)
{
    (void)o;
    (void)stream;
    printf("attention: not built (configure found no cuDNN)\n");
}
#endif

/* ---- the epoch --------------------------------------------------------------------------------------------- */

/* The shapes aldit-store synth --spec --samples --draw-seed draws, as "epoch": [[frames, height, width], ...]. */
static void write_epoch(const options *o)
{
    length_bucket *buckets = NULL;
    int n_buckets = 0;
    if (lengths_load(o->spec, &buckets, &n_buckets, stderr)) {
        fprintf(stderr, "fp8_bench: --spec %s: not a length spec (errors above)\n", o->spec);
        exit(ALDIT_EXIT_USAGE);
    }
    const size_t n = (size_t)o->epoch_samples;
    int32_t *f = xmalloc(n * sizeof *f), *h = xmalloc(n * sizeof *h), *w = xmalloc(n * sizeof *w);
    lengths_draw(buckets, n_buckets, o->epoch_samples, o->draw_seed, f, h, w);
    fprintf(g_json, "{\"epoch\": {\"spec\": \"%s\", \"samples\": %lld, \"draw_seed\": %llu, \"shapes\": [", o->spec,
            (long long)o->epoch_samples, (unsigned long long)o->draw_seed);
    for (size_t i = 0; i < n; ++i) fprintf(g_json, "%s[%d, %d, %d]", i ? ", " : "", f[i], h[i], w[i]);
    fprintf(g_json, "]}}\n");
    fflush(g_json);
    free(f);
    free(h);
    free(w);
    free(buckets);
}

int main(int argc, char **argv)
{
    const options o = parse_options(argc, argv);
    const int on_gpu = o.run_gemm || o.run_attention;
    if (on_gpu && gpu_count() == 0) {
        fprintf(stderr, "fp8_bench: no GPU visible: this measurement runs on a GPU (skipped)\n");
        return kExitSkip;
    }
    if (o.json_path) {
        g_json = fopen(o.json_path, "w");
        ALDIT_CHECK(g_json != NULL, "fp8_bench: cannot write --json %s", o.json_path);
    }
    char device[256] = "no GPU used";
    if (on_gpu) {
        gpu_select(0);
        gpu_describe(device, sizeof device);
    }
    printf("fp8_bench on %s; head_dim %d, %d repeats\n", device, kHeadDim, o.repeats);
    if (g_json) {
        fprintf(g_json, "{\"device\": \"%s\", \"text_rows\": %d}\n", device, o.text_rows);
        if (o.spec) write_epoch(&o); /* first: the projection needs it, whatever happens later */
    }
    if (on_gpu) {
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreate(&stream));
        if (o.run_gemm) run_gemm_section(&o, stream);
        if (o.run_attention) run_attention_section(&o, stream);
        CUDA_CHECK(cudaStreamDestroy(stream));
    }
    if (g_json) {
        ALDIT_CHECK(fclose(g_json) == 0, "fp8_bench: writing --json %s failed", o.json_path);
    }
    return 0;
}
