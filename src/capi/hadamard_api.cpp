// The C boundary of flashattn_rotate_hadamard() (issue 17 (c)): the rotation that makes FP8
// quantization of Q and K robust to outliers, offered as its own call rather than a hidden step of
// the attention (the caller rotates, quantizes with its own scales, then attends).
#include "backends/hadamard.h"
#include "capi/guard.h"

using namespace flashattn;

extern "C" {

FLASHATTN_API flashattn_status_t flashattn_rotate_hadamard(flashattn_dtype_t dtype, int64_t rows, int64_t dim,
                                                           const void *src, int64_t src_row_stride, void *dst,
                                                           int64_t dst_row_stride, uint64_t seed, int32_t device,
                                                           flashattn_stream_t stream) {
    return guarded(__func__, [&] {
        HadamardCall c;
        c.dtype = static_cast<flashattn_dtype_t>(enum_value(&dtype));
        c.rows = rows;
        c.dim = dim;
        c.src = src;
        c.src_row_stride = src_row_stride;
        c.dst = dst;
        c.dst_row_stride = dst_row_stride;
        c.seed = seed;
        c.device = device;
        c.stream = stream;
        FLASHATTN_TRY(check_hadamard_call(c));
        if (c.rows == 0) return FLASHATTN_SUCCESS;
        return c.device < 0 ? cpu_rotate_hadamard(c) : gpu_rotate_hadamard(c);
    });
}

}  // extern "C"
