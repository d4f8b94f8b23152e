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
// chunk cc ^ (r % 8) of its row, the TMA SWIZZLE_128B placement). Thread `tid` takes chunks tid,
// tid + 128, ..., row-major, so a warp reads whole 128-byte row segments. Committed as one
// cp.async group by the caller. Strides and pointers are read from the kernel parameters (the
// constant bank) rather than kept in registers: the producer warpgroup runs on 40 registers.
template <class Tr, bool kV>
__device__ __forceinline__ void gather_tile(const Params &p, const TileCoords &c, unsigned char *dst, int n0,
                                            int tid) {
    constexpr int kCPR = Tr::kD / 8;  // 16-byte chunks per row
    constexpr int kChunks = Tr::kBN * kCPR;
    static_assert(kChunks % kProducerThreads == 0, "the tile must split evenly over the producer threads");
    const int64_t bs = kV ? p.v_bs : p.k_bs, rs = kV ? p.v_rs : p.k_rs, hs = kV ? p.v_hs : p.k_hs;
    const bool paged = p.page_table != nullptr;
    // This kv head's column 0 at key 0 of the sequence (contiguous) or of page 0 (paged).
    int64_t off = static_cast<int64_t>(c.head / p.group) * hs;
    if (!paged) off += p.cu_k != nullptr ? c.seq.k_row0 * rs : static_cast<int64_t>(c.b) * bs;
    const uint16_t *base = static_cast<const uint16_t *>(kV ? p.v : p.k) + off;
    const int32_t *pages = p.page_table + static_cast<int64_t>(c.b) * p.page_table_stride;
    const int sk = c.seq.sk;
    const uint32_t s = cuda::smem_addr(dst);
#pragma unroll 2
    for (int i = tid; i < kChunks; i += kProducerThreads) {
        const int r = i / kCPR, cc = i - r * kCPR;
        const int key = n0 + r;
        const bool ok = key < sk && cc * 8 < p.head_dim;
        const uint16_t *src = base;  // any valid address: a zero-byte copy reads nothing
        if (ok) {
            const int64_t row = paged ? static_cast<int64_t>(pages[key / p.page_size]) * bs +
                                            static_cast<int64_t>(key % p.page_size) * rs
                                      : static_cast<int64_t>(key) * rs;
            src = base + row + cc * 8;
        }
        const uint32_t at = s + (cc / 8) * Tr::kKVPage + r * 128 + (((cc % 8) ^ (r % 8)) << 4);
        cuda::cp_async_16(at, src, ok ? 16u : 0u);
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
    int prev_vs = -1;  // ring stage of the V tile issued last and not yet signalled
    for (int i = pipe.kv, nb = c.kt.last; nb >= c.kt.first; ++i, --nb) {
        const int st = stage_of(i);
        const uint32_t ph = phase_of(i);
        const int n0 = nb * Tr::kBN;
        cuda::mbar_wait(&bars->k_empty[st], ph ^ 1u);
        gather_tile<Tr, false>(p, c, smem + Tr::kKOffset + st * Tr::kKVBytes, n0, tid);
        cuda::cp_async_commit();
        if (prev_vs >= 0) signal_landed<1>(&bars->v_full[prev_vs]);
        if (nb == c.kt.last && tid == 0) {
            cuda::mbar_wait(&bars->q_empty, static_cast<uint32_t>(pipe.q & 1) ^ 1u);
            cuda::mbar_arrive_expect_tx(&bars->q_full, Tr::kQBytes);
            tma_tile<Tr>(smem, Tr::kQPage, tm_q, &bars->q_full, q_row_coord(p, c), c.head, batch_coord(p, c));
        }
        cuda::mbar_wait(&bars->v_empty[st], ph ^ 1u);
        gather_tile<Tr, true>(p, c, smem + Tr::kVOffset + st * Tr::kKVBytes, n0, tid);
        cuda::cp_async_commit();
        signal_landed<1>(&bars->k_full[st]);
        prev_vs = st;
    }
    if (prev_vs >= 0) signal_landed<0>(&bars->v_full[prev_vs]);
    pipe.kv += c.kt.last - c.kt.first + 1;
    pipe.q += 1;
}

}  // namespace fa3
}  // namespace flashattn
