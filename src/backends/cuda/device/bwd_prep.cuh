// The two small kernels around every generation's backward main kernel (FA2: fa2_bwd_kernel.cuh,
// FA3: fa3_bwd_kernel.cuh), shared so that both run the same D and the same dQ rounding:
//   preprocess: row_dot = rowsum(dO * O) in fp32 (FlashAttention-2's D_i) and zero every copy of
//               the fp32 dQ accumulator (the main kernel only adds into it);
//   convert:    dQ = scale * (sum of the accumulator's copies, in copy order) in the input dtype.
// A CTA owns kPrepRows query rows of one (sequence, query head). For O, dO and dQ one warp takes a
// row at a time: lane c owns the 8 columns 8c..8c+7 (head_dim <= 256), 16-byte loads and stores
// (dO, O, dQ strides are multiples of 8 elements, checked by the host). The accumulator rows of a
// CTA are one contiguous span in both layouts (accum_span), so the preprocess zeroes it as a flat
// run of 16-byte stores, and FA2's fragment-order convert reads each 16 x 8 half of it as one
// float4 per lane (512 contiguous bytes per warp) and transposes through shared memory to dQ's
// rows. Until stop 22 both addressed the fragment order per dQ row, as four 8-byte pieces 16 bytes
// apart (a quarter of each 32-byte sector per instruction; docs/kernel-notes.md "FA2 backward").
// Rows of every sequence are covered: the grid is (query blocks of the longest sequence, heads_q,
// batch) and CTAs past a sequence's end return.
//
// And the sink logits' gradient (bwd_sink_grad_kernel), from the LSE and the preprocess's D.
// Templates on the caller's parameter struct P: a TensorArgs with the backward fields dout, dq,
// do_*/dq_* strides, row_dot, dq_accum, dq_frag, dq_rows, dq_splits and scale (fa2::BwdParams,
// fa3::BwdParams). Everything sits in an unnamed namespace: each generation's unit instantiates
// its own copy.
#pragma once

#include <cmath>
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

// The accumulator rows of query rows [r0, r0 + kPrepRows) of sequence si (index b), query head
// `head`, clipped to the sequence: one contiguous span in both layouts (dq_accum.cuh); in fragment
// order whole 16-row blocks, the last one's padding rows included (they belong to no other
// sequence: dq_frag_row0).
struct AccumSpan {
    int64_t begin;  // floats from dq_accum
    int floats;     // a multiple of 32 (fragment order) or of 8 (row-major)
};

template <class P>
__device__ __forceinline__ AccumSpan accum_span(const P &p, int head, int b, const SeqInfo &si, int r0) {
    if (p.dq_frag) {
        const int dcols = dq_frag_cols(p.head_dim);
        const int rows = min(kPrepRows, ((si.sq + 15) & ~15) - r0);
        return AccumSpan{(static_cast<int64_t>(head) * p.dq_rows + dq_frag_row0(si.q_row0, b) + r0) * dcols,
                         rows * dcols};
    }
    const int rows = min(kPrepRows, si.sq - r0);
    return AccumSpan{(static_cast<int64_t>(head) * p.total_rows + si.q_row0 + r0) * p.head_dim, rows * p.head_dim};
}

template <class P, class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_preprocess_kernel(const __grid_constant__ P p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const SeqInfo si = seq_info(p, b);
    const int r0 = blockIdx.x * kPrepRows;
    if (r0 >= si.sq) return;
    const bool varlen = p.cu_q != nullptr;
    const int dv = p.head_dim_v;  // D_i = dO_i . O_i over V's width
    const int c = lane * 8;
    const uint16_t *og = static_cast<const uint16_t *>(p.o) + (varlen ? si.q_row0 * p.o_rs : b * p.o_bs) +
                         head * p.o_hs + c;
    const uint16_t *dog = static_cast<const uint16_t *>(p.dout) +
                          (varlen ? si.q_row0 * p.do_rs : b * p.do_bs) + head * p.do_hs + c;
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = r0 + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        float s = 0.f;
        if (c < dv) {
            const uint4 o4 = *reinterpret_cast<const uint4 *>(og + qpos * p.o_rs);
            const uint4 do4 = *reinterpret_cast<const uint4 *>(dog + qpos * p.do_rs);
            s = dot8<E>(o4, do4);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) p.row_dot[static_cast<int64_t>(head) * p.total_rows + si.q_row0 + qpos] = s;
    }
    const AccumSpan span = accum_span(p, head, b, si, r0);
    float4 *acc = reinterpret_cast<float4 *>(p.dq_accum + span.begin);
    const int64_t split_stride4 = dq_split_stride(p) / 4;  // a multiple of 4 floats in both layouts
    for (int sp = 0; sp < p.dq_splits; ++sp, acc += split_stride4)
        for (int i = threadIdx.x; i < span.floats / 4; i += kPrepWarps * 32) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// The row-major convert (FA3): each lane sums its two 16-byte vectors of a row over the copies.
template <class P, class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_convert_dq_kernel(const __grid_constant__ P p) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const SeqInfo si = seq_info(p, b);
    const int r0 = blockIdx.x * kPrepRows;
    const int d = p.head_dim;
    const int c = lane * 8;
    if (r0 >= si.sq || c >= d) return;
    const bool varlen = p.cu_q != nullptr;
    uint16_t *dqg = static_cast<uint16_t *>(p.dq) + (varlen ? si.q_row0 * p.dq_rs : b * p.dq_bs) +
                    head * p.dq_hs + c;
    const float *acc0 = p.dq_accum + accum_span(p, head, b, si, r0).begin + c;
    const int64_t split_stride = dq_split_stride(p);
    for (int i = 0; i < kPrepRowsPerWarp; ++i) {
        const int qpos = r0 + i * kPrepWarps + warp;
        if (qpos >= si.sq) break;
        const float *acc = acc0 + static_cast<int64_t>(qpos - r0) * d;
        float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < p.dq_splits; ++sp) {  // fixed order: bitwise reproducible
            const float4 x0 = reinterpret_cast<const float4 *>(acc)[0], x1 = reinterpret_cast<const float4 *>(acc)[1];
            a[0] += x0.x, a[1] += x0.y, a[2] += x0.z, a[3] += x0.w;
            a[4] += x1.x, a[5] += x1.y, a[6] += x1.z, a[7] += x1.w;
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

// The fragment-order convert (FA2): the CTA's rows are whole 16-row blocks of the accumulator,
// each 16 x 8 half 128 contiguous floats, one float4 per lane in m16n8 accumulator order (lane
// 4g + t: rows g and g + 8, columns 2t and 2t + 1). A warp takes one half at a time (coalesced
// 512-byte loads), scales and narrows it into a shared [row][column] tile, then the CTA writes
// the tile out as 16-byte row pieces. The per-element sum over copies is the row-major kernel's
// (copy order, from 0.f), so dQ is bitwise what the per-row form gave.
constexpr int kConvertMaxPitch = 256 + 8;  // the tile's row pitch at head_dim 256 (rows use d + 8: 16 bytes of pad)
template <class P, class E>
__global__ void __launch_bounds__(kPrepWarps * 32) bwd_convert_dq_frag_kernel(const __grid_constant__ P p) {
    __shared__ __align__(16) uint16_t tile[kPrepRows * kConvertMaxPitch];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int head = blockIdx.y, b = blockIdx.z;
    const SeqInfo si = seq_info(p, b);
    const int r0 = blockIdx.x * kPrepRows;
    if (r0 >= si.sq) return;
    const int d = p.head_dim, pitch = d + 8;  // (d / 2 + 4) words a row: the lanes' stores miss each other's banks
    const int halves = d / 8;  // d is a multiple of 8: a half is all in or all out
    const int rows = min(kPrepRows, si.sq - r0);
    const int dcols = dq_frag_cols(d);
    const float *acc0 = p.dq_accum + accum_span(p, head, b, si, r0).begin + lane * 4;
    const int64_t split_stride = dq_split_stride(p);
    const int g = lane >> 2, t = lane & 3;
    const int items = (rows + 15) / 16 * halves;
    for (int i = warp; i < items; i += kPrepWarps) {
        const int rb = i / halves, h = i - rb * halves;
        const float *acc = acc0 + rb * 16 * dcols + h * 128;
        float a[4] = {0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < p.dq_splits; ++sp) {  // fixed order: bitwise reproducible
            const float4 x = *reinterpret_cast<const float4 *>(acc);
            a[0] += x.x, a[1] += x.y, a[2] += x.z, a[3] += x.w;
            acc += split_stride;
        }
        uint16_t *s = tile + (rb * 16 + g) * pitch + 8 * h + 2 * t;
        *reinterpret_cast<uint32_t *>(s) = pack2<E>(a[0] * p.scale, a[1] * p.scale);
        *reinterpret_cast<uint32_t *>(s + 8 * pitch) = pack2<E>(a[2] * p.scale, a[3] * p.scale);
    }
    __syncthreads();
    const bool varlen = p.cu_q != nullptr;
    uint16_t *dqg = static_cast<uint16_t *>(p.dq) + (varlen ? si.q_row0 * p.dq_rs : b * p.dq_bs) +
                    head * p.dq_hs + r0 * p.dq_rs;
    for (int v = threadIdx.x; v < rows * halves; v += kPrepWarps * 32) {
        const int r = v / halves, c = v - r * halves;
        st_global_v4(dqg + r * p.dq_rs + 8 * c, *reinterpret_cast<const uint4 *>(tile + r * pitch + 8 * c));
    }
}

// The sink logit's gradient (FLASHATTN_I64_SINK_LOGITS): its probability in row i is
// P_sink = e^(sink - LSE_i) and its value 0, so dS_sink = P_sink (0 - D_i) and dsink[h] sums that
// over the head's rows (rows with LSE = -inf saw neither keys nor a sink: none). The CPU backward's
// definition (cpu_backward.cpp sink_gradients). In double, each thread over a fixed stride of rows,
// then a fixed tree: bitwise reproducible, like the CPU's. Reads the preprocess's row_dot.
constexpr int kSinkThreads = 256;

template <class P>
__global__ void __launch_bounds__(kSinkThreads) bwd_sink_grad_kernel(const __grid_constant__ P p) {
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

// dsink[h] = -sum over h's rows of e^(sink[h] - LSE) * row_dot (one CTA per head, a fixed order),
// after the preprocess.
template <class P>
cudaError_t launch_bwd_sink_grad(const P &p, cudaStream_t s) {
    bwd_sink_grad_kernel<P><<<static_cast<unsigned>(p.heads_q), kSinkThreads, 0, s>>>(p);
    return cudaSuccess;
}

template <class P>
cudaError_t launch_bwd_convert_dq(const P &p, bool bf16, cudaStream_t s) {
    if (p.dq_frag) {
        if (bf16)
            bwd_convert_dq_frag_kernel<P, Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
        else
            bwd_convert_dq_frag_kernel<P, Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    } else if (bf16) {
        bwd_convert_dq_kernel<P, Bf16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    } else {
        bwd_convert_dq_kernel<P, Fp16><<<prep_grid(p), kPrepWarps * 32, 0, s>>>(p);
    }
    return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace flashattn
