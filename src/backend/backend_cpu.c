/* backend_cpu.c — the CPU backend: forward/backward on the CPU model, the gradient sum through MPI, clip, AdamW and the weights' EMA over host arrays. */
#include "config.h"
#include "backend/backend_cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend/shard.h"
#include "core/check.h"
#include "core/comm.h"

/* The state by [train] shard (shard.h's cut of the flat array; this rank's slice is [first, first + count)):
   - none: every rank holds the weights (net's), the gradients and both moments, all n_weights long;
   - optimizer: the moments are this rank's slice only; the gradients are all-reduced, each rank updates its slice
     of the weights and the slices are all-gathered;
   - gradients: also the gradients' sum is reduce-scattered: each rank keeps only its slice of it (grad_shard);
   - full: also the weights: a rank's slice of net's weights is its own, the rest is gathered before the step's
     first micro-batch (on the host the whole model at once: the CPU has no per-block memory to save).
   The norm for clipping is summed from the slices where the gradients are sharded. The EMA ([train] ema_decay > 0)
   covers the values a rank updates, as the moments: the whole array in mode none, else this rank's slice; a
   validation with the EMA points net's weights at it (mode none) or at the slices gathered whole (sharded). */
typedef struct {
    const deck *config;
    model *net;           /* the trainer's: its weights are the state */
    backend_plan plan;
    shard_layout layout;
    float *grads;         /* n_weights: the step's gradients on this rank */
    float *grad_shard;    /* gradients, full: this rank's slice of their sum (count values) */
    float *adam_m, *adam_v; /* none: n_weights; sharded: this rank's slice */
    float *ema;           /* the same values' EMA; NULL without [train] ema_decay */
    int ema_set;          /* set_range gave the EMA (else start copies the weights) */
    float *training_weights; /* between use_ema(1) and use_ema(0): net's own weights (net computes with the EMA) */
    double rss_base;      /* resident bytes when the state was started (mem_peak: growth of the peak over it) */
} cpu_state;

/* MemAvailable of /proc/meminfo in bytes, or -1 where it cannot be read. */
static double host_available_bytes(void)
{
    FILE *meminfo = fopen("/proc/meminfo", "r");
    if (!meminfo) return -1.0;
    char line[256];
    double kib = -1.0;
    while (fgets(line, sizeof line, meminfo))
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
    fclose(meminfo);
    return kib < 0 ? -1.0 : kib * 1024.0;
}

/* Resident set now, in bytes. */
static double resident_bytes(void)
{
    FILE *statm = fopen("/proc/self/statm", "r");
    long long pages_total = 0, pages_resident = 0;
    if (!statm) return 0.0;
    if (fscanf(statm, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    fclose(statm);
    return (double)pages_resident * (double)sysconf(_SC_PAGESIZE);
}

/* Peak resident set so far, in bytes. */
static double peak_resident_bytes(void)
{
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (double)usage.ru_maxrss * 1024.0; /* Linux reports KiB */
}

/* The state's bytes on one rank of the CPU backend in this mode (all fp32; see cpu_state). */
static shard_bytes state_bytes_of(const deck *config, const model *table, deck_shard mode, int n_ranks)
{
    return model_layout_state_bytes(&table->layout, LAYOUT_BACKEND_CPU, mode, n_ranks, config->train.ema_decay > 0.0);
}

int backend_cpu_plan(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                     int64_t n_samples, backend_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    if (config->train.precision == PRECISION_FP8) {
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: [train] precision = fp8 needs the CUDA backend on a GPU of compute capability "
                    "8.9 or more; this run is on the CPU backend (run.device = %s): set [train] precision = bf16\n",
                    deck_device_name(config->run.device));
        return ALDIT_EXIT_USAGE;
    }
    plan->budget_measured = config->balance.mem_budget <= 0.0;
    plan->mem_budget = config->balance.mem_budget;
    double available = host_available_bytes();
    if (available < 0.0) available = config->balance.device_mem * info->n_local_ranks;
    double per_rank = available / info->n_local_ranks * (1.0 - config->balance.mem_margin);
    comm_allreduce_min_f64(&per_rank, 1);
    /* the balancer plans with the CPU model's own activation bytes (also when [run] device = auto lands here) */
    cost_model_init(&plan->memory_model, config);
    cost_model_set_memory(&plan->memory_model, config, LAYOUT_BACKEND_CPU);
    plan->has_memory_model = 1;
    /* auto: the least sharding whose state leaves room for the least useful budget (balance.h; full where none
       does: the check below then says what does not fit) */
    const double least = balance_least_useful_budget(config, &plan->memory_model, samples, n_samples);
    plan->shard = config->train.shard;
    if (plan->shard == SHARD_AUTO) {
        plan->shard = SHARD_FULL;
        for (deck_shard mode = SHARD_NONE; mode <= SHARD_FULL; mode++) {
            shard_bytes bytes = state_bytes_of(config, table, mode, info->n_ranks);
            if (per_rank - shard_bytes_total(&bytes) >= least) { plan->shard = mode; break; }
        }
    }
    plan->state = state_bytes_of(config, table, plan->shard, info->n_ranks);
    if (plan->budget_measured) {
        plan->mem_budget = per_rank - shard_bytes_total(&plan->state);
        if (plan->mem_budget <= 0.0) {
            if (info->rank == 0)
                fprintf(stderr, "aldit: error: no memory left for activations after the model state (%lld parameters, "
                        "[train] shard = %s); set [balance] mem_budget, shard more, or use fewer ranks per node\n",
                        (long long)table->n_weights, shard_mode_name(plan->shard));
            return ALDIT_EXIT_USAGE;
        }
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const char *chosen = config->run.device == DEVICE_AUTO ? " (auto)" : "";
    snprintf(plan->device_text, sizeof plan->device_text, "  device     cpu%s, %d OpenMP thread(s) per rank\n", chosen,
             threads);
    char budget_text[32];
    format_size(plan->mem_budget, budget_text, sizeof budget_text);
    int used = snprintf(plan->memory_text, sizeof plan->memory_text, "  memory     activation budget %s per rank (%s)\n",
                        budget_text, plan->budget_measured ? "measured: available host memory" : "[balance] mem_budget");
    if (used > 0 && (size_t)used < sizeof plan->memory_text)
        shard_describe(plan->shard, info->n_ranks, &plan->state, config->train.shard == SHARD_AUTO,
                       plan->memory_text + used, sizeof plan->memory_text - (size_t)used);
    return 0;
}

static void cpu_free(backend *b)
{
    if (!b) return;
    cpu_state *s = b->state;
    if (s->plan.has_memory_model) cost_model_free(&s->plan.memory_model);
    free(s->grads);
    free(s->grad_shard);
    free(s->adam_m);
    free(s->adam_v);
    free(s->ema);
    free(s);
    free(b);
}

static const backend_plan *cpu_plan(const backend *b) { return &((const cpu_state *)b->state)->plan; }

static size_t full_bytes(const cpu_state *s) { return (size_t)s->net->n_weights * sizeof(float); }

static int sharded_moments(const cpu_state *s) { return s->layout.mode != SHARD_NONE; }
static int sharded_gradients(const cpu_state *s)
{
    return s->layout.mode == SHARD_GRADIENTS || s->layout.mode == SHARD_FULL;
}

static const shard_layout *cpu_layout(const backend *b) { return &((const cpu_state *)b->state)->layout; }

/* Where `group`'s values [first, first + count) live (held by this rank: checked). */
static float *state_values(const cpu_state *s, backend_group group, int64_t first, int64_t count)
{
    const shard_layout *l = &s->layout;
    ALDIT_CHECK(first >= l->first && count >= 0 && first + count <= l->first + l->count,
                "cpu backend: values [%lld, %lld) are not this rank's [%lld, %lld)", (long long)first,
                (long long)(first + count), (long long)l->first, (long long)(l->first + l->count));
    switch (group) {
    case BACKEND_WEIGHTS: return s->net->weights + first;
    case BACKEND_ADAM_M: return s->adam_m + (first - l->first);
    case BACKEND_ADAM_V: return s->adam_v + (first - l->first);
    case BACKEND_EMA:
        if (s->ema) return s->ema + (first - l->first);
        ALDIT_FATAL("cpu backend: this run keeps no EMA ([train] ema_decay = off)");
    default: ALDIT_FATAL("cpu backend: this run keeps no state group %d", (int)group);
    }
}

static void cpu_set_range(backend *b, backend_group group, int64_t first, int64_t count, const float *values)
{
    cpu_state *s = b->state;
    memcpy(state_values(s, group, first, count), values, (size_t)count * sizeof(float));
    if (group == BACKEND_EMA) s->ema_set = 1;
}

static void cpu_get_range(const backend *b, backend_group group, int64_t first, int64_t count, float *values)
{
    memcpy(values, state_values(b->state, group, first, count), (size_t)count * sizeof(float));
}

/* Write each page of n values once, keeping them: a calloc'd array's pages are not resident until written. */
static void make_resident(float *values, int64_t n)
{
    if (!values) return;
    volatile float *page = values;
    const int64_t step = (int64_t)sysconf(_SC_PAGESIZE) / (int64_t)sizeof(float);
    for (int64_t i = 0; i < n; i += step > 0 ? step : 1) page[i] = page[i];
}

/* Every rank set its slice of the weights: an EMA not set starts as them; sharded modes gather the whole model
   (full: again each step). The state's arrays are made resident before the baseline of mem_peak is taken, so that
   mem_peak is the activations' growth alone, not the first touch of the gradients and moments. */
static void cpu_start(backend *b)
{
    cpu_state *s = b->state;
    if (s->ema && !s->ema_set)
        memcpy(s->ema, s->net->weights + s->layout.first, (size_t)s->layout.count * sizeof(float));
    if (s->layout.mode != SHARD_NONE) comm_allgather_f32(s->net->weights, s->net->n_weights);
    make_resident(s->grads, s->net->n_weights);
    make_resident(s->grad_shard, sharded_gradients(s) ? s->layout.count : 0);
    make_resident(s->adam_m, s->layout.count);
    make_resident(s->adam_v, s->layout.count);
    make_resident(s->ema, s->layout.count);
    s->rss_base = resident_bytes();
}

static void cpu_begin_step(backend *b, int rounds)
{
    (void)rounds; /* the gradient sum runs once a step, after the last micro-batch */
    cpu_state *s = b->state;
    memset(s->grads, 0, full_bytes(s));
    if (s->layout.mode == SHARD_FULL) comm_allgather_f32(s->net->weights, s->net->n_weights);
}

static double cpu_micro_batch(backend *b, const model_batch *batch, float grad_scale, int last)
{
    (void)last;
    cpu_state *s = b->state;
    return model_forward_backward(s->net, batch, s->grads, grad_scale, NULL);
}

/* A fully sharded state holds only this rank's slice of the weights up to date after a step: gather them all. */
static void cpu_begin_eval(backend *b)
{
    cpu_state *s = b->state;
    if (s->layout.mode == SHARD_FULL) comm_allgather_f32(s->net->weights, s->net->n_weights);
}

/* An empty batch: nothing (the host gathers no block on its own, so there is no collective to match). */
static double cpu_eval_batch(backend *b, const model_batch *batch, double *sample_loss)
{
    cpu_state *s = b->state;
    if (batch->n_samples == 0) return 0.0;
    return model_forward_loss(s->net, batch, sample_loss);
}

/* net computes with the EMA: mode none's own array, or every rank's slice gathered into a whole one; and back. */
static void cpu_use_ema(backend *b, int on)
{
    cpu_state *s = b->state;
    ALDIT_CHECK(s->ema, "cpu backend: a validation with the EMA, but this run keeps none ([train] ema_decay = off)");
    ALDIT_CHECK(on == !s->training_weights, "cpu backend: use_ema(%d) twice", on);
    const int64_t n = s->net->n_weights;
    if (on) {
        s->training_weights = s->net->weights;
        if (s->layout.mode == SHARD_NONE) s->net->weights = s->ema;
        else {
            float *whole = xmalloc((size_t)n * sizeof *whole);
            memcpy(whole + s->layout.first, s->ema, (size_t)s->layout.count * sizeof *whole);
            comm_allgather_f32(whole, n);
            s->net->weights = whole;
        }
    } else {
        if (s->layout.mode != SHARD_NONE) free(s->net->weights);
        s->net->weights = s->training_weights;
        s->training_weights = NULL;
    }
}

static void cpu_sum_gradients(backend *b)
{
    cpu_state *s = b->state;
    if (sharded_gradients(s)) comm_reduce_scatter_sum_f32(s->grads, s->net->n_weights, s->grad_shard);
    else comm_allreduce_sum_f32(s->grads, (size_t)s->net->n_weights);
}

/* The norm of the summed gradients: of the whole array where every rank holds it, else of the slices. */
static double global_norm(const cpu_state *s)
{
    if (!sharded_gradients(s)) return optim_global_norm(s->grads, s->net->n_weights);
    double norm = optim_global_norm(s->grad_shard, s->layout.count), sumsq = norm * norm;
    comm_allreduce_sum_f64(&sumsq, 1);
    return sqrt(sumsq);
}

/* AdamW over the values [first, first + count) of the flat array, parameter by parameter (each with its decay):
   weights and grads are indexed in the flat array, m and v from `first`. */
static void adamw_range(const cpu_state *s, const adamw_step *hyper, int64_t first, int64_t count, const float *grads)
{
    const model *net = s->net;
    const int64_t end = first + count;
    for (int p = 0; p < net->n_params; p++) {
        const param_info *param = &net->params[p];
        int64_t lo = param->offset > first ? param->offset : first;
        int64_t hi = param->offset + param->n_elements < end ? param->offset + param->n_elements : end;
        if (lo >= hi) continue;
        double weight_decay = optim_param_decays(param->name, param->ndim) ? s->config->train.weight_decay : 0.0;
        optim_adamw(hyper, weight_decay, net->weights + lo, grads + (lo - first), s->adam_m + (lo - first),
                    s->adam_v + (lo - first), hi - lo);
    }
}

static void cpu_finish_step(backend *b, const adamw_step *hyper, int update, backend_step_result *result)
{
    cpu_state *s = b->state;
    const int64_t n = s->net->n_weights;
    const double started = comm_time();
    result->grad_norm = global_norm(s);
    result->comm_device_s = 0.0;
    if (update && isfinite(result->grad_norm)) {
        if (sharded_gradients(s)) {
            optim_clip(s->grad_shard, s->layout.count, result->grad_norm, s->config->train.grad_clip);
            adamw_range(s, hyper, s->layout.first, s->layout.count, s->grad_shard);
        } else if (sharded_moments(s)) {
            optim_clip(s->grads + s->layout.first, s->layout.count, result->grad_norm, s->config->train.grad_clip);
            adamw_range(s, hyper, s->layout.first, s->layout.count, s->grads + s->layout.first);
        } else {
            optim_clip(s->grads, n, result->grad_norm, s->config->train.grad_clip);
            adamw_range(s, hyper, 0, n, s->grads);
        }
        if (s->ema) /* the values this rank updated (mode none: all) */
            optim_ema(s->ema, s->net->weights + s->layout.first, s->layout.count, optim_ema_decay(s->config, hyper->step));
        /* full gathers at the next step's start; optimizer and gradients now */
        if (s->layout.mode == SHARD_OPTIMIZER || s->layout.mode == SHARD_GRADIENTS) comm_allgather_f32(s->net->weights, n);
    }
    result->optimizer_s = comm_time() - started;
    result->mem_peak = peak_resident_bytes() - s->rss_base;
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .uses_host_threads = 1,
    .free = cpu_free,
    .plan = cpu_plan,
    .layout = cpu_layout,
    .set_range = cpu_set_range,
    .start = cpu_start,
    .get_range = cpu_get_range,
    .begin_step = cpu_begin_step,
    .micro_batch = cpu_micro_batch,
    .begin_eval = cpu_begin_eval,
    .eval_batch = cpu_eval_batch,
    .use_ema = cpu_use_ema,
    .sum_gradients = cpu_sum_gradients,
    .finish_step = cpu_finish_step,
};

backend *backend_cpu_create(const deck *config, const comm_info *info, model *net, const balance_sample *samples,
                            int64_t n_samples)
{
    cpu_state *s = xcalloc(1, sizeof *s);
    s->config = config;
    s->net = net;
    if (backend_cpu_plan(config, info, net, samples, n_samples, &s->plan) != 0) {
        free(s);
        return NULL;
    }
    s->layout = shard_layout_of(s->plan.shard, net->n_weights, info->rank, info->n_ranks);
    const int64_t n_moments = s->layout.count;
    if (!net->weights) net->weights = xcalloc((size_t)net->n_weights, sizeof *net->weights); /* a table: the CPU computes */
    s->grads = xcalloc((size_t)net->n_weights, sizeof *s->grads);
    if (sharded_gradients(s)) s->grad_shard = xcalloc((size_t)(s->layout.count > 0 ? s->layout.count : 1), sizeof(float));
    s->adam_m = xcalloc((size_t)(n_moments > 0 ? n_moments : 1), sizeof *s->adam_m);
    s->adam_v = xcalloc((size_t)(n_moments > 0 ? n_moments : 1), sizeof *s->adam_v);
    if (config->train.ema_decay > 0.0) s->ema = xcalloc((size_t)(n_moments > 0 ? n_moments : 1), sizeof *s->ema);
    backend *b = xcalloc(1, sizeof *b);
    b->ops = &cpu_ops;
    b->state = s;
    return b;
}
