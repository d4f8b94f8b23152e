// FA3 forward, host launcher: picks the compiled tile of a head dim (fa3_config.h), opts the
// kernel in to its dynamic shared memory once, and sizes the persistent grid (at most one CTA
// per work tile, at most p.num_ctas). Included by the fa3_fwd_hdim*.cu units through
// fa3_kernel.cuh, one head dim per unit.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/host/smem_optin.h"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_fwd_kernel.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// kDV: V's width (a P row of fa3_head_dims.h), kD for the square kernels.
template <int kD, class E, int kDV = kD>
cudaError_t launch_fwd(const Params &p, const TensorMaps &maps, cudaStream_t stream) {
    constexpr TileConfig cfg = config_for(kD, kDV);
    static_assert(cfg.head_dim == kD && cfg.head_dim_v == kDV, "no such compiled head dim");
    using Tr = Traits<cfg.head_dim, cfg.block_n, cfg.head_dim_v>;
    auto kernel = fwd_kernel<Tr, E>;
    static unsigned long long optin_done = 0;  // one per instantiation
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    // The same tile count as the kernel's n_work, in 64 bits: the grid is min(tiles, num_ctas).
    const int64_t n_work = (static_cast<int64_t>(p.seqlen_q) + kBlockM - 1) / kBlockM * p.heads_q * p.batch;
    const unsigned grid = static_cast<unsigned>(n_work < p.num_ctas ? n_work : p.num_ctas);
    kernel<<<grid, kThreads, Tr::kSmemBytes, stream>>>(maps.q, maps.k, maps.v, p);
    return cudaSuccess;
}

}  // namespace fa3
}  // namespace flashattn
