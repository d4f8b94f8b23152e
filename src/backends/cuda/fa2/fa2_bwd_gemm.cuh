// FA2 backward: tile geometry (BwdTraits), the cp.async tile loader and the warp GEMMs of one
// query-block step, on mma.sync m16n8k16 fed by ldmatrix from the swizzled tiles of
// device/swizzle.cuh.
//
// Geometry: a CTA of kNW warps owns kB = 16*kNW keys and walks query blocks of kB rows. Two warp
// layouts meet in one step:
//   rows:  warp w holds query rows 16w..16w+15 of S = Q K^T and dP = dO V^T (gemm_qk of
//          fa2_gemm.cuh, contraction over the compiled head dim kD), and of dQ += dS K, whose A
//          operand is dS straight from those accumulators (two n8 C tiles = one k16 A fragment).
//   keys:  warp w holds keys 16w..16w+15 of dV += P^T dO and dK += dS^T Q (the contraction runs
//          over the query rows, which other warps computed: P and dS go through shared memory and
//          are read transposed with ldmatrix.trans).
// dK, dV, dQ are computed for one 64-column slice of the head dim (kBwdSliceCols = one column
// page of the tiles): the tiles are padded to whole pages (kDP) and zero-filled past the head dim,
// so a slice is a runtime page offset and every ldmatrix address is a lane base, one XOR and a
// constant (SwizzledTile::xor_term / const_term with the page index 0). Column groups of 16 past
// the runtime head dim are skipped (warp-uniform branch; registers stay statically indexed).
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"
#include "backends/cuda/fa2/fa2_gemm.cuh"
#include "backends/cuda/fa2/fa2_load.cuh"

namespace flashattn {
namespace fa2 {

template <int kD_, int kNW_>
struct BwdTraits {
    static constexpr int kD = kD_;  // compiled head dim: the contraction length of S and dP
    static constexpr int kNW = kNW_;
    static constexpr int kThreads = 32 * kNW;
    static constexpr int kB = bwd_block(kNW);  // keys per CTA = query rows per step
    static constexpr int kDP = bwd_padded_dim(kD);
    static constexpr int kSliceGroups = kBwdSliceCols / 16;  // 16-column groups of a slice
    // The names gemm_qk (fa2_gemm.cuh) reads: one m16 tile per warp, kB keys.
    static constexpr int kMT = 1;
    static constexpr int kNT = kB / 8;
    static constexpr int kKS = kD / 16;
    static constexpr int kKF = kB / 16;  // k16 fragments along the keys (dQ) or query rows (dK, dV)
    using QTile = cuda::SwizzledTile<kB, kDP>;  // Q, dO, K, V tiles
    using KVTile = QTile;
    using PTile = cuda::SwizzledTile<kB, kB>;  // P and dS, [query row][key]
    static constexpr int kTileBytes = QTile::kBytes;
    static constexpr int kPBytes = PTile::kBytes;
    static constexpr int kPRowBytes = kB * 2;  // PTile is one full (kB = 64) or half (kB = 32) page
    static constexpr int kSmemBytes = 4 * kTileBytes + 2 * kPBytes;
    static_assert(kB == 32 || kB == 64, "P/dS tiles are one page");
    static_assert(kSmemBytes == bwd_smem_bytes(kD, kNW), "fa2_bwd_params.h agrees");
    static_assert(kDP % kBwdSliceCols == 0 && QTile::kFullPages * 64 == kDP, "whole pages");
    static_assert(kTileBytes % 1024 == 0 && kPBytes % 128 == 0, "tile alignment");
};

// cp.async rows [0, kB) of a [rows x head_dim] tensor (row r at g + r*rs) into a [kB x kDP] tile;
// rows >= rows_valid and columns >= d are zero-filled (the GEMMs rely on the zeros).
template <class Tr>
__device__ __forceinline__ void bwd_load_tile(uint32_t sbase, const uint16_t *g, int64_t rs, int rows_valid,
                                              int d) {
    using T = typename Tr::QTile;
    constexpr int kCPR = Tr::kDP / 8;
    constexpr int kTotal = Tr::kB * kCPR;
    static_assert(kTotal % Tr::kThreads == 0, "whole passes");
    // opaque: the per-chunk offsets are recomputed per call, not hoisted out of the step loop
    // into registers the GEMMs need.
    const int tid = static_cast<int>(opaque(static_cast<uint32_t>(threadIdx.x)));
    rs = opaque(rs);
#pragma unroll
    for (int j = 0; j < kTotal / Tr::kThreads; ++j) {
        const int i = tid + j * Tr::kThreads;
        const int r = i / kCPR;
        const int c = i - r * kCPR;
        const bool ok = r < rows_valid && c * 8 < d;
        cuda::cp_async_16(sbase + T::offset(r, c), ok ? g + r * rs + c * 8 : g, ok ? 16u : 0u);
    }
}

// acc[j] (16 columns each of this slice) += A^T B for this warp's 16 keys: A is a [kB x kB] 16-bit
// tile [query row][key] in shared memory (P or dS), B a [kB x kDP] tile [query row][column] (dO or
// Q). a_lane: this lane's ldmatrix address of A^T (PTile row lr_k, chunk 2*warp + lb_k, see the
// kernel); b_lane: QTile::lane_base_full(B tile, lr_a, lb_a) + slice page offset. ncols: head-dim
// columns from the slice start (groups at or past it are skipped).
template <class Tr, class E>
__device__ __forceinline__ void gemm_at_b(float (&acc)[Tr::kSliceGroups][2][4], uint32_t a_lane, uint32_t b_lane,
                                          int ncols) {
    using BT = typename Tr::QTile;
#pragma unroll
    for (int ks = 0; ks < Tr::kKF; ++ks) {
        uint32_t a[4];
        // .trans of the stored [row][key] 8x8 blocks: registers (key g, rows 2t..2t+1) = A^T's
        // m16k16 fragment (matrices: rows 0-7 / keys 0-7, rows 0-7 / keys 8-15, rows 8-15 / ...).
        cuda::ldmatrix_x4_trans(a, a_lane + ks * 16 * Tr::kPRowBytes);
#pragma unroll
        for (int j = 0; j < Tr::kSliceGroups; ++j) {
            if (j * 16 >= ncols) continue;
            uint32_t b[4];
            cuda::ldmatrix_x4_trans(b, (b_lane ^ BT::xor_term(j)) + BT::const_term(ks * 16, j));
            cuda::mma_16816<E>(acc[j][0], a, b[0], b[1]);
            cuda::mma_16816<E>(acc[j][1], a, b[2], b[3]);
        }
    }
}

// acc = dS K for this warp's 16 query rows and columns 16j..16j+15 of the slice: dS holds the
// warp's rows as m16k16 A fragments over the kB keys; k_lane = QTile::lane_base_full(K tile, lr_a,
// lb_a) + slice page offset (K read transposed: B[k = key][n = column], as V in gemm_pv).
template <class Tr, class E>
__device__ __forceinline__ void gemm_ds_k(float (&acc)[2][4], const uint32_t (&dS)[Tr::kKF][4], uint32_t k_lane,
                                          int j) {
    using KT = typename Tr::QTile;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < Tr::kKF; ++ks) {
        uint32_t b[4];
        cuda::ldmatrix_x4_trans(b, (k_lane ^ KT::xor_term(j)) + KT::const_term(ks * 16, j));
        cuda::mma_16816<E>(acc[0], dS[ks], b[0], b[1]);
        cuda::mma_16816<E>(acc[1], dS[ks], b[2], b[3]);
    }
}

}  // namespace fa2
}  // namespace flashattn
