/* gradsync.c — the gradient all-reduce of the CUDA path: NCCL (communicator bootstrapped through MPI) or host copies and MPI. */
#include "config.h"
#include "cuda/gradsync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "cuda/gpu.h"

#ifdef HAVE_NCCL
#include <nccl.h>

/* End the job with "aldit: FILE:LINE: NCCL error N (message) in CALL" (calls that take no communicator). */
#define NCCL_CHECK(call) do { ncclResult_t nccl_status_ = (call); \
    if (nccl_status_ != ncclSuccess) \
        aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "NCCL error %d (%s) in %s", (int)nccl_status_, \
                       ncclGetErrorString(nccl_status_), #call); } while (0)
#endif

/* Values of the all-reduce that connects the ranks at creation (64 MiB of fp32, the default bucket). */
#define GRADSYNC_WARMUP_VALUES ((int64_t)16 << 20)
/* The first NCCL whose experimental multi-rank mode lets several ranks share one GPU (NCCL_MULTI_RANK_GPU_ENABLE). */
#define GRADSYNC_NCCL_MULTI_RANK_VERSION 23003

struct gradsync {
    int n_ranks, rank;
    int nccl;                           /* an NCCL communicator was made (more than one rank, or shard collectives) */
    char method[96];
    /* the sum under way (gradsync_begin .. gradsync_finish) */
    float *values;
    int64_t n_values, covered;          /* values reported ready so far */
    int64_t pending_first, pending_end; /* the bucket not launched yet: [first, end), empty when equal */
    double bucket_bytes;
    int buckets;                        /* all-reduce calls launched for the sum */
#ifdef HAVE_NCCL
    ncclComm_t comm;
    cudaStream_t stream;                /* the NCCL stream */
    cudaEvent_t ready;                  /* a bucket's values are complete on the caller's stream */
    cudaEvent_t compute_done, done;     /* end of the caller's work at finish; end of the last bucket (timed) */
    int timed;                          /* a sum with NCCL work has finished since create */
#else
    float *host;                        /* pinned staging buffer */
    int64_t host_capacity;
#endif
};

gradsync *gradsync_create(const comm_info *info, int64_t n_values, int shard_collectives)
{
    gradsync *sync = xcalloc(1, sizeof *sync);
    sync->n_ranks = info->n_ranks;
    sync->rank = info->rank;
#ifdef HAVE_NCCL
    if (info->n_ranks == 1 && !shard_collectives) {
        snprintf(sync->method, sizeof sync->method, "none (1 rank)");
        return sync;
    }
    (void)n_values;
    sync->nccl = 1;
    ncclUniqueId id;
    if (info->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    comm_bcast_bytes(&id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    /* no host wait inside NCCL: gradsync_nccl_settle waits, under the watch (ALDIT_NCCL_BLOCKING=1: NCCL waits) */
    const char *blocking = getenv("ALDIT_NCCL_BLOCKING");
    config.blocking = blocking && strcmp(blocking, "1") == 0;
    GRADSYNC_NCCL(sync->comm, ncclCommInitRankConfig(&sync->comm, info->n_ranks, id, info->rank, &config));
    /* the highest priority: a bucket's all-reduce gets its SMs ahead of the backward's kernels */
    int lowest_priority = 0, highest_priority = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority));
    CUDA_CHECK(cudaStreamCreateWithPriority(&sync->stream, cudaStreamNonBlocking, highest_priority));
    CUDA_CHECK(cudaEventCreateWithFlags(&sync->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&sync->compute_done));
    CUDA_CHECK(cudaEventCreate(&sync->done));
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    snprintf(sync->method, sizeof sync->method, "NCCL %d.%d.%d (%d rank%s)", version / 10000, version / 100 % 100,
             version % 100, info->n_ranks, info->n_ranks == 1 ? "" : "s");
#else
    if (info->n_ranks == 1) {
        snprintf(sync->method, sizeof sync->method, "none (1 rank)");
        return sync;
    }
    ALDIT_CHECK(!shard_collectives, "gradsync: the sharded state's collectives need NCCL with more than one rank");
    sync->host_capacity = n_values;
    CUDA_CHECK(cudaMallocHost((void **)&sync->host, (size_t)(n_values > 0 ? n_values : 1) * sizeof(float)));
    snprintf(sync->method, sizeof sync->method, "MPI through host memory (%d ranks; this build has no NCCL)",
             info->n_ranks);
#endif
    return sync;
}

int gradsync_ranks_may_share_gpu(int *version)
{
    *version = 0;
#ifdef HAVE_NCCL
    NCCL_CHECK(ncclGetVersion(version));
    const char *enabled = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    return *version >= GRADSYNC_NCCL_MULTI_RANK_VERSION && enabled && strcmp(enabled, "1") == 0;
#else
    return 1;
#endif
}

void gradsync_connect(gradsync *sync, int64_t n_values)
{
    if (sync->n_ranks == 1) return;
#ifdef HAVE_NCCL
    /* NCCL connects the ranks on the first collective that needs a connection (measured 1.9-2.0 s on two
       H200s, charged to the first training step otherwise): one all-reduce the size of a large bucket */
    const int64_t warmup_values = n_values < GRADSYNC_WARMUP_VALUES ? n_values : GRADSYNC_WARMUP_VALUES;
    if (warmup_values > 0) {
        float *warmup = NULL;
        CUDA_CHECK(cudaMalloc((void **)&warmup, (size_t)warmup_values * sizeof(float)));
        CUDA_CHECK(cudaMemsetAsync(warmup, 0, (size_t)warmup_values * sizeof(float), sync->stream));
        GRADSYNC_NCCL(sync->comm, ncclAllReduce(warmup, warmup, (size_t)warmup_values, ncclFloat32, ncclSum,
                                                sync->comm, sync->stream));
        CUDA_CHECK(cudaStreamSynchronize(sync->stream));
        CUDA_CHECK(cudaFree(warmup));
    }
#else
    (void)n_values;
#endif
}

void gradsync_free(gradsync *sync)
{
    if (!sync) return;
#ifdef HAVE_NCCL
    if (sync->nccl) {
        gradsync_nccl_destroy(sync->comm);
        CUDA_CHECK(cudaStreamDestroy(sync->stream));
        CUDA_CHECK(cudaEventDestroy(sync->ready));
        CUDA_CHECK(cudaEventDestroy(sync->compute_done));
        CUDA_CHECK(cudaEventDestroy(sync->done));
    }
#else
    if (sync->n_ranks > 1) CUDA_CHECK(cudaFreeHost(sync->host));
#endif
    free(sync);
}

const char *gradsync_method(const gradsync *sync) { return sync->method; }

void gradsync_nccl_settle(struct ncclComm *comm, int result, const char *file, int line, const char *call)
{
#ifdef HAVE_NCCL
    ncclResult_t state = (ncclResult_t)result;
    const double started = comm_time();
    double pause = 1e-5;
    while (state == ncclInProgress) {
        if (comm_watch_active()) comm_watch_tick(started, &pause);
        else if (comm_time() - started > COMM_WATCH_SPIN_S) {
            const struct timespec nap = {0, (long)(pause * 1e9)};
            nanosleep(&nap, NULL);
            pause = pause < 1e-3 ? 2.0 * pause : 1e-3;
        }
        const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
        if (asked != ncclSuccess) state = asked;
    }
    if (state != ncclSuccess)
        aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "NCCL error %d (%s) in %s: %s", (int)state,
                       ncclGetErrorString(state), call, ncclGetLastError(comm));
#else
    (void)comm, (void)result, (void)file, (void)line, (void)call;
#endif
}

void gradsync_nccl_destroy(struct ncclComm *comm)
{
#ifdef HAVE_NCCL
    GRADSYNC_NCCL(comm, ncclCommFinalize(comm));  /* its work flushed and waited for, as a non-blocking one asks */
    const ncclResult_t destroyed = ncclCommDestroy(comm);
    if (destroyed != ncclSuccess && destroyed != ncclInProgress)  /* the handle is gone: nothing to poll */
        aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "NCCL error %d (%s) in ncclCommDestroy", (int)destroyed,
                       ncclGetErrorString(destroyed));
#else
    (void)comm;
#endif
}

struct ncclComm *gradsync_nccl_comm(const gradsync *sync)
{
#ifdef HAVE_NCCL
    return sync->nccl ? sync->comm : NULL;
#else
    (void)sync;
    return NULL;
#endif
}

void gradsync_begin(gradsync *sync, float *values, int64_t n_values, double bucket_bytes)
{
    ALDIT_CHECK(n_values >= 0 && bucket_bytes >= 0.0, "gradsync: %lld values in buckets of %g bytes",
                (long long)n_values, bucket_bytes);
    sync->values = values;
    sync->n_values = n_values;
    sync->covered = sync->pending_first = sync->pending_end = 0;
    sync->bucket_bytes = bucket_bytes;
    sync->buckets = 0;
}

/* Queue the pending bucket's all-reduce on the NCCL stream, behind the work queued on `stream` so far. */
static void launch_pending(gradsync *sync, cudaStream_t stream)
{
    const int64_t count = sync->pending_end - sync->pending_first;
    if (count == 0) return;
#ifdef HAVE_NCCL
    float *bucket = sync->values + sync->pending_first;
    CUDA_CHECK(cudaEventRecord(sync->ready, stream));
    CUDA_CHECK(cudaStreamWaitEvent(sync->stream, sync->ready, 0));
    GRADSYNC_NCCL(sync->comm,
                  ncclAllReduce(bucket, bucket, (size_t)count, ncclFloat32, ncclSum, sync->comm, sync->stream));
    sync->buckets++;
#else
    (void)stream;
#endif
    sync->pending_first = sync->pending_end = 0;
}

void gradsync_ready(gradsync *sync, int64_t first, int64_t count, cudaStream_t stream)
{
    ALDIT_CHECK(first >= 0 && count >= 0 && first + count <= sync->n_values,
                "gradsync: values [%lld, %lld) reported ready, outside the %lld being summed", (long long)first,
                (long long)(first + count), (long long)sync->n_values);
    if (sync->n_ranks == 1 || count == 0) {
        sync->covered += count;
        return;
    }
    const int pending = sync->pending_end > sync->pending_first;
    if (pending && first + count == sync->pending_first) sync->pending_first = first;
    else if (pending && first == sync->pending_end) sync->pending_end = first + count;
    else {
        launch_pending(sync, stream);
        sync->pending_first = first;
        sync->pending_end = first + count;
    }
    sync->covered += count;
    const double pending_bytes = (double)(sync->pending_end - sync->pending_first) * sizeof(float);
    if (sync->bucket_bytes > 0.0 && pending_bytes >= sync->bucket_bytes) launch_pending(sync, stream);
}

void gradsync_finish(gradsync *sync, cudaStream_t stream)
{
    ALDIT_CHECK(sync->covered == sync->n_values,
                "gradsync: %lld of the %lld values were reported ready before the all-reduce's end: a range was "
                "missed or reported twice", (long long)sync->covered, (long long)sync->n_values);
    if (sync->n_ranks == 1 || sync->n_values == 0) return;
#ifdef HAVE_NCCL
    CUDA_CHECK(cudaEventRecord(sync->compute_done, stream));
    launch_pending(sync, stream);
    CUDA_CHECK(cudaEventRecord(sync->done, sync->stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, sync->done, 0));
    sync->timed = 1;
#else
    ALDIT_CHECK(sync->n_values <= sync->host_capacity, "gradsync: %lld values, more than the %lld it was made for",
                (long long)sync->n_values, (long long)sync->host_capacity);
    const size_t n_bytes = (size_t)sync->n_values * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(sync->host, sync->values, n_bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    comm_allreduce_sum_f32(sync->host, (size_t)sync->n_values);
    CUDA_CHECK(cudaMemcpyAsync(sync->values, sync->host, n_bytes, cudaMemcpyHostToDevice, stream));
    /* the pinned buffer must not be rewritten by the next call before this copy has read it */
    CUDA_CHECK(cudaStreamSynchronize(stream));
    sync->buckets = 1;
#endif
}

void gradsync_allreduce(gradsync *sync, float *values, int64_t n_values, cudaStream_t stream)
{
    gradsync_begin(sync, values, n_values, 0.0);
    gradsync_ready(sync, 0, n_values, stream);
    gradsync_finish(sync, stream);
}

double gradsync_device_seconds(const gradsync *sync)
{
#ifdef HAVE_NCCL
    if (sync->n_ranks == 1 || !sync->timed) return 0.0;
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, sync->compute_done, sync->done));
    return milliseconds * 1e-3;
#else
    (void)sync;
    return 0.0;
#endif
}

int gradsync_buckets(const gradsync *sync) { return sync->buckets; }

/* ---- the sharded state's collectives --------------------------------------------------------------- */

int gradsync_has_stream(const gradsync *sync) { return sync->nccl; }

cudaStream_t gradsync_stream(const gradsync *sync)
{
    ALDIT_CHECK(sync->nccl, "gradsync: no communication stream (made without shard collectives)");
#ifdef HAVE_NCCL
    return sync->stream;
#else
    return 0;
#endif
}

/* Fatal unless the shard collectives can run: NCCL's, or nothing to do for one rank without it. */
static int shard_collective_runs(const gradsync *sync, const char *what)
{
    if (sync->nccl) return 1;
    ALDIT_CHECK(sync->n_ranks == 1, "gradsync: %s over %d ranks needs NCCL", what, sync->n_ranks);
    return 0; /* one rank, in place: nothing moves */
}

/* In place: rank r's piece of `piece` values (of `bytes` each, fp32 or bf16) at r piece, gathered to every rank. */
static void all_gather(gradsync *sync, void *values, int64_t piece, size_t bytes)
{
    ALDIT_CHECK(piece >= 0, "gradsync: an all-gather of %lld values per rank", (long long)piece);
    if (piece == 0 || !shard_collective_runs(sync, "an all-gather")) return; /* without NCCL nothing moves */
#ifdef HAVE_NCCL
    const char *own = (const char *)values + (size_t)sync->rank * (size_t)piece * bytes;
    const ncclDataType_t type = bytes == sizeof(float) ? ncclFloat32 : ncclBfloat16;
    GRADSYNC_NCCL(sync->comm, ncclAllGather(own, values, (size_t)piece, type, sync->comm, sync->stream));
#else
    (void)values;
    (void)bytes;
#endif
}

void gradsync_all_gather_bf16(gradsync *sync, gpu_bf16 *values, int64_t piece)
{
    all_gather(sync, values, piece, sizeof(gpu_bf16));
}

void gradsync_all_gather_f32(gradsync *sync, float *values, int64_t piece)
{
    all_gather(sync, values, piece, sizeof(float));
}

void gradsync_reduce_scatter_f32(gradsync *sync, float *values, int64_t piece)
{
    (void)values; /* without NCCL nothing moves */
    ALDIT_CHECK(piece >= 0, "gradsync: a reduce-scatter of %lld values per rank", (long long)piece);
    if (piece == 0 || !shard_collective_runs(sync, "a reduce-scatter")) return;
#ifdef HAVE_NCCL
    float *own = values + (int64_t)sync->rank * piece;
    GRADSYNC_NCCL(sync->comm, ncclReduceScatter(values, own, (size_t)piece, ncclFloat32, ncclSum, sync->comm,
                                                sync->stream));
#endif
}

void gradsync_sum_f32(gradsync *sync, float *values, int64_t n_values)
{
    (void)values; /* without NCCL nothing moves */
    if (n_values <= 0 || !shard_collective_runs(sync, "an all-reduce")) return;
#ifdef HAVE_NCCL
    GRADSYNC_NCCL(sync->comm,
                  ncclAllReduce(values, values, (size_t)n_values, ncclFloat32, ncclSum, sync->comm, sync->stream));
#endif
}

void gradsync_sum_f64(gradsync *sync, double *values, int64_t n_values)
{
    (void)values; /* without NCCL nothing moves */
    if (n_values <= 0 || !shard_collective_runs(sync, "an all-reduce")) return;
#ifdef HAVE_NCCL
    GRADSYNC_NCCL(sync->comm,
                  ncclAllReduce(values, values, (size_t)n_values, ncclFloat64, ncclSum, sync->comm, sync->stream));
#endif
}
