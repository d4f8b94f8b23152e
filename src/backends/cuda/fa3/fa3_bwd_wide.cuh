// The FA3 backward's 80-key layout (since stop 39): head dims 136..256, in the
// shape FlashAttention-3 gives its own d 256 backward on sm_90 (64 query rows x 80 keys, S not
// transposed, dK / dV and dQ with the head dim as M). The split layout (fa3_bwd_kernel.cuh) holds 64
// keys per CTA, so each step reloads 64 KB of Q / dO and adds 64 KB of dQ for 64 x 64 pairs; here
// the same traffic serves 64 x 80 (a fifth less per FLOP), which is what bounds head dim 256.
//
// One CTA per (80-key block, kv head, sequence), two consumer warpgroups of 255 registers (bwd_kernel's
// shape: thread 0 also issues the TMA loads: K / V once, Q into a ring of two stages, dO into one
// buffer). Per step, warpgroup w (keys 40w .. 40w + 39 of the block):
//   S = Q K_w^T, dP = dO V_w^T              wgmma m64n40, both operands K-major (rows = queries,
//                                           so the LSE and row_dot are two per thread, loaded
//                                           from global memory under the GEMMs)
//   P, dS                                   as the split layout's, in the row orientation
//   P^T, dS^T -> shared pages               stmatrix .trans into [80 keys][64 queries] pages
//                                           (double-buffered by step parity: one CTA barrier per
//                                           step, after the stores)
//   dV^T += dO^T P, dK^T += Q^T dS          wgmma m64n80, A = dO / Q pages MN-major (M = the
//                                           warpgroup's head-dim columns 128w .., one m64 tile
//                                           per 64-column page), B = the pages K-major
//   dQ += dS K                              per 64-column page of the warpgroup's columns: A = the
//                                           dS^T page, B = K, both MN-major, K = 80 (five k16),
//                                           red.v4 in fragment order (the split layout's
//                                           accumulator and convert)
// dO is released (one buffer) as soon as dV^T's GEMM retires and thread 0 refills it there; Q after
// dK^T's. Registers per thread: dK^T and dV^T 2 x 80, S and dP 20 each, a dQ page 32.
// Both modes (the deterministic one takes turns around the dQ adds, as the split layout does);
// ALiBi keeps the split layout (finalize: fa3_bwd_host.cpp wide_layout).
#pragma once

#include <cstddef>

#include "backends/cuda/fa3/fa3_bwd_kernel.cuh"

namespace flashattn {
namespace fa3 {

template <int kD_>
struct BwdWideTraits {
    static constexpr int kD = kD_;        // padded head dim, a multiple of 128
    static constexpr int kBN = kBwdWideBN;  // keys per CTA
    static constexpr int kKeysW = kBN / 2;  // keys of a warpgroup's S and dP (wgmma N)
    static constexpr int kPages = kD / 64;
    static constexpr int kWPages = kPages / 2;  // 64-column pages of a warpgroup's dK^T, dV^T (m64 tiles) and dQ
    static constexpr int kQPage = kBwdBM * 128;  // one 64-column page of a Q / dO tile
    static constexpr int kKPage = kBN * 128;     // ... of the K / V tile
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKBytes = kPages * kKPage;
    static constexpr int kPageBytes = kBN * kBwdBM * 2;  // [80 keys][64 queries] 16-bit: P^T or dS^T
    static constexpr int kKOff = 0;
    static constexpr int kVOff = kKBytes;
    static constexpr int kQOff = 2 * kKBytes;          // Q stage b at kQOff + b kQBytes
    static constexpr int kDOOff = kQOff + 2 * kQBytes;  // dO, one buffer
    static constexpr int kPTOff = kDOOff + kQBytes;     // step parity b: P^T at kPTOff + 2 b kPageBytes, dS^T after it
    static constexpr int kBarOff = kPTOff + 4 * kPageBytes;
    // The deterministic mode's turn table (keys-fastest grids: build_turn_table), kBwdTurnTableMax
    // ints in the barriers' padded 1 KB, as BwdTraits'.
    static constexpr int kTurnOff = kBarOff + 128;
    static constexpr int kSmemBytes = bwd_wide_smem_bytes(kD);
    static constexpr int kAcc = kBN / 2;  // fp32 accumulators per thread of an m64n80 tile
    static_assert(kD % 128 == 0 && kBwdBM == 64, "whole 64-column pages per warpgroup, one 128-byte row of queries");
    static_assert(kPTOff % 1024 == 0 && kPageBytes % 1024 == 0 && kKPage % 1024 == 0, "SW128 tiles need 1 KB alignment");
    static_assert(kBarOff + 1024 + 1024 == kSmemBytes && sizeof(BwdBarriers) <= 128 &&
                      128 + 4 * kBwdTurnTableMax <= 1024,
                  "layout and budget disagree");
};

// The barriers, in BwdBarriers' slots: the Q ring's two stages, and the dO buffer in the third. As
// 32-bit shared addresses from the CTA's shared base (no 64-bit pointer kept across the loop).
constexpr int kWideDoSlot = 2;
static_assert(kBwdMaxStages > kWideDoSlot, "the dO buffer's barriers");
template <class Tr>
__device__ __forceinline__ uint32_t wide_q_full(uint32_t base, int b) {
    return base + Tr::kBarOff + static_cast<uint32_t>(offsetof(BwdBarriers, qdo_full)) + 8 * b;
}
template <class Tr>
__device__ __forceinline__ uint32_t wide_q_empty(uint32_t base, int b) {
    return base + Tr::kBarOff + static_cast<uint32_t>(offsetof(BwdBarriers, qdo_empty)) + 8 * b;
}
template <class Tr>
__device__ __forceinline__ uint32_t wide_do_full(uint32_t base) { return wide_q_full<Tr>(base, kWideDoSlot); }
template <class Tr>
__device__ __forceinline__ uint32_t wide_do_empty(uint32_t base) { return wide_q_empty<Tr>(base, kWideDoSlot); }

// One thread: the step's Q or dO tile (every 64-column page) by TMA into dst on `bar`.
template <class Tr>
__device__ __forceinline__ void wide_load_tile(const BwdParams &p, const CUtensorMap *tm, const BwdBlock &a, BwdStep st,
                                               uint32_t dst, uint32_t bar) {
    const bool varlen = p.cu_q != nullptr;
    const int32_t row = static_cast<int32_t>(varlen ? a.q_row0 + st.m0 : st.m0);
    const int32_t bc = varlen ? 0 : a.b;
    cuda::mbar_arrive_expect_tx_s(bar, Tr::kQBytes);  // out-of-bounds boxes are zero-filled and count
#pragma unroll
    for (int pg = 0; pg < Tr::kPages; ++pg) cuda::tma_load_4d_s(dst + pg * Tr::kQPage, tm, bar, 64 * pg, row, st.hq, bc);
}

// Thread 0 (also a consumer of warpgroup 0): K, V and the first steps' Q / dO before the loop ...
template <class Tr>
__device__ __forceinline__ void wide_load_first(const BwdParams &p, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                                const CUtensorMap *tm_v, const CUtensorMap *tm_do, const BwdBlock &a,
                                                uint32_t base, int nsteps) {
    load_k_v<Tr>(p, tm_k, tm_v, a);
    wide_load_tile<Tr>(p, tm_q, a, bwd_step(p, a, 0), base + Tr::kQOff, wide_q_full<Tr>(base, 0));
    wide_load_tile<Tr>(p, tm_do, a, bwd_step(p, a, 0), base + Tr::kDOOff, wide_do_full<Tr>(base));
    if (nsteps > 1)
        wide_load_tile<Tr>(p, tm_q, a, bwd_step(p, a, 1), base + Tr::kQOff + Tr::kQBytes, wide_q_full<Tr>(base, 1));
}
// ... at the top of step s, Q of step s + 1 into the stage step s - 1 released (every consumer warp,
// after its dK^T GEMM of that step) ...
template <class Tr>
__device__ __forceinline__ void wide_refill_q(const BwdParams &p, const CUtensorMap *tm_q, const BwdBlock &a,
                                              uint32_t base, int s, BwdStep next) {
    const int b = (s + 1) & 1;
    cuda::mbar_wait_s(wide_q_empty<Tr>(base, b), static_cast<uint32_t>(((s - 1) >> 1) & 1));
    wide_load_tile<Tr>(p, tm_q, a, next, base + Tr::kQOff + b * Tr::kQBytes, wide_q_full<Tr>(base, b));
}
// ... and dO of step s + 1 once every consumer warp's dV^T GEMM of step s has retired (the
// warpgroups met at the step's page barrier just before issuing it, so the wait is short).
template <class Tr>
__device__ __forceinline__ void wide_refill_do(const BwdParams &p, const CUtensorMap *tm_do, const BwdBlock &a,
                                               uint32_t base, int s, BwdStep next) {
    cuda::mbar_wait_s(wide_do_empty<Tr>(base), static_cast<uint32_t>(s & 1));
    wide_load_tile<Tr>(p, tm_do, a, next, base + Tr::kDOOff, wide_do_full<Tr>(base));
}

// The LSE and row_dot of the thread's two query rows (16 warp + g + 8h of the step), loaded while
// S and dP's GEMMs run; rows past the sequence get LSE -inf, so that they take no part (as rows that
// saw no key).
__device__ __forceinline__ void wide_rows(const BwdParams &p, const BwdBlock &a, BwdStep st, float (&lse)[2],
                                          float (&rd)[2]) {
    const int wtid = threadIdx.x & 127;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int q = st.m0 + 16 * (wtid >> 5) + ((wtid & 31) >> 2) + 8 * h;
        const bool ok = q < a.sq;
        lse[h] = ok ? p.lse[cuda::lse_offset(p, a.b, st.hq, a.q_row0, q)] : -INFINITY;
        rd[h] = ok ? p.row_dot[static_cast<int64_t>(st.hq) * p.total_rows + a.q_row0 + q] : 0.f;
    }
}

// step_keys_unmasked for warpgroup wg's 40 keys. Warpgroup-uniform.
template <class Tr>
__device__ __forceinline__ bool wide_step_unmasked(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg) {
    return step_keys_unmasked(p, a, st, a.n0 + Tr::kKeysW * wg, Tr::kKeysW);
}

// In place: S -> P for the thread's two query rows (16 warp + g + 8h of the step) and its keys
// 8j + 2t + e of the warpgroup's 40 (register 4j + 2h + e). kUnmasked: every pair takes part
// (wide_step_unmasked and no -inf LSE in the warp); else each pair is tested against its row's
// visible keys (mask.cuh's rule: first_visible_key .. last_visible_key, sink keys below the first).
// kCap: the soft cap's tanh, whose derivative 1 - x^2 goes to g for the gradient.
template <class Tr, bool kUnmasked, bool kCap>
__device__ __forceinline__ void wide_probs(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                           const float (&lse)[2], float (&S)[Tr::kKeysW / 2],
                                           float (&g)[kCap ? Tr::kKeysW / 2 : 1]) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, t = lane & 3;
    // per row h, relative to the thread's first key (so that a pair's key is the immediate 8j + e)
    int lo[2] = {0, 0}, hi[2] = {0, 0}, sink = 0;
    if constexpr (!kUnmasked) {
        const int k0 = a.n0 + Tr::kKeysW * wg + 2 * t;
        sink = p.sink_tokens - k0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rdiag = st.m0 + 16 * warp + (lane >> 2) + 8 * h + a.off;
            lo[h] = cuda::first_visible_key(rdiag, p.left_i) - k0;
            hi[h] = cuda::last_visible_key(rdiag, p.right_i, a.sk) - k0;
        }
    }
    const float sl2 = p.score_log2, cap = p.softcap_scale;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const bool row_sees = kUnmasked || lse[h] != -INFINITY;
        const float lse2 = lse[h] * 1.4426950408889634f;
#pragma unroll
        for (int j = 0; j < Tr::kKeysW / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 4 * j + 2 * h + e, c = 8 * j + e;
                const bool vis = kUnmasked || (row_sees && c <= hi[h] && (c >= lo[h] || c < sink));
                float x = S[i];
                if constexpr (kCap) {
                    x = cuda::tanh_accurate(x * cap);
                    g[i] = 1.f - x * x;  // d(cap * tanh(raw * scale / cap)) / d(raw * scale)
                }
                S[i] = vis ? cuda::fast_exp2(fmaf(x, sl2, -lse2)) : 0.f;
            }
    }
}

// dP -> dS = P (dP - row_dot) (x g with a soft cap) in place, P in fp32 (zero where a pair takes
// no part, so no mask here). (P rounded to 16 bits here, as dV's GEMM takes it, saved 10 registers
// and tripled the gradients' error against torch-flash: 3.6e-3 against 1.1e-3, stop 39.)
template <class Tr, bool kCap>
__device__ __forceinline__ void wide_grads(const float (&rd)[2], const float (&P)[Tr::kKeysW / 2],
                                           const float (&g)[kCap ? Tr::kKeysW / 2 : 1], float (&dP)[Tr::kKeysW / 2]) {
#pragma unroll
    for (int i = 0; i < Tr::kKeysW / 2; ++i) {
        dP[i] = P[i] * (dP[i] - rd[(i >> 1) & 1]);
        if constexpr (kCap) dP[i] *= g[i];
    }
}

// The accumulator's n8 tiles as 16-bit pairs: register 2j + h holds row half h of key tile j.
template <class Tr, class E>
__device__ __forceinline__ void pack_rows(const float (&x)[Tr::kKeysW / 2], uint32_t (&f)[Tr::kKeysW / 8 * 2]) {
#pragma unroll
    for (int j = 0; j < Tr::kKeysW / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) f[2 * j + h] = cuda::pack2<E>(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]);
}

// The packed values (pack_rows) stored transposed into a [80 keys][64 queries] SW128 page: the
// warp's 16 queries x the warpgroup's 40 keys are ten 8x8 blocks (key tile j, row half h:
// register 2j + h), stored by stmatrix .trans, whose lane 8m + c gives block m's stored row c: key
// 40 wg + 8j + c, queries 16 warp + 8h .. + 7 (one 16-byte chunk).
template <class Tr>
__device__ __forceinline__ void store_transposed(uint32_t s_page, int wg, const uint32_t (&f)[Tr::kKeysW / 8 * 2]) {
    static_assert(Tr::kKeysW == 40, "two x4 stores and one x2 per warp");
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, c = lane & 7, m = lane >> 3;
    const auto row_addr = [&](int j, int h) {
        const int row = Tr::kKeysW * wg + 8 * j + c, chunk = 2 * warp + h;
        return s_page + row * 128 + ((chunk ^ (row & 7)) << 4);
    };
    cuda::stmatrix_x4_trans({f[0], f[1], f[2], f[3]}, row_addr(m >> 1, m & 1));
    cuda::stmatrix_x4_trans({f[4], f[5], f[6], f[7]}, row_addr(2 + (m >> 1), m & 1));
    cuda::stmatrix_x2_trans(f[8], f[9], row_addr(4, m & 1));
}

// P and dS of the step from S and dP's GEMMs (issued and committed in that order, not waited for),
// stored transposed into the step's pages. One form per mask / cap case (straight-line code).
template <class Tr, class E, bool kUnmasked, bool kCap>
__device__ __forceinline__ void wide_probs_and_grads(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                     const float (&lse)[2], const float (&rd)[2],
                                                     float (&S)[Tr::kKeysW / 2], float (&dP)[Tr::kKeysW / 2],
                                                     uint32_t s_pt, uint32_t s_dst) {
    float g[kCap ? Tr::kKeysW / 2 : 1];
    uint32_t f[Tr::kKeysW / 8 * 2];
    cuda::wgmma_wait<1>();  // S
    cuda::fence_operands(S);
    wide_probs<Tr, kUnmasked, kCap>(p, a, st, wg, lse, S, g);
    pack_rows<Tr, E>(S, f);
    store_transposed<Tr>(s_pt, wg, f);
    cuda::wgmma_wait<0>();  // dP
    cuda::fence_operands(dP);
    wide_grads<Tr, kCap>(rd, S, g, dP);
    pack_rows<Tr, E>(dP, f);
    store_transposed<Tr>(s_dst, wg, f);
}

template <class Tr, class E>
__device__ __forceinline__ void wide_probs_and_grads_any(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                         bool unmasked, const float (&lse)[2], const float (&rd)[2],
                                                         float (&S)[Tr::kKeysW / 2], float (&dP)[Tr::kKeysW / 2],
                                                         uint32_t s_pt, uint32_t s_dst) {
    if (p.softcap_scale != 0.f) {
        if (unmasked)
            wide_probs_and_grads<Tr, E, true, true>(p, a, st, wg, lse, rd, S, dP, s_pt, s_dst);
        else
            wide_probs_and_grads<Tr, E, false, true>(p, a, st, wg, lse, rd, S, dP, s_pt, s_dst);
    } else {
        if (unmasked)
            wide_probs_and_grads<Tr, E, true, false>(p, a, st, wg, lse, rd, S, dP, s_pt, s_dst);
        else
            wide_probs_and_grads<Tr, E, false, false>(p, a, st, wg, lse, rd, S, dP, s_pt, s_dst);
    }
}

// Issues dV^T += dO^T P (or dK^T += Q^T dS) for the warpgroup's head-dim columns (one m64 tile per
// 64-column page of the tile `s_rows_tile`), K = the step's 64 queries, B = the P^T (dS^T) page.
template <class Tr, class E>
__device__ __forceinline__ void issue_transposed_grad(float (&acc)[Tr::kWPages][Tr::kAcc], uint32_t s_tile, int wg,
                                                      uint32_t s_page) {
    const uint64_t dpage = cuda::make_desc_sw128(s_page);
#pragma unroll
    for (int i = 0; i < Tr::kWPages; ++i) {
        const uint64_t dt = cuda::make_desc_sw128(s_tile + (Tr::kWPages * wg + i) * Tr::kQPage, 1024, Tr::kQPage);
#pragma unroll
        for (int kk = 0; kk < kBwdBM / 16; ++kk)
            cuda::wgmma_ss_t<E, Tr::kBN, 1, 0>(acc[i], dt + static_cast<uint64_t>((kk * 16 * 128) >> 4),
                                               dpage + static_cast<uint64_t>((kk * 32) >> 4), 1);
    }
}

template <class Tr>
__device__ __forceinline__ void fence_all(float (&acc)[Tr::kWPages][Tr::kAcc]) {
#pragma unroll
    for (int i = 0; i < Tr::kWPages; ++i) cuda::fence_operands(acc[i]);
}

// One 64-column page pg of the warpgroup's dQ added to the fp32 accumulator (accumulate_dq_red's
// vector reductions; the warp's 16-row band skipped past the sequence).
template <class Tr>
__device__ __forceinline__ void wide_red_dq_page(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg, int pg,
                                                 const float (&acc)[32]) {
    if (!dq_band_live(a, st)) return;
    const int col0 = wg * (Tr::kD / 2);
    red_dq_page(dq_lane_band(p, a, st, col0), col0, cuda::dq_frag_cols(p.head_dim), pg, acc);
}

// Step s (Q stage b = s & 1) for consumer warpgroup wg; thread 0 also refills Q and dO for step
// s + 1 (`next`, when there is one). kDet: the dQ adds take the key block's turn (turn_of, as the
// split layout's accumulate_dq_red): thread 0 waits for it while dQ's first page is in flight, the
// CTA meets, every thread adds; the turn's counter is returned for thread 0 to move on after the
// next CTA barrier (release_turn), which orders every thread's adds before it.
template <class Tr, class E, bool kDet>
__device__ __forceinline__ int *wide_step(const BwdParams &p, const CUtensorMap *tm_q, const CUtensorMap *tm_do,
                                          const BwdBlock &a, uint32_t base, int s, BwdStep st, bool has_next,
                                          BwdStep next, int wg, int *held, float (&dKt)[Tr::kWPages][Tr::kAcc],
                                          float (&dVt)[Tr::kWPages][Tr::kAcc]) {
    const int b = s & 1;
    const uint32_t s_q = base + Tr::kQOff + b * Tr::kQBytes, s_do = base + Tr::kDOOff;
    const uint32_t s_pt = base + Tr::kPTOff + b * 2 * Tr::kPageBytes, s_dst = s_pt + Tr::kPageBytes;
    const int lane = threadIdx.x & 31;

    if (threadIdx.x == 0 && has_next && s >= 1) wide_refill_q<Tr>(p, tm_q, a, base, s, next);
    cuda::mbar_wait_s(wide_q_full<Tr>(base, b), static_cast<uint32_t>((s >> 1) & 1));
    cuda::mbar_wait_s(wide_do_full<Tr>(base), static_cast<uint32_t>(s & 1));
    float S[Tr::kKeysW / 2], dP[Tr::kKeysW / 2];
    cuda::fence_operands(S);
    cuda::fence_operands(dP);
    {
        const uint32_t keys = Tr::kKeysW * wg * 128;  // the warpgroup's first key row
        const uint64_t dq = cuda::make_desc_sw128(s_q), ddo = cuda::make_desc_sw128(s_do);
        const uint64_t dk = cuda::make_desc_sw128(base + Tr::kKOff + keys), dv = cuda::make_desc_sw128(base + Tr::kVOff + keys);
        cuda::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < Tr::kD / 16; ++ks)
            cuda::wgmma_ss<E, Tr::kKeysW>(S, dq + k_step(ks, Tr::kQPage), dk + k_step(ks, Tr::kKPage), ks > 0);
        cuda::wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < Tr::kD / 16; ++ks)
            cuda::wgmma_ss<E, Tr::kKeysW>(dP, ddo + k_step(ks, Tr::kQPage), dv + k_step(ks, Tr::kKPage), ks > 0);
        cuda::wgmma_commit();
    }
    float lse[2], rd[2];
    wide_rows(p, a, st, lse, rd);
    const bool unmasked = wide_step_unmasked<Tr>(p, a, st, wg) &&
                          __all_sync(0xffffffffu, (lse[0] != -INFINITY) & (lse[1] != -INFINITY));
    wide_probs_and_grads_any<Tr, E>(p, a, st, wg, unmasked, lse, rd, S, dP, s_pt, s_dst);
    fence_proxy_async_smem();  // the generic-proxy stores, before the wgmma reads them
    // Both warpgroups' halves of the pages. Every thread is also past step s - 1, whose GEMMs read
    // the other parity's pages, so step s + 1 may overwrite those (step s - 1's barrier covered
    // step s - 2's reads of these), and past its dQ adds: the previous turn moves on.
    __syncthreads();
    if constexpr (kDet) release_turn(held);

    const uint32_t s_kw = base + Tr::kKOff + Tr::kWPages * wg * Tr::kKPage;  // K's first page of the warpgroup's columns
    fence_all<Tr>(dVt);
    fence_all<Tr>(dKt);
    float acc[32];
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
    issue_transposed_grad<Tr, E>(dVt, s_do, wg, s_pt);
    cuda::wgmma_commit();
    issue_transposed_grad<Tr, E>(dKt, s_q, wg, s_dst);
    cuda::wgmma_commit();
    dq_page_mmas<Tr, E, Tr::kBN>(acc, s_dst, s_kw);
    cuda::wgmma_commit();
    cuda::wgmma_wait<2>();  // dV^T: dO is free
    fence_all<Tr>(dVt);
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive_s(wide_do_empty<Tr>(base));
    if (threadIdx.x == 0 && has_next) wide_refill_do<Tr>(p, tm_do, a, base, s, next);
    BwdTurn turn{nullptr, 0};
    if constexpr (kDet) {
        if (threadIdx.x == 0) turn = wait_turn<Tr>(p, a, st);
    }
    cuda::wgmma_wait<0>();  // dK^T and dQ's first page: Q is free
    fence_all<Tr>(dKt);
    cuda::fence_operands(acc);
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive_s(wide_q_empty<Tr>(base, b));
    if constexpr (kDet) __syncthreads();  // the turn
    wide_red_dq_page<Tr>(p, a, st, wg, 0, acc);
#pragma unroll
    for (int pg = 1; pg < Tr::kWPages; ++pg) {
        cuda::fence_operands(acc);
        cuda::wgmma_fence();
        dq_page_mmas<Tr, E, Tr::kBN>(acc, s_dst, s_kw + pg * Tr::kKPage);
        cuda::wgmma_commit();
        cuda::wgmma_wait<0>();
        cuda::fence_operands(acc);
        wide_red_dq_page<Tr>(p, a, st, wg, pg, acc);
    }
    return turn.sem;
}

// dK * scale and dV of the warpgroup's columns for the block's keys (zeros where no query saw a
// key), from the transposed accumulators: register 4j + 2h + e of m64 tile i is head-dim column
// 64 (kWPages wg + i) + 16 warp + g + 8h, key 8j + 2t + e. 16-bit stores, once per CTA.
template <class Tr, class E>
__device__ __forceinline__ void wide_store_dk_dv(const BwdParams &p, const BwdBlock &a, int wg,
                                                 const float (&dKt)[Tr::kWPages][Tr::kAcc],
                                                 const float (&dVt)[Tr::kWPages][Tr::kAcc]) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    const KvGradOrigins o = kv_grad_origins(p, a);
    uint16_t *dkg = o.dk, *dvg = o.dv;
#pragma unroll
    for (int i = 0; i < Tr::kWPages; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int col = 64 * (Tr::kWPages * wg + i) + 16 * warp + g + 8 * h;
            const bool k_ok = col < p.head_dim, v_ok = col < p.head_dim_v;
#pragma unroll
            for (int j = 0; j < Tr::kBN / 8; ++j) {
                const int key = a.n0 + 8 * j + 2 * t;
                const int r = 4 * j + 2 * h;
                const uint32_t kp = cuda::pack2<E>(dKt[i][r] * p.scale, dKt[i][r + 1] * p.scale);
                const uint32_t vp = cuda::pack2<E>(dVt[i][r], dVt[i][r + 1]);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (key + e >= a.sk) continue;
                    if (k_ok) dkg[(key + e) * p.dk_rs + col] = static_cast<uint16_t>(kp >> (16 * e));
                    if (v_ok) dvg[(key + e) * p.dv_rs + col] = static_cast<uint16_t>(vp >> (16 * e));
                }
            }
        }
}

// The 80-key layout's kernel (p.block_n == kBwdWideBN; kDet: the deterministic mode's turns):
// two consumer warpgroups, thread 0 also the TMA producer, as bwd_kernel. (A producer warpgroup, as
// bwd_det_kernel's, leaves the consumers 240 registers: ptxas then kept one of the four m64n80
// accumulators in local memory around every step; the step needs ~236-246 with the 160 of dK^T and
// dV^T, and 256 threads give it 255.)
template <class Tr, class E, bool kDet>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_wide_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                    const __grid_constant__ BwdParams p) {
    extern __shared__ unsigned char smem_raw[];
    BwdBlock a = key_block<Tr>(p, smem_raw);
    if (a.n0 >= a.sk) return;  // the whole CTA: a key block past this sequence's end
    init_ring_barriers<kWideDoSlot + 1>(a);  // two Q stages and the dO buffer

    const int wg = cuda::warp_uniform(threadIdx.x / 128);  // so that its wgmma descriptors are uniform registers
    float dKt[Tr::kWPages][Tr::kAcc], dVt[Tr::kWPages][Tr::kAcc];
#pragma unroll
    for (int i = 0; i < Tr::kWPages; ++i)
#pragma unroll
        for (int r = 0; r < Tr::kAcc; ++r) dKt[i][r] = dVt[i][r] = 0.f;
    if (set_walk<Tr, kDet>(p, a)) {
        const int nsteps = p.group * a.nmb;
        const uint32_t base = cuda::smem_addr(a.smem);
        // the deterministic mode's turns, staged in the pages (first written in step 0)
        if (kDet && bwd_turn_table(p.grid_order)) build_turn_table<Tr>(p, a, threadIdx.x, kBwdThreads, 0, base + Tr::kPTOff);
        if (threadIdx.x == 0) wide_load_first<Tr>(p, &tm_q, &tm_k, &tm_v, &tm_do, a, base, nsteps);
        cuda::mbar_wait(&a.bars->kv_full, 0);
        int *held = nullptr;  // kDet: the turn thread 0 has yet to release
        WalkPos ws{0, 0}, wn = walk_pos(a, 1);  // steps s and s + 1
        for (int s = 0; s < nsteps; ++s, walk_next(a, ws), walk_next(a, wn))
            held = wide_step<Tr, E, kDet>(p, &tm_q, &tm_do, a, base, s, walk_step(p, a, ws), s + 1 < nsteps,
                                          walk_step(p, a, wn), wg, held, dKt, dVt);
        if constexpr (kDet) {
            __syncthreads();  // the last step's adds, before its turn moves on
            release_turn(held);
        }
    }
    wide_store_dk_dv<Tr, E>(p, a, wg, dKt, dVt);
}

}  // namespace fa3
}  // namespace flashattn
