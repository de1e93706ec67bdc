/* group_blocks.c — the test hook that hands every micro-batch of an aligned block of ranks to the block's group. */
#include "balance/group_blocks.h"
#include "core/check.h"

#include <stdlib.h>
#include <string.h>

/* The block of ranks [base, base + k), run by its group of k (k = 1: a rank alone, as it was): its ids, micro-batches
   and the predicted seconds and peak memory of each member, written from the original assignment `old` into `a`
   (whose arrays are the new ones) at *n_ids / *n_micro. */
static void write_block(const balance_assignment *old, balance_assignment *a, int base, int k, int64_t *n_ids,
                        int64_t *n_micro)
{
    double seconds = 0.0, peak = 0.0;
    for (int r = base; r < base + k; r++) {
        seconds += old->predicted_seconds[r];
        if (old->peak_mem_bytes[r] > peak) peak = old->peak_mem_bytes[r];
    }
    for (int member = base; member < base + k; member++) {
        a->rank_start[member] = *n_ids;
        a->rank_micro_start[member] = (int)*n_micro;
        a->predicted_seconds[member] = seconds / k;
        a->peak_mem_bytes[member] = peak;
        for (int m = old->rank_micro_start[base]; m < old->rank_micro_start[base + k]; m++) {
            const int64_t first = old->micro_start[m], count = old->micro_start[m + 1] - first;
            ALDIT_CHECK(old->micro_group[m] == 1, "balance_group_blocks: micro-batch %d already has a group of %d", m,
                        (int)old->micro_group[m]);
            a->micro_start[*n_micro] = *n_ids;
            a->micro_group[(*n_micro)++] = k;
            memcpy(a->ids + *n_ids, old->ids + first, (size_t)count * sizeof *a->ids);
            memcpy(a->indices + *n_ids, old->indices + first, (size_t)count * sizeof *a->indices);
            *n_ids += count;
        }
    }
}

void balance_group_blocks(balance_assignment *a, int k, int n_blocks)
{
    const int n_ranks = a->n_ranks;
    ALDIT_CHECK(k >= 1 && (k & (k - 1)) == 0 && n_ranks % k == 0, "balance_group_blocks: groups of %d ranks over %d "
                "ranks (a power of two that divides the ranks)", k, n_ranks);
    if (k == 1 || n_blocks == 0) return;
    const int grouped_end = n_blocks < 0 || n_blocks > n_ranks / k ? n_ranks : n_blocks * k;   /* ranks in groups */
    balance_assignment old = *a;
    const int64_t total_ids = (int64_t)k * old.rank_start[n_ranks], total_micro = (int64_t)k * old.rank_micro_start[n_ranks];
    a->ids = xmalloc((size_t)(total_ids > 0 ? total_ids : 1) * sizeof *a->ids);
    a->indices = xmalloc((size_t)(total_ids > 0 ? total_ids : 1) * sizeof *a->indices);
    a->micro_start = xmalloc((size_t)(total_micro + 1) * sizeof *a->micro_start);
    a->micro_group = xmalloc((size_t)(total_micro + 1) * sizeof *a->micro_group);
    a->rank_start = xmalloc((size_t)(n_ranks + 1) * sizeof *a->rank_start);
    a->rank_micro_start = xmalloc((size_t)(n_ranks + 1) * sizeof *a->rank_micro_start);
    a->predicted_seconds = xmalloc((size_t)n_ranks * sizeof *a->predicted_seconds);
    a->peak_mem_bytes = xmalloc((size_t)n_ranks * sizeof *a->peak_mem_bytes);
    a->capacity_ids = total_ids > 0 ? total_ids : 1;
    a->capacity_micro = total_micro + 1;
    int64_t n_ids = 0, n_micro = 0;
    for (int base = 0; base < grouped_end; base += k) write_block(&old, a, base, k, &n_ids, &n_micro);
    for (int rank = grouped_end; rank < n_ranks; rank++) write_block(&old, a, rank, 1, &n_ids, &n_micro);
    a->rank_start[n_ranks] = n_ids;
    a->rank_micro_start[n_ranks] = (int)n_micro;
    a->micro_start[n_micro] = n_ids;
    free(old.ids); free(old.indices); free(old.micro_start); free(old.micro_group); free(old.rank_start);
    free(old.rank_micro_start); free(old.predicted_seconds); free(old.peak_mem_bytes);
}
