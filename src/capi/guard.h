// Every extern "C" entry point runs its body through guarded(): no C++ exception crosses the C
// boundary; each becomes a status and a message.
#pragma once

#include <exception>
#include <new>

#include "capi/error.h"

namespace flashattn {

template <class Body>
flashattn_status_t guarded(const char *function, Body &&body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc &) {
        return fail(FLASHATTN_ERROR_ALLOCATION, "%s: out of host memory", function);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "%s: unexpected exception: %s", function, e.what());
    } catch (...) {
        return fail(FLASHATTN_ERROR_INTERNAL, "%s: unexpected exception", function);
    }
}

}  // namespace flashattn
