// FA3 forward, epilogue: normalises a consumer thread's O accumulators by the softmax row sums,
// stores them to global memory, and writes the natural-log LSE. Two forms of the O store:
//   * store_output: 16-bit pairs straight from the registers (4-byte stores, a warp's touching 8
//     rows x 16 bytes), predicated on the real rows and columns. Any kernel, any tile.
//   * store_output_staged (kernels with Traits::kOStaged): the warpgroup's 64 rows into its own
//     shared-memory staging (stmatrix into 128-byte swizzled pages), then one TMA store per
//     64-column page, issued by the warpgroup's first thread. The store runs on while the
//     warpgroup starts its next tile; the staging is written again only after that store has
//     read it (bulk_wait_read_all, next epilogue). TMA needs an O map from the host
//     (Params::o_tma) and clips a box only at the tensor's extent, which for a packed varlen
//     batch is the last sequence's end: a varlen block that crosses its sequence's end (or a
//     plan without the map) is copied out of the staging by the warpgroup's threads instead.
//
// Both cover the tiles with query rows but no visible key (a causal/window tile past every
// key, an empty key sequence): the caller skips the mainloop, so O stays 0 and row_sum 0, and
// finish_rows turns that into O = 0 and LSE = -inf. Rows past the sequence end (the last query
// tile, varlen) are not stored. store_output is reusable by any kernel whose accumulators are in
// the wgmma m64 layout (each thread: rows qpos[0], qpos[1] = qpos[0] + 8, columns 8j + 2t,
// 8j + 2t + 1).
#pragma once

#include <cstdint>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/device/sink.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// The thread's two rows' 1/l and LSE (finish_rows leaves the reduced row sum in every lane of a
// quad), the head's sink joined to both (cuda::join_sink).
__device__ __forceinline__ void output_scale(const Params &p, const TileCoords &c, const float (&row_max)[2],
                                             const float (&row_sum)[2], float sl2, float (&inv)[2], float (&lse)[2]) {
    cuda::finish_rows(row_max, row_sum, sl2, inv, lse);
    if (p.sink_logits != nullptr) {
        const float sink = p.sink_logits[c.head];
        cuda::join_sink(sink, inv[0], lse[0]);
        cuda::join_sink(sink, inv[1], lse[1]);
    }
}

// Consumer thread's rows qpos[] of the tile: O / l as 16-bit pairs from the accumulators, and the
// LSE by the quad leader (t == 0).
template <class Tr, class E>
__device__ __forceinline__ void store_output(const Params &p, const TileCoords &c, const float (&O)[kWidthV<Tr> / 2],
                                             const float (&row_max)[2], const float (&row_sum)[2], float sl2,
                                             const int (&qpos)[2], int t) {
    constexpr int kD = kWidthV<Tr>;  // O's columns: V's width
    float inv[2], lse[2];
    output_scale(p, c, row_max, row_sum, sl2, inv, lse);
    const bool varlen = p.cu_q != nullptr;
    const int64_t ooff = varlen ? c.seq.q_row0 * p.o_rs : static_cast<int64_t>(c.b) * p.o_bs;
    uint16_t *og = static_cast<uint16_t *>(p.o) + ooff + static_cast<int64_t>(c.head) * p.o_hs;
    const int d = p.head_dim_v;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (qpos[h] >= c.seq.sq) continue;
        uint16_t *row = og + static_cast<int64_t>(qpos[h]) * p.o_rs;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
            const int col = 8 * j + 2 * t;
            if (col < d)  // the padded columns past the real head dim are never stored
                *reinterpret_cast<uint32_t *>(row + col) =
                    cuda::pack2<E>(cuda::normalize_output(O[4 * j + 2 * h], inv[h]),
                                   cuda::normalize_output(O[4 * j + 2 * h + 1], inv[h]));
        }
        if (p.lse != nullptr && t == 0) {
            p.lse[cuda::lse_offset(p, c.b, c.head, c.seq.q_row0, qpos[h])] = lse[h];
        }
    }
}

// Whether consumer warpgroup `w` writes its staged O rows with a TMA store (see the top): a
// host-made O map, rows of the sequence, and a varlen block wholly inside its sequence.
__device__ __forceinline__ bool o_by_tma(const Params &p, const TileCoords &c, int w) {
    const int r0 = c.m0 + 64 * w;
    return p.o_tma != 0 && r0 < c.seq.sq && (p.cu_q == nullptr || r0 + 64 <= c.seq.sq);
}

// Named barrier of consumer warpgroup w's 128 threads around its O staging (ids 1 and 2 are the
// ping-pong turns, fa3_mainloop.cuh).
__device__ __forceinline__ void o_stage_sync(int w) { cuda::named_barrier_sync(3 + w, 128); }

// Byte offset of row r's 16-byte chunk k (columns 8k..8k+7) in a warpgroup's O staging: page k / 8,
// then the SW128 pattern of O's tensor map (chunk k % 8 of the row's 128 bytes at (k % 8) ^ (r % 8)),
// so the 8 rows of one stmatrix matrix land in 8 different bank groups.
template <class Tr>
__device__ __forceinline__ uint32_t o_stage_offset(int r, int k) {
    return (k >> 3) * Tr::kOPage + r * 128 + (((k & 7) ^ (r & 7)) << 4);
}

// The fallback writer of a staged block (o_by_tma false: a varlen block crossing its sequence's
// end, or no O map): the warpgroup's threads copy 16-byte chunks, consecutive threads along a row,
// only the rows of the sequence and the columns of head_dim_v (a multiple of 8).
template <class Tr>
__device__ __forceinline__ void copy_out_staged(const Params &p, const TileCoords &c, int w, int tid,
                                                const unsigned char *stage) {
    constexpr int kChunks = Tr::kDV / 8;  // 16-byte chunks per row
    const int r0 = c.m0 + 64 * w;
    const int rows = c.seq.sq - r0;  // the block's rows of the sequence (may be <= 0)
    const bool varlen = p.cu_q != nullptr;
    const int64_t ooff = varlen ? c.seq.q_row0 * p.o_rs : static_cast<int64_t>(c.b) * p.o_bs;
    uint16_t *og = static_cast<uint16_t *>(p.o) + ooff + static_cast<int64_t>(c.head) * p.o_hs +
                   static_cast<int64_t>(r0) * p.o_rs;
#pragma unroll 1
    for (int i = 0; i < 64 * kChunks / 128; ++i) {
        const int q = tid + 128 * i, r = q / kChunks, k = q % kChunks;
        if (r < rows && 8 * k < p.head_dim_v)
            *reinterpret_cast<uint4 *>(og + static_cast<int64_t>(r) * p.o_rs + 8 * k) =
                *reinterpret_cast<const uint4 *>(stage + o_stage_offset<Tr>(r, k));
    }
}

// Consumer warpgroup w's 64 rows of O / l through its staging (Traits::kOOffset + w kOWgBytes):
// stmatrix from the accumulators, then one TMA store per page by the warpgroup's first thread
// (o_by_tma), or copy_out_staged. The LSE as store_output writes it. `tid`: the thread in the
// warpgroup. One path for every tile: with the register store kept as the other branch, ptxas
// (13.0) serialized the mainloop's wgmma (C7512) and spilled 552 bytes at head dim 128.
template <class Tr, class E>
__device__ __forceinline__ void store_output_staged(const Params &p, const TileCoords &c,
                                                    const float (&O)[Tr::kDV / 2], const float (&row_max)[2],
                                                    const float (&row_sum)[2], float sl2, const int (&qpos)[2], int t,
                                                    int w, int tid, unsigned char *smem, const CUtensorMap *tm_o) {
    constexpr int kDV = Tr::kDV;
    float inv[2], lse[2];
    output_scale(p, c, row_max, row_sum, sl2, inv, lse);
    unsigned char *stage = smem + Tr::kOOffset + w * Tr::kOWgBytes;
    const uint32_t stage_s = cuda::smem_addr(stage);
    if (tid == 0) cuda::bulk_wait_read_all();  // the previous tile's TMA store has read the staging
    o_stage_sync(w);                           // ... and every thread's copy_out_staged too
    // One stmatrix.x4 per two n8 blocks j, j+1: matrices (row half 0, j), (1, j), (0, j+1), (1, j+1);
    // lane 8i + r gives row r of matrix i: warpgroup row 16 warp + 8 (i & 1) + r, chunk j + (i >> 1).
    const int lane = tid & 31, i = lane >> 3, r = lane & 7;
    const int row = 16 * (tid >> 5) + 8 * (i & 1) + r;
#pragma unroll
    for (int j = 0; j < kDV / 8; j += 2) {
        uint32_t v[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            const int jj = j + (m >> 1), h = m & 1;
            v[m] = cuda::pack2<E>(cuda::normalize_output(O[4 * jj + 2 * h], inv[h]),
                                  cuda::normalize_output(O[4 * jj + 2 * h + 1], inv[h]));
        }
        cuda::stmatrix_x4(v, stage_s + o_stage_offset<Tr>(row, j + (i >> 1)));
    }
    cuda::fence_proxy_async_smem();  // the stmatrix writes, before a TMA store reads them
    o_stage_sync(w);
    if (o_by_tma(p, c, w)) {
        if (tid == 0) {
            const int32_t qrow = q_row_coord(p, c) + 64 * w, b = batch_coord(p, c);
#pragma unroll
            for (int pg = 0; pg < Tr::kVPages; ++pg)
                if (64 * pg < p.head_dim_v)
                    cuda::tma_store_4d_s(tm_o, stage_s + pg * Tr::kOPage, 64 * pg, qrow, c.head, b);
            cuda::bulk_commit();
        }
    } else {
        copy_out_staged<Tr>(p, c, w, tid, stage);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
        if (p.lse != nullptr && t == 0 && qpos[h] < c.seq.sq)
            p.lse[cuda::lse_offset(p, c.b, c.head, c.seq.q_row0, qpos[h])] = lse[h];
}

}  // namespace fa3
}  // namespace flashattn
