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
    TensorExtents extents;  // resolved once: what every execute's overlap checks read
    int32_t device = 0;
    // Attention variants (problem/variants.cpp resolves them; since 0.3).
    bool top_left = false;        // FLASHATTN_MASK_ALIGN_TOP_LEFT: query i's diagonal key is i
    int64_t sink_tokens = 0;      // the first n keys escape the left window
    bool sink_logits = false;     // a per-head sink logit joins the softmax denominator
    bool alibi = false;           // per-head ALiBi slopes

    int64_t group_size() const { return heads_q / heads_kv; }  // query heads per key/value head
    // Extents of the tensors' row and batch axes: varlen packs every sequence along the rows
    // (total_q / total_k rows, one batch); otherwise seqlen rows in each of `batch` batches.
    int64_t q_rows() const { return varlen ? total_q : seqlen_q; }
    int64_t k_rows() const { return varlen ? total_k : seqlen_k; }
    int64_t batch_extent() const { return varlen ? 1 : batch; }
    // Query rows of all sequences, per head: the row count of the LSE and split-KV layouts.
    int64_t total_query_rows() const { return varlen ? total_q : batch * seqlen_q; }
    size_t element_size() const;
    bool has_mask() const { return causal || window_left >= 0 || window_right >= 0; }
    // Any variant that the GPU kernels written before 0.3 do not know.
    bool has_variant() const { return top_left || sink_tokens > 0 || sink_logits || alibi; }
};

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
    // Variant arrays (flashattn_extras_t), fp32 [heads_q]; null when the plan uses none.
    const float *sink_logits = nullptr;
    const float *alibi_slopes = nullptr;
    float *dsink_logits = nullptr;  // backward output
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
