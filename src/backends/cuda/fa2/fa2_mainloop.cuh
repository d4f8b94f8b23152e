// FA2 forward main loop: the K/V pipeline over one CTA's key tiles, walked from the last visible
// tile down to the first so that the tiles needing an element mask (causal diagonal, ragged end,
// left edge of a sliding window) come first. Per key tile: S = Q K^T (fa2_gemm.cuh), soft cap,
// element mask on edge tiles only, online softmax (device/online_softmax.cuh), O = alpha * O + P V.
//
// Forward-only: the buffer schemes and cp.async group counts below are this kernel's pipeline.
// With two K/V buffers (Tr::kStages == 2) K and V of the next tile load into the other buffer
// while this one is used; with one, V[nb] is waited for and K[nb-1] refilled at the point where
// every warp is done with K[nb] (wait_v_load_next_k). (The sm_90 paged decode's TMA tiles run
// three stages issued two tiles ahead, waited on an mbarrier per buffer: kv_tma_take.) A backward
// pass needs its own pipeline (it walks query tiles per key tile) but builds it from the same
// loaders (fa2_load.cuh), GEMM addressing (fa2_gemm.cuh) and shared softmax/mask steps.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/device/rotary.cuh"
#include "backends/cuda/fa2/fa2_config.h"
#include "backends/cuda/fa2/fa2_gemm.cuh"
#include "backends/cuda/fa2/fa2_load.cuh"
#include "backends/cuda/fa2/fa2_params.h"
#include "backends/cuda/fa2/fa2_traits.cuh"

namespace flashattn {
namespace fa2 {

// What one CTA's main loop reads and never changes; the kernel fills it once. (The mask's row ->
// query position map is not in here: it comes as the kernel's row_diag functor, see fwd_key_tile.)
struct FwdLoopArgs {
    const uint16_t *qg;               // Q of this sequence (row 0, head 0)
    const uint16_t *kg, *vg;          // K and V of this sequence and kv head (key 0)
    int m0, prows, G, hbase;          // packed query rows m0 .. prows - 1 (see unpack_row)
    int sk;                           // keys of this sequence
    int d;                            // runtime head dim (columns >= d are zero-filled)
    int nb_first;                     // lowest key tile of this CTA (and split)
    float sl2;                        // score scale * log2(e), soft cap folded in
    int tid, t;                       // thread, lane % 4 (its first score column is 2t)
    bool warp_active;                 // whether the warp holds any query row: else it skips the math
    uint32_t s_q, s_kv;               // shared memory: Q tile; K/V stage s at s_kv + 2*s*kKVBytes
    uint32_t q_f, q_h;                // ldmatrix lane bases of this warp's Q rows (full / half page)
    uint32_t k_f0, k_h0, v_f0, v_h0;  // ... and of the first K and V buffer
    int kvh;                          // kv head (the paged TMA boxes' coordinate)
    bool kv_tma;                      // K/V tiles by TMA (paged_tma_on), waited for on mbarriers
    const void *maps;                 // ... from these PagedTmaMaps (the kernel's parameter)
};

// The decode tiles (64 query rows, one m16 tile per warp, two K/V buffers: the small
// configurations up to head dim 128), which take the serving decode's own choices
// (load_paged_row_runs, kLateWait); the other kernels keep main's code.
template <class Tr>
constexpr bool kDecodeTile = Tr::kBM == 64 && Tr::kStages == 2 && Tr::kMT == 1;

// This CTA's sequence's row of the page table.
__device__ __forceinline__ const int32_t *page_row(const Params &p) {
    const int b = static_cast<int>(blockIdx.z) / p.num_splits;
    return p.page_table + b * p.page_table_stride;
}

// Paged K/V (kPaged): how far the page holding key tile n0 lies from where a contiguous sequence
// would put it (g + n0*rs), so that load_tile(g + shift, n0, ...) reads that page (a page holds
// whole tiles: Params::page_size). The page-table row is found from blockIdx each time rather than
// kept in registers across the key loop.
__device__ __forceinline__ int64_t page_shift(const Params &p, int n0, int64_t rs, int64_t page_stride) {
    const int page = n0 / p.page_size;
    return page_row(p)[page] * page_stride - static_cast<int64_t>(page) * p.page_size * rs;
}

// Paged K/V with pages that do not hold whole key tiles (any page size from 1 up): each row of
// key tile [n0, n0 + kBN) is looked up in the page table on its own, like load_q's rows (chunk i
// of the tile: row i / kCPR, column chunk i % kCPR). Keys >= sk and columns >= d are zero-filled
// without reading the page table (its entries past a sequence's keys need not be valid pages).
// The tile's page-table entries are read from shared memory (paged_entries), where they were
// staged ahead (stage_page_entries*): read from global memory per chunk, each 16-byte copy
// waited on its own page-table read (0.38-0.49x the contiguous decode at pages of 16).
// Only the two-buffer kernels stage the entries: in the single-buffer ones (head dims 224/256 on
// sm_86/sm_89, whose shared memory holds one K/V buffer) the staging made the paged hdim-256
// kernel spill 12 bytes (0 without), so they read each row's entry from global memory as before.
template <class Tr>
constexpr bool kStagedPageEntries = Tr::kStages == 2;

template <class Tr>
__device__ __forceinline__ int32_t *paged_entries(int nb) {
    static_assert(Tr::kBN <= Tr::kThreads, "one thread per page entry of a tile");
    // Two tiles' entries (this tile's and the walk's next), at most one per key row: only the
    // kPaged kernels reference it, so the contiguous kernels' shared memory does not change.
    __shared__ int32_t entries[2][Tr::kBN];
    return entries[nb & 1];
}

// Page-table entries of key tile nb (rows below sk): the first page and how many there are.
__device__ __forceinline__ void tile_pages(const Params &p, int nb, int kBN, int sk, int &first, int &count) {
    const int n0 = nb * kBN;
    first = n0 / p.page_size;
    count = (min(n0 + kBN, sk) - 1) / p.page_size - first + 1;
}

// The walk's first tile: entries read now (one load per thread, all in parallel) and published
// with a barrier before any of its rows is copied.
template <class Tr>
__device__ __forceinline__ void stage_page_entries_now(const Params &p, int nb, int sk, int tid) {
    int first, count;
    tile_pages(p, nb, Tr::kBN, sk, first, count);
    if (tid < count) paged_entries<Tr>(nb)[tid] = page_row(p)[first + tid];
    __syncthreads();
}

// Tile nb's entries by cp.async, issued in the cp.async group of the K tile before it in the walk:
// the main loop waits for that group (and passes a barrier) before it issues tile nb's K and V,
// so they are in place then. The other buffer's entries (the tile being issued now) were read
// before that barrier, which every thread has passed when this is issued.
template <class Tr>
__device__ __forceinline__ void stage_page_entries_async(const Params &p, int nb, int sk, int tid) {
    int first, count;
    tile_pages(p, nb, Tr::kBN, sk, first, count);
    if (tid < count) cuda::cp_async_4(cuda::smem_addr(paged_entries<Tr>(nb) + tid), page_row(p) + first + tid, 4u);
}

template <class Tr>
__device__ __forceinline__ void load_paged_rows(const Params &p, uint32_t sbase, const uint16_t *g, int n0,
                                                int64_t rs, int64_t page_stride, int sk, int d, int tid) {
    using Tile = cuda::SwizzledTile<Tr::kBN, Tr::kD>;
    constexpr int kCPR = Tr::kD / 8;
    constexpr int kTotal = Tr::kBN * kCPR;
    constexpr int kIters = (kTotal + Tr::kThreads - 1) / Tr::kThreads;
    const unsigned ps = static_cast<unsigned>(p.page_size);
    const unsigned first = static_cast<unsigned>(n0) / ps;
    const int32_t *entries = kStagedPageEntries<Tr> ? paged_entries<Tr>(n0 / Tr::kBN) : page_row(p) + first;
#pragma unroll 4
    for (int j = 0; j < kIters; ++j) {
        const int i = tid + j * Tr::kThreads;
        if (kTotal % Tr::kThreads == 0 || i < kTotal) {
            const int r = i / kCPR;
            const int c = i - r * kCPR;
            const int key = n0 + r;
            const bool ok = c * 8 < d && key < sk;
            const uint16_t *src = g;
            if (ok) {
                const unsigned pg = static_cast<unsigned>(key) / ps;
                src = g + static_cast<int64_t>(entries[pg - first]) * page_stride +
                      static_cast<int64_t>(key - pg * ps) * rs + c * 8;
            }
            cuda::cp_async_16(sbase + Tile::offset(r, c), src, ok ? 16u : 0u);
        }
    }
}

// On since the stop-17 merged run on the H200 (test_serving_fa2, test_exec_contract, memcheck/
// racecheck/synccheck clean): pages of 16 at b 1/8/64, 16k-128k keys 1341-1920 -> 1574-2375 GB/s
// (+17-29 %); false restores load_paged_rows in the decode tiles too, for an A/B.
constexpr bool kPagedRowRuns = true;

// The decode tiles' gather (kDecodeTile): each thread copies a run of kCPT chunks of one row (row
// tid / kTPR), so that it resolves one page-table entry and row address per tile rather than one
// per chunk (load_paged_rows' mapping, a chunk column per thread over 8 rows, costs 8 page
// lookups and 64-bit address computations per thread and tile: ncu showed that gather
// issue-bound, 37 % of cycles issuing, DRAM at 29 %, the same with pages in order or of 1 key).
// Only in the decode tiles: in the 128 x 64 kernel at head dim 128 it spilled 20 bytes.
template <class Tr>
__device__ __forceinline__ void load_paged_row_runs(const Params &p, uint32_t sbase, const uint16_t *g, int n0,
                                                    int64_t rs, int64_t page_stride, int sk, int d, int tid) {
    using Tile = cuda::SwizzledTile<Tr::kBN, Tr::kD>;
    constexpr int kCPR = Tr::kD / 8;
    constexpr int kTPR = Tr::kThreads / Tr::kBN;  // threads per row
    static_assert(Tr::kThreads % Tr::kBN == 0 && kCPR % kTPR == 0, "whole rows, equal chunk runs");
    constexpr int kCPT = kCPR / kTPR;  // chunks per thread
    const int r = tid / kTPR;
    const int c0 = (tid - r * kTPR) * kCPT;
    const int key = n0 + r;
    // Source of the run's first chunk (a copy of 0 bytes reads nothing: g past the sequence's
    // keys), and how many of its columns exist (0 past the keys).
    const uint16_t *src = g;
    int cols = 0;
    if (key < sk) {
        const unsigned ps = static_cast<unsigned>(p.page_size);
        const unsigned pg = static_cast<unsigned>(key) / ps;
        const int32_t page = paged_entries<Tr>(n0 / Tr::kBN)[pg - static_cast<unsigned>(n0) / ps];
        src = g + static_cast<int64_t>(page) * page_stride + static_cast<int64_t>(key - pg * ps) * rs + c0 * 8;
        cols = d - c0 * 8;
    }
    if constexpr (kCPT % 8 == 0 && !Tile::kHalfPage) {
        // Runs of whole 128-byte swizzle pages: chunk j lands at the run's page j / 8, row r, slot
        // (j % 8) ^ (r % 8): one XOR and one add per chunk (Tile::offset's general form, with the
        // run's start known only at run time, took more registers).
        const uint32_t row_base = sbase + (c0 / 8) * Tile::kPageBytes + r * 128;
        const uint32_t x = static_cast<uint32_t>(r & 7) << 4;
#pragma unroll
        for (int j = 0; j < kCPT; ++j)
            cuda::cp_async_16(row_base + (j / 8) * Tile::kPageBytes + ((static_cast<uint32_t>(j & 7) << 4) ^ x),
                              src + j * 8, j * 8 < cols ? 16u : 0u);
    } else {
#pragma unroll
        for (int j = 0; j < kCPT; ++j)
            cuda::cp_async_16(sbase + Tile::offset(r, c0 + j), src + j * 8, j * 8 < cols ? 16u : 0u);
    }
}

// ---- sm_90: paged K/V tiles by TMA (Params::kv_tma) ------------------------------------------
// The decode tiles' cp.async gather issues 16-byte copies (load_paged_row_runs: 8 per thread and
// tile at head dim 128), and that issue rate held pages of 16 at 0.50-0.59x the contiguous decode.
// With pages of a multiple of 16 keys every 16-row group of a key tile lies in one page, so the
// tile is kBN/16 x kD/64 TMA boxes of 16 rows x 64 columns (a rank-4 tensor map {head_dim,
// page_size, heads_kv, num_pages}, SWIZZLE_128B), issued by one thread. SWIZZLE_128B puts chunk c
// of a box row at c ^ (smem address bits 7-9), which is SwizzledTile's layout when the tile is
// 1024-byte aligned (checked per CTA: paged_tma_on), so the GEMMs do not change. Completion is on
// one mbarrier per buffer (K and V of each of the three stages: 6); the cp.async groups carry Q
// and the staged page entries. Rows past the sequence's keys are not left to chance: the boxes of the
// last page bring whatever the cache holds there (test_serving poisons it with NaN) and groups past
// the keys are not issued (stale rows), so the waiting threads zero those rows before the barrier
// that publishes the tile (kv_tma_take).
template <class Tr, bool kPaged>
constexpr bool kPagedTma = kPaged && kDecodeTile<Tr>;

// The TMA tiles run on three K/V stages, not the gather's two: a tile's boxes go out two tiles
// ahead of the one being used (kv_tma_issue_ahead), so that about two and a half tiles of K and V
// are in flight per CTA rather than one and a half (at pages of 16 a tile is 16 boxes from up to
// 4 scattered pages, whose latency the two stages left exposed: 0.77-0.86x the contiguous step).
// The third stage lies after the other two (dynamic shared memory kSmemTmaBytes, asked for only
// when the host set kv_tma: 112 KB at head dim 128, two CTAs per SM as before); the gather path
// of the same kernel keeps two stages and Tr::kSmemBytes.
constexpr int kTmaStages = 3;
template <class Tr>
constexpr int kSmemTmaBytes = Tr::kSmemBytes + 2 * (kTmaStages - Tr::kStages) * Tr::kKVBytes;

// The 6 barriers: K and V of stage 0, 1, 2 (the buffers in shared memory order). Only the
// kPagedTma kernels reference them.
__device__ __forceinline__ uint64_t *kv_tma_bars() {
    __shared__ __align__(8) uint64_t bars[2 * kTmaStages];
    return bars;
}
__device__ __forceinline__ uint32_t kv_tma_bar(int idx) { return cuda::smem_addr(kv_tma_bars() + idx); }

// Whether this CTA loads K/V by TMA: the host's choice (sm_90 only) and a 1024-byte aligned K/V
// area (the swizzle follows the absolute address; static shared memory comes before the dynamic).
template <class Tr, bool kPaged>
__device__ __forceinline__ bool paged_tma_on(const Params &p, uint32_t s_kv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kPagedTma<Tr, kPaged>) return p.kv_tma != 0 && (s_kv & 1023u) == 0;
#endif
    (void)p;
    (void)s_kv;
    return false;
}

// The warp that issues the boxes and stages their page entries: the last warp, which holds no
// query row at decode's few packed rows. Its lanes issue a K or V tile's boxes side by side (lane
// j box j: the page lookups, divisions and addresses in parallel, not one thread's chain of 8),
// and stage the next tile's page entries the same way (lane i entry i); lane 0 prefetches the
// descriptors and arms the barriers.
template <class Tr>
constexpr int kTmaIssuer = Tr::kThreads - 32;
template <class Tr>
__device__ __forceinline__ bool tma_issuer_warp(int tid) {
    return (tid >> 5) == (kTmaIssuer<Tr> >> 5);
}

// The issuing warp's lane 0 fetches both descriptors at the kernel's start, ahead of the first boxes.
template <class Tr, bool kPaged>
__device__ __forceinline__ void paged_tma_prefetch(const Params &p, const void *maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kPagedTma<Tr, kPaged>) {
        if (p.kv_tma != 0 && threadIdx.x == kTmaIssuer<Tr>) {
            cuda::prefetch_tensormap(&static_cast<const PagedTmaMaps *>(maps)->k);
            cuda::prefetch_tensormap(&static_cast<const PagedTmaMaps *>(maps)->v);
        }
    }
#endif
    (void)p;
    (void)maps;
}

// Before the first tile's boxes (kv_tma_first_tiles' barrier publishes them).
__device__ __forceinline__ void kv_tma_init(int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (tid == 0) {
#pragma unroll
        for (int i = 0; i < 2 * kTmaStages; ++i) cuda::mbar_init(kv_tma_bars() + i, 1);
        cuda::fence_mbar_init();
    }
#else
    (void)tid;
#endif
}

// Issue K or V tile [n0, n0 + kBN) into buffer s (buffer s - s_kv / kKVBytes: K, V of stage 0,
// then stage 1, 2; the same index picks its barrier). The tile's page entries are in
// paged_entries, where kv_tma_stage_entries put them (only the issuing warp reads them). Called
// by every thread (the issuing warp converged): lane 0 arms the barrier with the tile's bytes,
// then lane j issues box j (group j / kHalves, 64-column half j % kHalves).
template <class Tr>
__device__ __forceinline__ void load_paged_tma(const Params &p, const FwdLoopArgs &a, uint32_t s, int n0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Tile = cuda::SwizzledTile<Tr::kBN, Tr::kD>;
    constexpr int kGroups = Tr::kBN / 16, kHalves = Tr::kD / 64;
    static_assert(Tr::kD % 64 == 0 && !Tile::kHalfPage, "whole 64-column pages");
    static_assert(kGroups * kHalves <= 32, "a box per lane");
    if (!tma_issuer_warp<Tr>(a.tid)) return;
    const int lane = a.tid & 31;
    const int idx = static_cast<int>((s - a.s_kv) / Tr::kKVBytes);
    const uint32_t bar = kv_tma_bar(idx);
    const int groups = min(kGroups, (a.sk - n0 + 15) / 16);
    if (lane == 0) cuda::mbar_arrive_expect_tx_s(bar, static_cast<uint32_t>(groups * kHalves * 16 * 64 * 2));
    const int g = lane / kHalves, h = lane % kHalves;
    if (g < groups) {
        const PagedTmaMaps *maps = static_cast<const PagedTmaMaps *>(a.maps);
        const void *map = (idx & 1) ? static_cast<const void *>(&maps->v) : static_cast<const void *>(&maps->k);
        const int ps = p.page_size;
        const int key = n0 + 16 * g;
        const int pg = key / ps;
        const int page = paged_entries<Tr>(n0 / Tr::kBN)[pg - n0 / ps];
        cuda::tma_load_4d_s(s + h * Tile::kPageBytes + g * 16 * 128, map, bar, 64 * h, key - pg * ps, a.kvh, page);
    }
#else
    (void)p; (void)a; (void)s; (void)n0;
#endif
}

// Tile nb's page entries by cp.async from the issuing warp alone (lane i entry i; the warp is
// their only reader, so its lanes' cp.async waits and a __syncwarp make them visible: no CTA
// barrier). At most kBN / 16 entries (pages of a multiple of 16 keys).
template <class Tr>
__device__ __forceinline__ void kv_tma_stage_entries(const Params &p, const FwdLoopArgs &a, int nb) {
    if (!tma_issuer_warp<Tr>(a.tid)) return;
    __syncwarp();  // the lanes' reads of the entries this slot held (the tile issued just before)
    int first, count;
    tile_pages(p, nb, Tr::kBN, a.sk, first, count);
    const int lane = a.tid & 31;
    if (lane < count)
        cuda::cp_async_4(cuda::smem_addr(paged_entries<Tr>(nb) + lane), page_row(p) + first + lane, 4u);
}

// The walk's it-th tile uses stage it % kTmaStages; its barriers' phase is it / kTmaStages.
__device__ __forceinline__ int kv_tma_stage(int it) { return it % kTmaStages; }

// At the walk's it-th tile nb, once every thread is past the tile's first barrier (every warp is
// done with tile it - 1, so its stage is free; K of tile it need not have landed): K and V of
// tile nb - 2 into that stage, and the page entries of tile nb - 3 staged for the next call. The
// issuing warp waits for the entries it staged at the previous tile here, after that barrier, so
// that their round trip does not hold the barrier.
template <class Tr>
__device__ __forceinline__ void kv_tma_issue_ahead(const Params &p, const FwdLoopArgs &a, int nb, int it) {
    const int ahead = nb - (kTmaStages - 1);
    if (ahead < a.nb_first || !tma_issuer_warp<Tr>(a.tid)) return;
    cuda::cp_async_wait<0>();  // this lane's staged entries of tile `ahead`
    __syncwarp();              // ... and the other lanes'
    const uint32_t s = a.s_kv + static_cast<uint32_t>(kv_tma_stage(it + kTmaStages - 1)) * 2 * Tr::kKVBytes;
    load_paged_tma<Tr>(p, a, s, ahead * Tr::kBN);
    load_paged_tma<Tr>(p, a, s + Tr::kKVBytes, ahead * Tr::kBN);
    if (ahead > a.nb_first) kv_tma_stage_entries<Tr>(p, a, ahead - 1);
}

// The walk's it-th tile nb, its K (v = 0) or V (v = 1), for the warps that read it: wait for the
// buffer's barrier phase (each waiting thread's own wait makes the boxes' bytes visible to it).
// Warps without query rows (at decode's 4 packed rows all but warp 0) do not wait: they park at the
// next tile's barrier (bar.sync) instead of spinning in mbarrier waits beside the warp that
// computes. A sequence's last tile, whose rows past the keys must be zeroed (the last page's boxes
// bring whatever the cache holds there; groups past the keys are not issued), is waited for by
// every thread: they zero those rows together, fence the generic writes against the TMA that
// refills the buffer later, and publish them with a barrier.
template <class Tr>
__device__ __forceinline__ void kv_tma_take(const FwdLoopArgs &a, int nb, int it, int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Tile = cuda::SwizzledTile<Tr::kBN, Tr::kD>;
    constexpr int kCPR = Tr::kD / 8;
    const int rows = a.sk - nb * Tr::kBN;
    if (rows >= Tr::kBN && !a.warp_active) return;
    const int idx = 2 * kv_tma_stage(it) + v;
    cuda::mbar_wait_s(kv_tma_bar(idx), static_cast<uint32_t>((it / kTmaStages) & 1));
    if (rows < Tr::kBN) {
        const uint32_t buf = a.s_kv + static_cast<uint32_t>(idx) * Tr::kKVBytes;
        for (int i = a.tid; i < (Tr::kBN - rows) * kCPR; i += Tr::kThreads) {
            const int r = rows + i / kCPR;
            cuda::st_shared_v4(buf + Tile::offset(r, i % kCPR), make_uint4(0u, 0u, 0u, 0u));
        }
        cuda::fence_proxy_async_smem();
        __syncthreads();
    }
#else
    (void)a; (void)nb; (void)it; (void)v;
#endif
}

// cp.async K or V tile [n0, n0 + kBN) of this sequence (g: a.kg or a.vg; page_stride: k_bs or
// v_bs). Without kPaged it is exactly the contiguous load (a runtime test here, per tile, made
// ptxas spill in the big-tile kernels); paged pages of whole tiles only move the base pointer,
// smaller (or unaligned) pages take a row-by-row lookup. (The sm_90 TMA walk, a.kv_tma, does not
// come here: kv_tma_first_tiles and kv_tma_issue_ahead issue its boxes.)
// cols: K's head dim a.d, or V's p.head_dim_v (read from the parameters where used, so that it
// takes no register across the loop); columns past it are zero-filled.
template <class Tr, bool kPaged, bool kAllRows>
__device__ __forceinline__ void load_kv_tile(const Params &p, const FwdLoopArgs &a, uint32_t s, const uint16_t *g,
                                             int n0, int64_t rs, int64_t page_stride, int cols) {
    if constexpr (kPaged) {
        if (p.page_size % Tr::kBN != 0) {
            if constexpr (kDecodeTile<Tr> && kPagedRowRuns)
                load_paged_row_runs<Tr>(p, s, g, n0, rs, page_stride, a.sk, cols, a.tid);
            else
                load_paged_rows<Tr>(p, s, g, n0, rs, page_stride, a.sk, cols, a.tid);
            return;
        }
        g += page_shift(p, n0, rs, page_stride);
    }
    load_tile<Tr, Tr::kBN, kAllRows>(s, g, n0, rs, a.sk - n0, cols, a.tid);
}

// K tile nb (n0 = nb * kBN). With pages smaller than a tile it also stages the page-table entries
// of the walk's next tile, nb - 1 (paged plans take the plain walk only: no kVariants), in the same
// cp.async group; V tile nb reads the entries that K tile nb read.
template <class Tr, bool kPaged, bool kAllRows>
__device__ __forceinline__ void load_k_tile(const Params &p, const FwdLoopArgs &a, uint32_t s, int n0) {
    if constexpr (kPaged && kStagedPageEntries<Tr>) {
        if (p.page_size % Tr::kBN != 0 && n0 / Tr::kBN > a.nb_first)
            stage_page_entries_async<Tr>(p, n0 / Tr::kBN - 1, a.sk, a.tid);
    }
    load_kv_tile<Tr, kPaged, kAllRows>(p, a, s, a.kg, n0, p.k_rs, p.k_bs, a.d);
}

// V's columns: head_dim_v in the variants kernels, the runtime head dim (a register) elsewhere.
template <bool kVariants>
__device__ __forceinline__ int v_cols(const Params &p, const FwdLoopArgs &a) {
    if constexpr (kVariants) return p.head_dim_v;
    return a.d;
}

// Whether the walk has a tile after nb, and which (`next`): nb - 1 down to a.nb_first in the plain
// kernels; in the kVariants ones the walk goes on from the window's lowest tile to the sink tiles
// (fwd_mainloop), so the caller says which tile comes next (-1: none).
template <bool kVariants>
__device__ __forceinline__ bool has_next_tile(const FwdLoopArgs &a, int nb, int next) {
    if constexpr (kVariants) return next >= 0;
    return nb > a.nb_first;
}

// Single K/V buffer, at the point where every warp is done with K[nb]: wait for V[nb] (the only
// copy in flight), then refill the buffer with K[next]. Traits::kEarlyK places this before the
// softmax (as FlashAttention-2 does), otherwise it comes after it.
template <class Tr, bool kPaged, bool kVariants>
__device__ __forceinline__ void wait_v_load_next_k(const Params &p, const FwdLoopArgs &a, uint32_t s_k, int nb,
                                                   int next) {
    cuda::cp_async_wait<0>();  // V[nb] landed
    __syncthreads();           // every warp is done with K[nb]
    if (has_next_tile<kVariants>(a, nb, next)) {
        const int n0 = next * Tr::kBN;
        load_k_tile<Tr, kPaged, true>(p, a, s_k, n0);
        cuda::cp_async_commit();
    }
}

// Whether the kernel waits for a serving append late (load_first_tiles): the decode tiles.
template <class Tr>
constexpr bool kLateWait = kDecodeTile<Tr>;

template <class Tr>
__device__ __forceinline__ void load_first_q(const Params &p, const FwdLoopArgs &a) {
    if (a.G == 1)
        load_tile<Tr, Tr::kBM>(a.s_q, a.qg + a.hbase * p.q_hs, a.m0, p.q_rs, a.prows - a.m0, a.d, a.tid);
    else
        load_q<Tr>(a.s_q, a.qg, p.q_rs, p.q_hs, a.m0, a.prows, a.G, a.hbase, a.d, a.tid);
}

// The TMA walk's prologue (load_first_tiles' sm_90 form): the barriers, the page entries of the
// first two tiles (one round trip, one barrier), K / V of the first two tiles (before the append's
// wait when they lie below the appended rows, so that streaming covers the append), Q, then the
// third tile's entries, in the two cp.async groups of the gather's prologue.
template <class Tr>
__device__ __forceinline__ void kv_tma_first_tiles(const Params &p, const FwdLoopArgs &a, int nb_last) {
    const int n0 = nb_last * Tr::kBN;
    if (n0 + Tr::kBN > a.sk - p.seqused_add) cuda::pdl_wait();
    kv_tma_init(a.tid);
    int first0, count0, first1 = 0, count1 = 0;
    tile_pages(p, nb_last, Tr::kBN, a.sk, first0, count0);
    if (nb_last > a.nb_first) tile_pages(p, nb_last - 1, Tr::kBN, a.sk, first1, count1);
    if (a.tid < count0)
        paged_entries<Tr>(nb_last)[a.tid] = page_row(p)[first0 + a.tid];
    else if (a.tid < count0 + count1)
        paged_entries<Tr>(nb_last - 1)[a.tid - count0] = page_row(p)[first1 + a.tid - count0];
    __syncthreads();  // the entries and the initialised barriers
    // K and V of the first two tiles before the append's wait (a no-op when taken above): the walk
    // goes down from the last tile, so below the appended rows the first means the second too.
    load_paged_tma<Tr>(p, a, a.s_kv, n0);
    load_paged_tma<Tr>(p, a, a.s_kv + Tr::kKVBytes, n0);
    if (nb_last > a.nb_first) {
        const uint32_t s1 = a.s_kv + 2 * Tr::kKVBytes;
        load_paged_tma<Tr>(p, a, s1, n0 - Tr::kBN);
        load_paged_tma<Tr>(p, a, s1 + Tr::kKVBytes, n0 - Tr::kBN);
    }
    cuda::pdl_wait();
    load_first_q<Tr>(p, a);
    cuda::cp_async_commit();
    // Tile nb_last - 2 shares the first tile's slot, whose entries the issuing warp (the only
    // writer now) has just read (kv_tma_stage_entries syncs its lanes first).
    if (nb_last - 1 > a.nb_first) kv_tma_stage_entries<Tr>(p, a, nb_last - 2);
    cuda::cp_async_commit();
}

// Prologue: Q, K[nb_last] and V[nb_last] into the first buffer, as two cp.async groups (Q with K,
// then V). The first V tile goes out with Q and K (both buffer schemes), so that the first
// iteration waits for one memory round trip, not two.
// kLateWait (the decode tiles): the wait for a serving append (programmatic dependent launch)
// comes here, not at the kernel's start: a first tile below the appended rows [sk - seqused_add,
// sk) (every split of a long decode but the last) has its K issued before the wait, overlapping
// the append; Q (rotated by the append) after it. In the big-tile kernels this order spilled.
// (Q rotated in the kernel and the whole append folded into the decode tiles were both measured,
// stops 18-19, and did not beat this: docs/kernel-notes.md, "Decode speed".)
template <class Tr, class E, bool kPaged, bool kVariants>
__device__ __forceinline__ void load_first_tiles(const Params &p, const FwdLoopArgs &a, int nb_last) {
    constexpr int kBN = Tr::kBN;
    const int n0 = nb_last * kBN;
    if constexpr (kPagedTma<Tr, kPaged>) {
        if (a.kv_tma) {
            kv_tma_first_tiles<Tr>(p, a, nb_last);
            return;
        }
    }
    if constexpr (kLateWait<Tr>) {
        if (n0 + kBN > a.sk - p.seqused_add) cuda::pdl_wait();
    } else {
        load_first_q<Tr>(p, a);
    }
    if constexpr (kPaged && kStagedPageEntries<Tr>) {
        if (p.page_size % kBN != 0) stage_page_entries_now<Tr>(p, nb_last, a.sk, a.tid);
    }
    load_k_tile<Tr, kPaged, false>(p, a, a.s_kv, n0);
    if constexpr (kLateWait<Tr>) {
        cuda::pdl_wait();
        load_first_q<Tr>(p, a);
    }
    cuda::cp_async_commit();
    load_kv_tile<Tr, kPaged, false>(p, a, a.s_kv + Tr::kKVBytes, a.vg, n0, p.v_rs, p.v_bs, v_cols<kVariants>(p, a));
    cuda::cp_async_commit();
}

// Two K/V buffers, at the top of the it-th tile nb: wait for K[nb], then (once every warp is done
// with the other buffer) issue K and V of the walk's next tile into it.
template <class Tr, bool kPaged, bool kVariants>
__device__ __forceinline__ void wait_k_load_next(const Params &p, const FwdLoopArgs &a, int nb, int it, int next) {
    cuda::cp_async_wait<1>();  // K[nb] landed (V[nb] may still be in flight)
    __syncthreads();           // ... for every thread; the other buffer is free
    const uint32_t nxt = a.s_kv + (((it + 1) & 1) * 2 * Tr::kKVBytes);
    if (has_next_tile<kVariants>(a, nb, next)) {
        const int n0 = next * Tr::kBN;
        load_k_tile<Tr, kPaged, true>(p, a, nxt, n0);
        cuda::cp_async_commit();
        load_kv_tile<Tr, kPaged, true>(p, a, nxt + Tr::kKVBytes, a.vg, n0, p.v_rs, p.v_bs, v_cols<kVariants>(p, a));
        cuda::cp_async_commit();
    } else {
        cuda::cp_async_commit();
        cuda::cp_async_commit();
    }
}

// The ALiBi ramp (gemm_qk's kRamp) where it saves work and registers allow it. Its kNT*4 FMULs
// and MOVs per tile are shared by the warp's kMT m16 tiles, so with one m16 tile per warp (the
// small tiles, head dims >= 160) they would cost what the per-score FFMAs do. Of the two-m16-tile
// kVariants kernels (ptxas, CUDA 13.0, sm_90; docs/kernel-notes.md): head dims 32 and 96 take it
// with no spill; at 128 it spilled one more value of the walk (8 -> 16-byte stack, a third local
// load per key tile), at 64 (the 128 x 128 tile) 64 -> 104 bytes: those keep the FFMAs.
template <class Tr>
constexpr bool kAlibiRamp = Tr::kMT > 1 && (Tr::kD == 32 || Tr::kD == 96);

// Whether a one-sided ALiBi tile takes its column bias as gemm_qk's ramp: one slope for all of the
// CTA's rows (no pack-GQA, whose rows interleave heads) and no soft cap (the ramp enters S before
// the cap; the bias belongs after it). Read from the parameters where used, so that the walk keeps
// no register for it.
__device__ __forceinline__ bool alibi_ramp_on(const Params &p) { return p.pack == 1 && p.softcap_scale == 0.f; }

// The CTA's ALiBi slope in score units for the ramp (0 where alibi_ramp_on does not hold), staged
// in shared memory by fwd_mainloop before the walk's first barrier and read at each tile: loaded
// from global memory there, or kept in a register across the walk, it made the head dim 128
// kVariants kernel spill more of the walk's values (ptxas, CUDA 13.0).
__device__ __forceinline__ float &alibi_ramp_slope() {
    __shared__ float slope;
    return slope;
}

// O of one m16 tile times the softmax step's alpha per row half. (Skipping this when no row's max
// moved, behind a warp vote, measured 2-3% slower at head dim 64 and no better elsewhere on the
// H200.)
template <class Tr>
__device__ __forceinline__ void rescale_o(float (&O)[Tr::kDT][4], const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < Tr::kDT; ++dt) {
        O[dt][0] *= alpha[0];
        O[dt][1] *= alpha[0];
        O[dt][2] *= alpha[1];
        O[dt][3] *= alpha[1];
    }
}

// The keys of a narrow sink tile's chunk (fwd_key_tile's kSink body): one k16 step of P V, two n8
// tiles of S. fwd_mainloop sends a sink tile there when all its sink keys lie among them.
constexpr int kSinkChunkKeys = 16;

// A sink tile's m16 tile mt when its sink keys all lie in the first kSinkChunkKeys keys
// (fwd_key_tile's narrow kSink form): soft cap, ALiBi's general bias, the sink mask and the softmax step on the
// chunk's two n8 tiles of S, P into the first k16 fragment (the only one gemm_pv reads then).
template <class Tr, class E, class RowDiag, class RowHead>
__device__ __forceinline__ void sink_chunk_softmax(const Params &p, const FwdLoopArgs &a, int nb,
                                                   const RowDiag &row_diag, const RowHead &row_head, int mt,
                                                   float (&S_mt)[Tr::kNT][4], uint32_t (&P_mt)[Tr::kVS][4],
                                                   float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2]) {
    float(&S)[kSinkChunkKeys / 8][4] = reinterpret_cast<float(&)[kSinkChunkKeys / 8][4]>(S_mt);
    uint32_t(&P)[1][4] = reinterpret_cast<uint32_t(&)[1][4]>(P_mt);
    if (p.softcap_scale != 0.f) cuda::softcap_scores(S, p.softcap_scale);
    int rdiag[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) rdiag[h] = row_diag(mt, h);
    const int col0 = nb * Tr::kBN + 2 * a.t;
    if (p.alibi_slopes != nullptr) {
        float slope[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) slope[h] = p.alibi_slopes[row_head(mt, h)] * p.alibi_to_score;
        cuda::alibi_scores(S, rdiag, slope, col0);
    }
    cuda::mask_scores<true>(S, rdiag, col0, a.sk, p.right_i, p.left_i, p.sink_tokens);
    cuda::softmax_step<E>(S, row_max, row_sum, a.sl2, P, alpha);
}

// The scores of one key tile (kMT m16 tiles) to P, with the soft cap, ALiBi (the general bias on
// edge tiles, the one-sided form in the kAlibi body), the edge mask and the softmax step; O
// rescaled by the step's alpha.
template <class Tr, class E, bool kVariants, bool kMasked, bool kAlibi, class RowDiag, class RowHead>
__device__ __forceinline__ void tile_softmax(const Params &p, const FwdLoopArgs &a, int nb, const RowDiag &row_diag,
                                             const RowHead &row_head, float (&S)[Tr::kMT][Tr::kNT][4],
                                             uint32_t (&P)[Tr::kMT][Tr::kVS][4], float (&O)[Tr::kMT][Tr::kDT][4],
                                             float (&row_max)[Tr::kMT][2], float (&row_sum)[Tr::kMT][2]) {
    constexpr int kBN = Tr::kBN, kMT = Tr::kMT;
    constexpr bool kRamp = kAlibi && kAlibiRamp<Tr>;
    if (p.softcap_scale != 0.f)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) cuda::softcap_scores(S[mt], p.softcap_scale);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kMasked) {
            int rdiag[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) rdiag[h] = row_diag(mt, h);
            if constexpr (kVariants) {
                // ALiBi plans take this body for the tiles that cross a row's diagonal
                // (AlibiBand) besides the edge tiles: the general bias, then the mask.
                if (p.alibi_slopes != nullptr) {
                    float slope[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h) slope[h] = p.alibi_slopes[row_head(mt, h)] * p.alibi_to_score;
                    cuda::alibi_scores(S[mt], rdiag, slope, nb * kBN + 2 * a.t);
                }
                cuda::mask_scores<true>(S[mt], rdiag, nb * kBN + 2 * a.t, a.sk, p.right_i, p.left_i, p.sink_tokens);
            } else {
                cuda::mask_scores(S[mt], rdiag, nb * kBN + 2 * a.t, a.sk, p.right_i, p.left_i);
            }
        }
        float alpha[2];
        if constexpr (kAlibi) {
            int rdiag[2];
            float slope[2], shift[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                rdiag[h] = row_diag(mt, h);
                slope[h] = p.alibi_slopes[row_head(mt, h)] * p.alibi_to_score;
            }
            if (kRamp && alibi_ramp_on(p))
                cuda::alibi_shift_one_side(rdiag, slope, nb * kBN + 2 * a.t, shift);
            else
                cuda::alibi_scores_one_side(S[mt], rdiag, slope, nb * kBN + 2 * a.t, shift);
            cuda::softmax_step_shifted<E>(S[mt], row_max[mt], row_sum[mt], a.sl2, P[mt], alpha, shift);
        } else {
            cuda::softmax_step<E>(S[mt], row_max[mt], row_sum[mt], a.sl2, P[mt], alpha);
        }
        rescale_o<Tr>(O[mt], alpha);
    }
}

// One K/V tile nb, the it-th of the walk. kMasked: an edge tile that needs the element mask (a
// separate copy of the body, so the steady state carries no mask code or registers); row_diag(mt,
// h) is then the query position + (sk - sq) of this thread's row half h of m16 tile mt. It is the
// kernel's functor, taken by reference, because the row -> query map is the kernel's (pack-GQA
// here), and because reading the thread's row (m0, warp, g) from FwdLoopArgs or from parameters
// instead changed the SASS of the two-m16-tile configurations (8 fewer instructions at head dim
// 64, different scheduling), which this reorganisation was not to do. Tiles loaded here lie
// below the first one, so all their rows are in range (only a sequence's last key tile can be
// partial): they are loaded with kAllRows.
// next: the walk's next tile (has_next_tile).
// kAlibi (kVariants, not kMasked): an ALiBi tile wholly on one side of every row's diagonal
// (AlibiBand): the bias as a per-column part and a row offset to the softmax
// (cuda::alibi_scores_one_side, softmax_step_shifted), in a third copy of the body so that the
// other two stay as they are. The column part is one FFMA per score, or, where one slope holds
// for all of the CTA's rows (alibi_ramp_on) and the warp has several m16 tiles (kAlibiRamp),
// gemm_qk's ramp (the first k-step's C operand). Both forms share this body (a branch on a kernel
// parameter): a fourth copy for the ramp alone spilled more. alibi_left: the tile lies left of
// every row's diagonal (else right of every one).
// kSink (kVariants, kMasked): a sink-token tile whose visible keys (sink keys only) all lie in its
// first 16 keys (fwd_mainloop sends other sink tiles to the kMasked body): both GEMMs, the mask and
// the softmax cover that chunk alone (a whole tile for 4 sink keys cost FA2 a key tile per query
// tile; with the GEMMs bounded alone, stop 15, the softmax and mask on every column still cost
// about one). A runtime choice between this and the whole-tile body inside one copy spilled
// 136 bytes at head dim 128 (ptxas, CUDA 13.0), hence the dispatch in the walk.
template <class Tr, class E, bool kPaged, bool kVariants, bool kMasked, class RowDiag, class RowHead,
          bool kAlibi = false, bool kSink = false>
__device__ __forceinline__ void fwd_key_tile(const Params &p, const FwdLoopArgs &a, const int nb,
                                             const int it, const int next, float (&O)[Tr::kMT][Tr::kDT][4],
                                             float (&row_max)[Tr::kMT][2], float (&row_sum)[Tr::kMT][2],
                                             const RowDiag &row_diag, const RowHead &row_head,
                                             bool alibi_left = false) {
    constexpr int kBN = Tr::kBN, kMT = Tr::kMT, kNT = Tr::kNT;
    uint32_t st_off = Tr::kStages == 2 ? (it & 1) * 2 * Tr::kKVBytes : 0;
    if constexpr (Tr::kStages == 2) {
        // The sm_90 paged TMA walk (kv_tma) takes three stages (kTmaStages); the other kernels'
        // source is the two-stage step alone (kept so: their SASS is main's).
        if constexpr (kPagedTma<Tr, kPaged>) {
            if (a.kv_tma) {
                // The barrier first, then the boxes of tile it + 2, then K of tile it: the refill
                // waits only for every warp to be done with tile it - 1, not for K of tile it to
                // land, and the warps without rows wait at this barrier alone (kv_tma_take).
                st_off = kv_tma_stage(it) * 2 * Tr::kKVBytes;
                if (it == 0) cuda::cp_async_wait<0>();  // Q (every thread's copies), the prologue's entries
                __syncthreads();  // ... for every thread; every warp is done with tile it - 1: its stage is free
                kv_tma_issue_ahead<Tr>(p, a, nb, it);
                cuda::cp_async_commit();  // the issuing warp's staged entries
                kv_tma_take<Tr>(a, nb, it, 0);
            } else {
                wait_k_load_next<Tr, kPaged, kVariants>(p, a, nb, it, next);
            }
        } else {
            wait_k_load_next<Tr, kPaged, kVariants>(p, a, nb, it, next);
        }
    } else if (it == 0) {
        cuda::cp_async_wait<1>();  // Q and K[nb] landed (V[nb], from the prologue, may not)
        __syncthreads();
    } else {
        cuda::cp_async_wait<0>();  // K[nb] landed
        __syncthreads();           // every warp is done with V[nb+1]
        load_kv_tile<Tr, kPaged, true>(p, a, a.s_kv + Tr::kKVBytes, a.vg, nb * kBN, p.v_rs, p.v_bs, v_cols<kVariants>(p, a));
        cuda::cp_async_commit();
    }

    // A warp past the last query row (warp_active false) skips the math. With kEarlyK it must
    // still reach the barrier between the S GEMM and the softmax; it then leaves the tile, whose
    // remaining steps have no barrier.
    // kSink: the tile's first chunk, which holds all its sink keys (fwd_mainloop).
    constexpr int sink_chunks = kSink ? kSinkChunkKeys / 16 : 0;
    uint32_t P[kMT][Tr::kVS][4];
    if (a.warp_active || Tr::kEarlyK) {
        float S[kMT][kNT][4];
        constexpr bool kRamp = kAlibi && kAlibiRamp<Tr>;
        if (a.warp_active)
            gemm_qk<Tr, E, kSink, kRamp>(S, a.q_f, a.q_h, a.k_f0 + st_off, a.k_h0 + st_off, sink_chunks,
                                         kRamp ? (alibi_left ? alibi_ramp_slope() : -alibi_ramp_slope()) : 0.f);
        if constexpr (Tr::kEarlyK) {
            wait_v_load_next_k<Tr, kPaged, kVariants>(p, a, a.s_kv, nb, next);
            if (!a.warp_active) return;
        }
        if constexpr (kSink) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                float alpha[2];
                sink_chunk_softmax<Tr, E>(p, a, nb, row_diag, row_head, mt, S[mt], P[mt], row_max[mt], row_sum[mt],
                                          alpha);
                rescale_o<Tr>(O[mt], alpha);
            }
        } else {
            tile_softmax<Tr, E, kVariants, kMasked, kAlibi>(p, a, nb, row_diag, row_head, S, P, O, row_max, row_sum);
        }
    }

    if constexpr (Tr::kStages == 2) {
        if constexpr (kPagedTma<Tr, kPaged>) {
            if (a.kv_tma) {
                kv_tma_take<Tr>(a, nb, it, 1);
            } else {
                cuda::cp_async_wait<2>();  // V[nb] landed
                __syncthreads();
            }
        } else {
            cuda::cp_async_wait<2>();  // V[nb] landed
            __syncthreads();
        }
    } else if constexpr (!Tr::kEarlyK) {
        wait_v_load_next_k<Tr, kPaged, kVariants>(p, a, a.s_kv, nb, next);
    }
    if (a.warp_active) gemm_pv<Tr, E, kSink>(O, P, a.v_f0 + st_off, a.v_h0 + st_off, sink_chunks);
}

// ALiBi (kVariants): the key tiles lo..hi that cross some row's diagonal (a row sees keys on both
// sides of it), which take the edge body; the others lie wholly on one side of every row's
// diagonal and take the one-FFMA form (fwd_key_tile with kAlibi). Empty (lo > hi) without ALiBi.
struct AlibiBand {
    int lo = 1, hi = 0;
    bool on = false;
};

__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }

// Rows' diagonal keys rdiag_lo .. rdiag_hi (query position + offset of the first and last row):
// tile nb lies wholly left of every row's diagonal iff nb*kBN + kBN - 1 <= rdiag_lo, wholly right
// of it iff nb*kBN >= rdiag_hi.
__device__ __forceinline__ AlibiBand alibi_band(int rdiag_lo, int rdiag_hi, int kBN) {
    AlibiBand band;
    band.on = true;
    band.lo = floor_div(rdiag_lo + 1, kBN);
    band.hi = -floor_div(-rdiag_hi, kBN) - 1;
    return band;
}

// The whole walk over key tiles nb_last down to a.nb_first, accumulating the unnormalised O and
// the running row max / sum that the epilogue finishes (cuda::finish_rows). kVariants: then the
// sink tiles s_last down to 0 (cuda::sink_tile_last; -1: none; all below a.nb_first) in the same
// pipeline: each tile's prefetch is the walk's next tile, so the switch costs no drain (walked
// first, with a prologue of their own, they cost FA2 a memory round trip per query tile). Either
// part may be empty, not both. Sink tiles take the masked body (kt.masked holds for each) with
// their GEMMs bounded (kSink).
template <class Tr, class E, bool kPaged, bool kVariants, class RowDiag, class RowHead>
__device__ __forceinline__ void fwd_mainloop(const Params &p, const FwdLoopArgs &a, const cuda::KeyTiles &kt,
                                             int nb_last, float (&O)[Tr::kMT][Tr::kDT][4],
                                             float (&row_max)[Tr::kMT][2], float (&row_sum)[Tr::kMT][2],
                                             const RowDiag &row_diag, const RowHead &row_head, int s_last = -1,
                                             const AlibiBand band = AlibiBand()) {
    if constexpr (!kVariants) {
        load_first_tiles<Tr, E, kPaged, kVariants>(p, a, nb_last);
        int it = 0;
        for (int nb = nb_last; nb >= a.nb_first; --nb, ++it) {
            if (kt.masked(nb))
                fwd_key_tile<Tr, E, kPaged, kVariants, true>(p, a, nb, it, nb - 1, O, row_max, row_sum, row_diag,
                                                             row_head);
            else
                fwd_key_tile<Tr, E, kPaged, kVariants, false>(p, a, nb, it, nb - 1, O, row_max, row_sum, row_diag,
                                                              row_head);
        }
    } else {
        const bool window = nb_last >= a.nb_first;
        if constexpr (kAlibiRamp<Tr>) {
            // (published by the first tile's barrier; one query head when alibi_ramp_on holds)
            if (band.on && a.tid == 0)
                alibi_ramp_slope() = alibi_ramp_on(p) ? p.alibi_slopes[a.hbase] * p.alibi_to_score : 0.f;
        }
        load_first_tiles<Tr, E, kPaged, kVariants>(p, a, window ? nb_last : s_last);
        int it = 0;
        for (int nb = window ? nb_last : s_last; nb >= 0; ++it) {
            const bool sink = nb < a.nb_first || !window;
            const int next = sink ? nb - 1 : nb > a.nb_first ? nb - 1 : s_last;
            if (sink && p.sink_tokens - nb * Tr::kBN <= kSinkChunkKeys)
                fwd_key_tile<Tr, E, kPaged, kVariants, true, RowDiag, RowHead, false, true>(
                    p, a, nb, it, next, O, row_max, row_sum, row_diag, row_head);
            else if (sink || kt.masked(nb) || (nb >= band.lo && nb <= band.hi))
                fwd_key_tile<Tr, E, kPaged, kVariants, true>(p, a, nb, it, next, O, row_max, row_sum, row_diag,
                                                             row_head);
            else if (band.on)
                fwd_key_tile<Tr, E, kPaged, kVariants, false, RowDiag, RowHead, true>(
                    p, a, nb, it, next, O, row_max, row_sum, row_diag, row_head, nb < band.lo);
            else
                fwd_key_tile<Tr, E, kPaged, kVariants, false>(p, a, nb, it, next, O, row_max, row_sum, row_diag,
                                                              row_head);
            nb = next;
        }
    }
}

}  // namespace fa2
}  // namespace flashattn
