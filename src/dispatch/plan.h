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

    size_t workspace_bytes() const { return backend_plan->workspace.total_bytes(); }
};
