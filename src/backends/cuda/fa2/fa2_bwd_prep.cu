// The preprocess (row_dot, zeroed dQ accumulator), sink-gradient and dQ convert kernels of the FA2
// backward: the shared ones of device/bwd_prep.cuh, instantiated for fa2::BwdParams.
#include <cuda_runtime.h>

#include "backends/cuda/device/bwd_prep.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"

namespace flashattn {
namespace fa2 {

cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_preprocess(p, bf16, s);
}

cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s) { return cuda::launch_bwd_sink_grad(p, s); }

cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_convert_dq(p, bf16, s);
}

}  // namespace fa2
}  // namespace flashattn
