// FA3 forward, gathering producer (Params::gather: paged K/V caches and seqused_k): the four warps
// of warpgroup 0 copy K and V tiles with cp.async, 16 bytes per copy, into the same 128-byte-
// swizzled ring buffers the TMA producer fills (fa3_producer.cuh), so the consumers run unchanged.
// Each key row is looked up on its own (any page size from 1 up), and rows past the sequence's
// used keys and columns past the head dim are zero-filled: a masked key then adds exactly 0 to
// P V, whatever the cache holds past its fill level (NaN in the tests). Q still comes by TMA.
//
// Completion: cp.async writes through the generic proxy while wgmma reads through the async proxy,
// so each producer thread waits for its own copies of a tile, fences the proxies and arrives on the
// tile's "full" barrier (which counts kProducerThreads arrivals in this mode). To keep two tiles in
// flight the arrival lags one cp.async group: K_i is signalled after V_i is issued, V_i after
// K_{i-1} (the next key tile) is issued; the last V of a work tile is flushed at its end. No
// thread ever waits on an "empty" barrier while holding an unsignalled tile that the consumers
// need to get there (the consumers only wait for K_i and V_{i-1} before releasing anything).
#pragma once

#include <cstdint>

#include <cuda.h>

#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_producer.cuh"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

constexpr int kProducerThreads = 128;  // warpgroup 0, all of it in the gathering mode

// cp.async key tile [n0, n0 + kBN) of K (kV false) or V of work tile `c` into `dst` (one ring
// buffer: kPages swizzle pages of kBN rows of 128 bytes; the 16-byte chunk cc of row r sits at
// chunk cc ^ (r % 8) of its row, the TMA SWIZZLE_128B placement). Thread `tid` owns one chunk
// column and every kRowStep-th row, so a warp reads whole 128-byte row segments and the loop
// carries one row counter. Committed as one cp.async group by the caller. Strides and pointers
// are read from the kernel parameters (the constant bank) rather than held: the producer
// warpgroup runs on 40 registers, and test_fa3_sass allows no spill.
template <class Tr, bool kV>
__device__ __forceinline__ void gather_tile(const Params &p, const TileCoords &c, unsigned char *dst, int n0,
                                            int tid) {
    constexpr int kCPR = Tr::kD / 8;                     // 16-byte chunks per row
    constexpr int kCPRp = kCPR <= 8 ? 8 : kCPR <= 16 ? 16 : 32;  // ... rounded up to a power of two
    constexpr int kRowStep = kProducerThreads / kCPRp;   // rows per pass of the warpgroup
    static_assert(Tr::kBN % kRowStep == 0, "the tile must split evenly over the producer threads");
    const int cc = tid % kCPRp, r0 = tid / kCPRp;        // this thread's chunk column and first row
    if (cc >= kCPR) return;                              // (head dim 192: 8 of 32 lanes idle)
    const int64_t bs = kV ? p.v_bs : p.k_bs, rs = kV ? p.v_rs : p.k_rs;
    const bool paged = p.page_table != nullptr;
    // This kv head's column 8 cc at key 0 of the sequence (contiguous) or of page 0 (paged).
    int64_t off = static_cast<int64_t>(c.head / p.group) * (kV ? p.v_hs : p.k_hs) + cc * 8;
    if (!paged) off += p.cu_k != nullptr ? c.seq.k_row0 * rs : static_cast<int64_t>(c.b) * bs;
    const uint16_t *base = static_cast<const uint16_t *>(kV ? p.v : p.k) + off;
    const int32_t *pages = p.page_table + static_cast<int64_t>(c.b) * p.page_table_stride;
    const int rows = min(Tr::kBN, c.seq.sk - n0);        // rows past the used keys: zeros
    const bool col_ok = cc * 8 < p.head_dim;
    const uint32_t s = cuda::smem_addr(dst) + (cc / 8) * Tr::kKVPage;
#pragma unroll 1
    for (int r = r0; r < Tr::kBN; r += kRowStep) {
        const bool ok = col_ok && r < rows;
        const uint16_t *src = base;  // any valid address: a zero-byte copy reads nothing
        if (ok) {
            const int key = n0 + r;
            src += paged ? static_cast<int64_t>(pages[key / p.page_size]) * bs +
                               static_cast<int64_t>(key % p.page_size) * rs
                         : static_cast<int64_t>(key) * rs;
        }
        cuda::cp_async_16(s + r * 128 + (((cc % 8) ^ (r % 8)) << 4), src, ok ? 16u : 0u);
    }
}

// This thread's copies of the older of its two newest groups have landed (kLeft = 1), or all of
// them (kLeft = 0): make them visible to wgmma and count this thread on `full`.
template <int kLeft>
__device__ __forceinline__ void signal_landed(uint64_t *full) {
    cuda::cp_async_wait<kLeft>();
    cuda::fence_proxy_async_smem();
    cuda::mbar_arrive(full);
}

// The gathering counterpart of produce(): same ring order and phases, all kProducerThreads threads.
template <class Tr>
__device__ __forceinline__ void produce_gather(const Params &p, const TileCoords &c, const CUtensorMap *tm_q,
                                               unsigned char *smem, Barriers *bars, Pipe &pipe, int tid) {
    // Q first (one thread): its coordinates then die before the key loop, which runs on 40 registers.
    if (tid == 0) {
        cuda::mbar_wait(&bars->q_empty, static_cast<uint32_t>(pipe.q & 1) ^ 1u);
        cuda::mbar_arrive_expect_tx(&bars->q_full, Tr::kQBytes);
        tma_tile<Tr>(smem, Tr::kQPage, tm_q, &bars->q_full, q_row_coord(p, c), c.head, batch_coord(p, c));
    }
    // Ring position i holds key tile nb; V of position i - 1 is the one issued last and not yet signalled.
    const int n_tiles = c.kt.last - c.kt.first + 1;
    for (int i = pipe.kv, nb = c.kt.last; nb >= c.kt.first; ++i, --nb) {
        const int st = stage_of(i);
        const uint32_t ph = phase_of(i);
        const int n0 = nb * Tr::kBN;
        cuda::mbar_wait(&bars->k_empty[st], ph ^ 1u);
        gather_tile<Tr, false>(p, c, smem + Tr::kKOffset + st * Tr::kKVBytes, n0, tid);
        cuda::cp_async_commit();
        if (nb != c.kt.last) signal_landed<1>(&bars->v_full[stage_of(i - 1)]);
        cuda::mbar_wait(&bars->v_empty[st], ph ^ 1u);
        gather_tile<Tr, true>(p, c, smem + Tr::kVOffset + st * Tr::kKVBytes, n0, tid);
        cuda::cp_async_commit();
        signal_landed<1>(&bars->k_full[st]);
    }
    signal_landed<0>(&bars->v_full[stage_of(pipe.kv + n_tiles - 1)]);  // (the caller ensures n_tiles >= 1)
    pipe.kv += n_tiles;
    pipe.q += 1;
}

}  // namespace fa3
}  // namespace flashattn
