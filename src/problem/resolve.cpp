#include "problem/resolve.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "base/checked_math.h"
#include "base/status.h"
#include "base/workspace.h"
#include "problem/fp8.h"
#include "problem/variants.h"

namespace flashattn {

size_t Problem::element_size() const {
    switch (dtype) {
        case FLASHATTN_DTYPE_FP32: return 4;
        case FLASHATTN_DTYPE_FP8_E4M3: return 1;
        default: return 2;
    }
}

size_t Problem::o_element_size() const { return o_dtype == FLASHATTN_DTYPE_FP32 ? 4 : o_dtype == FLASHATTN_DTYPE_FP8_E4M3 ? 1 : 2; }

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
    const int64_t es_in = static_cast<int64_t>(p.element_size());
    const struct { int64_t rows, heads, dim; const Strides &s; const char *name; } tensors[] = {
        {rows_q, p.heads_q, p.head_dim, p.q, "Q"}, {rows_k, p.heads_kv, p.head_dim, p.k, "K"},
        {rows_k, p.heads_kv, p.head_dim_v, p.v, "V"}, {rows_q, p.heads_q, p.head_dim_v, p.o, "O"},
        {rows_q, p.heads_q, p.head_dim_v, p.dout, "dO"}, {rows_q, p.heads_q, p.head_dim, p.dq, "dQ"},
        {rows_k, p.heads_kv, p.head_dim, p.dk, "dK"}, {rows_k, p.heads_kv, p.head_dim_v, p.dv, "dV"}};
    // Size in bytes, and each stride's byte value: a stride of a dimension of extent 1 adds nothing
    // to the size but is still multiplied by the element size (and by index 0) in the backends.
    auto check_bytes = [](const char *name, int64_t outer, int64_t rows, int64_t heads, int64_t dim, const Strides &s,
                          bool packed, int64_t es) -> flashattn_status_t {
        int64_t end, bytes;
        if (!tensor_end(outer, rows, heads, dim, s, packed, &end) || !mul_add(end, es, 0, &bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: its size in bytes overflows 64 bits", name);
        for (const int64_t stride : {s.row, s.head, packed ? int64_t{0} : s.batch})
            if (!mul_add(stride, es, 0, &bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                            "%s strides: a stride of %lld elements overflows 64 bits in bytes", name, (long long)stride);
        return FLASHATTN_SUCCESS;
    };
    for (const auto &t : tensors) {
        const bool cache = t.name[0] == 'K' || t.name[0] == 'V';  // paged: pages, not batches
        const bool packed = p.varlen && !(cache && p.serving.paged);
        const int64_t es = t.name[0] == 'O' ? static_cast<int64_t>(p.o_element_size()) : es_in;
        FLASHATTN_TRY(check_bytes(t.name, cache ? p.kv_outer() : p.batch, cache ? p.kv_rows() : t.rows, t.heads, t.dim,
                                  t.s, packed, es));
    }
    const Serving &sv = p.serving;
    if (sv.appends()) {
        FLASHATTN_TRY(check_bytes("K_new", p.batch, sv.new_rows, p.heads_kv, p.head_dim, sv.k_new, false, es_in));
        FLASHATTN_TRY(check_bytes("V_new", p.batch, sv.new_rows, p.heads_kv, p.head_dim_v, sv.v_new, false, es_in));
    }
    int64_t table;
    if (sv.paged && (!mul_add(p.batch - 1, sv.page_table_stride, sv.max_pages, &table) || !mul_add(table, 4, 0, &table)))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_PAGE_TABLE_STRIDE: the page table's size in bytes overflows 64 bits");
    int64_t lse;
    if (!mul_add(p.batch_extent(), p.heads_q, 0, &lse) || !mul_add(lse, rows_q, 0, &lse) ||
        !mul_add(lse, 4, 0, &lse))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "LSE: its size in bytes overflows 64 bits");
    return FLASHATTN_SUCCESS;
}

// The paged-cache sizes (before the strides, whose defaults depend on the page size).
flashattn_status_t resolve_paging(const PlanParams &params, Problem *p) {
    Serving &sv = p->serving;
    sv.paged = params.get(FLASHATTN_I64_PAGED_KV, 0) != 0;
    if (!sv.paged) return FLASHATTN_SUCCESS;
    FLASHATTN_TRY(require(params, FLASHATTN_I64_PAGE_SIZE));
    FLASHATTN_TRY(require(params, FLASHATTN_I64_NUM_PAGES));
    sv.page_size = params.get(FLASHATTN_I64_PAGE_SIZE, 0);
    sv.num_pages = params.get(FLASHATTN_I64_NUM_PAGES, 0);
    sv.max_pages = params.get(FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, (p->seqlen_k + sv.page_size - 1) / sv.page_size);
    int64_t capacity;
    if (mul_add(sv.max_pages, sv.page_size, 0, &capacity) && capacity < p->seqlen_k)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE: %lld pages of %lld keys hold fewer than FLASHATTN_I64_SEQLEN_K = %lld keys",
                    (long long)sv.max_pages, (long long)sv.page_size, (long long)p->seqlen_k);
    sv.page_table_stride = params.get(FLASHATTN_I64_PAGE_TABLE_STRIDE, sv.max_pages);
    if (sv.page_table_stride < sv.max_pages)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_PAGE_TABLE_STRIDE: %lld entries is less than FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE = %lld; "
                    "rows of the page table would overlap",
                    (long long)sv.page_table_stride, (long long)sv.max_pages);
    return FLASHATTN_SUCCESS;
}

// seqused_k, the append and the rotary embedding: their rules between keys.
flashattn_status_t resolve_append(const PlanParams &params, Problem *p) {
    Serving &sv = p->serving;
    sv.seqused_k = params.get(FLASHATTN_I64_SEQUSED_K, 0) != 0;
    sv.new_rows = params.get(FLASHATTN_I64_NEW_KV_ROWS, 0);
    sv.rotary_dim = params.get(FLASHATTN_I64_ROTARY_DIM, 0);
    sv.rotary_interleaved = params.get(FLASHATTN_I64_ROTARY_INTERLEAVED, 0) != 0;
    if (sv.appends() && !sv.seqused_k)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_NEW_KV_ROWS: appending needs the cache lengths; set FLASHATTN_I64_SEQUSED_K = 1");
    if (sv.new_rows > p->seqlen_k)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_NEW_KV_ROWS: %lld rows do not fit a cache of FLASHATTN_I64_SEQLEN_K = %lld keys",
                    (long long)sv.new_rows, (long long)p->seqlen_k);
    if (sv.rotary_dim > 0 && !sv.appends())
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_ROTARY_DIM: the rotary embedding is applied to Q and the appended rows; "
                    "set FLASHATTN_I64_NEW_KV_ROWS > 0");
    if (sv.rotary_dim > p->head_dim)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_ROTARY_DIM: %lld is above FLASHATTN_I64_HEAD_DIM = %lld",
                    (long long)sv.rotary_dim, (long long)p->head_dim);
    if (!sv.appends()) return FLASHATTN_SUCCESS;
    FLASHATTN_TRY(resolve_strides(params, {FLASHATTN_I64_K_NEW_BATCH_STRIDE, FLASHATTN_I64_K_NEW_ROW_STRIDE, FLASHATTN_I64_K_NEW_HEAD_STRIDE},
                                  sv.new_rows, p->heads_kv, p->head_dim, &sv.k_new));
    return resolve_strides(params, {FLASHATTN_I64_V_NEW_BATCH_STRIDE, FLASHATTN_I64_V_NEW_ROW_STRIDE, FLASHATTN_I64_V_NEW_HEAD_STRIDE},
                           sv.new_rows, p->heads_kv, p->head_dim_v, &sv.v_new);
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
    if (!p->serving.paged) FLASHATTN_TRY(require(params, FLASHATTN_I64_TOTAL_K));  // paged: keys are not packed
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
    if (!p->serving.paged)  // a paged plan's keys live in pages, not in total_k packed rows
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
    FLASHATTN_TRY(resolve_paging(params, &p));
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
        {{FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE}, p.kv_rows(), p.heads_kv, p.head_dim, &p.k},
        {{FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE}, p.kv_rows(), p.heads_kv, p.head_dim_v, &p.v},
        {{FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim_v, &p.o},
        {{FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim_v, &p.dout},
        {{FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE}, rows_q, p.heads_q, p.head_dim, &p.dq},
        {{FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim, &p.dk},
        {{FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE}, rows_k, p.heads_kv, p.head_dim_v, &p.dv},
    };
    for (const auto &t : tensors) FLASHATTN_TRY(resolve_strides(params, t.keys, t.rows, t.heads, t.dim, t.out));
    p.deterministic = params.get(FLASHATTN_I64_DETERMINISTIC, 0) != 0;
    p.num_splits = params.get(FLASHATTN_I64_NUM_SPLITS, 0);
    resolve_variants(params, &p);
    FLASHATTN_TRY(resolve_fp8(params, &p));
    FLASHATTN_TRY(resolve_append(params, &p));
    FLASHATTN_TRY(check_extents(p));
    if (p.serving.appends()) {  // the caches are written: no element may be reached twice
        FLASHATTN_TRY(check_output_layout(p.k, p.kv_rows(), p.heads_kv, p.kv_outer(), p.head_dim, "K"));
        FLASHATTN_TRY(check_output_layout(p.v, p.kv_rows(), p.heads_kv, p.kv_outer(), p.head_dim_v, "V"));
    }
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
    const Serving &sv = p.serving;
    auto cache_bytes = [&](int64_t dim, const Strides &s) -> size_t {
        if (!sv.paged) return bytes(rows_k, p.heads_kv, dim, s);
        int64_t end = 0;
        tensor_end(sv.num_pages, sv.page_size, p.heads_kv, dim, s, false, &end);
        return static_cast<size_t>(end) * es;
    };
    auto new_rows_bytes = [&](int64_t dim, const Strides &s) -> size_t {
        if (!sv.appends()) return 0;
        int64_t end = 0;
        tensor_end(p.batch, sv.new_rows, p.heads_kv, dim, s, false, &end);
        return static_cast<size_t>(end) * es;
    };
    TensorExtents e;
    e.q = bytes(rows_q, p.heads_q, p.head_dim, p.q);
    e.k = cache_bytes(p.head_dim, p.k);
    e.v = cache_bytes(p.head_dim_v, p.v);
    e.page_table = sv.paged ? static_cast<size_t>((p.batch - 1) * sv.page_table_stride + sv.max_pages) * 4 : 0;
    e.seqused_k = sv.seqused_k ? static_cast<size_t>(p.batch) * 4 : 0;
    e.k_new = new_rows_bytes(p.head_dim, sv.k_new);
    e.v_new = new_rows_bytes(p.head_dim_v, sv.v_new);
    e.rotary = static_cast<size_t>(p.seqlen_k * (sv.rotary_dim / 2)) * sizeof(float);
    e.o = bytes(rows_q, p.heads_q, p.head_dim_v, p.o) / es * p.o_element_size();
    e.descale = fp8_descale_bytes(p);
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

namespace {

// A pointer the plan has no use for is a mistake (a feature the caller believes is on), not noise.
flashattn_status_t check_unused(const Problem &p, const Tensors &t) {
    const Serving &sv = p.serving;
    const struct { const void *ptr; bool used; const char *name, *why; } all[] = {
        {t.cu_seqlens_q, p.varlen, "cu_seqlens_q", "FLASHATTN_I64_VARLEN is 0"},
        {t.cu_seqlens_k, p.varlen && !sv.paged, "cu_seqlens_k",
         sv.paged ? "a paged plan takes key lengths from seqused_k or seqlen_k" : "FLASHATTN_I64_VARLEN is 0"},
        {t.page_table, sv.paged, "page_table", "FLASHATTN_I64_PAGED_KV is 0"},
        {t.seqused_k, sv.seqused_k, "seqused_k", "FLASHATTN_I64_SEQUSED_K is 0"},
        {t.k_new, sv.appends(), "k_new", "FLASHATTN_I64_NEW_KV_ROWS is 0"},
        {t.v_new, sv.appends(), "v_new", "FLASHATTN_I64_NEW_KV_ROWS is 0"},
        {t.rotary_cos, sv.rotary_dim > 0, "rotary_cos", "FLASHATTN_I64_ROTARY_DIM is 0"},
        {t.rotary_sin, sv.rotary_dim > 0, "rotary_sin", "FLASHATTN_I64_ROTARY_DIM is 0"}};
    for (const auto &a : all)
        if (a.ptr != nullptr && !a.used)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but this plan does not use it (%s)", a.name, a.why);
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t check_execute_args(const Problem &p, const Tensors &t, size_t workspace_needed) {
    const TensorExtents &e = p.extents;
    const Serving &sv = p.serving;
    FLASHATTN_TRY(check_unused(p, t));
    const bool append = sv.appends();
    // With an append the caches are outputs. K and V are checked against everything but each
    // other: one pool may interleave them ([pages, 2, page_size, heads, dim]).
    const Span inputs[] = {{t.q, e.q, "q", true},
                           {t.k, append ? 0 : e.k, "k", true},
                           {t.v, append ? 0 : e.v, "v", true},
                           {t.cu_seqlens_q, cu_seqlens_bytes(p), "cu_seqlens_q", p.varlen},
                           {t.cu_seqlens_k, sv.paged ? 0 : cu_seqlens_bytes(p), "cu_seqlens_k", p.varlen && !sv.paged},
                           {t.page_table, e.page_table, "page_table", sv.paged},
                           {t.seqused_k, e.seqused_k, "seqused_k", sv.seqused_k},
                           {t.k_new, e.k_new, "k_new", append},
                           {t.v_new, e.v_new, "v_new", append},
                           {t.rotary_cos, e.rotary, "rotary_cos", sv.rotary_dim > 0},
                           {t.rotary_sin, e.rotary, "rotary_sin", sv.rotary_dim > 0}};
    const int n_in = sizeof inputs / sizeof inputs[0];
    const Span outputs[] = {{t.o, e.o, "o", true}, {t.lse, e.lse, "lse", false}, {t.k, e.k, "k", true}};
    FLASHATTN_TRY(check_call(inputs, n_in, outputs, append ? 3 : 2, t, workspace_needed));
    if (!append) return FLASHATTN_SUCCESS;
    const Span with_v[] = {{t.o, e.o, "o", true}, {t.lse, e.lse, "lse", false}, {t.v, e.v, "v", true}};
    return check_call(inputs, n_in, with_v, 3, t, workspace_needed);
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
