// The head dims the FA2 kernels are compiled for: the one table behind the launcher declarations
// (fa2_params.h), the host's lookup (fa2_backend.cpp) and the instantiation units (src/CMakeLists.txt
// reads the rows below and makes one fa2_fwd_hdimD.cu per row from fa2_fwd_hdim.cu.in, so that the
// build parallelises). A problem's head dim runs on the smallest compiled one that holds it.
#pragma once

#define FLASHATTN_FA2_HEAD_DIMS(X) \
    X(32)                          \
    X(64)                          \
    X(96)                          \
    X(128)                         \
    X(160)                         \
    X(192)                         \
    X(224)                         \
    X(256)
