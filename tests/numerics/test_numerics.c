/* Numerical correctness of one backend (TEST_BACKEND) against the tests' independent double
 * reference, over a covering grid of shapes and features. Built once per backend:
 * test_numerics_cpu (label cpu) and test_numerics_fa1/fa2/fa3 (label gpu, skipped without a GPU).
 *
 * Each case gets fresh random inputs (seed = FLASHATTN_TEST_SEED, default fixed, mixed with the
 * case index), poisoned outputs, every element of O and LSE checked, and a second run that must be
 * bit-identical (see check_attention_case()). The references run on every core;
 * FLASHATTN_TEST_REF_THREADS=n sets how many threads (the same results bit for bit).
 *
 * What each backend documents it runs (cases outside are not run; a case inside that fails to
 * finalize, e.g. with NOT_SUPPORTED, fails):
 *   cpu: everything: fp32, fp16, bf16; any head_dim / head_dim_v.
 *   fa1: fp16 (bf16 on sm_80 and newer); head_dim <= 256, a multiple of 8; head_dim_v == head_dim.
 *   fa2: fp16, bf16; head_dim and head_dim_v 8..256, multiples of 8; sm_80 and newer.
 *   fa3: fp16, bf16; head_dim and head_dim_v 8..256, multiples of 8; sm_90 only.
 * All backends run causal, sliding-window, softcap, GQA/MQA, variable-length, strided and LSE
 * cases. GPU backends have no fp32: the grid's fp32 cases run there in bf16 instead, so that
 * every feature combination is still covered. GPU-only cases add long sequences (2048, 4096, 8192)
 * and decode shapes (seqlen_q 1, seqlen_k 8192..32768, 32 query / 8 key-value heads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_runner.h"

typedef struct grid_case {
    attn_case c;
    int gpu_only;
} grid_case;

/* Field order: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, causal,
 * window_left, window_right, softcap, scale, varlen, strided, with_lse. */
#define CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse}, 0}
#define LONG_CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse}, 0}
#define GPU_CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, lse}, 1}

static const grid_case grid[] = {
    /* ---- Shapes from FlashAttention's grids, no mask: MHA / GQA / MQA ---------------------- */
    CASE(1, 1, 1, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 1, 1, 4, 1, 128, 0, F32, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 1, 239, 4, 4, 32, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 239, 1, 4, 4, 40, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 3, 799, 3, 3, 64, 0, F32, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 799, 3, 3, 1, 96, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 4, 2, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 128, 217, 4, 1, 160, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1023, 1024, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1024, 1023, 2, 1, 128, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1023, 1024, 1, 1, 96, 0, F32, 0, -1, -1, 0, 0, 0, 0, 1),
    /* Head dimensions on one odd shape. */
    CASE(2, 113, 203, 2, 2, 32, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 40, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 1, 64, 0, F32, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 96, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 160, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 192, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 256, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 128, 217, 2, 2, 256, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 128, 217, 3, 3, 8, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 128, 217, 2, 2, 256, 0, F32, 0, -1, -1, 0, 0, 0, 0, 1),
    /* head_dim_v != head_dim (cpu, fa2, fa3; fa1 refuses it). */
    CASE(2, 113, 203, 4, 2, 64, 128, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 4, 2, 128, 64, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 128, 217, 2, 1, 40, 256, F32, 0, -1, -1, 0, 0, 0, 1, 1),
    CASE(2, 239, 1, 2, 2, 256, 32, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    CASE(3, 97, 131, 4, 2, 32, 96, B16, 1, 16, 4, 0, 0, 1, 1, 1),

    /* ---- Causal, seqlen_q < seqlen_k and > (bottom-right aligned; > gives fully masked rows) */
    CASE(2, 113, 203, 4, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 203, 113, 4, 2, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 203, 113, 2, 2, 64, 0, F32, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 1, 239, 4, 1, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 239, 1, 4, 4, 32, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 3, 799, 2, 2, 128, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 799, 3, 2, 2, 96, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 128, 217, 4, 4, 96, 0, B16, 1, -1, -1, 0, 0, 0, 1, 1),
    CASE(1, 128, 128, 2, 2, 32, 0, F32, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1023, 1024, 2, 2, 128, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1024, 1023, 4, 1, 64, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(1, 1024, 1023, 1, 1, 256, 0, F32, 1, -1, -1, 0, 0, 0, 1, 1),
    CASE(1, 1, 1, 2, 2, 256, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),

    /* ---- Sliding windows (with and without causal), fully masked rows ------------------------ */
    CASE(2, 113, 203, 4, 2, 64, 0, F16, 0, 32, 0, 0, 0, 0, 0, 1),
    CASE(2, 113, 203, 4, 4, 128, 0, B16, 1, 16, 8, 0, 0, 0, 0, 1),
    CASE(2, 203, 113, 2, 1, 64, 0, F16, 0, 10, 5, 0, 0, 0, 0, 1),
    CASE(2, 203, 113, 2, 2, 96, 0, F32, 0, 0, 0, 0, 0, 0, 0, 1),
    CASE(1, 300, 100, 2, 2, 64, 0, B16, 0, 0, 0, 0, 0, 0, 1, 1),
    CASE(2, 128, 217, 2, 2, 32, 0, F16, 0, -1, 0, 0, 0, 0, 0, 1),
    CASE(2, 128, 217, 2, 2, 40, 0, B16, 0, 5, -1, 0, 0, 0, 0, 1),
    CASE(2, 128, 217, 2, 2, 256, 0, F16, 0, -1, 20, 0, 0, 0, 0, 1),
    CASE(1, 1024, 1023, 2, 2, 64, 0, B16, 0, 100, 100, 0, 0, 0, 0, 1),
    CASE(1, 1023, 1024, 2, 1, 128, 0, F16, 1, 256, 0, 0, 0, 0, 1, 1),
    CASE(2, 799, 3, 2, 2, 64, 0, F16, 1, 1, 1, 0, 0, 0, 0, 1),
    CASE(2, 3, 799, 2, 2, 64, 0, B16, 0, 300, 300, 0, 0, 0, 0, 1),
    CASE(1, 239, 1, 2, 2, 32, 0, F32, 0, 3, 3, 0, 0, 0, 0, 1),
    CASE(2, 64, 500, 4, 2, 64, 0, F32, 1, 128, 0, 0, 0, 0, 1, 1),
    /* Extents beyond int32 (the kernels clamp them; they must act as "unbounded"). */
    CASE(2, 113, 203, 2, 2, 64, 0, B16, 1, 5000000000LL, 3000000000LL, 0, 0, 0, 0, 1),
    CASE(1, 203, 113, 2, 1, 128, 0, F16, 0, 3000000000LL, 7, 0, 0, 0, 0, 1),

    /* ---- Softcap (scale 1 so the cap bends the scores) --------------------------------------- */
    CASE(2, 113, 203, 4, 2, 64, 0, F16, 0, -1, -1, 5.0, 1.0, 0, 0, 1),
    CASE(2, 128, 217, 4, 1, 128, 0, B16, 1, -1, -1, 5.0, 1.0, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 64, 0, F32, 0, -1, -1, 50.0, 0, 0, 0, 1),
    CASE(1, 239, 239, 2, 2, 128, 0, F16, 0, 32, 32, 2.0, 0.5, 0, 1, 1),
    CASE(2, 3, 799, 4, 2, 96, 0, B16, 0, -1, -1, 15.0, 0.3, 0, 0, 1),
    CASE(1, 1023, 1024, 2, 2, 64, 0, F16, 1, -1, -1, 30.0, 0, 0, 0, 1),

    /* ---- Explicit softmax scale --------------------------------------------------------------- */
    CASE(2, 113, 203, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0.05, 0, 0, 1),
    CASE(2, 113, 203, 2, 2, 128, 0, F32, 1, -1, -1, 0, 1.5, 0, 0, 1),

    /* ---- Variable length (a zero-length query and key sequence when batch >= 3) --------------- */
    CASE(4, 113, 203, 4, 2, 64, 0, F16, 0, -1, -1, 0, 0, 1, 0, 1),
    CASE(5, 128, 217, 4, 4, 128, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),
    CASE(3, 239, 1, 2, 2, 32, 0, F16, 0, -1, -1, 0, 0, 1, 0, 1),
    CASE(3, 1, 239, 4, 1, 64, 0, B16, 0, -1, -1, 0, 0, 1, 0, 1),
    CASE(4, 1024, 1023, 2, 2, 64, 0, F16, 1, -1, -1, 0, 0, 1, 0, 1),
    CASE(6, 97, 97, 2, 2, 40, 0, F32, 0, 8, 8, 0, 0, 1, 1, 1),
    CASE(4, 203, 113, 4, 2, 96, 0, B16, 1, -1, -1, 10.0, 1.0, 1, 1, 1),
    CASE(3, 64, 300, 4, 1, 32, 0, F16, 0, -1, -1, 0, 0, 1, 0, 1),
    CASE(2, 300, 64, 2, 2, 256, 0, F16, 0, 16, 0, 0, 0, 1, 0, 1),
    CASE(5, 3, 799, 2, 2, 128, 0, F32, 1, -1, -1, 0, 0, 1, 0, 1),
    CASE(3, 799, 3, 2, 2, 64, 0, B16, 1, 2, 2, 0, 0, 1, 1, 1),
    CASE(4, 256, 256, 2, 2, 160, 0, F16, 0, -1, -1, 0, 0, 1, 1, 0),

    /* ---- Non-contiguous strides --------------------------------------------------------------- */
    CASE(2, 113, 203, 4, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 1, 1),
    CASE(2, 239, 1, 2, 2, 128, 0, B16, 0, -1, -1, 0, 0, 0, 1, 1),
    CASE(2, 1, 239, 4, 1, 96, 0, F32, 0, -1, -1, 0, 0, 0, 1, 1),
    CASE(2, 128, 217, 4, 4, 256, 0, F16, 1, -1, -1, 0, 0, 0, 1, 0),
    CASE(1, 1024, 1023, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 1, 1),

    /* ---- Without LSE ---------------------------------------------------------------------------- */
    CASE(2, 113, 203, 4, 2, 64, 0, B16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(3, 128, 217, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 1, 0, 0),

    /* ---- Short queries with GQA/MQA (query heads packed into one tile on the CPU backend) ---- */
    CASE(3, 37, 150, 8, 2, 64, 0, F16, 1, 20, 3, 0, 0, 1, 1, 1),
    CASE(1, 5, 300, 4, 1, 32, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(2, 40, 200, 8, 2, 96, 0, F32, 1, 50, -1, 0, 0, 0, 1, 1),
    CASE(2, 7, 70, 6, 3, 128, 64, F16, 0, -1, 2, 3.0, 1.0, 0, 0, 1),

    /* ---- Larger batch x heads, short sequences ---------------------------------------------- */
    CASE(8, 64, 64, 8, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    CASE(4, 200, 200, 6, 6, 32, 0, B16, 0, -1, -1, 0, 0, 0, 0, 1),

    /* ---- Long sequences (one 2048 case everywhere; the rest on GPU backends only) --- */
    GPU_CASE(1, 2048, 2048, 4, 4, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    LONG_CASE(1, 2048, 2048, 2, 1, 64, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(2, 2048, 2048, 2, 1, 256, 0, F16, 1, -1, -1, 0, 0, 0, 1, 1),
    GPU_CASE(1, 4096, 4096, 2, 1, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 4096, 4096, 2, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 4096, 4096, 2, 2, 96, 0, F16, 0, 512, 0, 0, 0, 0, 0, 1),
    GPU_CASE(3, 4096, 4096, 2, 2, 128, 0, B16, 1, -1, -1, 0, 0, 1, 0, 1),
    GPU_CASE(1, 8192, 8192, 1, 1, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 8192, 8192, 1, 1, 128, 0, B16, 0, 1024, 1024, 0, 0, 0, 0, 1),
    GPU_CASE(2, 2048, 2048, 4, 2, 192, 0, B16, 0, -1, -1, 0, 0, 0, 1, 1),
    GPU_CASE(3, 1536, 3000, 4, 4, 256, 0, B16, 0, -1, -1, 30.0, 0, 1, 0, 1),
    /* Many CTAs at once, each wrapping the K/V buffer rings several times. */
    GPU_CASE(8, 512, 1024, 8, 2, 64, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    /* ---- Decode (seqlen_q 1, long KV, GQA 32/8); the heaviest on GPU backends only --------- */
    LONG_CASE(2, 1, 8192, 32, 8, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 1, 16384, 32, 8, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
    GPU_CASE(1, 1, 32768, 32, 8, 128, 0, F16, 0, -1, -1, 0, 0, 0, 0, 1),
    LONG_CASE(1, 1, 32768, 32, 8, 64, 0, B16, 0, -1, -1, 0, 0, 0, 1, 1),
    LONG_CASE(4, 1, 16384, 32, 8, 128, 0, F16, 0, -1, -1, 0, 0, 1, 0, 1),
    GPU_CASE(2, 4, 8192, 32, 8, 128, 0, B16, 1, -1, -1, 0, 0, 0, 0, 1),
};

#define NUM_CASES (sizeof grid / sizeof grid[0])

static int32_t g_cc_major = 0, g_cc_minor = 0;
static uint64_t g_seed = 0x5eed0f1a5a77e57ull;

static flashattn_dtype_t effective_dtype(flashattn_dtype_t dtype) { return test_effective_dtype(TEST_BACKEND, dtype); }

/* NULL when the backend documents that it runs `c`; otherwise why not. */
static const char *outside_range(const grid_case *g) {
    const attn_case *c = &g->c;
    const int64_t d = c->head_dim, dv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    const flashattn_dtype_t dt = effective_dtype(c->dtype);
    switch (TEST_BACKEND) {
    case FLASHATTN_BACKEND_CPU:
        return g->gpu_only ? "GPU-only case (its reference is too slow for the CPU run's time budget)" : NULL;
    case FLASHATTN_BACKEND_FA1:
        if (dt == FLASHATTN_DTYPE_BF16 && g_cc_major < 8) return "fa1 runs bf16 only on sm_80+";
        if (dt != FLASHATTN_DTYPE_FP16 && dt != FLASHATTN_DTYPE_BF16) return "fa1: fp16/bf16 only";
        if (d > 256 || d % 8 != 0) return "fa1: head_dim <= 256, multiple of 8";
        if (dv != d) return "fa1: head_dim_v must equal head_dim";
        return NULL;
    case FLASHATTN_BACKEND_FA2:
        if (dt != FLASHATTN_DTYPE_FP16 && dt != FLASHATTN_DTYPE_BF16) return "fa2: fp16/bf16 only";
        if (d < 8 || d > 256 || d % 8 != 0) return "fa2: head_dim 8..256, multiple of 8";
        if (dv < 8 || dv > 256 || dv % 8 != 0) return "fa2: head_dim_v 8..256, multiple of 8";
        return NULL;
    case FLASHATTN_BACKEND_FA3:
        if (dt != FLASHATTN_DTYPE_FP16 && dt != FLASHATTN_DTYPE_BF16) return "fa3: fp16/bf16 only";
        if (d < 8 || d > 256 || d % 8 != 0) return "fa3: head_dim 8..256, multiple of 8";
        if (dv < 8 || dv > 256 || dv % 8 != 0) return "fa3: head_dim_v 8..256, multiple of 8";
        return NULL;
    default:
        return "unknown backend";
    }
}

static void run_case(void **state) {
    const grid_case *g = (const grid_case *)*state;
    attn_case c = g->c;
    test_skip_if_outside(outside_range(g));
    c.dtype = effective_dtype(c.dtype);
    assert_int_equal(check_attention_case(TEST_BACKEND, &c, test_case_seed(g_seed, (size_t)(g - grid))), 0);
}

/* The CPU backend checks cu_seqlens on the host before writing anything (GPU backends cannot read
 * them without synchronising; there a violation is undefined behaviour, so this runs on cpu only). */
static void varlen_validation(void **state) {
    enum { B = 3, SQ = 10, SK = 12, TQ = 15, TK = 20, H = 2, D = 16 };
    static const struct {
        int32_t q[B + 1], k[B + 1];
        const char *needle;
    } bad[] = {
        {{1, 5, 10, 15}, {0, 5, 10, 20}, "cu_seqlens_q[0]"},
        {{0, 5, 10, 15}, {0, 12, 8, 20}, "cu_seqlens_k[2]"},
        {{0, 11, 12, 15}, {0, 5, 10, 20}, "cu_seqlens_q[1]"},
        {{0, 5, 10, 14}, {0, 5, 10, 20}, "cu_seqlens_q[3]"},
        {{0, 5, 10, 15}, {0, 5, 8, 21}, "cu_seqlens_k[3]"},
    };
    static const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, B},        {FLASHATTN_I64_SEQLEN_Q, SQ},
        {FLASHATTN_I64_SEQLEN_K, SK},    {FLASHATTN_I64_HEADS_Q, H},
        {FLASHATTN_I64_HEAD_DIM, D},     {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32},
        {FLASHATTN_I64_VARLEN, 1},       {FLASHATTN_I64_TOTAL_Q, TQ},
        {FLASHATTN_I64_TOTAL_K, TK},     {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
    };
    flashattn_plan_t *plan = NULL;
    float q[TQ * H * D], k[TK * H * D], v[TK * H * D], o[TQ * H * D], lse[H * TQ];
    size_t ws_bytes = 0, i, j;
    void *ws;
    (void)state;
    for (i = 0; i < sizeof q / sizeof q[0]; ++i) q[i] = 0.25f;
    for (i = 0; i < sizeof k / sizeof k[0]; ++i) k[i] = v[i] = 0.5f;
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    set_keys_or_fail(plan, keys, sizeof keys / sizeof keys[0]);
    assert_int_equal(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws_bytes), FLASHATTN_SUCCESS);
    ws = ws_bytes ? test_malloc(ws_bytes + 256) : NULL;
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        void *aligned = ws ? (void *)(((uintptr_t)ws + 255) & ~(uintptr_t)255) : NULL;
        flashattn_status_t st;
        for (j = 0; j < sizeof o / sizeof o[0]; ++j) o[j] = -7.0f;
        for (j = 0; j < sizeof lse / sizeof lse[0]; ++j) lse[j] = -7.0f;
        st = flashattn_plan_execute_varlen(plan, q, k, v, o, lse, bad[i].q, bad[i].k, aligned, ws_bytes, NULL);
        print_message("case %d: status %d, message: %s\n", (int)i, (int)st, flashattn_last_error());
        assert_int_equal(st, FLASHATTN_ERROR_INVALID_ARGUMENT);
        assert_non_null(strstr(flashattn_last_error(), bad[i].needle));
        for (j = 0; j < sizeof o / sizeof o[0]; ++j) assert_true(o[j] == -7.0f);
        for (j = 0; j < sizeof lse / sizeof lse[0]; ++j) assert_true(lse[j] == -7.0f);
    }
    {   /* and the valid arrays run */
        static const int32_t cq[B + 1] = {0, 5, 5, 15}, ck[B + 1] = {0, 0, 8, 20};
        void *aligned = ws ? (void *)(((uintptr_t)ws + 255) & ~(uintptr_t)255) : NULL;
        assert_int_equal(flashattn_plan_execute_varlen(plan, q, k, v, o, lse, cq, ck, aligned, ws_bytes, NULL),
                         FLASHATTN_SUCCESS);
        assert_true(o[0] == 0.0f && lse[0] == -INFINITY); /* sequence 0 has no keys */
        assert_true(fabsf(o[5 * H * D] - 0.5f) < 1e-6f); /* sequence 2: uniform V */
    }
    if (ws) test_free(ws);
    flashattn_plan_destroy(plan);
}

static char names[NUM_CASES][160];
static struct CMUnitTest tests[NUM_CASES + 1];

static void name_case(char *buf, size_t size, const grid_case *g) {
    const attn_case *c = &g->c;
    int n = test_case_name(buf, size, "", c, effective_dtype(c->dtype));
    if (c->strided) n += snprintf(buf + n, size - (size_t)n, "_strided");
    if (!c->with_lse) n += snprintf(buf + n, size - (size_t)n, "_nolse");
    (void)n;
}

int main(void) {
    const int reduced = test_reduced_grid();
    size_t i, n = 0, small = 0;
    g_seed = test_seed_from_env(g_seed);
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) test_require_gpu_backend(TEST_BACKEND, &g_cc_major, &g_cc_minor);
    printf("numerics on backend %s, seed %llu (set FLASHATTN_TEST_SEED to change)\n",
           test_backend_name(TEST_BACKEND), (unsigned long long)g_seed);

    /* FLASHATTN_TEST_REDUCED=1 keeps every third case of at most 128 x 256 scores per head: the
     * grid compute-sanitizer runs (its tools slow kernels down 10-100x). */
    for (i = 0; i < NUM_CASES; ++i) {
        if (!test_keeps_case(reduced, &grid[i].c, &small)) continue;
        name_case(names[n], sizeof names[n], &grid[i]);
        tests[n] = test_unit(names[n], run_case, &grid[i]);
        ++n;
    }
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) tests[n++] = test_unit("varlen_cu_seqlens_validation", varlen_validation, NULL);
    return _cmocka_run_group_tests(test_backend_name(TEST_BACKEND), tests, n, NULL, NULL);
}
