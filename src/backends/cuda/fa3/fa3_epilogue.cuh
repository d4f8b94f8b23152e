// FA3 forward, epilogue: normalises a consumer thread's O accumulators by the softmax row sums,
// stores them to global memory as 16-bit pairs straight from the registers (no shared-memory
// staging), and writes the natural-log LSE.
//
// It also covers the tiles with query rows but no visible key (a causal/window tile past every
// key, an empty key sequence): the caller skips the mainloop, so O stays 0 and row_sum 0, and
// finish_rows turns that into O = 0 and LSE = -inf. Rows past the sequence end (the last query
// tile, varlen) are not stored. Reusable by any kernel whose accumulators are in the wgmma m64
// layout (each thread: rows qpos[0], qpos[1] = qpos[0] + 8, columns 8j + 2t, 8j + 2t + 1).
#pragma once

#include <cstdint>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/sink.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// Consumer thread's rows qpos[] of the tile: O / l as 16-bit pairs from the accumulators, and the
// LSE by the quad leader (t == 0; finish_rows leaves the reduced row sum in every lane of a quad).
template <class Tr, class E>
__device__ __forceinline__ void store_output(const Params &p, const TileCoords &c, const float (&O)[kWidthV<Tr> / 2],
                                             const float (&row_max)[2], const float (&row_sum)[2], float sl2,
                                             const int (&qpos)[2], int t) {
    constexpr int kD = kWidthV<Tr>;  // O's columns: V's width
    float inv[2], lse[2];
    cuda::finish_rows(row_max, row_sum, sl2, inv, lse);
    if (p.sink_logits != nullptr) {  // the head's sink joins both row halves (cuda::join_sink)
        const float sink = p.sink_logits[c.head];
        cuda::join_sink(sink, inv[0], lse[0]);
        cuda::join_sink(sink, inv[1], lse[1]);
    }
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

}  // namespace fa3
}  // namespace flashattn
