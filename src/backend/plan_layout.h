/* plan_layout.h — a GPU job planned by the layout's formula alone (model/layout.h), for aldit --check of a model family whose GPU model is not built yet. */
#ifndef ALDIT_PLAN_LAYOUT_H
#define ALDIT_PLAN_LAYOUT_H

#include "backend/backend.h"

/* backend_plan_fn of a GPU job that nothing measures and no GPU model sizes: each rank one GPU of balance.device_mem
   bytes, less [balance] mem_margin and the training state on the GPU (model_layout_state_bytes under [train] shard;
   auto: the least sharding whose budget holds balance_least_useful_budget), the activations by the layout's GPU
   formula (the balancer's memory model, cost_model_backend's GPU). Unlike the CUDA backend's own plan it leaves out
   the GPU model's workspace rounding and the CUDA libraries' reserve. Returns 0, or ALDIT_EXIT_USAGE after rank 0
   said that the state leaves no memory. */
int backend_layout_gpu_plan(const deck *config, const comm_info *info, const model *table,
                            const balance_sample *samples, int64_t n_samples, backend_plan *plan);

#endif
