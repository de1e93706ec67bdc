/* layout.c — each family's parameter table (one static description per family) and its exact activation-memory formula. */
#include "model/layout.h"
#include "core/check.h"

#include <stddef.h>
#include <string.h>

/* ---- the parameter table ------------------------------------------------------------------------ */

/* Symbols of a shape's entries, resolved against the dims. */
typedef enum {
    X_END, X_1, X_2, X_6, X_D, X_6D, X_F, X_IN, X_PT, X_PH, X_PW, X_TEXT, X_FREQ, X_OUT_PATCH,
    X_2D, X_4D, X_HEAD, X_TYPES, X_TEXT2, X_IMAGE, X_BYT5
} dim_symbol;
typedef enum { WHEN_ALWAYS, WHEN_QK_NORM, WHEN_CROSS_ATTN_NORM } condition;
typedef enum { PART_EMBEDDING, PART_BLOCK, PART_HEAD } part;

typedef struct {
    part where;
    const char *name;
    dim_symbol shape[LAYOUT_MAX_NDIM + 1];   /* X_END-terminated */
    layout_init init;
    layout_rows rows;
    condition when;
    size_t field;   /* where its offset goes: in model_layout (embedding, head) or layout_block (block) */
} tensor_spec;

#define EMB(name, field, init, rows, ...) {PART_EMBEDDING, name, {__VA_ARGS__, X_END}, init, rows, WHEN_ALWAYS, offsetof(model_layout, field)}
#define BLK(name, field, init, rows, when, ...) {PART_BLOCK, name, {__VA_ARGS__, X_END}, init, rows, when, offsetof(layout_block, field)}
#define HEAD(name, field, init, rows, ...) {PART_HEAD, name, {__VA_ARGS__, X_END}, init, rows, WHEN_ALWAYS, offsetof(model_layout, field)}
#define ATTENTION(module, m, k_rows)                                                                                \
    BLK(module ".q.weight", m##_q.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS, WHEN_ALWAYS, X_D, X_D),           \
    BLK(module ".q.bias", m##_q.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_D),                         \
    BLK(module ".k.weight", m##_k.weight, LAYOUT_INIT_XAVIER, k_rows, WHEN_ALWAYS, X_D, X_D),                       \
    BLK(module ".k.bias", m##_k.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_D),                         \
    BLK(module ".v.weight", m##_v.weight, LAYOUT_INIT_XAVIER, k_rows, WHEN_ALWAYS, X_D, X_D),                       \
    BLK(module ".v.bias", m##_v.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_D),                         \
    BLK(module ".o.weight", m##_o.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS, WHEN_ALWAYS, X_D, X_D),           \
    BLK(module ".o.bias", m##_o.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_D),                         \
    BLK(module ".norm_q.weight", m##_norm_q, LAYOUT_INIT_ONE, LAYOUT_ROWS_NONE, WHEN_QK_NORM, X_D),                  \
    BLK(module ".norm_k.weight", m##_norm_k, LAYOUT_INIT_ONE, LAYOUT_ROWS_NONE, WHEN_QK_NORM, X_D)

/* Wan's state_dict order: a module's own parameters first, then its children in order. Linear weights are
   [out, in]. Cross-attention's k and v project the text rows. */
static const tensor_spec wan_tensors[] = {
    EMB("patch_embedding.weight", patch.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS, X_D, X_IN, X_PT, X_PH, X_PW),
    EMB("patch_embedding.bias", patch.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_D),
    EMB("text_embedding.0.weight", text_in.weight, LAYOUT_INIT_NORMAL_STD, LAYOUT_ROWS_TEXT, X_D, X_TEXT),
    EMB("text_embedding.0.bias", text_in.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_D),
    EMB("text_embedding.2.weight", text_out.weight, LAYOUT_INIT_NORMAL_STD, LAYOUT_ROWS_TEXT, X_D, X_D),
    EMB("text_embedding.2.bias", text_out.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_D),
    EMB("time_embedding.0.weight", time_in.weight, LAYOUT_INIT_NORMAL_STD, LAYOUT_ROWS_SAMPLES, X_D, X_FREQ),
    EMB("time_embedding.0.bias", time_in.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_D),
    EMB("time_embedding.2.weight", time_out.weight, LAYOUT_INIT_NORMAL_STD, LAYOUT_ROWS_SAMPLES, X_D, X_D),
    EMB("time_embedding.2.bias", time_out.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_D),
    EMB("time_projection.1.weight", time_projection.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_SAMPLES, X_6D, X_D),
    EMB("time_projection.1.bias", time_projection.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_6D),
    BLK("modulation", modulation, LAYOUT_INIT_MODULATION, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_1, X_6, X_D),
    ATTENTION("self_attn", self, LAYOUT_ROWS_TOKENS),
    BLK("norm3.weight", norm3_weight, LAYOUT_INIT_ONE, LAYOUT_ROWS_NONE, WHEN_CROSS_ATTN_NORM, X_D),
    BLK("norm3.bias", norm3_bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_CROSS_ATTN_NORM, X_D),
    ATTENTION("cross_attn", cross, LAYOUT_ROWS_TEXT),
    BLK("ffn.0.weight", ffn_in.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS, WHEN_ALWAYS, X_F, X_D),
    BLK("ffn.0.bias", ffn_in.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_F),
    BLK("ffn.2.weight", ffn_out.weight, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS, WHEN_ALWAYS, X_D, X_F),
    BLK("ffn.2.bias", ffn_out.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, X_D),
    HEAD("head.modulation", head_modulation, LAYOUT_INIT_MODULATION, LAYOUT_ROWS_NONE, X_1, X_2, X_D),
    HEAD("head.head.weight", head.weight, LAYOUT_INIT_ZERO, LAYOUT_ROWS_TOKENS, X_OUT_PATCH, X_D),
    HEAD("head.head.bias", head.bias, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, X_OUT_PATCH),
};

/* HunyuanVideo-1.5: diffusers' HunyuanVideo15Transformer3DModel state_dict order and names. Video rows are
   tokens, the joint text (image, ByT5, Qwen tokens) text rows. */
#define LIN(part, name, field, rows, out, in)                                                                      \
    {part, name ".weight", {out, in, X_END}, LAYOUT_INIT_XAVIER, rows, WHEN_ALWAYS, offsetof(model_layout, field.weight)}, \
    {part, name ".bias", {out, X_END}, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, offsetof(model_layout, field.bias)}
#define NORM(part, name, field, width)                                                                             \
    {part, name ".weight", {width, X_END}, LAYOUT_INIT_ONE, LAYOUT_ROWS_NONE, WHEN_ALWAYS, offsetof(model_layout, field##_weight)}, \
    {part, name ".bias", {width, X_END}, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, offsetof(model_layout, field##_bias)}
#define MB(field) offsetof(layout_mmdit_block, field)
#define BLIN(name, field, rows, out, in)                                                                           \
    {PART_BLOCK, name ".weight", {out, in, X_END}, LAYOUT_INIT_XAVIER, rows, WHEN_ALWAYS, MB(field.weight)},     \
    {PART_BLOCK, name ".bias", {out, X_END}, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS, MB(field.bias)}
#define BNORM(name, field) {PART_BLOCK, name ".weight", {X_HEAD, X_END}, LAYOUT_INIT_ONE, LAYOUT_ROWS_NONE, WHEN_ALWAYS, MB(field)}
#define REFINER(i)                                                                                                 \
    NORM(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".norm1", mmdit.refiner[i].norm1, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".attn.to_q", mmdit.refiner[i].q, LAYOUT_ROWS_TEXT, X_D, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".attn.to_k", mmdit.refiner[i].k, LAYOUT_ROWS_TEXT, X_D, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".attn.to_v", mmdit.refiner[i].v, LAYOUT_ROWS_TEXT, X_D, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".attn.to_out.0", mmdit.refiner[i].o, LAYOUT_ROWS_TEXT, X_D, X_D), \
    NORM(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".norm2", mmdit.refiner[i].norm2, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".ff.net.0.proj", mmdit.refiner[i].ff_in, LAYOUT_ROWS_TEXT, X_4D, X_D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".ff.net.2", mmdit.refiner[i].ff_out, LAYOUT_ROWS_TEXT, X_D, X_4D), \
    LIN(PART_EMBEDDING, "context_embedder.token_refiner.refiner_blocks." #i ".norm_out.linear", mmdit.refiner[i].ada, LAYOUT_ROWS_SAMPLES, X_2D, X_D)

static const tensor_spec mmdit_tensors[] = {
    {PART_EMBEDDING, "x_embedder.proj.weight", {X_D, X_IN, X_PT, X_PH, X_PW, X_END}, LAYOUT_INIT_XAVIER, LAYOUT_ROWS_TOKENS,
     WHEN_ALWAYS, offsetof(model_layout, mmdit.patch.weight)},
    {PART_EMBEDDING, "x_embedder.proj.bias", {X_D, X_END}, LAYOUT_INIT_ZERO, LAYOUT_ROWS_NONE, WHEN_ALWAYS,
     offsetof(model_layout, mmdit.patch.bias)},
    NORM(PART_EMBEDDING, "image_embedder.norm_in", mmdit.image_norm_in, X_IMAGE),
    LIN(PART_EMBEDDING, "image_embedder.linear_1", mmdit.image_1, LAYOUT_ROWS_TEXT, X_IMAGE, X_IMAGE),
    LIN(PART_EMBEDDING, "image_embedder.linear_2", mmdit.image_2, LAYOUT_ROWS_TEXT, X_D, X_IMAGE),
    NORM(PART_EMBEDDING, "image_embedder.norm_out", mmdit.image_norm_out, X_D),
    LIN(PART_EMBEDDING, "context_embedder.time_text_embed.timestep_embedder.linear_1", mmdit.refiner_time_1, LAYOUT_ROWS_SAMPLES, X_D, X_FREQ),
    LIN(PART_EMBEDDING, "context_embedder.time_text_embed.timestep_embedder.linear_2", mmdit.refiner_time_2, LAYOUT_ROWS_SAMPLES, X_D, X_D),
    LIN(PART_EMBEDDING, "context_embedder.time_text_embed.text_embedder.linear_1", mmdit.refiner_text_1, LAYOUT_ROWS_SAMPLES, X_D, X_TEXT),
    LIN(PART_EMBEDDING, "context_embedder.time_text_embed.text_embedder.linear_2", mmdit.refiner_text_2, LAYOUT_ROWS_SAMPLES, X_D, X_D),
    LIN(PART_EMBEDDING, "context_embedder.proj_in", mmdit.refiner_proj_in, LAYOUT_ROWS_TEXT, X_D, X_TEXT),
    REFINER(0),
    REFINER(1),
    NORM(PART_EMBEDDING, "context_embedder_2.norm", mmdit.byt5_norm, X_TEXT2),
    LIN(PART_EMBEDDING, "context_embedder_2.linear_1", mmdit.byt5_1, LAYOUT_ROWS_TEXT, X_BYT5, X_TEXT2),
    LIN(PART_EMBEDDING, "context_embedder_2.linear_2", mmdit.byt5_2, LAYOUT_ROWS_TEXT, X_BYT5, X_BYT5),
    LIN(PART_EMBEDDING, "context_embedder_2.linear_3", mmdit.byt5_3, LAYOUT_ROWS_TEXT, X_D, X_BYT5),
    LIN(PART_EMBEDDING, "time_embed.timestep_embedder.linear_1", mmdit.time_1, LAYOUT_ROWS_SAMPLES, X_D, X_FREQ),
    LIN(PART_EMBEDDING, "time_embed.timestep_embedder.linear_2", mmdit.time_2, LAYOUT_ROWS_SAMPLES, X_D, X_D),
    {PART_EMBEDDING, "cond_type_embed.weight", {X_TYPES, X_D, X_END}, LAYOUT_INIT_NORMAL_STD, LAYOUT_ROWS_NONE, WHEN_ALWAYS,
     offsetof(model_layout, mmdit.cond_type)},
    BLIN("norm1.linear", norm1, LAYOUT_ROWS_SAMPLES, X_6D, X_D),
    BLIN("norm1_context.linear", norm1_context, LAYOUT_ROWS_SAMPLES, X_6D, X_D),
    BNORM("attn.norm_q", norm_q),
    BNORM("attn.norm_k", norm_k),
    BLIN("attn.to_q", to_q, LAYOUT_ROWS_TOKENS, X_D, X_D),
    BLIN("attn.to_k", to_k, LAYOUT_ROWS_TOKENS, X_D, X_D),
    BLIN("attn.to_v", to_v, LAYOUT_ROWS_TOKENS, X_D, X_D),
    BLIN("attn.add_k_proj", add_k, LAYOUT_ROWS_TEXT, X_D, X_D),
    BLIN("attn.add_v_proj", add_v, LAYOUT_ROWS_TEXT, X_D, X_D),
    BLIN("attn.add_q_proj", add_q, LAYOUT_ROWS_TEXT, X_D, X_D),
    BLIN("attn.to_out.0", to_out, LAYOUT_ROWS_TOKENS, X_D, X_D),
    BLIN("attn.to_add_out", to_add_out, LAYOUT_ROWS_TEXT, X_D, X_D),
    BNORM("attn.norm_added_q", norm_added_q),
    BNORM("attn.norm_added_k", norm_added_k),
    BLIN("ff.net.0.proj", ff_in, LAYOUT_ROWS_TOKENS, X_F, X_D),
    BLIN("ff.net.2", ff_out, LAYOUT_ROWS_TOKENS, X_D, X_F),
    BLIN("ff_context.net.0.proj", ff_context_in, LAYOUT_ROWS_TEXT, X_F, X_D),
    BLIN("ff_context.net.2", ff_context_out, LAYOUT_ROWS_TEXT, X_D, X_F),
    LIN(PART_HEAD, "norm_out.linear", mmdit.norm_out, LAYOUT_ROWS_SAMPLES, X_2D, X_D),
    LIN(PART_HEAD, "proj_out", mmdit.proj_out, LAYOUT_ROWS_TOKENS, X_OUT_PATCH, X_D),
};

/* A family: its table, and where its block offsets go in model_layout. */
typedef struct {
    const tensor_spec *specs;
    int n_specs;
    size_t block_field;
    const char *block_prefix;
    int on_gpu;   /* the GPU model builds it (cuda/model_gpu.cu; hunyuanvideo15's block code cuda/mmdit_gpu.cu) */
    size_t gpu_time_first;   /* the field of model_layout where the time path the GPU reads in fp32 starts */
    int gpu_reads_modulation;   /* the GPU reads Wan's modulation tables and norm3 in fp32 */
    int sequence_parallel;   /* its CPU and GPU models run a micro-batch on a group of ranks (Ulysses) */
} family_table;

static const family_table families[] = {
    [FAMILY_WAN] = {wan_tensors, (int)(sizeof wan_tensors / sizeof wan_tensors[0]), offsetof(model_layout, block), "blocks.", 1,
                    offsetof(model_layout, time_in.weight), 1, 1},
    [FAMILY_HUNYUANVIDEO15] = {mmdit_tensors, (int)(sizeof mmdit_tensors / sizeof mmdit_tensors[0]),
                               offsetof(model_layout, mmdit_block), "transformer_blocks.", 1,
                               offsetof(model_layout, mmdit.time_1.weight), 0, 1},
};
_Static_assert(sizeof wan_tensors / sizeof wan_tensors[0] <= LAYOUT_MAX_TENSORS, "LAYOUT_MAX_TENSORS holds Wan's table");
_Static_assert(sizeof mmdit_tensors / sizeof mmdit_tensors[0] <= LAYOUT_MAX_TENSORS,
               "LAYOUT_MAX_TENSORS holds HunyuanVideo-1.5's table");

int layout_family_on_gpu(deck_family family)
{
    ALDIT_CHECK(family == FAMILY_WAN || family == FAMILY_HUNYUANVIDEO15, "layout: model family %d unknown", (int)family);
    return families[family].on_gpu;
}

int layout_family_sequence_parallel(deck_family family)
{
    ALDIT_CHECK(family == FAMILY_WAN || family == FAMILY_HUNYUANVIDEO15, "layout: model family %d unknown", (int)family);
    return families[family].sequence_parallel;
}

/* How each family's attention sees the text (layout.h). */
static const layout_attention family_attention[] = {
    [FAMILY_WAN] = {0, 0},
    [FAMILY_HUNYUANVIDEO15] = {1, LAYOUT_MMDIT_REFINER_LAYERS},
};

layout_attention layout_family_attention(deck_family family)
{
    ALDIT_CHECK(family == FAMILY_WAN || family == FAMILY_HUNYUANVIDEO15, "layout: model family %d unknown", (int)family);
    return family_attention[family];
}

static int64_t resolve(const layout_dims *d, dim_symbol symbol)
{
    switch (symbol) {
    case X_1: return 1;
    case X_2: return 2;
    case X_6: return 6;
    case X_D: return d->dim;
    case X_6D: return 6 * d->dim;
    case X_F: return d->ffn_dim;
    case X_IN: return d->in_dim;
    case X_PT: return d->patch_t;
    case X_PH: return d->patch_h;
    case X_PW: return d->patch_w;
    case X_TEXT: return d->text_dim;
    case X_FREQ: return d->freq_dim;
    case X_OUT_PATCH: return d->out_dim * d->patch_t * d->patch_h * d->patch_w;
    case X_2D: return 2 * d->dim;
    case X_4D: return LAYOUT_MMDIT_REFINER_MLP_RATIO * d->dim;
    case X_HEAD: return d->dim / d->num_heads;
    case X_TYPES: return LAYOUT_MMDIT_TYPES;
    case X_TEXT2: return d->text_2_dim;
    case X_IMAGE: return d->image_dim;
    case X_BYT5: return LAYOUT_MMDIT_BYT5_HIDDEN;
    case X_END: break;
    }
    return 0;
}

static int present(const layout_dims *d, condition when)
{
    return when == WHEN_ALWAYS || (when == WHEN_QK_NORM && d->qk_norm) || (when == WHEN_CROSS_ATTN_NORM && d->cross_attn_norm);
}

layout_dims layout_dims_of(const deck *config)
{
    layout_dims d = {
        .dim = config->model.dim, .ffn_dim = config->model.ffn_dim, .num_heads = config->model.num_heads,
        .num_layers = config->model.num_layers, .in_dim = config->model.in_dim, .out_dim = config->model.out_dim,
        .patch_t = config->model.patch_t, .patch_h = config->model.patch_h, .patch_w = config->model.patch_w,
        .text_dim = config->model.text_dim, .freq_dim = config->model.freq_dim, .qk_norm = config->model.qk_norm,
        .cross_attn_norm = config->model.cross_attn_norm, .family = config->model.family,
        .text_2_dim = config->model.text_2_dim, .image_dim = config->model.image_dim};
    return d;
}

static void set_offset(void *base, size_t field, int64_t offset) { memcpy((char *)base + field, &offset, sizeof offset); }

/* What the family's GPU model reads in fp32 (model_layout.gpu_*). */
static void gpu_reads(model_layout *layout, const family_table *family)
{
    const int64_t D = layout->dims.dim;
    memcpy(&layout->gpu_time_first, (const char *)layout + family->gpu_time_first, sizeof layout->gpu_time_first);
    if (!family->gpu_reads_modulation) return;   /* none: zero counts */
    layout->gpu_head_fp32 = (layout_range){layout->head_modulation, 2 * D};
    layout->gpu_block_fp32[0] = (layout_range){layout->block.modulation, 6 * D};
    layout->gpu_block_fp32[1] = (layout_range){layout->block.norm3_weight, 2 * D};
}

void model_layout_init(model_layout *layout, const layout_dims *dims)
{
    memset(layout, 0, sizeof *layout);
    layout->dims = *dims;
    memset(&layout->block, 0xff, sizeof layout->block);   /* every offset -1 until present */
    memset(&layout->mmdit, 0xff, sizeof layout->mmdit);
    memset(&layout->mmdit_block, 0xff, sizeof layout->mmdit_block);
    ALDIT_CHECK(dims->family == FAMILY_WAN || dims->family == FAMILY_HUNYUANVIDEO15, "layout: model family %d unknown",
                (int)dims->family);
    const family_table *family = &families[dims->family];
    layout->block_prefix = family->block_prefix;
    int64_t at = 0, block_at = 0;
    for (int k = 0; k < family->n_specs; k++) {
        const tensor_spec *spec = &family->specs[k];
        if (!present(dims, spec->when)) continue;
        if (spec->where == PART_HEAD && layout->n_tensors == layout->n_embedding + layout->n_block) {
            layout->block_stride = block_at;   /* the first head tensor: the blocks end here */
            at += dims->num_layers * block_at;
        }
        layout_tensor *t = &layout->tensors[layout->n_tensors++];
        t->name = spec->name;
        t->init = spec->init;
        t->rows = spec->rows;
        t->n_elements = 1;
        for (t->ndim = 0; spec->shape[t->ndim] != X_END; t->ndim++) {
            t->shape[t->ndim] = resolve(dims, spec->shape[t->ndim]);
            t->n_elements *= t->shape[t->ndim];
        }
        if (spec->where == PART_BLOCK) {
            if (layout->n_block++ == 0) layout->blocks_offset = at;
            t->offset = block_at;
            block_at += t->n_elements;
            set_offset((char *)layout + family->block_field, spec->field, t->offset);
        } else {
            if (spec->where == PART_EMBEDDING) layout->n_embedding++;
            t->offset = at;
            at += t->n_elements;
            set_offset(layout, spec->field, t->offset);
        }
    }
    layout->n_weights = at;
    layout->n_params = layout->n_tensors - layout->n_block + (int)dims->num_layers * layout->n_block;
    gpu_reads(layout, family);
}

static int64_t shifted(int64_t offset, int64_t by) { return offset < 0 ? -1 : offset + by; }

/* Shift `n` offsets (a block's struct of int64_t) by block `layer`'s start. */
static void shift_block(const model_layout *layout, int layer, int64_t *fields, size_t n)
{
    const int64_t start = layout->blocks_offset + (int64_t)layer * layout->block_stride;
    for (size_t i = 0; i < n; i++) fields[i] = shifted(fields[i], start);
}

layout_block model_layout_block(const model_layout *layout, int layer)
{
    layout_block b = layout->block;
    shift_block(layout, layer, (int64_t *)&b, sizeof b / sizeof(int64_t));
    return b;
}

layout_mmdit_block model_layout_mmdit_block(const model_layout *layout, int layer)
{
    layout_mmdit_block b = layout->mmdit_block;
    shift_block(layout, layer, (int64_t *)&b, sizeof b / sizeof(int64_t));
    return b;
}

const layout_tensor *model_layout_param(const model_layout *layout, int index, int *layer, int64_t *offset)
{
    ALDIT_CHECK(index >= 0 && index < layout->n_params, "layout: parameter %d of %d", index, layout->n_params);
    const int in_blocks = (int)layout->dims.num_layers * layout->n_block;
    const layout_tensor *t;
    if (index < layout->n_embedding) {
        *layer = -1;
        t = &layout->tensors[index];
        *offset = t->offset;
    } else if (index < layout->n_embedding + in_blocks) {
        const int within = index - layout->n_embedding;
        *layer = within / layout->n_block;
        t = &layout->tensors[layout->n_embedding + within % layout->n_block];
        *offset = layout->blocks_offset + (int64_t)*layer * layout->block_stride + t->offset;
    } else {
        *layer = -1;
        t = &layout->tensors[index - in_blocks + layout->n_block];
        *offset = t->offset;
    }
    return t;
}

layout_gemm_flops model_layout_gemm_flops(const model_layout *layout)
{
    layout_gemm_flops f = {0, 0, 0, 0, 0};
    for (int k = 0; k < layout->n_tensors; k++) {
        const layout_tensor *t = &layout->tensors[k];
        const int in_block = k >= layout->n_embedding && k < layout->n_embedding + layout->n_block;
        const double flops = 2.0 * (double)t->n_elements * (in_block ? (double)layout->dims.num_layers : 1.0);
        if (t->rows == LAYOUT_ROWS_TOKENS) *(in_block ? &f.block_per_token : &f.outside_per_token) += flops;
        if (t->rows == LAYOUT_ROWS_TEXT) *(in_block ? &f.block_per_text : &f.outside_per_text) += flops;
        if (t->rows == LAYOUT_ROWS_SAMPLES) f.outside_per_sample += flops;
    }
    return f;
}

/* ---- memory ------------------------------------------------------------------------------------- */

/* A count of workspace pieces, each `count(N, B, L)` values of `bytes` bytes, all alike:
   count = n + per_token N + per_sample B + per_text L. */
typedef struct {
    int64_t fixed, per_token, per_sample, per_text, pieces, align;
} tally;

/* `copies` pieces of (tokens N + samples B + text L + extra) values of `bytes` bytes each. */
static void add(tally *t, int64_t copies, int64_t bytes, int64_t tokens, int64_t samples, int64_t text, int64_t extra)
{
    t->per_token += copies * bytes * tokens;
    t->per_sample += copies * bytes * samples;
    t->per_text += copies * bytes * text;
    t->fixed += copies * bytes * extra;
    t->pieces += copies;
}

/* The CPU model's arena (model.c, layout_workspace: fp32), its RoPE positions and row tables. */
static void cpu_workspace(tally *t, const layout_dims *d)
{
    enum { F32 = 4 };
    const int64_t D = d->dim, F = d->ffn_dim, H = d->num_heads, layers = d->num_layers;
    const int64_t patch = d->patch_t * d->patch_h * d->patch_w, patch_in = d->in_dim * patch,
                  patch_out = d->out_dim * patch;
    /* every block: 17 [N, D], 9 [N] statistics, 2 [N, H] LSEs, 2 [N, F], 3 [L, D], 1 [L], modulation [6B, D] */
    add(t, 17 * layers, F32, D, 0, 0, 0);
    add(t, 9 * layers, F32, 1, 0, 0, 0);
    add(t, 2 * layers, F32, H, 0, 0, 0);
    add(t, 2 * layers, F32, F, 0, 0, 0);
    add(t, 3 * layers, F32, 0, 0, D, 0);
    add(t, 1 * layers, F32, 0, 0, 1, 0);
    add(t, 1 * layers, F32, 0, 6 * D, 0, 0);
    /* outside: tokens_in and video [N, patch_in]; target, pred, d_pred [N, patch_out]; x_final, head_h and
       9 gradients [N, D]; head statistics [N]; d_ffn [N, F]; text 3 + 4 gradients [L, D]; per sample:
       timesteps, sinusoid, 8 [B, D], e0, d_mod, d_e0 [B, 6D], d_head_mod [B, 2D] */
    add(t, 2, F32, patch_in, 0, 0, 0);
    add(t, 3, F32, patch_out, 0, 0, 0);
    add(t, 11, F32, D, 0, 0, 0);
    add(t, 2, F32, 1, 0, 0, 0);
    add(t, 1, F32, F, 0, 0, 0);
    add(t, 7, F32, 0, 0, D, 0);
    add(t, 1, F32, 0, 1, 0, 0);
    add(t, 1, F32, 0, d->freq_dim, 0, 0);
    add(t, 8, F32, 0, D, 0, 0);
    add(t, 3, F32, 0, 6 * D, 0, 0);
    add(t, 1, F32, 0, 2 * D, 0, 0);
    t->align = LAYOUT_CPU_ALIGN;
    /* outside the arena (not padded): positions [N, 3] int32; token_start, text_start [B + 1] int64;
       the grid [B] int32 x 3 */
    t->per_token += 3 * 4;
    t->per_sample += 2 * 8 + 3 * 4;
    t->fixed += 2 * 8;
}

/* hunyuanvideo15's CPU arena (mmdit.c, carve: fp32), its RoPE positions and row tables. Text rows L count the
   costliest source's per-row values (a ByT5 row's 2048-wide hidden states, or an image row's, or a Qwen row's
   refiner activations), so the count is at most what a micro-batch takes. */
static void mmdit_cpu_workspace(tally *t, const layout_dims *d)
{
    enum { F32 = 4 };
    const int64_t D = d->dim, F = d->ffn_dim, H = d->num_heads, layers = d->num_layers, R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D;
    const int64_t E = LAYOUT_MMDIT_BYT5_HIDDEN, refiners = LAYOUT_MMDIT_REFINER_LAYERS;
    const int64_t patch = d->patch_t * d->patch_h * d->patch_w, P = d->in_dim * patch, PO = d->out_dim * patch;
    /* every block, per video row and per text row alike: 13 [., D], 4 statistics, 3 [., H], 2 [., F] (counted
       as pieces of each stream: the joint q, k, v, output and LSE are one piece each, fewer); per sample 12 [B, D]
       modulation vectors */
    add(t, 13 * layers, F32, D, 0, 0, 0);
    add(t, 13 * layers, F32, 0, 0, D, 0);
    add(t, 4 * layers, F32, 1, 0, 0, 0);
    add(t, 4 * layers, F32, 0, 0, 1, 0);
    add(t, 3 * layers, F32, H, 0, 0, 0);
    add(t, 3 * layers, F32, 0, 0, H, 0);
    add(t, 2 * layers, F32, F, 0, 0, 0);
    add(t, 2 * layers, F32, 0, 0, F, 0);
    add(t, 12 * layers, F32, 0, D, 0, 0);
    /* every refiner block: 10 [Q, D], 4 statistics, [Q, H], 2 [Q, 4D]; gates [B, 2D] (Q <= L) */
    add(t, 10 * refiners, F32, 0, 0, D, 0);
    add(t, 4 * refiners, F32, 0, 0, 1, 0);
    add(t, refiners, F32, 0, 0, H, 0);
    add(t, 2 * refiners, F32, 0, 0, R, 0);
    add(t, 2 * refiners, F32, 0, 2 * D, 0, 0);
    /* outside the blocks, per video row: tokens_in, video [P]; target, pred, d_pred [PO]; x_final, head_h, d_x, d_xb,
       t1, t2, the joint d and dq, dk, dv [D]; head statistics; d_ff [F] */
    add(t, 2, F32, P, 0, 0, 0);
    add(t, 3, F32, PO, 0, 0, 0);
    add(t, 10, F32, D, 0, 0, 0);
    add(t, 2, F32, 1, 0, 0, 0);
    add(t, 1, F32, F, 0, 0, 0);
    /* per text row: c_final, d_c, d_cb, tc1, tc2, the joint d, dq, dk, dv, dqc, dkc, dvc [D]; d_ffc [F]; and the
       costliest source: a Qwen row's refiner output and 6 gradients [D] and the refiner MLP's gradient [4D], a
       ByT5 row's 4 hidden and 2 gradients [E], 3 [text_2_dim], 2 [D], 2 statistics, an image row's 6 [image_dim],
       4 [D], 4 statistics */
    add(t, 12, F32, 0, 0, D, 0);
    add(t, 1, F32, 0, 0, F, 0);
    const int64_t qwen = 7 * D + R, byt5 = 6 * E + 3 * d->text_2_dim + 2 * D + 2,
                  image = 6 * d->image_dim + 4 * D + 4;
    int64_t source = qwen > byt5 ? qwen : byt5;
    if (image > source) source = image;
    add(t, 1, F32, 0, 0, source, 0);
    /* per sample: timesteps, sinusoid, pooled [text_dim], 15 [B, D], modulation scratch 3 [B, 6D], head 2 [B, 2D],
       refiner gates' gradient [B, 2D] */
    add(t, 1, F32, 0, 1, 0, 0);
    add(t, 1, F32, 0, d->freq_dim, 0, 0);
    add(t, 1, F32, 0, d->text_dim, 0, 0);
    add(t, 15, F32, 0, D, 0, 0);
    add(t, 3, F32, 0, 6 * D, 0, 0);
    add(t, 3, F32, 0, 2 * D, 0, 0);
    t->align = LAYOUT_CPU_ALIGN;
    /* outside the arena: positions [N, 3] int32; 9 row tables [B + 1] int64; the grid [B] int32 x 3; one rank's
       slice tables (2 [k + 1] and the exchange's [4k] int64, k = 1) */
    t->per_token += 3 * 4;
    t->per_sample += 9 * 8 + 3 * 4;
    t->fixed += 9 * 8 + 8 * 8;
}

/* The GPU model's arena (model_gpu.cu, layout_arena), less its scratch. */
static void gpu_workspace(tally *t, const layout_dims *d, deck_recompute recompute)
{
    enum { BF16 = 2, F32 = 4, I32 = 4, I64 = 8 };
    const int64_t D = d->dim, F = d->ffn_dim, H = d->num_heads, layers = d->num_layers, slack = LAYOUT_GPU_TILE_SLACK_ROWS;
    const int64_t patch = d->patch_t * d->patch_h * d->patch_w, patch_in = d->in_dim * patch,
                  patch_out = d->out_dim * patch;
    /* kept by every block (layout_kept): x_in [N, D] bf16; modulation and its gradient [6B, D], norm3's
       shift and scale [B, D]; ln1 mean and rstd [N] */
    add(t, layers, BF16, D, 0, 0, 0);
    add(t, 2 * layers, F32, 0, 6 * D, 0, 0);
    add(t, 2 * layers, F32, 0, D, 0, 0);
    add(t, 2 * layers, F32, 1, 0, 0, 0);
    /* the rest (layout_recomputed), every block's or one set: 13 [N, D] and 4 [N + slack, D] bf16, 3 [L, D]
       bf16, 2 [N, F] bf16, 7 [N] and 1 [L] statistics, attn_lse [N + slack, H], cattn_lse [N, H] */
    const int64_t sets = recompute == RECOMPUTE_BLOCK ? (layers > 0) : layers;
    add(t, 13 * sets, BF16, D, 0, 0, 0);
    add(t, 4 * sets, BF16, D, 0, 0, slack * D);
    add(t, 3 * sets, BF16, 0, 0, D, 0);
    add(t, 2 * sets, BF16, F, 0, 0, 0);
    add(t, 7 * sets, F32, 1, 0, 0, 0);
    add(t, 1 * sets, F32, 0, 0, 1, 0);
    add(t, 1 * sets, F32, H, 0, 0, slack * H);
    add(t, 1 * sets, F32, H, 0, 0, 0);
    /* the batch: latents and noise fp32 [N, patch_in], text fp32 and bf16 [L, text_dim], tokens_in bf16
       [N, patch_in], x0 and noise tokens fp32 [N, patch_out] */
    add(t, 2, F32, patch_in, 0, 0, 0);
    add(t, 1, F32, 0, 0, d->text_dim, 0);
    add(t, 1, BF16, 0, 0, d->text_dim, 0);
    add(t, 1, BF16, patch_in, 0, 0, 0);
    add(t, 2, F32, patch_out, 0, 0, 0);
    /* embeddings and head: text [L, D] bf16 x 3; 14 [B, D] and e0, d_e0 [B, 6D] fp32; head statistics [N];
       x_final, head_h [N, D] bf16; pred, d_pred [N, patch_out] bf16; sample_loss [B] */
    add(t, 3, BF16, 0, 0, D, 0);
    add(t, 14, F32, 0, D, 0, 0);
    add(t, 2, F32, 0, 6 * D, 0, 0);
    add(t, 2, F32, 1, 0, 0, 0);
    add(t, 2, BF16, D, 0, 0, 0);
    add(t, 2, BF16, patch_out, 0, 0, 0);
    add(t, 1, F32, 0, 1, 0, 0);
    /* gradients: 3 [N, D] and 4 [N + slack, D] bf16, d_ffn [N, F], 5 [L, D] bf16, d_context [L, D] fp32 */
    add(t, 3, BF16, D, 0, 0, 0);
    add(t, 4, BF16, D, 0, 0, slack * D);
    add(t, 1, BF16, F, 0, 0, 0);
    add(t, 5, BF16, 0, 0, D, 0);
    add(t, 1, F32, 0, 0, D, 0);
    /* the tables (layout_tables): 4 row offsets [B + 1] int64, latent shapes [B, 3] and positions [N, 3]
       int32, sigma [B] and sinusoid [B, freq_dim] fp32 */
    add(t, 4, I64, 0, 1, 0, 1);
    add(t, 1, I32, 0, 3, 0, 0);
    add(t, 1, I32, 3, 0, 0, 0);
    add(t, 1, F32, 0, 1, 0, 0);
    add(t, 1, F32, 0, d->freq_dim, 0, 0);
    t->align = LAYOUT_GPU_ALIGN;
}

int64_t layout_gpu_scratch_bytes(const model_layout *layout, int64_t device_scratch_bytes, int64_t tokens,
                                 int64_t samples)
{
    return device_scratch_bytes + 4 * layout->dims.num_heads * tokens + 12 * layout->dims.dim * samples;
}

int64_t layout_mmdit_joint_rows(int64_t tokens, int64_t samples, int64_t text)
{
    return tokens + text + 128 * (samples + 1);
}

/* hunyuanvideo15's GPU arena (cuda/mmdit_gpu.cu, carve: the same pieces in the same order), less its scratch. Every
   caption source's rows count as L; J = N + L + 128 (B + 1) joint rows. */
static void mmdit_gpu_workspace(tally *t, const layout_dims *d, deck_recompute recompute)
{
    enum { BF16 = 2, F32 = 4, I32 = 4, I64 = 8 };
    const int64_t D = d->dim, F = d->ffn_dim, H = d->num_heads, layers = d->num_layers, slack = 128;
    const int64_t R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D, E = LAYOUT_MMDIT_BYT5_HIDDEN;
    const int64_t T = d->text_dim, T2 = d->text_2_dim, IM = d->image_dim;
    const int64_t patch = d->patch_t * d->patch_h * d->patch_w, PO = d->out_dim * patch;
    const int64_t cols = (d->in_dim * patch + 7) / 8 * 8;
    /* kept by every block: x_in of each stream, the modulation vectors [6B, D] of each */
    add(t, layers, BF16, D, 0, 0, 0);
    add(t, layers, F32, 0, 6 * D, 0, 0);
    add(t, layers, BF16, 0, 0, D, 0);
    add(t, layers, F32, 0, 6 * D, 0, 0);
    /* the rest, per block or one set: per stream 8 [., D], 2 [., F] bf16, 4 statistics, 2 [., H]; the joint q, k,
       v, output [J, D] bf16 and log-sum-exps [J, H] */
    const int64_t sets = recompute == RECOMPUTE_BLOCK ? (layers > 0) : layers;
    add(t, 8 * sets, BF16, D, 0, 0, 0);
    add(t, 2 * sets, BF16, F, 0, 0, 0);
    add(t, 4 * sets, F32, 1, 0, 0, 0);
    add(t, 2 * sets, F32, H, 0, 0, 0);
    add(t, 8 * sets, BF16, 0, 0, D, 0);
    add(t, 2 * sets, BF16, 0, 0, F, 0);
    add(t, 4 * sets, F32, 0, 0, 1, 0);
    add(t, 2 * sets, F32, 0, 0, H, 0);
    add(t, 4 * sets, BF16, D, slack * D, D, slack * D);
    add(t, 1 * sets, F32, H, slack * H, H, slack * H);
    /* each refiner block: 10 [L, D] and 2 [L, 4D] bf16, 4 [L] and [L, H] fp32, gates [2B, D], 4 [B, D] */
    for (int i = 0; i < LAYOUT_MMDIT_REFINER_LAYERS; i++) {
        add(t, 10, BF16, 0, 0, D, 0);
        add(t, 2, BF16, 0, 0, R, 0);
        add(t, 4, F32, 0, 0, 1, 0);
        add(t, 1, F32, 0, 0, H, 0);
        add(t, 1, F32, 0, 2 * D, 0, 0);
        add(t, 4, F32, 0, D, 0, 0);
    }
    /* each stream's scratch: 7 [., D], [., F] bf16, [6B, D] */
    add(t, 7, BF16, D, 0, 0, 0);
    add(t, 1, BF16, F, 0, 0, 0);
    add(t, 1, F32, 0, 6 * D, 0, 0);
    add(t, 7, BF16, 0, 0, D, 0);
    add(t, 1, BF16, 0, 0, F, 0);
    add(t, 1, F32, 0, 6 * D, 0, 0);
    /* the batch: latents, noise fp32 [N, PO]; the sources fp32 and bf16 [L, T], [L, T2], [L, IM]; tokens_in bf16
       [N, cols]; x0 and noise tokens fp32 [N, PO] */
    add(t, 2, F32, PO, 0, 0, 0);
    add(t, 1, F32, 0, 0, T, 0);
    add(t, 1, F32, 0, 0, T2, 0);
    add(t, 1, F32, 0, 0, IM, 0);
    add(t, 1, BF16, 0, 0, T, 0);
    add(t, 1, BF16, 0, 0, T2, 0);
    add(t, 1, BF16, 0, 0, IM, 0);
    add(t, 1, BF16, cols, 0, 0, 0);
    add(t, 2, F32, PO, 0, 0, 0);
    /* per sample: 16 [B, D], pooled [B, T], 3 [2B, D], the losses [B], the affine norms' gradients
       2 [B D + T2 + IM]; the embedders' norm vectors 2 [T2], 2 [IM], 2 [D] */
    add(t, 16, F32, 0, D, 0, 0);
    add(t, 1, F32, 0, T, 0, 0);
    add(t, 3, F32, 0, 2 * D, 0, 0);
    add(t, 1, F32, 0, 1, 0, 0);
    add(t, 2, F32, 0, D, 0, T2 + IM);
    add(t, 2, F32, 0, 0, 0, T2);
    add(t, 2, F32, 0, 0, 0, IM);
    add(t, 2, F32, 0, 0, 0, D);
    /* the sources: refiner output [L, D]; ByT5 norm [L, T2], 4 hidden [L, E], output [L, D]; image 3 [L, IM],
       2 [L, D]; 6 statistics [L] */
    add(t, 1, BF16, 0, 0, D, 0);
    add(t, 1, BF16, 0, 0, T2, 0);
    add(t, 4, BF16, 0, 0, E, 0);
    add(t, 1, BF16, 0, 0, D, 0);
    add(t, 3, BF16, 0, 0, IM, 0);
    add(t, 2, BF16, 0, 0, D, 0);
    add(t, 6, F32, 0, 0, 1, 0);
    /* head: x_final, head_h [N, D], c_final [L, D], pred and its gradient [N, PO] bf16, statistics [N] */
    add(t, 2, BF16, D, 0, 0, 0);
    add(t, 1, BF16, 0, 0, D, 0);
    add(t, 2, BF16, PO, 0, 0, 0);
    add(t, 2, F32, 1, 0, 0, 0);
    /* backward: joint 4 [J, D]; the sources' 3 [L, D], [L, 4D], 2 [L, E], [L, T2], 2 [L, IM]; the padded patch
       weight [D, cols] bf16 and its gradient fp32 */
    add(t, 4, BF16, D, slack * D, D, slack * D);
    add(t, 3, BF16, 0, 0, D, 0);
    add(t, 1, BF16, 0, 0, R, 0);
    add(t, 2, BF16, 0, 0, E, 0);
    add(t, 1, BF16, 0, 0, T2, 0);
    add(t, 2, BF16, 0, 0, IM, 0);
    add(t, 1, BF16, 0, 0, 0, D * cols);
    add(t, 1, F32, 0, 0, 0, D * cols);
    /* the tables: 8 row offsets [B + 1] int64, spans [6], shapes [B, 3], positions [N, 3], the joint map [J], the
       text map [L] and the image-to-video flags [B] int32, sigma [B] and sinusoid [B, freq_dim] fp32 */
    add(t, 8, I64, 0, 1, 0, 1);
    add(t, 1, I64, 0, 0, 0, 6);
    add(t, 1, I32, 0, 3, 0, 0);
    add(t, 1, I32, 3, 0, 0, 0);
    add(t, 1, I32, 1, slack, 1, slack);
    add(t, 1, I32, 0, 0, 1, 0);
    add(t, 1, I32, 0, 1, 0, 0);
    add(t, 1, F32, 0, 1, 0, 0);
    add(t, 1, F32, 0, d->freq_dim, 0, 0);
    t->align = LAYOUT_GPU_ALIGN;
}

layout_memory model_layout_memory(const model_layout *layout, layout_backend backend, deck_recompute recompute,
                                  int64_t device_scratch_bytes)
{
    tally t = {0, 0, 0, 0, 0, 0};
    if (layout->dims.family == FAMILY_HUNYUANVIDEO15 && backend == LAYOUT_BACKEND_GPU) {
        mmdit_gpu_workspace(&t, &layout->dims, recompute);
        /* the scratch: layout_gpu_scratch_bytes at the joint rows (layout_mmdit_joint_rows) */
        const int64_t H = layout->dims.num_heads, slack = 128;
        t.per_token += 4 * H;
        t.per_text += 4 * H;
        t.per_sample += 4 * H * slack + 12 * layout->dims.dim;
        t.fixed += 4 * H * slack + device_scratch_bytes;
        t.pieces += 1;
    } else if (layout->dims.family == FAMILY_HUNYUANVIDEO15) {
        mmdit_cpu_workspace(&t, &layout->dims);
    } else if (backend == LAYOUT_BACKEND_GPU) {
        gpu_workspace(&t, &layout->dims, recompute);
        t.per_token += 4 * layout->dims.num_heads;   /* the scratch: one more piece */
        t.per_sample += 12 * layout->dims.dim;
        t.fixed += device_scratch_bytes;
        t.pieces += 1;
    } else {
        cpu_workspace(&t, &layout->dims);
    }
    /* each piece starts aligned: at most align - 1 bytes of padding after it (the CPU's pieces are floats) */
    const int64_t padding = backend == LAYOUT_BACKEND_GPU ? t.align - 1 : t.align - 4;
    layout_memory m = {t.fixed + t.pieces * padding, t.per_token, t.per_sample, t.per_text};
    return m;
}

int64_t layout_memory_bytes(const layout_memory *memory, int64_t tokens, int64_t samples, int64_t text)
{
    return memory->fixed + memory->per_token * tokens + memory->per_sample * samples + memory->per_text * text;
}

/* ---- the training state ------------------------------------------------------------------------------ */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* bytes rounded up to the GPU arena's alignment, as its carver takes each piece */
static int64_t aligned(int64_t bytes) { return ceil_div(bytes, LAYOUT_GPU_ALIGN) * LAYOUT_GPU_ALIGN; }

/* hunyuanvideo15's group buffers (cuda/mmdit_gpu.cu, carve_sp: the same pieces in the same order) for a micro-batch of
   `joint` = S + L rows in all (video and joint text; each bounds either): J = layout_mmdit_joint_rows(joint, B, 0)
   joint rows at D/k columns (per set q, k, v, output and the log-sum-exps; the four gradients once), the exchange's
   rows in member order [3][joint][D/k] and the member's own [3][ceil(joint / k) + 1][D] (its video and text slices
   hold at most that many), the whole samples' latents and noise (at most joint tokens of out_dim x patch values),
   the tables (2B + 1 int64) and the joint map (J int32); plus cuDNN's buffer over J rows at H/k heads. */
static int64_t mmdit_split_bytes(const layout_dims *d, int64_t sets, int64_t joint, int64_t samples, int k)
{
    const int64_t J = layout_mmdit_joint_rows(joint, samples, 0), dk = d->dim / k, hk = d->num_heads / k;
    const int64_t per_set = 4 * aligned(2 * J * dk) + aligned(4 * J * hk);
    const int64_t latent = joint * d->out_dim * d->patch_t * d->patch_h * d->patch_w;
    const int64_t arena = sets * per_set + 4 * aligned(2 * J * dk) + aligned(2 * 3 * joint * dk) +
                          aligned(2 * 3 * (ceil_div(joint, k) + 1) * d->dim) + 2 * aligned(4 * latent) +
                          aligned(8 * (2 * samples + 1)) + aligned(4 * J);
    return arena + 4 * hk * J * (d->dim / d->num_heads + 1);
}

int64_t layout_gpu_split_bytes(const model_layout *layout, deck_recompute recompute, int64_t tokens, int64_t samples,
                               int k)
{
    const layout_dims *d = &layout->dims;
    ALDIT_CHECK((d->family == FAMILY_WAN || d->family == FAMILY_HUNYUANVIDEO15) && k > 1 && d->dim % k == 0 &&
                d->num_heads % k == 0, "layout: no split memory for family %d over %d ranks", (int)d->family, k);
    const int64_t sets = recompute == RECOMPUTE_BLOCK ? 1 : d->num_layers;
    if (d->family == FAMILY_HUNYUANVIDEO15) return mmdit_split_bytes(d, sets, tokens, samples, k);
    const int64_t rows = tokens + LAYOUT_GPU_TILE_SLACK_ROWS, dk = d->dim / k, hk = d->num_heads / k;
    const int64_t per_set = 4 * aligned(2 * rows * dk) + aligned(4 * rows * hk);
    const int64_t latent = tokens * d->in_dim * d->patch_t * d->patch_h * d->patch_w;
    const int64_t arena = sets * per_set + 4 * aligned(2 * rows * dk) + aligned(2 * 3 * ceil_div(tokens, k) * d->dim) +
                          2 * aligned(4 * latent) + aligned(8 * (3 * samples + 2));
    const int64_t head_dim = d->dim / d->num_heads;
    return arena + 4 * hk * rows * (head_dim + 1);
}

int64_t layout_shard_values(const model_layout *layout, layout_backend backend, int n_ranks)
{
    const int64_t n = layout->n_weights, blocks_end = layout->blocks_offset + layout->dims.num_layers * layout->block_stride;
    if (backend == LAYOUT_BACKEND_CPU) return ceil_div(n, n_ranks);
    return ceil_div(layout->blocks_offset, n_ranks) + layout->dims.num_layers * ceil_div(layout->block_stride, n_ranks) +
           ceil_div(n - blocks_end, n_ranks);
}

int64_t layout_gpu_fp32_read_values(const model_layout *layout, deck_shard mode)
{
    const int64_t time = mode == SHARD_FULL ? 0 : layout->blocks_offset - layout->gpu_time_first;
    return time + layout->gpu_head_fp32.count +
           layout->dims.num_layers * (layout->gpu_block_fp32[0].count + layout->gpu_block_fp32[1].count);
}

layout_state_bytes model_layout_state_bytes(const model_layout *layout, layout_backend backend, deck_shard mode,
                                            int n_ranks, int ema)
{
    const double n = (double)layout->n_weights;
    const double s = mode == SHARD_NONE ? n : (double)layout_shard_values(layout, backend, n_ranks);
    layout_state_bytes bytes = {.gradients = 4.0 * n, .moments = 8.0 * s, .ema = ema ? 4.0 * s : 0.0};
    if (backend == LAYOUT_BACKEND_CPU) {
        bytes.weights = 4.0 * n;
        if (mode == SHARD_GRADIENTS || mode == SHARD_FULL) bytes.gradients = 4.0 * n + 4.0 * s;
        return bytes;
    }
    bytes.weights = 2.0 * n;
    bytes.master = 4.0 * s;
    if (mode == SHARD_NONE) return bytes;
    /* sharded: units padded to R pieces (the embeddings emb_p, the head head_p, a block b_p, all n_p), the fp32
       reads f kept whole; a staging slot takes a block's gradients or the embeddings' */
    const int64_t L = layout->dims.num_layers, blocks_end = layout->blocks_offset + L * layout->block_stride;
    const double R = n_ranks, b_p = L > 0 ? R * (double)ceil_div(layout->block_stride, n_ranks) : 0.0;
    const double emb_p = R * (double)ceil_div(layout->blocks_offset, n_ranks);
    const double head_p = R * (double)ceil_div(layout->n_weights - blocks_end, n_ranks), e_p = emb_p + head_p;
    const double n_p = e_p + (double)L * b_p, stage = b_p > emb_p ? b_p : emb_p;
    bytes.weights = 2.0 * n_p;
    bytes.master = 4.0 * (s + (double)layout_gpu_fp32_read_values(layout, mode));
    if (mode == SHARD_GRADIENTS || mode == SHARD_FULL) bytes.gradients = 4.0 * (head_p + 2.0 * stage) + 4.0 * s;
    if (mode == SHARD_FULL) {
        bytes.weights = 2.0 * e_p;
        bytes.gathered = 2.0 * 2.0 * b_p;
    }
    return bytes;
}

double layout_state_total(const layout_state_bytes *bytes)
{
    return bytes->weights + bytes->gathered + bytes->gradients + bytes->master + bytes->moments + bytes->ema;
}
