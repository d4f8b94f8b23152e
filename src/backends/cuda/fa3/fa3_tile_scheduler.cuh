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
#include "backends/cuda/device/ptx.cuh"
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

// The part of a tile's coordinates both forms of tile_coords share: from the tile's query block
// and (head, sequence) pair, the sequence's lengths and the visible key tiles.
__device__ __forceinline__ TileCoords coords_of(const Params &p, int mblk, int head, int b, int kBN) {
    TileCoords c;
    c.head = head;
    c.b = b;
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

// Work tile `tile` of the persistent schedule. Equal-cost tiles (no causal mask): query tiles
// fastest, so CTAs working at the same time share a head's K/V in L2. Causal: a tile's cost grows
// with its query block, so within each L2 section (p.section (head, sequence) pairs whose K/V
// fit in about half the L2) the list runs from the heaviest query block of every pair down to the
// lightest: longest-processing-time first, while the CTAs working at the same time still share
// the section's K/V. This form divides per call (the FP8 kernel's); the forward kernel takes the
// one on TileSchedule below, the same list.
__device__ __forceinline__ TileCoords tile_coords(const Params &p, int tile, int m_blocks, int kBN) {
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
    return coords_of(p, mblk, rest % p.heads_q, rest / p.heads_q, kBN);
}

// Division by a value d fixed for the whole kernel, as a multiply: with y = floor((2^32 - 1) / d)
// (recip, computed once), q = umulhi(n, y) is floor(n / d) or one less for any 32-bit n (n y / 2^32
// lies in (n/d - 1, n/d]: y d is in [2^32 - d, 2^32 - 1]), and one compare of the remainder fixes
// it. 5 uniform-datapath instructions; the compiler's int division is ~25 (a reciprocal of d through
// I2F.RP / MUFU.RCP / F2I on the vector pipe, R2UR back, the signed fix-ups), and ptxas does not
// hoist its reciprocal out of the persistent loop. d >= 1 (an empty problem's 0, which walks no tile,
// takes 1's), n >= 0.
__device__ __forceinline__ uint32_t recip(int d) { return 0xffffffffu / static_cast<uint32_t>(max(d, 1)); }

__device__ __forceinline__ int divmod(int n, int d, uint32_t y, int &rem) {
    uint32_t q = __umulhi(static_cast<uint32_t>(n), y);
    uint32_t r = static_cast<uint32_t>(n) - q * static_cast<uint32_t>(d);
    if (r >= static_cast<uint32_t>(d)) {
        ++q;
        r -= static_cast<uint32_t>(d);
    }
    rem = static_cast<int>(r);
    return static_cast<int>(q);
}

// The reciprocals of the schedule's divisors, in shared memory: written once per CTA by one thread
// before the CTA's first barrier (schedule_recips_write), read per tile by tile_coords. Registers
// for them, live across the consumer's mainloop, spilled 44 bytes at head dim 128 (ptxas 13.0).
// outer: of m_blocks, or with reverse_m of a section's tiles (section * m_blocks); width: of the
// pairs of a full section (reverse_m); heads: of heads_q; group: of heads_q / heads_kv (the
// producer's K/V head, kv_head).
struct ScheduleRecips {
    uint32_t outer, width, heads, group;
};

__device__ __forceinline__ int query_blocks(const Params &p) { return (p.seqlen_q + kBlockM - 1) / kBlockM; }

__device__ __forceinline__ void schedule_recips_write(const Params &p, ScheduleRecips *r) {
    const int m_blocks = query_blocks(p);
    r->outer = recip(p.reverse_m ? p.section * m_blocks : m_blocks);
    r->width = p.reverse_m ? recip(p.section) : 0u;
    r->heads = recip(p.heads_q);
    r->group = recip(p.group);
}

// What a role keeps of the schedule through its walk: m_blocks query blocks per (head, sequence)
// pair and n_work tiles (the reciprocals stay in shared memory). Built after the role's setmaxnreg: computed
// before the roles split, m_blocks was live across the producer's setmaxnreg.dec and ptxas
// spilled it, reloaded per tile.
struct TileSchedule {
    int m_blocks, n_work;
};

__device__ __forceinline__ TileSchedule tile_schedule(const Params &p) {
    const int m_blocks = query_blocks(p);
    return TileSchedule{m_blocks, m_blocks * p.heads_q * p.batch};
}

// tile_coords(p, tile, m_blocks, kBN) without a division: the same tile. A last causal section
// that the pairs do not fill divides the old way (its width's reciprocal, one more value to keep,
// cost the wide-tile ALiBi ramp kernel's consumer 8 bytes of spills).
__device__ __forceinline__ TileCoords tile_coords(const Params &p, int tile, const TileSchedule &ts,
                                                  const ScheduleRecips *recips, int kBN) {
    // An explicit shared load at a 32-bit address: through the generic pointer ptxas (13.0) spilled
    // 500+ bytes and serialized the mainloop's wgmma (C7512) at head dim 128. Volatile: never
    // moved above the CTA barrier that follows their writing.
    ScheduleRecips rc;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%3];\n\tld.shared.u32 %2, [%3+8];"
        : "=r"(rc.outer), "=r"(rc.width), "=r"(rc.heads)
        : "r"(cuda::smem_addr(recips)));
    int mblk, rest;
    if (p.reverse_m) {
        const int sec = divmod(tile, p.section * ts.m_blocks, rc.outer, rest);  // rest: the tile in it
        const int first = sec * p.section;  // first pair of the section
        const int width = min(p.section, p.heads_q * p.batch - first);
        int pair, u_q;
        if (width == p.section) {
            u_q = divmod(rest, width, rc.width, pair);
        } else {
            u_q = rest / width;
            pair = rest - u_q * width;
        }
        mblk = ts.m_blocks - 1 - u_q;
        rest = first + pair;
    } else {
        rest = divmod(tile, ts.m_blocks, rc.outer, mblk);
    }
    int head;
    const int b = divmod(rest, p.heads_q, rc.heads, head);
    return coords_of(p, mblk, head, b, kBN);
}

// The K/V head of query head `head` (GQA / MQA: head / group), without a division (the producer,
// once per tile).
__device__ __forceinline__ int kv_head(const Params &p, int head, const ScheduleRecips *recips) {
    uint32_t y;
    asm volatile("ld.shared.u32 %0, [%1+12];" : "=r"(y) : "r"(cuda::smem_addr(recips)));  // as tile_coords
    int rem;
    return divmod(head, p.group, y, rem);
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
