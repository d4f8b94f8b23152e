// The two small kernels around every generation's backward main kernel (FA2: fa2_bwd_kernel.cuh,
// FA3: fa3_bwd_kernel.cuh), shared so that both run the same D and the same dQ rounding:
//   preprocess: row_dot = rowsum(dO * O) in fp32 (FlashAttention-2's D_i) and zero every copy of
//               the fp32 dQ accumulator (the main kernel only adds into it);
//   convert:    dQ = scale * (sum of the accumulator's copies, in copy order) in the input dtype.
// One warp per (query row, head): lane c owns the 8 columns 8c..8c+7 (head_dim <= 256), so rows
// are 16-byte loads and stores (dO, O, dQ strides are multiples of 8 elements, checked by the host);
// the accumulator's 8 columns are two 16-byte vectors row-major, four 8-byte pairs 16 bytes apart
// in FA2's fragment order (device/dq_accum.cuh; stop 21 suspects these of its causal-2k loss).
// Rows of every sequence are covered: the grid is (query blocks of the longest sequence, heads_q,
// batch) and rows past a sequence's end return.
//
// Templates on the caller's parameter struct P: a TensorArgs with the backward fields dout, dq,
// do_*/dq_* strides, row_dot, dq_accum, dq_splits and scale (fa2::BwdParams, fa3::BwdParams).
// Everything sits in an unnamed namespace: each generation's unit instantiates its own copy.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/dq_accum.cuh"
#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"

namespace flashattn {
namespace cuda {
namespace {

constexpr int kPrepWarps = 4;
constexpr int kPrepRowsPerWarp = 8;
constexpr int kPrepRows = kPrepWarps * kPrepRowsPerWarp;  // query rows per CTA

// Two 16-bit values packed in a word (lower column in the low half) -> fp32.
template <class E>
__device__ __forceinline__ float2 unpack2(uint32_t u);

template <>
__device__ __forceinline__ float2 unpack2<Fp16>(uint32_t u) {
    __half2 h;
    static_assert(sizeof(h) == sizeof(u), "half2 is one word");
    memcpy(&h, &u, sizeof(u));
    return __half22float2(h);
}

template <>
__device__ __forceinline__ float2 unpack2<Bf16>(uint32_t u) {
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

template <class P, class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_preprocess_kernel(const __grid_constant__ P p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const SeqInfo si = seq_info(p, b);
    const bool varlen = p.cu_q != nullptr;
    const int d = p.head_dim;
    const int c = lane * 8;
    const uint16_t *og = static_cast<const uint16_t *>(p.o) + (varlen ? si.q_row0 * p.o_rs : b * p.o_bs) +
                         head * p.o_hs + c;
    const uint16_t *dog = static_cast<const uint16_t *>(p.dout) +
                          (varlen ? si.q_row0 * p.do_rs : b * p.do_bs) + head * p.do_hs + c;
    const int64_t split_stride = dq_split_stride(p);
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = blockIdx.x * kPrepRows + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        const int64_t r = static_cast<int64_t>(head) * p.total_rows + si.q_row0 + qpos;
        float s = 0.f;
        if (c < d) {
            const uint4 o4 = *reinterpret_cast<const uint4 *>(og + qpos * p.o_rs);
            const uint4 do4 = *reinterpret_cast<const uint4 *>(dog + qpos * p.do_rs);
            s = dot8<E>(o4, do4);
            float *acc = p.dq_accum + dq_pair_offset(p, head, b, si.q_row0, qpos, c);
            for (int sp = 0; sp < p.dq_splits; ++sp) {
                if (p.dq_frag) {  // the 8 columns are 4 pairs, 4 floats apart (dq_accum.cuh)
#pragma unroll
                    for (int k = 0; k < 4; ++k) *reinterpret_cast<float2 *>(acc + 4 * k) = make_float2(0.f, 0.f);
                } else {
                    reinterpret_cast<float4 *>(acc)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
                    reinterpret_cast<float4 *>(acc)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
                acc += split_stride;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) p.row_dot[r] = s;
    }
}

template <class P, class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_convert_dq_kernel(const __grid_constant__ P p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const SeqInfo si = seq_info(p, b);
    const bool varlen = p.cu_q != nullptr;
    const int d = p.head_dim;
    const int c = lane * 8;
    if (c >= d) return;
    uint16_t *dqg = static_cast<uint16_t *>(p.dq) + (varlen ? si.q_row0 * p.dq_rs : b * p.dq_bs) +
                    head * p.dq_hs + c;
    const int64_t split_stride = dq_split_stride(p);
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = blockIdx.x * kPrepRows + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        const float *acc = p.dq_accum + dq_pair_offset(p, head, b, si.q_row0, qpos, c);
        float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < p.dq_splits; ++sp) {  // fixed order: bitwise reproducible
            if (p.dq_frag) {  // 4 pairs, 4 floats apart (dq_accum.cuh)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float2 x = *reinterpret_cast<const float2 *>(acc + 4 * k);
                    a[2 * k] += x.x, a[2 * k + 1] += x.y;
                }
            } else {
                const float4 x0 = reinterpret_cast<const float4 *>(acc)[0], x1 = reinterpret_cast<const float4 *>(acc)[1];
                a[0] += x0.x, a[1] += x0.y, a[2] += x0.z, a[3] += x0.w;
                a[4] += x1.x, a[5] += x1.y, a[6] += x1.z, a[7] += x1.w;
            }
            acc += split_stride;
        }
        uint4 out;
        out.x = pack2<E>(a[0] * p.scale, a[1] * p.scale);
        out.y = pack2<E>(a[2] * p.scale, a[3] * p.scale);
        out.z = pack2<E>(a[4] * p.scale, a[5] * p.scale);
        out.w = pack2<E>(a[6] * p.scale, a[7] * p.scale);
        st_global_v4(dqg + qpos * p.dq_rs, out);
    }
}

template <class P>
dim3 prep_grid(const P &p) {
    return dim3(static_cast<unsigned>((p.seqlen_q + kPrepRows - 1) / kPrepRows), static_cast<unsigned>(p.heads_q),
                static_cast<unsigned>(p.batch));
}

// Enqueue the preprocess / the dQ convert for the backward of `p` (16-bit element type by `bf16`).
template <class P>
cudaError_t launch_bwd_preprocess(const P &p, bool bf16, cudaStream_t s) {
    if (bf16)
        bwd_preprocess_kernel<P, Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    else
        bwd_preprocess_kernel<P, Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    return cudaSuccess;
}

template <class P>
cudaError_t launch_bwd_convert_dq(const P &p, bool bf16, cudaStream_t s) {
    if (bf16)
        bwd_convert_dq_kernel<P, Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    else
        bwd_convert_dq_kernel<P, Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace flashattn
