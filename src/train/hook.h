/* hook.h — [checkpoint] hook: a shell command rank 0 starts after each checkpoint, detached, so that a sampler
   (tools/sample.py) or any other job sees every checkpoint without ever stopping or slowing the training. */
#ifndef ALDIT_HOOK_H
#define ALDIT_HOOK_H

#include <stdint.h>

#include "deck/deck.h"

typedef struct checkpoint_hook checkpoint_hook;

/* Rank 0: the hook of the deck, or NULL when [checkpoint] hook is empty. */
checkpoint_hook *hook_create(const deck *config);

/* Rank 0, after the checkpoint of `step` was written at `path`: notes how an earlier command ended (a warning
   when it failed), then starts `/bin/sh -c HOOK` in a session of its own, stdin /dev/null, stdout and stderr
   appended to [run] dir/hooks.log, with ALDIT_CHECKPOINT (the path), ALDIT_STEP and ALDIT_RUN_DIR in its
   environment; while the last command still runs, this checkpoint's is not started (a note says so). Never
   waits for a command; a command that cannot be started is a warning. NULL: nothing. */
void hook_after_checkpoint(checkpoint_hook *h, const char *path, int64_t step);

/* Rank 0, at the end of the run: notes how the last command ended, or that it goes on running after aldit
   (it is not waited for); frees the hook. NULL: nothing. */
void hook_close(checkpoint_hook *h);

#endif
