// The attention variants of 0.3 (top-left alignment, sink tokens, sink logits, ALiBi) and the
// merge of partial states: what finalize resolves from the plan keys and what every call that uses
// them checks before a backend runs (argument rules that do not depend on the backend).
#pragma once

#include <cstdint>

#include "problem/params.h"
#include "problem/problem.h"

namespace flashattn {

// Copy the variant keys into `p` (their ranges were checked at the setters; they need no rule
// between keys: sink tokens without a left window simply change nothing).
void resolve_variants(const PlanParams &params, Problem *p);

// The per-call arrays of a forward (backward = false) or backward call: present exactly when the
// plan uses them, dsink_logits only in a backward call, and no output overlapping another tensor.
flashattn_status_t check_variant_args(const Problem &p, const Tensors &t, bool backward);

// The names of the variants `p` uses that the kernels written before 0.3 do not know, for
// NOT_SUPPORTED messages ("top-left alignment, ALiBi"); "" when none. `supported` lists those a
// backend does run, as the Variant bits.
enum VariantBit : unsigned {
    kVariantTopLeft = 1u,
    kVariantSinkTokens = 2u,
    kVariantSinkLogits = 4u,
    kVariantAlibi = 8u,
    kVariantHeadDimV = 16u,  // head_dim_v != head_dim (the CPU has always run it)
};
unsigned variants_used(const Problem &p);
const char *variant_names(unsigned bits, char *buffer, int size);

// One flashattn_plan_merge_states() call.
struct MergeCall {
    int32_t num_partials = 0;
    const void *const *partial_o = nullptr;
    const float *const *partial_lse = nullptr;
    flashattn_dtype_t partial_dtype = FLASHATTN_DTYPE_FP32;
    void *o = nullptr;
    float *lse = nullptr;
    flashattn_stream_t stream = nullptr;
};

// NULLs, the count, the partials' dtype and overlaps of the outputs with every partial.
flashattn_status_t check_merge_args(const Problem &p, const MergeCall &m);

// Element size of a partial output of `m`.
inline size_t partial_element_size(const MergeCall &m) { return m.partial_dtype == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

}  // namespace flashattn
