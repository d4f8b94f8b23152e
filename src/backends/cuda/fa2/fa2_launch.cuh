// FA2 forward launchers: the host side of one compiled head dim. launch_hdim<D> picks the element
// type and the tile configuration (fa2_config.h) and is what each fa2_fwd_hdim*.cu instantiates;
// launch_fwd opts the kernel into its dynamic shared memory and launches it on fwd_grid.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/pdl.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_config.h"
#include "backends/cuda/fa2/fa2_fwd_kernel.cuh"
#include "backends/cuda/fa2/fa2_params.h"
#include "backends/cuda/fa2/fa2_tile_scheduler.cuh"
#include "backends/cuda/fa2/fa2_traits.cuh"
#include "backends/cuda/host/smem_optin.h"

namespace flashattn {
namespace fa2 {

template <int kD, bool kSmall, class E, bool kPaged, bool kVariants = false>
cudaError_t launch_fwd_kernel(const Params &p, cudaStream_t stream) {
    using Tr = typename TraitsFor<kD, kSmall>::type;
    static_assert(kDecodeTile<Tr> == is_decode_tile(TraitsFor<kD, kSmall>::c),
                  "the host's decode-tile choices (fa2_config.h) follow the kernel's");
    auto kernel = fwd_kernel<Tr, E, kPaged, kVariants>;
    // The sm_90 paged TMA walk's third K/V stage (kSmemTmaBytes) only where the host planned it:
    // the gather keeps the tile's own size (and fits sm_86/sm_89's 99 KB per block).
    int smem = Tr::kSmemBytes;
    if constexpr (kPagedTma<Tr, kPaged>) {
        if (p.kv_tma != 0) smem = kSmemTmaBytes<Tr>;
    }
    static unsigned long long optin_done = 0, optin_tma_done = 0;  // one per instantiation and size
    cudaError_t e = cuda::ensure_smem_optin(kernel, smem, smem == Tr::kSmemBytes ? &optin_done : &optin_tma_done);
    if (e != cudaSuccess) return e;
    typename PagedTmaMapsFor<kPaged>::type maps{};
    if constexpr (kPaged) {
        if (p.tma_maps != nullptr) maps = *p.tma_maps;
    }
    return cuda::launch_kernel(p.launch_pdl != 0, kernel, fwd_grid<Tr>(p), dim3(Tr::kThreads), smem, stream, p,
                               maps);
}

// A paged K/V cache runs its own instantiation of the same tile: a runtime test per key tile cost
// the contiguous kernels registers (spills at the big tiles), and a paged plan keeps the tile (and
// so the bits) that the same problem over a contiguous cache gets. So do ALiBi, sink tokens and
// head_dim_v != head_dim (kVariants, contiguous caches only: fa2_unsupported_reason).
template <int kD, bool kSmall, class E>
cudaError_t launch_fwd(const Params &p, cudaStream_t stream) {
    if (p.page_table != nullptr) return launch_fwd_kernel<kD, kSmall, E, true>(p, stream);
    if (p.alibi_slopes != nullptr || p.sink_tokens > 0 || p.head_dim_v != p.head_dim)
        return launch_fwd_kernel<kD, kSmall, E, false, true>(p, stream);
    return launch_fwd_kernel<kD, kSmall, E, false>(p, stream);
}

// Launcher body of one compiled head dim (both element types; the small configuration only where
// one is compiled for kD).
template <int kD>
cudaError_t launch_hdim(const Params &p, bool bf16, bool small, cudaStream_t s) {
    if constexpr (has_small_variant(kD)) {
        if (small)
            return bf16 ? launch_fwd<kD, true, cuda::Bf16>(p, s)
                        : launch_fwd<kD, true, cuda::Fp16>(p, s);
    }
    (void)small;
    return bf16 ? launch_fwd<kD, false, cuda::Bf16>(p, s) : launch_fwd<kD, false, cuda::Fp16>(p, s);
}

}  // namespace fa2
}  // namespace flashattn
