#include "problem/hadamard.h"

#include <utility>

#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace {

uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Bytes a [rows, dim] tensor with row stride `stride` spans, or false when it overflows.
bool span_bytes(const HadamardCall &c, int64_t stride, int64_t *bytes) {
    return mul_add(c.rows - 1, stride, c.dim, bytes) && mul_add(*bytes, static_cast<int64_t>(c.element_size()), 0, bytes);
}

}  // namespace

flashattn_status_t check_hadamard_call(const HadamardCall &c) {
    if (c.dtype != FLASHATTN_DTYPE_FP16 && c.dtype != FLASHATTN_DTYPE_BF16 && c.dtype != FLASHATTN_DTYPE_FP32)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "dtype: %d; the rotation takes fp16, bf16 or fp32 tensors (rotate before quantizing to FP8)",
                    static_cast<int>(c.dtype));
    if (c.dim < 8 || c.dim > 256 || (c.dim & (c.dim - 1)) != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "dim: %lld; a Hadamard rotation needs a power of two in [8, 256]",
                    (long long)c.dim);
    if (c.rows < 0) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "rows: %lld is negative", (long long)c.rows);
    if (c.device < -1)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "device: %d; -1 (host) or a CUDA device ordinal", static_cast<int>(c.device));
    for (const auto &s : {std::make_pair(c.src_row_stride, "src_row_stride"), std::make_pair(c.dst_row_stride, "dst_row_stride")})
        if (s.first < c.dim)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: %lld elements is less than dim = %lld (rows would overlap)",
                        s.second, (long long)s.first, (long long)c.dim);
    if (c.rows == 0) return FLASHATTN_SUCCESS;
    if (c.src == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "src: must not be NULL");
    if (c.dst == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "dst: must not be NULL");
    const uintptr_t es = c.element_size();
    if (reinterpret_cast<uintptr_t>(c.src) % es != 0 || reinterpret_cast<uintptr_t>(c.dst) % es != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: not aligned to its %zu-byte elements",
                    reinterpret_cast<uintptr_t>(c.src) % es != 0 ? "src" : "dst", static_cast<size_t>(es));
    int64_t src_bytes, dst_bytes;
    if (!span_bytes(c, c.src_row_stride, &src_bytes) || !span_bytes(c, c.dst_row_stride, &dst_bytes))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "rows: %lld rows of these strides overflow 64 bits in bytes",
                    (long long)c.rows);
    if (c.in_place()) return FLASHATTN_SUCCESS;
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(c.src), d0 = reinterpret_cast<uintptr_t>(c.dst);
    if (s0 < d0 + static_cast<uint64_t>(dst_bytes) && d0 < s0 + static_cast<uint64_t>(src_bytes))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "dst: overlaps src; pass the same pointer and stride to rotate in place, or separate buffers");
    return FLASHATTN_SUCCESS;
}

void hadamard_sign_bits(uint64_t seed, int64_t dim, uint64_t words[4]) {
    for (int w = 0; w < 4; ++w) words[w] = 0;
    for (int64_t j = 0; j < dim; ++j)
        if (splitmix64(seed + static_cast<uint64_t>(j)) >> 63) words[j / 64] |= uint64_t{1} << (j % 64);
}

}  // namespace flashattn
