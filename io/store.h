/* store.h — the HDF5 latent store: variable-shape latents and text embeddings back to back, an index, reader and writer. */
#ifndef ALDIT_STORE_H
#define ALDIT_STORE_H

#include <stdint.h>
#include <stdio.h>

/* Format version written into the root attribute `aldit_store_version`; the reader accepts only this. */
#define STORE_FORMAT_VERSION 1
/* Columns of the /index table (int64 [n_samples, STORE_INDEX_COLUMNS]), in this order. */
#define STORE_INDEX_COLUMNS 8
#define STORE_INDEX_COLUMN_NAMES "channels,frames,height,width,text_len,latent_offset,text_offset,checksum"
/* The optional caption sources (hunyuanvideo15: ByT5 glyph rows and SigLIP image rows; docs/store.md): the columns
   of /index_sources (integer [n_samples, STORE_SOURCES_COLUMNS]), in this order. */
#define STORE_SOURCES_COLUMNS 5
#define STORE_SOURCES_COLUMN_NAMES "text_2_len,text_2_offset,image_len,image_offset,checksum"

/* On-disk precision of /latents and /text; readers always get fp32. */
typedef enum {
    STORE_BF16, /* bfloat16 bit patterns stored as uint16 (written with round-to-nearest-even) */
    STORE_F16,  /* IEEE half */
    STORE_F32   /* IEEE single */
} store_precision;

/* One row of the index. Offsets count elements (not bytes) of /latents and /text. */
typedef struct {
    int32_t channels, frames, height, width; /* latent [C, F, H, W], latent units */
    int32_t text_len;                        /* text tokens (rows of [L, text_dim]), >= 1 */
    int64_t latent_offset, text_offset;
    uint32_t checksum;                       /* CRC-32 of the latent's stored bytes followed by the text's */
} store_sample;

/* One row of /index_sources: a sample's ByT5 rows [text_2_len, text_2_dim] and SigLIP rows [image_len, image_dim]
   (either length may be 0), offsets in elements of /text_2 and /image. */
typedef struct {
    int32_t text_2_len, image_len;
    int64_t text_2_offset, image_offset;
    uint32_t checksum;                       /* CRC-32 of the text_2's stored bytes followed by the image's */
} store_sources;

typedef struct {
    char path[1024];
    int64_t n_samples;
    int32_t text_dim;
    store_sample *samples;               /* n_samples rows */
    int32_t latent_channels;             /* C of every sample */
    store_precision latent_precision, text_precision;
    int64_t latents_length, text_length; /* elements in /latents and /text */
    int64_t max_latent_elements;         /* largest C*F*H*W of any sample (buffer size for reads) */
    int64_t max_text_elements;           /* largest text_len*text_dim of any sample */
    /* The caption sources, all or none: has_sources = 0 (a Wan store) leaves the rest zero and sources NULL. */
    int has_sources;
    int32_t text_2_dim, image_dim;
    store_precision text_2_precision, image_precision;
    store_sources *sources;              /* n_samples rows (NULL without sources) */
    int64_t text_2_length, image_length; /* elements in /text_2 and /image */
    int64_t max_text_2_elements, max_image_elements; /* largest per sample */
    int64_t h5_file, h5_latents, h5_text, h5_text_2, h5_image; /* HDF5 handles (hid_t), private to store.c */
} store;

/* One process: open read-only, read and check the index and attributes. On error prints
   "PATH: message" lines to `errors`, leaves `s` closed and returns non-zero; 0 on success. */
int store_open(store *s, const char *path, FILE *errors);

/* Collective over MPI_COMM_WORLD: rank 0 opens the store and reads the index, broadcasts it; every
   rank opens the file read-only for data. On any error the message is printed (by rank 0, or by the
   failing rank) and every rank exits with status 2. */
void store_open_bcast(store *s, const char *path);

/* Read sample `id` as fp32: latent (C*F*H*W values) and text (text_len*text_dim values); either
   pointer may be NULL to skip that part. 0 on success; an out-of-range id, a read error (truncated
   or corrupt file) or a value that is not finite prints a message naming the sample and the file to
   `errors` and returns non-zero. */
int store_read_sample(const store *s, int64_t id, float *latent, float *text, FILE *errors);

/* Like store_read_sample (both buffers required), and also checks the stored checksum. 0 when the
   sample is sound. */
int store_verify_sample(const store *s, int64_t id, float *latent, float *text, FILE *errors);

/* Read sample `id`'s caption sources as fp32: text_2 (text_2_len * text_2_dim values) and image (image_len *
   image_dim values); either pointer may be NULL to skip that part. A store without sources is an error. Errors as
   store_read_sample's (naming the sample, the dataset and the file); 0 on success. */
int store_read_sources(const store *s, int64_t id, float *text_2, float *image, FILE *errors);
/* Like store_read_sources (both buffers required), and also checks the row's checksum. 0 when sound. */
int store_verify_sources(const store *s, int64_t id, float *text_2, float *image, FILE *errors);

/* Close the HDF5 handles and free the index; `s` may be closed twice. */
void store_close(store *s);

/* Tokens after patchify: S = F/pt * H/ph * W/pw (integer division). */
int64_t store_sample_tokens(const store_sample *sample, int patch_t, int patch_h, int patch_w);
/* Elements of a sample's latent (C*F*H*W) and text (text_len*text_dim). */
int64_t store_sample_latent_elements(const store_sample *sample);
int64_t store_sample_text_elements(const store *s, const store_sample *sample);
/* Elements of sample id's ByT5 rows and SigLIP rows (0 without sources). */
int64_t store_sample_text_2_elements(const store *s, int64_t id);
int64_t store_sample_image_elements(const store *s, int64_t id);

/* Precision names as they appear in the attributes and on command lines: "bf16", "f16", "f32". */
const char *store_precision_name(store_precision precision);
/* 0 and *precision set when `name` is one of the names above; non-zero otherwise. */
int store_precision_parse(const char *name, store_precision *precision);
/* Bytes per stored value. */
int store_precision_bytes(store_precision precision);

/* Conversions used by the store (round to nearest even; exposed for tests and tools). */
uint16_t store_f32_to_bf16(float value);
float store_bf16_to_f32(uint16_t bits);
uint16_t store_f32_to_f16(float value);
float store_f16_to_f32(uint16_t bits);
/* CRC-32 (IEEE 802.3) through zlib's crc32, the same as Python's zlib.crc32: pass crc = 0 to start, or the
   previous result to continue over more bytes. */
uint32_t store_crc32(uint32_t crc, const void *bytes, size_t n_bytes);

/* Writer used by aldit-store synth/pack and by tests. It writes PATH.tmp and renames it to PATH on a
   successful close, so no half-written store ever carries the real name. Every sample must have the
   same channel count and text_len >= 1; values must be finite and representable in the precision. */
typedef struct store_writer store_writer;
/* NULL on error (message to `errors`, which the writer keeps for its later messages). */
store_writer *store_writer_create(const char *path, int32_t text_dim, store_precision precision, FILE *errors);
/* Append one sample; 0 on success. */
int store_writer_add(store_writer *w, int32_t channels, int32_t frames, int32_t height, int32_t width,
                     const float *latent, int32_t text_len, const float *text);
/* Write the index and attributes, close and rename into place; frees `w`. 0 on success; on failure the
   temporary file is removed. A store needs at least one sample. */
int store_writer_close(store_writer *w);
/* Make the store hold the caption sources (/text_2, /image, /index_sources; docs/store.md), of these widths, in the
   writer's precision. Call before the first sample; then every sample gets a row (store_writer_add gives it none).
   0 on success. */
int store_writer_enable_sources(store_writer *w, int32_t text_2_dim, int32_t image_dim);
/* Append one sample with its sources: ByT5 rows text_2 [text_2_len, text_2_dim] and SigLIP rows image [image_len,
   image_dim], either length 0 for none (the pointer may then be NULL). Needs store_writer_enable_sources. */
int store_writer_add_sources(store_writer *w, int32_t channels, int32_t frames, int32_t height, int32_t width,
                             const float *latent, int32_t text_len, const float *text, int32_t text_2_len,
                             const float *text_2, int32_t image_len, const float *image);
/* Give up: close and remove the temporary file, free `w`. */
void store_writer_discard(store_writer *w);

/* What `path` is when it exists and is not a regular file ("a directory", "a symbolic link", "a device",
   "a named pipe", "a socket"); NULL when it is a regular file or does not exist. The store writer refuses
   such a path (and such a PATH.tmp), as do other writers that publish a file by rename (aldit-forward):
   a rename over a directory fails, and over a link or a pipe it would replace what the user made. */
const char *store_not_a_regular_file(const char *path);

#endif
