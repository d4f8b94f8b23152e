/* check_attention_case(): one case end to end through the public API only, on host memory for the
 * CPU backend or on device memory for the GPU backends, checked element by element against the
 * references of test_reference.c. */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_internal.h"

#ifdef FLASHATTN_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

/* NaN patterns written into every output element (and every gap of every tensor) before a run. */
#define POISON_FP16 0x7e5au
#define POISON_BF16 0x7fa5u
#define POISON_FP32 0x7fc0deadu

/* ---- GPU availability ----------------------------------------------------------------------- */

int test_gpu_available(void) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) { /* e.g. "CUDA driver version is insufficient", no driver at all */
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0;
#else
    return 0;
#endif
}

void test_skip_without_gpu(void) {
    if (!test_gpu_available()) {
        printf("no usable CUDA device (or tests built without CUDA): skipping\n");
        fflush(stdout);
        exit(77);
    }
}

/* ---- Layouts -------------------------------------------------------------------------------- */

typedef struct tensor_layout {
    int64_t batch_stride, row_stride, head_stride; /* elements */
    int64_t heads, dim;
    size_t elems; /* allocation, in elements */
} tensor_layout;

/* Padded (strided) layouts use pads that keep rows 16-byte aligned for every dtype. */
static tensor_layout make_layout(int64_t batch, int64_t seqlen, int64_t total, int varlen,
                                 int64_t heads, int64_t dim, int strided, int64_t pad_head,
                                 int64_t pad_row, int64_t pad_batch) {
    tensor_layout l;
    l.heads = heads;
    l.dim = dim;
    l.head_stride = dim + (strided ? pad_head : 0);
    l.row_stride = heads * l.head_stride + (strided ? pad_row : 0);
    l.batch_stride = seqlen * l.row_stride + (strided ? pad_batch : 0);
    if (varlen) {
        l.batch_stride = 0;
        l.elems = (size_t)(total * l.row_stride);
    } else {
        l.elems = (size_t)(batch * l.batch_stride);
    }
    if (l.elems == 0) l.elems = 1;
    return l;
}

/* Offset of element (sequence b, row i of it = token tok, head h, column 0). */
static int64_t layout_offset(const tensor_layout *l, int varlen, int64_t b, int64_t tok, int64_t i,
                             int64_t h) {
    if (varlen) return tok * l->row_stride + h * l->head_stride;
    return b * l->batch_stride + i * l->row_stride + h * l->head_stride;
}

static void poison(flashattn_dtype_t dtype, unsigned char *buf, size_t elems) {
    size_t i;
    if (dtype == FLASHATTN_DTYPE_FP32) {
        const uint32_t p = POISON_FP32;
        for (i = 0; i < elems; ++i) memcpy(buf + 4 * i, &p, 4);
    } else {
        const uint16_t p = dtype == FLASHATTN_DTYPE_FP16 ? POISON_FP16 : POISON_BF16;
        for (i = 0; i < elems; ++i) memcpy(buf + 2 * i, &p, 2);
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

static void poison_f32(float *buf, size_t n) {
    const uint32_t p = POISON_FP32;
    size_t i;
    for (i = 0; i < n; ++i) memcpy(buf + i, &p, 4);
}

/* 64-byte (host) aligned allocation carved out of malloc, released with aligned_free_host. */
static void *aligned_alloc_host(size_t bytes, size_t align) {
    unsigned char *raw = (unsigned char *)malloc(bytes + align + sizeof(void *));
    uintptr_t p;
    if (!raw) return NULL;
    p = ((uintptr_t)(raw + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    memcpy((void *)(p - sizeof(void *)), &raw, sizeof(void *));
    return (void *)p;
}

static void aligned_free_host(void *p) {
    void *raw;
    if (!p) return;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    free(raw);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Device memory (GPU backends) ------------------------------------------------------------ */

typedef struct mem {
    void *host;   /* always present */
    void *device; /* GPU backends only */
    size_t bytes;
} mem;

static int on_device(flashattn_backend_t backend) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    return backend == FLASHATTN_BACKEND_FA1 || backend == FLASHATTN_BACKEND_FA2 ||
           backend == FLASHATTN_BACKEND_FA3;
#else
    (void)backend;
    return 0;
#endif
}

static int mem_alloc(mem *m, size_t bytes, int device) {
    m->bytes = bytes ? bytes : 1;
    m->device = NULL;
    m->host = aligned_alloc_host(m->bytes, 256);
    if (!m->host) return -1;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (device) {
        if (cudaMalloc(&m->device, m->bytes) != cudaSuccess) {
            m->device = NULL;
            return -1;
        }
    }
#else
    (void)device;
#endif
    return 0;
}

static void mem_free(mem *m) {
    aligned_free_host(m->host);
    m->host = NULL;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) cudaFree(m->device);
#endif
    m->device = NULL;
}

/* The pointer handed to the library. */
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

/* ---- The check ------------------------------------------------------------------------------- */

typedef struct resolved {
    int64_t batch, sq, sk, hq, hk, d, dv;
    flashattn_dtype_t dtype;
    double scale;
    int64_t total_q, total_k;
} resolved;

static void describe(char *buf, size_t size, flashattn_backend_t backend, const attn_case *c,
                     const resolved *r, uint64_t seed) {
    snprintf(buf, size,
             "[%s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s causal=%d "
             "window=(%lld,%lld) softcap=%g scale=%g varlen=%d strided=%d lse=%d seed=%llu]",
             test_backend_name(backend), (long long)r->batch, (long long)r->sq, (long long)r->sk,
             (long long)r->hq, (long long)r->hk, (long long)r->d, (long long)r->dv,
             test_dtype_name(r->dtype), c->causal, (long long)c->window_left,
             (long long)c->window_right, c->softcap, r->scale, c->varlen, c->strided, c->with_lse,
             (unsigned long long)seed);
}

#define FAIL(...)                                  \
    do {                                           \
        printf("FAIL %s: ", desc);                 \
        printf(__VA_ARGS__);                       \
        printf("\n");                              \
        fflush(stdout);                            \
        goto done;                                 \
    } while (0)

#define API(call)                                                                              \
    do {                                                                                       \
        const flashattn_status_t st_ = (call);                                                 \
        if (st_ != FLASHATTN_SUCCESS)                                                          \
            FAIL("%s returned %d (%s): %s", #call, (int)st_, flashattn_status_string(st_),     \
                 flashattn_last_error());                                                      \
    } while (0)

int check_attention_case(flashattn_backend_t backend, const attn_case *c, uint64_t seed) {
    char desc[512];
    resolved r;
    test_rng rng;
    const int device = on_device(backend);
    const int varlen = c->varlen != 0;
    int result = 1;
    size_t es;
    int64_t b, i, h, j, col;
    int64_t *len_q = NULL, *len_k = NULL, *start_q = NULL, *start_k = NULL;
    int32_t *cu_q_host = NULL, *cu_k_host = NULL;
    float *qf = NULL, *kf = NULL, *vf = NULL;
    double *ref_o = NULL, *ref_lse = NULL, *low_o = NULL;
    unsigned char *o_first = NULL, *o_seen = NULL;
    float *lse_first = NULL;
    tensor_layout lq, lk, lv, lo;
    mem mq = {0, 0, 0}, mk = {0, 0, 0}, mv = {0, 0, 0}, mo = {0, 0, 0}, mlse = {0, 0, 0};
    mem mcu_q = {0, 0, 0}, mcu_k = {0, 0, 0}, mws = {0, 0, 0};
    size_t lse_count = 0, ws_bytes = 0;
    flashattn_plan_t *plan = NULL;
    flashattn_backend_t chosen;
    const char *reason = NULL;
    double tol, base_err = 0.0, max_ref = 0.0, exec_s = 0.0, ref_s = 0.0;
    int run;

    r.batch = c->batch;
    r.sq = c->seqlen_q;
    r.sk = c->seqlen_k;
    r.hq = c->heads_q;
    r.hk = c->heads_kv ? c->heads_kv : c->heads_q;
    r.d = c->head_dim;
    r.dv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    r.dtype = c->dtype;
    r.scale = c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->head_dim);
    r.total_q = r.batch * r.sq;
    r.total_k = r.batch * r.sk;
    describe(desc, sizeof desc, backend, c, &r, seed);
    es = test_dtype_size(r.dtype);
    if (r.batch < 1 || r.hq < 1 || r.hk < 1 || r.hq % r.hk != 0) FAIL("malformed case");

    /* Sequence lengths: fixed, or random per sequence with the first at full length and, for
     * batch >= 3, one query sequence of length 0 and one (other) key sequence of length 0. */
    test_rng_seed(&rng, seed);
    len_q = (int64_t *)calloc((size_t)r.batch, sizeof *len_q);
    len_k = (int64_t *)calloc((size_t)r.batch, sizeof *len_k);
    start_q = (int64_t *)calloc((size_t)r.batch, sizeof *start_q);
    start_k = (int64_t *)calloc((size_t)r.batch, sizeof *start_k);
    cu_q_host = (int32_t *)calloc((size_t)r.batch + 1, sizeof *cu_q_host);
    cu_k_host = (int32_t *)calloc((size_t)r.batch + 1, sizeof *cu_k_host);
    if (!len_q || !len_k || !start_q || !start_k || !cu_q_host || !cu_k_host) FAIL("out of memory");
    for (b = 0; b < r.batch; ++b) {
        len_q[b] = r.sq;
        len_k[b] = r.sk;
        if (varlen && b > 0) {
            len_q[b] = test_rng_range(&rng, r.sq / 3, r.sq);
            len_k[b] = test_rng_range(&rng, r.sk / 3, r.sk);
        }
    }
    if (varlen && r.batch >= 3) {
        const int64_t zq = test_rng_range(&rng, 1, r.batch - 1);
        int64_t zk = test_rng_range(&rng, 1, r.batch - 2);
        if (zk >= zq) ++zk;
        len_q[zq] = 0;
        len_k[zk] = 0;
    }
    r.total_q = r.total_k = 0;
    for (b = 0; b < r.batch; ++b) {
        start_q[b] = r.total_q;
        start_k[b] = r.total_k;
        r.total_q += len_q[b];
        r.total_k += len_k[b];
        cu_q_host[b + 1] = (int32_t)r.total_q;
        cu_k_host[b + 1] = (int32_t)r.total_k;
    }

    lq = make_layout(r.batch, r.sq, r.total_q, varlen, r.hq, r.d, c->strided, 8, 16, 24);
    lk = make_layout(r.batch, r.sk, r.total_k, varlen, r.hk, r.d, c->strided, 16, 8, 8);
    lv = make_layout(r.batch, r.sk, r.total_k, varlen, r.hk, r.dv, c->strided, 8, 8, 16);
    lo = make_layout(r.batch, r.sq, r.total_q, varlen, r.hq, r.dv, c->strided, 8, 24, 8);
    lse_count = (size_t)(r.hq * r.total_q);

    if (mem_alloc(&mq, lq.elems * es, device) || mem_alloc(&mk, lk.elems * es, device) ||
        mem_alloc(&mv, lv.elems * es, device) || mem_alloc(&mo, lo.elems * es, device) ||
        mem_alloc(&mlse, (lse_count ? lse_count : 1) * sizeof(float), device))
        FAIL("could not allocate the tensors");
    qf = (float *)malloc((size_t)(r.total_q * r.hq * r.d + 1) * sizeof(float));
    kf = (float *)malloc((size_t)(r.total_k * r.hk * r.d + 1) * sizeof(float));
    vf = (float *)malloc((size_t)(r.total_k * r.hk * r.dv + 1) * sizeof(float));
    ref_o = (double *)malloc((size_t)(r.total_q * r.hq * r.dv + 1) * sizeof(double));
    low_o = (double *)malloc((size_t)(r.total_q * r.hq * r.dv + 1) * sizeof(double));
    ref_lse = (double *)malloc((lse_count + 1) * sizeof(double));
    o_first = (unsigned char *)malloc(lo.elems * es);
    o_seen = (unsigned char *)calloc(lo.elems, 1);
    lse_first = (float *)malloc((lse_count + 1) * sizeof(float));
    if (!qf || !kf || !vf || !ref_o || !low_o || !ref_lse || !o_first || !o_seen || !lse_first)
        FAIL("out of memory");

    /* Inputs: U(-1, 1) rounded to the dtype; every gap holds NaN so a read outside the tensor
     * shows up in the output. */
    poison(r.dtype, (unsigned char *)mq.host, lq.elems);
    poison(r.dtype, (unsigned char *)mk.host, lk.elems);
    poison(r.dtype, (unsigned char *)mv.host, lv.elems);
    for (b = 0; b < r.batch; ++b) {
        for (i = 0; i < len_q[b]; ++i) {
            const int64_t tok = start_q[b] + i;
            for (h = 0; h < r.hq; ++h) {
                unsigned char *dst = (unsigned char *)mq.host + es * (size_t)layout_offset(&lq, varlen, b, tok, i, h);
                for (col = 0; col < r.d; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    qf[(tok * r.hq + h) * r.d + col] = (float)x;
                    test_store(r.dtype, dst + es * (size_t)col, x);
                }
            }
        }
        for (j = 0; j < len_k[b]; ++j) {
            const int64_t tok = start_k[b] + j;
            for (h = 0; h < r.hk; ++h) {
                unsigned char *kd = (unsigned char *)mk.host + es * (size_t)layout_offset(&lk, varlen, b, tok, j, h);
                unsigned char *vd = (unsigned char *)mv.host + es * (size_t)layout_offset(&lv, varlen, b, tok, j, h);
                for (col = 0; col < r.d; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    kf[(tok * r.hk + h) * r.d + col] = (float)x;
                    test_store(r.dtype, kd + es * (size_t)col, x);
                }
                for (col = 0; col < r.dv; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    vf[(tok * r.hk + h) * r.dv + col] = (float)x;
                    test_store(r.dtype, vd + es * (size_t)col, x);
                }
            }
        }
    }

    /* References. */
    ref_s = now_seconds();
    {
        ref_problem p;
        p.batch = r.batch;
        p.heads_q = r.hq;
        p.heads_kv = r.hk;
        p.head_dim = r.d;
        p.head_dim_v = r.dv;
        p.dtype = r.dtype;
        p.causal = c->causal;
        p.window_left = c->window_left;
        p.window_right = c->window_right;
        p.softcap = c->softcap;
        p.scale = r.scale;
        p.len_q = len_q;
        p.len_k = len_k;
        p.start_q = start_q;
        p.start_k = start_k;
        p.total_q = r.total_q;
        p.total_k = r.total_k;
        p.q = qf;
        p.k = kf;
        p.v = vf;
        ref_attention(&p, ref_o, ref_lse);
        if (r.dtype != FLASHATTN_DTYPE_FP32) ref_attention_lowp(&p, low_o);
    }
    ref_s = now_seconds() - ref_s;
    {
        const size_t n = (size_t)(r.total_q * r.hq * r.dv);
        size_t e;
        for (e = 0; e < n; ++e) {
            const double a = fabs(ref_o[e]);
            if (a > max_ref) max_ref = a;
            if (r.dtype != FLASHATTN_DTYPE_FP32) {
                const double err = fabs(low_o[e] - ref_o[e]);
                if (err > base_err) base_err = err;
            }
        }
    }
    tol = r.dtype == FLASHATTN_DTYPE_FP32 ? 1e-5 * max_ref : 2.0 * base_err + 1e-5;

    /* Plan, through the public API only. */
    API(flashattn_plan_create(&plan));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, r.batch));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, r.sq));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, r.sk));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, r.hq));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, r.hk));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, r.d));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM_V, r.dv));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, r.dtype));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, c->causal ? 1 : 0));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_LEFT, c->window_left));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, c->window_right));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, backend));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_DEVICE, 0));
    API(flashattn_plan_set_i64(plan, FLASHATTN_I64_VARLEN, varlen));
    if (varlen) {
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, r.total_q));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, r.total_k));
    }
    if (c->strided) {
        if (!varlen) {
            API(flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_BATCH_STRIDE, lq.batch_stride));
            API(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_BATCH_STRIDE, lk.batch_stride));
            API(flashattn_plan_set_i64(plan, FLASHATTN_I64_V_BATCH_STRIDE, lv.batch_stride));
            API(flashattn_plan_set_i64(plan, FLASHATTN_I64_O_BATCH_STRIDE, lo.batch_stride));
        }
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_ROW_STRIDE, lq.row_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_HEAD_STRIDE, lq.head_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_ROW_STRIDE, lk.row_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_HEAD_STRIDE, lk.head_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_V_ROW_STRIDE, lv.row_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_V_HEAD_STRIDE, lv.head_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_O_ROW_STRIDE, lo.row_stride));
        API(flashattn_plan_set_i64(plan, FLASHATTN_I64_O_HEAD_STRIDE, lo.head_stride));
    }
    /* scale 0 = the default 1/sqrt(head_dim): left unset so the library resolves it. */
    if (c->scale != 0.0) API(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, c->scale));
    API(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap));
    API(flashattn_plan_finalize(plan));
    API(flashattn_plan_get_backend(plan, &chosen, &reason));
    if (chosen != backend)
        FAIL("plan runs backend %s, not the %s it was forced to (%s)", test_backend_name(chosen),
             test_backend_name(backend), reason ? reason : "");
    API(flashattn_plan_get_workspace_size(plan, &ws_bytes));
    if (ws_bytes && mem_alloc(&mws, ws_bytes, device)) FAIL("could not allocate %zu bytes of workspace", ws_bytes);

    if (varlen) {
        if (mem_alloc(&mcu_q, (size_t)(r.batch + 1) * sizeof(int32_t), device) ||
            mem_alloc(&mcu_k, (size_t)(r.batch + 1) * sizeof(int32_t), device))
            FAIL("could not allocate cu_seqlens");
        memcpy(mcu_q.host, cu_q_host, (size_t)(r.batch + 1) * sizeof(int32_t));
        memcpy(mcu_k.host, cu_k_host, (size_t)(r.batch + 1) * sizeof(int32_t));
        if (mem_upload(&mcu_q) || mem_upload(&mcu_k)) FAIL("cudaMemcpy of cu_seqlens failed");
    }
    if (mem_upload(&mq) || mem_upload(&mk) || mem_upload(&mv)) FAIL("cudaMemcpy of the inputs failed");

    for (run = 0; run < 2; ++run) {
        float *lse_ptr = c->with_lse ? (float *)mem_ptr(&mlse) : NULL;
        double t0;
        poison(r.dtype, (unsigned char *)mo.host, lo.elems);
        poison_f32((float *)mlse.host, lse_count ? lse_count : 1);
        if (mem_upload(&mo) || mem_upload(&mlse)) FAIL("cudaMemcpy of the poisoned outputs failed");
        t0 = now_seconds();
        if (varlen) {
            API(flashattn_plan_execute_varlen(plan, mem_ptr(&mq), mem_ptr(&mk), mem_ptr(&mv),
                                              mem_ptr(&mo), lse_ptr, (const int32_t *)mem_ptr(&mcu_q),
                                              (const int32_t *)mem_ptr(&mcu_k),
                                              ws_bytes ? mem_ptr(&mws) : NULL, ws_bytes, NULL));
        } else {
            API(flashattn_plan_execute(plan, mem_ptr(&mq), mem_ptr(&mk), mem_ptr(&mv), mem_ptr(&mo),
                                       lse_ptr, ws_bytes ? mem_ptr(&mws) : NULL, ws_bytes, NULL));
        }
#ifdef FLASHATTN_TEST_WITH_CUDA
        if (device) {
            cudaError_t err = cudaDeviceSynchronize();
            if (err == cudaSuccess) err = cudaGetLastError();
            if (err != cudaSuccess) FAIL("CUDA error after execute (run %d): %s", run + 1, cudaGetErrorString(err));
        }
#endif
        if (run == 0) exec_s = now_seconds() - t0;
        if (mem_download(&mo) || mem_download(&mlse)) FAIL("cudaMemcpy of the outputs failed");

        if (run == 1) { /* the second run must reproduce the first bit for bit */
            if (memcmp(o_first, mo.host, lo.elems * es) != 0) {
                size_t e = 0;
                while (e < lo.elems * es && o_first[e] == ((unsigned char *)mo.host)[e]) ++e;
                FAIL("second run differs from the first in O (first differing byte %zu)", e);
            }
            if (c->with_lse && memcmp(lse_first, mlse.host, lse_count * sizeof(float)) != 0)
                FAIL("second run differs from the first in LSE");
            break;
        }
        memcpy(o_first, mo.host, lo.elems * es);
        memcpy(lse_first, mlse.host, (lse_count ? lse_count : 1) * sizeof(float));

        /* O: every element against the reference. */
        {
            double max_err = 0.0;
            long long bad_b = -1, bad_i = -1, bad_h = -1, bad_c = -1;
            double bad_out = 0.0, bad_ref = 0.0;
            for (b = 0; b < r.batch; ++b) {
                for (i = 0; i < len_q[b]; ++i) {
                    const int64_t tok = start_q[b] + i;
                    for (h = 0; h < r.hq; ++h) {
                        const int64_t off = layout_offset(&lo, varlen, b, tok, i, h);
                        const int masked = ref_lse[h * r.total_q + tok] == -INFINITY;
                        for (col = 0; col < r.dv; ++col) {
                            const double out = test_load(r.dtype, (unsigned char *)mo.host + es * (size_t)(off + col));
                            const double ref = ref_o[(tok * r.hq + h) * r.dv + col];
                            const double err = fabs(out - ref);
                            o_seen[off + col] = 1;
                            if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
                            if (bad_b < 0 && (!(err <= tol) || (masked && out != 0.0))) {
                                bad_b = (long long)b;
                                bad_i = (long long)i;
                                bad_h = (long long)h;
                                bad_c = (long long)col;
                                bad_out = out;
                                bad_ref = ref;
                            }
                        }
                    }
                }
            }
            if (test_verbose()) {
                printf("  %s: O max err %.3e (tol %.3e, lowp err %.3e, max|ref| %.3e), exec %.3f ms, references %.2f s\n",
                       desc, max_err, tol, base_err, max_ref, exec_s * 1e3, ref_s);
            }
            if (bad_b >= 0)
                FAIL("O max|out-ref| = %.4e, tolerance %.4e (lowp baseline %.4e, max|ref| %.4e); first bad "
                     "element at batch %lld row %lld head %lld col %lld: out %.8g ref %.8g",
                     max_err, tol, base_err, max_ref, bad_b, bad_i, bad_h, bad_c, bad_out, bad_ref);
        }
        /* Gaps of O: untouched. */
        {
            size_t e;
            for (e = 0; e < lo.elems; ++e) {
                if (!o_seen[e] && !is_poison(r.dtype, (unsigned char *)mo.host + es * e))
                    FAIL("O element %zu lies outside the tensor (a stride gap) but was written", e);
            }
        }
        /* LSE. */
        if (c->with_lse) {
            const float *lse = (const float *)mlse.host;
            for (b = 0; b < r.batch; ++b) {
                for (h = 0; h < r.hq; ++h) {
                    for (i = 0; i < len_q[b]; ++i) {
                        const int64_t tok = start_q[b] + i;
                        const size_t idx = varlen ? (size_t)(h * r.total_q + tok)
                                                  : (size_t)((b * r.hq + h) * r.sq + i);
                        const double out = (double)lse[idx];
                        const double ref = ref_lse[h * r.total_q + tok];
                        int ok;
                        if (ref == -INFINITY) {
                            ok = out == -INFINITY;
                        } else {
                            ok = fabs(out - ref) <= 1e-4 * (1.0 + fabs(ref));
                        }
                        if (!ok)
                            FAIL("LSE at batch %lld head %lld row %lld: out %.9g ref %.9g (tolerance %.3g)",
                                 (long long)b, (long long)h, (long long)i, out, ref,
                                 ref == -INFINITY ? 0.0 : 1e-4 * (1.0 + fabs(ref)));
                    }
                }
            }
        } else {
            const float *lse = (const float *)mlse.host;
            size_t e;
            for (e = 0; e < lse_count; ++e) {
                uint32_t u;
                memcpy(&u, lse + e, 4);
                if (u != POISON_FP32) FAIL("LSE buffer written although lse was NULL");
            }
        }
    }
    result = 0;

done:
    flashattn_plan_destroy(plan);
    mem_free(&mq);
    mem_free(&mk);
    mem_free(&mv);
    mem_free(&mo);
    mem_free(&mlse);
    mem_free(&mcu_q);
    mem_free(&mcu_k);
    mem_free(&mws);
    free(len_q);
    free(len_k);
    free(start_q);
    free(start_k);
    free(cu_q_host);
    free(cu_k_host);
    free(qf);
    free(kf);
    free(vf);
    free(ref_o);
    free(low_o);
    free(ref_lse);
    free(o_first);
    free(o_seen);
    free(lse_first);
    return result;
}
