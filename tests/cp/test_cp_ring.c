/* libflashattn_cp through the loopback transport (W ranks in one process): the ring for W = 1..8,
 * causal zigzag and non-causal, GQA, odd chunk sizes, several dtypes, against one single core call
 * on the gathered sequence, and on small cases against a double reference written here; then the
 * argument checks. Every output is poisoned before each run and every element checked.
 *
 * Built twice: test_cp_ring runs the CPU backend on host memory; test_cp_ring_gpu (CP_TEST_GPU)
 * runs the GPU backend chosen by auto on device memory, the single call on the same GPU, and
 * exits 77 (skipped) without a GPU. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn_cp.h"

#include <pthread.h>

#ifdef CP_TEST_GPU
#include <cuda_runtime_api.h>
#define TEST_BACKEND FLASHATTN_BACKEND_AUTO
#else
#define TEST_BACKEND FLASHATTN_BACKEND_CPU
#endif

static int failures = 0;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            ++failures;                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, "\n");                                \
        }                                                         \
    } while (0)

typedef struct {
    int batch, world, local_rows, heads_q, heads_kv, dim, dim_v, causal, dtype;
    double scale, softcap; /* 0: the core's defaults (1/sqrt(dim), no cap) */
    int deterministic;     /* the local plan's FLASHATTN_I64_DETERMINISTIC (the CPU always is) */
} Case;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even; inputs are finite */
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* fp16 of the values this test stores (|x| in [2^-14, 4] or 0): normal numbers only. */
static uint16_t to_fp16(float x) {
    if (x == 0) return 0;
    const uint16_t sign = x < 0 ? 0x8000 : 0;
    int exponent;
    const double m = frexp(fabs((double)x), &exponent); /* |x| = m 2^e, m in [0.5, 1) */
    if (exponent < -13) return sign;                   /* below the normal range: flush (rare here) */
    long mantissa = lrint(ldexp(m, 11));               /* 11 significant bits, in [1024, 2048] */
    if (mantissa == 2048) {
        mantissa = 1024;
        ++exponent;
    }
    return (uint16_t)(sign | (uint16_t)((exponent + 14) << 10) | (uint16_t)(mantissa - 1024));
}
static float from_fp16(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const double magnitude = exponent ? ldexp(1024 + mantissa, exponent - 25) : ldexp(mantissa, -24);
    return (float)((h & 0x8000) ? -magnitude : magnitude);
}

static size_t elt(const Case *c) { return c->dtype == FLASHATTN_DTYPE_FP32 ? 4 : 2; }
static float load(const Case *c, const void *p, size_t i) {
    if (c->dtype == FLASHATTN_DTYPE_BF16) return from_bf16(((const uint16_t *)p)[i]);
    if (c->dtype == FLASHATTN_DTYPE_FP16) return from_fp16(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
static void store(const Case *c, void *p, size_t i, float x) {
    if (c->dtype == FLASHATTN_DTYPE_BF16)
        ((uint16_t *)p)[i] = to_bf16(x);
    else if (c->dtype == FLASHATTN_DTYPE_FP16)
        ((uint16_t *)p)[i] = to_fp16(x);
    else
        ((float *)p)[i] = x;
}

/* Global row of a rank's local row (the layout flashattn_cp.h documents). */
static int global_row(const Case *c, int rank, int local) {
    if (!c->causal) return rank * c->local_rows + local;
    const int chunk = c->local_rows / 2;
    return local < chunk ? rank * chunk + local : (2 * c->world - 1 - rank) * chunk + (local - chunk);
}

static flashattn_plan_t *core_plan(const Case *c, int rows) {
    flashattn_plan_t *plan = NULL;
    if (flashattn_plan_create(&plan) != FLASHATTN_SUCCESS) return NULL;
    flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, c->batch);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, rows);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, rows);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, c->heads_q);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, c->heads_kv);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, c->dim);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM_V, c->dim_v);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, c->dtype);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, c->causal);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, TEST_BACKEND);
    if (c->scale > 0) flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, c->scale);
    if (c->softcap > 0) flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, c->deterministic);
    if (flashattn_plan_finalize(plan) != FLASHATTN_SUCCESS) {
        fprintf(stderr, "core finalize: %s\n", flashattn_last_error());
        flashattn_plan_destroy(plan);
        return NULL;
    }
    return plan;
}

/* Poisoned (NaN bytes) allocation with a 256-byte aligned start. */
static void *poisoned(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return NULL;
    memset(p, 0xff, bytes);
    return p;
}

/* Buffers the library reads and writes: host memory on the CPU, device memory on the GPU. They
 * start poisoned (all bytes 0xff: NaN in every dtype). */
static void *buffer_new(size_t bytes) {
#ifdef CP_TEST_GPU
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0xff, bytes);
    return p;
#else
    return poisoned(bytes);
#endif
}
static void buffer_free(void *p) {
#ifdef CP_TEST_GPU
    cudaFree(p);
#else
    free(p);
#endif
}
static void buffer_upload(void *dst, const void *host, size_t bytes) {
#ifdef CP_TEST_GPU
    cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice);
#else
    memcpy(dst, host, bytes);
#endif
}
static void buffer_download(void *host, const void *src, size_t bytes) {
#ifdef CP_TEST_GPU
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "device: %s", cudaGetErrorString(cudaGetLastError()));
    cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost);
#else
    memcpy(host, src, bytes);
#endif
}
static void buffer_poison(void *p, size_t bytes) {
#ifdef CP_TEST_GPU
    cudaMemset(p, 0xff, bytes);
#else
    memset(p, 0xff, bytes);
#endif
}
/* A buffer holding a copy of host data. */
static void *buffer_from(const void *host, size_t bytes) {
    void *p = buffer_new(bytes);
    if (p) buffer_upload(p, host, bytes);
    return p;
}

/* Double reference of global query row i, head h, batch b: O row and LSE. */
static void reference_row(const Case *c, const void *q, const void *k, const void *v, int S, int b, int i, int h,
                          double *out, double *lse) {
    const int hk = h / (c->heads_q / c->heads_kv);
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->dim);
    double max = -INFINITY, sum = 0;
    for (int j = 0; j < S; ++j) {
        if (c->causal && j > i) break;
        double s = 0;
        for (int d = 0; d < c->dim; ++d)
            s += (double)load(c, q, (((size_t)b * S + i) * c->heads_q + h) * c->dim + d) *
                 load(c, k, (((size_t)b * S + j) * c->heads_kv + hk) * c->dim + d);
        s *= scale;
        if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
        if (s > max) max = s;
    }
    for (int d = 0; d < c->dim_v; ++d) out[d] = 0;
    for (int j = 0; j < S; ++j) {
        if (c->causal && j > i) break;
        double s = 0;
        for (int d = 0; d < c->dim; ++d)
            s += (double)load(c, q, (((size_t)b * S + i) * c->heads_q + h) * c->dim + d) *
                 load(c, k, (((size_t)b * S + j) * c->heads_kv + hk) * c->dim + d);
        s *= scale;
        if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
        const double p = exp(s - max);
        sum += p;
        for (int d = 0; d < c->dim_v; ++d) out[d] += p * load(c, v, (((size_t)b * S + j) * c->heads_kv + hk) * c->dim_v + d);
    }
    for (int d = 0; d < c->dim_v; ++d) out[d] /= sum;
    *lse = max + log(sum);
}

/* Elements per row and bytes of the [batch, rows] tensors of a case (the LSE [batch, heads_q, rows]). */
typedef struct {
    size_t q_row, k_row, v_row, o_row, q, k, v, o, lse;
} Sizes;
static Sizes sizes_of(const Case *c, int rows) {
    Sizes z;
    const size_t n = (size_t)c->batch * rows, e = elt(c);
    z.q_row = (size_t)c->heads_q * c->dim;
    z.k_row = (size_t)c->heads_kv * c->dim;
    z.v_row = (size_t)c->heads_kv * c->dim_v;
    z.o_row = (size_t)c->heads_q * c->dim_v;
    z.q = n * z.q_row * e;
    z.k = n * z.k_row * e;
    z.v = n * z.v_row * e;
    z.o = n * z.o_row * e;
    z.lse = n * c->heads_q * sizeof(float);
    return z;
}

/* Double reference gradients of the whole sequence (loss = sum(O * dO)), written out term by term:
 * P = softmax(S), dP = dO V^T, dS = P (dP - rowsum(dO * O)), through the softcap's tanh; dK and
 * dV summed over each key/value head's query group. Outputs zeroed here. */
static void reference_grads(const Case *c, const void *q, const void *k, const void *v, const void *dout, int S,
                            double *dq, double *dk, double *dv) {
    const int group = c->heads_q / c->heads_kv;
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->dim);
    double *p = malloc((size_t)S * sizeof(double)), *chain = malloc((size_t)S * sizeof(double));
    double *o = malloc((size_t)c->dim_v * sizeof(double));
    memset(dq, 0, (size_t)c->batch * S * c->heads_q * c->dim * sizeof(double));
    memset(dk, 0, (size_t)c->batch * S * c->heads_kv * c->dim * sizeof(double));
    memset(dv, 0, (size_t)c->batch * S * c->heads_kv * c->dim_v * sizeof(double));
    for (int b = 0; b < c->batch; ++b)
        for (int h = 0; h < c->heads_q; ++h)
            for (int i = 0; i < S; ++i) {
                const int hk = h / group, seen = c->causal ? i + 1 : S;
                const size_t qi = (((size_t)b * S + i) * c->heads_q + h);
                double max = -INFINITY, sum = 0, di = 0;
                for (int j = 0; j < seen; ++j) {
                    const size_t kj = ((size_t)b * S + j) * c->heads_kv + hk;
                    double s = 0;
                    for (int d = 0; d < c->dim; ++d)
                        s += (double)load(c, q, qi * c->dim + d) * load(c, k, kj * c->dim + d);
                    s *= scale;
                    chain[j] = scale;
                    if (c->softcap > 0) {
                        const double t = tanh(s / c->softcap);
                        s = c->softcap * t;
                        chain[j] = scale * (1 - t * t);
                    }
                    p[j] = s;
                    if (s > max) max = s;
                }
                for (int j = 0; j < seen; ++j) sum += (p[j] = exp(p[j] - max));
                for (int d = 0; d < c->dim_v; ++d) o[d] = 0;
                for (int j = 0; j < seen; ++j) {
                    const size_t kj = ((size_t)b * S + j) * c->heads_kv + hk;
                    p[j] /= sum;
                    for (int d = 0; d < c->dim_v; ++d) o[d] += p[j] * load(c, v, kj * c->dim_v + d);
                }
                for (int d = 0; d < c->dim_v; ++d) di += load(c, dout, qi * c->dim_v + d) * o[d];
                for (int j = 0; j < seen; ++j) {
                    const size_t kj = ((size_t)b * S + j) * c->heads_kv + hk;
                    double dp = 0;
                    for (int d = 0; d < c->dim_v; ++d) {
                        const double g = load(c, dout, qi * c->dim_v + d);
                        dp += g * load(c, v, kj * c->dim_v + d);
                        dv[kj * c->dim_v + d] += p[j] * g;
                    }
                    const double ds = p[j] * (dp - di) * chain[j];
                    for (int d = 0; d < c->dim; ++d) {
                        dq[qi * c->dim + d] += ds * load(c, k, kj * c->dim + d);
                        dk[kj * c->dim + d] += ds * load(c, q, qi * c->dim + d);
                    }
                }
            }
    free(p);
    free(chain);
    free(o);
}

/* Largest |x| of n doubles (at least 1): gradients' tolerances scale with their size. */
static double magnitude(const double *x, size_t n) {
    double m = 1;
    for (size_t i = 0; i < n; ++i)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* One gradient tensor of every rank against the gathered single call (want, global layout) and
 * the double reference (ref, may be NULL). Returns the largest error against the single call. */
static double compare_grad(const Case *c, const char *name, const char *what, void *const *got, size_t row_elems,
                           const void *want, const double *ref, double tol, size_t rank_bytes) {
    const int W = c->world, L = c->local_rows, S = W * L;
    double *single = malloc((size_t)c->batch * S * row_elems * sizeof(double));
    for (size_t i = 0; i < (size_t)c->batch * S * row_elems; ++i) single[i] = load(c, want, i);
    const double scale = magnitude(ref ? ref : single, (size_t)c->batch * S * row_elems);
    void *host = malloc(rank_bytes);
    double worst = 0, worst_ref = 0;
    for (int r = 0; r < W; ++r) {
        buffer_download(host, got[r], rank_bytes);
        for (int b = 0; b < c->batch; ++b)
            for (int i = 0; i < L; ++i) {
                const size_t g = ((size_t)b * S + global_row(c, r, i)) * row_elems, l = ((size_t)b * L + i) * row_elems;
                for (size_t e = 0; e < row_elems; ++e) {
                    const double x = load(c, host, l + e);
                    if (!(fabs(x - single[g + e]) <= worst)) worst = fabs(x - single[g + e]); /* NaN sticks */
                    if (ref && !(fabs(x - ref[g + e]) <= worst_ref)) worst_ref = fabs(x - ref[g + e]);
                }
            }
    }
    CHECK(worst <= tol * scale, "%s: %s ring vs single call: max error %g > %g", name, what, worst, tol * scale);
    CHECK(worst_ref <= tol * scale, "%s: %s ring vs double reference: max error %g > %g", name, what, worst_ref,
          tol * scale);
    free(single);
    free(host);
    return worst / scale;
}

/* Shards a global [batch, S, row_elems] host tensor into rank r's local rows (host). */
static void *shard(const Case *c, const void *global, size_t row_bytes, int r) {
    const int L = c->local_rows, S = c->world * L;
    char *out = poisoned((size_t)c->batch * L * row_bytes);
    for (int b = 0; b < c->batch; ++b)
        for (int i = 0; i < L; ++i)
            memcpy(out + ((size_t)b * L + i) * row_bytes,
                   (const char *)global + ((size_t)b * S + global_row(c, r, i)) * row_bytes, row_bytes);
    return out;
}

/* The ring backward over the ring forward's own O and LSE (ro, rl) against the core's single
 * backward call on the gathered sequence (with the single call's O and LSE) and, when asked, the
 * double reference; then again on the dirty workspace, bitwise the same where the backend is
 * deterministic. */
static void run_backward(const Case *c, const char *name, flashattn_plan_t *global, flashattn_cp_plan_t *cp,
                         const void *q, const void *k, const void *v, const void *o, const float *lse,
                         void *const *rq, void *const *rk, void *const *rv, void *const *ro, float *const *rl,
                         int with_reference) {
    const int W = c->world, L = c->local_rows, S = W * L;
    const size_t e = elt(c);
    const Sizes z = sizes_of(c, S);
    const size_t q_row = z.q_row, k_row = z.k_row, v_row = z.v_row, o_row = z.o_row;
    const size_t q_bytes = z.q, k_bytes = z.k, v_bytes = z.v, o_bytes = z.o, lse_bytes = z.lse;
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    if (flashattn_plan_get_backward_backend(global, &backend, &reason) != FLASHATTN_SUCCESS) {
        /* No backward in the core for this problem (e.g. head_dim_v != head_dim on a GPU): the
         * ring must say so too, and keep its forward. */
        size_t bytes = 0;
        CHECK(flashattn_cp_plan_get_backward_workspace_size(cp, &bytes) == FLASHATTN_ERROR_NOT_SUPPORTED,
              "%s: the core has no backward (%s) but the ring claims one", name, flashattn_last_error());
        printf("%-70s backward not supported by the core: checked the ring says so\n", name);
        return;
    }
    void *dout = poisoned(o_bytes), *want_dq = poisoned(q_bytes), *want_dk = poisoned(k_bytes),
         *want_dv = poisoned(v_bytes);
    for (size_t i = 0; i < (size_t)c->batch * S * o_row; ++i) store(c, dout, i, uniform());
    {
        size_t ws_bytes = 0;
        CHECK(flashattn_plan_get_backward_workspace_size(global, &ws_bytes) == FLASHATTN_SUCCESS,
              "%s: single backward workspace: %s", name, flashattn_last_error());
        void *ws = buffer_new(ws_bytes), *dq_ = buffer_from(q, q_bytes), *dk_ = buffer_from(k, k_bytes),
             *dv_ = buffer_from(v, v_bytes), *do_ = buffer_from(o, o_bytes), *ddout = buffer_from(dout, o_bytes),
             *dl = buffer_from(lse, lse_bytes), *gq = buffer_new(q_bytes), *gk = buffer_new(k_bytes),
             *gv = buffer_new(v_bytes);
        CHECK(flashattn_plan_execute_backward(global, dq_, dk_, dv_, do_, ddout, dl, gq, gk, gv, ws, ws_bytes, NULL) ==
                  FLASHATTN_SUCCESS,
              "%s: single backward: %s", name, flashattn_last_error());
        buffer_download(want_dq, gq, q_bytes);
        buffer_download(want_dk, gk, k_bytes);
        buffer_download(want_dv, gv, v_bytes);
        void *all[] = {ws, dq_, dk_, dv_, do_, ddout, dl, gq, gk, gv};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buffer_free(all[i]);
    }

    const Sizes local = sizes_of(c, L);
    const size_t rq_bytes = local.q, rk_bytes = local.k, rv_bytes = local.v;
    void *rdo[8], *rdq[8], *rdk[8], *rdv[8], *first[3][8];
    for (int r = 0; r < W; ++r) {
        void *host = shard(c, dout, o_row * e, r);
        rdo[r] = buffer_from(host, local.o);
        free(host);
        rdq[r] = buffer_new(rq_bytes);
        rdk[r] = buffer_new(rk_bytes);
        rdv[r] = buffer_new(rv_bytes);
    }
    size_t cp_bytes = 0;
    flashattn_status_t st = flashattn_cp_plan_get_backward_workspace_size(cp, &cp_bytes);
    CHECK(st == FLASHATTN_SUCCESS, "%s: cp backward workspace: %s", name, flashattn_cp_last_error());
    void *cp_ws = buffer_new(cp_bytes);
    st = flashattn_cp_plan_execute_backward(cp, W, (const void *const *)rq, (const void *const *)rk,
                                            (const void *const *)rv, (const void *const *)ro,
                                            (const void *const *)rdo, (const float *const *)rl, rdq, rdk, rdv, cp_ws,
                                            cp_bytes, NULL);
    CHECK(st == FLASHATTN_SUCCESS, "%s: cp backward: %s", name, flashattn_cp_last_error());

    double *ref[3] = {NULL, NULL, NULL};
    if (with_reference) {
        ref[0] = malloc((size_t)c->batch * S * q_row * sizeof(double));
        ref[1] = malloc((size_t)c->batch * S * k_row * sizeof(double));
        ref[2] = malloc((size_t)c->batch * S * v_row * sizeof(double));
        reference_grads(c, q, k, v, dout, S, ref[0], ref[1], ref[2]);
    }
    /* Each step's parts are rounded to the dtype before they are summed: a few roundings more
     * than the single call's, hence the forward's tolerance relative to the gradient's size. */
    const double tol = c->dtype == FLASHATTN_DTYPE_BF16 ? 3e-2 : c->dtype == FLASHATTN_DTYPE_FP16 ? 6e-3 : 2e-5;
    double worst = 0;
    if (st == FLASHATTN_SUCCESS) {
        const double errors[3] = {compare_grad(c, name, "dQ", rdq, q_row, want_dq, ref[0], tol, rq_bytes),
                                  compare_grad(c, name, "dK", rdk, k_row, want_dk, ref[1], tol, rk_bytes),
                                  compare_grad(c, name, "dV", rdv, v_row, want_dv, ref[2], tol, rv_bytes)};
        for (int i = 0; i < 3; ++i)
            if (errors[i] > worst) worst = errors[i];
    }
    /* Again on the dirty workspace with poisoned outputs: bitwise the same where deterministic. */
    const int deterministic = c->deterministic || TEST_BACKEND == FLASHATTN_BACKEND_CPU;
    if (st == FLASHATTN_SUCCESS && deterministic) {
        void *const *outs[3] = {rdq, rdk, rdv};
        const size_t sizes[3] = {rq_bytes, rk_bytes, rv_bytes};
        for (int t = 0; t < 3; ++t)
            for (int r = 0; r < W; ++r) {
                first[t][r] = malloc(sizes[t]);
                buffer_download(first[t][r], outs[t][r], sizes[t]);
                buffer_poison(outs[t][r], sizes[t]);
            }
        st = flashattn_cp_plan_execute_backward(cp, W, (const void *const *)rq, (const void *const *)rk,
                                                (const void *const *)rv, (const void *const *)ro,
                                                (const void *const *)rdo, (const float *const *)rl, rdq, rdk, rdv,
                                                cp_ws, cp_bytes, NULL);
        CHECK(st == FLASHATTN_SUCCESS, "%s: cp backward again: %s", name, flashattn_cp_last_error());
        for (int t = 0; t < 3; ++t)
            for (int r = 0; r < W; ++r) {
                void *again = malloc(sizes[t]);
                buffer_download(again, outs[t][r], sizes[t]);
                CHECK(st != FLASHATTN_SUCCESS || memcmp(again, first[t][r], sizes[t]) == 0,
                      "%s: rank %d: %s differs between two runs", name, r, t == 0 ? "dQ" : t == 1 ? "dK" : "dV");
                free(again);
                free(first[t][r]);
            }
    }
    printf("%-70s backward ring-vs-single %.2e (relative)%s\n", name, worst, deterministic ? ", rerun bitwise" : "");
    for (int i = 0; i < 3; ++i) free(ref[i]);
    buffer_free(cp_ws);
    for (int r = 0; r < W; ++r) {
        buffer_free(rdo[r]);
        buffer_free(rdq[r]);
        buffer_free(rdk[r]);
        buffer_free(rdv[r]);
    }
    free(dout);
    free(want_dq);
    free(want_dk);
    free(want_dv);
}

static void run_case(const Case *c, int with_reference) {
    const int W = c->world, L = c->local_rows, S = W * L;
    const size_t e = elt(c);
    const Sizes z = sizes_of(c, S);
    const size_t q_row = z.q_row, k_row = z.k_row, v_row = z.v_row, o_row = z.o_row;
    const size_t q_bytes = z.q, k_bytes = z.k, v_bytes = z.v, o_bytes = z.o, lse_bytes = z.lse;
    char name[160];
    snprintf(name, sizeof name, "W=%d L=%d b=%d hq=%d hkv=%d d=%d dv=%d causal=%d dtype=%d scale=%g cap=%g", W, L,
             c->batch, c->heads_q, c->heads_kv, c->dim, c->dim_v, c->causal, c->dtype, c->scale, c->softcap);

    /* Global tensors (host) and the single-call answer (on the backend under test). */
    void *q = poisoned(q_bytes), *k = poisoned(k_bytes), *v = poisoned(v_bytes), *o = poisoned(o_bytes);
    float *lse = poisoned(lse_bytes);
    for (size_t i = 0; i < (size_t)c->batch * S * q_row; ++i) store(c, q, i, 2 * uniform());
    for (size_t i = 0; i < (size_t)c->batch * S * k_row; ++i) store(c, k, i, 2 * uniform());
    for (size_t i = 0; i < (size_t)c->batch * S * v_row; ++i) store(c, v, i, uniform());
    flashattn_plan_t *global = core_plan(c, S), *local = core_plan(c, L);
    CHECK(global && local, "%s: core plans", name);
    if (!global || !local) goto out_plans;
    {
        size_t ws_bytes = 0;
        flashattn_plan_get_workspace_size(global, &ws_bytes);
        void *ws = buffer_new(ws_bytes), *dq = buffer_from(q, q_bytes), *dk = buffer_from(k, k_bytes),
             *dv = buffer_from(v, v_bytes), *dout = buffer_new(o_bytes), *dlse = buffer_new(lse_bytes);
        CHECK(flashattn_plan_execute(global, dq, dk, dv, dout, dlse, ws, ws_bytes, NULL) == FLASHATTN_SUCCESS,
              "%s: single call: %s", name, flashattn_last_error());
        buffer_download(o, dout, o_bytes);
        buffer_download(lse, dlse, lse_bytes);
        buffer_free(ws);
        buffer_free(dq);
        buffer_free(dk);
        buffer_free(dv);
        buffer_free(dout);
        buffer_free(dlse);
    }

    /* Shard by the documented layout (host), then hand the shards to the backend's memory. */
    const Sizes shard_sizes = sizes_of(c, L);
    const size_t rq_bytes = shard_sizes.q, rk_bytes = shard_sizes.k, rv_bytes = shard_sizes.v,
                 ro_bytes = shard_sizes.o, rl_bytes = shard_sizes.lse;
    void *rq[8], *rk[8], *rv[8], *ro[8], *ho[8];
    float *rl[8], *hl[8];
    for (int r = 0; r < W; ++r) {
        void *sq = shard(c, q, q_row * e, r), *sk = shard(c, k, k_row * e, r), *sv = shard(c, v, v_row * e, r);
        rq[r] = buffer_from(sq, rq_bytes);
        rk[r] = buffer_from(sk, rk_bytes);
        rv[r] = buffer_from(sv, rv_bytes);
        free(sq);
        free(sk);
        free(sv);
        ro[r] = buffer_new(ro_bytes);
        rl[r] = buffer_new(rl_bytes);
        ho[r] = poisoned(ro_bytes);
        hl[r] = poisoned(rl_bytes);
    }

    flashattn_cp_plan_t *cp = NULL;
    CHECK(flashattn_cp_plan_create(&cp) == FLASHATTN_SUCCESS, "%s: create", name);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, W);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_LOOPBACK);
    flashattn_status_t st = flashattn_cp_plan_finalize(cp, local);
    CHECK(st == FLASHATTN_SUCCESS, "%s: cp finalize: %s", name, flashattn_cp_last_error());
    size_t cp_bytes = 0;
    flashattn_cp_plan_get_workspace_size(cp, &cp_bytes);
    void *cp_ws = buffer_new(cp_bytes);
    st = flashattn_cp_plan_execute(cp, W, (const void *const *)rq, (const void *const *)rk, (const void *const *)rv,
                                   ro, rl, cp_ws, cp_bytes, NULL);
    CHECK(st == FLASHATTN_SUCCESS, "%s: cp execute: %s", name, flashattn_cp_last_error());
    for (int r = 0; r < W; ++r) {
        buffer_download(ho[r], ro[r], ro_bytes);
        buffer_download(hl[r], rl[r], rl_bytes);
    }

    /* Every element of every rank against the single call (and the double reference). */
    const double tol = c->dtype == FLASHATTN_DTYPE_BF16 ? 2e-2 : c->dtype == FLASHATTN_DTYPE_FP16 ? 4e-3 : 2e-5;
    double worst = 0, worst_ref = 0;
    double ref[256];
    for (int r = 0; r < W && st == FLASHATTN_SUCCESS; ++r)
        for (int b = 0; b < c->batch; ++b)
            for (int i = 0; i < L; ++i) {
                const int gi = global_row(c, r, i);
                for (int h = 0; h < c->heads_q; ++h) {
                    const size_t lo = ((size_t)b * L + i) * o_row + (size_t)h * c->dim_v;
                    const size_t go = ((size_t)b * S + gi) * o_row + (size_t)h * c->dim_v;
                    double ref_lse = 0;
                    if (with_reference) reference_row(c, q, k, v, S, b, gi, h, ref, &ref_lse);
                    for (int d = 0; d < c->dim_v; ++d) {
                        const double got = load(c, ho[r], lo + d), want = load(c, o, go + d);
                        const double diff = fabs(got - want);
                        if (!(diff <= worst)) worst = diff; /* NaN sticks */
                        if (with_reference && !(fabs(got - ref[d]) <= worst_ref)) worst_ref = fabs(got - ref[d]);
                    }
                    const double got_lse = hl[r][((size_t)b * c->heads_q + h) * L + i];
                    const double want_lse = lse[((size_t)b * c->heads_q + h) * S + gi];
                    if (!(fabs(got_lse - want_lse) <= worst)) worst = fabs(got_lse - want_lse);
                    if (with_reference && !(fabs(got_lse - ref_lse) <= worst_ref)) worst_ref = fabs(got_lse - ref_lse);
                }
            }
    CHECK(worst <= tol, "%s: ring vs single call: max error %g > %g", name, worst, tol);
    CHECK(worst_ref <= tol, "%s: ring vs double reference: max error %g > %g", name, worst_ref, tol);
    /* Again with no LSE asked for, on the dirty workspace: O bitwise the same (the forward and the
     * merge are deterministic, and nothing may depend on the workspace's old contents). */
    if (st == FLASHATTN_SUCCESS) {
        void *again = poisoned(ro_bytes);
        for (int r = 0; r < W; ++r) buffer_poison(ro[r], ro_bytes);
        st = flashattn_cp_plan_execute(cp, W, (const void *const *)rq, (const void *const *)rk,
                                       (const void *const *)rv, ro, NULL, cp_ws, cp_bytes, NULL);
        CHECK(st == FLASHATTN_SUCCESS, "%s: cp execute without LSE: %s", name, flashattn_cp_last_error());
        for (int r = 0; r < W && st == FLASHATTN_SUCCESS; ++r) {
            buffer_download(again, ro[r], ro_bytes);
            CHECK(memcmp(again, ho[r], ro_bytes) == 0, "%s: rank %d: O differs between two runs", name, r);
        }
        free(again);
    }
    printf("%-70s ring-vs-single %.2e%s\n", name, worst, with_reference ? "  (double reference checked)" : "");
    if (st == FLASHATTN_SUCCESS) {
        /* The forward's outputs again, with the LSE the backward needs. */
        st = flashattn_cp_plan_execute(cp, W, (const void *const *)rq, (const void *const *)rk,
                                       (const void *const *)rv, ro, rl, cp_ws, cp_bytes, NULL);
        CHECK(st == FLASHATTN_SUCCESS, "%s: cp execute: %s", name, flashattn_cp_last_error());
    }
    if (st == FLASHATTN_SUCCESS)
        run_backward(c, name, global, cp, q, k, v, o, lse, rq, rk, rv, ro, rl, with_reference);

    flashattn_cp_plan_destroy(cp);
    buffer_free(cp_ws);
    for (int r = 0; r < W; ++r) {
        buffer_free(rq[r]);
        buffer_free(rk[r]);
        buffer_free(rv[r]);
        buffer_free(ro[r]);
        buffer_free(rl[r]);
        free(ho[r]);
        free(hl[r]);
    }
out_plans:
    flashattn_plan_destroy(global);
    flashattn_plan_destroy(local);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
}

/* Every byte of a rank's outputs still the poison: nothing was written. */
static int untouched(void *const *outs, int n, size_t bytes) {
    for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < bytes; ++i)
            if (((const unsigned char *)outs[r])[i] != 0xff) return 0;
    return 1;
}

/* Shapes the grids above do not choose: `count` cases drawn from FLASHATTN_TEST_SEED (printed, so
 * a failure can be replayed), every dimension odd or even, W = 1..8, GQA groups of 1-3, both
 * layouts, scale and softcap on or off; each against the single call, and the double reference. */
static void run_random_cases(int count, int gpu) {
    const char *env = getenv("FLASHATTN_TEST_SEED");
    uint64_t state = env && env[0] ? strtoull(env, NULL, 0) : 0x5eed0c0ffeeull;
    printf("random cases: FLASHATTN_TEST_SEED=%llu\n", (unsigned long long)state);
    state |= 1;
#define DRAW(n) ((int)((state ^= state << 13, state ^= state >> 7, state ^= state << 17) % (uint64_t)(n)))
    const int dtypes[3] = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP16};
    for (int i = 0; i < count; ++i) {
        Case c;
        memset(&c, 0, sizeof c);
        c.world = 1 + DRAW(8);
        c.causal = DRAW(2);
        c.local_rows = c.causal ? 2 * (1 + DRAW(7)) : 1 + DRAW(12);
        c.batch = 1 + DRAW(2);
        c.heads_kv = 1 + DRAW(3);
        c.heads_q = c.heads_kv * (1 + DRAW(3));
        c.dim = gpu ? (DRAW(2) ? 128 : 64) : 8 * (1 + DRAW(8));
        c.dim_v = gpu || DRAW(2) ? c.dim : 8 * (1 + DRAW(8));
        c.dtype = gpu ? dtypes[1 + DRAW(2)] : dtypes[DRAW(3)];
        c.scale = DRAW(3) == 0 ? 0.05 + 0.01 * DRAW(20) : 0;
        c.softcap = DRAW(3) == 0 ? 1.0 + 0.25 * DRAW(16) : 0;
        c.deterministic = gpu && DRAW(2);
        run_case(&c, 1);
    }
#undef DRAW
}

/* ---- The execute contract of the ring backward: a fresh thread, two calls at once, a graph ---- */

/* One ring backward call's arguments (W ranks), so a thread or a capture can make it. Calls built
 * by backward_call_twin() share the plan and the inputs, each with its workspace and outputs. */
typedef struct {
    flashattn_cp_plan_t *cp;
    int world;
    void *t[9][8]; /* q k v o dout lse dq dk dv, per rank */
    size_t bytes[9];
    void *ws;
    size_t ws_bytes;
    void *stream;
    flashattn_status_t status;
} BackwardCall;

static flashattn_status_t call_backward(BackwardCall *b) {
    void *const *x[9];
    for (int i = 0; i < 9; ++i) x[i] = b->t[i];
    return b->status = flashattn_cp_plan_execute_backward(
               b->cp, b->world, (const void *const *)x[0], (const void *const *)x[1], (const void *const *)x[2],
               (const void *const *)x[3], (const void *const *)x[4], (const float *const *)x[5], x[6], x[7], x[8],
               b->ws, b->ws_bytes, b->stream);
}

static void *backward_thread(void *arg) {
    call_backward((BackwardCall *)arg);
    return NULL;
}

static size_t grads_bytes(const BackwardCall *b) {
    return (b->bytes[6] + b->bytes[7] + b->bytes[8]) * (size_t)b->world;
}

/* Every rank's dQ, dK, dV into `host` (one block); whether they equal `want` bitwise (NULL: yes). */
static int grads_equal(const BackwardCall *b, unsigned char *host, const unsigned char *want) {
    size_t at = 0;
    for (int i = 6; i < 9; ++i)
        for (int r = 0; r < b->world; ++r) {
            buffer_download(host + at, b->t[i][r], b->bytes[i]);
            at += b->bytes[i];
        }
    return want == NULL || memcmp(host, want, at) == 0;
}

static void poison_grads(BackwardCall *b) {
    for (int i = 6; i < 9; ++i)
        for (int r = 0; r < b->world; ++r) buffer_poison(b->t[i][r], b->bytes[i]);
#ifdef CP_TEST_GPU
    cudaDeviceSynchronize();
#endif
}

/* A finalized ring over `c` (deterministic where it matters), random inputs, the forward's O and
 * LSE, poisoned outputs; 0 when the set-up failed (reported). */
static int backward_call_new(const Case *c, flashattn_plan_t *local, BackwardCall *b) {
    const Sizes z = sizes_of(c, c->local_rows);
    const size_t bytes[9] = {z.q, z.k, z.v, z.o, z.o, z.lse, z.q, z.k, z.v};
    size_t fwd_bytes = 0;
    memset(b, 0, sizeof *b);
    memcpy(b->bytes, bytes, sizeof bytes);
    b->world = c->world;
    flashattn_cp_plan_create(&b->cp);
    flashattn_cp_plan_set_i64(b->cp, FLASHATTN_CP_I64_WORLD_SIZE, c->world);
    flashattn_cp_plan_set_i64(b->cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_LOOPBACK);
    if (!local || flashattn_cp_plan_finalize(b->cp, local) != FLASHATTN_SUCCESS ||
        flashattn_cp_plan_get_backward_workspace_size(b->cp, &b->ws_bytes) != FLASHATTN_SUCCESS ||
        flashattn_cp_plan_get_workspace_size(b->cp, &fwd_bytes) != FLASHATTN_SUCCESS) {
        CHECK(0, "execute contract: set-up: %s", flashattn_cp_last_error());
        return 0;
    }
    for (int i = 0; i < 9; ++i)
        for (int r = 0; r < c->world; ++r) {
            void *host = poisoned(bytes[i]);
            if (i < 5 && i != 3)
                for (size_t e = 0; e < bytes[i] / elt(c); ++e) store(c, host, e, uniform());
            b->t[i][r] = buffer_from(host, bytes[i]);
            free(host);
        }
    b->ws = buffer_new(fwd_bytes > b->ws_bytes ? fwd_bytes : b->ws_bytes);
    CHECK(flashattn_cp_plan_execute(b->cp, c->world, (const void *const *)b->t[0], (const void *const *)b->t[1],
                                    (const void *const *)b->t[2], b->t[3], (float *const *)b->t[5], b->ws, fwd_bytes,
                                    NULL) == FLASHATTN_SUCCESS,
          "execute contract: forward: %s", flashattn_cp_last_error());
    return 1;
}

/* The same plan and inputs, a workspace and outputs of its own. */
static void backward_call_twin(const BackwardCall *b, BackwardCall *twin) {
    *twin = *b;
    for (int i = 6; i < 9; ++i)
        for (int r = 0; r < b->world; ++r) twin->t[i][r] = buffer_new(b->bytes[i]);
    twin->ws = buffer_new(b->ws_bytes);
}

static void backward_call_free(BackwardCall *b, int twin) {
    for (int i = twin ? 6 : 0; i < 9; ++i)
        for (int r = 0; r < b->world; ++r) buffer_free(b->t[i][r]);
    buffer_free(b->ws);
    if (!twin) flashattn_cp_plan_destroy(b->cp);
}

#ifdef CP_TEST_GPU
static void *new_stream(void) {
    cudaStream_t stream = NULL;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    return stream;
}
static void sync_stream(void *stream) { cudaStreamSynchronize((cudaStream_t)stream); }
static void free_stream(void *stream) { cudaStreamDestroy((cudaStream_t)stream); }
#else
static void *new_stream(void) { return NULL; }
static void sync_stream(void *stream) { (void)stream; }
static void free_stream(void *stream) { (void)stream; }
#endif

/* Under CUDA-graph capture on a stream of its own: the graph's launch gives `want`. */
static void check_backward_in_graph(BackwardCall *b, unsigned char *got, const unsigned char *want) {
#ifdef CP_TEST_GPU
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    poison_grads(b);
    b->stream = new_stream();
    CHECK(cudaStreamBeginCapture((cudaStream_t)b->stream, cudaStreamCaptureModeGlobal) == cudaSuccess,
          "graph: begin capture");
    call_backward(b);
    const cudaError_t end = cudaStreamEndCapture((cudaStream_t)b->stream, &graph);
    CHECK(b->status == FLASHATTN_SUCCESS && end == cudaSuccess, "graph: captured call: %s / %s",
          flashattn_cp_last_error(), cudaGetErrorString(end));
    if (b->status == FLASHATTN_SUCCESS && end == cudaSuccess) {
        CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "graph: instantiate");
        CHECK(cudaGraphLaunch(exec, (cudaStream_t)b->stream) == cudaSuccess &&
                  cudaStreamSynchronize((cudaStream_t)b->stream) == cudaSuccess,
              "graph: launch: %s", cudaGetErrorString(cudaGetLastError()));
        CHECK(grads_equal(b, got, want), "graph: the graph's gradients differ from the plain call's");
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    free_stream(b->stream);
    b->stream = NULL;
#else
    (void)b;
    (void)got;
    (void)want;
#endif
}

/* The ring backward from a thread that never made a library (or CUDA) call, two calls of one plan
 * at once from two threads on two streams (loopback plans hold no state an execute changes), and
 * on the GPU a CUDA graph: each gives the plain call's gradients bitwise. */
static void test_backward_execute_contract(const Case *c) {
    flashattn_plan_t *local = core_plan(c, c->local_rows);
    BackwardCall b, twin;
    if (!backward_call_new(c, local, &b)) {
        flashattn_cp_plan_destroy(b.cp);
        flashattn_plan_destroy(local);
        return;
    }
    unsigned char *want = malloc(grads_bytes(&b)), *got = malloc(grads_bytes(&b));
    CHECK(call_backward(&b) == FLASHATTN_SUCCESS, "contract: plain call: %s", flashattn_cp_last_error());
    grads_equal(&b, want, NULL);

    poison_grads(&b);
    pthread_t threads[2];
    CHECK(pthread_create(&threads[0], NULL, backward_thread, &b) == 0, "contract: pthread_create");
    pthread_join(threads[0], NULL);
    CHECK(b.status == FLASHATTN_SUCCESS, "contract: a call from a new thread failed");
    CHECK(grads_equal(&b, got, want), "contract: a new thread's gradients differ from the plain call's");

    poison_grads(&b);
    backward_call_twin(&b, &twin);
    poison_grads(&twin);
    b.stream = new_stream();
    twin.stream = new_stream();
    for (int round = 0; round < 3; ++round) {
        CHECK(pthread_create(&threads[0], NULL, backward_thread, &b) == 0 &&
                  pthread_create(&threads[1], NULL, backward_thread, &twin) == 0,
              "contract: pthread_create");
        pthread_join(threads[0], NULL);
        pthread_join(threads[1], NULL);
        sync_stream(b.stream);
        sync_stream(twin.stream);
        CHECK(b.status == FLASHATTN_SUCCESS && twin.status == FLASHATTN_SUCCESS, "contract: concurrent calls failed");
        CHECK(grads_equal(&b, got, want) && grads_equal(&twin, got, want),
              "contract: round %d: concurrent calls' gradients differ from the plain call's", round);
    }
    free_stream(b.stream);
    free_stream(twin.stream);
    b.stream = NULL;
    check_backward_in_graph(&b, got, want);
    printf("ring backward from a new thread, two at once%s: checked\n",
#ifdef CP_TEST_GPU
           " on two streams, in a CUDA graph"
#else
           ""
#endif
    );
    backward_call_free(&twin, 1);
    backward_call_free(&b, 0);
    free(want);
    free(got);
    flashattn_plan_destroy(local);
}

#ifndef CP_TEST_GPU
/* The argument checks (host buffers: they are refused before anything is read). */
static void test_bad_arguments(void) {
    const Case c = {1, 2, 4, 2, 1, 16, 16, 1, FLASHATTN_DTYPE_FP32, 0, 0, 0};
    flashattn_plan_t *local = core_plan(&c, 4), *odd = NULL;
    Case odd_case = c;
    odd_case.local_rows = 3;
    odd = core_plan(&odd_case, 3);
    flashattn_cp_plan_t *cp = NULL;
    CHECK(flashattn_cp_plan_create(NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "create(NULL)");
    CHECK(flashattn_cp_plan_create(&cp) == FLASHATTN_SUCCESS, "create");
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "WORLD_SIZE"),
          "finalize without world size: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 0) == FLASHATTN_ERROR_INVALID_ARGUMENT, "world 0");
    CHECK(flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, FLASHATTN_MAX_MERGE_PARTIALS + 1) ==
              FLASHATTN_ERROR_INVALID_ARGUMENT,
          "world too large");
    CHECK(flashattn_cp_plan_set_i64(cp, (flashattn_cp_i64_param_t)99, 1) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "key"),
          "bad key");
    CHECK(flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, 7) == FLASHATTN_ERROR_INVALID_ARGUMENT, "bad transport");
    CHECK(flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_RANK, -1) == FLASHATTN_ERROR_INVALID_ARGUMENT, "rank -1");
    CHECK(flashattn_cp_plan_set_i64(NULL, FLASHATTN_CP_I64_RANK, 0) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL plan");
    CHECK(flashattn_cp_plan_set_nccl_comm(cp, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL comm");
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 2);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "TRANSPORT"),
          "finalize without transport: %s", flashattn_cp_last_error());
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_NCCL);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NCCL without comm");
    int not_a_comm = 0;
    CHECK(flashattn_cp_plan_set_nccl_comm(cp, &not_a_comm) == FLASHATTN_SUCCESS, "set comm");
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_NOT_SUPPORTED &&
              strstr(flashattn_cp_last_error(), "GPU"),
          "NCCL with a CPU plan: %s", flashattn_cp_last_error());
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_LOOPBACK);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_RANK, 1);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_INVALID_ARGUMENT, "loopback with rank 1");
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_RANK, 0);
    CHECK(flashattn_cp_plan_finalize(cp, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL local");
    CHECK(flashattn_cp_plan_finalize(cp, odd) == FLASHATTN_ERROR_INVALID_ARGUMENT && strstr(flashattn_cp_last_error(), "odd"),
          "odd causal L: %s", flashattn_cp_last_error());
    {
        flashattn_plan_t *windowed = NULL;
        flashattn_plan_create(&windowed);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_BATCH, 1);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_SEQLEN_Q, 4);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_SEQLEN_K, 4);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_HEADS_Q, 2);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_HEAD_DIM, 16);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_WINDOW_LEFT, 1);
        flashattn_plan_set_i64(windowed, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU);
        CHECK(flashattn_plan_finalize(windowed) == FLASHATTN_SUCCESS, "windowed core plan: %s", flashattn_last_error());
        CHECK(flashattn_cp_plan_finalize(cp, windowed) == FLASHATTN_ERROR_NOT_SUPPORTED &&
                  strstr(flashattn_cp_last_error(), "WINDOW_LEFT"),
              "windowed local plan: %s", flashattn_cp_last_error());
        flashattn_plan_destroy(windowed);
    }
    flashattn_plan_t *unfinalized = NULL;
    flashattn_plan_create(&unfinalized);
    CHECK(flashattn_cp_plan_finalize(cp, unfinalized) == FLASHATTN_ERROR_INVALID_STATE, "unfinalized local");
    flashattn_plan_destroy(unfinalized);
    size_t bytes = 0;
    CHECK(flashattn_cp_plan_get_workspace_size(cp, &bytes) == FLASHATTN_ERROR_INVALID_STATE, "workspace before finalize");
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_SUCCESS, "finalize: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_get_workspace_size(cp, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL bytes");
    CHECK(flashattn_cp_plan_get_workspace_size(cp, &bytes) == FLASHATTN_SUCCESS && bytes > 0, "workspace size");
    float buf[4][64];
    const void *in[2] = {buf[0], buf[1]};
    void *out[2] = {buf[2], buf[3]};
    void *ws = poisoned(bytes);
    CHECK(flashattn_cp_plan_execute(cp, 1, in, in, in, out, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "num_ranks"),
          "num_ranks 1 for loopback W=2");
    CHECK(flashattn_cp_plan_execute(cp, 2, NULL, in, in, out, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "q"),
          "NULL q");
    const void *holey[2] = {buf[0], NULL};
    CHECK(flashattn_cp_plan_execute(cp, 2, in, holey, in, out, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "k[1]"),
          "NULL k[1]: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_execute(cp, 2, in, in, in, out, NULL, ws, bytes - 1, NULL) ==
              FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
          "small workspace");
    CHECK(flashattn_cp_plan_execute(cp, 2, in, in, in, out, NULL, (char *)ws + 8, bytes, NULL) ==
              FLASHATTN_ERROR_INVALID_ARGUMENT,
          "misaligned workspace");
    void *inside[2] = {ws, buf[3]};
    CHECK(flashattn_cp_plan_execute(cp, 2, in, in, in, inside, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "o[0]: overlaps workspace"),
          "o inside the workspace: %s", flashattn_cp_last_error());
    const void *k_inside[2] = {buf[0], (char *)ws + bytes - 8}; /* its last bytes */
    CHECK(flashattn_cp_plan_execute(cp, 2, in, k_inside, in, out, NULL, ws, bytes, NULL) ==
                  FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "k[1]: overlaps workspace"),
          "k inside the workspace: %s", flashattn_cp_last_error());
    float *lse_inside[2] = {NULL, (float *)ws};
    CHECK(flashattn_cp_plan_execute(cp, 2, in, in, in, out, lse_inside, ws, bytes, NULL) ==
                  FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "lse[1]: overlaps workspace"),
          "lse inside the workspace: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_execute(NULL, 2, in, in, in, out, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT,
          "NULL plan");
    /* Setting a parameter unfinalizes. */
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 3);
    CHECK(flashattn_cp_plan_execute(cp, 3, in, in, in, out, NULL, ws, bytes, NULL) == FLASHATTN_ERROR_INVALID_STATE,
          "execute after a setter");
    free(ws);
    flashattn_cp_plan_destroy(cp);
    flashattn_cp_plan_destroy(NULL);
    flashattn_plan_destroy(local);
    flashattn_plan_destroy(odd);
}

/* The backward's argument checks: each refused with its status and the argument's name, no
 * output written. */
static void test_backward_arguments(void) {
    const Case c = {1, 2, 4, 2, 1, 16, 16, 1, FLASHATTN_DTYPE_FP32, 0, 0, 0};
    const size_t q_bytes = 4 * 2 * 16 * 4, kv_bytes = 4 * 1 * 16 * 4, lse_bytes = 2 * 4 * 4;
    flashattn_plan_t *local = core_plan(&c, 4);
    flashattn_cp_plan_t *cp = NULL;
    flashattn_cp_plan_create(&cp);
    size_t bytes = 0;
    CHECK(flashattn_cp_plan_get_backward_workspace_size(NULL, &bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL plan");
    CHECK(flashattn_cp_plan_get_backward_workspace_size(cp, &bytes) == FLASHATTN_ERROR_INVALID_STATE,
          "backward workspace before finalize");
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 2);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_LOOPBACK);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_SUCCESS, "finalize: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_get_backward_workspace_size(cp, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "bytes"),
          "NULL bytes");
    CHECK(flashattn_cp_plan_get_backward_workspace_size(cp, &bytes) == FLASHATTN_SUCCESS && bytes > 0,
          "backward workspace: %s", flashattn_cp_last_error());
    void *t[9][2]; /* q k v o dout lse dq dk dv, two ranks, each its own allocation */
    const size_t sizes[9] = {q_bytes, kv_bytes, kv_bytes, q_bytes, q_bytes, lse_bytes, q_bytes, kv_bytes, kv_bytes};
    for (int i = 0; i < 9; ++i)
        for (int r = 0; r < 2; ++r) {
            t[i][r] = poisoned(sizes[i]);
            if (i < 6) memset(t[i][r], 0, sizes[i]); /* inputs: zeros are finite */
        }
    void *ws = poisoned(bytes);
    const void *in[6][2];
    for (int i = 0; i < 6; ++i)
        for (int r = 0; r < 2; ++r) in[i][r] = t[i][r];
    void *dq[2] = {t[6][0], t[6][1]}, *dk[2] = {t[7][0], t[7][1]}, *dv[2] = {t[8][0], t[8][1]};
    const float *lse[2] = {(const float *)t[5][0], (const float *)t[5][1]};
#define BACKWARD(n, q_, dout_, lse_, dq_, dk_, ws_, bytes_) \
    flashattn_cp_plan_execute_backward(cp, n, q_, in[1], in[2], in[3], dout_, lse_, dq_, dk_, dv, ws_, bytes_, NULL)
    CHECK(BACKWARD(1, in[0], in[4], lse, dq, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "num_ranks"),
          "num_ranks 1: %s", flashattn_cp_last_error());
    CHECK(BACKWARD(2, in[0], NULL, lse, dq, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "dout"),
          "NULL dout: %s", flashattn_cp_last_error());
    const float *holey_lse[2] = {lse[0], NULL};
    CHECK(BACKWARD(2, in[0], in[4], holey_lse, dq, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "lse[1]"),
          "NULL lse[1]: %s", flashattn_cp_last_error());
    void *dq_on_q[2] = {t[0][0], dq[1]};
    CHECK(BACKWARD(2, in[0], in[4], lse, dq_on_q, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "dq[0]: overlaps q[0]"),
          "dq[0] on q[0]: %s", flashattn_cp_last_error());
    void *dk_in_dq[2] = {dk[0], (char *)dq[0] + 64}; /* rank 1's dK inside rank 0's dQ */
    CHECK(BACKWARD(2, in[0], in[4], lse, dq, dk_in_dq, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "overlaps"),
          "dk[1] inside dq[0]: %s", flashattn_cp_last_error());
    void *dq_in_ws[2] = {dq[0], (char *)ws + 256};
    CHECK(BACKWARD(2, in[0], in[4], lse, dq_in_ws, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "workspace"),
          "dq[1] inside the workspace: %s", flashattn_cp_last_error());
    const void *q_in_ws[2] = {in[0][0], (char *)ws + 512}; /* the ring writes its workspace all along */
    CHECK(BACKWARD(2, q_in_ws, in[4], lse, dq, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "q[1]: overlaps workspace"),
          "q[1] inside the workspace: %s", flashattn_cp_last_error());
    CHECK(BACKWARD(2, in[0], in[4], lse, dq, dk, ws, bytes - 1) == FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
          "small workspace");
    CHECK(BACKWARD(2, in[0], in[4], lse, dq, dk, (char *)ws + 8, bytes) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              strstr(flashattn_cp_last_error(), "aligned"),
          "misaligned workspace: %s", flashattn_cp_last_error());
    CHECK(untouched(dq, 2, q_bytes) && untouched(dk, 2, kv_bytes) && untouched(dv, 2, kv_bytes),
          "an output was written by a refused call");
    CHECK(BACKWARD(2, in[0], in[4], lse, dq, dk, ws, bytes) == FLASHATTN_SUCCESS, "valid call: %s",
          flashattn_cp_last_error());
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 2); /* a setter unfinalizes */
    CHECK(BACKWARD(2, in[0], in[4], lse, dq, dk, ws, bytes) == FLASHATTN_ERROR_INVALID_STATE, "after a setter");
#undef BACKWARD
    /* A local plan whose gradients are strided: the forward ring runs, the backward says why not. */
    flashattn_plan_t *strided = NULL;
    flashattn_plan_create(&strided);
    const int64_t keys[][2] = {{FLASHATTN_I64_BATCH, 1},         {FLASHATTN_I64_SEQLEN_Q, 4},
                               {FLASHATTN_I64_SEQLEN_K, 4},      {FLASHATTN_I64_HEADS_Q, 2},
                               {FLASHATTN_I64_HEAD_DIM, 16},     {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32},
                               {FLASHATTN_I64_CAUSAL, 1},        {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_CPU},
                               {FLASHATTN_I64_DQ_ROW_STRIDE, 64}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; ++i)
        flashattn_plan_set_i64(strided, (flashattn_i64_param_t)keys[i][0], keys[i][1]);
    CHECK(flashattn_plan_finalize(strided) == FLASHATTN_SUCCESS, "strided core plan: %s", flashattn_last_error());
    CHECK(flashattn_cp_plan_finalize(cp, strided) == FLASHATTN_SUCCESS, "finalize with strided dQ: %s",
          flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_get_backward_workspace_size(cp, &bytes) == FLASHATTN_ERROR_NOT_SUPPORTED &&
              strstr(flashattn_cp_last_error(), "dQ"),
          "strided dQ: %s", flashattn_cp_last_error());
    CHECK(flashattn_cp_plan_execute_backward(cp, 2, in[0], in[1], in[2], in[3], in[4], lse, dq, dk, dv, ws, bytes,
                                             NULL) == FLASHATTN_ERROR_NOT_SUPPORTED,
          "execute with strided dQ");
    CHECK(flashattn_cp_plan_get_workspace_size(cp, &bytes) == FLASHATTN_SUCCESS, "the forward keeps running");
    flashattn_plan_destroy(strided);
    for (int i = 0; i < 9; ++i)
        for (int r = 0; r < 2; ++r) free(t[i][r]);
    free(ws);
    flashattn_cp_plan_destroy(cp);
    flashattn_plan_destroy(local);
}

#endif

#ifdef CP_TEST_GPU
/* The ring writes dQ, dK, dV itself (not through the core, which checks what it is handed): a host
 * pointer for a GPU plan's output is refused by name, nothing written. */
static void test_backward_host_output(void) {
    const Case c = {1, 2, 8, 2, 2, 64, 64, 1, FLASHATTN_DTYPE_FP16, 0, 0, 0};
    const size_t bytes = 8 * 2 * 64 * 2, lse_bytes = 2 * 8 * 4;
    flashattn_plan_t *local = core_plan(&c, 8);
    flashattn_cp_plan_t *cp = NULL;
    flashattn_cp_plan_create(&cp);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 2);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_LOOPBACK);
    CHECK(local && flashattn_cp_plan_finalize(cp, local) == FLASHATTN_SUCCESS, "finalize: %s", flashattn_cp_last_error());
    size_t ws_bytes = 0;
    if (flashattn_cp_plan_get_backward_workspace_size(cp, &ws_bytes) == FLASHATTN_SUCCESS) {
        void *t[8][2], *ws = buffer_new(ws_bytes), *host = poisoned(bytes);
        for (int i = 0; i < 8; ++i)
            for (int r = 0; r < 2; ++r) t[i][r] = buffer_new(i == 5 ? lse_bytes : bytes);
        const void *in[6][2];
        for (int i = 0; i < 6; ++i)
            for (int r = 0; r < 2; ++r) in[i][r] = t[i][r];
        const float *lse[2] = {(const float *)t[5][0], (const float *)t[5][1]};
        void *dq[2] = {t[6][0], host}, *dkv[2] = {t[7][0], t[7][1]};
        void *dv[2] = {t[0][0], t[0][1]}; /* never reached: dq[1] is refused first */
        CHECK(flashattn_cp_plan_execute_backward(cp, 2, in[0], in[1], in[2], in[3], in[4], lse, dq, dkv, dv, ws,
                                                 ws_bytes, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
                  strstr(flashattn_cp_last_error(), "dq[1]") && strstr(flashattn_cp_last_error(), "device memory"),
              "host dq[1]: %s", flashattn_cp_last_error());
        CHECK(untouched(&host, 1, bytes), "the host output was written");
        for (int i = 0; i < 8; ++i)
            for (int r = 0; r < 2; ++r) buffer_free(t[i][r]);
        buffer_free(ws);
        free(host);
    }
    flashattn_cp_plan_destroy(cp);
    flashattn_plan_destroy(local);
}

/* GPU backends: fp16 and bf16, head dims in multiples of 8. */
static void run_cases(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
    test_backward_host_output();
    const Case contract = {1, 3, 64, 4, 2, 64, 64, 1, FLASHATTN_DTYPE_FP16, 0, 0, 1};
    test_backward_execute_contract(&contract);
    for (int causal = 0; causal <= 1; ++causal) {
        const Case tiny = {2, 3, 6, 4, 2, 64, 64, causal, FLASHATTN_DTYPE_FP16, 0, 0, 0};
        run_case(&tiny, 1);
        const Case capped = {1, 4, 8, 2, 1, 128, 128, causal, FLASHATTN_DTYPE_BF16, 0.07, 1.5, 1};
        run_case(&capped, 1);
    }
    /* W = 1..8, both layouts, GQA, odd chunk sizes, bf16 hdim 128 and fp16 hdim 64 in turn. */
    for (int W = 1; W <= 8; ++W)
        for (int causal = 0; causal <= 1; ++causal) {
            const int L = causal ? 2 * (W % 3 + 1) + 4 * (W % 2) + 2 : 3 + 2 * (W % 3);
            const int dim = W % 2 ? 128 : 64;
            const Case c = {1 + W % 2, W, L, 6, W % 2 ? 3 : 2, dim, dim, causal,
                            W % 2 ? FLASHATTN_DTYPE_BF16 : FLASHATTN_DTYPE_FP16, 0, 0, W % 4 == 1};
            run_case(&c, W <= 3);
        }
    /* Chunks of several kernel tiles (odd c: tile edges inside a chunk), a small V head dim, MQA. */
    const Case big_causal = {1, 4, 2 * 197, 8, 2, 128, 128, 1, FLASHATTN_DTYPE_BF16, 0, 0, 1};
    const Case big_plain = {2, 3, 261, 4, 4, 64, 64, 0, FLASHATTN_DTYPE_FP16, 0, 0, 0};
    const Case mqa = {1, 5, 130, 8, 1, 128, 64, 1, FLASHATTN_DTYPE_BF16, 0, 0, 0};
    run_case(&big_causal, 0);
    run_case(&big_plain, 0);
    run_case(&mqa, 1);
    /* FLASHATTN_TEST_REDUCED=1 (compute-sanitizer runs, tests/gpu/cp-one-gpu.sh): a few random shapes. */
    const char *reduced = getenv("FLASHATTN_TEST_REDUCED");
    run_random_cases(reduced != NULL && reduced[0] == '1' ? 4 : 24, 1);
}
#else
static void run_cases(void) {
    /* A tiny case against the double reference, both layouts. */
    for (int causal = 0; causal <= 1; ++causal) {
        const Case tiny = {2, 3, 6, 4, 2, 16, 8, causal, FLASHATTN_DTYPE_FP32, 0, 0, 0};
        run_case(&tiny, 1);
        /* The scale and the softcap travel from the local plan to the ring's plans. */
        const Case capped = {1, 4, 4, 2, 1, 16, 16, causal, FLASHATTN_DTYPE_FP32, 0.7, 1.5, 0};
        run_case(&capped, 1);
    }
    /* W = 1..8, both layouts, GQA, odd chunk sizes (c = L/2 odd when causal), fp32. */
    for (int W = 1; W <= 8; ++W)
        for (int causal = 0; causal <= 1; ++causal) {
            const int L = causal ? 2 * (W % 3 + 1) + 4 * (W % 2) + 2 : 3 + 2 * (W % 3); /* 5..7 rows, chunks 1..7 */
            const Case c = {1 + W % 2, W, L, 6, W % 2 ? 3 : 2, 24, 16, causal, FLASHATTN_DTYPE_FP32, 0, 0, 0};
            run_case(&c, W <= 3);
        }
    /* bf16, MHA and multi-query. */
    const Case bf16_causal = {2, 4, 10, 4, 4, 32, 32, 1, FLASHATTN_DTYPE_BF16, 0, 0, 0};
    const Case bf16_mqa = {1, 5, 7, 4, 1, 64, 64, 0, FLASHATTN_DTYPE_BF16, 0, 0, 0};
    const Case fp16_causal = {1, 6, 6, 8, 2, 40, 24, 1, FLASHATTN_DTYPE_FP16, 0, 0, 0};
    const Case fp16_plain = {2, 2, 9, 2, 2, 128, 128, 0, FLASHATTN_DTYPE_FP16, 0, 0, 0};
    run_case(&bf16_causal, 0);
    run_case(&bf16_mqa, 0);
    run_case(&fp16_causal, 1);
    run_case(&fp16_plain, 0);
    run_random_cases(60, 0);
    const Case contract = {1, 3, 8, 4, 2, 16, 16, 1, FLASHATTN_DTYPE_BF16, 0, 0, 0};
    test_backward_execute_contract(&contract);
    test_bad_arguments();
    test_backward_arguments();
}
#endif

int main(void) {
    run_cases();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("all cp ring tests passed\n");
    return 0;
}
