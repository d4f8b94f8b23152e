// Kernel parameters and compiled configurations of the FA1 forward backend. Shared by the host code
// (fa1_backend.cpp) and the kernels (fa1_kernel.cuh, fa1_fwd_hdim*.cu); plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backends/cuda/fa1/fa1_head_dims.h"
#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace fa1 {

// Warps per CTA. All of them see every query row of the tile and split the keys of a K/V block.
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct Params : TensorArgs {
    // Workspace: the FA1 partial output (fp32, normalised, fragment-native order) and the running
    // softmax statistics (m, l) per row, one copy per warp. See workspace_rows() in fa1_backend.cpp
    // for the row layout. Sequences, strides, mask (left_i / right_i, causal folded in) and LSE: TensorArgs.
    float *o_acc = nullptr;  // [heads_q][ws_rows][D]
    float2 *ml = nullptr;    // [heads_q][ws_rows][kWarps]
    int64_t ws_rows = 0;

    int32_t q_blocks_per_cta = 1;  // query blocks (of BR rows) each CTA walks in its inner loop
    int32_t splits = 1;            // CTAs per (batch, head) along the query axis
    int32_t reverse = 0;           // launch the last query ranges first (causal: heaviest first)
};

// One compiled kernel configuration.
struct Config {
    int head_dim = 0;  // compiled head dim D
    int block_m = 0;   // BR: query rows per inner step
    int keys_per_warp = 0;
    int block_n() const { return keys_per_warp * kWarps; }  // BC: keys per outer step
    size_t smem_bytes = 0;
    bool large = false;
};

// The entry points of one compiled head dim, defined by FA1_DEFINE_HDIM in the generated unit
// fa1_fwd_hdimD.cu (one per row of fa1_head_dims.h). `large` picks the big-shared-memory tile,
// `bf16` the element type.
#define FLASHATTN_FA1_DECLARE_HDIM(D, ...)                                              \
    Config config_hdim##D(bool large);                                                  \
    cudaError_t launch_hdim##D(const Params &p, bool large, bool bf16, cudaStream_t s); \
    cudaError_t func_attributes_hdim##D(bool large, bool bf16, cudaFuncAttributes *attr); \
    cudaError_t occupancy_hdim##D(bool large, bool bf16, int *blocks_per_sm);
FLASHATTN_FA1_HEAD_DIMS(FLASHATTN_FA1_DECLARE_HDIM)
#undef FLASHATTN_FA1_DECLARE_HDIM

}  // namespace fa1
}  // namespace flashattn
