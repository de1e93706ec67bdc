/* test_mpi_ulysses.c — run under mpirun by mpi_ulysses.sh: the CPU model's sequence parallelism (Ulysses). Every rank
   runs each micro-batch alone (k = 1), then with its group of k = 2 and 4 (where the ranks allow); the group's summed
   loss, per-sample losses and weight gradients must equal the k = 1 ones within 1e-6 relative (worst_difference says
   how each is measured). Rank 0 prints TAP. */
#include "core/comm.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient_check.h"

#define TOLERANCE 1e-6
enum { MAX_SAMPLES = 2, N_CASES = 3 };

typedef struct {
    const char *name;
    int n_samples;
    int32_t shape[MAX_SAMPLES][4];   /* frames, height, width (latent units), text tokens */
} test_case;

/* Patch 1x2x2: tokens = frames * height/2 * width/2. */
static const test_case CASES[N_CASES] = {
    {"one long sample (18 tokens)", 1, {{3, 6, 4, 5}}},
    {"a packed pair of 12 and 3 tokens", 2, {{2, 4, 6, 6}, {1, 2, 6, 2}}},
    {"one sample of 2 tokens (members without rows)", 1, {{2, 2, 2, 3}}},
};

static void test_deck(deck *config)
{
    memset(config, 0, sizeof(*config));
    config->model.dim = 32;
    config->model.ffn_dim = 48;
    config->model.num_heads = 4;     /* head dim 8; groups of 2 and 4 hold 2 and 1 heads */
    config->model.num_layers = 2;
    config->model.in_dim = 4;
    config->model.out_dim = 4;
    config->model.patch_t = 1;
    config->model.patch_h = 2;
    config->model.patch_w = 2;
    config->model.text_len = 6;
    config->model.text_dim = 8;
    config->model.freq_dim = 8;
    config->model.eps = 1e-6;
    config->model.qk_norm = 1;
    config->model.cross_attn_norm = 1;
    config->model.init_std = 0.02;
}

typedef struct {
    int32_t frames[MAX_SAMPLES], height[MAX_SAMPLES], width[MAX_SAMPLES], text_len[MAX_SAMPLES];
    float sigma[MAX_SAMPLES];
    float *latents, *noise, *text;
    model_batch batch;
} case_batch;

static void make_batch(case_batch *t, const model *m, const test_case *c)
{
    memset(t, 0, sizeof(*t));
    int64_t n_latent = 0, n_text = 0;
    for (int i = 0; i < c->n_samples; i++) {
        n_latent += (int64_t)m->in_dim * c->shape[i][0] * c->shape[i][1] * c->shape[i][2];
        n_text += (int64_t)c->shape[i][3] * m->text_dim;
    }
    t->latents = malloc((size_t)n_latent * sizeof(float));
    t->noise = malloc((size_t)n_latent * sizeof(float));
    t->text = malloc((size_t)n_text * sizeof(float));
    fill_random(t->latents, n_latent, 11, 1.0f);
    fill_random(t->noise, n_latent, 12, 1.0f);
    fill_random(t->text, n_text, 13, 1.0f);
    for (int i = 0; i < c->n_samples; i++) {
        t->frames[i] = c->shape[i][0];
        t->height[i] = c->shape[i][1];
        t->width[i] = c->shape[i][2];
        t->text_len[i] = c->shape[i][3];
        t->sigma[i] = 0.35f + 0.4f * (float)i;
    }
    t->batch = (model_batch){.n_samples = c->n_samples, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text};
}

typedef struct {
    double loss, sample_loss[MAX_SAMPLES];
    double *grads;   /* n_weights */
} result;

/* Forward + backward of the batch with the group of k (1: alone); the loss, per-sample losses and gradients summed
   over the group. */
static result run(model *m, const model_batch *batch, int k)
{
    result r = {0};
    float *grads = calloc((size_t)m->n_weights, sizeof(float));
    r.grads = calloc((size_t)m->n_weights + MAX_SAMPLES + 1, sizeof(double));
    model_batch mine = *batch;
    const comm_group *group = comm_group_get(k);
    if (k > 1) {
        mine.sp_size = k;
        mine.sp_rank = comm_group_rank(group);
        mine.sp_group = group;
    }
    r.loss = model_forward_backward(m, &mine, grads, 1.0f, r.sample_loss);
    for (int64_t i = 0; i < m->n_weights; i++) r.grads[i] = grads[i];
    if (k > 1) {   /* the loss parts ride behind the gradients */
        double *tail = r.grads + m->n_weights;
        tail[0] = r.loss;
        for (int b = 0; b < batch->n_samples; b++) tail[1 + b] = r.sample_loss[b];
        comm_group_allreduce_sum_f64(group, r.grads, (int)m->n_weights + 1 + batch->n_samples);
        r.loss = tail[0];
        for (int b = 0; b < batch->n_samples; b++) r.sample_loss[b] = tail[1 + b];
    }
    free(grads);
    return r;
}

static double relative(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

/* The largest relative difference of the group's results to the reference, against the tolerance of each: the loss
   and per-sample losses (1e-6); the whole weight gradient as the norm of the difference over the reference's norm
   (1e-6); and each parameter tensor's gradient by the same measure (TENSOR_TOLERANCE). The tensors get a looser bound
   because a few are sums that cancel almost to zero (the cross-attention key bias: the softmax's key gradients sum to
   zero over the keys before the RMSNorm), where a different order of the fp32 partial sums alone moves the result by
   ~1e-6 of its size; a part missing or counted twice moves any of them by O(1). Returns the worst ratio of a
   difference to its tolerance (pass: <= 1) and names it in `where`. */
#define TENSOR_TOLERANCE 1e-5
static double worst_difference(const model *m, const result *got, const result *want, int n_samples, char *where,
                               size_t where_size, double *whole)
{
    double worst = relative(got->loss, want->loss) / TOLERANCE;
    snprintf(where, where_size, "loss");
    for (int b = 0; b < n_samples; b++) {
        const double d = relative(got->sample_loss[b], want->sample_loss[b]) / TOLERANCE;
        if (d > worst) { worst = d; snprintf(where, where_size, "sample %d's loss", b); }
    }
    double diff_all = 0, norm_all = 0;
    for (int p = 0; p < m->n_params; p++) {
        const param_info *info = &m->params[p];
        double diff = 0, norm = 0;
        for (int64_t i = info->offset; i < info->offset + info->n_elements; i++) {
            diff += (got->grads[i] - want->grads[i]) * (got->grads[i] - want->grads[i]);
            norm += want->grads[i] * want->grads[i];
        }
        diff_all += diff;
        norm_all += norm;
        const double d = (norm > 0 ? sqrt(diff / norm) : INFINITY) / TENSOR_TOLERANCE;
        if (d > worst) { worst = d; snprintf(where, where_size, "gradient of %s", info->name); }
    }
    *whole = norm_all > 0 ? sqrt(diff_all / norm_all) : INFINITY;
    if (*whole / TOLERANCE > worst) { worst = *whole / TOLERANCE; snprintf(where, where_size, "the whole gradient"); }
    return worst;
}

/* One case with the group of k: 0 when every rank's group agrees with its k = 1 results. */
static int check_case(model *m, const test_case *c, int k, const comm_info *info, double *worst_out)
{
    case_batch t;
    make_batch(&t, m, c);
    result alone = run(m, &t.batch, 1), grouped = run(m, &t.batch, k);
    char where[160];
    double whole = 0, worst = worst_difference(m, &grouped, &alone, c->n_samples, where, sizeof where, &whole);
    const int failed = !(worst <= 1.0);
    if (failed)
        fprintf(stderr, "# rank %d: %s, k = %d: %s differs by %.3g of its tolerance (loss %.9g, alone %.9g)\n",
                info->rank, c->name, k, where, worst, grouped.loss, alone.loss);
    comm_allreduce_max_f64(&whole, 1);
    *worst_out = whole;
    free(alone.grads); free(grouped.grads);
    free(t.latents); free(t.noise); free(t.text);
    return comm_allreduce_or_int(failed);
}

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    comm_groups_init(4);
    deck config;
    test_deck(&config);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 5, 0.2f);
    const int groups[2] = {2, 4};
    if (info.rank == 0) printf("1..%d\n", 2 * N_CASES);
    int failed = 0, test = 0;
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < N_CASES; c++) {
            const int k = groups[g];
            test++;
            if (k > info.n_ranks || info.n_ranks % k != 0) {
                if (info.rank == 0) printf("ok %d - %s, k = %d # SKIP %d ranks\n", test, CASES[c].name, k, info.n_ranks);
                continue;
            }
            double worst = 0;
            const int bad = check_case(&m, &CASES[c], k, &info, &worst);
            failed |= bad;
            if (info.rank == 0)
                printf("%s %d - %s, k = %d on %d ranks: loss, per-sample losses and the weight gradient summed over "
                       "the group equal k = 1's within %g relative (gradient: %.2g), each tensor within %g\n",
                       bad ? "not ok" : "ok", test, CASES[c].name, k, info.n_ranks, TOLERANCE, worst, TENSOR_TOLERANCE);
        }
    model_free(&m);
    comm_finalize();
    return failed;
}
