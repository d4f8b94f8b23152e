/* libFuzzer target (clang, ASan + UBSan): the whole C API on the CPU backend, driven by the input.
 *
 * One input is one session: a plan built from a mostly valid small problem, then setters with
 * keys and values picked from the edges of every range (and keys that do not exist, on a plan of
 * their own), getters, finalize, the workspace queries, and when finalize succeeds the forward
 * (execute or execute_varlen) and the backward (execute_backward or its varlen twin) on host
 * buffers of exactly the bytes the resolved strides reach, some calls with a broken argument;
 * either pass also through an argument set (flashattn_args_*, flashattn_plan_execute_args and
 * _backward_args, with a pointer the pass does not use as one more breakage), and the merge of
 * partial states (flashattn_plan_merge_states) into the plan's O and LSE layouts.
 *
 * The oracle, independent of the library's code:
 * - a failing call returns a documented status, leaves a message, and writes nothing: outputs are
 *   poisoned before each call and compared byte for byte after it; out-parameters keep a sentinel;
 *   inputs are compared with their snapshot after every call;
 * - a successful forward writes every element of O and LSE and nothing between them (stride gaps
 *   keep the poison), each value within a bound of a double-precision reference computed here
 *   (the documented mask rule, scale, softcap, O = 0 and LSE = -inf for a row that sees no key),
 *   the bound widened by how much the library's fp32 scores may move; and a second run is bitwise
 *   identical;
 * - a successful backward writes every element of dQ, dK, dV (zeros exactly where no key or no
 *   query is seen), each within a bound of the double-precision gradient;
 * - a successful merge writes every row of O (not its stride gaps) and LSE: the formula in double
 *   (a partial with LSE -inf adds nothing, whatever its O holds; a row -inf in every partial is
 *   O = 0, LSE = -inf; a NaN LSE in any partial makes the row's O and LSE NaN; a NaN in the O of a
 *   partial that adds to the row makes that column NaN);
 * - an argument set reads back what was set, refuses values that are not flashattn_arg_t ones
 *   and writes nothing then.
 * Any breach aborts with a message (libFuzzer keeps the input).
 *
 * FLASHATTN_FUZZ_AVOID_KNOWN=1 keeps the inputs away from the defects listed in issue 21 (huge
 * windows, scales and softcaps, huge maximum lengths, large fp32 inputs, the NULL-plan message), to
 * look for others before those are fixed. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "test_buffers.h"
#include "test_support.h"

/* ---- Limits: what one input may cost (libFuzzer runs thousands a second) --------------------- */

enum {
    kMaxBatchRun = 8,                 /* sequences of a problem that is run */
    kMaxElems = 1 << 16,              /* elements a tensor buffer may span */
    kMaxWork = 1 << 20,               /* reference multiply-adds of the forward */
    kMaxKey = 80,                     /* i64 keys this model knows lie below */
    kMaxMutations = 8,
};

/* ---- Reading the input ------------------------------------------------------------------------ */

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

/* The next byte, 0 once the input is used up (so every input is a complete program). */
static unsigned take8(input *in) {
    if (in->n == 0) return 0;
    --in->n;
    return *in->p++;
}

static uint64_t take(input *in, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= (uint64_t)take8(in) << (8 * i);
    return v;
}

/* Uniform enough in [0, bound) for bound <= 256. */
static int64_t take_below(input *in, int64_t bound) { return bound <= 1 ? 0 : (int64_t)(take8(in) % bound); }

static int avoid_known(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *e = getenv("FLASHATTN_FUZZ_AVOID_KNOWN");
        cached = e != NULL && e[0] == '1';
    }
    return cached;
}

/* The edges of the int64 range and of every size rule. */
static const int64_t kEdgeI64[] = {INT64_MIN, INT64_MIN + 1, -(INT64_C(1) << 32), -(INT64_C(1) << 31) - 1,
                                   -(INT64_C(1) << 31), -257, -9, -2, -1, 0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16,
                                   17, 24, 31, 32, 33, 40, 63, 64, 65, 127, 128, 255, 256, 257, 264, 1023, 4096,
                                   65535, 65536, INT32_MAX, INT64_C(1) << 31, UINT32_MAX, INT64_C(1) << 32,
                                   INT64_C(1) << 40, INT64_C(10000000000), INT64_C(1) << 53, INT64_C(1) << 62,
                                   INT64_MAX - 1, INT64_MAX};
#define N_EDGE_I64 ((int64_t)(sizeof kEdgeI64 / sizeof kEdgeI64[0]))

static const double kEdgeF64[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 4.9e-324, 2.2250738585072014e-308,
                                  1e-300, 1e-39, 1.17549435e-38, 1e-30, 1e-9, 1e-3, 0.01, 0.0625, 0.125, 0.25,
                                  0.35355339059327373, 0.5, 1.0, 2.0, 3.0, 8.0, 30.0, 50.0, 100.0, 1e4, 1e10,
                                  1e30, 3.4028234663852886e38, 1e39, 1e300, DBL_MAX, -1.0, -1e-39};
#define N_EDGE_F64 ((int64_t)(sizeof kEdgeF64 / sizeof kEdgeF64[0]))

static int64_t take_i64_value(input *in) {
    const unsigned how = take8(in) % 4;
    int64_t v;
    if (how == 0) v = (int64_t)take(in, 8);
    else if (how == 1) v = (int64_t)take_below(in, 20) - 2;
    else v = kEdgeI64[take_below(in, N_EDGE_I64)];
    if (avoid_known() && (v > (INT64_C(1) << 20) || v < -(INT64_C(1) << 20))) v = (int64_t)take_below(in, 300);
    return v;
}

static double take_f64_value(input *in) {
    if (take8(in) % 4 == 0) {
        double d;
        uint64_t bits = take(in, 8);
        memcpy(&d, &bits, 8);
        if (avoid_known() && isfinite(d) && (fabs(d) > 1e3 || fabs(d) < 1e-3)) d = 0.5;
        return d;
    }
    double d = kEdgeF64[take_below(in, N_EDGE_F64)];
    if (avoid_known() && isfinite(d) && d != 0.0 && (fabs(d) > 1e3 || fabs(d) < 1e-3)) d = 2.0;
    return d;
}

/* ---- What the inputs reached (FLASHATTN_FUZZ_STATS=1 prints it at exit) ---------------------- */

static struct {
    long inputs, finalized, forward_ok, forward_failed, backward_ok, backward_failed, rows_checked;
    long via_args, merge_ok, merge_failed, merge_rows;
} stats;

static void print_stats(void) {
    fprintf(stderr, "fuzz_capi: %ld inputs, %ld finalized plans run, forward %ld ok / %ld refused, backward %ld ok / %ld "
                    "refused (%ld calls through an argument set), %ld rows checked against the reference; merge %ld ok / "
                    "%ld refused, %ld merged rows checked\n",
            stats.inputs, stats.finalized, stats.forward_ok, stats.forward_failed, stats.backward_ok, stats.backward_failed,
            stats.via_args, stats.rows_checked, stats.merge_ok, stats.merge_failed, stats.merge_rows);
}

/* ---- Findings --------------------------------------------------------------------------------- */

static void finding(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\nfuzz_capi FINDING: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  last error: %s\n", flashattn_last_error());
    va_end(ap);
    abort();
}

static void expect_message(const char *call) {
    const char *msg = flashattn_last_error();
    if (msg == NULL || msg[0] == '\0') finding("%s failed without a message", call);
}

/* A failing call's status must be one of the documented ones for its kind of failure. */
static void expect_status(flashattn_status_t got, flashattn_status_t want, const char *call) {
    if (got != want)
        finding("%s returned %d (%s), expected %d (%s)", call, got, flashattn_status_string(got), want,
                flashattn_status_string(want));
    if (want != FLASHATTN_SUCCESS) expect_message(call);
}

/* ---- The plan model: what was set, so the resolved values can be checked ---------------------- */

typedef struct shadow {
    int set[kMaxKey];
    int64_t value[kMaxKey];
    int scale_set, softcap_set;
    double scale, softcap;
    int finalized; /* getters report resolved values until the next successful setter */
} shadow;

static const flashattn_i64_param_t kKnownKeys[] = {
    FLASHATTN_I64_BATCH, FLASHATTN_I64_SEQLEN_Q, FLASHATTN_I64_SEQLEN_K, FLASHATTN_I64_HEADS_Q,
    FLASHATTN_I64_HEADS_KV, FLASHATTN_I64_HEAD_DIM, FLASHATTN_I64_HEAD_DIM_V, FLASHATTN_I64_DTYPE,
    FLASHATTN_I64_CAUSAL, FLASHATTN_I64_WINDOW_LEFT, FLASHATTN_I64_WINDOW_RIGHT, FLASHATTN_I64_BACKEND,
    FLASHATTN_I64_DEVICE, FLASHATTN_I64_VARLEN, FLASHATTN_I64_TOTAL_Q, FLASHATTN_I64_TOTAL_K,
    FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE,
    FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE,
    FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE,
    FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE,
    FLASHATTN_I64_DETERMINISTIC, FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE,
    FLASHATTN_I64_DO_HEAD_STRIDE, FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE,
    FLASHATTN_I64_DQ_HEAD_STRIDE, FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE,
    FLASHATTN_I64_DK_HEAD_STRIDE, FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE,
    FLASHATTN_I64_DV_HEAD_STRIDE};
#define N_KNOWN_KEYS ((int64_t)(sizeof kKnownKeys / sizeof kKnownKeys[0]))

/* The 0.3 keys (serving: paged K/V, seqused_k, append with rotary, split count; variants: mask
 * alignment, sink tokens and logits, ALiBi; FP8: output dtype, descale strides). The oracle does not model them: the setters, getters, finalize and
 * the workspace queries are driven with their edge values, and a plan that sets any of them is not
 * executed. */
static const flashattn_i64_param_t kFeatureKeys[] = {
    FLASHATTN_I64_PAGED_KV, FLASHATTN_I64_PAGE_SIZE, FLASHATTN_I64_NUM_PAGES, FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE,
    FLASHATTN_I64_PAGE_TABLE_STRIDE, FLASHATTN_I64_SEQUSED_K, FLASHATTN_I64_NEW_KV_ROWS,
    FLASHATTN_I64_K_NEW_BATCH_STRIDE, FLASHATTN_I64_K_NEW_ROW_STRIDE, FLASHATTN_I64_K_NEW_HEAD_STRIDE,
    FLASHATTN_I64_V_NEW_BATCH_STRIDE, FLASHATTN_I64_V_NEW_ROW_STRIDE, FLASHATTN_I64_V_NEW_HEAD_STRIDE,
    FLASHATTN_I64_ROTARY_DIM, FLASHATTN_I64_ROTARY_INTERLEAVED, FLASHATTN_I64_MASK_ALIGN, FLASHATTN_I64_SINK_TOKENS,
    FLASHATTN_I64_SINK_LOGITS, FLASHATTN_I64_ALIBI, FLASHATTN_I64_OUTPUT_DTYPE, FLASHATTN_I64_DESCALE_BATCH_STRIDE,
    FLASHATTN_I64_DESCALE_HEAD_STRIDE, FLASHATTN_I64_NUM_SPLITS};
#define N_FEATURE_KEYS ((int64_t)(sizeof kFeatureKeys / sizeof kFeatureKeys[0]))

/* A key to set: one the model knows, or (one time in four) a 0.3 feature key. */
static flashattn_i64_param_t take_key(input *in) {
    if (take8(in) % 4 == 0) return kFeatureKeys[take_below(in, N_FEATURE_KEYS)];
    return kKnownKeys[take_below(in, N_KNOWN_KEYS)];
}

static int sets_feature_key(const shadow *sh) {
    for (int64_t i = 0; i < N_FEATURE_KEYS; ++i)
        if (sh->set[kFeatureKeys[i]]) return 1;
    return 0;
}

static int64_t get_key(const flashattn_plan_t *plan, flashattn_i64_param_t key);

/* A finalized plan with a 0.3 feature key: its queries answer (or refuse with a message), the
 * getters read every feature key, and nothing is executed. */
static void probe_feature_plan(const flashattn_plan_t *plan) {
    size_t bytes = 0;
    if (flashattn_plan_get_workspace_size(plan, &bytes) != FLASHATTN_SUCCESS) finding("get_workspace_size failed on a finalized plan");
    flashattn_backend_t bb = (flashattn_backend_t)99;
    if (flashattn_plan_get_backward_backend(plan, &bb, NULL) == FLASHATTN_SUCCESS) {
        if (flashattn_plan_get_backward_workspace_size(plan, &bytes) != FLASHATTN_SUCCESS)
            finding("get_backward_workspace_size failed after get_backward_backend succeeded");
    } else {
        expect_message("get_backward_backend");
    }
    for (int64_t i = 0; i < N_FEATURE_KEYS; ++i) (void)get_key(plan, kFeatureKeys[i]);
}

/* set_i64 on the modelled plan: a failure must leave the value that get_i64 reports unchanged. */
static void set_i64(flashattn_plan_t *plan, shadow *sh, flashattn_i64_param_t key, int64_t value) {
    int64_t before = INT64_C(0x5eed5eed5eed), after = INT64_C(0x5eed5eed5eed);
    const flashattn_status_t got_before = flashattn_plan_get_i64(plan, key, &before);
    const flashattn_status_t s = flashattn_plan_set_i64(plan, key, value);
    if (s == FLASHATTN_SUCCESS) {
        sh->finalized = 0;
        if (key > 0 && key < kMaxKey) {
            sh->set[key] = 1;
            sh->value[key] = value;
        }
        return;
    }
    expect_status(s, FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_plan_set_i64");
    if (got_before == FLASHATTN_SUCCESS) {
        if (flashattn_plan_get_i64(plan, key, &after) != FLASHATTN_SUCCESS || after != before)
            finding("set_i64(key %d, %lld) failed but changed the value from %lld to %lld", (int)key, (long long)value,
                    (long long)before, (long long)after);
    }
}

/* The header's ranges: scale in [2^-126, 2^64]; softcap 0 (off) or in the same range. */
static int f64_allowed(flashattn_f64_param_t key, double value) {
    const int in_range = value >= ldexp(1.0, -126) && value <= ldexp(1.0, 64);
    return key == FLASHATTN_F64_SOFTCAP ? (value == 0.0 || in_range) : in_range;
}

static void set_f64(flashattn_plan_t *plan, shadow *sh, flashattn_f64_param_t key, double value) {
    const flashattn_status_t s = flashattn_plan_set_f64(plan, key, value);
    if (s != FLASHATTN_SUCCESS) {
        expect_status(s, FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_plan_set_f64");
        if (f64_allowed(key, value)) finding("set_f64(key %d, %g): a value in the documented range refused", (int)key, value);
        return;
    }
    if (!f64_allowed(key, value)) finding("set_f64(key %d, %g) accepted a value the header forbids", (int)key, value);
    sh->finalized = 0;
    if (key == FLASHATTN_F64_SOFTMAX_SCALE) {
        sh->scale_set = 1;
        sh->scale = value;
    } else if (key == FLASHATTN_F64_SOFTCAP) {
        sh->softcap_set = 1;
        sh->softcap = value;
    }
}

/* Keys and values the model does not know, on a plan of their own: the setters and getters must
 * answer with a status and a message, never crash, and a getter that fails writes nothing. */
static void probe_unknown_keys(input *in) {
    flashattn_plan_t *plan = NULL;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS) finding("flashattn_plan_create failed");
    const int rounds = (int)take_below(in, 4);
    for (int r = 0; r < rounds; ++r) {
        const int key = (int)(int32_t)take(in, 4);
        const int64_t value = take_i64_value(in);
        const flashattn_status_t s = flashattn_plan_set_i64(plan, (flashattn_i64_param_t)key, value);
        int64_t got = INT64_C(0x1234);
        const flashattn_status_t g = flashattn_plan_get_i64(plan, (flashattn_i64_param_t)key, &got);
        if (s == FLASHATTN_SUCCESS && (g != FLASHATTN_SUCCESS || got != value))
            finding("key %d accepted %lld but get_i64 gives %lld (status %d)", key, (long long)value, (long long)got, g);
        if (s != FLASHATTN_SUCCESS) expect_message("set_i64 of an unknown key");
        if (g != FLASHATTN_SUCCESS && got != INT64_C(0x1234)) finding("get_i64(key %d) failed but wrote its output", key);
        double f = 42.0;
        const flashattn_status_t fs = flashattn_plan_set_f64(plan, (flashattn_f64_param_t)key, take_f64_value(in));
        if (fs != FLASHATTN_SUCCESS) expect_message("set_f64 of an unknown key");
        if (flashattn_plan_get_f64(plan, (flashattn_f64_param_t)key, &f) != FLASHATTN_SUCCESS && f != 42.0)
            finding("get_f64(key %d) failed but wrote its output", key);
    }
    flashattn_plan_destroy(plan);
}

/* The NULL-plan and NULL-output paths of every entry point, and the error-message copy. */
static void probe_null_arguments(input *in) {
    int64_t i = 7;
    double f = 7.0;
    size_t bytes = 7;
    flashattn_backend_t backend = (flashattn_backend_t)77;
    const int check_words = !avoid_known();
#define EXPECT_NULL_PLAN(call, name)                                                                   \
    do {                                                                                               \
        expect_status((call), FLASHATTN_ERROR_INVALID_ARGUMENT, name);                                 \
        if (check_words && strstr(flashattn_last_error(), "plan") == NULL)                             \
            finding("%s with a NULL plan: message '%s' does not name 'plan'", name, flashattn_last_error()); \
        if (check_words && strstr(flashattn_last_error(), "operator") != NULL)                          \
            finding("%s: message '%s' names a C++ operator", name, flashattn_last_error());           \
    } while (0)
    EXPECT_NULL_PLAN(flashattn_plan_set_i64(NULL, FLASHATTN_I64_BATCH, 1), "set_i64");
    EXPECT_NULL_PLAN(flashattn_plan_set_f64(NULL, FLASHATTN_F64_SOFTCAP, 1.0), "set_f64");
    EXPECT_NULL_PLAN(flashattn_plan_get_i64(NULL, FLASHATTN_I64_BATCH, &i), "get_i64");
    EXPECT_NULL_PLAN(flashattn_plan_get_f64(NULL, FLASHATTN_F64_SOFTCAP, &f), "get_f64");
    EXPECT_NULL_PLAN(flashattn_plan_finalize(NULL), "finalize");
    EXPECT_NULL_PLAN(flashattn_plan_get_backend(NULL, &backend, NULL), "get_backend");
    EXPECT_NULL_PLAN(flashattn_plan_get_workspace_size(NULL, &bytes), "get_workspace_size");
    EXPECT_NULL_PLAN(flashattn_plan_get_backward_backend(NULL, &backend, NULL), "get_backward_backend");
    EXPECT_NULL_PLAN(flashattn_plan_get_backward_workspace_size(NULL, &bytes), "get_backward_workspace_size");
    EXPECT_NULL_PLAN(flashattn_plan_execute(NULL, &i, &i, &i, &f, NULL, NULL, 0, NULL), "execute");
    EXPECT_NULL_PLAN(flashattn_plan_execute_varlen(NULL, &i, &i, &i, &f, NULL, NULL, NULL, NULL, 0, NULL),
                     "execute_varlen");
    EXPECT_NULL_PLAN(flashattn_plan_execute_backward(NULL, &i, &i, &i, &i, &i, (const float *)&i, &f, &f, &f, NULL, 0, NULL),
                     "execute_backward");
    EXPECT_NULL_PLAN(flashattn_plan_execute_args(NULL, NULL, NULL, 0, NULL), "execute_args");
    EXPECT_NULL_PLAN(flashattn_plan_execute_backward_args(NULL, NULL, NULL, 0, NULL), "execute_backward_args");
    {
        const void *po[1] = {&i};
        const float *pl[1] = {(const float *)&i};
        EXPECT_NULL_PLAN(flashattn_plan_merge_states(NULL, 1, po, pl, FLASHATTN_DTYPE_FP32, &f, NULL, NULL), "merge_states");
    }
#undef EXPECT_NULL_PLAN
    if (i != 7 || f != 7.0 || bytes != 7 || backend != (flashattn_backend_t)77)
        finding("a call with a NULL plan wrote an out-parameter");
    expect_status(flashattn_plan_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT, "create(NULL)");
    flashattn_plan_destroy(NULL);
    (void)flashattn_status_string((flashattn_status_t)(int32_t)take(in, 4));

    /* The message copy: NUL-terminated within `size`, never a byte past it (exact-size buffer). */
    const size_t len = strlen(flashattn_last_error());
    const size_t size = (size_t)take_below(in, 80);
    char *buf = size ? malloc(size) : NULL;
    const size_t copied = flashattn_last_error_copy(buf, size);
    if (copied != len) finding("last_error_copy returned %zu, the message has %zu bytes", copied, len);
    if (size > 0 && (memchr(buf, 0, size) == NULL || strncmp(buf, flashattn_last_error(), size - 1) != 0))
        finding("last_error_copy into %zu bytes: not the NUL-terminated prefix of the message", size);
    free(buf);
}

/* ---- The argument set ------------------------------------------------------------------------- */

/* The flashattn_arg_t values (flashattn.h): everything else must be refused. */
static int arg_is_known(int64_t which) {
    return (which >= FLASHATTN_ARG_Q && which <= FLASHATTN_ARG_ROTARY_SIN) ||
           (which >= FLASHATTN_ARG_SINK_LOGITS && which <= FLASHATTN_ARG_DSINK_LOGITS) ||
           (which >= FLASHATTN_ARG_DOUT && which <= FLASHATTN_ARG_DV) ||
           (which >= FLASHATTN_ARG_DESCALE_Q && which <= FLASHATTN_ARG_DESCALE_V);
}

/* A `which` from the known values, their neighbours and the int32 edges. */
static int32_t take_arg_value(input *in) {
    static const int32_t edges[] = {INT32_MIN, -1, 0, 14, 19, 23, 29, 34, 39, 40, 42, 43, 63, 64, 65, 256, INT32_MAX};
    const unsigned how = take8(in) % 4;
    if (how == 0) return (int32_t)take(in, 4);
    if (how == 1) return edges[take_below(in, (int64_t)(sizeof edges / sizeof edges[0]))];
    return (int32_t)take_below(in, 48);
}

/* An argument set on its own: create, set and get any value with any pointer (nothing is read
 * through them), NULL objects and out-pointers, destroy. */
static void probe_args_object(input *in) {
    expect_status(flashattn_args_create(NULL), FLASHATTN_ERROR_INVALID_ARGUMENT, "args_create(NULL)");
    flashattn_args_t *a = NULL;
    if (flashattn_args_create(&a) != FLASHATTN_SUCCESS || a == NULL) finding("flashattn_args_create failed");
    const void *model[64] = {0}; /* what each known value holds: NULL until set */
    static const unsigned char targets[4] = {0};
    const int rounds = (int)take_below(in, 8);
    for (int r = 0; r < rounds; ++r) {
        const int32_t which = take_arg_value(in);
        const unsigned pick = take8(in) % 3;
        const void *ptr = pick == 0 ? NULL : pick == 1 ? (const void *)&targets[take_below(in, 4)]
                                                       : (const void *)(uintptr_t)take(in, 8);
        const int known = arg_is_known(which);
        const flashattn_status_t s = flashattn_args_set(a, (flashattn_arg_t)which, ptr);
        if (known) {
            expect_status(s, FLASHATTN_SUCCESS, "args_set of a flashattn_arg_t value");
            model[which] = ptr;
        } else {
            expect_status(s, FLASHATTN_ERROR_INVALID_ARGUMENT, "args_set of a value that is not a flashattn_arg_t");
            if (strstr(flashattn_last_error(), "which") == NULL) finding("args_set(%d): message '%s' does not name 'which'", which, flashattn_last_error());
        }
        const void *got = (const void *)(uintptr_t)0x5eed;
        const int32_t probe_which = (take8(in) & 1) ? which : take_arg_value(in);
        const flashattn_status_t g = flashattn_args_get(a, (flashattn_arg_t)probe_which, &got);
        if (arg_is_known(probe_which)) {
            expect_status(g, FLASHATTN_SUCCESS, "args_get of a flashattn_arg_t value");
            if (got != model[probe_which]) finding("args_get(%d) gives %p, %p was set", probe_which, got, model[probe_which]);
        } else {
            expect_status(g, FLASHATTN_ERROR_INVALID_ARGUMENT, "args_get of a value that is not a flashattn_arg_t");
            if (got != (const void *)(uintptr_t)0x5eed) finding("args_get(%d) failed but wrote its output", probe_which);
        }
    }
    expect_status(flashattn_args_get(a, FLASHATTN_ARG_Q, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT, "args_get(NULL ptr)");
    const void *untouched = (const void *)(uintptr_t)0x77;
    expect_status(flashattn_args_get(NULL, FLASHATTN_ARG_Q, &untouched), FLASHATTN_ERROR_INVALID_ARGUMENT, "args_get(NULL args)");
    expect_status(flashattn_args_set(NULL, FLASHATTN_ARG_Q, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT, "args_set(NULL args)");
    if (strstr(flashattn_last_error(), "args") == NULL || strstr(flashattn_last_error(), "operator") != NULL)
        finding("args_set(NULL): message '%s' does not name 'args' or names a C++ operator", flashattn_last_error());
    if (untouched != (const void *)(uintptr_t)0x77) finding("args_get with NULL args wrote its output");
    flashattn_args_destroy(a);
    flashattn_args_destroy(NULL);
}

/* ---- Layouts and buffers ---------------------------------------------------------------------- */

/* A tensor [batch][rows][heads][dim] (varlen: [rows][heads][dim], batch stride unused). */
typedef struct layout {
    int64_t bs, rs, hs, batch, rows, heads, dim;
    int64_t elems; /* the span the strides reach; -1 when above kMaxElems */
} layout;

static layout layout_from_plan(const flashattn_plan_t *plan, flashattn_i64_param_t batch_key, int varlen, int64_t batch,
                          int64_t rows, int64_t heads, int64_t dim) {
    layout l = {0, 0, 0, varlen ? 1 : batch, rows, heads, dim, -1};
    if (flashattn_plan_get_i64(plan, batch_key, &l.bs) != FLASHATTN_SUCCESS ||
        flashattn_plan_get_i64(plan, (flashattn_i64_param_t)(batch_key + 1), &l.rs) != FLASHATTN_SUCCESS ||
        flashattn_plan_get_i64(plan, (flashattn_i64_param_t)(batch_key + 2), &l.hs) != FLASHATTN_SUCCESS)
        finding("get_i64 of a stride key failed on a finalized plan");
    if (varlen) l.bs = 0;
    if (l.rs < 1 || l.hs < 1 || (!varlen && l.bs < 1))
        finding("finalized plan reports a stride below 1 (%lld, %lld, %lld)", (long long)l.bs, (long long)l.rs,
                (long long)l.hs);
    if (l.batch <= 0 || l.rows < 0 || l.heads <= 0 || dim <= 0) return l;
    if (l.rows == 0) {
        l.elems = 0;
        return l;
    }
    const __int128 span = (__int128)(l.batch - 1) * l.bs + (__int128)(l.rows - 1) * l.rs + (__int128)(l.heads - 1) * l.hs + dim;
    if (span <= kMaxElems) l.elems = (int64_t)span;
    return l;
}

static int64_t offset_of(const layout *l, int64_t b, int64_t row, int64_t h) { return b * l->bs + row * l->rs + h * l->hs; }

typedef struct tensor {
    layout l;
    unsigned char *buf; /* exactly elems * esize bytes (at least 1) */
    unsigned char *snapshot;
    unsigned char *inside; /* 1 per element the layout covers */
    size_t bytes;
    int overlaps_itself;  /* two logical elements at one address */
} tensor;

static void tensor_alloc(tensor *t, const layout *l, size_t esize) {
    memset(t, 0, sizeof *t);
    t->l = *l;
    t->bytes = (size_t)l->elems * esize;
    const size_t alloc = t->bytes ? t->bytes : 1;
    void *p = NULL;
    if (posix_memalign(&p, 64, alloc) != 0) finding("out of memory");
    t->buf = p;
    t->snapshot = malloc(alloc);
    t->inside = calloc((size_t)l->elems + 1, 1);
    for (int64_t b = 0; b < l->batch; ++b)
        for (int64_t r = 0; r < l->rows; ++r)
            for (int64_t h = 0; h < l->heads; ++h)
                for (int64_t c = 0; c < l->dim; ++c) {
                    const int64_t at = offset_of(l, b, r, h) + c;
                    if (t->inside[at]) t->overlaps_itself = 1;
                    t->inside[at] = 1;
                }
}

static void tensor_free(tensor *t) {
    free(t->buf);
    free(t->snapshot);
    free(t->inside);
}

static void tensor_save(tensor *t) { memcpy(t->snapshot, t->buf, t->bytes); }

static void tensor_expect_unchanged(const tensor *t, const char *name, const char *call) {
    if (memcmp(t->snapshot, t->buf, t->bytes) != 0) finding("%s: %s changed", call, name);
}

/* ---- The resolved problem --------------------------------------------------------------------- */

typedef struct problem {
    int64_t batch, sq, sk, hq, hk, d, dv, wl, wr, tq, tk;
    flashattn_dtype_t dtype;
    int causal, varlen;
    double scale, softcap;
    int64_t len_q[kMaxBatchRun], len_k[kMaxBatchRun], start_q[kMaxBatchRun], start_k[kMaxBatchRun];
    int32_t cu_q[kMaxBatchRun + 1], cu_k[kMaxBatchRun + 1];
    int cu_valid;
} problem;

static int64_t get_key(const flashattn_plan_t *plan, flashattn_i64_param_t key) {
    int64_t v = 0;
    if (flashattn_plan_get_i64(plan, key, &v) != FLASHATTN_SUCCESS) finding("get_i64(%d) failed on a finalized plan", key);
    return v;
}

/* Batch strides: ignored (so not checked) for variable length. */
static int is_batch_stride_key(int key) {
    return key == FLASHATTN_I64_Q_BATCH_STRIDE || key == FLASHATTN_I64_K_BATCH_STRIDE || key == FLASHATTN_I64_V_BATCH_STRIDE ||
           key == FLASHATTN_I64_O_BATCH_STRIDE || key == FLASHATTN_I64_DO_BATCH_STRIDE ||
           key == FLASHATTN_I64_DQ_BATCH_STRIDE || key == FLASHATTN_I64_DK_BATCH_STRIDE || key == FLASHATTN_I64_DV_BATCH_STRIDE;
}

/* What finalize may store instead of the value set (the header's rules): a window of at least
 * seqlen_q + seqlen_k becomes -1; a varlen maximum above its total becomes the total. */
static int documented_resolution(const problem *p, int key, int64_t set, int64_t got) {
    if (got == set) return 1;
    if ((key == FLASHATTN_I64_WINDOW_LEFT || key == FLASHATTN_I64_WINDOW_RIGHT) && got == -1)
        return (__int128)set >= (__int128)p->sq + p->sk;
    /* (never below 1, a size's minimum: a batch of empty sequences keeps maxima of 1) */
    if (p->varlen && key == FLASHATTN_I64_SEQLEN_Q) return got == (p->tq > 1 ? p->tq : 1) && set > got;
    if (p->varlen && key == FLASHATTN_I64_SEQLEN_K) return got == (p->tk > 1 ? p->tk : 1) && set > got;
    return 0;
}

/* The resolved values of a finalized plan, checked against what was set and the documented defaults. */
static void read_problem(const flashattn_plan_t *plan, const shadow *sh, problem *p) {
    memset(p, 0, sizeof *p);
    p->batch = get_key(plan, FLASHATTN_I64_BATCH);
    p->sq = get_key(plan, FLASHATTN_I64_SEQLEN_Q);
    p->sk = get_key(plan, FLASHATTN_I64_SEQLEN_K);
    p->hq = get_key(plan, FLASHATTN_I64_HEADS_Q);
    p->hk = get_key(plan, FLASHATTN_I64_HEADS_KV);
    p->d = get_key(plan, FLASHATTN_I64_HEAD_DIM);
    p->dv = get_key(plan, FLASHATTN_I64_HEAD_DIM_V);
    p->dtype = (flashattn_dtype_t)get_key(plan, FLASHATTN_I64_DTYPE);
    p->causal = (int)get_key(plan, FLASHATTN_I64_CAUSAL);
    p->wl = get_key(plan, FLASHATTN_I64_WINDOW_LEFT);
    p->wr = get_key(plan, FLASHATTN_I64_WINDOW_RIGHT);
    p->varlen = (int)get_key(plan, FLASHATTN_I64_VARLEN);
    p->tq = p->varlen ? get_key(plan, FLASHATTN_I64_TOTAL_Q) : 0;
    p->tk = p->varlen ? get_key(plan, FLASHATTN_I64_TOTAL_K) : 0;
    for (int64_t i = 0; i < N_KNOWN_KEYS; ++i) {
        const int key = kKnownKeys[i];
        /* Not compared: what a plan ignores (batch strides of varlen plans, totals of fixed-length
         * ones) and the backend (resolved from auto). */
        const int ignored = (p->varlen && is_batch_stride_key(key)) || key == FLASHATTN_I64_BACKEND ||
                            (!p->varlen && (key == FLASHATTN_I64_TOTAL_Q || key == FLASHATTN_I64_TOTAL_K));
        if (sh->set[key] && !ignored && !documented_resolution(p, key, sh->value[key], get_key(plan, (flashattn_i64_param_t)key)))
            finding("key %d was set to %lld, the finalized plan reports %lld", key, (long long)sh->value[key],
                    (long long)get_key(plan, (flashattn_i64_param_t)key));
    }
    if (!sh->set[FLASHATTN_I64_HEADS_KV] && p->hk != p->hq) finding("heads_kv did not default to heads_q");
    if (!sh->set[FLASHATTN_I64_HEAD_DIM_V] && p->dv != p->d) finding("head_dim_v did not default to head_dim");
    if (flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &p->scale) != FLASHATTN_SUCCESS ||
        flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTCAP, &p->softcap) != FLASHATTN_SUCCESS)
        finding("get_f64 failed on a finalized plan");
    const double default_scale = 1.0 / sqrt((double)p->d);
    if (sh->scale_set ? p->scale != sh->scale : fabs(p->scale - default_scale) > 1e-15 * default_scale)
        finding("softmax scale resolved to %.17g", p->scale);
    if (p->softcap != (sh->softcap_set ? sh->softcap : 0.0)) finding("softcap reported as %g", p->softcap);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    if (flashattn_plan_get_backend(plan, &backend, &reason) != FLASHATTN_SUCCESS || backend != FLASHATTN_BACKEND_CPU ||
        reason == NULL || reason[0] == '\0')
        finding("a finalized plan of a CPU-only build runs backend %d, reason '%s'", backend, reason ? reason : "(null)");
}

/* ---- The double-precision reference ------------------------------------------------------------ */

/* The documented mask rule, without overflow for any window value. */
static int visible(const problem *p, int64_t i, int64_t j, int64_t sq, int64_t sk) {
    const __int128 diag = (__int128)i + sk - sq;
    if (p->causal && j > diag) return 0;
    if (p->wl >= 0 && (__int128)j < diag - p->wl) return 0;
    if (p->wr >= 0 && (__int128)j > diag + p->wr) return 0;
    return 1;
}

static double load(const problem *p, const tensor *t, int64_t b, int64_t row, int64_t h, int64_t c) {
    return test_load(p->dtype, t->buf + (size_t)(offset_of(&t->l, b, row, h) + c) * test_dtype_size(p->dtype));
}

/* Tensors are indexed (b, row) with row the sequence's own row for fixed length; for varlen the
 * batch index is 0 and the row the packed token. */
static int64_t qrow(const problem *p, int64_t b, int64_t i) { return p->varlen ? p->start_q[b] + i : i; }
static int64_t krow(const problem *p, int64_t b, int64_t j) { return p->varlen ? p->start_k[b] + j : j; }
static int64_t tb(const problem *p, int64_t b) { return p->varlen ? 0 : b; }

/* One query row's scores: s[j] (-inf where masked; NaN where a NaN input takes part), and the
 * bound on how far the library's fp32 score of each visible key may be from s[j] (accumulation and
 * rounding of the scaled dot product, and of the softcap's tanh). Returns the number of visible keys. */
static int64_t row_scores(const problem *p, const tensor *q, const tensor *k, int64_t b, int64_t i, int64_t h, double *s,
                          double *t_out, double *delta) {
    const int64_t kh = h / (p->hq / p->hk), sq = p->len_q[b], sk = p->len_k[b];
    int64_t seen = 0;
    *delta = 0.0;
    for (int64_t j = 0; j < sk; ++j) {
        s[j] = -INFINITY;
        if (!visible(p, i, j, sq, sk)) continue;
        double dot = 0.0, mag = 0.0;
        for (int64_t c = 0; c < p->d; ++c) {
            const double x = load(p, q, tb(p, b), qrow(p, b, i), h, c) * load(p, k, tb(p, b), krow(p, b, j), kh, c);
            dot += x;
            mag += fabs(x);
        }
        double u = p->scale * dot, err = p->scale * mag * (double)(p->d + 4) * ldexp(1.0, -23);
        if (p->softcap > 0.0) {
            const double t = tanh(u / p->softcap);
            if (t_out) t_out[j] = t;
            u = p->softcap * t;
            err += p->softcap * 4.0 * ldexp(1.0, -23);
        }
        s[j] = u;
        if (err > *delta) *delta = err; /* NaN errors (NaN inputs) leave delta as it is */
        ++seen;
    }
    return seen;
}

/* LSE of the visible scores: -inf when none, NaN when one is NaN (the header's NaN rule). */
static double row_lse(const double *s, int64_t n) {
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
        if (isnan(s[j])) return NAN;
        if (s[j] > m) m = s[j];
    }
    if (m == -INFINITY) return -INFINITY;
    for (int64_t j = 0; j < n; ++j)
        if (s[j] != -INFINITY) sum += exp(s[j] - m);
    return m + log(sum);
}

/* The O tolerance of a dtype, relative to max |V| of the row's visible keys. */
static double o_rtol(flashattn_dtype_t dtype) {
    return dtype == FLASHATTN_DTYPE_FP32 ? 2e-5 : dtype == FLASHATTN_DTYPE_FP16 ? 4e-3 : 3e-2;
}

/* ---- The forward ------------------------------------------------------------------------------ */

typedef struct run_buffers {
    tensor q, k, v, o, dout, dq, dk, dv;
    float *lse;
    size_t lse_count;
    unsigned char *lse_snapshot;
} run_buffers;

/* The poison is a NaN too: an expected NaN must not be the poison left in place. */
static int o_is_poison(const problem *p, const run_buffers *rb, int64_t b, int64_t i, int64_t h, int64_t c) {
    return test_is_poison(p->dtype, rb->o.buf + (size_t)(offset_of(&rb->o.l, tb(p, b), qrow(p, b, i), h) + c) *
                                                    test_dtype_size(p->dtype));
}

static void check_o_row(const problem *p, const run_buffers *rb, int64_t b, int64_t i, int64_t h, double *s) {
    double delta = 0.0;
    const int64_t kh = h / (p->hq / p->hk), sk = p->len_k[b];
    const int64_t seen = row_scores(p, &rb->q, &rb->k, b, i, h, s, NULL, &delta);
    const double lse = row_lse(s, sk);
    const size_t lse_at = p->varlen ? (size_t)(h * p->tq + p->start_q[b] + i) : (size_t)((b * p->hq + h) * p->sq + i);
    const double got_lse = rb->lse[lse_at];
    if (test_is_poison(FLASHATTN_DTYPE_FP32, (const unsigned char *)&rb->lse[lse_at]))
        finding("row (b %lld, i %lld, h %lld): LSE was not written", (long long)b, (long long)i, (long long)h);
    if (seen == 0) {
        if (got_lse != -INFINITY) finding("row (b %lld, i %lld, h %lld) sees no key: LSE %g, not -inf", (long long)b, (long long)i, (long long)h, got_lse);
        for (int64_t c = 0; c < p->dv; ++c)
            if (load(p, &rb->o, tb(p, b), qrow(p, b, i), h, c) != 0.0)
                finding("row (b %lld, i %lld, h %lld) sees no key: O[%lld] = %g, not 0", (long long)b, (long long)i,
                        (long long)h, (long long)c, load(p, &rb->o, tb(p, b), qrow(p, b, i), h, c));
        return;
    }
    if (isnan(lse)) {
        /* A NaN in the query row or in a key it sees: the whole row is NaN. */
        if (!isnan(got_lse)) finding("row (b %lld, i %lld, h %lld) meets a NaN in Q or K: LSE %g, not NaN", (long long)b, (long long)i, (long long)h, got_lse);
        for (int64_t c = 0; c < p->dv; ++c)
            if (!isnan(load(p, &rb->o, tb(p, b), qrow(p, b, i), h, c)) || o_is_poison(p, rb, b, i, h, c))
                finding("row (b %lld, i %lld, h %lld) meets a NaN in Q or K: O[%lld] = %g, not NaN", (long long)b, (long long)i,
                        (long long)h, (long long)c, load(p, &rb->o, tb(p, b), qrow(p, b, i), h, c));
        return;
    }
    /* Softmax weights move by at most a factor exp(2 delta) when every score moves by delta. */
    const double spread = expm1(2.0 * fmin(delta, 300.0));
    const double lse_tol = 2e-4 * (1.0 + fabs(lse)) + 2.0 * delta;
    if (!(fabs(got_lse - lse) <= lse_tol) && !(isinf(got_lse) && fabs(lse) > FLT_MAX * 0.5))
        finding("row (b %lld, i %lld, h %lld): LSE %.9g, reference %.9g (tolerance %.3g; %s, scale %g, softcap %g, "
                "%lld keys seen of %lld)", (long long)b, (long long)i, (long long)h, got_lse, lse, lse_tol,
                test_dtype_name(p->dtype), p->scale, p->softcap, (long long)seen, (long long)sk);
    for (int64_t c = 0; c < p->dv; ++c) {
        double ref = 0.0, vmax = 0.0, lo = INFINITY, hi = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
            if (s[j] == -INFINITY) continue;
            const double vj = load(p, &rb->v, tb(p, b), krow(p, b, j), kh, c);
            ref += exp(s[j] - lse) * vj;
            if (fabs(vj) > vmax) vmax = fabs(vj);
            if (vj < lo) lo = vj;
            if (vj > hi) hi = vj;
        }
        const double got = load(p, &rb->o, tb(p, b), qrow(p, b, i), h, c);
        if (isnan(ref)) { /* a NaN in this column of a value row it sees */
            if (!isnan(got) || o_is_poison(p, rb, b, i, h, c)) finding("row (b %lld, i %lld, h %lld) sees a NaN in V column %lld: O = %g, not NaN", (long long)b, (long long)i, (long long)h, (long long)c, got);
            continue;
        }
        const double tol = vmax * (o_rtol(p->dtype) + spread) + 1e-30;
        const double hull_tol = vmax * o_rtol(p->dtype) + 1e-30;
        if (!(fabs(got - ref) <= tol) || got < lo - hull_tol || got > hi + hull_tol)
            finding("row (b %lld, i %lld, h %lld) O[%lld] = %.9g, reference %.9g (tolerance %.3g, visible V in [%g, %g], "
                    "%s, scale %g, softcap %g)",
                    (long long)b, (long long)i, (long long)h, (long long)c, got, ref, tol, lo, hi,
                    test_dtype_name(p->dtype), p->scale, p->softcap);
    }
}

/* Every element of O inside the layout was checked row by row; outside it the poison stays. */
static void check_gaps(const problem *p, const tensor *t, const char *name) {
    const size_t esize = test_dtype_size(p->dtype);
    for (int64_t e = 0; e < t->l.elems; ++e)
        if (!t->inside[e] && !test_is_poison(p->dtype, t->buf + (size_t)e * esize))
            finding("%s: element %lld between rows or heads (a stride gap) was written", name, (long long)e);
}

/* Every row of O and LSE (the call wrote LSE), then O's gaps. */
static void check_forward(const problem *p, const run_buffers *rb) {
    double *s = malloc(sizeof(double) * (size_t)(p->sk + 1));
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->hq; ++h)
            for (int64_t i = 0; i < p->len_q[b]; ++i) {
                check_o_row(p, rb, b, i, h, s);
                ++stats.rows_checked;
            }
    free(s);
    check_gaps(p, &rb->o, "O");
}

/* ---- Building the plan from the input ---------------------------------------------------------- */

/* A mostly valid small problem; the mutations that follow break it in every way. */
static void build_base(flashattn_plan_t *plan, shadow *sh, input *in, int32_t *lens_q, int32_t *lens_k,
                       int64_t *batch_out) {
    const int64_t batch = 1 + take_below(in, 4);
    const int64_t sq = 1 + take_below(in, 12), sk = 1 + take_below(in, 12);
    const int64_t hk = 1 + take_below(in, 3), group = 1 + take_below(in, 3);
    const int64_t d = 8 * (1 + take_below(in, 5)), dv = 8 * (1 + take_below(in, 5));
    static const flashattn_dtype_t dtypes[] = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16};
    const unsigned flags = take8(in);
    set_i64(plan, sh, FLASHATTN_I64_BATCH, batch);
    set_i64(plan, sh, FLASHATTN_I64_SEQLEN_Q, sq);
    set_i64(plan, sh, FLASHATTN_I64_SEQLEN_K, sk);
    set_i64(plan, sh, FLASHATTN_I64_HEADS_Q, hk * group);
    if (flags & 1) set_i64(plan, sh, FLASHATTN_I64_HEADS_KV, hk);
    set_i64(plan, sh, FLASHATTN_I64_HEAD_DIM, d);
    if (flags & 2) set_i64(plan, sh, FLASHATTN_I64_HEAD_DIM_V, dv);
    set_i64(plan, sh, FLASHATTN_I64_DTYPE, dtypes[take_below(in, 3)]);
    if (flags & 4) set_i64(plan, sh, FLASHATTN_I64_CAUSAL, 1);
    if (flags & 8) set_i64(plan, sh, FLASHATTN_I64_WINDOW_LEFT, take_below(in, 10) - 1);
    if (flags & 16) set_i64(plan, sh, FLASHATTN_I64_WINDOW_RIGHT, take_below(in, 10) - 1);
    if (flags & 32) set_f64(plan, sh, FLASHATTN_F64_SOFTCAP, 0.5 + (double)take_below(in, 60));
    if (flags & 64) set_f64(plan, sh, FLASHATTN_F64_SOFTMAX_SCALE, 0.05 * (double)(1 + take_below(in, 40)));
    *batch_out = batch;
    int64_t total_q = 0, total_k = 0;
    for (int64_t b = 0; b < batch; ++b) {
        lens_q[b] = (int32_t)take_below(in, sq + 1);
        lens_k[b] = (int32_t)take_below(in, sk + 1);
        total_q += lens_q[b];
        total_k += lens_k[b];
    }
    if (flags & 128) {
        set_i64(plan, sh, FLASHATTN_I64_VARLEN, 1);
        set_i64(plan, sh, FLASHATTN_I64_TOTAL_Q, total_q);
        set_i64(plan, sh, FLASHATTN_I64_TOTAL_K, total_k);
    }
    /* Padded strides for some tensors: the gaps must keep the poison. */
    const int pads = (int)take_below(in, 4);
    for (int i = 0; i < pads; ++i) {
        static const flashattn_i64_param_t heads_keys[] = {
            FLASHATTN_I64_Q_HEAD_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE,
            FLASHATTN_I64_O_HEAD_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE,
            FLASHATTN_I64_DK_HEAD_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE};
        const flashattn_i64_param_t hkey = heads_keys[take_below(in, 8)];
        const int64_t dim = (hkey == FLASHATTN_I64_V_HEAD_STRIDE || hkey == FLASHATTN_I64_O_HEAD_STRIDE ||
                             hkey == FLASHATTN_I64_DO_HEAD_STRIDE || hkey == FLASHATTN_I64_DV_HEAD_STRIDE)
                                ? ((flags & 2) ? dv : d)
                                : d;
        const int64_t heads = (hkey == FLASHATTN_I64_K_HEAD_STRIDE || hkey == FLASHATTN_I64_V_HEAD_STRIDE ||
                               hkey == FLASHATTN_I64_DK_HEAD_STRIDE || hkey == FLASHATTN_I64_DV_HEAD_STRIDE)
                                  ? ((flags & 1) ? hk : hk * group)
                                  : hk * group;
        const int64_t head_stride = dim + take_below(in, 3);
        const int64_t row_stride = heads * head_stride + take_below(in, 5);
        set_i64(plan, sh, hkey, head_stride);
        set_i64(plan, sh, (flashattn_i64_param_t)(hkey - 1), row_stride);
        if (take8(in) & 1) {
            const int64_t rows = (hkey == FLASHATTN_I64_K_HEAD_STRIDE || hkey == FLASHATTN_I64_V_HEAD_STRIDE ||
                                  hkey == FLASHATTN_I64_DK_HEAD_STRIDE || hkey == FLASHATTN_I64_DV_HEAD_STRIDE)
                                     ? sk
                                     : sq;
            set_i64(plan, sh, (flashattn_i64_param_t)(hkey - 2), rows * row_stride + take_below(in, 3));
        }
    }
    if (take8(in) & 1) set_i64(plan, sh, FLASHATTN_I64_DETERMINISTIC, 1);
}

/* Setters with edge values on known keys, and getters. */
static void mutate(flashattn_plan_t *plan, shadow *sh, input *in) {
    const int64_t count = take_below(in, kMaxMutations + 1);
    for (int64_t m = 0; m < count; ++m) {
        const unsigned op = take8(in) % 4;
        if (op == 0 || op == 1) {
            const flashattn_i64_param_t key = take_key(in);
            int64_t value = take_i64_value(in);
            if (avoid_known() && key == FLASHATTN_I64_BATCH && value > 64) value = 64;
            set_i64(plan, sh, key, value);
        } else if (op == 2) {
            const flashattn_f64_param_t key = (take8(in) & 1) ? FLASHATTN_F64_SOFTCAP : FLASHATTN_F64_SOFTMAX_SCALE;
            set_f64(plan, sh, key, take_f64_value(in));
        } else {
            int64_t v = INT64_C(0x77);
            const flashattn_i64_param_t key = kKnownKeys[take_below(in, N_KNOWN_KEYS)];
            if (flashattn_plan_get_i64(plan, key, &v) != FLASHATTN_SUCCESS) finding("get_i64 of known key %d failed", key);
            if (sh->set[key] && !sh->finalized && v != sh->value[key])
                finding("key %d set to %lld reads back %lld before finalize", key, (long long)sh->value[key], (long long)v);
        }
    }
}

/* ---- Running ------------------------------------------------------------------------------------ */

static void fill_inputs(const problem *p, tensor *t, uint64_t seed, double magnitude) {
    test_rng rng;
    test_rng_seed(&rng, seed);
    const size_t esize = test_dtype_size(p->dtype);
    for (int64_t e = 0; e < t->l.elems; ++e)
        test_store(p->dtype, t->buf + (size_t)e * esize, magnitude * test_rng_uniform(&rng, -1.0, 1.0));
    tensor_save(t);
}

/* cu_seqlens from the lengths; valid unless corrupted below. */
static void pack_sequences(problem *p, const int32_t *lens_q, const int32_t *lens_k) {
    int64_t aq = 0, ak = 0;
    p->cu_q[0] = p->cu_k[0] = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        p->len_q[b] = p->varlen ? lens_q[b] : p->sq;
        p->len_k[b] = p->varlen ? lens_k[b] : p->sk;
        p->start_q[b] = aq;
        p->start_k[b] = ak;
        aq += p->len_q[b];
        ak += p->len_k[b];
        p->cu_q[b + 1] = (int32_t)aq;
        p->cu_k[b + 1] = (int32_t)ak;
    }
    p->cu_valid = 1;
}

/* The documented cu_seqlens rules, checked here independently. */
static int cu_seqlens_valid(const problem *p, const int32_t *cq, const int32_t *ck) {
    if (cq[0] != 0 || ck[0] != 0 || cq[p->batch] != p->tq || ck[p->batch] != p->tk) return 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        if (cq[b + 1] < cq[b] || ck[b + 1] < ck[b]) return 0;
        if (cq[b + 1] - cq[b] > p->sq || ck[b + 1] - ck[b] > p->sk) return 0;
    }
    return 1;
}

static void outputs_poison(const problem *p, run_buffers *rb, int backward) {
    if (!backward) {
        test_poison(p->dtype, rb->o.buf, rb->o.bytes);
        test_poison(FLASHATTN_DTYPE_FP32, rb->lse, rb->lse_count * 4);
    } else {
        test_poison(p->dtype, rb->dq.buf, rb->dq.bytes);
        test_poison(p->dtype, rb->dk.buf, rb->dk.bytes);
        test_poison(p->dtype, rb->dv.buf, rb->dv.bytes);
        tensor_save(&rb->dq);
        tensor_save(&rb->dk);
        tensor_save(&rb->dv);
        return;
    }
    tensor_save(&rb->o);
    memcpy(rb->lse_snapshot, rb->lse, rb->lse_count * 4);
}

static void inputs_unchanged(const run_buffers *rb, int backward, const char *call) {
    tensor_expect_unchanged(&rb->q, "input Q", call);
    tensor_expect_unchanged(&rb->k, "input K", call);
    tensor_expect_unchanged(&rb->v, "input V", call);
    if (backward) {
        tensor_expect_unchanged(&rb->o, "input O", call);
        tensor_expect_unchanged(&rb->dout, "input dO", call);
        if (memcmp(rb->lse_snapshot, rb->lse, rb->lse_count * 4) != 0) finding("%s: input LSE changed", call);
    }
}

static void nothing_written(const run_buffers *rb, int backward, const char *call) {
    if (!backward) {
        tensor_expect_unchanged(&rb->o, "O", call);
        if (memcmp(rb->lse_snapshot, rb->lse, rb->lse_count * 4) != 0) finding("%s failed but wrote LSE", call);
    } else {
        tensor_expect_unchanged(&rb->dq, "dQ", call);
        tensor_expect_unchanged(&rb->dk, "dK", call);
        tensor_expect_unchanged(&rb->dv, "dV", call);
    }
}

/* What a call is given, and which argument the input chose to break. */
typedef enum breakage {
    BREAK_NONE, BREAK_WRONG_ENTRY, BREAK_NULL_TENSOR, BREAK_SHORT_WORKSPACE, BREAK_OUTPUT_OVER_INPUT,
    BREAK_LSE_OVER_OUTPUT, BREAK_CU_SEQLENS, BREAK_NO_LSE, BREAK_UNUSED_POINTER, BREAK_COUNT
} breakage;

static const char *break_name(breakage b) {
    static const char *names[] = {"none", "wrong entry point", "NULL tensor", "short workspace", "output over input",
                                  "LSE over output", "bad cu_seqlens", "no LSE", "a pointer the pass does not use"};
    return names[b];
}

/* Pointers a pass of this model's plans never uses (no serving or variant keys are set): the
 * argument set must refuse them. The forward's list, then the backward's. */
static const flashattn_arg_t kUnusedForward[] = {
    FLASHATTN_ARG_DOUT, FLASHATTN_ARG_DQ, FLASHATTN_ARG_DK, FLASHATTN_ARG_DV, FLASHATTN_ARG_DSINK_LOGITS,
    FLASHATTN_ARG_PAGE_TABLE, FLASHATTN_ARG_SEQUSED_K, FLASHATTN_ARG_K_NEW, FLASHATTN_ARG_V_NEW,
    FLASHATTN_ARG_ROTARY_COS, FLASHATTN_ARG_ROTARY_SIN, FLASHATTN_ARG_SINK_LOGITS, FLASHATTN_ARG_ALIBI_SLOPES};
static const flashattn_arg_t kUnusedBackward[] = {
    FLASHATTN_ARG_PAGE_TABLE, FLASHATTN_ARG_SEQUSED_K, FLASHATTN_ARG_K_NEW, FLASHATTN_ARG_V_NEW,
    FLASHATTN_ARG_ROTARY_COS, FLASHATTN_ARG_ROTARY_SIN, FLASHATTN_ARG_SINK_LOGITS, FLASHATTN_ARG_ALIBI_SLOPES,
    FLASHATTN_ARG_DSINK_LOGITS};
static float g_unused_target[1024]; /* what such a pointer points at (never read or written) */

typedef struct call_args {
    const void *q, *k, *v;
    void *o;
    float *lse;
    void *ws;
    size_t ws_bytes;
    const int32_t *cu_q, *cu_k;
    int varlen_entry;          /* through an argument set: whether the cu_seqlens are set */
    int via_args;              /* flashattn_plan_execute_args / _backward_args */
    int null_args;             /* ... with a NULL argument set */
    flashattn_arg_t extra;     /* ... with this pointer set too (0: none) */
    flashattn_status_t expect; /* SUCCESS, or the status the breakage must give */
} call_args;

static void *workspace_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) finding("out of memory");
    return p;
}

/* `backward`: the unused pointer comes from the backward's list. */
static call_args forward_args(const problem *p, run_buffers *rb, breakage br, void *ws, size_t ws_need, int32_t *bad_q,
                              int32_t *bad_k, input *in, int via_args, int backward) {
    call_args a = {rb->q.buf, rb->k.buf, rb->v.buf, rb->o.buf, rb->lse, ws, ws_need, p->cu_q, p->cu_k, p->varlen,
                   via_args, 0, (flashattn_arg_t)0, FLASHATTN_SUCCESS};
    switch (br) {
    case BREAK_WRONG_ENTRY:
        /* Through an argument set: cu_seqlens set on a fixed-length plan, or missing on a varlen one. */
        a.varlen_entry = !p->varlen;
        a.expect = via_args ? FLASHATTN_ERROR_INVALID_ARGUMENT : FLASHATTN_ERROR_INVALID_STATE;
        break;
    case BREAK_NULL_TENSOR: {
        const int which = (int)take_below(in, 5);
        if (which == 0) a.q = NULL; else if (which == 1) a.k = NULL; else if (which == 2) a.v = NULL;
        else if (which == 3 || !via_args) a.o = NULL; else a.null_args = 1;
        a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        break;
    }
    case BREAK_UNUSED_POINTER:
        if (via_args) {
            a.extra = backward ? kUnusedBackward[take_below(in, (int64_t)(sizeof kUnusedBackward / sizeof kUnusedBackward[0]))]
                               : kUnusedForward[take_below(in, (int64_t)(sizeof kUnusedForward / sizeof kUnusedForward[0]))];
            a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        }
        break;
    case BREAK_SHORT_WORKSPACE:
        if (ws_need > 0) {
            a.ws_bytes = ws_need - 1 - (size_t)take_below(in, (int64_t)(ws_need < 200 ? ws_need : 200));
            a.expect = FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE;
        }
        break;
    case BREAK_OUTPUT_OVER_INPUT:
        if (rb->o.bytes > 0 && rb->q.bytes >= rb->o.bytes) {
            a.o = rb->q.buf;
            a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        }
        break;
    case BREAK_LSE_OVER_OUTPUT:
        if (rb->o.bytes >= rb->lse_count * 4 && rb->lse_count > 0 && rb->o.bytes > 0) {
            a.lse = (float *)rb->o.buf;
            a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        }
        break;
    case BREAK_CU_SEQLENS:
        if (p->varlen) {
            memcpy(bad_q, p->cu_q, sizeof(int32_t) * (size_t)(p->batch + 1));
            memcpy(bad_k, p->cu_k, sizeof(int32_t) * (size_t)(p->batch + 1));
            int32_t *arr = (take8(in) & 1) ? bad_q : bad_k;
            arr[take_below(in, p->batch + 1)] += (int32_t)take_below(in, 7) - 3;
            /* A change that is still valid moves sequence boundaries the reference would not know:
             * only invalid arrays are passed. */
            if (!cu_seqlens_valid(p, bad_q, bad_k)) {
                a.cu_q = bad_q;
                a.cu_k = bad_k;
                a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
            }
        }
        break;
    case BREAK_NO_LSE: a.lse = NULL; break;
    default: break;
    }
    return a;
}

/* A fresh argument set with the call's pointers (a NULL one is left unset). */
static flashattn_args_t *args_of(const call_args *a) {
    flashattn_args_t *x = NULL;
    if (flashattn_args_create(&x) != FLASHATTN_SUCCESS || x == NULL) finding("flashattn_args_create failed");
    const struct { flashattn_arg_t which; const void *ptr; } all[] = {
        {FLASHATTN_ARG_Q, a->q}, {FLASHATTN_ARG_K, a->k}, {FLASHATTN_ARG_V, a->v},
        {FLASHATTN_ARG_CU_SEQLENS_Q, a->varlen_entry ? a->cu_q : NULL},
        {FLASHATTN_ARG_CU_SEQLENS_K, a->varlen_entry ? a->cu_k : NULL},
        {a->extra, a->extra ? (const void *)g_unused_target : NULL}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        if (all[i].ptr != NULL && flashattn_args_set(x, all[i].which, all[i].ptr) != FLASHATTN_SUCCESS)
            finding("args_set(%d) of a flashattn_arg_t value failed", all[i].which);
    ++stats.via_args;
    return x;
}

static void args_put(flashattn_args_t *x, flashattn_arg_t which, const void *ptr) {
    if (ptr != NULL && flashattn_args_set(x, which, ptr) != FLASHATTN_SUCCESS) finding("args_set(%d) failed", which);
}

static flashattn_status_t call_forward(const flashattn_plan_t *plan, const call_args *a) {
    if (a->via_args) {
        flashattn_args_t *x = args_of(a);
        args_put(x, FLASHATTN_ARG_O, a->o);
        args_put(x, FLASHATTN_ARG_LSE, a->lse);
        const flashattn_status_t s = flashattn_plan_execute_args(plan, a->null_args ? NULL : x, a->ws, a->ws_bytes, NULL);
        flashattn_args_destroy(x);
        return s;
    }
    if (a->varlen_entry)
        return flashattn_plan_execute_varlen(plan, a->q, a->k, a->v, a->o, a->lse, a->cu_q, a->cu_k, a->ws, a->ws_bytes, NULL);
    return flashattn_plan_execute(plan, a->q, a->k, a->v, a->o, a->lse, a->ws, a->ws_bytes, NULL);
}

/* ---- The backward's reference and check -------------------------------------------------------- */

static double grad_rtol(flashattn_dtype_t dtype) {
    /* Relative to the terms' magnitude (grad_ref): a few roundings of the dtype, with room. */
    return dtype == FLASHATTN_DTYPE_FP32 ? 2e-5 : dtype == FLASHATTN_DTYPE_FP16 ? 5e-3 : 3e-2;
}

typedef struct grad_ref {
    double *dq, *dk, *dv;       /* [rows][heads][dim] of the packed (varlen) or batch-major rows */
    unsigned char *q_sees, *k_seen;
    double delta;               /* the largest score bound of any row */
    /* The scale of each gradient's rounding errors: the largest sum of the absolute values of the
     * terms an element adds up. dS = P (dP - D) cancels, and D comes from O in the dtype (as in
     * FlashAttention), so a gradient may be far smaller than its terms. */
    double mag_q, mag_k, mag_v;
} grad_ref;

static size_t qi(const problem *p, int64_t b, int64_t i, int64_t h, int64_t dim) {
    const int64_t row = p->varlen ? p->start_q[b] + i : b * p->sq + i;
    return (size_t)((row * p->hq + h) * dim);
}
static size_t ki(const problem *p, int64_t b, int64_t j, int64_t h, int64_t dim) {
    const int64_t row = p->varlen ? p->start_k[b] + j : b * p->sk + j;
    return (size_t)((row * p->hk + h) * dim);
}

/* Naive gradients of L = sum(O * dO) in double, head by head (dK, dV summed over the group). */
static void grad_reference(const problem *p, const run_buffers *rb, grad_ref *g) {
    const int64_t rows_q = p->varlen ? p->tq : p->batch * p->sq, rows_k = p->varlen ? p->tk : p->batch * p->sk;
    g->dq = calloc((size_t)(rows_q * p->hq * p->d) + 1, sizeof(double));
    g->dk = calloc((size_t)(rows_k * p->hk * p->d) + 1, sizeof(double));
    g->dv = calloc((size_t)(rows_k * p->hk * p->dv) + 1, sizeof(double));
    g->q_sees = calloc((size_t)(rows_q * p->hq) + 1, 1);
    g->k_seen = calloc((size_t)(rows_k * p->hk) + 1, 1);
    g->delta = g->mag_q = g->mag_k = g->mag_v = 0.0;
    double *mq = calloc((size_t)(rows_q * p->hq * p->d) + 1, sizeof(double));
    double *mk = calloc((size_t)(rows_k * p->hk * p->d) + 1, sizeof(double));
    double *mv = calloc((size_t)(rows_k * p->hk * p->dv) + 1, sizeof(double));
    double *s = malloc(sizeof(double) * (size_t)(p->sk + 1)), *t = malloc(sizeof(double) * (size_t)(p->sk + 1));
    double *dp = malloc(sizeof(double) * (size_t)(p->sk + 1));
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t h = 0; h < p->hq; ++h) {
            const int64_t kh = h / (p->hq / p->hk);
            for (int64_t i = 0; i < p->len_q[b]; ++i) {
                double delta = 0.0;
                if (row_scores(p, &rb->q, &rb->k, b, i, h, s, t, &delta) == 0) continue;
                if (delta > g->delta) g->delta = delta;
                g->q_sees[qi(p, b, i, h, 1)] = 1;
                const double lse = row_lse(s, p->len_k[b]);
                double dsum = 0.0, dsum_abs = 0.0;
                for (int64_t j = 0; j < p->len_k[b]; ++j) {
                    if (s[j] == -INFINITY) continue;
                    dp[j] = 0.0;
                    double dp_abs = 0.0;
                    for (int64_t c = 0; c < p->dv; ++c) {
                        const double x = load(p, &rb->dout, tb(p, b), qrow(p, b, i), h, c) * load(p, &rb->v, tb(p, b), krow(p, b, j), kh, c);
                        dp[j] += x;
                        dp_abs += fabs(x);
                    }
                    dsum += exp(s[j] - lse) * dp[j];
                    dsum_abs += exp(s[j] - lse) * dp_abs;
                }
                for (int64_t j = 0; j < p->len_k[b]; ++j) {
                    if (s[j] == -INFINITY) continue;
                    const double pij = exp(s[j] - lse);
                    double du = pij * (dp[j] - dsum), du_abs = pij * (fabs(dp[j]) + dsum_abs);
                    if (p->softcap > 0.0) du *= 1.0 - t[j] * t[j];
                    g->k_seen[ki(p, b, j, kh, 1)] = 1;
                    for (int64_t c = 0; c < p->d; ++c) {
                        const double kc = load(p, &rb->k, tb(p, b), krow(p, b, j), kh, c);
                        const double qc = load(p, &rb->q, tb(p, b), qrow(p, b, i), h, c);
                        g->dq[qi(p, b, i, h, p->d) + (size_t)c] += p->scale * du * kc;
                        g->dk[ki(p, b, j, kh, p->d) + (size_t)c] += p->scale * du * qc;
                        mq[qi(p, b, i, h, p->d) + (size_t)c] += p->scale * du_abs * fabs(kc);
                        mk[ki(p, b, j, kh, p->d) + (size_t)c] += p->scale * du_abs * fabs(qc);
                    }
                    for (int64_t c = 0; c < p->dv; ++c) {
                        const double doc = load(p, &rb->dout, tb(p, b), qrow(p, b, i), h, c);
                        g->dv[ki(p, b, j, kh, p->dv) + (size_t)c] += pij * doc;
                        mv[ki(p, b, j, kh, p->dv) + (size_t)c] += pij * fabs(doc);
                    }
                }
            }
        }
    for (int64_t e = 0; e < rows_q * p->hq * p->d; ++e) g->mag_q = fmax(g->mag_q, mq[e]);
    for (int64_t e = 0; e < rows_k * p->hk * p->d; ++e) g->mag_k = fmax(g->mag_k, mk[e]);
    for (int64_t e = 0; e < rows_k * p->hk * p->dv; ++e) g->mag_v = fmax(g->mag_v, mv[e]);
    free(mq);
    free(mk);
    free(mv);
    free(s);
    free(t);
    free(dp);
}

static void grad_free(grad_ref *g) {
    free(g->dq);
    free(g->dk);
    free(g->dv);
    free(g->q_sees);
    free(g->k_seen);
}

/* One gradient tensor against its reference: exact zeros where nothing is seen, the tolerance
 * elsewhere (values only when the scores are well conditioned), the gaps untouched. */
static void check_grad(const problem *p, const tensor *t, const double *ref, const unsigned char *seen, int key_side,
                       int64_t heads, int64_t dim, double delta, double magnitude, const char *name) {
    const double tol = grad_rtol(p->dtype) * magnitude + 1e-6;
    const int values = delta < 1e-4;
    for (int64_t b = 0; b < p->batch; ++b)
        for (int64_t r = 0; r < (key_side ? p->len_k[b] : p->len_q[b]); ++r)
            for (int64_t h = 0; h < heads; ++h) {
                const size_t at = key_side ? ki(p, b, r, h, dim) : qi(p, b, r, h, dim);
                const int s = seen[key_side ? ki(p, b, r, h, 1) : qi(p, b, r, h, 1)];
                const int64_t row = key_side ? krow(p, b, r) : qrow(p, b, r);
                for (int64_t c = 0; c < dim; ++c) {
                    const double got = load(p, t, tb(p, b), row, h, c);
                    if (!s && got != 0.0)
                        finding("%s (b %lld, row %lld, h %lld, col %lld) = %g where nothing is seen (must be 0)", name,
                                (long long)b, (long long)r, (long long)h, (long long)c, got);
                    if (s && values && !(fabs(got - ref[at + (size_t)c]) <= tol))
                        finding("%s (b %lld, row %lld, h %lld, col %lld) = %.9g, reference %.9g (tolerance %.3g, %s)", name,
                                (long long)b, (long long)r, (long long)h, (long long)c, got, ref[at + (size_t)c], tol,
                                test_dtype_name(p->dtype));
                    if (s && !values && test_is_poison(p->dtype, t->buf + (size_t)(offset_of(&t->l, tb(p, b), row, h) + c) *
                                                                            test_dtype_size(p->dtype)))
                        finding("%s (b %lld, row %lld, h %lld, col %lld) was not written", name, (long long)b, (long long)r,
                                (long long)h, (long long)c);
                }
            }
    check_gaps(p, t, name);
}

static flashattn_status_t call_backward(const flashattn_plan_t *plan, const problem *p, const run_buffers *rb,
                                        const call_args *a, const float *lse, void *dq) {
    if (a->via_args) {
        flashattn_args_t *x = args_of(a);
        const struct { flashattn_arg_t which; const void *ptr; } grads[] = {
            {FLASHATTN_ARG_O, rb->o.buf}, {FLASHATTN_ARG_DOUT, rb->dout.buf}, {FLASHATTN_ARG_LSE, lse},
            {FLASHATTN_ARG_DQ, dq}, {FLASHATTN_ARG_DK, rb->dk.buf}, {FLASHATTN_ARG_DV, rb->dv.buf}};
        for (size_t i = 0; i < sizeof grads / sizeof grads[0]; ++i) args_put(x, grads[i].which, grads[i].ptr);
        const flashattn_status_t s =
            flashattn_plan_execute_backward_args(plan, a->null_args ? NULL : x, a->ws, a->ws_bytes, NULL);
        flashattn_args_destroy(x);
        return s;
    }
    if (a->varlen_entry)
        return flashattn_plan_execute_backward_varlen(plan, a->q, a->k, a->v, rb->o.buf, rb->dout.buf, lse, dq, rb->dk.buf,
                                                      rb->dv.buf, a->cu_q, a->cu_k, a->ws, a->ws_bytes, NULL);
    (void)p;
    return flashattn_plan_execute_backward(plan, a->q, a->k, a->v, rb->o.buf, rb->dout.buf, lse, dq, rb->dk.buf, rb->dv.buf,
                                           a->ws, a->ws_bytes, NULL);
}

static void run_backward(const flashattn_plan_t *plan, const problem *p, run_buffers *rb, input *in) {
    flashattn_backend_t bb = (flashattn_backend_t)99;
    if (flashattn_plan_get_backward_backend(plan, &bb, NULL) != FLASHATTN_SUCCESS) {
        expect_message("get_backward_backend");
        if (bb != (flashattn_backend_t)99) finding("get_backward_backend failed but wrote its output");
        return;
    }
    size_t need = (size_t)-1;
    if (flashattn_plan_get_backward_workspace_size(plan, &need) != FLASHATTN_SUCCESS)
        finding("get_backward_workspace_size failed after get_backward_backend succeeded");
    if (need > ((size_t)1 << 28)) return;
    void *ws = workspace_alloc(need);
    const breakage br = (breakage)take_below(in, BREAK_COUNT);
    const int via_args = take8(in) & 1;
    int32_t bad_q[kMaxBatchRun + 1], bad_k[kMaxBatchRun + 1];
    call_args a = forward_args(p, rb, br, need ? ws : NULL, need, bad_q, bad_k, in, via_args, 1);
    void *dq = rb->dq.buf;
    const float *lse = rb->lse;
    if (br == BREAK_OUTPUT_OVER_INPUT || br == BREAK_LSE_OVER_OUTPUT || br == BREAK_NO_LSE) {
        /* Backward's own breakages: dQ over Q, a NULL LSE. */
        a.o = rb->o.buf;
        a.lse = rb->lse;
        a.expect = FLASHATTN_SUCCESS;
        if (br == BREAK_NO_LSE) {
            lse = NULL;
            a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        } else if (rb->dq.bytes > 0 && rb->q.bytes >= rb->dq.bytes) {
            dq = rb->q.buf;
            a.expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
        }
    } else if (br == BREAK_NULL_TENSOR && a.o == NULL) {
        dq = NULL; /* O is an input of the backward: its NULL output is dQ */
    }
    outputs_poison(p, rb, 1);
    const flashattn_status_t s = call_backward(plan, p, rb, &a, lse, dq);
    char what[96];
    snprintf(what, sizeof what, "execute_backward%s (%s)", a.via_args ? "_args" : a.varlen_entry ? "_varlen" : "",
             break_name(br));
    expect_status(s, a.expect, what);
    inputs_unchanged(rb, 1, what);
    if (s != FLASHATTN_SUCCESS) {
        ++stats.backward_failed;
        nothing_written(rb, 1, what);
    } else {
        ++stats.backward_ok;
        grad_ref g;
        grad_reference(p, rb, &g);
        check_grad(p, &rb->dq, g.dq, g.q_sees, 0, p->hq, p->d, g.delta, g.mag_q, "dQ");
        check_grad(p, &rb->dk, g.dk, g.k_seen, 1, p->hk, p->d, g.delta, g.mag_k, "dK");
        check_grad(p, &rb->dv, g.dv, g.k_seen, 1, p->hk, p->dv, g.delta, g.mag_v, "dV");
        grad_free(&g);
    }
    free(ws);
}

/* The forward with the argument the input chose to break, then (on success) the same call again
 * into fresh poison: bitwise the same output. */
static int run_forward(const flashattn_plan_t *plan, const problem *p, run_buffers *rb, input *in) {
    size_t need = (size_t)-1;
    if (flashattn_plan_get_workspace_size(plan, &need) != FLASHATTN_SUCCESS) finding("get_workspace_size failed on a finalized plan");
    if (need > ((size_t)1 << 28)) finding("forward workspace of %zu bytes for a problem of at most %d elements a tensor", need, kMaxElems);
    void *ws = workspace_alloc(need);
    const breakage br = (breakage)take_below(in, BREAK_COUNT);
    const int via_args = take8(in) & 1;
    int32_t bad_q[kMaxBatchRun + 1], bad_k[kMaxBatchRun + 1];
    const call_args a = forward_args(p, rb, br, need ? ws : NULL, need, bad_q, bad_k, in, via_args, 0);
    outputs_poison(p, rb, 0);
    const flashattn_status_t s = call_forward(plan, &a);
    char what[96];
    snprintf(what, sizeof what, "execute%s (%s)", a.via_args ? "_args" : a.varlen_entry ? "_varlen" : "", break_name(br));
    expect_status(s, a.expect, what);
    inputs_unchanged(rb, 0, what);
    int ok = 0;
    if (s != FLASHATTN_SUCCESS) {
        ++stats.forward_failed;
        nothing_written(rb, 0, what);
    } else if (a.lse != NULL) {
        check_forward(p, rb);
        /* Bitwise reproducible: the same call into fresh poison. */
        unsigned char *first = malloc(rb->o.bytes + 1);
        memcpy(first, rb->o.buf, rb->o.bytes);
        outputs_poison(p, rb, 0);
        if (call_forward(plan, &a) != FLASHATTN_SUCCESS) finding("%s: the second, identical call failed", what);
        if (memcmp(first, rb->o.buf, rb->o.bytes) != 0) finding("%s: a second identical call gave a different O", what);
        free(first);
        ok = 1;
        ++stats.forward_ok;
    } else {
        /* Without LSE, O must be the same as with it. */
        unsigned char *first = malloc(rb->o.bytes + 1);
        memcpy(first, rb->o.buf, rb->o.bytes);
        call_args with_lse = a;
        with_lse.lse = rb->lse;
        outputs_poison(p, rb, 0);
        if (call_forward(plan, &with_lse) != FLASHATTN_SUCCESS) finding("%s: the call with LSE failed", what);
        if (memcmp(first, rb->o.buf, rb->o.bytes) != 0) finding("%s: O differs with and without LSE", what);
        free(first);
        check_forward(p, rb);
        ok = 1;
        ++stats.forward_ok;
    }
    free(ws);
    return ok;
}

/* ---- The merge of partial states ----------------------------------------------------------------- */

enum { kMaxPartials = 4 };

typedef struct merge_case {
    int n;                           /* partials made (num_partials passed may be broken) */
    flashattn_dtype_t pdtype;        /* their element type */
    size_t pes;                      /* its size */
    unsigned char *o[kMaxPartials];  /* laid out as the plan's O, in pdtype */
    float *lse[kMaxPartials];        /* laid out as the plan's LSE */
    unsigned char *o_snap[kMaxPartials];
    float *lse_snap[kMaxPartials];
} merge_case;

/* The spacing of the output dtype's subnormals: the absolute rounding floor of a stored value. */
static double subnormal_step(flashattn_dtype_t dtype) {
    return ldexp(1.0, dtype == FLASHATTN_DTYPE_FP16 ? -24 : dtype == FLASHATTN_DTYPE_BF16 ? -133 : -149);
}

/* O offset (elements) of (sequence b, row, head) and the LSE index of the plan's layouts; rows of
 * a varlen plan are packed (b = 0). */
static int64_t merge_o_at(const problem *p, const layout *l, int64_t b, int64_t row, int64_t h) {
    return offset_of(l, p->varlen ? 0 : b, row, h);
}
static size_t merge_lse_at(const problem *p, int64_t b, int64_t row, int64_t h) {
    return p->varlen ? (size_t)(h * p->tq + row) : (size_t)((b * p->hq + h) * p->sq + row);
}

/* Random partials: LSE -inf (adds nothing; its O may then hold a NaN), NaN now and then, or in
 * [-30, 30] (weights never underflow float); O in [-2, 2], a NaN in a column now and then. */
static void merge_make(const run_buffers *rb, merge_case *mc, input *in) {
    const uint64_t seed = take(in, 4);
    test_rng rng;
    test_rng_seed(&rng, seed);
    const size_t elems = (size_t)rb->o.l.elems;
    const unsigned nan_bits = take8(in);
    for (int s = 0; s < mc->n; ++s) {
        mc->o[s] = malloc(elems * mc->pes + 1);
        mc->lse[s] = malloc(rb->lse_count * 4 + 1);
        for (size_t e = 0; e < elems; ++e) test_store(mc->pdtype, mc->o[s] + e * mc->pes, test_rng_uniform(&rng, -2.0, 2.0));
        for (size_t i = 0; i < rb->lse_count; ++i) {
            const uint64_t r = test_rng_next(&rng) % 64;
            mc->lse[s][i] = r < 12 ? -INFINITY : (r == 12 && (nan_bits & 1)) ? NAN : (float)test_rng_uniform(&rng, -30.0, 30.0);
        }
        if ((nan_bits >> (1 + s)) & 1 && elems > 0) /* a NaN somewhere in this partial's O (perhaps a gap) */
            test_store(mc->pdtype, mc->o[s] + (size_t)(test_rng_next(&rng) % elems) * mc->pes, NAN);
        mc->o_snap[s] = malloc(elems * mc->pes + 1);
        mc->lse_snap[s] = malloc(rb->lse_count * 4 + 1);
        memcpy(mc->o_snap[s], mc->o[s], elems * mc->pes);
        memcpy(mc->lse_snap[s], mc->lse[s], rb->lse_count * 4);
    }
}

static void merge_free(merge_case *mc) {
    for (int s = 0; s < mc->n; ++s) {
        free(mc->o[s]);
        free(mc->lse[s]);
        free(mc->o_snap[s]);
        free(mc->lse_snap[s]);
    }
}

/* Every row against the formula in double, then O's gaps. */
static void merge_check(const problem *p, const run_buffers *rb, const merge_case *mc, int with_lse) {
    const int64_t seqs = p->varlen ? 1 : p->batch, rows = p->varlen ? p->tq : p->sq;
    for (int64_t b = 0; b < seqs; ++b)
        for (int64_t row = 0; row < rows; ++row)
            for (int64_t h = 0; h < p->hq; ++h) {
                const size_t li = merge_lse_at(p, b, row, h);
                const int64_t oi = merge_o_at(p, &rb->o.l, b, row, h);
                double m = -INFINITY;
                int nan = 0;
                for (int s = 0; s < mc->n; ++s) {
                    const double l = mc->lse[s][li];
                    nan |= isnan(l);
                    if (l > m) m = l;
                }
                double ref_lse = nan ? NAN : m;
                if (!nan && m != -INFINITY) {
                    double sum = 0.0;
                    for (int s = 0; s < mc->n; ++s) sum += exp(mc->lse[s][li] - m);
                    ref_lse = m + log(sum);
                }
                const double got_lse = with_lse ? rb->lse[li] : ref_lse;
                if (nan ? !isnan(got_lse) : !(fabs(got_lse - ref_lse) <= 2e-5 * (1.0 + fabs(ref_lse)) || got_lse == ref_lse))
                    finding("merge row (b %lld, row %lld, h %lld): LSE %.9g, reference %.9g", (long long)b, (long long)row,
                            (long long)h, got_lse, ref_lse);
                for (int64_t c = 0; c < p->dv; ++c) {
                    const unsigned char *gp = rb->o.buf + (size_t)(oi + c) * test_dtype_size(p->dtype);
                    const double got = test_load(p->dtype, gp);
                    double ref = 0.0, vmax = 0.0;
                    int col_nan = nan;
                    if (!nan && m != -INFINITY)
                        for (int s = 0; s < mc->n; ++s) {
                            if (mc->lse[s][li] == -INFINITY) continue; /* adds nothing, whatever its O */
                            const double v = test_load(mc->pdtype, mc->o[s] + (size_t)(oi + c) * mc->pes);
                            col_nan |= isnan(v);
                            ref += exp(mc->lse[s][li] - ref_lse) * v;
                            if (fabs(v) > vmax) vmax = fabs(v);
                        }
                    if (col_nan) {
                        if (!isnan(got) || test_is_poison(p->dtype, gp))
                            finding("merge row (b %lld, row %lld, h %lld) col %lld = %g: a NaN reaches it, expected NaN",
                                    (long long)b, (long long)row, (long long)h, (long long)c, got);
                    } else if (m == -INFINITY ? got != 0.0 : !(fabs(got - ref) <= o_rtol(p->dtype) * vmax + subnormal_step(p->dtype))) {
                        finding("merge row (b %lld, row %lld, h %lld) col %lld = %.9g, reference %.9g (%d partials of %s, "
                                "output %s)", (long long)b, (long long)row, (long long)h, (long long)c, got, ref, mc->n,
                                test_dtype_name(mc->pdtype), test_dtype_name(p->dtype));
                    }
                }
                ++stats.merge_rows;
            }
    check_gaps(p, &rb->o, "merged O");
}

/* flashattn_plan_merge_states into the plan's O and LSE, with the argument the input chose to
 * break; a failure writes nothing and every call leaves the partials as they were. */
static void run_merge(const flashattn_plan_t *plan, const problem *p, run_buffers *rb, input *in) {
    merge_case mc;
    memset(&mc, 0, sizeof mc);
    mc.n = 1 + (int)take_below(in, kMaxPartials);
    mc.pdtype = (take8(in) & 1) ? FLASHATTN_DTYPE_FP32 : p->dtype;
    mc.pes = test_dtype_size(mc.pdtype);
    merge_make(rb, &mc, in);
    const void *po[kMaxPartials];
    const float *pl[kMaxPartials];
    for (int s = 0; s < mc.n; ++s) {
        po[s] = mc.o[s];
        pl[s] = mc.lse[s];
    }
    int32_t count = mc.n;
    const void *const *po_arg = po;
    const float *const *pl_arg = pl;
    flashattn_dtype_t dtype = mc.pdtype;
    void *o = rb->o.buf;
    float *lse = (take8(in) & 3) ? rb->lse : NULL;
    flashattn_status_t expect = FLASHATTN_ERROR_INVALID_ARGUMENT;
    const int64_t part_bytes = rb->o.l.elems * (int64_t)mc.pes;
    const unsigned br = take8(in) % 16;
    switch (br) {
    case 1: {
        static const int32_t bad[] = {0, -1, 129, INT32_MAX, INT32_MIN};
        count = bad[take_below(in, 5)];
        break;
    }
    case 2: po_arg = NULL; break;
    case 3: pl_arg = NULL; break;
    case 4: o = NULL; break;
    case 5: po[take_below(in, mc.n)] = NULL; break;
    case 6: pl[take_below(in, mc.n)] = NULL; break;
    case 7: {
        static const int32_t bad[] = {0, -1, 5, 99, FLASHATTN_DTYPE_FP8_E4M3, FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16};
        dtype = (flashattn_dtype_t)bad[take_below(in, 7)];
        if (dtype == p->dtype || dtype == FLASHATTN_DTYPE_FP32) expect = FLASHATTN_SUCCESS; /* allowed after all */
        if (expect == FLASHATTN_SUCCESS) dtype = mc.pdtype; /* the partials' real type */
        break;
    }
    case 8: /* O over a partial */
        if (rb->o.bytes > 0 && part_bytes > 0) o = mc.o[take_below(in, mc.n)]; else expect = FLASHATTN_SUCCESS;
        break;
    case 9: /* LSE over O, or over a partial's LSE */
        if (rb->lse_count > 0 && rb->o.bytes > 0) lse = (take8(in) & 1) ? (float *)rb->o.buf : mc.lse[take_below(in, mc.n)];
        else expect = FLASHATTN_SUCCESS;
        break;
    default: expect = FLASHATTN_SUCCESS; break;
    }
    outputs_poison(p, rb, 0);
    const flashattn_status_t s = flashattn_plan_merge_states(plan, count, po_arg, pl_arg, dtype, o, lse, NULL);
    char what[96];
    snprintf(what, sizeof what, "merge_states (%d partials of %s, breakage %u)", mc.n, test_dtype_name(mc.pdtype), br);
    expect_status(s, expect, what);
    for (int i = 0; i < mc.n; ++i)
        if (memcmp(mc.o[i], mc.o_snap[i], (size_t)part_bytes) != 0 || memcmp(mc.lse[i], mc.lse_snap[i], rb->lse_count * 4) != 0)
            finding("%s: partial %d changed", what, i);
    if (s != FLASHATTN_SUCCESS) {
        ++stats.merge_failed;
        nothing_written(rb, 0, what);
    } else {
        ++stats.merge_ok;
        if (lse != NULL) {
            for (size_t i = 0; i < rb->lse_count; ++i)
                if (test_is_poison(FLASHATTN_DTYPE_FP32, (const unsigned char *)&rb->lse[i]))
                    finding("%s: LSE element %zu was not written", what, i);
        } else if (memcmp(rb->lse_snapshot, rb->lse, rb->lse_count * 4) != 0) {
            finding("%s: no LSE was asked for, but the LSE buffer changed", what);
        }
        merge_check(p, rb, &mc, lse != NULL);
    }
    merge_free(&mc);
}

/* Finalize failed or was skipped: every entry point must refuse with INVALID_STATE and write nothing. */
static void probe_unfinalized(const flashattn_plan_t *plan) {
    size_t bytes = 11;
    flashattn_backend_t backend = (flashattn_backend_t)11;
    expect_status(flashattn_plan_get_workspace_size(plan, &bytes), FLASHATTN_ERROR_INVALID_STATE, "get_workspace_size");
    expect_status(flashattn_plan_get_backend(plan, &backend, NULL), FLASHATTN_ERROR_INVALID_STATE, "get_backend");
    expect_status(flashattn_plan_get_backward_workspace_size(plan, &bytes), FLASHATTN_ERROR_INVALID_STATE,
                  "get_backward_workspace_size");
    if (bytes != 11 || backend != (flashattn_backend_t)11) finding("a query on an unfinalized plan wrote its output");
    float tiny[16], lse[4];
    memset(tiny, 0x5a, sizeof tiny);
    memset(lse, 0x5a, sizeof lse);
    const int32_t cu[2] = {0, 1};
    expect_status(flashattn_plan_execute(plan, tiny, tiny + 4, tiny + 8, tiny + 12, lse, NULL, 0, NULL),
                  FLASHATTN_ERROR_INVALID_STATE, "execute on an unfinalized plan");
    expect_status(flashattn_plan_execute_varlen(plan, tiny, tiny + 4, tiny + 8, tiny + 12, lse, cu, cu, NULL, 0, NULL),
                  FLASHATTN_ERROR_INVALID_STATE, "execute_varlen on an unfinalized plan");
    const void *po[1] = {tiny};
    const float *pl[1] = {tiny + 4};
    expect_status(flashattn_plan_merge_states(plan, 1, po, pl, FLASHATTN_DTYPE_FP32, tiny + 12, lse, NULL),
                  FLASHATTN_ERROR_INVALID_STATE, "merge_states on an unfinalized plan");
    flashattn_args_t *args = NULL;
    if (flashattn_args_create(&args) != FLASHATTN_SUCCESS) finding("flashattn_args_create failed");
    expect_status(flashattn_plan_execute_args(plan, args, NULL, 0, NULL), FLASHATTN_ERROR_INVALID_STATE,
                  "execute_args on an unfinalized plan");
    expect_status(flashattn_plan_execute_backward_args(plan, args, NULL, 0, NULL), FLASHATTN_ERROR_INVALID_STATE,
                  "execute_backward_args on an unfinalized plan");
    flashattn_args_destroy(args);
    for (int i = 0; i < 16; ++i) {
        uint32_t u;
        memcpy(&u, &tiny[i], 4);
        if (u != 0x5a5a5a5au) finding("execute or merge on an unfinalized plan wrote a tensor");
    }
    for (int i = 0; i < 4; ++i) {
        uint32_t u;
        memcpy(&u, &lse[i], 4);
        if (u != 0x5a5a5a5au) finding("execute or merge on an unfinalized plan wrote an LSE");
    }
}

static double forward_work(const problem *p) {
    double w = 0.0;
    for (int64_t b = 0; b < p->batch; ++b) w += (double)p->len_q[b] * (double)p->len_k[b];
    return w * (double)p->hq * (double)(p->d + p->dv);
}

static void alloc_run_buffers(const flashattn_plan_t *plan, const problem *p, run_buffers *rb, const layout *ls) {
    const size_t es = test_dtype_size(p->dtype);
    tensor_alloc(&rb->q, &ls[0], es);
    tensor_alloc(&rb->k, &ls[1], es);
    tensor_alloc(&rb->v, &ls[2], es);
    tensor_alloc(&rb->o, &ls[3], es);
    tensor_alloc(&rb->dout, &ls[4], es);
    tensor_alloc(&rb->dq, &ls[5], es);
    tensor_alloc(&rb->dk, &ls[6], es);
    tensor_alloc(&rb->dv, &ls[7], es);
    rb->lse_count = (size_t)(p->varlen ? p->hq * p->tq : p->batch * p->hq * p->sq);
    rb->lse = malloc(rb->lse_count * 4 + 1);
    rb->lse_snapshot = malloc(rb->lse_count * 4 + 1);
    (void)plan;
}

static void free_run_buffers(run_buffers *rb) {
    tensor_free(&rb->q);
    tensor_free(&rb->k);
    tensor_free(&rb->v);
    tensor_free(&rb->o);
    tensor_free(&rb->dout);
    tensor_free(&rb->dq);
    tensor_free(&rb->dk);
    tensor_free(&rb->dv);
    free(rb->lse);
    free(rb->lse_snapshot);
}

/* The eight tensors' layouts from the finalized plan; 0 when one is too large to run here. */
static int layouts_of(const flashattn_plan_t *plan, const problem *p, layout *ls) {
    const int64_t rq = p->varlen ? p->tq : p->sq, rk = p->varlen ? p->tk : p->sk;
    const struct { flashattn_i64_param_t key; int64_t rows, heads, dim; } t[8] = {
        {FLASHATTN_I64_Q_BATCH_STRIDE, rq, p->hq, p->d},   {FLASHATTN_I64_K_BATCH_STRIDE, rk, p->hk, p->d},
        {FLASHATTN_I64_V_BATCH_STRIDE, rk, p->hk, p->dv},  {FLASHATTN_I64_O_BATCH_STRIDE, rq, p->hq, p->dv},
        {FLASHATTN_I64_DO_BATCH_STRIDE, rq, p->hq, p->dv}, {FLASHATTN_I64_DQ_BATCH_STRIDE, rq, p->hq, p->d},
        {FLASHATTN_I64_DK_BATCH_STRIDE, rk, p->hk, p->d},  {FLASHATTN_I64_DV_BATCH_STRIDE, rk, p->hk, p->dv}};
    int fits = 1;
    for (int i = 0; i < 8; ++i) {
        ls[i] = layout_from_plan(plan, t[i].key, p->varlen, p->batch, t[i].rows, t[i].heads, t[i].dim);
        if (ls[i].elems < 0) fits = 0;
    }
    return fits;
}

/* Sometimes a NaN or two in Q, K or V (perhaps in a stride gap, where it must change nothing). The
 * forward's oracle follows the header's NaN rule; the backward is not run on such inputs. */
static int inject_nans(const problem *p, run_buffers *rb, input *in) {
    if (take_below(in, 4) != 0) return 0;
    const int64_t count = 1 + take_below(in, 2);
    int any = 0;
    for (int64_t n = 0; n < count; ++n) {
        tensor *t = take_below(in, 3) == 0 ? &rb->q : (take8(in) & 1) ? &rb->k : &rb->v;
        if (t->l.elems == 0) continue;
        const int64_t e = (int64_t)(take(in, 4) % (uint64_t)t->l.elems);
        test_store(p->dtype, t->buf + (size_t)e * test_dtype_size(p->dtype), NAN);
        tensor_save(t);
        any = 1;
    }
    return any;
}

static void run_plan(const flashattn_plan_t *plan, const shadow *sh, input *in, const int32_t *lens_q,
                     const int32_t *lens_k, int64_t base_batch) {
    problem p;
    read_problem(plan, sh, &p);
    if (sets_feature_key(sh)) {
        probe_feature_plan(plan);
        return;
    }
    if (p.batch > kMaxBatchRun || p.hq > 64 || p.dtype == FLASHATTN_DTYPE_FP8_E4M3) return;
    if (p.varlen) {
        /* The lengths the base drew, if the mutations left batch and totals consistent with them. */
        if (p.batch != base_batch) return;
        int64_t tq = 0, tk = 0;
        for (int64_t b = 0; b < p.batch; ++b) {
            tq += lens_q[b];
            tk += lens_k[b];
        }
        if (tq != p.tq || tk != p.tk) return;
    }
    pack_sequences(&p, lens_q, lens_k);
    ++stats.finalized;
    if (p.varlen && !cu_seqlens_valid(&p, p.cu_q, p.cu_k)) return; /* a mutated maximum below a drawn length */
    if (forward_work(&p) > kMaxWork) return;
    layout ls[8];
    if (!layouts_of(plan, &p, ls)) return;
    run_buffers rb;
    alloc_run_buffers(plan, &p, &rb, ls);
    const uint64_t seed = take(in, 4);
    static const double magnitudes[] = {1.0, 1.0, 1.0, 0.01, 4.0, 30.0, 1e3, 1e20};
    double mag = magnitudes[take_below(in, 8)];
    if (p.dtype != FLASHATTN_DTYPE_FP32 && mag > 30.0) mag = 30.0;
    if (avoid_known() && mag > 30.0) mag = 30.0;
    fill_inputs(&p, &rb.q, seed, mag);
    fill_inputs(&p, &rb.k, seed + 1, mag);
    fill_inputs(&p, &rb.v, seed + 2, 1.0);
    fill_inputs(&p, &rb.dout, seed + 3, 1.0);
    const int with_nan = !avoid_known() && inject_nans(&p, &rb, in);
    /* Self-overlapping outputs cannot hold one value per element: the library must refuse them. */
    const int outputs_alias = rb.o.overlaps_itself;
    if (outputs_alias) {
        outputs_poison(&p, &rb, 0);
        size_t need = 0;
        if (flashattn_plan_get_workspace_size(plan, &need) != FLASHATTN_SUCCESS) finding("get_workspace_size failed");
        void *ws = workspace_alloc(need);
        const flashattn_status_t s =
            p.varlen ? flashattn_plan_execute_varlen(plan, rb.q.buf, rb.k.buf, rb.v.buf, rb.o.buf, rb.lse, p.cu_q, p.cu_k, ws, need, NULL)
                     : flashattn_plan_execute(plan, rb.q.buf, rb.k.buf, rb.v.buf, rb.o.buf, rb.lse, ws, need, NULL);
        free(ws);
        if (s == FLASHATTN_SUCCESS && !avoid_known()) finding("O's strides map two elements to one address, yet execute succeeded");
        free_run_buffers(&rb);
        return;
    }
    if (run_forward(plan, &p, &rb, in) && !with_nan && !rb.dq.overlaps_itself && !rb.dk.overlaps_itself && !rb.dv.overlaps_itself) {
        /* The backward takes the O and LSE just written and checked; they are its inputs now. */
        tensor_save(&rb.o);
        memcpy(rb.lse_snapshot, rb.lse, rb.lse_count * 4);
        run_backward(plan, &p, &rb, in);
    }
    if (!rb.o.overlaps_itself) run_merge(plan, &p, &rb, in);
    free_run_buffers(&rb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input in = {data, size};
    if (stats.inputs++ == 0 && getenv("FLASHATTN_FUZZ_STATS") != NULL) atexit(print_stats);
    probe_null_arguments(&in);
    probe_unknown_keys(&in);
    probe_args_object(&in);
    flashattn_plan_t *plan = NULL;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS || plan == NULL) finding("flashattn_plan_create failed");
    shadow sh;
    memset(&sh, 0, sizeof sh);
    int32_t lens_q[kMaxBatchRun], lens_k[kMaxBatchRun];
    int64_t base_batch = 0;
    build_base(plan, &sh, &in, lens_q, lens_k, &base_batch);
    mutate(plan, &sh, &in);
    const int rounds = 1 + (int)take_below(&in, 2);
    for (int r = 0; r < rounds; ++r) {
        const flashattn_status_t s = flashattn_plan_finalize(plan);
        sh.finalized = s == FLASHATTN_SUCCESS;
        if (s != FLASHATTN_SUCCESS) {
            if (s != FLASHATTN_ERROR_INVALID_ARGUMENT && s != FLASHATTN_ERROR_INVALID_STATE && s != FLASHATTN_ERROR_NOT_SUPPORTED)
                finding("finalize returned %d (%s)", s, flashattn_status_string(s));
            expect_message("finalize");
            probe_unfinalized(plan);
        } else {
            run_plan(plan, &sh, &in, lens_q, lens_k, base_batch);
        }
        /* A second round: more setters (which unfinalize the plan), then finalize again. */
        if (r + 1 < rounds) {
            mutate(plan, &sh, &in);
            /* Any successful setter unfinalizes the plan, this one too. */
            set_i64(plan, &sh, FLASHATTN_I64_CAUSAL, sh.set[FLASHATTN_I64_CAUSAL] ? sh.value[FLASHATTN_I64_CAUSAL] : 0);
            probe_unfinalized(plan);
        }
    }
    flashattn_plan_destroy(plan);
    return 0;
}
