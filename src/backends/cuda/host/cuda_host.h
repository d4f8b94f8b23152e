// Host-side helpers shared by the CUDA backends: the device guard, launch error checks, the
// pointer checks every GPU execute makes and the shape rules of the tensor-core generations.
// Compiled only in CUDA builds.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "device/cuda_status.h"  // cuda_fail
#include "problem/problem.h"

namespace flashattn {

// Checks made by every GPU execute: each non-null pointer (q, k, v, o, lse, cu_seqlens,
// workspace; in a backward call also dout, dq, dk, dv) must be device (or managed) memory on
// `p.device`, tensors 16-byte aligned (lse and cu_seqlens 4-byte), and strides must keep rows
// 16-byte aligned. Names the argument on failure.
flashattn_status_t check_device_tensors(const Problem &p, const Tensors &t);

// The sink logits' gradient of a backward call without query rows (no sequence, or none with a
// row): zeros on the call's stream; nothing without FLASHATTN_ARG_DSINK_LOGITS. `what` names the
// generation in the error message.
flashattn_status_t zero_sink_gradient(const Problem &p, const Tensors &t, const char *what);

// Makes `device` current on the calling thread for a GPU execute's launches and restores the
// caller's current device when it goes out of scope (execute must not change the caller's state).
// Runtime calls make the device's context current on their own; driver calls (FA3's
// cuTensorMapEncodeTiled) need it current already, which a thread that never touched CUDA does not
// have even when cudaGetDevice reports `device`: `need_context` then calls cudaSetDevice anyway.
class DeviceGuard {
public:
    explicit DeviceGuard(int device, bool need_context = false);
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
// equal to head_dim (any_head_dim_v: any head_dim_v, fa2's forward), head dims 8..256 in multiples
// of 8. Empty when `p` has them; otherwise one sentence saying why not, naming `backend`.
std::string tensor_core_shape_problem(const Problem &p, const char *backend, bool any_head_dim_v = false);

// Launch bookkeeping: returns FLASHATTN_ERROR_DEVICE if the last launch failed.
flashattn_status_t check_launch(const char *kernel_name);

// A developer's knob (A/B runs and tests): whether the environment sets `name` to "0", turning off
// the form it names. Read where a plan is finalized.
bool knob_off(const char *name);

}  // namespace flashattn
