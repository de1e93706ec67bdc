/* aldit_sim.c — aldit-sim: plans one rank's memory ([train] shard: the training state's breakdown and the
   activation budget it leaves), runs the balancer for R virtual ranks over a length spec or a store's index and
   reports per strategy the imbalance, epoch time against its lower bound, memory use and balancer time. */
#include "config.h"
#include "balance/balance.h"
#include "core/check.h"
#include "balance/costmodel.h"
#include "deck/deck.h"
#include "io/lengths.h"
#include "model/layout.h"
#include "core/rng.h"
#include "io/store.h"
#include "model/model.h"
#include "train/device.h"
#include "train/train.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const char *spec_path, *store_path, *deck_path, *strategy;
    int n_ranks;
    int64_t n_samples;
    double noise;
    uint64_t seed;
    int json;
    int n_overrides;
    char **overrides;
} sim_args;

enum { SIM_GROUP_SIZES = 11 };   /* groups of 1, 2, 4, ..., 1024 ranks */
enum { SIM_RANKS_PER_NODE = 8 };  /* [balance] ranks_per_node = auto: nodes of 8 GPUs */

typedef struct {
    int64_t steps, samples;
    double imbalance_sum, predicted_imbalance_sum;
    double epoch_time, total_cost;
    double work;                  /* the true cost of the epoch's samples, each once and unsplit: the lower bound's */
    double mem_util_sum, mem_peak;
    double micro_per_rank_sum;
    int micro_max;
    double balancer_seconds;      /* next + observe */
    double observe_seconds;       /* observe (the online refit) alone */
    double group_samples[SIM_GROUP_SIZES];   /* samples run by groups of 2^j ranks, summed over steps */
    int64_t raised_steps;         /* steps whose per-rank budget rose for a sample no group brought within it */
    double raise_max;             /* the largest rise, relative to the step's mean work */
    int sp_max;                   /* the largest group the balancer may use */
} sim_result;

static void print_usage(FILE *out)
{
    fprintf(out,
            "usage: aldit-sim [--spec FILE | --store FILE] --model DECK --ranks R [--strategy NAME|all]\n"
            "                 [--samples N] [--noise F] [--seed S] [--json] [section.key=value ...]\n"
            "Runs aldit's balancer for R virtual ranks over one epoch, without training, and reports per strategy\n"
            "the predicted imbalance, the epoch time against its lower bound, memory use and balancer time. First it\n"
            "plans one rank's memory: the training state under [train] shard (auto: the least sharding whose activation\n"
            "budget holds the largest sample; none, optimizer, gradients, full) and [train] ema_decay with its breakdown,\n"
            "and the budget that balance.device_mem x (1 - balance.mem_margin) leaves beside it (or a fixed\n"
            "balance.mem_budget).\n"
            "  --spec FILE       length spec (weight frames height width [text] per line); N samples are drawn from\n"
            "                    it (default: the deck's balance.lengths)\n"
            "  --store FILE      an aldit latent store: its index gives the samples\n"
            "  --model DECK      input deck; its [model] and [balance] sections are used (overrides may follow)\n"
            "  --ranks R         virtual ranks\n"
            "  --strategy NAME   global, dual, equal_tokens or all (default: all)\n"
            "  --samples N       samples drawn from the spec (default 100000)\n"
            "  --noise F         true cost of each sample = predicted x (1 + u), u uniform in [-F, F] (default 0)\n"
            "  --seed S          seeds the draw, the noise and the epoch order (default: the deck's run.seed)\n"
            "  --json            one JSON object per strategy per line\n"
            "With balance.sp = auto or K, global may run a sample on a group of ranks (balance.ranks_per_node = auto is 8\n"
            "here); the table then says how many samples per step each group size ran.\n"
            "Exit status: 0 ok, 2 bad input.\n");
}

static _Noreturn void usage_error(const char *fmt, const char *value)
{
    fprintf(stderr, "aldit-sim: ");
    fprintf(stderr, fmt, value);
    fprintf(stderr, "\n(run aldit-sim --help for usage)\n");
    exit(ALDIT_EXIT_USAGE);
}

static double parse_number(const char *option, const char *text, double min, double max)
{
    char *end = NULL;
    double value = text ? strtod(text, &end) : NAN;
    if (!text || end == text || *end != '\0' || !(value >= min && value <= max)) {
        char message[256];
        snprintf(message, sizeof(message), "%s needs a number in [%.15g, %.15g], got '%%s'", option, min, max);
        usage_error(message, text ? text : "(nothing)");
    }
    return value;
}

static sim_args parse_args(int argc, char **argv)
{
    enum { OPT_JSON = 256, OPT_SPEC, OPT_STORE, OPT_MODEL, OPT_STRATEGY, OPT_RANKS, OPT_SAMPLES, OPT_NOISE, OPT_SEED };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},          {"json", no_argument, NULL, OPT_JSON},
        {"spec", required_argument, NULL, OPT_SPEC}, {"store", required_argument, NULL, OPT_STORE},
        {"model", required_argument, NULL, OPT_MODEL}, {"strategy", required_argument, NULL, OPT_STRATEGY},
        {"ranks", required_argument, NULL, OPT_RANKS}, {"samples", required_argument, NULL, OPT_SAMPLES},
        {"noise", required_argument, NULL, OPT_NOISE}, {"seed", required_argument, NULL, OPT_SEED},
        {NULL, 0, NULL, 0}};
    sim_args args = {.strategy = "all", .n_samples = 100000, .seed = UINT64_MAX};
    args.overrides = xcalloc((size_t)argc, sizeof(char *));
    opterr = 0;
    optind = 0; /* 0: glibc resets all of getopt's state */
    for (;;) {
        /* "-" first: other words come back in order as 1; ":" reports a missing value as ':' */
        int word = optind == 0 ? 1 : optind, option = getopt_long(argc, argv, "-:h", options, NULL);
        if (option == -1) break;
        switch (option) {
        case 'h': print_usage(stdout); exit(0);
        case OPT_JSON: args.json = 1; break;
        case OPT_SPEC: args.spec_path = optarg; break;
        case OPT_STORE: args.store_path = optarg; break;
        case OPT_MODEL: args.deck_path = optarg; break;
        case OPT_STRATEGY: args.strategy = optarg; break;
        case OPT_RANKS: args.n_ranks = (int)parse_number("--ranks", optarg, 1, 1 << 20); break;
        case OPT_SAMPLES: args.n_samples = (int64_t)parse_number("--samples", optarg, 1, 1e9); break;
        case OPT_NOISE: args.noise = parse_number("--noise", optarg, 0, 0.99); break;
        case OPT_SEED: args.seed = (uint64_t)parse_number("--seed", optarg, 0, 9007199254740992.0); break;
        case 1:
            if (optarg[0] != '-' && strchr(optarg, '=')) args.overrides[args.n_overrides++] = optarg;
            else usage_error("unknown argument '%s'", optarg);
            break;
        case ':': usage_error("%s needs a value", argv[word]);
        default: usage_error("unknown argument '%s'", argv[word]);
        }
    }
    for (int i = optind; i < argc; i++) usage_error("unknown argument '%s'", argv[i]); /* words after "--" */
    if (args.spec_path && args.store_path) usage_error("give one of --spec FILE and --store FILE, not both%s", "");
    if (!args.deck_path) usage_error("--model DECK is required%s", "");
    if (args.n_ranks <= 0) usage_error("--ranks R is required%s", "");
    if (!args.strategy) usage_error("--strategy needs a value%s", "");
    return args;
}

/* The samples: drawn from a spec (each with its bucket's caption length, or the deck's text_len where the spec gives
   none; text_len with [model] text_padding = wan, as a run pads them) or read from a store's index. */
static balance_sample *load_samples(const sim_args *args, const deck *config, int64_t *n_samples)
{
    balance_sample *samples = NULL;
    if (args->spec_path) {
        length_bucket *buckets = NULL;
        int n_buckets = 0;
        if (lengths_load(args->spec_path, &buckets, &n_buckets, stderr) != 0) exit(ALDIT_EXIT_USAGE);
        int64_t n = args->n_samples;
        int32_t *frames = xmalloc((size_t)n * sizeof(int32_t)), *height = xmalloc((size_t)n * sizeof(int32_t));
        int32_t *width = xmalloc((size_t)n * sizeof(int32_t)), *text = xmalloc((size_t)n * sizeof(int32_t));
        lengths_draw_text(buckets, n_buckets, n, config->run.seed, frames, height, width, text);
        for (int b = 0; b < n_buckets; b++)
            if (buckets[b].text_max > config->model.text_len) {
                fprintf(stderr, "aldit-sim: %s: a bucket's captions reach %d text tokens, more than model.text_len = %d\n",
                        args->spec_path, buckets[b].text_max, config->model.text_len);
                exit(ALDIT_EXIT_USAGE);
            }
        samples = xmalloc((size_t)n * sizeof(balance_sample));
        for (int64_t i = 0; i < n; i++) {
            store_sample shape = {.frames = frames[i], .height = height[i], .width = width[i]};
            int64_t tokens = store_sample_tokens(&shape, config->model.patch_t, config->model.patch_h, config->model.patch_w);
            if (tokens < 1 || tokens > INT32_MAX) {
                fprintf(stderr, "aldit-sim: %s: a %dx%dx%d bucket gives %lld tokens with patch %dx%dx%d\n", args->spec_path,
                        frames[i], height[i], width[i], (long long)tokens, config->model.patch_t,
                        config->model.patch_h, config->model.patch_w);
                exit(ALDIT_EXIT_USAGE);
            }
            const int padded = config->model.text_padding == TEXT_PADDING_WAN || text[i] == 0;
            samples[i] = (balance_sample){.id = i, .tokens = (int32_t)tokens,
                                          .text_len = padded ? config->model.text_len : text[i]};
        }
        *n_samples = n;
        free(frames); free(height); free(width); free(text); free(buckets);
    } else {
        store data;
        if (store_open(&data, args->store_path, stderr) != 0) exit(ALDIT_EXIT_USAGE);
        for (int64_t i = 0; i < data.n_samples; i++) {
            int64_t tokens = store_sample_tokens(&data.samples[i], config->model.patch_t, config->model.patch_h,
                                                 config->model.patch_w);
            if (tokens < 1 || tokens > INT32_MAX) {
                fprintf(stderr, "aldit-sim: %s: sample %lld gives %lld tokens with patch %dx%dx%d\n", args->store_path,
                        (long long)i, (long long)tokens, config->model.patch_t, config->model.patch_h, config->model.patch_w);
                exit(ALDIT_EXIT_USAGE);
            }
        }
        samples = train_balance_samples(&data, config); /* as a run sees them (text padding included) */
        *n_samples = data.n_samples;
        store_close(&data);
    }
    return samples;
}

/* Where neither --spec nor --store is given: the deck's balance.lengths, as given when it opens from the working
   folder, else (a relative path) from the deck's folder; exits 2 where the deck names none. */
static void default_spec(sim_args *args, const deck *config, char *path, size_t path_size)
{
    if (args->spec_path || args->store_path) return;
    if (!config->balance.lengths[0])
        usage_error("give --spec FILE or --store FILE (or name a length spec in the deck: balance.lengths)%s", "");
    snprintf(path, path_size, "%s", config->balance.lengths);
    FILE *file = fopen(path, "r");
    if (!file && config->balance.lengths[0] != '/') {
        const char *slash = strrchr(args->deck_path, '/');
        if (slash) snprintf(path, path_size, "%.*s/%s", (int)(slash - args->deck_path), args->deck_path,
                            config->balance.lengths);
    }
    if (file) fclose(file);
    args->spec_path = path;
}

/* CPU time of this thread: the balancer's own cost, unaffected by other processes on a shared machine. */
static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank r's true seconds in a step: its samples' true costs, a sample run by a group of k ranks costing each member
   its true cost / k plus the exchange (cost_model_predict_split's form). Counts each group's samples in
   group_samples (a member's share 1 / k). */
static double rank_true_seconds(const balancer *b, const balance_assignment *step, int r, const balance_sample *samples,
                                const double *true_cost, double *group_samples, double *work)
{
    double seconds = 0;
    *work = 0;
    for (int m = step->rank_micro_start[r]; m < step->rank_micro_start[r + 1]; m++) {
        const int k = step->micro_group[m];
        int size_index = 0;
        while ((1 << size_index) < k && size_index < SIM_GROUP_SIZES - 1) size_index++;
        for (int64_t i = step->micro_start[m]; i < step->micro_start[m + 1]; i++) {
            const int64_t index = step->indices[i];
            const cost_model *cm = balancer_cost_model(b);
            const int64_t rows = cost_model_length(cm, samples[index].tokens, samples[index].text_len);
            seconds += k > 1 ? true_cost[index] / k + cost_model_exchange(cm, rows, k) : true_cost[index];
            group_samples[size_index] += 1.0 / k;
            *work += k > 1 ? true_cost[index] / k : true_cost[index];
        }
    }
    return seconds;
}

/* The samples per step each group size ran, as "k=1 95.2, k=4 1.3" (sizes that ran none left out). */
static void format_groups(const sim_result *r, char *text, size_t size)
{
    size_t used = 0;
    text[0] = '\0';
    for (int j = 0; j < SIM_GROUP_SIZES && used < size; j++)
        if (r->group_samples[j] > 0)
            used += (size_t)snprintf(text + used, size - used, "%sk=%d %.1f", used ? ", " : "", 1 << j,
                                     r->group_samples[j] / (double)r->steps);
}

/* One epoch of one strategy. true_cost[i] is sample i's (noisy) true seconds. */
static sim_result simulate(const deck *config, const balance_sample *samples, int64_t n_samples, int n_ranks,
                           double mem_budget, const double *true_cost, double *compute_budget, double *dual_p)
{
    sim_result result = {0};
    balancer *b = balancer_create(config, samples, n_samples, n_ranks, mem_budget, NULL);
    *compute_budget = balancer_compute_budget(b);
    *dual_p = balancer_dual_p(b);
    const int64_t epoch_samples = balancer_epoch_samples(b);
    balance_assignment step = {0};
    double *rank_seconds = xmalloc((size_t)n_ranks * sizeof(double));
    while (result.samples < epoch_samples) {
        double start = cpu_seconds();
        balancer_next(b, &step);
        result.balancer_seconds += cpu_seconds() - start;
        ALDIT_CHECK(step.epoch == 0, "aldit-sim: the epoch ended after %lld of %lld samples",
                    (long long)result.samples, (long long)epoch_samples);
        double max_true = 0, sum_true = 0, max_predicted = 0, sum_predicted = 0, max_mem = 0, sum_work = 0;
        for (int r = 0; r < n_ranks; r++) {
            double rank_work = 0;
            rank_seconds[r] = rank_true_seconds(b, &step, r, samples, true_cost, result.group_samples, &rank_work);
            sum_work += rank_work;
            max_true = fmax(max_true, rank_seconds[r]);
            sum_true += rank_seconds[r];
            max_predicted = fmax(max_predicted, step.predicted_seconds[r]);
            sum_predicted += step.predicted_seconds[r];
            max_mem = fmax(max_mem, step.peak_mem_bytes[r]);
            int n_micro = step.rank_micro_start[r + 1] - step.rank_micro_start[r];
            if (n_micro > result.micro_max) result.micro_max = n_micro;
            result.micro_per_rank_sum += (double)n_micro / n_ranks;
        }
        start = cpu_seconds();
        balancer_observe(b, rank_seconds);
        double observe_seconds = cpu_seconds() - start;
        result.observe_seconds += observe_seconds;
        result.balancer_seconds += observe_seconds;
        result.steps++;
        result.samples += step.global_samples;
        result.imbalance_sum += max_true > 0 ? 1.0 - sum_true / n_ranks / max_true : 0;
        result.predicted_imbalance_sum += max_predicted > 0 ? 1.0 - sum_predicted / n_ranks / max_predicted : 0;
        result.epoch_time += max_true;
        result.total_cost += sum_true;
        result.work += sum_work;
        result.mem_util_sum += max_mem / mem_budget;
        result.mem_peak = fmax(result.mem_peak, max_mem / mem_budget);
    }
    result.raised_steps = balancer_sp_raised_steps(b);
    result.raise_max = balancer_sp_raise_max(b);
    result.sp_max = balancer_sp_max(b);
    free(rank_seconds);
    balance_assignment_free(&step);
    balancer_free(b);
    return result;
}

/* One rank's memory plan: the state under the chosen mode and the activation budget beside it. */
typedef struct {
    deck_shard mode;
    int chosen_by_auto;
    layout_state_bytes state;
    double mem_budget;        /* activation bytes per rank: the deck's, or what the device memory leaves */
    double device_bytes;      /* balance.device_mem x (1 - mem_margin) */
    double largest_bytes;     /* the activation bytes of the sample that needs the most (cost_model_mem) */
    int64_t largest_id;
} sim_plan;

/* A GPU deck's memory is planned by the GPU backend itself, as aldit --check plans a GPU job where no GPU is visible
   (each virtual rank one GPU of balance.device_mem): one memory model, one answer. fn is NULL for a CPU deck or a
   build without CUDA (then the formula below, which leaves out the GPU model's workspace rounding and the CUDA
   libraries' reserve). */
typedef struct {
    backend_plan_fn fn;
    comm_info info;           /* the virtual ranks: n_ranks = --ranks, one per GPU */
    model table;
    const balance_sample *samples;
    int64_t n_samples;
} sim_gpu;

/* The GPU backend's plan under `mode`: 0 and *out (its memory model freed), or non-zero where the mode does not fit
   (said on stderr when `loud`). */
static int gpu_plan_of(const sim_gpu *gpu, const deck *config, deck_shard mode, int loud, backend_plan *out)
{
    deck copy = *config;
    copy.train.shard = mode;
    comm_info info = gpu->info;
    info.rank = loud ? 0 : 1; /* only rank 0 prints why a plan fails */
    int status = gpu->fn(&copy, &info, &gpu->table, gpu->samples, gpu->n_samples, out);
    if (out->has_memory_model) cost_model_free(&out->memory_model);
    out->has_memory_model = 0;
    return status;
}

/* The budget `mode` leaves: a fixed [balance] mem_budget, or the device memory less the margin and the state. */
static double budget_of(const deck *config, const sim_plan *plan, const layout_state_bytes *state)
{
    if (config->balance.mem_budget > 0) return config->balance.mem_budget;
    return plan->device_bytes - layout_state_total(state);
}

/* Whether `state` fits: beside a fixed budget, inside the device memory; else the budget it leaves holds the
   largest sample (the balancer refuses or skips samples over the budget). */
static int mode_fits(const deck *config, const sim_plan *plan, const layout_state_bytes *state)
{
    if (config->balance.mem_budget > 0)
        return plan->device_bytes - layout_state_total(state) >= config->balance.mem_budget;
    return budget_of(config, plan, state) >= plan->largest_bytes;
}

/* [train] shard resolved for R ranks (auto: the least sharding that fits; full where none does) and the budget;
   exits 2 where the mode leaves no memory for activations. */
static sim_plan plan_memory(const sim_args *args, const deck *config, const cost_model *cm,
                            const balance_sample *samples, int64_t n_samples, const sim_gpu *gpu)
{
    const layout_dims dims = layout_dims_of(config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    const int ema = config->train.ema_decay > 0.0;
    sim_plan plan = {.mode = config->train.shard, .device_bytes = config->balance.device_mem *
                                                                  (1.0 - config->balance.mem_margin)};
    for (int64_t i = 0; i < n_samples; i++) {
        const double bytes = cost_model_mem(cm, samples[i].tokens, samples[i].text_len);
        if (bytes > plan.largest_bytes) plan.largest_bytes = bytes, plan.largest_id = i;
    }
    if (gpu->fn) {
        backend_plan planned;
        if (gpu_plan_of(gpu, config, config->train.shard, 1, &planned) != 0) {
            comm_finalize();
            exit(ALDIT_EXIT_USAGE);
        }
        plan.chosen_by_auto = plan.mode == SHARD_AUTO;
        plan.mode = planned.shard;
        plan.state = planned.state;
        plan.mem_budget = planned.mem_budget;
        return plan;
    }
    if (plan.mode == SHARD_AUTO) {
        plan.chosen_by_auto = 1;
        plan.mode = SHARD_FULL;
        for (deck_shard mode = SHARD_NONE; mode <= SHARD_FULL; mode++) {
            const layout_state_bytes state = model_layout_state_bytes(&layout, cm->backend, mode, args->n_ranks, ema);
            if (mode_fits(config, &plan, &state)) { plan.mode = mode; break; }
        }
    }
    plan.state = model_layout_state_bytes(&layout, cm->backend, plan.mode, args->n_ranks, ema);
    plan.mem_budget = budget_of(config, &plan, &plan.state);
    if (!(plan.mem_budget > 0)) {
        fprintf(stderr, "aldit-sim: %s: the training state (%.1f GiB per rank with train.shard = %s over %d ranks) "
                "leaves no room in balance.device_mem x (1 - mem_margin) = %.1f GiB; shard more (train.shard = full), "
                "use more ranks, or set balance.device_mem or balance.mem_budget\n", args->deck_path,
                layout_state_total(&plan.state) / 1073741824.0, deck_shard_name(plan.mode), args->n_ranks,
                plan.device_bytes / 1073741824.0);
        exit(ALDIT_EXIT_USAGE);
    }
    return plan;
}

static int gpu_deck_without_cuda(const deck *config, const cost_model *cm)
{
    return cm->backend == LAYOUT_BACKEND_GPU && !device_offline_gpu_plan_fn(config);
}

/* The memory formula the balancer plans with (model/layout.h), the state's breakdown per rank and each mode's. */
static void print_memory(const sim_args *args, const deck *config, const cost_model *cm, const sim_plan *plan,
                         const sim_gpu *planner)
{
    const double gib = 1073741824.0;
    const int gpu = cm->backend == LAYOUT_BACKEND_GPU;
    printf("activation memory (%s model, recompute %s): %.1f MiB per micro-batch + %.1f KiB per token + %.1f KiB "
           "per sample + %.1f KiB per text token%s\n", gpu ? "GPU" : "CPU",
           cm->recompute_block ? "block" : "none", cm->memory.fixed / 1048576.0, cm->memory.per_token / 1024.0,
           cm->memory.per_sample / 1024.0, cm->memory.per_text / 1024.0,
           gpu ? " (and the GPU's own scratch constant)" : "");
    const layout_state_bytes *s = &plan->state;
    printf("training state %.2f GiB per rank (%s backend, train.shard = %s over %d ranks%s):\n"
           "  weights %.2f GiB (%s), gathered blocks %.2f GiB, gradients %.2f GiB, master weights %.2f GiB, "
           "AdamW moments %.2f GiB, EMA %.2f GiB\n", layout_state_total(s) / gib, gpu ? "GPU" : "CPU", deck_shard_name(plan->mode),
           args->n_ranks, plan->chosen_by_auto ? "; auto: the least sharding that fits" : "", s->weights / gib,
           gpu ? "bf16" : "fp32, also the master", s->gathered / gib, s->gradients / gib, s->master / gib,
           s->moments / gib, s->ema / gib);
    if (config->balance.mem_budget > 0)
        printf("  activation budget %.2f GiB per rank (balance.mem_budget)\n", plan->mem_budget / gib);
    else if (planner->fn)
        printf("  activation budget %.2f GiB per rank: the largest whose GPU model fits balance.device_mem %.2f GiB x "
               "(1 - mem_margin %g) less the state and the CUDA libraries' reserve (aldit --check's plan)\n",
               plan->mem_budget / gib, config->balance.device_mem / gib, config->balance.mem_margin);
    else if (gpu && !layout_family_on_gpu(config->model.family))
        printf("  activation budget %.2f GiB per rank: balance.device_mem %.2f GiB x (1 - mem_margin %g) less the "
               "state (model.family = %s has no GPU model yet: its activations by the layout's GPU formula, as "
               "aldit --check plans it)\n", plan->mem_budget / gib, config->balance.device_mem / gib,
               config->balance.mem_margin, deck_family_name(config->model.family));
    else if (gpu_deck_without_cuda(config, cm))
        printf("  activation budget %.2f GiB per rank: balance.device_mem %.2f GiB x (1 - mem_margin %g) less the "
               "state (this build has no CUDA backend: aldit --check on one also counts the GPU model's workspace "
               "and the CUDA libraries' reserve, a smaller budget)\n", plan->mem_budget / gib,
               config->balance.device_mem / gib, config->balance.mem_margin);
    else
        printf("  activation budget %.2f GiB per rank: balance.device_mem %.2f GiB x (1 - mem_margin %g) less the "
               "state\n", plan->mem_budget / gib, config->balance.device_mem / gib, config->balance.mem_margin);
    printf("  the largest sample (%lld) needs %.2f GiB of activations\n", (long long)plan->largest_id,
           plan->largest_bytes / gib);
    const layout_dims dims = layout_dims_of(config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    const int ema = config->train.ema_decay > 0.0;
    printf("  by mode:");
    for (deck_shard mode = SHARD_NONE; mode <= SHARD_FULL; mode++) {
        const layout_state_bytes state = model_layout_state_bytes(&layout, cm->backend, mode, args->n_ranks, ema);
        double budget = budget_of(config, plan, &state);
        int fits = mode_fits(config, plan, &state);
        if (planner->fn) {
            backend_plan planned;
            fits = gpu_plan_of(planner, config, mode, 0, &planned) == 0;
            budget = fits ? planned.mem_budget : 0.0;
            fits = fits && (config->balance.mem_budget > 0 || budget >= plan->largest_bytes); /* auto's rule */
        }
        printf("%s %s %.2f GiB (budget %.2f GiB, %s)", mode == SHARD_NONE ? "" : ";", deck_shard_name(mode),
               layout_state_total(&state) / gib, budget / gib, fits ? "fits" : "does not fit");
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    sim_args args = parse_args(argc, argv);
    deck config;
    deck_defaults(&config);
    if (deck_load(&config, args.deck_path, args.n_overrides, args.overrides, stderr) != 0) return ALDIT_EXIT_USAGE;
    if (args.seed != UINT64_MAX) config.run.seed = args.seed;
    if (config.balance.ranks_per_node == 0) config.balance.ranks_per_node = SIM_RANKS_PER_NODE;
    char spec_path[2 * DECK_PATH_MAX + 2];
    default_spec(&args, &config, spec_path, sizeof spec_path);
    deck_strategy strategies[3];
    int n_strategies = 0;
    if (!strcmp(args.strategy, "all")) {
        strategies[n_strategies++] = STRATEGY_EQUAL_TOKENS;
        strategies[n_strategies++] = STRATEGY_DUAL;
        strategies[n_strategies++] = STRATEGY_GLOBAL;
    } else {
        for (int s = STRATEGY_GLOBAL; s <= STRATEGY_EQUAL_TOKENS; s++)
            if (!strcmp(args.strategy, deck_strategy_name((deck_strategy)s))) strategies[n_strategies++] = (deck_strategy)s;
        if (n_strategies == 0) usage_error("unknown strategy '%s' (global, dual, equal_tokens or all)", args.strategy);
    }

    int64_t n_samples = 0;
    balance_sample *samples = load_samples(&args, &config, &n_samples);

    /* true cost: the seed model's prediction with a fixed per-sample relative error */
    cost_model truth;
    cost_model_init(&truth, &config);
    sim_gpu gpu = {.samples = samples, .n_samples = n_samples};
    if (truth.backend == LAYOUT_BACKEND_GPU) gpu.fn = device_offline_gpu_plan_fn(&config);
    if (gpu.fn) { /* the backend's plan is collective: this process alone, standing for --ranks GPUs */
        gpu.info = comm_init(&argc, &argv);
        gpu.info.n_ranks = args.n_ranks;
        gpu.info.local_rank = 0;
        gpu.info.n_local_ranks = 1;
        model_create_table(&gpu.table, &config);
    }
    const sim_plan plan = plan_memory(&args, &config, &truth, samples, n_samples, &gpu);
    const double mem_budget = plan.mem_budget;
    double *true_cost = xmalloc((size_t)n_samples * sizeof(double));
    uint64_t noise_state = rng_hash(config.run.seed, 0x6e6f697365ull);
    for (int64_t i = 0; i < n_samples; i++) {
        double u = args.noise > 0 ? args.noise * (2.0 * rng_uniform(&noise_state) - 1.0) : 0.0;
        true_cost[i] = cost_model_predict(&truth, samples[i].tokens, samples[i].text_len) * (1.0 + u);
    }

    if (!args.json) {
        printf("aldit-sim: %lld samples from %s, model %s (%.2fB parameters, recompute %s), %d ranks, noise %g, seed %llu\n",
               (long long)n_samples, args.spec_path ? args.spec_path : args.store_path, config.model.name,
               cost_model_param_count(&config) / 1e9, truth.recompute_block ? "block" : "none", args.n_ranks, args.noise,
               (unsigned long long)config.run.seed);
        printf("memory budget %.2f GiB per rank (%lld tokens per micro-batch at %d text tokens); global_batch %s\n",
               mem_budget / 1073741824.0,
               (long long)balancer_max_tokens_in_budget(&truth, mem_budget, config.model.text_len),
               config.model.text_len, config.balance.global_batch > 0 || config.balance.global_tokens > 0 ? "fixed" : "budget");
        print_memory(&args, &config, &truth, &plan, &gpu);
        char sp_text[16] = "auto";
        if (config.balance.sp > 1) snprintf(sp_text, sizeof sp_text, "%d", config.balance.sp);
        if (config.balance.sp != 1)
            printf("sequence-parallel groups (balance.sp = %s): up to %d ranks for global (%d heads, %d ranks per node), "
                   "exchange at %g GB/s\n", sp_text, balance_sp_limit(&config, args.n_ranks),
                   config.model.num_heads, config.balance.ranks_per_node, config.balance.sp_bandwidth);
        if (config.balance.sp != 1 && !layout_family_sequence_parallel(config.model.family))
            printf("  (planned as if model.family = %s ran groups: its models do not, and training runs it with "
                   "balance.sp = off)\n", deck_family_name(config.model.family));
        printf("%-13s %6s %9s %9s %9s %11s %11s %8s %8s %8s %9s %11s\n", "strategy", "steps", "samples/", "imbalance",
               "(predict)", "epoch_time", "lower_bound", "vs_bound", "mem_util", "mem_peak", "micro/rk", "balancer");
        printf("%-13s %6s %9s %9s %9s %11s %11s %8s %8s %8s %9s %11s\n", "", "", "step", "", "", "s", "s", "", "", "",
               "mean/max", "ms/step");
    }
    for (int s = 0; s < n_strategies; s++) {
        config.balance.strategy = strategies[s];
        double compute_budget = 0, dual_p = 0;
        sim_result r = simulate(&config, samples, n_samples, args.n_ranks, mem_budget, true_cost, &compute_budget, &dual_p);
        const double steps = (double)r.steps, lower_bound = r.work / args.n_ranks;
        const char *name = deck_strategy_name(strategies[s]);
        char groups_json[256] = "";
        for (int j = 0, used = 0; (1 << j) <= r.sp_max && j < SIM_GROUP_SIZES; j++)
            used += snprintf(groups_json + used, sizeof groups_json - (size_t)used, ",\"k%d_per_step\":%.4f", 1 << j,
                             r.group_samples[j] / steps);
        if (args.json) {
            printf("{\"strategy\":\"%s\",\"ranks\":%d,\"steps\":%lld,\"imbalance\":%.6f,\"epoch_time\":%.6g,"
                   "\"lower_bound\":%.6g,\"mem_util\":%.4f,\"balancer_ms_per_step\":%.4f,\"predicted_imbalance\":%.6f,"
                   "\"mem_peak\":%.4f,\"micro_per_rank\":%.3f,\"micro_max\":%d,\"samples\":%lld,\"noise\":%g,"
                   "\"compute_budget\":%.6g,\"dual_p\":%.4f,\"observe_ms_per_step\":%.4f,\"shard\":\"%s\","
                   "\"shard_auto\":%d,\"state_bytes\":%.0f,\"state_weights_bytes\":%.0f,\"state_gathered_bytes\":%.0f,"
                   "\"state_gradients_bytes\":%.0f,\"state_master_bytes\":%.0f,\"state_moments_bytes\":%.0f,"
                   "\"state_ema_bytes\":%.0f,"
                   "\"mem_budget_bytes\":%.0f,\"largest_sample_bytes\":%.0f,\"parameters\":%lld,\"sp_max\":%d,"
                   "\"sp_raised_steps\":%lld,\"sp_raise_max\":%.4f%s}\n",
                   name, args.n_ranks, (long long)r.steps, r.imbalance_sum / steps, r.epoch_time, lower_bound,
                   r.mem_util_sum / steps, 1e3 * r.balancer_seconds / steps, r.predicted_imbalance_sum / steps, r.mem_peak,
                   r.micro_per_rank_sum / steps, r.micro_max, (long long)r.samples, args.noise, compute_budget, dual_p,
                   1e3 * r.observe_seconds / steps, deck_shard_name(plan.mode), plan.chosen_by_auto,
                   layout_state_total(&plan.state), plan.state.weights, plan.state.gathered, plan.state.gradients,
                   plan.state.master, plan.state.moments, plan.state.ema, plan.mem_budget, plan.largest_bytes,
                   (long long)cost_model_param_count(&config), r.sp_max, (long long)r.raised_steps, r.raise_max,
                   groups_json);
        } else {
            printf("%-13s %6lld %9.1f %8.2f%% %8.2f%% %11.1f %11.1f %7.2f%% %7.1f%% %7.1f%% %4.2f/%-4d %11.3f\n", name,
                   (long long)r.steps, r.samples / steps, 100 * r.imbalance_sum / steps, 100 * r.predicted_imbalance_sum / steps,
                   r.epoch_time, lower_bound, 100 * (r.epoch_time / lower_bound - 1), 100 * r.mem_util_sum / steps,
                   100 * r.mem_peak, r.micro_per_rank_sum / steps, r.micro_max, 1e3 * r.balancer_seconds / steps);
            if (r.sp_max > 1) {
                char groups[256];
                format_groups(&r, groups, sizeof groups);
                char raised[64] = "";
                if (r.raised_steps > 0) snprintf(raised, sizeof raised, ", at most +%.1f%%", 100 * r.raise_max);
                printf("%-13s groups (sp up to %d): %s samples per step; per-rank budget raised in %lld of %lld steps%s\n",
                       "", r.sp_max, groups, (long long)r.raised_steps, (long long)r.steps, raised);
            }
        }
        fflush(stdout);
    }
    if (gpu.fn) {
        model_free(&gpu.table);
        comm_finalize();
    }
    cost_model_free(&truth);
    free(true_cost);
    free(samples);
    free(args.overrides);
    return 0;
}
