/* seqpar_gpu.h — the sequence-parallel groups on the GPU (Ulysses): one NCCL communicator per group size, split from the world's once at start-up, and their grouped all-to-all of bf16 rows on each group's own stream. */
#ifndef ALDIT_SEQPAR_GPU_H
#define ALDIT_SEQPAR_GPU_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct seqpar_gpu seqpar_gpu;
typedef struct seqpar_gpu_group seqpar_gpu_group;
struct gradsync;   /* cuda/gradsync.h (not included: this header is read by CUDA sources, comm.h's C11 is not C++) */

/* Collective over every rank, after comm_groups_init (core/comm.h) and gradsync_create, with the GPU selected: for
   every k = 2, 4, ... for which comm_group_get(k) made this rank's group, ncclCommSplit of gradsync's communicator
   (color rank / k, key rank % k, rank in MPI_COMM_WORLD: the same aligned blocks of ranks as comm.c's groups), each with its own stream and
   events. Where gradsync has no NCCL communicator (one rank, or a build without NCCL) no group is made. */
seqpar_gpu *seqpar_gpu_create(struct gradsync *sync, int rank);
/* Groups of k = 2, 4, ..., max_k on this process alone, this rank member `member` of each, without a communicator:
   an all-to-all moves only the own member's part and leaves the others' parts of the receive buffers as they are.
   For aldit-bench, which times one member's compute on one GPU (the exchange's bytes are counted, not sent). */
seqpar_gpu *seqpar_gpu_create_loopback(int max_k, int member);
void seqpar_gpu_free(seqpar_gpu *sp);
/* This rank's group of size k; NULL for k <= 1, a k that was not made, or sp NULL. */
const seqpar_gpu_group *seqpar_gpu_get(const seqpar_gpu *sp, int k);
/* How many groups were made (0 without NCCL). */
int seqpar_gpu_count(const seqpar_gpu *sp);
int seqpar_gpu_size(const seqpar_gpu_group *group);
int seqpar_gpu_rank(const seqpar_gpu_group *group);   /* rank % k, as comm_group_rank */

/* One all-to-all of n_tensors (1..3) bf16 device buffers over the group: for each tensor t and member p,
   send_counts[p] values from send[t] + send_displs[p] go to member p, and recv_counts[p] values from member p land at
   recv[t] + recv_displs[p] (host arrays of the group's size; the own member's part is a device copy). Every member calls
   it with matching counts (what p sends to q is what q receives from p). Queued on the group's stream behind the work
   queued on `stream` so far (an event), and work queued on `stream` afterwards waits for it (another event): nothing
   synchronises the host. Send and receive buffers must not overlap. */
void seqpar_gpu_alltoall_bf16(const seqpar_gpu_group *group, int n_tensors, const gpu_bf16 *const *send,
                              const int64_t *send_counts, const int64_t *send_displs, gpu_bf16 *const *recv,
                              const int64_t *recv_counts, const int64_t *recv_displs, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
