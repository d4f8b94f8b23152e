// The split-KV combine's pieces shared by its kernels (fa2_merge.cu) and by the decode tiles that
// combine their own rows (fa2_fwd_kernel.cuh, fold_split_combine): the partials' raw 16-byte
// loads, the combine's view of the workspace partials and the output (SplitCombineParams, built
// from the forward's Params on either side), and one warp combining one (row, head).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {

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

// fp32 partials [splits][heads_q][total_rows][head_dim] in the workspace, rows of sequence b at
// b * seqlen_q (fixed length) or packed (varlen: one "batch" of total_rows rows).
struct SplitCombineParams {
    const float *o_part = nullptr, *lse_part = nullptr;
    int64_t o_split = 0, l_split = 0;  // elements between the splits' partials
    int64_t p_bs = 0, p_rs = 0, p_hs = 0, l_bs = 0, l_hs = 0;
    void *o = nullptr;
    float *lse = nullptr;
    int64_t o_bs = 0, o_rs = 0, o_hs = 0, lse_bs = 0, lse_hs = 0;
    int32_t splits = 0, head_dim = 0;
    int64_t rows = 0;  // the grid's extents: rows x heads x batch (rows) of the warp kernel
    int32_t heads = 0, batch = 0;
};

__host__ __device__ inline SplitCombineParams split_combine_params(const Params &p) {
    SplitCombineParams m;
    const bool varlen = p.cu_q != nullptr;
    const int64_t split_stride = static_cast<int64_t>(p.heads_q) * p.total_rows;
    m.o_part = p.o_part;
    m.lse_part = p.lse_part;
    m.o_split = split_stride * p.head_dim_v;
    m.l_split = split_stride;
    m.splits = p.num_splits;
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
    m.rows = varlen ? p.total_rows : p.seqlen_q;
    m.heads = p.heads_q;
    m.batch = varlen ? 1 : p.batch;
    return m;
}

// A combined row: the lane's 8 columns of O (when they are within the head dim) and, from one
// lane, the row's LSE.
template <class Out>
__device__ __forceinline__ void store_combined_row(const SplitCombineParams &p, int64_t b, int64_t row, int64_t head,
                                                   int c, bool col_ok, const float (&o)[8], bool lse_lane, float lse) {
    if (col_ok) {
        uint4 u;
        u.x = cuda::pack2<Out>(o[0], o[1]);
        u.y = cuda::pack2<Out>(o[2], o[3]);
        u.z = cuda::pack2<Out>(o[4], o[5]);
        u.w = cuda::pack2<Out>(o[6], o[7]);
        cuda::st_global_v4(static_cast<uint16_t *>(p.o) + b * p.o_bs + row * p.o_rs + head * p.o_hs + c, u);
    }
    if (lse_lane && p.lse != nullptr) p.lse[b * p.lse_bs + head * p.lse_hs + row] = lse;
}

// The LSE of one row's partials, held by a warp: each lane passes the max and the NaN test of the
// partial LSEs it holds (-inf past the count; nan comes back as the warp's) and lane_sum(m), its
// sum of e^(LSE - m) for the warp's max m (called only when m is finite). NaN when any partial is
// NaN, -inf when none has a key. Every combine (the public merge, the split-KV combine kernels,
// the decode tiles' own combine) reduces in this order, so the LSEs they write agree bitwise.
template <class LaneSum>
__device__ __forceinline__ float warp_lse(float mx, bool &nan, const LaneSum &lane_sum) {
    nan = __any_sync(0xffffffffu, nan);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = mx != -INFINITY ? lane_sum(mx) : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return nan ? NAN : sum == 0.f ? -INFINITY : mx + logf(sum);
}

// At most kWarpSplits splits (b 8 decode on 132 SMs takes 4): one warp per (row, head), its lanes
// holding every partial's 8 columns and one split's LSE each, all loaded in one round trip; no
// shared memory and no CTA barrier. -inf rows, NaN and empty splits as split_combine_kernel's
// (fa2_merge.cu); the sum runs in split order.
constexpr int kWarpSplits = 8;

template <class Out>
__device__ __forceinline__ void combine_row_by_warp(const SplitCombineParams &p, int64_t b, int64_t row,
                                                    int64_t head, int lane) {
    const int S = p.splits;
    const int c = lane * 8;
    const bool col_ok = c < p.head_dim;
    const float *po = p.o_part + b * p.p_bs + row * p.p_rs + head * p.p_hs + c;
    Raw8<float> part[kWarpSplits];
#pragma unroll
    for (int s = 0; s < kWarpSplits; ++s) {
        if (s < S && col_ok)
            load_raw8<float>(po, s * p.o_split, part[s]);
        else
            zero_raw8<float>(part[s]);
    }
    const float x = lane < S ? p.lse_part[b * p.l_bs + head * p.l_hs + row + lane * p.l_split] : -INFINITY;
    bool nan = x != x;
    const float lse = warp_lse(x, nan, [&](float m) { return expf(x - m); });  // (0 past S: x = -inf)
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (!nan && lse != -INFINITY) {
#pragma unroll
        for (int s = 0; s < kWarpSplits; ++s) {
            if (s >= S) break;  // uniform
            const float w = expf(__shfl_sync(0xffffffffu, x, s) - lse);
            // w == 0: an empty split's partial is unwritten: selected away, never multiplied.
            float v[8];
            to_float8<float>(part[s], v);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = w != 0.f ? fmaf(w, v[e], acc[e]) : acc[e];
        }
    } else if (nan) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = NAN;
    }
    store_combined_row<Out>(p, b, row, head, c, col_ok, acc, lane == 0, lse);
}

}  // namespace fa2
}  // namespace flashattn
