// Tile shapes of the compiled FA3 forward kernels. Shared by the kernels (to instantiate them) and
// the host (to pick one, encode the TMA boxes and size the grid); plain C++.
//
// Every kernel has 3 warpgroups: a producer (one thread issues the TMA loads) and two consumers
// that own 64 query rows each of a 128-row tile. Head dims are compiled in multiples of 64 (one
// 128-byte swizzle page per 64 columns): a head dim between two of them runs on the larger one,
// the columns past it loaded as zeros by TMA and never stored.
#pragma once

namespace flashattn {
namespace fa3 {

constexpr int kBlockM = 128;          // query rows per CTA (64 per consumer warpgroup)
constexpr int kThreads = 3 * 128;     // producer + 2 consumer warpgroups
constexpr int kStages = 2;            // K and V shared-memory buffers (separate rings)
constexpr int kMaxSmemBytes = 232448; // 227 KB: what an H100/H200 block may opt in to

struct TileConfig {
    int head_dim;  // compiled (padded) head dim: 64, 128, 192 or 256
    int block_n;   // keys per K/V tile
};

// block_n keeps the consumer's registers (O: d/2, S: n/2, P twice: n/4 each) under its 232 and
// two K and two V stages plus Q inside 227 KB.
constexpr TileConfig config_for(int head_dim) {
    return head_dim <= 64    ? TileConfig{64, 128}
           : head_dim <= 128 ? TileConfig{128, 128}
           : head_dim <= 192 ? TileConfig{192, 96}
                             : TileConfig{256, 80};
}

constexpr int q_bytes(const TileConfig &c) { return kBlockM * c.head_dim * 2; }
constexpr int kv_bytes(const TileConfig &c) { return c.block_n * c.head_dim * 2; }
// Q, K and V stages, 1 KB of barriers (padded) and 1 KB to align the dynamic base to 1024 B.
constexpr int smem_bytes(const TileConfig &c) { return q_bytes(c) + 2 * kStages * kv_bytes(c) + 2048; }

static_assert(smem_bytes(config_for(256)) <= kMaxSmemBytes, "head dim 256 tile does not fit");
static_assert(smem_bytes(config_for(192)) <= kMaxSmemBytes, "head dim 192 tile does not fit");
static_assert(smem_bytes(config_for(128)) <= kMaxSmemBytes, "head dim 128 tile does not fit");

}  // namespace fa3
}  // namespace flashattn
