// The preprocess (row_dot, zeroed dQ accumulator) and dQ convert kernels of the FA2 backward: the
// shared ones of device/bwd_prep.cuh, instantiated for fa2::BwdParams; and, with sink logits, their
// gradient from the LSE and D (one CTA per head).
#include <cmath>

#include <cuda_runtime.h>

#include "backends/cuda/device/bwd_prep.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"

namespace flashattn {
namespace fa2 {
namespace {

// The sink logit's gradient (FLASHATTN_I64_SINK_LOGITS): its probability in row i is
// P_sink = e^(sink - LSE_i) and its value 0, so dS_sink = P_sink (0 - D_i) and dsink[h] sums that
// over the head's rows (rows with LSE = -inf saw neither keys nor a sink: none). The CPU backward's
// definition (cpu_backward.cpp sink_gradients). In double, each thread over a fixed stride of rows,
// then a fixed tree: bitwise reproducible, like the CPU's.
constexpr int kSinkThreads = 256;

__global__ void __launch_bounds__(kSinkThreads) bwd_sink_grad_kernel(const __grid_constant__ BwdParams p) {
    __shared__ double partial[kSinkThreads];
    const int head = blockIdx.x;
    const double sink = p.sink_logits[head];
    const bool varlen = p.cu_q != nullptr;
    double sum = 0.0;
    for (int64_t r = threadIdx.x; r < p.total_rows; r += kSinkThreads) {
        // row r of the [heads_q][total_rows] row_dot layout; its LSE as cuda::lse_offset places it
        const int64_t li = varlen ? static_cast<int64_t>(head) * p.total_rows + r
                                  : ((r / p.seqlen_q) * p.heads_q + head) * p.seqlen_q + r % p.seqlen_q;
        const float lse = p.lse[li];
        if (lse == -INFINITY) continue;
        sum -= exp(sink - static_cast<double>(lse)) * p.row_dot[static_cast<int64_t>(head) * p.total_rows + r];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int w = kSinkThreads / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) p.dsink_logits[head] = static_cast<float>(partial[0]);
}

}  // namespace

cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_preprocess(p, bf16, s);
}

cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s) {
    bwd_sink_grad_kernel<<<static_cast<unsigned>(p.heads_q), kSinkThreads, 0, s>>>(p);
    return cudaSuccess;
}

cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s) {
    return cuda::launch_bwd_convert_dq(p, bf16, s);
}

}  // namespace fa2
}  // namespace flashattn
