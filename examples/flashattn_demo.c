/* flashattn-demo: run one random attention problem on the backend libflashattn picks (or the one
 * asked for), report the backend and why, the time per call and the throughput, and check the
 * first rows of every head against a double-precision reference computed here.
 *
 *   flashattn-demo [--batch N] [--seqlen N] [--heads N] [--head-dim N] [--causal]
 *                  [--dtype fp16|bf16|fp32] [--backend auto|cpu|fa1|fa2|fa3] [--iters N]
 *
 * Exit status: 0 on success, 1 when a call fails or the error exceeds its bound, 2 on bad usage. */
#define _POSIX_C_SOURCE 200112L /* clock_gettime, posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flashattn/flashattn.h>

#ifdef FLASHATTN_DEMO_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define CHECK_STATUS(call)                                                                   \
    do {                                                                                     \
        const flashattn_status_t status_ = (call);                                           \
        if (status_ != FLASHATTN_SUCCESS) {                                                  \
            fprintf(stderr, "flashattn-demo: %s failed: %s: %s\n", #call,                    \
                    flashattn_status_string(status_), flashattn_last_error());               \
            goto cleanup;                                                                    \
        }                                                                                    \
    } while (0)

#define REFERENCE_ROWS 16 /* rows of each (batch, head) checked against the reference */

typedef struct options {
    int64_t batch, seqlen, heads, head_dim;
    int causal;
    flashattn_dtype_t dtype;
    flashattn_backend_t backend;
    int iters; /* 0: chosen by backend */
} options;

static void usage(FILE *out) {
    fprintf(out,
            "usage: flashattn-demo [--batch N] [--seqlen N] [--heads N] [--head-dim N] [--causal]\n"
            "                      [--dtype fp16|bf16|fp32] [--backend auto|cpu|fa1|fa2|fa3] [--iters N]\n"
            "defaults: --batch 2 --seqlen 1024 --heads 8 --head-dim 64 --dtype fp16 --backend auto\n");
}

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    int i;
    o->batch = 2;
    o->seqlen = 1024;
    o->heads = 8;
    o->head_dim = 64;
    o->causal = 0;
    o->dtype = FLASHATTN_DTYPE_FP16;
    o->backend = FLASHATTN_BACKEND_AUTO;
    o->iters = 0;
    for (i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--causal") == 0) {
            o->causal = 1;
            continue;
        }
        if (val == NULL) {
            fprintf(stderr, "flashattn-demo: %s needs a value\n", a);
            return -1;
        }
        ++i;
        if (strcmp(a, "--batch") == 0) {
            if (parse_int(val, 1, 1 << 20, &o->batch)) goto bad;
        } else if (strcmp(a, "--seqlen") == 0) {
            if (parse_int(val, 1, 1 << 24, &o->seqlen)) goto bad;
        } else if (strcmp(a, "--heads") == 0) {
            if (parse_int(val, 1, 1 << 12, &o->heads)) goto bad;
        } else if (strcmp(a, "--head-dim") == 0) {
            if (parse_int(val, 1, 4096, &o->head_dim)) goto bad;
        } else if (strcmp(a, "--iters") == 0) {
            if (parse_int(val, 1, 100000, &n)) goto bad;
            o->iters = (int)n;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(val, "fp16") == 0) o->dtype = FLASHATTN_DTYPE_FP16;
            else if (strcmp(val, "bf16") == 0) o->dtype = FLASHATTN_DTYPE_BF16;
            else if (strcmp(val, "fp32") == 0) o->dtype = FLASHATTN_DTYPE_FP32;
            else goto bad;
        } else if (strcmp(a, "--backend") == 0) {
            if (strcmp(val, "auto") == 0) o->backend = FLASHATTN_BACKEND_AUTO;
            else if (strcmp(val, "cpu") == 0) o->backend = FLASHATTN_BACKEND_CPU;
            else if (strcmp(val, "fa1") == 0) o->backend = FLASHATTN_BACKEND_FA1;
            else if (strcmp(val, "fa2") == 0) o->backend = FLASHATTN_BACKEND_FA2;
            else if (strcmp(val, "fa3") == 0) o->backend = FLASHATTN_BACKEND_FA3;
            else goto bad;
        } else {
            fprintf(stderr, "flashattn-demo: unknown option %s\n", a);
            return -1;
        }
        continue;
    bad:
        fprintf(stderr, "flashattn-demo: bad value '%s' for %s\n", val, a);
        return -1;
    }
    return 0;
}

/* ---- Element conversion (round to nearest even) ------------------------------------------------ */

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_half(float f) {
    /* Through double arithmetic: scale into the half grid and round with nearbyint. */
    double a = fabs((double)f), r;
    uint16_t sign = signbit(f) ? 0x8000u : 0u;
    int e;
    if (isnan(f)) return 0x7e00u;
    if (a >= 65520.0) return (uint16_t)(sign | 0x7c00u);
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)nearbyint(ldexp(a, 24)));
    (void)frexp(a, &e); /* a in [2^(e-1), 2^e) */
    r = nearbyint(ldexp(a, 11 - e));  /* 1024..2048 */
    if (r >= 2048.0) {
        r /= 2.0;
        ++e;
    }
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((int)r - 1024));
}

static float from_half(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float s = (h & 0x8000u) ? -1.0f : 1.0f;
    if (e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * (float)ldexp((double)m, -24);
    return s * (float)ldexp((double)(1024 + m), e - 25);
}

static uint16_t to_bf16(float f) {
    const uint32_t u = float_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t b) { return bits_to_float((uint32_t)b << 16); }

static size_t dtype_size(flashattn_dtype_t dt) { return dt == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

static void store(flashattn_dtype_t dt, void *base, size_t i, float x) {
    if (dt == FLASHATTN_DTYPE_FP32) {
        ((float *)base)[i] = x;
    } else {
        ((uint16_t *)base)[i] = dt == FLASHATTN_DTYPE_FP16 ? to_half(x) : to_bf16(x);
    }
}

static float load(flashattn_dtype_t dt, const void *base, size_t i) {
    if (dt == FLASHATTN_DTYPE_FP32) return ((const float *)base)[i];
    return dt == FLASHATTN_DTYPE_FP16 ? from_half(((const uint16_t *)base)[i])
                                      : from_bf16(((const uint16_t *)base)[i]);
}

static const char *dtype_name(flashattn_dtype_t dt) {
    return dt == FLASHATTN_DTYPE_FP16 ? "fp16" : dt == FLASHATTN_DTYPE_BF16 ? "bf16" : "fp32";
}

static const char *backend_name(flashattn_backend_t b) {
    switch (b) {
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_FA1: return "fa1";
    case FLASHATTN_BACKEND_FA2: return "fa2";
    case FLASHATTN_BACKEND_FA3: return "fa3";
    default: return "auto";
    }
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x853c49e6748fea9bull;
static float random_uniform(void) { /* xorshift64*, U(-1, 1) */
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return (float)((double)((x * 0x2545f4914f6cdd1dull) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

int main(int argc, char **argv) {
    options opt;
    flashattn_plan_t *plan = NULL;
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    const char *reason = "";
    void *hq = NULL, *hk = NULL, *hv = NULL, *ho = NULL; /* host tensors */
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL; /* tensors the library sees */
    void *workspace = NULL;
    size_t workspace_bytes = 0, elems, bytes, es;
    int on_gpu = 0, iters, it, result = 1;
    double t0 = 0.0, elapsed, flops, max_err = 0.0, bound;
    double *scores = NULL;
    int64_t b, h, i, j, c;

    if (parse_args(argc, argv, &opt) != 0) {
        usage(stderr);
        return 2;
    }
    es = dtype_size(opt.dtype);
    elems = (size_t)(opt.batch * opt.seqlen * opt.heads * opt.head_dim);
    bytes = elems * es;

    CHECK_STATUS(flashattn_plan_create(&plan));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, opt.batch));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, opt.seqlen));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, opt.seqlen));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, opt.heads));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, opt.head_dim));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, opt.dtype));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, opt.causal));
    CHECK_STATUS(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, opt.backend));
    CHECK_STATUS(flashattn_plan_finalize(plan));
    CHECK_STATUS(flashattn_plan_get_backend(plan, &backend, &reason));
    CHECK_STATUS(flashattn_plan_get_workspace_size(plan, &workspace_bytes));
    on_gpu = backend != FLASHATTN_BACKEND_CPU;

    printf("backend:    %s (%s)\n", backend_name(backend), reason ? reason : "");
    printf("shape:      batch %lld, seqlen %lld, heads %lld, head_dim %lld, %s%s\n",
           (long long)opt.batch, (long long)opt.seqlen, (long long)opt.heads,
           (long long)opt.head_dim, dtype_name(opt.dtype), opt.causal ? ", causal" : "");

    hq = malloc(bytes);
    hk = malloc(bytes);
    hv = malloc(bytes);
    ho = malloc(bytes);
    scores = (double *)malloc((size_t)opt.seqlen * sizeof(double));
    if (!hq || !hk || !hv || !ho || !scores) {
        fprintf(stderr, "flashattn-demo: out of host memory\n");
        goto cleanup;
    }
    for (i = 0; i < (int64_t)elems; ++i) {
        store(opt.dtype, hq, (size_t)i, random_uniform());
        store(opt.dtype, hk, (size_t)i, random_uniform());
        store(opt.dtype, hv, (size_t)i, random_uniform());
    }

    if (on_gpu) {
#ifdef FLASHATTN_DEMO_WITH_CUDA
        if (cudaMalloc(&dq, bytes) != cudaSuccess || cudaMalloc(&dk, bytes) != cudaSuccess ||
            cudaMalloc(&dv, bytes) != cudaSuccess || cudaMalloc(&dout, bytes) != cudaSuccess ||
            (workspace_bytes && cudaMalloc(&workspace, workspace_bytes) != cudaSuccess)) {
            fprintf(stderr, "flashattn-demo: cudaMalloc failed\n");
            goto cleanup;
        }
        if (cudaMemcpy(dq, hq, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(dk, hk, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(dv, hv, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            fprintf(stderr, "flashattn-demo: cudaMemcpy failed\n");
            goto cleanup;
        }
#else
        fprintf(stderr, "flashattn-demo: backend %s needs device memory, but the demo was built without CUDA\n",
                backend_name(backend));
        goto cleanup;
#endif
    } else {
        dq = hq;
        dk = hk;
        dv = hv;
        dout = ho;
        if (workspace_bytes && posix_memalign(&workspace, 256, workspace_bytes) != 0) {
            workspace = NULL;
            fprintf(stderr, "flashattn-demo: could not allocate %zu bytes of workspace\n", workspace_bytes);
            goto cleanup;
        }
    }

    /* One warm-up call, then the timed ones. */
    iters = opt.iters ? opt.iters : (on_gpu ? 20 : 3);
    for (it = -1; it < iters; ++it) {
        if (it == 0) {
#ifdef FLASHATTN_DEMO_WITH_CUDA
            if (on_gpu && cudaDeviceSynchronize() != cudaSuccess) {
                fprintf(stderr, "flashattn-demo: CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
                goto cleanup;
            }
#endif
            t0 = now_seconds();
        }
        CHECK_STATUS(flashattn_plan_execute(plan, dq, dk, dv, dout, NULL, workspace, workspace_bytes, NULL));
    }
#ifdef FLASHATTN_DEMO_WITH_CUDA
    if (on_gpu) {
        cudaError_t err = cudaDeviceSynchronize();
        if (err == cudaSuccess) err = cudaGetLastError();
        if (err != cudaSuccess) {
            fprintf(stderr, "flashattn-demo: CUDA error: %s\n", cudaGetErrorString(err));
            goto cleanup;
        }
    }
#endif
    elapsed = (now_seconds() - t0) / iters;
    flops = 4.0 * (double)opt.batch * (double)opt.heads * (double)opt.seqlen * (double)opt.seqlen *
            (double)opt.head_dim;
    if (opt.causal) flops /= 2.0;
    printf("time:       %.3f ms per call (mean of %d)\n", elapsed * 1e3, iters);
    printf("throughput: %.1f GFLOP/s\n", flops / elapsed * 1e-9);

#ifdef FLASHATTN_DEMO_WITH_CUDA
    if (on_gpu && cudaMemcpy(ho, dout, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "flashattn-demo: cudaMemcpy failed\n");
        goto cleanup;
    }
#endif

    /* Double-precision reference on the first rows of every (batch, head). */
    {
        const int64_t rows = opt.seqlen < REFERENCE_ROWS ? opt.seqlen : REFERENCE_ROWS;
        const int64_t d = opt.head_dim, row = opt.heads * d, bstride = opt.seqlen * row;
        const double scale = 1.0 / sqrt((double)d);
        for (b = 0; b < opt.batch; ++b) {
            for (h = 0; h < opt.heads; ++h) {
                for (i = 0; i < rows; ++i) {
                    const int64_t last = opt.causal ? i : opt.seqlen - 1; /* seqlen_q == seqlen_k */
                    const size_t qoff = (size_t)(b * bstride + i * row + h * d);
                    double m = -INFINITY, l = 0.0;
                    for (j = 0; j <= last; ++j) {
                        const size_t koff = (size_t)(b * bstride + j * row + h * d);
                        double s = 0.0;
                        for (c = 0; c < d; ++c)
                            s += (double)load(opt.dtype, hq, qoff + (size_t)c) * (double)load(opt.dtype, hk, koff + (size_t)c);
                        scores[j] = s * scale;
                        if (scores[j] > m) m = scores[j];
                    }
                    for (j = 0; j <= last; ++j) {
                        scores[j] = exp(scores[j] - m);
                        l += scores[j];
                    }
                    for (c = 0; c < d; ++c) {
                        double acc = 0.0, err;
                        for (j = 0; j <= last; ++j)
                            acc += scores[j] * (double)load(opt.dtype, hv, (size_t)(b * bstride + j * row + h * d + c));
                        err = fabs((double)load(opt.dtype, ho, qoff + (size_t)c) - acc / l);
                        if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
                    }
                }
            }
        }
        /* A few units in the last place of outputs of magnitude <= 1. */
        bound = opt.dtype == FLASHATTN_DTYPE_FP32 ? 1e-4 : opt.dtype == FLASHATTN_DTYPE_FP16 ? 4e-3 : 3e-2;
        printf("max |err|:  %.3e vs a double reference on the first %lld rows of each head (bound %.0e): %s\n",
               max_err, (long long)rows, bound, max_err <= bound ? "ok" : "TOO LARGE");
        if (max_err <= bound) result = 0;
    }

cleanup:
    flashattn_plan_destroy(plan);
#ifdef FLASHATTN_DEMO_WITH_CUDA
    if (on_gpu) {
        cudaFree(dq);
        cudaFree(dk);
        cudaFree(dv);
        cudaFree(dout);
        cudaFree(workspace);
        workspace = NULL;
    }
#endif
    if (!on_gpu) free(workspace);
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(scores);
    return result;
}
