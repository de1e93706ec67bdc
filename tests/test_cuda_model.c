/* test_cuda_model.c — cmocka tests of the whole GPU model against the CPU model (loss, per-sample losses, every
   parameter's gradient) on a tiny Wan-shaped model over packed batches, with attention on our own kernel and,
   for the longer samples, on cuDNN; gradient accumulation and determinism; block recomputation against none
   (bit for bit); the forward-only loss against the forward + backward's (bit for bit); and a timing (not an
   assertion) of one Wan-1.3B block forward+backward. */
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
#include <time.h>

#include "core/check.h"
#include "deck/deck.h"
#include "cuda/gpu.h"
#include "model/model.h"
#include "cuda/model_gpu.h"
#include "core/rng.h"

static const double kLossTolerance = 2e-2;     /* relative, bf16 activations */
static const double kGradientTolerance = 5e-2; /* relative, whole vector and each parameter */

/* A packed micro-batch and the host memory behind it. */
typedef struct {
    int n_samples;
    int32_t frames[4], height[4], width[4], text_len[4];
    float sigma[4];
} batch_spec;

typedef struct {
    model_batch batch;
    float *latents, *noise, *text;
} host_batch;

/* The quick-start dims: D 64, F 128, 4 heads of 16, text_dim 32 (16 tokens), freq_dim 32; num_layers layers. */
static void tiny_model(model *m, int num_layers, uint64_t seed)
{
    deck config;
    deck_defaults(&config);
    config.model.dim = 64;
    config.model.ffn_dim = 128;
    config.model.num_heads = 4;
    config.model.num_layers = num_layers;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.freq_dim = 32;
    model_create(m, &config);
    model_init_gaussian(m, seed, 0.1f);
}

static void make_batch(const model *m, const batch_spec *spec, uint64_t seed, host_batch *hb)
{
    memset(hb, 0, sizeof *hb);   /* the batch's other fields (sp_size: this rank alone) zero */
    int64_t n_latent = 0, n_text = 0;
    for (int b = 0; b < spec->n_samples; ++b) {
        n_latent += (int64_t)m->in_dim * spec->frames[b] * spec->height[b] * spec->width[b];
        n_text += (int64_t)spec->text_len[b] * m->text_dim;
    }
    hb->latents = xmalloc((size_t)n_latent * sizeof(float));
    hb->noise = xmalloc((size_t)n_latent * sizeof(float));
    hb->text = xmalloc((size_t)(n_text > 0 ? n_text : 1) * sizeof(float));
    for (int64_t i = 0; i < n_latent; ++i) {
        hb->latents[i] = (float)rng_normal(&seed);
        hb->noise[i] = (float)rng_normal(&seed);
    }
    for (int64_t i = 0; i < n_text; ++i) hb->text[i] = (float)rng_normal(&seed);
    hb->batch.n_samples = spec->n_samples;
    hb->batch.frames = spec->frames;
    hb->batch.height = spec->height;
    hb->batch.width = spec->width;
    hb->batch.text_len = spec->text_len;
    hb->batch.sigma = spec->sigma;
    hb->batch.latents = hb->latents;
    hb->batch.noise = hb->noise;
    hb->batch.text = hb->text;
}

static void free_batch(host_batch *hb)
{
    free(hb->latents);
    free(hb->noise);
    free(hb->text);
}

/* One micro-batch on both backends from the same weights: losses and every gradient compared. Attention runs as
   gpu_model_create chooses or, with min_cudnn_tokens > 0, on cuDNN for samples of that many tokens (a failure
   where cuDNN is not available). */
static void compare_with_cpu(const char *case_name, const batch_spec *spec, uint64_t seed, int64_t min_cudnn_tokens)
{
    model m;
    tiny_model(&m, 2, seed);
    host_batch hb;
    make_batch(&m, spec, seed + 1, &hb);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, 256, 4, 0);
    if (min_cudnn_tokens > 0)
        assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, min_cudnn_tokens), 1);
    gpu_model_upload_weights(gm, m.weights);
    expect_gpu_matches_cpu(case_name, &m, gm, &hb.batch, kLossTolerance, kGradientTolerance);
    gpu_model_free(gm);
    free_batch(&hb);
    model_free(&m);
}

/* 3 samples of different grids and text lengths: an image (1x8x8 latent: 16 tokens), two videos
   (3x4x6: 18 tokens; 2x6x10: 30 tokens). */
static void test_packed_batch(void **state)
{
    (void)state;
    const batch_spec spec = {3, {1, 3, 2}, {8, 4, 6}, {8, 6, 10}, {16, 5, 11}, {0.2f, 0.5f, 0.9f}};
    compare_with_cpu("3 samples packed", &spec, 0x5eed0001ull, 0);
}

/* A sample without text (zero cross-attention output) beside one with text. */
static void test_sample_without_text(void **state)
{
    (void)state;
    const batch_spec spec = {2, {2, 1}, {4, 6}, {4, 4}, {0, 7}, {0.7f, 0.3f}};
    compare_with_cpu("a sample without text", &spec, 0x5eed0002ull, 0);
}

/* Self-attention on cuDNN for the samples of 17 tokens or more (the threshold lowered), cross-attention too
   where the text has the model's full 16 rows, the rest on our own kernel: 16 tokens with 16 text rows (own
   kernel), 18 with 16 (cuDNN), 30 without text (self on cuDNN, cross on our own kernel: no keys), 32 with 11
   (self on cuDNN, cross on our own kernel). Skipped where aldit is built without cuDNN. */
static void test_cudnn_attention(void **state)
{
    (void)state;
#ifdef HAVE_CUDNN
    const batch_spec spec = {4, {1, 3, 2, 2}, {8, 4, 6, 8}, {8, 6, 10, 8}, {16, 16, 0, 11}, {0.2f, 0.5f, 0.9f, 0.4f}};
    compare_with_cpu("cuDNN attention for samples of 17 tokens or more", &spec, 0x5eed000aull, 17);
#else
    skip();
#endif
}

/* [train] prebuild's gpu_model_prepare for Wan on test_cudnn_attention's batch (cuDNN from 17 tokens): 32 tokens
   (self at 32 and, as the micro-batch's last sample, on one whole tile of 128: 4 plans), 30 (self at 30; the tile
   is built: 2), 18 with the full 16 text rows (self at 18 and cross to 16 keys: 4); 16 tokens stay on our kernel.
   Again: none. The micro-batch then builds no plan of its own. Skipped without cuDNN. */
static void test_prepare_plans(void **state)
{
    (void)state;
#ifdef HAVE_CUDNN
    const batch_spec spec = {4, {1, 3, 2, 2}, {8, 4, 6, 8}, {8, 6, 10, 8}, {16, 16, 0, 11}, {0.2f, 0.5f, 0.9f, 0.4f}};
    model m;
    tiny_model(&m, 2, 0x5eed0010ull);
    host_batch hb;
    make_batch(&m, &spec, 0x5eed0011ull, &hb);
    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, 256, 4, 0);
    assert_int_equal(gpu_model_set_attention(gm, GPU_ATTENTION_AUTO, 17), 1);
    gpu_model_upload_weights(gm, m.weights);
    int32_t tokens[4];
    for (int b = 0; b < spec.n_samples; ++b) tokens[b] = spec.frames[b] * (spec.height[b] / 2) * (spec.width[b] / 2);
    expect_prepared_plans(gm, tokens, spec.text_len, spec.n_samples, 10, &hb.batch);
    gpu_model_free(gm);
    free_batch(&hb);
    model_free(&m);
#else
    skip();
#endif
}

/* The tiny model with 4 layers (so that middle blocks exist) and a packed batch of 3 samples (1, 3 and 2
   frames; 16, 5 and 11 text rows), weights and data from `seed`. hb's batch points into *spec, which must
   outlive it. */
static void four_layer_case(uint64_t seed, model *m, batch_spec *spec, host_batch *hb)
{
    *spec = (batch_spec){3, {1, 3, 2}, {8, 4, 6}, {8, 6, 10}, {16, 5, 11}, {0.2f, 0.5f, 0.9f}};
    tiny_model(m, 4, seed);
    make_batch(m, spec, seed + 1, hb);
}

/* recompute = block against none, on the same weights and the 3-sample batch: the same kernels run on the same
   inputs, so the losses and every gradient must be equal to the bit, and block mode's workspace is smaller.
   4 layers, so that middle blocks are re-run from their kept input. */
static void test_recompute_match(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x5eed0005ull, &m, &spec, &hb);
    enum { kRuns = 2 };
    const gpu_recompute modes[kRuns] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    const char *const names[kRuns] = {"recompute none", "recompute block"};
    double loss[kRuns], sample_loss[kRuns][4];
    float *grads[kRuns];
    size_t workspace[kRuns];
    gpu_select(0);
    for (int i = 0; i < kRuns; ++i) {
        workspace[i] = gpu_model_workspace_bytes_with_recompute(&m, 256, 4, 0, modes[i]);
        gpu_model *gm = gpu_model_create_with_recompute(&m, 256, 4, 0, modes[i]);
        gpu_model_upload_weights(gm, m.weights);
        loss[i] = gpu_model_forward_backward(gm, &hb.batch, 1.0f / (float)spec.n_samples, sample_loss[i], 0);
        grads[i] = xmalloc((size_t)m.n_weights * sizeof(float));
        gpu_model_download_grads(gm, grads[i]);
        gpu_model_free(gm);
    }
    for (int i = 1; i < kRuns; ++i) {
        int64_t differing = 0, nonfinite = 0;
        double largest = 0.0;
        for (int64_t j = 0; j < m.n_weights; ++j) {
            if (!isfinite(grads[i][j])) ++nonfinite;
            if (memcmp(&grads[0][j], &grads[i][j], sizeof(float)) != 0) {
                ++differing;
                largest = fmax(largest, fabs((double)grads[i][j] - (double)grads[0][j]));
            }
        }
        printf("# %s vs %s: loss %.9g vs %.9g; %lld of %lld gradient values differ (largest by %.3e), %lld not "
               "finite; workspace %zu vs %zu bytes\n", names[i], names[0], loss[i], loss[0], (long long)differing,
               (long long)m.n_weights, largest, (long long)nonfinite, workspace[i], workspace[0]);
        if (loss[i] != loss[0]) fail_msg("%s: loss %.9g, %s: %.9g", names[i], loss[i], names[0], loss[0]);
        for (int b = 0; b < spec.n_samples; ++b)
            if (sample_loss[i][b] != sample_loss[0][b])
                fail_msg("%s: sample %d loss %.9g, %s: %.9g", names[i], b, sample_loss[i][b], names[0],
                         sample_loss[0][b]);
        if (differing > 0 || nonfinite > 0)
            fail_msg("%s: %lld gradient values differ from %s, %lld not finite", names[i], (long long)differing,
                     names[0], (long long)nonfinite);
    }
    if (!(workspace[1] < workspace[0]))
        fail_msg("recompute block: workspace %zu bytes, not less than none's %zu", workspace[1], workspace[0]);
    for (int i = 0; i < kRuns; ++i) free(grads[i]);
    free_batch(&hb);
    model_free(&m);
}

/* What the gradient-readiness hook saw in one forward_backward call: the ranges in order and, for each, the
   gradient values at the moment it was reported (the stream drained first). */
typedef struct {
    const gpu_model *gm;
    int n_ranges;
    int64_t first[64], count[64];
    float *snapshot; /* n_weights values */
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

/* The all-reduce overlaps the backward on the ranges gpu_model_set_grads_ready reports: each must be final
   when reported (its values then equal to the bit to those after the call), the ranges must cover every
   value once, the blocks come last block first, and gpu_model_grads_ready_all replays the same sequence.
   Both recomputation modes (block mode re-runs a block's forward inside the next block's backward). */
static void test_grads_ready_ranges(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x5eed0007ull, &m, &spec, &hb);
    gpu_select(0);
    enum { kRuns = 2 };
    const gpu_recompute modes[kRuns] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    float *final_grads = xmalloc((size_t)m.n_weights * sizeof(float));
    unsigned char *times_covered = xmalloc((size_t)m.n_weights);
    for (int i = 0; i < kRuns; ++i) {
        gpu_model *gm = gpu_model_create_with_recompute(&m, 256, 4, 0, modes[i]);
        gpu_model_upload_weights(gm, m.weights);
        ready_record during = {.gm = gm, .snapshot = xmalloc((size_t)m.n_weights * sizeof(float))};
        gpu_model_set_grads_ready(gm, record_ready, &during);
        gpu_model_forward_backward(gm, &hb.batch, 1.0f / (float)spec.n_samples, NULL, 0);
        gpu_model_download_grads(gm, final_grads);

        memset(times_covered, 0, (size_t)m.n_weights);
        int64_t changed_after_report = 0;
        for (int r = 0; r < during.n_ranges; ++r)
            for (int64_t j = during.first[r]; j < during.first[r] + during.count[r]; ++j) {
                times_covered[j]++;
                if (memcmp(&during.snapshot[j], &final_grads[j], sizeof(float)) != 0) ++changed_after_report;
            }
        int64_t not_once = 0;
        for (int64_t j = 0; j < m.n_weights; ++j) not_once += times_covered[j] != 1;
        printf("# grads ready, recompute %s: %d ranges; %lld values not covered exactly once, %lld changed after their "
               "range was reported\n", modes[i] == GPU_RECOMPUTE_BLOCK ? "block" : "none", during.n_ranges, (long long)not_once, (long long)changed_after_report);
        if (not_once > 0) fail_msg("%lld gradient values not reported exactly once", (long long)not_once);
        if (changed_after_report > 0)
            fail_msg("%lld gradient values changed after their range was reported final", (long long)changed_after_report);
        assert_int_equal(during.n_ranges, m.num_layers + 2);
        for (int l = 0; l < m.num_layers; ++l) {
            char name[64];
            snprintf(name, sizeof name, "blocks.%d.modulation", m.num_layers - 1 - l);
            assert_int_equal(during.first[l], model_find_param(&m, name)->offset);
        }

        ready_record replay = {.gm = gm};
        gpu_model_set_grads_ready(gm, record_ready, &replay);
        gpu_model_grads_ready_all(gm, 0);
        assert_int_equal(replay.n_ranges, during.n_ranges);
        for (int r = 0; r < during.n_ranges; ++r) {
            assert_int_equal(replay.first[r], during.first[r]);
            assert_int_equal(replay.count[r], during.count[r]);
        }
        gpu_model_set_grads_ready(gm, NULL, NULL);
        free(during.snapshot);
        gpu_model_free(gm);
    }
    free(final_grads);
    free(times_covered);
    free_batch(&hb);
    model_free(&m);
}

static void count_ready(void *context, int64_t first, int64_t count, cudaStream_t stream)
{
    (void)first;
    (void)count;
    (void)stream;
    ++*(int *)context;
}

/* gpu_model_forward_loss (validation) against gpu_model_forward_backward on the same weights and batch, in both
   recomputation modes: the same forward kernels, so the loss and each sample's equal to the bit; the forward
   alone reports no gradient range and leaves the gradients as they were (zero before, the backward's after),
   and it is within the bf16 tolerance of the CPU model's model_forward_loss. */
static void test_forward_loss_matches(void **state)
{
    (void)state;
    model m;
    host_batch hb;
    batch_spec spec;
    four_layer_case(0x5eed0009ull, &m, &spec, &hb);
    double cpu_loss = model_forward_loss(&m, &hb.batch, NULL);
    gpu_select(0);
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    float *grads = xmalloc((size_t)m.n_weights * sizeof(float));
    float *after = xmalloc((size_t)m.n_weights * sizeof(float));
    for (int i = 0; i < 2; ++i) {
        gpu_model *gm = gpu_model_create_with_recompute(&m, 256, 4, 0, modes[i]);
        gpu_model_upload_weights(gm, m.weights);
        int reported = 0;
        gpu_model_set_grads_ready(gm, count_ready, &reported);
        double only_samples[4], both_samples[4], again_samples[4];
        const double only = gpu_model_forward_loss(gm, &hb.batch, only_samples, 0);
        assert_int_equal(reported, 0);
        gpu_model_download_grads(gm, grads);
        int64_t nonzero = 0;
        for (int64_t j = 0; j < m.n_weights; ++j) nonzero += grads[j] != 0.0f;
        if (nonzero > 0) fail_msg("the forward alone wrote %lld gradient values", (long long)nonzero);
        gpu_model_set_grads_ready(gm, NULL, NULL);
        const double both = gpu_model_forward_backward(gm, &hb.batch, 1.0f / (float)spec.n_samples, both_samples, 0);
        gpu_model_download_grads(gm, grads);
        const double again = gpu_model_forward_loss(gm, &hb.batch, again_samples, 0);
        gpu_model_download_grads(gm, after);
        printf("# forward only, recompute %s: loss %.9g, forward + backward %.9g, again %.9g, CPU fp32 %.9g\n",
               modes[i] == GPU_RECOMPUTE_BLOCK ? "block" : "none", only, both, again, cpu_loss);
        if (only != both || again != both) fail_msg("forward-only loss %.9g / %.9g vs forward + backward %.9g", only, again, both);
        for (int b = 0; b < spec.n_samples; ++b)
            if (only_samples[b] != both_samples[b] || again_samples[b] != both_samples[b])
                fail_msg("sample %d: forward-only loss %.9g vs %.9g", b, only_samples[b], both_samples[b]);
        if (memcmp(grads, after, (size_t)m.n_weights * sizeof(float)) != 0)
            fail_msg("the forward alone changed the gradients of the forward + backward before it");
        if (fabs(only - cpu_loss) > kLossTolerance * fabs(cpu_loss))
            fail_msg("forward-only loss %.9g vs the CPU's %.9g", only, cpu_loss);
        gpu_model_free(gm);
    }
    free(grads);
    free(after);
    free_batch(&hb);
    model_free(&m);
}

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

/* Mean seconds of one forward+backward over `repeats` calls after two warm-up calls. */
static double time_steps(const model *m, const model_batch *batch, int repeats)
{
    gpu_model *gm = gpu_model_create(m, 4096, 1, 0);
    gpu_model_upload_weights(gm, m->weights);
    double loss = 0.0;
    for (int i = 0; i < 2; ++i) loss = gpu_model_forward_backward(gm, batch, 1.0f, NULL, 0);
    const double start = seconds_now();
    for (int i = 0; i < repeats; ++i) gpu_model_forward_backward(gm, batch, 1.0f, NULL, 0);
    const double seconds = (seconds_now() - start) / repeats;
    printf("#   %d layer(s): %.3f ms per step (loss %.4f, %.2f GiB on the device)\n", m->num_layers, 1e3 * seconds, loss,
           (double)gpu_model_device_bytes(gm) / 1073741824.0);
    gpu_model_free(gm);
    return seconds;
}

/* The GPU model's workspace is the layout's memory formula (model/layout.h), the one the balancer plans with:
   what gpu_model_workspace_bytes reports and what gpu_model_create allocates, for the tiny model and for
   Wan-1.3B at a training capacity (sized only: the formula's scratch must cover what the backward ops ask
   for there, which describe() checks). */
static void test_workspace_is_the_formula(void **state)
{
    (void)state;
    gpu_select(0);
    model m;
    tiny_model(&m, 3, 0x5eed0009ull);
    const int64_t device_scratch = gpu_model_device_scratch_bytes(&m);
    printf("# device scratch constant: %lld bytes\n", (long long)device_scratch);
    assert_true(device_scratch >= 8192);
    const gpu_recompute modes[2] = {GPU_RECOMPUTE_NONE, GPU_RECOMPUTE_BLOCK};
    for (int i = 0; i < 2; ++i) {
        const layout_memory formula = model_layout_memory(&m.layout, LAYOUT_BACKEND_GPU,
                                                          i ? RECOMPUTE_BLOCK : RECOMPUTE_NONE, device_scratch);
        const int64_t expected = layout_memory_bytes(&formula, 300, 5, 5 * m.text_len);
        assert_int_equal((int64_t)gpu_model_workspace_bytes_with_recompute(&m, 300, 5, 0, modes[i]), expected);
        gpu_model *gm = gpu_model_create_with_recompute(&m, 300, 5, 0, modes[i]);
        assert_int_equal((int64_t)gpu_model_device_bytes(gm), 10 * m.n_weights + expected);
        gpu_model_free(gm);
    }
    model_free(&m);
    deck config;
    deck_defaults(&config);   /* Wan-1.3B */
    model table;
    model_create_table(&table, &config);
    const int64_t wan_scratch = gpu_model_device_scratch_bytes(&table);
    for (int i = 0; i < 2; ++i) {
        const layout_memory formula = model_layout_memory(&table.layout, LAYOUT_BACKEND_GPU,
                                                          i ? RECOMPUTE_BLOCK : RECOMPUTE_NONE, wan_scratch);
        assert_int_equal((int64_t)gpu_model_workspace_bytes_with_recompute(&table, 75600, 8, 4096, modes[i]),
                         layout_memory_bytes(&formula, 75600, 8, 4096));
    }
    model_free(&table);
}

/* One Wan-1.3B block at S = 4096 tokens (latent 4x64x64) with 512 text tokens: a 2-layer model's step
   minus a 1-layer model's (the embeddings, the head, the staging and the final sync cancel). FLOPs are
   3x the forward's (GEMMs + both attentions), the convention of the peer figures in issue 5. */
static void test_wan13b_block_timing(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.model.num_layers = 2;
    model two;
    model_create(&two, &config);
    model_init_gaussian(&two, 0x5eed0003ull, 0.02f);
    config.model.num_layers = 1;
    model one;
    model_create(&one, &config);
    for (int i = 0; i < one.n_params; ++i) { /* the same values, by name */
        const param_info *p = &one.params[i], *q = model_find_param(&two, p->name);
        assert_non_null(q);
        memcpy(one.weights + p->offset, two.weights + q->offset, (size_t)p->n_elements * sizeof(float));
    }
    const batch_spec spec = {1, {4}, {64}, {64}, {512}, {0.5f}};
    host_batch hb;
    make_batch(&two, &spec, 0x5eed0004ull, &hb);

    gpu_select(0);
    char device[256];
    gpu_describe(device, sizeof device);
    printf("# Wan-1.3B block forward+backward, S = 4096, 512 text tokens, on %s:\n", device);
    const int repeats = 10;
    const double t_one = time_steps(&one, &hb.batch, repeats), t_two = time_steps(&two, &hb.batch, repeats);
    const double S = 4096, L = 512, D = two.dim, F = two.ffn_dim;
    const double forward_flops = 2 * S * D * D * 6 + 2 * L * D * D * 2 + 2 * 2 * S * D * F + 4 * S * S * D + 4 * S * L * D;
    const double block = t_two - t_one;
    printf("# Wan-1.3B block: %.3f ms, %.1f TFLOP/s (%.1f GFLOP)\n", 1e3 * block, 3 * forward_flops / block / 1e12,
           3 * forward_flops / 1e9);
    free_batch(&hb);
    model_free(&one);
    model_free(&two);
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_batch),
        cmocka_unit_test(test_sample_without_text),
        cmocka_unit_test(test_cudnn_attention),
        cmocka_unit_test(test_prepare_plans),
        cmocka_unit_test(test_recompute_match),
        cmocka_unit_test(test_grads_ready_ranges),
        cmocka_unit_test(test_forward_loss_matches),
        cmocka_unit_test(test_workspace_is_the_formula),
        cmocka_unit_test(test_wan13b_block_timing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
