/* ulysses.c — Ulysses sequence parallelism's shared pieces (ulysses.h): the group's check, the row split and the exchange between rows and heads over comm_group_alltoallv_f32. */
#include "model/ulysses.h"
#include "core/check.h"

#include <string.h>

void ulysses_check_group(const model *m, const model_batch *batch)
{
    const int k = batch->sp_size;
    if (k <= 1) return;   /* 0 (a zeroed batch) or 1: this rank alone */
    ALDIT_CHECK(batch->sp_rank >= 0 && batch->sp_rank < k, "model: member %d of a group of %d ranks", batch->sp_rank, k);
    if (m->num_heads % k != 0)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: a sequence-parallel group of %d ranks needs num_heads (%d) to be a "
                         "multiple of it: use a group size that divides the heads", k, m->num_heads);
    ALDIT_CHECK(batch->sp_group && comm_group_size(batch->sp_group) == k &&
                    comm_group_rank(batch->sp_group) == batch->sp_rank,
                "model: the micro-batch names member %d of a group of %d ranks, but its communicator %s", batch->sp_rank,
                k, batch->sp_group ? "is another group's" : "is missing (comm_groups_init not called for it?)");
}

void ulysses_split(int64_t total, int k, int64_t *starts)
{
    for (int p = 0; p <= k; p++) starts[p] = total * p / k;
}

/* The exchange's counts and displacements (floats): this member's rows' columns for each member (by_member[p]:
   n * w at p * n * w) and each member's rows of this member's columns (by_rows[p]: its row count * w at its first
   row * w). */
static void exchange_counts(const int64_t *starts, int k, int member, int64_t w, int64_t *by_member, int64_t *by_rows)
{
    const int64_t n = starts[member + 1] - starts[member];
    for (int p = 0; p < k; p++) {
        by_member[p] = n * w;
        by_member[k + p] = p * n * w;
        by_rows[p] = (starts[p + 1] - starts[p]) * w;
        by_rows[k + p] = starts[p] * w;
    }
}

void ulysses_to_heads(const comm_group *group, const int64_t *starts, int64_t width, const float *local, float *all,
                      float *xchg, int64_t *counts)
{
    const int k = comm_group_size(group), member = comm_group_rank(group);
    ALDIT_CHECK(width % k == 0, "ulysses: rows of width %lld do not split over %d members' heads", (long long)width, k);
    const int64_t n = starts[member + 1] - starts[member], w = width / k;
    for (int p = 0; p < k; p++)
        for (int64_t r = 0; r < n; r++) memcpy(xchg + (p * n + r) * w, local + r * width + p * w, (size_t)w * sizeof(float));
    exchange_counts(starts, k, member, w, counts, counts + 2 * k);
    comm_group_alltoallv_f32(group, xchg, counts, counts + k, all, counts + 2 * k, counts + 3 * k);
}

void ulysses_to_rows(const comm_group *group, const int64_t *starts, int64_t width, const float *all, float *local,
                     float *xchg, int64_t *counts)
{
    const int k = comm_group_size(group), member = comm_group_rank(group);
    ALDIT_CHECK(width % k == 0, "ulysses: rows of width %lld do not split over %d members' heads", (long long)width, k);
    const int64_t n = starts[member + 1] - starts[member], w = width / k;
    exchange_counts(starts, k, member, w, counts + 2 * k, counts);
    comm_group_alltoallv_f32(group, all, counts, counts + k, xchg, counts + 2 * k, counts + 3 * k);
    for (int p = 0; p < k; p++)
        for (int64_t r = 0; r < n; r++) memcpy(local + r * width + p * w, xchg + (p * n + r) * w, (size_t)w * sizeof(float));
}
