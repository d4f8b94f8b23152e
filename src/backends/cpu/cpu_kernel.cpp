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

// One query row (of `head` in the pack) against keys [first, last], all in double: scores, softmax,
// output. The fallback of rows the float path cannot compute (see the epilogue of tile_body); its
// order of operations is fixed, so it is as reproducible as the float path. NaN anywhere in the
// scores gives O = LSE = NaN; an infinite maximum (inf inputs) gives NaN too, as inf - inf does.
template <flashattn_dtype_t DT>
__attribute__((noinline)) void exact_row(const Problem &p, const Slice &sl, int64_t row, int64_t head,
                                         int64_t first, int64_t last, unsigned char *dst, float *lse) {
    typedef Elem<DT> E;
    const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_v);
    const unsigned char *q = sl.q + (row * sl.q_row + head * sl.q_head) * static_cast<int64_t>(E::size);
    auto score = [&](int64_t j) {
        const unsigned char *k = sl.k + j * sl.k_row * static_cast<int64_t>(E::size);
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(E::load(q, c)) * E::load(k, c);
        const double s = dot * p.scale;
        return p.softcap > 0.0 ? p.softcap * std::tanh(s / p.softcap) : s;
    };
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t j = first; j <= last; ++j) {
        const double s = score(j);
        nan = nan || s != s;
        m = s > m ? s : m;
    }
    double out[256];  // head_dim_v <= 256 (params.cpp)
    for (int c = 0; c < dv; ++c) out[c] = 0.0;
    double l = 0.0;
    if (nan || !std::isfinite(m)) {
        l = std::numeric_limits<double>::quiet_NaN();
    } else {
        for (int64_t j = first; j <= last; ++j) {
            const double pj = std::exp(score(j) - m);
            const unsigned char *v = sl.v + j * sl.v_row * static_cast<int64_t>(E::size);
            l += pj;
            for (int c = 0; c < dv; ++c) out[c] += pj * E::load(v, c);
        }
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
    const int64_t k_row_bytes = sl.k_row * static_cast<int64_t>(E::size);
    const int64_t v_row_bytes = sl.v_row * static_cast<int64_t>(E::size);
    const size_t k_bytes = static_cast<size_t>(d) * E::size;
    const size_t v_bytes = static_cast<size_t>(dv) * E::size;
    const int64_t key_begin = visible_keys(p, row0 / heads, sl.seqlen_q, sl.seqlen_k).first;
    const int64_t key_end =
        visible_keys(p, (row0 + rows - 1) / heads, sl.seqlen_q, sl.seqlen_k).last + 1;

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
    int lo_blk[kMaxBlockM];  // each row's visible keys in the current block: [lo, hi)
    int hi_blk[kMaxBlockM];
    const int64_t key_start = key_begin < key_end ? key_begin / bn * bn : key_end;
    for (int64_t j0 = key_start; j0 < key_end; j0 += bn) {
        const int nk = static_cast<int>(key_end - j0 < bn ? key_end - j0 : bn);
        const int nkp = static_cast<int>(round_up(nk, kVector));

        // Widen the K block (transposed: kt[c][j]) and the V block (vs[j][c], zero-padded to dvp).
        // Rows of K/V are usually a page or more apart, out of the hardware prefetchers' reach:
        // prefetch K a few rows ahead and V one block ahead, and the next K block while widening V.
        for (int jj = 0; jj < nk; ++jj) {
            const unsigned char *src = sl.k + (j0 + jj) * sl.k_row * static_cast<int64_t>(E::size);
            if (j0 + jj + kPrefetchRows < key_end) prefetch_row(src + kPrefetchRows * k_row_bytes, k_bytes);
            prefetch_row(sl.v + (j0 + jj) * v_row_bytes, v_bytes);
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
            const unsigned char *src = sl.v + (j0 + jj) * sl.v_row * static_cast<int64_t>(E::size);
            if (j0 + bn + jj < key_end) prefetch_row(sl.k + (j0 + bn + jj) * k_row_bytes, k_bytes);
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
            // Visible keys of this row inside the block: [lo, hi).
            int64_t lo = first[r] - j0;
            int64_t hi = last[r] + 1 - j0;
            lo = lo < 0 ? 0 : (lo > nk ? nk : lo);
            hi = hi < lo ? lo : (hi > nk ? nk : hi);
            lo_blk[r] = static_cast<int>(lo);
            hi_blk[r] = static_cast<int>(hi);
            if (lo == hi) {  // the row sees nothing here: it takes no part in this block
                for (int jj = 0; jj < nkp; ++jj) srow[jj] = 0.0f;
                continue;
            }
            for (int jj = 0; jj < lo; ++jj) srow[jj] = neg_inf;
            for (int jj = static_cast<int>(hi); jj < nkp; ++jj) srow[jj] = neg_inf;

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
            for (int r = 0; r < rows; ++r) {
                const int lo = lo_blk[r], n = hi_blk[r] - lo;
                if (n > 0)
                    gemm<BL>(1, dvp, n, ss + static_cast<size_t>(r) * bn + lo, bn, 1,
                             vs + static_cast<size_t>(lo) * dvp, dvp, oa + static_cast<size_t>(r) * dvp, dvp, true);
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
        if (first[r] > last[r]) {
            for (int c = 0; c < dv; ++c) E::store(dst, c, 0.0f);
            if (lse) *lse = neg_inf;
        } else if (!std::isfinite(mrow[r])) {
            exact_row<DT>(p, sl, row, head, first[r], last[r], dst, lse);
        } else {
            const float inv = 1.0f / lrow[r];
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
