/* test_mmdit.c — HunyuanVideo-1.5's MMDiT on the CPU: the whole tiny model's gradient, varlen packing, names and shapes at full size, memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "gradient_check.h"

#define STEP 3e-2f
#define CHECKS_PER_PARAM 6

static void tiny_deck(deck *config)
{
    deck_defaults(config);
    config->model.family = FAMILY_HUNYUANVIDEO15;
    config->model.dim = 32;
    config->model.ffn_dim = 48;
    config->model.num_heads = 2;     /* head dim 16: RoPE pairs 2/3/3 */
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

/* Samples: latent frames, height, width; Qwen, ByT5 and image rows. */
static const int32_t SHAPES[3][6] = {{2, 4, 2, 3, 2, 0}, {1, 2, 6, 5, 0, 3}, {3, 2, 2, 1, 1, 2}};
static const float SIGMA[3] = {0.3f, 0.75f, 0.05f};

typedef struct {
    int32_t frames[3], height[3], width[3], text_len[3], text_2_len[3], image_len[3];
    float sigma[3];
    float *latents, *noise, *text, *text_2, *image;
    model_batch batch;
} test_batch;

/* Samples which[0..n) with their own fixed data (the same whichever batch holds them). */
static void make_batch(test_batch *t, const model *m, const int *which, int n)
{
    memset(t, 0, sizeof *t);
    int64_t latent = 0, text = 0, text_2 = 0, image = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *s = SHAPES[which[i]];
        latent += (int64_t)m->out_dim * s[0] * s[1] * s[2];
        text += (int64_t)s[3] * m->text_dim;
        text_2 += (int64_t)s[4] * m->text_2_dim;
        image += (int64_t)s[5] * m->image_dim;
    }
    t->latents = malloc((size_t)latent * sizeof(float));
    t->noise = malloc((size_t)latent * sizeof(float));
    t->text = malloc((size_t)text * sizeof(float));
    t->text_2 = malloc((size_t)(text_2 + 1) * sizeof(float));
    t->image = malloc((size_t)(image + 1) * sizeof(float));
    latent = text = text_2 = image = 0;
    for (int i = 0; i < n; i++) {
        const int k = which[i];
        const int32_t *s = SHAPES[k];
        t->frames[i] = s[0], t->height[i] = s[1], t->width[i] = s[2];
        t->text_len[i] = s[3], t->text_2_len[i] = s[4], t->image_len[i] = s[5];
        t->sigma[i] = SIGMA[k];
        const int64_t values = (int64_t)m->out_dim * s[0] * s[1] * s[2];
        fill_random(t->latents + latent, values, 100 + k, 1.0f);
        fill_random(t->noise + latent, values, 200 + k, 1.5f);
        fill_random(t->text + text, (int64_t)s[3] * m->text_dim, 300 + k, 1.0f);
        fill_random(t->text_2 + text_2, (int64_t)s[4] * m->text_2_dim, 400 + k, 1.0f);
        fill_random(t->image + image, (int64_t)s[5] * m->image_dim, 500 + k, 1.0f);
        latent += values;
        text += (int64_t)s[3] * m->text_dim;
        text_2 += (int64_t)s[4] * m->text_2_dim;
        image += (int64_t)s[5] * m->image_dim;
    }
    t->batch = (model_batch){.n_samples = n, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text, .text_2_len = t->text_2_len, .text_2 = t->text_2,
                             .image_len = t->image_len, .image = t->image};
}

static void free_batch(test_batch *t)
{
    free(t->latents); free(t->noise); free(t->text); free(t->text_2); free(t->image);
}

/* Random weights everywhere (norm weights about 1); the ByT5 projection's 2048-wide layers scaled down so that
   its output stays of order one. */
static void random_model(model *m, const deck *config)
{
    model_create(m, config);
    model_init_gaussian(m, 7, 0.3f);
    const char *wide[] = {"context_embedder_2.linear_1.weight", "context_embedder_2.linear_2.weight",
                          "context_embedder_2.linear_3.weight"};
    const float scale[] = {1.0f, 0.08f, 0.08f};
    for (int k = 0; k < 3; k++) {
        const param_info *p = model_find_param(m, wide[k]);
        assert_non_null(p);
        for (int64_t i = 0; i < p->n_elements; i++) m->weights[p->offset + i] *= scale[k];
    }
}

/* The last block's text stream feeds nothing (its output is dropped, as in diffusers): the text queries, the text
   output projection and the text MLP of that block get no gradient. */
static int unused_in_last_block(const model *m, const char *name)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "transformer_blocks.%d.", m->num_layers - 1);
    if (strncmp(name, prefix, strlen(prefix)) != 0) return 0;
    const char *parts[] = {"attn.add_q_proj.", "attn.norm_added_q.", "attn.to_add_out.", "ff_context."};
    for (int k = 0; k < 4; k++)
        if (strstr(name, parts[k])) return 1;
    return 0;
}

typedef struct { model *m; const model_batch *batch; } loss_context;

static double loss_objective(void *context)
{
    loss_context *c = context;
    return model_forward_loss(c->m, c->batch, NULL);
}

/* Every parameter (a seeded subset of its values) against central differences of the loss. */
static void test_gradient(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    random_model(&m, &config);
    test_batch t;
    make_batch(&t, &m, (const int[]){0, 1, 2}, 3);
    float *grads = calloc((size_t)m.n_weights, sizeof(float));
    const double loss = model_forward_backward(&m, &t.batch, grads, 1.0f, NULL);
    assert_true(isfinite(loss) && loss > 0.0);
    loss_context c = {&m, &t.batch};
    double worst = 0.0;
    for (int i = 0; i < m.n_params; i++) {
        const param_info *p = &m.params[i];
        if (strstr(p->name, "token_refiner") && strstr(p->name, "attn.to_k.bias")) {
            /* without a key norm, a key bias shifts a query's scores alike: softmax ignores it, its gradient is 0 */
            for (int64_t j = 0; j < p->n_elements; j++) assert_true(fabsf(grads[p->offset + j]) < 1e-5f);
            continue;
        }
        if (unused_in_last_block(&m, p->name)) {
            for (int64_t j = 0; j < p->n_elements; j++) assert_true(grads[p->offset + j] == 0.0f);
            continue;
        }
        const double error = gradient_error(loss_objective, &c, m.weights + p->offset, grads + p->offset, p->n_elements,
                                            CHECKS_PER_PARAM, STEP, 1000 + (uint64_t)i);
        ASSERT_GRADIENT(p->name, error);
        worst = error > worst ? error : worst;
    }
    print_message("# whole model: %d parameters checked, worst relative error %.2e\n", m.n_params, worst);
    /* grad_scale scales what is added */
    float *again = calloc((size_t)m.n_weights, sizeof(float));
    model_forward_backward(&m, &t.batch, again, 0.5f, NULL);
    for (int64_t i = 0; i < m.n_weights; i += 997) assert_float_equal(again[i], 0.5f * grads[i], 1e-6 + 1e-5 * fabsf(grads[i]));
    free(again);
    free(grads);
    free_batch(&t);
    model_free(&m);
}

/* Varlen packing: a sample's loss does not depend on the samples packed beside it. */
static void test_packing_invariance(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    random_model(&m, &config);
    test_batch all;
    make_batch(&all, &m, (const int[]){2, 0, 1}, 3);
    double packed[3];
    model_forward_loss(&m, &all.batch, packed);
    for (int i = 0; i < 3; i++) {
        test_batch one;
        make_batch(&one, &m, (const int[]){(i + 2) % 3}, 1);
        double alone;
        model_forward_loss(&m, &one.batch, &alone);
        print_message("# sample %d: packed %.9g, alone %.9g\n", i, packed[i], alone);
        assert_true(fabs(packed[i] - alone) <= 1e-5 * fabs(alone));
        free_batch(&one);
    }
    free_batch(&all);
    model_free(&m);
}

/* Image-to-video in the loss: with i2v = 1 for the videos, each sample's loss equals the mean square of
   model_predict's output (on the input built by hand as HunyuanVideo-1.5's trainer does: x_t, then x0's first latent
   frame as the condition and a mask of 1 on that frame, zeros elsewhere) minus eps - x0; and differs from the
   text-to-video loss of the same sample. */
static void test_i2v_condition(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    random_model(&m, &config);
    test_batch t;
    make_batch(&t, &m, (const int[]){0, 1, 2}, 3);
    const unsigned char i2v[3] = {1, 0, 1};
    double t2v_loss[3], i2v_loss[3];
    model_forward_loss(&m, &t.batch, t2v_loss);
    t.batch.i2v = i2v;
    model_forward_loss(&m, &t.batch, i2v_loss);
    int64_t values = 0;
    for (int b = 0; b < 3; b++) values += (int64_t)t.frames[b] * t.height[b] * t.width[b];
    float *input = calloc((size_t)(values * m.in_dim), sizeof(float)), *pred = malloc((size_t)(values * m.out_dim) * sizeof(float));
    for (int b = 0, at = 0; b < 3; b++) {
        const int64_t plane = (int64_t)t.height[b] * t.width[b], volume = t.frames[b] * plane;
        const float *x0 = t.latents + at * m.out_dim, *eps = t.noise + at * m.out_dim;
        float *in = input + at * m.in_dim;
        for (int64_t i = 0; i < volume * m.out_dim; i++) in[i] = (1.0f - t.sigma[b]) * x0[i] + t.sigma[b] * eps[i];
        for (int c = 0; c < m.out_dim && i2v[b]; c++)
            for (int64_t i = 0; i < plane; i++) in[(m.out_dim + c) * volume + i] = x0[c * volume + i];
        for (int64_t i = 0; i < plane && i2v[b]; i++) in[2 * m.out_dim * volume + i] = 1.0f;
        at += (int)volume;
    }
    model_batch whole = t.batch;
    whole.latents = input;
    model_predict(&m, &whole, pred);
    for (int b = 0, at = 0; b < 3; b++) {
        const int64_t volume = (int64_t)t.frames[b] * t.height[b] * t.width[b];
        double sum = 0.0;
        for (int64_t i = at * m.out_dim; i < (at + volume) * m.out_dim; i++) {
            const double d = (double)pred[i] - ((double)t.noise[i] - t.latents[i]);
            sum += d * d;
        }
        const double expected = sum / (double)(volume * m.out_dim);
        print_message("# sample %d (i2v %d): loss %.9g, from the hand-built input %.9g, text-to-video %.9g\n", b, i2v[b],
                      i2v_loss[b], expected, t2v_loss[b]);
        assert_true(fabs(i2v_loss[b] - expected) <= 1e-5 * expected);
        if (i2v[b]) assert_true(fabs(i2v_loss[b] - t2v_loss[b]) > 1e-4 * t2v_loss[b]);
        else assert_true(i2v_loss[b] == t2v_loss[b]);
        at += (int)volume;
    }
    free(input);
    free(pred);
    free_batch(&t);
    model_free(&m);
}

/* The full-size table: diffusers' HunyuanVideo15Transformer3DModel() has 1801 tensors, 8,326,608,160 values. */
static void test_full_size_names_and_shapes(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.model.family = FAMILY_HUNYUANVIDEO15;
    config.model.dim = 2048, config.model.ffn_dim = 8192, config.model.num_heads = 16, config.model.num_layers = 54;
    config.model.in_dim = 65, config.model.out_dim = 32;
    config.model.patch_t = config.model.patch_h = config.model.patch_w = 1;
    config.model.text_dim = 3584, config.model.text_2_dim = 1472, config.model.image_dim = 1152;
    model m;
    model_create_table(&m, &config);
    assert_int_equal(m.n_params, 1801);
    assert_int_equal(m.n_weights, 8326608160LL);
    const struct { const char *name; int ndim; int64_t shape[5]; } expected[] = {
        {"x_embedder.proj.weight", 5, {2048, 65, 1, 1, 1}},
        {"context_embedder.token_refiner.refiner_blocks.1.ff.net.0.proj.weight", 2, {8192, 2048}},
        {"context_embedder.time_text_embed.text_embedder.linear_1.weight", 2, {2048, 3584}},
        {"context_embedder_2.linear_2.weight", 2, {2048, 2048}},
        {"cond_type_embed.weight", 2, {3, 2048}},
        {"transformer_blocks.0.norm1.linear.weight", 2, {12288, 2048}},
        {"transformer_blocks.53.attn.norm_added_k.weight", 1, {128}},
        {"transformer_blocks.53.ff_context.net.2.weight", 2, {2048, 8192}},
        {"norm_out.linear.weight", 2, {4096, 2048}},
        {"proj_out.weight", 2, {32, 2048}},
    };
    for (size_t k = 0; k < sizeof expected / sizeof expected[0]; k++) {
        const param_info *p = model_find_param(&m, expected[k].name);
        if (!p) fail_msg("no parameter %s", expected[k].name);
        assert_int_equal(p->ndim, expected[k].ndim);
        for (int d = 0; d < p->ndim; d++) assert_int_equal(p->shape[d], expected[k].shape[d]);
    }
    assert_string_equal(m.params[m.n_params - 1].name, "proj_out.bias");
    assert_null(model_find_param(&m, "blocks.0.self_attn.q.weight"));
    model_free(&m);
}

/* What the CPU model carves is at most the layout's CPU formula for the micro-batch (N tokens, B samples, L joint
   text rows). */
static void test_cpu_memory_formula(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    random_model(&m, &config);
    const layout_memory formula = model_layout_memory(&m.layout, LAYOUT_BACKEND_CPU, RECOMPUTE_NONE, 0);
    const int mixes[3][3] = {{0, 1, 2}, {1, 1, 1}, {2, 2, 0}};
    for (int k = 0; k < 3; k++) {
        test_batch t;
        make_batch(&t, &m, mixes[k], 3);
        model_forward_loss(&m, &t.batch, NULL);
        int64_t tokens = 0, text = 0;
        for (int b = 0; b < 3; b++) {
            tokens += (int64_t)t.frames[b] * (t.height[b] / 2) * (t.width[b] / 2);
            text += t.text_len[b] + t.text_2_len[b] + t.image_len[b];
        }
        const int64_t predicted = layout_memory_bytes(&formula, tokens, 3, text), carved = model_workspace_bytes(&m);
        print_message("# mix %d: %lld tokens, %lld text rows: formula %lld bytes, CPU model %lld\n", k, (long long)tokens,
                      (long long)text, (long long)predicted, (long long)carved);
        assert_true(carved <= predicted);
        free_batch(&t);
    }
    model_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_size_names_and_shapes),
        cmocka_unit_test(test_packing_invariance),
        cmocka_unit_test(test_i2v_condition),
        cmocka_unit_test(test_cpu_memory_formula),
        cmocka_unit_test(test_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
