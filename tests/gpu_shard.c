/* gpu_shard.c — the CUDA backend's [train] shard modes against none: the device state each allocates is the state formula to the byte, and 5 steps of every mode (both recomputation modes, even and uneven micro-batch counts across ranks; also a one-block model whose embeddings outweigh its block) give none's losses within 1e-6 and its weights and EMA within 1e-5 where the gradient sum has none's order, and the bounds of a reordered fp32 sum where it has not (bounds_for). Runs on any number of MPI ranks with a GPU each or sharing GPUs (tests/gpu_shard_ranks.sh: 2 and 3). */
#include "config.h"

#include <math.h>
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

#include "backend/backend.h"
#include "backend/shard.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/rng.h"
#include "cuda/backend_cuda.h"
#include "cuda/gpu.h"
#include "cuda/gradsync.h"
#include "model/model.h"

enum { kSteps = 5, kMaxMicro = 2, kSamplesPerMicro = 2 };

static comm_info info;

/* The dims of a run: the quick-start's (D 64, F 128, 4 heads, 16 text tokens of 32) with 3 layers, or one layer
   with text of 256 dims, whose embeddings (56 k values) are more than its block (51 k): the staging slots are
   the embeddings' size then. */
typedef enum { DIMS_THREE_BLOCKS, DIMS_ONE_BLOCK } tiny_dims;
static const tiny_dims kAllDims[] = {DIMS_THREE_BLOCKS, DIMS_ONE_BLOCK};
static const char *dims_name(tiny_dims dims) { return dims == DIMS_ONE_BLOCK ? "1 block, text 256" : "3 blocks"; }

static void tiny_deck(deck *config, tiny_dims dims, deck_shard shard, deck_recompute recompute)
{
    deck_defaults(config);
    config->model.dim = 64;
    config->model.ffn_dim = 128;
    config->model.num_heads = 4;
    config->model.num_layers = dims == DIMS_ONE_BLOCK ? 1 : 3;
    config->model.text_len = 16;
    config->model.text_dim = dims == DIMS_ONE_BLOCK ? 256 : 32;
    config->model.freq_dim = 32;
    config->train.shard = shard;
    config->train.recompute = config->balance.recompute = recompute;
    config->train.autotune = 0;               /* the same GEMM configurations in every run */
    config->train.grad_clip = 1.0;
    config->train.ema_decay = 0.9;            /* the EMA is held as the master is */
    config->balance.mem_budget = 256.0 * 1024.0 * 1024.0;
}

/* Every sample: latent 2 x 8 x 8 (32 tokens at patch 1x2x2) and 16 text rows. */
static const int32_t kFrames = 2, kHeight = 8, kWidth = 8, kText = 16;

static void store_samples(balance_sample *samples, int n)
{
    for (int i = 0; i < n; i++) samples[i] = (balance_sample){.id = i, .tokens = 32, .text_len = kText};
}

/* The micro-batches of a step. UNEVEN: rank 0 has 2 on odd steps, every other count 1 (so a rank replays); EVEN: one
   per rank and step, where on 2 ranks every mode sums a parameter's gradient in one collective of two terms (none: an
   all-reduce, gradients and full: a reduce-scatter), so that the order of the sum is the same. */
typedef enum { UNEVEN, EVEN } schedule;
static const char *schedule_name(schedule s) { return s == EVEN ? "even" : "uneven"; }
static int micro_batches(schedule s, int step, int rank) { return s == UNEVEN && rank == 0 && step % 2 == 1 ? 2 : 1; }

typedef struct {
    int32_t frames[kSamplesPerMicro], height[kSamplesPerMicro], width[kSamplesPerMicro], text_len[kSamplesPerMicro];
    float sigma[kSamplesPerMicro];
    float *latents, *noise, *text;
    model_batch batch;
} micro;

static void make_micro(const model *m, uint64_t seed, micro *mb)
{
    const int64_t latent = (int64_t)m->in_dim * kFrames * kHeight * kWidth * kSamplesPerMicro;
    const int64_t text = (int64_t)kText * m->text_dim * kSamplesPerMicro;
    mb->latents = xmalloc((size_t)latent * sizeof(float));
    mb->noise = xmalloc((size_t)latent * sizeof(float));
    mb->text = xmalloc((size_t)text * sizeof(float));
    for (int64_t i = 0; i < latent; i++) {
        mb->latents[i] = (float)rng_normal(&seed);
        mb->noise[i] = (float)rng_normal(&seed);
    }
    for (int64_t i = 0; i < text; i++) mb->text[i] = (float)rng_normal(&seed);
    for (int b = 0; b < kSamplesPerMicro; b++) {
        mb->frames[b] = kFrames, mb->height[b] = kHeight, mb->width[b] = kWidth, mb->text_len[b] = kText;
        mb->sigma[b] = (float)(0.2 + 0.6 * rng_uniform(&seed));
    }
    mb->batch = (model_batch){.n_samples = kSamplesPerMicro, .frames = mb->frames, .height = mb->height,
                              .width = mb->width, .text_len = mb->text_len, .latents = mb->latents,
                              .noise = mb->noise, .sigma = mb->sigma, .text = mb->text};
}

static void free_micro(micro *mb)
{
    free(mb->latents);
    free(mb->noise);
    free(mb->text);
}

/* The held values of every tensor of `weights` (n_weights, the same on every rank) set on the backend. */
static void set_weights(backend *dev, const model *m, const float *weights)
{
    const shard_layout *layout = dev->ops->layout(dev);
    for (int p = 0; p < m->n_params; p++) {
        int64_t own_first = 0, own_count = 0;
        shard_owned(layout, info.rank, m->params[p].offset, m->params[p].n_elements, &own_first, &own_count);
        if (own_count > 0) dev->ops->set_range(dev, BACKEND_WEIGHTS, own_first, own_count, weights + own_first);
    }
}

/* The held values of every tensor of `group` after the run, NaN where this rank holds none. */
static void get_held(const backend *dev, const model *m, backend_group group, float *weights)
{
    const shard_layout *layout = dev->ops->layout(dev);
    for (int64_t i = 0; i < m->n_weights; i++) weights[i] = NAN;
    for (int p = 0; p < m->n_params; p++) {
        int64_t own_first = 0, own_count = 0;
        shard_owned(layout, info.rank, m->params[p].offset, m->params[p].n_elements, &own_first, &own_count);
        if (own_count > 0) dev->ops->get_range(dev, group, own_first, own_count, weights + own_first);
    }
}

/* kSteps steps of `shard` from the same weights; the mean loss of each step (over every rank) into losses and the
   held weights and EMA after them into weights and ema. */
static void run_steps(tiny_dims dims, schedule order, deck_shard shard, deck_recompute recompute, double *losses,
                      double *norms, float *weights, float *ema)
{
    deck config;
    tiny_deck(&config, dims, shard, recompute);
    model m;
    model_create(&m, &config);
    model_init_gaussian(&m, 0x5eed5a4dull, 0.1f);
    balance_sample samples[2 * kMaxMicro * kSamplesPerMicro];
    store_samples(samples, (int)(sizeof samples / sizeof samples[0]));
    backend *dev = backend_cuda_create(&config, &info, &m, samples, (int64_t)(sizeof samples / sizeof samples[0]));
    assert_non_null(dev);
    assert_int_equal(dev->ops->plan(dev)->shard, shard);
    set_weights(dev, &m, m.weights);
    dev->ops->start(dev);
    for (int step = 1; step <= kSteps; step++) {
        int rounds = 0;
        int64_t global = 0;
        for (int r = 0; r < info.n_ranks; r++) {
            rounds = micro_batches(order, step, r) > rounds ? micro_batches(order, step, r) : rounds;
            global += (int64_t)micro_batches(order, step, r) * kSamplesPerMicro;
        }
        dev->ops->begin_step(dev, rounds);
        double loss = 0.0;
        const int mine = micro_batches(order, step, info.rank);
        for (int k = 0; k < mine; k++) {
            micro mb;
            make_micro(&m, rng_hash(0x5eedba7cull, (uint64_t)(step * 64 + info.rank * 4 + k)), &mb);
            loss += dev->ops->micro_batch(dev, &mb.batch, 1.0f / (float)global, k == mine - 1);
            free_micro(&mb);
        }
        dev->ops->sum_gradients(dev);
        adamw_step hyper = {.lr = 1e-3, .beta1 = config.train.beta1, .beta2 = config.train.beta2,
                            .eps = config.train.adam_eps, .step = step};
        backend_step_result result;
        dev->ops->finish_step(dev, &hyper, 1, &result);
        comm_allreduce_sum_f64(&loss, 1);
        losses[step - 1] = loss / (double)global;
        norms[step - 1] = result.grad_norm;
        assert_true(isfinite(result.grad_norm) && result.grad_norm > 0.0);
    }
    get_held(dev, &m, BACKEND_WEIGHTS, weights);
    get_held(dev, &m, BACKEND_EMA, ema);
    dev->ops->free(dev);
    model_free(&m);
}

static const char *mode_name(deck_shard shard) { return deck_shard_name(shard); }

/* Every mode's device state is model_layout_state_bytes to the byte, part by part (the plan's `state`), for both
   dims. */
static void test_state_is_the_formula(void **unused)
{
    (void)unused;
    const deck_shard modes[] = {SHARD_NONE, SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_FULL};
    const size_t n_modes = sizeof modes / sizeof modes[0];
    for (size_t c = 0; c < n_modes * (sizeof kAllDims / sizeof kAllDims[0]); c++) {
        const tiny_dims dims = kAllDims[c / n_modes];
        const size_t i = c % n_modes;
        deck config;
        tiny_deck(&config, dims, modes[i], RECOMPUTE_NONE);
        model m;
        model_create_table(&m, &config);
        balance_sample samples[4];
        store_samples(samples, 4);
        backend *dev = backend_cuda_create(&config, &info, &m, samples, 4);
        assert_non_null(dev);
        const backend_plan *plan = dev->ops->plan(dev);
        const layout_state_bytes formula = model_layout_state_bytes(&m.layout, LAYOUT_BACKEND_GPU, modes[i], info.n_ranks,
                                                                    config.train.ema_decay > 0.0);
        const layout_state_bytes got = backend_cuda_state_bytes(dev);
        if (info.rank == 0)
            printf("# %s, %s over %d rank(s): %.0f bytes allocated (weights %.0f, gathered %.0f, gradients %.0f, master "
                   "%.0f, moments %.0f), formula %.0f; activation budget %.0f\n", dims_name(dims),
                   mode_name(modes[i]), info.n_ranks,
                   layout_state_total(&got), got.weights, got.gathered, got.gradients, got.master, got.moments,
                   layout_state_total(&formula), plan->mem_budget);
        assert_true(got.weights == formula.weights && got.gathered == formula.gathered &&
                    got.gradients == formula.gradients && got.master == formula.master &&
                    got.moments == formula.moments && got.ema == formula.ema && got.ema > 0.0);
        assert_true(layout_state_total(&plan->state) == layout_state_total(&formula));
        dev->ops->free(dev);
        model_free(&m);
    }
}

/* How far a run is from a reference run: the relative difference of the step-1 loss and gradient norm (the same
   weights: only the order of the gradient sum can differ), the largest relative difference of a step's loss and the
   relative L2 differences of the held weights and EMA after the steps. */
typedef struct { double loss1, norm1, loss, weights, ema; } departure;

typedef struct { double losses[kSteps], norms[kSteps]; float *weights, *ema; } run_result;

static void run(tiny_dims dims, schedule order, deck_shard shard, deck_recompute recompute, run_result *out, int64_t n)
{
    out->weights = xmalloc((size_t)n * sizeof(float));
    out->ema = xmalloc((size_t)n * sizeof(float));
    run_steps(dims, order, shard, recompute, out->losses, out->norms, out->weights, out->ema);
}

static void free_run(run_result *r)
{
    free(r->weights);
    free(r->ema);
}

static departure compare_runs(const run_result *a, const run_result *ref, int64_t n)
{
    departure d = {0};
    for (int s = 0; s < kSteps; s++) d.loss = fmax(d.loss, fabs(a->losses[s] - ref->losses[s]) / fabs(ref->losses[s]));
    d.loss1 = fabs(a->losses[0] - ref->losses[0]) / fabs(ref->losses[0]);
    d.norm1 = fabs(a->norms[0] - ref->norms[0]) / ref->norms[0];
    double diff2 = 0.0, norm2 = 0.0, ema_diff2 = 0.0, ema_norm2 = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (isnan(a->weights[j])) continue;
        diff2 += ((double)a->weights[j] - ref->weights[j]) * ((double)a->weights[j] - ref->weights[j]);
        norm2 += (double)ref->weights[j] * ref->weights[j];
        ema_diff2 += ((double)a->ema[j] - ref->ema[j]) * ((double)a->ema[j] - ref->ema[j]);
        ema_norm2 += (double)ref->ema[j] * ref->ema[j];
    }
    d.weights = sqrt(diff2 / (norm2 > 0.0 ? norm2 : 1.0));
    d.ema = sqrt(ema_diff2 / (ema_norm2 > 0.0 ? ema_norm2 : 1.0));
    return d;
}

/* The bounds. Where a mode sums the gradients in none's order (optimizer always; every mode on 2 ranks with one
   micro-batch per rank) the arithmetic is the same: losses within 1e-6, weights and EMA within 1e-5 (they are equal to
   the bit on an H200). gradients and full reduce-scatter each micro-batch's gradients as its backward ends, so where a
   rank has two micro-batches the sum is (a1 + b) + a2 against none's (a1 + a2) + b, and over 3 or more ranks NCCL's
   reduce-scatter adds the ranks' terms in another order than its all-reduce: the same terms in another order. Then
   step 1, computed from the same weights, has none's loss (within 1e-6), and its summed gradient differs from none's only by
   the rounding of a sum of m fp32 terms in another order, at most 2 (m - 1) u relative in each value (u = 2^-24, m the
   step's micro-batches over all ranks), so its norm as well. From step 2 on, a master weight a last bit apart can have a
   bf16 copy one bf16 step apart (2^-8 relative), which the forward reads: the losses, weights and EMA after are held to
   2^-8. */
typedef struct { double loss1, norm1, loss, weights, ema; } bounds;

static bounds bounds_for(deck_shard mode, schedule order)
{
    const int reordered = mode != SHARD_OPTIMIZER && (order == UNEVEN || info.n_ranks > 2);
    if (!reordered) return (bounds){.loss1 = 1e-6, .norm1 = 1e-6, .loss = 1e-6, .weights = 1e-5, .ema = 1e-5};
    int terms = 0;
    for (int r = 0; r < info.n_ranks; r++) terms += micro_batches(order, 1, r);
    const double bf16_step = ldexp(1.0, -8);
    return (bounds){.loss1 = 1e-6, .norm1 = 2.0 * (terms - 1) * ldexp(1.0, -24), .loss = bf16_step, .weights = bf16_step,
                    .ema = bf16_step};
}

/* 5 steps of each sharded mode against none's, with and without block recomputation, on both schedules. */
static void check_losses_match_none(tiny_dims dims)
{
    deck config;
    tiny_deck(&config, dims, SHARD_NONE, RECOMPUTE_NONE);
    model table;
    model_create_table(&table, &config);
    if (dims == DIMS_ONE_BLOCK) assert_true(table.layout.blocks_offset > table.layout.block_stride);
    const int64_t n = table.n_weights;
    const deck_recompute recomputes[] = {RECOMPUTE_NONE, RECOMPUTE_BLOCK};
    const deck_shard modes[] = {SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_FULL};
    const schedule orders[] = {EVEN, UNEVEN};
    int failed = 0;
    for (size_t r = 0; r < 2; r++) {
        for (size_t o = 0; o < 2; o++) {
            run_result reference;
            run(dims, orders[o], SHARD_NONE, recomputes[r], &reference, n);
            for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
                run_result got;
                run(dims, orders[o], modes[i], recomputes[r], &got, n);
                const departure d = compare_runs(&got, &reference, n);
                const bounds b = bounds_for(modes[i], orders[o]);
                const int ok = d.loss1 <= b.loss1 && d.norm1 <= b.norm1 && d.loss <= b.loss && d.weights <= b.weights &&
                               d.ema <= b.ema && got.losses[kSteps - 1] != got.losses[0]; /* the steps changed them */
                if (info.rank == 0)
                    printf("# %s, %s, recompute %s, %s micro-batches, %d rank(s): step 1's loss within %.3g (bound %.3g) "
                           "and gradient norm within %.3g (%.3g) of none's; losses within %.3g (%.3g), held weights after "
                           "%d steps within %.3g (%.3g), their EMA within %.3g (%.3g)%s\n", dims_name(dims),
                           mode_name(modes[i]), deck_recompute_name(recomputes[r]), schedule_name(orders[o]), info.n_ranks,
                           d.loss1, b.loss1, d.norm1, b.norm1, d.loss, b.loss, kSteps, d.weights, b.weights, d.ema, b.ema,
                           ok ? "" : ": FAILED");
                failed += !ok;
                free_run(&got);
            }
            free_run(&reference);
        }
    }
    model_free(&table);
    assert_int_equal(failed, 0);
}

static void test_losses_match_none(void **unused)
{
    (void)unused;
    check_losses_match_none(DIMS_THREE_BLOCKS);
}

static void test_one_block_losses_match_none(void **unused)
{
    (void)unused;
    check_losses_match_none(DIMS_ONE_BLOCK);
}

int main(int argc, char **argv)
{
    info = comm_init(&argc, &argv);
    int status, nccl_version = 0;
    if (gpu_count() == 0) status = skip_test_program("no GPU visible (cudaGetDeviceCount found none)");
    else if (gpu_count() < info.n_local_ranks && !gradsync_ranks_may_share_gpu(&nccl_version))
        status = skip_test_program("fewer GPUs than ranks on this node, and NCCL cannot put several ranks on one "
                                   "(2.30.3 or later with NCCL_MULTI_RANK_GPU_ENABLE=1)");
    else {
        gpu_select(info.local_rank);
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_state_is_the_formula),
            cmocka_unit_test(test_losses_match_none),
            cmocka_unit_test(test_one_block_losses_match_none),
        };
        status = cmocka_run_group_tests(tests, NULL, NULL);
    }
    comm_finalize();
    return status;
}

#else /* built without CUDA */

int main(void)
{
    return skip_test_program("built without CUDA");
}

#endif
