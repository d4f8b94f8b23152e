// Host-side helpers shared by the CUDA backends: device queries, CUDA error translation and the
// checks every GPU execute makes on its pointers. Compiled only when FLASHATTN_WITH_CUDA.
#pragma once

#include <cuda_runtime_api.h>

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

// Launch bookkeeping: returns FLASHATTN_ERROR_DEVICE if the last launch failed.
flashattn_status_t check_launch(const char *kernel_name);

}  // namespace flashattn

namespace flashattn {
// For the CPU backend on a machine with a GPU: no tensor may be device memory.
flashattn_status_t check_host_tensors(const Problem &p, const Tensors &t);
}  // namespace flashattn
