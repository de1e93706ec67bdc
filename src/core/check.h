/* check.h — error reporting for aldit: fatal-error helpers and status-checking macros that name file:line. */
#ifndef ALDIT_CHECK_H
#define ALDIT_CHECK_H

#include <stdarg.h>
#include <stddef.h>

/* Usable from CUDA (C++) sources too: C linkage, and C11's _Noreturn spelled the C++ way. */
#ifdef __cplusplus
#define ALDIT_NORETURN [[noreturn]]
extern "C" {
#else
#define ALDIT_NORETURN _Noreturn
#endif

/* Exit codes: 0 success, 1 runtime error, 2 bad input (deck, command line, store). */
enum { ALDIT_EXIT_ERROR = 1, ALDIT_EXIT_USAGE = 2 };

/* Print "aldit: FILE:LINE: message" to stderr and end the job: MPI_Abort when MPI is running with more
   than one rank (so one failing rank stops all), exit(code) otherwise. Never returns. */
ALDIT_NORETURN void aldit_fatal_at(const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define ALDIT_FATAL(...) aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, __VA_ARGS__)
#define ALDIT_FATAL_CODE(code, ...) aldit_fatal_at(__FILE__, __LINE__, (code), __VA_ARGS__)

/* Warnings and informational lines go to stderr / stdout, prefixed "aldit: ". */
void aldit_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A byte count for people: "1.5 GiB" (B, KiB, MiB, GiB, TiB; one decimal). */
void format_size(double n_bytes, char *text, size_t text_size);

/* Check a condition that must hold (stays on in release builds). */
#define ALDIT_CHECK(cond, ...) do { if (!(cond)) ALDIT_FATAL(__VA_ARGS__); } while (0)

/* Allocation that never returns NULL: on failure the job ends with the size and the place. */
void *aldit_malloc_at(size_t n_bytes, const char *file, int line);
void *aldit_calloc_at(size_t n_items, size_t item_bytes, const char *file, int line);
void *aldit_realloc_at(void *ptr, size_t n_bytes, const char *file, int line);
#define xmalloc(n) aldit_malloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, s) aldit_calloc_at((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) aldit_realloc_at((p), (n), __FILE__, __LINE__)

/* MPI calls: MPI_CHECK(MPI_Bcast(...)) ends the job with MPI's error string on failure. */
#define MPI_CHECK(call) do { int mpi_status_ = (call); \
    if (mpi_status_ != 0) aldit_mpi_fail(mpi_status_, #call, __FILE__, __LINE__); } while (0)
ALDIT_NORETURN void aldit_mpi_fail(int status, const char *call, const char *file, int line);

/* HDF5 calls return negative on failure: H5_CHECK(x) ends the job naming the call. Code that must
   recover (the store reader reporting a corrupt file) tests the status itself instead. */
#define H5_CHECK(call) do { if ((long long)(call) < 0) \
    aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "HDF5 call failed: %s", #call); } while (0)

#ifdef __cplusplus
}
#endif

#endif
