// The resolved description of one attention problem, shared by validation, dispatch and every
// backend. Backends read it; only src/problem/ fills it in.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

// Element strides of one [batch, seq, head, dim] tensor; the last dimension is contiguous.
struct Strides {
    int64_t batch = 0;
    int64_t row = 0;
    int64_t head = 0;
};

// Bytes spanned by each tensor, from its first element to one past its last (0 when empty).
struct TensorExtents {
    size_t q = 0, k = 0, v = 0, o = 0, lse = 0;
    size_t dout = 0, dq = 0, dk = 0, dv = 0;  // the backward's tensors
    size_t page_table = 0, seqused_k = 0, k_new = 0, v_new = 0, rotary = 0;  // serving (0 when unused)
    size_t descale = 0;  // each FP8 descale array (0 when the plan is not FP8)
};

// The serving features (issue 18): a paged K/V cache, per-sequence key counts, rows appended to
// the cache before attention with an optional rotary embedding. All off by default.
struct Serving {
    bool paged = false;
    int64_t page_size = 0;          // keys per page
    int64_t num_pages = 0;          // pages in each cache (K's and V's outer dimension)
    int64_t max_pages = 0;          // page-table columns
    int64_t page_table_stride = 0;  // int32 entries between page-table rows
    bool seqused_k = false;         // per-sequence key counts (cache lengths before the append)
    int64_t new_rows = 0;           // rows appended per sequence (0: no append)
    Strides k_new, v_new;           // [batch, new_rows, heads_kv, dim]
    int64_t rotary_dim = 0;         // 0: no rotary
    bool rotary_interleaved = false;

    bool appends() const { return new_rows > 0; }
    bool any() const { return paged || seqused_k || appends(); }
};

struct Problem {
    int64_t batch = 0;
    int64_t seqlen_q = 0;  // maximum over the batch when varlen
    int64_t seqlen_k = 0;
    int64_t heads_q = 0;
    int64_t heads_kv = 0;
    int64_t head_dim = 0;
    int64_t head_dim_v = 0;
    flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP16;
    bool causal = false;
    int64_t window_left = -1;  // -1: unbounded
    int64_t window_right = -1;
    double scale = 0.0;    // resolved: never 0
    double softcap = 0.0;  // 0: off
    bool varlen = false;
    int64_t total_q = 0;  // varlen only
    int64_t total_k = 0;
    Strides q, k, v, o;
    Strides dout, dq, dk, dv;  // backward: the layouts of O, Q, K, V with their own strides
    bool deterministic = false;  // backward: reduce in a fixed order (bitwise-reproducible)
    int64_t num_splits = 0;      // FLASHATTN_I64_NUM_SPLITS: split-KV parts asked for (0: the backend decides)
    Serving serving;
    TensorExtents extents;  // resolved once: what every execute's overlap checks read
    int32_t device = 0;
    // Attention variants (problem/variants.cpp resolves them; since 0.3).
    bool top_left = false;        // FLASHATTN_MASK_ALIGN_TOP_LEFT: query i's diagonal key is i
    int64_t sink_tokens = 0;      // the first n keys escape the left window
    bool sink_logits = false;     // a per-head sink logit joins the softmax denominator
    bool alibi = false;           // per-head ALiBi slopes
    // FP8 (problem/fp8.cpp; since 0.3): O's own element type (dtype's except for FP8 inputs) and
    // the layout of the descale arrays, in floats per sequence and per key/value head.
    flashattn_dtype_t o_dtype = FLASHATTN_DTYPE_FP16;
    int64_t descale_batch_stride = 0;
    int64_t descale_head_stride = 0;

    int64_t group_size() const { return heads_q / heads_kv; }  // query heads per key/value head
    // Extents of the tensors' row and batch axes: varlen packs every sequence along the rows
    // (total_q / total_k rows, one batch); otherwise seqlen rows in each of `batch` batches.
    int64_t q_rows() const { return varlen ? total_q : seqlen_q; }
    int64_t k_rows() const { return varlen ? total_k : seqlen_k; }
    int64_t batch_extent() const { return varlen ? 1 : batch; }
    // Query rows of all sequences, per head: the row count of the LSE and split-KV layouts.
    int64_t total_query_rows() const { return varlen ? total_q : batch * seqlen_q; }
    size_t element_size() const;  // of Q, K, V (and of the backward's tensors)
    size_t o_element_size() const;  // of O
    bool fp8() const { return dtype == FLASHATTN_DTYPE_FP8_E4M3; }
    bool has_mask() const { return causal || window_left >= 0 || window_right >= 0; }
    // K and V's outer dimension and rows: pages of page_size keys when paged; otherwise those of
    // the batch (one packed "batch" when varlen).
    int64_t kv_outer() const { return serving.paged ? serving.num_pages : batch_extent(); }
    int64_t kv_rows() const { return serving.paged ? serving.page_size : k_rows(); }
};

// The first serving feature `p` uses, in the user's words with its key; nullptr when none. What a
// backend without that feature names in its NOT_SUPPORTED reason.
inline const char *serving_feature(const Problem &p) {
    if (p.serving.paged) return "a paged K/V cache (FLASHATTN_I64_PAGED_KV)";
    if (p.serving.appends()) return "appending to the K/V cache (FLASHATTN_I64_NEW_KV_ROWS)";
    if (p.serving.seqused_k) return "per-sequence key counts (FLASHATTN_I64_SEQUSED_K)";
    return nullptr;
}

// Pointers of one execute call (forward or backward). cu_seqlens are set for varlen plans only.
struct Tensors {
    const void *q = nullptr;
    const void *k = nullptr;
    const void *v = nullptr;
    void *o = nullptr;
    float *lse = nullptr;
    const int32_t *cu_seqlens_q = nullptr;
    const int32_t *cu_seqlens_k = nullptr;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    flashattn_stream_t stream = nullptr;
    // Backward pass only (null in forward calls): the gradient of O in, the gradients out. lse is
    // then an input (the forward's).
    const void *dout = nullptr;
    void *dq = nullptr;
    void *dk = nullptr;
    void *dv = nullptr;
    // Variant arrays (FLASHATTN_ARG_SINK_LOGITS ...), fp32 [heads_q]; null when the plan uses none.
    const float *sink_logits = nullptr;
    const float *alibi_slopes = nullptr;
    float *dsink_logits = nullptr;  // backward output
    // Serving (flashattn_plan_execute_args only; null otherwise). With an append, k and v are the
    // caches and are written.
    const int32_t *page_table = nullptr;
    const int32_t *seqused_k = nullptr;
    const void *k_new = nullptr;
    const void *v_new = nullptr;
    const float *rotary_cos = nullptr;
    const float *rotary_sin = nullptr;
    // FP8 plans: fp32 descale factors laid out per (sequence, key/value head); null otherwise.
    const float *descale_q = nullptr;
    const float *descale_k = nullptr;
    const float *descale_v = nullptr;
};

// The keys query `row` (0-based within its sequence of length sq, against sk keys) may see form
// one interval [first, last] (empty when first > last). This is the single definition of the
// causal and sliding-window masks (bottom-right aligned) that every backend implements.
struct KeyRange {
    int64_t first;
    int64_t last;
};

inline KeyRange visible_keys(const Problem &p, int64_t row, int64_t sq, int64_t sk) {
    const int64_t diag = p.top_left ? row : row + sk - sq;  // the key aligned with this query
    int64_t first = 0;
    int64_t last = sk - 1;
    if (p.causal && diag < last) last = diag;
    if (p.window_right >= 0 && diag + p.window_right < last) last = diag + p.window_right;
    if (p.window_left >= 0 && diag - p.window_left > first) first = diag - p.window_left;
    return {first, last};
}

// Sink tokens: keys [0, sink_last] are visible to query `row` besides its interval (they escape
// the left window, not the causal mask or the right window); -1 when there are none.
inline int64_t visible_sink_last(const Problem &p, int64_t row, int64_t sq, int64_t sk) {
    if (p.sink_tokens <= 0) return -1;
    const int64_t last = visible_keys(p, row, sq, sk).last;
    return p.sink_tokens - 1 < last ? p.sink_tokens - 1 : last;
}

// The distance ALiBi scales for query `row` and key `key`: |diagonal key - key|.
inline int64_t alibi_distance(const Problem &p, int64_t row, int64_t key, int64_t sq, int64_t sk) {
    const int64_t diag = p.top_left ? row : row + sk - sq;
    return diag > key ? diag - key : key - diag;
}

}  // namespace flashattn
