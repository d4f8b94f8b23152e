// What the FA2 and FA3 backward passes share on the host side: the kernels' backward arguments
// (the gradient tensors, their strides, the workspace slices and the mode) on top of TensorArgs,
// the workspace slices themselves, and the filling of both. Each generation's BwdParams extends
// BwdTensorArgs with its own fields; device/bwd_prep.cuh reads these fields by name. Plain C++,
// shared by host and device code (the .cpp half is host only).
#pragma once

#include <algorithm>
#include <cstdint>

#include "backends/cuda/host/tensor_args.h"

namespace flashattn {

class WorkspaceLayout;

struct BwdTensorArgs : TensorArgs {
    const void *dout = nullptr;  // dO: layout of O
    void *dq = nullptr;          // layouts of Q, K, V
    void *dk = nullptr;
    void *dv = nullptr;
    int64_t do_bs = 0, do_rs = 0, do_hs = 0;
    int64_t dq_bs = 0, dq_rs = 0, dq_hs = 0;
    int64_t dk_bs = 0, dk_rs = 0, dk_hs = 0;
    int64_t dv_bs = 0, dv_rs = 0, dv_hs = 0;

    float *row_dot = nullptr;   // workspace: [heads_q][total_rows] fp32, D_i = dO_i . O_i
    float *dq_accum = nullptr;  // workspace: fp32, [heads_q][total_rows][head_dim] or (dq_frag) the
                                // fragment layout of device/dq_accum.cuh
    int64_t dq_rows = 0;        // the accumulator's rows per query head (total_rows when row-major)
    int32_t dq_frag = 0;        // 1: the accumulator in mma fragment order (FA2; device/dq_accum.cuh)
    int32_t *dq_sem = nullptr;  // deterministic: [batch][heads_q][sem_blocks] zeroed counters that
                                // order the dQ adds of one query block (key blocks ascending)
    int32_t sem_blocks = 0;     // query blocks of the longest sequence (the generation's block rows)
    float scale = 0.f;          // softmax scale (dK and dQ are multiplied by it at the end)
    int32_t dq_splits = 1;      // accumulator copies the preprocess zeroes and the convert sums (1 since
                                // the deterministic mode orders its adds instead of copying)
    int32_t deterministic = 0;  // 1: dQ adds ordered by dq_sem
    float *dsink_logits = nullptr;  // sink logits' gradient [heads_q] (TensorArgs::sink_logits set)
};

// The deterministic mode's ascending turns (FA2; FA3's heads-fastest grid): key block nb, which
// visits query block q, adds into q's dQ after every lower key block that visits q. Those are
// contiguous from nb_first (the block holding key q_first_row + off - left: every key block's
// visible rows form an interval that moves forward with the block), except that the nsb sink
// blocks (sink tokens: ceil(sink_tokens / block keys); they escape the left window and walk to
// the sequence's end) visit every query block at or past their first: so nb after the sink
// blocks has nb - max(0, nb_first - nsb) before it, a sink block nb.
constexpr int ascending_turn(int nb, int nb_first, int nsb) {
    return nb < nsb ? nb : nb - (nb_first > nsb ? nb_first - nsb : 0);
}

// The deterministic mode's descending turns (FA2's keys-descending grid; plans without sink
// tokens): key block nb adds into query block q's dQ after every higher key block that visits q.
// The visitors are contiguous (as above) up to the block holding the last key that q's last row
// sees (q_last_row + off + right, within the sequence's sk keys), so nb has
// turn_last_block - nb before it. Only called for a block that visits q (the key is then >= 0).
// 32-bit on purpose (FA3's writer warp computes it at 24 registers): right_i is the window's right
// bound clamped to 2^29 (host/tensor_args.h), past any key at the sequence lengths allowed (< 2^28).
constexpr int turn_last_block(int q_last_row, int off, int right_i, int sk, int kbn) {
    return (q_last_row + off + right_i < sk - 1 ? q_last_row + off + right_i : sk - 1) / kbn;
}

// The query rows an ascending walk (FA2's; FA3's heads-fastest) visits for the key block of keys
// n0..n_hi: row i sees key j iff i + off - left <= j <= i + off + right (mask.cuh), so i in
// [n0 - off - right, n_hi - off + left] clipped to the sequence; a block holding sink keys (they
// escape the left window) runs to the last row. Empty when lo > hi. The kernel and
// test_fa3_bwd_turns both read it.
struct BwdRowRange {
    int64_t lo, hi;
};
constexpr BwdRowRange ascending_walk_rows(int n0, int64_t n_hi, int sq, int off, int64_t left, int64_t right,
                                          int sink_tokens) {
    return BwdRowRange{std::max(int64_t(0), n0 - off - right),
                       n0 < sink_tokens ? static_cast<int64_t>(sq) - 1
                                        : std::min(static_cast<int64_t>(sq) - 1, n_hi - off + left)};
}

// ascending_turn's nb_first for the query block whose first row is m0: the block of kbn keys
// holding that row's first visible key (m0 + off - left), 0 when the window reaches key 0.
constexpr int turn_first_block(int m0, int off, int64_t left, int kbn) {
    const int64_t first_key = m0 + off - left;
    return first_key > 0 ? static_cast<int>(first_key / kbn) : 0;
}

// The backward's workspace slices (indices into the plan's WorkspaceLayout, -1 when absent), as
// decided at finalize. Every generation's BwdPlan extends it.
struct BwdSlices {
    int dq_accum = -1;   // fp32 dQ accumulator: [heads_q][rows][head_dim], or dq_frag's layout
    bool dq_frag = false;  // the accumulator in mma fragment order (device/dq_accum.cuh)
    int row_dot = -1;    // [heads_q][rows] fp32 dO.O row sums (rows: batch*seqlen_q, or total_q)
    int dq_sem = -1;     // deterministic: [batch][heads_q][sem_blocks] int32 dQ order counters
    int sem_blocks = 0;  // query blocks of the longest sequence (deterministic)
};

// The slices' names in the layout (string literals: the layout keeps the pointers).
struct BwdSliceNames {
    const char *dq_sem, *row_dot, *dq_accum;
};

// Adds the slices to `ws` (the order counters only in deterministic mode, one per query block of
// `query_blocks` per sequence and query head; the dQ accumulator in fragment order when dq_frag)
// and returns their indices.
BwdSlices add_backward_slices(const Problem &p, int64_t query_blocks, const BwdSliceNames &names,
                              WorkspaceLayout *ws, bool dq_frag = false);

// Rows per query head of the fragment-layout accumulator (device/dq_accum.cuh's dq_frag_row0 bound).
int64_t dq_frag_rows(const Problem &p);

// TensorArgs of the call, then the gradients with their strides, the workspace slices' addresses,
// the scale and the mode. The generation's own fields are left to the caller.
void fill_backward_args(const Problem &p, const Tensors &t, const WorkspaceLayout &ws, const BwdSlices &slices,
                        BwdTensorArgs *out);

}  // namespace flashattn
