// The row-wise steps of the attention main loop shared by the tensor-core kernels (FA2 with
// mma.sync, FA3 with wgmma). Both hold a warp's 16-row slice of the scores S as n8 tiles of four
// fp32 values, (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) with g = lane/4 and t = lane%4, so each
// thread owns rows g and g+8 ("row half" h = 0, 1) and the four threads of a quad share a row.
// Scores stay unscaled: exp2 applies scale*log2(e) (sl2) in one FFMA, and the running max is
// kept unscaled too. (FA1 keeps its own forms of these steps: its warps split the keys of a block,
// so its row statistics are combined across the four warps through shared memory.)
#pragma once

#include <cstdint>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"

namespace flashattn {
namespace cuda {

// Soft cap: S <- tanh(S * cap_scale) (the cap itself is folded into sl2).
template <int kNT>
__device__ __forceinline__ void softcap_scores(float (&S)[kNT][4], float cap_scale) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] = tanh_accurate(S[nt][e] * cap_scale);
}

// Edge tile: -inf outside each row's visible keys. rdiag[h] = query position + (sk - sq) of row
// half h; col0 = key index of this thread's column 0 (tile start + 2t). Key j is visible iff
// first_visible_key(rdiag, left) <= j <= last_visible_key(rdiag, right, sk) (mask.cuh), or, with
// kSinks, j < sinks and j <= last_visible_key (sink tokens escape the left window only:
// visible_sink_last in problem.h). Without kSinks the sink test is compiled out, so kernels without
// sink tokens keep the one-interval mask's instructions (FA2's plain kernels; FA3 passes kSinks).
template <bool kSinks = false, int kNT>
__device__ __forceinline__ void mask_scores(float (&S)[kNT][4], const int (&rdiag)[2], int col0, int sk,
                                            int right, int left, int sinks = 0) {
    const int sink_end = sinks - col0;  // columns below it are sink keys
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int hi = last_visible_key(rdiag[h], right, sk) - col0;
        const int lo = first_visible_key(rdiag[h], left) - col0;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + e;
                if (c > hi || (c < lo && (!kSinks || c >= sink_end))) S[nt][2 * h + e] = -INFINITY;
            }
    }
}

// ALiBi: S -= slope[h] * |rdiag[h] - j| for the tile's keys j = col0 + c, slope[h] the row's
// slope in score units (its head's slope times TensorArgs::alibi_to_score). Before the mask, which
// overwrites the invisible keys with -inf; a NaN or inf score stays one (the bias is finite).
// As -sign(slope) * |t|, t = slope * (c - base): an FFMA with the column an immediate, then the
// absolute value and an FFMA, no integer-to-float conversion per score, whose MUFU-rate throughput
// made the first form (abs, I2F, FFMA) cost ALiBi a third of the forward's speed (H200, hdim 128).
// alibi_scores_half: row half h alone (FA3's ALiBi ramp: the rows whose diagonal crosses the tile).
template <int kNT>
__device__ __forceinline__ void alibi_scores_half(float (&S)[kNT][4], int h, int rdiag_h, float s, int col0) {
    const float sb = -s * static_cast<float>(rdiag_h - col0);  // rdiag_h - col0: the diagonal key's tile column
    const float neg_sign = s >= 0.f ? -1.f : 1.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float t = fmaf(s, static_cast<float>(nt * 8 + e), sb);
            S[nt][2 * h + e] = fmaf(neg_sign, fabsf(t), S[nt][2 * h + e]);
        }
}

// Both of the thread's rows (row half h: slope[h], diagonal rdiag[h]).
template <int kNT>
__device__ __forceinline__ void alibi_scores(float (&S)[kNT][4], const int (&rdiag)[2], const float (&slope)[2],
                                             int col0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) alibi_scores_half(S, h, rdiag[h], slope[h], col0);
}

// ALiBi on a key tile that lies wholly on one side of each of the thread's two rows' diagonals
// (every key j <= rdiag[h], or every j >= rdiag[h]), where |rdiag - j| has a known sign: the bias
// is s*(j - rdiag) with s = slope (keys left of the diagonal) or -slope (right of it), that is
// s*c per tile column c (one FFMA with c an immediate, shared by all tiles) plus the per-row
// constant shift[h] = s*(col0 - rdiag), which the softmax takes as a row offset
// (softmax_step_shifted) instead of adding it to every score. The general form above costs an
// FFMA, an absolute value and an FFMA per score; FA2 ran every ALiBi tile through its edge body
// with it (0.73x the plain speed at hdim 128, H200). col0 as for alibi_scores.
template <int kNT>
__device__ __forceinline__ bool alibi_one_side(const int (&rdiag)[2], int col0) {
    // The thread's columns are col0 + nt*8 + e (e = 0, 1): first col0, last col0 + 8*kNT - 7.
    const int last = col0 + 8 * kNT - 7;
    return (last <= rdiag[0] || col0 >= rdiag[0]) && (last <= rdiag[1] || col0 >= rdiag[1]);
}

template <int kNT>
__device__ __forceinline__ void alibi_scores_one_side(float (&S)[kNT][4], const int (&rdiag)[2],
                                                      const float (&slope)[2], int col0, float (&shift)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // Left of the diagonal col0 < rdiag (the thread's last column is col0 + 8*kNT - 7 <= rdiag);
        // right of it col0 >= rdiag.
        const float s = col0 < rdiag[h] ? slope[h] : -slope[h];
        shift[h] = s * static_cast<float>(col0 - rdiag[h]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) S[nt][2 * h + e] = fmaf(s, static_cast<float>(nt * 8 + e), S[nt][2 * h + e]);
    }
}

// The row offsets of alibi_scores_one_side alone, for a caller whose S holds the per-column part
// s*c already (FA2's gemm_qk ramp, one slope for both rows).
__device__ __forceinline__ void alibi_shift_one_side(const int (&rdiag)[2], const float (&slope)[2], int col0,
                                                     float (&shift)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
        shift[h] = (col0 < rdiag[h] ? slope[h] : -slope[h]) * static_cast<float>(col0 - rdiag[h]);
}

// One online-softmax step: the new running max per row, alpha = exp2((m_old - m_new) * sl2) for
// the caller's rescale of O, P = exp2(S*sl2 - m_new*sl2) packed to 16 bits as m16k16 A fragments
// (n8 tiles 2k and 2k+1 form fragment k: no data movement), and the running sums. A row with
// every key masked so far keeps max -inf and gets P = 0, alpha = 1.
// kShift: the tile's scores are S + shift[h] per row half (alibi_scores_one_side; the shift is
// the thread's own, the four threads of a row differ): the row max is taken in the row's frame
// (max of S, plus shift, then the quad's max), and P = exp2(S*sl2 + (shift*sl2 - m*sl2)).
// A row max that does not move keeps its value exactly (alpha = 1), so the shift adds no drift.
template <class E, bool kShift, int kNT>
__device__ __forceinline__ void softmax_step_impl(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                  float sl2, uint32_t (&P)[kNT / 2][4], float (&alpha)[2],
                                                  const float (&shift)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = kShift ? -INFINITY : row_max[h];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(S[nt][2 * h], S[nt][2 * h + 1]));
        // Each thread's shift is its own (its columns start at 2t): into the row's frame before
        // the quad's reduction.
        if constexpr (kShift) mx = fmaxf(row_max[h], mx + shift[h]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ms = mx == -INFINITY ? 0.f : mx * sl2;
        alpha[h] = fast_exp2(row_max[h] * sl2 - ms);
        row_max[h] = mx;
        const float bias = kShift ? fmaf(shift[h], sl2, -ms) : -ms;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const float p0 = fast_exp2(fmaf(S[nt][2 * h], sl2, bias));
            const float p1 = fast_exp2(fmaf(S[nt][2 * h + 1], sl2, bias));
            rs += p0 + p1;
            // n8 tile nt, row half h -> fragment nt/2, register h + 2*(nt%2)
            P[nt >> 1][h + 2 * (nt & 1)] = pack2<E>(p0, p1);
        }
        row_sum[h] = fmaf(row_sum[h], alpha[h], rs);
    }
}

template <class E, int kNT>
__device__ __forceinline__ void softmax_step(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                             float sl2, uint32_t (&P)[kNT / 2][4], float (&alpha)[2]) {
    softmax_step_impl<E, false>(S, row_max, row_sum, sl2, P, alpha, {0.f, 0.f});
}

template <class E, int kNT>
__device__ __forceinline__ void softmax_step_shifted(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                     float sl2, uint32_t (&P)[kNT / 2][4], float (&alpha)[2],
                                                     const float (&shift)[2]) {
    softmax_step_impl<E, true>(S, row_max, row_sum, sl2, P, alpha, shift);
}

// After the last key tile: 1/l per row (0 for a row that saw no key) and the natural-log LSE
// (-inf for such a row). The quad holds partial sums of each row: they are reduced here. NaN
// propagates without a test in the loop: a NaN score is dropped by the fmaxf of the row max but
// becomes P = NaN, so l (and O through P V) is NaN, and so are 1/l and the LSE here; a fully
// masked row has l = 0 exactly (a row that sees a key has l >= 1, its maximum's e^0).
__device__ __forceinline__ void finish_rows(const float (&row_max)[2], const float (&row_sum)[2], float sl2,
                                            float (&inv)[2], float (&lse)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[h] = l == 0.f ? 0.f : 1.f / l;
        lse[h] = l == 0.f ? -INFINITY : (row_max[h] * sl2 + fast_log2(l)) * 0.6931471805599453f;
    }
}

// One element of O / l: 0 for a row that saw no key (inv 0) even when its accumulator is not,
// which happens when a NaN or inf in V of a key it cannot see reached it through P = 0 (0 * NaN is
// NaN). Epilogues only: the loop keeps no such test.
__device__ __forceinline__ float normalize_output(float o, float inv) { return inv == 0.f ? 0.f : o * inv; }

}  // namespace cuda
}  // namespace flashattn
