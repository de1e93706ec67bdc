/* backend_cpu.h — the CPU backend (fp32, the trainer's own model, OpenMP and CBLAS; gradients summed over MPI): backend.h's interface. */
#ifndef ALDIT_BACKEND_CPU_H
#define ALDIT_BACKEND_CPU_H

#include "backend/backend.h"

/* backend_plan_fn of the CPU: the activation budget is [balance] mem_budget, or the node's available host memory
   shared by its ranks, less [balance] mem_margin, less the fp32 weights, gradients and both AdamW moments. A
   budget of 0 or less is an error (ALDIT_EXIT_USAGE). The balancer keeps the deck's memory model. */
int backend_cpu_plan(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                     int64_t n_samples, backend_plan *plan);

/* backend_create_fn of the CPU: computes with net's weights in place (the trainer's model), keeps the gradients
   and the AdamW moments. It has no start-up calibration. */
backend *backend_cpu_create(const deck *config, const comm_info *info, model *net, const balance_sample *samples,
                            int64_t n_samples);

#endif
