/* hook.h — [checkpoint] on_save: a command that rank 0 starts after each checkpoint, detached from the run (a sampler, a copy to another file system), which never stops or slows training. */
#ifndef ALDIT_HOOK_H
#define ALDIT_HOOK_H

#include <stdint.h>

typedef struct checkpoint_hook checkpoint_hook;

/* Rank 0: a hook running `command` (through /bin/sh -c) after each checkpoint, its output appended to
   RUN_DIR/on_save.log; NULL when command is empty. */
checkpoint_hook *hook_create(const char *command, const char *run_dir);

/* Rank 0, after the checkpoint `path` of step `step` was written: reports how the command started for an earlier
   checkpoint ended, if it has; then starts the command for this one, with ALDIT_CHECKPOINT (the file), ALDIT_STEP and
   ALDIT_RUN_DIR in its environment, in a session of its own, and returns at once. Where the earlier command is still
   running, this checkpoint's is not started (a note says so): at most one runs at a time, so a slow command never piles
   up. A command that cannot be started is a warning. Never blocks on the command, never ends the run. */
void hook_after_checkpoint(checkpoint_hook *hook, const char *path, int64_t step);

/* Rank 0, at the end of the run: reports the last command's end or, when it is still running, that it goes on after
   aldit exits (its pid). NULL is fine. */
void hook_free(checkpoint_hook *hook);

#endif
