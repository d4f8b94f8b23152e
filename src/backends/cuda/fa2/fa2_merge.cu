// Merge of partial attention states: O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s).
// One kernel serves FA2's split-KV combine (fp32 partials in the workspace) and the public
// flashattn_plan_merge_states (fp32, fp16 or bf16 partials laid out as the plan's O, on the plans
// of every GPU generation: dispatch.cpp). One warp per (query row, head); a lane owns 8 columns
// (head_dim_v <= 256) of a share of the partials (merge_kernel), so every partial row is read with
// 16-byte loads once and O written once: the kernel is bandwidth-bound. Rows -inf in every partial get O = 0 and LSE = -inf. A NaN
// partial LSE (a NaN reached the row in that partial) makes the row's O and LSE NaN: fmaxf would
// drop it, and a row NaN in every partial then came out as a fully masked one.
#include <climits>
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/pdl.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_combine.cuh"
#include "backends/cuda/fa2/fa2_params.h"

namespace flashattn {
namespace fa2 {
namespace {

constexpr int kMergeWarps = 4;

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

    const float x_lane = lane < S ? p.lse_part[lane][li] : -INFINITY;
    bool nan = x_lane != x_lane;
    float mx = fmaxf(-INFINITY, x_lane);
    for (int s = lane + 32; s < S; s += 32) {
        const float v = p.lse_part[s][li];
        nan = nan || v != v;
        mx = fmaxf(mx, v);
    }
    const float lse = warp_lse(mx, nan, [&](float m) {
        float sum = lane < S ? expf(x_lane - m) : 0.f;
        for (int s = lane + 32; s < S; s += 32) sum += expf(p.lse_part[s][li] - m);
        return sum;
    });
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

// The split-KV combine, a kernel of its own (the one above serves flashattn_plan_merge_states):
// fp32 partials [splits][heads_q][total_rows][head_dim] in the workspace, rows of sequence b at
// b * seqlen_q (fixed length) or packed (varlen: one "batch" of total_rows rows). One CTA of 8
// warps per (row, head): every warp reduces the split LSEs (one load per lane and 32 splits),
// then warp w sums splits w, w + 8, ... four at a time (their 16-byte loads in flight together),
// and warp 0 adds the eight sums in a fixed order; each warp's first four partials are loaded
// together with the LSEs. The first version, one warp walking every
// split in turn, was a chain of dependent L2 round trips: 21 µs of a 51 µs decode step at b 1 /
// 32k keys (29 splits, ncu). Same rules as merge_kernel for -inf rows, NaN and empty splits.
namespace {

constexpr int kCombineWarps = 8;
constexpr int kCombineBatch = 4;  // partial rows each warp has in flight
static_assert(kMaxMergePartials <= 4 * 32 && kMaxMergePartials <= kCombineWarps * 16, "the combine's split bound");

template <class Out>
__global__ void __launch_bounds__(kCombineWarps * 32) split_combine_kernel(const __grid_constant__ SplitCombineParams p) {
    __shared__ float4 sums[kCombineWarps][32][2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
    cuda::pdl_wait();  // the partials come from the attention kernel just before
    const int S = p.splits;
    const int c = lane * 8;
    const bool col_ok = c < p.head_dim;
    const float *po = p.o_part + b * p.p_bs + row * p.p_rs + head * p.p_hs + c;
    // This warp's first kCombineBatch partials go out with the LSEs (one round trip instead of an
    // LSE round trip and then the partials'): read whatever the split wrote or not, and used only
    // where its weight is not 0 (an empty split's partial is unwritten).
    Raw8<float> first[kCombineBatch];
#pragma unroll
    for (int j = 0; j < kCombineBatch; ++j)
        if (warp + kCombineWarps * j < S && col_ok) load_raw8<float>(po, (warp + kCombineWarps * j) * p.o_split, first[j]);
    const float *ls = p.lse_part + b * p.l_bs + head * p.l_hs + row;
    float x[4];  // LSE of split lane + 32 i
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = lane + 32 * i < S ? ls[(lane + 32 * i) * p.l_split] : -INFINITY;
    float mx = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        nan = nan || x[i] != x[i];
        mx = fmaxf(mx, x[i]);
    }
    const float lse = warp_lse(mx, nan, [&](float m) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) sum += expf(x[i] - m);
        return sum;
    });

    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (!nan && lse != -INFINITY) {
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += kCombineBatch) {
            if (warp + kCombineWarps * k0 >= S) break;  // uniform
            float w[kCombineBatch], v[kCombineBatch][8];
#pragma unroll
            for (int j = 0; j < kCombineBatch; ++j) {
                const int k = k0 + j, s = warp + kCombineWarps * k;  // s / 32 == k / 4, s % 32 below
                const float lse_s = __shfl_sync(0xffffffffu, x[k / 4], warp + kCombineWarps * (k % 4));
                w[j] = s < S ? expf(lse_s - lse) : 0.f;
                // w == 0: an empty split's partial is unwritten: its values (the first batch reads them) are not used.
                if (w[j] != 0.f && col_ok) {
                    if (k0 == 0) {
                        to_float8<float>(first[j], v[j]);
                    } else {
                        Raw8<float> raw;
                        load_raw8<float>(po, s * p.o_split, raw);
                        to_float8<float>(raw, v[j]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) v[j][e] = 0.f;
                }
            }
#pragma unroll
            for (int j = 0; j < kCombineBatch; ++j)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = fmaf(w[j], v[j][e], acc[e]);
        }
    } else if (nan) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = NAN;
    }
    sums[warp][lane][0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    sums[warp][lane][1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    __syncthreads();
    if (warp != 0) return;
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = 0.f;
#pragma unroll
    for (int wi = 0; wi < kCombineWarps; ++wi) {  // fixed order: bitwise reproducible
        const float4 a = sums[wi][lane][0], q = sums[wi][lane][1];
        out[0] += a.x, out[1] += a.y, out[2] += a.z, out[3] += a.w;
        out[4] += q.x, out[5] += q.y, out[6] += q.z, out[7] += q.w;
    }
    if (nan)
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = NAN;
    store_combined_row<Out>(p, b, row, head, c, col_ok, out, lane == 0, lse);
}

// At most kWarpSplits splits (fa2_combine.cuh, combine_row_by_warp): one warp per (row, head),
// kWarpCombineWarps rows per CTA of 128 threads (~12K registers), small enough to be resident
// beside two decode attention CTAs (46K registers) when the PDL wait releases it (the
// CTA-per-row kernel's 256 CTAs of 256 threads at b 8 fit one per SM there, so half of them could
// launch only as attention CTAs exited).
constexpr int kWarpCombineWarps = 4;

template <class Out>
__global__ void __launch_bounds__(kWarpCombineWarps * 32) split_combine_warp_kernel(const __grid_constant__ SplitCombineParams p) {
    const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarpCombineWarps + (threadIdx.x >> 5);
    cuda::pdl_wait();  // the partials come from the attention kernel just before
    if (unit >= p.rows * p.heads * p.batch) return;
    const int64_t row = unit % p.rows;
    const int64_t head = unit / p.rows % p.heads, b = unit / (p.rows * p.heads);
    combine_row_by_warp<Out>(p, b, row, head, threadIdx.x & 31);
}

int64_t warp_combine_ctas(int64_t units) { return (units + kWarpCombineWarps - 1) / kWarpCombineWarps; }

}  // namespace

bool warp_combine_fits(int splits, int64_t units) {
    return splits <= kWarpSplits && warp_combine_ctas(units) <= INT_MAX;
}

cudaError_t launch_merge(const Params &p, bool bf16, bool by_warps, bool pdl, cudaStream_t stream) {
    const SplitCombineParams m = split_combine_params(p);
    if (by_warps) {
        const dim3 grid(static_cast<unsigned>(warp_combine_ctas(m.rows * m.heads * m.batch))), block(kWarpCombineWarps * 32);
        return bf16 ? cuda::launch_kernel(pdl, split_combine_warp_kernel<cuda::Bf16>, grid, block, 0, stream, m)
                    : cuda::launch_kernel(pdl, split_combine_warp_kernel<cuda::Fp16>, grid, block, 0, stream, m);
    }
    const dim3 block(kCombineWarps * 32);
    const dim3 grid(static_cast<unsigned>(m.rows), static_cast<unsigned>(p.heads_q), static_cast<unsigned>(m.batch));
    return bf16 ? cuda::launch_kernel(pdl, split_combine_kernel<cuda::Bf16>, grid, block, 0, stream, m)
                : cuda::launch_kernel(pdl, split_combine_kernel<cuda::Fp16>, grid, block, 0, stream, m);
}

}  // namespace fa2
}  // namespace flashattn
