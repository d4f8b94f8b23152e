// FlashAttention-2 forward kernel for sm_80+ (mma.sync m16n8k16, ldmatrix, cp.async).
//
// One CTA per (query tile, head, batch [x split]) (fa2_tile_scheduler.cuh); the K/V loop runs
// inside, from the last visible key tile down to the first (fa2_mainloop.cuh). Warps split the
// query rows (no cross-warp reduction); O, the running max m and the running sum l stay in
// registers and O is divided by l once at the end (fa2_epilogue.cuh). Scores are kept unscaled;
// exp2 applies scale*log2(e) with one FFMA (after the tanh when a soft cap is on). Shared memory
// holds Q, and one or two buffers of K and V, in the swizzled page layout of device/swizzle.cuh.
//
// Runtime features (no template flags): causal / sliding window (one key interval per row),
// soft cap, GQA/MQA (and pack-GQA: the query heads of one kv head stacked along M), variable
// length (cu_seqlens), LSE, split-KV (fp32 partials into the workspace, combined by fa2_merge.cu's
// kernel or, in the decode tiles, by each query tile's last split: fold_split_combine), seqused_k,
// top-left causal, sink logits (joined after the key loop). In the kVariants instantiation: ALiBi
// (general form in the edge-tile body, for the tiles that cross a row's diagonal; one FFMA per
// score plus a softmax row offset in a third body elsewhere; at head dims 32 and 96 without
// pack-GQA the per-column part is what S starts from, the first k-step's C operand), sink tokens
// (their tiles walked after the window's, in the same pipeline, with GEMMs bounded to the sink
// keys), head_dim_v != head_dim (V's columns past it load as zeros). A paged K/V cache is the one
// template flag (kPaged): its per-tile page lookup, as a runtime test, cost the contiguous kernels
// spills.
//
// This file only assembles the roles: CTA -> work (fa2_tile_scheduler.cuh), the sequence's offsets
// and visible key tiles, the shared-memory layout and ldmatrix lane bases, then the main loop and
// the epilogue. Facts a backward pass relies on: the LSE is the natural log of the row sum of
// exp(scaled, soft-capped scores), laid out as cuda::lse_offset says, and -inf (with O = 0) for a
// row that sees no key; O is normalised in fp32 before rounding to 16 bits; the Q tile's shared
// memory is reused to stage O, so Q is gone once the epilogue has run.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/pdl.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/sink.cuh"
#include "backends/cuda/fa2/fa2_epilogue.cuh"
#include "backends/cuda/fa2/fa2_mainloop.cuh"
#include "backends/cuda/fa2/fa2_params.h"
#include "backends/cuda/fa2/fa2_tile_scheduler.cuh"
#include "backends/cuda/fa2/fa2_traits.cuh"

namespace flashattn {
namespace fa2 {

// kPaged: K/V through Params::page_table (launch_fwd picks it once per launch, so the key loop of
// the contiguous kernels carries no page code). kVariants: ALiBi, sink tokens, head_dim_v !=
// head_dim (contiguous K/V only); in the plain kernels their code made hdim 128's big tile spill
// 16 bytes (CUDA 13.0), so launch_fwd picks this instantiation only for plans that use them.
template <class Tr, class E, bool kPaged = false, bool kVariants = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    fwd_kernel(const __grid_constant__ Params p, const __grid_constant__ typename PagedTmaMapsFor<kPaged>::type maps) {
    constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kMT = Tr::kMT, kDT = Tr::kDT, kWR = Tr::kWarpRows;
    using QT = typename Tr::QTile;
    using KT = typename Tr::KVTile;

    extern __shared__ __align__(1024) unsigned char smem[];
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;

    // After the serving append (a programmatic dependent launch, cuda/device/pdl.cuh): its cache
    // rows and rotated Q are visible past the wait; the decode tiles (kLateWait) wait in
    // load_first_tiles instead. The split-KV combine may launch now.
    if constexpr (!kLateWait<Tr>) cuda::pdl_wait();
    cuda::pdl_launch_dependents();
    paged_tma_prefetch<Tr, kPaged>(p, &maps);  // (sm_90 paged decode tiles: the descriptors, early)

    const FwdWork work = fwd_work(p);
    const int mblk = work.mblk, hh = work.hh, b = work.b, split = work.split;

    // ---- this sequence ------------------------------------------------------------------------
    const cuda::SeqInfo si = cuda::seq_info(p, b);
    const int sq = si.sq, sk = si.sk;
    const bool varlen = p.cu_q != nullptr;
    const int64_t qoff = varlen ? si.q_row0 * p.q_rs : b * p.q_bs;
    // Paged K/V: pages are found per tile (load_kv_tile); kg and vg address page 0 at this head.
    const int64_t koff = kPaged ? 0 : varlen ? si.k_row0 * p.k_rs : b * p.k_bs;
    const int64_t voff = kPaged ? 0 : varlen ? si.k_row0 * p.v_rs : b * p.v_bs;
    const int G = p.pack;
    const int prows = sq * G;
    const int m0 = mblk * kBM;
    if (m0 >= prows) {
        if constexpr (kLateWait<Tr>) cuda::pdl_wait();  // every CTA waits: this grid's end implies the append's
        return;
    }
    const int kvh = G > 1 ? hh : hh / p.group;
    const int hbase = G > 1 ? hh * G : hh;
    const int d = p.head_dim;

    const uint16_t *qg = static_cast<const uint16_t *>(p.q) + qoff;
    const uint16_t *kg = static_cast<const uint16_t *>(p.k) + koff + kvh * p.k_hs;
    const uint16_t *vg = static_cast<const uint16_t *>(p.v) + voff + kvh * p.v_hs;

    // ---- visible key tiles of this CTA (and of this split) -------------------------------------
    const int off = cuda::diagonal_offset(p, sq, sk);
    const int qlo = m0 / G;
    const int qhi = (min(m0 + kBM, prows) - 1) / G;
    const cuda::KeyTiles kt = cuda::key_tiles(p, qlo, qhi, sk, off, kBN);
    const KeyTileRange kr = split_key_tiles(kt, split, p.num_splits);
    const int nb_first = kr.first, nb_last = kr.last;

    const bool warp_active = m0 + warp * kWR < prows;

    // ---- shared memory -----------------------------------------------------------------------
    const uint32_t s_q = cuda::smem_addr(smem);
    const uint32_t s_kv = s_q + Tr::kQBytes;  // stage s: K at s_kv + 2*s*kKVBytes, V after it
    // Lane bases for ldmatrix (see SwizzledTile): Q/V use rows lane%16 and chunk bit lane/16, K
    // uses rows (lane%8) + 8*(lane/16) and chunk bit (lane/8)%2.
    const int lr_a = lane & 15, lb_a = lane >> 4;
    const int lr_k = (lane & 7) | ((lane >> 4) << 3), lb_k = (lane >> 3) & 1;
    const uint32_t q_f = QT::lane_base_full(s_q + warp * kWR * 128, lr_a, lb_a);
    const uint32_t q_h = QT::lane_base_half(s_q + warp * kWR * 64, lr_a, lb_a);
    const uint32_t k_f0 = KT::lane_base_full(s_kv, lr_k, lb_k);
    const uint32_t k_h0 = KT::lane_base_half(s_kv, lr_k, lb_k);
    const uint32_t v_f0 = KT::lane_base_full(s_kv + Tr::kKVBytes, lr_a, lb_a);
    const uint32_t v_h0 = KT::lane_base_half(s_kv + Tr::kKVBytes, lr_a, lb_a);

    float O[kMT][kDT][4];
    float row_max[kMT][2], row_sum[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) O[mt][dt][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    const float sl2 = p.score_log2;

    // Sink tokens: tiles 0 .. s_last below the window's, walked by split 0 only (it holds the
    // window's lowest tiles, so the splits still share the keys out without overlap).
    const int s_last = kVariants && split == 0 ? cuda::sink_tile_last(p, kt, qhi, sk, off, kBN) : -1;

    // ---- main loop: key tiles nb_last down to nb_first ----------------------------------------
    if (nb_first <= nb_last || s_last >= 0) {
        FwdLoopArgs a;
        a.qg = qg;
        a.kg = kg;
        a.vg = vg;
        a.m0 = m0;
        a.prows = prows;
        a.G = G;
        a.hbase = hbase;
        a.sk = sk;
        a.d = d;
        a.nb_first = nb_first;
        a.sl2 = sl2;
        a.tid = tid;
        a.t = t;
        a.warp_active = warp_active;
        a.s_q = s_q;
        a.s_kv = s_kv;
        a.q_f = q_f;
        a.q_h = q_h;
        a.k_f0 = k_f0;
        a.k_h0 = k_h0;
        a.v_f0 = v_f0;
        a.v_h0 = v_h0;
        a.kvh = kvh;
        a.kv_tma = paged_tma_on<Tr, kPaged>(p, s_kv);
        a.maps = &maps;
        // Edge-tile mask input: query position + (sk - sq) of row half h of m16 tile mt.
        auto row_diag = [&](int mt, int h) {
            int qpos, head;
            unpack_row(m0 + warp * kWR + mt * 16 + h * 8 + g, G, hbase, qpos, head);
            return qpos + off;
        };
        // ALiBi slope of the same row: its query head.
        auto row_head = [&](int mt, int h) {
            int qpos, head;
            unpack_row(m0 + warp * kWR + mt * 16 + h * 8 + g, G, hbase, qpos, head);
            return head;
        };
        // ALiBi: only the tiles crossing a row's diagonal take the edge body (AlibiBand). Sink
        // tiles follow the window's in the same walk.
        AlibiBand band;
        if (kVariants && p.alibi_slopes != nullptr) band = alibi_band(qlo + off, qhi + off, kBN);
        fwd_mainloop<Tr, E, kPaged, kVariants>(p, a, kt, nb_last, O, row_max, row_sum, row_diag, row_head, s_last,
                                               band);
    }

    // ---- epilogue ------------------------------------------------------------------------------
    // (A CTA that loaded a key tile waited in load_first_tiles already; one without key tiles
    // waits here, so that this grid's end implies the append's for the launches after it.)
    if constexpr (kLateWait<Tr>) cuda::pdl_wait();
    // Read again (not kept from the prologue): the loop holds no registers for these offsets.
    const cuda::SeqInfo se = cuda::seq_info(p, b);
    const int64_t grow0 = se.q_row0;
    const int64_t ooff = varlen ? se.q_row0 * p.o_rs : b * p.o_bs;
    float inv[kMT][2], lse[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) cuda::finish_rows(row_max[mt], row_sum[mt], sl2, inv[mt], lse[mt]);
    // Sink logits (cuda::join_sink): with split-KV only split 0 joins them, so the merged LSE counts
    // each once. The split is derived again here: kept from the prologue it made ptxas spill.
    if (p.sink_logits != nullptr && fwd_work(p).split == 0)
        for_each_own_row<Tr>(m0, prows, G, hbase, [&](int mt, int h, int, int head) {
            cuda::join_sink(p.sink_logits[head], inv[mt][h], lse[mt][h]);
        });

    if (p.num_splits > 1) {
        store_split_partials<Tr>(p, O, inv, lse, m0, prows, G, hbase, split, grow0);
        if constexpr (kDecodeTile<Tr>)
            if (p.fold_count != nullptr) fold_split_combine<Tr, E>(p, b, m0, prows, G, hbase, grow0);
        return;
    }
    store_lse<Tr>(p, lse, m0, prows, G, hbase, b, grow0);
    if (!warp_active) return;
    store_o<Tr, E>(p, O, inv, s_q, static_cast<uint16_t *>(p.o) + ooff, m0, prows, G, hbase);
}

}  // namespace fa2
}  // namespace flashattn
