// One plan's workspace as named slices, laid out once at finalize.
//
// A backend adds its slices while it plans (FA2's split-KV partials, FA1's running output and
// statistics, the CPU backend's per-thread scratch); each starts on a kWorkspaceAlignment boundary.
// The C boundary checks the caller's buffer once against total_bytes() and the alignment; execute
// then takes each slice's address with at() and never re-derives sizes or re-checks the buffer.
#pragma once

#include <cstddef>

#include "base/checked_math.h"

namespace flashattn {

// The alignment the API promises for the workspace pointer, and the one every slice keeps.
constexpr size_t kWorkspaceAlignment = 256;

class WorkspaceLayout {
public:
    static constexpr int kMaxSlices = 6;

    // Append a slice of `bytes` (0 is allowed: it takes no room) and return its index for at().
    // A slice past kMaxSlices, or one whose aligned end overflows size_t, is not added: it returns
    // -1 and the layout stays invalid (valid(), which finalize checks before any execute can use
    // the plan). Both are library bugs or absurd sizes, never a caller's doing.
    int add(const char *name, size_t bytes) {
        const size_t room = align_up(bytes, kWorkspaceAlignment);
        if (count_ == kMaxSlices || room < bytes || total_ + room < total_) {
            if (invalid_ == nullptr) invalid_ = name;
            return -1;
        }
        Slice &s = slices_[count_];
        s.name = name;
        s.offset = total_;
        s.bytes = bytes;
        total_ += room;
        return count_++;
    }

    // Whether every add() fitted; otherwise the slice that did not (invalid_slice()).
    bool valid() const { return invalid_ == nullptr; }
    const char *invalid_slice() const { return invalid_ != nullptr ? invalid_ : ""; }

    size_t total_bytes() const { return total_; }
    int slice_count() const { return count_; }
    const char *name(int slice) const { return slices_[slice].name; }
    size_t offset(int slice) const { return slices_[slice].offset; }
    size_t bytes(int slice) const { return slices_[slice].bytes; }

    // The slice's address inside a workspace buffer that the C boundary has checked.
    template <class T>
    T *at(void *workspace, int slice) const {
        return reinterpret_cast<T *>(static_cast<unsigned char *>(workspace) + slices_[slice].offset);
    }

private:
    struct Slice {
        const char *name = "";
        size_t offset = 0;
        size_t bytes = 0;
    };
    Slice slices_[kMaxSlices];
    int count_ = 0;
    size_t total_ = 0;
    const char *invalid_ = nullptr;  // the first slice add() refused
};

}  // namespace flashattn
