// The merge of partial states on the host: one pass over the rows, fp32 arithmetic (as the GPU
// kernel's), parallel over (sequence, head) pairs when the problem is large enough to pay for it.
#include "backends/cpu/cpu_merge.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "backends/cpu/cpu_convert.h"
#include "backends/cpu/cpu_threads.h"

namespace flashattn {
namespace cpu {
namespace {

// Element offset of row `row` of head `head` in O's layout (row: packed when varlen).
int64_t o_offset(const Problem &p, int64_t b, int64_t row, int64_t head) {
    return (p.varlen ? 0 : b * p.o.batch) + row * p.o.row + head * p.o.head;
}

// Index of the LSE of (b, head, row) (row: packed when varlen).
int64_t lse_index(const Problem &p, int64_t b, int64_t head, int64_t row) {
    return p.varlen ? head * p.total_q + row : (b * p.heads_q + head) * p.seqlen_q + row;
}

template <flashattn_dtype_t PT, flashattn_dtype_t OT>
void merge_rows(const Problem &p, const MergeCall &m, int64_t b, int64_t head, float *acc) {
    const int S = m.num_partials;
    const int dv = static_cast<int>(p.head_dim_v);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const int64_t rows = p.varlen ? p.total_q : p.seqlen_q;
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t li = lse_index(p, b, head, row);
        float mx = neg_inf;
        bool nan = false;  // std::max drops a NaN: a row NaN in every partial came out as an empty one
        for (int s = 0; s < S; ++s) {
            const float l = m.partial_lse[s][li];
            nan = nan || l != l;
            mx = std::max(mx, l);
        }
        float lse = neg_inf;
        std::fill(acc, acc + dv, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
        if (nan) {
            lse = std::numeric_limits<float>::quiet_NaN();  // the NaN rule: the row's O and LSE NaN, as on GPUs
        } else if (mx != neg_inf) {
            float sum = 0.0f;
            for (int s = 0; s < S; ++s) sum += std::exp(m.partial_lse[s][li] - mx);
            lse = mx + std::log(sum);
            const int64_t off = o_offset(p, b, row, head);
            for (int s = 0; s < S; ++s) {
                const float w = std::exp(m.partial_lse[s][li] - lse);
                if (w == 0.0f) continue;  // an empty partial may hold anything (its O is 0 anyway)
                const unsigned char *src = static_cast<const unsigned char *>(m.partial_o[s]) + off * Elem<PT>::size;
                for (int c = 0; c < dv; ++c) acc[c] += w * Elem<PT>::load(src, c);
            }
        }
        unsigned char *dst = static_cast<unsigned char *>(m.o) + o_offset(p, b, row, head) * Elem<OT>::size;
        for (int c = 0; c < dv; ++c) Elem<OT>::store(dst, c, acc[c]);
        if (m.lse != nullptr) m.lse[li] = lse;
    }
}

typedef void (*MergeFn)(const Problem &, const MergeCall &, int64_t, int64_t, float *);

template <flashattn_dtype_t OT>
MergeFn pick_for_output(flashattn_dtype_t partial) {
    if (partial == FLASHATTN_DTYPE_FP32) return merge_rows<FLASHATTN_DTYPE_FP32, OT>;
    return merge_rows<OT, OT>;  // check_merge_args: fp32 or the plan's dtype
}

MergeFn pick(const Problem &p, flashattn_dtype_t partial) {
    switch (p.dtype) {
    case FLASHATTN_DTYPE_FP16: return pick_for_output<FLASHATTN_DTYPE_FP16>(partial);
    case FLASHATTN_DTYPE_BF16: return pick_for_output<FLASHATTN_DTYPE_BF16>(partial);
    default: return merge_rows<FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP32>;
    }
}

}  // namespace

void merge_states(const Problem &p, const MergeCall &m) {
    const MergeFn fn = pick(p, m.partial_dtype);
    const int64_t units = p.batch_extent() * p.heads_q;  // (sequence, head) pairs; varlen: heads
    const double elems = static_cast<double>(p.total_query_rows()) * static_cast<double>(p.heads_q) *
                         static_cast<double>(p.head_dim_v) * m.num_partials;
    unsigned hw = std::thread::hardware_concurrency();
    int64_t threads = elems < (1 << 20) ? 1 : std::min<int64_t>(std::max(1u, hw), std::min<int64_t>(units, 64));
    std::atomic<int64_t> next{0};
    auto work = [&](size_t) {
        float acc[256];  // head_dim_v <= 256 (the key's range)
        for (;;) {
            const int64_t u = next.fetch_add(1, std::memory_order_relaxed);
            if (u >= units) break;
            fn(p, m, u / p.heads_q, u % p.heads_q, acc);
        }
    };
    if (threads <= 1) {
        work(0);
    } else {
        run_on_threads(threads, work);
    }
}

}  // namespace cpu
}  // namespace flashattn
