// FA3 forward, consumer mainloop: one consumer warpgroup's walk over the visible key tiles of a
// work tile. Per key tile: S = Q K^T (wgmma, both operands in shared memory, K-major), soft cap
// and mask on the accumulator registers, the online softmax step, and O += P V (wgmma with P from
// registers: the S accumulator layout is the m16k16 A fragment, no shuffle; V MN-major in shared
// memory).
//
// The loop overlaps the two GEMMs with the softmax inside a warpgroup: at step n it issues
// S_n = Q K_n^T and O += P_{n+1} V_{n+1} back to back, waits only for S_n, computes the softmax
// of S_n while the PV GEMM still runs, then waits for it and rescales O. Where Traits::kPingPong,
// the two consumer warpgroups take turns issuing (take_turn below), so one's softmax runs under
// the other's GEMMs; elsewhere they run independently, in practice in lockstep on the same K tile.
//
// Assumptions a backward/FP8 author must keep: each consumer warpgroup owns 64 rows of the
// 128-row Q tile (wgmma m64); buffers are released per warp (kConsumerWarps arrivals); key tiles
// are taken in the producer's order (last visible tile first, so the masked edge tiles come
// first); 16-bit operands with 128-byte swizzle (make_desc_sw128).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/cuda/device/online_softmax.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_tile_scheduler.cuh"
#include "backends/cuda/fa3/fa3_traits.cuh"

namespace flashattn {
namespace fa3 {

// A consumer warp is done reading a buffer: its lanes have all passed the wgmma wait.
__device__ __forceinline__ void release(uint64_t *bar, int lane) {
    __syncwarp();
    if (lane == 0) cuda::mbar_arrive(bar);
}

// A k16 step of a K-major SW128 operand, as a descriptor offset (16-byte units): +32 B inside
// the 128 B row, a new 64-column page (`page` bytes on) every 4 steps.
__device__ __forceinline__ uint64_t k_step(int ks, int page) {
    return static_cast<uint64_t>(((ks / 4) * page + (ks % 4) * 32) >> 4);
}

// Issues S = Q K^T for K ring stage `st` (not waited for): kD / 16 wgmmas, both operands in
// shared memory. Operand fences before wgmma.fence: no register of a wgmma is defined by an
// ordinary instruction inside the issue window (ptxas would serialize the wgmmas, C7513).
// kRamp (ALiBi's ramp kernel, kAlibiGemm below): one more k16 slice in the same commit group,
// accumulating into S, A = `a` (the rows' slopes) from registers, B at `dr` (the key offsets);
// the plain kernels never read `a` or `dr`. kN: the keys of S, the K tile's first kN rows
// (kBN; the sink kernel's narrow sink tile, kSinkNarrowKeys).
template <class Tr, class E, bool kRamp, int kN = Tr::kBN>
__device__ __forceinline__ void issue_qk(float (&S)[kN / 8][4], uint64_t dq, uint64_t dk, int st,
                                         uint32_t (&a)[4], uint64_t dr) {
    float(&acc)[kN / 2] = reinterpret_cast<float(&)[kN / 2]>(S);
    const uint64_t dks = dk + static_cast<uint64_t>((st * Tr::kKVBytes) >> 4);
    cuda::fence_operands(acc);
    if constexpr (kRamp) cuda::fence_operands(a);
    cuda::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kD / 16; ++ks)
        cuda::wgmma_ss<E, kN>(acc, dq + k_step(ks, Tr::kQPage), dks + k_step(ks, Tr::kKVPage), ks > 0);
    if constexpr (kRamp) cuda::wgmma_rs_kmajor<E, kN>(acc, a, dr, 1);
    cuda::wgmma_commit();
}

// O *= the softmax step's alpha, per row half (accumulator registers 2, 3 of every 4 are row g + 8).
template <int kDV>
__device__ __forceinline__ void rescale_o(float (&O)[kDV / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < kDV / 2; ++j) O[j] *= alpha[(j % 4) / 2];
}

// Issues O += P V for V ring stage `st` (not waited for): P from registers, 16 keys (16 rows of
// 128 B of V) per wgmma, N = V's width (kDV).
template <class Tr, class E>
__device__ __forceinline__ void issue_pv(float (&O)[Tr::kDV / 2], const uint32_t (&P)[Tr::kPF][4], uint64_t dv,
                                         int st) {
    const uint64_t dvs = dv + static_cast<uint64_t>((st * Tr::kVBytes) >> 4);
    cuda::fence_operands(O);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kPF; ++kk)
        cuda::wgmma_rs<E, Tr::kDV>(O, P[kk], dvs + static_cast<uint64_t>((kk * 16 * 128) >> 4), 1);
    cuda::wgmma_commit();
}

// Ping-pong of the two consumer warpgroups (as the FP8 kernel, fa3_fp8_kernel.cuh): each wgmma
// issue point is a turn on named barrier 1 + w, passed to the other warpgroup right after the
// commit, so one warpgroup's softmax runs under the other's GEMMs instead of both in lockstep.
// The form ptxas accepts is the FP8 kernel's: every mbarrier wait before the turn, both GEMMs of a
// step issued inside it (an mbarrier wait between the issues, as the earlier bf16 attempts had,
// is what is not mirrored here). Both warpgroups walk the same tiles, so the turns pair up.
__device__ __forceinline__ void take_turn(int w) {
    asm volatile("bar.sync %0, 256;" ::"r"(1 + w) : "memory");
}
__device__ __forceinline__ void pass_turn(int w) {
    asm volatile("bar.arrive %0, 256;" ::"r"(2 - w) : "memory");
}

// Head dim 256 runs no sink tokens (refused in fa3_backend.cpp): its consumer registers are full,
// and the sink tiles' walk and bound made ptxas spill its mainloop. Its walk is the window's alone.
template <class Tr>
constexpr bool kSinkTokens = Tr::kD < 256;

template <class Tr>
__device__ __forceinline__ int walk_tiles(const TileCoords &c) {
    if constexpr (kSinkTokens<Tr>) return c.n_tiles();
    return c.kt.last - c.kt.first + 1;
}

template <class Tr>
__device__ __forceinline__ int walk_tile(const TileCoords &c, int i) {
    if constexpr (kSinkTokens<Tr>) return c.key_tile(i);
    return c.kt.last - i;
}

// ALiBi's one-sided form (cuda::alibi_scores_one_side and the softmax's row offset): not at head
// dim 256, whose consumer spilled 123 LDL/STL with the offset's registers (test_fa3_sass, H200 run
// of 2026-12-01): there every tile takes the general bias and the plain softmax step.
template <class Tr>
constexpr bool kAlibiOneSide = Tr::kD < 256;

// On an edge tile (every sink tile is one) the causal / window / ragged-end / sink-token mask of
// key tile `nb` (the thread's first column at key col0).
template <class Tr>
__device__ __forceinline__ void mask_tile(const Params &p, const TileCoords &c, float (&S)[Tr::kNT][4], int nb,
                                          const int (&rdiag)[2], int col0) {
    if (c.kt.masked(nb)) {
        if constexpr (kSinkTokens<Tr>)
            cuda::mask_scores<true>(S, rdiag, col0, c.seq.sk, p.right_i, p.left_i, p.sink_tokens);
        else
            cuda::mask_scores<false>(S, rdiag, col0, c.seq.sk, p.right_i, p.left_i);
    }
}

// Soft cap, ALiBi, then on an edge tile (every sink tile is one) the causal / window / ragged-end /
// sink-token mask on key tile `nb`. shift: the row offset of the scores for the softmax (0 but
// for ALiBi on a tile wholly on one side of the thread's rows' diagonals, which adds one FFMA per
// score and leaves the row part of the bias to the softmax: cuda::alibi_scores_one_side).
template <class Tr>
__device__ __forceinline__ void score_mods(const Params &p, const TileCoords &c, float (&S)[Tr::kNT][4], int nb,
                                           const int (&rdiag)[2], int t, float (&shift)[2]) {
    if (p.softcap_scale != 0.f) cuda::softcap_scores(S, p.softcap_scale);
    const int col0 = nb * Tr::kBN + 2 * t;
    shift[0] = shift[1] = 0.f;
    if (p.alibi_slopes != nullptr) {
        const float s = p.alibi_slopes[c.head] * p.alibi_to_score;
        if (kAlibiOneSide<Tr> && cuda::alibi_one_side<Tr::kNT>(rdiag, col0))
            cuda::alibi_scores_one_side(S, rdiag, {s, s}, col0, shift);
        else
            cuda::alibi_scores(S, rdiag, {s, s}, col0);
    }
    mask_tile<Tr>(p, c, S, nb, rdiag, col0);
}

// ALiBi's column bias inside the GEMM (the ramp kernel, RampTraits: Params::alibi_gemm, no soft
// cap, which comes before the bias). On a key tile wholly on one side of a row's diagonal the
// bias is s*c + s*(tile0 - rdiag) with c the key's offset in the tile and s = +-slope by side
// (alibi_scores_one_side): the row part goes to the softmax as its shift, the column part s*c is
// one more k16 slice of S = Q K^T, A[row][0..2] = s split into three 16-bit parts (hi, mid, lo:
// s to ~24 bits, each product with c exact in fp32), B[key][k] = c for k % 8 < 3 (every 16-byte
// chunk of a key's 128-byte row the same, so the SW128 swizzle, which permutes a row's chunks,
// cannot move a value: the layout is the K tile's, descriptor and all). The FFMA per score goes
// away for one m64n(kBN)k16 wgmma per tile. A row whose diagonal crosses the tile gets A = 0 and
// the general bias after the GEMM.
template <class Tr>
constexpr bool kAlibiGemm = Tr::kAlibiRamp && kAlibiOneSide<Tr>;  // (one_side: its shifted softmax)
constexpr int kAlibiRampBar = 5;  // named barrier of the ramp's writers (1, 2: ping-pong; 3, 4: O staging)

// The ramp block (Traits::kAlibiOffset), written once per CTA by the 256 consumer threads
// (`ctid`) before their first S GEMM: the async-proxy fence orders the stores before the
// wgmmas' reads, the barrier before every consumer's first issue.
template <class Tr, class E>
__device__ __forceinline__ void alibi_ramp_write(unsigned char *smem, int ctid) {
    uint4 *b = reinterpret_cast<uint4 *>(smem + Tr::kAlibiOffset);
#pragma unroll 1
    for (int i = ctid; i < Tr::kBN * 8; i += 2 * 128) {  // 8 chunks of 16 B per key row
        const float c = static_cast<float>(i / 8);        // exact in 16 bits: kBN <= 256
        b[i] = make_uint4(cuda::pack2<E>(c, c), cuda::pack2<E>(c, 0.f), 0u, 0u);
    }
    cuda::fence_proxy_async_smem();
    cuda::named_barrier_sync(kAlibiRampBar, 2 * 128);
}

// x rounded to E, as E's bits (low half) and as a float.
template <class E>
__device__ __forceinline__ float round_e(float x, uint32_t &bits) {
    bits = cuda::pack2<E>(x, 0.f) & 0xffffu;
    if constexpr (std::is_same_v<E, cuda::Bf16>) return __uint_as_float(bits << 16);
    float f;
    asm("{\n\t.reg .b16 h;\n\tcvt.u16.u32 h, %1;\n\tcvt.f32.f16 %0, h;\n\t}" : "=f"(f) : "r"(bits));
    return f;
}

// This thread's word of the ramp's A fragment for a row of slope s (score units): k columns 2t,
// 2t+1 of the row, so t = 0 holds (hi, mid), t = 1 (lo, 0), t = 2, 3 zeros. s - hi and
// s - hi - mid are exact in fp32.
template <class E>
__device__ __forceinline__ uint32_t alibi_ramp_word(float s, int t) {
    uint32_t hb, mb, lb;
    const float hi = round_e<E>(s, hb);
    const float mid = round_e<E>(s - hi, mb);
    round_e<E>(s - hi - mid, lb);
    return t == 0 ? (hb | mb << 16) : t == 1 ? lb : 0u;
}

// Whether a head's slope s (score units) can ride in the ramp: its leading 16-bit part must be
// finite in E (fp16 tops out at 65504, which s passes with a tiny explicit scale); otherwise, and
// for a non-finite s, every tile of the work tile takes the general bias, as main's FFMA form.
template <class E>
__device__ __forceinline__ bool alibi_ramp_fits(float s) {
    return fabsf(s) <= (std::is_same_v<E, cuda::Bf16> ? 3.38e38f : 65504.f);  // false for NaN
}

// The ramp's A fragment for key tile `nb`: row half h (a[h]: row g + 8h, k columns 2t, 2t + 1)
// takes +s left of its diagonal (every key j <= rdiag), -s right of it (every j >= rdiag: both
// 16-bit halves' signs flipped), 0 where the diagonal crosses the tile or the slope does not fit
// (`fits`, alibi_ramp_fits); k columns 8.. are 0.
template <class Tr>
__device__ __forceinline__ void alibi_ramp_a(uint32_t word, bool fits, int nb, const int (&rdiag)[2],
                                             uint32_t (&a)[4]) {
    const int first = nb * Tr::kBN, last = first + Tr::kBN - 1;
#pragma unroll
    for (int h = 0; h < 2; ++h)
        a[h] = !fits ? 0u : last <= rdiag[h] ? word : first >= rdiag[h] ? word ^ 0x80008000u : 0u;
    a[2] = a[3] = 0u;
}

// score_mods for the ramp's loop: S holds s*c already on the rows alibi_ramp_a gave a slope;
// they get the row shift, the others the general bias; then the mask.
template <class Tr>
__device__ __forceinline__ void score_mods_ramp(const Params &p, const TileCoords &c, float (&S)[Tr::kNT][4],
                                                int nb, const int (&rdiag)[2], int t, float s, bool fits,
                                                float (&shift)[2]) {
    const int first = nb * Tr::kBN, last = first + Tr::kBN - 1, col0 = first + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        shift[h] = 0.f;
        if (fits && last <= rdiag[h])
            shift[h] = s * static_cast<float>(first - rdiag[h]);
        else if (fits && first >= rdiag[h])
            shift[h] = -s * static_cast<float>(first - rdiag[h]);
        else
            cuda::alibi_scores_half(S, h, rdiag[h], s, col0);
    }
    mask_tile<Tr>(p, c, S, nb, rdiag, col0);
}

// The sink kernel (SinkTraits): whether this work tile's walk ends in the one narrow sink tile,
// key tile 0 below at least one window tile (so it is walked last and is not the walk's first
// tile), with every sink key among its first kSinkNarrowKeys columns. The tile's other keys are
// invisible to every row (tile 0 lies below the window's first tile, cuda::sink_tile_last), so
// dropping them changes nothing.
__device__ __forceinline__ bool sink_narrow(const Params &p, const TileCoords &c) {
    return c.sink_last == 0 && c.kt.first <= c.kt.last && p.sink_tokens <= kSinkNarrowKeys;
}

// The narrow sink tile, ring position `pos`, after the loop's last P V has retired (O settled,
// no wgmma in flight, so the n16 accumulator needs no register beside a pipelined GEMM's):
// S16 = Q K_0[0:16]^T as kD/16 m64n16k16 wgmmas (K's descriptor, only 16 of its rows), the sink
// mask and the softmax on 16 columns, O rescaled, then O += P16 V_0[0:16] as one m64n(kDV)k16
// wgmma (V's descriptor at offset 0: its first 16 rows). Releases K_0, Q and V_0 as the loop would.
// Soft cap and ALiBi as score_mods (ALiBi in its general form: the tile's bias is 16 columns).
// No ping-pong turn: both warpgroups skip it alike, so the loop's turns still pair up.
template <class Tr, class E>
__device__ __forceinline__ void sink_tile_narrow(const Params &p, const TileCoords &c, Barriers *bars, uint64_t dq,
                                                 uint64_t dk, uint64_t dv, int pos, int lane, int t,
                                                 const int (&rdiag)[2], float sl2, float (&O)[Tr::kDV / 2],
                                                 float (&row_max)[2], float (&row_sum)[2]) {
    constexpr int kN = kSinkNarrowKeys;
    const int st = stage_of(pos);
    float S[kN / 8][4];
    uint32_t no_ramp[4];
    cuda::mbar_wait(&bars->k_full[st], phase_of(pos));
    issue_qk<Tr, E, false, kN>(S, dq, dk, st, no_ramp, 0);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(reinterpret_cast<float(&)[kN / 2]>(S));
    release(&bars->k_empty[st], lane);
    release(&bars->q_empty, lane);  // the walk's last GEMM reading Q
    const int col0 = 2 * t;         // key tile 0
    if (p.softcap_scale != 0.f) cuda::softcap_scores(S, p.softcap_scale);
    if (p.alibi_slopes != nullptr) {
        const float s = p.alibi_slopes[c.head] * p.alibi_to_score;
        cuda::alibi_scores(S, rdiag, {s, s}, col0);
    }
    cuda::mask_scores<true>(S, rdiag, col0, c.seq.sk, p.right_i, p.left_i, p.sink_tokens);
    uint32_t P[kN / 16][4];
    float alpha[2];
    cuda::softmax_step<E>(S, row_max, row_sum, sl2, P, alpha);
    rescale_o<Tr::kDV>(O, alpha);
    const uint64_t dvs = dv + static_cast<uint64_t>((st * Tr::kVBytes) >> 4);
    cuda::mbar_wait(&bars->v_full[st], phase_of(pos));
    cuda::fence_operands(O);
    cuda::fence_operands(P[0]);
    cuda::wgmma_fence();
    cuda::wgmma_rs<E, Tr::kDV>(O, P[0], dvs, 1);
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
    cuda::fence_operands(O);
    release(&bars->v_empty[st], lane);
}

// Consumer warpgroup `w` (0 or 1), rows 64w..64w+63 of a tile with at least one visible key
// tile: accumulates the unnormalised O and the softmax row statistics (row_max, row_sum) over
// all key tiles and advances `pipe` past them. `lane`, `t` (lane % 4) and `rdiag` (each of the
// thread's two rows' diagonal key) place the thread in the accumulator layout. kRamp: ALiBi's
// column bias in the S GEMM (kAlibiGemm above), `s` the head's slope in score units and `word`
// this thread's A-fragment word of it (alibi_ramp_word); a slope that does not fit the ramp
// (alibi_ramp_fits) takes the general bias on every tile.
template <class Tr, class E, bool kRamp>
__device__ __forceinline__ void consumer_mainloop_impl(const Params &p, const TileCoords &c, unsigned char *smem,
                                                       Barriers *bars, int w, int lane, int t, const int (&rdiag)[2],
                                                       float sl2, float (&O)[Tr::kDV / 2], float (&row_max)[2],
                                                       float (&row_sum)[2], Pipe &pipe, float s, uint32_t word) {
    constexpr int kDV = Tr::kDV, kBN = Tr::kBN, kNT = Tr::kNT, kPF = Tr::kPF;
    // Descriptors: Q rows 64w.. (K-major), K (K-major), V (MN-major: LBO = one 64-column page).
    const uint32_t s_base = cuda::smem_addr(smem);
    const uint64_t dq = cuda::make_desc_sw128(s_base + 64 * w * 128);
    const uint64_t dk = cuda::make_desc_sw128(s_base + Tr::kKOffset);
    const uint64_t dv = cuda::make_desc_sw128(s_base + Tr::kVOffset, 1024, Tr::kKVPage);
    // The ramp block: kBN key rows of 128 B, K-major SW128 like a K tile's first page.
    const uint64_t dr = kRamp ? cuda::make_desc_sw128(s_base + Tr::kAlibiOffset) : 0;
    const bool fits = kRamp && alibi_ramp_fits<E>(s);  // (uniform over the work tile)

    // Key tile i is consumed as S_i, then P_i V_i during step i+1. P alternates between two
    // register sets (the loop is unrolled by two) so that the softmax writing P_{i+1} never
    // targets registers the in-flight P_i V_i wgmma still reads; a plain copy would be
    // coalesced by ptxas and serialize the wgmmas (C7513).
    const int r0 = pipe.kv;  // ring position of this tile's first key tile
    const int n_tiles = walk_tiles<Tr>(c);
    // The sink kernel takes its narrow sink tile (the walk's last) out of the loop: n_loop tiles
    // through it. (Under `if constexpr`: a `narrow ? n_tiles - 1 : n_tiles` with narrow a constant
    // false still changed the plain kernels' code, PTX and SASS.)
    int n_loop = n_tiles;
    bool narrow = false;
    if constexpr (Tr::kSinkNarrow) {
        narrow = sink_narrow(p, c);
        n_loop -= narrow ? 1 : 0;
    }
    auto step = [&](int i, uint32_t (&P)[kPF][4], uint32_t (&P_next)[kPF][4]) {
        const int ks = stage_of(r0 + i), vs = stage_of(r0 + i - 1);
        float S[kNT][4];
        uint32_t a[4];  // the ramp's A fragment (kRamp)
        if constexpr (kRamp) alibi_ramp_a<Tr>(word, fits, walk_tile<Tr>(c, i), rdiag, a);
        cuda::mbar_wait(&bars->k_full[ks], phase_of(r0 + i));
        if constexpr (Tr::kPingPong) {  // both waits before the turn (the form ptxas accepts)
            cuda::mbar_wait(&bars->v_full[vs], phase_of(r0 + i - 1));
            take_turn(w);
        }
        issue_qk<Tr, E, kRamp>(S, dq, dk, ks, a, dr);
        if constexpr (!Tr::kPingPong) cuda::mbar_wait(&bars->v_full[vs], phase_of(r0 + i - 1));
        issue_pv<Tr, E>(O, P, dv, vs);
        if constexpr (Tr::kPingPong) pass_turn(w);
        cuda::wgmma_wait<1>();  // S_i is ready; P_{i-1} V_{i-1} may still run
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
        release(&bars->k_empty[ks], lane);
        // The last GEMM reading Q retired (the sink kernel: after the loop, so that only n_loop
        // stays live through it).
        if (!Tr::kSinkNarrow && i == n_tiles - 1) release(&bars->q_empty, lane);
        float shift[2];
        if constexpr (kRamp)
            score_mods_ramp<Tr>(p, c, S, walk_tile<Tr>(c, i), rdiag, t, s, fits, shift);
        else
            score_mods<Tr>(p, c, S, walk_tile<Tr>(c, i), rdiag, t, shift);
        float alpha[2];
        if constexpr (kAlibiOneSide<Tr>)
            cuda::softmax_step_shifted<E>(S, row_max, row_sum, sl2, P_next, alpha, shift);
        else
            cuda::softmax_step<E>(S, row_max, row_sum, sl2, P_next, alpha);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->v_empty[vs], lane);
        rescale_o<kDV>(O, alpha);
    };
    auto last_pv = [&](uint32_t (&P)[kPF][4], int i) {
        const int vs = stage_of(r0 + i);
        cuda::mbar_wait(&bars->v_full[vs], phase_of(r0 + i));
        if constexpr (Tr::kPingPong) take_turn(w);
        issue_pv<Tr, E>(O, P, dv, vs);
        if constexpr (Tr::kPingPong) pass_turn(w);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(O);
        release(&bars->v_empty[vs], lane);
    };

    cuda::mbar_wait(&bars->q_full, static_cast<uint32_t>(pipe.q & 1));
    uint32_t Pa[kPF][4], Pb[kPF][4];
    {  // the first (last-indexed) key tile: no O to rescale yet
        const int ks = stage_of(r0);
        float S[kNT][4];
        uint32_t a[4];
        if constexpr (kRamp) alibi_ramp_a<Tr>(word, fits, walk_tile<Tr>(c, 0), rdiag, a);
        cuda::mbar_wait(&bars->k_full[ks], phase_of(r0));
        if constexpr (Tr::kPingPong) take_turn(w);
        issue_qk<Tr, E, kRamp>(S, dq, dk, ks, a, dr);
        if constexpr (Tr::kPingPong) pass_turn(w);
        cuda::wgmma_wait<0>();
        cuda::fence_operands(reinterpret_cast<float(&)[kBN / 2]>(S));
        release(&bars->k_empty[ks], lane);
        if (n_tiles == 1) release(&bars->q_empty, lane);
        float shift[2];
        if constexpr (kRamp)
            score_mods_ramp<Tr>(p, c, S, walk_tile<Tr>(c, 0), rdiag, t, s, fits, shift);
        else
            score_mods<Tr>(p, c, S, walk_tile<Tr>(c, 0), rdiag, t, shift);
        float alpha[2];
        if constexpr (kAlibiOneSide<Tr>)
            cuda::softmax_step_shifted<E>(S, row_max, row_sum, sl2, Pa, alpha, shift);
        else
            cuda::softmax_step<E>(S, row_max, row_sum, sl2, Pa, alpha);
    }
    int i = 1;
    for (; i + 1 < n_loop; i += 2) {
        step(i, Pa, Pb);
        step(i + 1, Pb, Pa);
    }
    if (i < n_loop) {
        step(i, Pa, Pb);
        last_pv(Pb, i);
    } else {
        last_pv(Pa, i - 1);
    }
    if constexpr (Tr::kSinkNarrow) {  // Q's release: by the narrow tile, else here (n_tiles > 1)
        if (narrow)
            sink_tile_narrow<Tr, E>(p, c, bars, dq, dk, dv, r0 + n_loop, lane, t, rdiag, sl2, O, row_max, row_sum);
        else if (n_loop > 1)
            release(&bars->q_empty, lane);
    }
    pipe.kv += n_tiles;
    pipe.q += 1;
}

// The work tile's mainloop. In the ramp kernel (Tr::kRamp: RampTraits, fa3_traits.cuh) ALiBi's
// column bias goes into the S GEMM: its first call (pipe.q == 0, the same call in both consumer
// warpgroups, before any S GEMM) writes the ramp block; the slope is loaded once per work tile.
// Otherwise main's loop, the bias (if any) an FFMA per score.
template <class Tr, class E>
__device__ __forceinline__ void consumer_mainloop(const Params &p, const TileCoords &c, unsigned char *smem,
                                                  Barriers *bars, int w, int lane, int t, const int (&rdiag)[2],
                                                  float sl2, float (&O)[Tr::kDV / 2], float (&row_max)[2],
                                                  float (&row_sum)[2], Pipe &pipe) {
    if constexpr (Tr::kRamp) {
        static_assert(kAlibiGemm<Tr>, "no ALiBi ramp in this kernel");
        if (pipe.q == 0) alibi_ramp_write<Tr, E>(smem, static_cast<int>(threadIdx.x) - 128);
        const float s = p.alibi_slopes[c.head] * p.alibi_to_score;
        consumer_mainloop_impl<Tr, E, true>(p, c, smem, bars, w, lane, t, rdiag, sl2, O, row_max, row_sum, pipe, s,
                                            alibi_ramp_word<E>(s, t));
    } else {
        consumer_mainloop_impl<Tr, E, false>(p, c, smem, bars, w, lane, t, rdiag, sl2, O, row_max, row_sum, pipe,
                                             0.f, 0u);
    }
}

}  // namespace fa3
}  // namespace flashattn
