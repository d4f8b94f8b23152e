// FA2 warp-level tensor-core GEMMs (mma.sync m16n8k16 fed by ldmatrix from the swizzled tiles
// that fa2_load.cuh fills): S = Q K^T and O += P V for one warp's kWarpRows query rows.
//
// Generation-generic in shape: gemm_qk is also the score recomputation of a backward pass, and
// both show the lane-base addressing (QTile / KVTile ::lane_base_full / lane_base_half,
// xor_term, const_term) its other GEMMs (dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K)
// would use. The accumulators are the m16n8 fragments of device/ptx.cuh, the layout that
// device/online_softmax.cuh works on.
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_traits.cuh"

namespace flashattn {
namespace fa2 {

// S = Q K^T for this warp's rows. q_f/q_h: lane bases of the Q tile (full / half page),
// k_f/k_h: lane bases of the current K buffer.
// kBounded: only the first np_end 16-key chunks of the tile (a sink-token tile's sink keys,
// np_end warp-uniform); the other scores stay 0 for the caller's mask.
// kRamp: S = ramp*c + Q K^T, c = 8*nt + e the score's column in the tile less the thread's 2t
// (FA2's one-sided ALiBi tiles with one slope per CTA, fwd_key_tile). The ramp is what S starts
// from instead of zero, so it is the first k-step's C operand: two values per n8 tile, the same
// for every m16 tile and both row halves (ptxas builds each n8 tile's C quad once, with 2 FMULs
// and 2 MOVs, and reuses it as the last m16 tile's D).
// after_step(ks): called after each k-step's mma are issued, for independent work the caller
// wants between them (the backward's exponentials under its dP GEMM); NoStepWork by default.
struct NoStepWork {
    __device__ __forceinline__ void operator()(int) const {}
};
template <class Tr, class E, bool kBounded = false, bool kRamp = false, class StepWork = NoStepWork>
__device__ __forceinline__ void gemm_qk(float (&S)[Tr::kMT][Tr::kNT][4], uint32_t q_f, uint32_t q_h,
                                        uint32_t k_f, uint32_t k_h, int np_end = 0, float ramp = 0.f,
                                        StepWork after_step = {}) {
    using QT = typename Tr::QTile;
    using KT = typename Tr::KVTile;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[mt][nt][e] = kRamp ? ramp * static_cast<float>(8 * nt + (e & 1)) : 0.f;
#pragma unroll
    for (int ks = 0; ks < Tr::kKS; ++ks) {
        uint32_t qa[Tr::kMT][4];
#pragma unroll
        for (int mt = 0; mt < Tr::kMT; ++mt) {
            const uint32_t a = QT::in_full_page(ks)
                                   ? (q_f ^ QT::xor_term(ks)) + QT::const_term(mt * 16, ks)
                                   : (q_h ^ QT::xor_term(ks)) + QT::const_term(mt * 16, ks);
            cuda::ldmatrix_x4(qa[mt], a);
        }
#pragma unroll
        for (int np = 0; np < Tr::kNT / 2; ++np) {
            if (kBounded && np >= np_end) break;
            uint32_t kb[4];
            const uint32_t a = KT::in_full_page(ks)
                                   ? (k_f ^ KT::xor_term(ks)) + KT::const_term(np * 16, ks)
                                   : (k_h ^ KT::xor_term(ks)) + KT::const_term(np * 16, ks);
            cuda::ldmatrix_x4(kb, a);
#pragma unroll
            for (int mt = 0; mt < Tr::kMT; ++mt) {
                cuda::mma_16816<E>(S[mt][2 * np], qa[mt], kb[0], kb[1]);
                cuda::mma_16816<E>(S[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
            }
        }
        after_step(ks);
    }
}

// O += P V. P holds the softmaxed scores already packed as m16k16 A fragments (the S accumulators
// of two adjacent n8 tiles form one k16 fragment: no shared-memory round trip).
// kBounded: only the first vs_end 16-key chunks (their P is all the tile has; gemm_qk's bound).
template <class Tr, class E, bool kBounded = false>
__device__ __forceinline__ void gemm_pv(float (&O)[Tr::kMT][Tr::kDT][4],
                                        const uint32_t (&P)[Tr::kMT][Tr::kVS][4], uint32_t v_f,
                                        uint32_t v_h, int vs_end = 0) {
    using VT = typename Tr::KVTile;
#pragma unroll
    for (int vs = 0; vs < Tr::kVS; ++vs) {
        if (kBounded && vs >= vs_end) break;
#pragma unroll
        for (int dp = 0; dp < Tr::kD / 16; ++dp) {
            uint32_t vb[4];
            const uint32_t a = VT::in_full_page(dp)
                                   ? (v_f ^ VT::xor_term(dp)) + VT::const_term(vs * 16, dp)
                                   : (v_h ^ VT::xor_term(dp)) + VT::const_term(vs * 16, dp);
            cuda::ldmatrix_x4_trans(vb, a);
#pragma unroll
            for (int mt = 0; mt < Tr::kMT; ++mt) {
                cuda::mma_16816<E>(O[mt][2 * dp], P[mt][vs], vb[0], vb[1]);
                cuda::mma_16816<E>(O[mt][2 * dp + 1], P[mt][vs], vb[2], vb[3]);
            }
        }
    }
}

}  // namespace fa2
}  // namespace flashattn
