// Device-memory helpers of the GPU transports (loopback on one GPU, NCCL): CUDA error reporting,
// a scope that makes the plan's device current and restores the caller's, and the LSE scatter of
// a step that only the second local chunk took part in. Compiled only in a CUDA build.
#pragma once

#include <cuda_runtime.h>

#include "cp/cp_transport.h"

namespace flashattn_cp {

inline flashattn_status_t cuda_failed(cudaError_t error, const char *what) {
    return set_error(FLASHATTN_ERROR_DEVICE, "%s: %s", what, cudaGetErrorString(error));
}

#define CP_CUDA(call, what)                                                   \
    do {                                                                      \
        const cudaError_t cp_error_ = (call);                                 \
        if (cp_error_ != cudaSuccess) return cuda_failed(cp_error_, what);    \
    } while (0)

// The plan's device for the calls that allocate, restored after (the caller's current device is
// the caller's).
struct DeviceScope {
    explicit DeviceScope(int device) {
        error = cudaGetDevice(&previous);
        if (error == cudaSuccess && previous != device) error = cudaSetDevice(device);
        else if (error == cudaSuccess) previous = -1;
    }
    ~DeviceScope() {
        if (previous >= 0) cudaSetDevice(previous);
    }
    DeviceScope(const DeviceScope &) = delete;
    DeviceScope &operator=(const DeviceScope &) = delete;
    int previous = -1;
    cudaError_t error = cudaSuccess;
};

// dst[row] = [-inf × cols, src[row]] for `rows` rows, as two strided device copies from a -inf
// block kept for the plan's life (no kernel of our own, so this component compiles no CUDA code).
class DeviceLseScatter {
public:
    explicit DeviceLseScatter(int device) : device_(device) {}
    ~DeviceLseScatter();
    DeviceLseScatter(const DeviceLseScatter &) = delete;
    DeviceLseScatter &operator=(const DeviceLseScatter &) = delete;
    flashattn_status_t prepare(size_t rows, size_t cols);
    flashattn_status_t scatter(float *dst, const float *src, size_t rows, size_t cols, cudaStream_t stream) const;

private:
    int device_;
    float *neg_inf_ = nullptr;
    size_t rows_ = 0, cols_ = 0;
};

}  // namespace flashattn_cp
