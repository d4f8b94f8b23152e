/* The serving features (issue 18) on one backend (TEST_BACKEND), through
 * flashattn_plan_execute_args(): paged K/V caches (page sizes 1, 3, 16, 256 and shuffled page
 * tables; 5, 48, 64 and 128 against the GPU key tiles), seqused_k (with empty sequences), and the append of 1 or several new K/V rows with a
 * rotary embedding (interleaved and half-split, rotary dim below the head dim), with causal and
 * window masks, GQA and variable-length queries.
 *
 * Each case checks, against the tests' own double reference (which gathers pages, appends and
 * rotates itself, sharing no code with the library):
 *   - every element of O and LSE (tolerance of the dtype's rounding);
 *   - every byte of both caches: the appended slots hold exactly the reference's rotated K (rounded
 *     once from double) and V, every other byte (other sequences' slots, unused slots, stride gaps,
 *     all poisoned with NaN) is untouched; unused page-table entries hold invalid pages, so a read
 *     of one fails;
 *   - "rotate, write, then attend": a second plan without the append, over the caches the first
 *     call wrote and the Q rotated by the test, gives bitwise the same O and LSE;
 *   - paged = contiguous: the same keys gathered into a contiguous cache give bitwise the same O;
 *   - split-KV forced (FLASHATTN_I64_NUM_SPLITS 2, 3 and 128) on the few-query cases: every element
 *     against the reference again, and the number of splits the plan reports (1 without split-KV);
 *   - the append itself under split-KV forced to 1, 2, 3 and 128 (fa2's decode tiles append in the
 *     attention kernel, the split that loads a new row writing it), from the initial caches each
 *     time: outputs and every byte of both caches again.
 * A last test checks the key's range and what get_i64 reports before and after finalize.
 * GPU backends that lack a feature must refuse it at finalize with NOT_SUPPORTED naming its key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_runner.h"

typedef struct serving_case {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    flashattn_dtype_t dtype;
    int causal;
    int64_t window_left, window_right;
    int64_t page_size; /* 0: a contiguous cache [batch, seqlen_k, heads_kv, head_dim] */
    int seqused;       /* per-sequence key counts (needed by an append) */
    int64_t new_rows;
    int64_t rotary_dim;
    int interleaved;
    int varlen_q; /* packed queries of random lengths (one sequence without queries); without pages the
                     keys are packed too (sequence b at rows b * seqlen_k, so not padded) */
    int padded;   /* padded strides of the caches, K_new/V_new and the page table */
} serving_case;

/* Field order: b, sq, sk, hq, hk, d, dtype, causal, wl, wr, page, seqused, new, rotary, interleaved, varlen, padded */
#define SCASE(b, sq, sk, hq, hk, d, dt, causal, wl, wr, page, used, nw, rd, il, vq, pad) \
    {b, sq, sk, hq, hk, d, dt, causal, wl, wr, page, used, nw, rd, il, vq, pad}

static const serving_case grid[] = {
    /* paged, full caches (no seqused_k): every page size, odd lengths */
    SCASE(2, 7, 37, 4, 2, 32, F32, 0, -1, -1, 1, 0, 0, 0, 0, 0, 0),
    SCASE(2, 7, 37, 4, 2, 32, F16, 1, -1, -1, 3, 0, 0, 0, 0, 0, 1),
    SCASE(3, 5, 100, 2, 2, 64, B16, 0, -1, -1, 16, 0, 0, 0, 0, 0, 0),
    SCASE(2, 33, 300, 4, 1, 64, F32, 1, -1, -1, 256, 0, 0, 0, 0, 0, 1),
    /* seqused_k (sequence 0 empty), contiguous and paged, masks */
    SCASE(3, 4, 50, 4, 2, 32, F32, 0, -1, -1, 0, 1, 0, 0, 0, 0, 0),
    SCASE(3, 4, 50, 4, 2, 32, F16, 1, -1, -1, 0, 1, 0, 0, 0, 0, 1),
    SCASE(3, 6, 70, 8, 2, 64, B16, 1, -1, -1, 3, 1, 0, 0, 0, 0, 0),
    SCASE(4, 3, 90, 4, 4, 40, F32, 0, 9, 0, 16, 1, 0, 0, 0, 0, 1),
    SCASE(2, 9, 600, 4, 2, 128, F16, 1, 31, -1, 256, 1, 0, 0, 0, 0, 0),
    /* decode: append one row, with and without rotary */
    SCASE(3, 1, 64, 8, 2, 64, F32, 1, -1, -1, 0, 1, 1, 0, 0, 0, 0),
    SCASE(3, 1, 64, 8, 2, 64, F16, 1, -1, -1, 16, 1, 1, 32, 0, 0, 0),
    SCASE(3, 1, 64, 8, 2, 64, B16, 0, -1, -1, 1, 1, 1, 64, 1, 0, 1),
    SCASE(2, 1, 513, 32, 8, 128, B16, 1, -1, -1, 256, 1, 1, 128, 0, 0, 0),
    /* append several rows (chunked prefill over a cached prefix), rotary dim < head dim */
    SCASE(2, 5, 80, 4, 2, 64, F32, 1, -1, -1, 0, 1, 5, 16, 1, 0, 1),
    SCASE(3, 5, 80, 4, 1, 64, F16, 1, -1, -1, 3, 1, 5, 48, 0, 0, 0),
    SCASE(2, 7, 90, 6, 3, 96, B16, 1, 20, 2, 16, 1, 7, 32, 1, 0, 1),
    SCASE(2, 4, 40, 4, 2, 32, F32, 0, -1, -1, 1, 1, 4, 32, 0, 0, 0),
    SCASE(2, 3, 60, 4, 2, 32, F16, 1, -1, -1, 16, 1, 6, 0, 0, 0, 1),
    /* contiguous caches: decode long enough for GPU split-KV, varlen queries over packed caches */
    SCASE(2, 1, 4096, 32, 8, 128, B16, 1, -1, -1, 0, 1, 1, 128, 0, 0, 0),
    SCASE(4, 1, 2000, 16, 2, 64, F16, 0, -1, -1, 0, 1, 0, 0, 0, 0, 0),
    SCASE(3, 5, 60, 4, 2, 64, F16, 1, -1, -1, 0, 1, 2, 32, 0, 1, 0),
    SCASE(2, 1, 3000, 16, 4, 64, F16, 1, -1, -1, 128, 1, 1, 64, 1, 0, 0), /* paged split-KV decode */
    /* varlen queries over paged keys */
    SCASE(4, 9, 70, 4, 2, 32, F32, 1, -1, -1, 16, 1, 0, 0, 0, 1, 0),
    SCASE(3, 6, 50, 4, 2, 64, B16, 1, -1, -1, 3, 1, 2, 32, 1, 1, 1),
    SCASE(3, 6, 50, 4, 4, 32, F16, 0, -1, -1, 1, 0, 0, 0, 0, 1, 0),
    /* the GPU tiles (fa3: 128 query rows, 128/96/80 keys at head dims 128/192/256; fa2: 64/128 keys):
       pages of 64 and 128 (whole fa2 tiles), pages that split the tiles (5, 48), several query and key
       tiles per sequence, seqused_k filling a tile partly */
    SCASE(2, 130, 700, 8, 2, 128, B16, 1, -1, -1, 64, 1, 0, 0, 0, 0, 0),
    SCASE(2, 40, 500, 4, 4, 256, F16, 0, -1, -1, 48, 1, 3, 64, 1, 0, 1),
    SCASE(3, 17, 400, 6, 2, 192, B16, 1, 50, -1, 5, 1, 0, 0, 0, 1, 0),
    SCASE(2, 64, 300, 4, 2, 64, F16, 1, -1, -1, 128, 0, 0, 0, 0, 0, 0),
    SCASE(2, 1, 1000, 32, 8, 128, B16, 1, -1, -1, 16, 1, 1, 128, 0, 0, 0), /* paged decode, page 16 */
    SCASE(2, 200, 600, 4, 2, 128, F16, 1, -1, -1, 0, 1, 8, 128, 1, 0, 1), /* chunked prefill, contiguous */
    /* rotary dims that end inside a 16-byte chunk (fa2's decode tiles rotate Q as they load it, the
       columns past the rotary dim of that chunk copied), GQA-packed rows, several query rows */
    SCASE(2, 3, 70, 8, 2, 64, B16, 1, -1, -1, 16, 1, 3, 20, 0, 0, 0),
    SCASE(2, 2, 130, 8, 2, 128, B16, 1, -1, -1, 5, 1, 2, 100, 0, 0, 0),
    SCASE(3, 1, 300, 12, 4, 96, F16, 0, -1, -1, 0, 1, 1, 42, 1, 0, 1),
    /* fa2's decode tiles append in the attention kernel (64-key tiles at head dim 128, 128 at 64):
       new rows across one or two tile edges, contiguous and in pages of 1 and 16, no GQA group,
       and new rows no query sees (a sliding window: written by a CTA that does not load them) */
    SCASE(2, 1, 400, 16, 4, 128, B16, 0, -1, -1, 16, 1, 66, 128, 0, 0, 0),
    SCASE(2, 3, 200, 4, 4, 64, B16, 1, -1, -1, 0, 1, 3, 64, 1, 0, 1),
    SCASE(2, 1, 300, 8, 2, 128, F16, 1, 7, -1, 16, 1, 80, 32, 1, 0, 0),
    SCASE(3, 2, 200, 8, 2, 64, F16, 1, -1, -1, 1, 1, 9, 32, 1, 0, 1),
    SCASE(2, 1, 300, 8, 2, 128, B16, 1, -1, -1, 0, 1, 70, 64, 0, 0, 0),
    SCASE(2, 1, 160, 32, 8, 128, B16, 1, -1, -1, 1, 1, 65, 128, 1, 0, 1),
    /* fa2's decode tiles on sm_90 take pages of a multiple of 16 keys by TMA boxes of 16 rows: padded
       strides, pages of 48 (boxes at rows 0/16/32 of a page) and 32, seqused_k ending inside a box
       (the last one in compute-sanitizer's reduced grid) */
    SCASE(3, 2, 333, 8, 2, 64, F16, 0, -1, -1, 32, 1, 0, 0, 0, 0, 1),
    SCASE(2, 3, 250, 8, 2, 128, F16, 1, -1, -1, 32, 1, 0, 0, 0, 0, 0),
    SCASE(3, 1, 700, 16, 4, 128, B16, 1, -1, -1, 48, 1, 1, 128, 0, 0, 1),
    /* ... on three K/V stages issued two tiles ahead: walks long enough per split that each stage's
       barriers turn several phases, walks of one and two tiles (the short splits), at both tile
       sizes (64 keys at head dim 128, 128 at 64), three tiles with a last one of 2 keys; the last
       case in compute-sanitizer's reduced grid */
    SCASE(5, 1, 2900, 8, 2, 64, F16, 0, -1, -1, 16, 1, 0, 0, 0, 0, 0),
    SCASE(2, 1, 130, 8, 2, 128, B16, 0, -1, -1, 16, 0, 0, 0, 0, 0, 0),
    SCASE(8, 1, 2100, 16, 4, 128, B16, 1, -1, -1, 16, 1, 1, 128, 0, 0, 1),
    /* fa2's decode tiles on sm_90 take a contiguous cache by the same walk, one page per sequence
       and boxes as tall as the key tile: seqused_k ending inside a tile (the box brings the stale
       rows, zeroed), padded strides with an append and rotary, the last tile past the tensor's end
       (TMA's zero fill), walks of many tiles per split; the
       last case in compute-sanitizer's reduced grid */
    SCASE(2, 2, 190, 8, 2, 64, F16, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0),
    SCASE(4, 1, 1500, 16, 4, 128, B16, 1, -1, -1, 0, 1, 0, 0, 0, 0, 0),
    SCASE(3, 1, 333, 32, 8, 128, B16, 1, -1, -1, 0, 1, 1, 128, 0, 0, 1),
};
#define NUM_CASES (sizeof grid / sizeof grid[0])

static uint64_t g_seed = 0x5e2b1c7a9d3f4e61ull;

/* ---- The case's data: logical arrays, physical tensors, expected images -------------------------- */

typedef struct layout4 {
    int64_t outer, row, head; /* element strides: batch or page, row (slot), head */
} layout4;

typedef struct case_data {
    const serving_case *c;
    flashattn_dtype_t dt;
    size_t es;
    int64_t group, max_pages, num_pages, table_stride, total_q;
    int64_t *sq, *q_start, *used, *len; /* per sequence: queries, first packed query, cache keys, attended keys */
    int32_t *table;                     /* [batch][table_stride] */
    layout4 kl;                         /* the caches' layout (K and V share it; V has head_dim too) */
    layout4 nl;                         /* K_new / V_new */
    size_t cache_elems, new_elems, q_elems, lse_elems;
    double *kref, *vref; /* [batch][seqlen_k][heads_kv][d]: what each sequence's keys are after the append */
    double *qref;        /* [total_q][heads_q][d]: Q as attention sees it (rotated) */
    float *cos_t, *sin_t;
    unsigned char *q_host, *q_rot_host, *k_init, *v_init, *k_expect, *v_expect, *k_new, *v_new;
} case_data;

static int64_t cache_offset(const case_data *d, int64_t b, int64_t pos, int64_t h) {
    if (d->c->page_size == 0) return b * d->kl.outer + pos * d->kl.row + h * d->kl.head;
    return (int64_t)d->table[b * d->table_stride + pos / d->c->page_size] * d->kl.outer +
           (pos % d->c->page_size) * d->kl.row + h * d->kl.head;
}

static double *kref_at(const case_data *d, double *base, int64_t b, int64_t pos, int64_t h) {
    const serving_case *c = d->c;
    return base + ((b * c->seqlen_k + pos) * c->heads_kv + h) * c->head_dim;
}

/* The rotary angle tables: fp32 [seqlen_k][rotary_dim / 2], frequencies 10000^(-2i/r). */
static void make_tables(case_data *d) {
    const serving_case *c = d->c;
    const int64_t half = c->rotary_dim / 2;
    int64_t p, i;
    d->cos_t = (float *)calloc((size_t)(c->seqlen_k * half + 1), sizeof(float));
    d->sin_t = (float *)calloc((size_t)(c->seqlen_k * half + 1), sizeof(float));
    for (p = 0; p < c->seqlen_k; ++p)
        for (i = 0; i < half; ++i) {
            const double theta = (double)p * pow(10000.0, -2.0 * (double)i / (double)c->rotary_dim);
            d->cos_t[p * half + i] = (float)cos(theta);
            d->sin_t[p * half + i] = (float)sin(theta);
        }
}

/* x (a row of d values, already of the dtype) rotated at position pos, each value rounded once. */
static void rotate_ref(const case_data *d, const double *x, double *out, int64_t pos) {
    const serving_case *c = d->c;
    const int64_t half = c->rotary_dim / 2;
    int64_t i;
    for (i = 0; i < c->head_dim; ++i) out[i] = x[i];
    for (i = 0; i < half; ++i) {
        const int64_t a = c->interleaved ? 2 * i : i, bcol = c->interleaved ? 2 * i + 1 : i + half;
        const double cs = d->cos_t[pos * half + i], sn = d->sin_t[pos * half + i];
        out[a] = test_round(d->dt, x[a] * cs - x[bcol] * sn);
        out[bcol] = test_round(d->dt, x[a] * sn + x[bcol] * cs);
    }
}

static double random_value(case_data *d, test_rng *rng) { return test_round(d->dt, test_rng_uniform(rng, -1.0, 1.0)); }

/* Sequence lengths: queries (varlen: random, sequence 1 without any), cache lengths (seqused_k:
 * random, sequence 0 empty) leaving room for the append and the rotary positions of the queries. */
static void make_lengths(case_data *d, test_rng *rng) {
    const serving_case *c = d->c;
    int64_t b;
    d->total_q = 0;
    for (b = 0; b < c->batch; ++b) {
        int64_t room;
        d->sq[b] = c->varlen_q ? (b == 1 ? 0 : test_rng_range(rng, 1, c->seqlen_q)) : c->seqlen_q;
        d->q_start[b] = d->total_q;
        d->total_q += d->sq[b];
        room = c->seqlen_k - (c->rotary_dim > 0 && d->sq[b] > c->new_rows ? d->sq[b] : c->new_rows);
        d->used[b] = !c->seqused ? c->seqlen_k : (b == 0 ? 0 : test_rng_range(rng, room / 2, room));
        d->len[b] = d->used[b] + c->new_rows;
    }
}

/* A shuffled page table; entries past a sequence's keys hold an invalid page, gaps -1. */
static void make_page_table(case_data *d, test_rng *rng) {
    const serving_case *c = d->c;
    int64_t *perm = (int64_t *)malloc((size_t)d->num_pages * sizeof(int64_t));
    int64_t i, b;
    test_rng_permutation(rng, perm, d->num_pages);
    for (b = 0; b < c->batch; ++b)
        for (i = 0; i < d->table_stride; ++i) {
            const int64_t needed = (d->len[b] + c->page_size - 1) / c->page_size;
            int32_t *e = &d->table[b * d->table_stride + i];
            if (i >= d->max_pages) *e = -1;
            else if (i >= needed) *e = 0x7fffffff;
            else *e = (int32_t)perm[b * d->max_pages + i];
        }
    free(perm);
}

static void make_layouts(case_data *d) {
    const serving_case *c = d->c;
    const int64_t pad = c->padded ? 8 : 0;
    d->kl.head = c->head_dim + pad;
    d->kl.row = c->heads_kv * d->kl.head + pad;
    if (c->page_size > 0) {
        d->max_pages = (c->seqlen_k + c->page_size - 1) / c->page_size;
        d->table_stride = d->max_pages + (c->padded ? 3 : 0);
        d->num_pages = c->batch * d->max_pages + 2; /* two pages nobody uses */
        d->kl.outer = c->page_size * d->kl.row + 2 * pad;
        d->cache_elems = (size_t)(d->num_pages * d->kl.outer);
    } else {
        d->max_pages = d->table_stride = d->num_pages = 0;
        d->kl.outer = c->seqlen_k * d->kl.row + 2 * pad;
        d->cache_elems = (size_t)(c->batch * d->kl.outer);
    }
    d->nl.head = c->head_dim;
    d->nl.row = c->heads_kv * c->head_dim + pad;
    d->nl.outer = c->new_rows * d->nl.row;
    d->new_elems = (size_t)(c->batch * d->nl.outer + 1);
}

/* The caches before the call (random keys below each sequence's cache length, poison elsewhere),
 * the rows to append, and what both caches must hold after the call. */
static void make_caches(case_data *d, test_rng *rng) {
    const serving_case *c = d->c;
    const size_t bytes = d->cache_elems * d->es;
    double *row = (double *)malloc((size_t)c->head_dim * sizeof(double));
    int64_t b, pos, h, col, j;
    test_poison(d->dt, d->k_init, bytes);
    test_poison(d->dt, d->v_init, bytes);
    test_poison(d->dt, d->k_new, d->new_elems * d->es);
    test_poison(d->dt, d->v_new, d->new_elems * d->es);
    for (b = 0; b < c->batch; ++b)
        for (pos = 0; pos < d->used[b]; ++pos)
            for (h = 0; h < c->heads_kv; ++h) {
                const int64_t off = cache_offset(d, b, pos, h);
                for (col = 0; col < c->head_dim; ++col) {
                    const double kx = random_value(d, rng), vx = random_value(d, rng);
                    kref_at(d, d->kref, b, pos, h)[col] = kx;
                    kref_at(d, d->vref, b, pos, h)[col] = vx;
                    test_store(d->dt, d->k_init + (size_t)(off + col) * d->es, kx);
                    test_store(d->dt, d->v_init + (size_t)(off + col) * d->es, vx);
                }
            }
    memcpy(d->k_expect, d->k_init, bytes);
    memcpy(d->v_expect, d->v_init, bytes);
    for (b = 0; b < c->batch; ++b)
        for (j = 0; j < c->new_rows; ++j)
            for (h = 0; h < c->heads_kv; ++h) {
                const int64_t src = b * d->nl.outer + j * d->nl.row + h * d->nl.head;
                const int64_t pos = d->used[b] + j, dst = cache_offset(d, b, pos, h);
                double *kr = kref_at(d, d->kref, b, pos, h), *vr = kref_at(d, d->vref, b, pos, h);
                for (col = 0; col < c->head_dim; ++col) {
                    row[col] = random_value(d, rng);
                    vr[col] = random_value(d, rng);
                    test_store(d->dt, d->k_new + (size_t)(src + col) * d->es, row[col]);
                    test_store(d->dt, d->v_new + (size_t)(src + col) * d->es, vr[col]);
                }
                if (c->rotary_dim > 0) rotate_ref(d, row, kr, pos);
                else memcpy(kr, row, (size_t)c->head_dim * sizeof(double));
                for (col = 0; col < c->head_dim; ++col) {
                    test_store(d->dt, d->k_expect + (size_t)(dst + col) * d->es, kr[col]);
                    test_store(d->dt, d->v_expect + (size_t)(dst + col) * d->es, vr[col]);
                }
            }
    free(row);
}

/* Q [total_q][heads_q][d] (contiguous; the fixed-length layout is the same bytes), and Q rotated. */
static void make_queries(case_data *d, test_rng *rng) {
    const serving_case *c = d->c;
    double *x = (double *)malloc((size_t)c->head_dim * sizeof(double));
    int64_t b, i, h, col;
    for (b = 0; b < c->batch; ++b)
        for (i = 0; i < d->sq[b]; ++i)
            for (h = 0; h < c->heads_q; ++h) {
                const int64_t t = ((d->q_start[b] + i) * c->heads_q + h) * c->head_dim;
                double *r = d->qref + t;
                for (col = 0; col < c->head_dim; ++col) {
                    x[col] = random_value(d, rng);
                    test_store(d->dt, d->q_host + (size_t)(t + col) * d->es, x[col]);
                }
                if (c->rotary_dim > 0) rotate_ref(d, x, r, d->used[b] + i);
                else memcpy(r, x, (size_t)c->head_dim * sizeof(double));
                for (col = 0; col < c->head_dim; ++col) test_store(d->dt, d->q_rot_host + (size_t)(t + col) * d->es, r[col]);
            }
    free(x);
}

static int data_make(case_data *d, const serving_case *c, flashattn_dtype_t dt, uint64_t seed) {
    test_rng rng;
    memset(d, 0, sizeof *d);
    d->c = c;
    d->dt = dt;
    d->es = test_dtype_size(dt);
    d->group = c->heads_q / c->heads_kv;
    test_rng_seed(&rng, seed);
    d->sq = (int64_t *)calloc((size_t)c->batch, sizeof(int64_t));
    d->q_start = (int64_t *)calloc((size_t)c->batch, sizeof(int64_t));
    d->used = (int64_t *)calloc((size_t)c->batch, sizeof(int64_t));
    d->len = (int64_t *)calloc((size_t)c->batch, sizeof(int64_t));
    make_lengths(d, &rng);
    make_layouts(d);
    d->table = (int32_t *)calloc((size_t)(c->batch * d->table_stride + 1), sizeof(int32_t));
    if (c->page_size > 0) make_page_table(d, &rng);
    make_tables(d);
    d->q_elems = (size_t)(d->total_q * c->heads_q * c->head_dim + 1);
    d->lse_elems = (size_t)(c->heads_q * (c->varlen_q ? d->total_q : c->batch * c->seqlen_q) + 1);
    d->kref = (double *)calloc((size_t)(c->batch * c->seqlen_k * c->heads_kv * c->head_dim), sizeof(double));
    d->vref = (double *)calloc((size_t)(c->batch * c->seqlen_k * c->heads_kv * c->head_dim), sizeof(double));
    d->qref = (double *)calloc(d->q_elems, sizeof(double));
    d->q_host = (unsigned char *)calloc(d->q_elems, d->es);
    d->q_rot_host = (unsigned char *)calloc(d->q_elems, d->es);
    d->k_init = (unsigned char *)malloc(d->cache_elems * d->es);
    d->v_init = (unsigned char *)malloc(d->cache_elems * d->es);
    d->k_expect = (unsigned char *)malloc(d->cache_elems * d->es);
    d->v_expect = (unsigned char *)malloc(d->cache_elems * d->es);
    d->k_new = (unsigned char *)malloc(d->new_elems * d->es);
    d->v_new = (unsigned char *)malloc(d->new_elems * d->es);
    if (!d->kref || !d->vref || !d->qref || !d->q_host || !d->q_rot_host || !d->k_init || !d->v_init ||
        !d->k_expect || !d->v_expect || !d->k_new || !d->v_new)
        return -1;
    make_caches(d, &rng);
    make_queries(d, &rng);
    return 0;
}

static void data_free(case_data *d) {
    void *all[] = {d->sq, d->q_start, d->used, d->len, d->table, d->cos_t, d->sin_t, d->kref, d->vref, d->qref,
                   d->q_host, d->q_rot_host, d->k_init, d->v_init, d->k_expect, d->v_expect, d->k_new, d->v_new};
    size_t i;
    for (i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* ---- The reference ------------------------------------------------------------------------------------- */

/* O [total_q][heads_q][d] and LSE of the case, in double, from the logical arrays. */
static void reference(const case_data *d, double scale, double *o, double *lse) {
    const serving_case *c = d->c;
    const int64_t dim = c->head_dim;
    double *s = (double *)malloc((size_t)(c->seqlen_k + 1) * sizeof(double));
    int64_t b, i, h, j, col;
    for (b = 0; b < c->batch; ++b)
        for (h = 0; h < c->heads_q; ++h)
            for (i = 0; i < d->sq[b]; ++i) {
                const int64_t kh = h / d->group, t = d->q_start[b] + i, L = d->len[b];
                const int64_t diag = i + L - d->sq[b];
                const double *q = d->qref + (t * c->heads_q + h) * dim;
                double *out = o + (t * c->heads_q + h) * dim, m = -INFINITY, sum = 0.0;
                for (col = 0; col < dim; ++col) out[col] = 0.0;
                for (j = 0; j < L; ++j) {
                    int visible = 1;
                    if (c->causal && j > diag) visible = 0;
                    if (c->window_right >= 0 && j > diag + c->window_right) visible = 0;
                    if (c->window_left >= 0 && j < diag - c->window_left) visible = 0;
                    s[j] = -INFINITY;
                    if (!visible) continue;
                    {
                        const double *k = kref_at(d, d->kref, b, j, kh);
                        double dot = 0.0;
                        for (col = 0; col < dim; ++col) dot += q[col] * k[col];
                        s[j] = dot * scale;
                        if (s[j] > m) m = s[j];
                    }
                }
                if (m == -INFINITY) {
                    lse[h * d->total_q + t] = -INFINITY;
                    continue;
                }
                for (j = 0; j < L; ++j) {
                    const double p = s[j] == -INFINITY ? 0.0 : exp(s[j] - m);
                    const double *v = kref_at(d, d->vref, b, j, kh);
                    if (p == 0.0) continue;
                    sum += p;
                    for (col = 0; col < dim; ++col) out[col] += p * v[col];
                }
                for (col = 0; col < dim; ++col) out[col] /= sum;
                lse[h * d->total_q + t] = m + log(sum);
            }
    free(s);
}

/* ---- Running the library --------------------------------------------------------------------------------- */

/* The buffers one call reads and writes, host and (GPU backends) device copies. */
typedef struct call_buffers {
    test_mem q, k, v, o, lse, table, seqused, k_new, v_new, cos_t, sin_t, cu_q, cu_k, ws;
} call_buffers;

/* How a plan views the case: the fused call, "rotate, write, then attend", or contiguous. */
typedef enum plan_kind { FUSED, ATTEND_ONLY, CONTIGUOUS } plan_kind;

/* seqused_k: the case's, or (after an append) the lengths the caller advanced. */
static int uses_seqused(const serving_case *c, plan_kind kind) { return c->seqused || (kind != FUSED && c->new_rows > 0); }

static flashattn_status_t set_plan_splits(flashattn_plan_t *plan, const case_data *d, plan_kind kind, int64_t splits) {
    const serving_case *c = d->c;
    const int paged = c->page_size > 0 && kind != CONTIGUOUS;
    const int seqused = uses_seqused(c, kind);
    const int fused = kind == FUSED;
    test_key_value kv[40];
    size_t n = 0, i;
#define KEY(k, v) (kv[n].key = (k), kv[n].value = (v), ++n)
    KEY(FLASHATTN_I64_BATCH, c->batch);
    KEY(FLASHATTN_I64_SEQLEN_Q, c->seqlen_q);
    KEY(FLASHATTN_I64_SEQLEN_K, c->seqlen_k);
    KEY(FLASHATTN_I64_HEADS_Q, c->heads_q);
    KEY(FLASHATTN_I64_HEADS_KV, c->heads_kv);
    KEY(FLASHATTN_I64_HEAD_DIM, c->head_dim);
    KEY(FLASHATTN_I64_DTYPE, d->dt);
    KEY(FLASHATTN_I64_CAUSAL, c->causal);
    KEY(FLASHATTN_I64_WINDOW_LEFT, c->window_left);
    KEY(FLASHATTN_I64_WINDOW_RIGHT, c->window_right);
    KEY(FLASHATTN_I64_BACKEND, TEST_BACKEND);
    if (c->varlen_q) {
        KEY(FLASHATTN_I64_VARLEN, 1);
        KEY(FLASHATTN_I64_TOTAL_Q, d->total_q);
        /* varlen without pages packs the keys: sequence b owns rows [b * seqlen_k, (b + 1) * seqlen_k) */
        if (!paged) KEY(FLASHATTN_I64_TOTAL_K, c->batch * c->seqlen_k);
    }
    if (kind == CONTIGUOUS) { /* the test's own contiguous copy: [batch, seqlen_k, heads_kv, d] */
        KEY(FLASHATTN_I64_K_BATCH_STRIDE, c->seqlen_k * c->heads_kv * c->head_dim);
        KEY(FLASHATTN_I64_V_BATCH_STRIDE, c->seqlen_k * c->heads_kv * c->head_dim);
    } else {
        KEY(FLASHATTN_I64_K_BATCH_STRIDE, d->kl.outer);
        KEY(FLASHATTN_I64_K_ROW_STRIDE, d->kl.row);
        KEY(FLASHATTN_I64_K_HEAD_STRIDE, d->kl.head);
        KEY(FLASHATTN_I64_V_BATCH_STRIDE, d->kl.outer);
        KEY(FLASHATTN_I64_V_ROW_STRIDE, d->kl.row);
        KEY(FLASHATTN_I64_V_HEAD_STRIDE, d->kl.head);
    }
    if (paged) {
        KEY(FLASHATTN_I64_PAGED_KV, 1);
        KEY(FLASHATTN_I64_PAGE_SIZE, c->page_size);
        KEY(FLASHATTN_I64_NUM_PAGES, d->num_pages);
        if (c->padded) {
            KEY(FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE, d->max_pages);
            KEY(FLASHATTN_I64_PAGE_TABLE_STRIDE, d->table_stride);
        }
    }
    if (seqused) KEY(FLASHATTN_I64_SEQUSED_K, 1);
    if (fused && c->new_rows > 0) {
        KEY(FLASHATTN_I64_NEW_KV_ROWS, c->new_rows);
        if (c->padded) {
            KEY(FLASHATTN_I64_K_NEW_ROW_STRIDE, d->nl.row);
            KEY(FLASHATTN_I64_V_NEW_ROW_STRIDE, d->nl.row);
            KEY(FLASHATTN_I64_K_NEW_BATCH_STRIDE, d->nl.outer);
            KEY(FLASHATTN_I64_V_NEW_BATCH_STRIDE, d->nl.outer);
        }
        if (c->rotary_dim > 0) {
            KEY(FLASHATTN_I64_ROTARY_DIM, c->rotary_dim);
            KEY(FLASHATTN_I64_ROTARY_INTERLEAVED, c->interleaved);
        }
    }
    if (splits > 0) KEY(FLASHATTN_I64_NUM_SPLITS, splits);
#undef KEY
    for (i = 0; i < n; ++i) {
        const flashattn_status_t st = flashattn_plan_set_i64(plan, kv[i].key, kv[i].value);
        if (st != FLASHATTN_SUCCESS) return st;
    }
    return flashattn_plan_finalize(plan);
}

static flashattn_status_t set_plan(flashattn_plan_t *plan, const case_data *d, plan_kind kind) {
    return set_plan_splits(plan, d, kind, 0);
}

/* A buffer holding `src`, or (src NULL: an output) the NaN poison of `dt`. */
static int alloc_upload(test_mem *m, const void *src, size_t bytes, int dev, flashattn_dtype_t dt) {
    if (test_mem_alloc(m, bytes, dev) != 0) return -1;
    memset(m->host, 0, m->bytes);
    if (src) memcpy(m->host, src, bytes);
    else test_poison(dt, m->host, m->bytes);
    return test_mem_upload(m);
}

/* One call of `plan` on the case's buffers: seqused_k = `seqused`, caches k/v. Downloads O, LSE. */
static flashattn_status_t run_plan(const flashattn_plan_t *plan, const case_data *d, plan_kind kind, test_mem *k,
                                   test_mem *v, const unsigned char *q, const int32_t *seqused, unsigned char *o,
                                   float *lse) {
    const serving_case *c = d->c;
    const int dev = test_on_device(TEST_BACKEND);
    call_buffers m;
    flashattn_args_t *args = NULL;
    flashattn_status_t st;
    size_t ws = 0;
    int32_t *cu = (int32_t *)calloc((size_t)c->batch + 1, sizeof(int32_t));
    int32_t *cu_k = (int32_t *)calloc((size_t)c->batch + 1, sizeof(int32_t));
    const int paged = c->page_size > 0 && kind != CONTIGUOUS;
    int64_t b;
    memset(&m, 0, sizeof m);
    for (b = 0; b < c->batch; ++b) {
        cu[b + 1] = (int32_t)(d->q_start[b] + d->sq[b]);
        cu_k[b + 1] = (int32_t)((b + 1) * c->seqlen_k);
    }
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    assert_int_equal(alloc_upload(&m.q, q, d->q_elems * d->es, dev, d->dt), 0);
    assert_int_equal(alloc_upload(&m.o, NULL, d->q_elems * d->es, dev, d->dt), 0);
    assert_int_equal(alloc_upload(&m.lse, NULL, d->lse_elems * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.table, d->table, (size_t)(c->batch * d->table_stride + 1) * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.seqused, seqused, (size_t)c->batch * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.k_new, d->k_new, d->new_elems * d->es, dev, d->dt), 0);
    assert_int_equal(alloc_upload(&m.v_new, d->v_new, d->new_elems * d->es, dev, d->dt), 0);
    assert_int_equal(alloc_upload(&m.cos_t, d->cos_t, (size_t)(c->seqlen_k * (c->rotary_dim / 2) + 1) * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.sin_t, d->sin_t, (size_t)(c->seqlen_k * (c->rotary_dim / 2) + 1) * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.cu_q, cu, (size_t)(c->batch + 1) * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(alloc_upload(&m.cu_k, cu_k, (size_t)(c->batch + 1) * 4, dev, FLASHATTN_DTYPE_FP32), 0);
    assert_int_equal(test_mem_alloc(&m.ws, ws, dev), 0);

    assert_int_equal(flashattn_args_create(&args), FLASHATTN_SUCCESS);
    flashattn_args_set(args, FLASHATTN_ARG_Q, test_mem_ptr(&m.q));
    flashattn_args_set(args, FLASHATTN_ARG_K, test_mem_ptr(k));
    flashattn_args_set(args, FLASHATTN_ARG_V, test_mem_ptr(v));
    flashattn_args_set(args, FLASHATTN_ARG_O, test_mem_ptr(&m.o));
    flashattn_args_set(args, FLASHATTN_ARG_LSE, test_mem_ptr(&m.lse));
    if (c->varlen_q) flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_Q, test_mem_ptr(&m.cu_q));
    if (c->varlen_q && !paged) flashattn_args_set(args, FLASHATTN_ARG_CU_SEQLENS_K, test_mem_ptr(&m.cu_k));
    if (paged) flashattn_args_set(args, FLASHATTN_ARG_PAGE_TABLE, test_mem_ptr(&m.table));
    if (uses_seqused(c, kind)) flashattn_args_set(args, FLASHATTN_ARG_SEQUSED_K, test_mem_ptr(&m.seqused));
    if (kind == FUSED && c->new_rows > 0) {
        flashattn_args_set(args, FLASHATTN_ARG_K_NEW, test_mem_ptr(&m.k_new));
        flashattn_args_set(args, FLASHATTN_ARG_V_NEW, test_mem_ptr(&m.v_new));
        if (c->rotary_dim > 0) {
            flashattn_args_set(args, FLASHATTN_ARG_ROTARY_COS, test_mem_ptr(&m.cos_t));
            flashattn_args_set(args, FLASHATTN_ARG_ROTARY_SIN, test_mem_ptr(&m.sin_t));
        }
    }
    st = flashattn_plan_execute_args(plan, args, test_mem_ptr(&m.ws), ws, NULL);
    if (st == FLASHATTN_SUCCESS) {
        const char *err = test_device_error();
        if (err) fail_msg("device error after the call: %s", err);
        assert_int_equal(test_mem_download(&m.o), 0);
        assert_int_equal(test_mem_download(&m.lse), 0);
        memcpy(o, m.o.host, d->q_elems * d->es);
        memcpy(lse, m.lse.host, d->lse_elems * 4);
    }
    flashattn_args_destroy(args);
    {
        test_mem *all[] = {&m.q, &m.o, &m.lse, &m.table, &m.seqused, &m.k_new, &m.v_new, &m.cos_t, &m.sin_t, &m.cu_q, &m.cu_k, &m.ws};
        size_t i;
        for (i = 0; i < sizeof all / sizeof all[0]; ++i) test_mem_free(all[i]);
    }
    free(cu);
    free(cu_k);
    return st;
}

/* ---- Checks ------------------------------------------------------------------------------------------- */

static double tolerance(flashattn_dtype_t dt) {
    return dt == FLASHATTN_DTYPE_FP32 ? 2e-5 : dt == FLASHATTN_DTYPE_FP16 ? 2e-3 : 1.6e-2;
}

/* LSE is [heads][total_q] for varlen, [batch][heads][seqlen_q] otherwise. */
static size_t lse_index(const case_data *d, int64_t b, int64_t i, int64_t h) {
    const serving_case *c = d->c;
    if (c->varlen_q) return (size_t)(h * d->total_q + d->q_start[b] + i);
    return (size_t)((b * c->heads_q + h) * c->seqlen_q + i);
}

static void check_outputs(const case_data *d, const unsigned char *o, const float *lse, const double *oref,
                          const double *lref) {
    const serving_case *c = d->c;
    const double tol = tolerance(d->dt);
    double worst = 0.0;
    int64_t b, i, h, col;
    for (b = 0; b < c->batch; ++b)
        for (i = 0; i < d->sq[b]; ++i)
            for (h = 0; h < c->heads_q; ++h) {
                const int64_t t = d->q_start[b] + i;
                const double lr = lref[h * d->total_q + t], lo = lse[lse_index(d, b, i, h)];
                for (col = 0; col < c->head_dim; ++col) {
                    const size_t at = (size_t)((t * c->heads_q + h) * c->head_dim + col);
                    const double out = test_load(d->dt, o + at * d->es), err = fabs(out - oref[at]);
                    if (!(err <= tol) || (lr == -INFINITY && out != 0.0))
                        fail_msg("O[seq %lld, row %lld, head %lld, col %lld] = %g, reference %g (tolerance %g)",
                                 (long long)b, (long long)i, (long long)h, (long long)col, out, oref[at], tol);
                    if (err > worst) worst = err;
                }
                if (lr == -INFINITY ? lo != -INFINITY : !(fabs(lo - lr) <= 1e-4 * (1.0 + fabs(lr))))
                    fail_msg("LSE[seq %lld, row %lld, head %lld] = %g, reference %g", (long long)b, (long long)i,
                             (long long)h, lo, lr);
            }
    if (test_verbose()) print_message("max |O - ref| = %.3g (tolerance %.3g)\n", worst, tol);
}

static void check_cache(const case_data *d, const test_mem *m, const unsigned char *expect, const char *name) {
    size_t i;
    assert_int_equal(test_mem_download(m), 0);
    for (i = 0; i < d->cache_elems; ++i)
        if (memcmp((const unsigned char *)m->host + i * d->es, expect + i * d->es, d->es) != 0)
            fail_msg("%s cache element %zu is %g, expected %g (poison = untouched)", name, i,
                     test_load(d->dt, (const unsigned char *)m->host + i * d->es), test_load(d->dt, expect + i * d->es));
}

/* The written caches gathered into contiguous [batch, seqlen_k, heads_kv, d], poison past each
 * sequence's keys. */
static void gather_contiguous(const case_data *d, const unsigned char *cache, unsigned char *out) {
    const serving_case *c = d->c;
    int64_t b, pos, h;
    test_poison(d->dt, out, (size_t)(c->batch * c->seqlen_k * c->heads_kv * c->head_dim) * d->es);
    for (b = 0; b < c->batch; ++b)
        for (pos = 0; pos < d->len[b]; ++pos)
            for (h = 0; h < c->heads_kv; ++h)
                memcpy(out + (size_t)(((b * c->seqlen_k + pos) * c->heads_kv + h) * c->head_dim) * d->es,
                       cache + (size_t)cache_offset(d, b, pos, h) * d->es, (size_t)c->head_dim * d->es);
}

static void assert_same_bits(const void *a, const void *b, size_t bytes, const char *what) {
    size_t i;
    for (i = 0; i < bytes; ++i)
        if (((const unsigned char *)a)[i] != ((const unsigned char *)b)[i])
            fail_msg("%s: not bitwise identical to the fused call's (first difference at byte %zu of %zu)", what, i, bytes);
}

/* ---- One case ---------------------------------------------------------------------------------------------- */

static void run_case(void **state) {
    const serving_case *c = (const serving_case *)*state;
    const flashattn_dtype_t dt = test_effective_dtype(TEST_BACKEND, c->dtype);
    const int dev = test_on_device(TEST_BACKEND);
    case_data d;
    flashattn_plan_t *plan = NULL;
    test_mem k, v;
    unsigned char *o, *o2;
    float *lse, *lse2;
    double *oref, *lref, scale;
    int32_t *seqused = (int32_t *)calloc((size_t)c->batch, sizeof(int32_t));
    flashattn_status_t st;
    int64_t b;

    assert_int_equal(data_make(&d, c, dt, test_case_seed(g_seed, (size_t)(c - grid))), 0);
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    st = set_plan(plan, &d, FUSED);
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU && st == FLASHATTN_ERROR_NOT_SUPPORTED) {
        /* a GPU backend without the feature must say which one */
        assert_non_null(strstr(flashattn_last_error(), "FLASHATTN_I64_"));
        print_message("not supported (as documented): %s\n", flashattn_last_error());
        flashattn_plan_destroy(plan);
        data_free(&d);
        free(seqused);
        return;
    }
    if (st != FLASHATTN_SUCCESS) fail_msg("finalize: %s", flashattn_last_error());
    assert_int_equal(flashattn_plan_get_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, &scale), FLASHATTN_SUCCESS);

    o = (unsigned char *)malloc(d.q_elems * d.es);
    o2 = (unsigned char *)malloc(d.q_elems * d.es);
    lse = (float *)malloc(d.lse_elems * 4);
    lse2 = (float *)malloc(d.lse_elems * 4);
    oref = (double *)calloc(d.q_elems, sizeof(double));
    lref = (double *)calloc((size_t)(c->heads_q * d.total_q + 1), sizeof(double));
    assert_int_equal(alloc_upload(&k, d.k_init, d.cache_elems * d.es, dev, d.dt), 0);
    assert_int_equal(alloc_upload(&v, d.v_init, d.cache_elems * d.es, dev, d.dt), 0);

    /* 1. the fused call */
    for (b = 0; b < c->batch; ++b) seqused[b] = (int32_t)d.used[b];
    st = run_plan(plan, &d, FUSED, &k, &v, d.q_host, seqused, o, lse);
    if (st != FLASHATTN_SUCCESS) fail_msg("execute: %s", flashattn_last_error());
    reference(&d, scale, oref, lref);
    check_outputs(&d, o, lse, oref, lref);
    check_cache(&d, &k, d.k_expect, "K");
    check_cache(&d, &v, d.v_expect, "V");
    flashattn_plan_destroy(plan);

    /* 2. rotate (the test), write (the first call did), then attend: bitwise the same */
    if (c->new_rows > 0) {
        for (b = 0; b < c->batch; ++b) seqused[b] = (int32_t)d.len[b]; /* what the caller advances */
        assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
        assert_int_equal(set_plan(plan, &d, ATTEND_ONLY), FLASHATTN_SUCCESS);
        st = run_plan(plan, &d, ATTEND_ONLY, &k, &v, d.q_rot_host, seqused, o2, lse2);
        if (st != FLASHATTN_SUCCESS) fail_msg("execute (attend only): %s", flashattn_last_error());
        assert_same_bits(o, o2, (d.q_elems - 1) * d.es, "O of rotate, write, then attend");
        assert_same_bits(lse, lse2, (d.lse_elems - 1) * 4, "LSE of rotate, write, then attend");
        flashattn_plan_destroy(plan);
    }

    /* 3. paged = contiguous: the same keys gathered by the test */
    if (c->page_size > 0) {
        const size_t bytes = (size_t)(c->batch * c->seqlen_k * c->heads_kv * c->head_dim) * d.es;
        test_mem kc, vc;
        for (b = 0; b < c->batch; ++b) seqused[b] = (int32_t)d.len[b];
        assert_int_equal(test_mem_alloc(&kc, bytes, dev), 0);
        assert_int_equal(test_mem_alloc(&vc, bytes, dev), 0);
        gather_contiguous(&d, (const unsigned char *)k.host, (unsigned char *)kc.host);
        gather_contiguous(&d, (const unsigned char *)v.host, (unsigned char *)vc.host);
        assert_int_equal(test_mem_upload(&kc), 0);
        assert_int_equal(test_mem_upload(&vc), 0);
        assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
        assert_int_equal(set_plan(plan, &d, CONTIGUOUS), FLASHATTN_SUCCESS);
        st = run_plan(plan, &d, CONTIGUOUS, &kc, &vc, d.q_rot_host, seqused, o2, lse2);
        if (st != FLASHATTN_SUCCESS) fail_msg("execute (contiguous): %s", flashattn_last_error());
        assert_same_bits(o, o2, (d.q_elems - 1) * d.es, "O of the contiguous cache");
        assert_same_bits(lse, lse2, (d.lse_elems - 1) * 4, "LSE of the contiguous cache");
        flashattn_plan_destroy(plan);
        test_mem_free(&kc);
        test_mem_free(&vc);
    }

    /* 4. split-KV forced (few queries: the decode-like cases) over the same keys: the reference again */
    if (c->seqlen_q <= 9) {
        static const int64_t asked[] = {2, 3, 128};
        const plan_kind kind = c->new_rows > 0 ? ATTEND_ONLY : FUSED; /* FUSED without an append: same inputs */
        size_t a;
        for (b = 0; b < c->batch; ++b) seqused[b] = (int32_t)(c->new_rows > 0 ? d.len[b] : d.used[b]);
        for (a = 0; a < sizeof asked / sizeof asked[0]; ++a) {
            int64_t got = -1;
            assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
            assert_int_equal(set_plan_splits(plan, &d, kind, asked[a]), FLASHATTN_SUCCESS);
            assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &got), FLASHATTN_SUCCESS);
            if (TEST_BACKEND == FLASHATTN_BACKEND_FA2) {
                if (got < 1 || got > asked[a]) fail_msg("NUM_SPLITS %lld asked, the plan runs %lld", (long long)asked[a], (long long)got);
                if (asked[a] <= 3 && c->seqlen_k >= 512 && got != asked[a])
                    fail_msg("NUM_SPLITS %lld asked with %lld keys, the plan runs %lld", (long long)asked[a],
                             (long long)c->seqlen_k, (long long)got);
            } else if (got != 1) {
                fail_msg("a backend without split-KV reports NUM_SPLITS = %lld", (long long)got);
            }
            st = run_plan(plan, &d, kind, &k, &v, kind == FUSED ? d.q_host : d.q_rot_host, seqused, o2, lse2);
            if (st != FLASHATTN_SUCCESS) fail_msg("execute (%lld splits): %s", (long long)got, flashattn_last_error());
            check_outputs(&d, o2, lse2, oref, lref);
            flashattn_plan_destroy(plan);
        }
    }

    /* 5. the append itself with split-KV forced (fa2's decode tiles write the new rows from the split
       that loads them): from the initial caches each time, outputs and both caches checked */
    if (c->new_rows > 0 && c->seqlen_q <= 9) {
        static const int64_t asked[] = {1, 2, 3, 128};
        size_t a;
        for (b = 0; b < c->batch; ++b) seqused[b] = (int32_t)d.used[b];
        for (a = 0; a < sizeof asked / sizeof asked[0]; ++a) {
            int64_t got = -1;
            memcpy(k.host, d.k_init, d.cache_elems * d.es);
            memcpy(v.host, d.v_init, d.cache_elems * d.es);
            assert_int_equal(test_mem_upload(&k), 0);
            assert_int_equal(test_mem_upload(&v), 0);
            assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
            assert_int_equal(set_plan_splits(plan, &d, FUSED, asked[a]), FLASHATTN_SUCCESS);
            assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &got), FLASHATTN_SUCCESS);
            if (got < 1 || got > asked[a]) fail_msg("NUM_SPLITS %lld asked, the plan runs %lld", (long long)asked[a], (long long)got);
            st = run_plan(plan, &d, FUSED, &k, &v, d.q_host, seqused, o2, lse2);
            if (st != FLASHATTN_SUCCESS) fail_msg("execute (append, %lld splits): %s", (long long)got, flashattn_last_error());
            check_outputs(&d, o2, lse2, oref, lref);
            check_cache(&d, &k, d.k_expect, "K");
            check_cache(&d, &v, d.v_expect, "V");
            flashattn_plan_destroy(plan);
        }
    }

    test_mem_free(&k);
    test_mem_free(&v);
    free(o), free(o2), free(lse), free(lse2), free(oref), free(lref), free(seqused);
    data_free(&d);
}

/* FLASHATTN_I64_NUM_SPLITS: 0 (auto) to 128; before finalize get_i64 returns what was set, after
 * it the number of parts the plan runs (fa2: the one split-KV backend, at most one per key tile). */
static void num_splits_key(void **state) {
    static const test_key_value decode[] = {
        {FLASHATTN_I64_BATCH, 1},    {FLASHATTN_I64_SEQLEN_Q, 1},  {FLASHATTN_I64_SEQLEN_K, 1000},
        {FLASHATTN_I64_HEADS_Q, 8},  {FLASHATTN_I64_HEADS_KV, 2},  {FLASHATTN_I64_HEAD_DIM, 64},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP16}, {FLASHATTN_I64_BACKEND, TEST_BACKEND},
    };
    flashattn_plan_t *plan = NULL;
    flashattn_status_t st;
    int64_t value = -7;
    (void)state;
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 0);
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_NUM_SPLITS, -1), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("FLASHATTN_I64_NUM_SPLITS");
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_NUM_SPLITS, 129), FLASHATTN_ERROR_INVALID_ARGUMENT);
    assert_message_mentions("FLASHATTN_I64_NUM_SPLITS");
    assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 0); /* the refused values changed nothing */
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_NUM_SPLITS, 128), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, 128);
    set_keys_or_fail(plan, decode, sizeof decode / sizeof decode[0]);
    st = flashattn_plan_finalize(plan);
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED && TEST_BACKEND != FLASHATTN_BACKEND_CPU) {
        print_message("decode plan not supported here: %s\n", flashattn_last_error());
        flashattn_plan_destroy(plan);
        return;
    }
    assert_int_equal(st, FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &value), FLASHATTN_SUCCESS);
    if (TEST_BACKEND == FLASHATTN_BACKEND_FA2) {
        if (value < 2 || value > 16) fail_msg("128 splits asked over 1000 keys: the plan runs %lld", (long long)value);
    } else {
        assert_int_equal(value, 1);
    }
    assert_status(flashattn_plan_set_i64(plan, FLASHATTN_I64_NUM_SPLITS, 5), FLASHATTN_SUCCESS);
    assert_status(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_get_i64(plan, FLASHATTN_I64_NUM_SPLITS, &value), FLASHATTN_SUCCESS);
    assert_int_equal(value, TEST_BACKEND == FLASHATTN_BACKEND_FA2 ? 5 : 1);
    flashattn_plan_destroy(plan);
}

static char names[NUM_CASES][160];
static struct CMUnitTest tests[NUM_CASES + 1];

static void name_case(char *buf, size_t size, const serving_case *c) {
    snprintf(buf, size, "b%lld_q%lld_k%lld_h%lld-%lld_d%lld_%s%s%s_page%lld%s_new%lld_rot%lld%s%s%s",
             (long long)c->batch, (long long)c->seqlen_q, (long long)c->seqlen_k, (long long)c->heads_q,
             (long long)c->heads_kv, (long long)c->head_dim,
             test_dtype_name(test_effective_dtype(TEST_BACKEND, c->dtype)), c->causal ? "_causal" : "",
             c->window_left >= 0 || c->window_right >= 0 ? "_window" : "", (long long)c->page_size,
             c->seqused ? "_seqused" : "", (long long)c->new_rows, (long long)c->rotary_dim,
             c->rotary_dim && c->interleaved ? "i" : "", c->varlen_q ? "_varlen" : "", c->padded ? "_padded" : "");
}

int main(void) {
    const int reduced = test_reduced_grid();
    size_t i, n = 0;
    int32_t major = 0, minor = 0;
    g_seed = test_seed_from_env(g_seed);
    if (TEST_BACKEND != FLASHATTN_BACKEND_CPU) test_require_gpu_backend(TEST_BACKEND, &major, &minor);
    printf("serving on backend %s, seed %llu (set FLASHATTN_TEST_SEED to change)\n", test_backend_name(TEST_BACKEND),
           (unsigned long long)g_seed);
    for (i = 0; i < NUM_CASES; ++i) {
        if (reduced && i % 3 != 0) continue; /* compute-sanitizer's grid */
        name_case(names[n], sizeof names[n], &grid[i]);
        tests[n] = test_unit(names[n], run_case, &grid[i]);
        ++n;
    }
    tests[n++] = test_unit("num_splits_key", num_splits_key, NULL);
    return _cmocka_run_group_tests(test_backend_name(TEST_BACKEND), tests, n, NULL, NULL);
}
