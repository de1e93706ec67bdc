/* test_cuda_mmdit.c — cmocka tests of HunyuanVideo-1.5's GPU model (cuda/mmdit_gpu.cu) against its CPU model
   (src/model/mmdit.c): loss, per-sample losses and every parameter's gradient on a tiny model over packed batches of
   different video shapes and caption sources (Qwen, ByT5, image rows), with the joint attention on our own kernel
   and on cuDNN; gradient accumulation; block recomputation against none (bit for bit); the forward-only loss; the
   gradient-readiness ranges and their replay; the workspace against the layout's memory formula (also at full
   size). Tolerances are test_cuda_model.c's for Wan (bf16 activations against the fp32 oracle). */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_test_util.h"

#ifdef HAVE_CUDA

#include <math.h>

#include "core/check.h"
#include "core/rng.h"
#include "cuda/gpu.h"
#include "cuda/model_gpu.h"
#include "deck/deck.h"
#include "model/model.h"

static const double kLossTolerance = 2e-2;     /* relative, bf16 activations (test_cuda_model.c's) */
static const double kGradientTolerance = 5e-2; /* relative, whole vector and each parameter (the same) */

enum { kMaxSamples = 12, kCapacityTokens = 256, kCapacityText = 96 };

/* Samples: latent frames, height, width; Qwen, ByT5 and image rows; sigma. */
typedef struct {
    int n_samples;
    int32_t frames[kMaxSamples], height[kMaxSamples], width[kMaxSamples];
    int32_t text_len[kMaxSamples], text_2_len[kMaxSamples], image_len[kMaxSamples];
    float sigma[kMaxSamples];
    unsigned char i2v[kMaxSamples];   /* 1: image-to-video (the condition latent and mask from x0's first frame) */
} batch_spec;

typedef struct {
    model_batch batch;
    float *latents, *noise, *text, *text_2, *image;
} host_batch;

/* D 64, F 128, 4 heads of 16 (RoPE pairs 2/3/3), out_dim 8 (in_dim 17) with patch 1x2x2: 68 input values per token
   (the GEMM's padded columns), text dims 32, 24 and 40, freq_dim 32, captions up to 16 Qwen rows. */
static void tiny_deck(deck *config, int num_layers)
{
    deck_defaults(config);
    config->model.family = FAMILY_HUNYUANVIDEO15;
    config->model.text_padding = TEXT_PADDING_TRIM;
    config->model.dim = 64;
    config->model.ffn_dim = 128;
    config->model.num_heads = 4;
    config->model.num_layers = num_layers;
    config->model.out_dim = 8;
    config->model.in_dim = 17;
    config->model.patch_t = 1;
    config->model.patch_h = 2;
    config->model.patch_w = 2;
    config->model.text_len = 16;
    config->model.text_dim = 32;
    config->model.text_2_dim = 24;
    config->model.image_dim = 40;
    config->model.rope_axes_t = 4;
    config->model.freq_dim = 32;
}

static void tiny_model(model *m, int num_layers, uint64_t seed)
{
    deck config;
    tiny_deck(&config, num_layers);
    model_create(m, &config);
    model_init_gaussian(m, seed, 0.1f);
}

static float *random_values(int64_t n, uint64_t *seed)
{
    float *values = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; ++i) values[i] = (float)rng_normal(seed);
    return values;
}

static void make_batch(const model *m, const batch_spec *spec, uint64_t seed, host_batch *hb)
{
    memset(hb, 0, sizeof *hb);   /* sp_size 0: this rank alone */
    int64_t latent = 0, text = 0, text_2 = 0, image = 0;
    for (int b = 0; b < spec->n_samples; ++b) {
        latent += (int64_t)m->out_dim * spec->frames[b] * spec->height[b] * spec->width[b];
        text += (int64_t)spec->text_len[b] * m->text_dim;
        text_2 += (int64_t)spec->text_2_len[b] * m->text_2_dim;
        image += (int64_t)spec->image_len[b] * m->image_dim;
    }
    hb->latents = random_values(latent, &seed);
    hb->noise = random_values(latent, &seed);
    hb->text = random_values(text, &seed);
    hb->text_2 = random_values(text_2, &seed);
    hb->image = random_values(image, &seed);
    model_batch *batch = &hb->batch;
    batch->n_samples = spec->n_samples;
    batch->frames = spec->frames;
    batch->height = spec->height;
    batch->width = spec->width;
    batch->text_len = spec->text_len;
    batch->text_2_len = spec->text_2_len;
    batch->image_len = spec->image_len;
    batch->sigma = spec->sigma;
    batch->i2v = spec->i2v;
    batch->latents = hb->latents;
    batch->noise = hb->noise;
    batch->text = hb->text;
    batch->text_2 = hb->text_2;
    batch->image = hb->image;
}

static void free_batch(host_batch *hb)
{
    free(hb->latents);
    free(hb->noise);
    free(hb->text);
    free(hb->text_2);
    free(hb->image);
}

/* One micro-batch on both backends from the same weights (expect_gpu_matches_cpu: losses and every gradient, then a
   second call that must add the same gradient). min_cudnn_tokens > 0 sends the joint attention of samples of that
   many joint rows to cuDNN. */
static void compare_with_cpu(const char *case_name, const batch_spec *spec, uint64_t seed, int64_t min_cudnn_tokens)
{
    model m;
    tiny_model(&m, 2, seed);
    host_batch hb;
    make_batch(&m, spec, seed + 1, &hb);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, kCapacityTokens, kMaxSamples, kCapacityText);
    if (min_cudnn_tokens > 0)
        assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, min_cudnn_tokens), 1);
    gpu_model_upload_weights(gm, m.weights);
    expect_gpu_matches_cpu(case_name, &m, gm, &hb.batch, kLossTolerance, kGradientTolerance);
    gpu_model_free(gm);
    free_batch(&hb);
    model_free(&m);
}

/* Text-to-video with Qwen captions only: an image (1x4x4: 4 tokens) and two videos (3x4x6: 18; 2x6x4: 12 tokens),
   captions of 16, 5 and 1 rows. */
static void test_qwen_only(void **state)
{
    (void)state;
    const batch_spec spec = {3, {1, 3, 2}, {4, 4, 6}, {4, 6, 4}, {16, 5, 1}, {0, 0, 0}, {0, 0, 0},
                             {0.2f, 0.5f, 0.9f}, {0}};
    compare_with_cpu("Qwen captions, 3 samples packed", &spec, 0x3eed0001ull, 0);
}

/* Every caption source: ByT5 rows on two samples, SigLIP image rows (image-to-video's) on two, one with both. */
static void test_all_sources(void **state)
{
    (void)state;
    const batch_spec spec = {4, {2, 1, 3, 1}, {4, 6, 2, 2}, {2, 4, 6, 2}, {3, 7, 1, 16}, {2, 0, 3, 0}, {0, 4, 2, 0},
                             {0.3f, 0.75f, 0.05f, 0.5f}, {0}};
    compare_with_cpu("Qwen, ByT5 and image rows, 4 samples packed", &spec, 0x3eed0002ull, 0);
}

/* Image-to-video beside text-to-video: two videos with SigLIP rows trained as image-to-video (x0's first latent frame
   in the condition channels, 1 in the mask on it), one video and an image as text-to-video, as the CPU model builds
   them (mmdit.c, put_condition). */
static void test_image_to_video(void **state)
{
    (void)state;
    const batch_spec spec = {4, {3, 1, 2, 4}, {4, 6, 2, 4}, {6, 4, 6, 2}, {5, 7, 2, 9}, {2, 0, 3, 1}, {4, 0, 2, 3},
                             {0.3f, 0.75f, 0.6f, 0.45f}, {1, 0, 0, 1}};
    compare_with_cpu("image-to-video and text-to-video, 4 samples packed", &spec, 0x3eed0004ull, 0);
}

/* Eleven samples in one micro-batch: the per-sample Linears (time, modulation, refiner conditioning, head) take their
   rows in tiles of 8, here a whole tile and a part of one, and the gates' sums over each sample's rows their parts. */
static void test_many_samples(void **state)
{
    (void)state;
    const batch_spec spec = {11, {1, 2, 1, 1, 3, 1, 2, 1, 1, 2, 1}, {4, 4, 2, 4, 2, 6, 2, 4, 2, 4, 2},
                             {4, 2, 4, 6, 4, 2, 4, 2, 2, 4, 4}, {3, 1, 5, 2, 7, 1, 4, 2, 6, 1, 3},
                             {0, 2, 0, 1, 0, 0, 3, 0, 0, 1, 0}, {0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 0},
                             {0.3f, 0.75f, 0.05f, 0.5f, 0.9f, 0.2f, 0.6f, 0.35f, 0.15f, 0.8f, 0.45f},
                             {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}};
    compare_with_cpu("11 samples packed", &spec, 0x3eed0005ull, 0);
}

/* The joint attention of samples of 24 joint rows or more on cuDNN (over whole tiles of the joint layout), the rest
   on our own kernel: 4 + 16, 18 + 9, 12 + 6 and 30 + 4 joint rows. Skipped where aldit is built without cuDNN. */
static void test_cudnn_joint_attention(void **state)
{
    (void)state;
#ifdef HAVE_CUDNN
    const batch_spec spec = {4, {1, 3, 2, 5}, {4, 4, 6, 4}, {4, 6, 4, 6}, {16, 5, 3, 4}, {0, 4, 3, 0}, {0, 0, 0, 0},
                             {0.2f, 0.5f, 0.9f, 0.4f}, {0}};
    compare_with_cpu("joint attention on cuDNN for samples of 24 rows or more", &spec, 0x3eed0003ull, 24);
#else
    skip();
#endif
}

/* gpu_model_prepare ([train] prebuild): the cuDNN plans of the samples' joint lengths (those on cuDNN: 27 and 34 rows,
   both on one 128-row tile) built before the call, forward and backward, once; the call then builds none. */
static void test_prepare_plans(void **state)
{
    (void)state;
#ifdef HAVE_CUDNN
    const batch_spec spec = {4, {1, 3, 2, 5}, {4, 4, 6, 4}, {4, 6, 4, 6}, {16, 5, 3, 4}, {0, 4, 3, 0}, {0, 0, 0, 0},
                             {0.2f, 0.5f, 0.9f, 0.4f}, {0}};
    model m;
    tiny_model(&m, 2, 0x3eed0006ull);
    host_batch hb;
    make_batch(&m, &spec, 0x3eed0007ull, &hb);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, kCapacityTokens, kMaxSamples, kCapacityText);
    assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 24), 1);
    gpu_model_upload_weights(gm, m.weights);
    int32_t tokens[4], rows[4];
    for (int b = 0; b < spec.n_samples; ++b) {   /* patch 1x2x2 */
        tokens[b] = spec.frames[b] * (spec.height[b] / 2) * (spec.width[b] / 2);
        rows[b] = spec.text_len[b] + spec.text_2_len[b] + spec.image_len[b];
    }
    expect_prepared_plans(gm, tokens, rows, spec.n_samples, 2, &hb.batch);
    gpu_model_free(gm);
    free_batch(&hb);
    model_free(&m);
#else
    skip();
#endif
}

/* [train] prebuild's budget counts whole tiles, the only shape the joint family's attention runs: 128 lengths that
   share one tile (1,025 to 1,152 joint rows) and one length in the tile below (900) are two shapes, 4 plans, where a
   budget counting lengths (half of ATTENTION_CUDNN_PLAN_SLOTS / 2 plans each) spent itself on the first tile. */
static void test_prepare_plans_tiles(void **state)
{
    (void)state;
#ifdef HAVE_CUDNN
    model m;
    tiny_model(&m, 1, 0x3eed0016ull);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, kCapacityTokens, kMaxSamples, kCapacityText);
    assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 24), 1);
    enum { kLengths = 129 };
    int32_t tokens[kLengths], rows[kLengths];
    for (int i = 0; i < kLengths; ++i) {
        rows[i] = 10 + i % 7;
        tokens[i] = (i < 128 ? 1025 + i : 900) - rows[i];
    }
    const int64_t built = gpu_model_prepare(gm, tokens, rows, kLengths);
    printf("# %d joint lengths on 2 tiles (1152 and 1024 rows): %lld plan(s), 4 expected\n", kLengths, (long long)built);
    assert_int_equal(built, 4);
    assert_int_equal(gpu_model_prepare(gm, tokens, rows, kLengths), 0);
    gpu_model_free(gm);
    model_free(&m);
#else
    skip();
#endif
}

static void four_layer_case(uint64_t seed, model *m, batch_spec *spec, host_batch *hb)
{
    *spec = (batch_spec){3, {1, 3, 2}, {4, 4, 6}, {4, 6, 4}, {16, 5, 2}, {2, 0, 3}, {0, 4, 2}, {0.2f, 0.5f, 0.9f}, {0}};
    tiny_model(m, 4, seed);
    make_batch(m, spec, seed + 1, hb);
}

/* recompute = block against none (4 layers, so that middle blocks are re-run): the same kernels on the same inputs,
   so the losses and every gradient equal to the bit; and block mode's workspace smaller. */
static void test_recompute_match(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x3eed0004ull, &m, &spec, &hb);
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    double loss[2], sample_loss[2][kMaxSamples];
    float *grads[2];
    size_t workspace[2];
    gpu_select(0);
    for (int i = 0; i < 2; ++i) {
        workspace[i] = gpu_model_workspace_bytes_with_recompute(&m, kCapacityTokens, kMaxSamples, kCapacityText, modes[i]);
        gpu_model *gm = gpu_model_create_with_recompute(&m, kCapacityTokens, kMaxSamples, kCapacityText, modes[i]);
        gpu_model_upload_weights(gm, m.weights);
        loss[i] = gpu_model_forward_backward(gm, &hb.batch, 1.0f / (float)spec.n_samples, sample_loss[i], 0);
        grads[i] = xmalloc((size_t)m.n_weights * sizeof(float));
        gpu_model_download_grads(gm, grads[i]);
        gpu_model_free(gm);
    }
    int64_t differing = 0, nonfinite = 0;
    for (int64_t j = 0; j < m.n_weights; ++j) {
        if (!isfinite(grads[1][j])) ++nonfinite;
        if (memcmp(&grads[0][j], &grads[1][j], sizeof(float)) != 0) ++differing;
    }
    printf("# recompute block vs none: loss %.9g vs %.9g; %lld of %lld gradient values differ, %lld not finite; "
           "workspace %zu vs %zu bytes\n", loss[1], loss[0], (long long)differing, (long long)m.n_weights,
           (long long)nonfinite, workspace[1], workspace[0]);
    if (loss[1] != loss[0]) fail_msg("recompute block: loss %.9g, none: %.9g", loss[1], loss[0]);
    for (int b = 0; b < spec.n_samples; ++b)
        if (sample_loss[1][b] != sample_loss[0][b]) fail_msg("recompute block: sample %d's loss differs", b);
    if (differing > 0 || nonfinite > 0)
        fail_msg("recompute block: %lld gradient values differ from none's, %lld not finite", (long long)differing,
                 (long long)nonfinite);
    if (!(workspace[1] < workspace[0])) fail_msg("recompute block: workspace %zu not less than %zu", workspace[1], workspace[0]);
    for (int i = 0; i < 2; ++i) free(grads[i]);
    free_batch(&hb);
    model_free(&m);
}

/* The forward-only loss equals the forward + backward's, to the bit. */
static void test_forward_loss_matches(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x3eed0005ull, &m, &spec, &hb);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, kCapacityTokens, kMaxSamples, kCapacityText);
    gpu_model_upload_weights(gm, m.weights);
    double forward_only[kMaxSamples], with_backward[kMaxSamples];
    const double a = gpu_model_forward_loss(gm, &hb.batch, forward_only, 0);
    const double b = gpu_model_forward_backward(gm, &hb.batch, 1.0f, with_backward, 0);
    printf("# forward only %.9g, forward + backward %.9g\n", a, b);
    assert_true(a == b);
    for (int s = 0; s < spec.n_samples; ++s) assert_true(forward_only[s] == with_backward[s]);
    gpu_model_free(gm);
    free_batch(&hb);
    model_free(&m);
}

typedef struct {
    const gpu_model *gm;
    int n_ranges;
    int64_t first[64], count[64];
    float *snapshot;
} ready_record;

static void record_ready(void *context, int64_t first, int64_t count, cudaStream_t stream)
{
    ready_record *record = context;
    assert_true(record->n_ranges < 64);
    record->first[record->n_ranges] = first;
    record->count[record->n_ranges] = count;
    record->n_ranges++;
    if (!record->snapshot) return;
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(record->snapshot + first, gpu_model_get_buffers(record->gm).grads + first,
                          (size_t)count * sizeof(float), cudaMemcpyDeviceToHost));
}

/* Each reported range is final when reported (its values then equal to the bit to those after the call), the ranges
   cover every value once, and gpu_model_grads_ready_all replays the same sequence; both recomputation modes. */
static void test_grads_ready_ranges(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x3eed0006ull, &m, &spec, &hb);
    gpu_select(0);
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    float *final_grads = xmalloc((size_t)m.n_weights * sizeof(float));
    unsigned char *covered = xmalloc((size_t)m.n_weights);
    for (int i = 0; i < 2; ++i) {
        gpu_model *gm = gpu_model_create_with_recompute(&m, kCapacityTokens, kMaxSamples, kCapacityText, modes[i]);
        gpu_model_upload_weights(gm, m.weights);
        ready_record during = {.gm = gm, .snapshot = xmalloc((size_t)m.n_weights * sizeof(float))};
        gpu_model_set_grads_ready(gm, record_ready, &during);
        gpu_model_forward_backward(gm, &hb.batch, 1.0f, NULL, 0);
        gpu_model_download_grads(gm, final_grads);
        ready_record replay = {.gm = gm};
        gpu_model_set_grads_ready(gm, record_ready, &replay);
        gpu_model_grads_ready_all(gm, 0);
        memset(covered, 0, (size_t)m.n_weights);
        for (int r = 0; r < during.n_ranges; ++r)
            for (int64_t j = during.first[r]; j < during.first[r] + during.count[r]; ++j) covered[j]++;
        int64_t not_once = 0, changed = 0;
        for (int64_t j = 0; j < m.n_weights; ++j) {
            not_once += covered[j] != 1;
            changed += memcmp(&during.snapshot[j], &final_grads[j], sizeof(float)) != 0;
        }
        printf("# recompute %d: %d ranges, %lld values not covered once, %lld changed after their report\n", i,
               during.n_ranges, (long long)not_once, (long long)changed);
        assert_int_equal(during.n_ranges, m.num_layers + 2);
        assert_int_equal(not_once, 0);
        assert_int_equal(changed, 0);
        assert_int_equal(replay.n_ranges, during.n_ranges);
        for (int r = 0; r < during.n_ranges; ++r) {
            assert_int_equal(replay.first[r], during.first[r]);
            assert_int_equal(replay.count[r], during.count[r]);
        }
        free(during.snapshot);
        gpu_model_free(gm);
    }
    free(covered);
    free(final_grads);
    free_batch(&hb);
    model_free(&m);
}

/* The workspace is the layout's GPU memory formula (model/layout.h) in both modes, on the tiny model allocated and
   at HunyuanVideo-1.5's full dims described (nothing allocated: the carve fits the formula, the scratch too). */
static void test_workspace_is_the_formula(void **state)
{
    (void)state;
    gpu_select(0);
    model m;
    tiny_model(&m, 3, 0x3eed0007ull);
    const int64_t device_scratch = gpu_model_device_scratch_bytes(&m);
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    for (int i = 0; i < 2; ++i) {
        const layout_memory formula = model_layout_memory(&m.layout, LAYOUT_BACKEND_GPU,
                                                          i ? RECOMPUTE_BLOCK : RECOMPUTE_NONE, device_scratch);
        const int64_t expected = layout_memory_bytes(&formula, 300, 5, 120);
        assert_int_equal((int64_t)gpu_model_workspace_bytes_with_recompute(&m, 300, 5, 120, modes[i]), expected);
        gpu_model *gm = gpu_model_create_with_recompute(&m, 300, 5, 120, modes[i]);
        assert_int_equal((int64_t)gpu_model_device_bytes(gm), 10 * m.n_weights + expected);
        gpu_model_free(gm);
    }
    model_free(&m);
    deck config;
    deck_defaults(&config);
    config.model.family = FAMILY_HUNYUANVIDEO15;
    config.model.text_padding = TEXT_PADDING_TRIM;
    config.model.dim = 2048, config.model.ffn_dim = 8192, config.model.num_heads = 16, config.model.num_layers = 54;
    config.model.in_dim = 65, config.model.out_dim = 32;
    config.model.patch_t = config.model.patch_h = config.model.patch_w = 1;
    config.model.text_dim = 3584, config.model.text_2_dim = 1472, config.model.image_dim = 1152;
    config.model.text_len = 1000, config.model.freq_dim = 256, config.model.rope_axes_t = 16;
    model table;
    model_create_table(&table, &config);
    const int64_t scratch = gpu_model_device_scratch_bytes(&table);
    for (int i = 0; i < 2; ++i) {
        const layout_memory formula = model_layout_memory(&table.layout, LAYOUT_BACKEND_GPU,
                                                          i ? RECOMPUTE_BLOCK : RECOMPUTE_NONE, scratch);
        const size_t bytes = gpu_model_workspace_bytes_with_recompute(&table, 75600, 8, 8000, modes[i]);
        printf("# full size, recompute %d: %.2f GiB workspace for 75600 tokens, 8 samples, 8000 text rows\n", i,
               (double)bytes / (1 << 30));
        assert_int_equal((int64_t)bytes, layout_memory_bytes(&formula, 75600, 8, 8000));
    }
    model_free(&table);
}

int main(void)
{
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen_only),
        cmocka_unit_test(test_all_sources),
        cmocka_unit_test(test_image_to_video),
        cmocka_unit_test(test_many_samples),
        cmocka_unit_test(test_cudnn_joint_attention),
        cmocka_unit_test(test_prepare_plans),
        cmocka_unit_test(test_prepare_plans_tiles),
        cmocka_unit_test(test_recompute_match),
        cmocka_unit_test(test_forward_loss_matches),
        cmocka_unit_test(test_grads_ready_ranges),
        cmocka_unit_test(test_workspace_is_the_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
