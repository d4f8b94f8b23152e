/* The tests' own arithmetic, written independently of the library: a splitmix64 generator, dtype
 * rounding through double arithmetic (frexp/nearbyint, not bit tricks), and two naive attention
 * references that materialise every score of a row, on every core (ref_parallel()). */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_internal.h"

/* ---- Random numbers ------------------------------------------------------------------------ */

void test_rng_seed(test_rng *rng, uint64_t seed) { rng->state = seed ^ 0x6a09e667f3bcc909ull; }

uint64_t test_rng_next(test_rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double test_rng_uniform(test_rng *rng, double lo, double hi) {
    const double unit = (double)(test_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * unit;
}

int64_t test_rng_range(test_rng *rng, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + (int64_t)(test_rng_next(rng) % (uint64_t)(hi - lo + 1));
}

void test_rng_permutation(test_rng *rng, int64_t *perm, int64_t n) {
    int64_t i;
    for (i = 0; i < n; ++i) perm[i] = i;
    for (i = n - 1; i > 0; --i) {
        const int64_t j = test_rng_range(rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- Dtypes ------------------------------------------------------------------------------- */

size_t test_dtype_size(flashattn_dtype_t dtype) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP32: return 4;
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16: return 2;
    default: return 1;
    }
}

const char *test_dtype_name(flashattn_dtype_t dtype) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return "fp16";
    case FLASHATTN_DTYPE_BF16: return "bf16";
    case FLASHATTN_DTYPE_FP32: return "fp32";
    case FLASHATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    default: return "?";
    }
}

const char *test_backend_name(flashattn_backend_t backend) {
    switch (backend) {
    case FLASHATTN_BACKEND_AUTO: return "auto";
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_FA1: return "fa1";
    case FLASHATTN_BACKEND_FA2: return "fa2";
    case FLASHATTN_BACKEND_FA3: return "fa3";
    default: return "?";
    }
}

/* Round |x| to a binary format with `digits` significant bits, smallest normal exponent `emin`
 * (below it the quantum stays 2^(emin - digits + 1)) and largest finite value `max_finite`. */
static double round_binary(double x, int digits, int emin, double max_finite) {
    double a, quantum, r;
    int e;
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    a = fabs(x);
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    e -= 1;
    if (e < emin) e = emin;
    quantum = ldexp(1.0, e - (digits - 1));
    r = nearbyint(a / quantum) * quantum; /* exact scaling; ties to even */
    if (r > max_finite) r = INFINITY;
    return copysign(r, x);
}

double test_round(flashattn_dtype_t dtype, double x) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return round_binary(x, 11, -14, 65504.0);
    case FLASHATTN_DTYPE_BF16: return round_binary(x, 8, -126, ldexp(255.0, 120));
    case FLASHATTN_DTYPE_FP32: return round_binary(x, 24, -126, FLT_MAX);
    default: return x;
    }
}

/* Encode an already rounded value of a 16-bit format with `mbits` stored mantissa bits and
 * exponent bias `bias`. */
static uint16_t encode16(double r, int mbits, int bias, int ebits) {
    const uint16_t sign = signbit(r) ? 0x8000u : 0u;
    const uint16_t exp_all = (uint16_t)(((1u << ebits) - 1u) << mbits);
    double a = fabs(r);
    int e;
    if (isnan(r)) return (uint16_t)(sign | exp_all | (1u << (mbits - 1)));
    if (isinf(r)) return (uint16_t)(sign | exp_all);
    if (a < ldexp(1.0, 1 - bias)) { /* zero or subnormal: a / 2^(1 - bias - mbits) */
        return (uint16_t)(sign | (uint16_t)ldexp(a, bias - 1 + mbits));
    }
    (void)frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    return (uint16_t)(sign | ((uint16_t)(e + bias) << mbits) |
                      (uint16_t)((ldexp(a, -e) - 1.0) * (double)(1u << mbits)));
}

static double decode16(uint16_t h, int mbits, int bias, int ebits) {
    const unsigned e = (h >> mbits) & ((1u << ebits) - 1u);
    const unsigned m = h & ((1u << mbits) - 1u);
    const double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == (1u << ebits) - 1u) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp((double)m, 1 - bias - mbits);
    return s * ldexp((double)((1u << mbits) + m), (int)e - bias - mbits);
}

void test_store(flashattn_dtype_t dtype, void *dst, double x) {
    const double r = test_round(dtype, x);
    uint16_t h;
    float f;
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
        h = encode16(r, 10, 15, 5);
        memcpy(dst, &h, 2);
        break;
    case FLASHATTN_DTYPE_BF16:
        h = encode16(r, 7, 127, 8);
        memcpy(dst, &h, 2);
        break;
    case FLASHATTN_DTYPE_FP32:
        f = (float)r;
        memcpy(dst, &f, 4);
        break;
    default:
        break;
    }
}

double test_load(flashattn_dtype_t dtype, const void *src) {
    uint16_t h;
    float f;
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
        memcpy(&h, src, 2);
        return decode16(h, 10, 15, 5);
    case FLASHATTN_DTYPE_BF16:
        memcpy(&h, src, 2);
        return decode16(h, 7, 127, 8);
    case FLASHATTN_DTYPE_FP32:
        memcpy(&f, src, 4);
        return (double)f;
    default:
        return NAN;
    }
}

int test_verbose(void) {
    const char *v = getenv("FLASHATTN_TEST_VERBOSE");
    return v != NULL && v[0] == '1';
}

/* ---- References ---------------------------------------------------------------------------- */

int ref_visible(const ref_problem *p, int64_t i, int64_t j, int64_t sq, int64_t sk) {
    const int64_t diag = i + sk - sq;
    /* Distances from the diagonal, not diag -+ window: windows go up to INT64_MAX. */
    return (!p->causal || j <= diag) && (p->window_left < 0 || diag - j <= p->window_left) &&
           (p->window_right < 0 || j - diag <= p->window_right);
}

int64_t ref_longest(const int64_t *len, int64_t n) {
    int64_t m = 1, i;
    for (i = 0; i < n; ++i)
        if (len[i] > m) m = len[i];
    return m;
}

ref_row ref_rows_begin(void) {
    ref_row r = {0, 0, -1, 0, 0, 0, 0, NULL};
    return r;
}

ref_row ref_row_at(const ref_problem *p, int64_t b, int64_t h, int64_t i) {
    ref_row r;
    r.b = b;
    r.h = h;
    r.i = i;
    r.kh = h / (p->heads_q / p->heads_kv);
    r.sq = p->len_q[b];
    r.sk = p->len_k[b];
    r.tq = p->start_q[b] + i;
    r.q = p->q + (r.tq * p->heads_q + h) * p->head_dim;
    return r;
}

int ref_next_row(const ref_problem *p, ref_row *r) {
    for (;;) {
        if (r->b >= p->batch) return 0;
        if (++r->i < p->len_q[r->b]) break;
        r->i = -1;
        if (++r->h < p->heads_q) continue;
        r->h = 0;
        ++r->b;
    }
    *r = ref_row_at(p, r->b, r->h, r->i);
    return 1;
}

/* ---- On every core ------------------------------------------------------------------------- */

/* The references, not the library, take most of a GPU suite's time (seconds a case against
 * milliseconds), so they run on every core of the machine: a queue of jobs that threads take one at a
 * time. */
#define REF_MAX_THREADS 64

typedef struct ref_queue {
    pthread_mutex_t lock;
    int64_t next, jobs;
    size_t scratch_bytes;
    ref_job job;
    void *arg;
} ref_queue;

static void *ref_worker(void *arg) {
    ref_queue *q = (ref_queue *)arg;
    void *scratch = calloc(q->scratch_bytes ? q->scratch_bytes : 1, 1);
    if (scratch == NULL) abort();
    for (;;) {
        int64_t index;
        pthread_mutex_lock(&q->lock);
        index = q->next++;
        pthread_mutex_unlock(&q->lock);
        if (index >= q->jobs) break;
        q->job(q->arg, index, scratch);
    }
    free(scratch);
    return NULL;
}

static int ref_threads(void) {
    const char *env = getenv("FLASHATTN_TEST_REF_THREADS");
    long n = env != NULL && env[0] != '\0' ? strtol(env, NULL, 10) : 0;
    if (n < 1) n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > REF_MAX_THREADS ? REF_MAX_THREADS : (int)n;
}

void ref_parallel(int64_t jobs, size_t scratch_bytes, ref_job job, void *arg) {
    ref_queue q;
    pthread_t threads[REF_MAX_THREADS];
    int64_t n = ref_threads();
    int started = 0;
    q.next = 0;
    q.jobs = jobs;
    q.scratch_bytes = scratch_bytes;
    q.job = job;
    q.arg = arg;
    if (n > jobs) n = jobs;
    pthread_mutex_init(&q.lock, NULL);
    while (started + 1 < n && pthread_create(&threads[started], NULL, ref_worker, &q) == 0) ++started;
    ref_worker(&q); /* the caller works too, so every job runs even where no thread could start */
    while (started > 0) pthread_join(threads[--started], NULL);
    pthread_mutex_destroy(&q.lock);
}

/* ---- The forward references ----------------------------------------------------------------- */

/* Rows are independent (each writes its own O row and LSE), so any split is bitwise that of one
 * thread: a job per 16 rows of one query head of one sequence. */
#define FWD_ROWS_PER_JOB 16

typedef struct fwd_args {
    const ref_problem *p;
    double *o, *lse;
    int64_t blocks; /* jobs per query head of a sequence: the longest sequence in blocks of rows */
    void (*row)(const struct fwd_args *a, const ref_row *r, void *scratch);
} fwd_args;

static void fwd_job(void *arg, int64_t index, void *scratch) {
    const fwd_args *a = (const fwd_args *)arg;
    const int64_t bh = index / a->blocks, b = bh / a->p->heads_q, h = bh % a->p->heads_q;
    const int64_t first = index % a->blocks * FWD_ROWS_PER_JOB;
    int64_t i;
    for (i = first; i < first + FWD_ROWS_PER_JOB && i < a->p->len_q[b]; ++i) {
        const ref_row r = ref_row_at(a->p, b, h, i);
        a->row(a, &r, scratch);
    }
}

static void fwd_run(fwd_args *a, size_t scratch_bytes) {
    a->blocks = (ref_longest(a->p->len_q, a->p->batch) + FWD_ROWS_PER_JOB - 1) / FWD_ROWS_PER_JOB;
    ref_parallel(a->p->batch * a->p->heads_q * a->blocks, scratch_bytes, fwd_job, a);
}

/* s [longest key sequence], acc [head_dim_v] */
static void ref_attention_row(const fwd_args *a, const ref_row *r, void *scratch) {
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    double *s = (double *)scratch, *acc = s + ref_longest(p->len_k, p->batch);
    const float *q = r->q;
    double *out = a->o + (r->tq * hq + r->h) * dv;
    double m = -INFINITY, l = 0.0;
    int any = 0;
    int64_t j, c;
    for (j = 0; j < r->sk; ++j) {
        const float *k = p->k + ((p->start_k[r->b] + j) * hk + r->kh) * d;
        double dot = 0.0;
        if (!ref_visible(p, r->i, j, r->sq, r->sk)) {
            s[j] = -INFINITY;
            continue;
        }
        for (c = 0; c < d; ++c) dot += (double)q[c] * (double)k[c];
        dot *= p->scale;
        if (p->softcap > 0.0) dot = p->softcap * tanh(dot / p->softcap);
        s[j] = dot;
        if (dot > m) m = dot;
        any = 1;
    }
    for (c = 0; c < dv; ++c) acc[c] = 0.0;
    if (!any) {
        for (c = 0; c < dv; ++c) out[c] = 0.0;
        a->lse[r->h * p->total_q + r->tq] = -INFINITY;
        return;
    }
    for (j = 0; j < r->sk; ++j) {
        const float *v = p->v + ((p->start_k[r->b] + j) * hk + r->kh) * dv;
        double e;
        if (s[j] == -INFINITY) continue;
        e = exp(s[j] - m);
        l += e;
        for (c = 0; c < dv; ++c) acc[c] += e * (double)v[c];
    }
    for (c = 0; c < dv; ++c) out[c] = acc[c] / l;
    a->lse[r->h * p->total_q + r->tq] = m + log(l);
}

void ref_attention(const ref_problem *p, double *o, double *lse) {
    fwd_args a;
    a.p = p;
    a.o = o;
    a.lse = lse;
    a.row = ref_attention_row;
    fwd_run(&a, (size_t)(ref_longest(p->len_k, p->batch) + p->head_dim_v) * sizeof(double));
}

/* s [longest key sequence], acc [head_dim_v], vis [longest key sequence] */
static void ref_attention_lowp_row(const fwd_args *a, const ref_row *r, void *scratch) {
    const ref_problem *p = a->p;
    const int64_t hq = p->heads_q, hk = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    const flashattn_dtype_t dt = p->dtype;
    const float scale = (float)p->scale, cap = (float)p->softcap;
    float *s = (float *)scratch, *acc = s + ref_longest(p->len_k, p->batch);
    unsigned char *vis = (unsigned char *)(acc + dv);
    const float *q = r->q;
    double *out = a->o + (r->tq * hq + r->h) * dv;
    float m = -INFINITY, l = 0.0f;
    int any = 0;
    int64_t j, c;
    for (j = 0; j < r->sk; ++j) {
        const float *k = p->k + ((p->start_k[r->b] + j) * hk + r->kh) * d;
        float dot = 0.0f;
        vis[j] = (unsigned char)ref_visible(p, r->i, j, r->sq, r->sk);
        if (!vis[j]) continue;
        for (c = 0; c < d; ++c) dot += q[c] * k[c];
        dot = (float)test_round(dt, (double)(dot * scale));
        if (cap > 0.0f) dot = (float)test_round(dt, (double)(cap * tanhf(dot / cap)));
        s[j] = dot;
        if (dot > m) m = dot;
        any = 1;
    }
    for (c = 0; c < dv; ++c) acc[c] = 0.0f;
    if (any) {
        for (j = 0; j < r->sk; ++j) {
            if (!vis[j]) continue;
            s[j] = expf(s[j] - m);
            l += s[j];
        }
        for (j = 0; j < r->sk; ++j) {
            const float *v = p->v + ((p->start_k[r->b] + j) * hk + r->kh) * dv;
            float pr;
            if (!vis[j]) continue;
            pr = (float)test_round(dt, (double)(s[j] / l));
            for (c = 0; c < dv; ++c) acc[c] += pr * v[c];
        }
    }
    for (c = 0; c < dv; ++c) out[c] = test_round(dt, (double)acc[c]);
}

void ref_attention_lowp(const ref_problem *p, double *o) {
    const int64_t maxk = ref_longest(p->len_k, p->batch);
    fwd_args a;
    a.p = p;
    a.o = o;
    a.lse = NULL;
    a.row = ref_attention_lowp_row;
    fwd_run(&a, (size_t)(maxk + p->head_dim_v) * sizeof(float) + (size_t)maxk);
}
