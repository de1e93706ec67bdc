/* device.c — [run] device resolved on every rank, and the backend of that device. */
#include "config.h"
#include "train/device.h"

#include <stdio.h>
#include <stdlib.h>

#include "backend/backend_cpu.h"
#include "backend/plan_layout.h"
#include "model/layout.h"
#ifdef HAVE_CUDA
#include "cuda/backend_cuda.h"
#include "cuda/gpu.h"
#endif

/* The device resolved, or -1 (rank 0 said why). */
static int resolve(const deck *config, const comm_info *info)
{
    /* auto: a family without a GPU model runs on the CPU (device_resolve refuses cuda for it) */
    if (config->run.device == DEVICE_CPU || !layout_family_on_gpu(config->model.family)) return DEVICE_CPU;
#ifdef HAVE_CUDA
    int some_rank_without_gpu = comm_allreduce_or_int(gpu_count() == 0);
    if (!some_rank_without_gpu) return DEVICE_CUDA;
    if (config->run.device == DEVICE_AUTO) return DEVICE_CPU;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (info->rank == 0)
        fprintf(stderr, "aldit: error: [run] device = cuda, but %s sees no GPU (cudaGetDeviceCount found none%s%s%s); "
                "run on a GPU node, or set device = cpu or auto\n",
                info->n_ranks > 1 ? "at least one rank" : "this process", visible ? ", CUDA_VISIBLE_DEVICES = '" : "",
                visible ? visible : "", visible ? "'" : "");
#else
    if (config->run.device == DEVICE_AUTO) return DEVICE_CPU;
    if (info->rank == 0)
        fprintf(stderr, "aldit: error: [run] device = cuda, but this build of aldit has no CUDA backend (configure "
                "--with-cuda); set device = cpu or auto\n");
#endif
    return -1;
}

int device_resolve(const deck *config, const comm_info *info)
{
    if (config->run.device == DEVICE_CUDA && !layout_family_on_gpu(config->model.family)) {
        if (info->rank == 0)
            fprintf(stderr, "aldit: error: [run] device = cuda, but model.family = %s has no GPU model yet (only the "
                    "CPU model): aldit --check and aldit-sim plan its GPU runs (by the layout's GPU memory); to train, "
                    "set run.device = cpu or auto\n", deck_family_name(config->model.family));
        return -2;
    }
    int device = resolve(config, info);
    if (device != DEVICE_CPU || config->train.recompute != RECOMPUTE_BLOCK) return device;
    /* the balancer's memory model would assume recomputation and plan micro-batches that overrun host memory */
    if (info->rank == 0 && config->run.device == DEVICE_AUTO)
        fprintf(stderr, "aldit: error: [train] recompute = block needs the GPU backend, and [run] device = auto found "
                "%s, so it would train on the CPU, which keeps every block's activations; to plan a GPU "
                "job here (a login node), add run.device=cuda to aldit --check; to train on the CPU, set "
                "train.recompute = none\n", info->n_ranks > 1 ? "a rank without a GPU" : "no GPU");
    else if (info->rank == 0)
        fprintf(stderr, "aldit: error: [train] recompute = block is not available on the CPU backend ([run] device = "
                "cpu), which keeps every block's activations; set train.recompute = none, or device = cuda on GPUs\n");
    return -2;
}

int device_resolve_check(const deck *config, const comm_info *info, int *offline)
{
    *offline = 0;
    if (config->run.device == DEVICE_CUDA && !layout_family_on_gpu(config->model.family)) {
        *offline = 1; /* planned by the layout's formula (device_check_plan_fn) */
        return DEVICE_CUDA;
    }
#ifdef HAVE_CUDA
    if (config->run.device == DEVICE_CUDA && comm_allreduce_or_int(gpu_count() == 0)) {
        *offline = 1;
        return DEVICE_CUDA;
    }
#endif
    return device_resolve(config, info);
}

backend_plan_fn device_check_plan_fn(const deck *config, int device, int offline)
{
    if (device == DEVICE_CUDA && !layout_family_on_gpu(config->model.family)) return backend_layout_gpu_plan;
#ifdef HAVE_CUDA
    if (device == DEVICE_CUDA && offline) return backend_cuda_plan_offline;
#endif
    (void)offline;
    return device_plan_fn(device);
}

backend_plan_fn device_offline_gpu_plan_fn(const deck *config)
{
    if (!layout_family_on_gpu(config->model.family)) return NULL;
#ifdef HAVE_CUDA
    return backend_cuda_plan_offline;
#else
    return NULL;
#endif
}

backend_plan_fn device_plan_fn(int device)
{
#ifdef HAVE_CUDA
    if (device == DEVICE_CUDA) return backend_cuda_plan;
#endif
    (void)device;
    return backend_cpu_plan;
}

backend_create_fn device_create_fn(int device)
{
#ifdef HAVE_CUDA
    if (device == DEVICE_CUDA) return backend_cuda_create;
#endif
    (void)device;
    return backend_cpu_create;
}
