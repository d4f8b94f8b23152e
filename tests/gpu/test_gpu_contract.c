/* GPU-side contract for every CUDA generation in the build: bad pointers (host memory, misaligned,
 * another device), a too-small workspace and misaligned strides give the exact status, a message
 * naming the argument, and leave the poisoned outputs untouched; a good call then succeeds and is
 * only enqueued on the stream it was given. Skipped (exit 77) without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "flashattn/flashattn.h"
#include "test_support.h"

enum { B = 2, S = 200, H = 4, D = 64 };

static const size_t n_elems = (size_t)B * S * H * D;

typedef struct {
    void *q, *k, *v, *o, *workspace;
    float *lse;
    size_t workspace_bytes;
    unsigned char *o_host_poison;
} device_buffers;

#define CUDA_OK(call) assert_int_equal((call), cudaSuccess)

static void assert_fails(flashattn_status_t got, flashattn_status_t expected, const char *word) {
    if (got != expected)
        fail_msg("status %d (%s), expected %d; message: %s", got, flashattn_status_string(got), expected,
                 flashattn_last_error());
    if (strstr(flashattn_last_error(), word) == NULL)
        fail_msg("message '%s' does not name '%s'", flashattn_last_error(), word);
}

static flashattn_plan_t *make_plan(flashattn_backend_t backend) {
    flashattn_plan_t *plan = NULL;
    assert_int_equal(flashattn_plan_create(&plan), FLASHATTN_SUCCESS);
    const struct { flashattn_i64_param_t key; int64_t value; } sets[] = {
        {FLASHATTN_I64_BATCH, B}, {FLASHATTN_I64_SEQLEN_Q, S}, {FLASHATTN_I64_SEQLEN_K, S},
        {FLASHATTN_I64_HEADS_Q, H}, {FLASHATTN_I64_HEAD_DIM, D}, {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_FP16},
        {FLASHATTN_I64_BACKEND, backend}};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; ++i)
        assert_int_equal(flashattn_plan_set_i64(plan, sets[i].key, sets[i].value), FLASHATTN_SUCCESS);
    return plan;
}

static void alloc_buffers(device_buffers *d, size_t workspace_bytes) {
    CUDA_OK(cudaMalloc(&d->q, n_elems * 2));
    CUDA_OK(cudaMalloc(&d->k, n_elems * 2));
    CUDA_OK(cudaMalloc(&d->v, n_elems * 2));
    CUDA_OK(cudaMalloc(&d->o, n_elems * 2 + 64));
    CUDA_OK(cudaMalloc((void **)&d->lse, (size_t)B * H * S * 4));
    CUDA_OK(cudaMemset(d->q, 0x3c, n_elems * 2)); /* fp16 ~1.0: harmless finite inputs */
    CUDA_OK(cudaMemset(d->k, 0x30, n_elems * 2));
    CUDA_OK(cudaMemset(d->v, 0x2c, n_elems * 2));
    CUDA_OK(cudaMemset(d->o, 0xff, n_elems * 2 + 64)); /* poison: NaN */
    CUDA_OK(cudaMemset(d->lse, 0xff, (size_t)B * H * S * 4));
    d->workspace_bytes = workspace_bytes;
    d->workspace = NULL;
    if (workspace_bytes) CUDA_OK(cudaMalloc(&d->workspace, workspace_bytes));
}

static void free_buffers(device_buffers *d) {
    cudaFree(d->q); cudaFree(d->k); cudaFree(d->v); cudaFree(d->o); cudaFree(d->lse);
    if (d->workspace) cudaFree(d->workspace);
}

static void assert_o_untouched(const device_buffers *d) {
    unsigned char *host = malloc(n_elems * 2);
    assert_non_null(host);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(host, d->o, n_elems * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n_elems * 2; ++i)
        if (host[i] != 0xff) fail_msg("O byte %zu was written by a call that failed", i);
    free(host);
}

static void check_backend(flashattn_backend_t backend, const char *name) {
    flashattn_plan_t *plan = make_plan(backend);
    flashattn_status_t s = flashattn_plan_finalize(plan);
    if (s == FLASHATTN_ERROR_NOT_SUPPORTED && strstr(flashattn_last_error(), "built without")) {
        print_message("%s: not in this build, skipped\n", name);
        flashattn_plan_destroy(plan);
        return;
    }
    if (s != FLASHATTN_SUCCESS) fail_msg("%s: finalize: %s", name, flashattn_last_error());
    size_t ws = 0;
    assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws), FLASHATTN_SUCCESS);
    device_buffers d;
    alloc_buffers(&d, ws);
    float host_in[64];
    memset(host_in, 0, sizeof host_in);

    /* Host memory where device memory is needed. */
    void *host_q = malloc(n_elems * 2);
    assert_fails(flashattn_plan_execute(plan, host_q, d.k, d.v, d.o, d.lse, d.workspace, ws, NULL),
                 FLASHATTN_ERROR_INVALID_ARGUMENT, "q");
    assert_fails(flashattn_plan_execute(plan, d.q, d.k, d.v, d.o, host_in, d.workspace, ws, NULL),
                 FLASHATTN_ERROR_INVALID_ARGUMENT, "lse");
    free(host_q);
    /* Misaligned pointers. */
    assert_fails(flashattn_plan_execute(plan, d.q, (char *)d.k + 2, d.v, d.o, d.lse, d.workspace, ws, NULL),
                 FLASHATTN_ERROR_INVALID_ARGUMENT, "k");
    assert_fails(flashattn_plan_execute(plan, d.q, d.k, d.v, (char *)d.o + 8, d.lse, d.workspace, ws, NULL),
                 FLASHATTN_ERROR_INVALID_ARGUMENT, "o");
    /* Workspace too small. */
    if (ws > 0) {
        assert_fails(flashattn_plan_execute(plan, d.q, d.k, d.v, d.o, d.lse, d.workspace, ws - 1, NULL),
                     FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE, "workspace");
    }
    /* A pointer on another device, where there is one. */
    int count = 0;
    CUDA_OK(cudaGetDeviceCount(&count));
    if (count > 1) {
        void *other = NULL;
        CUDA_OK(cudaSetDevice(1));
        CUDA_OK(cudaMalloc(&other, n_elems * 2));
        CUDA_OK(cudaSetDevice(0));
        assert_fails(flashattn_plan_execute(plan, d.q, d.k, other, d.o, d.lse, d.workspace, ws, NULL),
                     FLASHATTN_ERROR_INVALID_ARGUMENT, "device 1");
        cudaFree(other);
    }
    assert_o_untouched(&d);

    /* The good call, on a stream of our own: enqueued there, done after that stream syncs. */
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    assert_int_equal(flashattn_plan_execute(plan, d.q, d.k, d.v, d.o, d.lse, d.workspace, ws, (flashattn_stream_t)stream),
                     FLASHATTN_SUCCESS);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaGetLastError());

    /* Strides that break 16-byte row alignment. */
    assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_ROW_STRIDE, H * D + 4), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_BATCH_STRIDE, (int64_t)S * (H * D + 4)), FLASHATTN_SUCCESS);
    s = flashattn_plan_finalize(plan);
    if (s == FLASHATTN_SUCCESS) {
        size_t ws2 = 0;
        assert_int_equal(flashattn_plan_get_workspace_size(plan, &ws2), FLASHATTN_SUCCESS);
        if (ws2 <= ws) {
            void *big_k = NULL;
            CUDA_OK(cudaMalloc(&big_k, (size_t)B * S * (H * D + 4) * 2));
            CUDA_OK(cudaMemset(d.o, 0xff, n_elems * 2 + 64));
            assert_fails(flashattn_plan_execute(plan, d.q, big_k, d.v, d.o, d.lse, d.workspace, ws, NULL),
                         FLASHATTN_ERROR_INVALID_ARGUMENT, "K strides");
            assert_o_untouched(&d);
            cudaFree(big_k);
        }
    } else {
        assert_int_equal(s, FLASHATTN_ERROR_NOT_SUPPORTED);
    }
    free_buffers(&d);
    flashattn_plan_destroy(plan);
}

static void test_fa1(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA1, "fa1"); }
static void test_fa2(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA2, "fa2"); }
static void test_fa3(void **state) { (void)state; check_backend(FLASHATTN_BACKEND_FA3, "fa3"); }

/* Auto picks a GPU generation on a machine with a GPU, and says which. */
static void test_auto_picks_gpu(void **state) {
    (void)state;
    flashattn_plan_t *plan = make_plan(FLASHATTN_BACKEND_AUTO);
    assert_int_equal(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    flashattn_backend_t backend;
    const char *reason = NULL;
    assert_int_equal(flashattn_plan_get_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_true(backend != FLASHATTN_BACKEND_CPU);
    print_message("auto: backend %d: %s\n", backend, reason);
    flashattn_plan_destroy(plan);
}

/* A K row stride that is not a multiple of 8 elements: TMA cannot describe it, so fa3 refuses at
 * finalize with a reason naming the stride and auto hands the plan to fa2 on Hopper, saying why
 * (fa2 then rejects such pointers at execute, as the stride test in check_backend shows). */
static void test_fa3_tma_stride_fallback(void **state) {
    (void)state;
    int32_t major = 0, minor = 0;
    if (flashattn_device_compute_capability(0, &major, &minor) != FLASHATTN_SUCCESS || major != 9 || minor != 0) {
        print_message("device is not sm_90: skipped\n");
        skip();
    }
    flashattn_plan_t *plan = make_plan(FLASHATTN_BACKEND_FA3);
    assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_ROW_STRIDE, H * D + 4), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_K_BATCH_STRIDE, (int64_t)S * (H * D + 4)),
                     FLASHATTN_SUCCESS);
    flashattn_status_t s = flashattn_plan_finalize(plan);
    if (s == FLASHATTN_ERROR_NOT_SUPPORTED && strstr(flashattn_last_error(), "built without")) {
        flashattn_plan_destroy(plan);
        skip();
    }
    assert_fails(s, FLASHATTN_ERROR_NOT_SUPPORTED, "TMA");
    assert_non_null(strstr(flashattn_last_error(), "row stride"));
    assert_int_equal(flashattn_plan_set_i64(plan, FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_AUTO), FLASHATTN_SUCCESS);
    assert_int_equal(flashattn_plan_finalize(plan), FLASHATTN_SUCCESS);
    flashattn_backend_t backend;
    const char *reason = NULL;
    assert_int_equal(flashattn_plan_get_backend(plan, &backend, &reason), FLASHATTN_SUCCESS);
    assert_int_equal(backend, FLASHATTN_BACKEND_FA2);
    if (strstr(reason, "TMA") == NULL) fail_msg("auto's reason '%s' does not say why fa3 was passed over", reason);
    flashattn_plan_destroy(plan);
}

int main(void) {
    test_skip_without_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fa1), cmocka_unit_test(test_fa2), cmocka_unit_test(test_fa3),
        cmocka_unit_test(test_auto_picks_gpu), cmocka_unit_test(test_fa3_tma_stride_fallback)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
