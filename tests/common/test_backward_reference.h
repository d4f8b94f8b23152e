/* Gradient references for the backward-pass tests, written independently of the library: the
 * naive attention gradient in double precision, and the same naive algorithm run in the input
 * dtype (the baseline of FlashAttention's tolerance rule "error at most 2x that of the naive
 * algorithm in the input dtype"). Both materialise every score of a row; neither shares code with
 * src/. */
#ifndef FLASHATTN_TEST_BACKWARD_REFERENCE_H
#define FLASHATTN_TEST_BACKWARD_REFERENCE_H

#include <stdint.h>

#include "flashattn/flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One problem as the gradient references see it: logical, contiguous arrays indexed by token (the
 * rows of all sequences one after another), head and dimension; values already rounded to the
 * dtype. The loss is L = sum(O * dout). */
typedef struct grad_problem {
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
    const float *dout; /* [total_q][heads_q][head_dim_v] */
} grad_problem;

/* 1 if key j is visible to query i of a sequence with sq queries and sk keys: the documented rule,
 * bottom-right aligned (diag = i + sk - sq; causal: j <= diag; window: diag - left <= j <= diag + right). */
int grad_visible(const grad_problem *p, int64_t i, int64_t j, int64_t sq, int64_t sk);

/* Double-precision gradients: dq [total_q][heads_q][head_dim], dk [total_k][heads_kv][head_dim],
 * dv [total_k][heads_kv][head_dim_v] (dK, dV summed over each key/value head's query group).
 * Optional (may be NULL): o [total_q][heads_q][head_dim_v] the forward output; q_sees
 * [total_q * heads_q] set to 1 where the query row sees at least one key; k_seen
 * [total_k * heads_kv] set to 1 where some query of the group sees the key. Rows that see no key
 * have dq = 0 (and o = 0); keys nobody sees have dk = dv = 0. */
void grad_reference(const grad_problem *p, double *dq, double *dk, double *dv, double *o,
                    unsigned char *q_sees, unsigned char *k_seen);

/* The same naive algorithm in the input dtype, as FlashAttention's reference runs it in PyTorch
 * without upcasting: every matmul accumulates in float and rounds its result to the dtype; scores,
 * the softcap's tanh and its chain rule, P, dP and dS are rounded to the dtype; the softmax and its
 * backward run in float on dtype values (dS = P * (dP - sum(dP * P))); dK and dV are rounded per
 * query head and summed over the group. Outputs as grad_reference(). */
void grad_reference_lowp(const grad_problem *p, double *dq, double *dk, double *dv);

#ifdef __cplusplus
}
#endif

#endif
