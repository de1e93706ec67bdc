/* state.c — the training state streamed between checkpoint files and the backend, tensor by tensor, over the ranks that hold it. */
#include "train/state.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "train/watchdog.h"

_Static_assert((int)BACKEND_WEIGHTS == (int)CHECKPOINT_WEIGHTS && (int)BACKEND_ADAM_M == (int)CHECKPOINT_ADAM_M &&
                   (int)BACKEND_ADAM_V == (int)CHECKPOINT_ADAM_V && (int)BACKEND_EMA == (int)CHECKPOINT_EMA,
               "backend and checkpoint groups are the same arrays in the same order");

/* Scratch for one tensor (rank 0: a whole one; others: the part they hold), and every rank's part of the
   current tensor. */
typedef struct {
    float *tensor, *mine;
    int64_t *counts, *displs; /* n_ranks each: every rank's part, from the tensor's first value */
    int64_t own_first, own_count;
    int rank, n_ranks;
} stream;

static stream stream_open(const model *table)
{
    stream s = {.rank = comm_rank(), .n_ranks = comm_size()};
    int64_t largest = 1;
    for (int p = 0; p < table->n_params; p++)
        if (table->params[p].n_elements > largest) largest = table->params[p].n_elements;
    s.tensor = xmalloc((size_t)largest * sizeof(float));
    s.mine = xmalloc((size_t)largest * sizeof(float));
    s.counts = xmalloc(2 * (size_t)s.n_ranks * sizeof(int64_t));
    s.displs = s.counts + s.n_ranks;
    return s;
}

static void stream_close(stream *s)
{
    free(s->tensor);
    free(s->mine);
    free(s->counts);
}

/* Every rank's part of parameter p under `layout`. */
static void parts_of(stream *s, const shard_layout *layout, const param_info *p)
{
    for (int r = 0; r < s->n_ranks; r++) {
        int64_t first, count;
        shard_owned(layout, r, p->offset, p->n_elements, &first, &count);
        s->counts[r] = count;
        s->displs[r] = first - p->offset;
        if (r == s->rank) s->own_first = first, s->own_count = count;
    }
}

/* Rank 0 read parameter p into s->tensor (status: its outcome, the same on every rank after this); the holders
   get their parts. */
static void send_to_holders(stream *s, backend *dev, const shard_layout *layout, backend_group group,
                            const param_info *p)
{
    if (layout->mode == SHARD_NONE) {
        comm_bcast_bytes(s->tensor, (size_t)p->n_elements * sizeof(float));
        dev->ops->set_range(dev, group, p->offset, p->n_elements, s->tensor);
        return;
    }
    parts_of(s, layout, p);
    comm_scatterv_f32(s->rank == 0 ? s->tensor : NULL, s->counts, s->displs, s->mine);
    if (s->own_count > 0) dev->ops->set_range(dev, group, s->own_first, s->own_count, s->mine);
}

/* The random init of the weights: each rank makes the tensors it holds a part of. */
static void random_weights(stream *s, backend *dev, const shard_layout *layout, const model *table, uint64_t seed)
{
    for (int i = 0; i < table->n_params; i++) {
        const param_info *p = &table->params[i];
        int64_t first, count;
        shard_owned(layout, s->rank, p->offset, p->n_elements, &first, &count);
        if (count == 0) continue;
        model_init_random_param(table, seed, i, s->tensor);
        dev->ops->set_range(dev, BACKEND_WEIGHTS, first, count, s->tensor + (first - p->offset));
        watchdog_progress();
    }
}

int state_load(backend *dev, const model *table, checkpoint_reader *reader, unsigned groups, uint64_t seed)
{
    const shard_layout *layout = dev->ops->layout(dev);
    stream s = stream_open(table);
    int status = 0;
    if (!(groups & CHECKPOINT_GROUP_BIT(CHECKPOINT_WEIGHTS))) random_weights(&s, dev, layout, table, seed);
    for (int g = 0; g < CHECKPOINT_N_GROUPS && status == 0; g++) {
        if (!(groups & CHECKPOINT_GROUP_BIT(g))) continue;
        for (int i = 0; i < table->n_params && status == 0; i++) {
            const param_info *p = &table->params[i];
            if (s.rank == 0) status = checkpoint_read_tensor(reader, (checkpoint_group)g, p->name, s.tensor);
            comm_bcast_bytes(&status, sizeof status);
            if (status == 0) send_to_holders(&s, dev, layout, (backend_group)g, p);
            watchdog_progress();
        }
    }
    stream_close(&s);
    return status != 0;
}

int state_save(const backend *dev, const model *table, checkpoint_writer *writer, unsigned groups)
{
    const shard_layout *layout = dev->ops->layout(dev);
    stream s = stream_open(table);
    int status = 0;
    for (int g = 0; g < CHECKPOINT_N_GROUPS && status == 0; g++) {
        if (!(groups & CHECKPOINT_GROUP_BIT(g))) continue;
        for (int i = 0; i < table->n_params && status == 0; i++) {
            const param_info *p = &table->params[i];
            if (layout->mode == SHARD_NONE) { /* rank 0 holds it all */
                if (s.rank == 0) dev->ops->get_range(dev, (backend_group)g, p->offset, p->n_elements, s.tensor);
            } else {
                parts_of(&s, layout, p);
                if (s.own_count > 0) dev->ops->get_range(dev, (backend_group)g, s.own_first, s.own_count, s.mine);
                comm_gatherv_f32(s.mine, s.counts, s.displs, s.rank == 0 ? s.tensor : NULL);
            }
            if (s.rank == 0) status = checkpoint_write_tensor(writer, (checkpoint_group)g, p->name, s.tensor);
            /* every rank learns each tensor's outcome: a failure ends the stream everywhere, and a rank that waits
               here for rank 0's write waits one tensor long (the watch's deadline is per wait: watchdog.h) */
            comm_bcast_bytes(&status, sizeof status);
            watchdog_progress();
        }
    }
    stream_close(&s);
    return status;
}
