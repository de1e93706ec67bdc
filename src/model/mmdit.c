/* mmdit.c — HunyuanVideo-1.5's MMDiT on the CPU: packed varlen forward/backward of the rectified-flow loss, fp32, alone or on a sequence-parallel group (Ulysses). */
#include "model/mmdit.h"
#include "core/check.h"
#include "model/ops_cpu.h"
#include "model/ulysses.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What one dual-stream block keeps for its backward (this member's video rows N and joint text rows L, samples B; the
   joint rows J = all video and text rows of the micro-batch, for this member's H/k heads: k = 1, every head). */
typedef struct {
    float *x_in, *c_in;                                   /* [N, D], [L, D] */
    float *mod, *mod_c;                                   /* [6][B][D]: shift, scale, gate (attention), (MLP) */
    float *ln1_mean, *ln1_rstd, *h1, *lnc1_mean, *lnc1_rstd, *hc1;
    float *q_pre, *k_pre, *q_rstd, *k_rstd;               /* [N, D], [N H] */
    float *qc_pre, *kc_pre, *qc_rstd, *kc_rstd;           /* [L, D], [L H] */
    float *jq, *jk, *jv, *ja, *lse;                       /* joint [J, D/k] per sample [video; text]; [J, H/k] */
    float *a, *ac, *y_attn, *yc_attn, *x1, *c1;
    float *ln2_mean, *ln2_rstd, *h2, *lnc2_mean, *lnc2_rstd, *hc2;
    float *ff_pre, *ff_act, *y_ff, *ffc_pre, *ffc_act, *yc_ff;   /* [N, F], [N, F], [N, D]; text alike */
} mm_saved;

/* One refiner block's (Qwen rows Q). */
typedef struct {
    float *r_in, *gates;                                  /* [Q, D]; [B, 2D] */
    float *n1, *n1_mean, *n1_rstd, *q, *k, *v, *attn, *lse, *y_attn, *r1;
    float *n2, *n2_mean, *n2_rstd, *ff_pre, *ff_act, *y_ff;
} ref_saved;

struct mmdit_workspace {
    int n_samples, capacity;
    int64_t n_tokens, n_text, n_qwen, n_byt5, n_image;   /* this member's video and text rows; the sources' (all) */
    int64_t *tok, *txt, *joint, *qwen, *byt5, *image, *sample_values;   /* [B + 1] row starts (all); input values */
    /* sequence parallelism (k = 1: this rank alone, every row its own): the group, each stream's slices */
    int sp_size, sp_capacity;
    const comm_group *sp_group;
    int64_t n_video_all, n_text_all, tok_lo, txt_lo, max_sample;   /* Tv, Tt; this member's first rows; largest S */
    int64_t *tok_here, *txt_here;                 /* [B + 1] each sample's rows among this member's (clamped) */
    int64_t *tok_slice, *txt_slice, *xchg_counts; /* [k + 1] each member's first video, text row; [4k] exchange */
    int32_t *grid_f, *grid_h, *grid_w, *positions;
    float *arena;
    int64_t arena_capacity, arena_used;
    mm_saved *saved;
    ref_saved refiner[LAYOUT_MMDIT_REFINER_LAYERS];
    /* embeddings */
    float *tokens_in, *target, *video, *timesteps, *sinusoid;
    float *t_pre, *t_act, *temb, *temb_silu;                               /* [B, D] */
    float *rt_pre, *rt_act, *pooled, *rp_pre, *rp_act, *cvec, *cvec_silu;   /* refiner conditioning [B, D] */
    float *qwen_r;                                                          /* refiner output [Q, D] */
    float *g_norm, *g_mean, *g_rstd, *g1_pre, *g1_act, *g2_pre, *g2_act;    /* ByT5 path */
    float *i_norm, *i_mean, *i_rstd, *i1_pre, *i1_act, *i2, *i_mean2, *i_rstd2;   /* image path */
    float *g_out, *i_out;                                                   /* [G, D], [I, D] */
    float *x_final, *c_final, *head_mod, *head_mean, *head_rstd, *head_h, *pred;
    /* gradients and scratch */
    float *d_pred, *d_x, *d_xb, *d_c, *d_cb, *t1, *t2, *tc1, *tc2, *d_joint, *dq, *dk, *dv, *dqc, *dkc, *dvc;
    float *d_ff, *d_ffc, *d_mod, *d_emb, *d_rows, *d_temb_silu, *d_temb, *d_tb, *d_head_mod;
    float *d_q_r, *d_r1, *d_r2, *d_rq, *d_rk, *d_rv, *d_rff, *d_gates, *d_cvec_silu, *d_cvec;
    float *d_g, *d_g1, *d_g2, *d_i, *d_i1, *d_i2, *d_src_a, *d_src_b;
    float *context, *d_context;   /* [Tt, D] the whole micro-batch's joint text, its gradient (k = 1: the blocks') */
    float *dh;                    /* [N, D] d h1 (k = 1: in dq) */
    float *v_all, *t_all, *xchg, *patches;   /* groups: [Tv, D/k], [Tt, D/k], the exchange's packing, one sample's */
};

void mmdit_create(model *m)
{
    m->mmdit = xcalloc(1, sizeof(mmdit_workspace));
    m->mmdit->saved = xcalloc((size_t)(m->num_layers > 0 ? m->num_layers : 1), sizeof(mm_saved));
}

void mmdit_free(model *m)
{
    mmdit_workspace *ws = m->mmdit;
    if (!ws) return;
    free(ws->tok); free(ws->txt); free(ws->joint); free(ws->qwen); free(ws->byt5); free(ws->image);
    free(ws->sample_values); free(ws->tok_here); free(ws->txt_here); free(ws->tok_slice); free(ws->txt_slice);
    free(ws->xchg_counts); free(ws->grid_f); free(ws->grid_h); free(ws->grid_w); free(ws->positions);
    free(ws->arena); free(ws->saved); free(ws);
    m->mmdit = NULL;
}

/* ---- workspace ---------------------------------------------------------------------------------------- */

static float *take(float *base, int64_t *used, int64_t n)
{
    float *p = base ? base + *used : NULL;
    *used += (n + 15) / 16 * 16;
    return p;
}

static void carve_block(mm_saved *s, float *base, int64_t *u, int64_t N, int64_t L, int64_t J, int64_t B, int64_t D,
                        int64_t H, int64_t F, int k)
{
    s->x_in = take(base, u, N * D); s->c_in = take(base, u, L * D);
    s->mod = take(base, u, 6 * B * D); s->mod_c = take(base, u, 6 * B * D);
    s->ln1_mean = take(base, u, N); s->ln1_rstd = take(base, u, N); s->h1 = take(base, u, N * D);
    s->lnc1_mean = take(base, u, L); s->lnc1_rstd = take(base, u, L); s->hc1 = take(base, u, L * D);
    s->q_pre = take(base, u, N * D); s->k_pre = take(base, u, N * D);
    s->q_rstd = take(base, u, N * H); s->k_rstd = take(base, u, N * H);
    s->qc_pre = take(base, u, L * D); s->kc_pre = take(base, u, L * D);
    s->qc_rstd = take(base, u, L * H); s->kc_rstd = take(base, u, L * H);
    s->jq = take(base, u, J * D / k); s->jk = take(base, u, J * D / k); s->jv = take(base, u, J * D / k);
    s->ja = take(base, u, J * D / k); s->lse = take(base, u, J * H / k);
    s->a = take(base, u, N * D); s->ac = take(base, u, L * D);
    s->y_attn = take(base, u, N * D); s->yc_attn = take(base, u, L * D);
    s->x1 = take(base, u, N * D); s->c1 = take(base, u, L * D);
    s->ln2_mean = take(base, u, N); s->ln2_rstd = take(base, u, N); s->h2 = take(base, u, N * D);
    s->lnc2_mean = take(base, u, L); s->lnc2_rstd = take(base, u, L); s->hc2 = take(base, u, L * D);
    s->ff_pre = take(base, u, N * F); s->ff_act = take(base, u, N * F); s->y_ff = take(base, u, N * D);
    s->ffc_pre = take(base, u, L * F); s->ffc_act = take(base, u, L * F); s->yc_ff = take(base, u, L * D);
}

static void carve_refiner(ref_saved *s, float *base, int64_t *u, int64_t Q, int64_t B, int64_t D, int64_t H)
{
    const int64_t R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D;
    s->r_in = take(base, u, Q * D); s->gates = take(base, u, 2 * B * D);
    s->n1 = take(base, u, Q * D); s->n1_mean = take(base, u, Q); s->n1_rstd = take(base, u, Q);
    s->q = take(base, u, Q * D); s->k = take(base, u, Q * D); s->v = take(base, u, Q * D);
    s->attn = take(base, u, Q * D); s->lse = take(base, u, Q * H); s->y_attn = take(base, u, Q * D);
    s->r1 = take(base, u, Q * D);
    s->n2 = take(base, u, Q * D); s->n2_mean = take(base, u, Q); s->n2_rstd = take(base, u, Q);
    s->ff_pre = take(base, u, Q * R); s->ff_act = take(base, u, Q * R); s->y_ff = take(base, u, Q * D);
}

static int64_t carve(model *m, float *base)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim, H = m->num_heads, F = m->ffn_dim;
    const int64_t Q = ws->n_qwen, G = ws->n_byt5, I = ws->n_image, E = LAYOUT_MMDIT_BYT5_HIDDEN, R = 4 * D;
    const int64_t T = m->text_dim, T2 = m->text_2_dim, IM = m->image_dim, P = m->patch_in, PO = m->patch_out;
    const int k = ws->sp_size, sp = k > 1;
    const int64_t J = ws->n_video_all + ws->n_text_all, Dk = D / k;
    int64_t u = 0;
    for (int l = 0; l < m->num_layers; l++) carve_block(&ws->saved[l], base, &u, N, L, J, B, D, H, F, k);
    for (int i = 0; i < LAYOUT_MMDIT_REFINER_LAYERS; i++) carve_refiner(&ws->refiner[i], base, &u, Q, B, D, H);
    ws->tokens_in = take(base, &u, N * P); ws->target = take(base, &u, N * PO);
    ws->video = take(base, &u, (sp ? ws->max_sample : N) * P);   /* one sample's input latent */
    ws->timesteps = take(base, &u, B); ws->sinusoid = take(base, &u, B * m->freq_dim);
    ws->t_pre = take(base, &u, B * D); ws->t_act = take(base, &u, B * D);
    ws->temb = take(base, &u, B * D); ws->temb_silu = take(base, &u, B * D);
    ws->rt_pre = take(base, &u, B * D); ws->rt_act = take(base, &u, B * D); ws->pooled = take(base, &u, B * T);
    ws->rp_pre = take(base, &u, B * D); ws->rp_act = take(base, &u, B * D);
    ws->cvec = take(base, &u, B * D); ws->cvec_silu = take(base, &u, B * D);
    ws->qwen_r = take(base, &u, Q * D);
    ws->g_norm = take(base, &u, G * T2); ws->g_mean = take(base, &u, G); ws->g_rstd = take(base, &u, G);
    ws->g1_pre = take(base, &u, G * E); ws->g1_act = take(base, &u, G * E);
    ws->g2_pre = take(base, &u, G * E); ws->g2_act = take(base, &u, G * E);
    ws->i_norm = take(base, &u, I * IM); ws->i_mean = take(base, &u, I); ws->i_rstd = take(base, &u, I);
    ws->i1_pre = take(base, &u, I * IM); ws->i1_act = take(base, &u, I * IM); ws->i2 = take(base, &u, I * D);
    ws->i_mean2 = take(base, &u, I); ws->i_rstd2 = take(base, &u, I);
    ws->g_out = take(base, &u, G * D); ws->i_out = take(base, &u, I * D);
    ws->x_final = take(base, &u, N * D); ws->c_final = take(base, &u, L * D);
    ws->head_mod = take(base, &u, 2 * B * D); ws->head_mean = take(base, &u, N); ws->head_rstd = take(base, &u, N);
    ws->head_h = take(base, &u, N * D); ws->pred = take(base, &u, N * PO);
    ws->d_pred = take(base, &u, N * PO);
    ws->d_x = take(base, &u, N * D); ws->d_xb = take(base, &u, N * D);
    ws->d_c = take(base, &u, L * D); ws->d_cb = take(base, &u, L * D);
    ws->t1 = take(base, &u, N * D); ws->t2 = take(base, &u, N * D);
    ws->tc1 = take(base, &u, L * D); ws->tc2 = take(base, &u, L * D);
    ws->d_joint = take(base, &u, J * Dk);
    ws->dq = take(base, &u, J * Dk); ws->dk = take(base, &u, J * Dk); ws->dv = take(base, &u, J * Dk);
    ws->dqc = take(base, &u, L * D); ws->dkc = take(base, &u, L * D); ws->dvc = take(base, &u, L * D);
    ws->d_ff = take(base, &u, N * F); ws->d_ffc = take(base, &u, L * F);
    ws->d_mod = take(base, &u, 6 * B * D); ws->d_emb = take(base, &u, 6 * B * D); ws->d_rows = take(base, &u, 6 * B * D);
    ws->d_temb_silu = take(base, &u, B * D); ws->d_temb = take(base, &u, B * D); ws->d_tb = take(base, &u, B * D);
    ws->d_head_mod = take(base, &u, 2 * B * D);
    ws->d_q_r = take(base, &u, Q * D); ws->d_r1 = take(base, &u, Q * D); ws->d_r2 = take(base, &u, Q * D);
    ws->d_rq = take(base, &u, Q * D); ws->d_rk = take(base, &u, Q * D); ws->d_rv = take(base, &u, Q * D);
    ws->d_rff = take(base, &u, Q * R); ws->d_gates = take(base, &u, 2 * B * D);
    ws->d_cvec_silu = take(base, &u, B * D); ws->d_cvec = take(base, &u, B * D);
    ws->d_g = take(base, &u, G * D); ws->d_g1 = take(base, &u, G * E); ws->d_g2 = take(base, &u, G * E);
    ws->d_i = take(base, &u, I * D); ws->d_i1 = take(base, &u, I * IM); ws->d_i2 = take(base, &u, I * D);
    const int64_t src = G * T2 > I * IM ? G * T2 : I * IM;
    ws->d_src_a = take(base, &u, src); ws->d_src_b = take(base, &u, src);
    /* alone, the blocks' own buffers serve as the whole joint text, its gradient and d h1 */
    const int64_t Tt = ws->n_text_all, Tv = ws->n_video_all, rows = N > L ? N : L;
    ws->context = sp ? take(base, &u, Tt * D) : m->num_layers > 0 ? ws->saved[0].c_in : ws->c_final;
    ws->d_context = sp ? take(base, &u, Tt * D) : ws->d_c;
    ws->dh = sp ? take(base, &u, N * D) : ws->dq;
    ws->v_all = take(base, &u, sp * Tv * Dk); ws->t_all = take(base, &u, sp * Tt * Dk);
    ws->xchg = take(base, &u, sp * rows * D);
    ws->patches = take(base, &u, sp * ws->max_sample * (P > PO ? P : PO));
    (void)T;
    return u;
}

/* ---- packing ------------------------------------------------------------------------------------------ */

static int32_t length_of(const int32_t *lengths, int b) { return lengths ? lengths[b] : 0; }

static void grow_tables(mmdit_workspace *ws, int B)
{
    if (B <= ws->capacity) return;
    ws->capacity = B;
    int64_t **tables[] = {&ws->tok, &ws->txt, &ws->joint, &ws->qwen, &ws->byt5, &ws->image, &ws->sample_values,
                          &ws->tok_here, &ws->txt_here};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        *tables[i] = xrealloc(*tables[i], (size_t)(B + 1) * sizeof(int64_t));
    ws->grid_f = xrealloc(ws->grid_f, (size_t)B * sizeof(int32_t));
    ws->grid_h = xrealloc(ws->grid_h, (size_t)B * sizeof(int32_t));
    ws->grid_w = xrealloc(ws->grid_w, (size_t)B * sizeof(int32_t));
}

/* One sample's sizes checked against the model (exit 2 naming it). */
static void check_sample(const model *m, const model_batch *batch, int b)
{
    const int32_t f = batch->frames[b], h = batch->height[b], w = batch->width[b];
    if (f <= 0 || h <= 0 || w <= 0 || f % m->patch_t || h % m->patch_h || w % m->patch_w)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has latent %dx%dx%d, not a positive "
                         "multiple of the patch %dx%dx%d", b, f, h, w, m->patch_t, m->patch_h, m->patch_w);
    if (batch->text_len[b] < 1 || batch->text_len[b] > m->text_len)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has %d Qwen text tokens (1..%d "
                         "allowed: the refiner pools over them)", b, batch->text_len[b], m->text_len);
    if (length_of(batch->text_2_len, b) < 0 || length_of(batch->image_len, b) < 0)
        ALDIT_FATAL_CODE(ALDIT_EXIT_USAGE, "model: sample %d of the micro-batch has a negative ByT5 or image length", b);
}

/* A sample's rows of a stream among this member's (of `starts`, its rows from lo, n of them), clamped: a sample outside
   the slice has none. */
static void clamp_rows(const int64_t *starts, int B, int64_t lo, int64_t n, int64_t *here)
{
    for (int b = 0; b <= B; b++) {
        const int64_t row = starts[b] - lo;
        here[b] = row < 0 ? 0 : row > n ? n : row;
    }
}

/* This member's slices of the two streams: member p of k holds video rows [p Tv/k, (p+1) Tv/k) and text rows
   [p Tt/k, (p+1) Tt/k) (mmdit.h); k = 1: every row. */
static void pack_slices(model *m, const model_batch *batch)
{
    mmdit_workspace *ws = m->mmdit;
    const int B = ws->n_samples, k = batch->sp_size > 1 ? batch->sp_size : 1, member = k > 1 ? batch->sp_rank : 0;
    if (k > ws->sp_capacity) {
        ws->sp_capacity = k;
        ws->tok_slice = xrealloc(ws->tok_slice, (size_t)(k + 1) * sizeof(int64_t));
        ws->txt_slice = xrealloc(ws->txt_slice, (size_t)(k + 1) * sizeof(int64_t));
        ws->xchg_counts = xrealloc(ws->xchg_counts, 4 * (size_t)k * sizeof(int64_t));
    }
    ws->sp_size = k;
    ws->sp_group = k > 1 ? batch->sp_group : NULL;
    ulysses_split(ws->n_video_all, k, ws->tok_slice);
    ulysses_split(ws->n_text_all, k, ws->txt_slice);
    ws->tok_lo = ws->tok_slice[member];
    ws->txt_lo = ws->txt_slice[member];
    ws->n_tokens = ws->tok_slice[member + 1] - ws->tok_lo;
    ws->n_text = ws->txt_slice[member + 1] - ws->txt_lo;
    clamp_rows(ws->tok, B, ws->tok_lo, ws->n_tokens, ws->tok_here);
    clamp_rows(ws->txt, B, ws->txt_lo, ws->n_text, ws->txt_here);
}

/* Row starts of every sample's video, joint text and sources, this member's slices; sizes the arena and carves it. */
static void pack(model *m, const model_batch *batch)
{
    mmdit_workspace *ws = m->mmdit;
    const int B = batch->n_samples;
    ALDIT_CHECK(B > 0, "model: a micro-batch needs at least one sample (got %d)", B);
    ulysses_check_group(m, batch);
    grow_tables(ws, B);
    ws->n_samples = B;
    ws->max_sample = 0;
    ws->tok[0] = ws->txt[0] = ws->joint[0] = ws->qwen[0] = ws->byt5[0] = ws->image[0] = ws->sample_values[0] = 0;
    for (int b = 0; b < B; b++) {
        check_sample(m, batch, b);
        ws->grid_f[b] = batch->frames[b] / m->patch_t;
        ws->grid_h[b] = batch->height[b] / m->patch_h;
        ws->grid_w[b] = batch->width[b] / m->patch_w;
        const int64_t S = (int64_t)ws->grid_f[b] * ws->grid_h[b] * ws->grid_w[b];
        const int64_t Q = batch->text_len[b], G = length_of(batch->text_2_len, b), I = length_of(batch->image_len, b);
        ws->tok[b + 1] = ws->tok[b] + S;
        if (S > ws->max_sample) ws->max_sample = S;
        ws->txt[b + 1] = ws->txt[b] + I + G + Q;
        ws->joint[b + 1] = ws->joint[b] + S + I + G + Q;
        ws->qwen[b + 1] = ws->qwen[b] + Q;
        ws->byt5[b + 1] = ws->byt5[b] + G;
        ws->image[b + 1] = ws->image[b] + I;
        ws->sample_values[b + 1] = ws->sample_values[b] + (int64_t)batch->frames[b] * batch->height[b] * batch->width[b];
    }
    ws->n_video_all = ws->tok[B];
    ws->n_text_all = ws->txt[B];
    ws->n_qwen = ws->qwen[B];
    ws->n_byt5 = ws->byt5[B];
    ws->n_image = ws->image[B];
    pack_slices(m, batch);
    ws->positions = xrealloc(ws->positions, (size_t)(3 * ws->n_video_all) * sizeof(int32_t));
    cpu_rope_positions(B, ws->grid_f, ws->grid_h, ws->grid_w, ws->positions);
    ws->arena_used = carve(m, NULL);
    if (ws->arena_used > ws->arena_capacity) {
        free(ws->arena);
        ws->arena_capacity = ws->arena_used;
        ws->arena = xmalloc((size_t)ws->arena_capacity * sizeof(float));
    }
    carve(m, ws->arena);
}

int64_t mmdit_workspace_bytes(const model *m)
{
    const mmdit_workspace *ws = m->mmdit;
    return ws->arena_used * (int64_t)sizeof(float) + 3 * 4 * ws->n_video_all + 9 * 8 * (ws->n_samples + 1) +
           3 * 4 * ws->n_samples + 8 * (2 * (ws->sp_size + 1) + 4 * ws->sp_size);
}

/* ---- small helpers ---------------------------------------------------------------------------------------- */

static const float *param(const model *m, int64_t offset) { return m->weights + offset; }
static float *grad(float *grads, int64_t offset) { return grads + offset; }

static void lin_f(const model *m, const layout_linear *l, const float *x, int64_t rows, int64_t in, int64_t out, float *y)
{
    cpu_linear_fwd(x, rows, (int)in, (int)out, param(m, l->weight), param(m, l->bias), y);
}

static void lin_b(const model *m, const layout_linear *l, const float *x, const float *dy, int64_t rows, int64_t in,
                  int64_t out, float *dx, int accumulate, float *grads)
{
    cpu_linear_bwd(x, dy, rows, (int)in, (int)out, param(m, l->weight), dx, accumulate, grad(grads, l->weight),
                   grad(grads, l->bias));
}

static void add_into(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* [B][k D] rows (a Linear's output) to [k][B][D] chunks, and back (the backward). */
static void to_chunks(const float *rows, int64_t B, int64_t k, int64_t D, float *chunks)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < k; c++) memcpy(chunks + (c * B + b) * D, rows + (b * k + c) * D, (size_t)D * sizeof(float));
}

static void from_chunks(const float *chunks, int64_t B, int64_t k, int64_t D, float *rows)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < k; c++) memcpy(rows + (b * k + c) * D, chunks + (c * B + b) * D, (size_t)D * sizeof(float));
}

/* Joint rows: sample b's video rows then its text rows (gather), and back (scatter); every row of the micro-batch,
   D values each (alone: every head; in a group: this member's). */
static void joint_gather(const mmdit_workspace *ws, const float *video, const float *text, int64_t D, float *joint)
{
    for (int b = 0; b < ws->n_samples; b++) {
        const int64_t S = ws->tok[b + 1] - ws->tok[b], L = ws->txt[b + 1] - ws->txt[b];
        memcpy(joint + ws->joint[b] * D, video + ws->tok[b] * D, (size_t)(S * D) * sizeof(float));
        memcpy(joint + (ws->joint[b] + S) * D, text + ws->txt[b] * D, (size_t)(L * D) * sizeof(float));
    }
}

static void joint_scatter(const mmdit_workspace *ws, const float *joint, int64_t D, float *video, float *text)
{
    for (int b = 0; b < ws->n_samples; b++) {
        const int64_t S = ws->tok[b + 1] - ws->tok[b], L = ws->txt[b + 1] - ws->txt[b];
        memcpy(video + ws->tok[b] * D, joint + ws->joint[b] * D, (size_t)(S * D) * sizeof(float));
        memcpy(text + ws->txt[b] * D, joint + (ws->joint[b] + S) * D, (size_t)(L * D) * sizeof(float));
    }
}

/* The joint rows for attention from this member's rows of each stream: alone, every sample's [video; text] over every
   head; in a group, every row of the micro-batch for this member's heads (each stream exchanged rows to heads). */
static void joint_from_streams(model *m, const float *video, const float *text, float *joint)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t D = m->dim;
    if (ws->sp_size <= 1) {
        joint_gather(ws, video, text, D, joint);
        return;
    }
    ulysses_to_heads(ws->sp_group, ws->tok_slice, D, video, ws->v_all, ws->xchg, ws->xchg_counts);
    ulysses_to_heads(ws->sp_group, ws->txt_slice, D, text, ws->t_all, ws->xchg, ws->xchg_counts);
    joint_gather(ws, ws->v_all, ws->t_all, D / ws->sp_size, joint);
}

/* Its reverse: joint rows (this member's heads) back to this member's rows of each stream (every head). */
static void joint_to_streams(model *m, const float *joint, float *video, float *text)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t D = m->dim;
    if (ws->sp_size <= 1) {
        joint_scatter(ws, joint, D, video, text);
        return;
    }
    joint_scatter(ws, joint, D / ws->sp_size, ws->v_all, ws->t_all);
    ulysses_to_rows(ws->sp_group, ws->tok_slice, D, ws->v_all, video, ws->xchg, ws->xchg_counts);
    ulysses_to_rows(ws->sp_group, ws->txt_slice, D, ws->t_all, text, ws->xchg, ws->xchg_counts);
}

/* This member's video rows' RoPE positions (by their place in the whole micro-batch). */
static const int32_t *my_positions(const mmdit_workspace *ws) { return ws->positions + 3 * ws->tok_lo; }

static void rope_axes(const model *m, int axes[3])
{
    const int pairs = m->head_dim / 2, t = m->rope_axes_t / 2;
    axes[0] = t;
    axes[1] = axes[2] = (pairs - t) / 2;
}

/* ---- one dual-stream block ------------------------------------------------------------------------------- */

static void block_attention_fwd(model *m, const layout_mmdit_block *bo, mm_saved *s)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t N = ws->n_tokens, L = ws->n_text, D = m->dim, H = m->num_heads, hd = m->head_dim;
    int axes[3];
    rope_axes(m, axes);
    float *q = ws->t1, *k = ws->t2, *qc = ws->tc1, *kc = ws->tc2;
    lin_f(m, &bo->to_q, s->h1, N, D, D, s->q_pre);
    lin_f(m, &bo->to_k, s->h1, N, D, D, s->k_pre);
    lin_f(m, &bo->to_v, s->h1, N, D, D, s->a);   /* v, until gathered */
    cpu_rmsnorm_fwd(s->q_pre, N * H, (int)hd, param(m, bo->norm_q), m->eps, q, s->q_rstd);
    cpu_rmsnorm_fwd(s->k_pre, N * H, (int)hd, param(m, bo->norm_k), m->eps, k, s->k_rstd);
    cpu_rope_axes_fwd(q, N, (int)H, (int)hd, my_positions(ws), axes, LAYOUT_MMDIT_ROPE_THETA, q);
    cpu_rope_axes_fwd(k, N, (int)H, (int)hd, my_positions(ws), axes, LAYOUT_MMDIT_ROPE_THETA, k);
    lin_f(m, &bo->add_q, s->hc1, L, D, D, s->qc_pre);
    lin_f(m, &bo->add_k, s->hc1, L, D, D, s->kc_pre);
    lin_f(m, &bo->add_v, s->hc1, L, D, D, s->ac);
    cpu_rmsnorm_fwd(s->qc_pre, L * H, (int)hd, param(m, bo->norm_added_q), m->eps, qc, s->qc_rstd);
    cpu_rmsnorm_fwd(s->kc_pre, L * H, (int)hd, param(m, bo->norm_added_k), m->eps, kc, s->kc_rstd);
    joint_from_streams(m, q, qc, s->jq);
    joint_from_streams(m, k, kc, s->jk);
    joint_from_streams(m, s->a, s->ac, s->jv);
    cpu_attention_fwd(s->jq, s->jk, s->jv, (int)(H / ws->sp_size), (int)hd, ws->joint, ws->joint, ws->n_samples, s->ja,
                      s->lse);
    joint_to_streams(m, s->ja, s->a, s->ac);
}

static void block_fwd(model *m, int layer, const float *x_in, const float *c_in, float *x_out, float *c_out)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit_block bo = model_layout_mmdit_block(&m->layout, layer);
    mm_saved *s = &ws->saved[layer];
    const int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim, F = m->ffn_dim;
    if (s->x_in != x_in) memcpy(s->x_in, x_in, (size_t)(N * D) * sizeof(float));
    if (s->c_in != c_in) memcpy(s->c_in, c_in, (size_t)(L * D) * sizeof(float));
    lin_f(m, &bo.norm1, ws->temb_silu, B, D, 6 * D, ws->d_emb);
    to_chunks(ws->d_emb, B, 6, D, s->mod);
    lin_f(m, &bo.norm1_context, ws->temb_silu, B, D, 6 * D, ws->d_emb);
    to_chunks(ws->d_emb, B, 6, D, s->mod_c);
    const float *mx = s->mod, *mc = s->mod_c;
#define CH(base, i) ((base) + (i) * B * D)
    cpu_ln_modulate_fwd(s->x_in, N, (int)D, ws->tok_here, (int)B, CH(mx, 0), CH(mx, 1), m->eps, s->h1, s->ln1_mean,
                        s->ln1_rstd);
    cpu_ln_modulate_fwd(s->c_in, L, (int)D, ws->txt_here, (int)B, CH(mc, 0), CH(mc, 1), m->eps, s->hc1, s->lnc1_mean,
                        s->lnc1_rstd);
    block_attention_fwd(m, &bo, s);
    lin_f(m, &bo.to_out, s->a, N, D, D, s->y_attn);
    lin_f(m, &bo.to_add_out, s->ac, L, D, D, s->yc_attn);
    memcpy(s->x1, s->x_in, (size_t)(N * D) * sizeof(float));
    memcpy(s->c1, s->c_in, (size_t)(L * D) * sizeof(float));
    cpu_gated_residual_fwd(s->x1, s->y_attn, (int)D, ws->tok_here, (int)B, CH(mx, 2));
    cpu_gated_residual_fwd(s->c1, s->yc_attn, (int)D, ws->txt_here, (int)B, CH(mc, 2));
    cpu_ln_modulate_fwd(s->x1, N, (int)D, ws->tok_here, (int)B, CH(mx, 3), CH(mx, 4), m->eps, s->h2, s->ln2_mean,
                        s->ln2_rstd);
    cpu_ln_modulate_fwd(s->c1, L, (int)D, ws->txt_here, (int)B, CH(mc, 3), CH(mc, 4), m->eps, s->hc2, s->lnc2_mean,
                        s->lnc2_rstd);
    lin_f(m, &bo.ff_in, s->h2, N, D, F, s->ff_pre);
    cpu_gelu_tanh_fwd(s->ff_pre, N * F, s->ff_act);
    lin_f(m, &bo.ff_out, s->ff_act, N, F, D, s->y_ff);
    lin_f(m, &bo.ff_context_in, s->hc2, L, D, F, s->ffc_pre);
    cpu_gelu_tanh_fwd(s->ffc_pre, L * F, s->ffc_act);
    lin_f(m, &bo.ff_context_out, s->ffc_act, L, F, D, s->yc_ff);
    memcpy(x_out, s->x1, (size_t)(N * D) * sizeof(float));
    memcpy(c_out, s->c1, (size_t)(L * D) * sizeof(float));
    cpu_gated_residual_fwd(x_out, s->y_ff, (int)D, ws->tok_here, (int)B, CH(mx, 5));
    cpu_gated_residual_fwd(c_out, s->yc_ff, (int)D, ws->txt_here, (int)B, CH(mc, 5));
}

/* q/k RMSNorm and RoPE backward of one stream's projections: dq, dk in place to the pre-norm gradients. */
static void qk_bwd(model *m, const float *q_pre, const float *k_pre, const float *q_rstd, const float *k_rstd,
                   int64_t rows, int64_t norm_q, int64_t norm_k, int rope, float *dq, float *dk, float *grads)
{
    const int64_t H = m->num_heads, hd = m->head_dim;
    int axes[3];
    rope_axes(m, axes);
    if (rope) {
        cpu_rope_axes_bwd(dq, rows, (int)H, (int)hd, my_positions(m->mmdit), axes, LAYOUT_MMDIT_ROPE_THETA, dq);
        cpu_rope_axes_bwd(dk, rows, (int)H, (int)hd, my_positions(m->mmdit), axes, LAYOUT_MMDIT_ROPE_THETA, dk);
    }
    cpu_rmsnorm_bwd(q_pre, dq, rows * H, (int)hd, param(m, norm_q), q_rstd, dq, grad(grads, norm_q));
    cpu_rmsnorm_bwd(k_pre, dk, rows * H, (int)hd, param(m, norm_k), k_rstd, dk, grad(grads, norm_k));
}

/* Given d(attention output) of both streams in s->a-shaped dA (video) and dAc (text): into d h1 (ws->t1) and
   d hc1 (ws->tc1). */
static void block_attention_bwd(model *m, const layout_mmdit_block *bo, const mm_saved *s, const float *dA,
                                const float *dAc, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t N = ws->n_tokens, L = ws->n_text, D = m->dim, H = m->num_heads, hd = m->head_dim;
    joint_from_streams(m, dA, dAc, ws->d_joint);
    cpu_attention_bwd(s->jq, s->jk, s->jv, s->ja, ws->d_joint, s->lse, (int)(H / ws->sp_size), (int)hd, ws->joint,
                      ws->joint, ws->n_samples, ws->dq, ws->dk, ws->dv);
    float *dq = ws->t1, *dk = ws->t2, *dv = ws->d_xb;   /* video rows; text rows into dqc, dkc, dvc */
    joint_to_streams(m, ws->dq, dq, ws->dqc);
    joint_to_streams(m, ws->dk, dk, ws->dkc);
    joint_to_streams(m, ws->dv, dv, ws->dvc);
    qk_bwd(m, s->q_pre, s->k_pre, s->q_rstd, s->k_rstd, N, bo->norm_q, bo->norm_k, 1, dq, dk, grads);
    qk_bwd(m, s->qc_pre, s->kc_pre, s->qc_rstd, s->kc_rstd, L, bo->norm_added_q, bo->norm_added_k, 0, ws->dqc,
           ws->dkc, grads);
    float *dh = ws->dh, *dhc = ws->tc1;   /* alone, dh is dq (joint), free again */
    lin_b(m, &bo->to_q, s->h1, dq, N, D, D, dh, 0, grads);
    lin_b(m, &bo->to_k, s->h1, dk, N, D, D, dh, 1, grads);
    lin_b(m, &bo->to_v, s->h1, dv, N, D, D, dh, 1, grads);
    lin_b(m, &bo->add_q, s->hc1, ws->dqc, L, D, D, dhc, 0, grads);
    lin_b(m, &bo->add_k, s->hc1, ws->dkc, L, D, D, dhc, 1, grads);
    lin_b(m, &bo->add_v, s->hc1, ws->dvc, L, D, D, dhc, 1, grads);
    memcpy(ws->t1, dh, (size_t)(N * D) * sizeof(float));
}

/* One stream's MLP branch backward: given d(out) (dy), into d(x1) (dx1, overwritten) and the modulation chunks. */
static void stream_mlp_bwd(model *m, const layout_linear *ff_in, const layout_linear *ff_out, const float *x1,
                           const float *h2, const float *pre, const float *act, const float *y, const float *mod,
                           const float *mean, const float *rstd, const int64_t *rows, int64_t n, const float *dy,
                           float *dmod, float *scratch, float *dff, float *dx1, float *grads)
{
    const int64_t B = m->mmdit->n_samples, D = m->dim, F = m->ffn_dim;
    cpu_gated_residual_bwd(dy, y, (int)D, rows, (int)B, mod + 5 * B * D, scratch, dmod + 5 * B * D);
    lin_b(m, ff_out, act, scratch, n, F, D, dff, 0, grads);
    cpu_gelu_tanh_bwd(pre, dff, n * F, dff);
    lin_b(m, ff_in, h2, dff, n, D, F, scratch, 0, grads);
    cpu_ln_modulate_bwd(x1, scratch, n, (int)D, rows, (int)B, mod + 4 * B * D, mean, rstd, dx1, dmod + 3 * B * D,
                        dmod + 4 * B * D);
    add_into(dx1, dy, n * D);
}

/* Backward of block `layer`: dx, dc (gradients of its outputs) are replaced by those of its inputs. */
static void block_bwd(model *m, int layer, float *dx, float *dc, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit_block bo = model_layout_mmdit_block(&m->layout, layer);
    const mm_saved *s = &ws->saved[layer];
    const int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim;
    float *dmod = ws->d_mod, *dmod_c = ws->d_emb;   /* [6][B][D] each */
    float *dx1 = ws->d_xb, *dc1 = ws->d_cb;
    stream_mlp_bwd(m, &bo.ff_in, &bo.ff_out, s->x1, s->h2, s->ff_pre, s->ff_act, s->y_ff, s->mod, s->ln2_mean,
                   s->ln2_rstd, ws->tok_here, N, dx, dmod, ws->t1, ws->d_ff, dx1, grads);
    stream_mlp_bwd(m, &bo.ff_context_in, &bo.ff_context_out, s->c1, s->hc2, s->ffc_pre, s->ffc_act, s->yc_ff,
                   s->mod_c, s->lnc2_mean, s->lnc2_rstd, ws->txt_here, L, dc, dmod_c, ws->tc1, ws->d_ffc, dc1, grads);
    /* attention branch: x1 = x + y_attn * gate; dx, dc now hold d x1, d c1 (the residual passes) */
    memcpy(dx, dx1, (size_t)(N * D) * sizeof(float));
    memcpy(dc, dc1, (size_t)(L * D) * sizeof(float));
    cpu_gated_residual_bwd(dx, s->y_attn, (int)D, ws->tok_here, (int)B, s->mod + 2 * B * D, ws->t1, dmod + 2 * B * D);
    cpu_gated_residual_bwd(dc, s->yc_attn, (int)D, ws->txt_here, (int)B, s->mod_c + 2 * B * D, ws->tc1,
                           dmod_c + 2 * B * D);
    float *dA = ws->d_xb, *dAc = ws->d_cb;
    lin_b(m, &bo.to_out, s->a, ws->t1, N, D, D, dA, 0, grads);
    lin_b(m, &bo.to_add_out, s->ac, ws->tc1, L, D, D, dAc, 0, grads);
    block_attention_bwd(m, &bo, s, dA, dAc, grads);   /* d h1 in t1, d hc1 in tc1 */
    cpu_ln_modulate_bwd(s->x_in, ws->t1, N, (int)D, ws->tok_here, (int)B, s->mod + B * D, s->ln1_mean, s->ln1_rstd,
                        ws->t2, dmod, dmod + B * D);
    cpu_ln_modulate_bwd(s->c_in, ws->tc1, L, (int)D, ws->txt_here, (int)B, s->mod_c + B * D, s->lnc1_mean,
                        s->lnc1_rstd, ws->tc2, dmod_c, dmod_c + B * D);
    add_into(dx, ws->t2, N * D);
    add_into(dc, ws->tc2, L * D);
    /* the modulations: Linear(SiLU(temb)) of each stream */
    float *rows = ws->d_rows;
    from_chunks(dmod, B, 6, D, rows);
    lin_b(m, &bo.norm1, ws->temb_silu, rows, B, D, 6 * D, ws->d_temb_silu, 1, grads);
    from_chunks(dmod_c, B, 6, D, rows);
    lin_b(m, &bo.norm1_context, ws->temb_silu, rows, B, D, 6 * D, ws->d_temb_silu, 1, grads);
}

/* ---- conditioning: time, the token refiner over the Qwen rows, ByT5, image ----------------------------------- */

static void time_fwd(model *m)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t B = ws->n_samples, D = m->dim;
    cpu_sinusoidal_embedding(ws->timesteps, (int)B, m->freq_dim, ws->sinusoid);
    lin_f(m, &e->time_1, ws->sinusoid, B, m->freq_dim, D, ws->t_pre);
    cpu_silu_fwd(ws->t_pre, B * D, ws->t_act);
    lin_f(m, &e->time_2, ws->t_act, B, D, D, ws->temb);
    cpu_silu_fwd(ws->temb, B * D, ws->temb_silu);
}

/* The refiner's conditioning: its own time embedding plus the projected mean of each caption's Qwen rows. */
static void refiner_conditioning_fwd(model *m, const float *text)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t B = ws->n_samples, D = m->dim, T = m->text_dim;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < T; c++) {
            double sum = 0.0;
            for (int64_t r = ws->qwen[b]; r < ws->qwen[b + 1]; r++) sum += text[r * T + c];
            ws->pooled[b * T + c] = (float)(sum / (double)(ws->qwen[b + 1] - ws->qwen[b]));
        }
    lin_f(m, &e->refiner_time_1, ws->sinusoid, B, m->freq_dim, D, ws->rt_pre);
    cpu_silu_fwd(ws->rt_pre, B * D, ws->rt_act);
    lin_f(m, &e->refiner_time_2, ws->rt_act, B, D, D, ws->cvec);
    lin_f(m, &e->refiner_text_1, ws->pooled, B, T, D, ws->rp_pre);
    cpu_silu_fwd(ws->rp_pre, B * D, ws->rp_act);
    lin_f(m, &e->refiner_text_2, ws->rp_act, B, D, D, ws->d_tb);
    add_into(ws->cvec, ws->d_tb, B * D);
    cpu_silu_fwd(ws->cvec, B * D, ws->cvec_silu);
}

static void refiner_block_fwd(model *m, const layout_refiner_block *rb, ref_saved *s, const float *r_in, float *r_out)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t Q = ws->n_qwen, B = ws->n_samples, D = m->dim, H = m->num_heads, R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D;
    lin_f(m, &rb->ada, ws->cvec_silu, B, D, 2 * D, ws->d_rows);
    to_chunks(ws->d_rows, B, 2, D, s->gates);
    memcpy(s->r_in, r_in, (size_t)(Q * D) * sizeof(float));
    cpu_layernorm_fwd(s->r_in, Q, (int)D, param(m, rb->norm1_weight), param(m, rb->norm1_bias), m->eps, s->n1,
                      s->n1_mean, s->n1_rstd);
    lin_f(m, &rb->q, s->n1, Q, D, D, s->q);
    lin_f(m, &rb->k, s->n1, Q, D, D, s->k);
    lin_f(m, &rb->v, s->n1, Q, D, D, s->v);
    cpu_attention_fwd(s->q, s->k, s->v, (int)H, m->head_dim, ws->qwen, ws->qwen, (int)B, s->attn, s->lse);
    lin_f(m, &rb->o, s->attn, Q, D, D, s->y_attn);
    memcpy(s->r1, s->r_in, (size_t)(Q * D) * sizeof(float));
    cpu_gated_residual_fwd(s->r1, s->y_attn, (int)D, ws->qwen, (int)B, s->gates);
    cpu_layernorm_fwd(s->r1, Q, (int)D, param(m, rb->norm2_weight), param(m, rb->norm2_bias), m->eps, s->n2,
                      s->n2_mean, s->n2_rstd);
    lin_f(m, &rb->ff_in, s->n2, Q, D, R, s->ff_pre);
    cpu_silu_fwd(s->ff_pre, Q * R, s->ff_act);
    lin_f(m, &rb->ff_out, s->ff_act, Q, R, D, s->y_ff);
    memcpy(r_out, s->r1, (size_t)(Q * D) * sizeof(float));
    cpu_gated_residual_fwd(r_out, s->y_ff, (int)D, ws->qwen, (int)B, s->gates + B * D);
}

static void byt5_fwd(model *m, const float *text_2)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t G = ws->n_byt5, D = m->dim, T2 = m->text_2_dim, E = LAYOUT_MMDIT_BYT5_HIDDEN;
    cpu_layernorm_fwd(text_2, G, (int)T2, param(m, e->byt5_norm_weight), param(m, e->byt5_norm_bias),
                      (float)LAYOUT_MMDIT_EMBEDDER_EPS, ws->g_norm, ws->g_mean, ws->g_rstd);
    lin_f(m, &e->byt5_1, ws->g_norm, G, T2, E, ws->g1_pre);
    cpu_gelu_erf_fwd(ws->g1_pre, G * E, ws->g1_act);
    lin_f(m, &e->byt5_2, ws->g1_act, G, E, E, ws->g2_pre);
    cpu_gelu_erf_fwd(ws->g2_pre, G * E, ws->g2_act);
    lin_f(m, &e->byt5_3, ws->g2_act, G, E, D, ws->g_out);
}

static void image_fwd(model *m, const float *image)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t I = ws->n_image, D = m->dim, IM = m->image_dim;
    const float eps = (float)LAYOUT_MMDIT_EMBEDDER_EPS;
    cpu_layernorm_fwd(image, I, (int)IM, param(m, e->image_norm_in_weight), param(m, e->image_norm_in_bias), eps,
                      ws->i_norm, ws->i_mean, ws->i_rstd);
    lin_f(m, &e->image_1, ws->i_norm, I, IM, IM, ws->i1_pre);
    cpu_gelu_erf_fwd(ws->i1_pre, I * IM, ws->i1_act);
    lin_f(m, &e->image_2, ws->i1_act, I, IM, D, ws->i2);
    cpu_layernorm_fwd(ws->i2, I, (int)D, param(m, e->image_norm_out_weight), param(m, e->image_norm_out_bias), eps,
                      ws->i_out, ws->i_mean2, ws->i_rstd2);
}

/* The joint text of every sample: [image; ByT5; Qwen] rows, each plus its type embedding (2, 1, 0). */
static void assemble_text(model *m, float *context)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t D = m->dim;
    const float *type = param(m, m->layout.mmdit.cond_type);
    for (int b = 0; b < ws->n_samples; b++) {
        const float *sources[3] = {ws->i_out, ws->g_out, ws->qwen_r};
        const int64_t starts[3] = {ws->image[b], ws->byt5[b], ws->qwen[b]};
        const int64_t ends[3] = {ws->image[b + 1], ws->byt5[b + 1], ws->qwen[b + 1]};
        const int types[3] = {2, 1, 0};
        int64_t row = ws->txt[b];
        for (int k = 0; k < 3; k++)
            for (int64_t r = starts[k]; r < ends[k]; r++, row++)
                for (int64_t c = 0; c < D; c++) context[row * D + c] = sources[k][r * D + c] + type[types[k] * D + c];
    }
}

/* ---- the whole model ------------------------------------------------------------------------------------- */

/* Image-to-video condition of a sample in its input video [in_dim, F, H, W]: x0's first latent frame in channels
   [out_dim, 2 out_dim) and 1 in the mask channel 2 out_dim, on frame 0 only (the rest stays zero). */
static void put_condition(const model *m, const float *x0, int32_t f, int32_t h, int32_t w, float *video)
{
    const int64_t plane = (int64_t)h * w, volume = (int64_t)f * plane;
    for (int64_t c = 0; c < m->out_dim; c++)
        memcpy(video + (m->out_dim + c) * volume, x0 + c * volume, (size_t)plane * sizeof(float));
    for (int64_t i = 0; i < plane; i++) video[2 * (int64_t)m->out_dim * volume + i] = 1.0f;
}

/* Patchify ws->video (sample b's latent, `channels` deep) into this member's rows of `tokens` (width values a row):
   in place when alone; in a group through ws->patches, keeping the sample's rows of this member's slice. */
static void patchify_rows(model *m, const model_batch *batch, int b, int channels, int64_t width, float *tokens)
{
    mmdit_workspace *ws = m->mmdit;
    float *into = ws->sp_size > 1 ? ws->patches : tokens + ws->tok_here[b] * width;
    cpu_patchify(ws->video, channels, batch->frames[b], batch->height[b], batch->width[b], m->patch_t, m->patch_h,
                 m->patch_w, 0, into);
    if (ws->sp_size <= 1) return;
    const int64_t first = ws->tok_lo + ws->tok_here[b] - ws->tok[b];   /* the sample's first row here, in the sample */
    memcpy(tokens + ws->tok_here[b] * width, ws->patches + first * width,
           (size_t)((ws->tok_here[b + 1] - ws->tok_here[b]) * width) * sizeof(float));
}

/* Patchified model input: each sample's in_dim channels as given (whole = 1, alone only), or x_t = (1 - sigma) x0 +
   sigma eps in the first out_dim channels and past them zeros (text-to-video) or the condition (image-to-video:
   batch->i2v), with the target eps - x0; of this member's video rows. */
static void prepare_inputs(model *m, const model_batch *batch, int whole)
{
    mmdit_workspace *ws = m->mmdit;
    for (int b = 0; b < batch->n_samples; b++) {
        const float sigma = batch->sigma[b];
        if (!(sigma >= 0.0f && sigma <= 1.0f))
            ALDIT_FATAL("model: sample %d of the micro-batch has sigma %g outside [0, 1]", b, sigma);
        ws->timesteps[b] = 1000.0f * sigma;
        const int64_t volume = ws->sample_values[b + 1] - ws->sample_values[b];
        const int32_t f = batch->frames[b], h = batch->height[b], w = batch->width[b];
        if (whole) {
            cpu_patchify(batch->latents + ws->sample_values[b] * m->in_dim, m->in_dim, f, h, w, m->patch_t, m->patch_h,
                         m->patch_w, 0, ws->tokens_in + ws->tok[b] * m->patch_in);
            continue;
        }
        if (ws->tok_here[b + 1] == ws->tok_here[b]) continue;   /* none of its video rows is this member's */
        const float *x0 = batch->latents + ws->sample_values[b] * m->out_dim;
        const float *eps = batch->noise + ws->sample_values[b] * m->out_dim;
        memset(ws->video, 0, (size_t)(volume * m->in_dim) * sizeof(float));
        for (int64_t i = 0; i < volume * m->out_dim; i++) ws->video[i] = (1.0f - sigma) * x0[i] + sigma * eps[i];
        if (batch->i2v && batch->i2v[b]) put_condition(m, x0, f, h, w, ws->video);
        patchify_rows(m, batch, b, m->in_dim, m->patch_in, ws->tokens_in);
        for (int64_t i = 0; i < volume * m->out_dim; i++) ws->video[i] = eps[i] - x0[i];
        patchify_rows(m, batch, b, m->out_dim, m->patch_out, ws->target);
    }
}

/* The forward up to the prediction ws->pred [N, patch_out] (patch order channel-major, as diffusers unpatchifies) of
   this member's video rows. Every member computes the conditioning (time, the refiner, the sources, the joint text)
   over the whole micro-batch and takes its text rows of it into the blocks. */
static void forward(model *m, const model_batch *batch, int whole)
{
    mmdit_workspace *ws = m->mmdit;
    pack(m, batch);
    prepare_inputs(m, batch, whole);
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim;
    time_fwd(m);
    refiner_conditioning_fwd(m, batch->text);
    lin_f(m, &e->refiner_proj_in, batch->text, ws->n_qwen, m->text_dim, D, ws->qwen_r);
    for (int i = 0; i < LAYOUT_MMDIT_REFINER_LAYERS; i++)
        refiner_block_fwd(m, &e->refiner[i], &ws->refiner[i], ws->qwen_r, ws->qwen_r);
    if (ws->n_byt5 > 0) byt5_fwd(m, batch->text_2);
    if (ws->n_image > 0) image_fwd(m, batch->image);
    float *x = m->num_layers > 0 ? ws->saved[0].x_in : ws->x_final;
    assemble_text(m, ws->context);
    lin_f(m, &e->patch, ws->tokens_in, N, m->patch_in, D, x);
    for (int l = 0; l < m->num_layers; l++) {
        const int last = l + 1 == m->num_layers;
        const float *c_in = l == 0 ? ws->context + ws->txt_lo * D : ws->saved[l].c_in;   /* alone: saved[0].c_in */
        block_fwd(m, l, ws->saved[l].x_in, c_in, last ? ws->x_final : ws->saved[l + 1].x_in,
                  last ? ws->c_final : ws->saved[l + 1].c_in);
    }
    /* head: AdaLayerNormContinuous, (scale, shift) = Linear(SiLU(temb)), then proj_out */
    lin_f(m, &e->norm_out, ws->temb_silu, B, D, 2 * D, ws->d_rows);
    to_chunks(ws->d_rows, B, 2, D, ws->head_mod);
    cpu_ln_modulate_fwd(ws->x_final, N, (int)D, ws->tok_here, (int)B, ws->head_mod + B * D, ws->head_mod, m->eps,
                        ws->head_h, ws->head_mean, ws->head_rstd);
    lin_f(m, &e->proj_out, ws->head_h, N, D, m->patch_out, ws->pred);
    (void)L;
}

/* The summed per-sample MSE (in a group, this member's part: its rows' squares over the sample's whole count). */
static double loss(model *m, double *sample_loss)
{
    mmdit_workspace *ws = m->mmdit;
    double total = 0.0;
    for (int b = 0; b < ws->n_samples; b++) {
        double sum_sq = 0.0;
        for (int64_t i = ws->tok_here[b] * m->patch_out; i < ws->tok_here[b + 1] * m->patch_out; i++) {
            const double diff = (double)ws->pred[i] - ws->target[i];
            sum_sq += diff * diff;
        }
        const double value = sum_sq / (double)((ws->tok[b + 1] - ws->tok[b]) * m->patch_out);
        if (sample_loss) sample_loss[b] = value;
        total += value;
    }
    return total;
}

double mmdit_forward_loss(model *m, const model_batch *batch, double *sample_loss)
{
    forward(m, batch, 0);
    return loss(m, sample_loss);
}

void mmdit_predict(model *m, const model_batch *batch, float *output)
{
    ALDIT_CHECK(batch->sp_size <= 1, "model: model_predict runs a micro-batch on one rank (sp_size %d)", batch->sp_size);
    forward(m, batch, 1);
    const mmdit_workspace *ws = m->mmdit;
    for (int b = 0; b < batch->n_samples; b++)
        cpu_unpatchify(ws->pred + ws->tok[b] * m->patch_out, m->out_dim, batch->frames[b], batch->height[b],
                       batch->width[b], m->patch_t, m->patch_h, m->patch_w, 0, output + ws->sample_values[b] * m->out_dim);
}

/* ---- backward of the conditioning ------------------------------------------------------------------------ */

/* Refiner block backward: dr (gradient of its output) becomes that of its input; d cvec_silu accumulates. */
static void refiner_block_bwd(model *m, const layout_refiner_block *rb, const ref_saved *s, float *dr, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t Q = ws->n_qwen, B = ws->n_samples, D = m->dim, H = m->num_heads, R = LAYOUT_MMDIT_REFINER_MLP_RATIO * D;
    float *dg = ws->d_gates;
    cpu_gated_residual_bwd(dr, s->y_ff, (int)D, ws->qwen, (int)B, s->gates + B * D, ws->d_r1, dg + B * D);
    lin_b(m, &rb->ff_out, s->ff_act, ws->d_r1, Q, R, D, ws->d_rff, 0, grads);
    cpu_silu_bwd(s->ff_pre, ws->d_rff, Q * R, ws->d_rff);
    lin_b(m, &rb->ff_in, s->n2, ws->d_rff, Q, D, R, ws->d_r2, 0, grads);
    cpu_layernorm_bwd(s->r1, ws->d_r2, Q, (int)D, param(m, rb->norm2_weight), s->n2_mean, s->n2_rstd, ws->d_rq,
                      grad(grads, rb->norm2_weight), grad(grads, rb->norm2_bias));
    for (int64_t i = 0; i < Q * D; i++) ws->d_r1[i] = dr[i] + ws->d_rq[i];   /* d r1 */
    cpu_gated_residual_bwd(ws->d_r1, s->y_attn, (int)D, ws->qwen, (int)B, s->gates, ws->d_r2, dg);
    lin_b(m, &rb->o, s->attn, ws->d_r2, Q, D, D, ws->d_rq, 0, grads);
    cpu_attention_bwd(s->q, s->k, s->v, s->attn, ws->d_rq, s->lse, (int)H, m->head_dim, ws->qwen, ws->qwen, (int)B,
                      ws->d_r2, ws->d_rk, ws->d_rv);
    lin_b(m, &rb->q, s->n1, ws->d_r2, Q, D, D, ws->d_rq, 0, grads);
    lin_b(m, &rb->k, s->n1, ws->d_rk, Q, D, D, ws->d_rq, 1, grads);
    lin_b(m, &rb->v, s->n1, ws->d_rv, Q, D, D, ws->d_rq, 1, grads);
    cpu_layernorm_bwd(s->r_in, ws->d_rq, Q, (int)D, param(m, rb->norm1_weight), s->n1_mean, s->n1_rstd, ws->d_r2,
                      grad(grads, rb->norm1_weight), grad(grads, rb->norm1_bias));
    for (int64_t i = 0; i < Q * D; i++) dr[i] = ws->d_r1[i] + ws->d_r2[i];
    from_chunks(dg, B, 2, D, ws->d_rows);
    lin_b(m, &rb->ada, ws->cvec_silu, ws->d_rows, B, D, 2 * D, ws->d_cvec_silu, 1, grads);
}

/* The joint text's gradient split to its sources (d_i, d_g, d_q_r) and into the type embeddings. */
static void split_text_bwd(model *m, const float *d_context, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const int64_t D = m->dim;
    float *d_type = grad(grads, m->layout.mmdit.cond_type);
    for (int b = 0; b < ws->n_samples; b++) {
        float *targets[3] = {ws->d_i, ws->d_g, ws->d_q_r};
        const int64_t starts[3] = {ws->image[b], ws->byt5[b], ws->qwen[b]};
        const int64_t ends[3] = {ws->image[b + 1], ws->byt5[b + 1], ws->qwen[b + 1]};
        const int types[3] = {2, 1, 0};
        int64_t row = ws->txt[b];
        for (int k = 0; k < 3; k++)
            for (int64_t r = starts[k]; r < ends[k]; r++, row++)
                for (int64_t c = 0; c < D; c++) {
                    targets[k][r * D + c] = d_context[row * D + c];
                    d_type[types[k] * D + c] += d_context[row * D + c];
                }
    }
}

static void byt5_bwd(model *m, const float *text_2, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t G = ws->n_byt5, D = m->dim, T2 = m->text_2_dim, E = LAYOUT_MMDIT_BYT5_HIDDEN;
    lin_b(m, &e->byt5_3, ws->g2_act, ws->d_g, G, E, D, ws->d_g2, 0, grads);
    cpu_gelu_erf_bwd(ws->g2_pre, ws->d_g2, G * E, ws->d_g2);
    lin_b(m, &e->byt5_2, ws->g1_act, ws->d_g2, G, E, E, ws->d_g1, 0, grads);
    cpu_gelu_erf_bwd(ws->g1_pre, ws->d_g1, G * E, ws->d_g1);
    lin_b(m, &e->byt5_1, ws->g_norm, ws->d_g1, G, T2, E, ws->d_src_a, 0, grads);
    cpu_layernorm_bwd(text_2, ws->d_src_a, G, (int)T2, param(m, e->byt5_norm_weight), ws->g_mean, ws->g_rstd,
                      ws->d_src_b, grad(grads, e->byt5_norm_weight), grad(grads, e->byt5_norm_bias));
}

static void image_bwd(model *m, const float *image, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t I = ws->n_image, D = m->dim, IM = m->image_dim;
    cpu_layernorm_bwd(ws->i2, ws->d_i, I, (int)D, param(m, e->image_norm_out_weight), ws->i_mean2, ws->i_rstd2, ws->d_i2,
                      grad(grads, e->image_norm_out_weight), grad(grads, e->image_norm_out_bias));
    lin_b(m, &e->image_2, ws->i1_act, ws->d_i2, I, IM, D, ws->d_i1, 0, grads);
    cpu_gelu_erf_bwd(ws->i1_pre, ws->d_i1, I * IM, ws->d_i1);
    lin_b(m, &e->image_1, ws->i_norm, ws->d_i1, I, IM, IM, ws->d_src_a, 0, grads);
    cpu_layernorm_bwd(image, ws->d_src_a, I, (int)IM, param(m, e->image_norm_in_weight), ws->i_mean, ws->i_rstd,
                      ws->d_src_b, grad(grads, e->image_norm_in_weight), grad(grads, e->image_norm_in_bias));
}

/* The refiner conditioning and the time path, from d cvec_silu and d temb_silu. */
static void conditioning_bwd(model *m, float *grads)
{
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t B = ws->n_samples, D = m->dim, T = m->text_dim, FQ = m->freq_dim;
    cpu_silu_bwd(ws->cvec, ws->d_cvec_silu, B * D, ws->d_cvec);
    lin_b(m, &e->refiner_time_2, ws->rt_act, ws->d_cvec, B, D, D, ws->d_tb, 0, grads);
    cpu_silu_bwd(ws->rt_pre, ws->d_tb, B * D, ws->d_tb);
    lin_b(m, &e->refiner_time_1, ws->sinusoid, ws->d_tb, B, FQ, D, NULL, 0, grads);
    lin_b(m, &e->refiner_text_2, ws->rp_act, ws->d_cvec, B, D, D, ws->d_tb, 0, grads);
    cpu_silu_bwd(ws->rp_pre, ws->d_tb, B * D, ws->d_tb);
    lin_b(m, &e->refiner_text_1, ws->pooled, ws->d_tb, B, T, D, NULL, 0, grads);
    cpu_silu_bwd(ws->temb, ws->d_temb_silu, B * D, ws->d_temb);
    lin_b(m, &e->time_2, ws->t_act, ws->d_temb, B, D, D, ws->d_tb, 0, grads);
    cpu_silu_bwd(ws->t_pre, ws->d_tb, B * D, ws->d_tb);
    lin_b(m, &e->time_1, ws->sinusoid, ws->d_tb, B, FQ, D, NULL, 0, grads);
}

/* The whole micro-batch's joint-text gradient: alone, the first block's; in a group, this member's rows of it in
   place and zeros elsewhere. */
static const float *whole_text_grad(model *m)
{
    mmdit_workspace *ws = m->mmdit;
    if (ws->sp_size <= 1) return ws->d_c;
    const int64_t D = m->dim;
    memset(ws->d_context, 0, (size_t)(ws->n_text_all * D) * sizeof(float));
    memcpy(ws->d_context + ws->txt_lo * D, ws->d_c, (size_t)(ws->n_text * D) * sizeof(float));
    return ws->d_context;
}

double mmdit_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss)
{
    const double total = mmdit_forward_loss(m, batch, sample_loss);
    mmdit_workspace *ws = m->mmdit;
    const layout_mmdit *e = &m->layout.mmdit;
    const int64_t N = ws->n_tokens, L = ws->n_text, B = ws->n_samples, D = m->dim, PO = m->patch_out;
    for (int b = 0; b < B; b++) {
        const float coef = grad_scale * 2.0f / (float)((ws->tok[b + 1] - ws->tok[b]) * PO);
        for (int64_t i = ws->tok_here[b] * PO; i < ws->tok_here[b + 1] * PO; i++)
            ws->d_pred[i] = coef * (ws->pred[i] - ws->target[i]);
    }
    /* head */
    lin_b(m, &e->proj_out, ws->head_h, ws->d_pred, N, D, PO, ws->t1, 0, grads);
    cpu_ln_modulate_bwd(ws->x_final, ws->t1, N, (int)D, ws->tok_here, (int)B, ws->head_mod, ws->head_mean,
                        ws->head_rstd, ws->d_x, ws->d_head_mod + B * D, ws->d_head_mod);
    from_chunks(ws->d_head_mod, B, 2, D, ws->d_rows);
    lin_b(m, &e->norm_out, ws->temb_silu, ws->d_rows, B, D, 2 * D, ws->d_temb_silu, 0, grads);
    /* blocks: the last block's text output is not used */
    memset(ws->d_c, 0, (size_t)(L * D) * sizeof(float));
    for (int l = m->num_layers - 1; l >= 0; l--) block_bwd(m, l, ws->d_x, ws->d_c, grads);
    lin_b(m, &e->patch, ws->tokens_in, ws->d_x, N, m->patch_in, D, NULL, 0, grads);
    /* the joint text's sources, from this member's text rows' gradient (zero on the others': its weight gradients are
       its parts) */
    split_text_bwd(m, whole_text_grad(m), grads);
    if (ws->n_image > 0) image_bwd(m, batch->image, grads);
    if (ws->n_byt5 > 0) byt5_bwd(m, batch->text_2, grads);
    memset(ws->d_cvec_silu, 0, (size_t)(B * D) * sizeof(float));
    for (int i = LAYOUT_MMDIT_REFINER_LAYERS - 1; i >= 0; i--) refiner_block_bwd(m, &e->refiner[i], &ws->refiner[i], ws->d_q_r, grads);
    lin_b(m, &e->refiner_proj_in, batch->text, ws->d_q_r, ws->n_qwen, m->text_dim, D, NULL, 0, grads);
    conditioning_bwd(m, grads);
    return total;
}
