// Kernel parameters, tile shape and launcher declarations of the FA3 backward pass (Hopper,
// sm_90a). Plain C++, shared by the host side (fa3_bwd_host.cpp) and the kernels
// (fa3_bwd_kernel.cuh, fa3_bwd_prep.cu).
//
// Three kernels on one stream, like the FA2 backward (FlashAttention-2's Algorithm 2):
//   preprocess  row_dot = rowsum(dO * O) and the zeroed fp32 dQ accumulator (device/bwd_prep.cuh)
//   main        one CTA per (key block of bwd_block_n keys, kv head, sequence): two consumer
//               warpgroups, each owning 64 of the keys (above head dim 128: half the head-dim
//               columns of all 64 in the split layout, or of 80 keys in the 80-key layout,
//               fa3_bwd_wide.cuh, which finalize picks there), walk every query block of kBwdBM rows of
//               every query head of the GQA group (fa3_bwd_kernel.cuh); the deterministic mode's
//               kernel adds a producer warpgroup (TMA loads; the dQ writer warp, which takes the
//               ordered turns)
//   convert     dQ = scale * the accumulator, in the input dtype (device/bwd_prep.cuh)
#pragma once

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/fa3/fa3_bwd_turns.h"
#include "backends/cuda/fa3/fa3_head_dims.h"
#include "backends/cuda/host/bwd_args.h"

namespace flashattn {
namespace fa3 {

// The grid orders (fa3_bwd_kernel.cuh, key_block and bwd_step; the deterministic mode's turns, turn_of).
enum BwdGridOrder : int32_t {
    kHeadsFastest = 0,   // kv heads x sequences fastest, key blocks slowest (the deterministic kernels' order with a mask)
    kKeysFastest = 1,    // key blocks fastest: the CTAs resident at once cover few (kv head, sequence) pairs
    kKeysRotated = 2,    // keys fastest, each key block's query walk starting at its own rotated block
    kKeysStaggered = 3,  // keys fastest, only the walks that start at query block 0 rotated (a mask's
                         // other walks start at their own diagonal already)
    kKeysDescending = 4,  // keys fastest from each pair's last key block, plain walks; the deterministic
                          // turns in descending key blocks (host/bwd_args.h turn_last_block, no table)
};
// Whether a grid order's deterministic turns come from the CTA's turn table (build_turn_table).
constexpr bool bwd_turn_table(int grid_order) { return grid_order != kHeadsFastest && grid_order != kKeysDescending; }

// The shared backward arguments (host/bwd_args.h, the fields device/bwd_prep.cuh reads), and the
// grid order (sem_blocks counts query blocks of kBwdBM rows; the dQ adds of one query block take
// turns in deterministic mode: fa3_bwd_kernel.cuh).
struct BwdParams : BwdTensorArgs {
    // BwdGridOrder; deterministic mode: kHeadsFastest, kKeysRotated (no mask), kKeysStaggered or
    // kKeysDescending
    int32_t grid_order = kHeadsFastest;
    int32_t block_n = 0;  // keys per CTA of the kernel finalize chose: bwd_block_n, or kBwdWideBN (fa3_bwd_wide.cuh)
    int32_t wave_ctas = 0;  // deterministic keys-fastest turns: CTAs per wave (the SMs; bwd_wave_split)
    int32_t dq_writer = 0;  // 1: bwd_det_kernel (a producer warpgroup, one dQ reduction per step by its
                            // writer warp): up to head dim 128 in both modes unless a developer's
                            // knob keeps bwd_kernel (fa3_bwd_host.cpp, writer_kernel)
};

// TMA descriptors: rank 4 {head_dim, rows, heads, batch} like the forward's, 64-column boxes of
// kBwdBM rows (Q, dO) or bwd_block_n rows (K, V), 128-byte swizzle.
struct BwdMaps {
    CUtensorMap q, k, v, dout;
};

constexpr int kBwdBM = 64;        // query rows per step (the N of S^T = K Q^T)
constexpr int kBwdBN = 128;       // keys per CTA up to head dim 128: 64 per consumer warpgroup (wgmma M = 64)
constexpr int kBwdThreads = 256;     // default mode: two warpgroups
constexpr int kBwdDetThreads = 384;  // deterministic mode: the producer warpgroup and two consumer warpgroups
// Its setmaxnreg split (fa3_config.h's setmaxnreg_split_fits: 24 x 128 + 240 x 256 = 168 x 384):
// the producer's TMA thread and dQ writer warp need few registers, the consumers hold dK and dV.
constexpr int kBwdProducerRegs = 24;
constexpr int kBwdConsumerRegs = 240;
constexpr int kBwdMaxStages = 3;  // Q / dO / LSE / row_dot buffers (bwd_stages)
// The deterministic mode's keys-rotated turns: one int per query block of a CTA's walk, in the
// barriers' padded kilobyte (fa3_bwd_kernel.cuh, build_turn_table); longer walks take ascending turns.
constexpr int kBwdTurnTableMax = 224;

// Compiled head dims of the backward (rows of fa3_head_dims.h). Up to 128, dK and dV of a
// warpgroup's 64 keys over the padded head dim live in registers (kD / 2 + kD / 2 per thread,
// which fits the deterministic kernel's 240). Above 128 that does not fit: the split layout
// (bwd_split) runs them, and head dims 136..256 run on the 256 row (192 has no kernel of its own:
// zero-padded to 256, as the FP8 forward's table does).
constexpr bool bwd_compiled(int kd) { return kd == 64 || kd == 128 || kd == 256; }

// The split layout (head dim 256, since stop 21): one CTA per 64 keys; both consumer warpgroups
// hold all 64 keys and split the head-dim columns of dK, dV and dQ (kd / 2 each) and the query
// columns of S^T and dP^T (32 each), meeting in shared memory at P^T and dS^T (fa3_bwd_kernel.cuh).
constexpr bool bwd_split(int kd) { return kd > 128; }
constexpr int bwd_block_n(int kd) { return bwd_split(kd) ? 64 : kBwdBN; }  // keys per CTA

// Ring depth: steps s + 1 .. s + stages - 1 load while step s computes, so that the warpgroups may
// drift apart (one's GEMMs under the other's elementwise work): three buffers where they fit the
// 227 KB with everything else, two from head dim 128 on.
constexpr int bwd_stages(int kd) { return kd <= 64 ? 3 : 2; }

// dQ of a step reaches the fp32 accumulator as one bulk reduction from a shared-memory tile (head
// dims 64 and 128; issued by bwd_det_kernel's dQ writer warps or by each of bwd_kernel's
// warpgroups) or as vector reductions from registers (the split layout in both modes, which has
// no room for an fp32 tile: 64 x 256 x 4 = 64 KB). Head dim 64's default mode reduced from
// registers until stop 29 (measured 10-20 % faster before that stop's instruction diet; its ncu
// then found L2 78 % busy with them).
constexpr bool bwd_bulk_dq(int kd) { return !bwd_split(kd); }
constexpr bool bwd_dq_tiles(int kd) { return !bwd_split(kd); }
// The dQ accumulator's layout is fragment order (device/dq_accum.cuh) at every compiled head dim
// and in both modes (fa3_bwd_host.cpp plan_backward): the wgmma fragment stores into a shared tile
// without bank conflicts and a query block stays one dense bulk reduction (store_dq_frag_page),
// and the split layout's vector reductions from registers add whole lines (accumulate_dq_red).
// Until stop 42 the deterministic kernel's writer slot was row-major (rows of head_dim floats):
// each consumer thread's 16 STS.64 per step put 8 rows on the same banks (128 wavefronts per warp
// and step where fragment order takes 32), on the shared memory that the step's n64 SS wgmmas
// already keep busy.

// K, V [block_n x kD], stages x (Q, dO) [kBwdBM x kD], 2 x a [64 x kBwdBM] page (dS^T of each
// warpgroup; split: P^T and dS^T), all 16-bit; without the split, 2 x the fp32 dQ tile
// [kBwdBM x kD] (the default mode at head dim 64 does not use them); stages x 2 warpgroups x
// (LSE, row_dot) [kBwdBM] fp32; 1 KB of barriers (padded); 1 KB to align the base.
constexpr int bwd_smem_bytes(int kd) {
    return (2 * bwd_block_n(kd) + 2 * bwd_stages(kd) * kBwdBM) * kd * 2 + 2 * 64 * kBwdBM * 2 +
           (bwd_dq_tiles(kd) ? 2 * kBwdBM * kd * 4 : 0) + bwd_stages(kd) * 2 * 2 * kBwdBM * 4 + 2048;
}
static_assert(bwd_smem_bytes(64) <= 232448 && bwd_smem_bytes(128) <= 232448 && bwd_smem_bytes(256) <= 232448,
              "the backward tile exceeds 227 KB");

// The 80-key layout (fa3_bwd_wide.cuh; since stop 39): the split layout's head dims (136..256)
// except under ALiBi, FlashAttention-3's d 256 tile: 80 keys per CTA (40 per consumer warpgroup in S
// and dP), dK and dV accumulated transposed (M = head dim), one dO buffer, two Q stages, P^T and
// dS^T pages double-buffered, 1 KB of barriers and the deterministic mode's turn table. A fifth
// fewer Q / dO loads and dQ adds per FLOP than 64 keys.
constexpr int kBwdWideBN = 80;
constexpr int bwd_wide_smem_bytes(int kd) {
    return 2 * kBwdWideBN * kd * 2 + 3 * kBwdBM * kd * 2 + 4 * kBwdWideBN * kBwdBM * 2 + 1024 + 1024;
}
static_assert(bwd_wide_smem_bytes(256) <= 232448, "the 80-key tile exceeds 227 KB");

// One launcher per row of fa3_head_dims.h (generated fa3_bwd_hdimD.cu): the main kernel, or
// cudaErrorInvalidValue for a head dim without one (the host never asks for it).
using LaunchBwd = cudaError_t (*)(const BwdParams &p, const BwdMaps &maps, bool bf16, cudaStream_t s);
#define FLASHATTN_FA3_DECLARE_BWD_LAUNCH(D) \
    cudaError_t launch_bwd_hdim##D(const BwdParams &p, const BwdMaps &maps, bool bf16, cudaStream_t s);
FLASHATTN_FA3_HEAD_DIMS(FLASHATTN_FA3_DECLARE_BWD_LAUNCH)
#undef FLASHATTN_FA3_DECLARE_BWD_LAUNCH

// fa3_bwd_prep.cu: device/bwd_prep.cuh's preprocess, sink gradient and dQ convert for these
// parameters.
cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s);
cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s);
cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s);

}  // namespace fa3
}  // namespace flashattn
