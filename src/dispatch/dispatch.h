// Finalizing a plan (resolve, query the device, choose a backend, let it plan) and running it.
#pragma once

#include "dispatch/plan.h"

namespace flashattn {

flashattn_status_t finalize_plan(flashattn_plan *plan);
flashattn_status_t execute_plan(const flashattn_plan *plan, const Tensors &t);
flashattn_status_t execute_backward_plan(const flashattn_plan *plan, const Tensors &t);
// flashattn_plan_merge_states: on the host for a CPU plan, else on the plan's device.
flashattn_status_t merge_plan_states(const flashattn_plan *plan, const MergeCall &m);

}  // namespace flashattn
