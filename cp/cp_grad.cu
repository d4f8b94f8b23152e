// The ring backward's element-wise kernels (cp_device.h): fp32 accumulators of dQ, dK, dV summed
// from each step's parts in the plan's dtype, and the final rounding to that dtype. Memory-bound
// and small next to a step's attention; grid-stride loops, one element per thread and pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cp/cp_device.h"

namespace flashattn_cp {

namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) { return x; }
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void accumulate_kernel(float *acc, const T *part, RowRange rows, bool add, size_t count) {
    const size_t per_batch = rows.row_count * rows.width;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
        const size_t batch = i / per_batch;
        const size_t at = (batch * rows.batch_rows + rows.row_begin) * rows.width + (i - batch * per_batch);
        const float x = to_float(part[at]);
        acc[at] = add ? acc[at] + x : x;
    }
}

template <typename T>
__global__ void store_kernel(T *out, const float *acc, size_t count) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(acc[i]);
}

unsigned blocks_for(size_t count) {
    const size_t blocks = (count + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
cudaError_t accumulate_as(float *acc, const void *part, const RowRange &rows, bool add, cudaStream_t stream) {
    const size_t count = rows.batch * rows.row_count * rows.width;
    if (count == 0) return cudaSuccess;
    accumulate_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(acc, static_cast<const T *>(part), rows, add, count);
    return cudaGetLastError();
}

template <typename T>
cudaError_t store_as(void *out, const float *acc, size_t count, cudaStream_t stream) {
    if (count == 0) return cudaSuccess;
    store_kernel<T><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T *>(out), acc, count);
    return cudaGetLastError();
}

}  // namespace

cudaError_t launch_grad_accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows, bool add,
                                   cudaStream_t stream) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return accumulate_as<__half>(acc, part, rows, add, stream);
    case FLASHATTN_DTYPE_BF16: return accumulate_as<__nv_bfloat16>(acc, part, rows, add, stream);
    case FLASHATTN_DTYPE_FP32: return accumulate_as<float>(acc, part, rows, add, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_grad_store(void *out, const float *acc, int64_t dtype, size_t count, cudaStream_t stream) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return store_as<__half>(out, acc, count, stream);
    case FLASHATTN_DTYPE_BF16: return store_as<__nv_bfloat16>(out, acc, count, stream);
    case FLASHATTN_DTYPE_FP32: return store_as<float>(out, acc, count, stream);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace flashattn_cp
