// Every extern "C" entry point runs its body through guarded(): no C++ exception crosses the C
// boundary; each becomes a status and a message.
#pragma once

#include <cstring>
#include <exception>
#include <new>

#include "base/status.h"

namespace flashattn {

// The integer value of an enum parameter received from C, read without an enum-typed load: a
// caller may pass any int (an unknown key, a status from a newer release), and loading such a value
// as the C++ enum type is undefined behaviour.
template <class Enum>
int enum_value(const Enum *parameter) {
    static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
    int value;
    std::memcpy(&value, parameter, sizeof value);
    return value;
}

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
