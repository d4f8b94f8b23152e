/* The serving API's contract (issue 18): flashattn_args_t, flashattn_plan_execute_args() and the
 * keys 45-59. Every new key's range at the setter, every rule between keys at finalize, every
 * pointer of the call (required, unused, overlapping), the host checks of the page table,
 * seqused_k and rotary positions: each gives the exact status, a message naming the argument, and
 * writes nothing (O, LSE, both caches and seqused_k compared with their snapshots). Runs on the
 * CPU backend (forced). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "test_runner.h"

enum { NB = 2, NSQ = 3, NSK = 12, NH = 4, NHKV = 2, ND = 16, PAGE = 4, MAXP = 3, NPAGES = 8, NEW = 2, ROT = 8 };

/* A paged, appending, rotating fp32 plan on the CPU. */
static flashattn_plan_t *serving_plan(int finalize) {
    static const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, NB},          {FLASHATTN_I64_SEQLEN_Q, NSQ},    {FLASHATTN_I64_SEQLEN_K, NSK},
        {FLASHATTN_I64_HEADS_Q, NH},        {FLASHATTN_I64_HEADS_KV, NHKV},   {FLASHATTN_I64_HEAD_DIM, ND},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
        {FLASHATTN_I64_CAUSAL, 1},          {FLASHATTN_I64_PAGED_KV, 1},      {FLASHATTN_I64_PAGE_SIZE, PAGE},
        {FLASHATTN_I64_NUM_PAGES, NPAGES},  {FLASHATTN_I64_SEQUSED_K, 1},     {FLASHATTN_I64_NEW_KV_ROWS, NEW},
        {FLASHATTN_I64_ROTARY_DIM, ROT},    {FLASHATTN_I64_ROTARY_INTERLEAVED, 1},
    };
    flashattn_plan_t *plan = plan_with_keys(keys, sizeof keys / sizeof keys[0]);
    if (finalize) assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    return plan;
}

/* The call's host buffers and their snapshots. */
typedef struct fixture {
    float q[NB * NSQ * NH * ND], o[NB * NSQ * NH * ND], lse[NB * NH * NSQ];
    float k[NPAGES * PAGE * NHKV * ND], v[NPAGES * PAGE * NHKV * ND];
    float k_new[NB * NEW * NHKV * ND], v_new[NB * NEW * NHKV * ND];
    float cos_t[NSK * ROT / 2], sin_t[NSK * ROT / 2];
    int32_t table[NB * MAXP], seqused[NB], cu[NB + 1];
    float o0[NB * NSQ * NH * ND], lse0[NB * NH * NSQ], k0[NPAGES * PAGE * NHKV * ND], v0[NPAGES * PAGE * NHKV * ND];
    int32_t seqused0[NB];
    unsigned char *ws;
    size_t ws_bytes;
    flashattn_args_t *args;
} fixture;

static void snapshot(fixture *f) {
    memcpy(f->o0, f->o, sizeof f->o);
    memcpy(f->lse0, f->lse, sizeof f->lse);
    memcpy(f->k0, f->k, sizeof f->k);
    memcpy(f->v0, f->v, sizeof f->v);
    memcpy(f->seqused0, f->seqused, sizeof f->seqused);
}

static void assert_nothing_written(const fixture *f) {
    assert_memory_equal(f->o, f->o0, sizeof f->o);
    assert_memory_equal(f->lse, f->lse0, sizeof f->lse);
    assert_memory_equal(f->k, f->k0, sizeof f->k);
    assert_memory_equal(f->v, f->v0, sizeof f->v);
    assert_memory_equal(f->seqused, f->seqused0, sizeof f->seqused);
}

static void set_all(fixture *f) {
    const struct { flashattn_arg_t which; const void *ptr; } all[] = {
        {FLASHATTN_ARG_Q, f->q},           {FLASHATTN_ARG_K, f->k},
        {FLASHATTN_ARG_V, f->v},           {FLASHATTN_ARG_O, f->o},
        {FLASHATTN_ARG_LSE, f->lse},       {FLASHATTN_ARG_PAGE_TABLE, f->table},
        {FLASHATTN_ARG_SEQUSED_K, f->seqused}, {FLASHATTN_ARG_K_NEW, f->k_new},
        {FLASHATTN_ARG_V_NEW, f->v_new},   {FLASHATTN_ARG_ROTARY_COS, f->cos_t},
        {FLASHATTN_ARG_ROTARY_SIN, f->sin_t},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i)
        assert_status(flashattn_args_set(f->args, all[i].which, all[i].ptr), FLASHATTN_SUCCESS);
}

static fixture *make_fixture(const flashattn_plan_t *plan) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    srand(777);
    for (size_t i = 0; i < sizeof f->q / sizeof *f->q; ++i) f->q[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < sizeof f->k / sizeof *f->k; ++i) {
        f->k[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        f->v[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    for (size_t i = 0; i < sizeof f->k_new / sizeof *f->k_new; ++i) {
        f->k_new[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        f->v_new[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }
    for (int p = 0; p < NSK; ++p)
        for (int i = 0; i < ROT / 2; ++i) {
            f->cos_t[p * ROT / 2 + i] = (float)cos(p * 0.1 * (i + 1));
            f->sin_t[p * ROT / 2 + i] = (float)sin(p * 0.1 * (i + 1));
        }
    /* sequence 0: pages 5, 2, 7; sequence 1: pages 0, 3, 6 */
    const int32_t table[NB * MAXP] = {5, 2, 7, 0, 3, 6};
    memcpy(f->table, table, sizeof table);
    f->seqused[0] = 3;
    f->seqused[1] = 7;
    memset(f->o, 0x7f, sizeof f->o);
    memset(f->lse, 0x7f, sizeof f->lse);
    snapshot(f);
    assert_status(flashattn_plan_get_workspace_size(plan, &f->ws_bytes), FLASHATTN_SUCCESS);
    f->ws = f->ws_bytes ? aligned_alloc(256, (f->ws_bytes + 255) / 256 * 256) : NULL;
    assert_status(flashattn_args_create(&f->args), FLASHATTN_SUCCESS);
    set_all(f);
    return f;
}

static void free_fixture(fixture *f) {
    flashattn_args_destroy(f->args);
    free(f->ws);
    free(f);
}

static flashattn_status_t run(const flashattn_plan_t *plan, fixture *f) {
    return flashattn_plan_execute_args(plan, f->args, f->ws, f->ws_bytes, NULL);
}

/* A failing call: the status, the word in its message, nothing written. */
static void expect_failure(const flashattn_plan_t *plan, fixture *f, flashattn_status_t status, const char *word) {
    snapshot(f);
    assert_status(run(plan, f), status);
    assert_message_mentions(word);
    assert_nothing_written(f);
}

/* ------------------------------------------------------------------------------------------ */

static void test_args_object(void **state) {
    (void)state;
    flashattn_args_t *args = NULL;
    const void *ptr = &args;
    int x = 0;
    flashattn_args_destroy(NULL); /* no-op */
    assert_status(flashattn_args_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("args");
    assert_status(flashattn_args_create(&args), FLASHATTN_SUCCESS);
    for (int w = FLASHATTN_ARG_Q; w <= FLASHATTN_ARG_ROTARY_SIN; ++w) { /* all NULL when created */
        assert_status(flashattn_args_get(args, (flashattn_arg_t)w, &ptr), FLASHATTN_SUCCESS);
        assert_null(ptr);
    }
    assert_status(flashattn_args_set(args, FLASHATTN_ARG_PAGE_TABLE, &x), FLASHATTN_SUCCESS);
    assert_status(flashattn_args_get(args, FLASHATTN_ARG_PAGE_TABLE, &ptr), FLASHATTN_SUCCESS);
    assert_ptr_equal(ptr, &x);
    assert_status(flashattn_args_set(args, FLASHATTN_ARG_PAGE_TABLE, NULL), FLASHATTN_SUCCESS); /* clears */
    assert_status(flashattn_args_get(args, FLASHATTN_ARG_PAGE_TABLE, &ptr), FLASHATTN_SUCCESS);
    assert_null(ptr);
    const int bad[] = {0, -1, FLASHATTN_ARG_ROTARY_SIN + 1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        assert_status(flashattn_args_set(args, (flashattn_arg_t)bad[i], &x), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("which");
        assert_status(flashattn_args_get(args, (flashattn_arg_t)bad[i], &ptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("which");
    }
    assert_status(flashattn_args_set(NULL, FLASHATTN_ARG_Q, &x), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("args");
    assert_status(flashattn_args_get(NULL, FLASHATTN_ARG_Q, &ptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_status(flashattn_args_get(args, FLASHATTN_ARG_Q, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("ptr");
    flashattn_args_destroy(args);
}

static void test_keys(void **state) {
    (void)state;
    flashattn_plan_t *plan = NULL;
    int64_t value = 0;
    assert_status(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    /* defaults before finalize: -1 for what finalize derives, 0 (off) otherwise */
    const struct { flashattn_i64_param_t key; int64_t value; } defaults[] = {
        {FLASHATTN_I64_PAGED_KV, 0}, {FLASHATTN_I64_PAGE_SIZE, 0}, {FLASHATTN_I64_NUM_PAGES, 0},
        {FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, -1}, {FLASHATTN_I64_PAGE_TABLE_STRIDE, -1},
        {FLASHATTN_I64_SEQUSED_K, 0}, {FLASHATTN_I64_NEW_KV_ROWS, 0}, {FLASHATTN_I64_K_NEW_BATCH_STRIDE, -1},
        {FLASHATTN_I64_K_NEW_ROW_STRIDE, -1}, {FLASHATTN_I64_K_NEW_HEAD_STRIDE, -1},
        {FLASHATTN_I64_V_NEW_BATCH_STRIDE, -1}, {FLASHATTN_I64_V_NEW_ROW_STRIDE, -1},
        {FLASHATTN_I64_V_NEW_HEAD_STRIDE, -1}, {FLASHATTN_I64_ROTARY_DIM, 0}, {FLASHATTN_I64_ROTARY_INTERLEAVED, 0},
    };
    for (size_t i = 0; i < sizeof defaults / sizeof *defaults; ++i) {
        assert_status(flashattn_plan_get_i64(plan, defaults[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, defaults[i].value);
    }
    const struct { flashattn_i64_param_t key; int64_t value; } sets[] = {
        {FLASHATTN_I64_PAGED_KV, 1}, {FLASHATTN_I64_PAGE_SIZE, 1}, {FLASHATTN_I64_NUM_PAGES, 100},
        {FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, 7}, {FLASHATTN_I64_PAGE_TABLE_STRIDE, 9}, {FLASHATTN_I64_SEQUSED_K, 1},
        {FLASHATTN_I64_NEW_KV_ROWS, 3}, {FLASHATTN_I64_K_NEW_BATCH_STRIDE, 500}, {FLASHATTN_I64_K_NEW_ROW_STRIDE, 50},
        {FLASHATTN_I64_K_NEW_HEAD_STRIDE, 20}, {FLASHATTN_I64_V_NEW_BATCH_STRIDE, 600},
        {FLASHATTN_I64_V_NEW_ROW_STRIDE, 60}, {FLASHATTN_I64_V_NEW_HEAD_STRIDE, 24}, {FLASHATTN_I64_ROTARY_DIM, 6},
        {FLASHATTN_I64_ROTARY_INTERLEAVED, 1},
    };
    for (size_t i = 0; i < sizeof sets / sizeof *sets; ++i) {
        assert_status(flashattn_plan_set_i64(plan, sets[i].key, sets[i].value), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_get_i64(plan, sets[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, sets[i].value);
    }
    const struct { flashattn_i64_param_t key; int64_t value; const char *word; } bad[] = {
        {FLASHATTN_I64_PAGED_KV, 2, "PAGED_KV"},         {FLASHATTN_I64_PAGE_SIZE, 0, "PAGE_SIZE"},
        {FLASHATTN_I64_PAGE_SIZE, -16, "PAGE_SIZE"},     {FLASHATTN_I64_NUM_PAGES, 0, "NUM_PAGES"},
        {FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, 0, "MAX_PAGES"}, {FLASHATTN_I64_PAGE_TABLE_STRIDE, 0, "PAGE_TABLE_STRIDE"},
        {FLASHATTN_I64_SEQUSED_K, 2, "SEQUSED_K"},       {FLASHATTN_I64_NEW_KV_ROWS, -1, "NEW_KV_ROWS"},
        {FLASHATTN_I64_K_NEW_ROW_STRIDE, 0, "K_NEW_ROW_STRIDE"}, {FLASHATTN_I64_V_NEW_HEAD_STRIDE, -2, "V_NEW_HEAD_STRIDE"},
        {FLASHATTN_I64_ROTARY_DIM, 3, "even"},            {FLASHATTN_I64_ROTARY_DIM, -2, "ROTARY_DIM"},
        {FLASHATTN_I64_ROTARY_DIM, 258, "ROTARY_DIM"},    {FLASHATTN_I64_ROTARY_INTERLEAVED, 2, "ROTARY_INTERLEAVED"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        int64_t before = 0;
        assert_status(flashattn_plan_get_i64(plan, bad[i].key, &before), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_set_i64(plan, bad[i].key, bad[i].value), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions(bad[i].word);
        assert_status(flashattn_plan_get_i64(plan, bad[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, before);
    }
    flashattn_plan_destroy(plan);
}

static void test_finalize_rules(void **state) {
    (void)state;
    const struct {
        flashattn_i64_param_t key;
        int64_t value;
        flashattn_status_t status;
        const char *word;
    } rules[] = {
        {FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, 2, FLASHATTN_ERROR_INVALID_ARGUMENT, "MAX_PAGES_PER_SEQUENCE"}, /* 2 x 4 < 12 */
        {FLASHATTN_I64_PAGE_TABLE_STRIDE, 2, FLASHATTN_ERROR_INVALID_ARGUMENT, "PAGE_TABLE_STRIDE"},          /* < 3 columns */
        {FLASHATTN_I64_SEQUSED_K, 0, FLASHATTN_ERROR_INVALID_ARGUMENT, "SEQUSED_K"},  /* an append needs the lengths */
        {FLASHATTN_I64_NEW_KV_ROWS, 0, FLASHATTN_ERROR_INVALID_ARGUMENT, "NEW_KV_ROWS"}, /* rotary without an append */
        {FLASHATTN_I64_NEW_KV_ROWS, NSK + 1, FLASHATTN_ERROR_INVALID_ARGUMENT, "NEW_KV_ROWS"},
        {FLASHATTN_I64_ROTARY_DIM, ND + 2, FLASHATTN_ERROR_INVALID_ARGUMENT, "ROTARY_DIM"},
        {FLASHATTN_I64_K_ROW_STRIDE, ND, FLASHATTN_ERROR_INVALID_ARGUMENT, "K"}, /* a written cache overlapping itself */
    };
    for (size_t i = 0; i < sizeof rules / sizeof *rules; ++i) {
        flashattn_plan_t *plan = serving_plan(0);
        assert_status(flashattn_plan_set_i64(plan, rules[i].key, rules[i].value), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), rules[i].status);
        assert_message_mentions(rules[i].word);
        flashattn_plan_destroy(plan);
    }
    /* one appended row whose (unused) row stride overflows 64 bits in bytes: refused, not wrapped */
    {
        flashattn_plan_t *plan = serving_plan(0);
        assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_NEW_KV_ROWS, 1), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_NEW_ROW_STRIDE, INT64_MAX / 2), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_NEW_BATCH_STRIDE, NHKV * ND), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_message_mentions("K_new strides");
        flashattn_plan_destroy(plan);
    }
    /* required sizes of a paged plan */
    const flashattn_i64_param_t required[] = {FLASHATTN_I64_PAGE_SIZE, FLASHATTN_I64_NUM_PAGES};
    for (size_t i = 0; i < 2; ++i) {
        static const test_key_value keys[] = {
            {FLASHATTN_I64_BATCH, NB}, {FLASHATTN_I64_SEQLEN_Q, NSQ}, {FLASHATTN_I64_SEQLEN_K, NSK},
            {FLASHATTN_I64_HEADS_Q, NH}, {FLASHATTN_I64_HEAD_DIM, ND}, {FLASHATTN_I64_PAGED_KV, 1},
            {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
        };
        flashattn_plan_t *plan = plan_with_keys(keys, sizeof keys / sizeof *keys);
        assert_status(flashattn_plan_set_i64(plan, required[1 - i], 4), FLASHATTN_SUCCESS);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_STATE);
        assert_message_mentions(i == 0 ? "PAGE_SIZE" : "NUM_PAGES");
        flashattn_plan_destroy(plan);
    }
    /* resolved values */
    flashattn_plan_t *plan = serving_plan(1);
    const struct { flashattn_i64_param_t key; int64_t value; } resolved[] = {
        {FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, MAXP}, {FLASHATTN_I64_PAGE_TABLE_STRIDE, MAXP},
        {FLASHATTN_I64_K_BATCH_STRIDE, PAGE * NHKV * ND}, {FLASHATTN_I64_K_ROW_STRIDE, NHKV * ND},
        {FLASHATTN_I64_K_NEW_BATCH_STRIDE, NEW * NHKV * ND}, {FLASHATTN_I64_K_NEW_ROW_STRIDE, NHKV * ND},
        {FLASHATTN_I64_V_NEW_HEAD_STRIDE, ND}, {FLASHATTN_I64_PAGED_KV, 1}, {FLASHATTN_I64_PAGE_SIZE, PAGE},
        {FLASHATTN_I64_NUM_PAGES, NPAGES}, {FLASHATTN_I64_SEQUSED_K, 1}, {FLASHATTN_I64_NEW_KV_ROWS, NEW},
        {FLASHATTN_I64_ROTARY_DIM, ROT}, {FLASHATTN_I64_ROTARY_INTERLEAVED, 1},
    };
    for (size_t i = 0; i < sizeof resolved / sizeof *resolved; ++i) {
        int64_t value = 0;
        assert_status(flashattn_plan_get_i64(plan, resolved[i].key, &value), FLASHATTN_SUCCESS);
        assert_int_equal(value, resolved[i].value);
    }
    /* no backward pass */
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    size_t bytes = 0;
    assert_status(flashattn_plan_get_backward_backend(plan, &backend, NULL), FLASHATTN_ERROR_NOT_SUPPORTED);
    assert_message_mentions("backward");
    assert_message_mentions("FLASHATTN_I64_PAGED_KV");
    assert_status(flashattn_plan_get_backward_workspace_size(plan, &bytes), FLASHATTN_ERROR_NOT_SUPPORTED);
    flashattn_plan_destroy(plan);
}

static void test_execute_errors(void **state) {
    (void)state;
    flashattn_plan_t *plan = serving_plan(1);
    fixture *f = make_fixture(plan);

    /* the older calls cannot carry the tensors */
    snapshot(f);
    assert_status(flashattn_plan_execute(plan, f->q, f->k, f->v, f->o, f->lse, f->ws, f->ws_bytes, NULL),
                  FLASHATTN_ERROR_INVALID_STATE);
    assert_message_mentions("flashattn_plan_execute_args");
    assert_nothing_written(f);
    assert_status(flashattn_plan_execute_args(NULL, f->args, f->ws, f->ws_bytes, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("plan");
    assert_status(flashattn_plan_execute_args(plan, NULL, f->ws, f->ws_bytes, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("args");

    /* every required pointer */
    const struct { flashattn_arg_t which; const void *ptr; const char *name; } required[] = {
        {FLASHATTN_ARG_Q, f->q, "q"}, {FLASHATTN_ARG_K, f->k, "k"}, {FLASHATTN_ARG_V, f->v, "v"},
        {FLASHATTN_ARG_O, f->o, "o"}, {FLASHATTN_ARG_PAGE_TABLE, f->table, "page_table"},
        {FLASHATTN_ARG_SEQUSED_K, f->seqused, "seqused_k"}, {FLASHATTN_ARG_K_NEW, f->k_new, "k_new"},
        {FLASHATTN_ARG_V_NEW, f->v_new, "v_new"}, {FLASHATTN_ARG_ROTARY_COS, f->cos_t, "rotary_cos"},
        {FLASHATTN_ARG_ROTARY_SIN, f->sin_t, "rotary_sin"},
    };
    for (size_t i = 0; i < sizeof required / sizeof *required; ++i) {
        assert_status(flashattn_args_set(f->args, required[i].which, NULL), FLASHATTN_SUCCESS);
        expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, required[i].name);
        assert_message_mentions("NULL");
        assert_status(flashattn_args_set(f->args, required[i].which, required[i].ptr), FLASHATTN_SUCCESS);
    }
    /* pointers the plan does not use */
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_CU_SEQLENS_Q, f->cu), FLASHATTN_SUCCESS);
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_q");
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_CU_SEQLENS_Q, NULL), FLASHATTN_SUCCESS);
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_CU_SEQLENS_K, f->cu), FLASHATTN_SUCCESS);
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_k");
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_CU_SEQLENS_K, NULL), FLASHATTN_SUCCESS);

    /* overlaps: an output inside a cache that is written, an input inside a written cache */
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_O, f->k + 64), FLASHATTN_SUCCESS);
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "overlaps");
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_O, f->o), FLASHATTN_SUCCESS);
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_K_NEW, f->v), FLASHATTN_SUCCESS);
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "k_new");
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_K_NEW, f->k_new), FLASHATTN_SUCCESS);
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_LSE, f->v), FLASHATTN_SUCCESS);
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "overlaps");
    assert_status(flashattn_args_set(f->args, FLASHATTN_ARG_LSE, f->lse), FLASHATTN_SUCCESS);

    /* the page table, seqused_k and rotary positions, read on the host */
    const int32_t bad_pages[] = {NPAGES, -1, 1 << 30};
    for (size_t i = 0; i < 3; ++i) {
        f->table[1 * MAXP + 2] = bad_pages[i]; /* sequence 1 reads its third page (7 + 2 keys) */
        expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "page_table[1][2]");
    }
    f->table[1 * MAXP + 2] = 6;
    f->table[0 * MAXP + 2] = -5; /* sequence 0 needs 2 pages only (3 + 2 keys): not read, not checked */
    f->seqused[1] = NSK - NEW + 1;
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "seqused_k[1]");
    f->seqused[1] = -1;
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "seqused_k[1]");
    f->seqused[1] = NSK - NEW; /* the keys fit, the last query (position 10 + 2) is beyond the tables */
    f->table[1 * MAXP + 2] = 6;
    expect_failure(plan, f, FLASHATTN_ERROR_INVALID_ARGUMENT, "rotary");
    f->seqused[1] = 7;

    /* the workspace */
    if (f->ws_bytes > 0) {
        snapshot(f);
        assert_status(flashattn_plan_execute_args(plan, f->args, f->ws, f->ws_bytes - 1, NULL),
                      FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE);
        assert_nothing_written(f);
    }

    /* and the call runs; seqused_k is never written */
    snapshot(f);
    assert_status(run(plan, f), FLASHATTN_SUCCESS);
    assert_memory_equal(f->seqused, f->seqused0, sizeof f->seqused);
    for (size_t i = 0; i < sizeof f->o / sizeof *f->o; ++i) assert_true(isfinite(f->o[i]));
    free_fixture(f);
    flashattn_plan_destroy(plan);
}

/* A plan without serving features gives bitwise the same through execute_args as through the
 * older calls, and rejects serving pointers. */
static void test_plain_plans(void **state) {
    (void)state;
    for (int varlen = 0; varlen < 2; ++varlen) {
        const test_key_value keys[] = {
            {FLASHATTN_I64_BATCH, NB}, {FLASHATTN_I64_SEQLEN_Q, NSQ}, {FLASHATTN_I64_SEQLEN_K, PAGE},
            {FLASHATTN_I64_HEADS_Q, NH}, {FLASHATTN_I64_HEADS_KV, NHKV}, {FLASHATTN_I64_HEAD_DIM, ND},
            {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
            {FLASHATTN_I64_VARLEN, varlen}, {FLASHATTN_I64_TOTAL_Q, NB * NSQ - 1}, {FLASHATTN_I64_TOTAL_K, NB * PAGE},
        };
        flashattn_plan_t *plan = plan_with_keys(keys, sizeof keys / sizeof *keys);
        assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
        fixture *f = make_fixture(plan);
        const int32_t cu_q[NB + 1] = {0, NSQ - 1, 2 * NSQ - 1}, cu_k[NB + 1] = {0, PAGE, 2 * PAGE};
        float o1[sizeof f->o / sizeof *f->o], lse1[sizeof f->lse / sizeof *f->lse];
        flashattn_args_t *args = NULL;
        assert_status(flashattn_args_create(&args), FLASHATTN_SUCCESS);
        flashattn_args_set(args, FLASHATTN_ARG_Q, f->q);
        flashattn_args_set(args, FLASHATTN_ARG_K, f->k);
        flashattn_args_set(args, FLASHATTN_ARG_V, f->v);
        flashattn_args_set(args, FLASHATTN_ARG_O, o1);
        flashattn_args_set(args, FLASHATTN_ARG_LSE, lse1);
        memset(o1, 0x7f, sizeof o1);
        memset(lse1, 0x7f, sizeof lse1);
        if (varlen) {
            flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_Q, cu_q);
            flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_K, cu_k);
            assert_status(flashattn_plan_execute_varlen(plan, f->q, f->k, f->v, f->o, f->lse, cu_q, cu_k, f->ws,
                                                        f->ws_bytes, NULL), FLASHATTN_SUCCESS);
        } else {
            assert_status(flashattn_plan_execute(plan, f->q, f->k, f->v, f->o, f->lse, f->ws, f->ws_bytes, NULL),
                          FLASHATTN_SUCCESS);
        }
        assert_status(flashattn_plan_execute_args(plan, args, f->ws, f->ws_bytes, NULL), FLASHATTN_SUCCESS);
        assert_memory_equal(o1, f->o, sizeof o1);
        assert_memory_equal(lse1, f->lse, sizeof lse1);
        if (varlen) { /* a varlen plan needs both cu_seqlens */
            flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_K, NULL);
            assert_status(flashattn_plan_execute_args(plan, args, f->ws, f->ws_bytes, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_mentions("cu_seqlens_k");
            flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_K, cu_k);
        }
        const struct { flashattn_arg_t which; const char *name; } unused[] = {
            {FLASHATTN_ARG_PAGE_TABLE, "page_table"}, {FLASHATTN_ARG_SEQUSED_K, "seqused_k"},
            {FLASHATTN_ARG_K_NEW, "k_new"}, {FLASHATTN_ARG_V_NEW, "v_new"},
            {FLASHATTN_ARG_ROTARY_COS, "rotary_cos"}, {FLASHATTN_ARG_ROTARY_SIN, "rotary_sin"},
        };
        for (size_t i = 0; i < sizeof unused / sizeof *unused; ++i) {
            flashattn_args_set(args, unused[i].which, f->table);
            memcpy(f->o0, o1, sizeof o1);
            assert_status(flashattn_plan_execute_args(plan, args, f->ws, f->ws_bytes, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT);
            assert_message_mentions(unused[i].name);
            assert_message_mentions("does not use");
            assert_memory_equal(o1, f->o0, sizeof o1);
            flashattn_args_set(args, unused[i].which, NULL);
        }
        flashattn_args_destroy(args);
        free_fixture(f);
        flashattn_plan_destroy(plan);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_args_object),    cmocka_unit_test(test_keys),
        cmocka_unit_test(test_finalize_rules), cmocka_unit_test(test_execute_errors),
        cmocka_unit_test(test_plain_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
