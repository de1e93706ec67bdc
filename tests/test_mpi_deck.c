/* test_mpi_deck.c — run under mpirun by mpi_deck.sh: rank 0 loads a deck, every rank checks the broadcast copy.
   usage: test_mpi_deck DECK [section.key=value ...]; prints "deck agrees on N ranks" (rank 0) and exits 0 when
   every rank holds the same bytes and the values of tests/decks/good.ini (plus overrides); a bad deck makes
   deck_load_bcast end every rank with status 2. */
#include "core/comm.h"
#include "deck/deck.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* FNV-1a over the struct: equal on every rank iff the broadcast delivered the same bytes. */
static uint64_t hash_bytes(const void *data, size_t n_bytes)
{
    const unsigned char *bytes = data;
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < n_bytes; i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
    return hash;
}

int main(int argc, char **argv)
{
    comm_info info = comm_init(&argc, &argv);
    if (argc < 2) {
        if (info.rank == 0) fprintf(stderr, "usage: test_mpi_deck DECK [section.key=value ...]\n");
        comm_finalize();
        return 2;
    }
    deck config;
    deck_load_bcast(&config, argv[1], argc - 2, argv + 2);

    /* values every rank must see: good.ini's, with run.steps overridden to 99 by mpi_deck.sh */
    int wrong = config.model.dim != 96 || config.model.num_heads != 6 || config.run.steps != 99 ||
                config.balance.strategy != STRATEGY_DUAL || config.balance.mem_budget != 12.0 * 1073741824.0 ||
                config.train.lr != 3e-4 || strcmp(config.data.store, "data/tiny.h5") != 0 ||
                strcmp(config.source, argv[1]) != 0;
    /* the same bytes everywhere: the max and min of the hash halves agree */
    uint64_t hash = hash_bytes(&config, sizeof config);
    double halves[4] = {(double)(hash >> 32), (double)(hash & 0xffffffffu), -(double)(hash >> 32),
                        -(double)(hash & 0xffffffffu)};
    comm_allreduce_max_f64(halves, 4);
    int differ = halves[0] != -halves[2] || halves[1] != -halves[3];
    int any_wrong = comm_allreduce_or_int(wrong);
    if (info.rank == 0) {
        if (any_wrong) printf("a rank holds wrong values\n");
        if (differ) printf("ranks hold different bytes\n");
        if (!any_wrong && !differ) printf("deck agrees on %d ranks\n", info.n_ranks);
    }
    comm_finalize();
    return any_wrong || differ;
}
