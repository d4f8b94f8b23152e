/* The small problem both API contract tests run (tests/api; owned by tests/common): its sizes, its
 * variable-length packing and the cu_seqlens arrays each entry point must reject. */
#ifndef FLASHATTN_TEST_CONTRACT_H
#define FLASHATTN_TEST_CONTRACT_H

#include <stdint.h>

#define B 2
#define SQ 5
#define SK 7
#define H 4
#define HKV 2
#define D 16
/* Variable length: two sequences packed, cu_seqlens {0, 3, 8} and {0, 7, 10}. */
#define TQ 8
#define TK 10

/* A bad pair of cu_seqlens and the argument the message must mention. */
typedef struct bad_cu_seqlens {
    int32_t q[B + 1], k[B + 1];
    const char *word;
} bad_cu_seqlens;

static const bad_cu_seqlens bad_cu_seqlens_table[] = {
    {{1, 3, 8}, {0, 7, 10}, "cu_seqlens_q"}, /* does not start at 0 */
    {{0, 5, 3}, {0, 7, 10}, "cu_seqlens_q"}, /* decreasing */
    {{0, 3, 7}, {0, 7, 10}, "cu_seqlens_q"}, /* disagrees with total_q */
    {{0, 2, 8}, {0, 7, 10}, "cu_seqlens_q"}, /* a sequence longer than seqlen_q */
    {{0, 3, 8}, {0, 8, 10}, "cu_seqlens_k"}, /* a sequence longer than seqlen_k */
    {{0, 3, 8}, {0, 7, 11}, "cu_seqlens_k"}, /* disagrees with total_k */
};
#define NUM_BAD_CU_SEQLENS (sizeof bad_cu_seqlens_table / sizeof bad_cu_seqlens_table[0])

#endif
