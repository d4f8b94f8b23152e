// The CPU backward pass (the passes and why they are deterministic: cpu_backward.h).
//
// Every tile recomputes, in fp32, what the forward threw away: S = Q K^T (times the scale, through
// the optional softcap), P = exp(S - LSE) under the causal/window mask (Problem's visible_keys),
// dP = dO V^T, dS = P (dP - D) and dRaw = dS * scale (* (1 - tanh^2) under a softcap), the
// gradient of the raw product q.k. The dQ pass accumulates dQ += dRaw K over its key blocks; the
// dK/dV pass dV += P^T dO and dK += dRaw^T Q over the query blocks of every head of its group.
// Accumulation is fp32 for every dtype (fp32 inputs included); inputs are widened and outputs
// narrowed with cpu_convert.h's scalar conversions (round to nearest even). Memory is O(tile) per
// thread plus one fp32 per query row and head (D); no seqlen_q x seqlen_k buffer exists.
//
// The products use the forward's register-blocked micro-kernel (cpu_simd.h) on operands padded to
// whole vectors; on x86-64 the pass bodies are compiled for the baseline ISA and for AVX2+FMA and
// the variant is chosen once at run time, as the forward's (FLASHATTN_CPU_SIMD=generic forces the
// baseline). The variant fixes the rounding, so results are bitwise reproducible on one machine;
// the two variants may differ in the last bits.
#include "backends/cpu/cpu_backward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>

#include "backends/cpu/cpu_convert.h"
#include "backends/cpu/cpu_kernel.h"
#include "backends/cpu/cpu_simd.h"
#include "backends/cpu/cpu_threads.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace cpu {
namespace {

// Keys per tile, and query rows per tile: 128 while head_dim + head_dim_v <= 256 (at most 450 KiB
// of scratch per thread), else 64 (at most 480 KiB at 256/256), as the forward halves its tile.
// 128 rows halve the K/V blocks the dQ pass widens: 10-30% less time than 64 at 128/128, bf16,
// seqlen 1024 (one core, AVX2, on a shared machine, so noisy).
constexpr int kBlockN = 64;
int choose_block_m(const Problem &p) { return p.head_dim + p.head_dim_v <= 256 ? 128 : 64; }

static_assert(kBlockN % kVector == 0, "key tiles are whole vectors");

// dst[c] = src[c] for c < n, zero up to padded (a row of a row-major tile).
template <flashattn_dtype_t DT>
FLASHATTN_CPU_INLINE void widen_row(const unsigned char *src, int n, int padded, float *dst) {
    for (int c = 0; c < n; ++c) dst[c] = Elem<DT>::load(src, c);
    for (int c = n; c < padded; ++c) dst[c] = 0.0f;
}

// dst[c * ld] = src[c] for c < n (a column of a transposed tile).
template <flashattn_dtype_t DT>
FLASHATTN_CPU_INLINE void widen_column(const unsigned char *src, int n, float *dst, int ld) {
    for (int c = 0; c < n; ++c) dst[static_cast<int64_t>(c) * ld] = Elem<DT>::load(src, c);
}

template <flashattn_dtype_t DT>
FLASHATTN_CPU_INLINE void narrow_row(const float *src, int n, unsigned char *dst) {
    for (int c = 0; c < n; ++c) Elem<DT>::store(dst, c, src[c]);
}

// Offsets (in floats) of one thread's scratch arrays; dp, dvp: the head dims rounded up to vectors.
struct Layout {
    int64_t dp, dvp;
    size_t q, dout, kt, vt, krow, s, ds, acc_k, acc_v, lse, dsum, total;
    Layout(const Problem &p, int block_m) {
        dp = round_up(p.head_dim, kVector);
        dvp = round_up(p.head_dim_v, kVector);
        const size_t bm = static_cast<size_t>(block_m), bn = kBlockN;
        const size_t d = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.head_dim_v);
        const size_t udp = static_cast<size_t>(dp), udvp = static_cast<size_t>(dvp);
        q = 0;                                          // [block_m][dp]  query rows
        dout = q + align_floats(bm * udp);              // [block_m][dvp] dO rows
        kt = dout + align_floats(bm * udvp);            // [d][block_n]   K block, transposed
        vt = kt + align_floats(d * bn);                 // [dv][block_n]  V block, transposed
        krow = vt + align_floats(dv * bn);              // [block_n][dp]  K block (dQ pass)
        s = krow + align_floats(bn * udp);              // [block_m][block_n] scores, then P
        ds = s + align_floats(bm * bn);                 // [block_m][block_n] dP, then dRaw
        acc_k = ds + align_floats(bm * bn);             // [max(bm, bn)][dp] dQ or dK accumulator
        acc_v = acc_k + align_floats(std::max(bm, bn) * udp);  // [block_n][dvp] dV accumulator
        lse = acc_v + align_floats(bn * udvp);          // [block_m] the rows' LSE
        dsum = lse + align_floats(bm);                  // [block_m] the rows' D
        total = dsum + align_floats(bm);
    }
};

// One thread's scratch arrays, where Layout puts them in its slot.
struct Scratch {
    float *q, *dout, *kt, *vt, *krow, *s, *ds, *acc_k, *acc_v, *lse, *dsum;
    Scratch(const Layout &lay, float *base)
        : q(base + lay.q), dout(base + lay.dout), kt(base + lay.kt), vt(base + lay.vt),
          krow(base + lay.krow), s(base + lay.s), ds(base + lay.ds), acc_k(base + lay.acc_k),
          acc_v(base + lay.acc_v), lse(base + lay.lse), dsum(base + lay.dsum) {}
};

// One sequence of the batch: where its rows start and how many there are.
struct Sequence {
    int64_t b;        // batch index
    int64_t q_start;  // first packed row (varlen), else 0
    int64_t k_start;
    int64_t sq, sk;
};

Sequence sequence(const Problem &p, const Tensors &t, int64_t b) {
    if (p.varlen) {
        const int64_t q0 = t.cu_seqlens_q[b], k0 = t.cu_seqlens_k[b];
        return {b, q0, k0, t.cu_seqlens_q[b + 1] - q0, t.cu_seqlens_k[b + 1] - k0};
    }
    return {b, 0, 0, p.seqlen_q, p.seqlen_k};
}

// Element offset of row `row` (within the sequence) of head `head` of a tensor with strides `s`.
int64_t offset(const Problem &p, const Strides &s, const Sequence &seq, bool query, int64_t row,
               int64_t head) {
    const int64_t start = query ? seq.q_start : seq.k_start;
    const int64_t base = p.varlen ? start * s.row : seq.b * s.batch;
    return base + row * s.row + head * s.head;
}

// Index of row 0 of (sequence, query head) in the LSE layout, which D shares.
int64_t lse_index(const Problem &p, const Sequence &seq, int64_t head) {
    return p.varlen ? head * p.total_q + seq.q_start : (seq.b * p.heads_q + head) * p.seqlen_q;
}

// Shared by both passes' work items.
struct Job {
    const Problem *p;
    const Tensors *t;
    float *row_sums;  // D, the LSE's layout
    unsigned char *scratch;
    size_t slot_bytes;
    int block_m;
    int64_t tiles;  // tiles per sequence (query tiles in the dQ pass, key tiles in the dK/dV pass)
    int64_t units;  // batch x heads of the pass
    int64_t items;
    std::atomic<int64_t> next{0};
};

// S -> P and dP -> dRaw, in place, for rows i0 .. i0 + m - 1 (of the sequence) against keys
// j0 .. j0 + nk - 1; masked entries and padding columns up to nkp become 0. A row whose LSE is
// -inf saw no key in the forward and takes no part. Row r's keys taking part: [lo[r], hi[r]).
FLASHATTN_CPU_INLINE void scores_to_grads(const Problem &p, const Sequence &seq, int64_t i0, int m,
                                          int64_t j0, int nk, int nkp, const float *lse,
                                          const float *dsum, float *s, float *ds, int ld, int *lo_out,
                                          int *hi_out) {
    const bool capped = p.softcap > 0.0;
    const float cap = static_cast<float>(p.softcap);
    const float scale = static_cast<float>(p.scale);
    const float mul = static_cast<float>(capped ? p.scale / p.softcap : p.scale);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < m; ++r) {
        float *srow = s + static_cast<int64_t>(r) * ld;
        float *drow = ds + static_cast<int64_t>(r) * ld;
        const KeyRange kr = visible_keys(p, i0 + r, seq.sq, seq.sk);
        int64_t lo = kr.first - j0, hi = kr.last + 1 - j0;
        lo = lo < 0 ? 0 : (lo > nk ? nk : lo);
        hi = hi < lo ? lo : (hi > nk ? nk : hi);
        const float l = lse[r];
        if (l == neg_inf) hi = lo;
        lo_out[r] = static_cast<int>(lo);
        hi_out[r] = static_cast<int>(hi);
        const float d = dsum[r];
        for (int64_t j = 0; j < lo; ++j) srow[j] = drow[j] = 0.0f;
        if (capped) {
            for (int64_t j = lo; j < hi; ++j) {
                const float th = std::tanh(srow[j] * mul);
                const float pj = std::exp(cap * th - l);
                srow[j] = pj;
                drow[j] = pj * (drow[j] - d) * (scale * (1.0f - th * th));
            }
        } else {
            for (int64_t j = lo; j < hi; ++j) {
                const float pj = std::exp(srow[j] * mul - l);
                srow[j] = pj;
                drow[j] = pj * (drow[j] - d) * scale;
            }
        }
        for (int64_t j = hi; j < nkp; ++j) srow[j] = drow[j] = 0.0f;
    }
}

// Widen keys j0 .. j0 + nk - 1 of K and V transposed (kt[c][j], vt[c][j], columns nk..nkp zero)
// and, when krow is set, K row-major too (krow[j][c], padded to dp).
template <flashattn_dtype_t DT>
FLASHATTN_CPU_INLINE void widen_kv_block(const Problem &p, const Tensors &t, const Sequence &seq,
                                         int64_t kvh, int64_t j0, int nk, int nkp, const Layout &lay,
                                         float *kt, float *vt, float *krow) {
    typedef Elem<DT> E;
    const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
    const unsigned char *kb = static_cast<const unsigned char *>(t.k);
    const unsigned char *vb = static_cast<const unsigned char *>(t.v);
    for (int jj = 0; jj < nk; ++jj) {
        const unsigned char *ks = kb + offset(p, p.k, seq, false, j0 + jj, kvh) * E::size;
        const unsigned char *vs = vb + offset(p, p.v, seq, false, j0 + jj, kvh) * E::size;
        widen_column<DT>(ks, d, kt + jj, kBlockN);
        widen_column<DT>(vs, dv, vt + jj, kBlockN);
        if (krow) widen_row<DT>(ks, d, static_cast<int>(lay.dp), krow + jj * lay.dp);
    }
    if (nk < nkp) {
        for (int c = 0; c < d; ++c) std::fill(kt + c * kBlockN + nk, kt + c * kBlockN + nkp, 0.0f);
        for (int c = 0; c < dv; ++c) std::fill(vt + c * kBlockN + nk, vt + c * kBlockN + nkp, 0.0f);
    }
}

// Whether any of the first `rows` rows (of `ld` floats, `cols` used) holds a NaN or inf.
FLASHATTN_CPU_INLINE bool any_nonfinite(const float *a, int rows, int cols, int64_t ld) {
    vi bad = vi{};
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; c += kVector) {
            vf x;
            vload(x, a + r * ld + c);
            bad |= (x - x) != 0.0f;
        }
    int32_t any = 0;
    for (int i = 0; i < kVector; ++i) any |= bad[i];
    return any != 0;
}

// Non-finite inputs and the products over masked pairs. The products below multiply a masked
// pair's P or dS (exactly 0) with a row of K, Q or dO; when that row holds a NaN or inf, 0 * NaN
// would carry it into a gradient the pair does not touch. Those blocks (and only those: the check
// is one pass over the widened operand) take each row's or key's own pairs, in the same order as
// the whole-block product; the zero terms left out change nothing, so the results are the same
// bits either way for finite inputs.

// dQ[r] += dS[r][lo_r..hi_r) K[lo_r..hi_r) for each row.
template <class BL>
FLASHATTN_CPU_INLINE void dq_visible_only(int m, int dp, const float *ds, const float *krow, float *acc,
                                          const int *lo, const int *hi) {
    for (int r = 0; r < m; ++r) {
        if (hi[r] > lo[r])
            gemm<BL>(1, dp, hi[r] - lo[r], ds + r * kBlockN + lo[r], kBlockN, 1, krow + lo[r] * dp, dp,
                     acc + r * dp, dp, true);
    }
}

// acc[j] += sum over the rows r that take part in pair (r, j) of g[r][j] x[r], for each key j:
// runs of consecutive such rows, in ascending order.
template <class BL>
FLASHATTN_CPU_INLINE void dkv_visible_only(int m, int nk, int cols, const float *g, const float *x, float *acc,
                                           const int *lo, const int *hi) {
    for (int j = 0; j < nk; ++j) {
        int r = 0;
        while (r < m) {
            while (r < m && !(lo[r] <= j && j < hi[r])) ++r;
            const int a = r;
            while (r < m && lo[r] <= j && j < hi[r]) ++r;
            if (r > a) gemm<BL>(1, cols, r - a, g + j + a * kBlockN, 1, kBlockN, x + a * cols, cols, acc + j * cols, cols, true);
        }
    }
}

// The dQ pass's item: query rows [i0, i0 + block_m) of one (sequence, query head). Writes D of
// its rows to the workspace and dQ of its rows to the output.
template <flashattn_dtype_t DT, class BL>
FLASHATTN_CPU_INLINE void dq_item_body(const Job &job, int64_t item, float *base) {
    typedef Elem<DT> E;
    const Problem &p = *job.p;
    const Tensors &t = *job.t;
    const int64_t tile = job.tiles - 1 - item / job.units;  // last (heaviest when causal) first
    const int64_t unit = item % job.units;
    const int64_t h = unit % p.heads_q;
    const int64_t kvh = h / p.group_size();
    const Sequence seq = sequence(p, t, unit / p.heads_q);
    const int64_t i0 = tile * job.block_m;
    if (i0 >= seq.sq) return;
    const int m = static_cast<int>(std::min<int64_t>(job.block_m, seq.sq - i0));
    const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
    const Layout lay(p, job.block_m);
    const int dp = static_cast<int>(lay.dp), dvp = static_cast<int>(lay.dvp);
    const Scratch sc(lay, base);

    const unsigned char *qb = static_cast<const unsigned char *>(t.q);
    const unsigned char *ob = static_cast<const unsigned char *>(t.o);
    const unsigned char *dob = static_cast<const unsigned char *>(t.dout);
    const int64_t li = lse_index(p, seq, h) + i0;
    for (int r = 0; r < m; ++r) {
        widen_row<DT>(qb + offset(p, p.q, seq, true, i0 + r, h) * E::size, d, dp, sc.q + r * dp);
        float *dorow = sc.dout + r * dvp;
        widen_row<DT>(dob + offset(p, p.dout, seq, true, i0 + r, h) * E::size, dv, dvp, dorow);
        const unsigned char *orow = ob + offset(p, p.o, seq, true, i0 + r, h) * E::size;
        float sum = 0.0f;
        for (int c = 0; c < dv; ++c) sum += dorow[c] * E::load(orow, c);
        sc.dsum[r] = sum;
        job.row_sums[li + r] = sum;
        sc.lse[r] = t.lse[li + r];
    }
    std::fill(sc.acc_k, sc.acc_k + static_cast<int64_t>(m) * dp, 0.0f);

    const int64_t key_begin = visible_keys(p, i0, seq.sq, seq.sk).first;
    const int64_t key_end = visible_keys(p, i0 + m - 1, seq.sq, seq.sk).last + 1;
    int lo[kMaxBlockM], hi[kMaxBlockM];
    for (int64_t j0 = key_begin; j0 < key_end; j0 += kBlockN) {
        const int nk = static_cast<int>(std::min<int64_t>(kBlockN, key_end - j0));
        const int nkp = static_cast<int>(round_up(nk, kVector));
        widen_kv_block<DT>(p, t, seq, kvh, j0, nk, nkp, lay, sc.kt, sc.vt, sc.krow);
        gemm<BL>(m, nkp, d, sc.q, dp, 1, sc.kt, kBlockN, sc.s, kBlockN, false);        // S (raw)
        gemm<BL>(m, nkp, dv, sc.dout, dvp, 1, sc.vt, kBlockN, sc.ds, kBlockN, false);  // dP
        scores_to_grads(p, seq, i0, m, j0, nk, nkp, sc.lse, sc.dsum, sc.s, sc.ds, kBlockN, lo, hi);
        if (!any_nonfinite(sc.krow, nk, dp, dp))
            gemm<BL>(m, dp, nk, sc.ds, kBlockN, 1, sc.krow, dp, sc.acc_k, dp, true);   // dQ += dRaw K
        else
            dq_visible_only<BL>(m, dp, sc.ds, sc.krow, sc.acc_k, lo, hi);
    }

    unsigned char *dqb = static_cast<unsigned char *>(t.dq);
    for (int r = 0; r < m; ++r) {
        narrow_row<DT>(sc.acc_k + r * dp, d, dqb + offset(p, p.dq, seq, true, i0 + r, h) * E::size);
    }
}

// First row i in [0, n) with pred(i) true, for a predicate false then true along i; n if none.
template <class Pred>
int64_t first_true(int64_t n, Pred pred) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (pred(mid)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

// The dK/dV pass's item: keys [j0, j0 + block_n) of one (sequence, key/value head), against every
// query head of its group (in order) and every query block that sees them (in order).
template <flashattn_dtype_t DT, class BL>
FLASHATTN_CPU_INLINE void dkv_item_body(const Job &job, int64_t item, float *base) {
    typedef Elem<DT> E;
    const Problem &p = *job.p;
    const Tensors &t = *job.t;
    const int64_t tile = item / job.units;  // first (heaviest when causal) first
    const int64_t unit = item % job.units;
    const int64_t kvh = unit % p.heads_kv;
    const Sequence seq = sequence(p, t, unit / p.heads_kv);
    const int64_t j0 = tile * kBlockN;
    if (j0 >= seq.sk) return;
    const int nk = static_cast<int>(std::min<int64_t>(kBlockN, seq.sk - j0));
    const int nkp = static_cast<int>(round_up(nk, kVector));
    const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
    const Layout lay(p, job.block_m);
    const int dp = static_cast<int>(lay.dp), dvp = static_cast<int>(lay.dvp);
    const Scratch sc(lay, base);

    widen_kv_block<DT>(p, t, seq, kvh, j0, nk, nkp, lay, sc.kt, sc.vt, nullptr);
    std::fill(sc.acc_k, sc.acc_k + static_cast<int64_t>(nk) * dp, 0.0f);
    std::fill(sc.acc_v, sc.acc_v + static_cast<int64_t>(nk) * dvp, 0.0f);

    // Both ends of a row's visible keys never decrease along the rows: the rows that may see a key
    // of this block form one interval [q_begin, q_end).
    const int64_t j_last = j0 + nk - 1;
    const int64_t q_begin =
        first_true(seq.sq, [&](int64_t i) { return visible_keys(p, i, seq.sq, seq.sk).last >= j0; });
    const int64_t q_end =
        first_true(seq.sq, [&](int64_t i) { return visible_keys(p, i, seq.sq, seq.sk).first > j_last; });

    const unsigned char *qb = static_cast<const unsigned char *>(t.q);
    const unsigned char *dob = static_cast<const unsigned char *>(t.dout);
    const int64_t group = p.group_size();
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t lbase = lse_index(p, seq, h);
        for (int64_t i0 = q_begin; i0 < q_end; i0 += job.block_m) {
            const int m = static_cast<int>(std::min<int64_t>(job.block_m, q_end - i0));
            for (int r = 0; r < m; ++r) {
                widen_row<DT>(qb + offset(p, p.q, seq, true, i0 + r, h) * E::size, d, dp, sc.q + r * dp);
                widen_row<DT>(dob + offset(p, p.dout, seq, true, i0 + r, h) * E::size, dv, dvp,
                              sc.dout + r * dvp);
                sc.lse[r] = t.lse[lbase + i0 + r];
                sc.dsum[r] = job.row_sums[lbase + i0 + r];
            }
            gemm<BL>(m, nkp, d, sc.q, dp, 1, sc.kt, kBlockN, sc.s, kBlockN, false);        // S (raw)
            gemm<BL>(m, nkp, dv, sc.dout, dvp, 1, sc.vt, kBlockN, sc.ds, kBlockN, false);  // dP
            int lo[kMaxBlockM], hi[kMaxBlockM];
            scores_to_grads(p, seq, i0, m, j0, nk, nkp, sc.lse, sc.dsum, sc.s, sc.ds, kBlockN, lo, hi);
            if (!any_nonfinite(sc.dout, m, dvp, dvp))
                gemm<BL>(nk, dvp, m, sc.s, 1, kBlockN, sc.dout, dvp, sc.acc_v, dvp, true); // dV += P^T dO
            else
                dkv_visible_only<BL>(m, nk, dvp, sc.s, sc.dout, sc.acc_v, lo, hi);
            if (!any_nonfinite(sc.q, m, dp, dp))
                gemm<BL>(nk, dp, m, sc.ds, 1, kBlockN, sc.q, dp, sc.acc_k, dp, true);      // dK += dRaw^T Q
            else
                dkv_visible_only<BL>(m, nk, dp, sc.ds, sc.q, sc.acc_k, lo, hi);
        }
    }

    unsigned char *dkb = static_cast<unsigned char *>(t.dk);
    unsigned char *dvb = static_cast<unsigned char *>(t.dv);
    for (int jj = 0; jj < nk; ++jj) {
        narrow_row<DT>(sc.acc_k + jj * dp, d, dkb + offset(p, p.dk, seq, false, j0 + jj, kvh) * E::size);
        narrow_row<DT>(sc.acc_v + jj * dvp, dv, dvb + offset(p, p.dv, seq, false, j0 + jj, kvh) * E::size);
    }
}

typedef void (*ItemFn)(const Job &, int64_t, float *);

template <flashattn_dtype_t DT>
void dq_generic(const Job &job, int64_t item, float *scratch) {
    dq_item_body<DT, BlockingGeneric>(job, item, scratch);
}
template <flashattn_dtype_t DT>
void dkv_generic(const Job &job, int64_t item, float *scratch) {
    dkv_item_body<DT, BlockingGeneric>(job, item, scratch);
}

#if FLASHATTN_CPU_X86
template <flashattn_dtype_t DT>
__attribute__((target("avx2,fma"))) void dq_avx2(const Job &job, int64_t item, float *scratch) {
    dq_item_body<DT, BlockingAvx2>(job, item, scratch);
}
template <flashattn_dtype_t DT>
__attribute__((target("avx2,fma"))) void dkv_avx2(const Job &job, int64_t item, float *scratch) {
    dkv_item_body<DT, BlockingAvx2>(job, item, scratch);
}
#endif

// The item functions of one dtype and ISA.
struct PassFns {
    ItemFn dq, dkv;
};

template <flashattn_dtype_t DT>
PassFns pass_fns(bool avx2) {
#if FLASHATTN_CPU_X86
    if (avx2) return {dq_avx2<DT>, dkv_avx2<DT>};
#else
    (void)avx2;
#endif
    return {dq_generic<DT>, dkv_generic<DT>};
}

void worker(Job *job, ItemFn fn, size_t slot) noexcept {
    float *scratch = reinterpret_cast<float *>(job->scratch + slot * job->slot_bytes);
    for (;;) {
        const int64_t item = job->next.fetch_add(1, std::memory_order_relaxed);
        if (item >= job->items) break;
        fn(*job, item, scratch);
    }
}

// Run every item of one pass on up to `threads` threads (the calling one included) and join them.
void run_pass(Job *job, ItemFn fn, int64_t threads) {
    if (job->items <= 0) return;
    threads = std::min<int64_t>(threads, job->items);
    run_on_threads(threads, [job, fn](size_t slot) { worker(job, fn, slot); });
}

int64_t dq_items(const Problem &p, int block_m) { return ceil_div(p.seqlen_q, block_m) * p.batch * p.heads_q; }
int64_t dkv_items(const Problem &p) { return ceil_div(p.seqlen_k, kBlockN) * p.batch * p.heads_kv; }

// Whether a count overflows: -1 then.
int64_t checked_items(int64_t tiles, int64_t batch, int64_t heads) {
    int64_t items;
    return mul_add(tiles, batch, 0, &items) && mul_add(items, heads, 0, &items) ? items : -1;
}

flashattn_status_t run_impl(const Problem &p, const BackwardPlan &plan, const WorkspaceLayout &ws,
                            const Tensors &t) {
    const int64_t n_dq = dq_items(p, plan.block_m), n_dkv = dkv_items(p);
    if (n_dq <= 0 && n_dkv <= 0) return FLASHATTN_SUCCESS;
    PassFns fns;
    switch (p.dtype) {
    case FLASHATTN_DTYPE_FP32: fns = pass_fns<FLASHATTN_DTYPE_FP32>(use_avx2_fma()); break;
    case FLASHATTN_DTYPE_FP16: fns = pass_fns<FLASHATTN_DTYPE_FP16>(use_avx2_fma()); break;
    case FLASHATTN_DTYPE_BF16: fns = pass_fns<FLASHATTN_DTYPE_BF16>(use_avx2_fma()); break;
    default:
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: backward planned for an unsupported dtype");
    }
    // dQ pass first: it writes D, which the dK/dV pass reads.
    Job dq;
    dq.p = &p;
    dq.t = &t;
    dq.row_sums = ws.at<float>(t.workspace, plan.row_sums);
    dq.scratch = ws.at<unsigned char>(t.workspace, plan.scratch);
    dq.slot_bytes = plan.slot_bytes;
    dq.block_m = plan.block_m;
    dq.tiles = ceil_div(p.seqlen_q, plan.block_m);
    dq.units = p.batch * p.heads_q;
    dq.items = n_dq;
    run_pass(&dq, fns.dq, plan.threads);

    Job dkv;
    dkv.p = &p;
    dkv.t = &t;
    dkv.row_sums = dq.row_sums;
    dkv.scratch = dq.scratch;
    dkv.slot_bytes = plan.slot_bytes;
    dkv.block_m = plan.block_m;
    dkv.tiles = ceil_div(p.seqlen_k, kBlockN);
    dkv.units = p.batch * p.heads_kv;
    dkv.items = n_dkv;
    run_pass(&dkv, fns.dkv, plan.threads);
    return FLASHATTN_SUCCESS;
}

}  // namespace

bool backward_work_fits(const Problem &p) {
    return checked_items(ceil_div(p.seqlen_q, choose_block_m(p)), p.batch, p.heads_q) >= 0 &&
           checked_items(ceil_div(p.seqlen_k, kBlockN), p.batch, p.heads_kv) >= 0;
}

// The backward runs every problem the forward runs: the same element types and products.
std::string backward_unsupported_reason(const Problem &p) { return unsupported_reason(p); }

BackwardPlan plan_backward(const Problem &p, int64_t threads, WorkspaceLayout *ws) {
    BackwardPlan plan;
    // Tile shapes do not depend on the thread count, so neither do the results.
    plan.block_m = choose_block_m(p);
    const int64_t items = std::max(dq_items(p, plan.block_m), dkv_items(p));
    plan.threads = std::max<int64_t>(1, std::min(threads, items));
    plan.slot_bytes = align_up(Layout(p, plan.block_m).total * sizeof(float), kWorkspaceAlignment);
    plan.scratch = ws->add("cpu backward per-thread scratch", static_cast<size_t>(plan.threads) * plan.slot_bytes);
    plan.row_sums = ws->add("cpu backward dO.O row sums",
                            static_cast<size_t>(p.heads_q) * static_cast<size_t>(p.total_query_rows()) * sizeof(float));
    return plan;
}

flashattn_status_t run_backward(const Problem &p, const BackwardPlan &plan, const WorkspaceLayout &ws,
                                const Tensors &t) {
    try {
        return run_impl(p, plan, ws, t);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception in the backward pass: %s", e.what());
    } catch (...) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception in the backward pass");
    }
}

}  // namespace cpu
}  // namespace flashattn
