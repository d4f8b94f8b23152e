// FA2 epilogue: the outputs of a CTA's query rows, from the per-warp m16n8 accumulator
// fragments: the 16-bit O (staged through shared memory for 16-byte coalesced stores), the LSE,
// and the fp32 split-KV partials that fa2_merge.cu combines.
//
// Generation-generic in what they do: they take the accumulators, the row normalisers `inv` and
// the packed-row geometry (m0, prows, G, hbase), no main-loop state, and work for any KernelTraits.
// What ties them to the forward pass is only where they write: the output pointers and strides
// come from Params (o_rs / o_hs, lse, o_part / lse_part). A backward pass storing dQ, dK, dV the
// same way passes its own destination instead. store_o's shared-memory staging needs only that
// the warp's own rows of the staging tile be free (the forward pass reuses its Q tile: each warp
// only ever read its own Q rows).
#pragma once

#include <cstdint>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_combine.cuh"
#include "backends/cuda/fa2/fa2_fold.h"
#include "backends/cuda/fa2/fa2_params.h"
#include "backends/cuda/fa2/fa2_traits.cuh"

namespace flashattn {
namespace fa2 {

// The CTA's packed query rows: tile row m is packed row m0 + m (< prows); packed row r is query
// position and head unpack_row(r, G, hbase). Thread coordinates come from threadIdx (the compiler
// then knows their ranges).

// fn(mt, h, qpos, head) for each row this thread holds in the O fragments (rows g and g + 8 of
// each m16 tile of its warp) that lies inside the CTA's packed rows.
template <class Tr, class Fn>
__device__ __forceinline__ void for_each_own_row(int m0, int prows, int G, int hbase, Fn fn) {
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int prow = m0 + warp * Tr::kWarpRows + mt * 16 + h * 8 + g;
            if (prow >= prows) continue;
            int qpos, head;
            unpack_row(prow, G, hbase, qpos, head);
            fn(mt, h, qpos, head);
        }
}

// Split-KV: this split's fp32 partial O (normalised by its own sum) and LSE, for the merge kernel.
template <class Tr>
__device__ __forceinline__ void store_split_partials(const Params &p, const float (&O)[Tr::kMT][Tr::kDT][4],
                                                     const float (&inv)[Tr::kMT][2],
                                                     const float (&lse)[Tr::kMT][2], int m0, int prows,
                                                     int G, int hbase, int split, int64_t grow0) {
    const int t = threadIdx.x & 3;
    for_each_own_row<Tr>(m0, prows, G, hbase, [&](int mt, int h, int qpos, int head) {
        const int64_t r = (static_cast<int64_t>(split) * p.heads_q + head) * p.total_rows + grow0 + qpos;
        float *op = p.o_part + r * p.head_dim_v;
#pragma unroll
        for (int dt = 0; dt < Tr::kDT; ++dt) {
            const int col = dt * 8 + 2 * t;
            if (col < p.head_dim_v)
                *reinterpret_cast<float2 *>(op + col) =
                    make_float2(cuda::normalize_output(O[mt][dt][2 * h], inv[mt][h]),
                                cuda::normalize_output(O[mt][dt][2 * h + 1], inv[mt][h]));
        }
        if (t == 0) p.lse_part[r] = lse[mt][h];
    });
}

// One split's arrival at its word (fa2_fold.h): true for the last of p.num_splits.
__device__ __forceinline__ bool fold_arrive(unsigned long long *word, unsigned long long tag, int splits) {
    unsigned long long cur = *reinterpret_cast<volatile unsigned long long *>(word);
    for (;;) {
        const FoldStep step = fold_step(cur, tag, splits);
        const unsigned long long seen = atomicCAS(word, cur, step.next);
        if (seen == cur) return step.last;
        cur = seen;
    }
}

// Split-KV without the combine kernel (decode tiles, Params::fold_count set): after its partials,
// every split's CTA arrives at its word; the last one combines the CTA's rows, one warp per (row,
// head) as split_combine_warp_kernel does (same arithmetic: the output is bitwise the kernel's).
// The partials' stores reach the device scope before the arrival (CTA barrier, then thread 0's
// fence and atomic), and the last CTA reads them after its own atomic and fence (the pattern of
// a cooperative grid barrier); the verdict reaches the CTA through the barrier's OR (no static
// shared memory, which would sit before the 1024-byte aligned dynamic tiles). Every thread of the
// CTA must call this.
template <class Tr, class Out>
__device__ __forceinline__ void fold_split_combine(const Params &p, int b, int m0, int prows, int G, int hbase,
                                                   int64_t grow0) {
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
        __threadfence();
        const int64_t item = (static_cast<int64_t>(b) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        last = fold_arrive(p.fold_count + item, p.fold_tag, p.num_splits);
        __threadfence();
    }
    if (!__syncthreads_or(last)) return;
    const SplitCombineParams m = split_combine_params(p);
    const bool varlen = p.cu_q != nullptr;
    const int end = min(m0 + Tr::kBM, prows);
    for (int r = m0 + static_cast<int>(threadIdx.x >> 5); r < end; r += Tr::kThreads / 32) {
        int qpos, head;
        unpack_row(r, G, hbase, qpos, head);
        combine_row_by_warp<Out>(m, varlen ? 0 : b, varlen ? grow0 + qpos : qpos, head, threadIdx.x & 31);
    }
}

// The LSE of this warp's rows (one thread per row).
template <class Tr>
__device__ __forceinline__ void store_lse(const Params &p, const float (&lse)[Tr::kMT][2], int m0, int prows,
                                          int G, int hbase, int b, int64_t grow0) {
    if (p.lse == nullptr || (threadIdx.x & 3) != 0) return;
    for_each_own_row<Tr>(m0, prows, G, hbase, [&](int mt, int h, int qpos, int head) {
        p.lse[cuda::lse_offset(p, b, head, grow0, qpos)] = lse[mt][h];
    });
}

// O / l -> 16-bit, staged through this warp's own rows of the Q tile (only this warp ever read
// them), then 16-byte coalesced stores. `og` is O of this sequence (row 0, head 0).
template <class Tr, class E>
__device__ __forceinline__ void store_o(const Params &p, const float (&O)[Tr::kMT][Tr::kDT][4],
                                        const float (&inv)[Tr::kMT][2], uint32_t s_q, uint16_t *og, int m0,
                                        int prows, int G, int hbase) {
    using QT = typename Tr::QTile;
    constexpr int kWR = Tr::kWarpRows;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * kWR + mt * 16 + h * 8 + g;
#pragma unroll
            for (int dt = 0; dt < Tr::kDT; ++dt)
                cuda::st_shared_b32(s_q + QT::offset(r, dt) + 4 * t,
                                    cuda::pack2<E>(cuda::normalize_output(O[mt][dt][2 * h], inv[mt][h]),
                                                   cuda::normalize_output(O[mt][dt][2 * h + 1], inv[mt][h])));
        }
    __syncwarp();
    // Lane l stores 16-byte column chunk c = l % kCPRp of rows lr0, lr0 + kStep, ... of the warp's
    // rows: without pack-GQA its global address then just advances by a fixed stride (the
    // per-chunk index arithmetic this replaces was ~2% of a CTA's instructions at head dim 256,
    // seqlen 1024).
    constexpr int kCPR = Tr::kD / 8;
    constexpr int kCPRp = next_pow2(kCPR);
    static_assert(kCPRp <= 32, "one row of chunks per warp pass at most");
    constexpr int kStep = 32 / kCPRp;
    const int c = lane % kCPRp;
    const int lr0 = lane / kCPRp;
    if (!((kCPR == kCPRp || c < kCPR) && c * 8 < p.head_dim_v)) return;
    og += c * 8;
    const int prow0 = m0 + warp * kWR + lr0;
    if (G == 1) {
        uint16_t *dst = og + hbase * p.o_hs + static_cast<int64_t>(prow0) * p.o_rs;
        const int64_t step = p.o_rs * kStep;
#pragma unroll
        for (int j = 0; j < kWR / kStep; ++j) {
            if (prow0 + j * kStep < prows)
                cuda::st_global_v4(dst, cuda::ld_shared_v4(s_q + QT::offset(warp * kWR + lr0 + j * kStep, c)));
            dst += step;
        }
    } else {
#pragma unroll 1
        for (int j = 0; j < kWR / kStep; ++j) {
            const int prow = prow0 + j * kStep;
            if (prow >= prows) break;
            int qpos, head;
            unpack_row(prow, G, hbase, qpos, head);
            cuda::st_global_v4(og + qpos * p.o_rs + head * p.o_hs,
                               cuda::ld_shared_v4(s_q + QT::offset(warp * kWR + lr0 + j * kStep, c)));
        }
    }
}

}  // namespace fa2
}  // namespace flashattn
