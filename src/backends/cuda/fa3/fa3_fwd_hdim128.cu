// FA3 forward kernels for head dims up to 128 (fp16 and bf16; one translation unit per head dim so
// that the build parallelises).
#include "backends/cuda/fa3/fa3_kernel.cuh"

namespace flashattn {
namespace fa3 {

cudaError_t launch_fwd_hdim128(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s) {
    return bf16 ? launch_fwd<128, cuda::Bf16>(p, maps, s) : launch_fwd<128, cuda::Fp16>(p, maps, s);
}

}  // namespace fa3
}  // namespace flashattn
