/* metrics.c — the metrics file: resumed runs keep whole lines up to their step; each new line goes out in one write. */
#include "train/metrics.h"
#include "core/check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

struct metrics_file {
    int fd;
    char *line;
    size_t length, capacity;
};

/* Rewrite `path` keeping the whole lines of steps <= resumed_step (through path.tmp and a rename). */
static void keep_lines_up_to(const char *path, int64_t resumed_step)
{
    FILE *old = fopen(path, "r");
    if (!old) return;
    char tmp_path[4096];
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
    FILE *kept = fopen(tmp_path, "w");
    ALDIT_CHECK(kept, "cannot write %s: %s", tmp_path, strerror(errno));
    char *line = NULL;
    size_t line_capacity = 0;
    ssize_t length;
    while ((length = getline(&line, &line_capacity, old)) > 0) {
        const char *field = strstr(line, "\"step\":");
        if (field && line[length - 1] == '\n' && strtoll(field + 7, NULL, 10) <= resumed_step) fputs(line, kept);
    }
    free(line);
    fclose(old);
    ALDIT_CHECK(fclose(kept) == 0 && rename(tmp_path, path) == 0, "cannot rewrite %s: %s", path, strerror(errno));
}

metrics_file *metrics_open(const char *path, int64_t resumed_step)
{
    if (resumed_step > 0) keep_lines_up_to(path, resumed_step);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | (resumed_step > 0 ? 0 : O_TRUNC), 0666);
    ALDIT_CHECK(fd >= 0, "cannot open the metrics file %s ([log] metrics): %s", path, strerror(errno));
    metrics_file *m = xcalloc(1, sizeof *m);
    m->fd = fd;
    return m;
}

void metrics_add(metrics_file *m, const char *format, ...)
{
    for (;;) {
        va_list args;
        va_start(args, format);
        int needed = vsnprintf(m->line + m->length, m->capacity - m->length, format, args);
        va_end(args);
        ALDIT_CHECK(needed >= 0, "metrics line: bad format");
        if (m->length + (size_t)needed < m->capacity) {
            m->length += (size_t)needed;
            return;
        }
        m->capacity = 2 * (m->length + (size_t)needed) + 256;
        m->line = xrealloc(m->line, m->capacity);
    }
}

int metrics_end_line(metrics_file *m)
{
    metrics_add(m, "\n");
    const off_t start = lseek(m->fd, 0, SEEK_END); /* O_APPEND: where this line begins */
    size_t done = 0;
    int failure = 0;
    while (done < m->length && failure == 0) { /* one write, unless it comes back short (then the reason) */
        ssize_t written = write(m->fd, m->line + done, m->length - done);
        if (written > 0) done += (size_t)written;
        else if (written == 0) failure = ENOSPC;
        else if (errno != EINTR) failure = errno;
    }
    if (failure != 0 && start >= 0 && ftruncate(m->fd, start) != 0) failure = errno; /* could not cut it back */
    m->length = 0;
    return failure;
}

int metrics_close(metrics_file *m)
{
    if (!m) return 0;
    int failure = close(m->fd) == 0 ? 0 : errno;
    free(m->line);
    free(m);
    return failure;
}
