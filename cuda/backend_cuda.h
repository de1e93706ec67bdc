/* backend_cuda.h — the CUDA backend (one GPU per rank: bf16 GPU model, fp32 master weights and AdamW moments, gradients summed by gradsync, or that state sharded by [train] shard through cuda/shard_gpu.h): backend.h's interface. Built only with CUDA. */
#ifndef ALDIT_BACKEND_CUDA_H
#define ALDIT_BACKEND_CUDA_H

#include "backend/backend.h"

/* backend_plan_fn of the GPU: selects this rank's GPU (node-local rank mod the GPUs visible) and plans its memory
   as backend_cuda_create would, allocating nothing. The budget is [balance] mem_budget, or the largest whose GPU
   model (at the capacity the balancer can form under it) fits the free memory per rank less [balance] mem_margin,
   the state in [train] shard's mode (model_layout_state_bytes; auto: the least sharding whose state leaves room
   for the largest sample alone; a sharded mode over more than one rank needs NCCL) and a reserve for the CUDA
   libraries and NCCL's buffers. The plan's memory model is the GPU model's own activation bytes per sample, token
   and text token for [train] recompute. Returns 0, or ALDIT_EXIT_USAGE after rank 0 printed why it does not fit. */
int backend_cuda_plan(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                      int64_t n_samples, backend_plan *plan);
/* backend_cuda_plan for GPUs this process does not have (aldit --check on a login node, device_resolve_check): each
   rank planned as the only rank of a GPU with balance.device_mem bytes free; nothing is measured, no GPU touched. */
int backend_cuda_plan_offline(const deck *config, const comm_info *info, const model *table, const balance_sample *samples,
                      int64_t n_samples, backend_plan *plan);

/* backend_create_fn of the GPU: the plan above, the gradient sum (NCCL when built with it: buckets of
   [train] allreduce_bucket bytes launched as the last micro-batch's backward finishes them, no host
   synchronisation), the GPU model at the plan's capacity and the AdamW moments. `net` gives the parameter table;
   its weights are not used. Its start-up calibration times packed micro-batches on the GPU. */
backend *backend_cuda_create(const deck *config, const comm_info *info, model *net, const balance_sample *samples,
                             int64_t n_samples);

/* The training state's device bytes a backend of backend_cuda_create allocated, by the state formula's parts
   (model_layout_state_bytes, which its plan's `state` holds): for tests that the two agree to the byte. */
layout_state_bytes backend_cuda_state_bytes(const backend *b);

#endif
