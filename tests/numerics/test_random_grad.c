/* The backward pass of one backend (TEST_BACKEND) on a random mix: every case draws its shape and
 * its features at random, so that the gradients meet combinations no grid lists. Built once per
 * backend: test_random_grad_cpu (label cpu), test_random_grad_fa2 and _fa3 (label gpu, skipped
 * without a GPU; the forward and the backward forced to the backend, as test_backward does).
 *
 * A case: dtype (fp32, fp16, bf16 on the cpu; fp16, bf16 on GPUs), batch 1-3, seqlen_q and seqlen_k
 * independently 1..200, GQA/MQA groups, head_dim 8..256 in steps of 8 and sometimes another
 * head_dim_v, and each of causal, top-left alignment, left and right windows (some of them wider
 * than everything), soft cap, explicit scale, variable length (empty sequences included), sink
 * tokens, sink logits, ALiBi (slopes of both signs), strided tensors (every gap NaN) and the
 * deterministic flag with probability 30-50%; a run through the 0.2 entry points or the argument
 * set (always the latter with sink logits or ALiBi, which the 0.2 calls refuse).
 *
 * Flow: the library's forward (O, LSE), then its backward with dQ, dK, dV, dsink and the workspace
 * poisoned; every element of every gradient is checked, the stride gaps must hold the poison, rows
 * that see no key must have dQ = 0 and keys no query sees dK = dV = 0 exactly, the inputs (sink
 * logits, slopes and cu_seqlens too) must be unchanged, and a second backward must give the same
 * bits (always on the cpu; with FLASHATTN_I64_DETERMINISTIC = 1 on GPUs).
 *
 * References. Cases the tests' common reference covers (no top-left alignment that moves a mask,
 * no sink tokens under a left window, no sink logits, no ALiBi): grad_reference(), and for
 * fp16/bf16 grad_reference_lowp() (the naive algorithm in the dtype). The others: this file's
 * double reference (vref below, written from the header's definitions: analytic gradient, each
 * row's scores materialised). Each run first checks vref against central finite differences of
 * L = sum(O_ref * dO) through vref's own double forward on tiny random shapes (every feature).
 *
 * Bounds, per tensor unless said: test_backward.c's rule, fp16/bf16 2 max|naive - ref| + 1e-4
 * max|ref| + floor, fp32 2e-5 max|ref| + floor (vref's cases too); fp16/bf16 with vref (no naive
 * baseline) test_variants.c's per element, (1 + |ref|) times 1.5e-2 (fp16) or 6e-2 (bf16), and
 * dsink (1 + |ref|) times those or 2e-4 (fp32). Three terms that random shapes need and the grids
 * never met: the floor (test_backward.c's 1e-6 for fp32 noise where the exact gradient is 0)
 * grows with head_dim_v, the scale and the rows summed (noise_floor()); every dtype's bound grows
 * by 2^-20 max|s| max|ref| (the largest score, ALiBi's bias included, or scale sum |q k|: P =
 * exp(s - LSE) is fp32 for every dtype and carries ~2^-24 (|s| + |LSE|) of relative error, and an
 * fp32 Q.K up to ~2^-24 sum |q k| where it cancels; far below 2e-5 at the grids' scores of a few
 * units, 1e-3 of max|ref| at scale 52); and every
 * bound adds twice how far the exact gradient moves when D = rowsum(dO * O) takes O rounded to the
 * dtype, as the library's backward does, and Q K^T is summed in fp32 (arithmetic_effect()): under
 * a peaked softmax (large explicit scales) that is nearly all of the library's error, several
 * times the naive baseline; under a tiny soft cap the fp32 scores' rounding is.
 *
 * The fa2 and fa3 backward passes run every variant (a refusal of one is a failure); forward
 * refusals on GPU backends (fa3: sink tokens above head dim 192, ...) are counted and printed, and
 * must name the reason. On the cpu every case must run.
 *
 * FLASHATTN_TEST_SEED picks the cases (the seed of case i is test_case_seed(seed, i));
 * FLASHATTN_TEST_MIX_CASES=n runs n random cases; FLASHATTN_TEST_MIX_ONLY=i runs case i alone (to
 * reproduce a failure, whose line prints both); FLASHATTN_TEST_REDUCED=1 runs a quarter of them;
 * FLASHATTN_TEST_VERBOSE=1 prints every case with its errors. */
#define _POSIX_C_SOURCE 200112L /* setenv, unsetenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_backward_reference.h"
#include "test_expect.h"
#include "test_runner.h"

/* Default random cases: the cpu run stays under a minute on two cores (Release). */
#define DEFAULT_CASES 1500
/* Per case at most batch * seqlen_q * seqlen_k * heads_q * (head_dim + head_dim_v) score terms,
 * and sequences of at most MAX_SEQLEN (a campaign build may raise both with -D). */
#ifndef WORK_BUDGET
#define WORK_BUDGET 12000000.0
#endif
#ifndef MAX_SEQLEN
#define MAX_SEQLEN 200
#endif

static uint64_t g_seed = 0x4a11d5eed0b4c7ull;
static int g_checked = 0, g_refused_fwd = 0, g_refused_bwd = 0;

/* ---- A case ------------------------------------------------------------------------------------- */

enum { T_Q, T_K, T_V, T_O, T_DO, T_DQ, T_DK, T_DV, NUM_TENSORS };
static const char *const tensor_names[NUM_TENSORS] = {"q", "k", "v", "o", "dout", "dQ", "dK", "dV"};

typedef struct mix_case {
    attn_case attn; /* strided: 1 when some tensor has gaps */
    int top_left;
    int64_t sink_tokens;
    int sinks, alibi, deterministic, use_args;
    int threads; /* cpu: FLASHATTN_CPU_THREADS at finalize, 0 unset (small problems then run on one) */
    int nan_in;  /* cpu: 1 + T_Q, T_K, T_V or T_DO: one element of that input is NaN; 0 none */
    int64_t pad[NUM_TENSORS][3]; /* gaps after each head, row and batch, in elements (multiples of 8) */
} mix_case;

static int chance(test_rng *rng, int percent) { return test_rng_range(rng, 0, 99) < percent; }

static int64_t draw_seqlen(test_rng *rng) {
    return chance(rng, 30) ? test_rng_range(rng, 1, 16) : test_rng_range(rng, 1, MAX_SEQLEN);
}

static int64_t draw_dim(test_rng *rng) {
    static const int64_t common[] = {32, 64, 128, 256};
    return chance(rng, 40) ? common[test_rng_range(rng, 0, 3)] : 8 * test_rng_range(rng, 1, 32);
}

/* -1 (none) most often; else narrow, anything up to the span, or wider than every sequence. */
static int64_t draw_window(test_rng *rng, int64_t span) {
    if (!chance(rng, 35)) return -1;
    if (chance(rng, 10)) return chance(rng, 50) ? 5000000000LL : INT64_MAX;
    return chance(rng, 30) ? test_rng_range(rng, 0, 4) : test_rng_range(rng, 0, span);
}

static void draw_pads(test_rng *rng, mix_case *c) {
    int t, a;
    for (t = 0; t < NUM_TENSORS; ++t) {
        if (!chance(rng, 30)) continue;
        for (a = 0; a < 3; ++a) c->pad[t][a] = 8 * test_rng_range(rng, 0, 3);
        c->attn.strided = 1;
    }
}

static double case_work(const attn_case *a) {
    return (double)a->batch * (double)a->seqlen_q * (double)a->seqlen_k * (double)a->heads_q *
           (double)(a->head_dim + a->head_dim_v);
}

/* Smaller until the references fit the time budget: fewer heads, then sequences, then narrower
 * heads, then shorter rows. */
static void fit_budget(attn_case *a) {
    while (case_work(a) > WORK_BUDGET) {
        const int64_t group = a->heads_q / a->heads_kv;
        if (group > 1) {
            a->heads_q = a->heads_kv * (group / 2);
        } else if (a->heads_kv > 1) {
            a->heads_q = a->heads_kv = a->heads_kv - 1;
        } else if (a->batch > 1) {
            --a->batch;
        } else if (a->head_dim + a->head_dim_v > 128) {
            int64_t *wide = a->head_dim >= a->head_dim_v ? &a->head_dim : &a->head_dim_v;
            *wide = *wide / 16 * 8 > 8 ? *wide / 16 * 8 : 8;
        } else if (a->seqlen_q >= a->seqlen_k) {
            a->seqlen_q = (a->seqlen_q + 1) / 2;
        } else {
            a->seqlen_k = (a->seqlen_k + 1) / 2;
        }
    }
}

static void draw_case(test_rng *rng, mix_case *c) {
    static const int64_t groups[] = {1, 1, 2, 3, 4, 8};
    attn_case *a = &c->attn;
    memset(c, 0, sizeof *c);
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU)
        a->dtype = chance(rng, 34) ? F32 : chance(rng, 50) ? F16 : B16;
    else
        a->dtype = chance(rng, 50) ? F16 : B16;
    a->batch = test_rng_range(rng, 1, 3);
    a->seqlen_q = draw_seqlen(rng);
    a->seqlen_k = draw_seqlen(rng);
    a->heads_kv = test_rng_range(rng, 1, 3);
    a->heads_q = a->heads_kv * groups[test_rng_range(rng, 0, 5)];
    if (a->heads_q > 8) a->heads_q /= a->heads_kv, a->heads_kv = 1;
    a->head_dim = draw_dim(rng);
    a->head_dim_v = chance(rng, 30) ? draw_dim(rng) : a->head_dim;
    a->causal = chance(rng, 40);
    c->top_left = chance(rng, 30);
    a->window_left = draw_window(rng, a->seqlen_q + a->seqlen_k);
    a->window_right = draw_window(rng, a->seqlen_q + a->seqlen_k);
    if (chance(rng, 30)) { /* mostly bending the scores, sometimes flattening them to +-cap; rarely
                            * 2^-20..2^10 (above 65504 the common fp16 naive reference overflows) */
        const int64_t u = test_rng_range(rng, 0, 19);
        a->softcap = u < 16 ? test_rng_uniform(rng, 0.5, 20.0)
                            : u < 19 ? test_rng_uniform(rng, 0.001, 0.5) : exp2(test_rng_uniform(rng, -20.0, 10.0));
    }
    if (chance(rng, 30)) { /* up to a softmax peaked on one key; rarely anything in 2^-30..2^6 */
        const int64_t u = test_rng_range(rng, 0, 9);
        a->scale = u < 8 ? test_rng_uniform(rng, 0.05, 1.5)
                         : u < 9 ? test_rng_uniform(rng, 1.5, 8.0) : exp2(test_rng_uniform(rng, -30.0, 6.0));
    }
    a->varlen = chance(rng, 35);
    if (chance(rng, 30)) { /* a few, any number of key blocks, or every key */
        const int64_t u = test_rng_range(rng, 0, 9), sk = a->seqlen_k;
        c->sink_tokens = u < 5 ? test_rng_range(rng, 1, sk < 24 ? sk : 24)
                               : u < 8 ? test_rng_range(rng, 1, sk) : test_rng_range(rng, sk, sk + 10);
    }
    c->sinks = chance(rng, 35);
    c->alibi = chance(rng, 30);
    c->deterministic = chance(rng, 50);
    c->use_args = c->sinks || c->alibi || chance(rng, 50);
    c->threads = chance(rng, 50) ? (int)test_rng_range(rng, 1, 5) : 0;
    /* The cpu keeps a NaN to the gradients of the pairs it takes part in (GPU backends may spread
     * it over a tile, so they get none). */
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU && chance(rng, 6)) {
        static const int inputs[] = {T_Q, T_K, T_V, T_DO};
        c->nan_in = 1 + inputs[test_rng_range(rng, 0, 3)];
    }
    draw_pads(rng, c);
    fit_budget(a);
}

/* Regression cases and corners, run before the random ones with fixed seeds. Field order: batch,
 * sq, sk, hq, hkv, d, dv, dtype, causal, wl, wr, softcap, scale, varlen; top_left, sink_tokens,
 * sinks, alibi, deterministic, use_args, threads. */
#define FIXED(b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, tl, st, sinks, alibi, det, args, thr) \
    {{b, sq, sk, hq, hk, d, dv, dt, causal, wl, wr, cap, scale, varlen, 0, 0}, tl, st, sinks, alibi, det, args, thr, 0, {{0}}}
static const mix_case fixed_cases[] = {
    /* Top-left with seqlen_q > seqlen_k and a left window: the last rows see only the sink tokens. */
    FIXED(2, 60, 20, 4, 2, 64, 64, F32, 0, 5, -1, 0, 0, 0, 1, 3, 1, 0, 0, 1, 3),
    /* Sink logits on a varlen batch with empty sequences, GQA, ALiBi and a soft cap. */
    FIXED(3, 40, 50, 6, 2, 32, 48, F16, 1, -1, -1, 8.0, 1.0, 1, 0, 0, 1, 1, 1, 1, 2),
    /* Causal bottom-right with seqlen_q > seqlen_k through the 0.2 call, bf16, MQA. */
    FIXED(2, 130, 40, 4, 1, 128, 128, B16, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    /* Windows of INT64_MAX (they mask nothing; the common reference once overflowed diag + window). */
    FIXED(2, 37, 90, 4, 2, 64, 64, F32, 0, INT64_MAX, INT64_MAX, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2),
    /* Tiny soft caps (scale / cap 900 and 2000): fp32 Q.K roundings reach the chain factor, beyond
     * test_backward.c's bound and once beyond a sampled estimate (see cap_rounding()). */
    FIXED(3, 62, 145, 1, 1, 128, 128, F32, 1, -1, -1, 0.00615, 5.62, 0, 0, 0, 0, 0, 0, 1, 0),
    FIXED(3, 39, 36, 3, 1, 56, 56, F32, 0, -1, -1, 6.5e-5, 0.134, 0, 1, 22, 1, 1, 1, 1, 5),
};
#define NUM_FIXED (sizeof fixed_cases / sizeof fixed_cases[0])

/* Whether the case needs this file's reference: the common one knows no sink logits, no ALiBi,
 * bottom-right alignment only and no sink tokens (which change nothing without a left window);
 * and vref's NaN follows the header's rule (each gradient of a pair the NaN takes part in). */
static int needs_vref(const mix_case *c, const case_shape *s) {
    const attn_case *a = &c->attn;
    int64_t b;
    if (c->nan_in || c->sinks || c->alibi || (c->sink_tokens > 0 && a->window_left >= 0)) return 1;
    if (!c->top_left || (!a->causal && a->window_left < 0 && a->window_right < 0)) return 0;
    for (b = 0; b < s->batch; ++b)
        if (s->len_q[b] != s->len_k[b]) return 1; /* the two alignments differ */
    return 0;
}

/* ---- This file's reference (vref) ------------------------------------------------------------ */

/* One problem in double, logical [token][head][dim] arrays; outputs NULL when not wanted. */
typedef struct vref {
    int64_t batch, hq, hk, d, dv, maxk;
    const int64_t *len_q, *len_k, *start_q, *start_k;
    int causal, top_left;
    int64_t wl, wr, sink_tokens;
    double scale, softcap;
    const double *q, *k, *v, *dout;
    const double *sink, *slope; /* [hq]; NULL: no sink logits, no ALiBi */
    double *o;                  /* [token][hq][dv] */
    double *gq, *gk, *gv;       /* gradients of L = sum(O * dout) */
    double *dsink_part;         /* [batch][hq]: each sequence's share of dL/dsink */
    flashattn_dtype_t o_dtype;  /* when set: D from O rounded to it, the O the library's backward reads,
                                 * and the scores' dot products in fp32 */
    double *smax_job;           /* [batch][hk]: the largest |score|, scale sum |q k| or |sink logit| of
                                 * the job's rows */
    double *eq, *ek;            /* when set: per element of dQ, dK, the variance of what the fp32
                                 * rounding of tanh's argument moves (soft cap; see cap_rounding()) */
    unsigned char *q_sees, *k_seen;
} vref;

/* The header's mask: key j against the row whose diagonal key is `diag`. Causal and the right
 * window bound every key; the left window spares the first sink_tokens keys. */
static int vref_visible(const vref *r, int64_t diag, int64_t j) {
    if (r->causal && j > diag) return 0;
    if (r->wr >= 0 && j - diag > r->wr) return 0; /* windows up to INT64_MAX: no diag + wr */
    return r->wl < 0 || diag - j <= r->wl || j < r->sink_tokens;
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    int64_t c;
    for (c = 0; c < n; ++c) s += a[c] * b[c];
    return s;
}

/* The same in fp32 arithmetic, as the library forms Q K^T for every dtype. */
static double dot_fp32(const double *a, const double *b, int64_t n) {
    float s = 0.0f;
    int64_t c;
    for (c = 0; c < n; ++c) s += (float)a[c] * (float)b[c];
    return s;
}

/* The soft cap's chain factor 1 - tanh^2(u), u = scale Q.K / cap, moves by 2 |tanh (1 - tanh^2)| du
 * when u carries du: an fp32 dot product's roundings, each up to 2^-24 of a partial sum, add up as a
 * random walk (standard deviation ~2^-24 sqrt(sum of the squared partial sums)), multiplied by
 * scale / cap in u. Under a tiny cap (scale / cap in the thousands) that is the library's largest
 * error in dQ and dK, and a sampled fp32 sum (dot_fp32) underestimated it 4x (cap 6.5e-5, scale
 * 0.13). Returns the factor's standard deviation for key k. */
static double cap_rounding(const vref *r, const double *q, const double *k, double th) {
    double partial = 0.0, squares = 0.0;
    int64_t c;
    for (c = 0; c < r->d; ++c) partial += q[c] * k[c], squares += partial * partial;
    return 2.0 * fabs(th * (1.0 - th * th)) * ldexp(sqrt(squares), -24) * r->scale / r->softcap;
}

/* Scratch of one row: scores, tanh values, unnormalised probabilities, O, visibility. */
typedef struct vref_row_scratch {
    double *s, *th, *e, *o;
    unsigned char *vis;
} vref_row_scratch;

/* Row i of query head h of sequence b: O (and LSE implicitly), then its gradient terms. */
static void vref_row(const vref *r, int64_t b, int64_t h, int64_t i, const vref_row_scratch *w) {
    const int64_t sq = r->len_q[b], sk = r->len_k[b], kvh = h / (r->hq / r->hk);
    const int64_t tq = r->start_q[b] + i, diag = r->top_left ? i : i + sk - sq;
    const double *q = r->q + (tq * r->hq + h) * r->d;
    const double slope = r->slope ? r->slope[h] : 0.0;
    double m = r->sink ? r->sink[h] : -INFINITY, l, dsum, big = 0.0;
    int64_t j, c, seen = 0;
    for (j = 0; j < sk; ++j) {
        const double *k = r->k + ((r->start_k[b] + j) * r->hk + kvh) * r->d;
        double x;
        w->vis[j] = (unsigned char)vref_visible(r, diag, j);
        if (!w->vis[j]) continue;
        x = (r->o_dtype ? dot_fp32(q, k, r->d) : dot(q, k, r->d)) * r->scale;
        if (r->softcap > 0.0) {
            w->th[j] = tanh(x / r->softcap);
            x = r->softcap * w->th[j];
        }
        w->s[j] = x - slope * fabs((double)(diag - j)); /* ALiBi after the cap */
        if (w->s[j] > m) m = w->s[j];
        if (fabs(w->s[j]) > big) big = fabs(w->s[j]);
        if (r->smax_job) { /* an fp32 Q.K is off by up to ~2^-24 sum |q k| per term: cancellation */
            double terms = 0.0;
            for (c = 0; c < r->d; ++c) terms += fabs(q[c] * k[c]);
            if (terms * r->scale > big) big = terms * r->scale;
        }
        ++seen;
    }
    if (seen == 0) { /* O = 0 and dQ = 0 (the outputs start zeroed) */
        /* The header's dsink term, -exp(sink - LSE) (dO . O) with LSE = sink and O = 0: 0, but NaN
         * where dO holds one (0 * NaN), as IEEE arithmetic and PyTorch's autograd give it. */
        const double *g = r->dout + (tq * r->hq + h) * r->dv;
        for (c = 0; r->sink && r->gq && c < r->dv; ++c) r->dsink_part[b * r->hq + h] -= g[c] * 0.0;
        return;
    }
    /* The row max is a score or the sink; not m itself, still -inf when every score is NaN. */
    if (r->sink && fabs(r->sink[h]) > big) big = fabs(r->sink[h]);
    if (r->smax_job && big > r->smax_job[b * r->hk + kvh]) r->smax_job[b * r->hk + kvh] = big;
    l = r->sink ? exp(r->sink[h] - m) : 0.0;
    for (c = 0; c < r->dv; ++c) w->o[c] = 0.0;
    for (j = 0; j < sk; ++j) {
        if (!w->vis[j]) continue;
        l += (w->e[j] = exp(w->s[j] - m));
    }
    for (j = 0; j < sk; ++j) {
        const double *v = r->v + ((r->start_k[b] + j) * r->hk + kvh) * r->dv;
        if (!w->vis[j]) continue;
        for (c = 0; c < r->dv; ++c) w->o[c] += w->e[j] / l * v[c];
    }
    if (r->o) memcpy(r->o + (tq * r->hq + h) * r->dv, w->o, (size_t)r->dv * sizeof(double));
    if (r->q_sees) r->q_sees[tq * r->hq + h] = 1;
    if (r->gq == NULL) return;
    {
        const double *g = r->dout + (tq * r->hq + h) * r->dv;
        double *dq = r->gq + (tq * r->hq + h) * r->d;
        dsum = 0.0; /* D = dO . O */
        for (c = 0; c < r->dv; ++c) dsum += g[c] * (r->o_dtype ? test_round(r->o_dtype, w->o[c]) : w->o[c]);
        for (j = 0; j < sk; ++j) {
            const int64_t tk = r->start_k[b] + j;
            const double *k = r->k + (tk * r->hk + kvh) * r->d, *v = r->v + (tk * r->hk + kvh) * r->dv;
            double *dk = r->gk + (tk * r->hk + kvh) * r->d, *dv = r->gv + (tk * r->hk + kvh) * r->dv;
            double p, ds;
            if (!w->vis[j]) continue;
            p = w->e[j] / l;
            ds = p * (dot(g, v, r->dv) - dsum) * r->scale; /* softmax backward, then the scale */
            if (r->softcap > 0.0 && r->eq) {
                const double e = fabs(ds) * cap_rounding(r, q, k, w->th[j]);
                double *eq = r->eq + (tq * r->hq + h) * r->d, *ek = r->ek + (tk * r->hk + kvh) * r->d;
                for (c = 0; c < r->d; ++c) eq[c] += e * e * k[c] * k[c], ek[c] += e * e * q[c] * q[c];
            }
            if (r->softcap > 0.0) ds *= 1.0 - w->th[j] * w->th[j]; /* through cap * tanh(x / cap) */
            for (c = 0; c < r->d; ++c) dq[c] += ds * k[c];
            for (c = 0; c < r->d; ++c) dk[c] += ds * q[c];
            for (c = 0; c < r->dv; ++c) dv[c] += p * g[c];
            if (r->k_seen) r->k_seen[tk * r->hk + kvh] = 1;
        }
        /* The sink is one more softmax entry with value 0: dS_sink = P_sink (0 - D). */
        if (r->sink) r->dsink_part[b * r->hq + h] -= exp(r->sink[h] - m) / l * dsum;
    }
}

/* A job per (sequence, key/value head): its group's rows in order, so that every output element
 * has one writer and a fixed order of additions. */
static void vref_job(void *arg, int64_t index, void *scratch) {
    const vref *r = (const vref *)arg;
    const int64_t b = index / r->hk, kvh = index % r->hk, group = r->hq / r->hk;
    vref_row_scratch w;
    int64_t h, i;
    w.s = (double *)scratch;
    w.th = w.s + r->maxk;
    w.e = w.th + r->maxk;
    w.o = w.e + r->maxk;
    w.vis = (unsigned char *)(w.o + r->dv);
    for (h = kvh * group; h < (kvh + 1) * group; ++h)
        for (i = 0; i < r->len_q[b]; ++i) vref_row(r, b, h, i, &w);
}

static void zero(void *p, int64_t n, size_t size) {
    if (p) memset(p, 0, (size_t)n * size);
}

/* Runs the reference; dsink (when the gradients are wanted) receives dL/dsink per head. */
static void vref_run(vref *r, int64_t total_q, int64_t total_k, double *dsink) {
    int64_t b, h;
    r->maxk = ref_longest(r->len_k, r->batch);
    zero(r->o, total_q * r->hq * r->dv, sizeof(double));
    zero(r->gq, total_q * r->hq * r->d, sizeof(double));
    zero(r->gk, total_k * r->hk * r->d, sizeof(double));
    zero(r->gv, total_k * r->hk * r->dv, sizeof(double));
    zero(r->dsink_part, r->batch * r->hq, sizeof(double));
    zero(r->smax_job, r->batch * r->hk, sizeof(double));
    zero(r->eq, total_q * r->hq * r->d, sizeof(double));
    zero(r->ek, total_k * r->hk * r->d, sizeof(double));
    zero(r->q_sees, total_q * r->hq, 1);
    zero(r->k_seen, total_k * r->hk, 1);
    ref_parallel(r->batch * r->hk, (size_t)(3 * r->maxk + r->dv) * sizeof(double) + (size_t)r->maxk, vref_job, r);
    for (h = 0; dsink && r->dsink_part && h < r->hq; ++h) {
        dsink[h] = 0.0;
        for (b = 0; b < r->batch; ++b) dsink[h] += r->dsink_part[b * r->hq + h];
    }
}

/* ---- vref against finite differences ---------------------------------------------------------- */

static double *random_doubles(test_rng *rng, int64_t n, double lo, double hi) {
    double *x = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int64_t i;
    for (i = 0; x && i < n; ++i) x[i] = test_rng_uniform(rng, lo, hi);
    return x;
}

/* L = sum(O * dout) through vref's forward. */
static double vref_loss(vref *r, int64_t total_q, int64_t total_k) {
    double *gq = r->gq, *gk = r->gk, *gv = r->gv, l = 0.0;
    unsigned char *qs = r->q_sees, *ks = r->k_seen;
    int64_t e;
    r->gq = r->gk = r->gv = NULL;
    r->q_sees = r->k_seen = NULL;
    vref_run(r, total_q, total_k, NULL);
    for (e = 0; e < total_q * r->hq * r->dv; ++e) l += r->o[e] * r->dout[e];
    r->gq = gq, r->gk = gk, r->gv = gv, r->q_sees = qs, r->k_seen = ks;
    return l;
}

/* Every element of x: the analytic gradient `grad` against (L(x + eps) - L(x - eps)) / 2 eps. */
static void expect_fd(vref *r, int64_t tq, int64_t tk, double *x, const double *grad, int64_t n, const char *name,
                      const char *what) {
    const double eps = 1e-5;
    double gmax = 0.0;
    int64_t e;
    for (e = 0; e < n; ++e)
        if (fabs(grad[e]) > gmax) gmax = fabs(grad[e]);
    for (e = 0; e < n; ++e) {
        const double x0 = x[e];
        double lp, lm, fd;
        x[e] = x0 + eps;
        lp = vref_loss(r, tq, tk);
        x[e] = x0 - eps;
        lm = vref_loss(r, tq, tk);
        x[e] = x0;
        fd = (lp - lm) / (2.0 * eps);
        if (!(fabs(fd - grad[e]) <= 1e-6 * (1.0 + gmax))) {
            EXPECT(0, "the TEST's reference %s: d%s[%lld] = %.10g, finite differences %.10g", what, name, (long long)e,
                   grad[e], fd);
            return;
        }
    }
}

/* A tiny random problem with every feature at 50%, its vref gradient against finite differences. */
static void vref_self_check(uint64_t seed) {
    test_rng rng;
    int64_t len_q[2], len_k[2], start_q[2], start_k[2], b, tq = 0, tk = 0;
    vref r;
    double *dsink_part, dsink[4];
    char what[300];
    test_rng_seed(&rng, seed);
    memset(&r, 0, sizeof r);
    r.batch = test_rng_range(&rng, 1, 2);
    r.hk = test_rng_range(&rng, 1, 2);
    r.hq = r.hk * test_rng_range(&rng, 1, 2);
    r.d = test_rng_range(&rng, 1, 6);
    r.dv = test_rng_range(&rng, 1, 6);
    for (b = 0; b < r.batch; ++b) {
        len_q[b] = test_rng_range(&rng, b > 0 ? 0 : 1, 7);
        len_k[b] = test_rng_range(&rng, b > 0 ? 0 : 1, 9);
        start_q[b] = tq, start_k[b] = tk;
        tq += len_q[b], tk += len_k[b];
    }
    r.len_q = len_q, r.len_k = len_k, r.start_q = start_q, r.start_k = start_k;
    r.causal = chance(&rng, 50), r.top_left = chance(&rng, 50);
    r.wl = chance(&rng, 50) ? test_rng_range(&rng, 0, 3) : -1;
    r.wr = chance(&rng, 50) ? test_rng_range(&rng, 0, 3) : -1;
    r.sink_tokens = chance(&rng, 50) ? test_rng_range(&rng, 1, 3) : 0;
    r.scale = test_rng_uniform(&rng, 0.3, 1.5);
    r.softcap = chance(&rng, 50) ? test_rng_uniform(&rng, 0.5, 3.0) : 0.0;
    r.q = random_doubles(&rng, tq * r.hq * r.d, -1.5, 1.5);
    r.k = random_doubles(&rng, tk * r.hk * r.d, -1.5, 1.5);
    r.v = random_doubles(&rng, tk * r.hk * r.dv, -1.0, 1.0);
    r.dout = random_doubles(&rng, tq * r.hq * r.dv, -1.0, 1.0);
    r.sink = chance(&rng, 50) ? random_doubles(&rng, r.hq, -1.0, 2.0) : NULL;
    r.slope = chance(&rng, 50) ? random_doubles(&rng, r.hq, -0.5, 1.0) : NULL;
    r.o = (double *)malloc((size_t)(tq * r.hq * r.dv + 1) * sizeof(double));
    r.gq = (double *)malloc((size_t)(tq * r.hq * r.d + 1) * sizeof(double));
    r.gk = (double *)malloc((size_t)(tk * r.hk * r.d + 1) * sizeof(double));
    r.gv = (double *)malloc((size_t)(tk * r.hk * r.dv + 1) * sizeof(double));
    dsink_part = (double *)malloc((size_t)(r.batch * r.hq) * sizeof(double));
    r.dsink_part = dsink_part;
    snprintf(what, sizeof what,
             "[self-check seed %llu: b=%lld hq=%lld hk=%lld d=%lld dv=%lld causal=%d top_left=%d wl=%lld wr=%lld "
             "sink_tokens=%lld cap=%g sinks=%d alibi=%d]",
             (unsigned long long)seed, (long long)r.batch, (long long)r.hq, (long long)r.hk, (long long)r.d,
             (long long)r.dv, r.causal, r.top_left, (long long)r.wl, (long long)r.wr, (long long)r.sink_tokens,
             r.softcap, r.sink != NULL, r.slope != NULL);
    vref_run(&r, tq, tk, dsink);
    {
        /* The analytic gradients are copied: the loss evaluations overwrite r.o only, but keep
         * them apart all the same. */
        double *gq = (double *)malloc((size_t)(tq * r.hq * r.d + 1) * sizeof(double));
        double *gk = (double *)malloc((size_t)(tk * r.hk * r.d + 1) * sizeof(double));
        double *gv = (double *)malloc((size_t)(tk * r.hk * r.dv + 1) * sizeof(double));
        memcpy(gq, r.gq, (size_t)(tq * r.hq * r.d + 1) * sizeof(double));
        memcpy(gk, r.gk, (size_t)(tk * r.hk * r.d + 1) * sizeof(double));
        memcpy(gv, r.gv, (size_t)(tk * r.hk * r.dv + 1) * sizeof(double));
        expect_fd(&r, tq, tk, (double *)r.q, gq, tq * r.hq * r.d, "Q", what);
        expect_fd(&r, tq, tk, (double *)r.k, gk, tk * r.hk * r.d, "K", what);
        expect_fd(&r, tq, tk, (double *)r.v, gv, tk * r.hk * r.dv, "V", what);
        if (r.sink) expect_fd(&r, tq, tk, (double *)r.sink, dsink, r.hq, "sink", what);
        free(gq), free(gk), free(gv);
    }
    if (test_verbose()) printf("%s checked\n", what);
    free((void *)r.q), free((void *)r.k), free((void *)r.v), free((void *)r.dout);
    free((void *)r.sink), free((void *)r.slope);
    free(r.o), free(r.gq), free(r.gk), free(r.gv), free(dsink_part);
}

/* ---- One case on the library ------------------------------------------------------------------ */

typedef struct ctx {
    const mix_case *c;
    int index; /* -1: a fixed case */
    char desc[1024];
    case_shape s;
    size_t es, ws_fwd, ws_bwd;
    tensor_layout lay[NUM_TENSORS];
    test_mem mem[NUM_TENSORS], lse, cu_q, cu_k, sink, slope, dsink, ws_f, ws_b;
    float *logical[NUM_TENSORS]; /* q, k, v, dout: [token][head][dim], the values the library reads */
    flashattn_plan_t *plan;
} ctx;

/* Rows (queries or keys), heads and width of tensor t. */
static void tensor_shape(const ctx *x, int t, int *q_side, int64_t *heads, int64_t *dim) {
    *q_side = t == T_Q || t == T_O || t == T_DO || t == T_DQ;
    *heads = *q_side ? x->s.hq : x->s.hk;
    *dim = t == T_V || t == T_O || t == T_DO || t == T_DV ? x->s.dv : x->s.d;
}

/* Counts a failure and prints it with the whole case and how to run it alone. */
static int ctx_fail(ctx *x, const char *fmt, ...) {
    va_list ap;
    ++g_failures;
    va_start(ap, fmt);
    printf("FAIL %s: ", x->desc);
    vprintf(fmt, ap);
    va_end(ap);
    if (x->c && TEST_BACKEND == FLASHATTN_BACKEND_CPU) printf("[threads %d] ", x->c->threads);
    if (x->index >= 0)
        printf("\n  reproduce: FLASHATTN_TEST_SEED=%llu FLASHATTN_TEST_MIX_ONLY=%d", (unsigned long long)g_seed, x->index);
    printf("\n");
    fflush(stdout);
    return -1;
}

/* 0 when `st` is success; else the failure, naming the call, with the library's message. */
static int checked(ctx *x, flashattn_status_t st, const char *call) {
    if (st == FLASHATTN_SUCCESS) return 0;
    return ctx_fail(x, "%s returned %d (%s): %s", call, (int)st, flashattn_status_string(st), flashattn_last_error());
}
#define CALL(x, call)                              \
    do {                                           \
        if (checked(x, (call), #call)) return -1; \
    } while (0)

static void ctx_free(ctx *x) {
    test_mem *extra[] = {&x->lse, &x->cu_q, &x->cu_k, &x->sink, &x->slope, &x->dsink, &x->ws_f, &x->ws_b};
    size_t i;
    flashattn_plan_destroy(x->plan);
    for (i = 0; i < NUM_TENSORS; ++i) test_mem_free(&x->mem[i]), free(x->logical[i]);
    for (i = 0; i < sizeof extra / sizeof extra[0]; ++i) test_mem_free(extra[i]);
    shape_free(&x->s);
    memset(x, 0, sizeof *x);
}

/* Whole 256-byte blocks, so that the poison and the snapshots cover the tail too. */
static int alloc_buf(test_mem *m, size_t bytes) {
    return test_mem_alloc(m, (bytes + 255) / 256 * 256 + 256, test_on_device(TEST_BACKEND));
}

/* Varlen lengths: empty, full or anything between. */
static int64_t draw_length(test_rng *rng, int64_t max) {
    const int64_t u = test_rng_range(rng, 0, 9);
    return u == 0 ? 0 : u == 1 ? max : test_rng_range(rng, 0, max);
}

static void describe(ctx *x, uint64_t seed) {
    const mix_case *c = x->c;
    int n = shape_describe(x->desc, sizeof x->desc, TEST_BACKEND, &c->attn, &x->s), t, b;
    n += snprintf(x->desc + n, sizeof x->desc - (size_t)n,
                  " top_left=%d sink_tokens=%lld sinks=%d alibi=%d deterministic=%d api=%s", c->top_left,
                  (long long)c->sink_tokens, c->sinks, c->alibi, c->deterministic, c->use_args ? "args" : "0.2");
    for (t = 0; t < NUM_TENSORS && c->attn.strided; ++t)
        if (c->pad[t][0] || c->pad[t][1] || c->pad[t][2])
            n += snprintf(x->desc + n, sizeof x->desc - (size_t)n, " %s_pad=(%lld,%lld,%lld)", tensor_names[t],
                          (long long)c->pad[t][0], (long long)c->pad[t][1], (long long)c->pad[t][2]);
    if (c->nan_in)
        n += snprintf(x->desc + n, sizeof x->desc - (size_t)n, " NaN in %s", tensor_names[c->nan_in - 1]);
    for (b = 0; b < x->s.batch && x->s.varlen; ++b)
        n += snprintf(x->desc + n, sizeof x->desc - (size_t)n, "%s%lld/%lld", b ? "," : " lengths q/k=",
                      (long long)x->s.len_q[b], (long long)x->s.len_k[b]);
    snprintf(x->desc + n, sizeof x->desc - (size_t)n, " seed=%llu]", (unsigned long long)seed);
}

/* One random element of input t (when it has any) becomes NaN, in the tensor and its logical copy. */
static void plant_nan(ctx *x, test_rng *rng, int t) {
    const case_shape *s = &x->s;
    int q_side;
    int64_t heads, dim, tok, h, col, b = 0;
    tensor_shape(x, t, &q_side, &heads, &dim);
    if ((q_side ? s->total_q : s->total_k) == 0) return;
    tok = test_rng_range(rng, 0, (q_side ? s->total_q : s->total_k) - 1);
    h = test_rng_range(rng, 0, heads - 1);
    col = test_rng_range(rng, 0, dim - 1);
    while (tok >= (q_side ? s->start_q[b] + s->len_q[b] : s->start_k[b] + s->len_k[b])) ++b;
    x->logical[t][(tok * heads + h) * dim + col] = NAN;
    test_store(s->dtype,
               (unsigned char *)x->mem[t].host +
                   x->es * (size_t)(layout_offset(&x->lay[t], s->varlen, b, tok, tok - (q_side ? s->start_q[b] : s->start_k[b]), h) + col),
               NAN);
}

/* Sequences, layouts, buffers and random inputs (every gap poisoned), uploaded. */
static int ctx_inputs(ctx *x, test_rng *rng) {
    const mix_case *c = x->c;
    case_shape *s = &x->s;
    int t, q_side;
    int64_t heads, dim, h, b;
    if (shape_sequences(s, rng)) return ctx_fail(x, "out of memory");
    for (b = 0; b < s->batch && s->varlen; ++b) {
        s->len_q[b] = draw_length(rng, s->sq);
        s->len_k[b] = draw_length(rng, s->sk);
    }
    shape_pack(s);
    for (t = 0; t < NUM_TENSORS; ++t) {
        tensor_shape(x, t, &q_side, &heads, &dim);
        x->lay[t] = make_layout(s->batch, q_side ? s->sq : s->sk, q_side ? s->total_q : s->total_k, s->varlen, heads,
                                dim, 1, c->pad[t][0], c->pad[t][1], c->pad[t][2]);
        if (alloc_buf(&x->mem[t], x->lay[t].elems * x->es)) return ctx_fail(x, "could not allocate %s", tensor_names[t]);
        if (t == T_O || t >= T_DQ) continue;
        x->logical[t] = (float *)malloc((size_t)((q_side ? s->total_q : s->total_k) * heads * dim + 1) * sizeof(float));
        if (!x->logical[t]) return ctx_fail(x, "out of memory");
        fill_random_tensor(s, rng, &x->mem[t], &x->lay[t], x->logical[t], q_side, heads, dim);
        if (c->nan_in == t + 1) plant_nan(x, rng, t);
    }
    if (alloc_buf(&x->lse, (size_t)(s->hq * s->total_q) * sizeof(float)) || alloc_buf(&x->cu_q, (size_t)(s->batch + 1) * 4) ||
        alloc_buf(&x->cu_k, (size_t)(s->batch + 1) * 4) || alloc_buf(&x->sink, (size_t)s->hq * 4) ||
        alloc_buf(&x->slope, (size_t)s->hq * 4) || alloc_buf(&x->dsink, (size_t)s->hq * 4))
        return ctx_fail(x, "could not allocate the small tensors");
    shape_cu_seqlens(s, (int32_t *)x->cu_q.host, (int32_t *)x->cu_k.host);
    for (h = 0; h < s->hq; ++h) {
        /* Sink logits around the scores' range; slopes as ALiBi's geometric ones or anything in
         * [-0.5, 2] (a negative slope favours far keys). */
        ((float *)x->sink.host)[h] = (float)test_rng_uniform(rng, -2.0, 4.0);
        ((float *)x->slope.host)[h] = (float)(chance(rng, 50) ? exp2(-8.0 * (double)(h + 1) / (double)s->hq)
                                                               : test_rng_uniform(rng, -0.5, 2.0));
    }
    for (t = 0; t < NUM_TENSORS; ++t)
        if (test_mem_upload(&x->mem[t])) return ctx_fail(x, "upload of %s failed", tensor_names[t]);
    if (test_mem_upload(&x->cu_q) || test_mem_upload(&x->cu_k) || test_mem_upload(&x->sink) || test_mem_upload(&x->slope))
        return ctx_fail(x, "upload failed");
    return 0;
}

/* Tensor t's stride keys: this file's T_Q .. T_DV are test_stride_keys' first eight rows. */
_Static_assert(T_DV == TEST_STRIDES_DV && T_DO == TEST_STRIDES_DO, "tensor order of test_stride_keys");

/* Variants each GPU backward runs (docs/architecture.md); the rest it must refuse by name. Since
 * stop 35 the fa2 and fa3 backward passes run all of them (fa1 has no backward). */
static int backward_runs_variants(const mix_case *c) {
    (void)c;
    return TEST_BACKEND != FLASHATTN_BACKEND_FA1;
}

/* A refusal on a GPU backend: counted (and printed when verbose); its message must say why. */
static int refused(ctx *x, const char *pass, int *count) {
    const char *msg = flashattn_last_error();
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) return ctx_fail(x, "the cpu backend refused the %s: %s", pass, msg);
    if (msg[0] == '\0') return ctx_fail(x, "%s refused without a message", pass);
    if (test_verbose()) printf("refused %s %s: %s\n", pass, x->desc, msg);
    ++*count;
    return 1;
}

/* FLASHATTN_CPU_THREADS for the next finalize (0: unset, the backend's own choice). */
static void set_cpu_threads(int n) {
    char value[16];
    snprintf(value, sizeof value, "%d", n);
    if (n > 0)
        setenv("FLASHATTN_CPU_THREADS", value, 1);
    else
        unsetenv("FLASHATTN_CPU_THREADS");
}

/* The plan. 0: ready; 1: refused as a GPU backend may; -1: failed. */
static int ctx_plan(ctx *x) {
    const mix_case *c = x->c;
    flashattn_backend_t chosen;
    const char *reason = NULL;
    flashattn_status_t st;
    int t;
    CALL(x, flashattn_plan_create(&x->plan));
    CALL(x, set_problem_keys(x->plan, &x->s, &c->attn, TEST_BACKEND));
    CALL(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_MASK_ALIGN,
                                   c->top_left ? FLASHATTN_MASK_ALIGN_TOP_LEFT : FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT));
    CALL(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_SINK_TOKENS, c->sink_tokens));
    CALL(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_SINK_LOGITS, c->sinks));
    CALL(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_ALIBI, c->alibi));
    CALL(x, flashattn_plan_set_i64(x->plan, FLASHATTN_I64_DETERMINISTIC, c->deterministic));
    for (t = 0; t < NUM_TENSORS; ++t) /* strides only where there are gaps: the defaults run too */
        if (c->pad[t][0] || c->pad[t][1] || c->pad[t][2]) {
            const tensor_layout *l = &x->lay[t];
            CALL(x, set_strides_of(x->plan, &test_stride_keys[t], &l, 1, x->s.varlen));
        }
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) set_cpu_threads(c->threads);
    st = flashattn_plan_finalize(x->plan);
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) set_cpu_threads(0);
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED) return refused(x, "forward", &g_refused_fwd);
    CALL(x, st);
    CALL(x, flashattn_plan_get_backend(x->plan, &chosen, &reason));
    if (chosen != TEST_BACKEND) return ctx_fail(x, "the forward runs on %s (%s)", test_backend_name(chosen), reason);
    st = flashattn_plan_get_backward_backend(x->plan, &chosen, &reason);
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED) {
        const char *msg = flashattn_last_error();
        if (backward_runs_variants(c)) return ctx_fail(x, "backward refused: %s", msg);
        if (!strstr(msg, "top-left") && !strstr(msg, "sink") && !strstr(msg, "ALiBi") && !strstr(msg, "head_dim_v"))
            return ctx_fail(x, "the backward refused without naming the variant: %s", msg);
        return refused(x, "backward", &g_refused_bwd);
    }
    CALL(x, st);
    if (chosen != TEST_BACKEND) return ctx_fail(x, "the backward runs on %s (%s)", test_backend_name(chosen), reason);
    CALL(x, flashattn_plan_get_workspace_size(x->plan, &x->ws_fwd));
    CALL(x, flashattn_plan_get_backward_workspace_size(x->plan, &x->ws_bwd));
    if (alloc_buf(&x->ws_f, x->ws_fwd) || alloc_buf(&x->ws_b, x->ws_bwd)) return ctx_fail(x, "no workspace");
    return 0;
}

/* One argument-set call: the pointers the pass uses, every other left NULL. */
static flashattn_status_t run_args(const ctx *x, int backward) {
    const mix_case *c = x->c;
    const int v = x->s.varlen;
    const struct {
        flashattn_arg_t which;
        const void *ptr;
    } set[] = {{FLASHATTN_ARG_Q, test_mem_ptr(&x->mem[T_Q])},
               {FLASHATTN_ARG_K, test_mem_ptr(&x->mem[T_K])},
               {FLASHATTN_ARG_V, test_mem_ptr(&x->mem[T_V])},
               {FLASHATTN_ARG_O, test_mem_ptr(&x->mem[T_O])},
               {FLASHATTN_ARG_LSE, test_mem_ptr(&x->lse)},
               {FLASHATTN_ARG_CU_SEQLENS_Q, v ? test_mem_ptr(&x->cu_q) : NULL},
               {FLASHATTN_ARG_CU_SEQLENS_K, v ? test_mem_ptr(&x->cu_k) : NULL},
               {FLASHATTN_ARG_SINK_LOGITS, c->sinks ? test_mem_ptr(&x->sink) : NULL},
               {FLASHATTN_ARG_ALIBI_SLOPES, c->alibi ? test_mem_ptr(&x->slope) : NULL},
               {FLASHATTN_ARG_DSINK_LOGITS, backward && c->sinks ? test_mem_ptr(&x->dsink) : NULL},
               {FLASHATTN_ARG_DOUT, backward ? test_mem_ptr(&x->mem[T_DO]) : NULL},
               {FLASHATTN_ARG_DQ, backward ? test_mem_ptr(&x->mem[T_DQ]) : NULL},
               {FLASHATTN_ARG_DK, backward ? test_mem_ptr(&x->mem[T_DK]) : NULL},
               {FLASHATTN_ARG_DV, backward ? test_mem_ptr(&x->mem[T_DV]) : NULL}};
    flashattn_args_t *args = NULL;
    flashattn_status_t st = flashattn_args_create(&args);
    size_t i;
    for (i = 0; st == FLASHATTN_SUCCESS && i < sizeof set / sizeof set[0]; ++i) st = flashattn_args_set(args, set[i].which, set[i].ptr);
    if (st == FLASHATTN_SUCCESS)
        st = backward ? flashattn_plan_execute_backward_args(x->plan, args, test_mem_ptr(&x->ws_b), x->ws_bwd, NULL)
                      : flashattn_plan_execute_args(x->plan, args, test_mem_ptr(&x->ws_f), x->ws_fwd, NULL);
    flashattn_args_destroy(args);
    return st;
}

/* The 0.2 entry points. */
static flashattn_status_t run_classic(const ctx *x, int backward) {
    const void *q = test_mem_ptr(&x->mem[T_Q]), *k = test_mem_ptr(&x->mem[T_K]), *v = test_mem_ptr(&x->mem[T_V]);
    void *o = test_mem_ptr(&x->mem[T_O]), *dq = test_mem_ptr(&x->mem[T_DQ]), *dk = test_mem_ptr(&x->mem[T_DK]);
    void *dv = test_mem_ptr(&x->mem[T_DV]);
    const void *dout = test_mem_ptr(&x->mem[T_DO]);
    float *lse = (float *)test_mem_ptr(&x->lse);
    const int32_t *cq = (const int32_t *)test_mem_ptr(&x->cu_q), *ck = (const int32_t *)test_mem_ptr(&x->cu_k);
    void *wf = test_mem_ptr(&x->ws_f), *wb = test_mem_ptr(&x->ws_b);
    if (!backward)
        return x->s.varlen ? flashattn_plan_execute_varlen(x->plan, q, k, v, o, lse, cq, ck, wf, x->ws_fwd, NULL)
                           : flashattn_plan_execute(x->plan, q, k, v, o, lse, wf, x->ws_fwd, NULL);
    return x->s.varlen ? flashattn_plan_execute_backward_varlen(x->plan, q, k, v, o, dout, lse, dq, dk, dv, cq, ck, wb,
                                                                x->ws_bwd, NULL)
                       : flashattn_plan_execute_backward(x->plan, q, k, v, o, dout, lse, dq, dk, dv, wb, x->ws_bwd, NULL);
}

/* One pass with its outputs and workspace poisoned, then the outputs downloaded. */
static int ctx_run(ctx *x, int backward) {
    test_mem *outs[5];
    const char *err;
    flashattn_status_t st;
    int n = 0, i;
    test_mem *ws = backward ? &x->ws_b : &x->ws_f;
    if (backward) {
        outs[n++] = &x->mem[T_DQ], outs[n++] = &x->mem[T_DK], outs[n++] = &x->mem[T_DV];
        test_poison(FLASHATTN_DTYPE_FP32, x->dsink.host, x->dsink.bytes);
        outs[n++] = &x->dsink;
    } else {
        outs[n++] = &x->mem[T_O];
        test_poison(FLASHATTN_DTYPE_FP32, x->lse.host, x->lse.bytes);
        outs[n++] = &x->lse;
    }
    for (i = 0; i < n; ++i) {
        if (outs[i] != &x->dsink && outs[i] != &x->lse) test_poison(x->s.dtype, outs[i]->host, outs[i]->bytes);
        if (test_mem_upload(outs[i])) return ctx_fail(x, "upload before the %s failed", backward ? "backward" : "forward");
    }
    memset(ws->host, 0xff, ws->bytes); /* NaN as fp32: the library must not read what it did not write */
    if (test_mem_upload(ws)) return ctx_fail(x, "workspace upload failed");
    st = x->c->use_args ? run_args(x, backward) : run_classic(x, backward);
    if (st != FLASHATTN_SUCCESS)
        return ctx_fail(x, "the %s returned %d (%s): %s", backward ? "backward" : "forward", (int)st,
                        flashattn_status_string(st), flashattn_last_error());
    err = test_on_device(TEST_BACKEND) ? test_device_error() : NULL;
    if (err) return ctx_fail(x, "the %s failed on the device: %s", backward ? "backward" : "forward", err);
    for (i = 0; i < n; ++i)
        if (test_mem_download(outs[i])) return ctx_fail(x, "download failed");
    return 0;
}

/* ---- Checking ---------------------------------------------------------------------------------- */

/* The reference of one case: gradients [token][head][dim], where rows and keys take part, and the
 * bound's parts (per tensor for the common reference's rule; per element for vref's). */
typedef struct reference {
    double *grad[3], *low[3]; /* dQ, dK, dV; low: grad_reference_lowp (fp16/bf16 without vref) */
    unsigned char *q_sees, *k_seen;
    double dsink[64];
    double adev[4]; /* dQ, dK, dV, dsink: the effect of the library's roundings (arithmetic_effect) */
    double smax;    /* the largest |score| (scaled, capped, biased), scale sum |q k| or |sink logit| */
    int vref;
} reference;

static void reference_free(reference *r) {
    int i;
    for (i = 0; i < 3; ++i) free(r->grad[i]), free(r->low[i]);
    free(r->q_sees), free(r->k_seen);
}

static double *widen(const float *x, int64_t n) {
    double *d = (double *)malloc((size_t)(n + 1) * sizeof(double));
    int64_t i;
    for (i = 0; d && i < n; ++i) d[i] = x[i];
    return d;
}

/* vref on the case's values (as the library read them): grad [3] and dsink [hq]; D from O
 * rounded to the dtype when round_o, and then, where cap_err [2] is given, cap_rounding()'s
 * variances. */
static void run_vref(const ctx *x, int round_o, double *const *grad, double *dsink, unsigned char *q_sees,
                     unsigned char *k_seen, double *smax, double *const *cap_err) {
    const case_shape *s = &x->s;
    const mix_case *c = x->c;
    double *in[4], sink[64], slope[64], *part = (double *)malloc((size_t)(s->batch * s->hq) * sizeof(double));
    double *big = (double *)malloc((size_t)(s->batch * s->hk) * sizeof(double));
    vref r;
    int64_t h;
    in[0] = widen(x->logical[T_Q], s->total_q * s->hq * s->d);
    in[1] = widen(x->logical[T_K], s->total_k * s->hk * s->d);
    in[2] = widen(x->logical[T_V], s->total_k * s->hk * s->dv);
    in[3] = widen(x->logical[T_DO], s->total_q * s->hq * s->dv);
    for (h = 0; h < s->hq; ++h) sink[h] = ((const float *)x->sink.host)[h], slope[h] = ((const float *)x->slope.host)[h];
    memset(&r, 0, sizeof r);
    r.batch = s->batch, r.hq = s->hq, r.hk = s->hk, r.d = s->d, r.dv = s->dv;
    r.len_q = s->len_q, r.len_k = s->len_k, r.start_q = s->start_q, r.start_k = s->start_k;
    r.causal = c->attn.causal, r.top_left = c->top_left;
    r.wl = c->attn.window_left, r.wr = c->attn.window_right, r.sink_tokens = c->sink_tokens;
    r.scale = s->scale, r.softcap = c->attn.softcap;
    r.q = in[0], r.k = in[1], r.v = in[2], r.dout = in[3];
    r.sink = c->sinks ? sink : NULL, r.slope = c->alibi ? slope : NULL;
    r.gq = grad[0], r.gk = grad[1], r.gv = grad[2], r.dsink_part = part;
    r.q_sees = q_sees, r.k_seen = k_seen;
    r.o_dtype = round_o ? s->dtype : (flashattn_dtype_t)0;
    r.smax_job = big;
    if (round_o && cap_err) r.eq = cap_err[0], r.ek = cap_err[1];
    vref_run(&r, s->total_q, s->total_k, dsink);
    for (h = 0; smax && h < s->batch * s->hk; ++h)
        if (big[h] > *smax) *smax = big[h];
    for (h = 0; h < 4; ++h) free(in[h]);
    free(part), free(big);
}

static double max_abs(const double *a, int64_t n) {
    double m = 0.0;
    int64_t i;
    for (i = 0; i < n; ++i)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

static double max_diff(const double *a, const double *b, int64_t n) {
    double m = 0.0;
    int64_t i;
    for (i = 0; i < n; ++i)
        if (fabs(a[i] - b[i]) > m) m = fabs(a[i] - b[i]);
    return m;
}

/* Two roundings of the library's arithmetic that the bounds cannot see otherwise. The backward
 * reads O in the dtype, and FlashAttention's D = rowsum(dO * O) carries its rounding into every
 * dS = P (dP - D): under a peaked softmax (large scores) that is most of the error, and neither
 * the naive-in-dtype baseline (D = sum(dP * P)) nor a per-element bound sees it. And Q K^T is an
 * fp32 dot product for every dtype: a tiny soft cap multiplies its rounding by scale / cap in
 * tanh's argument (2e-5 relative at scale 5.6, cap 0.006, fp32). adev: how far the exact gradient
 * moves with both (vref in double otherwise; the fp32 sums in order, as a sample of the error's
 * size, not the library's bits), plus 2 standard deviations of the latter's effect through the
 * chain factor (cap_rounding(): there a sample is least representative, few keys near tanh's knee
 * carry it). */
static int arithmetic_effect(const ctx *x, reference *ref, const int64_t *n) {
    double *moved[3], *cap_err[2], dsink[64];
    int i, ok = 1;
    for (i = 0; i < 3; ++i) ok &= (moved[i] = (double *)malloc((size_t)(n[i] + 1) * sizeof(double))) != NULL;
    for (i = 0; i < 2; ++i) ok &= (cap_err[i] = (double *)calloc((size_t)(n[i] + 1), sizeof(double))) != NULL;
    if (ok) {
        run_vref(x, 1, moved, dsink, NULL, NULL, &ref->smax, cap_err);
        for (i = 0; i < 3; ++i) ref->adev[i] = max_diff(moved[i], ref->grad[i], n[i]);
        for (i = 0; i < 2; ++i) ref->adev[i] += 2.0 * sqrt(max_abs(cap_err[i], n[i])); /* 4 sigma in the bound */
        ref->adev[3] = max_diff(dsink, ref->dsink, x->c->sinks ? x->s.hq : 0);
    }
    for (i = 0; i < 3; ++i) free(moved[i]);
    for (i = 0; i < 2; ++i) free(cap_err[i]);
    return ok ? 0 : -1;
}

static int make_reference(const ctx *x, reference *ref) {
    const case_shape *s = &x->s;
    const int64_t n[3] = {s->total_q * s->hq * s->d, s->total_k * s->hk * s->d, s->total_k * s->hk * s->dv};
    const int lowp = s->dtype != F32;
    int i;
    memset(ref, 0, sizeof *ref);
    ref->vref = needs_vref(x->c, s);
    for (i = 0; i < 3; ++i) {
        ref->grad[i] = (double *)malloc((size_t)(n[i] + 1) * sizeof(double));
        if (!ref->vref && lowp) ref->low[i] = (double *)malloc((size_t)(n[i] + 1) * sizeof(double));
        if (!ref->grad[i] || (!ref->vref && lowp && !ref->low[i])) return -1;
    }
    ref->q_sees = (unsigned char *)malloc((size_t)(s->total_q * s->hq + 1));
    ref->k_seen = (unsigned char *)malloc((size_t)(s->total_k * s->hk + 1));
    if (!ref->q_sees || !ref->k_seen) return -1;
    if (ref->vref) {
        run_vref(x, 0, ref->grad, ref->dsink, ref->q_sees, ref->k_seen, NULL, NULL);
    } else {
        const ref_problem p = shape_problem(s, &x->c->attn, x->logical[T_Q], x->logical[T_K], x->logical[T_V],
                                            x->logical[T_DO]);
        grad_reference(&p, ref->grad[0], ref->grad[1], ref->grad[2], NULL, ref->q_sees, ref->k_seen);
        if (lowp) grad_reference_lowp(&p, ref->low[0], ref->low[1], ref->low[2]);
    }
    return arithmetic_effect(x, ref, n);
}

/* test_variants.c's per-element factor of (1 + |ref|). */
static double variant_factor(flashattn_dtype_t dt) { return dt == F32 ? 2e-4 : dt == F16 ? 1.5e-2 : 6e-2; }

/* test_backward.c's 1e-6 floor, for fp32 cancellation noise where the exact gradient is 0 (a row
 * that sees one key: dP - D = 0), grown with what that noise scales with on random shapes: D and
 * dP are fp32 dot products of head_dim_v terms of magnitude <= 1, so dS = P (dP - D) carries up to
 * 2^-23 head_dim_v P times the scale; a dQ row sums it over keys with P summing to 1, a key's dK
 * over the rows of its group (a random walk: sqrt(rows)). E.g. 2.9e-6 in dQ at head_dim_v 224,
 * scale 0.75, and 1.3e-6 in dK of one key seen by 848 rows, both exactly 0 in exact arithmetic.
 * dV = P^T dO has no dS in it: test_backward.c's floor alone. */
static double noise_floor(const ctx *x, int g) {
    const double unit = ldexp((double)x->s.dv * x->s.scale, -23);
    const double rows = (double)(x->s.hq / x->s.hk) * (double)ref_longest(x->s.len_q, x->s.batch);
    return 1e-6 + (g == 0 ? unit : g == 1 ? unit * sqrt(rows) : 0.0);
}

/* Every element of gradient g (0 dQ, 1 dK, 2 dV) against the reference; gaps keep the poison. */
static int check_gradient(ctx *x, const reference *ref, int g) {
    const int t = T_DQ + g;
    const case_shape *s = &x->s;
    const tensor_layout *l = &x->lay[t];
    const unsigned char *seen = g == 0 ? ref->q_sees : ref->k_seen;
    unsigned char *inside = (unsigned char *)calloc(l->elems, 1);
    element_errors errs = element_errors_none();
    double max_ref, base, abs_tol, rel_tol;
    int q_side;
    int64_t heads, dim, b, i, h, col;
    long long gap;
    if (!inside) return ctx_fail(x, "out of memory");
    tensor_shape(x, t, &q_side, &heads, &dim);
    reference_scale(ref->grad[g], ref->low[g], (size_t)((q_side ? s->total_q : s->total_k) * heads * dim), &max_ref, &base);
    rel_tol = 0.0;
    if (s->dtype == F32)
        abs_tol = 2e-5 * max_ref + noise_floor(x, g);
    else if (ref->vref)
        abs_tol = rel_tol = variant_factor(s->dtype);
    else
        abs_tol = 2.0 * base + 1e-4 * max_ref + noise_floor(x, g);
    /* Every dtype's P = exp(s - LSE) is fp32, off by ~2^-24 (|s| + |LSE|) relative: 16 of those
     * (1e-3 of max|ref| at scale 52, scores of 746, fp16: beyond test_variants.c's per element). */
    abs_tol += ldexp(ref->smax, -20) * max_ref;
    abs_tol += 2.0 * ref->adev[g];
    for (b = 0; b < s->batch; ++b) {
        const int64_t len = q_side ? s->len_q[b] : s->len_k[b], start = q_side ? s->start_q[b] : s->start_k[b];
        for (i = 0; i < len; ++i)
            for (h = 0; h < heads; ++h) {
                const int64_t off = layout_offset(l, s->varlen, b, start + i, i, h), row = (start + i) * heads + h;
                for (col = 0; col < dim; ++col) {
                    const double want = ref->grad[g][row * dim + col];
                    const double got = test_load(s->dtype, (const unsigned char *)x->mem[t].host + x->es * (size_t)(off + col));
                    inside[off + col] = 1;
                    if (isnan(want) && isnan(got)) continue; /* the NaN reached it, as it must */
                    element_errors_add(&errs, b, i, h, col, got, want, abs_tol + rel_tol * fabs(want), !seen[row]);
                }
            }
    }
    gap = errs.b < 0 ? first_written_gap(s->dtype, x->mem[t].host, inside, l->elems) : -1;
    free(inside);
    if (test_verbose())
        printf("  %s: max err %.3e (bound %.3e + %.1e |ref|, max|ref| %.3e, %s baseline %.3e, roundings %.3e, "
               "max|s| %.3g)\n", tensor_names[t], errs.max_err, abs_tol, rel_tol, max_ref, ref->vref ? "no" : "naive",
               base, ref->adev[g], ref->smax);
    if (errs.b >= 0)
        return ctx_fail(x, "%s (%s reference): max|out-ref| %.4e, bound %.4e + %.1e |ref| (max|ref| %.4e, baseline %.4e); "
                        "first bad at batch %lld %s %lld head %lld col %lld: out %.8g ref %.8g%s",
                        tensor_names[t], ref->vref ? "this file's" : "common", errs.max_err, abs_tol, rel_tol, max_ref,
                        base, errs.b, q_side ? "row" : "key", errs.i, errs.h, errs.col, errs.out, errs.ref,
                        errs.must_be_zero ? (q_side ? " (the row sees no key: must be 0)" : " (no query sees the key: must be 0)") : "");
    if (gap >= 0) return ctx_fail(x, "%s element %lld lies in a stride gap but was written", tensor_names[t], gap);
    return 0;
}

static int check_dsink(ctx *x, const reference *ref) {
    const double f = variant_factor(x->s.dtype);
    int64_t h;
    for (h = 0; h < x->s.hq && x->c->sinks; ++h) {
        const double got = ((const float *)x->dsink.host)[h], want = ref->dsink[h];
        const double bound = f * (1.0 + fabs(want)) + 2.0 * ref->adev[3];
        if (isnan(want) ? !isnan(got) : !(fabs(got - want) <= bound))
            return ctx_fail(x, "dsink[%lld] = %.8g, reference %.8g (bound %.3g)", (long long)h, got, want, bound);
    }
    return 0;
}

/* The tensors the backward reads; snapshots of what the library sees. */
static int inputs_of(ctx *x, const test_mem **out) {
    int n = 0;
    out[n++] = &x->mem[T_Q], out[n++] = &x->mem[T_K], out[n++] = &x->mem[T_V], out[n++] = &x->mem[T_O];
    out[n++] = &x->mem[T_DO], out[n++] = &x->lse, out[n++] = &x->cu_q, out[n++] = &x->cu_k;
    out[n++] = &x->sink, out[n++] = &x->slope;
    return n;
}

/* The plan finalized again with another thread count, its backward workspace grown to fit: the cpu
 * backend's results do not depend on the count. */
static int other_thread_count(ctx *x) {
    size_t bytes = 0;
    set_cpu_threads(x->c->threads == 1 ? 3 : 1);
    CALL(x, flashattn_plan_finalize(x->plan));
    set_cpu_threads(0);
    CALL(x, flashattn_plan_get_backward_workspace_size(x->plan, &bytes));
    if (bytes > x->ws_bwd) {
        test_mem_free(&x->ws_b);
        if (alloc_buf(&x->ws_b, bytes)) return ctx_fail(x, "no workspace");
    }
    x->ws_bwd = bytes;
    return 0;
}

/* A second backward gives the same bits in dQ, dK, dV and dsink (on the cpu with another thread
 * count). */
static int check_repeat(ctx *x) {
    test_mem *outs[4] = {&x->mem[T_DQ], &x->mem[T_DK], &x->mem[T_DV], &x->dsink};
    unsigned char *first[4] = {NULL, NULL, NULL, NULL};
    int i, bad = -1, result = 0;
    for (i = 0; i < 4; ++i) {
        if (!(first[i] = (unsigned char *)malloc(outs[i]->bytes))) result = ctx_fail(x, "out of memory");
        else memcpy(first[i], outs[i]->host, outs[i]->bytes);
    }
    if (result == 0 && TEST_BACKEND == FLASHATTN_BACKEND_CPU) result = other_thread_count(x);
    if (result == 0 && (result = ctx_run(x, 1)) == 0)
        for (i = 0; i < 4 && bad < 0; ++i)
            if (memcmp(first[i], outs[i]->host, outs[i]->bytes) != 0) bad = i;
    if (bad >= 0)
        result = ctx_fail(x, "a second backward differs in %s%s", bad < 3 ? tensor_names[T_DQ + bad] : "dsink",
                          TEST_BACKEND == FLASHATTN_BACKEND_CPU ? " with another thread count (the cpu backend's bits depend on neither)"
                                                                : " although FLASHATTN_I64_DETERMINISTIC = 1");
    for (i = 0; i < 4; ++i) free(first[i]);
    return result;
}

static void run_case(const mix_case *c, uint64_t seed, int index) {
    ctx x;
    test_rng rng;
    reference ref;
    const test_mem *inputs[10];
    unsigned char *snap[10];
    int n, i, failed = 0, planned;
    double t0 = test_now_seconds();
    memset(&x, 0, sizeof x);
    memset(&ref, 0, sizeof ref);
    memset(snap, 0, sizeof snap);
    x.c = c;
    x.index = index;
    shape_resolve(&x.s, &c->attn, c->attn.dtype);
    x.es = test_dtype_size(c->attn.dtype);
    test_rng_seed(&rng, seed);
    snprintf(x.desc, sizeof x.desc, "[case %d seed=%llu]", index, (unsigned long long)seed);
    if (ctx_inputs(&x, &rng)) goto done;
    describe(&x, seed);
    planned = ctx_plan(&x);
    if (planned != 0 || ctx_run(&x, 0)) goto done;
    n = inputs_of(&x, inputs);
    for (i = 0; i < n; ++i) {
        if (!(snap[i] = (unsigned char *)malloc(inputs[i]->bytes)) || test_mem_download(inputs[i])) goto done;
        memcpy(snap[i], inputs[i]->host, inputs[i]->bytes);
    }
    if (ctx_run(&x, 1)) goto done;
    if (make_reference(&x, &ref)) {
        ctx_fail(&x, "out of memory for the reference");
        goto done;
    }
    if (test_verbose()) printf("%s\n", x.desc);
    for (i = 0; i < 3 && !failed; ++i) failed = check_gradient(&x, &ref, i);
    if (!failed) failed = check_dsink(&x, &ref);
    for (i = 0; i < n && !failed; ++i)
        if (!test_mem_unchanged(inputs[i], snap[i])) failed = ctx_fail(&x, "the backward changed an input (%d of q, k, v, o, dout, lse, cu_q, cu_k, sink, slope)", i);
    if (!failed && (TEST_BACKEND == FLASHATTN_BACKEND_CPU || c->deterministic)) failed = check_repeat(&x);
    if (!failed) ++g_checked;
    if (test_verbose()) printf("  %.2f s\n", test_now_seconds() - t0);
done:
    for (i = 0; i < 10; ++i) free(snap[i]);
    reference_free(&ref);
    ctx_free(&x);
}

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? atoi(v) : fallback;
}

int main(void) {
    const int reduced = test_reduced_grid();
    const int only = env_int("FLASHATTN_TEST_MIX_ONLY", -1);
    int cases = env_int("FLASHATTN_TEST_MIX_CASES", DEFAULT_CASES), i;
    const double t0 = test_now_seconds();
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) {
        int32_t major = 0, minor = 0;
        test_require_gpu_backend(TEST_BACKEND, &major, &minor);
    }
    g_seed = test_seed_from_env(g_seed);
    if (reduced) cases = (cases + 3) / 4;
    printf("random backward mix on backend %s, seed %llu (FLASHATTN_TEST_SEED), %d cases (FLASHATTN_TEST_MIX_CASES)\n",
           test_backend_name(TEST_BACKEND), (unsigned long long)g_seed, only >= 0 ? 1 : cases);
    fflush(stdout);
    for (i = 0; i < 8 && only < 0; ++i) vref_self_check(test_case_seed(g_seed ^ 0xfdull, (size_t)i));
    for (i = 0; i < (int)NUM_FIXED && only < 0; ++i) {
        mix_case c = fixed_cases[i];
        if (TEST_BACKEND != FLASHATTN_BACKEND_CPU && c.attn.dtype == F32) c.attn.dtype = B16;
        run_case(&c, 0xf1ed00ull + (uint64_t)i, -1);
    }
    for (i = only >= 0 ? only : 0; i < (only >= 0 ? only + 1 : cases); ++i) {
        const uint64_t seed = test_case_seed(g_seed, (size_t)i);
        test_rng rng;
        mix_case c;
        test_rng_seed(&rng, seed);
        draw_case(&rng, &c);
        run_case(&c, seed ^ 0x1a7e5ull, i);
    }
    printf("test_random_grad: %d cases checked, %d forward and %d backward refusals (GPU), %d failures, %.1f s\n",
           g_checked, g_refused_fwd, g_refused_bwd, g_failures, test_now_seconds() - t0);
    return g_failures == 0 ? 0 : 1;
}
