// Integer helpers every layer uses for sizes and tile counts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn {

// a / b rounded up, for a >= 0, b > 0; no intermediate can overflow.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

constexpr size_t align_up(size_t x, size_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// a * b + c on int64; false on overflow (then *out is unspecified).
inline bool mul_add(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t product;
    if (__builtin_mul_overflow(a, b, &product)) return false;
    return !__builtin_add_overflow(product, c, out);
}

}  // namespace flashattn
