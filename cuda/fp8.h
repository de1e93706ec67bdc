/* fp8.h — FP8 (E4M3, E5M2) tensors with per-tensor delayed scaling: the scaling state on the device (scales, this step's amax, amax histories), casts from bf16 that record their amax, and the step's scale update, none of it synchronising the host. */
#ifndef ALDIT_FP8_H
#define ALDIT_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The two formats (OCP FP8): E4M3 (4 exponent bits, bias 7, 3 mantissa bits, largest finite 448, unit roundoff
   2^-4) for activations and weights; E5M2 (bias 15, 2 mantissa bits, largest 57344, unit roundoff 2^-3) for
   gradients. */
typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } fp8_format;
#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f
float fp8_format_max(fp8_format format);

/* Delayed scaling (Transformer Engine's recipe), per tensor t of a set:
   - a cast writes q = saturate_to_finite(round_to_nearest_even(x * scale[t])) and takes max |x| of what it casts
     into amax[t] (this step's running maximum, an atomic max: the result does not depend on the order);
   - fp8_scaling_update, once per optimizer step, puts amax[t] into the history's current slot (a ring of
     history_len steps; the slot moves on each update), zeroes amax[t] and sets
       scale[t] = (format_max / m) / 2^margin,  m = the largest finite value in the history,
     keeping the previous scale where m is 0 or not finite, or where the quotient is not finite; scale_inv[t] =
     1 / scale[t] (both rounded to nearest in fp32; fp8_scale_for is the rule, for host references);
   - the GEMM multiplies its product by scale_inv of each operand (cuBLASLt's A/B scale pointers), so that
     x ~ q * scale_inv.
   Until the first update (a fresh run) there is no history: each cast first takes the amax of what it casts into
   amax[t] and sets scale[t] from amax[t] alone (current scaling), then casts; after it, a cast only reads
   scale[t]. The scales start at 1.
   Device state: one fp32 array, per tensor scale, scale_inv, amax and the history. Not thread-safe; one GPU. */
typedef struct fp8_scaling fp8_scaling;

/* A set of n_tensors tensors, tensor t in formats[t]; history_len >= 1, margin >= 0. Allocates on the current GPU. */
fp8_scaling *fp8_scaling_create(int n_tensors, const fp8_format *formats, int history_len, int margin);
void fp8_scaling_free(fp8_scaling *s);
int fp8_scaling_count(const fp8_scaling *s);
/* Floats per tensor in the device's scale, scale_inv and amax arrays: every tensor's value 16-byte aligned, as
   cuBLASLt's FP8 GEMMs require of a scale pointer. */
#define FP8_SLOT_FLOATS 4
/* Device pointer to tensor t's scale_inv, 16-byte aligned (valid while the set lives; what a GEMM's scale pointer
   takes). */
const float *fp8_scale_inv(const fp8_scaling *s, int tensor);
/* Device pointer to the running amaxes (this step's, zeroed by each update): tensor t's at [t * FP8_SLOT_FLOATS], the
   floats between them zero; fp8_scaling_amax_floats values in all. For a caller that makes them the same on every
   rank (a max over the ranks, all the values) between the step's last cast and the update. */
float *fp8_scaling_amax(fp8_scaling *s);
int64_t fp8_scaling_amax_floats(const fp8_scaling *s);
/* Updates done (fp8_scaling_update calls since the start of the run, restored with the state). */
int64_t fp8_scaling_updates(const fp8_scaling *s);

/* The scale rule of fp8_scaling_update for a history maximum m (host; the device computes the same bits). */
float fp8_scale_for(float m, fp8_format format, int margin, float previous);

/* Cast x [rows, cols] (bf16, row-major, cols a multiple of 8, 16-byte aligned) as tensor t: into `out` [rows, cols]
   (may be NULL) and into `out_t` (may be NULL), the transpose [cols, ld_t] with ld_t >= rows, columns rows ... ld_t - 1
   zero (a GEMM's reduction dimension padded to a multiple of 16). At least one output. Queued on `stream`. */
void fp8_quantize(fp8_scaling *s, int tensor, const gpu_bf16 *x, int64_t rows, int cols, uint8_t *out, uint8_t *out_t,
                  int64_t ld_t, cudaStream_t stream);

/* fp8_quantize of gelu_tanh(pre) (PyTorch's approximate='tanh', in fp32 from the bf16 pre): the cast of a GELU's
   output that exists only as its input (the FFN's, whose GEMM emitted its FP8 copy directly in the forward). */
void fp8_quantize_gelu(fp8_scaling *s, int tensor, const gpu_bf16 *pre, int64_t rows, int cols, uint8_t *out,
                       uint8_t *out_t, int64_t ld_t, cudaStream_t stream);

/* fp8_quantize of an output gradient dy into out and out_t (ld_t a multiple of 8, out_t 8-byte aligned) that also adds
   the column sums of dy (the bias gradient, fp32 [cols]) into dbias, in the same pass over dy: per tile of 64 rows a
   partial sum into `partials` (device, fp8_dbias_partials_floats(ld_t, cols) floats), then a fixed-order sum of the
   tiles' partials (bitwise reproducible; the order differs from gemm_column_sums'). */
size_t fp8_dbias_partials_floats(int64_t ld_t, int cols);
void fp8_quantize_dbias(fp8_scaling *s, int tensor, const gpu_bf16 *dy, int64_t rows, int cols, uint8_t *out,
                        uint8_t *out_t, int64_t ld_t, float *dbias, float *partials, cudaStream_t stream);
/* fp8_quantize_dbias of the gradient of a GELU's input, dy * gelu_tanh'(pre) in fp32 (dy the gradient of its output,
   pre [rows, cols] its input, bf16, 16-byte aligned), in the same one pass: what the GELU's linear casts when the
   linear after the GELU gave dy without the DGELU epilogue. The bias gradient sums the fp32 products (not bf16-rounded
   ones as gemm_linear_bwd_data's DGELU output would give). */
void fp8_quantize_dbias_dgelu(fp8_scaling *s, int tensor, const gpu_bf16 *dy, const gpu_bf16 *pre, int64_t rows,
                              int cols, uint8_t *out, uint8_t *out_t, int64_t ld_t, float *dbias, float *partials,
                              cudaStream_t stream);

/* Device pointer to tensor t's scale (what a GEMM that writes the tensor in FP8 takes as its D scale). */
const float *fp8_scale(const fp8_scaling *s, int tensor);
/* Tensor t's running amax = max(itself, *value) (a device float another kernel set: a GEMM's AMAX_D), queued. */
void fp8_record_amax(fp8_scaling *s, int tensor, const float *value, cudaStream_t stream);

/* Tensor t's running amax = max(itself, factor * amax[a] * amax[b]) (a and b tensors of the same set, their running
   amaxes as they stand when the stream reaches it; factor finite and > 0; a product that is 0 or not finite records
   nothing), queued: a bound for a tensor that is not seen (e.g. an FP8 attention's dP, |dP| <= 2 d max|dO| max|V|,
   before its FP8 graph has run once). */
void fp8_record_amax_bound(fp8_scaling *s, int tensor, int a, int b, float factor, cudaStream_t stream);

/* out [n] (bf16, 16-byte aligned) = the values the FP8 bytes in [n] (tensor t's format, 8-byte aligned) stand for:
   each byte decoded times t's scale_inv. n a multiple of 8. Queued on `stream`. */
void fp8_dequantize(const fp8_scaling *s, int tensor, const uint8_t *in, int64_t n, gpu_bf16 *out,
                    cudaStream_t stream);
/* Tensor t's running amax = max(itself, max |x|) over x [n] (bf16, 16-byte aligned, n a multiple of 8), with no cast:
   for a tensor whose FP8 copy is made elsewhere (by cuDNN) from values that also exist in bf16. Queued. */
void fp8_record_amax_of(fp8_scaling *s, int tensor, const gpu_bf16 *x, int64_t n, cudaStream_t stream);

/* Back to the state of a new set (scales 1, amaxes and histories 0, no update done), queued on `stream`: what casts
   before the run's first step (start-up warm-ups on zero data) recorded is forgotten. */
void fp8_scaling_reset(fp8_scaling *s, cudaStream_t stream);

/* The step's update of every tensor of the set (one launch), queued on `stream`. */
void fp8_scaling_update(fp8_scaling *s, cudaStream_t stream);

/* The state as bytes (for checkpoints): a header (format version, n_tensors, history_len, margin, the history's
   current slot, updates) and the device array. save waits for `stream`'s work and copies; load checks the header
   against the set (returns 1 and writes why into `why` on a mismatch, nothing changed) and copies in (synchronous). */
size_t fp8_scaling_state_bytes(const fp8_scaling *s);
void fp8_scaling_save(const fp8_scaling *s, void *blob, cudaStream_t stream);
int fp8_scaling_load(fp8_scaling *s, const void *blob, size_t bytes, char *why, size_t why_size);

/* Host copies for tests: scale, scale_inv, amax [n_tensors] and history [n_tensors][history_len] (any may be NULL);
   the history's slot the next update writes. Synchronous. */
void fp8_scaling_download(const fp8_scaling *s, float *scale, float *scale_inv, float *amax, float *history);
int fp8_scaling_position(const fp8_scaling *s);

/* 1 when the current GPU runs FP8 tensor-core GEMMs (compute capability 8.9 or more), else 0 (writes it to major and
   minor, either may be NULL). */
int fp8_gpu_supported(int *major, int *minor);

#ifdef __cplusplus
}
#endif

#endif
