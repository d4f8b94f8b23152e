// FA3 forward, producer: the one thread of warpgroup 0 that issues every TMA load of a work tile
// (Q once, then K and V in TileCoords::key_tile order: the window's tiles from the last down, then
// the sink tokens' tiles) into the Q buffer and
// the K/V rings of fa3_traits.cuh.
//
// Reusable by a backward or FP8 kernel with the same shared-memory layout (Traits) and the same
// consumption order: the consumers must take the key tiles in the order produced, release each
// "empty" barrier once per consumer warp (kConsumerWarps), and release the Q buffer after their
// last GEMM reading it. Out-of-bounds TMA boxes are zero-filled and still count their full bytes.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// One [rows x kD] tile as kPages TMA boxes of Tr::kPageCols columns (one 128-byte swizzle page
// each: 64 16-bit or 128 FP8 columns), all signalling
// `bar`; `page_bytes` apart in shared memory.
template <class Tr>
__device__ __forceinline__ void tma_tile(unsigned char *dst, int page_bytes, const CUtensorMap *tm, uint64_t *bar,
                                         int32_t row, int32_t head, int32_t batch) {
#pragma unroll
    for (int pg = 0; pg < Tr::kPages; ++pg) cuda::tma_load_4d(dst + pg * page_bytes, tm, bar, Tr::kPageCols * pg, row, head, batch);
}

// Producer: one thread. Per tile the first K tile goes out before the wait for the Q buffer
// (the consumers release it only after their last GEMM of the previous tile), then Q, then V and
// the remaining K/V tiles, each into its ring once the consumers have released the buffer (the
// first kStages waits pass at once: parity rule). kvh: the tile's K/V head (kv_head).
template <class Tr>
__device__ __forceinline__ void produce(const Params &p, const TileCoords &c, int kvh, const CUtensorMap *tm_q,
                                        const CUtensorMap *tm_k, const CUtensorMap *tm_v, unsigned char *smem,
                                        Barriers *bars, Pipe &pipe) {
    const int32_t bq = batch_coord(p, c);
    const int n_tiles = c.n_tiles();
    for (int j = 0; j < n_tiles; ++j) {
        const int i = pipe.kv + j, nb = c.key_tile(j);
        const int st = stage_of(i);
        const uint32_t ph = phase_of(i);
        const int32_t krow = kv_row_coord(p, c, nb, Tr::kBN);
        // Out-of-bounds rows and columns arrive as zeros and still count: expect whole boxes.
        unsigned char *k_dst = smem + Tr::kKOffset + st * Tr::kKVBytes;
        cuda::mbar_wait(&bars->k_empty[st], ph ^ 1u);
        cuda::mbar_arrive_expect_tx(&bars->k_full[st], Tr::kKVBytes);
        tma_tile<Tr>(k_dst, Tr::kKVPage, tm_k, &bars->k_full[st], krow, kvh, bq);
        if (j == 0) {
            cuda::mbar_wait(&bars->q_empty, static_cast<uint32_t>(pipe.q & 1) ^ 1u);
            cuda::mbar_arrive_expect_tx(&bars->q_full, Tr::kQBytes);
            const int32_t qrow = q_row_coord(p, c);
            tma_tile<Tr>(smem, Tr::kQPage, tm_q, &bars->q_full, qrow, c.head, bq);
        }
        using V = VSide<Tr>;  // V's own width where the traits have one (kDV)
        unsigned char *v_dst = smem + Tr::kVOffset + st * V::kVBytes;
        cuda::mbar_wait(&bars->v_empty[st], ph ^ 1u);
        cuda::mbar_arrive_expect_tx(&bars->v_full[st], V::kVBytes);
        tma_tile<V>(v_dst, Tr::kKVPage, tm_v, &bars->v_full[st], krow, kvh, bq);
    }
    pipe.kv += n_tiles;
    pipe.q += 1;
}

}  // namespace fa3
}  // namespace flashattn
