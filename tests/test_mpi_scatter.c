/* test_mpi_scatter.c — run under mpirun by mpi_scatter.sh: rank 0 assigns steps with each strategy and
   scatters them; every rank rebuilds the same balancer (it is deterministic) to know what it must
   receive, and checks its ids, micro-batches (and their group sizes, 1), step, epoch and the global count. Rank 0
   prints TAP. */
#include "balance/balance.h"
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

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    const deck_strategy strategies[3] = {STRATEGY_GLOBAL, STRATEGY_DUAL, STRATEGY_EQUAL_TOKENS};
    if (info.rank == 0) printf("1..4\n");
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
    comm_finalize();
    return failed;
}
