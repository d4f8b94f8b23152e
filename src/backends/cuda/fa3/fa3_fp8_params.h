// FA3 FP8 (E4M3) forward (issue 17): its kernel parameters and launchers, shared by the host
// (fa3_backend.cpp) and the kernel units (fa3_fp8_hdim64.cu, fa3_fp8_hdim128.cu, fa3_fp8_hdim256.cu).
#pragma once

#include <cstdint>

#include "backends/cuda/fa3/fa3_params.h"

namespace flashattn {
namespace fa3 {

// The forward's parameters plus the descale factors: fp32 on the device, one per (sequence, key/
// value head) at [b * descale_bs + kv_head * descale_hs] (descale_bs = descale_hs = 0: one value
// per tensor). Read by the kernel, so execute needs no synchronisation.
struct Fp8Params : Params {
    const float *descale_q = nullptr;
    const float *descale_k = nullptr;
    const float *descale_v = nullptr;
    int64_t descale_bs = 0;
    int64_t descale_hs = 0;
};

// Compiled head dims: 64 (its rows padded to one 128-byte swizzle page: the GEMMs read the first
// 64 columns only), 128 (one page of E4M3 per row) and 256 (two); a head dim between runs on the
// next one up, the columns past it loaded as zeros by TMA and never stored. Keys per tile:
// kFp8BlockN (the transposed V tile is one 128-byte row per head-dim column), or what the unit's
// fp8_block_n_hdimD reports (kFp8TileN, fa3_fp8_kernel.cuh): the rows of the K and V boxes.
constexpr int kFp8BlockN = 128;
constexpr int fp8_compiled_head_dim(int head_dim) { return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256; }

// `bf16_out`: O in bf16, else fp16.
using LaunchFp8Fwd = cudaError_t (*)(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s);
int fp8_block_n_hdim64();
int fp8_block_n_hdim128();
int fp8_block_n_hdim256();
cudaError_t launch_fp8_fwd_hdim64(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s);
cudaError_t launch_fp8_fwd_hdim128(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s);
cudaError_t launch_fp8_fwd_hdim256(const Fp8Params &p, const TensorMaps &maps, bool bf16_out, cudaStream_t s);

}  // namespace fa3
}  // namespace flashattn
