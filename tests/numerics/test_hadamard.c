/* flashattn_rotate_hadamard() (issue 17 (c)) against this file's own definition of the matrix:
 * M[i][j] = s_i · (-1)^popcount(i & j) / sqrt(dim), s_i from splitmix64(seed + i), written out
 * here again from the header's description. Built once per place: test_hadamard_cpu (host memory,
 * device -1; label cpu) and test_hadamard_fa2 (device 0 memory and the CUDA kernel; label gpu,
 * skipped without a GPU).
 *
 * Checks: every dim 8..256 and dtype against y = x·M in double (fp32: |y - ref| <= 1e-6·|x|_2, the
 * transform's log2(dim) fp32 roundings; fp16 / bf16: half an ulp of the output, 2^-11 / 2^-8
 * relative, plus that); strided rows with the gaps kept poisoned; in place equal bit for bit to out
 * of place; orthogonality (rotating the identity gives rows with M·Mᵀ = I within 1e-6);
 * Q·Kᵀ preserved under one seed (relative 1e-5) and not under two; bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_expect.h"
#include "test_support.h"


static int on_device(void) { return TEST_BACKEND != FLASHATTN_BACKEND_CPU; }
static int32_t device_arg(void) { return on_device() ? 0 : -1; }

static uint64_t mix(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int popcount64(uint64_t x) {
    int n = 0;
    while (x) {
        x &= x - 1;
        ++n;
    }
    return n;
}

static double matrix(uint64_t seed, int64_t dim, int64_t i, int64_t j) {
    const double s = (mix(seed + (uint64_t)i) >> 63) ? -1.0 : 1.0;
    return s * ((popcount64((uint64_t)(i & j)) & 1) ? -1.0 : 1.0) / sqrt((double)dim);
}

/* Rotate `rows` rows (strides in elements) through the library, in place when dst == NULL. Host
 * arrays in, host arrays out; on the device through test_mem. Returns the status. */
static flashattn_status_t rotate(flashattn_dtype_t dtype, int64_t rows, int64_t dim, void *src, int64_t ss, void *dst,
                                 int64_t ds, size_t src_bytes, size_t dst_bytes, uint64_t seed) {
    test_mem ms, md;
    flashattn_status_t st;
    const int dev = on_device();
    if (test_mem_alloc(&ms, src_bytes, dev)) return FLASHATTN_ERROR_ALLOCATION;
    memcpy(ms.host, src, src_bytes);
    test_mem_upload(&ms);
    if (dst == NULL) {
        st = flashattn_rotate_hadamard(dtype, rows, dim, test_mem_ptr(&ms), ss, test_mem_ptr(&ms), ss, seed, device_arg(), NULL);
        test_mem_download(&ms);
        memcpy(src, ms.host, src_bytes);
        test_mem_free(&ms);
        return st;
    }
    if (test_mem_alloc(&md, dst_bytes, dev)) return FLASHATTN_ERROR_ALLOCATION;
    memcpy(md.host, dst, dst_bytes);
    test_mem_upload(&md);
    st = flashattn_rotate_hadamard(dtype, rows, dim, test_mem_ptr(&ms), ss, test_mem_ptr(&md), ds, seed, device_arg(), NULL);
    test_mem_download(&md);
    EXPECT(test_device_error() == NULL, "device error: %s", test_device_error());
    memcpy(dst, md.host, dst_bytes);
    test_mem_free(&ms);
    test_mem_free(&md);
    return st;
}

static void check_against_reference(flashattn_dtype_t dtype, int64_t dim, uint64_t seed) {
    const int64_t rows = 37, ss = dim + 8, ds = dim + 24;
    const size_t es = test_dtype_size(dtype);
    unsigned char *src = malloc((size_t)(rows * ss) * es), *dst = malloc((size_t)(rows * ds) * es);
    unsigned char *inplace = malloc((size_t)(rows * ss) * es);
    unsigned char *inside = calloc((size_t)(rows * ds), 1);
    test_rng rng;
    int64_t r, i, j;
    const double u = dtype == FLASHATTN_DTYPE_FP32 ? 0.0 : dtype == FLASHATTN_DTYPE_FP16 ? 0x1p-11 : 0x1p-8;
    int bad = 0;
    test_rng_seed(&rng, seed * 31 + (uint64_t)dim);
    for (i = 0; i < rows * ss; ++i) test_store(dtype, src + i * es, test_rng_uniform(&rng, -2, 2));
    for (r = 0; r < rows; ++r) /* a few outliers */
        test_store(dtype, src + (r * ss + (r * 7) % dim) * es, 40.0);
    test_poison(dtype, dst, (size_t)(rows * ds) * es);
    memcpy(inplace, src, (size_t)(rows * ss) * es);
    EXPECT(rotate(dtype, rows, dim, src, ss, dst, ds, (size_t)(rows * ss) * es, (size_t)(rows * ds) * es, seed) ==
               FLASHATTN_SUCCESS,
           "dim %lld %s: %s", (long long)dim, test_dtype_name(dtype), flashattn_last_error());
    EXPECT(rotate(dtype, rows, dim, inplace, ss, NULL, ss, (size_t)(rows * ss) * es, 0, seed) == FLASHATTN_SUCCESS,
           "in place: %s", flashattn_last_error());
    for (r = 0; r < rows && bad < 5; ++r) {
        double norm = 0;
        for (i = 0; i < dim; ++i) norm += pow(test_load(dtype, src + (r * ss + i) * es), 2);
        norm = sqrt(norm);
        for (j = 0; j < dim; ++j) {
            double want = 0, got = test_load(dtype, dst + (r * ds + j) * es);
            for (i = 0; i < dim; ++i) want += test_load(dtype, src + (r * ss + i) * es) * matrix(seed, dim, i, j);
            inside[r * ds + j] = 1;
            if (!(fabs(got - want) <= u * fabs(want) + 1e-6 * norm)) {
                EXPECT(0, "dim %lld %s row %lld col %lld: %.9g, reference %.9g", (long long)dim, test_dtype_name(dtype),
                       (long long)r, (long long)j, got, want);
                ++bad;
            }
            EXPECT(memcmp(inplace + (r * ss + j) * es, dst + (r * ds + j) * es, es) == 0,
                   "dim %lld %s: in place differs at row %lld col %lld", (long long)dim, test_dtype_name(dtype),
                   (long long)r, (long long)j);
        }
        /* The source's gaps (untouched by the in-place call too). */
        for (j = dim; j < ss && r < rows - 1; ++j)
            EXPECT(memcmp(inplace + (r * ss + j) * es, src + (r * ss + j) * es, es) == 0, "in place wrote a gap");
    }
    EXPECT(first_written_gap(dtype, dst, inside, (size_t)(rows * ds)) < 0, "dim %lld %s: a gap of dst was written",
           (long long)dim, test_dtype_name(dtype));
    free(src);
    free(dst);
    free(inplace);
    free(inside);
}

/* Rotating the identity's rows gives M's rows: M·Mᵀ = I. */
static void check_orthogonal(int64_t dim) {
    float *m = calloc((size_t)(dim * dim), sizeof(float));
    float *out = calloc((size_t)(dim * dim), sizeof(float));
    int64_t i, j, c;
    double worst = 0;
    for (i = 0; i < dim; ++i) m[i * dim + i] = 1.0f;
    EXPECT(rotate(FLASHATTN_DTYPE_FP32, dim, dim, m, dim, out, dim, (size_t)(dim * dim) * 4, (size_t)(dim * dim) * 4, 77) ==
               FLASHATTN_SUCCESS,
           "identity: %s", flashattn_last_error());
    for (i = 0; i < dim; ++i)
        for (j = 0; j < dim; ++j) {
            double dot = 0;
            for (c = 0; c < dim; ++c) dot += (double)out[i * dim + c] * out[j * dim + c];
            if (fabs(dot - (i == j)) > worst) worst = fabs(dot - (i == j));
        }
    EXPECT(worst <= 1e-6, "dim %lld: |M·Mᵀ - I| = %g", (long long)dim, worst);
    free(m);
    free(out);
}

/* Q·Kᵀ is unchanged when Q and K share the seed, and changes when they do not. */
static void check_scores_preserved(int64_t dim) {
    const int64_t n = 19, m = 23;
    float *q = malloc((size_t)(n * dim) * 4), *k = malloc((size_t)(m * dim) * 4);
    float *qr = malloc((size_t)(n * dim) * 4), *kr = malloc((size_t)(m * dim) * 4), *kx = malloc((size_t)(m * dim) * 4);
    test_rng rng;
    int64_t i, j, c;
    double worst = 0, changed = 0, scale = 0;
    test_rng_seed(&rng, (uint64_t)dim);
    for (i = 0; i < n * dim; ++i) q[i] = (float)test_rng_uniform(&rng, -1, 1);
    for (i = 0; i < m * dim; ++i) k[i] = (float)test_rng_uniform(&rng, -1, 1);
    rotate(FLASHATTN_DTYPE_FP32, n, dim, q, dim, qr, dim, (size_t)(n * dim) * 4, (size_t)(n * dim) * 4, 1234);
    rotate(FLASHATTN_DTYPE_FP32, m, dim, k, dim, kr, dim, (size_t)(m * dim) * 4, (size_t)(m * dim) * 4, 1234);
    rotate(FLASHATTN_DTYPE_FP32, m, dim, k, dim, kx, dim, (size_t)(m * dim) * 4, (size_t)(m * dim) * 4, 4321);
    for (i = 0; i < n; ++i)
        for (j = 0; j < m; ++j) {
            double s = 0, sr = 0, sx = 0;
            for (c = 0; c < dim; ++c) {
                s += (double)q[i * dim + c] * k[j * dim + c];
                sr += (double)qr[i * dim + c] * kr[j * dim + c];
                sx += (double)qr[i * dim + c] * kx[j * dim + c];
            }
            if (fabs(s) > scale) scale = fabs(s);
            if (fabs(sr - s) > worst) worst = fabs(sr - s);
            if (fabs(sx - s) > changed) changed = fabs(sx - s);
        }
    EXPECT(worst <= 1e-5 * scale, "dim %lld: Q·Kᵀ moved by %g (max |score| %g)", (long long)dim, worst, scale);
    EXPECT(changed > 1e-2 * scale, "dim %lld: different seeds left Q·Kᵀ unchanged (%g)", (long long)dim, changed);
    free(q);
    free(k);
    free(qr);
    free(kr);
    free(kx);
}

static void expect_refused(flashattn_status_t st, const char *needle, const char *what) {
    expect_message(st, FLASHATTN_ERROR_INVALID_ARGUMENT, needle, what);
}

static void check_bad_arguments(void) {
    float buf[1024], other[1024];
    const int32_t dev = -1; /* host: the argument rules are the same everywhere */
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 1, 96, buf, 96, other, 96, 1, dev, NULL), "dim", "dim 96");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 1, 4, buf, 4, other, 4, 1, dev, NULL), "dim", "dim 4");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 1, 512, buf, 512, other, 512, 1, dev, NULL), "dim", "dim 512");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP8_E4M3, 1, 64, buf, 64, other, 64, 1, dev, NULL), "dtype",
                   "fp8 dtype");
    expect_refused(flashattn_rotate_hadamard((flashattn_dtype_t)0, 1, 64, buf, 64, other, 64, 1, dev, NULL), "dtype", "dtype 0");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, -1, 64, buf, 64, other, 64, 1, dev, NULL), "rows", "rows -1");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 63, other, 64, 1, dev, NULL), "src_row_stride",
                   "short src stride");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, other, 32, 1, dev, NULL), "dst_row_stride",
                   "short dst stride");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, NULL, 64, other, 64, 1, dev, NULL), "src", "NULL src");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, NULL, 64, 1, dev, NULL), "dst", "NULL dst");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, buf + 8, 64, 1, dev, NULL), "overlaps",
                   "partly overlapping");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, buf, 128, 1, dev, NULL), "overlaps",
                   "same pointer, other stride");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP16, 2, 64, (char *)buf + 1, 64, other, 64, 1, dev, NULL),
                   "aligned", "misaligned src");
    expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, other, 64, 1, -2, NULL), "device",
                   "device -2");
    EXPECT(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 0, 64, NULL, 64, NULL, 64, 1, dev, NULL) == FLASHATTN_SUCCESS,
           "0 rows with NULL pointers: %s", flashattn_last_error());
    if (on_device()) { /* host memory given to the device path */
        expect_refused(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, 2, 64, buf, 64, other, 64, 1, 0, NULL), "host memory",
                       "host pointers on device 0");
    }
}

int main(void) {
    static const flashattn_dtype_t dtypes[] = {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16};
    int64_t dim;
    size_t t;
    if (on_device()) test_skip_without_gpu();
    check_bad_arguments();
    for (dim = 8; dim <= 256; dim *= 2) {
        for (t = 0; t < 3; ++t) check_against_reference(dtypes[t], dim, 0xabcdefull + (uint64_t)dim);
        check_orthogonal(dim);
        check_scores_preserved(dim);
    }
    printf("test_hadamard (%s): %d failures\n", on_device() ? "device" : "host", g_failures);
    return g_failures ? 1 : 0;
}
