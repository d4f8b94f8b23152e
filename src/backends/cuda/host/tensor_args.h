// What every CUDA attention kernel needs to know about its tensors, filled once from the resolved
// Problem and the execute call's Tensors. Each generation's kernel parameters extend it with their
// own fields (workspace layout, schedule, mask encoding). Plain C++, shared by host and device code.
#pragma once

#include <cstdint>

namespace flashattn {

struct Problem;
struct Tensors;

// "Unbounded" window extent: far beyond any sequence length, small enough for int64 sums.
constexpr int64_t kUnboundedWindow = int64_t(1) << 40;

struct TensorArgs {
    const void *q = nullptr;
    const void *k = nullptr;
    const void *v = nullptr;
    void *o = nullptr;
    float *lse = nullptr;           // optional: [batch][heads_q][seqlen_q], or [heads_q][total_q]
    const int32_t *cu_q = nullptr;  // varlen only (device, batch+1 entries)
    const int32_t *cu_k = nullptr;

    // Element strides (batch strides unused when varlen).
    int64_t q_bs = 0, q_rs = 0, q_hs = 0;
    int64_t k_bs = 0, k_rs = 0, k_hs = 0;
    int64_t v_bs = 0, v_rs = 0, v_hs = 0;
    int64_t o_bs = 0, o_rs = 0, o_hs = 0;

    int32_t batch = 0;
    int32_t seqlen_q = 0;  // max over the batch when varlen
    int32_t seqlen_k = 0;
    int32_t heads_q = 0;
    int32_t heads_kv = 0;
    int32_t group = 1;     // heads_q / heads_kv
    int32_t head_dim = 0;  // actual head dim (<= the compiled one, a multiple of 8)
    int32_t head_dim_v = 0;  // V's and O's (== head_dim unless the backend runs head_dim_v != head_dim)
    int64_t total_rows = 0;  // query rows of all sequences: batch*seqlen_q, or total_q when varlen

    float score_log2 = 0.f;     // exp2 multiplier of the stored scores (scale*log2e, or cap*log2e)
    float softcap_scale = 0.f;  // 0: no softcap; else scale/cap (scores become tanh(raw*scale/cap))

    // Causal and sliding window as one key interval per query: key j is visible to query i iff
    // i+off-left <= j <= i+off+right (off = sk - sq: bottom-right alignment) and 0 <= j < sk.
    int64_t right = kUnboundedWindow;
    int64_t left = kUnboundedWindow;
    int32_t right_i = 1 << 29;  // the same clamped to 2^29 for per-element masks (seqlens < 2^28)
    int32_t left_i = 1 << 29;
    // FLASHATTN_MASK_ALIGN_TOP_LEFT: off = 0 instead of sk - sq (cuda::diagonal_offset). Since 0.3.
    int32_t top_left = 0;
    // FLASHATTN_I64_SINK_LOGITS: fp32 [heads_q] on the device (cuda::join_sink), else null. Since 0.3.
    const float *sink_logits = nullptr;
    // FLASHATTN_I64_ALIBI: fp32 [heads_q] slopes on the device (cuda::alibi_scores), else null; and
    // the factor taking a natural-unit bias to the kernels' unscaled scores (1 / scale, or 1 / cap
    // with a soft cap: the exp2 multiplier score_log2 then brings it back). Since 0.3.
    const float *alibi_slopes = nullptr;
    float alibi_to_score = 0.f;
    // FLASHATTN_I64_SINK_TOKENS: keys 0 .. sink_tokens - 1 escape the left window (clamped to
    // 2^30; 0: none). Since 0.3.
    int32_t sink_tokens = 0;

    // seqused_k (device, batch entries; null when the plan has none): sequence b attends over
    // seqused_k[b] + seqused_add keys (seqused_add: the rows an append wrote before the kernel).
    const int32_t *seqused_k = nullptr;
    int32_t seqused_add = 0;
};

// Pointers, strides, sizes and the score scaling of one execute call.
void fill_tensor_args(const Problem &p, const Tensors &t, TensorArgs *out);

// The mask as one key interval per query (TensorArgs::left / right): causal folded into right,
// absent windows kUnboundedWindow.
struct MaskBounds {
    int64_t left, right;
};
MaskBounds mask_bounds(const Problem &p);

}  // namespace flashattn
