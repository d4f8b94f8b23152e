// The extern "C" side of the error contract: reading back the message base/ recorded on this
// thread, and the status names.
#include <cstring>

#include "base/status.h"
#include "capi/guard.h"

extern "C" {

FLASHATTN_API const char *flashattn_last_error(void) { return flashattn::last_error(); }

FLASHATTN_API size_t flashattn_last_error_copy(char *buffer, size_t size) {
    const char *message = flashattn::last_error();
    const size_t length = std::strlen(message);
    if (buffer != nullptr && size > 0) {
        const size_t n = length < size - 1 ? length : size - 1;
        std::memcpy(buffer, message, n);
        buffer[n] = '\0';
    }
    return length;
}

FLASHATTN_API const char *flashattn_status_string(flashattn_status_t status) {
    switch (flashattn::enum_value(&status)) {  // an int: callers may pass unknown values
        case FLASHATTN_SUCCESS: return "success";
        case FLASHATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
        case FLASHATTN_ERROR_NOT_SUPPORTED: return "not supported";
        case FLASHATTN_ERROR_INVALID_STATE: return "invalid state";
        case FLASHATTN_ERROR_ALLOCATION: return "allocation failed";
        case FLASHATTN_ERROR_DEVICE: return "device error";
        case FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE: return "insufficient workspace";
        case FLASHATTN_ERROR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

}  // extern "C"
