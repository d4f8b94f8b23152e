// The head dims the FA3 kernels are compiled for (multiples of 64: one 128-byte swizzle page per
// 64 columns): the one table behind the launcher declarations (fa3_params.h), the host's lookup
// (fa3_backend.cpp) and the instantiation units (src/CMakeLists.txt makes one fa3_fwd_hdimD.cu per
// row from fa3_fwd_hdim.cu.in). A problem's head dim runs on the smallest compiled one that holds
// it, the columns past it loaded as zeros by TMA and never stored.
#pragma once

#define FLASHATTN_FA3_HEAD_DIMS(X) \
    X(64)                          \
    X(128)                         \
    X(192)                         \
    X(256)
