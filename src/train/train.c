/* train.c — the training loop: device choice, assignment, prefetch, noise, forward/backward, all-reduce, AdamW, checkpoints, logs. */
#include "config.h"
#include "train/train.h"
#include "balance/balance.h"
#include "balance/calibration.h"
#include "balance/group_blocks.h"
#include "core/check.h"
#include "core/comm.h"
#include "train/checkpoint.h"
#include "train/state.h"
#include "balance/costmodel.h"
#include "model/model.h"
#include "model/ops_cpu.h"
#include "model/optim.h"
#include "train/prefetch.h"
#include "core/rng.h"
#include "io/store.h"
#include "backend/backend.h"
#include "train/device.h"
#include "train/eval.h"
#include "train/hook.h"
#include "train/metrics.h"
#include "train/rundir.h"
#include "train/watchdog.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Domain tag mixed into the seed for noise and timesteps, so they never share a stream with other uses
   of [run] seed (weights, epoch order). */
#define NOISE_STREAM_TAG 0x6E6F697365ull /* "noise" */

/* [run] threads, else OMP_NUM_THREADS, else the node's cores shared evenly by the ranks on it. */
static int threads_per_rank(const deck *config, const comm_info *info)
{
    if (config->run.threads > 0) return config->run.threads;
#ifdef _OPENMP
    if (getenv("OMP_NUM_THREADS")) return omp_get_max_threads();
#endif
    long n_cores = sysconf(_SC_NPROCESSORS_ONLN);
    long per_rank = n_cores / (info->n_local_ranks > 0 ? info->n_local_ranks : 1);
    return per_rank > 1 ? (int)per_rank : 1;
}

/* ---- signals ------------------------------------------------------------------------------------- */

static volatile sig_atomic_t stop_signal = 0;

static void on_stop_signal(int signal_number) { stop_signal = signal_number; }

void train_install_signal_handlers(void)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ALDIT_CHECK(sigaction(SIGUSR1, &action, NULL) == 0 && sigaction(SIGTERM, &action, NULL) == 0
                && sigaction(SIGINT, &action, NULL) == 0 && sigaction(SIGHUP, &action, NULL) == 0,
                "cannot install the SIGUSR1/SIGTERM/SIGINT/SIGHUP handlers");
    /* a file size limit (ulimit -f) fails the write with EFBIG, reported, instead of killing the rank */
    signal(SIGXFSZ, SIG_IGN);
}

/* ---- small helpers ------------------------------------------------------------------------------- */

/* End every rank with `code` after rank 0 printed why: for conditions all ranks detect together. */
_Noreturn static void exit_all(int code)
{
    fflush(stdout);
    fflush(stderr);
    comm_finalize();
    exit(code);
}

static void make_dirs(const char *path)
{
    char partial[DECK_PATH_MAX];
    snprintf(partial, sizeof partial, "%s", path);
    for (char *slash = partial + 1; *slash; slash++) {
        if (*slash != '/') continue;
        *slash = '\0';
        mkdir(partial, 0777);
        *slash = '/';
    }
    int failure = mkdir(partial, 0777) == 0 ? 0 : errno;
    struct stat existing;
    if (failure == EEXIST) failure = stat(partial, &existing) == 0 && S_ISDIR(existing.st_mode) ? 0 : ENOTDIR;
    if (failure != 0)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "cannot create the run folder %s ([run] dir): %s", path, strerror(failure));
}

static void metrics_path(const deck *config, char *path, size_t path_size)
{
    if (config->log.metrics[0] == '/') snprintf(path, path_size, "%s", config->log.metrics);
    else snprintf(path, path_size, "%s/%s", config->run.dir, config->log.metrics);
}

static void format_duration(double seconds, char *text, size_t text_size)
{
    long long whole = seconds > 0 ? (long long)(seconds + 0.5) : 0;
    if (whole >= 3600) snprintf(text, text_size, "%lldh%02lldm", whole / 3600, whole / 60 % 60);
    else snprintf(text, text_size, "%lldm%02llds", whole / 60, whole % 60);
}

/* ---- set-up shared by --check and training ------------------------------------------------------- */

/* Every sample must fit the model: latent channels, patch multiples, text width and length. All ranks
   hold the index, so all detect the same problem; rank 0 names it (`what`: "store" or "[eval] store =", then
   the path) and every rank exits with status 2. */
int train_store_fits(const store *data, const deck *config, char *problem, size_t problem_size)
{
    problem[0] = '\0';
    if (data->latent_channels != config->model.out_dim)
        snprintf(problem, problem_size, "the store's latents have %d channels; [model] out_dim = %d (the latent the "
                 "flow is trained in) must equal it", data->latent_channels, config->model.out_dim);
    else if (data->text_dim != config->model.text_dim)
        snprintf(problem, problem_size, "the store's text embeddings are %d wide, [model] text_dim = %d",
                 data->text_dim, config->model.text_dim);
    else if (config->model.family == FAMILY_HUNYUANVIDEO15 && data->has_sources && data->text_2_dim != config->model.text_2_dim)
        snprintf(problem, problem_size, "the store's ByT5 rows (/text_2) are %d wide, [model] text_2_dim = %d",
                 data->text_2_dim, config->model.text_2_dim);
    else if (config->model.family == FAMILY_HUNYUANVIDEO15 && data->has_sources && data->image_dim != config->model.image_dim)
        snprintf(problem, problem_size, "the store's SigLIP rows (/image) are %d wide, [model] image_dim = %d",
                 data->image_dim, config->model.image_dim);
    for (int64_t id = 0; id < data->n_samples && !problem[0]; id++) {
        const store_sample *sample = &data->samples[id];
        if (sample->frames % config->model.patch_t || sample->height % config->model.patch_h
            || sample->width % config->model.patch_w)
            snprintf(problem, problem_size, "sample %lld has latent frames x height x width %d x %d x %d, not a "
                     "multiple of the patch %d x %d x %d", (long long)id, sample->frames, sample->height, sample->width,
                     config->model.patch_t, config->model.patch_h, config->model.patch_w);
        else if (sample->text_len > config->model.text_len)
            snprintf(problem, problem_size, "sample %lld has %d text tokens, more than [model] text_len = %d",
                     (long long)id, sample->text_len, config->model.text_len);
    }
    return problem[0] != '\0';
}

static void check_store_fits_model(const store *data, const deck *config, int rank, const char *what)
{
    char problem[512];
    if (!train_store_fits(data, config, problem, sizeof problem)) return;
    if (rank == 0) fprintf(stderr, "aldit: error: %s %s does not fit the model: %s\n", what, data->path, problem);
    exit_all(ALDIT_EXIT_USAGE);
}

/* The text rows the model sees of a sample: text_len with [model] text_padding = wan (zero rows after the
   stored ones, as Wan 2.1 pads every caption), else the stored count. */
static int32_t text_rows_of(const store_sample *sample, const deck *config)
{
    return config->model.text_padding == TEXT_PADDING_WAN ? config->model.text_len : sample->text_len;
}

balance_sample *train_balance_samples(const store *data, const deck *config)
{
    balance_sample *samples = xmalloc((size_t)data->n_samples * sizeof *samples);
    for (int64_t id = 0; id < data->n_samples; id++) {
        samples[id].id = id;
        samples[id].tokens = (int32_t)store_sample_tokens(&data->samples[id], config->model.patch_t,
                                                          config->model.patch_h, config->model.patch_w);
        samples[id].text_len = text_rows_of(&data->samples[id], config);
        if (config->model.family == FAMILY_HUNYUANVIDEO15 && data->has_sources) /* the joint text, at most (I2V) */
            samples[id].text_len += data->sources[id].text_2_len + data->sources[id].image_len;
    }
    return samples;
}

/* The samples a backend plans its capacity for: the training store's, then the validation store's (when there is
   one): micro-batches of both must fit it. Free with free(). */
static balance_sample *plan_samples(const balance_sample *samples, int64_t n_samples, const evaluator *eval,
                                    int64_t *n_planned)
{
    int64_t n_eval = 0;
    const balance_sample *eval_part = eval ? eval_samples(eval, &n_eval) : NULL;
    *n_planned = n_samples + n_eval;
    balance_sample *all = xmalloc((size_t)(*n_planned > 0 ? *n_planned : 1) * sizeof *all);
    memcpy(all, samples, (size_t)n_samples * sizeof *all);
    if (n_eval > 0) memcpy(all + n_samples, eval_part, (size_t)n_eval * sizeof *all);
    return all;
}

/* balancer_create for this run's backend plan: its budget, its memory model (or the deck's), [balance] mem_fill only
   where the backend's step is limited by its memory (a GPU's; a CPU rank's is by its compute), and [balance]
   ranks_per_node = auto as the ranks found on rank 0's node (ranks placed on the nodes in blocks). */
static balancer *create_balancer(const deck *config, const balance_sample *samples, int64_t n_samples,
                                 const comm_info *info, const backend_plan *memory)
{
    deck nodes = *config;
    if (!layout_family_sequence_parallel(config->model.family)) nodes.balance.sp = 1; /* off: setup_groups says so */
    if (nodes.balance.ranks_per_node == 0) nodes.balance.ranks_per_node = info->n_local_ranks > 0 ? info->n_local_ranks : 1;
    balancer *b = balancer_create(&nodes, samples, n_samples, info->n_ranks, memory->mem_budget,
                                  memory->has_memory_model ? &memory->memory_model : NULL);
    if (b && !memory->fills_memory) balancer_set_mem_fill(b, 0.0);
    return b;
}

/* What one epoch looks like under the balancer: steps, predicted seconds (sum of each step's slowest
   rank) and the lower bound (all predicted work spread evenly); with sequence-parallel groups the samples each group
   size ran (group_samples[j]: groups of 2^j ranks, over the epoch) and how the per-rank budget rose. Runs a scratch
   balancer (rank 0). */
enum { PLAN_GROUP_SIZES = 11 };
typedef struct {
    int64_t steps;
    double predicted_s, lower_bound_s, imbalance_pred;
    int sp_max;
    double group_samples[PLAN_GROUP_SIZES];
    int64_t raised_steps;
    double raise_max;
} epoch_plan;

/* Add a step's samples to group_samples by the size of the group that runs them (a member's share 1 / k). */
static void count_groups(const balance_assignment *step, double *group_samples)
{
    for (int m = 0; m < step->rank_micro_start[step->n_ranks]; m++) {
        int j = 0;
        while ((1 << j) < step->micro_group[m] && j < PLAN_GROUP_SIZES - 1) j++;
        group_samples[j] += (double)(step->micro_start[m + 1] - step->micro_start[m]) / step->micro_group[m];
    }
}

static epoch_plan plan_epoch(const deck *config, const balance_sample *samples, int64_t n_samples, const comm_info *info,
                             const backend_plan *memory, int n_calibration, const cost_features *calibration_features,
                             const double *calibration_seconds)
{
    epoch_plan plan = {0};
    const int n_ranks = info->n_ranks;
    balancer *scratch = create_balancer(config, samples, n_samples, info, memory);
    if (n_calibration > 0) balancer_calibrate(scratch, n_calibration, calibration_features, calibration_seconds);
    balance_assignment step = {0};
    double sum_mean = 0.0;
    for (;;) {
        balancer_next(scratch, &step);
        if (step.epoch != 0) break;
        double slowest = 0.0, total = 0.0;
        for (int r = 0; r < step.n_ranks; r++) {
            total += step.predicted_seconds[r];
            if (step.predicted_seconds[r] > slowest) slowest = step.predicted_seconds[r];
        }
        count_groups(&step, plan.group_samples);
        plan.steps++;
        plan.predicted_s += slowest;
        plan.lower_bound_s += total / n_ranks;
        sum_mean += total / n_ranks;
    }
    plan.imbalance_pred = plan.predicted_s > 0.0 ? 1.0 - sum_mean / plan.predicted_s : 0.0;
    plan.sp_max = balancer_sp_max(scratch);
    plan.raised_steps = balancer_sp_raised_steps(scratch);
    plan.raise_max = balancer_sp_raise_max(scratch);
    balance_assignment_free(&step);
    balancer_free(scratch);
    return plan;
}

/* --check: the samples per step each group size runs, and how the per-rank budget rose ([balance] sp). */
static void print_groups_line(FILE *out, const epoch_plan *epoch, const deck *config, int n_ranks)
{
    if (!layout_family_sequence_parallel(config->model.family) && balance_sp_limit(config, n_ranks) > 1)
        fprintf(out, "  groups     none: model.family = %s runs no sequence-parallel groups ([balance] sp runs as off; "
                "aldit-sim plans the groups)\n", deck_family_name(config->model.family));
    if (epoch->sp_max <= 1 || epoch->steps == 0) return;
    fprintf(out, "  groups     sp up to %d ranks:", epoch->sp_max);
    for (int j = 0, first = 1; j < PLAN_GROUP_SIZES; j++)
        if (epoch->group_samples[j] > 0) {
            fprintf(out, "%s k=%d %.1f", first ? "" : ",", 1 << j, epoch->group_samples[j] / (double)epoch->steps);
            first = 0;
        }
    fprintf(out, " samples per step; per-rank budget raised in %lld of %lld steps", (long long)epoch->raised_steps,
           (long long)epoch->steps);
    if (epoch->raised_steps > 0) fprintf(out, " (at most +%.1f%%: no group brings a sample within it)", 100.0 * epoch->raise_max);
    fprintf(out, "\n");
}

static void print_store_line(FILE *out, const store *data, const deck *config)
{
    int64_t total = 0, shortest = INT64_MAX, longest = 0;
    for (int64_t id = 0; id < data->n_samples; id++) {
        int64_t tokens = store_sample_tokens(&data->samples[id], config->model.patch_t, config->model.patch_h,
                                             config->model.patch_w);
        total += tokens;
        if (tokens < shortest) shortest = tokens;
        if (tokens > longest) longest = tokens;
    }
    fprintf(out, "  store      %s: %lld samples, %lld tokens (%lld to %lld per sample), text_dim %d\n", data->path,
           (long long)data->n_samples, (long long)total, (long long)shortest, (long long)longest, data->text_dim);
}

/* 0, or ALDIT_EXIT_USAGE where the deck names no training store (rank 0 says which key; the deck is the same on
   every rank, so every rank returns the same). */
static int require_store_key(const deck *config, int rank)
{
    if (config->data.store[0]) return 0;
    if (rank == 0)
        fprintf(stderr, "aldit: error: %s sets no [data] store: add a [data] section with store = PATH (a latent store "
                "made by aldit-store or tools/prepare_store.py), or pass data.store=PATH on the command line\n",
                config->source[0] ? config->source : "the deck");
    return ALDIT_EXIT_USAGE;
}

/* Collective (--check): what a run would find in its folder. Resuming: the newest checkpoint must pass the checks
   the run's resume makes (checkpoint_check_resumable: model dims, eps, text_padding, seed, moments, the EMA, every
   tensor's shape, checksum and finiteness); a fresh start: no earlier run's files. 0 or 2. */
static int check_run_folder(const deck *config, int rank)
{
    int status = 0;
    if (rank == 0 && config->checkpoint.resume) {
        char path[2 * DECK_PATH_MAX];
        int found = checkpoint_find_latest(config, path, sizeof path, stderr);
        if (found > 0) {
            model table;
            model_create_table(&table, config);
            if (checkpoint_check_resumable(path, config, &table, stderr) != 0) {
                fprintf(stderr, "aldit: error: the run would resume from %s, which does not fit this deck (why: "
                        "above); fix the deck, use another [run] dir, or move the run folder's checkpoints away\n", path);
                status = ALDIT_EXIT_USAGE;
            }
            model_free(&table);
        } else if (found < 0) status = ALDIT_EXIT_USAGE;
    } else if (rank == 0) {
        char path[2 * DECK_PATH_MAX];
        metrics_path(config, path, sizeof path);
        status = rundir_check_fresh(config, path, stderr);
    }
    comm_bcast_bytes(&status, sizeof status);
    return status;
}

/* Collective (--check): the balancer state of the checkpoint the run would resume from, loaded into this deck's
   balancer as the run's resume does (the same samples, strategy and seed). 0 or 2 on every rank. */
static int check_resumed_balancer(const deck *config, const balance_sample *samples, int64_t n_samples,
                                  const comm_info *info, const backend_plan *plan)
{
    int status = 0;
    char path[2 * DECK_PATH_MAX];
    if (info->rank == 0 && config->checkpoint.resume && checkpoint_find_latest(config, path, sizeof path, stderr) > 0) {
        model table;
        model_create_table(&table, config);
        checkpoint_state state = {0};
        checkpoint_reader *reader = checkpoint_reader_open(path, config, &table, stderr);
        status = !reader || checkpoint_check_resume(reader, config, &state) != 0;
        /* resume_data = changed: the run starts a new epoch order on this store instead of loading the state */
        const int same_data = config->checkpoint.resume_data == RESUME_DATA_SAME;
        balancer *packer = status == 0 && same_data ? create_balancer(config, samples, n_samples, info, plan) : NULL;
        if (status == 0 && same_data &&
            (!packer || balancer_load_state(packer, state.balancer_state, state.balancer_bytes) != 0)) {
            fprintf(stderr, "aldit: error: %s: the balancer state does not match this deck and store; the run would "
                    "not resume from it: use its deck and store, set checkpoint.resume_data = changed to continue it on "
                    "this store, use another [run] dir, or move the checkpoint away\n", path);
            status = 1;
        }
        balancer_free(packer);
        free(state.balancer_state);
        free(state.fp8_state);
        free(state.rank_seconds);
        checkpoint_reader_close(reader);
        model_free(&table);
    }
    comm_bcast_bytes(&status, sizeof status);
    return status != 0 ? ALDIT_EXIT_USAGE : 0;
}

int train_check(const deck *config, const comm_info *info)
{
    int offline = 0;
    if (require_store_key(config, info->rank) != 0) return ALDIT_EXIT_USAGE;
    int device = device_resolve_check(config, info, &offline);
    if (device < 0) return device == -1 ? ALDIT_EXIT_ERROR : ALDIT_EXIT_USAGE;
    if (config->model.init[0]) { /* the names and shapes of [model] init's weights, as a run would load them */
        int status = 0;
        if (info->rank == 0) {
            model table;
            model_create_table(&table, config);
            status = checkpoint_check_weights(config->model.init, &table, stderr);
            model_free(&table);
            if (status != 0) fprintf(stderr, "aldit: error: cannot start from [model] init = %s\n", config->model.init);
        }
        comm_bcast_bytes(&status, sizeof status);
        if (status != 0) return ALDIT_EXIT_USAGE;
    }
    if (check_run_folder(config, info->rank) != 0) return ALDIT_EXIT_USAGE;
    store data;
    store_open_bcast(&data, config->data.store);
    check_store_fits_model(&data, config, info->rank, "store");
    evaluator *eval = eval_open(config);
    if (eval) check_store_fits_model(eval_store(eval), config, info->rank, "[eval] store =");
    model table;
    model_create_table(&table, config);
    balance_sample *samples = train_balance_samples(&data, config);
    int64_t n_planned = 0;
    balance_sample *planned = plan_samples(samples, data.n_samples, eval, &n_planned);
    backend_plan plan;
    int status = device_check_plan_fn(config, device, offline)(config, info, &table, planned, n_planned, &plan);
    free(planned);
    if (status == 0 && eval) status = eval_plan(eval, &plan, info->n_ranks, 1, 0, NULL, NULL);
    if (status == 0) status = check_resumed_balancer(config, samples, data.n_samples, info, &plan);
    if (status == 0 && info->rank == 0) {
        /* the resolved deck alone on stdout (a deck --check accepts again); the plan on stderr */
        deck_print(config, stdout);
        fflush(stdout);
        epoch_plan epoch = plan_epoch(config, samples, data.n_samples, info, &plan, 0, NULL, NULL);
        fprintf(stderr, "# plan for %d rank(s)\n", info->n_ranks);
        print_store_line(stderr, &data, config);
        fprintf(stderr, "  model      %s: %lld parameters\n", config->model.name, (long long)table.n_weights);
        fputs(plan.device_text, stderr);
        fputs(plan.memory_text, stderr);
        fprintf(stderr, "  balancer   %s: %lld steps per epoch, predicted epoch %.3g s vs lower bound %.3g s "
               "(predicted imbalance %.1f%%)\n", deck_strategy_name(config->balance.strategy), (long long)epoch.steps,
               epoch.predicted_s, epoch.lower_bound_s, 100.0 * epoch.imbalance_pred);
        print_groups_line(stderr, &epoch, config, info->n_ranks);
        if (config->run.steps > 0) fprintf(stderr, "  run        %lld steps\n", (long long)config->run.steps);
        else fprintf(stderr, "  run        %lld epochs = %lld steps\n", (long long)config->run.epochs,
                    (long long)(config->run.epochs * epoch.steps));
        if (eval) {
            char line[2 * DECK_PATH_MAX];
            eval_describe(eval, line, sizeof line);
            fputs(line, stderr);
        }
    }
    eval_close(eval);
    if (plan.has_memory_model) cost_model_free(&plan.memory_model);
    free(samples);
    model_free(&table);
    store_close(&data);
    return status;
}

/* ---- training state ------------------------------------------------------------------------------ */

typedef enum { PHASE_COMPUTE, PHASE_DATA_WAIT, PHASE_COMM, PHASE_BALANCER, PHASE_OPTIMIZER,
               PHASE_CHECKPOINT, PHASE_EVAL, PHASE_LOG, N_PHASES } phase;
static const char *const phase_names[N_PHASES] = {
    "compute (forward + backward)", "data wait (prefetch + noise)", "communication (all-reduce)",
    "balancer (assign + scatter)", "optimizer (clip + AdamW)", "checkpoint", "validation (forward only)", "logging"};

typedef struct {
    const deck *config;
    const comm_info *info;
    /* start-up calibration: features and measured seconds of timed sample shapes (rank 0; 0 = none) */
    int n_calibration;
    cost_features *calibration_features;
    double *calibration_seconds;
    store data;
    model net;                      /* the parameter table (the CPU backend allocates its weights) */
    backend *dev;                   /* the device's backend: it holds the training state */
    balancer *packer;               /* rank 0 */
    balance_sample *samples;        /* every sample as the balancer sees it (backends plan their capacity with it) */
    unsigned char *snapshot;        /* rank 0: balancer state before the lookahead draw (what a checkpoint holds) */
    size_t snapshot_bytes, snapshot_capacity;
    double *rank_seconds;           /* rank 0: measured compute seconds per rank of the last step */
    double *rank_measures;          /* rank 0: the gathered (compute s, data wait s, memory peak) per rank */
    double *resumed_seconds;        /* rank 0: those of the checkpoint resumed from, observed after the first draw */
    unsigned char *resumed_fp8;     /* rank 0: the checkpoint's FP8 scaling state (NULL: none), until it is restored */
    size_t resumed_fp8_bytes;
    prefetcher *reader;
    rank_assignment current, upcoming;
    balance_assignment drawn;       /* rank 0: the last assignment drawn */
    double upcoming_pred_max, upcoming_pred_mean, upcoming_mem;
    double current_pred_max, current_pred_mean, current_mem;
    /* rank 0, per rank of the upcoming / current step: predicted seconds and samples (for the metrics) */
    double *upcoming_rank_pred, *current_rank_pred;
    int64_t *upcoming_rank_samples, *current_rank_samples;
    /* per-sample shapes of the current step */
    int32_t *frames, *height, *width, *text_len;
    int sample_capacity;
    double mem_budget;
    int64_t step;                   /* optimizer steps done */
    int64_t total_steps;            /* for the LR schedule */
    int64_t steps_per_epoch;
    int64_t skipped_steps;
    int skipped_in_a_row;           /* consecutive skipped steps ([train] max_skipped) */
    int profiling;                  /* the device profiler's capture is on ([log] profile_from) */
    int64_t *order_tokens;          /* tokens of the upcoming samples, for their order in the micro-batches */
    int64_t corrupt_samples;        /* samples left out unread ([data] on_corrupt = skip), all ranks */
    int checkpoint_failures;        /* consecutive failed periodic checkpoints ([checkpoint] max_failures) */
    int64_t checkpoint_step;        /* step of the last checkpoint written or resumed from */
    double checkpoint_s;            /* rank 0: when it was written (or the loop started), for [checkpoint] interval */
    double step_timeout;            /* seconds the current step may take (the watchdog's; the same on all ranks) */
    double phase_s[N_PHASES];
    double started_s, loop_started_s;
    int64_t first_step;
    int test_group, test_blocks;    /* ALDIT_TEST_SP_GROUP: micro-batches run by groups of test_group ranks (1: off), in
                                       the first test_blocks blocks (-1: all) */
    metrics_file *metrics;          /* rank 0 */
    int metrics_failed;             /* a write to it failed (warned once; training goes on) */
    double setup_s;                 /* the device's one-time set-up inside this run's steps (backend setup_stats) */
    int64_t setup_count;
    metrics_file *micro_log;        /* [log] micro_batches: this rank's micro-batches (NULL when off) */
    int micro_log_failed;
    int ema_resumed;                /* [train] ema_decay: the EMA came from the checkpoint resumed (else the weights) */
    checkpoint_hook *hook;          /* rank 0: [checkpoint] hook, NULL when none */
    evaluator *eval;                /* [eval]: NULL when off */
    eval_result last_eval;          /* the last validation pass (has_eval: there was one in this process) */
    int has_eval;
} trainer;

static double seconds_since(double start) { return comm_time() - start; }

/* Rank 0: keep the balancer state as it is now, before any lookahead draw: the state a checkpoint of
   the step in progress must hold (its next draw is the step after). */
static void snapshot_balancer(trainer *t)
{
    t->snapshot_bytes = balancer_state_bytes(t->packer);
    if (t->snapshot_bytes > t->snapshot_capacity) {
        t->snapshot_capacity = t->snapshot_bytes;
        t->snapshot = xrealloc(t->snapshot, t->snapshot_capacity);
    }
    balancer_save_state(t->packer, t->snapshot);
}

/* This rank's samples of an assignment in the order its device runs fastest (backend_plan.last_sample_tile). */
static void order_for_device(trainer *t, rank_assignment *mine)
{
    const backend_plan *plan = t->dev->ops->plan(t->dev);
    if (plan->last_sample_tile <= 0 || mine->n_samples == 0) return;
    const deck *config = t->config;
    t->order_tokens = xrealloc(t->order_tokens, (size_t)mine->n_samples * sizeof *t->order_tokens);
    for (int i = 0; i < mine->n_samples; i++)
        t->order_tokens[i] = store_sample_tokens(&t->data.samples[mine->ids[i]], config->model.patch_t,
                                                 config->model.patch_h, config->model.patch_w);
    rank_assignment_order_whole_tiles(mine, t->order_tokens, plan->last_sample_tile, plan->last_sample_min_tokens);
}

/* Rank 0 draws the next assignment (snapshotting the balancer state first) and scatters it; every rank
   receives its part into `upcoming`, in the order its device runs fastest. */
static void draw_upcoming(trainer *t)
{
    double started = comm_time();
    if (t->info->rank == 0) {
        snapshot_balancer(t);
        balancer_next(t->packer, &t->drawn);
        if (t->test_group > 1) balance_group_blocks(&t->drawn, t->test_group, t->test_blocks);
        double slowest = 0.0, total = 0.0, mem = 0.0;
        for (int r = 0; r < t->drawn.n_ranks; r++) {
            total += t->drawn.predicted_seconds[r];
            if (t->drawn.predicted_seconds[r] > slowest) slowest = t->drawn.predicted_seconds[r];
            if (t->drawn.peak_mem_bytes[r] > mem) mem = t->drawn.peak_mem_bytes[r];
        }
        t->upcoming_pred_max = slowest;
        t->upcoming_pred_mean = total / t->drawn.n_ranks;
        t->upcoming_mem = mem;
        for (int r = 0; r < t->drawn.n_ranks; r++) {
            t->upcoming_rank_pred[r] = t->drawn.predicted_seconds[r];
            t->upcoming_rank_samples[r] = t->drawn.rank_start[r + 1] - t->drawn.rank_start[r];
        }
    }
    balance_scatter(t->info->rank == 0 ? &t->drawn : NULL, &t->upcoming);
    order_for_device(t, &t->upcoming);
    t->phase_s[PHASE_BALANCER] += seconds_since(started);
}

static void swap_assignments(trainer *t)
{
    rank_assignment held = t->current;
    t->current = t->upcoming;
    t->upcoming = held;
    t->current_pred_max = t->upcoming_pred_max;
    t->current_pred_mean = t->upcoming_pred_mean;
    t->current_mem = t->upcoming_mem;
    double *pred = t->current_rank_pred;
    t->current_rank_pred = t->upcoming_rank_pred;
    t->upcoming_rank_pred = pred;
    int64_t *samples = t->current_rank_samples;
    t->current_rank_samples = t->upcoming_rank_samples;
    t->upcoming_rank_samples = samples;
}

/* The shapes of this step's samples as the model takes them (noise and timesteps come with the batch). */
static void prepare_samples(trainer *t, const sample_batch *batch)
{
    int n_samples = batch->n_samples;
    if (n_samples > t->sample_capacity) {
        t->sample_capacity = n_samples;
        t->frames = xrealloc(t->frames, (size_t)n_samples * sizeof *t->frames);
        t->height = xrealloc(t->height, (size_t)n_samples * sizeof *t->height);
        t->width = xrealloc(t->width, (size_t)n_samples * sizeof *t->width);
        t->text_len = xrealloc(t->text_len, (size_t)n_samples * sizeof *t->text_len);
    }
    for (int i = 0; i < n_samples; i++) {
        const store_sample *sample = &t->data.samples[batch->ids[i]];
        t->frames[i] = sample->frames;
        t->height[i] = sample->height;
        t->width[i] = sample->width;
        t->text_len[i] = text_rows_of(sample, t->config);
    }
}

/* [log] micro_batches: one line for micro-batch `micro` of this rank: its seconds (the backend's call, until its
   losses are back), the device's one-time set-up among them (setup_s: cuDNN plans of new shapes) and each sample's
   video tokens and caption rows (Qwen or padded text, ByT5, image-to-video SigLIP). */
static void setup_stats(const trainer *t, int64_t *count, double *seconds)
{
    *count = 0;
    *seconds = 0.0;
    if (t->dev->ops->setup_stats) t->dev->ops->setup_stats(t->dev, count, seconds);
}

static void log_micro_batch(trainer *t, const sample_batch *batch, int micro, double seconds, double setup_s)
{
    const deck *config = t->config;
    metrics_add(t->micro_log, "{\"step\": %lld, \"rank\": %d, \"micro\": %d, \"group\": %d, \"seconds\": %.6f, "
                "\"setup_s\": %.6f, \"samples\": [", (long long)(t->step + 1), t->info->rank, micro,
                t->current.micro_group[micro], seconds, setup_s);
    for (int i = t->current.micro_start[micro]; i < t->current.micro_start[micro + 1]; i++) {
        const int64_t tokens = store_sample_tokens(&t->data.samples[batch->ids[i]], config->model.patch_t,
                                                   config->model.patch_h, config->model.patch_w);
        metrics_add(t->micro_log, "%s[%lld, %d]", i > t->current.micro_start[micro] ? ", " : "", (long long)tokens,
                    t->text_len[i] + batch->text_2_len[i] + batch->image_len[i]);
    }
    metrics_add(t->micro_log, "]}");
    const int failure = metrics_end_line(t->micro_log);
    if (failure != 0 && !t->micro_log_failed) {
        t->micro_log_failed = 1;
        aldit_warn("rank %d: writing its micro-batch log in %s failed at step %lld: %s; the file keeps whole lines "
                   "only, training goes on", t->info->rank, config->run.dir, (long long)(t->step + 1), strerror(failure));
    }
}

/* Forward + backward of every micro-batch of this rank, a group's together with its other members (model_batch's
   sp_size); the backend's gradients are already divided by the step's global sample count. Returns this rank's sum of
   per-sample losses (of a group's micro-batch, this member's part: the ranks' sum counts each sample once). */
static double compute_gradients(trainer *t, const sample_batch *batch)
{
    t->dev->ops->begin_step(t->dev, t->current.max_micro);
    const float grad_scale = (float)(1.0 / (double)t->current.global_samples);
    double loss_sum = 0.0;
    for (int micro = 0; micro < t->current.n_micro; micro++) {
        int first = t->current.micro_start[micro], end = t->current.micro_start[micro + 1];
        const int group = t->current.micro_group[micro];   /* > 1: run with the group's other members */
        model_batch mb = {
            .n_samples = end - first,
            .frames = t->frames + first, .height = t->height + first, .width = t->width + first,
            .text_len = t->text_len + first,
            .latents = batch->latents + batch->latent_start[first],
            .noise = batch->noise + batch->latent_start[first],
            .sigma = batch->sigma + first,
            .text = batch->text + batch->text_start[first],
            .text_2_len = batch->text_2_len + first, .text_2 = batch->text_2 + batch->text_2_start[first],
            .image_len = batch->image_len + first, .image = batch->image + batch->image_start[first],
            .i2v = batch->i2v + first,
            .sp_size = group, .sp_rank = t->info->rank % group, .sp_group = comm_group_get(group),
        };
        const double started = comm_time();
        int64_t count_before, count_after;
        double setup_before, setup_after;
        setup_stats(t, &count_before, &setup_before);
        loss_sum += t->dev->ops->micro_batch(t->dev, &mb, grad_scale, micro == t->current.n_micro - 1);
        const double seconds = seconds_since(started);
        setup_stats(t, &count_after, &setup_after);
        t->setup_s += setup_after - setup_before;
        t->setup_count += count_after - count_before;
        if (t->micro_log) log_micro_batch(t, batch, micro, seconds, setup_after - setup_before);
    }
    return loss_sum;
}


/* ---- checkpoints --------------------------------------------------------------------------------- */

/* After a checkpoint (the same outcome on every rank): say how it went; end the job when it must. */
static void checkpoint_outcome(trainer *t, int must_succeed, const char *path, double seconds)
{
    const int give_up = t->checkpoint_failures >= t->config->checkpoint.max_failures;
    if (t->checkpoint_failures > 0 && (must_succeed || give_up)) {
        char last_good[2 * DECK_PATH_MAX] = "none";
        if (t->checkpoint_step > 0) checkpoint_path(t->config, t->checkpoint_step, last_good, sizeof last_good);
        if (t->info->rank == 0 && must_succeed)
            fprintf(stderr, "aldit: error: the checkpoint of step %lld could not be written (why: above); the last good "
                    "checkpoint is %s\n", (long long)t->step, last_good);
        else if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: %d checkpoints in a row failed (step %lld the last; why: above) "
                    "([checkpoint] max_failures = %d): stopping rather than training on without checkpoints; the last "
                    "good checkpoint is %s. Free space or fix the run folder, then restart to resume from it\n",
                    t->checkpoint_failures, (long long)t->step, t->config->checkpoint.max_failures, last_good);
        exit_all(ALDIT_EXIT_ERROR);
    }
    if (t->info->rank == 0) {
        if (t->checkpoint_failures > 0)
            aldit_warn("checkpoint of step %lld failed (%d in a row; the run stops at [checkpoint] max_failures = %d); "
                       "training goes on", (long long)t->step, t->checkpoint_failures, t->config->checkpoint.max_failures);
        else printf("aldit: checkpoint %s (%.2f s)\n", path, seconds);
        fflush(stdout);
        if (t->checkpoint_failures == 0) hook_after_checkpoint(t->hook, path, t->step);
    }
}

/* The state groups a checkpoint of this run holds: weights, moments and, with [train] ema_decay, the EMA. */
static unsigned checkpoint_groups(const trainer *t)
{
    return CHECKPOINT_TRAINING_GROUPS | (t->config->train.ema_decay > 0.0 ? CHECKPOINT_GROUP_BIT(CHECKPOINT_EMA) : 0u);
}

/* Collective: rank 0 writes (after the prefetch thread has left the HDF5 library) what every rank's part of the
   state streams to it tensor by tensor (state.h), and everyone learns the outcome. A failed write is fatal when
   `must_succeed` (the final checkpoint) or when [checkpoint] max_failures periodic ones in a row failed (the last
   good checkpoint stays); otherwise a warning. Outside the step watch, under the state watch (watchdog.h): a rank
   stopped meanwhile is named and the job ends before the file is renamed into place. */
static void save_checkpoint(trainer *t, int must_succeed)
{
    double started = comm_time();
    int status = 0;
    char path[2 * DECK_PATH_MAX] = "";
    const unsigned groups = checkpoint_groups(t);
    checkpoint_writer *writer = NULL;
    checkpoint_state state = {
        .step = t->step, .epoch = t->current.epoch, .seed = t->config->run.seed,
        .steps_per_epoch = t->steps_per_epoch,
        .balancer_state = t->snapshot, .balancer_bytes = t->snapshot_bytes,
        .rank_seconds = t->rank_seconds, .n_ranks = t->info->n_ranks,
    };
    char what[64];
    snprintf(what, sizeof what, "checkpoint of step %lld", (long long)t->step);
    watchdog_state_begin(t->info->rank, what, t->step_timeout);
    const backend_ops *ops = t->dev->ops;
    unsigned char *fp8 = NULL;
    if (t->info->rank == 0 && ops->fp8_state_bytes && (state.fp8_bytes = ops->fp8_state_bytes(t->dev)) > 0) {
        fp8 = xmalloc(state.fp8_bytes);  /* rank 0's scaling state, every rank's (backend.h) */
        ops->get_fp8_state(t->dev, fp8);
        state.fp8_state = fp8;
    }
    if (t->info->rank == 0) {
        prefetch_drain(t->reader);
        const size_t state_bytes = t->snapshot_bytes + sizeof(double) * (size_t)t->info->n_ranks + state.fp8_bytes;
        writer = checkpoint_writer_open(t->config, &t->net, t->step, groups, state_bytes, stderr);
        status = writer == NULL;
    }
    comm_bcast_bytes(&status, sizeof status);
    if (status == 0) {
        watchdog_test_stop(t->info->rank, "save", t->step);
        watchdog_test_stop(t->info->rank, "hangsave", t->step);
        status = state_save(t->dev, &t->net, writer, groups); /* collective: every rank's part of each tensor */
        if (t->info->rank == 0) {
            if (status == 0) status = checkpoint_write_state(writer, &state);
            status = checkpoint_writer_commit(writer, path, sizeof path) != 0 || status != 0; /* discards a failed file */
        }
        comm_bcast_bytes(&status, sizeof status);
    }
    watchdog_state_end();
    free(fp8);
    t->phase_s[PHASE_CHECKPOINT] += seconds_since(started);
    t->checkpoint_failures = status != 0 ? t->checkpoint_failures + 1 : 0;
    if (status == 0) t->checkpoint_step = t->step;
    if (t->info->rank == 0) t->checkpoint_s = comm_time();
    checkpoint_outcome(t, must_succeed, path, seconds_since(started));
}

/* Rank 0: opens the checkpoint to resume from and reads its run state (the tensors stream later); non-zero after
   printing why it cannot be resumed. */
static int open_resume(trainer *t, const char *path, checkpoint_reader **reader, int64_t *resumed_step,
                       int64_t *resumed_plan)
{
    const deck *config = t->config;
    checkpoint_state state = {0};
    checkpoint_reader *r = checkpoint_reader_open(path, config, &t->net, stderr);
    int status = r == NULL;
    if (status == 0) status = checkpoint_check_resume(r, config, &state);
    /* resume_data = changed: the store is not the checkpoint's; the balancer starts its epoch order anew */
    const int same_data = config->checkpoint.resume_data == RESUME_DATA_SAME;
    if (status == 0 && same_data && balancer_load_state(t->packer, state.balancer_state, state.balancer_bytes) != 0) {
        fprintf(stderr, "aldit: error: %s: the balancer state does not match this deck and store; to continue this "
                "run on a changed or grown store (weights, AdamW moments, EMA, step and schedule carried over, a new "
                "epoch order), set checkpoint.resume_data = changed\n", path);
        status = 1;
    }
    if (status == 0 && !same_data) balancer_start_at_epoch(t->packer, state.epoch + 1);
    *resumed_step = state.step;
    /* keep the schedule the run started with (a new plan would rest on other measured times) */
    if (state.steps_per_epoch > 0 && same_data) *resumed_plan = state.steps_per_epoch;
    /* the balancer drops unobserved steps of another rank count on load; then so do we */
    if (status == 0 && same_data && state.n_ranks == t->info->n_ranks) t->resumed_seconds = state.rank_seconds;
    else free(state.rank_seconds);
    free(state.balancer_state);
    t->resumed_fp8 = state.fp8_state;
    t->resumed_fp8_bytes = state.fp8_bytes;
    if (status != 0) {
        checkpoint_reader_close(r);
        r = NULL;
    }
    *reader = r;
    return status;
}

/* Collective, on a resume: the checkpoint's FP8 scaling state (rank 0 read it) to every rank's backend, where the run
   keeps one ([train] precision = fp8); a checkpoint without one (a bf16 run's) leaves the scaling to start afresh. */
static void restore_fp8_state(trainer *t, const char *path)
{
    const backend_ops *ops = t->dev->ops;
    const int keeps = ops->fp8_state_bytes && ops->fp8_state_bytes(t->dev) > 0;
    uint64_t bytes = t->resumed_fp8_bytes;
    comm_bcast_bytes(&bytes, sizeof bytes);
    if (keeps && bytes > 0) {
        if (t->info->rank != 0) t->resumed_fp8 = xmalloc((size_t)bytes);
        comm_bcast_bytes(t->resumed_fp8, (size_t)bytes);
        char why[512];
        if (ops->set_fp8_state(t->dev, t->resumed_fp8, (size_t)bytes, why, sizeof why) != 0) {
            if (t->info->rank == 0)
                fprintf(stderr, "aldit: error: cannot resume from %s: %s; resume with the checkpoint's [train] "
                        "precision, fp8_amax_history and fp8_margin, or move it away\n", path, why);
            exit_all(ALDIT_EXIT_USAGE);
        }
    } else if (t->info->rank == 0 && keeps) {
        printf("aldit: note: %s has no FP8 scaling state (a bf16 run's): the FP8 scales start afresh\n", path);
    } else if (t->info->rank == 0 && bytes > 0) {
        printf("aldit: note: the FP8 scaling state of %s is dropped: this run is bf16\n", path);
    }
    free(t->resumed_fp8);
    t->resumed_fp8 = NULL;
    t->resumed_fp8_bytes = 0;
}

/* The start-up's watch (watchdog.h): from train_run's first collective to the first step, each collective's wait
   under the first step's deadline, so that a rank stopped there is named (the load of the state has its own watch). */
static void watch_start_up(const deck *config, int rank)
{
    watchdog_phase_begin(rank, "start-up", watchdog_timeout(config, 0.0, 1));
}

/* Collective, inside the start-up's watch: the backend's state from a checkpoint to resume from, [model] init's
   weights, or the random init, streamed tensor by tensor (state.h) under the state watch. */
static void initial_state(trainer *t, char *resumed_from, size_t resumed_size)
{
    const deck *config = t->config;
    int rank = t->info->rank, found = 0, status = 0;
    resumed_from[0] = '\0';
    if (rank == 0 && config->checkpoint.resume) found = checkpoint_find_latest(config, resumed_from, resumed_size, stderr);
    comm_bcast_bytes(&found, sizeof found);
    if (found < 0) exit_all(ALDIT_EXIT_USAGE);
    int64_t resumed_step = 0, resumed_plan = 0; /* steps per epoch of the run resumed, 0 = none */
    checkpoint_reader *reader = NULL;
    unsigned groups = 0;
    if (found) {
        groups = CHECKPOINT_TRAINING_GROUPS;
        if (rank == 0) status = open_resume(t, resumed_from, &reader, &resumed_step, &resumed_plan);
        if (rank == 0 && status != 0)
            fprintf(stderr, "aldit: error: cannot resume from %s; move it away or set [checkpoint] resume = off\n",
                    resumed_from);
        /* the EMA resumes from /ema where the file has it; else (a run that kept none) it starts at the weights */
        if (rank == 0 && status == 0 && config->train.ema_decay > 0.0)
            t->ema_resumed = checkpoint_reader_has(reader, CHECKPOINT_EMA);
        comm_bcast_bytes(&t->ema_resumed, sizeof t->ema_resumed);
        if (t->ema_resumed) groups |= CHECKPOINT_GROUP_BIT(CHECKPOINT_EMA);
        else if (rank == 0 && status == 0 && config->train.ema_decay > 0.0)
            printf("aldit: note: %s has no /ema (its run kept no EMA): the EMA starts at its weights\n", resumed_from);
        else if (rank == 0 && status == 0 && checkpoint_reader_has(reader, CHECKPOINT_EMA)) /* checked: ema_drop */
            printf("aldit: note: the EMA of %s (/ema) is dropped ([train] ema_drop = on): this run keeps none\n",
                   resumed_from);
    } else if (config->model.init[0]) {
        groups = CHECKPOINT_GROUP_BIT(CHECKPOINT_WEIGHTS);
        if (rank == 0) {
            reader = checkpoint_reader_open_init(config->model.init, &t->net, stderr);
            status = reader == NULL;
        }
    }
    comm_bcast_bytes(&status, sizeof status);
    /* the first step's deadline per tensor: the step's own is not known before the first draw */
    watchdog_state_begin(rank, found ? "resume: loading the checkpoint's state" : "loading the initial state",
                         watchdog_timeout(config, 0.0, 1));
    watchdog_test_stop(rank, "load", 0);
    if (status == 0) status = state_load(t->dev, &t->net, reader, groups, config->run.seed);
    watch_start_up(config, rank); /* ends the state watch */
    if (status != 0 && rank == 0 && !found && config->model.init[0])
        fprintf(stderr, "aldit: error: cannot start from [model] init = %s\n", config->model.init);
    else if (status != 0 && rank == 0 && reader)
        fprintf(stderr, "aldit: error: cannot resume from %s; move it away or set [checkpoint] resume = off\n",
                resumed_from);
    checkpoint_reader_close(reader);
    if (status != 0) exit_all(ALDIT_EXIT_USAGE);
    if (found) restore_fp8_state(t, resumed_from);
    comm_bcast_bytes(&resumed_step, sizeof resumed_step);
    comm_bcast_bytes(&resumed_plan, sizeof resumed_plan);
    if (resumed_plan > 0 && config->run.steps <= 0) {
        t->steps_per_epoch = resumed_plan;
        t->total_steps = config->run.epochs * resumed_plan;
    }
    t->step = resumed_step;
}

/* ---- output -------------------------------------------------------------------------------------- */

/* The start-up summary's first part, printed before the start-up calibration: what the run is and where it runs. */
static void print_summary_head(const trainer *t)
{
    const deck *config = t->config;
    const backend_plan *plan = t->dev->ops->plan(t->dev);
    char weights_text[32];
    format_size(4.0 * (double)t->net.n_weights, weights_text, sizeof weights_text);
    printf("aldit %s: training\n", PACKAGE_VERSION);
    printf("  deck       %s\n", config->source[0] ? config->source : "(defaults)");
    fputs(plan->device_text, stdout);
    printf("  model      %s: dim %d, ffn %d, %d heads, %d layers; %lld parameters (%s fp32)\n", config->model.name,
           config->model.dim, config->model.ffn_dim, config->model.num_heads, config->model.num_layers,
           (long long)t->net.n_weights, weights_text);
    printf("  ranks      %d (%d on this node)\n", t->info->n_ranks, t->info->n_local_ranks);
    print_store_line(stdout, &t->data, config);
    if (config->balance.global_batch > t->data.n_samples) /* the balancer takes what an epoch holds */
        printf("  strategy   %s, global batch %lld samples: more than the store's %lld, so each step takes the whole "
               "epoch\n", deck_strategy_name(config->balance.strategy), (long long)config->balance.global_batch,
               (long long)t->data.n_samples);
    else if (config->balance.global_batch > 0)
        printf("  strategy   %s, global batch %lld samples\n", deck_strategy_name(config->balance.strategy),
               (long long)config->balance.global_batch);
    else if (config->balance.global_tokens > 0)
        printf("  strategy   %s, global batch of at most %lld tokens\n", deck_strategy_name(config->balance.strategy),
               (long long)config->balance.global_tokens);
    else printf("  strategy   %s, budget-filled steps\n", deck_strategy_name(config->balance.strategy));
    fputs(plan->memory_text, stdout);
    fflush(stdout);
}

/* The summary's rest, once the calibration planned the epoch and the state is loaded: the run folder, where the
   state comes from, the schedule, the metrics file. */
static void print_summary(const trainer *t, const char *resumed_from)
{
    const deck *config = t->config;
    printf("  run dir    %s (%s)\n", config->run.dir, resumed_from[0] ? "resuming" : "fresh start");
    if (resumed_from[0])
        printf("  resumed    %s at step %lld; the schedule below is this deck's (a run extended past its first "
               "run.steps re-plans the decay over the new total)\n", resumed_from, (long long)t->step);
    if (resumed_from[0] && config->checkpoint.resume_data == RESUME_DATA_CHANGED)
        printf("  data       changed (checkpoint.resume_data): weights, AdamW moments, EMA and step carried over; "
               "the store's epoch order starts anew with the next epoch\n");
    else if (config->model.init[0]) printf("  init       weights from %s\n", config->model.init);
    printf("  schedule   %lld steps (%lld per epoch), lr %g, warmup %lld, %s to %g, weight decay %g, clip %g\n",
           (long long)t->total_steps, (long long)t->steps_per_epoch, config->train.lr,
           (long long)config->train.warmup_steps, config->train.lr_schedule == LR_COSINE ? "cosine" : "constant",
           config->train.min_lr, config->train.weight_decay, config->train.grad_clip);
    if (config->train.ema_decay > 0.0)
        printf("  ema        fp32 EMA of the weights, decay %g%s, from %s\n", config->train.ema_decay,
               config->train.ema_warmup ? " (warm-up: min(decay, (1 + k) / (10 + k)) at step k + 1)" : "",
               t->ema_resumed ? "the checkpoint's /ema" : resumed_from[0] ? "the checkpoint's weights (it has no /ema)"
               : config->model.init[0] ? "the [model] init weights" : "the initial weights");
    if (t->eval) {
        char line[2 * DECK_PATH_MAX];
        eval_describe(t->eval, line, sizeof line);
        fputs(line, stdout);
    }
    char path[2 * DECK_PATH_MAX];
    metrics_path(config, path, sizeof path);
    printf("  metrics    %s\n", path);
    fflush(stdout);
}

/* Runs of up to this many ranks also log each rank's measured and predicted seconds and samples per step. */
#define METRICS_MAX_RANK_ARRAYS 64

typedef struct {
    double loss, lr, grad_norm, tokens, model_flops, step_s, compute_max, compute_mean, wait_max, comm_s, balancer_s, mem_peak;
    int skipped;
    int validated;                  /* a validation pass ran after this step (trainer.last_eval) */
} step_record;

/* A double as JSON: shortest exact form (%.17g), or null when not finite (a skipped step). */
static const char *json_number(double value, char *text, size_t text_size)
{
    if (isfinite(value)) snprintf(text, text_size, "%.17g", value);
    else snprintf(text, text_size, "null");
    return text;
}

/* A finite double as the shortest of %.15g..%.17g that reads back to it (the deck's spelling of [eval] sigmas). */
static const char *json_short(double value, char *text, size_t text_size)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, text_size, "%.*g", digits, value);
        if (strtod(text, NULL) == value) break;
    }
    return text;
}

static void write_metrics_line(trainer *t, const step_record *r)
{
    char loss[32], grad_norm[32];
    double imbalance = r->compute_max > 0.0 ? 1.0 - r->compute_mean / r->compute_max : 0.0;
    double imbalance_pred = t->current_pred_max > 0.0 ? 1.0 - t->current_pred_mean / t->current_pred_max : 0.0;
    metrics_add(t->metrics,
            "{\"step\": %lld, \"epoch\": %lld, \"loss\": %s, \"lr\": %.17g, \"grad_norm\": %s, "
            "\"samples\": %lld, \"tokens\": %.0f, \"micro_batches\": %d, \"step_s\": %.6f, \"compute_s_max\": %.6f, "
            "\"compute_s_mean\": %.6f, \"imbalance\": %.6f, \"imbalance_pred\": %.6f, \"compute_s_pred\": %.6g, "
            "\"data_wait_s\": %.6f, \"comm_s\": %.6f, \"balancer_s\": %.6f, \"mem_peak\": %.0f, \"mem_pred\": %.0f, "
            "\"mem_budget\": %.0f, \"model_flops\": %.6g, \"ranks\": %d, \"skipped\": %d, \"corrupt_samples\": %lld",
            (long long)t->step, (long long)t->current.epoch, json_number(r->loss, loss, sizeof loss), r->lr,
            json_number(r->grad_norm, grad_norm, sizeof grad_norm),
            (long long)t->current.global_samples, r->tokens, t->current.n_micro, r->step_s, r->compute_max,
            r->compute_mean, imbalance, imbalance_pred, t->current_pred_max, r->wait_max, r->comm_s, r->balancer_s,
            r->mem_peak, t->current_mem, t->mem_budget, r->model_flops, t->info->n_ranks, r->skipped,
            (long long)t->corrupt_samples);
    const int n_ranks = t->info->n_ranks;
    if (n_ranks <= METRICS_MAX_RANK_ARRAYS) {
        metrics_add(t->metrics, ", \"rank_compute_s\": [");
        for (int rank = 0; rank < n_ranks; rank++)
            metrics_add(t->metrics, "%s%.6f", rank ? ", " : "", t->rank_seconds[rank]);
        metrics_add(t->metrics, "], \"rank_pred_s\": [");
        for (int rank = 0; rank < n_ranks; rank++)
            metrics_add(t->metrics, "%s%.6g", rank ? ", " : "", t->current_rank_pred[rank]);
        metrics_add(t->metrics, "], \"rank_samples\": [");
        for (int rank = 0; rank < n_ranks; rank++)
            metrics_add(t->metrics, "%s%lld", rank ? ", " : "", (long long)t->current_rank_samples[rank]);
        metrics_add(t->metrics, "]");
    }
    if (r->validated) {
        const eval_result *v = &t->last_eval;
        char number[32];
        metrics_add(t->metrics, ", \"val_loss\": %s, \"val_samples\": %lld, \"val_s\": %.6f, \"val_sigmas\": [",
                    json_number(v->loss, number, sizeof number), (long long)v->samples, v->seconds);
        for (int level = 0; level < v->n_sigmas; level++)
            metrics_add(t->metrics, "%s%s", level ? ", " : "", json_short(t->config->eval.sigmas.values[level], number,
                                                                          sizeof number));
        metrics_add(t->metrics, "], \"val_loss_sigma\": [");
        for (int level = 0; level < v->n_sigmas; level++)
            metrics_add(t->metrics, "%s%s", level ? ", " : "", json_number(v->sigma_loss[level], number, sizeof number));
        metrics_add(t->metrics, "]");
        if (v->has_ema) {
            metrics_add(t->metrics, ", \"val_loss_ema\": %s, \"val_samples_ema\": %lld, \"val_loss_ema_sigma\": [",
                        json_number(v->ema_loss, number, sizeof number), (long long)v->ema_samples);
            for (int level = 0; level < v->n_sigmas; level++)
                metrics_add(t->metrics, "%s%s", level ? ", " : "",
                            json_number(v->ema_sigma_loss[level], number, sizeof number));
            metrics_add(t->metrics, "]");
        }
    }
    metrics_add(t->metrics, "}");
    int failure = metrics_end_line(t->metrics); /* whole lines only: a failed write leaves none of this one */
    if (failure != 0 && !t->metrics_failed) {
        t->metrics_failed = 1;
        aldit_warn("writing the metrics file of %s failed at step %lld: %s; the file keeps whole lines only, "
                   "training goes on", t->config->run.dir, (long long)t->step, strerror(failure));
    }
}

static void print_progress(const trainer *t, const step_record *r)
{
    double imbalance = r->compute_max > 0.0 ? 1.0 - r->compute_mean / r->compute_max : 0.0;
    double imbalance_pred = t->current_pred_max > 0.0 ? 1.0 - t->current_pred_mean / t->current_pred_max : 0.0;
    double elapsed = seconds_since(t->loop_started_s);
    int64_t done = t->step - t->first_step, left = t->total_steps - t->step;
    char eta[32];
    format_duration(done > 0 ? elapsed / (double)done * (double)(left > 0 ? left : 0) : 0.0, eta, sizeof eta);
    char val[64] = "";
    if (t->has_eval && t->last_eval.has_ema)
        snprintf(val, sizeof val, " val %.5f ema %.5f", t->last_eval.loss, t->last_eval.ema_loss);
    else if (t->has_eval) snprintf(val, sizeof val, " val %.5f", t->last_eval.loss);
    printf("step %lld/%lld epoch %lld loss %.5f%s lr %.3e tok/s %.0f imbalance %.1f%% (pred %.1f%%) wait %.3fs ETA %s%s\n",
           (long long)t->step, (long long)t->total_steps, (long long)t->current.epoch, r->loss, val, r->lr,
           r->step_s > 0.0 ? r->tokens / r->step_s : 0.0, 100.0 * imbalance, 100.0 * imbalance_pred, r->wait_max,
           eta, r->skipped ? " (skipped: non-finite)" : "");
    fflush(stdout);
}

static void print_timing_table(const trainer *t)
{
    double wall = seconds_since(t->started_s);
    double max_s[N_PHASES + 2], mean_s[N_PHASES + 2];   /* the phases, the wall, the device's set-up in the steps */
    memcpy(max_s, t->phase_s, sizeof t->phase_s);
    max_s[N_PHASES] = wall;
    max_s[N_PHASES + 1] = t->setup_s;
    memcpy(mean_s, max_s, sizeof max_s);
    comm_allreduce_max_f64(max_s, N_PHASES + 2);
    comm_allreduce_sum_f64(mean_s, N_PHASES + 2);
    if (t->info->rank != 0) return;
    printf("\ntiming over %lld step(s) of this run (seconds)     max rank  mean rank  share of wall\n",
           (long long)(t->step - t->first_step));
    double accounted = 0.0;
    for (int p = 0; p < N_PHASES; p++) {
        printf("  %-44s %9.3f  %9.3f  %6.1f%%\n", phase_names[p], max_s[p], mean_s[p] / t->info->n_ranks,
               max_s[N_PHASES] > 0 ? 100.0 * max_s[p] / max_s[N_PHASES] : 0.0);
        accounted += mean_s[p] / t->info->n_ranks;
        if (p == PHASE_COMPUTE && max_s[N_PHASES + 1] > 0.0)
            printf("    %-42s %9.3f  %9.3f  %6.1f%%\n", "of which device set-up (new cuDNN plans)", max_s[N_PHASES + 1],
                   mean_s[N_PHASES + 1] / t->info->n_ranks,
                   max_s[N_PHASES] > 0 ? 100.0 * max_s[N_PHASES + 1] / max_s[N_PHASES] : 0.0);
    }
    printf("  %-44s %9s  %9.3f\n", "set-up and other", "", mean_s[N_PHASES] / t->info->n_ranks - accounted);
    printf("  %-44s %9.3f\n", "wall", max_s[N_PHASES]);
    if (t->skipped_steps > 0) printf("  %lld step(s) skipped for a non-finite loss or gradient\n",
                                     (long long)t->skipped_steps);
    if (t->corrupt_samples > 0) printf("  %lld corrupt sample(s) left out ([data] on_corrupt = skip; names above)\n",
                                       (long long)t->corrupt_samples);
    fflush(stdout);
}

/* ---- the loop ------------------------------------------------------------------------------------ */

/* Collective, after step t->step when a validation pass is due: outside the step's watch (the pass has its own
   deadline), with the training reader drained (HDF5 is not thread-safe); the step's watch then resumes for the
   rest of the step's collectives. */
static void validate(trainer *t, step_record *r)
{
    const double started = comm_time();
    watchdog_step_end();
    prefetch_drain(t->reader);
    eval_run(t->eval, t->dev, t->step, &t->last_eval);
    t->has_eval = r->validated = 1;
    watchdog_step_begin(t->info->rank, t->step, t->step_timeout);
    t->phase_s[PHASE_EVAL] += seconds_since(started);
}

/* Whether this rank counts micro-batch `micro` of the current step in the step's sums (samples, tokens, failures):
   a group's micro-batch is counted by its first member only, so that the sum over the ranks counts each sample once. */
static int counted_here(const trainer *t, int micro) { return t->info->rank % t->current.micro_group[micro] == 0; }

/* Before prefetch_drop_failed drops the micro-batches whose samples all failed: their group sizes go with them. */
static void keep_groups_of_kept(trainer *t, const sample_batch *batch)
{
    int kept = 0;
    for (int micro = 0; micro < t->current.n_micro; micro++) {
        int any = 0;
        for (int i = t->current.micro_start[micro]; i < t->current.micro_start[micro + 1]; i++) any |= !batch->failed[i];
        if (any) t->current.micro_group[kept++] = t->current.micro_group[micro];
    }
}

/* Collective, after this step's samples are read: every rank learns how many failed. With [data] on_corrupt =
   error the healthy state (the last step's) is checkpointed and the job ends with status 2; with skip, the
   failed samples are left out of the step (and of its sample count) and counted. */
static void handle_corrupt_samples(trainer *t, const sample_batch *batch)
{
    double failed[2] = {0.0, 0.0}; /* count (a group's samples once), lowest failed id */
    for (int micro = 0; micro < t->current.n_micro && batch->n_failed > 0; micro++)
        for (int i = t->current.micro_start[micro]; i < t->current.micro_start[micro + 1]; i++)
            failed[0] += batch->failed[i] && counted_here(t, micro);
    comm_allreduce_sum_f64(failed, 1);
    if (failed[0] == 0) return;
    failed[1] = INFINITY;
    for (int i = 0; i < batch->n_samples; i++)
        if (batch->failed[i] && batch->ids[i] < failed[1]) failed[1] = (double)batch->ids[i];
    comm_allreduce_min_f64(&failed[1], 1);
    const int64_t step = t->step + 1;
    if (t->config->data.on_corrupt == ON_CORRUPT_ERROR) {
        watchdog_step_end();
        if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: step %lld: %.0f sample(s) of the store %s cannot be read (sample %.0f and "
                    "any others: messages above)%s\n", (long long)step, failed[0], t->data.path, failed[1],
                    t->step > t->checkpoint_step ? "; checkpointing the last step first" : "");
        if (t->step > t->checkpoint_step) save_checkpoint(t, 0);
        if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: repair or rebuild the store, or set [data] on_corrupt = skip to train "
                    "without such samples\n");
        exit_all(ALDIT_EXIT_USAGE);
    }
    for (int i = 0; i < batch->n_samples; i++)
        if (batch->failed[i])
            aldit_warn("step %lld: leaving out sample %lld of the store %s, which cannot be read ([data] on_corrupt "
                       "= skip)", (long long)step, (long long)batch->ids[i], t->data.path);
    keep_groups_of_kept(t, batch);
    t->current.n_micro = prefetch_drop_failed(t->reader, t->current.micro_start, t->current.n_micro);
    t->current.global_samples -= (int64_t)failed[0];
    t->corrupt_samples += (int64_t)failed[0];
    if (t->current.global_samples <= 0) {
        if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: step %lld: every sample of the step is corrupt in the store %s\n",
                    (long long)step, t->data.path);
        exit_all(ALDIT_EXIT_USAGE);
    }
}

/* The device profiler's capture around the steps [log] profile_from and profile_steps name: on before step
   `step` (1-based) when it is the first, off after it when it is the last. */
static void profile_around(trainer *t, int64_t step, int after)
{
    const int64_t first = t->config->log.profile_from, last = first + t->config->log.profile_steps - 1;
    if (first <= 0 || step != (after ? last : first) || t->profiling == !after) return;
    if (!t->dev->ops->profile) {
        if (t->info->rank == 0 && !after)
            aldit_warn("[log] profile_from = %lld: the %s backend has no profiler to start; ignored", (long long)first,
                       t->dev->ops->name);
        return;
    }
    t->dev->ops->profile(t->dev, !after);
    t->profiling = !after;
    if (t->info->rank == 0)
        printf("aldit: device profiler capture %s at step %lld\n", after ? "stopped" : "started", (long long)step);
}

/* One optimizer step on the current assignment. Returns 0, or 1 when the loss is not finite and the deck
   says error (every rank sees the same reduced values, so all return 1 together). */
static int train_step(trainer *t, step_record *r)
{
    const deck *config = t->config;
    profile_around(t, t->step + 1, 0);
    double step_started = comm_time(), wait_s = 0.0, phase_started;
    double balancer_before = t->phase_s[PHASE_BALANCER], comm_before = t->phase_s[PHASE_COMM];
    const sample_batch *batch = prefetch_finish(t->reader, &wait_s);
    t->phase_s[PHASE_DATA_WAIT] += wait_s;
    handle_corrupt_samples(t, batch);

    int64_t next_step = t->step + 2; /* 1-based number of the step after this one */
    int draw_next = config->run.steps <= 0 || next_step <= config->run.steps;
    if (draw_next) {
        draw_upcoming(t);
        prefetch_start(t->reader, t->upcoming.ids, t->upcoming.n_samples, t->upcoming.epoch);
    } else if (t->info->rank == 0) snapshot_balancer(t);

    prepare_samples(t, batch);
    watchdog_test_stop(t->info->rank, "hang", t->step + 1);
    phase_started = comm_time();
    double sums[3] = {compute_gradients(t, batch), 0.0, 0.0}; /* loss sum, tokens, model FLOPs */
    double compute_s = seconds_since(phase_started);
    t->phase_s[PHASE_COMPUTE] += compute_s;
    for (int micro = 0; micro < t->current.n_micro; micro++) {
        if (!counted_here(t, micro)) continue;
        for (int i = t->current.micro_start[micro]; i < t->current.micro_start[micro + 1]; i++) {
            int64_t tokens = store_sample_tokens(&t->data.samples[batch->ids[i]], config->model.patch_t,
                                                 config->model.patch_h, config->model.patch_w);
            sums[1] += (double)tokens;
            /* the text rows the model takes: the caption's, and a store with sources the ByT5 rows and an
               image-to-video sample's SigLIP rows (of a joint attention: L of N = S + L) */
            sums[2] += cost_model_model_flops(config, tokens, t->text_len[i] + batch->text_2_len[i] + batch->image_len[i]);
        }
    }

    phase_started = comm_time();
    t->dev->ops->sum_gradients(t->dev); /* a GPU's is queued: with NCCL it runs while the sums below go through MPI */
    comm_allreduce_sum_f64(sums, 3);
    const double host_comm_s = seconds_since(phase_started); /* includes waiting for the slowest rank */
    t->phase_s[PHASE_COMM] += host_comm_s;

    t->step++;
    r->loss = sums[0] / (double)t->current.global_samples;
    r->tokens = sums[1];
    r->model_flops = sums[2];
    r->lr = optim_lr(config, t->step, t->total_steps);
    adamw_step hyper = {.lr = r->lr, .beta1 = config->train.beta1, .beta2 = config->train.beta2,
                        .eps = config->train.adam_eps, .step = t->step};
    /* norm, clip and AdamW (nothing is updated from a non-finite loss or norm); one wait for the whole step */
    backend_step_result device;
    t->dev->ops->finish_step(t->dev, &hyper, isfinite(r->loss), &device);
    r->grad_norm = device.grad_norm;
    const double mem_peak = device.mem_peak;
    profile_around(t, t->step, 1);
    /* a device's gradient sum starts with the host's wait above (both when this rank's compute ends) and also
       waits for the slowest rank: only what outlasts the host's wait is more */
    t->phase_s[PHASE_COMM] += fmax(0.0, device.comm_device_s - host_comm_s);
    t->phase_s[PHASE_OPTIMIZER] += device.optimizer_s;
    r->skipped = !isfinite(r->loss) || !isfinite(r->grad_norm);
    if (r->skipped && config->train.nonfinite == NONFINITE_ERROR) {
        if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: step %lld (epoch %lld): the loss is %g and the gradient norm %g (not finite); "
                    "lower [train] lr, or set [train] nonfinite = skip to skip such steps\n", (long long)t->step,
                    (long long)t->current.epoch, r->loss, r->grad_norm);
        return 1;
    }
    if (r->skipped) t->skipped_steps++;
    t->skipped_in_a_row = r->skipped ? t->skipped_in_a_row + 1 : 0;
    if (config->train.max_skipped > 0 && t->skipped_in_a_row >= config->train.max_skipped) {
        if (t->info->rank == 0)
            fprintf(stderr, "aldit: error: step %lld: %d steps in a row skipped for a non-finite loss or gradient "
                    "([train] max_skipped = %d): the model is not training. Lower [train] lr, or resume from an "
                    "earlier checkpoint\n", (long long)t->step, t->skipped_in_a_row, config->train.max_skipped);
        return 1;
    }

    /* per-rank measurements to rank 0: compute seconds, data wait, peak memory (CPU: growth of the peak
       resident set since the loop started; GPU: workspace of the largest micro-batch) */
    phase_started = comm_time();
    double mine[3] = {compute_s, wait_s, mem_peak};
    double *all = t->rank_measures; /* NULL on the other ranks */
    comm_gather_f64_n(mine, 3, all);
    t->phase_s[PHASE_COMM] += seconds_since(phase_started);
    if (t->info->rank == 0) {
        double *rank_compute = t->rank_seconds;
        r->compute_max = r->compute_mean = r->wait_max = r->mem_peak = 0.0;
        for (int rank = 0; rank < t->info->n_ranks; rank++) {
            rank_compute[rank] = all[3 * rank];
            r->compute_mean += all[3 * rank] / t->info->n_ranks;
            if (all[3 * rank] > r->compute_max) r->compute_max = all[3 * rank];
            if (all[3 * rank + 1] > r->wait_max) r->wait_max = all[3 * rank + 1];
            if (all[3 * rank + 2] > r->mem_peak) r->mem_peak = all[3 * rank + 2];
        }
        phase_started = comm_time();
        balancer_observe(t->packer, rank_compute);
        t->phase_s[PHASE_BALANCER] += seconds_since(phase_started);
    }
    r->balancer_s = t->phase_s[PHASE_BALANCER] - balancer_before;
    r->comm_s = t->phase_s[PHASE_COMM] - comm_before;
    r->step_s = seconds_since(step_started);
    return 0;
}

/* Rank 0: fit the balancer's cost model to the start-up timings and say how well it now predicts them (the worst
   timed micro-batch named by its copies and tokens) and, when every timed sample has the same text length (text
   padded to [model] text_len), which sums of the coefficients the timings determine. */
static void report_calibration(trainer *t)
{
    balancer_calibrate(t->packer, t->n_calibration, t->calibration_features, t->calibration_seconds);
    const cost_model *cm = balancer_cost_model(t->packer);
    int at = -1;
    const double worst = cost_model_worst_misfit(cm, t->n_calibration, t->calibration_features,
                                                 t->calibration_seconds, &at);
    const cost_features *f = &t->calibration_features[at >= 0 ? at : 0];
    char split[96] = "";
    if (cm->attention_split_tokens > 0)
        snprintf(split, sizeof split, ", %.3g %s^2 in place of c below %lld %s", cm->coef[5], cm->joint_text ? "N" : "S",
                 (long long)cm->attention_split_tokens, cm->joint_text ? "rows" : "tokens");
    char form[160];
    cost_model_form_text(cm, form, sizeof form);
    printf("             cost model fitted: seconds = %s%s (worst misfit of a timed shape %.1f%%: %.0f x %.0f %s)\n",
           form, split, 100.0 * worst, f->value[0], f->value[0] > 0 ? f->value[1] / f->value[0] : 0.0,
           cm->joint_text ? "rows" : "tokens");
    const double text = f->value[0] > 0 ? f->value[4] / f->value[0] : 0.0;
    int same_text = 1;
    for (int i = 0; i < t->n_calibration; i++) {
        const cost_features *g = &t->calibration_features[i];
        same_text &= fabs(g->value[4] - text * g->value[0]) <= 1e-9 * (1.0 + g->value[4]);
    }
    if (same_text && t->n_calibration > 1) {
        char fixed[160];
        cost_model_same_text_text(cm, text, fixed, sizeof fixed);
        printf("             (every timed sample has L = %.0f text rows: the timings fix %s, not their parts)\n", text,
               fixed);
    }
    fflush(stdout);
}

/* shapes timed at start-up; copies of a shape packed into one timed micro-batch ([balance] calibrate_packed) */
enum { CALIBRATION_MAX_SHAPES = 24, CALIBRATION_MAX_COPIES = 32 };

/* Order of sample shapes: by tokens, then frames, height, width (text length ignored). */
static int compare_shapes(const void *a, const void *b)
{
    const backend_shape *x = a, *y = b;
    int64_t tx = (int64_t)x->frames * x->height * x->width, ty = (int64_t)y->frames * y->height * y->width;
    if (tx != ty) return (tx > ty) - (tx < ty);
    if (x->frames != y->frames) return (x->frames > y->frames) - (x->frames < y->frames);
    if (x->height != y->height) return (x->height > y->height) - (x->height < y->height);
    return (x->width > y->width) - (x->width < y->width);
}

/* What calibration_time times with: the backend, the shapes and their copies. */
typedef struct {
    trainer *t;
    const backend_shape *shapes;
    const calibration_entry *entries;
} calibration_device;

/* The progress of one backend call, passed on to calibration_time's. */
typedef struct {
    calibration_progress_fn progress;
    void *context;
} calibration_relay;

static void relay_progress(void *context, int shape, double seconds)
{
    const calibration_relay *relay = context;
    (void)seconds;
    relay->progress(relay->context, shape);
}

/* calibration_time_fn on the backend (backend_ops.time_shapes). */
static void time_on_device(void *context, int layers, const int *which, int n, int warm_up, double repeat_seconds,
                           double *seconds, calibration_progress_fn progress, void *progress_context)
{
    const calibration_device *device = context;
    backend_shape shapes[CALIBRATION_MAX_SHAPES];
    int copies[CALIBRATION_MAX_SHAPES];
    for (int k = 0; k < n; k++) {
        shapes[k] = device->shapes[which[k]];
        copies[k] = device->entries[which[k]].copies;
    }
    calibration_relay relay = {progress, progress_context};
    backend *dev = device->t->dev;
    dev->ops->time_shapes(dev, layers, shapes, n, copies, seconds, warm_up, repeat_seconds, relay_progress, &relay);
}

static void agree_bytes(void *bytes, size_t size) { comm_bcast_bytes(bytes, size); }

/* Collective: the entries' seconds at full depth, timed on the device (calibration_time: on models of one and two
   blocks, scaled to the depth, the cheap shapes and a few checks timed at full depth, rank 0 printing the
   progress); returns the full-depth timings (checks[], room for n_shapes). */
static int time_calibration(trainer *t, const backend_shape *shapes, calibration_entry *entries, int n_shapes,
                            calibration_check *checks)
{
    const deck *config = t->config;
    double seed[CALIBRATION_MAX_SHAPES];
    cost_model seed_model;
    cost_model_init(&seed_model, config);
    for (int i = 0; i < n_shapes; i++) {
        const int64_t tokens = (int64_t)(shapes[i].frames / config->model.patch_t) *
                               (shapes[i].height / config->model.patch_h) * (shapes[i].width / config->model.patch_w);
        seed[i] = entries[i].copies > 0 ? entries[i].copies * cost_model_predict(&seed_model, tokens, shapes[i].text_len)
                                        : 0.0;
    }
    cost_model_free(&seed_model);
    calibration_device device = {t, shapes, entries};
    calibration_timer timer = {.num_layers = config->model.num_layers,
                               .recompute_block = config->train.recompute == RECOMPUTE_BLOCK,
                               .target_seconds = config->balance.calibrate_seconds,
                               .time = time_on_device, .context = &device, .agree = agree_bytes, .clock = comm_time,
                               .progress = t->info->rank == 0 ? stdout : NULL};
    return calibration_time(&timer, entries, n_shapes, seed, checks);
}

/* Collective, for a run whose start-up timings were read from the run folder: one untimed forward + backward of each
   timed shape (two copies where the timing packed two or more, so that both the last sample's whole-tile plans and
   the others' are built) on a model of one block builds the device's plans and caches as the timing would have, and
   training keeps them (backend_ops.time_shapes), so that its first steps do not build them (measured: 4.5 s more in
   steps 0 and 1 of the 8-layer Wan-1.3B run on an H200, docs/PERFORMANCE.md), which would count in their times, in
   the balancer's refit and in each rank's share of the step. */
static void warm_up_device(trainer *t, const backend_shape *shapes, const calibration_entry *entries, int n_shapes)
{
    int copies[CALIBRATION_MAX_SHAPES];
    double seconds[CALIBRATION_MAX_SHAPES];
    for (int i = 0; i < n_shapes; i++) copies[i] = entries[i].copies < 2 ? entries[i].copies : 2; /* 0: beyond capacity */
    t->dev->ops->time_shapes(t->dev, 1, shapes, n_shapes, copies, seconds, 0, 0.0, NULL, NULL);
}

/* Time the store's distinct sample shapes (at most CALIBRATION_MAX_SHAPES, spread over the length range;
   each with its mean text length, or, where the text joins the attention, its shortest and longest caption in
   turn: calibration_text_rows) on the backend's device, each packed into a micro-batch of as many copies as
   training would pack (one copy with [balance] calibrate_packed off), so that the timings carry the
   per-micro-batch fixed cost as training does (time_calibration: on models of one and two blocks, scaled to
   the depth, the cheap shapes and a few checks timed at full depth); rank 0 prints the progress and keeps the
   timings for the balancer's cost model, and in the run folder (calibration.h), from where a restarted run on the
   same device and model reads them. */
static void calibrate(trainer *t)
{
    /* every sample's shape, sorted (by tokens, then frames, height, width), then one entry per distinct
       shape with its mean text length: O(n log n) for stores of millions of samples */
    const int64_t n_samples = t->data.n_samples;
    backend_shape *all = xmalloc((size_t)(n_samples > 0 ? n_samples : 1) * sizeof *all);
    for (int64_t id = 0; id < n_samples; id++) {
        const store_sample *sample = &t->data.samples[id];
        all[id] = (backend_shape){sample->frames, sample->height, sample->width, text_rows_of(sample, t->config)};
    }
    qsort(all, (size_t)n_samples, sizeof *all, compare_shapes);
    backend_shape *distinct = xmalloc((size_t)(n_samples > 0 ? n_samples : 1) * sizeof *distinct);
    int32_t *text_range = xmalloc((size_t)(n_samples > 0 ? n_samples : 1) * 2 * sizeof *text_range);
    int64_t n_distinct = 0;
    for (int64_t first = 0, end; first < n_samples; first = end) {
        double text_sum = 0.0;
        int32_t shortest = all[first].text_len, longest = all[first].text_len;
        for (end = first; end < n_samples && compare_shapes(&all[end], &all[first]) == 0; end++) {
            text_sum += all[end].text_len;
            if (all[end].text_len < shortest) shortest = all[end].text_len;
            if (all[end].text_len > longest) longest = all[end].text_len;
        }
        int32_t mean_text = (int32_t)lround(text_sum / (double)(end - first));
        text_range[2 * n_distinct] = shortest > 0 ? shortest : 1;
        text_range[2 * n_distinct + 1] = longest > 0 ? longest : 1;
        distinct[n_distinct++] = (backend_shape){all[first].frames, all[first].height, all[first].width,
                                             mean_text > 0 ? mean_text : 1};
    }
    free(all);

    int n_shapes = n_distinct < CALIBRATION_MAX_SHAPES ? (int)n_distinct : CALIBRATION_MAX_SHAPES;
    backend_shape shapes[CALIBRATION_MAX_SHAPES];
    const int joint_text = layout_family_attention(t->config->model.family).joint_text;
    for (int i = 0; i < n_shapes; i++) { /* evenly spaced over the sorted shapes, both ends included */
        const int64_t pick = n_shapes > 1 ? (int64_t)i * (n_distinct - 1) / (n_shapes - 1) : 0;
        shapes[i] = distinct[pick];
        shapes[i].text_len = calibration_text_rows(joint_text, i, text_range[2 * pick], distinct[pick].text_len,
                                                   text_range[2 * pick + 1]);
    }
    free(text_range);
    int copies[CALIBRATION_MAX_SHAPES];
    const int max_copies = t->config->balance.calibrate_packed ? CALIBRATION_MAX_COPIES : 1;
    t->dev->ops->calibration_copies(t->dev, shapes, n_shapes, max_copies, copies);
    calibration_entry entries[CALIBRATION_MAX_SHAPES];
    for (int i = 0; i < n_shapes; i++)
        entries[i] = (calibration_entry){shapes[i].frames, shapes[i].height, shapes[i].width, shapes[i].text_len,
                                         copies[i], -1.0};

    /* a run restarted on the same device and model reads the timings from the run folder; rank 0 decides */
    char path[DECK_PATH_MAX + 32], key[CALIBRATION_KEY_MAX] = "";
    snprintf(path, sizeof path, "%s/%s", t->config->run.dir, CALIBRATION_FILE);
    int cached = 0;
    if (t->info->rank == 0) {
        int ranks_per_device = 1;
        const char *device = t->dev->ops->device_key(t->dev, &ranks_per_device);
        calibration_key(t->config, device, ranks_per_device, key, sizeof key);
        cached = calibration_load(path, key, entries, n_shapes) == CALIBRATION_CACHE_HIT;
    }
    comm_bcast_bytes(&cached, sizeof cached);
    const double started = comm_time();
    calibration_check checks[CALIBRATION_MAX_SHAPES];
    int n_checks = 0, saved = 0;
    if (!cached) {
        n_checks = time_calibration(t, shapes, entries, n_shapes, checks);
        if (t->info->rank == 0) saved = calibration_save(path, key, entries, n_shapes) == 0;
    } else
        warm_up_device(t, shapes, entries, n_shapes); /* every rank: copies are the same everywhere */
    const double spent = comm_time() - started;
    if (t->info->rank == 0) {
        /* the features under the backend's attention split, as the balancer's cost model will count them */
        const backend_plan *plan = t->dev->ops->plan(t->dev);
        const cost_model no_split = {0}, *split = plan->has_memory_model ? &plan->memory_model : &no_split;
        t->calibration_features = xcalloc((size_t)n_shapes, sizeof *t->calibration_features);
        t->calibration_seconds = xmalloc((size_t)n_shapes * sizeof *t->calibration_seconds);
        int most_copies = 0;
        for (int i = 0; i < n_shapes; i++) {
            if (entries[i].copies < 1 || entries[i].seconds <= 0) continue; /* beyond the GPU model's capacity */
            int64_t tokens = (int64_t)(shapes[i].frames / t->config->model.patch_t) *
                             (shapes[i].height / t->config->model.patch_h) * (shapes[i].width / t->config->model.patch_w);
            for (int copy = 0; copy < entries[i].copies; copy++) /* the micro-batch's features: copies x one sample's */
                cost_features_add(split, &t->calibration_features[t->n_calibration], tokens, shapes[i].text_len);
            t->calibration_seconds[t->n_calibration++] = entries[i].seconds;
            if (entries[i].copies > most_copies) most_copies = entries[i].copies;
        }
        char packing[48], scaling[96] = "";
        if (most_copies > 1) snprintf(packing, sizeof packing, "packed up to %d per micro-batch", most_copies);
        else snprintf(packing, sizeof packing, "one per micro-batch");
        const int num_layers = t->config->model.num_layers;
        if (num_layers > 2 && n_checks == t->n_calibration)
            snprintf(scaling, sizeof scaling, " on 1 and 2 blocks, all at %d blocks,", num_layers);
        else if (num_layers > 2)
            snprintf(scaling, sizeof scaling, " on 1 and 2 blocks, %d of them at %d blocks (%d scaled to %d),",
                     n_checks, num_layers, t->n_calibration - n_checks, num_layers);
        if (cached)
            printf("  calibrate  %d of %d sample shapes (%s): timings read from %s (same device and model; delete "
                   "it to time them again); the device's plans for them built in %.1f s\n", t->n_calibration, n_shapes,
                   packing, path, spent);
        else printf("  calibrate  %d of %d sample shapes timed on the GPU (%s)%s in %.1f s%s%s\n", t->n_calibration,
                    n_shapes, packing, scaling, spent, saved ? ", kept in " : "", saved ? path : "");
        if (n_checks > 0) {
            char misfit[768];
            calibration_misfit_text(misfit, sizeof misfit, checks, n_checks, entries, num_layers,
                                    t->n_calibration - n_checks);
            printf("             %s\n", misfit);
        }
        fflush(stdout);
    }
    free(distinct);
}

/* Collective: rank 0 locks the run folder ([run] lock) and, for a fresh start, checks that it holds no earlier
   run's files; every rank exits with status 2 when either fails. */
static void guard_run_folder(const deck *config)
{
    int status = 0;
    if (comm_rank() == 0) {
        if (config->run.lock) status = rundir_lock(config->run.dir, stderr, stdout);
        char path[2 * DECK_PATH_MAX];
        metrics_path(config, path, sizeof path);
        if (status == 0 && !config->checkpoint.resume) status = rundir_check_fresh(config, path, stderr);
    }
    comm_bcast_bytes(&status, sizeof status);
    if (status != 0) exit_all(ALDIT_EXIT_USAGE);
}

/* The test hook ALDIT_TEST_SP_GROUP=k or k,b (environment, read by every rank alike): the micro-batches of the aligned
   blocks of k ranks (the first b blocks; all without b) are run by the blocks' groups (balance_group_blocks), so that
   the training tests run groups where the planner chooses none. Unset: k = 1. A k that is not a power of two, above
   `largest` (the largest group made: heads and ranks), not dividing the ranks or not within one node, or a b below 0,
   ends the job (exit 2). */
static void parse_test_group(trainer *t, int largest)
{
    t->test_group = 1;
    t->test_blocks = -1;
    const char *text = getenv("ALDIT_TEST_SP_GROUP");
    if (!text || !text[0]) return;
    char *end = NULL;
    const long k = strtol(text, &end, 10);
    long blocks = -1;
    if (*end == ',') blocks = strtol(end + 1, &end, 10);
    if (*end == '\0' && k >= 1 && k <= largest && (k & (k - 1)) == 0 && t->info->n_ranks % k == 0 &&
        comm_group_node_local((int)k) && blocks >= -1 && blocks <= t->info->n_ranks) {
        t->test_group = (int)k;
        t->test_blocks = (int)blocks;
        return;
    }
    if (t->info->rank == 0)
        fprintf(stderr, "aldit: error: ALDIT_TEST_SP_GROUP=%s (a test hook: K or K,BLOCKS): the group size must be a "
                "power of two up to %d (that divides [model] num_heads = %d and the %d ranks, whose groups lie within "
                "one node) and BLOCKS at least 0; unset it to train without forced groups\n", text, largest,
                t->config->model.num_heads, t->info->n_ranks);
    exit_all(ALDIT_EXIT_USAGE);
}

/* Collective: the sequence-parallel groups' communicators for every k = 2, 4, ... that divides [model] num_heads and
   fits the ranks, and the test hook's group size. */
static void setup_groups(trainer *t)
{
    int largest = 1;
    while (largest * 2 <= t->info->n_ranks && t->config->model.num_heads % (largest * 2) == 0) largest *= 2;
    if (!layout_family_sequence_parallel(t->config->model.family)) {
        if (t->info->rank == 0 && balance_sp_limit(t->config, t->info->n_ranks) > 1)
            printf("aldit: model.family = %s runs no sequence-parallel groups: [balance] sp runs as off (a sample over "
                   "one rank's memory is refused, or skipped with balance.oversize = skip; aldit-sim still plans the "
                   "groups)\n", deck_family_name(t->config->model.family));
        largest = 1;
    }
    /* communicators only for the groups this run can use ([balance] sp: 0 auto, 1 off, K; or the test hook's size),
       so that a run without groups makes none (on GPUs each is an NCCL communicator) */
    const char *hook = getenv("ALDIT_TEST_SP_GROUP");
    const int wanted = t->config->balance.sp == 0 ? largest : t->config->balance.sp;
    const int hooked = hook ? atoi(hook) : 0;
    int made = 1;
    while (made * 2 <= largest && (made * 2 <= wanted || made * 2 <= hooked)) made *= 2;
    comm_groups_init(made);
    parse_test_group(t, largest);
    if (t->test_group > 1 && t->info->rank == 0)
        printf("aldit: test hook ALDIT_TEST_SP_GROUP: micro-batches run on groups of %d ranks (%s)\n", t->test_group,
               t->test_blocks < 0 ? "every block" : "the first blocks");
}

static void trainer_setup(trainer *t, const deck *config, const comm_info *info, int device, char *resumed_from,
                          size_t resumed_size)
{
    memset(t, 0, sizeof *t);
    t->config = config;
    t->info = info;
    t->started_s = comm_time();
    if (require_store_key(config, info->rank) != 0) exit_all(ALDIT_EXIT_USAGE);
    if (info->rank == 0) make_dirs(config->run.dir);
    guard_run_folder(config);
    store_open_bcast(&t->data, config->data.store);
    check_store_fits_model(&t->data, config, info->rank, "store");
    t->eval = eval_open(config);
    if (t->eval) check_store_fits_model(eval_store(t->eval), config, info->rank, "[eval] store =");
    model_create_table(&t->net, config); /* the CPU backend allocates the weights it computes with */
    setup_groups(t);
    t->samples = train_balance_samples(&t->data, config);
    int64_t n_planned = 0;
    balance_sample *planned = plan_samples(t->samples, t->data.n_samples, t->eval, &n_planned);
    t->dev = device_create_fn(device)(config, info, &t->net, planned, n_planned);
    free(planned);
    if (!t->dev) exit_all(ALDIT_EXIT_USAGE);
    const backend_plan *memory = t->dev->ops->plan(t->dev);
    t->mem_budget = memory->mem_budget;
    if (info->rank == 0) print_summary_head(t);
    if (config->balance.calibrate && t->dev->ops->time_shapes) calibrate(t);
    int64_t plan[2] = {0, 0}; /* steps per epoch, total steps */
    if (info->rank == 0) {
        t->rank_seconds = xcalloc((size_t)info->n_ranks, sizeof *t->rank_seconds);
        t->upcoming_rank_pred = xcalloc((size_t)info->n_ranks, sizeof *t->upcoming_rank_pred);
        t->current_rank_pred = xcalloc((size_t)info->n_ranks, sizeof *t->current_rank_pred);
        t->upcoming_rank_samples = xcalloc((size_t)info->n_ranks, sizeof *t->upcoming_rank_samples);
        t->current_rank_samples = xcalloc((size_t)info->n_ranks, sizeof *t->current_rank_samples);
        t->rank_measures = xcalloc(3 * (size_t)info->n_ranks, sizeof *t->rank_measures);
        t->packer = create_balancer(config, t->samples, t->data.n_samples, info, memory);
        if (t->n_calibration > 0) report_calibration(t);
        if (config->run.steps > 0 && config->balance.strategy == STRATEGY_GLOBAL && config->balance.global_batch > 0)
            plan[0] = (balancer_epoch_samples(t->packer) + config->balance.global_batch - 1) / config->balance.global_batch;
        else plan[0] = plan_epoch(config, t->samples, t->data.n_samples, info, memory, t->n_calibration,
                                  t->calibration_features, t->calibration_seconds).steps;
        plan[1] = config->run.steps > 0 ? config->run.steps : config->run.epochs * plan[0];
    }
    comm_bcast_bytes(plan, sizeof plan);
    t->steps_per_epoch = plan[0];
    t->total_steps = plan[1];
    initial_state(t, resumed_from, resumed_size);
    t->first_step = t->checkpoint_step = t->step;
    prefetch_noise noise = {.noise_seed = rng_hash(config->run.seed, NOISE_STREAM_TAG),
                            .timestep_shift = config->train.timestep_shift,
                            .logit_normal = config->train.timesteps == TIMESTEPS_LOGIT_NORMAL,
                            .i2v_share = config->train.i2v_share,
                            /* where the model runs on the rank's threads (the CPU), one draws the noise */
                            .threads = t->dev->ops->uses_host_threads ? 1 : threads_per_rank(config, info)};
    const int32_t text_rows = config->model.text_padding == TEXT_PADDING_WAN ? config->model.text_len : 0;
    t->reader = prefetch_create(&t->data, text_rows, config->data.prefetch, config->data.verify, noise);
    if (t->eval && eval_plan(t->eval, memory, info->n_ranks, noise.threads, t->n_calibration, t->calibration_features,
                             t->calibration_seconds) != 0)
        exit_all(ALDIT_EXIT_USAGE);
    if (info->rank == 0) {
        char path[2 * DECK_PATH_MAX];
        metrics_path(config, path, sizeof path);
        t->metrics = metrics_open(path, t->step);
        t->hook = hook_create(config);
    }
    if (config->log.micro_batches) {
        char path[2 * DECK_PATH_MAX];
        snprintf(path, sizeof path, "%s/micro_batches.%d.jsonl", config->run.dir, info->rank);
        t->micro_log = metrics_open(path, t->step);
    }
}

/* [train] prebuild: before the first step, what the device builds at a shape's first use, for every sample of the
   store (hunyuanvideo15: its joint caption with and without its image rows, as prefetch's task draw may give it).
   Not collective: every rank builds the same, after the start-up's watched waits. */
static void prebuild(trainer *t)
{
    const deck *config = t->config;
    if (!config->train.prebuild || !t->dev->ops->prepare) return;
    const double started = comm_time();
    balance_sample *shapes = xmalloc((size_t)(2 * t->data.n_samples + 1) * sizeof *shapes);
    int64_t n = 0;
    for (int64_t id = 0; id < t->data.n_samples; id++) {
        const store_sample *sample = &t->data.samples[id];
        const int32_t tokens = (int32_t)store_sample_tokens(sample, config->model.patch_t, config->model.patch_h,
                                                            config->model.patch_w);
        int32_t rows = text_rows_of(sample, config), image = 0;
        if (config->model.family == FAMILY_HUNYUANVIDEO15 && t->data.has_sources) {
            rows += t->data.sources[id].text_2_len;
            image = sample->frames > 1 ? t->data.sources[id].image_len : 0;
        }
        shapes[n++] = (balance_sample){id, tokens, rows};
        if (image > 0) shapes[n++] = (balance_sample){id, tokens, rows + image};
    }
    const int64_t built = t->dev->ops->prepare(t->dev, shapes, n);
    free(shapes);
    if (t->info->rank == 0 && built > 0)
        printf("  prebuild   %lld attention plan(s) of the store's sample shapes in %.1f s ([train] prebuild)\n",
               (long long)built, seconds_since(started));
}

/* Collective, while the first step's samples are read: the state set in initial_state is complete (a GPU's bf16
   copies made, and NCCL connects the ranks). */
static void start_device(trainer *t)
{
    watchdog_test_stop(t->info->rank, "start", 0);
    t->dev->ops->start(t->dev);
}

static void trainer_free(trainer *t)
{
    free(t->calibration_features);
    free(t->calibration_seconds);
    prefetch_destroy(t->reader);
    rank_assignment_free(&t->current);
    rank_assignment_free(&t->upcoming);
    if (t->info->rank == 0) {
        balance_assignment_free(&t->drawn);
        balancer_free(t->packer);
        if (metrics_close(t->metrics) != 0 && !t->metrics_failed)
            aldit_warn("closing the metrics file of %s failed: its last lines may be missing", t->config->run.dir);
        hook_close(t->hook);
    }
    if (metrics_close(t->micro_log) != 0 && !t->micro_log_failed)
        aldit_warn("rank %d: closing its micro-batch log in %s failed: its last lines may be missing", t->info->rank,
                   t->config->run.dir);
    free(t->samples);
    free(t->snapshot);
    free(t->rank_seconds);
    free(t->upcoming_rank_pred);
    free(t->current_rank_pred);
    free(t->upcoming_rank_samples);
    free(t->current_rank_samples);
    free(t->rank_measures);
    free(t->resumed_seconds);
    free(t->frames);
    free(t->order_tokens);
    free(t->height);
    free(t->width);
    free(t->text_len);
    if (t->dev && t->profiling) t->dev->ops->profile(t->dev, 0); /* the run ended inside the capture */
    if (t->dev) t->dev->ops->free(t->dev);
    eval_close(t->eval);
    model_free(&t->net);
    store_close(&t->data);
}

int train_run(const deck *config, const comm_info *info)
{
    watch_start_up(config, info->rank); /* until the first step's watch */
    int device = device_resolve(config, info);
    if (device < 0) {
        watchdog_phase_end();
        return device == -1 ? ALDIT_EXIT_ERROR : ALDIT_EXIT_USAGE;
    }
    cpu_set_threads(threads_per_rank(config, info));
    trainer t;
    char resumed_from[2 * DECK_PATH_MAX];
    trainer_setup(&t, config, info, device, resumed_from, sizeof resumed_from);
    if (info->rank == 0) print_summary(&t, resumed_from);
    int status = 0, finished = config->run.steps > 0 && t.step >= config->run.steps;
    if (!finished) {
        draw_upcoming(&t);
        /* the uninterrupted run drew this step before observing the last one: the same order here */
        if (t.resumed_seconds) balancer_observe(t.packer, t.resumed_seconds);
        finished = config->run.steps <= 0 && t.upcoming.epoch >= config->run.epochs;
    }
    if (finished && info->rank == 0)
        printf("aldit: nothing to do: the run in %s is already complete at step %lld (raise run.steps or run.epochs to "
               "train on, or give a new run.dir for another run)\n", config->run.dir, (long long)t.step);
    if (!finished) {
        prefetch_start(t.reader, t.upcoming.ids, t.upcoming.n_samples, t.upcoming.epoch);
        start_device(&t);
    }
    t.loop_started_s = t.checkpoint_s = comm_time();
    /* the first step's deadline (later ones come with each step's end) */
    if (info->rank == 0) t.step_timeout = watchdog_timeout(config, t.upcoming_pred_max, 1);
    comm_bcast_bytes(&t.step_timeout, sizeof t.step_timeout);
    watchdog_phase_end();
    if (!finished) {
        prebuild(&t);
        t.loop_started_s = t.checkpoint_s = comm_time();   /* the loop's clocks start after it */
    }
    while (!finished) {
        swap_assignments(&t);
        step_record record = {0};
        watchdog_step_begin(info->rank, t.step + 1, t.step_timeout);
        if (train_step(&t, &record) != 0) {
            watchdog_step_end();
            status = ALDIT_EXIT_ERROR;
            break;
        }
        const int last_step = config->run.steps > 0 ? t.step >= config->run.steps
                                                    : t.upcoming.epoch >= config->run.epochs;
        if (eval_due(t.eval, t.step, last_step)) validate(&t, &record);
        double log_started = comm_time();
        if (info->rank == 0) {
            write_metrics_line(&t, &record);
            if (t.step % config->log.every == 0 || t.step == t.total_steps) print_progress(&t, &record);
        }
        t.phase_s[PHASE_LOG] += seconds_since(log_started);
        /* one reduction at the step's end: a stop signal on any rank; rank 0's checkpoint interval and the next
           step's deadline */
        double boundary[3] = {stop_signal != 0, 0.0, 0.0};
        if (info->rank == 0) {
            boundary[1] = config->checkpoint.interval > 0 && seconds_since(t.checkpoint_s) >= config->checkpoint.interval;
            boundary[2] = watchdog_timeout(config, t.upcoming_pred_max, 0);
        }
        comm_allreduce_max_f64(boundary, 3);
        watchdog_step_end();
        t.step_timeout = boundary[2];
        int signalled = boundary[0] != 0;
        int budget_done = config->run.steps > 0 ? t.step >= config->run.steps : t.upcoming.epoch >= config->run.epochs;
        finished = signalled || budget_done;
        if (signalled && info->rank == 0)
            printf("aldit: stop requested by a signal: checkpointing step %lld and exiting\n", (long long)t.step);
        const int final_wanted = finished && (signalled || config->checkpoint.at_end);
        if (final_wanted || boundary[1] != 0 || (config->checkpoint.every > 0 && t.step % config->checkpoint.every == 0))
            save_checkpoint(&t, finished);
        else if (finished && info->rank == 0 && t.checkpoint_step > 0)
            printf("aldit: no final checkpoint ([checkpoint] at_end = off): the last one is step %lld's\n",
                   (long long)t.checkpoint_step);
        else if (finished && info->rank == 0)
            printf("aldit: no final checkpoint ([checkpoint] at_end = off): the run folder holds none\n");
    }
    watchdog_phase_begin(info->rank, "the run's end", t.step_timeout);
    prefetch_drain(t.reader);
    print_timing_table(&t);
    watchdog_phase_end();
    trainer_free(&t);
    return status;
}
