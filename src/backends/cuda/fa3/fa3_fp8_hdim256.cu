// The FA3 FP8 (E4M3) forward kernels of head dim 256 (O in bf16 and in fp16): see fa3_fp8_kernel.cuh.
#include "backends/cuda/fa3/fa3_fp8_kernel.cuh"

namespace flashattn {
namespace fa3 {

int fp8_block_n_hdim256() { return kFp8TileN<256>; }

cudaError_t launch_fp8_fwd_hdim256(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s) {
    return bf16_out ? launch_fp8_fwd<256, cuda::Bf16>(p, maps, s) : launch_fp8_fwd<256, cuda::Fp16>(p, maps, s);
}

}  // namespace fa3
}  // namespace flashattn
