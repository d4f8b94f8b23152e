/* Special values and extreme settings on one backend (issue 21's defects 1-6), checked against a
 * double-precision reference written here:
 *   - NaN propagates: a NaN in a query row makes that row's O and LSE NaN; a NaN in a key makes
 *     every row that sees the key NaN (whichever lane of a key block it sits in), and only those
 *     on the CPU; a NaN in a value reaches the rows that see it; a row that sees no key stays
 *     O = 0, LSE = -inf whatever the other rows meet; the split-KV (decode) path too.
 *   - windows of INT64_MAX are "no window" (bitwise the unwindowed result);
 *   - a variable-length plan declaring seqlen_q 10^10 (or INT64_MAX on the CPU) for a few real rows
 *     runs them, quickly, and correctly;
 *   - a tiny softcap (1e-30) gives uniform attention;
 *   - execute from a thread that never used CUDA (FA3 failed there) gives the main thread's bits;
 *   - CPU only: fp32/bf16 inputs of magnitude 1e20 give the finite exact result; forward and
 *     backward results are bitwise identical for 1, 2, 7, 16 and 33 threads (FLASHATTN_CPU_THREADS);
 *     a NaN in Q, K or dO reaches exactly the gradients of the pairs it takes part in;
 *   - the merge of partial states: a NaN partial LSE makes the row NaN, a -inf partial adds
 *     nothing whatever its O holds, a NaN in a contributing partial's O reaches its column;
 *   - the backward (CPU and fa2): only an LSE of -inf marks a row that takes no part (its dQ 0,
 *     nothing of it in dK/dV even with a NaN in its O or dO), a NaN LSE or row_dot (from O)
 *     reaches exactly the gradients of the row's pairs, a NaN in Q reaches its row's pairs.
 * Built once per backend (TEST_BACKEND); the GPU builds exit 77 (skipped) without a device. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_runner.h"

#define IS_CPU (TEST_BACKEND == FLASHATTN_BACKEND_CPU)

/* One problem, fixed length unless varlen (then one sequence of `rows` queries and keys, packed). */
typedef struct sv_problem {
    int64_t b, sq, sk, hq, hkv, d;
    flashattn_dtype_t dtype;
    int causal;
    int64_t wl, wr;       /* -1: none */
    double softcap;       /* 0: off */
    int varlen;           /* then b = 1 real sequence of sq x sk rows */
    int64_t declared_sq;  /* varlen: FLASHATTN_I64_SEQLEN_Q as set (the real rows are sq) */
} sv_problem;

/* 1: make_plan sets FLASHATTN_I64_DETERMINISTIC (the backward reproducible bit for bit). */
static int g_deterministic = 0;

/* Inputs and outputs as logical float arrays [b][s][h][d] (values exactly representable in the
 * dtype); LSE [b][hq][sq]. */
typedef struct sv_data {
    float *q, *k, *v, *o, *lse;
} sv_data;

static size_t nq(const sv_problem *p) { return (size_t)(p->b * p->sq * p->hq * p->d); }
static size_t nk(const sv_problem *p) { return (size_t)(p->b * p->sk * p->hkv * p->d); }
static size_t nl(const sv_problem *p) { return (size_t)(p->b * p->hq * p->sq); }

static void data_alloc(const sv_problem *p, sv_data *x) {
    x->q = calloc(nq(p), sizeof(float));
    x->k = calloc(nk(p), sizeof(float));
    x->v = calloc(nk(p), sizeof(float));
    x->o = calloc(nq(p), sizeof(float));
    x->lse = calloc(nl(p), sizeof(float));
    assert_true(x->q && x->k && x->v && x->o && x->lse);
}

static void data_free(sv_data *x) {
    free(x->q), free(x->k), free(x->v), free(x->o), free(x->lse);
}

static void fill_random(const sv_problem *p, sv_data *x, uint64_t seed, double magnitude) {
    test_rng rng;
    test_rng_seed(&rng, seed);
    float *arrays[3] = {x->q, x->k, x->v};
    size_t sizes[3] = {nq(p), nk(p), nk(p)};
    for (int a = 0; a < 3; ++a)
        for (size_t i = 0; i < sizes[a]; ++i)
            arrays[a][i] = (float)test_round(p->dtype, magnitude * test_rng_uniform(&rng, -1.0, 1.0));
}

static size_t at(int64_t b, int64_t s, int64_t h, int64_t c, int64_t seq, int64_t heads, int64_t d) {
    return (size_t)(((b * seq + s) * heads + h) * d + c);
}

/* The reference: the documented mask rule, NaN rules and softmax in double. */
static void reference(const sv_problem *p, const sv_data *x, double *o, double *lse) {
    const double scale = 1.0 / sqrt((double)p->d);
    /* A window of at least sq + sk keys masks nothing (the documented rule; no overflow here). */
    const int64_t wl = p->wl >= p->sq + p->sk ? -1 : p->wl, wr = p->wr >= p->sq + p->sk ? -1 : p->wr;
    for (int64_t b = 0; b < p->b; ++b)
        for (int64_t h = 0; h < p->hq; ++h)
            for (int64_t i = 0; i < p->sq; ++i) {
                const int64_t kh = h / (p->hq / p->hkv), diag = i + p->sk - p->sq;
                double m = -INFINITY, l = 0.0;
                int seen = 0, nan = 0;
                double *orow = o + at(b, i, h, 0, p->sq, p->hq, p->d);
                for (int64_t c = 0; c < p->d; ++c) orow[c] = 0.0;
                for (int pass = 0; pass < 2; ++pass)
                    for (int64_t j = 0; j < p->sk; ++j) {
                        if ((p->causal && j > diag) || (wr >= 0 && j > diag + wr) || (wl >= 0 && j < diag - wl))
                            continue;
                        double s = 0.0;
                        for (int64_t c = 0; c < p->d; ++c)
                            s += (double)x->q[at(b, i, h, c, p->sq, p->hq, p->d)] * x->k[at(b, j, kh, c, p->sk, p->hkv, p->d)];
                        s *= scale;
                        if (p->softcap > 0.0) s = p->softcap * tanh(s / p->softcap);
                        if (pass == 0) {
                            seen = 1;
                            nan = nan || isnan(s);
                            if (s > m) m = s;
                        } else if (!nan) {
                            const double e = exp(s - m);
                            l += e;
                            for (int64_t c = 0; c < p->d; ++c) orow[c] += e * x->v[at(b, j, kh, c, p->sk, p->hkv, p->d)];
                        }
                    }
                double *lrow = lse + (b * p->hq + h) * p->sq + i;
                if (!seen) {
                    *lrow = -INFINITY;
                } else if (nan) {
                    for (int64_t c = 0; c < p->d; ++c) orow[c] = NAN;
                    *lrow = NAN;
                } else {
                    for (int64_t c = 0; c < p->d; ++c) orow[c] /= l;
                    *lrow = m + log(l);
                }
            }
}

static flashattn_plan_t *make_plan(const sv_problem *p) {
    flashattn_plan_t *plan = NULL;
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    const test_key_value keys[] = {
        {FLASHATTN_I64_BATCH, p->b},        {FLASHATTN_I64_SEQLEN_Q, p->varlen ? p->declared_sq : p->sq},
        {FLASHATTN_I64_SEQLEN_K, p->sk},    {FLASHATTN_I64_HEADS_Q, p->hq},
        {FLASHATTN_I64_HEADS_KV, p->hkv},   {FLASHATTN_I64_HEAD_DIM, p->d},
        {FLASHATTN_I64_DTYPE, p->dtype},    {FLASHATTN_I64_CAUSAL, p->causal},
        {FLASHATTN_I64_WINDOW_LEFT, p->wl}, {FLASHATTN_I64_WINDOW_RIGHT, p->wr},
        {FLASHATTN_I64_BACKEND, TEST_BACKEND}, {FLASHATTN_I64_VARLEN, p->varlen},
        {FLASHATTN_I64_TOTAL_Q, p->sq},     {FLASHATTN_I64_TOTAL_K, p->sk},
    };
    set_keys_or_fail(plan, keys, sizeof keys / sizeof keys[0] - (p->varlen ? 0 : 2));
    if (g_deterministic)
        assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_DETERMINISTIC, 1), FLASHATTN_SUCCESS);
    if (p->softcap > 0.0)
        assert_int_equal(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, p->softcap), FLASHATTN_SUCCESS);
    if (flashattn_plan_finalize(plan) != FLASHATTN_SUCCESS) fail_msg("finalize: %s", flashattn_last_error());
    return plan;
}

/* One execute's buffers in the plan's memory (device memory for GPU backends). */
typedef struct sv_run {
    const flashattn_plan_t *plan;
    const sv_problem *p;
    test_mem q, k, v, o, lse, ws, cu_q, cu_k;
    flashattn_status_t status;
} sv_run;

static void run_prepare(sv_run *r, const flashattn_plan_t *plan, const sv_problem *p, const sv_data *x) {
    const int dev = test_on_device(TEST_BACKEND);
    const size_t es = test_dtype_size(p->dtype);
    size_t ws = 0;
    memset(r, 0, sizeof *r);
    r->plan = plan;
    r->p = p;
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    assert_int_equal(test_mem_alloc(&r->q, nq(p) * es, dev), 0);
    assert_int_equal(test_mem_alloc(&r->k, nk(p) * es, dev), 0);
    assert_int_equal(test_mem_alloc(&r->v, nk(p) * es, dev), 0);
    assert_int_equal(test_mem_alloc(&r->o, nq(p) * es, dev), 0);
    assert_int_equal(test_mem_alloc(&r->lse, nl(p) * 4, dev), 0);
    assert_int_equal(test_mem_alloc(&r->ws, ws + 1, dev), 0);
    assert_int_equal(test_mem_alloc(&r->cu_q, 8, dev), 0);
    assert_int_equal(test_mem_alloc(&r->cu_k, 8, dev), 0);
    for (size_t i = 0; i < nq(p); ++i) test_store(p->dtype, (char *)r->q.host + i * es, x->q[i]);
    for (size_t i = 0; i < nk(p); ++i) test_store(p->dtype, (char *)r->k.host + i * es, x->k[i]);
    for (size_t i = 0; i < nk(p); ++i) test_store(p->dtype, (char *)r->v.host + i * es, x->v[i]);
    test_poison(p->dtype, r->o.host, r->o.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, r->lse.host, r->lse.bytes);
    const int32_t cq[2] = {0, (int32_t)p->sq}, ck[2] = {0, (int32_t)p->sk};
    memcpy(r->cu_q.host, cq, 8);
    memcpy(r->cu_k.host, ck, 8);
    const test_mem *all[] = {&r->q, &r->k, &r->v, &r->o, &r->lse, &r->cu_q, &r->cu_k};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) assert_int_equal(test_mem_upload(all[i]), 0);
}

static void run_execute(sv_run *r) {
    size_t ws = 0;
    flashattn_plan_get_workspace_size(r->plan, &ws);
    void *w = ws ? test_mem_ptr(&r->ws) : NULL;
    if (r->p->varlen)
        r->status = flashattn_plan_execute_varlen(r->plan, test_mem_ptr(&r->q), test_mem_ptr(&r->k), test_mem_ptr(&r->v),
                                                  test_mem_ptr(&r->o), test_mem_ptr(&r->lse), test_mem_ptr(&r->cu_q),
                                                  test_mem_ptr(&r->cu_k), w, ws, NULL);
    else
        r->status = flashattn_plan_execute(r->plan, test_mem_ptr(&r->q), test_mem_ptr(&r->k), test_mem_ptr(&r->v),
                                           test_mem_ptr(&r->o), test_mem_ptr(&r->lse), w, ws, NULL);
}

/* Download O and LSE into x (as floats) and free the buffers. */
static void run_finish(sv_run *r, sv_data *x) {
    const sv_problem *p = r->p;
    const size_t es = test_dtype_size(p->dtype);
    if (r->status != FLASHATTN_SUCCESS) fail_msg("execute: %s", flashattn_last_error());
    const char *err = test_device_error();
    if (err) fail_msg("device error: %s", err);
    assert_int_equal(test_mem_download(&r->o), 0);
    assert_int_equal(test_mem_download(&r->lse), 0);
    for (size_t i = 0; i < nq(p); ++i) x->o[i] = (float)test_load(p->dtype, (char *)r->o.host + i * es);
    memcpy(x->lse, r->lse.host, nl(p) * 4);
    test_mem *all[] = {&r->q, &r->k, &r->v, &r->o, &r->lse, &r->ws, &r->cu_q, &r->cu_k};
    for (size_t i = 0; i < sizeof all / sizeof *all; ++i) test_mem_free(all[i]);
}

static void run_plan(const flashattn_plan_t *plan, const sv_problem *p, sv_data *x) {
    sv_run r;
    run_prepare(&r, plan, p, x);
    run_execute(&r);
    run_finish(&r, x);
}

static double tolerance(flashattn_dtype_t dt) { return dt == FLASHATTN_DTYPE_FP32 ? 2e-5 : dt == FLASHATTN_DTYPE_BF16 ? 3e-2 : 4e-3; }

/* Every row (b, i, h) of O and its LSE against the reference: NaN wherever the reference is NaN;
 * exactly 0 / -inf where the row sees no key; else within tolerance. With `nan_may_leak` (GPU
 * backends: a NaN in a column of V reaches that column of other rows of its tile through P = 0,
 * as documented) an element the reference computes finite may be NaN; the LSE may not. */
static void check_rows(const sv_problem *p, const sv_data *x, int nan_may_leak) {
    double *o = malloc(nq(p) * sizeof(double)), *lse = malloc(nl(p) * sizeof(double));
    assert_true(o && lse);
    reference(p, x, o, lse);
    double max_ref = 0.0;
    for (size_t i = 0; i < nq(p); ++i) max_ref = isfinite(o[i]) && fabs(o[i]) > max_ref ? fabs(o[i]) : max_ref;
    const double tol = tolerance(p->dtype) * (max_ref > 1.0 ? max_ref : 1.0);
    for (int64_t b = 0; b < p->b; ++b)
        for (int64_t h = 0; h < p->hq; ++h)
            for (int64_t i = 0; i < p->sq; ++i) {
                const size_t r0 = at(b, i, h, 0, p->sq, p->hq, p->d), li = (size_t)((b * p->hq + h) * p->sq + i);
                const double rl = lse[li];
                const float gl = x->lse[li];
                if (isnan(rl)) {
                    for (int64_t c = 0; c < p->d; ++c)
                        if (!isnan(x->o[r0 + c])) fail_msg("row b%lld i%lld h%lld col %lld: %g, expected NaN", (long long)b, (long long)i, (long long)h, (long long)c, x->o[r0 + c]);
                    if (!isnan(gl)) fail_msg("LSE b%lld i%lld h%lld: %g, expected NaN", (long long)b, (long long)i, (long long)h, gl);
                } else if (rl == -INFINITY) {
                    for (int64_t c = 0; c < p->d; ++c)
                        if (x->o[r0 + c] != 0.0f) fail_msg("row b%lld i%lld h%lld sees no key: O = %g, expected 0", (long long)b, (long long)i, (long long)h, x->o[r0 + c]);
                    if (gl != -INFINITY) fail_msg("LSE b%lld i%lld h%lld: %g, expected -inf", (long long)b, (long long)i, (long long)h, gl);
                } else {
                    for (int64_t c = 0; c < p->d; ++c)
                        if (isnan(o[r0 + c]) ? !isnan(x->o[r0 + c])
                                             : !(fabs(x->o[r0 + c] - o[r0 + c]) <= tol || (nan_may_leak && isnan(x->o[r0 + c]))))
                            fail_msg("row b%lld i%lld h%lld col %lld: %.9g, reference %.9g (tolerance %g)", (long long)b, (long long)i, (long long)h, (long long)c, x->o[r0 + c], o[r0 + c], tol);
                    const double want = (double)(float)rl;  /* past the float range: +-inf */
                    if (!(fabs(gl - rl) <= 1e-3 * (1.0 + fabs(rl)) || gl == want))
                        fail_msg("LSE b%lld i%lld h%lld: %.9g, reference %.9g", (long long)b, (long long)i, (long long)h, gl, rl);
                }
            }
    free(o);
    free(lse);
}

static flashattn_dtype_t low_precision(void) { return IS_CPU ? FLASHATTN_DTYPE_FP32 : FLASHATTN_DTYPE_FP16; }

static void run_and_check(const sv_problem *p, sv_data *x, int nan_may_leak) {
    flashattn_plan_t *plan = make_plan(p);
    run_plan(plan, p, x);
    check_rows(p, x, nan_may_leak);
    flashattn_plan_destroy(plan);
}

/* ---- NaN ------------------------------------------------------------------------------------ */

static void nan_in_query_row(void **state) {
    (void)state;
    const sv_problem p = {2, 37, 45, 4, 2, 64, low_precision(), 0, -1, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 11, 1.0);
    x.q[at(1, 3, 1, 5, p.sq, p.hq, p.d)] = NAN;
    run_and_check(&p, &x, 0);
    data_free(&x);
}

/* Keys 0 (lane 0 of the first key block) and 17 NaN in kv head 0, causal: rows before 17 see only
 * the first. */
static void nan_in_keys(void **state) {
    (void)state;
    const sv_problem p = {1, 40, 40, 4, 2, 64, low_precision(), 1, -1, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 12, 1.0);
    x.k[at(0, 17, 0, 9, p.sk, p.hkv, p.d)] = NAN;
    run_and_check(&p, &x, 0);
    x.k[at(0, 0, 1, 0, p.sk, p.hkv, p.d)] = NAN;
    run_and_check(&p, &x, 0);
    data_free(&x);
}

/* A NaN in V of key 5 under a causal mask with seqlen_q > seqlen_k: the first 32 rows see no key
 * and must stay O = 0, LSE = -inf; rows seeing key 5 are NaN. */
static void nan_in_value_and_masked_rows(void **state) {
    (void)state;
    const sv_problem p = {1, 48, 16, 2, 1, 64, low_precision(), 1, -1, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 13, 1.0);
    x.v[at(0, 5, 0, 7, p.sk, p.hkv, p.d)] = NAN;
    run_and_check(&p, &x, !IS_CPU);
    data_free(&x);
}

/* Decode shape: GPU backends take their split-KV path (fa2), whose merge must keep the NaN. */
static void nan_in_decode(void **state) {
    (void)state;
    const sv_problem p = {2, 1, 4096, 8, 2, 128, low_precision(), 0, -1, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 14, 1.0);
    x.q[at(0, 0, 3, 100, p.sq, p.hq, p.d)] = NAN;
    x.k[at(1, 2900, 1, 0, p.sk, p.hkv, p.d)] = NAN;
    run_and_check(&p, &x, 0);
    data_free(&x);
}

/* ---- Windows, varlen maxima, softcap -------------------------------------------------------- */

static void compare_bitwise(const sv_problem *p, const sv_data *a, const sv_data *b, const char *what) {
    if (memcmp(a->o, b->o, nq(p) * sizeof(float)) != 0) fail_msg("%s: O differs", what);
    if (memcmp(a->lse, b->lse, nl(p) * sizeof(float)) != 0) fail_msg("%s: LSE differs", what);
}

static void huge_windows_are_no_window(void **state) {
    (void)state;
    const struct { int64_t sq, sk, wl, wr; } cases[] = {{4, 4, -1, INT64_MAX}, {9, 4, INT64_MAX, -1},
                                                       {9, 4, INT64_MAX, INT64_MAX}, {70, 130, 199, 200}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; ++c) {
        sv_problem p = {1, cases[c].sq, cases[c].sk, 2, 2, 64, low_precision(), 0, cases[c].wl, cases[c].wr, 0.0, 0, 0};
        sv_data x, y;
        data_alloc(&p, &x);
        data_alloc(&p, &y);
        fill_random(&p, &x, 20 + c, 1.0);
        fill_random(&p, &y, 20 + c, 1.0);
        flashattn_plan_t *plan = make_plan(&p);
        int64_t got = 0;
        assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_LEFT, &got), FLASHATTN_SUCCESS);
        assert_int_equal(got, p.wl >= p.sq + p.sk ? -1 : p.wl);
        run_plan(plan, &p, &x);
        flashattn_plan_destroy(plan);
        check_rows(&p, &x, 0);
        p.wl = p.wl >= p.sq + p.sk ? -1 : p.wl;  /* the equivalent plan */
        p.wr = p.wr >= p.sq + p.sk ? -1 : p.wr;
        run_and_check(&p, &y, 0);
        if (p.wl < 0 && p.wr < 0) compare_bitwise(&p, &x, &y, "huge window vs none");
        data_free(&x);
        data_free(&y);
    }
}

static void varlen_declared_maximum(void **state) {
    (void)state;
    const int64_t declared[] = {(int64_t)1e10, IS_CPU ? INT64_MAX : (int64_t)1e10};
    for (size_t c = 0; c < 2; ++c) {
        const sv_problem p = {1, 8, 8, 2, 1, 64, low_precision(), 1, -1, -1, 0.0, 1, declared[c]};
        sv_data x;
        data_alloc(&p, &x);
        fill_random(&p, &x, 30 + c, 1.0);
        const double t0 = test_now_seconds();
        run_and_check(&p, &x, 0);
        const double seconds = test_now_seconds() - t0;
        if (seconds > 2.0) fail_msg("8 rows under seqlen_q = %lld took %.1f s", (long long)declared[c], seconds);
        data_free(&x);
    }
}

static void tiny_softcap_is_uniform(void **state) {
    (void)state;
    const sv_problem p = {1, 19, 33, 2, 2, 64, low_precision(), 0, -1, -1, 1e-30, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 40, 1.0);
    run_and_check(&p, &x, 0);  /* the reference's scores are all ~1e-30: uniform weights */
    data_free(&x);
}

/* ---- A thread that never used CUDA ----------------------------------------------------------- */

static void *execute_on_thread(void *arg) {
    run_execute((sv_run *)arg);
    return NULL;
}

static void fresh_thread(void **state) {
    (void)state;
    const sv_problem p = {2, 130, 200, 4, 2, 128, low_precision(), 1, -1, -1, 0.0, 0, 0};
    sv_data x, y;
    data_alloc(&p, &x);
    data_alloc(&p, &y);
    fill_random(&p, &x, 50, 1.0);
    fill_random(&p, &y, 50, 1.0);
    flashattn_plan_t *plan = make_plan(&p);
    run_plan(plan, &p, &x);
    sv_run r;
    run_prepare(&r, plan, &p, &y);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, execute_on_thread, &r), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    run_finish(&r, &y);
    compare_bitwise(&p, &x, &y, "new thread vs main thread");
    check_rows(&p, &y, 0);
    flashattn_plan_destroy(plan);
    data_free(&x);
    data_free(&y);
}

/* ---- CPU only -------------------------------------------------------------------------------- */

/* Scores near 1e40 overflow float: the exact result is finite (one-hot on the largest score). */
static void huge_magnitudes(void **state) {
    (void)state;
    const flashattn_dtype_t dts[] = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16};
    for (size_t c = 0; c < 2; ++c) {
        const sv_problem p = {1, 20, 50, 2, 1, 64, dts[c], c == 1, -1, -1, 0.0, 0, 0};
        sv_data x;
        data_alloc(&p, &x);
        fill_random(&p, &x, 60 + c, 1e20);
        run_and_check(&p, &x, 0);
        data_free(&x);
    }
}

static void set_threads(int n) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", n);
    setenv("FLASHATTN_CPU_THREADS", buf, 1);
}

/* The case: fp16, sq 100, sk 2000, 16/2 heads, causal, window left 700, whose GQA packing
 * the thread count changes; forward and backward bitwise equal for every thread count. */
static void thread_count_invariance(void **state) {
    (void)state;
    const sv_problem p = {1, 100, 2000, 16, 2, 64, FLASHATTN_DTYPE_FP16, 1, 700, -1, 0.0, 0, 0};
    const int counts[] = {1, 2, 7, 16, 33};
    const size_t es = 2;
    sv_data x, first;
    data_alloc(&p, &x);
    data_alloc(&p, &first);
    fill_random(&p, &x, 70, 1.0);
    unsigned char *grads[5] = {NULL};
    for (size_t c = 0; c < 5; ++c) {
        set_threads(counts[c]);
        flashattn_plan_t *plan = make_plan(&p);
        sv_run r;
        run_prepare(&r, plan, &p, &x);
        run_execute(&r);
        /* The backward from this run's O and LSE: dO = V-shaped random, outputs compared. */
        size_t bws = 0;
        assert_int_equal(flashattn_plan_get_backward_workspace_size(plan, &bws), FLASHATTN_SUCCESS);
        unsigned char *dout = malloc(nq(&p) * es), *g = malloc((nq(&p) + 2 * nk(&p)) * es);
        void *ws = aligned_alloc(256, (bws + 256) / 256 * 256);
        assert_true(dout && g && ws);
        for (size_t i = 0; i < nq(&p); ++i) test_store(p.dtype, dout + i * es, x.q[(i * 7) % nq(&p)]);
        assert_int_equal(flashattn_plan_execute_backward(plan, r.q.host, r.k.host, r.v.host, r.o.host, dout, r.lse.host, g,
                                                         g + nq(&p) * es, g + (nq(&p) + nk(&p)) * es, ws, bws, NULL),
                         FLASHATTN_SUCCESS);
        grads[c] = g;
        free(dout);
        free(ws);
        sv_data y;
        data_alloc(&p, &y);
        run_finish(&r, &y);
        flashattn_plan_destroy(plan);
        if (c == 0) {
            memcpy(x.o, y.o, nq(&p) * sizeof(float));
            memcpy(x.lse, y.lse, nl(&p) * sizeof(float));
            check_rows(&p, &x, 0);
            memcpy(first.o, y.o, nq(&p) * sizeof(float));
            memcpy(first.lse, y.lse, nl(&p) * sizeof(float));
        } else {
            char what[64];
            snprintf(what, sizeof what, "%d threads vs 1", counts[c]);
            compare_bitwise(&p, &first, &y, what);
            if (memcmp(grads[0], grads[c], (nq(&p) + 2 * nk(&p)) * es) != 0) fail_msg("backward: %s differs", what);
        }
        data_free(&y);
    }
    unsetenv("FLASHATTN_CPU_THREADS");
    for (size_t c = 0; c < 5; ++c) free(grads[c]);
    data_free(&x);
    data_free(&first);
}

/* Forward and backward on the CPU with fp32 host buffers; dq, dk, dv receive the gradients. */
static void cpu_forward_backward(const flashattn_plan_t *plan, const sv_problem *p, const float *q, const float *k,
                                 const float *v, const float *dout, float *dq, float *dk, float *dv) {
    size_t ws = 0, bws = 0;
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_backward_workspace_size(plan, &bws), FLASHATTN_SUCCESS);
    const size_t wbytes = ((ws > bws ? ws : bws) + 256) / 256 * 256;
    void *w = aligned_alloc(256, wbytes);
    float *o = malloc(nq(p) * sizeof(float)), *lse = malloc(nl(p) * sizeof(float));
    assert_true(w && o && lse);
    assert_int_equal(flashattn_plan_execute(plan, q, k, v, o, lse, w, ws, NULL), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_execute_backward(plan, q, k, v, o, dout, lse, dq, dk, dv, w, bws, NULL),
                     FLASHATTN_SUCCESS);
    free(w), free(o), free(lse);
}

/* Row `row` of an [s][heads][d] gradient: all NaN when `nan`, else bitwise the clean run's. */
static void check_gradient_row(const float *got, const float *clean, size_t off, int64_t d, int nan, const char *what,
                               int64_t row, int64_t head) {
    for (int64_t c = 0; c < d; ++c) {
        const float x = got[off + (size_t)c];
        if (nan ? !isnan(x) : memcmp(&x, &clean[off + (size_t)c], sizeof x) != 0)
            fail_msg("%s row %lld head %lld col %lld: %g, expected %s", what, (long long)row, (long long)head,
                     (long long)c, x, nan ? "NaN" : "the NaN-free run's bits");
    }
}

/* The backward's NaN rule: a NaN in Q, K or dO reaches the gradients of exactly the pairs it takes
 * part in. Causal with a left window of 5 (row r sees keys r-5..r), sq = sk = 40, one K/V head for
 * two query heads: Q[20] of head 0, dO[10] of head 1 (column 0) and K[30] are NaN. Rows 30..35 see
 * key 30 (so their LSE is NaN); the keys the NaN rows see, [5, 10], [15, 20], [25, 35], get NaN dK
 * and dV (dV of keys 5..10 in column 0 only); every other gradient is bitwise the NaN-free run's. A whole-block product (0 * NaN) reached the rest. */
static void nan_in_backward(void **state) {
    (void)state;
    const sv_problem p = {1, 40, 40, 2, 1, 64, FLASHATTN_DTYPE_FP32, 1, 5, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 80, 1.0);
    float *dout = malloc(nq(&p) * sizeof(float));
    float *g0 = malloc((nq(&p) + 2 * nk(&p)) * sizeof(float)), *g1 = malloc((nq(&p) + 2 * nk(&p)) * sizeof(float));
    assert_true(dout && g0 && g1);
    for (size_t i = 0; i < nq(&p); ++i) dout[i] = x.q[(i * 7 + 3) % nq(&p)];
    flashattn_plan_t *plan = make_plan(&p);
    cpu_forward_backward(plan, &p, x.q, x.k, x.v, dout, g0, g0 + nq(&p), g0 + nq(&p) + nk(&p));
    x.q[at(0, 20, 0, 3, p.sq, p.hq, p.d)] = NAN;
    dout[at(0, 10, 1, 0, p.sq, p.hq, p.d)] = NAN;
    x.k[at(0, 30, 0, 60, p.sk, p.hkv, p.d)] = NAN;
    cpu_forward_backward(plan, &p, x.q, x.k, x.v, dout, g1, g1 + nq(&p), g1 + nq(&p) + nk(&p));
    for (int64_t r = 0; r < p.sq; ++r)
        for (int64_t h = 0; h < p.hq; ++h) {
            const int nan = (r == 20 && h == 0) || (r == 10 && h == 1) || (r >= 30 && r <= 35);
            check_gradient_row(g1, g0, at(0, r, h, 0, p.sq, p.hq, p.d), p.d, nan, "dQ", r, h);
        }
    for (int64_t j = 0; j < p.sk; ++j) {
        const int nan = (j >= 5 && j <= 10) || (j >= 15 && j <= 20) || (j >= 25 && j <= 35);
        const size_t off = at(0, j, 0, 0, p.sk, p.hkv, p.d);
        check_gradient_row(g1 + nq(&p), g0 + nq(&p), off, p.d, nan, "dK", j, 0);
        /* dV = P^T dO: dO[10]'s NaN sits in column 0, so keys 5..10 get it in that column only. */
        const int only_col0 = j >= 5 && j <= 10;
        const float *v1 = g1 + nq(&p) + nk(&p), *v0 = g0 + nq(&p) + nk(&p);
        check_gradient_row(v1, v0, off, only_col0 ? 1 : p.d, nan, "dV", j, 0);
        if (only_col0) check_gradient_row(v1, v0, off + 1, p.d - 1, 0, "dV (columns 1..)", j, 0);
    }
    flashattn_plan_destroy(plan);
    free(dout), free(g0), free(g1);
    data_free(&x);
}

/* ---- The backward's rule for LSE and row_dot (CPU and fa2) --------------------------------- */

/* The backward on TEST_BACKEND from host float arrays (in the plan's dtype's values); gradients
 * back as floats. Outputs are poisoned first. */
static void backend_backward(const flashattn_plan_t *plan, const sv_problem *p, const sv_data *x, const float *o,
                             const float *dout, const float *lse, float *dq, float *dk, float *dv) {
    const int dev = test_on_device(TEST_BACKEND);
    const size_t es = test_dtype_size(p->dtype);
    size_t ws = 0;
    assert_int_equal(flashattn_plan_get_backward_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    test_mem in[6], out[3], w;
    const float *src[6] = {x->q, x->k, x->v, o, dout, lse};
    const size_t n_in[6] = {nq(p), nk(p), nk(p), nq(p), nq(p), nl(p)};
    for (int i = 0; i < 6; ++i) {
        const int is_lse = i == 5;
        assert_int_equal(test_mem_alloc(&in[i], n_in[i] * (is_lse ? 4 : es), dev), 0);
        for (size_t j = 0; j < n_in[i]; ++j) {
            if (is_lse) ((float *)in[i].host)[j] = src[i][j];
            else test_store(p->dtype, (char *)in[i].host + j * es, src[i][j]);
        }
        assert_int_equal(test_mem_upload(&in[i]), 0);
    }
    float *dst[3] = {dq, dk, dv};
    const size_t n_out[3] = {nq(p), nk(p), nk(p)};
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(test_mem_alloc(&out[i], n_out[i] * es, dev), 0);
        test_poison(p->dtype, out[i].host, out[i].bytes);
        assert_int_equal(test_mem_upload(&out[i]), 0);
    }
    assert_int_equal(test_mem_alloc(&w, ws + 1, dev), 0);
    const flashattn_status_t st = flashattn_plan_execute_backward(
        plan, test_mem_ptr(&in[0]), test_mem_ptr(&in[1]), test_mem_ptr(&in[2]), test_mem_ptr(&in[3]),
        test_mem_ptr(&in[4]), test_mem_ptr(&in[5]), test_mem_ptr(&out[0]), test_mem_ptr(&out[1]),
        test_mem_ptr(&out[2]), ws ? test_mem_ptr(&w) : NULL, ws, NULL);
    if (st != FLASHATTN_SUCCESS) fail_msg("execute_backward: %s", flashattn_last_error());
    const char *err = test_device_error();
    if (err) fail_msg("device error: %s", err);
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(test_mem_download(&out[i]), 0);
        for (size_t j = 0; j < n_out[i]; ++j) dst[i][j] = (float)test_load(p->dtype, (char *)out[i].host + j * es);
        test_mem_free(&out[i]);
    }
    for (int i = 0; i < 6; ++i) test_mem_free(&in[i]);
    test_mem_free(&w);
}

/* What the rule says of one gradient row (all its columns). */
typedef enum grad_rule {
    SAME,    /* the bits of the NaN-free run */
    ALL_NAN, /* NaN in every column */
    ZERO,    /* exactly 0 (a row that takes no part) */
    NOT_NAN, /* not NaN (a row the rule keeps NaN away from, whose value changed) */
    ANY      /* GPU backends: may carry a NaN of a Q/K/dO row over a tile (documented) */
} grad_rule;

static void check_grad(const char *case_name, const char *what, const float *got, const float *clean, int64_t rows,
                       int64_t heads, int64_t d, grad_rule (*rule)(int64_t row, int64_t head)) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h) {
            const grad_rule g = rule(r, h);
            for (int64_t c = 0; c < d; ++c) {
                const size_t i = (size_t)((r * heads + h) * d + c);
                const float x = got[i];
                const int ok = g == SAME      ? memcmp(&x, &clean[i], sizeof x) == 0
                               : g == ALL_NAN ? isnan(x)
                               : g == ZERO    ? x == 0.0f
                               : g == NOT_NAN ? !isnan(x)
                                              : 1;
                if (!ok)
                    fail_msg("%s: %s row %lld head %lld col %lld = %g (clean run %g), expected %s", case_name, what,
                             (long long)r, (long long)h, (long long)c, x, clean[i],
                             g == SAME ? "the NaN-free run's bits" : g == ALL_NAN ? "NaN" : g == ZERO ? "0" : "no NaN");
            }
        }
}

/* sq 48, sk 40, causal bottom-right: row i sees keys 0..i-8, rows 0..7 none (LSE -inf). */
enum { BN_SQ = 48, BN_SK = 40, BN_OFF = BN_SK - BN_SQ };
static int bn_case;
static int64_t bn_row, bn_head;
static int sees(int64_t row, int64_t key) { return key <= row + BN_OFF; }

/* The cases (row bn_row of head bn_head is the special one):
 * 0 masked row, O NaN (row_dot NaN)   1 masked row, dO NaN       2 visible row, LSE NaN
 * 3 visible row, O NaN (row_dot NaN)  4 visible row, LSE -inf and O NaN   5 visible row, Q NaN */
static const char *const bn_names[] = {"row without keys, NaN in O", "row without keys, NaN in dO",
                                       "NaN LSE",  "NaN in O (row_dot)", "LSE -inf on a row with keys, NaN in O",
                                       "NaN in Q"};
static grad_rule bn_rule_dq(int64_t r, int64_t h) {
    if (r != bn_row || h != bn_head) return SAME; /* dQ = dS K: K holds no NaN here */
    return bn_case <= 1 || bn_case == 4 ? ZERO : ALL_NAN;
}
static grad_rule bn_rule_dkv(int64_t key, int dv) {
    switch (bn_case) {
    case 0: return SAME;
    case 1: return dv && !IS_CPU ? ANY : SAME; /* P = 0 times the NaN row of dO, in a tile product */
    case 2: return sees(bn_row, key) ? ALL_NAN : SAME;
    case 3: return dv ? SAME : sees(bn_row, key) ? ALL_NAN : SAME;
    case 4: return NOT_NAN; /* the row's contribution is gone: other values */
    default: return sees(bn_row, key) ? ALL_NAN : IS_CPU ? SAME : ANY;
    }
}
static grad_rule bn_rule_dk(int64_t key, int64_t h) { (void)h; return bn_rule_dkv(key, 0); }
static grad_rule bn_rule_dv(int64_t key, int64_t h) { (void)h; return bn_rule_dkv(key, 1); }

static void backward_lse_and_row_dot(void **state) {
    (void)state;
    const sv_problem p = {1, BN_SQ, BN_SK, 2, 1, 64, low_precision(), 1, -1, -1, 0.0, 0, 0};
    sv_data x;
    data_alloc(&p, &x);
    fill_random(&p, &x, 90, 1.0);
    g_deterministic = 1;
    flashattn_plan_t *plan = make_plan(&p);
    g_deterministic = 0;
    run_plan(plan, &p, &x); /* O and LSE of this backend's forward */
    for (int64_t h = 0; h < p.hq; ++h)
        for (int64_t i = 0; i < p.sq; ++i) {
            const float l = x.lse[h * p.sq + i];
            if ((i + BN_OFF < 0) != (l == -INFINITY)) fail_msg("forward LSE of row %lld: %g", (long long)i, l);
        }
    const size_t ng = nq(&p) + 2 * nk(&p);
    float *dout = malloc(nq(&p) * sizeof(float)), *o = malloc(nq(&p) * sizeof(float));
    float *lse = malloc(nl(&p) * sizeof(float)), *g0 = malloc(ng * sizeof(float)), *g1 = malloc(ng * sizeof(float));
    assert_true(dout && o && lse && g0 && g1);
    test_rng rng;
    test_rng_seed(&rng, 91);
    for (size_t i = 0; i < nq(&p); ++i) dout[i] = (float)test_round(p.dtype, test_rng_uniform(&rng, -1.0, 1.0));
    backend_backward(plan, &p, &x, x.o, dout, x.lse, g0, g0 + nq(&p), g0 + nq(&p) + nk(&p));
    for (size_t i = 0; i < ng; ++i)
        if (isnan(g0[i])) fail_msg("NaN-free run: gradient element %zu is NaN", i);
    const struct { int64_t row, head; } where[] = {{2, 0}, {5, 1}, {20, 1}, {30, 0}, {25, 1}, {35, 0}};
    for (bn_case = 0; bn_case < 6; ++bn_case) {
        bn_row = where[bn_case].row, bn_head = where[bn_case].head;
        memcpy(o, x.o, nq(&p) * sizeof(float));
        memcpy(lse, x.lse, nl(&p) * sizeof(float));
        float *dout_case = malloc(nq(&p) * sizeof(float)), *q_saved = x.q;
        float *q_case = malloc(nq(&p) * sizeof(float));
        assert_true(dout_case && q_case);
        memcpy(dout_case, dout, nq(&p) * sizeof(float));
        memcpy(q_case, x.q, nq(&p) * sizeof(float));
        const size_t row_at = at(0, bn_row, bn_head, 0, p.sq, p.hq, p.d);
        float *const lse_at = &lse[bn_head * p.sq + bn_row];
        switch (bn_case) {
        case 0: case 3: o[row_at + 5] = NAN; break;
        case 1: dout_case[row_at + 7] = NAN; break;
        case 2: *lse_at = NAN; break;
        case 4: *lse_at = -INFINITY; o[row_at + 5] = NAN; break;
        default: q_case[row_at + 3] = NAN; break;
        }
        x.q = q_case;
        backend_backward(plan, &p, &x, o, dout_case, lse, g1, g1 + nq(&p), g1 + nq(&p) + nk(&p));
        x.q = q_saved;
        check_grad(bn_names[bn_case], "dQ", g1, g0, p.sq, p.hq, p.d, bn_rule_dq);
        check_grad(bn_names[bn_case], "dK", g1 + nq(&p), g0 + nq(&p), p.sk, p.hkv, p.d, bn_rule_dk);
        check_grad(bn_names[bn_case], "dV", g1 + nq(&p) + nk(&p), g0 + nq(&p) + nk(&p), p.sk, p.hkv, p.d, bn_rule_dv);
        print_message("backward, %s: as the rule says\n", bn_names[bn_case]);
        free(dout_case), free(q_case);
    }
    flashattn_plan_destroy(plan);
    free(dout), free(o), free(lse), free(g0), free(g1);
    data_free(&x);
}

/* ---- The merge's NaN rule (flashattn_plan_merge_states) -------------------------------------- */

/* Three fp32 partials into the plan's O and LSE, against the formula in double. Rows of head 0 of
 * sequence 0: i0 NaN in every partial's LSE; i1 NaN in one, finite in the others; i2 -inf in two
 * partials whose O is all NaN (they add nothing); i3 -inf in all (O = 0, LSE = -inf); i4 a NaN in
 * column 5 of a contributing partial's O (that column NaN, the others finite). Every other row
 * finite. The CPU and every GPU plan (fa2's kernel) follow the same rule. */
static void merge_nan_rule(void **state) {
    (void)state;
    const sv_problem p = {2, 5, 7, 2, 1, 64, low_precision(), 0, -1, -1, 0.0, 0, 0};
    enum { S = 3 };
    flashattn_plan_t *plan = make_plan(&p);
    const int dev = test_on_device(TEST_BACKEND);
    const size_t es = test_dtype_size(p.dtype);
    test_mem po[S], pl[S], o, lse;
    float *ho[S], *hl[S];
    test_rng rng;
    test_rng_seed(&rng, 95);
    for (int s = 0; s < S; ++s) {
        assert_int_equal(test_mem_alloc(&po[s], nq(&p) * 4, dev), 0);
        assert_int_equal(test_mem_alloc(&pl[s], nl(&p) * 4, dev), 0);
        ho[s] = po[s].host;
        hl[s] = pl[s].host;
        for (size_t i = 0; i < nq(&p); ++i) ho[s][i] = (float)test_rng_uniform(&rng, -2.0, 2.0);
        for (size_t i = 0; i < nl(&p); ++i) hl[s][i] = (float)test_rng_uniform(&rng, -4.0, 4.0);
    }
    /* LSE [b][hq][sq]: sequence 0, head 0, row i is at i. O [b][sq][hq][d]: row i, head 0 at i*hq*d. */
    for (int s = 0; s < S; ++s) hl[s][0] = NAN;
    hl[1][1] = NAN;
    hl[0][2] = hl[2][2] = -INFINITY;
    for (int64_t c = 0; c < p.d; ++c) ho[0][at(0, 2, 0, c, p.sq, p.hq, p.d)] = ho[2][at(0, 2, 0, c, p.sq, p.hq, p.d)] = NAN;
    for (int s = 0; s < S; ++s) hl[s][3] = -INFINITY;
    ho[2][at(0, 4, 0, 5, p.sq, p.hq, p.d)] = NAN;
    for (int s = 0; s < S; ++s) {
        assert_int_equal(test_mem_upload(&po[s]), 0);
        assert_int_equal(test_mem_upload(&pl[s]), 0);
    }
    assert_int_equal(test_mem_alloc(&o, nq(&p) * es, dev), 0);
    assert_int_equal(test_mem_alloc(&lse, nl(&p) * 4, dev), 0);
    test_poison(p.dtype, o.host, o.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, lse.host, lse.bytes);
    assert_int_equal(test_mem_upload(&o), 0);
    assert_int_equal(test_mem_upload(&lse), 0);
    const void *o_ptrs[S];
    const float *l_ptrs[S];
    for (int s = 0; s < S; ++s) {
        o_ptrs[s] = test_mem_ptr(&po[s]);
        l_ptrs[s] = test_mem_ptr(&pl[s]);
    }
    const flashattn_status_t st =
        flashattn_plan_merge_states(plan, S, o_ptrs, l_ptrs, FLASHATTN_DTYPE_FP32, test_mem_ptr(&o), test_mem_ptr(&lse), NULL);
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED) { /* a build without fa2's merge kernel */
        print_message("merge_states: %s: skipped\n", flashattn_last_error());
        skip();
    }
    if (st != FLASHATTN_SUCCESS) fail_msg("merge_states: %s", flashattn_last_error());
    const char *err = test_device_error();
    if (err) fail_msg("device error: %s", err);
    assert_int_equal(test_mem_download(&o), 0);
    assert_int_equal(test_mem_download(&lse), 0);
    const float *got_lse = lse.host;
    for (int64_t b = 0; b < p.b; ++b)
        for (int64_t h = 0; h < p.hq; ++h)
            for (int64_t i = 0; i < p.sq; ++i) {
                const size_t li = (size_t)((b * p.hq + h) * p.sq + i);
                double m = -INFINITY, sum = 0.0;
                int nan = 0;
                for (int s = 0; s < S; ++s) {
                    nan |= isnan(hl[s][li]);
                    if (hl[s][li] > m) m = hl[s][li];
                }
                for (int s = 0; s < S && !nan && m != -INFINITY; ++s) sum += exp(hl[s][li] - m);
                const double ref_lse = nan ? NAN : m == -INFINITY ? -INFINITY : m + log(sum);
                if (nan ? !isnan(got_lse[li]) : !(got_lse[li] == ref_lse || fabs(got_lse[li] - ref_lse) <= 1e-5 * (1.0 + fabs(ref_lse))))
                    fail_msg("merge b%lld h%lld row %lld: LSE %g, expected %g", (long long)b, (long long)h, (long long)i, got_lse[li], ref_lse);
                for (int64_t c = 0; c < p.d; ++c) {
                    const size_t oi = at(b, i, h, c, p.sq, p.hq, p.d);
                    double ref = 0.0;
                    int col_nan = nan;
                    for (int s = 0; s < S && !nan && m != -INFINITY; ++s) {
                        if (hl[s][li] == -INFINITY) continue;
                        col_nan |= isnan(ho[s][oi]);
                        ref += exp(hl[s][li] - ref_lse) * ho[s][oi];
                    }
                    const double got = test_load(p.dtype, (const char *)o.host + oi * es);
                    const int ok = col_nan ? isnan(got) && !test_is_poison(p.dtype, (const unsigned char *)o.host + oi * es)
                                           : fabs(got - ref) <= tolerance(p.dtype) * 2.0;
                    if (!ok)
                        fail_msg("merge b%lld h%lld row %lld col %lld: %g, expected %s%g", (long long)b, (long long)h,
                                 (long long)i, (long long)c, got, col_nan ? "NaN, not " : "", ref);
                }
            }
    for (int s = 0; s < S; ++s) {
        test_mem_free(&po[s]);
        test_mem_free(&pl[s]);
    }
    test_mem_free(&o);
    test_mem_free(&lse);
    flashattn_plan_destroy(plan);
}

int main(void) {
    struct CMUnitTest tests[16];
    size_t n = 0;
    if (!IS_CPU) {
        int32_t major, minor;
        test_require_gpu_backend(TEST_BACKEND, &major, &minor);
    }
    tests[n++] = test_unit("nan_in_query_row", nan_in_query_row, NULL);
    tests[n++] = test_unit("nan_in_keys", nan_in_keys, NULL);
    tests[n++] = test_unit("nan_in_value_and_masked_rows", nan_in_value_and_masked_rows, NULL);
    tests[n++] = test_unit("nan_in_decode", nan_in_decode, NULL);
    tests[n++] = test_unit("huge_windows_are_no_window", huge_windows_are_no_window, NULL);
    tests[n++] = test_unit("varlen_declared_maximum", varlen_declared_maximum, NULL);
    tests[n++] = test_unit("tiny_softcap_is_uniform", tiny_softcap_is_uniform, NULL);
    tests[n++] = test_unit("fresh_thread", fresh_thread, NULL);
    tests[n++] = test_unit("merge_nan_rule", merge_nan_rule, NULL);
    if (IS_CPU) {
        tests[n++] = test_unit("huge_magnitudes", huge_magnitudes, NULL);
        tests[n++] = test_unit("thread_count_invariance", thread_count_invariance, NULL);
        tests[n++] = test_unit("nan_in_backward", nan_in_backward, NULL);
    }
    if (IS_CPU || TEST_BACKEND == FLASHATTN_BACKEND_FA2)
        tests[n++] = test_unit("backward_lse_and_row_dot", backward_lse_and_row_dot, NULL);
    return _cmocka_run_group_tests(test_backend_name(TEST_BACKEND), tests, n, NULL, NULL);
}
