// FA3 forward, shared plumbing: the compile-time tile shape (Traits), the shared-memory layout, the
// mbarriers of the Q buffer and the K/V rings, and the ring position/phase arithmetic. Every role
// (producer, mainloop, epilogue, kernel, launcher) reads these, so they live apart from all of them.
//
// For a backward or FP8 kernel reusing the producer or the mainloop: the layout assumes a 128-row
// Q tile (kBlockM) of 16-bit elements stored as 64-column, 128-byte-swizzled pages, and kStages
// K and V buffers in two separate rings. The "empty" barriers expect one arrival per consumer
// warp (kConsumerWarps = 8: two consumer warpgroups); a kernel with a different consumer count
// must change that count, not only the thread count.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/fa3/fa3_config.h"

namespace flashattn {
namespace fa3 {

template <int kD_, int kBN_, int kDV_ = kD_>
struct Traits {
    static constexpr int kD = kD_;    // padded head dim of Q and K, a multiple of 64
    static constexpr int kBN = kBN_;  // keys per tile
    static constexpr int kPageCols = 64;          // columns per 128-byte swizzle page (16-bit elements)
    static constexpr int kPages = kD / 64;       // 64-column swizzle pages per row
    static constexpr int kDV = kDV_;             // padded width of V and O, a multiple of 64
    static constexpr int kVPages = kDV / 64;     // ... pages per V row
    static constexpr int kQPage = kBlockM * 128;  // bytes of one page of the Q tile
    static constexpr int kKVPage = kBN * 128;     // ... of a K or V tile
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKVBytes = kPages * kKVPage;  // a K tile (and V's when kDV == kD)
    static constexpr int kVBytes = kVPages * kKVPage;  // a V tile
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kQBytes + kStages * kKVBytes;
    // O staging of the TMA-store epilogue (fa3_config.h o_staged): one region per consumer
    // warpgroup, kVPages SW128 pages of 64 rows each; absent where it does not fit.
    static constexpr bool kOStaged = o_staged(TileConfig{kD, kBN, kDV});
    static constexpr int kOPage = 64 * 128;                 // bytes of one 64-row page of O
    static constexpr int kOWgBytes = kVPages * kOPage;     // ... of one warpgroup's O
    static constexpr int kOOffset = kVOffset + kStages * kVBytes;
    static constexpr int kBarOffset = kOOffset + (kOStaged ? 2 * kOWgBytes : 0);
    static constexpr int kSmemBytes = kernel_smem_bytes(TileConfig{kD, kBN, kDV});
    // ALiBi's ramp kernel (RampTraits below; fa3_mainloop.cuh kAlibiGemm): a static B operand of
    // kBN key rows in the K tile's SW128 K-major layout (one 64-column page, 128 B a row), read as
    // one more k16 slice of S = Q K^T, after the barriers' padded 1 KB (the 1 KB alignment slack
    // stays last); the plain kernel launches with kSmemBytes, as before. Below head dim 256, whose
    // consumer registers are full (kAlibiOneSide), and not for the pair (128, 64), whose ramp
    // kernel spilled the persistent loop's m_blocks / n_work (ptxas, CUDA 13.0: 8-byte stack,
    // 7 LDL / 2 STL, one or two reloads per work tile; the slope's A word recomputed per key tile
    // instead of kept live changed nothing).
    static constexpr bool kAlibiRamp = kD < 256 && !(kD == 128 && kDV == 64);
    static constexpr bool kRamp = false;  // this kernel is the ramp kernel
    // The sink kernel (SinkTraits below; fa3_mainloop.cuh sink_tile_narrow): below head dim 256
    // (which runs no sink tokens) and not at the square 192, whose sink kernel spilled one per-tile
    // value (ptxas, CUDA 13.0: 4 bytes, the epilogue's query row, stored at the tile's start and
    // reloaded after the loop) in every form of the narrow tile tried.
    static constexpr bool kSinkNarrowOk = kD < 256 && !(kD == 192 && kDV == 192);
    static constexpr bool kSinkNarrow = false;  // this kernel is the sink kernel
    static constexpr int kAlibiOffset = kBarOffset + 1024;
    // The schedule's reciprocals (fa3_tile_scheduler.cuh ScheduleRecips), in the barriers' padded
    // 1 KB behind the mbarriers.
    static constexpr int kSchedOffset = kBarOffset + 512;
    // The schedule's divisions as multiplies by those reciprocals (fa3_fwd_kernel.cuh walk_tiles)
    // from head dim 128: on the H200 (stop 30) 1.01-1.04x at 512-2k there, while head dim 64 ran
    // 0.97-0.98x at 512 keys with them (non-causal and causal, two calls) and keeps the divisions.
    static constexpr bool kSchedRecips = kD >= 128;
    static constexpr int kAlibiBytes = kAlibiRamp ? kBN * 128 : 0;
    static constexpr int kRampSmemBytes = kSmemBytes + kAlibiBytes;
    static constexpr int kNT = kBN / 8;   // n8 tiles of S per thread's rows
    static constexpr int kPF = kBN / 16;  // k16 fragments of P
    // Consumer ping-pong (fa3_mainloop.cuh take_turn): the square kernels below head dim 256 and
    // (128, 64). ptxas -v (CUDA 13.0) with the turns: (64, 128) spills 8 B, (192, 128) 44 B, and
    // head dim 256's consumer registers are full; those keep the lockstep loop.
    static constexpr bool kPingPong = kDV == kD ? kD < 256 : (kD == 128 && kDV == 64);
    static_assert(kD % 64 == 0 && kDV % 64 == 0 && kBN % 16 == 0 && kBN <= 256, "unsupported tile");
    static_assert(kKVPage % 1024 == 0, "K/V pages must keep the 1 KB swizzle alignment");
    static_assert(kRampSmemBytes <= kMaxSmemBytes, "the ALiBi ramp does not fit beside the stages");
    static_assert(kAlibiOffset % 1024 == 0, "the ALiBi ramp must keep the 1 KB swizzle alignment");
    static_assert(!kOStaged || 2 * kOWgBytes == o_stage_bytes(TileConfig{kD, kBN, kDV}), "O staging size");
};

// The traits of ALiBi's ramp kernel, fwd_kernel<RampTraits<Tr>, E> (launch_fwd picks it for ALiBi
// without soft cap where Tr::kAlibiRamp and Params::alibi_gemm): Tr's tile, with the one-sided
// tiles' column bias added in the S GEMM (fa3_mainloop.cuh kAlibiGemm). A traits class rather
// than a kernel parameter, so the plain kernels keep their names and code (test_fa3_sass counts
// the forward kernels per Traits<D, N, DV>; it checks this one for spills under the fwd name).
template <class Tr>
struct RampTraits : Tr {
    static_assert(Tr::kAlibiRamp, "no ALiBi ramp at this tile");
    static constexpr bool kRamp = true;
};

// The traits of the sink kernel, fwd_kernel<SinkTraits<Tr>, E> (launch_fwd picks it for 1..16 sink
// tokens where Params::sink_narrow): Tr's tile, with the one sink tile below the window (key tile 0,
// walked last) run 16 keys wide after the pipelined loop (fa3_mainloop.cuh sink_tile_narrow). Its
// own kernel, as RampTraits, so that the plain kernels' code does not change.
constexpr int kSinkNarrowKeys = 16;  // sink keys the narrow tile covers: one m64n16 S, one k16 P V
template <class Tr>
struct SinkTraits : Tr {
    static_assert(Tr::kSinkNarrowOk, "no sink kernel at this tile");
    static constexpr bool kSinkNarrow = true;
};

// The V side of a traits class, for the roles shared with kernels whose traits have no V width of
// their own (V then as wide as K): the traits with kPages and kD of V, kVBytes per V tile.
template <class Tr, class = void>
struct VSide : Tr {
    static constexpr int kVBytes = Tr::kKVBytes;
};
template <class Tr>
struct VSide<Tr, std::void_t<decltype(Tr::kDV)>> : Tr {
    static constexpr int kPages = Tr::kVPages;
    static constexpr int kD = Tr::kDV;
};
template <class Tr>
constexpr int kWidthV = VSide<Tr>::kD;  // columns of V and O

// At Traits::kBarOffset in shared memory. "full": the producer's TMA bytes landed (count 1 plus
// the transaction bytes); "empty": every consumer warp has finished reading the buffer.
struct Barriers {
    uint64_t q_full, q_empty;
    uint64_t k_full[kStages], k_empty[kStages];
    uint64_t v_full[kStages], v_empty[kStages];
};

static_assert(sizeof(Barriers) <= 512, "the schedule's reciprocals follow the barriers at +512 (Traits::kSchedOffset)");

constexpr int kConsumerWarps = 8;  // each consumer warp arrives once on an "empty" barrier

// Ring position of the i-th key tile a CTA visits (tiles are consumed in order).
__device__ __forceinline__ int stage_of(int i) { return i % kStages; }
__device__ __forceinline__ uint32_t phase_of(int i) { return static_cast<uint32_t>((i / kStages) & 1); }

// Ring counters that persist across the tiles of a CTA: `kv` counts key tiles (K and V ring
// positions), `q` counts tiles whose Q was loaded (the Q buffer's phase). The producer and each
// consumer keep their own copy and advance it identically, so they agree without talking.
struct Pipe {
    int kv = 0;
    int q = 0;
};

}  // namespace fa3
}  // namespace flashattn
