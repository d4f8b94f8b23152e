// FA3 FP8 (E4M3) forward kernel for Hopper (sm_90a), issue 17: fa3 (and auto on sm_90) runs FP8
// plans with it (fa3_backend.cpp). Verified on the H200 (test_fp8_fa3, sanitizers); see
// docs/kernel-notes.md, "FP8 (E4M3) forward", and docs/performance.md for its speed.
//
// The same composition as fa3_fwd_kernel.cuh over the same shared pieces: the persistent tile
// scheduler (fa3_tile_scheduler.cuh; the producer warpgroup walks it through produce_fp8, the TMA
// producer of fa3_producer.cuh rewritten for 24 registers, with 128-column E4M3 pages) and the
// epilogue (fa3_epilogue.cuh, O as bf16/fp16 pairs and the LSE). What differs:
//   * E4M3 wgmma has no transpose flag, so V must be K-major (keys contiguous) for O += P V.
//     TMA loads each V tile as it is stored ([keys][head dim]) into a staging ring; warps 1..3
//     of the producer warpgroup transpose it into a second ring ([head dim][keys], 128-byte
//     swizzle), with the keys of each 32-key step in the order fp8_p_column gives, so that P's
//     A fragment can be packed from each thread's own S registers (pack_p_fragment: no
//     shuffles). Barriers: v_full/v_empty guard the staging ring (TMA -> transposers),
//     vt_full/vt_empty the transposed ring (transposers -> consumers).
//   * The consumer mainloop issues wgmma m64n128k32 E4M3 (SS) for S and m64nDk32 E4M3 (RS) for
//     O += P V; P = exp2(s * sl2 - m * sl2 + 8) = 256 exp(...), packed to E4M3 (the x256 keeps
//     small probabilities out of E4M3's subnormal range; the row sums carry the same factor).
//   * Descales: dq * dk of the (sequence, kv head) folds into the score scale (or the soft cap's
//     pre-tanh scale), so the LSE includes them as the CPU reference defines it; dv / 256 scales
//     O and 1/256 the row sums before the shared epilogue.
// Register split: producer warpgroup kFp8ProducerRegs (24: the TMA thread and the transposers
// keep only ring counters live across a work tile), consumers the rest of the launch's 168 x 384
// (240), which the in-warpgroup overlaps need (kFp8PrefetchS at head dim 128 on 128-key tiles,
// kFp8OverlapWide at 256 and on the wider tiles of head dim 64; -Xptxas -v: 0 spill, no C75xx,
// every knob setting, 2026-12-02; key tiles kFp8TileN: 224 / 256 at head dim 64 and 224 at 128
// compile clean, 160 and 192 spill 4 bytes, 256 at head dim 128 spills 192 and serializes).
// The two consumer warpgroups ping-pong their GEMM issues (take_turn / pass_turn).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/device/ptx_sm90_fp8.cuh"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_epilogue.cuh"
#include "backends/cuda/fa3/fa3_fp8_params.h"
#include "backends/cuda/fa3/fa3_launch.cuh"
#include "backends/cuda/fa3/fa3_mainloop.cuh"
#include "backends/cuda/fa3/fa3_producer.cuh"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

// The speed knobs' settings (below); a -D on the compiler line overrides them for an A/B build
// (tests/gpu/fp8-ab.sh).
#ifndef FLASHATTN_FP8_OVERLAP_WIDE
#define FLASHATTN_FP8_OVERLAP_WIDE true
#endif
#ifndef FLASHATTN_FP8_PRODUCER_REGS
#define FLASHATTN_FP8_PRODUCER_REGS 24
#endif
#ifndef FLASHATTN_FP8_PREFETCH_S
#define FLASHATTN_FP8_PREFETCH_S true
#endif
#ifndef FLASHATTN_FP8_LAZY_RESCALE
#define FLASHATTN_FP8_LAZY_RESCALE true
#endif
#ifndef FLASHATTN_FP8_MAX_SLACK
#define FLASHATTN_FP8_MAX_SLACK 0.75f
#endif
#ifndef FLASHATTN_FP8_ORDER_SOFTMAX
#define FLASHATTN_FP8_ORDER_SOFTMAX false
#endif
#ifndef FLASHATTN_FP8_BLOCK_N_64
#define FLASHATTN_FP8_BLOCK_N_64 256
#endif
#ifndef FLASHATTN_FP8_BLOCK_N_128
#define FLASHATTN_FP8_BLOCK_N_128 128
#endif

namespace flashattn {
namespace fa3 {

constexpr int kTransposeWarps = 3;      // warps 1..3 of the producer warpgroup
constexpr float kPScaleLog2 = 8.f;      // P is stored times 2^8 = 256 before the E4M3 cast
constexpr float kInvPScale = 1.f / 256.f;
// kFp8MaxSlack: how far (log2 units) a key tile's row max may exceed the row's running max before
// the running max moves (softmax_exp_fp8). Below it the row keeps the old max, so alpha is exactly
// 1 and O *= alpha is skipped (kFp8LazyRescale) in most tiles of a long row, where only a new
// max above the running one by any amount skipped nothing. Any max is exact for the softmax (P,
// the row sums and the LSE all use the same one); the bound is E4M3's range: P is at most
// 2^(kPScaleLog2 + slack) = 256 x 2^0.75 = 431 < 448, so the satfinite cast never clips.
constexpr float kFp8MaxSlack = FLASHATTN_FP8_MAX_SLACK;
static_assert(kFp8MaxSlack >= 0.f && kPScaleLog2 + kFp8MaxSlack <= 8.78f, "P must stay below E4M3's 448 = 2^8.807");

// Speed knobs (docs/kernel-notes.md, "FP8 (E4M3) forward": each was measured against the form
// without it on the H200; see there which are kept and why).
// kFp8OverlapWide: head dim 256 overlaps the softmax of S_i with P_{i-1} V inside a warpgroup
// (one P register set: the softmax leaves fp32 P in S, packed to E4M3 only after P_{i-1} V
// retired), where the serial form runs S, softmax and P V in turn.
constexpr bool kFp8OverlapWide = FLASHATTN_FP8_OVERLAP_WIDE;
// kFp8ProducerRegs: the producer warpgroup's registers after setmaxnreg (TMA thread and the V
// transposers); the consumers get the rest of the CTA's launch allocation (168 x 384 = 64512, not
// the 64K register file: setmaxnreg.inc waits forever for more, fa3_config.h), in steps of 8:
// 40 -> 232, 24 -> 240. The producer side is written for 24 (produce_fp8, transpose_tiles_fp8:
// nothing but ring counters live across a work tile).
constexpr int kFp8ProducerRegs = FLASHATTN_FP8_PRODUCER_REGS;
constexpr int kFp8ConsumerRegs =
    (65536 / kThreads / 8 * 8 * kThreads - 128 * kFp8ProducerRegs) / (kThreads - 128) / 8 * 8;
static_assert(setmaxnreg_split_fits(kFp8ProducerRegs, kFp8ConsumerRegs), "FP8 register split exceeds the launch's");
static_assert(kFp8ConsumerRegs >= 232 && kFp8ConsumerRegs <= 256, "register split of the FP8 kernel");
// kFp8LazyRescale: O *= alpha only when some row of the warp moved its max (alpha == 1 exactly
// otherwise: exp2 of 0), a warp-uniform branch (rescale_o_fp8); with kFp8MaxSlack most tiles of a
// long row keep their max.
constexpr bool kFp8LazyRescale = FLASHATTN_FP8_LAZY_RESCALE;
// Whether O (kN registers per thread) gets the lazy rescale: head dims 64 and 128, and 256 (128
// registers) with the max slack (-Xptxas -v, 2026-12-03: 0 spill, no C75xx; without the slack
// the vote spills 4 bytes there, and it skipped too few tiles to pay).
constexpr bool fp8_lazy_rescale(int kN) { return kFp8LazyRescale && (kN <= 64 || kFp8MaxSlack > 0.f); }
// kFp8OrderSoftmax: the overlapped forms' softmax scheduled ahead of the wait for the P V it runs
// under (order_before_wgmma_wait, consumer_mainloop_fp8), where ptxas had put that wait first.
// Off: measured on the H200 (docs/performance.md, "stop 24, lead, call 4", one round, with the max
// slack) at 0.84-0.91x at head dim 64 and 0.98-1.06x at 128. On, it also gives head dims 64 and 128
// the max slack (fp8_slack_form), the form that call measured: the A/B of both is this one knob.
constexpr bool kFp8OrderSoftmax = FLASHATTN_FP8_ORDER_SOFTMAX;
// The max slack and the exactly-1 alpha (softmax_exp_fp8<true>): head dim 256, where they turn the
// lazy rescale on and measured 1.02-1.19x (same call); 64 and 128 keep their form unless
// kFp8OrderSoftmax (above): there the slack was measured only together with the ordering.
constexpr bool fp8_slack_form(int kD) { return kFp8MaxSlack > 0.f && (kD == 256 || kFp8OrderSoftmax); }
// kFp8PrefetchS: head dim 128 issues S_{i+1} = Q K_{i+1}^T together with P_{i-1} V before the
// softmax of S_i (two S register sets, one P set), so the tensor cores have a whole tile's GEMMs
// under each softmax instead of P V alone (without a soft cap; capped plans keep overlapped_tiles).
constexpr bool kFp8PrefetchS = FLASHATTN_FP8_PREFETCH_S;
// kFp8TileN<kD>: keys per tile of head dim kD's kernel. FlashAttention-3 runs FP8 head dim 64 on
// 160 keys and 128 on 224 (hopper/tile_size.h), to spread each tile's fixed costs (barrier waits,
// the turns, the row max's shuffles, the rescale) over more keys; here a tile wider than 128 keys
// runs the one-P overlapped form (two S or two P sets of a wide tile do not fit in 240).
// Measured on the H200 (2026-12-02, stop 20; docs/kernel-notes.md): head dim 64 on 224 keys
// +4.7 % over 128 (mean of 8 cells), on 256 +9.5 %; head dim 128 on 224 +1.4 %, within drift, so
// 128 stays there. The fa3_fp8_hdimD.cu units report it to the host (fp8_block_n_hdimD: the K / V
// boxes' rows).
template <int kD>
constexpr int kFp8TileN = kD == 64 ? FLASHATTN_FP8_BLOCK_N_64 : kD == 128 ? FLASHATTN_FP8_BLOCK_N_128 : kFp8BlockN;

// Ping-pong of the two consumer warpgroups (as FlashAttention-3): each wgmma issue point (S, P V,
// or both) is a turn; warpgroup w takes its turn on named barrier 1 + w and passes it to the other
// by arriving on 2 - w (256 threads: its 128 waiting, the other's 128 arriving). The GEMMs of the
// two warpgroups then alternate on the tensor cores and each softmax runs under the other's GEMMs,
// where without it both wait on the same K tile and run S, softmax and P V in lockstep (the tensor
// cores idle during both softmaxes). Warpgroup 1 passes once at the start so that 0 goes first;
// 0 takes one extra turn at the end to consume 1's last pass (no barrier left half-arrived).
// Both warpgroups walk the same work tiles and key tiles, so the turns pair up. (Barrier 0 is
// __syncthreads; the FP8 kernel names no other barrier.) take_turn / pass_turn are in
// fa3_mainloop.cuh, shared with the 16-bit mainloop.

// The shared-memory layout of the FP8 kernel, with the names produce() and store_output() read.
// Q and K pages are 128 E4M3 columns (128 bytes) of 128 (Q) or kBN (K) rows; V has a staging ring
// (TMA target, the K layout) and a transposed ring: kD rows of 128 keys (one 128-byte swizzled
// row each) per Vt page, kBN / 128 pages rounded up (a last page of 64 or 96 keys uses the first
// bytes of its rows: the GEMM's k32 steps read 32 bytes at a time from the row start).
// Head dim 64 keeps the 128-byte pages (the TMA box's columns 64..127 are past the tensor's head
// dim: zeros, no memory traffic) and reads only its first 64 columns: S in kD / 32 = 2 k32 steps,
// O += P V 64 wide from 64 transposed rows, so the descriptors and the transposer's swizzle are
// the head-dim-128 ones (a 64-byte swizzle would only save shared memory, which one CTA per SM
// does not need).
template <int kD_, int kBN_ = kFp8TileN<kD_>>
struct Fp8Traits {
    static constexpr int kD = kD_;
    static constexpr int kBN = kBN_;
    static constexpr int kPageCols = 128;
    static constexpr int kPages = (kD + 127) / 128;
    static constexpr int kQPage = kBlockM * 128;
    static constexpr int kKVPage = kBN * 128;
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKVBytes = kPages * kKVPage;  // a K tile or a staged V tile
    static constexpr int kVtPage = kD * 128;           // 128 keys of a transposed V tile
    static constexpr int kVtPages = (kBN + 127) / 128;
    static constexpr int kVtBytes = kVtPages * kVtPage;  // a transposed V tile
    static constexpr int kKOffset = kQBytes;
    static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
    static constexpr int kVtOffset = kVOffset + kStages * kKVBytes;
    static constexpr int kBarOffset = kVtOffset + kStages * kVtBytes;
    static constexpr int kSmemBytes = kBarOffset + 2048;  // 1 KB barriers (padded), 1 KB alignment slack
    static constexpr int kNT = kBN / 8;      // n8 tiles of S
    static constexpr int kKSteps = kBN / 32;  // k32 steps of P V (A fragments of P)
    static_assert(kD == 64 || (kD % 128 == 0 && kD <= 256), "FP8 tiles are 64, 128 or 256 columns");
    static_assert(kBN % 32 == 0 && kBN >= 128 && kBN <= 256, "keys per tile: k32 steps, at most a TMA box's 256 rows");
    static_assert(kSmemBytes <= kMaxSmemBytes, "FP8 tile does not fit in shared memory");
};

struct Fp8Barriers {
    Barriers ring;  // q, k, v (v: the staging ring; v_empty counts transposer warps)
    uint64_t vt_full[kStages], vt_empty[kStages];
    // Written by the TMA thread before it arrives on v_full[st]: 0 with a V tile, 1 when the CTA
    // has no more (the transposers then stop: they walk no work tiles of their own). Read by lane 0
    // of each transposer warp after v_full[st] completed, before its arrive on v_empty[st].
    uint32_t v_end[kStages];
};

// Transposes one staged V tile ([kBN keys][kD] E4M3, kD/128 pages) into the K-major operand
// ([kD][kBN keys]) with the keys of each 32-key step permuted: slot 32s + 16h + 4q + u holds key
// 32s + fp8_p_column(16h + 4q + u) = 32s + 16h + 2q + {0, 1, 8, 9}[u]. `warp`: 0..2, `lane`.
// One unit (a warp's step): 16 keys (K0 = 16 kg) x 32 columns (C0 = 32 cg), 512 bytes, by one
// LDSM.x4.T, four PRMT and one STSM.x4:
//  * ldmatrix .trans on b16 (byte pairs): matrix i = keys K0 + 8 (i & 1) + 0..7 by the 16 bytes at
//    column C0 + 16 (i >> 1). Lane (g, q) receives [key K0+2q: c, c+1 | key K0+2q+1: c, c+1] with
//    c = C0 + 2g (+16 for i >= 2) from matrix 0 (2), the same keys + 8 from matrix 1 (3).
//  * one byte permute per column: column c = [K0+2q, K0+2q+1, K0+2q+8, K0+2q+9] at c, which are
//    exactly slots 16h + 4q + 0..3 (K0 = 32s + 16h): the permuted order costs nothing.
//  * stmatrix (b16, not transposed): lane (g, q) gives 4 bytes at byte 4q of row g of each 8x8
//    matrix; the matrix rows are the output rows (head-dim columns) c or c + 1 of lane g, 16 bytes
//    at key byte K0. Rows 2g then 2g + 1 for g < 4 and the other way round for g >= 4, so that the
//    eight rows of each matrix fall in eight distinct swizzle chunks (no bank conflicts).
// The loads read 8 consecutive keys at one chunk (conflict-free under the swizzle as well). Every
// lane's swizzle terms depend on the lane only (K0 and C0 are multiples of 16 and 32), so the
// addresses are a per-lane base plus a per-unit offset.
//
// At 24 registers (kFp8ProducerRegs) the lane's terms are computed once per key tile from a fresh
// %tid.x (nothing lane-derived stays live across a work tile) and each unit's address is one of
// two lane bases XOR a compile-time chunk term plus a compile-time offset: the source chunk
// ((2 (cg % 4) + (mi >> 1)) ^ j) << 4 is ((j ^ (mi >> 1)) << 4) ^ ((cg % 4) << 5), the destination
// chunk ((kg ^ dst_sw) << 4) is (dst_sw << 4) ^ (kg << 4), and the stage bases are 1024-aligned,
// so the XOR touches the lane's bits 4..6 only. The warp's units are compile-time (kWarp): the loop
// unrolls into LDSM [base + imm] / STSM [base + imm] with no per-unit index arithmetic.
template <class Tr>
struct TransposeLane {
    uint32_t src, dst, sel_a, sel_b;
};

__device__ __forceinline__ uint32_t fresh_tid_x() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));  // volatile: re-read, not kept live
    return v;
}

template <class Tr>
__device__ __forceinline__ TransposeLane<Tr> transpose_lane(uint32_t src, uint32_t dst) {
    const int lane = static_cast<int>(fresh_tid_x() & 31u);
    const int j = lane & 7, mi = lane >> 3;
    // Source: key K0 + 8 (mi & 1) + j, 16-byte chunk 2 (cg % 4) + (mi >> 1) of page cg / 4.
    const int src_row = 8 * (mi & 1) + j;
    // Destination: row C0 + 16 (mi >> 1) + 2 j + flip, chunk kg (byte K0 = 16 kg).
    const int flip = (mi & 1) ^ (j >= 4 ? 1 : 0);
    const int dst_row = 16 * (mi >> 1) + 2 * j + flip;  // + C0 (a multiple of 32: row % 8 unchanged)
    // Lane (g, q)'s byte selectors: its first store matrix holds column c (0x6420: bytes 0, 2 of
    // each register) for g < 4, c + 1 (0x7531) for g >= 4; the second the other.
    const bool hi_g = (lane >> 2) >= 4;
    TransposeLane<Tr> l;
    l.src = src + static_cast<uint32_t>(src_row * 128 + ((j ^ (mi >> 1)) << 4));
    l.dst = dst + static_cast<uint32_t>(dst_row * 128 + ((dst_row & 7) << 4));
    l.sel_a = hi_g ? 0x7531u : 0x6420u;
    l.sel_b = hi_g ? 0x6420u : 0x7531u;
    return l;
}

template <class Tr, int kWarp>
__device__ __forceinline__ void transpose_v_tile(const TransposeLane<Tr> &l) {
    constexpr int kKeyGroups = Tr::kBN / 16;
    constexpr int kUnits = kKeyGroups * (Tr::kD / 32);
#pragma unroll
    for (int u = kWarp; u < kUnits; u += kTransposeWarps) {
        const int kg = u % kKeyGroups, cg = u / kKeyGroups;  // (compile-time: the loop unrolls)
        const uint32_t s_addr = (l.src ^ static_cast<uint32_t>((cg & 3) << 5)) +
                                static_cast<uint32_t>((cg >> 2) * Tr::kKVPage + kg * 16 * 128);
        uint32_t r[4];
        cuda::ldmatrix_x4_trans(r, s_addr);
        uint32_t w[4];
        w[0] = __byte_perm(r[0], r[1], l.sel_a);
        w[1] = __byte_perm(r[0], r[1], l.sel_b);
        w[2] = __byte_perm(r[2], r[3], l.sel_a);
        w[3] = __byte_perm(r[2], r[3], l.sel_b);
        // 16-key group kg: chunk kg % 8 of a row of Vt page kg / 8.
        const uint32_t d_addr = (l.dst ^ static_cast<uint32_t>((kg & 7) << 4)) +
                                static_cast<uint32_t>(cg * 32 * 128 + (kg >> 3) * Tr::kVtPage);
        cuda::stmatrix_x4(w, d_addr);
    }
}

// Shared-window offsets (32-bit) of the FP8 kernel's barriers, for the producer warpgroup's
// 32-bit forms (ptx_sm90_fp8.cuh); `sb` is the aligned base (smem_addr of the kernel's smem).
template <class Tr>
struct Fp8BarAddr {
    uint32_t sb;
    __device__ uint32_t at(size_t member_offset, int st = 0) const {
        return sb + static_cast<uint32_t>(Tr::kBarOffset + member_offset + 8 * st);
    }
    __device__ uint32_t q_full() const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, q_full)); }
    __device__ uint32_t q_empty() const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, q_empty)); }
    __device__ uint32_t k_full(int st) const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, k_full), st); }
    __device__ uint32_t k_empty(int st) const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, k_empty), st); }
    __device__ uint32_t v_full(int st) const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, v_full), st); }
    __device__ uint32_t v_empty(int st) const { return at(offsetof(Fp8Barriers, ring) + offsetof(Barriers, v_empty), st); }
    __device__ uint32_t vt_full(int st) const { return at(offsetof(Fp8Barriers, vt_full), st); }
    __device__ uint32_t vt_empty(int st) const { return at(offsetof(Fp8Barriers, vt_empty), st); }
    __device__ uint32_t v_end(int st) const {
        return sb + static_cast<uint32_t>(Tr::kBarOffset + offsetof(Fp8Barriers, v_end) + 4 * st);
    }
};

// Transposer warps (1..3 of the producer warpgroup, kWarp = 0..2): every V tile the TMA thread
// stages, in order, from the staging ring into the transposed ring, until the TMA thread marks a
// stage as the end (v_end). They walk no work tiles: at 24 registers the tile scheduler's
// arithmetic (and ptxas hoisting its loop invariants) spilled. Live across a tile: the ring
// position and the shared base only.
template <class Tr, int kWarp>
__device__ __forceinline__ void transpose_tiles_fp8(uint32_t sb) {
    const Fp8BarAddr<Tr> b{sb};
#pragma unroll 1
    for (int kv = 0;; ++kv) {
        const int st = kv & 1;
        const uint32_t ph = static_cast<uint32_t>(kv >> 1) & 1u;
        cuda::mbar_wait_s(b.v_full(st), ph);
        const bool lane0 = (fresh_tid_x() & 31u) == 0;
        uint32_t end = 0;
        if (lane0) end = cuda::ld_volatile_shared_u32(b.v_end(st));
        if (__shfl_sync(0xffffffffu, end, 0) != 0) break;
        cuda::mbar_wait_s(b.vt_empty(st), ph ^ 1u);
        transpose_v_tile<Tr, kWarp>(transpose_lane<Tr>(sb + static_cast<uint32_t>(Tr::kVOffset + st * Tr::kKVBytes),
                                                       sb + static_cast<uint32_t>(Tr::kVtOffset + st * Tr::kVtBytes)));
        cuda::fence_proxy_async_shared();  // this thread's stores, visible to the consumers' wgmma
        __syncwarp();
        if ((fresh_tid_x() & 31u) == 0) {
            cuda::mbar_arrive_s(b.v_empty(st));
            cuda::mbar_arrive_s(b.vt_full(st));
        }
    }
}

// The persistent walk of the TMA thread: the work tiles of nth_tile (fa3_tile_scheduler.cuh; the
// consumers walk nth_tile itself, so a change of its order must be made here too, or the rings
// pair the producer's tiles with other tiles' consumers: test_fp8_fa3_kernel_few_ctas fails or hangs),
// t_r = r g + x (r even) or r g + g - 1 - x (r odd), stepped instead of recomputed: t_{r+1} - t_r
// alternates between 2 (g - x) - 1 and 2 x + 1 (their sum is 2 g), so the tile index and its
// next step are all that stays live (32-bit: t < n_work + 2 g never overflows an int).
struct Fp8TileWalk {
    int t, step;
    __device__ Fp8TileWalk() {
        const int x = static_cast<int>(blockIdx.x), g = static_cast<int>(gridDim.x);
        t = x;
        step = 2 * (g - x) - 1;
    }
    __device__ void next() {
        t += step;
        step = 2 * static_cast<int>(gridDim.x) - step;
    }
};

// tma_tile (fa3_producer.cuh) on 32-bit shared addresses.
template <class Tr>
__device__ __forceinline__ void tma_tile_s(uint32_t dst, int page_bytes, const CUtensorMap *tm, uint32_t bar,
                                           int32_t row, int32_t head, int32_t batch) {
#pragma unroll
    for (int pg = 0; pg < Tr::kPages; ++pg)
        cuda::tma_load_4d_s(dst + static_cast<uint32_t>(pg * page_bytes), tm, bar, Tr::kPageCols * pg, row, head, batch);
}

// The TMA thread's walk: produce (fa3_producer.cuh) for the FP8 rings, lean enough for 24
// registers: per key tile the row coordinate steps down by kBN in 32-bit (kv_row_coord's value
// for tile kt.last - j), the ring position from one counter; the first key tile is peeled (its K
// goes out before the wait for the Q buffer, as in produce; Q's coordinates are dead after it). At the end it marks the next staging stage as the end for
// the transposers (v_end, a plain arrive on v_full). Key tiles: the window's, as the consumers walk
// them (FP8 plans with sink tokens are refused).
template <class Tr>
__device__ __forceinline__ void produce_fp8(const Params &p, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                            const CUtensorMap *tm_v, uint32_t sb) {
    static_assert(kStages == 2, "ring position arithmetic below");
    const Fp8BarAddr<Tr> b{sb};
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int n_work = m_blocks * p.heads_q * p.batch;
    int kv = 0, nq = 0;
    // K (then V) of ring position kv, key rows from krow.
    auto load_k = [&](int32_t krow, int32_t kvh, int32_t bq) {
        const int st = kv & 1;
        cuda::mbar_wait_s(b.k_empty(st), (static_cast<uint32_t>(kv >> 1) & 1u) ^ 1u);
        cuda::mbar_arrive_expect_tx_s(b.k_full(st), Tr::kKVBytes);
        tma_tile_s<Tr>(sb + static_cast<uint32_t>(Tr::kKOffset + st * Tr::kKVBytes), Tr::kKVPage, tm_k, b.k_full(st), krow,
                       kvh, bq);
    };
    auto load_v = [&](int32_t krow, int32_t kvh, int32_t bq) {
        const int st = kv & 1;
        cuda::mbar_wait_s(b.v_empty(st), (static_cast<uint32_t>(kv >> 1) & 1u) ^ 1u);
        cuda::st_shared_u32(b.v_end(st), 0u);
        cuda::mbar_arrive_expect_tx_s(b.v_full(st), Tr::kKVBytes);
        tma_tile_s<Tr>(sb + static_cast<uint32_t>(Tr::kVOffset + st * Tr::kKVBytes), Tr::kKVPage, tm_v, b.v_full(st), krow,
                       kvh, bq);
    };
    for (Fp8TileWalk walk; walk.t < n_work; walk.next()) {
        // tile_coords on values ptxas cannot hoist out of this loop: z is 0 (t >= 0) but opaque,
        // so m_blocks + z and seqlen_k + z are recomputed per work tile; hoisted, m_blocks, its
        // product with the section width and seqlen_k - 1 (64-bit) stayed live and spilled at 24.
        int z;
        asm volatile("shr.s32 %0, %1, 31;" : "=r"(z) : "r"(walk.t));
        Params q = p;
        q.seqlen_k = p.seqlen_k + z;
        const TileCoords c = tile_coords(q, walk.t, m_blocks + z, Tr::kBN);
        if (!c.has_keys()) continue;
        const int32_t bq = batch_coord(p, c);
        const int32_t kvh = c.head / p.group;
        const int end = kv + c.kt.last - c.kt.first + 1;
        int32_t krow = kv_row_coord(p, c, c.kt.last, Tr::kBN);
        load_k(krow, kvh, bq);  // the first K tile before the wait for the Q buffer
        cuda::mbar_wait_s(b.q_empty(), static_cast<uint32_t>(nq & 1) ^ 1u);
        cuda::mbar_arrive_expect_tx_s(b.q_full(), Tr::kQBytes);
        tma_tile_s<Tr>(sb, Tr::kQPage, tm_q, b.q_full(), q_row_coord(p, c), c.head, bq);
        load_v(krow, kvh, bq);
#pragma unroll 1
        for (++kv, krow -= Tr::kBN; kv < end; ++kv, krow -= Tr::kBN) {
            load_k(krow, kvh, bq);
            load_v(krow, kvh, bq);
        }
        ++nq;
    }
    const int st = kv & 1;
    cuda::mbar_wait_s(b.v_empty(st), (static_cast<uint32_t>(kv >> 1) & 1u) ^ 1u);
    cuda::st_shared_u32(b.v_end(st), 1u);
    cuda::mbar_arrive_s(b.v_full(st));
}

// S = Q K^T for K ring stage `st` (issued, not waited for): kD / 32 E4M3 wgmmas.
template <class Tr>
__device__ __forceinline__ void issue_qk_fp8(float (&S)[Tr::kNT][4], uint64_t dq, uint64_t dk, int st) {
    float(&acc)[Tr::kBN / 2] = reinterpret_cast<float(&)[Tr::kBN / 2]>(S);
    const uint64_t dks = dk + static_cast<uint64_t>((st * Tr::kKVBytes) >> 4);
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kD / 32; ++ks)  // a k32 step is 32 bytes: k_step's 16-bit arithmetic holds
        cuda::wgmma_ss_e4m3<Tr::kBN>(acc, dq + k_step(ks, Tr::kQPage), dks + k_step(ks, Tr::kKVPage), ks > 0);
    cuda::wgmma_commit();
}

// O += P V for transposed ring stage `st` (issued, not waited for): 32 keys (32 bytes of each
// 128-byte row of V^T) per wgmma.
template <class Tr>
__device__ __forceinline__ void issue_pv_fp8(float (&O)[Tr::kD / 2], const uint32_t (&P)[Tr::kKSteps][4], uint64_t dvt,
                                             int st) {
    const uint64_t dvs = dvt + static_cast<uint64_t>((st * Tr::kVtBytes) >> 4);
    cuda::fence_operands(O);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk)  // 32 keys: bytes 32 (kk % 4) of the rows of Vt page kk / 4
        cuda::wgmma_rs_e4m3<Tr::kD>(O, P[kk], dvs + static_cast<uint64_t>(2 * (kk & 3) + ((kk >> 2) * Tr::kVtPage >> 4)), 1);
    cuda::wgmma_commit();
}

// The online-softmax step of softmax_step (online_softmax.cuh) with P = 256 exp(...) (the x256
// folded into the exp2 offset; row_sum sums the scaled values): S is overwritten with the scaled
// fp32 P. pack_p_fp8 then packs it to E4M3 A fragments in the permuted key order of
// pack_p_fragment.
template <bool kSlack, int kNT>
__device__ __forceinline__ void softmax_exp_fp8(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                float sl2, float (&alpha)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = row_max[h];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(S[nt][2 * h], S[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // kSlack (fp8_slack_form; the caller's O gets the lazy rescale): the scaled maxima as two separately
        // rounded products (__fmul_rn: not contracted into an FFMA with the subtraction below),
        // so that alpha is exp2(0) = 1 exactly when the max stays; contracted, alpha was exp2 of
        // the product's rounding residual, which need not be 1, and O was rescaled although no
        // max had moved. (Only there: at head dim 256 without the lazy rescale the extra live
        // product spilled 20 bytes.)
        const float ms_old = kSlack ? __fmul_rn(row_max[h], sl2) : 0.f;
        // With kSlack the max moves only when the tile's exceeds it by more than kFp8MaxSlack (log2
        // units): otherwise alpha is exactly 1 and the lazy rescale skips O *= alpha. (A row with
        // no max yet takes the tile's; the four threads of a row decide alike on the same values.)
        if (kSlack && kFp8MaxSlack > 0.f && row_max[h] != -INFINITY && fmaf(mx, sl2, -ms_old) <= kFp8MaxSlack)
            mx = row_max[h];
        const float ms = mx == -INFINITY ? 0.f : kSlack ? __fmul_rn(mx, sl2) : mx * sl2;
        // (-inf * sl2 is NaN when a descale is 0, so a row with no key yet gets alpha = 0 by test.)
        alpha[h] = row_max[h] == -INFINITY ? 0.f : cuda::fast_exp2(kSlack ? ms_old - ms : row_max[h] * sl2 - ms);
        row_max[h] = mx;
        const float offset = kPScaleLog2 - ms;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float pv = cuda::fast_exp2(fmaf(S[nt][2 * h + e], sl2, offset));
                rs += pv;
                S[nt][2 * h + e] = pv;
            }
        row_sum[h] = fmaf(row_sum[h], alpha[h], rs);
    }
}

template <int kNT>
__device__ __forceinline__ void pack_p_fp8(float (&S)[kNT][4], uint32_t (&P)[kNT / 4][4]) {
    const float(&flat)[kNT * 4] = reinterpret_cast<const float(&)[kNT * 4]>(S);
#pragma unroll
    for (int t = 0; t < kNT / 4; ++t) cuda::pack_p_fragment(flat, t, 1.f, P[t]);
}

template <bool kSlack, int kNT>
__device__ __forceinline__ void softmax_step_fp8(float (&S)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                 float sl2, uint32_t (&P)[kNT / 4][4], float (&alpha)[2]) {
    softmax_exp_fp8<kSlack>(S, row_max, row_sum, sl2, alpha);
    pack_p_fp8(S, P);
}

// O *= alpha (per row half h: registers j with (j % 4) / 2 == h). With kFp8LazyRescale only when
// some row of the warp has alpha != 1 (a row whose max did not move has alpha exactly 1).
template <int kN>
__device__ __forceinline__ void rescale_o_fp8(float (&O)[kN], const float (&alpha)[2]) {
    if constexpr (fp8_lazy_rescale(kN)) {
        if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) O[j] *= alpha[(j % 4) / 2];
}

// Soft cap (with the tile's descaled pre-tanh scale) and the edge-tile mask. kMayCap false: the
// caller runs only without a soft cap (cap_scale is 0), and the tanh is compiled out.
template <class Tr, bool kMayCap = true>
__device__ __forceinline__ void score_mods_fp8(const Params &p, const TileCoords &c, float (&S)[Tr::kNT][4], int nb,
                                               int rdiag0, int t, float cap_scale) {
    if (kMayCap && cap_scale != 0.f) cuda::softcap_scores(S, cap_scale);
    const int rdiag[2] = {rdiag0, rdiag0 + 8};  // row halves g and g + 8 (one register kept live, not two)
    if (c.kt.masked(nb)) cuda::mask_scores(S, rdiag, nb * Tr::kBN + 2 * t, c.seq.sk, p.right_i, p.left_i);
}

// One consumer warpgroup's walk over the key tiles of a work tile: consumer_mainloop of
// fa3_mainloop.cuh on E4M3 operands, V from the transposed ring.
template <class Tr>
__device__ __forceinline__ void consumer_mainloop_fp8(const Params &p, const TileCoords &c, unsigned char *smem,
                                                      Fp8Barriers *bars, int w, int lane, int t,
                                                      int rdiag0, float sl2, float cap_scale,
                                                      float (&O)[Tr::kD / 2], float (&row_max)[2],
                                                      float (&row_sum)[2], Pipe &pipe) {
    constexpr int kD = Tr::kD, kBN = Tr::kBN, kNT = Tr::kNT, kKS = Tr::kKSteps;
    // Head dim 128: the softmax of S_i overlaps P_{i-1} V (two P register sets, as the 16-bit
    // mainloop). Head dim 256: S_i and P_{i-1} V in flight together need O (128) + S (64) + P
    // (16) operand registers, and ptxas spilled and serialized the wgmmas (C7512) even with one P
    // set, so each tile runs S, softmax, P V in turn (serial_tiles); the two consumer warpgroups
    // still overlap each other.
    // With kFp8OverlapWide head dim 256 overlaps too (without a soft cap), on one P set
    // (overlapped_tiles_one_p).
    // A tile wider than 128 keys (kFp8TileN) takes the one-P form too (S 96+ registers).
    constexpr bool kOverlap = kD <= 128 && kBN == 128;
    constexpr bool kOverlapOneP = !kOverlap && kFp8OverlapWide;
    // The exact alpha and the max slack (fp8_slack_form) only pay where the lazy rescale skips
    // O *= alpha.
    constexpr bool kSlack = fp8_slack_form(kD) && fp8_lazy_rescale(kD / 2);
    // Head dims 64 and 128 with the lazy rescale: at 256 the softmax's registers beside O (128),
    // S (64) and P (16) in flight spilled (20 bytes; 8 with one row half ordered), and at 128
    // without the lazy rescale ptxas serialized the wgmmas (C7512).
    constexpr bool kOrderSoftmax = kFp8OrderSoftmax && kD <= 128 && kSlack;
    const uint32_t s_base = cuda::smem_addr(smem);
    const uint64_t dq = cuda::make_desc_sw128(s_base + 64 * w * 128);
    const uint64_t dk = cuda::make_desc_sw128(s_base + Tr::kKOffset);
    const uint64_t dvt = cuda::make_desc_sw128(s_base + Tr::kVtOffset);  // K-major, like K

    const int r0 = pipe.kv;
    const int n_tiles = c.kt.last - c.kt.first + 1;
    // The softmax of the overlapped forms ahead of the wait for the P V it runs under (see
    // order_before_wgmma_wait: ptxas moved that wait ahead of the whole softmax, SASS of
    // 2026-12-03, so the softmax ran after P V, not under it). The row sums depend on every
    // exponential; seqlen_q is never negative; the store's target, were it ever taken, is a word
    // of the barrier block past Fp8Barriers. Where kOrderSoftmax (above).
    static_assert(sizeof(Fp8Barriers) + 8 <= 512, "scratch word of the barrier block");
    auto softmax_before_wait = [&]() {
        if constexpr (kOrderSoftmax)
            cuda::order_before_wgmma_wait(row_sum[0], row_sum[1], p.seqlen_q < 0,
                                          s_base + static_cast<uint32_t>(Tr::kBarOffset + 512));
    };
    auto step = [&](int i, uint32_t (&P)[kKS][4], uint32_t (&P_next)[kKS][4]) {
        const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
        float S[kNT][4];
        cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0 + i));
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i - 1));
        take_turn(w);
        issue_qk_fp8<Tr>(S, dq, dk, ks);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<1>();  // S_i is ready; P_{i-1} V_{i-1} may still run
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
        release(&bars->ring.k_empty[ks], lane);
        if (i == n_tiles - 1) release(&bars->ring.q_empty, lane);
        score_mods_fp8<Tr>(p, c, S, c.kt.last - i, rdiag0, t, cap_scale);
        float alpha[2];
        softmax_step_fp8<kSlack>(S, row_max, row_sum, sl2, P_next, alpha);
        softmax_before_wait();
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
        rescale_o_fp8(O, alpha);
    };
    auto last_pv = [&](uint32_t (&P)[kKS][4], int i) {
        const int vs = stage_of(r0 + i);
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i));
        take_turn(w);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
    };

    // Head dim 256: per tile S_i = Q K_i^T, the softmax, O += P_i V_i, each waited for.
    auto serial_tiles = [&]() {
        uint32_t P[kKS][4];
#pragma unroll 1
        for (int i = 0; i < n_tiles; ++i) {
            const int st = stage_of(r0 + i);
            const uint32_t ph = phase_of(r0 + i);
            float S[kNT][4];
            cuda::mbar_wait(&bars->ring.k_full[st], ph);
            take_turn(w);
            issue_qk_fp8<Tr>(S, dq, dk, st);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->ring.k_empty[st], lane);
            if (i == n_tiles - 1) release(&bars->ring.q_empty, lane);
            score_mods_fp8<Tr>(p, c, S, c.kt.last - i, rdiag0, t, cap_scale);
            float alpha[2];
            softmax_step_fp8<kSlack>(S, row_max, row_sum, sl2, P, alpha);  // alpha 0 on the first tile: O is 0
            rescale_o_fp8(O, alpha);
            cuda::mbar_wait(&bars->vt_full[st], ph);
            take_turn(w);
            issue_pv_fp8<Tr>(O, P, dvt, st);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(O);
            release(&bars->vt_empty[st], lane);
        }
    };

    // Head dim 128: key tile i: S_i, then P_i V_i during step i+1; P alternates between P0 and P1.
    auto overlapped_tiles = [&](uint32_t (&P0)[kKS][4], uint32_t (&P1)[kKS][4]) {
        {
            const int ks = stage_of(r0);
            float S[kNT][4];
            cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0));
            take_turn(w);
            issue_qk_fp8<Tr>(S, dq, dk, ks);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->ring.k_empty[ks], lane);
            if (n_tiles == 1) release(&bars->ring.q_empty, lane);
            score_mods_fp8<Tr>(p, c, S, c.kt.last, rdiag0, t, cap_scale);
            float alpha[2];
            softmax_step_fp8<kSlack>(S, row_max, row_sum, sl2, P0, alpha);
        }
        int i = 1;
        for (; i + 1 < n_tiles; i += 2) {
            step(i, P0, P1);
            step(i + 1, P1, P0);
        }
        if (i < n_tiles) {
            step(i, P0, P1);
            last_pv(P1, i);
        } else {
            last_pv(P0, i - 1);
        }
    };
    // Head dim 256 with kFp8OverlapWide: as overlapped_tiles, but one P set: during the softmax of
    // S_i, P holds P_{i-1} (the operand of the P V in flight); the softmax leaves fp32 P_i in S,
    // packed into P once P_{i-1} V retired. Live across the softmax: O (128), S (64), P (16).
    auto step_one_p = [&](int i, uint32_t (&P)[kKS][4]) {
        const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
        float S[kNT][4];
        cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0 + i));
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i - 1));
        take_turn(w);
        issue_qk_fp8<Tr>(S, dq, dk, ks);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<1>();  // S_i is ready; P_{i-1} V_{i-1} may still run
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
        release(&bars->ring.k_empty[ks], lane);
        if (i == n_tiles - 1) release(&bars->ring.q_empty, lane);
        score_mods_fp8<Tr, false>(p, c, S, c.kt.last - i, rdiag0, t, cap_scale);
        float alpha[2];
        softmax_exp_fp8<kSlack>(S, row_max, row_sum, sl2, alpha);
        softmax_before_wait();
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
        rescale_o_fp8(O, alpha);
        pack_p_fp8(S, P);
    };
    auto overlapped_tiles_one_p = [&]() {
        uint32_t P[kKS][4];
        {
            const int ks = stage_of(r0);
            float S[kNT][4];
            cuda::mbar_wait(&bars->ring.k_full[ks], phase_of(r0));
            take_turn(w);
            issue_qk_fp8<Tr>(S, dq, dk, ks);
            pass_turn(w);
            cuda::wgmma_wait<0>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
            release(&bars->ring.k_empty[ks], lane);
            if (n_tiles == 1) release(&bars->ring.q_empty, lane);
            score_mods_fp8<Tr, false>(p, c, S, c.kt.last, rdiag0, t, cap_scale);
            float alpha[2];
            softmax_step_fp8<kSlack>(S, row_max, row_sum, sl2, P, alpha);  // O is 0: no rescale
        }
#pragma unroll 1
        for (int i = 1; i < n_tiles; ++i) step_one_p(i, P);
        last_pv(P, n_tiles - 1);
    };
    // Head dim 128 with kFp8PrefetchS: S_i is in flight in Sc when step_prefetch(i) starts and P
    // holds P_{i-1}; it issues P_{i-1} V and S_{i+1} (into Sn), runs the softmax of S_i under
    // both, and packs P_i once P_{i-1} V retired. Commit groups in order: S_i, P_{i-1} V, S_{i+1}.
    auto step_prefetch = [&](int i, float (&Sc)[kNT][4], float (&Sn)[kNT][4], uint32_t (&P)[kKS][4]) {
        const int ks = stage_of(r0 + i), kn = stage_of(r0 + i + 1), vs = stage_of(r0 + i - 1);
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i - 1));
        cuda::mbar_wait(&bars->ring.k_full[kn], phase_of(r0 + i + 1));
        take_turn(w);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        issue_qk_fp8<Tr>(Sn, dq, dk, kn);
        pass_turn(w);
        cuda::wgmma_wait<2>();  // S_i
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(Sc));
        release(&bars->ring.k_empty[ks], lane);
        score_mods_fp8<Tr, false>(p, c, Sc, c.kt.last - i, rdiag0, t, cap_scale);
        float alpha[2];
        softmax_exp_fp8<kSlack>(Sc, row_max, row_sum, sl2, alpha);
        softmax_before_wait();
        cuda::wgmma_wait<1>();  // P_{i-1} V
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
        rescale_o_fp8(O, alpha);
        pack_p_fp8(Sc, P);
    };
    // The last key tile (i = n_tiles - 1 >= 1): no S to issue.
    auto step_prefetch_last = [&](int i, float (&Sc)[kNT][4], uint32_t (&P)[kKS][4]) {
        const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
        cuda::mbar_wait(&bars->vt_full[vs], phase_of(r0 + i - 1));
        take_turn(w);
        issue_pv_fp8<Tr>(O, P, dvt, vs);
        pass_turn(w);
        cuda::wgmma_wait<1>();  // S_i
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(Sc));
        release(&bars->ring.k_empty[ks], lane);
        release(&bars->ring.q_empty, lane);
        score_mods_fp8<Tr, false>(p, c, Sc, c.kt.last - i, rdiag0, t, cap_scale);
        float alpha[2];
        softmax_exp_fp8<kSlack>(Sc, row_max, row_sum, sl2, alpha);
        softmax_before_wait();
        cuda::wgmma_wait<0>();  // P_{i-1} V
        cuda::fence_operands(O);
        release(&bars->vt_empty[vs], lane);
        rescale_o_fp8(O, alpha);
        pack_p_fp8(Sc, P);
    };
    auto prefetched_tiles = [&]() {  // n_tiles >= 2
        float Sa[kNT][4], Sb[kNT][4];
        uint32_t P[kKS][4];
        {  // S_0 and S_1 issued together; the softmax of S_0 runs under S_1
            const int k0 = stage_of(r0), k1 = stage_of(r0 + 1);
            cuda::mbar_wait(&bars->ring.k_full[k0], phase_of(r0));
            cuda::mbar_wait(&bars->ring.k_full[k1], phase_of(r0 + 1));
            take_turn(w);
            issue_qk_fp8<Tr>(Sa, dq, dk, k0);
            issue_qk_fp8<Tr>(Sb, dq, dk, k1);
            pass_turn(w);
            cuda::wgmma_wait<1>();
            cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(Sa));
            release(&bars->ring.k_empty[k0], lane);
            score_mods_fp8<Tr, false>(p, c, Sa, c.kt.last, rdiag0, t, cap_scale);
            float alpha[2];
            softmax_step_fp8<kSlack>(Sa, row_max, row_sum, sl2, P, alpha);  // O is 0: no rescale
        }
        int i = 1;  // S_i of odd i is in Sb, of even i in Sa
#pragma unroll 1
        for (; i + 2 < n_tiles; i += 2) {
            step_prefetch(i, Sb, Sa, P);
            step_prefetch(i + 1, Sa, Sb, P);
        }
        if (i + 1 < n_tiles) {
            step_prefetch(i, Sb, Sa, P);
            step_prefetch_last(i + 1, Sa, P);
        } else {
            step_prefetch_last(i, Sb, P);
        }
        last_pv(P, n_tiles - 1);
    };
    cuda::mbar_wait(&bars->ring.q_full, static_cast<uint32_t>(pipe.q & 1));
    if constexpr (kOverlap) {
        if (kFp8PrefetchS && p.softcap_scale == 0.f && n_tiles > 1) {  // (one tile: nothing to prefetch)
            prefetched_tiles();
        } else {
            uint32_t Pa[kKS][4], Pb[kKS][4];
            overlapped_tiles(Pa, Pb);
        }
    } else if constexpr (kOverlapOneP) {
        // The soft cap's tanh did not fit beside O, S and P (ptxas spilled): capped plans run the
        // serial form.
        if (p.softcap_scale == 0.f)  // (from the parameter space: no register held for the test)
            overlapped_tiles_one_p();
        else
            serial_tiles();
    } else {
        serial_tiles();
    }
    pipe.kv += n_tiles;
    pipe.q += 1;
}

// Consumer warpgroup `w` of a work tile: descales, mainloop, epilogue (see consume in
// fa3_fwd_kernel.cuh for the thread's place in the accumulator layout).
template <class Tr, class E>
__device__ __forceinline__ void consume_fp8(const Fp8Params &p, const TileCoords &c, unsigned char *smem,
                                            Fp8Barriers *bars, int w, Pipe &pipe) {
    constexpr int kD = Tr::kD;
    const int tid = threadIdx.x - 128 * (w + 1);
    const int lane = tid & 31, t = lane & 3;  // (the warp and row g: query_rows)
    // The query rows (qpos) are recomputed from a fresh read of %tid.x for the epilogue: kept live
    // through the mainloop, ptxas spilled them at head dim 256 with kFp8OverlapWide.
    auto query_rows = [&](int (&qpos)[2]) {
        uint32_t tx;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tx));
        const int row = static_cast<int>(tx) - 128;  // 128 w + 32 warp + lane (w from tx too: m0 alone stays live)
        const int base = c.m0 + 64 * (row >> 7) + 16 * ((row & 127) >> 5) + ((row & 31) >> 2);
#pragma unroll
        for (int h = 0; h < 2; ++h) qpos[h] = base + 8 * h;
    };
    int rdiag0;  // the diagonal of row half 0 (row half 1: + 8)
    {
        int qpos[2];
        query_rows(qpos);
        rdiag0 = qpos[0] + cuda::diagonal_offset(p, c.seq.sq, c.seq.sk);
    }
    // Descales of this (sequence, kv head). The scores are dq dk (q . k): the product scales the
    // exp2 multiplier, or with a soft cap the pre-tanh scale (sl2 is then cap * log2 e).
    const int64_t ds = static_cast<int64_t>(c.b) * p.descale_bs + static_cast<int64_t>(c.head / p.group) * p.descale_hs;
    const float dqk = p.descale_q[ds] * p.descale_k[ds];
    const float sl2 = p.softcap_scale != 0.f ? p.score_log2 : p.score_log2 * dqk;
    const float cap_scale = p.softcap_scale * dqk;

    float O[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) O[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    if (c.has_keys()) {
        consumer_mainloop_fp8<Tr>(p, c, smem, bars, w, lane, t, rdiag0, sl2, cap_scale, O, row_max, row_sum, pipe);
        // P carried a factor 256 in both O and the row sums: O gets dv / 256, the sums 1 / 256
        // (exact), so O / l is dv (P V) / l and the LSE is the unscaled one.
        const float o_scale = p.descale_v[ds] * kInvPScale;
#pragma unroll
        for (int j = 0; j < kD / 2; ++j) O[j] *= o_scale;
        row_sum[0] *= kInvPScale;
        row_sum[1] *= kInvPScale;
    }
    int qpos[2];
    query_rows(qpos);
    store_output<Tr, E>(p, c, O, row_max, row_sum, sl2, qpos, t);
}

template <class Tr, class E>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ Fp8Params p) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    Fp8Barriers *bars = reinterpret_cast<Fp8Barriers *>(smem + Tr::kBarOffset);

    if (threadIdx.x == 0) {
        cuda::mbar_init(&bars->ring.q_full, 1);
        cuda::mbar_init(&bars->ring.q_empty, kConsumerWarps);
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            cuda::mbar_init(&bars->ring.k_full[s], 1);
            cuda::mbar_init(&bars->ring.v_full[s], 1);
            cuda::mbar_init(&bars->ring.k_empty[s], kConsumerWarps);
            cuda::mbar_init(&bars->ring.v_empty[s], kTransposeWarps);  // the staging ring's readers
            cuda::mbar_init(&bars->vt_full[s], kTransposeWarps);
            cuda::mbar_init(&bars->vt_empty[s], kConsumerWarps);
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();

    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int n_work = m_blocks * p.heads_q * p.batch;
    const int wg = threadIdx.x / 128;
    Pipe pipe;
    if (wg == 0) {
        cuda::setmaxnreg_dec<kFp8ProducerRegs>();
        // The aligned base as a shared-window offset computed from smem_raw's (a constant ptxas
        // folds into the producer's immediates; through the 64-bit generic `smem` it kept a
        // register and spilled it at 24).
        const uint32_t sb = (cuda::smem_addr(smem_raw) + 1023u) & ~1023u;
        const int warp = threadIdx.x / 32;
        if (warp == 0) {
            if (threadIdx.x != 0) return;
            cuda::prefetch_tensormap(&tm_q);
            cuda::prefetch_tensormap(&tm_k);
            cuda::prefetch_tensormap(&tm_v);
            produce_fp8<Tr>(p, &tm_q, &tm_k, &tm_v, sb);
        } else if (warp == 1) {
            transpose_tiles_fp8<Tr, 0>(sb);
        } else if (warp == 2) {
            transpose_tiles_fp8<Tr, 1>(sb);
        } else {
            transpose_tiles_fp8<Tr, 2>(sb);
        }
    } else {
        cuda::setmaxnreg_inc<kFp8ConsumerRegs>();
        if (wg == 2) pass_turn(1);  // warpgroup 0 (wg 1) issues first
        for (int r = 0, tile; (tile = nth_tile(r, n_work)) >= 0; ++r) {
            const TileCoords c = tile_coords(p, tile, m_blocks, Tr::kBN);
            if (c.has_rows()) consume_fp8<Tr, E>(p, c, smem, bars, wg - 1, pipe);
        }
        if (wg == 1) take_turn(0);  // warpgroup 1's last pass
    }
}

// Host launcher: the persistent grid of launch_fwd (launch_persistent, fa3_launch.cuh).
template <int kD, class E>
cudaError_t launch_fp8_fwd(const Fp8Params &p, const TensorMaps &maps, cudaStream_t stream) {
    using Tr = Fp8Traits<kD>;
    static unsigned long long optin_done = 0;  // one per instantiation
    return launch_persistent(fp8_fwd_kernel<Tr, E>, Tr::kSmemBytes, &optin_done, p, stream, maps.q, maps.k, maps.v);
}

}  // namespace fa3
}  // namespace flashattn
