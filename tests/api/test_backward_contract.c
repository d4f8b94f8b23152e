/* The backward pass's C API contract (flashattn_plan_execute_backward, _varlen,
 * flashattn_plan_get_backward_backend, flashattn_plan_get_backward_workspace_size and the keys
 * FLASHATTN_I64_DETERMINISTIC, FLASHATTN_I64_DO_* ... DV_*_STRIDE): every bad input -> the exact
 * status, a message naming the argument, and nothing written (every tensor compared byte for byte
 * with its state before the call). Runs on the CPU backend (forced); the numerics are in
 * tests/numerics/test_backward.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "test_contract.h"
#include "test_runner.h"

#define DV 24

static int ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The last error's message must name `word` as a whole word ("q" is not found in "dq"). */
static void assert_message_names(const char *word) {
    const char *msg = flashattn_last_error(), *at = msg;
    const size_t n = strlen(word);
    while ((at = strstr(at, word)) != NULL) {
        if ((at == msg || !ident_char(at[-1])) && !ident_char(at[n])) return;
        ++at;
    }
    fail_msg("message '%s' does not name '%s'", msg, word);
}

static flashattn_plan_t *basic_plan(int varlen) {
    static const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, B},      {FLASHATTN_I64_SEQLEN_Q, SQ},  {FLASHATTN_I64_SEQLEN_K, SK},
        {FLASHATTN_I64_HEADS_Q, H},    {FLASHATTN_I64_HEADS_KV, HKV}, {FLASHATTN_I64_HEAD_DIM, D},
        {FLASHATTN_I64_HEAD_DIM_V, DV}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_CAUSAL, 1},
        {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
    };
    static const test_key_value varlen_keys[] = {
        {FLASHATTN_I64_VARLEN, 1}, {FLASHATTN_I64_TOTAL_Q, TQ}, {FLASHATTN_I64_TOTAL_K, TK}};
    flashattn_plan_t *plan = plan_with_keys(keys, sizeof keys / sizeof keys[0]);
    if (varlen) set_keys_or_fail(plan, varlen_keys, sizeof varlen_keys / sizeof varlen_keys[0]);
    return plan;
}

static const int32_t cu_q[3] = {0, 3, 8}, cu_k[3] = {0, 7, 10};

/* Host tensors of the basic plan (fixed-length sizes, which also hold the packed varlen ones). */
typedef struct {
    float q[B * SQ * H * D], k[B * SK * HKV * D], v[B * SK * HKV * DV];
    float o[B * SQ * H * DV], dout[B * SQ * H * DV], lse[B * H * SQ];
    float dq[B * SQ * H * D], dk[B * SK * HKV * D], dv[B * SK * HKV * DV];
    unsigned char *workspace;
    size_t workspace_bytes;
} tensors;

typedef struct {
    tensors t, before; /* `before`: a copy taken by snapshot() */
} buffers;

/* Random inputs, the forward's O and LSE when the plan is finalized, poisoned gradients, a
 * backward workspace of the plan's size. */
static buffers *make_buffers(const flashattn_plan_t *plan, int varlen) {
    buffers *b = calloc(1, sizeof *b);
    tensors *t;
    size_t i, fwd_bytes = 0;
    void *fwd_ws = NULL;
    assert_non_null(b);
    t = &b->t;
    srand(4321);
    for (i = 0; i < sizeof t->q / sizeof *t->q; ++i) t->q[i] = (float)((double)rand() / RAND_MAX - 0.5);
    for (i = 0; i < sizeof t->k / sizeof *t->k; ++i) t->k[i] = (float)((double)rand() / RAND_MAX - 0.5);
    for (i = 0; i < sizeof t->v / sizeof *t->v; ++i) t->v[i] = (float)((double)rand() / RAND_MAX - 0.5);
    for (i = 0; i < sizeof t->dout / sizeof *t->dout; ++i) t->dout[i] = (float)((double)rand() / RAND_MAX - 0.5);
    memset(t->o, 0, sizeof t->o);
    memset(t->lse, 0, sizeof t->lse);
    memset(t->dq, 0x7f, sizeof t->dq);
    memset(t->dk, 0x7f, sizeof t->dk);
    memset(t->dv, 0x7f, sizeof t->dv);
    if (plan) {
        assert_status(flashattn_plan_get_workspace_size(plan, &fwd_bytes), FLASHATTN_SUCCESS);
        fwd_ws = fwd_bytes ? aligned_alloc(256, (fwd_bytes + 255) / 256 * 256) : NULL;
        if (varlen)
            assert_status(flashattn_plan_execute_varlen(plan, t->q, t->k, t->v, t->o, t->lse, cu_q, cu_k, fwd_ws,
                                                        fwd_bytes, NULL),
                          FLASHATTN_SUCCESS);
        else
            assert_status(flashattn_plan_execute(plan, t->q, t->k, t->v, t->o, t->lse, fwd_ws, fwd_bytes, NULL),
                          FLASHATTN_SUCCESS);
        free(fwd_ws);
        assert_status(flashattn_plan_get_backward_workspace_size(plan, &t->workspace_bytes), FLASHATTN_SUCCESS);
    }
    /* 256 spare bytes so that a misaligned pointer with the full size stays inside the buffer. */
    t->workspace = aligned_alloc(256, (t->workspace_bytes + 256 + 255) / 256 * 256);
    assert_non_null(t->workspace);
    memset(t->workspace, 0, t->workspace_bytes + 256);
    b->before = b->t;
    return b;
}

static void snapshot(buffers *b) {
    unsigned char *ws = b->before.workspace;
    b->before = b->t;
    b->before.workspace = ws;
}

static void free_buffers(buffers *b) {
    free(b->t.workspace);
    free(b);
}

/* The six inputs as they were at the last snapshot. */
static void assert_inputs_untouched(const buffers *b) {
    assert_memory_equal(b->t.q, b->before.q, sizeof b->t.q);
    assert_memory_equal(b->t.k, b->before.k, sizeof b->t.k);
    assert_memory_equal(b->t.v, b->before.v, sizeof b->t.v);
    assert_memory_equal(b->t.o, b->before.o, sizeof b->t.o);
    assert_memory_equal(b->t.dout, b->before.dout, sizeof b->t.dout);
    assert_memory_equal(b->t.lse, b->before.lse, sizeof b->t.lse);
}

/* Nothing written: every tensor as it was at the last snapshot (the workspace is scratch). */
static void assert_untouched(const buffers *b) {
    assert_inputs_untouched(b);
    assert_memory_equal(b->t.dq, b->before.dq, sizeof b->t.dq);
    assert_memory_equal(b->t.dk, b->before.dk, sizeof b->t.dk);
    assert_memory_equal(b->t.dv, b->before.dv, sizeof b->t.dv);
}

/* The nine tensor arguments in the order of the signature. */
enum { A_Q, A_K, A_V, A_O, A_DOUT, A_LSE, A_DQ, A_DK, A_DV, A_COUNT };
static const char *const arg_names[A_COUNT] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};

static void default_args(buffers *b, void *args[A_COUNT]) {
    args[A_Q] = b->t.q;
    args[A_K] = b->t.k;
    args[A_V] = b->t.v;
    args[A_O] = b->t.o;
    args[A_DOUT] = b->t.dout;
    args[A_LSE] = b->t.lse;
    args[A_DQ] = b->t.dq;
    args[A_DK] = b->t.dk;
    args[A_DV] = b->t.dv;
}

static flashattn_status_t backward_with(const flashattn_plan_t *plan, void *const args[A_COUNT], int varlen,
                                        void *workspace, size_t workspace_bytes) {
    if (varlen)
        return flashattn_plan_execute_backward_varlen(plan, args[A_Q], args[A_K], args[A_V], args[A_O], args[A_DOUT],
                                                      (const float *)args[A_LSE], args[A_DQ], args[A_DK], args[A_DV],
                                                      cu_q, cu_k, workspace, workspace_bytes, NULL);
    return flashattn_plan_execute_backward(plan, args[A_Q], args[A_K], args[A_V], args[A_O], args[A_DOUT],
                                           (const float *)args[A_LSE], args[A_DQ], args[A_DK], args[A_DV], workspace,
                                           workspace_bytes, NULL);
}

static flashattn_status_t backward(const flashattn_plan_t *plan, buffers *b, int varlen) {
    void *args[A_COUNT];
    default_args(b, args);
    return backward_with(plan, args, varlen, b->t.workspace, b->t.workspace_bytes);
}

/* ------------------------------------------------------------------------------------------------ */

static void test_backward_runs(void **state) {
    flashattn_plan_t *plan = basic_plan(0);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    float first_dq[B * SQ * H * D], first_dk[B * SK * HKV * D], first_dv[B * SK * HKV * DV];
    buffers *b;
    size_t i;
    (void)state;
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
    assert_non_null(reason);
    assert_true(strlen(reason) > 0);
    backend = FLASHATTN_BACKEND_AUTO;
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, NULL), FLASHATTN_SUCCESS); /* reason optional */
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);

    b = make_buffers(plan, 0);
    assert_status(backward(plan, b, 0), FLASHATTN_SUCCESS);
    for (i = 0; i < sizeof b->t.dq / sizeof *b->t.dq; ++i) assert_true(isfinite(b->t.dq[i]));
    for (i = 0; i < sizeof b->t.dk / sizeof *b->t.dk; ++i) assert_true(isfinite(b->t.dk[i]));
    for (i = 0; i < sizeof b->t.dv / sizeof *b->t.dv; ++i) assert_true(isfinite(b->t.dv[i]));
    assert_inputs_untouched(b); /* the inputs are read only */
    /* The CPU backend is always deterministic (DETERMINISTIC is 0 here): outputs are overwritten,
     * not accumulated into, and a second run is bitwise identical. */
    memcpy(first_dq, b->t.dq, sizeof first_dq);
    memcpy(first_dk, b->t.dk, sizeof first_dk);
    memcpy(first_dv, b->t.dv, sizeof first_dv);
    memset(b->t.dq, 0x55, sizeof b->t.dq);
    memset(b->t.dk, 0x55, sizeof b->t.dk);
    memset(b->t.dv, 0x55, sizeof b->t.dv);
    memset(b->t.workspace, 0xff, b->t.workspace_bytes);
    assert_status(backward(plan, b, 0), FLASHATTN_SUCCESS);
    assert_memory_equal(first_dq, b->t.dq, sizeof first_dq);
    assert_memory_equal(first_dk, b->t.dk, sizeof first_dk);
    assert_memory_equal(first_dv, b->t.dv, sizeof first_dv);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_backward_null_arguments(void **state) {
    int varlen, a;
    (void)state;
    for (varlen = 0; varlen <= 1; ++varlen) {
        flashattn_plan_t *plan = basic_plan(varlen);
        buffers *b;
        void *args[A_COUNT];
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
        b = make_buffers(plan, varlen);
        default_args(b, args);
        assert_status(backward_with(NULL, args, varlen, b->t.workspace, b->t.workspace_bytes),
                      FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_names("plan");
        assert_untouched(b);
        for (a = 0; a < A_COUNT; ++a) {
            default_args(b, args);
            args[a] = NULL;
            assert_status(backward_with(plan, args, varlen, b->t.workspace, b->t.workspace_bytes),
                          FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_names(arg_names[a]);
            assert_untouched(b);
        }
        if (varlen) {
            default_args(b, args);
            assert_status(flashattn_plan_execute_backward_varlen(plan, b->t.q, b->t.k, b->t.v, b->t.o, b->t.dout, b->t.lse,
                                                                 b->t.dq, b->t.dk, b->t.dv, NULL, cu_k, b->t.workspace,
                                                                 b->t.workspace_bytes, NULL),
                          FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_names("cu_seqlens_q");
            assert_status(flashattn_plan_execute_backward_varlen(plan, b->t.q, b->t.k, b->t.v, b->t.o, b->t.dout, b->t.lse,
                                                                 b->t.dq, b->t.dk, b->t.dv, cu_q, NULL, b->t.workspace,
                                                                 b->t.workspace_bytes, NULL),
                          FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_names("cu_seqlens_k");
            assert_untouched(b);
        }
        /* And the good call runs. */
        assert_status(backward(plan, b, varlen), FLASHATTN_SUCCESS);
        free_buffers(b);
        flashattn_plan_destroy(plan);
    }
}

static void test_backward_overlaps(void **state) {
    flashattn_plan_t *plan = basic_plan(0);
    buffers *b;
    void *args[A_COUNT];
    size_t i;
    /* A gradient placed over an input or over another gradient: {output, where, name in message}. */
    struct {
        int arg;
        int over;
        size_t offset; /* floats into `over` */
    } bad[] = {
        {A_DK, A_DQ, 4},   /* dk starts inside dq */
        {A_DQ, A_DK, 0},   /* dq == dk */
        {A_DV, A_DK, 100}, /* dv starts inside dk */
        {A_DQ, A_Q, 0},    /* dq over q (in place) */
        {A_DK, A_K, 8},
        {A_DV, A_DOUT, 0}, /* dv over dout */
        {A_DV, A_V, 16},
        {A_DQ, A_O, 0},
        {A_DK, A_LSE, 2},  /* dk over the forward's lse */
        {A_DQ, A_DOUT, 40},
    };
    (void)state;
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    b = make_buffers(plan, 0);
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        default_args(b, args);
        args[bad[i].arg] = (float *)args[bad[i].over] + bad[i].offset;
        assert_status(backward_with(plan, args, 0, b->t.workspace, b->t.workspace_bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("overlaps");
        assert_untouched(b);
    }
    /* The workspace over a tensor. */
    if (b->t.workspace_bytes > 0) {
        unsigned char *big = aligned_alloc(256, (b->t.workspace_bytes + sizeof b->t.dq + 511) / 256 * 256);
        assert_non_null(big);
        default_args(b, args);
        args[A_DQ] = big; /* dq inside the workspace */
        memset(big, 0x7f, sizeof b->t.dq);
        assert_status(backward_with(plan, args, 0, big, b->t.workspace_bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_names("workspace");
        assert_untouched(b);
        free(big);
    } else {
        print_message("the backward needs no workspace here: its overlap rule is not exercised\n");
    }
    assert_status(backward(plan, b, 0), FLASHATTN_SUCCESS);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_backward_workspace(void **state) {
    flashattn_plan_t *plan = basic_plan(0);
    buffers *b;
    void *args[A_COUNT];
    size_t need;
    (void)state;
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    b = make_buffers(plan, 0);
    need = b->t.workspace_bytes;
    default_args(b, args);
    if (need == 0) {
        print_message("the backward of this plan needs no workspace: only NULL/0 is checked\n");
        assert_status(backward_with(plan, args, 0, NULL, 0), FLASHATTN_SUCCESS);
    } else {
        /* The CPU backend's backward needs scratch per thread: a size the caller can get wrong. */
        assert_status(backward_with(plan, args, 0, b->t.workspace, need - 1), FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE);
        assert_message_names("workspace_bytes");
        assert_untouched(b);
        assert_status(backward_with(plan, args, 0, NULL, 0), FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE);
        assert_untouched(b);
        assert_status(backward_with(plan, args, 0, NULL, need), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_names("workspace");
        assert_untouched(b);
        assert_status(backward_with(plan, args, 0, b->t.workspace + 16, need), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_names("workspace");
        assert_untouched(b);
        /* More than needed is fine. */
        assert_status(backward_with(plan, args, 0, b->t.workspace, need + 256), FLASHATTN_SUCCESS);
    }
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_backward_state(void **state) {
    flashattn_plan_t *plan = basic_plan(0);
    buffers *b = make_buffers(NULL, 0);
    flashattn_backend_t backend = (flashattn_backend_t)99;
    size_t bytes = 12345;
    const char *reason = "untouched";
    (void)state;
    /* Before finalize: every backward call says so and writes nothing. */
    assert_status(backward(plan, b, 0), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("finalize");
    assert_untouched(b);
    assert_status(flashattn_plan_get_backward_workspace_size(plan, &bytes), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("finalize");
    assert_int_equal(bytes, 12345);
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, &reason), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("finalize");
    assert_int_equal(backend, 99);
    assert_string_equal(reason, "untouched");
    /* NULL plan and NULL out-pointers. */
    assert_status(flashattn_plan_get_backward_workspace_size(NULL, &bytes), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_names("plan");
    assert_status(flashattn_plan_get_backward_backend(NULL, &backend, &reason), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_names("plan");
    assert_int_equal(bytes, 12345);
    assert_int_equal(backend, 99);

    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_backward_workspace_size(plan, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_names("bytes");
    assert_status(flashattn_plan_get_backward_backend(plan, NULL, &reason), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_names("backend");
    assert_string_equal(reason, "untouched");
    assert_status(flashattn_plan_get_backward_workspace_size(plan, &bytes), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
    free_buffers(b);
    b = make_buffers(plan, 0);
    assert_status(backward(plan, b, 0), FLASHATTN_SUCCESS);
    snapshot(b);

    /* A setter un-finalizes the plan: back to INVALID_STATE until the next finalize. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, 1), FLASHATTN_SUCCESS);
    bytes = 12345;
    assert_status(flashattn_plan_get_backward_workspace_size(plan, &bytes), FLASHATTN_ERROR_INVALID_STATE);
    assert_int_equal(bytes, 12345);
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, NULL), FLASHATTN_ERROR_INVALID_STATE);
    assert_status(backward(plan, b, 0), FLASHATTN_ERROR_INVALID_STATE);
    assert_untouched(b);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(backward(plan, b, 0), FLASHATTN_SUCCESS);
    free_buffers(b);
    flashattn_plan_destroy(plan);
}

static void test_backward_varlen_state(void **state) {
    flashattn_plan_t *fixed = basic_plan(0), *varlen = basic_plan(1);
    buffers *b;
    size_t i;
    (void)state;
    assert_status(flashattn_plan_finalize(fixed), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(varlen), FLASHATTN_SUCCESS);
    /* The varlen entry point on a fixed-length plan, and the fixed one on a varlen plan. */
    b = make_buffers(fixed, 0);
    assert_status(backward(fixed, b, 1), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("VARLEN");
    assert_untouched(b);
    free_buffers(b);
    b = make_buffers(varlen, 1);
    assert_status(backward(varlen, b, 0), FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("VARLEN");
    assert_untouched(b);
    /* Bad cu_seqlens: the CPU backend checks them before writing anything. */
    for (i = 0; i < NUM_BAD_CU_SEQLENS; ++i) {
        const bad_cu_seqlens *bad = &bad_cu_seqlens_table[i];
        assert_status(flashattn_plan_execute_backward_varlen(varlen, b->t.q, b->t.k, b->t.v, b->t.o, b->t.dout, b->t.lse,
                                                             b->t.dq, b->t.dk, b->t.dv, bad->q, bad->k,
                                                             b->t.workspace, b->t.workspace_bytes, NULL),
                      FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions(bad->word);
        assert_untouched(b);
    }
    assert_status(backward(varlen, b, 1), FLASHATTN_SUCCESS);
    /* Packed rows beyond total_q / total_k are not part of the tensors: untouched. */
    for (i = (size_t)TQ * H * D; i < sizeof b->t.dq / sizeof *b->t.dq; ++i)
        assert_memory_equal(&b->t.dq[i], &b->before.dq[i], sizeof(float));
    for (i = (size_t)TK * HKV * D; i < sizeof b->t.dk / sizeof *b->t.dk; ++i)
        assert_memory_equal(&b->t.dk[i], &b->before.dk[i], sizeof(float));
    for (i = (size_t)TK * HKV * DV; i < sizeof b->t.dv / sizeof *b->t.dv; ++i)
        assert_memory_equal(&b->t.dv[i], &b->before.dv[i], sizeof(float));
    for (i = 0; i < (size_t)TQ * H * D; ++i) assert_true(isfinite(b->t.dq[i]));
    free_buffers(b);
    flashattn_plan_destroy(fixed);
    flashattn_plan_destroy(varlen);
}

static void test_backward_keys(void **state) {
    static const struct {
        flashattn_i64_param_t key;
        const char *name;
        int64_t resolved; /* after finalize with defaults */
    } strides[] = {
        {FLASHATTN_I64_DO_BATCH_STRIDE, "DO_BATCH_STRIDE", SQ * H * DV},
        {FLASHATTN_I64_DO_ROW_STRIDE, "DO_ROW_STRIDE", H * DV},
        {FLASHATTN_I64_DO_HEAD_STRIDE, "DO_HEAD_STRIDE", DV},
        {FLASHATTN_I64_DQ_BATCH_STRIDE, "DQ_BATCH_STRIDE", SQ * H * D},
        {FLASHATTN_I64_DQ_ROW_STRIDE, "DQ_ROW_STRIDE", H * D},
        {FLASHATTN_I64_DQ_HEAD_STRIDE, "DQ_HEAD_STRIDE", D},
        {FLASHATTN_I64_DK_BATCH_STRIDE, "DK_BATCH_STRIDE", SK * HKV * D},
        {FLASHATTN_I64_DK_ROW_STRIDE, "DK_ROW_STRIDE", HKV * D},
        {FLASHATTN_I64_DK_HEAD_STRIDE, "DK_HEAD_STRIDE", D},
        {FLASHATTN_I64_DV_BATCH_STRIDE, "DV_BATCH_STRIDE", SK * HKV * DV},
        {FLASHATTN_I64_DV_ROW_STRIDE, "DV_ROW_STRIDE", HKV * DV},
        {FLASHATTN_I64_DV_HEAD_STRIDE, "DV_HEAD_STRIDE", DV},
    };
    const size_t n = sizeof strides / sizeof strides[0];
    flashattn_plan_t *plan = basic_plan(0);
    int64_t value = 0, before;
    size_t i;
    (void)state;
    /* The pinned values. */
    assert_int_equal(FLASHATTN_I64_DETERMINISTIC, 32);
    for (i = 0; i < n; ++i) assert_int_equal(strides[i].key, 33 + (int)i);
    /* Defaults before finalize: -1 (stride left to default), deterministic 0. */
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DETERMINISTIC, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 0);
    for (i = 0; i < n; ++i) {
        assert_status(flashattn_plan_get_i64(plan, strides[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, -1);
    }
    /* After finalize: the contiguous layouts of O, Q, K, V. */
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DETERMINISTIC, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 0);
    for (i = 0; i < n; ++i) {
        assert_status(flashattn_plan_get_i64(plan, strides[i].key, &value), FLASHATTN_SUCCESS);
        if (value != strides[i].resolved)
            fail_msg("%s resolves to %lld, expected %lld", strides[i].name, (long long)value, (long long)strides[i].resolved);
    }
    /* Bad values are rejected, named, and change nothing. */
    for (i = 0; i < n; ++i) {
        const int64_t bad_values[2] = {0, -3};
        int j;
        assert_status(flashattn_plan_get_i64(plan, strides[i].key, &before), FLASHATTN_SUCCESS);
        for (j = 0; j < 2; ++j) {
            assert_status(flashattn_plan_set_i64(plan, strides[i].key, bad_values[j]), FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_mentions(strides[i].name);
            assert_status(flashattn_plan_get_i64(plan, strides[i].key, &value), FLASHATTN_SUCCESS);
            assert_int_equal(value, before);
        }
    }
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, 2), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("DETERMINISTIC");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, -1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("DETERMINISTIC");
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DETERMINISTIC, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 0);
    /* Set values round-trip before finalize and stay after it. */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, 1), FLASHATTN_SUCCESS);
    for (i = 0; i < n; ++i) {
        const int64_t padded = strides[i].resolved + (strides[i].name[3] == 'H' ? 8 : strides[i].name[3] == 'R' ? 64 : 4096);
        assert_status(flashattn_plan_set_i64(plan, strides[i].key, padded), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_get_i64(plan, strides[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, padded);
    }
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DETERMINISTIC, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 1);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_i64(plan, FLASHATTN_I64_DETERMINISTIC, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 1);
    for (i = 0; i < n; ++i) {
        const int64_t padded = strides[i].resolved + (strides[i].name[3] == 'H' ? 8 : strides[i].name[3] == 'R' ? 64 : 4096);
        assert_status(flashattn_plan_get_i64(plan, strides[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, padded);
    }
    flashattn_plan_destroy(plan);
}

/* A gradient layout whose strides make it overlap itself cannot be written by parallel threads:
 * finalize rejects it and names the tensor. */
static void test_backward_self_overlapping_layouts(void **state) {
    static const struct {
        flashattn_i64_param_t key;
        int64_t value;
        const char *tensor;
    } bad[] = {
        {FLASHATTN_I64_DQ_HEAD_STRIDE, D / 2, "dQ"},
        {FLASHATTN_I64_DK_ROW_STRIDE, D, "dK"}, /* rows over the second head */
        {FLASHATTN_I64_DV_HEAD_STRIDE, DV - 8, "dV"},
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        flashattn_plan_t *plan = basic_plan(0);
        assert_status(flashattn_plan_set_i64(plan, bad[i].key, bad[i].value), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions(bad[i].tensor);
        flashattn_plan_destroy(plan);
    }
}

static void test_backward_backend_choice(void **state) {
    int32_t count = -1;
    flashattn_plan_t *plan = basic_plan(0);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    (void)state;
    assert_status(flashattn_device_count(&count), FLASHATTN_SUCCESS);
    if (count > 0) { /* the GPU choice belongs to tests/gpu */
        flashattn_plan_destroy(plan);
        skip();
        return;
    }
    /* Auto on a machine without a GPU: both passes on the CPU, with a reason. (A plan forced to
     * FA1/FA2/FA3 does not finalize here, so their backward cannot be asked about.) */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_AUTO), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_CPU);
    assert_non_null(reason);
    assert_true(strlen(reason) > 0);
    flashattn_plan_destroy(plan);
}

static flashattn_status_t backward_fixed(const flashattn_plan_t *plan, void *b) { return backward(plan, b, 0); }

/* One finalized plan, backward from several threads at once, each with its own workspace. */
static void test_backward_threads(void **state) {
    enum { N = 4 };
    flashattn_plan_t *plan = basic_plan(0);
    buffers *expected, *bufs[N];
    int i;
    (void)state;
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    expected = make_buffers(plan, 0);
    assert_status(backward(plan, expected, 0), FLASHATTN_SUCCESS);
    for (i = 0; i < N; ++i) bufs[i] = make_buffers(plan, 0);
    run_in_threads(plan, backward_fixed, (void *const *)bufs, N, 10);
    for (i = 0; i < N; ++i) {
        assert_memory_equal(bufs[i]->t.dq, expected->t.dq, sizeof expected->t.dq);
        assert_memory_equal(bufs[i]->t.dk, expected->t.dk, sizeof expected->t.dk);
        assert_memory_equal(bufs[i]->t.dv, expected->t.dv, sizeof expected->t.dv);
        free_buffers(bufs[i]);
    }
    free_buffers(expected);
    flashattn_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_runs),
        cmocka_unit_test(test_backward_null_arguments),
        cmocka_unit_test(test_backward_overlaps),
        cmocka_unit_test(test_backward_workspace),
        cmocka_unit_test(test_backward_state),
        cmocka_unit_test(test_backward_varlen_state),
        cmocka_unit_test(test_backward_keys),
        cmocka_unit_test(test_backward_self_overlapping_layouts),
        cmocka_unit_test(test_backward_backend_choice),
        cmocka_unit_test(test_backward_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
