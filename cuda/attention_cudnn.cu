// attention_cudnn.cu — cuDNN fused attention through its C backend API: the unified SDPA forward and the composite (matmul, pointwise, reduction, reshape) backward graph for one sample of S_q query and S_kv key rows, plans cached by shape in the caller's attention_cudnn context, their engine configuration autotuned once per size class where the context says so; self-attention over zero-padded whole tiles; the few-key backward in query batches.
//
// Memory [S, H, D] (a sample's packed rows) is described to cuDNN as dims [1, H, S, D] with strides
// {S·H·D, D, H·D, 1}; Q, O and their gradients have S = S_q rows, K, V and theirs S = S_kv rows, and the
// scores are [1, H, S_q, S_kv]. The unified SDPA_FWD operation takes K and V that way. The backward is the
// graph cudnn-frontend builds for Hopper (the unified SDPA_BWD does not build there in cuDNN 9.19), where K
// and V enter transposed ([1, H, D, S_kv]):
//   softmax_sum = rowsum(dO · O) · 1                          (fp32, non-virtual, ours)
//   P   = exp(scale · Q Kᵀ − stats);       dV = Pᵀ dO          (Pᵀ [S_kv, S_q]: a bf16 reshape)
//   dS  = P · (dO Vᵀ − softmax_sum) · scale;  dK = dSᵀ Q       (dSᵀ: a bf16 reshape)
//   dQ_accum = dS K (fp32, non-virtual, ours);  dQ = identity(dQ_accum)
#include "cuda/attention_cudnn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cudnn.h>

#include "cuda/bf16vec.cuh"

#if CUDNN_VERSION < 91301
#error "attention_cudnn.cu needs cuDNN 9.13.1 or newer (the unified SDPA forward operation)"
#endif

namespace {

void describe_failure(cudnnStatus_t status, const char *call, const char *file, int line, char *text, size_t capacity)
{
    char last[600] = "";
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(text, capacity, "%s:%d: cuDNN error %s in %s%s%s", file, line, cudnnGetErrorString(status), call,
             last[0] ? "; " : "", last);
}

[[noreturn]] void fail_cudnn(cudnnStatus_t status, const char *call, const char *file, int line)
{
    char text[1024];
    describe_failure(status, call, file, line, text, sizeof text);
    aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "%s", text);
}

} // namespace

// Fatal on failure (execution and bookkeeping).
#define CUDNN_CHECK(call) do { cudnnStatus_t cudnn_status_ = (call); \
    if (cudnn_status_ != CUDNN_STATUS_SUCCESS) fail_cudnn(cudnn_status_, #call, __FILE__, __LINE__); } while (0)
// Inside a plan build (functions returning bool): record the failure in the error text of the descriptor list
// being built (its context's, see descriptor_list) and return false.
#define CUDNN_TRY(list, call) do { cudnnStatus_t cudnn_status_ = (call); if (cudnn_status_ != CUDNN_STATUS_SUCCESS) { \
    describe_failure(cudnn_status_, #call, __FILE__, __LINE__, (list).error, kErrorBytes); \
    return false; } } while (0)

namespace {

enum direction { kForward = 0, kBackward = 1 };

// Unique ids of the graphs' tensors: those in the variant packs, then the virtual ones.
enum tensor_uid : int64_t {
    kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidDO, kUidDQ, kUidDK, kUidDV, kUidOne,
    kUidSoftmaxSum, kUidDQAccum,
    kUidVirtual = 100,
};

const int kMaxDescriptors = 96;
const size_t kErrorBytes = 1024;
const int kMaxOps = 24;
const int64_t kProbeRows = 256;   // the query length attention_cudnn_available builds its plans at
const int64_t kProbeKeyRows = 77; // and its cross-attention key length (not a multiple of 64)
const size_t kAlign = 256;        // the backward's buffer pieces start at multiples of this
const int64_t kMostSplitKeys = 1024;  // the backward splits the query rows only with at most this many keys

// Descriptors a plan owns (all of them kept alive as long as the plan), destroyed in reverse order; a failed build
// step writes why to `error`, its context's build_error (kErrorBytes).
struct descriptor_list {
    cudnnBackendDescriptor_t items[kMaxDescriptors];
    int count;
    char *error;
};

// An engine configuration: the engine's global index and its knob values.
const int kMaxKnobs = 16;
struct knob_setting {
    cudnnBackendKnobType_t type;
    int64_t value;
};
struct engine_choice {
    int64_t engine;
    int n_knobs;
    knob_setting knobs[kMaxKnobs];
};

// A plan built for autotuning (see the autotuning section).
struct candidate {
    descriptor_list owned;
    cudnnBackendDescriptor_t plan;
    engine_choice choice;
};

struct plan_entry {
    int direction;
    int64_t seq_len_q, seq_len_kv;
    int num_heads, head_dim;
    int query_batches;   // backward: the query rows split into this many batches (query_batches_for)
    uint64_t last_use;   // 0: the slot is empty
    descriptor_list owned;
    cudnnBackendDescriptor_t plan;
    int64_t workspace_bytes;
    engine_choice choice;    // what `plan` runs
    candidate *chosen;       // the tuned configuration's descriptors where it is not the heuristics' first
    candidate *candidates;   // the other configurations to time at the first call (then freed)
    int n_candidates;
    int tune_class;          // the size class it is tuned for (index in the context's classes), -1 none
};

struct probe_result {
    int num_heads, head_dim, available;
};

size_t align_up(size_t bytes)
{
    return (bytes + kAlign - 1) / kAlign * kAlign;
}

void destroy_all(descriptor_list &list)
{
    for (int i = list.count - 1; i >= 0; --i) CUDNN_CHECK(cudnnBackendDestroyDescriptor(list.items[i]));
    list.count = 0;
}

bool create(descriptor_list &owned, cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *descriptor)
{
    if (owned.count == kMaxDescriptors) {
        snprintf(owned.error, kErrorBytes, "attention_cudnn: more than %d descriptors in one plan",
                 kMaxDescriptors);
        return false;
    }
    CUDNN_TRY(owned, cudnnBackendCreateDescriptor(type, descriptor));
    owned.items[owned.count++] = *descriptor;
    return true;
}

// A 4-d tensor as dims and strides.
struct shape4 {
    int64_t dims[4], strides[4];
};

// [S, H, D] rows seen as [1, H, S, D]; transposed: [1, H, D, S].
shape4 rows_shape(int64_t S, int64_t H, int64_t D)
{
    return {{1, H, S, D}, {S * H * D, D, H * D, 1}};
}
shape4 rows_transposed_shape(int64_t S, int64_t H, int64_t D)
{
    return {{1, H, D, S}, {S * H * D, D, 1, H * D}};
}
// Per-(head, row) values, head-major; [1, H, S, 1].
shape4 per_row_shape(int64_t S, int64_t H)
{
    return {{1, H, S, 1}, {H * S, S, 1, 1}};
}
// The stats and softmax sums of S = B·s query rows, head-major [H, S], seen as B query batches of s rows.
shape4 batched_stats_shape(int64_t B, int64_t s, int64_t H)
{
    return {{B, H, s, 1}, {s, B * s, 1, 1}};
}
// A shape whose first (batch) dim is B: the others' strides make each batch one contiguous block.
shape4 batched(shape4 shape, int64_t B)
{
    shape.dims[0] = B;
    return shape;
}
// Scores [1, H, S_q, S_kv] row-major, and the same values read transposed ([1, H, S_kv, S_q]).
shape4 scores_shape(int64_t S_q, int64_t S_kv, int64_t H)
{
    return {{1, H, S_q, S_kv}, {H * S_q * S_kv, S_q * S_kv, S_kv, 1}};
}
shape4 scores_transposed_shape(int64_t S_q, int64_t S_kv, int64_t H)
{
    return {{1, H, S_kv, S_q}, {H * S_q * S_kv, S_q * S_kv, 1, S_kv}};
}
// Dense [1, H, S, D] (the fp32 dQ accumulator).
shape4 dense_shape(int64_t S, int64_t H, int64_t D)
{
    return {{1, H, S, D}, {H * S * D, S * D, D, 1}};
}
shape4 scalar_shape()
{
    return {{1, 1, 1, 1}, {1, 1, 1, 1}};
}

// The graph being built: its descriptors (owned by the plan entry) and its operations in order.
struct graph_builder {
    descriptor_list *owned;
    cudnnBackendDescriptor_t ops[kMaxOps];
    int n_ops;
    int64_t next_virtual_uid;
};

bool make_tensor(graph_builder &g, int64_t uid, cudnnDataType_t type, const shape4 &shape, bool is_virtual,
                 bool by_value, cudnnBackendDescriptor_t *tensor)
{
    if (!create(*g.owned, CUDNN_BACKEND_TENSOR_DESCRIPTOR, tensor)) return false;
    const int64_t alignment = 16;
    const bool virtual_flag = is_virtual, by_value_flag = by_value;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, shape.dims));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, shape.strides));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virtual_flag));
    if (by_value)
        CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(*tensor, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1,
                                           &by_value_flag));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(*tensor));
    return true;
}

// An intermediate (virtual) tensor with the next free id.
bool make_virtual(graph_builder &g, cudnnDataType_t type, const shape4 &shape, cudnnBackendDescriptor_t *tensor)
{
    return make_tensor(g, g.next_virtual_uid++, type, shape, true, false, tensor);
}

bool push_op(graph_builder &g, cudnnBackendDescriptor_t op)
{
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(op));
    if (g.n_ops == kMaxOps) {
        snprintf(g.owned->error, kErrorBytes, "attention_cudnn: more than %d operations in one graph", kMaxOps);
        return false;
    }
    g.ops[g.n_ops++] = op;
    return true;
}

// y = mode(x) or mode(x, b), computed in fp32 (b NULL for unary modes).
bool add_pointwise(graph_builder &g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t pw, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    if (!create(*g.owned, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(pw));
    if (!create(*g.owned, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       1, &pw));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b)
        CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                           &b));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    return push_op(g, op);
}

// c = a b over the last two dims (batched over the first two), fp32 accumulation.
bool add_matmul(graph_builder &g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
{
    cudnnBackendDescriptor_t mm, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    if (!create(*g.owned, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(mm));
    if (!create(*g.owned, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    return push_op(g, op);
}

// y = sum of x over the dims where y has extent 1.
bool add_sum(graph_builder &g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t red, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    const cudnnReduceTensorOp_t add = CUDNN_REDUCE_TENSOR_ADD;
    if (!create(*g.owned, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &red)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &add));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(red));
    if (!create(*g.owned, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red));
    return push_op(g, op);
}

// y = x seen through other dims/strides (a view).
bool add_reshape(graph_builder &g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op;
    if (!create(*g.owned, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    return push_op(g, op);
}

// ---- autotuning of the engine configuration ------------------------------------------------------------
// cuDNN's heuristics rank engine configurations (an engine and its knob values: tile shapes, pipelining, ...) by
// a model, not a measurement. With autotuning on (attention_cudnn_create), the first plan of a size class
// (direction, heads, head_dim, few keys or not, and floor(log2(sqrt(S_q * S_kv))) from the tuning's least rows
// on) gets candidates: the heuristics' other configurations that build, and the first one's engine with each of
// its knobs swept over its range (the other knobs kept), those that build within the first one's workspace. Its
// first call times them all in rounds (an untimed one, then kTuneRounds, dropping after each those slower than
// kTuneKeep times the best) and keeps the fastest by its least time, unless that is less than kTuneMargin faster
// than the heuristics' first. Later plans of the class are built with the winner's engine and knob values where
// they build, else with the heuristics' first.

constexpr int kMaxCandidates = 48;
constexpr int64_t kMaxKnobValues = 128;  // a knob whose range has more values than this is not swept
constexpr int kTuneRounds = 3;
constexpr float kTuneKeep = 1.15f;
constexpr float kTuneMargin = 0.02f;
constexpr int kMaxClasses = 64;
constexpr int kMaxTuneRecords = 32;

struct tune_class {
    int direction, num_heads, head_dim, few_keys, size_log2;
    int state;  // 0: not tuned, 1: candidates built and waiting for the first call, 2: tuned
    engine_choice winner;
    char knob_ranges[256];  // the first engine's knobs: type[lowest..highest/stride] (+ swept or - not), for the report
};


struct tune_record {
    char knob_ranges[256];  // its class's
    int direction;
    int64_t seq_len_q, seq_len_kv;
    int n_candidates;
    float first_ms, best_ms;
    engine_choice first, best;
};

}  // namespace

// A context (attention_cudnn.h): the handle, the plans, the buffer, the probes, what autotuning learnt, and the
// text of the last failed build step (a failed build is not always fatal).
struct attention_cudnn {
    cudnnHandle_t handle;  // made at the first call that needs it
    int device;            // the GPU current at attention_cudnn_create
    bool autotune;
    int64_t tune_least_rows;
    plan_entry plans[ATTENTION_CUDNN_PLAN_SLOTS];
    uint64_t clock;
    void *buffer;   // cuDNN's workspace, then (backward) softmax sum, dQ accumulator (and query batches' pieces)
    size_t buffer_bytes;
    probe_result probes[8];
    int n_probes;
    cudaEvent_t tune_marks[50];  // a tuning round: before the first configuration, after each (kMaxCandidates + 2)
    bool have_marks;
    tune_class classes[kMaxClasses];
    int n_classes;
    tune_record tune_records[kMaxTuneRecords];
    int n_tune_records;
    char build_error[kErrorBytes];
    int64_t plans_built;   // attention_cudnn_setup_stats: plans built, host seconds of builds and tuning rounds
    double setup_seconds;
};

namespace {

using context = attention_cudnn;

// An empty descriptor list that reports to s's build_error.
descriptor_list new_list(context &s)
{
    descriptor_list list = {};
    list.error = s.build_error;
    return list;
}

bool same_choice(const engine_choice &a, const engine_choice &b)
{
    if (a.engine != b.engine || a.n_knobs != b.n_knobs) return false;
    for (int i = 0; i < a.n_knobs; ++i)
        if (a.knobs[i].type != b.knobs[i].type || a.knobs[i].value != b.knobs[i].value) return false;
    return true;
}

// The engine and knob values of a finalized engine configuration (read through descriptors in `scratch`).
bool read_choice(cudnnBackendDescriptor_t config, descriptor_list &scratch, engine_choice &choice)
{
    cudnnBackendDescriptor_t engine, knobs[kMaxKnobs];
    if (!create(scratch, CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine)) return false;
    for (cudnnBackendDescriptor_t &knob : knobs)
        if (!create(scratch, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knob)) return false;
    int64_t n = 0;
    CUDNN_TRY(scratch, cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                       &engine));
    CUDNN_TRY(scratch, cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                       &choice.engine));
    CUDNN_TRY(scratch, cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       kMaxKnobs, &n, knobs));
    choice.n_knobs = static_cast<int>(n);
    for (int i = 0; i < choice.n_knobs; ++i) {
        int64_t got = 0;
        CUDNN_TRY(scratch, cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &got,
                                           &choice.knobs[i].type));
        CUDNN_TRY(scratch, cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &got,
                                           &choice.knobs[i].value));
    }
    return true;
}

// The operation graph's engine `index`, finalized, in `owned`.
bool make_engine(cudnnBackendDescriptor_t graph, int64_t index, descriptor_list &owned,
                 cudnnBackendDescriptor_t *engine)
{
    if (!create(owned, CUDNN_BACKEND_ENGINE_DESCRIPTOR, engine)) return false;
    CUDNN_TRY(owned, cudnnBackendSetAttribute(*engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &graph));
    CUDNN_TRY(owned, cudnnBackendSetAttribute(*engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index));
    CUDNN_TRY(owned, cudnnBackendFinalize(*engine));
    return true;
}

// An execution plan of the graph with `choice`; false when cuDNN does not build it.
bool build_choice(context &s, cudnnBackendDescriptor_t graph, const engine_choice &choice, candidate &c)
{
    cudnnHandle_t handle = s.handle;
    cudnnBackendDescriptor_t engine, config, plan, knobs[kMaxKnobs];
    c.owned.error = s.build_error;
    c.choice = choice;
    if (!make_engine(graph, choice.engine, c.owned, &engine)) return false;
    for (int i = 0; i < choice.n_knobs; ++i) {
        if (!create(c.owned, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[i])) return false;
        CUDNN_TRY(c.owned, cudnnBackendSetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1,
                                           &choice.knobs[i].type));
        CUDNN_TRY(c.owned, cudnnBackendSetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1,
                                           &choice.knobs[i].value));
        CUDNN_TRY(c.owned, cudnnBackendFinalize(knobs[i]));
    }
    if (!create(c.owned, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &config)) return false;
    CUDNN_TRY(c.owned, cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine));
    if (choice.n_knobs > 0)
        CUDNN_TRY(c.owned, cudnnBackendSetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           choice.n_knobs, knobs));
    CUDNN_TRY(c.owned, cudnnBackendFinalize(config));
    if (!create(c.owned, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) return false;
    CUDNN_TRY(c.owned, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    CUDNN_TRY(c.owned, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &config));
    CUDNN_TRY(c.owned, cudnnBackendFinalize(plan));
    c.plan = plan;
    return true;
}

int64_t plan_workspace_bytes(cudnnBackendDescriptor_t plan)
{
    int64_t n = 0, bytes = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                         &bytes));
    return bytes;
}

void free_candidate(candidate *c)
{
    if (!c) return;
    destroy_all(c->owned);
    free(c);
}

// Adds the plan of `choice` to e's candidates when it builds within e's workspace and is not there yet.
void add_candidate(context &s, plan_entry &e, cudnnBackendDescriptor_t graph, const engine_choice &choice)
{
    if (e.n_candidates == kMaxCandidates || same_choice(choice, e.choice)) return;
    for (int i = 0; i < e.n_candidates; ++i)
        if (same_choice(choice, e.candidates[i].choice)) return;
    candidate &c = e.candidates[e.n_candidates];
    memset(&c, 0, sizeof c);
    if (build_choice(s, graph, choice, c) && plan_workspace_bytes(c.plan) <= e.workspace_bytes) ++e.n_candidates;
    else destroy_all(c.owned);
}

// The candidates of e (whose plan, the heuristics' first, is built): the heuristics' other configurations and
// e's engine with each knob swept.
void build_candidates(context &s, plan_entry &e, cudnnBackendDescriptor_t graph, const cudnnBackendDescriptor_t *configs,
                      int64_t n_configs, char *knob_ranges, size_t ranges_capacity)
{
    size_t ranges_used = 0;
    knob_ranges[0] = '\0';
    e.candidates = static_cast<candidate *>(xcalloc(kMaxCandidates, sizeof(candidate)));
    descriptor_list scratch = new_list(s);
    for (int64_t i = 1; i < n_configs; ++i) {
        engine_choice choice = {};
        if (read_choice(configs[i], scratch, choice)) add_candidate(s, e, graph, choice);
        destroy_all(scratch);
    }
    cudnnBackendDescriptor_t engine, infos[CUDNN_KNOB_TYPE_COUNTS];
    int64_t n_infos = 0;
    bool have_infos = make_engine(graph, e.choice.engine, scratch, &engine);
    for (int i = 0; have_infos && i < CUDNN_KNOB_TYPE_COUNTS; ++i)
        have_infos = create(scratch, CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR, &infos[i]);
    if (have_infos && cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               CUDNN_KNOB_TYPE_COUNTS, &n_infos, infos) != CUDNN_STATUS_SUCCESS)
        n_infos = 0;
    for (int64_t i = 0; i < n_infos; ++i) {
        cudnnBackendKnobType_t type;
        int64_t n = 0, lowest = 0, highest = 0, stride = 1;
        if (cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type) ||
            cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &lowest) ||
            cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &highest) ||
            cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &n, &stride))
            continue;
        if (stride < 1) stride = 1;
        const bool swept = highest >= lowest && (highest - lowest) / stride + 1 <= kMaxKnobValues;
        if (ranges_used < ranges_capacity)
            ranges_used += (size_t)snprintf(knob_ranges + ranges_used, ranges_capacity - ranges_used,
                                            "%s%d[%lld..%lld/%lld]%c", ranges_used ? " " : "", (int)type,
                                            (long long)lowest, (long long)highest, (long long)stride,
                                            swept ? '+' : '-');
        if (!swept) continue;
        for (int64_t value = lowest; value <= highest; value += stride) {
            engine_choice choice = e.choice;
            int k = 0;
            while (k < choice.n_knobs && choice.knobs[k].type != type) ++k;
            if (k == choice.n_knobs) {
                if (k == kMaxKnobs) break;
                choice.knobs[choice.n_knobs++].type = type;
            }
            choice.knobs[k].value = value;
            add_candidate(s, e, graph, choice);
        }
    }
    destroy_all(scratch);
    if (e.n_candidates == 0) {
        free(e.candidates);
        e.candidates = nullptr;
    }
}

// Frees everything a plan slot holds (the tuned configuration and the candidates before the graph they use).
void destroy_entry(context &s, plan_entry &e)
{
    free_candidate(e.chosen);
    for (int i = 0; i < e.n_candidates; ++i) destroy_all(e.candidates[i].owned);
    free(e.candidates);
    if (e.tune_class >= 0 && e.n_candidates > 0) s.classes[e.tune_class].state = 0;  // not timed: the next plan tunes
    destroy_all(e.owned);
    memset(&e, 0, sizeof e);
}

// Times e's plan (the heuristics' first) and its candidates on the call's variant pack and keeps the fastest.
void tune(context &s, plan_entry &e, cudnnBackendDescriptor_t pack, cudaStream_t stream)
{
    static_assert(sizeof s.tune_marks / sizeof s.tune_marks[0] >= kMaxCandidates + 2, "tuning marks");
    if (!s.have_marks) {
        for (cudaEvent_t &mark : s.tune_marks) CUDA_CHECK(cudaEventCreate(&mark));
        s.have_marks = true;
    }
    const int n = e.n_candidates + 1;  // 0: e.plan, then the candidates
    float least_ms[kMaxCandidates + 1] = {};
    bool refused[kMaxCandidates + 1] = {}, dropped[kMaxCandidates + 1] = {};
    for (int round = 0; round <= kTuneRounds; ++round) {
        CUDA_CHECK(cudaEventRecord(s.tune_marks[0], stream));
        for (int c = 0; c < n; ++c) {
            if (!refused[c] && !dropped[c])
                refused[c] = cudnnBackendExecute(s.handle, c == 0 ? e.plan : e.candidates[c - 1].plan, pack) !=
                             CUDNN_STATUS_SUCCESS;
            CUDA_CHECK(cudaEventRecord(s.tune_marks[c + 1], stream));
        }
        CUDA_CHECK(cudaEventSynchronize(s.tune_marks[n]));
        if (round == 0) continue;
        int best = -1;
        for (int c = 0; c < n; ++c) {
            if (refused[c] || dropped[c]) continue;
            float ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, s.tune_marks[c], s.tune_marks[c + 1]));
            least_ms[c] = round == 1 || ms < least_ms[c] ? ms : least_ms[c];
            if (best < 0 || least_ms[c] < least_ms[best]) best = c;
        }
        for (int c = 0; c < n && best >= 0; ++c) dropped[c] = dropped[c] || least_ms[c] > kTuneKeep * least_ms[best];
    }
    const int best = gpu_fastest_candidate(least_ms, refused, n, kTuneMargin);
    if (s.n_tune_records < kMaxTuneRecords) {
        tune_record &record = s.tune_records[s.n_tune_records++];
        record = {{}, e.direction, e.seq_len_q, e.seq_len_kv, e.n_candidates, least_ms[0], least_ms[best], e.choice,
                  best > 0 ? e.candidates[best - 1].choice : e.choice};
        memcpy(record.knob_ranges, s.classes[e.tune_class].knob_ranges, sizeof record.knob_ranges);
    }
    // e.workspace_bytes stays: the candidates need no more, and this call's buffer layout was made with it
    if (best > 0) {
        e.chosen = static_cast<candidate *>(xmalloc(sizeof(candidate)));
        *e.chosen = e.candidates[best - 1];
        e.plan = e.chosen->plan;
        e.choice = e.chosen->choice;
    }
    for (int c = 1; c < n; ++c)
        if (c != best) destroy_all(e.candidates[c - 1].owned);
    free(e.candidates);
    e.candidates = nullptr;
    e.n_candidates = 0;
    s.classes[e.tune_class].state = 2;
    s.classes[e.tune_class].winner = e.choice;
}

// The size class of a plan (found or added), -1 when its shape is below the tuning's least rows or the table is full.
int tune_class_of(context &s, const plan_entry &e)
{
    const double rows = sqrt(static_cast<double>(e.seq_len_q) * static_cast<double>(e.seq_len_kv));
    if (rows < static_cast<double>(s.tune_least_rows)) return -1;
    const int size_log2 = static_cast<int>(floor(log2(rows)));
    const int few_keys = e.seq_len_kv <= kMostSplitKeys;
    for (int i = 0; i < s.n_classes; ++i) {
        const tune_class &c = s.classes[i];
        if (c.direction == e.direction && c.num_heads == e.num_heads && c.head_dim == e.head_dim &&
            c.few_keys == few_keys && c.size_log2 == size_log2)
            return i;
    }
    if (s.n_classes == kMaxClasses) return -1;
    s.classes[s.n_classes] = {e.direction, e.num_heads, e.head_dim, few_keys, size_log2, 0, {}, {}};
    return s.n_classes++;
}

// After e's plan (the heuristics' first) is built: its class's winner instead, or candidates for the first call.
void apply_tuning(context &s, plan_entry &e, cudnnBackendDescriptor_t graph, const cudnnBackendDescriptor_t *configs,
                  int64_t n_configs)
{
    e.tune_class = -1;
    if (!s.autotune) return;
    const int index = tune_class_of(s, e);
    if (index < 0) return;
    tune_class &c = s.classes[index];
    if (c.state == 0) {
        build_candidates(s, e, graph, configs, n_configs, c.knob_ranges, sizeof c.knob_ranges);
        if (e.n_candidates == 0) {
            c.state = 2;
            c.winner = e.choice;
        } else {
            c.state = 1;
            e.tune_class = index;
        }
    } else if (c.state == 2 && !same_choice(c.winner, e.choice)) {
        candidate *winner = static_cast<candidate *>(xcalloc(1, sizeof(candidate)));
        if (build_choice(s, graph, c.winner, *winner)) {
            e.chosen = winner;
            e.plan = winner->plan;
            e.choice = winner->choice;
            e.workspace_bytes = plan_workspace_bytes(winner->plan);
        } else {
            free_candidate(winner);
        }
    }
}

// Operation graph -> heuristics (mode A) -> the first engine config whose plan finalizes (then apply_tuning).
bool finish_plan(context &s, graph_builder &g, plan_entry &e)
{
    cudnnHandle_t handle = s.handle;
    cudnnBackendDescriptor_t graph, heuristics;
    if (!create(*g.owned, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops,
                                       g.ops));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(graph));

    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    if (!create(*g.owned, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heuristics)) return false;
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
    CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    CUDNN_TRY(*g.owned, cudnnBackendFinalize(heuristics));
    int64_t n_configs = 0;
    CUDNN_TRY(*g.owned, cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &n_configs, nullptr));
    if (n_configs <= 0) {
        snprintf(s.build_error, kErrorBytes, "attention_cudnn: heuristics found no engine for the graph");
        return false;
    }
    if (n_configs > 4) n_configs = 4;
    cudnnBackendDescriptor_t configs[4];
    for (int64_t i = 0; i < n_configs; ++i)
        if (!create(*g.owned, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[i])) return false;
    int64_t n_returned = 0;
    CUDNN_TRY(*g.owned, cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       n_configs, &n_returned, configs));
    // Config 0 is the fast one (docs/PERFORMANCE.md); the others only if it does not build.
    for (int64_t i = 0; i < n_returned; ++i) {
        cudnnBackendDescriptor_t plan;
        if (!create(*g.owned, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) return false;
        CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
        CUDNN_TRY(*g.owned, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]));
        const cudnnStatus_t status = cudnnBackendFinalize(plan);
        if (status != CUDNN_STATUS_SUCCESS) {
            describe_failure(status, "cudnnBackendFinalize(plan)", __FILE__, __LINE__, s.build_error,
                             kErrorBytes);
            continue;
        }
        e.workspace_bytes = plan_workspace_bytes(plan);
        e.plan = plan;
        descriptor_list scratch = new_list(s);
        const bool known = read_choice(configs[i], scratch, e.choice);
        destroy_all(scratch);
        if (known) apply_tuning(s, e, graph, configs + i, n_returned - i);
        return true;
    }
    return false;
}

// The unified SDPA forward: O and stats from Q, K, V and the scale (by value).
bool build_forward(context &s, plan_entry &e)
{
    graph_builder g = {&e.owned, {}, 0, kUidVirtual};
    const int64_t S_q = e.seq_len_q, S_kv = e.seq_len_kv, H = e.num_heads, D = e.head_dim;
    cudnnBackendDescriptor_t q, k, v, o, stats, scale, op;
    if (!make_tensor(g, kUidQ, CUDNN_DATA_BFLOAT16, rows_shape(S_q, H, D), false, false, &q) ||
        !make_tensor(g, kUidK, CUDNN_DATA_BFLOAT16, rows_shape(S_kv, H, D), false, false, &k) ||
        !make_tensor(g, kUidV, CUDNN_DATA_BFLOAT16, rows_shape(S_kv, H, D), false, false, &v) ||
        !make_tensor(g, kUidO, CUDNN_DATA_BFLOAT16, rows_shape(S_q, H, D), false, false, &o) ||
        !make_tensor(g, kUidStats, CUDNN_DATA_FLOAT, per_row_shape(S_q, H), false, false, &stats) ||
        !make_tensor(g, kUidScale, CUDNN_DATA_FLOAT, scalar_shape(), false, true, &scale))
        return false;
    if (!create(e.owned, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &q));
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k));
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v));
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o));
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &stats));
    CUDNN_TRY(e.owned, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &scale));
    return push_op(g, op) && finish_plan(s, g, e);
}

// The composite backward (18 operations; see the comment at the top of the file). With e.query_batches = B > 1
// the S_q query rows run as B batches of S_q / B rows against the same keys: K and V come as B copies, and dK,
// dV as B bf16 pieces, added up by add_key_pieces_kernel. (fp32 pieces came out wrong on an H200 with cuDNN
// 9.19: relative error 1.2 against the reference, NaN from a poisoned buffer.)
bool build_backward(context &s, plan_entry &e)
{
    graph_builder g = {&e.owned, {}, 0, kUidVirtual};
    const int64_t B = e.query_batches, S_q = e.seq_len_q / B, S_kv = e.seq_len_kv, H = e.num_heads, D = e.head_dim;
    const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT, key_grad = bf16;
    cudnnBackendDescriptor_t q, k_t, v_t, o, d_o, stats, scale, one, softmax_sum, dq_accum, dq, dk, dv;
    if (!make_tensor(g, kUidQ, bf16, batched(rows_shape(S_q, H, D), B), false, false, &q) ||
        !make_tensor(g, kUidK, bf16, batched(rows_transposed_shape(S_kv, H, D), B), false, false, &k_t) ||
        !make_tensor(g, kUidV, bf16, batched(rows_transposed_shape(S_kv, H, D), B), false, false, &v_t) ||
        !make_tensor(g, kUidO, bf16, batched(rows_shape(S_q, H, D), B), false, false, &o) ||
        !make_tensor(g, kUidDO, bf16, batched(rows_shape(S_q, H, D), B), false, false, &d_o) ||
        !make_tensor(g, kUidStats, f32, batched_stats_shape(B, S_q, H), false, false, &stats) ||
        !make_tensor(g, kUidScale, f32, scalar_shape(), false, true, &scale) ||
        !make_tensor(g, kUidOne, f32, scalar_shape(), false, true, &one) ||
        !make_tensor(g, kUidSoftmaxSum, f32, batched_stats_shape(B, S_q, H), false, false, &softmax_sum) ||
        !make_tensor(g, kUidDQAccum, f32, batched(dense_shape(S_q, H, D), B), false, false, &dq_accum) ||
        !make_tensor(g, kUidDQ, bf16, batched(rows_shape(S_q, H, D), B), false, false, &dq) ||
        !make_tensor(g, kUidDK, key_grad, batched(rows_shape(S_kv, H, D), B), false, false, &dk) ||
        !make_tensor(g, kUidDV, key_grad, batched(rows_shape(S_kv, H, D), B), false, false, &dv))
        return false;

    // softmax_sum = rowsum(dO · O) · 1
    cudnnBackendDescriptor_t d_o_o, row_sum;
    if (!make_virtual(g, f32, batched(rows_shape(S_q, H, D), B), &d_o_o) ||
        !make_virtual(g, f32, batched(per_row_shape(S_q, H), B), &row_sum) ||
        !add_pointwise(g, CUDNN_POINTWISE_MUL, d_o, o, d_o_o) || !add_sum(g, d_o_o, row_sum) ||
        !add_pointwise(g, CUDNN_POINTWISE_MUL, row_sum, one, softmax_sum))
        return false;

    // P = exp(scale · Q Kᵀ − stats); dV = Pᵀ dO
    cudnnBackendDescriptor_t scores, scaled, shifted, p, p_t;
    const shape4 scores_qk = batched(scores_shape(S_q, S_kv, H), B);
    const shape4 scores_kq = batched(scores_transposed_shape(S_q, S_kv, H), B);
    if (!make_virtual(g, f32, scores_qk, &scores) || !make_virtual(g, f32, scores_qk, &scaled) ||
        !make_virtual(g, f32, scores_qk, &shifted) || !make_virtual(g, f32, scores_qk, &p) ||
        !make_virtual(g, bf16, scores_kq, &p_t) || !add_matmul(g, q, k_t, scores) ||
        !add_pointwise(g, CUDNN_POINTWISE_MUL, scores, scale, scaled) ||
        !add_pointwise(g, CUDNN_POINTWISE_SUB, scaled, stats, shifted) ||
        !add_pointwise(g, CUDNN_POINTWISE_EXP, shifted, nullptr, p) || !add_reshape(g, p, p_t) ||
        !add_matmul(g, p_t, d_o, dv))
        return false;

    // dS = P · (dO Vᵀ − softmax_sum) · scale; dK = dSᵀ Q
    cudnnBackendDescriptor_t dp, dp_centered, ds_unscaled, ds, ds_t;
    if (!make_virtual(g, f32, scores_qk, &dp) || !make_virtual(g, f32, scores_qk, &dp_centered) ||
        !make_virtual(g, f32, scores_qk, &ds_unscaled) || !make_virtual(g, f32, scores_qk, &ds) ||
        !make_virtual(g, bf16, scores_kq, &ds_t) || !add_matmul(g, d_o, v_t, dp) ||
        !add_pointwise(g, CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered) ||
        !add_pointwise(g, CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled) ||
        !add_pointwise(g, CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds) || !add_reshape(g, ds, ds_t) ||
        !add_matmul(g, ds_t, q, dk))
        return false;

    // dQ_accum = dS K (K as [S_kv, D] again through a reshape of Kᵀ); dQ = dQ_accum in bf16
    cudnnBackendDescriptor_t k;
    if (!make_virtual(g, f32, batched(rows_shape(S_kv, H, D), B), &k) || !add_reshape(g, k_t, k) ||
        !add_matmul(g, ds, k, dq_accum) ||
        !add_pointwise(g, CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq))
        return false;
    return finish_plan(s, g, e);
}

// The handle, made on the context's GPU at the first call; false (s.build_error says why) when cuDNN cannot
// make one (a library that does not fit the driver, for instance).
bool ensure_handle(context &s)
{
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    ALDIT_CHECK(device == s.device, "attention_cudnn: the context was made on GPU %d, called on GPU %d", s.device,
                device);
    if (s.handle) return true;
    cudnnHandle_t handle = nullptr;
    descriptor_list report = new_list(s);
    CUDNN_TRY(report, cudnnCreate(&handle));
    s.handle = handle;
    return true;
}

double host_seconds()
{
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

const char *direction_name(int direction)
{
    return direction == kForward ? "forward" : "backward";
}

// The cached plan of this shape, built on a miss into an empty or the least recently used slot. NULL when
// the build fails (s.build_error says why).
plan_entry *find_plan(context &s, int direction, int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim,
                      int query_batches = 1)
{
    if (!ensure_handle(s)) return nullptr;
    plan_entry *victim = &s.plans[0];
    for (plan_entry &e : s.plans) {
        if (e.last_use && e.direction == direction && e.seq_len_q == seq_len_q && e.seq_len_kv == seq_len_kv &&
            e.num_heads == num_heads && e.head_dim == head_dim && e.query_batches == query_batches) {
            e.last_use = ++s.clock;
            return &e;
        }
        if (e.last_use < victim->last_use) victim = &e;
    }
    destroy_entry(s, *victim);
    victim->owned.error = s.build_error;
    victim->direction = direction;
    victim->seq_len_q = seq_len_q;
    victim->seq_len_kv = seq_len_kv;
    victim->num_heads = num_heads;
    victim->head_dim = head_dim;
    victim->query_batches = query_batches;
    const double started = host_seconds();
    const bool built = direction == kForward ? build_forward(s, *victim) : build_backward(s, *victim);
    s.setup_seconds += host_seconds() - started;
    s.plans_built += built;
    if (!built) {
        destroy_entry(s, *victim);
        return nullptr;
    }
    victim->last_use = ++s.clock;
    return victim;
}

plan_entry *need_plan(context &s, int direction, int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim,
                      int query_batches = 1)
{
    plan_entry *e = find_plan(s, direction, seq_len_q, seq_len_kv, num_heads, head_dim, query_batches);
    if (!e)
        ALDIT_FATAL("attention_cudnn: no %s plan for seq_len_q %lld (in %d batches), seq_len_kv %lld, %d heads, "
                    "head_dim %d: %s", direction_name(direction), (long long)seq_len_q, query_batches,
                    (long long)seq_len_kv, num_heads, head_dim, s.build_error);
    return e;
}

// ---- the backward's query batches ------------------------------------------------------------------------------
// With few keys (cross-attention to 512 text rows) the backward's grid, which cuDNN lays over key tiles, has
// only heads x key tiles blocks (48 for Wan's 12 heads and 512 keys: a third of an H200). Splitting the query
// rows into batches against copies of the keys multiplies the blocks; the batches' dK and dV come out as bf16
// pieces, added up in fp32 (add_key_pieces_kernel).

constexpr int kElementwiseThreads = 256;
constexpr int64_t kElementwiseMaxBlocks = 4096;
constexpr int64_t kLeastBatchRows = 512;     // query rows per batch at least
constexpr int kQueryBatchChoices[] = {ATTENTION_CUDNN_MOST_QUERY_BATCHES, 4, 2};

// The query batches the backward of this shape runs in: the first of 8, 4, 2 that divides seq_len_q into
// batches of at least kLeastBatchRows rows when there are at most kMostSplitKeys keys, else 1.
int query_batches_for(int64_t seq_len_q, int64_t seq_len_kv)
{
    if (seq_len_kv > kMostSplitKeys) return 1;
    for (int batches : kQueryBatchChoices)
        if (seq_len_q % batches == 0 && seq_len_q / batches >= kLeastBatchRows) return batches;
    return 1;
}

unsigned elementwise_blocks(int64_t n_items)
{
    return gpu_grid_blocks(n_items, kElementwiseThreads, kElementwiseMaxBlocks);
}

// `batches` copies of k and v (n_vectors 16-byte vectors each), back to back.
__global__ void copy_keys_kernel(const uint4 *k, const uint4 *v, int64_t n_vectors, int batches, uint4 *k_copies,
                                 uint4 *v_copies)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vectors; i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 kv = k[i], vv = v[i];
        for (int b = 0; b < batches; ++b) {
            k_copies[b * n_vectors + i] = kv;
            v_copies[b * n_vectors + i] = vv;
        }
    }
}

// dk, dv (bf16) = the sums over the batches of the bf16 pieces in fp32, batch by batch in order.
__global__ void add_key_pieces_kernel(const uint4 *dk_pieces, const uint4 *dv_pieces, int64_t n_vectors, int batches,
                                      uint4 *dk, uint4 *dv)
{
    const uint4 *const pieces[2] = {dk_pieces, dv_pieces};
    uint4 *const outputs[2] = {dk, dv};
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vectors; i += (int64_t)gridDim.x * blockDim.x)
        for (int t = 0; t < 2; ++t) {
            float sum[kVecElems] = {}, piece[kVecElems];
            for (int b = 0; b < batches; ++b) {
                unpack8(pieces[t][b * n_vectors + i], piece);
                for (int j = 0; j < kVecElems; ++j) sum[j] += piece[j];
            }
            outputs[t][i] = pack8(sum);
        }
}

// The module's device buffer, at least `bytes` long. A new one starts poisoned (all bits set: NaN), so a
// piece cuDNN would read before writing shows up in the results.
char *ensure_buffer(context &s, size_t bytes)
{
    if (bytes > s.buffer_bytes) {
        if (s.buffer) CUDA_CHECK(cudaFree(s.buffer));
        s.buffer = nullptr;
        s.buffer_bytes = 0;
        CUDA_CHECK(cudaMalloc(&s.buffer, bytes));
        CUDA_CHECK(cudaMemset(s.buffer, 0xff, bytes));
        s.buffer_bytes = bytes;
    }
    return static_cast<char *>(s.buffer);
}

void execute(context &s, plan_entry &e, int n_tensors, const int64_t *uids, void *const *pointers, void *workspace,
             cudaStream_t stream)
{
    cudnnBackendDescriptor_t pack;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n_tensors, uids));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n_tensors,
                                         pointers));
    CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    CUDNN_CHECK(cudnnBackendFinalize(pack));
    CUDNN_CHECK(cudnnSetStream(s.handle, stream));
    if (e.n_candidates > 0) {
        const double started = host_seconds();
        tune(s, e, pack, stream);
        s.setup_seconds += host_seconds() - started;
    }
    CUDNN_CHECK(cudnnBackendExecute(s.handle, e.plan, pack));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
}

bool shape_supported(int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim)
{
    return seq_len_q >= 1 && seq_len_kv >= 1 && num_heads >= 1 && head_dim >= 8 && head_dim <= 128 &&
           head_dim % 8 == 0;
}

void check_call(const char *function, int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim,
                const void *const *tensors, const char *const *names, int n_tensors)
{
    ALDIT_CHECK(shape_supported(seq_len_q, seq_len_kv, num_heads, head_dim),
                "%s: seq_len_q %lld, seq_len_kv %lld, %d heads, head_dim %d not supported (lengths and heads >= 1, "
                "head_dim a multiple of 8 from 8 to 128)", function, (long long)seq_len_q, (long long)seq_len_kv,
                num_heads, head_dim);
    for (int i = 0; i < n_tensors; ++i)
        ALDIT_CHECK(tensors[i] != nullptr && reinterpret_cast<uintptr_t>(tensors[i]) % 16 == 0,
                    "%s: %s is NULL or not 16-byte aligned (%p)", function, names[i], tensors[i]);
}

// The context of a call (not NULL).
attention_cudnn &checked(attention_cudnn *context, const char *function)
{
    ALDIT_CHECK(context != nullptr, "%s: no attention_cudnn context", function);
    return *context;
}

} // namespace

extern "C" int attention_cudnn_available(attention_cudnn *context, int num_heads, int head_dim)
{
    attention_cudnn &s = *context;
    for (int i = 0; i < s.n_probes; ++i)
        if (s.probes[i].num_heads == num_heads && s.probes[i].head_dim == head_dim)
            return s.probes[i].available;
    int available = 0;
    if (!shape_supported(kProbeRows, kProbeKeyRows, num_heads, head_dim)) {
        aldit_warn("cuDNN attention: %d heads of head_dim %d are not supported (a multiple of 8 up to 128)",
                   num_heads, head_dim);
    } else if (gpu_count() == 0) {
        aldit_warn("cuDNN attention: no GPU visible");
    } else if (cudnnGetVersion() <= 91500) {
        aldit_warn("cuDNN attention: the loaded cuDNN is %zu; the unified SDPA forward needs 9.13.1 or newer and "
                   "the composite backward, without a padding mask, a release newer than 9.15.0",
                   cudnnGetVersion());
    } else if (!find_plan(s, kForward, kProbeRows, kProbeRows, num_heads, head_dim) ||
               !find_plan(s, kBackward, kProbeRows, kProbeRows, num_heads, head_dim) ||
               !find_plan(s, kForward, kProbeRows, kProbeKeyRows, num_heads, head_dim) ||
               !find_plan(s, kBackward, kProbeRows, kProbeKeyRows, num_heads, head_dim)) {
        aldit_warn("cuDNN attention: no plan for %d heads of head_dim %d: %s", num_heads, head_dim, s.build_error);
    } else {
        available = 1;
    }
    if (s.n_probes < (int)(sizeof s.probes / sizeof s.probes[0]))
        s.probes[s.n_probes++] = {num_heads, head_dim, available};
    return available;
}

extern "C" void attention_cudnn_cross_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, int64_t seq_len_q,
                                          int64_t seq_len_kv, int num_heads, int head_dim, gpu_bf16 *out, float *stats,
                                          cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, stats};
    const char *names[] = {"q", "k", "v", "out", "stats"};
    check_call("attention_cudnn_cross_fwd", seq_len_q, seq_len_kv, num_heads, head_dim, tensors, names, 5);
    attention_cudnn &s = checked(context, "attention_cudnn_cross_fwd");
    plan_entry *e = need_plan(s, kForward, seq_len_q, seq_len_kv, num_heads, head_dim);
    void *workspace = e->workspace_bytes > 0 ? ensure_buffer(s, static_cast<size_t>(e->workspace_bytes)) : nullptr;
    float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
    const int64_t uids[] = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale};
    void *const pointers[] = {const_cast<gpu_bf16 *>(q), const_cast<gpu_bf16 *>(k), const_cast<gpu_bf16 *>(v), out,
                              stats, &scale};
    execute(s, *e, 6, uids, pointers, workspace, stream);
}

extern "C" void attention_cudnn_cross_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, const gpu_bf16 *out,
                                          const gpu_bf16 *dout, const float *stats, int64_t seq_len_q,
                                          int64_t seq_len_kv, int num_heads, int head_dim, gpu_bf16 *dq, gpu_bf16 *dk,
                                          gpu_bf16 *dv, cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, dout, stats, dq, dk, dv};
    const char *names[] = {"q", "k", "v", "out", "dout", "stats", "dq", "dk", "dv"};
    check_call("attention_cudnn_cross_bwd", seq_len_q, seq_len_kv, num_heads, head_dim, tensors, names, 9);
    attention_cudnn &s = checked(context, "attention_cudnn_cross_bwd");
    const int batches = query_batches_for(seq_len_q, seq_len_kv);
    plan_entry *e = need_plan(s, kBackward, seq_len_q, seq_len_kv, num_heads, head_dim, batches);
    // the buffer: workspace, softmax sum, dQ accumulator; with query batches, K and V copies and dK, dV pieces
    const size_t key_values = static_cast<size_t>(seq_len_kv) * num_heads * head_dim;
    const size_t workspace_bytes = align_up(static_cast<size_t>(e->workspace_bytes));
    const size_t sum_bytes = align_up(static_cast<size_t>(num_heads) * seq_len_q * sizeof(float));
    const size_t accum_bytes = align_up(static_cast<size_t>(num_heads) * seq_len_q * head_dim * sizeof(float));
    const size_t copy_bytes = batches > 1 ? align_up(batches * key_values * sizeof(gpu_bf16)) : 0;
    const size_t piece_bytes = batches > 1 ? align_up(batches * key_values * sizeof(gpu_bf16)) : 0;
    char *buffer = ensure_buffer(s, workspace_bytes + sum_bytes + accum_bytes + 2 * copy_bytes + 2 * piece_bytes);
    char *const k_copies = buffer + workspace_bytes + sum_bytes + accum_bytes, *const v_copies = k_copies + copy_bytes;
    const uint4 *const dk_pieces = reinterpret_cast<const uint4 *>(v_copies + copy_bytes);
    const uint4 *const dv_pieces = reinterpret_cast<const uint4 *>(v_copies + copy_bytes + piece_bytes);
    if (batches > 1) {
        const unsigned blocks = elementwise_blocks(key_values / 8);
        copy_keys_kernel<<<blocks, kElementwiseThreads, 0, stream>>>(
            reinterpret_cast<const uint4 *>(k), reinterpret_cast<const uint4 *>(v), key_values / 8, batches,
            reinterpret_cast<uint4 *>(k_copies), reinterpret_cast<uint4 *>(v_copies));
        CUDA_CHECK_LAUNCH();
    }
    float scale = 1.0f / sqrtf(static_cast<float>(head_dim)), one = 1.0f;
    const int64_t uids[] = {kUidQ,  kUidK,  kUidV,     kUidO,   kUidDO,         kUidStats,  kUidDQ,
                            kUidDK, kUidDV, kUidScale, kUidOne, kUidSoftmaxSum, kUidDQAccum};
    void *const pointers[] = {const_cast<gpu_bf16 *>(q),
                              batches > 1 ? static_cast<void *>(k_copies) : const_cast<gpu_bf16 *>(k),
                              batches > 1 ? static_cast<void *>(v_copies) : const_cast<gpu_bf16 *>(v),
                              const_cast<gpu_bf16 *>(out),
                              const_cast<gpu_bf16 *>(dout),
                              const_cast<float *>(stats),
                              dq,
                              batches > 1 ? const_cast<uint4 *>(dk_pieces) : static_cast<void *>(dk),
                              batches > 1 ? const_cast<uint4 *>(dv_pieces) : static_cast<void *>(dv),
                              &scale,
                              &one,
                              buffer + workspace_bytes,
                              buffer + workspace_bytes + sum_bytes};
    execute(s, *e, 13, uids, pointers, buffer, stream);
    if (batches > 1) {
        const unsigned blocks = elementwise_blocks(key_values / 8);
        add_key_pieces_kernel<<<blocks, kElementwiseThreads, 0, stream>>>(
            dk_pieces, dv_pieces, key_values / 8, batches, reinterpret_cast<uint4 *>(dk), reinterpret_cast<uint4 *>(dv));
        CUDA_CHECK_LAUNCH();
    }
}

extern "C" void attention_cudnn_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                    const gpu_bf16 *v, int64_t seq_len, int num_heads, int head_dim, gpu_bf16 *out,
                                    float *stats, cudaStream_t stream)
{
    attention_cudnn_cross_fwd(context, q, k, v, seq_len, seq_len, num_heads, head_dim, out, stats, stream);
}

extern "C" void attention_cudnn_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                    const gpu_bf16 *v, const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats,
                                    int64_t seq_len, int num_heads, int head_dim, gpu_bf16 *dq, gpu_bf16 *dk,
                                    gpu_bf16 *dv, cudaStream_t stream)
{
    attention_cudnn_cross_bwd(context, q, k, v, out, dout, stats, seq_len, seq_len, num_heads, head_dim, dq, dk, dv, stream);
}

// ---- self-attention over whole tiles (attention_cudnn.h) ---------------------------------------------------------

namespace {

constexpr int kRescaleThreads = 256;
constexpr float kLeastRealShare = 1.0f / 4096.0f;  // (Z - P) / Z below this: NaN (attention_cudnn.h)

// Rows of `pairs_per_block` (row, head) pairs: every thread reads its pair's stats first, the block meets, then
// the pair's first thread writes the new stats, while each thread scales its 16-byte vectors of out.
__global__ void __launch_bounds__(kRescaleThreads) rescale_padded_kernel(uint4 *out, float *stats, int64_t seq_len,
                                                                         int64_t padded_rows, int num_heads,
                                                                         int vecs_per_head, float pad_keys)
{
    const int pairs_per_block = kRescaleThreads / vecs_per_head;
    const int64_t pair = (int64_t)blockIdx.x * pairs_per_block + threadIdx.x / vecs_per_head;
    const int lane = threadIdx.x % vecs_per_head;
    const bool active = threadIdx.x < pairs_per_block * vecs_per_head && pair < seq_len * num_heads;
    const int64_t row = active ? pair / num_heads : 0, head = active ? pair % num_heads : 0;
    float *const stat = stats + head * padded_rows + row;
    const float lse = active ? *stat : 0.0f;
    // share of the real keys in the padded sum: 1 - P exp(-lse), its log, and the factor on out
    const float real_share = -expm1f(logf(pad_keys) - lse);
    const bool precise = real_share >= kLeastRealShare;
    const float factor = precise ? 1.0f / real_share : __int_as_float(0x7fc00000);
    __syncthreads();
    if (!active) return;
    if (lane == 0) *stat = precise ? lse + logf(real_share) : factor;
    uint4 *const vector = out + (row * num_heads + head) * vecs_per_head + lane;
    float values[kVecElems];
    unpack8(*vector, values);
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) values[j] *= factor;
    *vector = pack8(values);
}

} // namespace

extern "C" int64_t attention_cudnn_padded_rows(int64_t seq_len)
{
    return (seq_len + ATTENTION_CUDNN_TILE - 1) / ATTENTION_CUDNN_TILE * ATTENTION_CUDNN_TILE;
}

extern "C" void attention_cudnn_fwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v, int64_t seq_len,
                                           int64_t padded_rows, int num_heads, int head_dim, gpu_bf16 *out,
                                           float *stats, cudaStream_t stream)
{
    ALDIT_CHECK(seq_len >= 1 && padded_rows >= seq_len, "attention_cudnn_fwd_padded: padded_rows %lld must be at least "
                "seq_len %lld", (long long)padded_rows, (long long)seq_len);
    attention_cudnn_cross_fwd(context, q, k, v, padded_rows, padded_rows, num_heads, head_dim, out, stats, stream);
    attention_cudnn_rescale_padded(out, stats, seq_len, padded_rows, num_heads, head_dim, stream);
}

extern "C" void attention_cudnn_rescale_padded(gpu_bf16 *out, float *stats, int64_t seq_len, int64_t padded_rows,
                                               int num_heads, int head_dim, cudaStream_t stream)
{
    ALDIT_CHECK(head_dim % 8 == 0 && head_dim <= 128 && padded_rows >= seq_len, "attention_cudnn_rescale_padded: "
                "head_dim %d, seq_len %lld, padded_rows %lld", head_dim, (long long)seq_len, (long long)padded_rows);
    if (padded_rows == seq_len) return;
    const int vecs_per_head = head_dim / 8;  // head_dim: a multiple of 8 up to 128 (checked above)
    const int64_t pairs = seq_len * num_heads, pairs_per_block = kRescaleThreads / vecs_per_head;
    const int64_t blocks = (pairs + pairs_per_block - 1) / pairs_per_block;
    rescale_padded_kernel<<<(unsigned)blocks, kRescaleThreads, 0, stream>>>(
        reinterpret_cast<uint4 *>(out), stats, seq_len, padded_rows, num_heads, vecs_per_head,
        static_cast<float>(padded_rows - seq_len));
    CUDA_CHECK_LAUNCH();
}

extern "C" void attention_cudnn_bwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                                           const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats,
                                           int64_t seq_len, int64_t padded_rows, int num_heads, int head_dim,
                                           gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv, cudaStream_t stream)
{
    ALDIT_CHECK(seq_len >= 1 && padded_rows >= seq_len, "attention_cudnn_bwd_padded: padded_rows %lld must be at least "
                "seq_len %lld", (long long)padded_rows, (long long)seq_len);
    attention_cudnn_cross_bwd(context, q, k, v, out, dout, stats, padded_rows, padded_rows, num_heads, head_dim, dq, dk, dv,
                              stream);
}

extern "C" attention_cudnn *attention_cudnn_create(int autotune, int64_t tune_least_rows)
{
    attention_cudnn *context = static_cast<attention_cudnn *>(xcalloc(1, sizeof(attention_cudnn)));
    CUDA_CHECK(cudaGetDevice(&context->device));
    context->autotune = autotune != 0;
    context->tune_least_rows = tune_least_rows > 0 ? tune_least_rows : ATTENTION_CUDNN_TUNE_LEAST_ROWS;
    return context;
}

extern "C" void attention_cudnn_free(attention_cudnn *context)
{
    if (!context) return;
    attention_cudnn &s = *context;
    if (s.handle) CUDA_CHECK(cudaDeviceSynchronize());
    for (plan_entry &e : s.plans) destroy_entry(s, e);
    if (s.have_marks)
        for (cudaEvent_t mark : s.tune_marks) CUDA_CHECK(cudaEventDestroy(mark));
    if (s.buffer) CUDA_CHECK(cudaFree(s.buffer));
    if (s.handle) CUDNN_CHECK(cudnnDestroy(s.handle));
    free(context);
}

extern "C" int attention_cudnn_prepare(attention_cudnn *context, int64_t seq_len_q, int64_t seq_len_kv, int num_heads,
                                       int head_dim)
{
    attention_cudnn &s = checked(context, "attention_cudnn_prepare");
    ALDIT_CHECK(shape_supported(seq_len_q, seq_len_kv, num_heads, head_dim), "attention_cudnn_prepare: no cuDNN "
                "attention for seq_len_q %lld, seq_len_kv %lld, %d heads of head_dim %d", (long long)seq_len_q,
                (long long)seq_len_kv, num_heads, head_dim);
    const int64_t before = s.plans_built;
    need_plan(s, kForward, seq_len_q, seq_len_kv, num_heads, head_dim);
    need_plan(s, kBackward, seq_len_q, seq_len_kv, num_heads, head_dim, query_batches_for(seq_len_q, seq_len_kv));
    return (int)(s.plans_built - before);
}

extern "C" void attention_cudnn_setup_stats(const attention_cudnn *context, int64_t *plans_built, double *seconds)
{
    *plans_built = context ? context->plans_built : 0;
    *seconds = context ? context->setup_seconds : 0.0;
}

extern "C" void attention_cudnn_tuning_report(const attention_cudnn *context, FILE *out)
{
    auto print_choice = [out](const engine_choice &choice) {
        fprintf(out, "engine %lld", (long long)choice.engine);
        for (int k = 0; k < choice.n_knobs; ++k)
            fprintf(out, "%s%d=%lld", k ? "," : " knobs ", (int)choice.knobs[k].type, (long long)choice.knobs[k].value);
    };
    for (int i = 0; i < context->n_tune_records; ++i) {
        const tune_record &r = context->tune_records[i];
        fprintf(out, "cuDNN %s %lld x %lld: %d candidates; heuristics' first %.3f ms (", direction_name(r.direction),
                (long long)r.seq_len_q, (long long)r.seq_len_kv, r.n_candidates, r.first_ms);
        print_choice(r.first);
        fprintf(out, "), kept %.3f ms (", r.best_ms);
        print_choice(r.best);
        fprintf(out, "); knobs [range/stride], + swept: %s\n", r.knob_ranges);
    }
}
