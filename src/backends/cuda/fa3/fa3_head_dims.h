// The head dims the FA3 kernels are compiled for (multiples of 64: one 128-byte swizzle page per
// 64 columns): the one table behind the launcher declarations (fa3_params.h), the host's lookup
// (fa3_backend.cpp) and the instantiation units (src/CMakeLists.txt makes one fa3_fwd_hdimD.cu per
// X row from fa3_fwd_hdim.cu.in, and one fa3_fwd_pairDxDV.cu per P row from fa3_fwd_pair.cu.in).
//
// X(D): square kernels, forward and backward (V as wide as Q and K).
// P(D, DV): forward kernels whose V (the P V GEMM, the O accumulators, the V ring, the epilogue)
// is DV wide while Q and K are D wide (head_dim_v != head_dim, issue 19: DeepSeek MLA's
// (192, 128) and the other shapes). Forward only; the backward runs square rows.
//
// A problem (head_dim d, head_dim_v dv) runs on the cheapest compiled row (fewest D + DV) that
// holds both (D >= d, DV >= dv), the columns past them loaded as zeros by TMA and never stored.
#pragma once

#define FLASHATTN_FA3_HEAD_DIMS(X) \
    X(64)                          \
    X(128)                         \
    X(192)                         \
    X(256)

#define FLASHATTN_FA3_HEAD_DIM_PAIRS(P) \
    P(64, 128)                          \
    P(128, 64)                          \
    P(192, 128)                         \
    P(256, 128)
