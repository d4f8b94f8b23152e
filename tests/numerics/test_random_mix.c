/* Random mixes of every forward feature on one backend (TEST_BACKEND), through the public C API
 * only, against this file's own double-precision reference. The fixed grids of test_numerics.c,
 * test_variants.c and test_serving.c choose their shapes; here every case draws its shape AND its
 * combination of features from the seed, so that combinations no grid lists get run: dtype,
 * batch (1-12), seqlen_q and seqlen_k (1 to ~300, now and then 1200; independent or square), GQA/MQA
 * groups, head_dim and head_dim_v (multiples of 8 up to 256), causal, both mask alignments, sliding
 * windows (0, small, up to INT64_MAX), sink tokens, sink logits, ALiBi (slopes of both signs),
 * softcap, an explicit scale, Q/K amplitudes, variable lengths (empty sequences, batches without
 * queries or keys, SEQLEN maxima above every length), seqused_k (empty caches), paged caches (any
 * page size, shuffled page tables, pages shared between sequences), one interleaved K/V pool, the
 * append of new K/V rows with rotary (interleaved or half-split), four layouts per tensor
 * (contiguous, padded, head-major, sequence-major; gaps poisoned with NaN), forced split counts,
 * LSE or not, the 0.2 execute calls or flashattn_plan_execute_args. About one case in eight also
 * breaks a documented rule (a key, a combination of keys, a call, a pointer, a cache length, a page
 * index, cu_seqlens) and expects the documented status, with nothing written.
 *
 * Checks per case: every element of O (and LSE) against the reference (rows that see no key:
 * O = 0 exactly, LSE = -inf or the sink logit); the gaps of O untouched; every input unchanged;
 * with an append, every element of both caches (the appended rows rotated and rounded once, the
 * rest untouched); the resolved scale, SEQLEN_Q and NUM_SPLITS the plan reports; for some cases a
 * second run bitwise the first. Tolerances, as check_attention_case() (test_support.h): fp16/bf16
 * at most twice the error of the same naive algorithm run in the dtype, + 1e-5; fp32 2e-5 (O is
 * O(1)) plus the float rounding of the largest score, 1e-6 |s|; LSE 1e-4 (1 + |ref|).
 *
 * The CPU backend must run every valid case. A GPU backend may refuse a valid combination at
 * finalize with NOT_SUPPORTED and a message; those are counted (the first 20 printed).
 *
 * FLASHATTN_TEST_SEED (printed) picks the cases; FLASHATTN_TEST_MIX_CASES=n sets their number;
 * FLASHATTN_TEST_MIX_FIRST=i starts at case i (FLASHATTN_TEST_SEED=s FLASHATTN_TEST_MIX_FIRST=i
 * FLASHATTN_TEST_MIX_CASES=1 replays the case a failure names); FLASHATTN_TEST_REDUCED=1 runs 40
 * small ones (compute-sanitizer); FLASHATTN_TEST_VERBOSE=1 prints every case with its errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_expect.h"
#include "test_reference.h"
#include "test_runner.h"

static int g_checked = 0, g_refused = 0, g_invalid = 0;
static uint64_t g_seed = 0x6d1f0a5e2b7c9d31ull; /* FLASHATTN_TEST_SEED: case i runs from test_case_seed(g_seed, i) */

/* ---- The case ------------------------------------------------------------------------------ */

/* Mutations: a valid case changed to break one documented rule. */
enum {
    MUT_NONE,
    MUT_HEADS,          /* heads_q not a multiple of heads_kv: finalize, INVALID_ARGUMENT */
    MUT_HEAD_DIM,       /* head_dim not a multiple of 8: set_i64, INVALID_ARGUMENT */
    MUT_ROTARY_ALONE,   /* rotary without an append: finalize, INVALID_ARGUMENT */
    MUT_APPEND_NO_USED, /* an append without seqused_k: finalize, INVALID_ARGUMENT */
    MUT_OLD_CALL,       /* sink logits / ALiBi / serving through the 0.2 call: INVALID_ARGUMENT / _STATE */
    MUT_UNUSED_PTR,     /* a pointer the plan does not use: INVALID_ARGUMENT */
    MUT_BAD_USED,       /* (CPU) seqused_k past the cache: INVALID_ARGUMENT */
    MUT_BAD_PAGE,       /* (CPU) a page index past num_pages: INVALID_ARGUMENT */
    MUT_OUTPUT_DTYPE,   /* OUTPUT_DTYPE other than DTYPE on a plan that is not FP8: INVALID_ARGUMENT */
    MUT_FEW_PAGES,      /* max_pages * page_size < seqlen_k: INVALID_ARGUMENT */
    MUT_TABLE_STRIDE,   /* page table stride below max_pages: INVALID_ARGUMENT */
    MUT_BIG_APPEND,     /* more new rows than SEQLEN_K: INVALID_ARGUMENT */
    MUT_BIG_ROTARY,     /* rotary_dim above head_dim: INVALID_ARGUMENT */
    MUT_BAD_CU,         /* (CPU) cu_seqlens_q not ending at total_q, or cu_seqlens_k not starting at 0: INVALID_ARGUMENT */
    MUT_COUNT
};

typedef struct mix_case {
    flashattn_dtype_t dt;
    int64_t batch, sq, sk, hq, hk, d, dv; /* sq, sk: the plan's SEQLEN keys (maxima when varlen) */
    int causal, top_left;
    int64_t wl, wr, sink_tokens;
    int sinks, alibi;
    double softcap, scale; /* 0: off / the default */
    int varlen, seqused;
    int64_t page_size; /* 0: contiguous caches */
    int64_t new_rows, rotary_dim;
    int interleaved;
    int layout[6]; /* Q, K, V, O, K_new, V_new: 0 contiguous, 1 padded, 2 head-major, 3 sequence-major */
    int with_lse, args_call;
    int64_t splits;   /* FLASHATTN_I64_NUM_SPLITS asked (0: auto; the CPU runs unsplit) */
    double amplitude; /* Q and K drawn from U(-a, a) */
    int repeat;       /* run twice: bitwise the same O, LSE and caches */
    int kv_pool;      /* K and V interleave in one pool ([pages or batch][2][rows][heads][dim]) */
    int share_pages;  /* (paged, no append) sequences share some of sequence 0's pages */
    int mutation;
} mix_case;

static void describe(char *buf, size_t n, const mix_case *c, size_t index) {
    snprintf(buf, n,
             "[%s seed %#llx case %zu: %s b=%lld sq=%lld sk=%lld hq=%lld hk=%lld d=%lld dv=%lld causal=%d top_left=%d "
             "wl=%lld wr=%lld sink_tokens=%lld sinks=%d alibi=%d softcap=%g scale=%g varlen=%d seqused=%d page=%lld "
             "new=%lld rotary=%lld%s layouts=%d%d%d%d%d%d lse=%d args=%d splits=%lld amplitude=%g repeat=%d pool=%d shared_pages=%d mutation=%d]",
             test_backend_name(TEST_BACKEND), (unsigned long long)g_seed, index, test_dtype_name(c->dt),
             (long long)c->batch, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hk,
             (long long)c->d, (long long)c->dv, c->causal, c->top_left, (long long)c->wl, (long long)c->wr,
             (long long)c->sink_tokens, c->sinks, c->alibi, c->softcap, c->scale, c->varlen, c->seqused,
             (long long)c->page_size, (long long)c->new_rows, (long long)c->rotary_dim,
             c->rotary_dim && c->interleaved ? "i" : "", c->layout[0], c->layout[1], c->layout[2], c->layout[3],
             c->layout[4], c->layout[5], c->with_lse, c->args_call, (long long)c->splits, c->amplitude, c->repeat,
             c->kv_pool, c->share_pages, c->mutation);
}

static int chance(test_rng *rng, double p) { return test_rng_uniform(rng, 0.0, 1.0) < p; }

/* A sequence length: 1, short, up to ~300, now and then long (many of every backend's tiles;
 * fit_budget() then takes heads away); small when reduced. */
static int64_t draw_len(test_rng *rng, int reduced) {
    const double u = test_rng_uniform(rng, 0.0, 1.0);
    if (u < 0.15) return 1;
    if (u < 0.45) return test_rng_range(rng, 2, 24);
    if (u < 0.95 || reduced) return test_rng_range(rng, 25, reduced ? 80 : 300);
    return test_rng_range(rng, 301, 1200);
}

/* A window side: none, 0, small, about the sequence, or huge (stored as none by finalize). */
static int64_t draw_window(test_rng *rng, int64_t sq, int64_t sk) {
    const double u = test_rng_uniform(rng, 0.0, 1.0);
    if (u < 0.35) return -1;
    if (u < 0.5) return 0;
    if (u < 0.8) return test_rng_range(rng, 1, 24);
    if (u < 0.95) return test_rng_range(rng, 0, sq + sk + 2);
    return u < 0.975 ? (int64_t)1 << 40 : INT64_MAX;
}

static int64_t draw_dim(test_rng *rng) {
    static const int64_t common[] = {64, 128, 32, 96, 256};
    if (chance(rng, 0.3)) return common[test_rng_range(rng, 0, 4)];
    return 8 * test_rng_range(rng, 1, 32);
}

/* Shrinks the heads, then the lengths, until one case is about `budget` score-columns of work. */
static void fit_budget(mix_case *c, double budget) {
    for (;;) {
        const double work = (double)c->batch * (double)c->hq * (double)c->sq * (double)c->sk * (double)(c->d + c->dv);
        if (work <= budget) return;
        if (c->hq > c->hk) c->hq -= c->hk;
        else if (c->hk > 1) c->hq = --c->hk;
        else if (c->batch > 1) --c->batch;
        else if (c->sq >= c->sk && c->sq > 1) c->sq = (c->sq + 1) / 2;
        else if (c->sk > 1) c->sk = (c->sk + 1) / 2;
        else return;
    }
}

static void draw_case(test_rng *rng, mix_case *c, int reduced) {
    static const int64_t pages[] = {1, 2, 3, 5, 7, 8, 16, 17, 32, 48, 64, 100, 256};
    static const int64_t groups[] = {1, 1, 2, 3, 4, 8, 16};
    memset(c, 0, sizeof *c);
    if (TEST_BACKEND == FLASHATTN_BACKEND_CPU) {
        static const flashattn_dtype_t dts[] = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16};
        c->dt = dts[test_rng_range(rng, 0, 2)];
    } else {
        c->dt = chance(rng, 0.5) ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16;
    }
    c->batch = chance(rng, 0.85) ? test_rng_range(rng, 1, 4) : test_rng_range(rng, 5, 12);
    c->sq = draw_len(rng, reduced);
    c->sk = chance(rng, 0.15) ? c->sq : draw_len(rng, reduced); /* square, as self-attention is */
    c->hk = test_rng_range(rng, 1, 4);
    c->hq = c->hk * groups[test_rng_range(rng, 0, 6)];
    c->d = draw_dim(rng);
    c->dv = chance(rng, 0.7) ? c->d : draw_dim(rng);
    c->causal = chance(rng, 0.4);
    c->top_left = chance(rng, 0.3);
    if (chance(rng, 0.4)) {
        c->wl = draw_window(rng, c->sq, c->sk);
        c->wr = draw_window(rng, c->sq, c->sk);
    } else {
        c->wl = c->wr = -1;
    }
    c->sink_tokens = chance(rng, 0.25) ? (chance(rng, 0.7) ? test_rng_range(rng, 1, 8) : test_rng_range(rng, 1, c->sk + 4)) : 0;
    c->sinks = chance(rng, 0.3);
    c->alibi = chance(rng, 0.3);
    c->softcap = chance(rng, 0.3) ? (chance(rng, 0.3) ? test_rng_uniform(rng, 0.5, 5.0) : test_rng_uniform(rng, 5.0, 50.0)) : 0.0;
    c->scale = chance(rng, 0.3) ? test_rng_uniform(rng, 0.3, 2.0) / sqrt((double)c->d) : 0.0;
    if (chance(rng, 0.05)) c->scale = chance(rng, 0.5) ? 1.0 : ldexp(1.0, -20); /* unscaled; uniform rows */
    c->varlen = chance(rng, 0.4);
    c->seqused = chance(rng, 0.35);
    c->page_size = chance(rng, 0.35) ? pages[test_rng_range(rng, 0, 12)] : 0;
    if (c->seqused && chance(rng, 0.55)) {
        c->new_rows = chance(rng, 0.5) ? 1 : test_rng_range(rng, 2, chance(rng, 0.8) ? 16 : 80);
        if (chance(rng, 0.6)) {
            c->rotary_dim = 2 * test_rng_range(rng, 1, c->d / 2);
            if (chance(rng, 0.4)) c->rotary_dim = c->d;
            c->interleaved = chance(rng, 0.5);
        }
    }
    for (int t = 0; t < 6; ++t) {
        const double u = test_rng_uniform(rng, 0.0, 1.0);
        c->layout[t] = u < 0.45 ? 0 : u < 0.7 ? 1 : u < 0.85 ? 2 : 3;
    }
    c->with_lse = chance(rng, 0.6);
    c->splits = chance(rng, 0.2) ? test_rng_range(rng, 1, 128) : 0;
    c->amplitude = chance(rng, 0.3) ? test_rng_uniform(rng, 1.0, 4.0) : 1.0;
    c->repeat = chance(rng, 0.15);
    /* one K/V pool: where the batch (or page) stride is honoured, V shaped like K */
    c->kv_pool = c->d == c->dv && !(c->varlen && c->page_size == 0) && chance(rng, 0.25);
    if (c->kv_pool) c->layout[1] = c->layout[2] = c->layout[1] == 2 ? 2 : 1; /* a block per page or batch */
    c->share_pages = c->page_size > 0 && c->new_rows == 0 && chance(rng, 0.3);
    /* sink logits, ALiBi and the serving features run only through the argument set */
    c->args_call = c->sinks || c->alibi || c->seqused || c->page_size > 0 || chance(rng, 0.5);
    c->mutation = chance(rng, 0.12) ? (int)test_rng_range(rng, 1, MUT_COUNT - 1) : MUT_NONE;
    fit_budget(c, reduced ? 2e6 : 1e8);
    if (c->new_rows > c->sk) c->new_rows = c->sk; /* an append fits the cache (SEQLEN_K) */
}

/* ---- The data ------------------------------------------------------------------------------ */

typedef struct mix_data {
    const mix_case *c;
    size_t es;
    int dev;
    int64_t sq, sk; /* the plan's SEQLEN_Q / SEQLEN_K */
    int64_t *len_q, *start_q, *len_k, *start_k, *used, *keys; /* keys: L_b, what sequence b attends */
    int64_t total_q, total_k, kmax;
    int64_t max_pages, table_stride, num_pages;
    int64_t pool_block; /* kv_pool: elements from a K block to its V block */
    tensor_layout lq, lk, lv, lo, lkn, lvn;
    test_mem q, k, v, o, lse, kn, vn, table, seqused, cu_q, cu_k, cos_t, sin_t, sink, slope, ws;
    size_t lse_elems;
    double *qx;          /* [total_q][hq][d]: Q as attention sees it (rotated) */
    double *kx, *vx;     /* [batch][kmax][hk][d or dv]: each sequence's keys after the append */
    unsigned char *k_expect, *v_expect; /* the caches after the call */
    unsigned char *snap[12];            /* the inputs before the call */
} mix_data;

/* A [outer][rows][heads][dim] tensor: contiguous, padded, head-major ([outer][heads][rows][dim])
 * or sequence-major ([rows][outer][heads][dim]) with pads; rows = all packed tokens and one outer when varlen. Pads are multiples of 8 elements
 * (16-byte rows for every dtype). */
static tensor_layout draw_layout(test_rng *rng, int mode, int64_t outer, int64_t rows, int64_t heads, int64_t dim) {
    tensor_layout l;
    const int64_t p1 = mode ? 8 * test_rng_range(rng, 0, 2) : 0, p2 = mode ? 8 * test_rng_range(rng, 0, 2) : 0;
    const int64_t p3 = mode ? 8 * test_rng_range(rng, 1, 3) : 0;
    if (rows < 1) rows = 1;
    if (mode == 2) {
        l.row_stride = dim + p1;
        l.head_stride = rows * l.row_stride + p2;
        l.batch_stride = heads * l.head_stride + p3;
    } else if (mode == 3) { /* sequence-major: [rows][outer][heads][dim] */
        l.head_stride = dim + p1;
        l.batch_stride = heads * l.head_stride + p2;
        l.row_stride = outer * l.batch_stride + p3;
        l.elems = (size_t)(rows * l.row_stride);
        return l;
    } else {
        l.head_stride = dim + p1;
        l.row_stride = heads * l.head_stride + p2;
        l.batch_stride = rows * l.row_stride + p3;
    }
    l.elems = (size_t)(outer * l.batch_stride);
    return l;
}

/* Element offset of (sequence b, row `pos` of it, head h) in Q / O. */
static int64_t q_offset(const mix_data *d, const tensor_layout *l, int64_t b, int64_t i, int64_t h) {
    if (d->c->varlen) return (d->start_q[b] + i) * l->row_stride + h * l->head_stride;
    return b * l->batch_stride + i * l->row_stride + h * l->head_stride;
}

/* Element offset of key `pos` of sequence b, head h, in a cache of layout l (pages, packed, batched). */
static int64_t cache_offset(const mix_data *d, const tensor_layout *l, int64_t b, int64_t pos, int64_t h) {
    const mix_case *c = d->c;
    if (c->page_size > 0) {
        const int32_t page = ((const int32_t *)d->table.host)[b * d->table_stride + pos / c->page_size];
        return (int64_t)page * l->batch_stride + (pos % c->page_size) * l->row_stride + h * l->head_stride;
    }
    if (c->varlen) return (d->start_k[b] + pos) * l->row_stride + h * l->head_stride;
    return b * l->batch_stride + pos * l->row_stride + h * l->head_stride;
}

static double *kx_at(const mix_data *d, double *base, int64_t b, int64_t pos, int64_t h, int64_t dim) {
    return base + ((b * d->kmax + pos) * d->c->hk + h) * dim;
}

/* U(-a, a) rounded to the dtype: a = 1 for V, the case's amplitude for Q and K (larger scores). */
static double random_value(const mix_data *d, test_rng *rng, double a) { return test_round(d->c->dt, test_rng_uniform(rng, -a, a)); }

static int64_t pick_used(test_rng *rng, int64_t room) {
    const double u = test_rng_uniform(rng, 0.0, 1.0);
    return u < 0.1 ? 0 : u < 0.3 ? room : test_rng_range(rng, 0, room);
}

/* Lengths: queries and keys per sequence, the cache lengths (seqused_k) leaving room for the
 * append and the rotary positions of the queries (position used + i < SEQLEN_K), the keys each
 * sequence attends. */
static void make_lengths(mix_data *d, test_rng *rng) {
    const mix_case *c = d->c;
    const int packed_keys = c->varlen && c->page_size == 0;
    /* now and then a varlen batch without any query (total_q = 0) or any packed key (total_k = 0) */
    const int64_t empty = c->varlen ? test_rng_range(rng, 0, 99) : 99;
    const int no_q = empty < 3, no_k = empty >= 3 && empty < 6 && packed_keys && c->new_rows == 0;
    int64_t b, maxq = 0, maxk = 0;
    for (b = 0; b < c->batch; ++b) {
        /* empty sequences only where the batch has others */
        d->len_q[b] = c->varlen ? (no_q || (c->batch > 1 && chance(rng, 0.15)) ? 0 : test_rng_range(rng, 1, c->sq)) : c->sq;
        d->len_k[b] = packed_keys ? (no_k || (c->batch > 1 && chance(rng, 0.15)) ? 0 : test_rng_range(rng, 1, c->sk)) : c->sk;
        if (c->new_rows > 0) { /* the cache must hold the append and every rotary position */
            const int64_t need = c->rotary_dim > 0 && d->len_q[b] > c->new_rows ? d->len_q[b] : c->new_rows;
            if (d->len_k[b] < need) d->len_k[b] = need;
        }
        if (d->len_q[b] > maxq) maxq = d->len_q[b];
        if (d->len_k[b] > maxk) maxk = d->len_k[b];
    }
    if (maxq == 0 && !no_q) maxq = d->len_q[0] = 1;
    d->sq = c->varlen ? (maxq > 0 ? maxq : 1) + (chance(rng, 0.3) ? test_rng_range(rng, 1, 5) : 0) : c->sq;
    /* packed keys: SEQLEN_K is a maximum, sometimes above every length (finalize lowers it to total_k) */
    d->sk = packed_keys ? (maxk > 0 ? maxk : 1) + (chance(rng, 0.3) ? test_rng_range(rng, 1, 40) : 0) : maxk;
    if (!packed_keys) for (b = 0; b < c->batch; ++b) d->len_k[b] = d->sk;
    d->total_q = d->total_k = 0;
    d->kmax = 1;
    for (b = 0; b < c->batch; ++b) {
        const int64_t need = c->new_rows > 0 && c->rotary_dim > 0 && d->len_q[b] > c->new_rows ? d->len_q[b] : c->new_rows;
        d->start_q[b] = d->total_q;
        d->start_k[b] = d->total_k;
        d->total_q += d->len_q[b];
        d->total_k += d->len_k[b];
        d->used[b] = c->seqused ? pick_used(rng, d->len_k[b] - need) : d->len_k[b];
        d->keys[b] = d->used[b] + (c->seqused ? c->new_rows : 0);
        if (d->len_k[b] > d->kmax) d->kmax = d->len_k[b];
    }
}

/* A shuffled page table: entries past a sequence's keys hold a page that does not exist, gaps -1. */
static void make_page_table(mix_data *d, test_rng *rng) {
    const mix_case *c = d->c;
    int32_t *t = (int32_t *)d->table.host;
    int64_t *perm = (int64_t *)malloc((size_t)d->num_pages * sizeof(int64_t));
    int64_t i, b;
    test_rng_permutation(rng, perm, d->num_pages);
    for (b = 0; b < c->batch; ++b) {
        const int64_t needed = (d->keys[b] + c->page_size - 1) / c->page_size;
        /* shared pages (a common prefix, read only): the first ones of sequence 0's row */
        const int64_t shared = c->share_pages && b > 0 ? test_rng_range(rng, 0, needed) : 0;
        for (i = 0; i < d->table_stride; ++i)
            t[b * d->table_stride + i] = i >= d->max_pages ? -1 : i >= needed ? 0x7fffffff
                                         : i < shared ? (int32_t)perm[i] : (int32_t)perm[b * d->max_pages + i];
    }
    free(perm);
}

static int alloc(const mix_data *d, test_mem *m, size_t bytes) { return test_mem_alloc(m, bytes ? bytes : 1, d->dev); }

/* The caches before the call (random keys below each sequence's cache length, NaN elsewhere: a
 * read past seqused_k shows), the rows to append, and what the caches must hold after the call. */
static void make_caches(mix_data *d, test_rng *rng) {
    const mix_case *c = d->c;
    const int64_t half = c->rotary_dim / 2;
    double *row = (double *)malloc((size_t)c->d * sizeof(double));
    int64_t b, pos, h, col, j, i;
    test_poison(c->dt, d->k.host, d->k.bytes);
    test_poison(c->dt, d->v.host, d->v.bytes);
    test_poison(c->dt, d->kn.host, d->kn.bytes);
    test_poison(c->dt, d->vn.host, d->vn.bytes);
    for (b = 0; b < c->batch; ++b)
        for (pos = 0; pos < d->used[b]; ++pos)
            for (h = 0; h < c->hk; ++h) {
                unsigned char *kp = (unsigned char *)d->k.host + d->es * (size_t)cache_offset(d, &d->lk, b, pos, h);
                unsigned char *vp = (unsigned char *)d->v.host + d->es * (size_t)cache_offset(d, &d->lv, b, pos, h);
                double *kr = kx_at(d, d->kx, b, pos, h, c->d), *vr = kx_at(d, d->vx, b, pos, h, c->dv);
                for (col = 0; col < c->d; ++col) test_store(c->dt, kp + d->es * (size_t)col, kr[col] = random_value(d, rng, c->amplitude));
                for (col = 0; col < c->dv; ++col) test_store(c->dt, vp + d->es * (size_t)col, vr[col] = random_value(d, rng, 1.0));
            }
    memcpy(d->k_expect, d->k.host, d->k.bytes);
    memcpy(d->v_expect, d->v.host, d->v.bytes);
    for (b = 0; b < c->batch; ++b)
        for (j = 0; j < c->new_rows; ++j)
            for (h = 0; h < c->hk; ++h) {
                const int64_t p = d->used[b] + j;
                unsigned char *ks = (unsigned char *)d->kn.host + d->es * (size_t)(b * d->lkn.batch_stride + j * d->lkn.row_stride + h * d->lkn.head_stride);
                unsigned char *vs = (unsigned char *)d->vn.host + d->es * (size_t)(b * d->lvn.batch_stride + j * d->lvn.row_stride + h * d->lvn.head_stride);
                unsigned char *kd = d->k_expect + d->es * (size_t)cache_offset(d, &d->lk, b, p, h);
                unsigned char *vd = d->v_expect + d->es * (size_t)cache_offset(d, &d->lv, b, p, h);
                double *kr = kx_at(d, d->kx, b, p, h, c->d), *vr = kx_at(d, d->vx, b, p, h, c->dv);
                for (col = 0; col < c->d; ++col) test_store(c->dt, ks + d->es * (size_t)col, row[col] = random_value(d, rng, c->amplitude));
                for (col = 0; col < c->dv; ++col) test_store(c->dt, vs + d->es * (size_t)col, vr[col] = random_value(d, rng, 1.0));
                /* rotate (in double, rounded once), then write */
                for (col = 0; col < c->d; ++col) kr[col] = row[col];
                for (i = 0; i < half; ++i) {
                    const int64_t a = c->interleaved ? 2 * i : i, e = c->interleaved ? 2 * i + 1 : i + half;
                    const double cs = ((const float *)d->cos_t.host)[p * half + i], sn = ((const float *)d->sin_t.host)[p * half + i];
                    kr[a] = test_round(c->dt, row[a] * cs - row[e] * sn);
                    kr[e] = test_round(c->dt, row[a] * sn + row[e] * cs);
                }
                for (col = 0; col < c->d; ++col) test_store(c->dt, kd + d->es * (size_t)col, kr[col]);
                for (col = 0; col < c->dv; ++col) test_store(c->dt, vd + d->es * (size_t)col, vr[col]);
            }
    free(row);
    /* Shared pages: a later sequence's keys overwrote an earlier one's; read every sequence's keys
     * back from the final image. */
    if (c->share_pages)
        for (b = 0; b < c->batch; ++b)
            for (pos = 0; pos < d->keys[b]; ++pos)
                for (h = 0; h < c->hk; ++h) {
                    const unsigned char *kp = d->k_expect + d->es * (size_t)cache_offset(d, &d->lk, b, pos, h);
                    const unsigned char *vp = d->v_expect + d->es * (size_t)cache_offset(d, &d->lv, b, pos, h);
                    for (col = 0; col < c->d; ++col) kx_at(d, d->kx, b, pos, h, c->d)[col] = test_load(c->dt, kp + d->es * (size_t)col);
                    for (col = 0; col < c->dv; ++col) kx_at(d, d->vx, b, pos, h, c->dv)[col] = test_load(c->dt, vp + d->es * (size_t)col);
                }
}

/* Q (gaps NaN) and Q as attention sees it: rotated at position used + i, rounded once. */
static void make_queries(mix_data *d, test_rng *rng) {
    const mix_case *c = d->c;
    const int64_t half = c->rotary_dim / 2;
    int64_t b, i, h, col, r;
    test_poison(c->dt, d->q.host, d->q.bytes);
    for (b = 0; b < c->batch; ++b)
        for (i = 0; i < d->len_q[b]; ++i)
            for (h = 0; h < c->hq; ++h) {
                unsigned char *qp = (unsigned char *)d->q.host + d->es * (size_t)q_offset(d, &d->lq, b, i, h);
                double *x = d->qx + ((d->start_q[b] + i) * c->hq + h) * c->d;
                const int64_t p = d->used[b] + i;
                double pair[2];
                for (col = 0; col < c->d; ++col) test_store(c->dt, qp + d->es * (size_t)col, x[col] = random_value(d, rng, c->amplitude));
                for (r = 0; r < half; ++r) {
                    const int64_t a = c->interleaved ? 2 * r : r, e = c->interleaved ? 2 * r + 1 : r + half;
                    const double cs = ((const float *)d->cos_t.host)[p * half + r], sn = ((const float *)d->sin_t.host)[p * half + r];
                    pair[0] = test_round(c->dt, x[a] * cs - x[e] * sn);
                    pair[1] = test_round(c->dt, x[a] * sn + x[e] * cs);
                    x[a] = pair[0];
                    x[e] = pair[1];
                }
            }
}

static int data_make(mix_data *d, const mix_case *c, uint64_t seed) {
    test_rng rng;
    const int64_t B = c->batch;
    int64_t b, i;
    memset(d, 0, sizeof *d);
    d->c = c;
    d->es = test_dtype_size(c->dt);
    d->dev = test_on_device(TEST_BACKEND);
    test_rng_seed(&rng, seed ^ 0x3c6ef372fe94f82bull);
    d->len_q = calloc((size_t)B, sizeof(int64_t)), d->start_q = calloc((size_t)B, sizeof(int64_t));
    d->len_k = calloc((size_t)B, sizeof(int64_t)), d->start_k = calloc((size_t)B, sizeof(int64_t));
    d->used = calloc((size_t)B, sizeof(int64_t)), d->keys = calloc((size_t)B, sizeof(int64_t));
    make_lengths(d, &rng);

    /* layouts: caches are pages, packed keys or batches */
    {
        const int packed = c->varlen && c->page_size == 0;
        int64_t outer = packed ? 1 : B, rows = packed ? d->total_k : d->sk;
        if (c->page_size > 0) {
            d->max_pages = (d->sk + c->page_size - 1) / c->page_size + (chance(&rng, 0.3) ? test_rng_range(&rng, 1, 2) : 0);
            d->table_stride = d->max_pages + (chance(&rng, 0.3) ? test_rng_range(&rng, 1, 3) : 0);
            d->num_pages = B * d->max_pages + test_rng_range(&rng, 0, 3);
            outer = d->num_pages;
            rows = c->page_size;
        }
        d->lq = draw_layout(&rng, c->layout[0], c->varlen ? 1 : B, c->varlen ? d->total_q : d->sq, c->hq, c->d);
        d->lk = draw_layout(&rng, c->layout[1], outer, rows, c->hk, c->d);
        d->lv = draw_layout(&rng, c->layout[2], outer, rows, c->hk, c->dv);
        d->lo = draw_layout(&rng, c->layout[3], c->varlen ? 1 : B, c->varlen ? d->total_q : d->sq, c->hq, c->dv);
        d->lkn = draw_layout(&rng, c->layout[4], B, c->new_rows, c->hk, c->d);
        d->lvn = draw_layout(&rng, c->layout[5], B, c->new_rows, c->hk, c->dv);
        if (c->kv_pool) { /* V's block follows K's in each page (or batch) */
            d->pool_block = d->lk.batch_stride;
            d->lk.batch_stride *= 2;
            d->lk.elems *= 2;
            d->lv = d->lk;
        }
    }
    d->lse_elems = (size_t)(c->hq * (c->varlen ? d->total_q : B * d->sq));
    if (alloc(d, &d->q, d->lq.elems * d->es) || alloc(d, &d->k, d->lk.elems * d->es) ||
        (!c->kv_pool && alloc(d, &d->v, d->lv.elems * d->es)) || alloc(d, &d->o, d->lo.elems * d->es) ||
        alloc(d, &d->lse, d->lse_elems * 4) || alloc(d, &d->kn, c->new_rows ? d->lkn.elems * d->es : 0) ||
        alloc(d, &d->vn, c->new_rows ? d->lvn.elems * d->es : 0) ||
        alloc(d, &d->table, (size_t)(B * d->table_stride) * 4) || alloc(d, &d->seqused, (size_t)B * 4) ||
        alloc(d, &d->cu_q, (size_t)(B + 1) * 4) || alloc(d, &d->cu_k, (size_t)(B + 1) * 4) ||
        alloc(d, &d->cos_t, (size_t)(d->sk * (c->rotary_dim / 2)) * 4) ||
        alloc(d, &d->sin_t, (size_t)(d->sk * (c->rotary_dim / 2)) * 4) || alloc(d, &d->sink, (size_t)c->hq * 4) ||
        alloc(d, &d->slope, (size_t)c->hq * 4))
        return -1;
    d->qx = malloc((size_t)(d->total_q * c->hq * c->d + 1) * sizeof(double));
    d->kx = calloc((size_t)(B * d->kmax * c->hk * c->d), sizeof(double));
    d->vx = calloc((size_t)(B * d->kmax * c->hk * c->dv), sizeof(double));
    if (c->kv_pool) { /* V: a view into K's pool, and into its expected image */
        d->v.host = (unsigned char *)d->k.host + d->pool_block * (int64_t)d->es;
        d->v.device = d->k.device ? (unsigned char *)d->k.device + d->pool_block * (int64_t)d->es : NULL;
        d->v.bytes = d->k.bytes - (size_t)d->pool_block * d->es;
    }
    d->k_expect = malloc(d->k.bytes);
    d->v_expect = c->kv_pool ? d->k_expect + d->pool_block * (int64_t)d->es : malloc(d->v.bytes);
    if (!d->qx || !d->kx || !d->vx || !d->k_expect || !d->v_expect) return -1;

    for (b = 0; b <= B; ++b) {
        ((int32_t *)d->cu_q.host)[b] = (int32_t)(b < B ? d->start_q[b] : d->total_q);
        ((int32_t *)d->cu_k.host)[b] = (int32_t)(b < B ? d->start_k[b] : d->total_k);
        if (b < B) ((int32_t *)d->seqused.host)[b] = (int32_t)d->used[b];
    }
    if (c->page_size > 0) make_page_table(d, &rng);
    for (i = 0; i < d->sk * (c->rotary_dim / 2); ++i) { /* frequencies 10000^(-2i/r) */
        const int64_t p = i / (c->rotary_dim / 2), f = i % (c->rotary_dim / 2);
        const double theta = (double)p * pow(10000.0, -2.0 * (double)f / (double)c->rotary_dim);
        ((float *)d->cos_t.host)[i] = (float)cos(theta);
        ((float *)d->sin_t.host)[i] = (float)sin(theta);
    }
    for (i = 0; i < c->hq; ++i) {
        ((float *)d->sink.host)[i] = (float)test_rng_uniform(&rng, -2.0, 4.0);
        /* ALiBi's geometric slopes, scaled; now and then a small negative one */
        ((float *)d->slope.host)[i] = chance(&rng, 0.15) ? (float)test_rng_uniform(&rng, -0.05, 0.0)
                                                         : (float)(exp2(-8.0 * (double)(i + 1) / (double)c->hq) *
                                                                   test_rng_uniform(&rng, 0.5, 2.0));
    }
    make_caches(d, &rng);
    make_queries(d, &rng);
    return 0;
}

static test_mem *inputs_of(mix_data *d, int i) {
    test_mem *all[] = {&d->q, &d->kn, &d->vn, &d->table, &d->seqused, &d->cu_q, &d->cu_k, &d->cos_t, &d->sin_t, &d->sink, &d->slope, &d->k};
    return all[i];
}

static void data_free(mix_data *d) {
    test_mem *all[] = {&d->q, &d->k, &d->v, &d->o, &d->lse, &d->kn, &d->vn, &d->table, &d->seqused, &d->cu_q,
                       &d->cu_k, &d->cos_t, &d->sin_t, &d->sink, &d->slope, &d->ws};
    void *mem[] = {d->len_q, d->start_q, d->len_k, d->start_k, d->used, d->keys, d->qx, d->kx, d->vx, d->k_expect,
                   d->c->kv_pool ? NULL : d->v_expect}; /* a pool's V is a view into K's */
    size_t i;
    if (d->c->kv_pool) memset(&d->v, 0, sizeof d->v);
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) test_mem_free(all[i]);
    for (i = 0; i < sizeof mem / sizeof mem[0]; ++i) free(mem[i]);
    for (i = 0; i < 12; ++i) free(d->snap[i]);
}

/* ---- The reference --------------------------------------------------------------------------- */

typedef struct ref_out {
    const mix_data *d;
    double scale;
    double *o, *low, *lse; /* [total_q][hq][dv], the same in the dtype's naive algorithm, [hq][total_q] */
    unsigned char *seen;   /* [total_q][hq]: the row sees a key */
    double *max_score;     /* [batch * hq] the largest |score| a row of that job saw */
} ref_out;

/* The documented mask: diagonal key diag; causal and the right window bound from above, the left
 * window from below except for the first sink_tokens keys. */
static int visible(const mix_case *c, int64_t diag, int64_t j) {
    if (c->causal && j > diag) return 0;
    if (c->wr >= 0 && j - diag > c->wr) return 0; /* distances, not diag + window: windows reach INT64_MAX */
    if (c->wl >= 0 && diag - j > c->wl && j >= c->sink_tokens) return 0;
    return 1;
}

/* One (sequence, query head): every row in double, and the naive algorithm in the dtype (scores
 * rounded to it, softmax in float, probabilities rounded, P.V accumulated in float, rounded). */
static void ref_job_fn(void *arg, int64_t index, void *scratch) {
    ref_out *r = (ref_out *)arg;
    const mix_data *d = r->d;
    const mix_case *c = d->c;
    const flashattn_dtype_t dt = c->dt;
    const int64_t b = index / c->hq, h = index % c->hq, kh = h / (c->hq / c->hk), L = d->keys[b];
    const double sink = c->sinks ? ((const float *)d->sink.host)[h] : -INFINITY;
    const double slope = c->alibi ? ((const float *)d->slope.host)[h] : 0.0;
    double *s = (double *)scratch, *acc = s + d->kmax;
    float *sl = (float *)(acc + c->dv), *accl = sl + d->kmax;
    double worst = 0.0;
    int64_t i, j, col;
    for (i = 0; i < d->len_q[b]; ++i) {
        const int64_t t = d->start_q[b] + i, diag = c->top_left ? i : i + L - d->len_q[b];
        const double *q = d->qx + (t * c->hq + h) * c->d;
        double *o = r->o + (t * c->hq + h) * c->dv, *lo = r->low + (t * c->hq + h) * c->dv;
        double m = sink, l;
        float ml = (float)sink, ll;
        int any = 0;
        for (j = 0; j < L; ++j) {
            const double *k = kx_at(d, d->kx, b, j, kh, c->d);
            double dot = 0.0;
            float dotl = 0.0f;
            if (!visible(c, diag, j)) {
                s[j] = -INFINITY;
                continue;
            }
            for (col = 0; col < c->d; ++col) {
                dot += q[col] * k[col];
                dotl += (float)q[col] * (float)k[col];
            }
            dot *= r->scale;
            dotl = (float)test_round(dt, (double)(dotl * (float)r->scale));
            if (c->softcap > 0.0) {
                dot = c->softcap * tanh(dot / c->softcap);
                dotl = (float)test_round(dt, (double)((float)c->softcap * tanhf(dotl / (float)c->softcap)));
            }
            dot -= slope * (double)llabs(diag - j);
            dotl = (float)test_round(dt, (double)(dotl - (float)slope * (float)llabs(diag - j)));
            s[j] = dot;
            sl[j] = dotl;
            if (fabs(dot) > worst) worst = fabs(dot);
            if (dot > m) m = dot;
            if (dotl > ml) ml = dotl;
            any = 1;
        }
        r->seen[t * c->hq + h] = (unsigned char)any;
        for (col = 0; col < c->dv; ++col) acc[col] = 0.0, accl[col] = 0.0f;
        if (m == -INFINITY) { /* no key, no sink logit */
            for (col = 0; col < c->dv; ++col) o[col] = lo[col] = 0.0;
            r->lse[h * d->total_q + t] = -INFINITY;
            continue;
        }
        l = c->sinks ? exp(sink - m) : 0.0;
        ll = c->sinks ? expf((float)sink - ml) : 0.0f;
        for (j = 0; j < L; ++j) {
            if (s[j] == -INFINITY) continue;
            const double p = exp(s[j] - m);
            l += p;
            sl[j] = expf(sl[j] - ml);
            ll += sl[j];
            for (col = 0; col < c->dv; ++col) acc[col] += p * kx_at(d, d->vx, b, j, kh, c->dv)[col];
        }
        for (j = 0; j < L; ++j) {
            if (s[j] == -INFINITY) continue;
            const float p = (float)test_round(dt, (double)(sl[j] / ll));
            for (col = 0; col < c->dv; ++col) accl[col] += p * (float)kx_at(d, d->vx, b, j, kh, c->dv)[col];
        }
        for (col = 0; col < c->dv; ++col) {
            o[col] = acc[col] / l;
            lo[col] = test_round(dt, (double)accl[col]);
        }
        r->lse[h * d->total_q + t] = m + log(l);
    }
    r->max_score[index] = worst;
}

/* ---- Running the library --------------------------------------------------------------------- */

/* Sets the plan's keys (the shared ones through set_problem_keys(): sizes, dtype, mask, totals,
 * scale, softcap), with `mutation` applied, and finalizes it. */
static flashattn_status_t set_keys(flashattn_plan_t *plan, const mix_data *d, int mutation) {
    const mix_case *c = d->c;
    static const int stride_rows[6] = {TEST_STRIDES_Q, TEST_STRIDES_K, TEST_STRIDES_V,
                                       TEST_STRIDES_O, TEST_STRIDES_K_NEW, TEST_STRIDES_V_NEW};
    const tensor_layout *ls[6] = {&d->lq, &d->lk, &d->lv, &d->lo, &d->lkn, &d->lvn};
    case_shape shape;
    attn_case ac;
    test_key_value kv[24];
    size_t n = 0, i;
    int t;
    flashattn_status_t st;
    memset(&shape, 0, sizeof shape);
    memset(&ac, 0, sizeof ac);
    shape.batch = c->batch, shape.sq = d->sq, shape.sk = d->sk, shape.hq = c->hq, shape.hk = c->hk;
    shape.d = c->d, shape.dv = c->dv, shape.dtype = c->dt, shape.varlen = c->varlen;
    shape.total_q = d->total_q, shape.total_k = d->total_k; /* TOTAL_K means nothing to a paged plan */
    ac.causal = c->causal, ac.window_left = c->wl, ac.window_right = c->wr, ac.softcap = c->softcap, ac.scale = c->scale;
    if ((st = set_problem_keys(plan, &shape, &ac, TEST_BACKEND)) != FLASHATTN_SUCCESS) return st;
    for (t = 0; t < (c->new_rows > 0 ? 6 : 4); ++t) /* contiguous tensors sometimes keep the defaults */
        if ((c->layout[t] != 0 || (t + (int)c->batch) % 2 != 0) &&
            (st = set_strides_of(plan, &test_stride_keys[stride_rows[t]], &ls[t], 1, c->varlen && t < 4 && !(t && t < 3 && c->page_size))) !=
                FLASHATTN_SUCCESS)
            return st;
#define KEY(k, v) (kv[n].key = (k), kv[n].value = (v), ++n)
    KEY(FLASHATTN_I64_MASK_ALIGN, c->top_left ? FLASHATTN_MASK_ALIGN_TOP_LEFT : FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT);
    KEY(FLASHATTN_I64_SINK_TOKENS, c->sink_tokens);
    KEY(FLASHATTN_I64_SINK_LOGITS, c->sinks);
    KEY(FLASHATTN_I64_ALIBI, c->alibi);
    if (c->splits > 0) KEY(FLASHATTN_I64_NUM_SPLITS, c->splits);
    if (mutation == MUT_HEADS) KEY(FLASHATTN_I64_HEADS_KV, c->hq + 1);
    if (mutation == MUT_HEAD_DIM) KEY(FLASHATTN_I64_HEAD_DIM, c->d + 4);
    if (mutation == MUT_OUTPUT_DTYPE)
        KEY(FLASHATTN_I64_OUTPUT_DTYPE, c->dt == FLASHATTN_DTYPE_BF16 ? FLASHATTN_DTYPE_FP16 : FLASHATTN_DTYPE_BF16);
    if (c->page_size > 0) {
        const int64_t few = (d->sk - 1) / c->page_size; /* one page short of SEQLEN_K */
        KEY(FLASHATTN_I64_PAGED_KV, 1);
        KEY(FLASHATTN_I64_PAGE_SIZE, c->page_size);
        KEY(FLASHATTN_I64_NUM_PAGES, d->num_pages);
        KEY(FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, mutation == MUT_FEW_PAGES ? (few > 0 ? few : 1) : d->max_pages);
        KEY(FLASHATTN_I64_PAGE_TABLE_STRIDE, mutation == MUT_TABLE_STRIDE ? d->max_pages - 1 : d->table_stride);
    }
    if (c->seqused && mutation != MUT_APPEND_NO_USED) KEY(FLASHATTN_I64_SEQUSED_K, 1);
    if (c->new_rows > 0 && mutation != MUT_ROTARY_ALONE)
        KEY(FLASHATTN_I64_NEW_KV_ROWS, mutation == MUT_BIG_APPEND ? d->sk + 1 : c->new_rows);
    if (c->rotary_dim > 0 || mutation == MUT_ROTARY_ALONE) {
        KEY(FLASHATTN_I64_ROTARY_DIM, mutation == MUT_BIG_ROTARY ? c->d + 2 : c->rotary_dim > 0 ? c->rotary_dim : 8);
        KEY(FLASHATTN_I64_ROTARY_INTERLEAVED, c->interleaved);
    }
#undef KEY
    for (i = 0; i < n; ++i)
        if ((st = flashattn_plan_set_i64(plan, kv[i].key, kv[i].value)) != FLASHATTN_SUCCESS) return st;
    return flashattn_plan_finalize(plan);
}

/* One call, as the case asks (or as its mutation breaks it). */
static flashattn_status_t execute(const flashattn_plan_t *plan, mix_data *d, int mutation, size_t ws) {
    const mix_case *c = d->c;
    void *wsp = ws ? test_mem_ptr(&d->ws) : NULL;
    float *lse = c->with_lse ? (float *)test_mem_ptr(&d->lse) : NULL;
    flashattn_args_t *args = NULL;
    flashattn_status_t st;
    if (!c->args_call || mutation == MUT_OLD_CALL) {
        if (c->varlen)
            return flashattn_plan_execute_varlen(plan, test_mem_ptr(&d->q), test_mem_ptr(&d->k), test_mem_ptr(&d->v),
                                                 test_mem_ptr(&d->o), lse, (const int32_t *)test_mem_ptr(&d->cu_q),
                                                 (const int32_t *)test_mem_ptr(&d->cu_k), wsp, ws, NULL);
        return flashattn_plan_execute(plan, test_mem_ptr(&d->q), test_mem_ptr(&d->k), test_mem_ptr(&d->v),
                                      test_mem_ptr(&d->o), lse, wsp, ws, NULL);
    }
    if (flashattn_args_create(&args) != FLASHATTN_SUCCESS) return FLASHATTN_ERROR_ALLOCATION;
    {
        const int append = c->new_rows > 0;
        const struct { flashattn_arg_t which; const void *ptr; } set[] = {
            {FLASHATTN_ARG_Q, test_mem_ptr(&d->q)}, {FLASHATTN_ARG_K, test_mem_ptr(&d->k)},
            {FLASHATTN_ARG_V, test_mem_ptr(&d->v)}, {FLASHATTN_ARG_O, test_mem_ptr(&d->o)},
            {FLASHATTN_ARG_LSE, lse},
            {FLASHATTN_ARG_CU_SEQLENS_Q, c->varlen ? test_mem_ptr(&d->cu_q) : NULL},
            {FLASHATTN_ARG_CU_SEQLENS_K, c->varlen && !c->page_size ? test_mem_ptr(&d->cu_k) : NULL},
            {FLASHATTN_ARG_PAGE_TABLE, c->page_size || mutation == MUT_UNUSED_PTR ? test_mem_ptr(&d->table) : NULL},
            {FLASHATTN_ARG_SEQUSED_K, c->seqused ? test_mem_ptr(&d->seqused) : NULL},
            {FLASHATTN_ARG_K_NEW, append ? test_mem_ptr(&d->kn) : NULL},
            {FLASHATTN_ARG_V_NEW, append ? test_mem_ptr(&d->vn) : NULL},
            {FLASHATTN_ARG_ROTARY_COS, c->rotary_dim ? test_mem_ptr(&d->cos_t) : NULL},
            {FLASHATTN_ARG_ROTARY_SIN, c->rotary_dim ? test_mem_ptr(&d->sin_t) : NULL},
            {FLASHATTN_ARG_SINK_LOGITS, c->sinks ? test_mem_ptr(&d->sink) : NULL},
            {FLASHATTN_ARG_ALIBI_SLOPES, c->alibi ? test_mem_ptr(&d->slope) : NULL}};
        size_t i;
        for (i = 0; i < sizeof set / sizeof set[0]; ++i) flashattn_args_set(args, set[i].which, set[i].ptr);
    }
    st = flashattn_plan_execute_args(plan, args, wsp, ws, NULL);
    flashattn_args_destroy(args);
    return st;
}

/* ---- Checks ------------------------------------------------------------------------------------ */

/* O: every element, zero where the row sees no key; the gaps untouched. 0 when all pass. */
static int check_o(const mix_data *d, const ref_out *r, double tol, const char *what) {
    const mix_case *c = d->c;
    unsigned char *inside = calloc(d->lo.elems, 1);
    element_errors e = element_errors_none();
    long long gap;
    int64_t b, i, h, col;
    for (b = 0; b < c->batch; ++b)
        for (i = 0; i < d->len_q[b]; ++i)
            for (h = 0; h < c->hq; ++h) {
                const int64_t t = d->start_q[b] + i, off = q_offset(d, &d->lo, b, i, h);
                for (col = 0; col < c->dv; ++col) {
                    inside[off + col] = 1;
                    element_errors_add(&e, b, i, h, col, test_load(c->dt, (const unsigned char *)d->o.host + d->es * (size_t)(off + col)),
                                       r->o[(t * c->hq + h) * c->dv + col], tol, !r->seen[t * c->hq + h]);
                }
            }
    gap = first_written_gap(c->dt, d->o.host, inside, d->lo.elems);
    free(inside);
    EXPECT(e.b < 0, "%s O[seq %lld, row %lld, head %lld, col %lld] = %.8g, reference %.8g (max err %.3g, tolerance %.3g%s)",
           what, e.b, e.i, e.h, e.col, e.out, e.ref, e.max_err, tol, e.must_be_zero ? ", the row sees no key: must be 0" : "");
    EXPECT(gap < 0, "%s O element %lld lies in a stride gap but was written", what, gap);
    if (test_verbose()) printf("  %s: max|O - ref| %.3g (tolerance %.3g)\n", what, e.max_err, tol);
    return e.b >= 0 || gap >= 0;
}

static int check_lse(const mix_data *d, const ref_out *r, const char *what) {
    const mix_case *c = d->c;
    const float *lse = (const float *)d->lse.host;
    int64_t b, i, h;
    size_t e;
    if (!c->with_lse) { /* not passed: never written */
        for (e = 0; e < d->lse_elems; ++e)
            if (!test_is_poison(FLASHATTN_DTYPE_FP32, (const unsigned char *)(lse + e))) {
                EXPECT(0, "%s LSE buffer written although lse was NULL", what);
                return 1;
            }
        return 0;
    }
    for (b = 0; b < c->batch; ++b)
        for (h = 0; h < c->hq; ++h)
            for (i = 0; i < d->len_q[b]; ++i) {
                const int64_t t = d->start_q[b] + i;
                const size_t at = c->varlen ? (size_t)(h * d->total_q + t) : (size_t)((b * c->hq + h) * d->sq + i);
                const double out = lse[at], ref = r->lse[h * d->total_q + t];
                const int ok = ref == -INFINITY ? out == -INFINITY : fabs(out - ref) <= 1e-4 * (1.0 + fabs(ref));
                if (!ok) {
                    EXPECT(0, "%s LSE[seq %lld, head %lld, row %lld] = %.9g, reference %.9g", what, (long long)b,
                           (long long)h, (long long)i, out, ref);
                    return 1;
                }
            }
    return 0;
}

static int check_unchanged(mix_data *d, const char *what) {
    static const char *names[12] = {"Q", "K_new", "V_new", "page table", "seqused_k", "cu_seqlens_q", "cu_seqlens_k",
                                    "cos", "sin", "sink logits", "ALiBi slopes", "K cache"};
    int bad = 0, i;
    for (i = 0; i < 12; ++i) {
        if (d->snap[i] == NULL) continue;
        if (!test_mem_unchanged(inputs_of(d, i), d->snap[i])) {
            EXPECT(0, "%s the call changed its input %s", what, names[i]);
            bad = 1;
        }
    }
    return bad;
}

/* The caches: bitwise the expected image (appended rows rotated, the rest untouched). */
static int check_caches(const mix_data *d, const unsigned char *k_expect, const unsigned char *v_expect, const char *what) {
    const struct { const test_mem *m; const unsigned char *want; const char *name; } all[] = {
        {&d->k, k_expect, "K"}, {&d->v, v_expect, "V"}};
    int t, bad = 0;
    for (t = 0; t < 2; ++t) {
        size_t e;
        test_mem_download(all[t].m);
        for (e = 0; e < all[t].m->bytes / d->es; ++e)
            if (memcmp((const unsigned char *)all[t].m->host + e * d->es, all[t].want + e * d->es, d->es) != 0) {
                EXPECT(0, "%s %s cache element %zu is %.8g, expected %.8g (NaN poison = untouched)", what, all[t].name, e,
                       test_load(d->c->dt, (const unsigned char *)all[t].m->host + e * d->es), test_load(d->c->dt, all[t].want + e * d->es));
                bad = 1;
                break;
            }
    }
    return bad;
}

/* Outputs poisoned, caches reset; uploads every buffer. */
static void prepare_buffers(mix_data *d, const unsigned char *k_init, const unsigned char *v_init) {
    test_mem *all[] = {&d->q, &d->k, &d->v, &d->o, &d->lse, &d->kn, &d->vn, &d->table, &d->seqused, &d->cu_q,
                       &d->cu_k, &d->cos_t, &d->sin_t, &d->sink, &d->slope};
    size_t i;
    memcpy(d->k.host, k_init, d->k.bytes);
    memcpy(d->v.host, v_init, d->v.bytes);
    test_poison(d->c->dt, d->o.host, d->o.bytes);
    test_poison(FLASHATTN_DTYPE_FP32, d->lse.host, d->lse.bytes);
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) test_mem_upload(all[i]);
}

/* The status a mutation must give, where it must come (0: the setters/finalize, 1: the call), or
 * -1 when the mutation does not apply to this case (then it runs as a valid case). */
static int mutation_expect(const mix_data *d, int m, flashattn_status_t *want) {
    const mix_case *c = d->c;
    const int cpu = TEST_BACKEND == FLASHATTN_BACKEND_CPU;
    *want = FLASHATTN_ERROR_INVALID_ARGUMENT;
    switch (m) {
    case MUT_HEADS: return 0;
    case MUT_HEAD_DIM: return 0;
    case MUT_ROTARY_ALONE: return c->new_rows == 0 || c->rotary_dim > 0 ? 0 : -1;
    case MUT_APPEND_NO_USED: return c->new_rows > 0 ? 0 : -1;
    case MUT_OLD_CALL:
        if (c->seqused || c->page_size > 0) { /* serving plans: INVALID_STATE naming the new call */
            *want = FLASHATTN_ERROR_INVALID_STATE;
            return 1;
        }
        return c->sinks || c->alibi ? 1 : -1;
    case MUT_UNUSED_PTR: return c->args_call && c->page_size == 0 ? 1 : -1;
    case MUT_BAD_USED: return cpu && c->seqused ? 1 : -1;
    case MUT_BAD_PAGE: return cpu && c->page_size > 0 ? 1 : -1;
    case MUT_OUTPUT_DTYPE: return 0;
    case MUT_FEW_PAGES: return c->page_size > 0 && d->sk > c->page_size ? 0 : -1;
    case MUT_TABLE_STRIDE: return c->page_size > 0 ? 0 : -1;
    case MUT_BIG_APPEND: return c->new_rows > 0 ? 0 : -1;
    case MUT_BIG_ROTARY: return c->rotary_dim > 0 && c->d < 256 ? 0 : -1;
    case MUT_BAD_CU: return cpu && c->varlen ? 1 : -1;
    default: return -1;
    }
}

/* A second run from the same inputs (caches reset): bitwise the first's O, LSE and caches. */
static int check_repeat(const flashattn_plan_t *plan, mix_data *d, size_t ws, const unsigned char *k_init,
                        const unsigned char *v_init, const char *what) {
    test_mem *outs[4] = {&d->o, &d->lse, &d->k, &d->v};
    unsigned char *first[4];
    int t, bad = 0;
    flashattn_status_t st;
    for (t = 0; t < 4; ++t) {
        test_mem_download(outs[t]);
        first[t] = malloc(outs[t]->bytes);
        memcpy(first[t], outs[t]->host, outs[t]->bytes);
    }
    prepare_buffers(d, k_init, v_init);
    st = execute(plan, d, MUT_NONE, ws);
    EXPECT(st == FLASHATTN_SUCCESS, "%s second run: status %d (%s)", what, (int)st, flashattn_last_error());
    for (t = 0; t < 4; ++t) {
        if (st == FLASHATTN_SUCCESS && !test_mem_unchanged(outs[t], first[t])) {
            EXPECT(0, "%s second run: %s not bitwise the first run's", what, t == 0 ? "O" : t == 1 ? "LSE" : t == 2 ? "K cache" : "V cache");
            bad = 1;
        }
        free(first[t]);
    }
    return bad || st != FLASHATTN_SUCCESS;
}

/* ---- One case ----------------------------------------------------------------------------------- */

static void run_case(const mix_case *c, uint64_t seed, size_t index) {
    char what[768];
    mix_data d;
    flashattn_plan_t *plan = NULL;
    flashattn_status_t st, want = FLASHATTN_SUCCESS;
    unsigned char *k_init = NULL, *v_init = NULL;
    size_t ws = 0;
    int where, i;
    double t0;

    describe(what, sizeof what, c, index);
    if (data_make(&d, c, seed) != 0) {
        EXPECT(0, "%s out of memory", what);
        data_free(&d);
        return;
    }
    where = c->mutation != MUT_NONE ? mutation_expect(&d, c->mutation, &want) : -1;
    t0 = test_now_seconds();
    flashattn_plan_create(&plan);
    st = set_keys(plan, &d, where == 0 ? c->mutation : MUT_NONE);
    if (where == 0) {
        EXPECT(st == want && strlen(flashattn_last_error()) > 0, "%s: status %d, want %d (%s)", what, (int)st, (int)want,
               flashattn_last_error());
        ++g_invalid;
        goto done;
    }
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED && TEST_BACKEND != FLASHATTN_BACKEND_CPU) {
        EXPECT(strlen(flashattn_last_error()) > 0, "%s refused without a message", what);
        if (g_refused < 20 || test_verbose()) printf("refused %s: %s\n", what, flashattn_last_error());
        ++g_refused;
        goto done;
    }
    if (st != FLASHATTN_SUCCESS) {
        EXPECT(0, "%s finalize: status %d (%s)", what, (int)st, flashattn_last_error());
        goto done;
    }
    flashattn_plan_get_workspace_size(plan, &ws);
    {
        int64_t splits = -1, sq = -1; /* the number the plan runs: 1 where the backend has no split-KV */
        flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &splits);
        flashattn_plan_get_i64(plan, FLASHATTN_I64_SEQLEN_Q, &sq); /* varlen: lowered to total_q when larger */
        const int64_t low = d.total_q > 0 ? d.total_q : 1, low_k = d.total_k > 0 ? d.total_k : 1; /* at least 1 */
        const int64_t want_sq = c->varlen && d.sq > low ? low : d.sq;
        const int64_t want_sk = c->varlen && !c->page_size && d.sk > low_k ? low_k : d.sk; /* pages: not packed */
        int64_t sk = -1, wl = -2, wr = -2;
        flashattn_plan_get_i64(plan, FLASHATTN_I64_SEQLEN_K, &sk);
        flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_LEFT, &wl);
        flashattn_plan_get_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, &wr);
        EXPECT(sq == want_sq && sk == want_sk, "%s the plan reports SEQLEN_Q = %lld, SEQLEN_K = %lld", what,
               (long long)sq, (long long)sk);
        /* a window of at least seqlen_q + seqlen_k masks nothing: stored as -1 */
        EXPECT(wl == (c->wl - want_sk >= want_sq ? -1 : c->wl) && wr == (c->wr - want_sk >= want_sq ? -1 : c->wr),
               "%s the plan reports windows %lld, %lld", what, (long long)wl, (long long)wr);
        EXPECT(TEST_BACKEND == FLASHATTN_BACKEND_FA2 ? splits >= 1 && splits <= (c->splits ? c->splits : 128) : splits == 1,
               "%s the plan reports NUM_SPLITS = %lld", what, (long long)splits);
    }
    if (ws && test_mem_alloc(&d.ws, ws, d.dev)) {
        EXPECT(0, "%s could not allocate %zu bytes of workspace", what, ws);
        goto done;
    }

    /* The initial caches, and snapshots of every input (the K cache too when nothing appends). */
    k_init = malloc(d.k.bytes);
    v_init = malloc(d.v.bytes);
    memcpy(k_init, d.k.host, d.k.bytes);
    memcpy(v_init, d.v.host, d.v.bytes);
    if (where == 1 && c->mutation == MUT_BAD_USED) { /* past the cache, counting the append */
        const int64_t b = (int64_t)(seed % (uint64_t)c->batch);
        ((int32_t *)d.seqused.host)[b] = (int32_t)(d.len_k[b] - c->new_rows + 1);
    }
    if (where == 1 && c->mutation == MUT_BAD_PAGE) {
        const int64_t b = (int64_t)(seed % (uint64_t)c->batch);
        if (d.keys[b] > 0) ((int32_t *)d.table.host)[b * d.table_stride] = (int32_t)d.num_pages;
        else want = FLASHATTN_SUCCESS, where = -1; /* no page of that sequence is read */
    }
    if (where == 1 && c->mutation == MUT_BAD_CU) {
        if (c->page_size == 0 && seed % 2) ((int32_t *)d.cu_k.host)[0] = 1;
        else ((int32_t *)d.cu_q.host)[c->batch] = (int32_t)d.total_q + 1;
    }
    prepare_buffers(&d, k_init, v_init);
    for (i = 0; i < 12; ++i) {
        test_mem *m = inputs_of(&d, i);
        if (i == 11 && c->new_rows > 0) continue;
        d.snap[i] = malloc(m->bytes);
        memcpy(d.snap[i], m->host, m->bytes);
    }

    st = execute(plan, &d, where == 1 ? c->mutation : MUT_NONE, ws);
    {
        const char *err = d.dev ? test_device_error() : NULL;
        EXPECT(err == NULL, "%s CUDA error after the call: %s", what, err ? err : "");
    }
    test_mem_download(&d.o);
    test_mem_download(&d.lse);
    if (where == 1) { /* refused, naming the rule, and nothing written */
        size_t e;
        EXPECT(st == want && strlen(flashattn_last_error()) > 0, "%s: status %d, want %d (%s)", what, (int)st, (int)want,
               flashattn_last_error());
        for (e = 0; e < d.o.bytes / d.es; ++e)
            if (!test_is_poison(c->dt, (const unsigned char *)d.o.host + e * d.es)) break;
        EXPECT(e == d.o.bytes / d.es, "%s refused call wrote O element %zu", what, e);
        check_caches(&d, k_init, v_init, what);
        check_unchanged(&d, what);
        ++g_invalid;
        goto done;
    }
    if (st != FLASHATTN_SUCCESS) {
        EXPECT(0, "%s execute: status %d (%s)", what, (int)st, flashattn_last_error());
        goto done;
    }

    /* The reference and the checks. */
    {
        const double exec_s = test_now_seconds() - t0;
        const size_t n_o = (size_t)(d.total_q * c->hq * c->dv);
        ref_out r;
        double max_ref, base_err, tol, worst = 0.0;
        int64_t j;
        int bad = 0;
        flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &r.scale);
        EXPECT(fabs(r.scale - (c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d))) <= 1e-15 * r.scale,
               "%s resolved scale %.17g", what, r.scale);
        r.d = &d;
        r.o = calloc(n_o + 1, sizeof(double));
        r.low = calloc(n_o + 1, sizeof(double));
        r.lse = calloc((size_t)(c->hq * d.total_q + 1), sizeof(double));
        r.seen = calloc((size_t)(c->hq * d.total_q + 1), 1);
        r.max_score = calloc((size_t)(c->batch * c->hq), sizeof(double));
        ref_parallel(c->batch * c->hq, (size_t)(d.kmax + c->dv) * (sizeof(double) + sizeof(float)), ref_job_fn, &r);
        for (j = 0; j < c->batch * c->hq; ++j)
            if (r.max_score[j] > worst) worst = r.max_score[j];
        reference_scale(r.o, c->dt == FLASHATTN_DTYPE_FP32 ? NULL : r.low, n_o, &max_ref, &base_err);
        /* fp32: O is O(1); the float rounding of a score s moves O by up to ~2.4e-7 |s|. */
        tol = c->dt == FLASHATTN_DTYPE_FP32 ? 2e-5 + 1e-6 * worst : 2.0 * base_err + 1e-5;
        bad |= check_o(&d, &r, tol, what);
        bad |= check_lse(&d, &r, what);
        bad |= check_unchanged(&d, what);
        bad |= check_caches(&d, c->new_rows > 0 ? d.k_expect : k_init, c->new_rows > 0 ? d.v_expect : v_init, what);
        if (test_verbose())
            printf("  %s: %.1f ms, max|score| %.3g, lowp err %.3g\n", what, exec_s * 1e3, worst, base_err);
        if (!bad && c->repeat) bad |= check_repeat(plan, &d, ws, k_init, v_init, what);
        if (!bad) ++g_checked;
        free(r.o), free(r.low), free(r.lse), free(r.seen), free(r.max_score);
    }

done:
    flashattn_plan_destroy(plan);
    free(k_init);
    free(v_init);
    data_free(&d);
}

int main(void) {
    const int reduced = test_reduced_grid();
    const char *env_cases = getenv("FLASHATTN_TEST_MIX_CASES"), *env_first = getenv("FLASHATTN_TEST_MIX_FIRST");
    const size_t first = env_first ? (size_t)strtoull(env_first, NULL, 0) : 0;
    size_t cases = TEST_BACKEND == FLASHATTN_BACKEND_CPU ? 1200 : 2000, i;
    double t0 = test_now_seconds();
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) {
        int32_t major = 0, minor = 0;
        test_require_gpu_backend(TEST_BACKEND, &major, &minor);
    }
    g_seed = test_seed_from_env(g_seed);
    if (reduced) cases = 40;
    if (env_cases) cases = (size_t)strtoull(env_cases, NULL, 0);
    printf("test_random_mix on %s, seed %#llx (FLASHATTN_TEST_SEED), cases %zu..%zu (FLASHATTN_TEST_MIX_CASES)\n",
           test_backend_name(TEST_BACKEND), (unsigned long long)g_seed, first, first + cases - 1);
    fflush(stdout);
    for (i = first; i < first + cases; ++i) {
        const uint64_t case_seed = test_case_seed(g_seed, i);
        test_rng rng;
        mix_case c;
        const int before = g_failures;
        test_rng_seed(&rng, case_seed);
        draw_case(&rng, &c, reduced);
        run_case(&c, case_seed, i);
        if (g_failures != before) fflush(stdout);
    }
    printf("test_random_mix: %d cases checked, %d invalid combinations refused as documented, %d refused by the "
           "backend, %d failures, %.1f s\n",
           g_checked, g_invalid, g_refused, g_failures, test_now_seconds() - t0);
    if (g_refused > 20 && !test_verbose()) printf("(the first 20 refusals printed; FLASHATTN_TEST_VERBOSE=1 prints all)\n");
    return g_failures == 0 ? 0 : 1;
}
