/* One case's sizes, sequences and plan keys, shared by the forward check (test_support.c) and the
 * backward suite (see test_support.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_reference.h"
#include "test_support.h"

void shape_resolve(case_shape *s, const attn_case *c, flashattn_dtype_t dtype) {
    s->batch = c->batch;
    s->sq = c->seqlen_q;
    s->sk = c->seqlen_k;
    s->hq = c->heads_q;
    s->hk = c->heads_kv ? c->heads_kv : c->heads_q;
    s->d = c->head_dim;
    s->dv = c->head_dim_v ? c->head_dim_v : c->head_dim;
    s->dtype = dtype;
    s->scale = c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->head_dim);
    s->varlen = c->varlen != 0;
    s->total_q = s->batch * s->sq;
    s->total_k = s->batch * s->sk;
    s->len_q = s->len_k = s->start_q = s->start_k = NULL;
}

int shape_sequences(case_shape *s, test_rng *rng) {
    int64_t b;
    s->len_q = (int64_t *)calloc((size_t)s->batch, sizeof(int64_t));
    s->len_k = (int64_t *)calloc((size_t)s->batch, sizeof(int64_t));
    s->start_q = (int64_t *)calloc((size_t)s->batch, sizeof(int64_t));
    s->start_k = (int64_t *)calloc((size_t)s->batch, sizeof(int64_t));
    if (!s->len_q || !s->len_k || !s->start_q || !s->start_k) return -1;
    for (b = 0; b < s->batch; ++b) {
        s->len_q[b] = s->sq;
        s->len_k[b] = s->sk;
        if (s->varlen && b > 0) {
            s->len_q[b] = test_rng_range(rng, s->sq / 3, s->sq);
            s->len_k[b] = test_rng_range(rng, s->sk / 3, s->sk);
        }
    }
    return 0;
}

void shape_pack(case_shape *s) {
    int64_t b;
    s->total_q = s->total_k = 0;
    for (b = 0; b < s->batch; ++b) {
        s->start_q[b] = s->total_q;
        s->start_k[b] = s->total_k;
        s->total_q += s->len_q[b];
        s->total_k += s->len_k[b];
    }
}

void shape_cu_seqlens(const case_shape *s, int32_t *cu_q, int32_t *cu_k) {
    int64_t b;
    for (b = 0; b <= s->batch; ++b) {
        cu_q[b] = (int32_t)(b < s->batch ? s->start_q[b] : s->total_q);
        cu_k[b] = (int32_t)(b < s->batch ? s->start_k[b] : s->total_k);
    }
}

void shape_free(case_shape *s) {
    free(s->len_q);
    free(s->len_k);
    free(s->start_q);
    free(s->start_k);
    s->len_q = s->len_k = s->start_q = s->start_k = NULL;
}

int shape_describe(char *buf, size_t size, flashattn_backend_t backend, const attn_case *c, const case_shape *s) {
    return snprintf(buf, size,
                    "[%s b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s causal=%d "
                    "window=(%lld,%lld) softcap=%g scale=%g varlen=%d strided=%d",
                    test_backend_name(backend), (long long)s->batch, (long long)s->sq, (long long)s->sk,
                    (long long)s->hq, (long long)s->hk, (long long)s->d, (long long)s->dv, test_dtype_name(s->dtype),
                    c->causal, (long long)c->window_left, (long long)c->window_right, c->softcap, s->scale,
                    c->varlen, c->strided);
}

void fill_random_tensor(const case_shape *s, test_rng *rng, const test_mem *m, const tensor_layout *l, float *dst,
                        int q_side, int64_t heads, int64_t dim) {
    const size_t es = test_dtype_size(s->dtype);
    int64_t b, i, h, col;
    test_poison(s->dtype, m->host, m->bytes);
    for (b = 0; b < s->batch; ++b) {
        const int64_t len = q_side ? s->len_q[b] : s->len_k[b];
        const int64_t start = q_side ? s->start_q[b] : s->start_k[b];
        for (i = 0; i < len; ++i) {
            for (h = 0; h < heads; ++h) {
                unsigned char *p = (unsigned char *)m->host + es * (size_t)layout_offset(l, s->varlen, b, start + i, i, h);
                for (col = 0; col < dim; ++col) {
                    const double v = test_round(s->dtype, test_rng_uniform(rng, -1.0, 1.0));
                    dst[((start + i) * heads + h) * dim + col] = (float)v;
                    test_store(s->dtype, p + es * (size_t)col, v);
                }
            }
        }
    }
}

/* Stops at the first failing call, keeping its status (and so the library's message). */
#define TRY(call)                                         \
    do {                                                  \
        const flashattn_status_t st_ = (call);            \
        if (st_ != FLASHATTN_SUCCESS) return st_;         \
    } while (0)

flashattn_status_t set_problem_keys(flashattn_plan_t *plan, const case_shape *s, const attn_case *c,
                                    flashattn_backend_t backend) {
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, s->batch));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, s->sq));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, s->sk));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, s->hq));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, s->hk));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, s->d));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM_V, s->dv));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, s->dtype));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, c->causal ? 1 : 0));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_LEFT, c->window_left));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_WINDOW_RIGHT, c->window_right));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, backend));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_DEVICE, 0));
    TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_VARLEN, s->varlen));
    if (s->varlen) {
        TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_Q, s->total_q));
        TRY(flashattn_plan_set_i64(plan, FLASHATTN_I64_TOTAL_K, s->total_k));
    }
    /* scale 0 = the default 1/sqrt(head_dim): left unset so the library resolves it. */
    if (c->scale != 0.0) TRY(flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTMAX_SCALE, c->scale));
    return flashattn_plan_set_f64(plan, FLASHATTN_F64_SOFTCAP, c->softcap);
}

const flashattn_i64_param_t test_stride_keys[TEST_STRIDES_COUNT][3] = {
    {FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE},
    {FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE},
    {FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE},
    {FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE},
    {FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE},
    {FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE},
    {FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE},
    {FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE},
    {FLASHATTN_I64_K_NEW_BATCH_STRIDE, FLASHATTN_I64_K_NEW_ROW_STRIDE, FLASHATTN_I64_K_NEW_HEAD_STRIDE},
    {FLASHATTN_I64_V_NEW_BATCH_STRIDE, FLASHATTN_I64_V_NEW_ROW_STRIDE, FLASHATTN_I64_V_NEW_HEAD_STRIDE},
};

flashattn_status_t set_strides_of(flashattn_plan_t *plan, const flashattn_i64_param_t (*keys)[3],
                                  const tensor_layout *const *layouts, int n, int varlen) {
    int t;
    for (t = 0; t < n; ++t) {
        if (!varlen) TRY(flashattn_plan_set_i64(plan, keys[t][0], layouts[t]->batch_stride));
        TRY(flashattn_plan_set_i64(plan, keys[t][1], layouts[t]->row_stride));
        TRY(flashattn_plan_set_i64(plan, keys[t][2], layouts[t]->head_stride));
    }
    return FLASHATTN_SUCCESS;
}

flashattn_status_t set_forward_strides(flashattn_plan_t *plan, const tensor_layout *lq, const tensor_layout *lk,
                                       const tensor_layout *lv, const tensor_layout *lo, int varlen) {
    const tensor_layout *const layouts[4] = {lq, lk, lv, lo};
    return set_strides_of(plan, &test_stride_keys[TEST_STRIDES_Q], layouts, 4, varlen);
}

ref_problem shape_problem(const case_shape *s, const attn_case *c, const float *q, const float *k, const float *v,
                          const float *dout) {
    ref_problem p;
    p.batch = s->batch;
    p.heads_q = s->hq;
    p.heads_kv = s->hk;
    p.head_dim = s->d;
    p.head_dim_v = s->dv;
    p.dtype = s->dtype;
    p.causal = c->causal;
    p.window_left = c->window_left;
    p.window_right = c->window_right;
    p.softcap = c->softcap;
    p.scale = s->scale;
    p.len_q = s->len_q;
    p.len_k = s->len_k;
    p.start_q = s->start_q;
    p.start_k = s->start_k;
    p.total_q = s->total_q;
    p.total_k = s->total_k;
    p.q = q;
    p.k = k;
    p.v = v;
    p.dout = dout;
    return p;
}
