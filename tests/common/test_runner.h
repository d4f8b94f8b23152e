/* The cmocka side shared by the suites (owned by tests/common): running a grid of cases on one
 * backend (seed, reduced grid, names, the GPU requirement, registration) and the API contract
 * tests' assertions. Include after cmocka.h's prerequisites (stdarg.h, stddef.h, setjmp.h, stdint.h). */
#ifndef FLASHATTN_TEST_RUNNER_H
#define FLASHATTN_TEST_RUNNER_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "test_support.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Grids ------------------------------------------------------------------------------------- */

/* A suite built once per backend is compiled with TEST_BACKEND; the CPU when it is not. */
#ifndef TEST_BACKEND
#define TEST_BACKEND FLASHATTN_BACKEND_CPU
#endif

/* Dtype shorthands for the rows of a grid. */
#define F16 FLASHATTN_DTYPE_FP16
#define B16 FLASHATTN_DTYPE_BF16
#define F32 FLASHATTN_DTYPE_FP32

/* FLASHATTN_TEST_SEED when set, else `fallback`. */
uint64_t test_seed_from_env(uint64_t fallback);
/* The seed of the grid's case `index`. */
uint64_t test_case_seed(uint64_t base, size_t index);
/* FLASHATTN_TEST_REDUCED set and not "0": the grid compute-sanitizer runs. */
int test_reduced_grid(void);
/* Whether the reduced grid keeps `c`: every third case of at most 128 x 256 scores per head
 * (`small` counts the small cases seen so far). Every case when not reduced. */
int test_keeps_case(int reduced, const attn_case *c, size_t *small);
/* The dtype a case runs in on `backend`: GPU backends have no fp32 and run those cases in bf16. */
flashattn_dtype_t test_effective_dtype(flashattn_backend_t backend, flashattn_dtype_t dtype);
/* "<prefix>b2_q113_k203_h4-2_d64[-dv]_fp16[_causal][_winL,R][_capX][_scaleX][_varlen]"; returns
 * the characters written, for the suite's own suffixes. */
int test_case_name(char *buf, size_t size, const char *prefix, const attn_case *c, flashattn_dtype_t dtype);
/* Exits 77 (skipped) unless the library holds the GPU `backend` and device 0 runs it; returns the
 * device's compute capability. */
void test_require_gpu_backend(flashattn_backend_t backend, int32_t *major, int32_t *minor);
/* Skips the running test, saying why, when `why` is not NULL. */
void test_skip_if_outside(const char *why);
/* One test of a group: `func` called with `state`. */
struct CMUnitTest test_unit(const char *name, CMUnitTestFunction func, const void *state);

/* ---- API contract ----------------------------------------------------------------------------------- */

/* Every failing call must return `expected`, leave a non-empty message and (checked by callers)
 * write nothing. */
#define assert_status(call, expected)                                        \
    do {                                                                     \
        flashattn_status_t s_ = (call);                                      \
        if (s_ != (expected))                                                \
            fail_msg("%s returned %d (%s), expected %d; message: %s", #call, \
                     (int)s_, flashattn_status_string(s_), (int)(expected),  \
                     flashattn_last_error());                                \
        if ((expected) != FLASHATTN_SUCCESS)                                 \
            assert_true(strlen(flashattn_last_error()) > 0);                 \
    } while (0)

/* The message of the last error must mention `word` (anywhere, as a substring). */
void assert_message_mentions(const char *word);

/* One key and its value. */
typedef struct test_key_value {
    flashattn_i64_param_t key;
    int64_t value;
} test_key_value;

/* Sets `n` keys on `plan`, asserting that each succeeds. */
void set_keys_or_fail(flashattn_plan_t *plan, const test_key_value *keys, size_t n);
/* A new plan with `n` keys set, asserting that each call succeeds. */
flashattn_plan_t *plan_with_keys(const test_key_value *keys, size_t n);

/* One call on a finalized plan with one set of buffers (execute, backward). */
typedef flashattn_status_t (*plan_call)(const flashattn_plan_t *plan, void *buffers);
/* Runs call(plan, buffers[t]) `reps` times in each of n (at most 16) threads at once, each thread
 * with its own buffers; asserts that every call succeeded. */
void run_in_threads(const flashattn_plan_t *plan, plan_call call, void *const *buffers, int n, int reps);

#ifdef __cplusplus
}
#endif

#endif
