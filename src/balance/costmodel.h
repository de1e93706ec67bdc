/* costmodel.h — per-sample cost and memory models of the balancer: FLOP-seeded, refit online by NNLS. */
#ifndef ALDIT_COSTMODEL_H
#define ALDIT_COSTMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "deck/deck.h"
#include "model/layout.h"

/* Features of a set of samples: count, sum S, sum S^2, sum S*L, sum L (S tokens, L text tokens) and the sum S^2 of
   the samples whose attention runs on the backend's short-sample kernel (S < attention_split_tokens; those samples
   leave feature 2). The predicted seconds of the set are the dot product of its features with the coefficients
   (a, b, c, d, e, c').
   A family whose text joins the attention (layout_family_attention: joint_text, MMDiT) counts by the joint length
   N = S + L instead: count, sum N, sum N^2, sum L^2, sum L, sum N^2 of the samples under the split (N <
   attention_split_tokens), for seconds = a + b N + c N^2 + d L^2 + e L (see cost_model below). */
enum { COST_N_FEATURES = 6 };
enum { COST_NORMAL_SIZE = COST_N_FEATURES * COST_N_FEATURES + COST_N_FEATURES + 1 };
typedef struct { double value[COST_N_FEATURES]; } cost_features;

typedef struct {
    double coef[COST_N_FEATURES];       /* current a, b, c, d, e, c': seconds = a + b S + c S^2 + d S L + e L,
                                           with c' in place of c for a sample shorter than attention_split_tokens;
                                           with joint_text, seconds = a + b N + c N^2 + d L^2 + e L, N = S + L:
                                           b the blocks' GEMMs per row of either stream, c the joint attention, d the
                                           text's own attention (the refiner), e the text path's GEMMs beyond b */
    double seed_coef[COST_N_FEATURES];  /* from FLOP counts and device rates */
    int joint_text;                     /* 1: the family's text rows join its attention ([model] family; layout.h) */
    /* memory: the layout's exact formula (model_layout_memory) for `backend`; the per-sample terms below
       are its coefficients as doubles, `memory.fixed` (once per rank, without the GPU's device scratch)
       is left to the GPU plan */
    layout_backend backend;
    layout_memory memory;
    double mem_per_token;               /* activation bytes per sample token */
    double mem_per_text_token;          /* activation bytes per text token */
    double mem_per_sample;              /* activation bytes per sample, independent of its length */
    int recompute_block;                /* 1: mem assumes block recomputation (and cost adds a forward) */
    /* sequence parallelism (cost_model_predict_split): bytes one token's activations move through a group's
       all-to-alls over a step when the group is large (4 exchanges per block per pass, see docs/balancer.md), and
       the group's all-to-all bandwidth in bytes per second ([balance] sp_bandwidth) */
    double exchange_bytes_per_token;
    double sp_bytes_per_second;
    /* the backend's attention kernels: samples shorter than this run their attention on a kernel of their own
       (the GPU's flash attention below cuDNN's minimum length), whose S^2 rate c' the fit learns apart; 0: one
       kernel at every length (feature 5 stays 0 and c' at its seed) */
    int64_t attention_split_tokens;
    /* online refit: a ring of the last `window_steps` steps, each reduced to its (Huber-weighted)
       normal equations in seed-relative units */
    int window_steps;
    int n_steps_observed;               /* steps in the ring */
    int next_step;                      /* ring position of the next write */
    double *step_normal;                /* window_steps x COST_NORMAL_SIZE: A (n x n), b (n), rows */
} cost_model;

/* Seed from the deck: [model] dims, [balance] device_tflops / attention_tflops / recompute /
   calibrate_window (the refit window in steps); the memory of the backend [run] device names
   (cost_model_backend). */
void cost_model_init(cost_model *cm, const deck *config);
void cost_model_free(cost_model *cm);

/* FLOPs of one sample's forward + backward (with recompute: one more forward), split into GEMM and
   attention FLOPs (either pointer may be NULL). */
void cost_model_flops(const deck *config, int64_t tokens, int64_t text_len, double *gemm_flops, double *attention_flops);
/* Model FLOPs of one sample for utilisation (MFU): 3x its forward's GEMM and attention FLOPs, whatever the
   recomputation (the work the model needs, not the work done). */
double cost_model_model_flops(const deck *config, int64_t tokens, int64_t text_len);

/* The per-sample functions below are inline (the balancer calls them for every sample of every step);
   costmodel.c holds their external definitions. */

/* The length of one sample as its attention sees it: its S tokens, or N = S + L where the text joins the attention
   (joint_text). Its attention kernel is chosen by this length; a group's exchanges move this many rows. */
inline int64_t cost_model_length(const cost_model *cm, int64_t tokens, int64_t text_len)
{
    return cm->joint_text ? tokens + text_len : tokens;
}

/* Predicted seconds of one sample's forward + backward. */
inline double cost_model_predict(const cost_model *cm, int64_t tokens, int64_t text_len)
{
    const double s = (double)tokens, l = (double)text_len;
    const int64_t length = cost_model_length(cm, tokens, text_len);
    const double square = length < cm->attention_split_tokens ? cm->coef[5] : cm->coef[2];
    if (cm->joint_text) {
        const double n = (double)length;
        return cm->coef[0] + n * (cm->coef[1] + square * n) + l * (cm->coef[3] * l + cm->coef[4]);
    }
    return cm->coef[0] + s * (cm->coef[1] + square * s + cm->coef[3] * l) + cm->coef[4] * l;
}

/* Predicted seconds of a set of samples given its features. */
inline double cost_model_predict_features(const cost_model *cm, const cost_features *features)
{
    double seconds = 0;
    for (int j = 0; j < COST_N_FEATURES; j++) seconds += cm->coef[j] * features->value[j];
    return seconds;
}

/* Activation bytes of one sample: the layout formula's per-sample, per-token and per-text-row bytes (see
   docs/balancer.md); a micro-batch takes memory.fixed more. */
inline double cost_model_mem(const cost_model *cm, int64_t tokens, int64_t text_len)
{
    return cm->mem_per_sample + cm->mem_per_token * (double)tokens + cm->mem_per_text_token * (double)text_len;
}

/* Seconds of the all-to-all exchanges of one sample of `tokens` rows (cost_model_length: with joint_text its video
   and text rows) run by a group of k ranks, per rank: each rank holds tokens / k of them and sends (k - 1) / k of
   those at each exchange, exchange_bytes_per_token / sp_bytes_per_second seconds per row exchanged; 0 for k = 1. */
double cost_model_exchange(const cost_model *cm, int64_t tokens, int k);
/* Predicted seconds per rank of one sample run by a group of k ranks (k >= 1): cost_model_predict / k plus
   cost_model_exchange of its cost_model_length; exactly cost_model_predict for k = 1. */
double cost_model_predict_split(const cost_model *cm, int64_t tokens, int64_t text_len, int k);
/* Activation bytes per rank of one sample run by a group of k ranks: its tokens split k ways (each rank holds at most
   ceil(tokens / k)), the text replicated (with joint_text too: an upper bound whichever way a group splits the joint
   sequence's text rows); exactly cost_model_mem for k = 1. */
double cost_model_mem_split(const cost_model *cm, int64_t tokens, int64_t text_len, int k);

/* Copies of one sample (tokens, text_len) that one micro-batch of the GPU start-up calibration holds: the
   most that fit a micro-batch of at most max_tokens tokens, max_text text tokens and max_samples samples
   and whose summed activation bytes (cost_model_mem) stay within fill_bytes; at most max_copies, at least
   1; 0 when one copy alone is beyond that capacity or over mem_budget (an oversize sample). */
int cost_model_calibration_copies(const cost_model *cm, int64_t tokens, int64_t text_len, int64_t max_tokens,
                                  int64_t max_text, int max_samples, double mem_budget, double fill_bytes,
                                  int max_copies);

/* Take the backend's parts of `from`: its memory model and its attention split (the rest of `cm` stays). */
void cost_model_copy_memory(cost_model *cm, const cost_model *from);
/* The memory of `backend` (model_layout_memory with cm's recompute) in place of cm's. */
void cost_model_set_memory(cost_model *cm, const deck *config, layout_backend backend);
/* The backend the deck's memory model describes: CPU for [run] device = cpu, else the GPU. */
layout_backend cost_model_backend(const deck *config);

/* Bytes of the training state of the configured model on one rank on cost_model_backend's device, with the state
   sharded as `mode` (resolved: not auto) over n_ranks: model_layout_state_bytes's total (model/layout.h), for deriving
   a memory budget from device memory. */
double cost_model_state_bytes(const deck *config, deck_shard mode, int n_ranks);
/* Parameters of the configured model: the layout table's n_weights. */
int64_t cost_model_param_count(const deck *config);

/* Add the features of one sample to `features`, under cm's attention split (by joint length with joint_text). */
inline void cost_features_add(const cost_model *cm, cost_features *features, int64_t tokens, int64_t text_len)
{
    const double l = (double)text_len;
    const int64_t length = cost_model_length(cm, tokens, text_len);
    const double x = (double)length;
    features->value[0] += 1.0;
    features->value[1] += x;
    features->value[length < cm->attention_split_tokens ? 5 : 2] += x * x;
    features->value[3] += (cm->joint_text ? l : x) * l;
    features->value[4] += l;
}

/* The fitted form as text, "a + b S + c S^2 + d S L + e L" with the coefficients (or the joint form, "... (N = S + L)"),
   and, where every timed sample had the same L text rows, the sums of coefficients such timings fix: "a + e L = ..
   and b + d L = .." (Wan) or "a + e L + d L^2 = .." (joint: b and c stay determined by the lengths). */
void cost_model_form_text(const cost_model *cm, char *text, size_t text_size);
void cost_model_same_text_text(const cost_model *cm, double text_len, char *text, size_t text_size);

/* Record one step's observations: per rank, the features of its samples and its measured seconds
   (ranks with no samples or no valid time are left out). Ranks whose relative error is far from the
   step's median error (in median absolute deviations) are down-weighted or dropped, so stragglers do
   not drag the fit. */
void cost_model_observe_step(cost_model *cm, int n_ranks, const cost_features *features, const double *seconds);
/* Refit the coefficients from the window by non-negative least squares on relative errors. Keeps the
   current coefficients (returns 0) when the window holds fewer than 2 * COST_N_FEATURES observations
   or the system is degenerate; returns 1 when they changed. A small ridge towards the seed keeps
   directions the window does not excite (e.g. no long samples seen yet) at their seeded values. */
int cost_model_refit(cost_model *cm);

/* The relative error below which a start-up timing always weighs fully in cost_model_calibrate (its robust
   deviation's floor: full weight within 2.5 of it, 5%; none beyond 6, 12%). */
#define COST_CALIBRATION_SPREAD 0.02

/* Fit the start-up calibration's timings (features[i] timed at seconds[i]; invalid ones left out): the least
   squares of the relative errors, with the window's steps, reweighted until the weights settle (at most 8 rounds):
   each timing Huber-weighed by its error under the last fit, in robust deviations from the median error (at least
   COST_CALIBRATION_SPREAD), so that a bad timing (a cold first call, a clock dip) does not tilt the fit of the
   others. Each timing then enters the window as a step of one rank with its weight (one weighed 0 does not enter)
   and the model is refit (cost_model_refit). Returns 1 when the coefficients changed. */
int cost_model_calibrate(cost_model *cm, int n_observations, const cost_features *features, const double *seconds);

/* The worst misfit |predicted / measured - 1| of the model over n timed sets of samples (features[i] timed at
   seconds[i]; those not timed, seconds <= 0, left out); *worst_index (may be NULL) gets its index, -1 when none
   was timed (0 returned). */
double cost_model_worst_misfit(const cost_model *cm, int n, const cost_features *features, const double *seconds,
                               int *worst_index);

/* The refit window as plain doubles (for checkpoints): cost_model_window_doubles() values. */
size_t cost_model_window_doubles(const cost_model *cm);
void cost_model_window_save(const cost_model *cm, double *values);
/* Returns 0 on success, non-zero when the values do not fit this model's window. */
int cost_model_window_load(cost_model *cm, const double *values, size_t n_values);

/* Median of n_values >= 1 values (reorders them; expected linear time). */
double cost_median_in_place(double *values, int n_values);

/* Non-negative least squares on a small normal system: minimise x'Ax - 2 b'x subject to x >= 0, for
   symmetric positive semi-definite A (n <= COST_N_FEATURES). Active-set method (Lawson-Hanson). */
void cost_nnls_normal(int n, const double *a_matrix, const double *b_vector, double *x);

#endif
