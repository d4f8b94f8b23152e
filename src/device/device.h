// What the library knows about the machine's GPUs, and the only place outside the CUDA backends
// that asks the CUDA runtime. Two implementations, chosen by the build: device_cuda.cpp (CUDA
// in the build) and device_none.cpp (CPU-only build: no device, every pointer is host memory).
// A machine without a driver or a GPU is "no device", never an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

// The CUDA device a plan targets, as queried once at finalize.
struct DeviceInfo {
    bool present = false;  // false: no driver, no GPU, no such ordinal, or built without CUDA
    int32_t device = 0;
    int32_t cc_major = 0;
    int32_t cc_minor = 0;
    int32_t sm_count = 0;
    size_t smem_per_block_optin = 0;  // bytes a block may opt in to
    int64_t l2_bytes = 0;             // L2 cache size
    std::string absent_reason = "libflashattn was built without CUDA";  // when !present
};

// Fill `out` for `device`. Fails only when a present device cannot be queried.
flashattn_status_t query_device(int32_t device, DeviceInfo *out);

// Devices the CUDA runtime can use; 0 without a driver, a GPU or CUDA in the build.
int32_t usable_device_count();

// Where a pointer's memory lives, as the CUDA runtime reports it (host when CUDA is absent).
enum class MemoryKind { host, device, managed };
MemoryKind memory_kind(const void *ptr, int32_t *owner_device);

}  // namespace flashattn
