// FA2 compile-time tile geometry (KernelTraits), the map from a compiled configuration
// (fa2_config.h) to it, and the packed-row mapping of pack-GQA. Every other fa2_*.cuh file is
// templated on a KernelTraits `Tr` and reads its shapes from here, so that the loaders, GEMMs and
// epilogue can be reused by a kernel with other tiles (a backward pass) by giving it its own traits.
//
// Warp layout all FA2 kernels assume: warps split the query (M) rows of the CTA tile, kWarpRows =
// 16 * kMT rows each, and hold their accumulators in mma.sync m16n8 fragments (device/ptx.cuh);
// no warp ever needs another warp's rows, so nothing is reduced across warps.
#pragma once

#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa2/fa2_config.h"

namespace flashattn {
namespace fa2 {

template <int kD_, int kBM_, int kBN_, int kNW_, int kStages_, int kMinBlocks_>
struct KernelTraits {
    static constexpr int kD = kD_;
    static constexpr int kBM = kBM_;
    static constexpr int kBN = kBN_;
    static constexpr int kNW = kNW_;
    static constexpr int kStages = kStages_;
    static constexpr int kMinBlocks = kMinBlocks_;
    static constexpr int kThreads = kNW * 32;
    static constexpr int kMT = kBM / (16 * kNW);  // m16 tiles per warp
    static constexpr int kWarpRows = 16 * kMT;
    static constexpr int kNT = kBN / 8;   // n8 tiles of S per warp
    static constexpr int kDT = kD / 8;    // n8 tiles of O per warp
    static constexpr int kKS = kD / 16;   // k16 steps of S = Q K^T
    static constexpr int kVS = kBN / 16;  // k16 steps of O += P V
    using QTile = cuda::SwizzledTile<kBM, kD>;
    using KVTile = cuda::SwizzledTile<kBN, kD>;
    static constexpr int kQBytes = QTile::kBytes;
    static constexpr int kKVBytes = KVTile::kBytes;
    static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes;
    // Single K/V buffer with one m16 row tile per warp (head dim 256's 64 x 64 tile): issue the
    // next K load right after the S GEMM, before the softmax. Measured on the H200 (bf16, seqlen
    // 1k-16k): +2..+8% at head dim 256; at head dim 128 (two m16 tiles per warp) it cost 10-13%.
    static constexpr bool kEarlyK = kStages == 1 && kMT == 1;
    static_assert(kMT >= 1 && kBM == 16 * kNW * kMT, "block_m must be a multiple of 16*warps");
    static_assert(kD % 32 == 0 && kBN % 16 == 0, "unsupported tile shape");
    static_assert(kStages == 1 || kStages == 2, "one or two K/V buffers");
    static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1 KB alignment");
};

// The traits of the compiled forward configuration for head dim kD (main or small variant).
template <int kD, bool kSmall>
struct TraitsFor {
    static constexpr TileConfig c = kSmall ? small_config(kD) : prefill_config(kD);
    static_assert(c.head_dim == kD, "no such compiled configuration");
    using type = KernelTraits<c.head_dim, c.block_m, c.block_n, c.warps, c.stages, c.min_blocks>;
};

// Packed row -> (query position, query head). A CTA's packed rows are its query rows; with
// pack-GQA (G > 1 query heads per kv head) the G heads of one kv head are interleaved along M,
// packed row r being position r / G of head hbase + r % G. Without pack-GQA G == 1 and
// head == hbase.
__device__ __forceinline__ void unpack_row(int prow, int G, int hbase, int &qpos, int &head) {
    if (G == 1) {
        qpos = prow;
        head = hbase;
    } else {
        qpos = prow / G;
        head = hbase + (prow - qpos * G);
    }
}

constexpr int next_pow2(int x) { return x <= 1 ? 1 : 2 * next_pow2((x + 1) / 2); }
constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

}  // namespace fa2
}  // namespace flashattn
