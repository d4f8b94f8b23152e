// Thread-local error message and the helpers every layer uses to fail with a specific status.
#pragma once

#include "flashattn/flashattn.h"

namespace flashattn {

// Record a printf-style message for flashattn_last_error() on this thread and return `status`.
flashattn_status_t fail(flashattn_status_t status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void set_last_error(const char *message);

}  // namespace flashattn

// Propagate a non-success status from an internal call.
#define FLASHATTN_TRY(expr)                                  \
    do {                                                     \
        const flashattn_status_t flashattn_try_s_ = (expr);  \
        if (flashattn_try_s_ != FLASHATTN_SUCCESS) return flashattn_try_s_; \
    } while (0)
