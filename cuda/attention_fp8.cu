// attention_fp8.cu — cuDNN FP8 fused attention (attention_fp8.h) through the C backend API: the composite forward and backward graphs of per-tensor-scaled FP8 SDPA, plans cached by shape; a configuration cuDNN refuses is reported, not fatal.
//
// A sample's [S, H, D] rows are dims [1, H, S, D] with strides {S·H·D, D, H·D, 1} (head-major: {H·S·D, S·D, D, 1});
// K (and, in the backward, V) enter transposed, [1, H, D, S], the strides of dims 2 and 3 swapped. Scores are
// [1, H, S, S] fp32 virtual tensors; P and dS are quantized inside the graph (E4M3 and E5M2 virtual tensors) before
// the second GEMMs, which read them transposed through reshapes. The scale and amax scalars are [1, 1, 1, 1] fp32
// tensors at 16-byte slots of the caller's array; the softmax scale is passed by value.
#include "cuda/attention_fp8.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cudnn.h>

namespace {

const size_t kErrorBytes = 1024;
const int kMaxDescriptors = 256;  // the backward graph takes about 140, the fallback heuristics up to 18 more
const int kMaxOps = 48;

enum tensor_uid : int64_t {
    kUidQ = 1, kUidK, kUidV, kUidO, kUidStats, kUidDO, kUidDQ, kUidDK, kUidDV,
    kUidAttnScale = 19, kUidScaleBase = 20,  // slot i of the scales array: kUidScaleBase + i
    kUidVirtual = 100,
};

enum direction { kForward = 0, kBackward = 1 };

void describe_failure(cudnnStatus_t status, const char *call, const char *file, int line, char *text)
{
    char last[600] = "";
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(text, kErrorBytes, "%s:%d: cuDNN %s in %s%s%s", file, line, cudnnGetErrorString(status), call,
             last[0] ? "; " : "", last);
}

[[noreturn]] void fail_cudnn(cudnnStatus_t status, const char *call, const char *file, int line)
{
    char text[kErrorBytes];
    describe_failure(status, call, file, line, text);
    aldit_fatal_at(file, line, ALDIT_EXIT_ERROR, "%s", text);
}

} // namespace

#define CUDNN_CHECK(call) do { cudnnStatus_t cudnn_status_ = (call); \
    if (cudnn_status_ != CUDNN_STATUS_SUCCESS) fail_cudnn(cudnn_status_, #call, __FILE__, __LINE__); } while (0)
// Inside a build step (a function returning bool): the failure's text into the graph's error, then false.
#define CUDNN_TRY(g, call) do { cudnnStatus_t cudnn_status_ = (call); if (cudnn_status_ != CUDNN_STATUS_SUCCESS) { \
    describe_failure(cudnn_status_, #call, __FILE__, __LINE__, (g).error); return false; } } while (0)

namespace {

struct shape4 {
    int64_t dims[4], strides[4];
};

// The descriptors of one plan (destroyed in reverse order) and the graph's operations while it is built.
struct plan {
    int direction, layout, num_heads, head_dim;
    int64_t seq_len;
    uint64_t last_use;  // 0: empty slot
    cudnnBackendDescriptor_t items[kMaxDescriptors];
    int n_items;
    cudnnBackendDescriptor_t ops[kMaxOps];
    int n_ops;
    int64_t next_virtual;
    cudnnBackendDescriptor_t slots[ATTENTION_FP8_SLOTS];  // each scale slot's tensor, made once per graph
    cudnnBackendDescriptor_t plan;
    int64_t workspace_bytes;
    char *error;
};

shape4 rows_of(int layout, int64_t S, int64_t H, int64_t D)
{
    if (layout == ATTENTION_FP8_HEAD_MAJOR) return {{1, H, S, D}, {H * S * D, S * D, D, 1}};
    return {{1, H, S, D}, {S * H * D, D, H * D, 1}};
}
shape4 transposed(shape4 s)
{
    shape4 t = s;
    t.dims[2] = s.dims[3];
    t.dims[3] = s.dims[2];
    t.strides[2] = s.strides[3];
    t.strides[3] = s.strides[2];
    return t;
}
shape4 scores_of(int64_t S, int64_t H)
{
    return {{1, H, S, S}, {H * S * S, S * S, S, 1}};
}
shape4 per_row_of(int64_t S, int64_t H)
{
    return {{1, H, S, 1}, {H * S, S, 1, 1}};
}
shape4 scalar_of()
{
    return {{1, 1, 1, 1}, {1, 1, 1, 1}};
}

bool create(plan &g, cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d)
{
    if (g.n_items == kMaxDescriptors) {
        snprintf(g.error, kErrorBytes, "attention_fp8: more than %d descriptors in one plan", kMaxDescriptors);
        return false;
    }
    CUDNN_TRY(g, cudnnBackendCreateDescriptor(type, d));
    g.items[g.n_items++] = *d;
    return true;
}

void destroy(plan &g)
{
    for (int i = g.n_items - 1; i >= 0; --i) CUDNN_CHECK(cudnnBackendDestroyDescriptor(g.items[i]));
    char *error = g.error;
    memset(&g, 0, sizeof g);
    g.error = error;
}

bool tensor(plan &g, int64_t uid, cudnnDataType_t type, const shape4 &s, bool is_virtual, bool by_value,
            cudnnBackendDescriptor_t *t)
{
    const int64_t alignment = 16;
    if (!create(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, t)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, s.dims));
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s.strides));
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value) CUDNN_TRY(g, cudnnBackendSetAttribute(*t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    CUDNN_TRY(g, cudnnBackendFinalize(*t));
    return true;
}

// An intermediate tensor with the next free id.
bool virt(plan &g, cudnnDataType_t type, const shape4 &s, cudnnBackendDescriptor_t *t)
{
    return tensor(g, g.next_virtual++, type, s, true, false, t);
}

// The scalar of scale slot `slot` (in the variant pack): one descriptor per uid in a graph.
bool slot_tensor(plan &g, int slot, cudnnBackendDescriptor_t *t)
{
    if (!g.slots[slot] && !tensor(g, kUidScaleBase + slot, CUDNN_DATA_FLOAT, scalar_of(), false, false, &g.slots[slot]))
        return false;
    *t = g.slots[slot];
    return true;
}

bool push(plan &g, cudnnBackendDescriptor_t op)
{
    CUDNN_TRY(g, cudnnBackendFinalize(op));
    if (g.n_ops == kMaxOps) {
        snprintf(g.error, kErrorBytes, "attention_fp8: more than %d operations in one graph", kMaxOps);
        return false;
    }
    g.ops[g.n_ops++] = op;
    return true;
}

// y = mode(x) or mode(x, b) in fp32.
bool pointwise(plan &g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t pw, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    if (!create(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    CUDNN_TRY(g, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(g, cudnnBackendFinalize(pw));
    if (!create(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b) CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    return push(g, op);
}

// y = x·b into a new virtual tensor of `type` and shape `s`.
bool mul_into(plan &g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnDataType_t type, const shape4 &s,
              cudnnBackendDescriptor_t *y)
{
    return virt(g, type, s, y) && pointwise(g, CUDNN_POINTWISE_MUL, x, b, *y);
}

// c = a·b over the last two dims, fp32 accumulation.
bool matmul(plan &g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
{
    cudnnBackendDescriptor_t mm, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    if (!create(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(g, cudnnBackendFinalize(mm));
    if (!create(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    return push(g, op);
}

// y = reduce(x) over the dims where y has extent 1 (ADD, MAX or AMAX).
bool reduce(plan &g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t red, op;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    if (!create(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &red)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    CUDNN_TRY(g, cudnnBackendSetAttribute(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &precision));
    CUDNN_TRY(g, cudnnBackendFinalize(red));
    if (!create(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red));
    return push(g, op);
}

// y = x seen through y's dims and strides.
bool reshape(plan &g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op;
    if (!create(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    CUDNN_TRY(g, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    return push(g, op);
}

// An FP8 GEMM's epilogue as cudnn-frontend's matmul_fp8: acc·descale_a·descale_b = v; out = v·scale (the
// output's type); amax = max|v|.
bool fp8_epilogue(plan &g, cudnnBackendDescriptor_t acc, const shape4 &s, int descale_a, int descale_b, int scale,
                  int amax, cudnnBackendDescriptor_t out)
{
    cudnnBackendDescriptor_t da, db, sc, am, v1, v2;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    return slot_tensor(g, descale_a, &da) && slot_tensor(g, descale_b, &db) && slot_tensor(g, scale, &sc) &&
           slot_tensor(g, amax, &am) && mul_into(g, acc, da, f32, s, &v1) && mul_into(g, v1, db, f32, s, &v2) &&
           pointwise(g, CUDNN_POINTWISE_MUL, v2, sc, out) && reduce(g, CUDNN_REDUCE_TENSOR_AMAX, v2, am);
}

// scores·softmax scale·descale_q·descale_k from Q and Kᵀ.
bool scaled_scores(plan &g, cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t k_t, cudnnBackendDescriptor_t attn,
                   cudnnBackendDescriptor_t *out)
{
    const shape4 s = scores_of(g.seq_len, g.num_heads);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t raw, s1, s2, dq, dk;
    return virt(g, f32, s, &raw) && matmul(g, q, k_t, raw) && mul_into(g, raw, attn, f32, s, &s1) &&
           slot_tensor(g, ATTENTION_FP8_DESCALE_Q, &dq) && mul_into(g, s1, dq, f32, s, &s2) &&
           slot_tensor(g, ATTENTION_FP8_DESCALE_K, &dk) && mul_into(g, s2, dk, f32, s, out);
}

// The forward: softmax with stats, amax_S, P quantized to E4M3, P·V with its FP8 epilogue.
bool build_forward(plan &g)
{
    const int64_t S = g.seq_len, H = g.num_heads, D = g.head_dim;
    const shape4 rows = rows_of(g.layout, S, H, D), sc = scores_of(S, H), row = per_row_of(S, H);
    const cudnnDataType_t e4m3 = CUDNN_DATA_FP8_E4M3, f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t q, k_t, v, o, stats, attn, s, m, centered, e, z, log_z, p, amax_s, scale_s, p8, acc;
    if (!tensor(g, kUidQ, e4m3, rows, false, false, &q) || !tensor(g, kUidK, e4m3, transposed(rows), false, false, &k_t) ||
        !tensor(g, kUidV, e4m3, rows, false, false, &v) || !tensor(g, kUidO, e4m3, rows, false, false, &o) ||
        !tensor(g, kUidStats, f32, row, false, false, &stats) ||
        !tensor(g, kUidAttnScale, f32, scalar_of(), false, true, &attn) || !scaled_scores(g, q, k_t, attn, &s))
        return false;
    if (!virt(g, f32, row, &m) || !reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, m) || !virt(g, f32, sc, &centered) ||
        !pointwise(g, CUDNN_POINTWISE_SUB, s, m, centered) || !virt(g, f32, sc, &e) ||
        !pointwise(g, CUDNN_POINTWISE_EXP, centered, nullptr, e) || !virt(g, f32, row, &z) ||
        !reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z) || !virt(g, f32, row, &log_z) ||
        !pointwise(g, CUDNN_POINTWISE_LOG, z, nullptr, log_z) || !pointwise(g, CUDNN_POINTWISE_ADD, m, log_z, stats) ||
        !virt(g, f32, sc, &p) || !pointwise(g, CUDNN_POINTWISE_DIV, e, z, p))
        return false;
    return slot_tensor(g, ATTENTION_FP8_AMAX_S, &amax_s) && reduce(g, CUDNN_REDUCE_TENSOR_AMAX, p, amax_s) &&
           slot_tensor(g, ATTENTION_FP8_SCALE_S, &scale_s) && mul_into(g, p, scale_s, e4m3, sc, &p8) &&
           virt(g, f32, rows, &acc) && matmul(g, p8, v, acc) &&
           fp8_epilogue(g, acc, rows, ATTENTION_FP8_DESCALE_S, ATTENTION_FP8_DESCALE_V, ATTENTION_FP8_SCALE_O,
                        ATTENTION_FP8_AMAX_O, o);
}

// The backward's D = rowsum(dO·O)·descale_dO·descale_O.
bool softmax_sum(plan &g, cudnnBackendDescriptor_t d_o, cudnnBackendDescriptor_t o, cudnnBackendDescriptor_t *sum)
{
    const shape4 rows = rows_of(g.layout, g.seq_len, g.num_heads, g.head_dim), row = per_row_of(g.seq_len, g.num_heads);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t prod, r, r1, dd, dd_o;
    return virt(g, f32, rows, &prod) && pointwise(g, CUDNN_POINTWISE_MUL, d_o, o, prod) && virt(g, f32, row, &r) &&
           reduce(g, CUDNN_REDUCE_TENSOR_ADD, prod, r) && slot_tensor(g, ATTENTION_FP8_DESCALE_DO, &dd) &&
           mul_into(g, r, dd, f32, row, &r1) && slot_tensor(g, ATTENTION_FP8_DESCALE_O, &dd_o) &&
           mul_into(g, r1, dd_o, f32, row, sum);
}

// dS (fp32, before quantization) = (dO Vᵀ·descale_dO·descale_V − D)·P·softmax scale, and amax_dP.
bool score_gradient(plan &g, cudnnBackendDescriptor_t d_o, cudnnBackendDescriptor_t v_t, cudnnBackendDescriptor_t sum,
                    cudnnBackendDescriptor_t e, cudnnBackendDescriptor_t attn, cudnnBackendDescriptor_t *ds)
{
    const shape4 sc = scores_of(g.seq_len, g.num_heads);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t dp, dp1, dp2, centered, weighted, dd, dv, amax;
    return virt(g, f32, sc, &dp) && matmul(g, d_o, v_t, dp) && slot_tensor(g, ATTENTION_FP8_DESCALE_DO, &dd) &&
           mul_into(g, dp, dd, f32, sc, &dp1) && slot_tensor(g, ATTENTION_FP8_DESCALE_V, &dv) &&
           mul_into(g, dp1, dv, f32, sc, &dp2) && virt(g, f32, sc, &centered) &&
           pointwise(g, CUDNN_POINTWISE_SUB, dp2, sum, centered) && mul_into(g, centered, e, f32, sc, &weighted) &&
           mul_into(g, weighted, attn, f32, sc, ds) && slot_tensor(g, ATTENTION_FP8_AMAX_DP, &amax) &&
           reduce(g, CUDNN_REDUCE_TENSOR_AMAX, *ds, amax);
}

// The backward: dV from quantized P, dQ and dK from quantized dS, each with its FP8 epilogue.
bool build_backward(plan &g)
{
    const int64_t S = g.seq_len, H = g.num_heads, D = g.head_dim;
    const shape4 rows = rows_of(g.layout, S, H, D), sc = scores_of(S, H), row = per_row_of(S, H);
    const cudnnDataType_t e4m3 = CUDNN_DATA_FP8_E4M3, e5m2 = CUDNN_DATA_FP8_E5M2, f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t q, k_t, v_t, o, d_o, stats, dq, dk, dv, attn, sum, s, centered, e, scale_s, p8, p8_t, dv_acc;
    if (!tensor(g, kUidQ, e4m3, rows, false, false, &q) || !tensor(g, kUidK, e4m3, transposed(rows), false, false, &k_t) ||
        !tensor(g, kUidV, e4m3, transposed(rows), false, false, &v_t) || !tensor(g, kUidO, e4m3, rows, false, false, &o) ||
        !tensor(g, kUidDO, e5m2, rows, false, false, &d_o) || !tensor(g, kUidStats, f32, row, false, false, &stats) ||
        !tensor(g, kUidDQ, e5m2, rows, false, false, &dq) || !tensor(g, kUidDK, e5m2, rows, false, false, &dk) ||
        !tensor(g, kUidDV, e5m2, rows, false, false, &dv) ||
        !tensor(g, kUidAttnScale, f32, scalar_of(), false, true, &attn) || !softmax_sum(g, d_o, o, &sum) ||
        !scaled_scores(g, q, k_t, attn, &s))
        return false;
    // P = exp(S − stats), quantized, transposed: dV = Pᵀ dO
    if (!virt(g, f32, sc, &centered) || !pointwise(g, CUDNN_POINTWISE_SUB, s, stats, centered) ||
        !virt(g, f32, sc, &e) || !pointwise(g, CUDNN_POINTWISE_EXP, centered, nullptr, e) ||
        !slot_tensor(g, ATTENTION_FP8_SCALE_S, &scale_s) || !mul_into(g, e, scale_s, e4m3, sc, &p8) ||
        !virt(g, e4m3, transposed(sc), &p8_t) || !reshape(g, p8, p8_t) || !virt(g, f32, rows, &dv_acc) ||
        !matmul(g, p8_t, d_o, dv_acc) ||
        !fp8_epilogue(g, dv_acc, rows, ATTENTION_FP8_DESCALE_S, ATTENTION_FP8_DESCALE_DO, ATTENTION_FP8_SCALE_DV,
                      ATTENTION_FP8_AMAX_DV, dv))
        return false;
    // dS quantized to E5M2; dQ = dS K, dK = dSᵀ Q
    cudnnBackendDescriptor_t ds, scale_dp, ds8, ds8_t, k, dq_acc, dk_acc;
    return score_gradient(g, d_o, v_t, sum, e, attn, &ds) && slot_tensor(g, ATTENTION_FP8_SCALE_DP, &scale_dp) &&
           mul_into(g, ds, scale_dp, e5m2, sc, &ds8) && virt(g, e4m3, rows, &k) && reshape(g, k_t, k) &&
           virt(g, f32, rows, &dq_acc) && matmul(g, ds8, k, dq_acc) &&
           fp8_epilogue(g, dq_acc, rows, ATTENTION_FP8_DESCALE_DP, ATTENTION_FP8_DESCALE_K, ATTENTION_FP8_SCALE_DQ,
                        ATTENTION_FP8_AMAX_DQ, dq) &&
           virt(g, e5m2, transposed(sc), &ds8_t) && reshape(g, ds8, ds8_t) && virt(g, f32, rows, &dk_acc) &&
           matmul(g, ds8_t, q, dk_acc) &&
           fp8_epilogue(g, dk_acc, rows, ATTENTION_FP8_DESCALE_DP, ATTENTION_FP8_DESCALE_Q, ATTENTION_FP8_SCALE_DK,
                        ATTENTION_FP8_AMAX_DK, dk);
}

// The first configuration of the heuristics in `mode` whose plan finalizes, into g.plan; false (g.error says why) if none.
bool plan_from_heuristics(plan &g, cudnnHandle_t handle, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode)
{
    cudnnBackendDescriptor_t heuristics, configs[8];
    if (!create(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heuristics)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
    CUDNN_TRY(g, cudnnBackendSetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    CUDNN_TRY(g, cudnnBackendFinalize(heuristics));
    for (cudnnBackendDescriptor_t &config : configs)
        if (!create(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &config)) return false;
    int64_t n = 0;
    CUDNN_TRY(g, cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 8, &n, configs));
    snprintf(g.error, kErrorBytes, "attention_fp8: cuDNN's heuristics (mode %d) found no engine for the graph", (int)mode);
    for (int64_t i = 0; i < n; ++i) {
        cudnnBackendDescriptor_t p;
        if (!create(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p)) return false;
        CUDNN_TRY(g, cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
        CUDNN_TRY(g, cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]));
        const cudnnStatus_t status = cudnnBackendFinalize(p);
        if (status != CUDNN_STATUS_SUCCESS) {
            describe_failure(status, "cudnnBackendFinalize(plan)", __FILE__, __LINE__, g.error);
            continue;
        }
        int64_t got = 0;
        CUDNN_TRY(g, cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                              &g.workspace_bytes));
        g.plan = p;
        return true;
    }
    return false;
}

// Operation graph, then a plan from the heuristics' mode A, else their fallback list.
bool finish(plan &g, cudnnHandle_t handle)
{
    cudnnBackendDescriptor_t graph;
    if (!create(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph)) return false;
    CUDNN_TRY(g, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops, g.ops));
    CUDNN_TRY(g, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle));
    CUDNN_TRY(g, cudnnBackendFinalize(graph));
    if (plan_from_heuristics(g, handle, graph, CUDNN_HEUR_MODE_A)) return true;
    char first[kErrorBytes];
    memcpy(first, g.error, kErrorBytes);
    if (plan_from_heuristics(g, handle, graph, CUDNN_HEUR_MODE_FALLBACK)) return true;
    char second[kErrorBytes];
    memcpy(second, g.error, kErrorBytes);
    snprintf(g.error, kErrorBytes, "%.500s; fallback: %.500s", first, second);
    return false;
}

} // namespace

struct attention_fp8 {
    cudnnHandle_t handle;
    plan plans[ATTENTION_FP8_PLAN_SLOTS];
    uint64_t clock;
    void *workspace;
    size_t workspace_bytes;
    char error[kErrorBytes];
};

namespace {

// The cached plan of the shape, built on a miss into the least recently used slot; NULL when cuDNN refuses it.
plan *need_plan(attention_fp8 &c, int direction, int layout, int64_t seq_len, int num_heads, int head_dim)
{
    if (!c.handle) CUDNN_CHECK(cudnnCreate(&c.handle));
    plan *victim = &c.plans[0];
    for (plan &p : c.plans) {
        if (p.last_use && p.direction == direction && p.layout == layout && p.seq_len == seq_len &&
            p.num_heads == num_heads && p.head_dim == head_dim) {
            p.last_use = ++c.clock;
            return &p;
        }
        if (p.last_use < victim->last_use) victim = &p;
    }
    destroy(*victim);
    plan &g = *victim;
    g.error = c.error;
    g.direction = direction;
    g.layout = layout;
    g.seq_len = seq_len;
    g.num_heads = num_heads;
    g.head_dim = head_dim;
    g.next_virtual = kUidVirtual;
    const bool built = (direction == kForward ? build_forward(g) : build_backward(g)) && finish(g, c.handle);
    if (!built) {
        destroy(g);
        return nullptr;
    }
    g.last_use = ++c.clock;
    return &g;
}

void *workspace_for(attention_fp8 &c, int64_t bytes)
{
    if (bytes <= 0) return nullptr;
    if ((size_t)bytes > c.workspace_bytes) {
        if (c.workspace) CUDA_CHECK(cudaFree(c.workspace));
        CUDA_CHECK(cudaMalloc(&c.workspace, (size_t)bytes));
        c.workspace_bytes = (size_t)bytes;
    }
    return c.workspace;
}

// The scale and amax slots each direction's graph names (its variant pack must name exactly its tensors).
const int kForwardSlots[] = {ATTENTION_FP8_DESCALE_Q, ATTENTION_FP8_DESCALE_K, ATTENTION_FP8_DESCALE_V,
                             ATTENTION_FP8_DESCALE_S, ATTENTION_FP8_SCALE_S,   ATTENTION_FP8_SCALE_O,
                             ATTENTION_FP8_AMAX_S,    ATTENTION_FP8_AMAX_O};
const int kBackwardSlots[] = {ATTENTION_FP8_DESCALE_Q,  ATTENTION_FP8_DESCALE_K, ATTENTION_FP8_DESCALE_V,
                              ATTENTION_FP8_DESCALE_O,  ATTENTION_FP8_DESCALE_DO, ATTENTION_FP8_DESCALE_S,
                              ATTENTION_FP8_DESCALE_DP, ATTENTION_FP8_SCALE_S,   ATTENTION_FP8_SCALE_DP,
                              ATTENTION_FP8_SCALE_DQ,   ATTENTION_FP8_SCALE_DK,  ATTENTION_FP8_SCALE_DV,
                              ATTENTION_FP8_AMAX_DP,    ATTENTION_FP8_AMAX_DQ,   ATTENTION_FP8_AMAX_DK,
                              ATTENTION_FP8_AMAX_DV};

// Runs plan p with the tensors (uids, pointers), the softmax scale by value and its direction's scale slots; false
// (c.error says why) when cuDNN does not take the variant pack or refuses to execute the plan.
bool execute(attention_fp8 &c, plan &p, int n, const int64_t *uids, void *const *pointers, float *scales, int head_dim,
             cudaStream_t stream)
{
    int64_t all_uids[16 + ATTENTION_FP8_SLOTS];
    void *all_pointers[16 + ATTENTION_FP8_SLOTS];
    float attn_scale = 1.0f / sqrtf((float)head_dim);
    int count = 0;
    for (int i = 0; i < n; ++i, ++count) {
        all_uids[count] = uids[i];
        all_pointers[count] = pointers[i];
    }
    all_uids[count] = kUidAttnScale;
    all_pointers[count++] = &attn_scale;
    const int *slots = p.direction == kForward ? kForwardSlots : kBackwardSlots;
    const int n_slots = p.direction == kForward ? (int)(sizeof kForwardSlots / sizeof *slots)
                                                : (int)(sizeof kBackwardSlots / sizeof *slots);
    for (int i = 0; i < n_slots; ++i, ++count) {
        all_uids[count] = kUidScaleBase + slots[i];
        all_pointers[count] = scales + 4 * slots[i];
    }
    void *workspace = workspace_for(c, p.workspace_bytes);
    cudnnBackendDescriptor_t pack;
    CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    plan report = {};
    report.error = c.error;
    const bool ran = [&]() -> bool {
        CUDNN_TRY(report, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, all_uids));
        CUDNN_TRY(report, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count,
                                                   all_pointers));
        CUDNN_TRY(report, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
        CUDNN_TRY(report, cudnnBackendFinalize(pack));
        CUDNN_TRY(report, cudnnSetStream(c.handle, stream));
        CUDNN_TRY(report, cudnnBackendExecute(c.handle, p.plan, pack));
        return true;
    }();
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
    return ran;
}

void check_call(const char *function, const attention_fp8 *context, int64_t seq_len, int num_heads, int head_dim,
                const void *const *tensors, int n_tensors)
{
    ALDIT_CHECK(context != nullptr, "%s: no attention_fp8 context", function);
    ALDIT_CHECK(seq_len >= 1 && num_heads >= 1 && head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0,
                "%s: seq_len %lld, %d heads, head_dim %d not supported (head_dim a multiple of 16 up to 256)",
                function, (long long)seq_len, num_heads, head_dim);
    for (int i = 0; i < n_tensors; ++i)
        ALDIT_CHECK(tensors[i] != nullptr && reinterpret_cast<uintptr_t>(tensors[i]) % 16 == 0,
                    "%s: tensor %d is NULL or not 16-byte aligned (%p)", function, i, tensors[i]);
}

} // namespace

extern "C" attention_fp8 *attention_fp8_create(void)
{
    return static_cast<attention_fp8 *>(xcalloc(1, sizeof(attention_fp8)));
}

extern "C" void attention_fp8_free(attention_fp8 *context)
{
    if (!context) return;
    if (context->handle) CUDA_CHECK(cudaDeviceSynchronize());
    for (plan &p : context->plans) {
        p.error = context->error;
        destroy(p);
    }
    if (context->workspace) CUDA_CHECK(cudaFree(context->workspace));
    if (context->handle) CUDNN_CHECK(cudnnDestroy(context->handle));
    free(context);
}

namespace {
struct scale_sources {
    const float *p[ATTENTION_FP8_SLOTS];
};

__global__ void load_scales_kernel(float *scales, scale_sources sources)
{
    const int slot = threadIdx.x;
    if (slot < ATTENTION_FP8_SLOTS) scales[4 * slot] = sources.p[slot] ? *sources.p[slot] : 0.0f;
}
}  // namespace

extern "C" void attention_fp8_load_scales(float *scales, const float *const sources[ATTENTION_FP8_SLOTS],
                                          cudaStream_t stream)
{
    ALDIT_CHECK(scales && reinterpret_cast<uintptr_t>(scales) % 16 == 0, "attention_fp8_load_scales: scales %p is NULL "
                "or not 16-byte aligned", (void *)scales);
    scale_sources s;
    for (int i = 0; i < ATTENTION_FP8_SLOTS; ++i) s.p[i] = sources[i];
    load_scales_kernel<<<1, 32, 0, stream>>>(scales, s);
    CUDA_CHECK_LAUNCH();
}

extern "C" const char *attention_fp8_error(const attention_fp8 *context)
{
    return context ? context->error : "";
}

extern "C" int attention_fp8_prepare(attention_fp8 *context, attention_fp8_layout layout, int64_t seq_len,
                                     int num_heads, int head_dim, int backward)
{
    check_call("attention_fp8_prepare", context, seq_len, num_heads, head_dim, nullptr, 0);
    int built = 0;
    for (int direction = kForward; direction <= (backward ? kBackward : kForward); ++direction) {
        bool cached = false;
        for (const plan &p : context->plans)
            cached = cached || (p.last_use && p.direction == direction && p.layout == layout && p.seq_len == seq_len &&
                                p.num_heads == num_heads && p.head_dim == head_dim);
        plan *p = cached ? nullptr : need_plan(*context, direction, layout, seq_len, num_heads, head_dim);
        if (!p) continue;
        ++built;
        workspace_for(*context, p->workspace_bytes);  // grown here, not by a cudaFree inside a training step
    }
    return built;
}

extern "C" int attention_fp8_fwd(attention_fp8 *context, attention_fp8_layout layout, const void *q, const void *k,
                                 const void *v, int64_t seq_len, int num_heads, int head_dim, void *out, float *stats,
                                 float *scales, cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, stats, scales};
    check_call("attention_fp8_fwd", context, seq_len, num_heads, head_dim, tensors, 6);
    plan *p = need_plan(*context, kForward, layout, seq_len, num_heads, head_dim);
    if (!p) return 0;
    const int64_t uids[] = {kUidQ, kUidK, kUidV, kUidO, kUidStats};
    void *const pointers[] = {const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v), out, stats};
    return execute(*context, *p, 5, uids, pointers, scales, head_dim, stream) ? 1 : 0;
}

extern "C" int attention_fp8_bwd(attention_fp8 *context, attention_fp8_layout layout, const void *q, const void *k,
                                 const void *v, const void *out, const void *dout, const float *stats, int64_t seq_len,
                                 int num_heads, int head_dim, void *dq, void *dk, void *dv, float *scales,
                                 cudaStream_t stream)
{
    const void *tensors[] = {q, k, v, out, dout, stats, dq, dk, dv, scales};
    check_call("attention_fp8_bwd", context, seq_len, num_heads, head_dim, tensors, 10);
    plan *p = need_plan(*context, kBackward, layout, seq_len, num_heads, head_dim);
    if (!p) return 0;
    const int64_t uids[] = {kUidQ, kUidK, kUidV, kUidO, kUidDO, kUidStats, kUidDQ, kUidDK, kUidDV};
    void *const pointers[] = {const_cast<void *>(q), const_cast<void *>(k),    const_cast<void *>(v),
                              const_cast<void *>(out), const_cast<void *>(dout), const_cast<float *>(stats),
                              dq, dk, dv};
    return execute(*context, *p, 9, uids, pointers, scales, head_dim, stream) ? 1 : 0;
}
