// FlashAttention-3 forward kernel for Hopper (sm_90a): TMA loads, wgmma, warp specialization.
// This file only composes the roles (fa3_producer, fa3_mainloop, fa3_epilogue) over the
// persistent schedule (fa3_tile_scheduler); a backward or FP8 kernel is expected to compose the
// same pieces in its own file like this one.
//
// A persistent CTA of 3 warpgroups walks (128-row query tile, query head, sequence) work tiles:
//   * warpgroup 0, the producer, gives up registers (setmaxnreg.dec) and one thread issues every
//     TMA load: the Q tile once, then K and V tiles from the last visible key tile down to the
//     first into two rings of kStages buffers, each buffer guarded by a "full" mbarrier (TMA
//     bytes landed) and an "empty" one (every consumer warp has finished reading it);
//   * warpgroups 1 and 2, the consumers, take the registers (setmaxnreg.inc) and own 64 query
//     rows each: the mainloop accumulates O and the softmax statistics, the epilogue stores O
//     (through its own shared-memory staging and a TMA store where the kernel has room for it,
//     fa3_epilogue.cuh) and LSE.
// The register split is sized for exactly these 3 warpgroups at one CTA per SM: 128 x 40 +
// 256 x 232 = 64512 of the 65536 registers. A kernel with another warpgroup count (or a second
// producer warp doing more than issue TMA) must redo it, as well as kConsumerWarps.
//
// Runtime features (no template flags): causal / sliding window (edge tiles masked, the others
// skipped), soft cap, GQA/MQA (kv head = head / group in the K/V coordinates), variable length
// (TMA rows offset by cu_seqlens; rows of the next sequence are masked or not stored), LSE.
// Serving (Params::gather): paged K/V caches of any page size and seqused_k, loaded by the whole
// producer warpgroup with cp.async (fa3_gather.cuh); the consumers do not know the difference.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_epilogue.cuh"
#include "backends/cuda/fa3/fa3_gather.cuh"
#include "backends/cuda/fa3/fa3_mainloop.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_producer.cuh"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// Consumer warpgroup `w` (0 or 1): query rows 64w..64w+63 of the tile. The thread's place in the
// wgmma m64 accumulator layout: warp `warp` holds rows 16 warp.., lane group g rows g and g + 8,
// quad lane t columns 2t, 2t + 1 of every n8 block.
template <class Tr, class E>
__device__ __forceinline__ void consume(const Params &p, const TileCoords &c, unsigned char *smem, Barriers *bars,
                                        int w, Pipe &pipe, const CUtensorMap *tm_o) {
    constexpr int kDV = Tr::kDV;  // O's columns: V's width
    const int tid = threadIdx.x - 128 * (w + 1);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int sq = c.seq.sq, sk = c.seq.sk;
    int qpos[2], rdiag[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        qpos[h] = c.m0 + 64 * w + 16 * warp + g + 8 * h;
        rdiag[h] = qpos[h] + cuda::diagonal_offset(p, sq, sk);
    }

    float O[kDV / 2];
#pragma unroll
    for (int i = 0; i < kDV / 2; ++i) O[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    const float sl2 = p.score_log2;

    // No visible key: O and row_sum stay 0, which the epilogue writes as O = 0, LSE = -inf (with a
    // sink: O = 0 and LSE = the sink, store_output).
    if (c.has_keys()) consumer_mainloop<Tr, E>(p, c, smem, bars, w, lane, t, rdiag, sl2, O, row_max, row_sum, pipe);
    if constexpr (Tr::kOStaged)
        store_output_staged<Tr, E>(p, c, O, row_max, row_sum, sl2, qpos, t, w, tid, smem, tm_o);
    else
        store_output<Tr, E>(p, c, O, row_max, row_sum, sl2, qpos, t);
}

// The schedule's reciprocals (Traits::kSchedOffset), as an offset from the aligned base every role
// keeps anyway: a pointer of their own would be one more value live through the mainloop.
template <class Tr>
__device__ __forceinline__ ScheduleRecips *sched_recips(unsigned char *smem) {
    return reinterpret_cast<ScheduleRecips *>(smem + Tr::kSchedOffset);
}

// A role's walk over the CTA's work tiles (nth_tile): f(c) per tile. Traits::kSchedRecips: the
// coordinates without a division (tile_coords on the schedule's reciprocals); else the dividing
// form.
template <class Tr, class F>
__device__ __forceinline__ void walk_tiles(const Params &p, unsigned char *smem, F &&f) {
    if constexpr (Tr::kSchedRecips) {
        const TileSchedule ts = tile_schedule(p);
        for (int r = 0, tile; (tile = nth_tile(r, ts.n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, ts, sched_recips<Tr>(smem), Tr::kBN);
            f(c);
        }
    } else {
        const int m_blocks = query_blocks(p);
        const int n_work = m_blocks * p.heads_q * p.batch;
        for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
            f(c);
        }
    }
}

// The tile's K/V head (the producer's), by the same rule.
template <class Tr>
__device__ __forceinline__ int tile_kv_head(const Params &p, const TileCoords &c, unsigned char *smem) {
    if constexpr (Tr::kSchedRecips)
        return kv_head(p, c.head, sched_recips<Tr>(smem));
    else
        return c.head / p.group;
}

template <class Tr, class E>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
               const __grid_constant__ Params p) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte alignment; the dynamic base is not guaranteed to have it.
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    Barriers *bars = reinterpret_cast<Barriers *>(smem + Tr::kBarOffset);

    if (threadIdx.x == 0) {
        // K/V "full": one TMA issuer, or every gathering producer thread (fa3_gather.cuh).
        const uint32_t kv_arrivals = p.gather ? kProducerThreads : 1;
        cuda::mbar_init(&bars->q_full, 1);
        cuda::mbar_init(&bars->q_empty, kConsumerWarps);
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            cuda::mbar_init(&bars->k_full[s], kv_arrivals);
            cuda::mbar_init(&bars->v_full[s], kv_arrivals);
            cuda::mbar_init(&bars->k_empty[s], kConsumerWarps);
            cuda::mbar_init(&bars->v_empty[s], kConsumerWarps);
        }
        cuda::fence_mbar_init();
        if (Tr::kSchedRecips) schedule_recips_write(p, sched_recips<Tr>(smem));
    }
    __syncthreads();

    // Persistent: each CTA takes every gridDim.x-th tile (nth_tile). Both roles walk the same list and skip
    // the same tiles (no query rows: nothing; no visible key: the consumers write O = 0 alone).
    // Each role sizes the list itself (walk_tiles); where Traits::kSchedRecips holds the divisors'
    // reciprocals are computed once per CTA, not per tile (schedule_recips_write).
    const int wg = threadIdx.x / 128;
    Pipe pipe;
    if (wg == 0) {
        cuda::setmaxnreg_dec<kProducerRegs>();
        // Paged caches / seqused_k: the whole warpgroup gathers K and V. Square kernels only: the
        // backend refuses a gathering plan with head_dim_v != head_dim (fa3_unsupported_reason).
        if (Tr::kDV == Tr::kD && p.gather) {
            if (threadIdx.x == 0) cuda::prefetch_tensormap(&tm_q);
            // The dividing tile_coords: the divisors' registers spilled this warpgroup at its 40
            // (ptxas 13.0, head dim 64: 8-16 bytes, reloaded per tile).
            const int m_blocks = query_blocks(p);
            const int n_work = m_blocks * p.heads_q * p.batch;
            for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
                const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
                if (c.has_keys()) produce_gather<Tr>(p, c, &tm_q, smem, bars, pipe, threadIdx.x);
            }
            return;
        }
        if (threadIdx.x != 0) return;
        cuda::prefetch_tensormap(&tm_q);
        cuda::prefetch_tensormap(&tm_k);
        cuda::prefetch_tensormap(&tm_v);
        if (Tr::kOStaged && p.o_tma) cuda::prefetch_tensormap(&tm_o);
        walk_tiles<Tr>(p, smem, [&](const TileCoords &c) {
            if (c.has_keys()) produce<Tr>(p, c, tile_kv_head<Tr>(p, c, smem), &tm_q, &tm_k, &tm_v, smem, bars, pipe);
        });
    } else {
        cuda::setmaxnreg_inc<kConsumerRegs>();
        if (Tr::kPingPong && wg == 2) pass_turn(1);  // warpgroup 0 (wg 1) issues first
        walk_tiles<Tr>(p, smem, [&](const TileCoords &c) {
            if (c.has_rows()) consume<Tr, E>(p, c, smem, bars, wg - 1, pipe, &tm_o);
        });
        if (Tr::kPingPong && wg == 1) take_turn(0);  // warpgroup 1's last pass
        // The last TMA store of O (store_output_tma) must have read its staging before the CTA's
        // shared memory goes away.
        if (Tr::kOStaged && threadIdx.x % 128 == 0) cuda::bulk_wait_all();
    }
}

}  // namespace fa3
}  // namespace flashattn
