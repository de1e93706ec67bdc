/* backend.h — what the training loop asks of a device, behind one interface: the memory plan, the training state, a step's forward/backward, the gradient sum over ranks, clip + AdamW, and start-up timings. */
#ifndef ALDIT_BACKEND_H
#define ALDIT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "balance/balance.h"
#include "backend/shard.h"
#include "balance/costmodel.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "model/model.h"
#include "model/optim.h"

/* A backend's memory plan, the same on every rank: what the balancer plans each step with. */
typedef struct {
    double mem_budget;     /* activation bytes per rank */
    int budget_measured;   /* 1: derived from the free memory less [balance] mem_margin; 0: [balance] mem_budget */
    int fills_memory;      /* 1: [balance] mem_fill applies (a GPU's step is limited by its memory); 0: it does not */
    deck_shard shard;      /* [train] shard resolved (auto: the least sharding that fits) */
    shard_bytes state;     /* the training state's bytes per rank in that mode */
    /* The balancer's memory model (bytes per sample, token and text token): the backend's own, which the
       balancer must plan with; has_memory_model 0: the deck's analytic model. */
    int has_memory_model;
    cost_model memory_model;
    /* A device that runs the self-attention of a micro-batch's last sample on whole tiles of last_sample_tile rows,
       faster for a length not a multiple of it, from last_sample_min_tokens tokens on (the CUDA backend's cuDNN
       attention): the trainer puts the sample that gains most last (rank_assignment_order_whole_tiles). 0: none. */
    int64_t last_sample_tile, last_sample_min_tokens;
    /* The summary's device and memory lines (rank 0 prints them; a run adds what only a run knows). */
    char device_text[1024];
    char memory_text[1024];
} backend_plan;

/* What a step's optimizer part reports. */
typedef struct {
    double grad_norm;      /* global norm of the summed gradients before clipping; not finite: nothing was updated */
    double comm_device_s;  /* seconds the device's gradient sum ran past the host (0 where the host did the sum) */
    double optimizer_s;    /* seconds of norm, clip and AdamW */
    double mem_peak;       /* activation bytes of the step's largest micro-batch (CPU: growth of the peak resident set) */
} backend_step_result;

/* One sample shape to time at start-up: latent frames, height, width (before patchify) and text tokens. */
typedef struct { int32_t frames, height, width, text_len; } backend_shape;

typedef struct backend backend;

/* The arrays of the training state, each n_weights fp32 values in the layout's order (a rank holds the values its
   shard layout says). */
typedef enum {
    BACKEND_WEIGHTS, /* the fp32 master weights */
    BACKEND_ADAM_M,  /* AdamW's first moment */
    BACKEND_ADAM_V,  /* AdamW's second moment */
    BACKEND_EMA,     /* an exponential moving average of the weights ([train] ema_decay; absent where it is 0) */
    BACKEND_N_GROUPS
} backend_group;

/* A start-up timing's progress: called on every rank after each shape of a time_shapes call is timed, with its
   position in the call's shapes and this rank's seconds (-1: not timed). */
typedef void (*backend_timing_progress_fn)(void *context, int shape, double seconds);

/* The operations of one device. Every function marked collective is called by every rank in the same order. */
typedef struct {
    const char *name; /* "cpu", "cuda" */
    int uses_host_threads; /* 1: the model runs on the rank's host threads (the data reader then keeps to one) */
    void (*free)(backend *b);
    /* The plan this backend was created with (budget, memory model, summary lines). */
    const backend_plan *(*plan)(const backend *b);
    /* Which values of each state array this rank holds (shard.h), for the whole run. */
    const shard_layout *(*layout)(const backend *b);
    /* Before start, not collective: values [first, first + count) of `group`, which this rank holds (inside one unit
       of its layout, e.g. one parameter tensor or the part of it this rank holds), become the backend's. Every held
       value of BACKEND_WEIGHTS must be set; a moment never set is zero (a fresh start). */
    void (*set_range)(backend *b, backend_group group, int64_t first, int64_t count, const float *values);
    /* Collective, once after the set_range calls and before the first step: the state is complete (a GPU's bf16
       copies made; weights a mode keeps whole gathered from the holders), and the gradient sum connects the ranks. */
    void (*start)(backend *b);
    /* Between steps, not collective: waits for queued work, then copies values [first, first + count) of `group`
       (held by this rank, as for set_range) to host memory; for checkpoints, which src/train/state.c gathers tensor by
       tensor to rank 0. */
    void (*get_range)(const backend *b, backend_group group, int64_t first, int64_t count, float *values);
    /* A step: begin_step, micro_batch for each of the rank's micro-batches (`last` on its last one), then
       sum_gradients and finish_step on every rank (a rank without micro-batches calls those two as well).
       `rounds`: the most micro-batches any rank has in this step (rank_assignment.max_micro), so that a backend
       whose gradient sum runs per micro-batch makes as many collective calls on every rank (a rank with fewer makes
       the rest, with nothing to add, in sum_gradients). */
    void (*begin_step)(backend *b, int rounds);
    /* Forward + backward of one micro-batch, gradients scaled by grad_scale added to the step's; returns the
       sum of its per-sample losses. */
    double (*micro_batch)(backend *b, const model_batch *batch, float grad_scale, int last);
    /* Validation, forward only (no gradients, no update): begin_eval (collective; NULL where there is nothing to
       do) makes the weights every rank's forward needs whole (a fully sharded state's); then eval_batch calls,
       each returning the sum of its micro-batch's per-sample losses (each into sample_loss, which may be NULL).
       Every rank makes the same number of eval_batch calls (a shard = full GPU state gathers each block's weights
       collectively in every forward): a batch of no samples (n_samples 0, no arrays needed) computes nothing,
       returns 0 and makes the collective calls a forward makes. A step's begin_step comes after them as usual. */
    void (*begin_eval)(backend *b);
    double (*eval_batch)(backend *b, const model_batch *batch, double *sample_loss);
    /* Collective, between begin_eval and the next begin_step, only where [train] ema_decay > 0: on = 1 makes the
       following eval_batch calls compute with the EMA in place of the master weights (held as the master is: a
       sharded EMA is gathered or published as the master would be); on = 0 puts the training weights back, bit for
       bit (the master and every copy made from it are as before on = 1). */
    void (*use_ema)(backend *b, int on);
    /* Collective: the step's gradients summed over ranks (a device backend may only queue it). */
    void (*sum_gradients)(backend *b);
    /* The global norm, the clip factor ([train] grad_clip) and, when `update` is 1 and the norm is finite,
       AdamW over every parameter (decay as optim_param_decays); waits for the step's work. */
    void (*finish_step)(backend *b, const adamw_step *hyper, int update, backend_step_result *result);
    /* Start-up calibration, NULL where the backend times nothing (the deck's cost model then stands):
       calibration_copies gives the copies of each shape one timed micro-batch holds (0: beyond the capacity);
       time_shapes (collective, before set_range and start) the seconds of one forward + backward of each on a
       model of `layers` blocks, averaged over the ranks (-1 where copies is 0), calling progress (may be NULL)
       after each, and returns the seconds spent. layers is 1 to [model] num_layers: fewer than the model's builds,
       for these micro-batches, a model of that many blocks with the same dims, embeddings, head, recomputation and
       attention in the memory the backend's own model frees meanwhile (that model is back, its state not set yet,
       on return). With warm_up 1 each micro-batch is timed after a warm-up call of it, which builds its plans and
       caches; these stay with the backend at any depth (the later models and training keep them), so a later
       call of micro-batches an earlier one ran may pass 0. A micro-batch is timed again while
       calibration_repeat_due (balance/calibration.h) says so under repeat_seconds (0: once), the least timing
       counting. The timed model holds random weights of the family's init and the micro-batches random data (a GPU
       runs zeros faster than training's values); the gradients are dirty after it (begin_step clears them). */
    void (*calibration_copies)(const backend *b, const backend_shape *shapes, int n_shapes, int max_copies, int *copies);
    double (*time_shapes)(backend *b, int layers, const backend_shape *shapes, int n_shapes, const int *copies,
                          double *seconds, int warm_up, double repeat_seconds, backend_timing_progress_fn progress,
                          void *context);
    /* NULL where the device has no profiler to drive: on = 1 starts the device profiler's capture after the queued work
       (the steps [log] profile_from names), 0 stops it after the queued work. */
    void (*profile)(backend *b, int on);
    /* NULL where the device builds nothing per shape: before the first step, what its calls would build the first time
       they meet these samples' shapes (tokens, text_len: the caption rows the model takes; CUDA: cuDNN attention
       plans, as gpu_model_prepare says), so that no step pays it. Not collective. Returns how many were built. */
    int64_t (*prepare)(backend *b, const balance_sample *samples, int64_t n_samples);
    /* NULL where the device does none: the one-time set-up its calls have done so far, cumulative since it was made
       (CUDA: cuDNN execution plans built for shapes met the first time, and their autotuning): how many, and the host
       seconds they took. A step that meets new shapes spends them inside its compute. */
    void (*setup_stats)(const backend *b, int64_t *count, double *seconds);
    /* The key under which start-up timings of this device are cached in the run folder (calibration.h). */
    const char *(*device_key)(const backend *b, int *ranks_per_device);
    /* NULL where the backend keeps no FP8 state: the delayed-scaling state of [train] precision = fp8 (amax histories
       and scales, cuda/fp8.h) as an opaque blob, for checkpoints; between steps, not collective. fp8_state_bytes: its
       size (0: none in this run); get_fp8_state waits for the queued work and copies it; set_fp8_state restores one
       after set_range (1 and why on a mismatch: another model, history length or margin). The state is the same on every
       rank after the first step (the amaxes are max-reduced over the ranks before each update; the first step's
       casts scale by their own amax): a checkpoint holds rank 0's and a resume gives it to every rank. */
    size_t (*fp8_state_bytes)(const backend *b);
    void (*get_fp8_state)(const backend *b, void *blob);
    int (*set_fp8_state)(backend *b, const void *blob, size_t bytes, char *why, size_t why_size);
} backend_ops;

struct backend {
    const backend_ops *ops;
    void *state; /* the implementation's */
};

/* The memory plan a backend derives from the deck, the model's parameter table and the store's samples
   (every sample, as the balancer sees them). Collective. Returns 0, or ALDIT_EXIT_USAGE after rank 0 printed why
   the model or [balance] mem_budget does not fit. */
typedef int (*backend_plan_fn)(const deck *config, const comm_info *info, const model *table,
                               const balance_sample *samples, int64_t n_samples, backend_plan *plan);

/* Collective: a backend for this rank computing with `net` (the trainer's model: its parameter table and, on
   the CPU, its weights), planned as backend_plan_fn says. NULL after rank 0 printed why the plan fails. */
typedef backend *(*backend_create_fn)(const deck *config, const comm_info *info, model *net,
                                      const balance_sample *samples, int64_t n_samples);

#endif
