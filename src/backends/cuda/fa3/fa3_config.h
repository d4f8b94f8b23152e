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

// setmaxnreg moves registers between a CTA's warpgroups but adds none: the producer's count and
// the two consumers' must fit what __launch_bounds__(kThreads, 1) gives the CTA at launch, 64K /
// kThreads per thread in steps of 8 (168 at 384 threads). A split that asks for more makes
// setmaxnreg.inc wait forever, and neither ptxas nor the SASS test sees it (stop 18: every FP8
// form at 32 / 240 hung). Check a kernel's split with this (the FP8 kernel's is the same 40 / 232).
constexpr bool setmaxnreg_split_fits(int producer_regs, int consumer_regs) {
    return producer_regs * 128 + consumer_regs * (kThreads - 128) <= 65536 / kThreads / 8 * 8 * kThreads;
}
constexpr int kProducerRegs = 40;   // the bf16/fp16 forward's split (fa3_fwd_kernel.cuh)
constexpr int kConsumerRegs = 232;
static_assert(setmaxnreg_split_fits(kProducerRegs, kConsumerRegs), "the forward's register split exceeds the launch's");
static_assert(!setmaxnreg_split_fits(32, 240), "the rule above no longer rejects stop 18's hanging split");

struct TileConfig {
    int head_dim;  // compiled (padded) head dim: 64, 128, 192 or 256
    int block_n;   // keys per K/V tile
    // V's compiled width (a P row of fa3_head_dims.h); a config written with two fields is square
    // (a default member initializer may read the member initialized before it).
    int head_dim_v = head_dim;
};

// block_n keeps the consumer's registers (O: d/2, S: n/2, P twice: n/4 each) under its 232 and
// two K and two V stages plus Q inside 227 KB.
constexpr TileConfig config_for(int head_dim) {
    return head_dim <= 64    ? TileConfig{64, 128}
           : head_dim <= 128 ? TileConfig{128, 128}
           : head_dim <= 192 ? TileConfig{192, 96}
                             : TileConfig{256, 80};
}

// Head dim 64's second, wider key tile (176 keys: 168 registers, no spill; 192 spilled): the
// per-tile costs (the row max / sum shuffles, O's rescale, the barriers) over 1.375x the keys.
// Measured (H200, bf16, against 128 keys in one process, docs/performance.md "stop 28, lead,
// call 3"): 1.02-1.07x non-causal from 2k keys, 1.01-1.08x causal from 4k, but 0.84-0.99x below
// (a partly filled last tile, and the causal diagonal's masked tiles twice as wide): the host
// takes it only for long rows (fa3_backend.cpp, wide_tile_wins). A plan without it runs config_for.
constexpr bool has_wide_tile(int head_dim) { return head_dim == 64; }
constexpr TileConfig wide_config_for(int head_dim) { return TileConfig{head_dim, 176}; }

constexpr int q_bytes(const TileConfig &c) { return kBlockM * c.head_dim * 2; }
constexpr int kv_bytes(const TileConfig &c) { return c.block_n * c.head_dim * 2; }
constexpr int v_bytes(const TileConfig &c) { return c.block_n * c.head_dim_v * 2; }
// Q, K and V stages, 1 KB of barriers (padded) and 1 KB to align the dynamic base to 1024 B.
constexpr int smem_bytes(const TileConfig &c) { return q_bytes(c) + kStages * (kv_bytes(c) + v_bytes(c)) + 2048; }

// The epilogue's O staging (fa3_epilogue.cuh, store_output_tma): the tile's O rows, 16-bit, each
// consumer warpgroup's 64 rows in 64-column SW128 pages that a TMA store writes out. Only where it
// fits beside the stages and measured faster (head dim 128 and the pair (64, 128)): a kernel without it
// stores O straight from its registers, as every kernel did before. kernel_smem_bytes is what a
// kernel launches with; config_for keeps choosing tiles on smem_bytes, the staging is never worth
// a narrower key tile.
constexpr int o_stage_bytes(const TileConfig &c) { return kBlockM * c.head_dim_v * 2; }
// Measured (docs/performance.md, "stop 24, lead, call 3"; bf16 against the register stores in one
// process): head dim 128 1.02-1.11x (most at 512-1k), head dim 64 0.97-1.01x (its causal cells
// slower): so only O rows of 128 columns take it (head dim 128 and the pair (64, 128)).
constexpr bool o_staged(const TileConfig &c) {
    return c.head_dim_v == 128 && smem_bytes(c) + o_stage_bytes(c) <= kMaxSmemBytes;
}
constexpr int kernel_smem_bytes(const TileConfig &c) { return smem_bytes(c) + (o_staged(c) ? o_stage_bytes(c) : 0); }

// A kernel with V of its own width (head_dim_v != head_dim, a P row of fa3_head_dims.h): the
// widest key tile of 128, 112, ... 64 keys whose registers match the square kernels' budget
// (O: dv/2, S: n/2, P twice: n/4 each, so dv/2 + n <= 192, as square 128 and 192 have) and whose
// stages fit in 227 KB. (192, 128): 128 keys (square 192 runs 96); (256, 128): 96 (smem).
constexpr TileConfig config_for(int head_dim, int head_dim_v) {
    if (head_dim_v == head_dim) return config_for(head_dim);
    int n = 128;
    while (n > 64 && (head_dim_v / 2 + n > 192 || smem_bytes(TileConfig{head_dim, n, head_dim_v}) > kMaxSmemBytes))
        n -= 16;
    return TileConfig{head_dim, n, head_dim_v};
}

static_assert(o_staged(config_for(128)), "the O staging no longer fits head dim 128");
static_assert(smem_bytes(wide_config_for(64)) <= kMaxSmemBytes, "head dim 64's wide tile does not fit");
static_assert(smem_bytes(config_for(256)) <= kMaxSmemBytes, "head dim 256 tile does not fit");
static_assert(smem_bytes(config_for(192)) <= kMaxSmemBytes, "head dim 192 tile does not fit");
static_assert(smem_bytes(config_for(128)) <= kMaxSmemBytes, "head dim 128 tile does not fit");

}  // namespace fa3
}  // namespace flashattn
