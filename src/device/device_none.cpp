// The device layer of a build without CUDA: no device, and all memory is host memory.
#include "device/device.h"

namespace flashattn {

flashattn_status_t query_device(int32_t device, DeviceInfo *out) {
    *out = DeviceInfo{};
    out->device = device;
    return FLASHATTN_SUCCESS;
}

int32_t usable_device_count() { return 0; }

MemoryKind memory_kind(const void *, int32_t *owner_device) {
    *owner_device = -1;
    return MemoryKind::host;
}

}  // namespace flashattn
