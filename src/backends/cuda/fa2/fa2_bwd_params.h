// Kernel parameters, tile shapes and launcher declarations of the FA2 backward pass. Plain C++,
// shared by the host side (fa2_bwd_host.cpp) and the kernels (fa2_bwd_kernel.cuh, fa2_bwd_prep.cu).
//
// The backward runs three kernels on one stream (FlashAttention-2's Algorithm 2):
//   preprocess  row_dot[hq][row] = sum_c dO*O (fp32) and zero the fp32 dQ accumulator
//   main        one CTA per (key block, kv head, sequence): recompute S and P from
//               the LSE, dP = dO V^T, dS = P (dP - row_dot); dK, dV accumulate in registers over
//               every query block of every query head of the kv head's GQA group; dQ += dS K goes
//               into the fp32 accumulator
//   convert     dQ = scale * the accumulator, in the input dtype
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/cuda/fa2/fa2_head_dims.h"
#include "backends/cuda/host/bwd_args.h"

namespace flashattn {
namespace fa2 {

// The main kernel's grid orders (bwd_kernel; fa2_bwd_host.cpp's grid_order picks one at finalize).
enum BwdGridOrder : int32_t {
    kHeadsFastest = 0,  // (kv head, sequence) fastest, key blocks slowest: the first wave holds every
                        // pair's first key blocks (the heaviest under a causal mask)
    kKeysFastest = 1,   // key blocks fastest, as FlashAttention-2's own grid: the CTAs resident at once
                        // cover few pairs, whose Q, dO and dQ rows they share in L2
    kKeysDescending = 2,  // key blocks fastest from each pair's last; the deterministic dQ adds then go
                          // in descending key blocks (not with sink tokens: fa2_bwd_host.cpp grid_order)
};
// Each dispatches a key block after its predecessors in the deterministic dQ order (turn_of: the
// lower key blocks of its pair, the higher ones in kKeysDescending): a turn never waits for a CTA
// that is not yet resident.

// The shared backward arguments (host/bwd_args.h) and the grid order.
struct BwdParams : BwdTensorArgs {
    int32_t grid_order = kHeadsFastest;
};

// Main-kernel tiles. A CTA of `warps` warps owns `bn` keys over the whole head dim (S and dP are
// computed once per query step) and walks query blocks of `bm` rows; Q and dO go through `stages`
// shared-memory buffers (2: the next step's tiles load while this step computes). Each warp layout
// (fa2_bwd_gemm.cuh) holds `smt` (scores: query rows), `kvmt` (dK/dV: keys) and `qmt` (dQ: query
// rows) m16 tiles per warp: two m16 tiles share every B fragment they load.
//   main      FlashAttention-2's sm80 tiles and warp layouts where they won on the H200 (stop 20):
//             head dim 96 / 128: 64 x 128 with 8 warps, double-buffered, 32 x 32 score warp
//             tiles, 32 keys x half the head dim for dK/dV, 32 rows x a quarter for dQ (161 KB,
//             one CTA per SM, 255 registers; half the dQ reductions per FLOP of 64 x 64); padded
//             head dim 256: 64 x 64 / 8 warps with 32 keys x 64 columns for dK/dV and 32 rows x
//             64 columns for dQ (6 ldmatrix.x4 per 16 mma where 16 x 128 loads 9; 208 KB).
//             Head dim <= 64 (stop 21): 128 x 128 / 8 warps, FlashAttention-2's H100 tile, 32 x 64
//             score warp tiles, 32 keys x half the head dim for dK/dV, 32 rows x half for dQ (164
//             KB, one CTA per SM, 255 registers; a quarter of 64 x 64's dQ reductions per FLOP).
//             Elsewhere 64 x 64 / 8 warps, double-buffered, 16-row warp tiles.
//   fallback  compiled where the main tile needs more than the 99 KB per block of sm_86 / sm_89:
//             at head dim <= 64 the main tile before stop 21 (64 x 64 / 8 warps, double-buffered,
//             65 KB, two CTAs per SM; also sm_80's: 164 KB is 1 KB over its opt-in), single-buffered
//             64 x 64 / 8 warps up to head dim 128, 32 x 32 / 4 warps above (also sm_80's tile at
//             head dim 224 / 256)
// finalize picks the main tile when the device's opt-in holds it (sm_80's 163 KB holds d128's),
// else the fallback. (e44c4a7 ran 64 x 128 at head dim 64 with 16-row warp tiles, one CTA per SM,
// 228 registers: 120-151 TFLOP/s on the H200 where 64 x 64 with two CTAs per SM ran 146-173.)
struct BwdTile {
    int bm, bn, warps, stages;
    int smt = 1, kvmt = 1, qmt = 1;  // m16 tiles per warp: scores, dK/dV, dQ
};
constexpr int bwd_padded_dim(int kd) { return (kd + 63) / 64 * 64; }
constexpr BwdTile bwd_tile_main(int kd) {
    return kd <= 64                    ? BwdTile{128, 128, 8, 2, 2, 2, 2}
           : kd <= 128                 ? BwdTile{64, 128, 8, 2, 2, 2, 2}
           : bwd_padded_dim(kd) == 256 ? BwdTile{64, 64, 8, 2, 1, 2, 2}
                                       : BwdTile{64, 64, 8, 2};
}
constexpr BwdTile bwd_tile_fallback(int kd) {
    return kd <= 64 ? BwdTile{64, 64, 8, 2} : kd <= 128 ? BwdTile{64, 64, 8, 1} : BwdTile{32, 32, 4, 1};
}
// K, V [bn x padded dim], stages x (Q, dO) [bm x padded dim], P and dS [bm x bn], all 16-bit,
// then stages x (LSE, row_dot) [bm] fp32.
constexpr int bwd_smem_bytes(BwdTile t, int kd) {
    return (2 * t.bn + 2 * t.stages * t.bm) * bwd_padded_dim(kd) * 2 + 2 * t.bm * t.bn * 2 + t.stages * 2 * t.bm * 4;
}
// CTAs per SM the main kernel's registers are budgeted for (__launch_bounds__, 128 registers at
// 8 warps): two where two fit the 228 KB of shared memory of an sm_90 SM and the accumulators
// (dK, dV: 2 x 16 keys x half the head dim per warp) leave room. Measured on the H200 at 16k
// tokens: hdim 64 169 vs 115 TFLOP/s, hdim 128 186 vs 145 with one CTA per SM (no register cap):
// the kernel is latency-bound, and one CTA's barriers hide under the other's math.
// Warp tiles of two m16 tiles need more than 128 registers (199-255): one CTA per SM.
constexpr int bwd_min_blocks(BwdTile t, int kd) {
    return t.stages == 2 && t.warps == 8 && kd <= 128 && t.smt == 1 && t.kvmt == 1 && t.qmt == 1 &&
                   2 * (bwd_smem_bytes(t, kd) + 1024) <= 228 * 1024
               ? 2
               : 1;
}
// Whether the main kernel keeps its per-thread cp.async and ldmatrix offsets in registers over the
// step loop (computed once per CTA) instead of recomputing them every step through opaque()
// (fa2_load.cuh), which stops 21-23 needed where the GEMMs use every register. Where one CTA per
// SM is the shared memory's limit anyway (bwd_min_blocks 1) more registers cost no occupancy; at
// head dim <= 64 ptxas then holds them without a spill (255 / 254 registers at d64 / d32). Not at
// d96 / d128 (no headroom at 255, stop 23 spilled there) nor on the two-CTA d64 fallback (128
// registers, at its cap, for 7 instructions per step). -DFLASHATTN_FA2_BWD_HOIST=0 restores the
// per-step recomputation everywhere (the A/B).
#ifndef FLASHATTN_FA2_BWD_HOIST
#define FLASHATTN_FA2_BWD_HOIST 1
#endif
constexpr bool bwd_hoist_offsets(BwdTile t, int kd) {
    return FLASHATTN_FA2_BWD_HOIST != 0 && kd <= 64 && bwd_min_blocks(t, kd) == 1;
}
// Whether the LSE / row_dot source of each step is a per-thread base and head stride computed once
// per key block (4 registers over the step loop) instead of lse_offset's form per step: where
// bwd_hoist_offsets holds, and at padded head dim 256 (247 -> 251 registers on the main tile, 244
// -> 245 on the fallback, no spill; one CTA per SM by shared memory either way). Not at d96 /
// d128: their 255-register main tiles spill 4 / 20 bytes with it.
constexpr bool bwd_hoist_row_src(BwdTile t, int kd) {
    return FLASHATTN_FA2_BWD_HOIST != 0 && (bwd_hoist_offsets(t, kd) || bwd_padded_dim(kd) == 256);
}
constexpr int kBwdSmallestOptin = 99 * 1024;  // sm_86 / sm_89 per-block opt-in
constexpr bool bwd_has_fallback(int kd) { return bwd_smem_bytes(bwd_tile_main(kd), kd) > kBwdSmallestOptin; }

// Rows of fa2_head_dims.h with a backward kernel. A padded head dim of 192 (rows 160, 192) has
// none: its tiles split the 192 columns over 2 column groups of 96, and a warp's column span that
// starts half a page in and crosses a 64-column page (at_column, fa2_bwd_gemm.cuh) read K, Q and
// dO from the wrong page (dQ, dK, dV wrong from column 128 on; found in stop 21 by
// test_backward_fa2's first head-dim-136..192 cases). 129..224 run on the 224 row (padded to 256).
constexpr bool bwd_compiled(int kd) { return bwd_padded_dim(kd) != 192; }

// Launchers, one per row of fa2_head_dims.h (generated fa2_bwd_hdimD.cu): the main kernel.
using LaunchBwd = cudaError_t (*)(const BwdParams &p, bool bf16, bool fallback, cudaStream_t s);
#define FLASHATTN_FA2_DECLARE_BWD_LAUNCH(D) \
    cudaError_t launch_bwd_hdim##D(const BwdParams &p, bool bf16, bool fallback, cudaStream_t s);
FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_DECLARE_BWD_LAUNCH)
#undef FLASHATTN_FA2_DECLARE_BWD_LAUNCH

// fa2_bwd_prep.cu: the preprocess (row_dot, zeroed accumulator) and the dQ convert kernels.
cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s);
cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s);
// dsink[h] = -sum over h's rows of e^(sink[h] - LSE) * row_dot (one CTA per head, a fixed order).
cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s);

}  // namespace fa2
}  // namespace flashattn
