/* test_cuda_ulysses.c — run under mpirun by gpu_ulysses.sh: the GPU model's sequence parallelism (Ulysses) on GPU ranks (one GPU each, or sharing one). Every rank runs each micro-batch alone (k = 1), then with its group of k = 2 and 4 (where the ranks allow) over NCCL (cuda/seqpar_gpu.h), under recompute none and block and with attention on cuDNN where it serves (samples of 64 rows or more) and on our own kernel only; the group's summed loss, per-sample losses and weight gradients must equal k = 1's within test_cuda_model.c's bf16 tolerances against the CPU (2e-2 loss, 5e-2 gradient, relative). Rank 0 prints TAP. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"

#ifdef HAVE_CUDA

#include "core/check.h"
#include "core/rng.h"
#include "cuda_ulysses_harness.h"
#include "model/model.h"

enum { MAX_SAMPLES = 2, N_CASES = 2 };
_Static_assert(MAX_SAMPLES <= ULYSSES_GPU_MAX_SAMPLES, "a result holds every sample's loss");

typedef struct {
    const char *name;
    int n_samples;
    int32_t shape[MAX_SAMPLES][4];   /* frames, height, width (latent units), text tokens */
} test_case;

/* Patch 1x2x2: tokens = frames * height/2 * width/2. 1,152 is not a multiple of cuDNN's 128-row tile (the last
   sample runs over whole tiles); 589 = 160 + 429 splits unevenly over 4 members, sample 0 over members 0 and 1. */
static const test_case CASES[N_CASES] = {
    {"one long sample (1,152 tokens)", 1, {{4, 32, 36, 16}}},
    {"a packed pair of 160 and 429 tokens", 2, {{2, 16, 20, 16}, {3, 22, 26, 9}}},
};

/* The quick-start dims of test_cuda_model.c: D 64, F 128, 4 heads of 16 (groups of 2 and 4 hold 2 and 1), text 16 x 32. */
static void tiny_model(model *m)
{
    deck config;
    deck_defaults(&config);
    config.model.dim = 64;
    config.model.ffn_dim = 128;
    config.model.num_heads = 4;
    config.model.num_layers = 2;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.freq_dim = 32;
    model_create(m, &config);
    model_init_gaussian(m, 0x5eed0031ull, 0.1f);
}

typedef struct {
    int32_t frames[MAX_SAMPLES], height[MAX_SAMPLES], width[MAX_SAMPLES], text_len[MAX_SAMPLES];
    float sigma[MAX_SAMPLES];
    float *latents, *noise, *text;
    model_batch batch;
} case_batch;

/* The case's samples with fixed random data (the same on every rank). */
static void make_batch(case_batch *t, const model *m, const test_case *c)
{
    memset(t, 0, sizeof *t);
    int64_t n_latent = 0, n_text = 0;
    for (int b = 0; b < c->n_samples; b++) {
        t->frames[b] = c->shape[b][0];
        t->height[b] = c->shape[b][1];
        t->width[b] = c->shape[b][2];
        t->text_len[b] = c->shape[b][3];
        t->sigma[b] = 0.3f + 0.4f * (float)b;
        n_latent += (int64_t)m->in_dim * t->frames[b] * t->height[b] * t->width[b];
        n_text += (int64_t)t->text_len[b] * m->text_dim;
    }
    uint64_t seed = 0xca5e0031ull;
    t->latents = xmalloc((size_t)n_latent * sizeof(float));
    t->noise = xmalloc((size_t)n_latent * sizeof(float));
    t->text = xmalloc((size_t)n_text * sizeof(float));
    for (int64_t i = 0; i < n_latent; i++) {
        t->latents[i] = (float)rng_normal(&seed);
        t->noise[i] = (float)rng_normal(&seed);
    }
    for (int64_t i = 0; i < n_text; i++) t->text[i] = (float)rng_normal(&seed);
    t->batch = (model_batch){.n_samples = c->n_samples, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text, .sp_size = 1};
}

/* The worst of the checks as a fraction of its tolerance (<= 1 passes), naming it in `where`. A parameter whose
   gradient is under 1e-3 of the whole one is measured against that floor (bf16 rounding of a sum that nearly cancels). */
static double worst_fraction(const model *m, const ulysses_gpu_result *got, const ulysses_gpu_result *want,
                             int n_samples, char *where, size_t size, double *whole_out)
{
    double worst = fabs(got->loss - want->loss) / (ULYSSES_GPU_LOSS_TOLERANCE * fabs(want->loss));
    snprintf(where, size, "the loss (%.7g vs %.7g)", got->loss, want->loss);
    for (int b = 0; b < n_samples; b++) {
        const double f = fabs(got->sample_loss[b] - want->sample_loss[b]) /
                         (ULYSSES_GPU_LOSS_TOLERANCE * fabs(want->sample_loss[b]));
        if (!(f <= worst)) { worst = f; snprintf(where, size, "sample %d's loss", b); }
    }
    return ulysses_gpu_gradient_worst(m, got, want, NULL, worst, where, size, whole_out);
}

static const ulysses_gpu_mode MODES[] = {
    {GPU_RECOMPUTE_NONE, GPU_ATTENTION_AUTO, "recompute none, cuDNN from 64 rows where available"},
    {GPU_RECOMPUTE_BLOCK, GPU_ATTENTION_AUTO, "recompute block, cuDNN from 64 rows where available"},
    {GPU_RECOMPUTE_NONE, GPU_ATTENTION_OWN, "recompute none, own attention"},
};
enum { N_MODES = sizeof MODES / sizeof MODES[0] };

/* Collective: one case in one mode on groups of k; 1 on any rank's failure. */
static int check_case(model *m, const seqpar_gpu *groups, int index, const ulysses_gpu_mode *mode, int k,
                      const comm_info *info, double *whole_out)
{
    const test_case *c = &CASES[index];
    case_batch t;
    make_batch(&t, m, c);
    gpu_model *gm = gpu_model_create_with_recompute(m, 2048, MAX_SAMPLES, 0, mode->recompute);
    gpu_model_set_attention(gm, mode->attention, 64);
    gpu_model_set_seqpar(gm, groups);
    gpu_model_upload_weights(gm, m->weights);
    ulysses_gpu_result alone = ulysses_gpu_run(gm, m, &t.batch, 1, info->rank),
                       grouped = ulysses_gpu_run(gm, m, &t.batch, k, info->rank);
    char where[160];
    double whole = 0.0;
    const double worst = worst_fraction(m, &grouped, &alone, c->n_samples, where, sizeof where, &whole);
    const int failed = !(worst <= 1.0);
    if (failed)
        fprintf(stderr, "# rank %d: %s, %s, k = %d: %s is %.3g of its tolerance (loss %.9g, alone %.9g)\n",
                info->rank, c->name, mode->name, k, where, worst, grouped.loss, alone.loss);
    comm_allreduce_max_f64(&whole, 1);
    *whole_out = whole;
    gpu_model_free(gm);
    free(alone.grads);
    free(grouped.grads);
    free(t.latents);
    free(t.noise);
    free(t.text);
    return comm_allreduce_or_int(failed);
}

static const char *case_name(int c) { return CASES[c].name; }

int main(int argc, char **argv)
{
    const ulysses_gpu_suite suite = {tiny_model, N_CASES, case_name, MODES, N_MODES, check_case};
    return ulysses_gpu_main(argc, argv, &suite);
}

#else

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    if (info.rank == 0) printf("1..0 # SKIP built without CUDA\n");
    comm_finalize();
    return 0;
}

#endif
