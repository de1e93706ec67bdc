/* watchdog.c — the step deadline: how long a step may take, the comm watch over its collectives (and over the state's
   streams, the start-up and the run's end), and the test hook that stops a rank at a named place. */
#include "train/watchdog.h"
#include "core/check.h"
#include "core/comm.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* ---- the backstop (watchdog.h): a thread that ends the job when the main thread cannot report ---------------- */
static struct {
    pthread_mutex_t lock;
    int started;
    double ends;   /* CLOCK_MONOTONIC seconds at which the armed watch is past its backstop; 0: disarmed */
    double began;  /* when it was armed (or, per item, last made progress) */
    double period; /* seconds from `began` to `ends` */
    int per_item;  /* a state stream's: watchdog_progress moves it on */
    int rank, n_ranks;
    char what[160];    /* as the watch's own text */
} backstop = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double monotonic_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* Seconds from a step's start to its backstop on `rank`: the rank's own deadline, the grace of its report, and a
   margin (max(10 s, timeout)) for the report and the abort, so that a rank whose main thread reaches a wait reports
   through comm.h first. */
static double backstop_of(int rank, double timeout)
{
    return deadline_of(rank, timeout) + grace_of(timeout) + (timeout > 10.0 ? timeout : 10.0);
}

static void *backstop_thread(void *unused)
{
    (void)unused;
    for (;;) {
        const struct timespec pause = {.tv_sec = 0, .tv_nsec = 250000000};
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&backstop.lock);
        const double now = monotonic_s();
        const int past = backstop.ends > 0 && now >= backstop.ends;
        if (past) {
            fprintf(stderr, "aldit: error: rank %d: %s: %s %.0f s, past its deadline and the time to report it, and "
                    "this rank's main thread has not reached a collective that could: it is stuck outside one (in a "
                    "device, file-system or library call: a hung GPU or file system, or a process stopped on a GPU "
                    "this one shares); aborting the job so that it can be requeued\n", backstop.rank, backstop.what,
                    backstop.per_item ? "no tensor done for" : "the step has run", now - backstop.began);
            fflush(stderr);
        }
        pthread_mutex_unlock(&backstop.lock);
        if (past) {
            fflush(stdout);
            alarm(30);                  /* should the abort itself hang: SIGALRM's default action ends the process */
            if (backstop.n_ranks > 1) comm_abort(ALDIT_EXIT_ERROR); /* MPI_Abort from this thread: its best effort */
            _exit(ALDIT_EXIT_ERROR);    /* one rank: no exit handlers, which could wait on what the main thread holds */
        }
    }
    return NULL;
}

static void backstop_arm(int rank, const char *what, double timeout, int per_item)
{
    pthread_mutex_lock(&backstop.lock);
    if (!backstop.started) {
        pthread_t thread;
        const int status = pthread_create(&thread, NULL, backstop_thread, NULL);
        ALDIT_CHECK(status == 0, "cannot start the watchdog's backstop thread (pthread_create returned %d)", status);
        pthread_detach(thread);
        backstop.started = 1;
    }
    backstop.began = monotonic_s();
    backstop.period = backstop_of(rank, timeout);
    backstop.ends = backstop.began + backstop.period;
    backstop.per_item = per_item;
    backstop.rank = rank;
    backstop.n_ranks = comm_size();
    snprintf(backstop.what, sizeof backstop.what, "%s", what);
    pthread_mutex_unlock(&backstop.lock);
}

static void backstop_disarm(void)
{
    pthread_mutex_lock(&backstop.lock);
    backstop.ends = 0.0;
    pthread_mutex_unlock(&backstop.lock);
}

void watchdog_step_begin(int rank, int64_t step, double timeout)
{
    char what[96];
    snprintf(what, sizeof what, "step %lld ([run] step_timeout = %g s)", (long long)step, timeout);
    comm_watch_begin(comm_time() + deadline_of(rank, timeout), grace_of(timeout), what);
    backstop_arm(rank, what, timeout, 0);
}

void watchdog_step_end(void)
{
    backstop_disarm();
    comm_watch_end();
}

void watchdog_state_begin(int rank, const char *what, double timeout)
{
    char text[160];
    snprintf(text, sizeof text, "%s (a deadline of %g s for each tensor, from [run] step_timeout)", what, timeout);
    comm_watch_each(deadline_of(rank, timeout), grace_of(timeout), text);
    backstop_arm(rank, text, timeout, 1);
}

void watchdog_progress(void)
{
    pthread_mutex_lock(&backstop.lock);
    if (backstop.ends > 0 && backstop.per_item) {
        backstop.began = monotonic_s();
        backstop.ends = backstop.began + backstop.period;
    }
    pthread_mutex_unlock(&backstop.lock);
}

void watchdog_state_end(void)
{
    backstop_disarm();
    comm_watch_end();
}

void watchdog_phase_begin(int rank, const char *what, double timeout)
{
    char text[160];
    snprintf(text, sizeof text, "%s (a deadline of %g s for each wait, from [run] step_timeout)", what, timeout);
    comm_watch_each(deadline_of(rank, timeout), grace_of(timeout), text);
    backstop_disarm();   /* it replaces any watch before it (the load's): the phases have no backstop */
}

void watchdog_phase_end(void) { comm_watch_end(); }

void watchdog_test_stop(int rank, const char *point, int64_t step)
{
    const char *hook = getenv("ALDIT_TEST_STOP");
    if (!hook || !hook[0]) return;
    int stop_rank = -1, used = 0;
    char where[16] = "";
    long long stop_step = -1;
    const int fields = sscanf(hook, "%d:%15[a-z]%n:%lld%n", &stop_rank, where, &used, &stop_step, &used);
    const int hang = !strcmp(where, "hang") || !strcmp(where, "hangsave");
    const int with_step = hang || !strcmp(where, "save");
    const int known = with_step || !strcmp(where, "start") || !strcmp(where, "load");
    ALDIT_CHECK(fields >= 2 && hook[used] == '\0' && stop_rank >= 0 && known && (fields == 2 || with_step),
                "ALDIT_TEST_STOP=%s (a test hook: RANK:start, RANK:load, RANK:save, RANK:save:STEP, RANK:hang, "
                "RANK:hang:STEP, RANK:hangsave or RANK:hangsave:STEP); unset it to train without it", hook);
    if (rank != stop_rank || strcmp(where, point) != 0 || (fields == 3 && stop_step != step)) return;
    fflush(stdout);
    fflush(stderr);
    if (!hang) raise(SIGSTOP);
    else
        for (;;) pause();   /* the main thread blocked, its other threads running, as in a hung device call */
}
