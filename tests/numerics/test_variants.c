/* The attention variants of 0.3 on one backend (TEST_BACKEND) against this file's own
 * double-precision reference: top-left mask alignment, sink tokens, per-head sink logits, ALiBi,
 * head_dim_v != head_dim, and the merge of partial states (flashattn_plan_merge_states). Built once
 * per backend: test_variants_cpu (label cpu) and test_variants_fa1 / _fa2 / _fa3 (label gpu,
 * skipped without a GPU; fa1 runs top-left alignment only and must refuse the rest by name).
 *
 * Forward: fresh random inputs (U(-1, 1) rounded to the dtype), O and LSE poisoned with NaN, every
 * element checked: fp32 |O - ref| <= 2e-5 (inputs are O(1), so O is), fp16 4e-3, bf16 2.5e-2
 * (a few ulps of the output type); LSE within 1e-4 (1 + |ref|); rows that see no key O = 0 exactly
 * and LSE = -inf (or the sink logit). A GPU backend that does not run a variant must refuse it at
 * finalize with NOT_SUPPORTED and a message naming it (the case then counts as checked-refused).
 *
 * Merge: (a) a causal problem (sq = sk, bottom-right) split at key c into a prefix run with
 * top-left causal alignment (rows see j <= i) and a suffix run bottom-right (rows i < c see none
 * of it: LSE = -inf), merged, against the reference of the whole problem; (b) a full problem split
 * in three key chunks, merged as fp16/bf16 and as fp32 partials; (b) also on variable-length plans
 * (random query lengths, the LSE and O in their packed layouts).
 *
 * Backward: the library's dQ, dK, dV and dsink against central finite differences of
 * L = sum(O_ref * G) through the double reference: on the cpu tiny fp32 shapes with every
 * variant; on fa2 and fa3 fp16/bf16 shapes over several key tiles with top-left alignment, sink
 * logits, ALiBi, sink tokens and head_dim_v != head_dim, at head dims 16-256 (both backward
 * passes run every variant). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_expect.h"
#include "test_support.h"

static int g_checked = 0;
static int g_refused = 0;

/* One problem with its variants. Sequences: fixed length, or (varlen) lengths len_q/len_k. */
typedef struct vcase {
    int64_t batch, sq, sk, hq, hk, d, dv;
    flashattn_dtype_t dtype;
    int causal, top_left;
    int64_t wl, wr, sink_tokens;
    int sinks, alibi;
    double softcap;
    int varlen; /* 1: random query and key lengths; 2: random query lengths, every key length sk */
} vcase;

/* The reference of one (sequence, head): rows sq, keys sk, inputs in double. */
typedef struct ref_in {
    const double *q, *k, *v; /* [sq][d], [sk][d], [sk][dv] */
    int64_t sq, sk, d, dv;
    int causal, top_left;
    int64_t wl, wr, sink_tokens;
    double scale, softcap;
    int has_sink;
    double sink, slope; /* slope 0: no ALiBi */
} ref_in;

static int ref_visible(const ref_in *r, int64_t i, int64_t j) {
    const int64_t diag = r->top_left ? i : i + r->sk - r->sq;
    int64_t last = r->sk - 1, first = 0;
    if (r->causal && diag < last) last = diag;
    if (r->wr >= 0 && diag + r->wr < last) last = diag + r->wr;
    if (r->wl >= 0 && diag - r->wl > first) first = diag - r->wl;
    if (j > last) return 0;
    return j >= first || j < r->sink_tokens;
}

/* O [sq][dv] and LSE [sq] (-inf: nothing seen). */
static void ref_attention(const ref_in *r, double *o, double *lse) {
    double *s = malloc(sizeof(double) * (size_t)(r->sk > 0 ? r->sk : 1));
    for (int64_t i = 0; i < r->sq; ++i) {
        double m = r->has_sink ? r->sink : -INFINITY;
        const int64_t diag = r->top_left ? i : i + r->sk - r->sq;
        for (int64_t j = 0; j < r->sk; ++j) {
            if (!ref_visible(r, i, j)) {
                s[j] = -INFINITY;
                continue;
            }
            double dot = 0.0;
            for (int64_t c = 0; c < r->d; ++c) dot += r->q[i * r->d + c] * r->k[j * r->d + c];
            dot *= r->scale;
            if (r->softcap > 0.0) dot = r->softcap * tanh(dot / r->softcap);
            dot -= r->slope * (double)llabs(diag - j);
            s[j] = dot;
            if (dot > m) m = dot;
        }
        double l = r->has_sink ? exp(r->sink - m) : 0.0;
        for (int64_t c = 0; c < r->dv; ++c) o[i * r->dv + c] = 0.0;
        if (m == -INFINITY) {
            lse[i] = -INFINITY;
            continue;
        }
        for (int64_t j = 0; j < r->sk; ++j) {
            if (s[j] == -INFINITY) continue;
            const double p = exp(s[j] - m);
            l += p;
            for (int64_t c = 0; c < r->dv; ++c) o[i * r->dv + c] += p * r->v[j * r->dv + c];
        }
        for (int64_t c = 0; c < r->dv; ++c) o[i * r->dv + c] /= l;
        lse[i] = m + log(l);
    }
    free(s);
}

/* ---- Cases on the library ------------------------------------------------------------------- */

static int on_device(void) { return test_on_device(TEST_BACKEND); }

static double out_tol(flashattn_dtype_t dt) {
    return dt == FLASHATTN_DTYPE_FP32 ? 2e-5 : dt == FLASHATTN_DTYPE_FP16 ? 4e-3 : 2.5e-2;
}

/* Inputs and results of one case, in the library's contiguous layouts. */
typedef struct run_data {
    vcase c;
    int64_t *len_q, *len_k, *start_q, *start_k; /* [batch] */
    int64_t total_q, total_k;
    double *q, *k, *v;      /* logical [tokens][heads][dim], rounded to the dtype */
    float *sink, *slope;    /* [hq] */
    const double *sink_d;   /* when set, the reference's sink logits (finite differences) */
    test_mem mq, mk, mv, mo, mlse, msink, mslope, mcu_q, mcu_k, mws;
} run_data;

static int64_t rows_q(const run_data *r) { return r->total_q; }

static void fill(test_rng *rng, flashattn_dtype_t dt, double *logical, void *host, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const double x = test_round(dt, test_rng_uniform(rng, -1.0, 1.0));
        logical[i] = x;
        test_store(dt, (unsigned char *)host + i * test_dtype_size(dt), x);
    }
}

static int alloc_mem(test_mem *m, size_t bytes) { return test_mem_alloc(m, bytes ? bytes : 1, on_device()); }

static void data_init(run_data *r, const vcase *c, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->c = *c;
    test_rng rng;
    test_rng_seed(&rng, seed);
    const int64_t B = c->batch;
    r->len_q = calloc((size_t)B, sizeof(int64_t));
    r->len_k = calloc((size_t)B, sizeof(int64_t));
    r->start_q = calloc((size_t)B, sizeof(int64_t));
    r->start_k = calloc((size_t)B, sizeof(int64_t));
    /* Lengths from their own generator, seeded by the shape: a merge's chunks (other seeds, other
     * seqlen_k) get the whole problem's query lengths. */
    test_rng lengths;
    test_rng_seed(&lengths, (uint64_t)(c->sq * 1000003 + c->batch * 101 + c->varlen));
    for (int64_t b = 0; b < B; ++b) {
        r->len_q[b] = c->varlen && b > 0 ? test_rng_range(&lengths, c->sq / 3, c->sq) : c->sq;
        r->len_k[b] = c->varlen == 1 && b > 0 ? test_rng_range(&lengths, c->sk / 3, c->sk) : c->sk;
        r->start_q[b] = r->total_q;
        r->start_k[b] = r->total_k;
        r->total_q += r->len_q[b];
        r->total_k += r->len_k[b];
    }
    const size_t es = test_dtype_size(c->dtype);
    const size_t nq = (size_t)(r->total_q * c->hq * c->d), nk = (size_t)(r->total_k * c->hk * c->d);
    const size_t nv = (size_t)(r->total_k * c->hk * c->dv), no = (size_t)(r->total_q * c->hq * c->dv);
    r->q = malloc(nq * sizeof(double));
    r->k = malloc(nk * sizeof(double));
    r->v = malloc(nv * sizeof(double));
    alloc_mem(&r->mq, nq * es);
    alloc_mem(&r->mk, nk * es);
    alloc_mem(&r->mv, nv * es);
    alloc_mem(&r->mo, no * es);
    alloc_mem(&r->mlse, (size_t)(r->total_q * c->hq) * 4);
    alloc_mem(&r->msink, (size_t)c->hq * 4);
    alloc_mem(&r->mslope, (size_t)c->hq * 4);
    alloc_mem(&r->mcu_q, (size_t)(B + 1) * 4);
    alloc_mem(&r->mcu_k, (size_t)(B + 1) * 4);
    fill(&rng, c->dtype, r->q, r->mq.host, nq);
    fill(&rng, c->dtype, r->k, r->mk.host, nk);
    fill(&rng, c->dtype, r->v, r->mv.host, nv);
    r->sink = r->msink.host;
    r->slope = r->mslope.host;
    for (int64_t h = 0; h < c->hq; ++h) {
        r->sink[h] = (float)test_rng_uniform(&rng, -1.0, 3.0);
        r->slope[h] = (float)(exp2(-8.0 * (double)(h + 1) / (double)c->hq) * 2.0); /* ALiBi's geometric slopes, x2 */
    }
    int32_t *cq = r->mcu_q.host, *ck = r->mcu_k.host;
    for (int64_t b = 0; b <= B; ++b) {
        cq[b] = (int32_t)(b < B ? r->start_q[b] : r->total_q);
        ck[b] = (int32_t)(b < B ? r->start_k[b] : r->total_k);
    }
    test_mem_upload(&r->mq);
    test_mem_upload(&r->mk);
    test_mem_upload(&r->mv);
    test_mem_upload(&r->msink);
    test_mem_upload(&r->mslope);
    test_mem_upload(&r->mcu_q);
    test_mem_upload(&r->mcu_k);
}

static void data_free(run_data *r) {
    test_mem *all[] = {&r->mq, &r->mk, &r->mv, &r->mo, &r->mlse, &r->msink, &r->mslope, &r->mcu_q, &r->mcu_k, &r->mws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) test_mem_free(all[i]);
    free(r->q), free(r->k), free(r->v), free(r->len_q), free(r->len_k), free(r->start_q), free(r->start_k);
}

/* Row offsets of sequence b in the packed (varlen) or batched (fixed) layout: both are the token
 * index start + i, since fixed-length sequences are contiguous in batch order. */
static int64_t tok_q(const run_data *r, int64_t b, int64_t i) { return r->start_q[b] + i; }
static int64_t tok_k(const run_data *r, int64_t b, int64_t j) { return r->start_k[b] + j; }

/* alibi == 2: ALiBi with an explicit softmax scale of 2^-17, so that a slope in score units
 * (slope / scale) passes fp16's 65504 for the first heads' slopes (0.5 and up): FA3's ALiBi ramp
 * (the bias inside S = Q K^T, 16-bit parts of the slope) must fall back to the general bias there. */
static const double kTinyScale = 1.0 / 131072.0;

static flashattn_status_t set_keys(flashattn_plan_t *plan, const vcase *c, const run_data *r) {
    const struct { flashattn_i64_param_t key; int64_t value; } keys[] = {
        {FLASHATTN_I64_BATCH, c->batch}, {FLASHATTN_I64_SEQLEN_Q, c->sq}, {FLASHATTN_I64_SEQLEN_K, c->sk},
        {FLASHATTN_I64_HEADS_Q, c->hq}, {FLASHATTN_I64_HEADS_KV, c->hk}, {FLASHATTN_I64_HEAD_DIM, c->d},
        {FLASHATTN_I64_HEAD_DIM_V, c->dv}, {FLASHATTN_I64_DTYPE, c->dtype}, {FLASHATTN_I64_CAUSAL, c->causal},
        {FLASHATTN_I64_WINDOW_LEFT, c->wl}, {FLASHATTN_I64_WINDOW_RIGHT, c->wr},
        {FLASHATTN_I64_BACKEND, TEST_BACKEND}, {FLASHATTN_I64_VARLEN, c->varlen != 0},
        {FLASHATTN_I64_MASK_ALIGN, c->top_left ? FLASHATTN_MASK_ALIGN_TOP_LEFT : FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT},
        {FLASHATTN_I64_SINK_TOKENS, c->sink_tokens}, {FLASHATTN_I64_SINK_LOGITS, c->sinks},
        {FLASHATTN_I64_ALIBI, c->alibi != 0}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; ++i) {
        flashattn_status_t s = flashattn_plan_set_i64(plan, keys[i].key, keys[i].value);
        if (s != FLASHATTN_SUCCESS) return s;
    }
    if (c->varlen) {
        flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, r->total_q);
        flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, r->total_k);
    }
    if (c->softcap > 0) flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap);
    if (c->alibi == 2) flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, kTinyScale);
    return FLASHATTN_SUCCESS;
}

static void describe(char *buf, size_t n, const vcase *c) {
    snprintf(buf, n,
             "[%s b=%lld sq=%lld sk=%lld hq=%lld hk=%lld d=%lld dv=%lld %s causal=%d top_left=%d wl=%lld wr=%lld "
             "sink_tokens=%lld sinks=%d alibi=%d softcap=%g varlen=%d]",
             test_backend_name(TEST_BACKEND), (long long)c->batch, (long long)c->sq, (long long)c->sk,
             (long long)c->hq, (long long)c->hk, (long long)c->d, (long long)c->dv, test_dtype_name(c->dtype),
             c->causal, c->top_left, (long long)c->wl, (long long)c->wr, (long long)c->sink_tokens, c->sinks,
             c->alibi, c->softcap, c->varlen);
}

/* Finalize `c` on TEST_BACKEND. 1: ready; 0: refused as the backend documents (counted); -1: failed. */
static int make_plan(const vcase *c, const run_data *r, flashattn_plan_t **out) {
    char what[400];
    describe(what, sizeof what, c);
    flashattn_plan_t *plan = NULL;
    flashattn_plan_create(&plan);
    flashattn_status_t s = set_keys(plan, c, r);
    if (s == FLASHATTN_SUCCESS) s = flashattn_plan_finalize(plan);
    if (s == FLASHATTN_ERROR_NOT_SUPPORTED && TEST_BACKEND != FLASHATTN_BACKEND_CPU) {
        const char *msg = flashattn_last_error();
        const int named = strstr(msg, "top-left") || strstr(msg, "sink") || strstr(msg, "ALiBi") ||
                          strstr(msg, "head_dim_v");
        EXPECT(named, "%s refused without naming a variant: %s", what, msg);
        /* fa2 and fa3 run every forward variant (since issue 19), except sink tokens on fa3's head
         * dim 256 kernel (head dims above 192); fa1 top-left alignment only. */
        const int fa1_runs = !c->sinks && !c->alibi && c->sink_tokens == 0 && c->d == c->dv;
        const int fa3_runs = !(c->sink_tokens > 0 && (c->d > 192 || c->dv > 192));
        const int may_refuse = (TEST_BACKEND == FLASHATTN_BACKEND_FA1 && !fa1_runs) ||
                               (TEST_BACKEND == FLASHATTN_BACKEND_FA3 && !fa3_runs);
        EXPECT(may_refuse, "%s refused, but the backend runs these variants: %s", what, msg);
        if (test_verbose()) printf("refused %s: %s\n", what, msg);
        ++g_refused;
        flashattn_plan_destroy(plan);
        return 0;
    }
    EXPECT(s == FLASHATTN_SUCCESS, "%s finalize: %s", what, flashattn_last_error());
    if (s != FLASHATTN_SUCCESS) {
        flashattn_plan_destroy(plan);
        return -1;
    }
    *out = plan;
    return 1;
}

/* Gather sequence b, head h of a logical [tokens][heads][dim] array. */
static void gather(const double *src, int64_t start, int64_t n, int64_t heads, int64_t h, int64_t dim, double *dst) {
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < dim; ++c) dst[i * dim + c] = src[((start + i) * heads + h) * dim + c];
}

static ref_in ref_for(const run_data *r, int64_t b, int64_t h, double *q, double *k, double *v) {
    const vcase *c = &r->c;
    ref_in in;
    memset(&in, 0, sizeof in);
    const int64_t kvh = h / (c->hq / c->hk);
    gather(r->q, r->start_q[b], r->len_q[b], c->hq, h, c->d, q);
    gather(r->k, r->start_k[b], r->len_k[b], c->hk, kvh, c->d, k);
    gather(r->v, r->start_k[b], r->len_k[b], c->hk, kvh, c->dv, v);
    in.q = q, in.k = k, in.v = v;
    in.sq = r->len_q[b], in.sk = r->len_k[b], in.d = c->d, in.dv = c->dv;
    in.causal = c->causal, in.top_left = c->top_left, in.wl = c->wl, in.wr = c->wr;
    in.sink_tokens = c->sink_tokens, in.scale = c->alibi == 2 ? kTinyScale : 1.0 / sqrt((double)c->d), in.softcap = c->softcap;
    in.has_sink = c->sinks, in.sink = c->sinks ? (r->sink_d ? r->sink_d[h] : r->sink[h]) : 0.0, in.slope = c->alibi ? r->slope[h] : 0.0;
    return in;
}

static int64_t lse_at(const run_data *r, int64_t b, int64_t h, int64_t i) {
    return r->c.varlen ? h * r->total_q + r->start_q[b] + i : (b * r->c.hq + h) * r->c.sq + i;
}

/* Compare the library's O (host copy, contiguous) and LSE with the reference of every (b, h). */
static void check_against_reference(const run_data *r, const void *o_host, const float *lse_host, const char *what) {
    const vcase *c = &r->c;
    double *q = malloc(sizeof(double) * (size_t)(c->sq * c->d)), *k = malloc(sizeof(double) * (size_t)(c->sk * c->d));
    double *v = malloc(sizeof(double) * (size_t)(c->sk * c->dv + 1));
    double *o = malloc(sizeof(double) * (size_t)(c->sq * c->dv)), *lse = malloc(sizeof(double) * (size_t)c->sq);
    const double tol = out_tol(c->dtype);
    double max_err = 0.0, max_lse_err = 0.0;
    int bad = 0;
    for (int64_t b = 0; b < c->batch; ++b) {
        for (int64_t h = 0; h < c->hq; ++h) {
            ref_in in = ref_for(r, b, h, q, k, v);
            ref_attention(&in, o, lse);
            for (int64_t i = 0; i < in.sq && !bad; ++i) {
                const float got_lse = lse_host[lse_at(r, b, h, i)];
                if (lse[i] == -INFINITY) {
                    if (got_lse != -INFINITY) {
                        EXPECT(0, "%s LSE b=%lld h=%lld i=%lld: %g, want -inf", what, (long long)b, (long long)h,
                               (long long)i, got_lse);
                        bad = 1;
                    }
                } else {
                    const double e = fabs(got_lse - lse[i]);
                    if (!(e <= 1e-4 * (1 + fabs(lse[i])))) {
                        EXPECT(0, "%s LSE b=%lld h=%lld i=%lld: %.7g, want %.7g", what, (long long)b, (long long)h,
                               (long long)i, got_lse, lse[i]);
                        bad = 1;
                    }
                    if (e > max_lse_err) max_lse_err = e;
                }
                for (int64_t col = 0; col < c->dv && !bad; ++col) {
                    const size_t idx = (size_t)((tok_q(r, b, i) * c->hq + h) * c->dv + col);
                    const double got = test_load(c->dtype, (const unsigned char *)o_host + idx * test_dtype_size(c->dtype));
                    const double want = o[i * c->dv + col];
                    const double e = fabs(got - want);
                    if (!(e <= tol)) {
                        EXPECT(0, "%s O b=%lld h=%lld i=%lld c=%lld: %.7g, want %.7g", what, (long long)b, (long long)h,
                               (long long)i, (long long)col, got, want);
                        bad = 1;
                    }
                    if (e > max_err) max_err = e;
                }
            }
        }
    }
    if (test_verbose()) printf("%s max|O-ref| %.3g max|LSE-ref| %.3g\n", what, max_err, max_lse_err);
    free(q), free(k), free(v), free(o), free(lse);
}

static void poison_outputs(run_data *r) {
    test_poison(r->c.dtype, r->mo.host, r->mo.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, r->mlse.host, r->mlse.bytes);
    test_mem_upload(&r->mo);
    test_mem_upload(&r->mlse);
}

static flashattn_status_t execute(flashattn_plan_t *plan, run_data *r) {
    size_t ws = 0;
    flashattn_plan_get_workspace_size(plan, &ws);
    if (r->mws.bytes < ws) {
        test_mem_free(&r->mws);
        alloc_mem(&r->mws, ws);
    }
    flashattn_args_t *args = NULL;
    if (flashattn_args_create(&args) != FLASHATTN_SUCCESS) return FLASHATTN_ERROR_ALLOCATION;
    const struct { flashattn_arg_t which; const void *ptr; } set[] = {
        {FLASHATTN_ARG_Q, test_mem_ptr(&r->mq)}, {FLASHATTN_ARG_K, test_mem_ptr(&r->mk)},
        {FLASHATTN_ARG_V, test_mem_ptr(&r->mv)}, {FLASHATTN_ARG_O, test_mem_ptr(&r->mo)},
        {FLASHATTN_ARG_LSE, test_mem_ptr(&r->mlse)},
        {FLASHATTN_ARG_CU_SEQLENS_Q, r->c.varlen ? test_mem_ptr(&r->mcu_q) : NULL},
        {FLASHATTN_ARG_CU_SEQLENS_K, r->c.varlen ? test_mem_ptr(&r->mcu_k) : NULL},
        {FLASHATTN_ARG_SINK_LOGITS, r->c.sinks ? test_mem_ptr(&r->msink) : NULL},
        {FLASHATTN_ARG_ALIBI_SLOPES, r->c.alibi ? test_mem_ptr(&r->mslope) : NULL}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; ++i) flashattn_args_set(args, set[i].which, set[i].ptr);
    const flashattn_status_t s = flashattn_plan_execute_args(plan, args, ws ? test_mem_ptr(&r->mws) : NULL, ws, NULL);
    flashattn_args_destroy(args);
    return s;
}

static void run_forward_case(const vcase *c, uint64_t seed) {
    char what[400];
    describe(what, sizeof what, c);
    run_data r;
    data_init(&r, c, seed);
    flashattn_plan_t *plan = NULL;
    if (make_plan(c, &r, &plan) == 1) {
        poison_outputs(&r);
        const flashattn_status_t s = execute(plan, &r);
        EXPECT(s == FLASHATTN_SUCCESS, "%s execute: %s", what, flashattn_last_error());
        const char *err = test_device_error();
        EXPECT(err == NULL, "%s device: %s", what, err ? err : "");
        if (s == FLASHATTN_SUCCESS && err == NULL) {
            test_mem_download(&r.mo);
            test_mem_download(&r.mlse);
            check_against_reference(&r, r.mo.host, r.mlse.host, what);
            ++g_checked;
        }
        flashattn_plan_destroy(plan);
    }
    data_free(&r);
}

/* ---- Merge ------------------------------------------------------------------------------------ */

/* The keys [k0, k1) of every sequence of `r` as a run_data of their own (inputs copied; sequences
 * whose chunk is empty are not allowed here: chunks are cut inside the shortest sequence). */
static void chunk_of(const run_data *r, int64_t k0, int64_t k1, run_data *out, uint64_t seed) {
    vcase c = r->c;
    c.sk = k1 - k0;
    data_init(out, &c, seed);  /* fresh buffers; overwrite Q with r's and K/V with r's chunk */
    const size_t es = test_dtype_size(c.dtype);
    memcpy(out->q, r->q, sizeof(double) * (size_t)(r->total_q * c.hq * c.d));
    memcpy(out->mq.host, r->mq.host, (size_t)(r->total_q * c.hq * c.d) * es);
    memcpy(out->sink, r->sink, sizeof(float) * (size_t)c.hq);
    memcpy(out->slope, r->slope, sizeof(float) * (size_t)c.hq);
    for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t j = 0; j < out->len_k[b]; ++j) {
            const size_t src_k = (size_t)((r->start_k[b] + k0 + j) * c.hk * c.d), dst_k = (size_t)((out->start_k[b] + j) * c.hk * c.d);
            const size_t src_v = (size_t)((r->start_k[b] + k0 + j) * c.hk * c.dv), dst_v = (size_t)((out->start_k[b] + j) * c.hk * c.dv);
            memcpy(out->k + dst_k, r->k + src_k, sizeof(double) * (size_t)(c.hk * c.d));
            memcpy(out->v + dst_v, r->v + src_v, sizeof(double) * (size_t)(c.hk * c.dv));
            memcpy((unsigned char *)out->mk.host + dst_k * es, (unsigned char *)r->mk.host + src_k * es, (size_t)(c.hk * c.d) * es);
            memcpy((unsigned char *)out->mv.host + dst_v * es, (unsigned char *)r->mv.host + src_v * es, (size_t)(c.hk * c.dv) * es);
        }
    }
    test_mem_upload(&out->mq);
    test_mem_upload(&out->mk);
    test_mem_upload(&out->mv);
    test_mem_upload(&out->msink);
    test_mem_upload(&out->mslope);
}

/* fp16/bf16 O (host, n elements) to fp32, uploaded into `m`. */
static void to_fp32(flashattn_dtype_t dt, const void *src, size_t n, test_mem *m) {
    alloc_mem(m, n * 4);
    float *dst = m->host;
    for (size_t i = 0; i < n; ++i) dst[i] = (float)test_load(dt, (const unsigned char *)src + i * test_dtype_size(dt));
    test_mem_upload(m);
}

/* Split `whole`'s keys at `cuts` (n_chunks + 1 entries from 0 to sk) and run each chunk with
 * `chunk_cases[i]`'s mask; merge (fp32 partials when `fp32_partials`) on the first chunk's plan and
 * compare with the reference of `whole`. */
/* Up to 40 chunks: more than one warp's lanes of partials (the GPU merge kernel reads their LSEs
 * once per lane, and a second time beyond 32). */
#define MAX_MERGE_CHUNKS 40
static void run_merge_case(const vcase *whole, const int64_t *cuts, const vcase *chunk_masks, int n_chunks,
                           int fp32_partials, uint64_t seed) {
    char what[480], head[400];
    describe(head, sizeof head, whole);
    snprintf(what, sizeof what, "merge of %d%s %s", n_chunks, fp32_partials ? " fp32" : "", head);
    run_data r, parts[MAX_MERGE_CHUNKS];
    data_init(&r, whole, seed);
    flashattn_plan_t *plans[MAX_MERGE_CHUNKS] = {NULL};
    test_mem f32[MAX_MERGE_CHUNKS];
    memset(f32, 0, sizeof f32);
    int ready = 1;
    for (int i = 0; i < n_chunks; ++i) {
        chunk_of(&r, cuts[i], cuts[i + 1], &parts[i], seed + 100 + (uint64_t)i);
        parts[i].c.causal = chunk_masks[i].causal;
        parts[i].c.top_left = chunk_masks[i].top_left;
        const int made = make_plan(&parts[i].c, &parts[i], &plans[i]);
        if (made != 1) {
            ready = 0;
            plans[i] = NULL;
            continue;
        }
        poison_outputs(&parts[i]);
        const flashattn_status_t s = execute(plans[i], &parts[i]);
        EXPECT(s == FLASHATTN_SUCCESS, "%s chunk %d: %s", what, i, flashattn_last_error());
        if (s != FLASHATTN_SUCCESS) ready = 0;
    }
    if (ready) {
        const void *po[MAX_MERGE_CHUNKS];
        const float *pl[MAX_MERGE_CHUNKS];
        const size_t no = (size_t)(r.total_q * whole->hq * whole->dv);
        for (int i = 0; i < n_chunks; ++i) {
            if (fp32_partials) {
                test_mem_download(&parts[i].mo);
                to_fp32(whole->dtype, parts[i].mo.host, no, &f32[i]);
                po[i] = test_mem_ptr(&f32[i]);
            } else {
                po[i] = test_mem_ptr(&parts[i].mo);
            }
            pl[i] = test_mem_ptr(&parts[i].mlse);
        }
        poison_outputs(&r);
        const flashattn_status_t s = flashattn_plan_merge_states(
            plans[0], n_chunks, po, pl, fp32_partials ? FLASHATTN_DTYPE_FP32 : whole->dtype, test_mem_ptr(&r.mo),
            test_mem_ptr(&r.mlse), NULL);
        EXPECT(s == FLASHATTN_SUCCESS, "%s: %s", what, flashattn_last_error());
        const char *err = test_device_error();
        EXPECT(err == NULL, "%s device: %s", what, err ? err : "");
        if (s == FLASHATTN_SUCCESS && err == NULL) {
            test_mem_download(&r.mo);
            test_mem_download(&r.mlse);
            /* Partials rounded to fp16/bf16 before merging: allow two roundings. */
            r.c.dtype = whole->dtype;
            check_against_reference(&r, r.mo.host, r.mlse.host, what);
            ++g_checked;
        }
    }
    for (int i = 0; i < n_chunks; ++i) {
        flashattn_plan_destroy(plans[i]);
        data_free(&parts[i]);
        test_mem_free(&f32[i]);
    }
    data_free(&r);
}

static void merge_argument_checks(void) {
    vcase c = {1, 5, 7, 2, 2, 16, 16, FLASHATTN_DTYPE_FP32, 0, 0, -1, -1, 0, 0, 0, 0, 0};
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) c.dtype = FLASHATTN_DTYPE_FP16;
    run_data r;
    data_init(&r, &c, 7);
    flashattn_plan_t *plan = NULL;
    if (make_plan(&c, &r, &plan) == 1) {
        const void *po[2] = {test_mem_ptr(&r.mq), NULL};
        const float *pl[2] = {test_mem_ptr(&r.mlse), test_mem_ptr(&r.mlse)};
        EXPECT(flashattn_plan_merge_states(plan, 0, po, pl, c.dtype, test_mem_ptr(&r.mo), NULL, NULL) ==
                   FLASHATTN_ERROR_INVALID_ARGUMENT, "num_partials 0 accepted");
        EXPECT(flashattn_plan_merge_states(plan, FLASHATTN_MAX_MERGE_PARTIALS + 1, po, pl, c.dtype, test_mem_ptr(&r.mo),
                                           NULL, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "too many partials accepted");
        EXPECT(flashattn_plan_merge_states(plan, 2, po, pl, c.dtype, test_mem_ptr(&r.mo), NULL, NULL) ==
                   FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL partial accepted");
        EXPECT(strstr(flashattn_last_error(), "partial_o[1]") != NULL, "message: %s", flashattn_last_error());
        EXPECT(flashattn_plan_merge_states(plan, 1, po, pl, FLASHATTN_DTYPE_FP8_E4M3,
                                           test_mem_ptr(&r.mo), NULL, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT,
               "wrong partial dtype accepted");
        EXPECT(flashattn_plan_merge_states(plan, 1, po, pl, c.dtype, test_mem_ptr(&r.mlse), NULL, NULL) ==
                   FLASHATTN_ERROR_INVALID_ARGUMENT, "o overlapping a partial's LSE accepted");
        /* Argument-set rules: arrays the plan does not use, backward pointers in a forward call,
         * values outside the variants' ranges. */
        flashattn_args_t *args = NULL;
        flashattn_args_create(&args);
        flashattn_args_set(args, FLASHATTN_ARG_Q, test_mem_ptr(&r.mq));
        flashattn_args_set(args, FLASHATTN_ARG_K, test_mem_ptr(&r.mk));
        flashattn_args_set(args, FLASHATTN_ARG_V, test_mem_ptr(&r.mv));
        flashattn_args_set(args, FLASHATTN_ARG_O, test_mem_ptr(&r.mo));
        flashattn_args_set(args, FLASHATTN_ARG_SINK_LOGITS, test_mem_ptr(&r.msink));
        EXPECT(flashattn_plan_execute_args(plan, args, NULL, 0, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT,
               "sink logits accepted by a plan without them");
        EXPECT(strstr(flashattn_last_error(), "sink_logits") != NULL, "message: %s", flashattn_last_error());
        flashattn_args_set(args, FLASHATTN_ARG_SINK_LOGITS, NULL);
        flashattn_args_set(args, FLASHATTN_ARG_DQ, test_mem_ptr(&r.msink));
        EXPECT(flashattn_plan_execute_args(plan, args, NULL, 0, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT,
               "dq accepted by a forward call");
        {   /* A plan whose backward cannot run (fa3 forced: no backward) says so first. */
            flashattn_backend_t bb;
            const flashattn_status_t want = flashattn_plan_get_backward_backend(plan, &bb, NULL) == FLASHATTN_SUCCESS
                                                ? FLASHATTN_ERROR_INVALID_ARGUMENT
                                                : FLASHATTN_ERROR_NOT_SUPPORTED;
            EXPECT(flashattn_plan_execute_backward_args(plan, args, NULL, 0, NULL) == want,
                   "backward without dout: not %s", flashattn_status_string(want));
        }
        EXPECT(flashattn_args_set(args, (flashattn_arg_t)25, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "arg 25 accepted");
        EXPECT(flashattn_args_set(args, (flashattn_arg_t)34, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT, "arg 34 accepted");
        flashattn_args_destroy(args);
        flashattn_plan_destroy(plan);
    }
    /* A plan with sink logits refuses the 0.2 entry point and a missing array. */
    c.sinks = 1;
    if (make_plan(&c, &r, &plan) == 1) {
        EXPECT(flashattn_plan_execute(plan, test_mem_ptr(&r.mq), test_mem_ptr(&r.mk), test_mem_ptr(&r.mv),
                                      test_mem_ptr(&r.mo), NULL, NULL, 0, NULL) == FLASHATTN_ERROR_INVALID_ARGUMENT,
               "flashattn_plan_execute ran a plan with sink logits");
        EXPECT(strstr(flashattn_last_error(), "sink_logits") != NULL, "message: %s", flashattn_last_error());
        int64_t v = -1;
        flashattn_plan_get_i64(plan, FLASHATTN_I64_SINK_LOGITS, &v);
        EXPECT(v == 1, "get_i64(SINK_LOGITS) = %lld", (long long)v);
        flashattn_plan_destroy(plan);
    }
    EXPECT(flashattn_plan_set_i64(NULL, FLASHATTN_I64_MASK_ALIGN, 1) == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL plan");
    flashattn_plan_create(&plan);
    EXPECT(flashattn_plan_set_i64(plan, FLASHATTN_I64_MASK_ALIGN, 2) == FLASHATTN_ERROR_INVALID_ARGUMENT, "align 2");
    EXPECT(flashattn_plan_set_i64(plan, FLASHATTN_I64_SINK_TOKENS, -1) == FLASHATTN_ERROR_INVALID_ARGUMENT, "sinks -1");
    EXPECT(flashattn_plan_set_i64(plan, FLASHATTN_I64_ALIBI, 2) == FLASHATTN_ERROR_INVALID_ARGUMENT, "alibi 2");
    EXPECT(flashattn_plan_set_i64(plan, (flashattn_i64_param_t)64, 0) == FLASHATTN_ERROR_INVALID_ARGUMENT, "key 64");
    flashattn_plan_destroy(plan);
    data_free(&r);
}

/* ---- Backward by finite differences (CPU) ---------------------------------------------------- */

/* L = sum over every (b, h, i, c) of O_ref * G, with the reference run on r's inputs (sink and
 * slope arrays included), in double. */
static double loss(const run_data *r, const double *g) {
    const vcase *c = &r->c;
    double *q = malloc(sizeof(double) * (size_t)(c->sq * c->d)), *k = malloc(sizeof(double) * (size_t)(c->sk * c->d));
    double *v = malloc(sizeof(double) * (size_t)(c->sk * c->dv));
    double *o = malloc(sizeof(double) * (size_t)(c->sq * c->dv)), *lse = malloc(sizeof(double) * (size_t)c->sq);
    double sum = 0.0;
    for (int64_t b = 0; b < c->batch; ++b)
        for (int64_t h = 0; h < c->hq; ++h) {
            ref_in in = ref_for(r, b, h, q, k, v);
            ref_attention(&in, o, lse);
            for (int64_t i = 0; i < in.sq; ++i)
                for (int64_t col = 0; col < c->dv; ++col)
                    sum += o[i * c->dv + col] * g[((tok_q(r, b, i)) * c->hq + h) * c->dv + col];
        }
    free(q), free(k), free(v), free(o), free(lse);
    return sum;
}

static double fd(run_data *r, const double *g, double *x) {
    const double eps = 1e-4;
    const double x0 = *x;
    *x = x0 + eps;
    const double lp = loss(r, g);
    *x = x0 - eps;
    const double lm = loss(r, g);
    *x = x0;
    return (lp - lm) / (2 * eps);
}

/* Gradient tolerance: fp32 (cpu) 2e-4 (1 + |fd|); fp16 / bf16 (gpu: the kernels round P and dS
 * to the input type) 1.5e-2 / 6e-2 (1 + |fd|), far below what a wrong mask or sink term gives. */
static double grad_tol(flashattn_dtype_t dt) {
    return dt == FLASHATTN_DTYPE_FP32 ? 2e-4 : dt == FLASHATTN_DTYPE_FP16 ? 1.5e-2 : 6e-2;
}

/* The library's gradient of L = sum(O * G) (dO = G in the plan's dtype) against central finite
 * differences of L through the double reference (the GPU's inputs are the dtype-rounded values the
 * reference also sees). Each tensor is checked at up to 400 elements spread over it. The cpu, fa2
 * and fa3 backward passes run every variant (fa1 has none: it refuses by name). */
static int backward_runs(const vcase *c) {
    (void)c;
    return TEST_BACKEND != FLASHATTN_BACKEND_FA1;
}

static void run_gradient_case(const vcase *c, uint64_t seed) {
    char what[400];
    describe(what, sizeof what, c);
    run_data r;
    data_init(&r, c, seed);
    flashattn_plan_t *plan = NULL;
    if (make_plan(c, &r, &plan) != 1) {
        data_free(&r);
        return;
    }
    flashattn_backend_t bb;
    if (flashattn_plan_get_backward_backend(plan, &bb, NULL) == FLASHATTN_ERROR_NOT_SUPPORTED) {
        const char *msg = flashattn_last_error();
        EXPECT(!backward_runs(c) && (strstr(msg, "sink") || strstr(msg, "head_dim_v")),
               "%s backward refused: %s", what, msg);
        ++g_refused;
        flashattn_plan_destroy(plan);
        data_free(&r);
        return;
    }
    const flashattn_dtype_t dt = c->dtype;
    const size_t es = test_dtype_size(dt);
    const size_t no = (size_t)(r.total_q * c->hq * c->dv), nq = (size_t)(r.total_q * c->hq * c->d);
    const size_t nk = (size_t)(r.total_k * c->hk * c->d), nv = (size_t)(r.total_k * c->hk * c->dv);
    test_rng rng;
    test_rng_seed(&rng, seed ^ 0x5eed);
    double *g = malloc(no * sizeof(double));
    test_mem mdo, mdq, mdk, mdv, mds, mws;
    alloc_mem(&mdo, no * es), alloc_mem(&mdq, nq * es), alloc_mem(&mdk, nk * es), alloc_mem(&mdv, nv * es);
    alloc_mem(&mds, (size_t)c->hq * 4);
    fill(&rng, dt, g, mdo.host, no);
    test_mem_upload(&mdo);
    poison_outputs(&r);
    EXPECT(execute(plan, &r) == FLASHATTN_SUCCESS, "%s forward: %s", what, flashattn_last_error());
    size_t ws = 0;
    flashattn_plan_get_backward_workspace_size(plan, &ws);
    alloc_mem(&mws, ws);
    test_poison(dt, mdq.host, mdq.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, mds.host, mds.bytes);
    test_mem_upload(&mdq);
    test_mem_upload(&mds);
    flashattn_args_t *args = NULL;
    flashattn_args_create(&args);
    const struct { flashattn_arg_t which; const void *ptr; } set[] = {
        {FLASHATTN_ARG_Q, test_mem_ptr(&r.mq)}, {FLASHATTN_ARG_K, test_mem_ptr(&r.mk)},
        {FLASHATTN_ARG_V, test_mem_ptr(&r.mv)}, {FLASHATTN_ARG_O, test_mem_ptr(&r.mo)},
        {FLASHATTN_ARG_LSE, test_mem_ptr(&r.mlse)}, {FLASHATTN_ARG_DOUT, test_mem_ptr(&mdo)},
        {FLASHATTN_ARG_DQ, test_mem_ptr(&mdq)}, {FLASHATTN_ARG_DK, test_mem_ptr(&mdk)}, {FLASHATTN_ARG_DV, test_mem_ptr(&mdv)},
        {FLASHATTN_ARG_CU_SEQLENS_Q, c->varlen ? test_mem_ptr(&r.mcu_q) : NULL},
        {FLASHATTN_ARG_CU_SEQLENS_K, c->varlen ? test_mem_ptr(&r.mcu_k) : NULL},
        {FLASHATTN_ARG_SINK_LOGITS, c->sinks ? test_mem_ptr(&r.msink) : NULL},
        {FLASHATTN_ARG_ALIBI_SLOPES, c->alibi ? test_mem_ptr(&r.mslope) : NULL},
        {FLASHATTN_ARG_DSINK_LOGITS, c->sinks ? test_mem_ptr(&mds) : NULL}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; ++i) flashattn_args_set(args, set[i].which, set[i].ptr);
    const flashattn_status_t s = flashattn_plan_execute_backward_args(plan, args, ws ? test_mem_ptr(&mws) : NULL, ws, NULL);
    flashattn_args_destroy(args);
    EXPECT(s == FLASHATTN_SUCCESS, "%s backward: %s", what, flashattn_last_error());
    const char *err = test_device_error();
    EXPECT(err == NULL, "%s device: %s", what, err ? err : "");
    if (s == FLASHATTN_SUCCESS && err == NULL) {
        test_mem_download(&mdq), test_mem_download(&mdk), test_mem_download(&mdv), test_mem_download(&mds);
        const double tol = grad_tol(dt);
        struct { double *x; const unsigned char *grad; size_t n; const char *name; } sets[] = {
            {r.q, mdq.host, nq, "dQ"}, {r.k, mdk.host, nk, "dK"}, {r.v, mdv.host, nv, "dV"}};
        double max_err = 0.0;
        for (int t = 0; t < 3; ++t) {
            const size_t step = sets[t].n > 400 ? sets[t].n / 400 : 1;
            for (size_t i = 0; i < sets[t].n; i += step) {
                const double got = test_load(dt, sets[t].grad + i * es);
                const double want = fd(&r, g, &sets[t].x[i]);
                const double e = fabs(got - want);
                if (e > max_err) max_err = e;
                if (!(e <= tol * (1 + fabs(want)))) {
                    EXPECT(0, "%s %s[%zu] = %.7g, finite differences %.7g", what, sets[t].name, i, got, want);
                    break;
                }
            }
        }
        if (c->sinks) {
            const float *dsink = mds.host;
            double sink_d[64];
            for (int64_t h = 0; h < c->hq; ++h) sink_d[h] = r.sink[h];
            r.sink_d = sink_d;
            for (int64_t h = 0; h < c->hq; ++h) {
                const double want = fd(&r, g, &sink_d[h]);
                const double e = fabs(dsink[h] - want);
                if (e > max_err) max_err = e;
                EXPECT(e <= tol * (1 + fabs(want)), "%s dsink[%lld] = %.7g, finite differences %.7g", what,
                       (long long)h, dsink[h], want);
            }
        }
        r.sink_d = NULL;
        if (test_verbose()) printf("%s gradients: max|grad - fd| %.3g\n", what, max_err);
        ++g_checked;
    }
    test_mem_free(&mdo), test_mem_free(&mdq), test_mem_free(&mdk), test_mem_free(&mdv), test_mem_free(&mds);
    test_mem_free(&mws);
    free(g);
    flashattn_plan_destroy(plan);
    data_free(&r);
}

/* ---- The grid ---------------------------------------------------------------------------------- */

#define F32 FLASHATTN_DTYPE_FP32
#define F16 FLASHATTN_DTYPE_FP16
#define B16 FLASHATTN_DTYPE_BF16

/* batch, sq, sk, hq, hk, d, dv, dtype, causal, top_left, wl, wr, sink_tokens, sinks, alibi, softcap, varlen */
static const vcase forward_grid[] = {
    /* Top-left causal, seqlen_q != seqlen_k both ways (PyTorch's is_causal: j <= i). */
    {2, 37, 53, 4, 2, 64, 64, F16, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {2, 53, 37, 4, 2, 64, 64, B16, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {1, 129, 100, 2, 1, 128, 128, F16, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {3, 40, 70, 4, 4, 64, 64, F16, 1, 1, 8, -1, 0, 0, 0, 0, 1},
    {2, 61, 61, 2, 2, 32, 32, F32, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    /* Sink tokens with sliding windows (both alignments, causal and not). */
    {2, 100, 100, 4, 2, 64, 64, F16, 1, 0, 16, -1, 4, 0, 0, 0, 0},
    {2, 77, 130, 2, 1, 64, 64, B16, 0, 0, 9, 5, 3, 0, 0, 0, 0},
    {2, 130, 77, 4, 4, 128, 128, F16, 1, 1, 20, -1, 1, 0, 0, 0, 0},
    {3, 90, 90, 2, 2, 64, 64, F32, 1, 0, 7, -1, 70, 0, 0, 0, 1},
    /* Sink logits: plain, causal (rows that see nothing get LSE = sink), windows, softcap. */
    {2, 37, 53, 4, 2, 64, 64, F16, 0, 0, -1, -1, 0, 1, 0, 0, 0},
    {2, 60, 30, 4, 4, 64, 64, B16, 1, 0, -1, -1, 0, 1, 0, 0, 0},
    {2, 45, 45, 2, 1, 128, 128, F16, 1, 0, 8, -1, 2, 1, 0, 30.0, 0},
    {2, 33, 70, 2, 2, 32, 32, F32, 0, 0, -1, -1, 0, 1, 0, 0, 1},
    /* ALiBi: seqlen_q != seqlen_k both ways, causal, windows, top-left, with sinks. */
    {2, 37, 90, 4, 2, 64, 64, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 90, 37, 4, 2, 64, 64, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 50, 80, 2, 2, 128, 128, F16, 1, 1, 16, -1, 0, 1, 1, 0, 0},
    {2, 64, 64, 6, 2, 64, 64, F32, 0, 0, 10, 10, 2, 1, 1, 0, 1},
    /* Several key tiles per row on the GPUs (64/128/176-key tiles): ALiBi on every tile, sink
     * tokens far below the window (the tiles between are skipped), both with split-KV decode
     * shapes (split 0 walks the sink tiles) and pack-GQA, soft cap, varlen, every alignment. */
    {1, 300, 700, 4, 2, 128, 128, B16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 260, 190, 4, 1, 64, 64, F16, 1, 1, -1, -1, 0, 0, 1, 0, 0},
    {1, 190, 260, 2, 2, 256, 256, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 100, 150, 2, 1, 128, 128, F16, 1, 0, -1, -1, 0, 1, 1, 30.0, 0},
    {1, 400, 900, 2, 2, 128, 128, B16, 1, 0, 100, -1, 5, 0, 0, 0, 0},
    {1, 600, 600, 2, 1, 64, 64, F16, 1, 0, 64, -1, 150, 0, 0, 0, 0},
    {2, 333, 333, 4, 2, 96, 96, F16, 0, 0, 40, 40, 70, 1, 0, 0, 0},
    {3, 200, 500, 4, 2, 64, 64, F16, 1, 0, 50, -1, 4, 1, 1, 0, 1},
    {2, 230, 170, 2, 2, 192, 192, B16, 1, 1, 30, -1, 8, 0, 1, 0, 0},
    {1, 1, 3000, 8, 1, 128, 128, B16, 1, 0, 256, -1, 4, 0, 1, 0, 0},
    {2, 5, 2500, 4, 2, 64, 64, F16, 0, 0, 300, 0, 16, 1, 0, 0, 0},
    {1, 3, 4000, 16, 2, 128, 128, F16, 1, 0, -1, -1, 0, 1, 1, 0, 0},
    /* FA3's sink kernel (1..16 sink tokens: the sink tile below the window 16 keys wide) and
     * main's kernel past it (17): one sink token with GQA and varlen, 16 with a soft cap, 17 with
     * sink logits, sq > sk and sq < sk, windows far above key tile 0; ALiBi with a soft cap on
     * (192, 128) (no ramp kernel then: the sink kernel's general bias on its narrow tile; the square
     * 192 has no sink kernel), a two-sided window on (64, 128). Six, so
     * that FLASHATTN_TEST_REDUCED's every third case stays the same after them. */
    {2, 500, 500, 2, 2, 128, 128, F16, 1, 0, 200, -1, 16, 0, 0, 30.0, 0},
    {2, 300, 700, 4, 2, 128, 128, B16, 1, 0, 150, -1, 1, 0, 0, 0, 1},
    {1, 600, 450, 4, 1, 64, 64, F16, 1, 0, 100, -1, 17, 0, 0, 0, 0},
    {1, 300, 900, 4, 2, 128, 128, B16, 1, 0, 128, -1, 17, 1, 0, 0, 1},
    {1, 400, 800, 2, 2, 192, 128, F16, 1, 0, 150, -1, 4, 0, 1, 20.0, 0},
    {2, 200, 600, 4, 2, 64, 128, B16, 0, 0, 100, 50, 8, 0, 0, 0, 0},
    /* ALiBi tiles wholly left or right of every row's diagonal (FA2/FA3 give their bias as a row
     * offset to the softmax): long rows both ways, pack-GQA, sq > sk, sink tokens with ALiBi. */
    {1, 257, 2100, 4, 1, 128, 128, B16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 700, 300, 2, 2, 64, 64, F16, 0, 0, -1, -1, 0, 0, 1, 0, 1},
    {1, 500, 1500, 4, 2, 128, 128, B16, 1, 0, 300, -1, 4, 0, 1, 0, 0},
    /* ... FA2's two-m16-tile kernels (128-row tiles, head dims <= 128; at 32 and 96 the bias of
     * one query head per CTA is the first k-step's C operand): tiles left and right of every row's
     * diagonal (sq > sk), fp16; pack-GQA on the 128-row tile (sq 90-100, several heads per kv
     * head), which keeps the per-score bias; a soft cap, whose bias comes after the cap. */
    {1, 300, 700, 2, 2, 32, 32, B16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 500, 200, 2, 2, 96, 96, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 600, 250, 2, 2, 128, 128, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 90, 800, 4, 2, 96, 96, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 100, 1000, 4, 1, 128, 128, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 200, 900, 2, 2, 96, 96, B16, 1, 0, -1, -1, 0, 0, 1, 30.0, 0},
    /* FA3's ALiBi kernels whose column bias is one more k16 slice of S = Q K^T (head dims 64, 128,
     * 192 and the pairs (64, 128), (192, 128)): one-sided tiles left and right of the diagonal over
     * many key tiles, fp16 and bf16, pack-GQA, windows, sink logits with varlen. */
    {1, 400, 900, 4, 2, 64, 128, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 600, 300, 2, 2, 64, 128, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 300, 800, 2, 2, 192, 192, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 500, 300, 2, 1, 192, 128, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 280, 1200, 8, 2, 64, 64, F16, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 700, 900, 2, 2, 128, 128, F16, 0, 0, 200, 50, 0, 0, 1, 0, 0},
    {2, 350, 600, 4, 2, 128, 128, B16, 0, 0, -1, -1, 0, 1, 1, 0, 1},
    /* ... with slopes in score units past fp16's range on the first heads (alibi 2: tiny scale). */
    {1, 300, 700, 4, 2, 128, 128, F16, 0, 0, -1, -1, 0, 0, 2, 0, 0},
    {1, 500, 260, 4, 4, 64, 64, F16, 1, 0, -1, -1, 0, 0, 2, 0, 0},
    /* head_dim_v != head_dim: (192, 128), (128, 64), (256, 128), (64, 128). */
    {2, 77, 93, 4, 2, 192, 128, B16, 1, 0, -1, -1, 0, 0, 0, 0, 0},
    {2, 50, 65, 4, 4, 128, 64, F16, 0, 0, -1, -1, 0, 0, 0, 0, 0},
    {1, 65, 50, 2, 1, 256, 128, F16, 1, 0, -1, -1, 0, 0, 0, 0, 0},
    {2, 45, 45, 2, 2, 64, 128, B16, 0, 0, -1, -1, 0, 1, 1, 0, 1},
    /* ... over several key tiles, split-KV decode, pack-GQA, varlen; dv < d and dv > d. */
    {1, 300, 520, 4, 2, 192, 128, B16, 1, 0, -1, -1, 0, 0, 0, 0, 0},
    {2, 140, 260, 2, 1, 256, 64, F16, 0, 1, 64, -1, 3, 1, 0, 0, 1},
    {1, 2, 3000, 8, 2, 192, 128, B16, 1, 0, -1, -1, 0, 1, 0, 0, 0},
    {2, 170, 170, 4, 4, 32, 96, F16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 90, 200, 2, 2, 96, 256, B16, 0, 0, -1, -1, 0, 0, 0, 0, 0},
    /* FA3's kernels with V of its own width (fa3_head_dims.h P rows: 64x128, 128x64, 192x128,
     * 256x128) over several of their key tiles, and pairs that run on them zero-padded. */
    {2, 300, 520, 4, 2, 192, 128, F16, 0, 0, -1, -1, 0, 0, 0, 0, 1},
    {1, 257, 700, 2, 2, 192, 128, B16, 1, 0, 100, -1, 4, 1, 1, 0, 0},
    {2, 200, 333, 4, 1, 176, 120, B16, 1, 1, -1, -1, 0, 0, 0, 30.0, 0},
    {1, 129, 385, 2, 2, 192, 64, F16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 260, 390, 2, 1, 256, 128, B16, 0, 0, -1, -1, 0, 1, 1, 0, 1},
    {2, 150, 300, 4, 2, 200, 96, F16, 1, 0, -1, -1, 0, 0, 0, 0, 0},
    {2, 300, 260, 2, 2, 128, 64, B16, 1, 0, 64, -1, 2, 0, 1, 0, 0},
    {1, 333, 200, 4, 4, 120, 40, F16, 0, 0, -1, -1, 0, 0, 0, 0, 1},
    {2, 270, 410, 4, 2, 64, 128, B16, 1, 0, -1, -1, 0, 1, 0, 0, 0},
    {1, 130, 260, 2, 1, 48, 104, F16, 0, 1, 30, 30, 3, 0, 0, 0, 0},
    {2, 97, 203, 4, 2, 64, 128, F16, 0, 0, -1, -1, 0, 1, 0, 0, 1},
};

static const vcase gradient_grid[] = {
    {1, 5, 7, 2, 1, 8, 8, F32, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {1, 7, 5, 2, 2, 8, 16, F32, 0, 0, 2, 1, 1, 0, 0, 0, 0},
    {2, 6, 6, 2, 1, 8, 8, F32, 1, 0, -1, -1, 0, 1, 0, 0, 0},
    {1, 6, 9, 2, 2, 16, 8, F32, 0, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 7, 7, 2, 2, 8, 8, F32, 1, 1, 2, -1, 2, 1, 1, 20.0, 1},
};

/* The GPU backward (fa2, fa3): top-left alignment, sink logits, ALiBi (with a soft cap: its bias
 * joins the capped score), sink tokens under left windows (keys between the sinks and the window
 * inside a sink block; several sink blocks) and head_dim_v != head_dim both ways over several key
 * tiles, sq != sk both ways, GQA, windows, varlen, head dims 16-256 (fa3's 64, 128 and 256
 * kernels). */
static const vcase gpu_gradient_grid[] = {
    {1, 37, 53, 2, 1, 16, 16, F16, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {2, 53, 37, 2, 2, 32, 32, B16, 1, 1, 8, -1, 0, 0, 0, 0, 0},
    {1, 100, 130, 2, 1, 16, 16, F16, 1, 1, -1, -1, 0, 0, 0, 0, 0},
    {2, 40, 40, 4, 2, 32, 32, F16, 1, 0, -1, -1, 0, 1, 0, 0, 0},
    {2, 30, 70, 2, 2, 16, 16, F16, 0, 0, -1, -1, 0, 1, 0, 0, 1},
    {1, 90, 70, 2, 1, 16, 16, B16, 1, 1, 20, -1, 0, 1, 0, 0, 0},
    {1, 20, 20, 2, 2, 16, 16, F16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 20, 20, 2, 2, 16, 16, F16, 1, 0, 4, -1, 2, 0, 0, 0, 0},
    {1, 70, 90, 2, 1, 16, 16, B16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {2, 60, 45, 2, 2, 32, 32, F16, 0, 0, 20, 10, 0, 0, 1, 0, 1},
    {1, 50, 80, 2, 2, 16, 16, F16, 1, 1, -1, -1, 0, 1, 1, 20.0, 0},
    {1, 40, 70, 2, 1, 16, 32, F16, 1, 0, -1, -1, 0, 0, 0, 0, 0},
    {1, 70, 40, 2, 2, 32, 16, B16, 0, 0, -1, -1, 0, 1, 0, 0, 0},
    {1, 130, 150, 2, 1, 128, 128, B16, 1, 1, -1, -1, 0, 1, 1, 0, 0},
    {1, 70, 100, 2, 2, 256, 256, F16, 1, 0, 30, -1, 0, 0, 1, 0, 0},
    {1, 60, 60, 2, 2, 64, 128, F16, 1, 0, -1, -1, 0, 0, 1, 0, 0},
    {1, 90, 140, 2, 2, 128, 64, B16, 0, 0, -1, -1, 0, 1, 1, 15.0, 0},
    {1, 150, 170, 2, 1, 16, 16, F16, 1, 0, 20, -1, 5, 0, 0, 0, 0},
    {2, 100, 210, 2, 2, 32, 32, B16, 0, 0, 30, 40, 140, 1, 0, 0, 1},
    {1, 160, 160, 2, 2, 64, 64, F16, 1, 1, 10, -1, 70, 0, 1, 0, 0},
};

int main(void) {
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) test_skip_without_gpu();
    uint64_t seed = 0x19a11b1;
    const char *env = getenv("FLASHATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 0);
    const int reduced = getenv("FLASHATTN_TEST_REDUCED") != NULL;
    printf("test_variants on %s, seed %#llx\n", test_backend_name(TEST_BACKEND), (unsigned long long)seed);

    for (size_t i = 0; i < sizeof forward_grid / sizeof forward_grid[0]; ++i) {
        if (reduced && i % 3 != 0) continue;
        vcase c = forward_grid[i];
        if (TEST_BACKEND != FLASHATTN_BACKEND_CPU && c.dtype == F32) c.dtype = F16;
        run_forward_case(&c, seed + i);
    }

    /* Merge (a): causal split into a top-left prefix and a bottom-right suffix; (b) three chunks. */
    const flashattn_dtype_t mdt = TEST_BACKEND == FLASHATTN_BACKEND_CPU ? F32 : B16;
    {
        vcase whole = {2, 70, 70, 4, 2, 64, 64, mdt, 1, 0, -1, -1, 0, 0, 0, 0, 0};
        const int64_t cuts[] = {0, 25, 70};
        vcase masks[2] = {whole, whole};
        masks[0].top_left = 1;
        run_merge_case(&whole, cuts, masks, 2, 0, seed + 50);
        vcase full = {2, 33, 150, 4, 4, 128, 128, mdt, 0, 0, -1, -1, 0, 0, 0, 0, 0};
        const int64_t cuts3[] = {0, 40, 41, 150};
        vcase masks3[3] = {full, full, full};
        run_merge_case(&full, cuts3, masks3, 3, 1, seed + 60);
        run_merge_case(&full, cuts3, masks3, 3, 0, seed + 70);
        full.varlen = 2;
        full.batch = 3;
        run_merge_case(&full, cuts3, masks3, 3, 0, seed + 80);
        run_merge_case(&full, cuts3, masks3, 3, 1, seed + 90);
        /* (c) many chunks, uneven (one key up to 30): 9 at head dim 128 (the kernel's lane groups
         * split the partials unevenly), 36 at head dim 64, varlen. */
        vcase many = {2, 41, 200, 4, 2, 128, 128, mdt, 0, 0, -1, -1, 0, 0, 0, 0, 0};
        const int64_t cuts9[] = {0, 1, 30, 31, 60, 90, 100, 130, 170, 200};
        vcase masks9[9];
        for (int i = 0; i < 9; ++i) masks9[i] = many;
        run_merge_case(&many, cuts9, masks9, 9, 0, seed + 100);
        run_merge_case(&many, cuts9, masks9, 9, 1, seed + 110);
        vcase lots = {3, 60, 150, 4, 4, 64, 64, mdt, 0, 0, -1, -1, 0, 0, 0, 0, 2};
        int64_t cuts36[37];
        vcase masks36[36];
        for (int i = 0; i <= 36; ++i) cuts36[i] = i < 36 ? (int64_t)(i * 4) : 150;
        for (int i = 0; i < 36; ++i) masks36[i] = lots;
        run_merge_case(&lots, cuts36, masks36, 36, 0, seed + 120);
    }
    merge_argument_checks();

    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) {
        for (size_t i = 0; i < sizeof gradient_grid / sizeof gradient_grid[0]; ++i)
            run_gradient_case(&gradient_grid[i], seed + 200 + i);
    } else if (TEST_BACKEND == FLASHATTN_BACKEND_FA2 || TEST_BACKEND == FLASHATTN_BACKEND_FA3) {
        for (size_t i = 0; i < sizeof gpu_gradient_grid / sizeof gpu_gradient_grid[0]; ++i)
            if (!reduced || i % 3 == 0) run_gradient_case(&gpu_gradient_grid[i], seed + 300 + i);
    }
    printf("test_variants: %d cases checked, %d refused as documented, %d failures\n", g_checked, g_refused,
           g_failures);
    return g_failures == 0 ? 0 : 1;
}
