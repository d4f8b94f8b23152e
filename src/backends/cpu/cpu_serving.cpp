#include "backends/cpu/cpu_serving.h"

#include <cinttypes>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_convert.h"
#include "base/status.h"

namespace flashattn {
namespace cpu {
namespace {

// The cache a sequence can hold: its cu_seqlens_k length in a packed (varlen, not paged) cache,
// otherwise seqlen_k.
int64_t capacity_of_sequence(const Problem &p, const Tensors &t, int64_t b) {
    if (p.varlen && !p.serving.paged) return static_cast<int64_t>(t.cu_seqlens_k[b + 1]) - t.cu_seqlens_k[b];
    return p.seqlen_k;
}

int64_t queries_of_sequence(const Problem &p, const Tensors &t, int64_t b) {
    return p.varlen ? static_cast<int64_t>(t.cu_seqlens_q[b + 1]) - t.cu_seqlens_q[b] : p.seqlen_q;
}

int64_t first_query_row(const Problem &p, const Tensors &t, int64_t b) {
    return p.varlen ? t.cu_seqlens_q[b] : b * p.seqlen_q;
}

flashattn_status_t check_seqused(const Problem &p, const Tensors &t, int64_t b) {
    const int64_t used = t.seqused_k[b];
    const int64_t capacity = capacity_of_sequence(p, t, b);
    if (used < 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "seqused_k[%lld] is %lld; key counts cannot be negative",
                    (long long)b, (long long)used);
    if (used + p.serving.new_rows > capacity)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "seqused_k[%lld] is %lld; with %lld appended rows that exceeds the sequence's cache of %lld keys",
                    (long long)b, (long long)used, (long long)p.serving.new_rows, (long long)capacity);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_pages(const Problem &p, const Tensors &t, int64_t b) {
    const Serving &sv = p.serving;
    const int64_t pages = (keys_of_sequence(p, t, b) + sv.page_size - 1) / sv.page_size;
    const int32_t *row = t.page_table + b * sv.page_table_stride;
    for (int64_t i = 0; i < pages; ++i)
        if (row[i] < 0 || row[i] >= sv.num_pages)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "page_table[%lld][%lld] is %" PRId32 "; page indices must be in [0, FLASHATTN_I64_NUM_PAGES = %lld)",
                        (long long)b, (long long)i, row[i], (long long)sv.num_pages);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_rotary_positions(const Problem &p, const Tensors &t, int64_t b) {
    const int64_t rows = queries_of_sequence(p, t, b);
    const int64_t last = t.seqused_k[b] + rows - 1;  // the last query's position
    if (rows > 0 && last >= p.seqlen_k)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "rotary_cos: query row %lld of sequence %lld is at position %lld, beyond the %lld rows "
                    "(FLASHATTN_I64_SEQLEN_K) of the cos/sin tables",
                    (long long)(rows - 1), (long long)b, (long long)last, (long long)p.seqlen_k);
    return FLASHATTN_SUCCESS;
}

// double -> float rounded to odd (truncate, then set the last bit when inexact): rounding that
// float to a 16-bit type then gives the correctly rounded result of the double, with no double
// rounding (float keeps at least two more bits than fp16 or bf16).
float round_to_odd(double x) {
    float f = static_cast<float>(x);
    if (static_cast<double>(f) == x || !std::isfinite(f)) return f;
    if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    return bits_float(float_bits(f) | 1u);
}

template <flashattn_dtype_t DT>
double load_value(const unsigned char *p, int64_t i) {
    return Elem<DT>::load(p, i);
}

template <flashattn_dtype_t DT>
void store_value(unsigned char *p, int64_t i, double x) {
    Elem<DT>::store(p, i, DT == FLASHATTN_DTYPE_FP32 ? static_cast<float>(x) : round_to_odd(x));
}

// dst = src with its first `rd` columns rotated at table row `pos` (computed in double, rounded
// once); the other columns copied bit for bit.
template <flashattn_dtype_t DT>
void rotate_row_of(const Problem &p, const Tensors &t, const unsigned char *src, unsigned char *dst, int64_t pos) {
    const int64_t rd = p.serving.rotary_dim, half = rd / 2;
    const size_t es = p.element_size();
    const float *cos_row = t.rotary_cos + pos * half;
    const float *sin_row = t.rotary_sin + pos * half;
    for (int64_t i = 0; i < half; ++i) {
        const int64_t a = p.serving.rotary_interleaved ? 2 * i : i;
        const int64_t b = p.serving.rotary_interleaved ? 2 * i + 1 : i + half;
        const double x = load_value<DT>(src, a), y = load_value<DT>(src, b);
        const double c = cos_row[i], s = sin_row[i];
        store_value<DT>(dst, a, x * c - y * s);
        store_value<DT>(dst, b, x * s + y * c);
    }
    std::memcpy(dst + rd * es, src + rd * es, static_cast<size_t>(p.head_dim - rd) * es);
}

void rotate_row(const Problem &p, const Tensors &t, const unsigned char *src, unsigned char *dst, int64_t pos) {
    switch (p.dtype) {
        case FLASHATTN_DTYPE_FP32: rotate_row_of<FLASHATTN_DTYPE_FP32>(p, t, src, dst, pos); break;
        case FLASHATTN_DTYPE_FP16: rotate_row_of<FLASHATTN_DTYPE_FP16>(p, t, src, dst, pos); break;
        case FLASHATTN_DTYPE_BF16: rotate_row_of<FLASHATTN_DTYPE_BF16>(p, t, src, dst, pos); break;
        default: break;  // unsupported_reason() keeps other types away
    }
}

}  // namespace

flashattn_status_t check_serving_call(const Problem &p, const Tensors &t) {
    const Serving &sv = p.serving;
    for (int64_t b = 0; b < p.batch; ++b) {
        if (sv.seqused_k) FLASHATTN_TRY(check_seqused(p, t, b));
        if (sv.paged) FLASHATTN_TRY(check_pages(p, t, b));
        if (sv.rotary_dim > 0) FLASHATTN_TRY(check_rotary_positions(p, t, b));
    }
    return FLASHATTN_SUCCESS;
}

int64_t keys_of_sequence(const Problem &p, const Tensors &t, int64_t b) {
    if (p.serving.seqused_k) return t.seqused_k[b] + p.serving.new_rows;
    return capacity_of_sequence(p, t, b);
}

int64_t cache_offset(const Problem &p, const Tensors &t, const Strides &s, int64_t b, int64_t pos, int64_t head) {
    const Serving &sv = p.serving;
    if (sv.paged) {
        const int64_t page = t.page_table[b * sv.page_table_stride + pos / sv.page_size];
        return page * s.batch + (pos % sv.page_size) * s.row + head * s.head;
    }
    const int64_t first = p.varlen ? t.cu_seqlens_k[b] * s.row : b * s.batch;
    return first + pos * s.row + head * s.head;
}

void append_rows(const Problem &p, const Tensors &t) {
    const Serving &sv = p.serving;
    const size_t es = p.element_size();
    const auto *k_new = static_cast<const unsigned char *>(t.k_new);
    const auto *v_new = static_cast<const unsigned char *>(t.v_new);
    auto *k_cache = static_cast<unsigned char *>(const_cast<void *>(t.k));  // the caches are outputs here
    auto *v_cache = static_cast<unsigned char *>(const_cast<void *>(t.v));
    for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t j = 0; j < sv.new_rows; ++j) {
            const int64_t pos = t.seqused_k[b] + j;
            for (int64_t h = 0; h < p.heads_kv; ++h) {
                const unsigned char *ks = k_new + (b * sv.k_new.batch + j * sv.k_new.row + h * sv.k_new.head) * es;
                const unsigned char *vs = v_new + (b * sv.v_new.batch + j * sv.v_new.row + h * sv.v_new.head) * es;
                unsigned char *kd = k_cache + cache_offset(p, t, p.k, b, pos, h) * es;
                unsigned char *vd = v_cache + cache_offset(p, t, p.v, b, pos, h) * es;
                if (sv.rotary_dim > 0)
                    rotate_row(p, t, ks, kd, pos);
                else
                    std::memcpy(kd, ks, static_cast<size_t>(p.head_dim) * es);
                std::memcpy(vd, vs, static_cast<size_t>(p.head_dim_v) * es);
            }
        }
    }
}

size_t rotated_q_bytes(const Problem &p) {
    if (p.serving.rotary_dim == 0) return 0;
    return static_cast<size_t>(p.total_query_rows() * p.heads_q * p.head_dim) * p.element_size();
}

void rotate_queries(const Problem &p, const Tensors &t, unsigned char *out) {
    const size_t es = p.element_size();
    const auto *q = static_cast<const unsigned char *>(t.q);
    for (int64_t b = 0; b < p.batch; ++b) {
        const int64_t first = first_query_row(p, t, b);
        const int64_t rows = queries_of_sequence(p, t, b);
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t row = first + i;
            const int64_t q_row = p.varlen ? row * p.q.row : b * p.q.batch + i * p.q.row;
            for (int64_t h = 0; h < p.heads_q; ++h)
                rotate_row(p, t, q + (q_row + h * p.q.head) * es, out + ((row * p.heads_q + h) * p.head_dim) * es,
                           t.seqused_k[b] + i);
        }
    }
}

}  // namespace cpu
}  // namespace flashattn
