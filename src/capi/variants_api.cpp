// The C boundary of the 0.3 attention variants: the execute calls that take per-call variant
// arrays (flashattn_extras_t) and the merge of partial states.
#include <cstddef>
#include <cstring>

#include "capi/guard.h"
#include "dispatch/dispatch.h"

using namespace flashattn;

namespace {

// The 0.3 struct: struct_size, then three pointers.
constexpr size_t kExtrasSize03 = offsetof(flashattn_extras_t, dsink_logits) + sizeof(float *);

flashattn_status_t check_plan(const flashattn_plan_t *plan, const char *function) {
    if (plan == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", function);
    if (!plan->finalized)
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_plan_finalize after the last setter");
    return FLASHATTN_SUCCESS;
}

// cu_seqlens: required by a variable-length plan, NULL for a fixed-length one.
flashattn_status_t check_cu_seqlens_presence(const Problem &p, const int32_t *cu_q, const int32_t *cu_k) {
    if (p.varlen) return FLASHATTN_SUCCESS;  // NULLs are reported with the other tensors
    if (cu_q != nullptr || cu_k != nullptr)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "%s: given, but the plan is fixed-length (FLASHATTN_I64_VARLEN = 0); pass NULL",
                    cu_q != nullptr ? "cu_seqlens_q" : "cu_seqlens_k");
    return FLASHATTN_SUCCESS;
}

// Copy the fields the caller's struct has (an older, shorter one leaves the newer ones NULL).
flashattn_status_t read_extras(const flashattn_extras_t *extras, Tensors *t) {
    if (extras == nullptr) return FLASHATTN_SUCCESS;
    uint64_t size;
    std::memcpy(&size, &extras->struct_size, sizeof size);
    if (size < kExtrasSize03)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "extras->struct_size: %llu bytes, less than the %zu of the first flashattn_extras_t; "
                    "initialise it with FLASHATTN_EXTRAS_INIT",
                    static_cast<unsigned long long>(size), kExtrasSize03);
    t->sink_logits = extras->sink_logits;
    t->alibi_slopes = extras->alibi_slopes;
    t->dsink_logits = extras->dsink_logits;
    return FLASHATTN_SUCCESS;
}

}  // namespace

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_plan_execute_extras(const flashattn_plan_t *plan, const void *q, const void *k,
                                                               const void *v, void *o, float *lse,
                                                               const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                                               const flashattn_extras_t *extras, void *workspace,
                                                               size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&] {
        FLASHATTN_TRY(check_plan(plan, __func__));
        FLASHATTN_TRY(check_cu_seqlens_presence(plan->problem, cu_seqlens_q, cu_seqlens_k));
        Tensors t;
        t.q = q; t.k = k; t.v = v; t.o = o; t.lse = lse;
        t.cu_seqlens_q = cu_seqlens_q; t.cu_seqlens_k = cu_seqlens_k;
        t.workspace = workspace; t.workspace_bytes = workspace_bytes; t.stream = stream;
        FLASHATTN_TRY(read_extras(extras, &t));
        return execute_plan(plan, t);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward_extras(
    const flashattn_plan_t *plan, const void *q, const void *k, const void *v, const void *o, const void *dout,
    const float *lse, void *dq, void *dk, void *dv, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
    const flashattn_extras_t *extras, void *workspace, size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&] {
        FLASHATTN_TRY(check_plan(plan, __func__));
        FLASHATTN_TRY(check_cu_seqlens_presence(plan->problem, cu_seqlens_q, cu_seqlens_k));
        Tensors t;
        t.q = q; t.k = k; t.v = v; t.o = const_cast<void *>(o); t.lse = const_cast<float *>(lse);  // read only
        t.dout = dout; t.dq = dq; t.dk = dk; t.dv = dv;
        t.cu_seqlens_q = cu_seqlens_q; t.cu_seqlens_k = cu_seqlens_k;
        t.workspace = workspace; t.workspace_bytes = workspace_bytes; t.stream = stream;
        FLASHATTN_TRY(read_extras(extras, &t));
        return execute_backward_plan(plan, t);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_merge_states(const flashattn_plan_t *plan, int32_t num_partials,
                                                             const void *const *partial_o,
                                                             const float *const *partial_lse,
                                                             flashattn_dtype_t partial_dtype, void *o, float *lse,
                                                             flashattn_stream_t stream) {
    return guarded(__func__, [&] {
        FLASHATTN_TRY(check_plan(plan, __func__));
        MergeCall m;
        m.num_partials = num_partials;
        m.partial_o = partial_o;
        m.partial_lse = partial_lse;
        m.partial_dtype = static_cast<flashattn_dtype_t>(enum_value(&partial_dtype));
        m.o = o;
        m.lse = lse;
        m.stream = stream;
        return merge_plan_states(plan, m);
    });
}

}  // extern "C"
