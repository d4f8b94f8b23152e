#include "problem/variants.h"

#include <cstdio>
#include <cstring>

#include "base/status.h"

namespace flashattn {
namespace {

bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// One per-head array: required when the plan's key is 1, forbidden otherwise.
flashattn_status_t check_head_array(const void *ptr, bool used, const char *name, const char *key) {
    if (used && ptr == nullptr)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "%s: NULL, but the plan sets %s = 1 (pass it with flashattn_plan_execute_args)", name, key);
    if (!used && ptr != nullptr)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but the plan does not set %s = 1", name, key);
    return FLASHATTN_SUCCESS;
}

// Pointers one pass never uses: the backward's in a forward call, the forward-only ones (the
// serving features', cu_seqlens of a fixed-length plan) in a backward call.
flashattn_status_t check_pass_pointers(const Problem &p, const Tensors &t, bool backward) {
    const struct { const void *ptr; bool forward_only; const char *name; } all[] = {
        {t.dout, false, "dout"}, {t.dq, false, "dq"}, {t.dk, false, "dk"}, {t.dv, false, "dv"},
        {t.dsink_logits, false, "dsink_logits"},
        {t.page_table, true, "page_table"}, {t.seqused_k, true, "seqused_k"}, {t.k_new, true, "k_new"},
        {t.v_new, true, "v_new"}, {t.rotary_cos, true, "rotary_cos"}, {t.rotary_sin, true, "rotary_sin"}};
    for (const auto &a : all)
        if (a.ptr != nullptr && a.forward_only == backward)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but the %s pass does not use it", a.name,
                        backward ? "backward" : "forward");
    if (backward && !p.varlen && (t.cu_seqlens_q != nullptr || t.cu_seqlens_k != nullptr))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but this plan does not use it (FLASHATTN_I64_VARLEN is 0)",
                    t.cu_seqlens_q != nullptr ? "cu_seqlens_q" : "cu_seqlens_k");
    return FLASHATTN_SUCCESS;
}

}  // namespace

void resolve_variants(const PlanParams &params, Problem *p) {
    p->top_left = params.get(FLASHATTN_I64_MASK_ALIGN, FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT) == FLASHATTN_MASK_ALIGN_TOP_LEFT;
    p->sink_tokens = params.get(FLASHATTN_I64_SINK_TOKENS, 0);
    p->sink_logits = params.get(FLASHATTN_I64_SINK_LOGITS, 0) != 0;
    p->alibi = params.get(FLASHATTN_I64_ALIBI, 0) != 0;
}

flashattn_status_t check_variant_args(const Problem &p, const Tensors &t, bool backward) {
    FLASHATTN_TRY(check_pass_pointers(p, t, backward));
    FLASHATTN_TRY(check_head_array(t.sink_logits, p.sink_logits, "sink_logits", "FLASHATTN_I64_SINK_LOGITS"));
    FLASHATTN_TRY(check_head_array(t.alibi_slopes, p.alibi, "alibi_slopes", "FLASHATTN_I64_ALIBI"));
    const size_t head_bytes = static_cast<size_t>(p.heads_q) * sizeof(float);
    if (!backward) {
        const struct { const void *ptr; const char *name; } arrays[] = {{t.sink_logits, "sink_logits"},
                                                                         {t.alibi_slopes, "alibi_slopes"}};
        for (const auto &a : arrays) {
            if (overlaps(t.o, p.extents.o, a.ptr, head_bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "o: overlaps %s", a.name);
            if (overlaps(t.lse, p.extents.lse, a.ptr, head_bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse: overlaps %s", a.name);
        }
        return FLASHATTN_SUCCESS;
    }
    FLASHATTN_TRY(check_head_array(t.dsink_logits, p.sink_logits, "dsink_logits", "FLASHATTN_I64_SINK_LOGITS"));
    if (t.dsink_logits == nullptr) return FLASHATTN_SUCCESS;
    const TensorExtents &e = p.extents;
    const struct { const void *ptr; size_t bytes; const char *name; } others[] = {
        {t.q, e.q, "q"}, {t.k, e.k, "k"}, {t.v, e.v, "v"}, {t.o, e.o, "o"}, {t.dout, e.dout, "dout"},
        {t.lse, e.lse, "lse"}, {t.dq, e.dq, "dq"}, {t.dk, e.dk, "dk"}, {t.dv, e.dv, "dv"},
        {t.sink_logits, head_bytes, "sink_logits"}, {t.alibi_slopes, head_bytes, "alibi_slopes"},
        {t.workspace, t.workspace_bytes, "workspace"}};
    for (const auto &o : others)
        if (overlaps(t.dsink_logits, head_bytes, o.ptr, o.bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "dsink_logits: overlaps %s", o.name);
    return FLASHATTN_SUCCESS;
}

unsigned variants_used(const Problem &p) {
    unsigned bits = 0;
    if (p.top_left) bits |= kVariantTopLeft;
    if (p.sink_tokens > 0) bits |= kVariantSinkTokens;
    if (p.sink_logits) bits |= kVariantSinkLogits;
    if (p.alibi) bits |= kVariantAlibi;
    if (p.head_dim_v != p.head_dim) bits |= kVariantHeadDimV;
    return bits;
}

const char *variant_names(unsigned bits, char *buffer, int size) {
    static const struct { unsigned bit; const char *name; } names[] = {
        {kVariantTopLeft, "top-left mask alignment (FLASHATTN_I64_MASK_ALIGN)"},
        {kVariantSinkTokens, "sink tokens (FLASHATTN_I64_SINK_TOKENS)"},
        {kVariantSinkLogits, "sink logits (FLASHATTN_I64_SINK_LOGITS)"},
        {kVariantAlibi, "ALiBi (FLASHATTN_I64_ALIBI)"},
        {kVariantHeadDimV, "head_dim_v != head_dim"}};
    buffer[0] = '\0';
    for (const auto &n : names) {
        if ((bits & n.bit) == 0) continue;
        const size_t used = std::strlen(buffer);
        std::snprintf(buffer + used, static_cast<size_t>(size) - used, "%s%s", used ? ", " : "", n.name);
    }
    return buffer;
}

flashattn_status_t check_merge_args(const Problem &p, const MergeCall &m) {
    if (m.num_partials < 1 || m.num_partials > FLASHATTN_MAX_MERGE_PARTIALS)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "num_partials: must be in [1, %d] (got %d)",
                    FLASHATTN_MAX_MERGE_PARTIALS, static_cast<int>(m.num_partials));
    if (m.partial_o == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "partial_o: must not be NULL");
    if (m.partial_lse == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "partial_lse: must not be NULL");
    if (m.o == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "o: must not be NULL");
    if (m.partial_dtype != FLASHATTN_DTYPE_FP32 && m.partial_dtype != p.dtype)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "partial_dtype: %d is neither FLASHATTN_DTYPE_FP32 nor the plan's dtype %d",
                    static_cast<int>(m.partial_dtype), static_cast<int>(p.dtype));
    // The partials share the plan's O strides, in elements of their own type.
    const size_t part_bytes = p.extents.o / p.element_size() * partial_element_size(m);
    const size_t lse_bytes = p.extents.lse;
    for (int s = 0; s < m.num_partials; ++s) {
        if (m.partial_o[s] == nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "partial_o[%d]: must not be NULL", s);
        if (m.partial_lse[s] == nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "partial_lse[%d]: must not be NULL", s);
        const struct { const void *ptr; size_t bytes; } in[] = {{m.partial_o[s], part_bytes}, {m.partial_lse[s], lse_bytes}};
        for (int i = 0; i < 2; ++i) {
            const char *name = i == 0 ? "partial_o" : "partial_lse";
            if (overlaps(m.o, p.extents.o, in[i].ptr, in[i].bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "o: overlaps %s[%d]", name, s);
            if (overlaps(m.lse, lse_bytes, in[i].ptr, in[i].bytes))
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse: overlaps %s[%d]", name, s);
        }
    }
    if (overlaps(m.o, p.extents.o, m.lse, lse_bytes)) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse: overlaps o");
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
