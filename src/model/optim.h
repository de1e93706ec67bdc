/* optim.h — the optimizer side of a step: learning-rate schedule, global gradient norm and clipping, AdamW. */
#ifndef ALDIT_OPTIM_H
#define ALDIT_OPTIM_H

#include <stdint.h>

#include "deck/deck.h"

/* 1 when decoupled weight decay applies to the parameter of this Wan name and rank (param_info's name
   and ndim): the weight matrices of linear layers and the patch embedding (names ending in ".weight"
   with two or more dimensions), not biases, norm weights or modulation vectors. CPU and CUDA paths. */
int optim_param_decays(const char *name, int ndim);

/* Learning rate of optimizer step `step` (1-based) out of `total_steps`: linear warmup from lr/warmup
   to lr over [train] warmup_steps, then cosine from lr down to min_lr at total_steps (constant lr with
   lr_schedule = constant). Steps past total_steps stay at min_lr. */
double optim_lr(const deck *config, int64_t step, int64_t total_steps);

/* Euclidean norm of `grads`, summed in double in index order (the same on every rank and every run). */
double optim_global_norm(const float *grads, int64_t n_values);

/* Scale the gradients so their norm is at most max_norm (no-op when max_norm <= 0 or the norm is
   already within it). Returns the factor applied (1 when unchanged). */
double optim_clip(float *grads, int64_t n_values, double norm, double max_norm);

/* AdamW constants of one step. */
typedef struct {
    double lr;           /* learning rate of this step */
    double beta1, beta2; /* moment decay rates */
    double eps;          /* added to sqrt(v_hat) */
    int64_t step;        /* 1-based step number, for the bias corrections */
} adamw_step;

/* One AdamW update of n_values fp32 weights in place, with decoupled weight decay `weight_decay`
   (w -= lr * weight_decay * w, independent of the gradient); m and v are the first and second moments. */
void optim_adamw(const adamw_step *hyper, double weight_decay, float *weights, const float *grads,
                 float *m, float *v, int64_t n_values);

/* The EMA decay of optimizer step `step` (1-based): [train] ema_decay, or with ema_warmup
   min(ema_decay, (1 + k) / (10 + k)) for k = step - 1. 0 when the EMA is off. */
double optim_ema_decay(const deck *config, int64_t step);

/* One EMA update of n_values in place: ema = (float)(decay * ema + (1 - decay) * w), computed in double
   as written (two products, one sum, no fused multiply-add), so the CUDA kernel gives the same bits. */
void optim_ema(float *ema, const float *weights, int64_t n_values, double decay);

#endif
