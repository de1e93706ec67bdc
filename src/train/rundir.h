/* rundir.h — guards of the run folder: an exclusive lock while a run uses it, and no fresh start over another run. */
#ifndef ALDIT_RUNDIR_H
#define ALDIT_RUNDIR_H

#include <stdio.h>

#include "deck/deck.h"

#define RUNDIR_LOCK_FILE "aldit.lock"

/* Rank 0: take an exclusive fcntl (POSIX record) lock on <dir>/aldit.lock, without waiting, and write this
   run's holder line into it: host, pid, job id (SLURM_JOB_ID, else PBS_JOBID, else none), start time.
   The lock lasts until the process ends; a normal exit (exit()) also empties the file. Returns 0.
   - the lock is held by a live run: an error naming the holder from the file, returns 2;
   - the lock is free but the file names a holder (a run that died without a normal exit: killed, aborted,
     a lost node): the lock is taken over with a note on `notes` naming that holder;
   - the file system refuses locks (ENOLCK, EOPNOTSUPP, ENOSYS: Lustre without -o flock, NFSv3 without
     lockd): an error saying so and suggesting [run] lock = off, returns 2; other errors likewise;
   - the lock file is a symbolic link, a FIFO or anything but a regular file: an error saying to remove it,
     returns 2, having written nothing anywhere (the link is not followed).
   A holder named in a message is the file's first line with bytes outside printable ASCII written \xNN. */
int rundir_lock(const char *dir, FILE *errors, FILE *notes);

/* Rank 0, a fresh start ([checkpoint] resume = off): the run folder must hold no checkpoint
   (checkpoints/step_*.h5) and no non-empty metrics file at `metrics_path` of an earlier run, which a fresh
   start would overwrite or prune and a later requeue would resume. Returns 0, or 2 after an error on
   `errors` naming what is there. */
int rundir_check_fresh(const deck *config, const char *metrics_path, FILE *errors);

#endif
