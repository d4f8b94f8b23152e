// The FA3 FP8 (E4M3) forward kernels of head dim 64 (O in bf16 and in fp16): see fa3_fp8_kernel.cuh.
// Before this unit head dims <= 64 ran the head-dim-128 kernel on zero columns: twice the GEMM
// work of their own width (S over 128 columns, O += P V 128 wide).
#include "backends/cuda/fa3/fa3_fp8_kernel.cuh"

// The tile width this unit instantiates: 64, its own kernel. For an A/B build only (tests/gpu/
// fp8-ab.sh compiles the base variant with -DFLASHATTN_FP8_HDIM64_TILE=128, the padded form that
// head dims <= 64 ran on before this unit).
#ifndef FLASHATTN_FP8_HDIM64_TILE
#define FLASHATTN_FP8_HDIM64_TILE 64
#endif

namespace flashattn {
namespace fa3 {

int fp8_block_n_hdim64() { return kFp8TileN<FLASHATTN_FP8_HDIM64_TILE>; }

cudaError_t launch_fp8_fwd_hdim64(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s) {
    constexpr int kD = FLASHATTN_FP8_HDIM64_TILE;
    return bf16_out ? launch_fp8_fwd<kD, cuda::Bf16>(p, maps, s) : launch_fp8_fwd<kD, cuda::Fp16>(p, maps, s);
}

}  // namespace fa3
}  // namespace flashattn
