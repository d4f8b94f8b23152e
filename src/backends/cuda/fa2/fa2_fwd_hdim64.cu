// FA2 forward kernels compiled for head dim 64 (fp16 and bf16; one translation unit per head dim
// so that the build parallelises).
#include "backends/cuda/fa2/fa2_kernel.cuh"

namespace flashattn {
namespace fa2 {

cudaError_t launch_fwd_hdim64(const Params &p, bool bf16, bool small, cudaStream_t s) {
    return launch_hdim<64>(p, bf16, small, s);
}

}  // namespace fa2
}  // namespace flashattn
