/* mmdit.h — HunyuanVideo-1.5's MMDiT on the CPU (the hunyuanvideo15 family's block code), behind model.h's interface. */
#ifndef ALDIT_MMDIT_H
#define ALDIT_MMDIT_H

#include "model/model.h"

/* The family's workspace (model.mmdit): created with the model's table, freed with it. */
void mmdit_create(model *m);
void mmdit_free(model *m);

/* model_forward_loss / model_forward_backward for the family (model.h says what they compute). Beyond Wan's batch
   it reads text_2_len/text_2 (ByT5 rows) and image_len/image (SigLIP rows), NULL = none; the sample's joint text is
   [image; ByT5; Qwen] rows, at their own lengths. Its input channels past out_dim (condition latent and mask) are
   zero for a text-to-video sample; for one with batch->i2v[b] = 1 (image-to-video) they hold x0's first latent frame
   and a mask of 1 on that frame (zero on the others), as HunyuanVideo-1.5's trainer builds them (get_condition).
   Sequence parallelism (sp_size = k > 1, model.h's contract: loss, sample_loss and gradients are this member's parts):
   of the micro-batch's Tv packed video rows and Tt packed joint-text rows, member p holds video rows
   [p*Tv/k, (p+1)*Tv/k) and text rows [p*Tt/k, (p+1)*Tt/k) (integer division, uneven slices, no padding) and runs
   the per-token work on them (RoPE by the rows' places in the whole micro-batch); self-attention exchanges q, k, v of
   both streams all-to-all over heads (member p attends for heads [p*H/k, (p+1)*H/k) over every sample's whole
   [video; text]) and the output back. Every member computes the time embedding, the token refiner, the caption
   sources' embedders and the modulation vectors over the whole micro-batch, and back-propagates into them only its
   own rows' gradients. */
double mmdit_forward_loss(model *m, const model_batch *batch, double *sample_loss);
double mmdit_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss);
/* model_predict for the family: batch->latents is the whole input (in_dim channels: x_t, condition, mask); one rank
   (sp_size > 1 is fatal). */
void mmdit_predict(model *m, const model_batch *batch, float *output);
/* Bytes its workspace holds for the micro-batch last run (model_workspace_bytes). */
int64_t mmdit_workspace_bytes(const model *m);

#endif
