/* gpu.h — CUDA device helpers: status-checking macros that name file:line, GPU discovery and selection, bf16 on the host. */
#ifndef ALDIT_GPU_H
#define ALDIT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/check.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A bf16 value as its 16 bits, so plain C code can hold, send and convert device tensors. */
typedef uint16_t gpu_bf16;

/* End the job with "aldit: FILE:LINE: CUDA error NAME (message) in CALL" (through aldit_fatal_at). */
ALDIT_NORETURN void gpu_fail_cuda(cudaError_t status, const char *call, const char *file, int line);
ALDIT_NORETURN void gpu_fail_cublas(cublasStatus_t status, const char *call, const char *file, int line);

#define CUDA_CHECK(call) do { cudaError_t cuda_status_ = (call); \
    if (cuda_status_ != cudaSuccess) gpu_fail_cuda(cuda_status_, #call, __FILE__, __LINE__); } while (0)
#define CUBLAS_CHECK(call) do { cublasStatus_t cublas_status_ = (call); \
    if (cublas_status_ != CUBLAS_STATUS_SUCCESS) gpu_fail_cublas(cublas_status_, #call, __FILE__, __LINE__); } while (0)
/* After a kernel launch: a bad configuration shows up here, a fault at the next synchronising call. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

/* Number of GPUs this process can use; 0 when there is none, no driver, or the driver is too old.
   Never fatal: it is how a build with CUDA decides to run on the CPU (and how tests decide to skip). */
int gpu_count(void);

/* Make GPU (local_rank mod gpu_count()) current for this process and return its index; ranks of one
   node get different GPUs while there are enough. Fatal when there is no GPU. */
int gpu_select(int local_rank);

/* An attribute of the current GPU (cudaDeviceGetAttribute), asked once per GPU and attribute and then kept:
   for launch code that sizes grids by it on every launch (SM count, shared memory per block).
   Where the process sees no GPU (workspaces sized for a plan, aldit --check on a login node) the SM count and the
   shared memory are those of GPU_PLAN_*, an H200's; any other attribute is then an error. */
#define GPU_PLAN_SMS 132
#define GPU_PLAN_SHARED_BYTES 232448
int gpu_attribute(enum cudaDeviceAttr attribute);

/* Blocks of `threads_per_block` for a grid-stride pass over n_items items, one item per thread: enough to cover
   them, at least 1, at most most_blocks (the kernels loop over what a grid that size leaves). */
unsigned gpu_grid_blocks(int64_t n_items, int threads_per_block, int64_t most_blocks);

/* Autotuning's choice among n timed candidates, 0 being the heuristic's first: the one of least least_ms[c] among
   those not refused[c], but 0 unless it is faster than candidate 0 by the fraction `margin` (0 when all refused). */
int gpu_fastest_candidate(const float *least_ms, const bool *refused, int n, float margin);

/* Waits for the work queued so far on `stream`: blocking (cudaStreamSynchronize) outside the step watch; inside it
   (comm.h), polls an event and calls comm_watch_tick (without sleeping: no latency added) between tests, so that a rank whose stream waits in an NCCL
   collective for a stopped or stalled rank answers rank 0 and the stall is named at the deadline instead of hanging. */
void gpu_stream_wait(cudaStream_t stream);

/* Free and total bytes of the current GPU's memory. */
void gpu_memory_info(size_t *free_bytes, size_t *total_bytes);

/* One line about the current GPU: "NAME, N SMs, X GiB, sm_MAJMIN". */
void gpu_describe(char *text, size_t capacity);

/* on = 1: waits for the device's queued work, then starts the profiler's capture (cudaProfilerStart: what
   `nsys profile --capture-range=cudaProfilerApi` and `ncu --profile-from-start off` record); 0: waits, then stops it. */
void gpu_profiler(int on);

/* Host-side bf16 conversions: round to nearest even (NaN stays NaN), and exact widening. */
static inline gpu_bf16 gpu_bf16_from_float(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (gpu_bf16)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (gpu_bf16)(bits >> 16);
}

static inline float gpu_float_from_bf16(gpu_bf16 value)
{
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

#ifdef __cplusplus
}
#endif

#endif
