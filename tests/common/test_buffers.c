/* Host/device buffers, layouts and poisoning for the suites (see test_buffers.h). */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include "test_buffers.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FLASHATTN_TEST_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- Host allocation ------------------------------------------------------------------------- */

/* `align`-byte aligned allocation carved out of malloc, released with aligned_free_host. */
static void *aligned_alloc_host(size_t bytes, size_t align) {
    unsigned char *raw = (unsigned char *)malloc(bytes + align + sizeof(void *));
    uintptr_t p;
    if (!raw) return NULL;
    p = ((uintptr_t)(raw + sizeof(void *)) + align - 1) & ~(uintptr_t)(align - 1);
    memcpy((void *)(p - sizeof(void *)), &raw, sizeof(void *));
    return (void *)p;
}

static void aligned_free_host(void *p) {
    void *raw;
    if (!p) return;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof(void *));
    free(raw);
}

/* ---- Host and device buffers ----------------------------------------------------------------- */

int test_on_device(flashattn_backend_t backend) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    return backend == FLASHATTN_BACKEND_FA1 || backend == FLASHATTN_BACKEND_FA2 || backend == FLASHATTN_BACKEND_FA3;
#else
    (void)backend;
    return 0;
#endif
}

int test_mem_alloc(test_mem *m, size_t bytes, int device) {
    m->bytes = bytes ? bytes : 1;
    m->device = NULL;
    m->host = aligned_alloc_host(m->bytes, 256);
    if (!m->host) return -1;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (device && cudaMalloc(&m->device, m->bytes) != cudaSuccess) {
        m->device = NULL;
        return -1;
    }
#else
    (void)device;
#endif
    return 0;
}

void test_mem_free(test_mem *m) {
    aligned_free_host(m->host);
    m->host = NULL;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) cudaFree(m->device);
#endif
    m->device = NULL;
}

void *test_mem_ptr(const test_mem *m) { return m->device ? m->device : m->host; }

int test_mem_upload(const test_mem *m) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) return cudaMemcpy(m->device, m->host, m->bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

int test_mem_download(const test_mem *m) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (m->device) return cudaMemcpy(m->host, m->device, m->bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#endif
    (void)m;
    return 0;
}

int test_mem_unchanged(const test_mem *m, const void *snapshot) {
    int same;
    void *tmp;
    if (!m->device) return memcmp(m->host, snapshot, m->bytes) == 0;
    tmp = malloc(m->bytes);
    if (!tmp) return 0;
#ifdef FLASHATTN_TEST_WITH_CUDA
    if (cudaMemcpy(tmp, m->device, m->bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(tmp);
        return 0;
    }
#endif
    same = memcmp(tmp, snapshot, m->bytes) == 0;
    free(tmp);
    return same;
}

const char *test_device_error(void) {
#ifdef FLASHATTN_TEST_WITH_CUDA
    /* No device (a CUDA build on a machine without a driver or GPU, where the CPU tests run):
     * nothing ran on one, and the runtime's "no driver" error is not a failure of the call. */
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        (void)cudaGetLastError();
        return NULL;
    }
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) return cudaGetErrorString(err);
#endif
    return NULL;
}

/* ---- Layouts ----------------------------------------------------------------------------------- */

tensor_layout make_layout(int64_t batch, int64_t seqlen, int64_t total, int varlen, int64_t heads, int64_t dim,
                          int padded, int64_t pad_head, int64_t pad_row, int64_t pad_batch) {
    tensor_layout l;
    l.head_stride = dim + (padded ? pad_head : 0);
    l.row_stride = heads * l.head_stride + (padded ? pad_row : 0);
    l.batch_stride = seqlen * l.row_stride + (padded ? pad_batch : 0);
    if (varlen) {
        l.batch_stride = 0;
        l.elems = (size_t)(total * l.row_stride);
    } else {
        l.elems = (size_t)(batch * l.batch_stride);
    }
    if (l.elems == 0) l.elems = 1;
    return l;
}

int64_t layout_offset(const tensor_layout *l, int varlen, int64_t b, int64_t tok, int64_t i, int64_t h) {
    if (varlen) return tok * l->row_stride + h * l->head_stride;
    return b * l->batch_stride + i * l->row_stride + h * l->head_stride;
}

/* ---- Poison and time ----------------------------------------------------------------------------- */

void test_poison(flashattn_dtype_t dtype, void *buf, size_t bytes) {
    unsigned char *p = (unsigned char *)buf;
    size_t i;
    if (dtype == FLASHATTN_DTYPE_FP32) {
        const uint32_t v = TEST_POISON_FP32;
        for (i = 0; i + 4 <= bytes; i += 4) memcpy(p + i, &v, 4);
    } else {
        const uint16_t v = dtype == FLASHATTN_DTYPE_FP16 ? TEST_POISON_FP16 : TEST_POISON_BF16;
        for (i = 0; i + 2 <= bytes; i += 2) memcpy(p + i, &v, 2);
    }
}

int test_is_poison(flashattn_dtype_t dtype, const unsigned char *p) {
    if (dtype == FLASHATTN_DTYPE_FP32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u == TEST_POISON_FP32;
    } else {
        uint16_t u;
        memcpy(&u, p, 2);
        return u == (dtype == FLASHATTN_DTYPE_FP16 ? TEST_POISON_FP16 : TEST_POISON_BF16);
    }
}

double test_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
