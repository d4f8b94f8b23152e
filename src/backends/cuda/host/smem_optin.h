// Host-side launch helper shared by the CUDA kernels' launchers.
#pragma once

#include <cuda_runtime_api.h>

namespace flashattn {
namespace cuda {

// Set the dynamic shared-memory opt-in of one kernel once per device (cheap, thread-safe). `done`
// must be a per-kernel flag word (one bit per device ordinal < 64).
template <class Kernel>
cudaError_t ensure_smem_optin(Kernel kernel, int bytes, unsigned long long *done) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = dev < 64 ? (1ull << dev) : 0ull;
    if (bit != 0 && (__atomic_load_n(done, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && bit != 0) __atomic_fetch_or(done, bit, __ATOMIC_RELEASE);
    return e;
}

}  // namespace cuda
}  // namespace flashattn
