/* The backward tests' gradient references (see test_backward_reference.h): one query row at a
 * time, every score of the row materialised, the chain rule written out term by term. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_backward_reference.h"
#include "test_support.h"

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) abort();
    return p;
}

void grad_reference(const ref_problem *p, double *dq, double *dk, double *dv, double *o,
                    unsigned char *q_sees, unsigned char *k_seen) {
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v;
    const int64_t maxk = ref_longest(p->len_k, p->batch);
    const double cap = p->softcap;
    double *s = (double *)xcalloc((size_t)maxk, sizeof(double));    /* capped, scaled scores */
    double *th = (double *)xcalloc((size_t)maxk, sizeof(double));   /* tanh(raw / cap) */
    double *pr = (double *)xcalloc((size_t)maxk, sizeof(double));   /* probabilities */
    unsigned char *vis = (unsigned char *)xcalloc((size_t)maxk, 1);
    double *orow = (double *)xcalloc((size_t)dvd, sizeof(double));
    ref_row r = ref_rows_begin();
    int64_t j, c;

    memset(dq, 0, (size_t)(p->total_q * hq * d) * sizeof(double));
    memset(dk, 0, (size_t)(p->total_k * hk * d) * sizeof(double));
    memset(dv, 0, (size_t)(p->total_k * hk * dvd) * sizeof(double));
    if (o) memset(o, 0, (size_t)(p->total_q * hq * dvd) * sizeof(double));
    if (q_sees) memset(q_sees, 0, (size_t)(p->total_q * hq));
    if (k_seen) memset(k_seen, 0, (size_t)(p->total_k * hk));

    while (ref_next_row(p, &r)) {
        const float *q = r.q;
        const float *g = p->dout + (r.tq * hq + r.h) * dvd;
        double *dqr = dq + (r.tq * hq + r.h) * d;
        double m = -INFINITY, l = 0.0, di = 0.0;
        int any = 0;
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
        if (!any) continue; /* sees no key: O = 0, dQ = 0, contributes nothing */
        if (q_sees) q_sees[r.tq * hq + r.h] = 1;
        for (j = 0; j < r.sk; ++j)
            if (vis[j]) l += (pr[j] = exp(s[j] - m));
        for (c = 0; c < dvd; ++c) orow[c] = 0.0;
        for (j = 0; j < r.sk; ++j) {
            const float *v = p->v + ((p->start_k[r.b] + j) * hk + r.kh) * dvd;
            if (!vis[j]) continue;
            pr[j] /= l;
            for (c = 0; c < dvd; ++c) orow[c] += pr[j] * (double)v[c];
        }
        if (o)
            for (c = 0; c < dvd; ++c) o[(r.tq * hq + r.h) * dvd + c] = orow[c];
        for (c = 0; c < dvd; ++c) di += (double)g[c] * orow[c]; /* rowsum(dO * O) */
        for (j = 0; j < r.sk; ++j) {
            const int64_t tk = p->start_k[r.b] + j;
            const float *k = p->k + (tk * hk + r.kh) * d;
            const float *v = p->v + (tk * hk + r.kh) * dvd;
            double *dkr = dk + (tk * hk + r.kh) * d, *dvr = dv + (tk * hk + r.kh) * dvd;
            double dp = 0.0, ds;
            if (!vis[j]) continue;
            if (k_seen) k_seen[tk * hk + r.kh] = 1;
            for (c = 0; c < dvd; ++c) {
                dp += (double)g[c] * (double)v[c]; /* dP = dO V^T */
                dvr[c] += pr[j] * (double)g[c];    /* dV = P^T dO */
            }
            ds = pr[j] * (dp - di); /* softmax backward */
            /* d/d(raw) of cap * tanh(raw * scale / cap) is scale * (1 - tanh^2). */
            ds *= p->scale * (cap > 0.0 ? 1.0 - th[j] * th[j] : 1.0);
            for (c = 0; c < d; ++c) {
                dqr[c] += ds * (double)k[c]; /* dQ = dS K */
                dkr[c] += ds * (double)q[c]; /* dK = dS^T Q (summed over the group) */
            }
        }
    }
    free(orow);
    free(vis);
    free(pr);
    free(th);
    free(s);
}

void grad_reference_lowp(const ref_problem *p, double *dq, double *dk, double *dv) {
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dvd = p->head_dim_v;
    const int64_t group = hq / hk, maxk = ref_longest(p->len_k, p->batch);
    const flashattn_dtype_t dt = p->dtype;
    const float scale = (float)p->scale, cap = (float)p->softcap;
    float *s = (float *)xcalloc((size_t)maxk, sizeof(float));
    float *th = (float *)xcalloc((size_t)maxk, sizeof(float));
    float *pr = (float *)xcalloc((size_t)maxk, sizeof(float));
    float *dp = (float *)xcalloc((size_t)maxk, sizeof(float));
    unsigned char *vis = (unsigned char *)xcalloc((size_t)maxk, 1);
    float *qs = (float *)xcalloc((size_t)d, sizeof(float));
    float *dqacc = (float *)xcalloc((size_t)d, sizeof(float));
    /* Per sequence and key/value head: the current query head's dK, dV (float accumulators of the
     * matmul over query rows) and the group's sum of their rounded values. */
    float *hk_acc = (float *)xcalloc((size_t)(maxk * d), sizeof(float));
    float *hv_acc = (float *)xcalloc((size_t)(maxk * dvd), sizeof(float));
    float *gk_acc = (float *)xcalloc((size_t)(maxk * d), sizeof(float));
    float *gv_acc = (float *)xcalloc((size_t)(maxk * dvd), sizeof(float));
    int64_t b, kh, h, i, j, c;

    memset(dq, 0, (size_t)(p->total_q * hq * d) * sizeof(double));
    memset(dk, 0, (size_t)(p->total_k * hk * d) * sizeof(double));
    memset(dv, 0, (size_t)(p->total_k * hk * dvd) * sizeof(double));

    for (b = 0; b < p->batch; ++b) {
        const int64_t sq = p->len_q[b], sk = p->len_k[b];
        for (kh = 0; kh < hk; ++kh) {
            memset(gk_acc, 0, (size_t)(sk * d) * sizeof(float));
            memset(gv_acc, 0, (size_t)(sk * dvd) * sizeof(float));
            for (h = kh * group; h < (kh + 1) * group; ++h) {
                memset(hk_acc, 0, (size_t)(sk * d) * sizeof(float));
                memset(hv_acc, 0, (size_t)(sk * dvd) * sizeof(float));
                for (i = 0; i < sq; ++i) {
                    const int64_t tq = p->start_q[b] + i;
                    const float *q = p->q + (tq * hq + h) * d;
                    const float *g = p->dout + (tq * hq + h) * dvd;
                    float m = -INFINITY, l = 0.0f, sum_dpp = 0.0f;
                    int any = 0;
                    for (c = 0; c < d; ++c) qs[c] = (float)test_round(dt, (double)(q[c] * scale));
                    for (j = 0; j < sk; ++j) {
                        const float *k = p->k + ((p->start_k[b] + j) * hk + kh) * d;
                        float dot = 0.0f;
                        vis[j] = (unsigned char)ref_visible(p, i, j, sq, sk);
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
                    if (!any) continue;
                    for (j = 0; j < sk; ++j) {
                        if (!vis[j]) continue;
                        pr[j] = expf(s[j] - m);
                        l += pr[j];
                    }
                    for (c = 0; c < d; ++c) dqacc[c] = 0.0f;
                    for (j = 0; j < sk; ++j) {
                        const float *v = p->v + ((p->start_k[b] + j) * hk + kh) * dvd;
                        float acc = 0.0f;
                        if (!vis[j]) continue;
                        pr[j] = (float)test_round(dt, (double)(pr[j] / l));
                        for (c = 0; c < dvd; ++c) {
                            acc += g[c] * v[c];
                            hv_acc[j * dvd + c] += pr[j] * g[c];
                        }
                        dp[j] = (float)test_round(dt, (double)acc);
                        sum_dpp += dp[j] * pr[j];
                    }
                    for (j = 0; j < sk; ++j) {
                        const float *k = p->k + ((p->start_k[b] + j) * hk + kh) * d;
                        float ds;
                        if (!vis[j]) continue;
                        ds = (float)test_round(dt, (double)(pr[j] * (dp[j] - sum_dpp)));
                        if (cap > 0.0f) { /* s = cap * t, t = tanh(u), u = raw / cap */
                            const float dt_ = (float)test_round(dt, (double)(ds * cap));
                            const float du = (float)test_round(dt, (double)(dt_ * (1.0f - th[j] * th[j])));
                            ds = (float)test_round(dt, (double)(du / cap));
                        }
                        for (c = 0; c < d; ++c) {
                            dqacc[c] += ds * k[c];
                            hk_acc[j * d + c] += ds * qs[c];
                        }
                    }
                    for (c = 0; c < d; ++c) {
                        const float dqs = (float)test_round(dt, (double)dqacc[c]); /* d(q * scale) */
                        dq[(tq * hq + h) * d + c] = test_round(dt, (double)(dqs * scale));
                    }
                }
                for (j = 0; j < sk * d; ++j) gk_acc[j] += (float)test_round(dt, (double)hk_acc[j]);
                for (j = 0; j < sk * dvd; ++j) gv_acc[j] += (float)test_round(dt, (double)hv_acc[j]);
            }
            for (j = 0; j < sk; ++j) {
                const int64_t tk = p->start_k[b] + j;
                for (c = 0; c < d; ++c) dk[(tk * hk + kh) * d + c] = test_round(dt, (double)gk_acc[j * d + c]);
                for (c = 0; c < dvd; ++c) dv[(tk * hk + kh) * dvd + c] = test_round(dt, (double)gv_acc[j * dvd + c]);
            }
        }
    }
    free(gv_acc);
    free(gk_acc);
    free(hv_acc);
    free(hk_acc);
    free(dqacc);
    free(qs);
    free(vis);
    free(dp);
    free(pr);
    free(th);
    free(s);
}
