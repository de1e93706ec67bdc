/* test_mpi_watch.c — run under mpirun (2 ranks) by mpi_watch.sh: one stall of comm.h's watch, named by the argument,
   which ends the job through rank 0's report (mpi_watch.sh reads it): "step" (a whole-span deadline passed during the
   work before the wait, rank 1 arriving within the grace), "each" (a per-wait deadline, rank 1 arriving within the
   grace), "stopped" (a whole-span deadline, rank 1 not arriving within the grace). Exit 3 if the collective
   completes. */
#include "core/comm.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void pause_for(double seconds)
{
    struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
}

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "";
    const double now = comm_time(), late = now + 60.0; /* rank 1's deadline: rank 0 reports */
    double work = 0.0;
    if (!strcmp(mode, "step")) { /* rank 0: 0.2 s deadline, 0.5 s of work; rank 1 arrives at 0.8 s (grace 2 s) */
        comm_watch_begin(info.rank == 0 ? now + 0.2 : late, 2.0, "unit step");
        work = info.rank == 0 ? 0.5 : 0.8;
    } else if (!strcmp(mode, "each")) { /* 1 s for each wait; rank 1 arrives at 2 s (grace 3 s) */
        comm_watch_each(info.rank == 0 ? 1.0 : 60.0, 3.0, "unit stream");
        work = info.rank == 0 ? 0.0 : 2.0;
    } else if (!strcmp(mode, "stopped")) { /* rank 0: 0.2 s deadline, 0.5 s of work; rank 1 away for 10 s */
        comm_watch_begin(info.rank == 0 ? now + 0.2 : late, 1.0, "unit step");
        work = info.rank == 0 ? 0.5 : 10.0;
    } else {
        if (info.rank == 0) fprintf(stderr, "usage: test_mpi_watch step|each|stopped\n");
        comm_finalize();
        return 2;
    }
    pause_for(work);
    double value = 1.0;
    comm_allreduce_sum_f64(&value, 1);
    comm_watch_end();
    if (info.rank == 0) fprintf(stderr, "test_mpi_watch %s: the collective completed (%g)\n", mode, value);
    comm_finalize();
    return 3;
}
