/* cuda_ulysses_harness.c — the GPU sequence-parallel tests' shared run, gradient comparison and TAP main (cuda_ulysses_harness.h). */
#include "config.h"

#include "cuda_ulysses_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"
#include "cuda/gpu.h"
#include "cuda/gradsync.h"

ulysses_gpu_result ulysses_gpu_run(gpu_model *gm, const model *m, const model_batch *batch, int k, int rank)
{
    model_batch mine = *batch;
    mine.sp_size = k;
    mine.sp_rank = k > 1 ? rank % k : 0;
    mine.sp_group = k > 1 ? comm_group_get(k) : NULL;
    ulysses_gpu_result r = {0};
    gpu_model_zero_grads(gm, 0);
    r.loss = gpu_model_forward_backward(gm, &mine, 1.0f / (float)batch->n_samples, r.sample_loss, 0);
    float *grads = xmalloc((size_t)m->n_weights * sizeof(float));
    gpu_model_download_grads(gm, grads);
    r.grads = xmalloc((size_t)m->n_weights * sizeof(double));
    for (int64_t i = 0; i < m->n_weights; i++) r.grads[i] = grads[i];
    free(grads);
    if (k > 1) {
        comm_group_allreduce_sum_f64(mine.sp_group, &r.loss, 1);
        comm_group_allreduce_sum_f64(mine.sp_group, r.sample_loss, batch->n_samples);
        for (int64_t first = 0; first < m->n_weights; first += 1 << 20) {
            const int64_t left = m->n_weights - first;
            comm_group_allreduce_sum_f64(mine.sp_group, r.grads + first, (int)(left < (1 << 20) ? left : 1 << 20));
        }
    }
    return r;
}

static double norm_of(const double *a, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += a[i] * a[i];
    return sqrt(sum);
}

/* ||a - b|| / max(||b||, floor) over n values. */
static double relative(const double *a, const double *b, int64_t n, double floor)
{
    double diff = 0.0;
    for (int64_t i = 0; i < n; i++) diff += (a[i] - b[i]) * (a[i] - b[i]);
    const double norm = norm_of(b, n), scale = norm > floor ? norm : floor;
    return scale > 0.0 ? sqrt(diff) / scale : sqrt(diff);
}

double ulysses_gpu_gradient_worst(const model *m, const ulysses_gpu_result *got, const ulysses_gpu_result *want,
                                  const double *floors, double worst, char *where, size_t size, double *whole_out)
{
    const double whole = relative(got->grads, want->grads, m->n_weights, 0.0);
    *whole_out = whole;
    if (!(whole / ULYSSES_GPU_GRADIENT_TOLERANCE <= worst)) {
        worst = whole / ULYSSES_GPU_GRADIENT_TOLERANCE;
        snprintf(where, size, "the gradient");
    }
    const double norm = norm_of(want->grads, m->n_weights);
    for (int p = 0; p < m->n_params; p++) {
        const param_info *info = &m->params[p];
        const double floor = floors && floors[p] > 1e-3 * norm ? floors[p] : 1e-3 * norm;
        const double f = relative(got->grads + info->offset, want->grads + info->offset, info->n_elements, floor) /
                         ULYSSES_GPU_GRADIENT_TOLERANCE;
        if (!(f <= worst)) { worst = f; snprintf(where, size, "the gradient of %s", info->name); }
    }
    return worst;
}

/* Collective: every case in every mode on groups of 2 and 4, one TAP line each from rank 0; 1 when any failed. */
static int run_suite(const ulysses_gpu_suite *s, model *m, const seqpar_gpu *groups, const comm_info *info)
{
    const int sizes[2] = {2, 4};
    if (info->rank == 0) printf("1..%d\n", 2 * s->n_cases * s->n_modes);
    int failed = 0, test = 0;
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < s->n_cases; c++)
            for (int mode = 0; mode < s->n_modes; mode++) {
                const int k = sizes[g];
                test++;
                if (!seqpar_gpu_get(groups, k)) {
                    if (info->rank == 0)
                        printf("ok %d - %s, %s, k = %d # SKIP %d ranks\n", test, s->case_name(c), s->modes[mode].name,
                               k, info->n_ranks);
                    continue;
                }
                double whole = 0.0;
                const int bad = s->check(m, groups, c, &s->modes[mode], k, info, &whole);
                failed |= bad;
                if (info->rank == 0)
                    printf("%s %d - %s, %s, k = %d on %d GPU ranks: loss, per-sample losses and weight gradients "
                           "summed over the group equal k = 1's within %g and %g relative (gradient: %.2g)\n",
                           bad ? "not ok" : "ok", test, s->case_name(c), s->modes[mode].name, k, info->n_ranks,
                           ULYSSES_GPU_LOSS_TOLERANCE, ULYSSES_GPU_GRADIENT_TOLERANCE, whole);
            }
    return failed;
}

int ulysses_gpu_main(int argc, char **argv, const ulysses_gpu_suite *suite)
{
    comm_info info = comm_init(&argc, &argv);
    gpu_select(info.local_rank);
    comm_groups_init(4);
    model m;
    suite->make_model(&m);
    gradsync *sync = gradsync_create(&info, m.n_weights, 0);
    seqpar_gpu *groups = seqpar_gpu_create(sync, info.rank);
    int failed = 0;
    if (seqpar_gpu_count(groups) == 0) {
        if (info.rank == 0) printf("1..0 # SKIP no NCCL group on %d rank(s) (a build without NCCL, or one rank)\n", info.n_ranks);
    } else {
        failed = run_suite(suite, &m, groups, &info);
    }
    seqpar_gpu_free(groups);
    gradsync_free(sync);
    model_free(&m);
    comm_finalize();
    return failed;
}
