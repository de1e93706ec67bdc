/* test_model.c — the Wan DiT on the CPU: gradients of a block and of the whole tiny model, packing invariance, Wan names/shapes, determinism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/model.h"
#include "gradient_check.h"

/* Finite-difference step, larger than the ops tests' 1e-2: the loss sums many fp32 terms and some
   gradients are small (a key bias barely moves a softmax), so roundoff, which grows as 1/step, dominates
   at 1e-2; the truncation error at 3e-2 is still far below the tolerance. */
#define STEP 3e-2f
#define CHECKS_PER_PARAM 8

static void tiny_deck(deck *config)
{
    memset(config, 0, sizeof(*config));
    config->model.dim = 24;
    config->model.ffn_dim = 40;
    config->model.num_heads = 2;     /* head dim 12: RoPE pairs 2/2/2 */
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

static void wan_deck(deck *config, int dim, int ffn_dim, int num_heads, int num_layers)
{
    tiny_deck(config);
    config->model.dim = dim;
    config->model.ffn_dim = ffn_dim;
    config->model.num_heads = num_heads;
    config->model.num_layers = num_layers;
    config->model.in_dim = config->model.out_dim = 16;
    config->model.text_len = 512;
    config->model.text_dim = 4096;
    config->model.freq_dim = 256;
}

/* A micro-batch of up to 3 samples with their own storage. */
typedef struct {
    int32_t frames[3], height[3], width[3], text_len[3];
    float sigma[3];
    float *latents, *noise, *text;
    model_batch batch;
} test_batch;

static const int32_t SAMPLE_SHAPES[3][4] = {   /* frames, height, width, text tokens */
    {2, 4, 2, 3},   /* 4 tokens */
    {1, 2, 6, 6},   /* 3 tokens */
    {3, 2, 2, 1},   /* 3 tokens */
};
static const float SAMPLE_SIGMA[3] = {0.3f, 0.75f, 0.05f};

/* The samples `which[0..n)` (indices into SAMPLE_SHAPES), each with its own fixed data. */
static void make_batch(test_batch *t, const model *m, const int *which, int n_samples)
{
    memset(t, 0, sizeof(*t));
    int64_t n_latent = 0, n_text = 0;
    for (int i = 0; i < n_samples; i++) {
        const int32_t *shape = SAMPLE_SHAPES[which[i]];
        n_latent += (int64_t)m->in_dim * shape[0] * shape[1] * shape[2];
        n_text += (int64_t)shape[3] * m->text_dim;
    }
    t->latents = malloc((size_t)n_latent * sizeof(float));
    t->noise = malloc((size_t)n_latent * sizeof(float));
    t->text = malloc((size_t)(n_text + 1) * sizeof(float));
    int64_t latent_at = 0, text_at = 0;
    for (int i = 0; i < n_samples; i++) {
        const int32_t *shape = SAMPLE_SHAPES[which[i]];
        t->frames[i] = shape[0];
        t->height[i] = shape[1];
        t->width[i] = shape[2];
        t->text_len[i] = shape[3];
        t->sigma[i] = SAMPLE_SIGMA[which[i]];
        int64_t values = (int64_t)m->in_dim * shape[0] * shape[1] * shape[2];
        fill_random(t->latents + latent_at, values, 100 + which[i], 1.0f);
        fill_random(t->noise + latent_at, values, 200 + which[i], 1.5f);
        fill_random(t->text + text_at, (int64_t)shape[3] * m->text_dim, 300 + which[i], 1.0f);
        latent_at += values;
        text_at += (int64_t)shape[3] * m->text_dim;
    }
    t->batch = (model_batch){.n_samples = n_samples, .frames = t->frames, .height = t->height, .width = t->width,
                             .text_len = t->text_len, .latents = t->latents, .noise = t->noise, .sigma = t->sigma,
                             .text = t->text};
}

static void free_batch(test_batch *t)
{
    free(t->latents);
    free(t->noise);
    free(t->text);
}

static float *zero_floats(int64_t n)
{
    float *values = calloc((size_t)n, sizeof(float));
    assert_non_null(values);
    return values;
}

/* ---- whole model ---------------------------------------------------------------------------------- */

typedef struct { model *m; const model_batch *batch; } loss_context;

static double loss_objective(void *context)
{
    loss_context *c = context;
    return model_forward_loss(c->m, c->batch, NULL);
}

/* Every named parameter (a seeded subset of its values) against central differences of the loss. */
static void test_model_gradient(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 7, 0.3f);
    test_batch t;
    make_batch(&t, &m, (const int[]){0, 1, 2}, 3);
    float *grads = zero_floats(m.n_weights);
    double loss = model_forward_backward(&m, &t.batch, grads, 1.0f, NULL);
    assert_true(isfinite(loss) && loss > 0.0);
    loss_context c = {&m, &t.batch};
    double worst = 0.0;
    for (int i = 0; i < m.n_params; i++) {
        const param_info *p = &m.params[i];
        double error = gradient_error(loss_objective, &c, m.weights + p->offset, grads + p->offset, p->n_elements,
                                      CHECKS_PER_PARAM, STEP, 1000 + (uint64_t)i);
        ASSERT_GRADIENT(p->name, error);
        worst = error > worst ? error : worst;
    }
    print_message("# whole model: %d parameters checked, worst relative error %.2e\n", m.n_params, worst);
    free(grads);
    free_batch(&t);
    model_free(&m);
}

/* grads receive grad_scale * gradient ADDED to what they held. */
static void test_model_gradient_accumulates(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 8, 0.3f);
    test_batch t;
    make_batch(&t, &m, (const int[]){0, 2}, 2);
    float *plain = zero_floats(m.n_weights), *accumulated = zero_floats(m.n_weights);
    double sample_loss[2];
    double loss = model_forward_backward(&m, &t.batch, plain, 1.0f, sample_loss);
    assert_float_equal(loss, sample_loss[0] + sample_loss[1], 1e-12);
    for (int64_t i = 0; i < m.n_weights; i++) accumulated[i] = 1.0f;
    model_forward_backward(&m, &t.batch, accumulated, 0.5f, NULL);
    for (int64_t i = 0; i < m.n_weights; i++)
        assert_true(fabsf(accumulated[i] - (1.0f + 0.5f * plain[i])) <= 1e-5f * (1.0f + fabsf(plain[i])));
    free(plain);
    free(accumulated);
    free_batch(&t);
    model_free(&m);
}

/* ---- one block ------------------------------------------------------------------------------------- */

typedef struct { model *m; const float *x_in, *e0, *context, *out_weight; float *x_out; int64_t n_out; } block_context;

static double block_objective(void *context)
{
    block_context *c = context;
    model_block_forward(c->m, 0, c->x_in, c->e0, c->context, c->x_out);
    return weighted_sum(c->x_out, c->out_weight, c->n_out);
}

static void test_block_gradient(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 9, 0.3f);
    test_batch t;
    make_batch(&t, &m, (const int[]){0, 1, 2}, 3);
    int64_t n_text;
    int64_t n_tokens = model_pack(&m, 3, t.frames, t.height, t.width, t.text_len, &n_text);
    assert_int_equal(n_tokens, 10);
    assert_int_equal(n_text, 10);
    int64_t D = m.dim, n_x = n_tokens * D, n_e0 = 3 * 6 * D, n_context = n_text * D;
    float *x_in = zero_floats(n_x), *e0 = zero_floats(n_e0), *context = zero_floats(n_context);
    float *out_weight = zero_floats(n_x), *x_out = zero_floats(n_x);
    fill_random(x_in, n_x, 401, 2.0f);
    fill_random(e0, n_e0, 402, 0.5f);
    fill_random(context, n_context, 403, 1.0f);
    fill_random(out_weight, n_x, 404, 1.0f);
    block_context c = {&m, x_in, e0, context, out_weight, x_out, n_x};
    float *dx_in = zero_floats(n_x), *de0 = zero_floats(n_e0), *dcontext = zero_floats(n_context);
    float *grads = zero_floats(m.n_weights);
    block_objective(&c);
    model_block_backward(&m, 0, out_weight, dx_in, de0, dcontext, grads);
    ASSERT_GRADIENT("block dx_in", gradient_error(block_objective, &c, x_in, dx_in, n_x, 200, STEP, 405));
    ASSERT_GRADIENT("block de0", gradient_error(block_objective, &c, e0, de0, n_e0, 200, STEP, 406));
    ASSERT_GRADIENT("block dcontext", gradient_error(block_objective, &c, context, dcontext, n_context, 200, STEP, 407));
    int n_block_params = 0;
    for (int i = 0; i < m.n_params; i++) {
        const param_info *p = &m.params[i];
        if (strncmp(p->name, "blocks.0.", 9) != 0) continue;
        ASSERT_GRADIENT(p->name, gradient_error(block_objective, &c, m.weights + p->offset, grads + p->offset,
                                                p->n_elements, 3 * CHECKS_PER_PARAM, STEP, 2000 + (uint64_t)i));
        n_block_params++;
    }
    assert_int_equal(n_block_params, 27);
    /* nothing outside the block received a gradient */
    for (int i = 0; i < m.n_params; i++) {
        const param_info *p = &m.params[i];
        if (strncmp(p->name, "blocks.0.", 9) == 0) continue;
        for (int64_t j = 0; j < p->n_elements; j++) assert_float_equal(grads[p->offset + j], 0.0f, 0);
    }
    free(x_in); free(e0); free(context); free(out_weight); free(x_out); free(dx_in); free(de0); free(dcontext);
    free(grads);
    free_batch(&t);
    model_free(&m);
}

/* ---- packing ------------------------------------------------------------------------------------- */

static double relative_difference(const float *a, const float *b, int64_t n)
{
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        norm += (double)a[i] * a[i];
    }
    return sqrt(diff / (norm > 0 ? norm : 1));
}

/* Samples packed together give the losses and summed gradients they give alone: no leakage across
   samples in attention, RoPE positions, modulation or text. */
static void test_packing_invariance(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 10, 0.3f);
    test_batch together, reversed, alone[3];
    make_batch(&together, &m, (const int[]){0, 1, 2}, 3);
    make_batch(&reversed, &m, (const int[]){2, 1, 0}, 3);
    float *grads_together = zero_floats(m.n_weights), *grads_alone = zero_floats(m.n_weights);
    float *grads_reversed = zero_floats(m.n_weights);
    double loss_together[3], loss_reversed[3], loss_alone[3];
    double total = model_forward_backward(&m, &together.batch, grads_together, 1.0f, loss_together);
    model_forward_backward(&m, &reversed.batch, grads_reversed, 1.0f, loss_reversed);
    double sum_alone = 0.0;
    for (int b = 0; b < 3; b++) {
        make_batch(&alone[b], &m, (const int[]){b}, 1);
        sum_alone += model_forward_backward(&m, &alone[b].batch, grads_alone, 1.0f, &loss_alone[b]);
    }
    for (int b = 0; b < 3; b++) {
        print_message("# sample %d: packed %.9f, reversed %.9f, alone %.9f\n", b, loss_together[b],
                      loss_reversed[2 - b], loss_alone[b]);
        assert_true(fabs(loss_together[b] - loss_alone[b]) <= 1e-5 * loss_alone[b]);
        assert_true(fabs(loss_reversed[2 - b] - loss_alone[b]) <= 1e-5 * loss_alone[b]);
    }
    assert_true(fabs(total - sum_alone) <= 1e-5 * sum_alone);
    double grad_difference = relative_difference(grads_alone, grads_together, m.n_weights);
    print_message("# gradients: packed vs summed alone %.2e, reversed order %.2e\n", grad_difference,
                  relative_difference(grads_together, grads_reversed, m.n_weights));
    assert_true(grad_difference < 1e-5);
    assert_true(relative_difference(grads_together, grads_reversed, m.n_weights) < 1e-5);
    free(grads_together); free(grads_alone); free(grads_reversed);
    free_batch(&together);
    free_batch(&reversed);
    for (int b = 0; b < 3; b++) free_batch(&alone[b]);
    model_free(&m);
}

/* ---- Wan names and shapes ------------------------------------------------------------------------- */

typedef struct { const char *name; int ndim; int64_t shape[MODEL_MAX_NDIM]; } expected_param;

static void assert_param(const model *m, int index, const expected_param *expected)
{
    const param_info *p = &m->params[index];
    if (strcmp(p->name, expected->name) != 0) fail_msg("parameter %d is %s, Wan has %s", index, p->name, expected->name);
    assert_int_equal(p->ndim, expected->ndim);
    for (int d = 0; d < expected->ndim; d++) assert_int_equal(p->shape[d], expected->shape[d]);
}

/* Wan2.1-T2V-1.3B: dim 1536, ffn 8960, 12 heads, 30 layers -> 825 tensors, 1,418,996,800 parameters. */
static void test_wan_1_3b_names_and_shapes(void **state)
{
    (void)state;
    deck config;
    wan_deck(&config, 1536, 8960, 12, 30);
    model m;
    model_create_table(&m, &config);
    assert_null(m.weights);
    static const expected_param embeddings[] = {
        {"patch_embedding.weight", 5, {1536, 16, 1, 2, 2}}, {"patch_embedding.bias", 1, {1536}},
        {"text_embedding.0.weight", 2, {1536, 4096}},       {"text_embedding.0.bias", 1, {1536}},
        {"text_embedding.2.weight", 2, {1536, 1536}},       {"text_embedding.2.bias", 1, {1536}},
        {"time_embedding.0.weight", 2, {1536, 256}},        {"time_embedding.0.bias", 1, {1536}},
        {"time_embedding.2.weight", 2, {1536, 1536}},       {"time_embedding.2.bias", 1, {1536}},
        {"time_projection.1.weight", 2, {9216, 1536}},      {"time_projection.1.bias", 1, {9216}},
    };
    static const expected_param block0[] = {
        {"blocks.0.modulation", 3, {1, 6, 1536}},
        {"blocks.0.self_attn.q.weight", 2, {1536, 1536}},   {"blocks.0.self_attn.q.bias", 1, {1536}},
        {"blocks.0.self_attn.k.weight", 2, {1536, 1536}},   {"blocks.0.self_attn.k.bias", 1, {1536}},
        {"blocks.0.self_attn.v.weight", 2, {1536, 1536}},   {"blocks.0.self_attn.v.bias", 1, {1536}},
        {"blocks.0.self_attn.o.weight", 2, {1536, 1536}},   {"blocks.0.self_attn.o.bias", 1, {1536}},
        {"blocks.0.self_attn.norm_q.weight", 1, {1536}},    {"blocks.0.self_attn.norm_k.weight", 1, {1536}},
        {"blocks.0.norm3.weight", 1, {1536}},               {"blocks.0.norm3.bias", 1, {1536}},
        {"blocks.0.cross_attn.q.weight", 2, {1536, 1536}},  {"blocks.0.cross_attn.q.bias", 1, {1536}},
        {"blocks.0.cross_attn.k.weight", 2, {1536, 1536}},  {"blocks.0.cross_attn.k.bias", 1, {1536}},
        {"blocks.0.cross_attn.v.weight", 2, {1536, 1536}},  {"blocks.0.cross_attn.v.bias", 1, {1536}},
        {"blocks.0.cross_attn.o.weight", 2, {1536, 1536}},  {"blocks.0.cross_attn.o.bias", 1, {1536}},
        {"blocks.0.cross_attn.norm_q.weight", 1, {1536}},   {"blocks.0.cross_attn.norm_k.weight", 1, {1536}},
        {"blocks.0.ffn.0.weight", 2, {8960, 1536}},         {"blocks.0.ffn.0.bias", 1, {8960}},
        {"blocks.0.ffn.2.weight", 2, {1536, 8960}},         {"blocks.0.ffn.2.bias", 1, {1536}},
    };
    static const expected_param head[] = {
        {"head.modulation", 3, {1, 2, 1536}}, {"head.head.weight", 2, {64, 1536}}, {"head.head.bias", 1, {64}},
    };
    int n_embeddings = (int)(sizeof(embeddings) / sizeof(embeddings[0]));
    int n_block = (int)(sizeof(block0) / sizeof(block0[0]));
    assert_int_equal(m.n_params, n_embeddings + 30 * n_block + 3);
    for (int i = 0; i < n_embeddings; i++) assert_param(&m, i, &embeddings[i]);
    for (int i = 0; i < n_block; i++) assert_param(&m, n_embeddings + i, &block0[i]);
    for (int i = 0; i < 3; i++) assert_param(&m, m.n_params - 3 + i, &head[i]);
    assert_string_equal(m.params[n_embeddings + 29 * n_block].name, "blocks.29.modulation");
    /* one allocation, in table order */
    int64_t offset = 0;
    for (int i = 0; i < m.n_params; i++) {
        assert_int_equal(m.params[i].offset, offset);
        offset += m.params[i].n_elements;
    }
    assert_int_equal(m.n_weights, 1418996800);
    assert_non_null(model_find_param(&m, "blocks.17.cross_attn.norm_k.weight"));
    assert_null(model_find_param(&m, "blocks.30.modulation"));
    model_free(&m);

    /* Wan2.1-T2V-14B: dim 5120, ffn 13824, 40 heads, 40 layers -> 14,288,491,584 parameters */
    wan_deck(&config, 5120, 13824, 40, 40);
    model_create_table(&m, &config);
    assert_int_equal(m.n_weights, 14288491584);
    model_free(&m);

    /* without q/k norm and norm3 those tensors are absent */
    wan_deck(&config, 1536, 8960, 12, 1);
    config.model.qk_norm = 0;
    config.model.cross_attn_norm = 0;
    model_create_table(&m, &config);
    assert_null(model_find_param(&m, "blocks.0.self_attn.norm_q.weight"));
    assert_null(model_find_param(&m, "blocks.0.norm3.weight"));
    assert_int_equal(m.n_params, n_embeddings + n_block - 6 + 3);
    model_free(&m);
}

/* ---- the layout table's named offsets and the CPU memory formula ---------------------------------- */

static int64_t offset_of(const model *m, const char *name)
{
    const param_info *p = model_find_param(m, name);
    if (!p) fail_msg("no parameter %s", name);
    return p->offset;
}

/* Every offset the models read (model_layout's fields) is the offset of the tensor with that Wan name. */
static void check_named_offsets(const model *m)
{
    const model_layout *t = &m->layout;
    const struct { const char *name; int64_t offset; } outside[] = {
        {"patch_embedding.weight", t->patch.weight},      {"patch_embedding.bias", t->patch.bias},
        {"text_embedding.0.weight", t->text_in.weight},   {"text_embedding.0.bias", t->text_in.bias},
        {"text_embedding.2.weight", t->text_out.weight},  {"text_embedding.2.bias", t->text_out.bias},
        {"time_embedding.0.weight", t->time_in.weight},   {"time_embedding.0.bias", t->time_in.bias},
        {"time_embedding.2.weight", t->time_out.weight},  {"time_embedding.2.bias", t->time_out.bias},
        {"time_projection.1.weight", t->time_projection.weight}, {"time_projection.1.bias", t->time_projection.bias},
        {"head.modulation", t->head_modulation},          {"head.head.weight", t->head.weight},
        {"head.head.bias", t->head.bias},
    };
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++)
        if (offset_of(m, outside[i].name) != outside[i].offset)
            fail_msg("%s at %lld, the layout says %lld", outside[i].name, (long long)offset_of(m, outside[i].name),
                     (long long)outside[i].offset);
    for (int l = 0; l < m->num_layers; l++) {
        const layout_block b = model_layout_block(t, l);
        const struct { const char *name; int64_t offset; } block[] = {
            {"modulation", b.modulation},
            {"self_attn.q.weight", b.self_q.weight}, {"self_attn.q.bias", b.self_q.bias},
            {"self_attn.k.weight", b.self_k.weight}, {"self_attn.k.bias", b.self_k.bias},
            {"self_attn.v.weight", b.self_v.weight}, {"self_attn.v.bias", b.self_v.bias},
            {"self_attn.o.weight", b.self_o.weight}, {"self_attn.o.bias", b.self_o.bias},
            {"self_attn.norm_q.weight", b.self_norm_q}, {"self_attn.norm_k.weight", b.self_norm_k},
            {"norm3.weight", b.norm3_weight}, {"norm3.bias", b.norm3_bias},
            {"cross_attn.q.weight", b.cross_q.weight}, {"cross_attn.q.bias", b.cross_q.bias},
            {"cross_attn.k.weight", b.cross_k.weight}, {"cross_attn.k.bias", b.cross_k.bias},
            {"cross_attn.v.weight", b.cross_v.weight}, {"cross_attn.v.bias", b.cross_v.bias},
            {"cross_attn.o.weight", b.cross_o.weight}, {"cross_attn.o.bias", b.cross_o.bias},
            {"cross_attn.norm_q.weight", b.cross_norm_q}, {"cross_attn.norm_k.weight", b.cross_norm_k},
            {"ffn.0.weight", b.ffn_in.weight}, {"ffn.0.bias", b.ffn_in.bias},
            {"ffn.2.weight", b.ffn_out.weight}, {"ffn.2.bias", b.ffn_out.bias},
        };
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blocks.%d.%s", l, block[i].name);
            const param_info *p = model_find_param(m, name);
            const int64_t expected = p ? p->offset : -1;   /* an absent tensor: -1 */
            if (expected != block[i].offset)
                fail_msg("%s at %lld, the layout says %lld", name, (long long)expected, (long long)block[i].offset);
        }
        /* the block's tensors fill [start, start + stride) */
        const int64_t start = t->blocks_offset + (int64_t)l * t->block_stride;
        char first[64];
        snprintf(first, sizeof first, "blocks.%d.modulation", l);
        assert_int_equal(offset_of(m, first), start);
    }
    assert_int_equal(t->blocks_offset + m->num_layers * t->block_stride, t->head_modulation);
}

static void test_layout_offsets(void **state)
{
    (void)state;
    deck config;
    model m;
    wan_deck(&config, 1536, 8960, 12, 30);
    model_create_table(&m, &config);
    check_named_offsets(&m);
    model_free(&m);
    wan_deck(&config, 1536, 8960, 12, 2);
    config.model.qk_norm = 0;
    config.model.cross_attn_norm = 0;
    model_create_table(&m, &config);
    check_named_offsets(&m);
    assert_int_equal(model_layout_block(&m.layout, 1).self_norm_q, -1);
    assert_int_equal(model_layout_block(&m.layout, 1).norm3_bias, -1);
    model_free(&m);
}

/* layout_gpu_split_bytes against the pieces of model_gpu.cu's head layout counted by hand (the GPU tests check the
   formula against the arena the GPU model carves: gpu_ulysses.sh): D 64, 4 heads, 2 blocks, in_dim 16, patch 1x2x2,
   one sample of 1,152 tokens on k = 2: rows 1,152 + 128, per block q, k, v, out 2 * 1280 * 32 bytes each and the
   log-sum-exp 4 * 1280 * 2; four gradients once; staging 2 * 3 * 576 * 64; latents and noise 4 * 1152 * 64 each;
   tables 40 bytes in one 256-byte piece; cuDNN's buffer 4 * 2 * 1280 * 17. */
static void test_gpu_split_formula(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.model.dim = 64;
    config.model.num_heads = 4;
    config.model.num_layers = 2;
    config.model.in_dim = config.model.out_dim = 16;
    config.model.patch_t = 1;
    config.model.patch_h = config.model.patch_w = 2;
    model m;
    model_create_table(&m, &config);
    const int64_t per_set = 4 * 81920 + 10240, grads = 4 * 81920, staging = 221184, latents = 2 * 294912;
    const int64_t tables = 256, cudnn = 4 * 2 * 1280 * 17;
    assert_int_equal(layout_gpu_split_bytes(&m.layout, RECOMPUTE_NONE, 1152, 1, 2),
                     2 * per_set + grads + staging + latents + tables + cudnn);
    assert_int_equal(layout_gpu_split_bytes(&m.layout, RECOMPUTE_BLOCK, 1152, 1, 2),
                     per_set + grads + staging + latents + tables + cudnn);
    /* k = 4 holds half the heads' columns: every per-head piece halves, the staging halves, the latents stay */
    const int64_t k4 = layout_gpu_split_bytes(&m.layout, RECOMPUTE_NONE, 1152, 1, 4);
    assert_int_equal(k4, (2 * per_set + grads + staging + cudnn) / 2 + latents + tables);
    model_free(&m);
}

/* The same for hunyuanvideo15 (cuda/mmdit_gpu.cu's group buffers, carve_sp; the GPU model checks what it carves against
   the formula: gpu_mmdit_ulysses.sh): D 64, 4 heads, 2 blocks, out_dim 8, patch 1x2x2 (32 values per token), a
   micro-batch of 3 samples with 595 tokens and 38 joint text rows, joint length 633, on k = 2: joint rows
   633 + 128 * 4 = 1,145; per block q, k, v, out 2 * 1145 * 32 bytes each (73,280: 73,472 aligned) and the log-sum-exps
   4 * 1145 * 2 (9,216 aligned); four gradients once; the exchange's rows 2 * 3 * 633 * 32 (121,600 aligned) and the
   member's own 2 * 3 * 318 * 64 (ceil(633 / 2) + 1 rows: 122,112); latents and noise 4 * 633 * 32 each (81,152
   aligned); tables 56 bytes (256); the joint map 4 * 1145 (4,608 aligned); cuDNN's buffer 4 * 2 * 1145 * 17. */
static void test_gpu_split_formula_mmdit(void **state)
{
    (void)state;
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
    config.model.patch_h = config.model.patch_w = 2;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.text_2_dim = 24;
    config.model.image_dim = 40;
    config.model.rope_axes_t = 4;
    model m;
    model_create_table(&m, &config);
    const int64_t per_set = 4 * 73472 + 9216, grads = 4 * 73472, exchange = 121600 + 122112, latents = 2 * 81152;
    const int64_t tables = 256, map = 4608, cudnn = 4 * 2 * 1145 * 17;
    assert_int_equal(layout_gpu_split_bytes(&m.layout, RECOMPUTE_NONE, 633, 3, 2),
                     2 * per_set + grads + exchange + latents + tables + map + cudnn);
    assert_int_equal(layout_gpu_split_bytes(&m.layout, RECOMPUTE_BLOCK, 633, 3, 2),
                     per_set + grads + exchange + latents + tables + map + cudnn);
    model_free(&m);
}

/* The CPU backend's formula against what the CPU model carves for a micro-batch: never less, more only by
   the padding after each of its 35 pieces per block and 40 outside (at most 60 bytes each), and, where
   every piece is a whole number of 16 floats (tokens, samples and text rows multiples of 16), exactly by
   the padding it allows for. */
static void test_cpu_memory_formula(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model m;
    model_create(&m, &config);
    const layout_memory formula = model_layout_memory(&m.layout, LAYOUT_BACKEND_CPU, RECOMPUTE_NONE, 0);
    const layout_memory block = model_layout_memory(&m.layout, LAYOUT_BACKEND_CPU, RECOMPUTE_BLOCK, 0);
    assert_memory_equal(&formula, &block, sizeof formula);   /* the CPU model keeps everything */
    const int64_t padding = (35 * (int64_t)m.num_layers + 40) * 60;
    enum { MOST = 32 };
    /* samples: latent frames, height, width, text tokens (patch 1x2x2: frames * height/2 * width/2 tokens) */
    const int32_t shapes[4][4] = {{2, 4, 2, 3}, {1, 2, 6, 6}, {2, 4, 4, 6}, {1, 2, 2, 1}};
    const int mixes[5][2] = {{3, 0}, {5, 1}, {16, 2}, {16, 3}, {32, 2}};   /* samples, shape */
    for (int k = 0; k < 5; k++) {
        int32_t frames[MOST], height[MOST], width[MOST], text_len[MOST];
        const int n = mixes[k][0];
        for (int b = 0; b < n; b++) {
            const int32_t *shape = shapes[k == 0 ? b : mixes[k][1]];
            frames[b] = shape[0], height[b] = shape[1], width[b] = shape[2], text_len[b] = shape[3];
        }
        int64_t n_text = 0;
        const int64_t n_tokens = model_pack(&m, n, frames, height, width, text_len, &n_text);
        const int64_t predicted = layout_memory_bytes(&formula, n_tokens, n, n_text);
        const int64_t carved = model_workspace_bytes(&m);
        print_message("# %d samples, %lld tokens, %lld text rows: formula %lld bytes, CPU model %lld\n", n,
                      (long long)n_tokens, (long long)n_text, (long long)predicted, (long long)carved);
        assert_true(carved <= predicted);
        assert_true(predicted - carved <= padding);
        if (n % 16 == 0 && n_tokens % 16 == 0 && n_text % 16 == 0) assert_int_equal(predicted - padding, carved);
    }
    model_free(&m);
}

/* ---- init and determinism ------------------------------------------------------------------------- */

static void test_init_and_determinism(void **state)
{
    (void)state;
    deck config;
    tiny_deck(&config);
    model a, b;
    model_create(&a, &config);
    model_create(&b, &config);
    model_init_random(&a, 42);
    model_init_random(&b, 42);
    assert_memory_equal(a.weights, b.weights, (size_t)a.n_weights * sizeof(float));
    test_batch t;
    make_batch(&t, &a, (const int[]){0, 1, 2}, 3);
    float *grads_a = zero_floats(a.n_weights), *grads_b = zero_floats(b.n_weights);
    double loss_a = model_forward_backward(&a, &t.batch, grads_a, 1.0f, NULL);
    double loss_b = model_forward_backward(&b, &t.batch, grads_b, 1.0f, NULL);
    assert_memory_equal(&loss_a, &loss_b, sizeof(double));
    assert_memory_equal(grads_a, grads_b, (size_t)a.n_weights * sizeof(float));
    assert_memory_equal(&loss_a, &(double){model_forward_loss(&a, &t.batch, NULL)}, sizeof(double));
    model_init_random(&b, 43);
    assert_true(memcmp(a.weights, b.weights, (size_t)a.n_weights * sizeof(float)) != 0);

    /* Wan's init: zero head and biases, unit norms, xavier bounds, modulation ~ N(0, 1/dim) */
    for (int i = 0; i < a.n_params; i++) {
        const param_info *p = &a.params[i];
        const float *w = a.weights + p->offset;
        const char *name = p->name;
        size_t length = strlen(name);
        int is_bias = length > 5 && strcmp(name + length - 5, ".bias") == 0;
        int is_norm = strstr(name, "norm") != NULL;
        double sum_sq = 0.0, largest = 0.0;
        for (int64_t j = 0; j < p->n_elements; j++) {
            sum_sq += (double)w[j] * w[j];
            largest = fabs(w[j]) > largest ? fabs(w[j]) : largest;
        }
        if (strcmp(name, "head.head.weight") == 0 || is_bias) {
            assert_true(largest == 0.0);
        } else if (is_norm) {
            for (int64_t j = 0; j < p->n_elements; j++) assert_float_equal(w[j], 1.0f, 0);
        } else if (strstr(name, "modulation")) {
            double std = sqrt(sum_sq / p->n_elements);
            assert_true(std > 0.5 / sqrt(a.dim) && std < 1.5 / sqrt(a.dim));
        } else if (strncmp(name, "text_embedding", 14) == 0 || strncmp(name, "time_embedding", 14) == 0) {
            double std = sqrt(sum_sq / p->n_elements);
            assert_true(std > 0.5 * config.model.init_std && std < 1.5 * config.model.init_std);
        } else {
            double fan_out = (double)p->shape[0], fan_in = (double)p->n_elements / p->shape[0];
            assert_true(largest <= sqrt(6.0 / (fan_in + fan_out)));
            assert_true(largest > 0.5 * sqrt(6.0 / (fan_in + fan_out)));
        }
    }
    /* with the head at zero the prediction is the head bias (0): the loss is the mean of (eps - x0)^2 */
    double sample_loss[3];
    model_forward_loss(&a, &t.batch, sample_loss);
    int64_t n_values = (int64_t)a.in_dim * t.frames[0] * t.height[0] * t.width[0];
    double expected = 0.0;
    for (int64_t i = 0; i < n_values; i++) {
        double target = (double)t.noise[i] - t.latents[i];
        expected += target * target;
    }
    assert_float_equal(sample_loss[0], expected / n_values, 1e-6 * expected / n_values);
    free(grads_a);
    free(grads_b);
    free_batch(&t);
    model_free(&a);
    model_free(&b);
}

/* ---- bad input ------------------------------------------------------------------------------------ */

/* The child runs the forward on a bad batch: it must exit with status 2 (bad input), not crash. */
static int exit_status_of_bad_batch(int32_t bad_height, int32_t bad_text_len)
{
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        deck config;
        tiny_deck(&config);
        model m;
        model_create(&m, &config);
        test_batch t;
        make_batch(&t, &m, (const int[]){0}, 1);
        t.height[0] = bad_height;
        t.text_len[0] = bad_text_len;
        freopen("/dev/null", "w", stderr);
        model_forward_loss(&m, &t.batch, NULL);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_bad_batch(void **state)
{
    (void)state;
    assert_int_equal(exit_status_of_bad_batch(3, 3), 2);    /* height not a multiple of patch_h */
    assert_int_equal(exit_status_of_bad_batch(4, 7), 2);    /* more text tokens than text_len (6) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wan_1_3b_names_and_shapes),
        cmocka_unit_test(test_layout_offsets),
        cmocka_unit_test(test_cpu_memory_formula),
        cmocka_unit_test(test_gpu_split_formula),
        cmocka_unit_test(test_gpu_split_formula_mmdit),
        cmocka_unit_test(test_init_and_determinism),
        cmocka_unit_test(test_block_gradient),
        cmocka_unit_test(test_model_gradient),
        cmocka_unit_test(test_model_gradient_accumulates),
        cmocka_unit_test(test_packing_invariance),
        cmocka_unit_test(test_bad_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
