/* test_cuda_attention_cudnn.c — cmocka tests of cuDNN's fused attention (attention_cudnn.h), self and cross (query and key lengths differ), against cpu_attention_fwd/bwd on one sample of bf16-rounded random inputs, the GPU model's dispatch to it, and its speed beside our own kernel's. */
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

#if defined(HAVE_CUDA) && defined(HAVE_CUDNN)

#include <math.h>

#include "cuda/attention.h"
#include "cuda/attention_cudnn.h"
#include "core/check.h"
#include "deck/deck.h"
#include "cuda/gpu.h"
#include "model/model.h"
#include "cuda/model_gpu.h"
#include "model/ops_cpu.h"
#include "core/rng.h"

static const double kTolerance = 1e-2; /* relative error ||gpu - cpu|| / ||cpu|| of bf16 paths */
static const double kNearZeroBound = 1e-6; /* the error's bound where the reference is ~0 */

static uint64_t g_seed = 0xc0d2a77e2026ull;
static attention_cudnn *g_cudnn; /* the context the checks run through (main: autotuning off) */

/* [rows, heads] <-> [heads, rows] (attention.h's lse vs cuDNN's stats). */
static void transpose(const float *in, int64_t rows, int cols, float *out)
{
    for (int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) out[(size_t)c * rows + r] = in[(size_t)r * cols + c];
}

/* Self-attention over zero-padded whole tiles (attention_cudnn_fwd_padded / bwd_padded) where seq_len is not a
   multiple of the tile: out and stats of the real rows against the reference (stats [heads, padded rows]),
   then the backward fed the reference's out and lse (pad rows: out of large values, stats 0, dout zero) against
   the reference gradients. The pad rows of dq, dk, dv are scratch and not compared. */
static void check_padded_self(const gpu_bf16 *q_bits, const gpu_bf16 *k_bits, const gpu_bf16 *v_bits,
                              const gpu_bf16 *dout_bits, const gpu_bf16 *out_bits, int64_t seq_len, int num_heads,
                              int head_dim, const float *out_ref, const float *lse_ref, const float *const grads_ref[3],
                              const char *case_name)
{
    const int64_t padded = attention_cudnn_padded_rows(seq_len);
    assert_true(padded >= seq_len && padded % ATTENTION_CUDNN_TILE == 0 && padded - seq_len < ATTENTION_CUDNN_TILE);
    if (padded == seq_len) return;
    const int width = num_heads * head_dim;
    const size_t n = (size_t)seq_len * width, n_padded = (size_t)padded * width;
    const size_t n_stats = (size_t)padded * num_heads;
    /* inputs with zero pad rows (dout too); out with pad rows far off the outputs' scale */
    const gpu_bf16 *const sources[5] = {q_bits, k_bits, v_bits, dout_bits, out_bits};
    gpu_bf16 *device[5];
    gpu_bf16 *rows = xmalloc(n_padded * sizeof *rows);
    for (int t = 0; t < 5; ++t) {
        memcpy(rows, sources[t], n * sizeof *rows);
        for (size_t i = n; i < n_padded; ++i) rows[i] = gpu_bf16_from_float(t == 4 ? 1000.0f : 0.0f);
        device[t] = device_upload(rows, n_padded * sizeof *rows);
    }
    free(rows);
    char name[200];
    snprintf(name, sizeof name, "%s, over %lld zero-padded rows", case_name, (long long)padded);

    gpu_bf16 *d_out = device_poisoned(n_padded * sizeof(gpu_bf16));
    float *d_stats = device_poisoned(n_stats * sizeof(float));
    attention_cudnn_fwd_padded(g_cudnn, device[0], device[1], device[2], seq_len, padded, num_heads, head_dim, d_out, d_stats, 0);
    float *got = download_bf16(d_out, n);
    expect_close("attention_cudnn padded forward out", name, got, out_ref, n, kTolerance, kNearZeroBound);
    free(got);
    float *stats = download_f32(d_stats, n_stats), *lse = xmalloc((size_t)seq_len * num_heads * sizeof *lse);
    for (int h = 0; h < num_heads; ++h)
        for (int64_t r = 0; r < seq_len; ++r) lse[(size_t)r * num_heads + h] = stats[(size_t)h * padded + r];
    expect_close("attention_cudnn padded forward stats (as lse)", name, lse, lse_ref, (size_t)seq_len * num_heads,
                 kTolerance, kNearZeroBound);
    free(stats);
    free(lse);

    float *stats_ref = xcalloc(n_stats, sizeof *stats_ref); /* the reference's lse, head-major; pad rows 0 */
    for (int h = 0; h < num_heads; ++h)
        for (int64_t r = 0; r < seq_len; ++r) stats_ref[(size_t)h * padded + r] = lse_ref[(size_t)r * num_heads + h];
    float *d_stats_ref = device_upload(stats_ref, n_stats * sizeof *stats_ref);
    free(stats_ref);
    gpu_bf16 *grads[3];
    for (int i = 0; i < 3; ++i) grads[i] = device_poisoned(n_padded * sizeof(gpu_bf16));
    attention_cudnn_bwd_padded(g_cudnn, device[0], device[1], device[2], device[4], device[3], d_stats_ref, seq_len, padded,
                               num_heads, head_dim, grads[0], grads[1], grads[2], 0);
    const char *names[3] = {"attention_cudnn padded backward dq", "attention_cudnn padded backward dk",
                            "attention_cudnn padded backward dv"};
    for (int i = 0; i < 3; ++i) {
        got = download_bf16(grads[i], n);
        expect_close(names[i], name, got, grads_ref[i], n, kTolerance, kNearZeroBound);
        free(got);
    }
    void *device_buffers[] = {device[0], device[1], device[2], device[3], device[4], d_out, d_stats, d_stats_ref,
                              grads[0], grads[1], grads[2]};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
}

/* One sample of seq_len_q query rows and seq_len_kv key rows (equal: through the self-attention entry points):
   the forward (out, stats) against the CPU, then the backward fed the reference's out (bf16) and lse (as
   stats), twice over poisoned outputs (the second run finds the module's dQ accumulator holding the first
   run's values, which must not leak in). */
static void check_shape(int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim)
{
    const int64_t q_start[2] = {0, seq_len_q}, kv_start[2] = {0, seq_len_kv};
    const int width = num_heads * head_dim;
    const size_t n_q = (size_t)seq_len_q * width, n_kv = (size_t)seq_len_kv * width;
    const size_t n_stats = (size_t)seq_len_q * num_heads;
    const int self = seq_len_q == seq_len_kv;
    char case_name[120];
    snprintf(case_name, sizeof case_name, "S_q=%lld, S_kv=%lld, %d heads, head_dim %d", (long long)seq_len_q,
             (long long)seq_len_kv, num_heads, head_dim);

    gpu_bf16 *q_bits, *k_bits, *v_bits, *dout_bits;
    float *q = random_normal_bf16(&g_seed, n_q, 0.0, 1.0, &q_bits);
    float *k = random_normal_bf16(&g_seed, n_kv, 0.0, 1.0, &k_bits);
    float *v = random_normal_bf16(&g_seed, n_kv, 0.0, 1.0, &v_bits);
    float *dout = random_normal_bf16(&g_seed, n_q, 0.0, 1.0, &dout_bits);
    float *out_ref = xmalloc(n_q * sizeof *out_ref), *lse_ref = xmalloc(n_stats * sizeof *lse_ref);
    cpu_attention_fwd(q, k, v, num_heads, head_dim, q_start, kv_start, 1, out_ref, lse_ref);
    gpu_bf16 *out_bits = xmalloc(n_q * sizeof *out_bits);
    float *out_rounded = xmalloc(n_q * sizeof *out_rounded);
    for (size_t i = 0; i < n_q; ++i) {
        out_bits[i] = gpu_bf16_from_float(out_ref[i]);
        out_rounded[i] = gpu_float_from_bf16(out_bits[i]);
    }
    float *dq_ref = xmalloc(n_q * sizeof *dq_ref), *dk_ref = xmalloc(n_kv * sizeof *dk_ref);
    float *dv_ref = xmalloc(n_kv * sizeof *dv_ref);
    cpu_attention_bwd(q, k, v, out_rounded, dout, lse_ref, num_heads, head_dim, q_start, kv_start, 1, dq_ref, dk_ref,
                      dv_ref);
    float *stats_ref = xmalloc(n_stats * sizeof *stats_ref);
    transpose(lse_ref, seq_len_q, num_heads, stats_ref);

    const size_t q_bytes = n_q * sizeof(gpu_bf16), kv_bytes = n_kv * sizeof(gpu_bf16);
    const size_t stats_bytes = n_stats * sizeof(float);
    gpu_bf16 *d_q = device_upload(q_bits, q_bytes), *d_k = device_upload(k_bits, kv_bytes);
    gpu_bf16 *d_v = device_upload(v_bits, kv_bytes), *d_dout = device_upload(dout_bits, q_bytes);
    gpu_bf16 *d_out_ref = device_upload(out_bits, q_bytes);
    float *d_stats_ref = device_upload(stats_ref, stats_bytes);
    gpu_bf16 *d_out = device_poisoned(q_bytes), *d_dq = device_poisoned(q_bytes), *d_dk = device_poisoned(kv_bytes);
    gpu_bf16 *d_dv = device_poisoned(kv_bytes);
    float *d_stats = device_poisoned(stats_bytes);

    if (self)
        attention_cudnn_fwd(g_cudnn, d_q, d_k, d_v, seq_len_q, num_heads, head_dim, d_out, d_stats, 0);
    else
        attention_cudnn_cross_fwd(g_cudnn, d_q, d_k, d_v, seq_len_q, seq_len_kv, num_heads, head_dim, d_out, d_stats, 0);
    float *got = download_bf16(d_out, n_q);
    expect_close("attention_cudnn forward out", case_name, got, out_ref, n_q, kTolerance, kNearZeroBound);
    free(got);
    float *stats = download_f32(d_stats, n_stats);
    got = xmalloc(n_stats * sizeof *got);
    transpose(stats, num_heads, (int)seq_len_q, got);
    expect_close("attention_cudnn forward stats (as lse)", case_name, got, lse_ref, n_stats, kTolerance,
                 kNearZeroBound);
    free(got);
    free(stats);

    for (int run = 0; run < 2; ++run) {
        device_poison(d_dq, q_bytes);
        device_poison(d_dk, kv_bytes);
        device_poison(d_dv, kv_bytes);
        if (self)
            attention_cudnn_bwd(g_cudnn, d_q, d_k, d_v, d_out_ref, d_dout, d_stats_ref, seq_len_q, num_heads, head_dim, d_dq,
                                d_dk, d_dv, 0);
        else
            attention_cudnn_cross_bwd(g_cudnn, d_q, d_k, d_v, d_out_ref, d_dout, d_stats_ref, seq_len_q, seq_len_kv, num_heads,
                                      head_dim, d_dq, d_dk, d_dv, 0);
        const gpu_bf16 *outputs[3] = {d_dq, d_dk, d_dv};
        const float *wants[3] = {dq_ref, dk_ref, dv_ref};
        const size_t counts[3] = {n_q, n_kv, n_kv};
        const char *names[3] = {"attention_cudnn backward dq", "attention_cudnn backward dk",
                                "attention_cudnn backward dv"};
        /* dq and dk are exactly zero with one key (softmax of one score is constant): there their rounding
           noise is bounded by the tolerance times the norm of dv, the scale of this call's gradients */
        double dv_norm2 = 0.0;
        for (size_t j = 0; j < n_kv; ++j) dv_norm2 += (double)dv_ref[j] * dv_ref[j];
        for (int i = 0; i < 3; ++i) {
            got = download_bf16(outputs[i], counts[i]);
            expect_close(names[i], case_name, got, wants[i], counts[i], kTolerance,
                         i < 2 ? kTolerance * sqrt(dv_norm2) : kNearZeroBound);
            free(got);
        }
    }

    if (self) {
        const float *const grads_ref[3] = {dq_ref, dk_ref, dv_ref};
        check_padded_self(q_bits, k_bits, v_bits, dout_bits, out_bits, seq_len_q, num_heads, head_dim, out_ref, lse_ref,
                          grads_ref, case_name);
    }

    void *device_buffers[] = {d_q, d_k, d_v, d_dout, d_out_ref, d_stats_ref, d_out, d_dq, d_dk, d_dv, d_stats};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
    void *host_buffers[] = {q_bits, k_bits, v_bits, dout_bits, q, k, v, dout, out_ref, lse_ref, out_bits, out_rounded,
                            dq_ref, dk_ref, dv_ref, stats_ref};
    free_host_buffers(host_buffers, sizeof host_buffers / sizeof host_buffers[0]);
}

static void test_available(void **state)
{
    (void)state;
    assert_int_equal(attention_cudnn_available(g_cudnn, 2, 64), 1);
    assert_int_equal(attention_cudnn_available(g_cudnn, 12, 128), 1);
    assert_int_equal(attention_cudnn_available(g_cudnn, 12, 128), 1); /* remembered */
}

static void test_head_dim_64(void **state)
{
    (void)state;
    check_shape(64, 64, 12, 64);
    check_shape(300, 300, 5, 64);
    check_shape(1024, 1024, 2, 64);
}

static void test_head_dim_128(void **state)
{
    (void)state;
    check_shape(64, 64, 2, 128);
    check_shape(300, 300, 4, 128);
    check_shape(1024, 1024, 3, 128);
}

/* Cross-attention: more query than key rows (the model's case: a sample's tokens to its text), key lengths
   that are and are not multiples of 64, and fewer query than key rows. */
static void test_cross_head_dim_64(void **state)
{
    (void)state;
    check_shape(1500, 512, 4, 64);
    check_shape(4096, 77, 2, 64);
    check_shape(200, 700, 3, 64);
}

static void test_cross_head_dim_128(void **state)
{
    (void)state;
    check_shape(1500, 512, 3, 128);
    check_shape(4096, 77, 4, 128);
    check_shape(200, 700, 2, 128);
}

/* Text as short as the model may see it (a few tokens, one). Last in the file: a length cuDNN cannot plan is
   fatal (the message names the shape), which would end the program before the tests after it. */
static void test_cross_short_text(void **state)
{
    (void)state;
    check_shape(1024, 16, 2, 64);
    check_shape(1100, 5, 3, 128);
    check_shape(256, 1, 2, 128);
}

/* The GPU model with long samples on cuDNN (threshold lowered to 100 tokens) against the same model on our
   own kernel: a packed batch of 128 tokens with 16 text rows (self- and cross-attention on cuDNN), 16 tokens
   with 5 (our own kernel, on runs that do not start at row 0) and 288 tokens without text (self-attention on
   cuDNN, cross-attention on our own kernel), 2 heads of 64; loss and whole gradient within 2e-2 (relative;
   bf16 activations). */
static void test_model_dispatch(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.model.dim = 128;
    config.model.ffn_dim = 256;
    config.model.num_heads = 2;
    config.model.num_layers = 2;
    config.model.text_len = 16;
    config.model.text_dim = 32;
    config.model.freq_dim = 32;
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 0x5eed0c0dull, 0.1f);

    int32_t frames[3] = {2, 1, 3}, height[3] = {16, 8, 16}, width[3] = {16, 8, 24}, text_len[3] = {16, 5, 0};
    float sigma[3] = {0.3f, 0.7f, 0.5f};
    int64_t n_latent = 0, n_text = 0;
    for (int b = 0; b < 3; ++b) {
        n_latent += (int64_t)m.in_dim * frames[b] * height[b] * width[b];
        n_text += (int64_t)text_len[b] * m.text_dim;
    }
    float *latents = xmalloc((size_t)n_latent * sizeof *latents), *noise = xmalloc((size_t)n_latent * sizeof *noise);
    float *text = xmalloc((size_t)n_text * sizeof *text);
    for (int64_t i = 0; i < n_latent; ++i) {
        latents[i] = (float)rng_normal(&g_seed);
        noise[i] = (float)rng_normal(&g_seed);
    }
    for (int64_t i = 0; i < n_text; ++i) text[i] = (float)rng_normal(&g_seed);
    const model_batch batch = {.n_samples = 3, .frames = frames, .height = height, .width = width,
                               .text_len = text_len, .latents = latents, .noise = noise, .sigma = sigma, .text = text};

    gpu_select(0);
    gpu_model *gm = gpu_model_create(&m, 512, 3, 0);
    gpu_model_upload_weights(gm, m.weights);
    float *grads[2];
    double loss[2];
    for (int path = 0; path < 2; ++path) { /* 0: own kernel, 1: cuDNN for long samples */
        const int on_cudnn = gpu_model_set_attention(gm, path ? GPU_ATTENTION_CUDNN : GPU_ATTENTION_OWN, 100);
        assert_int_equal(on_cudnn, path);
        gpu_model_zero_grads(gm, 0);
        loss[path] = gpu_model_forward_backward(gm, &batch, 1.0f / 3.0f, NULL, 0);
        grads[path] = xmalloc((size_t)m.n_weights * sizeof(float));
        gpu_model_download_grads(gm, grads[path]);
    }
    if (!(isfinite(loss[1]) && fabs(loss[1] - loss[0]) <= 2e-2 * fabs(loss[0])))
        fail_msg("model loss on cuDNN %g, on our own kernel %g", loss[1], loss[0]);
    double diff2 = 0.0, ref2 = 0.0;
    for (int64_t i = 0; i < m.n_weights; ++i) {
        if (!isfinite(grads[1][i])) fail_msg("model gradient %lld on cuDNN is %g", (long long)i, grads[1][i]);
        const double d = (double)grads[1][i] - grads[0][i];
        diff2 += d * d;
        ref2 += (double)grads[0][i] * grads[0][i];
    }
    const double error = sqrt(diff2 / (ref2 > 0.0 ? ref2 : 1.0));
    if (!(error <= 2e-2)) fail_msg("model gradient on cuDNN vs own kernel: relative difference %.3e", error);
    printf("# model on cuDNN vs own kernel: loss %.6f vs %.6f, gradient relative difference %.2e\n", loss[1], loss[0],
           error);

    gpu_model_free(gm);
    model_free(&m);
    free(grads[0]);
    free(grads[1]);
    free(latents);
    free(noise);
    free(text);
}

/* ||a - b|| / ||b|| of two device bf16 tensors; infinite when a holds a value that is not finite. */
static double relative_difference(const gpu_bf16 *a, const gpu_bf16 *b, size_t n)
{
    float *x = download_bf16(a, n), *y = download_bf16(b, n);
    const double difference = count_nonfinite(x, n) > 0 ? INFINITY : relative_l2_error(x, y, n);
    free(x);
    free(y);
    return difference;
}

/* One long sample on the device, for the cuDNN path and our own kernel side by side. */
typedef struct {
    int64_t q_rows, kv_rows;
    int num_heads, head_dim;
    gpu_bf16 *q, *k, *v, *dout;
    gpu_bf16 *out[2], *dq[2], *dk[2], *dv[2]; /* [0] cuDNN, [1] own kernel */
    float *stats, *lse;
    int64_t *q_start, *kv_start; /* device {0, q_rows}, {0, kv_rows} */
    void *workspace;
} speed_case;

static void cudnn_forward(void *context)
{
    speed_case *c = context;
    attention_cudnn_cross_fwd(g_cudnn, c->q, c->k, c->v, c->q_rows, c->kv_rows, c->num_heads, c->head_dim, c->out[0], c->stats,
                              0);
}

static void cudnn_backward(void *context)
{
    speed_case *c = context;
    attention_cudnn_cross_bwd(g_cudnn, c->q, c->k, c->v, c->out[0], c->dout, c->stats, c->q_rows, c->kv_rows, c->num_heads,
                              c->head_dim, c->dq[0], c->dk[0], c->dv[0], 0);
}

static void own_forward(void *context)
{
    speed_case *c = context;
    attention_fwd(c->q, c->k, c->v, c->num_heads, c->head_dim, c->q_start, c->kv_start, 1, c->q_rows, c->kv_rows,
                  c->out[1], c->lse, 0);
}

static void own_backward(void *context)
{
    speed_case *c = context;
    attention_bwd(c->q, c->k, c->v, c->out[1], c->dout, c->lse, c->num_heads, c->head_dim, c->q_start, c->kv_start, 1,
                  c->q_rows, c->kv_rows, c->dq[1], c->dk[1], c->dv[1], c->workspace, 0);
}

/* A device bf16 tensor of n normal values. */
static gpu_bf16 *device_random_bf16(size_t n)
{
    gpu_bf16 *host = xmalloc(n * sizeof *host);
    for (size_t i = 0; i < n; ++i) host[i] = gpu_bf16_from_float((float)rng_normal(&g_seed));
    gpu_bf16 *device = device_upload(host, n * sizeof *host);
    free(host);
    return device;
}

/* Speed at Wan-1.3B's shapes (12 heads, head_dim 128; self-attention: kv_rows == q_rows, cross-attention: the
   text's kv_rows) printed as TAP comments, cuDNN and our own kernel in the same run; asserted: both paths agree
   (relative difference <= 1e-2, every value finite). */
static void run_speed(int64_t q_rows, int64_t kv_rows)
{
    speed_case c = {.q_rows = q_rows, .kv_rows = kv_rows, .num_heads = 12, .head_dim = 128};
    const size_t width = (size_t)c.num_heads * c.head_dim, n_q = (size_t)q_rows * width, n_kv = (size_t)kv_rows * width;
    const size_t q_bytes = n_q * sizeof(gpu_bf16), kv_bytes = n_kv * sizeof(gpu_bf16);
    c.q = device_random_bf16(n_q);
    c.k = device_random_bf16(n_kv);
    c.v = device_random_bf16(n_kv);
    c.dout = device_random_bf16(n_q);
    for (int p = 0; p < 2; ++p) {
        c.out[p] = device_poisoned(q_bytes);
        c.dq[p] = device_poisoned(q_bytes);
        c.dk[p] = device_poisoned(kv_bytes);
        c.dv[p] = device_poisoned(kv_bytes);
    }
    c.stats = device_poisoned((size_t)q_rows * c.num_heads * sizeof(float));
    c.lse = device_poisoned((size_t)q_rows * c.num_heads * sizeof(float));
    c.workspace = device_poisoned(attention_bwd_workspace_bytes(q_rows, c.num_heads));
    const int64_t q_start[2] = {0, q_rows}, kv_start[2] = {0, kv_rows};
    c.q_start = device_upload(q_start, sizeof q_start);
    c.kv_start = device_upload(kv_start, sizeof kv_start);

    const int repeats = 5;
    const double ms[4] = {gpu_milliseconds_per_call(cudnn_forward, &c, repeats),
                          gpu_milliseconds_per_call(cudnn_backward, &c, repeats),
                          gpu_milliseconds_per_call(own_forward, &c, repeats),
                          gpu_milliseconds_per_call(own_backward, &c, repeats)};
    const double fwd_flops = attention_fwd_flops(q_start, kv_start, 1, c.num_heads, c.head_dim);
    const double bwd_flops = attention_bwd_flops(q_start, kv_start, 1, c.num_heads, c.head_dim);
    printf("# %s-attention S_q=%lld S_kv=%lld heads=%d head_dim=%d: cuDNN forward %.3f ms (%.1f TFLOP/s), backward "
           "%.3f ms (%.1f TFLOP/s), f+b %.3f ms; own kernel forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
           "(%.1f TFLOP/s), f+b %.3f ms\n", q_rows == kv_rows ? "self" : "cross", (long long)q_rows,
           (long long)kv_rows, c.num_heads, c.head_dim, ms[0], fwd_flops / (ms[0] * 1e9), ms[1],
           bwd_flops / (ms[1] * 1e9), ms[0] + ms[1], ms[2], fwd_flops / (ms[2] * 1e9), ms[3],
           bwd_flops / (ms[3] * 1e9), ms[2] + ms[3]);
    fflush(stdout);

    const gpu_bf16 *pairs[4][2] = {{c.out[0], c.out[1]}, {c.dq[0], c.dq[1]}, {c.dk[0], c.dk[1]}, {c.dv[0], c.dv[1]}};
    const size_t counts[4] = {n_q, n_q, n_kv, n_kv};
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
        const double difference = relative_difference(pairs[i][0], pairs[i][1], counts[i]);
        if (!(difference <= kTolerance))
            fail_msg("S_q=%lld S_kv=%lld: cuDNN and own-kernel %s differ by %.3e (relative)", (long long)q_rows,
                     (long long)kv_rows, names[i], difference);
    }

    void *device_buffers[] = {c.q, c.k, c.v, c.dout, c.out[0], c.out[1], c.dq[0], c.dq[1], c.dk[0], c.dk[1],
                              c.dv[0], c.dv[1], c.stats, c.lse, c.workspace, c.q_start, c.kv_start};
    free_device_buffers(device_buffers, sizeof device_buffers / sizeof device_buffers[0]);
}

/* Autotuning from 256 rows on (its default starts at 4096): the tuned and the class winner's plans against the
   CPU; 300 x 300 tunes its size class (256-511), 400 x 400 then takes the winner, 1024 x 1024 tunes its own;
   the report has a line per tuned class and direction. */
static void test_autotune(void **state)
{
    (void)state;
    attention_cudnn *untuned = g_cudnn;
    g_cudnn = attention_cudnn_create(1, 256);
    check_shape(300, 300, 4, 128);
    check_shape(400, 400, 3, 128);
    check_shape(1024, 1024, 2, 64);
    char *report = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&report, &size);
    assert_non_null(out);
    attention_cudnn_tuning_report(g_cudnn, out);
    fclose(out);
    printf("# %s", report);
    int lines = 0;
    for (const char *line = strstr(report, "cuDNN "); line; line = strstr(line + 1, "cuDNN ")) ++lines;
    assert_true(lines >= 2); /* some class may have had no candidate that builds: then it has no line */
    free(report);
    attention_cudnn_free(g_cudnn);
    g_cudnn = untuned;
}

/* Self-attention at 16384 and 32760 tokens; cross-attention of 16384 and 75600 tokens to 512 text rows. */
static void test_speed(void **state)
{
    (void)state;
    run_speed(16384, 16384);
    run_speed(32760, 32760);
    run_speed(16384, 512);
    run_speed(75600, 512);
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    g_cudnn = attention_cudnn_create(0, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_available),
        cmocka_unit_test(test_head_dim_64),
        cmocka_unit_test(test_head_dim_128),
        cmocka_unit_test(test_cross_head_dim_64),
        cmocka_unit_test(test_cross_head_dim_128),
        cmocka_unit_test(test_model_dispatch),
        cmocka_unit_test(test_autotune),
        cmocka_unit_test(test_speed),
        cmocka_unit_test(test_cross_short_text),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    attention_cudnn_free(g_cudnn);
    return failed;
}

#else /* built without CUDA or cuDNN */

int main(void)
{
    return skip_test_program("built without cuDNN");
}

#endif
