/* optim.c — warmup + cosine learning rate, global-norm gradient clipping, AdamW with decoupled weight decay, the weights' EMA. */
#include "model/optim.h"

#include <math.h>
#include <string.h>

int optim_param_decays(const char *name, int ndim)
{
    size_t length = strlen(name);
    return ndim >= 2 && length > 7 && strcmp(name + length - 7, ".weight") == 0;
}

double optim_lr(const deck *config, int64_t step, int64_t total_steps)
{
    const double peak = config->train.lr, floor_lr = config->train.min_lr;
    int64_t warmup = config->train.warmup_steps;
    if (warmup > 0 && step <= warmup) return peak * (double)step / (double)warmup;
    if (config->train.lr_schedule == LR_CONSTANT) return peak;
    int64_t decay_steps = total_steps - warmup;
    if (decay_steps <= 0 || step >= total_steps) return floor_lr;
    double progress = (double)(step - warmup) / (double)decay_steps;
    return floor_lr + 0.5 * (peak - floor_lr) * (1.0 + cos(M_PI * progress));
}

double optim_global_norm(const float *grads, int64_t n_values)
{
    double sum_sq = 0.0;
    for (int64_t i = 0; i < n_values; i++) sum_sq += (double)grads[i] * (double)grads[i];
    return sqrt(sum_sq);
}

double optim_clip(float *grads, int64_t n_values, double norm, double max_norm)
{
    if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
    float factor = (float)(max_norm / (norm + 1e-6));
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_values; i++) grads[i] *= factor;
    return factor;
}

void optim_adamw(const adamw_step *hyper, double weight_decay, float *weights, const float *grads,
                 float *m, float *v, int64_t n_values)
{
    const float beta1 = (float)hyper->beta1, beta2 = (float)hyper->beta2, eps = (float)hyper->eps;
    const float lr = (float)hyper->lr;
    const float decay = (float)(1.0 - hyper->lr * weight_decay);
    /* Bias-corrected moments: m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t). */
    const float m_correction = (float)(1.0 / (1.0 - pow(hyper->beta1, (double)hyper->step)));
    const float v_correction = (float)(1.0 / (1.0 - pow(hyper->beta2, (double)hyper->step)));
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_values; i++) {
        float g = grads[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float m_hat = m[i] * m_correction, v_hat = v[i] * v_correction;
        weights[i] = weights[i] * decay - lr * m_hat / (sqrtf(v_hat) + eps);
    }
}

double optim_ema_decay(const deck *config, int64_t step)
{
    const double decay = config->train.ema_decay;
    if (!config->train.ema_warmup) return decay;
    const double k = (double)(step > 1 ? step - 1 : 0), ramp = (1.0 + k) / (10.0 + k);
    return ramp < decay ? ramp : decay;
}

void optim_ema(float *ema, const float *weights, int64_t n_values, double decay)
{
    const double keep = decay, take = 1.0 - decay;
    /* ISO C (-std=c11) keeps GCC from contracting this into a fused multiply-add */
    for (int64_t i = 0; i < n_values; i++) ema[i] = (float)(keep * (double)ema[i] + take * (double)weights[i]);
}
