// Where a query tile's sequence lives (all kernels: FA1, FA2 and its split-KV merge, FA3), where its
// LSE goes, and which key tiles it must visit (FA2, FA3: they walk the visible key tiles from the
// last to the first so that the tiles needing an element mask - causal diagonal, ragged end,
// window edges - come first).
#pragma once

#include <cstdint>

#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace cuda {

// Sequence b: its lengths and first rows. Non-varlen: q_row0 = b*seqlen_q (a row index into the
// [batch*seqlen_q] LSE layout), k_row0 = 0 (K/V are addressed through the batch stride).
struct SeqInfo {
    int sq, sk;
    int64_t q_row0;
    int64_t k_row0;
};

__device__ __forceinline__ SeqInfo seq_info(const TensorArgs &p, int b) {
    SeqInfo s;
    if (p.cu_q != nullptr) {
        const int q0 = p.cu_q[b], k0 = p.cu_k[b];
        s.sq = p.cu_q[b + 1] - q0;
        s.sk = p.cu_k[b + 1] - k0;
        s.q_row0 = q0;
        s.k_row0 = k0;
    } else {
        s.sq = p.seqlen_q;
        s.sk = p.seqlen_k;
        s.q_row0 = static_cast<int64_t>(b) * p.seqlen_q;
        s.k_row0 = 0;
    }
    return s;
}

// Offset of query qpos of sequence b (first packed row q_row0), head `head`, in the LSE output:
// [batch][heads_q][seqlen_q], or [heads_q][total_q] when varlen.
__device__ __forceinline__ int64_t lse_offset(const TensorArgs &p, int b, int head, int64_t q_row0, int qpos) {
    return p.cu_q != nullptr ? static_cast<int64_t>(head) * p.total_rows + q_row0 + qpos
                             : (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q + qpos;
}

// Key tiles of kBN keys seen by queries qlo..qhi of a sequence with sk keys and sk - sq = off:
// [first, last] (empty when last < first), and [l_ok, r_ok], the tiles no row needs masked.
struct KeyTiles {
    int first = 0, last = -1;
    int l_ok = 0, r_ok = -1;
    __device__ __forceinline__ bool masked(int nb) const { return nb > r_ok || nb < l_ok; }
};

__device__ __forceinline__ KeyTiles key_tiles(const TensorArgs &p, int qlo, int qhi, int sk, int off, int kBN) {
    KeyTiles kt;
    const int64_t hi = min(static_cast<int64_t>(sk) - 1, qhi + off + p.right);
    const int64_t lo = max(int64_t(0), qlo + off - p.left);
    if (hi >= lo) {
        kt.first = static_cast<int>(lo / kBN);
        kt.last = static_cast<int>(hi / kBN);
    }
    const int64_t rlim = min(static_cast<int64_t>(sk) - 1, qlo + off + p.right);
    kt.r_ok = rlim >= 0 ? static_cast<int>((rlim + 1) / kBN) - 1 : -1;
    const int64_t llim = qhi + off - p.left;
    kt.l_ok = llim <= 0 ? 0 : static_cast<int>((llim + kBN - 1) / kBN);
    return kt;
}

}  // namespace cuda
}  // namespace flashattn
