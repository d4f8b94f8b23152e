/* Tensors past 2^31 and 2^32 elements on every GPU generation (fa1, fa2, fa3), checked row by row
 * against a double-precision reference, not only for running:
 * - "batch": Q, K, V, O of [8193, 128, 16, 128] fp16, 2^31 + 2^18 elements each (4.3 GB): offsets
 *   past 2^31 come from the batch index; every row of the last sequence's first and last head and
 *   64 random rows are checked;
 * - "long": one sequence of 2^25 + 2^20 rows, 1 head of 128, 4.4e9 elements each (8.9 GB), causal
 *   with a 256-key sliding window so the work stays small while every row reads keys at its own
 *   far offset: rows around 2^30, 2^31 and 2^32 elements, the last rows and random ones;
 * - "varlen": the same buffers as three packed sequences through execute_varlen.
 * Inputs come from a hash of the element's index (no period, so a wrapped offset reads other
 * values), written by a kernel here and recomputed on the host for the reference; values are
 * multiples of 1/512 in [-1, 1), exact in fp16. O and LSE are poisoned before every run.
 * About 53 GB of device memory; skipped (77) without a GPU, or with less free memory than that. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include <cmocka.h>
}

#include "flashattn/flashattn.h"
#include "test_support.h"

#define CUDA_OK(call)                                                                          \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));              \
    } while (0)

namespace {

constexpr int64_t kDim = 128;
constexpr int64_t kWindow = 255; /* keys each "long" row sees besides its own: [i - 255, i] */

__host__ __device__ inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element `index` of the tensor `seed`: a multiple of 1/512 in [-1, 1). */
__host__ __device__ inline float value_at(uint64_t seed, uint64_t index) {
    const int k = static_cast<int>(mix64(seed * 0x100000001b3ull ^ index) >> 54); /* 0 .. 1023 */
    return static_cast<float>(k - 512) * (1.0f / 512.0f);
}

__global__ void fill_kernel(__half *dst, uint64_t n, uint64_t seed) {
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
        dst[i] = __float2half_rn(value_at(seed, i));
}

enum : uint64_t { kSeedQ = 11, kSeedK = 12, kSeedV = 13 };

/* One problem: contiguous [batch][seqlen][heads][dim] (or packed rows when varlen). */
struct Shape {
    const char *name;
    int64_t batch, seqlen, heads;
    int causal, window, varlen;
    int64_t rows() const { return batch * seqlen; } /* rows of Q (= of K) in memory */
    uint64_t elems() const { return static_cast<uint64_t>(rows()) * heads * kDim; }
};

/* One sampled query row: packed row r, head h, and its sequence's first row and length. */
struct Row {
    int64_t row, head, seq_start, seq_len;
    double o[kDim];
    double lse;
};

struct Buffers {
    __half *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    float *lse = nullptr;
    uint64_t elems = 0;
    int64_t lse_count = 0;
};

Buffers g_batch, g_long;

void fill(__half *dst, uint64_t n, uint64_t seed) {
    fill_kernel<<<4096, 256>>>(dst, n, seed);
    CUDA_OK(cudaGetLastError());
}

void alloc(Buffers *b, const Shape &s) {
    b->elems = s.elems();
    b->lse_count = s.rows() * s.heads;
    CUDA_OK(cudaMalloc(&b->q, b->elems * 2));
    CUDA_OK(cudaMalloc(&b->k, b->elems * 2));
    CUDA_OK(cudaMalloc(&b->v, b->elems * 2));
    CUDA_OK(cudaMalloc(&b->o, b->elems * 2));
    CUDA_OK(cudaMalloc(&b->lse, static_cast<size_t>(b->lse_count) * 4));
    fill(b->q, b->elems, kSeedQ);
    fill(b->k, b->elems, kSeedK);
    fill(b->v, b->elems, kSeedV);
    CUDA_OK(cudaDeviceSynchronize());
}

void release(Buffers *b) {
    cudaFree(b->q);
    cudaFree(b->k);
    cudaFree(b->v);
    cudaFree(b->o);
    cudaFree(b->lse);
}

const Shape kBatch = {"batch", 8193, 128, 16, 0, -1, 0};
const Shape kLong = {"long", 1, (INT64_C(1) << 25) + (INT64_C(1) << 20), 1, 1, kWindow, 0};
/* Three sequences packed into kLong's buffers (lengths: 3000001, 6000002, the rest). */
const int64_t kVarlenStarts[4] = {0, 3000001, 9000003, kLong.rows()};

/* The reference of one row, from the hash: the documented causal + window rule (seqlen_q =
 * seqlen_k, so the diagonal is the row itself). */
void reference_row(const Shape &s, Row *r) {
    const int64_t i = r->row - r->seq_start; /* row within its sequence */
    const int64_t lo = s.window >= 0 ? (i - s.window > 0 ? i - s.window : 0) : 0;
    const int64_t hi = s.causal ? i : r->seq_len - 1;
    const double scale = 1.0 / sqrt(static_cast<double>(kDim));
    const int64_t n = hi - lo + 1;
    double *score = static_cast<double *>(malloc(sizeof(double) * static_cast<size_t>(n)));
    const uint64_t qbase = (static_cast<uint64_t>(r->row) * s.heads + r->head) * kDim;
    double m = -INFINITY;
    for (int64_t j = lo; j <= hi; ++j) {
        const uint64_t kbase = (static_cast<uint64_t>(r->seq_start + j) * s.heads + r->head) * kDim;
        double dot = 0.0;
        for (int64_t c = 0; c < kDim; ++c) dot += static_cast<double>(value_at(kSeedQ, qbase + c)) * value_at(kSeedK, kbase + c);
        score[j - lo] = dot * scale;
        if (score[j - lo] > m) m = score[j - lo];
    }
    double sum = 0.0;
    for (int64_t c = 0; c < kDim; ++c) r->o[c] = 0.0;
    for (int64_t j = lo; j <= hi; ++j) {
        const double p = exp(score[j - lo] - m);
        sum += p;
        const uint64_t vbase = (static_cast<uint64_t>(r->seq_start + j) * s.heads + r->head) * kDim;
        for (int64_t c = 0; c < kDim; ++c) r->o[c] += p * value_at(kSeedV, vbase + c);
    }
    for (int64_t c = 0; c < kDim; ++c) r->o[c] /= sum;
    r->lse = m + log(sum);
    free(score);
}

/* The rows to check for a shape: chosen, then given their sequence. */
int64_t sequence_of(const Shape &s, int64_t row, int64_t *start, int64_t *len) {
    if (s.varlen) {
        for (int b = 0; b < 3; ++b)
            if (row < kVarlenStarts[b + 1]) {
                *start = kVarlenStarts[b];
                *len = kVarlenStarts[b + 1] - kVarlenStarts[b];
                return b;
            }
    }
    const int64_t b = row / s.seqlen;
    *start = b * s.seqlen;
    *len = s.seqlen;
    return b;
}

int sample_rows(const Shape &s, Row *rows, int max_rows) {
    int n = 0;
    auto add = [&](int64_t row, int64_t head) {
        if (n >= max_rows || row < 0 || row >= s.rows()) return;
        rows[n].row = row;
        rows[n].head = head;
        sequence_of(s, row, &rows[n].seq_start, &rows[n].seq_len);
        ++n;
    };
    test_rng rng;
    test_rng_seed(&rng, 2026);
    if (s.heads > 1) {
        /* Every row of the last sequence, first and last head: offsets up to the very end. */
        for (int64_t i = 0; i < s.seqlen; ++i) {
            add((s.batch - 1) * s.seqlen + i, 0);
            add((s.batch - 1) * s.seqlen + i, s.heads - 1);
        }
        add((INT64_C(1) << 31) / (s.heads * kDim), s.heads - 1); /* the row holding element 2^31 */
    } else {
        /* Rows around element offsets 2^30, 2^31, 2^32 (in elements and so in bytes 2^31..2^33),
         * the first rows of each packed sequence, and the last rows. */
        for (int e = 30; e <= 32; ++e)
            for (int64_t d = -2; d <= 2; ++d) add((INT64_C(1) << e) / kDim + d, 0);
        for (int b = 0; s.varlen && b < 3; ++b)
            for (int64_t d = 0; d < 3; ++d) add(kVarlenStarts[b] + d, 0);
        for (int64_t d = 1; d <= 32; ++d) add(s.rows() - d, 0);
    }
    for (int i = 0; i < 64; ++i) add(test_rng_range(&rng, 0, s.rows() - 1), test_rng_range(&rng, 0, s.heads - 1));
    return n;
}

flashattn_plan_t *make_plan(const Shape &s, flashattn_backend_t backend) {
    flashattn_plan_t *plan = nullptr;
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    int64_t longest = s.seqlen;
    if (s.varlen) {
        longest = 0;
        for (int b = 0; b < 3; ++b)
            if (kVarlenStarts[b + 1] - kVarlenStarts[b] > longest) longest = kVarlenStarts[b + 1] - kVarlenStarts[b];
    }
    const struct {
        flashattn_i64_param_t key;
        int64_t value;
    } sets[] = {{FLASHATTN_I64_BATCH, s.varlen ? 3 : s.batch},
                {FLASHATTN_I64_SEQLEN_Q, longest},
                {FLASHATTN_I64_SEQLEN_K, longest},
                {FLASHATTN_I64_HEADS_Q, s.heads},
                {FLASHATTN_I64_HEAD_DIM, kDim},
                {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP16},
                {FLASHATTN_I64_CAUSAL, s.causal},
                {FLASHATTN_I64_WINDOW_LEFT, s.window},
                {FLASHATTN_I64_BACKEND, backend},
                {FLASHATTN_I64_VARLEN, s.varlen},
                {FLASHATTN_I64_TOTAL_Q, s.rows()},
                {FLASHATTN_I64_TOTAL_K, s.rows()}};
    for (const auto &kv : sets) {
        if (!s.varlen && (kv.key == FLASHATTN_I64_TOTAL_Q || kv.key == FLASHATTN_I64_TOTAL_K)) continue;
        assert_int_equal(flashattn_plan_set_i64(plan, kv.key, kv.value), FLASHATTN_SUCCESS);
    }
    return plan;
}

/* Runs `s` on `backend` and compares the sampled rows' O and LSE with their references. */
void check_shape(const Shape &s, const Buffers &buf, flashattn_backend_t backend, const char *gen, Row *rows, int n) {
    flashattn_plan_t *plan = make_plan(s, backend);
    const flashattn_status_t fs = flashattn_plan_finalize(plan);
    if (fs != FLASHATTN_SUCCESS) fail_msg("%s %s: finalize: %s", gen, s.name, flashattn_last_error());
    size_t ws = 0;
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    void *workspace = nullptr;
    if (ws) CUDA_OK(cudaMalloc(&workspace, ws));
    CUDA_OK(cudaMemset(buf.o, 0xff, buf.elems * 2)); /* NaN poison */
    CUDA_OK(cudaMemset(buf.lse, 0xff, static_cast<size_t>(buf.lse_count) * 4));
    int32_t *cu = nullptr;
    const double t0 = test_now_seconds();
    flashattn_status_t st;
    if (s.varlen) {
        const int32_t host_cu[4] = {static_cast<int32_t>(kVarlenStarts[0]), static_cast<int32_t>(kVarlenStarts[1]),
                                    static_cast<int32_t>(kVarlenStarts[2]), static_cast<int32_t>(kVarlenStarts[3])};
        CUDA_OK(cudaMalloc(&cu, sizeof host_cu));
        CUDA_OK(cudaMemcpy(cu, host_cu, sizeof host_cu, cudaMemcpyHostToDevice));
        st = flashattn_plan_execute_varlen(plan, buf.q, buf.k, buf.v, buf.o, buf.lse, cu, cu, workspace, ws, nullptr);
    } else {
        st = flashattn_plan_execute(plan, buf.q, buf.k, buf.v, buf.o, buf.lse, workspace, ws, nullptr);
    }
    if (st != FLASHATTN_SUCCESS) fail_msg("%s %s: execute: %s", gen, s.name, flashattn_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    const double seconds = test_now_seconds() - t0;
    double max_err = 0.0, max_lse_err = 0.0;
    for (int r = 0; r < n; ++r) {
        __half o[kDim];
        float lse = 0.0f;
        const uint64_t at = (static_cast<uint64_t>(rows[r].row) * s.heads + rows[r].head) * kDim;
        CUDA_OK(cudaMemcpy(o, buf.o + at, sizeof o, cudaMemcpyDeviceToHost));
        /* LSE: [batch][heads][seqlen] for fixed length, [heads][total] for varlen. */
        const int64_t b = rows[r].row / s.seqlen, i = rows[r].row % s.seqlen;
        const uint64_t lse_at = s.varlen ? static_cast<uint64_t>(rows[r].head * s.rows() + rows[r].row)
                                         : static_cast<uint64_t>((b * s.heads + rows[r].head) * s.seqlen + i);
        CUDA_OK(cudaMemcpy(&lse, buf.lse + lse_at, 4, cudaMemcpyDeviceToHost));
        for (int64_t c = 0; c < kDim; ++c) {
            const double err = fabs(static_cast<double>(__half2float(o[c])) - rows[r].o[c]);
            if (!(err <= 2e-3))
                fail_msg("%s %s: row %lld head %lld col %lld: O = %.6f, reference %.6f", gen, s.name,
                         static_cast<long long>(rows[r].row), static_cast<long long>(rows[r].head),
                         static_cast<long long>(c), static_cast<double>(__half2float(o[c])), rows[r].o[c]);
            if (err > max_err) max_err = err;
        }
        const double lse_err = fabs(lse - rows[r].lse) / (1.0 + fabs(rows[r].lse));
        if (!(lse_err <= 1e-4))
            fail_msg("%s %s: row %lld head %lld: LSE %.7f, reference %.7f", gen, s.name,
                     static_cast<long long>(rows[r].row), static_cast<long long>(rows[r].head), lse, rows[r].lse);
        if (lse_err > max_lse_err) max_lse_err = lse_err;
    }
    print_message("%s %s (%.3g elements a tensor): %d rows checked, max |O - ref| %.2e, LSE relative %.2e, "
                  "execute %.1f ms\n",
                  gen, s.name, static_cast<double>(s.elems()), n, max_err, max_lse_err, seconds * 1e3);
    if (cu) cudaFree(cu);
    if (workspace) cudaFree(workspace);
    flashattn_plan_destroy(plan);
}

const Shape kVarlen = {"varlen", 1, kLong.seqlen, 1, 1, kWindow, 1};
Row *g_rows[3];
int g_counts[3];
const Shape *const kShapes[3] = {&kBatch, &kLong, &kVarlen};

int setup(void **state) {
    (void)state;
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return -1;
    const double need = (kBatch.elems() + kLong.elems()) * 8.0 + 1e9;
    if (free_bytes < need) {
        printf("%.1f GB of device memory free, %.1f GB needed: skipping\n", free_bytes / 1e9, need / 1e9);
        fflush(stdout);
        exit(77);
    }
    alloc(&g_batch, kBatch);
    alloc(&g_long, kLong);
    for (int i = 0; i < 3; ++i) {
        g_rows[i] = static_cast<Row *>(calloc(400, sizeof(Row)));
        g_counts[i] = sample_rows(*kShapes[i], g_rows[i], 400);
        for (int r = 0; r < g_counts[i]; ++r) reference_row(*kShapes[i], &g_rows[i][r]);
    }
    return 0;
}

int teardown(void **state) {
    (void)state;
    release(&g_batch);
    release(&g_long);
    for (int i = 0; i < 3; ++i) free(g_rows[i]);
    return 0;
}

void check_backend(flashattn_backend_t backend, const char *gen) {
    flashattn_plan_t *probe = make_plan(kBatch, backend);
    if (flashattn_plan_finalize(probe) == FLASHATTN_ERROR_NOT_SUPPORTED && strstr(flashattn_last_error(), "built without")) {
        print_message("%s: not in this build, skipped\n", gen);
        flashattn_plan_destroy(probe);
        skip();
    }
    flashattn_plan_destroy(probe);
    check_shape(kBatch, g_batch, backend, gen, g_rows[0], g_counts[0]);
    check_shape(kLong, g_long, backend, gen, g_rows[1], g_counts[1]);
    check_shape(kVarlen, g_long, backend, gen, g_rows[2], g_counts[2]);
}

void test_fa1(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA1, "fa1"); }
void test_fa2(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA2, "fa2"); }
void test_fa3(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA3, "fa3"); }

}  // namespace

int main(void) {
    test_skip_without_gpu();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fa1), cmocka_unit_test(test_fa2), cmocka_unit_test(test_fa3)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
