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
   and a mask of 1 on that frame (zero on the others), as HunyuanVideo-1.5's trainer builds them (get_condition). Sequence parallelism (sp_size > 1) is refused (fatal, exit 2). */
double mmdit_forward_loss(model *m, const model_batch *batch, double *sample_loss);
double mmdit_forward_backward(model *m, const model_batch *batch, float *grads, float grad_scale, double *sample_loss);
/* model_predict for the family: batch->latents is the whole input (in_dim channels: x_t, condition, mask). */
void mmdit_predict(model *m, const model_batch *batch, float *output);
/* Bytes its workspace holds for the micro-batch last run (model_workspace_bytes). */
int64_t mmdit_workspace_bytes(const model *m);

#endif
