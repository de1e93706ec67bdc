/* ulysses_check.h — shared by the MPI tests of the CPU models' sequence parallelism (test_mpi_ulysses, test_mpi_mmdit_ulysses): one micro-batch run alone and on a group, the group's summed results against the lone ones, and the TAP main over group sizes and cases. */
#ifndef ALDIT_TEST_ULYSSES_CHECK_H
#define ALDIT_TEST_ULYSSES_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/comm.h"
#include "model/model.h"

#define ULYSSES_TOLERANCE 1e-6          /* loss, per-sample losses, the whole weight gradient: relative */
#define ULYSSES_TENSOR_TOLERANCE 1e-5   /* each parameter tensor's gradient (worst_difference says why looser) */

typedef struct {
    double loss;
    double *sample_loss;   /* [n_samples] */
    double *mine;          /* [n_samples] this member's own per-sample parts, before the group's sum */
    double *grads;         /* [n_weights] */
} ulysses_result;

/* Forward + backward of the batch with this rank's group of k (1: alone); the loss, per-sample losses and gradients
   summed over the group. */
static inline ulysses_result ulysses_run(model *m, const model_batch *batch, int k)
{
    const int B = batch->n_samples;
    ulysses_result r = {0};
    float *grads = calloc((size_t)m->n_weights, sizeof(float));
    r.grads = calloc((size_t)m->n_weights + (size_t)B + 1, sizeof(double));
    r.sample_loss = calloc((size_t)B, sizeof(double));
    r.mine = calloc((size_t)B, sizeof(double));
    model_batch member = *batch;
    const comm_group *group = comm_group_get(k);
    if (k > 1) {
        member.sp_size = k;
        member.sp_rank = comm_group_rank(group);
        member.sp_group = group;
    }
    r.loss = model_forward_backward(m, &member, grads, 1.0f, r.mine);
    for (int b = 0; b < B; b++) r.sample_loss[b] = r.mine[b];
    for (int64_t i = 0; i < m->n_weights; i++) r.grads[i] = grads[i];
    if (k > 1) {   /* the loss parts ride behind the gradients */
        double *tail = r.grads + m->n_weights;
        tail[0] = r.loss;
        for (int b = 0; b < B; b++) tail[1 + b] = r.sample_loss[b];
        comm_group_allreduce_sum_f64(group, r.grads, (int)m->n_weights + 1 + B);
        r.loss = tail[0];
        for (int b = 0; b < B; b++) r.sample_loss[b] = tail[1 + b];
    }
    free(grads);
    return r;
}

static inline void ulysses_result_free(ulysses_result *r)
{
    free(r->sample_loss); free(r->mine); free(r->grads);
}

static inline double ulysses_relative(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

/* Sums over one parameter tensor (or over all, p < 0) of the squared difference and the reference's squares. */
static inline void ulysses_tensor_norms(const model *m, const ulysses_result *got, const ulysses_result *want, int p,
                                        double *diff, double *norm)
{
    const int64_t first = p < 0 ? 0 : m->params[p].offset, end = p < 0 ? m->n_weights : first + m->params[p].n_elements;
    *diff = *norm = 0;
    for (int64_t i = first; i < end; i++) {
        *diff += (got->grads[i] - want->grads[i]) * (got->grads[i] - want->grads[i]);
        *norm += want->grads[i] * want->grads[i];
    }
}

/* The largest relative difference of the group's results to the reference, against the tolerance of each: the loss
   and per-sample losses (ULYSSES_TOLERANCE); the whole weight gradient as the norm of the difference over the
   reference's norm (ULYSSES_TOLERANCE); and each parameter tensor's gradient by the same measure
   (ULYSSES_TENSOR_TOLERANCE). The tensors get a looser bound because a few are sums that cancel almost to zero (Wan's
   cross-attention key bias: the softmax's key gradients sum to zero over the keys before the RMSNorm), where a
   different order of the fp32 partial sums alone moves the result by ~1e-6 of its size; a part missing or counted
   twice moves any of them by O(1). A tensor whose gradient is zero but for rounding (its norm under
   ULYSSES_ZERO_SHARE of the whole's: a key bias with no norm after it, as in HunyuanVideo-1.5's token refiner, shifts
   each query's scores by a constant the softmax ignores; or exactly zero, as an MMDiT's unused last text stream) is
   measured against the whole gradient's norm instead. Returns the worst ratio of a difference to its tolerance
   (pass: <= 1), names it in `where` and gives the whole gradient's difference in *whole. */
#define ULYSSES_ZERO_SHARE 1e-6
static inline double ulysses_worst_difference(const model *m, const ulysses_result *got, const ulysses_result *want,
                                              int n_samples, char *where, size_t where_size, double *whole)
{
    double worst = ulysses_relative(got->loss, want->loss) / ULYSSES_TOLERANCE;
    snprintf(where, where_size, "loss");
    for (int b = 0; b < n_samples; b++) {
        const double d = ulysses_relative(got->sample_loss[b], want->sample_loss[b]) / ULYSSES_TOLERANCE;
        if (d > worst) { worst = d; snprintf(where, where_size, "sample %d's loss", b); }
    }
    double diff_all, norm_all;
    ulysses_tensor_norms(m, got, want, -1, &diff_all, &norm_all);
    for (int p = 0; p < m->n_params; p++) {
        double diff, norm;
        ulysses_tensor_norms(m, got, want, p, &diff, &norm);
        const int rounding = sqrt(norm) < ULYSSES_ZERO_SHARE * sqrt(norm_all);
        const double d = sqrt(diff / (rounding ? norm_all : norm)) / ULYSSES_TENSOR_TOLERANCE;
        if (d > worst) {
            worst = d;
            snprintf(where, where_size, "gradient of %s%s", m->params[p].name, rounding ? " (zero but for rounding)" : "");
        }
    }
    *whole = norm_all > 0 ? sqrt(diff_all / norm_all) : INFINITY;
    if (*whole / ULYSSES_TOLERANCE > worst) {
        worst = *whole / ULYSSES_TOLERANCE;
        snprintf(where, where_size, "the whole gradient");
    }
    return worst;
}


/* Collective: the batch run alone and on this rank's group of k, compared by ulysses_worst_difference (a failure told
   on stderr, "# rank R: NAME, k = K: ..."), then extra(context, k, &grouped) where extra is given (1: it failed).
   Returns 1 on any rank's failure; the ranks' largest whole-gradient difference in *whole_out. */
static inline int ulysses_check_group(model *m, const model_batch *batch, const char *name, int k, const comm_info *info,
                                      int (*extra)(const void *context, int k, const ulysses_result *grouped),
                                      const void *context, double *whole_out)
{
    ulysses_result alone = ulysses_run(m, batch, 1), grouped = ulysses_run(m, batch, k);
    char where[160];
    double whole = 0, worst = ulysses_worst_difference(m, &grouped, &alone, batch->n_samples, where, sizeof where, &whole);
    int failed = !(worst <= 1.0);
    if (failed)
        fprintf(stderr, "# rank %d: %s, k = %d: %s differs by %.3g of its tolerance (loss %.9g, alone %.9g)\n",
                info->rank, name, k, where, worst, grouped.loss, alone.loss);
    if (extra) failed |= extra(context, k, &grouped);
    comm_allreduce_max_f64(&whole, 1);
    *whole_out = whole;
    ulysses_result_free(&alone);
    ulysses_result_free(&grouped);
    return comm_allreduce_or_int(failed);
}

typedef struct {
    void (*make_model)(model *m);   /* the test model, the same on every rank */
    int n_cases;
    const char *(*case_name)(int c);
    /* Collective: case c on groups of k; 1 on any rank's failure, the whole gradient's difference in *whole */
    int (*check)(model *m, int c, int k, const comm_info *info, double *whole);
    const char *also;               /* appended to what each TAP line says ("" for nothing) */
} ulysses_suite;

/* The test program: MPI, groups up to 4 and the suite's model; the plan, then for k = 2 and 4 and each case one TAP
   line from rank 0 (a k the ranks do not allow skipped). Returns the exit status: 1 when any check failed. */
static inline int ulysses_main(int argc, char **argv, const ulysses_suite *s)
{
    comm_info info = comm_init(&argc, &argv);
    comm_groups_init(4);
    model m;
    s->make_model(&m);
    const int groups[2] = {2, 4};
    if (info.rank == 0) printf("1..%d\n", 2 * s->n_cases);
    int failed = 0, test = 0;
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < s->n_cases; c++) {
            const int k = groups[g];
            test++;
            if (k > info.n_ranks || info.n_ranks % k != 0) {
                if (info.rank == 0) printf("ok %d - %s, k = %d # SKIP %d ranks\n", test, s->case_name(c), k, info.n_ranks);
                continue;
            }
            double worst = 0;
            const int bad = s->check(&m, c, k, &info, &worst);
            failed |= bad;
            if (info.rank == 0)
                printf("%s %d - %s, k = %d on %d ranks: loss, per-sample losses and the weight gradient summed over "
                       "the group equal k = 1's within %g relative (gradient: %.2g), each tensor within %g%s\n",
                       bad ? "not ok" : "ok", test, s->case_name(c), k, info.n_ranks, ULYSSES_TOLERANCE, worst,
                       ULYSSES_TENSOR_TOLERANCE, s->also);
        }
    model_free(&m);
    comm_finalize();
    return failed;
}

#endif
