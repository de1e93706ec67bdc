/* train_gpu.h — the CUDA side of a training run: GPU choice, memory budget and GPU-model capacity, device state (weights, gradients, AdamW moments) and a step's device work. Built only with CUDA. */
#ifndef ALDIT_TRAIN_GPU_H
#define ALDIT_TRAIN_GPU_H

#include <stdint.h>

#include "balance/balance.h"
#include "core/comm.h"
#include "balance/costmodel.h"
#include "deck/deck.h"
#include "model/model.h"
#include "model/optim.h"

/* How a rank's GPU memory is used. mem_budget and the capacity are the same on every rank. */
typedef struct {
    int device;                   /* GPU index of this rank: node-local rank mod the GPUs visible */
    char description[160];        /* gpu_describe() of that GPU */
    int ranks_per_gpu;            /* ranks of this node on that GPU (they share its memory evenly) */
    double free_bytes;            /* free device memory per rank when planned, smallest over ranks */
    double state_bytes;           /* fp32 master weights, bf16 copies, fp32 gradients, fp32 AdamW m and v */
    double reserve_bytes;         /* kept for cuBLASLt, lazily loaded kernels and NCCL's buffers */
    double mem_budget;            /* activation bytes per rank the balancer plans with (its cost model's bytes) */
    int budget_measured;          /* 1: derived from free memory less [balance] mem_margin; 0: [balance] mem_budget */
    /* Capacity of the GPU model: every micro-batch the balancer can form under mem_budget fits it. */
    int64_t max_tokens, max_text;
    int max_samples;
    double workspace_bytes;       /* the GPU model's activation workspace at that capacity ([train] recompute) */
    double attention_buffer_bytes; /* cuDNN attention's own buffer for the longest sample (0 without cuDNN) */
    int64_t cudnn_min_tokens;     /* self-attention of samples this long runs on cuDNN; 0: never (a run sets it) */
} gpu_plan;

/* Collective (--check): select this rank's GPU and plan its memory as train_gpu_create would (but
   before NCCL's buffers exist, and allocating nothing). `table` is a model or its parameter table;
   `samples` every sample of the store. `memory`, a cost model the caller initialised (cost_model_init),
   gets the memory model the plan uses: the GPU model's own activation bytes per sample, token and text
   token (see train_gpu_memory_model), for the caller's balancer. Returns 0, or ALDIT_EXIT_USAGE after
   rank 0 printed why the model or [balance] mem_budget does not fit the GPU. */
int train_gpu_plan(const deck *config, const comm_info *info, const model *table, cost_model *memory,
                   const balance_sample *samples, int64_t n_samples, gpu_plan *plan);

typedef struct train_gpu train_gpu;

/* Collective: select the GPU, set up the gradient all-reduce (NCCL when built with it), plan the memory
   (the plan above; NCCL's connection buffers, made at train_gpu_start, come out of its reserve) and
   allocate the GPU model at the plan's capacity plus the AdamW moments. Weights and moments are zero
   until train_gpu_upload or train_gpu_start. Returns NULL, after rank 0 printed why, when the model or
   the deck's budget does not fit (bad input: exit status 2). */
train_gpu *train_gpu_create(const deck *config, const comm_info *info, const model *host, const balance_sample *samples,
                            int64_t n_samples);
void train_gpu_free(train_gpu *gpu);
const gpu_plan *train_gpu_get_plan(const train_gpu *gpu);
/* The memory model the plan used: the balancer must plan with the same bytes. Its activation bytes per
   sample, token and text token are the GPU model's own for [train] recompute (the slopes of
   gpu_model_workspace_bytes_with_recompute at 1 Mi tokens, 1024 samples and 64 Ki text rows; the deck's
   analytic model is about 4% short of the GPU layout for Wan-1.3B). */
const cost_model *train_gpu_memory_model(const train_gpu *gpu);
/* What sums the gradients: gradsync_method(). */
const char *train_gpu_sync_method(const train_gpu *gpu);

/* Host fp32 arrays of n_weights values <-> the device's master weights (and bf16 copies) and moments,
   synchronously: for the initial state and for checkpoints (the same arrays the CPU path keeps). */
void train_gpu_upload(train_gpu *gpu, const float *weights, const float *adam_m, const float *adam_v);
/* Collective, once before the first step: train_gpu_upload of the initial state, then the gradient
   all-reduce connects the ranks (gradsync_connect). The trainer calls it while the first step's samples
   are being read, so that the read overlaps both. */
void train_gpu_start(train_gpu *gpu, const float *weights, const float *adam_m, const float *adam_v);
void train_gpu_download(const train_gpu *gpu, float *weights, float *adam_m, float *adam_v);

/* One step: train_gpu_begin_step, train_gpu_micro_batch for each of the rank's micro-batches, then
   train_gpu_allreduce and train_gpu_finish_step on every rank. */
void train_gpu_begin_step(train_gpu *gpu);
/* Forward + backward of one micro-batch (host memory, as model_forward_backward), gradients scaled by
   grad_scale ADDED on the device; returns the sum of its per-sample losses (waits for the GPU). A
   micro-batch beyond the planned capacity is a fatal error naming both sizes. `last`: the rank's last
   micro-batch of the step, whose backward launches the gradient all-reduce in buckets of
   [train] allreduce_bucket bytes as its blocks finish (gradsync.h), on the NCCL stream. */
double train_gpu_micro_batch(train_gpu *gpu, const model_batch *batch, float grad_scale, int last);
/* Collective: the rest of the gradient sum over ranks (queued; no host synchronisation with NCCL). A rank
   without micro-batches this step makes the same bucket calls as the others here. */
void train_gpu_allreduce(train_gpu *gpu);

typedef struct {
    double grad_norm;             /* global norm of the summed gradients before clipping */
    double comm_device_s;         /* seconds the NCCL all-reduce ran past the backward (0 without NCCL) */
    double optimizer_s;           /* seconds of norm, clip and AdamW on the GPU */
    double mem_peak;              /* activation workspace bytes of the step's largest micro-batch (0: none) */
} gpu_step_result;

/* Queue the global norm, the clip factor ([train] grad_clip) and, when `update` is 1, AdamW over every
   parameter (weight decay as optim_param_decays; a non-finite norm makes AdamW leave everything as it
   is), which also refreshes the bf16 copies; then wait for the step's device work once. */
void train_gpu_finish_step(train_gpu *gpu, const adamw_step *hyper, int update, gpu_step_result *result);

/* One sample shape to time: latent frames, height, width (before patchify) and text tokens. */
typedef struct { int32_t frames, height, width, text_len; } gpu_shape;

/* Start-up calibration (DESIGN.md §3). The copies of each shape one timed micro-batch holds: the most
   copies, at most max_copies, that the GPU model's capacity takes and whose memory model fits [balance]
   mem_fill of the budget (0.9 where mem_fill is 0), at least 1 (cost_model_calibration_copies); derived
   from the plan, so the same on every rank. 0 for a shape beyond the capacity even alone. max_copies = 1
   times one sample per call. */
void train_gpu_calibration_copies(const train_gpu *gpu, const gpu_shape *shapes, int n_shapes, int max_copies,
                                  int *copies);
/* Collective: the seconds of one forward + backward of a micro-batch holding copies[i] copies of each
   shape on this rank's GPU (after a warm-up call, which also builds any attention plans for that length),
   averaged over the ranks, into seconds[i]; -1 where copies[i] is 0. Leaves the gradients dirty
   (train_gpu_begin_step clears them) and the weights as they were. Returns the seconds spent. */
double train_gpu_time_shapes(train_gpu *gpu, int n_ranks, const gpu_shape *shapes, int n_shapes, const int *copies,
                             double *seconds);

#endif
