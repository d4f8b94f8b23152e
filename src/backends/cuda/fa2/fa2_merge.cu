// Split-KV combine: O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s), from the fp32
// partials the forward kernel wrote into the workspace. One warp per (query row, head); each lane
// owns 8 columns (head_dim <= 256). A NaN partial LSE (a NaN reached the row in that split) makes
// the row's O and LSE NaN: fmaxf would drop it, and a row NaN in every split then came out as a
// fully masked one (O = 0, LSE = -inf).
#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {
namespace {

constexpr int kMergeWarps = 4;

template <class E>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const __grid_constant__ Params p) {
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int qpos = blockIdx.x * kMergeWarps + warp;
    const int head = blockIdx.y;
    const int b = blockIdx.z;
    const cuda::SeqInfo seq = cuda::seq_info(p, b);
    if (qpos >= seq.sq) return;
    const int64_t grow0 = seq.q_row0;
    const int64_t ooff = p.cu_q != nullptr ? seq.q_row0 * p.o_rs : b * p.o_bs;

    const int S = p.num_splits;
    const int64_t split_stride = static_cast<int64_t>(p.heads_q) * p.total_rows;
    const int64_t r = static_cast<int64_t>(head) * p.total_rows + grow0 + qpos;

    float mx = -INFINITY;
    bool nan = false;
    for (int s = lane; s < S; s += 32) {
        const float x = p.lse_part[s * split_stride + r];
        nan = nan || x != x;
        mx = fmaxf(mx, x);
    }
    nan = __any_sync(0xffffffffu, nan);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    if (mx != -INFINITY)
        for (int s = lane; s < S; s += 32) sum += expf(p.lse_part[s * split_stride + r] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float lse = nan ? NAN : sum == 0.f ? -INFINITY : mx + logf(sum);

    const int d = p.head_dim;
    const int c = lane * 8;
    if (c < d) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (nan) {
            for (int i = 0; i < 8; ++i) acc[i] = NAN;
        } else if (lse != -INFINITY) {
            for (int s = 0; s < S; ++s) {
                const float w = expf(p.lse_part[s * split_stride + r] - lse);
                if (w == 0.f) continue;
                const float4 *src =
                    reinterpret_cast<const float4 *>(p.o_part + (s * split_stride + r) * d + c);
                const float4 x0 = src[0], x1 = src[1];
                acc[0] = fmaf(w, x0.x, acc[0]);
                acc[1] = fmaf(w, x0.y, acc[1]);
                acc[2] = fmaf(w, x0.z, acc[2]);
                acc[3] = fmaf(w, x0.w, acc[3]);
                acc[4] = fmaf(w, x1.x, acc[4]);
                acc[5] = fmaf(w, x1.y, acc[5]);
                acc[6] = fmaf(w, x1.z, acc[6]);
                acc[7] = fmaf(w, x1.w, acc[7]);
            }
        }
        uint4 out;
        out.x = cuda::pack2<E>(acc[0], acc[1]);
        out.y = cuda::pack2<E>(acc[2], acc[3]);
        out.z = cuda::pack2<E>(acc[4], acc[5]);
        out.w = cuda::pack2<E>(acc[6], acc[7]);
        uint16_t *og = static_cast<uint16_t *>(p.o) + ooff + qpos * p.o_rs + head * p.o_hs + c;
        cuda::st_global_v4(og, out);  // a uint4 assignment through og compiled to four 4-byte stores
    }
    if (lane == 0 && p.lse != nullptr) {
        p.lse[cuda::lse_offset(p, b, head, grow0, qpos)] = lse;
    }
}

}  // namespace

cudaError_t launch_merge(const Params &p, bool bf16, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>((p.seqlen_q + kMergeWarps - 1) / kMergeWarps),
                    static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
    if (bf16)
        merge_kernel<cuda::Bf16><<<grid, kMergeWarps * 32, 0, stream>>>(p);
    else
        merge_kernel<cuda::Fp16><<<grid, kMergeWarps * 32, 0, stream>>>(p);
    return cudaSuccess;
}

}  // namespace fa2
}  // namespace flashattn
