// The interface every backend implements, and the plan object each one owns.
//
// Finalize asks each compiled backend whether it can run the problem on the device, dispatch picks
// one, and that backend's make_plan() decides everything execute needs (tile configuration, grid,
// splits, threads) and lays out the workspace. The result is the backend's own BackendPlan
// subclass, stored in the plan handle; execute() receives it back and only reads it. The backward
// pass is chosen the same way and may run on another backend than the forward (dispatch.cpp).
#pragma once

#include <memory>
#include <string>

#include "base/workspace.h"
#include "device/device.h"
#include "problem/problem.h"
#include "problem/variants.h"

namespace flashattn {

// What one backend decided at finalize. Each backend derives its own (CpuPlan, Fa1Plan, ...) and
// casts back in execute: the Backend that made a plan is the only one that ever receives it.
struct BackendPlan {
    virtual ~BackendPlan() = default;
    WorkspaceLayout workspace;           // checked by the C boundary before execute runs
    WorkspaceLayout backward_workspace;  // the same for execute_backward (empty without one)
    int num_splits = 1;                  // split-KV parts the forward runs (FLASHATTN_I64_NUM_SPLITS after finalize)
};

struct Backend {
    flashattn_backend_t id;
    const char *name;  // "cpu", "fa1", "fa2", "fa3"
    // Empty when the backend can run `p` on `dev`; otherwise one sentence saying why not.
    std::string (*unsupported_reason)(const Problem &p, const DeviceInfo &dev);
    // Decide and lay out everything for a problem the backend supports.
    flashattn_status_t (*make_plan)(const Problem &p, const DeviceInfo &dev, std::unique_ptr<BackendPlan> *out);
    // Run. Arguments and the workspace have been checked by the C boundary; GPU backends only enqueue.
    flashattn_status_t (*execute)(const Problem &p, const BackendPlan &plan, const Tensors &t);
    // Optional (may be null): empty when `auto` may choose this backend for a problem it supports,
    // otherwise why an older generation serves the problem better (forcing the backend still works).
    std::string (*auto_pass_reason)(const Problem &p, const DeviceInfo &dev);
    // Backward pass; both null where the backend has none. make_plan lays out backward_workspace
    // whenever backward_unsupported_reason(p, dev) is empty.
    std::string (*backward_unsupported_reason)(const Problem &p, const DeviceInfo &dev);
    flashattn_status_t (*execute_backward)(const Problem &p, const BackendPlan &plan, const Tensors &t);
    // Since 0.3 (left null / 0 by backends that predate them):
    // Merge partial states laid out as `p`'s output (flashattn_plan_merge_states); null: none here.
    // The GPU one serves the plans of every generation (dispatch picks it by the device).
    flashattn_status_t (*merge_states)(const Problem &p, const DeviceInfo &dev, const MergeCall &m);
    // The VariantBit set (problem/variants.h) the forward and the backward run; dispatch refuses
    // a variant outside it with NOT_SUPPORTED naming the variant.
    unsigned forward_variants;
    unsigned backward_variants;
};

// Backends compiled into this build; nullptr for those that are not (backend_registry.cpp).
const Backend *cpu_backend();
const Backend *fa1_backend();
const Backend *fa2_backend();
const Backend *fa3_backend();
const Backend *backend_by_id(flashattn_backend_t id);

}  // namespace flashattn
