/* watchdog.h — the step deadline of the training loop ([run] step_timeout) over comm.h's step watch; the same watch
   per wait over the state's streams, the start-up and the run's end. */
#ifndef ALDIT_WATCHDOG_H
#define ALDIT_WATCHDOG_H

#include <stdint.h>

#include "deck/deck.h"

/* Seconds a step may take: [run] step_timeout, or with auto max(10 x predicted_step_s, 300); three times
   that for the first step of a run (start-up work: autotuning, first allocations, caches). */
double watchdog_timeout(const deck *config, double predicted_step_s, int first_step);

/* Collective in effect (every rank calls it at the step's start with the same timeout): watch the
   collectives of step `step` (1-based) until watchdog_step_end. Rank 0's deadline is `timeout` seconds
   from now; the other ranks' is later (2 x timeout + 30 s), so that rank 0, which can tell which ranks
   have not arrived, reports first; a stalled rank 0 is reported by the others. The step is also under a backstop: a
   thread of this process that, past the rank's deadline, its grace and a margin of max(10 s, timeout) seconds with
   the step still open, prints "aldit: error: rank R: step S ...: ... stuck outside a collective ..." and aborts the
   job (exit 1: comm_abort from that thread where the job has several ranks, _exit where one, with a SIGALRM 30 s later
   should that hang). It covers a main thread that never reaches a collective's wait, where the watch runs: stuck in
   a device, file-system or library call (seen with two ranks on one GPU: one stopped, the other's next cuBLASLt call
   spun in the driver), when no other rank reports it. */
void watchdog_step_begin(int rank, int64_t step, double timeout);
void watchdog_step_end(void);

/* Seconds a validation pass may take whose slowest rank is predicted to compute `predicted_pass_s` (all its levels
   and weight sets at training's cost): max(10 x that, the step deadline of watchdog_timeout: [run] step_timeout,
   or 300 s with auto). */
double watchdog_pass_timeout(const deck *config, double predicted_pass_s);

/* Collective in effect (every rank, the same `timeout`): watch the state-streaming collectives of a checkpoint's
   save or a resume's load (`what` names it, e.g. "checkpoint of step 12") until watchdog_state_end, with a
   deadline per collective (comm_watch_each): `timeout` seconds on rank 0; on the others, whose waits span rank
   0's file I/O for one tensor, 2 x timeout + 30 s and the answer time, as for a step. A stopped rank is named and
   the job aborted (exit 1) before the checkpoint is renamed into place: the previous one stays the newest.
   Under a backstop as the step's (its deadline per tensor: watchdog_progress moves it on), so that a rank stuck in a
   tensor's file I/O with none to report it (a one-rank job on a hung file system) still ends the job. */
void watchdog_state_begin(int rank, const char *what, double timeout);
/* A state stream's tensor done (state.c calls it after each): the backstop's deadline starts again. Nothing outside
   a state watch. */
void watchdog_progress(void);
void watchdog_state_end(void);

/* Collective in effect (every rank, the same `timeout`): the same per-wait watch over a phase of work outside the
   steps whose length is not bounded but each wait is (`what` names it: the start-up, from train_run's first
   collective to the first step, under the first step's deadline; the run's end, under the step's): "start-up (a
   deadline of 12 s for each wait, from [run] step_timeout): rank 1 (of 2) has not arrived ...". Ended by
   watchdog_phase_end. */
void watchdog_phase_begin(int rank, const char *what, double timeout);
void watchdog_phase_end(void);

/* The test hook ALDIT_TEST_STOP=RANK:POINT or RANK:save:STEP (environment): rank RANK stops itself (SIGSTOP, as a
   stopped or hung rank would sit) when it reaches `point` at step `step`, so that the watchdog's tests stall a rank
   at a chosen place whatever the machine's load (tests/train_watchdog.sh). The training loop's points: "start" (the
   device's start, in the start-up, after the initial state), "load" (before the first tensor of a resume's or an
   init's state stream), "save" (before the first tensor of a checkpoint's; with STEP, only the checkpoint of that
   step), "hang" (before a step's compute; with STEP, only that step's) and "hangsave" (where "save" stops): there the
   main thread blocks for good while the process's other threads run, as in a hung device or file-system call,
   instead of stopping. Unset or empty: nothing. Malformed, or a point not among these: fatal, naming it. */
void watchdog_test_stop(int rank, const char *point, int64_t step);

#endif
