// Merge of partial attention states: O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s).
// One kernel serves FA2's split-KV combine (fp32 partials in the workspace) and the public
// flashattn_plan_merge_states (fp32, fp16 or bf16 partials laid out as the plan's O, on the plans
// of every GPU generation: dispatch.cpp). One warp per (query row, head); a lane owns 8 columns
// (head_dim_v <= 256) of a share of the partials (merge_kernel), so every partial row is read with
// 16-byte loads once and O written once: the kernel is bandwidth-bound. Rows -inf in every partial get O = 0 and LSE = -inf. A NaN
// partial LSE (a NaN reached the row in that partial) makes the row's O and LSE NaN: fmaxf would
// drop it, and a row NaN in every partial then came out as a fully masked one.
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {
namespace {

constexpr int kMergeWarps = 4;

// Eight consecutive partial values, loaded raw (16-byte aligned: strides are multiples of 8
// elements): two 16-byte words for fp32, one for fp16/bf16. They are converted to fp32 only where
// used (to_float8), so that no conversion waits for a load that is meant to stay in flight.
// (In: float, or the tag types cuda::Fp16 / cuda::Bf16 of 16-bit elements.)
template <class In>
struct Raw8 {
    static constexpr bool kFp32 = std::is_same_v<In, float>;
    static constexpr int kWords = kFp32 ? 2 : 1;
    uint4 w[kWords];
};

template <class In>
__device__ __forceinline__ void load_raw8(const void *base, int64_t offset, Raw8<In> &r) {
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const char *>(base) +
                                                       offset * (Raw8<In>::kFp32 ? 4 : 2));
#pragma unroll
    for (int i = 0; i < Raw8<In>::kWords; ++i) r.w[i] = src[i];
}

template <class In>
__device__ __forceinline__ void zero_raw8(Raw8<In> &r) {
#pragma unroll
    for (int i = 0; i < Raw8<In>::kWords; ++i) r.w[i] = make_uint4(0u, 0u, 0u, 0u);
}

template <class In>
__device__ __forceinline__ void to_float8(const Raw8<In> &r, float (&x)[8]) {
    if constexpr (Raw8<In>::kFp32) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            x[4 * i] = __uint_as_float(r.w[i].x), x[4 * i + 1] = __uint_as_float(r.w[i].y);
            x[4 * i + 2] = __uint_as_float(r.w[i].z), x[4 * i + 3] = __uint_as_float(r.w[i].w);
        }
    } else {
        const uint32_t w[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (std::is_same_v<In, cuda::Bf16>) {
                x[2 * i] = __uint_as_float(w[i] << 16);
                x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                const __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
                const float2 f = __half22float2(h);
                x[2 * i] = f.x;
                x[2 * i + 1] = f.y;
            }
        }
    }
}

// The weight e^(LSE_s - lse) of partial s: from lane s's register when there are at most 32
// partials (every lane calls this: it is a shuffle), else read again (an L1 hit).
__device__ __forceinline__ float partial_weight(const MergeParams &p, int64_t li, int s, float lse, float w_lane) {
    const int S = p.num_partials;
    const float w = __shfl_sync(0xffffffffu, w_lane, min(s, S - 1) & 31);
    if (S <= 32) return s < S ? w : 0.f;
    return s < S ? expf(p.lse_part[s][li] - lse) : 0.f;
}

constexpr int kUnroll = 4;  // partials a lane loads before it uses any

// Loads the lane's 8 columns of partials s0, s0 + step, ... (kUnroll of them; zeros past the last
// partial and for lanes past the head dim).
template <class In>
__device__ __forceinline__ void load_chunk(const MergeParams &p, int64_t po, int s0, int step, bool cols,
                                           Raw8<In> (&x)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
        const int s = s0 + u * step;
        if (cols && s < p.num_partials)
            load_raw8<In>(p.o_part[s], po, x[u]);
        else
            zero_raw8<In>(x[u]);
    }
}

// A warp merges one row. Lane l owns columns 8*(l % L) .. +7, L = the lanes a row's columns need
// (a power of two: 8 up to head dim 64, 16 up to 128, 32 up to 256); the warp's 32 / L lane
// groups split the partials (group q takes s = q, q + 32/L, ...) and add theirs up through
// shuffles at the end, so that every lane has loads in flight: with one lane per 8 columns, half
// the warp idled at head dim 128 and each lane waited for one partial's load after the other.
// The first kUnroll partials' O are loaded before the LSEs are known, so that a row costs one
// memory round trip, not two (LSEs, then O: the merge of 8 bf16 partials ran at 0.54 of copy
// bandwidth so, H200); a partial that turns out not to contribute (weight 0) is selected away, not
// multiplied, so whatever its O holds (an empty split's is unwritten) cannot reach the output.
template <class In, class Out>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const __grid_constant__ MergeParams p) {
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * kMergeWarps + warp;
    const int head = blockIdx.y;
    const int b = blockIdx.z;
    if (row >= p.rows) return;
    const int S = p.num_partials;
    const int64_t li = b * p.l_bs + head * p.l_hs + row;

    // Lanes per row: the power of two covering head_dim / 8 columns groups (8 at least).
    const int need = (p.head_dim + 7) / 8;
    const int L = need <= 8 ? 8 : need <= 16 ? 16 : 32;
    const int groups = 32 / L;
    const int group = lane / L;
    const int c = (lane % L) * 8;
    const bool cols = c < p.head_dim;
    const int64_t po = b * p.p_bs + row * p.p_rs + head * p.p_hs + c;
    Raw8<In> x[kUnroll];
    load_chunk<In>(p, po, group, groups, cols, x);

    float mx = -INFINITY;
    bool nan = false;
    const float x_lane = lane < S ? p.lse_part[lane][li] : -INFINITY;
    nan = x_lane != x_lane;
    mx = fmaxf(mx, x_lane);
    for (int s = lane + 32; s < S; s += 32) {
        const float v = p.lse_part[s][li];
        nan = nan || v != v;
        mx = fmaxf(mx, v);
    }
    nan = __any_sync(0xffffffffu, nan);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    if (mx != -INFINITY) {
        sum = lane < S ? expf(x_lane - mx) : 0.f;
        for (int s = lane + 32; s < S; s += 32) sum += expf(p.lse_part[s][li] - mx);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float lse = nan ? NAN : sum == 0.f ? -INFINITY : mx + logf(sum);
    const float w_lane = lane < S && lse != -INFINITY && !nan ? expf(x_lane - lse) : 0.f;

    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (!nan && lse != -INFINITY) {
        for (int s0 = group;;) {  // warp-uniform trip count: s0 - group is the same in every group
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const float w = partial_weight(p, li, s0 + u * groups, lse, w_lane);
                float v[8];
                to_float8<In>(x[u], v);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[i] = w != 0.f ? fmaf(w, v[i], acc[i]) : acc[i];
            }
            s0 += kUnroll * groups;
            if (s0 - group >= S) break;
            load_chunk<In>(p, po, s0, groups, cols, x);
        }
        for (int o = 16; o >= L; o >>= 1)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    }
    if (nan)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = NAN;
    if (group == 0 && cols) {
        uint4 out;
        out.x = cuda::pack2<Out>(acc[0], acc[1]);
        out.y = cuda::pack2<Out>(acc[2], acc[3]);
        out.z = cuda::pack2<Out>(acc[4], acc[5]);
        out.w = cuda::pack2<Out>(acc[6], acc[7]);
        uint16_t *og = static_cast<uint16_t *>(p.o) + b * p.o_bs + row * p.o_rs + head * p.o_hs + c;
        cuda::st_global_v4(og, out);  // a uint4 assignment through og compiled to four 4-byte stores
    }
    if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_bs + head * p.lse_hs + row] = lse;
}

template <class Out>
cudaError_t launch_for_output(const MergeParams &p, MergeInput in, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>((p.rows + kMergeWarps - 1) / kMergeWarps), static_cast<unsigned>(p.heads),
                    static_cast<unsigned>(p.batch));
    switch (in) {
        case MergeInput::fp32: merge_kernel<float, Out><<<grid, kMergeWarps * 32, 0, stream>>>(p); break;
        case MergeInput::fp16: merge_kernel<cuda::Fp16, Out><<<grid, kMergeWarps * 32, 0, stream>>>(p); break;
        case MergeInput::bf16: merge_kernel<cuda::Bf16, Out><<<grid, kMergeWarps * 32, 0, stream>>>(p); break;
    }
    return cudaSuccess;
}

}  // namespace

cudaError_t launch_merge_states(const MergeParams &p, MergeInput in, bool bf16_out, cudaStream_t stream) {
    return bf16_out ? launch_for_output<cuda::Bf16>(p, in, stream) : launch_for_output<cuda::Fp16>(p, in, stream);
}

// The split-KV combine: partials [splits][heads_q][total_rows][head_dim] fp32 in the workspace,
// rows of sequence b at b * seqlen_q (fixed length) or packed (varlen: one "batch" of total_q rows).
cudaError_t launch_merge(const Params &p, bool bf16, cudaStream_t stream) {
    MergeParams m;
    const bool varlen = p.cu_q != nullptr;
    const int64_t split_stride = static_cast<int64_t>(p.heads_q) * p.total_rows;
    m.num_partials = p.num_splits;
    for (int s = 0; s < p.num_splits; ++s) {
        m.o_part[s] = p.o_part + s * split_stride * p.head_dim_v;
        m.lse_part[s] = p.lse_part + s * split_stride;
    }
    m.batch = varlen ? 1 : p.batch;
    m.rows = varlen ? static_cast<int32_t>(p.total_rows) : p.seqlen_q;
    m.heads = p.heads_q;
    m.head_dim = p.head_dim_v;
    m.p_bs = static_cast<int64_t>(p.seqlen_q) * p.head_dim_v;
    m.p_rs = p.head_dim_v;
    m.p_hs = p.total_rows * p.head_dim_v;
    m.l_bs = p.seqlen_q;
    m.l_hs = p.total_rows;
    m.o = p.o;
    m.o_bs = varlen ? 0 : p.o_bs;
    m.o_rs = p.o_rs;
    m.o_hs = p.o_hs;
    m.lse = p.lse;
    m.lse_bs = varlen ? 0 : static_cast<int64_t>(p.heads_q) * p.seqlen_q;
    m.lse_hs = varlen ? p.total_rows : p.seqlen_q;
    return launch_merge_states(m, MergeInput::fp32, bf16, stream);
}

}  // namespace fa2
}  // namespace flashattn
