#include "problem/fp8.h"

#include <cstdint>
#include <initializer_list>

#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace {

const char *dtype_name(flashattn_dtype_t d) {
    switch (d) {
        case FLASHATTN_DTYPE_FP16: return "FLASHATTN_DTYPE_FP16";
        case FLASHATTN_DTYPE_BF16: return "FLASHATTN_DTYPE_BF16";
        case FLASHATTN_DTYPE_FP32: return "FLASHATTN_DTYPE_FP32";
        case FLASHATTN_DTYPE_FP8_E4M3: return "FLASHATTN_DTYPE_FP8_E4M3";
        default: return "an unknown dtype";
    }
}

bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
    return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

flashattn_status_t resolve_output_dtype(const PlanParams &params, Problem *p) {
    const bool set = params.is_set[FLASHATTN_I64_OUTPUT_DTYPE];
    const auto o = static_cast<flashattn_dtype_t>(params.get(FLASHATTN_I64_OUTPUT_DTYPE, 0));
    if (!p->fp8()) {
        if (set && o != p->dtype)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "FLASHATTN_I64_OUTPUT_DTYPE: %s, but a %s plan writes O in its own dtype (only FP8 plans "
                        "choose another)",
                        dtype_name(o), dtype_name(p->dtype));
        p->o_dtype = p->dtype;
        return FLASHATTN_SUCCESS;
    }
    p->o_dtype = set ? o : FLASHATTN_DTYPE_BF16;
    if (p->o_dtype != FLASHATTN_DTYPE_BF16 && p->o_dtype != FLASHATTN_DTYPE_FP16)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_OUTPUT_DTYPE: %s, but an FP8 plan writes O as FLASHATTN_DTYPE_BF16 or FLASHATTN_DTYPE_FP16",
                    dtype_name(p->o_dtype));
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t resolve_fp8(const PlanParams &params, Problem *p) {
    FLASHATTN_TRY(resolve_output_dtype(params, p));
    for (flashattn_i64_param_t key : {FLASHATTN_I64_DESCALE_BATCH_STRIDE, FLASHATTN_I64_DESCALE_HEAD_STRIDE})
        if (!p->fp8() && params.is_set[key])
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but FLASHATTN_I64_DTYPE is not FLASHATTN_DTYPE_FP8_E4M3",
                        i64_key_name(key));
    if (!p->fp8()) return FLASHATTN_SUCCESS;
    p->descale_batch_stride = params.get(FLASHATTN_I64_DESCALE_BATCH_STRIDE, p->heads_kv);
    p->descale_head_stride = params.get(FLASHATTN_I64_DESCALE_HEAD_STRIDE, 1);
    int64_t end, bytes;
    if (!mul_add(p->batch - 1, p->descale_batch_stride, 1, &end) ||
        !mul_add(p->heads_kv - 1, p->descale_head_stride, end, &end) || !mul_add(end, 4, 0, &bytes))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_DESCALE_BATCH_STRIDE: the descale arrays' size in bytes overflows 64 bits");
    return FLASHATTN_SUCCESS;
}

size_t fp8_descale_bytes(const Problem &p) {
    if (!p.fp8()) return 0;
    const int64_t end = (p.batch - 1) * p.descale_batch_stride + (p.heads_kv - 1) * p.descale_head_stride + 1;
    return static_cast<size_t>(end) * sizeof(float);  // resolve_fp8 checked that it fits
}

flashattn_status_t check_fp8_args(const Problem &p, const Tensors &t, bool backward, size_t workspace_needed) {
    const struct { const float *ptr; const char *name; } arrays[] = {
        {t.descale_q, "descale_q"}, {t.descale_k, "descale_k"}, {t.descale_v, "descale_v"}};
    const bool used = p.fp8() && !backward;
    for (const auto &a : arrays) {
        if (used && a.ptr == nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s: NULL, but the plan's dtype is FLASHATTN_DTYPE_FP8_E4M3 (pass the descale factors with "
                        "flashattn_plan_execute_args)",
                        a.name);
        if (!used && a.ptr != nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: set, but %s", a.name,
                        backward ? "the backward pass does not use it" : "the plan's dtype is not FLASHATTN_DTYPE_FP8_E4M3");
    }
    if (!used) return FLASHATTN_SUCCESS;
    const size_t bytes = p.extents.descale;
    for (const auto &a : arrays) {
        if (overlaps(t.o, p.extents.o, a.ptr, bytes)) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "o: overlaps %s", a.name);
        if (overlaps(t.lse, p.extents.lse, a.ptr, bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse: overlaps %s", a.name);
        if (overlaps(t.workspace, workspace_needed, a.ptr, bytes))
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: overlaps %s", a.name);
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
