/* backend_cuda.c — the CUDA backend: GPU choice, memory budget and GPU-model capacity, device state, a step's forward/backward, all-reduce, clip, AdamW and the weights' EMA, start-up timings. */
#include "config.h"
#include "cuda/backend_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"
#include "balance/balance.h"
#include "balance/calibration.h"
#include "balance/costmodel.h"
#include "cuda/fp8.h"
#include "cuda/fused.h"
#include "cuda/gemm.h"
#include "cuda/gpu.h"
#include "cuda/gradsync.h"
#include "cuda/kernels_misc.h"
#include "cuda/model_gpu.h"
#include "cuda/seqpar_gpu.h"
#include "cuda/shard_gpu.h"
#ifdef HAVE_CUDNN
#include "cuda/attention_cudnn.h"
#endif

/* Device memory kept back besides the plan: cuBLASLt's workspaces (one per stream) and the GEMM scratch, kernels loaded
   lazily at their first launch, and NCCL's buffers for connections made at the first all-reduce. */
#define RUNTIME_RESERVE_BYTES (1024.0 * 1024.0 * 1024.0)

/* The GPU model takes at most this many samples per micro-batch (gpu_model_create). */
#define GPU_MAX_SAMPLES 65535
/* the start-up timing's random weights and data (fill_timing_weights, room_for) */
#define TIMING_SEED 0x71A1ull

/* How a rank's GPU memory is used. mem_budget and the capacity are the same on every rank. */
typedef struct {
    int device;                   /* GPU index of this rank: node-local rank mod the GPUs visible */
    char description[160];        /* gpu_describe() of that GPU */
    int ranks_per_gpu;            /* ranks of this node on that GPU (they share its memory evenly) */
    double free_bytes;            /* free device memory per rank when planned, smallest over ranks */
    int offline;                  /* planned without a GPU: free_bytes is balance.device_mem */
    double state_bytes;           /* the training state in [train] shard's mode (model_layout_state_bytes) */
    double reserve_bytes;         /* kept for cuBLASLt, lazily loaded kernels and NCCL's buffers */
    double mem_budget;            /* activation bytes per rank the balancer plans with (its cost model's bytes) */
    int budget_measured;          /* 1: derived from free memory less [balance] mem_margin; 0: [balance] mem_budget */
    /* Capacity of the GPU model: every micro-batch the balancer can form under mem_budget fits it. */
    int64_t max_tokens, max_text;
    int max_samples;
    double workspace_bytes;       /* the GPU model's activation workspace at that capacity ([train] recompute) */
    double attention_buffer_bytes; /* cuDNN attention's own buffer for the longest sample (0 without cuDNN) */
    double split_bytes;           /* kept for a sequence-parallel group's buffers (split_reserve; 0 without groups) */
    int64_t cudnn_min_tokens;     /* self-attention of samples this long runs on cuDNN; 0: never (a run sets it) */
} gpu_plan;

/* A run of consecutive parameters with the same weight decay: one AdamW launch. */
typedef struct { int64_t offset, n_values; int decays; } adamw_run;

typedef struct {
    const deck *config;
    const model *host;
    gpu_plan plan;
    backend_plan summary;         /* what backend_ops.plan reports; its memory model is the balancer's */
    cost_model cm;                /* the balancer's memory model: the GPU model's formula (use_gpu_memory) */
    gradsync *sync;
    seqpar_gpu *seqpar;           /* the sequence-parallel groups' NCCL communicators (split from sync's) */
    gpu_model *net;
    gpu_model_buffers buffers;
    float *adam_m, *adam_v;       /* device, n_weights each (mode none) */
    float *ema;                   /* device, as the moments: the master's EMA ([train] ema_decay; else NULL; mode none) */
    int ema_set;                  /* set_range gave the EMA (else start copies the master) */
    int ema_in_use;               /* between use_ema(1) and use_ema(0): the model computes with the EMA */
    shard_layout layout;          /* the values of each state array this rank holds (shard.h's units) */
    shard_gpu *shard;             /* [train] shard = optimizer, gradients, full: the state (NULL in mode none) */
    double *sumsq, *grad_norm;    /* device scalars */
    float *clip_scale;            /* device: the clip factor AdamW reads */
    void *sumsq_workspace;
    double *grad_norm_host;       /* pinned */
    float *fp8_amax_host;         /* pinned [fp8_amax_count]: the step's FP8 amaxes, max-reduced over the ranks */
    double *fp8_amax_max;         /* [fp8_amax_count] */
    int fp8_amax_count;
    adamw_run *runs;
    int n_runs;
    cudaStream_t stream;
    cudaEvent_t optimizer_started, optimizer_done;
    /* the step's largest micro-batch by the memory model: its sizes, for mem_peak */
    double step_mem_estimate;
    int64_t step_tokens, step_text;
    int step_samples;
    int grads_reported;           /* the step's last micro-batch reported its gradient ranges to the sync */
    int rank, n_ranks;
    char key[192];                /* device_key: the GPU's description */
} train_gpu;

/* ---- planning -------------------------------------------------------------------------------------- */

/* Sizes of the largest micro-batch, each on its own (samples before the GPU model's limit), and the
   tokens of the longest sample. */
typedef struct { int64_t tokens, text, samples, longest; } capacity;

/* The balancer cuts each rank's samples into micro-batches whose summed cost_model_mem stays within the
   budget, and leaves out (or refuses) a sample over it on its own. So any sum of x_i over a micro-batch
   is at most budget * max_i(x_i / mem_i) over the samples that fit, and at most the store's total. */
static capacity capacity_for_budget(const cost_model *cm, const balance_sample *samples, int64_t n_samples,
                                    double budget)
{
    double tokens_per_byte = 0.0, text_per_byte = 0.0, samples_per_byte = 0.0;
    int64_t total_tokens = 0, total_text = 0, count = 0, longest = 1;
    for (int64_t i = 0; i < n_samples; i++) {
        double bytes = cost_model_mem(cm, samples[i].tokens, samples[i].text_len);
        if (bytes > budget) continue;
        if (samples[i].tokens > longest) longest = samples[i].tokens;
        tokens_per_byte = fmax(tokens_per_byte, samples[i].tokens / bytes);
        text_per_byte = fmax(text_per_byte, samples[i].text_len / bytes);
        samples_per_byte = fmax(samples_per_byte, 1.0 / bytes);
        total_tokens += samples[i].tokens;
        total_text += samples[i].text_len;
        count++;
    }
    const double slack = 1.0 + 1e-9; /* rounding in the balancer's running sums */
    capacity c = {
        .tokens = (int64_t)fmin(floor(budget * tokens_per_byte * slack), (double)total_tokens),
        .text = (int64_t)fmin(floor(budget * text_per_byte * slack), (double)total_text),
        .samples = (int64_t)fmin(floor(budget * samples_per_byte * slack), (double)count),
        .longest = longest,
    };
    /* the GPU model needs positive sizes (0 text rows would mean samples x text_len) */
    if (c.tokens < 1) c.tokens = 1;
    if (c.text < 1) c.text = 1;
    if (c.samples < 1) c.samples = 1;
    return c;
}

/* [train] recompute as the GPU model takes it. The balancer's memory model assumes [balance] recompute,
   which the deck requires to be the same, so capacity and workspace are planned for one mode. */
static gpu_recompute recompute_of(const deck *config)
{
    return config->train.recompute == RECOMPUTE_BLOCK ? GPU_RECOMPUTE_BLOCK : GPU_RECOMPUTE_NONE;
}

static double workspace_for(const deck *config, const model *table, capacity c)
{
    int samples = (int)(c.samples < GPU_MAX_SAMPLES ? c.samples : GPU_MAX_SAMPLES);
    return (double)gpu_model_workspace_bytes_with_recompute(table, c.tokens, samples, c.text, recompute_of(config));
}

/* cm's memory becomes the GPU backend's formula (model_layout_memory), which the GPU model sizes its workspace
   with: the balancer plans with the GPU model's exact bytes per sample, token and text row. */
static void use_gpu_memory(cost_model *cm, const deck *config)
{
    cost_model_set_memory(cm, config, LAYOUT_BACKEND_GPU);
}

/* cuDNN's attention keeps a buffer of its own outside the workspace, grown to the longest sample it
   serves: about 4 * num_heads * S * (head_dim + 1) bytes (attention_cudnn.h), S counting the rows up to the
   whole tile a last sample runs on, plus, for the cross-attention backward's query batches, 8 bytes per
   value of 8 copies of the text rows' keys. 0 where it cannot run. */
static double attention_buffer_for(const deck *config, const model *table, capacity c)
{
#ifdef HAVE_CUDNN
    if (config->train.attention != ATTENTION_OWN)
        return 4.0 * table->num_heads * (double)attention_cudnn_padded_rows(c.longest) * (table->head_dim + 1) +
               8.0 * ATTENTION_CUDNN_MOST_QUERY_BATCHES * (double)table->text_len * table->dim;
#else
    (void)config;
    (void)table;
    (void)c;
#endif
    return 0.0;
}

/* The GPU model's buffers of a sequence-parallel group (layout_gpu_split_bytes), which it keeps apart from the
   workspace: the most any sample the balancer may put on a group of k = 2 ... sp_max ranks under `budget` needs
   (a sample goes on a group of k only where its ceil(S / k) rows fit the budget, cost_model_mem_split; its buffers
   shrink as k grows, so for each k the longest such sample counts: by its tokens S, or for hunyuanvideo15 by its
   joint length S + L, the formula's length there). 0 where no group can form (sp_max 1, or a family that trains
   without groups, layout_family_sequence_parallel). */
static double split_reserve(const deck *config, const cost_model *cm, const model *table,
                            const balance_sample *samples, int64_t n_samples, double budget, int sp_max)
{
    double most = 0.0;
    if (!layout_family_sequence_parallel(table->family)) return 0.0;
    const int joint = table->family == FAMILY_HUNYUANVIDEO15;
    for (int k = 2; k <= sp_max; k *= 2) {
        int64_t longest = 0;
        for (int64_t i = 0; i < n_samples; i++) {
            const int64_t length = samples[i].tokens + (joint ? samples[i].text_len : 0);
            if (length > longest && cost_model_mem_split(cm, samples[i].tokens, samples[i].text_len, k) <= budget)
                longest = length;
        }
        if (longest > 0)
            most = fmax(most, (double)layout_gpu_split_bytes(&table->layout, config->train.recompute, longest, 1, k));
    }
    return most;
}

/* [train] precision = fp8: the GPU model's FP8 scratch, also outside the workspace (gpu_model_fp8_bytes); planned with
   the attention buffer. */
static double fp8_buffer_for(const deck *config, const model *table, capacity c)
{
    return config->train.precision == PRECISION_FP8
        ? (double)gpu_model_fp8_bytes(table, c.tokens, config->train.fp8_attention != FP8_ATTENTION_OFF) : 0.0;
}

/* 1 when the GPU model for the largest micro-batch under `budget`, and the group buffers it may need, fit
   `available` bytes. */
static int budget_fits(const deck *config, const cost_model *cm, const model *table, const balance_sample *samples,
                       int64_t n_samples, double budget, double available, int sp_max)
{
    capacity c = capacity_for_budget(cm, samples, n_samples, budget);
    return c.samples <= GPU_MAX_SAMPLES
           && workspace_for(config, table, c) + attention_buffer_for(config, table, c) + fp8_buffer_for(config, table, c) +
                      split_reserve(config, cm, table, samples, n_samples, budget, sp_max) <= available;
}

/* Ranks of this node whose node-local rank maps to `device` (as gpu_select maps them). */
static int ranks_on_device(const comm_info *info, int device)
{
    int n_gpus = gpu_count(), sharing = 0;
    for (int local = 0; local < info->n_local_ranks; local++)
        if (local % n_gpus == device) sharing++;
    return sharing > 0 ? sharing : 1;
}

static void select_device(const comm_info *info, gpu_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->device = gpu_select(info->local_rank);
    gpu_describe(plan->description, sizeof plan->description);
    plan->ranks_per_gpu = ranks_on_device(info, plan->device);
    int version = 0;
    ALDIT_CHECK(plan->ranks_per_gpu == 1 || gradsync_ranks_may_share_gpu(&version),
                "rank %d: %d ranks of this node share GPU %d (%d rank(s) per node, %d GPU(s) visible), which NCCL %d.%d.%d "
                "refuses: start one rank per GPU (mpirun -np <GPUs> or --map-by ppr:<GPUs>:node), or, for tests only, "
                "use NCCL 2.30.3 or later with NCCL_MULTI_RANK_GPU_ENABLE=1", info->rank, plan->ranks_per_gpu,
                plan->device, info->n_local_ranks, gpu_count(), version / 10000, version / 100 % 100, version % 100);
}

/* As select_device, for a plan without a GPU: one rank per GPU of balance.device_mem bytes, free. */
static void plan_without_device(const deck *config, gpu_plan *plan)
{
    char size[32];
    memset(plan, 0, sizeof *plan);
    plan->offline = 1;
    plan->ranks_per_gpu = 1;
    format_size(config->balance.device_mem, size, sizeof size);
    snprintf(plan->description, sizeof plan->description, "none on this node: planned as GPUs of balance.device_mem "
             "= %s each, one rank per GPU", size);
}

/* Collective, after select_device: the budget and capacity, the same on every rank. Returns 0 or
   ALDIT_EXIT_USAGE (rank 0 printed why). */
static int choose_shard(const deck *config, const comm_info *info, const cost_model *cm, const model *table,
                        const balance_sample *samples, int64_t n_samples, double usable, double reserve,
                        backend_plan *out);

static int plan_memory(const deck *config, const comm_info *info, const cost_model *cm, const model *table,
                       const balance_sample *samples, int64_t n_samples, gpu_plan *plan, backend_plan *out)
{
    const double gib = 1024.0 * 1024.0 * 1024.0;
    size_t free_bytes = 0, total_bytes = 0;
    if (plan->offline) free_bytes = (size_t)config->balance.device_mem;
    else gpu_memory_info(&free_bytes, &total_bytes);
    plan->free_bytes = (double)free_bytes / plan->ranks_per_gpu;
    comm_allreduce_min_f64(&plan->free_bytes, 1);
    plan->reserve_bytes = RUNTIME_RESERVE_BYTES;
    plan->budget_measured = config->balance.mem_budget <= 0.0;
    const double usable = plan->budget_measured ? plan->free_bytes * (1.0 - config->balance.mem_margin)
                                                : plan->free_bytes;
    if (choose_shard(config, info, cm, table, samples, n_samples, usable, plan->reserve_bytes, out) != 0)
        return ALDIT_EXIT_USAGE;
    plan->state_bytes = layout_state_total(&out->state);
    const double available = usable - plan->state_bytes - plan->reserve_bytes;
    const int sp_max = balance_sp_limit(config, info->n_ranks);
    if (plan->budget_measured) {
        /* the largest budget whose GPU model fits: the workspace grows with the budget, so bisect */
        double budget = 0.0;
        if (available > 0.0) {
            if (budget_fits(config, cm, table, samples, n_samples, available, available, sp_max)) budget = available;
            else {
                double low = 0.0, high = available;
                for (int i = 0; i < 64 && high - low > 1.0; i++) {
                    double middle = 0.5 * (low + high);
                    if (budget_fits(config, cm, table, samples, n_samples, middle, available, sp_max)) low = middle;
                    else high = middle;
                }
                budget = low;
            }
        }
        plan->mem_budget = floor(budget);
        comm_allreduce_min_f64(&plan->mem_budget, 1);
        if (!(plan->mem_budget > 0.0)) {
            if (info->rank == 0)
                fprintf(stderr, "aldit: error: no GPU memory left for activations: %.2f GiB free per rank (GPU %s), "
                        "less [balance] mem_margin = %g, less %.2f GiB of weights, gradients and AdamW moments (%lld "
                        "parameters, [train] shard = %s over %d rank(s)), less %.2f GiB reserved for the CUDA "
                        "libraries; %s, use a smaller model, or fewer ranks per GPU\n", plan->free_bytes / gib,
                        plan->description, config->balance.mem_margin, plan->state_bytes / gib,
                        (long long)table->n_weights, shard_mode_name(out->shard), info->n_ranks,
                        plan->reserve_bytes / gib, out->shard == SHARD_FULL
                        ? "run more ranks (shard = full splits the state over them)"
                        : "set [train] shard = full and run more ranks (it splits the state over them)");
            return ALDIT_EXIT_USAGE;
        }
    } else plan->mem_budget = config->balance.mem_budget;

    capacity c = capacity_for_budget(cm, samples, n_samples, plan->mem_budget);
    plan->max_tokens = c.tokens;
    plan->max_text = c.text;
    plan->max_samples = (int)(c.samples < GPU_MAX_SAMPLES ? c.samples : GPU_MAX_SAMPLES);
    plan->workspace_bytes = workspace_for(config, table, c);
    plan->attention_buffer_bytes = attention_buffer_for(config, table, c) + fp8_buffer_for(config, table, c);
    plan->split_bytes = split_reserve(config, cm, table, samples, n_samples, plan->mem_budget, sp_max);
    if (c.samples > GPU_MAX_SAMPLES ||
        plan->workspace_bytes + plan->attention_buffer_bytes + plan->split_bytes > available) {
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: [balance] mem_budget = %.3f GiB does not fit the GPU: its largest "
                    "micro-batch (%lld tokens, %lld samples, %lld text rows) needs %.2f GiB of activation workspace "
                    "in the GPU model (and cuDNN attention's buffer, and the sequence-parallel groups' buffers)%s, but %.2f GiB are free per rank on %s, of "
                    "which %.2f GiB hold weights, gradients and AdamW moments and %.2f GiB are reserved for the CUDA "
                    "libraries; lower mem_budget or set it to auto\n",
                    plan->mem_budget / gib, (long long)c.tokens, (long long)c.samples, (long long)c.text,
                    (plan->workspace_bytes + plan->attention_buffer_bytes + plan->split_bytes) / gib,
                    c.samples > GPU_MAX_SAMPLES ? " (and more samples than the 65535 it takes)" : "",
                    plan->free_bytes / gib, plan->description, plan->state_bytes / gib, plan->reserve_bytes / gib);
        return ALDIT_EXIT_USAGE;
    }
    return 0;
}

/* The summary's device and memory lines of this plan; gradient_sum (a run: what sums the gradients) may be NULL. */
static void describe(const deck *config, const gpu_plan *gpu, const char *gradient_sum, int n_ranks,
                     backend_plan *out)
{
    const char *chosen = config->run.device == DEVICE_AUTO ? " (auto)" : "";
    const int sharded_grads = out->shard == SHARD_GRADIENTS || out->shard == SHARD_FULL;
    char buckets[96] = "", attention[160] = "", gpu_text[sizeof gpu->description + 64];
    if (gradient_sum && n_ranks > 1 && sharded_grads)
        snprintf(buckets, sizeof buckets, ", reduce-scattered block by block as the backward ends each");
    else if (gradient_sum && n_ranks > 1 && config->train.allreduce_bucket > 0) {
        char bucket_text[32];
        format_size(config->train.allreduce_bucket, bucket_text, sizeof bucket_text);
        snprintf(buckets, sizeof buckets, ", buckets of %s overlapping the backward", bucket_text);
    } else if (gradient_sum && n_ranks > 1) snprintf(buckets, sizeof buckets, ", one call after the backward");
    if (gradient_sum && gpu->cudnn_min_tokens > 0) /* a run: the attention kernels are chosen */
        snprintf(attention, sizeof attention, "  attention  cuDNN's fused attention (self and cross) for samples of "
                 "%lld tokens or more, our flash attention below\n", (long long)gpu->cudnn_min_tokens);
    else if (gradient_sum) snprintf(attention, sizeof attention, "  attention  our flash attention\n");
    char precision[320] = "";
    static const char *const fp8_attention[] = {"", "; the self-attention's forward on cuDNN too",
                                                "; the self-attention on cuDNN too (forward and backward)"};
    if (config->train.precision == PRECISION_FP8)
        snprintf(precision, sizeof precision, "  precision  fp8: the blocks' q/k/v/o, cross q/o and FFN GEMMs in E4M3/E5M2 "
                 "(delayed scaling, amax history %d, margin %d)%s; the rest bf16/fp32\n", config->train.fp8_amax_history,
                 config->train.fp8_margin, fp8_attention[config->train.fp8_attention]);
    if (gpu->offline) snprintf(gpu_text, sizeof gpu_text, "GPU %s", gpu->description);
    else snprintf(gpu_text, sizeof gpu_text, "GPU %d, %s; %d rank(s) per GPU", gpu->device, gpu->description,
                  gpu->ranks_per_gpu);
    snprintf(out->device_text, sizeof out->device_text, "  device     cuda%s: %s%s%s%s\n%s%s", chosen, gpu_text,
             gradient_sum ? (sharded_grads ? "; gradient sum: " : "; gradient all-reduce: ") : "",
             gradient_sum ? gradient_sum : "", buckets, attention, precision);

    char budget_text[32], free_text[32], state_text[32], workspace_text[32], buffer_text[32];
    format_size(gpu->mem_budget, budget_text, sizeof budget_text);
    format_size(gpu->free_bytes, free_text, sizeof free_text);
    format_size(gpu->state_bytes, state_text, sizeof state_text);
    format_size(gpu->workspace_bytes, workspace_text, sizeof workspace_text);
    format_size(gpu->attention_buffer_bytes, buffer_text, sizeof buffer_text);
    int used = snprintf(out->memory_text, sizeof out->memory_text,
        "  memory     activation budget %s per rank (%s); %s of GPU memory free per rank, %s of it for weights, "
        "gradients and AdamW moments\n"
        "  capacity   GPU model for micro-batches of up to %lld tokens, %d samples and %lld text rows: %s of "
        "activation workspace\n", budget_text,
        !gpu->budget_measured ? "[balance] mem_budget"
        : gpu->offline        ? "planned: the largest whose GPU model fits balance.device_mem less mem_margin"
                              : "measured: the largest whose GPU model fits the free memory less mem_margin", free_text, state_text, (long long)gpu->max_tokens,
        gpu->max_samples, (long long)gpu->max_text, workspace_text);
    if (gpu->attention_buffer_bytes > 0.0 && used > 0 && (size_t)used < sizeof out->memory_text)
        snprintf(out->memory_text + used, sizeof out->memory_text - (size_t)used,
                 "             and %s kept for cuDNN attention's buffer (the longest sample)%s\n", buffer_text,
                 config->train.precision == PRECISION_FP8 ? " and the FP8 GEMMs' operands" : "");
    used = (int)strlen(out->memory_text);
    if (gpu->split_bytes > 0.0 && (size_t)used < sizeof out->memory_text) {
        char split_text[32];
        format_size(gpu->split_bytes, split_text, sizeof split_text);
        snprintf(out->memory_text + used, sizeof out->memory_text - (size_t)used,
                 "             and %s kept for a sequence-parallel group's buffers ([balance] sp = off frees it)\n",
                 split_text);
        used = (int)strlen(out->memory_text);
    }
    shard_describe(out->shard, n_ranks, &out->state, config->train.shard == SHARD_AUTO, out->memory_text + used,
                   sizeof out->memory_text - (size_t)used);
    out->mem_budget = gpu->mem_budget;
    out->budget_measured = gpu->budget_measured;
    out->fills_memory = 1;
}

/* The sharded modes' collectives need NCCL with more than one rank (gradsync.h). */
static int sharding_available(const comm_info *info)
{
#ifdef HAVE_NCCL
    (void)info;
    return 1;
#else
    return info->n_ranks == 1;
#endif
}

/* [train] shard on the GPU, before any memory is measured: a sharded mode needs NCCL over more than one rank
   (ALDIT_EXIT_USAGE, rank 0 says why). */
static int resolve_shard(const deck *config, const comm_info *info, backend_plan *plan)
{
    if (config->train.shard != SHARD_AUTO && config->train.shard != SHARD_NONE && !sharding_available(info)) {
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: [train] shard = %s over %d GPU ranks needs NCCL, and this build of aldit has "
                    "none (configure --with-nccl); set train.shard = none\n", shard_mode_name(config->train.shard),
                    info->n_ranks);
        return ALDIT_EXIT_USAGE;
    }
    plan->shard = config->train.shard;
    return 0;
}

/* out->shard and out->state: [train] shard, or for auto the least sharding whose state leaves the GPU model room for
   the least useful budget in `usable` bytes less `reserve` (the most sharding where none does: plan_memory then says
   what does not fit). The same on every rank (usable is). */
static int choose_shard(const deck *config, const comm_info *info, const cost_model *cm, const model *table,
                        const balance_sample *samples, int64_t n_samples, double usable, double reserve,
                        backend_plan *out)
{
    if (resolve_shard(config, info, out) != 0) return ALDIT_EXIT_USAGE;
    if (out->shard == SHARD_AUTO) {
        const double least = balance_least_useful_budget(config, cm, samples, n_samples);
        const deck_shard most = sharding_available(info) ? SHARD_FULL : SHARD_NONE;
        out->shard = most;
        for (deck_shard mode = SHARD_NONE; mode < most; mode++) {
            layout_state_bytes bytes = model_layout_state_bytes(&table->layout, LAYOUT_BACKEND_GPU, mode, info->n_ranks,
                                                                config->train.ema_decay > 0.0);
            const double available = usable - layout_state_total(&bytes) - reserve;
            if (available > least && budget_fits(config, cm, table, samples, n_samples, least, available,
                                                 balance_sp_limit(config, info->n_ranks))) {
                out->shard = mode;
                break;
            }
        }
    }
    out->state = model_layout_state_bytes(&table->layout, LAYOUT_BACKEND_GPU, out->shard, info->n_ranks,
                                          config->train.ema_decay > 0.0);
    return 0;
}

/* backend_cuda_plan, on this node's GPU or (offline) on none. */
static int plan_run(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                    int64_t n_samples, int offline, backend_plan *plan)
{
    gpu_plan gpu;
    memset(plan, 0, sizeof *plan);
    if (resolve_shard(config, info, plan) != 0) return ALDIT_EXIT_USAGE;
    if (offline) plan_without_device(config, &gpu);
    else select_device(info, &gpu);
    int major = 0, minor = 0;
    if (!offline && config->train.precision == PRECISION_FP8 && !fp8_gpu_supported(&major, &minor)) {
        fprintf(stderr, "aldit: error: rank %d: [train] precision = fp8 needs a GPU of compute capability 8.9 or more "
                "(FP8 tensor cores); %s is %d.%d: set [train] precision = bf16\n", info->rank, gpu.description, major,
                minor);
        return ALDIT_EXIT_USAGE;
    }
    cost_model_init(&plan->memory_model, config);
    plan->has_memory_model = 1;
    use_gpu_memory(&plan->memory_model, config);
    int status = plan_memory(config, info, &plan->memory_model, table, samples, n_samples, &gpu, plan);
    if (status == 0) describe(config, &gpu, NULL, info->n_ranks, plan);
    return status;
}

int backend_cuda_plan(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                      int64_t n_samples, backend_plan *plan)
{
    return plan_run(config, info, table, samples, n_samples, 0, plan);
}

int backend_cuda_plan_offline(const deck *config, const comm_info *info, const model *table,
                              const balance_sample *samples, int64_t n_samples, backend_plan *plan)
{
    return plan_run(config, info, table, samples, n_samples, 1, plan);
}

/* ---- the device state ------------------------------------------------------------------------------ */

static void make_adamw_runs(train_gpu *gpu)
{
    const model *host = gpu->host;
    gpu->runs = xmalloc((size_t)(host->n_params > 0 ? host->n_params : 1) * sizeof *gpu->runs);
    gpu->n_runs = 0;
    for (int p = 0; p < host->n_params; p++) {
        const param_info *param = &host->params[p];
        int decays = optim_param_decays(param->name, param->ndim);
        adamw_run *last = gpu->n_runs > 0 ? &gpu->runs[gpu->n_runs - 1] : NULL;
        if (last && last->decays == decays && last->offset + last->n_values == param->offset)
            last->n_values += param->n_elements;
        else gpu->runs[gpu->n_runs++] = (adamw_run){param->offset, param->n_elements, decays};
    }
}

/* A GPU model of `table` for micro-batches of up to these sizes, with the deck's recomputation, autotuning and
   attention, and the contexts (plans, caches) of an earlier model when `contexts` is not NULL;
   *cudnn_min_tokens gets the length from which cuDNN runs self-attention (0: never). */
static gpu_model *make_gpu_model(const deck *config, const model *table, int64_t max_tokens, int max_samples,
                                 int64_t max_text, gpu_model_contexts *contexts, int64_t *cudnn_min_tokens,
                                 int with_params)
{
    /* without its parameters where a sharded state (shard_gpu.h) gives them */
    gpu_model *net = with_params
        ? gpu_model_create_with_recompute(table, max_tokens, max_samples, max_text, recompute_of(config))
        : gpu_model_create_without_params(table, max_tokens, max_samples, max_text, recompute_of(config));
    gpu_model_set_autotune(net, config->train.autotune, config->train.autotune);
    gpu_model_give_contexts(net, contexts);
    const gpu_attention_choice attention[] = {[ATTENTION_AUTO] = GPU_ATTENTION_AUTO,
                                              [ATTENTION_CUDNN] = GPU_ATTENTION_CUDNN,
                                              [ATTENTION_OWN] = GPU_ATTENTION_OWN};
    const int cudnn = gpu_model_set_attention(net, attention[config->train.attention], GPU_ATTENTION_CUDNN_MIN_TOKENS);
    if (config->train.precision == PRECISION_FP8)
        gpu_model_set_precision(net, 1, config->train.fp8_amax_history, config->train.fp8_margin,
                                (int)config->train.fp8_attention);
    *cudnn_min_tokens = cudnn ? GPU_ATTENTION_CUDNN_MIN_TOKENS : 0;
    return net;
}

static const backend_ops cuda_ops;

backend *backend_cuda_create(const deck *config, const comm_info *info, model *host, const balance_sample *samples,
                             int64_t n_samples)
{
    if (config->balance.sp != 1 && info->n_ranks > 1) {   /* 1: off */
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: [balance] sp = %s: the CUDA backend does not run sequence-parallel groups "
                    "yet (the CPU backend does); set balance.sp = off\n",
                    config->balance.sp == 0 ? "auto" : "a group size");
        return NULL;
    }
    train_gpu *gpu = xcalloc(1, sizeof *gpu);
    gpu->rank = info->rank;
    gpu->n_ranks = info->n_ranks;
    if (resolve_shard(config, info, &gpu->summary) != 0) {
        free(gpu);
        return NULL;
    }
    gpu->config = config;
    gpu->host = host;
    select_device(info, &gpu->plan);
    cost_model_init(&gpu->cm, config);
    use_gpu_memory(&gpu->cm, config);
    if (plan_memory(config, info, &gpu->cm, host, samples, n_samples, &gpu->plan, &gpu->summary) != 0) {
        cost_model_free(&gpu->cm);
        free(gpu);
        return NULL;
    }
    const int sharded = gpu->summary.shard != SHARD_NONE;
    gpu->layout = shard_layout_units(gpu->summary.shard, &host->layout, info->rank, info->n_ranks);
    gpu->sync = gradsync_create(info, host->n_weights, sharded);
    gpu->seqpar = seqpar_gpu_create(gpu->sync, info->rank);
    CUDA_CHECK(cudaStreamCreate(&gpu->stream));
    gpu->net = make_gpu_model(config, host, gpu->plan.max_tokens, gpu->plan.max_samples, gpu->plan.max_text, NULL,
                              &gpu->plan.cudnn_min_tokens, !sharded);
    gpu_model_set_seqpar(gpu->net, gpu->seqpar);
    gpu->buffers = gpu_model_get_buffers(gpu->net);
    gpu->cm.attention_split_tokens = gpu->plan.cudnn_min_tokens; /* shorter samples: our flash attention */
#ifdef HAVE_CUDNN
    if (gpu->plan.cudnn_min_tokens > 0) { /* cuDNN runs the last sample of a micro-batch on whole tiles */
        gpu->summary.last_sample_tile = ATTENTION_CUDNN_TILE;
        gpu->summary.last_sample_min_tokens = gpu->plan.cudnn_min_tokens;
    }
#endif
    if (sharded)
        gpu->shard = shard_gpu_create(host, &gpu->layout, gpu->net, gpu->sync, gpu->stream, config->train.ema_decay > 0.0);
    else {
        const size_t n_bytes = (size_t)host->n_weights * sizeof(float);
        CUDA_CHECK(cudaMalloc((void **)&gpu->adam_m, n_bytes));
        CUDA_CHECK(cudaMalloc((void **)&gpu->adam_v, n_bytes));
        CUDA_CHECK(cudaMemset(gpu->adam_m, 0, n_bytes));
        CUDA_CHECK(cudaMemset(gpu->adam_v, 0, n_bytes));
        if (config->train.ema_decay > 0.0) CUDA_CHECK(cudaMalloc((void **)&gpu->ema, n_bytes));
    }
    CUDA_CHECK(cudaMalloc((void **)&gpu->sumsq, 2 * sizeof(double)));
    gpu->grad_norm = gpu->sumsq + 1;
    CUDA_CHECK(cudaMalloc((void **)&gpu->clip_scale, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&gpu->sumsq_workspace, fused_sumsq_workspace_bytes()));
    CUDA_CHECK(cudaMallocHost((void **)&gpu->grad_norm_host, sizeof(double)));
    CUDA_CHECK(cudaEventCreate(&gpu->optimizer_started));
    CUDA_CHECK(cudaEventCreate(&gpu->optimizer_done));
    make_adamw_runs(gpu);
    describe(config, &gpu->plan, gradsync_method(gpu->sync), info->n_ranks, &gpu->summary);
    gpu->summary.has_memory_model = 1;
    gpu->summary.memory_model = gpu->cm; /* a copy of the plain struct; gpu->cm owns what it points to */
    snprintf(gpu->key, sizeof gpu->key, "%s", gpu->plan.description);
    backend *b = xcalloc(1, sizeof *b);
    b->ops = &cuda_ops;
    b->state = gpu;
    return b;
}

static void cuda_free(backend *b)
{
    if (!b) return;
    train_gpu *gpu = b->state;
    CUDA_CHECK(cudaStreamSynchronize(gpu->stream));
    const int64_t refused = gpu_model_fp8_attention_refused(gpu->net);
    if (refused > 0)  /* every rank's own: the shapes differ by rank */
        fprintf(stderr, "aldit: warning: rank %d: %lld FP8 self-attention call(s) ran in bf16: cuDNN refused their "
                "shape ([train] fp8_attention)\n", gpu->rank, (long long)refused);
    shard_gpu_free(gpu->shard);
    gpu_model_free(gpu->net);
    CUDA_CHECK(cudaFree(gpu->adam_m));
    CUDA_CHECK(cudaFree(gpu->adam_v));
    CUDA_CHECK(cudaFree(gpu->ema));
    CUDA_CHECK(cudaFree(gpu->sumsq));
    CUDA_CHECK(cudaFree(gpu->clip_scale));
    CUDA_CHECK(cudaFree(gpu->sumsq_workspace));
    CUDA_CHECK(cudaFreeHost(gpu->grad_norm_host));
    if (gpu->fp8_amax_host) CUDA_CHECK(cudaFreeHost(gpu->fp8_amax_host));
    free(gpu->fp8_amax_max);
    CUDA_CHECK(cudaEventDestroy(gpu->optimizer_started));
    CUDA_CHECK(cudaEventDestroy(gpu->optimizer_done));
    CUDA_CHECK(cudaStreamDestroy(gpu->stream));
    seqpar_gpu_free(gpu->seqpar);
    gradsync_free(gpu->sync);
    cost_model_free(&gpu->cm);
    free(gpu->runs);
    free(gpu);
    free(b);
}

static const backend_plan *cuda_plan(const backend *b) { return &((const train_gpu *)b->state)->summary; }

static const char *cuda_device_key(const backend *b, int *ranks_per_device)
{
    const train_gpu *gpu = b->state;
    *ranks_per_device = gpu->plan.ranks_per_gpu;
    return gpu->key;
}

static const shard_layout *cuda_layout(const backend *b) { return &((const train_gpu *)b->state)->layout; }

/* Where value `first` of `group` is on the device, checked to hold values [first, first + count). */
static float *state_array(const train_gpu *gpu, backend_group group, int64_t first, int64_t count)
{
    if (gpu->shard) return shard_gpu_range(gpu->shard, group, first, count);
    int64_t own_first, own_count;
    shard_owned(&gpu->layout, gpu->rank, first, count, &own_first, &own_count);
    ALDIT_CHECK(own_first == first && own_count == count, "cuda backend: values [%lld, %lld) are not all this rank's",
                (long long)first, (long long)(first + count));
    switch (group) {
    case BACKEND_WEIGHTS: return gpu->buffers.master + first;
    case BACKEND_ADAM_M: return gpu->adam_m + first;
    case BACKEND_ADAM_V: return gpu->adam_v + first;
    case BACKEND_EMA:
        if (gpu->ema) return gpu->ema + first;
        ALDIT_FATAL("cuda backend: this run keeps no EMA ([train] ema_decay = off)");
    default: ALDIT_FATAL("cuda backend: this run keeps no state group %d", (int)group);
    }
}

static void cuda_set_range(backend *b, backend_group group, int64_t first, int64_t count, const float *values)
{
    train_gpu *gpu = b->state;
    float *array = state_array(gpu, group, first, count);
    CUDA_CHECK(cudaMemcpy(array, values, (size_t)count * sizeof(float), cudaMemcpyHostToDevice));
    if (group == BACKEND_EMA) gpu->ema_set = 1;
}

static void cuda_get_range(const backend *b, backend_group group, int64_t first, int64_t count, float *values)
{
    const train_gpu *gpu = b->state;
    const float *array = state_array(gpu, group, first, count);
    CUDA_CHECK(cudaStreamSynchronize(gpu->stream));
    CUDA_CHECK(cudaMemcpy(values, array, (size_t)count * sizeof(float), cudaMemcpyDeviceToHost));
}

/* The masters are set: an EMA not set starts as them, the bf16 copies follow, and the ranks connect. */
static void cuda_start(backend *b)
{
    train_gpu *gpu = b->state;
    gpu_model_fp8_fresh(gpu->net, gpu->stream);  /* a fresh run's FP8 scales start from its first step's casts */
    if (gpu->shard) shard_gpu_start(gpu->shard, gpu->ema_set);
    else {
        if (gpu->ema && !gpu->ema_set)
            CUDA_CHECK(cudaMemcpyAsync(gpu->ema, gpu->buffers.master, (size_t)gpu->host->n_weights * sizeof(float),
                                       cudaMemcpyDeviceToDevice, gpu->stream));
        gpu_model_refresh_working(gpu->net, gpu->stream);
        CUDA_CHECK(cudaStreamSynchronize(gpu->stream));
    }
    gradsync_connect(gpu->sync, gpu->host->n_weights);
}

/* ---- a step ------------------------------------------------------------------------------------------ */

static void cuda_begin_step(backend *b, int rounds)
{
    train_gpu *gpu = b->state;
    /* none, optimizer: the all-reduce runs once a step, as the last micro-batch's backward finishes; gradients,
       full: a reduce-scatter per micro-batch, `rounds` of them on every rank (shard_gpu.h) */
    if (gpu->shard) shard_gpu_begin_step(gpu->shard, rounds);
    else gpu_model_zero_grads(gpu->net, gpu->stream);
    float *grads = gpu->shard ? shard_gpu_whole_grads(gpu->shard) : gpu->buffers.grads;
    if (grads) gradsync_begin(gpu->sync, grads, gpu->host->n_weights, gpu->config->train.allreduce_bucket);
    gpu->grads_reported = 0;
    gpu->step_mem_estimate = 0.0;
    gpu->step_tokens = gpu->step_text = 0;
    gpu->step_samples = 0;
}

/* gpu_grads_ready_fn of the step's last micro-batch: each final gradient range joins the all-reduce. */
static void gradient_range_ready(void *context, int64_t first, int64_t count, cudaStream_t stream)
{
    gradsync_ready(((train_gpu *)context)->sync, first, count, stream);
}

/* The micro-batch's tokens and text rows, checked against the GPU model's capacity (fatal: the balancer and the
   plan disagree); returns its bytes by the memory model. A micro-batch of a sequence-parallel group of k ranks counts
   the most rows a member holds, ceil(tokens / k) (the text is whole on every member). */
static double checked_micro_batch(const train_gpu *gpu, const model_batch *batch, int64_t *tokens_out, int64_t *text_out)
{
    const model *host = gpu->host;
    int64_t tokens = 0, text = 0;
    double mem_estimate = 0.0;
    for (int i = 0; i < batch->n_samples; i++) {
        int64_t sample_tokens = (int64_t)(batch->frames[i] / host->patch_t) * (batch->height[i] / host->patch_h)
                                * (batch->width[i] / host->patch_w);
        tokens += sample_tokens;
        text += batch->text_len[i];
        mem_estimate += batch->sp_size > 1
                            ? cost_model_mem_split(&gpu->cm, sample_tokens, batch->text_len[i], batch->sp_size)
                            : cost_model_mem(&gpu->cm, sample_tokens, batch->text_len[i]);
    }
    if (batch->sp_size > 1) tokens = (tokens + batch->sp_size - 1) / batch->sp_size;
    const gpu_plan *plan = &gpu->plan;
    if (tokens > plan->max_tokens || text > plan->max_text || batch->n_samples > plan->max_samples)
        ALDIT_FATAL("a micro-batch of %lld tokens, %d samples and %lld text rows (%.0f bytes by the memory model) "
                    "exceeds the GPU model's capacity of %lld tokens, %d samples and %lld text rows planned for the "
                    "memory budget of %.0f bytes: the balancer and the GPU plan disagree", (long long)tokens,
                    batch->n_samples, (long long)text, mem_estimate, (long long)plan->max_tokens, plan->max_samples,
                    (long long)plan->max_text, plan->mem_budget);
    *tokens_out = tokens;
    *text_out = text;
    return mem_estimate;
}

static double cuda_micro_batch(backend *b, const model_batch *batch, float grad_scale, int last)
{
    train_gpu *gpu = b->state;
    int64_t tokens = 0, text = 0;
    const double mem_estimate = checked_micro_batch(gpu, batch, &tokens, &text);
    if (mem_estimate > gpu->step_mem_estimate) {
        gpu->step_mem_estimate = mem_estimate;
        gpu->step_tokens = tokens;
        gpu->step_text = text;
        gpu->step_samples = batch->n_samples;
    }
    if (gpu->shard) shard_gpu_before_micro_batch(gpu->shard);
    if (gpu->shard && !shard_gpu_whole_grads(gpu->shard)) /* gradients, full: reduce-scattered by the shard's hook */
        return gpu_model_forward_backward(gpu->net, batch, grad_scale, NULL, gpu->stream);
    if (!last) return gpu_model_forward_backward(gpu->net, batch, grad_scale, NULL, gpu->stream);
    gpu_model_set_grads_ready(gpu->net, gradient_range_ready, gpu);
    double loss_sum = gpu_model_forward_backward(gpu->net, batch, grad_scale, NULL, gpu->stream);
    gpu_model_set_grads_ready(gpu->net, NULL, NULL);
    gpu->grads_reported = 1;
    return loss_sum;
}

/* Forward only on the GPU model: no begin_eval (every mode but full keeps the bf16 weights whole, and full gathers
   each block as training does: collective, so an empty batch still asks for every block, gpu_model_forward_loss). */
static double cuda_eval_batch(backend *b, const model_batch *batch, double *sample_loss)
{
    train_gpu *gpu = b->state;
    int64_t tokens = 0, text = 0;
    if (batch->n_samples > 0) checked_micro_batch(gpu, batch, &tokens, &text);
    return gpu_model_forward_loss(gpu->net, batch, sample_loss, gpu->stream);
}

/* The EMA in the master's place, and back: sharded, the held arrays swap and the bf16 copies and fp32 reads are
   published from them (shard_gpu_swap_ema); mode none, the master is kept meanwhile in the gradient buffer (free
   between finish_step and the next begin_step, which zeroes it) and the EMA copied over it, the bf16 copies
   made from it as AdamW makes them (round to nearest), so that on = 0 restores both bit for bit. */
static void cuda_use_ema(backend *b, int on)
{
    train_gpu *gpu = b->state;
    ALDIT_CHECK(gpu->config->train.ema_decay > 0.0, "cuda backend: a validation with the EMA, but this run keeps "
                "none ([train] ema_decay = off)");
    ALDIT_CHECK(on == !gpu->ema_in_use, "cuda backend: use_ema(%d) twice", on);
    gpu->ema_in_use = on;
    if (gpu->shard) {
        shard_gpu_swap_ema(gpu->shard);
        return;
    }
    const gpu_model_buffers *buffers = &gpu->buffers;
    const size_t bytes = (size_t)buffers->n_weights * sizeof(float);
    if (on) {
        CUDA_CHECK(cudaMemcpyAsync(buffers->grads, buffers->master, bytes, cudaMemcpyDeviceToDevice, gpu->stream));
        CUDA_CHECK(cudaMemcpyAsync(buffers->master, gpu->ema, bytes, cudaMemcpyDeviceToDevice, gpu->stream));
    } else CUDA_CHECK(cudaMemcpyAsync(buffers->master, buffers->grads, bytes, cudaMemcpyDeviceToDevice, gpu->stream));
    gpu_model_refresh_working(gpu->net, gpu->stream);
}

static void cuda_sum_gradients(backend *b)
{
    train_gpu *gpu = b->state;
    if (gpu->shard && !shard_gpu_whole_grads(gpu->shard)) {
        shard_gpu_sum_gradients(gpu->shard);
        return;
    }
    if (!gpu->grads_reported) { /* no micro-batch here this step: the same bucket calls as the other ranks */
        gpu_model_set_grads_ready(gpu->net, gradient_range_ready, gpu);
        gpu_model_grads_ready_all(gpu->net, gpu->stream);
        gpu_model_set_grads_ready(gpu->net, NULL, NULL);
    }
    gradsync_finish(gpu->sync, gpu->stream);
}

/* [train] precision = fp8 over several ranks: the step's running amaxes to pinned host memory (queued), ... */
static void fetch_fp8_amax(train_gpu *gpu, const float *amax, int n)
{
    if (gpu->fp8_amax_count != n) {
        if (gpu->fp8_amax_host) CUDA_CHECK(cudaFreeHost(gpu->fp8_amax_host));
        free(gpu->fp8_amax_max);
        CUDA_CHECK(cudaMallocHost((void **)&gpu->fp8_amax_host, (size_t)n * sizeof(float)));
        gpu->fp8_amax_max = xmalloc((size_t)n * sizeof(double));
        gpu->fp8_amax_count = n;
    }
    CUDA_CHECK(cudaMemcpyAsync(gpu->fp8_amax_host, amax, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, gpu->stream));
}

/* ... and, collective once the stream is drained, their maximum over the ranks back (queued): every rank's scales and
   histories stay the same (as Transformer Engine reduces amax over the data-parallel group), so a checkpoint's
   (rank 0's) scaling state is every rank's. Exact: fp32 values through fp64. */
static void reduce_fp8_amax(train_gpu *gpu, float *amax, int n)
{
    for (int i = 0; i < n; i++) gpu->fp8_amax_max[i] = gpu->fp8_amax_host[i];
    comm_allreduce_max_f64(gpu->fp8_amax_max, (size_t)n);
    for (int i = 0; i < n; i++) gpu->fp8_amax_host[i] = (float)gpu->fp8_amax_max[i];
    CUDA_CHECK(cudaMemcpyAsync(amax, gpu->fp8_amax_host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, gpu->stream));
}

static void cuda_finish_step(backend *b, const adamw_step *hyper, int update, backend_step_result *result)
{
    train_gpu *gpu = b->state;
    const deck *config = gpu->config;
    const gpu_model_buffers *buffers = &gpu->buffers;
    CUDA_CHECK(cudaEventRecord(gpu->optimizer_started, gpu->stream));
    if (gpu->shard)
        shard_gpu_finish_step(gpu->shard, hyper, config->train.weight_decay, config->train.grad_clip, update,
                              optim_ema_decay(config, hyper->step), gpu->sumsq, gpu->grad_norm, gpu->clip_scale,
                              gpu->sumsq_workspace);
    else {
        fused_sumsq(buffers->grads, buffers->n_weights, gpu->sumsq, gpu->sumsq_workspace, gpu->stream);
        /* the gradients already carry 1 / global samples (grad_scale of the micro-batches), as on the CPU */
        fused_clip_scale(gpu->sumsq, 1.0, config->train.grad_clip, gpu->clip_scale, gpu->grad_norm, gpu->stream);
    }
    if (update && !gpu->shard) {
        for (int r = 0; r < gpu->n_runs; r++) {
            const adamw_run *run = &gpu->runs[r];
            fused_adamw(hyper, run->decays ? config->train.weight_decay : 0.0, buffers->master + run->offset,
                        buffers->working + run->offset, buffers->grads + run->offset, gpu->adam_m + run->offset,
                        gpu->adam_v + run->offset, run->n_values, 1.0f, gpu->clip_scale, gpu->stream);
        }
        /* queued behind AdamW; a non-finite clip scale (AdamW skipped on the device) skips it too */
        if (gpu->ema)
            misc_ema_update(gpu->ema, buffers->master, buffers->n_weights, optim_ema_decay(config, hyper->step),
                            gpu->clip_scale, gpu->stream);
    }
    /* delayed scaling: this step's amaxes into the histories; over several ranks first their maximum (below) */
    int n_amax = 0;
    float *amax = gpu->n_ranks > 1 ? gpu_model_fp8_amax(gpu->net, &n_amax) : NULL;
    if (amax) fetch_fp8_amax(gpu, amax, n_amax);
    else gpu_model_fp8_step(gpu->net, gpu->stream);
    CUDA_CHECK(cudaEventRecord(gpu->optimizer_done, gpu->stream));
    CUDA_CHECK(cudaMemcpyAsync(gpu->grad_norm_host, gpu->grad_norm, sizeof(double), cudaMemcpyDeviceToHost,
                               gpu->stream));
    /* while the GPU runs the optimizer: the workspace the step's largest micro-batch occupied */
    result->mem_peak = gpu->step_samples > 0
        ? (double)gpu_model_workspace_bytes_with_recompute(gpu->host, gpu->step_tokens, gpu->step_samples,
                                                           gpu->step_text > 0 ? gpu->step_text : 1,
                                                           recompute_of(config))
        : 0.0;
    gpu_stream_wait(gpu->stream);  /* the step's NCCL sums are on its path: watched */
    if (amax) {  /* after the wait finish_step has anyway: the reduction adds no synchronisation */
        reduce_fp8_amax(gpu, amax, n_amax);
        gpu_model_fp8_step(gpu->net, gpu->stream);
    }
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, gpu->optimizer_started, gpu->optimizer_done));
    result->grad_norm = *gpu->grad_norm_host;
    result->optimizer_s = milliseconds * 1e-3;
    result->comm_device_s = gradsync_device_seconds(gpu->sync);
}

/* ---- start-up calibration -------------------------------------------------------------------------- */

/* Host arrays of a calibration micro-batch: room for the most copies and the largest shape (zero data). */
typedef struct {
    int32_t *frames, *height, *width, *text_len;
    float *sigma, *latents, *noise, *text;
} calibration_batch;

/* Tokens of one sample of this shape after the patchify. */
static int64_t shape_tokens(const model *host, const backend_shape *shape)
{
    return (int64_t)(shape->frames / host->patch_t) * (shape->height / host->patch_h) * (shape->width / host->patch_w);
}

/* Seconds of one forward + backward of a micro-batch of `copies` samples of this shape on `net` (only the time
   counts), after a warm-up call of the same micro-batch when warm_up is 1 (its first run builds plans and caches);
   timed again while calibration_repeat_due says so under repeat_seconds, the least timing returned. */
static double time_micro_batch(train_gpu *gpu, gpu_model *net, const backend_shape *shape, int copies,
                               const calibration_batch *room, int warm_up, double repeat_seconds)
{
    for (int i = 0; i < copies; i++) {
        room->frames[i] = shape->frames;
        room->height[i] = shape->height;
        room->width[i] = shape->width;
        room->text_len[i] = shape->text_len;
        room->sigma[i] = 0.5f;
    }
    model_batch batch = {.n_samples = copies, .frames = room->frames, .height = room->height, .width = room->width,
                         .text_len = room->text_len, .latents = room->latents, .noise = room->noise,
                         .sigma = room->sigma, .text = room->text};
    if (warm_up) gpu_model_forward_backward(net, &batch, 1.0f, NULL, gpu->stream);
    gpu_model_fp8_steady(net, gpu->stream);  /* fp8: timed as training's steps after its first run */
    double least = 0.0, sum = 0.0;
    int n_timed = 0;
    do {
        const double started = comm_time();
        gpu_model_forward_backward(net, &batch, 1.0f, NULL, gpu->stream); /* returns after the GPU is done */
        const double seconds = comm_time() - started;
        least = n_timed == 0 || seconds < least ? seconds : least;
        sum += seconds;
        n_timed++;
    } while (calibration_repeat_due(n_timed, sum, repeat_seconds));
    return least;
}

static void cuda_calibration_copies(const backend *b, const backend_shape *shapes, int n_shapes, int max_copies,
                                    int *copies)
{
    const train_gpu *gpu = b->state;
    /* a training micro-batch fills at most [balance] mem_fill of the budget (the step's target) */
    const double fill = gpu->config->balance.mem_fill > 0.0 ? gpu->config->balance.mem_fill : 0.9;
    for (int i = 0; i < n_shapes; i++)
        /* within the capacity, and not an oversize sample (cuDNN's buffer was planned for the longest sample
           the balancer may schedule) */
        copies[i] = cost_model_calibration_copies(&gpu->cm, shape_tokens(gpu->host, &shapes[i]), shapes[i].text_len,
                                                  gpu->plan.max_tokens, gpu->plan.max_text, gpu->plan.max_samples,
                                                  gpu->plan.mem_budget, fill * gpu->plan.mem_budget, max_copies);
}

/* The largest of the micro-batches to time: tokens, samples, text rows and latent values, each on its own. */
typedef struct { int64_t tokens, text, latent; int samples; } calibration_sizes;

static calibration_sizes sizes_of(const model *host, const backend_shape *shapes, int n_shapes, const int *copies)
{
    calibration_sizes most = {1, 1, 1, 1};
    for (int i = 0; i < n_shapes; i++) {
        const int64_t tokens = (int64_t)copies[i] * shape_tokens(host, &shapes[i]);
        const int64_t text = (int64_t)copies[i] * shapes[i].text_len;
        const int64_t latent = (int64_t)copies[i] * host->in_dim * shapes[i].frames * shapes[i].height * shapes[i].width;
        if (tokens > most.tokens) most.tokens = tokens;
        if (text > most.text) most.text = text;
        if (latent > most.latent) most.latent = latent;
        if (copies[i] > most.samples) most.samples = copies[i];
    }
    return most;
}

/* n standard normal values of the stream `key` (the timed micro-batches' latents, noise and text). */
static float *normal_values(int64_t n, uint64_t key)
{
    float *values = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    uint64_t state = key;
    for (int64_t i = 0; i < n; i += 2) {
        double second;
        values[i] = (float)rng_normal_pair(&state, &second);
        if (i + 1 < n) values[i + 1] = (float)second;
    }
    return values;
}

static calibration_batch room_for(const model *host, calibration_sizes most)
{
    return (calibration_batch){
        .frames = xmalloc((size_t)most.samples * sizeof(int32_t)),
        .height = xmalloc((size_t)most.samples * sizeof(int32_t)),
        .width = xmalloc((size_t)most.samples * sizeof(int32_t)),
        .text_len = xmalloc((size_t)most.samples * sizeof(int32_t)),
        .sigma = xmalloc((size_t)most.samples * sizeof(float)),
        .latents = normal_values(most.latent, TIMING_SEED + 1),
        .noise = normal_values(most.latent, TIMING_SEED + 2),
        .text = normal_values(most.text * host->text_dim, TIMING_SEED + 3)};
}

/* The timed model's weights as training's: the family's init (model_init_random_param), with the tensors it
   starts at zero (biases, Wan's head) drawn normal(0, 0.02) so that every GEMM and the backward through the head
   see nonzero values. Block 0's tensors are drawn on the host and copied to the other blocks on the device. Zeros
   are not neutral for a timing: an H200's GEMMs on zero operands draw less power and hold higher clocks, and a
   model timed on zeroed weights and data predicted 0.78-0.92 of training's measured step (docs/PERFORMANCE.md).
   A model without its own parameters (a sharded state gives them) is left as it is. */
static void fill_timing_weights(gpu_model *net, const model *table, cudaStream_t stream)
{
    const gpu_model_buffers buffers = gpu_model_get_buffers(net);
    if (!buffers.master) return;
    int64_t largest = 1;
    for (int i = 0; i < table->n_params; i++)
        if (table->params[i].n_elements > largest) largest = table->params[i].n_elements;
    float *values = xmalloc((size_t)largest * sizeof(float));
    for (int i = 0; i < table->n_params; i++) {
        int layer;
        int64_t offset;
        model_layout_param(&table->layout, i, &layer, &offset);
        if (layer > 0) continue;
        const param_info *p = &table->params[i];
        model_init_random_param(table, TIMING_SEED, i, values);
        int zero = 1;
        for (int64_t j = 0; j < p->n_elements && zero; j++) zero = values[j] == 0.0f;
        if (zero) {
            uint64_t state = rng_key(TIMING_SEED, 4, (uint64_t)i);
            for (int64_t j = 0; j < p->n_elements; j++) values[j] = (float)(0.02 * rng_normal(&state));
        }
        CUDA_CHECK(cudaMemcpy(buffers.master + p->offset, values, (size_t)p->n_elements * sizeof(float),
                              cudaMemcpyHostToDevice));
    }
    free(values);
    const model_layout *layout = &table->layout;
    for (int layer = 1; layer < table->num_layers; layer++)
        CUDA_CHECK(cudaMemcpy(buffers.master + layout->blocks_offset + layer * layout->block_stride,
                              buffers.master + layout->blocks_offset, (size_t)layout->block_stride * sizeof(float),
                              cudaMemcpyDeviceToDevice));
    gpu_model_refresh_working(net, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

static void room_free(calibration_batch *room)
{
    free(room->frames);
    free(room->height);
    free(room->width);
    free(room->text_len);
    free(room->sigma);
    free(room->latents);
    free(room->noise);
    free(room->text);
}

/* A model of `layers` blocks (fewer than the backend's) for micro-batches up to `most`, in the memory of the
   backend's own model, which it replaces: that model (no state set yet: time_shapes comes before set_range) is
   freed, its contexts (plans and caches) go to the small one. The small model's table goes into *table. */
static gpu_model *swap_in_small_model(train_gpu *gpu, int layers, calibration_sizes most, model *table)
{
    deck *small = xmalloc(sizeof *small);
    *small = *gpu->config;
    small->model.num_layers = layers;
    model_create_table(table, small);
    gpu_model_contexts *contexts = gpu_model_take_contexts(gpu->net);
    gpu_model_free(gpu->net);
    gpu->net = NULL;
    int64_t cudnn_min_tokens = 0;
    gpu_model *net = make_gpu_model(small, table, most.tokens, most.samples, most.text, contexts, &cudnn_min_tokens,
                                    1);
    free(small);
    return net;
}

/* The small model freed and the backend's own made again as backend_cuda_create made it, with the contexts. */
static void swap_out_small_model(train_gpu *gpu, gpu_model *net, model *table)
{
    gpu_model_contexts *contexts = gpu_model_take_contexts(net);
    gpu_model_free(net);
    model_free(table);
    gpu->net = make_gpu_model(gpu->config, gpu->host, gpu->plan.max_tokens, gpu->plan.max_samples, gpu->plan.max_text,
                              contexts, &gpu->plan.cudnn_min_tokens, gpu->shard == NULL);
    gpu_model_set_seqpar(gpu->net, gpu->seqpar);
    gpu->buffers = gpu_model_get_buffers(gpu->net);
    if (gpu->shard) shard_gpu_set_model(gpu->shard, gpu->net);
}

static double cuda_time_shapes(backend *b, int layers, const backend_shape *shapes, int n_shapes, const int *copies,
                               double *seconds, int warm_up, double repeat_seconds, backend_timing_progress_fn progress,
                               void *context)
{
    train_gpu *gpu = b->state;
    const model *host = gpu->host;
    ALDIT_CHECK(layers >= 1 && layers <= host->num_layers, "calibration: %d blocks asked of a model of %d", layers,
                host->num_layers);
    const double started = comm_time();
    const calibration_sizes most = sizes_of(host, shapes, n_shapes, copies);
    calibration_batch room = room_for(host, most);
    model small_table;
    gpu_model *net = layers < host->num_layers ? swap_in_small_model(gpu, layers, most, &small_table) : gpu->net;
    fill_timing_weights(net, layers < host->num_layers ? &small_table : host, gpu->stream);
    for (int i = 0; i < n_shapes; i++) {
        seconds[i] = copies[i] > 0 ? time_micro_batch(gpu, net, &shapes[i], copies[i], &room, warm_up, repeat_seconds)
                                     : -1.0;
        if (progress) progress(context, i, seconds[i]);
    }
    if (net != gpu->net) swap_out_small_model(gpu, net, &small_table);
    else gpu_model_fp8_restart(net, gpu->stream);  /* the run's own model: no scaling learnt from timing's data */
    room_free(&room);
    comm_allreduce_sum_f64(seconds, (size_t)n_shapes); /* every rank times the same micro-batches */
    for (int i = 0; i < n_shapes; i++) seconds[i] /= gpu->n_ranks;
    return comm_time() - started;
}

static void cuda_profile(backend *b, int on)
{
    (void)b;
    gpu_profiler(on);
}

static size_t cuda_fp8_state_bytes(const backend *b)
{
    const train_gpu *gpu = b->state;
    return gpu_model_fp8_state_bytes(gpu->net);
}

static void cuda_get_fp8_state(const backend *b, void *blob)
{
    const train_gpu *gpu = b->state;
    gpu_model_fp8_save(gpu->net, blob, gpu->stream);
}

static int cuda_set_fp8_state(backend *b, const void *blob, size_t bytes, char *why, size_t why_size)
{
    train_gpu *gpu = b->state;
    return gpu_model_fp8_load(gpu->net, blob, bytes, why, why_size);
}

static int64_t cuda_prepare(backend *b, const balance_sample *samples, int64_t n_samples)
{
    train_gpu *gpu = b->state;
    int32_t *tokens = xmalloc((size_t)(n_samples > 0 ? n_samples : 1) * sizeof *tokens);
    int32_t *rows = xmalloc((size_t)(n_samples > 0 ? n_samples : 1) * sizeof *rows);
    for (int64_t i = 0; i < n_samples; i++) {
        tokens[i] = samples[i].tokens;
        rows[i] = samples[i].text_len;
    }
    const int64_t built = gpu_model_prepare(gpu->net, tokens, rows, n_samples);
    free(tokens);
    free(rows);
    return built;
}

static void cuda_setup_stats(const backend *b, int64_t *count, double *seconds)
{
    const train_gpu *gpu = b->state;
    gpu_model_setup_stats(gpu->net, count, seconds);
}

static const backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .plan = cuda_plan,
    .layout = cuda_layout,
    .set_range = cuda_set_range,
    .start = cuda_start,
    .get_range = cuda_get_range,
    .begin_step = cuda_begin_step,
    .micro_batch = cuda_micro_batch,
    .eval_batch = cuda_eval_batch,
    .use_ema = cuda_use_ema,
    .sum_gradients = cuda_sum_gradients,
    .finish_step = cuda_finish_step,
    .calibration_copies = cuda_calibration_copies,
    .time_shapes = cuda_time_shapes,
    .profile = cuda_profile,
    .prepare = cuda_prepare,
    .setup_stats = cuda_setup_stats,
    .device_key = cuda_device_key,
    .fp8_state_bytes = cuda_fp8_state_bytes,
    .get_fp8_state = cuda_get_fp8_state,
    .set_fp8_state = cuda_set_fp8_state,
};

layout_state_bytes backend_cuda_state_bytes(const backend *b)
{
    const train_gpu *gpu = b->state;
    if (gpu->shard) return shard_gpu_bytes(gpu->shard);
    const double n = (double)gpu->host->n_weights;
    /* the model's own buffers (gpu_model_device_bytes less its workspace) and the moments */
    const double model_bytes = (double)gpu_model_device_bytes(gpu->net) - (double)gpu->plan.workspace_bytes;
    layout_state_bytes bytes = {.weights = n * sizeof(gpu_bf16), .gradients = n * sizeof(float),
                                .master = model_bytes - n * (sizeof(gpu_bf16) + sizeof(float)),
                                .moments = (gpu->adam_m ? n * sizeof(float) : 0.0) + (gpu->adam_v ? n * sizeof(float) : 0.0),
                                .ema = gpu->ema ? n * sizeof(float) : 0.0};
    return bytes;
}
