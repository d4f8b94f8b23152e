/* Buffers and layouts shared by the forward and backward suites (owned by tests/common): a tensor
 * on the host with its device copy, strided layouts with padding, NaN poisoning, timing and the
 * device's error after a run. */
#ifndef FLASHATTN_TEST_BUFFERS_H
#define FLASHATTN_TEST_BUFFERS_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn/flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NaN patterns written into every output element (and every gap of every tensor) before a run. */
#define TEST_POISON_FP16 0x7e5au
#define TEST_POISON_BF16 0x7fa5u
#define TEST_POISON_FP32 0x7fc0deadu

/* One buffer: a 256-byte aligned host copy, and a device copy for the GPU backends. */
typedef struct test_mem {
    void *host;   /* always present */
    void *device; /* GPU backends only */
    size_t bytes;
} test_mem;

/* 1 when `backend` runs on device memory (a GPU backend, in a build with CUDA). */
int test_on_device(flashattn_backend_t backend);
/* Allocates `bytes` (at least 1) on the host, and on the device too when `device`. 0 on success. */
int test_mem_alloc(test_mem *m, size_t bytes, int device);
void test_mem_free(test_mem *m);
/* The pointer handed to the library. */
void *test_mem_ptr(const test_mem *m);
/* Host to device and back (no-ops without a device copy). 0 on success. */
int test_mem_upload(const test_mem *m);
int test_mem_download(const test_mem *m);
/* 1 when the buffer the library sees still holds `snapshot` (its first m->bytes bytes). */
int test_mem_unchanged(const test_mem *m, const void *snapshot);
/* NULL after a clean cudaDeviceSynchronize (or without CUDA); else the CUDA error's text. */
const char *test_device_error(void);

/* A [batch][seqlen][heads][dim] tensor, or [total][heads][dim] when varlen, in elements. */
typedef struct tensor_layout {
    int64_t batch_stride, row_stride, head_stride;
    size_t elems; /* allocation */
} tensor_layout;

/* Contiguous, or with the pads added when `padded` (multiples of 8 elements keep rows 16-byte
 * aligned for every dtype). */
tensor_layout make_layout(int64_t batch, int64_t seqlen, int64_t total, int varlen, int64_t heads, int64_t dim,
                          int padded, int64_t pad_head, int64_t pad_row, int64_t pad_batch);
/* Offset of element (sequence b, row i of it = packed token tok, head h, column 0). */
int64_t layout_offset(const tensor_layout *l, int varlen, int64_t b, int64_t tok, int64_t i, int64_t h);

/* Fills the whole 2- or 4-byte elements of `bytes` bytes with the dtype's poison (fp32's for fp32). */
void test_poison(flashattn_dtype_t dtype, void *buf, size_t bytes);
/* 1 when the element at p holds the dtype's poison. */
int test_is_poison(flashattn_dtype_t dtype, const unsigned char *p);

/* Monotonic seconds. */
double test_now_seconds(void);

#ifdef __cplusplus
}
#endif

#endif
