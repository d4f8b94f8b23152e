// Host conversions between fp32 and the 16-bit dtypes, for the CPU loopback's gradient arithmetic
// (the component uses only the core's public API, so it keeps its own). Round to nearest even,
// subnormals, infinities and NaN as IEEE 754 and bfloat16 define them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashattn_cp {

inline uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
inline float bits_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float x) {
    const uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float half_to_float(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float magnitude;
    if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
    return (h & 0x8000u) ? -magnitude : magnitude;
}
inline uint16_t float_to_half(float x) {
    uint32_t u = float_bits(x);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (u >= 0x477ff000u) return sign | 0x7c00u;  // from 65520 up: rounds to infinity
    if (u < 0x38800000u)                          // below 2^-14: a subnormal (times 2^24 is exact)
        return sign | static_cast<uint16_t>(std::nearbyint(bits_float(u) * 16777216.0f));
    // Normal: rebias the exponent by 112 and round 23 mantissa bits to 10, ties to even (a carry
    // into the exponent is the right answer).
    return sign | static_cast<uint16_t>((u + 0xfffu + ((u >> 13) & 1u) - 0x38000000u) >> 13);
}

}  // namespace flashattn_cp
