// The two small kernels around the FA2 backward main kernel (fa2_bwd_kernel.cuh):
//   preprocess: row_dot = rowsum(dO * O) in fp32 (FlashAttention-2's D_i) and zero every copy of
//               the fp32 dQ accumulator (the main kernel only adds into it);
//   convert:    dQ = scale * (sum of the accumulator's copies, in copy order) in the input dtype;
//   sink grad:  with sink logits, their gradient from the LSE and D (one CTA per head).
// One warp per (query row, head): lane c owns the 8 columns 8c..8c+7 (head_dim <= 256), so rows
// are 16-byte loads and stores (dO, O, dQ strides are multiples of 8 elements, checked by the host).
// Rows of every sequence are covered: the grid is (query blocks of the longest sequence, heads_q,
// batch) and rows past a sequence's end return.
#include <cstdint>
#include <cstring>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"

namespace flashattn {
namespace fa2 {
namespace {

constexpr int kPrepWarps = 4;
constexpr int kPrepRowsPerWarp = 8;
constexpr int kPrepRows = kPrepWarps * kPrepRowsPerWarp;  // query rows per CTA

// Two 16-bit values packed in a word (lower column in the low half) -> fp32.
template <class E>
__device__ __forceinline__ float2 unpack2(uint32_t u);

template <>
__device__ __forceinline__ float2 unpack2<cuda::Fp16>(uint32_t u) {
    __half2 h;
    static_assert(sizeof(h) == sizeof(u), "half2 is one word");
    memcpy(&h, &u, sizeof(u));
    return __half22float2(h);
}

template <>
__device__ __forceinline__ float2 unpack2<cuda::Bf16>(uint32_t u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

template <class E>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 u = unpack2<E>(x[i]), v = unpack2<E>(y[i]);
        s = fmaf(u.x, v.x, s);
        s = fmaf(u.y, v.y, s);
    }
    return s;
}

template <class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_preprocess_kernel(const __grid_constant__ BwdParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const cuda::SeqInfo si = cuda::seq_info(p, b);
    const bool varlen = p.cu_q != nullptr;
    const int d = p.head_dim;
    const int c = lane * 8;
    const uint16_t *og = static_cast<const uint16_t *>(p.o) + (varlen ? si.q_row0 * p.o_rs : b * p.o_bs) +
                         head * p.o_hs + c;
    const uint16_t *dog = static_cast<const uint16_t *>(p.dout) +
                          (varlen ? si.q_row0 * p.do_rs : b * p.do_bs) + head * p.do_hs + c;
    const int64_t split_stride = static_cast<int64_t>(p.heads_q) * p.total_rows * d;
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = blockIdx.x * kPrepRows + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        const int64_t r = static_cast<int64_t>(head) * p.total_rows + si.q_row0 + qpos;
        float s = 0.f;
        if (c < d) {
            const uint4 o4 = *reinterpret_cast<const uint4 *>(og + qpos * p.o_rs);
            const uint4 do4 = *reinterpret_cast<const uint4 *>(dog + qpos * p.do_rs);
            s = dot8<E>(o4, do4);
            float4 *acc = reinterpret_cast<float4 *>(p.dq_accum + r * d + c);
            for (int sp = 0; sp < p.dq_splits; ++sp) {
                acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
                acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
                acc += split_stride / 4;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) p.row_dot[r] = s;
    }
}

template <class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_convert_dq_kernel(const __grid_constant__ BwdParams p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const cuda::SeqInfo si = cuda::seq_info(p, b);
    const bool varlen = p.cu_q != nullptr;
    const int d = p.head_dim;
    const int c = lane * 8;
    if (c >= d) return;
    uint16_t *dqg = static_cast<uint16_t *>(p.dq) + (varlen ? si.q_row0 * p.dq_rs : b * p.dq_bs) +
                    head * p.dq_hs + c;
    const int64_t split_stride = static_cast<int64_t>(p.heads_q) * p.total_rows * d;
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = blockIdx.x * kPrepRows + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        const int64_t r = static_cast<int64_t>(head) * p.total_rows + si.q_row0 + qpos;
        const float4 *acc = reinterpret_cast<const float4 *>(p.dq_accum + r * d + c);
        float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < p.dq_splits; ++sp) {  // fixed order: bitwise reproducible
            const float4 x0 = acc[0], x1 = acc[1];
            a[0] += x0.x, a[1] += x0.y, a[2] += x0.z, a[3] += x0.w;
            a[4] += x1.x, a[5] += x1.y, a[6] += x1.z, a[7] += x1.w;
            acc += split_stride / 4;
        }
        uint4 out;
        out.x = cuda::pack2<E>(a[0] * p.scale, a[1] * p.scale);
        out.y = cuda::pack2<E>(a[2] * p.scale, a[3] * p.scale);
        out.z = cuda::pack2<E>(a[4] * p.scale, a[5] * p.scale);
        out.w = cuda::pack2<E>(a[6] * p.scale, a[7] * p.scale);
        cuda::st_global_v4(dqg + qpos * p.dq_rs, out);
    }
}

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

dim3 prep_grid(const BwdParams &p) {
    return dim3(static_cast<unsigned>((p.seqlen_q + kPrepRows - 1) / kPrepRows), static_cast<unsigned>(p.heads_q),
                static_cast<unsigned>(p.batch));
}

}  // namespace

cudaError_t launch_bwd_preprocess(const BwdParams &p, bool bf16, cudaStream_t s) {
    if (bf16)
        bwd_preprocess_kernel<cuda::Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    else
        bwd_preprocess_kernel<cuda::Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    return cudaSuccess;
}

cudaError_t launch_bwd_sink_grad(const BwdParams &p, cudaStream_t s) {
    bwd_sink_grad_kernel<<<static_cast<unsigned>(p.heads_q), kSinkThreads, 0, s>>>(p);
    return cudaSuccess;
}

cudaError_t launch_bwd_convert_dq(const BwdParams &p, bool bf16, cudaStream_t s) {
    if (bf16)
        bwd_convert_dq_kernel<cuda::Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    else
        bwd_convert_dq_kernel<cuda::Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    return cudaSuccess;
}

}  // namespace fa2
}  // namespace flashattn
