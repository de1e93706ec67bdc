/* cuda_ulysses_harness.h — what the GPU sequence-parallel test programs (test_cuda_ulysses, test_cuda_mmdit_ulysses) share: one micro-batch run alone or on a group of k over NCCL, the gradient's comparison against the lone run, and the TAP main over group sizes 2 and 4, the cases and the model modes. Built with CUDA only. */
#ifndef ALDIT_CUDA_ULYSSES_HARNESS_H
#define ALDIT_CUDA_ULYSSES_HARNESS_H

#include <stddef.h>

#include "core/comm.h"
#include "cuda/model_gpu.h"
#include "cuda/seqpar_gpu.h"
#include "model/model.h"

#define ULYSSES_GPU_LOSS_TOLERANCE 2e-2       /* relative, as tests/test_cuda_model.c against the CPU */
#define ULYSSES_GPU_GRADIENT_TOLERANCE 5e-2   /* relative, whole vector and each parameter */
#define ULYSSES_GPU_MAX_SAMPLES 3             /* a case's samples at the most */

typedef struct {
    double loss, sample_loss[ULYSSES_GPU_MAX_SAMPLES];
    double *grads;   /* [n_weights], summed over the group; free() it */
} ulysses_gpu_result;

/* One forward/backward of `batch` on gm (holding m's weights) with this rank's group of k (1: alone), the loss,
   per-sample losses and gradients summed over the group. Collective over the group for k > 1. */
ulysses_gpu_result ulysses_gpu_run(gpu_model *gm, const model *m, const model_batch *batch, int k, int rank);

/* The gradient part of a comparison of got to want whose worst fraction of its tolerance so far is `worst` (named in
   `where`): the whole gradient's relative difference (set in *whole_out; "the gradient"), then each parameter's
   against the larger of its floors[p] (floors NULL: none) and 1e-3 of the whole reference gradient's norm ("the
   gradient of NAME"), each over ULYSSES_GPU_GRADIENT_TOLERANCE. Returns the worst fraction, `where` naming it. */
double ulysses_gpu_gradient_worst(const model *m, const ulysses_gpu_result *got, const ulysses_gpu_result *want,
                                  const double *floors, double worst, char *where, size_t size, double *whole_out);

typedef struct {
    gpu_recompute recompute;
    gpu_attention_choice attention;
    const char *name;
} ulysses_gpu_mode;

typedef struct {
    void (*make_model)(model *m);    /* the test model, the same on every rank */
    int n_cases;
    const char *(*case_name)(int c);
    const ulysses_gpu_mode *modes;
    int n_modes;
    /* Collective: case c in `mode` on groups of k; 1 on any rank's failure, the ranks' largest relative difference
       of the whole gradient in *whole_out. */
    int (*check)(model *m, const seqpar_gpu *groups, int c, const ulysses_gpu_mode *mode, int k, const comm_info *info,
                 double *whole_out);
} ulysses_gpu_suite;

/* The test program: MPI and the GPU (gpu_select of the local rank), groups up to 4, the suite's model and the NCCL
   groups; without any group the plan "1..0 # SKIP", else for k = 2 and 4, each case and each mode one TAP line from
   rank 0 (a k the ranks do not allow skipped). Returns the exit status: nonzero when a check failed. */
int ulysses_gpu_main(int argc, char **argv, const ulysses_gpu_suite *suite);

#endif
