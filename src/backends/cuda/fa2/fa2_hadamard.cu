// flashattn_rotate_hadamard() on a CUDA device (problem/hadamard.h has the transform). One warp
// per row: lane l holds elements l + 32·t (t < dim/32; for dim < 32 the lanes >= dim carry zeros),
// so the butterflies of the fast Walsh-Hadamard transform across bits 0-4 are warp shuffles and
// those across higher bits swaps between a lane's own registers. A row is read whole into
// registers before it is written, so in place works. Compiled with FA2 (sm_80+), as the merge
// kernel: the rotation is bandwidth-bound and needs no generation's features.
#include <cstdint>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/host/cuda_host.h"
#include "backends/hadamard.h"
#include "base/status.h"
#include "device/device.h"

namespace flashattn {
namespace {

constexpr int kWarpsPerBlock = 8;

struct HadamardArgs {
    const void *src;
    void *dst;
    int64_t rows, src_stride, dst_stride;
    uint64_t signs[4];
    float scale;
};

__device__ __forceinline__ float load_elem(const float *p) { return *p; }
__device__ __forceinline__ float load_elem(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float load_elem(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_elem(float *p, float x) { *p = x; }
__device__ __forceinline__ void store_elem(__half *p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store_elem(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }

template <int kDim, class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) hadamard_kernel(const HadamardArgs a) {
    constexpr int kPer = kDim >= 32 ? kDim / 32 : 1;  // elements per lane
    constexpr int kLaneSpan = kDim >= 32 ? 32 : kDim;  // butterflies done by shuffles: bits below this
    const int lane = threadIdx.x % 32;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
    for (int64_t row = first; row < a.rows; row += step) {
        const T *in = static_cast<const T *>(a.src) + row * a.src_stride;
        T *out = static_cast<T *>(a.dst) + row * a.dst_stride;
        float v[kPer];
#pragma unroll
        for (int t = 0; t < kPer; ++t) {
            const int j = lane + 32 * t;
            float x = j < kDim ? load_elem(in + j) : 0.0f;
            if (j < kDim && ((a.signs[j / 64] >> (j % 64)) & 1u)) x = -x;
            v[t] = x;
        }
#pragma unroll
        for (int h = 1; h < kLaneSpan; h <<= 1)
#pragma unroll
            for (int t = 0; t < kPer; ++t) {
                const float other = __shfl_xor_sync(0xffffffffu, v[t], h);
                v[t] = (lane & h) ? other - v[t] : v[t] + other;
            }
#pragma unroll
        for (int h = 1; h < kPer; h <<= 1)  // element bit 5 + log2(h): lane-local pairs (t, t + h)
#pragma unroll
            for (int t = 0; t < kPer; ++t)
                if ((t & h) == 0) {
                    const float x = v[t], y = v[t + h];
                    v[t] = x + y;
                    v[t + h] = x - y;
                }
#pragma unroll
        for (int t = 0; t < kPer; ++t) {
            const int j = lane + 32 * t;
            if (j < kDim) store_elem(out + j, v[t] * a.scale);
        }
    }
}

template <class T>
cudaError_t launch_for(int64_t dim, const HadamardArgs &a, unsigned blocks, cudaStream_t stream) {
    switch (dim) {
        case 8: hadamard_kernel<8, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
        case 16: hadamard_kernel<16, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
        case 32: hadamard_kernel<32, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
        case 64: hadamard_kernel<64, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
        case 128: hadamard_kernel<128, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
        default: hadamard_kernel<256, T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a); break;
    }
    return cudaPeekAtLastError();
}

// src and dst must be device (or managed) memory on the call's device.
flashattn_status_t check_device_memory(const HadamardCall &c) {
    for (const auto &p : {std::make_pair(c.src, "src"), std::make_pair(static_cast<const void *>(c.dst), "dst")}) {
        int32_t owner = -1;
        const MemoryKind kind = memory_kind(p.first, &owner);
        if (kind == MemoryKind::host)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: host memory, but device is %d (pass -1 for host memory)",
                        p.second, static_cast<int>(c.device));
        if (kind == MemoryKind::device && owner != c.device)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: memory of device %d, but device is %d", p.second,
                        static_cast<int>(owner), static_cast<int>(c.device));
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t gpu_rotate_hadamard(const HadamardCall &c) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || c.device >= count)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "device: %d is not a usable CUDA device (%d present)",
                    static_cast<int>(c.device), count);
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c.device);
    if (major < 8)
        return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "device: %d has compute capability %d.x; the rotation kernel needs sm_80+",
                    static_cast<int>(c.device), major);
    FLASHATTN_TRY(check_device_memory(c));
    DeviceGuard guard(c.device);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "rotate_hadamard: cudaSetDevice");
    HadamardArgs a;
    a.src = c.src;
    a.dst = c.dst;
    a.rows = c.rows;
    a.src_stride = c.src_row_stride;
    a.dst_stride = c.dst_row_stride;
    hadamard_sign_bits(c.seed, c.dim, a.signs);
    a.scale = static_cast<float>(1.0 / sqrt(static_cast<double>(c.dim)));
    const int64_t blocks_needed = (c.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const unsigned blocks = static_cast<unsigned>(blocks_needed < 65535 ? blocks_needed : 65535);  // grid-stride beyond
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(c.stream);
    cudaError_t err;
    switch (c.dtype) {
        case FLASHATTN_DTYPE_FP16: err = launch_for<__half>(c.dim, a, blocks, stream); break;
        case FLASHATTN_DTYPE_BF16: err = launch_for<__nv_bfloat16>(c.dim, a, blocks, stream); break;
        default: err = launch_for<float>(c.dim, a, blocks, stream); break;
    }
    if (err != cudaSuccess) return cuda_fail(err, "rotate_hadamard kernel launch");
    return check_launch("rotate_hadamard kernel");
}

}  // namespace flashattn
