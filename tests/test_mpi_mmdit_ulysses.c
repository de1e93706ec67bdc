/* test_mpi_mmdit_ulysses.c — run under mpirun by mpi_mmdit_ulysses.sh: HunyuanVideo-1.5's MMDiT on the CPU with sequence parallelism (Ulysses). Every rank runs each micro-batch (mixed video shapes, caption sources and lengths, text-to-video and image-to-video samples) alone (k = 1), then with its group of k = 2 and 4 (where the ranks allow): the group's summed loss, per-sample losses and weight gradients must equal the k = 1 ones within 1e-6 relative (ulysses_check.h says how each is measured), and each member's own per-sample loss must be nonzero exactly for the samples whose video rows its slice holds (member p of k: rows [p Tv/k, (p+1) Tv/k)). Rank 0 prints TAP. */
#include "core/comm.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient_check.h"
#include "ulysses_check.h"

enum { MAX_SAMPLES = 3, N_CASES = 3 };

typedef struct {
    const char *name;
    int n_samples;
    int32_t shape[MAX_SAMPLES][7];   /* frames, height, width (latent units); Qwen, ByT5, image rows; image-to-video */
} test_case;

/* Patch 1x2x2: video rows = frames * height/2 * width/2; joint text rows = Qwen + ByT5 + image. */
static const test_case CASES[N_CASES] = {
    {"a packed T2V and two I2V samples (4, 12 and 3 video rows; 5, 8 and 4 text rows from every source)", 3,
     {{2, 4, 2, 3, 2, 0, 0}, {3, 4, 4, 5, 0, 3, 1}, {1, 2, 6, 1, 1, 2, 1}}},
    {"one long I2V sample (18 video rows, 9 text rows)", 1, {{3, 6, 4, 4, 2, 3, 1}}},
    {"a T2V sample of 2 video rows and 1 text row beside an I2V one of 1 and 2 (members without video or text rows)", 2,
     {{2, 2, 2, 1, 0, 0, 0}, {1, 2, 2, 2, 0, 0, 1}}},
};

static void test_deck(deck *config)
{
    deck_defaults(config);
    config->model.family = FAMILY_HUNYUANVIDEO15;
    config->model.dim = 32;
    config->model.ffn_dim = 48;
    config->model.num_heads = 4;     /* head dim 8 (RoPE pairs 2/1/1); groups of 2 and 4 hold 2 and 1 heads */
    config->model.num_layers = 2;
    config->model.in_dim = 9;
    config->model.out_dim = 4;
    config->model.patch_t = 1;
    config->model.patch_h = 2;
    config->model.patch_w = 2;
    config->model.text_len = 8;
    config->model.text_dim = 12;
    config->model.text_2_dim = 6;
    config->model.image_dim = 10;
    config->model.rope_axes_t = 4;
    config->model.freq_dim = 16;
}

/* Random weights (norm weights about 1); the ByT5 projection's 2048-wide layers scaled down so that its output stays
   of order one. */
static void random_model(model *m)
{
    deck config;
    test_deck(&config);
    model_create(m, &config);
    model_init_gaussian(m, 5, 0.3f);
    const char *wide[] = {"context_embedder_2.linear_2.weight", "context_embedder_2.linear_3.weight"};
    for (int k = 0; k < 2; k++) {
        const param_info *p = model_find_param(m, wide[k]);
        if (!p) { fprintf(stderr, "no parameter %s\n", wide[k]); exit(1); }
        for (int64_t i = 0; i < p->n_elements; i++) m->weights[p->offset + i] *= 0.08f;
    }
}

typedef struct {
    int32_t frames[MAX_SAMPLES], height[MAX_SAMPLES], width[MAX_SAMPLES];
    int32_t text_len[MAX_SAMPLES], text_2_len[MAX_SAMPLES], image_len[MAX_SAMPLES];
    unsigned char i2v[MAX_SAMPLES];
    float sigma[MAX_SAMPLES];
    float *latents, *noise, *text, *text_2, *image;
    model_batch batch;
} case_batch;

static void make_batch(case_batch *t, const model *m, const test_case *c)
{
    memset(t, 0, sizeof(*t));
    int64_t n_latent = 0, n_text = 0, n_text_2 = 0, n_image = 0;
    for (int i = 0; i < c->n_samples; i++) {
        const int32_t *s = c->shape[i];
        t->frames[i] = s[0], t->height[i] = s[1], t->width[i] = s[2];
        t->text_len[i] = s[3], t->text_2_len[i] = s[4], t->image_len[i] = s[5];
        t->i2v[i] = (unsigned char)s[6];
        t->sigma[i] = 0.3f + 0.25f * (float)i;
        n_latent += (int64_t)m->out_dim * s[0] * s[1] * s[2];
        n_text += (int64_t)s[3] * m->text_dim;
        n_text_2 += (int64_t)s[4] * m->text_2_dim;
        n_image += (int64_t)s[5] * m->image_dim;
    }
    t->latents = malloc((size_t)n_latent * sizeof(float));
    t->noise = malloc((size_t)n_latent * sizeof(float));
    t->text = malloc((size_t)n_text * sizeof(float));
    t->text_2 = malloc((size_t)(n_text_2 + 1) * sizeof(float));
    t->image = malloc((size_t)(n_image + 1) * sizeof(float));
    fill_random(t->latents, n_latent, 11, 1.0f);
    fill_random(t->noise, n_latent, 12, 1.0f);
    fill_random(t->text, n_text, 13, 1.0f);
    fill_random(t->text_2, n_text_2, 14, 1.0f);
    fill_random(t->image, n_image, 15, 1.0f);
    t->batch = (model_batch){.n_samples = c->n_samples, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text, .text_2_len = t->text_2_len, .text_2 = t->text_2,
                             .image_len = t->image_len, .image = t->image, .i2v = t->i2v};
}

static void free_batch(case_batch *t)
{
    free(t->latents); free(t->noise); free(t->text); free(t->text_2); free(t->image);
}

/* 1 where this member's (p of k) own per-sample loss parts in the grouped result break the split of case `context`: a
   part nonzero for a sample none of whose video rows lie in [p Tv/k, (p+1) Tv/k), or zero for one that has some there. */
static int split_broken(const void *context, int k, const ulysses_result *grouped)
{
    const test_case *c = context;
    const int member = comm_group_rank(comm_group_get(k));
    const double *mine = grouped->mine;
    int64_t total = 0;
    for (int b = 0; b < c->n_samples; b++) total += (int64_t)c->shape[b][0] * (c->shape[b][1] / 2) * (c->shape[b][2] / 2);
    const int64_t lo = total * member / k, hi = total * (member + 1) / k;
    int64_t start = 0, broken = 0;
    for (int b = 0; b < c->n_samples; b++) {
        const int64_t end = start + (int64_t)c->shape[b][0] * (c->shape[b][1] / 2) * (c->shape[b][2] / 2);
        const int holds = start < hi && end > lo;
        if (holds != (mine[b] != 0.0)) {
            fprintf(stderr, "# member %d of %d: sample %d (rows %lld..%lld, slice %lld..%lld) has loss part %g\n",
                    member, k, b, (long long)start, (long long)end, (long long)lo, (long long)hi, mine[b]);
            broken = 1;
        }
        start = end;
    }
    return (int)broken;
}

/* One case with the group of k: 0 when every rank's group agrees with its k = 1 results. */
static int check_case(model *m, int index, int k, const comm_info *info, double *worst_out)
{
    const test_case *c = &CASES[index];
    case_batch t;
    make_batch(&t, m, c);
    const int failed = ulysses_check_group(m, &t.batch, c->name, k, info, split_broken, c, worst_out);
    free_batch(&t);
    return failed;
}

static const char *case_name(int c) { return CASES[c].name; }

int main(int argc, char **argv)
{
    const ulysses_suite suite = {random_model, N_CASES, case_name, check_case,
                                 "; each member's loss parts follow its video slice"};
    return ulysses_main(argc, argv, &suite);
}
