/* The C API's contract: lifecycle, every setter and getter, every bad input -> the exact status,
 * a non-empty message, and outputs left untouched. Runs on the CPU backend (forced). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "test_contract.h"
#include "test_runner.h"


static flashattn_plan_t *basic_plan(void) {
    static const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, B},     {FLASHATTN_I64_SEQLEN_Q, SQ}, {FLASHATTN_I64_SEQLEN_K, SK},
        {FLASHATTN_I64_HEADS_Q, H},   {FLASHATTN_I64_HEADS_KV, HKV}, {FLASHATTN_I64_HEAD_DIM, D},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
    };
    return plan_with_keys(keys, sizeof keys / sizeof keys[0]);
}

/* Host buffers for the basic plan, inputs random, outputs poisoned. */
typedef struct {
    float q[B * SQ * H * D], k[B * SK * HKV * D], v[B * SK * HKV * D];
    float o[B * SQ * H * D], lse[B * H * SQ];
    float o_poison[B * SQ * H * D], lse_poison[B * H * SQ];
    unsigned char *workspace;
    size_t workspace_bytes;
} buffers;

static buffers *make_buffers(const flashattn_plan_t *plan) {
    buffers *b = calloc(1, sizeof *b);
    assert_non_null(b);
    srand(12345);
    for (size_t i = 0; i < sizeof b->q / sizeof *b->q; ++i) b->q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < sizeof b->k / sizeof *b->k; ++i) b->k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < sizeof b->v / sizeof *b->v; ++i) b->v[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    memset(b->o, 0x7f, sizeof b->o);
    memset(b->lse, 0x7f, sizeof b->lse);
    memcpy(b->o_poison, b->o, sizeof b->o);
    memcpy(b->lse_poison, b->lse, sizeof b->lse);
    b->workspace_bytes = 0;
    if (plan) assert_status(flashattn_plan_get_workspace_size(plan, &b->workspace_bytes), FLASHATTN_SUCCESS);
    b->workspace = b->workspace_bytes ? aligned_alloc(256, (b->workspace_bytes + 255) / 256 * 256) : NULL;
    return b;
}

static void free_buffers(buffers *b) {
    free(b->workspace);
    free(b);
}

static void assert_outputs_untouched(const buffers *b) {
    assert_memory_equal(b->o, b->o_poison, sizeof b->o);
    assert_memory_equal(b->lse, b->lse_poison, sizeof b->lse);
}

static flashattn_status_t execute(const flashattn_plan_t *plan, buffers *b) {
    return flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, b->lse, b->workspace, b->workspace_bytes, NULL);
}

/* ------------------------------------------------------------------------------------------ */

static void test_lifecycle(void **state) {
    (void)state;
    flashattn_plan_destroy(NULL); /* no-op */
    assert_status(flashattn_plan_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("plan");

    flashattn_plan_t *plan = basic_plan();
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    assert_status(flashattn_plan_get_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
    assert_non_null(reason);
    assert_true(strlen(reason) > 0);
    assert_status(flashattn_plan_get_backend(plan, &backend, NULL), FLASHATTN_SUCCESS);

    buffers *b = make_buffers(plan);
    for (int run = 0; run < 3; ++run) { /* execute many times, new data each time */
        b->q[run] += 0.25f;
        assert_status(execute(plan, b), FLASHATTN_SUCCESS);
        for (size_t i = 0; i < sizeof b->o / sizeof *b->o; ++i) assert_true(isfinite(b->o[i]));
        for (size_t i = 0; i < sizeof b->lse / sizeof *b->lse; ++i) assert_true(isfinite(b->lse[i]));
    }
    /* LSE is optional. */
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, NULL, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_SUCCESS);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_setters_and_getters(void **state) {
    (void)state;
    flashattn_plan_t *plan = NULL;
    assert_status(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    int64_t value = 0;
    double f = -1;
    /* Defaults before finalize. */
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DTYPE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, FLASHATTN_DTYPE_FP16);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_LEFT, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, -1);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_Q_ROW_STRIDE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, -1);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_BACKEND, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, FLASHATTN_BACKEND_AUTO);
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &f), FLASHATTN_SUCCESS);
    assert_true(f == 0.0);

    /* Every key round-trips. */
    const struct { flashattn_i64_param_t key; int64_t value; } sets[] = {
        {FLASHATTN_I64_BATCH, 3}, {FLASHATTN_I64_SEQLEN_Q, 11}, {FLASHATTN_I64_SEQLEN_K, 13},
        {FLASHATTN_I64_HEADS_Q, 6}, {FLASHATTN_I64_HEADS_KV, 3}, {FLASHATTN_I64_HEAD_DIM, 64},
        {FLASHATTN_I64_HEAD_DIM_V, 32}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_BF16}, {FLASHATTN_I64_CAUSAL, 1},
        {FLASHATTN_I64_WINDOW_LEFT, 5}, {FLASHATTN_I64_WINDOW_RIGHT, 0}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
        {FLASHATTN_I64_DEVICE, 0}, {FLASHATTN_I64_VARLEN, 0}, {FLASHATTN_I64_TOTAL_Q, 20}, {FLASHATTN_I64_TOTAL_K, 30},
        {FLASHATTN_I64_Q_BATCH_STRIDE, 100000}, {FLASHATTN_I64_Q_ROW_STRIDE, 1000}, {FLASHATTN_I64_Q_HEAD_STRIDE, 128},
        {FLASHATTN_I64_K_BATCH_STRIDE, 100000}, {FLASHATTN_I64_K_ROW_STRIDE, 1000}, {FLASHATTN_I64_K_HEAD_STRIDE, 128},
        {FLASHATTN_I64_V_BATCH_STRIDE, 100000}, {FLASHATTN_I64_V_ROW_STRIDE, 1000}, {FLASHATTN_I64_V_HEAD_STRIDE, 128},
        {FLASHATTN_I64_O_BATCH_STRIDE, 100000}, {FLASHATTN_I64_O_ROW_STRIDE, 1000}, {FLASHATTN_I64_O_HEAD_STRIDE, 128},
    };
    for (size_t i = 0; i < sizeof sets / sizeof *sets; ++i) {
        assert_status(flashattn_plan_set_i64(plan, sets[i].key, sets[i].value), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_get_i64(plan, sets[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, sets[i].value);
    }
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, 0.5), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &f), FLASHATTN_SUCCESS);
    assert_true(f == 0.5);
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, 30.0), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTCAP, &f), FLASHATTN_SUCCESS);
    assert_true(f == 30.0);
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, 0.0), FLASHATTN_SUCCESS); /* off */

    /* Bad keys and values. */
    assert_status(flashattn_plan_set_i64(NULL, FLASHATTN_I64_BATCH, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("plan");
    assert_status(flashattn_plan_set_i64(plan, (flashattn_i64_param_t)0, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("key");
    assert_status(flashattn_plan_set_i64(plan, (flashattn_i64_param_t)17, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_set_i64(plan, (flashattn_i64_param_t)9999, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_set_i64(plan, (flashattn_i64_param_t)-1, 1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    const struct { flashattn_i64_param_t key; int64_t value; const char *word; } bad[] = {
        {FLASHATTN_I64_BATCH, 0, "BATCH"}, {FLASHATTN_I64_BATCH, -3, "BATCH"},
        {FLASHATTN_I64_SEQLEN_Q, 0, "SEQLEN_Q"}, {FLASHATTN_I64_SEQLEN_K, -1, "SEQLEN_K"},
        {FLASHATTN_I64_HEADS_Q, 0, "HEADS_Q"}, {FLASHATTN_I64_HEADS_KV, 0, "HEADS_KV"},
        {FLASHATTN_I64_HEAD_DIM, 264, "HEAD_DIM"}, {FLASHATTN_I64_HEAD_DIM, 60, "multiple of 8"},
        {FLASHATTN_I64_HEAD_DIM, 0, "HEAD_DIM"}, {FLASHATTN_I64_HEAD_DIM_V, 12, "HEAD_DIM_V"},
        {FLASHATTN_I64_DTYPE, 0, "DTYPE"}, {FLASHATTN_I64_DTYPE, 5, "DTYPE"},
        {FLASHATTN_I64_CAUSAL, 2, "CAUSAL"}, {FLASHATTN_I64_CAUSAL, -1, "CAUSAL"},
        {FLASHATTN_I64_WINDOW_LEFT, -2, "WINDOW_LEFT"}, {FLASHATTN_I64_WINDOW_RIGHT, -5, "WINDOW_RIGHT"},
        {FLASHATTN_I64_BACKEND, 5, "BACKEND"}, {FLASHATTN_I64_BACKEND, -1, "BACKEND"},
        {FLASHATTN_I64_DEVICE, -1, "DEVICE"}, {FLASHATTN_I64_VARLEN, 2, "VARLEN"},
        {FLASHATTN_I64_TOTAL_Q, -1, "TOTAL_Q"}, {FLASHATTN_I64_Q_ROW_STRIDE, 0, "Q_ROW_STRIDE"},
        {FLASHATTN_I64_O_HEAD_STRIDE, -4, "O_HEAD_STRIDE"}, {FLASHATTN_I64_K_BATCH_STRIDE, 0, "K_BATCH_STRIDE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        assert_status(flashattn_plan_get_i64(plan, bad[i].key, &value), FLASHATTN_SUCCESS);
        const int64_t before = value;
        assert_status(flashattn_plan_set_i64(plan, bad[i].key, bad[i].value), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions(bad[i].word);
        assert_status(flashattn_plan_get_i64(plan, bad[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, before); /* a rejected value changes nothing */
    }
    const double bad_f[] = {NAN, INFINITY, -INFINITY, -1.0};
    for (size_t i = 0; i < 4; ++i) {
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, bad_f[i]), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("SOFTMAX_SCALE");
        assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, bad_f[i]), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("SOFTCAP");
    }
    assert_status(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, 0.0), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_set_f64(plan, (flashattn_f64_param_t)7, 1.0), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("key");
    assert_status(flashattn_plan_set_f64(NULL, FLASHATTN_F64_SOFTCAP, 1.0), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_BATCH, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("value");
    assert_status(flashattn_plan_get_i64(NULL, FLASHATTN_I64_BATCH, &value), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_i64(plan, (flashattn_i64_param_t)99, &value), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTCAP, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_f64(NULL, FLASHATTN_F64_SOFTCAP, &f), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_f64(plan, (flashattn_f64_param_t)0, &f), FLASHATTN_ERROR_INVALID_ARGUMENT);
    flashattn_plan_destroy(plan);
}

static void test_resolved_values(void **state) {
    (void)state;
    flashattn_plan_t *plan = basic_plan();
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, H), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    int64_t value = 0;
    double f = 0;
    assert_status(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &f), FLASHATTN_SUCCESS);
    assert_true(fabs(f - 1.0 / sqrt((double)D)) < 1e-15);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_HEAD_DIM_V, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, D);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_Q_ROW_STRIDE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, H * D);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_Q_BATCH_STRIDE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, SQ * H * D);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_K_BATCH_STRIDE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, SK * H * D);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_O_HEAD_STRIDE, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, D);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_BACKEND, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, FLASHATTN_BACKEND_CPU);
    /* A setter un-finalizes the plan. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, 1), FLASHATTN_SUCCESS);
    size_t bytes = 0;
    assert_status(flashattn_plan_get_workspace_size(plan, &bytes), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("finalize");
    buffers *b = make_buffers(NULL);
    assert_status(execute(plan, b), FLASHATTN_ERROR_INVALID_STATE);
    assert_outputs_untouched(b);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_finalize_errors(void **state) {
    (void)state;
    /* Each required size missing in turn. */
    const flashattn_i64_param_t required[] = {FLASHATTN_I64_BATCH, FLASHATTN_I64_SEQLEN_Q, FLASHATTN_I64_SEQLEN_K,
                                              FLASHATTN_I64_HEADS_Q, FLASHATTN_I64_HEAD_DIM};
    const char *names[] = {"BATCH", "SEQLEN_Q", "SEQLEN_K", "HEADS_Q", "HEAD_DIM"};
    for (size_t skip = 0; skip < 5; ++skip) {
        flashattn_plan_t *plan = NULL;
        assert_status(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
        for (size_t i = 0; i < 5; ++i)
            if (i != skip) assert_status(flashattn_plan_set_i64(plan, required[i], 16), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_STATE);
        assert_message_mentions(names[skip]);
        flashattn_backend_t backend;
        assert_status(flashattn_plan_get_backend(plan, &backend, NULL), FLASHATTN_ERROR_INVALID_STATE);
        flashattn_plan_destroy(plan);
    }
    assert_status(flashattn_plan_finalize(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);

    flashattn_plan_t *plan = basic_plan();
    /* GQA rule. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, 3), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("HEADS_KV");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, 8), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, HKV), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);

    /* Size arithmetic that overflows 64 bits. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, INT64_C(1) << 40), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, INT64_C(1) << 40), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("overflow");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, 1), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, SQ), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_ROW_STRIDE, INT64_MAX / 2), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("overflow");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_ROW_STRIDE, H * D), FLASHATTN_SUCCESS);

    /* An output layout that overlaps itself. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_O_HEAD_STRIDE, D / 2), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("O");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_O_HEAD_STRIDE, D), FLASHATTN_SUCCESS);

    /* Variable length needs its totals; totals must fit the batch. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_VARLEN, 1), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("TOTAL_Q");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, SQ + 1), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, SK), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT); /* batch is 1 */
    assert_message_mentions("TOTAL_Q");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, SQ), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_VARLEN, 0), FLASHATTN_SUCCESS);

    /* fp8 (since 0.3): the CPU backend runs it, writing O as bf16 unless told otherwise
     * (tests/numerics/test_fp8.c checks the numbers). */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP8_E4M3), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    {
        int64_t out_dtype = 0;
        assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, &out_dtype), FLASHATTN_SUCCESS);
        assert_int_equal(out_dtype, FLASHATTN_DTYPE_BF16);
    }
    flashattn_plan_destroy(plan);
}

static int gpu_present(void) {
    int32_t count = -1;
    assert_status(flashattn_device_count(&count), FLASHATTN_SUCCESS);
    assert_true(count >= 0);
    return count > 0;
}

static void test_backend_choice(void **state) {
    (void)state;
    flashattn_plan_t *plan = basic_plan();
    /* Forced GPU generations: not supported without a device (or without a build of them). */
    if (!gpu_present()) {
        const flashattn_backend_t gpus[] = {FLASHATTN_BACKEND_FA1, FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA3};
        const char *names[] = {"fa1", "fa2", "fa3"};
        for (int i = 0; i < 3; ++i) {
            assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, gpus[i]), FLASHATTN_SUCCESS);
            assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_NOT_SUPPORTED);
            assert_message_mentions(names[i]);
        }
        /* Auto lands on the CPU and says why. */
        assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_AUTO), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
        flashattn_backend_t backend;
        const char *reason = NULL;
        assert_status(flashattn_plan_get_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
        assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
        /* "built without CUDA" style reasons, or the device layer's ("no NVIDIA driver found",
         * "no CUDA device found", ...) where CUDA is built in. */
        assert_true(strstr(reason, "CUDA") != NULL || strstr(reason, "NVIDIA") != NULL);
    }
    /* The environment override applies to auto only, and a bad value is named. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_AUTO), FLASHATTN_SUCCESS);
    setenv("FLASHATTN_BACKEND", "tpu", 1);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("FLASHATTN_BACKEND");
    setenv("FLASHATTN_BACKEND", "cpu", 1);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    flashattn_backend_t backend;
    assert_status(flashattn_plan_get_backend(plan, &backend, NULL), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
    unsetenv("FLASHATTN_BACKEND");
    assert_status(flashattn_plan_get_backend(plan, NULL, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_backend(NULL, &backend, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_workspace_size(plan, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_get_workspace_size(NULL, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    flashattn_plan_destroy(plan);
}

static void test_execute_errors(void **state) {
    (void)state;
    flashattn_plan_t *plan = basic_plan();
    buffers *b = make_buffers(NULL);
    /* Before finalize. */
    assert_status(execute(plan, b), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("finalize");
    assert_outputs_untouched(b);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    free_buffers(b);
    b = make_buffers(plan);

    assert_status(flashattn_plan_execute(NULL, b->q, b->k, b->v, b->o, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_plan_execute(plan, NULL, b->k, b->v, b->o, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("q");
    assert_status(flashattn_plan_execute(plan, b->q, NULL, b->v, b->o, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("k");
    assert_status(flashattn_plan_execute(plan, b->q, b->k, NULL, b->o, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("v");
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, NULL, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("o");
    assert_outputs_untouched(b);

    /* Outputs overlapping inputs or each other. */
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->q, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("overlaps");
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, (float *)b->v + 3, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("lse");
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, b->o + 8, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_outputs_untouched(b);

    /* Workspace too small, when the plan needs one. */
    if (b->workspace_bytes > 0) {
        assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, b->lse, b->workspace, b->workspace_bytes - 1, NULL),
                      FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE);
        assert_message_mentions("workspace");
        assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, b->lse, NULL, b->workspace_bytes, NULL),
                      FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("workspace");
        assert_outputs_untouched(b);
    }
    /* The varlen entry point on a fixed-length plan. */
    const int32_t cu[3] = {0, 2, 5};
    assert_status(flashattn_plan_execute_varlen(plan, b->q, b->k, b->v, b->o, b->lse, cu, cu, b->workspace,
                                                b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("VARLEN");
    assert_outputs_untouched(b);
    /* And the good call still works. */
    assert_status(execute(plan, b), FLASHATTN_SUCCESS);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_varlen_errors(void **state) {
    (void)state;
    /* batch 2, sequences of at most SQ queries and SK keys, packed. */
    flashattn_plan_t *plan = basic_plan();
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_VARLEN, 1), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, TQ), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, TK), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    buffers *b = make_buffers(plan);
    const int32_t good_q[3] = {0, 3, 8}, good_k[3] = {0, 7, 10};
    assert_status(flashattn_plan_execute(plan, b->q, b->k, b->v, b->o, b->lse, b->workspace, b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("varlen");
    for (size_t i = 0; i < NUM_BAD_CU_SEQLENS; ++i) {
        const bad_cu_seqlens *bad = &bad_cu_seqlens_table[i];
        assert_status(flashattn_plan_execute_varlen(plan, b->q, b->k, b->v, b->o, b->lse, bad->q, bad->k, b->workspace,
                                                    b->workspace_bytes, NULL),
                      FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions(bad->word);
        assert_outputs_untouched(b);
    }
    assert_status(flashattn_plan_execute_varlen(plan, b->q, b->k, b->v, b->o, b->lse, NULL, good_k, b->workspace,
                                                b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("cu_seqlens_q");
    assert_status(flashattn_plan_execute_varlen(plan, b->q, b->k, b->v, b->o, b->lse, good_q, NULL, b->workspace,
                                                b->workspace_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("cu_seqlens_k");
    assert_outputs_untouched(b);
    assert_status(flashattn_plan_execute_varlen(plan, b->q, b->k, b->v, b->o, b->lse, good_q, good_k, b->workspace,
                                                b->workspace_bytes, NULL),
                  FLASHATTN_SUCCESS);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_errors_and_info(void **state) {
    (void)state;
    const flashattn_status_t all[] = {FLASHATTN_SUCCESS, FLASHATTN_ERROR_INVALID_ARGUMENT, FLASHATTN_ERROR_NOT_SUPPORTED,
                                      FLASHATTN_ERROR_INVALID_STATE, FLASHATTN_ERROR_ALLOCATION, FLASHATTN_ERROR_DEVICE,
                                      FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE, FLASHATTN_ERROR_INTERNAL};
    for (size_t i = 0; i < 8; ++i) {
        assert_int_equal(all[i], (int)i); /* pinned values */
        assert_non_null(flashattn_status_string(all[i]));
        for (size_t j = 0; j < i; ++j) assert_string_not_equal(flashattn_status_string(all[i]), flashattn_status_string(all[j]));
    }
    assert_non_null(flashattn_status_string((flashattn_status_t)1234));

    assert_status(flashattn_plan_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    const size_t length = strlen(flashattn_last_error());
    char small[8];
    assert_int_equal(flashattn_last_error_copy(small, sizeof small), length);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, flashattn_last_error(), sizeof small - 1);
    assert_int_equal(flashattn_last_error_copy(NULL, 0), length);

    assert_int_equal(flashattn_version(), FLASHATTN_VERSION);
    assert_string_equal(flashattn_version_string(), FLASHATTN_VERSION_STRING);
    assert_non_null(strstr(flashattn_build_info(), "cuda="));
    assert_non_null(strstr(flashattn_build_info(), "backends=cpu"));

    assert_status(flashattn_device_count(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    int32_t major = -1, minor = -1;
    assert_status(flashattn_device_compute_capability(0, NULL, &minor), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_device_compute_capability(-1, &major, &minor), FLASHATTN_ERROR_INVALID_ARGUMENT);
    if (gpu_present()) {
        assert_status(flashattn_device_compute_capability(0, &major, &minor), FLASHATTN_SUCCESS);
        assert_true(major >= 3);
    } else {
        assert_status(flashattn_device_compute_capability(0, &major, &minor), FLASHATTN_ERROR_NOT_SUPPORTED);
        assert_int_equal(major, -1); /* nothing written on error */
    }
}

/* The last error is per thread. */
static void *fail_in_thread(void *arg) {
    (void)arg;
    flashattn_plan_set_i64(NULL, FLASHATTN_I64_BATCH, 1);
    return NULL;
}

static flashattn_status_t execute_buffers(const flashattn_plan_t *plan, void *b) { return execute(plan, b); }

static void test_threads(void **state) {
    (void)state;
    assert_status(flashattn_plan_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    char mine[256];
    flashattn_last_error_copy(mine, sizeof mine);
    pthread_t thread;
    assert_int_equal(pthread_create(&thread, NULL, fail_in_thread, NULL), 0);
    pthread_join(thread, NULL);
    assert_string_equal(flashattn_last_error(), mine);

    flashattn_plan_t *plan = basic_plan();
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, 1), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    buffers *expected = make_buffers(plan);
    assert_status(execute(plan, expected), FLASHATTN_SUCCESS);
    enum { N = 4 };
    buffers *bufs[N];
    for (int i = 0; i < N; ++i) bufs[i] = make_buffers(plan);
    /* A finalized plan executed from several threads at once, each with its own workspace. */
    run_in_threads(plan, execute_buffers, (void *const *)bufs, N, 20);
    for (int i = 0; i < N; ++i) {
        assert_memory_equal(bufs[i]->o, expected->o, sizeof expected->o);
        assert_memory_equal(bufs[i]->lse, expected->lse, sizeof expected->lse);
        free_buffers(bufs[i]);
    }
    free_buffers(expected);
    flashattn_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),       cmocka_unit_test(test_setters_and_getters),
        cmocka_unit_test(test_resolved_values), cmocka_unit_test(test_finalize_errors),
        cmocka_unit_test(test_backend_choice),  cmocka_unit_test(test_execute_errors),
        cmocka_unit_test(test_varlen_errors),   cmocka_unit_test(test_errors_and_info),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
