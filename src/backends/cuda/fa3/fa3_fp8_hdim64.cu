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

#if FLASHATTN_FP8_HDIM64_TILE == 128
// The padded form calls the 128 unit's kernel rather than instantiating a second copy of it here:
// one kernel template in two units of the library is two modules, and the base variant built that
// way failed its quick test on the H200 (2026-12-02, every element within tolerance: most likely a
// launch on the copy whose shared-memory opt-in was never set).
int fp8_block_n_hdim64() { return fp8_block_n_hdim128(); }

cudaError_t launch_fp8_fwd_hdim64(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s) {
    return launch_fp8_fwd_hdim128(p, maps, bf16_out, s);
}
#else
int fp8_block_n_hdim64() { return kFp8TileN<64>; }

cudaError_t launch_fp8_fwd_hdim64(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s) {
    return bf16_out ? launch_fp8_fwd<64, cuda::Bf16>(p, maps, s) : launch_fp8_fwd<64, cuda::Fp16>(p, maps, s);
}
#endif

}  // namespace fa3
}  // namespace flashattn
