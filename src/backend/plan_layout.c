/* plan_layout.c — a GPU job's memory planned by the layout's formula alone (no GPU model, nothing measured). */
#include "backend/plan_layout.h"

#include <stdio.h>
#include <string.h>

#include "backend/shard.h"
#include "core/check.h"

static shard_bytes gpu_state_of(const deck *config, const model *table, deck_shard mode, int n_ranks)
{
    return model_layout_state_bytes(&table->layout, LAYOUT_BACKEND_GPU, mode, n_ranks, config->train.ema_decay > 0.0);
}

int backend_layout_gpu_plan(const deck *config, const comm_info *info, const model *table,
                            const balance_sample *samples, int64_t n_samples, backend_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->budget_measured = config->balance.mem_budget <= 0.0;
    plan->mem_budget = config->balance.mem_budget;
    plan->fills_memory = 1;
    const double per_rank = config->balance.device_mem * (1.0 - config->balance.mem_margin);
    cost_model_init(&plan->memory_model, config);
    cost_model_set_memory(&plan->memory_model, config, LAYOUT_BACKEND_GPU);
    plan->has_memory_model = 1;
    const double least = balance_least_useful_budget(config, &plan->memory_model, samples, n_samples);
    plan->shard = config->train.shard;
    if (plan->shard == SHARD_AUTO) {
        plan->shard = SHARD_FULL;
        for (deck_shard mode = SHARD_NONE; mode <= SHARD_FULL; mode++) {
            const shard_bytes bytes = gpu_state_of(config, table, mode, info->n_ranks);
            if (per_rank - shard_bytes_total(&bytes) >= least) { plan->shard = mode; break; }
        }
    }
    plan->state = gpu_state_of(config, table, plan->shard, info->n_ranks);
    if (plan->budget_measured) plan->mem_budget = per_rank - shard_bytes_total(&plan->state);
    if (!(plan->mem_budget > 0.0) || per_rank - shard_bytes_total(&plan->state) < plan->mem_budget) {
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: the training state (%lld parameters, [train] shard = %s over %d ranks) leaves "
                    "no room for the activations in balance.device_mem x (1 - mem_margin); shard more, use more ranks, "
                    "or set [balance] device_mem or mem_budget\n", (long long)table->n_weights,
                    shard_mode_name(plan->shard), info->n_ranks);
        cost_model_free(&plan->memory_model);
        plan->has_memory_model = 0;
        return ALDIT_EXIT_USAGE;
    }
    char device_text[32], budget_text[32];
    format_size(config->balance.device_mem, device_text, sizeof device_text);
    format_size(plan->mem_budget, budget_text, sizeof budget_text);
    snprintf(plan->device_text, sizeof plan->device_text,
             "  device     cuda, planned: one GPU of %s per rank (balance.device_mem) by the layout's GPU memory "
             "formula: this model family has no GPU model yet, so nothing is measured\n", device_text);
    const int used = snprintf(plan->memory_text, sizeof plan->memory_text,
                              "  memory     activation budget %s per rank (%s)\n", budget_text,
                              plan->budget_measured ? "balance.device_mem x (1 - mem_margin) less the state"
                                                    : "[balance] mem_budget");
    if (used > 0 && (size_t)used < sizeof plan->memory_text)
        shard_describe(plan->shard, info->n_ranks, &plan->state, config->train.shard == SHARD_AUTO,
                       plan->memory_text + used, sizeof plan->memory_text - (size_t)used);
    return 0;
}
