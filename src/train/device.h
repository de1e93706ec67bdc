/* device.h — [run] device resolved on every rank, and the backend of that device (the one place that knows which backends this build has). */
#ifndef ALDIT_DEVICE_H
#define ALDIT_DEVICE_H

#include "backend/backend.h"

/* Collective: [run] device resolved. cpu stays cpu; auto is cuda when this build has CUDA and every rank sees a
   GPU, else cpu; cuda without CUDA in the build or without a GPU on some rank is an error: rank 0 says why and
   every rank gets -1. A deck asking for [train] recompute = block on the CPU (which keeps every activation) is an
   error too (-2: bad input), and so is device = cuda for a model family without a GPU model (layout_family_on_gpu). */
int device_resolve(const deck *config, const comm_info *info);

/* The plan and create functions of the backend of a resolved device. */
backend_plan_fn device_plan_fn(int device);

/* For aldit --check (collective): device_resolve, except that [run] device = cuda on a node where some rank sees no
   GPU (a login node planning a GPU job) resolves to cuda with *offline = 1: device_check_plan_fn then plans each
   rank as one GPU of balance.device_mem bytes of its own, nothing measured. So does device = cuda for a model family
   without a GPU model (layout_family_on_gpu; device_resolve refuses to train it there): its plan is the layout's
   formula (backend/plan_layout.h). */
int device_resolve_check(const deck *config, const comm_info *info, int *offline);
backend_plan_fn device_check_plan_fn(const deck *config, int device, int offline);
backend_create_fn device_create_fn(int device);
/* aldit-sim: the plan aldit --check makes of a GPU job where no GPU is visible (each rank one GPU of
   balance.device_mem bytes), so that both give one memory answer; NULL where this build has no CUDA backend or the
   deck's model family no GPU model (then aldit-sim plans by the layout's formula, as aldit --check does). */
backend_plan_fn device_offline_gpu_plan_fn(const deck *config);

#endif
