/* test_shard.c — cmocka tests of the shard layouts (every value held by exactly one rank, equal pieces per unit, the
   CPU cut equal to comm.h's) and of the training state's bytes per mode (model/layout.h's formula) for Wan-14B. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "backend/shard.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "model/layout.h"

static model_layout small_layout(int layers)
{
    deck config;
    deck_defaults(&config);
    config.model.dim = 64, config.model.ffn_dim = 96, config.model.num_heads = 4, config.model.num_layers = layers;
    config.model.text_dim = 32, config.model.freq_dim = 32;
    const layout_dims dims = layout_dims_of(&config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    return layout;
}

/* Every value held by exactly one rank, as shard_owned says per parameter, and held = the sum of the parts. */
static void check_cover(const model_layout *ml, int units, deck_shard mode, int n_ranks)
{
    const int64_t n = ml->n_weights;
    unsigned char *holders = calloc((size_t)n, 1);
    for (int r = 0; r < n_ranks; r++) {
        shard_layout l = units ? shard_layout_units(mode, ml, r, n_ranks) : shard_layout_of(mode, n, r, n_ranks);
        int64_t held = 0;
        for (int i = 0; i < ml->n_params; i++) {
            int layer;
            int64_t offset, first, count;
            const layout_tensor *tensor = model_layout_param(ml, i, &layer, &offset);
            shard_owned(&l, r, offset, tensor->n_elements, &first, &count);
            assert_true(count >= 0 && first >= offset && first + count <= offset + tensor->n_elements);
            for (int64_t v = first; v < first + count; v++) holders[v]++;
            held += count;
        }
        assert_int_equal(held, l.held);
        if (!units) { /* one unit: comm.h's cut */
            const int64_t shard = comm_shard_values(n, n_ranks);
            int64_t expect_first = (int64_t)r * shard < n ? (int64_t)r * shard : n;
            int64_t expect_count = n - expect_first < shard ? n - expect_first : shard;
            if (mode == SHARD_NONE) expect_first = 0, expect_count = n;
            assert_int_equal(l.first, expect_first);
            assert_int_equal(l.count, expect_count);
        }
        if (mode != SHARD_NONE)
            assert_true(l.held <= layout_shard_values(ml, units ? LAYOUT_BACKEND_GPU : LAYOUT_BACKEND_CPU, n_ranks));
    }
    for (int64_t v = 0; v < n; v++) assert_int_equal(holders[v], mode == SHARD_NONE ? n_ranks : 1);
    free(holders);
}

static void test_layouts_cover_each_value_once(void **unused)
{
    (void)unused;
    for (int layers = 0; layers <= 3; layers++) {
        const model_layout ml = small_layout(layers);
        for (int n_ranks = 1; n_ranks <= 7; n_ranks++) {
            check_cover(&ml, 0, SHARD_FULL, n_ranks);
            check_cover(&ml, 1, SHARD_FULL, n_ranks);
            check_cover(&ml, 1, SHARD_OPTIMIZER, n_ranks);
        }
        check_cover(&ml, 1, SHARD_NONE, 3);
        check_cover(&ml, 0, SHARD_NONE, 2);
    }
}

/* With the unit cut, a block's pieces are equal (ceil) on every rank but the last ones: one NCCL call per block. */
static void test_unit_pieces_are_equal(void **unused)
{
    (void)unused;
    const model_layout ml = small_layout(3);
    const int n_ranks = 5;
    const int64_t piece = (ml.block_stride + n_ranks - 1) / n_ranks;
    for (int r = 0; r < n_ranks; r++) {
        shard_layout l = shard_layout_units(SHARD_FULL, &ml, r, n_ranks);
        int64_t first, count;
        shard_owned(&l, r, ml.blocks_offset + ml.block_stride, ml.block_stride, &first, &count); /* block 1 whole */
        const int64_t lo = (int64_t)r * piece < ml.block_stride ? (int64_t)r * piece : ml.block_stride;
        const int64_t hi = lo + piece < ml.block_stride ? lo + piece : ml.block_stride;
        assert_int_equal(first, ml.blocks_offset + ml.block_stride + lo);
        assert_int_equal(count, hi - lo);
    }
}

/* Wan-14B over 8 ranks, fully sharded on GPUs: the state per rank, computed here from the parameter count alone,
   at most 31 GiB (issue 18's target: at most 32 GiB, leaving at least 95 GiB of an H200's 140 GiB for activations
   after the 10% margin); none holds 18 bytes a parameter. */
static void test_wan14b_full_state(void **unused)
{
    (void)unused;
    deck config;
    deck_defaults(&config);
    config.model.dim = 5120, config.model.ffn_dim = 13824, config.model.num_heads = 40, config.model.num_layers = 40;
    const layout_dims dims = layout_dims_of(&config);
    model_layout ml;
    model_layout_init(&ml, &dims);
    /* the GPU's sharded units are padded to 8 equal pieces; the fp32 reads f stay whole: in full head.modulation and
       each block's modulation and norm3, in the other modes also the time path */
    const int64_t head = ml.n_weights - ml.blocks_offset - 40 * ml.block_stride;
    const double n = (double)ml.n_weights, b = 8.0 * (double)((ml.block_stride + 7) / 8);
    const double m = 8.0 * (double)((ml.blocks_offset + 7) / 8), h = 8.0 * (double)((head + 7) / 8), e = m + h;
    const double D = 5120.0, f_full = 2.0 * D + 40.0 * 8.0 * D;
    const double f = f_full + (256.0 * D + D) + (D * D + D) + (6.0 * D * D + 6.0 * D);
    assert_true((double)layout_gpu_fp32_read_values(&ml, SHARD_FULL) == f_full);
    assert_true((double)layout_gpu_fp32_read_values(&ml, SHARD_OPTIMIZER) == f);
    layout_state_bytes none = model_layout_state_bytes(&ml, LAYOUT_BACKEND_GPU, SHARD_NONE, 8, 0);
    assert_true(layout_state_total(&none) == 18.0 * n);
    const double s = (double)layout_shard_values(&ml, LAYOUT_BACKEND_GPU, 8);
    assert_true(s >= n / 8.0 && s < n / 8.0 + 42.0 * 8.0);
    layout_state_bytes full = model_layout_state_bytes(&ml, LAYOUT_BACKEND_GPU, SHARD_FULL, 8, 0);
    assert_true(b > m); /* the staging slots are a block's */
    assert_true(layout_state_total(&full) == 2.0 * e + 4.0 * b + 4.0 * (h + 2.0 * b) + 16.0 * s + 4.0 * f_full);
    assert_true(layout_state_total(&full) <= 31.0 * 1073741824.0);
    assert_true(140.0 * 0.9 * 1073741824.0 - layout_state_total(&full) >= 95.0 * 1073741824.0);
    layout_state_bytes optimizer = model_layout_state_bytes(&ml, LAYOUT_BACKEND_GPU, SHARD_OPTIMIZER, 8, 0);
    assert_true(layout_state_total(&optimizer) == 2.0 * (e + 40.0 * b) + 4.0 * n + 12.0 * s + 4.0 * f);
    layout_state_bytes cpu = model_layout_state_bytes(&ml, LAYOUT_BACKEND_CPU, SHARD_FULL, 8, 0);
    assert_true(layout_state_total(&cpu) == 8.0 * n + 12.0 * (double)((ml.n_weights + 7) / 8));
    /* the EMA: 4 bytes per held value, as the master */
    layout_state_bytes ema_full = model_layout_state_bytes(&ml, LAYOUT_BACKEND_GPU, SHARD_FULL, 8, 1);
    assert_true(ema_full.ema == 4.0 * s && layout_state_total(&ema_full) == layout_state_total(&full) + 4.0 * s);
    layout_state_bytes ema_none = model_layout_state_bytes(&ml, LAYOUT_BACKEND_CPU, SHARD_NONE, 8, 1);
    assert_true(ema_none.ema == 4.0 * n && layout_state_total(&ema_none) == 20.0 * n);
    layout_state_bytes ema_cpu = model_layout_state_bytes(&ml, LAYOUT_BACKEND_CPU, SHARD_FULL, 8, 1);
    assert_true(ema_cpu.ema == 4.0 * (double)((ml.n_weights + 7) / 8));
    char text[512];
    shard_describe(SHARD_FULL, 8, &ema_full, 0, text, sizeof text);
    assert_non_null(strstr(text, ", EMA weights "));
    shard_describe(SHARD_FULL, 8, &full, 0, text, sizeof text);
    assert_null(strstr(text, "EMA"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts_cover_each_value_once),
        cmocka_unit_test(test_unit_pieces_are_equal),
        cmocka_unit_test(test_wan14b_full_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
