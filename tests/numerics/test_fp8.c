/* FP8 (E4M3) inputs (issue 17) on one backend (TEST_BACKEND) against this file's own double
 * reference of the dequantized inputs. Built once per backend: test_fp8_cpu (label cpu) and
 * test_fp8_fa3 (label gpu, skipped without a GPU).
 *
 * Inputs: random E4M3 bytes (every finite code with |value| <= 8, NaN codes excluded), decoded here
 * from the format's definition (not through the library), times random descales in [0.25, 2] per
 * (sequence, key/value head), or one per tensor (strides 0, 0), or a padded [batch][heads_kv + 3]
 * layout. O (bf16 or fp16) and LSE poisoned before each run; every element of O checked, the gaps
 * of a strided O must keep the poison, rows that see no key must be exactly 0 with LSE -inf.
 *
 * Tolerance (CPU): the backend computes in fp32 on the dequantized inputs (each q·descale rounded
 * once to fp32) and rounds O once to the output type, so |O - ref| <= u·|ref| + 1e-5·(1 + max|ref|)
 * with u = 2^-8 (bf16: half an ulp is at most 2^-8 relative) or 2^-11 (fp16); LSE within
 * 1e-5·(1 + |ref|). A GPU backend without an FP8 kernel (fa1, fa2) must refuse every case at
 * finalize with NOT_SUPPORTED and a reason naming FP8.
 *
 * The FA3 FP8 kernel (issue 17), test_fp8_fa3 (and test_fp8_fa3_kernel_few_ctas, on 3 persistent
 * CTAs): every case whose head dim is a multiple of 16 and equals
 * head_dim_v must run (the rest must be refused naming FP8), with inputs of magnitude <= 2 (so
 * that the logits stay moderate) and this tolerance per element of O, from the kernel's error
 * sources (A = sum_j p_j |v_j| / l, the reference's weighted mean of |v| for that column):
 *   - P rounded to E4M3 after the x256: relative error <= 2^-4 (3 mantissa bits, round to
 *     nearest) for every probability >= 2^-14 (256 p normal), so <= 2^-4 A; smaller ones are
 *     subnormal, absolute error <= 2^-10 / 256 = 2^-18 each: 2^-18 sum_j |v_j| / l. The kernel's
 *     running row max may lag the true one by up to 0.75 in log2 units (its max slack, which
 *     lets it skip rescaling O): P is then 256 2^d exp(s - m) with 0 <= d <= 0.75, at most
 *     256 x 2^0.75 = 431 < 448 (never saturated), and the extra factor 2^d only moves values
 *     up out of the subnormals, so both bounds hold as stated (the same max is used for P,
 *     the row sums and the LSE, which are therefore exact in it);
 *   - the E4M3 tensor cores accumulate with fewer bits than fp32: test_fp8_primitives passed on
 *     the H200 with every sum within 1e-3 of the sum of its terms' magnitudes, so a score is off
 *     by at most 1e-3 M (M: the row's largest scale dq dk sum_c |q_c k_c|; a soft cap only
 *     shrinks it), which moves p_j / l by a factor within exp(+-2e-3 M), and P V is off by
 *     1e-3 A;
 *   - O rounded once to bf16/fp16: u |O|.
 * So |O - ref| <= (2^-4 + 2.2e-3 M + 1e-3) A + 2^-18 sum_j |v_j| / l + u |ref| + 1e-6, and the
 * LSE within 1.1e-3 M + 1e-5 (1 + |ref|). That bound lets every rounding error of a row point
 * the same way; on random inputs they add like a random walk, so it is loose by about the square
 * root of the number of keys a row sees. A wrong key permutation or transposition, which mixes
 * wrong values of V into every element, can then stay under it element by element when the
 * softmax is flat; so each case also needs the RMS of O - ref to be at most a quarter of the RMS
 * of the element tolerances (a heuristic, not a bound; the value is printed with
 * FLASHATTN_TEST_VERBOSE). Checked on a numpy emulation of the kernel's P rounding (x256, E4M3,
 * row sums unrounded, O to bf16) for shapes of this grid, inputs |x| <= 2: the largest element
 * ratio was 0.6 (causal rows with few keys) and the RMS ratio at most 0.075; with V's keys
 * permuted within each 32-key step as a transposer bug would, 2 to 200 and 0.77 to 2.
 *
 * Bad arguments: each descale missing, descales on a bf16 plan, the 0.2 execute call on an FP8
 * plan, output dtypes that do not fit, descale strides on a non-FP8 plan, a non-finite descale
 * (CPU: refused, O untouched), a descale array overlapping O, the backward and the merge of an FP8
 * plan (NOT_SUPPORTED), a paged FP8 plan on the CPU (NOT_SUPPORTED). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_expect.h"
#include "test_support.h"

static int g_checked = 0;
static int g_refused = 0;
static double g_worst_ratio = 0; /* kernel mode: the largest |O - ref| / tolerance seen */

/* The FA3 FP8 kernel is under test (test_fp8_fa3): the cases it runs have the kernel's tolerance. */
static int kernel_mode(void) { return TEST_BACKEND == FLASHATTN_BACKEND_FA3; }

/* E4M3 by its definition: (-1)^s · 2^(e-7) · (1 + m/8) for e > 0, (-1)^s · 2^-6 · m/8 for e = 0;
 * e = 15, m = 7 is NaN. */
static double e4m3_decode(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) return NAN;
    v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

/* A random finite E4M3 code of magnitude at most `max` (8: a quarter of them zero or small). */
static uint8_t random_e4m3(test_rng *rng, double max) {
    for (;;) {
        const uint8_t b = (uint8_t)(test_rng_next(rng) >> 56);
        const double v = e4m3_decode(b);
        if (!isnan(v) && fabs(v) <= max) return b;
    }
}

typedef struct fcase {
    int64_t batch, sq, sk, hq, hk, d, dv;
    int causal;
    int64_t wl, wr;
    double softcap;
    int varlen;        /* random lengths (one sequence may be empty) */
    int strided;       /* padded Q, K, V, O strides */
    int descales;      /* 0: one per tensor (strides 0, 0); 1: [batch][hk] default; 2: padded strides */
    flashattn_dtype_t out;  /* bf16 or fp16 */
    int lse;
} fcase;

typedef struct strides3 {
    int64_t batch, row, head;
} strides3;

/* [batch][rows][heads][dim] strides, padded when asked (rows contiguous: pads keep 16-byte rows). */
static strides3 layout_of(int64_t rows, int64_t heads, int64_t dim, int padded) {
    strides3 s;
    s.head = dim + (padded ? 16 : 0);
    s.row = heads * s.head + (padded ? 32 : 0);
    s.batch = rows * s.row + (padded ? 48 : 0);
    return s;
}

static size_t span(const strides3 *s, int64_t batch, int64_t rows, int64_t heads, int64_t dim, int varlen) {
    const int64_t outer = varlen ? 1 : batch;
    if (rows == 0) return 1;
    return (size_t)((outer - 1) * s->batch + (rows - 1) * s->row + (heads - 1) * s->head + dim);
}

/* Which keys query row i of a sequence (sq queries, sk keys) sees: the library's bottom-right rule,
 * written out again here. */
static void visible(const fcase *c, int64_t i, int64_t sq, int64_t sk, int64_t *first, int64_t *last) {
    const int64_t diag = i + sk - sq;
    *first = 0;
    *last = sk - 1;
    if (c->causal && diag < *last) *last = diag;
    if (c->wr >= 0 && diag + c->wr < *last) *last = diag + c->wr;
    if (c->wl >= 0 && diag - c->wl > *first) *first = diag - c->wl;
}

typedef struct run_data {
    int64_t *len_q, *len_k, *start_q, *start_k;
    int64_t total_q, total_k;
    strides3 lq, lk, lv, lo;
    int64_t dbs, dhs; /* descale strides */
    size_t descale_elems;
} run_data;

static double descale_at(const run_data *r, const float *d, int64_t b, int64_t kvh) {
    return d[b * r->dbs + kvh * r->dhs];
}

/* Dequantized element of a tensor. */
static double deq(const uint8_t *t, const strides3 *s, int varlen, int64_t b, int64_t tok, int64_t h, int64_t col,
                  double factor) {
    const int64_t off = (varlen ? 0 : b * s->batch) + tok * s->row + h * s->head + col;
    return e4m3_decode(t[off]) * factor;
}

static int run_case(const fcase *c, uint64_t seed) {
    const flashattn_backend_t backend = TEST_BACKEND;
    const int dev = test_on_device(backend);
    const int64_t dv = c->dv ? c->dv : c->d;
    const int64_t group = c->hq / c->hk;
    const double scale = 1.0 / sqrt((double)c->d);
    test_rng rng;
    run_data r;
    test_mem mq, mk, mv, mo, ml, mdq, mdk, mdv, mcq, mck, mws;
    flashattn_plan_t *plan = NULL;
    flashattn_args_t *args = NULL;
    flashattn_status_t st;
    int64_t b, i, h, j, col;
    int fails_before = g_failures;
    size_t ws = 0;
    const size_t osize = 2;
    double max_ref = 0, max_err = 0;
    char what[256];

    memset(&r, 0, sizeof r);
    memset(&mcq, 0, sizeof mcq);
    memset(&mck, 0, sizeof mck);
    memset(&mws, 0, sizeof mws);
    test_rng_seed(&rng, seed);
    r.len_q = calloc((size_t)c->batch, sizeof(int64_t));
    r.len_k = calloc((size_t)c->batch, sizeof(int64_t));
    r.start_q = calloc((size_t)c->batch, sizeof(int64_t));
    r.start_k = calloc((size_t)c->batch, sizeof(int64_t));
    for (b = 0; b < c->batch; ++b) {
        r.len_q[b] = c->varlen ? test_rng_range(&rng, 0, c->sq) : c->sq;
        r.len_k[b] = c->varlen ? test_rng_range(&rng, 1, c->sk) : c->sk;
        r.start_q[b] = r.total_q;
        r.start_k[b] = r.total_k;
        r.total_q += r.len_q[b];
        r.total_k += r.len_k[b];
    }
    {
        const int64_t rq = c->varlen ? r.total_q : c->sq, rk = c->varlen ? r.total_k : c->sk;
        r.lq = layout_of(rq, c->hq, c->d, c->strided);
        r.lk = layout_of(rk, c->hk, c->d, c->strided);
        r.lv = layout_of(rk, c->hk, dv, c->strided);
        r.lo = layout_of(rq, c->hq, dv, c->strided);
        r.dbs = c->descales == 0 ? 0 : c->descales == 1 ? c->hk : c->hk + 3;
        r.dhs = c->descales == 0 ? 0 : c->descales == 1 ? 1 : 1;
        r.descale_elems = (size_t)((c->batch - 1) * r.dbs + (c->hk - 1) * r.dhs + 1);
        if (test_mem_alloc(&mq, span(&r.lq, c->batch, rq, c->hq, c->d, c->varlen), dev) ||
            test_mem_alloc(&mk, span(&r.lk, c->batch, rk, c->hk, c->d, c->varlen), dev) ||
            test_mem_alloc(&mv, span(&r.lv, c->batch, rk, c->hk, dv, c->varlen), dev) ||
            test_mem_alloc(&mo, span(&r.lo, c->batch, rq, c->hq, dv, c->varlen) * osize, dev) ||
            test_mem_alloc(&ml, (size_t)((c->varlen ? r.total_q : c->batch * c->sq) * c->hq + 1) * 4, dev) ||
            test_mem_alloc(&mdq, r.descale_elems * 4, dev) || test_mem_alloc(&mdk, r.descale_elems * 4, dev) ||
            test_mem_alloc(&mdv, r.descale_elems * 4, dev)) {
            printf("FAIL: out of memory\n");
            return ++g_failures, 1;
        }
    }
    /* Inputs: every byte random (gaps of the strided layouts too: the kernel must not read them
     * into the result; they are finite codes, so a read would show as a wrong value). */
    {
        const test_mem *ins[3] = {&mq, &mk, &mv};
        size_t n;
        int t;
        const double max = kernel_mode() ? 2.0 : 8.0;
        for (t = 0; t < 3; ++t)
            for (n = 0; n < ins[t]->bytes; ++n) ((uint8_t *)ins[t]->host)[n] = random_e4m3(&rng, max);
        for (n = 0; n < r.descale_elems; ++n) {
            ((float *)mdq.host)[n] = (float)test_rng_uniform(&rng, 0.25, 2.0);
            ((float *)mdk.host)[n] = (float)test_rng_uniform(&rng, 0.25, 2.0);
            ((float *)mdv.host)[n] = (float)test_rng_uniform(&rng, 0.25, 2.0);
        }
    }
    test_poison(c->out, mo.host, mo.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, ml.host, ml.bytes);

    snprintf(what, sizeof what,
             "[%s b=%lld sq=%lld sk=%lld hq=%lld hk=%lld d=%lld dv=%lld causal=%d w=(%lld,%lld) cap=%g varlen=%d "
             "strided=%d descales=%d out=%s]",
             test_backend_name(backend), (long long)c->batch, (long long)c->sq, (long long)c->sk, (long long)c->hq,
             (long long)c->hk, (long long)c->d, (long long)dv, c->causal, (long long)c->wl, (long long)c->wr,
             c->softcap, c->varlen, c->strided, c->descales, test_dtype_name(c->out));

    flashattn_plan_create(&plan);
    {
        const struct { flashattn_i64_param_t k; int64_t v; } keys[] = {
            {FLASHATTN_I64_BATCH, c->batch}, {FLASHATTN_I64_SEQLEN_Q, c->sq}, {FLASHATTN_I64_SEQLEN_K, c->sk},
            {FLASHATTN_I64_HEADS_Q, c->hq}, {FLASHATTN_I64_HEADS_KV, c->hk}, {FLASHATTN_I64_HEAD_DIM, c->d},
            {FLASHATTN_I64_HEAD_DIM_V, dv}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP8_E4M3},
            {FLASHATTN_I64_CAUSAL, c->causal}, {FLASHATTN_I64_WINDOW_LEFT, c->wl}, {FLASHATTN_I64_WINDOW_RIGHT, c->wr},
            {FLASHATTN_I64_BACKEND, backend}, {FLASHATTN_I64_VARLEN, c->varlen},
            {FLASHATTN_I64_Q_ROW_STRIDE, r.lq.row}, {FLASHATTN_I64_Q_HEAD_STRIDE, r.lq.head},
            {FLASHATTN_I64_K_ROW_STRIDE, r.lk.row}, {FLASHATTN_I64_K_HEAD_STRIDE, r.lk.head},
            {FLASHATTN_I64_V_ROW_STRIDE, r.lv.row}, {FLASHATTN_I64_V_HEAD_STRIDE, r.lv.head},
            {FLASHATTN_I64_O_ROW_STRIDE, r.lo.row}, {FLASHATTN_I64_O_HEAD_STRIDE, r.lo.head},
            {FLASHATTN_I64_OUTPUT_DTYPE, c->out}};
        size_t k;
        for (k = 0; k < sizeof keys / sizeof keys[0]; ++k)
            EXPECT(flashattn_plan_set_i64(plan, keys[k].k, keys[k].v) == FLASHATTN_SUCCESS, "%s set key %d: %s", what,
                   (int)keys[k].k, flashattn_last_error());
        if (c->varlen) {
            flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, r.total_q);
            flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, r.total_k);
        } else {
            flashattn_plan_set_i64(plan, FLASHATTN_I64_Q_BATCH_STRIDE, r.lq.batch);
            flashattn_plan_set_i64(plan, FLASHATTN_I64_K_BATCH_STRIDE, r.lk.batch);
            flashattn_plan_set_i64(plan, FLASHATTN_I64_V_BATCH_STRIDE, r.lv.batch);
            flashattn_plan_set_i64(plan, FLASHATTN_I64_O_BATCH_STRIDE, r.lo.batch);
        }
        if (c->descales != 1) {  /* 1 keeps the defaults: [batch][heads_kv] */
            flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_BATCH_STRIDE, r.dbs);
            flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_HEAD_STRIDE, r.dhs);
        }
        if (c->softcap > 0) flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap);
    }
    st = flashattn_plan_finalize(plan);
    if (backend != FLASHATTN_BACKEND_CPU && st == FLASHATTN_ERROR_NOT_SUPPORTED) {
        const char *msg = flashattn_last_error();
        EXPECT(strstr(msg, "FP8") != NULL, "%s refused without naming FP8: %s", what, msg);
        EXPECT(!kernel_mode() || c->d % 16 != 0 || dv != c->d, "%s: the fa3 FP8 kernel refused a case it runs: %s",
               what, msg);
        ++g_refused;
        goto done;
    }
    EXPECT(st == FLASHATTN_SUCCESS, "%s finalize: %s", what, flashattn_last_error());
    if (st != FLASHATTN_SUCCESS) goto done;
    {
        int64_t od = 0;
        flashattn_plan_get_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, &od);
        EXPECT(od == c->out, "%s OUTPUT_DTYPE reads %lld", what, (long long)od);
    }
    flashattn_plan_get_workspace_size(plan, &ws);
    if (ws > 0 && test_mem_alloc(&mws, ws, dev)) {
        printf("FAIL: out of memory (workspace)\n");
        ++g_failures;
        goto done;
    }
    if (c->varlen) {
        int32_t *cq, *ck;
        test_mem_alloc(&mcq, (size_t)(c->batch + 1) * 4, dev);
        test_mem_alloc(&mck, (size_t)(c->batch + 1) * 4, dev);
        cq = (int32_t *)mcq.host;
        ck = (int32_t *)mck.host;
        for (b = 0; b < c->batch; ++b) {
            cq[b] = (int32_t)r.start_q[b];
            ck[b] = (int32_t)r.start_k[b];
        }
        cq[c->batch] = (int32_t)r.total_q;
        ck[c->batch] = (int32_t)r.total_k;
    }
    {
        const test_mem *all[] = {&mq, &mk, &mv, &mo, &ml, &mdq, &mdk, &mdv, &mcq, &mck};
        size_t k;
        for (k = 0; k < sizeof all / sizeof all[0]; ++k)
            if (all[k]->bytes) test_mem_upload(all[k]);
    }
    flashattn_args_create(&args);
    flashattn_args_set(args, FLASHATTN_ARG_Q, test_mem_ptr(&mq));
    flashattn_args_set(args, FLASHATTN_ARG_K, test_mem_ptr(&mk));
    flashattn_args_set(args, FLASHATTN_ARG_V, test_mem_ptr(&mv));
    flashattn_args_set(args, FLASHATTN_ARG_O, test_mem_ptr(&mo));
    if (c->lse) flashattn_args_set(args, FLASHATTN_ARG_LSE, test_mem_ptr(&ml));
    if (c->varlen) {
        flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_Q, test_mem_ptr(&mcq));
        flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_K, test_mem_ptr(&mck));
    }
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_Q, test_mem_ptr(&mdq));
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, test_mem_ptr(&mdk));
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_V, test_mem_ptr(&mdv));
    st = flashattn_plan_execute_args(plan, args, test_mem_ptr(&mws), ws, NULL);
    EXPECT(st == FLASHATTN_SUCCESS, "%s execute: %s", what, flashattn_last_error());
    if (st != FLASHATTN_SUCCESS) goto done;
    test_mem_download(&mo);
    test_mem_download(&ml);
    EXPECT(test_device_error() == NULL, "%s device error: %s", what, test_device_error());

    {
        /* Which elements of O are inside the tensor (the rest must keep the poison). */
        unsigned char *inside = calloc(mo.bytes / osize + 1, 1);
        const double u = c->out == FLASHATTN_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        double *ref = malloc((size_t)dv * sizeof(double));
        double *s = malloc((size_t)c->sk * sizeof(double));
        double *wabs = malloc((size_t)dv * sizeof(double));  /* sum_j p_j |v_j| per column */
        double *vabs = malloc((size_t)dv * sizeof(double));  /* sum_j |v_j| per column */
        const int km = kernel_mode();
        double sq_err = 0, sq_tol = 0; /* kernel mode: sums of squares over the checked elements */
        int64_t n_el = 0;
        for (b = 0; b < c->batch; ++b) {
            const int64_t sq = r.len_q[b], sk = r.len_k[b];
            for (h = 0; h < c->hq; ++h) {
                const int64_t kvh = h / group;
                const double dq = descale_at(&r, (const float *)mdq.host, b, kvh);
                const double dk = descale_at(&r, (const float *)mdk.host, b, kvh);
                const double dvv = descale_at(&r, (const float *)mdv.host, b, kvh);
                for (i = 0; i < sq; ++i) {
                    const int64_t qtok = c->varlen ? r.start_q[b] + i : i;
                    int64_t first, last;
                    double m = -INFINITY, l = 0, lse_ref, lse_out, mag = 0;
                    visible(c, i, sq, sk, &first, &last);
                    for (j = first; j <= last; ++j) {
                        const int64_t ktok = c->varlen ? r.start_k[b] + j : j;
                        double dot = 0, dot_abs = 0;
                        for (col = 0; col < c->d; ++col) {
                            const double t = deq(mq.host, &r.lq, c->varlen, b, qtok, h, col, dq) *
                                             deq(mk.host, &r.lk, c->varlen, b, ktok, kvh, col, dk);
                            dot += t;
                            dot_abs += fabs(t);
                        }
                        dot *= scale;
                        if (dot_abs * scale > mag) mag = dot_abs * scale;
                        if (c->softcap > 0) dot = c->softcap * tanh(dot / c->softcap);
                        s[j] = dot;
                        if (dot > m) m = dot;
                    }
                    for (col = 0; col < dv; ++col) ref[col] = wabs[col] = vabs[col] = 0;
                    for (j = first; j <= last; ++j) {
                        const int64_t ktok = c->varlen ? r.start_k[b] + j : j;
                        const double p = exp(s[j] - m);
                        l += p;
                        for (col = 0; col < dv; ++col) {
                            const double vv = deq(mv.host, &r.lv, c->varlen, b, ktok, kvh, col, dvv);
                            ref[col] += p * vv;
                            wabs[col] += p * fabs(vv);
                            vabs[col] += fabs(vv);
                        }
                    }
                    lse_ref = first <= last ? m + log(l) : -INFINITY;
                    for (col = 0; col < dv; ++col) {
                        const int64_t off = (c->varlen ? 0 : b * r.lo.batch) + qtok * r.lo.row + h * r.lo.head + col;
                        const double want = first <= last ? ref[col] / l : 0.0;
                        const double got = test_load(c->out, (const unsigned char *)mo.host + off * osize);
                        inside[off] = 1;
                        if (fabs(want) > max_ref) max_ref = fabs(want);
                        if (!(fabs(got - want) <= max_err)) max_err = isnan(got) ? INFINITY : fabs(got - want);
                        if (first > last) {
                            EXPECT(got == 0.0, "%s b=%lld h=%lld i=%lld sees no key: O[%lld] = %g, must be 0", what,
                                   (long long)b, (long long)h, (long long)i, (long long)col, got);
                        } else if (km) {
                            const double tol = (0x1p-4 + 2.2e-3 * mag + 1e-3) * wabs[col] / l +
                                               0x1p-18 * vabs[col] / l + u * fabs(want) + 1e-6;
                            const double ratio = fabs(got - want) / tol;
                            sq_err += (got - want) * (got - want);
                            sq_tol += tol * tol;
                            ++n_el;
                            if (!(ratio <= g_worst_ratio)) g_worst_ratio = isnan(ratio) ? INFINITY : ratio;
                            if (!(fabs(got - want) <= tol)) {
                                EXPECT(0, "%s b=%lld h=%lld i=%lld col=%lld: O = %.8g, reference %.8g, tolerance %.3g",
                                       what, (long long)b, (long long)h, (long long)i, (long long)col, got, want, tol);
                                goto next_row;
                            }
                        } else if (!(fabs(got - want) <= u * fabs(want) + 1e-5 * (1.0 + max_ref))) {
                            EXPECT(0, "%s b=%lld h=%lld i=%lld col=%lld: O = %.8g, reference %.8g", what, (long long)b,
                                   (long long)h, (long long)i, (long long)col, got, want);
                            goto next_row;
                        }
                    }
                    if (c->lse) {
                        const int64_t row = c->varlen ? h * r.total_q + qtok : (b * c->hq + h) * c->sq + i;
                        lse_out = ((const float *)ml.host)[row];
                        if (isinf(lse_ref))
                            EXPECT(isinf(lse_out) && lse_out < 0, "%s LSE of an empty row %g", what, lse_out);
                        else
                            EXPECT(fabs(lse_out - lse_ref) <= (km ? 1.1e-3 * mag : 0.0) + 1e-5 * (1 + fabs(lse_ref)),
                                   "%s b=%lld h=%lld i=%lld: LSE %.9g vs %.9g", what, (long long)b, (long long)h,
                                   (long long)i, lse_out, lse_ref);
                    }
                next_row:
                    if (g_failures - fails_before > 5) goto checked;
                }
            }
        }
    checked:
        if (km && g_failures == fails_before && sq_tol > 0) {
            const double rms_err = sqrt(sq_err / (double)n_el), rms_tol = sqrt(sq_tol / (double)n_el);
            EXPECT(rms_err <= 0.25 * rms_tol, "%s RMS error %.3g is above a quarter of the RMS tolerance %.3g", what,
                   rms_err, rms_tol);
            if (getenv("FLASHATTN_TEST_VERBOSE")) printf("%s RMS error / RMS tolerance %.3g\n", what, rms_err / rms_tol);
        }
        if (g_failures == fails_before) { /* (a case cut short has not marked every element) */
            const long long gap = first_written_gap(c->out, mo.host, inside, mo.bytes / osize);
            EXPECT(gap < 0, "%s O element %lld outside the tensor was written", what, gap);
        }
        free(inside);
        free(ref);
        free(s);
        free(wabs);
        free(vabs);
    }
    ++g_checked;
    if (getenv("FLASHATTN_TEST_VERBOSE")) printf("%s max|ref| %.3g max err %.3g\n", what, max_ref, max_err);
done:
    flashattn_args_destroy(args);
    flashattn_plan_destroy(plan);
    {
        test_mem *all[] = {&mq, &mk, &mv, &mo, &ml, &mdq, &mdk, &mdv, &mcq, &mck, &mws};
        size_t k;
        for (k = 0; k < sizeof all / sizeof all[0]; ++k)
            if (all[k]->bytes) test_mem_free(all[k]);
    }
    free(r.len_q);
    free(r.len_k);
    free(r.start_q);
    free(r.start_k);
    return g_failures != fails_before;
}

static void run_grid(void) {
    const flashattn_dtype_t bf = FLASHATTN_DTYPE_BF16, hf = FLASHATTN_DTYPE_FP16;
    const fcase cases[] = {
        /* b  sq   sk  hq hk   d  dv causal wl  wr  cap varlen strided descales out lse */
        {1, 1, 1, 1, 1, 64, 0, 0, -1, -1, 0, 0, 0, 0, bf, 1},
        {2, 37, 53, 4, 2, 64, 0, 0, -1, -1, 0, 0, 0, 1, bf, 1},
        {2, 53, 37, 4, 2, 64, 0, 1, -1, -1, 0, 0, 0, 1, bf, 1},  /* causal, sq > sk: rows see no key */
        {3, 64, 130, 6, 2, 128, 0, 1, -1, -1, 0, 0, 1, 2, hf, 1},
        {2, 129, 129, 2, 1, 256, 0, 0, 16, 8, 0, 0, 0, 0, bf, 1},
        {2, 70, 90, 4, 4, 32, 0, 0, -1, -1, 10.0, 0, 0, 1, hf, 0},
        {4, 48, 64, 8, 2, 64, 0, 1, -1, -1, 0, 1, 0, 1, bf, 1},  /* varlen */
        {3, 33, 77, 4, 1, 128, 0, 0, 20, -1, 0, 1, 1, 2, hf, 1}, /* varlen, strided, MQA */
        {2, 40, 40, 2, 2, 8, 0, 0, -1, -1, 0, 0, 0, 0, bf, 1},
        {2, 40, 50, 4, 2, 64, 32, 0, -1, -1, 0, 0, 0, 1, bf, 1},  /* head_dim_v != head_dim */
    };
    /* The FA3 FP8 kernel's own cases (also valid on the CPU): head dims 64, 128 and 256 (and 48,
     * 80, 192 padded to them), several 128-key tiles with ragged ends, several 128-row query tiles,
     * sq != sk both ways, GQA/MQA, causal and windows (masked edge tiles, skipped tiles, rows
     * with no key), soft cap, varlen, strided, per-tensor and padded descales, fp16 output. */
    const fcase kernel_cases[] = {
        /* b  sq   sk  hq hk   d  dv causal wl  wr  cap varlen strided descales out lse */
        {2, 300, 517, 4, 2, 128, 128, 0, -1, -1, 0, 0, 0, 1, bf, 1},
        {2, 517, 300, 4, 1, 128, 128, 1, -1, -1, 0, 0, 0, 0, hf, 1},  /* causal, sq > sk */
        {1, 260, 700, 2, 2, 256, 256, 0, -1, -1, 0, 0, 0, 1, bf, 1},
        {2, 200, 333, 6, 2, 256, 256, 1, -1, -1, 0, 0, 1, 2, hf, 1},  /* causal, strided, padded descales */
        {3, 150, 150, 4, 2, 128, 128, 0, 100, 30, 0, 0, 0, 1, bf, 1}, /* sliding window */
        {2, 129, 385, 2, 1, 64, 64, 0, -1, -1, 30.0, 0, 0, 1, bf, 1}, /* soft cap, padded head dim */
        {5, 250, 400, 4, 2, 128, 128, 1, -1, -1, 0, 1, 0, 1, bf, 1},  /* varlen */
        {3, 190, 260, 4, 4, 192, 192, 0, 64, -1, 0, 1, 1, 0, hf, 1},  /* varlen, strided, window, hdim 192 */
        {1, 1, 1000, 8, 1, 80, 80, 0, -1, -1, 0, 0, 0, 1, bf, 1},     /* one query, MQA */
        {2, 200, 300, 4, 2, 256, 256, 0, -1, -1, 20.0, 0, 0, 1, bf, 1}, /* soft cap at 256: its own mainloop form */
        /* Head dim 64's own kernel (and 48 padded to it): several key and query tiles. */
        {2, 300, 517, 4, 2, 64, 64, 1, -1, -1, 0, 0, 1, 2, hf, 1},    /* causal, strided, padded descales */
        {3, 260, 190, 6, 3, 48, 48, 0, 90, 40, 0, 1, 0, 1, bf, 1},    /* varlen, window, sq > sk, GQA */
        {1, 400, 650, 4, 1, 64, 64, 0, -1, -1, 0, 0, 0, 0, bf, 0},    /* MQA, per-tensor descales, no LSE */
        {2, 517, 300, 2, 2, 64, 64, 1, -1, -1, 0, 0, 0, 1, bf, 1},    /* causal, sq > sk */
        /* Head dim 128 with a soft cap: the two-P mainloop form over several key tiles. */
        {2, 150, 300, 4, 2, 128, 128, 0, -1, -1, 15.0, 0, 0, 1, hf, 1},
    };
    const int quick = getenv("FLASHATTN_TEST_FP8_QUICK") != NULL;  /* the sanitizers' reduced grid */
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; ++k)
        if (!quick || k < 4) run_case(&cases[k], 0x5eed0000u + k);
    for (k = 0; k < sizeof kernel_cases / sizeof kernel_cases[0]; ++k)
        if (!quick || k == 1 || k == 3 || k == 9 || k == 10) run_case(&kernel_cases[k], 0x5eed1000u + k);
}

/* ---- Bad arguments ----------------------------------------------------------------------------------- */

static flashattn_plan_t *small_plan(flashattn_dtype_t dtype, flashattn_backend_t backend, int finalize) {
    flashattn_plan_t *plan = NULL;
    flashattn_plan_create(&plan);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, 2);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, 8);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, 8);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, 2);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, 16);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, dtype);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, backend);
    if (finalize) EXPECT(flashattn_plan_finalize(plan) == FLASHATTN_SUCCESS, "small plan: %s", flashattn_last_error());
    return plan;
}

static void check_bad_arguments(void) {
    /* CPU only: host buffers. 2 x 8 x 2 x 16 elements each. */
    static uint8_t q[512], k[512], v[512];
    static uint16_t o[512];
    static float lse[32], dq[4] = {1, 1, 1, 1}, dk[4] = {1, 1, 1, 1}, dv[4] = {1, 1, 1, 1};
    static float nan_descale[4] = {1, 1, 1, 1};
    unsigned char ws_buf[1 << 16];
    flashattn_plan_t *plan;
    flashattn_args_t *args = NULL;
    size_t ws = 0, n;
    void *ws_ptr = NULL;
    int which;

    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) return;
    for (n = 0; n < sizeof q; ++n) q[n] = k[n] = v[n] = 0x38; /* 1.0 */
    plan = small_plan(FLASHATTN_DTYPE_FP8_E4M3, FLASHATTN_BACKEND_CPU, 1);
    flashattn_plan_get_workspace_size(plan, &ws);
    {
        /* A 256-aligned workspace from a heap block (the stack buffer is too small for big plans). */
        static unsigned char *heap = NULL;
        if (heap == NULL) heap = malloc(ws + 256);
        ws_ptr = (void *)(((uintptr_t)heap + 255) & ~(uintptr_t)255);
    }
    (void)ws_buf;
    flashattn_args_create(&args);
    flashattn_args_set(args, FLASHATTN_ARG_Q, q);
    flashattn_args_set(args, FLASHATTN_ARG_K, k);
    flashattn_args_set(args, FLASHATTN_ARG_V, v);
    flashattn_args_set(args, FLASHATTN_ARG_O, o);
    flashattn_args_set(args, FLASHATTN_ARG_LSE, lse);
    /* Each descale missing in turn. */
    for (which = 0; which < 3; ++which) {
        const char *names[3] = {"descale_q", "descale_k", "descale_v"};
        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_Q, which == 0 ? NULL : dq);
        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, which == 1 ? NULL : dk);
        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_V, which == 2 ? NULL : dv);
        test_poison(FLASHATTN_DTYPE_BF16, o, sizeof o);
        expect_message(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                       names[which], "missing descale");
        EXPECT(test_is_poison(FLASHATTN_DTYPE_BF16, (const unsigned char *)o), "missing descale: O written");
    }
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_Q, dq);
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, dk);
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_V, dv);
    EXPECT(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL) == FLASHATTN_SUCCESS, "good call: %s",
           flashattn_last_error());
    EXPECT(o[0] == 0x3f80, "all-ones inputs give O = 1 (bf16 0x3f80), got 0x%04x", o[0]);
    /* A non-finite descale: refused on the CPU, nothing written. */
    nan_descale[3] = NAN;
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, nan_descale);
    test_poison(FLASHATTN_DTYPE_BF16, o, sizeof o);
    expect_message(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "descale_k", "NaN descale");
    EXPECT(test_is_poison(FLASHATTN_DTYPE_BF16, (const unsigned char *)o), "NaN descale: O written");
    nan_descale[3] = INFINITY;
    expect_message(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "finite", "inf descale");
    /* A descale array inside O. */
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, (const float *)(void *)(o + 8));
    expect_message(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "descale_k", "descale overlapping O");
    flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, dk);
    /* The 0.2 execute call has no descales. */
    expect_message(flashattn_plan_execute(plan, q, k, v, o, lse, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "descale_q", "0.2 execute of an FP8 plan");
    /* No backward, no merge. */
    {
        const char *why = NULL;
        flashattn_backend_t bb;
        EXPECT(flashattn_plan_get_backward_backend(plan, &bb, &why) == FLASHATTN_ERROR_NOT_SUPPORTED ||
                   (why != NULL && strstr(why, "FP8") != NULL),
               "backward of an FP8 plan must be refused");
        expect_message(flashattn_plan_execute_backward(plan, q, k, v, o, o, lse, o, o, o, ws_ptr, ws, NULL),
                       FLASHATTN_ERROR_NOT_SUPPORTED, "FP8", "backward of an FP8 plan");
    }
    {
        const void *po[1] = {o};
        const float *pl[1] = {lse};
        static uint16_t o2[512];
        expect_message(flashattn_plan_merge_states(plan, 1, po, pl, FLASHATTN_DTYPE_FP32, o2, NULL, NULL),
                       FLASHATTN_ERROR_NOT_SUPPORTED, "FP8", "merge of an FP8 plan");
    }
    flashattn_plan_destroy(plan);

    /* Descales on a bf16 plan. */
    plan = small_plan(FLASHATTN_DTYPE_BF16, FLASHATTN_BACKEND_CPU, 1);
    flashattn_plan_get_workspace_size(plan, &ws);
    expect_message(flashattn_plan_execute_args(plan, args, ws_ptr, ws, NULL), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "descale_q", "descales on a bf16 plan");
    flashattn_plan_destroy(plan);

    /* Output dtypes. */
    plan = small_plan(FLASHATTN_DTYPE_FP8_E4M3, FLASHATTN_BACKEND_CPU, 0);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, FLASHATTN_DTYPE_FP32);
    expect_message(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_OUTPUT_DTYPE",
                   "fp32 output of an FP8 plan");
    flashattn_plan_set_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, FLASHATTN_DTYPE_FP8_E4M3);
    expect_message(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_OUTPUT_DTYPE",
                   "fp8 output of an FP8 plan");
    expect_message(flashattn_plan_set_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, 0), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "FLASHATTN_I64_OUTPUT_DTYPE", "output dtype 0");
    expect_message(flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_HEAD_STRIDE, -1), FLASHATTN_ERROR_INVALID_ARGUMENT,
                   "FLASHATTN_I64_DESCALE_HEAD_STRIDE", "negative descale stride");
    flashattn_plan_destroy(plan);
    plan = small_plan(FLASHATTN_DTYPE_BF16, FLASHATTN_BACKEND_CPU, 0);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, FLASHATTN_DTYPE_FP16);
    expect_message(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_OUTPUT_DTYPE",
                   "fp16 output of a bf16 plan");
    flashattn_plan_set_i64(plan, FLASHATTN_I64_OUTPUT_DTYPE, FLASHATTN_DTYPE_BF16);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_BATCH_STRIDE, 0);
    expect_message(flashattn_plan_finalize(plan), FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_I64_DESCALE_BATCH_STRIDE",
                   "descale stride on a bf16 plan");
    flashattn_plan_destroy(plan);

    /* A paged FP8 plan: the CPU does not run it. */
    plan = small_plan(FLASHATTN_DTYPE_FP8_E4M3, FLASHATTN_BACKEND_CPU, 0);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_PAGED_KV, 1);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_PAGE_SIZE, 4);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_NUM_PAGES, 8);
    expect_message(flashattn_plan_finalize(plan), FLASHATTN_ERROR_NOT_SUPPORTED, "FP8", "paged FP8 on the cpu");
    flashattn_plan_destroy(plan);
    flashattn_args_destroy(args);
}

int main(void) {
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) test_skip_without_gpu();
    check_bad_arguments();
    run_grid();
    printf("test_fp8 (%s%s): %d cases checked, %d refused, %d failures\n", test_backend_name(TEST_BACKEND),
           kernel_mode() ? ", FP8 kernel" : "", g_checked, g_refused, g_failures);
    if (kernel_mode()) printf("largest |O - ref| / tolerance: %.3g\n", g_worst_ratio);
    return g_failures ? 1 : 0;
}
