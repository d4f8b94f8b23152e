// FlashAttention-3 forward kernel for Hopper (sm_90a): TMA loads, wgmma, warp specialization.
//
// One CTA per (128-row query tile, query head, sequence), 3 warpgroups:
//   * warpgroup 0, the producer, gives up registers (setmaxnreg.dec) and one thread issues every
//     TMA load: the Q tile once, then K and V tiles from the last visible key tile down to the
//     first into two rings of kStages buffers, each buffer guarded by a "full" mbarrier (TMA
//     bytes landed) and an "empty" one (every consumer warp has finished reading it);
//   * warpgroups 1 and 2, the consumers, take the registers (setmaxnreg.inc) and own 64 query
//     rows each. S = Q K^T is a wgmma with both operands in shared memory (K-major); the online
//     softmax runs on the accumulator registers; O += P V is a wgmma with P from registers (the
//     S accumulator layout is the m16k16 A fragment: no shuffle) and V MN-major in shared memory.
//
// The consumer loop overlaps the two GEMMs with the softmax inside a warpgroup: at step n it
// issues S_n = Q K_n^T and O += P_{n+1} V_{n+1} back to back, waits only for S_n, computes the
// softmax of S_n while the PV GEMM still runs, then waits for it and rescales O. The two consumer
// warpgroups run independently, so one's softmax also overlaps the other's GEMMs.
//
// Runtime features (no template flags): causal / sliding window (edge tiles masked, the others
// skipped), soft cap, GQA/MQA (kv head = head / group in the K/V coordinates), variable length
// (TMA rows offset by cu_seqlens; rows of the next sequence are masked or not stored), LSE.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/host/smem_optin.h"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_params.h"

namespace flashattn {
namespace fa3 {

template <int kD_, int kBN_>
struct Traits {
    static constexpr int kD = kD_;    // padded head dim, a multiple of 64
    static constexpr int kBN = kBN_;  // keys per tile
    static constexpr int kPages = kD / 64;       // 64-column swizzle pages per row
    static constexpr int kQPage = kBlockM * 128;  // bytes of one page of the Q tile
    static constexpr int kKVPage = kBN * 128;     // ... of a K or V tile
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKVBytes = kPages * kKVPage;
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kQBytes + kStages * kKVBytes;
    static constexpr int kBarOffset = kQBytes + 2 * kStages * kKVBytes;
    static constexpr int kSmemBytes = smem_bytes(TileConfig{kD, kBN});
    static constexpr int kNT = kBN / 8;   // n8 tiles of S per thread's rows
    static constexpr int kPF = kBN / 16;  // k16 fragments of P
    static_assert(kD % 64 == 0 && kBN % 16 == 0 && kBN <= 256, "unsupported tile");
    static_assert(kKVPage % 1024 == 0, "K/V pages must keep the 1 KB swizzle alignment");
};

struct Barriers {
    uint64_t q_full, q_empty;
    uint64_t k_full[kStages], k_empty[kStages];
    uint64_t v_full[kStages], v_empty[kStages];
};

constexpr int kConsumerWarps = 8;  // each consumer warp arrives once on an "empty" barrier

// Ring position of the i-th key tile a CTA visits (tiles are consumed in order).
__device__ __forceinline__ int stage_of(int i) { return i % kStages; }
__device__ __forceinline__ uint32_t phase_of(int i) { return static_cast<uint32_t>((i / kStages) & 1); }

// Ring counters that persist across the tiles of a CTA: `kv` counts key tiles (K and V ring
// positions), `q` counts tiles whose Q was loaded (the Q buffer's phase).
struct Pipe {
    int kv = 0;
    int q = 0;
};

// What both roles know about a work tile.
struct TileCoords {
    int head, b;
    int m0;             // first query row of the tile within its sequence
    cuda::SeqInfo seq;  // lengths and first rows
    cuda::KeyTiles kt;  // visible key tiles (empty when the tile has no query row)
    __device__ bool has_rows() const { return m0 < seq.sq; }
    __device__ bool has_keys() const { return has_rows() && kt.first <= kt.last; }
};

// Work tile `tile` of the persistent schedule. Equal-cost tiles (no causal mask): query tiles
// fastest, so CTAs working at the same time share a head's K/V in L2. Causal: a tile's cost grows
// with its query block, so within each L2 section (p.section (head, sequence) pairs whose K/V
// fit in about half the L2) the list runs from the heaviest query block of every pair down to the
// lightest: longest-processing-time first, while the CTAs working at the same time still share
// the section's K/V.
__device__ __forceinline__ TileCoords tile_coords(const Params &p, int tile, int m_blocks, int kBN) {
    TileCoords c;
    int mblk, rest;
    if (p.reverse_m) {
        const int hb = p.heads_q * p.batch;
        const int per_section = p.section * m_blocks;
        const int first = tile / per_section * p.section;  // first pair of this tile's section
        const int u = tile % per_section;
        const int width = min(p.section, hb - first);       // the last section may be narrower
        mblk = m_blocks - 1 - u / width;
        rest = first + u % width;
    } else {
        mblk = tile % m_blocks;
        rest = tile / m_blocks;
    }
    c.head = rest % p.heads_q;
    c.b = rest / p.heads_q;
    c.m0 = mblk * kBlockM;
    c.seq = cuda::seq_info(p, c.b);
    if (c.has_rows()) {
        const int qhi = min(c.m0 + kBlockM, c.seq.sq) - 1;
        c.kt = cuda::key_tiles(p, c.m0, qhi, c.seq.sk, c.seq.sk - c.seq.sq, kBN);
    }
    return c;
}

// The r-th tile of this CTA: round r of the list, dealt forwards in even rounds and backwards in
// odd ones ("snake"), so that with the causal heaviest-first order each CTA pairs heavy tiles with
// light ones. -1 when the list is exhausted.
__device__ __forceinline__ int nth_tile(int r, int n_work) {
    const int x = static_cast<int>(blockIdx.x), g = static_cast<int>(gridDim.x);
    const int64_t t = static_cast<int64_t>(r) * g + ((r & 1) ? g - 1 - x : x);
    return t < n_work ? static_cast<int>(t) : -1;
}

__device__ __forceinline__ int32_t q_row_coord(const Params &p, const TileCoords &c) {
    return static_cast<int32_t>(p.cu_q != nullptr ? c.seq.q_row0 + c.m0 : c.m0);
}
__device__ __forceinline__ int32_t kv_row_coord(const Params &p, const TileCoords &c, int nb, int kBN) {
    return static_cast<int32_t>((p.cu_k != nullptr ? c.seq.k_row0 : 0) + static_cast<int64_t>(nb) * kBN);
}
__device__ __forceinline__ int32_t batch_coord(const Params &p, const TileCoords &c) {
    return p.cu_q != nullptr ? 0 : c.b;
}

// One [rows x kD] tile as kPages TMA boxes of 64 columns (one swizzle page each), all signalling
// `bar`; `page_bytes` apart in shared memory.
template <class Tr>
__device__ __forceinline__ void tma_tile(unsigned char *dst, int page_bytes, const CUtensorMap *tm, uint64_t *bar,
                                         int32_t row, int32_t head, int32_t batch) {
#pragma unroll
    for (int pg = 0; pg < Tr::kPages; ++pg) cuda::tma_load_4d(dst + pg * page_bytes, tm, bar, 64 * pg, row, head, batch);
}

// Producer: one thread. Per tile the first K tile goes out before the wait for the Q buffer
// (the consumers release it only after their last GEMM of the previous tile), then Q, then V and
// the remaining K/V tiles, each into its ring once the consumers have released the buffer (the
// first kStages waits pass at once: parity rule).
template <class Tr>
__device__ __forceinline__ void produce(const Params &p, const TileCoords &c, const CUtensorMap *tm_q,
                                        const CUtensorMap *tm_k, const CUtensorMap *tm_v, unsigned char *smem,
                                        Barriers *bars, Pipe &pipe) {
    const int32_t bq = batch_coord(p, c);
    const int kvh = c.head / p.group;
    for (int i = pipe.kv, nb = c.kt.last; nb >= c.kt.first; ++i, --nb) {
        const int st = stage_of(i);
        const uint32_t ph = phase_of(i);
        const int32_t krow = kv_row_coord(p, c, nb, Tr::kBN);
        // Out-of-bounds rows and columns arrive as zeros and still count: expect whole boxes.
        unsigned char *k_dst = smem + Tr::kKOffset + st * Tr::kKVBytes;
        cuda::mbar_wait(&bars->k_empty[st], ph ^ 1u);
        cuda::mbar_arrive_expect_tx(&bars->k_full[st], Tr::kKVBytes);
        tma_tile<Tr>(k_dst, Tr::kKVPage, tm_k, &bars->k_full[st], krow, kvh, bq);
        if (nb == c.kt.last) {
            cuda::mbar_wait(&bars->q_empty, static_cast<uint32_t>(pipe.q & 1) ^ 1u);
            cuda::mbar_arrive_expect_tx(&bars->q_full, Tr::kQBytes);
            const int32_t qrow = q_row_coord(p, c);
            tma_tile<Tr>(smem, Tr::kQPage, tm_q, &bars->q_full, qrow, c.head, bq);
        }
        unsigned char *v_dst = smem + Tr::kVOffset + st * Tr::kKVBytes;
        cuda::mbar_wait(&bars->v_empty[st], ph ^ 1u);
        cuda::mbar_arrive_expect_tx(&bars->v_full[st], Tr::kKVBytes);
        tma_tile<Tr>(v_dst, Tr::kKVPage, tm_v, &bars->v_full[st], krow, kvh, bq);
    }
    pipe.kv += c.kt.last - c.kt.first + 1;
    pipe.q += 1;
}

// A consumer warp is done reading a buffer: its lanes have all passed the wgmma wait.
__device__ __forceinline__ void release(uint64_t *bar, int lane) {
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive(bar);
}

// Consumer warpgroup `w` (0 or 1): query rows 64w..64w+63 of the tile.
template <class Tr, class E>
__device__ __forceinline__ void consume(const Params &p, const TileCoords &c, unsigned char *smem, Barriers *bars,
                                        int w, Pipe &pipe) {
    constexpr int kD = Tr::kD, kBN = Tr::kBN, kNT = Tr::kNT, kPF = Tr::kPF;
    const int tid = threadIdx.x - 128 * (w + 1);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int sq = c.seq.sq, sk = c.seq.sk;
    int qpos[2], rdiag[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        qpos[h] = c.m0 + 64 * w + 16 * warp + g + 8 * h;
        rdiag[h] = qpos[h] + (sk - sq);
    }

    float O[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) O[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    const float sl2 = p.score_log2;

    if (c.has_keys()) {
        // Descriptors: Q rows 64w.. (K-major), K (K-major), V (MN-major: LBO = one 64-column page).
        const uint32_t s_base = cuda::smem_addr(smem);
        const uint64_t dq = cuda::make_desc_sw128(s_base + 64 * w * 128);
        const uint64_t dk = cuda::make_desc_sw128(s_base + Tr::kKOffset);
        const uint64_t dv = cuda::make_desc_sw128(s_base + Tr::kVOffset, 1024, Tr::kKVPage);
        // A k16 step of the K-major operands: +32 B inside the 128 B row, a new page every 4 steps.
        auto k_step = [](int ks, int page) { return static_cast<uint64_t>(((ks / 4) * page + (ks % 4) * 32) >> 4); };
        auto issue_qk = [&](float (&S)[kNT][4], int st) {
            float(&acc)[kBN / 2] = reinterpret_cast<float(&)[kBN / 2]>(S);
            const uint64_t dks = dk + static_cast<uint64_t>((st * Tr::kKVBytes) >> 4);
            // Operand fences before wgmma.fence: no register of a wgmma is defined by an ordinary
            // instruction inside the issue window (ptxas would serialize the wgmmas, C7513).
            cuda::fence_operands(acc);
            cuda::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks)
                cuda::wgmma_ss<E, kBN>(acc, dq + k_step(ks, Tr::kQPage), dks + k_step(ks, Tr::kKVPage), ks > 0);
            cuda::wgmma_commit();
        };
        auto issue_pv = [&](const uint32_t (&P)[kPF][4], int st) {
            const uint64_t dvs = dv + static_cast<uint64_t>((st * Tr::kKVBytes) >> 4);
            cuda::fence_operands(O);
            cuda::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kPF; ++kk)  // 16 keys = 16 rows of 128 B
                cuda::wgmma_rs<E, kD>(O, P[kk], dvs + static_cast<uint64_t>((kk * 16 * 128) >> 4), 1);
            cuda::wgmma_commit();
        };
        auto scores = [&](float (&S)[kNT][4], int nb) {
            if (p.softcap_scale != 0.f) cuda::softcap_scores(S, p.softcap_scale);
            if (c.kt.masked(nb)) cuda::mask_scores(S, rdiag, nb * kBN + 2 * t, sk, p.right_i, p.left_i);
        };

        // Key tile i is consumed as S_i, then P_i V_i during step i+1. P alternates between two
        // register sets (the loop is unrolled by two) so that the softmax writing P_{i+1} never
        // targets registers the in-flight P_i V_i wgmma still reads; a plain copy would be
        // coalesced by ptxas and serialize the wgmmas (C7513).
        const int r0 = pipe.kv;  // ring position of this tile's first key tile
        const int n_tiles = c.kt.last - c.kt.first + 1;
        auto step = [&](int i, uint32_t (&P)[kPF][4], uint32_t (&P_next)[kPF][4]) {
            const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
            float S[kNT][4];
            cuda::mbar_wait(&bars->k_full[ks], phase_of(r0 + i));
            issue_qk(S, ks);
            cuda::mbar_wait(&bars->v_full[vs], phase_of(r0 + i - 1));
            issue_pv(P, vs);
            cuda::wgmma_wait<1>();  // S_i is ready; P_{i-1} V_{i-1} may still run
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->k_empty[ks], lane);
            if (i == n_tiles - 1) release(&bars->q_empty, lane);  // the last GEMM reading Q retired
            scores(S, c.kt.last - i);
            float alpha[2];
            cuda::softmax_step<E>(S, row_max, row_sum, sl2, P_next, alpha);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(O);
            release(&bars->v_empty[vs], lane);
#pragma unroll
            for (int j = 0; j < kD / 2; ++j) O[j] *= alpha[(j % 4) / 2];
        };
        auto last_pv = [&](uint32_t (&P)[kPF][4], int i) {
            const int vs = stage_of(r0 + i);
            cuda::mbar_wait(&bars->v_full[vs], phase_of(r0 + i));
            issue_pv(P, vs);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(O);
            release(&bars->v_empty[vs], lane);
        };

        cuda::mbar_wait(&bars->q_full, static_cast<uint32_t>(pipe.q & 1));
        uint32_t Pa[kPF][4], Pb[kPF][4];
        {  // the first (last-indexed) key tile: no O to rescale yet
            const int ks = stage_of(r0);
            float S[kNT][4];
            cuda::mbar_wait(&bars->k_full[ks], phase_of(r0));
            issue_qk(S, ks);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->k_empty[ks], lane);
            if (n_tiles == 1) release(&bars->q_empty, lane);
            scores(S, c.kt.last);
            float alpha[2];
            cuda::softmax_step<E>(S, row_max, row_sum, sl2, Pa, alpha);
        }
        int i = 1;
        for (; i + 1 < n_tiles; i += 2) {
            step(i, Pa, Pb);
            step(i + 1, Pb, Pa);
        }
        if (i < n_tiles) {
            step(i, Pa, Pb);
            last_pv(Pb, i);
        } else {
            last_pv(Pa, i - 1);
        }
        pipe.kv += n_tiles;
        pipe.q += 1;
    }

    // ---- epilogue: O / l as 16-bit pairs straight from the accumulators, LSE by the quad leader
    float inv[2], lse[2];
    cuda::finish_rows(row_max, row_sum, sl2, inv, lse);
    const bool varlen = p.cu_q != nullptr;
    const int64_t ooff = varlen ? c.seq.q_row0 * p.o_rs : static_cast<int64_t>(c.b) * p.o_bs;
    uint16_t *og = static_cast<uint16_t *>(p.o) + ooff + static_cast<int64_t>(c.head) * p.o_hs;
    const int d = p.head_dim;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (qpos[h] >= sq) continue;
        uint16_t *row = og + static_cast<int64_t>(qpos[h]) * p.o_rs;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
            const int col = 8 * j + 2 * t;
            if (col < d)
                *reinterpret_cast<uint32_t *>(row + col) =
                    cuda::pack2<E>(O[4 * j + 2 * h] * inv[h], O[4 * j + 2 * h + 1] * inv[h]);
        }
        if (p.lse != nullptr && t == 0) {
            p.lse[cuda::lse_offset(p, c.b, c.head, c.seq.q_row0, qpos[h])] = lse[h];
        }
    }
}

template <class Tr, class E>
__global__ void __launch_bounds__(kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ Params p) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte alignment; the dynamic base is not guaranteed to have it.
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    Barriers *bars = reinterpret_cast<Barriers *>(smem + Tr::kBarOffset);

    if (threadIdx.x == 0) {
        cuda::mbar_init(&bars->q_full, 1);
        cuda::mbar_init(&bars->q_empty, kConsumerWarps);
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            cuda::mbar_init(&bars->k_full[s], 1);
            cuda::mbar_init(&bars->v_full[s], 1);
            cuda::mbar_init(&bars->k_empty[s], kConsumerWarps);
            cuda::mbar_init(&bars->v_empty[s], kConsumerWarps);
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();

    // Persistent: each CTA takes every gridDim.x-th tile (nth_tile). Both roles walk the same list and skip
    // the same tiles (no query rows: nothing; no visible key: the consumers write O = 0 alone).
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int n_work = m_blocks * p.heads_q * p.batch;
    const int wg = threadIdx.x / 128;
    Pipe pipe;
    if (wg == 0) {
        cuda::setmaxnreg_dec<40>();
        if (threadIdx.x != 0) return;
        cuda::prefetch_tensormap(&tm_q);
        cuda::prefetch_tensormap(&tm_k);
        cuda::prefetch_tensormap(&tm_v);
        for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
            if (c.has_keys()) produce<Tr>(p, c, &tm_q, &tm_k, &tm_v, smem, bars, pipe);
        }
    } else {
        cuda::setmaxnreg_inc<232>();
        for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
            if (c.has_rows()) consume<Tr, E>(p, c, smem, bars, wg - 1, pipe);
        }
    }
}

template <int kD, class E>
cudaError_t launch_fwd(const Params &p, const TensorMaps &maps, cudaStream_t stream) {
    constexpr TileConfig cfg = config_for(kD);
    static_assert(cfg.head_dim == kD, "no such compiled head dim");
    using Tr = Traits<cfg.head_dim, cfg.block_n>;
    auto kernel = fwd_kernel<Tr, E>;
    static unsigned long long optin_done = 0;  // one per instantiation
    cudaError_t e = cuda::ensure_smem_optin(kernel, Tr::kSmemBytes, &optin_done);
    if (e != cudaSuccess) return e;
    const int64_t n_work = (static_cast<int64_t>(p.seqlen_q) + kBlockM - 1) / kBlockM * p.heads_q * p.batch;
    const unsigned grid = static_cast<unsigned>(n_work < p.num_ctas ? n_work : p.num_ctas);
    kernel<<<grid, kThreads, Tr::kSmemBytes, stream>>>(maps.q, maps.k, maps.v, p);
    return cudaSuccess;
}

}  // namespace fa3
}  // namespace flashattn
