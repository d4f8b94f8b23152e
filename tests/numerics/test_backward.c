/* Numerical correctness of one backend's backward pass (TEST_BACKEND) against the tests' own
 * double-precision gradient, over a covering grid of shapes and features. Built once per backend:
 * test_backward_cpu (label cpu), test_backward_fa2 and test_backward_fa3 (label gpu, skipped without
 * a GPU; fa3: sm_90 only, the forward and the backward both forced to it).
 *
 * Each case: fresh random inputs and dO (U(-1, 1) rounded to the dtype; every stride gap of every
 * tensor holds NaN), the library's forward on the same plan for O and LSE, then the backward with
 * dQ, dK, dV and the workspace poisoned (NaN). Every element of dQ, dK, dV is checked against
 * grad_reference() (tests/common/test_backward_reference.c, the naive gradient in double), the
 * stride gaps of the gradients must still hold the poison, rows that see no key must have dQ = 0
 * and keys no query sees dK = dV = 0 exactly, and the inputs (q, k, v, o, dout, lse) must be
 * unchanged. A second run must be bit-identical: always on the CPU backend (it documents that it
 * always is), with FLASHATTN_I64_DETERMINISTIC = 1 on GPU backends.
 *
 * Tolerance (FlashAttention's rule): fp16/bf16: max|grad - ref| <= 2 * max|grad_lowp - ref| +
 * 1e-4 * max|ref| + 1e-6 per tensor, where grad_lowp is the same naive algorithm run in the input
 * dtype (grad_reference_lowp(), as FlashAttention's PyTorch reference without upcasting).
 * fp32: max|grad - ref| <= 2e-5 * max|ref| + 1e-6 (the CPU backend measures up to 4e-6 * max|ref|;
 * the 1e-6 floor covers fp32 cancellation noise in dP - rowsum(dO * O) where the exact gradient is 0,
 * e.g. rows that see one key; the naive algorithm in float is printed with FLASHATTN_TEST_VERBOSE=1).
 *
 * Also (cpu only): central finite differences of L = sum(O * dO) through the library's forward on
 * tiny fp32 shapes, against both the library's gradient and the double reference.
 *
 * What each backend runs: cpu: fp32, fp16, bf16, any head_dim / head_dim_v; fa2: fp16, bf16
 * (the grid's fp32 cases run in bf16), head_dim 8..256, head_dim_v == head_dim; fa3: as fa2
 * (136..256 on its 256 kernel since stop 21). FLASHATTN_TEST_REDUCED=1
 * keeps every third small case (for compute-sanitizer). FLASHATTN_TEST_SEED changes the inputs.
 * The references run on every core; FLASHATTN_TEST_REF_THREADS=n sets how many threads (the same
 * results bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_backward_reference.h"
#include "test_runner.h"

/* The problem in attn's fields (with_lse unused; strided: 0 contiguous, 1 every tensor padded, 2 only
 * dO, dQ, dK, dV padded, the forward contiguous). */
typedef struct bwd_case {
    attn_case attn;
    int deterministic;
    int gpu_only;
} bwd_case;

/* Field order: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, causal,
 * window_left, window_right, softcap, scale, varlen, strided, deterministic. */
#define CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, 0}, det, 0}
#define GPU_CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, 0}, det, 1}

static const bwd_case grid[] = {
    /* ---- Odd shapes, no mask: MHA / GQA 6/2 / MQA 8/1; seqlen_q < seqlen_k and > ---------- */
    CASE(1, 1, 1, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 1, 129, 4, 4, 64, 0, B16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 129, 1, 2, 2, 40, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 17, 53, 6, 2, 64, 0, F32, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 53, 17, 8, 1, 128, 0, B16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 100, 129, 6, 2, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 129, 100, 2, 2, 64, 0, F32, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 37, 53, 8, 1, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    /* Head dimensions. */
    CASE(2, 37, 53, 2, 2, 8, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 17, 53, 3, 3, 8, 0, F32, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 37, 53, 2, 2, 40, 0, B16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 100, 53, 2, 1, 96, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 37, 53, 2, 1, 256, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 100, 129, 2, 2, 256, 0, B16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 37, 129, 2, 2, 256, 0, F32, 0, -1, -1, 0, 0, 0, 0, 0),
    /* head_dim_v != head_dim (CPU only by the documented ranges). */
    CASE(2, 37, 53, 4, 2, 64, 128, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 53, 37, 4, 2, 128, 64, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 17, 129, 2, 1, 40, 256, F32, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(3, 37, 53, 6, 2, 32, 96, B16, 1, 16, 4, 0, 0, 1, 1, 0),
    CASE(2, 100, 1, 2, 2, 256, 8, F16, 0, -1, -1, 0, 0, 0, 0, 0),

    /* ---- Causal (bottom-right aligned; seqlen_q > seqlen_k gives rows that see no key) ------ */
    CASE(2, 37, 129, 6, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 129, 37, 4, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 100, 53, 2, 2, 64, 0, F32, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 1, 129, 8, 1, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 129, 1, 4, 4, 40, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 100, 100, 2, 2, 256, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 17, 17, 2, 2, 8, 0, F32, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 1, 1, 2, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),

    /* ---- Sliding windows (with and without causal); unseen keys must get dK = dV = 0 -------- */
    CASE(2, 100, 129, 6, 2, 64, 0, F16, 0, 32, 0, 0, 0, 0, 0, 0),
    CASE(2, 100, 129, 4, 4, 128, 0, B16, 1, 16, 8, 0, 0, 0, 0, 0),
    CASE(2, 129, 53, 2, 1, 64, 0, F16, 0, 10, 5, 0, 0, 0, 0, 0),
    CASE(2, 129, 53, 2, 2, 40, 0, F32, 0, 0, 0, 0, 0, 0, 0, 0),
    CASE(1, 129, 37, 2, 2, 64, 0, B16, 0, 0, 0, 0, 0, 0, 1, 0),
    CASE(2, 37, 129, 2, 2, 8, 0, F16, 0, -1, 0, 0, 0, 0, 0, 0),
    CASE(2, 37, 129, 2, 2, 40, 0, B16, 0, 5, -1, 0, 0, 0, 0, 0),
    CASE(2, 53, 129, 6, 2, 256, 0, F16, 0, -1, 20, 0, 0, 0, 0, 0),
    CASE(1, 17, 129, 2, 2, 64, 0, F32, 0, 3, 3, 0, 0, 0, 0, 0),
    CASE(2, 100, 17, 8, 1, 128, 0, F16, 1, 2, 2, 0, 0, 0, 0, 0),
    CASE(1, 53, 100, 2, 2, 64, 0, B16, 1, 5000000000LL, 3000000000LL, 0, 0, 0, 0, 0),

    /* ---- Softcap (scale 1 so the cap bends the scores), through the tanh's chain rule ------- */
    CASE(2, 37, 53, 6, 2, 64, 0, F16, 0, -1, -1, 5.0, 1.0, 0, 0, 0),
    CASE(2, 53, 100, 8, 1, 128, 0, B16, 1, -1, -1, 5.0, 1.0, 0, 0, 0),
    CASE(2, 37, 129, 2, 2, 64, 0, F32, 0, -1, -1, 50.0, 0, 0, 0, 0),
    CASE(1, 17, 53, 2, 2, 40, 0, F32, 0, -1, -1, 2.0, 1.0, 0, 0, 0),
    CASE(1, 100, 100, 2, 2, 128, 0, F16, 0, 32, 32, 2.0, 0.5, 0, 1, 0),
    CASE(2, 17, 129, 4, 2, 256, 0, B16, 0, -1, -1, 15.0, 0.3, 0, 0, 0),

    /* ---- Explicit softmax scale ---------------------------------------------------------------- */
    CASE(2, 37, 53, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0.05, 0, 0, 0),
    CASE(2, 53, 37, 2, 2, 128, 0, F32, 1, -1, -1, 0, 1.5, 0, 0, 0),
    CASE(2, 17, 53, 2, 2, 40, 0, B16, 0, -1, -1, 0, 0.7, 0, 0, 0),

    /* ---- Strided dO / dQ / dK / dV (padding must stay untouched) ------------------------------ */
    CASE(2, 37, 53, 6, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 129, 1, 2, 2, 128, 0, B16, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 1, 129, 8, 1, 64, 0, F32, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 53, 100, 4, 4, 256, 0, F16, 1, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 37, 53, 4, 2, 40, 0, B16, 1, -1, -1, 0, 0, 0, 2, 0),
    CASE(2, 100, 53, 2, 2, 64, 96, F32, 0, 8, 8, 0, 0, 0, 2, 0),

    /* ---- Variable length: batch >= 3 has a sequence with zero queries and zero keys; >= 4 one
     * with zero keys only (its dQ rows are 0); >= 5 one with zero queries only (dK = dV = 0). */
    CASE(4, 37, 53, 6, 2, 64, 0, F16, 0, -1, -1, 0, 0, 1, 0, 0),
    CASE(5, 53, 37, 4, 4, 128, 0, B16, 1, -1, -1, 0, 0, 1, 0, 0),
    CASE(3, 100, 1, 2, 2, 40, 0, F16, 0, -1, -1, 0, 0, 1, 0, 0),
    CASE(3, 1, 100, 8, 1, 64, 0, B16, 0, -1, -1, 0, 0, 1, 0, 0),
    CASE(6, 37, 37, 2, 2, 40, 0, F32, 0, 8, 8, 0, 0, 1, 1, 0),
    CASE(5, 100, 53, 6, 2, 64, 0, B16, 1, -1, -1, 10.0, 1.0, 1, 1, 0),
    CASE(4, 17, 129, 2, 2, 256, 0, F16, 0, 16, 0, 0, 0, 1, 0, 0),
    CASE(5, 53, 129, 4, 2, 64, 0, F32, 1, -1, -1, 0, 0.2, 1, 2, 0),

    /* ---- Deterministic mode: two runs bitwise identical (GQA and varlen, where GPU backends
     * would otherwise reduce dK/dV and dQ with atomics) -------------------------------------- */
    CASE(2, 100, 129, 8, 1, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(5, 53, 100, 6, 2, 128, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),
    CASE(2, 129, 129, 4, 2, 64, 0, F16, 0, 20, 20, 0, 0, 0, 1, 1),
    CASE(1, 37, 53, 2, 2, 256, 0, F32, 0, -1, -1, 5.0, 1.0, 0, 0, 1),
    /* GPU key blocks take turns per query block, from the first that sees it: windows and
     * seqlen_q > seqlen_k move that first block off 0. */
    CASE(1, 100, 200, 4, 2, 128, 0, F16, 0, 30, 10, 0, 0, 0, 0, 1),
    CASE(3, 129, 100, 2, 1, 64, 0, B16, 1, 40, -1, 0, 0, 1, 0, 1),

    /* ---- A few longer rows (several tiles per row and column on every backend) --------------- */
    CASE(1, 300, 257, 4, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 257, 513, 2, 1, 128, 0, B16, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 200, 300, 4, 2, 64, 0, F32, 0, 64, 16, 0, 0, 0, 0, 0),

    /* ---- Head dims 136..256 (fa3 on the 256 row, 200 and 248 zero-padded: the 80-key layout, or
     * the split layout under FLASHATTN_FA3_BWD_WIDE=0, test_backward_fa3_split): MHA / GQA / MQA, seqlen_q < seqlen_k and >, causal (bottom-right),
     * windows, soft cap, varlen, strided, deterministic; small enough that the reduced grid keeps
     * some. Key blocks of 80 keys: exact multiples, windows whose edges cross a block's two
     * 40-key halves. ----------------------------------------------------------------------- */
    CASE(1, 160, 160, 2, 2, 256, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 97, 241, 4, 2, 192, 0, F16, 0, 79, 41, 0, 0, 0, 0, 0),
    CASE(2, 53, 17, 6, 2, 256, 0, B16, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 17, 129, 8, 1, 200, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 129, 100, 2, 2, 248, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 100, 129, 4, 2, 192, 0, F16, 0, 30, 10, 0, 0, 0, 1, 0),
    CASE(3, 65, 100, 4, 4, 136, 0, B16, 1, -1, -1, 5.0, 1.0, 0, 0, 0),
    CASE(5, 53, 100, 6, 2, 256, 0, F16, 1, -1, -1, 0, 0, 1, 0, 1),
    CASE(2, 129, 65, 2, 1, 256, 0, F16, 0, -1, -1, 0, 0.5, 0, 2, 0),
    CASE(1, 100, 200, 4, 1, 256, 0, B16, 0, 40, 0, 0, 0, 0, 0, 1),
    CASE(5, 37, 53, 4, 2, 200, 0, B16, 0, -1, -1, 0, 0, 1, 0, 0),
    GPU_CASE(2, 1000, 900, 4, 2, 256, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(2, 700, 1300, 6, 2, 192, 0, B16, 0, 300, 100, 0, 0, 0, 0, 0),
    GPU_CASE(4, 500, 700, 4, 1, 248, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),

    /* ---- GPU only: long sequences, large heads, decode-like shapes ---------------------------- */
    GPU_CASE(1, 1024, 1024, 4, 2, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(1, 1023, 1025, 4, 1, 64, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(1, 2048, 2048, 2, 1, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 1000, 777, 2, 2, 256, 0, B16, 0, -1, -1, 0, 0, 0, 1, 0),
    GPU_CASE(3, 700, 900, 4, 2, 96, 0, F16, 1, 128, 0, 0, 0, 1, 0, 0),
    GPU_CASE(1, 1024, 1024, 4, 4, 64, 0, B16, 0, -1, -1, 30.0, 0, 0, 0, 0),
    GPU_CASE(2, 1, 4096, 32, 8, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(4, 8, 2048, 16, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(8, 256, 256, 8, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    /* Deterministic with many key blocks per query block in flight at once. */
    GPU_CASE(2, 1500, 1300, 4, 2, 128, 0, B16, 1, 300, -1, 0, 0, 0, 0, 1),
    GPU_CASE(4, 700, 900, 6, 2, 64, 0, F16, 0, 200, 50, 0, 0, 1, 0, 1),
    GPU_CASE(1, 1024, 1024, 2, 2, 256, 0, B16, 1, -1, -1, 0, 0, 0, 1, 1),
    /* Deterministic at head dim 64 with two key blocks and two query blocks; the last one is in
     * the reduced grid (the sanitizers' runs had no deterministic head-dim-64 case). */
    CASE(2, 129, 200, 4, 2, 64, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 200, 129, 2, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 100, 256, 4, 1, 64, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    /* Deterministic: many key blocks per query block (few query blocks, GQA), causal with
     * seqlen_q < seqlen_k and > (the first and the last key block that sees a query block both
     * move), windows, and varlen with sequences of different lengths (key blocks past a short
     * sequence's end exit at once): the dQ turns may run in either key order
     * (FLASHATTN_FA3_BWD_DET_ORDER=0 forces fa3 to ascending key blocks where it would rotate). */
    GPU_CASE(2, 64, 1000, 8, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 100, 1100, 4, 1, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 300, 700, 4, 2, 128, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 700, 300, 4, 2, 64, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 600, 500, 2, 2, 128, 0, B16, 0, 100, 30, 0, 0, 0, 0, 1),
    GPU_CASE(6, 500, 900, 4, 2, 128, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),
    GPU_CASE(5, 900, 400, 6, 3, 64, 0, F16, 1, -1, -1, 0, 0, 1, 0, 1),
    /* Deterministic without a mask up to 2k keys: fa3 takes its turns in the order of the
     * keys-rotated walks (fa3_bwd_turns.h): more query blocks than key blocks and fewer, varlen
     * (sequences with fewer key blocks than the grid), GQA, the split layout. */
    CASE(2, 100, 300, 2, 1, 128, 0, B16, 0, -1, -1, 0, 0, 1, 0, 1),
    GPU_CASE(1, 2000, 600, 4, 2, 128, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(6, 500, 900, 4, 2, 128, 0, F16, 0, -1, -1, 0, 0, 1, 0, 1),
    GPU_CASE(2, 700, 2000, 6, 3, 64, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(2, 300, 1000, 4, 2, 256, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    /* ... and many pairs of eight key blocks at head dim 64, whose dQ pages alternate between the
     * consumer warpgroups (stop 30: a turn count written by the warpgroup that did not own the
     * slot hung the benchmark's shape, b 16 h 32 s 1024). */
    GPU_CASE(4, 1024, 1024, 8, 8, 64, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    /* The default mode's keys-rotated order past 2k keys (fa3 takes it up to 4k keys, 8k at head
     * dim 64; stop 30 timed it without running this grid): causal with seqlen_q < seqlen_k, a long
     * window, GQA, both dtypes. Few query rows, so that the reference (one thread, fp64) stays
     * within seconds. */
    GPU_CASE(1, 700, 3500, 2, 1, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(1, 300, 4000, 2, 1, 256, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(1, 500, 7000, 2, 1, 64, 0, B16, 0, 500, 0, 0, 0, 0, 0, 0),
    GPU_CASE(2, 300, 6000, 2, 1, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 0),
    /* ... and the deterministic mode there, whose turns follow the same walks (a per-CTA turn
     * table under every mask): causal both ways, a window, varlen. */
    GPU_CASE(1, 700, 3500, 2, 1, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 2600, 2300, 2, 1, 128, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 300, 4000, 2, 1, 256, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 500, 7000, 2, 1, 64, 0, B16, 0, 500, 0, 0, 0, 0, 0, 1),
    GPU_CASE(3, 600, 3000, 2, 1, 64, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),
    /* Many query rows past 2k keys, now that the references run on every core (stop 31's
     * 3000 x 3500 x 4 heads took test_backward_fa3 past 200 s on one): near-square causal and
     * not, both modes, GQA, each head dim's layout. */
    GPU_CASE(1, 3000, 3500, 4, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    GPU_CASE(1, 3000, 3500, 4, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 4100, 4100, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 2500, 2100, 2, 1, 256, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
};

#define NUM_CASES (sizeof grid / sizeof grid[0])

/* Finite-difference cases (cpu, fp32): tiny shapes, every feature that bends the gradient. */
static const bwd_case fd_cases[] = {
    CASE(1, 5, 7, 4, 2, 8, 0, F32, 0, -1, -1, 0, 0, 0, 0, 0),
    CASE(2, 6, 4, 2, 1, 16, 8, F32, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 5, 9, 2, 2, 8, 0, F32, 0, 2, 1, 2.0, 0.9, 0, 1, 0),
    CASE(4, 5, 6, 3, 1, 8, 16, F32, 1, -1, -1, 3.0, 0, 1, 2, 0),
};

#define NUM_FD (sizeof fd_cases / sizeof fd_cases[0])

static uint64_t g_seed = 0x5eedbac4a2d5eedull;

/* ---- Buffers ---------------------------------------------------------------------------------- */

/* Whole 256-byte blocks: the poison, the snapshots and the uploads cover the padding too. */
static int alloc_blocks(test_mem *m, size_t bytes) {
    return test_mem_alloc(m, bytes ? (bytes + 255) / 256 * 256 : 256, test_on_device(TEST_BACKEND));
}

static int sync_device(void) {
    const char *err = test_on_device(TEST_BACKEND) ? test_device_error() : NULL;
    if (err == NULL) return 0;
    printf("CUDA error: %s\n", err);
    return -1;
}

/* ---- One case: sizes, inputs, plan, forward, backward ------------------------------------------- */

typedef struct ctx {
    const bwd_case *c;
    char desc[512];
    case_shape s; /* sizes and sequences */
    size_t es, lse_count, ws_fwd, ws_bwd;
    tensor_layout lq, lk, lv, lo, ldo, ldq, ldk, ldv;
    float *qf, *kf, *vf, *gf; /* logical inputs and dO, [token][head][dim] */
    test_mem q, k, v, o, dout, lse, gq, gk, gv, cu_q, cu_k, ws_f, ws_b;
    flashattn_plan_t *plan;
    double t_fwd, t_bwd;
} ctx;

static int ctx_fail(ctx *x, const char *fmt, ...) {
    va_list ap;
    printf("FAIL %s: ", x->desc);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return -1;
}

#define API(x, call)                                                                                \
    do {                                                                                            \
        const flashattn_status_t st_ = (call);                                                      \
        if (st_ != FLASHATTN_SUCCESS)                                                               \
            return ctx_fail(x, "%s returned %d (%s): %s", #call, (int)st_, flashattn_status_string(st_), \
                            flashattn_last_error());                                                \
    } while (0)

static void ctx_free(ctx *x) {
    test_mem *all[] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->lse, &x->gq, &x->gk, &x->gv,
                  &x->cu_q, &x->cu_k, &x->ws_f, &x->ws_b};
    size_t i;
    flashattn_plan_destroy(x->plan);
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) test_mem_free(all[i]);
    shape_free(&x->s);
    free(x->qf);
    free(x->kf);
    free(x->vf);
    free(x->gf);
    memset(x, 0, sizeof *x);
}

/* Sequence lengths: fixed; or random per sequence, the first at full length, with (see the grid)
 * empty sequences at distinct random places. */
static int ctx_sequences(ctx *x, test_rng *rng) {
    if (shape_sequences(&x->s, rng)) return ctx_fail(x, "out of memory");
    if (x->s.varlen && x->s.batch >= 3) {
        int64_t order[64], n = x->s.batch - 1, i;
        for (i = 0; i < n && i < 64; ++i) order[i] = i + 1;
        for (i = n - 1; i > 0; --i) { /* shuffle 1..batch-1 */
            const int64_t j = test_rng_range(rng, 0, i), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        x->s.len_q[order[0]] = x->s.len_k[order[0]] = 0;    /* nothing at all */
        if (x->s.batch >= 4) x->s.len_k[order[1]] = 0;      /* queries that see no key */
        if (x->s.batch >= 5) x->s.len_q[order[2]] = 0;      /* keys that no query sees */
    }
    shape_pack(&x->s);
    return 0;
}

/* Layouts and buffers; random inputs and dO (every stride gap poisoned), uploaded. */
static int ctx_inputs(ctx *x, test_rng *rng) {
    const case_shape *s = &x->s;
    const int pad_fwd = x->c->attn.strided == 1, pad_bwd = x->c->attn.strided != 0;
    x->lq = make_layout(s->batch, s->sq, s->total_q, s->varlen, s->hq, s->d, pad_fwd, 8, 16, 24);
    x->lk = make_layout(s->batch, s->sk, s->total_k, s->varlen, s->hk, s->d, pad_fwd, 16, 8, 8);
    x->lv = make_layout(s->batch, s->sk, s->total_k, s->varlen, s->hk, s->dv, pad_fwd, 8, 8, 16);
    x->lo = make_layout(s->batch, s->sq, s->total_q, s->varlen, s->hq, s->dv, pad_fwd, 8, 24, 8);
    x->ldo = make_layout(s->batch, s->sq, s->total_q, s->varlen, s->hq, s->dv, pad_bwd, 16, 8, 24);
    x->ldq = make_layout(s->batch, s->sq, s->total_q, s->varlen, s->hq, s->d, pad_bwd, 8, 8, 8);
    x->ldk = make_layout(s->batch, s->sk, s->total_k, s->varlen, s->hk, s->d, pad_bwd, 24, 16, 8);
    x->ldv = make_layout(s->batch, s->sk, s->total_k, s->varlen, s->hk, s->dv, pad_bwd, 8, 32, 16);
    x->lse_count = (size_t)(s->hq * s->total_q);
    if (alloc_blocks(&x->q, x->lq.elems * x->es) || alloc_blocks(&x->k, x->lk.elems * x->es) ||
        alloc_blocks(&x->v, x->lv.elems * x->es) || alloc_blocks(&x->o, x->lo.elems * x->es) ||
        alloc_blocks(&x->dout, x->ldo.elems * x->es) || alloc_blocks(&x->lse, (x->lse_count + 1) * sizeof(float)) ||
        alloc_blocks(&x->gq, x->ldq.elems * x->es) || alloc_blocks(&x->gk, x->ldk.elems * x->es) ||
        alloc_blocks(&x->gv, x->ldv.elems * x->es) || alloc_blocks(&x->cu_q, (size_t)(s->batch + 1) * 4) ||
        alloc_blocks(&x->cu_k, (size_t)(s->batch + 1) * 4))
        return ctx_fail(x, "could not allocate the tensors");
    shape_cu_seqlens(s, (int32_t *)x->cu_q.host, (int32_t *)x->cu_k.host);
    x->qf = (float *)malloc((size_t)(s->total_q * s->hq * s->d + 1) * sizeof(float));
    x->kf = (float *)malloc((size_t)(s->total_k * s->hk * s->d + 1) * sizeof(float));
    x->vf = (float *)malloc((size_t)(s->total_k * s->hk * s->dv + 1) * sizeof(float));
    x->gf = (float *)malloc((size_t)(s->total_q * s->hq * s->dv + 1) * sizeof(float));
    if (!x->qf || !x->kf || !x->vf || !x->gf) return ctx_fail(x, "out of memory");
    fill_random_tensor(s, rng, &x->q, &x->lq, x->qf, 1, s->hq, s->d);
    fill_random_tensor(s, rng, &x->k, &x->lk, x->kf, 0, s->hk, s->d);
    fill_random_tensor(s, rng, &x->v, &x->lv, x->vf, 0, s->hk, s->dv);
    fill_random_tensor(s, rng, &x->dout, &x->ldo, x->gf, 1, s->hq, s->dv);
    if (test_mem_upload(&x->q) || test_mem_upload(&x->k) || test_mem_upload(&x->v) || test_mem_upload(&x->dout) ||
        test_mem_upload(&x->cu_q) || test_mem_upload(&x->cu_k))
        return ctx_fail(x, "cudaMemcpy of the inputs failed");
    return 0;
}

/* The strides of dO, dQ, dK and dV from their layouts. */
static flashattn_status_t set_gradient_strides(const ctx *x) {
    const tensor_layout *const layouts[4] = {&x->ldo, &x->ldq, &x->ldk, &x->ldv};
    return set_strides_of(x->plan, &test_stride_keys[TEST_STRIDES_DO], layouts, 4, x->s.varlen);
}

/* Fails unless `chosen` is the backend the plan was forced to. */
static int ctx_check_backend(ctx *x, const char *pass, flashattn_backend_t chosen, const char *reason) {
    if (chosen == TEST_BACKEND) return 0;
    return ctx_fail(x, "%s runs on %s, not the %s it was forced to (%s)", pass, test_backend_name(chosen),
                    test_backend_name(TEST_BACKEND), reason ? reason : "");
}

/* The plan, through the public API only, and its workspaces. */
static int ctx_plan(ctx *x) {
    const bwd_case *c = x->c;
    flashattn_backend_t chosen = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    int64_t value = -1;
    API(x, flashattn_plan_create(&x->plan));
    API(x, set_problem_keys(x->plan, &x->s, &c->attn, TEST_BACKEND));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_DETERMINISTIC, c->deterministic ? 1 : 0));
    if (c->attn.strided == 1) API(x, set_forward_strides(x->plan, &x->lq, &x->lk, &x->lv, &x->lo, x->s.varlen));
    if (c->attn.strided != 0) API(x, set_gradient_strides(x));
    API(x, flashattn_plan_finalize(x->plan));
    API(x, flashattn_plan_get_backend(x->plan, &chosen, &reason));
    if (ctx_check_backend(x, "forward", chosen, reason)) return -1;
    API(x, flashattn_plan_get_backward_backend(x->plan, &chosen, &reason));
    if (ctx_check_backend(x, "backward", chosen, reason)) return -1;
    API(x, flashattn_plan_get_i64(x->plan, FLASHATTN_I64_DETERMINISTIC, &value));
    if (value != (c->deterministic ? 1 : 0)) return ctx_fail(x, "FLASHATTN_I64_DETERMINISTIC reads %lld", (long long)value);
    API(x, flashattn_plan_get_workspace_size(x->plan, &x->ws_fwd));
    API(x, flashattn_plan_get_backward_workspace_size(x->plan, &x->ws_bwd));
    if ((x->ws_fwd && alloc_blocks(&x->ws_f, x->ws_fwd)) || (x->ws_bwd && alloc_blocks(&x->ws_b, x->ws_bwd)))
        return ctx_fail(x, "could not allocate the workspaces (%zu and %zu bytes)", x->ws_fwd, x->ws_bwd);
    return 0;
}

static int ctx_init(ctx *x, const bwd_case *c, flashattn_dtype_t dtype, uint64_t seed) {
    test_rng rng;
    int n;
    memset(x, 0, sizeof *x);
    x->c = c;
    shape_resolve(&x->s, &c->attn, dtype);
    x->es = test_dtype_size(dtype);
    n = shape_describe(x->desc, sizeof x->desc, TEST_BACKEND, &c->attn, &x->s);
    snprintf(x->desc + n, sizeof x->desc - (size_t)n, " deterministic=%d seed=%llu]", c->deterministic,
             (unsigned long long)seed);
    test_rng_seed(&rng, seed);
    if (ctx_sequences(x, &rng) || ctx_inputs(x, &rng)) return -1;
    return ctx_plan(x);
}

/* Fill the workspace with 0xff bytes (NaN as fp32): the library must not rely on its content. */
static int poison_workspace(const test_mem *m, size_t bytes) {
    if (bytes == 0) return 0;
    memset(m->host, 0xff, m->bytes);
    return test_mem_upload(m);
}

static int ctx_forward(ctx *x) {
    double t0;
    test_poison(x->s.dtype, x->o.host, x->o.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, x->lse.host, x->lse.bytes);
    if (test_mem_upload(&x->o) || test_mem_upload(&x->lse) || poison_workspace(&x->ws_f, x->ws_fwd))
        return ctx_fail(x, "cudaMemcpy before the forward failed");
    t0 = test_now_seconds();
    if (x->s.varlen)
        API(x, flashattn_plan_execute_varlen(x->plan, test_mem_ptr(&x->q), test_mem_ptr(&x->k), test_mem_ptr(&x->v), test_mem_ptr(&x->o),
                                             (float *)test_mem_ptr(&x->lse), (const int32_t *)test_mem_ptr(&x->cu_q),
                                             (const int32_t *)test_mem_ptr(&x->cu_k), x->ws_fwd ? test_mem_ptr(&x->ws_f) : NULL,
                                             x->ws_fwd, NULL));
    else
        API(x, flashattn_plan_execute(x->plan, test_mem_ptr(&x->q), test_mem_ptr(&x->k), test_mem_ptr(&x->v), test_mem_ptr(&x->o),
                                      (float *)test_mem_ptr(&x->lse), x->ws_fwd ? test_mem_ptr(&x->ws_f) : NULL, x->ws_fwd, NULL));
    if (sync_device()) return ctx_fail(x, "the forward failed on the device");
    x->t_fwd = test_now_seconds() - t0;
    if (test_mem_download(&x->o) || test_mem_download(&x->lse)) return ctx_fail(x, "cudaMemcpy of O and LSE failed");
    return 0;
}

static int ctx_backward(ctx *x) {
    double t0;
    test_poison(x->s.dtype, x->gq.host, x->gq.bytes);
    test_poison(x->s.dtype, x->gk.host, x->gk.bytes);
    test_poison(x->s.dtype, x->gv.host, x->gv.bytes);
    if (test_mem_upload(&x->gq) || test_mem_upload(&x->gk) || test_mem_upload(&x->gv) || poison_workspace(&x->ws_b, x->ws_bwd))
        return ctx_fail(x, "cudaMemcpy before the backward failed");
    t0 = test_now_seconds();
    if (x->s.varlen)
        API(x, flashattn_plan_execute_backward_varlen(
                   x->plan, test_mem_ptr(&x->q), test_mem_ptr(&x->k), test_mem_ptr(&x->v), test_mem_ptr(&x->o), test_mem_ptr(&x->dout),
                   (const float *)test_mem_ptr(&x->lse), test_mem_ptr(&x->gq), test_mem_ptr(&x->gk), test_mem_ptr(&x->gv),
                   (const int32_t *)test_mem_ptr(&x->cu_q), (const int32_t *)test_mem_ptr(&x->cu_k),
                   x->ws_bwd ? test_mem_ptr(&x->ws_b) : NULL, x->ws_bwd, NULL));
    else
        API(x, flashattn_plan_execute_backward(x->plan, test_mem_ptr(&x->q), test_mem_ptr(&x->k), test_mem_ptr(&x->v), test_mem_ptr(&x->o),
                                               test_mem_ptr(&x->dout), (const float *)test_mem_ptr(&x->lse), test_mem_ptr(&x->gq),
                                               test_mem_ptr(&x->gk), test_mem_ptr(&x->gv), x->ws_bwd ? test_mem_ptr(&x->ws_b) : NULL,
                                               x->ws_bwd, NULL));
    if (sync_device()) return ctx_fail(x, "the backward failed on the device");
    x->t_bwd = test_now_seconds() - t0;
    if (test_mem_download(&x->gq) || test_mem_download(&x->gk) || test_mem_download(&x->gv))
        return ctx_fail(x, "cudaMemcpy of dQ, dK, dV failed");
    return 0;
}

/* ---- The check of one gradient ----------------------------------------------------------------- */

typedef struct grad_view {
    const char *name;
    const tensor_layout *l;
    const test_mem *m;
    int q_side; /* rows are queries (dQ) or keys (dK, dV) */
    int64_t heads, dim;
    const double *ref, *low;   /* [token][head][dim] */
    const unsigned char *seen; /* [token * heads + head]: row sees a key / key is seen */
} grad_view;

/* Fails on the first element of the gradient out of tolerance, or not exactly 0 where no key is
 * seen; `tol`, `base` and `max_ref` are printed with it. */
static int check_grad_elements(ctx *x, const grad_view *g, unsigned char *inside, double tol, double base,
                               double max_ref) {
    element_errors errs = element_errors_none();
    int64_t b, i, h, col;
    for (b = 0; b < x->s.batch; ++b) {
        const int64_t len = g->q_side ? x->s.len_q[b] : x->s.len_k[b];
        const int64_t start = g->q_side ? x->s.start_q[b] : x->s.start_k[b];
        for (i = 0; i < len; ++i) {
            const int64_t tok = start + i;
            for (h = 0; h < g->heads; ++h) {
                const int64_t off = layout_offset(g->l, x->s.varlen, b, tok, i, h);
                const int seen = g->seen[tok * g->heads + h];
                for (col = 0; col < g->dim; ++col) {
                    const double out = test_load(x->s.dtype, (unsigned char *)g->m->host + x->es * (size_t)(off + col));
                    inside[off + col] = 1;
                    element_errors_add(&errs, b, i, h, col, out, g->ref[(tok * g->heads + h) * g->dim + col], tol, !seen);
                }
            }
        }
    }
    if (test_verbose())
        printf("  %s %s: max err %.3e (tol %.3e, %s baseline %.3e, max|ref| %.3e)\n", x->desc, g->name, errs.max_err,
               tol, test_dtype_name(x->s.dtype), base, max_ref);
    if (errs.b < 0) return 0;
    return ctx_fail(x,
                    "%s: max|out-ref| = %.4e, tolerance %.4e (%s naive baseline %.4e, max|ref| %.4e); first bad "
                    "element at batch %lld %s %lld head %lld col %lld: out %.8g ref %.8g%s",
                    g->name, errs.max_err, tol, test_dtype_name(x->s.dtype), base, max_ref, errs.b,
                    g->q_side ? "row" : "key", errs.i, errs.h, errs.col, errs.out, errs.ref,
                    errs.must_be_zero ? (g->q_side ? " (this row sees no key: must be exactly 0)"
                                                   : " (no query sees this key: must be exactly 0)")
                                      : "");
}

/* Every element of one gradient against the reference; the stride gaps must hold the poison. */
static int check_grad(ctx *x, const grad_view *g) {
    const int64_t tokens = g->q_side ? x->s.total_q : x->s.total_k;
    unsigned char *inside = (unsigned char *)calloc(g->l->elems, 1);
    double max_ref, base, tol;
    long long gap;
    int failed;
    if (!inside) return ctx_fail(x, "out of memory");
    reference_scale(g->ref, g->low, (size_t)(tokens * g->heads * g->dim), &max_ref, &base);
    tol = x->s.dtype != FLASHATTN_DTYPE_FP32 ? 2.0 * base + 1e-4 * max_ref + 1e-6 : 2e-5 * max_ref + 1e-6;
    failed = check_grad_elements(x, g, inside, tol, base, max_ref);
    gap = failed ? -1 : first_written_gap(x->s.dtype, g->m->host, inside, g->l->elems);
    free(inside);
    if (gap >= 0) return ctx_fail(x, "%s element %lld lies in a stride gap (outside the tensor) but was written", g->name, gap);
    return failed;
}

/* ---- The grid --------------------------------------------------------------------------------- */

static flashattn_dtype_t effective_dtype(flashattn_dtype_t dtype) { return test_effective_dtype(TEST_BACKEND, dtype); }

/* NULL when the backend documents that it runs `c`; otherwise why not. */
static const char *outside_range(const bwd_case *c) {
    const int64_t d = c->attn.head_dim, dv = c->attn.head_dim_v ? c->attn.head_dim_v : c->attn.head_dim;
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU)
        return c->gpu_only ? "GPU-only case (its reference is too slow for the CPU run's time budget)" : NULL;
    if (d < 8 || d > 256 || d % 8 != 0) return "GPU backward: head_dim 8..256, a multiple of 8";
    if (dv != d) return "GPU backward: head_dim_v must equal head_dim";
    return NULL;
}

static int run_one(const bwd_case *c, uint64_t seed) {
    ctx x;
    ref_problem p;
    double *ref_dq = NULL, *ref_dk = NULL, *ref_dv = NULL, *low_dq = NULL, *low_dk = NULL, *low_dv = NULL;
    unsigned char *q_sees = NULL, *k_seen = NULL;
    unsigned char *first[3] = {NULL, NULL, NULL}, *snap[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const test_mem *inputs[6];
    static const char *input_names[6] = {"q", "k", "v", "o", "dout", "lse"};
    double t_ref;
    int result = -1, i;
    const int twice = TEST_BACKEND == FLASHATTN_BACKEND_CPU || c->deterministic;

    if (ctx_init(&x, c, effective_dtype(c->attn.dtype), seed)) goto done;
    if (ctx_forward(&x)) goto done;
    inputs[0] = &x.q;
    inputs[1] = &x.k;
    inputs[2] = &x.v;
    inputs[3] = &x.o;
    inputs[4] = &x.dout;
    inputs[5] = &x.lse;
    for (i = 0; i < 6; ++i) {
        if (!(snap[i] = (unsigned char *)malloc(inputs[i]->bytes))) goto done;
        memcpy(snap[i], inputs[i]->host, inputs[i]->bytes);
    }
    if (ctx_backward(&x)) goto done;

    /* References. */
    t_ref = test_now_seconds();
    p = shape_problem(&x.s, &c->attn, x.qf, x.kf, x.vf, x.gf);
    ref_dq = (double *)malloc((size_t)(x.s.total_q * x.s.hq * x.s.d + 1) * sizeof(double));
    low_dq = (double *)malloc((size_t)(x.s.total_q * x.s.hq * x.s.d + 1) * sizeof(double));
    ref_dk = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.d + 1) * sizeof(double));
    low_dk = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.d + 1) * sizeof(double));
    ref_dv = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.dv + 1) * sizeof(double));
    low_dv = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.dv + 1) * sizeof(double));
    q_sees = (unsigned char *)malloc((size_t)(x.s.total_q * x.s.hq + 1));
    k_seen = (unsigned char *)malloc((size_t)(x.s.total_k * x.s.hk + 1));
    if (!ref_dq || !low_dq || !ref_dk || !low_dk || !ref_dv || !low_dv || !q_sees || !k_seen) {
        ctx_fail(&x, "out of memory");
        goto done;
    }
    grad_reference(&p, ref_dq, ref_dk, ref_dv, NULL, q_sees, k_seen);
    grad_reference_lowp(&p, low_dq, low_dk, low_dv);
    t_ref = test_now_seconds() - t_ref;

    {
        const grad_view views[3] = {
            {"dQ", &x.ldq, &x.gq, 1, x.s.hq, x.s.d, ref_dq, low_dq, q_sees},
            {"dK", &x.ldk, &x.gk, 0, x.s.hk, x.s.d, ref_dk, low_dk, k_seen},
            {"dV", &x.ldv, &x.gv, 0, x.s.hk, x.s.dv, ref_dv, low_dv, k_seen},
        };
        for (i = 0; i < 3; ++i)
            if (check_grad(&x, &views[i])) goto done;
    }
    for (i = 0; i < 6; ++i) {
        if (!test_mem_unchanged(inputs[i], snap[i])) {
            ctx_fail(&x, "the backward wrote into its input %s", input_names[i]);
            goto done;
        }
    }
    if (test_verbose())
        printf("  %s: forward %.3f ms, backward %.3f ms, references %.2f s\n", x.desc, x.t_fwd * 1e3, x.t_bwd * 1e3, t_ref);

    if (twice) { /* a second run must reproduce the first bit for bit */
        const test_mem *grads[3] = {&x.gq, &x.gk, &x.gv};
        static const char *names[3] = {"dQ", "dK", "dV"};
        for (i = 0; i < 3; ++i) {
            if (!(first[i] = (unsigned char *)malloc(grads[i]->bytes))) goto done;
            memcpy(first[i], grads[i]->host, grads[i]->bytes);
        }
        if (ctx_backward(&x)) goto done;
        for (i = 0; i < 3; ++i) {
            if (memcmp(first[i], grads[i]->host, grads[i]->bytes) != 0) {
                size_t e = 0;
                while (first[i][e] == ((unsigned char *)grads[i]->host)[e]) ++e;
                ctx_fail(&x, "second run differs from the first in %s (first differing byte %zu)%s", names[i], e,
                         c->deterministic ? " although FLASHATTN_I64_DETERMINISTIC = 1" : " (the CPU backend is always deterministic)");
                goto done;
            }
        }
    }
    result = 0;

done:
    for (i = 0; i < 3; ++i) free(first[i]);
    for (i = 0; i < 6; ++i) free(snap[i]);
    free(ref_dq);
    free(ref_dk);
    free(ref_dv);
    free(low_dq);
    free(low_dk);
    free(low_dv);
    free(q_sees);
    free(k_seen);
    ctx_free(&x);
    return result;
}

static void run_case(void **state) {
    const bwd_case *c = (const bwd_case *)*state;
    test_skip_if_outside(outside_range(c));
    assert_int_equal(run_one(c, test_case_seed(g_seed, (size_t)(c - grid))), 0);
}

/* ---- Finite differences (cpu, fp32) ------------------------------------------------------------- */

/* L = sum(O * dO) over every element of the tensor, from the O the last forward wrote. */
static double loss(const ctx *x) {
    double l = 0.0;
    int64_t b, i, h, col;
    for (b = 0; b < x->s.batch; ++b) {
        for (i = 0; i < x->s.len_q[b]; ++i) {
            const int64_t tok = x->s.start_q[b] + i;
            for (h = 0; h < x->s.hq; ++h) {
                const int64_t off = layout_offset(&x->lo, x->s.varlen, b, tok, i, h);
                for (col = 0; col < x->s.dv; ++col)
                    l += test_load(x->s.dtype, (unsigned char *)x->o.host + x->es * (size_t)(off + col)) *
                         (double)x->gf[(tok * x->s.hq + h) * x->s.dv + col];
            }
        }
    }
    return l;
}

/* Sequence of packed token `tok` (rows [start, start + len) of each sequence). */
static int64_t sequence_of(const int64_t *start, const int64_t *len, int64_t batch, int64_t tok) {
    int64_t b;
    for (b = 0; b < batch; ++b)
        if (tok >= start[b] && tok < start[b] + len[b]) return b;
    return -1;
}

static void finite_differences(void **state) {
    const bwd_case *c = (const bwd_case *)*state;
    const size_t index = (size_t)(c - fd_cases);
    const double h = 1.0 / 128.0; /* fp32 O carries ~1e-7 relative error: (L+ - L-)/2h keeps ~1e-5 */
    ctx x;
    ref_problem p;
    double *ref[3] = {NULL, NULL, NULL};
    test_rng rng;
    int t, n, failures = 0;
    if (ctx_init(&x, c, FLASHATTN_DTYPE_FP32, g_seed ^ (0xfdfdull + index))) goto out;
    if (ctx_forward(&x) || ctx_backward(&x)) goto out;
    p = shape_problem(&x.s, &c->attn, x.qf, x.kf, x.vf, x.gf);
    ref[0] = (double *)malloc((size_t)(x.s.total_q * x.s.hq * x.s.d + 1) * sizeof(double));
    ref[1] = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.d + 1) * sizeof(double));
    ref[2] = (double *)malloc((size_t)(x.s.total_k * x.s.hk * x.s.dv + 1) * sizeof(double));
    if (!ref[0] || !ref[1] || !ref[2]) goto out;
    grad_reference(&p, ref[0], ref[1], ref[2], NULL, NULL, NULL);
    test_rng_seed(&rng, g_seed + 77 * index);
    for (t = 0; t < 3; ++t) { /* Q, K, V */
        static const char *names[3] = {"Q", "K", "V"};
        const int q_side = t == 0;
        const int64_t tokens = q_side ? x.s.total_q : x.s.total_k, heads = q_side ? x.s.hq : x.s.hk;
        const int64_t dim = t == 2 ? x.s.dv : x.s.d;
        test_mem *in = t == 0 ? &x.q : t == 1 ? &x.k : &x.v;
        const tensor_layout *lin = t == 0 ? &x.lq : t == 1 ? &x.lk : &x.lv;
        float *logical = t == 0 ? x.qf : t == 1 ? x.kf : x.vf;
        const test_mem *grad = t == 0 ? &x.gq : t == 1 ? &x.gk : &x.gv;
        const tensor_layout *lg = t == 0 ? &x.ldq : t == 1 ? &x.ldk : &x.ldv;
        double gmax = 0.0;
        int64_t e;
        for (e = 0; e < tokens * heads * dim; ++e)
            if (fabs(ref[t][e]) > gmax) gmax = fabs(ref[t][e]);
        for (n = 0; n < 8 && tokens > 0; ++n) {
            const int64_t tok = test_rng_range(&rng, 0, tokens - 1), hh = test_rng_range(&rng, 0, heads - 1);
            const int64_t col = test_rng_range(&rng, 0, dim - 1);
            const int64_t b = sequence_of(q_side ? x.s.start_q : x.s.start_k, q_side ? x.s.len_q : x.s.len_k, x.s.batch, tok);
            const int64_t row = tok - (q_side ? x.s.start_q[b] : x.s.start_k[b]);
            unsigned char *at = (unsigned char *)in->host + 4 * (size_t)(layout_offset(lin, x.s.varlen, b, tok, row, hh) + col);
            const double x0 = logical[(tok * heads + hh) * dim + col];
            const double xp = (double)(float)(x0 + h), xm = (double)(float)(x0 - h);
            const double lib = test_load(FLASHATTN_DTYPE_FP32,
                                         (unsigned char *)grad->host + 4 * (size_t)(layout_offset(lg, x.s.varlen, b, tok, row, hh) + col));
            const double r = ref[t][(tok * heads + hh) * dim + col];
            double lp, lm, fd, tol;
            test_store(FLASHATTN_DTYPE_FP32, at, xp);
            if (test_mem_upload(in) || ctx_forward(&x)) goto out;
            lp = loss(&x);
            test_store(FLASHATTN_DTYPE_FP32, at, xm);
            if (test_mem_upload(in) || ctx_forward(&x)) goto out;
            lm = loss(&x);
            test_store(FLASHATTN_DTYPE_FP32, at, x0);
            if (test_mem_upload(in)) goto out;
            fd = (lp - lm) / (xp - xm);
            tol = 2e-2 * fabs(fd) + 2e-3 * gmax + 1e-5;
            if (test_verbose())
                printf("  %s d%s[tok %lld head %lld col %lld]: finite difference %.7g, library %.7g, reference %.7g\n",
                       x.desc, names[t], (long long)tok, (long long)hh, (long long)col, fd, lib, r);
            if (!(fabs(lib - fd) <= tol)) {
                printf("FAIL %s: d%s[token %lld head %lld col %lld]: library %.7g, finite difference %.7g (tolerance %.3g)\n",
                       x.desc, names[t], (long long)tok, (long long)hh, (long long)col, lib, fd, tol);
                ++failures;
            }
            if (!(fabs(r - fd) <= tol)) {
                printf("FAIL %s: the TEST's reference d%s[token %lld head %lld col %lld] = %.7g disagrees with the "
                       "finite difference %.7g (tolerance %.3g)\n",
                       x.desc, names[t], (long long)tok, (long long)hh, (long long)col, r, fd, tol);
                ++failures;
            }
        }
    }
    fflush(stdout);
    free(ref[0]);
    free(ref[1]);
    free(ref[2]);
    ctx_free(&x);
    assert_int_equal(failures, 0);
    return;
out:
    free(ref[0]);
    free(ref[1]);
    free(ref[2]);
    ctx_free(&x);
    fail_msg("finite-difference case %d could not run", (int)index);
}

/* ---- main ---------------------------------------------------------------------------------------- */

static char names[NUM_CASES + NUM_FD][200];
static struct CMUnitTest tests[NUM_CASES + NUM_FD];

static void name_case(char *buf, size_t size, const char *prefix, const bwd_case *c) {
    int n = test_case_name(buf, size, prefix, &c->attn, effective_dtype(c->attn.dtype));
    if (c->attn.strided) n += snprintf(buf + n, size - (size_t)n, c->attn.strided == 1 ? "_strided" : "_gradstrided");
    if (c->deterministic) n += snprintf(buf + n, size - (size_t)n, "_det");
    (void)n;
}

int main(void) {
    const int reduced = test_reduced_grid();
    size_t i, n = 0, small = 0;
    int32_t major = 0, minor = 0;
    g_seed = test_seed_from_env(g_seed);
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) test_require_gpu_backend(TEST_BACKEND, &major, &minor);
    printf("backward numerics on backend %s, seed %llu (set FLASHATTN_TEST_SEED to change)%s\n",
           test_backend_name(TEST_BACKEND), (unsigned long long)g_seed, reduced ? ", reduced grid" : "");

    /* FLASHATTN_TEST_REDUCED=1 keeps every third case of at most 128 x 256 scores per head: the
     * grid compute-sanitizer runs. */
    for (i = 0; i < NUM_CASES; ++i) {
        if (!test_keeps_case(reduced, &grid[i].attn, &small)) continue;
        name_case(names[n], sizeof names[n], "", &grid[i]);
        tests[n] = test_unit(names[n], run_case, &grid[i]);
        ++n;
    }
    for (i = 0; TEST_BACKEND == FLASHATTN_BACKEND_CPU && i < NUM_FD; ++i) {
        name_case(names[n], sizeof names[n], "finite_differences_", &fd_cases[i]);
        tests[n] = test_unit(names[n], finite_differences, &fd_cases[i]);
        ++n;
    }
    return _cmocka_run_group_tests(test_backend_name(TEST_BACKEND), tests, n, NULL, NULL);
}
