// The fa2 backend's launcher of the serving append pre-kernels (host/cache_append.h), defined in
// fa2_append.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "backends/cuda/host/cache_append.h"

namespace flashattn {
namespace fa2 {

// Enqueue the append (and with a.q_rot the rotation of Q) on `s`; `bf16` picks the element type.
cudaError_t launch_append(const AppendParams &a, bool bf16, cudaStream_t s);

}  // namespace fa2
}  // namespace flashattn
