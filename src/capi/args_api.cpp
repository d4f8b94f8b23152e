// The C boundary of flashattn_args_t (a named set of tensor pointers) and of
// flashattn_plan_execute_args(), the execute call that takes one: the serving features' tensors
// (page table, seqused_k, appended rows, rotary tables) travel in it, so a later feature adds an
// enum value instead of another execute signature (docs/architecture.md, "Execute arguments").
#include <new>

#include "capi/guard.h"
#include "dispatch/dispatch.h"

using namespace flashattn;

// A table of pointers indexed by flashattn_arg_t value: a new tensor is a new enum value, a case
// in known_arg and a line in tensors_of; which ones a plan needs is checked in one place
// (check_execute_args, problem/resolve.cpp).
struct flashattn_args {
    static constexpr int kCount = 64;  // above every flashattn_arg_t value (1-19 serving, 20-29 variants, 30-39 backward, 40-49 FP8)
    const void *ptr[kCount] = {};
};

namespace {

bool known_arg(int which) {
    switch (which) {
        case FLASHATTN_ARG_Q: case FLASHATTN_ARG_K: case FLASHATTN_ARG_V: case FLASHATTN_ARG_O:
        case FLASHATTN_ARG_LSE: case FLASHATTN_ARG_CU_SEQLENS_Q: case FLASHATTN_ARG_CU_SEQLENS_K:
        case FLASHATTN_ARG_PAGE_TABLE: case FLASHATTN_ARG_SEQUSED_K: case FLASHATTN_ARG_K_NEW:
        case FLASHATTN_ARG_V_NEW: case FLASHATTN_ARG_ROTARY_COS: case FLASHATTN_ARG_ROTARY_SIN:
        case FLASHATTN_ARG_SINK_LOGITS: case FLASHATTN_ARG_ALIBI_SLOPES: case FLASHATTN_ARG_DSINK_LOGITS:
        case FLASHATTN_ARG_DOUT: case FLASHATTN_ARG_DQ: case FLASHATTN_ARG_DK: case FLASHATTN_ARG_DV:
        case FLASHATTN_ARG_DESCALE_Q: case FLASHATTN_ARG_DESCALE_K: case FLASHATTN_ARG_DESCALE_V:
            return true;
        default:
            return false;
    }
}

flashattn_status_t unknown_arg(int which) {
    return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "which: %d is not a flashattn_arg_t value", which);
}

// The pointers as the layers below take them. The const of the setter is dropped for the outputs.
Tensors tensors_of(const flashattn_args &a, void *workspace, size_t workspace_bytes, flashattn_stream_t stream) {
    Tensors t;
    t.q = a.ptr[FLASHATTN_ARG_Q];
    t.k = a.ptr[FLASHATTN_ARG_K];
    t.v = a.ptr[FLASHATTN_ARG_V];
    t.o = const_cast<void *>(a.ptr[FLASHATTN_ARG_O]);
    t.lse = static_cast<float *>(const_cast<void *>(a.ptr[FLASHATTN_ARG_LSE]));
    t.cu_seqlens_q = static_cast<const int32_t *>(a.ptr[FLASHATTN_ARG_CU_SEQLENS_Q]);
    t.cu_seqlens_k = static_cast<const int32_t *>(a.ptr[FLASHATTN_ARG_CU_SEQLENS_K]);
    t.page_table = static_cast<const int32_t *>(a.ptr[FLASHATTN_ARG_PAGE_TABLE]);
    t.seqused_k = static_cast<const int32_t *>(a.ptr[FLASHATTN_ARG_SEQUSED_K]);
    t.k_new = a.ptr[FLASHATTN_ARG_K_NEW];
    t.v_new = a.ptr[FLASHATTN_ARG_V_NEW];
    t.rotary_cos = static_cast<const float *>(a.ptr[FLASHATTN_ARG_ROTARY_COS]);
    t.rotary_sin = static_cast<const float *>(a.ptr[FLASHATTN_ARG_ROTARY_SIN]);
    t.sink_logits = static_cast<const float *>(a.ptr[FLASHATTN_ARG_SINK_LOGITS]);
    t.alibi_slopes = static_cast<const float *>(a.ptr[FLASHATTN_ARG_ALIBI_SLOPES]);
    t.dsink_logits = static_cast<float *>(const_cast<void *>(a.ptr[FLASHATTN_ARG_DSINK_LOGITS]));
    t.dout = a.ptr[FLASHATTN_ARG_DOUT];
    t.dq = const_cast<void *>(a.ptr[FLASHATTN_ARG_DQ]);
    t.dk = const_cast<void *>(a.ptr[FLASHATTN_ARG_DK]);
    t.dv = const_cast<void *>(a.ptr[FLASHATTN_ARG_DV]);
    t.descale_q = static_cast<const float *>(a.ptr[FLASHATTN_ARG_DESCALE_Q]);
    t.descale_k = static_cast<const float *>(a.ptr[FLASHATTN_ARG_DESCALE_K]);
    t.descale_v = static_cast<const float *>(a.ptr[FLASHATTN_ARG_DESCALE_V]);
    t.workspace = workspace;
    t.workspace_bytes = workspace_bytes;
    t.stream = stream;
    return t;
}

}  // namespace

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_args_create(flashattn_args_t **args) {
    return guarded(__func__, [&] {
        if (args == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: the out-pointer must not be NULL");
        *args = nullptr;
        flashattn_args_t *created = new (std::nothrow) flashattn_args_t();
        if (created == nullptr) return fail(FLASHATTN_ERROR_ALLOCATION, "args: out of host memory");
        *args = created;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API void flashattn_args_destroy(flashattn_args_t *args) { delete args; }

FLASHATTN_API flashattn_status_t flashattn_args_set(flashattn_args_t *args, flashattn_arg_t which, const void *ptr) {
    return guarded(__func__, [&, entry = __func__] {
        if (args == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: NULL passed to %s", entry);
        const int w = enum_value(&which);
        if (!known_arg(w)) return unknown_arg(w);
        args->ptr[w] = ptr;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_args_get(const flashattn_args_t *args, flashattn_arg_t which,
                                                    const void **ptr) {
    return guarded(__func__, [&, entry = __func__] {
        if (args == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: NULL passed to %s", entry);
        if (ptr == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "ptr: the out-pointer must not be NULL");
        const int w = enum_value(&which);
        if (!known_arg(w)) return unknown_arg(w);
        *ptr = args->ptr[w];
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_args(const flashattn_plan_t *plan, const flashattn_args_t *args,
                                                             void *workspace, size_t workspace_bytes,
                                                             flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", entry);
        if (args == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: NULL passed to %s", entry);
        if (!plan->finalized)
            return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_plan_finalize after the last setter");
        return execute_plan(plan, tensors_of(*args, workspace, workspace_bytes, stream));
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward_args(const flashattn_plan_t *plan,
                                                                      const flashattn_args_t *args, void *workspace,
                                                                      size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", entry);
        if (args == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: NULL passed to %s", entry);
        if (!plan->finalized)
            return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_plan_finalize after the last setter");
        return execute_backward_plan(plan, tensors_of(*args, workspace, workspace_bytes, stream));
    });
}

}  // extern "C"
