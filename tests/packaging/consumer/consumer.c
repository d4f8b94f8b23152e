/* Consumer of the installed libflashattn packages: one small fp32 attention problem on the CPU
 * backend (FLASHATTN_BACKEND=cpu), checked against a double-precision reference. Exit 0 on success.
 * Built twice by tests/packaging/test-debs.sh: with pkg-config and with find_package(flashattn). */
#include <flashattn/flashattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 2, SEQ_Q = 16, SEQ_K = 24, HEADS_Q = 4, HEADS_KV = 2, DIM = 32 };

static int fail(const char *what, flashattn_status_t s) {
    fprintf(stderr, "consumer: %s: %s: %s\n", what, flashattn_status_string(s), flashattn_last_error());
    return 1;
}

static float value(size_t i, unsigned salt) {
    return (float)((i * (2 * salt + 5) + salt) % 23) / 23.0f - 0.5f;
}

int main(void) {
    const size_t nq = (size_t)BATCH * SEQ_Q * HEADS_Q * DIM;
    const size_t nk = (size_t)BATCH * SEQ_K * HEADS_KV * DIM;
    const size_t nlse = (size_t)BATCH * HEADS_Q * SEQ_Q;
    const char *expect_info = getenv("FLASHATTN_EXPECT_BUILD_INFO");
    flashattn_plan_t *plan = NULL;
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = NULL;
    size_t ws_bytes = 0;
    void *ws = NULL;
    float *q, *k, *v, *o, *lse;
    double max_err = 0.0;
    flashattn_status_t s;
    size_t i;
    int b, h, r;

    printf("consumer: libflashattn %s (header %s, ABI %d), build: %s\n", flashattn_version_string(),
           FLASHATTN_VERSION_STRING, FLASHATTN_ABI_VERSION, flashattn_build_info());
    if (flashattn_version() / 10000 != FLASHATTN_VERSION_MAJOR) {
        fprintf(stderr, "consumer: run-time major %u differs from the header's %d\n",
                (unsigned)(flashattn_version() / 10000), FLASHATTN_VERSION_MAJOR);
        return 1;
    }
    if (expect_info && *expect_info && !strstr(flashattn_build_info(), expect_info)) {
        fprintf(stderr, "consumer: build info lacks \"%s\"\n", expect_info);
        return 1;
    }

    s = flashattn_plan_create(&plan);
    if (s != FLASHATTN_SUCCESS) return fail("plan_create", s);
    {
        const struct { flashattn_i64_param_t key; int64_t value; } params[] = {
            {FLASHATTN_I64_BATCH, BATCH},       {FLASHATTN_I64_SEQLEN_Q, SEQ_Q},
            {FLASHATTN_I64_SEQLEN_K, SEQ_K},    {FLASHATTN_I64_HEADS_Q, HEADS_Q},
            {FLASHATTN_I64_HEADS_KV, HEADS_KV}, {FLASHATTN_I64_HEAD_DIM, DIM},
            {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP32}, {FLASHATTN_I64_CAUSAL, 1},
        };
        for (i = 0; i < sizeof params / sizeof params[0]; ++i) {
            s = flashattn_plan_set_i64(plan, params[i].key, params[i].value);
            if (s != FLASHATTN_SUCCESS) return fail("plan_set_i64", s);
        }
    }
    /* Backend left at AUTO: FLASHATTN_BACKEND=cpu in the environment must select the CPU. */
    s = flashattn_plan_finalize(plan);
    if (s != FLASHATTN_SUCCESS) return fail("plan_finalize", s);
    s = flashattn_plan_get_backend(plan, &backend, &reason);
    if (s != FLASHATTN_SUCCESS) return fail("plan_get_backend", s);
    printf("consumer: backend %d (%s)\n", (int)backend, reason ? reason : "");
    if (backend != FLASHATTN_BACKEND_CPU) {
        fprintf(stderr, "consumer: expected the CPU backend, got %d\n", (int)backend);
        return 1;
    }
    s = flashattn_plan_get_workspace_size(plan, &ws_bytes);
    if (s != FLASHATTN_SUCCESS) return fail("plan_get_workspace_size", s);

    q = malloc(nq * sizeof *q);
    k = malloc(nk * sizeof *k);
    v = malloc(nk * sizeof *v);
    o = malloc(nq * sizeof *o);
    lse = malloc(nlse * sizeof *lse);
    if (ws_bytes) ws = aligned_alloc(256, (ws_bytes + 255) / 256 * 256);
    if (!q || !k || !v || !o || !lse || (ws_bytes && !ws)) {
        fprintf(stderr, "consumer: out of memory\n");
        return 1;
    }
    for (i = 0; i < nq; ++i) q[i] = value(i, 1);
    for (i = 0; i < nk; ++i) k[i] = value(i, 2), v[i] = value(i, 3);
    for (i = 0; i < nq; ++i) o[i] = NAN;

    s = flashattn_plan_execute(plan, q, k, v, o, lse, ws, ws_bytes, NULL);
    if (s != FLASHATTN_SUCCESS) return fail("plan_execute", s);

    /* Reference: causal aligned bottom-right, key j visible to query r iff j <= r + SEQ_K - SEQ_Q;
     * query head h reads key/value head h / (HEADS_Q / HEADS_KV). */
    for (b = 0; b < BATCH; ++b)
        for (h = 0; h < HEADS_Q; ++h)
            for (r = 0; r < SEQ_Q; ++r) {
                const int hk = h / (HEADS_Q / HEADS_KV), last = r + SEQ_K - SEQ_Q;
                const float *qr = q + (((size_t)b * SEQ_Q + r) * HEADS_Q + h) * DIM;
                double score[SEQ_K], mx = -INFINITY, sum = 0.0;
                int j, d;
                for (j = 0; j <= last; ++j) {
                    const float *kr = k + (((size_t)b * SEQ_K + j) * HEADS_KV + hk) * DIM;
                    double dot = 0.0;
                    for (d = 0; d < DIM; ++d) dot += (double)qr[d] * kr[d];
                    score[j] = dot / sqrt((double)DIM);
                    if (score[j] > mx) mx = score[j];
                }
                for (j = 0; j <= last; ++j) sum += exp(score[j] - mx);
                for (d = 0; d < DIM; ++d) {
                    const float got = o[(((size_t)b * SEQ_Q + r) * HEADS_Q + h) * DIM + d];
                    double want = 0.0;
                    for (j = 0; j <= last; ++j)
                        want += exp(score[j] - mx) / sum * v[(((size_t)b * SEQ_K + j) * HEADS_KV + hk) * DIM + d];
                    if (!isfinite(got)) {
                        fprintf(stderr, "consumer: non-finite output at b=%d h=%d r=%d d=%d\n", b, h, r, d);
                        return 1;
                    }
                    if (fabs(got - want) > max_err) max_err = fabs(got - want);
                }
                {
                    const float got_lse = lse[((size_t)b * HEADS_Q + h) * SEQ_Q + r];
                    if (!isfinite(got_lse) || fabs(got_lse - (mx + log(sum))) > 1e-4) {
                        fprintf(stderr, "consumer: bad lse %g (want %g) at b=%d h=%d r=%d\n", got_lse,
                                mx + log(sum), b, h, r);
                        return 1;
                    }
                }
            }
    printf("consumer: max |O - reference| = %.3g\n", max_err);
    if (max_err > 1e-4) {
        fprintf(stderr, "consumer: output differs from the reference\n");
        return 1;
    }

    flashattn_plan_destroy(plan);
    free(q); free(k); free(v); free(o); free(lse); free(ws);
    printf("consumer: OK\n");
    return 0;
}
