// The object behind flashattn_plan_t: what the user set, and what finalize decided.
#pragma once

#include <string>

#include "dispatch/backend.h"
#include "problem/params.h"
#include "problem/problem.h"

struct flashattn_plan {
    flashattn::PlanParams params;
    bool finalized = false;
    // Valid only while finalized:
    flashattn::Problem problem;
    flashattn::DeviceInfo device;
    const flashattn::Backend *backend = nullptr;
    flashattn::Schedule schedule;
    std::string reason;  // why this backend
};
