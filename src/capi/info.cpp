// Library and device information.
#include "capi/guard.h"
#include "device/device.h"

#include "build_info.h"  // generated: FLASHATTN_BUILD_INFO_STRING

using namespace flashattn;

extern "C" {

FLASHATTN_API uint32_t flashattn_version(void) { return FLASHATTN_VERSION; }

FLASHATTN_API const char *flashattn_version_string(void) { return FLASHATTN_VERSION_STRING; }

FLASHATTN_API const char *flashattn_build_info(void) { return FLASHATTN_BUILD_INFO_STRING; }

FLASHATTN_API flashattn_status_t flashattn_device_count(int32_t *count) {
    return guarded(__func__, [&] {
        if (count == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "count: the out-pointer must not be NULL");
        *count = usable_device_count();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_device_compute_capability(int32_t device, int32_t *major, int32_t *minor) {
    return guarded(__func__, [&] {
        if (major == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "major: the out-pointer must not be NULL");
        if (minor == nullptr) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "minor: the out-pointer must not be NULL");
        if (device < 0) return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "device: must be >= 0 (got %d)", device);
        const int32_t count = usable_device_count();
        if (count == 0) {
            // Say why there is none ("no NVIDIA driver found", ...): the first thing a user checks.
            DeviceInfo none;
            FLASHATTN_TRY(query_device(0, &none));
            return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "device: no usable CUDA device on this machine: %s",
                        none.absent_reason.c_str());
        }
        if (device >= count)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "device: %d is not a device ordinal (the machine has %d)", device, count);
        DeviceInfo info;
        FLASHATTN_TRY(query_device(device, &info));
        *major = info.cc_major;
        *minor = info.cc_minor;
        return FLASHATTN_SUCCESS;
    });
}

}  // extern "C"
