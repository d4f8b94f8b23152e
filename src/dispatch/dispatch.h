// Finalizing a plan (resolve, query the device, choose a backend, schedule) and running it.
#pragma once

#include "dispatch/plan.h"

namespace flashattn {

flashattn_status_t finalize_plan(flashattn_plan *plan);
flashattn_status_t execute_plan(const flashattn_plan *plan, const Tensors &t);

// Device queries that work with or without CUDA in the build.
flashattn_status_t device_info(int32_t device, DeviceInfo *out);
int32_t usable_device_count();

}  // namespace flashattn
