/* dual.c — the dual bucket strategy: cost ~ scale S^p fitted over the dataset, a bucket's batch the most samples
   within both the memory budget and the compute budget. */
#include "balance/strategy.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* dual: cost(S) ~ k S^p over the dataset (least squares in log-log, weighted by bucket counts, unless
   the deck fixes p), M_comp = base compute budget / k, so B S^p <= M_comp is B cost(S) <~ budget. */
void balance_fit_dual(balancer *b)
{
    double weight_sum = 0, x_mean = 0, y_mean = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        double w = (double)b->bucket_count[k];
        weight_sum += w;
        x_mean += w * log((double)b->bucket_tokens[k]);
        y_mean += w * log(cost_model_predict(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k]));
    }
    x_mean /= weight_sum;
    y_mean /= weight_sum;
    double sxx = 0, sxy = 0;
    for (int k = 0; k < b->n_buckets; k++) {
        double w = (double)b->bucket_count[k];
        double x = log((double)b->bucket_tokens[k]) - x_mean;
        double y = log(cost_model_predict(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k])) - y_mean;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    b->dual_p = b->dual_p_config > 0 ? b->dual_p_config : (sxx > 0 ? sxy / sxx : 1.0);
    b->dual_scale = exp(y_mean - b->dual_p * x_mean);
    b->dual_comp_budget = balance_base_compute_budget(b) / b->dual_scale;
}

int64_t balance_dual_batch(const balancer *b, int k)
{
    double by_mem = b->mem_budget / cost_model_mem(&b->cm, b->bucket_tokens[k], b->bucket_max_text[k]);
    double by_comp = b->dual_comp_budget / pow((double)b->bucket_tokens[k], b->dual_p);
    double size = floor(fmin(by_mem, by_comp));
    return size >= 1 ? (int64_t)size : 1;
}
