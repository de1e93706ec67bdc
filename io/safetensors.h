/* safetensors.h — the safetensors format: reading a file or a sharded set (its *.safetensors.index.json) as fp32, writing files and the index. */
#ifndef ALDIT_SAFETENSORS_H
#define ALDIT_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

/* The names diffusers and Wan's releases give a model's weights in its folder: one file, or shards and their index. */
#define SAFETENSORS_SINGLE_FILE "diffusion_pytorch_model.safetensors"
#define SAFETENSORS_INDEX_FILE "diffusion_pytorch_model.safetensors.index.json"

/* Most dimensions a tensor of a file may have (more is refused as a damaged header). */
#define SAFETENSORS_MAX_NDIM 8

/* The element types this code converts to and from fp32; every other dtype of the format is SAFETENSORS_OTHER. */
typedef enum { SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16, SAFETENSORS_F64, SAFETENSORS_OTHER } safetensors_dtype;

/* One tensor of an open set, as its header describes it. */
typedef struct {
    const char *name;
    const char *dtype_name;  /* as in the header: "BF16", "F32", "I64", ... */
    safetensors_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_NDIM];
    int64_t n_elements;
    const char *file;        /* the file holding it (a shard's path for a sharded set) */
} safetensors_tensor;

/* ---- reading ------------------------------------------------------------------------------------------
   A set is one .safetensors file, or the files a *.safetensors.index.json names (its "weight_map": tensor
   name -> file, relative to the index's folder), or a folder holding SAFETENSORS_INDEX_FILE (read by it) or else
   SAFETENSORS_SINGLE_FILE (a diffusers transformer folder, a Wan release). Everything is checked at open, before any value is read:
   the 8-byte header length within the file, the header a JSON object (parsed by jansson), each tensor's
   dtype a string, its shape non-negative integers (at most SAFETENSORS_MAX_NDIM), its data_offsets within
   the file and as long as shape and dtype say (a truncated file is named with the first tensor whose data
   lies past its end), no tensor name twice in a set, and every name of an index present in the shard it
   names. Every failure prints "FILE: what is wrong" to `errors`. Little-endian hosts only (as the format). */
typedef struct safetensors safetensors;

/* NULL on failure (the message on `errors`: a missing file with errno's text). */
safetensors *safetensors_open(const char *path, FILE *errors);
void safetensors_close(safetensors *set); /* NULL: nothing */

/* 1 when `path`'s first bytes could begin a safetensors file, its name ends in .safetensors.index.json or it is
   a folder (so that a caller can tell it from HDF5 before opening it), else 0. Never prints. */
int safetensors_probe(const char *path);

int safetensors_count(const safetensors *set);
/* The i-th tensor (0 <= i < count), in the order of the files' headers. */
const safetensors_tensor *safetensors_at(const safetensors *set, int i);
/* The tensor named `name`, or NULL. */
const safetensors_tensor *safetensors_find(const safetensors *set, const char *name);

/* Reads tensor `t` of `set` into `values` (t->n_elements floats), F32, F16, BF16 and F64 converted to fp32
   (F64 rounded to nearest); another dtype is refused, naming it. Non-zero after a message on `errors`
   (a failed read names the file and the tensor). Values are not checked for finiteness. */
int safetensors_read_f32(const safetensors *set, const safetensors_tensor *t, float *values, FILE *errors);

/* ---- writing -------------------------------------------------------------------------------------------
   A writer is opened with every tensor's name and shape (the header comes first), then given the values
   tensor by tensor in that order. It writes `path` itself (callers wanting atomicity pass a temporary
   name and rename it after close). The header carries {"__metadata__": {"format": "pt"}} and is padded
   with spaces to a multiple of 8 bytes; data follows in the given order without gaps, as PyTorch's
   safetensors writes it. */
typedef struct safetensors_writer safetensors_writer;

/* `dtype`: SAFETENSORS_F32 (values stored exactly) or SAFETENSORS_BF16 (rounded to nearest even; NaN
   stays NaN). Refuses (NULL, message naming `path`) another dtype, a file that cannot be created, or
   a header that cannot be written. */
safetensors_writer *safetensors_writer_open(const char *path, int n_tensors, const char *const *names,
                                            const int *ndims, const int64_t (*shapes)[SAFETENSORS_MAX_NDIM],
                                            safetensors_dtype dtype, FILE *errors);
/* The next tensor's values (its n_elements floats). Non-zero (message) on a write error or past the last. */
int safetensors_writer_put(safetensors_writer *w, const float *values);
/* Checks every tensor was put, flushes and fsyncs, closes; non-zero (message) otherwise. Releases w. */
int safetensors_writer_close(safetensors_writer *w);
/* Closes and deletes the file; releases w (NULL: nothing). */
void safetensors_writer_abort(safetensors_writer *w);
/* Bytes per element of `dtype` (0 for SAFETENSORS_OTHER). */
int safetensors_dtype_bytes(safetensors_dtype dtype);

/* Writes the index of a sharded set to `path` (fsynced): {"metadata": {"total_size": total_bytes},
   "weight_map": {names[i]: files[i]}} with files named relative to the index's folder. */
int safetensors_write_index(const char *path, int n_tensors, const char *const *names, const char *const *files,
                            int64_t total_bytes, FILE *errors);

#endif
