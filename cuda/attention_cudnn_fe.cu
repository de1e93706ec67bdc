// attention_cudnn_fe.cu — cuda/attention_cudnn.h through NVIDIA's cudnn-frontend graph API (configure --with-cudnn-attention=frontend): the unified SDPA forward and cudnn-frontend's composite SDPA backward for one sample, plans cached by shape in the context, their engine configuration autotuned once per size class; self-attention over zero-padded whole tiles; the few-key backward in query batches.
//
// Memory [S, H, D] (a sample's packed rows) is described as dims [1, H, S, D] with strides {S·H·D, D, H·D, 1}; the
// stats [H, S_q] as [1, H, S_q, 1]. The backward in B query batches sees Q, O, dO, dQ as [B, H, S_q / B, D] (each
// batch one block of rows), K and V as B copies [B, H, S_kv, D], dK and dV as B bf16 pieces added up in fp32 by
// add_key_pieces_kernel, and the stats copied batch-major (cudnn-frontend takes a packed [B, H, S, 1] before cuDNN
// 9.26). cudnn-frontend keeps the backward's fp32 softmax sum and dQ accumulator in the graph's workspace.
#include "cuda/attention_cudnn.h"

#include <math.h>
#include <string.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include "cuda/bf16vec.cuh"

#if CUDNN_VERSION < 91301
#error "attention_cudnn_fe.cu needs cuDNN 9.13.1 or newer (the unified SDPA forward operation)"
#endif

namespace fe = cudnn_frontend;
namespace feg = cudnn_frontend::graph;

namespace {

enum direction { kForward = 0, kBackward = 1 };
enum tensor_uid : int64_t { kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidDO, kUidDQ, kUidDK, kUidDV };

const size_t kErrorBytes = 1024;
const int64_t kProbeRows = 256;       // the query length attention_cudnn_available builds its plans at
const int64_t kProbeKeyRows = 77;     // and its cross-attention key length (not a multiple of 64)
const size_t kAlign = 256;            // the backward's buffer pieces start at multiples of this
const int64_t kMostSplitKeys = 1024;  // the backward splits the query rows only with at most this many keys
const int64_t kLeastBatchRows = 512;  // query rows per batch at least
const int kQueryBatchChoices[] = {ATTENTION_CUDNN_MOST_QUERY_BATCHES, 4, 2};
const int kHeuristicConfigs = 4;      // the heuristics' configurations tried (and, autotuning, timed)
constexpr int kMaxCandidates = 48;
constexpr int64_t kMaxKnobValues = 128;  // a knob whose range has more values than this is not swept
constexpr int kTuneRounds = 3;
constexpr float kTuneKeep = 1.15f;
constexpr float kTuneMargin = 0.02f;

// An engine configuration: the engine's global index and its knob values.
struct engine_choice {
    int64_t engine = -1;
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    bool operator==(const engine_choice &other) const { return engine == other.engine && knobs == other.knobs; }
};

struct plan_entry {
    int direction = 0;
    int64_t seq_len_q = 0, seq_len_kv = 0;
    int num_heads = 0, head_dim = 0, query_batches = 1;
    uint64_t last_use = 0;  // 0: the slot is empty
    std::shared_ptr<feg::Graph> graph;
    int64_t plan = -1;            // the index of the graph's plan that runs
    int64_t workspace_bytes = 0;  // that plan's (cudnn-frontend's own pieces included)
    std::vector<int64_t> candidates;  // other built plans to time at the first call (autotuning), then cleared
    int tune_class = -1;              // the size class waiting for this plan's timing, -1 none
};

// A size class of autotuning (attention_cudnn.h), with what its first plan's timing found.
struct tune_class {
    int direction, num_heads, head_dim, few_keys, size_log2;
    int state;  // 0: not tuned, 1: candidates built and waiting for the first call, 2: tuned
    engine_choice winner;
    std::string knob_ranges;  // the first engine's knobs: type[lowest..highest/stride] (+ swept or - not)
};

struct tune_record {
    std::string knob_ranges;
    int direction;
    int64_t seq_len_q, seq_len_kv;
    int n_candidates;
    float first_ms, best_ms;
    engine_choice first, best;
};

struct probe_result {
    int num_heads, head_dim, available;
};

} // namespace

// A context (attention_cudnn.h): the handle, the plans, the buffer, the probes, what autotuning learnt, and the
// text of the last failed build step (a failed build is not always fatal).
struct attention_cudnn {
    cudnnHandle_t handle = nullptr;  // made at the first call that needs it
    int device = 0;                  // the GPU current at attention_cudnn_create
    bool autotune = false;
    int64_t tune_least_rows = ATTENTION_CUDNN_TUNE_LEAST_ROWS;
    std::vector<plan_entry> plans = std::vector<plan_entry>(ATTENTION_CUDNN_PLAN_SLOTS);
    uint64_t clock = 0;
    void *buffer = nullptr;  // the graph's workspace, then (backward in query batches) stats, K, V copies, pieces
    size_t buffer_bytes = 0;
    std::vector<probe_result> probes;
    std::vector<cudaEvent_t> tune_marks;  // a tuning round: before the first plan, after each
    std::vector<tune_class> classes;
    std::vector<tune_record> tune_records;
    char build_error[kErrorBytes] = "";
};

namespace {

using context = attention_cudnn;

// Inside a plan build (functions returning bool): record a failed cudnn-frontend step in s.build_error, return false.
#define FE_TRY(s, call) do { fe::error_t fe_status_ = (call); if (fe_status_.is_bad()) { \
    snprintf((s).build_error, kErrorBytes, "%s:%d: cudnn-frontend error in %s: %s", __FILE__, __LINE__, #call, \
             fe_status_.get_message().c_str()); \
    return false; } } while (0)
// Fatal on failure (execution and bookkeeping).
#define FE_CHECK(call) do { fe::error_t fe_status_ = (call); if (fe_status_.is_bad()) \
    aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "cudnn-frontend error in %s: %s", #call, \
                   fe_status_.get_message().c_str()); } while (0)
#define CUDNN_CHECK(call) do { const cudnnStatus_t cudnn_status_ = (call); if (cudnn_status_ != CUDNN_STATUS_SUCCESS) \
    aldit_fatal_at(__FILE__, __LINE__, ALDIT_EXIT_ERROR, "cuDNN error %s in %s", cudnnGetErrorString(cudnn_status_), \
                   #call); } while (0)

size_t align_up(size_t bytes)
{
    return (bytes + kAlign - 1) / kAlign * kAlign;
}

const char *direction_name(int direction)
{
    return direction == kForward ? "forward" : "backward";
}

using tensor = std::shared_ptr<feg::Tensor_attributes>;

// B batches of S rows [S, H, D] (batch b's rows start at b·S·H·D), as [B, H, S, D].
void describe_rows(feg::Tensor_attributes &t, int64_t uid, int64_t B, int64_t S, int64_t H, int64_t D)
{
    t.set_uid(uid).set_dim({B, H, S, D}).set_stride({S * H * D, D, H * D, 1});
}

tensor rows_tensor(feg::Graph &g, const char *name, int64_t uid, int64_t B, int64_t S, int64_t H, int64_t D)
{
    feg::Tensor_attributes t;
    t.set_name(name);
    describe_rows(t, uid, B, S, H, D);
    return g.tensor(t);
}

// Per-(head, row) fp32 values, batch- then head-major: [B, H, S, 1].
void describe_stats(feg::Tensor_attributes &t, int64_t B, int64_t S, int64_t H)
{
    t.set_uid(kUidStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, S, 1}).set_stride({H * S, S, 1, 1});
}

std::shared_ptr<feg::Graph> new_graph()
{
    auto g = std::make_shared<feg::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

// The unified SDPA forward: O and stats from Q, K, V.
std::shared_ptr<feg::Graph> forward_graph(const plan_entry &e)
{
    const int64_t S_q = e.seq_len_q, S_kv = e.seq_len_kv, H = e.num_heads, D = e.head_dim;
    auto g = new_graph();
    tensor q = rows_tensor(*g, "Q", kUidQ, 1, S_q, H, D), k = rows_tensor(*g, "K", kUidK, 1, S_kv, H, D),
           v = rows_tensor(*g, "V", kUidV, 1, S_kv, H, D);
    auto attributes = feg::SDPA_attributes()
                          .set_name("sdpa")
                          .set_generate_stats(true)
                          .set_attn_scale(1.0f / sqrtf(static_cast<float>(D)))
                          .set_implementation(fe::AttentionImplementation_t::UNIFIED);
    auto [o, stats] = g->sdpa(q, k, v, attributes);
    o->set_output(true);
    describe_rows(*o, kUidO, 1, S_q, H, D);
    stats->set_output(true);
    describe_stats(*stats, 1, S_q, H);
    return g;
}

// cudnn-frontend's SDPA backward, the query rows in e.query_batches batches (see the top of the file).
std::shared_ptr<feg::Graph> backward_graph(const plan_entry &e)
{
    const int64_t B = e.query_batches, S_q = e.seq_len_q / B, S_kv = e.seq_len_kv, H = e.num_heads, D = e.head_dim;
    auto g = new_graph();
    tensor q = rows_tensor(*g, "Q", kUidQ, B, S_q, H, D), k = rows_tensor(*g, "K", kUidK, B, S_kv, H, D),
           v = rows_tensor(*g, "V", kUidV, B, S_kv, H, D), o = rows_tensor(*g, "O", kUidO, B, S_q, H, D),
           d_o = rows_tensor(*g, "dO", kUidDO, B, S_q, H, D);
    feg::Tensor_attributes stats_attributes;
    stats_attributes.set_name("stats");
    describe_stats(stats_attributes, B, S_q, H);
    tensor stats = g->tensor(stats_attributes);
    auto attributes =
        feg::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(1.0f / sqrtf(static_cast<float>(D)));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, attributes);
    dq->set_output(true);
    describe_rows(*dq, kUidDQ, B, S_q, H, D);
    dk->set_output(true);
    describe_rows(*dk, kUidDK, B, S_kv, H, D);
    dv->set_output(true);
    describe_rows(*dv, kUidDV, B, S_kv, H, D);
    return g;
}

bool read_choice(context &s, const plan_entry &e, int64_t index, engine_choice &choice)
{
    FE_TRY(s, e.graph->get_engine_and_knobs_at_index(index, choice.engine, choice.knobs));
    return true;
}

// Builds the graph's plan `index`; its workspace in *bytes.
bool build_at(context &s, plan_entry &e, int64_t index, int64_t *bytes)
{
    FE_TRY(s, e.graph->build_plan_at_index(index));
    FE_TRY(s, e.graph->get_workspace_size_plan_at_index(index, *bytes));
    return true;
}

// Adds `choice` as a plan of e's graph and, when it builds within e's workspace, to e's candidates.
void add_candidate(context &s, plan_entry &e, const engine_choice &choice, std::vector<engine_choice> &seen)
{
    if (static_cast<int>(e.candidates.size()) == kMaxCandidates) return;
    for (const engine_choice &other : seen)
        if (other == choice) return;
    seen.push_back(choice);
    if (e.graph->create_execution_plan(choice.engine, choice.knobs).is_bad()) return;
    const int64_t index = e.graph->get_execution_plan_count() - 1;
    int64_t bytes = 0;
    if (build_at(s, e, index, &bytes) && bytes <= e.workspace_bytes) e.candidates.push_back(index);
}

// e's candidates (its plan, the heuristics' first, built): the heuristics' other configurations and e's engine with
// each knob swept over its range.
void build_candidates(context &s, plan_entry &e, int64_t n_heuristic, std::string &knob_ranges)
{
    engine_choice first;
    if (!read_choice(s, e, e.plan, first)) return;
    std::vector<engine_choice> seen = {first};
    for (int64_t i = e.plan + 1; i < n_heuristic; ++i) {
        engine_choice choice;
        int64_t bytes = 0;
        if (!read_choice(s, e, i, choice)) continue;
        bool known = false;
        for (const engine_choice &other : seen) known = known || other == choice;
        if (known || static_cast<int>(e.candidates.size()) == kMaxCandidates) continue;
        seen.push_back(choice);
        if (build_at(s, e, i, &bytes) && bytes <= e.workspace_bytes) e.candidates.push_back(i);
    }
    std::vector<fe::Knob> infos;
    if (e.graph->get_knobs_for_engine(first.engine, infos).is_bad()) infos.clear();
    for (const fe::Knob &info : infos) {
        const int64_t stride = info.stride < 1 ? 1 : info.stride;
        const bool swept = info.maxValue >= info.minValue && (info.maxValue - info.minValue) / stride + 1 <= kMaxKnobValues;
        char range[96];
        snprintf(range, sizeof range, "%s%d[%lld..%lld/%lld]%c", knob_ranges.empty() ? "" : " ", (int)info.type,
                 (long long)info.minValue, (long long)info.maxValue, (long long)stride, swept ? '+' : '-');
        knob_ranges += range;
        for (int64_t value = info.minValue; swept && value <= info.maxValue; value += stride) {
            engine_choice choice = first;
            choice.knobs[info.type] = value;
            add_candidate(s, e, choice, seen);
        }
    }
}

// The size class of a plan (found or added), -1 when its shape is below the tuning's least rows.
int tune_class_of(context &s, const plan_entry &e)
{
    const double rows = sqrt(static_cast<double>(e.seq_len_q) * static_cast<double>(e.seq_len_kv));
    if (rows < static_cast<double>(s.tune_least_rows)) return -1;
    const int size_log2 = static_cast<int>(floor(log2(rows)));
    const int few_keys = e.seq_len_kv <= kMostSplitKeys;
    for (size_t i = 0; i < s.classes.size(); ++i) {
        const tune_class &c = s.classes[i];
        if (c.direction == e.direction && c.num_heads == e.num_heads && c.head_dim == e.head_dim &&
            c.few_keys == few_keys && c.size_log2 == size_log2)
            return static_cast<int>(i);
    }
    s.classes.push_back({e.direction, e.num_heads, e.head_dim, few_keys, size_log2, 0, {}, {}});
    return static_cast<int>(s.classes.size()) - 1;
}

// Heuristics (mode A) -> the first of their configurations that builds; with autotuning, the class's winner instead
// where it builds, or for the class's first plan the candidates to time at its first call.
bool build_plans(context &s, plan_entry &e)
{
    FE_TRY(s, e.graph->validate());
    FE_TRY(s, e.graph->build_operation_graph(s.handle));
    FE_TRY(s, e.graph->create_execution_plans({fe::HeurMode_t::A}));
    FE_TRY(s, e.graph->check_support(s.handle));
    int64_t n_heuristic = e.graph->get_execution_plan_count();
    if (n_heuristic > kHeuristicConfigs) n_heuristic = kHeuristicConfigs;
    const int index = s.autotune ? tune_class_of(s, e) : -1;
    if (index >= 0 && s.classes[index].state == 2 &&
        e.graph->create_execution_plan(s.classes[index].winner.engine, s.classes[index].winner.knobs).is_good()) {
        const int64_t winner = e.graph->get_execution_plan_count() - 1;
        if (build_at(s, e, winner, &e.workspace_bytes)) {
            e.plan = winner;
            return true;
        }
    }
    for (int64_t i = 0; i < n_heuristic && e.plan < 0; ++i)
        if (build_at(s, e, i, &e.workspace_bytes)) e.plan = i;
    if (e.plan < 0) return false;
    if (index >= 0 && s.classes[index].state == 0) {
        tune_class &c = s.classes[index];
        build_candidates(s, e, n_heuristic, c.knob_ranges);
        if (e.candidates.empty()) {
            c.state = 2;
            read_choice(s, e, e.plan, c.winner);
        } else {
            c.state = 1;
            e.tune_class = index;
        }
    }
    return true;
}

void destroy_entry(context &s, plan_entry &e)
{
    if (e.tune_class >= 0 && !e.candidates.empty()) s.classes[e.tune_class].state = 0;  // not timed: the next plan tunes
    e = plan_entry();
}

bool ensure_handle(context &s)
{
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    ALDIT_CHECK(device == s.device, "attention_cudnn: the context was made on GPU %d, called on GPU %d", s.device,
                device);
    if (s.handle) return true;
    const cudnnStatus_t status = cudnnCreate(&s.handle);
    if (status == CUDNN_STATUS_SUCCESS) return true;
    s.handle = nullptr;
    snprintf(s.build_error, kErrorBytes, "cudnnCreate: %s", cudnnGetErrorString(status));
    return false;
}

// The cached plan of this shape, built on a miss into an empty or the least recently used slot. NULL when the build
// fails (s.build_error says why).
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
    plan_entry &e = *victim;
    e.direction = direction;
    e.seq_len_q = seq_len_q;
    e.seq_len_kv = seq_len_kv;
    e.num_heads = num_heads;
    e.head_dim = head_dim;
    e.query_batches = query_batches;
    bool built = false;
    try {  // cudnn-frontend reports most failures as error_t, a few as exceptions
        e.graph = direction == kForward ? forward_graph(e) : backward_graph(e);
        built = build_plans(s, e);
    } catch (const std::exception &failure) {
        snprintf(s.build_error, kErrorBytes, "cudnn-frontend: %s", failure.what());
    }
    if (!built) {
        destroy_entry(s, e);
        return nullptr;
    }
    e.last_use = ++s.clock;
    return &e;
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

// Times e's plan (the heuristics' first, candidate 0) and its candidates on the call's tensors and keeps the fastest.
void tune(context &s, plan_entry &e, std::unordered_map<int64_t, void *> &pack, void *workspace, cudaStream_t stream)
{
    const int n = static_cast<int>(e.candidates.size()) + 1;
    if (s.tune_marks.empty()) {
        s.tune_marks.resize(kMaxCandidates + 2);
        for (cudaEvent_t &mark : s.tune_marks) CUDA_CHECK(cudaEventCreate(&mark));
    }
    auto plan_of = [&e](int c) { return c == 0 ? e.plan : e.candidates[c - 1]; };
    float least_ms[kMaxCandidates + 1] = {};
    bool refused[kMaxCandidates + 1] = {}, dropped[kMaxCandidates + 1] = {};
    for (int round = 0; round <= kTuneRounds; ++round) {
        CUDA_CHECK(cudaEventRecord(s.tune_marks[0], stream));
        for (int c = 0; c < n; ++c) {
            if (!refused[c] && !dropped[c])
                refused[c] = e.graph->execute_plan_at_index(s.handle, pack, workspace, plan_of(c)).is_bad();
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
    tune_class &c = s.classes[e.tune_class];
    tune_record record = {c.knob_ranges, e.direction, e.seq_len_q, e.seq_len_kv, n - 1, least_ms[0], least_ms[best],
                          {}, {}};
    read_choice(s, e, e.plan, record.first);
    read_choice(s, e, plan_of(best), record.best);
    e.plan = plan_of(best);  // e.workspace_bytes stays: the candidates need no more
    e.candidates.clear();
    c.state = 2;
    c.winner = record.best;
    s.tune_records.push_back(record);
}

void execute(context &s, plan_entry &e, std::unordered_map<int64_t, void *> &pack, void *workspace,
             cudaStream_t stream)
{
    CUDNN_CHECK(cudnnSetStream(s.handle, stream));
    if (!e.candidates.empty()) tune(s, e, pack, workspace, stream);
    FE_CHECK(e.graph->execute_plan_at_index(s.handle, pack, workspace, e.plan));
}

// The context's device buffer, at least `bytes` long. A new one starts poisoned (all bits set: NaN), so a piece
// cuDNN would read before writing shows up in the results.
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

bool shape_supported(int64_t seq_len_q, int64_t seq_len_kv, int num_heads, int head_dim)
{
    return seq_len_q >= 1 && seq_len_kv >= 1 && num_heads >= 1 && head_dim >= 8 && head_dim <= 128 &&
           head_dim % 8 == 0;
}

void check_call(const context *s, const char *function, int64_t seq_len_q, int64_t seq_len_kv, int num_heads,
                int head_dim, const void *const *tensors, const char *const *names, int n_tensors)
{
    ALDIT_CHECK(s != nullptr, "%s: no context (attention_cudnn_create)", function);
    ALDIT_CHECK(shape_supported(seq_len_q, seq_len_kv, num_heads, head_dim),
                "%s: seq_len_q %lld, seq_len_kv %lld, %d heads, head_dim %d not supported (lengths and heads >= 1, "
                "head_dim a multiple of 8 from 8 to 128)", function, (long long)seq_len_q, (long long)seq_len_kv,
                num_heads, head_dim);
    for (int i = 0; i < n_tensors; ++i)
        ALDIT_CHECK(tensors[i] != nullptr && reinterpret_cast<uintptr_t>(tensors[i]) % 16 == 0,
                    "%s: %s is NULL or not 16-byte aligned (%p)", function, names[i], tensors[i]);
}

// ---- the backward's query batches (attention_cudnn.h) ------------------------------------------------------------

constexpr int kElementwiseThreads = 256;
constexpr int64_t kElementwiseMaxBlocks = 4096;

// The query batches the backward of this shape runs in: the first of 8, 4, 2 that divides seq_len_q into batches of
// at least kLeastBatchRows rows when there are at most kMostSplitKeys keys, else 1.
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

// `batches` copies of k and v (n_vectors 16-byte vectors each), back to back; and the stats [H, batches * rows]
// batch-major ([batches, H, rows]).
__global__ void copy_keys_kernel(const uint4 *k, const uint4 *v, int64_t n_vectors, int batches, uint4 *k_copies,
                                 uint4 *v_copies, const float *stats, int64_t heads, int64_t rows, float *stats_copy)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_vectors; i += stride) {
        const uint4 kv = k[i], vv = v[i];
        for (int b = 0; b < batches; ++b) {
            k_copies[b * n_vectors + i] = kv;
            v_copies[b * n_vectors + i] = vv;
        }
    }
    const int64_t n_stats = heads * batches * rows;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_stats; i += stride) {
        const int64_t h = i / (batches * rows), b = i / rows % batches, r = i % rows;
        stats_copy[(b * heads + h) * rows + r] = stats[i];
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

// ---- self-attention over whole tiles (attention_cudnn.h) ---------------------------------------------------------

constexpr int kRescaleThreads = 256;
constexpr float kLeastRealShare = 1.0f / 4096.0f;  // (Z - P) / Z below this: NaN (attention_cudnn.h)

// Rows of `pairs_per_block` (row, head) pairs: every thread reads its pair's stats first, the block meets, then the
// pair's first thread writes the new stats, while each thread scales its 16-byte vectors of out.
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

extern "C" attention_cudnn *attention_cudnn_create(int autotune, int64_t tune_least_rows)
{
    attention_cudnn *s = new attention_cudnn();
    CUDA_CHECK(cudaGetDevice(&s->device));
    s->autotune = autotune != 0;
    s->tune_least_rows = tune_least_rows > 0 ? tune_least_rows : ATTENTION_CUDNN_TUNE_LEAST_ROWS;
    return s;
}

extern "C" void attention_cudnn_free(attention_cudnn *context)
{
    if (!context) return;
    if (context->handle) CUDA_CHECK(cudaDeviceSynchronize());
    context->plans.clear();  // the graphs' plans before the handle
    for (cudaEvent_t mark : context->tune_marks) CUDA_CHECK(cudaEventDestroy(mark));
    if (context->buffer) CUDA_CHECK(cudaFree(context->buffer));
    if (context->handle) CUDNN_CHECK(cudnnDestroy(context->handle));
    delete context;
}

extern "C" int attention_cudnn_available(attention_cudnn *context, int num_heads, int head_dim)
{
    ALDIT_CHECK(context != nullptr, "attention_cudnn_available: no context (attention_cudnn_create)");
    attention_cudnn &s = *context;
    for (const probe_result &probe : s.probes)
        if (probe.num_heads == num_heads && probe.head_dim == head_dim) return probe.available;
    int available = 0;
    if (!shape_supported(kProbeRows, kProbeKeyRows, num_heads, head_dim)) {
        aldit_warn("cuDNN attention: %d heads of head_dim %d are not supported (a multiple of 8 up to 128)",
                   num_heads, head_dim);
    } else if (gpu_count() == 0) {
        aldit_warn("cuDNN attention: no GPU visible");
    } else if (cudnnGetVersion() <= 91500) {
        aldit_warn("cuDNN attention: the loaded cuDNN is %zu; the unified SDPA forward needs 9.13.1 or newer and "
                   "the backward, without a padding mask, a release newer than 9.15.0", cudnnGetVersion());
    } else if (!find_plan(s, kForward, kProbeRows, kProbeRows, num_heads, head_dim) ||
               !find_plan(s, kBackward, kProbeRows, kProbeRows, num_heads, head_dim) ||
               !find_plan(s, kForward, kProbeRows, kProbeKeyRows, num_heads, head_dim) ||
               !find_plan(s, kBackward, kProbeRows, kProbeKeyRows, num_heads, head_dim)) {
        aldit_warn("cuDNN attention: no plan for %d heads of head_dim %d: %s", num_heads, head_dim, s.build_error);
    } else {
        available = 1;
    }
    s.probes.push_back({num_heads, head_dim, available});
    return available;
}

extern "C" void attention_cudnn_cross_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                          const gpu_bf16 *v, int64_t seq_len_q, int64_t seq_len_kv, int num_heads,
                                          int head_dim, gpu_bf16 *out, float *stats, cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, stats};
    const char *names[] = {"q", "k", "v", "out", "stats"};
    check_call(context, "attention_cudnn_cross_fwd", seq_len_q, seq_len_kv, num_heads, head_dim, tensors, names, 5);
    plan_entry *e = need_plan(*context, kForward, seq_len_q, seq_len_kv, num_heads, head_dim);
    void *workspace = e->workspace_bytes > 0 ? ensure_buffer(*context, static_cast<size_t>(e->workspace_bytes)) : nullptr;
    std::unordered_map<int64_t, void *> pack = {{kUidQ, const_cast<gpu_bf16 *>(q)}, {kUidK, const_cast<gpu_bf16 *>(k)},
                                                {kUidV, const_cast<gpu_bf16 *>(v)}, {kUidO, out}, {kUidStats, stats}};
    execute(*context, *e, pack, workspace, stream);
}

extern "C" void attention_cudnn_cross_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                          const gpu_bf16 *v, const gpu_bf16 *out, const gpu_bf16 *dout,
                                          const float *stats, int64_t seq_len_q, int64_t seq_len_kv, int num_heads,
                                          int head_dim, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv, cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, dout, stats, dq, dk, dv};
    const char *names[] = {"q", "k", "v", "out", "dout", "stats", "dq", "dk", "dv"};
    check_call(context, "attention_cudnn_cross_bwd", seq_len_q, seq_len_kv, num_heads, head_dim, tensors, names, 9);
    const int batches = query_batches_for(seq_len_q, seq_len_kv);
    plan_entry *e = need_plan(*context, kBackward, seq_len_q, seq_len_kv, num_heads, head_dim, batches);
    // the buffer: the graph's workspace; with query batches, the stats batch-major, K and V copies, dK and dV pieces
    const size_t key_values = static_cast<size_t>(seq_len_kv) * num_heads * head_dim;
    const size_t workspace_bytes = align_up(static_cast<size_t>(e->workspace_bytes));
    const size_t stats_bytes = batches > 1 ? align_up(static_cast<size_t>(num_heads) * seq_len_q * sizeof(float)) : 0;
    const size_t copy_bytes = batches > 1 ? align_up(batches * key_values * sizeof(gpu_bf16)) : 0;
    char *const buffer = ensure_buffer(*context, workspace_bytes + stats_bytes + 4 * copy_bytes);
    float *const stats_copy = reinterpret_cast<float *>(buffer + workspace_bytes);
    char *const k_copies = buffer + workspace_bytes + stats_bytes, *const v_copies = k_copies + copy_bytes;
    uint4 *const dk_pieces = reinterpret_cast<uint4 *>(v_copies + copy_bytes);
    uint4 *const dv_pieces = reinterpret_cast<uint4 *>(v_copies + 2 * copy_bytes);
    const unsigned blocks = elementwise_blocks(key_values / 8 > (size_t)num_heads * seq_len_q
                                                   ? key_values / 8 : (size_t)num_heads * seq_len_q);
    if (batches > 1) {
        copy_keys_kernel<<<blocks, kElementwiseThreads, 0, stream>>>(
            reinterpret_cast<const uint4 *>(k), reinterpret_cast<const uint4 *>(v), key_values / 8, batches,
            reinterpret_cast<uint4 *>(k_copies), reinterpret_cast<uint4 *>(v_copies), stats, num_heads,
            seq_len_q / batches, stats_copy);
        CUDA_CHECK_LAUNCH();
    }
    const bool split = batches > 1;
    std::unordered_map<int64_t, void *> pack = {
        {kUidQ, const_cast<gpu_bf16 *>(q)},
        {kUidK, split ? static_cast<void *>(k_copies) : const_cast<gpu_bf16 *>(k)},
        {kUidV, split ? static_cast<void *>(v_copies) : const_cast<gpu_bf16 *>(v)},
        {kUidO, const_cast<gpu_bf16 *>(out)},
        {kUidDO, const_cast<gpu_bf16 *>(dout)},
        {kUidStats, split ? stats_copy : const_cast<float *>(stats)},
        {kUidDQ, dq},
        {kUidDK, split ? static_cast<void *>(dk_pieces) : dk},
        {kUidDV, split ? static_cast<void *>(dv_pieces) : dv}};
    execute(*context, *e, pack, e->workspace_bytes > 0 ? buffer : nullptr, stream);
    if (split) {
        add_key_pieces_kernel<<<elementwise_blocks(key_values / 8), kElementwiseThreads, 0, stream>>>(
            dk_pieces, dv_pieces, key_values / 8, batches, reinterpret_cast<uint4 *>(dk), reinterpret_cast<uint4 *>(dv));
        CUDA_CHECK_LAUNCH();
    }
}

extern "C" void attention_cudnn_fwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                                    int64_t seq_len, int num_heads, int head_dim, gpu_bf16 *out, float *stats,
                                    cudaStream_t stream)
{
    attention_cudnn_cross_fwd(context, q, k, v, seq_len, seq_len, num_heads, head_dim, out, stats, stream);
}

extern "C" void attention_cudnn_bwd(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k, const gpu_bf16 *v,
                                    const gpu_bf16 *out, const gpu_bf16 *dout, const float *stats, int64_t seq_len,
                                    int num_heads, int head_dim, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv,
                                    cudaStream_t stream)
{
    attention_cudnn_cross_bwd(context, q, k, v, out, dout, stats, seq_len, seq_len, num_heads, head_dim, dq, dk, dv,
                              stream);
}

extern "C" int64_t attention_cudnn_padded_rows(int64_t seq_len)
{
    return (seq_len + ATTENTION_CUDNN_TILE - 1) / ATTENTION_CUDNN_TILE * ATTENTION_CUDNN_TILE;
}

extern "C" void attention_cudnn_fwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                           const gpu_bf16 *v, int64_t seq_len, int64_t padded_rows, int num_heads,
                                           int head_dim, gpu_bf16 *out, float *stats, cudaStream_t stream)
{
    ALDIT_CHECK(seq_len >= 1 && padded_rows >= seq_len, "attention_cudnn_fwd_padded: padded_rows %lld must be at least "
                "seq_len %lld", (long long)padded_rows, (long long)seq_len);
    attention_cudnn_cross_fwd(context, q, k, v, padded_rows, padded_rows, num_heads, head_dim, out, stats, stream);
    if (padded_rows == seq_len) return;
    const int vecs_per_head = head_dim / 8;  // head_dim: a multiple of 8 up to 128 (checked above)
    const int64_t pairs = seq_len * num_heads, pairs_per_block = kRescaleThreads / vecs_per_head;
    const int64_t blocks = (pairs + pairs_per_block - 1) / pairs_per_block;
    rescale_padded_kernel<<<(unsigned)blocks, kRescaleThreads, 0, stream>>>(
        reinterpret_cast<uint4 *>(out), stats, seq_len, padded_rows, num_heads, vecs_per_head,
        static_cast<float>(padded_rows - seq_len));
    CUDA_CHECK_LAUNCH();
}

extern "C" void attention_cudnn_bwd_padded(attention_cudnn *context, const gpu_bf16 *q, const gpu_bf16 *k,
                                           const gpu_bf16 *v, const gpu_bf16 *out, const gpu_bf16 *dout,
                                           const float *stats, int64_t seq_len, int64_t padded_rows, int num_heads,
                                           int head_dim, gpu_bf16 *dq, gpu_bf16 *dk, gpu_bf16 *dv, cudaStream_t stream)
{
    ALDIT_CHECK(seq_len >= 1 && padded_rows >= seq_len, "attention_cudnn_bwd_padded: padded_rows %lld must be at least "
                "seq_len %lld", (long long)padded_rows, (long long)seq_len);
    attention_cudnn_cross_bwd(context, q, k, v, out, dout, stats, padded_rows, padded_rows, num_heads, head_dim, dq, dk,
                              dv, stream);
}

extern "C" void attention_cudnn_tuning_report(const attention_cudnn *context, FILE *out)
{
    if (!context) return;
    auto print_choice = [out](const engine_choice &choice) {
        fprintf(out, "engine %lld", (long long)choice.engine);
        const char *separator = " knobs ";
        for (const auto &[type, value] : choice.knobs) {
            fprintf(out, "%s%d=%lld", separator, (int)type, (long long)value);
            separator = ",";
        }
    };
    for (const tune_record &r : context->tune_records) {
        fprintf(out, "cuDNN %s %lld x %lld: %d candidates; heuristics' first %.3f ms (", direction_name(r.direction),
                (long long)r.seq_len_q, (long long)r.seq_len_kv, r.n_candidates, r.first_ms);
        print_choice(r.first);
        fprintf(out, "), kept %.3f ms (", r.best_ms);
        print_choice(r.best);
        fprintf(out, "); knobs [range/stride], + swept: %s\n", r.knob_ranges.c_str());
    }
}
