// The C boundary for plans: argument checks, state rules and exception translation. The work is
// done in dispatch/ and the backends.
#include <cstring>
#include <new>

#include "capi/guard.h"
#include "dispatch/dispatch.h"

using namespace flashattn;

namespace {

// `function` is the entry point's name, captured outside guarded()'s lambda (`entry = __func__`):
// __func__ inside the lambda would name the lambda's operator().
flashattn_status_t null_plan(const char *function) {
    return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", function);
}

// The state rules of every execute call: finalized, and the varlen entry point for varlen plans.
flashattn_status_t check_call_state(const flashattn_plan_t *plan, bool varlen_call, const char *fixed_fn,
                                    const char *varlen_fn) {
    if (!plan->finalized)
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_plan_finalize after the last setter");
    if (plan->problem.varlen && !varlen_call)
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: FLASHATTN_I64_VARLEN is 1; call %s", varlen_fn);
    if (!plan->problem.varlen && varlen_call)
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: FLASHATTN_I64_VARLEN is 0; call %s", fixed_fn);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t run(const flashattn_plan_t *plan, bool varlen_call, const Tensors &t) {
    FLASHATTN_TRY(check_call_state(plan, varlen_call, "flashattn_plan_execute", "flashattn_plan_execute_varlen"));
    if (const char *feature = serving_feature(plan->problem))
        return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: uses %s, whose tensors only flashattn_plan_execute_args takes",
                    feature);
    return execute_plan(plan, t);
}

flashattn_status_t run_backward(const flashattn_plan_t *plan, bool varlen_call, const Tensors &t) {
    FLASHATTN_TRY(check_call_state(plan, varlen_call, "flashattn_plan_execute_backward",
                                   "flashattn_plan_execute_backward_varlen"));
    return execute_backward_plan(plan, t);
}

Tensors backward_tensors(const void *q, const void *k, const void *v, const void *o, const void *dout, const float *lse,
                         void *dq, void *dk, void *dv, void *workspace, size_t workspace_bytes, flashattn_stream_t stream) {
    Tensors t;
    t.q = q; t.k = k; t.v = v; t.o = const_cast<void *>(o); t.lse = const_cast<float *>(lse);  // read only
    t.dout = dout; t.dq = dq; t.dk = dk; t.dv = dv;
    t.workspace = workspace; t.workspace_bytes = workspace_bytes; t.stream = stream;
    return t;
}

flashattn_status_t require_finalized(const flashattn_plan_t *plan, const char *what) {
    if (plan->finalized) return FLASHATTN_SUCCESS;
    return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; %s is fixed by flashattn_plan_finalize", what);
}

}  // namespace

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_plan_create(flashattn_plan_t **plan) {
    return guarded(__func__, [&] {
        if (plan == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: the out-pointer must not be NULL");
        *plan = nullptr;
        flashattn_plan_t *created = new (std::nothrow) flashattn_plan_t();
        if (created == nullptr) return fail(FLASHATTN_ERROR_ALLOCATION, "plan: out of host memory");
        *plan = created;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API void flashattn_plan_destroy(flashattn_plan_t *plan) { delete plan; }

FLASHATTN_API flashattn_status_t flashattn_plan_set_i64(flashattn_plan_t *plan, flashattn_i64_param_t key, int64_t value) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        const int k = enum_value(&key);
        FLASHATTN_TRY(check_i64_value(k, value));
        plan->params.i64[k] = value;
        plan->params.is_set[k] = true;
        plan->finalized = false;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_set_f64(flashattn_plan_t *plan, flashattn_f64_param_t key, double value) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        const int k = enum_value(&key);
        FLASHATTN_TRY(check_f64_value(k, value));
        (k == FLASHATTN_F64_SOFTMAX_SCALE ? plan->params.softmax_scale : plan->params.softcap) = value;
        plan->finalized = false;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_i64(const flashattn_plan_t *plan, flashattn_i64_param_t key,
                                                        int64_t *value) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (value == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: the out-pointer must not be NULL");
        const int k = enum_value(&key);
        if (i64_key_name(k) == nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "key: %d is not a flashattn_i64_param_t value", k);
        if (!plan->finalized) {
            *value = plan->params.is_set[k] ? plan->params.i64[k] : i64_default(k);
            return FLASHATTN_SUCCESS;
        }
        const Problem &p = plan->problem;
        switch (static_cast<flashattn_i64_param_t>(k)) {
            case FLASHATTN_I64_BATCH: *value = p.batch; break;
            case FLASHATTN_I64_SEQLEN_Q: *value = p.seqlen_q; break;
            case FLASHATTN_I64_SEQLEN_K: *value = p.seqlen_k; break;
            case FLASHATTN_I64_HEADS_Q: *value = p.heads_q; break;
            case FLASHATTN_I64_HEADS_KV: *value = p.heads_kv; break;
            case FLASHATTN_I64_HEAD_DIM: *value = p.head_dim; break;
            case FLASHATTN_I64_HEAD_DIM_V: *value = p.head_dim_v; break;
            case FLASHATTN_I64_DTYPE: *value = p.dtype; break;
            case FLASHATTN_I64_CAUSAL: *value = p.causal; break;
            case FLASHATTN_I64_WINDOW_LEFT: *value = p.window_left; break;
            case FLASHATTN_I64_WINDOW_RIGHT: *value = p.window_right; break;
            case FLASHATTN_I64_BACKEND: *value = plan->backend->id; break;
            case FLASHATTN_I64_DEVICE: *value = p.device; break;
            case FLASHATTN_I64_VARLEN: *value = p.varlen; break;
            case FLASHATTN_I64_TOTAL_Q: *value = p.total_q; break;
            case FLASHATTN_I64_TOTAL_K: *value = p.total_k; break;
            case FLASHATTN_I64_Q_BATCH_STRIDE: *value = p.q.batch; break;
            case FLASHATTN_I64_Q_ROW_STRIDE: *value = p.q.row; break;
            case FLASHATTN_I64_Q_HEAD_STRIDE: *value = p.q.head; break;
            case FLASHATTN_I64_K_BATCH_STRIDE: *value = p.k.batch; break;
            case FLASHATTN_I64_K_ROW_STRIDE: *value = p.k.row; break;
            case FLASHATTN_I64_K_HEAD_STRIDE: *value = p.k.head; break;
            case FLASHATTN_I64_V_BATCH_STRIDE: *value = p.v.batch; break;
            case FLASHATTN_I64_V_ROW_STRIDE: *value = p.v.row; break;
            case FLASHATTN_I64_V_HEAD_STRIDE: *value = p.v.head; break;
            case FLASHATTN_I64_O_BATCH_STRIDE: *value = p.o.batch; break;
            case FLASHATTN_I64_O_ROW_STRIDE: *value = p.o.row; break;
            case FLASHATTN_I64_O_HEAD_STRIDE: *value = p.o.head; break;
            case FLASHATTN_I64_DETERMINISTIC: *value = p.deterministic; break;
            case FLASHATTN_I64_DO_BATCH_STRIDE: *value = p.dout.batch; break;
            case FLASHATTN_I64_DO_ROW_STRIDE: *value = p.dout.row; break;
            case FLASHATTN_I64_DO_HEAD_STRIDE: *value = p.dout.head; break;
            case FLASHATTN_I64_DQ_BATCH_STRIDE: *value = p.dq.batch; break;
            case FLASHATTN_I64_DQ_ROW_STRIDE: *value = p.dq.row; break;
            case FLASHATTN_I64_DQ_HEAD_STRIDE: *value = p.dq.head; break;
            case FLASHATTN_I64_DK_BATCH_STRIDE: *value = p.dk.batch; break;
            case FLASHATTN_I64_DK_ROW_STRIDE: *value = p.dk.row; break;
            case FLASHATTN_I64_DK_HEAD_STRIDE: *value = p.dk.head; break;
            case FLASHATTN_I64_DV_BATCH_STRIDE: *value = p.dv.batch; break;
            case FLASHATTN_I64_DV_ROW_STRIDE: *value = p.dv.row; break;
            case FLASHATTN_I64_DV_HEAD_STRIDE: *value = p.dv.head; break;
            case FLASHATTN_I64_MASK_ALIGN: *value = p.top_left ? FLASHATTN_MASK_ALIGN_TOP_LEFT : FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT; break;
            case FLASHATTN_I64_SINK_TOKENS: *value = p.sink_tokens; break;
            case FLASHATTN_I64_SINK_LOGITS: *value = p.sink_logits; break;
            case FLASHATTN_I64_ALIBI: *value = p.alibi; break;
            case FLASHATTN_I64_OUTPUT_DTYPE: *value = p.o_dtype; break;
            case FLASHATTN_I64_DESCALE_BATCH_STRIDE: *value = p.fp8() ? p.descale_batch_stride : -1; break;
            case FLASHATTN_I64_DESCALE_HEAD_STRIDE: *value = p.fp8() ? p.descale_head_stride : -1; break;
            case FLASHATTN_I64_PAGED_KV: *value = p.serving.paged; break;
            case FLASHATTN_I64_PAGE_SIZE: *value = p.serving.page_size; break;
            case FLASHATTN_I64_NUM_PAGES: *value = p.serving.num_pages; break;
            case FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE: *value = p.serving.max_pages; break;
            case FLASHATTN_I64_PAGE_TABLE_STRIDE: *value = p.serving.page_table_stride; break;
            case FLASHATTN_I64_SEQUSED_K: *value = p.serving.seqused_k; break;
            case FLASHATTN_I64_NEW_KV_ROWS: *value = p.serving.new_rows; break;
            case FLASHATTN_I64_K_NEW_BATCH_STRIDE: *value = p.serving.k_new.batch; break;
            case FLASHATTN_I64_K_NEW_ROW_STRIDE: *value = p.serving.k_new.row; break;
            case FLASHATTN_I64_K_NEW_HEAD_STRIDE: *value = p.serving.k_new.head; break;
            case FLASHATTN_I64_V_NEW_BATCH_STRIDE: *value = p.serving.v_new.batch; break;
            case FLASHATTN_I64_V_NEW_ROW_STRIDE: *value = p.serving.v_new.row; break;
            case FLASHATTN_I64_V_NEW_HEAD_STRIDE: *value = p.serving.v_new.head; break;
            case FLASHATTN_I64_ROTARY_DIM: *value = p.serving.rotary_dim; break;
            case FLASHATTN_I64_ROTARY_INTERLEAVED: *value = p.serving.rotary_interleaved; break;
            case FLASHATTN_I64_NUM_SPLITS: *value = plan->backend_plan->num_splits; break;
        }
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_f64(const flashattn_plan_t *plan, flashattn_f64_param_t key,
                                                        double *value) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (value == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: the out-pointer must not be NULL");
        const int k = enum_value(&key);
        if (f64_key_name(k) == nullptr)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "key: %d is not a flashattn_f64_param_t value", k);
        if (k == FLASHATTN_F64_SOFTMAX_SCALE)
            *value = plan->finalized ? plan->problem.scale : plan->params.softmax_scale;
        else
            *value = plan->params.softcap;
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_finalize(flashattn_plan_t *plan) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        return finalize_plan(plan);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_backend(const flashattn_plan_t *plan, flashattn_backend_t *backend,
                                                            const char **reason) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (backend == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "backend: the out-pointer must not be NULL");
        if (!plan->finalized) return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; the backend is chosen by flashattn_plan_finalize");
        *backend = plan->backend->id;
        if (reason != nullptr) *reason = plan->reason.c_str();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_workspace_size(const flashattn_plan_t *plan, size_t *bytes) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (bytes == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: the out-pointer must not be NULL");
        if (!plan->finalized) return fail(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; the workspace size is fixed by flashattn_plan_finalize");
        *bytes = plan->workspace_bytes();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute(const flashattn_plan_t *plan, const void *q, const void *k,
                                                        const void *v, void *o, float *lse, void *workspace,
                                                        size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        Tensors t;
        t.q = q; t.k = k; t.v = v; t.o = o; t.lse = lse;
        t.workspace = workspace; t.workspace_bytes = workspace_bytes; t.stream = stream;
        return run(plan, false, t);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_varlen(const flashattn_plan_t *plan, const void *q, const void *k,
                                                               const void *v, void *o, float *lse,
                                                               const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                                               void *workspace, size_t workspace_bytes,
                                                               flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        Tensors t;
        t.q = q; t.k = k; t.v = v; t.o = o; t.lse = lse;
        t.cu_seqlens_q = cu_seqlens_q; t.cu_seqlens_k = cu_seqlens_k;
        t.workspace = workspace; t.workspace_bytes = workspace_bytes; t.stream = stream;
        return run(plan, true, t);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_backward_backend(const flashattn_plan_t *plan,
                                                                     flashattn_backend_t *backend, const char **reason) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (backend == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "backend: the out-pointer must not be NULL");
        FLASHATTN_TRY(require_finalized(plan, "the backward backend"));
        if (plan->backward_backend == nullptr)
            return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "plan: %s", plan->backward_reason.c_str());
        *backend = plan->backward_backend->id;
        if (reason != nullptr) *reason = plan->backward_reason.c_str();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_get_backward_workspace_size(const flashattn_plan_t *plan, size_t *bytes) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        if (bytes == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: the out-pointer must not be NULL");
        FLASHATTN_TRY(require_finalized(plan, "the backward workspace size"));
        if (plan->backward_backend == nullptr)
            return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "plan: %s", plan->backward_reason.c_str());
        *bytes = plan->backward_workspace_bytes();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward(const flashattn_plan_t *plan, const void *q, const void *k,
                                                                 const void *v, const void *o, const void *dout,
                                                                 const float *lse, void *dq, void *dk, void *dv,
                                                                 void *workspace, size_t workspace_bytes,
                                                                 flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        const Tensors t = backward_tensors(q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream);
        return run_backward(plan, false, t);
    });
}

FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward_varlen(
    const flashattn_plan_t *plan, const void *q, const void *k, const void *v, const void *o, const void *dout,
    const float *lse, void *dq, void *dk, void *dv, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
    void *workspace, size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        if (plan == nullptr) return null_plan(entry);
        Tensors t = backward_tensors(q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream);
        t.cu_seqlens_q = cu_seqlens_q;
        t.cu_seqlens_k = cu_seqlens_k;
        return run_backward(plan, true, t);
    });
}

}  // extern "C"
