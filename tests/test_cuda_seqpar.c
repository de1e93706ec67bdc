/* test_cuda_seqpar.c — cmocka tests of the sequence-parallel pieces of the GPU model on one GPU: the exchange's column split and join against a host loop and each other, a member's patchify of its slice and its part of the flow loss against the whole micro-batch's, and a loopback group's all-to-all (only the own part moves). */
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
#include "cuda/fused.h"
#include "cuda/gpu.h"
#include "cuda/kernels_misc.h"
#include "cuda/seqpar_gpu.h"

static uint64_t g_seed = 0x5e9a0031ull;

/* [rows, dim] bf16 rows split into k column blocks, packed part-major, and joined back: the packing is a host loop's,
   the join gives the rows back bit for bit. */
static void split_join_case(int64_t rows, int dim, int parts)
{
    gpu_bf16 *bits = NULL;
    float *values = random_normal_bf16(&g_seed, (size_t)(rows * dim), 0.0, 1.0, &bits);
    gpu_bf16 *src = device_upload(bits, (size_t)(rows * dim) * sizeof(gpu_bf16));
    gpu_bf16 *packed = device_poisoned((size_t)(rows * dim) * sizeof(gpu_bf16));
    gpu_bf16 *back = device_poisoned((size_t)(rows * dim) * sizeof(gpu_bf16));
    misc_split_columns_bf16(src, rows, dim, parts, packed, 0);
    misc_join_columns_bf16(packed, rows, dim, parts, back, 0);
    gpu_bf16 *got = download_bf16_bits(packed, (size_t)(rows * dim)), *again = download_bf16_bits(back, (size_t)(rows * dim));
    const int width = dim / parts;
    for (int p = 0; p < parts; p++)
        for (int64_t r = 0; r < rows; r++)
            for (int c = 0; c < width; c++)
                if (got[(p * rows + r) * width + c] != bits[r * dim + p * width + c])
                    fail_msg("split %lldx%d into %d: part %d row %lld column %d differs", (long long)rows, dim, parts, p,
                             (long long)r, c);
    assert_memory_equal(again, bits, (size_t)(rows * dim) * sizeof(gpu_bf16));
    void *device[] = {src, packed, back};
    free_device_buffers(device, 3);
    void *host[] = {values, bits, got, again};
    free_host_buffers(host, 4);
}

static void test_split_join(void **state)
{
    (void)state;
    split_join_case(37, 64, 4);
    split_join_case(5, 64, 2);
    split_join_case(300, 1536, 4);
    split_join_case(1, 16, 1);
}

/* Two samples (latents 16 x F x H x W, patch 1x2x2) of 2x6x8 (24 tokens) and 3x4x6 (18 tokens): 42 rows, split over
   3 members at 14 and 28 (sample 0 over members 0 and 1, sample 1 over 1 and 2). */
enum { kChannels = 16, kSamples = 2, kMembers = 3 };
static const int32_t kShape[kSamples][3] = {{2, 6, 8}, {3, 4, 6}};

typedef struct {
    int64_t latent_start[kSamples + 1], token_start[kSamples + 1], n_values, n_tokens;
    int32_t shape[kSamples * 3];
    float sigma[kSamples];
} packed_samples;

static void pack_samples(packed_samples *p)
{
    p->latent_start[0] = p->token_start[0] = 0;
    for (int b = 0; b < kSamples; b++) {
        for (int i = 0; i < 3; i++) p->shape[3 * b + i] = kShape[b][i];
        p->latent_start[b + 1] = p->latent_start[b] + (int64_t)kChannels * kShape[b][0] * kShape[b][1] * kShape[b][2];
        p->token_start[b + 1] = p->token_start[b] + (int64_t)kShape[b][0] * (kShape[b][1] / 2) * (kShape[b][2] / 2);
        p->sigma[b] = 0.25f + 0.5f * (float)b;
    }
    p->n_values = p->latent_start[kSamples];
    p->n_tokens = p->token_start[kSamples];
}

/* Member m's rows [m T/k, (m+1) T/k) as model_gpu.cu's sp_slice cuts them: each sample's rows there (clamped), its
   first token there, and the whole samples' element offsets of the loss. */
static void member_tables(const packed_samples *p, int member, int64_t *rows, int64_t *first, int64_t *row_lo,
                          int64_t *n_rows)
{
    *row_lo = p->n_tokens * member / kMembers;
    *n_rows = p->n_tokens * (member + 1) / kMembers - *row_lo;
    for (int b = 0; b <= kSamples; b++) {
        const int64_t row = p->token_start[b] - *row_lo;
        rows[b] = row < 0 ? 0 : row > *n_rows ? *n_rows : row;
        if (b < kSamples) first[b] = *row_lo + rows[b] - p->token_start[b];
    }
}

/* Each member's patchify of its rows is the whole micro-batch's rows there, bit for bit; so are its d_pred rows of
   the loss, and its per-sample losses add up to the whole's (fp32 partial sums in another grouping: 1e-5). */
static void test_member_patchify_and_loss(void **state)
{
    (void)state;
    packed_samples p;
    pack_samples(&p);
    const int64_t patch = kChannels * 4, T = p.n_tokens;
    float *latents = random_normal_f32(&g_seed, (size_t)p.n_values, 0.0, 1.0);
    float *noise = random_normal_f32(&g_seed, (size_t)p.n_values, 0.0, 1.0);
    int64_t whole_pred[kSamples + 1];
    for (int b = 0; b <= kSamples; b++) whole_pred[b] = p.token_start[b] * patch;
    float *d_latents = device_upload(latents, (size_t)p.n_values * sizeof(float));
    float *d_noise = device_upload(noise, (size_t)p.n_values * sizeof(float));
    int64_t *d_latent_start = device_upload(p.latent_start, sizeof p.latent_start);
    int64_t *d_token_start = device_upload(p.token_start, sizeof p.token_start);
    int64_t *d_whole_pred = device_upload(whole_pred, sizeof whole_pred);
    int32_t *d_shape = device_upload(p.shape, sizeof p.shape);
    float *d_sigma = device_upload(p.sigma, sizeof p.sigma);
    gpu_bf16 *x_t = device_poisoned((size_t)(T * patch) * sizeof(gpu_bf16)), *d_pred = device_poisoned((size_t)(T * patch) * sizeof(gpu_bf16));
    float *x0 = device_poisoned((size_t)(T * patch) * sizeof(float)), *eps = device_poisoned((size_t)(T * patch) * sizeof(float));
    float *loss = device_poisoned(kSamples * sizeof(float));
    void *workspace = device_poisoned(fused_flow_loss_workspace_bytes(kSamples) + 16);
    misc_patchify_flow(d_latents, d_noise, kSamples, d_latent_start, d_token_start, d_shape, d_sigma, p.n_values,
                       kChannels, 1, 2, 2, x_t, x0, eps, 0);
    /* the prediction: x_t's values, as bf16 (any fixed values serve) */
    fused_flow_loss_bf16(x_t, x0, eps, d_whole_pred, kSamples, 0.5f, loss, d_pred, workspace, 0);
    gpu_bf16 *whole_x_t = download_bf16_bits(x_t, (size_t)(T * patch)), *whole_d_pred = download_bf16_bits(d_pred, (size_t)(T * patch));
    float *whole_loss = download_f32(loss, kSamples);
    double parts[kSamples] = {0};
    for (int m = 0; m < kMembers; m++) {
        int64_t rows[kSamples + 1], first[kSamples], row_lo, n_rows, pred_start[kSamples + 1];
        member_tables(&p, m, rows, first, &row_lo, &n_rows);
        for (int b = 0; b <= kSamples; b++) pred_start[b] = rows[b] * patch;
        int64_t *d_rows = device_upload(rows, sizeof rows), *d_first = device_upload(first, sizeof first);
        int64_t *d_pred_start = device_upload(pred_start, sizeof pred_start);
        device_poison(x_t, (size_t)(T * patch) * sizeof(gpu_bf16));
        device_poison(d_pred, (size_t)(T * patch) * sizeof(gpu_bf16));
        misc_patchify_flow_rows(d_latents, d_noise, kSamples, d_latent_start, d_rows, d_first, d_shape, d_sigma,
                                p.n_values, kChannels, 1, 2, 2, x_t, x0, eps, 0);
        fused_flow_loss_part_bf16(x_t, x0, eps, d_pred_start, d_whole_pred, kSamples, 0.5f, loss, d_pred, workspace, 0);
        gpu_bf16 *mine = download_bf16_bits(x_t, (size_t)(n_rows * patch)), *grad = download_bf16_bits(d_pred, (size_t)(n_rows * patch));
        float *part = download_f32(loss, kSamples);
        assert_memory_equal(mine, whole_x_t + row_lo * patch, (size_t)(n_rows * patch) * sizeof(gpu_bf16));
        assert_memory_equal(grad, whole_d_pred + row_lo * patch, (size_t)(n_rows * patch) * sizeof(gpu_bf16));
        for (int b = 0; b < kSamples; b++) parts[b] += part[b];
        void *device[] = {d_rows, d_first, d_pred_start};
        free_device_buffers(device, 3);
        void *host[] = {mine, grad, part};
        free_host_buffers(host, 3);
    }
    for (int b = 0; b < kSamples; b++)
        if (!(fabs(parts[b] - whole_loss[b]) <= 1e-5 * fabs(whole_loss[b])))
            fail_msg("sample %d: the members' losses add up to %.9g, the whole's is %.9g", b, parts[b], whole_loss[b]);
    void *device[] = {d_latents, d_noise, d_latent_start, d_token_start, d_whole_pred, d_shape, d_sigma, x_t, d_pred,
                      x0, eps, loss, workspace};
    free_device_buffers(device, sizeof device / sizeof device[0]);
    void *host[] = {latents, noise, whole_x_t, whole_d_pred, whole_loss};
    free_host_buffers(host, sizeof host / sizeof host[0]);
}

/* A loopback group of 4, member 2: an all-to-all of two tensors places the own part and leaves the others' parts of
   the receive buffers untouched. */
static void test_loopback_exchange(void **state)
{
    (void)state;
    seqpar_gpu *sp = seqpar_gpu_create_loopback(4, 2);
    assert_int_equal(seqpar_gpu_count(sp), 2);
    const seqpar_gpu_group *group = seqpar_gpu_get(sp, 4);
    assert_non_null(group);
    assert_null(seqpar_gpu_get(sp, 8));
    assert_int_equal(seqpar_gpu_size(group), 4);
    assert_int_equal(seqpar_gpu_rank(group), 2);
    enum { kValues = 64 };
    const int64_t counts[4] = {16, 16, 16, 16}, displs[4] = {0, 16, 32, 48};
    gpu_bf16 *bits[2], *send[2], *recv[2];
    float *values[2];
    for (int t = 0; t < 2; t++) {
        values[t] = random_normal_bf16(&g_seed, kValues, 0.0, 1.0, &bits[t]);
        send[t] = device_upload(bits[t], kValues * sizeof(gpu_bf16));
        recv[t] = device_poisoned(kValues * sizeof(gpu_bf16));
    }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    seqpar_gpu_alltoall_bf16(group, 2, (const gpu_bf16 *const *)send, counts, displs, recv, counts, displs, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int t = 0; t < 2; t++) {
        gpu_bf16 *got = download_bf16_bits(recv[t], kValues);
        assert_memory_equal(got + 32, bits[t] + 32, 16 * sizeof(gpu_bf16));
        for (int i = 0; i < kValues; i++)
            if ((i < 32 || i >= 48) && got[i] != 0xffff) fail_msg("tensor %d: value %d was written", t, i);
        free(got);
        void *device[] = {send[t], recv[t]};
        free_device_buffers(device, 2);
        void *host[] = {values[t], bits[t]};
        free_host_buffers(host, 2);
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    seqpar_gpu_free(sp);
}

int main(void)
{
    /* Under make check (TAP) a skipped file is a "1..0 # SKIP" plan with status 0; run by hand: 77. */
    if (gpu_count() == 0) return skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    gpu_select(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_join),
        cmocka_unit_test(test_member_patchify_and_loss),
        cmocka_unit_test(test_loopback_exchange),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
