#include "dispatch/decide.h"

#include <cstring>

namespace flashattn {

const char *backend_name(flashattn_backend_t b) {
    switch (b) {
        case FLASHATTN_BACKEND_AUTO: return "auto";
        case FLASHATTN_BACKEND_CPU: return "cpu";
        case FLASHATTN_BACKEND_FA1: return "fa1";
        case FLASHATTN_BACKEND_FA2: return "fa2";
        case FLASHATTN_BACKEND_FA3: return "fa3";
    }
    return "unknown";
}

bool parse_backend_name(const char *text, flashattn_backend_t *out) {
    for (flashattn_backend_t b : {FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_FA1,
                                  FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA3}) {
        if (std::strcmp(text, backend_name(b)) == 0) {
            *out = b;
            return true;
        }
    }
    return false;
}

namespace {

std::string why_not(flashattn_backend_t b, const Candidate &c) {
    if (!c.compiled) return std::string("libflashattn was built without ") + backend_name(b);
    return c.unsupported;
}

std::string cc_text(const DeviceSummary &dev) {
    return "sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor);
}

}  // namespace

Decision decide_backend(flashattn_backend_t requested, const DeviceSummary &dev, const Candidate candidates[5]) {
    Decision d;
    if (requested != FLASHATTN_BACKEND_AUTO) {
        const Candidate &c = candidates[requested];
        d.backend = requested;
        if (!c.compiled || !c.unsupported.empty()) {
            d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
            d.reason = std::string(backend_name(requested)) + " cannot run this plan: " + why_not(requested, c);
        } else {
            d.reason = std::string(backend_name(requested)) + " was asked for";
        }
        return d;
    }
    if (!dev.present) {
        d.backend = FLASHATTN_BACKEND_CPU;
        // The absence reason leads ("no NVIDIA driver found", "no CUDA device found", ...): it is what
        // the user acts on, and it stays out of nested parentheses in callers that wrap the reason.
        d.reason = dev.absent_reason + ": the CPU backend runs";
        if (!candidates[FLASHATTN_BACKEND_CPU].unsupported.empty()) {
            d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
            d.reason = "no usable CUDA device and the CPU backend cannot run this plan: " +
                       candidates[FLASHATTN_BACKEND_CPU].unsupported;
        }
        return d;
    }
    // Newest generation first: sm_90 -> FA3, sm_80..sm_89 and newer GPUs without sm_90a code -> FA2,
    // sm_75 -> FA1. Each falls back to the older generations when it cannot run the problem.
    const int cc = dev.cc_major * 10 + dev.cc_minor;
    flashattn_backend_t order[3];
    int n = 0;
    if (cc == 90) order[n++] = FLASHATTN_BACKEND_FA3;
    if (cc >= 80) order[n++] = FLASHATTN_BACKEND_FA2;
    if (cc >= 75) order[n++] = FLASHATTN_BACKEND_FA1;
    if (n == 0) {
        d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
        d.reason = "the CUDA device is " + cc_text(dev) + "; libflashattn's GPU backends need sm_75 or newer "
                   "(force FLASHATTN_BACKEND_CPU to run on the host)";
        return d;
    }
    // A backend that can run the plan but passes it to an older generation (auto_pass) is taken
    // only when none of the older ones can run it.
    std::string skipped;
    int passed_over = -1;
    for (int i = 0; i < n; ++i) {
        const Candidate &c = candidates[order[i]];
        const bool runs = c.compiled && c.unsupported.empty();
        if (runs && c.auto_pass.empty()) {
            d.backend = order[i];
            d.reason = std::string(backend_name(order[i])) + " is the newest generation for " + cc_text(dev) +
                       " that can run this plan" + (skipped.empty() ? "" : " (" + skipped + ")");
            return d;
        }
        if (runs && passed_over < 0) passed_over = i;
        if (!skipped.empty()) skipped += "; ";
        skipped += std::string(backend_name(order[i])) + ": " + (runs ? c.auto_pass : why_not(order[i], c));
    }
    if (passed_over >= 0) {
        d.backend = order[passed_over];
        d.reason = std::string(backend_name(order[passed_over])) + " is the only generation for " + cc_text(dev) +
                   " that can run this plan (" + skipped + ")";
        return d;
    }
    d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
    d.reason = "no GPU backend can run this plan on " + cc_text(dev) + " (" + skipped + ")";
    return d;
}

Decision decide_backward_backend(flashattn_backend_t requested, flashattn_backend_t forward, const DeviceSummary &dev,
                                 const Candidate candidates[5]) {
    Decision d;
    const Candidate &same = candidates[forward];
    if (same.compiled && same.unsupported.empty()) {
        // Under auto an fa3 plan's backward stays on fa2 unless kFa3BackwardUnderAuto (issue 16);
        // forcing FLASHATTN_BACKEND_FA3 runs fa3's.
        const Candidate &fa2 = candidates[FLASHATTN_BACKEND_FA2];
        if (!kFa3BackwardUnderAuto && requested == FLASHATTN_BACKEND_AUTO && forward == FLASHATTN_BACKEND_FA3 &&
            fa2.compiled && fa2.unsupported.empty()) {
            d.backend = FLASHATTN_BACKEND_FA2;
            d.reason = "fa2 runs the backward pass (auto does not pick fa3's backward yet; force fa3 to run it)";
            return d;
        }
        d.backend = forward;
        d.reason = std::string(backend_name(forward)) + " runs the backward pass as it runs the forward";
        return d;
    }
    const std::string why_forward = std::string(backend_name(forward)) + ": " + why_not(forward, same);
    if (requested != FLASHATTN_BACKEND_AUTO) {
        d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
        d.reason = "the backward pass cannot run on the requested backend (" + why_forward +
                   "); leave FLASHATTN_I64_BACKEND at auto to let another generation run it";
        return d;
    }
    flashattn_backend_t order[4];
    int n = 0;
    const int cc = dev.cc_major * 10 + dev.cc_minor;
    if (dev.present && cc == 90) order[n++] = FLASHATTN_BACKEND_FA3;
    if (dev.present && cc >= 80) order[n++] = FLASHATTN_BACKEND_FA2;
    if (dev.present && cc >= 75) order[n++] = FLASHATTN_BACKEND_FA1;
    if (!dev.present) order[n++] = FLASHATTN_BACKEND_CPU;
    std::string skipped = why_forward;
    for (int i = 0; i < n; ++i) {
        if (order[i] == forward) continue;
        const Candidate &c = candidates[order[i]];
        if (c.compiled && c.unsupported.empty()) {
            d.backend = order[i];
            d.reason = std::string(backend_name(order[i])) + " runs the backward pass (" + skipped + ")";
            return d;
        }
        skipped += "; " + std::string(backend_name(order[i])) + ": " + why_not(order[i], c);
    }
    d.status = FLASHATTN_ERROR_NOT_SUPPORTED;
    d.reason = "no backend can run this plan's backward pass (" + skipped + ")";
    return d;
}

}  // namespace flashattn
