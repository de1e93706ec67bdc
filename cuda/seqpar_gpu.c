/* seqpar_gpu.c — the sequence-parallel groups' NCCL communicators (ncclCommSplit of the world's) and their grouped all-to-all (ncclSend/ncclRecv) on each group's stream, ordered with the compute stream by events. */
#include "config.h"
#include "cuda/seqpar_gpu.h"

#include <stdlib.h>

#include "core/check.h"
#include "core/comm.h"
#include "cuda/gradsync.h"

#ifdef HAVE_NCCL
#include <nccl.h>
#endif

/* Group sizes 2, 4, ..., 2^SEQPAR_MAX_LOG. */
#define SEQPAR_MAX_LOG 16

struct seqpar_gpu_group {
    int size, rank;
    int loopback;                       /* no communicator: only the own member's part moves (seqpar_gpu_create_loopback) */
#ifdef HAVE_NCCL
    ncclComm_t comm;
#endif
    cudaStream_t stream;                /* the group's NCCL stream */
    cudaEvent_t inputs_ready, done;     /* the caller's work before an exchange; the exchange's end */
};

struct seqpar_gpu {
    seqpar_gpu_group *groups[SEQPAR_MAX_LOG + 1];   /* [log2 k] */
    int count;
};

/* log2 of k for a power of two k in 2 .. 2^SEQPAR_MAX_LOG; -1 otherwise. */
static int log2_of(int k)
{
    int log = 0;
    while (log <= SEQPAR_MAX_LOG && (1 << log) < k) log++;
    return log >= 1 && log <= SEQPAR_MAX_LOG && (1 << log) == k ? log : -1;
}

/* A group of size k, this rank its member `member`, with its stream and events (no communicator yet). */
static seqpar_gpu_group *new_group(int k, int member)
{
    seqpar_gpu_group *group = xcalloc(1, sizeof *group);
    group->size = k;
    group->rank = member;
    CUDA_CHECK(cudaStreamCreateWithFlags(&group->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&group->inputs_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&group->done, cudaEventDisableTiming));
    return group;
}

#ifdef HAVE_NCCL
/* Collective: the group of size k of this rank, split from `world`. */
static seqpar_gpu_group *make_group(ncclComm_t world, int rank, int k)
{
    seqpar_gpu_group *group = new_group(k, rank % k);
    /* the world's configuration inherited (non-blocking): the new communicator settled, then the world's state */
    GRADSYNC_NCCL(group->comm, ncclCommSplit(world, rank / k, rank % k, &group->comm, NULL));
    gradsync_nccl_settle(world, (int)ncclInProgress, __FILE__, __LINE__, "ncclCommSplit (the world's state)");
    int n_members = 0, member = 0;
    GRADSYNC_NCCL(group->comm, ncclCommCount(group->comm, &n_members));
    GRADSYNC_NCCL(group->comm, ncclCommUserRank(group->comm, &member));
    ALDIT_CHECK(n_members == k && member == group->rank, "seqpar_gpu: the split for groups of %d made member %d of %d",
                k, member, n_members);
    return group;
}
#endif

seqpar_gpu *seqpar_gpu_create(gradsync *sync, int rank)
{
    seqpar_gpu *sp = xcalloc(1, sizeof *sp);
#ifdef HAVE_NCCL
    ncclComm_t world = gradsync_nccl_comm(sync);
    if (!world) return sp;
    /* only where k divides the ranks (every aligned block whole, as the planner's groups are; the same on every rank,
       as the collective split needs) */
    for (int log = 1; log <= SEQPAR_MAX_LOG && comm_group_get(1 << log) && comm_size() % (1 << log) == 0; log++) {
        sp->groups[log] = make_group(world, rank, 1 << log);
        sp->count++;
    }
#else
    (void)sync;
    (void)rank;
#endif
    return sp;
}

seqpar_gpu *seqpar_gpu_create_loopback(int max_k, int member)
{
    seqpar_gpu *sp = xcalloc(1, sizeof *sp);
    ALDIT_CHECK(member >= 0 && member < max_k, "seqpar_gpu: member %d of a loopback group of %d", member, max_k);
    for (int log = 1; log <= SEQPAR_MAX_LOG && (1 << log) <= max_k; log++) {
        /* the member's place in each smaller aligned group it belongs to, as a world rank's is */
        sp->groups[log] = new_group(1 << log, member % (1 << log));
        sp->groups[log]->loopback = 1;
        sp->count++;
    }
    return sp;
}

void seqpar_gpu_free(seqpar_gpu *sp)
{
    if (!sp) return;
    for (int log = 1; log <= SEQPAR_MAX_LOG; log++) {
        seqpar_gpu_group *group = sp->groups[log];
        if (!group) continue;
#ifdef HAVE_NCCL
        if (!group->loopback) gradsync_nccl_destroy(group->comm);
#endif
        CUDA_CHECK(cudaStreamDestroy(group->stream));
        CUDA_CHECK(cudaEventDestroy(group->inputs_ready));
        CUDA_CHECK(cudaEventDestroy(group->done));
        free(group);
    }
    free(sp);
}

const seqpar_gpu_group *seqpar_gpu_get(const seqpar_gpu *sp, int k)
{
    const int log = log2_of(k);
    return sp && log > 0 ? sp->groups[log] : NULL;
}

int seqpar_gpu_count(const seqpar_gpu *sp) { return sp ? sp->count : 0; }
int seqpar_gpu_size(const seqpar_gpu_group *group) { return group->size; }
int seqpar_gpu_rank(const seqpar_gpu_group *group) { return group->rank; }

/* The own member's part of one tensor: a device copy on the group's stream. */
static void keep_own_part(const seqpar_gpu_group *group, const gpu_bf16 *send, const int64_t *send_counts,
                          const int64_t *send_displs, gpu_bf16 *recv, const int64_t *recv_counts,
                          const int64_t *recv_displs)
{
    const int p = group->rank;
    ALDIT_CHECK(send_counts[p] == recv_counts[p], "seqpar_gpu: member %d keeps %lld values but places %lld", p,
                (long long)send_counts[p], (long long)recv_counts[p]);
    if (send_counts[p] > 0)
        CUDA_CHECK(cudaMemcpyAsync(recv + recv_displs[p], send + send_displs[p], (size_t)send_counts[p] * sizeof(gpu_bf16),
                                   cudaMemcpyDeviceToDevice, group->stream));
}

#ifdef HAVE_NCCL
/* The sends and receives of one tensor to and from every other member (inside ncclGroupStart/End). */
static void exchange_tensor(const seqpar_gpu_group *group, const gpu_bf16 *send, const int64_t *send_counts,
                            const int64_t *send_displs, gpu_bf16 *recv, const int64_t *recv_counts,
                            const int64_t *recv_displs)
{
    for (int p = 0; p < group->size; p++) {
        if (p == group->rank) continue;
        if (send_counts[p] > 0)
            GRADSYNC_NCCL(group->comm, ncclSend(send + send_displs[p], (size_t)send_counts[p], ncclBfloat16, p,
                                                group->comm, group->stream));
        if (recv_counts[p] > 0)
            GRADSYNC_NCCL(group->comm, ncclRecv(recv + recv_displs[p], (size_t)recv_counts[p], ncclBfloat16, p,
                                                group->comm, group->stream));
    }
}
#endif

void seqpar_gpu_alltoall_bf16(const seqpar_gpu_group *group, int n_tensors, const gpu_bf16 *const *send,
                              const int64_t *send_counts, const int64_t *send_displs, gpu_bf16 *const *recv,
                              const int64_t *recv_counts, const int64_t *recv_displs, cudaStream_t stream)
{
    ALDIT_CHECK(group && n_tensors >= 1 && n_tensors <= 3, "seqpar_gpu: an all-to-all of %d tensors%s", n_tensors,
                group ? "" : " without a group");
    CUDA_CHECK(cudaEventRecord(group->inputs_ready, stream));
    CUDA_CHECK(cudaStreamWaitEvent(group->stream, group->inputs_ready, 0));
    for (int t = 0; t < n_tensors; t++)
        keep_own_part(group, send[t], send_counts, send_displs, recv[t], recv_counts, recv_displs);
    if (!group->loopback) {
#ifdef HAVE_NCCL
        GRADSYNC_NCCL(NULL, ncclGroupStart());
        for (int t = 0; t < n_tensors; t++)
            exchange_tensor(group, send[t], send_counts, send_displs, recv[t], recv_counts, recv_displs);
        GRADSYNC_NCCL(group->comm, ncclGroupEnd());  /* a non-blocking group may still be connecting */
#else
        ALDIT_FATAL("seqpar_gpu: an all-to-all without NCCL");   /* no such group is made without it */
#endif
    }
    CUDA_CHECK(cudaEventRecord(group->done, group->stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, group->done, 0));
}
