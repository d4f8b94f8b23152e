// The attention mask rule and the per-sequence geometry of all CUDA kernels (FA1, FA2 and its
// split-KV merge, FA3): where a query tile's sequence lives and where its LSE goes (SeqInfo,
// seq_info, lse_offset), which keys one query row sees (first_visible_key / last_visible_key: THE
// mask rule, written once here), and which key tiles a query tile must visit (key_tiles, for FA2 and
// FA3: they walk the visible key tiles from the last to the first so that the tiles needing an
// element mask - causal diagonal, ragged end, window edges - come first). The element mask of an
// edge tile is mask_scores (online_softmax.cuh); FA1 derives its own forms from the same rule (see
// the end of this file).
#pragma once

#include <cstdint>

#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace cuda {

// Sequence b: its lengths and first rows. Non-varlen: q_row0 = b*seqlen_q (a row index into the
// [batch*seqlen_q] LSE layout), k_row0 = 0 (K/V are addressed through the batch stride). With
// seqused_k, sk is the sequence's used keys (its cache length) instead of its K extent.
struct SeqInfo {
    int sq, sk;
    int64_t q_row0;
    int64_t k_row0;
};

__device__ __forceinline__ SeqInfo seq_info(const TensorArgs &p, int b) {
    SeqInfo s;
    if (p.cu_q != nullptr) {
        const int q0 = p.cu_q[b];
        s.sq = p.cu_q[b + 1] - q0;
        s.q_row0 = q0;
        // A paged cache has no packed keys (cu_k null): seqlen_k, or seqused_k below, per sequence.
        const int k0 = p.cu_k != nullptr ? p.cu_k[b] : 0;
        s.sk = p.cu_k != nullptr ? p.cu_k[b + 1] - k0 : p.seqlen_k;
        s.k_row0 = k0;
    } else {
        s.sq = p.seqlen_q;
        s.sk = p.seqlen_k;
        s.q_row0 = static_cast<int64_t>(b) * p.seqlen_q;
        s.k_row0 = 0;
    }
    // seqused_k: the keys the sequence uses (rows past them are never loaded: loads and masks stop at sk)
    if (p.seqused_k != nullptr) s.sk = p.seqused_k[b] + p.seqused_add;
    return s;
}

// Offset of query qpos of sequence b (first packed row q_row0), head `head`, in the LSE output:
// [batch][heads_q][seqlen_q], or [heads_q][total_q] when varlen.
__device__ __forceinline__ int64_t lse_offset(const TensorArgs &p, int b, int head, int64_t q_row0, int qpos) {
    return p.cu_q != nullptr ? static_cast<int64_t>(head) * p.total_rows + q_row0 + qpos
                             : (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q + qpos;
}

// The mask rule. Causal and sliding window are one key interval per query (TensorArgs): with
// rdiag = query position + (sk - sq) (bottom-right alignment), key j is visible iff
//   first_visible_key(rdiag, left) <= j <= last_visible_key(rdiag, right, sk)
// (none when first > last). This is the device form of visible_keys (problem.h, the definition
// every backend implements), with causal folded into right and absent windows made "unbounded" by
// fill_tensor_args.
// They take TensorArgs::left_i / right_i (clamped to 2^29, so every sum fits in int32: the
// per-element masks). key_tiles below applies the same two bounds in int64 to a tile's first and
// last rows.
// The key on query 0's diagonal: sk - sq bottom-right (the default), 0 top-left (PyTorch's
// is_causal). Read once per tile, outside the key loop, so a plan without it pays one select.
__device__ __forceinline__ int diagonal_offset(const TensorArgs &p, int sq, int sk) {
    return p.top_left ? 0 : sk - sq;
}

__device__ __forceinline__ int first_visible_key(int rdiag, int left) { return max(0, rdiag - left); }
__device__ __forceinline__ int last_visible_key(int rdiag, int right, int sk) { return min(sk - 1, rdiag + right); }

// Key tiles of kBN keys seen by queries qlo..qhi of a sequence with sk keys and sk - sq = off:
// [first, last] (empty when last < first), and [l_ok, r_ok], the tiles no row needs masked.
struct KeyTiles {
    int first = 0, last = -1;
    int l_ok = 0, r_ok = -1;
    __device__ __forceinline__ bool masked(int nb) const { return nb > r_ok || nb < l_ok; }
};

__device__ __forceinline__ KeyTiles key_tiles(const TensorArgs &p, int qlo, int qhi, int sk, int off, int kBN) {
    KeyTiles kt;
    // last_visible_key of the last row and first_visible_key of the first row, in int64 (left and
    // right unclamped). Written out: calling int64 forms of the helpers reordered FA2 hdim 160's
    // SASS (same instructions, other registers; CUDA 13.0), and this file's rule is the contract.
    const int64_t hi = min(static_cast<int64_t>(sk) - 1, qhi + off + p.right);
    const int64_t lo = max(int64_t(0), qlo + off - p.left);
    if (hi >= lo) {
        kt.first = static_cast<int>(lo / kBN);
        kt.last = static_cast<int>(hi / kBN);
    }
    // No row needs a mask in tile nb iff it lies inside every row's interval: up to the last key of
    // the first row, from the first key of the last row on (unclamped: tiles < 0 do not exist).
    const int64_t rlim = min(static_cast<int64_t>(sk) - 1, qlo + off + p.right);
    kt.r_ok = rlim >= 0 ? static_cast<int>((rlim + 1) / kBN) - 1 : -1;
    const int64_t llim = qhi + off - p.left;
    kt.l_ok = llim <= 0 ? 0 : static_cast<int>((llim + kBN - 1) / kBN);
    return kt;
}

// Sink tokens (TensorArgs::sink_tokens): the key tiles 0 .. sink_tile_last that hold sink keys some
// row of qlo..qhi sees and that lie below the window's tiles kt.first.. (which cover the sink keys
// inside them); -1 when there are none. Row r sees sink key j iff j < sink_tokens and j <=
// last_visible_key(r): the last row (qhi) sees the most. The kernels mask these tiles (mask_scores<true>
// with the sink bound); every row of them is an edge row: kt.masked() holds for each (they lie
// below kt.first <= kt.l_ok, or, with no window tile, below l_ok > the last row's last key).
__device__ __forceinline__ int sink_tile_last(const TensorArgs &p, const KeyTiles &kt, int qhi, int sk, int off,
                                              int kBN) {
    if (p.sink_tokens <= 0) return -1;
    const int64_t hi = min(min(static_cast<int64_t>(sk) - 1, qhi + off + p.right), static_cast<int64_t>(p.sink_tokens) - 1);
    if (hi < 0) return -1;
    const int last = static_cast<int>(hi / kBN);
    return kt.first <= kt.last ? min(last, kt.first - 1) : last;
}

// FA1 (fa1/fa1_kernel.cuh, Seq) applies the same rule in int32 (left_i / right_i) with its own
// tile bookkeeping, because its loop order differs: its OUTER loop walks key blocks and the inner one
// query blocks, so instead of one key-tile range per query tile it asks, at every (key block j, query
// block ib) step,
//   Seq::range(ib)         = [first, last] of key_tiles for query rows ib*BR .. ib*BR+BR-1,
//   Seq::needs_mask(ib, j) = KeyTiles::masked(j) for those rows,
//   Seq::lo(r), Seq::hi(r) = first_visible_key(r + off, left), last_visible_key(r + off, right, sk)
// and masks an edge tile element by element with "key < lo(row) || key > hi(row)", which is
// mask_scores' test. The step scheduler calls range() for every candidate query block, where
// int32 arithmetic and shift divisions keep the scan cheap. FA1 writes these expressions out rather
// than calling the helpers or mask_scores: with the helpers ptxas allocates up to 4 more registers,
// with mask_scores up to 15 more, in FA1's hdim-32/64 kernels (CUDA 13.0).

}  // namespace cuda
}  // namespace flashattn
