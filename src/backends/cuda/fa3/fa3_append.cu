// The fa3 backend's instantiation of the shared serving append (device/cache_append.cuh), compiled
// for fa3's architectures.
#include "backends/cuda/device/cache_append.cuh"
#include "backends/cuda/fa3/fa3_append.h"

namespace flashattn {
namespace fa3 {

cudaError_t launch_append(const AppendParams &a, bool bf16, cudaStream_t s) { return cuda::launch_cache_append(a, bf16, s); }

}  // namespace fa3
}  // namespace flashattn
