/* Issue 21's API defects: messages that name the real entry point for a NULL plan, the range of
 * the softmax scale and softcap (setter and finalize), and plan values whose products cannot be
 * represented (varlen batch, totals past int32 cu_seqlens) rejected at finalize with a specific
 * message; huge windows and varlen maxima resolved as documented (get_i64 after finalize). The
 * numerics of these settings are in tests/numerics/test_special_values.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "test_runner.h"

/* The message must name `fn` and must not name a lambda ("operator()"). */
static void assert_names(const char *fn) {
    const char *msg = flashattn_last_error();
    if (strstr(msg, fn) == NULL || strstr(msg, "operator") != NULL)
        fail_msg("message '%s' does not name %s", msg, fn);
}

static void null_plan_messages_name_the_entry_point(void **state) {
    (void)state;
    int64_t i = 0;
    double f = 0.0;
    size_t bytes = 0;
    flashattn_backend_t be;
    float x[16];
    assert_status(flashattn_plan_set_i64(NULL, FLASHATTN_I64_BATCH, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_set_i64");
    assert_status(flashattn_plan_set_f64(NULL, FLASHATTN_F64_SOFTCAP, 1.0), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_set_f64");
    assert_status(flashattn_plan_get_i64(NULL, FLASHATTN_I64_BATCH, &i), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_i64");
    assert_status(flashattn_plan_get_f64(NULL, FLASHATTN_F64_SOFTCAP, &f), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_f64");
    assert_status(flashattn_plan_finalize(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_finalize");
    assert_status(flashattn_plan_get_backend(NULL, &be, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_backend");
    assert_status(flashattn_plan_get_workspace_size(NULL, &bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_workspace_size");
    assert_status(flashattn_plan_execute(NULL, x, x, x, x, NULL, NULL, 0, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute");
    assert_status(flashattn_plan_execute_varlen(NULL, x, x, x, x, NULL, NULL, NULL, NULL, 0, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute_varlen");
    assert_status(flashattn_plan_get_backward_backend(NULL, &be, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_backward_backend");
    assert_status(flashattn_plan_get_backward_workspace_size(NULL, &bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_get_backward_workspace_size");
    assert_status(flashattn_plan_execute_backward(NULL, x, x, x, x, x, x, x, x, x, NULL, 0, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute_backward");
    assert_status(flashattn_plan_execute_backward_varlen(NULL, x, x, x, x, x, x, x, x, x, NULL, NULL, NULL, 0, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute_backward_varlen");
    /* The 0.3 entry points (execute arguments, merge): the same rule. */
    const void *ptrs[1] = {x};
    const float *lses[1] = {x};
    const void *got = NULL;
    assert_status(flashattn_plan_execute_args(NULL, NULL, NULL, 0, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute_args");
    assert_status(flashattn_plan_execute_backward_args(NULL, NULL, NULL, 0, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_execute_backward_args");
    assert_status(flashattn_plan_merge_states(NULL, 1, ptrs, lses, FLASHATTN_DTYPE_FP32, x, NULL, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_plan_merge_states");
    assert_status(flashattn_args_set(NULL, FLASHATTN_ARG_Q, x), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_args_set");
    assert_status(flashattn_args_get(NULL, FLASHATTN_ARG_Q, &got), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_names("flashattn_args_get");
}

static flashattn_plan_t *small_plan(void) {
    static const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, 1},   {FLASHATTN_I64_SEQLEN_Q, 4}, {FLASHATTN_I64_SEQLEN_K, 4},
        {FLASHATTN_I64_HEADS_Q, 2}, {FLASHATTN_I64_HEAD_DIM, 8}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32},
        {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
    };
    return plan_with_keys(keys, sizeof keys / sizeof keys[0]);
}

/* Values the float kernels cannot use are refused where they enter, naming the range. */
static void scale_and_softcap_ranges(void **state) {
    (void)state;
    flashattn_plan_t *plan = small_plan();
    const double bad[] = {1e39, 1e20, 1e-39, 1e-300, 0x1p-127};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, bad[i]), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("SOFTMAX_SCALE");
        assert_message_mentions("2^64");
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, bad[i]), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("SOFTCAP");
        assert_message_mentions("2^-126");
    }
    double f = -1.0;
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &f), FLASHATTN_SUCCESS);
    assert_true(f == 0.0); /* nothing was stored */
    const double good[] = {0x1p-126, 0x1p64, 1e-30, 1e19, 0.125};
    for (size_t i = 0; i < sizeof good / sizeof *good; ++i) {
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, good[i]), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, good[i]), FLASHATTN_SUCCESS);
    }
    /* scale / softcap must be a float the kernels can form: 4 / 2e-38 is past 2^126. */
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, 4.0), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, 2e-38), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("SOFTCAP");
    assert_message_mentions("2^126");
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, 1e-30), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    flashattn_plan_destroy(plan);
}

static flashattn_plan_t *varlen_plan(int64_t batch, int64_t seqlen_q, int64_t total_q, int64_t total_k, int64_t heads) {
    const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, batch},     {FLASHATTN_I64_SEQLEN_Q, seqlen_q}, {FLASHATTN_I64_SEQLEN_K, 16},
        {FLASHATTN_I64_HEADS_Q, heads},       {FLASHATTN_I64_HEAD_DIM, 8},        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32},
        {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU}, {FLASHATTN_I64_VARLEN, 1},
        {FLASHATTN_I64_TOTAL_Q, total_q}, {FLASHATTN_I64_TOTAL_K, total_k},
    };
    return plan_with_keys(keys, sizeof keys / sizeof keys[0]);
}

/* What cannot be represented is refused at finalize, naming the key; the declared maxima of a
 * varlen plan are clamped to the totals. */
static void unrepresentable_plans(void **state) {
    (void)state;
    flashattn_plan_t *plan = varlen_plan(INT64_MAX, 4, 4, 4, 2);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("BATCH");
    flashattn_plan_destroy(plan);

    plan = varlen_plan(INT64_MAX / 8, 4, 4, 4, 64); /* cu_seqlens fit in 64 bits, the work items do not */
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("BATCH");
    flashattn_plan_destroy(plan);

    plan = varlen_plan(2, INT64_MAX, (int64_t)1 << 31, 4, 2); /* int32 cu_seqlens cannot reach 2^31 rows */
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("TOTAL_Q");
    flashattn_plan_destroy(plan);

    plan = varlen_plan(2, INT64_MAX, 5, 20, 2);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    int64_t v = 0;
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_SEQLEN_Q, &v), FLASHATTN_SUCCESS);
    assert_int_equal(v, 5);  /* no sequence is longer than total_q */
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_SEQLEN_K, &v), FLASHATTN_SUCCESS);
    assert_int_equal(v, 16); /* already below total_k */
    flashattn_plan_destroy(plan);

    static const test_key_value fixed[] = {
        {FLASHATTN_I64_BATCH, INT64_MAX}, {FLASHATTN_I64_SEQLEN_Q, 4}, {FLASHATTN_I64_SEQLEN_K, 4},
        {FLASHATTN_I64_HEADS_Q, 2},       {FLASHATTN_I64_HEAD_DIM, 8}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
    };
    plan = plan_with_keys(fixed, sizeof fixed / sizeof fixed[0]);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("overflows");
    flashattn_plan_destroy(plan);
}

static void huge_windows_resolve_to_none(void **state) {
    (void)state;
    flashattn_plan_t *plan = small_plan();
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_LEFT, INT64_MAX), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, 7), FLASHATTN_SUCCESS);
    int64_t v = 0;
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_LEFT, &v), FLASHATTN_SUCCESS);
    assert_true(v == INT64_MAX); /* as set, before finalize */
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_LEFT, &v), FLASHATTN_SUCCESS);
    assert_int_equal(v, -1);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, &v), FLASHATTN_SUCCESS);
    assert_int_equal(v, 7); /* below seqlen_q + seqlen_k = 8: a window */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, 8), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, &v), FLASHATTN_SUCCESS);
    assert_int_equal(v, -1);
    flashattn_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_plan_messages_name_the_entry_point),
        cmocka_unit_test(scale_and_softcap_ranges),
        cmocka_unit_test(unrepresentable_plans),
        cmocka_unit_test(huge_windows_resolve_to_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
