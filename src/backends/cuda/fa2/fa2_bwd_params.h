// Kernel parameters, tile shapes and launcher declarations of the FA2 backward pass. Plain C++,
// shared by the host side (fa2_bwd_host.cpp) and the kernels (fa2_bwd_kernel.cuh, fa2_bwd_prep.cu).
//
// The backward runs three kernels on one stream (FlashAttention-2's Algorithm 2):
//   preprocess  row_dot[hq][row] = sum_c dO*O (fp32) and zero the fp32 dQ accumulator
//   main        one CTA per (key block, kv head x column slice, batch): recompute S and P from
//               the LSE, dP = dO V^T, dS = P (dP - row_dot); dK, dV accumulate in registers over
//               every query block of every query head of the kv head's GQA group; dQ += dS K goes
//               into the fp32 accumulator
//   convert     dQ = scale * sum over the accumulator's splits, in the input dtype
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/cuda/fa2/fa2_head_dims.h"
#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace fa2 {

struct BwdParams : TensorArgs {
    const void *dout = nullptr;  // dO: layout of O
    void *dq = nullptr;          // layouts of Q, K, V
    void *dk = nullptr;
    void *dv = nullptr;
    int64_t do_bs = 0, do_rs = 0, do_hs = 0;
    int64_t dq_bs = 0, dq_rs = 0, dq_hs = 0;
    int64_t dk_bs = 0, dk_rs = 0, dk_hs = 0;
    int64_t dv_bs = 0, dv_rs = 0, dv_hs = 0;

    float *row_dot = nullptr;   // workspace: [heads_q][total_rows] fp32, D_i = dO_i . O_i
    float *dq_accum = nullptr;  // workspace: [dq_splits][heads_q][total_rows][head_dim] fp32
    float scale = 0.f;          // softmax scale (dK and dQ are multiplied by it at the end)
    int32_t slices = 1;         // 64-column slices of the head dim, one CTA each (grid y = heads_kv * slices)
    int32_t dq_splits = 1;      // deterministic: accumulator copies, one per grid x (else 1)
    int32_t deterministic = 0;  // 1: each CTA owns accumulator copy blockIdx.x (plain adds, no atomics)
};

// Output columns per CTA of the main kernel: dK, dV and dQ are computed in slices of this many
// head-dim columns (one 64-column page of the swizzled tiles), each slice by its own CTA, which
// recomputes S and dP over the full head dim. It bounds the register accumulators (dK and dV:
// 64 fp32 per thread) for every head dim.
constexpr int kBwdSliceCols = 64;

// Main-kernel tile: kBwdBlock(warps) keys per CTA and query rows per step (16 per warp).
// 4 warps (64 x 64) is the main configuration; 2 warps (32 x 32) is the small one, compiled for
// head dims >= 160 where the main one needs more than the 99 KB per block of sm_86 / sm_89.
constexpr int bwd_block(int warps) { return 16 * warps; }
constexpr int bwd_padded_dim(int kd) { return (kd + 63) / 64 * 64; }
// Q, dO, K, V tiles [block x padded dim] and the P, dS tiles [block x block], all 16-bit.
constexpr int bwd_smem_bytes(int kd, int warps) {
    return 4 * bwd_block(warps) * bwd_padded_dim(kd) * 2 + 2 * bwd_block(warps) * bwd_block(warps) * 2;
}
constexpr bool bwd_has_small(int kd) { return kd >= 160; }
constexpr int kBwdMainWarps = 4;
constexpr int kBwdSmallWarps = 2;

// Launchers, one per row of fa2_head_dims.h (generated fa2_bwd_hdimD.cu): the main kernel.
using LaunchBwd = cudaError_t (*)(const BwdParams &p, bool bf16, bool small, cudaStream_t s);
#define FLASHATTN_FA2_DECLARE_BWD_LAUNCH(D) \
    cudaError_t launch_bwd_hdim##D(const BwdParams &p, bool bf16, bool small, cudaStream_t s);
FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_DECLARE_BWD_LAUNCH)
#undef FLASHATTN_FA2_DECLARE_BWD_LAUNCH

// fa2_bwd_prep.cu: the preprocess (row_dot, zeroed accumulator) and the dQ convert kernels.
cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s);
cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s);

}  // namespace fa2
}  // namespace flashattn
