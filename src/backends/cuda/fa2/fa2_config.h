// Tile configurations of the compiled FA2 forward variants. Shared by the kernels (to instantiate
// them) and the host (to pick one, size the grid and estimate residency for split-KV).
#pragma once

namespace flashattn {
namespace fa2 {

struct TileConfig {
    int head_dim;    // compiled head dim kD
    int block_m;     // query rows per CTA
    int block_n;     // keys per K/V tile
    int warps;       // warps per CTA; each owns block_m / warps query rows
    int stages;      // K/V shared-memory buffers (1: FA2's single buffer, 2: double buffer)
    int min_blocks;  // __launch_bounds__ residency target (CTAs per SM)
};

// Main ("prefill") configurations, following FlashAttention-2's sm80/sm90 choices (kernel guide
// section 2.1) plus a second K/V buffer where two CTAs per SM still fit in 227 KB.
constexpr TileConfig prefill_config(int kD) {
    return kD <= 32    ? TileConfig{32, 128, 128, 4, 2, 2}
           : kD <= 64  ? TileConfig{64, 128, 128, 4, 2, 2}
           : kD <= 96  ? TileConfig{96, 128, 64, 4, 2, 2}
           : kD <= 128 ? TileConfig{128, 128, 64, 4, 1, 2}
           : kD <= 160 ? TileConfig{160, 128, 64, 8, 2, 1}
           : kD <= 192 ? TileConfig{192, 128, 64, 8, 2, 1}
           : kD <= 224 ? TileConfig{224, 128, 64, 8, 1, 1}
                       : TileConfig{256, 64, 64, 4, 1, 2};
}

// Small configurations: one m16 tile per warp and a 64-row query tile. Used for decode-like
// problems (at most 64 packed query rows: idle warps skip their math), and for head dims above
// 128 on devices whose per-block shared memory (99 KB on sm_86/sm_89) cannot hold the main
// configuration. kD <= 64 and kD <= 128 share the 64 / 128 variants; head dim 256 has none (its
// main configuration is already 64 x 64).
constexpr TileConfig small_config(int kD) {
    return kD <= 64    ? TileConfig{64, 64, 128, 4, 2, 2}
           : kD <= 128 ? TileConfig{128, 64, 64, 4, 2, 2}
           : kD <= 160 ? TileConfig{160, 64, 64, 4, 1, 2}
           : kD <= 192 ? TileConfig{192, 64, 64, 4, 1, 2}
           : kD <= 224 ? TileConfig{224, 64, 64, 4, 1, 2}
                       : TileConfig{256, 64, 64, 4, 1, 2};
}

constexpr bool same_config(const TileConfig &a, const TileConfig &b) {
    return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
           a.warps == b.warps && a.stages == b.stages && a.min_blocks == b.min_blocks;
}

// Whether head dim kD has a separately compiled small variant.
constexpr bool has_small_variant(int kD) {
    return small_config(kD).head_dim == kD && !same_config(small_config(kD), prefill_config(kD));
}

// The decode tiles (64 query rows, one m16 tile per warp, two K/V buffers: the small
// configurations up to head dim 128), which take the serving decode's own choices in the kernel
// (fa2_mainloop.cuh, kDecodeTile) and here on the host.
constexpr bool is_decode_tile(const TileConfig &c) {
    return c.block_m == 64 && c.stages == 2 && c.block_m == 16 * c.warps;
}

constexpr int smem_bytes(const TileConfig &c) {
    return c.block_m * c.head_dim * 2 + 2 * c.stages * c.block_n * c.head_dim * 2;
}

}  // namespace fa2
}  // namespace flashattn
