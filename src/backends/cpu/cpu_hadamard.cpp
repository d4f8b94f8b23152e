// flashattn_rotate_hadamard() on the host: each row widened to fp32, signs applied, the fast
// Walsh-Hadamard transform (log2(dim) butterfly passes), times 1/sqrt(dim), rounded once to the
// dtype. A row is read whole before it is written, so in place works.
#include <cmath>
#include <utility>

#include "backends/cpu/cpu_convert.h"
#include "backends/hadamard.h"
#include "base/status.h"
#include "device/device.h"

namespace flashattn {
namespace {

float load(flashattn_dtype_t dtype, const unsigned char *p, int64_t i) {
    switch (dtype) {
        case FLASHATTN_DTYPE_FP16: return cpu::Elem<FLASHATTN_DTYPE_FP16>::load(p, i);
        case FLASHATTN_DTYPE_BF16: return cpu::Elem<FLASHATTN_DTYPE_BF16>::load(p, i);
        default: return cpu::Elem<FLASHATTN_DTYPE_FP32>::load(p, i);
    }
}

void store(flashattn_dtype_t dtype, unsigned char *p, int64_t i, float x) {
    switch (dtype) {
        case FLASHATTN_DTYPE_FP16: cpu::Elem<FLASHATTN_DTYPE_FP16>::store(p, i, x); break;
        case FLASHATTN_DTYPE_BF16: cpu::Elem<FLASHATTN_DTYPE_BF16>::store(p, i, x); break;
        default: cpu::Elem<FLASHATTN_DTYPE_FP32>::store(p, i, x); break;
    }
}

// y = Sylvester-Hadamard(x), in place: y_j = sum_i x_i (-1)^popcount(i & j).
void walsh_hadamard(float *x, int64_t n) {
    for (int64_t h = 1; h < n; h <<= 1)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

}  // namespace

flashattn_status_t cpu_rotate_hadamard(const HadamardCall &c) {
    for (const auto &p : {std::make_pair(static_cast<const void *>(c.src), "src"),
                          std::make_pair(static_cast<const void *>(c.dst), "dst")}) {
        int32_t owner = -1;
        if (p.first != nullptr && memory_kind(p.first, &owner) == MemoryKind::device)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: device memory, but device is -1 (host)", p.second);
    }
    uint64_t signs[4];
    hadamard_sign_bits(c.seed, c.dim, signs);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim)));
    const int64_t es = static_cast<int64_t>(c.element_size());
    float row[256];
    for (int64_t r = 0; r < c.rows; ++r) {
        const unsigned char *in = static_cast<const unsigned char *>(c.src) + r * c.src_row_stride * es;
        unsigned char *out = static_cast<unsigned char *>(c.dst) + r * c.dst_row_stride * es;
        for (int64_t j = 0; j < c.dim; ++j) {
            const float x = load(c.dtype, in, j);
            row[j] = (signs[j / 64] >> (j % 64)) & 1u ? -x : x;
        }
        walsh_hadamard(row, c.dim);
        for (int64_t j = 0; j < c.dim; ++j) store(c.dtype, out, j, row[j] * scale);
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
