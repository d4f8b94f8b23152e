/* Numerical correctness of one backend's backward pass (TEST_BACKEND) against the tests' own
 * double-precision gradient, over a covering grid of shapes and features. Built once per backend:
 * test_backward_cpu (label cpu) and test_backward_fa2 (label gpu, skipped without a GPU).
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
 * (the grid's fp32 cases run in bf16), head_dim 8..256, head_dim_v == head_dim. FLASHATTN_TEST_REDUCED=1
 * keeps every third small case (for compute-sanitizer). FLASHATTN_TEST_SEED changes the inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_backward_reference.h"
#include "test_support.h"

#ifdef FLASHATTN_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef TEST_BACKEND
#define TEST_BACKEND FLASHATTN_BACKEND_CPU
#endif

#define F16 FLASHATTN_DTYPE_FP16
#define B16 FLASHATTN_DTYPE_BF16
#define F32 FLASHATTN_DTYPE_FP32

/* NaN patterns written into every output element, every stride gap and the workspace. */
#define POISON_FP16 0x7e5au
#define POISON_BF16 0x7fa5u
#define POISON_FP32 0x7fc0deadu

/* strided: 0 contiguous; 1 every tensor padded; 2 only dO, dQ, dK, dV padded (forward contiguous). */
typedef struct bwd_case {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    flashattn_dtype_t dtype;
    int causal;
    int64_t window_left, window_right;
    double softcap, scale;
    int varlen, strided, deterministic;
    int gpu_only;
} bwd_case;

/* Field order: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, causal,
 * window_left, window_right, softcap, scale, varlen, strided, deterministic. */
#define CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det) \
    {b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det, 0}
#define GPU_CASE(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det) \
    {b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, strided, det, 1}

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

    /* ---- A few longer rows (several tiles per row and column on every backend) --------------- */
    CASE(1, 300, 257, 4, 2, 64, 0, F16, 1, -1, -1, 0, 0, 0, 0, 0),
    CASE(1, 257, 513, 2, 1, 128, 0, B16, 0, -1, -1, 0, 0, 0, 1, 0),
    CASE(2, 200, 300, 4, 2, 64, 0, F32, 0, 64, 16, 0, 0, 0, 0, 0),

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

/* ---- Host and device buffers ------------------------------------------------------------------ */

typedef struct mem {
    void *host;   /* always present, 256-byte aligned */
    void *device; /* GPU backends only */
    size_t bytes;
} mem;

static int on_device(void) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    return TEST_BACKEND != FLASHATTN_BACKEND_CPU;
#else
    return 0;
#endif
}

static int mem_alloc(mem *m, size_t bytes) {
    m->bytes = bytes ? (bytes + 255) / 256 * 256 : 256;
    m->device = NULL;
    m->host = aligned_alloc(256, m->bytes);
    if (!m->host) return -1;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (on_device() && cudaMalloc(&m->device, m->bytes) != cudaSuccess) {
        m->device = NULL;
        return -1;
    }
#endif
    return 0;
}

static void mem_free(mem *m) {
    free(m->host);
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) cudaFree(m->device);
#endif
    m->host = m->device = NULL;
}

static void *mem_ptr(const mem *m) { return m->device ? m->device : m->host; }

static int mem_upload(const mem *m) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) return cudaMemcpy(m->device, m->host, m->bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

static int mem_download(const mem *m) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) return cudaMemcpy(m->host, m->device, m->bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

/* 1 when the buffer the library sees still holds `snapshot` (its first m->bytes bytes). */
static int mem_unchanged(const mem *m, const void *snapshot) {
    int same;
    void *tmp;
    if (!m->device) return memcmp(m->host, snapshot, m->bytes) == 0;
    tmp = malloc(m->bytes);
    if (!tmp) return 0;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (cudaMemcpy(tmp, m->device, m->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(tmp);
        return 0;
    }
#endif
    same = memcmp(tmp, snapshot, m->bytes) == 0;
    free(tmp);
    return same;
}

static int sync_device(void) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (on_device()) {
        cudaError_t err = cudaDeviceSynchronize();
        if (err == cudaSuccess) err = cudaGetLastError();
        if (err != cudaSuccess) {
            printf("CUDA error: %s\n", cudaGetErrorString(err));
            return -1;
        }
    }
#endif
    return 0;
}

static double now_seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void poison(flashattn_dtype_t dtype, void *buf, size_t bytes) {
    unsigned char *p = (unsigned char *)buf;
    size_t i;
    if (dtype == FLASHATTN_DTYPE_FP32) {
        const uint32_t v = POISON_FP32;
        for (i = 0; i + 4 <= bytes; i += 4) memcpy(p + i, &v, 4);
    } else {
        const uint16_t v = dtype == FLASHATTN_DTYPE_FP16 ? POISON_FP16 : POISON_BF16;
        for (i = 0; i + 2 <= bytes; i += 2) memcpy(p + i, &v, 2);
    }
}

static int is_poison(flashattn_dtype_t dtype, const unsigned char *p) {
    if (dtype == FLASHATTN_DTYPE_FP32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u == POISON_FP32;
    } else {
        uint16_t u;
        memcpy(&u, p, 2);
        return u == (dtype == FLASHATTN_DTYPE_FP16 ? POISON_FP16 : POISON_BF16);
    }
}

/* ---- Layouts ------------------------------------------------------------------------------------ */

typedef struct layout {
    int64_t batch_stride, row_stride, head_stride; /* elements */
    size_t elems;                                  /* allocation, in elements */
} layout;

/* Pads are multiples of 8 elements: rows stay 16-byte aligned for every dtype. */
static layout make_layout(int64_t batch, int64_t seqlen, int64_t total, int varlen, int64_t heads, int64_t dim,
                          int padded, int64_t pad_head, int64_t pad_row, int64_t pad_batch) {
    layout l;
    l.head_stride = dim + (padded ? pad_head : 0);
    l.row_stride = heads * l.head_stride + (padded ? pad_row : 0);
    l.batch_stride = seqlen * l.row_stride + (padded ? pad_batch : 0);
    l.elems = varlen ? (size_t)(total * l.row_stride) : (size_t)(batch * l.batch_stride);
    if (l.elems == 0) l.elems = 1;
    return l;
}

/* Element offset of (sequence b, its row i = packed token tok, head h, column 0). */
static int64_t layout_offset(const layout *l, int varlen, int64_t b, int64_t tok, int64_t i, int64_t h) {
    if (varlen) return tok * l->row_stride + h * l->head_stride;
    return b * l->batch_stride + i * l->row_stride + h * l->head_stride;
}

/* ---- One case: sizes, inputs, plan, forward, backward ------------------------------------------- */

typedef struct ctx {
    const bwd_case *c;
    char desc[512];
    int varlen;
    int64_t batch, sq, sk, hq, hk, d, dv, total_q, total_k;
    flashattn_dtype_t dt;
    double scale;
    size_t es, lse_count, ws_fwd, ws_bwd;
    int64_t *len_q, *len_k, *start_q, *start_k;
    layout lq, lk, lv, lo, ldo, ldq, ldk, ldv;
    float *qf, *kf, *vf, *gf; /* logical inputs and dO, [token][head][dim] */
    mem q, k, v, o, dout, lse, gq, gk, gv, cu_q, cu_k, ws_f, ws_b;
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
    mem *all[] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->lse, &x->gq, &x->gk, &x->gv,
                  &x->cu_q, &x->cu_k, &x->ws_f, &x->ws_b};
    size_t i;
    flashattn_plan_destroy(x->plan);
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) mem_free(all[i]);
    free(x->len_q);
    free(x->len_k);
    free(x->start_q);
    free(x->start_k);
    free(x->qf);
    free(x->kf);
    free(x->vf);
    free(x->gf);
    memset(x, 0, sizeof *x);
}

/* Fill the logical array `dst` ([tokens][heads][dim]) and the tensor in `m` (layout l) with
 * U(-1, 1) rounded to the dtype; everything else of `m` holds the poison. */
static void fill_tensor(ctx *x, test_rng *rng, const mem *m, const layout *l, float *dst, int q_side,
                        int64_t heads, int64_t dim) {
    int64_t b, i, h, col;
    poison(x->dt, m->host, m->bytes);
    for (b = 0; b < x->batch; ++b) {
        const int64_t len = q_side ? x->len_q[b] : x->len_k[b];
        const int64_t start = q_side ? x->start_q[b] : x->start_k[b];
        for (i = 0; i < len; ++i) {
            for (h = 0; h < heads; ++h) {
                unsigned char *p = (unsigned char *)m->host + x->es * (size_t)layout_offset(l, x->varlen, b, start + i, i, h);
                for (col = 0; col < dim; ++col) {
                    const double v = test_round(x->dt, test_rng_uniform(rng, -1.0, 1.0));
                    dst[((start + i) * heads + h) * dim + col] = (float)v;
                    test_store(x->dt, p + x->es * (size_t)col, v);
                }
            }
        }
    }
}

static int set_strides(ctx *x, const flashattn_i64_param_t keys[3], const layout *l) {
    if (!x->varlen) API(x, flashattn_plan_set_i64(x->plan, keys[0], l->batch_stride));
    API(x, flashattn_plan_set_i64(x->plan, keys[1], l->row_stride));
    API(x, flashattn_plan_set_i64(x->plan, keys[2], l->head_stride));
    return 0;
}

static int ctx_init(ctx *x, const bwd_case *c, flashattn_dtype_t dtype, uint64_t seed) {
    test_rng rng;
    int64_t b;
    int32_t *cu_q, *cu_k;
    flashattn_backend_t chosen = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    int64_t value = -1;
    const int pad_fwd = c->strided == 1, pad_bwd = c->strided != 0;

    memset(x, 0, sizeof *x);
    x->c = c;
    x->varlen = c->varlen != 0;
    x->batch = c->batch;
    x->sq = c->seqlen_q;
    x->sk = c->seqlen_k;
    x->hq = c->heads_q;
    x->hk = c->heads_kv ? c->heads_kv : c->heads_q;
    x->d = c->head_dim;
    x->dv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    x->dt = dtype;
    x->es = test_dtype_size(dtype);
    x->scale = c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->head_dim);
    snprintf(x->desc, sizeof x->desc,
             "[%s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s causal=%d window=(%lld,%lld) "
             "softcap=%g scale=%g varlen=%d strided=%d deterministic=%d seed=%llu]",
             test_backend_name(TEST_BACKEND), (long long)x->batch, (long long)x->sq, (long long)x->sk,
             (long long)x->hq, (long long)x->hk, (long long)x->d, (long long)x->dv, test_dtype_name(dtype),
             c->causal, (long long)c->window_left, (long long)c->window_right, c->softcap, x->scale, c->varlen,
             c->strided, c->deterministic, (unsigned long long)seed);

    /* Sequence lengths: fixed; or random per sequence, the first at full length, with (see the
     * grid) empty sequences at distinct random places. */
    test_rng_seed(&rng, seed);
    x->len_q = (int64_t *)calloc((size_t)x->batch, sizeof(int64_t));
    x->len_k = (int64_t *)calloc((size_t)x->batch, sizeof(int64_t));
    x->start_q = (int64_t *)calloc((size_t)x->batch, sizeof(int64_t));
    x->start_k = (int64_t *)calloc((size_t)x->batch, sizeof(int64_t));
    if (!x->len_q || !x->len_k || !x->start_q || !x->start_k) return ctx_fail(x, "out of memory");
    for (b = 0; b < x->batch; ++b) {
        x->len_q[b] = x->sq;
        x->len_k[b] = x->sk;
        if (x->varlen && b > 0) {
            x->len_q[b] = test_rng_range(&rng, x->sq / 3, x->sq);
            x->len_k[b] = test_rng_range(&rng, x->sk / 3, x->sk);
        }
    }
    if (x->varlen && x->batch >= 3) {
        int64_t order[64], n = x->batch - 1, i;
        for (i = 0; i < n && i < 64; ++i) order[i] = i + 1;
        for (i = n - 1; i > 0; --i) { /* shuffle 1..batch-1 */
            const int64_t j = test_rng_range(&rng, 0, i), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        x->len_q[order[0]] = x->len_k[order[0]] = 0;    /* nothing at all */
        if (x->batch >= 4) x->len_k[order[1]] = 0;      /* queries that see no key */
        if (x->batch >= 5) x->len_q[order[2]] = 0;      /* keys that no query sees */
    }
    for (b = 0; b < x->batch; ++b) {
        x->start_q[b] = x->total_q;
        x->start_k[b] = x->total_k;
        x->total_q += x->len_q[b];
        x->total_k += x->len_k[b];
    }
    if (!x->varlen) {
        x->total_q = x->batch * x->sq;
        x->total_k = x->batch * x->sk;
    }

    x->lq = make_layout(x->batch, x->sq, x->total_q, x->varlen, x->hq, x->d, pad_fwd, 8, 16, 24);
    x->lk = make_layout(x->batch, x->sk, x->total_k, x->varlen, x->hk, x->d, pad_fwd, 16, 8, 8);
    x->lv = make_layout(x->batch, x->sk, x->total_k, x->varlen, x->hk, x->dv, pad_fwd, 8, 8, 16);
    x->lo = make_layout(x->batch, x->sq, x->total_q, x->varlen, x->hq, x->dv, pad_fwd, 8, 24, 8);
    x->ldo = make_layout(x->batch, x->sq, x->total_q, x->varlen, x->hq, x->dv, pad_bwd, 16, 8, 24);
    x->ldq = make_layout(x->batch, x->sq, x->total_q, x->varlen, x->hq, x->d, pad_bwd, 8, 8, 8);
    x->ldk = make_layout(x->batch, x->sk, x->total_k, x->varlen, x->hk, x->d, pad_bwd, 24, 16, 8);
    x->ldv = make_layout(x->batch, x->sk, x->total_k, x->varlen, x->hk, x->dv, pad_bwd, 8, 32, 16);
    x->lse_count = (size_t)(x->hq * x->total_q);
    if (mem_alloc(&x->q, x->lq.elems * x->es) || mem_alloc(&x->k, x->lk.elems * x->es) ||
        mem_alloc(&x->v, x->lv.elems * x->es) || mem_alloc(&x->o, x->lo.elems * x->es) ||
        mem_alloc(&x->dout, x->ldo.elems * x->es) || mem_alloc(&x->lse, (x->lse_count + 1) * sizeof(float)) ||
        mem_alloc(&x->gq, x->ldq.elems * x->es) || mem_alloc(&x->gk, x->ldk.elems * x->es) ||
        mem_alloc(&x->gv, x->ldv.elems * x->es) || mem_alloc(&x->cu_q, (size_t)(x->batch + 1) * 4) ||
        mem_alloc(&x->cu_k, (size_t)(x->batch + 1) * 4))
        return ctx_fail(x, "could not allocate the tensors");
    cu_q = (int32_t *)x->cu_q.host;
    cu_k = (int32_t *)x->cu_k.host;
    for (b = 0; b <= x->batch; ++b) {
        cu_q[b] = (int32_t)(b < x->batch ? x->start_q[b] : x->total_q);
        cu_k[b] = (int32_t)(b < x->batch ? x->start_k[b] : x->total_k);
    }
    x->qf = (float *)malloc((size_t)(x->total_q * x->hq * x->d + 1) * sizeof(float));
    x->kf = (float *)malloc((size_t)(x->total_k * x->hk * x->d + 1) * sizeof(float));
    x->vf = (float *)malloc((size_t)(x->total_k * x->hk * x->dv + 1) * sizeof(float));
    x->gf = (float *)malloc((size_t)(x->total_q * x->hq * x->dv + 1) * sizeof(float));
    if (!x->qf || !x->kf || !x->vf || !x->gf) return ctx_fail(x, "out of memory");
    fill_tensor(x, &rng, &x->q, &x->lq, x->qf, 1, x->hq, x->d);
    fill_tensor(x, &rng, &x->k, &x->lk, x->kf, 0, x->hk, x->d);
    fill_tensor(x, &rng, &x->v, &x->lv, x->vf, 0, x->hk, x->dv);
    fill_tensor(x, &rng, &x->dout, &x->ldo, x->gf, 1, x->hq, x->dv);
    if (mem_upload(&x->q) || mem_upload(&x->k) || mem_upload(&x->v) || mem_upload(&x->dout) ||
        mem_upload(&x->cu_q) || mem_upload(&x->cu_k))
        return ctx_fail(x, "cudaMemcpy of the inputs failed");

    /* The plan, through the public API only. */
    API(x, flashattn_plan_create(&x->plan));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_BATCH, x->batch));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_SEQLEN_Q, x->sq));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_SEQLEN_K, x->sk));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_HEADS_Q, x->hq));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_HEADS_KV, x->hk));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_HEAD_DIM, x->d));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_HEAD_DIM_V, x->dv));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_DTYPE, dtype));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_CAUSAL, c->causal ? 1 : 0));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_WINDOW_LEFT, c->window_left));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_WINDOW_RIGHT, c->window_right));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_BACKEND, TEST_BACKEND));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_DEVICE, 0));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_VARLEN, x->varlen));
    API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_DETERMINISTIC, c->deterministic ? 1 : 0));
    if (x->varlen) {
        API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_TOTAL_Q, x->total_q));
        API(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_TOTAL_K, x->total_k));
    }
    if (pad_fwd) {
        static const flashattn_i64_param_t kq[3] = {FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE};
        static const flashattn_i64_param_t kk[3] = {FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE};
        static const flashattn_i64_param_t kv[3] = {FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE};
        static const flashattn_i64_param_t ko[3] = {FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE};
        if (set_strides(x, kq, &x->lq) || set_strides(x, kk, &x->lk) || set_strides(x, kv, &x->lv) ||
            set_strides(x, ko, &x->lo))
            return -1;
    }
    if (pad_bwd) {
        static const flashattn_i64_param_t kdo[3] = {FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE};
        static const flashattn_i64_param_t kdq[3] = {FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE};
        static const flashattn_i64_param_t kdk[3] = {FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE};
        static const flashattn_i64_param_t kdv[3] = {FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE};
        if (set_strides(x, kdo, &x->ldo) || set_strides(x, kdq, &x->ldq) || set_strides(x, kdk, &x->ldk) ||
            set_strides(x, kdv, &x->ldv))
            return -1;
    }
    /* scale 0 = the default 1/sqrt(head_dim): left unset so the library resolves it. */
    if (c->scale != 0.0) API(x, flashattn_plan_set_f64(x->plan, FLASHATTN_F64_SOFTMAX_SCALE, c->scale));
    API(x, flashattn_plan_set_f64(x->plan, FLASHATTN_F64_SOFTCAP, c->softcap));
    API(x, flashattn_plan_finalize(x->plan));
    API(x, flashattn_plan_get_backend(x->plan, &chosen, &reason));
    if (chosen != TEST_BACKEND)
        return ctx_fail(x, "forward runs on %s, not the %s it was forced to (%s)", test_backend_name(chosen),
                        test_backend_name(TEST_BACKEND), reason ? reason : "");
    API(x, flashattn_plan_get_backward_backend(x->plan, &chosen, &reason));
    if (chosen != TEST_BACKEND)
        return ctx_fail(x, "backward runs on %s, not the %s it was forced to (%s)", test_backend_name(chosen),
                        test_backend_name(TEST_BACKEND), reason ? reason : "");
    API(x, flashattn_plan_get_i64(x->plan, FLASHATTN_I64_DETERMINISTIC, &value));
    if (value != (c->deterministic ? 1 : 0)) return ctx_fail(x, "FLASHATTN_I64_DETERMINISTIC reads %lld", (long long)value);
    API(x, flashattn_plan_get_workspace_size(x->plan, &x->ws_fwd));
    API(x, flashattn_plan_get_backward_workspace_size(x->plan, &x->ws_bwd));
    if ((x->ws_fwd && mem_alloc(&x->ws_f, x->ws_fwd)) || (x->ws_bwd && mem_alloc(&x->ws_b, x->ws_bwd)))
        return ctx_fail(x, "could not allocate the workspaces (%zu and %zu bytes)", x->ws_fwd, x->ws_bwd);
    return 0;
}

/* Fill the workspace with 0xff bytes (NaN as fp32): the library must not rely on its content. */
static int poison_workspace(const mem *m, size_t bytes) {
    if (bytes == 0) return 0;
    memset(m->host, 0xff, m->bytes);
    return mem_upload(m);
}

static int ctx_forward(ctx *x) {
    double t0;
    poison(x->dt, x->o.host, x->o.bytes);
    poison(FLASHATTN_DTYPE_FP32, x->lse.host, x->lse.bytes);
    if (mem_upload(&x->o) || mem_upload(&x->lse) || poison_workspace(&x->ws_f, x->ws_fwd))
        return ctx_fail(x, "cudaMemcpy before the forward failed");
    t0 = now_seconds();
    if (x->varlen)
        API(x, flashattn_plan_execute_varlen(x->plan, mem_ptr(&x->q), mem_ptr(&x->k), mem_ptr(&x->v), mem_ptr(&x->o),
                                             (float *)mem_ptr(&x->lse), (const int32_t *)mem_ptr(&x->cu_q),
                                             (const int32_t *)mem_ptr(&x->cu_k), x->ws_fwd ? mem_ptr(&x->ws_f) : NULL,
                                             x->ws_fwd, NULL));
    else
        API(x, flashattn_plan_execute(x->plan, mem_ptr(&x->q), mem_ptr(&x->k), mem_ptr(&x->v), mem_ptr(&x->o),
                                      (float *)mem_ptr(&x->lse), x->ws_fwd ? mem_ptr(&x->ws_f) : NULL, x->ws_fwd, NULL));
    if (sync_device()) return ctx_fail(x, "the forward failed on the device");
    x->t_fwd = now_seconds() - t0;
    if (mem_download(&x->o) || mem_download(&x->lse)) return ctx_fail(x, "cudaMemcpy of O and LSE failed");
    return 0;
}

static int ctx_backward(ctx *x) {
    double t0;
    poison(x->dt, x->gq.host, x->gq.bytes);
    poison(x->dt, x->gk.host, x->gk.bytes);
    poison(x->dt, x->gv.host, x->gv.bytes);
    if (mem_upload(&x->gq) || mem_upload(&x->gk) || mem_upload(&x->gv) || poison_workspace(&x->ws_b, x->ws_bwd))
        return ctx_fail(x, "cudaMemcpy before the backward failed");
    t0 = now_seconds();
    if (x->varlen)
        API(x, flashattn_plan_execute_backward_varlen(
                   x->plan, mem_ptr(&x->q), mem_ptr(&x->k), mem_ptr(&x->v), mem_ptr(&x->o), mem_ptr(&x->dout),
                   (const float *)mem_ptr(&x->lse), mem_ptr(&x->gq), mem_ptr(&x->gk), mem_ptr(&x->gv),
                   (const int32_t *)mem_ptr(&x->cu_q), (const int32_t *)mem_ptr(&x->cu_k),
                   x->ws_bwd ? mem_ptr(&x->ws_b) : NULL, x->ws_bwd, NULL));
    else
        API(x, flashattn_plan_execute_backward(x->plan, mem_ptr(&x->q), mem_ptr(&x->k), mem_ptr(&x->v), mem_ptr(&x->o),
                                               mem_ptr(&x->dout), (const float *)mem_ptr(&x->lse), mem_ptr(&x->gq),
                                               mem_ptr(&x->gk), mem_ptr(&x->gv), x->ws_bwd ? mem_ptr(&x->ws_b) : NULL,
                                               x->ws_bwd, NULL));
    if (sync_device()) return ctx_fail(x, "the backward failed on the device");
    x->t_bwd = now_seconds() - t0;
    if (mem_download(&x->gq) || mem_download(&x->gk) || mem_download(&x->gv))
        return ctx_fail(x, "cudaMemcpy of dQ, dK, dV failed");
    return 0;
}

static void ctx_problem(const ctx *x, grad_problem *p) {
    p->batch = x->batch;
    p->heads_q = x->hq;
    p->heads_kv = x->hk;
    p->head_dim = x->d;
    p->head_dim_v = x->dv;
    p->dtype = x->dt;
    p->causal = x->c->causal;
    p->window_left = x->c->window_left;
    p->window_right = x->c->window_right;
    p->softcap = x->c->softcap;
    p->scale = x->scale;
    p->len_q = x->len_q;
    p->len_k = x->len_k;
    p->start_q = x->start_q;
    p->start_k = x->start_k;
    p->total_q = x->total_q;
    p->total_k = x->total_k;
    p->q = x->qf;
    p->k = x->kf;
    p->v = x->vf;
    p->dout = x->gf;
}

/* ---- The check of one gradient ----------------------------------------------------------------- */

typedef struct grad_view {
    const char *name;
    const layout *l;
    const mem *m;
    int q_side; /* rows are queries (dQ) or keys (dK, dV) */
    int64_t heads, dim;
    const double *ref, *low;   /* [token][head][dim] */
    const unsigned char *seen; /* [token * heads + head]: row sees a key / key is seen */
} grad_view;

/* Every element of one gradient against the reference; the stride gaps must hold the poison. */
static int check_grad(ctx *x, const grad_view *g) {
    const int lowp = x->dt != FLASHATTN_DTYPE_FP32;
    double max_ref = 0.0, base = 0.0, tol, max_err = 0.0;
    unsigned char *inside = (unsigned char *)calloc(g->l->elems, 1);
    int64_t b, i, h, col, tokens = g->q_side ? x->total_q : x->total_k;
    long long bad_b = -1, bad_i = -1, bad_h = -1, bad_c = -1;
    double bad_out = 0.0, bad_ref = 0.0;
    int bad_unseen = 0;
    size_t e;
    if (!inside) return ctx_fail(x, "out of memory");
    for (e = 0; e < (size_t)(tokens * g->heads * g->dim); ++e) {
        const double a = fabs(g->ref[e]), err = fabs(g->low[e] - g->ref[e]);
        if (a > max_ref) max_ref = a;
        if (err > base) base = err;
    }
    tol = lowp ? 2.0 * base + 1e-4 * max_ref + 1e-6 : 2e-5 * max_ref + 1e-6;
    for (b = 0; b < x->batch; ++b) {
        const int64_t len = g->q_side ? x->len_q[b] : x->len_k[b];
        const int64_t start = g->q_side ? x->start_q[b] : x->start_k[b];
        for (i = 0; i < len; ++i) {
            const int64_t tok = start + i;
            for (h = 0; h < g->heads; ++h) {
                const int64_t off = layout_offset(g->l, x->varlen, b, tok, i, h);
                const int seen = g->seen[tok * g->heads + h];
                for (col = 0; col < g->dim; ++col) {
                    const double out = test_load(x->dt, (unsigned char *)g->m->host + x->es * (size_t)(off + col));
                    const double ref = g->ref[(tok * g->heads + h) * g->dim + col];
                    const double err = fabs(out - ref);
                    inside[off + col] = 1;
                    if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
                    if (bad_b < 0 && (!(err <= tol) || (!seen && out != 0.0))) {
                        bad_b = (long long)b;
                        bad_i = (long long)i;
                        bad_h = (long long)h;
                        bad_c = (long long)col;
                        bad_out = out;
                        bad_ref = ref;
                        bad_unseen = !seen;
                    }
                }
            }
        }
    }
    if (test_verbose())
        printf("  %s %s: max err %.3e (tol %.3e, %s baseline %.3e, max|ref| %.3e)\n", x->desc, g->name, max_err, tol,
               test_dtype_name(x->dt), base, max_ref);
    if (bad_b >= 0) {
        free(inside);
        return ctx_fail(x,
                        "%s: max|out-ref| = %.4e, tolerance %.4e (%s naive baseline %.4e, max|ref| %.4e); first bad "
                        "element at batch %lld %s %lld head %lld col %lld: out %.8g ref %.8g%s",
                        g->name, max_err, tol, test_dtype_name(x->dt), base, max_ref, bad_b, g->q_side ? "row" : "key",
                        bad_i, bad_h, bad_c, bad_out, bad_ref,
                        bad_unseen ? (g->q_side ? " (this row sees no key: must be exactly 0)"
                                                : " (no query sees this key: must be exactly 0)")
                                   : "");
    }
    for (e = 0; e < g->l->elems; ++e) {
        if (!inside[e] && !is_poison(x->dt, (unsigned char *)g->m->host + x->es * e)) {
            free(inside);
            return ctx_fail(x, "%s element %zu lies in a stride gap (outside the tensor) but was written", g->name, e);
        }
    }
    free(inside);
    return 0;
}

/* ---- The grid --------------------------------------------------------------------------------- */

static flashattn_dtype_t effective_dtype(flashattn_dtype_t dtype) {
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU && dtype == FLASHATTN_DTYPE_FP32) return FLASHATTN_DTYPE_BF16;
    return dtype;
}

/* NULL when the backend documents that it runs `c`; otherwise why not. */
static const char *outside_range(const bwd_case *c) {
    const int64_t d = c->head_dim, dv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU)
        return c->gpu_only ? "GPU-only case (its reference is too slow for the CPU run's time budget)" : NULL;
    if (d < 8 || d > 256 || d % 8 != 0) return "GPU backward: head_dim 8..256, a multiple of 8";
    if (dv != d) return "GPU backward: head_dim_v must equal head_dim";
    return NULL;
}

static int run_one(const bwd_case *c, uint64_t seed) {
    ctx x;
    grad_problem p;
    double *ref_dq = NULL, *ref_dk = NULL, *ref_dv = NULL, *low_dq = NULL, *low_dk = NULL, *low_dv = NULL;
    unsigned char *q_sees = NULL, *k_seen = NULL;
    unsigned char *first[3] = {NULL, NULL, NULL}, *snap[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const mem *inputs[6];
    static const char *input_names[6] = {"q", "k", "v", "o", "dout", "lse"};
    double t_ref;
    int result = -1, i;
    const int twice = TEST_BACKEND == FLASHATTN_BACKEND_CPU || c->deterministic;

    if (ctx_init(&x, c, effective_dtype(c->dtype), seed)) goto done;
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
    t_ref = now_seconds();
    ctx_problem(&x, &p);
    ref_dq = (double *)malloc((size_t)(x.total_q * x.hq * x.d + 1) * sizeof(double));
    low_dq = (double *)malloc((size_t)(x.total_q * x.hq * x.d + 1) * sizeof(double));
    ref_dk = (double *)malloc((size_t)(x.total_k * x.hk * x.d + 1) * sizeof(double));
    low_dk = (double *)malloc((size_t)(x.total_k * x.hk * x.d + 1) * sizeof(double));
    ref_dv = (double *)malloc((size_t)(x.total_k * x.hk * x.dv + 1) * sizeof(double));
    low_dv = (double *)malloc((size_t)(x.total_k * x.hk * x.dv + 1) * sizeof(double));
    q_sees = (unsigned char *)malloc((size_t)(x.total_q * x.hq + 1));
    k_seen = (unsigned char *)malloc((size_t)(x.total_k * x.hk + 1));
    if (!ref_dq || !low_dq || !ref_dk || !low_dk || !ref_dv || !low_dv || !q_sees || !k_seen) {
        ctx_fail(&x, "out of memory");
        goto done;
    }
    grad_reference(&p, ref_dq, ref_dk, ref_dv, NULL, q_sees, k_seen);
    grad_reference_lowp(&p, low_dq, low_dk, low_dv);
    t_ref = now_seconds() - t_ref;

    {
        const grad_view views[3] = {
            {"dQ", &x.ldq, &x.gq, 1, x.hq, x.d, ref_dq, low_dq, q_sees},
            {"dK", &x.ldk, &x.gk, 0, x.hk, x.d, ref_dk, low_dk, k_seen},
            {"dV", &x.ldv, &x.gv, 0, x.hk, x.dv, ref_dv, low_dv, k_seen},
        };
        for (i = 0; i < 3; ++i)
            if (check_grad(&x, &views[i])) goto done;
    }
    for (i = 0; i < 6; ++i) {
        if (!mem_unchanged(inputs[i], snap[i])) {
            ctx_fail(&x, "the backward wrote into its input %s", input_names[i]);
            goto done;
        }
    }
    if (test_verbose())
        printf("  %s: forward %.3f ms, backward %.3f ms, references %.2f s\n", x.desc, x.t_fwd * 1e3, x.t_bwd * 1e3, t_ref);

    if (twice) { /* a second run must reproduce the first bit for bit */
        const mem *grads[3] = {&x.gq, &x.gk, &x.gv};
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
    const size_t index = (size_t)(c - grid);
    const char *why = outside_range(c);
    if (why != NULL) {
        print_message("not run on this backend: %s\n", why);
        skip();
        return;
    }
    assert_int_equal(run_one(c, g_seed + 0x9e3779b97f4a7c15ull * (index + 1)), 0);
}

/* ---- Finite differences (cpu, fp32) ------------------------------------------------------------- */

/* L = sum(O * dO) over every element of the tensor, from the O the last forward wrote. */
static double loss(const ctx *x) {
    double l = 0.0;
    int64_t b, i, h, col;
    for (b = 0; b < x->batch; ++b) {
        for (i = 0; i < x->len_q[b]; ++i) {
            const int64_t tok = x->start_q[b] + i;
            for (h = 0; h < x->hq; ++h) {
                const int64_t off = layout_offset(&x->lo, x->varlen, b, tok, i, h);
                for (col = 0; col < x->dv; ++col)
                    l += test_load(x->dt, (unsigned char *)x->o.host + x->es * (size_t)(off + col)) *
                         (double)x->gf[(tok * x->hq + h) * x->dv + col];
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
    grad_problem p;
    double *ref[3] = {NULL, NULL, NULL};
    test_rng rng;
    int t, n, failures = 0;
    if (ctx_init(&x, c, FLASHATTN_DTYPE_FP32, g_seed ^ (0xfdfdull + index))) goto out;
    if (ctx_forward(&x) || ctx_backward(&x)) goto out;
    ctx_problem(&x, &p);
    ref[0] = (double *)malloc((size_t)(x.total_q * x.hq * x.d + 1) * sizeof(double));
    ref[1] = (double *)malloc((size_t)(x.total_k * x.hk * x.d + 1) * sizeof(double));
    ref[2] = (double *)malloc((size_t)(x.total_k * x.hk * x.dv + 1) * sizeof(double));
    if (!ref[0] || !ref[1] || !ref[2]) goto out;
    grad_reference(&p, ref[0], ref[1], ref[2], NULL, NULL, NULL);
    test_rng_seed(&rng, g_seed + 77 * index);
    for (t = 0; t < 3; ++t) { /* Q, K, V */
        static const char *names[3] = {"Q", "K", "V"};
        const int q_side = t == 0;
        const int64_t tokens = q_side ? x.total_q : x.total_k, heads = q_side ? x.hq : x.hk;
        const int64_t dim = t == 2 ? x.dv : x.d;
        mem *in = t == 0 ? &x.q : t == 1 ? &x.k : &x.v;
        const layout *lin = t == 0 ? &x.lq : t == 1 ? &x.lk : &x.lv;
        float *logical = t == 0 ? x.qf : t == 1 ? x.kf : x.vf;
        const mem *grad = t == 0 ? &x.gq : t == 1 ? &x.gk : &x.gv;
        const layout *lg = t == 0 ? &x.ldq : t == 1 ? &x.ldk : &x.ldv;
        double gmax = 0.0;
        int64_t e;
        for (e = 0; e < tokens * heads * dim; ++e)
            if (fabs(ref[t][e]) > gmax) gmax = fabs(ref[t][e]);
        for (n = 0; n < 8 && tokens > 0; ++n) {
            const int64_t tok = test_rng_range(&rng, 0, tokens - 1), hh = test_rng_range(&rng, 0, heads - 1);
            const int64_t col = test_rng_range(&rng, 0, dim - 1);
            const int64_t b = sequence_of(q_side ? x.start_q : x.start_k, q_side ? x.len_q : x.len_k, x.batch, tok);
            const int64_t row = tok - (q_side ? x.start_q[b] : x.start_k[b]);
            unsigned char *at = (unsigned char *)in->host + 4 * (size_t)(layout_offset(lin, x.varlen, b, tok, row, hh) + col);
            const double x0 = logical[(tok * heads + hh) * dim + col];
            const double xp = (double)(float)(x0 + h), xm = (double)(float)(x0 - h);
            const double lib = test_load(FLASHATTN_DTYPE_FP32,
                                         (unsigned char *)grad->host + 4 * (size_t)(layout_offset(lg, x.varlen, b, tok, row, hh) + col));
            const double r = ref[t][(tok * heads + hh) * dim + col];
            double lp, lm, fd, tol;
            test_store(FLASHATTN_DTYPE_FP32, at, xp);
            if (mem_upload(in) || ctx_forward(&x)) goto out;
            lp = loss(&x);
            test_store(FLASHATTN_DTYPE_FP32, at, xm);
            if (mem_upload(in) || ctx_forward(&x)) goto out;
            lm = loss(&x);
            test_store(FLASHATTN_DTYPE_FP32, at, x0);
            if (mem_upload(in)) goto out;
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
    int n = snprintf(buf, size, "%sb%lld_q%lld_k%lld_h%lld-%lld_d%lld", prefix, (long long)c->batch,
                     (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q, (long long)c->heads_kv,
                     (long long)c->head_dim);
    if (c->head_dim_v && c->head_dim_v != c->head_dim)
        n += snprintf(buf + n, size - (size_t)n, "-%lld", (long long)c->head_dim_v);
    n += snprintf(buf + n, size - (size_t)n, "_%s", test_dtype_name(effective_dtype(c->dtype)));
    if (c->causal) n += snprintf(buf + n, size - (size_t)n, "_causal");
    if (c->window_left >= 0 || c->window_right >= 0)
        n += snprintf(buf + n, size - (size_t)n, "_win%lld,%lld", (long long)c->window_left, (long long)c->window_right);
    if (c->softcap > 0) n += snprintf(buf + n, size - (size_t)n, "_cap%g", c->softcap);
    if (c->scale > 0) n += snprintf(buf + n, size - (size_t)n, "_scale%g", c->scale);
    if (c->varlen) n += snprintf(buf + n, size - (size_t)n, "_varlen");
    if (c->strided) n += snprintf(buf + n, size - (size_t)n, c->strided == 1 ? "_strided" : "_gradstrided");
    if (c->deterministic) n += snprintf(buf + n, size - (size_t)n, "_det");
    (void)n;
}

/* Exit 77 unless the library holds `name` and device 0 runs it. */
static void require_gpu_backend(const char *name, int min_major) {
    const char *info = flashattn_build_info();
    const char *list = strstr(info, "backends=");
    int32_t major = 0, minor = 0;
    test_skip_without_gpu();
    if (list == NULL || strstr(list, name) == NULL) {
        printf("this build has no %s backend (%s): skipping\n", name, info);
        exit(77);
    }
    if (flashattn_device_compute_capability(0, &major, &minor) != FLASHATTN_SUCCESS) {
        printf("no compute capability for device 0 (%s): skipping\n", flashattn_last_error());
        exit(77);
    }
    if (major < min_major) {
        printf("device 0 is sm_%d%d, which %s does not run: skipping\n", major, minor, name);
        exit(77);
    }
}

int main(void) {
    size_t i, n = 0, small = 0;
    const char *seed_env = getenv("FLASHATTN_TEST_SEED");
    const char *reduced_env = getenv("FLASHATTN_TEST_REDUCED");
    const int reduced = reduced_env != NULL && reduced_env[0] != '\0' && strcmp(reduced_env, "0") != 0;
    if (seed_env != NULL && seed_env[0] != '\0') g_seed = strtoull(seed_env, NULL, 0);
    if (TEST_BACKEND == FLASHATTN_BACKEND_FA2) require_gpu_backend("fa2", 8);
    printf("backward numerics on backend %s, seed %llu (set FLASHATTN_TEST_SEED to change)%s\n",
           test_backend_name(TEST_BACKEND), (unsigned long long)g_seed, reduced ? ", reduced grid" : "");

    /* FLASHATTN_TEST_REDUCED=1 keeps every third case of at most 128 x 256 scores per head: the
     * grid compute-sanitizer runs. */
    for (i = 0; i < NUM_CASES; ++i) {
        if (reduced && (grid[i].seqlen_q * grid[i].seqlen_k > 128 * 256 || small++ % 3 != 0)) continue;
        name_case(names[n], sizeof names[n], "", &grid[i]);
        tests[n].name = names[n];
        tests[n].test_func = run_case;
        tests[n].setup_func = NULL;
        tests[n].teardown_func = NULL;
        tests[n].initial_state = (void *)&grid[i];
        ++n;
    }
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) {
        for (i = 0; i < NUM_FD; ++i) {
            name_case(names[n], sizeof names[n], "finite_differences_", &fd_cases[i]);
            tests[n].name = names[n];
            tests[n].test_func = finite_differences;
            tests[n].setup_func = NULL;
            tests[n].teardown_func = NULL;
            tests[n].initial_state = (void *)&fd_cases[i];
            ++n;
        }
    }
    return _cmocka_run_group_tests(test_backend_name(TEST_BACKEND), tests, n, NULL, NULL);
}
