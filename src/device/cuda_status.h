// CUDA errors as library statuses (CUDA builds only: the device layer and the CUDA backends).
#pragma once

#include <cuda_runtime_api.h>

#include "flashattn/flashattn.h"

namespace flashattn {

// Record FLASHATTN_ERROR_DEVICE with a message naming `what` and the CUDA error.
flashattn_status_t cuda_fail(cudaError_t err, const char *what);

}  // namespace flashattn
