/* What the tests' references share (owned by tests/common): the problem as they see it and the
 * documented mask rule. The forward references are in test_internal.h, the gradient references in
 * test_backward_reference.h; none shares code with src/. */
#ifndef FLASHATTN_TEST_REFERENCE_H
#define FLASHATTN_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn/flashattn.h"
#include "test_support.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One problem as the references see it: logical, contiguous arrays indexed by token (the rows of
 * all sequences one after another), head and dimension; values already rounded to the dtype. */
typedef struct ref_problem {
    int64_t batch, heads_q, heads_kv, head_dim, head_dim_v;
    flashattn_dtype_t dtype;
    int causal;
    int64_t window_left, window_right; /* -1 = unbounded */
    double softcap, scale;             /* softcap 0 = off; scale already resolved */
    const int64_t *len_q, *len_k;      /* [batch] rows of each sequence */
    const int64_t *start_q, *start_k;  /* [batch] first token of each sequence */
    int64_t total_q, total_k;
    const float *q;    /* [total_q][heads_q][head_dim] */
    const float *k;    /* [total_k][heads_kv][head_dim] */
    const float *v;    /* [total_k][heads_kv][head_dim_v] */
    const float *dout; /* [total_q][heads_q][head_dim_v]; the gradient references only (L = sum(O * dout)) */
} ref_problem;

/* 1 if key j is visible to query i of a sequence with sq queries and sk keys: the documented rule,
 * bottom-right aligned (diag = i + sk - sq; causal: j <= diag; window: diag - left <= j <= diag + right). */
int ref_visible(const ref_problem *p, int64_t i, int64_t j, int64_t sq, int64_t sk);

/* The longest of the n lengths, at least 1 (the size of one row's score buffer). */
int64_t ref_longest(const int64_t *len, int64_t n);

/* One query row of one head of one sequence, as the references visit them: sequence by sequence,
 * head by head, row by row. */
typedef struct ref_row {
    int64_t b, h, i; /* sequence, query head, row of the sequence */
    int64_t kh;      /* the key/value head of h */
    int64_t sq, sk;  /* the sequence's query and key counts */
    int64_t tq;      /* packed token of the row */
    const float *q;  /* its query vector */
} ref_row;
/* Before the first row; ref_next_row() moves to the next row and returns 0 after the last. */
ref_row ref_rows_begin(void);
int ref_next_row(const ref_problem *p, ref_row *r);
/* Row i of query head h of sequence b. */
ref_row ref_row_at(const ref_problem *p, int64_t b, int64_t h, int64_t i);

/* The references on every core. Runs job(arg, index, scratch) once for each index in [0, jobs), in
 * any order and on several threads at once, the calling thread among them; returns when all have
 * run. Each thread has its own zeroed scratch of scratch_bytes, handed to every job it runs (jobs
 * must not expect it zeroed again). The jobs must write disjoint outputs, each with a fixed order of
 * operations, so that the result is bitwise that of one thread. Threads: the online cores, or
 * FLASHATTN_TEST_REF_THREADS (1 = the calling thread alone), at most 64; where a thread cannot be
 * started, the others (at least the caller) run its jobs. */
typedef void (*ref_job)(void *arg, int64_t index, void *scratch);
void ref_parallel(int64_t jobs, size_t scratch_bytes, ref_job job, void *arg);

/* The problem of one case over its logical arrays q, k, v and dout (NULL for the forward). */
ref_problem shape_problem(const case_shape *s, const attn_case *c, const float *q, const float *k, const float *v,
                          const float *dout);

#ifdef __cplusplus
}
#endif

#endif
