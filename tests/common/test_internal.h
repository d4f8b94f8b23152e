/* Internal interface between the files of tests/common (not for the test executables). */
#ifndef FLASHATTN_TEST_INTERNAL_H
#define FLASHATTN_TEST_INTERNAL_H

#include <stdint.h>

#include "test_support.h"

/* One problem as the reference sees it: logical, contiguous arrays indexed by token (the rows of
 * all sequences one after another), head and dimension; values already rounded to the dtype. */
typedef struct ref_problem {
    int64_t batch, heads_q, heads_kv, head_dim, head_dim_v;
    flashattn_dtype_t dtype;
    int causal;
    int64_t window_left, window_right;
    double softcap, scale;
    const int64_t *len_q, *len_k;     /* [batch] rows of each sequence */
    const int64_t *start_q, *start_k; /* [batch] first token of each sequence */
    int64_t total_q, total_k;
    const float *q; /* [total_q][heads_q][head_dim] */
    const float *k; /* [total_k][heads_kv][head_dim] */
    const float *v; /* [total_k][heads_kv][head_dim_v] */
} ref_problem;

/* 1 if key j is visible to query i of a sequence with sq queries and sk keys (the documented rule,
 * bottom-right aligned). */
int ref_visible(const ref_problem *p, int64_t i, int64_t j, int64_t sq, int64_t sk);

/* Double-precision reference: o [total_q][heads_q][head_dim_v], lse [heads_q][total_q] (natural
 * log; -INFINITY and o = 0 for rows that see no key). */
void ref_attention(const ref_problem *p, double *o, double *lse);

/* The same naive algorithm in the input dtype: scores rounded to the dtype, softmax in float,
 * probabilities rounded to the dtype, P.V accumulated in float and rounded. o as above. */
void ref_attention_lowp(const ref_problem *p, double *o);

#endif
