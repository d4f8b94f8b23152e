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
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "extras->%s: NULL, but the plan sets %s = 1", name, key);
    if (!used && ptr != nullptr)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "extras->%s: given, but the plan does not set %s = 1", name, key);
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
    FLASHATTN_TRY(check_head_array(t.sink_logits, p.sink_logits, "sink_logits", "FLASHATTN_I64_SINK_LOGITS"));
    FLASHATTN_TRY(check_head_array(t.alibi_slopes, p.alibi, "alibi_slopes", "FLASHATTN_I64_ALIBI"));
    if (!backward) {
        if (t.dsink_logits != nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "extras->dsink_logits: must be NULL in a forward call");
        if (p.sink_logits && overlaps(t.o, p.extents.o, t.sink_logits, p.heads_q * sizeof(float)))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "o: overlaps extras->sink_logits");
        return FLASHATTN_SUCCESS;
    }
    FLASHATTN_TRY(check_head_array(t.dsink_logits, p.sink_logits, "dsink_logits", "FLASHATTN_I64_SINK_LOGITS"));
    if (t.dsink_logits == nullptr) return FLASHATTN_SUCCESS;
    const size_t head_bytes = static_cast<size_t>(p.heads_q) * sizeof(float);
    const TensorExtents &e = p.extents;
    const struct { const void *ptr; size_t bytes; const char *name; } others[] = {
        {t.q, e.q, "q"}, {t.k, e.k, "k"}, {t.v, e.v, "v"}, {t.o, e.o, "o"}, {t.dout, e.dout, "dout"},
        {t.lse, e.lse, "lse"}, {t.dq, e.dq, "dq"}, {t.dk, e.dk, "dk"}, {t.dv, e.dv, "dv"},
        {t.sink_logits, head_bytes, "extras->sink_logits"}, {t.alibi_slopes, head_bytes, "extras->alibi_slopes"},
        {t.workspace, t.workspace_bytes, "workspace"}};
    for (const auto &o : others)
        if (overlaps(t.dsink_logits, head_bytes, o.ptr, o.bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "extras->dsink_logits: overlaps %s", o.name);
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
