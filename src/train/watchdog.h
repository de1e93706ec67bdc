/* watchdog.h — the step deadline of the training loop ([run] step_timeout) over comm.h's step watch. */
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
   have not arrived, reports first; a stalled rank 0 is reported by the others. */
void watchdog_step_begin(int rank, int64_t step, double timeout);
void watchdog_step_end(void);

#endif
