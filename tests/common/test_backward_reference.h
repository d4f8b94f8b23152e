/* Gradient references for the backward-pass tests, written independently of the library: the
 * naive attention gradient in double precision, and the same naive algorithm run in the input
 * dtype (the baseline of FlashAttention's tolerance rule "error at most 2x that of the naive
 * algorithm in the input dtype"). Both materialise every score of a row; neither shares code with
 * src/. Both run on every core (ref_parallel(), test_reference.h; FLASHATTN_TEST_REF_THREADS=1 for
 * one thread), with results bitwise those of one thread. */
#ifndef FLASHATTN_TEST_BACKWARD_REFERENCE_H
#define FLASHATTN_TEST_BACKWARD_REFERENCE_H

#include <stdint.h>

#include "test_reference.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The problem is a ref_problem (test_reference.h) with dout set; the loss is L = sum(O * dout). */

/* Double-precision gradients: dq [total_q][heads_q][head_dim], dk [total_k][heads_kv][head_dim],
 * dv [total_k][heads_kv][head_dim_v] (dK, dV summed over each key/value head's query group).
 * Optional (may be NULL): o [total_q][heads_q][head_dim_v] the forward output; q_sees
 * [total_q * heads_q] set to 1 where the query row sees at least one key; k_seen
 * [total_k * heads_kv] set to 1 where some query of the group sees the key. Rows that see no key
 * have dq = 0 (and o = 0); keys nobody sees have dk = dv = 0. */
void grad_reference(const ref_problem *p, double *dq, double *dk, double *dv, double *o,
                    unsigned char *q_sees, unsigned char *k_seen);

/* The same naive algorithm in the input dtype, as FlashAttention's reference runs it in PyTorch
 * without upcasting: every matmul accumulates in float and rounds its result to the dtype; scores,
 * the softcap's tanh and its chain rule, P, dP and dS are rounded to the dtype; the softmax and its
 * backward run in float on dtype values (dS = P * (dP - sum(dP * P))); dK and dV are rounded per
 * query head and summed over the group. Outputs as grad_reference(). */
void grad_reference_lowp(const ref_problem *p, double *dq, double *dk, double *dv);

#ifdef __cplusplus
}
#endif

#endif
