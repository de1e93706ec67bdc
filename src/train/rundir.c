/* rundir.c — the run folder's lock file (fcntl, holder named inside) and the fresh-start check. */
#include "train/rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int lock_fd = -1;

/* atexit: the run ends normally; empty the file (a holder line left in it marks a run that died) */
static void release_lock(void)
{
    if (lock_fd < 0) return;
    if (ftruncate(lock_fd, 0) != 0) { /* the file then names a run that is gone: the next one says so */ }
    close(lock_fd);
    lock_fd = -1;
}

/* The holder line in the file (its first line, at most 160 bytes), printable: a byte outside printable ASCII is
   written \xNN, so that a damaged or foreign file cannot send control sequences to the terminal ("" when empty). */
static void read_holder(int fd, char *holder, size_t size)
{
    unsigned char raw[161];
    ssize_t n = pread(fd, raw, sizeof raw - 1, 0);
    size_t used = 0;
    for (ssize_t i = 0; i < n && raw[i] != '\n' && used + 5 < size; i++) {
        if (raw[i] >= 0x20 && raw[i] < 0x7f && raw[i] != '\\') holder[used++] = (char)raw[i];
        else used += (size_t)snprintf(holder + used, size - used, "\\x%02x", raw[i]);
    }
    holder[used] = '\0';
}

/* Opens the lock file without following a symbolic link, without blocking on a FIFO, and only when it is (or is
   created as) a regular file; -1 after an error on `errors` naming it and what to do. */
static int open_lock_file(const char *path, FILE *errors)
{
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0 && errno == ELOOP) {
        fprintf(errors, "aldit: error: the run folder's lock file %s is a symbolic link: aldit writes its holder "
                "line there and will not follow it (its target would be overwritten). Remove the link (rm %s) and "
                "start again\n", path, path);
        return -1;
    }
    if (fd < 0) {
        fprintf(errors, "aldit: error: cannot open the run folder's lock file %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        fprintf(errors, "aldit: error: the run folder's lock file %s is not a regular file (a FIFO, device or "
                "socket): aldit will not write into it. Remove it (rm %s) and start again\n", path, path);
        close(fd);
        return -1;
    }
    return fd;
}

int rundir_lock(const char *dir, FILE *errors, FILE *notes)
{
    char path[DECK_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, RUNDIR_LOCK_FILE);
    int fd = open_lock_file(path, errors);
    if (fd < 0) return 2;
    char holder[4 * 160 + 8];
    read_holder(fd, holder, sizeof holder);
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &lock) != 0) {
        int failure = errno;
        if (failure == EACCES || failure == EAGAIN)
            fprintf(errors, "aldit: error: the run folder %s is in use by another run (%s; lock file %s): two runs "
                    "on one folder would mix their metrics and checkpoints. Wait for it to end, or use another "
                    "[run] dir\n", dir, holder[0] ? holder : "holder not recorded yet", path);
        else if (failure == ENOLCK || failure == EOPNOTSUPP || failure == ENOSYS || failure == EINVAL)
            fprintf(errors, "aldit: error: cannot lock %s: %s: the file system of the run folder does not support "
                    "locks (Lustre: mount with -o flock; NFSv3: run lockd). Set [run] lock = off to run without "
                    "the lock (then make sure that no two jobs use one run folder)\n", path, strerror(failure));
        else fprintf(errors, "aldit: error: cannot lock %s: %s (or set [run] lock = off)\n", path, strerror(failure));
        close(fd);
        return 2;
    }
    if (holder[0])
        fprintf(notes, "aldit: taking over the lock of the run folder %s from a run that ended without a normal "
                "exit (%s)\n", dir, holder);
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    const char *job = getenv("SLURM_JOB_ID");
    if (!job || !job[0]) job = getenv("PBS_JOBID");
    time_t now = time(NULL);
    char started[32] = "";
    strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
    char line[1024];
    int length = snprintf(line, sizeof line, "host %s, pid %ld, job %s, started %s\n", host, (long)getpid(),
                          job && job[0] ? job : "none", started);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)length, 0) != length) { /* the lock holds anyway */ }
    lock_fd = fd;
    atexit(release_lock);
    return 0;
}

/* The first complete checkpoint name in `dir` ("" when none) and how many there are. */
static int count_checkpoints(const char *dir, char *first, size_t first_size)
{
    first[0] = '\0';
    DIR *folder = opendir(dir);
    if (!folder) return 0;
    int count = 0;
    for (struct dirent *entry; (entry = readdir(folder));) {
        const char *name = entry->d_name;
        size_t length = strlen(name);
        if (strncmp(name, "step_", 5) != 0 || length < 9 || strcmp(name + length - 3, ".h5") != 0) continue;
        if (count++ == 0 || strcmp(name, first) > 0) snprintf(first, first_size, "%s", name); /* the newest */
    }
    closedir(folder);
    return count;
}

int rundir_check_fresh(const deck *config, const char *metrics_path, FILE *errors)
{
    char dir[DECK_PATH_MAX + 16], newest[256];
    snprintf(dir, sizeof dir, "%s/checkpoints", config->run.dir);
    int n_checkpoints = count_checkpoints(dir, newest, sizeof newest);
    struct stat metrics;
    int has_metrics = stat(metrics_path, &metrics) == 0 && S_ISREG(metrics.st_mode) && metrics.st_size > 0;
    if (n_checkpoints == 0 && !has_metrics) return 0;
    char what[DECK_PATH_MAX * 2 + 512] = "";
    if (n_checkpoints > 0)
        snprintf(what, sizeof what, "%d checkpoint(s) in %s (the newest %s)", n_checkpoints, dir, newest);
    if (has_metrics) {
        size_t used = strlen(what);
        snprintf(what + used, sizeof what - used, "%sthe metrics file %s (%lld bytes)", used ? " and " : "",
                 metrics_path, (long long)metrics.st_size);
    }
    fprintf(errors, "aldit: error: [checkpoint] resume = off (a fresh start), but the run folder %s holds an earlier "
            "run's files: %s. A fresh start would overwrite and prune them, and a requeued job would then resume "
            "the wrong run. Use a new [run] dir, move those files away, or set [checkpoint] resume = on to continue "
            "that run\n", config->run.dir, what);
    return 2;
}
