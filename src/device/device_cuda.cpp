// The device layer of a CUDA build: device queries and pointer classification through the CUDA
// runtime. "No driver" and "no device" clear the runtime's (non-sticky) error and report absence.
#include <string>

#include "base/status.h"
#include "device/cuda_status.h"
#include "device/device.h"

namespace flashattn {

flashattn_status_t cuda_fail(cudaError_t err, const char *what) {
    return fail(FLASHATTN_ERROR_DEVICE, "%s: CUDA error %d (%s): %s", what, static_cast<int>(err), cudaGetErrorName(err),
                cudaGetErrorString(err));
}

namespace {

std::string cuda_version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Why cudaGetDeviceCount found no device, in the user's terms. The runtime says "CUDA driver version
// is insufficient for CUDA runtime version" both when the driver is too old and when there is none
// at all (no libcuda.so.1): the driver's version, 0 without a driver, tells the two apart.
std::string absence_reason(cudaError_t err) {
    if (err == cudaErrorInsufficientDriver) {
        int driver = 0, runtime = 0;
        if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
        if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
        cudaGetLastError();
        if (driver == 0) return "no NVIDIA driver found";
        return "the NVIDIA driver supports CUDA " + cuda_version_text(driver) + ", this build's runtime needs " +
               cuda_version_text(runtime) + ": update the driver";
    }
    if (err == cudaErrorNoDevice) return "no CUDA device found";
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

}  // namespace

flashattn_status_t query_device(int32_t device, DeviceInfo *out) {
    DeviceInfo info;
    info.device = device;
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        // No driver, a driver too old, no GPU: the machine has no device (the reason says which).
        cudaGetLastError();
        info.absent_reason = absence_reason(err);
        *out = info;
        return FLASHATTN_SUCCESS;
    }
    if (device >= count) {
        info.absent_reason = "FLASHATTN_I64_DEVICE is " + std::to_string(device) + " but the machine has " +
                             std::to_string(count) + " CUDA device(s)";
        *out = info;
        return FLASHATTN_SUCCESS;
    }
    cudaDeviceProp prop;
    const cudaError_t perr = cudaGetDeviceProperties(&prop, device);
    if (perr != cudaSuccess) return cuda_fail(perr, "cudaGetDeviceProperties");
    info.present = true;
    info.absent_reason.clear();
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
    info.l2_bytes = prop.l2CacheSize;
    *out = info;
    return FLASHATTN_SUCCESS;
}

int32_t usable_device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // "no driver" / "no device" are not sticky errors; clear them
        return 0;
    }
    return count;
}

MemoryKind memory_kind(const void *ptr, int32_t *owner_device) {
    *owner_device = -1;
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return MemoryKind::host;  // not memory the runtime knows: plain host memory
    }
    *owner_device = attr.device;
    switch (attr.type) {
        case cudaMemoryTypeDevice: return MemoryKind::device;
        case cudaMemoryTypeManaged: return MemoryKind::managed;
        default: return MemoryKind::host;
    }
}

}  // namespace flashattn
