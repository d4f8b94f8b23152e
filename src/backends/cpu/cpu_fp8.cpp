#include "backends/cpu/cpu_fp8.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "backends/cpu/cpu_convert.h"
#include "backends/cpu/cpu_kernel.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace cpu {
namespace {

// Contiguous [outer, rows, heads, dim] strides.
Strides contiguous(int64_t rows, int64_t heads, int64_t dim) {
    Strides s;
    s.head = dim;
    s.row = heads * dim;
    s.batch = rows * s.row;
    return s;
}

// fp32 elements of a contiguous [outer, rows, heads, dim] tensor, or false on overflow.
bool elements(int64_t outer, int64_t rows, int64_t heads, int64_t dim, int64_t *out) {
    return mul_add(outer, rows, 0, out) && mul_add(*out, heads, 0, out) && mul_add(*out, dim, 0, out);
}

// The rows [first, last) of sequence b in a tensor of `rows_per_batch` rows per batch (varlen:
// from cu_seqlens, one packed batch).
struct RowRange {
    int64_t first, end;  // global row indices (varlen) or rows within batch b
    int64_t base;        // offset of batch b's row 0, in rows of the contiguous staging copy
};

RowRange rows_of(const Problem &p, const int32_t *cu, int64_t b, int64_t rows_per_batch) {
    if (p.varlen) return {cu[b], cu[b + 1], 0};
    return {0, rows_per_batch, b * rows_per_batch};
}

float descale_at(const Problem &p, const float *d, int64_t b, int64_t kv_head) {
    return d[b * p.descale_batch_stride + kv_head * p.descale_head_stride];
}

// One tensor: E4M3 `src` (strides s, heads, dim) to fp32 `dst` (contiguous), each (sequence,
// head) times its descale factor (query head h uses its key/value head h / group).
void dequantize(const Problem &p, const uint8_t *src, const Strides &s, const int32_t *cu, int64_t rows_per_batch,
                int64_t heads, int64_t group, int64_t dim, const float *descale, float *dst) {
    for (int64_t b = 0; b < p.batch; ++b) {
        const RowRange r = rows_of(p, cu, b, rows_per_batch);
        const int64_t batch_off = p.varlen ? 0 : b * s.batch;
        for (int64_t row = r.first; row < r.end; ++row)
            for (int64_t h = 0; h < heads; ++h) {
                const float factor = descale_at(p, descale, b, h / group);
                const uint8_t *in = src + batch_off + row * s.row + h * s.head;
                float *out = dst + ((r.base + row) * heads + h) * dim;
                for (int64_t c = 0; c < dim; ++c) out[c] = e4m3_to_float(in[c]) * factor;
            }
    }
}

}  // namespace

std::string fp8_unsupported_reason(const Problem &p) {
    if (p.serving.paged)
        return "the cpu backend does not run FP8 inputs with a paged K/V cache (FLASHATTN_I64_PAGED_KV): its pages "
               "carry no sequence for the per-sequence descales";
    if (p.serving.appends())
        return "the cpu backend does not run FP8 inputs with an append (FLASHATTN_I64_NEW_KV_ROWS): the cache would "
               "need quantizing";
    return unsupported_reason(fp8_staged_problem(p));
}

Problem fp8_staged_problem(const Problem &p) {
    Problem s = p;
    s.dtype = FLASHATTN_DTYPE_FP32;
    s.o_dtype = FLASHATTN_DTYPE_FP32;
    s.descale_batch_stride = s.descale_head_stride = 0;
    s.q = contiguous(p.q_rows(), p.heads_q, p.head_dim);
    s.k = contiguous(p.k_rows(), p.heads_kv, p.head_dim);
    s.v = contiguous(p.k_rows(), p.heads_kv, p.head_dim_v);
    s.o = contiguous(p.q_rows(), p.heads_q, p.head_dim_v);
    return s;
}

flashattn_status_t plan_fp8(const Problem &p, WorkspaceLayout *workspace, Fp8Staging *out) {
    Fp8Staging s;
    s.on = true;
    s.staged = fp8_staged_problem(p);
    const int64_t outer = p.batch_extent();
    int64_t nq, nk, nv, no;
    if (!elements(outer, p.q_rows(), p.heads_q, p.head_dim, &nq) || !elements(outer, p.k_rows(), p.heads_kv, p.head_dim, &nk) ||
        !elements(outer, p.k_rows(), p.heads_kv, p.head_dim_v, &nv) ||
        !elements(outer, p.q_rows(), p.heads_q, p.head_dim_v, &no) || nq > (INT64_MAX >> 4) || nk > (INT64_MAX >> 4) ||
        nv > (INT64_MAX >> 4) || no > (INT64_MAX >> 4))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_BATCH: the CPU backend's fp32 copies of this FP8 problem overflow 64 bits");
    size_t offset = 0;
    for (const auto &part : {std::make_pair(&s.q, nq), std::make_pair(&s.k, nk), std::make_pair(&s.v, nv),
                             std::make_pair(&s.o, no)}) {
        *part.first = offset;
        offset += align_up(static_cast<size_t>(part.second) * sizeof(float), kWorkspaceAlignment);
    }
    s.slice = workspace->add("cpu fp8 staging (fp32 Q, K, V, O)", offset);
    *out = s;
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_fp8_descales(const Problem &p, const Tensors &t) {
    const struct { const float *d; const char *name; } all[] = {
        {t.descale_q, "descale_q"}, {t.descale_k, "descale_k"}, {t.descale_v, "descale_v"}};
    for (const auto &a : all)
        for (int64_t b = 0; b < p.batch; ++b)
            for (int64_t h = 0; h < p.heads_kv; ++h) {
                const float value = descale_at(p, a.d, b, h);
                if (!std::isfinite(value))
                    return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                                "%s: the factor of sequence %lld, key/value head %lld is %g; descale factors must be finite",
                                a.name, (long long)b, (long long)h, static_cast<double>(value));
            }
    return FLASHATTN_SUCCESS;
}

Tensors stage_fp8_inputs(const Problem &p, const Fp8Staging &s, const WorkspaceLayout &layout, const Tensors &t) {
    unsigned char *base = layout.at<unsigned char>(t.workspace, s.slice);
    float *q = reinterpret_cast<float *>(base + s.q);
    float *k = reinterpret_cast<float *>(base + s.k);
    float *v = reinterpret_cast<float *>(base + s.v);
    const int64_t group = p.group_size();
    dequantize(p, static_cast<const uint8_t *>(t.q), p.q, t.cu_seqlens_q, p.seqlen_q, p.heads_q, group, p.head_dim,
               t.descale_q, q);
    dequantize(p, static_cast<const uint8_t *>(t.k), p.k, t.cu_seqlens_k, p.seqlen_k, p.heads_kv, 1, p.head_dim,
               t.descale_k, k);
    dequantize(p, static_cast<const uint8_t *>(t.v), p.v, t.cu_seqlens_k, p.seqlen_k, p.heads_kv, 1, p.head_dim_v,
               t.descale_v, v);
    Tensors run = t;
    run.q = q;
    run.k = k;
    run.v = v;
    run.o = base + s.o;
    run.descale_q = run.descale_k = run.descale_v = nullptr;
    return run;
}

void write_fp8_output(const Problem &p, const Fp8Staging &s, const WorkspaceLayout &layout, const Tensors &t) {
    const float *staged = reinterpret_cast<const float *>(layout.at<unsigned char>(t.workspace, s.slice) + s.o);
    unsigned char *o = static_cast<unsigned char *>(t.o);
    const bool bf16 = p.o_dtype == FLASHATTN_DTYPE_BF16;
    const int64_t dim = p.head_dim_v;
    for (int64_t b = 0; b < p.batch; ++b) {
        const RowRange r = rows_of(p, t.cu_seqlens_q, b, p.seqlen_q);
        const int64_t batch_off = p.varlen ? 0 : b * p.o.batch;
        for (int64_t row = r.first; row < r.end; ++row)
            for (int64_t h = 0; h < p.heads_q; ++h) {
                const float *in = staged + ((r.base + row) * p.heads_q + h) * dim;
                unsigned char *out = o + (batch_off + row * p.o.row + h * p.o.head) * 2;
                for (int64_t c = 0; c < dim; ++c) {
                    const uint16_t bits = bf16 ? float_to_bf16(in[c]) : float_to_half(in[c]);
                    std::memcpy(out + c * 2, &bits, 2);
                }
            }
    }
}

}  // namespace cpu
}  // namespace flashattn
