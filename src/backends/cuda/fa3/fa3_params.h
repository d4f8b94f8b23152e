// Kernel parameters of the FA3 forward backend and its launchers; shared by the host code
// (fa3_backend.cpp) and the kernels (fa3_kernel.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace fa3 {

struct Params : TensorArgs {
    int32_t reverse_m = 0;  // schedule the heaviest (last, causal) query tiles first
    int32_t num_ctas = 1;   // persistent grid: at most one CTA per SM
    int32_t section = 1;    // causal schedule: (head, sequence) pairs per L2 section
};

// TMA descriptors of Q, K and V: rank 4 {head_dim, rows, heads, batch} (varlen: rows = total
// tokens, batch 1), 64-column boxes of 128 (Q) or block_n (K, V) rows, 128-byte swizzle.
struct TensorMaps {
    CUtensorMap q, k, v;
};

// One launcher per compiled head dim (fa3_fwd_hdim*.cu); `bf16` picks the element type.
cudaError_t launch_fwd_hdim64(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
cudaError_t launch_fwd_hdim128(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
cudaError_t launch_fwd_hdim192(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
cudaError_t launch_fwd_hdim256(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);

}  // namespace fa3
}  // namespace flashattn
