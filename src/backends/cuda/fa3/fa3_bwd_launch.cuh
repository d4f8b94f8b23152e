// The FA3 backward's main-kernel launchers: the kernel finalize chose (BwdParams::block_n and the
// mode) for one compiled head dim. fa3_bwd_hdim.cu.in instantiates launch_bwd_hdim per row of
// fa3_head_dims.h.
#pragma once

#include "backends/cuda/fa3/fa3_bwd_kernel.cuh"
#include "backends/cuda/fa3/fa3_bwd_wide.cuh"

namespace flashattn {
namespace fa3 {

// The 80-key layout's grid: kv heads x batch x its key blocks of the longest sequence, in one
// dimension (the host checks that it fits).
template <int kD, class E, bool kDet>
cudaError_t launch_bwd_wide_kernel(const BwdParams &p, const BwdMaps &maps, cudaStream_t stream) {
    using Tr = BwdWideTraits<kD>;
    const auto kernel = bwd_wide_kernel<Tr, E, kDet>;
    static unsigned long long optin_done = 0;  // one per instantiation
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.heads_kv) * p.batch * bwd_key_blocks<Tr>(p)));
    kernel<<<grid, kBwdThreads, Tr::kSmemBytes, stream>>>(maps.q, maps.k, maps.v, maps.dout, p);
    return cudaSuccess;
}

template <int kD, class E>
cudaError_t launch_bwd(const BwdParams &p, const BwdMaps &maps, cudaStream_t stream) {
    if constexpr (bwd_split(kD)) {
        if (p.block_n == kBwdWideBN)
            return p.deterministic ? launch_bwd_wide_kernel<kD, E, true>(p, maps, stream)
                                   : launch_bwd_wide_kernel<kD, E, false>(p, maps, stream);
    }
    return p.deterministic || p.dq_writer ? launch_bwd_kernel<kD, E, true>(p, maps, stream)
                                          : launch_bwd_kernel<kD, E, false>(p, maps, stream);
}

// Launcher body of one row of fa3_head_dims.h: both element types where a backward is compiled.
template <int kD>
cudaError_t launch_bwd_hdim(const BwdParams &p, const BwdMaps &maps, bool bf16, cudaStream_t s) {
    if constexpr (bwd_compiled(kD)) {
        return bf16 ? launch_bwd<kD, cuda::Bf16>(p, maps, s) : launch_bwd<kD, cuda::Fp16>(p, maps, s);
    } else {
        (void)p, (void)maps, (void)bf16, (void)s;
        return cudaErrorInvalidValue;
    }
}

}  // namespace fa3
}  // namespace flashattn
