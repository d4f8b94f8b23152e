// FA2 global -> shared memory loaders (cp.async, 16-byte chunks, zero-filled outside the tensor)
// into the swizzled tile layout of device/swizzle.cuh, which the ldmatrix reads of fa2_gemm.cuh
// expect.
//
// Generation-generic: nothing here knows about the forward pass. load_tile copies any [kRows x
// kD] row block of a [rows x head_dim] tensor with a row stride (K, V, Q without pack-GQA; in a
// backward pass also dO, or Q/K/V tiles walked in the other direction); load_q adds the pack-GQA
// row mapping. Callers commit the cp.async groups themselves (cuda::cp_async_commit), since the
// group structure is part of each kernel's pipeline (fa2_mainloop.cuh for the forward pass).
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa2/fa2_traits.cuh"

namespace flashattn {
namespace fa2 {

// Hide a value from loop-invariant code motion: address arithmetic of the per-tile loads is then
// redone each iteration (a few integer ops) instead of being hoisted into registers that the main
// loop cannot spare.
__device__ __forceinline__ int64_t opaque(int64_t v) {
    asm volatile("" : "+l"(v));
    return v;
}
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
    asm volatile("" : "+r"(v));
    return v;
}
// opaque(v) where kHide, else v: a kernel with registers to spare lets the offsets be computed
// once and hoisted (the FA2 backward at head dim <= 64, BwdTraits::kHoistOffsets).
template <bool kHide, class T>
__device__ __forceinline__ T opaque_if(T v) {
    if constexpr (kHide) return opaque(v);
    return v;
}

// cp.async a [kRows x kD] tile whose row r starts at g + (row0 + r)*rs (rows >= rows_valid and
// columns >= d are zero-filled). Thread tid owns column chunk c = tid % kCPRp (the chunks per row
// rounded up to a power of two; threads with c >= kD/8 idle) and rows r0 + j*kRowStep. Its shared
// offsets repeat their swizzle every kPhases rows steps, so each chunk's destination is one of at
// most two precomputed bases plus a compile-time offset, and its source a running pointer: a few
// integer ops per 16-byte copy. kAllRows: the caller knows every row is in range (any key tile but
// the last), so no per-row test is made (at head dim 256 that is 32 of ~910 instructions per
// iteration; ncu showed the main loop instruction-bound against torch's FA2 at equal IPC).
template <class Tr, int kRows, bool kAllRows = false>
__device__ __forceinline__ void load_tile(uint32_t sbase, const uint16_t *g, int row0, int64_t rs,
                                          int rows_valid, int d, int tid) {
    using Tile = cuda::SwizzledTile<kRows, Tr::kD>;
    constexpr int kCPR = Tr::kD / 8;
    constexpr int kCPRp = next_pow2(kCPR);
    static_assert(Tr::kThreads % kCPRp == 0, "threads must cover whole rows");
    constexpr int kRowStep = Tr::kThreads / kCPRp;
    static_assert(kRows % kRowStep == 0, "rows must be a multiple of the row step");
    constexpr int kIters = kRows / kRowStep;
    constexpr int kPhases = 8 / gcd_int(kRowStep, 8);
    static_assert(kPhases <= 2, "at most two swizzle phases");
    const int r0 = tid / kCPRp;
    const int c = tid - r0 * kCPRp;
    if (kCPR != kCPRp && c >= kCPR) return;
    rs = opaque(rs);
    const bool col_ok = c * 8 < d;
    const uint16_t *src = g + (row0 + r0) * rs + c * 8;
    const int64_t step = rs * kRowStep;
    // Row pitch of this chunk's page (the trailing half page of 32 columns has 64-byte rows).
    const uint32_t pitch = (Tile::kHalfPage && c >= 8 * Tile::kFullPages) ? 64u : 128u;
    const uint32_t base0 = sbase + Tile::offset(r0, c);
    const uint32_t base1 =
        kPhases == 2 ? sbase + Tile::offset(r0 + kRowStep, c) - kRowStep * pitch : base0;
    const int rlim = rows_valid - r0;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
        const bool ok = kAllRows ? col_ok : col_ok && j * kRowStep < rlim;
        const uint32_t dst = ((kPhases == 2 && (j & 1)) ? base1 : base0) + j * kRowStep * pitch;
        // Out-of-range chunks copy 0 bytes (16 zero bytes land in shared memory; nothing is read).
        cuda::cp_async_16(dst, src, ok ? 16u : 0u);
        src += step;
    }
}

// cp.async the Q tile: packed rows m0.. (row -> (qpos, head) through unpack_row).
template <class Tr>
__device__ __forceinline__ void load_q(uint32_t sbase, const uint16_t *qg, int64_t q_rs,
                                       int64_t q_hs, int m0, int prows, int G, int hbase, int d,
                                       int tid) {
    using Tile = typename Tr::QTile;
    constexpr int kCPR = Tr::kD / 8;
    constexpr int kTotal = Tr::kBM * kCPR;
    constexpr int kIters = (kTotal + Tr::kThreads - 1) / Tr::kThreads;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
        const int i = tid + j * Tr::kThreads;
        if (kTotal % Tr::kThreads == 0 || i < kTotal) {
            const int r = i / kCPR;
            const int c = i - r * kCPR;
            const int prow = m0 + r;
            const bool ok = c * 8 < d && prow < prows;
            const uint16_t *src = qg;
            if (ok) {
                int qpos, head;
                unpack_row(prow, G, hbase, qpos, head);
                src = qg + qpos * q_rs + head * q_hs + c * 8;
            }
            cuda::cp_async_16(sbase + Tile::offset(r, c), src, ok ? 16u : 0u);
        }
    }
}

}  // namespace fa2
}  // namespace flashattn
