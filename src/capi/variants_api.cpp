// The C boundary of the merge of partial states (the variants' per-call arrays travel in the
// argument set: args_api.cpp).
#include "capi/guard.h"
#include "dispatch/dispatch.h"

using namespace flashattn;

namespace {

flashattn_status_t check_plan(const flashattn_plan_t *plan, const char *function) {
    if (plan == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", function);
    if (!plan->finalized)
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_plan_finalize after the last setter");
    return FLASHATTN_SUCCESS;
}

}  // namespace

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_plan_merge_states(const flashattn_plan_t *plan, int32_t num_partials,
                                                             const void *const *partial_o,
                                                             const float *const *partial_lse,
                                                             flashattn_dtype_t partial_dtype, void *o, float *lse,
                                                             flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        FLASHATTN_TRY(check_plan(plan, entry));
        MergeCall m;
        m.num_partials = num_partials;
        m.partial_o = partial_o;
        m.partial_lse = partial_lse;
        // Range-checked before it becomes the enum type: loading a value outside the enum's range
        // (99, say) as flashattn_dtype_t is undefined behaviour (UBSan, found by fuzz_capi).
        const int dtype = enum_value(&partial_dtype);
        if (dtype < FLASHATTN_DTYPE_FP16 || dtype > FLASHATTN_DTYPE_FP8_E4M3)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "partial_dtype: %d is not a flashattn_dtype_t value", dtype);
        m.partial_dtype = static_cast<flashattn_dtype_t>(dtype);
        m.o = o;
        m.lse = lse;
        m.stream = stream;
        return merge_plan_states(plan, m);
    });
}

}  // extern "C"
