/* deck.c — the input deck: one table of keys drives defaults, INI parsing (inih), overrides, checks, printing. */
#include "deck/deck.h"
#include "core/check.h"
#include "core/comm.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { KEY_INT, KEY_INT64, KEY_UINT64, KEY_DOUBLE, KEY_BYTES, KEY_BOOL, KEY_STRING, KEY_ENUM, KEY_REAL_LIST } key_type;

/* One row per deck key. Defaults are text parsed by the same code as a deck, so --help, the docs and
   deck_print show exactly what a user would write. */
typedef struct {
    const char *section;
    const char *name;
    key_type type;
    size_t offset;                  /* of the field in `deck` */
    size_t size;                    /* of the field: string capacity; checked against the type otherwise */
    double min, max;                /* numeric range, inclusive unless min_open / max_open */
    int min_open, max_open;
    const char *zero_word;          /* a word that means 0 ("auto", "budget"), accepted outside the range */
    const char *one_word;           /* a word that means 1 ("off" for balance.sp: groups of one), outside the range */
    int nonempty;                   /* strings: "" is an error */
    const char *const *choices;     /* enums: value i is choices[i]; NULL-terminated */
    const char *default_text;
    const char *family_default[2];  /* per model.family (deck_family): the default when the deck leaves the key unset;
                                       NULL = default_text */
    const char *help;
} deck_key;

static const char *const section_names[] = {"run", "model", "data", "balance", "train", "checkpoint", "log", "eval"};
enum { N_SECTIONS = sizeof section_names / sizeof section_names[0] };

static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const strategy_names[] = {"global", "dual", "equal_tokens", NULL};
static const char *const oversize_names[] = {"error", "skip", NULL};
static const char *const recompute_names[] = {"none", "block", NULL};
static const char *const text_padding_names[] = {"wan", "trim", NULL};
static const char *const family_names[] = {"wan", "hunyuanvideo15", NULL};
static const char *const shard_names[] = {"auto", "none", "optimizer", "gradients", "full", NULL};
static const char *const nonfinite_names[] = {"error", "skip", NULL};
static const char *const lr_schedule_names[] = {"cosine", "constant", NULL};
static const char *const attention_names[] = {"auto", "cudnn", "own", NULL};
static const char *const on_corrupt_names[] = {"error", "skip", NULL};
static const char *const resume_data_names[] = {"same", "changed", NULL};
static const char *const timesteps_names[] = {"uniform", "logit_normal", NULL};
static const char *const precision_names[] = {"bf16", "fp8", NULL};
static const char *const fp8_attention_names[] = {"off", "forward", "on", NULL};

#define FIELD(member) .offset = offsetof(deck, member), .size = sizeof(((deck *)0)->member)
#define KEY(sec, key, kind, member) .section = sec, .name = key, .type = kind, FIELD(member)

static const deck_key deck_keys[] = {
    /* [run] */
    {KEY("run", "dir", KEY_STRING, run.dir), .nonempty = 1, .default_text = "run",
     .help = "run folder: metrics and checkpoints (created if missing)"},
    {KEY("run", "device", KEY_ENUM, run.device), .choices = device_names, .default_text = "auto",
     .help = "backend: cuda where a GPU is present (one GPU per rank of a node), else cpu"},
    {KEY("run", "seed", KEY_UINT64, run.seed), .default_text = "1234",
     .help = "seeds the initial weights, the epoch order, the noise and the timesteps"},
    {KEY("run", "steps", KEY_INT64, run.steps), .min = 0, .max = 1e15, .default_text = "0",
     .help = "stop after this many optimizer steps (0 = run `epochs` epochs)"},
    {KEY("run", "epochs", KEY_INT64, run.epochs), .min = 1, .max = 1e9, .default_text = "1",
     .help = "epochs over the store when steps = 0"},
    {KEY("run", "threads", KEY_INT, run.threads), .min = 1, .max = 4096, .zero_word = "auto",
     .default_text = "auto", .help = "CPU threads per rank, OpenMP and OpenBLAS (auto = OMP_NUM_THREADS, else the node's cores shared by its ranks)"},
    {KEY("run", "lock", KEY_BOOL, run.lock), .default_text = "on",
     .help = "hold an exclusive lock on dir/aldit.lock while training, so that a second run on the folder is refused "
             "(off: where the file system has no locks; see docs/cluster.md)"},
    {KEY("run", "step_timeout", KEY_DOUBLE, run.step_timeout), .min = 0, .min_open = 1, .max = 1e9,
     .zero_word = "auto", .default_text = "auto",
     .help = "seconds a step may take before rank 0 names the ranks that have not arrived and aborts the job "
             "(auto = max(10 x the predicted step, 300 s); the first step of a run gets 3 times as long); also the "
             "deadline of each tensor of a checkpoint's save (3 times for a resume's load) and of each wait of the start-up "
             "(3 times) and of the run's end"},
    /* [model] */
    {KEY("model", "name", KEY_STRING, model.name), .nonempty = 1, .default_text = "wan1.3b",
     .help = "label in logs and checkpoints"},
    {KEY("model", "family", KEY_ENUM, model.family), .choices = family_names, .default_text = "wan",
     .help = "wan: Wan 2.1's DiT (cross-attention to the text); hunyuanvideo15: HunyuanVideo-1.5's MMDiT (joint "
             "attention over [video; text], CPU model only so far; docs/model.md)"},
    {KEY("model", "dim", KEY_INT, model.dim), .min = 1, .max = 65536, .default_text = "1536",
     .help = "hidden size D"},
    {KEY("model", "ffn_dim", KEY_INT, model.ffn_dim), .min = 1, .max = 1 << 20, .default_text = "8960",
     .help = "hidden size of the feed-forward network"},
    {KEY("model", "num_heads", KEY_INT, model.num_heads), .min = 1, .max = 1024, .default_text = "12",
     .help = "attention heads; the head dim dim/num_heads must be even and at least 6 (3D RoPE)"},
    {KEY("model", "num_layers", KEY_INT, model.num_layers), .min = 1, .max = 1024, .default_text = "30",
     .help = "transformer blocks"},
    {KEY("model", "in_dim", KEY_INT, model.in_dim), .min = 1, .max = 1024, .default_text = "16",
     .help = "latent channels in"},
    {KEY("model", "out_dim", KEY_INT, model.out_dim), .min = 1, .max = 1024, .default_text = "16",
     .help = "latent channels out (must equal in_dim: the target lives in the latent)"},
    {KEY("model", "patch_t", KEY_INT, model.patch_t), .min = 1, .max = 64, .default_text = "1",
     .help = "patch size in latent frames"},
    {KEY("model", "patch_h", KEY_INT, model.patch_h), .min = 1, .max = 64, .default_text = "2",
     .help = "patch size in latent rows"},
    {KEY("model", "patch_w", KEY_INT, model.patch_w), .min = 1, .max = 64, .default_text = "2",
     .help = "patch size in latent columns"},
    {KEY("model", "text_len", KEY_INT, model.text_len), .min = 1, .max = 1 << 20, .default_text = "512",
     .help = "text tokens per sample the model accepts"},
    {KEY("model", "text_padding", KEY_ENUM, model.text_padding), .choices = text_padding_names, .default_text = "wan",
     .help = "wan: each caption's embedding zero-padded to text_len at read time and attended whole, as Wan 2.1 "
             "trains; trim: only the caption's stored tokens"},
    {KEY("model", "text_dim", KEY_INT, model.text_dim), .min = 1, .max = 1 << 20, .default_text = "4096",
     .help = "text embedding width (umT5: 4096; hunyuanvideo15: Qwen2.5-VL, 3584); must match the store"},
    {KEY("model", "text_2_dim", KEY_INT, model.text_2_dim), .min = 1, .max = 1 << 20, .default_text = "1472",
     .help = "hunyuanvideo15: width of the ByT5 glyph embeddings (ignored by wan)"},
    {KEY("model", "image_dim", KEY_INT, model.image_dim), .min = 1, .max = 1 << 20, .default_text = "1152",
     .help = "hunyuanvideo15: width of the SigLIP image embeddings (ignored by wan)"},
    {KEY("model", "rope_axes_t", KEY_INT, model.rope_axes_t), .min = 2, .max = 65536, .default_text = "16",
     .help = "hunyuanvideo15: head channels the frame index rotates (even); rows and columns get half the rest "
             "each (head dim 128: 16, 56, 56; ignored by wan)"},
    {KEY("model", "freq_dim", KEY_INT, model.freq_dim), .min = 2, .max = 65536, .default_text = "256",
     .help = "width of the sinusoidal timestep embedding (even)"},
    {KEY("model", "eps", KEY_DOUBLE, model.eps), .min = 1e-12, .max = 0.1, .default_text = "1e-6",
     .help = "epsilon of LayerNorm and RMSNorm (below 1e-12 it vanishes beside fp32 variances: a row of equal "
             "values would divide by zero)"},
    {KEY("model", "qk_norm", KEY_BOOL, model.qk_norm), .default_text = "on",
     .help = "RMSNorm on queries and keys"},
    {KEY("model", "cross_attn_norm", KEY_BOOL, model.cross_attn_norm), .default_text = "on",
     .help = "affine LayerNorm before cross-attention"},
    {KEY("model", "init_std", KEY_DOUBLE, model.init_std), .min = 0, .min_open = 1, .max = 10,
     .default_text = "0.02", .help = "standard deviation of the random initial weights"},
    {KEY("model", "init", KEY_STRING, model.init), .default_text = "",
     .help = "start from these weights (HDF5 with Wan parameter names, or Wan or diffusers safetensors: a file, an index.json or their folder); empty = random"},
    /* [data] */
    {KEY("data", "store", KEY_STRING, data.store), .default_text = "",
     .help = "HDF5 latent store (made by aldit-store); required to train"},
    {KEY("data", "prefetch", KEY_BOOL, data.prefetch), .default_text = "on",
     .help = "read the next step's samples in a background thread"},
    {KEY("data", "verify", KEY_BOOL, data.verify), .default_text = "on",
     .help = "check each sample's CRC-32 (the store's index) as it is read"},
    {KEY("data", "on_corrupt", KEY_ENUM, data.on_corrupt), .choices = on_corrupt_names, .default_text = "error",
     .help = "a sample that cannot be read (checksum, non-finite values, I/O): error (checkpoint, then stop naming "
             "it) or skip (warn, leave it out of the step, count it)"},
    /* [balance] */
    {KEY("balance", "strategy", KEY_ENUM, balance.strategy), .choices = strategy_names, .default_text = "global",
     .help = "global: pack samples across ranks by predicted cost; dual: the paper's memory+compute "
             "buckets; equal_tokens: the bucket baseline"},
    {KEY("balance", "global_batch", KEY_INT64, balance.global_batch), .min = 1, .max = 1e12,
     .zero_word = "budget", .default_text = "budget",
     .help = "samples per step over all ranks (global); budget = fill every rank up to its budgets"},
    {KEY("balance", "global_tokens", KEY_INT64, balance.global_tokens), .min = 1, .max = 1e12, .zero_word = "off",
     .default_text = "off",
     .help = "global: each step takes the oldest samples whose tokens sum to at most this (at least one sample), "
             "in place of global_batch; off = global_batch decides"},
    {KEY("balance", "max_tokens", KEY_INT64, balance.max_tokens), .min = 1, .max = 1e12, .default_text = "76032",
     .help = "token budget T_max of a rank's step: equal_tokens takes B = floor(T_max / S); the default "
             "fits one 129-frame 768x768 video (33x48x48 tokens)"},
    {KEY("balance", "compute_budget", KEY_DOUBLE, balance.compute_budget), .min = 0, .min_open = 1, .max = 1e6,
     .zero_word = "auto", .default_text = "auto",
     .help = "predicted seconds of work per rank per step (auto = the mean predicted cost of an equal_tokens batch, at least the costliest sample and, for global, what mem_fill asks)"},
    {KEY("balance", "mem_budget", KEY_BYTES, balance.mem_budget), .min = 1 << 20, .max = 1125899906842624.0,
     .zero_word = "auto", .default_text = "auto",
     .help = "activation bytes per rank (auto = measured free device memory less mem_margin)"},
    {KEY("balance", "mem_margin", KEY_DOUBLE, balance.mem_margin), .min = 0, .max = 0.9, .default_text = "0.1",
     .help = "fraction of the free device memory kept back when mem_budget = auto"},
    {KEY("balance", "mem_fill", KEY_DOUBLE, balance.mem_fill), .min = 0, .max = 1, .default_text = "0.9",
     .help = "global with compute_budget = auto: plan each rank's step at least as long as a micro-batch of "
             "the store's average sample mix filling this fraction of mem_budget (0 = off)"},
    {KEY("balance", "device_mem", KEY_BYTES, balance.device_mem), .min = 1 << 20, .max = 1125899906842624.0,
     .default_text = "80GiB", .help = "device memory per rank assumed where none can be measured (the simulator; --check without a GPU)"},
    {KEY("balance", "device_tflops", KEY_DOUBLE, balance.device_tflops), .min = 0, .min_open = 1, .max = 1e6,
     .default_text = "600", .help = "GEMM rate seeding the cost model, TFLOP/s"},
    {KEY("balance", "attention_tflops", KEY_DOUBLE, balance.attention_tflops), .min = 0, .min_open = 1,
     .max = 1e6, .default_text = "500", .help = "attention rate seeding the cost model, TFLOP/s"},
    {KEY("balance", "dual_p", KEY_DOUBLE, balance.dual_p), .min = 1, .max = 3, .zero_word = "auto",
     .default_text = "auto", .help = "exponent p of the dual constraint B*S^p <= M_comp (auto = fit from the cost model)"},
    {KEY("balance", "pool", KEY_INT64, balance.pool), .min = 1, .max = 1e9, .default_text = "4096",
     .help = "upcoming samples the global packer may choose from"},
    {KEY("balance", "oversize", KEY_ENUM, balance.oversize), .choices = oversize_names, .default_text = "error",
     .help = "a sample that alone exceeds the memory budget: error (stop) or skip (warn and count)"},
    {KEY("balance", "calibrate", KEY_BOOL, balance.calibrate), .default_text = "on",
     .help = "refit the cost model online from the measured per-rank times"},
    {KEY("balance", "calibrate_window", KEY_INT, balance.calibrate_window), .min = 2, .max = 1000000,
     .default_text = "50", .help = "steps of (assignment, measured time) pairs kept for the refit"},
    {KEY("balance", "calibrate_packed", KEY_BOOL, balance.calibrate_packed), .default_text = "on",
     .help = "GPU start-up calibration times each sample shape packed into a micro-batch as training runs it "
             "(as many copies as mem_fill of mem_budget takes, at most 32); off = one sample per call"},
    {KEY("balance", "calibrate_seconds", KEY_DOUBLE, balance.calibrate_seconds), .min = 0, .max = 1e6,
     .default_text = "60", .help = "GPU start-up calibration of a model deeper than 2 blocks: the seconds it aims at; "
             "its full-depth timings (the cheapest shapes, then up to 2 checks) take at most a third of it, the other "
             "shapes are scaled from models of 1 and 2 blocks (0: all but the cheapest scaled)"},
    {KEY("balance", "recompute", KEY_ENUM, balance.recompute), .choices = recompute_names, .default_text = "none",
     .help = "activation recomputation the memory model assumes; unset, it follows train.recompute (set, it must equal it)"},
    {KEY("balance", "sp", KEY_INT, balance.sp), .min = 2, .max = 1024, .zero_word = "auto", .one_word = "off",
     .default_text = "off",
     .help = "sequence parallelism (global strategy): the largest group of ranks the balancer may give one sample, "
             "a power of two; auto = as large as the heads and ranks_per_node allow; off = every sample on one rank"},
    {KEY("balance", "sp_bandwidth", KEY_DOUBLE, balance.sp_bandwidth), .min = 0, .min_open = 1, .max = 1e6,
     .default_text = "300", .help = "all-to-all bandwidth within a group, GB/s: the exchange's cost in cost_k(S)"},
    {KEY("balance", "lengths", KEY_STRING, balance.lengths), .default_text = "",
     .help = "a length spec aldit-sim draws its samples from when given neither --spec nor --store (a relative path "
             "not found from the working folder is taken from the deck's folder)"},
    {KEY("balance", "ranks_per_node", KEY_INT, balance.ranks_per_node), .min = 1, .max = 1 << 20, .zero_word = "auto",
     .default_text = "auto",
     .help = "ranks of one node, the most a group may span (auto = the ranks that share the node; aldit-sim: 8)"},
    /* [train] */
    {KEY("train", "lr", KEY_DOUBLE, train.lr), .min = 0, .min_open = 1, .max = 10, .default_text = "1e-4",
     .help = "peak learning rate"},
    {KEY("train", "min_lr", KEY_DOUBLE, train.min_lr), .min = 0, .max = 10, .default_text = "0",
     .help = "floor of the cosine schedule (at most lr)"},
    {KEY("train", "warmup_steps", KEY_INT64, train.warmup_steps), .min = 0, .max = 1e12, .default_text = "100",
     .help = "steps of linear warmup from 0 to lr"},
    {KEY("train", "lr_schedule", KEY_ENUM, train.lr_schedule), .choices = lr_schedule_names,
     .default_text = "cosine", .help = "after warmup: cosine decay to min_lr at the last step, or constant"},
    {KEY("train", "weight_decay", KEY_DOUBLE, train.weight_decay), .min = 0, .max = 10, .default_text = "0.01",
     .help = "AdamW decoupled weight decay"},
    {KEY("train", "beta1", KEY_DOUBLE, train.beta1), .min = 0, .max = 1, .max_open = 1, .default_text = "0.9",
     .help = "AdamW first-moment decay"},
    {KEY("train", "beta2", KEY_DOUBLE, train.beta2), .min = 0, .max = 1, .max_open = 1, .default_text = "0.999",
     .help = "AdamW second-moment decay"},
    {KEY("train", "adam_eps", KEY_DOUBLE, train.adam_eps), .min = 0, .min_open = 1, .max = 1,
     .default_text = "1e-8", .help = "AdamW epsilon"},
    {KEY("train", "grad_clip", KEY_DOUBLE, train.grad_clip), .min = 0, .max = 1e6, .default_text = "1",
     .help = "clip the global gradient norm to this (0 = off)"},
    {KEY("train", "timestep_shift", KEY_DOUBLE, train.timestep_shift), .min = 0, .min_open = 1, .max = 100,
     .default_text = "5", .family_default = {[FAMILY_HUNYUANVIDEO15] = "3"},
     .help = "shift of the flow-matching timestep distribution: sigma = shift u / (1 + (shift - 1) u) (Wan: 5; "
             "HunyuanVideo-1.5's train.py: 3)"},
    {KEY("train", "timesteps", KEY_ENUM, train.timesteps), .choices = timesteps_names, .default_text = "uniform",
     .family_default = {[FAMILY_HUNYUANVIDEO15] = "logit_normal"},
     .help = "law of u before the shift: uniform on (0, 1) (Wan), or logit_normal, u = sigmoid(n) with n ~ N(0, 1), "
             "kept in [1e-5, 1 - 1e-5] (HunyuanVideo-1.5's train.py)"},
    {KEY("train", "i2v_share", KEY_DOUBLE, train.i2v_share), .min = 0, .max = 1, .default_text = "0",
     .family_default = {[FAMILY_HUNYUANVIDEO15] = "0.3"},
     .help = "hunyuanvideo15: share of the videos (store rows with SigLIP image rows) trained as image-to-video, the "
             "first latent frame as the condition (HunyuanVideo-1.5's train.py: i2v_prob 0.3); images and videos without "
             "image rows train as text-to-video; wan: must be 0"},
    {KEY("train", "recompute", KEY_ENUM, train.recompute), .choices = recompute_names, .default_text = "none",
     .help = "activation recomputation: none, or block (keep only block inputs, recompute in backward)"},
    {KEY("train", "nonfinite", KEY_ENUM, train.nonfinite), .choices = nonfinite_names, .default_text = "error",
     .help = "a NaN/Inf loss or gradient: error (stop) or skip the step"},
    {KEY("train", "max_skipped", KEY_INT, train.max_skipped), .min = 1, .max = 1000000000, .zero_word = "off",
     .default_text = "10", .help = "with nonfinite = skip: stop (exit 1) after this many skipped steps in a row (off = no limit)"},
    {KEY("train", "attention", KEY_ENUM, train.attention), .choices = attention_names, .default_text = "auto",
     .help = "CUDA attention: cudnn (fused SDPA), own kernel, or auto (cudnn when built with it)"},
    {KEY("train", "autotune", KEY_BOOL, train.autotune), .default_text = "off",
     .help = "CUDA: time the candidate configurations of cuBLASLt (each GEMM shape) and cuDNN attention (each size "
             "class) on first use and keep the fastest (off: the heuristics' first choices, the same in every run)"},
    {KEY("train", "prebuild", KEY_BOOL, train.prebuild), .default_text = "on",
     .help = "CUDA: before the first step, build the cuDNN attention plans of the store's sample shapes (wan: each "
             "sample's self-attention and cross-attention; hunyuanvideo15: each sample's joint length, with and "
             "without its image rows), so that no step builds "
             "one (0.04-1 s each); off: each is built at its shape's first use"},
    {KEY("train", "allreduce_bucket", KEY_BYTES, train.allreduce_bucket), .min = 0, .max = 1125899906842624.0,
     .default_text = "64MiB",
     .help = "CUDA: gradient all-reduce in buckets of this size overlapping the backward (0 = one after it)"},
    {KEY("train", "shard", KEY_ENUM, train.shard), .choices = shard_names, .default_text = "auto",
     .help = "training state split across the ranks: none, optimizer (fp32 master weights and AdamW moments), "
             "gradients (also the summed gradients), full (also the weights), or auto (the least that fits)"},
    {KEY("train", "ema_decay", KEY_DOUBLE, train.ema_decay), .min = 0, .max = 1, .max_open = 1, .zero_word = "off",
     .default_text = "off",
     .help = "keep an fp32 exponential moving average of the weights, ema = d ema + (1 - d) w after each optimizer "
             "update (e.g. 0.9999), in the checkpoints as /ema (off = 0: none)"},
    {KEY("train", "precision", KEY_ENUM, train.precision), .choices = precision_names, .default_text = "bf16",
     .help = "the Wan block's large linears (self q/k/v/o, cross q/o, FFN up/down): bf16, or fp8 (E4M3 activations "
             "and weights, E5M2 gradients, per-tensor delayed scaling; CUDA on a GPU of compute capability 8.9 or "
             "more); everything else stays bf16/fp32"},
    {KEY("train", "fp8_amax_history", KEY_INT, train.fp8_amax_history), .min = 1, .max = 1024, .default_text = "16",
     .help = "precision = fp8: steps of amax history per tensor; a tensor's scale comes from the history's maximum"},
    {KEY("train", "fp8_margin", KEY_INT, train.fp8_margin), .min = 0, .max = 8, .default_text = "0",
     .help = "precision = fp8: scale = fp8_max / amax / 2^margin (headroom for an amax growing between steps)"},
    {KEY("train", "fp8_attention", KEY_ENUM, train.fp8_attention), .choices = fp8_attention_names,
     .default_text = "off",
     .help = "precision = fp8: the self-attention of samples on cuDNN also in FP8 (cuDNN's FP8 SDPA, E4M3 q/k/v/o and "
             "probabilities, E5M2 gradients, delayed scaling; head_dim 128): off, forward (the backward bf16), or on; "
             "a shape cuDNN refuses runs bf16; cross-attention stays bf16"},
    {KEY("train", "ema_warmup", KEY_BOOL, train.ema_warmup), .default_text = "off",
     .help = "the EMA update of optimizer step k + 1 (step 1: k = 0) uses min(ema_decay, (1 + k) / (10 + k)), "
             "so the first weights fade fast (off: ema_decay from the first update)"},
    {KEY("train", "ema_drop", KEY_BOOL, train.ema_drop), .default_text = "off",
     .help = "on: resuming a checkpoint that holds an EMA (/ema) with ema_decay off drops that EMA on purpose (off: "
             "such a resume is refused, naming the ema_decay to set)"},
    /* [checkpoint] */
    {KEY("checkpoint", "every", KEY_INT64, checkpoint.every), .min = 0, .max = 1e12, .default_text = "0",
     .help = "checkpoint every N steps (0 = only at the end, on a signal and by interval)"},
    {KEY("checkpoint", "interval", KEY_DOUBLE, checkpoint.interval), .min = 0, .max = 1e9, .default_text = "1800",
     .help = "also checkpoint at the first step boundary this many wall-clock seconds after the last checkpoint "
             "(or the start); 0 = off"},
    {KEY("checkpoint", "max_failures", KEY_INT, checkpoint.max_failures), .min = 1, .max = 1000000, .default_text = "3",
     .help = "stop (exit 1) after this many periodic checkpoints in a row failed; the last good one is kept"},
    {KEY("checkpoint", "keep", KEY_INT, checkpoint.keep), .min = 1, .max = 100000, .default_text = "3",
     .help = "newest checkpoints kept in the run folder"},
    {KEY("checkpoint", "resume", KEY_BOOL, checkpoint.resume), .default_text = "on",
     .help = "resume from the newest complete checkpoint in the run folder"},
    {KEY("checkpoint", "resume_data", KEY_ENUM, checkpoint.resume_data), .choices = resume_data_names,
     .default_text = "same",
     .help = "resuming: same = the checkpoint's store, its epoch order continued; changed = a changed or grown store "
             "(weights, AdamW moments, EMA, step and schedule carried, a new epoch order from the step; needs run.steps)"},
    {KEY("checkpoint", "at_end", KEY_BOOL, checkpoint.at_end), .default_text = "on",
     .help = "checkpoint when the run's steps or epochs are done (off: no final checkpoint, e.g. for a benchmark; "
             "a signal, every and interval still checkpoint)"},
    {KEY("checkpoint", "hook", KEY_STRING, checkpoint.hook), .default_text = "",
     .help = "shell command rank 0 starts after each checkpoint, detached (own session, output appended to "
             "run.dir/hooks.log), with ALDIT_CHECKPOINT, ALDIT_STEP and ALDIT_RUN_DIR set; none is started while "
             "the last still runs (empty: none)"},
    /* [log] */
    {KEY("log", "every", KEY_INT64, log.every), .min = 1, .max = 1e12, .default_text = "1",
     .help = "progress line every N steps"},
    {KEY("log", "metrics", KEY_STRING, log.metrics), .nonempty = 1, .default_text = "metrics.jsonl",
     .help = "JSON-lines metrics file, one line per step; a relative path is inside run.dir"},
    {KEY("log", "profile_from", KEY_INT64, log.profile_from), .min = 0, .max = 1e12, .zero_word = "off",
     .default_text = "off", .help = "CUDA: the step (counted from 1, as in the metrics) at which the profiler's capture "
             "starts (cudaProfilerStart), for nsys profile --capture-range=cudaProfilerApi or ncu --profile-from-start "
             "off; it stops after profile_steps steps (off: never started)"},
    {KEY("log", "profile_steps", KEY_INT64, log.profile_steps), .min = 1, .max = 1e12, .default_text = "1",
     .help = "steps inside the profiler's capture from profile_from"},
    {KEY("log", "micro_batches", KEY_BOOL, log.micro_batches), .default_text = "off",
     .help = "each rank writes one JSON line per micro-batch to run.dir/micro_batches.RANK.jsonl: its step, its seconds "
             "(the backend's call until its losses are back), the device's one-time set-up among them (new cuDNN "
             "plans) and each sample's video tokens and caption rows (tests/bench/train_table.py --micro-batches sets "
             "them against their floor)"},
    /* [eval] */
    {KEY("eval", "store", KEY_STRING, eval.store), .default_text = "",
     .help = "held-out HDF5 latent store (the training store's format and dims) whose loss is measured during "
             "training; empty = no validation"},
    {KEY("eval", "every", KEY_INT64, eval.every), .min = 0, .max = 1e12, .zero_word = "off", .default_text = "100",
     .help = "validate after every N steps and after the run's last step (0 or off = never)"},
    {KEY("eval", "samples", KEY_INT64, eval.samples), .min = 0, .max = 1e12, .zero_word = "all", .default_text = "all",
     .help = "validate on the store's first K samples (0 or all = every sample); more than the store holds is an error"},
    {KEY("eval", "sigmas", KEY_REAL_LIST, eval.sigmas), .min = 0, .max = 1,
     .default_text = "0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9",
     .help = "noise levels (timestep 1000 sigma): every validation sample is evaluated at each of them, with noise "
             "fixed by run.seed and the sample; the validation loss is the mean over samples and levels"},
};
enum { N_KEYS = sizeof deck_keys / sizeof deck_keys[0] };

/* Where a key got its value: the deck line, the command line, or the default. */
enum { ORIGIN_DEFAULT = 0, ORIGIN_COMMAND_LINE = -1 };

typedef enum { SECTION_NONE, SECTION_BAD, SECTION_OK } section_state;

typedef struct {
    deck *config;
    const char *file;               /* named in messages */
    FILE *errors;
    int n_errors;
    int origin[N_KEYS];             /* ORIGIN_* or the line that set the key */
    FILE *stream;                   /* the deck being read, line by line */
    int line;                       /* line number of the line inih is handling */
    char *line_buffer;
    size_t line_capacity;
    section_state section;
} load_context;

/* ---- messages --------------------------------------------------------------------------------- */

/* Errors printed before the rest are only counted (a binary file given as the deck has thousands). */
enum { MAX_PRINTED_ERRORS = 100 };

/* "FILE:LINE: ", "command line: " or "FILE: " (line 0: no line to name), then the message. */
static void report(load_context *ctx, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(load_context *ctx, int line, const char *fmt, ...)
{
    if (ctx->n_errors++ >= MAX_PRINTED_ERRORS) return;
    if (line == ORIGIN_COMMAND_LINE) fputs("command line: ", ctx->errors);
    else if (line > 0) fprintf(ctx->errors, "%s:%d: ", ctx->file, line);
    else fprintf(ctx->errors, "%s: ", ctx->file);
    va_list args;
    va_start(args, fmt);
    vfprintf(ctx->errors, fmt, args);
    va_end(args);
    fputc('\n', ctx->errors);
}

/* ---- table lookups ---------------------------------------------------------------------------- */

static int is_section(const char *name)
{
    for (int i = 0; i < N_SECTIONS; i++)
        if (strcmp(section_names[i], name) == 0) return 1;
    return 0;
}

static int find_key(const char *section, const char *name)
{
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(deck_keys[i].section, section) == 0 && strcmp(deck_keys[i].name, name) == 0) return i;
    return -1;
}

static int key_index(const char *section, const char *name)
{
    int index = find_key(section, name);
    ALDIT_CHECK(index >= 0, "deck: no key %s.%s in the table", section, name);
    return index;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t len_a = strlen(a), len_b = strlen(b);
    if (len_a > 64 || len_b > 64) return (size_t)-1;
    size_t row[65];
    for (size_t j = 0; j <= len_b; j++) row[j] = j;
    for (size_t i = 1; i <= len_a; i++) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= len_b; j++) {
            size_t above = row[j];
            size_t best = diagonal + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[len_b];
}

/* " (did you mean ...?)" for an unknown key: the same name in another section, else a near name. */
static void suggest_key(const char *section, const char *name, char *hint, size_t hint_size)
{
    hint[0] = '\0';
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(deck_keys[i].name, name) == 0) {
            snprintf(hint, hint_size, " (did you mean %s.%s?)", deck_keys[i].section, name);
            return;
        }
    size_t best = 3;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(deck_keys[i].section, section) != 0) continue;
        size_t distance = edit_distance(name, deck_keys[i].name);
        if (distance < best) {
            best = distance;
            snprintf(hint, hint_size, " (did you mean %s?)", deck_keys[i].name);
        }
    }
}

/* ---- values ----------------------------------------------------------------------------------- */

static int parse_integer(const char *text, long long *value)
{
    char *end = NULL;
    errno = 0;
    long long parsed = strtoll(text, &end, 10);
    if (end != text && *end == '\0' && errno == 0) {
        *value = parsed;
        return 1;
    }
    /* 1e6 and the like, when the value is a whole number that a double holds exactly */
    errno = 0;
    double real = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(real) || real != floor(real) || fabs(real) > 9007199254740992.0)
        return 0;
    *value = (long long)real;
    return 1;
}

static int parse_real(const char *text, double *value)
{
    char *end = NULL;
    errno = 0;
    *value = strtod(text, &end);
    return end != text && *end == '\0' && errno == 0 && isfinite(*value);
}

/* What a number that parse_real refused is not, for "'TEXT' is not ...": a number too small for a double's
   normal range (strtod's underflow: a denormal or zero) or too large for a double is named as such. */
static const char *real_refusal(const char *text)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (end == text || *end != '\0' || errno != ERANGE) return "a finite number";
    return fabs(value) < 1.0 ? "a usable number: it is below 2.2e-308, the smallest normal double (denormal or zero)"
                             : "a finite number: it is above 1.8e308, the largest double";
}

static int parse_bytes(const char *text, double *value)
{
    static const struct { const char *suffix; double factor; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1024.0}, {"kib", 1024.0}, {"kb", 1e3},
        {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
        {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
        {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
    };
    char *end = NULL;
    errno = 0;
    double number = strtod(text, &end);
    if (end == text || errno != 0 || !isfinite(number)) return 0;
    while (*end == ' ' || *end == '\t') end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].suffix) == 0) {
            *value = number * units[i].factor;
            return 1;
        }
    return 0;
}

static int parse_bool(const char *text, int *value)
{
    static const char *const true_words[] = {"true", "on", "yes", "1"};
    static const char *const false_words[] = {"false", "off", "no", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(text, true_words[i]) == 0) { *value = 1; return 1; }
        if (strcasecmp(text, false_words[i]) == 0) { *value = 0; return 1; }
    }
    return 0;
}

/* The shortest of %.15g..%.17g that reads back to the same double. */
static void format_real(double value, char *text, size_t text_size)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, text_size, "%.*g", digits, value);
        if (strtod(text, NULL) == value) return;
    }
}

/* Whole TiB/GiB/MiB/KiB where exact ("80GiB"), else plain bytes. */
static void format_bytes(double value, char *text, size_t text_size)
{
    static const struct { const char *suffix; double factor; } units[] = {
        {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        double count = value / units[i].factor;
        if (count >= 1 && count == floor(count) && count < 1e15) {
            snprintf(text, text_size, "%.0f%s", count, units[i].suffix);
            return;
        }
    }
    format_real(value, text, text_size);
}

static void describe_range(const deck_key *key, char *text, size_t text_size)
{
    char low[48], high[48];
    if (key->type == KEY_BYTES) {
        format_bytes(key->min, low, sizeof low);
        format_bytes(key->max, high, sizeof high);
    } else {
        format_real(key->min, low, sizeof low);
        format_real(key->max, high, sizeof high);
    }
    snprintf(text, text_size, "%s%s, %s%s", key->min_open ? "(" : "[", low, high, key->max_open ? ")" : "]");
}

static void describe_choices(const deck_key *key, char *text, size_t text_size)
{
    text[0] = '\0';
    for (int i = 0; key->choices[i]; i++) {
        size_t used = strlen(text);
        snprintf(text + used, text_size - used, "%s%s", i ? ", " : "", key->choices[i]);
    }
}

static int in_range(const deck_key *key, double value)
{
    int above_min = key->min_open ? value > key->min : value >= key->min;
    int below_max = key->max_open ? value < key->max : value <= key->max;
    return above_min && below_max;
}

static int has_control_characters(const char *text)
{
    for (; *text; text++)
        if (iscntrl((unsigned char)*text)) return 1;
    return 0;
}

/* A list of numbers separated by commas and/or spaces ("0.1, 0.5 0.9") into `list`, each in the key's range.
   Returns 1, or 0 after reporting at `line`. */
static int parse_real_list(load_context *ctx, const deck_key *key, const char *text, int line, deck_real_list *list)
{
    char range[96];
    describe_range(key, range, sizeof range);
    memset(list, 0, sizeof *list); /* padding too: the deck is compared as bytes */
    const char *next = text;
    for (;;) {
        while (*next == ',' || isspace((unsigned char)*next)) next++;
        if (*next == '\0') break;
        char *end = NULL;
        errno = 0;
        double value = strtod(next, &end);
        if (end == next || errno != 0 || !isfinite(value) || (*end && *end != ',' && !isspace((unsigned char)*end))) {
            report(ctx, line, "%s.%s: '%s' is not a list of numbers (e.g. 0.1, 0.5, 0.9)", key->section, key->name, text);
            return 0;
        }
        if (!in_range(key, value)) {
            report(ctx, line, "%s.%s: %.*s is out of range %s", key->section, key->name, (int)(end - next), next, range);
            return 0;
        }
        if (list->n == DECK_LIST_MAX) {
            report(ctx, line, "%s.%s: more than %d numbers", key->section, key->name, DECK_LIST_MAX);
            return 0;
        }
        list->values[list->n++] = value;
        next = end;
    }
    if (list->n == 0) {
        report(ctx, line, "%s.%s: needs at least one number", key->section, key->name);
        return 0;
    }
    return 1;
}

/* Parse `text` into the key's field of ctx->config; on failure report at `line` and leave the field. */
static int set_key(load_context *ctx, int index, const char *text, int line)
{
    const deck_key *key = &deck_keys[index];
    char *field = (char *)ctx->config + key->offset;
    char range[96];
    describe_range(key, range, sizeof range);
    char zero_hint[96] = "";
    if (key->zero_word) snprintf(zero_hint, sizeof zero_hint, " or %s%s%s", key->zero_word,
                                 key->one_word ? " or " : "", key->one_word ? key->one_word : "");
    const int zero = key->zero_word && strcasecmp(text, key->zero_word) == 0;
    if (zero || (key->one_word && strcasecmp(text, key->one_word) == 0)) { /* numeric keys only */
        if (key->type == KEY_INT) *(int *)field = zero ? 0 : 1;
        else if (key->type == KEY_INT64) *(int64_t *)field = zero ? 0 : 1;
        else *(double *)field = zero ? 0 : 1;
        ctx->origin[index] = line;
        return 1;
    }
    switch (key->type) {
    case KEY_INT:
    case KEY_INT64: {
        long long value = 0;
        if (!parse_integer(text, &value)) {
            report(ctx, line, "%s.%s: '%s' is not an integer%s", key->section, key->name, text, zero_hint);
            return 0;
        }
        if (!in_range(key, (double)value)) {
            report(ctx, line, "%s.%s: %lld is out of range %s%s", key->section, key->name, value, range, zero_hint);
            return 0;
        }
        if (key->type == KEY_INT) *(int *)field = (int)value;
        else *(int64_t *)field = value;
        break;
    }
    case KEY_UINT64: {
        char *end = NULL;
        errno = 0;
        unsigned long long value = strtoull(text, &end, 10);
        if (end == text || *end != '\0' || errno != 0 || strchr(text, '-')) {
            report(ctx, line, "%s.%s: '%s' is not an integer in [0, 2^64)", key->section, key->name, text);
            return 0;
        }
        *(uint64_t *)field = value;
        break;
    }
    case KEY_DOUBLE:
    case KEY_BYTES: {
        double value = 0;
        int parsed = key->type == KEY_DOUBLE ? parse_real(text, &value) : parse_bytes(text, &value);
        if (!parsed) {
            if (key->type == KEY_DOUBLE)
                report(ctx, line, "%s.%s: '%s' is not %s (the range is %s%s)", key->section, key->name, text,
                       real_refusal(text), range, zero_hint);
            else report(ctx, line, "%s.%s: '%s' is not a byte size (e.g. 80GiB, 512MiB, 1e9)%s", key->section,
                        key->name, text, zero_hint);
            return 0;
        }
        if (!in_range(key, value)) {
            report(ctx, line, "%s.%s: %s is out of range %s%s", key->section, key->name, text, range, zero_hint);
            return 0;
        }
        *(double *)field = value;
        break;
    }
    case KEY_BOOL: {
        int value = 0;
        if (!parse_bool(text, &value)) {
            report(ctx, line, "%s.%s: '%s' is not a boolean (true/false, on/off, yes/no, 1/0)", key->section,
                   key->name, text);
            return 0;
        }
        *(int *)field = value;
        break;
    }
    case KEY_STRING:
        if (strlen(text) >= key->size) {
            report(ctx, line, "%s.%s: value is %zu characters long; at most %zu fit", key->section, key->name,
                   strlen(text), key->size - 1);
            return 0;
        }
        if (has_control_characters(text)) {
            report(ctx, line, "%s.%s: value holds control characters", key->section, key->name);
            return 0;
        }
        if (key->nonempty && text[0] == '\0') {
            report(ctx, line, "%s.%s: must not be empty", key->section, key->name);
            return 0;
        }
        memcpy(field, text, strlen(text) + 1);
        break;
    case KEY_ENUM: {
        int choice = 0;
        while (key->choices[choice] && strcasecmp(key->choices[choice], text) != 0) choice++;
        if (!key->choices[choice]) {
            char choices[128];
            describe_choices(key, choices, sizeof choices);
            report(ctx, line, "%s.%s: '%s' is not one of: %s", key->section, key->name, text, choices);
            return 0;
        }
        *(int *)field = choice;
        break;
    }
    case KEY_REAL_LIST: {
        deck_real_list list;
        if (!parse_real_list(ctx, key, text, line, &list)) return 0;
        memcpy(field, &list, sizeof list);
        break;
    }
    }
    ctx->origin[index] = line;
    return 1;
}

/* The value as a deck would spell it (re-parses to the same bits). */
static void format_value(const deck *config, const deck_key *key, char *text, size_t text_size)
{
    const char *field = (const char *)config + key->offset;
    switch (key->type) {
    case KEY_INT:
    case KEY_INT64: {
        long long value = key->type == KEY_INT ? *(const int *)field : (long long)*(const int64_t *)field;
        if (value == 0 && key->zero_word) snprintf(text, text_size, "%s", key->zero_word);
        else if (value == 1 && key->one_word) snprintf(text, text_size, "%s", key->one_word);
        else snprintf(text, text_size, "%lld", value);
        break;
    }
    case KEY_UINT64:
        snprintf(text, text_size, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case KEY_DOUBLE:
    case KEY_BYTES: {
        double value = *(const double *)field;
        if (value == 0 && key->zero_word) snprintf(text, text_size, "%s", key->zero_word);
        else if (key->type == KEY_BYTES) format_bytes(value, text, text_size);
        else format_real(value, text, text_size);
        break;
    }
    case KEY_BOOL:
        snprintf(text, text_size, "%s", *(const int *)field ? "on" : "off");
        break;
    case KEY_STRING:
        snprintf(text, text_size, "%s", field);
        break;
    case KEY_ENUM:
        snprintf(text, text_size, "%s", key->choices[*(const int *)field]);
        break;
    case KEY_REAL_LIST: {
        const deck_real_list *list = (const deck_real_list *)field;
        text[0] = '\0';
        for (int i = 0; i < list->n; i++) {
            char number[32];
            format_real(list->values[i], number, sizeof number);
            size_t used = strlen(text);
            snprintf(text + used, text_size - used, "%s%s", i ? ", " : "", number);
        }
        break;
    }
    }
}

/* ---- reading a deck through inih ------------------------------------------------------------------ */

/* inih's reader: hands inih one line at a time so that the line number is known in the handler, and
   screens what inih would reject or misread (section headers, lines that are not key = value, lines
   too long for inih's buffer, indented lines that inih would join to the previous value, comments
   after a value), so that every such line is reported and parsing goes on. */
static char *read_line(char *buffer, int buffer_size, void *user)
{
    load_context *ctx = user;
    ssize_t read = getline(&ctx->line_buffer, &ctx->line_capacity, ctx->stream);
    if (read < 0) return NULL;
    ctx->line++;
    char *text = ctx->line_buffer;
    if (memchr(text, '\0', (size_t)read)) { /* C strings would end there and drop the rest of the line */
        report(ctx, ctx->line, "NUL byte in the line (is this a text file?)");
        snprintf(buffer, (size_t)buffer_size, "\n");
        return buffer;
    }
    if (ctx->line == 1 && strncmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3;
    while (isspace((unsigned char)*text)) text++;

    int usable = 1;
    if (text[0] == ';' || text[0] == '#') {
        text[0] = '\0'; /* a comment line: inih need not see it, whatever its length */
    } else if (text[0] == '[') {
        char *close = strchr(text, ']');
        if (!close) {
            report(ctx, ctx->line, "section header without ']'");
            ctx->section = SECTION_BAD;
            usable = 0;
        } else {
            char *start = text + 1;
            while (isspace((unsigned char)*start)) start++;
            int name_length = (int)(close - start);
            while (name_length > 0 && isspace((unsigned char)start[name_length - 1])) name_length--;
            char name[64];
            snprintf(name, sizeof name, "%.*s", name_length, start);
            if (is_section(name)) {
                ctx->section = SECTION_OK;
            } else {
                report(ctx, ctx->line, "unknown section [%s] (sections: run, model, data, balance, train, checkpoint, log, eval)",
                       name);
                ctx->section = SECTION_BAD;
            }
            sprintf(text, "[%s]", name); /* "[ data ]  ; x" -> "[data]": inih keeps spaces in names */
        }
    } else if (text[0] != '\0') {
        size_t separator = strcspn(text, "=:;#");
        if (text[separator] != '=' && text[separator] != ':') {
            report(ctx, ctx->line, "expected 'key = value', '[section]' or a comment");
            usable = 0;
        } else {
            /* a ';' or '#' that opens the value or follows a space starts a comment (inih alone would
               take "init = ; none" as the value "; none") */
            for (size_t i = separator + 1; text[i]; i++)
                if ((text[i] == ';' || text[i] == '#') && (i == separator + 1 || isspace((unsigned char)text[i - 1]))) {
                    text[i] = '\0';
                    break;
                }
        }
    }
    size_t length = strlen(text);
    while (length > 0 && isspace((unsigned char)text[length - 1])) text[--length] = '\0';
    if (usable && length + 2 > (size_t)buffer_size) {
        report(ctx, ctx->line, "line is longer than %d characters (put long values on the command line)",
               buffer_size - 2);
        usable = 0;
    }
    if (!usable) text[0] = '\0';
    snprintf(buffer, (size_t)buffer_size, "%s\n", text);
    return buffer;
}

static int handle_key(void *user, const char *section, const char *name, const char *value)
{
    load_context *ctx = user;
    if (ctx->section == SECTION_BAD) return 1; /* the header was reported */
    if (ctx->section == SECTION_NONE) {
        report(ctx, ctx->line, "'%s' is outside any [section]", name);
        return 1;
    }
    if (name[0] == '\0') {
        report(ctx, ctx->line, "missing key name before '='");
        return 1;
    }
    int index = find_key(section, name);
    if (index < 0) {
        char hint[96];
        suggest_key(section, name, hint, sizeof hint);
        report(ctx, ctx->line, "unknown key '%s' in [%s]%s", name, section, hint);
        return 1;
    }
    if (ctx->origin[index] > 0) {
        report(ctx, ctx->line, "duplicate key %s.%s (first set on line %d)", section, name, ctx->origin[index]);
        return 1;
    }
    set_key(ctx, index, value, ctx->line);
    return 1;
}

static void load_file(load_context *ctx, const char *path)
{
    ctx->stream = fopen(path, "r");
    if (!ctx->stream) {
        report(ctx, 0, "cannot open the deck: %s", strerror(errno));
        return;
    }
    int errors_before = ctx->n_errors;
    int status = ini_parse_stream(read_line, ctx, handle_key, ctx);
    if (ferror(ctx->stream)) report(ctx, ctx->line, "read error: %s", strerror(errno));
    else if (status > 0 && ctx->n_errors == errors_before) report(ctx, status, "syntax error");
    else if (status < 0) report(ctx, 0, "inih could not parse the deck (status %d)", status);
    fclose(ctx->stream);
    ctx->stream = NULL;
    free(ctx->line_buffer);
    ctx->line_buffer = NULL;
    ctx->line_capacity = 0;
}

static void trim(char *text)
{
    size_t start = 0, length = strlen(text);
    while (start < length && isspace((unsigned char)text[start])) start++;
    while (length > start && isspace((unsigned char)text[length - 1])) length--;
    memmove(text, text + start, length - start);
    text[length - start] = '\0';
}

static void apply_override(load_context *ctx, const char *argument)
{
    char copy[DECK_PATH_MAX + 128];
    if (strlen(argument) >= sizeof copy) {
        report(ctx, ORIGIN_COMMAND_LINE, "override of %zu characters is too long", strlen(argument));
        return;
    }
    strcpy(copy, argument);
    char *equals = strchr(copy, '=');
    char *dot = strchr(copy, '.');
    if (!equals || !dot || dot > equals) {
        report(ctx, ORIGIN_COMMAND_LINE, "'%s' is not section.key=value", argument);
        return;
    }
    *equals = '\0';
    *dot = '\0';
    char *section = copy, *name = dot + 1, *value = equals + 1;
    trim(section);
    trim(name);
    trim(value);
    if (!is_section(section)) {
        report(ctx, ORIGIN_COMMAND_LINE, "unknown section '%s' in '%s'", section, argument);
        return;
    }
    int index = find_key(section, name);
    if (index < 0) {
        char hint[96];
        suggest_key(section, name, hint, sizeof hint);
        report(ctx, ORIGIN_COMMAND_LINE, "unknown key %s.%s%s", section, name, hint);
        return;
    }
    if (ctx->origin[index] == ORIGIN_COMMAND_LINE) {
        report(ctx, ORIGIN_COMMAND_LINE, "%s.%s is given more than once", section, name);
        return;
    }
    set_key(ctx, index, value, ORIGIN_COMMAND_LINE);
}

/* ---- cross-key checks ------------------------------------------------------------------------------ */

/* Keys whose default is another key's value: balance.recompute follows train.recompute unless set. */
static void follow_unset_keys(load_context *ctx)
{
    for (int i = 0; i < N_KEYS; i++) { /* the family's own defaults of the keys the deck leaves unset */
        const char *text = deck_keys[i].family_default[ctx->config->model.family];
        if (text && ctx->origin[i] == ORIGIN_DEFAULT) set_key(ctx, i, text, ORIGIN_DEFAULT);
    }
    if (ctx->origin[key_index("balance", "recompute")] == ORIGIN_DEFAULT)
        ctx->config->balance.recompute = ctx->config->train.recompute;
}

/* Report at the most recent setting among the keys involved: the command line, else the latest deck
   line, else the file (all defaults). */
static int latest_origin(const load_context *ctx, const int *indices, int n_indices)
{
    int latest = ORIGIN_DEFAULT;
    for (int i = 0; i < n_indices; i++) {
        int origin = ctx->origin[indices[i]];
        if (origin == ORIGIN_COMMAND_LINE) return ORIGIN_COMMAND_LINE;
        if (origin > latest) latest = origin;
    }
    return latest;
}

/* hunyuanvideo15: its input is [x_t, condition latent, mask] (2 out_dim + 1 channels) and its RoPE axes fill
   the head dim in (real, imaginary) pairs. */
static void check_family(load_context *ctx)
{
    const deck *config = ctx->config;
    const int channels[] = {key_index("model", "in_dim"), key_index("model", "out_dim"), key_index("model", "family")};
    if (config->model.family == FAMILY_HUNYUANVIDEO15 && config->model.in_dim != 2 * config->model.out_dim + 1)
        report(ctx, latest_origin(ctx, channels, 3),
               "model.family = hunyuanvideo15 takes x_t, the condition latent and a mask: model.in_dim (%d) must be "
               "2 * model.out_dim + 1 = %d", config->model.in_dim, 2 * config->model.out_dim + 1);
    const int share[] = {key_index("train", "i2v_share"), key_index("model", "family")};
    if (config->model.family == FAMILY_WAN && config->train.i2v_share > 0)
        report(ctx, latest_origin(ctx, share, 2),
               "train.i2v_share (%g) is for model.family = hunyuanvideo15: wan has no condition input (set it to 0)",
               config->train.i2v_share);
    if (config->model.family != FAMILY_HUNYUANVIDEO15) return;
    const int padding[] = {key_index("model", "text_padding"), key_index("model", "family")};
    if (config->model.text_padding != TEXT_PADDING_TRIM)
        report(ctx, latest_origin(ctx, padding, 2),
               "model.family = hunyuanvideo15 attends each caption at its own length (diffusers masks the padding): "
               "set model.text_padding = trim");
    const int axes[] = {key_index("model", "rope_axes_t"), key_index("model", "dim"), key_index("model", "num_heads")};
    const int head_dim = config->model.dim / config->model.num_heads, t = config->model.rope_axes_t;
    if (config->model.dim % config->model.num_heads == 0 && (t % 2 != 0 || t >= head_dim || (head_dim - t) % 4 != 0))
        report(ctx, latest_origin(ctx, axes, 3),
               "model.rope_axes_t (%d) must be even and leave the rest of the head dim (%d) to split into two even "
               "halves (rows, columns)", t, head_dim);
}

/* precision = fp8 runs only on the CUDA backend's Wan model (the GPU's compute capability is checked there). */
static void check_precision(load_context *ctx)
{
    const deck *config = ctx->config;
    if (config->train.precision != PRECISION_FP8) {
        const int keys[] = {key_index("train", "fp8_attention"), key_index("train", "precision")};
        if (config->train.fp8_attention != FP8_ATTENTION_OFF)
            report(ctx, latest_origin(ctx, keys, 2), "train.fp8_attention = %s needs train.precision = fp8",
                   fp8_attention_names[config->train.fp8_attention]);
        return;
    }
    const int device[] = {key_index("train", "precision"), key_index("run", "device")};
    if (config->run.device == DEVICE_CPU)
        report(ctx, latest_origin(ctx, device, 2),
               "train.precision = fp8 needs the CUDA backend (FP8 GEMMs on a GPU of compute capability 8.9 or more); "
               "run.device = cpu has no FP8: set train.precision = bf16 or run.device = cuda");
    const int heads[] = {key_index("train", "fp8_attention"), key_index("model", "dim"), key_index("model", "num_heads")};
    if (config->train.fp8_attention != FP8_ATTENTION_OFF && config->model.num_heads > 0 &&
        config->model.dim != 128 * config->model.num_heads)
        report(ctx, latest_origin(ctx, heads, 3),
               "train.fp8_attention = %s needs head_dim 128 (cuDNN's FP8 attention on Hopper); model.dim / "
               "model.num_heads = %d / %d: set train.fp8_attention = off", fp8_attention_names[config->train.fp8_attention],
               config->model.dim, config->model.num_heads);
    const int family[] = {key_index("train", "precision"), key_index("model", "family")};
    if (config->model.family != FAMILY_WAN)
        report(ctx, latest_origin(ctx, family, 2),
               "train.precision = fp8 covers the Wan block's GEMMs only: set train.precision = bf16 for model.family "
               "= %s", family_names[config->model.family]);
}

static void check_cross_keys(load_context *ctx)
{
    const deck *config = ctx->config;
    const int dim = key_index("model", "dim"), heads = key_index("model", "num_heads");
    const int model_keys[] = {dim, heads};
    if (config->model.dim % config->model.num_heads != 0) {
        report(ctx, latest_origin(ctx, model_keys, 2), "model.dim (%d) is not divisible by model.num_heads (%d)",
               config->model.dim, config->model.num_heads);
    } else {
        /* Wan's 3D RoPE splits the head dim d into d - 4*(d/6) time and 2*(d/6) height and width
           channels, in complex pairs */
        int head_dim = config->model.dim / config->model.num_heads;
        if (head_dim % 2 != 0 || head_dim < 6)
            report(ctx, latest_origin(ctx, model_keys, 2),
                   "head dim model.dim / model.num_heads = %d must be even and at least 6 for 3D RoPE", head_dim);
    }
    const int freq[] = {key_index("model", "freq_dim")};
    if (config->model.freq_dim % 2 != 0)
        report(ctx, latest_origin(ctx, freq, 1), "model.freq_dim (%d) must be even (sin and cos halves)",
               config->model.freq_dim);
    check_family(ctx);
    check_precision(ctx);
    const int channels[] = {key_index("model", "in_dim"), key_index("model", "out_dim")};
    if (config->model.family == FAMILY_WAN && config->model.in_dim != config->model.out_dim)
        report(ctx, latest_origin(ctx, channels, 2),
               "model.in_dim (%d) differs from model.out_dim (%d): the flow target lives in the input latent",
               config->model.in_dim, config->model.out_dim);
    const int rates[] = {key_index("train", "lr"), key_index("train", "min_lr")};
    if (config->train.min_lr > config->train.lr)
        report(ctx, latest_origin(ctx, rates, 2), "train.min_lr (%g) is larger than train.lr (%g)",
               config->train.min_lr, config->train.lr);
    const int batch[] = {key_index("balance", "global_batch"), key_index("balance", "global_tokens")};
    if (config->balance.global_batch > 0 && config->balance.global_tokens > 0)
        report(ctx, latest_origin(ctx, batch, 2), "balance.global_batch (%lld samples) and balance.global_tokens (%lld) "
               "both set the step's batch: set one, the other to budget / off", (long long)config->balance.global_batch,
               (long long)config->balance.global_tokens);
    const int sp[] = {key_index("balance", "sp")};
    if (config->balance.sp > 1 && (config->balance.sp & (config->balance.sp - 1)) != 0)
        report(ctx, latest_origin(ctx, sp, 1), "balance.sp (%d) is not a power of two: give 2, 4, 8, ..., auto or off",
               config->balance.sp);
    const int warm[] = {key_index("checkpoint", "resume_data"), key_index("run", "steps")};
    if (config->checkpoint.resume_data == RESUME_DATA_CHANGED && config->run.steps <= 0)
        report(ctx, latest_origin(ctx, warm, 2), "checkpoint.resume_data = changed needs run.steps (the run's length "
               "in steps: the epochs of the checkpoint's store do not count on another)");
    const int recompute[] = {key_index("balance", "recompute"), key_index("train", "recompute")};
    if (config->balance.recompute != config->train.recompute)
        report(ctx, latest_origin(ctx, recompute, 2),
               "balance.recompute (%s) differs from train.recompute (%s): the memory model must assume what "
               "training does", recompute_names[config->balance.recompute], recompute_names[config->train.recompute]);
}

/* ---- public API ------------------------------------------------------------------------------------- */

static size_t type_size(key_type type)
{
    switch (type) {
    case KEY_INT: case KEY_BOOL: case KEY_ENUM: return sizeof(int);
    case KEY_INT64: return sizeof(int64_t);
    case KEY_UINT64: return sizeof(uint64_t);
    case KEY_DOUBLE: case KEY_BYTES: return sizeof(double);
    case KEY_STRING: return 0;
    case KEY_REAL_LIST: return sizeof(deck_real_list);
    }
    return 0;
}

void deck_defaults(deck *config)
{
    memset(config, 0, sizeof *config); /* padding too: the struct is broadcast and compared as bytes */
    load_context ctx = {.config = config, .file = "deck defaults", .errors = stderr};
    for (int i = 0; i < N_KEYS; i++) {
        const deck_key *key = &deck_keys[i];
        ALDIT_CHECK(key->type == KEY_STRING || key->size == type_size(key->type),
                    "deck table: %s.%s has the wrong type for its field", key->section, key->name);
        set_key(&ctx, i, key->default_text, ORIGIN_DEFAULT);
    }
    ALDIT_CHECK(ctx.n_errors == 0, "deck table: %d defaults do not parse", ctx.n_errors);
}

int deck_load(deck *config, const char *path, int n_overrides, char *const overrides[], FILE *errors)
{
    load_context ctx = {.config = config, .file = path ? path : "deck", .errors = errors};
    if (path) {
        if (strlen(path) >= sizeof config->source) {
            report(&ctx, 0, "deck path is too long");
            return ctx.n_errors;
        }
        strcpy(config->source, path);
        load_file(&ctx, path);
    }
    for (int i = 0; i < n_overrides; i++) apply_override(&ctx, overrides[i]);
    follow_unset_keys(&ctx);
    if (ctx.n_errors == 0) check_cross_keys(&ctx);
    if (ctx.n_errors > MAX_PRINTED_ERRORS)
        fprintf(errors, "%s: %d more errors not shown\n", ctx.file, ctx.n_errors - MAX_PRINTED_ERRORS);
    return ctx.n_errors;
}

void deck_load_bcast(deck *config, const char *path, int n_overrides, char *const overrides[])
{
    int rank = comm_rank();
    int n_errors = 0;
    deck_defaults(config);
    if (rank == 0) {
        n_errors = deck_load(config, path, n_overrides, overrides, stderr);
        if (n_errors > 0)
            fprintf(stderr, "aldit: %d error%s in the deck %s\n", n_errors, n_errors == 1 ? "" : "s",
                    path ? path : "(none)");
        fflush(stderr);
    }
    comm_bcast_bytes(&n_errors, sizeof n_errors);
    if (n_errors > 0) {
        comm_finalize();
        exit(ALDIT_EXIT_USAGE);
    }
    comm_bcast_bytes(config, sizeof *config);
}

void deck_print(const deck *config, FILE *out)
{
    fprintf(out, "; aldit deck: resolved configuration%s%s\n", config->source[0] ? " of " : "", config->source);
    const char *section = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        const deck_key *key = &deck_keys[i];
        if (!section || strcmp(section, key->section) != 0) {
            section = key->section;
            fprintf(out, "\n[%s]\n", section);
        }
        char value[DECK_PATH_MAX + 32];
        format_value(config, key, value, sizeof value);
        fprintf(out, "%-16s =%s%s\n", key->name, value[0] ? " " : "", value);
    }
}

/* "integer in [1, 65536] or auto", "one of: a, b", ... */
static void describe_type(const deck_key *key, char *text, size_t text_size)
{
    static const char *const type_names[] = {
        [KEY_INT] = "integer", [KEY_INT64] = "integer", [KEY_UINT64] = "integer", [KEY_DOUBLE] = "number",
        [KEY_BYTES] = "bytes", [KEY_BOOL] = "boolean", [KEY_STRING] = "string", [KEY_ENUM] = "one of",
        [KEY_REAL_LIST] = "list"};
    char detail[128];
    switch (key->type) {
    case KEY_INT: case KEY_INT64: case KEY_DOUBLE: case KEY_BYTES:
        describe_range(key, detail, sizeof detail);
        snprintf(text, text_size, "%s in %s%s%s%s%s", type_names[key->type], detail, key->zero_word ? " or " : "",
                 key->zero_word ? key->zero_word : "", key->one_word ? " or " : "", key->one_word ? key->one_word : "");
        break;
    case KEY_UINT64:
        snprintf(text, text_size, "integer in [0, 2^64)");
        break;
    case KEY_ENUM:
        describe_choices(key, detail, sizeof detail);
        snprintf(text, text_size, "one of: %s", detail);
        break;
    case KEY_STRING:
        snprintf(text, text_size, "%s", key->nonempty ? "string, not empty" : "string");
        break;
    case KEY_BOOL:
        snprintf(text, text_size, "%s", type_names[key->type]);
        break;
    case KEY_REAL_LIST:
        describe_range(key, detail, sizeof detail);
        snprintf(text, text_size, "list of 1 to %d numbers in %s", DECK_LIST_MAX, detail);
        break;
    }
}

void deck_print_help(FILE *out)
{
    const char *section = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        const deck_key *key = &deck_keys[i];
        if (!section || strcmp(section, key->section) != 0) {
            section = key->section;
            fprintf(out, "\n[%s]\n", section);
        }
        char type[192];
        describe_type(key, type, sizeof type);
        const char *family = key->family_default[FAMILY_HUNYUANVIDEO15];
        fprintf(out, "  %s.%s = %s%s%s%s\n      %s; %s\n", key->section, key->name, key->default_text,
                family ? " (model.family = hunyuanvideo15: " : "", family ? family : "", family ? ")" : "", key->help, type);
    }
}

void deck_print_reference(FILE *out)
{
    const char *section = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        const deck_key *key = &deck_keys[i];
        if (!section || strcmp(section, key->section) != 0) {
            section = key->section;
            fprintf(out, "%s| key | default | type | meaning |\n|---|---|---|---|\n", i ? "\n" : "");
        }
        char type[192];
        describe_type(key, type, sizeof type);
        const char *family = key->family_default[FAMILY_HUNYUANVIDEO15];
        fprintf(out, "| `%s.%s` | %s%s%s%s%s%s | %s | %s |\n", key->section, key->name, key->default_text[0] ? "`" : "",
                key->default_text[0] ? key->default_text : "(empty)", key->default_text[0] ? "`" : "",
                family ? " (hunyuanvideo15: `" : "", family ? family : "", family ? "`)" : "", type, key->help);
    }
}

const char *deck_strategy_name(deck_strategy strategy) { return strategy_names[strategy]; }
const char *deck_device_name(deck_device device) { return device_names[device]; }
const char *deck_family_name(deck_family family) { return family_names[family]; }
const char *deck_recompute_name(deck_recompute recompute) { return recompute_names[recompute]; }
const char *deck_shard_name(deck_shard shard) { return shard_names[shard]; }
const char *deck_text_padding_name(deck_text_padding padding) { return text_padding_names[padding]; }
const char *deck_attention_name(deck_attention attention) { return attention_names[attention]; }
