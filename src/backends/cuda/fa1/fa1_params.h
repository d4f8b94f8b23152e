// Kernel parameters and compiled configurations of the FA1 forward backend. Shared by the host code
// (fa1_backend.cpp) and the kernels (fa1_kernel.cuh, fa1_fwd_hdim*.cu); plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

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

// Launch one compiled configuration (fa1_fwd_hdim*.cu). `large` picks the big-shared-memory
// variant, `bf16` the element type.
cudaError_t launch_hdim32(const Params &p, bool large, bool bf16, cudaStream_t s);
cudaError_t launch_hdim64(const Params &p, bool large, bool bf16, cudaStream_t s);
cudaError_t launch_hdim128(const Params &p, bool large, bool bf16, cudaStream_t s);
cudaError_t launch_hdim256(const Params &p, bool large, bool bf16, cudaStream_t s);

// Configuration facts and an attribute query for one compiled kernel (fa1_fwd_hdim*.cu).
Config config_hdim32(bool large);
Config config_hdim64(bool large);
Config config_hdim128(bool large);
Config config_hdim256(bool large);
cudaError_t func_attributes_hdim32(bool large, bool bf16, cudaFuncAttributes *attr);
cudaError_t func_attributes_hdim64(bool large, bool bf16, cudaFuncAttributes *attr);
cudaError_t func_attributes_hdim128(bool large, bool bf16, cudaFuncAttributes *attr);
cudaError_t func_attributes_hdim256(bool large, bool bf16, cudaFuncAttributes *attr);
cudaError_t occupancy_hdim32(bool large, bool bf16, int *blocks_per_sm);
cudaError_t occupancy_hdim64(bool large, bool bf16, int *blocks_per_sm);
cudaError_t occupancy_hdim128(bool large, bool bf16, int *blocks_per_sm);
cudaError_t occupancy_hdim256(bool large, bool bf16, int *blocks_per_sm);

}  // namespace fa1
}  // namespace flashattn
