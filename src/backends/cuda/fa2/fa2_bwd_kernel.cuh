// FlashAttention-2 backward main kernel for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async), and
// its launcher. Algorithm 2 of the FlashAttention-2 paper, key-block outer loop:
//
// One CTA per (key block of kB keys, kv head x 64-column slice, batch) (grid.x walks key blocks;
// in deterministic mode grid.x is the fixed number of dQ accumulator copies and each CTA walks key
// blocks x, x + gridDim.x, ...). It loads K_j and V_j once, then for every query head of the kv
// head's GQA group and every query block that sees any of its keys (in a fixed order):
//   load Q_i, dO_i; S = Q K^T and dP = dO V^T over the whole head dim (fa2_gemm.cuh's gemm_qk);
//   P = exp2(S' * score_log2 - LSE * log2 e) with S' the soft-capped score (tanh) when a cap is
//   set, 0 for masked keys (device/mask.cuh's rule) and for rows past the sequence;
//   dS = P (dP - row_dot) (x (1 - tanh^2) with a soft cap), packed to 16 bits;
//   dQ[:, slice] += dS K (fp32 atomics into the workspace accumulator, or plain adds into the
//   CTA's own copy in deterministic mode);
//   P and dS to shared memory; dV[:, slice] += P^T dO, dK[:, slice] += dS^T Q in registers.
// At the end dK * scale and dV are written (zeros for keys no query sees). The softmax scale of dQ
// is applied by the convert kernel (fa2_bwd_prep.cu). GQA needs no dK/dV reduction across CTAs:
// the CTA walks its whole query-head group. Nothing is pipelined (each step waits for its Q/dO
// loads): written for correctness first.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/fa2/fa2_bwd_gemm.cuh"
#include "backends/cuda/fa2/fa2_bwd_params.h"
#include "backends/cuda/fa2/fa2_gemm.cuh"
#include "backends/cuda/fa2/fa2_load.cuh"
#include "backends/cuda/host/smem_optin.h"

namespace flashattn {
namespace fa2 {

// What one key block's steps share (filled once per key block).
struct BwdBlockArgs {
    const uint16_t *qg, *dog;  // Q and dO of this sequence, row 0, head 0
    float *dqa;                // this CTA's dQ accumulator copy, [heads_q][total_rows][d]
    int64_t q_row0;            // packed row of the sequence's first query
    int b, sq, sk, off, n0, slice, d;
    uint32_t s_k;  // shared memory: K, V, Q, dO tiles, then the P and dS tiles (BwdTraits sizes)
};

// P and dS of this warp's 16 query rows (qrow0 = query position of row g) against the kB keys
// from n0, packed as m16k16 A fragments (n8 tiles 2k, 2k+1 -> fragment k, as softmax_step packs P).
template <class Tr, class E>
__device__ __forceinline__ void probs_and_grads(const BwdParams &p, const BwdBlockArgs &a, int hq, int qrow0,
                                                float (&S)[Tr::kNT][4], const float (&dP)[Tr::kNT][4],
                                                uint32_t (&P)[Tr::kKF][4], uint32_t (&dS)[Tr::kKF][4]) {
    const int t = threadIdx.x & 3;
    const float sl2 = p.score_log2, cap = p.softcap_scale;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int qpos = qrow0 + 8 * h;
        int lo = 0, hi = -1;  // visible keys of this row; none past the sequence's end
        float lse2 = 0.f, rd = 0.f;
        if (qpos < a.sq) {
            const float lse = p.lse[cuda::lse_offset(p, a.b, hq, a.q_row0, qpos)];
            rd = p.row_dot[static_cast<int64_t>(hq) * p.total_rows + a.q_row0 + qpos];
            if (lse != -INFINITY) {  // -inf: the row sees no key and contributes nothing
                lse2 = lse * 1.4426950408889634f;
                const int rdiag = qpos + a.off;
                lo = cuda::first_visible_key(rdiag, p.left_i);
                hi = cuda::last_visible_key(rdiag, p.right_i, a.sk);
            }
        }
        lo -= a.n0 + 2 * t;  // as column offsets from this thread's first column
        hi -= a.n0 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt) {
            float pv[2], dv[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + e;
                float x = S[nt][2 * h + e];
                if (cap != 0.f) x = cuda::tanh_accurate(x * cap);
                const float pr = (c >= lo && c <= hi) ? cuda::fast_exp2(fmaf(x, sl2, -lse2)) : 0.f;
                float ds = pr * (dP[nt][2 * h + e] - rd);
                if (cap != 0.f) ds *= 1.f - x * x;  // d(cap * tanh(raw * scale / cap)) / d(raw * scale)
                pv[e] = pr;
                dv[e] = ds;
            }
            P[nt >> 1][h + 2 * (nt & 1)] = cuda::pack2<E>(pv[0], pv[1]);
            dS[nt >> 1][h + 2 * (nt & 1)] = cuda::pack2<E>(dv[0], dv[1]);
        }
    }
}

// This warp's rows of P and dS into their [query row][key] tiles (for the transposed reads).
template <class Tr>
__device__ __forceinline__ void store_p_ds(uint32_t s_p, uint32_t s_ds, const uint32_t (&P)[Tr::kKF][4],
                                           const uint32_t (&dS)[Tr::kKF][4]) {
    using PT = typename Tr::PTile;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + h * 8 + g;
#pragma unroll
        for (int nt = 0; nt < Tr::kNT; ++nt) {
            const uint32_t off = PT::offset(r, nt) + 4 * t;
            cuda::st_shared_b32(s_p + off, P[nt >> 1][h + 2 * (nt & 1)]);
            cuda::st_shared_b32(s_ds + off, dS[nt >> 1][h + 2 * (nt & 1)]);
        }
    }
}

// dQ[:, slice] += dS K for this warp's query rows, 16 columns at a time, into the accumulator.
template <class Tr, class E>
__device__ __forceinline__ void accumulate_dq(const BwdParams &p, const BwdBlockArgs &a, int hq, int qrow0,
                                              const uint32_t (&dS)[Tr::kKF][4], uint32_t k_lane) {
    const int t = threadIdx.x & 3;
    const int ncols = a.d - a.slice * kBwdSliceCols;
    float *rows[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
        rows[h] = a.dqa + (static_cast<int64_t>(hq) * p.total_rows + a.q_row0 + qrow0 + 8 * h) * a.d +
                  a.slice * kBwdSliceCols + 2 * t;
#pragma unroll
    for (int j = 0; j < Tr::kSliceGroups; ++j) {
        if (j * 16 >= ncols) continue;
        float acc[2][4];
        gemm_ds_k<Tr, E>(acc, dS, k_lane, j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (qrow0 + 8 * h >= a.sq) continue;
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int c = j * 16 + n * 8;  // + 2t: d is a multiple of 8, so the pair is in or out
                if (c >= ncols) continue;
                float *dst = rows[h] + c;
                if (p.deterministic) {  // this CTA is the copy's only writer: a plain, ordered add
                    float2 v = *reinterpret_cast<float2 *>(dst);
                    v.x += acc[n][2 * h];
                    v.y += acc[n][2 * h + 1];
                    *reinterpret_cast<float2 *>(dst) = v;
                } else {
                    atomicAdd(dst, acc[n][2 * h]);
                    atomicAdd(dst + 1, acc[n][2 * h + 1]);
                }
            }
        }
    }
}

// One query block (rows m0..m0+kB-1 of query head hq) against the CTA's key block.
template <class Tr, class E>
__device__ __forceinline__ void bwd_query_block(const BwdParams &p, const BwdBlockArgs &a, int hq, int m0,
                                                float (&dK)[Tr::kSliceGroups][2][4],
                                                float (&dV)[Tr::kSliceGroups][2][4]) {
    using QT = typename Tr::QTile;
    using PT = typename Tr::PTile;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2;

    __syncthreads();  // every warp is done with the previous step's Q, dO, P and dS tiles
    bwd_load_tile<Tr>(a.s_k + 2 * Tr::kTileBytes, a.qg + hq * p.q_hs + static_cast<int64_t>(m0) * p.q_rs, p.q_rs, a.sq - m0, a.d);
    bwd_load_tile<Tr>(a.s_k + 3 * Tr::kTileBytes, a.dog + hq * p.do_hs + static_cast<int64_t>(m0) * p.do_rs, p.do_rs, a.sq - m0,
                      a.d);
    cuda::cp_async_commit();
    cuda::cp_async_wait<0>();  // also K and V at the first step
    __syncthreads();

    // ldmatrix lane bases (SwizzledTile): A-style rows lane%16 / chunk bit lane/16, B-style (K
    // read untransposed in gemm_qk) rows (lane%8) + 8*(lane/16) / chunk bit (lane/8)%2.
    // The bases go through opaque() (fa2_load.cuh) so that they are recomputed each step instead
    // of being hoisted, with every ldmatrix address derived from them, out of the query-block loop.
    const int lr_a = lane & 15, lb_a = lane >> 4;
    const int lr_k = (lane & 7) | ((lane >> 4) << 3), lb_k = (lane >> 3) & 1;
    const uint32_t page = static_cast<uint32_t>(a.slice) * QT::kPageBytes;
    const uint32_t s_k = opaque(a.s_k);
    const uint32_t s_v = s_k + Tr::kTileBytes, s_q = s_k + 2 * Tr::kTileBytes, s_do = s_k + 3 * Tr::kTileBytes;
    const uint32_t s_p = s_k + 4 * Tr::kTileBytes, s_ds = s_p + Tr::kPBytes;

    const int qrow0 = m0 + warp * 16 + g;
    uint32_t P[Tr::kKF][4], dS[Tr::kKF][4];
    {
        float S[1][Tr::kNT][4], dP[1][Tr::kNT][4];
        gemm_qk<Tr, E>(S, QT::lane_base_full(s_q + warp * 16 * 128, lr_a, lb_a), 0u,
                       QT::lane_base_full(s_k, lr_k, lb_k), 0u);
        gemm_qk<Tr, E>(dP, QT::lane_base_full(s_do + warp * 16 * 128, lr_a, lb_a), 0u,
                       QT::lane_base_full(s_v, lr_k, lb_k), 0u);
        probs_and_grads<Tr, E>(p, a, hq, qrow0, S[0], dP[0], P, dS);
    }
    store_p_ds<Tr>(s_p, s_ds, P, dS);
    accumulate_dq<Tr, E>(p, a, hq, qrow0, dS, QT::lane_base_full(s_k, lr_a, lb_a) + page);
    __syncthreads();  // P and dS tiles complete

    const int ncols = a.d - a.slice * kBwdSliceCols;
    const uint32_t pt_off = PT::offset(lr_k, 2 * warp + lb_k);
    gemm_at_b<Tr, E>(dV, s_p + pt_off, QT::lane_base_full(s_do, lr_a, lb_a) + page, ncols);
    gemm_at_b<Tr, E>(dK, s_ds + pt_off, QT::lane_base_full(s_q, lr_a, lb_a) + page, ncols);
}

// dK * scale and dV of this warp's 16 keys, columns of the slice (16-bit pairs).
template <class Tr, class E>
__device__ __forceinline__ void store_dk_dv(const BwdParams &p, const BwdBlockArgs &a, uint16_t *dkg, uint16_t *dvg,
                                            const float (&dK)[Tr::kSliceGroups][2][4],
                                            const float (&dV)[Tr::kSliceGroups][2][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int ncols = a.d - a.slice * kBwdSliceCols;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = a.n0 + warp * 16 + 8 * h + g;
        if (key >= a.sk) continue;
        uint16_t *kr = dkg + key * p.dk_rs + a.slice * kBwdSliceCols + 2 * t;
        uint16_t *vr = dvg + key * p.dv_rs + a.slice * kBwdSliceCols + 2 * t;
#pragma unroll
        for (int j = 0; j < Tr::kSliceGroups; ++j)
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int c = j * 16 + n * 8;
                if (c >= ncols) continue;
                *reinterpret_cast<uint32_t *>(kr + c) =
                    cuda::pack2<E>(dK[j][n][2 * h] * p.scale, dK[j][n][2 * h + 1] * p.scale);
                *reinterpret_cast<uint32_t *>(vr + c) = cuda::pack2<E>(dV[j][n][2 * h], dV[j][n][2 * h + 1]);
            }
    }
}

// Key block nb of sequence b: every query block of every query head of kv head kvh that sees any
// of its keys, then dK and dV.
template <class Tr, class E>
__device__ __forceinline__ void bwd_key_block(const BwdParams &p, BwdBlockArgs &a, int kvh, int nb) {
    constexpr int kB = Tr::kB;
    const bool varlen = p.cu_q != nullptr;
    a.n0 = nb * kB;
    float dK[Tr::kSliceGroups][2][4], dV[Tr::kSliceGroups][2][4];
#pragma unroll
    for (int j = 0; j < Tr::kSliceGroups; ++j)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) dK[j][n][e] = dV[j][n][e] = 0.f;

    // Query rows that see any key of [n0, n_hi]: key j is visible to row i iff
    // i + off - left <= j <= i + off + right (mask.cuh), so i in [n0 - off - right, n_hi - off + left].
    const int64_t n_hi = min(a.n0 + kB, a.sk) - 1;
    const int64_t i_lo = max(int64_t(0), a.n0 - a.off - p.right);
    const int64_t i_hi = min(static_cast<int64_t>(a.sq) - 1, n_hi - a.off + p.left);
    if (i_lo <= i_hi) {
        __syncthreads();  // a previous key block of this CTA is done with K and V
        const int64_t k_row0 = varlen ? cuda::seq_info(p, a.b).k_row0 : 0;
        const int64_t koff = varlen ? k_row0 * p.k_rs : a.b * p.k_bs;
        const int64_t voff = varlen ? k_row0 * p.v_rs : a.b * p.v_bs;
        const uint16_t *kg = static_cast<const uint16_t *>(p.k) + koff + kvh * p.k_hs + a.n0 * p.k_rs;
        const uint16_t *vg = static_cast<const uint16_t *>(p.v) + voff + kvh * p.v_hs + a.n0 * p.v_rs;
        bwd_load_tile<Tr>(a.s_k, kg, p.k_rs, a.sk - a.n0, a.d);
        bwd_load_tile<Tr>(a.s_k + Tr::kTileBytes, vg, p.v_rs, a.sk - a.n0, a.d);
        cuda::cp_async_commit();
        const int mb_first = static_cast<int>(i_lo / kB), mb_last = static_cast<int>(i_hi / kB);
        for (int gi = 0; gi < p.group; ++gi) {
            const int hq = kvh * p.group + gi;
            for (int mb = mb_first; mb <= mb_last; ++mb) bwd_query_block<Tr, E>(p, a, hq, mb * kB, dK, dV);
        }
    }
    // Read again (not kept from the prologue): the loop holds no registers for these offsets.
    const int64_t k_row0 = varlen ? cuda::seq_info(p, a.b).k_row0 : 0;
    const int64_t dkoff = varlen ? k_row0 * p.dk_rs : a.b * p.dk_bs;
    const int64_t dvoff = varlen ? k_row0 * p.dv_rs : a.b * p.dv_bs;
    store_dk_dv<Tr, E>(p, a, static_cast<uint16_t *>(p.dk) + dkoff + kvh * p.dk_hs,
                       static_cast<uint16_t *>(p.dv) + dvoff + kvh * p.dv_hs, dK, dV);
}

template <class Tr, class E>
__global__ void __launch_bounds__(Tr::kThreads) bwd_kernel(const __grid_constant__ BwdParams p) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const int kvh = static_cast<int>(blockIdx.y) / p.slices;
    BwdBlockArgs a;
    a.b = blockIdx.z;
    a.slice = static_cast<int>(blockIdx.y) - kvh * p.slices;
    const cuda::SeqInfo si = cuda::seq_info(p, a.b);
    a.sq = si.sq;
    a.sk = si.sk;
    a.off = si.sk - si.sq;
    a.q_row0 = si.q_row0;
    a.d = p.head_dim;
    const bool varlen = p.cu_q != nullptr;
    a.qg = static_cast<const uint16_t *>(p.q) + (varlen ? si.q_row0 * p.q_rs : a.b * p.q_bs);
    a.dog = static_cast<const uint16_t *>(p.dout) + (varlen ? si.q_row0 * p.do_rs : a.b * p.do_bs);
    const int copy = p.deterministic ? static_cast<int>(blockIdx.x) : 0;
    a.dqa = p.dq_accum + static_cast<int64_t>(copy) * p.heads_q * p.total_rows * a.d;
    a.s_k = cuda::smem_addr(smem);
    const int nkb = (si.sk + Tr::kB - 1) / Tr::kB;
    for (int nb = blockIdx.x; nb < nkb; nb += gridDim.x) bwd_key_block<Tr, E>(p, a, kvh, nb);
}

// Grid: x = key blocks of the longest sequence (deterministic: the accumulator copies), y = kv
// heads x column slices, z = batch.
template <class Tr>
dim3 bwd_grid(const BwdParams &p) {
    const unsigned x = p.deterministic ? static_cast<unsigned>(p.dq_splits)
                                       : static_cast<unsigned>((p.seqlen_k + Tr::kB - 1) / Tr::kB);
    return dim3(x, static_cast<unsigned>(p.heads_kv * p.slices), static_cast<unsigned>(p.batch));
}

template <int kD, int kNW, class E>
cudaError_t launch_bwd(const BwdParams &p, cudaStream_t stream) {
    using Tr = BwdTraits<kD, kNW>;
    auto kernel = bwd_kernel<Tr, E>;
    static unsigned long long optin_done = 0;  // one per instantiation of this function
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    kernel<<<bwd_grid<Tr>(p), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    return cudaSuccess;
}

// Launcher body of one compiled head dim (both element types; the small tile where compiled).
template <int kD>
cudaError_t launch_bwd_hdim(const BwdParams &p, bool bf16, bool small, cudaStream_t s) {
    if constexpr (bwd_has_small(kD)) {
        if (small)
            return bf16 ? launch_bwd<kD, kBwdSmallWarps, cuda::Bf16>(p, s)
                        : launch_bwd<kD, kBwdSmallWarps, cuda::Fp16>(p, s);
    }
    (void)small;
    return bf16 ? launch_bwd<kD, kBwdMainWarps, cuda::Bf16>(p, s) : launch_bwd<kD, kBwdMainWarps, cuda::Fp16>(p, s);
}

}  // namespace fa2
}  // namespace flashattn
