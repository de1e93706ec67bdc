/* eval.h — validation during training ([eval]): a held-out store's loss at fixed noise levels and fixed noise,
   forward only, its samples balanced over the ranks as training's are. */
#ifndef ALDIT_EVAL_H
#define ALDIT_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "balance/balance.h"
#include "deck/deck.h"
#include "io/store.h"
#include "train/prefetch.h"

/* Domain tag mixed into [run] seed for the validation noise, so that it shares no stream with training's. */
#define EVAL_NOISE_TAG 0x76616C6E6F697365ull /* "valnoise" */

typedef struct evaluator evaluator;

/* Collective. NULL when [eval] store is empty or [eval] every is 0. Otherwise opens the store on every rank
   (a missing or unreadable store: rank 0 names it and [eval] store, every rank exits with status 2) and takes
   its first [eval] samples samples (all of them for 0; more than the store holds: the same exit). Whether
   the samples fit the model is the caller's check (eval_store). */
evaluator *eval_open(const deck *config);
void eval_close(evaluator *e);

const store *eval_store(const evaluator *e);
/* The validation samples as the balancer sees them: ids 0 .. n-1 of the store, tokens after patchify and the
   text rows the model sees ([model] text_padding). For the backend's plan, whose capacity must hold the
   micro-batches of both stores. */
const balance_sample *eval_samples(const evaluator *e, int64_t *n_samples);

/* The noise of validation sample `id` is prefetch.h's draw with these parameters at epoch 0: keyed by [run]
   seed and the sample id only, the same at every step, in every run with that seed, on any rank count. */
prefetch_noise eval_noise(const deck *config, int threads);

/* Collective, once before the first pass: rank 0 cuts the samples into micro-batches with the training balancer's
   code as for a run of one rank (the deck's strategy, the backend's memory budget and memory model, and the
   start-up timings when n_calibration > 0; one epoch of its steps), so that every sample is computed in the same
   micro-batch, hence to the bit the same, on any rank count; then spreads the micro-batches over the ranks by
   their predicted cost (longest first, each to the least loaded rank). Every rank receives its share and a
   reader whose noise is drawn on noise_threads OpenMP threads. Returns 0, or ALDIT_EXIT_USAGE after rank 0
   printed why (a sample that alone exceeds the memory budget, with [balance] oversize = error). */
int eval_plan(evaluator *e, const backend_plan *memory, int n_ranks, int noise_threads, int n_calibration,
              const cost_features *calibration_features, const double *calibration_seconds);

/* The summary's line ("  eval       PATH: ..."), after eval_plan. */
void eval_describe(const evaluator *e, char *text, size_t text_size);

/* Whether a pass is due after `step` (1-based): every [eval] every steps, and after the run's last step
   (last = 1). The same answer on every rank. */
int eval_due(const evaluator *e, int64_t step, int last);

typedef struct {
    double loss;                        /* mean over the evaluated samples and every noise level; NaN for none */
    double sigma_loss[DECK_LIST_MAX];   /* mean over the evaluated samples at each noise level */
    int n_sigmas;
    int64_t samples;                    /* samples evaluated (each at every level): those read without error */
    double seconds;                     /* wall seconds of the pass (both passes with the EMA), the slowest rank's */
    /* [train] ema_decay > 0: the same samples, levels and noise through the EMA weights (has_ema 1) */
    int has_ema;
    double ema_loss, ema_sigma_loss[DECK_LIST_MAX];
    int64_t ema_samples;                /* as samples, for the EMA's pass (the store is read again) */
} eval_result;

/* Collective: one pass with the backend's weights as they are and, where [train] ema_decay > 0, a second one
   with its EMA (use_ema; the training weights are back, bit for bit, on return). Call it with no other HDF5
   read in flight (drain the training reader first: the library is not thread-safe). Each rank reads its
   micro-batches (the next while the current one computes, with [data] prefetch), runs the backend's forward at
   every noise level of [eval] sigmas (begin_eval, then eval_batch), and one reduction gives the means. Every
   rank makes as many eval_batch calls as the rank with the most micro-batches: the missing ones (and a
   micro-batch none of whose samples could be read) are empty batches, which make the collectives of a forward.
   A sample that cannot be read is left out of this pass with a warning naming it and the store
   (result->samples says how many were evaluated). The pass runs under the step watch (comm.h) with the deadline
   of watchdog_pass_timeout for its predicted seconds (every level and set of weights): 10 x those, at least the
   step deadline ([run] step_timeout, or 300 s with auto). `step` names the pass in messages. */
void eval_run(evaluator *e, backend *b, int64_t step, eval_result *result);

#endif
