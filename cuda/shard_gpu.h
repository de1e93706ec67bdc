/* shard_gpu.h — the sharded training state of the CUDA backend ([train] shard = optimizer | gradients | full, ZeRO-1/2/3): its device buffers, the parameters it hands the GPU model, and a step's reduce-scatters, all-gathers, norm and AdamW on the held values. */
#ifndef ALDIT_SHARD_GPU_H
#define ALDIT_SHARD_GPU_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/shard.h"
#include "cuda/gpu.h"
#include "cuda/gradsync.h"
#include "cuda/model_gpu.h"
#include "model/model.h"
#include "model/optim.h"

/* The cut is shard.h's units (shard_layout_units): the embeddings, each block, the head; unit u of len_u values in
   pieces of c_u = ceil(len_u / R), rank r holding piece r. This rank's pieces lie back to back (padded to c_u each,
   s = sum c_u values) in the held arrays: fp32 master weights, both AdamW moments and (gradients, full) the step's
   summed gradient. What the model computes with, by mode:
   - optimizer: bf16 weights of every unit whole (each unit padded to R c_u, so that its all-gather is one in-place
     call), fp32 gradients whole (n, the flat order: the bucketed all-reduce of gradsync sums them as in mode none);
     AdamW updates the held values, whose bf16 copies are then all-gathered unit by unit.
   - gradients: bf16 weights as optimizer; the head's fp32 gradients whole (padded); a block's backward writes into
     one of two staging slots (max(R c_b, R c_e) values each, block l in slot l mod 2) which, as the block's
     backward finishes, is reduce-scattered (sum) on the NCCL stream and this rank's piece added into the summed
     gradient; the slot is reused (zeroed on the compute stream) only after an event says its reduce-scatter is done.
     The embeddings' backward, which follows block 0's, writes into slot 1 the same way (block 1's reduce-scatter is
     done or queued before it by then; the compute stream waits for its event); the embeddings' and the head's are
     reduce-scattered as a micro-batch's backward ends. Every micro-batch does this; a rank with fewer micro-batches
     than the step's rounds replays the rest with zeros (gpu_model_grads_ready_all).
   - full: as gradients, and only the embeddings' and head's bf16 weights stay whole: a block's are all-gathered into
     one of two bf16 slots (R c_b each) when the model asks for them (block_weights), from this rank's piece written
     from its fp32 master into the slot's own segment; the block it will ask for next is gathered into the other
     slot at once on the NCCL stream (a prefetch), after an event recorded on the compute stream says the work
     reading that slot's previous block is done. The time path's fp32 weights are not kept whole: when the model asks
     for them (time_weights: every forward's, and each backward's after block 0's), the embeddings' fp32 masters are
     all-gathered (R c_e values, in place from this rank's piece) into staging slot 0 on the NCCL stream, after an
     event on the compute stream (the slot's earlier uses) and behind the slot's reduce-scatters already on the NCCL
     stream; the compute stream waits for an event after it. The values are the masters themselves, so the numerics
     are none's. The backward's gather is queued as the embeddings' backward begins; it stays valid until a block's
     gradients are next staged in slot 0, so the next micro-batch's forward reuses it; finish_step queues a fresh one
     for the next step. Cost: one all-gather of 4 R c_e bytes per micro-batch and one per step, against the
     micro-batch's 2 L - 1 block gathers of 2 R c_b bytes each (14B at 8 ranks: 0.87 GiB against 51 GiB), and the
     time path's backward waits for block 0's reduce-scatter and that gather. No host synchronisation inside a step.
   The other fp32 values the model reads in fp32 (head.modulation, each block's modulation and norm3, and but in
   full the time path) are kept whole in one fp32 array (refreshed from the held masters by a zero-padded
   all-reduce). Device bytes: model_layout_state_bytes (model/layout.h) for the mode, exactly (shard_gpu_bytes). */
typedef struct shard_gpu shard_gpu;

/* A sharded state (layout->mode not none, shard_layout_units of the host's layout) for `net`, created with
   gpu_model_create_without_params; sets net's parameters. `sync` made with shard_collectives (its NCCL stream is the
   communication stream; without NCCL, one rank: a stream of its own and no collectives). `compute` is the stream the
   model runs on. Masters and moments start at zero. `ema`: the master's EMA ([train] ema_decay) is kept as well, held
   as the master is. */
shard_gpu *shard_gpu_create(const model *host, const shard_layout *layout, gpu_model *net, gradsync *sync,
                            cudaStream_t compute, int ema);
void shard_gpu_free(shard_gpu *sh);
/* `net` (made again, as backend_cuda_create made the one it replaces) takes the parameters. */
void shard_gpu_set_model(shard_gpu *sh, gpu_model *net);

/* The device bytes it allocated, by the state formula's parts (model_layout_state_bytes's). */
layout_state_bytes shard_gpu_bytes(const shard_gpu *sh);

/* The device fp32 values of `group` (weights = master, moments) for the held values [first, first + count) (inside
   one unit, all held by this rank: fatal otherwise). BACKEND_EMA: fatal where it is not kept. */
float *shard_gpu_range(const shard_gpu *sh, backend_group group, int64_t first, int64_t count);

/* Collective, after the masters are set: the bf16 copies and fp32 reads made from them (gathered), the EMA from them
   unless ema_set (set_range gave it); waits. */
void shard_gpu_start(shard_gpu *sh, int ema_set);

/* A step (backend.h's order; every function on every rank):
   begin_step: the step's gradients start at zero; `rounds` micro-batches on the rank with the most;
   before_micro_batch: before each micro-batch's forward_backward (gradients, full: installs the reduce-scatter
     hook, the embeddings' and head's gradients zeroed once their last reduce-scatter is done); optimizer: nothing;
   sum_gradients: gradients, full: the missing rounds replayed, then the compute stream waits for the sums;
   finish_step: the global norm from the held gradients (all-reduced), clip, AdamW on the held values when `update`
     (decay per parameter as optim_param_decays) and the EMA's update (ema_decay, where kept), then the bf16 copies and
     fp32 reads refreshed and gathered. All is
     queued on the compute stream (norm into *grad_norm, a device double); the caller synchronises it. */
void shard_gpu_begin_step(shard_gpu *sh, int rounds);
void shard_gpu_before_micro_batch(shard_gpu *sh);
void shard_gpu_sum_gradients(shard_gpu *sh);
void shard_gpu_finish_step(shard_gpu *sh, const adamw_step *hyper, double weight_decay, double grad_clip, int update,
                           double ema_decay, double *sumsq, double *grad_norm, float *clip_scale,
                           void *sumsq_workspace);

/* Collective, between steps, with the EMA kept (fatal otherwise): the held EMA and master arrays swap places and the
   bf16 copies and fp32 reads the model computes with are published from the array now in the master's place (full:
   its blocks are gathered from it). A second call swaps back and publishes the master again: every copy as before,
   bit for bit. Queued on compute. For a validation with the EMA weights (backend.h's use_ema). */
void shard_gpu_swap_ema(shard_gpu *sh);

/* optimizer: the whole fp32 gradient array (n values, flat order) the bucketed all-reduce sums; NULL elsewhere. */
float *shard_gpu_whole_grads(const shard_gpu *sh);

#endif
