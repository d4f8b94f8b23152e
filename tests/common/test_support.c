/* check_attention_case(): one case end to end through the public API only, on host memory for the
 * CPU backend or on device memory for the GPU backends, checked element by element against the
 * references of test_reference.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_buffers.h"
#include "test_internal.h"

#ifdef FLASHATTN_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- GPU availability ----------------------------------------------------------------------- */

int test_gpu_available(void) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) { /* e.g. "CUDA driver version is insufficient", no driver at all */
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0;
#else
    return 0;
#endif
}

void test_skip_without_gpu(void) {
    if (!test_gpu_available()) {
        printf("no usable CUDA device (or tests built without CUDA): skipping\n");
        fflush(stdout);
        exit(77);
    }
}

/* ---- The check ------------------------------------------------------------------------------- */

#define FAIL(...)                                  \
    do {                                           \
        printf("FAIL %s: ", desc);                 \
        printf(__VA_ARGS__);                       \
        printf("\n");                              \
        fflush(stdout);                            \
        goto done;                                 \
    } while (0)

#define API(call)                                                                              \
    do {                                                                                       \
        const flashattn_status_t st_ = (call);                                                 \
        if (st_ != FLASHATTN_SUCCESS)                                                          \
            FAIL("%s returned %d (%s): %s", #call, (int)st_, flashattn_status_string(st_),     \
                 flashattn_last_error());                                                      \
    } while (0)

int check_attention_case(flashattn_backend_t backend, const attn_case *c, uint64_t seed) {
    char desc[512];
    case_shape r;
    test_rng rng;
    const int device = test_on_device(backend);
    const int varlen = c->varlen != 0;
    int result = 1;
    size_t es;
    int64_t b, i, h, j, col;
    float *qf = NULL, *kf = NULL, *vf = NULL;
    double *ref_o = NULL, *ref_lse = NULL, *low_o = NULL;
    unsigned char *o_first = NULL, *o_seen = NULL;
    float *lse_first = NULL;
    tensor_layout lq, lk, lv, lo;
    test_mem mq = {0, 0, 0}, mk = {0, 0, 0}, mv = {0, 0, 0}, mo = {0, 0, 0}, mlse = {0, 0, 0};
    test_mem mcu_q = {0, 0, 0}, mcu_k = {0, 0, 0}, mws = {0, 0, 0};
    size_t lse_count = 0, ws_bytes = 0;
    flashattn_plan_t *plan = NULL;
    flashattn_backend_t chosen;
    const char *reason = NULL;
    double tol, base_err = 0.0, max_ref = 0.0, exec_s = 0.0, ref_s = 0.0;
    int run;

    shape_resolve(&r, c, c->dtype);
    {
        const int n = shape_describe(desc, sizeof desc, backend, c, &r);
        snprintf(desc + n, sizeof desc - (size_t)n, " lse=%d seed=%llu]", c->with_lse, (unsigned long long)seed);
    }
    es = test_dtype_size(r.dtype);
    if (r.batch < 1 || r.hq < 1 || r.hk < 1 || r.hq % r.hk != 0) FAIL("malformed case");

    /* Sequence lengths: fixed, or random per sequence with the first at full length and, for
     * batch >= 3, one query sequence of length 0 and one (other) key sequence of length 0. */
    test_rng_seed(&rng, seed);
    if (shape_sequences(&r, &rng)) FAIL("out of memory");
    if (varlen && r.batch >= 3) {
        const int64_t zq = test_rng_range(&rng, 1, r.batch - 1);
        int64_t zk = test_rng_range(&rng, 1, r.batch - 2);
        if (zk >= zq) ++zk;
        r.len_q[zq] = 0;
        r.len_k[zk] = 0;
    }
    shape_pack(&r);

    lq = make_layout(r.batch, r.sq, r.total_q, varlen, r.hq, r.d, c->strided, 8, 16, 24);
    lk = make_layout(r.batch, r.sk, r.total_k, varlen, r.hk, r.d, c->strided, 16, 8, 8);
    lv = make_layout(r.batch, r.sk, r.total_k, varlen, r.hk, r.dv, c->strided, 8, 8, 16);
    lo = make_layout(r.batch, r.sq, r.total_q, varlen, r.hq, r.dv, c->strided, 8, 24, 8);
    lse_count = (size_t)(r.hq * r.total_q);

    if (test_mem_alloc(&mq, lq.elems * es, device) || test_mem_alloc(&mk, lk.elems * es, device) ||
        test_mem_alloc(&mv, lv.elems * es, device) || test_mem_alloc(&mo, lo.elems * es, device) ||
        test_mem_alloc(&mlse, (lse_count ? lse_count : 1) * sizeof(float), device))
        FAIL("could not allocate the tensors");
    qf = (float *)malloc((size_t)(r.total_q * r.hq * r.d + 1) * sizeof(float));
    kf = (float *)malloc((size_t)(r.total_k * r.hk * r.d + 1) * sizeof(float));
    vf = (float *)malloc((size_t)(r.total_k * r.hk * r.dv + 1) * sizeof(float));
    ref_o = (double *)malloc((size_t)(r.total_q * r.hq * r.dv + 1) * sizeof(double));
    low_o = (double *)malloc((size_t)(r.total_q * r.hq * r.dv + 1) * sizeof(double));
    ref_lse = (double *)malloc((lse_count + 1) * sizeof(double));
    o_first = (unsigned char *)malloc(lo.elems * es);
    o_seen = (unsigned char *)calloc(lo.elems, 1);
    lse_first = (float *)malloc((lse_count + 1) * sizeof(float));
    if (!qf || !kf || !vf || !ref_o || !low_o || !ref_lse || !o_first || !o_seen || !lse_first)
        FAIL("out of memory");

    /* Inputs: U(-1, 1) rounded to the dtype; every gap holds NaN so a read outside the tensor
     * shows up in the output. */
    test_poison(r.dtype, mq.host, lq.elems * es);
    test_poison(r.dtype, mk.host, lk.elems * es);
    test_poison(r.dtype, mv.host, lv.elems * es);
    for (b = 0; b < r.batch; ++b) {
        for (i = 0; i < r.len_q[b]; ++i) {
            const int64_t tok = r.start_q[b] + i;
            for (h = 0; h < r.hq; ++h) {
                unsigned char *dst = (unsigned char *)mq.host + es * (size_t)layout_offset(&lq, varlen, b, tok, i, h);
                for (col = 0; col < r.d; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    qf[(tok * r.hq + h) * r.d + col] = (float)x;
                    test_store(r.dtype, dst + es * (size_t)col, x);
                }
            }
        }
        for (j = 0; j < r.len_k[b]; ++j) {
            const int64_t tok = r.start_k[b] + j;
            for (h = 0; h < r.hk; ++h) {
                unsigned char *kd = (unsigned char *)mk.host + es * (size_t)layout_offset(&lk, varlen, b, tok, j, h);
                unsigned char *vd = (unsigned char *)mv.host + es * (size_t)layout_offset(&lv, varlen, b, tok, j, h);
                for (col = 0; col < r.d; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    kf[(tok * r.hk + h) * r.d + col] = (float)x;
                    test_store(r.dtype, kd + es * (size_t)col, x);
                }
                for (col = 0; col < r.dv; ++col) {
                    const double x = test_round(r.dtype, test_rng_uniform(&rng, -1.0, 1.0));
                    vf[(tok * r.hk + h) * r.dv + col] = (float)x;
                    test_store(r.dtype, vd + es * (size_t)col, x);
                }
            }
        }
    }

    /* References. */
    ref_s = test_now_seconds();
    {
        const ref_problem p = shape_problem(&r, c, qf, kf, vf, NULL);
        ref_attention(&p, ref_o, ref_lse);
        if (r.dtype != FLASHATTN_DTYPE_FP32) ref_attention_lowp(&p, low_o);
    }
    ref_s = test_now_seconds() - ref_s;
    reference_scale(ref_o, r.dtype != FLASHATTN_DTYPE_FP32 ? low_o : NULL, (size_t)(r.total_q * r.hq * r.dv), &max_ref,
                    &base_err);
    tol = r.dtype == FLASHATTN_DTYPE_FP32 ? 1e-5 * max_ref : 2.0 * base_err + 1e-5;

    /* Plan, through the public API only. */
    API(flashattn_plan_create(&plan));
    API(set_problem_keys(plan, &r, c, backend));
    if (c->strided) API(set_forward_strides(plan, &lq, &lk, &lv, &lo, varlen));
    API(flashattn_plan_finalize(plan));
    API(flashattn_plan_get_backend(plan, &chosen, &reason));
    if (chosen != backend)
        FAIL("plan runs backend %s, not the %s it was forced to (%s)", test_backend_name(chosen),
             test_backend_name(backend), reason ? reason : "");
    API(flashattn_plan_get_workspace_size(plan, &ws_bytes));
    if (ws_bytes && test_mem_alloc(&mws, ws_bytes, device)) FAIL("could not allocate %zu bytes of workspace", ws_bytes);
    /* The workspace starts poisoned: the library may not count on anything left in it. */
    if (ws_bytes) {
        memset(mws.host, 0xff, ws_bytes);
        if (test_mem_upload(&mws)) FAIL("cudaMemcpy of the poisoned workspace failed");
    }

    if (varlen) {
        if (test_mem_alloc(&mcu_q, (size_t)(r.batch + 1) * sizeof(int32_t), device) ||
            test_mem_alloc(&mcu_k, (size_t)(r.batch + 1) * sizeof(int32_t), device))
            FAIL("could not allocate cu_seqlens");
        shape_cu_seqlens(&r, (int32_t *)mcu_q.host, (int32_t *)mcu_k.host);
        if (test_mem_upload(&mcu_q) || test_mem_upload(&mcu_k)) FAIL("cudaMemcpy of cu_seqlens failed");
    }
    if (test_mem_upload(&mq) || test_mem_upload(&mk) || test_mem_upload(&mv)) FAIL("cudaMemcpy of the inputs failed");

    for (run = 0; run < 2; ++run) {
        float *lse_ptr = c->with_lse ? (float *)test_mem_ptr(&mlse) : NULL;
        double t0;
        test_poison(r.dtype, mo.host, lo.elems * es);
        test_poison(FLASHATTN_DTYPE_FP32, mlse.host, (lse_count ? lse_count : 1) * sizeof(float));
        if (test_mem_upload(&mo) || test_mem_upload(&mlse)) FAIL("cudaMemcpy of the poisoned outputs failed");
        t0 = test_now_seconds();
        if (varlen) {
            API(flashattn_plan_execute_varlen(plan, test_mem_ptr(&mq), test_mem_ptr(&mk), test_mem_ptr(&mv),
                                              test_mem_ptr(&mo), lse_ptr, (const int32_t *)test_mem_ptr(&mcu_q),
                                              (const int32_t *)test_mem_ptr(&mcu_k),
                                              ws_bytes ? test_mem_ptr(&mws) : NULL, ws_bytes, NULL));
        } else {
            API(flashattn_plan_execute(plan, test_mem_ptr(&mq), test_mem_ptr(&mk), test_mem_ptr(&mv), test_mem_ptr(&mo),
                                       lse_ptr, ws_bytes ? test_mem_ptr(&mws) : NULL, ws_bytes, NULL));
        }
        if (device) {
            const char *err = test_device_error();
            if (err != NULL) FAIL("CUDA error after execute (run %d): %s", run + 1, err);
        }
        if (run == 0) exec_s = test_now_seconds() - t0;
        if (test_mem_download(&mo) || test_mem_download(&mlse)) FAIL("cudaMemcpy of the outputs failed");

        if (run == 1) { /* the second run must reproduce the first bit for bit */
            if (memcmp(o_first, mo.host, lo.elems * es) != 0) {
                size_t e = 0;
                while (e < lo.elems * es && o_first[e] == ((unsigned char *)mo.host)[e]) ++e;
                FAIL("second run differs from the first in O (first differing byte %zu)", e);
            }
            if (c->with_lse && memcmp(lse_first, mlse.host, lse_count * sizeof(float)) != 0)
                FAIL("second run differs from the first in LSE");
            break;
        }
        memcpy(o_first, mo.host, lo.elems * es);
        memcpy(lse_first, mlse.host, (lse_count ? lse_count : 1) * sizeof(float));

        /* O: every element against the reference. */
        {
            element_errors errs = element_errors_none();
            long long gap;
            for (b = 0; b < r.batch; ++b) {
                for (i = 0; i < r.len_q[b]; ++i) {
                    const int64_t tok = r.start_q[b] + i;
                    for (h = 0; h < r.hq; ++h) {
                        const int64_t off = layout_offset(&lo, varlen, b, tok, i, h);
                        const int masked = ref_lse[h * r.total_q + tok] == -INFINITY;
                        for (col = 0; col < r.dv; ++col) {
                            const double out = test_load(r.dtype, (unsigned char *)mo.host + es * (size_t)(off + col));
                            o_seen[off + col] = 1;
                            element_errors_add(&errs, b, i, h, col, out, ref_o[(tok * r.hq + h) * r.dv + col], tol, masked);
                        }
                    }
                }
            }
            if (test_verbose()) {
                printf("  %s: O max err %.3e (tol %.3e, lowp err %.3e, max|ref| %.3e), exec %.3f ms, references %.2f s\n",
                       desc, errs.max_err, tol, base_err, max_ref, exec_s * 1e3, ref_s);
            }
            if (errs.b >= 0)
                FAIL("O max|out-ref| = %.4e, tolerance %.4e (lowp baseline %.4e, max|ref| %.4e); first bad "
                     "element at batch %lld row %lld head %lld col %lld: out %.8g ref %.8g",
                     errs.max_err, tol, base_err, max_ref, errs.b, errs.i, errs.h, errs.col, errs.out, errs.ref);
            /* Gaps of O: untouched. */
            gap = first_written_gap(r.dtype, mo.host, o_seen, lo.elems);
            if (gap >= 0) FAIL("O element %lld lies outside the tensor (a stride gap) but was written", gap);
        }
        /* LSE. */
        if (c->with_lse) {
            const float *lse = (const float *)mlse.host;
            for (b = 0; b < r.batch; ++b) {
                for (h = 0; h < r.hq; ++h) {
                    for (i = 0; i < r.len_q[b]; ++i) {
                        const int64_t tok = r.start_q[b] + i;
                        const size_t idx = varlen ? (size_t)(h * r.total_q + tok)
                                                  : (size_t)((b * r.hq + h) * r.sq + i);
                        const double out = (double)lse[idx];
                        const double ref = ref_lse[h * r.total_q + tok];
                        int ok;
                        if (ref == -INFINITY) {
                            ok = out == -INFINITY;
                        } else {
                            ok = fabs(out - ref) <= 1e-4 * (1.0 + fabs(ref));
                        }
                        if (!ok)
                            FAIL("LSE at batch %lld head %lld row %lld: out %.9g ref %.9g (tolerance %.3g)",
                                 (long long)b, (long long)h, (long long)i, out, ref,
                                 ref == -INFINITY ? 0.0 : 1e-4 * (1.0 + fabs(ref)));
                    }
                }
            }
        } else {
            const float *lse = (const float *)mlse.host;
            size_t e;
            for (e = 0; e < lse_count; ++e) {
                uint32_t u;
                memcpy(&u, lse + e, 4);
                if (u != TEST_POISON_FP32) FAIL("LSE buffer written although lse was NULL");
            }
        }
    }
    result = 0;

done:
    flashattn_plan_destroy(plan);
    test_mem_free(&mq);
    test_mem_free(&mk);
    test_mem_free(&mv);
    test_mem_free(&mo);
    test_mem_free(&mlse);
    test_mem_free(&mcu_q);
    test_mem_free(&mcu_k);
    test_mem_free(&mws);
    shape_free(&r);
    free(qf);
    free(kf);
    free(vf);
    free(ref_o);
    free(low_o);
    free(ref_lse);
    free(o_first);
    free(o_seen);
    free(lse_first);
    return result;
}
