/* gradsync.h — the GPU ranks' collectives: the gradient all-reduce (NCCL on the device buffer when built with NCCL, else through host memory and MPI) and the sharded state's in-place all-gather, reduce-scatter and small sums on NCCL's stream. */
#ifndef ALDIT_GRADSYNC_H
#define ALDIT_GRADSYNC_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/comm.h"
#include "cuda/gpu.h"

typedef struct gradsync gradsync;

/* Collective, after the rank's GPU is selected: ready to sum fp32 device buffers of up to n_values
   values over all ranks. With NCCL and more than one rank (or shard_collectives 1: also with one rank, so that a
   sharded state's collectives run through NCCL there too): rank 0 makes the unique id, comm_bcast_bytes
   sends it, every rank joins a non-blocking communicator (ncclCommInitRankConfig; blocking where
   ALDIT_NCCL_BLOCKING=1 is in the environment) and gets its own NCCL stream. Without NCCL: a pinned
   host buffer of n_values floats for MPI (shard_collectives with more than one rank is then fatal: the CUDA
   backend refuses a sharded mode before). With one rank otherwise nothing is made. */
gradsync *gradsync_create(const comm_info *info, int64_t n_values, int shard_collectives);
/* Collective: with NCCL and more than one rank, one all-reduce of up to 64 MiB (zeros, on a temporary
   buffer; min(n_values, 16 Mi) floats) makes NCCL connect the ranks now rather than in the first sum,
   which would otherwise pay for it (about 2 s on two H200s); waits for it. Otherwise nothing. */
void gradsync_connect(gradsync *sync, int64_t n_values);
void gradsync_free(gradsync *sync);

/* 1 where several ranks may drive one GPU through NCCL: a build with NCCL 2.30.3 or later (the library loaded, by
   ncclGetVersion) and NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment (NCCL's experimental multi-rank mode; earlier
   NCCLs refuse with "Duplicate GPU detected"). A build without NCCL sums through MPI and host memory: 1 as well.
   *version receives NCCL's version code (e.g. 23203; 0 without NCCL). Not collective. */
int gradsync_ranks_may_share_gpu(int *version);

/* What sums the gradients, for the start-up summary: "NCCL 2.28.9 (2 ranks)", "MPI through host memory
   (2 ranks; this build has no NCCL)" or "none (1 rank)". */
const char *gradsync_method(const gradsync *sync);

/* Collective: sum values[0 .. n_values) (device memory, fp32) over all ranks, in place. The sum includes
   all work queued on `stream` before the call; work queued on `stream` after the call sees the sum.
   NCCL: queued on the NCCL stream behind an event, no host synchronisation. MPI: the buffer goes to the
   host, through comm_allreduce_sum_f32 and back before the call returns. It is gradsync_begin, one
   gradsync_ready of the whole buffer and gradsync_finish. */
void gradsync_allreduce(gradsync *sync, float *values, int64_t n_values, cudaStream_t stream);

/* The same sum in buckets that overlap the work producing the values (the backward; gpu_model_set_grads_ready
   reports its ranges), every rank making the same calls in the same order:
   - gradsync_begin: a sum of values[0 .. n_values) starts; bucket_bytes is the size from which a bucket is
     launched (0: nothing is launched before gradsync_finish, one all-reduce in all).
   - gradsync_ready: values [first, first + count) are final once the work queued on `stream` so far is
     done. Adjacent ranges join the pending bucket; a bucket of at least bucket_bytes, or a range not
     adjacent to the pending one, launches the pending bucket on the NCCL stream behind an event on `stream`
     (no host synchronisation). Ranges must not overlap.
   - gradsync_finish: launches what is pending, checks that the ranges covered all n_values values (fatal
     otherwise), and makes work queued on `stream` after it see the whole sum.
   Without NCCL the ranges are only counted and the whole buffer goes through MPI in gradsync_finish. */
void gradsync_begin(gradsync *sync, float *values, int64_t n_values, double bucket_bytes);
void gradsync_ready(gradsync *sync, int64_t first, int64_t count, cudaStream_t stream);
void gradsync_finish(gradsync *sync, cudaStream_t stream);

/* Of the last sum, valid once `stream` of its gradsync_finish has been synchronised (0 for one rank):
   the seconds from the end of the work before gradsync_finish on `stream` to the end of the last bucket
   on the NCCL stream, the all-reduce time the step could not hide (MPI: 0, the caller times it on the
   host), and the number of all-reduce calls it took. */
double gradsync_device_seconds(const gradsync *sync);
int gradsync_buckets(const gradsync *sync);

/* ---- the sharded state's collectives (cuda/shard_gpu.h) -------------------------------------------
   Each queues one NCCL call on the NCCL stream, gradsync_stream, and returns: the caller orders it against its
   own streams with events (nothing here synchronises), and every rank makes the same calls in the same order.
   In place; `piece` values per rank, rank r's piece at values + r * piece of a buffer of n_ranks * piece values.
   Built without NCCL, with one rank, they do nothing (in place, nothing moves); with more, they are fatal. */
/* 1 when gradsync_stream exists (an NCCL communicator was made). */
int gradsync_has_stream(const gradsync *sync);
cudaStream_t gradsync_stream(const gradsync *sync);
/* Every rank's piece (bf16) to every rank: ncclAllGather from this rank's piece into the whole buffer. */
void gradsync_all_gather_bf16(gradsync *sync, gpu_bf16 *values, int64_t piece);
void gradsync_all_gather_f32(gradsync *sync, float *values, int64_t piece);
/* The sum over ranks of the whole buffer (fp32), of which this rank gets its piece (ncclReduceScatter, sum, into
   values + rank * piece; the rest of the buffer is left as NCCL leaves it). */
void gradsync_reduce_scatter_f32(gradsync *sync, float *values, int64_t piece);
/* values[0 .. n_values) summed over ranks, in place (ncclAllReduce). */
void gradsync_sum_f32(gradsync *sync, float *values, int64_t n_values);
void gradsync_sum_f64(gradsync *sync, double *values, int64_t n_values);

/* The world's NCCL communicator, for the sequence-parallel groups' split (cuda/seqpar_gpu.h); NULL where none was made
   (one rank without shard collectives, or a build without NCCL). The type is NCCL's ncclComm_t. */
struct ncclComm;
struct ncclComm *gradsync_nccl_comm(const gradsync *sync);

/* The end of an NCCL call on a communicator of this build (the world's above and the groups split from it are
   non-blocking: a call that must wait, e.g. for a peer to connect, returns ncclInProgress instead of holding the host
   inside NCCL). `result` is the call's ncclResult_t; ncclInProgress is waited out by polling ncclCommGetAsyncError,
   under the step watch where one is on (comm_watch_tick: a rank stopped while this one waits is named at the
   deadline, as in any watched wait) and without a deadline otherwise. Any other result ends the job with
   "FILE:LINE: NCCL error N (message) in CALL: NCCL's last error". No-op in a build without NCCL. */
void gradsync_nccl_settle(struct ncclComm *comm, int result, const char *file, int line, const char *call);
/* In the files that own NCCL calls (nccl.h included): `call` on communicator `comm` (NULL for a call that takes
   none), then gradsync_nccl_settle. */
#define GRADSYNC_NCCL(comm, call) do { const int gradsync_result_ = (int)(call); \
    gradsync_nccl_settle((comm), gradsync_result_, __FILE__, __LINE__, #call); } while (0)
/* Finalize (settled as above) and destroy a communicator of this build. */
void gradsync_nccl_destroy(struct ncclComm *comm);

#endif
