// The bottom layer's error contract: every layer records a failure here, where it happens, and
// returns the status upward unchanged. The extern "C" functions that read the message back
// (flashattn_last_error and friends) live in capi/; nothing here allocates or throws.
#pragma once

#include "flashattn/flashattn.h"

namespace flashattn {

// Record a printf-style message for flashattn_last_error() on this thread and return `status`.
flashattn_status_t fail(flashattn_status_t status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Replace this thread's message (nullptr clears it).
void set_last_error(const char *message);

// This thread's last message; "" when none was recorded.
const char *last_error();

}  // namespace flashattn

// Propagate a non-success status from an internal call; the callee has recorded the message.
#define FLASHATTN_TRY(expr)                                  \
    do {                                                     \
        const flashattn_status_t flashattn_try_s_ = (expr);  \
        if (flashattn_try_s_ != FLASHATTN_SUCCESS) return flashattn_try_s_; \
    } while (0)
