/* shard_gpu.c — the sharded training state of the CUDA backend (ZeRO-1/2/3): held pieces, whole and gathered bf16 weights, staging slots, and the events that order the NCCL stream against the compute stream. */
#include "config.h"
#include "cuda/shard_gpu.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "cuda/fused.h"
#include "cuda/kernels_misc.h"

/* One unit of the cut: the embeddings (0), block l (1 + l), the head (1 + num_layers). */
typedef struct {
    int64_t first, len;      /* values [first, first + len) of the flat array */
    int64_t piece;           /* c = ceil(len / R): each rank's piece, padded */
    int64_t own_first;       /* this rank's piece starts at value own_first = first + r c (its held values are
                                [own_first, own_first + own_count), own_count <= c) */
    int64_t own_count;
    int64_t held_at;         /* the piece's place in the held arrays (master, moments, summed gradients) */
    int whole;               /* its bf16 weights are kept whole (R c values, an allocation of their own so that every
                                tensor in it is as aligned as the GEMMs need); 0: full's blocks */
} gpu_unit;

/* A run of held values with one weight decay: one AdamW launch. */
typedef struct { int64_t flat, held, count; int decays; } held_run;

/* One fp32 value range the model reads in fp32, and where it lies in the fp32-reads array. */
typedef struct { int64_t first, count, at; } fp32_range;

struct shard_gpu {
    const model *host;
    shard_layout layout;
    deck_shard mode;
    int rank, n_ranks, num_layers, n_units;
    gpu_unit *units;
    int64_t held;            /* s: the held arrays' length */
    gradsync *sync;
    cudaStream_t compute, comm;
    int own_comm;            /* comm is a stream of our own (no NCCL stream) */
    gpu_model *net;
    /* held, fp32 [s] */
    float *master, *adam_m, *adam_v, *summed, *ema; /* ema: NULL where [train] ema_decay is off */
    /* bf16 weights kept whole: whole[u] (R c values) of each unit kept whole, NULL elsewhere */
    gpu_bf16 **whole;
    int64_t whole_values;
    /* full: two bf16 slots of one block's weights (R c_b each), the block each holds (-1: none), and the block the
       model asked for last */
    gpu_bf16 *slot[2];
    int slot_block[2], asked_last;
    cudaEvent_t slot_free[2];   /* recorded on compute before a gather into the slot: its previous block's work */
    cudaEvent_t slot_ready[2];  /* recorded on comm after the gather into the slot */
    /* gradients: optimizer: whole fp32 [n]; gradients, full: the head's whole (R c_h) and two staging slots
       (stage_values = max(R c_b, R c_e) each) that take a block's, and the embeddings' in slot STAGE_EMBEDDINGS */
    float *whole_grads, *head_grads, *staging[2];
    int64_t stage_values;
    int staging_unit[2];             /* the unit whose gradients the slot takes (-1: none yet) */
    cudaEvent_t staging_filled[2];   /* recorded on compute when the unit's backward is queued */
    cudaEvent_t staging_reduced[2];  /* recorded on comm after the slot's reduce-scatter and accumulation */
    cudaEvent_t head_filled, head_reduced;
    cudaEvent_t compute_ready, comm_done; /* compute -> comm and comm -> compute at the step's edges */
    int rounds, rounds_done;
    /* full: staging slot STAGE_TIME holds the embeddings' fp32 masters, gathered since they last changed and not
       written since (time_gathered); time_free recorded on compute before the gather, time_ready on comm after it */
    int time_gathered;
    cudaEvent_t time_free, time_ready;
    /* the fp32 values the model reads in fp32, whole (the time path's not in full) */
    float *fp32_reads;
    int64_t fp32_values;
    fp32_range *fp32_ranges;
    int n_fp32_ranges;
    const float *time_reads, *head_modulation_reads; /* time_reads: NULL in full */
    const float **block_modulation, **block_norm3;
    held_run *runs;
    int n_runs;
};

static int sharded_grads(const shard_gpu *sh) { return sh->mode == SHARD_GRADIENTS || sh->mode == SHARD_FULL; }

/* The staging slot of the embeddings' gradients: their backward comes after block 0's (slot 0, still being
   reduce-scattered then), when block 1's slot is free again once its reduce-scatter is done. In full, the time
   path's weights are gathered into the other one. */
enum { STAGE_TIME = 0, STAGE_EMBEDDINGS = 1 };

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void *device_zeros(int64_t n_bytes)
{
    void *p = NULL;
    const size_t bytes = (size_t)(n_bytes > 0 ? n_bytes : 0);
    if (bytes == 0) return NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

static cudaEvent_t new_event(void)
{
    cudaEvent_t event;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

/* The unit holding values [first, first + count). */
static const gpu_unit *unit_of(const shard_gpu *sh, int64_t first, int64_t count)
{
    for (int u = 0; u < sh->n_units; u++) {
        const gpu_unit *unit = &sh->units[u];
        if (first >= unit->first && first < unit->first + unit->len && first + count <= unit->first + unit->len)
            return unit;
    }
    ALDIT_FATAL("cuda backend: values [%lld, %lld) do not lie inside one unit of the shard layout", (long long)first,
                (long long)(first + count));
}

/* The units of shard.h's cut, checked against shard_owned. */
static void make_units(shard_gpu *sh)
{
    const model_layout *layout = &sh->host->layout;
    const int64_t blocks_end = layout->blocks_offset + (int64_t)sh->num_layers * layout->block_stride;
    sh->n_units = sh->num_layers + 2;
    sh->units = xcalloc((size_t)sh->n_units, sizeof *sh->units);
    int64_t held_at = 0, whole_values = 0;
    for (int u = 0; u < sh->n_units; u++) {
        gpu_unit *unit = &sh->units[u];
        if (u == 0) unit->first = 0, unit->len = layout->blocks_offset;
        else if (u <= sh->num_layers)
            unit->first = layout->blocks_offset + (int64_t)(u - 1) * layout->block_stride, unit->len = layout->block_stride;
        else unit->first = blocks_end, unit->len = layout->n_weights - blocks_end;
        unit->piece = ceil_div(unit->len, sh->n_ranks);
        int64_t own_first = 0, own_count = 0;
        shard_owned(&sh->layout, sh->rank, unit->first, unit->len, &own_first, &own_count);
        unit->own_first = unit->first + (int64_t)sh->rank * unit->piece;
        unit->own_count = unit->first + unit->len - unit->own_first;
        if (unit->own_count > unit->piece) unit->own_count = unit->piece;
        if (unit->own_count < 0) unit->own_count = 0;
        ALDIT_CHECK(own_count == unit->own_count && (own_count == 0 || own_first == unit->own_first),
                    "cuda backend: unit %d's piece [%lld, +%lld) is not shard.h's [%lld, +%lld)", u,
                    (long long)unit->own_first, (long long)unit->own_count, (long long)own_first, (long long)own_count);
        unit->held_at = held_at;
        held_at += unit->piece;
        const int is_block = u >= 1 && u <= sh->num_layers;
        unit->whole = !(sh->mode == SHARD_FULL && is_block);
        if (unit->whole) whole_values += (int64_t)sh->n_ranks * unit->piece;
    }
    sh->held = held_at;
    sh->whole_values = whole_values;
    ALDIT_CHECK(sh->held == layout_shard_values(layout, LAYOUT_BACKEND_GPU, sh->n_ranks),
                "cuda backend: %lld held values, not the state formula's %lld", (long long)sh->held,
                (long long)layout_shard_values(layout, LAYOUT_BACKEND_GPU, sh->n_ranks));
}

/* The AdamW runs over the held values: each parameter's held part, adjacent ones of one decay merged. */
static void make_runs(shard_gpu *sh)
{
    const model *host = sh->host;
    sh->runs = xcalloc((size_t)(host->n_params > 0 ? host->n_params : 1), sizeof *sh->runs);
    sh->n_runs = 0;
    for (int p = 0; p < host->n_params; p++) {
        const param_info *param = &host->params[p];
        int64_t own_first = 0, own_count = 0;
        shard_owned(&sh->layout, sh->rank, param->offset, param->n_elements, &own_first, &own_count);
        if (own_count == 0) continue;
        const gpu_unit *unit = unit_of(sh, param->offset, param->n_elements);
        const held_run run = {own_first, unit->held_at + (own_first - unit->own_first), own_count,
                              optim_param_decays(param->name, param->ndim)};
        held_run *last = sh->n_runs > 0 ? &sh->runs[sh->n_runs - 1] : NULL;
        if (last && last->decays == run.decays && last->flat + last->count == run.flat &&
            last->held + last->count == run.held)
            last->count += run.count;
        else sh->runs[sh->n_runs++] = run;
    }
}

static fp32_range next_range(int64_t first, int64_t count, int64_t *at)
{
    const fp32_range range = {first, count, *at};
    *at += count;
    return range;
}

/* The fp32-reads array: the time path (not in full: gathered when the model asks, gathered_time_weights), the
   head's range, then each block's two (the layout's gpu_head_fp32, gpu_block_fp32: Wan's head.modulation, modulation
   and norm3; none for hunyuanvideo15, whose ranges are empty). */
static void make_fp32_reads(shard_gpu *sh)
{
    const model_layout *layout = &sh->host->layout;
    const int time_whole = sh->mode != SHARD_FULL;
    sh->n_fp32_ranges = time_whole + 1 + 2 * sh->num_layers;
    sh->fp32_ranges = xcalloc((size_t)sh->n_fp32_ranges, sizeof *sh->fp32_ranges);
    int64_t at = 0;
    int n = 0;
    if (time_whole)
        sh->fp32_ranges[n++] = next_range(layout->gpu_time_first, layout->blocks_offset - layout->gpu_time_first, &at);
    sh->fp32_ranges[n++] = next_range(layout->gpu_head_fp32.offset, layout->gpu_head_fp32.count, &at);
    const int first_block = n;
    for (int l = 0; l < sh->num_layers; l++) {
        const int64_t start = layout->blocks_offset + (int64_t)l * layout->block_stride;
        for (int k = 0; k < 2; k++)
            sh->fp32_ranges[n++] = next_range(start + layout->gpu_block_fp32[k].offset, layout->gpu_block_fp32[k].count, &at);
    }
    sh->fp32_values = at;
    ALDIT_CHECK(at == layout_gpu_fp32_read_values(layout, sh->mode), "cuda backend: %lld fp32 values read whole, not "
                "the state formula's %lld", (long long)at, (long long)layout_gpu_fp32_read_values(layout, sh->mode));
    sh->fp32_reads = device_zeros(at * (int64_t)sizeof(float));
    sh->time_reads = time_whole ? sh->fp32_reads + sh->fp32_ranges[0].at : NULL;
    sh->head_modulation_reads = sh->fp32_reads + sh->fp32_ranges[time_whole].at;
    const size_t layers = (size_t)(sh->num_layers > 0 ? sh->num_layers : 1);
    sh->block_modulation = xcalloc(layers, sizeof *sh->block_modulation);
    sh->block_norm3 = xcalloc(layers, sizeof *sh->block_norm3);
    for (int l = 0; l < sh->num_layers; l++) {
        sh->block_modulation[l] = sh->fp32_reads + sh->fp32_ranges[first_block + 2 * l].at;
        sh->block_norm3[l] = sh->fp32_reads + sh->fp32_ranges[first_block + 1 + 2 * l].at;
    }
}

/* ---- the model's parameter source ------------------------------------------------------------------------ */

static const gpu_unit *block_unit(const shard_gpu *sh, int layer)
{
    ALDIT_CHECK(layer >= 0 && layer < sh->num_layers, "cuda backend: block %d of %d", layer, sh->num_layers);
    return &sh->units[1 + layer];
}

/* Slot k (full) receives block `layer`: after the work queued on compute so far (which includes every read of the
   slot's previous block: the model asks for another block only once it is done queuing those), this rank's piece
   is written from its master into the slot's own segment and the slot all-gathered, on the NCCL stream. */
static void gather_block(shard_gpu *sh, int k, int layer)
{
    const gpu_unit *unit = block_unit(sh, layer);
    CUDA_CHECK(cudaEventRecord(sh->slot_free[k], sh->compute));
    CUDA_CHECK(cudaStreamWaitEvent(sh->comm, sh->slot_free[k], 0));
    misc_f32_to_bf16(sh->master + unit->held_at, unit->piece, sh->slot[k] + (int64_t)sh->rank * unit->piece, sh->comm);
    gradsync_all_gather_bf16(sh->sync, sh->slot[k], unit->piece);
    CUDA_CHECK(cudaEventRecord(sh->slot_ready[k], sh->comm));
    sh->slot_block[k] = layer;
}

static int slot_holding(const shard_gpu *sh, int layer)
{
    return layer < 0 ? -1 : sh->slot_block[0] == layer ? 0 : sh->slot_block[1] == layer ? 1 : -1;
}

static const gpu_bf16 *gathered_block_weights(void *context, int layer, int next, cudaStream_t stream)
{
    shard_gpu *sh = context;
    ALDIT_CHECK(stream == sh->compute, "cuda backend: the model runs on another stream than the sharded state's");
    int k = slot_holding(sh, layer);
    if (k < 0) {
        /* not prefetched: into the slot that holds neither the next block nor the one asked for last */
        const int keep = slot_holding(sh, next) >= 0 ? slot_holding(sh, next) : slot_holding(sh, sh->asked_last);
        k = keep == 0 ? 1 : 0;
        gather_block(sh, k, layer);
    }
    CUDA_CHECK(cudaStreamWaitEvent(sh->compute, sh->slot_ready[k], 0));
    if (next >= 0 && next != layer && slot_holding(sh, next) < 0) gather_block(sh, 1 - k, next);
    sh->asked_last = layer;
    return sh->slot[k];
}

static const gpu_bf16 *whole_block_weights(void *context, int layer, int next, cudaStream_t stream)
{
    (void)next;
    (void)stream;
    const shard_gpu *sh = context;
    block_unit(sh, layer);
    return sh->whole[1 + layer];
}

static float *whole_block_grads(void *context, int layer, cudaStream_t stream)
{
    (void)stream;
    const shard_gpu *sh = context;
    return sh->whole_grads + block_unit(sh, layer)->first;
}

static float *whole_embedding_grads(void *context, cudaStream_t stream)
{
    (void)stream;
    return ((const shard_gpu *)context)->whole_grads;
}

/* Staging slot k for unit `index`'s gradients (R c values used), zeroed on `stream` once the slot's last
   reduce-scatter is done. */
static float *stage(shard_gpu *sh, int k, int index, cudaStream_t stream)
{
    ALDIT_CHECK(stream == sh->compute, "cuda backend: the model runs on another stream than the sharded state's");
    CUDA_CHECK(cudaStreamWaitEvent(stream, sh->staging_reduced[k], 0));
    if (k == STAGE_TIME) { /* full: the time path's gather there is done and read (it was, before any backward) */
        CUDA_CHECK(cudaStreamWaitEvent(stream, sh->time_ready, 0));
        sh->time_gathered = 0;
    }
    CUDA_CHECK(cudaMemsetAsync(sh->staging[k], 0, (size_t)(sh->n_ranks * sh->units[index].piece) * sizeof(float),
                               stream));
    sh->staging_unit[k] = index;
    return sh->staging[k];
}

/* Staging slot layer mod 2. */
static float *staged_block_grads(void *context, int layer, cudaStream_t stream)
{
    shard_gpu *sh = context;
    block_unit(sh, layer);
    return stage(sh, layer % 2, 1 + layer, stream);
}

/* full: the embedding unit's fp32 masters all-gathered into staging slot STAGE_TIME (R c_e values, in place from
   this rank's piece) on the NCCL stream, after the work queued on compute so far (every earlier use of the slot on
   compute; the slot's reduce-scatters are earlier on the NCCL stream itself); time_ready recorded after it. */
static void gather_time(shard_gpu *sh)
{
    const gpu_unit *unit = &sh->units[0];
    float *slot = sh->staging[STAGE_TIME];
    CUDA_CHECK(cudaEventRecord(sh->time_free, sh->compute));
    CUDA_CHECK(cudaStreamWaitEvent(sh->comm, sh->time_free, 0));
    CUDA_CHECK(cudaMemcpyAsync(slot + (int64_t)sh->rank * unit->piece, sh->master + unit->held_at,
                               (size_t)unit->piece * sizeof(float), cudaMemcpyDeviceToDevice, sh->comm));
    gradsync_all_gather_f32(sh->sync, slot, unit->piece);
    CUDA_CHECK(cudaEventRecord(sh->time_ready, sh->comm));
    sh->time_gathered = 1;
}

/* Staging slot STAGE_EMBEDDINGS (the embedding unit starts at value 0: the slot's value i is value i). In full,
   the time path's gather for the backward that follows is queued now (after block 0's reduce-scatter). */
static float *staged_embedding_grads(void *context, cudaStream_t stream)
{
    shard_gpu *sh = context;
    float *grads = stage(sh, STAGE_EMBEDDINGS, 0, stream);
    if (sh->mode == SHARD_FULL && !sh->time_gathered) gather_time(sh);
    return grads;
}

static const float *whole_time_weights(void *context, int backward, cudaStream_t stream)
{
    (void)backward;
    (void)stream;
    return ((const shard_gpu *)context)->time_reads;
}

/* full: the time path's fp32 weights from staging slot STAGE_TIME, gathered now unless a gather is there (the
   compute stream waits for it). Exact: the held masters themselves. */
static const float *gathered_time_weights(void *context, int backward, cudaStream_t stream)
{
    (void)backward;
    shard_gpu *sh = context;
    ALDIT_CHECK(stream == sh->compute, "cuda backend: the model runs on another stream than the sharded state's");
    if (!sh->time_gathered) gather_time(sh);
    CUDA_CHECK(cudaStreamWaitEvent(stream, sh->time_ready, 0));
    return sh->staging[STAGE_TIME] + sh->host->layout.gpu_time_first;
}

/* The reduce-scatter of one unit's gradients in `values` (R c), after `filled` (recorded now on compute), and this
   rank's piece of the sum added into the summed gradient; `reduced` recorded on comm after it. */
static void reduce_unit(shard_gpu *sh, const gpu_unit *unit, float *values, cudaEvent_t filled, cudaEvent_t reduced,
                        cudaStream_t stream)
{
    CUDA_CHECK(cudaEventRecord(filled, stream));
    CUDA_CHECK(cudaStreamWaitEvent(sh->comm, filled, 0));
    gradsync_reduce_scatter_f32(sh->sync, values, unit->piece);
    misc_accumulate_f32(values + (int64_t)sh->rank * unit->piece, unit->piece, sh->summed + unit->held_at, sh->comm);
    CUDA_CHECK(cudaEventRecord(reduced, sh->comm));
}

/* gpu_grads_ready_fn (gradients, full): a block's or the embeddings' staging slot, or the head's gradients. */
static void unit_grads_ready(void *context, int64_t first, int64_t count, cudaStream_t stream)
{
    shard_gpu *sh = context;
    const gpu_unit *unit = unit_of(sh, first, count);
    ALDIT_CHECK(first == unit->first && count == unit->len, "cuda backend: gradients [%lld, +%lld) reported, not a unit",
                (long long)first, (long long)count);
    const int index = (int)(unit - sh->units);
    if (index == sh->n_units - 1) {
        reduce_unit(sh, unit, sh->head_grads, sh->head_filled, sh->head_reduced, stream);
        return;
    }
    const int k = index == 0 ? STAGE_EMBEDDINGS : (index - 1) % 2;
    ALDIT_CHECK(sh->staging_unit[k] == index, "cuda backend: unit %d's gradients are not in its staging slot", index);
    reduce_unit(sh, unit, sh->staging[k], sh->staging_filled[k], sh->staging_reduced[k], stream);
}

static void set_model_params(shard_gpu *sh)
{
    const gpu_unit *head = &sh->units[sh->n_units - 1];
    gpu_model_params p = {
        .embedding_weights = sh->whole[0],
        .head_weights = sh->whole[sh->n_units - 1],
        .head_modulation = sh->head_modulation_reads,
        .block_modulation = sh->block_modulation,
        .block_norm3 = sh->block_norm3,
        .block_weights = sh->mode == SHARD_FULL ? gathered_block_weights : whole_block_weights,
        .block_grads = sharded_grads(sh) ? staged_block_grads : whole_block_grads,
        .embedding_grads = sharded_grads(sh) ? staged_embedding_grads : whole_embedding_grads,
        .time_weights = sh->mode == SHARD_FULL ? gathered_time_weights : whole_time_weights,
        .head_grads = sharded_grads(sh) ? sh->head_grads : sh->whole_grads + head->first,
        .context = sh,
    };
    gpu_model_set_params(sh->net, &p);
}

/* ---- creation ----------------------------------------------------------------------------------------------- */

shard_gpu *shard_gpu_create(const model *host, const shard_layout *layout, gpu_model *net, gradsync *sync,
                            cudaStream_t compute, int ema)
{
    ALDIT_CHECK(layout->mode != SHARD_NONE && layout->mode != SHARD_AUTO && layout->n_values == host->n_weights &&
                layout->n_blocks == host->num_layers, "cuda backend: a sharded state needs a resolved unit layout");
    shard_gpu *sh = xcalloc(1, sizeof *sh);
    sh->host = host;
    sh->layout = *layout;
    sh->mode = layout->mode;
    sh->rank = layout->rank;
    sh->n_ranks = layout->n_ranks;
    sh->num_layers = host->num_layers;
    sh->sync = sync;
    sh->net = net;
    sh->compute = compute;
    if (gradsync_has_stream(sync)) sh->comm = gradsync_stream(sync);
    else {
        ALDIT_CHECK(sh->n_ranks == 1, "cuda backend: a sharded state over %d ranks needs NCCL", sh->n_ranks);
        CUDA_CHECK(cudaStreamCreateWithFlags(&sh->comm, cudaStreamNonBlocking));
        sh->own_comm = 1;
    }
    make_units(sh);
    make_runs(sh);
    make_fp32_reads(sh);
    const int64_t s = sh->held, f = (int64_t)sizeof(float);
    sh->master = device_zeros(s * f);
    sh->adam_m = device_zeros(s * f);
    sh->adam_v = device_zeros(s * f);
    if (ema) sh->ema = device_zeros(s * f);
    sh->whole = xcalloc((size_t)sh->n_units, sizeof *sh->whole);
    for (int u = 0; u < sh->n_units; u++)
        if (sh->units[u].whole)
            sh->whole[u] = device_zeros(sh->n_ranks * sh->units[u].piece * (int64_t)sizeof(gpu_bf16));
    const int64_t block_values = sh->num_layers > 0 ? sh->n_ranks * sh->units[1].piece : 0;
    const int64_t embedding_values = sh->n_ranks * sh->units[0].piece;
    sh->stage_values = sharded_grads(sh) ? (block_values > embedding_values ? block_values : embedding_values) : 0;
    sh->slot_block[0] = sh->slot_block[1] = sh->asked_last = -1;
    sh->staging_unit[0] = sh->staging_unit[1] = -1;
    for (int k = 0; k < 2; k++) {
        if (sh->mode == SHARD_FULL) sh->slot[k] = device_zeros(block_values * (int64_t)sizeof(gpu_bf16));
        sh->staging[k] = device_zeros(sh->stage_values * f);
        sh->slot_free[k] = new_event();
        sh->slot_ready[k] = new_event();
        sh->staging_filled[k] = new_event();
        sh->staging_reduced[k] = new_event();
    }
    if (sharded_grads(sh)) {
        sh->head_grads = device_zeros(sh->n_ranks * sh->units[sh->n_units - 1].piece * f);
        sh->summed = device_zeros(s * f);
    } else sh->whole_grads = device_zeros(host->n_weights * f);
    sh->head_filled = new_event();
    sh->head_reduced = new_event();
    sh->compute_ready = new_event();
    sh->comm_done = new_event();
    sh->time_free = new_event();
    sh->time_ready = new_event();
    set_model_params(sh);
    CUDA_CHECK(cudaDeviceSynchronize()); /* the zeroing (legacy stream) before any work on the NCCL stream */
    return sh;
}

void shard_gpu_free(shard_gpu *sh)
{
    if (!sh) return;
    CUDA_CHECK(cudaStreamSynchronize(sh->comm));
    CUDA_CHECK(cudaStreamSynchronize(sh->compute));
    void *buffers[] = {sh->master, sh->adam_m, sh->adam_v, sh->summed, sh->slot[0], sh->slot[1], sh->whole_grads,
                       sh->head_grads, sh->staging[0], sh->staging[1], sh->fp32_reads};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++) CUDA_CHECK(cudaFree(buffers[i]));
    CUDA_CHECK(cudaFree(sh->ema));
    for (int u = 0; u < sh->n_units; u++) CUDA_CHECK(cudaFree(sh->whole[u]));
    free(sh->whole);
    cudaEvent_t events[] = {sh->slot_free[0], sh->slot_free[1], sh->slot_ready[0], sh->slot_ready[1],
                            sh->staging_filled[0], sh->staging_filled[1], sh->staging_reduced[0],
                            sh->staging_reduced[1], sh->head_filled, sh->head_reduced, sh->compute_ready,
                            sh->comm_done, sh->time_free, sh->time_ready};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++) CUDA_CHECK(cudaEventDestroy(events[i]));
    if (sh->own_comm) CUDA_CHECK(cudaStreamDestroy(sh->comm));
    free(sh->units);
    free(sh->runs);
    free(sh->fp32_ranges);
    free(sh->block_modulation);
    free(sh->block_norm3);
    free(sh);
}

layout_state_bytes shard_gpu_bytes(const shard_gpu *sh)
{
    const double f = sizeof(float), h = sizeof(gpu_bf16), s = (double)sh->held;
    const double block_values = sh->num_layers > 0 ? (double)sh->n_ranks * (double)sh->units[1].piece : 0.0;
    layout_state_bytes bytes = {.weights = h * (double)sh->whole_values, .master = f * (s + (double)sh->fp32_values),
                                .moments = 2.0 * f * s};
    if (sh->ema) bytes.ema = f * s;
    if (sh->mode == SHARD_FULL) bytes.gathered = 2.0 * h * block_values;
    const double head = (double)sh->n_ranks * (double)sh->units[sh->n_units - 1].piece;
    if (sharded_grads(sh)) bytes.gradients = f * (head + 2.0 * (double)sh->stage_values + s);
    else bytes.gradients = f * (double)sh->host->n_weights;
    return bytes;
}

float *shard_gpu_range(const shard_gpu *sh, backend_group group, int64_t first, int64_t count)
{
    const gpu_unit *unit = unit_of(sh, first, count);
    ALDIT_CHECK(first >= unit->own_first && first + count <= unit->own_first + unit->own_count,
                "cuda backend: values [%lld, %lld) are not all this rank's", (long long)first, (long long)(first + count));
    const int64_t at = unit->held_at + (first - unit->own_first);
    switch (group) {
    case BACKEND_WEIGHTS: return sh->master + at;
    case BACKEND_ADAM_M: return sh->adam_m + at;
    case BACKEND_ADAM_V: return sh->adam_v + at;
    case BACKEND_EMA:
        if (sh->ema) return sh->ema + at;
        ALDIT_FATAL("cuda backend: this run keeps no EMA ([train] ema_decay = off)");
    default: ALDIT_FATAL("cuda backend: the sharded state keeps no state group %d", (int)group);
    }
}

float *shard_gpu_whole_grads(const shard_gpu *sh) { return sh->whole_grads; }

void shard_gpu_set_model(shard_gpu *sh, gpu_model *net)
{
    sh->net = net;
    set_model_params(sh);
}

/* ---- the weights the model computes with, from the held masters -------------------------------------------------- */

/* Queued on compute, then comm, then compute again: the bf16 copies of the whole units and the fp32 reads, made from
   the held masters and gathered over the ranks; the full mode's gathered blocks and time path are stale after it,
   and the time path's gather for the next forward is queued on comm behind it (the compute stream does not wait
   for that one here). */
static void publish_weights(shard_gpu *sh)
{
    sh->time_gathered = 0;
    for (int u = 0; u < sh->n_units; u++) {
        const gpu_unit *unit = &sh->units[u];
        if (unit->whole)
            misc_f32_to_bf16(sh->master + unit->held_at, unit->piece, sh->whole[u] + (int64_t)sh->rank * unit->piece,
                             sh->compute);
    }
    /* the fp32 reads: this rank's values, zeros elsewhere, summed over the ranks (exact: one value and zeros) */
    if (sh->fp32_values > 0)   /* none in full for a family without fp32 block reads (hunyuanvideo15) */
        CUDA_CHECK(cudaMemsetAsync(sh->fp32_reads, 0, (size_t)sh->fp32_values * sizeof(float), sh->compute));
    for (int i = 0; i < sh->n_fp32_ranges; i++) {
        const fp32_range *range = &sh->fp32_ranges[i];
        int64_t own_first = 0, own_count = 0;
        shard_owned(&sh->layout, sh->rank, range->first, range->count, &own_first, &own_count);
        if (own_count == 0) continue;
        CUDA_CHECK(cudaMemcpyAsync(sh->fp32_reads + range->at + (own_first - range->first),
                                   shard_gpu_range(sh, BACKEND_WEIGHTS, own_first, own_count),
                                   (size_t)own_count * sizeof(float), cudaMemcpyDeviceToDevice, sh->compute));
    }
    CUDA_CHECK(cudaEventRecord(sh->compute_ready, sh->compute));
    CUDA_CHECK(cudaStreamWaitEvent(sh->comm, sh->compute_ready, 0));
    gradsync_sum_f32(sh->sync, sh->fp32_reads, sh->fp32_values);
    for (int u = 0; u < sh->n_units; u++) {
        if (sh->units[u].whole) gradsync_all_gather_bf16(sh->sync, sh->whole[u], sh->units[u].piece);
    }
    CUDA_CHECK(cudaEventRecord(sh->comm_done, sh->comm));
    CUDA_CHECK(cudaStreamWaitEvent(sh->compute, sh->comm_done, 0));
    sh->slot_block[0] = sh->slot_block[1] = sh->asked_last = -1;
    if (sh->mode == SHARD_FULL) gather_time(sh);
}

void shard_gpu_swap_ema(shard_gpu *sh)
{
    ALDIT_CHECK(sh->ema, "cuda backend: a validation with the EMA, but this run keeps none ([train] ema_decay = off)");
    float *master = sh->master;
    sh->master = sh->ema;
    sh->ema = master;
    publish_weights(sh);
}

void shard_gpu_start(shard_gpu *sh, int ema_set)
{
    CUDA_CHECK(cudaDeviceSynchronize()); /* the set_range copies */
    if (sh->ema && !ema_set)
        CUDA_CHECK(cudaMemcpy(sh->ema, sh->master, (size_t)sh->held * sizeof(float), cudaMemcpyDeviceToDevice));
    publish_weights(sh);
    CUDA_CHECK(cudaStreamSynchronize(sh->compute));
}

/* ---- a step ------------------------------------------------------------------------------------------------------- */

void shard_gpu_begin_step(shard_gpu *sh, int rounds)
{
    sh->rounds = rounds;
    sh->rounds_done = 0;
    if (sharded_grads(sh)) CUDA_CHECK(cudaMemsetAsync(sh->summed, 0, (size_t)sh->held * sizeof(float), sh->compute));
    else CUDA_CHECK(cudaMemsetAsync(sh->whole_grads, 0, (size_t)sh->host->n_weights * sizeof(float), sh->compute));
    /* the comm stream's accumulation into `summed` comes after this zeroing */
    CUDA_CHECK(cudaEventRecord(sh->compute_ready, sh->compute));
    CUDA_CHECK(cudaStreamWaitEvent(sh->comm, sh->compute_ready, 0));
}

void shard_gpu_before_micro_batch(shard_gpu *sh)
{
    if (!sharded_grads(sh)) return;
    CUDA_CHECK(cudaStreamWaitEvent(sh->compute, sh->head_reduced, 0));
    CUDA_CHECK(cudaMemsetAsync(sh->head_grads, 0, (size_t)(sh->n_ranks * sh->units[sh->n_units - 1].piece) *
                               sizeof(float), sh->compute));
    gpu_model_set_grads_ready(sh->net, unit_grads_ready, sh);
    sh->rounds_done++;
}

void shard_gpu_sum_gradients(shard_gpu *sh)
{
    if (!sharded_grads(sh)) return;
    ALDIT_CHECK(sh->rounds_done <= sh->rounds, "cuda backend: %d micro-batches in a step of at most %d",
                sh->rounds_done, sh->rounds);
    while (sh->rounds_done < sh->rounds) { /* the same collectives as a micro-batch, adding zeros */
        shard_gpu_before_micro_batch(sh);
        gpu_model_grads_ready_all(sh->net, sh->compute);
    }
    gpu_model_set_grads_ready(sh->net, NULL, NULL);
    CUDA_CHECK(cudaEventRecord(sh->comm_done, sh->comm));
    CUDA_CHECK(cudaStreamWaitEvent(sh->compute, sh->comm_done, 0));
}

void shard_gpu_finish_step(shard_gpu *sh, const adamw_step *hyper, double weight_decay, double grad_clip, int update,
                           double ema_decay, double *sumsq, double *grad_norm, float *clip_scale,
                           void *sumsq_workspace)
{
    if (sharded_grads(sh)) { /* this rank's pieces (zero past its values), summed over the ranks */
        fused_sumsq(sh->summed, sh->held, sumsq, sumsq_workspace, sh->compute);
        CUDA_CHECK(cudaEventRecord(sh->compute_ready, sh->compute));
        CUDA_CHECK(cudaStreamWaitEvent(sh->comm, sh->compute_ready, 0));
        gradsync_sum_f64(sh->sync, sumsq, 1);
        CUDA_CHECK(cudaEventRecord(sh->comm_done, sh->comm));
        CUDA_CHECK(cudaStreamWaitEvent(sh->compute, sh->comm_done, 0));
    } else fused_sumsq(sh->whole_grads, sh->host->n_weights, sumsq, sumsq_workspace, sh->compute);
    /* the gradients already carry 1 / global samples (grad_scale of the micro-batches), as on the CPU */
    fused_clip_scale(sumsq, 1.0, grad_clip, clip_scale, grad_norm, sh->compute);
    if (!update) return;
    for (int r = 0; r < sh->n_runs; r++) {
        const held_run *run = &sh->runs[r];
        const float *grads = sharded_grads(sh) ? sh->summed + run->held : sh->whole_grads + run->flat;
        fused_adamw(hyper, run->decays ? weight_decay : 0.0, sh->master + run->held, NULL, grads, sh->adam_m + run->held,
                    sh->adam_v + run->held, run->count, 1.0f, clip_scale, sh->compute);
    }
    /* queued behind AdamW; a non-finite clip scale (AdamW skipped on the device) skips it too */
    if (sh->ema) misc_ema_update(sh->ema, sh->master, sh->held, ema_decay, clip_scale, sh->compute);
    publish_weights(sh);
}
