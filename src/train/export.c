/* export.c — weights read through a [model] init reader, written tensor by tensor as Wan or diffusers safetensors (sharded on request), config.json beside them, renamed into place at the end. */
#include "train/export.h"
#include "core/check.h"
#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES_NAME 96

/* What one export writes: per parameter its name in the file and its shard; per file its final name. */
typedef struct {
    int n_params, n_shards;
    char (*names)[160];
    int *shard;
    int *ndims;
    int64_t (*shapes)[SAFETENSORS_MAX_NDIM];
    char (*files)[MAX_FILES_NAME]; /* n_shards shard names, then the index (if sharded) and config.json */
    int n_files;
    int64_t data_bytes;
} export_plan;

static void plan_free(export_plan *plan)
{
    free(plan->names);
    free(plan->shard);
    free(plan->ndims);
    free(plan->shapes);
    free(plan->files);
}

/* Every parameter's file name and shard, and the files' names. */
static int plan_export(const model *table, const export_options *opts, export_plan *plan, FILE *errors)
{
    int n = table->n_params;
    *plan = (export_plan){.n_params = n, .names = xcalloc((size_t)n, sizeof *plan->names),
                          .shard = xcalloc((size_t)n, sizeof(int)), .ndims = xcalloc((size_t)n, sizeof(int)),
                          .shapes = xcalloc((size_t)n, sizeof *plan->shapes)};
    int64_t in_shard = 0, element_bytes = safetensors_dtype_bytes(opts->dtype);
    for (int i = 0; i < n; i++) {
        const param_info *p = &table->params[i];
        if (wan_name_in(opts->names, p->name, plan->names[i], sizeof plan->names[i])) {
            fprintf(errors, "aldit-export: parameter %s has no %s name\n", p->name, wan_names_label(opts->names));
            return 1;
        }
        int64_t bytes = p->n_elements * element_bytes;
        if (opts->shard_bytes > 0 && in_shard > 0 && in_shard + bytes > opts->shard_bytes) plan->n_shards++, in_shard = 0;
        plan->shard[i] = plan->n_shards;
        in_shard += bytes;
        plan->data_bytes += bytes;
        plan->ndims[i] = p->ndim;
        for (int d = 0; d < p->ndim; d++) plan->shapes[i][d] = p->shape[d];
    }
    plan->n_shards++;
    int sharded = opts->shard_bytes > 0 && plan->n_shards > 1;
    plan->n_files = plan->n_shards + sharded + 1;
    plan->files = xcalloc((size_t)plan->n_files, sizeof *plan->files);
    for (int s = 0; s < plan->n_shards; s++) {
        if (sharded) snprintf(plan->files[s], MAX_FILES_NAME, "diffusion_pytorch_model-%05d-of-%05d.safetensors", s + 1,
                              plan->n_shards);
        else snprintf(plan->files[s], MAX_FILES_NAME, "%s", EXPORT_SINGLE_FILE);
    }
    if (sharded) snprintf(plan->files[plan->n_shards], MAX_FILES_NAME, "%s", EXPORT_INDEX_FILE);
    snprintf(plan->files[plan->n_files - 1], MAX_FILES_NAME, "%s", EXPORT_CONFIG_FILE);
    return 0;
}

/* ---- the folder and its files ---------------------------------------------------------------------------- */

static int prepare_folder(const char *dir, FILE *errors)
{
    struct stat info;
    if (lstat(dir, &info) == 0) {
        if (S_ISDIR(info.st_mode)) return 0;
        fprintf(errors, "aldit-export: %s exists and is %s, not a folder: give --out a folder (new or existing)\n", dir,
                S_ISLNK(info.st_mode) ? "a symbolic link" : "a file");
        return 1;
    }
    if (mkdir(dir, 0777) == 0) return 0;
    fprintf(errors, "aldit-export: cannot create the folder %s: %s\n", dir, strerror(errno));
    return 1;
}

static void file_path(const char *dir, const char *name, int temporary, char *path, size_t size)
{
    snprintf(path, size, "%s/%s%s", dir, name, temporary ? ".tmp" : "");
}

/* A temporary file that is there must be a plain file (a link or folder in its place is refused). */
static int check_slot(const char *path, FILE *errors)
{
    struct stat info;
    if (lstat(path, &info) != 0 || S_ISREG(info.st_mode)) return 0;
    fprintf(errors, "aldit-export: %s is in the way (not a plain file): move it away\n", path);
    return 1;
}

static void remove_temporaries(const export_plan *plan, const char *dir)
{
    char path[PATH_MAX];
    for (int f = 0; f < plan->n_files; f++) {
        file_path(dir, plan->files[f], 1, path, sizeof path);
        unlink(path);
    }
}

/* ---- writing ---------------------------------------------------------------------------------------------- */

static int write_shard(checkpoint_reader *reader, const model *table, const export_plan *plan, int s,
                       const export_options *opts, const char *path, float *values, FILE *errors)
{
    int first = 0, count = 0;
    while (plan->shard[first] != s) first++;
    while (first + count < plan->n_params && plan->shard[first + count] == s) count++;
    const char **names = xmalloc((size_t)count * sizeof *names);
    for (int i = 0; i < count; i++) names[i] = plan->names[first + i];
    safetensors_writer *w = safetensors_writer_open(path, count, names, plan->ndims + first,
                                                    (const int64_t(*)[SAFETENSORS_MAX_NDIM])(plan->shapes + first),
                                                    opts->dtype, errors);
    free(names);
    int status = w == NULL;
    checkpoint_group group = opts->ema ? CHECKPOINT_EMA : CHECKPOINT_WEIGHTS;
    for (int i = 0; i < count && status == 0; i++) {
        status = checkpoint_read_tensor(reader, group, table->params[first + i].name, values);
        if (status == 0) status = safetensors_writer_put(w, values);
    }
    if (status == 0) return safetensors_writer_close(w);
    safetensors_writer_abort(w);
    return 1;
}

static int write_index(const export_plan *plan, const char *path, FILE *errors)
{
    const char **names = xmalloc((size_t)plan->n_params * sizeof *names), **files = xmalloc((size_t)plan->n_params * sizeof *files);
    for (int i = 0; i < plan->n_params; i++) names[i] = plan->names[i], files[i] = plan->files[plan->shard[i]];
    int status = safetensors_write_index(path, plan->n_params, names, files, plan->data_bytes, errors);
    free(names);
    free(files);
    return status;
}

static json_t *patch_size(const deck *config)
{
    return json_pack("[i,i,i]", config->model.patch_t, config->model.patch_h, config->model.patch_w);
}

/* WanTransformer3DModel's constructor arguments (diffusers), or WanModel's (Wan's own config.json). */
static json_t *config_json(const deck *config, wan_names names)
{
    const int dim = config->model.dim, heads = config->model.num_heads;
    if (names == WAN_NAMES_DIFFUSERS)
        return json_pack("{s:s, s:s, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:s, s:f, s:n, s:n, s:i}",
                         "_class_name", "WanTransformer3DModel", "_diffusers_version", "0.42.1", "patch_size",
                         patch_size(config), "num_attention_heads", heads, "attention_head_dim", dim / heads,
                         "in_channels", config->model.in_dim, "out_channels", config->model.out_dim, "text_dim",
                         config->model.text_dim, "freq_dim", config->model.freq_dim, "ffn_dim", config->model.ffn_dim,
                         "num_layers", config->model.num_layers, "cross_attn_norm", config->model.cross_attn_norm,
                         "qk_norm", "rms_norm_across_heads", "eps", config->model.eps, "image_dim", "added_kv_proj_dim",
                         "rope_max_seq_len", 1024);
    return json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:b, s:b, s:f, s:[i,i]}",
                     "_class_name", "WanModel", "model_type", "t2v", "dim", dim, "ffn_dim", config->model.ffn_dim,
                     "freq_dim", config->model.freq_dim, "num_heads", heads, "num_layers", config->model.num_layers,
                     "in_dim", config->model.in_dim, "out_dim", config->model.out_dim, "text_len",
                     config->model.text_len, "text_dim", config->model.text_dim, "patch_size", patch_size(config),
                     "qk_norm", config->model.qk_norm, "cross_attn_norm", config->model.cross_attn_norm, "eps",
                     config->model.eps, "window_size", -1, -1);
}

static int write_config(const deck *config, wan_names names, const char *path, FILE *errors)
{
    json_t *root = config_json(config, names);
    FILE *out = fopen(path, "w");
    int status = !root || !out || json_dumpf(root, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) ||
                 fputc('\n', out) == EOF || fflush(out) != 0 || fsync(fileno(out)) != 0;
    if (out && fclose(out) != 0) status = 1;
    if (status) fprintf(errors, "aldit-export: writing %s failed: %s\n", path, strerror(errno));
    json_decref(root);
    return status;
}

/* Every file of the plan under its temporary name. */
static int write_files(checkpoint_reader *reader, const model *table, const deck *config, const export_plan *plan,
                       const export_options *opts, const char *dir, FILE *errors)
{
    int64_t largest = 1;
    for (int p = 0; p < table->n_params; p++)
        if (table->params[p].n_elements > largest) largest = table->params[p].n_elements;
    float *values = xmalloc((size_t)largest * sizeof(float));
    char path[PATH_MAX];
    int status = 0;
    for (int f = 0; f < plan->n_files && status == 0; f++) {
        file_path(dir, plan->files[f], 1, path, sizeof path);
        status = check_slot(path, errors);
        if (status) break;
        if (f < plan->n_shards) status = write_shard(reader, table, plan, f, opts, path, values, errors);
        else if (f < plan->n_files - 1) status = write_index(plan, path, errors);
        else status = write_config(config, opts->names, path, errors);
    }
    free(values);
    return status;
}

/* Renames every temporary file into place, removes the other layout's index or single file, syncs the folder. */
static int publish(const export_plan *plan, const char *dir, FILE *log, FILE *errors)
{
    char from[PATH_MAX], to[PATH_MAX];
    for (int f = 0; f < plan->n_files; f++) {
        file_path(dir, plan->files[f], 1, from, sizeof from);
        file_path(dir, plan->files[f], 0, to, sizeof to);
        if (rename(from, to) != 0) {
            fprintf(errors, "aldit-export: cannot rename %s to %s: %s\n", from, to, strerror(errno));
            return 1;
        }
        if (log) fprintf(log, "aldit-export: wrote %s\n", to);
    }
    file_path(dir, plan->n_shards > 1 ? EXPORT_SINGLE_FILE : EXPORT_INDEX_FILE, 0, to, sizeof to);
    unlink(to); /* a stale file of the other layout would be read instead of, or beside, this one */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
    return 0;
}

static int check_supported(const deck *config, const checkpoint_reader *reader, const char *input,
                           const export_options *opts, FILE *errors)
{
    if (opts->names == WAN_NAMES_DIFFUSERS && !config->model.qk_norm) {
        fprintf(errors, "aldit-export: diffusers' WanTransformer3DModel always applies q/k RMSNorm: a model with "
                "qk_norm off can only be exported as --format wan\n");
        return 1;
    }
    if (opts->ema && !checkpoint_reader_has(reader, CHECKPOINT_EMA)) {
        fprintf(errors, "aldit-export: %s has no /ema weights (the run kept no EMA: leave out --ema)\n", input);
        return 1;
    }
    if (opts->dtype != SAFETENSORS_F32 && opts->dtype != SAFETENSORS_BF16) {
        fprintf(errors, "aldit-export: the weights are written as fp32 or bf16 only\n");
        return 1;
    }
    return 0;
}

int export_safetensors(const char *input, const deck *config, const model *table, const export_options *opts,
                       const char *out_dir, FILE *log, FILE *errors)
{
    checkpoint_reader *reader = checkpoint_reader_open_init(input, table, errors);
    if (!reader) return 1;
    export_plan plan;
    int status = check_supported(config, reader, input, opts, errors);
    if (status == 0) status = plan_export(table, opts, &plan, errors);
    else plan = (export_plan){0};
    if (status == 0) status = prepare_folder(out_dir, errors);
    if (status == 0) status = write_files(reader, table, config, &plan, opts, out_dir, errors);
    if (status == 0) status = publish(&plan, out_dir, log, errors);
    if (status != 0 && plan.files) remove_temporaries(&plan, out_dir);
    plan_free(&plan);
    checkpoint_reader_close(reader);
    return status;
}
