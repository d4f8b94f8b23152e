/* The checks of the suites that report with printf rather than cmocka (owned by tests/common;
 * numerics/test_fp8.c, test_hadamard.c, test_variants.c): EXPECT records a failed check with its
 * file and line and goes on, so one run lists every failure, and main() returns g_failures != 0.
 * Header-only on purpose: every executable has its own counter. Such a suite is built once per
 * backend with TEST_BACKEND defined (default: the CPU backend). */
#ifndef FLASHATTN_TEST_EXPECT_H
#define FLASHATTN_TEST_EXPECT_H

#include <stdio.h>
#include <string.h>

#include "flashattn/flashattn.h"

#ifndef TEST_BACKEND
#define TEST_BACKEND FLASHATTN_BACKEND_CPU
#endif

static int g_failures = 0;

#define EXPECT(cond, ...)                               \
    do {                                                \
        if (!(cond)) {                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
            ++g_failures;                               \
        }                                               \
    } while (0)

/* Expects status `want` from a call whose last-error message names `needle` (the argument or the
 * feature refused); `what` names the call in the failure line. */
static inline void expect_message(flashattn_status_t st, flashattn_status_t want, const char *needle,
                                  const char *what) {
    const char *msg = flashattn_last_error();
    EXPECT(st == want, "%s: status %d, want %d (%s)", what, (int)st, (int)want, msg);
    EXPECT(strstr(msg, needle) != NULL, "%s: message '%s' does not name '%s'", what, msg, needle);
}

#endif
