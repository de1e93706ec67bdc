/* test_mpi_ulysses.c — run under mpirun by mpi_ulysses.sh: the CPU model's sequence parallelism (Ulysses). Every rank
   runs each micro-batch alone (k = 1), then with its group of k = 2 and 4 (where the ranks allow); the group's summed
   loss, per-sample losses and weight gradients must equal the k = 1 ones within 1e-6 relative (ulysses_check.h's
   ulysses_worst_difference says how each is measured). Rank 0 prints TAP. */
#include "core/comm.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient_check.h"
#include "ulysses_check.h"
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

static void random_model(model *m)
{
    deck config;
    test_deck(&config);
    model_create(m, &config);
    model_init_gaussian(m, 5, 0.2f);
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

/* One case with the group of k: 0 when every rank's group agrees with its k = 1 results. */
static int check_case(model *m, int index, int k, const comm_info *info, double *worst_out)
{
    const test_case *c = &CASES[index];
    case_batch t;
    make_batch(&t, m, c);
    const int failed = ulysses_check_group(m, &t.batch, c->name, k, info, NULL, NULL, worst_out);
    free(t.latents); free(t.noise); free(t.text);
    return failed;
}

static const char *case_name(int c) { return CASES[c].name; }

int main(int argc, char **argv)
{
    const ulysses_suite suite = {random_model, N_CASES, case_name, check_case, ""};
    return ulysses_main(argc, argv, &suite);
}
