// The backend decision table, as a pure function of plain data so that it is testable on a
// machine without a GPU.
#pragma once

#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

// What dispatch knows about one backend for the problem at hand.
struct Candidate {
    bool compiled = false;  // built into this library
    std::string unsupported;  // empty: can run the problem; else why not
    std::string auto_pass;    // empty: auto may choose it; else why auto prefers an older backend
};

struct DeviceSummary {
    bool present = false;  // a usable CUDA device
    int cc_major = 0;
    int cc_minor = 0;
    std::string absent_reason;  // when !present
};

struct Decision {
    flashattn_status_t status = FLASHATTN_SUCCESS;
    flashattn_backend_t backend = FLASHATTN_BACKEND_CPU;
    std::string reason;  // why chosen, or why nothing can run
};

// `requested` is the plan's backend after the FLASHATTN_BACKEND override; candidates are indexed
// by flashattn_backend_t (CPU..FA3).
Decision decide_backend(flashattn_backend_t requested, const DeviceSummary &dev, const Candidate candidates[5]);

// The backward pass's backend. `candidates` carry each backend's backward support (unsupported:
// why it cannot run this plan's backward pass); `forward` is the forward's decided backend. The
// forward's backend runs the backward when it can; otherwise, only under auto, the newest
// generation for the device that can (on Hopper: the FA3 forward with the FA2 backward), or the
// CPU where no device exists. A status other than SUCCESS means no backend can: the reason says why.
// Whether auto runs an fa3 forward's backward on fa3 where fa3's backward can run it: true since it
// passed the GPU grid and the sanitizers on the H200, measured 1.3-1.8x fa2's backward at hdim
// 64/128, and its errors against fp64 equal fa2's (kernel-notes.md, "FA3 backward", settled in
// stop 15). false keeps auto on fa2's (forcing fa3 still runs FA3's backward).
constexpr bool kFa3BackwardUnderAuto = true;
Decision decide_backward_backend(flashattn_backend_t requested, flashattn_backend_t forward, const DeviceSummary &dev,
                                 const Candidate candidates[5]);

// Parse FLASHATTN_BACKEND's value ("cpu", "fa1", "fa2", "fa3", "auto"); false if unrecognised.
bool parse_backend_name(const char *text, flashattn_backend_t *out);

const char *backend_name(flashattn_backend_t b);

}  // namespace flashattn
