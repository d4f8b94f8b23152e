// The incoherent-processing rotation (issue 17 (c), since 0.3): one flashattn_rotate_hadamard()
// call, the rules on its arguments that do not depend on where it runs, and the random signs.
//
// Row x of the tensor becomes y = x·M with M = S·H / sqrt(dim): S = diag(s_0 .. s_{dim-1}) random
// signs from the seed, H the Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)). M is
// orthogonal (M·Mᵀ = S·H·Hᵀ·S / dim = I), so rotating Q and K with the same seed leaves Q·Kᵀ
// unchanged while spreading an outlier coordinate over all of them (QuIP#, FlashAttention-3's
// incoherent processing), which is what FP8 quantization of Q and K needs.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

struct HadamardCall {
    flashattn_dtype_t dtype = FLASHATTN_DTYPE_FP32;
    int64_t rows = 0;
    int64_t dim = 0;
    const void *src = nullptr;
    int64_t src_row_stride = 0;  // elements
    void *dst = nullptr;
    int64_t dst_row_stride = 0;
    uint64_t seed = 0;
    int32_t device = -1;  // -1: host memory, run on the CPU; else the CUDA device's ordinal
    flashattn_stream_t stream = nullptr;

    size_t element_size() const { return dtype == FLASHATTN_DTYPE_FP32 ? 4 : 2; }
    bool in_place() const { return src == dst && src_row_stride == dst_row_stride; }
};

// The argument rules: dtype fp16/bf16/fp32, dim a power of two in [8, 256], rows >= 0, strides at
// least dim, pointers non-NULL (when rows > 0) and aligned to the element, sizes that fit, and dst
// either src itself (same stride: in place) or apart from it.
flashattn_status_t check_hadamard_call(const HadamardCall &c);

// The signs as a bit mask: bit j of words[j / 64] set when s_j = -1. s_j is the top bit of
// splitmix64(seed + j) (the header documents the generator).
void hadamard_sign_bits(uint64_t seed, int64_t dim, uint64_t words[4]);

}  // namespace flashattn
