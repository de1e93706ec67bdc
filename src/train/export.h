/* export.h — a checkpoint's weights (or its EMA) written out as safetensors under Wan's or diffusers' names, with the config.json each loader reads. */
#ifndef ALDIT_EXPORT_H
#define ALDIT_EXPORT_H

#include <stdint.h>
#include <stdio.h>

#include "deck/deck.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/wan_names.h"

typedef struct {
    wan_names names;          /* WAN_NAMES_WAN: Wan's official layout; WAN_NAMES_DIFFUSERS: WanTransformer3DModel's */
    int ema;                  /* the file's /ema weights instead of its root's */
    safetensors_dtype dtype;  /* SAFETENSORS_F32 (exact) or SAFETENSORS_BF16 */
    int64_t shard_bytes;      /* 0: one diffusion_pytorch_model.safetensors; else shards of at most this many bytes
                                 of data (a tensor larger than that alone in its shard) and their index */
} export_options;

/* The file names an export writes into its folder. */
#define EXPORT_SINGLE_FILE SAFETENSORS_SINGLE_FILE
#define EXPORT_INDEX_FILE SAFETENSORS_INDEX_FILE
#define EXPORT_CONFIG_FILE "config.json"

/* Reads every parameter of `table` (the model of `config`, whose dims and eps go into config.json) from `input`
   (anything [model] init reads: checkpoint_reader_open_init, so names, shapes and finiteness are checked) and writes
   folder `out_dir`: the safetensors (one file, or diffusion_pytorch_model-NNNNN-of-NNNNN.safetensors and the index)
   and config.json (diffusers: WanTransformer3DModel's arguments; Wan: WanModel's). `out_dir` is created when absent
   (its parent must exist); a symbolic link or anything but a directory there is refused. Every file is written
   under a temporary name (NAME.tmp) and renamed into place only once all are complete, then the folder is synced;
   on failure the temporary files are removed and the folder's earlier files stay as they were. The diffusers
   format needs qk_norm on (refused otherwise). Returns 0, or non-zero after a message on `errors` naming the
   file and what to do. Prints one line per file written to `log` (may be NULL). */
int export_safetensors(const char *input, const deck *config, const model *table, const export_options *opts,
                       const char *out_dir, FILE *log, FILE *errors);

#endif
