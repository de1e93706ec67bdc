/* aldit_bench.c — aldit-bench: GPU microbenchmarks (device copy bandwidth; LayerNorm-Modulate forward and backward,
   plain and gated-residual, in GB/s against their byte floors and as % of the copy bandwidth of the same run;
   the cuBLASLt linear layers of a Wan 2.1 block (1.3B or 14B dims), forward and both backward GEMMs, in TFLOP/s;
   self- and cross-attention forward and backward in TFLOP/s; one whole block forward+backward against the floor
   of its GEMMs and attentions measured in the same run; one member's block forward+backward of a sample split over a
   sequence-parallel group of k, with the bytes its exchange moves; HunyuanVideo-1.5's MMDiT block forward+backward on
   packed micro-batches of video and caption rows against the floor of its GEMMs and joint attention, and what its
   step spends outside the blocks). */
#include "config.h"

#include <cuda_profiler_api.h>

#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attention.h"
#ifdef HAVE_CUDNN
#include "cuda/attention_cudnn.h"
#endif
#include "core/check.h"
#include "deck/deck.h"
#include "cuda/gemm.h"
#include "cuda/gpu.h"
#include "cuda/lnmod.h"
#include "model/model.h"
#include "cuda/model_gpu.h"
#include "cuda/seqpar_gpu.h"
#include "core/rng.h"

enum { kMaxDims = 8, kMaxSeq = 8, kMaxSplit = 4, kMaxCases = 8 };

/* The block dims of the gemm, attention and block sections (--wan): Wan 2.1's 1.3B and 14B, and HunyuanVideo-1.5's
   widths (hv15: its block's q/k/v/out and MLP GEMMs and its joint attention's heads; the sections time a Wan block of
   those widths, whose linears are of the same shapes); heads of 128. */
typedef struct {
    const char *name;
    int dim, ffn_dim, heads, head_dim;
} wan_dims;
static const wan_dims kWanModels[] = {{"1.3b", 1536, 8960, 12, 128}, {"14b", 5120, 13824, 40, 128},
                                     {"hv15", 2048, 8192, 16, 128}};

/* One micro-batch of the mmdit section: `samples` samples, each of S video tokens and a joint caption of L Qwen rows,
   text_2 ByT5 rows and image SigLIP rows. */
typedef struct {
    int samples;
    int64_t S;
    int L, text_2, image;
} mmdit_case;

typedef struct {
    int run_lnmod, run_gemm, run_attention, run_block; /* --sections (block also runs gemm and attention) */
    int n_samples;
    int64_t rows_per_sample;
    int n_dims;
    int dims[kMaxDims];
    int repeats;           /* timed groups; the median group is reported */
    int launches_per_group;
    int n_seq;
    int64_t seq[kMaxSeq];  /* S: tokens of the one sample of the gemm, attention and block sections */
    int text_rows;         /* its text tokens */
    int profile_step;      /* block: one more (1 + K)-layer step inside cudaProfilerStart/Stop, for a profiler */
    const char *attention_backends; /* --backends: comma-separated names of the attention backends to time */
    int gemm_autotune;     /* cuBLASLt's candidates timed on each plan's first call (gemm_create) */
    int attention_autotune; /* cuDNN's engine configurations timed once per size class (attention_cudnn_create) */
    int block_layers;      /* block: K, the blocks the deeper model has beyond the 1-layer one */
    const char *json_path;
    const wan_dims *wan;   /* --wan */
    int run_split;         /* --sections split */
    int n_split;
    int split_k[kMaxSplit]; /* --split-k: the group sizes of the split section (default 1,2,4) */
    int run_zeros;         /* --sections zeros */
    int run_mmdit;         /* --sections mmdit */
    int seq_given;         /* --seq was given (mmdit: its cases are then one sample of each S) */
    int text_2_rows, image_rows; /* mmdit's --seq cases: ByT5 and SigLIP image rows per sample */
    int n_cases;
    mmdit_case cases[kMaxCases]; /* --mmdit-cases (or from --seq, or the default list) */
} bench_options;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: aldit-bench [--sections lnmod,gemm,attention,block,split,zeros,mmdit] [--samples B] [--rows S]\n"
            "                   [--dims D1,D2,...]\n"
            "                   [--repeats N] [--seq S1,S2,...] [--text-rows T] [--profile-step 0|1]\n"
            "                   [--backends own,cudnn,cudnn-tiles] [--block-layers K]\n"
            "                   [--gemm-autotune 0|1] [--attention-autotune 0|1] [--wan 1.3b|14b|hv15] [--json FILE]\n"
            "                   [--split-k K1,K2,...] [--mmdit-cases [Bx]S:L[:T2[:I]],...] [--text-2-rows T2]\n"
            "                   [--image-rows I]\n"
            "  Device copy bandwidth, then the sections (default lnmod,gemm):\n"
            "  lnmod: LayerNorm-Modulate (forward, backward, gated-residual variants) on B packed samples of S rows\n"
            "    each (default B=2, S=32760, D=1536,3072,5120). The kernel and row-group shape of each forward are\n"
            "    printed per D.\n"
            "  --wan 1.3b|14b|hv15: the block dims of the gemm, attention and block sections: Wan-1.3B (dim 1536, FFN 8960,\n"
            "    12 heads of 128; the default), Wan-14B (dim 5120, FFN 13824, 40 heads of 128) or HunyuanVideo-1.5's\n"
            "    widths (dim 2048, FFN 8192, 16 heads of 128: a Wan block of its GEMM shapes and attention heads).\n"
            "  gemm: the cuBLASLt linear layers of one block (--wan; default D=1536, FFN 8960) on one sample of S rows\n"
            "    (--seq, default S=4096,16384,32760,75600) and T text rows (default 512): forward, backward data and\n"
            "    backward weight (fp32 dW and db accumulated) in TFLOP/s, the block's GEMM sum, and an 8192^3\n"
            "    reference. --gemm-autotune 1 takes the fastest of cuBLASLt's candidates timed on first use instead\n"
            "    of its first heuristic choice (gemm_create's autotune, [train] autotune), here and in the block.\n"
            "  attention: aldit's flash attention (cuda/attention.h) and, where built with it, cuDNN's fused SDPA\n"
            "    (cuda/attention_cudnn.h), forward and backward, the block's heads (12 or 40 of 128), on one sample: self-attention\n"
            "    S x S and cross-attention S x T, in TFLOP/s; cudnn-tiles is cuDNN's self-attention over whole tiles of\n"
            "    128 rows, zero-padded (what the GPU model runs for a micro-batch's last sample). --backends (default\n"
            "    all three) names the ones timed. --attention-autotune 1 takes the fastest of cuDNN's candidate engine\n"
            "    configurations, timed once per size class, instead of its heuristic first (attention_cudnn_create's\n"
            "    autotune, [train] autotune; the tuned ones are listed), here and in the block.\n"
            "  block: one block forward+backward (GPU model, recompute none; --wan dims) on one sample of S tokens\n"
            "    and T text tokens: ((1 + K)-layer model step - 1-layer model step) / K, the two steps timed in\n"
            "    turn (--block-layers K, default 8), against the floor of its GEMMs and attentions at the rates of\n"
            "    the gemm and attention sections (which it runs too). --profile-step 1 then runs one more\n"
            "    (1 + K)-layer step per S between cudaProfilerStart and cudaProfilerStop, e.g. for\n"
            "    ncu --profile-from-start off --metrics gpu__time_duration.sum (each kernel's time in that step).\n"
            "  split: one member of a sequence-parallel group of k (--split-k, default 1,2,4; k divides the heads) on\n"
            "    one sample of S tokens (--seq): its block forward+backward on S/k rows with every head and the\n"
            "    self-attention over all S rows for h/k heads, timed as the block section does ((1 + K)-layer step -\n"
            "    1-layer step) / K on this one GPU, the exchange replaced by its own part's copy (a loopback group:\n"
            "    the bytes it would send, 8 tensors of S/k x dim bf16 times (k-1)/k per block, are reported, with\n"
            "    their time at 300 GB/s, [balance] sp_bandwidth's default). The cost model's split form,\n"
            "    cost_k(S) = cost(S)/k + exchange, is the column k x member / block at k = 1.\n"
            "  zeros: the (1 + K)-layer model's step (--wan dims, one sample of S tokens, --seq) on zero weights and zero\n"
            "    data against the same step on random weights and data, timed in turn: what timing a model before its\n"
            "    state is set (all zeros) would leave out (the start-up calibration times random values since issue 31).\n"
            "  mmdit: HunyuanVideo-1.5's MMDiT block forward+backward (the hunyuanvideo15 GPU model at\n"
            "    inputs/hunyuanvideo15-8layers.ini's dims: dim 2048, FFN 8192, 16 heads of 128, Qwen 3584 / ByT5 1472 /\n"
            "    SigLIP 1152; recompute none, bf16) on packed micro-batches, timed as the block section's:\n"
            "    ((1 + K)-layer step - 1-layer step) / K; the 1-layer step less one block is what the step spends outside\n"
            "    the blocks (token refiner, embedders, head, loss). Floor: the block's GEMM FLOPs (video and text streams)\n"
            "    at the rates of the MMDiT stream's GEMMs (q, k, v, out, MLP up and down) and its joint attention over\n"
            "    N = S + L rows per sample at the self-attention rate (fastest backend), both measured in the same call by\n"
            "    the gemm and attention sections at hv15 widths on rows spanning the cases (log-interpolated between them).\n"
            "    --mmdit-cases: each case B samples (default 1) of S video tokens, L Qwen rows, T2 ByT5 and I image rows\n"
            "    (default 256:1000,1024:1000,16320:300,61200:300,16x256:600: images with long captions, videos, a packed\n"
            "    micro-batch of short samples); without it, --seq gives one sample of each S with --text-rows L,\n"
            "    --text-2-rows and --image-rows (default 0). --profile-step 1 as in the block section.\n"
            "  Short ops: N=21 timed groups of 10 launches; long ones (attention, block) fewer groups of 1 launch,\n"
            "  about 3-6 s per figure; medians reported. --json also writes the figures to FILE.\n");
}

/* A usage error: the message, then the usage on stderr, exit 2. */
static void usage_error(const char *message, const char *option)
{
    fprintf(stderr, "aldit-bench: %s %s\n", message, option);
    usage(stderr);
    exit(ALDIT_EXIT_USAGE);
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

/* The sections (--sections), each by its flag in bench_options. */
typedef struct {
    const char *name;
    size_t flag;
} section_entry;
static const section_entry kSectionTable[] = {
    {"lnmod", offsetof(bench_options, run_lnmod)},         {"gemm", offsetof(bench_options, run_gemm)},
    {"attention", offsetof(bench_options, run_attention)}, {"block", offsetof(bench_options, run_block)},
    {"split", offsetof(bench_options, run_split)},         {"zeros", offsetof(bench_options, run_zeros)},
    {"mmdit", offsetof(bench_options, run_mmdit)},
};
enum { kSectionCount = sizeof kSectionTable / sizeof kSectionTable[0] };

/* Bounds of an mmdit case: caption rows of each source per sample, samples, video and joint caption rows of a
   micro-batch (the GPU model's packed buffers and joint layout stay far inside its int32 indexing). */
enum { kMaxCaptionRows = 1 << 14, kMaxCaseSamples = 256 };
static const int64_t kMaxCaseVideoRows = (int64_t)1 << 21, kMaxCaseTextRows = (int64_t)1 << 20;

/* A case's label, as --mmdit-cases writes it: [Bx]S:L[:T2[:I]]. */
static void mmdit_case_label(const mmdit_case *c, char *text, size_t size)
{
    int n = c->samples > 1 ? snprintf(text, size, "%dx", c->samples) : 0;
    n += snprintf(text + n, size - (size_t)n, "%lld:%d", (long long)c->S, c->L);
    if (c->text_2 || c->image) n += snprintf(text + n, size - (size_t)n, ":%d", c->text_2);
    if (c->image) snprintf(text + n, size - (size_t)n, ":%d", c->image);
}

/* The micro-batch's bounds (kMaxCaseVideoRows, kMaxCaseTextRows); exit 2 naming the case otherwise. */
static void check_mmdit_case(const mmdit_case *c, const char *option)
{
    char label[96];
    mmdit_case_label(c, label, sizeof label);
    const int64_t video = c->samples * c->S, text = (int64_t)c->samples * (c->L + c->text_2 + c->image);
    if (video > kMaxCaseVideoRows || text > kMaxCaseTextRows) {
        fprintf(stderr, "aldit-bench: %s: case %s has %lld video and %lld caption rows; at most %lld and %lld\n", option,
                label, (long long)video, (long long)text, (long long)kMaxCaseVideoRows, (long long)kMaxCaseTextRows);
        exit(ALDIT_EXIT_USAGE);
    }
}

/* Whether `item` has the form [Bx]S:L[:T2[:I]] with every field a nonempty run of digits. */
static int mmdit_case_form(const char *item)
{
    const char *p = item;
    const size_t lead = strspn(p, "0123456789");
    if (lead > 0 && p[lead] == 'x') p += lead + 1;
    int fields = 0;
    for (;;) {
        const size_t digits = strspn(p, "0123456789");
        if (digits == 0) return 0;
        ++fields;
        p += digits;
        if (*p == '\0') return fields >= 2 && fields <= 4;
        if (*p++ != ':') return 0;
    }
}

/* One --mmdit-cases item, [Bx]S:L[:T2[:I]] (`list`: the whole value, for the messages). */
static mmdit_case parse_mmdit_case(const char *item, const char *list)
{
    if (!mmdit_case_form(item)) {
        fprintf(stderr, "aldit-bench: --mmdit-cases %s: case %s is not [Bx]S:L[:T2[:I]] (B samples of S video tokens, "
                "L Qwen, T2 ByT5 and I image rows: integers)\n", list, item);
        exit(ALDIT_EXIT_USAGE);
    }
    mmdit_case c = {1, 0, 0, 0, 0};
    char *copy = strdup(item), *rest = copy, *save = NULL;
    char *times = strchr(copy, 'x');
    if (times) {
        *times = '\0';
        c.samples = (int)parse_long(copy, "--mmdit-cases (samples B)", 1, kMaxCaseSamples);
        rest = times + 1;
    }
    long values[4] = {0, 0, 0, 0};
    static const char *const names[4] = {"--mmdit-cases (video tokens S)", "--mmdit-cases (Qwen rows L)",
                                         "--mmdit-cases (ByT5 rows T2)", "--mmdit-cases (image rows I)"};
    static const long low[4] = {1, 1, 0, 0}, high[4] = {1L << 20, kMaxCaptionRows, kMaxCaptionRows, kMaxCaptionRows};
    int n = 0;
    for (char *part = strtok_r(rest, ":", &save); part && n < 4; part = strtok_r(NULL, ":", &save), ++n)
        values[n] = parse_long(part, names[n], low[n], high[n]);
    free(copy);
    c.S = values[0], c.L = (int)values[1], c.text_2 = (int)values[2], c.image = (int)values[3];
    check_mmdit_case(&c, "--mmdit-cases");
    return c;
}

/* mmdit's cases without --mmdit-cases: one sample of each --seq S with --text-rows, --text-2-rows and --image-rows
   rows where --seq was given, else the list that mirrors HunyuanVideo-1.5's epoch (images with long captions,
   videos of 480p and 720p, a packed micro-batch of short samples: the epoch's hold about 7 on average). */
static void set_mmdit_cases(bench_options *o)
{
    static const mmdit_case defaults[] = {{1, 256, 1000, 0, 0}, {1, 1024, 1000, 0, 0}, {1, 16320, 300, 0, 0},
                                          {1, 61200, 300, 0, 0}, {16, 256, 600, 0, 0}};
    if (!o->seq_given) {
        o->n_cases = (int)(sizeof defaults / sizeof defaults[0]);
        memcpy(o->cases, defaults, sizeof defaults);
        return;
    }
    if (o->text_rows > kMaxCaptionRows) {
        fprintf(stderr, "aldit-bench: --text-rows %d: the mmdit section takes at most %d Qwen rows\n", o->text_rows,
                kMaxCaptionRows);
        exit(ALDIT_EXIT_USAGE);
    }
    o->n_cases = o->n_seq;
    for (int i = 0; i < o->n_seq; ++i) {
        o->cases[i] = (mmdit_case){1, o->seq[i], o->text_rows, o->text_2_rows, o->image_rows};
        check_mmdit_case(&o->cases[i], "--seq");
    }
}

/* K, the blocks the block section's deeper model adds: its figure grows with K while the deeper step's share at
   the sustained (power-capped) clocks grows, and has settled by K = 8 (docs/PERFORMANCE.md, table 7e). */
enum { kDefaultBlockLayers = 8 };

static bench_options parse_options(int argc, char **argv)
{
    bench_options o = {1, 1, 0, 0, 2, 32760, 3, {1536, 3072, 5120}, 21, 10, 4, {4096, 16384, 32760, 75600}, 512, 0,
                       "own,cudnn,cudnn-tiles", 0, 0, kDefaultBlockLayers, NULL, &kWanModels[0], 0, 0, {0}, 0, 0, 0, 0,
                       0, 0, {{0}}};
    enum {
        kSections = 256, kSamples, kRows, kDims, kRepeats, kSeq, kTextRows, kProfileStep, kBackends, kBlockLayers,
        kGemmAutotune, kAttentionAutotune, kJson, kWan, kSplitK, kMmditCases, kText2Rows, kImageRows
    };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"sections", required_argument, NULL, kSections},
        {"samples", required_argument, NULL, kSamples},
        {"rows", required_argument, NULL, kRows},
        {"dims", required_argument, NULL, kDims},
        {"repeats", required_argument, NULL, kRepeats},
        {"seq", required_argument, NULL, kSeq},
        {"text-rows", required_argument, NULL, kTextRows},
        {"profile-step", required_argument, NULL, kProfileStep},
        {"backends", required_argument, NULL, kBackends},
        {"block-layers", required_argument, NULL, kBlockLayers},
        {"gemm-autotune", required_argument, NULL, kGemmAutotune},
        {"attention-autotune", required_argument, NULL, kAttentionAutotune},
        {"json", required_argument, NULL, kJson},
        {"wan", required_argument, NULL, kWan},
        {"split-k", required_argument, NULL, kSplitK},
        {"mmdit-cases", required_argument, NULL, kMmditCases},
        {"text-2-rows", required_argument, NULL, kText2Rows},
        {"image-rows", required_argument, NULL, kImageRows},
        {NULL, 0, NULL, 0},
    };
    opterr = 0; /* the messages below name the option and exit 2 */
    int code;
    while ((code = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        const char *value = optarg, *arg = argv[optind - 1];
        switch (code) {
        case 'h':
            usage(stdout);
            exit(0);
        case kSamples: o.n_samples = (int)parse_long(value, "--samples", 1, 4096); break;
        case kRows: o.rows_per_sample = parse_long(value, "--rows", 1, 1L << 22); break;
        case kRepeats: o.repeats = (int)parse_long(value, "--repeats", 1, 1000); break;
        case kJson: o.json_path = value; break;
        case kWan: {
            size_t k = 0;
            while (k < sizeof kWanModels / sizeof kWanModels[0] && strcmp(value, kWanModels[k].name)) ++k;
            if (k == sizeof kWanModels / sizeof kWanModels[0]) {
                fprintf(stderr, "aldit-bench: --wan %s: unknown dims (1.3b, 14b, hv15)\n", value);
                exit(ALDIT_EXIT_USAGE);
            }
            o.wan = &kWanModels[k];
            break;
        }
        case kTextRows: o.text_rows = (int)parse_long(value, "--text-rows", 1, 1L << 20); break;
        case kProfileStep: o.profile_step = (int)parse_long(value, "--profile-step", 0, 1); break;
        case kBlockLayers: o.block_layers = (int)parse_long(value, "--block-layers", 1, 29); break;
        case kGemmAutotune: o.gemm_autotune = (int)parse_long(value, "--gemm-autotune", 0, 1); break;
        case kAttentionAutotune: o.attention_autotune = (int)parse_long(value, "--attention-autotune", 0, 1); break;
        case kBackends: {
            static const char *const known[] = {"own", "cudnn", "cudnn-tiles"};
            char *copy = strdup(value), *save = NULL;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                size_t k = 0;
                while (k < sizeof known / sizeof known[0] && strcmp(item, known[k])) ++k;
                if (k == sizeof known / sizeof known[0]) {
                    fprintf(stderr, "aldit-bench: --backends %s: unknown backend %s (own, cudnn, cudnn-tiles)\n",
                            value, item);
                    exit(ALDIT_EXIT_USAGE);
                }
            }
            free(copy);
            o.attention_backends = value;
            break;
        }
        case kSections: {
            char *copy = strdup(value), *save = NULL;
            for (size_t k = 0; k < kSectionCount; ++k) *(int *)((char *)&o + kSectionTable[k].flag) = 0;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                size_t k = 0;
                while (k < kSectionCount && strcmp(item, kSectionTable[k].name)) ++k;
                if (k == kSectionCount) {
                    fprintf(stderr, "aldit-bench: --sections %s: unknown section %s (", value, item);
                    for (size_t j = 0; j < kSectionCount; ++j)
                        fprintf(stderr, "%s%s", j ? ", " : "", kSectionTable[j].name);
                    fprintf(stderr, ")\n");
                    exit(ALDIT_EXIT_USAGE);
                }
                *(int *)((char *)&o + kSectionTable[k].flag) = 1;
            }
            free(copy);
            break;
        }
        case kMmditCases: {
            char *copy = strdup(value), *save = NULL;
            o.n_cases = 0;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (o.n_cases == kMaxCases) {
                    fprintf(stderr, "aldit-bench: --mmdit-cases %s: at most %d cases\n", value, kMaxCases);
                    exit(ALDIT_EXIT_USAGE);
                }
                o.cases[o.n_cases++] = parse_mmdit_case(item, value);
            }
            free(copy);
            break;
        }
        case kText2Rows: o.text_2_rows = (int)parse_long(value, "--text-2-rows", 0, kMaxCaptionRows); break;
        case kImageRows: o.image_rows = (int)parse_long(value, "--image-rows", 0, kMaxCaptionRows); break;
        case kSeq: {
            char *copy = strdup(value), *save = NULL;
            o.n_seq = 0;
            o.seq_given = 1;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (o.n_seq == kMaxSeq) {
                    fprintf(stderr, "aldit-bench: --seq %s: at most %d values\n", value, kMaxSeq);
                    exit(ALDIT_EXIT_USAGE);
                }
                o.seq[o.n_seq++] = parse_long(item, "--seq", 1, 1L << 20);
            }
            free(copy);
            break;
        }
        case kSplitK: {
            char *copy = strdup(value), *save = NULL;
            o.n_split = 0;
            for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                if (o.n_split == kMaxSplit) {
                    fprintf(stderr, "aldit-bench: --split-k %s: at most %d values\n", value, kMaxSplit);
                    exit(ALDIT_EXIT_USAGE);
                }
                const long k = parse_long(item, "--split-k", 1, 64);
                if (k & (k - 1)) {
                    fprintf(stderr, "aldit-bench: --split-k %s: %ld is not a power of two\n", value, k);
                    exit(ALDIT_EXIT_USAGE);
                }
                o.split_k[o.n_split++] = (int)k;
            }
            free(copy);
            break;
        }
        case kDims: {
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
            break;
        }
        case ':': usage_error("missing value for", arg); break;
        default: usage_error("unknown option", arg);
        }
    }
    if (optind < argc) usage_error("unexpected argument", argv[optind]);
    if (o.run_block) o.run_gemm = o.run_attention = 1; /* the block's floor comes from their rates */
    if (o.run_mmdit && o.n_cases == 0) set_mmdit_cases(&o);
    if (o.n_split == 0) {
        const int defaults[] = {1, 2, 4};
        o.n_split = 3;
        memcpy(o.split_k, defaults, sizeof defaults);
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

/* Median over `repeats` groups of milliseconds per launch, after 3 warm-up launches; each group queues `launches`
   launches between two events, so host-side launch work overlaps the device work as it does in a training step. */
static double time_groups(bench_op op, void *context, int repeats, int launches, cudaStream_t stream)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; ++i) op(context, stream);
    float *ms = xmalloc((size_t)repeats * sizeof *ms);
    for (int r = 0; r < repeats; ++r) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < launches; ++i) op(context, stream);
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
        ms[r] /= (float)launches;
    }
    qsort(ms, (size_t)repeats, sizeof *ms, compare_floats);
    const double median = ms[repeats / 2];
    free(ms);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return median;
}

/* Milliseconds of one launch of op, between two events on `stream`. */
static float timed_launch(bench_op op, void *context, cudaEvent_t start, cudaEvent_t stop, cudaStream_t stream)
{
    CUDA_CHECK(cudaEventRecord(start, stream));
    op(context, stream);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
}

/* The short ops' timing: --repeats groups of 10 launches. */
static double time_op(bench_op op, void *context, const bench_options *o, cudaStream_t stream)
{
    return time_groups(op, context, o->repeats, o->launches_per_group, stream);
}

enum { kMinLongRepeats = 5 };

/* The long ops' timing (attention, model steps): one launch (which also builds plans), then one timed launch
   picks the group size (10 launches under 1 ms, else 1) and the number of groups, from kMinLongRepeats to
   --repeats, so that the timed groups take about budget_s seconds. */
static double time_long_op(bench_op op, void *context, const bench_options *o, double budget_s, cudaStream_t stream)
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    op(context, stream);
    const float probe_ms = timed_launch(op, context, start, stop, stream);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    const int launches = probe_ms < 1.0f ? o->launches_per_group : 1;
    const double group_s = 1e-3 * (probe_ms > 1e-3f ? probe_ms : 1e-3f) * launches;
    int repeats = (int)(budget_s / group_s);
    repeats = repeats < kMinLongRepeats ? kMinLongRepeats : repeats;
    repeats = repeats > o->repeats ? o->repeats : repeats;
    return time_groups(op, context, repeats, launches, stream);
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

/* n bf16 values on the host (xmalloc'd), uniform in [low, high) from the generator seeded with `seed`. */
static gpu_bf16 *random_bf16(size_t n, uint64_t seed, double low, double high)
{
    uint64_t rng = seed;
    gpu_bf16 *values = xmalloc(n * sizeof *values);
    for (size_t i = 0; i < n; ++i) values[i] = gpu_bf16_from_float((float)(low + (high - low) * rng_uniform(&rng)));
    return values;
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

/* ---- LayerNorm-Modulate section ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    bench_op op;
    double bytes_per_row_elem; /* bf16 row tensors moved: bytes per (row, column) */
    double bytes_per_row;      /* mean, rstd */
    double bytes_per_sample_elem; /* modulation vectors read and per-sample gradients written */
} op_spec;

enum { kLnmodOps = 4 };
static const op_spec kLnmodSpecs[kLnmodOps] = {
    {"fwd", run_fwd, 4.0, 8.0, 8.0},                   /* x, y; mean, rstd; shift, scale */
    {"bwd", run_bwd, 6.0, 8.0, 12.0},                  /* x, dy, dx; mean, rstd; scale, dshift, dscale */
    {"residual_fwd", run_residual_fwd, 8.0, 8.0, 12.0}, /* x, y_prev, x_new, y; gate, shift, scale */
    {"residual_bwd", run_residual_bwd, 12.0, 8.0, 20.0}, /* x_new, y_prev, dy, d_x_new, dx, dy_prev */
};

/* Times every LN-modulate op at every D; results[d][op] = {ms, GB/s}. */
static void run_lnmod_section(const bench_options *o, double copy_gbs, cudaStream_t stream,
                              double results[kMaxDims][kLnmodOps][2])
{
    printf("LayerNorm-Modulate, B=%d samples x S=%lld rows (%lld rows), bf16 rows, fp32 statistics and modulation\n",
           o->n_samples, (long long)o->rows_per_sample, (long long)(o->n_samples * o->rows_per_sample));
    for (int d = 0; d < o->n_dims; ++d) {
        char kernels[2][96];
        for (int residual = 0; residual < 2; ++residual) {
            const lnmod_fwd_plan plan = lnmod_fwd_plan_for(o->dims[d], residual);
            if (plan.stages == LNMOD_FWD_REGISTER_KERNEL)
                snprintf(kernels[residual], sizeof kernels[residual], "register kernel, %d threads x %d vectors",
                         plan.threads_per_row, plan.vectors_per_thread);
            else
                snprintf(kernels[residual], sizeof kernels[residual],
                         "staged kernel, %d stage%s, %d threads x %d vectors", plan.stages, plan.stages > 1 ? "s" : "",
                         plan.threads_per_row, plan.vectors_per_thread);
        }
        printf("  D=%d: fwd %s; residual_fwd %s\n", o->dims[d], kernels[0], kernels[1]);
    }
    printf("%-6s %-14s %10s %12s %10s %9s\n", "D", "op", "ms", "floor MB", "GB/s", "% copy");

    const int64_t n_rows = o->n_samples * o->rows_per_sample;
    int max_dim = 0;
    for (int d = 0; d < o->n_dims; ++d) max_dim = o->dims[d] > max_dim ? o->dims[d] : max_dim;
    const size_t max_n = (size_t)n_rows * (size_t)max_dim, pattern_extra = 4096;
    uint64_t rng = 0xbe4c4a1d17ull;
    gpu_bf16 *pattern = xmalloc((max_n + pattern_extra) * sizeof *pattern);
    for (size_t i = 0; i < max_n + pattern_extra; ++i)
        pattern[i] = gpu_bf16_from_float((float)(4.0 * rng_uniform(&rng) - 1.5));
    int64_t *row_start_host = xmalloc((size_t)(o->n_samples + 1) * sizeof *row_start_host);
    for (int b = 0; b <= o->n_samples; ++b) row_start_host[b] = b * o->rows_per_sample;

    for (int d = 0; d < o->n_dims; ++d) {
        lnmod_context c = {0};
        c.n_rows = n_rows, c.dim = o->dims[d], c.n_samples = o->n_samples;
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

        for (int s = 0; s < kLnmodOps; ++s) {
            const double ms = time_op(kLnmodSpecs[s].op, &c, o, stream);
            const double bytes = kLnmodSpecs[s].bytes_per_row_elem * (double)n +
                                 kLnmodSpecs[s].bytes_per_row * (double)n_rows +
                                 kLnmodSpecs[s].bytes_per_sample_elem * (double)n_mod;
            const double gbs = bytes / (ms * 1e6);
            results[d][s][0] = ms;
            results[d][s][1] = gbs;
            printf("%-6d %-14s %10.4f %12.1f %10.0f %8.1f%%\n", c.dim, kLnmodSpecs[s].name, ms, bytes / 1e6, gbs,
                   100.0 * gbs / copy_gbs);
        }
        void *buffers[] = {c.row_start, c.x, c.y_prev, c.dy, c.d_res, c.x_new, c.y, c.dx, c.dy_prev, c.shift, c.scale,
                           c.gate, c.mean, c.rstd, c.dshift, c.dscale, c.dgate, c.workspace};
        for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) CUDA_CHECK(cudaFree(buffers[i]));
    }
    free(pattern);
    free(row_start_host);
}

/* ---- GEMM section ----------------------------------------------------------------------------------- */

enum { kGemmOps = 3, kSquare = 8192 };

/* A linear layer of a Wan 2.1 block, and how many of that shape the block has. */
typedef struct {
    const char *name;
    int in_dim, out_dim;
    int on_text;           /* rows are the text tokens (cross-attention k, v), not the S video tokens */
    gemm_epilogue epilogue;
    int gelu_before;       /* its input is gelu(pre): the backward data GEMM takes the GELU gradient */
    int per_block;
} wan_linear;

enum { kWanLinears = 4 };

/* The block's linear layers at these dims. */
static void wan_linears(const wan_dims *w, wan_linear specs[kWanLinears])
{
    specs[0] = (wan_linear){"self q,k,v,o; cross q,o", w->dim, w->dim, 0, GEMM_EPILOGUE_BIAS, 0, 6};
    specs[1] = (wan_linear){"cross k,v (text rows)", w->dim, w->dim, 1, GEMM_EPILOGUE_BIAS, 0, 2};
    specs[2] = (wan_linear){"ffn up (+bias+GELU)", w->dim, w->ffn_dim, 0, GEMM_EPILOGUE_GELU_AUX_BIAS, 0, 1};
    specs[3] = (wan_linear){"ffn down (dx with dGELU)", w->ffn_dim, w->dim, 0, GEMM_EPILOGUE_BIAS, 1, 1};
}
static const char *const kGemmOpNames[kGemmOps] = {"fwd", "bwd_data", "bwd_weight"};

/* Device tensors of one GEMM shape (views of the section's buffers). */
typedef struct {
    int64_t rows;
    int in_dim, out_dim;
    gemm_epilogue epilogue;
    int gelu_before;
    gpu_bf16 *x, *weight, *bias, *y, *pre_gelu, *dy, *dx;
    float *dweight, *dbias;
    gemm_context *gemm;
} gemm_operands;

static void run_gemm_fwd(void *context, cudaStream_t stream)
{
    gemm_operands *c = context;
    gemm_linear_fwd(c->gemm, c->x, c->rows, c->in_dim, c->out_dim, c->weight,
                    c->epilogue == GEMM_EPILOGUE_NONE ? NULL : c->bias, c->epilogue, c->y,
                    c->epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS ? c->pre_gelu : NULL, stream);
}

static void run_gemm_bwd_data(void *context, cudaStream_t stream)
{
    gemm_operands *c = context;
    gemm_linear_bwd_data(c->gemm, c->dy, c->rows, c->in_dim, c->out_dim, c->weight, c->gelu_before ? c->pre_gelu : NULL, c->dx,
                         0, stream);
}

static void run_gemm_bwd_weight(void *context, cudaStream_t stream)
{
    gemm_operands *c = context;
    gemm_linear_bwd_weight(c->gemm, c->x, c->dy, c->rows, c->in_dim, c->out_dim, c->dweight, c->dbias, 1, stream);
}

static const bench_op kGemmRunners[kGemmOps] = {run_gemm_fwd, run_gemm_bwd_data, run_gemm_bwd_weight};

typedef struct {
    double ms[kMaxSeq][kWanLinears][kGemmOps];
    double block_ms[kMaxSeq][2];    /* the block's GEMMs summed: forward, backward (both GEMMs) */
    double block_flops[kMaxSeq][2];
    double square_ms;
    int64_t unfused_calls;
} gemm_results;

/* n bf16 values on the device: the host pattern from `shift` on, tiled by doubling device-to-device copies. */
static gpu_bf16 *device_tiled_bf16(size_t n, const gpu_bf16 *pattern, size_t n_pattern, size_t shift)
{
    gpu_bf16 *p = device_alloc(n * sizeof *p);
    const size_t first = n < n_pattern - shift ? n : n_pattern - shift;
    CUDA_CHECK(cudaMemcpy(p, pattern + shift, first * sizeof *p, cudaMemcpyHostToDevice));
    for (size_t done = first; done < n;) {
        const size_t length = done < n - done ? done : n - done;
        CUDA_CHECK(cudaMemcpy(p + done, p, length * sizeof *p, cudaMemcpyDeviceToDevice));
        done += length;
    }
    return p;
}

static double tflops(double flops, double ms) { return flops / (ms * 1e9); }

/* Times the three GEMMs of every linear of a block (--wan dims) at every S, and the 8192^3 reference. */
static void run_gemm_section(const bench_options *o, cudaStream_t stream, gemm_results *r)
{
    int64_t max_rows = o->text_rows;
    for (int i = 0; i < o->n_seq; ++i) max_rows = o->seq[i] > max_rows ? o->seq[i] : max_rows;
    const int dim = o->wan->dim, ffn = o->wan->ffn_dim;
    wan_linear specs[kWanLinears];
    wan_linears(o->wan, specs);
    size_t n_act = (size_t)max_rows * ffn, n_weight = (size_t)ffn * dim;
    const size_t n_square = (size_t)kSquare * kSquare;
    n_act = n_act > n_square ? n_act : n_square;
    n_weight = n_weight > n_square ? n_weight : n_square;
    const size_t n_pattern = (size_t)1 << 22, pattern_extra = 4096;
    gpu_bf16 *pattern = random_bf16(n_pattern + pattern_extra, 0x6e6d6d6265ull, -1.0, 1.0);
    gemm_operands c = {0};
    c.gemm = gemm_create(o->gemm_autotune, 1);
    c.x = device_tiled_bf16(n_act, pattern, n_pattern, 0);
    c.dy = device_tiled_bf16(n_act, pattern, n_pattern, 1013);
    c.pre_gelu = device_tiled_bf16(n_act, pattern, n_pattern, 2027);
    c.weight = device_tiled_bf16(n_weight, pattern, n_pattern, 3041);
    c.bias = device_tiled_bf16((size_t)ffn, pattern, n_pattern, 4093);
    c.y = device_alloc(n_act * sizeof *c.y), c.dx = device_alloc(n_act * sizeof *c.dx);
    c.dweight = device_alloc((size_t)ffn * dim * sizeof *c.dweight);
    c.dbias = device_alloc((size_t)ffn * sizeof *c.dbias);
    CUDA_CHECK(cudaMemset(c.dweight, 0, (size_t)ffn * dim * sizeof *c.dweight));
    CUDA_CHECK(cudaMemset(c.dbias, 0, (size_t)ffn * sizeof *c.dbias));
    free(pattern);
    gemm_stats stats_before;
    gemm_get_stats(c.gemm, &stats_before);

    printf("GEMMs of a Wan-%s block (dim %d, FFN %d; cuBLASLt, bf16 in and out, fp32 accumulation; dW, db fp32 "
           "accumulated;\n  epilogues fused in cuBLASLt but the bias gradients, own column sums), one sample of S rows "
           "and %d text rows:\n", o->wan->name, dim, ffn, o->text_rows);
    printf("%-6s %-25s %6s %5s %5s %-11s %9s %8s\n", "S", "layer", "rows", "in", "out", "op", "ms", "TFLOP/s");
    for (int si = 0; si < o->n_seq; ++si) {
        r->block_ms[si][0] = r->block_ms[si][1] = r->block_flops[si][0] = r->block_flops[si][1] = 0.0;
        for (int l = 0; l < kWanLinears; ++l) {
            const wan_linear *spec = &specs[l];
            c.rows = spec->on_text ? o->text_rows : o->seq[si];
            c.in_dim = spec->in_dim, c.out_dim = spec->out_dim, c.epilogue = spec->epilogue;
            c.gelu_before = spec->gelu_before;
            const double flops = gemm_linear_flops(c.rows, c.in_dim, c.out_dim);
            for (int op = 0; op < kGemmOps; ++op) {
                const double ms = time_op(kGemmRunners[op], &c, o, stream);
                r->ms[si][l][op] = ms;
                r->block_ms[si][op == 0 ? 0 : 1] += spec->per_block * ms;
                r->block_flops[si][op == 0 ? 0 : 1] += spec->per_block * flops;
                printf("%-6lld %-25s %6lld %5d %5d %-11s %9.4f %8.1f\n", (long long)o->seq[si], spec->name,
                       (long long)c.rows, c.in_dim, c.out_dim, kGemmOpNames[op], ms, tflops(flops, ms));
            }
        }
    }
    if (o->n_seq > 0) {
        printf("The block's GEMMs summed (each layer times its count: 6 + 2 text projections %dx%d, FFN up, down):"
               "\n%-6s %10s %10s %12s %9s %8s\n", dim, dim, "S", "fwd ms", "bwd ms", "fwd+bwd ms", "TFLOP", "TFLOP/s");
        for (int si = 0; si < o->n_seq; ++si) {
            const double ms = r->block_ms[si][0] + r->block_ms[si][1];
            const double flops = r->block_flops[si][0] + r->block_flops[si][1];
            printf("%-6lld %10.3f %10.3f %12.3f %9.3f %8.1f\n", (long long)o->seq[si], r->block_ms[si][0],
                   r->block_ms[si][1], ms, flops / 1e12, tflops(flops, ms));
        }
    }
    c.rows = kSquare, c.in_dim = kSquare, c.out_dim = kSquare, c.epilogue = GEMM_EPILOGUE_NONE;
    r->square_ms = time_op(run_gemm_fwd, &c, o, stream);
    printf("reference: %d x %d x %d forward GEMM, no epilogue: %.4f ms, %.1f TFLOP/s\n", kSquare, kSquare, kSquare,
           r->square_ms, tflops(gemm_linear_flops(kSquare, kSquare, kSquare), r->square_ms));
    gemm_stats stats_after;
    gemm_get_stats(c.gemm, &stats_after);
    r->unfused_calls = stats_after.unfused - stats_before.unfused;
    printf("calls whose fused epilogue cuBLASLt had no algorithm for (own kernels ran instead): %lld\n",
               (long long)r->unfused_calls);
    printf("autotuning %s: %lld plans timed, %lld of them faster with another than the heuristic's first choice\n",
           o->gemm_autotune ? "on (--gemm-autotune 1)" : "off", (long long)(stats_after.tuned - stats_before.tuned),
           (long long)(stats_after.tuned_not_first - stats_before.tuned_not_first));

    CUDA_CHECK(cudaStreamSynchronize(stream));
    void *buffers[] = {c.x, c.dy, c.pre_gelu, c.weight, c.bias, c.y, c.dx, c.dweight, c.dbias};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) CUDA_CHECK(cudaFree(buffers[i]));
    gemm_free(c.gemm);
}

/* ---- attention section --------------------------------------------------------------------------------- */

enum { kAttentionKinds = 2, kAttentionOps = 2 };
static const char *const kAttentionKindNames[kAttentionKinds] = {"self", "cross"};
static const double kLongOpBudgetSeconds = 3.0;  /* timed groups per attention figure */
static const double kStepBudgetSeconds = 6.0;    /* timed groups per model step */

/* Device tensors of one attention shape: the n_q query rows of one sample attend to its n_kv key rows. */
typedef struct {
    int heads, head_dim;         /* the block's (--wan) */
    int64_t n_q, n_kv;
    int64_t *q_start, *kv_start; /* device offsets {0, n_q}, {0, n_kv} */
    gpu_bf16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    void *workspace;
    struct attention_cudnn *cudnn; /* the cuDNN backends' context (NULL without cuDNN) */
} attention_context;

static void run_attention_fwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    attention_fwd(c->q, c->k, c->v, c->heads, c->head_dim, c->q_start, c->kv_start, 1, c->n_q, c->n_kv, c->out,
                  c->lse, stream);
}

static void run_attention_bwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    attention_bwd(c->q, c->k, c->v, c->out, c->dout, c->lse, c->heads, c->head_dim, c->q_start, c->kv_start, 1,
                  c->n_q, c->n_kv, c->dq, c->dk, c->dv, c->workspace, stream);
}

static int own_attention_available(attention_context *c)
{
    return attention_head_dim_supported(c->head_dim);
}

#ifdef HAVE_CUDNN
static int cudnn_attention_available(attention_context *c)
{
    return attention_cudnn_available(c->cudnn, c->heads, c->head_dim);
}

/* cuDNN's fused SDPA on the one sample (self: n_kv == n_q); its stats fill the lse buffer (same size). */
static void run_cudnn_attention_fwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    attention_cudnn_cross_fwd(c->cudnn, c->q, c->k, c->v, c->n_q, c->n_kv, c->heads, c->head_dim, c->out, c->lse, stream);
}

static void run_cudnn_attention_bwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    attention_cudnn_cross_bwd(c->cudnn, c->q, c->k, c->v, c->out, c->dout, c->lse, c->n_q, c->n_kv, c->heads,
                              c->head_dim, c->dq, c->dk, c->dv, stream);
}

/* Self-attention over whole tiles, zero-padded (the model's default for a micro-batch's last sample): the
   buffers have the rows to spare; zeroing the pad rows is part of the op, as in the model. Cross-attention
   (512 keys: whole tiles already) runs as cudnn. */
static void zero_rows_past(const attention_context *c, gpu_bf16 *buffer, int64_t rows, int64_t padded,
                           cudaStream_t stream)
{
    const size_t width = (size_t)c->heads * c->head_dim;
    CUDA_CHECK(cudaMemsetAsync(buffer + (size_t)rows * width, 0, (size_t)(padded - rows) * width * sizeof *buffer,
                               stream));
}

static void run_cudnn_tiles_attention_fwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    if (c->n_q != c->n_kv) {
        run_cudnn_attention_fwd(context, stream);
        return;
    }
    const int64_t padded = attention_cudnn_padded_rows(c->n_q);
    gpu_bf16 *const inputs[] = {c->q, c->k, c->v};
    for (int i = 0; i < 3; ++i) zero_rows_past(c, inputs[i], c->n_q, padded, stream);
    attention_cudnn_fwd_padded(c->cudnn, c->q, c->k, c->v, c->n_q, padded, c->heads, c->head_dim, c->out, c->lse,
                               stream);
}

static void run_cudnn_tiles_attention_bwd(void *context, cudaStream_t stream)
{
    attention_context *c = context;
    if (c->n_q != c->n_kv) {
        run_cudnn_attention_bwd(context, stream);
        return;
    }
    const int64_t padded = attention_cudnn_padded_rows(c->n_q);
    zero_rows_past(c, c->dout, c->n_q, padded, stream);
    attention_cudnn_bwd_padded(c->cudnn, c->q, c->k, c->v, c->out, c->dout, c->lse, c->n_q, padded, c->heads,
                               c->head_dim, c->dq, c->dk, c->dv, stream);
}
#endif

/* The attention implementations the section times, each for self- and cross-attention: our own kernel and
   cuDNN's fused SDPA (cuda/attention_cudnn.h, where configure found cuDNN), which the GPU model calls for
   samples of GPU_ATTENTION_CUDNN_MIN_TOKENS tokens or more; the block's floor uses the faster one's rates. */
typedef struct {
    const char *name;
    int (*available)(attention_context *c);
    bench_op fwd, bwd; /* bwd runs after fwd on the same context: it reads out and lse */
} attention_backend;
static const attention_backend kAttentionBackends[] = {
    {"own", own_attention_available, run_attention_fwd, run_attention_bwd},
#ifdef HAVE_CUDNN
    {"cudnn", cudnn_attention_available, run_cudnn_attention_fwd, run_cudnn_attention_bwd},
    {"cudnn-tiles", cudnn_attention_available, run_cudnn_tiles_attention_fwd, run_cudnn_tiles_attention_bwd},
#endif
};
#define ATTENTION_BACKENDS (sizeof kAttentionBackends / sizeof kAttentionBackends[0])

typedef struct {
    int measured[kMaxSeq][ATTENTION_BACKENDS][kAttentionKinds];
    double ms[kMaxSeq][ATTENTION_BACKENDS][kAttentionKinds][kAttentionOps]; /* op 0 forward, 1 backward */
    double flops[kMaxSeq][kAttentionKinds][kAttentionOps];
} attention_results;

/* Whether `name` is one of the comma-separated items of `list`. */
static int name_listed(const char *name, const char *list)
{
    const size_t length = strlen(name);
    for (const char *item = list; item && *item; item = strchr(item, ',') ? strchr(item, ',') + 1 : NULL)
        if (!strncmp(item, name, length) && (item[length] == ',' || item[length] == '\0')) return 1;
    return 0;
}

/* Times self-attention (S x S) and cross-attention (S x T) forward and backward at every S. */
static void run_attention_section(const bench_options *o, cudaStream_t stream, attention_results *r)
{
    int64_t max_rows = o->text_rows;
    for (int i = 0; i < o->n_seq; ++i) max_rows = o->seq[i] > max_rows ? o->seq[i] : max_rows;
    attention_context c = {.heads = o->wan->heads, .head_dim = o->wan->head_dim};
    const int width = c.heads * c.head_dim;
    /* a tile of rows to spare: cudnn-tiles runs over whole tiles */
    const size_t n = (size_t)(max_rows + 128) * (size_t)width, n_pattern = (size_t)1 << 22, pattern_extra = 4096;
    gpu_bf16 *pattern = random_bf16(n_pattern + pattern_extra, 0xa77e47104eull, -1.0, 1.0);
    c.q = device_tiled_bf16(n, pattern, n_pattern, 0);
    c.k = device_tiled_bf16(n, pattern, n_pattern, 1019);
    c.v = device_tiled_bf16(n, pattern, n_pattern, 2039);
    c.dout = device_tiled_bf16(n, pattern, n_pattern, 3067);
    free(pattern);
    gpu_bf16 **outputs[] = {&c.out, &c.dq, &c.dk, &c.dv};
    for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; ++i) *outputs[i] = device_alloc(n * sizeof(gpu_bf16));
    c.lse = device_alloc((size_t)(max_rows + 128) * c.heads * sizeof *c.lse);
    c.workspace = device_alloc(attention_bwd_workspace_bytes(max_rows, c.heads));
    c.q_start = device_alloc(2 * sizeof *c.q_start);
    c.kv_start = device_alloc(2 * sizeof *c.kv_start);
#ifdef HAVE_CUDNN
    c.cudnn = attention_cudnn_create(o->attention_autotune, 0);
#endif

    int available[ATTENTION_BACKENDS];
    for (size_t b = 0; b < ATTENTION_BACKENDS; ++b)
        if (!name_listed(kAttentionBackends[b].name, o->attention_backends)) {
            available[b] = 0;
            printf("attention backend %s: not in --backends %s, not timed\n", kAttentionBackends[b].name,
                   o->attention_backends);
        } else if (!(available[b] = kAttentionBackends[b].available(&c)))
            printf("attention backend %s: not available for %d heads of %d, not timed\n", kAttentionBackends[b].name,
                   c.heads, c.head_dim);
    printf("Attention (%d heads x %d, bf16, fp32 accumulation), one sample: self S x S and cross S x %d text rows;\n"
           "  FLOPs: forward 4*Sq*Skv*%d, backward 2.5x that:\n", c.heads, c.head_dim, o->text_rows, width);
    printf("%-6s %-6s %-11s %8s %10s %10s %10s %10s %10s\n", "S", "kind", "backend", "kv rows", "fwd ms", "fwd TF/s",
           "bwd ms", "bwd TF/s", "f+b TF/s");
    for (int si = 0; si < o->n_seq; ++si)
        for (int kind = 0; kind < kAttentionKinds; ++kind) {
            c.n_q = o->seq[si];
            c.n_kv = kind == 0 ? o->seq[si] : o->text_rows;
            const int64_t q_start[2] = {0, c.n_q}, kv_start[2] = {0, c.n_kv};
            CUDA_CHECK(cudaMemcpy(c.q_start, q_start, sizeof q_start, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(c.kv_start, kv_start, sizeof kv_start, cudaMemcpyHostToDevice));
            const double fwd_flops = attention_fwd_flops(q_start, kv_start, 1, c.heads, c.head_dim);
            const double bwd_flops = attention_bwd_flops(q_start, kv_start, 1, c.heads, c.head_dim);
            r->flops[si][kind][0] = fwd_flops;
            r->flops[si][kind][1] = bwd_flops;
            for (size_t b = 0; b < ATTENTION_BACKENDS; ++b) {
                if (!available[b]) continue;
                r->measured[si][b][kind] = 1;
                const double fwd_ms = time_long_op(kAttentionBackends[b].fwd, &c, o, kLongOpBudgetSeconds, stream);
                const double bwd_ms = time_long_op(kAttentionBackends[b].bwd, &c, o, kLongOpBudgetSeconds, stream);
                r->ms[si][b][kind][0] = fwd_ms;
                r->ms[si][b][kind][1] = bwd_ms;
                printf("%-6lld %-6s %-11s %8lld %10.3f %10.1f %10.3f %10.1f %10.1f\n", (long long)o->seq[si],
                       kAttentionKindNames[kind], kAttentionBackends[b].name, (long long)c.n_kv, fwd_ms,
                       tflops(fwd_flops, fwd_ms), bwd_ms, tflops(bwd_flops, bwd_ms),
                       tflops(fwd_flops + bwd_flops, fwd_ms + bwd_ms));
            }
        }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    void *buffers[] = {c.q, c.k, c.v, c.dout, c.out, c.dq, c.dk, c.dv, c.lse, c.workspace, c.q_start, c.kv_start};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; ++i) CUDA_CHECK(cudaFree(buffers[i]));
#ifdef HAVE_CUDNN
    attention_cudnn_tuning_report(c.cudnn, stdout);
    attention_cudnn_free(c.cudnn);
#endif
}

/* ---- block section ------------------------------------------------------------------------------------- */

/* A token grid (frames, rows, columns after the 1x2x2 patch) of exactly S tokens: Wan 2.1's shapes where S is
   one of them (32760 = 21x30x52: 81 frames of 480x832; 75600 = 21x45x80: 81 frames of 720x1280), else the most
   frames up to 21 that divide S, then the squarest rows x columns. tests/bench/peer_torch.py picks the same. */
static void block_grid(int64_t S, int64_t grid[3])
{
    static const int64_t known[][3] = {{4, 32, 32}, {16, 32, 32}, {21, 30, 52}, {21, 45, 80}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i)
        if (known[i][0] * known[i][1] * known[i][2] == S) {
            memcpy(grid, known[i], sizeof known[i]);
            return;
        }
    int64_t frames = 1;
    for (int64_t f = 21; f > 1 && frames == 1; --f)
        if (S % f == 0) frames = f;
    const int64_t plane = S / frames;
    int64_t rows = 1;
    for (int64_t h = 1; h * h <= plane; ++h)
        if (plane % h == 0) rows = h;
    grid[0] = frames, grid[1] = rows, grid[2] = plane / rows;
}

/* Forward + backward milliseconds of the fastest backend measured for this S and kind (the floor's attention). */
static double fastest_attention_ms(const attention_results *attn, int si, int kind)
{
    double best = 0.0;
    for (size_t b = 0; b < ATTENTION_BACKENDS; ++b) {
        const double ms = attn->ms[si][b][kind][0] + attn->ms[si][b][kind][1];
        if (attn->measured[si][b][kind] && (best == 0.0 || ms < best)) best = ms;
    }
    return best;
}

typedef struct {
    gpu_model *gm;
    const model_batch *batch;
    double enqueue_ms; /* the least host time a step took to queue its work (gpu_model_enqueue_seconds) */
} step_context;

/* One sample of S tokens at the deep model's dims (16 x F x 2H x 2W latents, T text tokens): random normal values,
   or zeros where `zero` is 1. The arrays are the caller's (free_sample). */
typedef struct {
    int32_t frames, height, width, text_len;
    float sigma;
    float *latents, *noise, *text;
    model_batch batch;
} bench_sample;

static void make_sample(const model *m, const int64_t grid[3], int text_len, int zero, uint64_t seed, bench_sample *b)
{
    b->frames = (int32_t)grid[0];
    b->height = 2 * (int32_t)grid[1];
    b->width = 2 * (int32_t)grid[2];
    b->text_len = text_len;
    b->sigma = 0.5f;
    const size_t n_latent = (size_t)m->in_dim * (size_t)b->frames * (size_t)b->height * (size_t)b->width;
    const size_t n_text = (size_t)text_len * (size_t)m->text_dim;
    b->latents = xcalloc(n_latent, sizeof(float));
    b->noise = xcalloc(n_latent, sizeof(float));
    b->text = xcalloc(n_text > 0 ? n_text : 1, sizeof(float));
    uint64_t rng = seed;
    for (size_t i = 0; !zero && i < n_latent; ++i) {
        b->latents[i] = (float)rng_normal(&rng);
        b->noise[i] = (float)rng_normal(&rng);
    }
    for (size_t i = 0; !zero && i < n_text; ++i) b->text[i] = (float)rng_normal(&rng);
    b->batch = (model_batch){.n_samples = 1, .frames = &b->frames, .height = &b->height, .width = &b->width,
                             .text_len = &b->text_len, .latents = b->latents, .noise = b->noise, .sigma = &b->sigma,
                             .text = b->text, .sp_size = 1};
}

static void free_sample(bench_sample *b)
{
    free(b->latents);
    free(b->noise);
    free(b->text);
}

static void run_model_step(void *context, cudaStream_t stream)
{
    step_context *c = context;
    gpu_model_forward_backward(c->gm, c->batch, 1.0f, NULL, stream);
    const double enqueue_ms = 1e3 * gpu_model_enqueue_seconds(c->gm);
    if (c->enqueue_ms == 0.0 || enqueue_ms < c->enqueue_ms) c->enqueue_ms = enqueue_ms;
}

/* The 1-layer and the (1 + K)-layer model's steps timed in alternation, one step each per round, so that a drift of
   the clocks over the measurement weighs on both alike (the blocks are their difference): medians over the rounds, after
   two untimed rounds; as many rounds as fit in twice kStepBudgetSeconds (at least kMinLongRepeats, at most
   --repeats). */
static void time_steps_alternating(step_context steps[2], const bench_options *o, cudaStream_t stream, double ms[2])
{
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    float round_probe_ms = 0.0f;
    for (int warm = 0; warm < 2; ++warm) {
        round_probe_ms = 0.0f;
        for (int l = 0; l < 2; ++l) round_probe_ms += timed_launch(run_model_step, &steps[l], start, stop, stream);
    }
    int rounds = (int)(2.0 * kStepBudgetSeconds / (1e-3 * (round_probe_ms > 1e-3f ? round_probe_ms : 1e-3f)));
    rounds = rounds < kMinLongRepeats ? kMinLongRepeats : rounds > o->repeats ? o->repeats : rounds;
    float *round_ms[2];
    for (int l = 0; l < 2; ++l) round_ms[l] = xmalloc((size_t)rounds * sizeof(float));
    for (int round = 0; round < rounds; ++round)
        for (int l = 0; l < 2; ++l) round_ms[l][round] = timed_launch(run_model_step, &steps[l], start, stop, stream);
    for (int l = 0; l < 2; ++l) {
        qsort(round_ms[l], (size_t)rounds, sizeof(float), compare_floats);
        ms[l] = round_ms[l][rounds / 2];
        free(round_ms[l]);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
}

typedef struct {
    int64_t grid[kMaxSeq][3];
    int skipped[kMaxSeq];
    double need_bytes[kMaxSeq], free_bytes[kMaxSeq];
    double step_ms[kMaxSeq][2]; /* 1-layer, (1 + K)-layer model */
    double enqueue_ms[kMaxSeq][2]; /* their host time to queue a step's work */
    double block_ms[kMaxSeq], flops[kMaxSeq];
    double gemm_ms[kMaxSeq], self_ms[kMaxSeq], cross_ms[kMaxSeq], floor_ms[kMaxSeq];
} block_results;

static const double kGiB = 1073741824.0;
static const size_t kBlockMemoryMargin = (size_t)2 << 30; /* cuBLASLt, CUDA context, fragmentation */

/* Values uniform in (-a, a), a = std sqrt(3) (the standard deviation of normal(0, std)), 1 added where the table's
   init is ONE (norm weights): a timing's weights need to be nonzero and of a training scale, not normal; one
   64-bit draw per value, so that 14B dims take a second or two, not the half minute of Box-Muller's draws. */
static void fill_uniform(model *m, uint64_t seed, double std)
{
    const double a = std * sqrt(3.0);
    uint64_t state = seed;
    for (int i = 0; i < m->n_params; ++i) {
        const param_info *p = &m->params[i];
        int layer;
        int64_t offset;
        const layout_tensor *t = model_layout_param(&m->layout, i, &layer, &offset);
        const float base = t->init == LAYOUT_INIT_ONE ? 1.0f : 0.0f;
        for (int64_t j = 0; j < p->n_elements; ++j)
            m->weights[p->offset + j] = base + (float)(a * (2.0 * rng_uniform(&state) - 1.0));
    }
}

/* The 1-layer model of `config` and the (1 + K)-layer one with the same values: the deeper one takes the embeddings,
   the head and, for each of its blocks, the block of the 1-layer model (the timing does not care that its blocks
   repeat). */
static void make_layer_models(deck *config, int block_layers, model layers[2])
{
    config->model.num_layers = 1;
    model_create(&layers[0], config);
    fill_uniform(&layers[0], 0xb10c0001ull, 0.02);
    config->model.num_layers = 1 + block_layers;
    model_create(&layers[1], config);
    const model_layout *one = &layers[0].layout, *deep = &layers[1].layout;
    const int64_t head = one->blocks_offset + one->block_stride, head_values = layers[0].n_weights - head;
    memcpy(layers[1].weights, layers[0].weights, (size_t)one->blocks_offset * sizeof(float));
    for (int l = 0; l < layers[1].num_layers; ++l)
        memcpy(layers[1].weights + deep->blocks_offset + l * deep->block_stride, layers[0].weights + one->blocks_offset,
               (size_t)one->block_stride * sizeof(float));
    memcpy(layers[1].weights + layers[1].n_weights - head_values, layers[0].weights + head,
           (size_t)head_values * sizeof(float));
}

/* The block sections' models at --wan's dims: layers[0] of 1 block, layers[1] of 1 + --block-layers blocks (Wan 2.1's
   defaults otherwise: text_dim 4096, 16 channels, patch 1x2x2, qk_norm, cross_attn_norm), uniform weights. */
static void make_block_models(const bench_options *o, model layers[2])
{
    deck config;
    deck_defaults(&config);
    config.model.dim = o->wan->dim;
    config.model.ffn_dim = o->wan->ffn_dim;
    config.model.num_heads = o->wan->heads;
    config.model.text_len = o->text_rows;
    make_layer_models(&config, o->block_layers, layers);
}

/* One block (--wan dims) forward+backward at every S: the GPU model's step (one sample of S tokens and T text
   tokens, recompute none) with 1 + K layers minus the same with 1 layer, over K (embeddings, head, loss, the
   batch's staging and the final synchronisation cancel; the text embedding too: only the blocks are counted).
   With K > 1 the deeper step runs mostly at the clocks a many-layer training step holds, and whatever the two
   steps' different loads do to the clocks weighs 1/K on the block. FLOPs
   are 3x the forward's GEMMs + self- and cross-attention (issue 5's convention). The floor: the block's
   GEMMs at the gemm section's times plus both attentions forward and backward at the attention section's
   (the fastest backend of each: a floor, whichever kernel the model calls). */
static void run_block_section(const bench_options *o, const gemm_results *gemm, const attention_results *attn,
                              cudaStream_t stream, block_results *r)
{
    const int K = o->block_layers;
    model layers[2];
    make_block_models(o, layers);
    const model *deep = &layers[1];
    if (deep->dim / deep->num_heads != o->wan->head_dim)
        ALDIT_FATAL("aldit-bench: the model's heads are %d wide, not %d", deep->dim / deep->num_heads, o->wan->head_dim);

    printf("Wan-%s block forward+backward (dim %d, ffn %d, %d heads; one sample of S tokens, %d text tokens of "
           "%d;\n  block = (%d-layer step - 1-layer step) / %d, medians of steps timed in turn; TFLOP/s over 3x the forward's "
           "FLOPs; floor = the block's GEMMs + self + cross attention\n  forward+backward at the rates measured above, "
           "each attention by its fastest backend):\n",
           o->wan->name, deep->dim, deep->ffn_dim, deep->num_heads, o->text_rows, deep->text_dim, 1 + K, K);
    char deep_label[24];
    snprintf(deep_label, sizeof deep_label, "%d-layer", 1 + K);
    printf("%-6s %-10s %9s %9s %9s %8s %8s | %8s %8s %8s %9s %9s\n", "S", "grid", "1-layer", deep_label, "block ms",
           "GFLOP", "TFLOP/s", "GEMM ms", "self ms", "cross ms", "floor ms", "vs floor");
    for (int si = 0; si < o->n_seq; ++si) {
        const int64_t S = o->seq[si];
        block_grid(S, r->grid[si]);
        char grid_text[72];
        snprintf(grid_text, sizeof grid_text, "%lldx%lldx%lld", (long long)r->grid[si][0], (long long)r->grid[si][1],
                 (long long)r->grid[si][2]);
        const double gemm_flops = gemm->block_flops[si][0] + gemm->block_flops[si][1];
        r->flops[si] = gemm_flops + 3.0 * (attn->flops[si][0][0] + attn->flops[si][1][0]);
        r->gemm_ms[si] = gemm->block_ms[si][0] + gemm->block_ms[si][1];
        r->self_ms[si] = fastest_attention_ms(attn, si, 0);
        r->cross_ms[si] = fastest_attention_ms(attn, si, 1);
        r->floor_ms[si] = r->gemm_ms[si] + r->self_ms[si] + r->cross_ms[si];

        size_t free_bytes = 0, total_bytes = 0;
        gpu_memory_info(&free_bytes, &total_bytes);
        const size_t need = gpu_model_workspace_bytes(deep, S, 1, 0) + gpu_model_workspace_bytes(&layers[0], S, 1, 0) +
                            10 * (size_t)(deep->n_weights + layers[0].n_weights) + kBlockMemoryMargin;
        r->need_bytes[si] = (double)need;
        r->free_bytes[si] = (double)free_bytes;
        r->skipped[si] = need > free_bytes;
        if (r->skipped[si]) {
            printf("%-6lld %-10s skipped: needs %.1f GiB (1- and %d-layer models, recompute none, + %.0f GiB margin), "
                   "%.1f GiB free\n", (long long)S, grid_text, need / kGiB, 1 + K, kBlockMemoryMargin / kGiB,
                   free_bytes / kGiB);
            continue;
        }

        /* One sample: latent 16 x F x 2H x 2W, its noise and T text tokens, all random. */
        bench_sample sample;
        make_sample(deep, r->grid[si], o->text_rows, 0, rng_hash(0xb10c0002ull, (uint64_t)S), &sample);
        step_context steps[2];
        for (int l = 0; l < 2; ++l) {
            steps[l] = (step_context){gpu_model_create(&layers[l], S, 1, 0), &sample.batch, 0.0};
            gpu_model_set_autotune(steps[l].gm, o->gemm_autotune, o->attention_autotune);
            gpu_model_upload_weights(steps[l].gm, layers[l].weights);
        }
        time_steps_alternating(steps, o, stream, r->step_ms[si]);
        if (o->profile_step) { /* after the timing: a profiler started with capture off sees only this deeper step */
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaProfilerStart());
            run_model_step(&steps[1], stream);
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaProfilerStop());
        }
        for (int l = 0; l < 2; ++l) {
            r->enqueue_ms[si][l] = steps[l].enqueue_ms;
            gpu_model_free(steps[l].gm);
        }
        free_sample(&sample);
        r->block_ms[si] = (r->step_ms[si][1] - r->step_ms[si][0]) / K;
        printf("%-6lld %-10s %9.3f %9.3f %9.3f %8.1f %8.1f | %8.3f %8.3f %8.3f %9.3f %+8.1f%%\n", (long long)S,
               grid_text, r->step_ms[si][0], r->step_ms[si][1], r->block_ms[si], r->flops[si] / 1e9,
               tflops(r->flops[si], r->block_ms[si]), r->gemm_ms[si], r->self_ms[si], r->cross_ms[si],
               r->floor_ms[si], 100.0 * (r->block_ms[si] / r->floor_ms[si] - 1.0));
    }
    printf("  (vs floor: the block's time over the floor's; issue 5's target is at most +8%%.)\n");
    printf("Host time to queue one step's work (least over the timed steps; where the block's share comes near its GPU\n"
           "time, the step is launch-bound):\n%-6s %12s %9s ms %14s %14s\n", "S", "1-layer ms", deep_label,
           "block host ms", "block GPU ms");
    for (int si = 0; si < o->n_seq; ++si)
        if (!r->skipped[si])
            printf("%-6lld %12.3f %12.3f %14.3f %14.3f\n", (long long)o->seq[si], r->enqueue_ms[si][0],
                   r->enqueue_ms[si][1], (r->enqueue_ms[si][1] - r->enqueue_ms[si][0]) / K, r->block_ms[si]);
    model_free(&layers[0]);
    model_free(&layers[1]);
}

/* ---- split section (issue 31): one member of a sequence-parallel group ---------------------------------------- */

typedef struct {
    int skipped[kMaxSeq][kMaxSplit];   /* 1: k does not divide the heads; 2: not enough memory */
    int64_t rows[kMaxSeq][kMaxSplit];  /* the member's rows, S/k */
    double step_ms[kMaxSeq][kMaxSplit][2], member_ms[kMaxSeq][kMaxSplit];
    double exchange_bytes[kMaxSeq][kMaxSplit];   /* sent by the member per block forward+backward */
} split_results;

static const double kSplitBandwidth = 300e9;   /* [balance] sp_bandwidth's default, bytes per second */

/* Device bytes the two models of the split section need at (S, k): their workspaces for the member's rows, weights,
   the head layout's buffers (model_gpu.h: per block q, k, v, output and log-sum-exps over all S rows for h/k heads,
   four more for the backward, the packing and the latents) and the margin. */
static size_t split_need_bytes(const model layers[2], int64_t S, int k, int64_t rows)
{
    size_t need = kBlockMemoryMargin;
    for (int l = 0; l < 2; ++l) {
        const model *m = &layers[l];
        need += gpu_model_workspace_bytes(m, rows, 1, 0) + 10 * (size_t)m->n_weights;
        if (k == 1) continue;
        const size_t all_rows = (size_t)(S + 256), dk = (size_t)(m->dim / k), hk = (size_t)(m->num_heads / k);
        need += (size_t)(m->num_layers + 1) * all_rows * (4 * dk * 2 + hk * 4) + 3 * (size_t)rows * m->dim * 2 +
                2 * (size_t)S * m->patch_in * 4;
    }
    return need;
}

/* The member's step of both models at (S, k), timed as the block section's; the member's block ms. */
static double time_split_member(const bench_options *o, const model layers[2], const seqpar_gpu *loopback, int64_t S,
                                int k, int64_t rows, cudaStream_t stream, double step_ms[2])
{
    int64_t grid[3];
    block_grid(S, grid);
    bench_sample sample;
    make_sample(&layers[1], grid, o->text_rows, 0, rng_hash(0x5b117001ull, (uint64_t)S), &sample);
    /* member 0 of a group of k (k = 1: alone); the model finds its loopback group by k */
    sample.batch.sp_size = k;
    sample.batch.sp_rank = 0;
    step_context steps[2];
    for (int l = 0; l < 2; ++l) {
        steps[l] = (step_context){gpu_model_create(&layers[l], rows + 1, 1, 0), &sample.batch, 0.0};
        gpu_model_set_autotune(steps[l].gm, o->gemm_autotune, o->attention_autotune);
        gpu_model_set_seqpar(steps[l].gm, loopback);
        gpu_model_upload_weights(steps[l].gm, layers[l].weights);
    }
    time_steps_alternating(steps, o, stream, step_ms);
    for (int l = 0; l < 2; ++l) gpu_model_free(steps[l].gm);
    free_sample(&sample);
    return (step_ms[1] - step_ms[0]) / o->block_layers;
}

/* One member's block forward+backward at every S and k (--seq, --split-k; --wan dims), against k = 1's block. */
static void run_split_section(const bench_options *o, cudaStream_t stream, split_results *r)
{
    const int K = o->block_layers;
    model layers[2];
    make_block_models(o, layers);
    int max_k = 1;
    for (int i = 0; i < o->n_split; ++i) max_k = o->split_k[i] > max_k ? o->split_k[i] : max_k;
    seqpar_gpu *loopback = seqpar_gpu_create_loopback(max_k, 0);
    printf("Wan-%s split sample: one member of a group of k (dim %d, ffn %d, %d heads; one sample of S tokens, %d text "
           "tokens):\n  member = its block forward+backward on S/k rows and self-attention over S rows for h/k heads, "
           "((%d-layer - 1-layer step) / %d,\n  the exchange a loopback copy); exchange = bytes it sends per block "
           "(8 tensors x S/k x dim bf16 x (k-1)/k), ms at %.0f GB/s\n", o->wan->name, o->wan->dim, o->wan->ffn_dim,
           o->wan->heads, o->text_rows, 1 + K, K, kSplitBandwidth / 1e9);
    printf("%-6s %3s %7s %6s %11s %13s %12s %12s %12s\n", "S", "k", "rows", "heads", "member ms", "k x member ms",
           "vs k = 1", "exchange MB", "exchange ms");
    for (int si = 0; si < o->n_seq; ++si) {
        const int64_t S = o->seq[si];
        double alone_ms = 0.0;
        for (int ki = 0; ki < o->n_split; ++ki) {
            const int k = o->split_k[ki];
            const int64_t rows = S / k;
            r->rows[si][ki] = rows;
            r->exchange_bytes[si][ki] = 8.0 * (double)rows * o->wan->dim * 2.0 * (double)(k - 1) / k;
            size_t free_bytes = 0, total_bytes = 0;
            gpu_memory_info(&free_bytes, &total_bytes);
            r->skipped[si][ki] = o->wan->heads % k ? 1 : split_need_bytes(layers, S, k, rows) > free_bytes ? 2 : 0;
            if (r->skipped[si][ki]) {
                printf("%-6lld %3d skipped: %s\n", (long long)S, k, r->skipped[si][ki] == 1 ? "k does not divide the heads"
                       : "not enough free memory for the two models");
                continue;
            }
            r->member_ms[si][ki] = time_split_member(o, layers, loopback, S, k, rows, stream, r->step_ms[si][ki]);
            if (k == 1) alone_ms = r->member_ms[si][ki];
            char versus[24] = "-";
            if (alone_ms > 0.0) snprintf(versus, sizeof versus, "%.3f", k * r->member_ms[si][ki] / alone_ms);
            printf("%-6lld %3d %7lld %6d %11.3f %13.3f %12s %12.1f %12.3f\n", (long long)S, k, (long long)rows,
                   o->wan->heads / k, r->member_ms[si][ki], k * r->member_ms[si][ki], versus,
                   r->exchange_bytes[si][ki] / 1e6, 1e3 * r->exchange_bytes[si][ki] / kSplitBandwidth);
        }
    }
    printf("  (vs k = 1: the group's GPU time per block over the unsplit block's: 1 where the split costs cost(S)/k.)\n");
    seqpar_gpu_free(loopback);
    model_free(&layers[0]);
    model_free(&layers[1]);
}

/* ---- mmdit section: HunyuanVideo-1.5's MMDiT block ------------------------------------------------------------- */

enum { kHv15Layers = 8 };   /* inputs/hunyuanvideo15-8layers.ini's blocks: the step the epoch runs */
static const wan_dims *const kHv15Widths = &kWanModels[2];

typedef struct {
    int n_floor;                              /* the rows the floor's rates were measured at */
    int64_t floor_rows[kMaxSeq];
    double floor_gemm_tflops[kMaxSeq];        /* the MMDiT stream's GEMMs, forward and both backward */
    double floor_self_spf[kMaxSeq];           /* self-attention fwd+bwd seconds per forward FLOP, fastest backend */
    int64_t video_rows[kMaxCases], text_rows[kMaxCases];   /* the micro-batch's packed rows of each stream */
    int skipped[kMaxCases];
    double need_bytes[kMaxCases], free_bytes[kMaxCases];
    double step_ms[kMaxCases][2];             /* 1-layer, (1 + K)-layer model */
    double block_ms[kMaxCases], outside_ms[kMaxCases];
    double gemm_flops[kMaxCases], attention_flops[kMaxCases]; /* the block's: 3x its forward's */
    double gemm_floor_ms[kMaxCases], attention_floor_ms[kMaxCases], floor_ms[kMaxCases];
    double outside_floor_ms[kMaxCases];       /* the embedders', refiner's and head's GEMMs, the refiner's attention */
} mmdit_results;

static int compare_int64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The rows the floor's rates are measured at (the gemm and attention sections' S): every micro-batch's video and
   caption rows, every sample's joint length N = S + L and Qwen rows (the refiner's attention) where they are at most
   kMaxSeq distinct values, else kMaxSeq values evenly spaced in log rows from the least of them to the most. */
static int mmdit_floor_rows(const bench_options *o, int64_t rows[kMaxSeq])
{
    int64_t points[4 * kMaxCases];
    int n = 0;
    for (int i = 0; i < o->n_cases; ++i) {
        const mmdit_case *c = &o->cases[i];
        const int64_t L = c->L + c->text_2 + c->image;
        points[n++] = c->samples * c->S;
        points[n++] = c->samples * L;
        points[n++] = c->S + L;
        points[n++] = c->L;
    }
    qsort(points, (size_t)n, sizeof points[0], compare_int64);
    int distinct = 0;
    for (int i = 0; i < n; ++i)
        if (distinct == 0 || points[i] != points[distinct - 1]) points[distinct++] = points[i];
    if (distinct <= kMaxSeq) {
        memcpy(rows, points, (size_t)distinct * sizeof *rows);
        return distinct;
    }
    const double low = log((double)points[0]), high = log((double)points[distinct - 1]);
    for (int i = 0; i < kMaxSeq; ++i) rows[i] = (int64_t)llround(exp(low + (high - low) * i / (kMaxSeq - 1)));
    rows[0] = points[0];
    rows[kMaxSeq - 1] = points[distinct - 1];
    return kMaxSeq;
}

/* ys at x: piecewise linear in log x through the n points (xs ascending), held at the ends (tests/bench/
   train_table.py's interpolate, which the epoch's floor uses). */
static double interpolate_log(const int64_t *xs, const double *ys, int n, double x)
{
    if (x <= (double)xs[0]) return ys[0];
    for (int i = 1; i < n; ++i)
        if (x <= (double)xs[i]) {
            const double t = (log(x) - log((double)xs[i - 1])) / (log((double)xs[i]) - log((double)xs[i - 1]));
            return ys[i - 1] + t * (ys[i] - ys[i - 1]);
        }
    return ys[n - 1];
}

/* The floor's rates at the rows `f` (the gemm and attention sections' options) measured: the MMDiT stream's GEMMs
   (4 of dim x dim: the gemm section's layer 0; MLP up and down: its layers 2 and 3), forward and both backward, in
   TFLOP/s; self-attention forward+backward seconds per forward FLOP of the fastest backend. */
static void mmdit_floor_rates(const bench_options *f, const gemm_results *gemm, const attention_results *attn,
                              mmdit_results *r)
{
    const int d = f->wan->dim, ffn = f->wan->ffn_dim;
    r->n_floor = f->n_seq;
    for (int i = 0; i < f->n_seq; ++i) {
        const int64_t rows = f->seq[i];
        double ms = 0.0;
        for (int op = 0; op < kGemmOps; ++op) ms += 4.0 * gemm->ms[i][0][op] + gemm->ms[i][2][op] + gemm->ms[i][3][op];
        const double flops = 3.0 * (4.0 * gemm_linear_flops(rows, d, d) + gemm_linear_flops(rows, d, ffn) +
                                    gemm_linear_flops(rows, ffn, d));
        r->floor_rows[i] = rows;
        r->floor_gemm_tflops[i] = tflops(flops, ms);
        const double attention_ms = fastest_attention_ms(attn, i, 0);
        if (attention_ms <= 0.0)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "aldit-bench: mmdit: no attention backend timed at %lld rows (--backends "
                             "%s): the floor needs one", (long long)rows, f->attention_backends);
        r->floor_self_spf[i] = 1e-3 * attention_ms / attn->flops[i][0][0];
    }
}

/* Milliseconds of `flops` GEMM FLOPs at the floor's rate for `rows` rows. */
static double mmdit_gemm_floor_ms(const mmdit_results *r, double flops, double rows)
{
    return flops / (1e9 * interpolate_log(r->floor_rows, r->floor_gemm_tflops, r->n_floor, rows));
}

/* Milliseconds of one self-attention forward+backward over n rows (dim wide) at the floor's rate; *fwd_flops its
   forward's FLOPs. */
static double mmdit_attention_floor_ms(const mmdit_results *r, double n, int dim, double *fwd_flops)
{
    *fwd_flops = 4.0 * n * n * dim;
    return 1e3 * *fwd_flops * interpolate_log(r->floor_rows, r->floor_self_spf, r->n_floor, n);
}

/* A latent grid (frames, rows, columns after the 1x1x1 patch) of S tokens: HunyuanVideo-1.5's shapes where S is one
   of them (images of 256, 512 and 1024 pixels; 480p and 720p 65-frame videos: 17 latent frames), else block_grid's. */
static void mmdit_grid(int64_t S, int64_t grid[3])
{
    static const int64_t known[][3] = {{1, 16, 16}, {1, 32, 32}, {1, 64, 64}, {17, 30, 32}, {17, 45, 80}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; ++i)
        if (known[i][0] * known[i][1] * known[i][2] == S) {
            memcpy(grid, known[i], sizeof known[i]);
            return;
        }
    block_grid(S, grid);
}

/* One mmdit case's micro-batch: `samples` alike samples (latents out_dim x F x H x W, noise, Qwen, ByT5 and image
   rows), random normal values, text-to-video. */
typedef struct {
    int32_t *frames, *height, *width, *text_len, *text_2_len, *image_len;
    float *sigma, *latents, *noise, *text, *text_2, *image;
    model_batch batch;
} mmdit_batch;

static float *random_normal_floats(size_t n, uint64_t *rng)
{
    float *values = xmalloc((n > 0 ? n : 1) * sizeof *values);
    for (size_t i = 0; i < n; ++i) values[i] = (float)rng_normal(rng);
    return values;
}

static void make_mmdit_batch(const model *m, const mmdit_case *c, uint64_t seed, mmdit_batch *b)
{
    const size_t B = (size_t)c->samples;
    int64_t grid[3];
    mmdit_grid(c->S, grid);
    int32_t **counts[] = {&b->frames, &b->height, &b->width, &b->text_len, &b->text_2_len, &b->image_len};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) *counts[i] = xmalloc(B * sizeof(int32_t));
    b->sigma = xmalloc(B * sizeof *b->sigma);
    for (size_t s = 0; s < B; ++s) {
        b->frames[s] = (int32_t)grid[0] * m->patch_t;
        b->height[s] = (int32_t)grid[1] * m->patch_h;
        b->width[s] = (int32_t)grid[2] * m->patch_w;
        b->text_len[s] = c->L, b->text_2_len[s] = c->text_2, b->image_len[s] = c->image;
        b->sigma[s] = 0.5f;
    }
    const size_t n_latent = B * (size_t)m->out_dim * (size_t)b->frames[0] * (size_t)b->height[0] * (size_t)b->width[0];
    uint64_t rng = seed;
    b->latents = random_normal_floats(n_latent, &rng);
    b->noise = random_normal_floats(n_latent, &rng);
    b->text = random_normal_floats(B * (size_t)c->L * (size_t)m->text_dim, &rng);
    b->text_2 = random_normal_floats(B * (size_t)c->text_2 * (size_t)m->text_2_dim, &rng);
    b->image = random_normal_floats(B * (size_t)c->image * (size_t)m->image_dim, &rng);
    b->batch = (model_batch){.n_samples = c->samples, .frames = b->frames, .height = b->height, .width = b->width,
                             .text_len = b->text_len, .latents = b->latents, .noise = b->noise, .sigma = b->sigma,
                             .text = b->text, .sp_size = 1, .text_2_len = b->text_2_len, .image_len = b->image_len,
                             .text_2 = b->text_2, .image = b->image};
}

static void free_mmdit_batch(mmdit_batch *b)
{
    void *arrays[] = {b->frames, b->height, b->width, b->text_len, b->text_2_len, b->image_len, b->sigma,
                      b->latents, b->noise, b->text, b->text_2, b->image};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; ++i) free(arrays[i]);
}

/* The mmdit section's models: inputs/hunyuanvideo15-8layers.ini's dims with 1 and 1 + K blocks, text_len the longest
   caption of the cases (at least the deck's 1000). */
static void make_mmdit_models(const bench_options *o, model layers[2])
{
    deck config;
    deck_defaults(&config);
    config.model.family = FAMILY_HUNYUANVIDEO15;
    config.model.text_padding = TEXT_PADDING_TRIM;
    config.model.dim = kHv15Widths->dim;
    config.model.ffn_dim = kHv15Widths->ffn_dim;
    config.model.num_heads = kHv15Widths->heads;
    config.model.in_dim = 65;
    config.model.out_dim = 32;
    config.model.patch_t = config.model.patch_h = config.model.patch_w = 1;
    config.model.text_len = 1000;
    for (int i = 0; i < o->n_cases; ++i)
        config.model.text_len = o->cases[i].L > config.model.text_len ? o->cases[i].L : config.model.text_len;
    config.model.text_dim = 3584;
    config.model.text_2_dim = 1472;
    config.model.image_dim = 1152;
    config.model.rope_axes_t = 16;
    config.model.freq_dim = 256;
    config.model.eps = 1e-6f;
    make_layer_models(&config, o->block_layers, layers);
}

/* Case i's floors (per block: its GEMMs of both streams and its joint attention; outside the blocks: the embedders',
   refiner's and head's GEMMs and the refiner's attention over each sample's Qwen rows) and FLOPs, from the layout's
   FLOP counts (model_layout_gemm_flops of the 1-layer model: its blocks' counts are one block's; outside the blocks
   it counts every text-row Linear, the ByT5 and image embedders' too, per row of the joint text, as the epoch's floor
   in tests/bench/train_table.py does) and r's rates. */
static void mmdit_case_floor(const model *one, const mmdit_case *c, int i, mmdit_results *r)
{
    const layout_gemm_flops lf = model_layout_gemm_flops(&one->layout);
    const double Tv = (double)r->video_rows[i], Tt = (double)r->text_rows[i];
    const double video = 3.0 * lf.block_per_token * Tv, text = 3.0 * lf.block_per_text * Tt;
    r->gemm_flops[i] = video + text;
    r->gemm_floor_ms[i] = mmdit_gemm_floor_ms(r, video, Tv) + mmdit_gemm_floor_ms(r, text, Tt);
    double fwd_flops = 0.0;
    const double joint_ms = mmdit_attention_floor_ms(r, (double)(c->S + c->L + c->text_2 + c->image), one->dim,
                                                     &fwd_flops);
    r->attention_flops[i] = 3.0 * c->samples * fwd_flops;
    r->attention_floor_ms[i] = c->samples * joint_ms;
    r->floor_ms[i] = r->gemm_floor_ms[i] + r->attention_floor_ms[i];
    const double refiner_ms = mmdit_attention_floor_ms(r, (double)c->L, one->dim, &fwd_flops);
    r->outside_floor_ms[i] = mmdit_gemm_floor_ms(r, 3.0 * lf.outside_per_token * Tv, Tv) +
                             mmdit_gemm_floor_ms(r, 3.0 * (lf.outside_per_text * Tt + lf.outside_per_sample * c->samples),
                                                 Tt) +
                             LAYOUT_MMDIT_REFINER_LAYERS * c->samples * refiner_ms;
}

/* The MMDiT block forward+backward of every case, against its floor, and the step outside the blocks: the gemm and
   attention sections at hv15 widths on mmdit_floor_rows (their tables printed as theirs), then per case the 1-layer
   and (1 + K)-layer steps timed in turn (time_steps_alternating), as the block section. */
static void run_mmdit_section(const bench_options *o, cudaStream_t stream, mmdit_results *r)
{
    const int K = o->block_layers;
    bench_options f = *o;   /* the floor's sections: hv15 widths on the floor's rows */
    f.wan = kHv15Widths;
    f.n_seq = mmdit_floor_rows(o, f.seq);
    printf("MMDiT floor rates: the gemm and attention sections at HunyuanVideo-1.5's widths on rows");
    for (int i = 0; i < f.n_seq; ++i) printf("%s%lld", i ? ", " : " ", (long long)f.seq[i]);
    printf(":\n");
    static gemm_results gemm;
    static attention_results attn;
    run_gemm_section(&f, stream, &gemm);
    run_attention_section(&f, stream, &attn);
    mmdit_floor_rates(&f, &gemm, &attn, r);

    model layers[2];
    make_mmdit_models(o, layers);
    const model *deep = &layers[1];
    printf("HunyuanVideo-1.5 MMDiT block forward+backward (dim %d, ffn %d, %d heads of %d; recompute none, bf16;\n"
           "  case [Bx]S:L[:T2[:I]] = B samples of S video tokens, L Qwen, T2 ByT5, I image rows; block = (%d-layer step -\n"
           "  1-layer step) / %d, medians of steps timed in turn; TFLOP/s over 3x the forward's FLOPs; floor = the block's\n"
           "  GEMMs of both streams + its joint attention over N = S + L per sample forward+backward, at the rates above):\n",
           deep->dim, deep->ffn_dim, deep->num_heads, deep->dim / deep->num_heads, 1 + K, K);
    char deep_label[24];
    snprintf(deep_label, sizeof deep_label, "%d-layer", 1 + K);
    printf("%-18s %7s %7s %9s %9s %9s %8s | %8s %8s %9s %11s %8s\n", "case", "video", "text", "1-layer", deep_label,
           "block ms", "TFLOP/s", "GEMM ms", "attn ms", "floor ms", "block/floor", "floor %");
    for (int i = 0; i < o->n_cases; ++i) {
        const mmdit_case *c = &o->cases[i];
        char label[96];
        mmdit_case_label(c, label, sizeof label);
        r->video_rows[i] = c->samples * c->S;
        r->text_rows[i] = (int64_t)c->samples * (c->L + c->text_2 + c->image);
        mmdit_case_floor(&layers[0], c, i, r);
        size_t free_bytes = 0, total_bytes = 0;
        gpu_memory_info(&free_bytes, &total_bytes);
        const size_t need = gpu_model_workspace_bytes(deep, r->video_rows[i], c->samples, r->text_rows[i]) +
                            gpu_model_workspace_bytes(&layers[0], r->video_rows[i], c->samples, r->text_rows[i]) +
                            10 * (size_t)(deep->n_weights + layers[0].n_weights) + kBlockMemoryMargin;
        r->need_bytes[i] = (double)need;
        r->free_bytes[i] = (double)free_bytes;
        r->skipped[i] = need > free_bytes;
        if (r->skipped[i]) {
            printf("%-18s skipped: needs %.1f GiB (1- and %d-layer models, recompute none, + %.0f GiB margin), %.1f GiB "
                   "free\n", label, need / kGiB, 1 + K, kBlockMemoryMargin / kGiB, free_bytes / kGiB);
            continue;
        }
        mmdit_batch batch;
        make_mmdit_batch(deep, c, rng_hash(0x33d17001ull, (uint64_t)i), &batch);
        step_context steps[2];
        for (int l = 0; l < 2; ++l) {
            steps[l] = (step_context){gpu_model_create(&layers[l], r->video_rows[i], c->samples, r->text_rows[i]),
                                      &batch.batch, 0.0};
            gpu_model_set_autotune(steps[l].gm, o->gemm_autotune, o->attention_autotune);
            gpu_model_upload_weights(steps[l].gm, layers[l].weights);
        }
        time_steps_alternating(steps, o, stream, r->step_ms[i]);
        if (o->profile_step) { /* as the block section's: a profiler started with capture off sees this step only */
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaProfilerStart());
            run_model_step(&steps[1], stream);
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaProfilerStop());
        }
        for (int l = 0; l < 2; ++l) gpu_model_free(steps[l].gm);
        free_mmdit_batch(&batch);
        r->block_ms[i] = (r->step_ms[i][1] - r->step_ms[i][0]) / K;
        r->outside_ms[i] = r->step_ms[i][0] - r->block_ms[i];
        const double flops = r->gemm_flops[i] + r->attention_flops[i];
        printf("%-18s %7lld %7lld %9.3f %9.3f %9.3f %8.1f | %8.3f %8.3f %9.3f %11.3f %7.1f%%\n", label,
               (long long)r->video_rows[i], (long long)r->text_rows[i], r->step_ms[i][0], r->step_ms[i][1],
               r->block_ms[i], tflops(flops, r->block_ms[i]), r->gemm_floor_ms[i], r->attention_floor_ms[i],
               r->floor_ms[i], r->block_ms[i] / r->floor_ms[i], 100.0 * r->floor_ms[i] / r->block_ms[i]);
    }
    printf("Outside the blocks (1-layer step - block: token refiner, caption embedders, time path, patch embedding, head,\n"
           "  loss, the batch's staging; floor: their GEMMs at the rates above, the refiner's attention over each\n"
           "  sample's Qwen rows) and the %d-layer step of inputs/hunyuanvideo15-8layers.ini (outside + %d blocks):\n",
           kHv15Layers, kHv15Layers);
    char step_label[24];
    snprintf(step_label, sizeof step_label, "%d-layer ms", kHv15Layers);
    printf("%-18s %11s %11s %8s | %12s %12s %8s\n", "case", "outside ms", "floor ms", "floor %", step_label,
           "floor ms", "floor %");
    for (int i = 0; i < o->n_cases; ++i) {
        if (r->skipped[i]) continue;
        char label[96];
        mmdit_case_label(&o->cases[i], label, sizeof label);
        const double step = r->outside_ms[i] + kHv15Layers * r->block_ms[i];
        const double floor = r->outside_floor_ms[i] + kHv15Layers * r->floor_ms[i];
        printf("%-18s %11.3f %11.3f %7.1f%% | %12.3f %12.3f %7.1f%%\n", label, r->outside_ms[i],
               r->outside_floor_ms[i], 100.0 * r->outside_floor_ms[i] / r->outside_ms[i], step, floor,
               100.0 * floor / step);
    }
    printf("  (floor %%: floor / measured, the epoch's measure in docs/PERFORMANCE.md: 76.5%% for the 8-layer epoch.)\n");
    model_free(&layers[0]);
    model_free(&layers[1]);
}

/* The mmdit section's figures: ", \"mmdit\": {...}" (the floor's rates, then one entry per case). */
static void write_mmdit_json(FILE *json, const bench_options *o, const mmdit_results *r)
{
    fprintf(json, ", \"mmdit\": {\"dim\": %d, \"ffn_dim\": %d, \"heads\": %d, \"block_layers\": %d, \"floor\": [",
            kHv15Widths->dim, kHv15Widths->ffn_dim, kHv15Widths->heads, o->block_layers);
    for (int i = 0; i < r->n_floor; ++i)
        fprintf(json, "%s\n  {\"rows\": %lld, \"gemm_tflops\": %.2f, \"self_attention_tflops\": %.2f}", i ? "," : "",
                (long long)r->floor_rows[i], r->floor_gemm_tflops[i], 3.5 / r->floor_self_spf[i] / 1e12);
    fprintf(json, "\n], \"cases\": [");
    for (int i = 0; i < o->n_cases; ++i) {
        const mmdit_case *c = &o->cases[i];
        fprintf(json, "%s\n  {\"samples\": %d, \"S\": %lld, \"L\": %d, \"text_2\": %d, \"image\": %d, "
                "\"video_rows\": %lld, \"text_rows\": %lld, \"gemm_gflop\": %.2f, \"attention_gflop\": %.2f, "
                "\"gemm_floor_ms\": %.4f, \"attention_floor_ms\": %.4f, \"floor_ms\": %.4f, "
                "\"outside_floor_ms\": %.4f, \"need_gib\": %.2f, \"free_gib\": %.2f", i ? "," : "", c->samples,
                (long long)c->S, c->L, c->text_2, c->image, (long long)r->video_rows[i], (long long)r->text_rows[i],
                r->gemm_flops[i] / 1e9, r->attention_flops[i] / 1e9, r->gemm_floor_ms[i], r->attention_floor_ms[i],
                r->floor_ms[i], r->outside_floor_ms[i], r->need_bytes[i] / kGiB, r->free_bytes[i] / kGiB);
        if (r->skipped[i])
            fprintf(json, ", \"skipped\": true}");
        else
            fprintf(json, ", \"one_layer_ms\": %.4f, \"deep_step_ms\": %.4f, \"block_ms\": %.4f, \"outside_ms\": %.4f, "
                    "\"tflops\": %.2f, \"block_over_floor\": %.4f, \"layers8_ms\": %.4f, \"layers8_floor_ms\": %.4f}",
                    r->step_ms[i][0], r->step_ms[i][1], r->block_ms[i], r->outside_ms[i],
                    tflops(r->gemm_flops[i] + r->attention_flops[i], r->block_ms[i]), r->block_ms[i] / r->floor_ms[i],
                    r->outside_ms[i] + kHv15Layers * r->block_ms[i],
                    r->outside_floor_ms[i] + kHv15Layers * r->floor_ms[i]);
    }
    fprintf(json, "\n]}");
}

/* Writes the figures to `json` (opened at the start, so that a bad path fails before the measurements) and closes it. */
static void write_json(FILE *json, const bench_options *o, const char *device, double copy_gbs,
                       double lnmod[kMaxDims][kLnmodOps][2], const gemm_results *gemm, const attention_results *attn,
                       const block_results *block, const split_results *split, const mmdit_results *mmdit)
{
    fprintf(json, "{\"device\": \"%s\", \"copy_gbs\": %.1f, \"wan\": \"%s\", \"dim\": %d, \"ffn_dim\": %d, "
            "\"heads\": %d", device, copy_gbs, o->wan->name, o->wan->dim, o->wan->ffn_dim, o->wan->heads);
    if (o->run_lnmod) {
        fprintf(json, ", \"samples\": %d, \"rows_per_sample\": %lld, \"lnmod\": [", o->n_samples,
                (long long)o->rows_per_sample);
        for (int d = 0; d < o->n_dims; ++d)
            for (int s = 0; s < kLnmodOps; ++s)
                fprintf(json, "%s\n  {\"dim\": %d, \"op\": \"%s\", \"ms\": %.5f, \"gbs\": %.1f, \"pct_copy\": %.1f}",
                        d || s ? "," : "", o->dims[d], kLnmodSpecs[s].name, lnmod[d][s][0], lnmod[d][s][1],
                        100.0 * lnmod[d][s][1] / copy_gbs);
        fprintf(json, "\n]");
    }
    if (o->run_gemm) {
        fprintf(json, ", \"gemm_autotune\": %d, \"gemm_unfused_calls\": %lld, "
                "\"text_rows\": %d, \"gemm\": [", o->gemm_autotune, (long long)gemm->unfused_calls,
                o->text_rows);
        int first = 1;
        wan_linear specs[kWanLinears];
        wan_linears(o->wan, specs);
        for (int si = 0; si < o->n_seq; ++si)
            for (int l = 0; l < kWanLinears; ++l) {
                const wan_linear *spec = &specs[l];
                const int64_t rows = spec->on_text ? o->text_rows : o->seq[si];
                const double flops = gemm_linear_flops(rows, spec->in_dim, spec->out_dim);
                for (int op = 0; op < kGemmOps; ++op, first = 0)
                    fprintf(json, "%s\n  {\"S\": %lld, \"layer\": \"%s\", \"per_block\": %d, \"rows\": %lld, \"in\": %d, "
                            "\"out\": %d, \"op\": \"%s\", \"ms\": %.5f, \"tflops\": %.2f}", first ? "" : ",",
                            (long long)o->seq[si], spec->name, spec->per_block, (long long)rows, spec->in_dim,
                            spec->out_dim, kGemmOpNames[op], gemm->ms[si][l][op], tflops(flops, gemm->ms[si][l][op]));
            }
        fprintf(json, "\n], \"gemm_block\": [");
        for (int si = 0; si < o->n_seq; ++si) {
            const double ms = gemm->block_ms[si][0] + gemm->block_ms[si][1];
            const double flops = gemm->block_flops[si][0] + gemm->block_flops[si][1];
            fprintf(json, "%s\n  {\"S\": %lld, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"ms\": %.4f, \"tflop\": %.4f, "
                    "\"tflops\": %.2f}", si ? "," : "", (long long)o->seq[si], gemm->block_ms[si][0],
                    gemm->block_ms[si][1], ms, flops / 1e12, tflops(flops, ms));
        }
        fprintf(json, "\n], \"gemm_square\": {\"n\": %d, \"ms\": %.5f, \"tflops\": %.2f}", kSquare, gemm->square_ms,
                tflops(gemm_linear_flops(kSquare, kSquare, kSquare), gemm->square_ms));
    }
    if (o->run_attention) {
        fprintf(json, ", \"attention_heads\": %d, \"attention_head_dim\": %d, \"attention\": [", o->wan->heads,
                o->wan->head_dim);
        int first = 1;
        for (int si = 0; si < o->n_seq; ++si)
            for (int kind = 0; kind < kAttentionKinds; ++kind)
                for (size_t b = 0; b < ATTENTION_BACKENDS; ++b) {
                    if (!attn->measured[si][b][kind]) continue;
                    const double *ms = attn->ms[si][b][kind], *flops = attn->flops[si][kind];
                    fprintf(json, "%s\n  {\"S\": %lld, \"kind\": \"%s\", \"backend\": \"%s\", \"kv_rows\": %lld, "
                            "\"fwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.2f, "
                            "\"fwd_bwd_tflops\": %.2f}", first ? "" : ",", (long long)o->seq[si], kAttentionKindNames[kind],
                            kAttentionBackends[b].name, (long long)(kind == 0 ? o->seq[si] : o->text_rows), ms[0],
                            tflops(flops[0], ms[0]), ms[1], tflops(flops[1], ms[1]),
                            tflops(flops[0] + flops[1], ms[0] + ms[1]));
                    first = 0;
                }
        fprintf(json, "\n]");
    }
    if (o->run_block) {
        fprintf(json, ", \"block\": [");
        for (int si = 0; si < o->n_seq; ++si) {
            fprintf(json, "%s\n  {\"S\": %lld, \"grid\": [%lld, %lld, %lld], \"gflop\": %.2f, \"need_gib\": %.2f, "
                    "\"free_gib\": %.2f", si ? "," : "", (long long)o->seq[si], (long long)block->grid[si][0],
                    (long long)block->grid[si][1], (long long)block->grid[si][2], block->flops[si] / 1e9,
                    block->need_bytes[si] / kGiB, block->free_bytes[si] / kGiB);
            if (block->skipped[si])
                fprintf(json, ", \"skipped\": true}");
            else
                fprintf(json, ", \"block_layers\": %d, \"one_layer_ms\": %.4f, \"deep_step_ms\": %.4f, \"ms\": %.4f, "
                        "\"tflops\": %.2f, "
                        "\"gemm_ms\": %.4f, \"self_attention_ms\": %.4f, \"cross_attention_ms\": %.4f, "
                        "\"floor_ms\": %.4f, \"over_floor_pct\": %.2f}", o->block_layers, block->step_ms[si][0],
                        block->step_ms[si][1],
                        block->block_ms[si], tflops(block->flops[si], block->block_ms[si]), block->gemm_ms[si],
                        block->self_ms[si], block->cross_ms[si], block->floor_ms[si],
                        100.0 * (block->block_ms[si] / block->floor_ms[si] - 1.0));
        }
        fprintf(json, "\n]");
    }
    if (o->run_split) {
        fprintf(json, ", \"split\": [");
        int first = 1;
        for (int si = 0; si < o->n_seq; ++si)
            for (int ki = 0; ki < o->n_split; ++ki, first = 0) {
                fprintf(json, "%s\n  {\"S\": %lld, \"k\": %d, \"rows\": %lld, \"heads\": %d, \"exchange_bytes\": %.0f",
                        first ? "" : ",", (long long)o->seq[si], o->split_k[ki], (long long)split->rows[si][ki],
                        o->wan->heads / o->split_k[ki], split->exchange_bytes[si][ki]);
                if (split->skipped[si][ki]) fprintf(json, ", \"skipped\": true}");
                else
                    fprintf(json, ", \"block_layers\": %d, \"one_layer_ms\": %.4f, \"deep_step_ms\": %.4f, "
                            "\"member_ms\": %.4f}", o->block_layers, split->step_ms[si][ki][0],
                            split->step_ms[si][ki][1], split->member_ms[si][ki]);
            }
        fprintf(json, "\n]");
    }
    if (o->run_mmdit) write_mmdit_json(json, o, mmdit);
    fprintf(json, "}\n");
    if (fclose(json)) ALDIT_FATAL("--json %s: writing failed", o->json_path);
}

/* The (1 + K)-layer model's step on zero weights and data against random ones, in turn (time_steps_alternating). */
static void run_zeros_section(const bench_options *o, cudaStream_t stream)
{
    model layers[2];
    make_block_models(o, layers);
    const model *deep = &layers[1];
    float *zeros = xcalloc((size_t)deep->n_weights, sizeof(float));
    printf("Wan-%s %d-layer step (dim %d, ffn %d, %d heads; one sample of S tokens, %d text tokens): zero weights and\n"
           "  data against random ones, timed in turn (medians):\n%-6s %12s %12s %14s\n", o->wan->name, deep->num_layers,
           deep->dim, deep->ffn_dim, deep->num_heads, o->text_rows, "S", "zeros ms", "random ms", "zeros / random");
    for (int si = 0; si < o->n_seq; ++si) {
        const int64_t S = o->seq[si];
        int64_t grid[3];
        block_grid(S, grid);
        size_t free_bytes = 0, total_bytes = 0;
        gpu_memory_info(&free_bytes, &total_bytes);
        const size_t need = 2 * (gpu_model_workspace_bytes(deep, S, 1, 0) + 10 * (size_t)deep->n_weights) +
                            kBlockMemoryMargin;
        if (need > free_bytes) {
            printf("%-6lld skipped: needs %.1f GiB, %.1f GiB free\n", (long long)S, need / kGiB, free_bytes / kGiB);
            continue;
        }
        bench_sample samples[2];
        step_context steps[2];
        for (int z = 0; z < 2; ++z) {   /* steps[0]: zeros, steps[1]: random */
            make_sample(deep, grid, o->text_rows, z == 0, rng_hash(0xb10c0002ull, (uint64_t)S), &samples[z]);
            steps[z] = (step_context){gpu_model_create(deep, S, 1, 0), &samples[z].batch, 0.0};
            gpu_model_set_autotune(steps[z].gm, o->gemm_autotune, o->attention_autotune);
            gpu_model_upload_weights(steps[z].gm, z == 0 ? zeros : deep->weights);
        }
        double ms[2];
        time_steps_alternating(steps, o, stream, ms);
        printf("%-6lld %12.3f %12.3f %14.3f\n", (long long)S, ms[0], ms[1], ms[0] / ms[1]);
        for (int z = 0; z < 2; ++z) {
            gpu_model_free(steps[z].gm);
            free_sample(&samples[z]);
        }
    }
    free(zeros);
    model_free(&layers[0]);
    model_free(&layers[1]);
}

int main(int argc, char **argv)
{
    const bench_options o = parse_options(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows show up as they are measured, also through a pipe */
    FILE *json = NULL;
    if (o.json_path && !(json = fopen(o.json_path, "w")))
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "--json %s: cannot open for writing", o.json_path);
    if (gpu_count() == 0) {
        fprintf(stderr, "aldit-bench: no GPU visible (cudaGetDeviceCount found none)\n");
        return ALDIT_EXIT_ERROR;
    }
    gpu_select(0);
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
    static double lnmod_results[kMaxDims][kLnmodOps][2];
    static gemm_results gemm;
    static attention_results attention;
    static block_results block;
    static split_results split;
    static mmdit_results mmdit;
    if (o.run_lnmod) run_lnmod_section(&o, copy_gbs, stream, lnmod_results);
    if (o.run_gemm) run_gemm_section(&o, stream, &gemm);
    if (o.run_attention) run_attention_section(&o, stream, &attention);
    if (o.run_block) run_block_section(&o, &gemm, &attention, stream, &block);
    if (o.run_split) run_split_section(&o, stream, &split);
    if (o.run_zeros) run_zeros_section(&o, stream);
    if (o.run_mmdit) run_mmdit_section(&o, stream, &mmdit);
    CUDA_CHECK(cudaStreamDestroy(stream));
    if (json) write_json(json, &o, device, copy_gbs, lnmod_results, &gemm, &attention, &block, &split, &mmdit);
    return 0;
}
