// gpu.cu — CUDA device helpers: error reporting, GPU discovery and selection by node-local rank, memory info.
#include "cuda/gpu.h"

#include <cuda_profiler_api.h>

#include "core/comm.h"

#include <stdio.h>

extern "C" ALDIT_NORETURN void gpu_fail_cuda(cudaError_t status, const char *call, const char *file, int line)
{
    aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "CUDA error %s (%s) in %s", cudaGetErrorName(status),
                   cudaGetErrorString(status), call);
}

extern "C" ALDIT_NORETURN void gpu_fail_cublas(cublasStatus_t status, const char *call, const char *file, int line)
{
    aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "cuBLAS error %d (%s) in %s", (int)status,
                   cublasLtGetStatusString(status), call);
}

extern "C" int gpu_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "no driver / no device" status
        return 0;
    }
    return count;
}

extern "C" int gpu_select(int local_rank)
{
    int count = gpu_count();
    ALDIT_CHECK(count > 0, "no usable GPU (cudaGetDeviceCount found none) for node-local rank %d", local_rank);
    int device = (local_rank < 0 ? 0 : local_rank) % count;
    CUDA_CHECK(cudaSetDevice(device));
    return device;
}

extern "C" void gpu_stream_wait(cudaStream_t stream)
{
    if (!comm_watch_active()) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return;
    }
    static cudaEvent_t mark;  // one per process: a rank drives one GPU from its main thread
    static int mark_device = -1;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (mark_device != device) {
        CUDA_CHECK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
        mark_device = device;
    }
    CUDA_CHECK(cudaEventRecord(mark, stream));
    const double started = comm_time();
    double pause = 0.0;  // polls as cudaStreamSynchronize would: the next launches wait for this wait's end
    for (;;) {
        const cudaError_t status = cudaEventQuery(mark);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady) CUDA_CHECK(status);
        comm_watch_tick(started, &pause);
    }
}

extern "C" unsigned gpu_grid_blocks(int64_t n_items, int threads_per_block, int64_t most_blocks)
{
    const int64_t blocks = (n_items + threads_per_block - 1) / threads_per_block;
    return (unsigned)(blocks < 1 ? 1 : blocks > most_blocks ? most_blocks : blocks);
}

extern "C" int gpu_fastest_candidate(const float *least_ms, const bool *refused, int n, float margin)
{
    int best = 0;
    for (int c = 1; c < n; ++c)
        if (!refused[c] && (refused[best] || least_ms[c] < least_ms[best])) best = c;
    return !refused[0] && best != 0 && least_ms[best] > (1.0f - margin) * least_ms[0] ? 0 : best;
}

extern "C" int gpu_attribute(enum cudaDeviceAttr attribute)
{
    constexpr int kDevices = 64, kAttributes = 2;
    static const cudaDeviceAttr kept[kAttributes] = {cudaDevAttrMultiProcessorCount,
                                                      cudaDevAttrMaxSharedMemoryPerBlockOptin};
    static int values[kDevices][kAttributes];  // 0: not asked yet (both are positive on every GPU)
    int device = 0, value = 0;
    const cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess && gpu_count() == 0) {  // sizing without a GPU (aldit --check on a login node)
        (void)cudaGetLastError();
        if (attribute == cudaDevAttrMultiProcessorCount) return GPU_PLAN_SMS;
        if (attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin) return GPU_PLAN_SHARED_BYTES;
    }
    CUDA_CHECK(status);
    for (int a = 0; a < kAttributes; ++a)
        if (kept[a] == attribute && device < kDevices) {
            if (values[device][a] == 0) CUDA_CHECK(cudaDeviceGetAttribute(&values[device][a], attribute, device));
            return values[device][a];
        }
    CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
    return value;
}

extern "C" void gpu_memory_info(size_t *free_bytes, size_t *total_bytes)
{
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

extern "C" void gpu_profiler(int on)
{
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
}

extern "C" void gpu_describe(char *text, size_t capacity)
{
    int device = 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(text, capacity, "%s, %d SMs, %.1f GiB, sm_%d%d", prop.name, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor);
}
