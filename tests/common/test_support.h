/* Shared test support (owned by tests/common): an independent double-precision reference, the
 * same naive algorithm run in the input dtype (for FlashAttention's tolerance rule), random
 * inputs, dtype conversion, poisoning, host/device buffers and the full check of one case. */
#ifndef FLASHATTN_TEST_SUPPORT_H
#define FLASHATTN_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn/flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One attention problem to check. Fields left 0 take the library defaults
 * (heads_kv = heads_q, head_dim_v = head_dim, scale = 1/sqrt(head_dim)). */
typedef struct attn_case {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    flashattn_dtype_t dtype;
    int causal;
    int64_t window_left, window_right; /* -1 = unbounded; set both explicitly */
    double softcap;                    /* 0 = off */
    double scale;                      /* 0 = default */
    int varlen;                        /* random per-sequence lengths <= seqlen_q/k, one may be 0 */
    int strided;                       /* non-contiguous (padded) batch/row/head strides */
    int with_lse;
} attn_case;

/* Run `c` on `backend` with fresh random inputs from `seed`, poisoned outputs, every element of O
 * (and LSE when asked) checked against the double reference with FlashAttention's rule; also runs
 * twice and requires bit-identical output. Returns 0 on pass; prints a diagnosis on failure.
 *
 * Tolerances: fp16/bf16: max|O - ref| <= 2 * max|O_naive_lowp - ref| + 1e-5, where O_naive_lowp is
 * the naive algorithm run in the input dtype; fp32: max|O - ref| <= 1e-5 * max|ref|. LSE:
 * |lse - ref| <= 1e-4 * (1 + |ref|), and a -inf reference (row that sees no key) must be -inf
 * exactly, with O = 0 in that row. Set FLASHATTN_TEST_VERBOSE=1 to print every case's errors. */
int check_attention_case(flashattn_backend_t backend, const attn_case *c, uint64_t seed);

/* 1 when a usable CUDA device exists (and the tests were built with CUDA). */
int test_gpu_available(void);
/* For gpu-labelled executables: exit(77) (CTest: skipped) when no GPU is usable. */
void test_skip_without_gpu(void);

/* ---- Helpers shared by the tests (independent of the library's own code) ---------------- */

/* splitmix64 generator. */
typedef struct test_rng {
    uint64_t state;
} test_rng;
void test_rng_seed(test_rng *rng, uint64_t seed);
uint64_t test_rng_next(test_rng *rng);
double test_rng_uniform(test_rng *rng, double lo, double hi); /* [lo, hi) */
int64_t test_rng_range(test_rng *rng, int64_t lo, int64_t hi); /* [lo, hi] inclusive */

/* Bytes per element of a dtype (fp8: 1). */
size_t test_dtype_size(flashattn_dtype_t dtype);
/* "fp16", "bf16", "fp32", "fp8_e4m3" or "?". */
const char *test_dtype_name(flashattn_dtype_t dtype);
/* "auto", "cpu", "fa1", "fa2", "fa3" or "?". */
const char *test_backend_name(flashattn_backend_t backend);
/* Round x to the nearest value of `dtype` (ties to even; overflow to +-inf; NaN stays NaN). */
double test_round(flashattn_dtype_t dtype, double x);
/* Store / load one element of `dtype` at dst/src (x is rounded first when storing). */
void test_store(flashattn_dtype_t dtype, void *dst, double x);
double test_load(flashattn_dtype_t dtype, const void *src);

/* "1" in the environment variable FLASHATTN_TEST_VERBOSE. */
int test_verbose(void);

#ifdef __cplusplus
}
#endif

#endif
