/* test_mpi_scatter.c — run under mpirun by mpi_scatter.sh: rank 0 assigns steps with each strategy and
   scatters them; every rank rebuilds the same balancer (it is deterministic) to know what it must
   receive, and checks its ids, micro-batches, step, epoch and the global count. Rank 0 prints TAP. */
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

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    const deck_strategy strategies[3] = {STRATEGY_GLOBAL, STRATEGY_DUAL, STRATEGY_EQUAL_TOKENS};
    if (info.rank == 0) printf("1..3\n");
    int failed = 0;
    for (int s = 0; s < 3; s++) {
        int failures = check_strategy(strategies[s], &info);
        failed |= failures != 0;
        if (info.rank == 0)
            printf("%s %d - %s: %d ranks each receive exactly their ids and micro-batches over %d steps; counts sum to "
                   "global_samples%s\n", failures ? "not ok" : "ok", s + 1, deck_strategy_name(strategies[s]),
                   info.n_ranks, N_STEPS, failures ? " (mismatch)" : "");
    }
    comm_finalize();
    return failed;
}
