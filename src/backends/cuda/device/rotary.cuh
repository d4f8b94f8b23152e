// Rotary embedding arithmetic of the serving path, in one place: the append pre-kernel
// (cache_append.cuh: new K rows and Q) uses it, and so would any kernel that rotates rows itself
// (stops 18-19 measured two such forms in FA2's decode tiles; docs/kernel-notes.md, "Decode
// speed"). Each output is computed in double with every product and sum rounded on its own (no
// fused multiply-add, as the CPU backend computes it) and rounded once to fp32 with round to odd,
// so that rounding that to a 16-bit type is the correctly rounded double: the kernels and the CPU
// backend produce the same bits.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashattn {
namespace cuda {

// double -> float truncated, with the last bit set when inexact (round to odd).
__device__ __forceinline__ float rotary_round_to_odd(double x) {
    float f = __double2float_rz(x);
    if (static_cast<double>(f) != x) f = __int_as_float(__float_as_int(f) | 1);
    return f;
}

// The pair (x, y) rotated by the angle whose cosine and sine are c and s: the first output
// x*c - y*s, the second x*s + y*c (second picks which).
__device__ __forceinline__ float rotary_output(double x, double y, double c, double s, bool second) {
    return rotary_round_to_odd(second ? __dadd_rn(__dmul_rn(x, s), __dmul_rn(y, c))
                                      : __dsub_rn(__dmul_rn(x, c), __dmul_rn(y, s)));
}

// 16-bit element bits <-> values, by element type.
__device__ __forceinline__ double rotary_load(uint16_t bits, bool bf16) {
    return bf16 ? static_cast<double>(__bfloat162float(__ushort_as_bfloat16(bits)))
                : static_cast<double>(__half2float(__ushort_as_half(bits)));
}
__device__ __forceinline__ uint16_t rotary_store(float f, bool bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
}

}  // namespace cuda
}  // namespace flashattn
