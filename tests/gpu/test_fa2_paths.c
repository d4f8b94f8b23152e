/* FA2-specific paths that the general numerics grid may not reach: split-KV decode (the workspace
 * partials and the combine kernel), pack-GQA (query heads of one kv head stacked along M), the
 * small 64-row tile variant, head dims routed to a larger compiled tile (zero-padded columns),
 * ragged edges and rows without any visible key under every mask kind. Each case runs on the FA2
 * backend forced, against the shared double-precision reference (check_attention_case()), twice
 * for bit-identical output. Skipped (exit 77) without a GPU or without the fa2 backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashattn/flashattn.h"
#include "test_support.h"

#define BF16 FLASHATTN_DTYPE_BF16
#define FP16 FLASHATTN_DTYPE_FP16

/* batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, causal,
 * window_left, window_right, softcap, scale, varlen, strided, with_lse */
static const attn_case cases[] = {
    /* decode, GQA packed, split over the keys */
    {1, 1, 4099, 32, 8, 128, 0, BF16, 0, -1, -1, 0.0, 0.0, 0, 0, 1},
    {2, 1, 2500, 16, 2, 64, 0, FP16, 1, -1, -1, 0.0, 0.0, 0, 0, 1},
    {1, 4, 3000, 8, 1, 256, 0, BF16, 1, -1, -1, 0.0, 0.0, 0, 0, 1},
    {1, 1, 5000, 8, 8, 96, 0, BF16, 0, 300, 0, 0.0, 0.0, 0, 0, 1},
    {1, 2, 2048, 8, 2, 160, 0, FP16, 1, -1, -1, 20.0, 0.0, 0, 1, 1},
    {3, 3, 1800, 8, 2, 128, 0, BF16, 1, -1, -1, 0.0, 0.0, 1, 0, 1},
    /* long keys, few query tiles: split-KV prefill */
    {1, 100, 6000, 2, 1, 64, 0, BF16, 1, -1, -1, 0.0, 0.0, 0, 0, 1},
    {1, 65, 4000, 2, 2, 192, 0, FP16, 0, 500, 40, 0.0, 0.5, 0, 1, 1},
    /* head dims between the compiled tiles */
    {2, 77, 91, 3, 3, 8, 0, BF16, 0, -1, -1, 0.0, 0.0, 0, 0, 1},
    {2, 77, 91, 3, 3, 40, 0, FP16, 1, -1, -1, 0.0, 0.0, 0, 0, 1},
    {2, 77, 91, 3, 3, 72, 0, BF16, 0, 10, 10, 0.0, 0.0, 0, 0, 1},
    {2, 77, 91, 3, 3, 136, 0, FP16, 0, -1, -1, 15.0, 0.0, 0, 0, 1},
    {2, 77, 91, 3, 3, 200, 0, BF16, 1, -1, -1, 0.0, 0.0, 1, 0, 1},
    {2, 77, 91, 3, 3, 248, 0, FP16, 0, -1, -1, 0.0, 0.0, 0, 1, 0},
    /* more queries than keys under causal: leading rows see nothing (O = 0, LSE = -inf) */
    {2, 300, 120, 4, 2, 128, 0, BF16, 1, -1, -1, 0.0, 0.0, 0, 0, 1},
    {2, 130, 200, 4, 4, 64, 0, FP16, 0, 0, 0, 0.0, 0.0, 0, 0, 1},
    {4, 140, 150, 6, 3, 224, 0, BF16, 1, 30, -1, 0.0, 0.0, 1, 0, 1},
};

#define NUM_CASES (sizeof cases / sizeof cases[0])

static void run_case(void **state) {
    const attn_case *c = (const attn_case *)*state;
    const size_t index = (size_t)(c - cases);
    assert_int_equal(check_attention_case(FLASHATTN_BACKEND_FA2, c, 0xfa2f00dull + 7919ull * index), 0);
}

static char names[NUM_CASES][96];
static struct CMUnitTest tests[NUM_CASES];

int main(void) {
    int32_t major = 0, minor = 0;
    size_t i;
    const char *info = flashattn_build_info();
    test_skip_without_gpu();
    if (strstr(info, "fa2") == NULL) {
        printf("this build has no fa2 backend (%s): skipping\n", info);
        return 77;
    }
    if (flashattn_device_compute_capability(0, &major, &minor) != FLASHATTN_SUCCESS || major < 8) {
        printf("device 0 cannot run fa2 (sm_%d%d): skipping\n", major, minor);
        return 77;
    }
    for (i = 0; i < NUM_CASES; ++i) {
        const attn_case *c = &cases[i];
        snprintf(names[i], sizeof names[i], "fa2_b%lld_q%lld_k%lld_h%lld-%lld_d%lld%s%s%s", (long long)c->batch,
                 (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q,
                 (long long)c->heads_kv, (long long)c->head_dim, c->causal ? "_causal" : "",
                 c->varlen ? "_varlen" : "", c->strided ? "_strided" : "");
        tests[i].name = names[i];
        tests[i].test_func = run_case;
        tests[i].setup_func = NULL;
        tests[i].teardown_func = NULL;
        tests[i].initial_state = (void *)c;
    }
    return _cmocka_run_group_tests("fa2_paths", tests, NUM_CASES, NULL, NULL);
}
