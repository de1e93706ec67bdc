/* test_balance.c — cmocka tests of the cost model (FLOPs, memory, NNLS refit) and the balancer's invariants:
   each sample once per epoch, micro-batches under the memory budget, seeded orders, resumable state. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "balance/balance.h"
#include "balance/costmodel.h"
#include "deck/deck.h"
#include "core/rng.h"

static const deck_strategy all_strategies[3] = {STRATEGY_GLOBAL, STRATEGY_DUAL, STRATEGY_EQUAL_TOKENS};

static deck test_deck(deck_strategy strategy, uint64_t seed)
{
    deck config;
    deck_defaults(&config);
    config.run.seed = seed;
    config.balance.strategy = strategy;
    config.balance.max_tokens = 16384;
    config.balance.pool = 256;
    return config;
}

/* Random samples: token counts from a few random "buckets" of a random spec, some text lengths varied. */
static balance_sample *random_samples(uint64_t seed, int64_t n_samples, int32_t max_tokens)
{
    uint64_t state = rng_key(seed, 99, 0);
    int n_buckets = 2 + (int)(rng_next_u64(&state) % 12);
    int32_t bucket_tokens[16];
    for (int k = 0; k < n_buckets; k++) bucket_tokens[k] = 16 + (int32_t)(rng_next_u64(&state) % (uint64_t)max_tokens);
    balance_sample *samples = malloc((size_t)n_samples * sizeof(*samples));
    for (int64_t i = 0; i < n_samples; i++) {
        int k = (int)(rng_next_u64(&state) % (uint64_t)n_buckets);
        samples[i] = (balance_sample){.id = 1000 + 3 * i, .tokens = bucket_tokens[k],
                                      .text_len = 64 + (int32_t)(rng_next_u64(&state) % 449)};
    }
    return samples;
}

/* Activation bytes of `tokens` tokens with 512 text tokens, by a cost model of `config`. */
static double mem_of(const deck *config, int64_t tokens)
{
    cost_model cm;
    cost_model_init(&cm, config);
    double bytes = cost_model_mem(&cm, tokens, 512);
    cost_model_free(&cm);
    return bytes;
}

/* Check one assignment's structure; mark each sample seen in `seen` (by index); returns the epoch. */
static int64_t check_assignment(const balance_assignment *a, const balance_sample *samples, int n_ranks,
                                double mem_budget, const cost_model *cm, int *seen)
{
    assert_int_equal(a->n_ranks, n_ranks);
    assert_int_equal(a->rank_start[0], 0);
    assert_int_equal(a->rank_start[n_ranks], a->global_samples);
    assert_int_equal(a->rank_micro_start[0], 0);
    for (int r = 0; r < n_ranks; r++) {
        int64_t first = a->rank_start[r], end = a->rank_start[r + 1];
        assert_true(end >= first);
        int m0 = a->rank_micro_start[r], m1 = a->rank_micro_start[r + 1];
        if (end == first) { assert_int_equal(m0, m1); continue; }
        assert_true(m1 > m0);
        assert_int_equal(a->micro_start[m0], first);
        assert_int_equal(a->micro_start[m1], end);
        for (int m = m0; m < m1; m++) {
            assert_true(a->micro_start[m + 1] > a->micro_start[m]);
            double bytes = 0;
            for (int64_t k = a->micro_start[m]; k < a->micro_start[m + 1]; k++) {
                const balance_sample *s = &samples[a->indices[k]];
                bytes += cost_model_mem(cm, s->tokens, s->text_len);
            }
            assert_true(bytes <= mem_budget);
        }
        for (int64_t k = first; k < end; k++) {
            assert_int_equal(a->ids[k], samples[a->indices[k]].id);
            seen[a->indices[k]]++;
        }
    }
    return a->epoch;
}

/* Run `n_epochs` epochs; every sample is seen exactly once per epoch and no step mixes epochs. */
static void run_epochs_and_check(deck_strategy strategy, uint64_t seed, int n_ranks, int64_t n_samples, int n_epochs)
{
    deck config = test_deck(strategy, seed);
    balance_sample *samples = random_samples(seed, n_samples, 6000);
    const double mem_budget = mem_of(&config, 9000);
    balancer *b = balancer_create_checked(&config, samples, n_samples, n_ranks, mem_budget, NULL, stderr);
    assert_non_null(b);
    int *seen = calloc((size_t)n_samples, sizeof(int));
    balance_assignment a = {0};
    int64_t epoch = 0, in_epoch = 0, last_step = -1;
    double *seconds = malloc((size_t)n_ranks * sizeof(double));
    while (epoch < n_epochs) {
        balancer_next(b, &a);
        assert_int_equal(a.step, last_step + 1);
        last_step = a.step;
        assert_int_equal(a.epoch, epoch);
        check_assignment(&a, samples, n_ranks, mem_budget, balancer_cost_model(b), seen);
        for (int r = 0; r < n_ranks; r++) seconds[r] = a.predicted_seconds[r] * 1.3;   /* a slower device */
        balancer_observe(b, seconds);
        in_epoch += a.global_samples;
        assert_true(in_epoch <= n_samples);
        if (in_epoch == n_samples) {
            for (int64_t i = 0; i < n_samples; i++) assert_int_equal(seen[i], 1);
            memset(seen, 0, (size_t)n_samples * sizeof(int));
            in_epoch = 0;
            epoch++;
        }
    }
    free(seconds);
    free(seen);
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

static void test_each_sample_once_per_epoch(void **state)
{
    (void)state;
    const int rank_counts[] = {1, 2, 3, 7, 16, 64};
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 6; k++)
            run_epochs_and_check(all_strategies[s], 17 + 31 * (uint64_t)k + (uint64_t)s, rank_counts[k], 300 + 97 * k, 3);
}

static void test_more_ranks_than_samples(void **state)
{
    (void)state;
    for (int s = 0; s < 3; s++) run_epochs_and_check(all_strategies[s], 5, 50, 20, 2);
}

/* The assignments of `n_steps` steps as one list of (step, epoch, rank, micro, id) numbers. */
static int64_t *record_steps(balancer *b, int n_ranks, int n_steps, int64_t *n_values)
{
    size_t capacity = 1024, used = 0;
    int64_t *values = malloc(capacity * sizeof(int64_t));
    balance_assignment a = {0};
    double *seconds = malloc((size_t)n_ranks * sizeof(double));
    for (int t = 0; t < n_steps; t++) {
        balancer_next(b, &a);
        for (int r = 0; r < n_ranks; r++) {
            seconds[r] = a.predicted_seconds[r] * (1.2 + 0.01 * r);
            for (int m = a.rank_micro_start[r]; m < a.rank_micro_start[r + 1]; m++)
                for (int64_t k = a.micro_start[m]; k < a.micro_start[m + 1]; k++) {
                    if (used + 6 > capacity) { capacity *= 2; values = realloc(values, capacity * sizeof(int64_t)); }
                    int64_t record[6] = {a.step, a.epoch, r, m, a.ids[k], a.micro_group[m]};
                    memcpy(values + used, record, sizeof(record));
                    used += 6;
                }
        }
        balancer_observe(b, seconds);
    }
    free(seconds);
    balance_assignment_free(&a);
    *n_values = (int64_t)used;
    return values;
}

static void test_same_seed_same_assignments(void **state)
{
    (void)state;
    for (int s = 0; s < 3; s++) {
        deck config = test_deck(all_strategies[s], 77);
        balance_sample *samples = random_samples(3, 500, 5000);
        double budget = mem_of(&config, 9000);
        balancer *b1 = balancer_create(&config, samples, 500, 5, budget, NULL);
        balancer *b2 = balancer_create(&config, samples, 500, 5, budget, NULL);
        config.run.seed = 78;
        balancer *b3 = balancer_create(&config, samples, 500, 5, budget, NULL);
        int64_t n1, n2, n3;
        int64_t *v1 = record_steps(b1, 5, 40, &n1), *v2 = record_steps(b2, 5, 40, &n2), *v3 = record_steps(b3, 5, 40, &n3);
        assert_int_equal(n1, n2);
        assert_memory_equal(v1, v2, (size_t)n1 * sizeof(int64_t));
        assert_true(n1 != n3 || memcmp(v1, v3, (size_t)n1 * sizeof(int64_t)) != 0);
        free(v1); free(v2); free(v3);
        balancer_free(b1); balancer_free(b2); balancer_free(b3);
        free(samples);
    }
}

static void test_epoch_orders_differ(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 9);
    config.balance.global_batch = 1;   /* one sample per step: the order itself */
    balance_sample *samples = random_samples(4, 200, 3000);
    balancer *b = balancer_create(&config, samples, 200, 1, mem_of(&config, 9000), NULL);
    int64_t order[2][200];
    balance_assignment a = {0};
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 200; i++) {
            balancer_next(b, &a);
            assert_int_equal(a.epoch, e);
            assert_int_equal(a.global_samples, 1);
            order[e][i] = a.ids[0];
        }
    assert_true(memcmp(order[0], order[1], sizeof(order[0])) != 0);
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

/* Mark each sample of an assignment once in `seen`: a grouped sample (in every member's list) at its group's base. */
static void count_once(const balance_assignment *a, int *seen)
{
    for (int r = 0; r < a->n_ranks; r++)
        for (int m = a->rank_micro_start[r]; m < a->rank_micro_start[r + 1]; m++)
            if (r % a->micro_group[m] == 0)
                for (int64_t k = a->micro_start[m]; k < a->micro_start[m + 1]; k++) seen[a->indices[k]]++;
}

static void check_resume_sp(deck_strategy strategy, int64_t global_batch, int steps_before, int ranks_after, int sp)
{
    deck config = test_deck(strategy, 123);
    config.balance.global_batch = global_batch;
    config.balance.sp = sp;
    const int n_ranks = 4;
    balance_sample *samples = random_samples(8, 700, 6000);
    double budget = mem_of(&config, 9000);
    balancer *original = balancer_create(&config, samples, 700, n_ranks, budget, NULL);
    int64_t n_before;
    free(record_steps(original, n_ranks, steps_before, &n_before));
    size_t n_bytes = balancer_state_bytes(original);
    void *buffer = malloc(n_bytes);
    balancer_save_state(original, buffer);
    balancer *resumed = balancer_create(&config, samples, 700, ranks_after, budget, NULL);
    assert_int_equal(balancer_load_state(resumed, buffer, n_bytes), 0);
    if (ranks_after == n_ranks) {
        int64_t n1, n2;
        int64_t *continued = record_steps(original, n_ranks, 60, &n1), *after = record_steps(resumed, n_ranks, 60, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(continued, after, (size_t)n1 * sizeof(int64_t));
        free(continued); free(after);
    } else {
        /* another rank count: the same samples in the rest of the epoch */
        balance_assignment a = {0}, c = {0};
        int *seen_original = calloc(700, sizeof(int)), *seen_resumed = calloc(700, sizeof(int));
        int64_t epoch = -1;
        for (int t = 0; t < 400; t++) {
            balancer_next(original, &a);
            if (epoch < 0) epoch = a.epoch;
            if (a.epoch != epoch) break;
            count_once(&a, seen_original);
        }
        for (int t = 0; t < 400; t++) {
            balancer_next(resumed, &c);
            if (c.epoch != epoch) break;
            count_once(&c, seen_resumed);
        }
        assert_memory_equal(seen_original, seen_resumed, 700 * sizeof(int));
        free(seen_original); free(seen_resumed);
        balance_assignment_free(&a); balance_assignment_free(&c);
    }
    free(buffer);
    balancer_free(original);
    balancer_free(resumed);
    free(samples);
}

static void check_resume(deck_strategy strategy, int64_t global_batch, int steps_before, int ranks_after)
{
    check_resume_sp(strategy, global_batch, steps_before, ranks_after, 1);
}

static void test_resume_mid_epoch(void **state)
{
    (void)state;
    for (int s = 0; s < 3; s++) check_resume(all_strategies[s], 0, 7, 4);
    check_resume(STRATEGY_GLOBAL, 37, 11, 4);
}

static void test_resume_other_rank_count(void **state)
{
    (void)state;
    check_resume(STRATEGY_GLOBAL, 0, 5, 6);
    check_resume(STRATEGY_EQUAL_TOKENS, 0, 5, 3);
}

/* A version-1 state (five cost features, before the attention split) from version 3's bytes: the version word, no sp
   word, five coefficients, an empty refit window, five features per pending rank. */
static size_t to_version_one(const unsigned char *v2, size_t n_bytes, int n_ranks, unsigned char *v1)
{
    size_t in = 0, out = 0;
#define COPY_WORDS(n) do { memcpy(v1 + out, v2 + in, 8 * (size_t)(n)); in += 8 * (size_t)(n); out += 8 * (size_t)(n); } while (0)
    int64_t word;
    COPY_WORDS(1);                                  /* magic */
    word = 1, memcpy(v1 + out, &word, 8), in += 8, out += 8;
    COPY_WORDS(4);                                  /* strategy, samples, hash, seed */
    in += 8;                                        /* sp (version 3) */
    COPY_WORDS(5);                                  /* ranks ... next_batch */
    int64_t pool_count;
    memcpy(&pool_count, v2 + in, 8);
    COPY_WORDS(1 + pool_count);
    COPY_WORDS(5);                                  /* coefficients: the sixth dropped */
    in += 8;
    COPY_WORDS(2);                                  /* error estimates */
    int64_t n_window;
    memcpy(&n_window, v2 + in, 8);
    in += 8 * (size_t)(1 + n_window);
    const int64_t one = 1;
    const double no_steps = 0.0;
    memcpy(v1 + out, &one, 8), memcpy(v1 + out + 8, &no_steps, 8), out += 16;
    int64_t pending_count;
    memcpy(&pending_count, v2 + in, 8);
    COPY_WORDS(1);
    for (int64_t k = 0; k < pending_count * n_ranks; k++) {
        COPY_WORDS(5);                              /* features: the sixth dropped */
        in += 8;
        COPY_WORDS(1);                              /* the squared cost */
    }
#undef COPY_WORDS
    assert_int_equal(in, n_bytes);
    return out;
}

/* A checkpoint of the version before the attention split resumes: the same coefficients (c' takes c's), the same
   next assignments; a truncated one is still refused. */
static void test_version_one_state_resumes(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 5);
    balance_sample *samples = random_samples(3, 400, 6000);
    const double budget = mem_of(&config, 9000);
    balancer *original = balancer_create(&config, samples, 400, 3, budget, NULL);
    int64_t n_values;
    free(record_steps(original, 3, 6, &n_values));
    const size_t n_bytes = balancer_state_bytes(original);
    unsigned char *v2 = malloc(n_bytes), *v1 = malloc(n_bytes);
    balancer_save_state(original, v2);
    const size_t n_v1 = to_version_one(v2, n_bytes, 3, v1);
    balancer *resumed = balancer_create(&config, samples, 400, 3, budget, NULL);
    assert_int_not_equal(balancer_load_state(resumed, v1, n_v1 - 8), 0);
    assert_int_equal(balancer_load_state(resumed, v1, n_v1), 0);
    const cost_model *was = balancer_cost_model(original), *now = balancer_cost_model(resumed);
    for (int j = 0; j < 5; j++) assert_true(now->coef[j] == was->coef[j]);
    assert_true(now->coef[5] == was->coef[2]);
    balance_assignment a = {0}, c = {0};
    balancer_next(original, &a);
    balancer_next(resumed, &c);
    assert_int_equal(a.global_samples, c.global_samples);
    assert_memory_equal(a.ids, c.ids, (size_t)a.global_samples * sizeof(int64_t));
    balance_assignment_free(&a);
    balance_assignment_free(&c);
    free(v1);
    free(v2);
    balancer_free(original);
    balancer_free(resumed);
    free(samples);
}

static void test_state_rejects_other_runs(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 1);
    balance_sample *samples = random_samples(2, 300, 4000);
    double budget = mem_of(&config, 9000);
    balancer *b = balancer_create(&config, samples, 300, 2, budget, NULL);
    balance_assignment a = {0};
    balancer_next(b, &a);
    size_t n_bytes = balancer_state_bytes(b);
    unsigned char *buffer = malloc(n_bytes);
    balancer_save_state(b, buffer);
    assert_int_not_equal(balancer_load_state(b, buffer, n_bytes - 8), 0);       /* truncated */
    samples[5].tokens += 1;                                                       /* another store */
    balancer *other = balancer_create(&config, samples, 300, 2, budget, NULL);
    assert_int_not_equal(balancer_load_state(other, buffer, n_bytes), 0);
    samples[5].tokens -= 1;
    config.run.seed = 2;                                                          /* another seed */
    balancer *reseeded = balancer_create(&config, samples, 300, 2, budget, NULL);
    assert_int_not_equal(balancer_load_state(reseeded, buffer, n_bytes), 0);
    buffer[0] ^= 0xff;                                                            /* not a state */
    assert_int_not_equal(balancer_load_state(b, buffer, n_bytes), 0);
    free(buffer);
    balance_assignment_free(&a);
    balancer_free(b); balancer_free(other); balancer_free(reseeded);
    free(samples);
}

/* ---- sequence-parallel groups ---------------------------------------------------------------------------- */

/* Micro-batch m's place among rank r's micro-batches of the same group (same k, same base). */
static int group_position(const balance_assignment *a, int r, int m)
{
    int position = 0;
    for (int n = a->rank_micro_start[r]; n < m; n++) position += a->micro_group[n] == a->micro_group[m];
    return position;
}

/* A step with groups: every micro-batch's group is a power of two, aligned, within the ranks, and appears with the same
   ids in every member's list; each rank lists its grouped micro-batches first, k descending, then base; micro-batches
   fit the memory budget (a grouped one by its split memory); global_samples counts each sample once. Marks `seen`. */
static void check_group_assignment(const balance_assignment *a, const balance_sample *samples, double mem_budget,
                                   const cost_model *cm, int *seen)
{
    int64_t once = 0;
    for (int r = 0; r < a->n_ranks; r++) {
        int last_k = 1 << 30, last_base = -1, in_prefix = 1;
        for (int m = a->rank_micro_start[r]; m < a->rank_micro_start[r + 1]; m++) {
            const int k = a->micro_group[m], base = r - r % k;
            assert_true(k >= 1 && (k & (k - 1)) == 0 && base + k <= a->n_ranks);
            double bytes = 0;
            for (int64_t i = a->micro_start[m]; i < a->micro_start[m + 1]; i++)
                bytes += cost_model_mem_split(cm, samples[a->indices[i]].tokens, samples[a->indices[i]].text_len, k);
            assert_true(bytes <= mem_budget);
            if (k == 1) { in_prefix = 0; continue; }
            assert_true(in_prefix);                                   /* grouped first */
            assert_true(k < last_k || (k == last_k && base >= last_base));
            last_k = k, last_base = base;
            /* the same micro-batch, at the same place among its group's, in every member's list */
            const int position = group_position(a, r, m);
            for (int member = base; member < base + k; member++) {
                int found = -1;
                for (int n = a->rank_micro_start[member]; n < a->rank_micro_start[member + 1] && found < 0; n++)
                    if (a->micro_group[n] == k && a->micro_start[n + 1] - a->micro_start[n] == a->micro_start[m + 1] - a->micro_start[m] &&
                        memcmp(a->ids + a->micro_start[n], a->ids + a->micro_start[m],
                               (size_t)(a->micro_start[m + 1] - a->micro_start[m]) * sizeof(int64_t)) == 0)
                        found = n;
                assert_true(found >= 0);
                assert_int_equal(group_position(a, member, found), position);
            }
        }
    }
    for (int r = 0; r < a->n_ranks; r++)
        for (int m = a->rank_micro_start[r]; m < a->rank_micro_start[r + 1]; m++)
            if (r % a->micro_group[m] == 0) once += a->micro_start[m + 1] - a->micro_start[m];
    assert_int_equal(once, a->global_samples);
    count_once(a, seen);
}

/* The group sizes of one step's samples by sample index (0: not in the step). */
static void groups_of_step(const balance_assignment *a, int *group_of, int64_t n_samples)
{
    memset(group_of, 0, (size_t)n_samples * sizeof(int));
    for (int r = 0; r < a->n_ranks; r++)
        for (int m = a->rank_micro_start[r]; m < a->rank_micro_start[r + 1]; m++)
            for (int64_t i = a->micro_start[m]; i < a->micro_start[m + 1]; i++) group_of[a->indices[i]] = a->micro_group[m];
}

/* The largest group: powers of two dividing the heads and the node, at most sp and the ranks; 1 when off or not global. */
static void test_sp_limit(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 1);   /* 12 heads */
    assert_int_equal(balance_sp_limit(&config, 64), 1);          /* default: off */
    config.balance.sp = 0;
    assert_int_equal(balance_sp_limit(&config, 64), 4);          /* auto: 12 heads take 4 */
    assert_int_equal(balance_sp_limit(&config, 2), 2);
    assert_int_equal(balance_sp_limit(&config, 1), 1);
    config.balance.ranks_per_node = 2;
    assert_int_equal(balance_sp_limit(&config, 64), 2);
    config.balance.ranks_per_node = 6;
    assert_int_equal(balance_sp_limit(&config, 64), 2);
    config.balance.ranks_per_node = 0;
    config.model.num_heads = 40;
    config.model.dim = 5120;
    assert_int_equal(balance_sp_limit(&config, 64), 8);
    config.balance.sp = 2;
    assert_int_equal(balance_sp_limit(&config, 64), 2);
    config.balance.sp = 0;
    config.balance.strategy = STRATEGY_EQUAL_TOKENS;
    assert_int_equal(balance_sp_limit(&config, 64), 1);
}

/* One long sample among short ones on 8 ranks, the batch's mean work between its cost / 4 and / 2 (with the exchange):
   it runs on an aligned group of 4, the short ones alone; the group's four lists hold it first. */
static void test_group_for_a_costly_sample(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 3);
    config.balance.sp = 0;
    cost_model cm;
    cost_model_init(&cm, &config);
    const double long_cost = cost_model_predict(&cm, 60000, 512), short_cost = cost_model_predict(&cm, 1024, 512);
    /* mean = 3/8 of the long cost: within cost_4 (about 1/4), not cost_2 (about 1/2) */
    const int64_t n_short = (int64_t)(2.0 * long_cost / short_cost);
    const int64_t n = n_short + 1;
    balance_sample *samples = malloc((size_t)n * sizeof(*samples));
    for (int64_t i = 0; i < n; i++) samples[i] = (balance_sample){.id = 500 + i, .tokens = i == 7 ? 60000 : 1024, .text_len = 512};
    config.balance.global_batch = n;
    const double budget = mem_of(&config, 80000);
    const double mean = (long_cost + (double)n_short * short_cost) / 8;
    assert_true(cost_model_predict_split(&cm, 60000, 512, 4) <= mean && cost_model_predict_split(&cm, 60000, 512, 2) > mean);
    balancer *b = balancer_create(&config, samples, n, 8, budget, NULL);
    assert_int_equal(balancer_sp_max(b), 4);
    balance_assignment a = {0};
    balancer_next(b, &a);
    assert_int_equal(a.global_samples, n);
    int *seen = calloc((size_t)n, sizeof(int)), *group_of = malloc((size_t)n * sizeof(int));
    check_group_assignment(&a, samples, budget, &cm, seen);
    for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
    groups_of_step(&a, group_of, n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(group_of[i], i == 7 ? 4 : 1);
    int members = 0;
    for (int r = 0; r < 8; r++)
        if (a.ids[a.rank_start[r]] == 507) {
            members++;
            assert_int_equal(a.micro_group[a.rank_micro_start[r]], 4);
            assert_int_equal(a.micro_start[a.rank_micro_start[r] + 1] - a.micro_start[a.rank_micro_start[r]], 1);
        }
    assert_int_equal(members, 4);
    assert_int_equal(a.rank_start[8], n + 3);
    assert_true(balancer_sp_last_raise(b) == 0.0);
    /* the same step with groups off: one rank carries the long sample, every micro-batch alone */
    config.balance.sp = 1;
    balancer *off = balancer_create(&config, samples, n, 8, budget, NULL);
    balance_assignment o = {0};
    balancer_next(off, &o);
    for (int m = 0; m < o.rank_micro_start[8]; m++) assert_int_equal(o.micro_group[m], 1);
    assert_int_equal(o.rank_start[8], n);
    balance_assignment_free(&a); balance_assignment_free(&o);
    balancer_free(b); balancer_free(off);
    cost_model_free(&cm);
    free(seen); free(group_of); free(samples);
}

/* Memory decides: a sample over one rank's memory budget but cheap against the step's work gets the smallest group
   whose split fits (2), not refused; with sp off the same sample is refused naming it. Where the heads cap the group
   below what the cost asks, the budget rises and says how much. */
static void test_group_for_memory_and_the_raise(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 4);
    config.balance.sp = 0;
    cost_model cm;
    cost_model_init(&cm, &config);
    const double budget = mem_of(&config, 30000);
    const int64_t n = 400;
    balance_sample *samples = malloc((size_t)n * sizeof(*samples));
    for (int64_t i = 0; i < n; i++) samples[i] = (balance_sample){.id = i, .tokens = i == 0 ? 50000 : 8000, .text_len = 512};
    config.balance.global_batch = n;
    balancer *b = balancer_create(&config, samples, n, 4, budget, NULL);
    assert_int_equal(balancer_sp_max(b), 4);
    balance_assignment a = {0};
    balancer_next(b, &a);
    int *seen = calloc((size_t)n, sizeof(int)), *group_of = malloc((size_t)n * sizeof(int));
    check_group_assignment(&a, samples, budget, &cm, seen);
    groups_of_step(&a, group_of, n);
    assert_int_equal(group_of[0], 2);
    for (int64_t i = 1; i < n; i++) assert_int_equal(group_of[i], 1);
    assert_true(balancer_sp_last_raise(b) == 0.0);
    config.balance.sp = 1;
    char *text = NULL;
    size_t size = 0;
    FILE *errors = open_memstream(&text, &size);
    assert_null(balancer_create_checked(&config, samples, n, 4, budget, NULL, errors));
    fclose(errors);
    assert_non_null(strstr(text, "sample 0: 50000 tokens"));
    assert_non_null(strstr(text, "sp = auto"));
    free(text);
    /* 16 ranks, 12 heads: groups of at most 4; a batch of one long and few short samples asks for more */
    config.balance.sp = 0;
    config.balance.global_batch = 9;
    balancer *capped = balancer_create(&config, samples, 9, 16, budget, NULL);
    assert_int_equal(balancer_sp_max(capped), 4);
    balancer_next(capped, &a);
    groups_of_step(&a, group_of, n);
    assert_int_equal(group_of[0], 4);
    const double mean = (cost_model_predict(&cm, 50000, 512) + 8 * cost_model_predict(&cm, 8000, 512)) / 16;
    const double expected = cost_model_predict_split(&cm, 50000, 512, 4) / mean - 1.0;
    assert_true(expected > 0.1);
    assert_true(fabs(balancer_sp_last_raise(capped) - expected) < 1e-9);
    assert_int_equal(balancer_sp_raised_steps(capped), 1);
    balance_assignment_free(&a);
    balancer_free(b); balancer_free(capped);
    cost_model_free(&cm);
    free(seen); free(group_of); free(samples);
}

/* Epochs with groups (random samples, long ones among them): every sample once per epoch, every step's groups well
   formed (nested ones among them), at several rank counts, with a fixed batch and in budget mode. */
static void test_groups_over_epochs(void **state)
{
    (void)state;
    const int rank_counts[] = {2, 3, 8, 16};
    for (int c = 0; c < 4; c++)
        for (int fixed = 0; fixed < 2; fixed++) {
            deck config = test_deck(STRATEGY_GLOBAL, 40 + (uint64_t)c);
            config.balance.sp = 0;
            config.model.num_heads = 16;
            config.model.dim = 1536;
            config.balance.global_batch = fixed ? 50 : 0;
            const int64_t n = 600, n_ranks = rank_counts[c];
            balance_sample *samples = random_samples(70 + (uint64_t)c, n, 40000);
            samples[0].tokens = samples[1].tokens = 39000;   /* over one rank's memory budget */
            cost_model cm;
            cost_model_init(&cm, &config);
            const double budget = mem_of(&config, 30000);
            balancer *b = balancer_create(&config, samples, n, (int)n_ranks, budget, NULL);
            int *seen = calloc((size_t)n, sizeof(int));
            balance_assignment a = {0};
            int64_t in_epoch = 0;
            int epochs = 0, max_group = 1;
            double *seconds = malloc((size_t)n_ranks * sizeof(double));
            while (epochs < 2) {
                balancer_next(b, &a);
                check_group_assignment(&a, samples, budget, &cm, seen);
                for (int m = 0; m < a.rank_micro_start[n_ranks]; m++) if (a.micro_group[m] > max_group) max_group = a.micro_group[m];
                for (int r = 0; r < n_ranks; r++) seconds[r] = a.predicted_seconds[r];
                balancer_observe(b, seconds);
                in_epoch += a.global_samples;
                if (in_epoch == n) {
                    for (int64_t i = 0; i < n; i++) assert_int_equal(seen[i], 1);
                    memset(seen, 0, (size_t)n * sizeof(int));
                    in_epoch = 0;
                    epochs++;
                }
            }
            assert_true(max_group >= 2);   /* two samples are over 30000 tokens' memory */
            free(seconds); free(seen);
            balance_assignment_free(&a);
            balancer_free(b);
            cost_model_free(&cm);
            free(samples);
        }
}

/* Resume with groups: the same future at the same rank count, the same rest of the epoch at another; a state of
   another sp, or a version-2 state (before groups) into a balancer with groups, is refused. */
static void test_groups_resume(void **state)
{
    (void)state;
    check_resume_sp(STRATEGY_GLOBAL, 37, 9, 4, 0);
    check_resume_sp(STRATEGY_GLOBAL, 0, 5, 4, 2);
    check_resume_sp(STRATEGY_GLOBAL, 37, 6, 8, 0);
    deck config = test_deck(STRATEGY_GLOBAL, 9);
    config.balance.sp = 0;
    balance_sample *samples = random_samples(9, 300, 6000);
    const double budget = mem_of(&config, 9000);
    balancer *b = balancer_create(&config, samples, 300, 4, budget, NULL);
    const size_t n_bytes = balancer_state_bytes(b);
    unsigned char *buffer = malloc(n_bytes);
    balancer_save_state(b, buffer);
    config.balance.sp = 1;
    balancer *off = balancer_create(&config, samples, 300, 4, budget, NULL);
    assert_int_not_equal(balancer_load_state(off, buffer, n_bytes), 0);
    /* version 2: no sp word; it loads as sp = off */
    unsigned char *v2 = malloc(n_bytes);
    const int64_t two = 2;
    memcpy(v2, buffer, 8);
    memcpy(v2 + 8, &two, 8);
    memcpy(v2 + 16, buffer + 16, 32);                    /* strategy, samples, hash, seed */
    memcpy(v2 + 48, buffer + 56, n_bytes - 56);          /* the sp word dropped */
    assert_int_equal(balancer_load_state(off, v2, n_bytes - 8), 0);
    assert_int_not_equal(balancer_load_state(b, v2, n_bytes - 8), 0);
    free(v2); free(buffer);
    balancer_free(b); balancer_free(off);
    free(samples);
}

static void test_oversize_error_names_sample(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 1);
    balance_sample samples[4] = {{10, 100, 512}, {11, 70000, 512}, {12, 200, 512}, {13, 300, 512}};
    FILE *errors = tmpfile();
    balancer *b = balancer_create_checked(&config, samples, 4, 2, mem_of(&config, 20000), NULL, errors);
    assert_null(b);
    char text[2048] = {0};
    rewind(errors);
    size_t n_read = fread(text, 1, sizeof(text) - 1, errors);
    fclose(errors);
    assert_true(n_read > 0);
    assert_non_null(strstr(text, "sample 11: 70000 tokens"));
    assert_non_null(strstr(text, "memory budget"));
    assert_non_null(strstr(text, "oversize = skip"));
}

static void test_oversize_skip(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 1);
    config.balance.oversize = OVERSIZE_SKIP;
    balance_sample samples[5] = {{10, 100, 512}, {11, 70000, 512}, {12, 200, 512}, {13, 90000, 512}, {14, 50, 512}};
    balancer *b = balancer_create_checked(&config, samples, 5, 2, mem_of(&config, 20000), NULL, stderr);
    assert_non_null(b);
    assert_int_equal(balancer_skipped(b), 2);
    assert_int_equal(balancer_epoch_samples(b), 3);
    balance_assignment a = {0};
    for (int t = 0; t < 6; t++) {
        balancer_next(b, &a);
        for (int64_t k = 0; k < a.global_samples; k++) assert_true(a.ids[k] != 11 && a.ids[k] != 13);
    }
    balance_assignment_free(&a);
    balancer_free(b);
}

static void test_global_fixed_batch(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 5);
    config.balance.global_batch = 64;
    balance_sample *samples = random_samples(6, 1000, 6000);
    balancer *b = balancer_create(&config, samples, 1000, 3, mem_of(&config, 9000), NULL);
    balance_assignment a = {0};
    int64_t total = 0;
    for (int t = 0; t < 16; t++) {   /* 15 full steps and the epoch's last 40 */
        balancer_next(b, &a);
        assert_int_equal(a.epoch, 0);
        assert_int_equal(a.global_samples, t < 15 ? 64 : 40);
        total += a.global_samples;
    }
    assert_int_equal(total, 1000);
    balancer_next(b, &a);
    assert_int_equal(a.epoch, 1);
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

/* global_tokens: each step takes the oldest samples whose tokens stay within it (the next would pass it, but at an
   epoch's end); each sample once per epoch; with groups as without. */
static void test_global_tokens(void **state)
{
    (void)state;
    for (int sp = 1; sp >= 0; sp--) {
        deck config = test_deck(STRATEGY_GLOBAL, 8);
        config.balance.global_tokens = 40000;
        config.balance.sp = sp;
        balance_sample *samples = random_samples(12, 500, 6000);
        balancer *b = balancer_create(&config, samples, 500, 4, mem_of(&config, 9000), NULL);
        balance_assignment a = {0};
        int *seen = calloc(500, sizeof(int));
        int64_t total = 0;
        while (total < 500) {
            balancer_next(b, &a);
            assert_int_equal(a.epoch, 0);
            int *step_seen = calloc(500, sizeof(int));
            count_once(&a, step_seen);
            int64_t tokens = 0, n = 0;
            for (int i = 0; i < 500; i++) if (step_seen[i]) { tokens += samples[i].tokens; n++; seen[i] += step_seen[i]; }
            assert_int_equal(n, a.global_samples);
            assert_true(tokens <= 40000);
            total += n;
            if (total < 500) assert_true(tokens > 40000 - 6016);   /* the next sample (at most 6015 tokens) did not fit */
            free(step_seen);
        }
        for (int i = 0; i < 500; i++) assert_int_equal(seen[i], 1);
        balancer_next(b, &a);
        assert_int_equal(a.epoch, 1);
        free(seen);
        balance_assignment_free(&a);
        balancer_free(b);
        free(samples);
    }
}

/* The step times of a device on which each sample takes its predicted cost times (1 + u), u fixed per
   sample and uniform in [-0.1, 0.1]: the balancer then plans for a measured per-sample error. */
static void noisy_seconds(const balance_assignment *a, const cost_model *cm, const balance_sample *samples, double *seconds)
{
    for (int r = 0; r < a->n_ranks; r++) {
        seconds[r] = 0;
        for (int64_t k = a->rank_start[r]; k < a->rank_start[r + 1]; k++) {
            uint64_t state = rng_key(42, (uint64_t)a->indices[k], 0);
            const balance_sample *sample = &samples[a->indices[k]];
            const double error = 0.2 * (rng_uniform(&state) - 0.5);
            seconds[r] += cost_model_predict(cm, sample->tokens, sample->text_len) * (1.0 + error);
        }
    }
}

/* global with a per-sample model error, which the balancer estimates from the step times and plans
   margins for: every sample still comes once per epoch, micro-batches stay under the budget, and a
   balancer resumed mid-epoch continues identically. */
static void test_global_with_noisy_times(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 21);
    config.balance.max_tokens = 76032;
    const int n_ranks = 48, n_samples = 6000;
    balance_sample *samples = random_samples(21, n_samples, 30000);
    const double budget = mem_of(&config, 40000);
    balancer *b = balancer_create(&config, samples, n_samples, n_ranks, budget, NULL), *resumed = NULL;
    cost_model truth;
    cost_model_init(&truth, &config);
    balance_assignment a = {0};
    double *seconds = malloc(n_ranks * sizeof(double));
    int *seen = calloc(n_samples, sizeof(int));
    int64_t in_epoch = 0, epoch = 0, n_recorded = 0;
    int64_t *recorded = malloc(2 * (size_t)n_samples * sizeof(int64_t));
    while (epoch < 2) {
        if (epoch == 1 && in_epoch > n_samples / 3 && !resumed) {   /* save mid-epoch, continue both */
            size_t n_bytes = balancer_state_bytes(b);
            void *buffer = malloc(n_bytes);
            balancer_save_state(b, buffer);
            resumed = balancer_create(&config, samples, n_samples, n_ranks, budget, NULL);
            assert_int_equal(balancer_load_state(resumed, buffer, n_bytes), 0);
            free(buffer);
        }
        balancer_next(b, &a);
        assert_int_equal(check_assignment(&a, samples, n_ranks, budget, balancer_cost_model(b), seen), epoch);
        if (resumed)
            for (int64_t k = 0; k < a.global_samples; k++) recorded[n_recorded++] = a.ids[k];
        noisy_seconds(&a, &truth, samples, seconds);
        balancer_observe(b, seconds);
        in_epoch += a.global_samples;
        if (in_epoch == n_samples) {
            for (int64_t i = 0; i < n_samples; i++) assert_int_equal(seen[i], 1);
            memset(seen, 0, n_samples * sizeof(int));
            in_epoch = 0;
            epoch++;
        }
    }
    assert_non_null(resumed);
    for (int64_t done = 0; done < n_recorded;) {
        balancer_next(resumed, &a);
        assert_memory_equal(a.ids, recorded + done, (size_t)a.global_samples * sizeof(int64_t));
        done += a.global_samples;
        noisy_seconds(&a, &truth, samples, seconds);
        balancer_observe(resumed, seconds);
    }
    free(recorded); free(seen); free(seconds);
    balance_assignment_free(&a);
    cost_model_free(&truth);
    balancer_free(b);
    balancer_free(resumed);
    free(samples);
}

/* A mixed image/video-like set: the global packer balances predicted cost within 2%. */
static void test_global_balances_mixed_lengths(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 11);
    config.balance.recompute = RECOMPUTE_BLOCK;
    config.balance.max_tokens = 76032;
    config.balance.pool = 4096;
    const int32_t shapes[6] = {256, 1024, 2304, 7800, 32760, 76032};
    const double weights[6] = {40, 25, 15, 12, 6, 2};
    uint64_t rng = 5;
    const int64_t n_samples = 20000;
    balance_sample *samples = malloc(n_samples * sizeof(*samples));
    for (int64_t i = 0; i < n_samples; i++) {
        double u = rng_uniform(&rng) * 100, cumulative = 0;
        int k = 0;
        while (k < 5 && (cumulative += weights[k]) < u) k++;
        samples[i] = (balance_sample){i, shapes[k], 512};
    }
    for (int n_ranks = 8; n_ranks <= 64; n_ranks *= 8) {
        balancer *b = balancer_create(&config, samples, n_samples, n_ranks, mem_of(&config, 300000), NULL);
        balance_assignment a = {0};
        double imbalance = 0;
        int64_t steps = 0, seen = 0;
        while (seen < n_samples) {
            balancer_next(b, &a);
            double max = 0, sum = 0;
            for (int r = 0; r < n_ranks; r++) { max = fmax(max, a.predicted_seconds[r]); sum += a.predicted_seconds[r]; }
            imbalance += 1 - sum / n_ranks / max;
            seen += a.global_samples;
            steps++;
        }
        assert_true(imbalance / steps < 0.02);
        balance_assignment_free(&a);
        balancer_free(b);
    }
    free(samples);
}

/* [balance] mem_fill: global's derived budget grows to a micro-batch of the average mix filling that share
   of the memory budget, so steps use the memory (and stay under it); 0 and the setter turn it off. */
static void test_global_fills_memory(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 17);
    config.balance.max_tokens = 76032;
    config.balance.pool = 4096;
    const int32_t shapes[5] = {256, 1024, 7800, 32760, 76032};
    const int64_t n_samples = 4000;
    balance_sample *samples = malloc(n_samples * sizeof(*samples));
    uint64_t rng = 9;
    for (int64_t i = 0; i < n_samples; i++)
        samples[i] = (balance_sample){i, shapes[rng_below(&rng, 5)], 64 + (int32_t)rng_below(&rng, 449)};
    const double mem_budget = mem_of(&config, 600000);
    int64_t steps_of[2] = {0, 0};
    for (int fill = 0; fill < 2; fill++) {
        config.balance.mem_fill = fill ? 0.9 : 0.0;
        balancer *b = balancer_create(&config, samples, n_samples, 4, mem_budget, NULL);
        const cost_model *cm = balancer_cost_model(b);
        cost_features all = {{0}};
        double all_mem = 0.0;
        for (int64_t i = 0; i < n_samples; i++) {
            cost_features_add(cm, &all, samples[i].tokens, samples[i].text_len);
            all_mem += cost_model_mem(cm, samples[i].tokens, samples[i].text_len);
        }
        const double fill_cost = 0.9 * mem_budget * cost_model_predict_features(cm, &all) / all_mem;
        if (fill) {
            assert_true(balancer_compute_budget(b) >= fill_cost * (1 - 1e-12));
            balancer *off = balancer_create(&config, samples, n_samples, 4, mem_budget, NULL);
            balancer_set_mem_fill(off, 0.0);
            assert_true(balancer_compute_budget(off) < fill_cost); /* this mix: the fill decides */
            balancer_free(off);
        } else assert_true(balancer_compute_budget(b) < fill_cost);
        int *seen = calloc((size_t)n_samples, sizeof(int));
        balance_assignment a = {0};
        double peak_sum = 0.0;
        int64_t in_epoch = 0;
        while (in_epoch < n_samples) {
            balancer_next(b, &a);
            check_assignment(&a, samples, 4, mem_budget, cm, seen);
            double peak = 0.0;
            for (int m = 0; m < a.rank_micro_start[4]; m++) {
                double bytes = 0.0;
                for (int64_t k = a.micro_start[m]; k < a.micro_start[m + 1]; k++)
                    bytes += cost_model_mem(cm, samples[a.indices[k]].tokens, samples[a.indices[k]].text_len);
                peak = fmax(peak, bytes);
            }
            in_epoch += a.global_samples;
            if (in_epoch < n_samples) peak_sum += peak / mem_budget, steps_of[fill]++; /* the last step is a rest */
        }
        if (fill) assert_true(peak_sum / steps_of[fill] >= 0.85);
        else assert_true(peak_sum / steps_of[fill] < 0.85);
        free(seen);
        balance_assignment_free(&a);
        balancer_free(b);
    }
    assert_true(steps_of[1] < steps_of[0]);
    free(samples);
}

static void test_equal_tokens_batches(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_EQUAL_TOKENS, 3);
    balance_sample *samples = random_samples(12, 600, 5000);
    balancer *b = balancer_create(&config, samples, 600, 4, mem_of(&config, 9000), NULL);
    balance_assignment a = {0};
    int64_t seen = 0;
    while (seen < 600) {
        balancer_next(b, &a);
        for (int r = 0; r < 4; r++) {
            int64_t first = a.rank_start[r], n = a.rank_start[r + 1] - first;
            if (n == 0) continue;
            int32_t tokens = samples[a.indices[first]].tokens;
            int64_t batch = config.balance.max_tokens / tokens;
            assert_true(n <= (batch > 0 ? batch : 1));
            for (int64_t k = first; k < first + n; k++) assert_int_equal(samples[a.indices[k]].tokens, tokens);
        }
        seen += a.global_samples;
    }
    assert_int_equal(seen, 600);
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

static void test_dual_constraints(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_DUAL, 3);
    balance_sample *samples = random_samples(13, 600, 5000);
    double budget = mem_of(&config, 9000);
    balancer *b = balancer_create(&config, samples, 600, 4, budget, NULL);
    const double p = balancer_dual_p(b);
    assert_true(p >= 1.0 && p <= 2.0);
    const cost_model *cm = balancer_cost_model(b);
    balance_assignment a = {0};
    int64_t seen = 0;
    while (seen < 600) {
        balancer_next(b, &a);
        for (int r = 0; r < 4; r++) {
            int64_t first = a.rank_start[r], n = a.rank_start[r + 1] - first;
            if (n <= 1) continue;
            /* B x S samples of one bucket fit the memory budget at the bucket's longest text: one micro-batch
               (each sample at its own text is no more) */
            assert_int_equal(a.rank_micro_start[r + 1] - a.rank_micro_start[r], 1);
            double bytes = 0;
            for (int64_t k = first; k < first + n; k++)
                bytes += cost_model_mem(cm, samples[a.indices[k]].tokens, samples[a.indices[k]].text_len);
            assert_true(bytes <= budget * 1.0001);
        }
        seen += a.global_samples;
    }
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

static void test_flops_and_attention_share(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);   /* Wan-1.3B dims */
    double gemm, attention;
    cost_model_flops(&config, 32760, 512, &gemm, &attention);
    double share = attention / (gemm + attention);
    assert_true(share > 0.6 && share < 0.8);   /* attention is ~70% of the cost at 32k tokens (docs/balancer.md) */
    /* forward+backward = 3 x forward: a per-token block GEMM count of 3 * 30 * (12 D^2 + 4 D F) */
    double d = 1536, f = 8960, expected_gemm = 3 * 30 * (12 * d * d + 4 * d * f) * 1000;
    double gemm_small;
    cost_model_flops(&config, 1000, 0, &gemm_small, NULL);
    assert_true(fabs(gemm_small / expected_gemm - 1) < 0.01);
    int64_t params = cost_model_param_count(&config);
    assert_true(params > 1200000000 && params < 1600000000);
    cost_model cm;
    cost_model_init(&cm, &config);
    double seconds = cost_model_predict(&cm, 32760, 512);
    double expected = gemm / (config.balance.device_tflops * 1e12) + attention / (config.balance.attention_tflops * 1e12);
    assert_true(fabs(seconds / expected - 1) < 1e-9);
    cost_model_free(&cm);
}

static void test_memory_model(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    config.balance.recompute = RECOMPUTE_NONE;
    double none_1k = mem_of(&config, 1000), none_2k = mem_of(&config, 2000), none_3k = mem_of(&config, 3000);
    assert_true(fabs((none_3k - none_2k) - (none_2k - none_1k)) < 1e-6 * none_3k);   /* linear in S */
    config.balance.recompute = RECOMPUTE_BLOCK;
    double block_75k = mem_of(&config, 75600);
    config.balance.recompute = RECOMPUTE_NONE;
    double none_75k = mem_of(&config, 75600);
    assert_true(block_75k < none_75k / 5);
    assert_true(block_75k < 80.0 * 1073741824.0 - cost_model_state_bytes(&config, SHARD_NONE, 1));   /* fits an 80 GiB GPU */
    assert_true(none_75k > 80.0 * 1073741824.0);                                      /* ... only recomputing */
    cost_model cm;
    cost_model_init(&cm, &config);
    int64_t fit = balancer_max_tokens_in_budget(&cm, none_3k, 512);
    assert_true(fit >= 2999 && fit <= 3000);
    cost_model_free(&cm);
}

/* The cost model's parameter count and memory are the layout table's (model/layout.h): Wan's exact counts,
   the formula's coefficients for the deck's backend, and one rank's state of 18 (GPU) or 16 (CPU) bytes per
   parameter without sharding. */
/* The split form: cost_k = cost / k + exchange_k, exchange_k = 4 all-to-alls per block per pass of (k - 1) / k of a
   rank's S / k tokens of dim values (bf16 on the GPU, fp32 on the CPU; 3 passes with recompute = block) over
   sp_bandwidth; memory of S / k tokens with the text whole. Numbers by hand for Wan-1.3B (30 blocks, dim 1536). */
static void test_split_cost(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 1);
    config.run.device = DEVICE_CUDA;
    cost_model cm;
    cost_model_init(&cm, &config);
    const double per_token = 4.0 * 2 * 30 * 1536 * 2;   /* 737280 bytes */
    assert_true(cm.exchange_bytes_per_token == per_token);
    const double sent = 76032.0 / 4 * 3 / 4;              /* 14256 tokens leave each rank per exchange */
    assert_true(fabs(cost_model_exchange(&cm, 76032, 4) - sent * per_token / 300e9) < 1e-15);
    assert_true(cost_model_exchange(&cm, 76032, 1) == 0.0);
    assert_true(cost_model_predict_split(&cm, 76032, 512, 1) == cost_model_predict(&cm, 76032, 512));
    assert_true(fabs(cost_model_predict_split(&cm, 76032, 512, 4) -
                     (cost_model_predict(&cm, 76032, 512) / 4 + sent * per_token / 300e9)) < 1e-12);
    assert_true(cost_model_mem_split(&cm, 76032, 512, 1) == cost_model_mem(&cm, 76032, 512));
    assert_true(cost_model_mem_split(&cm, 76032, 512, 4) == cost_model_mem(&cm, 19008, 512));
    assert_true(cost_model_mem_split(&cm, 76033, 512, 4) == cost_model_mem(&cm, 19009, 512));
    cost_model_free(&cm);
    config.run.device = DEVICE_CPU;
    config.balance.recompute = config.train.recompute = RECOMPUTE_BLOCK;
    config.balance.sp_bandwidth = 100;
    cost_model_init(&cm, &config);
    assert_true(cm.exchange_bytes_per_token == 4.0 * 3 * 30 * 1536 * 4);
    assert_true(fabs(cost_model_exchange(&cm, 1000, 2) - 250.0 * 4.0 * 3 * 30 * 1536 * 4 / 100e9) < 1e-15);
    cost_model_free(&cm);
}

static void test_memory_is_the_layout_formula(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);   /* Wan-1.3B */
    assert_int_equal(cost_model_param_count(&config), 1418996800);
    const layout_dims dims = layout_dims_of(&config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    for (int device = 0; device < 2; device++) {
        config.run.device = device ? DEVICE_CPU : DEVICE_AUTO;
        const layout_backend backend = device ? LAYOUT_BACKEND_CPU : LAYOUT_BACKEND_GPU;
        for (int block = 0; block < 2; block++) {
            config.balance.recompute = block ? RECOMPUTE_BLOCK : RECOMPUTE_NONE;
            cost_model cm;
            cost_model_init(&cm, &config);
            const layout_memory expected = model_layout_memory(&layout, backend, config.balance.recompute, 0);
            assert_int_equal(cm.backend, backend);
            assert_memory_equal(&cm.memory, &expected, sizeof expected);
            assert_true(cost_model_mem(&cm, 3000, 100) ==
                        (double)(layout_memory_bytes(&expected, 3000, 1, 100) - expected.fixed));
            cost_model_free(&cm);
        }
        const double per_param = device ? 16.0 : 18.0;
        assert_true(cost_model_state_bytes(&config, SHARD_NONE, 1) == per_param * 1418996800.0);
    }
    /* block recomputation keeps less, on the GPU; the CPU model keeps everything either way */
    const layout_memory none = model_layout_memory(&layout, LAYOUT_BACKEND_GPU, RECOMPUTE_NONE, 0);
    const layout_memory block = model_layout_memory(&layout, LAYOUT_BACKEND_GPU, RECOMPUTE_BLOCK, 0);
    assert_true(block.per_token < none.per_token / 5 && block.per_sample == none.per_sample);
    /* Wan-14B */
    config.model.dim = 5120;
    config.model.ffn_dim = 13824;
    config.model.num_heads = 40;
    config.model.num_layers = 40;
    assert_int_equal(cost_model_param_count(&config), 14288491584);
}

/* HunyuanVideo-1.5 at full size (inputs/hunyuanvideo15.ini's dims): the MMDiT family, whose text joins the attention. */
static deck hunyuan_deck(void)
{
    deck config;
    deck_defaults(&config);
    config.model.family = FAMILY_HUNYUANVIDEO15;
    config.model.dim = 2048;
    config.model.ffn_dim = 8192;
    config.model.num_heads = 16;
    config.model.num_layers = 54;
    config.model.in_dim = 65;
    config.model.out_dim = 32;
    config.model.patch_t = config.model.patch_h = config.model.patch_w = 1;
    config.model.text_len = 1000;
    config.model.text_padding = TEXT_PADDING_TRIM;
    config.model.text_dim = 3584;
    config.model.text_2_dim = 1472;
    config.model.image_dim = 1152;
    config.model.qk_norm = 0;
    config.model.cross_attn_norm = 0;
    return config;
}

/* The joint form: a sample of S video tokens and L text tokens costs a + b N + c N^2 + d L^2 + e L with N = S + L,
   its features are (1, N, N^2, L^2, L, 0); the seed is the layout's FLOPs at the deck's rates, counted by hand here:
   per row of either stream and block 2 (4 D^2 + 2 D F) GEMM FLOPs and 4 D N of joint attention, the patch embedding
   and head per video row, the refiner's 2 self-attention layers over the caption (4 D L^2 each). */
static void test_joint_length_cost(void **state)
{
    (void)state;
    deck config = hunyuan_deck();
    cost_model cm;
    cost_model_init(&cm, &config);
    assert_int_equal(cm.joint_text, 1);
    const double D = 2048, F = 8192, layers = 54, gemm_rate = 600e12, attention_rate = 500e12;
    const double *k = cm.coef;
    assert_true(fabs(k[1] / ((3 * layers * 2 * (4 * D * D + 2 * D * F) + 3 * 2 * (65 * D + D * 32)) / gemm_rate) - 1) < 1e-12);
    assert_true(fabs(k[2] / (3 * layers * 4 * D / attention_rate) - 1) < 1e-12);
    assert_true(fabs(k[3] / (3 * 2 * 4 * D / attention_rate) - 1) < 1e-12);
    assert_true(k[0] > 0 && k[4] > 0);   /* the time path per sample; the refiner's GEMMs per text row */
    const int64_t cases[][2] = {{256, 50}, {1590, 1000}, {49290, 377}, {111600, 1000}, {3000, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const double S = (double)cases[i][0], L = (double)cases[i][1], N = S + L;
        const double form = k[0] + k[1] * N + k[2] * N * N + k[3] * L * L + k[4] * L;
        const double predicted = cost_model_predict(&cm, cases[i][0], cases[i][1]);
        assert_true(fabs(predicted / form - 1) < 1e-13);
        double gemm = 0, attention = 0;
        cost_model_flops(&config, cases[i][0], cases[i][1], &gemm, &attention);
        assert_true(fabs(predicted / (gemm / gemm_rate + attention / attention_rate) - 1) < 1e-12);
        cost_features features = {0};
        cost_features_add(&cm, &features, cases[i][0], cases[i][1]);
        const double expected[COST_N_FEATURES] = {1, N, N * N, L * L, L, 0};
        assert_memory_equal(features.value, expected, sizeof expected);
        assert_true(fabs(cost_model_predict_features(&cm, &features) / predicted - 1) < 1e-13);
        assert_true(cost_model_length(&cm, cases[i][0], cases[i][1]) == cases[i][0] + cases[i][1]);
    }
    /* the attention is over the joint length: at a fixed N, moving rows from video to text only adds d L^2 + e L */
    const double moved = cost_model_predict(&cm, 10000, 1000) - cost_model_predict(&cm, 11000, 0);
    assert_true(fabs(moved / (k[3] * 1e6 + k[4] * 1e3) - 1) < 1e-6);
    /* a group of k: the joint cost over k plus the exchange of all N rows */
    assert_true(fabs(cost_model_predict_split(&cm, 111600, 1000, 4) -
                     (cost_model_predict(&cm, 111600, 1000) / 4 + cost_model_exchange(&cm, 112600, 4))) < 1e-12);
    assert_true(cost_model_exchange(&cm, 112600, 4) > cost_model_exchange(&cm, 111600, 4));
    cost_model_free(&cm);
    /* Wan: the length is S alone, and its cross-attention term S L */
    deck_defaults(&config);
    cost_model_init(&cm, &config);
    assert_int_equal(cm.joint_text, 0);
    assert_true(cost_model_length(&cm, 1000, 512) == 1000);
    cost_features features = {0};
    cost_features_add(&cm, &features, 1000, 512);
    const double wan[COST_N_FEATURES] = {1, 1000, 1e6, 512000, 512, 0};
    assert_memory_equal(features.value, wan, sizeof wan);
    cost_model_free(&cm);
}

/* The joint family's memory is the layout's formula on each backend: text rows per_text bytes each (cost_model_mem of L
   text tokens = the layout's at L text rows); a text row holds a block's activations as a video row does (recomputation
   saves the same per row of either stream); at full size with recompute = block the 720p 121-frame video with a
   1,000-token caption is under 80 GiB x 0.9 less the full-sharded state of 64 ranks (the plan's budget is lower: the
   workspace is carved for its largest tokens, text rows and samples at once), and over 8x that without recomputation. */
static void test_joint_memory_counts_text(void **state)
{
    (void)state;
    deck config = hunyuan_deck();
    const layout_dims dims = layout_dims_of(&config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    for (int device = 0; device < 3; device++) {
        config.run.device = device == 0 ? DEVICE_CUDA : device == 1 ? DEVICE_CPU : DEVICE_AUTO;
        /* auto: the family has a GPU model, so the GPU's memory (as for Wan) */
        const layout_backend backend = device == 1 ? LAYOUT_BACKEND_CPU : LAYOUT_BACKEND_GPU;
        for (int block = 0; block < 2; block++) {
            config.balance.recompute = block ? RECOMPUTE_BLOCK : RECOMPUTE_NONE;
            cost_model cm;
            cost_model_init(&cm, &config);
            const layout_memory expected = model_layout_memory(&layout, backend, config.balance.recompute, 0);
            assert_int_equal(cm.backend, backend);
            assert_memory_equal(&cm.memory, &expected, sizeof expected);
            assert_true(expected.per_text > 0);
            assert_true(cost_model_mem(&cm, 5000, 700) ==
                        (double)(layout_memory_bytes(&expected, 5000, 1, 700) - expected.fixed));
            assert_true(cost_model_mem(&cm, 5000, 700) - cost_model_mem(&cm, 5000, 0) == 700.0 * (double)expected.per_text);
            assert_true(cost_model_mem_split(&cm, 40000, 700, 4) == cost_model_mem(&cm, 10000, 700));
            cost_model_free(&cm);
        }
    }
    const layout_memory none = model_layout_memory(&layout, LAYOUT_BACKEND_GPU, RECOMPUTE_NONE, 0);
    const layout_memory block = model_layout_memory(&layout, LAYOUT_BACKEND_GPU, RECOMPUTE_BLOCK, 0);
    assert_true(none.per_token - block.per_token == none.per_text - block.per_text);
    /* 53 blocks' sets of the GPU model's (cuda/mmdit_gpu.cu): a stream's 8 [., D] and 2 [., F] bf16, 4 statistics and
       2 [., H] fp32, and per joint row q, k, v, output bf16 and the log-sum-exp */
    assert_true(none.per_token - block.per_token ==
                53 * (8 * 2 * 2048 + 2 * 2 * 8192 + 4 * 4 + 2 * 4 * 16 + 4 * 2 * 2048 + 4 * 16));
    const double gib = 1073741824.0;
    config.run.device = DEVICE_CUDA;
    config.balance.recompute = RECOMPUTE_BLOCK;
    cost_model cm;
    cost_model_init(&cm, &config);
    const double budget = 80 * gib * 0.9 - cost_model_state_bytes(&config, SHARD_FULL, 64);
    const double with_recompute = cost_model_mem(&cm, 111600, 1000);
    assert_true(with_recompute < budget);
    cost_model_free(&cm);
    config.balance.recompute = RECOMPUTE_NONE;
    cost_model_init(&cm, &config);
    assert_true(cost_model_mem(&cm, 111600, 1000) > 8 * with_recompute);   /* every block's activations kept */
    cost_model_free(&cm);
}

/* Start-up calibration in the joint form: timings of micro-batches of mixed video lengths and caption lengths from a
   device unlike the seed (a fixed cost per sample, slower GEMMs, faster attention, a dearer text path) make the
   balancer predict that device for lengths it did not time. */
static void test_joint_calibration(void **state)
{
    (void)state;
    deck config = hunyuan_deck();
    config.run.device = DEVICE_CUDA;
    config.balance.recompute = config.train.recompute = RECOMPUTE_BLOCK;
    balance_sample samples[64];
    for (int i = 0; i < 64; i++) samples[i] = (balance_sample){.id = i, .tokens = 256 + 900 * i, .text_len = 50 + 15 * i};
    balancer *b = balancer_create(&config, samples, 64, 2, 60.0 * 1073741824.0, NULL);
    const double *seed = balancer_cost_model(b)->coef;
    const double truth[COST_N_FEATURES] = {5e-3, 2.0 * seed[1], 0.6 * seed[2], seed[3], 3.0 * seed[4], 0};
    enum { n_shapes = 20 };
    cost_features features[n_shapes] = {0};
    double seconds[n_shapes];
    for (int i = 0; i < n_shapes; i++) {
        const int copies = 1 + i % 3;
        for (int c = 0; c < copies; c++)
            cost_features_add(balancer_cost_model(b), &features[i], 256 + 2900 * i, i % 2 ? 1000 : 50 + 40 * i);
        seconds[i] = 0;
        for (int j = 0; j < COST_N_FEATURES; j++) seconds[i] += truth[j] * features[i].value[j];
    }
    assert_int_equal(balancer_calibrate(b, n_shapes, features, seconds), 1);
    const cost_model *cm = balancer_cost_model(b);
    for (int64_t tokens = 500; tokens <= 60000; tokens += 7000)
        for (int64_t text = 60; text <= 1000; text += 310) {
            const double n = (double)(tokens + text), l = (double)text;
            const double want = truth[0] + n * (truth[1] + truth[2] * n) + l * (truth[3] * l + truth[4]);
            assert_true(fabs(cost_model_predict(cm, tokens, text) / want - 1) < 0.02);
        }
    balancer_free(b);
}

/* The online refit in the joint form: steps measured at 1.5x the seed make the balancer predict 1.5x, for samples
   whose captions vary as the steps' did. */
static void test_joint_online_refit(void **state)
{
    (void)state;
    deck config = hunyuan_deck();
    config.balance.strategy = STRATEGY_GLOBAL;
    config.balance.pool = 256;
    balance_sample *samples = random_samples(31, 2000, 20000);
    balancer *b = balancer_create(&config, samples, 2000, 4, 1e12, NULL);
    const double seed_prediction = cost_model_predict(balancer_cost_model(b), 9000, 300);
    cost_model truth;
    cost_model_init(&truth, &config);
    balance_assignment a = {0};
    double seconds[4];
    for (int t = 0; t < 12; t++) {
        balancer_next(b, &a);
        for (int r = 0; r < 4; r++) {
            seconds[r] = 0;
            for (int64_t k = a.rank_start[r]; k < a.rank_start[r + 1]; k++) {
                const balance_sample *sample = &samples[a.indices[k]];
                seconds[r] += 1.5 * cost_model_predict(&truth, sample->tokens, sample->text_len);
            }
        }
        balancer_observe(b, seconds);
    }
    assert_true(fabs(cost_model_predict(balancer_cost_model(b), 9000, 300) / (1.5 * seed_prediction) - 1) < 0.02);
    cost_model_free(&truth);
    balance_assignment_free(&a);
    balancer_free(b);
    free(samples);
}

static void test_nnls_clamps_negative(void **state)
{
    (void)state;
    /* unconstrained solution of A x = b is (2, -1): NNLS gives x2 = 0, x1 = b1 / a11 */
    const double a[4] = {2, 1, 1, 2};
    const double b[2] = {3, 0};
    double x[2];
    cost_nnls_normal(2, a, b, x);
    assert_true(fabs(x[0] - 1.5) < 1e-12);
    assert_true(x[1] == 0);
    const double b_positive[2] = {4, 5};   /* (1, 2) */
    cost_nnls_normal(2, a, b_positive, x);
    assert_true(fabs(x[0] - 1) < 1e-12 && fabs(x[1] - 2) < 1e-12);
}

/* Steps of synthetic rank observations from true coefficients, with relative noise and stragglers. */
static void observe_synthetic(cost_model *cm, const double *true_coef, int n_steps, int n_ranks, double noise,
                              double straggler_fraction, uint64_t seed)
{
    uint64_t rng = seed;
    cost_features *features = malloc((size_t)n_ranks * sizeof(*features));
    double *seconds = malloc((size_t)n_ranks * sizeof(double));
    for (int t = 0; t < n_steps; t++) {
        for (int r = 0; r < n_ranks; r++) {
            memset(&features[r], 0, sizeof(features[r]));
            /* image-only ranks and video ranks: token counts log-uniform in [256, 40000) per rank */
            int n = 1 + (int)(rng_next_u64(&rng) % 12);
            double log_tokens = log(256.0) + rng_uniform(&rng) * log(40000.0 / 256.0);
            for (int i = 0; i < n; i++) {
                int64_t tokens = (int64_t)exp(log_tokens + 0.3 * rng_uniform(&rng));
                int64_t text = 32 + (int64_t)(rng_next_u64(&rng) % 480);
                cost_features_add(cm, &features[r], tokens, text);
            }
            double truth = 0;
            for (int j = 0; j < COST_N_FEATURES; j++) truth += true_coef[j] * features[r].value[j];
            seconds[r] = truth * (1 + noise * (2 * rng_uniform(&rng) - 1));
            if (rng_uniform(&rng) < straggler_fraction) seconds[r] *= 3;
        }
        cost_model_observe_step(cm, n_ranks, features, seconds);
        cost_model_refit(cm);   /* as the balancer does after every observed step */
    }
    free(features);
    free(seconds);
}

static void check_refit(double noise, double straggler_fraction, double tolerance)
{
    deck config;
    deck_defaults(&config);
    config.balance.calibrate_window = 40;
    cost_model cm;
    cost_model_init(&cm, &config);
    double truth[COST_N_FEATURES];
    const double factor[COST_N_FEATURES] = {1.5, 0.8, 1.3, 1.1, 0.7};
    for (int j = 0; j < COST_N_FEATURES; j++) truth[j] = cm.seed_coef[j] * factor[j];
    truth[0] += 0.002;   /* a per-sample overhead the FLOPs do not see (2 ms) */
    observe_synthetic(&cm, truth, 60, 16, noise, straggler_fraction, 42);
    assert_true(fabs(cm.coef[2] / cm.seed_coef[2] - factor[2]) < 0.1);   /* it moved from the seed */
    for (int j = 1; j <= 2; j++) assert_true(fabs(cm.coef[j] / truth[j] - 1) < tolerance);   /* b, c */
    /* predictions (where every term matters) within tolerance over a range of shapes */
    const int64_t shapes[4][2] = {{256, 64}, {4096, 512}, {32760, 512}, {75600, 300}};
    for (int k = 0; k < 4; k++) {
        double predicted = cost_model_predict(&cm, shapes[k][0], shapes[k][1]);
        double s = (double)shapes[k][0], l = (double)shapes[k][1];
        double expected = truth[0] + truth[1] * s + truth[2] * s * s + truth[3] * s * l + truth[4] * l;
        if (!(fabs(predicted / expected - 1) < tolerance)) fprintf(stderr, "shape %d: predicted %g expected %g (noise %g)\n", k, predicted, expected, noise);
        assert_true(fabs(predicted / expected - 1) < tolerance);
    }
    for (int j = 0; j < COST_N_FEATURES; j++) assert_true(cm.coef[j] >= 0);
    cost_model_free(&cm);
}

static void test_refit_recovers_coefficients(void **state)
{
    (void)state;
    check_refit(0.0, 0.0, 1e-3);
    check_refit(0.05, 0.0, 0.05);
}

static void test_refit_ignores_stragglers(void **state)
{
    (void)state;
    check_refit(0.03, 0.03, 0.05);
}

/* The median (a selection, not a sort) against the middle of the sorted values, duplicates included. */
static int compare_doubles(const void *left, const void *right)
{
    const double a = *(const double *)left, b = *(const double *)right;
    return (a > b) - (a < b);
}

static void test_median_matches_sort(void **state)
{
    (void)state;
    uint64_t rng = 9;
    double values[101], sorted[101];
    for (int trial = 0; trial < 2000; trial++) {
        const int n_values = 1 + (int)rng_below(&rng, 101), n_distinct = 1 + (int)rng_below(&rng, 8);
        for (int i = 0; i < n_values; i++)
            values[i] = trial % 2 ? (double)rng_below(&rng, (uint64_t)n_distinct) : rng_normal(&rng);
        memcpy(sorted, values, (size_t)n_values * sizeof(double));
        qsort(sorted, (size_t)n_values, sizeof(double), compare_doubles);
        const double want = n_values % 2 ? sorted[n_values / 2] : 0.5 * (sorted[n_values / 2 - 1] + sorted[n_values / 2]);
        assert_true(cost_median_in_place(values, n_values) == want);
    }
}

static void test_refit_needs_observations(void **state)
{
    (void)state;
    deck config;
    deck_defaults(&config);
    cost_model cm;
    cost_model_init(&cm, &config);
    double truth[COST_N_FEATURES];
    for (int j = 0; j < COST_N_FEATURES; j++) truth[j] = 2 * cm.seed_coef[j];
    observe_synthetic(&cm, truth, 1, 4, 0, 0, 1);   /* 4 observations: too few */
    assert_int_equal(cost_model_refit(&cm), 0);
    assert_memory_equal(cm.coef, cm.seed_coef, sizeof(cm.coef));
    cost_model_free(&cm);
}

static void test_calibration_follows_device(void **state)
{
    (void)state;
    /* measured times 1.5x the seed: after a few observed steps the balancer predicts 1.5x */
    deck config = test_deck(STRATEGY_GLOBAL, 21);
    balance_sample *samples = random_samples(21, 2000, 6000);
    balancer *b = balancer_create(&config, samples, 2000, 4, mem_of(&config, 9000), NULL);
    double seed_prediction = cost_model_predict(balancer_cost_model(b), 3000, 512);
    cost_model truth;
    cost_model_init(&truth, &config);
    balance_assignment a = {0};
    double seconds[4];
    for (int t = 0; t < 12; t++) {
        balancer_next(b, &a);
        for (int r = 0; r < 4; r++) {   /* the device's time, not the balancer's current belief */
            seconds[r] = 0;
            for (int64_t k = a.rank_start[r]; k < a.rank_start[r + 1]; k++) {
                const balance_sample *s = &samples[a.indices[k]];
                seconds[r] += 1.5 * cost_model_predict(&truth, s->tokens, s->text_len);
            }
        }
        balancer_observe(b, seconds);
    }
    double calibrated = cost_model_predict(balancer_cost_model(b), 3000, 512);
    assert_true(fabs(calibrated / (1.5 * seed_prediction) - 1) < 0.02);
    cost_model_free(&truth);
    /* calibrate = off: nothing changes */
    config.balance.calibrate = 0;
    balancer *fixed = balancer_create(&config, samples, 2000, 4, mem_of(&config, 9000), NULL);
    for (int t = 0; t < 12; t++) {
        balancer_next(fixed, &a);
        for (int r = 0; r < 4; r++) seconds[r] = 1.5 * a.predicted_seconds[r];
        balancer_observe(fixed, seconds);
    }
    assert_true(cost_model_predict(balancer_cost_model(fixed), 3000, 512) == seed_prediction);
    balance_assignment_free(&a);
    balancer_free(b);
    balancer_free(fixed);
    free(samples);
}

/* Start-up calibration: single-sample timings from a device unlike the seed (a fixed cost per sample,
   slower GEMMs, faster attention) make the balancer predict that device, for lengths it did not time too. */
static void test_startup_calibration(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 23);
    balance_sample *samples = random_samples(23, 500, 6000);
    balancer *b = balancer_create(&config, samples, 500, 2, mem_of(&config, 9000), NULL);
    const double *seed = balancer_cost_model(b)->coef;
    const double truth[COST_N_FEATURES] = {2e-3, 2.5 * seed[1], 0.4 * seed[2], seed[3], seed[4]};
    enum { n_shapes = 16 };
    cost_features features[n_shapes] = {0};
    double seconds[n_shapes];
    for (int i = 0; i < n_shapes; i++) {
        cost_features_add(balancer_cost_model(b), &features[i], 256 + 380 * i, 40 + i % 5);
        seconds[i] = 0;
        for (int j = 0; j < COST_N_FEATURES; j++) seconds[i] += truth[j] * features[i].value[j];
    }
    assert_int_equal(balancer_calibrate(b, n_shapes, features, seconds), 1);
    const cost_model *cm = balancer_cost_model(b);
    for (int64_t tokens = 300; tokens <= 6000; tokens += 700) {
        double want = truth[0] + tokens * (truth[1] + truth[2] * tokens + truth[3] * 42) + truth[4] * 42;
        assert_true(fabs(cost_model_predict(cm, tokens, 42) / want - 1) < 0.02);
    }
    balancer_free(b);
    free(samples);
}

/* The copies of one sample a calibration micro-batch holds: capped by max_copies, samples, tokens, text
   rows and the fill bytes; 0 for a sample beyond the capacity or the budget. */
static void test_calibration_copies(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 29);
    cost_model cm;
    cost_model_init(&cm, &config);
    const double one = cost_model_mem(&cm, 1000, 64), budget = 100 * one;
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 1000, budget, budget, 32), 32);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 1000, budget, 5.5 * one, 32), 5);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 3200, 1 << 20, 1000, budget, budget, 32), 3);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 200, 1000, budget, budget, 32), 3);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 2, budget, budget, 32), 2);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 1000, budget, 0.5 * one, 32), 1);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 1000, budget, budget, 1), 1);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 999, 1 << 20, 1000, budget, budget, 32), 0);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 63, 1000, budget, budget, 32), 0);
    assert_int_equal(cost_model_calibration_copies(&cm, 1000, 64, 1 << 20, 1 << 20, 1000, 0.9 * one, budget, 32), 0);
    cost_model_free(&cm);
}

/* A device whose every forward + backward call costs a fixed 5 ms on top of its samples' costs (as a GPU
   pays embeddings, head and launches once per micro-batch). Timing one sample per call puts that cost into
   every sample's constant; timing micro-batches packed as training packs them (cost_model_calibration_copies)
   predicts training's micro-batches: many short samples in one call, and a long video alone. */
static void test_packed_calibration_amortises_fixed_cost(void **state)
{
    (void)state;
    deck config = test_deck(STRATEGY_GLOBAL, 31);
    balance_sample *samples = random_samples(31, 500, 6000);
    balancer *single = balancer_create(&config, samples, 500, 2, mem_of(&config, 9000), NULL);
    balancer *packed = balancer_create(&config, samples, 500, 2, mem_of(&config, 9000), NULL);
    const cost_model *seed = balancer_cost_model(single);
    const double per_call = 5e-3;
    const double truth[COST_N_FEATURES] = {2e-4, seed->coef[1], seed->coef[2], seed->coef[3], seed->coef[4]};
    const double budget = mem_of(&config, 9000), fill = 0.9 * budget;
    enum { n_shapes = 16 };
    cost_features one_each[n_shapes] = {0}, packed_each[n_shapes] = {0};
    double one_seconds[n_shapes], packed_seconds[n_shapes];
    for (int i = 0; i < n_shapes; i++) {
        const int64_t tokens = 128 + 390 * i, text = 64;
        const int copies = cost_model_calibration_copies(seed, tokens, text, 1 << 20, 1 << 20, 4096, budget, fill, 32);
        assert_true(copies >= 1);
        for (int c = 0; c < copies; c++) cost_features_add(seed, &packed_each[i], tokens, text);
        cost_features_add(seed, &one_each[i], tokens, text);
        one_seconds[i] = per_call, packed_seconds[i] = per_call;
        for (int j = 0; j < COST_N_FEATURES; j++) {
            one_seconds[i] += truth[j] * one_each[i].value[j];
            packed_seconds[i] += truth[j] * packed_each[i].value[j];
        }
    }
    assert_int_equal(balancer_calibrate(single, n_shapes, one_each, one_seconds), 1);
    assert_int_equal(balancer_calibrate(packed, n_shapes, packed_each, packed_seconds), 1);
    /* training's micro-batches: 24 short samples packed into one call; one long video alone */
    const int64_t lengths[2] = {300, 6000};
    const int counts[2] = {24, 1};
    for (int m = 0; m < 2; m++) {
        cost_features batch = {0};
        for (int c = 0; c < counts[m]; c++) cost_features_add(seed, &batch, lengths[m], 64);
        double device = per_call;
        for (int j = 0; j < COST_N_FEATURES; j++) device += truth[j] * batch.value[j];
        const double single_error = cost_model_predict_features(balancer_cost_model(single), &batch) / device - 1;
        const double packed_error = cost_model_predict_features(balancer_cost_model(packed), &batch) / device - 1;
        if (m == 0) assert_true(single_error > 0.5);  /* 24 fixed costs charged for one */
        assert_true(fabs(packed_error) < 0.15);
    }
    balancer_free(single);
    balancer_free(packed);
    free(samples);
}

/* The whole-tile order: in each micro-batch the longest sample of at least min_tokens that is not a multiple of the
   tile goes last, the others keep their order, tokens move with the ids; nothing moves where no sample qualifies,
   where it is last already, or without a tile. */
static void test_order_whole_tiles(void **state)
{
    (void)state;
    int64_t ids[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    /* micro-batch 0: 32760 (not a multiple of 128) beats 14040; 76032 and 1024 are multiples; 900 is too short.
       1: 2048 is a multiple, 256 and 512 are under min_tokens: nothing moves. 2: its qualifier (7800) is last. */
    int64_t tokens[] = {14040, 76032, 32760, 900, 1024, 256, 2048, 512, 1300, 7800};
    int micro_start[] = {0, 5, 8, 10};
    rank_assignment mine = {0};
    mine.n_samples = 10, mine.ids = ids, mine.n_micro = 3, mine.micro_start = micro_start;
    rank_assignment_order_whole_tiles(&mine, tokens, 128, 1024);
    const int64_t want_ids[] = {10, 11, 13, 14, 12, 15, 16, 17, 18, 19};
    const int64_t want_tokens[] = {14040, 76032, 900, 1024, 32760, 256, 2048, 512, 1300, 7800};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(ids[i], want_ids[i]);
        assert_int_equal(tokens[i], want_tokens[i]);
    }
    /* again: already in order, nothing moves */
    rank_assignment_order_whole_tiles(&mine, tokens, 128, 1024);
    for (int i = 0; i < 10; i++) assert_int_equal(ids[i], want_ids[i]);
    /* micro-batch 2 with its qualifier first: 7800 moves behind 1300 */
    ids[8] = 19, ids[9] = 18, tokens[8] = 7800, tokens[9] = 1300;
    rank_assignment_order_whole_tiles(&mine, tokens, 128, 1024);
    assert_int_equal(ids[8], 18);
    assert_int_equal(ids[9], 19);
    assert_int_equal(tokens[9], 7800);
    /* no tile: nothing moves */
    ids[8] = 19, ids[9] = 18, tokens[8] = 7800, tokens[9] = 1300;
    rank_assignment_order_whole_tiles(&mine, tokens, 0, 1024);
    assert_int_equal(ids[8], 19);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_startup_calibration),
        cmocka_unit_test(test_calibration_copies),
        cmocka_unit_test(test_packed_calibration_amortises_fixed_cost),
        cmocka_unit_test(test_flops_and_attention_share),
        cmocka_unit_test(test_memory_model),
        cmocka_unit_test(test_split_cost),
        cmocka_unit_test(test_joint_length_cost),
        cmocka_unit_test(test_joint_memory_counts_text),
        cmocka_unit_test(test_joint_calibration),
        cmocka_unit_test(test_joint_online_refit),
        cmocka_unit_test(test_nnls_clamps_negative),
        cmocka_unit_test(test_refit_recovers_coefficients),
        cmocka_unit_test(test_refit_ignores_stragglers),
        cmocka_unit_test(test_refit_needs_observations),
        cmocka_unit_test(test_median_matches_sort),
        cmocka_unit_test(test_calibration_follows_device),
        cmocka_unit_test(test_each_sample_once_per_epoch),
        cmocka_unit_test(test_more_ranks_than_samples),
        cmocka_unit_test(test_same_seed_same_assignments),
        cmocka_unit_test(test_epoch_orders_differ),
        cmocka_unit_test(test_resume_mid_epoch),
        cmocka_unit_test(test_resume_other_rank_count),
        cmocka_unit_test(test_state_rejects_other_runs),
        cmocka_unit_test(test_version_one_state_resumes),
        cmocka_unit_test(test_oversize_error_names_sample),
        cmocka_unit_test(test_sp_limit),
        cmocka_unit_test(test_group_for_a_costly_sample),
        cmocka_unit_test(test_group_for_memory_and_the_raise),
        cmocka_unit_test(test_groups_over_epochs),
        cmocka_unit_test(test_groups_resume),
        cmocka_unit_test(test_oversize_skip),
        cmocka_unit_test(test_global_fixed_batch),
        cmocka_unit_test(test_global_tokens),
        cmocka_unit_test(test_global_balances_mixed_lengths),
        cmocka_unit_test(test_global_fills_memory),
        cmocka_unit_test(test_global_with_noisy_times),
        cmocka_unit_test(test_equal_tokens_batches),
        cmocka_unit_test(test_dual_constraints),
        cmocka_unit_test(test_memory_is_the_layout_formula),
        cmocka_unit_test(test_order_whole_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
