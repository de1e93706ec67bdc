/* test_mpi_scatter.c — run under mpirun by mpi_scatter.sh: rank 0 assigns steps with each strategy and
   scatters them; every rank rebuilds the same balancer (it is deterministic) to know what it must
   receive, and checks its ids, micro-batches (and their group sizes, 1), step, epoch and the global count. Rank 0
   prints TAP. */
#include "balance/balance.h"
#include "balance/group_blocks.h"
#include "core/comm.h"
#include "deck/deck.h"
#include "core/rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_SAMPLES = 400, N_STEPS = 25 };

static int check_strategy(deck_strategy strategy, const comm_info *info)
{
    deck config;
    deck_defaults(&config);
    config.run.seed = 7;
    config.balance.strategy = strategy;
    config.balance.max_tokens = 12000;
    balance_sample samples[N_SAMPLES];
    uint64_t rng = 3;
    for (int i = 0; i < N_SAMPLES; i++)
        samples[i] = (balance_sample){.id = 5000 + i, .tokens = 64 + (int32_t)(rng_next_u64(&rng) % 6000), .text_len = 512};
    cost_model cm;
    cost_model_init(&cm, &config);
    const double mem_budget = cost_model_mem(&cm, 9000, 512);
    cost_model_free(&cm);
    balancer *b = balancer_create(&config, samples, N_SAMPLES, info->n_ranks, mem_budget, NULL);
    balance_assignment expected = {0};
    rank_assignment mine = {0};
    int failures = 0;
    for (int t = 0; t < N_STEPS; t++) {
        balancer_next(b, &expected);
        balance_scatter(info->rank == 0 ? &expected : NULL, &mine);
        const int r = info->rank;
        const int64_t first = expected.rank_start[r];
        const int n_expected = (int)(expected.rank_start[r + 1] - first);
        const int m0 = expected.rank_micro_start[r], n_micro = expected.rank_micro_start[r + 1] - m0;
        int ok = mine.step == expected.step && mine.epoch == expected.epoch
              && mine.global_samples == expected.global_samples && mine.n_samples == n_expected
              && mine.n_micro == n_micro
              && (n_expected == 0 || memcmp(mine.ids, expected.ids + first, (size_t)n_expected * sizeof(int64_t)) == 0);
        for (int m = 0; ok && m <= n_micro; m++)
            ok = mine.micro_start[m] == (n_micro > 0 ? expected.micro_start[m0 + m] - first : 0);
        for (int m = 0; ok && m < n_micro; m++)   /* every strategy runs each micro-batch on one rank */
            ok = mine.micro_group[m] == 1 && expected.micro_group[m0 + m] == 1;
        double count = mine.n_samples;
        comm_allreduce_sum_f64(&count, 1);
        ok = ok && count == (double)mine.global_samples;
        failures += comm_allreduce_or_int(!ok);
        /* measured times go to rank 0; the other ranks' copies observe the same values (which they
           know: a function of each rank's count) so that their refits, and assignments, stay equal */
        double *all = malloc((size_t)info->n_ranks * sizeof(double));
        comm_gather_f64(0.01 * (1 + mine.n_samples), info->rank == 0 ? all : NULL);
        if (info->rank != 0)
            for (int q = 0; q < info->n_ranks; q++) all[q] = 0.01 * (double)(1 + expected.rank_start[q + 1] - expected.rank_start[q]);
        balancer_observe(b, all);
        free(all);
    }
    rank_assignment_free(&mine);
    balance_assignment_free(&expected);
    balancer_free(b);
    return failures;
}

/* The sequence-parallel groups: the aligned blocks of k ranks, their sizes and places, whether they are whole on one
   node, and an all-to-all over the group of k = 2 (member p sends p + 1 copies of 100 * its world rank + q to member q). */
static int check_groups(const comm_info *info)
{
    comm_groups_init(4);
    int ok = comm_group_get(1) == NULL && (comm_group_get(4) != NULL) == (info->n_ranks >= 4)
          && comm_group_get(8) == NULL && comm_group_node_local(1) == 1;
    const comm_group *pair = comm_group_get(2);
    if (info->n_ranks < 2) return !(ok && pair == NULL && comm_group_node_local(2) == 0);
    const int base = info->rank - info->rank % 2, size = info->n_ranks - base < 2 ? info->n_ranks - base : 2;
    ok = ok && pair && comm_group_size(pair) == size && comm_group_rank(pair) == info->rank % 2
          && comm_group_node_local(2) == (info->n_ranks % 2 == 0 && info->n_local_ranks == info->n_ranks);
    if (!ok) return 1;
    const int me = comm_group_rank(pair);
    int64_t send_counts[2], send_displs[2], recv_counts[2], recv_displs[2];
    float send[4], recv[4] = {0};
    for (int p = 0; p < size; p++) {
        send_counts[p] = me + 1; send_displs[p] = p * 2;
        recv_counts[p] = p + 1; recv_displs[p] = p * 2;
        for (int i = 0; i < me + 1; i++) send[p * 2 + i] = (float)(100 * info->rank + p);
    }
    comm_group_alltoallv_f32(pair, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    for (int q = 0; q < size; q++)
        for (int i = 0; i < q + 1; i++) ok = ok && recv[q * 2 + i] == (float)(100 * (base + q) + me);
    double sum = 1;
    comm_group_allreduce_sum_f64(pair, &sum, 1);
    return !(ok && sum == size);
}

/* balance_group_blocks (no MPI: every rank checks its own copy): over 4 ranks with groups of 2 (both blocks, then the
   first only), each member lists its block's micro-batches (rank, then micro-batch order) with group 2, a rank outside
   the grouped blocks its own with group 1, and the global count stays. Returns the failures. */
static int check_group_blocks(int n_blocks)
{
    deck config;
    deck_defaults(&config);
    config.run.seed = 7;
    config.balance.max_tokens = 12000;
    balance_sample samples[N_SAMPLES];
    uint64_t rng = 5;
    for (int i = 0; i < N_SAMPLES; i++)
        samples[i] = (balance_sample){.id = 100 + i, .tokens = 64 + (int32_t)(rng_next_u64(&rng) % 6000), .text_len = 512};
    cost_model cm;
    cost_model_init(&cm, &config);
    const double mem_budget = cost_model_mem(&cm, 9000, 512);
    cost_model_free(&cm);
    balancer *b = balancer_create(&config, samples, N_SAMPLES, 4, mem_budget, NULL);
    balance_assignment plain = {0}, grouped = {0};
    int failures = 0;
    for (int t = 0; t < 5; t++) {
        balancer_next(b, &plain);
        grouped = plain;   /* a deep copy: the hook frees what it replaces */
        const int64_t n_ids = plain.rank_start[4], n_micro = plain.rank_micro_start[4];
        grouped.ids = malloc((size_t)n_ids * sizeof(int64_t));
        grouped.indices = malloc((size_t)n_ids * sizeof(int64_t));
        grouped.micro_start = malloc((size_t)(n_micro + 1) * sizeof(int64_t));
        grouped.micro_group = malloc((size_t)(n_micro + 1) * sizeof(int32_t));
        grouped.rank_start = malloc(5 * sizeof(int64_t));
        grouped.rank_micro_start = malloc(5 * sizeof(int));
        grouped.predicted_seconds = malloc(4 * sizeof(double));
        grouped.peak_mem_bytes = malloc(4 * sizeof(double));
        memcpy(grouped.ids, plain.ids, (size_t)n_ids * sizeof(int64_t));
        memcpy(grouped.indices, plain.indices, (size_t)n_ids * sizeof(int64_t));
        memcpy(grouped.micro_start, plain.micro_start, (size_t)(n_micro + 1) * sizeof(int64_t));
        memcpy(grouped.micro_group, plain.micro_group, (size_t)(n_micro + 1) * sizeof(int32_t));
        memcpy(grouped.rank_start, plain.rank_start, 5 * sizeof(int64_t));
        memcpy(grouped.rank_micro_start, plain.rank_micro_start, 5 * sizeof(int));
        memcpy(grouped.predicted_seconds, plain.predicted_seconds, 4 * sizeof(double));
        memcpy(grouped.peak_mem_bytes, plain.peak_mem_bytes, 4 * sizeof(double));
        grouped.capacity_ids = n_ids;
        grouped.capacity_micro = n_micro + 1;
        balance_group_blocks(&grouped, 2, n_blocks);
        const int grouped_end = n_blocks < 0 ? 4 : 2 * n_blocks;
        int ok = n_blocks >= 0 || (grouped.rank_start[4] == 2 * n_ids && grouped.rank_micro_start[4] == 2 * n_micro);
        ok = grouped.global_samples == plain.global_samples;
        for (int member = 0; ok && member < 4; member++) {
            const int k = member < grouped_end ? 2 : 1, base = member - member % k;
            int m = grouped.rank_micro_start[member];
            for (int r = base; ok && r < base + k; r++)
                for (int p = plain.rank_micro_start[r]; ok && p < plain.rank_micro_start[r + 1]; p++, m++) {
                    const int64_t count = plain.micro_start[p + 1] - plain.micro_start[p];
                    ok = m < grouped.rank_micro_start[member + 1] && grouped.micro_group[m] == k
                      && grouped.micro_start[m + 1] - grouped.micro_start[m] == count
                      && memcmp(grouped.ids + grouped.micro_start[m], plain.ids + plain.micro_start[p],
                                (size_t)count * sizeof(int64_t)) == 0;
                }
            ok = ok && m == grouped.rank_micro_start[member + 1];
        }
        failures += !ok;
        balance_assignment_free(&grouped);
    }
    balance_assignment_free(&plain);
    balancer_free(b);
    return failures;
}

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    const deck_strategy strategies[3] = {STRATEGY_GLOBAL, STRATEGY_DUAL, STRATEGY_EQUAL_TOKENS};
    if (info.rank == 0) printf("1..6\n");
    int failed = 0;
    for (int s = 0; s < 3; s++) {
        int failures = check_strategy(strategies[s], &info);
        failed |= failures != 0;
        if (info.rank == 0)
            printf("%s %d - %s: %d ranks each receive exactly their ids and micro-batches over %d steps; counts sum to "
                   "global_samples%s\n", failures ? "not ok" : "ok", s + 1, deck_strategy_name(strategies[s]),
                   info.n_ranks, N_STEPS, failures ? " (mismatch)" : "");
    }
    int groups_failed = comm_allreduce_or_int(check_groups(&info));
    failed |= groups_failed;
    if (info.rank == 0)
        printf("%s 4 - groups of 2 over %d ranks: sizes, places, node-local, all-to-all and group sum\n",
               groups_failed ? "not ok" : "ok", info.n_ranks);
    for (int n_blocks = -1, test = 5; n_blocks <= 1; n_blocks += 2, test++) {
        const int blocks_failed = check_group_blocks(n_blocks);
        failed |= blocks_failed;
        if (info.rank == 0)
            printf("%s %d - balance_group_blocks: 4 ranks, %s: each member lists its block's micro-batches (group 2), "
                   "the others their own (group 1), the global count unchanged\n", blocks_failed ? "not ok" : "ok",
                   test, n_blocks < 0 ? "both blocks of 2 grouped" : "the first block of 2 grouped");
    }
    comm_finalize();
    return failed;
}
