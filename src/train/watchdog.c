/* watchdog.c — the step deadline: how long a step may take, and the comm watch over its collectives. */
#include "train/watchdog.h"
#include "core/comm.h"

#include <stdio.h>

double watchdog_timeout(const deck *config, double predicted_step_s, int first_step)
{
    double timeout = config->run.step_timeout;
    if (timeout <= 0) timeout = 10.0 * predicted_step_s > 300.0 ? 10.0 * predicted_step_s : 300.0;
    return first_step ? 3.0 * timeout : timeout;
}

void watchdog_step_begin(int rank, int64_t step, double timeout)
{
    /* time for the ranks that wait in a collective to answer rank 0 (they answer within milliseconds) */
    double grace = timeout / 4 < 1.0 ? 1.0 : timeout / 4 > 30.0 ? 30.0 : timeout / 4;
    double deadline = comm_time() + (rank == 0 ? timeout : 2.0 * timeout + grace + 30.0);
    char what[96];
    snprintf(what, sizeof what, "step %lld ([run] step_timeout = %g s)", (long long)step, timeout);
    comm_watch_begin(deadline, grace, what);
}

void watchdog_step_end(void) { comm_watch_end(); }
