/* model.c — the model families' common table and init, each family's block code by table, and the Wan 2.1 DiT on the CPU (packed forward/backward of the rectified-flow loss). */
#include "model/model.h"
#include "core/check.h"
#include "core/comm.h"
#include "model/mmdit.h"
#include "model/ops_cpu.h"
#include "model/ulysses.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the families' block code ----------------------------------------------------------------------- */

static double wan_forward_loss(model *m, const model_batch *batch, double *sample_loss);
static double wan_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss);
static int64_t wan_workspace_bytes(const model *m);

struct model_family {
    const char *name;
    void (*create)(model *m);    /* its own workspace beside model.c's (NULL: none) */
    void (*destroy)(model *m);
    double (*forward_loss)(model *m, const model_batch *batch, double *sample_loss);
    double (*forward_backward)(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss);
    void (*predict)(model *m, const model_batch *batch, float *output);   /* NULL: not built for the family */
    int64_t (*workspace_bytes)(const model *m);
};

static const model_family family_code[] = {
    [FAMILY_WAN] = {"wan", NULL, NULL, wan_forward_loss, wan_forward_backward, NULL, wan_workspace_bytes},
    [FAMILY_HUNYUANVIDEO15] = {"hunyuanvideo15", mmdit_create, mmdit_free, mmdit_forward_loss, mmdit_forward_backward,
                               mmdit_predict, mmdit_workspace_bytes},
};

/* ---- parameter table -------------------------------------------------------------------------- */

/* What one block keeps from its forward for its backward (rows: N tokens, L text rows, B samples). */
typedef struct {
    float *x_in;                              /* [N, D] block input */
    float *modulation;                        /* [6][B][D]: shift, scale, gate (attention), shift, scale, gate (FFN) */
    float *ln1_mean, *ln1_rstd, *h1;          /* modulated LN before self-attention */
    float *q_pre, *k_pre, *q_rstd, *k_rstd;   /* projections before RMSNorm */
    float *q, *k, *v, *attn, *attn_lse;       /* after RMSNorm and RoPE; attention output */
    float *y_attn, *x1;                       /* o projection; x after the gated residual */
    float *n3, *n3_mean, *n3_rstd;            /* norm3(x1) (x1 itself without cross_attn_norm) */
    float *cq_pre, *cq_rstd, *cq;             /* cross-attention queries */
    const float *context;                     /* [L, D] the caller's text context (kept, not copied) */
    float *ck_pre, *ck_rstd, *ck, *cv;        /* [L, D] keys and values from the text */
    float *cattn, *cattn_lse, *x2;            /* cross-attention output (before o); x after it */
    float *q_all, *k_all, *v_all, *attn_all;  /* sequence parallel: [T, D/k] this member's heads over all T rows */
    float *lse_all;                           /* [T, H/k] */
    float *ln2_mean, *ln2_rstd, *h2;          /* modulated LN before the FFN */
    float *ffn_pre, *ffn_act, *y_ffn;         /* [N, F] before/after GELU; [N, D] FFN output */
} block_saved;

struct model_workspace {
    layout_init *init;                        /* per parameter */
    layout_block *blocks;                     /* each block's offsets (model_layout_block) */
    /* packing of the current micro-batch; with sequence parallelism the token rows are this member's slice */
    int n_samples, samples_capacity;
    int64_t n_tokens, n_text, tokens_capacity;
    int64_t *token_start, *text_start;        /* [B+1]: each sample's rows among this member's (clamped), text rows */
    /* sequence parallelism: the group, this member's place, the whole micro-batch's rows and the slices */
    int sp_size, sp_rank, sp_capacity;
    const comm_group *sp_group;
    int64_t n_total, row_lo, max_sample;      /* tokens of the micro-batch; this member's first row; largest sample */
    int64_t *sample_start;                    /* [B+1] each sample's rows in the whole micro-batch */
    int64_t *slice_start;                     /* [k+1] each member's first row */
    int64_t *xchg_counts;                     /* [4k] an all-to-all's send/receive counts and displacements */
    int32_t *grid_f, *grid_h, *grid_w;        /* tokens per axis of each sample */
    int32_t *positions;                       /* [N, 3] */
    /* activations and scratch, carved from one arena */
    float *arena;
    int64_t arena_capacity, arena_used;       /* floats */
    block_saved *saved;
    float *tokens_in, *target, *x_final;                        /* [N, patch_in] [N, patch_out] [N, D] */
    float *text_pre, *text_act, *context;                       /* [L, D] */
    float *timesteps, *sinusoid, *time_pre, *time_act, *time_emb, *time_silu, *e0;
    float *head_shift, *head_scale, *head_mean, *head_rstd, *head_h, *pred;
    float *d_pred, *d_head_h, *d_x_a, *d_x_b, *d_x, *d_tmp1, *d_tmp2, *d_q, *d_k, *d_v, *d_ffn;
    float *d_context, *d_ctx1, *d_ctx2, *d_text_act, *d_mod, *d_e0, *d_time_emb, *d_time_b, *d_head_mod;
    float *video;                                               /* one sample's latent, for patchify */
    float *patches, *xchg;                                      /* sp: one sample's tokens; all-to-all packing */
    float *d_q_all, *d_k_all, *d_v_all, *d_attn_all;            /* sp: [T, D/k] */
};

void model_create_table(model *m, const deck *config)
{
    memset(m, 0, sizeof(*m));
    m->dim = config->model.dim;
    m->ffn_dim = config->model.ffn_dim;
    m->num_heads = config->model.num_heads;
    m->num_layers = config->model.num_layers;
    m->in_dim = config->model.in_dim;
    m->out_dim = config->model.out_dim;
    m->patch_t = config->model.patch_t;
    m->patch_h = config->model.patch_h;
    m->patch_w = config->model.patch_w;
    m->text_len = config->model.text_len;
    m->text_dim = config->model.text_dim;
    m->freq_dim = config->model.freq_dim;
    m->eps = (float)config->model.eps;
    m->qk_norm = config->model.qk_norm;
    m->cross_attn_norm = config->model.cross_attn_norm;
    m->init_std = config->model.init_std;
    m->family = config->model.family;
    m->text_2_dim = config->model.text_2_dim;
    m->image_dim = config->model.image_dim;
    m->rope_axes_t = config->model.rope_axes_t;
    ALDIT_CHECK(m->family == FAMILY_WAN || m->family == FAMILY_HUNYUANVIDEO15, "model: family %d unknown", (int)m->family);
    m->code = &family_code[m->family];
    ALDIT_CHECK(m->dim > 0 && m->num_heads > 0 && m->dim % m->num_heads == 0,
                "model: dim %d is not a positive multiple of num_heads %d", m->dim, m->num_heads);
    m->head_dim = m->dim / m->num_heads;
    ALDIT_CHECK(m->head_dim % 2 == 0, "model: head dim %d (dim/num_heads) must be even for RoPE", m->head_dim);
    ALDIT_CHECK(m->freq_dim > 0 && m->freq_dim % 2 == 0, "model: freq_dim %d must be even", m->freq_dim);
    ALDIT_CHECK(m->ffn_dim > 0 && m->num_layers >= 0 && m->in_dim > 0 && m->out_dim > 0 && m->text_dim > 0 &&
                    m->patch_t > 0 && m->patch_h > 0 && m->patch_w > 0,
                "model: dims must be positive");
    int patch_volume = m->patch_t * m->patch_h * m->patch_w;
    m->patch_in = m->in_dim * patch_volume;
    m->patch_out = m->out_dim * patch_volume;

    model_workspace *ws = xcalloc(1, sizeof(model_workspace));
    m->workspace = ws;
    layout_dims dims = layout_dims_of(config);
    model_layout_init(&m->layout, &dims);
    m->n_params = m->layout.n_params;
    m->n_weights = m->layout.n_weights;
    m->params = xcalloc((size_t)(m->n_params > 0 ? m->n_params : 1), sizeof(param_info));
    ws->init = xcalloc((size_t)(m->n_params > 0 ? m->n_params : 1), sizeof(layout_init));
    for (int i = 0; i < m->n_params; i++) {
        int layer;
        param_info *p = &m->params[i];
        const layout_tensor *t = model_layout_param(&m->layout, i, &layer, &p->offset);
        if (layer >= 0) snprintf(p->name, sizeof(p->name), "%s%d.%s", m->layout.block_prefix, layer, t->name);
        else snprintf(p->name, sizeof(p->name), "%s", t->name);
        p->ndim = t->ndim;
        memcpy(p->shape, t->shape, sizeof(p->shape));
        p->n_elements = t->n_elements;
        ws->init[i] = t->init;
    }
    ws->blocks = xcalloc((size_t)(m->num_layers > 0 ? m->num_layers : 1), sizeof(layout_block));
    for (int l = 0; l < m->num_layers; l++) ws->blocks[l] = model_layout_block(&m->layout, l);
    ws->saved = xcalloc((size_t)(m->num_layers > 0 ? m->num_layers : 1), sizeof(block_saved));
    if (m->code->create) m->code->create(m);
}

void model_create(model *m, const deck *config)
{
    model_create_table(m, config);
    m->weights = xcalloc((size_t)m->n_weights, sizeof(float));
}

void model_free(model *m)
{
    if (m->code && m->code->destroy) m->code->destroy(m);
    model_workspace *ws = m->workspace;
    if (ws) {
        free(ws->init);
        free(ws->blocks);
        free(ws->token_start);
        free(ws->text_start);
        free(ws->sample_start);
        free(ws->slice_start);
        free(ws->xchg_counts);
        free(ws->grid_f);
        free(ws->grid_h);
        free(ws->grid_w);
        free(ws->positions);
        free(ws->arena);
        free(ws->saved);
        free(ws);
    }
    free(m->params);
    free(m->weights);
    memset(m, 0, sizeof(*m));
}

const param_info *model_find_param(const model *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

/* ---- deterministic random init ----------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform_open(uint64_t *state)   /* in (0, 1) */
{
    return ((double)(splitmix64(state) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(uint64_t *state)
{
    double u1 = uniform_open(state), u2 = uniform_open(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Each parameter draws from its own stream, so its values depend only on (seed, its index). */
static uint64_t param_stream(uint64_t seed, int index)
{
    uint64_t state = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(index + 1));
    splitmix64(&state);
    return state;
}

void model_init_random_param(const model *m, uint64_t seed, int index, float *values)
{
    const param_info *p = &m->params[index];
    uint64_t state = param_stream(seed, index);
    /* Linear weights are [out, in]; the 5-D patch embedding counts as [dim, in_dim * patch]. */
    double fan_out = (double)p->shape[0], fan_in = (double)p->n_elements / p->shape[0];
    double bound = sqrt(6.0 / (fan_in + fan_out));
    for (int64_t j = 0; j < p->n_elements; j++) {
        switch (m->workspace->init[index]) {
        case LAYOUT_INIT_XAVIER: values[j] = (float)((2.0 * uniform_open(&state) - 1.0) * bound); break;
        case LAYOUT_INIT_NORMAL_STD: values[j] = (float)(normal(&state) * m->init_std); break;
        case LAYOUT_INIT_MODULATION: values[j] = (float)(normal(&state) / sqrt((double)m->dim)); break;
        case LAYOUT_INIT_ZERO: values[j] = 0.0f; break;
        case LAYOUT_INIT_ONE: values[j] = 1.0f; break;
        }
    }
}

void model_init_random(model *m, uint64_t seed)
{
    for (int i = 0; i < m->n_params; i++) model_init_random_param(m, seed, i, m->weights + m->params[i].offset);
}

void model_init_gaussian(model *m, uint64_t seed, float std)
{
    for (int i = 0; i < m->n_params; i++) {
        const param_info *p = &m->params[i];
        uint64_t state = param_stream(seed, i);
        float base = m->workspace->init[i] == LAYOUT_INIT_ONE ? 1.0f : 0.0f;
        for (int64_t j = 0; j < p->n_elements; j++)
            m->weights[p->offset + j] = base + (float)(normal(&state) * std);
    }
}

/* ---- packing and workspace --------------------------------------------------------------------- */

/* Hand out the next n floats of the arena (64-byte aligned); with base NULL only count. */
static float *take(float *base, int64_t *used, int64_t n)
{
    float *p = base ? base + *used : NULL;
    *used += (n + 15) / 16 * 16;
    return p;
}

static int64_t layout_workspace(model *m, float *base)
{
    model_workspace *ws = m->workspace;
    int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim, F = m->ffn_dim, H = m->num_heads;
    const int64_t sp = ws->sp_size > 1, T = sp ? ws->n_total : 0, Dk = D / ws->sp_size, Hk = H / ws->sp_size;
    int64_t used = 0;
    for (int l = 0; l < m->num_layers; l++) {
        block_saved *s = &ws->saved[l];
        s->x_in = take(base, &used, N * D);
        s->modulation = take(base, &used, 6 * B * D);
        s->ln1_mean = take(base, &used, N);
        s->ln1_rstd = take(base, &used, N);
        s->h1 = take(base, &used, N * D);
        s->q_pre = take(base, &used, N * D);
        s->k_pre = take(base, &used, N * D);
        s->q_rstd = take(base, &used, N);
        s->k_rstd = take(base, &used, N);
        s->q = take(base, &used, !sp * N * D);   /* in a group: the exchange's source, shared by the blocks (below) */
        s->k = take(base, &used, !sp * N * D);
        s->v = take(base, &used, !sp * N * D);
        s->attn = take(base, &used, N * D);
        s->attn_lse = take(base, &used, !sp * N * H);
        s->y_attn = take(base, &used, N * D);
        s->x1 = take(base, &used, N * D);
        s->n3 = take(base, &used, N * D);
        s->n3_mean = take(base, &used, N);
        s->n3_rstd = take(base, &used, N);
        s->cq_pre = take(base, &used, N * D);
        s->cq_rstd = take(base, &used, N);
        s->cq = take(base, &used, N * D);
        s->ck_pre = take(base, &used, L * D);
        s->ck_rstd = take(base, &used, L);
        s->ck = take(base, &used, L * D);
        s->cv = take(base, &used, L * D);
        s->cattn = take(base, &used, N * D);
        s->cattn_lse = take(base, &used, N * H);
        s->x2 = take(base, &used, N * D);
        s->q_all = take(base, &used, T * Dk);
        s->k_all = take(base, &used, T * Dk);
        s->v_all = take(base, &used, T * Dk);
        s->attn_all = take(base, &used, T * Dk);
        s->lse_all = take(base, &used, T * Hk);
        s->ln2_mean = take(base, &used, N);
        s->ln2_rstd = take(base, &used, N);
        s->h2 = take(base, &used, N * D);
        s->ffn_pre = take(base, &used, N * F);
        s->ffn_act = take(base, &used, N * F);
        s->y_ffn = take(base, &used, N * D);
    }
    ws->tokens_in = take(base, &used, N * m->patch_in);
    ws->target = take(base, &used, N * m->patch_out);
    ws->x_final = take(base, &used, N * D);
    ws->text_pre = take(base, &used, L * D);
    ws->text_act = take(base, &used, L * D);
    ws->context = take(base, &used, L * D);
    ws->timesteps = take(base, &used, B);
    ws->sinusoid = take(base, &used, B * m->freq_dim);
    ws->time_pre = take(base, &used, B * D);
    ws->time_act = take(base, &used, B * D);
    ws->time_emb = take(base, &used, B * D);
    ws->time_silu = take(base, &used, B * D);
    ws->e0 = take(base, &used, B * 6 * D);
    ws->head_shift = take(base, &used, B * D);
    ws->head_scale = take(base, &used, B * D);
    ws->head_mean = take(base, &used, N);
    ws->head_rstd = take(base, &used, N);
    ws->head_h = take(base, &used, N * D);
    ws->pred = take(base, &used, N * m->patch_out);
    ws->d_pred = take(base, &used, N * m->patch_out);
    ws->d_head_h = take(base, &used, N * D);
    ws->d_x_a = take(base, &used, N * D);
    ws->d_x_b = take(base, &used, N * D);
    ws->d_x = take(base, &used, N * D);
    ws->d_tmp1 = take(base, &used, N * D);
    ws->d_tmp2 = take(base, &used, N * D);
    ws->d_q = take(base, &used, N * D);
    ws->d_k = take(base, &used, N * D);
    ws->d_v = take(base, &used, N * D);
    ws->d_ffn = take(base, &used, N * F);
    ws->d_context = take(base, &used, L * D);
    ws->d_ctx1 = take(base, &used, L * D);
    ws->d_ctx2 = take(base, &used, L * D);
    ws->d_text_act = take(base, &used, L * D);
    ws->d_mod = take(base, &used, 6 * B * D);
    ws->d_e0 = take(base, &used, B * 6 * D);
    ws->d_time_emb = take(base, &used, B * D);
    ws->d_time_b = take(base, &used, B * D);
    ws->d_head_mod = take(base, &used, 2 * B * D);
    ws->video = take(base, &used, (sp ? ws->max_sample : N) * m->patch_in);   /* one sample's latent */
    ws->patches = take(base, &used, sp * ws->max_sample * m->patch_in);
    ws->xchg = take(base, &used, sp * N * D);
    if (sp) {   /* the blocks' backward reads q, k, v after the exchange (q_all, ...): their rows need not be kept */
        float *q = take(base, &used, N * D), *k = take(base, &used, N * D), *v = take(base, &used, N * D);
        for (int l = 0; l < m->num_layers; l++) {
            ws->saved[l].q = q;
            ws->saved[l].k = k;
            ws->saved[l].v = v;
        }
    }
    ws->d_q_all = take(base, &used, T * Dk);
    ws->d_k_all = take(base, &used, T * Dk);
    ws->d_v_all = take(base, &used, T * Dk);
    ws->d_attn_all = take(base, &used, T * Dk);
    return used;
}

/* The samples' grids and rows in the whole micro-batch (sample_start, text_start), each checked against the model. */
static void pack_samples(model *m, int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                         const int32_t *text_len)
{
    model_workspace *ws = m->workspace;
    ALDIT_CHECK(n_samples > 0, "model: a micro-batch needs at least one sample (got %d)", n_samples);
    if (n_samples > ws->samples_capacity) {
        ws->samples_capacity = n_samples;
        ws->token_start = xrealloc(ws->token_start, (size_t)(n_samples + 1) * sizeof(int64_t));
        ws->sample_start = xrealloc(ws->sample_start, (size_t)(n_samples + 1) * sizeof(int64_t));
        ws->text_start = xrealloc(ws->text_start, (size_t)(n_samples + 1) * sizeof(int64_t));
        ws->grid_f = xrealloc(ws->grid_f, (size_t)n_samples * sizeof(int32_t));
        ws->grid_h = xrealloc(ws->grid_h, (size_t)n_samples * sizeof(int32_t));
        ws->grid_w = xrealloc(ws->grid_w, (size_t)n_samples * sizeof(int32_t));
    }
    ws->n_samples = n_samples;
    ws->sample_start[0] = ws->text_start[0] = 0;
    ws->max_sample = 0;
    for (int b = 0; b < n_samples; b++) {
        if (frames[b] <= 0 || height[b] <= 0 || width[b] <= 0 || frames[b] % m->patch_t || height[b] % m->patch_h ||
            width[b] % m->patch_w)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE,
                             "model: sample %d of the micro-batch has latent %dx%dx%d, not a positive multiple of "
                             "the patch %dx%dx%d",
                             b, frames[b], height[b], width[b], m->patch_t, m->patch_h, m->patch_w);
        if (text_len[b] < 0 || text_len[b] > m->text_len)
            ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has %d text tokens (0..%d allowed)",
                             b, text_len[b], m->text_len);
        ws->grid_f[b] = frames[b] / m->patch_t;
        ws->grid_h[b] = height[b] / m->patch_h;
        ws->grid_w[b] = width[b] / m->patch_w;
        const int64_t tokens = (int64_t)ws->grid_f[b] * ws->grid_h[b] * ws->grid_w[b];
        if (tokens > ws->max_sample) ws->max_sample = tokens;
        ws->sample_start[b + 1] = ws->sample_start[b] + tokens;
        ws->text_start[b + 1] = ws->text_start[b] + text_len[b];
    }
    ws->n_total = ws->sample_start[n_samples];
    ws->n_text = ws->text_start[n_samples];
}

/* This member's slice of the packed rows: member p of k holds [p*T/k, (p+1)*T/k); token_start are the samples' rows
   within it (clamped: a sample outside the slice has none). k = 1: the whole micro-batch. */
static void pack_slice(model *m, int sp_size, int sp_rank, const comm_group *group)
{
    model_workspace *ws = m->workspace;
    if (sp_size > ws->sp_capacity) {
        ws->sp_capacity = sp_size;
        ws->slice_start = xrealloc(ws->slice_start, (size_t)(sp_size + 1) * sizeof(int64_t));
        ws->xchg_counts = xrealloc(ws->xchg_counts, 4 * (size_t)sp_size * sizeof(int64_t));
    }
    ws->sp_size = sp_size;
    ws->sp_rank = sp_rank;
    ws->sp_group = group;
    ulysses_split(ws->n_total, sp_size, ws->slice_start);
    ws->row_lo = ws->slice_start[sp_rank];
    ws->n_tokens = ws->slice_start[sp_rank + 1] - ws->row_lo;
    for (int b = 0; b <= ws->n_samples; b++) {
        const int64_t row = ws->sample_start[b] - ws->row_lo;
        ws->token_start[b] = row < 0 ? 0 : row > ws->n_tokens ? ws->n_tokens : row;
    }
}

/* Pack for this member (sizes the arena and carves it). */
static void pack_member(model *m, int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                        const int32_t *text_len, int sp_size, int sp_rank, const comm_group *group)
{
    model_workspace *ws = m->workspace;
    pack_samples(m, n_samples, frames, height, width, text_len);
    pack_slice(m, sp_size, sp_rank, group);
    if (ws->n_total > ws->tokens_capacity) {
        ws->tokens_capacity = ws->n_total;
        ws->positions = xrealloc(ws->positions, (size_t)ws->n_total * 3 * sizeof(int32_t));
    }
    cpu_rope_positions(n_samples, ws->grid_f, ws->grid_h, ws->grid_w, ws->positions);
    int64_t needed = layout_workspace(m, NULL);
    ws->arena_used = needed;
    if (needed > ws->arena_capacity) {
        free(ws->arena);
        ws->arena_capacity = needed + needed / 4;   /* slack, so that slowly growing batches rarely reallocate */
        ws->arena = xmalloc((size_t)ws->arena_capacity * sizeof(float));
    }
    layout_workspace(m, ws->arena);
}

/* The one-block entry points are Wan's block code (the GPU model's oracle). */
static void check_wan(const model *m, const char *what)
{
    ALDIT_CHECK(m->family == FAMILY_WAN, "model: %s is Wan's block code, not model.family = %s's", what,
                m->code ? m->code->name : "?");
}

int64_t model_pack(model *m, int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                   const int32_t *text_len, int64_t *n_text)
{
    check_wan(m, "model_pack");
    pack_member(m, n_samples, frames, height, width, text_len, 1, 0, NULL);
    *n_text = m->workspace->n_text;
    return m->workspace->n_tokens;
}

static int64_t wan_workspace_bytes(const model *m)
{
    const model_workspace *ws = m->workspace;
    return ws->arena_used * (int64_t)sizeof(float) + ws->n_total * 3 * (int64_t)sizeof(int32_t) +
           (ws->n_samples + 1) * 2 * (int64_t)sizeof(int64_t) + ws->n_samples * 3 * (int64_t)sizeof(int32_t);
}

/* ---- one block ------------------------------------------------------------------------------------ */

static const float *param(const model *m, int64_t offset) { return offset < 0 ? NULL : m->weights + offset; }
static float *grad(float *grads, int64_t offset) { return offset < 0 ? NULL : grads + offset; }

/* Wan's e = block.modulation + e0, stored chunk-major [6][B][D] so each chunk is a [B, D] table. */
static void block_modulation(const model *m, const float *modulation_param, const float *e0, float *modulation)
{
    int64_t B = m->workspace->n_samples, D = m->dim;
    for (int chunk = 0; chunk < 6; chunk++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < D; c++)
                modulation[(chunk * B + b) * D + c] = modulation_param[chunk * D + c] + e0[b * 6 * D + chunk * D + c];
}

/* q/k RMSNorm over the full dim when qk_norm, else a copy. */
static void qk_norm_fwd(const model *m, const float *x, int64_t n_rows, int64_t weight_offset, float *y, float *rstd)
{
    if (weight_offset >= 0)
        cpu_rmsnorm_fwd(x, n_rows, m->dim, param(m, weight_offset), m->eps, y, rstd);
    else
        memcpy(y, x, (size_t)(n_rows * m->dim) * sizeof(float));
}

static void qk_norm_bwd(const model *m, const float *x, float *dy_to_dx, int64_t n_rows, int64_t weight_offset,
                        const float *rstd, float *grads)
{
    if (weight_offset >= 0)   /* in place: the RMSNorm backward reads each row's dy before writing its dx */
        cpu_rmsnorm_bwd(x, dy_to_dx, n_rows, m->dim, param(m, weight_offset), rstd, dy_to_dx,
                        grad(grads, weight_offset));
}

/* ---- sequence parallelism: the exchange over heads (Ulysses) ------------------------------------------------------ */

/* This member's rows' RoPE positions. */
static const int32_t *slice_positions(const model_workspace *ws) { return ws->positions + ws->row_lo * 3; }

/* local [N, D] (this member's rows, every head) -> all [T, D/k] (every row, this member's heads), and back. */
static void to_heads(model *m, const float *local, float *all)
{
    model_workspace *ws = m->workspace;
    ulysses_to_heads(ws->sp_group, ws->slice_start, m->dim, local, all, ws->xchg, ws->xchg_counts);
}

static void to_tokens(model *m, const float *all, float *local)
{
    model_workspace *ws = m->workspace;
    ulysses_to_rows(ws->sp_group, ws->slice_start, m->dim, all, local, ws->xchg, ws->xchg_counts);
}

/* Self-attention of the block's q, k, v (after RMSNorm and RoPE) into s->attn: alone, over this rank's samples; in a
   group, over all T rows for this member's heads between the two exchanges. */
static void self_attention_fwd(model *m, block_saved *s)
{
    model_workspace *ws = m->workspace;
    if (ws->sp_size <= 1) {
        cpu_attention_fwd(s->q, s->k, s->v, m->num_heads, m->head_dim, ws->token_start, ws->token_start,
                          ws->n_samples, s->attn, s->attn_lse);
        return;
    }
    to_heads(m, s->q, s->q_all);
    to_heads(m, s->k, s->k_all);
    to_heads(m, s->v, s->v_all);
    cpu_attention_fwd(s->q_all, s->k_all, s->v_all, m->num_heads / ws->sp_size, m->head_dim, ws->sample_start,
                      ws->sample_start, ws->n_samples, s->attn_all, s->lse_all);
    to_tokens(m, s->attn_all, s->attn);
}

/* Its backward: d_attn (this rank's rows) -> ws->d_q, d_k, d_v (this rank's rows, before RoPE's backward). */
static void self_attention_bwd(model *m, const block_saved *s, const float *d_attn)
{
    model_workspace *ws = m->workspace;
    if (ws->sp_size <= 1) {
        cpu_attention_bwd(s->q, s->k, s->v, s->attn, d_attn, s->attn_lse, m->num_heads, m->head_dim, ws->token_start,
                          ws->token_start, ws->n_samples, ws->d_q, ws->d_k, ws->d_v);
        return;
    }
    to_heads(m, d_attn, ws->d_attn_all);
    cpu_attention_bwd(s->q_all, s->k_all, s->v_all, s->attn_all, ws->d_attn_all, s->lse_all,
                      m->num_heads / ws->sp_size, m->head_dim, ws->sample_start, ws->sample_start, ws->n_samples,
                      ws->d_q_all, ws->d_k_all, ws->d_v_all);
    to_tokens(m, ws->d_q_all, ws->d_q);
    to_tokens(m, ws->d_k_all, ws->d_k);
    to_tokens(m, ws->d_v_all, ws->d_v);
}

void model_block_forward(model *m, int layer, const float *x_in, const float *e0, const float *context, float *x_out)
{
    check_wan(m, "model_block_forward");
    model_workspace *ws = m->workspace;
    const layout_block *bo = &ws->blocks[layer];
    block_saved *s = &ws->saved[layer];
    int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim;
    const int64_t *rows = ws->token_start;
    if (s->x_in != x_in) memcpy(s->x_in, x_in, (size_t)(N * D) * sizeof(float));
    s->context = context;
    block_modulation(m, param(m, bo->modulation), e0, s->modulation);
    const float *mod[6];
    for (int chunk = 0; chunk < 6; chunk++) mod[chunk] = s->modulation + chunk * B * D;

    /* x1 = x + SelfAttn(LN(x) (1 + e1) + e0) e2 */
    cpu_ln_modulate_fwd(s->x_in, N, (int)D, rows, (int)B, mod[0], mod[1], m->eps, s->h1, s->ln1_mean, s->ln1_rstd);
    cpu_linear_fwd(s->h1, N, (int)D, (int)D, param(m, bo->self_q.weight), param(m, bo->self_q.bias), s->q_pre);
    cpu_linear_fwd(s->h1, N, (int)D, (int)D, param(m, bo->self_k.weight), param(m, bo->self_k.bias), s->k_pre);
    cpu_linear_fwd(s->h1, N, (int)D, (int)D, param(m, bo->self_v.weight), param(m, bo->self_v.bias), s->v);
    qk_norm_fwd(m, s->q_pre, N, bo->self_norm_q, s->q, s->q_rstd);
    qk_norm_fwd(m, s->k_pre, N, bo->self_norm_k, s->k, s->k_rstd);
    cpu_rope_fwd(s->q, N, m->num_heads, m->head_dim, slice_positions(ws), s->q);
    cpu_rope_fwd(s->k, N, m->num_heads, m->head_dim, slice_positions(ws), s->k);
    self_attention_fwd(m, s);
    cpu_linear_fwd(s->attn, N, (int)D, (int)D, param(m, bo->self_o.weight), param(m, bo->self_o.bias), s->y_attn);
    memcpy(s->x1, s->x_in, (size_t)(N * D) * sizeof(float));
    cpu_gated_residual_fwd(s->x1, s->y_attn, (int)D, rows, (int)B, mod[2]);

    /* x2 = x1 + CrossAttn(norm3(x1), context): each sample's queries see only its own text rows */
    if (m->cross_attn_norm)
        cpu_layernorm_fwd(s->x1, N, (int)D, param(m, bo->norm3_weight), param(m, bo->norm3_bias), m->eps, s->n3,
                          s->n3_mean, s->n3_rstd);
    else
        memcpy(s->n3, s->x1, (size_t)(N * D) * sizeof(float));
    cpu_linear_fwd(s->n3, N, (int)D, (int)D, param(m, bo->cross_q.weight), param(m, bo->cross_q.bias), s->cq_pre);
    qk_norm_fwd(m, s->cq_pre, N, bo->cross_norm_q, s->cq, s->cq_rstd);
    cpu_linear_fwd(context, L, (int)D, (int)D, param(m, bo->cross_k.weight), param(m, bo->cross_k.bias), s->ck_pre);
    qk_norm_fwd(m, s->ck_pre, L, bo->cross_norm_k, s->ck, s->ck_rstd);
    cpu_linear_fwd(context, L, (int)D, (int)D, param(m, bo->cross_v.weight), param(m, bo->cross_v.bias), s->cv);
    cpu_attention_fwd(s->cq, s->ck, s->cv, m->num_heads, m->head_dim, rows, ws->text_start, (int)B, s->cattn,
                      s->cattn_lse);
    cpu_linear_fwd(s->cattn, N, (int)D, (int)D, param(m, bo->cross_o.weight), param(m, bo->cross_o.bias), s->x2);
    for (int64_t i = 0; i < N * D; i++) s->x2[i] += s->x1[i];

    /* x_out = x2 + FFN(LN(x2) (1 + e4) + e3) e5 */
    cpu_ln_modulate_fwd(s->x2, N, (int)D, rows, (int)B, mod[3], mod[4], m->eps, s->h2, s->ln2_mean, s->ln2_rstd);
    cpu_linear_fwd(s->h2, N, (int)D, m->ffn_dim, param(m, bo->ffn_in.weight), param(m, bo->ffn_in.bias), s->ffn_pre);
    cpu_gelu_tanh_fwd(s->ffn_pre, N * m->ffn_dim, s->ffn_act);
    cpu_linear_fwd(s->ffn_act, N, m->ffn_dim, (int)D, param(m, bo->ffn_out.weight), param(m, bo->ffn_out.bias),
                   s->y_ffn);
    memcpy(x_out, s->x2, (size_t)(N * D) * sizeof(float));
    cpu_gated_residual_fwd(x_out, s->y_ffn, (int)D, rows, (int)B, mod[5]);
}

void model_block_backward(model *m, int layer, const float *dx_out, float *dx_in, float *de0, float *dcontext,
                          float *grads)
{
    check_wan(m, "model_block_backward");
    model_workspace *ws = m->workspace;
    const layout_block *bo = &ws->blocks[layer];
    const block_saved *s = &ws->saved[layer];
    int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim, F = m->ffn_dim;
    const int64_t *rows = ws->token_start;
    const float *mod[6];
    float *d_mod[6];
    for (int chunk = 0; chunk < 6; chunk++) {
        mod[chunk] = s->modulation + chunk * B * D;
        d_mod[chunk] = ws->d_mod + chunk * B * D;
    }
    float *d_x = ws->d_x, *t1 = ws->d_tmp1, *t2 = ws->d_tmp2;

    /* FFN branch */
    cpu_gated_residual_bwd(dx_out, s->y_ffn, (int)D, rows, (int)B, mod[5], t1, d_mod[5]);
    cpu_linear_bwd(s->ffn_act, t1, N, (int)F, (int)D, param(m, bo->ffn_out.weight), ws->d_ffn, 0,
                   grad(grads, bo->ffn_out.weight), grad(grads, bo->ffn_out.bias));
    cpu_gelu_tanh_bwd(s->ffn_pre, ws->d_ffn, N * F, ws->d_ffn);
    cpu_linear_bwd(s->h2, ws->d_ffn, N, (int)D, (int)F, param(m, bo->ffn_in.weight), t2, 0,
                   grad(grads, bo->ffn_in.weight), grad(grads, bo->ffn_in.bias));
    cpu_ln_modulate_bwd(s->x2, t2, N, (int)D, rows, (int)B, mod[4], s->ln2_mean, s->ln2_rstd, d_x, d_mod[3],
                        d_mod[4]);
    for (int64_t i = 0; i < N * D; i++) d_x[i] += dx_out[i];   /* d_x = dL/dx2 */

    /* cross-attention branch */
    cpu_linear_bwd(s->cattn, d_x, N, (int)D, (int)D, param(m, bo->cross_o.weight), t1, 0,
                   grad(grads, bo->cross_o.weight), grad(grads, bo->cross_o.bias));
    cpu_attention_bwd(s->cq, s->ck, s->cv, s->cattn, t1, s->cattn_lse, m->num_heads, m->head_dim, rows,
                      ws->text_start, (int)B, t2, ws->d_ctx1, ws->d_ctx2);
    cpu_linear_bwd(s->context, ws->d_ctx2, L, (int)D, (int)D, param(m, bo->cross_v.weight), dcontext, 1,
                   grad(grads, bo->cross_v.weight), grad(grads, bo->cross_v.bias));
    qk_norm_bwd(m, s->ck_pre, ws->d_ctx1, L, bo->cross_norm_k, s->ck_rstd, grads);
    cpu_linear_bwd(s->context, ws->d_ctx1, L, (int)D, (int)D, param(m, bo->cross_k.weight), dcontext, 1,
                   grad(grads, bo->cross_k.weight), grad(grads, bo->cross_k.bias));
    qk_norm_bwd(m, s->cq_pre, t2, N, bo->cross_norm_q, s->cq_rstd, grads);
    cpu_linear_bwd(s->n3, t2, N, (int)D, (int)D, param(m, bo->cross_q.weight), t1, 0,
                   grad(grads, bo->cross_q.weight), grad(grads, bo->cross_q.bias));
    if (m->cross_attn_norm) {
        cpu_layernorm_bwd(s->x1, t1, N, (int)D, param(m, bo->norm3_weight), s->n3_mean, s->n3_rstd, t2,
                          grad(grads, bo->norm3_weight), grad(grads, bo->norm3_bias));
        for (int64_t i = 0; i < N * D; i++) d_x[i] += t2[i];
    } else {
        for (int64_t i = 0; i < N * D; i++) d_x[i] += t1[i];
    }   /* d_x = dL/dx1 */

    /* self-attention branch */
    cpu_gated_residual_bwd(d_x, s->y_attn, (int)D, rows, (int)B, mod[2], t1, d_mod[2]);
    cpu_linear_bwd(s->attn, t1, N, (int)D, (int)D, param(m, bo->self_o.weight), t2, 0,
                   grad(grads, bo->self_o.weight), grad(grads, bo->self_o.bias));
    self_attention_bwd(m, s, t2);
    cpu_rope_bwd(ws->d_q, N, m->num_heads, m->head_dim, slice_positions(ws), ws->d_q);
    cpu_rope_bwd(ws->d_k, N, m->num_heads, m->head_dim, slice_positions(ws), ws->d_k);
    qk_norm_bwd(m, s->q_pre, ws->d_q, N, bo->self_norm_q, s->q_rstd, grads);
    qk_norm_bwd(m, s->k_pre, ws->d_k, N, bo->self_norm_k, s->k_rstd, grads);
    cpu_linear_bwd(s->h1, ws->d_q, N, (int)D, (int)D, param(m, bo->self_q.weight), t1, 0,
                   grad(grads, bo->self_q.weight), grad(grads, bo->self_q.bias));
    cpu_linear_bwd(s->h1, ws->d_k, N, (int)D, (int)D, param(m, bo->self_k.weight), t1, 1,
                   grad(grads, bo->self_k.weight), grad(grads, bo->self_k.bias));
    cpu_linear_bwd(s->h1, ws->d_v, N, (int)D, (int)D, param(m, bo->self_v.weight), t1, 1,
                   grad(grads, bo->self_v.weight), grad(grads, bo->self_v.bias));
    cpu_ln_modulate_bwd(s->x_in, t1, N, (int)D, rows, (int)B, mod[1], s->ln1_mean, s->ln1_rstd, t2, d_mod[0],
                        d_mod[1]);
    for (int64_t i = 0; i < N * D; i++) dx_in[i] = d_x[i] + t2[i];

    /* e = modulation + e0: both receive the per-sample chunk gradients */
    float *d_modulation = grads + bo->modulation;
    for (int chunk = 0; chunk < 6; chunk++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < D; c++) {
                float g = d_mod[chunk][b * D + c];
                d_modulation[chunk * D + c] += g;
                de0[b * 6 * D + chunk * D + c] += g;
            }
}

/* ---- whole model ---------------------------------------------------------------------------------- */

/* Patchify ws->video (sample b's latent) into this rank's rows of `tokens` (the inputs, channel_last 0, or the
   targets, 1): in place when alone; in a group through ws->patches, keeping the sample's rows of this member's slice. */
static void patchify_rows(model *m, const model_batch *batch, int b, int channel_last, float *tokens)
{
    model_workspace *ws = m->workspace;
    const int channels = channel_last ? m->out_dim : m->in_dim, width = channel_last ? m->patch_out : m->patch_in;
    float *into = ws->sp_size > 1 ? ws->patches : tokens + ws->token_start[b] * width;
    cpu_patchify(ws->video, channels, batch->frames[b], batch->height[b], batch->width[b], m->patch_t, m->patch_h,
                 m->patch_w, channel_last, into);
    if (ws->sp_size <= 1) return;
    const int64_t first = ws->row_lo + ws->token_start[b] - ws->sample_start[b];   /* the sample's first row here */
    memcpy(tokens + ws->token_start[b] * width, ws->patches + first * width,
           (size_t)((ws->token_start[b + 1] - ws->token_start[b]) * width) * sizeof(float));
}

/* Pack the batch, build the patchified inputs x_t and targets eps - x0 (in the head's output order); in a group, of
   this member's rows only. */
static void prepare_batch(model *m, const model_batch *batch)
{
    ALDIT_CHECK(m->in_dim == m->out_dim, "model: the flow-matching loss needs in_dim (%d) == out_dim (%d)",
                m->in_dim, m->out_dim);
    ulysses_check_group(m, batch);
    const int sp_size = batch->sp_size > 1 ? batch->sp_size : 1;
    pack_member(m, batch->n_samples, batch->frames, batch->height, batch->width, batch->text_len, sp_size,
                sp_size > 1 ? batch->sp_rank : 0, batch->sp_group);
    model_workspace *ws = m->workspace;
    int64_t latent_offset = 0;
    for (int b = 0; b < batch->n_samples; b++) {
        float sigma = batch->sigma[b];
        if (!(sigma >= 0.0f && sigma <= 1.0f))
            ALDIT_FATAL("model: sample %d of the micro-batch has sigma %g outside [0, 1]", b, sigma);
        int64_t n_values = (int64_t)m->in_dim * batch->frames[b] * batch->height[b] * batch->width[b];
        const float *x0 = batch->latents + latent_offset, *noise = batch->noise + latent_offset;
        ws->timesteps[b] = 1000.0f * sigma;
        latent_offset += n_values;
        if (ws->token_start[b + 1] == ws->token_start[b]) continue;   /* none of its rows is this member's */
        for (int64_t i = 0; i < n_values; i++) ws->video[i] = (1.0f - sigma) * x0[i] + sigma * noise[i];
        patchify_rows(m, batch, b, 0, ws->tokens_in);
        for (int64_t i = 0; i < n_values; i++) ws->video[i] = noise[i] - x0[i];
        patchify_rows(m, batch, b, 1, ws->target);
    }
}

/* Forward of the whole model; returns the summed per-sample MSE (in a group, this member's part of it). */
static double model_forward(model *m, const model_batch *batch, double *sample_loss)
{
    model_workspace *ws = m->workspace;
    prepare_batch(m, batch);
    int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim;

    /* embeddings: patches, text (Linear, GELU-tanh, Linear), time (sinusoid, Linear, SiLU, Linear), projection */
    float *x = m->num_layers > 0 ? ws->saved[0].x_in : ws->x_final;
    cpu_linear_fwd(ws->tokens_in, N, m->patch_in, (int)D, param(m, m->layout.patch.weight), param(m, m->layout.patch.bias), x);
    cpu_linear_fwd(batch->text, L, m->text_dim, (int)D, param(m, m->layout.text_in.weight), param(m, m->layout.text_in.bias),
                   ws->text_pre);
    cpu_gelu_tanh_fwd(ws->text_pre, L * D, ws->text_act);
    cpu_linear_fwd(ws->text_act, L, (int)D, (int)D, param(m, m->layout.text_out.weight), param(m, m->layout.text_out.bias),
                   ws->context);
    cpu_sinusoidal_embedding(ws->timesteps, (int)B, m->freq_dim, ws->sinusoid);
    cpu_linear_fwd(ws->sinusoid, B, m->freq_dim, (int)D, param(m, m->layout.time_in.weight), param(m, m->layout.time_in.bias),
                   ws->time_pre);
    cpu_silu_fwd(ws->time_pre, B * D, ws->time_act);
    cpu_linear_fwd(ws->time_act, B, (int)D, (int)D, param(m, m->layout.time_out.weight), param(m, m->layout.time_out.bias),
                   ws->time_emb);
    cpu_silu_fwd(ws->time_emb, B * D, ws->time_silu);
    cpu_linear_fwd(ws->time_silu, B, (int)D, 6 * (int)D, param(m, m->layout.time_projection.weight),
                   param(m, m->layout.time_projection.bias), ws->e0);

    for (int l = 0; l < m->num_layers; l++)
        model_block_forward(m, l, ws->saved[l].x_in, ws->e0, ws->context,
                            l + 1 < m->num_layers ? ws->saved[l + 1].x_in : ws->x_final);

    /* head: LN modulated by head.modulation + e (the time embedding, no SiLU), then Linear */
    const float *head_mod = param(m, m->layout.head_modulation);
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < D; c++) {
            ws->head_shift[b * D + c] = head_mod[c] + ws->time_emb[b * D + c];
            ws->head_scale[b * D + c] = head_mod[D + c] + ws->time_emb[b * D + c];
        }
    cpu_ln_modulate_fwd(ws->x_final, N, (int)D, ws->token_start, (int)B, ws->head_shift, ws->head_scale, m->eps,
                        ws->head_h, ws->head_mean, ws->head_rstd);
    cpu_linear_fwd(ws->head_h, N, (int)D, m->patch_out, param(m, m->layout.head.weight), param(m, m->layout.head.bias), ws->pred);

    double total = 0.0;
    for (int64_t b = 0; b < B; b++) {
        double sum_sq = 0.0;
        for (int64_t i = ws->token_start[b] * m->patch_out; i < ws->token_start[b + 1] * m->patch_out; i++) {
            double diff = (double)ws->pred[i] - ws->target[i];
            sum_sq += diff * diff;
        }
        double loss = sum_sq / (double)((ws->sample_start[b + 1] - ws->sample_start[b]) * m->patch_out);
        if (sample_loss) sample_loss[b] = loss;
        total += loss;
    }
    return total;
}

static double wan_forward_loss(model *m, const model_batch *batch, double *sample_loss)
{
    return model_forward(m, batch, sample_loss);
}

static double wan_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss)
{
    double total = model_forward(m, batch, sample_loss);
    model_workspace *ws = m->workspace;
    int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim;

    /* d(sum of per-sample means)/d(pred) = 2 (pred - target) / n_b, scaled once here for every gradient */
    for (int64_t b = 0; b < B; b++) {
        int64_t begin = ws->token_start[b] * m->patch_out, end = ws->token_start[b + 1] * m->patch_out;
        float coef = grad_scale * 2.0f / (float)((ws->sample_start[b + 1] - ws->sample_start[b]) * m->patch_out);
        for (int64_t i = begin; i < end; i++) ws->d_pred[i] = coef * (ws->pred[i] - ws->target[i]);
    }

    /* head */
    cpu_linear_bwd(ws->head_h, ws->d_pred, N, (int)D, m->patch_out, param(m, m->layout.head.weight), ws->d_head_h, 0,
                   grad(grads, m->layout.head.weight), grad(grads, m->layout.head.bias));
    float *d_head_shift = ws->d_head_mod, *d_head_scale = ws->d_head_mod + B * D;
    cpu_ln_modulate_bwd(ws->x_final, ws->d_head_h, N, (int)D, ws->token_start, (int)B, ws->head_scale, ws->head_mean,
                        ws->head_rstd, ws->d_x_a, d_head_shift, d_head_scale);
    float *d_head_modulation = grads + m->layout.head_modulation;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < D; c++) {
            d_head_modulation[c] += d_head_shift[b * D + c];
            d_head_modulation[D + c] += d_head_scale[b * D + c];
            ws->d_time_emb[b * D + c] = d_head_shift[b * D + c] + d_head_scale[b * D + c];
        }

    /* blocks, last to first */
    memset(ws->d_e0, 0, (size_t)(B * 6 * D) * sizeof(float));
    memset(ws->d_context, 0, (size_t)(L * D) * sizeof(float));
    float *d_out = ws->d_x_a, *d_in = ws->d_x_b;
    for (int l = m->num_layers - 1; l >= 0; l--) {
        model_block_backward(m, l, d_out, d_in, ws->d_e0, ws->d_context, grads);
        float *swap = d_out;
        d_out = d_in;
        d_in = swap;
    }

    /* embeddings */
    cpu_linear_bwd(ws->tokens_in, d_out, N, m->patch_in, (int)D, param(m, m->layout.patch.weight), NULL, 0,
                   grad(grads, m->layout.patch.weight), grad(grads, m->layout.patch.bias));
    cpu_linear_bwd(ws->text_act, ws->d_context, L, (int)D, (int)D, param(m, m->layout.text_out.weight), ws->d_text_act, 0,
                   grad(grads, m->layout.text_out.weight), grad(grads, m->layout.text_out.bias));
    cpu_gelu_tanh_bwd(ws->text_pre, ws->d_text_act, L * D, ws->d_text_act);
    cpu_linear_bwd(batch->text, ws->d_text_act, L, m->text_dim, (int)D, param(m, m->layout.text_in.weight), NULL, 0,
                   grad(grads, m->layout.text_in.weight), grad(grads, m->layout.text_in.bias));
    cpu_linear_bwd(ws->time_silu, ws->d_e0, B, (int)D, 6 * (int)D, param(m, m->layout.time_projection.weight), ws->d_time_b,
                   0, grad(grads, m->layout.time_projection.weight), grad(grads, m->layout.time_projection.bias));
    cpu_silu_bwd(ws->time_emb, ws->d_time_b, B * D, ws->d_time_b);
    for (int64_t i = 0; i < B * D; i++) ws->d_time_emb[i] += ws->d_time_b[i];
    cpu_linear_bwd(ws->time_act, ws->d_time_emb, B, (int)D, (int)D, param(m, m->layout.time_out.weight), ws->d_time_b, 0,
                   grad(grads, m->layout.time_out.weight), grad(grads, m->layout.time_out.bias));
    cpu_silu_bwd(ws->time_pre, ws->d_time_b, B * D, ws->d_time_b);
    cpu_linear_bwd(ws->sinusoid, ws->d_time_b, B, m->freq_dim, (int)D, param(m, m->layout.time_in.weight), NULL, 0,
                   grad(grads, m->layout.time_in.weight), grad(grads, m->layout.time_in.bias));
    return total;
}

double model_forward_loss(model *m, const model_batch *batch, double *sample_loss)
{
    return m->code->forward_loss(m, batch, sample_loss);
}

double model_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss)
{
    return m->code->forward_backward(m, batch, grads, grad_scale, sample_loss);
}

void model_predict(model *m, const model_batch *batch, float *output)
{
    ALDIT_CHECK(m->code->predict, "model: model_predict is not built for model.family = %s", m->code->name);
    m->code->predict(m, batch, output);
}

int64_t model_workspace_bytes(const model *m)
{
    return m->code->workspace_bytes(m);
}
