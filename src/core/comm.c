/* comm.c — every MPI call of aldit (besides check.c's abort path): checked wrappers and the step watch. */
#include "core/comm.h"
#include "core/check.h"

#include <limits.h>
#include <stdlib.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the step watch ------------------------------------------------------------------------------- */

enum { TAG_PING = 7301, TAG_PONG = 7302 };

static struct {
    int on;
    double began; /* comm_time when the watch began: a whole-span watch's deadline counts from about then */
    double deadline, grace;
    double each; /* > 0: each wait's own deadline, seconds after it began (comm_watch_each); deadline unused */
    char what[160];
} watch;

void comm_watch_begin(double deadline, double grace, const char *what)
{
    watch.on = 1;
    watch.began = MPI_Wtime();
    watch.deadline = deadline;
    watch.each = 0.0;
    watch.grace = grace > 0 ? grace : 1.0;
    snprintf(watch.what, sizeof watch.what, "%s", what);
}

void comm_watch_each(double seconds, double grace, const char *what)
{
    comm_watch_begin(0.0, grace, what);
    watch.each = seconds > 0 ? seconds : 1.0;
}

void comm_watch_end(void) { watch.on = 0; }

static void nap(double seconds)
{
    struct timespec pause = {0, (long)(seconds * 1e9)};
    nanosleep(&pause, NULL);
}

/* Not rank 0: answer each "are you there?" of rank 0 that has arrived. */
static void answer_pings(void)
{
    for (;;) {
        int pending = 0;
        MPI_Status status;
        MPI_CHECK(MPI_Iprobe(0, TAG_PING, MPI_COMM_WORLD, &pending, &status));
        if (!pending) return;
        int ping = 0;
        MPI_CHECK(MPI_Recv(&ping, 1, MPI_INT, 0, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        MPI_CHECK(MPI_Send(&ping, 1, MPI_INT, 0, TAG_PONG, MPI_COMM_WORLD));
    }
}

/* How long the stalled wait lasted and, for a watch whose deadline spans several waits and the work between them (a
   step), how long the watch had run: the deadline counts the work between the waits too. */
static void describe_wait(char *text, size_t size, double waited)
{
    if (watch.each > 0) snprintf(text, size, "waited %.0f s", waited);
    else snprintf(text, size, "the deadline counts from %.1f s ago, this wait began %.1f s ago",
                  MPI_Wtime() - watch.began, waited);
}

/* Rank 0, past the deadline: ask every rank, wait `grace` seconds, name those that did not answer, abort. */
_Noreturn static void report_stall(double waited)
{
    char how_long[128];
    describe_wait(how_long, sizeof how_long, waited);
    int n_ranks = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks));
    MPI_Request *requests = calloc(2 * (size_t)n_ranks, sizeof *requests);
    int *answers = calloc((size_t)n_ranks, sizeof *answers), ping = 1;
    if (!requests || !answers) comm_abort(ALDIT_EXIT_ERROR);
    for (int r = 1; r < n_ranks; r++) {
        MPI_CHECK(MPI_Isend(&ping, 1, MPI_INT, r, TAG_PING, MPI_COMM_WORLD, &requests[2 * r]));
        MPI_CHECK(MPI_Irecv(&answers[r], 1, MPI_INT, r, TAG_PONG, MPI_COMM_WORLD, &requests[2 * r + 1]));
    }
    const double asked = MPI_Wtime();
    int missing = 0;
    do {
        nap(1e-3);
        missing = 0;
        for (int r = 1; r < n_ranks; r++) {
            int done = 0;
            MPI_CHECK(MPI_Test(&requests[2 * r + 1], &done, MPI_STATUS_IGNORE));
            missing += !done;
        }
    } while (missing > 0 && MPI_Wtime() - asked < watch.grace);
    char names[512] = "";
    int listed = 0;
    for (int r = 1; r < n_ranks; r++) {
        if (requests[2 * r + 1] == MPI_REQUEST_NULL) continue;
        size_t used = strlen(names);
        if (listed++ < 32) snprintf(names + used, sizeof names - used, "%s%d", listed > 1 ? ", " : "", r);
    }
    fflush(stdout);
    if (missing > 0)
        fprintf(stderr, "aldit: error: %s: rank%s %s%s (of %d) %s not arrived by the deadline (%s) and %s not "
                "answered in %.0f s (stopped or stalled: a signal, a hung file system or device, a dead node); "
                "aborting the job so that it can be requeued\n", watch.what, missing > 1 ? "s" : "", names,
                missing > 32 ? " ..." : "", n_ranks, missing > 1 ? "have" : "has", how_long,
                missing > 1 ? "have" : "has", watch.grace);
    else if (watch.each > 0)
        fprintf(stderr, "aldit: error: %s: a collective has not completed in %.0f s of waiting although every rank "
                "answers (the network?); aborting the job so that it can be requeued\n", watch.what, waited);
    else
        fprintf(stderr, "aldit: error: %s: past the deadline (%s) and every rank answers: the work outlasted the "
                "deadline (a loaded machine, or a deadline too short for it) or a collective does not complete (the "
                "network?); aborting the job so that it can be requeued\n", watch.what, how_long);
    fflush(stderr);
    comm_abort(ALDIT_EXIT_ERROR);
}

int comm_watch_active(void) { return watch.on; }

void comm_watch_tick(double started, double *pause)
{
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (watch.on && rank != 0) answer_pings();
    const double now = MPI_Wtime(), deadline = watch.each > 0 ? started + watch.each : watch.deadline;
    if (watch.on && deadline > 0 && now > deadline) {
        if (rank == 0) report_stall(now - started);
        fflush(stdout);
        fprintf(stderr, "aldit: error: rank %d: %s: rank 0 has not answered by the deadline (stalled?); aborting "
                "the job so that it can be requeued\n", rank, watch.what);
        fflush(stderr);
        comm_abort(ALDIT_EXIT_ERROR);
    }
    if (now - started < COMM_WATCH_SPIN_S || *pause <= 0) return;
    nap(*pause);
    if (*pause < 1e-3) *pause *= 2;
}

/* Complete `request`: blocking outside a watch; inside one, poll, then test and sleep, answer rank 0,
   and report a stall past the deadline. */
static void wait_request(MPI_Request *request)
{
    if (!watch.on) {
        MPI_CHECK(MPI_Wait(request, MPI_STATUS_IGNORE));
        return;
    }
    const double started = MPI_Wtime();
    double pause = 1e-5;
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
        if (done) return;
        comm_watch_tick(started, &pause);
    }
}

/* ---- sequence-parallel groups ------------------------------------------------------------------------ */

struct comm_group {
    MPI_Comm comm;
    int size, rank;
    int node_local;   /* every aligned block of this size is whole and within one node */
};

enum { MAX_GROUP_LOG2 = 30 };
static struct comm_group groups[MAX_GROUP_LOG2 + 1];   /* by log2(k); comm MPI_COMM_NULL where not made */
static int groups_made;
static int node_leader;   /* world rank of this node's first rank (comm_init) */

static void groups_free(void)
{
    for (int g = 0; groups_made && g <= MAX_GROUP_LOG2; g++)
        if (groups[g].comm != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&groups[g].comm));
    groups_made = 0;
}

static void allreduce_on(MPI_Comm comm, void *values, size_t n_values, MPI_Datatype type, MPI_Op op);

/* Whether every member of `comm` shares this rank's node, agreed over all ranks (collective on the world). */
static int whole_on_one_node(MPI_Comm comm, int whole)
{
    int low = node_leader, high = node_leader;
    allreduce_on(comm, &low, 1, MPI_INT, MPI_MIN);
    allreduce_on(comm, &high, 1, MPI_INT, MPI_MAX);
    int local = whole && low == high;
    allreduce_on(MPI_COMM_WORLD, &local, 1, MPI_INT, MPI_LAND);
    return local;
}

/* Every rank has arrived (MPI_Ibarrier; inside a watch it waits as the collectives do). */
static void barrier(void)
{
    if (!watch.on) {
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        return;
    }
    MPI_Request request;
    MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &request));
    wait_request(&request);
}

void comm_groups_init(int max_k)
{
    ALDIT_CHECK(max_k >= 1 && (max_k & (max_k - 1)) == 0, "sequence-parallel groups: the largest group (%d) must be a "
                "power of two", max_k);
    groups_free();
    for (int g = 0; g <= MAX_GROUP_LOG2; g++) groups[g] = (struct comm_group){.comm = MPI_COMM_NULL};
    groups_made = 1;
    int rank = 0, n_ranks = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks));
    for (int g = 1; g <= MAX_GROUP_LOG2 && (1 << g) <= max_k && (1 << g) <= n_ranks; g++) {
        const int k = 1 << g;
        struct comm_group *group = &groups[g];
        barrier(); /* MPI has no split that does not block: inside a watch, a rank stopped before it is named here */
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank / k, rank, &group->comm));
        MPI_CHECK(MPI_Comm_set_errhandler(group->comm, MPI_ERRORS_RETURN));
        MPI_CHECK(MPI_Comm_size(group->comm, &group->size));
        MPI_CHECK(MPI_Comm_rank(group->comm, &group->rank));
        group->node_local = whole_on_one_node(group->comm, n_ranks % k == 0);
    }
}

static int group_log2(int k)
{
    int g = 0;
    while (g < MAX_GROUP_LOG2 && (1 << g) < k) g++;
    return (1 << g) == k ? g : -1;
}

const comm_group *comm_group_get(int k)
{
    const int g = k > 1 && groups_made ? group_log2(k) : -1;
    return g > 0 && groups[g].comm != MPI_COMM_NULL ? &groups[g] : NULL;
}

int comm_group_size(const comm_group *group) { return group->size; }
int comm_group_rank(const comm_group *group) { return group->rank; }

int comm_group_node_local(int k)
{
    if (k == 1) return 1;
    const comm_group *group = comm_group_get(k);
    return group ? group->node_local : 0;
}

/* int counts and displacements of a group's all-to-all (fatal past INT_MAX); the caller frees the result, which
   holds send counts, send displacements, receive counts and receive displacements, n each. */
static int *alltoall_counts(int n, const int64_t *send_counts, const int64_t *send_displs, const int64_t *recv_counts,
                            const int64_t *recv_displs)
{
    int *out = xmalloc(4 * (size_t)n * sizeof *out);
    const int64_t *in[4] = {send_counts, send_displs, recv_counts, recv_displs};
    for (int a = 0; a < 4; a++)
        for (int p = 0; p < n; p++) {
            ALDIT_CHECK(in[a][p] >= 0 && in[a][p] < INT_MAX, "a group all-to-all of %lld values exceeds what one MPI "
                        "call takes (%d values): use a larger group", (long long)in[a][p], INT_MAX);
            out[a * n + p] = (int)in[a][p];
        }
    return out;
}

void comm_group_alltoallv_f32(const comm_group *group, const float *send, const int64_t *send_counts,
                              const int64_t *send_displs, float *recv, const int64_t *recv_counts,
                              const int64_t *recv_displs)
{
    const int n = group->size;
    int *c = alltoall_counts(n, send_counts, send_displs, recv_counts, recv_displs);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Ialltoallv(send, c, c + n, MPI_FLOAT, recv, c + 2 * n, c + 3 * n, MPI_FLOAT, group->comm,
                                 &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Alltoallv(send, c, c + n, MPI_FLOAT, recv, c + 2 * n, c + 3 * n, MPI_FLOAT, group->comm));
    free(c);
}

void comm_group_allreduce_sum_f64(const comm_group *group, double *values, int n_values)
{
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, n_values, MPI_DOUBLE, MPI_SUM, group->comm, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, n_values, MPI_DOUBLE, MPI_SUM, group->comm));
}

comm_info comm_init(int *argc, char ***argv)
{
    comm_info info = {0};
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.n_ranks));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &info.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &info.n_local_ranks));
    node_leader = info.rank;
    MPI_CHECK(MPI_Bcast(&node_leader, 1, MPI_INT, 0, node));
    MPI_CHECK(MPI_Comm_free(&node));
    return info;
}

void comm_finalize(void)
{
    groups_free();
    MPI_CHECK(MPI_Finalize());
}

int comm_rank(void)
{
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    return rank;
}

int comm_size(void)
{
    int size = 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    return size;
}

void comm_bcast_bytes(void *buffer, size_t n_bytes)
{
    char *bytes = buffer;
    while (n_bytes > 0) {
        int piece = n_bytes > (size_t)INT_MAX ? INT_MAX : (int)n_bytes;
        if (watch.on) {
            MPI_Request request;
            MPI_CHECK(MPI_Ibcast(bytes, piece, MPI_BYTE, 0, MPI_COMM_WORLD, &request));
            wait_request(&request);
        } else MPI_CHECK(MPI_Bcast(bytes, piece, MPI_BYTE, 0, MPI_COMM_WORLD));
        bytes += piece;
        n_bytes -= (size_t)piece;
    }
}

int comm_scatter_int(const int *send)
{
    int mine = 0;
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Iscatter(send, 1, MPI_INT, &mine, 1, MPI_INT, 0, MPI_COMM_WORLD, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Scatter(send, 1, MPI_INT, &mine, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return mine;
}

int comm_scatterv_i64(const int64_t *send, const int *counts, const int *displs,
                      int64_t *recv, int recv_capacity)
{
    int my_count = comm_scatter_int(counts);
    ALDIT_CHECK(my_count <= recv_capacity, "scatter: %d values do not fit a buffer of %d", my_count, recv_capacity);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Iscatterv(send, counts, displs, MPI_INT64_T, recv, my_count, MPI_INT64_T, 0, MPI_COMM_WORLD,
                                &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Scatterv(send, counts, displs, MPI_INT64_T, recv, my_count, MPI_INT64_T, 0, MPI_COMM_WORLD));
    return my_count;
}

static void allreduce_on(MPI_Comm comm, void *values, size_t n_values, MPI_Datatype type, MPI_Op op)
{
    int type_bytes = 0;
    MPI_CHECK(MPI_Type_size(type, &type_bytes));
    char *bytes = values;
    while (n_values > 0) {
        int piece = n_values > (size_t)INT_MAX ? INT_MAX : (int)n_values;
        if (watch.on) {
            MPI_Request request;
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, bytes, piece, type, op, comm, &request));
            wait_request(&request);
        } else MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, bytes, piece, type, op, comm));
        bytes += (size_t)piece * (size_t)type_bytes;
        n_values -= (size_t)piece;
    }
}

static void allreduce(void *values, size_t n_values, MPI_Datatype type, MPI_Op op)
{
    allreduce_on(MPI_COMM_WORLD, values, n_values, type, op);
}

void comm_allreduce_sum_f32(float *values, size_t n_values) { allreduce(values, n_values, MPI_FLOAT, MPI_SUM); }
void comm_allreduce_sum_f64(double *values, size_t n_values) { allreduce(values, n_values, MPI_DOUBLE, MPI_SUM); }
void comm_allreduce_max_f64(double *values, size_t n_values) { allreduce(values, n_values, MPI_DOUBLE, MPI_MAX); }
void comm_allreduce_min_f64(double *values, size_t n_values) { allreduce(values, n_values, MPI_DOUBLE, MPI_MIN); }

int comm_allreduce_or_int(int flag)
{
    allreduce(&flag, 1, MPI_INT, MPI_LOR);
    return flag;
}

void comm_gather_f64(double value, double *all)
{
    comm_gather_f64_n(&value, 1, all);
}

void comm_gather_f64_n(const double *values, int n, double *all)
{
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Igather(values, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, MPI_COMM_WORLD, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Gather(values, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
}

int64_t comm_shard_values(int64_t n_values, int n_ranks) { return (n_values + n_ranks - 1) / n_ranks; }

/* Counts and displacements of every rank's shard, as MPI takes them (ints: a shard must stay below INT_MAX values;
   fatal otherwise, naming the sizes). The caller frees *counts (displs is in the same allocation). */
static void shard_counts(int64_t n_values, int **counts, int **displs)
{
    int n_ranks = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks));
    const int64_t shard = comm_shard_values(n_values, n_ranks);
    ALDIT_CHECK(shard < INT_MAX && (int64_t)(n_ranks - 1) * shard < INT_MAX,
                "a shard of %lld values over %d ranks exceeds what one MPI call takes (%d): use more ranks",
                (long long)shard, n_ranks, INT_MAX);
    *counts = xmalloc(2 * (size_t)n_ranks * sizeof **counts);
    *displs = *counts + n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        int64_t first = (int64_t)r * shard, count = n_values - first;
        (*counts)[r] = (int)(count < 0 ? 0 : count > shard ? shard : count);
        (*displs)[r] = (int)(first < n_values ? first : n_values);
    }
}

void comm_reduce_scatter_sum_f32(const float *values, int64_t n_values, float *mine)
{
    int *counts, *displs;
    shard_counts(n_values, &counts, &displs);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Ireduce_scatter(values, mine, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Reduce_scatter(values, mine, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    free(counts);
}

void comm_allgather_f32(float *values, int64_t n_values)
{
    int *counts, *displs;
    shard_counts(n_values, &counts, &displs);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, counts, displs, MPI_FLOAT, MPI_COMM_WORLD,
                                  &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values, counts, displs, MPI_FLOAT, MPI_COMM_WORLD));
    free(counts);
}

/* int counts and displacements for MPI (fatal, naming the sizes, past INT_MAX); the caller frees *counts. */
static void int_counts(const int64_t *counts, const int64_t *displs, int **counts_out, int **displs_out)
{
    int n_ranks = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n_ranks));
    *counts_out = xmalloc(2 * (size_t)n_ranks * sizeof **counts_out);
    *displs_out = *counts_out + n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        ALDIT_CHECK(counts[r] >= 0 && displs[r] >= 0 && counts[r] + displs[r] < INT_MAX,
                    "a range of %lld values at %lld exceeds what one MPI call takes (%d values)", (long long)counts[r],
                    (long long)displs[r], INT_MAX);
        (*counts_out)[r] = (int)counts[r];
        (*displs_out)[r] = (int)displs[r];
    }
}

void comm_scatterv_f32(const float *root_values, const int64_t *counts, const int64_t *displs, float *mine)
{
    int *n, *at, rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    int_counts(counts, displs, &n, &at);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Iscatterv(root_values, n, at, MPI_FLOAT, mine, n[rank], MPI_FLOAT, 0, MPI_COMM_WORLD, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Scatterv(root_values, n, at, MPI_FLOAT, mine, n[rank], MPI_FLOAT, 0, MPI_COMM_WORLD));
    free(n);
}

void comm_gatherv_f32(const float *mine, const int64_t *counts, const int64_t *displs, float *root_values)
{
    int *n, *at, rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    int_counts(counts, displs, &n, &at);
    if (watch.on) {
        MPI_Request request;
        MPI_CHECK(MPI_Igatherv(mine, n[rank], MPI_FLOAT, root_values, n, at, MPI_FLOAT, 0, MPI_COMM_WORLD, &request));
        wait_request(&request);
    } else MPI_CHECK(MPI_Gatherv(mine, n[rank], MPI_FLOAT, root_values, n, at, MPI_FLOAT, 0, MPI_COMM_WORLD));
    free(n);
}

double comm_time(void) { return MPI_Wtime(); }

_Noreturn void comm_abort(int code)
{
    int running = 0, n_ranks = 1;
    MPI_Initialized(&running);
    if (running) MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    if (running && n_ranks > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}
