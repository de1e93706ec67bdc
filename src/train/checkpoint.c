/* checkpoint.c — HDF5 checkpoints written and read tensor by tensor (checksummed, atomic, keep-K), [model] init from HDF5 or safetensors, and the whole-model functions on top. */
#define _GNU_SOURCE /* memfd_create: see discard() */
#include "train/checkpoint.h"
#include "core/check.h"
#include "io/h5util.h"
#include "io/safetensors.h"
#include "model/wan_names.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define CHECKPOINT_SUBDIR "checkpoints"
#define CHECKPOINT_PATH_MAX (2 * DECK_PATH_MAX)
/* Tensors are stored in chunks of at most this many bytes, each with its own Fletcher-32 checksum. */
#define CHUNK_TARGET_BYTES ((hsize_t)4 << 20)
/* HDF5 metadata counted per dataset by the free-space check (object header and chunk index). */
#define METADATA_BYTES_PER_DATASET 4096.0

/* Where each group's datasets live: HDF5 path of the group, and the prefix that names a tensor in messages. */
static const char *const group_location[CHECKPOINT_N_GROUPS] = {".", "optim/m", "optim/v", "ema"};
static const char *const group_prefix[CHECKPOINT_N_GROUPS] = {"/", "/optim/m/", "/optim/v/", "/ema/"};

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

/* Dims recorded since the model families (absent from older checkpoints, which are Wan's: those resume
   unchecked); one that is present must equal the deck's. family: 0 wan, 1 hunyuanvideo15. */
static int family_dims(const deck *config, model_dim *dims)
{
    const model_dim all[] = {
        {"family", (int)config->model.family}, {"text_2_dim", config->model.text_2_dim},
        {"image_dim", config->model.image_dim}, {"rope_axes_t", config->model.rope_axes_t},
    };
    memcpy(dims, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

static void checkpoint_dir(const deck *config, char *dir, size_t dir_size)
{
    snprintf(dir, dir_size, "%s/%s", config->run.dir, CHECKPOINT_SUBDIR);
}

void checkpoint_path(const deck *config, int64_t step, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s/%s/step_%08" PRId64 ".h5", config->run.dir, CHECKPOINT_SUBDIR, step);
}

/* fprintf to `out`, or nothing when it is NULL (a check asked for its answer only). */
static void say(FILE *out, const char *format, ...)
{
    if (!out) return;
    va_list args;
    va_start(args, format);
    vfprintf(out, format, args);
    va_end(args);
}

/* ---- why an HDF5 call failed -------------------------------------------------------------------- */

/* What HDF5's error stack says about the last failure: it must be read right after the failing call,
   before another API call clears the stack. */
typedef struct {
    int noted;          /* a failure has been recorded (the first one wins) */
    int checksum;       /* a filter found a checksum mismatch: the stored data is damaged */
    int error_number;   /* errno reported by the file driver (disk full, quota, I/O error), 0 = none */
    char innermost[192];/* the innermost error's description, as a fallback */
} h5_failure;

static herr_t note_error(unsigned n, const H5E_error2_t *error, void *data)
{
    h5_failure *why = data;
    const char *desc = error->desc ? error->desc : "";
    if (n == 0) {
        snprintf(why->innermost, sizeof why->innermost, "%s", desc);
        for (char *c = why->innermost; *c; c++)
            if (*c == '\n') *c = ' ';
    }
    if (strstr(desc, "checksum")) why->checksum = 1;
    const char *number = strstr(desc, "errno = ");
    if (number && why->error_number == 0) why->error_number = atoi(number + strlen("errno = "));
    return 0;
}

/* Records the current error stack in *why unless a failure is recorded already; returns -1. */
static int noted(h5_failure *why)
{
    if (why->noted) return -1;
    memset(why, 0, sizeof *why);
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, note_error, why);
    why->noted = 1;
    return -1;
}

static const char *failure_text(const h5_failure *why)
{
    if (why->checksum) return "Fletcher-32 checksum mismatch (damaged data)";
    if (why->error_number > 0) return strerror(why->error_number);
    return why->innermost[0] ? why->innermost : "HDF5 error";
}

/* ---- writing ------------------------------------------------------------------------------------- */

/* A scalar attribute `name` on loc, stored as file_type, from *value in memory_type. */
static int write_attr(hid_t loc, const char *name, hid_t file_type, hid_t memory_type, const void *value,
                      h5_failure *why)
{
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = space < 0 ? -1 : H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    int status = attr < 0 || H5Awrite(attr, memory_type, value) < 0 ? noted(why) : 0;
    if (attr >= 0 && H5Aclose(attr) < 0) status = noted(why);
    if (space >= 0) H5Sclose(space);
    return status;
}

static int write_attr_i64(hid_t loc, const char *name, int64_t value, h5_failure *why)
{
    return write_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, why);
}

static int write_attr_string(hid_t loc, const char *name, const char *text, h5_failure *why)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    if (type < 0 || H5Tset_size(type, strlen(text) + 1) < 0 || H5Tset_strpad(type, H5T_STR_NULLTERM) < 0) {
        if (type >= 0) H5Tclose(type);
        return noted(why);
    }
    int status = write_attr(loc, name, type, type, text, why);
    H5Tclose(type);
    return status;
}

/* Chunk dims for a dataset of `dims`: whole trailing dims and an even split of the leading rows into as
   few chunks as keep each within CHUNK_TARGET_BYTES (HDF5 stores an edge chunk at full size, so an even
   split wastes at most a row per chunk). */
static void chunk_dims(int ndim, const hsize_t *dims, size_t value_bytes, hsize_t *chunk)
{
    for (int d = 0; d < ndim; d++) chunk[d] = dims[d];
    for (int d = 0; d < ndim; d++) {
        hsize_t inner = value_bytes;
        for (int e = d + 1; e < ndim; e++) inner *= dims[e];
        hsize_t fit = CHUNK_TARGET_BYTES / inner; /* rows of dim d a chunk may hold */
        if (fit >= dims[d]) return;
        if (fit > 0) {
            hsize_t n_chunks = (dims[d] + fit - 1) / fit;
            chunk[d] = (dims[d] + n_chunks - 1) / n_chunks;
            return;
        }
        chunk[d] = 1; /* one row of dim d is too big still: split the next dim */
    }
}

/* Dataset `name` of loc with the given shape, written from `values`: chunked with Fletcher-32 checksums
   (contiguous when it has no values: a chunk cannot be empty). */
static int write_dataset(hid_t loc, const char *name, hid_t file_type, hid_t memory_type, int ndim,
                         const hsize_t *dims, const void *values, h5_failure *why)
{
    hsize_t n_values = 1, chunk[H5S_MAX_RANK];
    for (int d = 0; d < ndim; d++) n_values *= dims[d];
    hid_t space = H5Screate_simple(ndim, dims, NULL), create = H5Pcreate(H5P_DATASET_CREATE);
    int status = space < 0 || create < 0 ? noted(why) : 0;
    if (status == 0 && n_values > 0) {
        chunk_dims(ndim, dims, H5Tget_size(file_type), chunk);
        if (H5Pset_chunk(create, ndim, chunk) < 0 || H5Pset_fletcher32(create) < 0) status = noted(why);
    }
    hid_t set = status == 0 ? H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, create, H5P_DEFAULT) : -1;
    if (status == 0 && set < 0) status = noted(why);
    if (status == 0 && n_values > 0 && H5Dwrite(set, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0)
        status = noted(why);
    if (set >= 0 && H5Dclose(set) < 0) status = noted(why);
    if (create >= 0) H5Pclose(create);
    if (space >= 0) H5Sclose(space);
    return status;
}

static int write_model_group(hid_t file, const deck *config, h5_failure *why)
{
    hid_t group = H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (group < 0) return noted(why);
    model_dim dims[MAX_MODEL_DIMS];
    int n_dims = model_dims(config, dims), status = 0;
    for (int i = 0; i < n_dims && status == 0; i++) status = write_attr_i64(group, dims[i].key, dims[i].value, why);
    n_dims = family_dims(config, dims);
    for (int i = 0; i < n_dims && status == 0; i++) status = write_attr_i64(group, dims[i].key, dims[i].value, why);
    if (status == 0) status = write_attr(group, "eps", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &config->model.eps, why);
    if (status == 0) status = write_attr_string(group, "name", config->model.name, why);
    if (status == 0)
        status = write_attr_string(group, "text_padding", deck_text_padding_name(config->model.text_padding), why);
    if (H5Gclose(group) < 0) status = noted(why);
    return status;
}

static int write_deck_text(hid_t file, const deck *config, h5_failure *why)
{
    char *text = NULL;
    size_t text_bytes = 0;
    FILE *memory = open_memstream(&text, &text_bytes);
    ALDIT_CHECK(memory, "open_memstream: %s", strerror(errno));
    deck_print(config, memory);
    fclose(memory);
    int status = write_attr_string(file, "deck", text, why);
    free(text);
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

static int checkpoint_readable(const char *path, int64_t step, FILE *warnings); /* in the reading part */

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


struct checkpoint_writer {
    const deck *config;
    const model *table;
    FILE *errors;
    char dir[CHECKPOINT_PATH_MAX], path[CHECKPOINT_PATH_MAX], tmp_path[CHECKPOINT_PATH_MAX + 8];
    int64_t step;
    unsigned groups;
    hid_t file, group[CHECKPOINT_N_GROUPS], optim; /* group[CHECKPOINT_WEIGHTS] is the file itself */
    int fd;                 /* the file's descriptor under HDF5's sec2 driver (-1: unknown) */
    int failed, state_written;
    unsigned char *written; /* [group * n_params + parameter]: 1 once written */
};

/* Refuses a checkpoint the disk has no room for, before HDF5 starts. Counts the tensors of the groups,
   the run state and HDF5's metadata per dataset; a quota is not seen here. */
static int check_free_space(const char *dir, const model *table, int n_groups, size_t state_bytes, FILE *errors)
{
    double needed = n_groups * sizeof(float) * (double)table->n_weights + (double)state_bytes +
                    METADATA_BYTES_PER_DATASET * (n_groups * table->n_params + 16);
    struct statvfs filesystem;
    if (statvfs(dir, &filesystem) != 0) return 0; /* cannot tell: let the write report any failure */
    double available = (double)filesystem.f_bavail * (double)filesystem.f_frsize;
    if (available >= needed) return 0;
    fprintf(errors, "%s: not enough free space for the checkpoint (%.1f MiB needed, %.1f MiB free)\n", dir,
            needed / 1048576.0, available / 1048576.0);
    return 1;
}

static int make_folder(const char *dir, const char *what, FILE *errors)
{
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return 0;
    fprintf(errors, "%s: cannot create the %s: %s\n", dir, what, strerror(errno));
    return 1;
}

/* Closes the file without leaving HDF5 in a state that crashes it at exit, and removes it. A write that
   failed (disk full, quota, file-size limit) leaves dirty metadata and chunks that HDF5 flushes on close;
   if that flush failed too, HDF5 (1.10) would keep the file open for good and crash in H5close at exit.
   So the file is first truncated to nothing (its space comes back at once) and the descriptor under
   HDF5 is then pointed at an in-memory file (memfd): the close's flush lands there and succeeds, and
   only the few metadata pages it writes take memory. A soft file-size limit (ulimit -f) would refuse
   those writes as well, so it is raised to the hard limit for the close. Without memfd the truncation
   alone usually gives the flush room on a full disk. */
static void discard(checkpoint_writer *w)
{
    h5_auto_print quiet = h5_quiet_begin();
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++)
        if (g != CHECKPOINT_WEIGHTS && w->group[g] >= 0) H5Gclose(w->group[g]);
    if (w->optim >= 0) H5Gclose(w->optim);
    int sunk = 0;
    if (w->fd >= 0) {
        if (ftruncate(w->fd, 0) != 0) { /* nothing better to do: the close below may fail */ }
        int sink = memfd_create("aldit-discarded-checkpoint", 0);
        sunk = sink >= 0 && dup2(sink, w->fd) >= 0;
        if (sink >= 0) close(sink);
    }
    struct rlimit file_size, raised;
    int limit_raised = sunk && getrlimit(RLIMIT_FSIZE, &file_size) == 0 && file_size.rlim_cur != file_size.rlim_max;
    if (limit_raised) {
        raised = (struct rlimit){.rlim_cur = file_size.rlim_max, .rlim_max = file_size.rlim_max};
        limit_raised = setrlimit(RLIMIT_FSIZE, &raised) == 0;
    }
    if (w->file >= 0) H5Fclose(w->file);
    if (limit_raised) setrlimit(RLIMIT_FSIZE, &file_size);
    h5_quiet_end(quiet);
    unlink(w->tmp_path);
    free(w->written);
    free(w);
}

/* Records the writer's first failure ("TMP: what failed: reason"); returns 1. */
static int writer_failed(checkpoint_writer *w, const char *what, const char *name, const h5_failure *why)
{
    if (!w->failed) fprintf(w->errors, "%s: %s%s failed: %s\n", w->tmp_path, what, name, failure_text(why));
    w->failed = 1;
    return 1;
}

/* A misuse of the writer (unknown name, group not announced, twice written): fails the writer; returns 1. */
__attribute__((format(printf, 2, 3))) static int writer_refuses(checkpoint_writer *w, const char *format, ...)
{
    if (!w->failed) {
        va_list args;
        va_start(args, format);
        fprintf(w->errors, "%s: ", w->tmp_path);
        vfprintf(w->errors, format, args);
        fputc('\n', w->errors);
        va_end(args);
    }
    w->failed = 1;
    return 1;
}

static int popcount_groups(unsigned groups)
{
    int n = 0;
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) n += (groups >> g) & 1u;
    return n;
}

static int create_groups(checkpoint_writer *w, h5_failure *why)
{
    w->group[CHECKPOINT_WEIGHTS] = w->file;
    const unsigned moments = CHECKPOINT_GROUP_BIT(CHECKPOINT_ADAM_M) | CHECKPOINT_GROUP_BIT(CHECKPOINT_ADAM_V);
    if ((w->groups & moments) && (w->optim = H5Gcreate2(w->file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0)
        return noted(why);
    for (int g = CHECKPOINT_WEIGHTS + 1; g < CHECKPOINT_N_GROUPS; g++) {
        if (!(w->groups & CHECKPOINT_GROUP_BIT(g))) continue;
        hid_t parent = g == CHECKPOINT_EMA ? w->file : w->optim;
        const char *name = strrchr(group_location[g], '/') ? strrchr(group_location[g], '/') + 1 : group_location[g];
        if ((w->group[g] = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) return noted(why);
    }
    return 0;
}

/* The root attributes known at open, /model, and the tensor groups. */
static int write_header(checkpoint_writer *w, h5_failure *why)
{
    int status = write_attr_string(w->file, "format", "aldit checkpoint", why);
    if (status == 0) status = write_attr_i64(w->file, "aldit_checkpoint_version", CHECKPOINT_FORMAT_VERSION, why);
    if (status == 0) status = write_attr_string(w->file, "rng", "counter-based: noise and sigma of a sample are "
                                                "keyed by (seed, epoch, sample id); no stream state", why);
    if (status == 0) status = write_model_group(w->file, w->config, why);
    if (status == 0) status = write_deck_text(w->file, w->config, why);
    if (status == 0) status = create_groups(w, why);
    return status;
}

checkpoint_writer *checkpoint_writer_open(const deck *config, const model *table, int64_t step, unsigned groups,
                                          size_t state_bytes, FILE *errors)
{
    char dir[CHECKPOINT_PATH_MAX];
    checkpoint_dir(config, dir, sizeof dir);
    groups &= (1u << CHECKPOINT_N_GROUPS) - 1;
    if (make_folder(config->run.dir, "run folder", errors) != 0 || make_folder(dir, "checkpoint folder", errors) != 0)
        return NULL;
    if (check_free_space(dir, table, popcount_groups(groups), state_bytes, errors) != 0) return NULL;
    checkpoint_writer *w = xcalloc(1, sizeof *w);
    *w = (checkpoint_writer){.config = config, .table = table, .errors = errors, .step = step, .groups = groups,
                             .file = -1, .optim = -1, .fd = -1};
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) w->group[g] = -1;
    w->written = xcalloc((size_t)CHECKPOINT_N_GROUPS * (size_t)(table->n_params > 0 ? table->n_params : 1), 1);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    checkpoint_path(config, step, w->path, sizeof w->path);
    snprintf(w->tmp_path, sizeof w->tmp_path, "%s.tmp", w->path);

    h5_failure why = {0};
    h5_auto_print quiet = h5_quiet_begin();
    hid_t access_list = H5Pcreate(H5P_FILE_ACCESS);
    if (access_list >= 0) H5Pset_fclose_degree(access_list, H5F_CLOSE_STRONG); /* close closes everything */
    w->file = H5Fcreate(w->tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, access_list >= 0 ? access_list : H5P_DEFAULT);
    if (w->file < 0) noted(&why);
    if (access_list >= 0) H5Pclose(access_list);
    void *handle = NULL;
    if (w->file >= 0 && H5Fget_vfd_handle(w->file, H5P_DEFAULT, &handle) >= 0 && handle) w->fd = *(int *)handle;
    int status = w->file < 0 ? -1 : write_header(w, &why);
    h5_quiet_end(quiet);
    if (status != 0) {
        fprintf(errors, "%s: cannot create the checkpoint: %s\n", w->tmp_path, failure_text(&why));
        if (w->file < 0) { /* nothing of ours exists: a stale file or folder of that name stays */
            free(w->written);
            free(w);
        } else discard(w);
        return NULL;
    }
    return w;
}

int checkpoint_write_tensor(checkpoint_writer *w, checkpoint_group group, const char *name, const float *values)
{
    if (w->failed) return 1;
    if ((int)group < 0 || group >= CHECKPOINT_N_GROUPS || !(w->groups & CHECKPOINT_GROUP_BIT(group)))
        return writer_refuses(w, "tensor %s%s: its group was not announced when the writer was opened",
                              (int)group >= 0 && group < CHECKPOINT_N_GROUPS ? group_prefix[group] : "?", name);
    const param_info *param = model_find_param(w->table, name);
    if (!param) return writer_refuses(w, "tensor %s%s: the model has no such parameter", group_prefix[group], name);
    unsigned char *written = &w->written[(size_t)group * (size_t)w->table->n_params + (size_t)(param - w->table->params)];
    if (*written) return writer_refuses(w, "tensor %s%s written twice", group_prefix[group], name);
    hsize_t dims[MODEL_MAX_NDIM];
    for (int d = 0; d < param->ndim; d++) dims[d] = (hsize_t)param->shape[d];
    h5_failure why = {0};
    h5_auto_print quiet = h5_quiet_begin();
    int status = write_dataset(w->group[group], name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, param->ndim, dims, values, &why);
    h5_quiet_end(quiet);
    if (status != 0) {
        char what[160];
        snprintf(what, sizeof what, "writing tensor %s", group_prefix[group]);
        return writer_failed(w, what, name, &why);
    }
    *written = 1;
    return 0;
}

int checkpoint_write_state(checkpoint_writer *w, const checkpoint_state *state)
{
    if (w->failed) return 1;
    if (w->state_written) return writer_refuses(w, "the run state written twice");
    if (state->step != w->step)
        return writer_refuses(w, "the run state is of step %" PRId64 ", the writer was opened for step %" PRId64,
                              state->step, w->step);
    h5_failure why = {0};
    h5_auto_print quiet = h5_quiet_begin();
    int status = write_attr_i64(w->file, "step", state->step, &why);
    if (status == 0) status = write_attr_i64(w->file, "epoch", state->epoch, &why);
    if (status == 0) status = write_attr_i64(w->file, "steps_per_epoch", state->steps_per_epoch, &why);
    if (status == 0) status = write_attr(w->file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &state->seed, &why);
    /* run bookkeeping sits in /run, so the root's datasets are exactly the parameters */
    hid_t run = status == 0 ? H5Gcreate2(w->file, "run", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (status == 0 && run < 0) status = noted(&why);
    hsize_t blob_bytes = state->balancer_bytes, n_ranks = (hsize_t)(state->n_ranks > 0 ? state->n_ranks : 0);
    if (status == 0) status = write_dataset(run, "balancer_state", H5T_STD_U8LE, H5T_NATIVE_UCHAR, 1, &blob_bytes,
                                            state->balancer_state, &why);
    if (status == 0) status = write_dataset(run, "last_step_rank_seconds", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1,
                                            &n_ranks, state->rank_seconds, &why);
    hsize_t fp8_bytes = state->fp8_bytes;
    if (status == 0 && fp8_bytes > 0)
        status = write_dataset(run, "fp8_scaling", H5T_STD_U8LE, H5T_NATIVE_UCHAR, 1, &fp8_bytes, state->fp8_state, &why);
    if (run >= 0 && H5Gclose(run) < 0 && status == 0) status = noted(&why);
    h5_quiet_end(quiet);
    if (status != 0) return writer_failed(w, "writing the run state", "", &why);
    w->state_written = 1;
    return 0;
}

/* The first announced tensor not written, as "/optim/m/NAME" in `name`; 0 when all are there. */
static int first_missing(const checkpoint_writer *w, char *name, size_t name_size)
{
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) {
        if (!(w->groups & CHECKPOINT_GROUP_BIT(g))) continue;
        for (int p = 0; p < w->table->n_params; p++)
            if (!w->written[(size_t)g * (size_t)w->table->n_params + (size_t)p]) {
                snprintf(name, name_size, "%s%s", group_prefix[g], w->table->params[p].name);
                return 1;
            }
    }
    return 0;
}

/* Space for everything the final flush writes, reserved before it: a flush that fails leaves HDF5's
   metadata cache unable to flush again (1.10.8: "slist already enabled"), so not even discard could
   close the file any more. The flush writes metadata at addresses below the end of allocated space
   (EOA); blocks for all of [0, EOA) plus a margin make it unable to fail for want of space or quota.
   A file system without fallocate(2) gets no reservation (the flush is then tried unprotected). */
#define FLUSH_MARGIN_BYTES ((off_t)64 << 10)
static int reserve_for_flush(checkpoint_writer *w, h5_failure *why)
{
    haddr_t end = 0;
    if (w->fd < 0 || H5Fget_eoa(w->file, &end) < 0) return 0;
    if (fallocate(w->fd, 0, 0, (off_t)end + FLUSH_MARGIN_BYTES) == 0 || errno == EOPNOTSUPP || errno == ENOSYS)
        return 0;
    *why = (h5_failure){.noted = 1, .error_number = errno};
    return -1;
}

/* Completion mark, group handles closed, space reserved, everything flushed: once this succeeds the close
   has nothing left to write. */
static int finish_file(checkpoint_writer *w, h5_failure *why)
{
    h5_auto_print quiet = h5_quiet_begin();
    int status = write_attr_i64(w->file, "complete", 1, why); /* written last: a file that has it was written to the end */
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) {
        if (g != CHECKPOINT_WEIGHTS && w->group[g] >= 0 && H5Gclose(w->group[g]) < 0 && status == 0) status = noted(why);
        if (g != CHECKPOINT_WEIGHTS) w->group[g] = -1;
    }
    if (w->optim >= 0 && H5Gclose(w->optim) < 0 && status == 0) status = noted(why);
    w->optim = -1;
    if (status == 0) status = reserve_for_flush(w, why);
    if (status == 0 && H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0) status = noted(why);
    h5_quiet_end(quiet);
    return status;
}

int checkpoint_writer_commit(checkpoint_writer *w, char *path_out, size_t path_size)
{
    if (!w) return 1;
    char missing[CHECKPOINT_PATH_MAX];
    if (!w->failed && first_missing(w, missing, sizeof missing))
        writer_refuses(w, "not committed: tensor %s was not written", missing);
    if (!w->failed && !w->state_written) writer_refuses(w, "not committed: the run state was not written");
    h5_failure why = {0};
    if (!w->failed && finish_file(w, &why) != 0) writer_failed(w, "finishing the checkpoint", "", &why);
    if (w->failed) {
        discard(w);
        return 1;
    }
    h5_auto_print quiet = h5_quiet_begin();
    int closed = H5Fclose(w->file) >= 0;
    if (!closed) noted(&why);
    h5_quiet_end(quiet);
    w->file = -1;
    int status = 0;
    if (!closed) {
        fprintf(w->errors, "%s: closing the checkpoint failed: %s\n", w->tmp_path, failure_text(&why));
        status = 1;
    } else if (fsync_path(w->tmp_path, O_RDONLY) != 0 || rename(w->tmp_path, w->path) != 0) {
        fprintf(w->errors, "%s: cannot sync or rename the checkpoint into place: %s\n", w->tmp_path, strerror(errno));
        status = 1;
    }
    if (status != 0) {
        if (w->fd >= 0 && ftruncate(w->fd, 0) != 0) { /* the unlink below frees the space anyway once closed */ }
        unlink(w->tmp_path);
    } else {
        fsync_path(w->dir, O_RDONLY | O_DIRECTORY); /* make the rename itself durable */
        prune(w->config, w->dir);
        if (path_out) snprintf(path_out, path_size, "%s", w->path);
    }
    free(w->written);
    free(w);
    return status;
}

void checkpoint_writer_abort(checkpoint_writer *w)
{
    if (w) discard(w);
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

/* A fixed-length string attribute into `text` (NUL-terminated); -1 if missing, unreadable, not such a string or
   not shorter than `size`. */
static int read_attr_string(hid_t loc, const char *name, char *text, size_t size)
{
    if (H5Aexists(loc, name) <= 0) return -1;
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t type = attr < 0 ? -1 : H5Aget_type(attr);
    size_t length = 0;
    if (type >= 0 && H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) == 0) length = H5Tget_size(type);
    int status = length > 0 && length < size && H5Aread(attr, type, text) >= 0 ? 0 : -1;
    if (status == 0) text[length] = '\0';
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    return status;
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

/* Two doubles printed with the fewest significant digits (at least 6) that tell them apart. */
static void format_pair(double a, double b, char *text_a, char *text_b, size_t size)
{
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(text_a, size, "%.*g", digits, a);
        snprintf(text_b, size, "%.*g", digits, b);
        if (strcmp(text_a, text_b) != 0) return;
    }
}

/* family_dims where /model records them. */
static int check_family_dims(hid_t group, const char *path, const deck *config, FILE *errors)
{
    model_dim dims[MAX_MODEL_DIMS];
    const int n_dims = family_dims(config, dims);
    for (int i = 0; i < n_dims; i++) {
        int64_t recorded = 0;
        if (H5Aexists(group, dims[i].key) <= 0) continue;
        if (read_attr_i64(group, dims[i].key, &recorded) != 0) {
            fprintf(errors, "%s: /model attribute %s is unreadable\n", path, dims[i].key);
            return 1;
        }
        if (recorded == dims[i].value) continue;
        fprintf(errors, "%s: checkpoint of another model: model.%s is %" PRId64 " in the checkpoint, %d in the deck%s\n",
                path, dims[i].key, recorded, dims[i].value, i == 0 ? " (0 = wan, 1 = hunyuanvideo15)" : "");
        return 1;
    }
    return 0;
}

/* [model] text_padding as /model records it (absent from checkpoints written before it was: those resume
   unchecked); without this a changed padding was refused later as the balancer's "different store index". */
static int check_text_padding(hid_t group, const char *path, const deck *config, FILE *errors)
{
    if (H5Aexists(group, "text_padding") <= 0) return 0;
    char recorded[32];
    const char *wanted = deck_text_padding_name(config->model.text_padding);
    if (read_attr_string(group, "text_padding", recorded, sizeof recorded) != 0) {
        fprintf(errors, "%s: /model attribute text_padding is unreadable\n", path);
        return 1;
    }
    if (strcmp(recorded, wanted) == 0) return 0;
    fprintf(errors, "%s: checkpoint of another model: model.text_padding is %s in the checkpoint, %s in the deck (set "
            "[model] text_padding = %s to resume it)\n", path, recorded, wanted, recorded);
    return 1;
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
    double eps = 0.0; /* absent from checkpoints written before it was recorded: those resume unchecked */
    if (status == 0 && H5Aexists(group, "eps") > 0) {
        if (read_attr(group, "eps", H5T_NATIVE_DOUBLE, &eps) != 0) {
            fprintf(errors, "%s: /model attribute eps is unreadable\n", path);
            status = 1;
        } else if (eps != config->model.eps) {
            char recorded[32], wanted[32];
            format_pair(eps, config->model.eps, recorded, wanted, sizeof recorded);
            fprintf(errors, "%s: checkpoint of another model: model.eps is %s in the checkpoint, %s in the deck\n",
                    path, recorded, wanted);
            status = 1;
        }
    }
    if (status == 0) status = check_family_dims(group, path, config, errors);
    if (status == 0) status = check_text_padding(group, path, config, errors);
    H5Gclose(group);
    return status;
}

struct checkpoint_reader {
    const model *table;
    FILE *errors;
    char path[CHECKPOINT_PATH_MAX + 8];
    hid_t file, group[CHECKPOINT_N_GROUPS]; /* -1 where the file lacks the group; [WEIGHTS] is the file */
    safetensors *st;                         /* a safetensors [model] init instead (file and groups -1) */
    wan_names names;                         /* the naming of st's tensors */
};

static void close_groups(checkpoint_reader *r)
{
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++)
        if (g != CHECKPOINT_WEIGHTS && r->group[g] >= 0) H5Gclose(r->group[g]);
}

static checkpoint_reader *reader_new(const char *path, const model *table, FILE *errors)
{
    checkpoint_reader *r = xcalloc(1, sizeof *r);
    *r = (checkpoint_reader){.table = table, .errors = errors};
    snprintf(r->path, sizeof r->path, "%s", path);
    r->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    r->group[CHECKPOINT_WEIGHTS] = r->file;
    for (int g = CHECKPOINT_WEIGHTS + 1; g < CHECKPOINT_N_GROUPS; g++) {
        const char *location = group_location[g], *slash = strchr(location, '/');
        char parent[32] = "";
        if (slash) snprintf(parent, sizeof parent, "%.*s", (int)(slash - location), location);
        int present = r->file >= 0 && (!slash || H5Lexists(r->file, parent, H5P_DEFAULT) > 0) &&
                      H5Lexists(r->file, location, H5P_DEFAULT) > 0;
        r->group[g] = present ? H5Gopen2(r->file, location, H5P_DEFAULT) : -1;
    }
    return r;
}

checkpoint_reader *checkpoint_reader_open(const char *path, const deck *config, const model *table, FILE *errors)
{
    h5_auto_print quiet = h5_quiet_begin();
    checkpoint_reader *r = reader_new(path, table, errors);
    int status = 0;
    if (r->file < 0) {
        fprintf(errors, "%s: cannot open as HDF5\n", path);
        status = 1;
    }
    if (status == 0) status = check_header(r->file, path, errors);
    if (status == 0) status = check_model_dims(r->file, path, config, errors);
    h5_quiet_end(quiet);
    if (status != 0) {
        checkpoint_reader_close(r);
        return NULL;
    }
    return r;
}

/* 1 when `path` is an HDF5 file (quietly: 0 for a missing or other file). */
static int is_hdf5(const char *path)
{
    h5_auto_print quiet = h5_quiet_begin();
    htri_t hdf5 = H5Fis_hdf5(path);
    h5_quiet_end(quiet);
    return hdf5 > 0;
}

/* Diffusers' naming when any tensor has a name only diffusers uses, else Wan's. */
static wan_names naming_of(const safetensors *st)
{
    for (int i = 0; i < safetensors_count(st); i++)
        if (wan_name_is_diffusers(safetensors_at(st, i)->name)) return WAN_NAMES_DIFFUSERS;
    return WAN_NAMES_WAN;
}

static checkpoint_reader *open_safetensors(const char *path, const model *table, FILE *errors)
{
    safetensors *st = safetensors_open(path, errors);
    if (!st) {
        fprintf(errors, "%s: cannot read as safetensors ([model] init)\n", path);
        return NULL;
    }
    checkpoint_reader *r = xcalloc(1, sizeof *r);
    *r = (checkpoint_reader){.table = table, .errors = errors, .file = -1, .st = st, .names = naming_of(st)};
    for (int g = 0; g < CHECKPOINT_N_GROUPS; g++) r->group[g] = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    return r;
}

checkpoint_reader *checkpoint_reader_open_init(const char *path, const model *table, FILE *errors)
{
    if (!is_hdf5(path) && safetensors_probe(path)) return open_safetensors(path, table, errors);
    h5_auto_print quiet = h5_quiet_begin();
    checkpoint_reader *r = reader_new(path, table, errors);
    h5_quiet_end(quiet);
    if (r->file >= 0) return r;
    if (access(path, R_OK) != 0) fprintf(errors, "%s: cannot open ([model] init): %s\n", path, strerror(errno));
    else fprintf(errors, "%s: cannot open as HDF5 or safetensors ([model] init)\n", path);
    checkpoint_reader_close(r);
    return NULL;
}

int checkpoint_check_model(const char *path, const deck *config, FILE *errors)
{
    if (!is_hdf5(path) && safetensors_probe(path)) return 0; /* weights only: no recorded model */
    h5_auto_print quiet = h5_quiet_begin();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int status = 0;
    if (file < 0) {
        fprintf(errors, "%s: cannot open as HDF5\n", path);
        status = 1;
    } else if (H5Lexists(file, "model", H5P_DEFAULT) > 0) {
        status = check_model_dims(file, path, config, errors);
    }
    if (file >= 0) H5Fclose(file);
    h5_quiet_end(quiet);
    return status;
}

/* The /model attributes of an open file as deck overrides (keys: those model_dims writes, and eps). */
static int read_model_group(hid_t file, const char *path, char (*overrides)[CHECKPOINT_OVERRIDE_CHARS], FILE *errors)
{
    if (H5Lexists(file, "model", H5P_DEFAULT) <= 0) {
        fprintf(errors, "%s: no /model group with the model dims: give them (--deck FILE or model.KEY=VALUE)\n", path);
        return -1;
    }
    hid_t group = H5Gopen2(file, "model", H5P_DEFAULT);
    deck defaults;
    deck_defaults(&defaults);
    model_dim dims[MAX_MODEL_DIMS];
    int n_dims = model_dims(&defaults, dims), n = 0;
    for (int i = 0; i < n_dims && n >= 0; i++) {
        int64_t recorded = 0;
        if (read_attr_i64(group, dims[i].key, &recorded) == 0) {
            snprintf(overrides[n++], CHECKPOINT_OVERRIDE_CHARS, "model.%s=%" PRId64, dims[i].key, recorded);
        } else {
            fprintf(errors, "%s: /model has no attribute %s\n", path, dims[i].key);
            n = -1;
        }
    }
    double eps = 0.0; /* absent from files written before it was recorded: the deck's stays */
    if (n >= 0 && H5Aexists(group, "eps") > 0 && read_attr(group, "eps", H5T_NATIVE_DOUBLE, &eps) == 0)
        snprintf(overrides[n++], CHECKPOINT_OVERRIDE_CHARS, "model.eps=%.17g", eps);
    H5Gclose(group);
    return n;
}

int checkpoint_model_overrides(const char *path, char (*overrides)[CHECKPOINT_OVERRIDE_CHARS], FILE *errors)
{
    h5_auto_print quiet = h5_quiet_begin();
    hid_t file = is_hdf5(path) ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    int n = -1;
    if (file < 0) fprintf(errors, "%s: not an HDF5 file with the model dims: give them (--deck FILE or model.KEY=VALUE)\n",
                          path);
    else n = read_model_group(file, path, overrides, errors);
    if (file >= 0) H5Fclose(file);
    h5_quiet_end(quiet);
    return n;
}

int checkpoint_reader_has(const checkpoint_reader *r, checkpoint_group group)
{
    if (r->st) return group == CHECKPOINT_WEIGHTS;
    return (int)group >= 0 && group < CHECKPOINT_N_GROUPS && r->group[group] >= 0;
}

void checkpoint_reader_close(checkpoint_reader *r)
{
    if (!r) return;
    safetensors_close(r->st);
    h5_auto_print quiet = h5_quiet_begin();
    close_groups(r);
    if (r->file >= 0) H5Fclose(r->file);
    h5_quiet_end(quiet);
    free(r);
}

static void format_shape(int ndim, const int64_t *shape, char *text, size_t size)
{
    text[0] = '\0';
    for (int d = 0; d < ndim; d++)
        snprintf(text + strlen(text), size - strlen(text), "%s%lld", d ? ", " : "", (long long)shape[d]);
}

/* One parameter's dataset: its float type and shape checked, then read into `values`. */
static int read_param(const checkpoint_reader *r, checkpoint_group group, const param_info *param, float *values)
{
    const char *where = group_prefix[group], *path = r->path;
    hid_t loc = r->group[group];
    FILE *errors = r->errors;
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
    h5_failure why = {0};
    if (H5Tget_class(type) != H5T_FLOAT) {
        fprintf(errors, "%s: dataset %s%s is not floating point (convert it to float32)\n", path, where, param->name);
        status = 1;
    } else if (!same_shape) {
        int64_t found_shape[H5S_MAX_RANK];
        for (int d = 0; d < ndim && d < H5S_MAX_RANK; d++) found_shape[d] = (int64_t)dims[d];
        char found[128], expected[128];
        format_shape(ndim < 0 ? 0 : ndim, found_shape, found, sizeof found);
        format_shape(param->ndim, param->shape, expected, sizeof expected);
        fprintf(errors, "%s: parameter %s has shape [%s] in the file, the model expects [%s]\n", path, param->name,
                found, expected);
        status = 1;
    } else if (H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
        noted(&why);
        if (why.checksum)
            fprintf(errors, "%s: tensor %s%s is damaged: its Fletcher-32 checksum does not match the stored bytes "
                    "(restore the file from a copy, or move it away)\n", path, where, param->name);
        else fprintf(errors, "%s: reading dataset %s%s failed: %s\n", path, where, param->name, failure_text(&why));
        status = 1;
    }
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(set);
    return status;
}

/* The first NaN or Inf of a tensor read, named with its group and index (and `tensor`, the file's name for a
   weight where it differs from the parameter's, else NULL); 0 when all values are finite. */
static int check_finite(const char *path, checkpoint_group group, const param_info *param, const char *tensor,
                        const float *values, FILE *errors)
{
    for (int64_t i = 0; i < param->n_elements; i++) {
        if (isfinite(values[i])) continue;
        int64_t index[MODEL_MAX_NDIM], rest = i;
        for (int d = param->ndim - 1; d >= 0; d--) {
            index[d] = rest % param->shape[d];
            rest /= param->shape[d];
        }
        char where[128];
        format_shape(param->ndim, index, where, sizeof where);
        if (group == CHECKPOINT_WEIGHTS)
            fprintf(errors, "%s: parameter %s%s%s%s has a non-finite value (%g) at [%s] (element %lld)\n", path,
                    param->name, tensor ? " (tensor " : "", tensor ? tensor : "", tensor ? ")" : "", (double)values[i],
                    where, (long long)i);
        else fprintf(errors, "%s: tensor %s%s has a non-finite value (%g) at [%s] (element %lld)\n", path,
                     group_prefix[group], param->name, (double)values[i], where, (long long)i);
        return 1;
    }
    return 0;
}

/* A weight of a safetensors init: found under the file's naming, floating point, of the table's shape, read as
   fp32 and finite; messages name the file holding it (a shard of a set) and the tensor. */
static int read_safetensor(const checkpoint_reader *r, checkpoint_group group, const param_info *param, float *values)
{
    char name[160];
    if (group != CHECKPOINT_WEIGHTS) {
        fprintf(r->errors, "%s: a safetensors file holds weights only (no %s%s)\n", r->path, group_prefix[group],
                param->name);
        return 1;
    }
    if (wan_name_in(r->names, param->name, name, sizeof name)) {
        fprintf(r->errors, "%s: parameter %s has no %s name\n", r->path, param->name, wan_names_label(r->names));
        return 1;
    }
    const safetensors_tensor *t = safetensors_find(r->st, name);
    if (!t) {
        fprintf(r->errors, "%s: missing tensor %s (parameter %s; the file has %s names)\n", r->path, name, param->name,
                wan_names_label(r->names));
        return 1;
    }
    int same_shape = t->ndim == param->ndim;
    for (int d = 0; d < t->ndim && same_shape; d++) same_shape = t->shape[d] == param->shape[d];
    if (!same_shape) {
        char found[128], expected[128];
        format_shape(t->ndim, t->shape, found, sizeof found);
        format_shape(param->ndim, param->shape, expected, sizeof expected);
        fprintf(r->errors, "%s: parameter %s (tensor %s) has shape [%s] in the file, the model expects [%s]\n", t->file,
                param->name, name, found, expected);
        return 1;
    }
    if (safetensors_read_f32(r->st, t, values, r->errors)) return 1;
    return check_finite(t->file, group, param, strcmp(name, param->name) ? name : NULL, values, r->errors);
}

int checkpoint_read_tensor(checkpoint_reader *r, checkpoint_group group, const char *name, float *values)
{
    if ((int)group < 0 || group >= CHECKPOINT_N_GROUPS) {
        fprintf(r->errors, "%s: no tensor group %d\n", r->path, (int)group);
        return 1;
    }
    const param_info *param = model_find_param(r->table, name);
    if (!param) {
        fprintf(r->errors, "%s: %s%s: the model has no such parameter\n", r->path, group_prefix[group], name);
        return 1;
    }
    if (r->st) return read_safetensor(r, group, param, values);
    if (r->group[group] < 0) {
        fprintf(r->errors, "%s: missing group /%s (needed for %s%s)\n", r->path, group_location[group],
                group_prefix[group], name);
        return 1;
    }
    h5_auto_print quiet = h5_quiet_begin();
    int status = read_param(r, group, param, values);
    h5_quiet_end(quiet);
    if (status == 0) status = check_finite(r->path, group, param, NULL, values, r->errors);
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
    h5_failure why = {0};
    if (*n_values > 0 && H5Dread(set, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *values) < 0) {
        noted(&why);
        fprintf(errors, "%s: reading /%s failed: %s\n", path, name, failure_text(&why));
        status = 1;
    }
    if (H5Sclose(space) < 0 || H5Dclose(set) < 0) status = 1;
    return status;
}

int checkpoint_read_state(checkpoint_reader *r, checkpoint_state *state)
{
    state->balancer_state = NULL;
    state->balancer_bytes = 0;
    state->rank_seconds = NULL;
    state->n_ranks = 0;
    state->fp8_state = NULL;
    state->fp8_bytes = 0;
    h5_auto_print quiet = h5_quiet_begin();
    hid_t file = r->file;
    int status = 0;
    if (read_attr_i64(file, "step", &state->step) != 0 || read_attr_i64(file, "epoch", &state->epoch) != 0 ||
        read_attr_u64(file, "seed", &state->seed) != 0) {
        fprintf(r->errors, "%s: missing attribute step, epoch or seed\n", r->path);
        status = 1;
    }
    if (status == 0 && read_attr_i64(file, "steps_per_epoch", &state->steps_per_epoch) != 0)
        state->steps_per_epoch = 0; /* optional: written since the LR schedule is kept across resumes */
    void *blob = NULL, *seconds = NULL;
    size_t n_ranks = 0;
    if (status == 0) status = read_vector(file, "run/balancer_state", H5T_NATIVE_UCHAR, 1, &blob, &state->balancer_bytes,
                                          r->path, r->errors);
    if (status == 0) status = read_vector(file, "run/last_step_rank_seconds", H5T_NATIVE_DOUBLE, sizeof(double),
                                          &seconds, &n_ranks, r->path, r->errors);
    void *fp8 = NULL; /* optional: only a run with [train] precision = fp8 writes it */
    if (status == 0 && H5Lexists(file, "run/fp8_scaling", H5P_DEFAULT) > 0)
        status = read_vector(file, "run/fp8_scaling", H5T_NATIVE_UCHAR, 1, &fp8, &state->fp8_bytes, r->path, r->errors);
    state->fp8_state = fp8;
    h5_quiet_end(quiet);
    state->balancer_state = blob;
    state->rank_seconds = seconds;
    state->n_ranks = (int)n_ranks;
    return status;
}

/* The value of `key` in the resolved deck the file records (its root attribute deck: "key = value" lines), into
   `value`; "" when the file has no deck or no such line. */
static void recorded_deck_value(hid_t file, const char *key, char *value, size_t size)
{
    value[0] = '\0';
    char *text = xmalloc(1 << 20);
    h5_auto_print quiet = h5_quiet_begin();
    int found = read_attr_string(file, "deck", text, 1 << 20) == 0;
    h5_quiet_end(quiet);
    size_t length = strlen(key);
    for (const char *line = found ? text : NULL; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, key, length) != 0 || (line[length] != ' ' && line[length] != '=')) continue;
        const char *at = line + length + strspn(line + length, " =");
        snprintf(value, size, "%.*s", (int)strcspn(at, "\n"), at);
        break;
    }
    free(text);
}

/* An EMA in the file is kept only by a deck that keeps one, or dropped on purpose ([train] ema_drop). */
static int check_ema_kept(const checkpoint_reader *r, const deck *config)
{
    if (!checkpoint_reader_has(r, CHECKPOINT_EMA) || config->train.ema_decay > 0.0 || config->train.ema_drop) return 0;
    char decay[64];
    recorded_deck_value(r->file, "ema_decay", decay, sizeof decay);
    fprintf(r->errors, "aldit: error: %s holds an EMA of the weights (/ema), but [train] ema_decay is off: resuming "
            "would drop it. Set [train] ema_decay = %s (its run's) to keep it, or [train] ema_drop = on to drop it on "
            "purpose\n", r->path, decay[0] ? decay : "the value its run had");
    return 1;
}

int checkpoint_check_resume(checkpoint_reader *r, const deck *config, checkpoint_state *state)
{
    memset(state, 0, sizeof *state);
    if (!checkpoint_reader_has(r, CHECKPOINT_ADAM_M) || !checkpoint_reader_has(r, CHECKPOINT_ADAM_V)) {
        fprintf(r->errors, "%s: missing optimizer moments /optim/m or /optim/v\n", r->path);
        return 1;
    }
    if (checkpoint_read_state(r, state) != 0) return 1;
    if (state->seed != config->run.seed) {
        fprintf(r->errors, "aldit: error: %s was written with [run] seed = %" PRIu64 ", the deck says %" PRIu64
                "; set that seed to resume, or [checkpoint] resume = off\n", r->path, state->seed, config->run.seed);
        return 1;
    }
    return check_ema_kept(r, config);
}

int checkpoint_check_resumable(const char *path, const deck *config, const model *table, FILE *errors)
{
    checkpoint_reader *r = checkpoint_reader_open(path, config, table, errors);
    if (!r) return 1;
    checkpoint_state state;
    int status = checkpoint_check_resume(r, config, &state);
    free(state.balancer_state);
    free(state.fp8_state);
    free(state.rank_seconds);
    int64_t largest = 1;
    for (int p = 0; p < table->n_params; p++)
        if (table->params[p].n_elements > largest) largest = table->params[p].n_elements;
    float *scratch = xmalloc((size_t)largest * sizeof(float));
    const int last = config->train.ema_decay > 0.0 && checkpoint_reader_has(r, CHECKPOINT_EMA) ? CHECKPOINT_EMA
                                                                                                : CHECKPOINT_ADAM_V;
    for (int g = CHECKPOINT_WEIGHTS; g <= last && status == 0; g++)
        for (int p = 0; p < table->n_params && status == 0; p++)
            status = checkpoint_read_tensor(r, (checkpoint_group)g, table->params[p].name, scratch);
    free(scratch);
    checkpoint_reader_close(r);
    return status;
}

/* ---- whole-model functions ------------------------------------------------------------------------ */

int checkpoint_save(const deck *config, const model *m, const checkpoint_state *state,
                    char *path_out, size_t path_size, FILE *errors)
{
    size_t state_bytes = state->balancer_bytes + sizeof(double) * (size_t)(state->n_ranks > 0 ? state->n_ranks : 0);
    checkpoint_writer *w = checkpoint_writer_open(config, m, state->step, CHECKPOINT_TRAINING_GROUPS, state_bytes, errors);
    if (!w) return 1;
    const float *const sources[] = {[CHECKPOINT_WEIGHTS] = m->weights, [CHECKPOINT_ADAM_M] = state->adam_m,
                                    [CHECKPOINT_ADAM_V] = state->adam_v};
    int status = 0;
    for (int g = CHECKPOINT_WEIGHTS; g <= CHECKPOINT_ADAM_V && status == 0; g++)
        for (int p = 0; p < m->n_params && status == 0; p++)
            status = checkpoint_write_tensor(w, (checkpoint_group)g, m->params[p].name, sources[g] + m->params[p].offset);
    if (status == 0) status = checkpoint_write_state(w, state);
    return checkpoint_writer_commit(w, path_out, path_size) != 0 || status != 0; /* commit discards a failed file */
}

int checkpoint_load(const char *path, const deck *config, model *m, checkpoint_state *state, FILE *errors)
{
    state->balancer_state = NULL;
    state->rank_seconds = NULL;
    state->n_ranks = 0;
    checkpoint_reader *r = checkpoint_reader_open(path, config, m, errors);
    if (!r) return 1;
    int status = 0;
    if (!checkpoint_reader_has(r, CHECKPOINT_ADAM_M) || !checkpoint_reader_has(r, CHECKPOINT_ADAM_V)) {
        fprintf(errors, "%s: missing optimizer moments /optim/m or /optim/v\n", path);
        status = 1;
    }
    float *const targets[] = {[CHECKPOINT_WEIGHTS] = m->weights, [CHECKPOINT_ADAM_M] = state->adam_m,
                              [CHECKPOINT_ADAM_V] = state->adam_v};
    for (int g = CHECKPOINT_WEIGHTS; g <= CHECKPOINT_ADAM_V && status == 0; g++)
        for (int p = 0; p < m->n_params && status == 0; p++)
            status = checkpoint_read_tensor(r, (checkpoint_group)g, m->params[p].name, targets[g] + m->params[p].offset);
    if (status == 0) status = checkpoint_read_state(r, state);
    checkpoint_reader_close(r);
    return status;
}

/* [model] init's parameters into `weights`, or, when it is NULL, one by one into a scratch buffer. */
static int init_weights(const char *path, const model *m, float *weights, FILE *errors)
{
    checkpoint_reader *r = checkpoint_reader_open_init(path, m, errors);
    if (!r) return 1;
    int64_t largest = 1;
    for (int p = 0; p < m->n_params; p++)
        if (m->params[p].n_elements > largest) largest = m->params[p].n_elements;
    float *scratch = weights ? NULL : xmalloc((size_t)largest * sizeof(float));
    int status = 0;
    for (int p = 0; p < m->n_params && status == 0; p++)
        status = checkpoint_read_tensor(r, CHECKPOINT_WEIGHTS, m->params[p].name,
                                        weights ? weights + m->params[p].offset : scratch);
    free(scratch);
    checkpoint_reader_close(r);
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
