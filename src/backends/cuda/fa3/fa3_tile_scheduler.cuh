// FA3 forward, persistent tile scheduler: which work tile (query block, head, sequence) a CTA
// takes next, what both roles know about it (TileCoords: sequence lengths, visible key tiles),
// and the TMA coordinates of its rows.
//
// Reusable as is by a backward or FP8 kernel that walks (128-row query tile, head, sequence)
// tiles: the schedule is a pure function of (blockIdx.x, gridDim.x, round), so every warpgroup
// of a CTA walks the same list without communicating; no atomics, no shared memory. It assumes
// kBlockM (128) query rows per tile and that the caller passes its own key tile width kBN.
#pragma once

#include <cstdint>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_params.h"

namespace flashattn {
namespace fa3 {

// What both roles know about a work tile.
struct TileCoords {
    int head, b;
    int m0;             // first query row of the tile within its sequence
    cuda::SeqInfo seq;  // lengths and first rows
    cuda::KeyTiles kt;  // visible key tiles (empty when the tile has no query row)
    int sink_last = -1;  // sink tokens: tiles 0 .. sink_last below kt.first (cuda::sink_tile_last)
    __device__ bool has_rows() const { return m0 < seq.sq; }
    __device__ int n_tiles() const { return kt.last - kt.first + 1 + sink_last + 1; }
    __device__ bool has_keys() const { return has_rows() && n_tiles() > 0; }
    // The i-th key tile of the walk both roles take: the window's from kt.last down, then the sink
    // tiles from sink_last down.
    __device__ int key_tile(int i) const {
        const int nw = kt.last - kt.first + 1;
        return i < nw ? kt.last - i : sink_last - (i - nw);
    }
};

// Work tile `tile` of the persistent schedule. Equal-cost tiles (no causal mask): query tiles
// fastest, so CTAs working at the same time share a head's K/V in L2. Causal: a tile's cost grows
// with its query block, so within each L2 section (p.section (head, sequence) pairs whose K/V
// fit in about half the L2) the list runs from the heaviest query block of every pair down to the
// lightest: longest-processing-time first, while the CTAs working at the same time still share
// the section's K/V.
__device__ __forceinline__ TileCoords tile_coords(const Params &p, int tile, int m_blocks, int kBN) {
    TileCoords c;
    int mblk, rest;
    if (p.reverse_m) {
        const int hb = p.heads_q * p.batch;
        const int per_section = p.section * m_blocks;
        const int first = tile / per_section * p.section;  // first pair of this tile's section
        const int u = tile % per_section;
        const int width = min(p.section, hb - first);       // the last section may be narrower
        mblk = m_blocks - 1 - u / width;
        rest = first + u % width;
    } else {
        mblk = tile % m_blocks;
        rest = tile / m_blocks;
    }
    c.head = rest % p.heads_q;
    c.b = rest / p.heads_q;
    c.m0 = mblk * kBlockM;
    c.seq = cuda::seq_info(p, c.b);
    if (c.has_rows()) {
        const int qhi = min(c.m0 + kBlockM, c.seq.sq) - 1;
        const int off = cuda::diagonal_offset(p, c.seq.sq, c.seq.sk);
        c.kt = cuda::key_tiles(p, c.m0, qhi, c.seq.sk, off, kBN);
        c.sink_last = cuda::sink_tile_last(p, c.kt, qhi, c.seq.sk, off, kBN);
    }
    return c;
}

// The r-th tile of this CTA: round r of the list, dealt forwards in even rounds and backwards in
// odd ones ("snake"), so that with the causal heaviest-first order each CTA pairs heavy tiles with
// light ones. -1 when the list is exhausted. (The FP8 producer steps the same order without this
// function, at 24 registers: fa3_fp8_kernel.cuh, Fp8TileWalk. Change both together.)
__device__ __forceinline__ int nth_tile(int r, int n_work) {
    const int x = static_cast<int>(blockIdx.x), g = static_cast<int>(gridDim.x);
    const int64_t t = static_cast<int64_t>(r) * g + ((r & 1) ? g - 1 - x : x);
    return t < n_work ? static_cast<int>(t) : -1;
}

// TMA coordinates of a tile's rows in the rank-4 {column, row, head, batch} tensor maps: varlen
// tensors are one packed batch whose rows start at the sequence's cu_seqlens offset.
__device__ __forceinline__ int32_t q_row_coord(const Params &p, const TileCoords &c) {
    return static_cast<int32_t>(p.cu_q != nullptr ? c.seq.q_row0 + c.m0 : c.m0);
}
__device__ __forceinline__ int32_t kv_row_coord(const Params &p, const TileCoords &c, int nb, int kBN) {
    return static_cast<int32_t>((p.cu_k != nullptr ? c.seq.k_row0 : 0) + static_cast<int64_t>(nb) * kBN);
}
__device__ __forceinline__ int32_t batch_coord(const Params &p, const TileCoords &c) {
    return p.cu_q != nullptr ? 0 : c.b;
}

}  // namespace fa3
}  // namespace flashattn
