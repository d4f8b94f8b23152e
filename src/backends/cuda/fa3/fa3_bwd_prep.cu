// The preprocess (row_dot, zeroed dQ accumulator), sink-gradient and dQ convert kernels of the FA3
// backward:
// the shared ones of device/bwd_prep.cuh, instantiated for fa3::BwdParams.
#include <cuda_runtime.h>

#include "backends/cuda/device/bwd_prep.cuh"
#include "backends/cuda/fa3/fa3_bwd_params.h"

namespace flashattn {
namespace fa3 {

cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_preprocess(p, bf16, s);
}

cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s) { return cuda::launch_bwd_sink_grad(p, s); }

cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_convert_dq(p, bf16, s);
}

}  // namespace fa3
}  // namespace flashattn
