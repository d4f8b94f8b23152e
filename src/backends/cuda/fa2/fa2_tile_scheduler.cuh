// FA2 forward tile scheduler: which work one CTA does. The grid has one CTA per (query tile,
// head, batch x split), with no persistent loop, so "scheduling" is the grid's shape (host side,
// fwd_grid) and its decoding (device side, fwd_work) - kept side by side here so that they cannot
// drift apart - plus a split's share of the visible key tiles.
//
// Forward-only as written (the grid's x is the query tile); a backward pass that walks key tiles
// per CTA needs its own decoding, but the same split of an interval of tiles (split_key_tiles).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {

// One CTA's work: query tile `mblk` (packed rows mblk * kBM ..), grid head `hh` (a query head, or
// a kv head with pack-GQA), sequence `b` and split-KV part `split`.
struct FwdWork {
    int mblk, hh, b, split;
};

// Grid: x = query tiles of the longest sequence, y = heads (kv heads with pack-GQA, whose CTAs
// then hold all query heads of their group), z = batch x splits.
template <class Tr>
dim3 fwd_grid(const Params &p) {
    const int64_t prow_max = static_cast<int64_t>(p.seqlen_q) * p.pack;
    return dim3(static_cast<unsigned>((prow_max + Tr::kBM - 1) / Tr::kBM),
                static_cast<unsigned>(p.pack > 1 ? p.heads_kv : p.heads_q),
                static_cast<unsigned>(p.batch * p.num_splits));
}

// reverse_m: the last query tiles (the most key tiles under a causal mask) start first.
__device__ __forceinline__ FwdWork fwd_work(const Params &p) {
    FwdWork w;
    w.mblk = p.reverse_m ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
    w.hh = blockIdx.y;
    w.b = static_cast<int>(blockIdx.z) / p.num_splits;
    w.split = static_cast<int>(blockIdx.z) - w.b * p.num_splits;
    return w;
}

// Key tiles [first, last] of split `split` of a CTA whose visible tiles are kt.first..kt.last:
// consecutive equal shares (the last one may be shorter or empty: first > last).
struct KeyTileRange {
    int first = 0, last = -1;
};

__device__ __forceinline__ KeyTileRange split_key_tiles(const cuda::KeyTiles &kt, int split, int num_splits) {
    KeyTileRange r;
    if (kt.first <= kt.last) {
        const int per = (kt.last - kt.first + num_splits) / num_splits;
        r.first = kt.first + split * per;
        r.last = min(kt.last, r.first + per - 1);
    }
    return r;
}

}  // namespace fa2
}  // namespace flashattn
