/* comm.h — every MPI call of aldit goes through here: start-up, broadcast, scatter, reductions, gathers. */
#ifndef ALDIT_COMM_H
#define ALDIT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/check.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank;          /* rank in MPI_COMM_WORLD */
    int n_ranks;       /* size of MPI_COMM_WORLD */
    int local_rank;    /* rank among the ranks of this node (MPI_COMM_TYPE_SHARED): picks the GPU */
    int n_local_ranks; /* ranks on this node */
} comm_info;

/* MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) and the rank layout. */
comm_info comm_init(int *argc, char ***argv);
void comm_finalize(void);
/* Rank in MPI_COMM_WORLD (after comm_init), for code that is not handed comm_info. */
int comm_rank(void);
/* Ranks in MPI_COMM_WORLD. */
int comm_size(void);

/* Broadcast n_bytes from rank 0 to every rank (any size; sent in pieces below INT_MAX). */
void comm_bcast_bytes(void *buffer, size_t n_bytes);
/* Rank 0 sends counts[r] int64 values starting at displs[r] of `send` to rank r; every rank receives
   its own count (returned) into `recv` of capacity `recv_capacity` (fatal if too small). Non-root
   ranks may pass NULL for send/counts/displs. */
int comm_scatterv_i64(const int64_t *send, const int *counts, const int *displs,
                      int64_t *recv, int recv_capacity);
/* Like MPI_Scatter of one int per rank from rank 0. */
int comm_scatter_int(const int *send);
/* In-place sums / max across ranks. */
void comm_allreduce_sum_f32(float *values, size_t n_values);
void comm_allreduce_sum_f64(double *values, size_t n_values);
void comm_allreduce_max_f64(double *values, size_t n_values);
void comm_allreduce_min_f64(double *values, size_t n_values);
int comm_allreduce_or_int(int flag);
/* Rank 0 receives one double from every rank into `all` (length n_ranks); others may pass NULL. */
void comm_gather_f64(double value, double *all);
/* Rank 0 receives n values from every rank into `all` (length n_ranks * n); others may pass NULL. */
void comm_gather_f64_n(const double *values, int n, double *all);
/* Sharded flat fp32 arrays of n_values: rank r owns values [r * shard, r * shard + count_r), count_r =
   min(shard, n_values - r * shard) clamped at 0, with shard = comm_shard_values(n_values, n_ranks) = ceil(n / ranks).
   Every rank calls each of these with the same n_values. */
int64_t comm_shard_values(int64_t n_values, int n_ranks);
/* The sum over ranks of values[0 .. n_values) (every rank's full array, left as it was) restricted to this rank's
   shard, into mine (count_r values): MPI_Reduce_scatter. */
void comm_reduce_scatter_sum_f32(const float *values, int64_t n_values, float *mine);
/* In place: every rank's own shard of values (full length on every rank) reaches every rank: MPI_Allgatherv. */
void comm_allgather_f32(float *values, int64_t n_values);
/* One range of values spread over the ranks, counts[r] of them on rank r (counts and displs, n_ranks each, the same on
   every rank; each below INT_MAX): comm_scatterv_f32 sends root_values[displs[r] .. + counts[r]) from rank 0 to rank r's
   mine (rank 0's own part is copied; root_values may be NULL elsewhere); comm_gatherv_f32 the reverse, every rank's
   mine into root_values on rank 0. MPI_Scatterv / MPI_Gatherv. */
void comm_scatterv_f32(const float *root_values, const int64_t *counts, const int64_t *displs, float *mine);
void comm_gatherv_f32(const float *mine, const int64_t *counts, const int64_t *displs, float *root_values);

/* ---- sequence-parallel groups (Ulysses) ------------------------------------------------------------
   A group of size k (a power of two) is the aligned block of world ranks base .. base+k-1, base = rank - rank % k.
   comm_groups_init is collective over every rank (call it once, after comm_init, with the same max_k everywhere): it
   makes this rank's group communicator for every k = 2, 4, ..., up to max_k and no further than the ranks
   (MPI_Comm_split, color rank / k). Inside a watch its agreements wait as the collectives do, and each split follows
   a watched barrier (MPI has no split that does not block: a rank stopped before it is named at the barrier).
   comm_finalize frees them. */
typedef struct comm_group comm_group;
void comm_groups_init(int max_k);
/* This rank's group of size k (k > 1) made by comm_groups_init; NULL for k <= 1 or a k that was not made. */
const comm_group *comm_group_get(int k);
int comm_group_size(const comm_group *group);
int comm_group_rank(const comm_group *group);    /* this rank's place in its group: rank % k */
/* 1 when every aligned block of k ranks is whole (k divides the ranks) and lies within one node (the ranks of
   MPI_COMM_TYPE_SHARED), as groups must; 0 otherwise, or for a k that was not made. k = 1: 1. */
int comm_group_node_local(int k);
/* All-to-all over the group (MPI_Alltoallv): send_counts[p] floats at send_displs[p] go to member p, recv_counts[p]
   floats from member p land at recv_displs[p] (arrays of the group's size; each below INT_MAX). Every member calls
   it with matching counts; send and recv may not overlap. Inside a step watch it waits as the others do. */
void comm_group_alltoallv_f32(const comm_group *group, const float *send, const int64_t *send_counts,
                              const int64_t *send_displs, float *recv, const int64_t *recv_counts,
                              const int64_t *recv_displs);
/* In-place sum over the group's members. */
void comm_group_allreduce_sum_f64(const comm_group *group, double *values, int n_values);

/* Wall-clock seconds (MPI_Wtime). */
double comm_time(void);

/* End the whole job at once with `code` (MPI_Abort on MPI_COMM_WORLD; exit where MPI is not running). */
ALDIT_NORETURN void comm_abort(int code);

/* ---- the step watch (the training loop's watchdog) ------------------------------------------------
   Between comm_watch_begin and comm_watch_end every collective above waits by testing (MPI_Test) instead
   of blocking: it polls for the first COMM_WATCH_SPIN_S seconds as MPI would, then sleeps between tests
   (at most 1 ms), so a rank waiting long for a slower one does not hold a core at 100 %. Every rank
   answers rank 0's "are you there?" while it waits. When a wait passes `deadline` (comm_time seconds):
   on rank 0, it asks every rank and gives them `grace` seconds to answer; the ranks that did not
   (stopped, stalled in compute, a hung file system or device) are named in "aldit: error: `what`: ..."
   and the job ends through comm_abort(ALDIT_EXIT_ERROR). When every rank answers, the message says so and, for this
   watch (whose deadline counts the work between the waits too), how long ago the watch began and the wait began:
   the work outlasted the deadline (or a collective does not complete). On any other rank (whose deadline should be
   later than rank 0's, so that rank 0 reports first) the message says that rank 0 has not answered.
   deadline <= 0: no deadline (waits still sleep and answer). Not reentrant; outside a watch collectives
   block as MPI does. */
#define COMM_WATCH_SPIN_S 0.05
void comm_watch_begin(double deadline, double grace, const char *what);
/* The same watch with a deadline per wait instead: each collective's wait ends in the report above when it has
   lasted `seconds` (> 0). For a stream of many collectives with work between them (a checkpoint's tensors):
   every step of the stream is bounded, the stream's length is not. Ended by comm_watch_end. */
void comm_watch_each(double seconds, double grace, const char *what);
void comm_watch_end(void);
/* A wait inside a watch for something MPI does not see (a GPU stream behind NCCL collectives): the caller tests it
   and, while it is not done, calls comm_watch_tick with the comm_time() at which the wait began and a pause that
   starts at 1e-5. Each call answers rank 0, ends the job past the deadline as a collective's wait does (so a rank
   stopped inside a device collective is named), and after COMM_WATCH_SPIN_S sleeps `*pause` (doubled up to 1 ms;
   a pause of 0 never sleeps: a wait whose end must be seen at once, as cudaStreamSynchronize would see it).
   comm_watch_active says whether a watch is on (outside one the caller may simply block). */
int comm_watch_active(void);
void comm_watch_tick(double started, double *pause);

#ifdef __cplusplus
}
#endif

#endif
