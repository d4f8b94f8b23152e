// FlashAttention-2 forward kernel for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async).
//
// One CTA per (query tile, head, batch [x split]); the K/V loop runs inside, from the last visible
// key tile down to the first so that the diagonal/ragged tiles (the only ones that need an element
// mask, together with the left edge of a sliding window) come first. Warps split the query rows
// (no cross-warp reduction); O, the running max m and the running sum l stay in registers and O is
// divided by l once at the end. Scores are kept unscaled; exp2 applies scale*log2(e) with one FFMA
// (after the tanh when a soft cap is on). Shared memory holds Q, and one or two buffers of K and V,
// in the swizzled page layout of common/swizzle.cuh.
//
// Runtime features (no template flags): causal / sliding window (one key interval per row),
// soft cap, GQA/MQA (and pack-GQA: the query heads of one kv head stacked along M), variable
// length (cu_seqlens), LSE, split-KV (fp32 partials into the workspace + fa2_merge.cu).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/host/smem_optin.h"
#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa2/fa2_config.h"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {

template <int kD_, int kBM_, int kBN_, int kNW_, int kStages_, int kMinBlocks_>
struct KernelTraits {
    static constexpr int kD = kD_;
    static constexpr int kBM = kBM_;
    static constexpr int kBN = kBN_;
    static constexpr int kNW = kNW_;
    static constexpr int kStages = kStages_;
    static constexpr int kMinBlocks = kMinBlocks_;
    static constexpr int kThreads = kNW * 32;
    static constexpr int kMT = kBM / (16 * kNW);  // m16 tiles per warp
    static constexpr int kWarpRows = 16 * kMT;
    static constexpr int kNT = kBN / 8;   // n8 tiles of S per warp
    static constexpr int kDT = kD / 8;    // n8 tiles of O per warp
    static constexpr int kKS = kD / 16;   // k16 steps of S = Q K^T
    static constexpr int kVS = kBN / 16;  // k16 steps of O += P V
    using QTile = cuda::SwizzledTile<kBM, kD>;
    using KVTile = cuda::SwizzledTile<kBN, kD>;
    static constexpr int kQBytes = QTile::kBytes;
    static constexpr int kKVBytes = KVTile::kBytes;
    static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes;
    // Single K/V buffer with one m16 row tile per warp (head dim 256's 64 x 64 tile): issue the
    // next K load right after the S GEMM, before the softmax. Measured on the H200 (bf16, seqlen
    // 1k-16k): +2..+8% at head dim 256; at head dim 128 (two m16 tiles per warp) it cost 10-13%.
    static constexpr bool kEarlyK = kStages == 1 && kMT == 1;
    static_assert(kMT >= 1 && kBM == 16 * kNW * kMT, "block_m must be a multiple of 16*warps");
    static_assert(kD % 32 == 0 && kBN % 16 == 0, "unsupported tile shape");
    static_assert(kStages == 1 || kStages == 2, "one or two K/V buffers");
    static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1 KB alignment");
};

template <int kD, bool kSmall>
struct TraitsFor {
    static constexpr TileConfig c = kSmall ? small_config(kD) : prefill_config(kD);
    static_assert(c.head_dim == kD, "no such compiled configuration");
    using type = KernelTraits<c.head_dim, c.block_m, c.block_n, c.warps, c.stages, c.min_blocks>;
};

// Packed row -> (query position, query head). Without pack-GQA G == 1 and head == hbase.
__device__ __forceinline__ void unpack_row(int prow, int G, int hbase, int &qpos, int &head) {
    if (G == 1) {
        qpos = prow;
        head = hbase;
    } else {
        qpos = prow / G;
        head = hbase + (prow - qpos * G);
    }
}

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

constexpr int next_pow2(int x) { return x <= 1 ? 1 : 2 * next_pow2((x + 1) / 2); }
constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

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

// Single K/V buffer, at the point where every warp is done with K[nb]: wait for V[nb] (the only
// copy in flight), then refill the buffer with K[nb-1]. Traits::kEarlyK places this before the
// softmax (as FlashAttention-2 does), otherwise it comes after it.
template <class Tr>
__device__ __forceinline__ void wait_v_load_next_k(uint32_t s_k, const uint16_t *kg, int nb, int nb_first,
                                                   int64_t k_rs, int sk, int d, int tid) {
    cuda::cp_async_wait<0>();  // V[nb] landed
    __syncthreads();           // every warp is done with K[nb]
    if (nb > nb_first) {
        const int n0 = (nb - 1) * Tr::kBN;
        load_tile<Tr, Tr::kBN, true>(s_k, kg, n0, k_rs, sk - n0, d, tid);
        cuda::cp_async_commit();
    }
}

// S = Q K^T for this warp's rows. q_f/q_h: lane bases of the Q tile (full / half page),
// k_f/k_h: lane bases of the current K buffer.
template <class Tr, class E>
__device__ __forceinline__ void gemm_qk(float (&S)[Tr::kMT][Tr::kNT][4], uint32_t q_f,
                                        uint32_t q_h, uint32_t k_f, uint32_t k_h) {
    using QT = typename Tr::QTile;
    using KT = typename Tr::KVTile;
#pragma unroll
    for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[mt][nt][e] = 0.f;
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
    }
}

// O += P V. P holds the softmaxed scores already packed as m16k16 A fragments (the S accumulators
// of two adjacent n8 tiles form one k16 fragment: no shared-memory round trip).
template <class Tr, class E>
__device__ __forceinline__ void gemm_pv(float (&O)[Tr::kMT][Tr::kDT][4],
                                        const uint32_t (&P)[Tr::kMT][Tr::kVS][4], uint32_t v_f,
                                        uint32_t v_h) {
    using VT = typename Tr::KVTile;
#pragma unroll
    for (int vs = 0; vs < Tr::kVS; ++vs) {
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

// ---- epilogue -------------------------------------------------------------------------------
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
        float *op = p.o_part + r * p.head_dim;
#pragma unroll
        for (int dt = 0; dt < Tr::kDT; ++dt) {
            const int col = dt * 8 + 2 * t;
            if (col < p.head_dim)
                *reinterpret_cast<float2 *>(op + col) =
                    make_float2(O[mt][dt][2 * h] * inv[mt][h], O[mt][dt][2 * h + 1] * inv[mt][h]);
        }
        if (t == 0) p.lse_part[r] = lse[mt][h];
    });
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
                                    cuda::pack2<E>(O[mt][dt][2 * h] * inv[mt][h],
                                                   O[mt][dt][2 * h + 1] * inv[mt][h]));
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
    if (!((kCPR == kCPRp || c < kCPR) && c * 8 < p.head_dim)) return;
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

template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    fwd_kernel(const __grid_constant__ Params p) {
    constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kMT = Tr::kMT, kNT = Tr::kNT, kDT = Tr::kDT,
                  kWR = Tr::kWarpRows;
    using QT = typename Tr::QTile;
    using KT = typename Tr::KVTile;

    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;

    const int mblk = p.reverse_m ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                                 : static_cast<int>(blockIdx.x);
    const int hh = blockIdx.y;
    const int b = static_cast<int>(blockIdx.z) / p.num_splits;
    const int split = static_cast<int>(blockIdx.z) - b * p.num_splits;

    // ---- this sequence ------------------------------------------------------------------------
    const cuda::SeqInfo si = cuda::seq_info(p, b);
    const int sq = si.sq, sk = si.sk;
    const bool varlen = p.cu_q != nullptr;
    const int64_t qoff = varlen ? si.q_row0 * p.q_rs : b * p.q_bs;
    const int64_t koff = varlen ? si.k_row0 * p.k_rs : b * p.k_bs;
    const int64_t voff = varlen ? si.k_row0 * p.v_rs : b * p.v_bs;
    const int G = p.pack;
    const int prows = sq * G;
    const int m0 = mblk * kBM;
    if (m0 >= prows) return;
    const int kvh = G > 1 ? hh : hh / p.group;
    const int hbase = G > 1 ? hh * G : hh;
    const int d = p.head_dim;

    const uint16_t *qg = static_cast<const uint16_t *>(p.q) + qoff;
    const uint16_t *kg = static_cast<const uint16_t *>(p.k) + koff + kvh * p.k_hs;
    const uint16_t *vg = static_cast<const uint16_t *>(p.v) + voff + kvh * p.v_hs;

    // ---- visible key tiles of this CTA (and of this split) -------------------------------------
    const int off = sk - sq;
    const int qlo = m0 / G;
    const int qhi = (min(m0 + kBM, prows) - 1) / G;
    const cuda::KeyTiles kt = cuda::key_tiles(p, qlo, qhi, sk, off, kBN);
    int nb_first = 0, nb_last = -1;
    if (kt.first <= kt.last) {
        const int per = (kt.last - kt.first + p.num_splits) / p.num_splits;
        nb_first = kt.first + split * per;
        nb_last = min(kt.last, nb_first + per - 1);
    }

    const bool warp_active = m0 + warp * kWR < prows;

    // ---- shared memory -----------------------------------------------------------------------
    const uint32_t s_q = cuda::smem_addr(smem);
    const uint32_t s_kv = s_q + Tr::kQBytes;  // stage s: K at s_kv + 2*s*kKVBytes, V after it
    // Lane bases for ldmatrix (see SwizzledTile): Q/V use rows lane%16 and chunk bit lane/16, K
    // uses rows (lane%8) + 8*(lane/16) and chunk bit (lane/8)%2.
    const int lr_a = lane & 15, lb_a = lane >> 4;
    const int lr_k = (lane & 7) | ((lane >> 4) << 3), lb_k = (lane >> 3) & 1;
    const uint32_t q_f = QT::lane_base_full(s_q + warp * kWR * 128, lr_a, lb_a);
    const uint32_t q_h = QT::lane_base_half(s_q + warp * kWR * 64, lr_a, lb_a);
    const uint32_t k_f0 = KT::lane_base_full(s_kv, lr_k, lb_k);
    const uint32_t k_h0 = KT::lane_base_half(s_kv, lr_k, lb_k);
    const uint32_t v_f0 = KT::lane_base_full(s_kv + Tr::kKVBytes, lr_a, lb_a);
    const uint32_t v_h0 = KT::lane_base_half(s_kv + Tr::kKVBytes, lr_a, lb_a);

    float O[kMT][kDT][4];
    float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) O[mt][dt][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    const float sl2 = p.score_log2;

    // ---- main loop: key tiles nb_last down to nb_first ----------------------------------------
    if (nb_first <= nb_last) {
        if (G == 1)
            load_tile<Tr, kBM>(s_q, qg + hbase * p.q_hs, m0, p.q_rs, prows - m0, d, tid);
        else
            load_q<Tr>(s_q, qg, p.q_rs, p.q_hs, m0, prows, G, hbase, d, tid);
        load_tile<Tr, kBN>(s_kv, kg, nb_last * kBN, p.k_rs, sk - nb_last * kBN, d, tid);
        cuda::cp_async_commit();
        // The first V tile goes out with Q and K (both buffer schemes), so that the first
        // iteration waits for one memory round trip, not two.
        load_tile<Tr, kBN>(s_kv + Tr::kKVBytes, vg, nb_last * kBN, p.v_rs, sk - nb_last * kBN, d,
                           tid);
        cuda::cp_async_commit();
        // Tiles loaded inside the loop lie below nb_last, so all their rows are in range (only a
        // sequence's last key tile can be partial): they are loaded with kAllRows.
        // One K/V tile. kMasked: edge tile that needs the element mask (a separate copy of the
        // body, so the steady state carries no mask code or registers).
        auto iteration = [&](const int nb, const int it, auto masked) {
            constexpr bool kMasked = decltype(masked)::value;
            const uint32_t st_off = Tr::kStages == 2 ? (it & 1) * 2 * Tr::kKVBytes : 0;
            if constexpr (Tr::kStages == 2) {
                cuda::cp_async_wait<1>();  // K[nb] landed (V[nb] may still be in flight)
                __syncthreads();           // ... for every thread; the other buffer is free
                const uint32_t nxt = s_kv + (((it + 1) & 1) * 2 * Tr::kKVBytes);
                if (nb > nb_first) {
                    const int n0 = (nb - 1) * kBN;
                    load_tile<Tr, kBN, true>(nxt, kg, n0, p.k_rs, sk - n0, d, tid);
                    cuda::cp_async_commit();
                    load_tile<Tr, kBN, true>(nxt + Tr::kKVBytes, vg, n0, p.v_rs, sk - n0, d, tid);
                    cuda::cp_async_commit();
                } else {
                    cuda::cp_async_commit();
                    cuda::cp_async_commit();
                }
            } else if (it == 0) {
                cuda::cp_async_wait<1>();  // Q and K[nb] landed (V[nb], from the prologue, may not)
                __syncthreads();
            } else {
                cuda::cp_async_wait<0>();  // K[nb] landed
                __syncthreads();           // every warp is done with V[nb+1]
                load_tile<Tr, kBN, true>(s_kv + Tr::kKVBytes, vg, nb * kBN, p.v_rs, sk - nb * kBN, d,
                                         tid);
                cuda::cp_async_commit();
            }

            // A warp past the last query row (warp_active false) skips the math. With kEarlyK it
            // must still reach the barrier between the S GEMM and the softmax; it then leaves the
            // iteration, whose remaining steps have no barrier.
            uint32_t P[kMT][Tr::kVS][4];
            if (warp_active || Tr::kEarlyK) {
                float S[kMT][kNT][4];
                if (warp_active) gemm_qk<Tr, E>(S, q_f, q_h, k_f0 + st_off, k_h0 + st_off);
                if constexpr (Tr::kEarlyK) {
                    wait_v_load_next_k<Tr>(s_kv, kg, nb, nb_first, p.k_rs, sk, d, tid);
                    if (!warp_active) return;
                }
                if (p.softcap_scale != 0.f)
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt) cuda::softcap_scores(S[mt], p.softcap_scale);
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt) {
                    if constexpr (kMasked) {
                        int rdiag[2];
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            int qpos, head;
                            unpack_row(m0 + warp * kWR + mt * 16 + h * 8 + g, G, hbase, qpos, head);
                            rdiag[h] = qpos + off;
                        }
                        cuda::mask_scores(S[mt], rdiag, nb * kBN + 2 * t, sk, p.right_i, p.left_i);
                    }
                    float alpha[2];
                    cuda::softmax_step<E>(S[mt], row_max[mt], row_sum[mt], sl2, P[mt], alpha);
                    // (Skipping this when no row's max moved, behind a warp vote, measured 2-3%
                    // slower at head dim 64 and no better elsewhere on the H200.)
#pragma unroll
                    for (int dt = 0; dt < kDT; ++dt) {
                        O[mt][dt][0] *= alpha[0];
                        O[mt][dt][1] *= alpha[0];
                        O[mt][dt][2] *= alpha[1];
                        O[mt][dt][3] *= alpha[1];
                    }
                }
            }

            if constexpr (Tr::kStages == 2) {
                cuda::cp_async_wait<2>();  // V[nb] landed
                __syncthreads();
            } else if constexpr (!Tr::kEarlyK) {
                wait_v_load_next_k<Tr>(s_kv, kg, nb, nb_first, p.k_rs, sk, d, tid);
            }
            if (warp_active) gemm_pv<Tr, E>(O, P, v_f0 + st_off, v_h0 + st_off);
        };
        int it = 0;
        for (int nb = nb_last; nb >= nb_first; --nb, ++it) {
            if (kt.masked(nb))
                iteration(nb, it, std::true_type{});
            else
                iteration(nb, it, std::false_type{});
        }
    }

    // ---- epilogue ------------------------------------------------------------------------------
    // Read again (not kept from the prologue): the loop holds no registers for these offsets.
    const cuda::SeqInfo se = cuda::seq_info(p, b);
    const int64_t grow0 = se.q_row0;
    const int64_t ooff = varlen ? se.q_row0 * p.o_rs : b * p.o_bs;
    float inv[kMT][2], lse[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) cuda::finish_rows(row_max[mt], row_sum[mt], sl2, inv[mt], lse[mt]);

    if (p.num_splits > 1) {
        store_split_partials<Tr>(p, O, inv, lse, m0, prows, G, hbase, split, grow0);
        return;
    }
    store_lse<Tr>(p, lse, m0, prows, G, hbase, b, grow0);
    if (!warp_active) return;
    store_o<Tr, E>(p, O, inv, s_q, static_cast<uint16_t *>(p.o) + ooff, m0, prows, G, hbase);
}

template <int kD, bool kSmall, class E>
cudaError_t launch_fwd(const Params &p, cudaStream_t stream) {
    using Tr = typename TraitsFor<kD, kSmall>::type;
    auto kernel = fwd_kernel<Tr, E>;
    static unsigned long long optin_done = 0;  // one per instantiation of this function
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    const int64_t prow_max = static_cast<int64_t>(p.seqlen_q) * p.pack;
    const dim3 grid(static_cast<unsigned>((prow_max + Tr::kBM - 1) / Tr::kBM),
                    static_cast<unsigned>(p.pack > 1 ? p.heads_kv : p.heads_q),
                    static_cast<unsigned>(p.batch * p.num_splits));
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    return cudaSuccess;
}

// Launcher body of one compiled head dim (both element types; the small configuration only where
// one is compiled for kD).
template <int kD>
cudaError_t launch_hdim(const Params &p, bool bf16, bool small, cudaStream_t s) {
    if constexpr (has_small_variant(kD)) {
        if (small)
            return bf16 ? launch_fwd<kD, true, cuda::Bf16>(p, s)
                        : launch_fwd<kD, true, cuda::Fp16>(p, s);
    }
    (void)small;
    return bf16 ? launch_fwd<kD, false, cuda::Bf16>(p, s) : launch_fwd<kD, false, cuda::Fp16>(p, s);
}

}  // namespace fa2
}  // namespace flashattn
