/* gradsync.h — the gradient all-reduce of the CUDA path: NCCL on the device buffer when built with NCCL, else through host memory and MPI. */
#ifndef ALDIT_GRADSYNC_H
#define ALDIT_GRADSYNC_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "comm.h"

typedef struct gradsync gradsync;

/* Collective, after the rank's GPU is selected: ready to sum fp32 device buffers of up to n_values
   values over all ranks. With NCCL and more than one rank: rank 0 makes the unique id, comm_bcast_bytes
   sends it, every rank joins with ncclCommInitRank and gets its own NCCL stream. Without NCCL: a pinned
   host buffer of n_values floats for MPI. With one rank nothing is made. */
gradsync *gradsync_create(const comm_info *info, int64_t n_values);
void gradsync_free(gradsync *sync);

/* What sums the gradients, for the start-up summary: "NCCL 2.28.9 (2 ranks)", "MPI through host memory
   (2 ranks; this build has no NCCL)" or "none (1 rank)". */
const char *gradsync_method(const gradsync *sync);

/* Collective: sum values[0 .. n_values) (device memory, fp32) over all ranks, in place. The sum includes
   all work queued on `stream` before the call; work queued on `stream` after the call sees the sum.
   NCCL: queued on the NCCL stream behind an event, no host synchronisation. MPI: the buffer goes to the
   host, through comm_allreduce_sum_f32 and back before the call returns. */
void gradsync_allreduce(gradsync *sync, float *values, int64_t n_values, cudaStream_t stream);

/* Seconds the last NCCL all-reduce ran on its stream (0 for MPI, which the caller times on the host, and
   for one rank). Valid once `stream` of that call has been synchronised. */
double gradsync_device_seconds(const gradsync *sync);

#endif
