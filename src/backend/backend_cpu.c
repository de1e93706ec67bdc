/* backend_cpu.c — the CPU backend: forward/backward on the CPU model, the gradient sum through MPI, clip and AdamW over host arrays. */
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

#include "core/check.h"
#include "core/comm.h"

typedef struct {
    const deck *config;
    model *net;           /* the trainer's: its weights are the state */
    backend_plan plan;
    float *grads, *adam_m, *adam_v;
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

int backend_cpu_plan(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                     int64_t n_samples, backend_plan *plan)
{
    (void)samples;
    (void)n_samples;
    memset(plan, 0, sizeof *plan);
    plan->budget_measured = config->balance.mem_budget <= 0.0;
    plan->mem_budget = config->balance.mem_budget;
    if (plan->budget_measured) {
        double available = host_available_bytes();
        if (available < 0.0) available = config->balance.device_mem * info->n_local_ranks;
        plan->mem_budget = available / info->n_local_ranks * (1.0 - config->balance.mem_margin)
                           - 4.0 * sizeof(float) * (double)table->n_weights;
        comm_allreduce_min_f64(&plan->mem_budget, 1);
        if (plan->mem_budget <= 0.0) {
            if (info->rank == 0)
                fprintf(stderr, "aldit: error: no memory left for activations after the model state (%lld parameters); "
                        "set [balance] mem_budget or use fewer ranks per node\n", (long long)table->n_weights);
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
    snprintf(plan->memory_text, sizeof plan->memory_text, "  memory     activation budget %s per rank (%s)\n",
             budget_text, plan->budget_measured ? "measured: available host memory" : "[balance] mem_budget");
    return 0;
}

static void cpu_free(backend *b)
{
    if (!b) return;
    cpu_state *s = b->state;
    free(s->grads);
    free(s->adam_m);
    free(s->adam_v);
    free(s);
    free(b);
}

static const backend_plan *cpu_plan(const backend *b) { return &((const cpu_state *)b->state)->plan; }

static size_t state_bytes(const cpu_state *s) { return (size_t)s->net->n_weights * sizeof(float); }

static void cpu_start(backend *b, const float *weights, const float *adam_m, const float *adam_v)
{
    cpu_state *s = b->state;
    if (weights != s->net->weights) memcpy(s->net->weights, weights, state_bytes(s));
    memcpy(s->adam_m, adam_m, state_bytes(s));
    memcpy(s->adam_v, adam_v, state_bytes(s));
    s->rss_base = resident_bytes();
}

static void cpu_read_state(const backend *b, float *weights, float *adam_m, float *adam_v)
{
    const cpu_state *s = b->state;
    if (weights != s->net->weights) memcpy(weights, s->net->weights, state_bytes(s));
    memcpy(adam_m, s->adam_m, state_bytes(s));
    memcpy(adam_v, s->adam_v, state_bytes(s));
}

static void cpu_begin_step(backend *b)
{
    cpu_state *s = b->state;
    memset(s->grads, 0, state_bytes(s));
}

static double cpu_micro_batch(backend *b, const model_batch *batch, float grad_scale, int last)
{
    (void)last;
    cpu_state *s = b->state;
    return model_forward_backward(s->net, batch, s->grads, grad_scale, NULL);
}

static void cpu_sum_gradients(backend *b)
{
    cpu_state *s = b->state;
    comm_allreduce_sum_f32(s->grads, (size_t)s->net->n_weights);
}

static void cpu_finish_step(backend *b, const adamw_step *hyper, int update, backend_step_result *result)
{
    cpu_state *s = b->state;
    const model *net = s->net;
    const double started = comm_time();
    result->grad_norm = optim_global_norm(s->grads, net->n_weights);
    result->comm_device_s = 0.0;
    if (update && isfinite(result->grad_norm)) {
        optim_clip(s->grads, net->n_weights, result->grad_norm, s->config->train.grad_clip);
        for (int p = 0; p < net->n_params; p++) {
            const param_info *param = &net->params[p];
            double weight_decay = optim_param_decays(param->name, param->ndim) ? s->config->train.weight_decay : 0.0;
            optim_adamw(hyper, weight_decay, net->weights + param->offset, s->grads + param->offset,
                        s->adam_m + param->offset, s->adam_v + param->offset, param->n_elements);
        }
    }
    result->optimizer_s = comm_time() - started;
    result->mem_peak = peak_resident_bytes() - s->rss_base;
}

static const backend_ops cpu_ops = {
    .name = "cpu",
    .uses_host_threads = 1,
    .free = cpu_free,
    .plan = cpu_plan,
    .start = cpu_start,
    .read_state = cpu_read_state,
    .begin_step = cpu_begin_step,
    .micro_batch = cpu_micro_batch,
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
    s->grads = xcalloc((size_t)net->n_weights, sizeof *s->grads);
    s->adam_m = xcalloc((size_t)net->n_weights, sizeof *s->adam_m);
    s->adam_v = xcalloc((size_t)net->n_weights, sizeof *s->adam_v);
    backend *b = xcalloc(1, sizeof *b);
    b->ops = &cpu_ops;
    b->state = s;
    return b;
}
