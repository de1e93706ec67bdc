/* train.h — the training run on every rank, the --check plan and the stop signals. */
#ifndef ALDIT_TRAIN_H
#define ALDIT_TRAIN_H

#include "balance/balance.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "io/store.h"

/* Collective: train as the deck says (resuming from the newest checkpoint when [checkpoint] resume is on)
   until [run] steps / epochs are done or SIGUSR1/SIGTERM asks to stop; the last state is checkpointed.
   Returns the process exit status (0 done, 1 runtime error such as a non-finite loss); bad input (store,
   checkpoint, init weights) ends the job with status 2. */
int train_run(const deck *config, const comm_info *info);

/* Collective (--check): open the store, check that it fits the model, print the resolved deck on stdout and the
   plan (samples, tokens, steps per epoch predicted by the balancer, memory budget) on stderr, on rank 0. Returns 0,
   or the exit status of bad input. */
int train_check(const deck *config, const comm_info *info);

/* Whether every sample of `data` fits the deck's model: latent channels = out_dim, text_dim, (hunyuanvideo15, a store
   with caption sources) text_2_dim and image_dim, patch multiples, text_len. 0 when it does; else 1 with the first
   problem, naming the sample, in `problem`. */
int train_store_fits(const store *data, const deck *config, char *problem, size_t problem_size);

/* Every sample of `data` as the balancer and the backends plan with it (training, --check and aldit-sim alike):
   its tokens after patching and the text rows the model sees (model.text_len with [model] text_padding = wan, else
   the stored count; hunyuanvideo15 with caption sources: the joint text, Qwen + ByT5 + SigLIP rows, which an
   image-to-video draw takes whole and a text-to-video one less the SigLIP rows). Free with free(). */
balance_sample *train_balance_samples(const store *data, const deck *config);

/* SIGUSR1 and SIGTERM set a flag that the loop reads at the next step boundary (all ranks agree there). */
void train_install_signal_handlers(void);

#endif
