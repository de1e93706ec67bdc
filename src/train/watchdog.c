/* watchdog.c — the step deadline: how long a step may take, the comm watch over its collectives (and over the state's
   streams, the start-up and the run's end), and the test hook that stops a rank at a named place. */
#include "train/watchdog.h"
#include "core/check.h"
#include "core/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void watchdog_phase_begin(int rank, const char *what, double timeout)
{
    char text[160];
    snprintf(text, sizeof text, "%s (a deadline of %g s for each wait, from [run] step_timeout)", what, timeout);
    comm_watch_each(deadline_of(rank, timeout), grace_of(timeout), text);
}

void watchdog_phase_end(void) { comm_watch_end(); }

void watchdog_test_stop(int rank, const char *point, int64_t step)
{
    const char *hook = getenv("ALDIT_TEST_STOP");
    if (!hook || !hook[0]) return;
    int stop_rank = -1, used = 0;
    char where[8] = "";
    long long stop_step = -1;
    const int fields = sscanf(hook, "%d:%7[a-z]%n:%lld%n", &stop_rank, where, &used, &stop_step, &used);
    const int known = !strcmp(where, "start") || !strcmp(where, "load") || !strcmp(where, "save");
    ALDIT_CHECK(fields >= 2 && hook[used] == '\0' && stop_rank >= 0 && known && (fields == 2 || !strcmp(where, "save")),
                "ALDIT_TEST_STOP=%s (a test hook: RANK:start, RANK:load, RANK:save or RANK:save:STEP); unset it to "
                "train without it", hook);
    if (rank != stop_rank || strcmp(where, point) != 0 || (fields == 3 && stop_step != step)) return;
    fflush(stdout);
    fflush(stderr);
    raise(SIGSTOP);
}
