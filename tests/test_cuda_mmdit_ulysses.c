/* test_cuda_mmdit_ulysses.c — run under mpirun by gpu_mmdit_ulysses.sh: HunyuanVideo-1.5's GPU model (cuda/mmdit_gpu.cu) with sequence parallelism (Ulysses) on GPU ranks (one GPU each, or sharing one). Every rank runs each micro-batch alone (k = 1), then with its group of k = 2 and 4 (where the ranks allow) over NCCL, both streams split (video rows and joint text rows), under recompute none and block, the joint attention on cuDNN where it serves (64 joint rows or more) and on our own kernel only; the group's summed loss, per-sample losses and weight gradients must equal k = 1's within test_cuda_ulysses.c's tolerances for Wan (2e-2 loss, 5e-2 gradient, relative). Rank 0 prints TAP. */
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

enum { MAX_SAMPLES = 3, N_CASES = 3, CAPACITY_TOKENS = 2048, CAPACITY_TEXT = 96 };
_Static_assert(MAX_SAMPLES <= ULYSSES_GPU_MAX_SAMPLES, "a result holds every sample's loss");

typedef struct {
    const char *name;
    int n_samples;
    /* frames, height, width (latent units), Qwen, ByT5 and image rows, image-to-video */
    int32_t shape[MAX_SAMPLES][7];
} test_case;

/* Patch 1x2x2: tokens = frames * height/2 * width/2; a sample's joint text is [image; ByT5; Qwen]. */
static const test_case CASES[N_CASES] = {
    /* 1,152 tokens (not a multiple of cuDNN's 128-row tile) and 28 text rows, image-to-video */
    {"one long image-to-video sample (1,152 tokens, 28 text rows)", 1, {{4, 32, 36, 16, 5, 7, 1}}},
    /* 160 + 429 + 6 = 595 tokens and 12 + 21 + 5 = 38 text rows: uneven slices over 2 and 4 members, samples and
       captions across members, a member with no row of a sample; two on cuDNN from 64 joint rows, one on our own */
    {"text-to-video and image-to-video packed (595 tokens, 38 text rows)", 3,
     {{2, 16, 20, 9, 3, 0, 0}, {3, 22, 26, 16, 0, 5, 1}, {1, 4, 6, 3, 2, 0, 0}}},
    /* short samples only (our own kernel throughout): 18 + 8 tokens, 7 + 6 text rows */
    {"two short samples (26 tokens, 13 text rows)", 2, {{3, 4, 6, 4, 1, 2, 1}, {2, 4, 4, 6, 0, 0, 0}}},
};

/* test_cuda_mmdit.c's tiny dims: D 64, F 128, 4 heads of 16 (groups of 2 and 4 hold 2 and 1), out_dim 8 (in_dim 17),
   patch 1x2x2, text dims 32, 24, 40, captions up to 16 Qwen rows. */
static void tiny_model(model *m)
{
    deck config;
    deck_defaults(&config);
    config.model.family = FAMILY_HUNYUANVIDEO15;
    config.model.text_padding = TEXT_PADDING_TRIM;
    config.model.dim = 64;
    config.model.ffn_dim = 128;
    config.model.num_heads = 4;
    config.model.num_layers = 2;
    config.model.out_dim = 8;
    config.model.in_dim = 17;
    config.model.patch_t = 1;
    config.model.patch_h = 2;
    config.model.patch_w = 2;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.text_2_dim = 24;
    config.model.image_dim = 40;
    config.model.rope_axes_t = 4;
    config.model.freq_dim = 32;
    model_create(m, &config);
    model_init_gaussian(m, 0x5eed0033ull, 0.1f);
}

typedef struct {
    int32_t frames[MAX_SAMPLES], height[MAX_SAMPLES], width[MAX_SAMPLES];
    int32_t text_len[MAX_SAMPLES], text_2_len[MAX_SAMPLES], image_len[MAX_SAMPLES];
    unsigned char i2v[MAX_SAMPLES];
    float sigma[MAX_SAMPLES];
    float *latents, *noise, *text, *text_2, *image;
    model_batch batch;
} case_batch;

static float *random_values(int64_t n, uint64_t *seed)
{
    float *values = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) values[i] = (float)rng_normal(seed);
    return values;
}

/* The case's samples with fixed random data (the same on every rank). */
static void make_batch(case_batch *t, const model *m, const test_case *c)
{
    memset(t, 0, sizeof *t);
    int64_t n_latent = 0, n_text = 0, n_text_2 = 0, n_image = 0;
    for (int b = 0; b < c->n_samples; b++) {
        t->frames[b] = c->shape[b][0];
        t->height[b] = c->shape[b][1];
        t->width[b] = c->shape[b][2];
        t->text_len[b] = c->shape[b][3];
        t->text_2_len[b] = c->shape[b][4];
        t->image_len[b] = c->shape[b][5];
        t->i2v[b] = (unsigned char)c->shape[b][6];
        t->sigma[b] = 0.3f + 0.25f * (float)b;
        n_latent += (int64_t)m->out_dim * t->frames[b] * t->height[b] * t->width[b];
        n_text += (int64_t)t->text_len[b] * m->text_dim;
        n_text_2 += (int64_t)t->text_2_len[b] * m->text_2_dim;
        n_image += (int64_t)t->image_len[b] * m->image_dim;
    }
    uint64_t seed = 0xca5e0033ull;
    t->latents = random_values(n_latent, &seed);
    t->noise = random_values(n_latent, &seed);
    t->text = random_values(n_text, &seed);
    t->text_2 = random_values(n_text_2, &seed);
    t->image = random_values(n_image, &seed);
    t->batch = (model_batch){.n_samples = c->n_samples, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text, .sp_size = 1, .text_2_len = t->text_2_len, .image_len = t->image_len,
                             .text_2 = t->text_2, .image = t->image, .i2v = t->i2v};
}

static void free_batch(case_batch *t)
{
    free(t->latents);
    free(t->noise);
    free(t->text);
    free(t->text_2);
    free(t->image);
}

/* Per parameter, the norm its error is measured against at least (beside 1e-3 of the whole gradient's): for a bias
   whose exact gradient is zero — the token refiner's key bias: softmax ignores a bias added to every key where no
   norm follows — its weight's gradient norm, as cuda_test_util.c's expect_gpu_matches_cpu; such a bias is one whose
   CPU-model gradient (the fp32 oracle, src/model/mmdit.c) is under 1e-6 of its weight's. 0 for the others. */
static double *zero_bias_floors(model *m, const model_batch *batch)
{
    float *cpu = xcalloc((size_t)m->n_weights, sizeof(float));
    model_forward_backward(m, batch, cpu, 1.0f / (float)batch->n_samples, NULL);
    double *floors = xcalloc((size_t)m->n_params, sizeof(double));
    for (int p = 0; p < m->n_params; p++) {
        const char *name = m->params[p].name;
        const size_t length = strlen(name);
        if (length < 5 || strcmp(name + length - 5, ".bias") != 0) continue;
        for (int w = 0; w < m->n_params; w++) {
            const char *other = m->params[w].name;
            if (strlen(other) != length + 2 || strncmp(other, name, length - 4) != 0 || strcmp(other + length - 4, "weight"))
                continue;
            double bias = 0.0, weight = 0.0;
            for (int64_t i = 0; i < m->params[p].n_elements; i++)
                bias += (double)cpu[m->params[p].offset + i] * cpu[m->params[p].offset + i];
            for (int64_t i = 0; i < m->params[w].n_elements; i++)
                weight += (double)cpu[m->params[w].offset + i] * cpu[m->params[w].offset + i];
            if (sqrt(bias) < 1e-6 * sqrt(weight)) floors[p] = sqrt(weight);
        }
    }
    free(cpu);
    return floors;
}

/* The worst of the checks as a fraction of its tolerance (<= 1 passes), naming it in `where`. A parameter whose
   gradient is under 1e-3 of the whole one is measured against that floor (bf16 rounding of a sum that nearly cancels),
   a bias of exact zero gradient against its weight's (zero_bias_floors). */
static double worst_fraction(const model *m, const ulysses_gpu_result *got, const ulysses_gpu_result *want,
                             int n_samples, const double *floors, char *where, size_t size, double *whole_out)
{
    double worst = fabs(got->loss - want->loss) / (ULYSSES_GPU_LOSS_TOLERANCE * fabs(want->loss));
    snprintf(where, size, "the loss (%.7g vs %.7g)", got->loss, want->loss);
    for (int b = 0; b < n_samples; b++) {
        const double f = fabs(got->sample_loss[b] - want->sample_loss[b]) /
                         (ULYSSES_GPU_LOSS_TOLERANCE * fabs(want->sample_loss[b]));
        if (!(f <= worst)) { worst = f; snprintf(where, size, "sample %d's loss (%.7g vs %.7g)", b, got->sample_loss[b],
                                                 want->sample_loss[b]); }
    }
    return ulysses_gpu_gradient_worst(m, got, want, floors, worst, where, size, whole_out);
}

static const ulysses_gpu_mode MODES[] = {
    {GPU_RECOMPUTE_NONE, GPU_ATTENTION_AUTO, "recompute none, cuDNN from 64 joint rows where available"},
    {GPU_RECOMPUTE_BLOCK, GPU_ATTENTION_AUTO, "recompute block, cuDNN from 64 joint rows where available"},
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
    double *floors = zero_bias_floors(m, &t.batch);
    gpu_model *gm = gpu_model_create_with_recompute(m, CAPACITY_TOKENS, MAX_SAMPLES, CAPACITY_TEXT, mode->recompute);
    gpu_model_set_attention(gm, mode->attention, 64);
    gpu_model_set_seqpar(gm, groups);
    gpu_model_upload_weights(gm, m->weights);
    ulysses_gpu_result alone = ulysses_gpu_run(gm, m, &t.batch, 1, info->rank),
                       grouped = ulysses_gpu_run(gm, m, &t.batch, k, info->rank);
    /* the group buffers were grown on the first grouped call: a second gives the same parts */
    ulysses_gpu_result again = ulysses_gpu_run(gm, m, &t.batch, k, info->rank);
    char where[200];
    double whole = 0.0;
    double worst = worst_fraction(m, &grouped, &alone, c->n_samples, floors, where, sizeof where, &whole);
    const double repeat = fabs(again.loss - grouped.loss) / (1e-5 * fabs(grouped.loss));
    if (!(repeat <= worst)) {
        worst = repeat;
        snprintf(where, sizeof where, "a second grouped call's loss (%.9g vs %.9g)", again.loss, grouped.loss);
    }
    const int failed = !(worst <= 1.0);
    if (failed)
        fprintf(stderr, "# rank %d: %s, %s, k = %d: %s is %.3g of its tolerance (loss %.9g, alone %.9g)\n",
                info->rank, c->name, mode->name, k, where, worst, grouped.loss, alone.loss);
    comm_allreduce_max_f64(&whole, 1);
    *whole_out = whole;
    gpu_model_free(gm);
    free(alone.grads);
    free(grouped.grads);
    free(again.grads);
    free(floors);
    free_batch(&t);
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
