// The object behind flashattn_plan_t: what the user set, and what finalize decided.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "problem/params.h"
#include "problem/problem.h"

struct flashattn_plan {
    flashattn::PlanParams params;
    bool finalized = false;
    // Valid only while finalized:
    flashattn::Problem problem;
    flashattn::DeviceInfo device;
    const flashattn::Backend *backend = nullptr;
    std::unique_ptr<flashattn::BackendPlan> backend_plan;  // made by backend->make_plan
    std::string reason;  // why this backend
    // The backward pass: its backend (null when none can run it; backward_reason says why) and,
    // when that is not the forward's backend, the plan it made.
    const flashattn::Backend *backward_backend = nullptr;
    std::unique_ptr<flashattn::BackendPlan> separate_backward_plan;
    std::string backward_reason;

    size_t workspace_bytes() const { return backend_plan->workspace.total_bytes(); }
    const flashattn::BackendPlan &backward_plan() const {
        return separate_backward_plan ? *separate_backward_plan : *backend_plan;
    }
    size_t backward_workspace_bytes() const { return backward_plan().backward_workspace.total_bytes(); }
};
