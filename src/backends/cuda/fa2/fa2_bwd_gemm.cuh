// FA2 backward: tile geometry (BwdTraits), the cp.async tile loader and the warp GEMMs of one
// query-block step, on mma.sync m16n8k16 fed by ldmatrix from the swizzled tiles of
// device/swizzle.cuh.
//
// Geometry: a CTA of kNW warps owns kBN keys over the whole (padded) head dim kDP and walks query
// blocks of kBM rows. Three warp layouts meet in one step, each a grid of warp tiles of
// one or two m16 tiles (BwdTile's smt / kvmt / qmt: a B fragment loaded once feeds each):
//   scores  S = Q K^T and dP = dO V^T (gemm_qk of fa2_gemm.cuh, contraction over the compiled head
//           dim kD): warp (row group, key group) holds 16 kSMT query rows x kSKeys keys;
//   keys    dV += P^T dO and dK += dS^T Q: warp (key group, column group) holds 16 kKVMT keys x kKVCols
//           columns in registers for the whole key block; P and dS come from shared memory,
//           read transposed with ldmatrix.trans (the contraction runs over query rows);
//   dQ      dQ += dS K: warp (row group, column group) holds 16 kQMT query rows x kQCols columns, 16
//           at a time, flushed to the fp32 accumulator (dS read from shared memory).
// Tiles are padded to whole 64-column pages and zero-filled past the head dim; column groups of 16
// past the runtime head dim are skipped (warp-uniform branch; registers stay statically indexed).
// A warp's column span is folded into its lane base (whole pages, or half a page by an XOR of
// chunk bit 2), so every ldmatrix address is a lane base, one XOR and a constant.
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"
#include "backends/cuda/fa2/fa2_gemm.cuh"
#include "backends/cuda/fa2/fa2_load.cuh"

namespace flashattn {
namespace fa2 {

template <int kD_, int kBM_, int kBN_, int kNW_, int kStages_, int kSMT_ = 1, int kKVMT_ = 1, int kQMT_ = 1>
struct BwdTraits {
    static constexpr int kD = kD_;  // compiled head dim: the contraction length of S and dP
    static constexpr int kBM = kBM_;  // query rows per step
    static constexpr int kBN = kBN_;  // keys per CTA
    static constexpr int kNW = kNW_;
    static constexpr int kStages = kStages_;  // Q/dO buffers
    static constexpr int kThreads = 32 * kNW;
    static constexpr BwdTile kTile{kBM_, kBN_, kNW_, kStages_, kSMT_, kKVMT_, kQMT_};
    static constexpr int kMinBlocks = bwd_min_blocks(kTile, kD_);  // per SM
    // Whether per-thread load and ldmatrix offsets may be computed once per CTA and kept in
    // registers over the step loop (else opaque() makes each step recompute them: the registers go
    // to the GEMMs, stops 21-23). bwd_hoist_offsets has the rule and the override.
    static constexpr bool kHoistOffsets = bwd_hoist_offsets(kTile, kD_);
    // Whether the LSE / row_dot cp.async source is a per-thread base kept over the step loop
    // (row_src, fa2_bwd_kernel.cuh).
    static constexpr bool kHoistRowSrc = bwd_hoist_row_src(kTile, kD_);
    static constexpr int kDP = bwd_padded_dim(kD);
    // scores layout: kSMT m16 tiles of query rows per warp
    static constexpr int kSMT = kSMT_;
    static constexpr int kSRowGroups = kBM / (16 * kSMT);
    static constexpr int kSKeyGroups = kNW / kSRowGroups;
    static constexpr int kSKeys = kBN / kSKeyGroups;
    // keys layout (dK, dV): kKVMT m16 tiles of keys per warp
    static constexpr int kKVMT = kKVMT_;
    static constexpr int kKVKeyGroups = kBN / (16 * kKVMT);
    static constexpr int kKVColGroups = kNW / kKVKeyGroups;
    static constexpr int kKVCols = kDP / kKVColGroups;
    static constexpr int kKVGroups = kKVCols / 16;
    // dQ layout: kQMT m16 tiles of query rows per warp
    static constexpr int kQMT = kQMT_;
    static constexpr int kQRowGroups = kBM / (16 * kQMT);
    static constexpr int kQColGroups = kNW / kQRowGroups;
    static constexpr int kQCols = kDP / kQColGroups;
    static constexpr int kQGroups = kQCols / 16;
    // The names gemm_qk (fa2_gemm.cuh) reads: kSMT m16 tiles per warp, kSKeys keys.
    static constexpr int kMT = kSMT;
    static constexpr int kNT = kSKeys / 8;
    static constexpr int kKS = kD / 16;
    using QTile = cuda::SwizzledTile<kBM, kDP>;   // Q, dO
    using KVTile = cuda::SwizzledTile<kBN, kDP>;  // K, V
    using PTile = cuda::SwizzledTile<kBM, kBN>;   // P and dS, [query row][key]
    static constexpr int kPRowBytes = PTile::kFullPages > 0 ? 128 : 64;  // row pitch inside a page
    static constexpr int kKVBytes = KVTile::kBytes;
    static constexpr int kQBytes = QTile::kBytes;
    static constexpr int kPBytes = PTile::kBytes;
    static constexpr int kRowsBytes = 2 * kBM * 4;  // one step's LSE and row_dot
    // Shared memory: K, V, then kStages x (Q, dO), then P, dS, then kStages x (LSE, row_dot).
    static constexpr int kQOffset = 2 * kKVBytes;
    static constexpr int kPOffset = kQOffset + 2 * kStages * kQBytes;
    static constexpr int kRowsOffset = kPOffset + 2 * kPBytes;
    static constexpr int kSmemBytes = kRowsOffset + kStages * kRowsBytes;
    static_assert(kSmemBytes == bwd_smem_bytes(kTile, kD), "fa2_bwd_params.h agrees");
    static_assert(kBM % (16 * kSMT) == 0 && kBN % (16 * kKVMT) == 0 && kBM % (16 * kQMT) == 0, "whole m16 tiles");
    static_assert(kNW % kSRowGroups == 0 && kSKeys % 16 == 0, "scores layout");
    static_assert(kNW % kKVKeyGroups == 0 && kKVCols % 32 == 0, "keys layout");
    static_assert(kNW % kQRowGroups == 0 && kQCols % 32 == 0, "dQ layout");
    // at_column moves a lane base by whole pages and half a page: a warp's column span must not
    // start half a page in and then cross a page (a 96-column span of a padded 192 did).
    static_assert((kKVCols % 64 == 0 || 64 % kKVCols == 0) && (kQCols % 64 == 0 || 64 % kQCols == 0),
                  "a warp's column span starts half a page in and crosses a page (at_column)");
    static_assert(kBN == 32 || kBN % 64 == 0, "P/dS rows are half a page or whole pages");
    static_assert(kKVBytes % 1024 == 0 && kQBytes % 1024 == 0 && kPBytes % 128 == 0, "tile alignment");
    static_assert(kStages == 1 || kStages == 2, "one or two Q/dO buffers");
};

// ldmatrix address of chunk pair kc (16 columns from 16*kc) at rows row0.. of tile T from a lane's
// full-page / half-page bases (row0 and kc compile-time after unrolling).
template <class T>
__device__ __forceinline__ uint32_t frag_addr(uint32_t lane_full, uint32_t lane_half, int row0, int kc) {
    return T::in_full_page(kc) ? (lane_full ^ T::xor_term(kc)) + T::const_term(row0, kc)
                               : (lane_half ^ T::xor_term(kc)) + T::const_term(row0, kc);
}

// A full-page lane base moved to logical column col0 (a multiple of 32): whole pages are added,
// half a page is chunk bit 2, which the lane's chunk bits (< 4 within a 32-column span) never carry
// into, so an XOR places it.
template <class T>
__device__ __forceinline__ uint32_t at_column(uint32_t lane_full, int col0) {
    return (lane_full + static_cast<uint32_t>(col0 >> 6) * T::kPageBytes) ^ (static_cast<uint32_t>(col0 & 32) << 1);
}

// cp.async rows [0, kRows) of a [rows x head_dim] tensor (row r at g + r*rs) into a [kRows x kDP]
// tile; rows >= rows_valid and columns >= d are zero-filled (the GEMMs rely on the zeros).
// Thread tid owns chunk column c = tid % kCPR of rows tid / kCPR + j * kRowStep: its shared and
// global offsets are computed once, and each pass adds a constant (where kRowStep is a multiple of
// 8, so the swizzle's XOR stays: every tile of 256 threads) and a row step.
// Until stop 22 every chunk's row, column and swizzled offset were rederived from a signed index
// (~35 integer instructions per 16-byte chunk, ~300 per step at d128).
template <class Tr, int kRows>
__device__ __forceinline__ void bwd_load_tile(uint32_t sbase, const uint16_t *g, int64_t rs, int rows_valid,
                                              int d) {
    using T = cuda::SwizzledTile<kRows, Tr::kDP>;
    constexpr int kCPR = Tr::kDP / 8;
    constexpr int kRowStep = Tr::kThreads / kCPR;
    static_assert(Tr::kThreads % kCPR == 0 && kRows % kRowStep == 0, "whole passes");
    // opaque (unless kHoistOffsets): the offsets are recomputed per call, not hoisted out of the
    // step loop into registers the GEMMs need.
    const uint32_t tid = opaque_if<!Tr::kHoistOffsets>(static_cast<uint32_t>(threadIdx.x));
    rs = opaque_if<!Tr::kHoistOffsets>(rs);
    const int r0 = static_cast<int>(tid / kCPR), c = static_cast<int>(tid % kCPR);
    const bool col_ok = c * 8 < d;
    const uint16_t *gr = g + r0 * rs + c * 8;
    const int64_t step = kRowStep * rs;
    // Where kRowStep is a multiple of 8 (the swizzle term of a row is its index mod 8), pass j's
    // destination is pass 0's plus j * kRowStep rows, an immediate: ptxas did not see
    // (r0 + j * kRowStep) & 7 == r0 & 7 through the XOR and rebuilt each pass's offset (~4
    // integer instructions). (The 4-warp fallback at head dim 256 steps 4 rows.)
    const uint32_t s0 = sbase + T::offset(r0, c);
#pragma unroll
    for (int j = 0; j < kRows / kRowStep; ++j, gr += step) {
        const int r = r0 + j * kRowStep;
        const bool ok = col_ok && r < rows_valid;
        const uint32_t dst =
            kRowStep % 8 == 0 && !T::kHalfPage ? s0 + j * kRowStep * 128 : sbase + T::offset(r, c);
        // Out-of-range chunks copy 0 bytes from the running pointer (nothing is read, as in
        // load_tile): clamping it to g cost two SEL per 16-byte chunk (16 per step at d64).
        cuda::cp_async_16(dst, gr, ok ? 16u : 0u);
    }
}

// acc[mt][j] (16 columns each) += A^T B for this warp's kKVMT m16 tiles of keys: A is the
// [kBM x kBN] tile [query row][key] (P or dS), B a [kBM x kDP] tile [query row][column] (dO or Q);
// each B fragment feeds every key tile.
// a_lane[mt]: PTile::offset(lr_k, 2 * (key group * kKVMT + mt) + lb_k) from the tile base
// (ldmatrix.trans of B-style lanes gives A^T's m16k16 fragment); b_lane: at_column(QTile::
// lane_base_full(B tile, lr_a, lb_a), warp's first column). ncols: head-dim columns from the
// warp's first column.
// Fragments are double-buffered: the (ks, j) steps run flat and each step loads the next step's
// B (and, at a k-step's last column group, the next k-step's A) before issuing its own mma, so no
// HMMA waits on the ldmatrix issued right before it (stop 21's ncu: short_sb 26 %).
// after_step(ks): as gemm_qk's (fa2_gemm.cuh), called after k-step ks's mma.
template <class Tr, class E, class StepWork = NoStepWork>
__device__ __forceinline__ void gemm_at_b(float (&acc)[Tr::kKVMT][Tr::kKVGroups][2][4],
                                          const uint32_t (&a_lane)[Tr::kKVMT], uint32_t b_lane, int ncols,
                                          StepWork after_step = {}) {
    using BT = typename Tr::QTile;
    constexpr int kKS = Tr::kBM / 16, kG = Tr::kKVGroups;
    uint32_t a[2][Tr::kKVMT][4], b[2][4];
    auto load_a = [&](uint32_t(&dst)[Tr::kKVMT][4], int ks) {
#pragma unroll
        for (int mt = 0; mt < Tr::kKVMT; ++mt)
            cuda::ldmatrix_x4_trans(dst[mt], a_lane[mt] + ks * 16 * Tr::kPRowBytes);
    };
    // Unconditional: column groups past ncols lie inside the zero-filled padded tile, and a
    // branch around each prefetch cost a BSSY/WARPSYNC pair per ldmatrix.
    auto load_b = [&](uint32_t(&dst)[4], int ks, int j) {
        cuda::ldmatrix_x4_trans(dst, frag_addr<BT>(b_lane, 0u, ks * 16, j));
    };
    load_a(a[0], 0);
    load_b(b[0], 0, 0);
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
        for (int j = 0; j < kG; ++j) {
            const int t = ks * kG + j;
            if (j + 1 < kG) {
                load_b(b[(t + 1) & 1], ks, j + 1);
            } else if (ks + 1 < kKS) {
                load_a(a[(ks + 1) & 1], ks + 1);
                load_b(b[(t + 1) & 1], ks + 1, 0);
            }
            if (j * 16 >= ncols) continue;
#pragma unroll
            for (int mt = 0; mt < Tr::kKVMT; ++mt) {
                cuda::mma_16816<E>(acc[mt][j][0], a[ks & 1][mt], b[t & 1][0], b[t & 1][1]);
                cuda::mma_16816<E>(acc[mt][j][1], a[ks & 1][mt], b[t & 1][2], b[t & 1][3]);
            }
        }
        after_step(ks);
    }
}

// This warp's dS rows (kQMT m16 tiles of query rows x kBN keys) as m16k16 A fragments, from the
// dS tile. ds_full / ds_half: PTile lane bases (lr_a, lb_a) of the warp's first row.
template <class Tr>
__device__ __forceinline__ void load_ds_rows(uint32_t (&a)[Tr::kQMT][Tr::kBN / 16][4], uint32_t ds_full,
                                             uint32_t ds_half) {
    using PT = typename Tr::PTile;
#pragma unroll
    for (int mt = 0; mt < Tr::kQMT; ++mt)
#pragma unroll
        for (int ks = 0; ks < Tr::kBN / 16; ++ks)
            cuda::ldmatrix_x4(a[mt][ks], frag_addr<PT>(ds_full, ds_half, mt * 16, ks));
}

// acc = dS K for this warp's kQMT m16 tiles of query rows and its 16-column group j: k_lane =
// at_column(KVTile::lane_base_full(K tile, lr_a, lb_a), warp's first column) (K read transposed:
// B[k = key][n = column], as V in gemm_pv; each K fragment feeds every row tile).
template <class Tr, class E>
__device__ __forceinline__ void gemm_ds_k(float (&acc)[Tr::kQMT][2][4], const uint32_t (&dS)[Tr::kQMT][Tr::kBN / 16][4],
                                          uint32_t k_lane, int j) {
    using KT = typename Tr::KVTile;
#pragma unroll
    for (int mt = 0; mt < Tr::kQMT; ++mt)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < Tr::kBN / 16; ++ks) {
        uint32_t b[4];
        cuda::ldmatrix_x4_trans(b, frag_addr<KT>(k_lane, 0u, ks * 16, j));
#pragma unroll
        for (int mt = 0; mt < Tr::kQMT; ++mt) {
            cuda::mma_16816<E>(acc[mt][0], dS[mt][ks], b[0], b[1]);
            cuda::mma_16816<E>(acc[mt][1], dS[mt][ks], b[2], b[3]);
        }
    }
}

// Whether the dQ GEMM runs k-step outer (gemm_ds_k_span): its accumulators for the whole column
// span take no more registers than the dS rows that the column-group-outer form keeps live, and
// the head dim is one where it measured a gain. Stop 24 shipped it for head dims <= 128: d64
// +6-8 %, d128 -0.5 % (stop 24's changes were measured together; this form is the one specific
// to head dims <= 128). Head dims 65..128 (the 64 x 128 tile) take the column-group-outer form
// again until an A/B says otherwise; -DFLASHATTN_FA2_BWD_DQ_SPAN_D128=1 restores stop 24's choice.
#ifndef FLASHATTN_FA2_BWD_DQ_SPAN_D128
#define FLASHATTN_FA2_BWD_DQ_SPAN_D128 0
#endif
template <class Tr>
constexpr bool dq_span_fits() {  // the span's accumulators: no more registers than the dS rows
    return Tr::kQGroups * Tr::kQMT * 8 <= Tr::kQMT * (Tr::kBN / 16) * 4;
}
template <class Tr>
constexpr bool dq_span_outer() {
    return dq_span_fits<Tr>() && (Tr::kD <= 64 || FLASHATTN_FA2_BWD_DQ_SPAN_D128 != 0);
}

// acc[j] = dS K over this warp's whole column span, k-step outer: each k-step loads its kQMT dS
// fragments and kQGroups K fragments, the next k-step's before its own mma (double buffer, as
// gemm_at_b), so no HMMA waits on the ldmatrix just before it. Per accumulator the k-steps add in
// the same ascending order as gemm_ds_k (bitwise the same dQ). Where dq_span_outer holds (head
// dim <= 128: 32 accumulator registers against 64 of dS rows) it frees the registers that
// gemm_ds_k's double buffer lacked (stop 23: it spilled at d128). ncols (warp_uniform): head-dim
// columns from the warp's first column; the mma of groups past it are skipped (predicated, their
// fragments still load from the zero padding, as in gemm_at_b).
template <class Tr, class E>
__device__ __forceinline__ void gemm_ds_k_span(float (&acc)[Tr::kQGroups][Tr::kQMT][2][4], uint32_t ds_full,
                                               uint32_t ds_half, uint32_t k_lane, int ncols) {
    using PT = typename Tr::PTile;
    using KT = typename Tr::KVTile;
    constexpr int kKS = Tr::kBN / 16, kG = Tr::kQGroups;
#pragma unroll
    for (int j = 0; j < kG; ++j)
#pragma unroll
        for (int mt = 0; mt < Tr::kQMT; ++mt)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[j][mt][n][e] = 0.f;
    uint32_t a[2][Tr::kQMT][4], b[2][kG][4];
    auto load = [&](int buf, int ks) {
#pragma unroll
        for (int mt = 0; mt < Tr::kQMT; ++mt)
            cuda::ldmatrix_x4(a[buf][mt], frag_addr<PT>(ds_full, ds_half, mt * 16, ks));
#pragma unroll
        for (int j = 0; j < kG; ++j) cuda::ldmatrix_x4_trans(b[buf][j], frag_addr<KT>(k_lane, 0u, ks * 16, j));
    };
    load(0, 0);
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
        if (ks + 1 < kKS) load((ks + 1) & 1, ks + 1);
#pragma unroll
        for (int j = 0; j < kG; ++j) {
            if (j * 16 >= ncols) continue;
#pragma unroll
            for (int mt = 0; mt < Tr::kQMT; ++mt) {
                cuda::mma_16816<E>(acc[j][mt][0], a[ks & 1][mt], b[ks & 1][j][0], b[ks & 1][j][1]);
                cuda::mma_16816<E>(acc[j][mt][1], a[ks & 1][mt], b[ks & 1][j][2], b[ks & 1][j][3]);
            }
        }
    }
}

}  // namespace fa2
}  // namespace flashattn
