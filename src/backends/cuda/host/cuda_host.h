// Host-side helpers shared by the CUDA backends: device queries, CUDA error translation and the
// checks every GPU execute makes on its pointers. Compiled only when FLASHATTN_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "dispatch/backend.h"

namespace flashattn {

// Translate a CUDA error into FLASHATTN_ERROR_DEVICE with a message naming `what`.
flashattn_status_t cuda_fail(cudaError_t err, const char *what);

// Fill `out` for `device`; a machine without a driver or a GPU gives present = false (not an error).
flashattn_status_t query_device(int32_t device, DeviceInfo *out);

// Checks made by every GPU execute: each non-null pointer (q, k, v, o, lse, cu_seqlens,
// workspace) must be device (or managed) memory on `p.device` and 16-byte aligned (lse and
// cu_seqlens 4-byte), and strides must keep rows 16-byte aligned. Names the argument on failure.
flashattn_status_t check_device_tensors(const Problem &p, const Tensors &t);

// Makes `device` current on the calling thread for a GPU execute's launches and restores the
// caller's current device when it goes out of scope (execute must not change the caller's state).
class DeviceGuard {
public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    cudaError_t error() const { return err_; }

private:
    int saved_ = -1;
    bool switched_ = false;
    cudaError_t err_ = cudaSuccess;
};

// The shapes every tensor-core kernel generation (fa1, fa2, fa3) runs: fp16 or bf16, head_dim_v
// equal to head_dim, head dims 8..256 in multiples of 8. Empty when `p` has them; otherwise one
// sentence saying why not, naming `backend`.
std::string tensor_core_shape_problem(const Problem &p, const char *backend);

// Launch bookkeeping: returns FLASHATTN_ERROR_DEVICE if the last launch failed.
flashattn_status_t check_launch(const char *kernel_name);

}  // namespace flashattn

namespace flashattn {
// For the CPU backend on a machine with a GPU: no tensor may be device memory.
flashattn_status_t check_host_tensors(const Problem &p, const Tensors &t);
}  // namespace flashattn
