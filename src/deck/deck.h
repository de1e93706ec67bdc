/* deck.h — the input deck: every setting of a run, parsed from an INI file by inih, validated, broadcast. */
#ifndef ALDIT_DECK_H
#define ALDIT_DECK_H

#include <stdint.h>
#include <stdio.h>

#define DECK_PATH_MAX 1024
#define DECK_NAME_MAX 32

typedef enum { DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA } deck_device;
typedef enum { STRATEGY_GLOBAL, STRATEGY_DUAL, STRATEGY_EQUAL_TOKENS } deck_strategy;
typedef enum { OVERSIZE_ERROR, OVERSIZE_SKIP } deck_oversize;
typedef enum { RECOMPUTE_NONE, RECOMPUTE_BLOCK } deck_recompute;
/* [model] text_padding: each caption zero-padded to text_len and attended whole (Wan), or as stored. */
typedef enum { TEXT_PADDING_WAN, TEXT_PADDING_TRIM } deck_text_padding;
/* How the flow objective draws u before the shift: uniform on (0, 1), or logit-normal (HunyuanVideo-1.5). */
typedef enum { TIMESTEPS_UNIFORM, TIMESTEPS_LOGIT_NORMAL } deck_timesteps;
/* The model family: its layout table and block code (model/layout.c, model/model.c, model/mmdit.c). */
typedef enum { FAMILY_WAN, FAMILY_HUNYUANVIDEO15 } deck_family;
/* [train] shard: which training state is split across the ranks (auto: the least that fits). */
/* [train] precision: the Wan block's large linears in bf16, or in FP8 (E4M3/E5M2, delayed scaling; CUDA, sm_89+). */
typedef enum { PRECISION_BF16, PRECISION_FP8 } deck_precision;
/* [train] fp8_attention: the Wan self-attention's cuDNN samples in FP8 (precision = fp8 only): off, the forward, or both
   directions. */
typedef enum { FP8_ATTENTION_OFF, FP8_ATTENTION_FORWARD, FP8_ATTENTION_ON } deck_fp8_attention;
typedef enum { SHARD_AUTO, SHARD_NONE, SHARD_OPTIMIZER, SHARD_GRADIENTS, SHARD_FULL } deck_shard;
typedef enum { NONFINITE_ERROR, NONFINITE_SKIP } deck_nonfinite;
typedef enum { LR_COSINE, LR_CONSTANT } deck_lr_schedule;
typedef enum { ATTENTION_AUTO, ATTENTION_CUDNN, ATTENTION_OWN } deck_attention;
typedef enum { ON_CORRUPT_ERROR, ON_CORRUPT_SKIP } deck_on_corrupt;
typedef enum { RESUME_DATA_SAME, RESUME_DATA_CHANGED } deck_resume_data;

/* A list of numbers (e.g. [eval] sigmas): n values in order, at most DECK_LIST_MAX. */
#define DECK_LIST_MAX 32
typedef struct { int n; double values[DECK_LIST_MAX]; } deck_real_list;

/* Plain data only (fixed-size strings, no pointers), so rank 0 can broadcast it as bytes. */
typedef struct {
    struct {
        char dir[DECK_PATH_MAX];       /* run folder: metrics, checkpoints, calibration cache */
        deck_device device;            /* auto = cuda where a GPU is present, else cpu */
        uint64_t seed;                 /* seeds weights, epoch order, noise and timesteps */
        int64_t steps;                 /* stop after this many optimizer steps (0 = run `epochs`) */
        int64_t epochs;                /* epochs over the store when steps = 0 */
        int threads;                   /* OpenMP threads per rank (0 = runtime default) */
        int lock;                      /* hold an exclusive lock on <dir>/aldit.lock while training (1) */
        double step_timeout;           /* abort when a step takes longer (seconds; 0 = auto from the prediction) */
    } run;
    struct {
        char name[DECK_NAME_MAX];      /* label in logs and checkpoints ("wan1.3b", "quickstart") */
        deck_family family;            /* wan (Wan 2.1 DiT) or hunyuanvideo15 (HunyuanVideo-1.5 MMDiT) */
        int dim;                       /* hidden size D */
        int ffn_dim;                   /* FFN hidden size */
        int num_heads;                 /* attention heads; head dim = dim / num_heads */
        int num_layers;                /* transformer blocks */
        int in_dim;                    /* latent channels in (16) */
        int out_dim;                   /* latent channels out (16) */
        int patch_t, patch_h, patch_w; /* patch size (1,2,2) */
        int text_len;                  /* text tokens per sample the model accepts (512) */
        deck_text_padding text_padding; /* wan: every caption zero-padded to text_len at read time; trim: as stored */
        int text_dim;                  /* text embedding width (4096, umT5) */
        int text_2_dim;                /* hunyuanvideo15: ByT5 glyph embedding width (1472) */
        int image_dim;                 /* hunyuanvideo15: SigLIP image embedding width (1152) */
        int rope_axes_t;               /* hunyuanvideo15: RoPE channels of the frame axis (16); rows, columns share the rest */
        int freq_dim;                  /* sinusoidal time embedding width (256) */
        double eps;                    /* norm epsilon (1e-6) */
        int qk_norm;                   /* RMSNorm on q and k (1) */
        int cross_attn_norm;           /* affine LayerNorm before cross-attention (1) */
        double init_std;               /* std of the random initial weights */
        char init[DECK_PATH_MAX];      /* start from these weights (HDF5, Wan names); "" = random */
    } model;
    struct {
        char store[DECK_PATH_MAX];     /* HDF5 latent store */
        int prefetch;                  /* read the next step's samples in a background thread (1) */
        int verify;                    /* check each sample's CRC-32 against the index as it is read (1) */
        deck_on_corrupt on_corrupt;    /* a sample that cannot be read: error (checkpoint, stop) | skip it */
    } data;
    struct {
        deck_strategy strategy;        /* global (default) | dual | equal_tokens */
        int64_t global_batch;          /* samples per step for `global`; 0 = "budget" (fill each rank) */
        int64_t global_tokens;         /* tokens per step for `global` (the oldest samples up to it); 0 = off */
        int64_t max_tokens;            /* T_max of equal_tokens buckets: B = floor(T_max / S) */
        double compute_budget;         /* predicted seconds per rank per step (0 = derive from max_tokens) */
        double mem_budget;             /* activation bytes per rank (0 = measure device memory) */
        double mem_margin;             /* fraction of free memory kept back (0.1) */
        double mem_fill;               /* global, auto compute budget: fill this much of mem_budget (0.9; 0 = off) */
        double device_mem;             /* device bytes assumed when nothing can be measured (80 GiB) */
        double device_tflops;          /* GEMM rate seeding the cost model, TFLOP/s */
        double attention_tflops;       /* attention rate seeding the cost model, TFLOP/s */
        double dual_p;                 /* exponent p of the dual constraint (0 = fit from the cost model) */
        int64_t pool;                  /* samples of lookahead the global packer may use */
        deck_oversize oversize;        /* error | skip a sample that alone exceeds the memory budget */
        int calibrate;                 /* refit the cost model online from measured times (1) */
        int calibrate_window;          /* steps of (assignment, time) pairs kept for the refit */
        int calibrate_packed;          /* GPU start-up timing: packed micro-batches (1) or one sample per call */
        double calibrate_seconds;      /* GPU start-up timing's target: what decides the shapes timed at full depth */
        deck_recompute recompute;      /* activation recomputation assumed by mem(S): none | block */
        int sp;                        /* largest sequence-parallel group (a power of two); 0 = auto, 1 = off */
        double sp_bandwidth;           /* all-to-all bandwidth of a group, GB/s, for the exchange's cost */
        int ranks_per_node;            /* ranks a group may span (0 = what the run finds; aldit-sim: 8) */
        char lengths[DECK_PATH_MAX];   /* aldit-sim's length spec where the command line names none ("" = none) */
    } balance;
    struct {
        double lr;                     /* peak learning rate */
        double min_lr;                 /* floor of the cosine schedule */
        int64_t warmup_steps;          /* linear warmup */
        deck_lr_schedule lr_schedule;  /* cosine | constant */
        double weight_decay;           /* AdamW decoupled weight decay */
        double beta1, beta2, adam_eps; /* AdamW moments */
        double grad_clip;              /* clip the global gradient norm to this (0 = off) */
        double timestep_shift;         /* shift of the flow-matching timestep distribution */
        deck_timesteps timesteps;      /* law of u before the shift (family default) */
        double i2v_share;              /* hunyuanvideo15: share of the videos with SigLIP rows trained as image-to-video */
        deck_recompute recompute;      /* activation recomputation: none | block */
        deck_nonfinite nonfinite;      /* a NaN/Inf loss: error | skip the step */
        int max_skipped;               /* stop after this many consecutive skipped steps (0 = no limit) */
        deck_attention attention;      /* CUDA attention kernel: auto | cudnn | own */
        int autotune;                  /* CUDA: time cuBLASLt's and cuDNN's candidate configurations (1) */
        int prebuild;                  /* CUDA: build the cuDNN plans of the store's sample shapes before step 1 (1) */
        double allreduce_bucket;       /* CUDA: bytes per overlapped gradient all-reduce; 0 = one after the backward */
        deck_shard shard;              /* auto | none | optimizer | gradients | full */
        double ema_decay;              /* EMA of the fp32 weights: ema = d ema + (1 - d) w per update (0 = off) */
        int ema_warmup;                /* 1: step k + 1 (k from 0) uses min(ema_decay, (1 + k) / (10 + k)) */
        int ema_drop;                  /* 1: a resume with ema_decay off may drop the checkpoint's /ema (else refused) */
        deck_precision precision;      /* bf16 | fp8: the Wan block's large GEMMs */
        int fp8_amax_history;          /* fp8: amax history length per tensor (delayed scaling) */
        int fp8_margin;                /* fp8: scale = fp8_max / amax / 2^margin */
        deck_fp8_attention fp8_attention; /* fp8: off | forward | on: the self-attention's cuDNN samples in FP8 */
    } train;
    struct {
        int64_t every;                 /* checkpoint every N steps (0 = only at the end / on a signal) */
        double interval;               /* and every this many wall-clock seconds (0 = off) */
        int max_failures;              /* stop after this many consecutive failed checkpoints */
        int keep;                      /* keep the newest K checkpoints */
        int resume;                    /* resume from the newest complete checkpoint in the run folder (1) */
        deck_resume_data resume_data;  /* same: the checkpoint's store, its epoch order continued; changed: a changed
                                          or grown store, the training state carried and a new epoch order */
        int at_end;                    /* checkpoint when the steps or epochs are done (1); a signal always does */
        char hook[DECK_PATH_MAX];      /* shell command rank 0 starts, detached, after each checkpoint ("": none) */
    } checkpoint;
    struct {
        int64_t every;                 /* progress line every N steps */
        char metrics[DECK_PATH_MAX];   /* JSON lines file, relative to run.dir */
        int64_t profile_from;          /* first step inside the device profiler's capture (0 = no capture) */
        int64_t profile_steps;         /* steps captured from profile_from */
        int micro_batches;             /* each rank's micro-batches (samples, seconds) to run.dir/micro_batches.RANK.jsonl */
    } log;
    struct {
        char store[DECK_PATH_MAX];     /* held-out HDF5 latent store validated during training ("" = none) */
        int64_t every;                 /* validate after every N steps and after the last one (0 = off) */
        int64_t samples;               /* the store's first K samples (0 = all of them) */
        deck_real_list sigmas;         /* noise levels at which every validation sample is evaluated */
    } eval;
    char source[DECK_PATH_MAX];        /* the deck file it was read from */
} deck;

/* Fill every key with its documented default. */
void deck_defaults(deck *config);

/* Parse an INI file and then `section.key=value` overrides into `config` (which holds defaults).
   On any error (unknown section or key, bad type, out-of-range value, missing file) print
   "FILE:LINE: message" (overrides: "command line: message") to `errors` and return the number of
   errors; 0 on success. Cross-key checks (e.g. dim divisible by num_heads) run last, once every key
   parsed. `path` may be NULL: defaults plus overrides only. A missing file is "FILE: cannot open ...". */
int deck_load(deck *config, const char *path, int n_overrides, char *const overrides[], FILE *errors);

/* Rank 0 loads; every rank receives the same struct. Exits with status 2 on every rank after rank 0
   printed the errors. Collective over MPI_COMM_WORLD. */
void deck_load_bcast(deck *config, const char *path, int n_overrides, char *const overrides[]);

/* Print the resolved configuration as a valid INI deck (every key, defaults included). */
void deck_print(const deck *config, FILE *out);

/* Every key with its default and meaning, for `aldit --help` ("  section.key = default" + help lines). */
void deck_print_help(FILE *out);

/* The key reference as Markdown tables, one per section (the tables of docs/input-deck.md). */
void deck_print_reference(FILE *out);

/* Names of enum values, for printing. */
const char *deck_strategy_name(deck_strategy strategy);
const char *deck_device_name(deck_device device);
const char *deck_family_name(deck_family family);
const char *deck_recompute_name(deck_recompute recompute);
const char *deck_shard_name(deck_shard shard);
const char *deck_text_padding_name(deck_text_padding padding);
const char *deck_attention_name(deck_attention attention);

#endif
