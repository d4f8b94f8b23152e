/* The backward tests' gradient references (see test_backward_reference.h): one query row at a
 * time, every score of the row materialised, the chain rule written out term by term; on every core,
 * bitwise as on one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_backward_reference.h"
#include "test_support.h"

/* ---- On every core ------------------------------------------------------------------------------
 * Every output element keeps one writer and today's additions in today's order (the tests'
 * tolerances are computed from these values). A query row's O, dQ and q_sees need all its keys; a
 * key's dK, dV and k_seen sum over every query row of its key/value head's group, in ref_next_row()'s
 * order (query head by query head, row by row). A job per (sequence, key/value head) would keep both,
 * but the largest cases have one of each. So the rows of one (sequence, key/value head) are walked in
 * steps, contiguous in that order: pass 1 runs the step's rows whole, in parallel, as the
 * single-threaded loop did, keeping P and dS of each visible key; pass 2 gives each job a block of
 * keys and adds the step's rows' terms to them, row by row in order. The stored P and dS bound a
 * step's size. */
#define KEYS_PER_JOB 32
#define STEP_BYTES ((int64_t)64 << 20)
#define STEP_ROWS_MIN 64

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) abort();
    return p;
}

typedef struct grad_args {
    const ref_problem *p;
    double *dq, *dk, *dv, *o;
    unsigned char *q_sees, *k_seen;
    int64_t maxk, group, step;
    /* The step: rows [f0, f1) of key/value head kh of sequence b, numbered in ref_next_row()'s order
     * from the first row of its first query head. */
    int64_t b, kh, f0, f1;
    double *pr, *ds;       /* [step row][maxk] P and dS of the visible keys */
    float *fpr, *fds, *qs; /* lowp: the same, and [step row][head_dim] q * scale in the dtype */
    /* lowp, [key of the sequence][head_dim or head_dim_v]: the current query head's dK, dV (float
     * accumulators of the matmul over query rows) and the group's sum of their rounded values. */
    float *hk_acc, *hv_acc, *gk_acc, *gv_acc;
} grad_args;

static ref_row step_row(const grad_args *a, int64_t f) {
    const int64_t sq = a->p->len_q[a->b];
    return ref_row_at(a->p, a->b, a->kh * a->group + f / sq, f % sq);
}

/* Pass 2's job `index`: keys [*j0, *j1) of the sequence. */
static void job_keys(const grad_args *a, int64_t index, int64_t *j0, int64_t *j1) {
    const int64_t sk = a->p->len_k[a->b];
    *j0 = index * KEYS_PER_JOB;
    *j1 = *j0 + KEYS_PER_JOB < sk ? *j0 + KEYS_PER_JOB : sk;
}

/* Zeroes the outputs, then both passes over every step, steps in ref_next_row()'s order. */
static void grad_run(grad_args *a, double *dq, double *dk, double *dv, size_t scratch_bytes, ref_job rows,
                     ref_job keys) {
    const ref_problem *p = a->p;
    a->dq = dq;
    a->dk = dk;
    a->dv = dv;
    memset(dq, 0, (size_t)(p->total_q * p->heads_q * p->head_dim) * sizeof(double));
    memset(dk, 0, (size_t)(p->total_k * p->heads_kv * p->head_dim) * sizeof(double));
    memset(dv, 0, (size_t)(p->total_k * p->heads_kv * p->head_dim_v) * sizeof(double));
    for (a->b = 0; a->b < p->batch; ++a->b) {
        const int64_t rows_kh = a->group * p->len_q[a->b];
        for (a->kh = 0; a->kh < p->heads_kv; ++a->kh) {
            for (a->f0 = 0; a->f0 < rows_kh; a->f0 = a->f1) {
                a->f1 = a->f0 + a->step < rows_kh ? a->f0 + a->step : rows_kh;
                ref_parallel(a->f1 - a->f0, scratch_bytes, rows, a); /* a row a job: a decoding step has few */
                ref_parallel((p->len_k[a->b] + KEYS_PER_JOB - 1) / KEYS_PER_JOB, 0, keys, a);
            }
        }
    }
}

static grad_args grad_args_of(const ref_problem *p) {
    grad_args a;
    memset(&a, 0, sizeof a);
    a.p = p;
    a.maxk = ref_longest(p->len_k, p->batch);
    a.group = p->heads_q / p->heads_kv;
    a.step = STEP_BYTES / (a.maxk * 2 * (int64_t)sizeof(double));
    if (a.step < STEP_ROWS_MIN) a.step = STEP_ROWS_MIN;
    if (a.step > a.group * ref_longest(p->len_q, p->batch)) a.step = a.group * ref_longest(p->len_q, p->batch);
    return a;
}

/* ---- Double precision -------------------------------------------------------------------------- */

/* Pass 1, a row of the step: its O, dQ, q_sees; P and dS for pass 2. */
static void grad_rows(void *arg, int64_t index, void *scratch) {
    const grad_args *a = (const grad_args *)arg;
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v, maxk = a->maxk;
    const double cap = p->softcap;
    double *s = (double *)scratch, *th = s + maxk, *orow = th + maxk; /* capped, scaled scores; tanh(raw / cap) */
    unsigned char *vis = (unsigned char *)(orow + dvd);
    const ref_row r = step_row(a, a->f0 + index);
    const float *q = r.q;
    const float *g = p->dout + (r.tq * hq + r.h) * dvd;
    double *dqr = a->dq + (r.tq * hq + r.h) * d;
    double *pr = a->pr + index * maxk, *ds = a->ds + index * maxk;
    double m = -INFINITY, l = 0.0, di = 0.0;
    int any = 0;
    int64_t j, c;
    for (j = 0; j < r.sk; ++j) {
        const float *k = p->k + ((p->start_k[r.b] + j) * hk + r.kh) * d;
        double dot = 0.0;
        vis[j] = (unsigned char)ref_visible(p, r.i, j, r.sq, r.sk);
        if (!vis[j]) continue;
        for (c = 0; c < d; ++c) dot += (double)q[c] * (double)k[c];
        dot *= p->scale;
        if (cap > 0.0) {
            th[j] = tanh(dot / cap);
            dot = cap * th[j];
        }
        s[j] = dot;
        if (dot > m) m = dot;
        any = 1;
    }
    if (!any) return; /* sees no key: O = 0, dQ = 0, contributes nothing */
    if (a->q_sees) a->q_sees[r.tq * hq + r.h] = 1;
    for (j = 0; j < r.sk; ++j)
        if (vis[j]) l += (pr[j] = exp(s[j] - m));
    for (c = 0; c < dvd; ++c) orow[c] = 0.0;
    for (j = 0; j < r.sk; ++j) {
        const float *v = p->v + ((p->start_k[r.b] + j) * hk + r.kh) * dvd;
        if (!vis[j]) continue;
        pr[j] /= l;
        for (c = 0; c < dvd; ++c) orow[c] += pr[j] * (double)v[c];
    }
    if (a->o)
        for (c = 0; c < dvd; ++c) a->o[(r.tq * hq + r.h) * dvd + c] = orow[c];
    for (c = 0; c < dvd; ++c) di += (double)g[c] * orow[c]; /* rowsum(dO * O) */
    for (j = 0; j < r.sk; ++j) {
        const int64_t tk = p->start_k[r.b] + j;
        const float *k = p->k + (tk * hk + r.kh) * d;
        const float *v = p->v + (tk * hk + r.kh) * dvd;
        double dp = 0.0;
        if (!vis[j]) continue;
        for (c = 0; c < dvd; ++c) dp += (double)g[c] * (double)v[c]; /* dP = dO V^T */
        ds[j] = pr[j] * (dp - di); /* softmax backward */
        /* d/d(raw) of cap * tanh(raw * scale / cap) is scale * (1 - tanh^2). */
        ds[j] *= p->scale * (cap > 0.0 ? 1.0 - th[j] * th[j] : 1.0);
        for (c = 0; c < d; ++c) dqr[c] += ds[j] * (double)k[c]; /* dQ = dS K */
    }
}

/* Pass 2: the step's terms of dK, dV and k_seen of the job's keys. */
static void grad_keys(void *arg, int64_t index, void *scratch) {
    const grad_args *a = (const grad_args *)arg;
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v;
    int64_t f, j0, j1, j, c;
    (void)scratch;
    job_keys(a, index, &j0, &j1);
    for (f = a->f0; f < a->f1; ++f) {
        const ref_row r = step_row(a, f);
        const float *g = p->dout + (r.tq * hq + r.h) * dvd;
        const double *pr = a->pr + (f - a->f0) * a->maxk, *ds = a->ds + (f - a->f0) * a->maxk;
        for (j = j0; j < j1; ++j) {
            const int64_t tk = p->start_k[r.b] + j;
            double *dkr = a->dk + (tk * hk + r.kh) * d, *dvr = a->dv + (tk * hk + r.kh) * dvd;
            if (!ref_visible(p, r.i, j, r.sq, r.sk)) continue;
            if (a->k_seen) a->k_seen[tk * hk + r.kh] = 1;
            for (c = 0; c < dvd; ++c) dvr[c] += pr[j] * (double)g[c];  /* dV = P^T dO */
            for (c = 0; c < d; ++c) dkr[c] += ds[j] * (double)r.q[c]; /* dK = dS^T Q (summed over the group) */
        }
    }
}

void grad_reference(const ref_problem *p, double *dq, double *dk, double *dv, double *o,
                    unsigned char *q_sees, unsigned char *k_seen) {
    grad_args a = grad_args_of(p);
    a.o = o;
    a.q_sees = q_sees;
    a.k_seen = k_seen;
    a.pr = (double *)xcalloc((size_t)(a.step * a.maxk), sizeof(double));
    a.ds = (double *)xcalloc((size_t)(a.step * a.maxk), sizeof(double));
    if (o) memset(o, 0, (size_t)(p->total_q * p->heads_q * p->head_dim_v) * sizeof(double));
    if (q_sees) memset(q_sees, 0, (size_t)(p->total_q * p->heads_q));
    if (k_seen) memset(k_seen, 0, (size_t)(p->total_k * p->heads_kv));
    /* pass 1's scratch: s, th [maxk], orow [head_dim_v], vis [maxk] */
    grad_run(&a, dq, dk, dv, (size_t)(2 * a.maxk + p->head_dim_v) * sizeof(double) + (size_t)a.maxk, grad_rows,
             grad_keys);
    free(a.ds);
    free(a.pr);
}

/* ---- In the input dtype ------------------------------------------------------------------------ */

/* Pass 1, a row of the step: its dQ; q * scale, P and dS for pass 2. */
static void lowp_rows(void *arg, int64_t index, void *scratch) {
    const grad_args *a = (const grad_args *)arg;
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v, maxk = a->maxk;
    const flashattn_dtype_t dt = p->dtype;
    const float scale = (float)p->scale, cap = (float)p->softcap;
    float *s = (float *)scratch, *th = s + maxk, *dp = th + maxk, *dqacc = dp + maxk;
    unsigned char *vis = (unsigned char *)(dqacc + d);
    const ref_row r = step_row(a, a->f0 + index);
    const int64_t tq = r.tq, h = r.h;
    const float *q = r.q;
    const float *g = p->dout + (tq * hq + h) * dvd;
    float *qs = a->qs + index * d, *pr = a->fpr + index * maxk, *ds = a->fds + index * maxk;
    float m = -INFINITY, l = 0.0f, sum_dpp = 0.0f;
    int any = 0;
    int64_t j, c;
    for (c = 0; c < d; ++c) qs[c] = (float)test_round(dt, (double)(q[c] * scale));
    for (j = 0; j < r.sk; ++j) {
        const float *k = p->k + ((p->start_k[r.b] + j) * hk + r.kh) * d;
        float dot = 0.0f;
        vis[j] = (unsigned char)ref_visible(p, r.i, j, r.sq, r.sk);
        if (!vis[j]) continue;
        for (c = 0; c < d; ++c) dot += qs[c] * k[c];
        dot = (float)test_round(dt, (double)dot);
        if (cap > 0.0f) {
            const float u = (float)test_round(dt, (double)(dot / cap));
            th[j] = (float)test_round(dt, (double)tanhf(u));
            dot = (float)test_round(dt, (double)(th[j] * cap));
        }
        s[j] = dot;
        if (dot > m) m = dot;
        any = 1;
    }
    if (!any) return;
    for (j = 0; j < r.sk; ++j) {
        if (!vis[j]) continue;
        pr[j] = expf(s[j] - m);
        l += pr[j];
    }
    for (c = 0; c < d; ++c) dqacc[c] = 0.0f;
    for (j = 0; j < r.sk; ++j) {
        const float *v = p->v + ((p->start_k[r.b] + j) * hk + r.kh) * dvd;
        float acc = 0.0f;
        if (!vis[j]) continue;
        pr[j] = (float)test_round(dt, (double)(pr[j] / l));
        for (c = 0; c < dvd; ++c) acc += g[c] * v[c];
        dp[j] = (float)test_round(dt, (double)acc);
        sum_dpp += dp[j] * pr[j];
    }
    for (j = 0; j < r.sk; ++j) {
        const float *k = p->k + ((p->start_k[r.b] + j) * hk + r.kh) * d;
        if (!vis[j]) continue;
        ds[j] = (float)test_round(dt, (double)(pr[j] * (dp[j] - sum_dpp)));
        if (cap > 0.0f) { /* s = cap * t, t = tanh(u), u = raw / cap */
            const float dt_ = (float)test_round(dt, (double)(ds[j] * cap));
            const float du = (float)test_round(dt, (double)(dt_ * (1.0f - th[j] * th[j])));
            ds[j] = (float)test_round(dt, (double)(du / cap));
        }
        for (c = 0; c < d; ++c) dqacc[c] += ds[j] * k[c];
    }
    for (c = 0; c < d; ++c) {
        const float dqs = (float)test_round(dt, (double)dqacc[c]); /* d(q * scale) */
        a->dq[(tq * hq + h) * d + c] = test_round(dt, (double)(dqs * scale));
    }
}

/* Pass 2: the step's terms of dK, dV of the job's keys; after a query head's last row its rounded
 * dK, dV join the group's, after the group's last head they are rounded into dk, dv. */
static void lowp_keys(void *arg, int64_t index, void *scratch) {
    const grad_args *a = (const grad_args *)arg;
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v;
    const flashattn_dtype_t dt = p->dtype;
    float *hk_acc = a->hk_acc, *hv_acc = a->hv_acc, *gk_acc = a->gk_acc, *gv_acc = a->gv_acc;
    int64_t f, j0, j1, j, c;
    (void)scratch;
    job_keys(a, index, &j0, &j1);
    for (f = a->f0; f < a->f1; ++f) {
        const ref_row r = step_row(a, f);
        const float *g = p->dout + (r.tq * hq + r.h) * dvd, *qs = a->qs + (f - a->f0) * d;
        const float *pr = a->fpr + (f - a->f0) * a->maxk, *ds = a->fds + (f - a->f0) * a->maxk;
        for (j = j0; j < j1; ++j) {
            if (!ref_visible(p, r.i, j, r.sq, r.sk)) continue;
            for (c = 0; c < dvd; ++c) hv_acc[j * dvd + c] += pr[j] * g[c];
            for (c = 0; c < d; ++c) hk_acc[j * d + c] += ds[j] * qs[c];
        }
        if (r.i < r.sq - 1) continue;
        for (j = j0 * d; j < j1 * d; ++j) {
            gk_acc[j] += (float)test_round(dt, (double)hk_acc[j]);
            hk_acc[j] = 0.0f;
        }
        for (j = j0 * dvd; j < j1 * dvd; ++j) {
            gv_acc[j] += (float)test_round(dt, (double)hv_acc[j]);
            hv_acc[j] = 0.0f;
        }
        if (r.h % a->group < a->group - 1) continue;
        for (j = j0; j < j1; ++j) {
            const int64_t tk = p->start_k[r.b] + j;
            for (c = 0; c < d; ++c) a->dk[(tk * hk + r.kh) * d + c] = test_round(dt, (double)gk_acc[j * d + c]);
            for (c = 0; c < dvd; ++c) a->dv[(tk * hk + r.kh) * dvd + c] = test_round(dt, (double)gv_acc[j * dvd + c]);
        }
        memset(gk_acc + j0 * d, 0, (size_t)((j1 - j0) * d) * sizeof(float));
        memset(gv_acc + j0 * dvd, 0, (size_t)((j1 - j0) * dvd) * sizeof(float));
    }
}

void grad_reference_lowp(const ref_problem *p, double *dq, double *dk, double *dv) {
    grad_args a = grad_args_of(p);
    const int64_t d = p->head_dim, dvd = p->head_dim_v;
    a.fpr = (float *)xcalloc((size_t)(a.step * a.maxk), sizeof(float));
    a.fds = (float *)xcalloc((size_t)(a.step * a.maxk), sizeof(float));
    a.qs = (float *)xcalloc((size_t)(a.step * d), sizeof(float));
    a.hk_acc = (float *)xcalloc((size_t)(a.maxk * d), sizeof(float));
    a.hv_acc = (float *)xcalloc((size_t)(a.maxk * dvd), sizeof(float));
    a.gk_acc = (float *)xcalloc((size_t)(a.maxk * d), sizeof(float));
    a.gv_acc = (float *)xcalloc((size_t)(a.maxk * dvd), sizeof(float));
    /* pass 1's scratch: s, th, dp [maxk], dqacc [head_dim], vis [maxk] */
    grad_run(&a, dq, dk, dv, (size_t)(3 * a.maxk + d) * sizeof(float) + (size_t)a.maxk, lowp_rows, lowp_keys);
    free(a.gv_acc);
    free(a.gk_acc);
    free(a.hv_acc);
    free(a.hk_acc);
    free(a.qs);
    free(a.fds);
    free(a.fpr);
}
