/* shard.c — the shard layouts of the flat parameter array (one unit, or per block) and the summaries' state line. */
#include "backend/shard.h"

#include <stdio.h>

#include "core/check.h"

/* Unit u's range: [*first, *first + *count). Units: the lead, the blocks, the rest. */
static int n_units(const shard_layout *l) { return 2 + l->n_blocks; }

static void unit_range(const shard_layout *l, int u, int64_t *first, int64_t *count)
{
    const int64_t blocks_end = l->lead + (int64_t)l->n_blocks * l->block_stride;
    if (u == 0) *first = 0, *count = l->lead;
    else if (u <= l->n_blocks) *first = l->lead + (int64_t)(u - 1) * l->block_stride, *count = l->block_stride;
    else *first = blocks_end, *count = l->n_values - blocks_end;
}

/* Rank r's piece of unit [first, first + count). */
static void piece_of(int64_t first, int64_t count, int r, int n_ranks, int64_t *piece_first, int64_t *piece_count)
{
    const int64_t size = (count + n_ranks - 1) / n_ranks;
    int64_t lo = (int64_t)r * size, hi = lo + size;
    if (lo > count) lo = count;
    if (hi > count) hi = count;
    *piece_first = first + lo;
    *piece_count = hi - lo;
}

static shard_layout finish(shard_layout l)
{
    if (l.mode == SHARD_NONE) {
        l.held = l.n_values, l.first = 0, l.count = l.n_values;
        return l;
    }
    for (int u = 0; u < n_units(&l); u++) {
        int64_t first, count, piece_first, piece_count;
        unit_range(&l, u, &first, &count);
        piece_of(first, count, l.rank, l.n_ranks, &piece_first, &piece_count);
        l.held += piece_count;
    }
    if (l.n_blocks == 0 && l.lead == l.n_values) piece_of(0, l.n_values, l.rank, l.n_ranks, &l.first, &l.count);
    else l.first = l.count = -1; /* several units: no one range */
    return l;
}

shard_layout shard_layout_of(deck_shard mode, int64_t n_values, int rank, int n_ranks)
{
    ALDIT_CHECK(mode != SHARD_AUTO && n_ranks > 0, "shard_layout_of: mode must be resolved and ranks > 0");
    shard_layout l = {.mode = mode, .n_values = n_values, .lead = n_values, .rank = rank, .n_ranks = n_ranks};
    return finish(l);
}

shard_layout shard_layout_units(deck_shard mode, const model_layout *layout, int rank, int n_ranks)
{
    ALDIT_CHECK(mode != SHARD_AUTO && n_ranks > 0, "shard_layout_units: mode must be resolved and ranks > 0");
    shard_layout l = {.mode = mode, .n_values = layout->n_weights, .lead = layout->blocks_offset,
                      .block_stride = layout->block_stride, .n_blocks = (int)layout->dims.num_layers,
                      .rank = rank, .n_ranks = n_ranks};
    return finish(l);
}

void shard_owned(const shard_layout *l, int rank, int64_t first, int64_t count, int64_t *own_first,
                 int64_t *own_count)
{
    *own_first = first, *own_count = 0;
    if (count <= 0) return;
    if (l->mode == SHARD_NONE) {
        *own_count = count;
        return;
    }
    for (int u = 0; u < n_units(l); u++) {
        int64_t unit_first, unit_count, piece_first, piece_count;
        unit_range(l, u, &unit_first, &unit_count);
        if (first < unit_first || first >= unit_first + unit_count) continue;
        ALDIT_CHECK(first + count <= unit_first + unit_count, "shard_owned: values [%lld, %lld) cross a unit's end (%lld)",
                    (long long)first, (long long)(first + count), (long long)(unit_first + unit_count));
        piece_of(unit_first, unit_count, rank, l->n_ranks, &piece_first, &piece_count);
        int64_t lo = first > piece_first ? first : piece_first;
        int64_t hi = first + count < piece_first + piece_count ? first + count : piece_first + piece_count;
        if (hi > lo) *own_first = lo, *own_count = hi - lo;
        return;
    }
    ALDIT_FATAL("shard_owned: values [%lld, %lld) lie outside the %lld parameters", (long long)first,
                (long long)(first + count), (long long)l->n_values);
}

double shard_bytes_total(const shard_bytes *bytes) { return layout_state_total(bytes); }

const char *shard_mode_name(deck_shard mode) { return deck_shard_name(mode); }

void shard_describe(deck_shard mode, int n_ranks, const shard_bytes *bytes, int chosen_by_auto, char *text,
                    size_t text_size)
{
    char weights[32], gathered[32], gradients[32], master[32], moments[32], ema[48] = "", total[32];
    format_size(bytes->weights, weights, sizeof weights);
    format_size(bytes->gathered, gathered, sizeof gathered);
    format_size(bytes->gradients, gradients, sizeof gradients);
    format_size(bytes->master, master, sizeof master);
    format_size(bytes->moments, moments, sizeof moments);
    format_size(shard_bytes_total(bytes), total, sizeof total);
    if (bytes->ema > 0.0) {
        char ema_size[32];
        format_size(bytes->ema, ema_size, sizeof ema_size);
        snprintf(ema, sizeof ema, ", EMA weights %s", ema_size);
    }
    snprintf(text, text_size, "  state      shard = %s%s over %d rank(s): %s per rank (weights %s, gathered blocks %s, "
             "gradients %s, master weights %s, AdamW moments %s%s)\n", shard_mode_name(mode),
             chosen_by_auto ? " (auto: the least that fits)" : "", n_ranks, total, weights, gathered, gradients, master,
             moments, ema);
}
