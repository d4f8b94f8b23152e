// Scalar conversions between fp32 and the 16-bit storage types (IEEE binary16 and bfloat16), used by
// the CPU backend to widen inputs and narrow outputs. Narrowing rounds to nearest, ties to even;
// subnormals, infinities and NaNs are handled in both directions (a NaN stays a quiet NaN).
#pragma once

#include <cstdint>
#include <cstring>

namespace flashattn {
namespace cpu {

inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// binary16 -> binary32 (exact).
inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t magnitude = h & 0x7fffu;
    if (magnitude >= 0x7c00u) {  // infinity or NaN: all-ones exponent, payload kept
        return bits_float(sign | 0x7f800000u | ((magnitude & 0x3ffu) << 13));
    }
    if (magnitude >= 0x0400u) {  // normal: rebias the exponent from 15 to 127
        return bits_float(sign | ((magnitude << 13) + (112u << 23)));
    }
    // Zero or subnormal: magnitude * 2^-24 is exact in binary32.
    const float value = static_cast<float>(magnitude) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(value));
}

// binary32 -> binary16, round to nearest even.
inline uint16_t float_to_half(float f) {
    const uint32_t x = float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) {  // infinity or NaN
        if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
        return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
    }
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
    if (a >= 0x38800000u) {  // result is a normal half (>= 2^-14)
        const uint32_t rebased = a - (112u << 23);
        const uint32_t rounded = rebased + 0x0fffu + ((rebased >> 13) & 1u);
        return static_cast<uint16_t>(sign | (rounded >> 13));
    }
    // Result is a subnormal half (or zero): round a's value / 2^-24 to an integer.
    const uint32_t exponent = a >> 23;
    if (exponent < 102u) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);  // result 0x400 encodes the smallest normal
}

// bfloat16 -> binary32 (exact).
inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round to nearest even.
inline uint16_t float_to_bf16(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, force quiet
        return static_cast<uint16_t>((x >> 16) | 0x0040u);
    }
    const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace cpu
}  // namespace flashattn
