// FA3 forward, host launcher: picks the compiled tile of a head dim (fa3_config.h), opts the
// kernel in to its dynamic shared memory once, and sizes the persistent grid (at most one CTA
// per work tile, at most p.num_ctas; launch_persistent, shared with the FP8 kernel). Included by the fa3_fwd_hdim*.cu units through
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

// The persistent launch of every FA3 forward kernel (launch_fwd below, launch_fp8_fwd in
// fa3_fp8_kernel.cuh): opts `kernel` in to `smem_bytes` of dynamic shared memory once per device
// (`optin_done`: the caller's flag word, one per kernel instantiation), then launches one CTA per
// work tile (query block x head x sequence, the kernel's n_work, counted here in 64 bits), at
// most p.num_ctas, of kThreads threads. `P`: the kernel's parameter block (Params or derived),
// its last argument; `maps`: the tensor maps the kernel takes before it.
template <class Kernel, class P, class... Maps>
cudaError_t launch_persistent(Kernel kernel, int smem_bytes, unsigned long long *optin_done, const P &p,
                              cudaStream_t stream, const Maps &...maps) {
    const cudaError_t e = cuda::ensure_smem_optin(kernel, smem_bytes, optin_done);
    if (e != cudaSuccess) return e;
    const int64_t n_work = (static_cast<int64_t>(p.seqlen_q) + kBlockM - 1) / kBlockM * p.heads_q * p.batch;
    const unsigned grid = static_cast<unsigned>(n_work < p.num_ctas ? n_work : p.num_ctas);
    kernel<<<grid, kThreads, smem_bytes, stream>>>(maps..., p);
    return cudaSuccess;
}

// The kernels of one tile (head dim kD, kBN keys, V kDV wide): the ALiBi ramp's or the plain one.
template <int kD, int kBN, int kDV, class E>
cudaError_t launch_fwd_tile(const Params &p, const TensorMaps &maps, cudaStream_t stream) {
    using Tr = Traits<kD, kBN, kDV>;
    static unsigned long long optin_done = 0;  // one per instantiation
    if constexpr (Tr::kAlibiRamp) {  // ALiBi's ramp kernel (fa3_mainloop.cuh kAlibiGemm)
        static unsigned long long optin_ramp_done = 0;
        if (p.alibi_slopes != nullptr && p.alibi_gemm && p.softcap_scale == 0.f)
            return launch_persistent(fwd_kernel<RampTraits<Tr>, E>, Tr::kRampSmemBytes, &optin_ramp_done, p, stream,
                                     maps.q, maps.k, maps.v, maps.o);
    }
    // The sink kernel (SinkTraits): 1..16 sink tokens, one narrow sink tile. Not on a wide key
    // tile (fa3_config.h), which plans with a window (where sink tiles exist) do not take.
    if constexpr (Tr::kSinkNarrowOk && kBN == config_for(kD, kDV).block_n) {
        static unsigned long long optin_sink_done = 0;
        if (p.sink_tokens > 0 && p.sink_tokens <= kSinkNarrowKeys && p.sink_narrow)
            return launch_persistent(fwd_kernel<SinkTraits<Tr>, E>, Tr::kSmemBytes, &optin_sink_done, p, stream,
                                     maps.q, maps.k, maps.v, maps.o);
    }
    return launch_persistent(fwd_kernel<Tr, E>, Tr::kSmemBytes, &optin_done, p, stream, maps.q, maps.k, maps.v, maps.o);
}

// kDV: V's width (a P row of fa3_head_dims.h), kD for the square kernels. p.wide_tile: the square
// row's wide key tile where it has one (fa3_config.h has_wide_tile).
template <int kD, class E, int kDV = kD>
cudaError_t launch_fwd(const Params &p, const TensorMaps &maps, cudaStream_t stream) {
    constexpr TileConfig cfg = config_for(kD, kDV);
    static_assert(cfg.head_dim == kD && cfg.head_dim_v == kDV, "no such compiled head dim");
    if constexpr (kDV == kD && has_wide_tile(kD)) {
        constexpr TileConfig wide = wide_config_for(kD);
        if (p.wide_tile) return launch_fwd_tile<kD, wide.block_n, kDV, E>(p, maps, stream);
    }
    return launch_fwd_tile<kD, cfg.block_n, kDV, E>(p, maps, stream);
}

}  // namespace fa3
}  // namespace flashattn
