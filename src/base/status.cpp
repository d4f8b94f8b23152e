#include "base/status.h"

#include <cstdarg>
#include <cstdio>

namespace flashattn {
namespace {
// A fixed buffer: recording an error must never allocate or throw.
thread_local char last_message[1024] = "";
}  // namespace

void set_last_error(const char *message) {
    std::snprintf(last_message, sizeof last_message, "%s", message ? message : "");
}

flashattn_status_t fail(flashattn_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(last_message, sizeof last_message, format, args);
    va_end(args);
    return status;
}

const char *last_error() { return last_message; }

}  // namespace flashattn
