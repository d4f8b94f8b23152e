#include "backends/cuda/host/tensor_args.h"

#include <algorithm>

#include "problem/problem.h"

namespace flashattn {

MaskBounds mask_bounds(const Problem &p) {
    int64_t right = kUnboundedWindow;
    if (p.causal) right = 0;
    if (p.window_right >= 0) right = std::min(right, p.window_right);
    return MaskBounds{p.window_left >= 0 ? p.window_left : kUnboundedWindow, right};
}

void fill_tensor_args(const Problem &p, const Tensors &t, TensorArgs *out) {
    TensorArgs a;
    a.q = t.q;
    a.k = t.k;
    a.v = t.v;
    a.o = t.o;
    a.lse = t.lse;
    a.cu_q = p.varlen ? t.cu_seqlens_q : nullptr;
    a.cu_k = p.varlen && !p.serving.paged ? t.cu_seqlens_k : nullptr;  // paged: keys are not packed
    a.q_bs = p.q.batch, a.q_rs = p.q.row, a.q_hs = p.q.head;
    a.k_bs = p.k.batch, a.k_rs = p.k.row, a.k_hs = p.k.head;
    a.v_bs = p.v.batch, a.v_rs = p.v.row, a.v_hs = p.v.head;
    a.o_bs = p.o.batch, a.o_rs = p.o.row, a.o_hs = p.o.head;
    a.batch = static_cast<int32_t>(p.batch);
    a.seqlen_q = static_cast<int32_t>(p.seqlen_q);
    a.seqlen_k = static_cast<int32_t>(p.seqlen_k);
    a.heads_q = static_cast<int32_t>(p.heads_q);
    a.heads_kv = static_cast<int32_t>(p.heads_kv);
    a.group = static_cast<int32_t>(p.group_size());
    a.head_dim = static_cast<int32_t>(p.head_dim);
    a.head_dim_v = static_cast<int32_t>(p.head_dim_v);
    a.total_rows = p.total_query_rows();
    // exp2 with log2(e) folded in; with a softcap the kernels compute cap*tanh(raw*scale/cap) and
    // the exp2 multiplier applies to that.
    constexpr double kLog2e = 1.4426950408889634;
    a.score_log2 = static_cast<float>((p.softcap > 0.0 ? p.softcap : p.scale) * kLog2e);
    a.softcap_scale = p.softcap > 0.0 ? static_cast<float>(p.scale / p.softcap) : 0.f;
    const MaskBounds m = mask_bounds(p);
    a.right = m.right;
    a.left = m.left;
    a.right_i = static_cast<int32_t>(std::min<int64_t>(a.right, int64_t(1) << 29));
    a.left_i = static_cast<int32_t>(std::min<int64_t>(a.left, int64_t(1) << 29));
    a.top_left = p.top_left ? 1 : 0;
    a.sink_logits = t.sink_logits;
    if (p.alibi) {
        a.alibi_slopes = t.alibi_slopes;
        a.alibi_to_score = static_cast<float>(1.0 / (p.softcap > 0.0 ? p.softcap : p.scale));
    }
    a.sink_tokens = static_cast<int32_t>(std::min<int64_t>(p.sink_tokens, int64_t(1) << 30));
    if (p.serving.seqused_k) {
        a.seqused_k = t.seqused_k;
        a.seqused_add = static_cast<int32_t>(p.serving.new_rows);
    }
    *out = a;
}

}  // namespace flashattn
