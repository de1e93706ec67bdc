/* shard.c — the shard layout of the flat parameter array and the summaries' state line. */
#include "backend/shard.h"

#include <stdio.h>

#include "core/check.h"
#include "core/comm.h"

shard_layout shard_layout_of(deck_shard mode, int64_t n_values, int rank, int n_ranks)
{
    ALDIT_CHECK(mode != SHARD_AUTO && n_ranks > 0, "shard_layout_of: mode must be resolved and ranks > 0");
    shard_layout layout = {.mode = mode, .n_values = n_values, .rank = rank, .n_ranks = n_ranks};
    layout.shard = comm_shard_values(n_values, n_ranks);
    layout.first = (int64_t)rank * layout.shard;
    if (layout.first > n_values) layout.first = n_values;
    layout.count = n_values - layout.first < layout.shard ? n_values - layout.first : layout.shard;
    return layout;
}

double shard_bytes_total(const shard_bytes *bytes)
{
    return bytes->weights + bytes->gathered + bytes->gradients + bytes->master + bytes->moments;
}

const char *shard_mode_name(deck_shard mode) { return deck_shard_name(mode); }

void shard_describe(deck_shard mode, int n_ranks, const shard_bytes *bytes, int chosen_by_auto, char *text,
                    size_t text_size)
{
    char weights[32], gathered[32], gradients[32], master[32], moments[32], total[32];
    format_size(bytes->weights, weights, sizeof weights);
    format_size(bytes->gathered, gathered, sizeof gathered);
    format_size(bytes->gradients, gradients, sizeof gradients);
    format_size(bytes->master, master, sizeof master);
    format_size(bytes->moments, moments, sizeof moments);
    format_size(shard_bytes_total(bytes), total, sizeof total);
    snprintf(text, text_size, "  state      shard = %s%s over %d rank(s): %s per rank (weights %s, gathered blocks %s, "
             "gradients %s, master weights %s, AdamW moments %s)\n", shard_mode_name(mode),
             chosen_by_auto ? " (auto: the least that fits)" : "", n_ranks, total, weights, gathered, gradients, master,
             moments);
}
