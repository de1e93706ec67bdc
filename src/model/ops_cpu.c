/* ops_cpu.c — fp32 CPU reference ops of the DiT: forward and backward, OpenMP loops, CBLAS GEMMs when built with it. */
#include "config.h"
#include "model/ops_cpu.h"
#include "core/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_CBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int n_threads); /* not declared by every OpenBLAS cblas.h */
#endif

void cpu_set_threads(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
#ifdef _OPENMP
    omp_set_num_threads(n_threads);
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(n_threads);
#endif
}

void cpu_copy(void *dst, const void *src, size_t bytes)
{
    enum { kPiece = 1 << 20, kParallelBytes = 8 << 20 };
    if (bytes < kParallelBytes) {
        if (bytes > 0) memcpy(dst, src, bytes);
        return;
    }
    const int64_t pieces = (int64_t)((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        const size_t first = (size_t)p * kPiece, size = first + kPiece <= bytes ? kPiece : bytes - first;
        memcpy((char *)dst + first, (const char *)src + first, size);
    }
}

/* Loops over fewer values than this stay on one thread (the fork/join costs more than it saves). */
#define PARALLEL_MIN_VALUES 16384
/* Column reductions run over blocks of this many columns, one block per thread, rows in order:
   the summation order (and so the result) is the same for any thread count. */
#define COLUMN_BLOCK 64

/* Row-major C[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C. */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
#ifdef HAVE_CBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#else
#pragma omp parallel for schedule(static) if (m * n * k > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < m; i++) {
        float *c_row = c + i * ldc;
        for (int64_t j = 0; j < n; j++) c_row[j] = beta == 0.0f ? 0.0f : beta * c_row[j];
        if (!trans_a && trans_b) {          /* dot products of contiguous rows */
            const float *a_row = a + i * lda;
            for (int64_t j = 0; j < n; j++) {
                const float *b_row = b + j * ldb;
                float sum = 0.0f;
                for (int64_t p = 0; p < k; p++) sum += a_row[p] * b_row[p];
                c_row[j] += alpha * sum;
            }
            continue;
        }
        for (int64_t p = 0; p < k; p++) {   /* rank-1 updates along contiguous rows of B */
            float a_value = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
            if (a_value == 0.0f) continue;
            if (trans_b)
                for (int64_t j = 0; j < n; j++) c_row[j] += a_value * b[j * ldb + p];
            else {
                const float *b_row = b + p * ldb;
                for (int64_t j = 0; j < n; j++) c_row[j] += a_value * b_row[j];
            }
        }
    }
#endif
}

void cpu_linear_fwd(const float *x, int64_t n_rows, int in_dim, int out_dim, const float *weight,
                    const float *bias, float *y)
{
    if (bias) {
#pragma omp parallel for schedule(static) if (n_rows * out_dim > PARALLEL_MIN_VALUES)
        for (int64_t r = 0; r < n_rows; r++) memcpy(y + r * out_dim, bias, (size_t)out_dim * sizeof(float));
    }
    gemm(0, 1, n_rows, out_dim, in_dim, 1.0f, x, in_dim, weight, in_dim, bias ? 1.0f : 0.0f, y, out_dim);
}

/* sums[c] (+)= sum over rows of a[r, c] for rows [row_begin, row_end). */
static void column_sums(const float *a, int64_t row_begin, int64_t row_end, int dim, float *sums, int accumulate)
{
    int n_blocks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if ((row_end - row_begin) * dim > PARALLEL_MIN_VALUES)
    for (int block = 0; block < n_blocks; block++) {
        int c0 = block * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < dim ? c0 + COLUMN_BLOCK : dim;
        float acc[COLUMN_BLOCK] = {0};
        for (int64_t r = row_begin; r < row_end; r++) {
            const float *row = a + r * dim;
            for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) sums[c] = accumulate ? sums[c] + acc[c - c0] : acc[c - c0];
    }
}

void cpu_linear_bwd(const float *x, const float *dy, int64_t n_rows, int in_dim, int out_dim,
                    const float *weight, float *dx, int accumulate_dx, float *dweight, float *dbias)
{
    if (dx) gemm(0, 0, n_rows, in_dim, out_dim, 1.0f, dy, out_dim, weight, in_dim, accumulate_dx ? 1.0f : 0.0f,
                 dx, in_dim);
    if (n_rows == 0) return;
    gemm(1, 0, out_dim, in_dim, n_rows, 1.0f, dy, out_dim, x, in_dim, 1.0f, dweight, in_dim);
    if (dbias) column_sums(dy, 0, n_rows, out_dim, dbias, 1);
}

/* ---- elementwise activations -------------------------------------------------------------------- */

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_CUBIC 0.044715f

void cpu_gelu_tanh_fwd(const float *x, int64_t n, float *y)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(GELU_SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)));
    }
}

void cpu_gelu_tanh_bwd(const float *x, const float *dy, int64_t n, float *dx)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = tanhf(GELU_SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v));
        float du_dv = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du_dv);
    }
}

#define GELU_INV_SQRT_2 0.70710678118654752
#define GELU_INV_SQRT_2PI 0.39894228040143268

void cpu_gelu_erf_fwd(const float *x, int64_t n, float *y)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)(0.5 * v * (1.0 + erf(v * GELU_INV_SQRT_2)));
    }
}

void cpu_gelu_erf_bwd(const float *x, const float *dy, int64_t n, float *dx)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        double cdf = 0.5 * (1.0 + erf(v * GELU_INV_SQRT_2)), pdf = GELU_INV_SQRT_2PI * exp(-0.5 * v * v);
        dx[i] = (float)(dy[i] * (cdf + v * pdf));
    }
}

void cpu_silu_fwd(const float *x, int64_t n, float *y)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

void cpu_silu_bwd(const float *x, const float *dy, int64_t n, float *dx)
{
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_VALUES)
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

/* ---- normalisations ----------------------------------------------------------------------------- */

/* Mean and 1/sqrt(var + eps) of one row (two passes, double accumulation, biased variance as PyTorch). */
static void row_moments(const float *row, int dim, float eps, float *mean, float *rstd)
{
    double sum = 0.0;
    for (int c = 0; c < dim; c++) sum += row[c];
    double mu = sum / dim, var = 0.0;
    for (int c = 0; c < dim; c++) var += (row[c] - mu) * (row[c] - mu);
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var / dim + eps));
}

/* The LayerNorm input gradient of one row given g = dL/d(normalised x):
   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void layernorm_row_bwd(const float *x_row, const float *g, int dim, float mean, float rstd, float *dx_row)
{
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int c = 0; c < dim; c++) {
        float xhat = (x_row[c] - mean) * rstd;
        sum_g += g[c];
        sum_g_xhat += g[c] * xhat;
    }
    float mean_g = (float)(sum_g / dim), mean_g_xhat = (float)(sum_g_xhat / dim);
    for (int c = 0; c < dim; c++) {
        float xhat = (x_row[c] - mean) * rstd;
        dx_row[c] = rstd * (g[c] - mean_g - xhat * mean_g_xhat);
    }
}

void cpu_layernorm_fwd(const float *x, int64_t n_rows, int dim, const float *weight, const float *bias,
                       float eps, float *y, float *mean, float *rstd)
{
#pragma omp parallel for schedule(static) if (n_rows * dim > PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x_row = x + r * dim;
        float *y_row = y + r * dim;
        row_moments(x_row, dim, eps, &mean[r], &rstd[r]);
        for (int c = 0; c < dim; c++) {
            float xhat = (x_row[c] - mean[r]) * rstd[r];
            y_row[c] = weight ? xhat * weight[c] + (bias ? bias[c] : 0.0f) : xhat;
        }
    }
}

void cpu_layernorm_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const float *weight,
                       const float *mean, const float *rstd, float *dx, float *dweight, float *dbias)
{
#pragma omp parallel if (n_rows * dim > PARALLEL_MIN_VALUES)
    {
        float *g = weight ? xmalloc((size_t)dim * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n_rows; r++) {
            const float *dy_row = dy + r * dim;
            if (weight) {
                for (int c = 0; c < dim; c++) g[c] = dy_row[c] * weight[c];
                layernorm_row_bwd(x + r * dim, g, dim, mean[r], rstd[r], dx + r * dim);
            } else {
                layernorm_row_bwd(x + r * dim, dy_row, dim, mean[r], rstd[r], dx + r * dim);
            }
        }
        free(g);
    }
    if (!weight) return;
    int n_blocks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if (n_rows * dim > PARALLEL_MIN_VALUES)
    for (int block = 0; block < n_blocks; block++) {
        int c0 = block * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < dim ? c0 + COLUMN_BLOCK : dim;
        float acc_w[COLUMN_BLOCK] = {0}, acc_b[COLUMN_BLOCK] = {0};
        for (int64_t r = 0; r < n_rows; r++) {
            const float *x_row = x + r * dim, *dy_row = dy + r * dim;
            for (int c = c0; c < c1; c++) {
                acc_w[c - c0] += dy_row[c] * (x_row[c] - mean[r]) * rstd[r];
                acc_b[c - c0] += dy_row[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += acc_w[c - c0];
            if (dbias) dbias[c] += acc_b[c - c0];
        }
    }
}

void cpu_ln_modulate_fwd(const float *x, int64_t n_rows, int dim, const int64_t *sample_row_start, int n_samples,
                         const float *shift, const float *scale, float eps, float *y, float *mean, float *rstd)
{
    ALDIT_CHECK(sample_row_start[n_samples] <= n_rows, "ln_modulate: samples cover %lld rows, only %lld given",
                (long long)sample_row_start[n_samples], (long long)n_rows);
    for (int b = 0; b < n_samples; b++) {
        const float *shift_b = shift + (int64_t)b * dim, *scale_b = scale + (int64_t)b * dim;
        int64_t r0 = sample_row_start[b], r1 = sample_row_start[b + 1];
#pragma omp parallel for schedule(static) if ((r1 - r0) * dim > PARALLEL_MIN_VALUES)
        for (int64_t r = r0; r < r1; r++) {
            const float *x_row = x + r * dim;
            float *y_row = y + r * dim;
            row_moments(x_row, dim, eps, &mean[r], &rstd[r]);
            for (int c = 0; c < dim; c++)
                y_row[c] = (x_row[c] - mean[r]) * rstd[r] * (1.0f + scale_b[c]) + shift_b[c];
        }
    }
}

void cpu_ln_modulate_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const int64_t *sample_row_start,
                         int n_samples, const float *scale, const float *mean, const float *rstd,
                         float *dx, float *dshift, float *dscale)
{
    ALDIT_CHECK(sample_row_start[n_samples] <= n_rows, "ln_modulate: samples cover %lld rows, only %lld given",
                (long long)sample_row_start[n_samples], (long long)n_rows);
    int n_blocks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    for (int b = 0; b < n_samples; b++) {
        const float *scale_b = scale + (int64_t)b * dim;
        int64_t r0 = sample_row_start[b], r1 = sample_row_start[b + 1];
        int parallel = (r1 - r0) * dim > PARALLEL_MIN_VALUES;
#pragma omp parallel if (parallel)
        {
            float *g = xmalloc((size_t)dim * sizeof(float));
#pragma omp for schedule(static)
            for (int64_t r = r0; r < r1; r++) {
                const float *dy_row = dy + r * dim;
                for (int c = 0; c < dim; c++) g[c] = dy_row[c] * (1.0f + scale_b[c]);
                layernorm_row_bwd(x + r * dim, g, dim, mean[r], rstd[r], dx + r * dim);
            }
            free(g);
        }
#pragma omp parallel for schedule(static) if (parallel)
        for (int block = 0; block < n_blocks; block++) {
            int c0 = block * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < dim ? c0 + COLUMN_BLOCK : dim;
            float acc_shift[COLUMN_BLOCK] = {0}, acc_scale[COLUMN_BLOCK] = {0};
            for (int64_t r = r0; r < r1; r++) {
                const float *x_row = x + r * dim, *dy_row = dy + r * dim;
                for (int c = c0; c < c1; c++) {
                    acc_shift[c - c0] += dy_row[c];
                    acc_scale[c - c0] += dy_row[c] * (x_row[c] - mean[r]) * rstd[r];
                }
            }
            for (int c = c0; c < c1; c++) {
                dshift[(int64_t)b * dim + c] = acc_shift[c - c0];
                dscale[(int64_t)b * dim + c] = acc_scale[c - c0];
            }
        }
    }
}

void cpu_rmsnorm_fwd(const float *x, int64_t n_rows, int dim, const float *weight, float eps, float *y,
                     float *rstd)
{
#pragma omp parallel for schedule(static) if (n_rows * dim > PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x_row = x + r * dim;
        float *y_row = y + r * dim;
        double sum_sq = 0.0;
        for (int c = 0; c < dim; c++) sum_sq += (double)x_row[c] * x_row[c];
        rstd[r] = (float)(1.0 / sqrt(sum_sq / dim + eps));
        for (int c = 0; c < dim; c++) y_row[c] = x_row[c] * rstd[r] * weight[c];
    }
}

void cpu_rmsnorm_bwd(const float *x, const float *dy, int64_t n_rows, int dim, const float *weight,
                     const float *rstd, float *dx, float *dweight)
{
    /* dweight first: dx may overwrite dy */
    int n_blocks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if (n_rows * dim > PARALLEL_MIN_VALUES)
    for (int block = 0; block < n_blocks; block++) {
        int c0 = block * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < dim ? c0 + COLUMN_BLOCK : dim;
        float acc[COLUMN_BLOCK] = {0};
        for (int64_t r = 0; r < n_rows; r++) {
            const float *x_row = x + r * dim, *dy_row = dy + r * dim;
            for (int c = c0; c < c1; c++) acc[c - c0] += dy_row[c] * x_row[c] * rstd[r];
        }
        for (int c = c0; c < c1; c++) dweight[c] += acc[c - c0];
    }
    /* y = x r w with r = (mean(x^2) + eps)^-1/2: dx = r (g - x r^2 mean(g x)), g = dy w. */
#pragma omp parallel for schedule(static) if (n_rows * dim > PARALLEL_MIN_VALUES)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x_row = x + r * dim, *dy_row = dy + r * dim;
        float *dx_row = dx + r * dim;
        double sum_gx = 0.0;
        for (int c = 0; c < dim; c++) sum_gx += (double)dy_row[c] * weight[c] * x_row[c];
        float coef = (float)(sum_gx / dim) * rstd[r] * rstd[r];
        for (int c = 0; c < dim; c++) dx_row[c] = rstd[r] * (dy_row[c] * weight[c] - x_row[c] * coef);
    }
}

/* ---- 3D rotary embedding ------------------------------------------------------------------------ */

#define ROPE_THETA 10000.0

/* Rotate every head of every row by the angles of its (f, h, w) position; direction -1 = the inverse. */
static void rope_rotate(const float *x, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                        const int part_pairs[3], double theta, int direction, float *y)
{
    ALDIT_CHECK(head_dim % 2 == 0, "rope: head_dim %d is odd", head_dim);
    int n_pairs = head_dim / 2;
    ALDIT_CHECK(part_pairs[0] >= 0 && part_pairs[1] >= 0 && part_pairs[2] >= 0 &&
                    part_pairs[0] + part_pairs[1] + part_pairs[2] == n_pairs,
                "rope: axes of %d, %d, %d pairs do not fill head_dim %d", part_pairs[0], part_pairs[1], part_pairs[2],
                head_dim);
    double *frequency = xmalloc((size_t)n_pairs * sizeof(double));
    int *pair_axis = xmalloc((size_t)n_pairs * sizeof(int));
    for (int axis = 0, j = 0; axis < 3; axis++)
        for (int local = 0; local < part_pairs[axis]; local++, j++) {
            frequency[j] = pow(theta, -(double)local / part_pairs[axis]);
            pair_axis[j] = axis;
        }
    int64_t width = (int64_t)num_heads * head_dim;
#pragma omp parallel if (n_rows * width > PARALLEL_MIN_VALUES)
    {
        double *cos_sin = xmalloc((size_t)n_pairs * 2 * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n_rows; r++) {
            for (int j = 0; j < n_pairs; j++) {
                double angle = positions[r * 3 + pair_axis[j]] * frequency[j];
                cos_sin[2 * j] = cos(angle);
                cos_sin[2 * j + 1] = direction * sin(angle);
            }
            for (int h = 0; h < num_heads; h++) {
                const float *x_head = x + r * width + (int64_t)h * head_dim;
                float *y_head = y + r * width + (int64_t)h * head_dim;
                for (int j = 0; j < n_pairs; j++) {
                    double re = x_head[2 * j], im = x_head[2 * j + 1];
                    double c = cos_sin[2 * j], s = cos_sin[2 * j + 1];
                    y_head[2 * j] = (float)(re * c - im * s);
                    y_head[2 * j + 1] = (float)(re * s + im * c);
                }
            }
        }
        free(cos_sin);
    }
    free(frequency);
    free(pair_axis);
}

void cpu_rope_fwd(const float *x, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                  float *y)
{
    const int n_pairs = head_dim / 2, parts[3] = {n_pairs - 2 * (n_pairs / 3), n_pairs / 3, n_pairs / 3};
    rope_rotate(x, n_rows, num_heads, head_dim, positions, parts, ROPE_THETA, 1, y);
}

void cpu_rope_bwd(const float *dy, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                  float *dx)
{
    const int n_pairs = head_dim / 2, parts[3] = {n_pairs - 2 * (n_pairs / 3), n_pairs / 3, n_pairs / 3};
    rope_rotate(dy, n_rows, num_heads, head_dim, positions, parts, ROPE_THETA, -1, dx);
}

void cpu_rope_axes_fwd(const float *x, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                       const int axis_pairs[3], double theta, float *y)
{
    rope_rotate(x, n_rows, num_heads, head_dim, positions, axis_pairs, theta, 1, y);
}

void cpu_rope_axes_bwd(const float *dy, int64_t n_rows, int num_heads, int head_dim, const int32_t *positions,
                       const int axis_pairs[3], double theta, float *dx)
{
    rope_rotate(dy, n_rows, num_heads, head_dim, positions, axis_pairs, theta, -1, dx);
}

void cpu_rope_positions(int n_samples, const int32_t *frames, const int32_t *height, const int32_t *width,
                        int32_t *positions)
{
    int64_t row = 0;
    for (int b = 0; b < n_samples; b++)
        for (int32_t f = 0; f < frames[b]; f++)
            for (int32_t h = 0; h < height[b]; h++)
                for (int32_t w = 0; w < width[b]; w++, row++) {
                    positions[row * 3] = f;
                    positions[row * 3 + 1] = h;
                    positions[row * 3 + 2] = w;
                }
}

/* ---- attention over packed samples -------------------------------------------------------------- */

static int64_t longest_sample(const int64_t *row_start, int n_samples)
{
    int64_t longest = 1;
    for (int b = 0; b < n_samples; b++)
        if (row_start[b + 1] - row_start[b] > longest) longest = row_start[b + 1] - row_start[b];
    return longest;
}

static float dot(const float *a, const float *b, int n)
{
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* One query row of one head: scores[j] = scale * q·k_j for the sample's key rows. */
static void attention_scores(const float *q_head, const float *k, int64_t kv_begin, int64_t n_kv, int64_t width,
                             int head_dim, float softmax_scale, float *scores)
{
    for (int64_t j = 0; j < n_kv; j++) scores[j] = softmax_scale * dot(q_head, k + (kv_begin + j) * width, head_dim);
}

void cpu_attention_fwd(const float *q, const float *k, const float *v, int num_heads, int head_dim,
                       const int64_t *q_row_start, const int64_t *kv_row_start, int n_samples, float *out,
                       float *lse)
{
    int64_t width = (int64_t)num_heads * head_dim;
    float softmax_scale = 1.0f / sqrtf((float)head_dim);
    int64_t max_kv = longest_sample(kv_row_start, n_samples);
    int64_t n_tasks = (int64_t)n_samples * num_heads;
    int64_t work = (q_row_start[n_samples] - q_row_start[0]) * max_kv * width;
#pragma omp parallel if (work > PARALLEL_MIN_VALUES)
    {
        float *scores = xmalloc((size_t)max_kv * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            int b = (int)(task / num_heads), h = (int)(task % num_heads);
            int64_t kv_begin = kv_row_start[b], n_kv = kv_row_start[b + 1] - kv_begin;
            for (int64_t i = q_row_start[b]; i < q_row_start[b + 1]; i++) {
                float *out_head = out + i * width + (int64_t)h * head_dim;
                memset(out_head, 0, (size_t)head_dim * sizeof(float));
                if (n_kv == 0) {
                    lse[i * num_heads + h] = -INFINITY;
                    continue;
                }
                attention_scores(q + i * width + (int64_t)h * head_dim, k + (int64_t)h * head_dim, kv_begin, n_kv,
                                 width, head_dim, softmax_scale, scores);
                float max_score = scores[0];
                for (int64_t j = 1; j < n_kv; j++) max_score = scores[j] > max_score ? scores[j] : max_score;
                double sum = 0.0;
                for (int64_t j = 0; j < n_kv; j++) {
                    scores[j] = expf(scores[j] - max_score);
                    sum += scores[j];
                }
                float inv_sum = (float)(1.0 / sum);
                for (int64_t j = 0; j < n_kv; j++) {
                    const float *v_head = v + (kv_begin + j) * width + (int64_t)h * head_dim;
                    float p = scores[j] * inv_sum;
                    for (int d = 0; d < head_dim; d++) out_head[d] += p * v_head[d];
                }
                lse[i * num_heads + h] = max_score + (float)log(sum);
            }
        }
        free(scores);
    }
}

void cpu_attention_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                       const float *lse, int num_heads, int head_dim, const int64_t *q_row_start,
                       const int64_t *kv_row_start, int n_samples, float *dq, float *dk, float *dv)
{
    int64_t width = (int64_t)num_heads * head_dim;
    float softmax_scale = 1.0f / sqrtf((float)head_dim);
    int64_t max_kv = longest_sample(kv_row_start, n_samples);
    int64_t n_tasks = (int64_t)n_samples * num_heads;
    int64_t work = (q_row_start[n_samples] - q_row_start[0]) * max_kv * width;
    /* One task per (sample, head): it alone writes that head's slice of the sample's dk and dv rows. */
#pragma omp parallel if (work > PARALLEL_MIN_VALUES)
    {
        float *probs = xmalloc((size_t)max_kv * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_tasks; task++) {
            int b = (int)(task / num_heads), h = (int)(task % num_heads);
            int64_t head_offset = (int64_t)h * head_dim;
            int64_t kv_begin = kv_row_start[b], n_kv = kv_row_start[b + 1] - kv_begin;
            for (int64_t j = kv_begin; j < kv_begin + n_kv; j++) {
                memset(dk + j * width + head_offset, 0, (size_t)head_dim * sizeof(float));
                memset(dv + j * width + head_offset, 0, (size_t)head_dim * sizeof(float));
            }
            for (int64_t i = q_row_start[b]; i < q_row_start[b + 1]; i++) {
                const float *q_head = q + i * width + head_offset, *dout_head = dout + i * width + head_offset;
                float *dq_head = dq + i * width + head_offset;
                memset(dq_head, 0, (size_t)head_dim * sizeof(float));
                if (n_kv == 0) continue;
                attention_scores(q_head, k + head_offset, kv_begin, n_kv, width, head_dim, softmax_scale, probs);
                float row_lse = lse[i * num_heads + h];
                float dout_dot_out = dot(dout_head, out + i * width + head_offset, head_dim);
                for (int64_t j = 0; j < n_kv; j++) {
                    const float *k_head = k + (kv_begin + j) * width + head_offset;
                    const float *v_head = v + (kv_begin + j) * width + head_offset;
                    float *dk_head = dk + (kv_begin + j) * width + head_offset;
                    float *dv_head = dv + (kv_begin + j) * width + head_offset;
                    float p = expf(probs[j] - row_lse);
                    float dscore = p * (dot(dout_head, v_head, head_dim) - dout_dot_out) * softmax_scale;
                    for (int d = 0; d < head_dim; d++) {
                        dq_head[d] += dscore * k_head[d];
                        dk_head[d] += dscore * q_head[d];
                        dv_head[d] += p * dout_head[d];
                    }
                }
            }
        }
        free(probs);
    }
}

/* ---- gated residual ----------------------------------------------------------------------------- */

void cpu_gated_residual_fwd(float *x, const float *y, int dim, const int64_t *sample_row_start, int n_samples,
                            const float *gate)
{
    for (int b = 0; b < n_samples; b++) {
        const float *gate_b = gate + (int64_t)b * dim;
        int64_t r0 = sample_row_start[b], r1 = sample_row_start[b + 1];
#pragma omp parallel for schedule(static) if ((r1 - r0) * dim > PARALLEL_MIN_VALUES)
        for (int64_t r = r0; r < r1; r++)
            for (int c = 0; c < dim; c++) x[r * dim + c] += y[r * dim + c] * gate_b[c];
    }
}

void cpu_gated_residual_bwd(const float *dx, const float *y, int dim, const int64_t *sample_row_start,
                            int n_samples, const float *gate, float *dy, float *dgate)
{
    int n_blocks = (dim + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    for (int b = 0; b < n_samples; b++) {
        const float *gate_b = gate + (int64_t)b * dim;
        int64_t r0 = sample_row_start[b], r1 = sample_row_start[b + 1];
        int parallel = (r1 - r0) * dim > PARALLEL_MIN_VALUES;
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t r = r0; r < r1; r++)
            for (int c = 0; c < dim; c++) dy[r * dim + c] = dx[r * dim + c] * gate_b[c];
#pragma omp parallel for schedule(static) if (parallel)
        for (int block = 0; block < n_blocks; block++) {
            int c0 = block * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < dim ? c0 + COLUMN_BLOCK : dim;
            float acc[COLUMN_BLOCK] = {0};
            for (int64_t r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) acc[c - c0] += dx[r * dim + c] * y[r * dim + c];
            for (int c = c0; c < c1; c++) dgate[(int64_t)b * dim + c] = acc[c - c0];
        }
    }
}

/* ---- embeddings and layout ---------------------------------------------------------------------- */

void cpu_sinusoidal_embedding(const float *timesteps, int n, int freq_dim, float *out)
{
    ALDIT_CHECK(freq_dim % 2 == 0, "sinusoidal embedding: freq_dim %d is odd", freq_dim);
    int half = freq_dim / 2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double angle = (double)timesteps[i] * pow(10000.0, -(double)j / half);
            out[(int64_t)i * freq_dim + j] = (float)cos(angle);
            out[(int64_t)i * freq_dim + half + j] = (float)sin(angle);
        }
}

/* Visit every value of a sample once: video index and token index of the same value. */
static void patch_permute(const float *from, float *to, int to_tokens, int channels, int frames, int height,
                          int width, int patch_t, int patch_h, int patch_w, int channel_last)
{
    ALDIT_CHECK(frames % patch_t == 0 && height % patch_h == 0 && width % patch_w == 0,
                "patchify: latent %dx%dx%d is not a multiple of the patch %dx%dx%d", frames, height, width,
                patch_t, patch_h, patch_w);
    int grid_f = frames / patch_t, grid_h = height / patch_h, grid_w = width / patch_w;
    int64_t patch_values = (int64_t)channels * patch_t * patch_h * patch_w;
    int64_t plane = (int64_t)height * width, volume = plane * frames;
#pragma omp parallel for collapse(2) schedule(static) if (volume * channels > PARALLEL_MIN_VALUES)
    for (int fi = 0; fi < grid_f; fi++)
        for (int hi = 0; hi < grid_h; hi++)
            for (int wi = 0; wi < grid_w; wi++) {
                int64_t token = ((int64_t)fi * grid_h + hi) * grid_w + wi;
                for (int c = 0; c < channels; c++)
                    for (int p = 0; p < patch_t; p++)
                        for (int qh = 0; qh < patch_h; qh++)
                            for (int rw = 0; rw < patch_w; rw++) {
                                int64_t offset = ((int64_t)p * patch_h + qh) * patch_w + rw;
                                int64_t inner = channel_last ? offset * channels + c
                                                             : (int64_t)c * patch_t * patch_h * patch_w + offset;
                                int64_t video_index = c * volume + (int64_t)(fi * patch_t + p) * plane +
                                                      (int64_t)(hi * patch_h + qh) * width + wi * patch_w + rw;
                                int64_t token_index = token * patch_values + inner;
                                if (to_tokens)
                                    to[token_index] = from[video_index];
                                else
                                    to[video_index] = from[token_index];
                            }
            }
}

void cpu_patchify(const float *video, int channels, int frames, int height, int width, int patch_t,
                  int patch_h, int patch_w, int channel_last, float *tokens)
{
    patch_permute(video, tokens, 1, channels, frames, height, width, patch_t, patch_h, patch_w, channel_last);
}

void cpu_unpatchify(const float *tokens, int channels, int frames, int height, int width, int patch_t,
                    int patch_h, int patch_w, int channel_last, float *video)
{
    patch_permute(tokens, video, 0, channels, frames, height, width, patch_t, patch_h, patch_w, channel_last);
}
