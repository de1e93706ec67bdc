/* model.h — the model families on the CPU (Wan 2.1's DiT, HunyuanVideo-1.5's MMDiT): parameter table with the family's state_dict names, init, forward/backward of the rectified-flow loss. */
#ifndef ALDIT_MODEL_H
#define ALDIT_MODEL_H

#include <stdint.h>

#include "deck/deck.h"
#include "model/layout.h"

/* patch_embedding.weight is the one 5-D parameter: [dim, in_dim, patch_t, patch_h, patch_w]. */
#define MODEL_MAX_NDIM LAYOUT_MAX_NDIM

typedef struct {
    char name[96];                   /* Wan state_dict name, e.g. "blocks.0.self_attn.q.weight" */
    int ndim;
    int64_t shape[MODEL_MAX_NDIM];   /* PyTorch shape; entries past ndim are 0 */
    int64_t offset;                  /* first value in model.weights (and in a gradient of n_weights) */
    int64_t n_elements;
} param_info;

typedef struct model_workspace model_workspace;   /* saved activations and scratch, private to model.c */
typedef struct mmdit_workspace mmdit_workspace;   /* hunyuanvideo15's, private to mmdit.c */
typedef struct model_family model_family;         /* a family's block code (model.c's table) */

typedef struct {
    /* dims from the deck's [model] section */
    int dim, ffn_dim, num_heads, head_dim, num_layers;
    int in_dim, out_dim, patch_t, patch_h, patch_w;
    int text_len, text_dim, freq_dim;
    float eps;
    int qk_norm, cross_attn_norm;
    double init_std;
    deck_family family;              /* the deck's [model] family: its layout table and block code */
    const model_family *code;
    int text_2_dim, image_dim, rope_axes_t;   /* hunyuanvideo15 only */
    int patch_in;                    /* in_dim * patch volume: values per input token */
    int patch_out;                   /* out_dim * patch volume: values per output token */
    /* parameters, in Wan's state_dict order, all in one allocation: the table is computed from `layout`
       (names "blocks.<l>." + a block tensor's name), and so are the offsets every model reads */
    model_layout layout;
    int n_params;
    param_info *params;
    int64_t n_weights;
    float *weights;
    model_workspace *workspace;      /* grown to the largest micro-batch seen, reused across calls */
    mmdit_workspace *mmdit;          /* hunyuanvideo15: its own (NULL for wan) */
} model;

void model_create(model *m, const deck *config);    /* param table + one allocation for all weights */
/* The parameter table alone (weights stay NULL): names, shapes and counts without the memory, e.g. to
   plan a 14B run or check a checkpoint's names. model_free releases it. */
void model_create_table(model *m, const deck *config);
/* Wan's init, deterministic in seed: xavier-uniform Linear weights (patch embedding as its flattened
   [dim, in_dim*patch] matrix), zero biases, text/time embedding weights normal(0, init_std), modulations
   normal(0, 1/dim), RMSNorm and norm3 weights one, head.head.weight zero. */
void model_init_random(model *m, uint64_t seed);
/* Parameter `index`'s values of that init into values (its n_elements), one tensor at a time (m may be a table:
   the whole init is these, parameter by parameter). */
void model_init_random_param(const model *m, uint64_t seed, int index, float *values);
/* Every value random (for gradient checks, so that nothing starts at zero): normal(0, std), plus 1 for
   the weights of norms. Deterministic in seed. */
void model_init_gaussian(model *m, uint64_t seed, float std);
void model_free(model *m);
/* The parameter with this Wan name, or NULL. */
const param_info *model_find_param(const model *m, const char *name);

typedef struct {   /* one packed micro-batch: samples back to back, no padding */
    int n_samples;
    const int32_t *frames, *height, *width;  /* latent units per sample (before patchify) */
    const int32_t *text_len;                 /* text tokens per sample */
    const float *latents;                    /* clean x0, concatenated [C,F,H,W] per sample */
    const float *noise;                      /* epsilon, same layout as latents */
    const float *sigma;                      /* per sample, in (0,1); timestep t = 1000*sigma */
    const float *text;                       /* concatenated [text_len, text_dim] per sample */
    /* Sequence parallelism (Ulysses): the group of sp_size ranks that runs this micro-batch together, this rank
       its member sp_rank (comm_group_rank of sp_group). sp_size 0 or 1: this rank alone (sp_group unused). Every
       member passes the whole micro-batch (all samples, latents, noise, text). */
    int sp_size, sp_rank;
    const struct comm_group *sp_group;       /* core/comm.h's comm_group (comm_group_get) */
    /* hunyuanvideo15's other caption sources, at their own lengths (NULL: none; wan ignores them): ByT5 rows
       [text_2_len, text_2_dim] and SigLIP image rows [image_len, image_dim] per sample, back to back. Its joint
       text per sample is [image; ByT5; Qwen (text)], L = image_len + text_2_len + text_len rows. */
    const int32_t *text_2_len, *image_len;
    const float *text_2, *image;
    /* hunyuanvideo15, per sample (NULL: all 0): 1 = image-to-video, the loss's input carries the sample's first
       latent frame (of x0) as the condition latent and a mask of 1 on that frame (0 = text-to-video: both zero).
       wan ignores it. */
    const unsigned char *i2v;
} model_batch;

/* Forward + backward of the rectified-flow loss: x_t = (1-sigma)*x0 + sigma*eps, target eps - x0,
   per-sample loss = mean squared error over that sample's elements. Returns the SUM of the per-sample
   losses; ADDS grad_scale * d(sum of losses)/d(weights) into `grads` (n_weights floats). Writes each
   sample's loss into sample_loss (may be NULL). A batch that does not fit the model (a latent not a
   multiple of the patch, a text longer than text_len, ...) is a fatal error naming the sample.
   With batch->sp_size = k > 1 (every member of the group calls it, collectively, with the same batch): of the T packed
   tokens, member p computes the rows [p*T/k, (p+1)*T/k) (integer division; no padding: the all-to-all takes uneven
   slices); self-attention exchanges q, k, v all-to-all over heads (member p attends for heads [p*H/k, (p+1)*H/k) over
   all T rows) and the output back, and the backward mirrors it. The loss returned, sample_loss and the gradients are
   this member's PARTS: summed over the group they are the k = 1 results (to rounding). num_heads must be a multiple
   of k (fatal otherwise). hunyuanvideo15 splits its two streams (video rows, joint text rows) each so: mmdit.h. */
double model_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss);
/* The same loss, forward only (validation, finite-difference checks). */
double model_forward_loss(model *m, const model_batch *batch, double *sample_loss);
/* The prediction alone (aldit-forward, parity): batch->latents is each sample's whole input x_t [in_dim, F, H, W]
   (hunyuanvideo15: x_t, condition latent, mask), noise unused; writes [out_dim, F, H, W] per sample, back to back.
   hunyuanvideo15 only so far (aldit-forward computes Wan's from the blocks): fatal for wan. */
void model_predict(model *m, const model_batch *batch, float *output);

/* ---- one block on its own: the oracle for a GPU block, and its gradient check ----------------------
   model_pack lays out a micro-batch (sample grids in latent units, text lengths) in the workspace; then
   model_block_forward runs block `layer` on packed rows x_in [n_tokens, dim] with the per-sample time
   projection e0 [n_samples, 6*dim] and the embedded text context [n_text, dim], saving what its backward
   needs. model_block_backward (after the forward of the same layer and packing) overwrites dx_in and ADDS
   into de0, dcontext and the block's parameter gradients in grads (n_weights floats). Wan only (fatal for another
   family). Returns of
   model_pack: the number of tokens; *n_text receives the number of text rows. */
int64_t model_pack(model *m, int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                   const int32_t *text_len, int64_t *n_text);
/* Bytes the CPU model holds for the micro-batch last packed: what its arena carves (without the growth slack),
   the RoPE positions and the per-sample row tables. At most layout_memory_bytes of the CPU backend for the
   same sizes (model_layout_memory), short of it only by alignment padding. */
int64_t model_workspace_bytes(const model *m);
void model_block_forward(model *m, int layer, const float *x_in, const float *e0, const float *context, float *x_out);
void model_block_backward(model *m, int layer, const float *dx_out, float *dx_in, float *de0, float *dcontext,
                          float *grads);

#endif
