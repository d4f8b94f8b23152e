// The head dims the FA1 kernels are compiled for, with each one's two tiles: the one table behind
// the entry-point declarations (fa1_params.h), the host's lookup (fa1_backend.cpp) and the
// instantiation units (src/CMakeLists.txt makes one fa1_fwd_hdimD.cu per row from
// fa1_fwd_hdim.cu.in). A problem's head dim runs on the smallest compiled one that holds it
// (zero-padded in shared memory).
//
// Row: X(head dim, large tile, small tile), each tile as  BR, keys per warp, Q in the reduction
// buffer  (fa1_kernel.cuh's Tile<D, BR, KPW, QInRed>: BC = 4 warps x keys per warp). The large
// tile runs where a block may opt in to its shared memory (sm_80, sm_90), the small one on sm_75
// and sm_86 / sm_89; head dims 32 and 256 have one tile for both.
//   32:  BR 32 x BC 256, 47 KB everywhere.
//   64:  large BR 32 x BC 256, 93 KB (two CTAs per SM on sm_80 / sm_90); small BR 32 x BC 128, 61 KB.
//   128: large BR 32 x BC 128 with Q inside the reduction buffer, 113 KB; small BR 16 x BC 64, 60.5 KB.
//   256: BR 16 x BC 64 with Q inside the reduction buffer, 112.5 KB (sm_80, sm_90 only).
#pragma once

#define FLASHATTN_FA1_HEAD_DIMS(X)                \
    X(32, 32, 64, false, 32, 64, false)           \
    X(64, 32, 64, false, 32, 32, false)           \
    X(128, 32, 32, true, 16, 16, false)           \
    X(256, 16, 16, true, 16, 16, true)
