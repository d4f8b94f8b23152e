// FlashAttention-2 backward main kernel for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async), and
// its launcher. Algorithm 2 of the FlashAttention-2 paper, key-block outer loop:
//
// One CTA per (key block of kBN keys, kv head, sequence) owns the whole head dim (one grid
// dimension in the order finalize chose: fa2_bwd_params.h, BwdGridOrder). It loads K_j and V_j
// once, then steps through every query block of every query head of the kv head's GQA group that
// sees any of its keys (in a fixed order), with Q_i, dO_i, LSE_i and row_dot_i double-buffered
// (the next step's cp.async runs under this step's math; fa2_bwd_gemm.cuh has the warp layouts):
//   S = Q K^T and dP = dO V^T over the whole head dim (without a cap or ALiBi, P's exponentials
//   below issue between the dP GEMM's mma: plain_probs_step);
//   P = exp2(S' * score_log2 - LSE * log2 e) with S' the soft-capped score (tanh) when a cap is
//   set, plus ALiBi's bias when slopes are set, 0 for masked keys (device/mask.cuh's rule) and
//   for rows past the sequence;
//   dS = P (dP - row_dot) (x (1 - tanh^2) with a soft cap), 0 wherever P is (selected, so a NaN
//   of a pair that takes no part stays out; only LSE = -inf marks a row without keys); P and dS
//   (16-bit) to shared memory;
//   dQ += dS K into the fp32 accumulator (vector reductions in mma fragment order,
//   device/dq_accum.cuh; in deterministic mode the key
//   blocks of one query block take turns in a fixed order, see turn_of);
//   dV += P^T dO, dK += dS^T Q in registers (before the dQ step above where dq_last holds).
// At the end dK * scale and dV are written (zeros for keys no query sees). head_dim_v != head_dim:
// the kernel of the wider one (its zero-filled columns past each tensor's width add nothing); V,
// dO and dV span head_dim_v columns, Q, K, dQ, dK head_dim. The softmax scale of dQ
// is applied by the convert kernel (fa2_bwd_prep.cu). GQA needs no dK/dV reduction across CTAs:
// the CTA walks its whole query-head group.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/dq_accum.cuh"
#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_bwd_gemm.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"
#include "backends/cuda/fa2/fa2_gemm.cuh"
#include "backends/cuda/fa2/fa2_load.cuh"
#include "backends/cuda/host/smem_optin.h"

namespace flashattn {
namespace fa2 {

// What one key block's steps share (filled once per key block).
struct BwdBlockArgs {
    const uint16_t *qg, *dog;  // Q and dO of this sequence, row 0, head 0
    int64_t q_row0;            // packed row of the sequence's first query
    int b, sq, sk, off, n0, d;
    int dv;  // V's, O's, dO's and dV's columns (head_dim_v; d: Q's, K's, dQ's, dK's)
    uint32_t smem;  // shared memory: K, V, kStages x (Q, dO), P, dS (BwdTraits sizes)
};

// LSE (as log2) and row_dot of this thread's two rows, and their visible key range relative to
// the thread's first score column (col0 = key of its column 0). s_rows: the step's LSE and
// row_dot in shared memory (load_q_do), indexed by row - m0.
struct BwdRows {
    float lse2[2], rd[2];
    int lo[2], hi[2];
};

// kUnmasked (step_unmasked holds): every row is in the sequence and sees every key of the block,
// so a row's range is all of the warp's keys or, with LSE = -inf, none: no mask rule to evaluate.
// A sink block (sink_block: it holds sink keys, TensorArgs::sink_tokens) takes each row's keys
// from 0: the keys between the sinks and the row's window are dropped after the P / dS form
// (drop_sink_hole), which keeps the form's one interval test per pair.
template <class Tr, bool kUnmasked>
__device__ __forceinline__ BwdRows load_rows(const BwdParams &p, const BwdBlockArgs &a, uint32_t s_rows, int m0,
                                             int qrow0, int col0, bool sink_block = false) {
    BwdRows r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int qpos = qrow0 + 8 * h;
        if (kUnmasked) {
            const float lse = cuda::ld_shared_f32(s_rows + (qpos - m0) * 4);
            const bool live = lse != -INFINITY;  // as below
            r.lse2[h] = live ? lse * 1.4426950408889634f : 0.f;
            r.rd[h] = cuda::ld_shared_f32(s_rows + (Tr::kBM + qpos - m0) * 4);
            r.lo[h] = 0;
            r.hi[h] = live ? Tr::kSKeys - 1 : -1;
            continue;
        }
        int lo = 0, hi = -1;  // visible keys of this row; none past the sequence's end
        float lse2 = 0.f, rd = 0.f;
        if (qpos < a.sq) {
            const float lse = cuda::ld_shared_f32(s_rows + (qpos - m0) * 4);
            rd = cuda::ld_shared_f32(s_rows + (Tr::kBM + qpos - m0) * 4);
            // -inf, and only -inf, marks a row that saw no key in the forward: it takes no part (an
            // empty key range). A NaN LSE keeps the row's keys, so exp2(S - NaN) makes them NaN.
            if (lse != -INFINITY) {
                lse2 = lse * 1.4426950408889634f;
                const int rdiag = qpos + a.off;
                lo = sink_block ? 0 : cuda::first_visible_key(rdiag, p.left_i);
                hi = cuda::last_visible_key(rdiag, p.right_i, a.sk);
            }
        }
        r.lse2[h] = lse2;
        r.rd[h] = rd;
        r.lo[h] = lo - col0;
        r.hi[h] = hi - col0;
    }
    return r;
}

// Whether every (row, key) pair of step m0 against the CTA's key block is in range and visible
// (mask.cuh's rule for the step's last row's first key and first row's last key): then no pair
// needs an element mask, only rows whose LSE is -inf stay out. CTA-uniform.
template <class Tr>
__device__ __forceinline__ bool step_unmasked(const BwdParams &p, const BwdBlockArgs &a, int m0) {
    const int64_t qhi = m0 + Tr::kBM - 1, khi = a.n0 + Tr::kBN - 1;
    return qhi < a.sq && khi < a.sk && qhi + a.off - p.left <= a.n0 && m0 + a.off + p.right >= khi;
}

// P and dS of this warp's 16 query rows against its kSKeys keys, packed in 16-bit pairs:
// P[nt][h] = columns 8nt + 2t, +1 of row g + 8h. kUnmasked: every pair of the warp's rows takes
// part (step_unmasked holds and no row's LSE is -inf, a warp vote), so nothing is selected; else
// each pair is tested against its row's key range (load_rows).
// S and dP are consumed: the soft cap (a runtime key) is applied to the whole tile first, under
// one uniform branch, so the exp2 / dS loop is straight-line code. Until stop 22 it was tested per
// element, and each element's code was a basic block of its own (a branch, the score_log2 reload
// from the constant bank, one MUFU with nothing to overlap it). ALiBi's bias joins the (capped)
// score after that, under a uniform branch of its own (al: the rows' query head and diagonals).
struct BwdAlibiRows {
    int hq;        // the step's query head (its slope)
    int rdiag[2];  // the thread's rows' diagonal keys (query + off)
    int col0;      // the key of the thread's score column 0
};
template <class Tr, class E, bool kUnmasked>
__device__ __forceinline__ void probs_and_grads(const BwdParams &p, const BwdRows &r, const BwdAlibiRows &al,
                                                float (&S)[Tr::kNT][4], float (&dP)[Tr::kNT][4],
                                                uint32_t (&P)[Tr::kNT][2], uint32_t (&dS)[Tr::kNT][2]) {
    const float sl2 = p.score_log2, cap = p.softcap_scale;
    // dP becomes dS / P: dP - row_dot, times d(cap * tanh(raw * scale / cap)) / d(raw * scale) =
    // 1 - tanh^2 under a cap; S becomes the capped score.
    if (cap != 0.f) {
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float x = cuda::tanh_accurate(S[nt][i] * cap);
                S[nt][i] = x;
                dP[nt][i] = (dP[nt][i] - r.rd[i >> 1]) * (1.f - x * x);
            }
    } else {
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) dP[nt][i] -= r.rd[i >> 1];
    }
    if (p.alibi_slopes != nullptr) {
        const float s = p.alibi_slopes[al.hq] * p.alibi_to_score;
        cuda::alibi_scores<Tr::kNT>(S, al.rdiag, {s, s}, al.col0);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt) {
            float pv[2], dv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + e;
                // A pair outside the row's keys (masked, past the sequence, or any key of a row
                // whose LSE is -inf) takes no part: P and dS exactly 0, selected rather than
                // multiplied by 0, so a NaN or inf in its dP, row_dot or score stays out (as in
                // the CPU backward). Inside, a NaN in S, LSE, dP or row_dot propagates.
                const bool pair = kUnmasked || (c >= r.lo[h] && c <= r.hi[h]);
                // exp2 of every pair, then a select (a predicated exp2 cost a zeroing move and a
                // reload of score_log2 per pair)
                const float pr = cuda::fast_exp2(fmaf(S[nt][2 * h + e], sl2, -r.lse2[h]));
                pv[e] = pair ? pr : 0.f;
                dv[e] = pair ? pr * dP[nt][2 * h + e] : 0.f;
            }
            P[nt][h] = cuda::pack2<E>(pv[0], pv[1]);
            dS[nt][h] = cuda::pack2<E>(dv[0], dv[1]);
        }
    }
}

// Scores without a soft cap or ALiBi ("plain": a runtime property of the whole launch) become P
// in two halves around the dP GEMM, so that the exponentials issue between its mma (stop 51's d 64
// profile: after both GEMMs they came as one burst of MUFU, 28 % of the MIO stalls). Compiled at
// padded head dims <= 128 (plain_split); at 256 it measured level (H100, 0.991-1.009x).
template <class Tr>
constexpr bool plain_split() {
    return Tr::kDP <= 128;
}
// plain_probs_step: P = exp2(S * score_log2 - LSE2) in place for the share of this warp's scores
// that k-step ks of kKS takes (every pair, whatever the mask: the select comes after).
template <class Tr>
__device__ __forceinline__ void plain_probs_step(const BwdParams &p, const float (&lse2)[Tr::kSMT][2], int ks,
                                                 float (&S)[Tr::kSMT][Tr::kNT][4]) {
    constexpr int kPer = (Tr::kSMT * Tr::kNT + Tr::kKS - 1) / Tr::kKS;  // n8 tiles per k-step
    const float sl2 = p.score_log2;
#pragma unroll
    for (int j = ks * kPer; j < (ks + 1) * kPer && j < Tr::kSMT * Tr::kNT; ++j) {
        const int mt = j / Tr::kNT, nt = j % Tr::kNT;
#pragma unroll
        for (int i = 0; i < 4; ++i) S[mt][nt][i] = cuda::fast_exp2(fmaf(S[mt][nt][i], sl2, -lse2[mt][i >> 1]));
    }
}
// The second half: dS = P (dP - row_dot), both packed; kUnmasked as probs_and_grads (the same
// selects, so the same values as probs_and_grads on the same scores).
template <class Tr, class E, bool kUnmasked>
__device__ __forceinline__ void plain_grads(const BwdRows &r, const float (&Pf)[Tr::kNT][4],
                                            const float (&dP)[Tr::kNT][4], uint32_t (&P)[Tr::kNT][2],
                                            uint32_t (&dS)[Tr::kNT][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt) {
            float pv[2], dv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool pair = kUnmasked || (nt * 8 + e >= r.lo[h] && nt * 8 + e <= r.hi[h]);
                const float pr = Pf[nt][2 * h + e];
                pv[e] = pair ? pr : 0.f;
                dv[e] = pair ? pr * (dP[nt][2 * h + e] - r.rd[h]) : 0.f;
            }
            P[nt][h] = cuda::pack2<E>(pv[0], pv[1]);
            dS[nt][h] = cuda::pack2<E>(dv[0], dv[1]);
        }
}

// Whether key block n0.. holds sink keys (TensorArgs::sink_tokens): CTA-uniform.
__device__ __forceinline__ bool sink_block(const BwdParams &p, int n0) { return n0 < p.sink_tokens; }

// A sink block's masked step: P and dS of the keys between the sink tokens and each row's window
// (sink_tokens <= key < first_visible_key) set to 0, halves of the packed pairs cleared (exactly
// 0, whatever the form computed there). load_rows took those rows' keys from 0.
template <class Tr>
__device__ __forceinline__ void drop_sink_hole(const BwdParams &p, const BwdBlockArgs &a, int qrow, int col0,
                                               uint32_t (&P)[Tr::kNT][2], uint32_t (&dS)[Tr::kNT][2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int lo = cuda::first_visible_key(qrow + 8 * h + a.off, p.left_i) - col0;  // the window's first key
        const int se = p.sink_tokens - col0;                                             // the first non-sink key
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt) {
            const int c = nt * 8;
            const uint32_t keep = (c >= se && c < lo ? 0u : 0x0000ffffu) | (c + 1 >= se && c + 1 < lo ? 0u : 0xffff0000u);
            P[nt][h] &= keep;
            dS[nt][h] &= keep;
        }
    }
}

// This warp's P and dS into their [query row][key] tiles (for the transposed reads); the dS tile
// is the P tile's successor (s_p + kPBytes). Rows row0 + g (+ 8), row0 a multiple of 8, so the
// swizzle's row term is g: with whole-page rows and a warp's keys starting at a multiple of 32,
// each store's address is one lane base XOR a constant, plus a constant (frag_addr's form), where
// the offset rederived per store took ~2 integer instructions per pair of stores (d64: 16 address
// registers for 32 stores per m16 tile).
template <class Tr>
__device__ __forceinline__ void store_p_ds(uint32_t s_p, int row0, int key0, const uint32_t (&P)[Tr::kNT][2],
                                           const uint32_t (&dS)[Tr::kNT][2]) {
    using PT = typename Tr::PTile;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    if constexpr (PT::kFullPages > 0 && Tr::kSKeys % 32 == 0) {
        const uint32_t base = at_column<PT>(s_p + (row0 + g) * 128 + ((g << 4) | (4 * t)), key0);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int nt = 0; nt < Tr::kNT; ++nt) {
                const uint32_t off = (base ^ ((nt & 7) << 4)) + (nt >> 3) * PT::kPageBytes + h * 8 * 128;
                cuda::st_shared_b32(off, P[nt][h]);
                cuda::st_shared_b32(off + Tr::kPBytes, dS[nt][h]);
            }
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + h * 8 + g;
#pragma unroll
            for (int nt = 0; nt < Tr::kNT; ++nt) {
                const uint32_t off = s_p + PT::offset(r, key0 / 8 + nt) + 4 * t;
                cuda::st_shared_b32(off, P[nt][h]);
                cuda::st_shared_b32(off + Tr::kPBytes, dS[nt][h]);
            }
        }
    }
}

// Reduce column group j (16 columns) of one m16 tile of dQ into the accumulator: row is the tile's
// lane fragment at the warp's first column (accumulate_dq). Halves past the head dim (d is a
// multiple of 8: a half is in or out) add nothing.
__device__ __forceinline__ void red_dq_group(float *row, int j, int ncols, const float (&acc)[2][4]) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
        if (j * 16 + n * 8 < ncols)
            cuda::red_add_f32x4(row + j * 256 + n * 128, acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
}

// This lane's place in the dQ accumulator for the warp's first m16 tile (rows from qrow0 of the
// sequence) and column span (from col0), fragment order (device/dq_accum.cuh). From the parameters
// and the sequence's first row each time: a pointer kept in the block's arguments would hold two
// registers over the whole step loop (ptxas spilled at d128).
__device__ __forceinline__ float *dq_tile0(const BwdParams &p, const BwdBlockArgs &a, int hq, int qrow0, int col0) {
    const int lane = threadIdx.x & 31;
    return p.dq_accum +
           (static_cast<int64_t>(hq) * p.dq_rows + cuda::dq_frag_row0(a.q_row0, a.b) + qrow0) *
               cuda::dq_frag_cols(a.d) +
           (col0 >> 4) * 256 + lane * 4;
}

// dQ += dS K for this warp's kQMT m16 tiles of query rows (from row qrow0 of the sequence, a
// multiple of 16) and its column span (from col0, a multiple of 32), into the accumulator in
// fragment order (device/dq_accum.cuh): one red.v4 of the lane's four values per m16n8 tile, 512
// contiguous bytes per warp. Rows past the sequence inside its last 16 carry dS = 0 and land in
// padding. The GEMM runs k-step outer over the whole span where that takes no more registers
// (dq_span_outer: head dim <= 128), else one 16-column group at a time from the warp's dS rows.
template <class Tr, class E>
__device__ __forceinline__ void accumulate_dq(const BwdParams &p, const BwdBlockArgs &a, int hq, int qrow0, int col0,
                                              uint32_t ds_full, uint32_t ds_half, uint32_t k_lane) {
    const int ncols = cuda::warp_uniform(a.d - col0);  // no WARPSYNC around the skipped groups' mma
    if (ncols <= 0) return;
    const int dcols = cuda::dq_frag_cols(a.d);
    float *tile0 = dq_tile0(p, a, hq, qrow0, col0);
    if constexpr (dq_span_outer<Tr>()) {
        float acc[Tr::kQGroups][Tr::kQMT][2][4];
        gemm_ds_k_span<Tr, E>(acc, ds_full, ds_half, k_lane, ncols);
        // The warp's whole span and every tile in range (all but the odd head dims' last span and
        // a sequence's last block): the reds without a test each (ptxas branches around every
        // tested red).
        if (ncols >= Tr::kQCols && qrow0 + 16 * Tr::kQMT <= a.sq) {
#pragma unroll
            for (int mt = 0; mt < Tr::kQMT; ++mt) {
                float *row = tile0 + static_cast<int64_t>(16 * mt) * dcols;
#pragma unroll
                for (int j = 0; j < Tr::kQGroups; ++j) red_dq_group(row, j, Tr::kQCols, acc[j][mt]);
            }
            return;
        }
#pragma unroll
        for (int mt = 0; mt < Tr::kQMT; ++mt) {  // m16 tiles wholly past the sequence add nothing
            if (qrow0 + 16 * mt >= a.sq) continue;
            float *row = tile0 + static_cast<int64_t>(16 * mt) * dcols;  // one 64-bit address per tile
#pragma unroll
            for (int j = 0; j < Tr::kQGroups; ++j) red_dq_group(row, j, ncols, acc[j][mt]);
        }
    } else {
        uint32_t dS[Tr::kQMT][Tr::kBN / 16][4];
        load_ds_rows<Tr>(dS, ds_full, ds_half);
#pragma unroll
        for (int j = 0; j < Tr::kQGroups; ++j) {
            if (j * 16 >= ncols) continue;
            float acc[Tr::kQMT][2][4];
            gemm_ds_k<Tr, E>(acc, dS, k_lane, j);
#pragma unroll
            for (int mt = 0; mt < Tr::kQMT; ++mt)
                if (qrow0 + 16 * mt < a.sq)
                    red_dq_group(tile0 + static_cast<int64_t>(16 * mt) * dcols, j, ncols, acc[mt]);
        }
    }
}

// Step s of the key block's walk: query head and first row of its query block.
struct BwdStep {
    int hq, m0;
};

// Deterministic mode: the counter of a step's (query head, query block) and the count of key blocks
// that add to its dQ before this one (host/bwd_args.h ascending_turn: the block holding key
// m0 + off - left, mask.cuh's rule for the query block's first row, and the sink blocks).
struct BwdTurn {
    int *sem;
    int before;
};
// kKeysDescending: the higher key blocks that visit the query block go first (host/bwd_args.h
// turn_last_block), the order in which lockstep walks from later diagonals reach it.
template <class Tr>
__device__ __forceinline__ BwdTurn turn_of(const BwdParams &p, const BwdBlockArgs &a, BwdStep st, int nb) {
    int *sem = p.dq_sem + (static_cast<int64_t>(a.b) * p.heads_q + st.hq) * p.sem_blocks + st.m0 / Tr::kBM;
    if (p.grid_order == kKeysDescending)
        return BwdTurn{sem, turn_last_block(min(st.m0 + Tr::kBM, a.sq) - 1, a.off, p.right_i, a.sk, Tr::kBN) - nb};
    const int nb_first = turn_first_block(st.m0, a.off, p.left, Tr::kBN);
    const int nsb = (p.sink_tokens + Tr::kBN - 1) / Tr::kBN;  // sink blocks (0 without sink tokens)
    return BwdTurn{sem, ascending_turn(nb, nb_first, nsb)};
}
// The walk: query blocks m_first..m_last (first rows, kBM apart) of each query head of the group
// in turn. A step's neighbours come from the step itself: the step index's division by the block
// count (for this, the next and, deterministic, the previous step) cost ~50 integer instructions
// per step and three registers for its reciprocal.
struct BwdWalk {
    int m_first, m_last;
};
template <class Tr>
__device__ __forceinline__ BwdStep next_step(BwdWalk w, BwdStep st) {
    return st.m0 < w.m_last ? BwdStep{st.hq, st.m0 + Tr::kBM} : BwdStep{st.hq + 1, w.m_first};
}
template <class Tr>
__device__ __forceinline__ BwdStep prev_step(BwdWalk w, BwdStep st) {
    return st.m0 > w.m_first ? BwdStep{st.hq, st.m0 - Tr::kBM} : BwdStep{st.hq - 1, w.m_last};
}

// Where this thread's LSE (tid < kBM) or row_dot word of a step comes from, with
// Tr::kHoistRowSrc: the word of query head hq, row m0 + r is base + hq * head_stride + m0
// (cuda::lse_offset's two layouts and row_dot's [heads_q][total rows] with head 0's part folded
// in). Computed once per key block; per step it costs one 64-bit multiply-add where
// lse_offset's layout branch, clamp and products cost ~35 instructions per warp (d64).
struct BwdRowSrc {
    const float *base;
    int64_t head_stride;
};
template <class Tr>
__device__ __forceinline__ BwdRowSrc row_src(const BwdParams &p, const BwdBlockArgs &a) {
    const int tid = threadIdx.x;
    const bool lse = tid < Tr::kBM;
    const int r = lse ? tid : tid - Tr::kBM;
    if (lse && p.cu_q == nullptr)  // LSE [batch][heads_q][seqlen_q]
        return BwdRowSrc{p.lse + static_cast<int64_t>(a.b) * p.heads_q * p.seqlen_q + r, p.seqlen_q};
    return BwdRowSrc{(lse ? p.lse : p.row_dot) + a.q_row0 + r, p.total_rows};  // [heads_q][total rows]
}

// cp.async Q, dO, LSE and row_dot of step st into buffer `buf` (rows past the sequence: zeros).
// rsrc: row_src's, read only where Tr::kHoistRowSrc.
template <class Tr>
__device__ __forceinline__ void load_q_do(const BwdParams &p, const BwdBlockArgs &a, BwdStep st, int buf,
                                          const BwdRowSrc &rsrc) {
    const uint32_t s_q = a.smem + Tr::kQOffset + buf * 2 * Tr::kQBytes;
    bwd_load_tile<Tr, Tr::kBM>(s_q, a.qg + st.hq * p.q_hs + static_cast<int64_t>(st.m0) * p.q_rs, p.q_rs,
                               a.sq - st.m0, a.d);
    bwd_load_tile<Tr, Tr::kBM>(s_q + Tr::kQBytes, a.dog + st.hq * p.do_hs + static_cast<int64_t>(st.m0) * p.do_rs,
                               p.do_rs, a.sq - st.m0, a.dv);
    static_assert(2 * Tr::kBM <= Tr::kThreads, "one word per thread");
    const int tid = threadIdx.x;
    if (tid < 2 * Tr::kBM) {
        const int r = tid < Tr::kBM ? tid : tid - Tr::kBM;
        const int qpos = st.m0 + r;
        const bool ok = qpos < a.sq;
        const float *src;
        if constexpr (Tr::kHoistRowSrc) {  // unclamped: a row past the sequence copies 0 bytes
            src = rsrc.base + st.hq * rsrc.head_stride + st.m0;
        } else {
            const int q = ok ? qpos : 0;
            src = tid < Tr::kBM ? p.lse + cuda::lse_offset(p, a.b, st.hq, a.q_row0, q)
                                : p.row_dot + static_cast<int64_t>(st.hq) * p.total_rows + a.q_row0 + q;
        }
        cuda::cp_async_4(a.smem + Tr::kRowsOffset + buf * Tr::kRowsBytes + tid * 4, src, ok ? 4u : 0u);
    }
}

// Where a step's dQ reductions go. Issued back to back right after the dQ GEMM (before the dK / dV
// GEMMs), the next instructions wait for the LSU to read their operands (a write-after-read wait:
// 4.5 % of the d 64 kernel's stall samples in stop 51's ncu profile) and the dK / dV LDSMs queue
// behind them. dq_reds_under_dv: the dQ GEMM first, its accumulators kept through the dV GEMM and
// the reductions issued between its k-steps (dq_reds_step), where the whole column span's
// accumulators take no more registers than the dS rows (dq_span_fits) at padded head dims
// <= 128 (H100: d 64 1.003-1.049x over dQ first, stop 52; d 128 1.002-1.024x over dQ last,
// stop 53).
// dq_last: elsewhere above head dim 64 the dQ GEMM and reductions after the dK / dV GEMMs, their
// operands drained under the next step's top barrier (stop 51: d 256 1.015-1.032x over dQ first;
// at d 64 dQ last lost twice, 0.968-1.003x).
template <class Tr>
constexpr bool dq_reds_under_dv() {
    return Tr::kDP <= 128 && dq_span_fits<Tr>();
}
template <class Tr>
constexpr bool dq_last() {
    return Tr::kD > 64 && !dq_reds_under_dv<Tr>();
}
// k-step ks's share of the reductions (one at d 64: 8 reductions, 8 k-steps).
template <class Tr>
__device__ __forceinline__ void dq_reds_step(float *tile0, int dcols,
                                             const float (&acc)[Tr::kQGroups][Tr::kQMT][2][4], int ks) {
    constexpr int kReds = Tr::kQGroups * Tr::kQMT * 2, kKS = Tr::kBM / 16;
    constexpr int kPer = (kReds + kKS - 1) / kKS;
#pragma unroll
    for (int r = ks * kPer; r < (ks + 1) * kPer && r < kReds; ++r) {
        const int j = r / (Tr::kQMT * 2), mt = (r / 2) % Tr::kQMT, n = r % 2;
        const float(&v)[4] = acc[j][mt][n];
        cuda::red_add_f32x4(tile0 + static_cast<int64_t>(16 * mt) * dcols + j * 256 + n * 128, v[0], v[1], v[2], v[3]);
    }
}

// One query block (rows m0..m0+kBM-1 of query head hq, in Q/dO buffer buf) against the CTA's
// key block. The caller has made the buffer's tiles visible to every thread.
template <class Tr, class E>
__device__ __forceinline__ void bwd_query_block(const BwdParams &p, const BwdBlockArgs &a, BwdStep st, int buf,
                                                float (&dK)[Tr::kKVMT][Tr::kKVGroups][2][4],
                                                float (&dV)[Tr::kKVMT][Tr::kKVGroups][2][4]) {
    using QT = typename Tr::QTile;
    using KT = typename Tr::KVTile;
    using PT = typename Tr::PTile;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // ldmatrix lane bases (SwizzledTile): A-style rows lane%16 / chunk bit lane/16, B-style rows
    // (lane%8) + 8*(lane/16) / chunk bit (lane/8)%2. They go through opaque() (fa2_load.cuh) so
    // that they are recomputed each step instead of being hoisted out of the loop into registers,
    // unless Tr::kHoistOffsets (registers to spare: computed once per CTA).
    const int lr_a = lane & 15, lb_a = lane >> 4;
    const int lr_k = (lane & 7) | ((lane >> 4) << 3), lb_k = (lane >> 3) & 1;
    const uint32_t s_k = opaque_if<!Tr::kHoistOffsets>(a.smem);
    const uint32_t s_v = s_k + Tr::kKVBytes;
    const uint32_t s_q = s_k + Tr::kQOffset + buf * 2 * Tr::kQBytes, s_do = s_q + Tr::kQBytes;
    const uint32_t s_p = s_k + Tr::kPOffset, s_ds = s_p + Tr::kPBytes;
    const uint32_t s_rows = s_k + Tr::kRowsOffset + buf * Tr::kRowsBytes;

    // Deterministic: thread 0 reads the step's counter now (in order, it is the earlier key
    // blocks' turn only while they lag behind) and waits for this block's turn before the barrier
    // that releases the dQ adds.
    const bool ordered = p.deterministic && threadIdx.x == 0;
    int seen = ordered ? cuda::ld_relaxed_gpu(turn_of<Tr>(p, a, st, a.n0 / Tr::kBN).sem) : 0;
    {  // scores layout: S, dP, P, dS of kSMT x 16 rows x kSKeys keys
        const int rg = warp % Tr::kSRowGroups, kg = warp / Tr::kSRowGroups;
        const int key0 = kg * Tr::kSKeys, row0 = rg * Tr::kSMT * 16;
        float S[Tr::kSMT][Tr::kNT][4], dP[Tr::kSMT][Tr::kNT][4];
        gemm_qk<Tr, E>(S, QT::lane_base_full(s_q + row0 * 128, lr_a, lb_a), 0u,
                       KT::lane_base_full(s_k + key0 * 128, lr_k, lb_k), 0u);
        // The unmasked form where it measured a win (stop 21, one H200 call): padded head dim <= 128
        // (d128 1.010-1.015x); at 256 it cost 1.1-1.3 % (its second copy of the P / dS code
        // outweighs the compares it saves at 250+ registers), so there every step takes the mask.
        const bool unmasked = Tr::kDP <= 128 && step_unmasked<Tr>(p, a, st.m0);
        const bool sinks = sink_block(p, a.n0);
        const auto rows_of = [&](int mt) {
            const int qrow = st.m0 + row0 + mt * 16 + g, col0 = a.n0 + key0 + 2 * t;
            return unmasked ? load_rows<Tr, true>(p, a, s_rows, st.m0, qrow, col0)
                            : load_rows<Tr, false>(p, a, s_rows, st.m0, qrow, col0, sinks);
        };
        const bool plain = plain_split<Tr>() && p.softcap_scale == 0.f && p.alibi_slopes == nullptr;
        const auto dp_gemm = [&](auto after_step) {
            gemm_qk<Tr, E, false, false>(dP, QT::lane_base_full(s_do + row0 * 128, lr_a, lb_a), 0u,
                                         KT::lane_base_full(s_v + key0 * 128, lr_k, lb_k), 0u, 0, 0.f, after_step);
        };
        if (plain) {
            // Only the LSE goes through the dP GEMM; the rows are read again after it (their
            // ranges and row_dot would hold 8 more registers per m16 tile over the GEMM).
            float lse2[Tr::kSMT][2];
#pragma unroll
            for (int mt = 0; mt < Tr::kSMT; ++mt) {
                const BwdRows r = rows_of(mt);
                lse2[mt][0] = r.lse2[0];
                lse2[mt][1] = r.lse2[1];
            }
            dp_gemm([&](int ks) { plain_probs_step<Tr>(p, lse2, ks, S); });
        } else {
            dp_gemm(NoStepWork{});
        }
#pragma unroll
        for (int mt = 0; mt < Tr::kSMT; ++mt) {
            const int qrow = st.m0 + row0 + mt * 16 + g, col0 = a.n0 + key0 + 2 * t;
            const BwdRows rows = rows_of(mt);
            uint32_t P[Tr::kNT][2], dS[Tr::kNT][2];
            const BwdAlibiRows al{st.hq, {qrow + a.off, qrow + 8 + a.off}, col0};
            // A row with LSE = -inf (it saw no key in the forward; only with such inputs in an
            // unmasked step) sends its warp to the tested form: the unmasked one selects nothing
            // (two FSEL per pair fewer).
            const bool all_live = __all_sync(0xffffffffu, rows.lo[0] <= rows.hi[0] && rows.lo[1] <= rows.hi[1]);
            if (plain) {
                if (unmasked && all_live)
                    plain_grads<Tr, E, true>(rows, S[mt], dP[mt], P, dS);
                else
                    plain_grads<Tr, E, false>(rows, S[mt], dP[mt], P, dS);
            } else if (unmasked && all_live) {
                probs_and_grads<Tr, E, true>(p, rows, al, S[mt], dP[mt], P, dS);
            } else {
                probs_and_grads<Tr, E, false>(p, rows, al, S[mt], dP[mt], P, dS);
            }
            if (sinks && !unmasked) drop_sink_hole<Tr>(p, a, qrow, col0, P, dS);
            store_p_ds<Tr>(s_p, row0 + mt * 16, key0, P, dS);
        }
    }
    if (ordered) {
        const BwdTurn turn = turn_of<Tr>(p, a, st, a.n0 / Tr::kBN);
        while (seen != turn.before) seen = cuda::ld_acquire_gpu(turn.sem);
    }
    __syncthreads();  // P and dS tiles complete (and, deterministic, this key block's turn)

    // dQ layout: the warp's first query row (of the sequence) and column, and its dS rows
    const int q_rg = warp % Tr::kQRowGroups, q_col0 = (warp / Tr::kQRowGroups) * Tr::kQCols;
    const int q_row0 = st.m0 + q_rg * Tr::kQMT * 16;
    const uint32_t ds_row = s_ds + q_rg * Tr::kQMT * 16 * Tr::kPRowBytes;
    const auto add_dq = [&] {
        accumulate_dq<Tr, E>(p, a, st.hq, q_row0, q_col0, PT::lane_base_full(ds_row, lr_a, lb_a),
                             PT::lane_base_half(ds_row, lr_a, lb_a),
                             at_column<KT>(KT::lane_base_full(s_k, lr_a, lb_a), q_col0));
    };
    const auto add_dk_dv = [&](auto dv_step_work) {  // keys layout
        const int kg = warp % Tr::kKVKeyGroups, cg = warp / Tr::kKVKeyGroups;
        const int col0 = cg * Tr::kKVCols;
        uint32_t p_lane[Tr::kKVMT], ds_lane[Tr::kKVMT];
#pragma unroll
        for (int mt = 0; mt < Tr::kKVMT; ++mt) {
            const uint32_t pt_off = PT::offset(lr_k, 2 * (kg * Tr::kKVMT + mt) + lb_k);
            p_lane[mt] = s_p + pt_off;
            ds_lane[mt] = s_ds + pt_off;
        }
        // no WARPSYNC around the skipped groups' mma
        const int ncols = cuda::warp_uniform(a.d - col0), ncols_v = cuda::warp_uniform(a.dv - col0);
        gemm_at_b<Tr, E>(dV, p_lane, at_column<QT>(QT::lane_base_full(s_do, lr_a, lb_a), col0), ncols_v,
                         dv_step_work);
        gemm_at_b<Tr, E>(dK, ds_lane, at_column<QT>(QT::lane_base_full(s_q, lr_a, lb_a), col0), ncols);
    };
    if constexpr (dq_last<Tr>()) {
        add_dk_dv(NoStepWork{});
        add_dq();
        return;
    }
    if constexpr (dq_reds_under_dv<Tr>()) {
        // accumulate_dq's fast case (the warp's whole column span, every row tile in the
        // sequence): its GEMM over all kQCols columns, then the reductions between the dV GEMM's
        // k-steps; other warps and steps take accumulate_dq as it is.
        if (cuda::warp_uniform(a.d - q_col0) >= Tr::kQCols && q_row0 + 16 * Tr::kQMT <= a.sq) {
            float acc[Tr::kQGroups][Tr::kQMT][2][4];
            gemm_ds_k_span<Tr, E>(acc, PT::lane_base_full(ds_row, lr_a, lb_a), PT::lane_base_half(ds_row, lr_a, lb_a),
                                  at_column<KT>(KT::lane_base_full(s_k, lr_a, lb_a), q_col0), Tr::kQCols);
            float *tile0 = dq_tile0(p, a, st.hq, q_row0, q_col0);
            const int dcols = cuda::dq_frag_cols(a.d);
            add_dk_dv([&](int ks) { dq_reds_step<Tr>(tile0, dcols, acc, ks); });
            return;
        }
    }
    add_dq();
    add_dk_dv(NoStepWork{});
}

// dK * scale and dV of this warp's kKVMT x 16 keys and its column span (16-bit pairs).
template <class Tr, class E>
__device__ __forceinline__ void store_dk_dv(const BwdParams &p, const BwdBlockArgs &a, uint16_t *dkg, uint16_t *dvg,
                                            const float (&dK)[Tr::kKVMT][Tr::kKVGroups][2][4],
                                            const float (&dV)[Tr::kKVMT][Tr::kKVGroups][2][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int kg = warp % Tr::kKVKeyGroups, cg = warp / Tr::kKVKeyGroups;
    const int col0 = cg * Tr::kKVCols;
    const int ncols = a.d - col0, ncols_v = a.dv - col0;
#pragma unroll
    for (int mt = 0; mt < Tr::kKVMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = a.n0 + (kg * Tr::kKVMT + mt) * 16 + 8 * h + g;
            if (key >= a.sk) continue;
            uint16_t *kr = dkg + key * p.dk_rs + col0 + 2 * t;
            uint16_t *vr = dvg + key * p.dv_rs + col0 + 2 * t;
#pragma unroll
            for (int j = 0; j < Tr::kKVGroups; ++j)
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const int c = j * 16 + n * 8;
                    if (c < ncols)
                        *reinterpret_cast<uint32_t *>(kr + c) =
                            cuda::pack2<E>(dK[mt][j][n][2 * h] * p.scale, dK[mt][j][n][2 * h + 1] * p.scale);
                    if (c < ncols_v)
                        *reinterpret_cast<uint32_t *>(vr + c) =
                            cuda::pack2<E>(dV[mt][j][n][2 * h], dV[mt][j][n][2 * h + 1]);
                }
        }
}

// Key block nb of sequence b: every query block of every query head of kv head kvh that sees any
// of its keys, then dK and dV.
template <class Tr, class E>
__device__ __forceinline__ void bwd_key_block(const BwdParams &p, BwdBlockArgs &a, int kvh, int nb) {
    const bool varlen = p.cu_q != nullptr;
    a.n0 = nb * Tr::kBN;
    float dK[Tr::kKVMT][Tr::kKVGroups][2][4], dV[Tr::kKVMT][Tr::kKVGroups][2][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kKVMT; ++mt)
#pragma unroll
        for (int j = 0; j < Tr::kKVGroups; ++j)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) dK[mt][j][n][e] = dV[mt][j][n][e] = 0.f;

    // Query rows that see any key of [n0, n_hi] (a sink block's: to the sequence's last row).
    const BwdRowRange rows_seen =
        ascending_walk_rows(a.n0, min(a.n0 + Tr::kBN, a.sk) - 1, a.sq, a.off, p.left, p.right, p.sink_tokens);
    const int64_t i_lo = rows_seen.lo, i_hi = rows_seen.hi;
    if (i_lo <= i_hi) {
        __syncthreads();  // a previous key block of this CTA is done with K, V, Q, dO
        const int64_t k_row0 = varlen ? cuda::seq_info(p, a.b).k_row0 : 0;
        const int64_t koff = varlen ? k_row0 * p.k_rs : a.b * p.k_bs;
        const int64_t voff = varlen ? k_row0 * p.v_rs : a.b * p.v_bs;
        const uint16_t *kg = static_cast<const uint16_t *>(p.k) + koff + kvh * p.k_hs + a.n0 * p.k_rs;
        const uint16_t *vg = static_cast<const uint16_t *>(p.v) + voff + kvh * p.v_hs + a.n0 * p.v_rs;
        bwd_load_tile<Tr, Tr::kBN>(a.smem, kg, p.k_rs, a.sk - a.n0, a.d);
        bwd_load_tile<Tr, Tr::kBN>(a.smem + Tr::kKVBytes, vg, p.v_rs, a.sk - a.n0, a.dv);
        const BwdWalk walk{static_cast<int>(i_lo / Tr::kBM) * Tr::kBM, static_cast<int>(i_hi / Tr::kBM) * Tr::kBM};
        const int nsteps = p.group * ((walk.m_last - walk.m_first) / Tr::kBM + 1);
        BwdStep st{kvh * p.group, walk.m_first};
        const BwdRowSrc rsrc = Tr::kHoistRowSrc ? row_src<Tr>(p, a) : BwdRowSrc{};
        if (Tr::kStages == 2) load_q_do<Tr>(p, a, st, 0, rsrc);
        cuda::cp_async_commit();
        for (int s = 0; s < nsteps; ++s, st = next_step<Tr>(walk, st)) {
            const int buf = Tr::kStages == 2 ? (s & 1) : 0;
            if (Tr::kStages == 1) {
                if (s > 0) __syncthreads();  // every warp is done with the previous step's tiles
                load_q_do<Tr>(p, a, st, 0, rsrc);
                cuda::cp_async_commit();
            }
            cuda::cp_async_wait<0>();  // this step's Q, dO (and K, V at the first step)
            __syncthreads();  // ... from every thread; every warp is done with the previous step
            if (p.deterministic && s > 0 && threadIdx.x == 0) {
                // The previous step's dQ adds of every thread precede this barrier; one gpu-scope
                // fence here orders them all before the counter moves (a grid barrier's pattern),
                // where a fence per thread after each step stalled every warp on its own adds.
                __threadfence();
                atomicAdd(turn_of<Tr>(p, a, prev_step<Tr>(walk, st), nb).sem, 1);
            }
            if (Tr::kStages == 2 && s + 1 < nsteps) {  // the other buffer was the previous step's
                load_q_do<Tr>(p, a, next_step<Tr>(walk, st), buf ^ 1, rsrc);
                cuda::cp_async_commit();
            }
            bwd_query_block<Tr, E>(p, a, st, buf, dK, dV);
        }
        if (p.deterministic) {
            __syncthreads();
            if (threadIdx.x == 0) {  // as at the step top (st is one past the last step)
                __threadfence();
                atomicAdd(turn_of<Tr>(p, a, prev_step<Tr>(walk, st), nb).sem, 1);
            }
        }
    }
    // Read again (not kept from the prologue): the loop holds no registers for these offsets.
    const int64_t k_row0 = varlen ? cuda::seq_info(p, a.b).k_row0 : 0;
    const int64_t dkoff = varlen ? k_row0 * p.dk_rs : a.b * p.dk_bs;
    const int64_t dvoff = varlen ? k_row0 * p.dv_rs : a.b * p.dv_bs;
    store_dk_dv<Tr, E>(p, a, static_cast<uint16_t *>(p.dk) + dkoff + kvh * p.dk_hs,
                       static_cast<uint16_t *>(p.dv) + dvoff + kvh * p.dv_hs, dK, dV);
}

template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) bwd_kernel(const __grid_constant__ BwdParams p) {
    extern __shared__ __align__(1024) unsigned char smem[];
    // blockIdx.x in the plan's order (fa2_bwd_params.h): kHeadsFastest = (kv head, sequence)
    // fastest, then key block; otherwise key block fastest, ascending or descending.
    const unsigned pairs = static_cast<unsigned>(p.heads_kv * p.batch);
    const unsigned nkb = static_cast<unsigned>((p.seqlen_k + Tr::kBN - 1) / Tr::kBN);
    const bool heads_fastest = p.grid_order == kHeadsFastest;
    const int hb = static_cast<int>(heads_fastest ? blockIdx.x % pairs : blockIdx.x / nkb);
    const int nk = static_cast<int>(heads_fastest ? blockIdx.x / pairs : blockIdx.x % nkb);
    const int nb = p.grid_order == kKeysDescending ? static_cast<int>(nkb) - 1 - nk : nk;
    const int kvh = hb % p.heads_kv;
    BwdBlockArgs a;
    a.b = hb / p.heads_kv;
    const cuda::SeqInfo si = cuda::seq_info(p, a.b);
    a.sq = si.sq;
    a.sk = si.sk;
    a.off = cuda::diagonal_offset(p, si.sq, si.sk);  // sk - sq, or 0 top-left
    a.q_row0 = si.q_row0;
    a.d = p.head_dim;
    a.dv = p.head_dim_v;
    const bool varlen = p.cu_q != nullptr;
    a.qg = static_cast<const uint16_t *>(p.q) + (varlen ? si.q_row0 * p.q_rs : a.b * p.q_bs);
    a.dog = static_cast<const uint16_t *>(p.dout) + (varlen ? si.q_row0 * p.do_rs : a.b * p.do_bs);
    a.smem = cuda::smem_addr(smem);
    if (nb * Tr::kBN < si.sk) bwd_key_block<Tr, E>(p, a, kvh, nb);
}

// Grid: kv heads x batch x key blocks of the longest sequence, in one dimension (the host checks
// that it fits).
template <class Tr>
dim3 bwd_grid(const BwdParams &p) {
    const int64_t nkb = (p.seqlen_k + Tr::kBN - 1) / Tr::kBN;
    return dim3(static_cast<unsigned>(static_cast<int64_t>(p.heads_kv) * p.batch * nkb));
}

template <int kD, class E, int kBM, int kBN, int kNW, int kStages, int kSMT, int kKVMT, int kQMT>
cudaError_t launch_bwd(const BwdParams &p, cudaStream_t stream) {
    using Tr = BwdTraits<kD, kBM, kBN, kNW, kStages, kSMT, kKVMT, kQMT>;
    auto kernel = bwd_kernel<Tr, E>;
    static unsigned long long optin_done = 0;  // one per instantiation of this function
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    kernel<<<bwd_grid<Tr>(p), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    return cudaSuccess;
}

template <int kD, class E, bool kFallback>
cudaError_t launch_bwd_tile(const BwdParams &p, cudaStream_t s) {
    constexpr BwdTile t = kFallback ? bwd_tile_fallback(kD) : bwd_tile_main(kD);
    return launch_bwd<kD, E, t.bm, t.bn, t.warps, t.stages, t.smt, t.kvmt, t.qmt>(p, s);
}

// Launcher body of one compiled head dim (both element types; the fallback tile where compiled).
template <int kD>
cudaError_t launch_bwd_hdim(const BwdParams &p, bool bf16, bool fallback, cudaStream_t s) {
    if constexpr (!bwd_compiled(kD)) {  // the host never asks for it
        (void)p, (void)bf16, (void)fallback, (void)s;
        return cudaErrorInvalidValue;
    } else {
        if constexpr (bwd_has_fallback(kD)) {
            if (fallback)
                return bf16 ? launch_bwd_tile<kD, cuda::Bf16, true>(p, s) : launch_bwd_tile<kD, cuda::Fp16, true>(p, s);
        }
        (void)fallback;
        return bf16 ? launch_bwd_tile<kD, cuda::Bf16, false>(p, s) : launch_bwd_tile<kD, cuda::Fp16, false>(p, s);
    }
}

}  // namespace fa2
}  // namespace flashattn
