/* costmodel.c — the balancer's per-sample cost (FLOPs of the layout table's Linears and of attention) and memory (the layout's exact formula), the NNLS online refit and the robust fit of the start-up timings. */
#include "balance/costmodel.h"
#include "core/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Forward FLOPs of one sample, split into the parts that scale with S, S^2, S*L, L and per sample; with a joint
   attention (layout_attention.joint_text) the blocks' attention scales with N^2 (N = S + L) and there is no
   cross-attention; the text's own attention outside the blocks (the refiner) with L^2. */
typedef struct {
    double block_gemm_per_token, block_gemm_per_text_token;  /* all layers */
    double outside_gemm_per_token, outside_gemm_per_text_token, outside_gemm_per_sample;
    double self_attention_per_token2, cross_attention_per_token_text;  /* all layers; per N^2 with joint_text */
    double text_attention_per_text2;   /* outside the blocks */
    int joint_text;
} forward_flops;

static model_layout layout_of(const deck *config)
{
    const layout_dims dims = layout_dims_of(config);
    model_layout layout;
    model_layout_init(&layout, &dims);
    return layout;
}

static forward_flops count_forward_flops(const deck *config)
{
    const model_layout layout = layout_of(config);
    /* the GEMMs: every Linear of the parameter table, 2 FLOPs per weight and row it multiplies */
    const layout_gemm_flops gemm = model_layout_gemm_flops(&layout);
    forward_flops f;
    f.block_gemm_per_token = gemm.block_per_token;
    f.block_gemm_per_text_token = gemm.block_per_text;
    f.outside_gemm_per_token = gemm.outside_per_token;
    f.outside_gemm_per_text_token = gemm.outside_per_text;
    f.outside_gemm_per_sample = gemm.outside_per_sample;
    /* QK^T and PV: 2 S^2 D each; cross-attention the same with L keys; a joint attention 2 N^2 D each, N = S + L; the
       text's own self-attention layers 2 L^2 D each */
    const layout_attention attention = layout_family_attention(config->model.family);
    const double dim = config->model.dim, layers = config->model.num_layers;
    f.joint_text = attention.joint_text;
    f.self_attention_per_token2 = layers * 4.0 * dim;
    f.cross_attention_per_token_text = attention.joint_text ? 0.0 : layers * 4.0 * dim;
    f.text_attention_per_text2 = attention.text_attention_layers * 4.0 * dim;
    return f;
}

/* Forward + backward (2x forward); with block recomputation the blocks run their forward twice. */
static double block_pass_factor(const deck *config) { return config->balance.recompute == RECOMPUTE_BLOCK ? 4.0 : 3.0; }
static const double outside_pass_factor = 3.0;

/* FLOPs of one sample with the blocks' passes counted `block` times their forward. */
static void count_flops(const deck *config, int64_t tokens, int64_t text_len, double block, double *gemm_flops,
                        double *attention_flops)
{
    const forward_flops f = count_forward_flops(config);
    const double s = (double)tokens, l = (double)text_len, n = f.joint_text ? s + l : s;
    if (gemm_flops)
        *gemm_flops = block * (f.block_gemm_per_token * s + f.block_gemm_per_text_token * l)
                    + outside_pass_factor * (f.outside_gemm_per_token * s + f.outside_gemm_per_text_token * l
                                             + f.outside_gemm_per_sample);
    if (attention_flops)
        *attention_flops = block * (f.self_attention_per_token2 * n * n + f.cross_attention_per_token_text * s * l)
                         + outside_pass_factor * f.text_attention_per_text2 * l * l;
}

void cost_model_flops(const deck *config, int64_t tokens, int64_t text_len, double *gemm_flops, double *attention_flops)
{
    count_flops(config, tokens, text_len, block_pass_factor(config), gemm_flops, attention_flops);
}

double cost_model_model_flops(const deck *config, int64_t tokens, int64_t text_len)
{
    double gemm_flops = 0.0, attention_flops = 0.0;
    count_flops(config, tokens, text_len, 3.0, &gemm_flops, &attention_flops);
    return gemm_flops + attention_flops;
}

int64_t cost_model_param_count(const deck *config)
{
    const model_layout layout = layout_of(config);
    return layout.n_weights;
}

layout_backend cost_model_backend(const deck *config)
{
    /* auto runs a family without a GPU model on the CPU; device = cuda plans it on GPUs (aldit-sim, aldit --check) */
    const int cpu = config->run.device == DEVICE_CPU ||
                    (config->run.device == DEVICE_AUTO && !layout_family_on_gpu(config->model.family));
    return cpu ? LAYOUT_BACKEND_CPU : LAYOUT_BACKEND_GPU;
}

double cost_model_state_bytes(const deck *config, deck_shard mode, int n_ranks)
{
    const model_layout layout = layout_of(config);
    layout_state_bytes bytes = model_layout_state_bytes(&layout, cost_model_backend(config), mode, n_ranks,
                                                         config->train.ema_decay > 0.0);
    return layout_state_total(&bytes);
}

void cost_model_set_memory(cost_model *cm, const deck *config, layout_backend backend)
{
    const model_layout layout = layout_of(config);
    cm->backend = backend;
    cm->memory = model_layout_memory(&layout, backend, cm->recompute_block ? RECOMPUTE_BLOCK : RECOMPUTE_NONE, 0);
    cm->mem_per_token = (double)cm->memory.per_token;
    cm->mem_per_text_token = (double)cm->memory.per_text;
    cm->mem_per_sample = (double)cm->memory.per_sample;
    /* q, k, v in and the attention output back: 4 all-to-alls of dim values per token per block, in the forward,
       the backward, and the recomputed forward with recompute = block; bf16 on the GPU, fp32 on the CPU */
    const double passes = cm->recompute_block ? 3.0 : 2.0;
    const double element_bytes = backend == LAYOUT_BACKEND_GPU ? 2.0 : 4.0;
    cm->exchange_bytes_per_token = 4.0 * passes * config->model.num_layers * config->model.dim * element_bytes;
}

double cost_model_exchange(const cost_model *cm, int64_t tokens, int k)
{
    if (k <= 1 || !(cm->sp_bytes_per_second > 0)) return 0.0;
    const double held = (double)tokens / k, sent = held * (double)(k - 1) / k;
    return sent * cm->exchange_bytes_per_token / cm->sp_bytes_per_second;
}

double cost_model_predict_split(const cost_model *cm, int64_t tokens, int64_t text_len, int k)
{
    const double whole = cost_model_predict(cm, tokens, text_len);
    return k <= 1 ? whole : whole / k + cost_model_exchange(cm, cost_model_length(cm, tokens, text_len), k);
}

double cost_model_mem_split(const cost_model *cm, int64_t tokens, int64_t text_len, int k)
{
    if (k <= 1) return cost_model_mem(cm, tokens, text_len);
    return cost_model_mem(cm, (tokens + k - 1) / k, text_len);
}

int cost_model_calibration_copies(const cost_model *cm, int64_t tokens, int64_t text_len, int64_t max_tokens,
                                  int64_t max_text, int max_samples, double mem_budget, double fill_bytes,
                                  int max_copies)
{
    const double bytes = cost_model_mem(cm, tokens, text_len);
    if (tokens > max_tokens || text_len > max_text || max_samples < 1 || bytes > mem_budget) return 0;
    int copies = 1;
    while (copies < max_copies && copies < max_samples && (copies + 1) * tokens <= max_tokens &&
           (copies + 1) * text_len <= max_text && (copies + 1) * bytes <= fill_bytes)
        copies++;
    return copies;
}

void cost_model_copy_memory(cost_model *cm, const cost_model *from)
{
    cm->backend = from->backend;
    cm->memory = from->memory;
    cm->mem_per_sample = from->mem_per_sample;
    cm->mem_per_token = from->mem_per_token;
    cm->mem_per_text_token = from->mem_per_text_token;
    cm->attention_split_tokens = from->attention_split_tokens;
    cm->exchange_bytes_per_token = from->exchange_bytes_per_token;
}

void cost_model_init(cost_model *cm, const deck *config)
{
    memset(cm, 0, sizeof(*cm));
    ALDIT_CHECK(config->balance.device_tflops > 0 && config->balance.attention_tflops > 0,
                "cost model: device_tflops and attention_tflops must be positive");
    const forward_flops f = count_forward_flops(config);
    const double block = block_pass_factor(config);
    const double gemm_rate = config->balance.device_tflops * 1e12;
    const double attention_rate = config->balance.attention_tflops * 1e12;
    const double per_token = block * f.block_gemm_per_token + outside_pass_factor * f.outside_gemm_per_token;
    const double per_text = block * f.block_gemm_per_text_token + outside_pass_factor * f.outside_gemm_per_text_token;
    cm->joint_text = f.joint_text;
    cm->seed_coef[0] = outside_pass_factor * f.outside_gemm_per_sample / gemm_rate;
    cm->seed_coef[1] = per_token / gemm_rate;
    cm->seed_coef[2] = block * f.self_attention_per_token2 / attention_rate;
    if (f.joint_text) {
        /* b N + e L = b S + (b + e) L: e is what a text row costs beyond a video row (the text path: refiner,
           embedders), not below 0 (the form's coefficients are not negative) */
        cm->seed_coef[3] = outside_pass_factor * f.text_attention_per_text2 / attention_rate;
        cm->seed_coef[4] = fmax(per_text - per_token, 0.0) / gemm_rate;
    } else {
        cm->seed_coef[3] = block * f.cross_attention_per_token_text / attention_rate;
        cm->seed_coef[4] = per_text / gemm_rate;
    }
    cm->seed_coef[5] = cm->seed_coef[2]; /* the short-sample kernel seeded at the same attention rate */
    memcpy(cm->coef, cm->seed_coef, sizeof(cm->coef));
    cm->recompute_block = config->balance.recompute == RECOMPUTE_BLOCK;
    cm->sp_bytes_per_second = config->balance.sp_bandwidth * 1e9;
    cost_model_set_memory(cm, config, cost_model_backend(config));
    cm->window_steps = config->balance.calibrate_window > 0 ? config->balance.calibrate_window : 1;
    cm->step_normal = xcalloc((size_t)cm->window_steps * COST_NORMAL_SIZE, sizeof(double));
}

void cost_model_free(cost_model *cm)
{
    free(cm->step_normal);
    memset(cm, 0, sizeof(*cm));
}

void cost_model_form_text(const cost_model *cm, char *text, size_t text_size)
{
    const double *c = cm->coef;
    if (cm->joint_text)
        snprintf(text, text_size, "%.3g + %.3g N + %.3g N^2 + %.3g L^2 + %.3g L (N = S + L)", c[0], c[1], c[2], c[3], c[4]);
    else snprintf(text, text_size, "%.3g + %.3g S + %.3g S^2 + %.3g S L + %.3g L", c[0], c[1], c[2], c[3], c[4]);
}

void cost_model_same_text_text(const cost_model *cm, double text_len, char *text, size_t text_size)
{
    const double *c = cm->coef, l = text_len;
    if (cm->joint_text)
        snprintf(text, text_size, "a + e L + d L^2 = %.3g (b and c by the lengths N = S + L)", c[0] + l * (c[4] + l * c[3]));
    else snprintf(text, text_size, "a + e L = %.3g and b + d L = %.3g", c[0] + c[4] * l, c[1] + c[3] * l);
}

/* The external definitions of the inline functions of costmodel.h. */
extern inline int64_t cost_model_length(const cost_model *cm, int64_t tokens, int64_t text_len);
extern inline void cost_features_add(const cost_model *cm, cost_features *features, int64_t tokens, int64_t text_len);
extern inline double cost_model_predict_features(const cost_model *cm, const cost_features *features);
extern inline double cost_model_predict(const cost_model *cm, int64_t tokens, int64_t text_len);
extern inline double cost_model_mem(const cost_model *cm, int64_t tokens, int64_t text_len);

/* Seed-relative units: x_j = coef_j / seed_j makes the features comparable in size. */
static void seed_units(const cost_model *cm, double *unit)
{
    for (int j = 0; j < COST_N_FEATURES; j++) unit[j] = cm->seed_coef[j] > 0 ? cm->seed_coef[j] : 1e-30;
}

/* Move the values of [lo, hi] that are below `pivot` (or, with or_equal, not above it) to the front of
   the range, without branches on the data (an unpredictable branch per value would cost more than the
   moves); returns where the others start. */
static int partition_values(double *values, int lo, int hi, double pivot, int or_equal)
{
    int store = lo;
    for (int i = lo; i <= hi; i++) {
        const double value = values[i];
        values[i] = values[store];
        values[store] = value;
        store += or_equal ? value <= pivot : value < pivot;
    }
    return store;
}

/* The k-th smallest of values[0..n_values) (quickselect, median-of-three pivots): values are reordered
   so that values[k] holds it, smaller ones before, larger ones after. Expected O(n). */
static double select_kth(double *values, int n_values, int k)
{
    int lo = 0, hi = n_values - 1;
    while (hi > lo) {
        const double a = values[lo], b = values[lo + (hi - lo) / 2], c = values[hi];
        const double pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        const int first_not_below = partition_values(values, lo, hi, pivot, 0);
        if (k < first_not_below) { hi = first_not_below - 1; continue; }
        const int first_above = partition_values(values, first_not_below, hi, pivot, 1);   /* between: == pivot */
        if (k < first_above) return pivot;
        lo = first_above;
    }
    return values[k];
}

double cost_median_in_place(double *values, int n_values)
{
    const int upper = n_values / 2;
    const double upper_value = select_kth(values, n_values, upper);
    if (n_values % 2) return upper_value;
    double lower_value = values[0];      /* the largest of values[0 .. upper), all <= upper_value */
    for (int i = 1; i < upper; i++) if (values[i] > lower_value) lower_value = values[i];
    return 0.5 * (lower_value + upper_value);
}

/* Huber weight of an observation `distance` robust deviations from the centre: full within 2.5, 2.5 / distance to 6,
   none beyond. */
static double huber_weight(double distance) { return distance <= 2.5 ? 1.0 : distance <= 6.0 ? 2.5 / distance : 0.0; }

/* Add the rows of n observations (features[r] timed at seconds[r], weighed weight[r]; 0 leaves it out) to a normal
   system in seed-relative units: each row, divided by its measured time, predicts 1, so that the residual is the
   relative error. Fills the upper triangle of A, b and the row count. */
static void add_rows(const cost_model *cm, double *normal, int n_rows, const cost_features *features,
                     const double *seconds, const double *weight)
{
    enum { n = COST_N_FEATURES };
    double unit[COST_N_FEATURES];
    seed_units(cm, unit);
    double *a_matrix = normal, *b_vector = normal + n * n;
    for (int r = 0; r < n_rows; r++) {
        if (!(weight[r] > 0)) continue;
        double row[COST_N_FEATURES];
        for (int j = 0; j < n; j++) row[j] = unit[j] * features[r].value[j] / seconds[r];
        for (int i = 0; i < n; i++) {
            b_vector[i] += weight[r] * row[i];
            for (int j = i; j < n; j++) a_matrix[i * n + j] += weight[r] * row[i] * row[j];
        }
        normal[n * n + n] += 1;
    }
}

/* A's lower triangle from its upper one (A is symmetric). */
static void symmetric_fill(double *a_matrix)
{
    enum { n = COST_N_FEATURES };
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++) a_matrix[i * n + j] = a_matrix[j * n + i];
}

/* The relative error predicted / seconds - 1 of each valid observation (features with samples, a finite positive
   time) under coef, NAN for the others; returns how many are valid, their errors also packed into spread[]. */
static int relative_errors(const double *coef, int n_rows, const cost_features *features, const double *seconds,
                           double *residual, double *spread)
{
    int n_valid = 0;
    for (int r = 0; r < n_rows; r++) {
        residual[r] = NAN;
        if (!(seconds[r] > 0) || !isfinite(seconds[r]) || features[r].value[0] <= 0) continue;
        double predicted = 0;
        for (int j = 0; j < COST_N_FEATURES; j++) predicted += coef[j] * features[r].value[j];
        residual[r] = predicted / seconds[r] - 1.0;
        spread[n_valid++] = residual[r];
    }
    return n_valid;
}

/* Huber weights of the valid observations by their distance from the median error in robust deviations (1.4826
   median absolute deviations, at least floor); 0 for the invalid ones (residual NAN). spread[] is scratch. */
static void robust_weights(int n_rows, const double *residual, double *spread, int n_valid, double floor,
                           double *weight)
{
    const double center = cost_median_in_place(spread, n_valid);
    for (int k = 0, r = 0; r < n_rows; r++) if (!isnan(residual[r])) spread[k++] = fabs(residual[r] - center);
    const double sigma = fmax(1.4826 * cost_median_in_place(spread, n_valid), floor);
    for (int r = 0; r < n_rows; r++)
        weight[r] = isnan(residual[r]) ? 0.0 : huber_weight(fabs(residual[r] - center) / sigma);
}

/* Write one step's normal equations (the rows with their weights) into the ring's next slot. */
static void push_step(cost_model *cm, int n_rows, const cost_features *features, const double *seconds,
                      const double *weight)
{
    double *normal = &cm->step_normal[(size_t)cm->next_step * COST_NORMAL_SIZE];
    memset(normal, 0, COST_NORMAL_SIZE * sizeof(double));
    add_rows(cm, normal, n_rows, features, seconds, weight);
    symmetric_fill(normal);
    cm->next_step = (cm->next_step + 1) % cm->window_steps;
    if (cm->n_steps_observed < cm->window_steps) cm->n_steps_observed++;
}

void cost_model_observe_step(cost_model *cm, int n_ranks, const cost_features *features, const double *seconds)
{
    /* robust weights: distance from the step's median residual (a model off by a common factor moves
       every rank alike) in units of the median absolute deviation; full weight within 2.5, Huber
       down-weighting to 6, and none beyond (stragglers, a stalled rank) */
    const size_t room = (size_t)(n_ranks > 0 ? n_ranks : 1);
    double *residual = xmalloc(room * 3 * sizeof(double)), *spread = residual + room, *weight = spread + room;
    const int n_valid = relative_errors(cm->coef, n_ranks, features, seconds, residual, spread);
    if (n_valid > 0) {
        robust_weights(n_ranks, residual, spread, n_valid, 1e-3, weight);
        push_step(cm, n_ranks, features, seconds, weight);
    }
    free(residual);
}

/* Fit the coefficients to a normal system (A, b; n_rows rows): NNLS on the Jacobi-scaled system with a small ridge
   towards the seed. 0 (coef untouched) with fewer than 2 * COST_N_FEATURES rows or a degenerate system. */
static int solve_fit(const cost_model *cm, double *a_matrix, double *b_vector, double n_rows, double *coef)
{
    enum { n = COST_N_FEATURES };
    if (n_rows < 2 * n) return 0;
    /* Jacobi scaling (unit diagonal) so that features of any size weigh alike, then a small ridge
       towards the seed (x = 1 in seed units), which only matters for directions the data leaves open */
    double scale[COST_N_FEATURES];
    for (int i = 0; i < n; i++) {
        if (!isfinite(a_matrix[i * n + i])) return 0;
        scale[i] = a_matrix[i * n + i] > 0 ? sqrt(a_matrix[i * n + i]) : 1.0;
    }
    const double ridge = 1e-6;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) a_matrix[i * n + j] /= scale[i] * scale[j];
        b_vector[i] = b_vector[i] / scale[i] + ridge * scale[i];
        a_matrix[i * n + i] += ridge;
    }
    double x[COST_N_FEATURES], unit[COST_N_FEATURES];
    cost_nnls_normal(n, a_matrix, b_vector, x);
    for (int j = 0; j < n; j++) x[j] /= scale[j];
    for (int j = 0; j < n; j++) if (!isfinite(x[j])) return 0;
    seed_units(cm, unit);
    for (int j = 0; j < n; j++) coef[j] = x[j] * unit[j];
    return 1;
}

/* The window's normal equations summed into `normal` (zeroed first). */
static void window_normal(const cost_model *cm, double *normal)
{
    memset(normal, 0, COST_NORMAL_SIZE * sizeof(double));
    for (int k = 0; k < cm->n_steps_observed; k++) {
        const double *step = &cm->step_normal[(size_t)k * COST_NORMAL_SIZE];
        for (int i = 0; i < COST_NORMAL_SIZE; i++) normal[i] += step[i];
    }
}

int cost_model_calibrate(cost_model *cm, int n_observations, const cost_features *features, const double *seconds)
{
    enum { n = COST_N_FEATURES, max_rounds = 8 };
    const size_t room = (size_t)(n_observations > 0 ? n_observations : 1);
    double *residual = xmalloc(room * 4 * sizeof(double)), *spread = residual + room, *weight = spread + room,
           *next = weight + room;
    double coef[COST_N_FEATURES];
    memcpy(coef, cm->coef, sizeof coef);
    int n_valid = relative_errors(coef, n_observations, features, seconds, residual, spread);
    for (int r = 0; r < n_observations; r++) weight[r] = isnan(residual[r]) ? 0.0 : 1.0;
    /* iteratively reweighted: fit (with the window's steps), weigh each timing by its error under that fit */
    for (int round = 0; round < max_rounds && n_valid > 0; round++) {
        double normal[COST_NORMAL_SIZE];
        window_normal(cm, normal);
        add_rows(cm, normal, n_observations, features, seconds, weight);
        symmetric_fill(normal);
        if (!solve_fit(cm, normal, normal + n * n, normal[n * n + n], coef)) break;
        n_valid = relative_errors(coef, n_observations, features, seconds, residual, spread);
        robust_weights(n_observations, residual, spread, n_valid, COST_CALIBRATION_SPREAD, next);
        const int same = memcmp(next, weight, room * sizeof(double)) == 0;
        memcpy(weight, next, room * sizeof(double));
        if (same) break;
    }
    for (int r = 0; r < n_observations; r++) /* each timing a step of one rank, as its weight says */
        if (weight[r] > 0) push_step(cm, 1, &features[r], &seconds[r], &weight[r]);
    free(residual);
    return cost_model_refit(cm);
}

double cost_model_worst_misfit(const cost_model *cm, int n, const cost_features *features, const double *seconds,
                               int *worst_index)
{
    double worst = 0.0;
    int index = -1;
    for (int i = 0; i < n; i++) {
        if (!(seconds[i] > 0.0)) continue;
        const double misfit = fabs(cost_model_predict_features(cm, &features[i]) / seconds[i] - 1.0);
        if (index < 0 || misfit > worst) worst = misfit, index = i;
    }
    if (worst_index) *worst_index = index;
    return worst;
}

size_t cost_model_window_doubles(const cost_model *cm) { return 1 + (size_t)cm->n_steps_observed * COST_NORMAL_SIZE; }

void cost_model_window_save(const cost_model *cm, double *values)
{
    values[0] = cm->n_steps_observed;
    for (int k = 0; k < cm->n_steps_observed; k++) {   /* oldest first */
        int slot = (cm->next_step - cm->n_steps_observed + k + cm->window_steps) % cm->window_steps;
        memcpy(values + 1 + (size_t)k * COST_NORMAL_SIZE, &cm->step_normal[(size_t)slot * COST_NORMAL_SIZE],
               COST_NORMAL_SIZE * sizeof(double));
    }
}

int cost_model_window_load(cost_model *cm, const double *values, size_t n_values)
{
    if (n_values < 1 || !(values[0] >= 0) || values[0] > cm->window_steps
        || n_values != 1 + (size_t)values[0] * COST_NORMAL_SIZE) return 1;
    cm->n_steps_observed = (int)values[0];
    memcpy(cm->step_normal, values + 1, (size_t)cm->n_steps_observed * COST_NORMAL_SIZE * sizeof(double));
    cm->next_step = cm->n_steps_observed % cm->window_steps;
    return 0;
}

/* Solve the n x n system (row stride `stride`) restricted to the indices in `set` (n_set of them) by
   Gaussian elimination with partial pivoting. Returns 0 when singular. */
static int solve_subset(const double *a_matrix, const double *b_vector, int stride, const int *set, int n_set, double *z)
{
    double m[COST_N_FEATURES][COST_N_FEATURES + 1];
    for (int i = 0; i < n_set; i++) {
        for (int j = 0; j < n_set; j++) m[i][j] = a_matrix[set[i] * stride + set[j]];
        m[i][n_set] = b_vector[set[i]];
    }
    for (int col = 0; col < n_set; col++) {
        int pivot = col;
        for (int i = col + 1; i < n_set; i++) if (fabs(m[i][col]) > fabs(m[pivot][col])) pivot = i;
        if (fabs(m[pivot][col]) < 1e-300) return 0;
        if (pivot != col)
            for (int j = 0; j <= n_set; j++) { double t = m[col][j]; m[col][j] = m[pivot][j]; m[pivot][j] = t; }
        for (int i = col + 1; i < n_set; i++) {
            double factor = m[i][col] / m[col][col];
            for (int j = col; j <= n_set; j++) m[i][j] -= factor * m[col][j];
        }
    }
    for (int i = n_set - 1; i >= 0; i--) {
        double sum = m[i][n_set];
        for (int j = i + 1; j < n_set; j++) sum -= m[i][j] * z[j];
        z[i] = sum / m[i][i];
    }
    return 1;
}

void cost_nnls_normal(int n, const double *a_matrix, const double *b_vector, double *x)
{
    ALDIT_CHECK(n >= 1 && n <= COST_N_FEATURES, "nnls: %d unknowns (at most %d)", n, COST_N_FEATURES);
    int passive[COST_N_FEATURES] = {0};
    double scale = 0;
    for (int i = 0; i < n; i++) { x[i] = 0; scale = fmax(scale, fabs(a_matrix[i * n + i])); }
    const double tolerance = 1e-12 * (scale > 0 ? scale : 1.0);
    for (int outer = 0; outer < 6 * n; outer++) {
        /* gradient of the objective's negative half: w = b - A x */
        double w[COST_N_FEATURES];
        int best = -1;
        for (int i = 0; i < n; i++) {
            w[i] = b_vector[i];
            for (int j = 0; j < n; j++) w[i] -= a_matrix[i * n + j] * x[j];
            if (!passive[i] && w[i] > tolerance * (1.0 + fabs(b_vector[i])) && (best < 0 || w[i] > w[best])) best = i;
        }
        if (best < 0) return;
        passive[best] = 1;
        for (int inner = 0; inner < 3 * n; inner++) {
            int set[COST_N_FEATURES], n_set = 0;
            for (int i = 0; i < n; i++) if (passive[i]) set[n_set++] = i;
            double z_set[COST_N_FEATURES], z[COST_N_FEATURES] = {0};
            if (!solve_subset(a_matrix, b_vector, n, set, n_set, z_set)) { passive[best] = 0; return; }
            for (int k = 0; k < n_set; k++) z[set[k]] = z_set[k];
            double alpha = 1.0;
            int feasible = 1;
            for (int k = 0; k < n_set; k++) {
                int i = set[k];
                if (z[i] <= 0) {
                    feasible = 0;
                    double step = x[i] / (x[i] - z[i]);
                    if (step < alpha) alpha = step;
                }
            }
            if (feasible) { memcpy(x, z, (size_t)n * sizeof(double)); break; }
            for (int i = 0; i < n; i++) {
                x[i] += alpha * (z[i] - x[i]);
                if (passive[i] && x[i] <= 1e-15 * (1.0 + fabs(z[i]))) { passive[i] = 0; x[i] = 0; }
            }
        }
    }
}

int cost_model_refit(cost_model *cm)
{
    enum { n = COST_N_FEATURES };
    double normal[COST_NORMAL_SIZE], coef[COST_N_FEATURES];
    window_normal(cm, normal);
    if (!solve_fit(cm, normal, normal + n * n, normal[n * n + n], coef)) return 0;
    int changed = 0;
    for (int j = 0; j < n; j++) {
        if (coef[j] != cm->coef[j]) changed = 1;
        cm->coef[j] = coef[j];
    }
    return changed;
}
