/* eval.c — validation passes: the held-out store, its split over the ranks, the forward at every noise level, one reduction. */
#include "train/eval.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"
#include "train/watchdog.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct evaluator {
    const deck *config;
    store data;
    int64_t n_samples;             /* validated: the store's first n_samples */
    balance_sample *samples;
    prefetcher *reader;
    /* this rank's share of a pass: ids back to back, micro-batch m holding ids[micro_start[m] .. micro_start[m+1]) */
    int64_t *ids;
    int n_ids, n_micro;
    int *micro_start;
    int most_micro;                /* the most micro-batches any rank has: the eval_batch rounds of every rank */
    /* the same on every rank after eval_plan */
    int64_t planned_samples;       /* samples over all ranks (oversize ones left out with [balance] oversize = skip) */
    int64_t total_micro;           /* micro-batches over all ranks */
    double predicted_max_s;        /* predicted seconds of the slowest rank's share at training's cost, one level */
    double timeout_s;              /* the pass's deadline */
    /* per-sample shapes and the noise level of the micro-batch being computed */
    int32_t *frames, *height, *width, *text_len;
    float *sigma;
};

/* The text rows the model sees of a sample (train.c's rule: text_len with [model] text_padding = wan). */
static int32_t text_rows_of(const store_sample *sample, const deck *config)
{
    return config->model.text_padding == TEXT_PADDING_WAN ? config->model.text_len : sample->text_len;
}

prefetch_noise eval_noise(const deck *config, int threads)
{
    return (prefetch_noise){.noise_seed = rng_hash(config->run.seed, EVAL_NOISE_TAG),
                            .timestep_shift = config->train.timestep_shift,
                            .logit_normal = config->train.timesteps == TIMESTEPS_LOGIT_NORMAL,
                            .i2v_share = config->train.i2v_share, .threads = threads > 0 ? threads : 1};
}

/* Rank 0 opens the store once on its own, so that a failure names [eval] store before store_open_bcast ends
   the job; every rank exits with status 2 then. */
static void probe_store(const char *path)
{
    int status = 0;
    if (comm_rank() == 0) {
        store probe;
        status = store_open(&probe, path, stderr);
        if (status == 0) store_close(&probe);
        else fprintf(stderr, "aldit: error: cannot use [eval] store = %s (see above)\n", path);
    }
    comm_bcast_bytes(&status, sizeof status);
    if (status != 0) {
        fflush(stderr);
        comm_finalize();
        exit(ALDIT_EXIT_USAGE);
    }
}

evaluator *eval_open(const deck *config)
{
    if (!config->eval.store[0] || config->eval.every <= 0) return NULL;
    probe_store(config->eval.store);
    evaluator *e = xcalloc(1, sizeof *e);
    e->config = config;
    store_open_bcast(&e->data, config->eval.store);
    if (config->eval.samples > e->data.n_samples) {
        if (comm_rank() == 0)
            fprintf(stderr, "aldit: error: [eval] samples = %lld, but [eval] store = %s holds %lld samples\n",
                    (long long)config->eval.samples, e->data.path, (long long)e->data.n_samples);
        fflush(stderr);
        comm_finalize();
        exit(ALDIT_EXIT_USAGE);
    }
    e->n_samples = config->eval.samples > 0 ? config->eval.samples : e->data.n_samples;
    e->samples = xmalloc((size_t)(e->n_samples > 0 ? e->n_samples : 1) * sizeof *e->samples);
    for (int64_t id = 0; id < e->n_samples; id++) {
        const store_sample *sample = &e->data.samples[id];
        e->samples[id] = (balance_sample){
            .id = id,
            .tokens = (int32_t)store_sample_tokens(sample, config->model.patch_t, config->model.patch_h,
                                                   config->model.patch_w),
            .text_len = text_rows_of(sample, config)};
    }
    return e;
}

void eval_close(evaluator *e)
{
    if (!e) return;
    prefetch_destroy(e->reader);
    store_close(&e->data);
    free(e->samples);
    free(e->ids);
    free(e->micro_start);
    free(e->frames);
    free(e->height);
    free(e->width);
    free(e->text_len);
    free(e->sigma);
    free(e);
}

const store *eval_store(const evaluator *e) { return &e->data; }

const balance_sample *eval_samples(const evaluator *e, int64_t *n_samples)
{
    *n_samples = e->n_samples;
    return e->samples;
}

/* Rank 0: the training balancer's code over the validation samples, as for a run of one rank (train.c's
   create_balancer), or NULL after printing why. */
static balancer *create_eval_balancer(const evaluator *e, const backend_plan *memory, int n_calibration,
                                      const cost_features *features, const double *seconds)
{
    balancer *b = balancer_create_checked(e->config, e->samples, e->n_samples, 1, memory->mem_budget,
                                          memory->has_memory_model ? &memory->memory_model : NULL, stderr);
    if (!b) {
        fprintf(stderr, "aldit: error: the samples of [eval] store = %s do not fit the plan (above)\n", e->data.path);
        return NULL;
    }
    if (!memory->fills_memory) balancer_set_mem_fill(b, 0.0);
    if (n_calibration > 0) balancer_calibrate(b, n_calibration, features, seconds);
    if (balancer_skipped(b) > 0)
        aldit_warn("[eval] store = %s: %lld of %lld validation samples left out as oversize (above)", e->data.path,
                   (long long)balancer_skipped(b), (long long)e->n_samples);
    return b;
}

/* The micro-batches of a pass, the same for any rank count, and the rank each is computed on. */
typedef struct {
    int64_t n_units, n_ids;
    int64_t *unit_start;   /* n_units + 1 offsets into ids */
    int64_t *ids;
    int32_t *owner;        /* rank of each micro-batch */
    double predicted_max_s, largest_unit_s;
} pass_plan;

static double unit_seconds(const evaluator *e, const cost_model *cm, const int64_t *ids, int64_t n)
{
    cost_features features;
    memset(&features, 0, sizeof features);
    for (int64_t i = 0; i < n; i++) cost_features_add(cm, &features, e->samples[ids[i]].tokens, e->samples[ids[i]].text_len);
    return cost_model_predict_features(cm, &features);
}

/* Rank 0: one epoch of the one-rank balancer's micro-batches, spread over the ranks longest first, each to the rank
   with the least predicted work so far (the lowest on a tie). */
static void plan_pass(const evaluator *e, balancer *packer, int n_ranks, pass_plan *plan)
{
    balance_assignment step = {0};
    int64_t unit_capacity = 16;
    plan->unit_start = xmalloc((size_t)(unit_capacity + 1) * sizeof *plan->unit_start);
    plan->ids = xmalloc((size_t)(e->n_samples > 0 ? e->n_samples : 1) * sizeof *plan->ids);
    plan->unit_start[0] = 0;
    for (balancer_next(packer, &step); step.epoch == 0; balancer_next(packer, &step))
        for (int m = 0; m < step.rank_micro_start[1]; m++) {
            if (plan->n_units == unit_capacity) {
                unit_capacity *= 2;
                plan->unit_start = xrealloc(plan->unit_start, (size_t)(unit_capacity + 1) * sizeof *plan->unit_start);
            }
            for (int64_t i = step.micro_start[m]; i < step.micro_start[m + 1]; i++) plan->ids[plan->n_ids++] = step.ids[i];
            plan->unit_start[++plan->n_units] = plan->n_ids;
        }
    balance_assignment_free(&step);
    const cost_model *cm = balancer_cost_model(packer);
    double *seconds = xmalloc((size_t)(plan->n_units > 0 ? plan->n_units : 1) * sizeof *seconds);
    int64_t *order = xmalloc((size_t)(plan->n_units > 0 ? plan->n_units : 1) * sizeof *order);
    for (int64_t u = 0; u < plan->n_units; u++) {
        seconds[u] = unit_seconds(e, cm, plan->ids + plan->unit_start[u], plan->unit_start[u + 1] - plan->unit_start[u]);
        order[u] = u;
        if (seconds[u] > plan->largest_unit_s) plan->largest_unit_s = seconds[u];
    }
    for (int64_t i = 1; i < plan->n_units; i++) /* insertion sort, longest first, earlier first on a tie */
        for (int64_t j = i; j > 0 && seconds[order[j]] > seconds[order[j - 1]]; j--) {
            int64_t swap = order[j];
            order[j] = order[j - 1];
            order[j - 1] = swap;
        }
    double *load = xcalloc((size_t)n_ranks, sizeof *load);
    plan->owner = xmalloc((size_t)(plan->n_units > 0 ? plan->n_units : 1) * sizeof *plan->owner);
    for (int64_t i = 0; i < plan->n_units; i++) {
        int least = 0;
        for (int r = 1; r < n_ranks; r++)
            if (load[r] < load[least]) least = r;
        plan->owner[order[i]] = least;
        load[least] += seconds[order[i]];
    }
    for (int r = 0; r < n_ranks; r++)
        if (load[r] > plan->predicted_max_s) plan->predicted_max_s = load[r];
    free(load);
    free(order);
    free(seconds);
}

/* Collective: rank 0's plan (over n_ranks) reaches every rank, which keeps its own micro-batches (in plan order)
   and learns how many the busiest rank has. */
static void take_share(evaluator *e, pass_plan *plan, int n_ranks)
{
    const int rank = comm_rank();
    double sizes[4] = {(double)plan->n_units, (double)plan->n_ids, plan->predicted_max_s, plan->largest_unit_s};
    comm_bcast_bytes(sizes, sizeof sizes);
    if (rank != 0) {
        plan->n_units = (int64_t)sizes[0];
        plan->n_ids = (int64_t)sizes[1];
        plan->predicted_max_s = sizes[2];
        plan->largest_unit_s = sizes[3];
        plan->unit_start = xmalloc((size_t)(plan->n_units + 1) * sizeof *plan->unit_start);
        plan->ids = xmalloc((size_t)(plan->n_ids > 0 ? plan->n_ids : 1) * sizeof *plan->ids);
        plan->owner = xmalloc((size_t)(plan->n_units > 0 ? plan->n_units : 1) * sizeof *plan->owner);
    }
    comm_bcast_bytes(plan->unit_start, (size_t)(plan->n_units + 1) * sizeof *plan->unit_start);
    comm_bcast_bytes(plan->ids, (size_t)plan->n_ids * sizeof *plan->ids);
    comm_bcast_bytes(plan->owner, (size_t)plan->n_units * sizeof *plan->owner);
    e->ids = xmalloc((size_t)(plan->n_ids > 0 ? plan->n_ids : 1) * sizeof *e->ids);
    e->micro_start = xmalloc((size_t)(plan->n_units + 1) * sizeof *e->micro_start);
    e->micro_start[0] = 0;
    int *micro_of_rank = xcalloc((size_t)n_ranks, sizeof *micro_of_rank);
    for (int64_t u = 0; u < plan->n_units; u++) {
        micro_of_rank[plan->owner[u]]++;
        if (plan->owner[u] != rank) continue;
        for (int64_t i = plan->unit_start[u]; i < plan->unit_start[u + 1]; i++) e->ids[e->n_ids++] = plan->ids[i];
        e->micro_start[++e->n_micro] = e->n_ids;
    }
    for (int r = 0; r < n_ranks; r++)
        if (micro_of_rank[r] > e->most_micro) e->most_micro = micro_of_rank[r];
    free(micro_of_rank);
    e->planned_samples = plan->n_ids;
    e->total_micro = plan->n_units;
    e->predicted_max_s = plan->predicted_max_s;
    free(plan->unit_start);
    free(plan->ids);
    free(plan->owner);
}

int eval_plan(evaluator *e, const backend_plan *memory, int n_ranks, int noise_threads, int n_calibration,
              const cost_features *calibration_features, const double *calibration_seconds)
{
    const deck *config = e->config;
    const int32_t text_rows = config->model.text_padding == TEXT_PADDING_WAN ? config->model.text_len : 0;
    if (!e->reader)
        e->reader = prefetch_create(&e->data, text_rows, config->data.prefetch, config->data.verify,
                                    eval_noise(config, noise_threads));
    balancer *packer = NULL;
    int status = 0;
    if (comm_rank() == 0) {
        packer = create_eval_balancer(e, memory, n_calibration, calibration_features, calibration_seconds);
        status = packer ? 0 : ALDIT_EXIT_USAGE;
    }
    comm_bcast_bytes(&status, sizeof status);
    if (status != 0) return status;
    pass_plan plan;
    memset(&plan, 0, sizeof plan);
    if (comm_rank() == 0) {
        plan_pass(e, packer, n_ranks, &plan);
        balancer_free(packer);
    }
    take_share(e, &plan, n_ranks);
    /* the slowest rank's predicted training compute at every level, with each set of weights: generous, as a
       forward is about a third of it */
    const int weight_sets = config->train.ema_decay > 0.0 ? 2 : 1;
    e->timeout_s = watchdog_pass_timeout(config, weight_sets * config->eval.sigmas.n * e->predicted_max_s);
    return 0;
}

void eval_describe(const evaluator *e, char *text, size_t text_size)
{
    const deck *config = e->config;
    char first[64] = "";
    if (e->n_samples < e->data.n_samples)
        snprintf(first, sizeof first, " (the first of %lld)", (long long)e->data.n_samples);
    snprintf(text, text_size, "  eval       %s: %lld samples%s at %d noise level(s), every %lld steps and at the end, "
             "forward only%s; %lld micro-batches spread over the ranks (slowest rank: %.3g s per level at training's "
             "cost); a pass's deadline %.0f s\n", e->data.path, (long long)e->planned_samples, first,
             config->eval.sigmas.n, (long long)config->eval.every,
             config->train.ema_decay > 0.0 ? ", with the weights and their EMA" : "", (long long)e->total_micro,
             e->predicted_max_s, e->timeout_s);
}

int eval_due(const evaluator *e, int64_t step, int last)
{
    return e && e->config->eval.every > 0 && (last || step % e->config->eval.every == 0);
}

/* Room for the shapes and noise level of a micro-batch of n samples. */
static void reserve(evaluator *e, int n, int *capacity)
{
    if (n <= *capacity) return;
    *capacity = n;
    e->frames = xrealloc(e->frames, (size_t)n * sizeof *e->frames);
    e->height = xrealloc(e->height, (size_t)n * sizeof *e->height);
    e->width = xrealloc(e->width, (size_t)n * sizeof *e->width);
    e->text_len = xrealloc(e->text_len, (size_t)n * sizeof *e->text_len);
    e->sigma = xrealloc(e->sigma, (size_t)n * sizeof *e->sigma);
}

/* The read micro-batch less its unreadable samples (each named in a warning; `weights` names the pass's weights);
   returns the samples left. */
static int drop_unreadable(evaluator *e, const sample_batch *batch, int64_t step, const char *weights)
{
    if (batch->n_failed == 0) return batch->n_samples;
    for (int i = 0; i < batch->n_samples; i++)
        if (batch->failed[i])
            aldit_warn("validation after step %lld (%s): leaving out sample %lld of [eval] store = %s, which cannot be "
                       "read", (long long)step, weights, (long long)batch->ids[i], e->data.path);
    int micro_start[2] = {0, batch->n_samples};
    prefetch_drop_failed(e->reader, micro_start, 1);
    return batch->n_samples; /* the batch now holds the others only */
}

/* Forward of one micro-batch at every noise level (batch NULL or without samples: empty forwards, for their
   collectives); adds each level's sum of per-sample losses to sums. */
static void evaluate_batch(evaluator *e, backend *b, const sample_batch *batch, int *capacity, double *sums)
{
    const deck *config = e->config;
    const int n = batch ? batch->n_samples : 0;
    if (n == 0) {
        const model_batch empty = {.n_samples = 0};
        for (int level = 0; level < config->eval.sigmas.n; level++) sums[level] += b->ops->eval_batch(b, &empty, NULL);
        return;
    }
    reserve(e, n, capacity);
    for (int i = 0; i < n; i++) {
        const store_sample *sample = &e->data.samples[batch->ids[i]];
        e->frames[i] = sample->frames;
        e->height[i] = sample->height;
        e->width[i] = sample->width;
        e->text_len[i] = text_rows_of(sample, config);
    }
    model_batch mb = {.n_samples = n, .frames = e->frames, .height = e->height, .width = e->width,
                      .text_len = e->text_len, .latents = batch->latents, .noise = batch->noise, .sigma = e->sigma,
                      .text = batch->text, .text_2_len = batch->text_2_len, .text_2 = batch->text_2,
                      .image_len = batch->image_len, .image = batch->image, .i2v = batch->i2v};
    for (int level = 0; level < config->eval.sigmas.n; level++) {
        for (int i = 0; i < n; i++) e->sigma[i] = (float)config->eval.sigmas.values[level];
        sums[level] += b->ops->eval_batch(b, &mb, NULL);
    }
}

/* One pass over this rank's micro-batches with the backend's current weights, then empty rounds up to the busiest
   rank's count: sums[level] += the level's sum of losses, sums[n_levels] += the samples evaluated. */
static void run_pass(evaluator *e, backend *b, int64_t step, const char *weights, double *sums)
{
    const int n_levels = e->config->eval.sigmas.n;
    int capacity = 0;
    if (e->n_micro > 0) prefetch_start(e->reader, e->ids, e->micro_start[1], 0);
    for (int m = 0; m < e->n_micro; m++) {
        double wait_s = 0.0;
        const sample_batch *batch = prefetch_finish(e->reader, &wait_s);
        sums[n_levels] += drop_unreadable(e, batch, step, weights);
        if (m + 1 < e->n_micro) /* the next micro-batch is read while this one computes */
            prefetch_start(e->reader, e->ids + e->micro_start[m + 1], e->micro_start[m + 2] - e->micro_start[m + 1], 0);
        evaluate_batch(e, b, batch, &capacity, sums);
    }
    for (int m = e->n_micro; m < e->most_micro; m++) evaluate_batch(e, b, NULL, &capacity, sums);
}

/* The means of one pass's sums (per level, then the samples). */
static void pass_means(const double *sums, int n_levels, double *loss, double *sigma_loss, int64_t *samples)
{
    *samples = (int64_t)sums[n_levels];
    double total = 0.0;
    for (int level = 0; level < n_levels; level++) {
        sigma_loss[level] = *samples > 0 ? sums[level] / (double)*samples : NAN;
        total += sums[level];
    }
    *loss = *samples > 0 ? total / ((double)*samples * n_levels) : NAN;
}

void eval_run(evaluator *e, backend *b, int64_t step, eval_result *result)
{
    const int n_levels = e->config->eval.sigmas.n;
    const int with_ema = e->config->train.ema_decay > 0.0;
    const double started = comm_time(), timeout_s = e->timeout_s;
    char what[96];
    snprintf(what, sizeof what, "validation after step %lld (deadline %.0f s)", (long long)step, timeout_s);
    const double grace = timeout_s / 4 < 1.0 ? 1.0 : timeout_s / 4 > 30.0 ? 30.0 : timeout_s / 4;
    comm_watch_begin(started + (comm_rank() == 0 ? timeout_s : 2.0 * timeout_s + grace + 30.0), grace, what);
    if (b->ops->begin_eval) b->ops->begin_eval(b);
    /* per level, then the samples evaluated: the training weights' pass, then the EMA's */
    double sums[2 * (DECK_LIST_MAX + 1)] = {0.0};
    run_pass(e, b, step, "training weights", sums);
    if (with_ema) {
        b->ops->use_ema(b, 1);
        run_pass(e, b, step, "EMA weights", sums + n_levels + 1);
        b->ops->use_ema(b, 0);
    }
    comm_allreduce_sum_f64(sums, (size_t)(with_ema ? 2 : 1) * (size_t)(n_levels + 1));
    double seconds = comm_time() - started;
    comm_allreduce_max_f64(&seconds, 1);
    comm_watch_end();
    memset(result, 0, sizeof *result);
    result->n_sigmas = n_levels;
    result->seconds = seconds;
    pass_means(sums, n_levels, &result->loss, result->sigma_loss, &result->samples);
    result->has_ema = with_ema;
    if (with_ema)
        pass_means(sums + n_levels + 1, n_levels, &result->ema_loss, result->ema_sigma_loss, &result->ema_samples);
}
