/* gradsync.c — the gradient all-reduce of the CUDA path: NCCL (communicator bootstrapped through MPI) or host copies and MPI. */
#include "config.h"
#include "gradsync.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "gpu.h"

#ifdef HAVE_NCCL
#include <nccl.h>

/* End the job with "aldit: FILE:LINE: NCCL error N (message) in CALL". */
#define NCCL_CHECK(call) do { ncclResult_t nccl_status_ = (call); \
    if (nccl_status_ != ncclSuccess) \
        aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "NCCL error %d (%s) in %s", (int)nccl_status_, \
                       ncclGetErrorString(nccl_status_), #call); } while (0)
#endif

struct gradsync {
    int n_ranks;
    char method[96];
#ifdef HAVE_NCCL
    ncclComm_t comm;
    cudaStream_t stream;                /* the NCCL stream */
    cudaEvent_t ready;                  /* the gradients are complete on the caller's stream */
    cudaEvent_t started, done;          /* around the all-reduce on the NCCL stream (timed) */
    int timed;                          /* an all-reduce was queued since create */
#else
    float *host;                        /* pinned staging buffer */
    int64_t host_capacity;
#endif
};

gradsync *gradsync_create(const comm_info *info, int64_t n_values)
{
    gradsync *sync = xcalloc(1, sizeof *sync);
    sync->n_ranks = info->n_ranks;
    if (info->n_ranks == 1) {
        snprintf(sync->method, sizeof sync->method, "none (1 rank)");
        return sync;
    }
#ifdef HAVE_NCCL
    (void)n_values;
    ncclUniqueId id;
    if (info->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    comm_bcast_bytes(&id, sizeof id);
    NCCL_CHECK(ncclCommInitRank(&sync->comm, info->n_ranks, id, info->rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&sync->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&sync->ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&sync->started));
    CUDA_CHECK(cudaEventCreate(&sync->done));
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    snprintf(sync->method, sizeof sync->method, "NCCL %d.%d.%d (%d ranks)", version / 10000, version / 100 % 100,
             version % 100, info->n_ranks);
#else
    sync->host_capacity = n_values;
    CUDA_CHECK(cudaMallocHost((void **)&sync->host, (size_t)(n_values > 0 ? n_values : 1) * sizeof(float)));
    snprintf(sync->method, sizeof sync->method, "MPI through host memory (%d ranks; this build has no NCCL)",
             info->n_ranks);
#endif
    return sync;
}

void gradsync_free(gradsync *sync)
{
    if (!sync) return;
    if (sync->n_ranks > 1) {
#ifdef HAVE_NCCL
        NCCL_CHECK(ncclCommDestroy(sync->comm));
        CUDA_CHECK(cudaStreamDestroy(sync->stream));
        CUDA_CHECK(cudaEventDestroy(sync->ready));
        CUDA_CHECK(cudaEventDestroy(sync->started));
        CUDA_CHECK(cudaEventDestroy(sync->done));
#else
        CUDA_CHECK(cudaFreeHost(sync->host));
#endif
    }
    free(sync);
}

const char *gradsync_method(const gradsync *sync) { return sync->method; }

void gradsync_allreduce(gradsync *sync, float *values, int64_t n_values, cudaStream_t stream)
{
    if (sync->n_ranks == 1 || n_values == 0) return;
#ifdef HAVE_NCCL
    CUDA_CHECK(cudaEventRecord(sync->ready, stream));
    CUDA_CHECK(cudaStreamWaitEvent(sync->stream, sync->ready, 0));
    CUDA_CHECK(cudaEventRecord(sync->started, sync->stream));
    NCCL_CHECK(ncclAllReduce(values, values, (size_t)n_values, ncclFloat32, ncclSum, sync->comm, sync->stream));
    CUDA_CHECK(cudaEventRecord(sync->done, sync->stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, sync->done, 0));
    sync->timed = 1;
#else
    ALDIT_CHECK(n_values <= sync->host_capacity, "gradsync: %lld values, more than the %lld it was made for",
                (long long)n_values, (long long)sync->host_capacity);
    const size_t n_bytes = (size_t)n_values * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(sync->host, values, n_bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    comm_allreduce_sum_f32(sync->host, (size_t)n_values);
    CUDA_CHECK(cudaMemcpyAsync(values, sync->host, n_bytes, cudaMemcpyHostToDevice, stream));
    /* the pinned buffer must not be rewritten by the next call before this copy has read it */
    CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

double gradsync_device_seconds(const gradsync *sync)
{
#ifdef HAVE_NCCL
    if (sync->n_ranks == 1 || !sync->timed) return 0.0;
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, sync->started, sync->done));
    return milliseconds * 1e-3;
#else
    (void)sync;
    return 0.0;
#endif
}
