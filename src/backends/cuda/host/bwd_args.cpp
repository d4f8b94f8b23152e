#include "backends/cuda/host/bwd_args.h"

#include <cstddef>

#include "base/workspace.h"
#include "problem/problem.h"

namespace flashattn {

int64_t dq_frag_rows(const Problem &p) {
    return (p.total_query_rows() + 15) / 16 * 16 + 16 * p.batch;
}

BwdSlices add_backward_slices(const Problem &p, int64_t query_blocks, const BwdSliceNames &names,
                              WorkspaceLayout *ws, bool dq_frag) {
    BwdSlices s;
    s.dq_frag = dq_frag;
    const size_t rows = static_cast<size_t>(p.heads_q) * static_cast<size_t>(p.total_query_rows());
    if (p.deterministic) {
        s.sem_blocks = static_cast<int>(query_blocks);
        s.dq_sem = ws->add(names.dq_sem, static_cast<size_t>(p.batch) * static_cast<size_t>(p.heads_q) *
                                             static_cast<size_t>(s.sem_blocks) * sizeof(int32_t));
    }
    s.row_dot = ws->add(names.row_dot, rows * sizeof(float));
    const size_t accum = dq_frag ? static_cast<size_t>(p.heads_q) * static_cast<size_t>(dq_frag_rows(p)) *
                                       static_cast<size_t>((p.head_dim + 15) / 16 * 16)
                                 : rows * static_cast<size_t>(p.head_dim);
    s.dq_accum = ws->add(names.dq_accum, accum * sizeof(float));
    return s;
}

void fill_backward_args(const Problem &p, const Tensors &t, const WorkspaceLayout &ws, const BwdSlices &slices,
                        BwdTensorArgs *out) {
    fill_tensor_args(p, t, out);
    out->dout = t.dout;
    out->dq = t.dq;
    out->dk = t.dk;
    out->dv = t.dv;
    out->do_bs = p.dout.batch, out->do_rs = p.dout.row, out->do_hs = p.dout.head;
    out->dq_bs = p.dq.batch, out->dq_rs = p.dq.row, out->dq_hs = p.dq.head;
    out->dk_bs = p.dk.batch, out->dk_rs = p.dk.row, out->dk_hs = p.dk.head;
    out->dv_bs = p.dv.batch, out->dv_rs = p.dv.row, out->dv_hs = p.dv.head;
    out->row_dot = ws.at<float>(t.workspace, slices.row_dot);
    out->dq_accum = ws.at<float>(t.workspace, slices.dq_accum);
    out->dq_frag = slices.dq_frag ? 1 : 0;
    out->dq_rows = slices.dq_frag ? dq_frag_rows(p) : p.total_query_rows();
    out->scale = static_cast<float>(p.scale);
    out->dq_splits = 1;
    out->deterministic = p.deterministic ? 1 : 0;
    out->dsink_logits = t.dsink_logits;
    if (p.deterministic) {
        out->dq_sem = ws.at<int32_t>(t.workspace, slices.dq_sem);
        out->sem_blocks = slices.sem_blocks;
    }
}

}  // namespace flashattn
