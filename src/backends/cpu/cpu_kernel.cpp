// The CPU FlashAttention tile kernel.
//
// One call computes a block of query rows of one sequence and one query head (or, for short queries
// under GQA/MQA, of several query heads sharing a key/value head, their rows interleaved: see
// cpu::Slice). The rows are widened to fp32
// (pre-multiplied by the softmax scale) once; the keys they may see are then streamed in blocks of
// block_n: each K/V block is widened to fp32 once into thread-private scratch (K transposed so that
// the score product runs along contiguous keys) and reused by every row of the block. Scores go
// through the optional logit cap and the causal/window mask, then the online softmax: each row keeps
// its running maximum m and sum l, rescales its fp32 output accumulator by exp(m_old - m_new) when
// the maximum grows, and divides by l once at the end. Memory is O(block) per thread; no
// seqlen_q x seqlen_k buffer ever exists.
//
// Both matrix products use cpu_simd.h's register-blocked micro-kernel (GCC/Clang vector extensions,
// 8 floats), so the hot loops are SIMD at -O2 without relying on the auto-vectoriser; fp16/bf16 are
// widened 8 at a time with integer vector operations (cpu_convert.h's Elem). On x86-64 the kernel is
// compiled twice, for the baseline ISA (4 x 8 register blocks) and for AVX2+FMA (6 x 16), and the
// variant is chosen once at run time (FLASHATTN_CPU_SIMD=generic forces the baseline, for tests).
#include "backends/cpu/cpu_kernel.h"

#include <cmath>
#include <limits>

#include "backends/cpu/cpu_convert.h"
#include "backends/cpu/cpu_simd.h"

namespace flashattn {
namespace cpu {
namespace {

// The row maximum propagates NaN (a NaN score makes the row NaN; fmax-style maxima drop it, which
// silently dropped a key, or every key of a row when the NaN sat in lane 0).
FLASHATTN_CPU_INLINE float vmax_lanes(const vf &v) {
    float m = v[0];
    for (int i = 1; i < kVector; ++i) m = (v[i] > m || v[i] != v[i]) ? v[i] : m;
    return m;
}

FLASHATTN_CPU_INLINE float vsum_lanes(const vf &v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// r = max(r, a), lane-wise; a NaN in either stays (see vmax_lanes).
FLASHATTN_CPU_INLINE void vmax_into(vf &r, const vf &a) {
    const vi take = (a > r) | (a != a);
    r = (vf)(((vi)a & take) | ((vi)r & ~take));
}

// Lanes of x that are not finite (NaN or +-inf) set the matching lanes of `bad`.
FLASHATTN_CPU_INLINE void vflag_nonfinite(vi &bad, const vf &x) { bad |= (x - x) != 0.0f; }

FLASHATTN_CPU_INLINE bool vany(const vi &v) {
    int32_t any = 0;
    for (int i = 0; i < kVector; ++i) any |= v[i];
    return any != 0;
}

// x = exp(x) for x <= 0, lane-wise: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
// Taylor polynomial for e^r (truncation error < 6e-9 relative, below fp32 rounding) and the
// exponent added in the integer domain. Lanes below -86 (including -inf) give exactly 0; e^-86 is
// 4e-38, far below anything a softmax row (whose largest term is 1) can resolve.
FLASHATTN_CPU_INLINE void vexp_nonpositive(vf &x) {
    vf lo;
    vsplat(lo, -86.0f);
    const vi keep = x >= lo;
    const vf y = (vf)(((vi)x & keep) | ((vi)lo & ~keep));
    const vf t = y * 1.44269504088896341f;  // x / ln 2
    const vf n = (t + 12582912.0f) - 12582912.0f;  // round to nearest integer (|t| < 2^22)
    vf r = y - n * 0.693145751953125f;           // ln 2, high part (exact product)
    r = r - n * 1.428606820309417232e-6f;        // ln 2, low part
    vf p;
    vsplat(p, 1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vi e = __builtin_convertvector(n, vi) << 23;
    x = (vf)(((vi)p + e) & keep);
}

constexpr int kPrefetchRows = 8;

FLASHATTN_CPU_INLINE void prefetch_row(const unsigned char *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

// dst[c * stride] = src[c] * mul for c < n (widened to fp32); stride 1 is a plain row copy.
template <flashattn_dtype_t DT>
FLASHATTN_CPU_INLINE void widen_row(const unsigned char *src, int n, float mul, float *dst,
                                    size_t stride) {
    typedef Elem<DT> E;
    int c = 0;
    for (; c + kVector <= n; c += kVector) {
        vf x;
        E::widen8(x, src + static_cast<size_t>(c) * E::size);
        if (mul != 1.0f) x = x * mul;
        if (stride == 1) {
            vstore(dst + c, x);
        } else {
            for (int i = 0; i < kVector; ++i) dst[static_cast<size_t>(c + i) * stride] = x[i];
        }
    }
    for (; c < n; ++c) dst[static_cast<size_t>(c) * stride] = E::load(src, c) * mul;
}

// Offsets (in floats) of the scratch arrays of one thread.
struct Layout {
    size_t q, kt, v, s, o, m, l, total;
    Layout(const Problem &p, const TileShape &shape) {
        const size_t bm = static_cast<size_t>(shape.block_m);
        const size_t bn = static_cast<size_t>(shape.block_n);
        const size_t d = static_cast<size_t>(p.head_dim);
        const size_t dvp = static_cast<size_t>(round_up(p.head_dim_v, kVector));
        q = 0;                                // [block_m][d]      query rows, scaled
        kt = q + align_floats(bm * d);        // [d][block_n]      K block, transposed
        v = kt + align_floats(d * bn);        // [block_n][dvp]    V block
        s = v + align_floats(bn * dvp);       // [block_m][block_n] scores, then probabilities
        o = s + align_floats(bm * bn);        // [block_m][dvp]    output accumulator
        m = o + align_floats(bm * dvp);       // [block_m]         running maximum
        l = m + align_floats(bm);             // [block_m]         running sum
        total = l + align_floats(bm);
    }
};

// ALiBi: srow[jj] -= slope * |diagonal key - key| for keys j0 .. j0 + nk - 1 of packed row
// `packed` (its head picks the slope).
FLASHATTN_CPU_INLINE void add_alibi(const Problem &p, const Slice &sl, int64_t packed, int64_t j0, int nk,
                                    float *srow) {
    const int64_t row = packed / sl.heads;
    const float slope = sl.alibi[packed % sl.heads];
    for (int jj = 0; jj < nk; ++jj)
        srow[jj] -= slope * static_cast<float>(alibi_distance(p, row, j0 + jj, sl.seqlen_q, sl.seqlen_k));
}

// The sink logit joins a row's (m, l) as one more term that carries no value: returns the factor
// exp(m_old - m_new) the row's accumulator takes (0 when the row saw no key).
FLASHATTN_CPU_INLINE float join_sink(float sink, float *m, float *l) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    if (sink == neg_inf) return 1.0f;  // no sink: nothing changes
    const float m_new = sink > *m ? sink : *m;
    const float alpha = *m == neg_inf ? 0.0f : std::exp(*m - m_new);
    *l = *l * alpha + std::exp(sink - m_new);
    *m = m_new;
    return alpha;
}

// One query row (of `head` in the pack) against its visible keys (sink tokens [0, sink_last] and
// the window [first, last]), all in double: scores (softcap, ALiBi), softmax with the sink logit,
// output. The fallback of rows the float path cannot compute (see the epilogue of tile_body); its
// order of operations is fixed, so it is as reproducible as the float path. NaN anywhere in the
// scores gives O = LSE = NaN; an infinite maximum (inf inputs) gives NaN too, as inf - inf does.
template <flashattn_dtype_t DT>
__attribute__((noinline)) void exact_row(const Problem &p, const Slice &sl, int64_t row, int64_t head,
                                         int64_t first, int64_t last, unsigned char *dst, float *lse) {
    typedef Elem<DT> E;
    const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
    const unsigned char *q = sl.q + (row * sl.q_row + head * sl.q_head) * static_cast<int64_t>(E::size);
    const int64_t sink_last = visible_sink_last(p, row, sl.seqlen_q, sl.seqlen_k);
    const double slope = sl.alibi != nullptr ? sl.alibi[head] : 0.0;
    auto score = [&](int64_t j) {
        const unsigned char *k = sl.k + key_offset(sl, j, sl.k_row, sl.k_page) * static_cast<int64_t>(E::size);
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(E::load(q, c)) * E::load(k, c);
        const double s = dot * p.scale;
        const double capped = p.softcap > 0.0 ? p.softcap * std::tanh(s / p.softcap) : s;
        return capped - slope * static_cast<double>(alibi_distance(p, row, j, sl.seqlen_q, sl.seqlen_k));
    };
    // The visible keys in ascending order: the sinks below the window, then the window.
    auto for_each_key = [&](auto fn) {
        for (int64_t j = 0; j <= sink_last && j < first; ++j) fn(j);
        for (int64_t j = first; j <= last; ++j) fn(j);
    };
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for_each_key([&](int64_t j) {
        const double s = score(j);
        nan = nan || s != s;
        m = s > m ? s : m;
    });
    const double sink = sl.sink != nullptr ? sl.sink[head] : -std::numeric_limits<double>::infinity();
    nan = nan || sink != sink;
    m = sink > m ? sink : m;
    double out[256];  // head_dim_v <= 256 (params.cpp)
    for (int c = 0; c < dv; ++c) out[c] = 0.0;
    double l = 0.0;
    if (nan || !std::isfinite(m)) {
        l = std::numeric_limits<double>::quiet_NaN();
    } else {
        for_each_key([&](int64_t j) {
            const double pj = std::exp(score(j) - m);
            const unsigned char *v = sl.v + key_offset(sl, j, sl.v_row, sl.v_page) * static_cast<int64_t>(E::size);
            l += pj;
            for (int c = 0; c < dv; ++c) out[c] += pj * E::load(v, c);
        });
        if (sink != -std::numeric_limits<double>::infinity()) l += std::exp(sink - m);
    }
    for (int c = 0; c < dv; ++c) E::store(dst, c, static_cast<float>(out[c] / l));
    if (lse) *lse = static_cast<float>(m + std::log(l));
}

template <flashattn_dtype_t DT, class BL>
FLASHATTN_CPU_INLINE void tile_body(const Problem &p, const TileShape &shape, const Slice &sl,
                                    int64_t row0, int64_t rows64, void *scratch) {
    typedef Elem<DT> E;
    const int d = static_cast<int>(p.head_dim);
    const int dv = static_cast<int>(p.head_dim_v);
    const int dvp = static_cast<int>(round_up(dv, kVector));
    const int bn = shape.block_n;
    const int rows = static_cast<int>(rows64 < kMaxBlockM ? rows64 : kMaxBlockM);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const bool capped = p.softcap > 0.0;
    const float cap = static_cast<float>(p.softcap);
    // s = scale*q.k, or cap*tanh(scale*q.k/cap): fold scale (and 1/cap) into Q.
    const float q_mul = static_cast<float>(capped ? p.scale / p.softcap : p.scale);

    const Layout lay(p, shape);
    float *const base = static_cast<float *>(scratch);
    float *const qs = base + lay.q;
    float *const kt = base + lay.kt;
    float *const vs = base + lay.v;
    float *const ss = base + lay.s;
    float *const oa = base + lay.o;
    float *const mrow = base + lay.m;
    float *const lrow = base + lay.l;

    // Visible keys of each row; both ends are non-decreasing in the (packed) row, so the block
    // needs keys [first of its first row, last of its last row] and nothing else.
    const int64_t heads = sl.heads;
    int64_t first[kMaxBlockM];
    int64_t last[kMaxBlockM];
    for (int r = 0; r < rows; ++r) {
        const KeyRange kr = visible_keys(p, (row0 + r) / heads, sl.seqlen_q, sl.seqlen_k);
        first[r] = kr.first;
        last[r] = kr.last;
    }
    // Key j's rows of K and V (contiguous, or through the page table).
    auto k_at = [&](int64_t j) { return sl.k + key_offset(sl, j, sl.k_row, sl.k_page) * static_cast<int64_t>(E::size); };
    auto v_at = [&](int64_t j) { return sl.v + key_offset(sl, j, sl.v_row, sl.v_page) * static_cast<int64_t>(E::size); };
    const size_t k_bytes = static_cast<size_t>(d) * E::size;
    const size_t v_bytes = static_cast<size_t>(dv) * E::size;
    const int64_t window_begin = visible_keys(p, row0 / heads, sl.seqlen_q, sl.seqlen_k).first;
    const int64_t key_end =
        visible_keys(p, (row0 + rows - 1) / heads, sl.seqlen_q, sl.seqlen_k).last + 1;
    // Sink tokens: keys [0, sink_end) are seen too (sink_end of the last row is the largest); the
    // blocks between sink_end and window_begin no row sees are skipped (next_block).
    const int64_t sink_end =
        visible_sink_last(p, (row0 + rows - 1) / heads, sl.seqlen_q, sl.seqlen_k) + 1;
    // Blocks start at multiples of block_n (see the key loop), the window's first one too.
    const int64_t window_block = window_begin < key_end ? window_begin / bn * bn : key_end;
    const int64_t key_begin = sink_end > 0 ? 0 : window_block;
    auto next_block = [&](int64_t j) { return j >= sink_end && j < window_block ? window_block : j; };

    for (int r = 0; r < rows; ++r) {
        const int64_t row = (row0 + r) / heads, head = (row0 + r) % heads;
        const unsigned char *src =
            sl.q + (row * sl.q_row + head * sl.q_head) * static_cast<int64_t>(E::size);
        widen_row<DT>(src, d, q_mul, qs + static_cast<size_t>(r) * d, 1);
        mrow[r] = neg_inf;
        lrow[r] = 0.0f;
        float *acc = oa + static_cast<size_t>(r) * dvp;
        for (int c = 0; c < dvp; ++c) acc[c] = 0.0f;
    }

    // Key blocks start at multiples of block_n, not at the tile's first visible key: every row then
    // meets the same blocks, split at the same keys, whichever tile or GQA pack it falls in, so its
    // result does not depend on the tiling (nor on the thread count, which chooses the pack).
    int lo_blk[kMaxBlockM];  // each row's visible keys in the current block: [lo, hi), sinks [0, shi)
    int hi_blk[kMaxBlockM];
    int shi_blk[kMaxBlockM];
    // Rows with a score the float path cannot represent (a product past the float range gives an
    // inf or NaN score even where the exact score is finite): the epilogue computes them again.
    bool row_exact[kMaxBlockM];
    for (int r = 0; r < rows; ++r) row_exact[r] = false;
    for (int64_t j0 = next_block(key_begin); j0 < key_end; j0 = next_block(j0 + bn)) {
        const int nk = static_cast<int>(key_end - j0 < bn ? key_end - j0 : bn);
        const int nkp = static_cast<int>(round_up(nk, kVector));

        // Widen the K block (transposed: kt[c][j]) and the V block (vs[j][c], zero-padded to dvp).
        // Rows of K/V are usually a page or more apart, out of the hardware prefetchers' reach:
        // prefetch K a few rows ahead and V one block ahead, and the next K block while widening V.
        for (int jj = 0; jj < nk; ++jj) {
            const unsigned char *src = k_at(j0 + jj);
            if (j0 + jj + kPrefetchRows < key_end) prefetch_row(k_at(j0 + jj + kPrefetchRows), k_bytes);
            prefetch_row(v_at(j0 + jj), v_bytes);
            widen_row<DT>(src, d, 1.0f, kt + jj, static_cast<size_t>(bn));
        }
        if (nk < nkp) {
            for (int c = 0; c < d; ++c) {
                float *dst = kt + static_cast<size_t>(c) * bn;
                for (int jj = nk; jj < nkp; ++jj) dst[jj] = 0.0f;
            }
        }
        vi v_bad = vi{};  // lanes that met a NaN or inf in V (see the P V product below)
        for (int jj = 0; jj < nk; ++jj) {
            const unsigned char *src = v_at(j0 + jj);
            if (j0 + bn + jj < key_end) prefetch_row(k_at(j0 + bn + jj), k_bytes);
            float *dst = vs + static_cast<size_t>(jj) * dvp;
            widen_row<DT>(src, dv, 1.0f, dst, 1);
            for (int c = dv; c < dvp; ++c) dst[c] = 0.0f;
            for (int c = 0; c < dvp; c += kVector) {
                vf x;
                vload(x, dst + c);
                vflag_nonfinite(v_bad, x);
            }
        }

        // Scores for the whole block of rows.
        gemm<BL>(rows, nkp, d, qs, d, 1, kt, bn, ss, bn, false);

        for (int r = 0; r < rows; ++r) {
            float *srow = ss + static_cast<size_t>(r) * bn;
            if (capped) {
                for (int jj = 0; jj < nk; ++jj) srow[jj] = cap * std::tanh(srow[jj]);
            }
            if (sl.alibi != nullptr) add_alibi(p, sl, row0 + r, j0, nk, srow);
            // Visible keys of this row inside the block: [lo, hi), and sink keys [0, shi).
            int64_t lo = first[r] - j0;
            int64_t hi = last[r] + 1 - j0;
            lo = lo < 0 ? 0 : (lo > nk ? nk : lo);
            hi = hi < lo ? lo : (hi > nk ? nk : hi);
            int64_t shi = sink_end > 0 ? visible_sink_last(p, (row0 + r) / heads, sl.seqlen_q, sl.seqlen_k) + 1 - j0 : 0;
            shi = shi < 0 ? 0 : (shi > nk ? nk : shi);
            lo_blk[r] = static_cast<int>(lo);
            hi_blk[r] = static_cast<int>(hi);
            shi_blk[r] = static_cast<int>(shi);
            if (lo == hi && shi == 0) {  // the row sees nothing here: it takes no part in this block
                for (int jj = 0; jj < nkp; ++jj) srow[jj] = 0.0f;
                continue;
            }
            // Before the mask writes its -inf: a visible key's score that is not finite (past the
            // float range, or NaN) sends the row to the exact path; invisible keys change nothing.
            if (!row_exact[r]) {
                bool bad = false;
                for (int jj = 0; jj < shi; ++jj) bad |= srow[jj] - srow[jj] != 0.0f;
                for (int64_t jj = lo > shi ? lo : shi; jj < hi; ++jj) bad |= srow[jj] - srow[jj] != 0.0f;
                row_exact[r] = bad;
            }
            for (int jj = static_cast<int>(shi); jj < lo; ++jj) srow[jj] = neg_inf;
            for (int jj = static_cast<int>(hi > shi ? hi : shi); jj < nkp; ++jj) srow[jj] = neg_inf;

            vf vmax;
            vload(vmax, srow);
            for (int jj = kVector; jj < nkp; jj += kVector) {
                vf x;
                vload(x, srow + jj);
                vmax_into(vmax, x);
            }
            const float block_max = vmax_lanes(vmax);
            const float m_old = mrow[r];
            // A NaN score makes m NaN for good: P of this block becomes 0 (vexp_nonpositive), alpha
            // of later blocks NaN, and the epilogue finds the row's m not finite.
            const float m_new = (block_max > m_old || block_max != block_max) ? block_max : m_old;
            // Probabilities relative to the new maximum, and their sum.
            vf vm, vsum = vf{};
            vsplat(vm, m_new);
            for (int jj = 0; jj < nkp; jj += kVector) {
                vf x;
                vload(x, srow + jj);
                x = x - vm;
                vexp_nonpositive(x);
                vsum += x;
                vstore(srow + jj, x);
            }
            const float block_sum = vsum_lanes(vsum);
            if (m_old == neg_inf) {  // first keys this row sees: nothing to rescale
                lrow[r] = block_sum;
            } else {
                const float alpha = std::exp(m_old - m_new);
                lrow[r] = lrow[r] * alpha + block_sum;
                if (alpha != 1.0f) {
                    float *acc = oa + static_cast<size_t>(r) * dvp;
                    for (int c = 0; c < dvp; c += kVector) {
                        vf x;
                        vload(x, acc + c);
                        x = x * alpha;
                        vstore(acc + c, x);
                    }
                }
            }
            mrow[r] = m_new;
        }

        // O += P V. A NaN or inf in V would reach every row of the tile through P = 0 (0 * inf is
        // NaN); then each row takes only its visible keys. Both forms add the same products in
        // the same order (the zero terms left out change nothing), so the result does not depend
        // on which form ran.
        if (!vany(v_bad)) {
            gemm<BL>(rows, dvp, nk, ss, bn, 1, vs, dvp, oa, dvp, true);
        } else {
            // A row's keys here: the sinks [0, shi), then the window's part above them [lo, hi).
            for (int r = 0; r < rows; ++r) {
                const int shi = shi_blk[r], lo = lo_blk[r] > shi ? lo_blk[r] : shi, hi = hi_blk[r];
                float *orow = oa + static_cast<size_t>(r) * dvp;
                const float *prow = ss + static_cast<size_t>(r) * bn;
                if (shi > 0) gemm<BL>(1, dvp, shi, prow, bn, 1, vs, dvp, orow, dvp, true);
                if (hi > lo)
                    gemm<BL>(1, dvp, hi - lo, prow + lo, bn, 1, vs + static_cast<size_t>(lo) * dvp, dvp, orow, dvp, true);
            }
        }
    }

    // Normalise once and narrow to the output type. Rows that see no key get O = 0, LSE = -inf
    // (decided by their key interval, not by m, which a NaN or an overflow also leaves not finite).
    // A row that sees keys but whose m is not finite (a NaN or inf input, or scores past the float
    // range: fp32/bf16 inputs of magnitude ~1e19 and up) is computed again in double, which
    // represents every such score and propagates NaN.
    for (int r = 0; r < rows; ++r) {
        const int64_t row = (row0 + r) / heads, head = (row0 + r) % heads;
        unsigned char *dst = sl.o + (row * sl.o_row + head * sl.o_head) * static_cast<int64_t>(E::size);
        float *lse = sl.lse ? sl.lse + head * sl.lse_head + row : nullptr;
        const float *acc = oa + static_cast<size_t>(r) * dvp;
        const bool sees_keys =
            first[r] <= last[r] || visible_sink_last(p, row, sl.seqlen_q, sl.seqlen_k) >= 0;
        float out_mul = 1.0f;  // what the sink's rescaling multiplies the accumulator by
        if (!sees_keys) {  // O = 0; the LSE is the sink logit's alone (-inf without one)
            for (int c = 0; c < dv; ++c) E::store(dst, c, 0.0f);
            if (lse) *lse = sl.sink != nullptr ? sl.sink[head] : neg_inf;
        } else if (row_exact[r] || !std::isfinite(mrow[r])) {
            exact_row<DT>(p, sl, row, head, first[r], last[r], dst, lse);
        } else {
            if (sl.sink != nullptr) out_mul = join_sink(sl.sink[head], &mrow[r], &lrow[r]);
            const float inv = out_mul / lrow[r];
            for (int c = 0; c < dv; ++c) E::store(dst, c, acc[c] * inv);
            if (lse) *lse = mrow[r] + std::log(lrow[r]);
        }
    }
}

typedef void (*TileFn)(const Problem &, const TileShape &, const Slice &, int64_t, int64_t, void *);

template <flashattn_dtype_t DT>
void tile_generic(const Problem &p, const TileShape &shape, const Slice &sl, int64_t row0,
                  int64_t rows, void *scratch) {
    tile_body<DT, BlockingGeneric>(p, shape, sl, row0, rows, scratch);
}

#if FLASHATTN_CPU_X86
template <flashattn_dtype_t DT>
__attribute__((target("avx2,fma"))) void tile_avx2(const Problem &p, const TileShape &shape,
                                                   const Slice &sl, int64_t row0, int64_t rows,
                                                   void *scratch) {
    tile_body<DT, BlockingAvx2>(p, shape, sl, row0, rows, scratch);
}
#endif

struct TileTable {
    TileFn fp32, fp16, bf16;
    const char *name;
};

TileTable pick_table() {
#if FLASHATTN_CPU_X86
    if (use_avx2_fma()) {
        return {tile_avx2<FLASHATTN_DTYPE_FP32>, tile_avx2<FLASHATTN_DTYPE_FP16>,
                tile_avx2<FLASHATTN_DTYPE_BF16>, "avx2+fma"};
    }
#endif
    return {tile_generic<FLASHATTN_DTYPE_FP32>, tile_generic<FLASHATTN_DTYPE_FP16>,
            tile_generic<FLASHATTN_DTYPE_BF16>, "generic"};
}

const TileTable &table() {
    static const TileTable t = pick_table();
    return t;
}

}  // namespace

std::string unsupported_reason(const Problem &p) {
    switch (p.dtype) {
    case FLASHATTN_DTYPE_FP32:
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16:
        break;
    case FLASHATTN_DTYPE_FP8_E4M3:
        return "the CPU backend does not support FP8 (E4M3) tensors; use fp16, bf16 or fp32";
    default:
        return "the CPU backend supports only fp16, bf16 and fp32 tensors";
    }
    if (p.head_dim < 1 || p.head_dim_v < 1) {
        return "the CPU backend needs head_dim and head_dim_v of at least 1";
    }
    return std::string();
}

size_t scratch_bytes(const Problem &p, const TileShape &shape) {
    return Layout(p, shape).total * sizeof(float);
}

void run_tile(const Problem &p, const TileShape &shape, const Slice &slice, int64_t row0,
              int64_t rows, void *scratch) {
    if (rows <= 0) return;
    const TileTable &t = table();
    switch (p.dtype) {
    case FLASHATTN_DTYPE_FP32:
        t.fp32(p, shape, slice, row0, rows, scratch);
        break;
    case FLASHATTN_DTYPE_FP16:
        t.fp16(p, shape, slice, row0, rows, scratch);
        break;
    case FLASHATTN_DTYPE_BF16:
        t.bf16(p, shape, slice, row0, rows, scratch);
        break;
    default:
        break;  // unsupported_reason() keeps other types away
    }
}

const char *simd_path() { return table().name; }

}  // namespace cpu
}  // namespace flashattn
