// FP8 (E4M3) inputs on the CPU backend (issue 17): the exact E4M3 -> fp32 conversion, and the
// staging that runs an FP8 plan as an fp32 one. Q, K and V are dequantized (converted exactly,
// times their descale factor, rounded once to fp32) into contiguous fp32 copies in the workspace;
// the fp32 forward runs on them, writing O (fp32) into the workspace too; then O is rounded once
// to the plan's output dtype (bf16 or fp16) into the caller's O. The CPU is the reference the FP8
// GPU kernels are measured against, so it computes as the fp32 path does, with no FP8 shortcut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "base/workspace.h"
#include "problem/problem.h"

namespace flashattn {
namespace cpu {

// E4M3 -> fp32, exact: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m * 2^-9); no infinity; S.1111.111 is NaN (kept quiet, with its sign). Largest 448.
inline float e4m3_to_float(uint8_t b) {
    const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
    const uint32_t exponent = (b >> 3) & 0xfu;
    const uint32_t mantissa = b & 0x7u;
    uint32_t bits;
    if (exponent == 0xfu && mantissa == 0x7u) {
        bits = sign | 0x7fc00000u;
    } else if (exponent != 0) {  // normal: rebias 7 -> 127, mantissa to the top of fp32's 23 bits
        bits = sign | ((exponent + 120u) << 23) | (mantissa << 20);
    } else {  // zero or subnormal: mantissa * 2^-9 is exact in fp32
        float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
        std::memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Empty when the CPU backend runs the FP8 problem `p`; otherwise why not.
std::string fp8_unsupported_reason(const Problem &p);

// The fp32 problem an FP8 plan runs as: the same sizes, mask, scale and variants, with Q, K, V and
// O contiguous fp32 tensors (the staging copies).
Problem fp8_staged_problem(const Problem &p);

// Where the staging copies lie inside the plan's one FP8 workspace slice (byte offsets).
struct Fp8Staging {
    bool on = false;
    Problem staged;  // fp8_staged_problem of the plan's problem
    int slice = -1;
    size_t q = 0, k = 0, v = 0, o = 0;
};

// Lay out the staging slice of `p` (FP8) in `workspace`; fails (INVALID_ARGUMENT) when its size
// overflows.
flashattn_status_t plan_fp8(const Problem &p, WorkspaceLayout *workspace, Fp8Staging *out);

// The host-side checks of an FP8 call that read memory: every descale factor finite.
flashattn_status_t check_fp8_descales(const Problem &p, const Tensors &t);

// Dequantize Q, K, V into the staging copies; returns the tensors of the fp32 run (staging
// pointers, O into staging, everything else passed through). cu_seqlens must have been checked.
Tensors stage_fp8_inputs(const Problem &p, const Fp8Staging &s, const WorkspaceLayout &layout, const Tensors &t);

// Round the staged fp32 O into the caller's O (the plan's output dtype and O strides).
void write_fp8_output(const Problem &p, const Fp8Staging &s, const WorkspaceLayout &layout, const Tensors &t);

}  // namespace cpu
}  // namespace flashattn
