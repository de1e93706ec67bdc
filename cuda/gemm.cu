// gemm.cu — linear layers on cuBLASLt with bias / GELU epilogues and fp32 weight gradients, and the kernels that stand in for an epilogue.
//
// The layouts (row-major tensors as column-major cuBLASLt matrices) are worked out in gemm.h. Each
// call builds or finds a plan (matmul descriptor, A/B/D layouts, the heuristic's algorithms: with autotuning the
// fastest of them timed on the plan's first call, else the first), sets the per-call pointer attributes (bias /
// bias gradient, GELU aux) on the cached descriptor and calls cublasLtMatmul with its stream's 32 MiB workspace
// (a lane per stream, so that calls on different streams can run at once). All of it lives in the caller's
// gemm_context.
#include "cuda/gemm.h"

#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

#include "cuda/bf16vec.cuh"
#include "cuda/gelu.cuh"
#include "cuda/colsum.cuh"

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommended workspace on Hopper
constexpr int kLanes = 4;        // streams with a workspace of their own
constexpr int kPlanSlots = 512;  // per context: a few dozen layer shapes times the row counts in use
constexpr int kPlanProbe = 8;    // slots looked at from a key's hash before the least recently used goes
constexpr int kTuneCandidates = 8;  // algorithms the heuristic is asked for when autotuning
constexpr int kTuneRounds = 5;      // timed rounds over the candidates (after an untimed one); each one's least counts
constexpr float kTuneMargin = 0.02f;  // another candidate replaces the heuristic's first only when this much faster
constexpr int kColsumVecs = 32;   // column-sum block: 32 threads x one 16-byte vector (8 columns) wide,
constexpr int kColsumLanes = 8;   // 8 row lanes deep,
constexpr int kColsumUnroll = 4;  // each lane with this many rows' loads in flight
constexpr int kColsumBlocksPerSm = 8;       // the grid aims at this many blocks per SM (2048 threads)
constexpr int64_t kColsumMinChunkRows = 64;  // rows of a chunk at the least (the partials stay small)
static_assert(kColsumLanes == kVecElems, "a column-sum block finishes one column of each vector per lane");
constexpr int kElementwiseThreads = 256;
constexpr int kElementwiseMaxBlocks = 4096;

enum GemmKind { kForward = 0, kBackwardData = 1, kBackwardWeight = 2, kFp8Forward = 3, kFp8BackwardData = 4,
                kFp8BackwardWeight = 5, kFp8ForwardFp8Out = 6, kKinds = 7 };
const char *const kKindNames[kKinds] = {"forward (y = x W^T)", "backward data (dx = dy W)",
                                        "backward weight (dW = dy^T x)", "FP8 forward (y = x W^T, E4M3 x E4M3)",
                                        "FP8 backward data (dx = dy W, E5M2 x E4M3 W^T)",
                                        "FP8 backward weight (dW = dy^T x, E4M3 x^T x E5M2 dy^T)",
                                        "FP8 forward with E4M3 output (y8 = x W^T, E4M3 x E4M3 -> E4M3)"};
bool is_fp8(int kind) { return kind >= kFp8Forward; }
bool writes_fp32(int kind) { return kind == kBackwardWeight || kind == kFp8BackwardWeight; }
bool writes_fp8(int kind) { return kind == kFp8ForwardFp8Out; }

struct PlanKey {
    int kind;
    cublasLtEpilogue_t epilogue;
    int64_t m, n, k;
    uint32_t align_a, align_b, align_d, align_bias, align_aux;  // bytes, capped at 256
};

struct Plan {
    PlanKey key;
    bool used;       // slot holds a plan
    bool supported;  // the heuristic found an algorithm (else the descriptors are not kept)
    cublasStatus_t heuristic_status;
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatrixLayout_t c;   // C's: d's own handle, but bf16 where D is FP8 (C is then the aux matrix, unread)
    cublasLtMatmulAlgo_t algo;  // the one that runs
    cublasLtMatmulAlgo_t candidates[kTuneCandidates];  // the heuristic's, best guess first
    int n_candidates;
    bool tuned;  // the candidates were timed (or there was nothing to choose)
};

// A stream's workspace and scratch: calls on different streams can run at once. A stream beyond the kLanes
// most recently used ones takes over the least recently used lane, after that lane's last call.
struct Lane {
    cudaStream_t stream;
    void *workspace;  // NULL: the lane is not in use yet
    float *scratch;   // bias-gradient staging and column-sum partials
    size_t scratch_floats;
    cudaEvent_t done;  // recorded after each call on the lane
    bool has_done;
    uint64_t last_use;
};

}  // namespace

// A context: one device's handle, lanes, plans and counters, and how its plans are made.
struct gemm_context {
    int device;          // the GPU current at gemm_create
    bool autotune;       // plans time the heuristic's candidates (gemm_create)
    bool fused;          // epilogues inside cuBLASLt where it has an algorithm (gemm_create)
    bool warned[kKinds];  // a missing fused algorithm was reported, per GEMM kind
    cublasLtHandle_t handle;
    Lane lanes[kLanes];
    Lane *lane;  // the current call's (begin_call .. end_call)
    cudaEvent_t tune_marks[kTuneCandidates + 1];  // a tuning round: before the first candidate, after each
    Plan *plans;
    uint64_t clock;
    gemm_stats stats;
};

namespace {

using Device = gemm_context;

bool same_key(const PlanKey &a, const PlanKey &b)
{
    return a.kind == b.kind && a.epilogue == b.epilogue && a.m == b.m && a.n == b.n && a.k == b.k &&
           a.align_a == b.align_a && a.align_b == b.align_b && a.align_d == b.align_d &&
           a.align_bias == b.align_bias && a.align_aux == b.align_aux;
}

uint64_t hash_key(const PlanKey &key)
{
    const uint64_t words[] = {(uint64_t)key.kind, (uint64_t)key.epilogue, (uint64_t)key.m, (uint64_t)key.n,
                              (uint64_t)key.k, key.align_a | (uint64_t)key.align_b << 16 | (uint64_t)key.align_d << 32,
                              key.align_bias | (uint64_t)key.align_aux << 16};
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t w : words) {
        h ^= w;
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

// Largest power of two dividing the address, capped at 256 (what cuBLASLt's alignment preferences take).
uint32_t alignment_of(const void *pointer)
{
    const uintptr_t address = (uintptr_t)pointer;
    if (address == 0) return 256;
    const uintptr_t lowest = address & (~address + 1);
    return lowest >= 256 ? 256u : (uint32_t)lowest;
}

bool epilogue_has_bias(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

bool epilogue_has_aux(cublasLtEpilogue_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

const char *epilogue_name(cublasLtEpilogue_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
    }
}

// The context of a call, which must run on the context's GPU.
Device &context_of(gemm_context *context, const char *call)
{
    ALDIT_CHECK(context != NULL, "%s: no gemm_context", call);
    int id = 0;
    CUDA_CHECK(cudaGetDevice(&id));
    ALDIT_CHECK(id == context->device, "%s: the gemm_context was made on GPU %d, called on GPU %d", call,
                context->device, id);
    return *context;
}

// The lane of `stream` (a new one, or the least recently used one, when the stream has none): a stream that takes
// a lane over waits for the lane's last call on its previous stream.
void begin_call(Device &dev, cudaStream_t stream)
{
    Lane *lane = NULL, *oldest = &dev.lanes[0];
    for (Lane &candidate : dev.lanes) {
        if (candidate.workspace && candidate.stream == stream) {
            lane = &candidate;
            break;
        }
        if (candidate.last_use < oldest->last_use) oldest = &candidate;
    }
    if (!lane) {
        lane = oldest;
        if (!lane->workspace) {
            CUDA_CHECK(cudaMalloc(&lane->workspace, kWorkspaceBytes));
            CUDA_CHECK(cudaEventCreateWithFlags(&lane->done, cudaEventDisableTiming));
        } else if (lane->has_done) {
            CUDA_CHECK(cudaStreamWaitEvent(stream, lane->done, 0));
        }
        lane->stream = stream;
    }
    lane->last_use = ++dev.clock;
    dev.lane = lane;
}

void end_call(Device &dev)
{
    CUDA_CHECK(cudaEventRecord(dev.lane->done, dev.lane->stream));
    dev.lane->has_done = true;
    dev.lane = NULL;
}

// The current lane's scratch, at least n_floats long.
float *scratch_floats(Device &dev, size_t n_floats)
{
    Lane &lane = *dev.lane;
    if (lane.scratch_floats < n_floats) {
        if (lane.scratch) {
            CUDA_CHECK(cudaDeviceSynchronize());  // rare: only when a wider layer or more rows come along
            CUDA_CHECK(cudaFree(lane.scratch));
        }
        const size_t grown = n_floats > 2 * lane.scratch_floats ? n_floats : 2 * lane.scratch_floats;
        CUDA_CHECK(cudaMalloc(&lane.scratch, grown * sizeof(float)));
        lane.scratch_floats = grown;
    }
    return lane.scratch;
}

void destroy_plan(Plan &plan)
{
    if (plan.used && plan.supported) {
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.a));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.b));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.d));
        if (plan.c != plan.d) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.c));
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
    }
    memset(&plan, 0, sizeof plan);
}

// Sizes and types of the three GEMM kinds (gemm.h has the mapping): A stored k x m when transposed
// (forward: the weight), else m x k; B stored n x k when transposed (dW: dy), else k x n; D m x n.
void build_plan(Device &dev, const PlanKey &key, const void *bias, const void *aux, Plan &plan)
{
    // FP8 on Hopper takes only TN (both operands contiguous along k): the callers pass W^T, x^T, dy^T copies
    const bool fp8 = is_fp8(key.kind);
    const cublasOperation_t trans_a = key.kind == kForward || fp8 ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t trans_b = key.kind == kBackwardWeight ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cudaDataType_t d_type = writes_fp32(key.kind) ? CUDA_R_32F : writes_fp8(key.kind) ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    const cudaDataType_t a_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    const cudaDataType_t b_type =
        key.kind == kFp8Forward || key.kind == kFp8ForwardFp8Out ? CUDA_R_8F_E4M3 : fp8 ? CUDA_R_8F_E5M2 : CUDA_R_16BF;
    plan.key = key;
    plan.used = true;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue,
                                                sizeof key.epilogue));
    if (fp8) {  // fast accumulation in the forward and dgrad; off for wgrad (its k, the rows, is long)
        const int8_t fast = key.kind != kFp8BackwardWeight;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        // bf16 bias and GELU aux as in the bf16 GEMMs (FP8 defaults could differ): said, not assumed
        const cudaDataType_t bf16 = CUDA_R_16BF;
        if (epilogue_has_bias(key.epilogue))
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf16, sizeof bf16));
        if (epilogue_has_aux(key.epilogue))
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &bf16,
                                                        sizeof bf16));
        // the heuristic sees the scale (and amax) pointers set, as every call sets them (run_plan): a valid device
        // address stands in for them here (it is not read)
        const void *stand_in = dev.lane->workspace;
        const cublasLtMatmulDescAttributes_t pointers[] = {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                           CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                           CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
                                                           CUBLASLT_MATMUL_DESC_AMAX_D_POINTER};
        for (int p = 0; p < (writes_fp8(key.kind) ? 4 : 2); ++p)
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, pointers[p], &stand_in, sizeof stand_in));
    }
    // The heuristic reads the bias and aux pointers' alignment (not their contents): set the real ones.
    if (epilogue_has_bias(key.epilogue))
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epilogue_has_aux(key.epilogue)) {
        const int64_t aux_ld = key.m;  // the aux matrix has D's layout
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                    sizeof aux_ld));
    }
    const uint64_t a_rows = trans_a == CUBLAS_OP_T ? key.k : key.m, a_cols = trans_a == CUBLAS_OP_T ? key.m : key.k;
    const uint64_t b_rows = trans_b == CUBLAS_OP_T ? key.n : key.k, b_cols = trans_b == CUBLAS_OP_T ? key.k : key.n;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, a_type, a_rows, a_cols, (int64_t)a_rows));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, b_type, b_rows, b_cols, (int64_t)b_rows));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, d_type, (uint64_t)key.m, (uint64_t)key.n, key.m));
    plan.c = plan.d;
    if (writes_fp8(key.kind))  // an FP8 D takes a bf16 C (cuBLASLt's FP8 rules)
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_16BF, (uint64_t)key.m, (uint64_t)key.n, key.m));

    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace_bytes = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes));
    const struct {
        cublasLtMatmulPreferenceAttributes_t attribute;
        uint32_t bytes;
    } alignments[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto &alignment : alignments)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, alignment.attribute, &alignment.bytes,
                                                          sizeof alignment.bytes));
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates];
    memset(results, 0, sizeof results);
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(dev.handle, plan.desc, plan.a, plan.b, plan.c,
                                                                 plan.d, preference, dev.autotune ? kTuneCandidates : 1,
                                                                 results, &returned);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    dev.stats.heuristic_queries += 1;
    plan.heuristic_status = status == CUBLAS_STATUS_SUCCESS && returned > 0 ? results[0].state : status;
    if (status == CUBLAS_STATUS_SUCCESS)
        for (int r = 0; r < returned; ++r)
            if (results[r].state == CUBLAS_STATUS_SUCCESS) plan.candidates[plan.n_candidates++] = results[r].algo;
    plan.supported = plan.n_candidates > 0;
    if (plan.supported) {
        plan.algo = plan.candidates[0];
        plan.tuned = plan.n_candidates == 1;
    } else {
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.a));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.b));
        CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.d));
        if (plan.c != plan.d) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(plan.c));
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(plan.desc));
    }
}

// Autotuning, on a plan's first call: each of the heuristic's candidates runs on this call's operands (pointer
// attributes already set), kTuneRounds times after an untimed round, and the fastest (by its least time) becomes
// the plan's algorithm, the heuristic's first unless another beats it by kTuneMargin. The runs write D (and a
// GELU aux or bias gradient) as the call itself is about to; where the call adds into D (beta != 0), they run on
// a copy of D instead, and when that copy does not fit in device memory the heuristic's first choice stays.
void tune_plan(Device &dev, Plan &plan, const void *a, const void *b, float beta, void *d, const void *c_other,
               cudaStream_t stream)
{
    plan.tuned = true;
    void *target = d, *copy = NULL;
    if (beta != 0.0f) {
        const size_t d_bytes = (size_t)plan.key.m * (size_t)plan.key.n *
                               (writes_fp32(plan.key.kind) ? sizeof(float) : sizeof(gpu_bf16));
        if (cudaMalloc(&copy, d_bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // clear the allocation failure: tuning is optional
            dev.stats.untuned += 1;
            return;
        }
        CUDA_CHECK(cudaMemcpyAsync(copy, d, d_bytes, cudaMemcpyDeviceToDevice, stream));
        target = copy;
    }
    // Rounds over all candidates in turn, so that a drift of the clocks during the tuning weighs on each alike.
    const float alpha = 1.0f;
    float least_ms[kTuneCandidates];
    bool refused[kTuneCandidates] = {};
    for (int round = 0; round <= kTuneRounds; ++round) {
        CUDA_CHECK(cudaEventRecord(dev.tune_marks[0], stream));
        for (int c = 0; c < plan.n_candidates; ++c) {
            if (!refused[c])
                refused[c] = cublasLtMatmul(dev.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta,
                                            c_other ? c_other : target, plan.c, target, plan.d, &plan.candidates[c],
                                            dev.lane->workspace, kWorkspaceBytes, stream) != CUBLAS_STATUS_SUCCESS;
            CUDA_CHECK(cudaEventRecord(dev.tune_marks[c + 1], stream));
        }
        CUDA_CHECK(cudaEventSynchronize(dev.tune_marks[plan.n_candidates]));
        for (int c = 0; c < plan.n_candidates && round > 0; ++c) {
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, dev.tune_marks[c], dev.tune_marks[c + 1]));
            least_ms[c] = round == 1 || ms < least_ms[c] ? ms : least_ms[c];
        }
    }
    const int best = gpu_fastest_candidate(least_ms, refused, plan.n_candidates, kTuneMargin);
    plan.algo = plan.candidates[best];
    dev.stats.tuned += 1;
    dev.stats.tuned_not_first += best != 0;
    if (copy) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaFree(copy));
    }
}

// The cached plan for a GEMM, built on a miss; NULL when cuBLASLt has no algorithm for it and the
// caller can do without (a fused epilogue); fatal when `required`.
Plan *find_plan(Device &dev, int kind, cublasLtEpilogue_t epilogue, int64_t m, int64_t n, int64_t k, const void *a,
                const void *b, const void *d, const void *bias, const void *aux, bool required)
{
    PlanKey key;
    memset(&key, 0, sizeof key);
    key.kind = kind, key.epilogue = epilogue, key.m = m, key.n = n, key.k = k;
    key.align_a = alignment_of(a), key.align_b = alignment_of(b), key.align_d = alignment_of(d);
    key.align_bias = epilogue_has_bias(epilogue) ? alignment_of(bias) : 0;
    key.align_aux = epilogue_has_aux(epilogue) ? alignment_of(aux) : 0;
    const uint64_t first = hash_key(key) % kPlanSlots;
    Plan *victim = NULL;
    for (int probe = 0; probe < kPlanProbe; ++probe) {
        Plan &slot = dev.plans[(first + probe) % kPlanSlots];
        if (slot.used && same_key(slot.key, key)) {
            victim = &slot;
            break;
        }
        if (!victim || (victim->used && (!slot.used || slot.last_use < victim->last_use))) victim = &slot;
    }
    if (!victim->used || !same_key(victim->key, key)) {
        destroy_plan(*victim);
        build_plan(dev, key, bias, aux, *victim);
        if (!victim->supported) {
            const char *why = cublasLtGetStatusString(victim->heuristic_status);
            if (required)
                ALDIT_FATAL("gemm: cuBLASLt has no algorithm for the %s GEMM m=%lld n=%lld k=%lld, epilogue %s (%s "
                            "inputs, fp32 accumulation): %s", kKindNames[kind], (long long)m, (long long)n,
                            (long long)k, epilogue_name(epilogue), is_fp8(kind) ? "FP8" : "bf16", why);
            if (!dev.warned[kind])
                aldit_warn("gemm: cuBLASLt has no algorithm for epilogue %s in the %s GEMM m=%lld n=%lld k=%lld (%s); "
                           "running a plain GEMM and aldit's own kernel instead (said once)", epilogue_name(epilogue),
                           kKindNames[kind], (long long)m, (long long)n, (long long)k, why);
            dev.warned[kind] = true;
        }
    }
    victim->last_use = ++dev.clock;
    return victim->supported ? victim : NULL;
}

void run_plan(Device &dev, Plan &plan, const void *a, const void *b, float beta, void *d, const void *bias,
              const void *aux, cudaStream_t stream, const float *a_scale = NULL, const float *b_scale = NULL,
              const float *d_scale = NULL, float *d_amax = NULL)
{
    if (writes_fp8(plan.key.kind)) {  // D = fp8(d_scale * result); d_amax = max |result|
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &d_scale,
                                                    sizeof d_scale));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &d_amax,
                                                    sizeof d_amax));
    }
    if (is_fp8(plan.key.kind)) {  // D = (a_scale * b_scale) * op(A) op(B) (+ beta C) (+ bias): the operands' scale_inv
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                    sizeof a_scale));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                    sizeof b_scale));
    }
    if (epilogue_has_bias(plan.key.epilogue))
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epilogue_has_aux(plan.key.epilogue))
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof aux));
    // C: D itself, but where D is FP8 the (bf16, unread: beta = 0) aux matrix under C's own layout
    const void *c_other = writes_fp8(plan.key.kind) ? aux : NULL;
    if (!plan.tuned) tune_plan(dev, plan, a, b, beta, d, c_other, stream);
    const float alpha = 1.0f;
    const cublasStatus_t status = cublasLtMatmul(dev.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta,
                                                 c_other ? c_other : d, plan.c, d, plan.d, &plan.algo,
                                                 dev.lane->workspace, kWorkspaceBytes, stream);
    if (status != CUBLAS_STATUS_SUCCESS)  // which plan cuBLASLt declined, for the report
        fprintf(stderr, "aldit: cuBLASLt declined the %s GEMM m=%lld n=%lld k=%lld with epilogue %s (alignments %u/%u/%u "
                "bytes, beta %g)\n", kKindNames[plan.key.kind], (long long)plan.key.m, (long long)plan.key.n,
                (long long)plan.key.k, epilogue_name(plan.key.epilogue), (unsigned)plan.key.align_a,
                (unsigned)plan.key.align_b, (unsigned)plan.key.align_d, (double)beta);
    CUBLAS_CHECK(status);
    dev.stats.flops += 2.0 * (double)plan.key.m * (double)plan.key.n * (double)plan.key.k;
    dev.stats.gemms += 1;
}

void check_shape(const char *call, int64_t n_rows, int in_dim, int out_dim)
{
    ALDIT_CHECK(n_rows >= 0 && in_dim > 0 && out_dim > 0, "%s: bad shape n_rows=%lld in_dim=%d out_dim=%d", call,
                (long long)n_rows, in_dim, out_dim);
    ALDIT_CHECK(gemm_linear_supported(in_dim, out_dim),
                "%s: in_dim=%d and out_dim=%d must be multiples of 8 (bf16 leading dimensions that cuBLASLt's "
                "tensor-core kernels need 16-byte aligned)", call, in_dim, out_dim);
}

void check_aligned(const char *call, const char *name, const void *pointer)
{
    ALDIT_CHECK(pointer != NULL, "%s: %s is NULL", call, name);
    ALDIT_CHECK(alignment_of(pointer) >= 16, "%s: %s (%p) is not 16-byte aligned", call, name, pointer);
}

unsigned elementwise_blocks(int64_t n_items)
{
    return gpu_grid_blocks(n_items, kElementwiseThreads, kElementwiseMaxBlocks);
}

// ---- kernels standing in for the epilogues --------------------------------------------------------

// 16-byte vectors of 8 bf16 as 4 pairs.
union Vec8 {
    uint4 raw;
    __nv_bfloat162 pair[4];
};

// y = gelu_tanh(pre) over n_vecs vectors of 8.
__global__ void gelu_kernel(const uint4 *__restrict__ pre, uint4 *__restrict__ y, int64_t n_vecs)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        Vec8 v;
        v.raw = pre[i];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(v.pair[j]);
            v.pair[j] = __floats2bfloat162_rn(gelu_tanh(f.x), gelu_tanh(f.y));
        }
        y[i] = v.raw;
    }
}

// d[r, c] = d[r, c] + bias[c] (rounded to bf16 again), in place, over n_vecs vectors of 8 (row_vecs a row): where the
// FP8 GEMM has no bias epilogue.
__global__ void add_bias_kernel(uint4 *__restrict__ d, const uint4 *__restrict__ bias, int row_vecs, int64_t n_vecs)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        Vec8 v, b;
        v.raw = d[i];
        b.raw = bias[i % row_vecs];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 fv = __bfloat1622float2(v.pair[j]), fb = __bfloat1622float2(b.pair[j]);
            v.pair[j] = __floats2bfloat162_rn(fv.x + fb.x, fv.y + fb.y);
        }
        d[i] = v.raw;
    }
}

// d = d * gelu_tanh'(pre), in place, over n_vecs vectors of 8.
__global__ void dgelu_kernel(uint4 *__restrict__ d, const uint4 *__restrict__ pre, int64_t n_vecs)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vecs; i += (int64_t)gridDim.x * blockDim.x) {
        Vec8 g, p;
        g.raw = d[i];
        p.raw = pre[i];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 fg = __bfloat1622float2(g.pair[j]), fp = __bfloat1622float2(p.pair[j]);
            g.pair[j] = __floats2bfloat162_rn(fg.x * gelu_tanh_grad(fp.x), fg.y * gelu_tanh_grad(fp.y));
        }
        d[i] = g.raw;
    }
}

// Column sums, pass 1: block (kColsumVecs, kColsumLanes) sums the vectors (8 columns each)
// [kColsumVecs * blockIdx.x, +kColsumVecs) over the rows of chunk blockIdx.y: lane y takes rows y, y + 8,
// ... of the chunk, kColsumUnroll of them loaded before they are added (in row order), then the lanes are
// added in order; one partial per (chunk, column). A warp reads 512 contiguous bytes of a row.
__global__ void __launch_bounds__(kColsumVecs *kColsumLanes)
    colsum_partial_kernel(const uint4 *__restrict__ dy, int64_t n_rows, int nvec, int64_t rows_per_chunk,
                          float *__restrict__ partials)
{
    __shared__ float lanes[kColsumLanes][kColsumVecs][kVecElems + 1];  // +1: no bank conflicts on the sum
    const int vec = blockIdx.x * kColsumVecs + threadIdx.x;
    const int64_t begin = blockIdx.y * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < n_rows ? begin + rows_per_chunk : n_rows;
    float sum[kVecElems] = {};
    if (vec < nvec) {
        int64_t r = begin + threadIdx.y;
        for (; r + (kColsumUnroll - 1) * kColsumLanes < end; r += kColsumUnroll * kColsumLanes) {
            uint4 v[kColsumUnroll];
#pragma unroll
            for (int u = 0; u < kColsumUnroll; ++u) v[u] = dy[(r + u * kColsumLanes) * nvec + vec];
#pragma unroll
            for (int u = 0; u < kColsumUnroll; ++u) {
                float f[kVecElems];
                unpack8(v[u], f);
#pragma unroll
                for (int j = 0; j < kVecElems; ++j) sum[j] += f[j];
            }
        }
        for (; r < end; r += kColsumLanes) {
            float f[kVecElems];
            unpack8(dy[r * nvec + vec], f);
#pragma unroll
            for (int j = 0; j < kVecElems; ++j) sum[j] += f[j];
        }
    }
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) lanes[threadIdx.y][threadIdx.x][j] = sum[j];
    __syncthreads();
    // thread (x, y) finishes column j = y of vector x: the lanes added in order
    const int j = threadIdx.y;
    if (vec < nvec) {
        float total = 0.0f;
#pragma unroll
        for (int lane = 0; lane < kColsumLanes; ++lane) total += lanes[lane][threadIdx.x][j];
        partials[blockIdx.y * (int64_t)nvec * kVecElems + (int64_t)vec * kVecElems + j] = total;
    }
}

// out[c] (+)= the n_chunks partials of column c (column_partials_kernel's fixed order).
void launch_colsum_final(const float *partials, int n_chunks, int cols, float *out, int accumulate,
                         cudaStream_t stream)
{
    column_partials_kernel<<<(cols + kPartialColumns - 1) / kPartialColumns, kPartialThreads, 0, stream>>>(
        partials, n_chunks, cols, out, accumulate);
    CUDA_CHECK_LAUNCH();
}

// out (+)= column sums of the bf16 [n_rows, cols] matrix (n_rows > 0, cols a multiple of 8, dy 16-byte
// aligned), deterministic: the chunking depends only on the shape and the device's SM count.
void column_sums(Device &dev, const gpu_bf16 *dy, int64_t n_rows, int cols, float *out, int accumulate,
                 cudaStream_t stream)
{
    const int nvec = cols / kVecElems;
    const int64_t column_blocks = (nvec + kColsumVecs - 1) / kColsumVecs;
    const int64_t wanted =
        ((int64_t)gpu_attribute(cudaDevAttrMultiProcessorCount) * kColsumBlocksPerSm + column_blocks - 1) / column_blocks;
    const int64_t most = (n_rows + kColsumMinChunkRows - 1) / kColsumMinChunkRows;
    int64_t n_chunks = wanted < most ? wanted : most;
    if (n_chunks < 1) n_chunks = 1;
    const int64_t rows_per_chunk = (n_rows + n_chunks - 1) / n_chunks;
    n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
    float *partials = scratch_floats(dev, (size_t)n_chunks * (size_t)cols);
    const dim3 block(kColsumVecs, kColsumLanes);
    const dim3 grid((unsigned)column_blocks, (unsigned)n_chunks);
    colsum_partial_kernel<<<grid, block, 0, stream>>>((const uint4 *)dy, n_rows, nvec, rows_per_chunk, partials);
    CUDA_CHECK_LAUNCH();
    launch_colsum_final(partials, (int)n_chunks, cols, out, accumulate, stream);
}

}  // namespace

extern "C" int gemm_linear_supported(int in_dim, int out_dim)
{
    return in_dim > 0 && out_dim > 0 && in_dim % 8 == 0 && out_dim % 8 == 0;
}

extern "C" double gemm_linear_flops(int64_t n_rows, int in_dim, int out_dim)
{
    return 2.0 * (double)n_rows * (double)in_dim * (double)out_dim;
}

extern "C" void gemm_linear_fwd(gemm_context *context, const gpu_bf16 *x, int64_t n_rows, int in_dim, int out_dim,
                                const gpu_bf16 *weight, const gpu_bf16 *bias, gemm_epilogue epilogue, gpu_bf16 *y,
                                gpu_bf16 *pre_gelu, cudaStream_t stream)
{
    static const char call[] = "gemm_linear_fwd";
    check_shape(call, n_rows, in_dim, out_dim);
    ALDIT_CHECK(epilogue == GEMM_EPILOGUE_NONE || epilogue == GEMM_EPILOGUE_BIAS ||
                epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS, "%s: unknown epilogue %d", call, (int)epilogue);
    const bool gelu = epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS;
    ALDIT_CHECK(gelu == (pre_gelu != NULL), "%s: pre_gelu must be given with GEMM_EPILOGUE_GELU_AUX_BIAS and only "
                "then", call);
    check_aligned(call, "x", x), check_aligned(call, "weight", weight), check_aligned(call, "y", y);
    if (epilogue != GEMM_EPILOGUE_NONE) check_aligned(call, "bias", bias);
    if (gelu) check_aligned(call, "pre_gelu", pre_gelu);
    if (n_rows == 0) return;

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    const int64_t m = out_dim, n = n_rows, k = in_dim;
    bool done = false;
    if (gelu && dev.fused) {
        Plan *plan = find_plan(dev, kForward, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, m, n, k, weight, x, y, bias, pre_gelu,
                               false);
        if (plan) run_plan(dev, *plan, weight, x, 0.0f, y, bias, pre_gelu, stream), done = true;
        else dev.stats.unfused += 1;
    }
    if (!done) {
        // Plain or bias epilogue; for GELU the biased product goes to pre_gelu and the kernel makes y.
        gpu_bf16 *d = gelu ? pre_gelu : y;
        const cublasLtEpilogue_t e = epilogue == GEMM_EPILOGUE_NONE ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_BIAS;
        Plan *plan = find_plan(dev, kForward, e, m, n, k, weight, x, d, bias, NULL, true);
        run_plan(dev, *plan, weight, x, 0.0f, d, bias, NULL, stream);
        if (gelu) {
            const int64_t n_vecs = n_rows * out_dim / 8;
            gelu_kernel<<<elementwise_blocks(n_vecs), kElementwiseThreads, 0, stream>>>((const uint4 *)pre_gelu,
                                                                                       (uint4 *)y, n_vecs);
            CUDA_CHECK_LAUNCH();
        }
    }
    end_call(dev);
}

extern "C" void gemm_linear_bwd_data(gemm_context *context, const gpu_bf16 *dy, int64_t n_rows, int in_dim,
                                     int out_dim, const gpu_bf16 *weight, const gpu_bf16 *gelu_input, gpu_bf16 *dx,
                                     int accumulate_dx, cudaStream_t stream)
{
    static const char call[] = "gemm_linear_bwd_data";
    check_shape(call, n_rows, in_dim, out_dim);
    check_aligned(call, "dy", dy), check_aligned(call, "weight", weight), check_aligned(call, "dx", dx);
    if (gelu_input) check_aligned(call, "gelu_input", gelu_input);
    ALDIT_CHECK(!(gelu_input && accumulate_dx), "%s: accumulate_dx cannot be combined with gelu_input", call);
    if (n_rows == 0) return;

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    const int64_t m = in_dim, n = n_rows, k = out_dim;
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    bool done = false;
    if (gelu_input && dev.fused) {
        Plan *plan = find_plan(dev, kBackwardData, CUBLASLT_EPILOGUE_DGELU, m, n, k, weight, dy, dx, NULL, gelu_input,
                               false);
        if (plan) run_plan(dev, *plan, weight, dy, beta, dx, NULL, gelu_input, stream), done = true;
        else dev.stats.unfused += 1;
    }
    if (!done) {
        Plan *plan = find_plan(dev, kBackwardData, CUBLASLT_EPILOGUE_DEFAULT, m, n, k, weight, dy, dx, NULL, NULL, true);
        run_plan(dev, *plan, weight, dy, beta, dx, NULL, NULL, stream);
        if (gelu_input) {
            const int64_t n_vecs = n_rows * in_dim / 8;
            dgelu_kernel<<<elementwise_blocks(n_vecs), kElementwiseThreads, 0, stream>>>((uint4 *)dx,
                                                                                        (const uint4 *)gelu_input, n_vecs);
            CUDA_CHECK_LAUNCH();
        }
    }
    end_call(dev);
}

extern "C" void gemm_linear_bwd_weight(gemm_context *context, const gpu_bf16 *x, const gpu_bf16 *dy,
                                       int64_t n_rows, int in_dim, int out_dim, float *dweight, float *dbias,
                                       int accumulate, cudaStream_t stream)
{
    static const char call[] = "gemm_linear_bwd_weight";
    check_shape(call, n_rows, in_dim, out_dim);
    check_aligned(call, "x", x), check_aligned(call, "dy", dy), check_aligned(call, "dweight", dweight);
    if (dbias) check_aligned(call, "dbias", dbias);

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    if (n_rows == 0) {  // an empty sum: zero when overwriting, nothing to add otherwise
        if (!accumulate) {
            CUDA_CHECK(cudaMemsetAsync(dweight, 0, (size_t)out_dim * (size_t)in_dim * sizeof *dweight, stream));
            if (dbias) CUDA_CHECK(cudaMemsetAsync(dbias, 0, (size_t)out_dim * sizeof *dbias, stream));
        }
        end_call(dev);
        return;
    }
    const int64_t m = in_dim, n = out_dim, k = n_rows;
    const float beta = accumulate ? 1.0f : 0.0f;
    Plan *plan = find_plan(dev, kBackwardWeight, CUBLASLT_EPILOGUE_DEFAULT, m, n, k, x, dy, dweight, NULL, NULL, true);
    run_plan(dev, *plan, x, dy, beta, dweight, NULL, NULL, stream);
    if (dbias) column_sums(dev, dy, n_rows, out_dim, dbias, accumulate, stream);
    end_call(dev);
}

// ---- FP8 (gemm.h's FP8 section) ------------------------------------------------------------------------

namespace {

void check_fp8_shape(const char *call, int64_t n_rows, int in_dim, int out_dim)
{
    ALDIT_CHECK(n_rows >= 0 && gemm_fp8_supported(in_dim, out_dim),
                "%s: n_rows=%lld in_dim=%d out_dim=%d: FP8 GEMMs need in_dim and out_dim multiples of 16", call,
                (long long)n_rows, in_dim, out_dim);
}

// A scale or amax pointer of an FP8 GEMM: cuBLASLt's FP8 kernels decline one not 16-byte aligned (status 15 on every
// algorithm the heuristic offers; H200, cuBLASLt 13.1), so it is refused here by name.
void check_scale(const char *call, const char *name, const float *pointer)
{
    ALDIT_CHECK(pointer != NULL, "%s: %s is NULL", call, name);
    ALDIT_CHECK((uintptr_t)pointer % 16 == 0, "%s: %s (%p) is not 16-byte aligned (cuBLASLt's FP8 kernels decline it; "
                "fp8.h's pointers are)", call, name, (const void *)pointer);
}

}  // namespace

extern "C" int gemm_fp8_supported(int in_dim, int out_dim)
{
    return in_dim > 0 && out_dim > 0 && in_dim % 16 == 0 && out_dim % 16 == 0;
}

extern "C" int64_t gemm_fp8_padded_rows(int64_t n_rows)
{
    return (n_rows + 15) / 16 * 16;
}

extern "C" void gemm_fp8_fwd(gemm_context *context, const uint8_t *x8, const float *x_scale_inv, int64_t n_rows,
                             int in_dim, int out_dim, const uint8_t *w8, const float *w_scale_inv, const gpu_bf16 *bias,
                             gemm_epilogue epilogue, gpu_bf16 *y, gpu_bf16 *pre_gelu, cudaStream_t stream)
{
    static const char call[] = "gemm_fp8_fwd";
    check_fp8_shape(call, n_rows, in_dim, out_dim);
    ALDIT_CHECK(epilogue == GEMM_EPILOGUE_BIAS || epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS,
                "%s: epilogue %d (BIAS or GELU_AUX_BIAS)", call, (int)epilogue);
    const bool gelu = epilogue == GEMM_EPILOGUE_GELU_AUX_BIAS;
    ALDIT_CHECK(gelu == (pre_gelu != NULL), "%s: pre_gelu must be given with GEMM_EPILOGUE_GELU_AUX_BIAS and only "
                "then", call);
    check_aligned(call, "x8", x8), check_aligned(call, "w8", w8), check_aligned(call, "y", y);
    check_aligned(call, "bias", bias);
    check_scale(call, "x_scale_inv", x_scale_inv), check_scale(call, "w_scale_inv", w_scale_inv);
    if (gelu) check_aligned(call, "pre_gelu", pre_gelu);
    if (n_rows == 0) return;

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    const int64_t m = out_dim, n = n_rows, k = in_dim;
    bool done = false;
    if (gelu && dev.fused) {
        Plan *plan = find_plan(dev, kFp8Forward, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, m, n, k, w8, x8, y, bias, pre_gelu,
                               false);
        if (plan) run_plan(dev, *plan, w8, x8, 0.0f, y, bias, pre_gelu, stream, w_scale_inv, x_scale_inv), done = true;
        else dev.stats.unfused += 1;
    }
    if (!done) {
        // the bias epilogue, else (no FP8 algorithm for it here) the plain GEMM and the bias added by our kernel
        gpu_bf16 *d = gelu ? pre_gelu : y;
        Plan *plan = find_plan(dev, kFp8Forward, CUBLASLT_EPILOGUE_BIAS, m, n, k, w8, x8, d, bias, NULL, false);
        if (plan) {
            run_plan(dev, *plan, w8, x8, 0.0f, d, bias, NULL, stream, w_scale_inv, x_scale_inv);
        } else {
            dev.stats.unfused += 1;
            plan = find_plan(dev, kFp8Forward, CUBLASLT_EPILOGUE_DEFAULT, m, n, k, w8, x8, d, NULL, NULL, true);
            run_plan(dev, *plan, w8, x8, 0.0f, d, NULL, NULL, stream, w_scale_inv, x_scale_inv);
            const int64_t n_vecs = n_rows * out_dim / 8;
            add_bias_kernel<<<elementwise_blocks(n_vecs), kElementwiseThreads, 0, stream>>>(
                (uint4 *)d, (const uint4 *)bias, out_dim / 8, n_vecs);
            CUDA_CHECK_LAUNCH();
        }
        if (gelu) {
            const int64_t n_vecs = n_rows * out_dim / 8;
            gelu_kernel<<<elementwise_blocks(n_vecs), kElementwiseThreads, 0, stream>>>((const uint4 *)pre_gelu,
                                                                                       (uint4 *)y, n_vecs);
            CUDA_CHECK_LAUNCH();
        }
    }
    end_call(dev);
}

extern "C" int gemm_fp8_fwd_gelu_fp8(gemm_context *context, const uint8_t *x8, const float *x_scale_inv,
                                     int64_t n_rows, int in_dim, int out_dim, const uint8_t *w8,
                                     const float *w_scale_inv, const gpu_bf16 *bias, const float *y_scale, uint8_t *y8,
                                     gpu_bf16 *pre_gelu, float *y_amax, cudaStream_t stream)
{
    static const char call[] = "gemm_fp8_fwd_gelu_fp8";
    check_fp8_shape(call, n_rows, in_dim, out_dim);
    check_aligned(call, "x8", x8), check_aligned(call, "w8", w8), check_aligned(call, "y8", y8);
    check_aligned(call, "bias", bias), check_aligned(call, "pre_gelu", pre_gelu);
    check_scale(call, "x_scale_inv", x_scale_inv), check_scale(call, "w_scale_inv", w_scale_inv);
    check_scale(call, "y_scale", y_scale), check_scale(call, "y_amax", y_amax);
    Device &dev = context_of(context, call);
    if (!dev.fused) return 0;
    if (n_rows == 0) {
        CUDA_CHECK(cudaMemsetAsync(y_amax, 0, sizeof *y_amax, stream));
        return 1;
    }
    begin_call(dev, stream);
    Plan *plan = find_plan(dev, kFp8ForwardFp8Out, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, out_dim, n_rows, in_dim, w8, x8, y8,
                           bias, pre_gelu, false);
    if (plan) run_plan(dev, *plan, w8, x8, 0.0f, y8, bias, pre_gelu, stream, w_scale_inv, x_scale_inv, y_scale, y_amax);
    else dev.stats.unfused += 1;
    end_call(dev);
    return plan != NULL;
}

extern "C" void gemm_fp8_bwd_data(gemm_context *context, const uint8_t *dy8, const float *dy_scale_inv, int64_t n_rows,
                                  int in_dim, int out_dim, const uint8_t *wt8, const float *w_scale_inv,
                                  const gpu_bf16 *gelu_input, gpu_bf16 *dx, int accumulate_dx, cudaStream_t stream)
{
    static const char call[] = "gemm_fp8_bwd_data";
    check_fp8_shape(call, n_rows, in_dim, out_dim);
    check_aligned(call, "dy8", dy8), check_aligned(call, "wt8", wt8), check_aligned(call, "dx", dx);
    if (gelu_input) check_aligned(call, "gelu_input", gelu_input);
    check_scale(call, "dy_scale_inv", dy_scale_inv), check_scale(call, "w_scale_inv", w_scale_inv);
    ALDIT_CHECK(!(gelu_input && accumulate_dx), "%s: accumulate_dx cannot be combined with gelu_input", call);
    if (n_rows == 0) return;

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    const int64_t m = in_dim, n = n_rows, k = out_dim;
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    // the GELU's derivative in our own pass, never cuBLASLt's FP8 DGELU epilogue: on an H200 (cuBLASLt 13.1) that ran
    // as a separate kernel of ~7 ms a call at the Wan FFN's shape, several times the GEMM (docs/PERFORMANCE.md,
    // session 19)
    Plan *plan = find_plan(dev, kFp8BackwardData, CUBLASLT_EPILOGUE_DEFAULT, m, n, k, wt8, dy8, dx, NULL, NULL, true);
    run_plan(dev, *plan, wt8, dy8, beta, dx, NULL, NULL, stream, w_scale_inv, dy_scale_inv);
    if (gelu_input) {
        const int64_t n_vecs = n_rows * in_dim / 8;
        dgelu_kernel<<<elementwise_blocks(n_vecs), kElementwiseThreads, 0, stream>>>((uint4 *)dx,
                                                                                    (const uint4 *)gelu_input, n_vecs);
        CUDA_CHECK_LAUNCH();
    }
    end_call(dev);
}

extern "C" void gemm_fp8_bwd_weight(gemm_context *context, const uint8_t *xt8, const float *x_scale_inv,
                                    const uint8_t *dyt8, const float *dy_scale_inv, int64_t padded_rows, int in_dim,
                                    int out_dim, float *dweight, int accumulate, cudaStream_t stream)
{
    static const char call[] = "gemm_fp8_bwd_weight";
    check_fp8_shape(call, padded_rows, in_dim, out_dim);
    ALDIT_CHECK(padded_rows % 16 == 0, "%s: padded_rows %lld is not a multiple of 16", call, (long long)padded_rows);
    check_aligned(call, "xt8", xt8), check_aligned(call, "dyt8", dyt8), check_aligned(call, "dweight", dweight);
    check_scale(call, "x_scale_inv", x_scale_inv), check_scale(call, "dy_scale_inv", dy_scale_inv);

    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    if (padded_rows == 0) {
        if (!accumulate)
            CUDA_CHECK(cudaMemsetAsync(dweight, 0, (size_t)out_dim * (size_t)in_dim * sizeof *dweight, stream));
        end_call(dev);
        return;
    }
    const int64_t m = in_dim, n = out_dim, k = padded_rows;
    const float beta = accumulate ? 1.0f : 0.0f;
    Plan *plan = find_plan(dev, kFp8BackwardWeight, CUBLASLT_EPILOGUE_DEFAULT, m, n, k, xt8, dyt8, dweight, NULL, NULL,
                           true);
    run_plan(dev, *plan, xt8, dyt8, beta, dweight, NULL, NULL, stream, x_scale_inv, dy_scale_inv);
    end_call(dev);
}

extern "C" void gemm_column_sums(gemm_context *context, const gpu_bf16 *dy, int64_t n_rows, int cols, float *out,
                                 int accumulate, cudaStream_t stream)
{
    static const char call[] = "gemm_column_sums";
    ALDIT_CHECK(n_rows >= 0 && cols > 0 && cols % 8 == 0, "%s: n_rows %lld, cols %d (a multiple of 8)", call,
                (long long)n_rows, cols);
    check_aligned(call, "dy", dy), check_aligned(call, "out", out);
    Device &dev = context_of(context, call);
    begin_call(dev, stream);
    if (n_rows == 0) {
        if (!accumulate) CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)cols * sizeof *out, stream));
    } else {
        column_sums(dev, dy, n_rows, cols, out, accumulate, stream);
    }
    end_call(dev);
}

extern "C" gemm_context *gemm_create(int autotune, int fused_epilogues)
{
    gemm_context *context = (gemm_context *)xcalloc(1, sizeof *context);
    CUDA_CHECK(cudaGetDevice(&context->device));
    context->autotune = autotune != 0;
    context->fused = fused_epilogues != 0;
    CUBLAS_CHECK(cublasLtCreate(&context->handle));
    for (cudaEvent_t &mark : context->tune_marks) CUDA_CHECK(cudaEventCreate(&mark));
    context->plans = (Plan *)xcalloc(kPlanSlots, sizeof *context->plans);
    return context;
}

extern "C" void gemm_get_stats(const gemm_context *context, gemm_stats *stats)
{
    *stats = context->stats;
}

extern "C" void gemm_reset_stats(gemm_context *context)
{
    memset(&context->stats, 0, sizeof context->stats);
}

extern "C" void gemm_free(gemm_context *context)
{
    if (!context) return;
    int original = 0;
    CUDA_CHECK(cudaGetDevice(&original));
    CUDA_CHECK(cudaSetDevice(context->device));
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int slot = 0; slot < kPlanSlots; ++slot) destroy_plan(context->plans[slot]);
    free(context->plans);
    for (Lane &lane : context->lanes) {
        if (!lane.workspace) continue;
        CUDA_CHECK(cudaFree(lane.workspace));
        if (lane.scratch) CUDA_CHECK(cudaFree(lane.scratch));
        CUDA_CHECK(cudaEventDestroy(lane.done));
    }
    for (cudaEvent_t mark : context->tune_marks) CUDA_CHECK(cudaEventDestroy(mark));
    CUBLAS_CHECK(cublasLtDestroy(context->handle));
    free(context);
    CUDA_CHECK(cudaSetDevice(original));
}
