/* check.c — fatal errors, warnings and checked allocation shared by every aldit program. */
#include "core/check.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static _Noreturn void abort_job(int code)
{
    int initialized = 0, finalized = 0, n_ranks = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
        if (n_ranks > 1) MPI_Abort(MPI_COMM_WORLD, code);
        MPI_Finalize();
    }
    exit(code);
}

void aldit_fatal_at(const char *file, int line, int code, const char *fmt, ...)
{
    va_list args;
    fflush(stdout);
    fprintf(stderr, "aldit: error (%s:%d): ", file, line);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
    fflush(stderr);
    abort_job(code);
}

void aldit_warn(const char *fmt, ...)
{
    va_list args;
    fflush(stdout);
    fputs("aldit: warning: ", stderr);
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
}

_Noreturn void aldit_mpi_fail(int status, const char *call, const char *file, int line)
{
    char message[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(status, message, &length) != MPI_SUCCESS) snprintf(message, sizeof message, "code %d", status);
    aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "MPI call %s failed: %s", call, message);
}

void *aldit_malloc_at(size_t n_bytes, const char *file, int line)
{
    void *ptr = malloc(n_bytes ? n_bytes : 1);
    if (!ptr) aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "out of host memory allocating %zu bytes", n_bytes);
    return ptr;
}

void *aldit_calloc_at(size_t n_items, size_t item_bytes, const char *file, int line)
{
    void *ptr = calloc(n_items ? n_items : 1, item_bytes ? item_bytes : 1);
    if (!ptr) aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "out of host memory allocating %zu x %zu bytes", n_items, item_bytes);
    return ptr;
}

void *aldit_realloc_at(void *ptr, size_t n_bytes, const char *file, int line)
{
    void *grown = realloc(ptr, n_bytes ? n_bytes : 1);
    if (!grown) aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "out of host memory reallocating %zu bytes", n_bytes);
    return grown;
}

void format_size(double n_bytes, char *text, size_t text_size)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    while (n_bytes >= 1024.0 && unit < 4) { n_bytes /= 1024.0; unit++; }
    snprintf(text, text_size, "%.1f %s", n_bytes, units[unit]);
}
