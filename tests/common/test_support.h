/* Shared test support (owned by tests/common): the full check of one forward case against an
 * independent double-precision reference and the same naive algorithm run in the input dtype (for
 * FlashAttention's tolerance rule); what the forward and backward suites share to build a case
 * (its sizes and sequences, random inputs, plan keys and strides) and to compare a result with its
 * reference; random numbers and dtype conversion. Buffers and layouts: test_buffers.h. */
#ifndef FLASHATTN_TEST_SUPPORT_H
#define FLASHATTN_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn/flashattn.h"
#include "test_buffers.h"

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
/* perm[0..n) = a uniformly shuffled 0..n-1 (Fisher-Yates). */
void test_rng_permutation(test_rng *rng, int64_t *perm, int64_t n);

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

/* ---- One case's shape, inputs and plan keys (test_shape.c) --------------------------------- */

/* The sizes of one case with the defaults resolved, and its sequences: fixed length, or (varlen)
 * random lengths packed one after another. */
typedef struct case_shape {
    int64_t batch, sq, sk, hq, hk, d, dv;
    flashattn_dtype_t dtype; /* the dtype the case runs in */
    double scale;
    int varlen;
    int64_t *len_q, *len_k, *start_q, *start_k; /* [batch] */
    int64_t total_q, total_k;
} case_shape;

/* The sizes of `c` run in `dtype`, defaults resolved; no sequences yet (total = batch * seqlen). */
void shape_resolve(case_shape *s, const attn_case *c, flashattn_dtype_t dtype);
/* Allocates the sequences: every one at full length, or (varlen) sequences b > 0 of random length
 * in [seqlen/3, seqlen] drawn from `rng`. The caller may then set lengths to 0 and must call
 * shape_pack(). 0 on success, -1 out of memory. */
int shape_sequences(case_shape *s, test_rng *rng);
/* Starts and totals from the lengths. */
void shape_pack(case_shape *s);
/* cu_seqlens [batch + 1] from the starts and totals. */
void shape_cu_seqlens(const case_shape *s, int32_t *cu_q, int32_t *cu_k);
/* Frees the sequences (NULL ones too). */
void shape_free(case_shape *s);
/* Fills the logical array `dst` ([tokens][heads][dim]) and the tensor in `m` (layout l) with
 * U(-1, 1) rounded to the dtype, token by token; everything else of `m` holds the poison. Rows are
 * queries (q_side) or keys. */
void fill_random_tensor(const case_shape *s, test_rng *rng, const test_mem *m, const tensor_layout *l, float *dst,
                        int q_side, int64_t heads, int64_t dim);
/* "[backend b=.. sq=.. ... varlen=.. strided=.." (no closing bracket): the common head of a case's
 * description. Returns the characters written. */
int shape_describe(char *buf, size_t size, flashattn_backend_t backend, const attn_case *c, const case_shape *s);
/* Sets the problem's keys on `plan`: sizes, dtype, mask, `backend` forced, device 0, varlen and its
 * totals, the softmax scale when `c` gives one (else the library's default), the softcap. Returns
 * the first failing setter's status. */
flashattn_status_t set_problem_keys(flashattn_plan_t *plan, const case_shape *s, const attn_case *c,
                                    flashattn_backend_t backend);
/* Each tensor's batch, row and head stride keys (test_stride_keys[TEST_STRIDES_DQ] = the DQ_* keys),
 * the rows in this order so that a run of them (Q..O, dO..dV) can go to set_strides_of at once. */
enum {
    TEST_STRIDES_Q, TEST_STRIDES_K, TEST_STRIDES_V, TEST_STRIDES_O,
    TEST_STRIDES_DO, TEST_STRIDES_DQ, TEST_STRIDES_DK, TEST_STRIDES_DV,
    TEST_STRIDES_K_NEW, TEST_STRIDES_V_NEW, TEST_STRIDES_COUNT
};
extern const flashattn_i64_param_t test_stride_keys[TEST_STRIDES_COUNT][3];
/* Sets the strides of n tensors: keys[t] are tensor t's batch (fixed length only), row and head
 * stride keys, layouts[t] its layout. */
flashattn_status_t set_strides_of(flashattn_plan_t *plan, const flashattn_i64_param_t (*keys)[3],
                                  const tensor_layout *const *layouts, int n, int varlen);
/* The strides of Q, K, V and O from their layouts. */
flashattn_status_t set_forward_strides(flashattn_plan_t *plan, const tensor_layout *lq, const tensor_layout *lk,
                                       const tensor_layout *lv, const tensor_layout *lo, int varlen);

/* ---- Comparing with a reference (test_compare.c) ------------------------------------------------------------ */

/* max|ref| over n elements, and max|low - ref| (0 when low is NULL): the scale and the naive
 * baseline of a tolerance. */
void reference_scale(const double *ref, const double *low, size_t n, double *max_ref, double *base_err);

/* The largest error of a tensor and its first bad element: out of tolerance, or not exactly 0 where
 * it must be (a row that sees no key, a key no query sees). b < 0 while none is bad. */
typedef struct element_errors {
    double max_err; /* INFINITY once an error is NaN */
    long long b, i, h, col;
    double out, ref;
    int must_be_zero; /* the first bad element had to be exactly 0 */
} element_errors;
element_errors element_errors_none(void);
/* Records element (sequence b, row or key i, head h, column col). */
void element_errors_add(element_errors *e, int64_t b, int64_t i, int64_t h, int64_t col, double out, double ref,
                        double tol, int must_be_zero);

/* The first of `elems` elements at host that `inside` does not mark (a stride gap) and that no
 * longer holds the poison; -1 when there is none. */
long long first_written_gap(flashattn_dtype_t dtype, const void *host, const unsigned char *inside, size_t elems);

/* "1" in the environment variable FLASHATTN_TEST_VERBOSE. */
int test_verbose(void);

#ifdef __cplusplus
}
#endif

#endif
