// FA3 FP8 (E4M3) forward kernel for Hopper (sm_90a), issue 17: fa3 (and auto on sm_90) runs FP8
// plans with it (fa3_backend.cpp). Verified on the H200 (test_fp8_fa3, sanitizers); see
// docs/kernel-notes.md, "FP8 (E4M3) forward", and docs/performance.md for its speed.
//
// The same composition as fa3_fwd_kernel.cuh over the same shared pieces: the persistent tile
// scheduler (fa3_tile_scheduler.cuh), the TMA producer (fa3_producer.cuh, with 128-column E4M3
// pages) and the epilogue (fa3_epilogue.cuh, O as bf16/fp16 pairs and the LSE). What differs:
//   * E4M3 wgmma has no transpose flag, so V must be K-major (keys contiguous) for O += P V.
//     TMA loads each V tile as it is stored ([keys][head dim]) into a staging ring; warps 1..3
//     of the producer warpgroup transpose it into a second ring ([head dim][keys], 128-byte
//     swizzle), with the keys of each 32-key step in the order fp8_p_column gives, so that P's
//     A fragment can be packed from each thread's own S registers (pack_p_fragment: no
//     shuffles). Barriers: v_full/v_empty guard the staging ring (TMA -> transposers),
//     vt_full/vt_empty the transposed ring (transposers -> consumers).
//   * The consumer mainloop issues wgmma m64n128k32 E4M3 (SS) for S and m64nDk32 E4M3 (RS) for
//     O += P V; P = exp2(s * sl2 - m * sl2 + 8) = 256 exp(...), packed to E4M3 (the x256 keeps
//     small probabilities out of E4M3's subnormal range; the row sums carry the same factor).
//   * Descales: dq * dk of the (sequence, kv head) folds into the score scale (or the soft cap's
//     pre-tanh scale), so the LSE includes them as the CPU reference defines it; dv / 256 scales
//     O and 1/256 the row sums before the shared epilogue.
// Register split as in the 16-bit kernel: producer warpgroup 40 (the transposers need few: one
// LDSM.x4.T, four byte permutes and one STSM.x4 per step), consumers 232. The two consumer
// warpgroups ping-pong their GEMM issues (take_turn / pass_turn).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/device/ptx_sm90_fp8.cuh"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_epilogue.cuh"
#include "backends/cuda/fa3/fa3_fp8_params.h"
#include "backends/cuda/fa3/fa3_launch.cuh"
#include "backends/cuda/fa3/fa3_mainloop.cuh"
#include "backends/cuda/fa3/fa3_producer.cuh"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

constexpr int kTransposeWarps = 3;      // warps 1..3 of the producer warpgroup
constexpr float kPScaleLog2 = 8.f;      // P is stored times 2^8 = 256 before the E4M3 cast
constexpr float kInvPScale = 1.f / 256.f;

// Ping-pong of the two consumer warpgroups (as FlashAttention-3): each wgmma issue point (S, P V,
// or both) is a turn; warpgroup w takes its turn on named barrier 1 + w and passes it to the other
// by arriving on 2 - w (256 threads: its 128 waiting, the other's 128 arriving). The GEMMs of the
// two warpgroups then alternate on the tensor cores and each softmax runs under the other's GEMMs,
// where without it both wait on the same K tile and run S, softmax and P V in lockstep (the tensor
// cores idle during both softmaxes). Warpgroup 1 passes once at the start so that 0 goes first;
// 0 takes one extra turn at the end to consume 1's last pass (no barrier left half-arrived).
// Both warpgroups walk the same work tiles and key tiles, so the turns pair up. (Barrier 0 is
// __syncthreads; the FP8 kernel names no other barrier.)
__device__ __forceinline__ void take_turn(int w) {
    asm volatile("bar.sync %0, 256;" ::"r"(1 + w) : "memory");
}
__device__ __forceinline__ void pass_turn(int w) {
    asm volatile("bar.arrive %0, 256;" ::"r"(2 - w) : "memory");
}

// The shared-memory layout of the FP8 kernel, with the names produce() and store_output() read.
// Q and K pages are 128 E4M3 columns (128 bytes) of 128 rows; V has a staging ring (TMA target,
// the K layout) and a transposed ring (kD rows of kBN = 128 keys: one 128-byte row each).
template <int kD_>
struct Fp8Traits {
    static constexpr int kD = kD_;
    static constexpr int kBN = kFp8BlockN;
    static constexpr int kPageCols = 128;
    static constexpr int kPages = kD / 128;
    static constexpr int kQPage = kBlockM * 128;
    static constexpr int kKVPage = kBN * 128;
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKVBytes = kPages * kKVPage;  // a K tile or a staged V tile
    static constexpr int kVtBytes = kD * kBN;          // a transposed V tile
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
    static constexpr int kVtOffset = kVOffset + kStages * kKVBytes;
    static constexpr int kBarOffset = kVtOffset + kStages * kVtBytes;
    static constexpr int kSmemBytes = kBarOffset + 2048;  // 1 KB barriers (padded), 1 KB alignment slack
    static constexpr int kNT = kBN / 8;      // n8 tiles of S
    static constexpr int kKSteps = kBN / 32;  // k32 steps of P V (A fragments of P)
    static_assert(kD % 128 == 0 && kD <= 256, "FP8 tiles are 128 or 256 columns");
    static_assert(kBN == 128, "the transposed V row is one 128-byte swizzle row");
    static_assert(kSmemBytes <= kMaxSmemBytes, "FP8 tile does not fit in shared memory");
};

struct Fp8Barriers {
    Barriers ring;  // q, k, v (v: the staging ring; v_empty counts transposer warps)
    uint64_t vt_full[kStages], vt_empty[kStages];
};

// Transposes one staged V tile ([kBN keys][kD] E4M3, kD/128 pages) into the K-major operand
// ([kD][kBN keys]) with the keys of each 32-key step permuted: slot 32s + 16h + 4q + u holds key
// 32s + fp8_p_column(16h + 4q + u) = 32s + 16h + 2q + {0, 1, 8, 9}[u]. `warp`: 0..2, `lane`.
// One unit (a warp's step): 16 keys (K0 = 16 kg) x 32 columns (C0 = 32 cg), 512 bytes, by one
// LDSM.x4.T, four PRMT and one STSM.x4:
//  * ldmatrix .trans on b16 (byte pairs): matrix i = keys K0 + 8 (i & 1) + 0..7 by the 16 bytes at
//    column C0 + 16 (i >> 1). Lane (g, q) receives [key K0+2q: c, c+1 | key K0+2q+1: c, c+1] with
//    c = C0 + 2g (+16 for i >= 2) from matrix 0 (2), the same keys + 8 from matrix 1 (3).
//  * one byte permute per column: column c = [K0+2q, K0+2q+1, K0+2q+8, K0+2q+9] at c, which are
//    exactly slots 16h + 4q + 0..3 (K0 = 32s + 16h): the permuted order costs nothing.
//  * stmatrix (b16, not transposed): lane (g, q) gives 4 bytes at byte 4q of row g of each 8x8
//    matrix; the matrix rows are the output rows (head-dim columns) c or c + 1 of lane g, 16 bytes
//    at key byte K0. Rows 2g then 2g + 1 for g < 4 and the other way round for g >= 4, so that the
//    eight rows of each matrix fall in eight distinct swizzle chunks (no bank conflicts).
// The loads read 8 consecutive keys at one chunk (conflict-free under the swizzle as well). Every
// lane's swizzle terms depend on the lane only (K0 and C0 are multiples of 16 and 32), so the
// addresses are a per-lane base plus a per-unit offset.
template <class Tr>
__device__ __forceinline__ void transpose_v_tile(uint32_t src, uint32_t dst, int warp, int lane) {
    constexpr int kUnits = (Tr::kBN / 16) * (Tr::kD / 32);
    const int j = lane & 7, mi = lane >> 3;
    // Source: key K0 + 8 (mi & 1) + j, 16-byte chunk 2 (cg % 4) + (mi >> 1) of page cg / 4.
    const uint32_t src_lane = src + static_cast<uint32_t>((8 * (mi & 1) + j) * 128);
    const int src_chunk = mi >> 1;
    // Destination: row C0 + 16 (mi >> 1) + 2 j + flip, chunk kg (byte K0 = 16 kg).
    const int flip = (mi & 1) ^ (j >= 4 ? 1 : 0);
    const int dst_row = 16 * (mi >> 1) + 2 * j + flip;  // + C0 (a multiple of 32: row % 8 unchanged)
    const uint32_t dst_lane = dst + static_cast<uint32_t>(dst_row * 128);
    const int dst_sw = dst_row & 7;
    // Lane (g, q)'s byte selectors: its first store matrix holds column c (0x6420: bytes 0, 2 of
    // each register) for g < 4, c + 1 (0x7531) for g >= 4; the second the other.
    const bool hi_g = (lane >> 2) >= 4;
    const uint32_t sel_a = hi_g ? 0x7531u : 0x6420u, sel_b = hi_g ? 0x6420u : 0x7531u;
#pragma unroll 2
    for (int u = warp; u < kUnits; u += kTransposeWarps) {
        const int kg = u & 7, cg = u >> 3;
        const uint32_t s_addr = src_lane + static_cast<uint32_t>((cg >> 2) * Tr::kKVPage + kg * 16 * 128 +
                                                                  ((((2 * (cg & 3) + src_chunk) ^ j) & 7) << 4));
        uint32_t r[4];
        cuda::ldmatrix_x4_trans(r, s_addr);
        uint32_t w[4];
        w[0] = __byte_perm(r[0], r[1], sel_a);
        w[1] = __byte_perm(r[0], r[1], sel_b);
        w[2] = __byte_perm(r[2], r[3], sel_a);
        w[3] = __byte_perm(r[2], r[3], sel_b);
        const uint32_t d_addr = dst_lane + static_cast<uint32_t>(cg * 32 * 128 + (((kg ^ dst_sw) & 7) << 4));
        cuda::stmatrix_x4(w, d_addr);
    }
}

// Transposer warps (1..3 of the producer warpgroup): every key tile of a work tile, in the
// producer's order, from the staging ring into the transposed ring.
template <class Tr>
__device__ __forceinline__ void transpose_tiles(const TileCoords &c, unsigned char *smem, Fp8Barriers *bars, int warp,
                                                int lane, Pipe &pipe) {
    const int n_tiles = c.kt.last - c.kt.first + 1;
    for (int i = pipe.kv; i < pipe.kv + n_tiles; ++i) {
        const int st = stage_of(i);
        const uint32_t ph = phase_of(i);
        cuda::mbar_wait(&bars->ring.v_full[st], ph);
        cuda::mbar_wait(&bars->vt_empty[st], ph ^ 1u);
        transpose_v_tile<Tr>(cuda::smem_addr(smem + Tr::kVOffset + st * Tr::kKVBytes),
                             cuda::smem_addr(smem + Tr::kVtOffset + st * Tr::kVtBytes), warp, lane);
        cuda::fence_proxy_async_shared();  // this thread's stores, visible to the consumers' wgmma
        __syncwarp();
        if (lane == 0) {
            cuda::mbar_arrive(&bars->ring.v_empty[st]);
            cuda::mbar_arrive(&bars->vt_full[st]);
        }
    }
    pipe.kv += n_tiles;
    pipe.q += 1;
}

// S = Q K^T for K ring stage `st` (issued, not waited for): kD / 32 E4M3 wgmmas.
template <class Tr>
__device__ __forceinline__ void issue_qk_fp8(float (&S)[Tr::kNT][4], uint64_t dq, uint64_t dk, int st) {
    float(&acc)[Tr::kBN / 2] = reinterpret_cast<float(&)[Tr::kBN / 2]>(S);
    const uint64_t dks = dk + static_cast<uint64_t>((st * Tr::kKVBytes) >> 4);
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kD / 32; ++ks)  // a k32 step is 32 bytes: k_step's 16-bit arithmetic holds
        cuda::wgmma_ss_e4m3<Tr::kBN>(acc, dq + k_step(ks, Tr::kQPage), dks + k_step(ks, Tr::kKVPage), ks > 0);
    cuda::wgmma_commit();
}

// O += P V for transposed ring stage `st` (issued, not waited for): 32 keys (32 bytes of each
// 128-byte row of V^T) per wgmma.
template <class Tr>
__device__ __forceinline__ void issue_pv_fp8(float (&O)[Tr::kD / 2], const uint32_t (&P)[Tr::kKSteps][4], uint64_t dvt,
                                             int st) {
    const uint64_t dvs = dvt + static_cast<uint64_t>((st * Tr::kVtBytes) >> 4);
    cuda::fence_operands(O);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) cuda::wgmma_rs_e4m3<Tr::kD>(O, P[kk], dvs + static_cast<uint64_t>(2 * kk), 1);
    cuda::wgmma_commit();
}

// The online-softmax step of softmax_step (online_softmax.cuh) with P = 256 exp(...) (the x256
// folded into the exp2 offset; row_sum sums the scaled values), packed to E4M3 A fragments in
// the permuted key order of pack_p_fragment. S is overwritten with the scaled P.
template <int kNT>
__device__ __forceinline__ void softmax_step_fp8(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                 float sl2, uint32_t (&P)[kNT / 4][4], float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = row_max[h];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(S[nt][2 * h], S[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ms = mx == -INFINITY ? 0.f : mx * sl2;
        // (-inf * sl2 is NaN when a descale is 0, so a row with no key yet gets alpha = 0 by test.)
        alpha[h] = row_max[h] == -INFINITY ? 0.f : cuda::fast_exp2(row_max[h] * sl2 - ms);
        row_max[h] = mx;
        const float offset = kPScaleLog2 - ms;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float pv = cuda::fast_exp2(fmaf(S[nt][2 * h + e], sl2, offset));
                rs += pv;
                S[nt][2 * h + e] = pv;
            }
        row_sum[h] = fmaf(row_sum[h], alpha[h], rs);
    }
    const float(&flat)[kNT * 4] = reinterpret_cast<const float(&)[kNT * 4]>(S);
#pragma unroll
    for (int t = 0; t < kNT / 4; ++t) cuda::pack_p_fragment(flat, t, 1.f, P[t]);
}

// Soft cap (with the tile's descaled pre-tanh scale) and the edge-tile mask.
template <class Tr>
__device__ __forceinline__ void score_mods_fp8(const Params &p, const TileCoords &c, float (&S)[Tr::kNT][4], int nb,
                                               const int (&rdiag)[2], int t, float cap_scale) {
    if (cap_scale != 0.f) cuda::softcap_scores(S, cap_scale);
    if (c.kt.masked(nb)) cuda::mask_scores(S, rdiag, nb * Tr::kBN + 2 * t, c.seq.sk, p.right_i, p.left_i);
}

// One consumer warpgroup's walk over the key tiles of a work tile: consumer_mainloop of
// fa3_mainloop.cuh on E4M3 operands, V from the transposed ring.
template <class Tr>
__device__ __forceinline__ void consumer_mainloop_fp8(const Params &p, const TileCoords &c, unsigned char *smem,
                                                      Fp8Barriers *bars, int w, int lane, int t,
                                                      const int (&rdiag)[2], float sl2, float cap_scale,
                                                      float (&O)[Tr::kD / 2], float (&row_max)[2],
                                                      float (&row_sum)[2], Pipe &pipe) {
    constexpr int kD = Tr::kD, kBN = Tr::kBN, kNT = Tr::kNT, kKS = Tr::kKSteps;
    // Head dim 128: the softmax of S_i overlaps P_{i-1} V (two P register sets, as the 16-bit
    // mainloop). Head dim 256: S_i and P_{i-1} V in flight together need O (128) + S (64) + P
    // (16) operand registers, and ptxas spilled and serialized the wgmmas (C7512) even with one P
    // set, so each tile runs S, softmax, P V in turn (serial_tiles); the two consumer warpgroups
    // still overlap each other.
    constexpr bool kOverlap = kD <= 128;
    const uint32_t s_base = cuda::smem_addr(smem);
    const uint64_t dq = cuda::make_desc_sw128(s_base + 64 * w * 128);
    const uint64_t dk = cuda::make_desc_sw128(s_base + Tr::kKOffset);
    const uint64_t dvt = cuda::make_desc_sw128(s_base + Tr::kVtOffset);  // K-major, like K

    const int r0 = pipe.kv;
    const int n_tiles = c.kt.last - c.kt.first + 1;
    auto step = [&](int i, uint32_t (&P)[kKS][4], uint32_t (&P_next)[kKS][4]) {
        const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
        float S[kNT][4];
        cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0 + i));
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i - 1));
        take_turn(w);
        issue_qk_fp8<Tr>(S, dq, dk, ks);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<1>();  // S_i is ready; P_{i-1} V_{i-1} may still run
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
        release(&bars->ring.k_empty[ks], lane);
        if (i == n_tiles - 1) release(&bars->ring.q_empty, lane);
        score_mods_fp8<Tr>(p, c, S, c.kt.last - i, rdiag, t, cap_scale);
        float alpha[2];
        softmax_step_fp8(S, row_max, row_sum, sl2, P_next, alpha);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
#pragma unroll
        for (int j = 0; j < kD / 2; ++j) O[j] *= alpha[(j % 4) / 2];
    };
    auto last_pv = [&](uint32_t (&P)[kKS][4], int i) {
        const int vs = stage_of(r0 + i);
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i));
        take_turn(w);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
    };

    // Head dim 256: per tile S_i = Q K_i^T, the softmax, O += P_i V_i, each waited for.
    auto serial_tiles = [&]() {
        uint32_t P[kKS][4];
#pragma unroll 1
        for (int i = 0; i < n_tiles; ++i) {
            const int st = stage_of(r0 + i);
            const uint32_t ph = phase_of(r0 + i);
            float S[kNT][4];
            cuda::mbar_wait(&bars->ring.k_full[st], ph);
            take_turn(w);
            issue_qk_fp8<Tr>(S, dq, dk, st);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->ring.k_empty[st], lane);
            if (i == n_tiles - 1) release(&bars->ring.q_empty, lane);
            score_mods_fp8<Tr>(p, c, S, c.kt.last - i, rdiag, t, cap_scale);
            float alpha[2];
            softmax_step_fp8(S, row_max, row_sum, sl2, P, alpha);  // alpha 0 on the first tile: O is 0
#pragma unroll
            for (int j = 0; j < kD / 2; ++j) O[j] *= alpha[(j % 4) / 2];
            cuda::mbar_wait(&bars->vt_full[st], ph);
            take_turn(w);
            issue_pv_fp8<Tr>(O, P, dvt, st);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(O);
            release(&bars->vt_empty[st], lane);
        }
    };

    // Head dim 128: key tile i: S_i, then P_i V_i during step i+1; P alternates between P0 and P1.
    auto overlapped_tiles = [&](uint32_t (&P0)[kKS][4], uint32_t (&P1)[kKS][4]) {
        {
            const int ks = stage_of(r0);
            float S[kNT][4];
            cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0));
            take_turn(w);
            issue_qk_fp8<Tr>(S, dq, dk, ks);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->ring.k_empty[ks], lane);
            if (n_tiles == 1) release(&bars->ring.q_empty, lane);
            score_mods_fp8<Tr>(p, c, S, c.kt.last, rdiag, t, cap_scale);
            float alpha[2];
            softmax_step_fp8(S, row_max, row_sum, sl2, P0, alpha);
        }
        int i = 1;
        for (; i + 1 < n_tiles; i += 2) {
            step(i, P0, P1);
            step(i + 1, P1, P0);
        }
        if (i < n_tiles) {
            step(i, P0, P1);
            last_pv(P1, i);
        } else {
            last_pv(P0, i - 1);
        }
    };
    cuda::mbar_wait(&bars->ring.q_full, static_cast<uint32_t>(pipe.q & 1));
    if constexpr (kOverlap) {
        uint32_t Pa[kKS][4], Pb[kKS][4];
        overlapped_tiles(Pa, Pb);
    } else {
        serial_tiles();
    }
    pipe.kv += n_tiles;
    pipe.q += 1;
}

// Consumer warpgroup `w` of a work tile: descales, mainloop, epilogue (see consume in
// fa3_fwd_kernel.cuh for the thread's place in the accumulator layout).
template <class Tr, class E>
__device__ __forceinline__ void consume_fp8(const Fp8Params &p, const TileCoords &c, unsigned char *smem,
                                            Fp8Barriers *bars, int w, Pipe &pipe) {
    constexpr int kD = Tr::kD;
    const int tid = threadIdx.x - 128 * (w + 1);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    int qpos[2], rdiag[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        qpos[h] = c.m0 + 64 * w + 16 * warp + g + 8 * h;
        rdiag[h] = qpos[h] + cuda::diagonal_offset(p, c.seq.sq, c.seq.sk);
    }
    // Descales of this (sequence, kv head). The scores are dq dk (q . k): the product scales the
    // exp2 multiplier, or with a soft cap the pre-tanh scale (sl2 is then cap * log2 e).
    const int64_t ds = static_cast<int64_t>(c.b) * p.descale_bs + static_cast<int64_t>(c.head / p.group) * p.descale_hs;
    const float dqk = p.descale_q[ds] * p.descale_k[ds];
    const float sl2 = p.softcap_scale != 0.f ? p.score_log2 : p.score_log2 * dqk;
    const float cap_scale = p.softcap_scale * dqk;

    float O[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) O[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    if (c.has_keys()) {
        consumer_mainloop_fp8<Tr>(p, c, smem, bars, w, lane, t, rdiag, sl2, cap_scale, O, row_max, row_sum, pipe);
        // P carried a factor 256 in both O and the row sums: O gets dv / 256, the sums 1 / 256
        // (exact), so O / l is dv (P V) / l and the LSE is the unscaled one.
        const float o_scale = p.descale_v[ds] * kInvPScale;
#pragma unroll
        for (int j = 0; j < kD / 2; ++j) O[j] *= o_scale;
        row_sum[0] *= kInvPScale;
        row_sum[1] *= kInvPScale;
    }
    store_output<Tr, E>(p, c, O, row_max, row_sum, sl2, qpos, t);
}

template <class Tr, class E>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ Fp8Params p) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    Fp8Barriers *bars = reinterpret_cast<Fp8Barriers *>(smem + Tr::kBarOffset);

    if (threadIdx.x == 0) {
        cuda::mbar_init(&bars->ring.q_full, 1);
        cuda::mbar_init(&bars->ring.q_empty, kConsumerWarps);
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            cuda::mbar_init(&bars->ring.k_full[s], 1);
            cuda::mbar_init(&bars->ring.v_full[s], 1);
            cuda::mbar_init(&bars->ring.k_empty[s], kConsumerWarps);
            cuda::mbar_init(&bars->ring.v_empty[s], kTransposeWarps);  // the staging ring's readers
            cuda::mbar_init(&bars->vt_full[s], kTransposeWarps);
            cuda::mbar_init(&bars->vt_empty[s], kConsumerWarps);
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();

    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int n_work = m_blocks * p.heads_q * p.batch;
    const int wg = threadIdx.x / 128;
    Pipe pipe;
    if (wg == 0) {
        cuda::setmaxnreg_dec<40>();
        const int warp = threadIdx.x / 32;
        if (warp == 0) {
            if (threadIdx.x != 0) return;
            cuda::prefetch_tensormap(&tm_q);
            cuda::prefetch_tensormap(&tm_k);
            cuda::prefetch_tensormap(&tm_v);
            for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
                const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
                if (c.has_keys()) produce<Tr>(p, c, &tm_q, &tm_k, &tm_v, smem, &bars->ring, pipe);
            }
        } else {
            const int lane = threadIdx.x & 31;
            for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
                const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
                if (c.has_keys()) transpose_tiles<Tr>(c, smem, bars, warp - 1, lane, pipe);
            }
        }
    } else {
        cuda::setmaxnreg_inc<232>();
        if (wg == 2) pass_turn(1);  // warpgroup 0 (wg 1) issues first
        for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
            if (c.has_rows()) consume_fp8<Tr, E>(p, c, smem, bars, wg - 1, pipe);
        }
        if (wg == 1) take_turn(0);  // warpgroup 1's last pass
    }
}

// Host launcher: the persistent grid of launch_fwd (launch_persistent, fa3_launch.cuh).
template <int kD, class E>
cudaError_t launch_fp8_fwd(const Fp8Params &p, const TensorMaps &maps, cudaStream_t stream) {
    using Tr = Fp8Traits<kD>;
    static unsigned long long optin_done = 0;  // one per instantiation
    return launch_persistent(fp8_fwd_kernel<Tr, E>, Tr::kSmemBytes, &optin_done, p, maps, stream);
}

}  // namespace fa3
}  // namespace flashattn
