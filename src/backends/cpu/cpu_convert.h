// Conversions between fp32 and the 16-bit storage types (IEEE binary16 and bfloat16), used by the
// CPU backend to widen inputs and narrow outputs, and Elem<DT>, the element access of each storage
// type both passes use. Narrowing rounds to nearest, ties to even; subnormals, infinities and NaNs
// are handled in both directions (a NaN stays a quiet NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/cpu_simd.h"
#include "flashattn/flashattn.h"

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

typedef uint16_t vh __attribute__((vector_size(16)));
typedef uint32_t vu __attribute__((vector_size(32)));

// Element i of an array of 16-bit values, read or written through memcpy (no alignment assumed).
FLASHATTN_CPU_INLINE uint16_t load_bits16(const unsigned char *p, int64_t i) {
    uint16_t h;
    std::memcpy(&h, p + i * 2, 2);
    return h;
}
FLASHATTN_CPU_INLINE void store_bits16(unsigned char *p, int64_t i, uint16_t h) {
    std::memcpy(p + i * 2, &h, 2);
}

// x = 8 consecutive 16-bit values, zero-extended to 32-bit lanes.
FLASHATTN_CPU_INLINE void load8_bits16(vu &x, const unsigned char *p) {
    vh h;
    std::memcpy(&h, p, sizeof h);
    x = __builtin_convertvector(h, vu);
}

// Element access for the three storage types: scalar load/store, and widen8() which converts 8
// consecutive elements to fp32 with integer vector operations (no lookup table, no branches).
// A dtype without an Elem is one the CPU backend does not run (unsupported_reason, cpu_kernel.h).
template <flashattn_dtype_t DT>
struct Elem;

template <>
struct Elem<FLASHATTN_DTYPE_FP32> {
    static constexpr int64_t size = 4;
    static FLASHATTN_CPU_INLINE float load(const unsigned char *p, int64_t i) {
        float f;
        std::memcpy(&f, p + i * 4, 4);
        return f;
    }
    static FLASHATTN_CPU_INLINE void store(unsigned char *p, int64_t i, float f) {
        std::memcpy(p + i * 4, &f, 4);
    }
    static FLASHATTN_CPU_INLINE void widen8(vf &out, const unsigned char *p) {
        std::memcpy(&out, p, sizeof out);
    }
};

// The scalar access of a 16-bit storage type, given its two conversions.
template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
struct Elem16 {
    static constexpr int64_t size = 2;
    static FLASHATTN_CPU_INLINE float load(const unsigned char *p, int64_t i) {
        return kToFloat(load_bits16(p, i));
    }
    static FLASHATTN_CPU_INLINE void store(unsigned char *p, int64_t i, float f) {
        store_bits16(p, i, kFromFloat(f));
    }
};

template <>
struct Elem<FLASHATTN_DTYPE_FP16> : Elem16<half_to_float, float_to_half> {
    // The same mapping as half_to_float(), lane-wise.
    static FLASHATTN_CPU_INLINE void widen8(vf &out, const unsigned char *p) {
        vu x;
        load8_bits16(x, p);
        const vu sign = (x & 0x8000u) << 16;
        const vu mag = x & 0x7fffu;
        const vu special = (vu)(mag >= 0x7c00u);  // inf/NaN: exponent 31 -> 255
        const vu subnormal = (vu)(mag < 0x0400u); // zero/subnormal: exact mag * 2^-24
        const vu normal = (mag << 13) + (112u << 23) + (special & (112u << 23));
        const vf small = __builtin_convertvector((vi)mag, vf) * 5.9604644775390625e-8f;
        out = (vf)(sign | (subnormal & (vu)small) | (~subnormal & normal));
    }
};

template <>
struct Elem<FLASHATTN_DTYPE_BF16> : Elem16<bf16_to_float, float_to_bf16> {
    static FLASHATTN_CPU_INLINE void widen8(vf &out, const unsigned char *p) {
        vu x;
        load8_bits16(x, p);
        out = (vf)(x << 16);
    }
};

}  // namespace cpu
}  // namespace flashattn
