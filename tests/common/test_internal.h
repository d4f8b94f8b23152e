/* Internal interface between the files of tests/common (not for the test executables). */
#ifndef FLASHATTN_TEST_INTERNAL_H
#define FLASHATTN_TEST_INTERNAL_H

#include <stdint.h>

#include "test_reference.h"
#include "test_support.h"

/* Double-precision reference: o [total_q][heads_q][head_dim_v], lse [heads_q][total_q] (natural
 * log; -INFINITY and o = 0 for rows that see no key). */
void ref_attention(const ref_problem *p, double *o, double *lse);

/* The same naive algorithm in the input dtype: scores rounded to the dtype, softmax in float,
 * probabilities rounded to the dtype, P.V accumulated in float and rounded. o as above. */
void ref_attention_lowp(const ref_problem *p, double *o);

#endif
