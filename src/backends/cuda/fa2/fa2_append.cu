// The fa2 backend's instantiation of the shared serving append (device/cache_append.cuh), compiled
// for fa2's architectures.
#include "backends/cuda/device/cache_append.cuh"
#include "backends/cuda/fa2/fa2_append.h"

namespace flashattn {
namespace fa2 {

cudaError_t launch_append(const AppendParams &a, bool bf16, cudaStream_t s) { return cuda::launch_cache_append(a, bf16, s); }

}  // namespace fa2
}  // namespace flashattn
