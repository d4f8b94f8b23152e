// Device-memory helpers of the GPU transports (loopback on one GPU, NCCL): CUDA error reporting,
// a scope that makes the plan's device current and restores the caller's, the LSE scatter of a
// step that only the second local chunk took part in, and DeviceTransport, the base of both GPU
// transports, which does the backward's gradient arithmetic (cp_grad.cu's kernels). Compiled
// only in a CUDA build.
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
// block kept for the plan's life.
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

// cp_grad.cu: acc (=|+=) part on `rows`, and out = acc rounded to `dtype`, on the current device.
cudaError_t launch_grad_accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows, bool add,
                                   cudaStream_t stream);
cudaError_t launch_grad_store(void *out, const float *acc, int64_t dtype, size_t count, cudaStream_t stream);

// What the GPU loopback and the NCCL transport share: everything but the exchange.
class DeviceTransport : public Transport {
public:
    explicit DeviceTransport(int device) : device_(device), scatter_(device) {}
    flashattn_status_t prepare(size_t rows, size_t cols) override { return scatter_.prepare(rows, cols); }
    flashattn_status_t scatter_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                               flashattn_stream_t stream) override;
    flashattn_status_t gather_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                              flashattn_stream_t stream) override;
    flashattn_status_t accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows, bool add,
                                  flashattn_stream_t stream) override;
    flashattn_status_t store(void *out, const float *acc, int64_t dtype, size_t count,
                             flashattn_stream_t stream) override;
    flashattn_status_t check_output(const void *pointer, const char *name, int rank) const override;

protected:
    int device_;

private:
    DeviceLseScatter scatter_;
};

}  // namespace flashattn_cp
