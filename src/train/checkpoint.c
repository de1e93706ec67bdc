/* checkpoint.c — writing (atomically, keep-K), finding and reading HDF5 checkpoints and weights-only files. */
#include "train/checkpoint.h"
#include "core/check.h"
#include "io/h5util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define CHECKPOINT_SUBDIR "checkpoints"

/* Integer model dims recorded in the /model group; a checkpoint is rejected when any differs from the deck. */
typedef struct { const char *key; int value; } model_dim;

static int model_dims(const deck *config, model_dim *dims)
{
    const model_dim all[] = {
        {"dim", config->model.dim}, {"ffn_dim", config->model.ffn_dim},
        {"num_heads", config->model.num_heads}, {"num_layers", config->model.num_layers},
        {"in_dim", config->model.in_dim}, {"out_dim", config->model.out_dim},
        {"patch_t", config->model.patch_t}, {"patch_h", config->model.patch_h}, {"patch_w", config->model.patch_w},
        {"text_len", config->model.text_len}, {"text_dim", config->model.text_dim},
        {"freq_dim", config->model.freq_dim}, {"qk_norm", config->model.qk_norm},
        {"cross_attn_norm", config->model.cross_attn_norm},
    };
    int n_dims = (int)(sizeof all / sizeof all[0]);
    memcpy(dims, all, sizeof all);
    return n_dims;
}
#define MAX_MODEL_DIMS 16


static void checkpoint_dir(const deck *config, char *dir, size_t dir_size)
{
    snprintf(dir, dir_size, "%s/%s", config->run.dir, CHECKPOINT_SUBDIR);
}

void checkpoint_path(const deck *config, int64_t step, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/%s/step_%08" PRId64 ".h5", config->run.dir, CHECKPOINT_SUBDIR, step);
}

/* ---- writing ------------------------------------------------------------------------------------- */

/* A scalar attribute `name` on loc, stored as file_type, from *value in memory_type. */
static int write_attr(hid_t loc, const char *name, hid_t file_type, hid_t memory_type, const void *value)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    int status = attr < 0 ? -1 : (H5Awrite(attr, memory_type, value) < 0 ? -1 : 0);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return status;
}

static int write_attr_i64(hid_t loc, const char *name, int64_t value)
{
    return write_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

static int write_attr_u64(hid_t loc, const char *name, uint64_t value)
{
    return write_attr(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

static int write_attr_string(hid_t loc, const char *name, const char *text)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(text) + 1);
    H5Tset_strpad(type, H5T_STR_NULLTERM);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    int status = attr < 0 ? -1 : (H5Awrite(attr, type, text) < 0 ? -1 : 0);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    return status;
}

static int write_floats(hid_t loc, const char *name, const param_info *param, const float *values)
{
    hsize_t dims[MODEL_MAX_NDIM];
    for (int d = 0; d < param->ndim; d++) dims[d] = (hsize_t)param->shape[d];
    hid_t space = H5Screate_simple(param->ndim, dims, NULL);
    hid_t set = H5Dcreate2(loc, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int status = set < 0 ? -1 : (H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0 ? -1 : 0);
    if (set >= 0) H5Dclose(set);
    H5Sclose(space);
    return status;
}

static int write_vector(hid_t loc, const char *name, hid_t file_type, hid_t memory_type, size_t n_values,
                        const void *values)
{
    hsize_t length = (hsize_t)n_values;
    hid_t space = H5Screate_simple(1, &length, NULL);
    hid_t set = H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int status = set < 0 || (n_values > 0 && H5Dwrite(set, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0)
                     ? -1 : 0;
    if (set >= 0) H5Dclose(set);
    H5Sclose(space);
    return status;
}

static int write_model_group(hid_t file, const deck *config)
{
    hid_t group = H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (group < 0) return -1;
    model_dim dims[MAX_MODEL_DIMS];
    int n_dims = model_dims(config, dims), status = 0;
    for (int i = 0; i < n_dims && status == 0; i++) status = write_attr_i64(group, dims[i].key, dims[i].value);
    if (status == 0) status = write_attr_string(group, "name", config->model.name);
    H5Gclose(group);
    return status;
}

static int write_deck_text(hid_t file, const deck *config)
{
    char *text = NULL;
    size_t text_bytes = 0;
    FILE *memory = open_memstream(&text, &text_bytes);
    if (!memory) return -1;
    deck_print(config, memory);
    fclose(memory);
    int status = write_attr_string(file, "deck", text);
    free(text);
    return status;
}

static int write_file(const char *path, const deck *config, const model *m, const checkpoint_state *state)
{
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) return -1;
    int status = write_attr_string(file, "format", "aldit checkpoint");
    if (status == 0) status = write_attr_i64(file, "aldit_checkpoint_version", CHECKPOINT_FORMAT_VERSION);
    if (status == 0) status = write_attr_i64(file, "step", state->step);
    if (status == 0) status = write_attr_i64(file, "epoch", state->epoch);
    if (status == 0) status = write_attr_i64(file, "steps_per_epoch", state->steps_per_epoch);
    if (status == 0) status = write_attr_u64(file, "seed", state->seed);
    if (status == 0) status = write_attr_string(file, "rng", "counter-based: noise and sigma of a sample are "
                                                "keyed by (seed, epoch, sample id); no stream state");
    if (status == 0) status = write_model_group(file, config);
    if (status == 0) status = write_deck_text(file, config);
    for (int p = 0; p < m->n_params && status == 0; p++)
        status = write_floats(file, m->params[p].name, &m->params[p], m->weights + m->params[p].offset);
    hid_t optim = status == 0 ? H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    hid_t first = optim >= 0 ? H5Gcreate2(optim, "m", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    hid_t second = optim >= 0 ? H5Gcreate2(optim, "v", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (first < 0 || second < 0) status = -1;
    for (int p = 0; p < m->n_params && status == 0; p++) {
        const param_info *param = &m->params[p];
        status = write_floats(first, param->name, param, state->adam_m + param->offset);
        if (status == 0) status = write_floats(second, param->name, param, state->adam_v + param->offset);
    }
    if (first >= 0) H5Gclose(first);
    if (second >= 0) H5Gclose(second);
    if (optim >= 0) H5Gclose(optim);
    /* run bookkeeping sits in /run, so the root's datasets are exactly the parameters */
    hid_t run = status == 0 ? H5Gcreate2(file, "run", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (run < 0) status = -1;
    if (status == 0) status = write_vector(run, "balancer_state", H5T_STD_U8LE, H5T_NATIVE_UCHAR, state->balancer_bytes,
                                           state->balancer_state);
    if (status == 0) status = write_vector(run, "last_step_rank_seconds", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                                           (size_t)state->n_ranks, state->rank_seconds);
    if (run >= 0) H5Gclose(run);
    /* Written last: a file that has it was written to the end. */
    if (status == 0) status = write_attr_i64(file, "complete", 1);
    if (H5Fclose(file) < 0) status = -1;
    return status;
}

static int fsync_path(const char *path, int flags)
{
    int fd = open(path, flags);
    if (fd < 0) return -1;
    int status = fsync(fd);
    close(fd);
    return status;
}

/* Checkpoint steps found in `dir`, parsed from the names step_N.h5; stale step_N.h5.tmp removed when asked. */
static int64_t *list_steps(const char *dir, int *n_steps, int remove_tmp, FILE *warnings)
{
    *n_steps = 0;
    int capacity = 16;
    int64_t *steps = xmalloc((size_t)capacity * sizeof *steps);
    DIR *listing = opendir(dir);
    if (!listing) return steps;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        const char *name = entry->d_name;
        if (strncmp(name, "step_", 5) != 0) continue;
        char *end = NULL;
        errno = 0;
        long long step = strtoll(name + 5, &end, 10);
        if (errno || end == name + 5 || step < 0) continue;
        if (strcmp(end, ".h5.tmp") == 0) {
            char tmp_path[2 * DECK_PATH_MAX];
            snprintf(tmp_path, sizeof tmp_path, "%s/%s", dir, name);
            if (remove_tmp) unlink(tmp_path);
            else if (warnings) fprintf(warnings, "aldit: warning: ignoring incomplete checkpoint %s\n", tmp_path);
            continue;
        }
        if (strcmp(end, ".h5") != 0) continue;
        char canonical[64]; /* only names checkpoint_path writes: step_5.h5 would be looked up as step_00000005.h5 */
        snprintf(canonical, sizeof canonical, "step_%08lld.h5", step);
        if (strcmp(name, canonical) != 0) continue;
        if (*n_steps == capacity) steps = xrealloc(steps, (size_t)(capacity *= 2) * sizeof *steps);
        steps[(*n_steps)++] = step;
    }
    closedir(listing);
    return steps;
}

static int compare_steps(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int checkpoint_readable(const char *path, int64_t step, FILE *warnings);

/* Keeps the newest `[checkpoint] keep` complete checkpoints and deletes the older complete ones. Files that
   cannot be read as one (truncated, or another format version) neither count nor go: deleting them could
   leave fewer usable checkpoints than promised, or lose a newer aldit's. */
static void prune(const deck *config, const char *dir)
{
    int n_steps = 0;
    int64_t *steps = list_steps(dir, &n_steps, 1, NULL);
    qsort(steps, (size_t)n_steps, sizeof *steps, compare_steps);
    const int keep = config->checkpoint.keep < 1 ? 1 : config->checkpoint.keep;
    h5_auto_print quiet = h5_quiet_begin();
    for (int i = n_steps - 1, kept = 0; i >= 0; i--) {
        char path[2 * DECK_PATH_MAX];
        checkpoint_path(config, steps[i], path, sizeof path);
        if (!checkpoint_readable(path, steps[i], NULL)) continue;
        if (kept < keep) ++kept;
        else if (unlink(path) != 0) aldit_warn("could not delete old checkpoint %s: %s", path, strerror(errno));
    }
    h5_quiet_end(quiet);
    free(steps);
}

/* Refuses a checkpoint the disk has no room for, before HDF5 starts: HDF5 (1.10) cannot close a file whose
   metadata it failed to write, so a write that runs out of space would keep the half-written file (and its
   space) open for good and crash the library at exit. Counts the weights, both moments, the run state and
   1 KiB of HDF5 metadata per dataset; a quota is not seen here. */
static int check_free_space(const char *dir, const model *m, const checkpoint_state *state, FILE *errors)
{
    double needed = 3.0 * sizeof(float) * (double)m->n_weights + (double)state->balancer_bytes +
                    sizeof(double) * (double)state->n_ranks + 1024.0 * (3 * m->n_params + 16);
    struct statvfs filesystem;
    if (statvfs(dir, &filesystem) != 0) return 0; /* cannot tell: let the write report any failure */
    double available = (double)filesystem.f_bavail * (double)filesystem.f_frsize;
    if (available >= needed) return 0;
    fprintf(errors, "%s: not enough free space for the checkpoint (%.1f MiB needed, %.1f MiB free)\n", dir,
            needed / 1048576.0, available / 1048576.0);
    return 1;
}

int checkpoint_save(const deck *config, const model *m, const checkpoint_state *state,
                    char *path_out, size_t path_size, FILE *errors)
{
    char dir[2 * DECK_PATH_MAX], path[2 * DECK_PATH_MAX], tmp_path[2 * DECK_PATH_MAX + 8];
    checkpoint_dir(config, dir, sizeof dir);
    if (mkdir(config->run.dir, 0777) != 0 && errno != EEXIST) {
        fprintf(errors, "%s: cannot create the run folder: %s\n", config->run.dir, strerror(errno));
        return 1;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(errors, "%s: cannot create the checkpoint folder: %s\n", dir, strerror(errno));
        return 1;
    }
    if (check_free_space(dir, m, state, errors) != 0) return 1;
    checkpoint_path(config, state->step, path, sizeof path);
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
    h5_auto_print quiet = h5_quiet_begin();
    int status = write_file(tmp_path, config, m, state);
    h5_quiet_end(quiet);
    if (status != 0) {
        fprintf(errors, "%s: writing the checkpoint failed (disk full or not writable?)\n", tmp_path);
        unlink(tmp_path);
        return 1;
    }
    if (fsync_path(tmp_path, O_RDONLY) != 0 || rename(tmp_path, path) != 0) {
        fprintf(errors, "%s: cannot sync or rename the checkpoint into place: %s\n", tmp_path, strerror(errno));
        unlink(tmp_path);
        return 1;
    }
    fsync_path(dir, O_RDONLY | O_DIRECTORY); /* make the rename itself durable */
    prune(config, dir);
    if (path_out) snprintf(path_out, path_size, "%s", path);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------------- */

/* A scalar attribute read as `memory_type` into value; -1 if it is missing or unreadable. */
static int read_attr(hid_t loc, const char *name, hid_t memory_type, void *value)
{
    if (H5Aexists(loc, name) <= 0) return -1;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    if (attr < 0) return -1;
    int status = H5Aread(attr, memory_type, value) < 0 ? -1 : 0;
    if (H5Aclose(attr) < 0) status = -1;
    return status;
}

static int read_attr_i64(hid_t loc, const char *name, int64_t *value) { return read_attr(loc, name, H5T_NATIVE_INT64, value); }
static int read_attr_u64(hid_t loc, const char *name, uint64_t *value) { return read_attr(loc, name, H5T_NATIVE_UINT64, value); }

/* fprintf to `out`, or nothing when it is NULL (a check asked for its answer only). */
static void say(FILE *out, const char *format, ...)
{
    if (!out) return;
    va_list args;
    va_start(args, format);
    vfprintf(out, format, args);
    va_end(args);
}

/* The version attribute and the completion mark, checked on an open file; `errors` may be NULL. */
static int check_header(hid_t file, const char *path, FILE *errors)
{
    int64_t version = 0, complete = 0;
    if (read_attr_i64(file, "aldit_checkpoint_version", &version) != 0) {
        say(errors, "%s: not an aldit checkpoint (no attribute aldit_checkpoint_version)\n", path);
        return 1;
    }
    if (version != CHECKPOINT_FORMAT_VERSION) {
        say(errors, "%s: checkpoint format version %" PRId64 ", this aldit reads version %d\n", path, version,
            CHECKPOINT_FORMAT_VERSION);
        return 1;
    }
    if (read_attr_i64(file, "complete", &complete) != 0 || complete != 1) {
        say(errors, "%s: incomplete checkpoint (no completion mark)\n", path);
        return 1;
    }
    return 0;
}

/* 1 when `path` is a complete checkpoint of this format for `step` (HDF5's error printing off around it),
   else 0 with the reason on `warnings` (may be NULL). */
static int checkpoint_readable(const char *path, int64_t step, FILE *warnings)
{
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        say(warnings, "aldit: warning: ignoring unreadable checkpoint %s (not HDF5, or truncated)\n", path);
        return 0;
    }
    int64_t recorded = -1;
    const int readable =
        check_header(file, path, warnings) == 0 && read_attr_i64(file, "step", &recorded) == 0 && recorded == step;
    if (!readable) say(warnings, "aldit: warning: ignoring checkpoint %s (bad header or step)\n", path);
    H5Fclose(file);
    return readable;
}

int checkpoint_find_latest(const deck *config, char *path, size_t path_size, FILE *warnings)
{
    char dir[2 * DECK_PATH_MAX];
    checkpoint_dir(config, dir, sizeof dir);
    int n_steps = 0, found = 0;
    int64_t *steps = list_steps(dir, &n_steps, 0, warnings);
    qsort(steps, (size_t)n_steps, sizeof *steps, compare_steps);
    h5_auto_print quiet = h5_quiet_begin();
    for (int i = n_steps - 1; i >= 0 && !found; i--) {
        char candidate[2 * DECK_PATH_MAX];
        checkpoint_path(config, steps[i], candidate, sizeof candidate);
        if (checkpoint_readable(candidate, steps[i], warnings)) {
            snprintf(path, path_size, "%s", candidate);
            found = 1;
        }
    }
    h5_quiet_end(quiet);
    free(steps);
    /* starting afresh would overwrite the run's metrics and, through keep, delete its checkpoints */
    if (n_steps > 0 && !found) {
        fprintf(warnings, "aldit: error: none of the %d checkpoint(s) in %s can be read (see above); move them away, "
                "or set [checkpoint] resume = off to start afresh\n", n_steps, dir);
        return -1;
    }
    return found;
}

/* Read dataset `name` of `loc` into `values` after checking it is a float array of the parameter's shape. */
/* One parameter's dataset: its name, float type and shape checked, then read into `values` (NULL: checked only). */
static int read_param(hid_t loc, const char *where, const char *path, const param_info *param, float *values,
                      FILE *errors)
{
    if (H5Lexists(loc, param->name, H5P_DEFAULT) <= 0) {
        fprintf(errors, "%s: missing dataset %s%s (parameter %s)\n", path, where, param->name, param->name);
        return 1;
    }
    hid_t set = H5Dopen2(loc, param->name, H5P_DEFAULT);
    if (set < 0) {
        fprintf(errors, "%s: %s%s is not a dataset\n", path, where, param->name);
        return 1;
    }
    hid_t space = H5Dget_space(set), type = H5Dget_type(set);
    hsize_t dims[H5S_MAX_RANK];
    int ndim = H5Sget_simple_extent_dims(space, dims, NULL), status = 0;
    int same_shape = ndim == param->ndim;
    for (int d = 0; d < ndim && same_shape; d++) same_shape = dims[d] == (hsize_t)param->shape[d];
    if (H5Tget_class(type) != H5T_FLOAT) {
        fprintf(errors, "%s: dataset %s%s is not floating point (convert it to float32)\n", path, where, param->name);
        status = 1;
    } else if (!same_shape) {
        char found[128] = "", expected[128] = "";
        for (int d = 0; d < ndim && d < H5S_MAX_RANK; d++)
            snprintf(found + strlen(found), sizeof found - strlen(found), "%s%llu", d ? ", " : "",
                     (unsigned long long)dims[d]);
        for (int d = 0; d < param->ndim; d++)
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%lld", d ? ", " : "",
                     (long long)param->shape[d]);
        fprintf(errors, "%s: parameter %s has shape [%s] in the file, the model expects [%s]\n", path, param->name,
                found, expected);
        status = 1;
    } else if (values && H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
        fprintf(errors, "%s: reading dataset %s%s failed\n", path, where, param->name);
        status = 1;
    }
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(set);
    return status;
}

static int read_params(hid_t loc, const char *where, const char *path, const model *m, float *values, FILE *errors)
{
    for (int p = 0; p < m->n_params; p++)
        if (read_param(loc, where, path, &m->params[p], values ? values + m->params[p].offset : NULL, errors) != 0)
            return 1;
    return 0;
}

static int check_model_dims(hid_t file, const char *path, const deck *config, FILE *errors)
{
    if (H5Lexists(file, "model", H5P_DEFAULT) <= 0) {
        fprintf(errors, "%s: no /model group with the model dims\n", path);
        return 1;
    }
    hid_t group = H5Gopen2(file, "model", H5P_DEFAULT);
    model_dim dims[MAX_MODEL_DIMS];
    int n_dims = model_dims(config, dims), status = 0;
    for (int i = 0; i < n_dims && status == 0; i++) {
        int64_t recorded = 0;
        if (read_attr_i64(group, dims[i].key, &recorded) != 0) {
            fprintf(errors, "%s: /model has no attribute %s\n", path, dims[i].key);
            status = 1;
        } else if (recorded != dims[i].value) {
            fprintf(errors, "%s: checkpoint of another model: model.%s is %" PRId64 " in the checkpoint, %d in the deck\n",
                    path, dims[i].key, recorded, dims[i].value);
            status = 1;
        }
    }
    H5Gclose(group);
    return status;
}

/* A whole 1-D dataset under /run (name "run/...") as `memory_type` values, allocated (at least one element). */
static int read_vector(hid_t file, const char *name, hid_t memory_type, size_t value_bytes, void **values,
                       size_t *n_values, const char *path, FILE *errors)
{
    *values = NULL;
    *n_values = 0;
    if (H5Lexists(file, "run", H5P_DEFAULT) <= 0 || H5Lexists(file, name, H5P_DEFAULT) <= 0) {
        fprintf(errors, "%s: missing dataset /%s\n", path, name);
        return 1;
    }
    hid_t set = H5Dopen2(file, name, H5P_DEFAULT);
    hid_t space = set >= 0 ? H5Dget_space(set) : -1;
    hssize_t n_points = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    if (n_points < 0) {
        fprintf(errors, "%s: /%s is not a readable dataset\n", path, name);
        if (space >= 0) H5Sclose(space);
        if (set >= 0) H5Dclose(set);
        return 1;
    }
    int status = 0;
    *n_values = (size_t)n_points;
    *values = xmalloc(*n_values > 0 ? *n_values * value_bytes : 1);
    if (*n_values > 0 && H5Dread(set, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *values) < 0) {
        fprintf(errors, "%s: reading %s failed\n", path, name);
        status = 1;
    }
    if (H5Sclose(space) < 0 || H5Dclose(set) < 0) status = 1;
    return status;
}

int checkpoint_load(const char *path, const deck *config, model *m, checkpoint_state *state, FILE *errors)
{
    h5_auto_print quiet = h5_quiet_begin();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) {
        h5_quiet_end(quiet);
        fprintf(errors, "%s: cannot open as HDF5\n", path);
        return 1;
    }
    int status = check_header(file, path, errors);
    if (status == 0) status = check_model_dims(file, path, config, errors);
    if (status == 0 && (read_attr_i64(file, "step", &state->step) != 0 || read_attr_i64(file, "epoch", &state->epoch) != 0
                        || read_attr_u64(file, "seed", &state->seed) != 0)) {
        fprintf(errors, "%s: missing attribute step, epoch or seed\n", path);
        status = 1;
    }
    if (status == 0 && read_attr_i64(file, "steps_per_epoch", &state->steps_per_epoch) != 0)
        state->steps_per_epoch = 0; /* optional: written since the LR schedule is kept across resumes */
    if (status == 0) status = read_params(file, "/", path, m, m->weights, errors);
    if (status == 0) {
        hid_t first = H5Lexists(file, "optim", H5P_DEFAULT) > 0 && H5Lexists(file, "optim/m", H5P_DEFAULT) > 0
                          ? H5Gopen2(file, "optim/m", H5P_DEFAULT) : -1;
        hid_t second = first >= 0 && H5Lexists(file, "optim/v", H5P_DEFAULT) > 0 ? H5Gopen2(file, "optim/v", H5P_DEFAULT) : -1;
        if (first < 0 || second < 0) {
            fprintf(errors, "%s: missing optimizer moments /optim/m or /optim/v\n", path);
            status = 1;
        }
        if (status == 0) status = read_params(first, "/optim/m/", path, m, state->adam_m, errors);
        if (status == 0) status = read_params(second, "/optim/v/", path, m, state->adam_v, errors);
        if (first >= 0) H5Gclose(first);
        if (second >= 0) H5Gclose(second);
    }
    void *blob = NULL, *seconds = NULL;
    size_t n_ranks = 0;
    if (status == 0) status = read_vector(file, "run/balancer_state", H5T_NATIVE_UCHAR, 1, &blob, &state->balancer_bytes,
                                          path, errors);
    if (status == 0) status = read_vector(file, "run/last_step_rank_seconds", H5T_NATIVE_DOUBLE, sizeof(double), &seconds,
                                          &n_ranks, path, errors);
    state->balancer_state = blob;
    state->rank_seconds = seconds;
    state->n_ranks = (int)n_ranks;
    H5Fclose(file);
    h5_quiet_end(quiet);
    return status;
}

/* [model] init's parameters into `weights`, or only checked when it is NULL. */
static int init_weights(const char *path, const model *m, float *weights, FILE *errors)
{
    h5_auto_print quiet = h5_quiet_begin();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int status = 1;
    if (file < 0 && access(path, R_OK) != 0) fprintf(errors, "%s: cannot open ([model] init): %s\n", path, strerror(errno));
    else if (file < 0) fprintf(errors, "%s: cannot open as HDF5 ([model] init)\n", path);
    else {
        status = read_params(file, "/", path, m, weights, errors);
        H5Fclose(file);
    }
    h5_quiet_end(quiet);
    return status;
}

int checkpoint_load_weights(const char *path, model *m, FILE *errors)
{
    return init_weights(path, m, m->weights, errors);
}

int checkpoint_check_weights(const char *path, const model *m, FILE *errors)
{
    return init_weights(path, m, NULL, errors);
}
