#include "backends/cuda/host/cache_append.h"

#include "backends/cuda/host/tensor_args.h"
#include "problem/problem.h"

namespace flashattn {

size_t rotated_q_bytes(const Problem &p) {
    if (p.serving.rotary_dim <= 0) return 0;
    return static_cast<size_t>(p.total_query_rows() * p.heads_q * p.head_dim) * p.element_size();
}

void fill_append_params(const Problem &p, const Tensors &t, void *q_rot, AppendParams *out) {
    const Serving &sv = p.serving;
    AppendParams a;
    a.k_new = t.k_new, a.v_new = t.v_new;
    a.k = const_cast<void *>(t.k), a.v = const_cast<void *>(t.v);  // the caches are outputs here
    a.seqused_k = t.seqused_k;
    a.cu_q = p.varlen ? t.cu_seqlens_q : nullptr;
    a.cu_k = p.varlen && !sv.paged ? t.cu_seqlens_k : nullptr;
    a.rotary_cos = t.rotary_cos, a.rotary_sin = t.rotary_sin;
    a.q = t.q;
    a.q_rot = q_rot;
    a.kn_bs = sv.k_new.batch, a.kn_rs = sv.k_new.row, a.kn_hs = sv.k_new.head;
    a.vn_bs = sv.v_new.batch, a.vn_rs = sv.v_new.row, a.vn_hs = sv.v_new.head;
    a.k_bs = p.k.batch, a.k_rs = p.k.row, a.k_hs = p.k.head;
    a.v_bs = p.v.batch, a.v_rs = p.v.row, a.v_hs = p.v.head;
    a.q_bs = p.q.batch, a.q_rs = p.q.row, a.q_hs = p.q.head;
    a.batch = static_cast<int32_t>(p.batch);
    a.new_rows = static_cast<int32_t>(sv.new_rows);
    a.heads_q = static_cast<int32_t>(p.heads_q);
    a.heads_kv = static_cast<int32_t>(p.heads_kv);
    a.seqlen_q = static_cast<int32_t>(p.seqlen_q);
    a.head_dim = static_cast<int32_t>(p.head_dim);
    a.rotary_dim = static_cast<int32_t>(sv.rotary_dim);
    a.interleaved = sv.rotary_interleaved ? 1 : 0;
    if (sv.paged) {
        a.page_table = t.page_table;
        a.page_table_stride = sv.page_table_stride;
        a.page_size = static_cast<int32_t>(sv.page_size);
    }
    *out = a;
}

void use_rotated_q(const Problem &p, void *q_rot, TensorArgs *k) {
    k->q = q_rot;
    k->q_hs = p.head_dim;
    k->q_rs = p.heads_q * p.head_dim;
    k->q_bs = p.seqlen_q * k->q_rs;
}

}  // namespace flashattn
