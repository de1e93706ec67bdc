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

double watchdog_pass_timeout(const deck *config, double predicted_pass_s)
{
    const double step = watchdog_timeout(config, 0.0, 0);
    return 10.0 * predicted_pass_s > step ? 10.0 * predicted_pass_s : step;
}

/* Time for the ranks that wait in a collective to answer rank 0 (they answer within milliseconds). */
static double grace_of(double timeout) { return timeout / 4 < 1.0 ? 1.0 : timeout / 4 > 30.0 ? 30.0 : timeout / 4; }

/* Seconds from the start of a wait (or a step) to the deadline of `rank`: rank 0 first. */
static double deadline_of(int rank, double timeout)
{
    return rank == 0 ? timeout : 2.0 * timeout + grace_of(timeout) + 30.0;
}

void watchdog_step_begin(int rank, int64_t step, double timeout)
{
    char what[96];
    snprintf(what, sizeof what, "step %lld ([run] step_timeout = %g s)", (long long)step, timeout);
    comm_watch_begin(comm_time() + deadline_of(rank, timeout), grace_of(timeout), what);
}

void watchdog_step_end(void) { comm_watch_end(); }

void watchdog_state_begin(int rank, const char *what, double timeout)
{
    char text[160];
    snprintf(text, sizeof text, "%s (a deadline of %g s for each tensor, from [run] step_timeout)", what, timeout);
    comm_watch_each(deadline_of(rank, timeout), grace_of(timeout), text);
}

void watchdog_state_end(void) { comm_watch_end(); }
