/* aldit_export.c — the aldit-export tool: a checkpoint's weights or EMA as Wan-official or diffusers safetensors (and config.json) in a folder. */
#include "config.h"
#include "core/check.h"
#include "deck/deck.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/export.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: aldit-export CHECKPOINT --format wan|diffusers --out DIR [--ema] [--dtype fp32|bf16]\n"
    "                    [--shard-size MIB] [--deck FILE] [section.key=value ...]\n"
    "\n"
    "Write the weights of CHECKPOINT (an aldit checkpoint, or anything [model] init reads: HDF5 weights, or\n"
    "safetensors with Wan or diffusers names) into folder DIR as safetensors:\n"
    "  --format wan        Wan 2.1's official names (WanModel, ComfyUI) and Wan's config.json\n"
    "  --format diffusers  diffusers' WanTransformer3DModel names and its config.json, so that\n"
    "                      WanTransformer3DModel.from_pretrained(DIR) loads it\n"
    "  --ema               the checkpoint's EMA (/ema) instead of its weights\n"
    "  --dtype fp32|bf16   stored type (default fp32: the values exactly; bf16 rounds to nearest even)\n"
    "  --shard-size MIB    split into diffusion_pytorch_model-NNNNN-of-NNNNN.safetensors of at most MIB MiB\n"
    "                      of data each (a larger tensor alone in its file), with\n"
    "                      diffusion_pytorch_model.safetensors.index.json (default: one file,\n"
    "                      diffusion_pytorch_model.safetensors; diffusers shards at 5000 MiB)\n"
    "The model's dims are the checkpoint's /model attributes; a file without them (converted weights,\n"
    "safetensors) needs the deck's [model] (--deck FILE and/or model.KEY=VALUE overrides), which is also\n"
    "checked against a checkpoint's /model when given. DIR is created if absent (not its parents); a\n"
    "symbolic link or a file there is refused. Every file is written as NAME.tmp and renamed into place once\n"
    "all are complete; other files in DIR are left alone.\n"
    "  --help, --version\n"
    "\n"
    "exit status: 0 ok; 1 the export failed (a missing, mis-shaped or non-finite tensor, a damaged input,\n"
    "an unwritable DIR: the message names it); 2 a bad command line or deck, or model dims not known.\n";

typedef struct {
    const char *input, *out, *deck;
    export_options export;
    int have_format, n_overrides;
    char **overrides;
} options;

static int usage_error(const char *message, const char *what)
{
    fprintf(stderr, "aldit-export: %s%s\n(aldit-export --help shows the usage)\n", message, what ? what : "");
    return ALDIT_EXIT_USAGE;
}

static int parse_value(int c, const char *value, options *opts)
{
    if (c == 'f' && (strcmp(value, "wan") == 0 || strcmp(value, "diffusers") == 0)) {
        opts->export.names = strcmp(value, "wan") == 0 ? WAN_NAMES_WAN : WAN_NAMES_DIFFUSERS;
        opts->have_format = 1;
    } else if (c == 't' && (strcmp(value, "fp32") == 0 || strcmp(value, "bf16") == 0)) {
        opts->export.dtype = strcmp(value, "fp32") == 0 ? SAFETENSORS_F32 : SAFETENSORS_BF16;
    } else if (c == 's') {
        char *end;
        double mib = strtod(value, &end);
        if (end == value || *end != '\0' || !(mib >= 0.004 && mib <= 1048576.0))
            return usage_error("--shard-size wants MiB in [0.004, 1048576], not ", value);
        opts->export.shard_bytes = (int64_t)(mib * 1048576.0);
    } else {
        return usage_error(c == 'f' ? "--format is wan or diffusers, not " : "--dtype is fp32 or bf16, not ", value);
    }
    return 0;
}

/* 0 and *opts filled; -1 after --help/--version (printed); otherwise the exit status of a usage error. */
static int parse_options(int argc, char **argv, options *opts)
{
    static const struct option long_options[] = {
        {"format", required_argument, NULL, 'f'}, {"out", required_argument, NULL, 'o'},
        {"ema", no_argument, NULL, 'e'},          {"dtype", required_argument, NULL, 't'},
        {"shard-size", required_argument, NULL, 's'}, {"deck", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    memset(opts, 0, sizeof *opts);
    opts->export.dtype = SAFETENSORS_F32;
    opterr = 0;
    int c, status = 0;
    while (status == 0 && (c = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
        switch (c) {
        case 'f': case 't': case 's': status = parse_value(c, optarg, opts); break;
        case 'o': opts->out = optarg; break;
        case 'd': opts->deck = optarg; break;
        case 'e': opts->export.ema = 1; break;
        case 'h': fputs(usage_text, stdout); return -1;
        case 'V': printf("aldit-export %s\n", PACKAGE_VERSION); return -1;
        case ':': return usage_error("missing value of ", argv[optind - 1]);
        default: return usage_error("unknown option ", argv[optind - 1]);
        }
    }
    if (status) return status;
    opts->overrides = xcalloc((size_t)(argc + 1), sizeof *opts->overrides);
    for (int i = optind; i < argc; i++) {
        if (strchr(argv[i], '=')) opts->overrides[opts->n_overrides++] = argv[i];
        else if (!opts->input) opts->input = argv[i];
        else return usage_error("one CHECKPOINT only; not a section.key=value override: ", argv[i]);
    }
    if (!opts->input) return usage_error("the CHECKPOINT to export is required", NULL);
    if (!opts->have_format) return usage_error("--format wan|diffusers is required", NULL);
    if (!opts->out) return usage_error("--out DIR is required", NULL);
    return 0;
}

/* The model to export: a checkpoint's recorded dims (validated as deck values), or the deck's where given (checked
   against the file's). */
static int resolve_model(const options *opts, deck *config)
{
    deck_defaults(config);
    if (opts->deck || opts->n_overrides > 0) {
        if (deck_load(config, opts->deck, opts->n_overrides, opts->overrides, stderr)) return ALDIT_EXIT_USAGE;
        return checkpoint_check_model(opts->input, config, stderr) ? ALDIT_EXIT_USAGE : 0;
    }
    char recorded[CHECKPOINT_MODEL_OVERRIDES][CHECKPOINT_OVERRIDE_CHARS];
    char *overrides[CHECKPOINT_MODEL_OVERRIDES];
    int n = checkpoint_model_overrides(opts->input, recorded, stderr);
    for (int i = 0; i < n; i++) overrides[i] = recorded[i];
    if (n < 0 || deck_load(config, NULL, n, overrides, stderr)) {
        if (n >= 0) fprintf(stderr, "aldit-export: %s records model dims no deck accepts (above)\n", opts->input);
        return ALDIT_EXIT_USAGE;
    }
    return 0;
}

int main(int argc, char **argv)
{
    options opts;
    int status = parse_options(argc, argv, &opts);
    if (status) return status < 0 ? 0 : status;
    deck config;
    if ((status = resolve_model(&opts, &config)) != 0) return status;
    model table;
    model_create_table(&table, &config);
    status = export_safetensors(opts.input, &config, &table, &opts.export, opts.out, stdout, stderr);
    model_free(&table);
    free(opts.overrides);
    return status ? ALDIT_EXIT_ERROR : 0;
}
