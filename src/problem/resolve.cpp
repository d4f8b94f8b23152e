#include "problem/resolve.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "base/checked_math.h"
#include "base/status.h"
#include "base/workspace.h"

namespace flashattn {

size_t Problem::element_size() const {
    switch (dtype) {
        case FLASHATTN_DTYPE_FP32: return 4;
        case FLASHATTN_DTYPE_FP8_E4M3: return 1;
        default: return 2;
    }
}

namespace {

// Offset one past the last element of a [n0, n1, n2, dim] tensor with the given strides.
bool tensor_end(int64_t n0, int64_t n1, int64_t n2, int64_t dim, const Strides &s, bool varlen, int64_t *end) {
    int64_t offset = dim;  // (dim - 1) + 1
    if (!varlen && !mul_add(n0 - 1, s.batch, offset, &offset)) return false;
    if (!mul_add(n1 - 1, s.row, offset, &offset)) return false;
    return mul_add(n2 - 1, s.head, offset, &offset) && (*end = offset, true);
}

struct StrideKeys {
    flashattn_i64_param_t batch, row, head;
};

// Fill defaults for one tensor: contiguous [batch, seq, heads, dim].
flashattn_status_t resolve_strides(const PlanParams &params, StrideKeys keys, int64_t seq, int64_t heads,
                                   int64_t dim, Strides *s) {
    s->head = params.get(keys.head, dim);
    int64_t row_default, batch_default;
    if (!mul_add(heads, dim, 0, &row_default))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "heads and head_dim: their product overflows 64 bits");
    s->row = params.get(keys.row, row_default);
    if (!mul_add(seq, s->row, 0, &batch_default))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: seqlen * row stride overflows 64 bits", i64_key_name(keys.batch));
    s->batch = params.get(keys.batch, batch_default);
    return FLASHATTN_SUCCESS;
}

// An output must not overlap itself: sorted by stride, each dimension must step past everything the
// smaller ones span (otherwise two threads would write the same element).
flashattn_status_t check_output_layout(const Strides &s, int64_t rows, int64_t heads, int64_t batches, int64_t dim,
                                       const char *name) {
    struct Dim { int64_t stride, count; };
    Dim dims[3] = {{s.row, rows}, {s.head, heads}, {s.batch, batches}};
    std::sort(dims, dims + 3, [](const Dim &a, const Dim &b) { return a.stride < b.stride; });
    int64_t span = dim;  // elements covered by the dimensions below
    for (const Dim &d : dims) {
        if (d.count <= 1) continue;
        if (d.stride < span)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s strides: a stride of %lld elements makes %s overlap itself (it must be at least %lld)",
                        name, (long long)d.stride, name, (long long)span);
        if (!mul_add(d.stride, d.count - 1, span, &span))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s strides: the tensor's extent overflows 64 bits", name);
    }
    return FLASHATTN_SUCCESS;
}

flashattn_status_t require(const PlanParams &params, flashattn_i64_param_t key) {
    if (params.is_set[key]) return FLASHATTN_SUCCESS;
    return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: %s was never set; set it before flashattn_plan_finalize", i64_key_name(key));
}

flashattn_status_t check_extents(const Problem &p) {
    const int64_t rows_q = p.q_rows();
    const int64_t rows_k = p.k_rows();
    const int64_t es = static_cast<int64_t>(p.element_size());
    const struct { int64_t rows, heads, dim; const Strides &s; const char *name; } tensors[] = {
        {rows_q, p.heads_q, p.head_dim, p.q, "Q"}, {rows_k, p.heads_kv, p.head_dim, p.k, "K"},
        {rows_k, p.heads_kv, p.head_dim_v, p.v, "V"}, {rows_q, p.heads_q, p.head_dim_v, p.o, "O"},
        {rows_q, p.heads_q, p.head_dim_v, p.dout, "dO"}, {rows_q, p.heads_q, p.head_dim, p.dq, "dQ"},
        {rows_k, p.heads_kv, p.head_dim, p.dk, "dK"}, {rows_k, p.heads_kv, p.head_dim_v, p.dv, "dV"}};
    for (const auto &t : tensors) {
        int64_t end, bytes;
        if (!tensor_end(p.batch, t.rows, t.heads, t.dim, t.s, p.varlen, &end) || !mul_add(end, es, 0, &bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: its size in bytes overflows 64 bits", t.name);
    }
    int64_t lse;
    if (!mul_add(p.batch_extent(), p.heads_q, 0, &lse) || !mul_add(lse, rows_q, 0, &lse) ||
        !mul_add(lse, 4, 0, &lse))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "LSE: its size in bytes overflows 64 bits");
    return FLASHATTN_SUCCESS;
}

// A window reaching at least seqlen_q + seqlen_k keys from the diagonal masks nothing (a query's
// diagonal key lies in [-seqlen_q, seqlen_k - 1]): it is stored as -1, "no window", so that no
// backend ever adds a huge window to a position (INT64_MAX overflowed visible_keys).
int64_t resolve_window(int64_t window, const Problem &p) {
    return window >= 0 && window - p.seqlen_k >= p.seqlen_q ? -1 : window;
}

// The kernels compute in float: scale and softcap are each a normal float (params.cpp), and the
// factor scale / softcap they fold into Q (or the tanh argument) must be one too.
flashattn_status_t check_scale_softcap(const Problem &p) {
    if (p.softcap == 0.0) return FLASHATTN_SUCCESS;
    const double ratio = p.scale / p.softcap;
    if (ratio < 0x1p-126 || ratio > 0x1p126)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_F64_SOFTCAP: softmax scale / softcap = %g / %g = %g is outside [2^-126, 2^126], the "
                    "range the kernels' float arithmetic computes exactly",
                    p.scale, p.softcap, ratio);
    return FLASHATTN_SUCCESS;
}

// Variable length: the totals, what cu_seqlens (int32, batch + 1 entries) can describe, and the
// longest possible sequence: no sequence is longer than all rows together, so seqlen_q / seqlen_k
// are clamped to total_q / total_k (at least 1). Every backend sizes its work (tiles, grids,
// threads) by these maxima; a declared maximum of 10^10 for 8 real rows made the CPU walk 10^8
// empty tiles.
flashattn_status_t resolve_varlen(const PlanParams &params, Problem *p) {
    FLASHATTN_TRY(require(params, FLASHATTN_I64_TOTAL_Q));
    FLASHATTN_TRY(require(params, FLASHATTN_I64_TOTAL_K));
    p->total_q = params.get(FLASHATTN_I64_TOTAL_Q, 0);
    p->total_k = params.get(FLASHATTN_I64_TOTAL_K, 0);
    int64_t cap;
    if (mul_add(p->batch, p->seqlen_q, 0, &cap) && p->total_q > cap)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_TOTAL_Q: %lld rows cannot come from %lld sequences of at most %lld queries",
                    (long long)p->total_q, (long long)p->batch, (long long)p->seqlen_q);
    if (mul_add(p->batch, p->seqlen_k, 0, &cap) && p->total_k > cap)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_TOTAL_K: %lld rows cannot come from %lld sequences of at most %lld keys",
                    (long long)p->total_k, (long long)p->batch, (long long)p->seqlen_k);
    for (const auto &t : {std::make_pair(p->total_q, "FLASHATTN_I64_TOTAL_Q"), std::make_pair(p->total_k, "FLASHATTN_I64_TOTAL_K")})
        if (t.first > INT32_MAX)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s: %lld rows, but cu_seqlens are int32 and can index at most 2^31 - 1 rows", t.second,
                        (long long)t.first);
    int64_t cu_bytes;
    if (!mul_add(p->batch, 4, 4, &cu_bytes))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_BATCH: %lld sequences, but cu_seqlens (batch + 1 int32 entries) would overflow 64 bits",
                    (long long)p->batch);
    p->seqlen_q = std::min(p->seqlen_q, std::max<int64_t>(p->total_q, 1));
    p->seqlen_k = std::min(p->seqlen_k, std::max<int64_t>(p->total_k, 1));
    return FLASHATTN_SUCCESS;
}

}  // namespace

// Bytes spanned by each tensor of a resolved problem (defined below; stored in Problem::extents).
TensorExtents tensor_extents(const Problem &p);

flashattn_status_t resolve_problem(const PlanParams &params, Problem *out) {
    for (flashattn_i64_param_t key : {FLASHATTN_I64_BATCH, FLASHATTN_I64_SEQLEN_Q, FLASHATTN_I64_SEQLEN_K,
                                      FLASHATTN_I64_HEADS_Q, FLASHATTN_I64_HEAD_DIM})
        FLASHATTN_TRY(require(params, key));
    Problem p;
    p.batch = params.get(FLASHATTN_I64_BATCH, 0);
    p.seqlen_q = params.get(FLASHATTN_I64_SEQLEN_Q, 0);
    p.seqlen_k = params.get(FLASHATTN_I64_SEQLEN_K, 0);
    p.heads_q = params.get(FLASHATTN_I64_HEADS_Q, 0);
    p.heads_kv = params.get(FLASHATTN_I64_HEADS_KV, p.heads_q);
    p.head_dim = params.get(FLASHATTN_I64_HEAD_DIM, 0);
    p.head_dim_v = params.get(FLASHATTN_I64_HEAD_DIM_V, p.head_dim);
    p.dtype = static_cast<flashattn_dtype_t>(params.get(FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP16));
    p.causal = params.get(FLASHATTN_I64_CAUSAL, 0) != 0;
    p.window_left = params.get(FLASHATTN_I64_WINDOW_LEFT, -1);
    p.window_right = params.get(FLASHATTN_I64_WINDOW_RIGHT, -1);
    p.device = static_cast<int32_t>(params.get(FLASHATTN_I64_DEVICE, 0));
    p.varlen = params.get(FLASHATTN_I64_VARLEN, 0) != 0;
    p.softcap = params.softcap;
    p.scale = params.softmax_scale > 0.0 ? params.softmax_scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));

    if (p.heads_kv > p.heads_q || p.heads_q % p.heads_kv != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_HEADS_Q: %lld query heads is not a multiple of FLASHATTN_I64_HEADS_KV = %lld",
                    (long long)p.heads_q, (long long)p.heads_kv);
    FLASHATTN_TRY(check_scale_softcap(p));
    if (p.varlen) FLASHATTN_TRY(resolve_varlen(params, &p));
    p.window_left = resolve_window(p.window_left, p);
    p.window_right = resolve_window(p.window_right, p);
    const int64_t rows_q = p.q_rows();
    const int64_t rows_k = p.k_rows();
    // Every tensor's strides: its keys, rows, heads and last dimension (contiguous by default).
    const struct {
        StrideKeys keys;
        int64_t rows, heads, dim;
        Strides *out;
    } tensors[] = {
        {{FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim, &p.q},
        {{FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim, &p.k},
        {{FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim_v, &p.v},
        {{FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim_v, &p.o},
        {{FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim_v, &p.dout},
        {{FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim, &p.dq},
        {{FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim, &p.dk},
        {{FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim_v, &p.dv},
    };
    for (const auto &t : tensors) FLASHATTN_TRY(resolve_strides(params, t.keys, t.rows, t.heads, t.dim, t.out));
    p.deterministic = params.get(FLASHATTN_I64_DETERMINISTIC, 0) != 0;
    FLASHATTN_TRY(check_extents(p));
    FLASHATTN_TRY(check_output_layout(p.o, p.q_rows(), p.heads_q, p.batch_extent(), p.head_dim_v, "O"));
    FLASHATTN_TRY(check_output_layout(p.dq, p.q_rows(), p.heads_q, p.batch_extent(), p.head_dim, "dQ"));
    FLASHATTN_TRY(check_output_layout(p.dk, p.k_rows(), p.heads_kv, p.batch_extent(), p.head_dim, "dK"));
    FLASHATTN_TRY(check_output_layout(p.dv, p.k_rows(), p.heads_kv, p.batch_extent(), p.head_dim_v, "dV"));
    p.extents = tensor_extents(p);
    *out = p;
    return FLASHATTN_SUCCESS;
}

TensorExtents tensor_extents(const Problem &p) {
    const int64_t rows_q = p.q_rows();
    const int64_t rows_k = p.k_rows();
    const size_t es = p.element_size();
    auto bytes = [&](int64_t n1, int64_t n2, int64_t dim, const Strides &s) -> size_t {
        if (n1 == 0) return 0;  // an empty varlen tensor spans nothing
        int64_t end = 0;
        tensor_end(p.batch, n1, n2, dim, s, p.varlen, &end);  // cannot overflow: resolve checked it
        return static_cast<size_t>(end) * es;
    };
    TensorExtents e;
    e.q = bytes(rows_q, p.heads_q, p.head_dim, p.q);
    e.k = bytes(rows_k, p.heads_kv, p.head_dim, p.k);
    e.v = bytes(rows_k, p.heads_kv, p.head_dim_v, p.v);
    e.o = bytes(rows_q, p.heads_q, p.head_dim_v, p.o);
    e.lse = static_cast<size_t>(p.batch_extent() * p.heads_q * rows_q) * sizeof(float);
    e.dout = bytes(rows_q, p.heads_q, p.head_dim_v, p.dout);
    e.dq = bytes(rows_q, p.heads_q, p.head_dim, p.dq);
    e.dk = bytes(rows_k, p.heads_kv, p.head_dim, p.dk);
    e.dv = bytes(rows_k, p.heads_kv, p.head_dim_v, p.dv);
    return e;
}

namespace {

bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

struct Span {
    const void *ptr;
    size_t bytes;
    const char *name;
    bool required;  // must not be NULL
};

// The rules shared by the forward and backward calls: required pointers present; no output
// overlapping an input or an earlier output; the workspace large enough, aligned, and apart from
// every tensor.
flashattn_status_t check_call(const Span *inputs, int n_in, const Span *outputs, int n_out, const Tensors &t,
                              size_t workspace_needed) {
    for (const Span *set : {inputs, outputs})
        for (int i = 0; i < (set == inputs ? n_in : n_out); ++i)
            if (set[i].required && set[i].ptr == nullptr)
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: must not be NULL", set[i].name);
    for (int o = 0; o < n_out; ++o) {
        for (int i = 0; i < n_in; ++i)
            if (overlaps(outputs[o].ptr, outputs[o].bytes, inputs[i].ptr, inputs[i].bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: overlaps %s; outputs must not share memory with inputs",
                            outputs[o].name, inputs[i].name);
        for (int j = 0; j < o; ++j)
            if (overlaps(outputs[o].ptr, outputs[o].bytes, outputs[j].ptr, outputs[j].bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: overlaps %s", outputs[o].name, outputs[j].name);
    }
    if (t.workspace_bytes < workspace_needed)
        return fail(FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
                    "workspace_bytes: %zu bytes given, this plan needs %zu (flashattn_plan_get_%sworkspace_size)",
                    t.workspace_bytes, workspace_needed, t.dq != nullptr || t.dout != nullptr ? "backward_" : "");
    if (workspace_needed > 0 && t.workspace == nullptr)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: NULL, but this plan needs %zu bytes", workspace_needed);
    if (workspace_needed > 0 && reinterpret_cast<uintptr_t>(t.workspace) % kWorkspaceAlignment != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: must be aligned to %zu bytes", kWorkspaceAlignment);
    if (workspace_needed > 0) {
        for (const Span *set : {inputs, outputs})
            for (int i = 0; i < (set == inputs ? n_in : n_out); ++i)
                if (overlaps(t.workspace, workspace_needed, set[i].ptr, set[i].bytes))
                    return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: overlaps %s", set[i].name);
    }
    return FLASHATTN_SUCCESS;
}

size_t cu_seqlens_bytes(const Problem &p) { return p.varlen ? static_cast<size_t>(p.batch + 1) * 4 : 0; }

}  // namespace

flashattn_status_t check_execute_args(const Problem &p, const Tensors &t, size_t workspace_needed) {
    const TensorExtents &e = p.extents;
    const Span inputs[] = {{t.q, e.q, "q", true}, {t.k, e.k, "k", true}, {t.v, e.v, "v", true},
                           {t.cu_seqlens_q, cu_seqlens_bytes(p), "cu_seqlens_q", p.varlen},
                           {t.cu_seqlens_k, cu_seqlens_bytes(p), "cu_seqlens_k", p.varlen}};
    const Span outputs[] = {{t.o, e.o, "o", true}, {t.lse, e.lse, "lse", false}};
    return check_call(inputs, 5, outputs, 2, t, workspace_needed);
}

flashattn_status_t check_backward_args(const Problem &p, const Tensors &t, size_t workspace_needed) {
    const TensorExtents &e = p.extents;
    const Span inputs[] = {{t.q, e.q, "q", true}, {t.k, e.k, "k", true}, {t.v, e.v, "v", true},
                           {t.o, e.o, "o", true}, {t.dout, e.dout, "dout", true}, {t.lse, e.lse, "lse", true},
                           {t.cu_seqlens_q, cu_seqlens_bytes(p), "cu_seqlens_q", p.varlen},
                           {t.cu_seqlens_k, cu_seqlens_bytes(p), "cu_seqlens_k", p.varlen}};
    const Span outputs[] = {{t.dq, e.dq, "dq", true}, {t.dk, e.dk, "dk", true}, {t.dv, e.dv, "dv", true}};
    return check_call(inputs, 8, outputs, 3, t, workspace_needed);
}

}  // namespace flashattn
