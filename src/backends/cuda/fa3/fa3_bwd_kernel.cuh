// FlashAttention-3 backward main kernel for Hopper (sm_90a): TMA loads, wgmma, and its launcher.
// Algorithm 2 of FlashAttention-2 in the shape of FlashAttention-3's backward, key-block outer loop.
//
// Up to head dim 128: one CTA per (key block of kBwdBN = 128 keys, kv head, sequence), heads and sequences fastest in
// one grid dimension (as the FA2 backward: the first wave holds every head's first key blocks, and
// in deterministic mode a key block's predecessor in the dQ order is always an earlier CTA). Two
// consumer warpgroups; warpgroup w owns keys n0 + 64w .. n0 + 64w + 63 and keeps their dK and dV
// in registers. K and V arrive once by TMA. The CTA then walks every query block of kBwdBM = 64
// rows of every query head of the kv head's GQA group that sees any of its keys, in a fixed order;
// Q and dO load by TMA into a ring of kStages buffers ("full" / "empty" mbarriers), and each
// warpgroup cp.asyncs its own copy of the step's LSE and row_dot kStages - 1 steps ahead, so the
// two warpgroups only meet at the ring: they drift apart and one's GEMMs run under the other's
// elementwise work. Per step and warpgroup (transposed, so that the probabilities come out of the
// accumulator already in the A-fragment layout of the next GEMMs):
//   S^T  = K_w Q^T and dP^T = V_w dO^T        wgmma, both operands K-major in shared memory
//   P^T  = exp2(S'^T * score_log2 - LSE * log2 e) with S' the soft-capped score (tanh) when a
//          cap is set, plus ALiBi's bias when slopes are set; 0 where device/mask.cuh's rule hides
//          the key, for rows past the sequence and rows whose LSE is -inf (they saw no key)
//   dS^T = P^T (dP^T - row_dot) (x (1 - tanh^2) with a soft cap)
//   dV  += P^T dO and dK += dS^T Q             wgmma with P^T / dS^T from registers, dO / Q
//                                              MN-major in shared memory
//   dQ  += dS K_w                              dS^T through shared memory (16-bit), wgmma with
//                                              both operands MN-major, 64 columns at a time,
//                                              into an fp32 tile in shared memory that one bulk
//                                              reduction (cp.reduce.async.bulk .add.f32) adds
//                                              to the accumulator (the query block's rows are
//                                              contiguous there; default mode: both in
//                                              fragment order, device/dq_accum.cuh, whose
//                                              stores have no bank conflicts); the split
//                                              layout (above 128): red.v4 from registers,
//                                              fragment order in both modes
// head_dim_v != head_dim: the kernel of the wider head dim; TMA loads each tensor over its own
// width (zeros past it), so the GEMMs over the padded width add nothing there, and dK, dQ are
// stored over head_dim, dV over head_dim_v.
// At the end dK * scale and dV are stored (zeros for keys no query sees). The dQ scale is the
// convert kernel's (device/bwd_prep.cuh). GQA needs no dK/dV reduction across CTAs: the CTA walks
// its whole query-head group.
//
// Two kernels. bwd_kernel, the default mode: 256 threads, thread 0 of warpgroup 0 also issues the
// TMA loads, each warpgroup's thread 0 its bulk reductions. bwd_det_kernel, the deterministic mode
// (since stop 20): FlashAttention-3's shape, a third warpgroup that produces on 24 registers
// (setmaxnreg; the consumers run on 240): its warp 0 issues the TMA loads, its warp 1 is the dQ
// writer. After a barrier of the two consumer warpgroups (both halves of dS^T in shared memory),
// each computes whole 64-column pages of the step's dQ over all 128 keys and stores them to the
// step's slot (two slots, by step parity; dq_full / dq_empty mbarriers); the writer takes the key
// block's turn (a counter per (query head, query block), as FA2's: ascending key blocks, or in
// the keys-rotated grid the order of the walks, from the CTA's turn table: turn_of), reduces the slot in one bulk
// reduction and releases the turn: no consumer waits on L2.
// The same producer warpgroup ran the default mode 1-14 % slower (docs/kernel-notes.md).
//
// Head dim 256 (and 136..256, zero-padded; since stop 21): the split layout (BwdTraits), where
// 64 keys x 256 columns of dK and dV per warpgroup (256 registers) would not fit. One CTA per 64
// keys; both warpgroups hold all 64 keys and split the rest: warpgroup w computes S^T and dP^T
// against queries 32w .. 32w + 31 of the step (wgmma N = 32), stores its half of P^T and dS^T
// (16-bit) into two shared pages, meets the other warpgroup at a CTA barrier, reads both pages
// back as A fragments and accumulates dV, dK and dQ over its 128 head-dim columns (K = all 64
// queries, resp. keys). dQ goes to the accumulator by vector reductions from registers (no room
// for a 64 KB fp32 tile beside K, V and two Q / dO stages); in deterministic mode the same
// bwd_kernel takes the key block's turn around them (accumulate_dq_red).
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/dq_accum.cuh"
#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/fa3/fa3_bwd_params.h"
#include "backends/cuda/fa3/fa3_config.h"  // setmaxnreg_split_fits
#include "backends/cuda/fa3/fa3_mainloop.cuh"  // k_step
#include "backends/cuda/host/smem_optin.h"

namespace flashattn {
namespace fa3 {

// ---- the few sm_90a instructions the backward adds to ptx_sm90.cuh's ----------------------------

// D[64x64] (+)= A[64x16] * B[16x64], both operands in shared memory MN-major (M / N contiguous:
// SW128 descriptors as wgmma_rs's B). For dQ = dS K with dS^T and K stored key-major.
template <class E>
__device__ __forceinline__ void wgmma_ss_mn64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    cuda::wgmma_ss_t<E, 64, 1, 1>(d, desc_a, desc_b, scale_d);
}

// Ordinary shared-memory stores made visible to the async proxy (the wgmma reading them).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FLASHATTN_SM90A_BODY
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// Barrier of the 128 threads of one warpgroup (ids 1, 2; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int wg) {
    asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
}
// The deterministic kernel's barrier of both consumer warpgroups (256 threads; warpgroup_sync takes
// ids 1 and 2, __syncthreads 0).
constexpr int kBwdDetConsumerBar = 3;

// Two fp32 values into shared memory (8-byte aligned).
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
// Four at a time (16-byte aligned), and back.
__device__ __forceinline__ void st_shared_v4_f32(uint32_t addr, float x, float y, float z, float w) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4_f32(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
                 : "memory");
    return v;
}

// Bulk asynchronous reduction of `bytes` (a multiple of 16, both addresses 16-byte aligned) of
// fp32 from shared memory into global memory (+=); its bulk-group bookkeeping (cuda::bulk_commit,
// bulk_wait_read_all, bulk_wait_all) is in ptx_sm90.cuh.
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src_smem, uint32_t bytes) {
#if FLASHATTN_SM90A_BODY
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
                 "r"(src_smem), "r"(bytes)
                 : "memory");
#else
    (void)dst, (void)src_smem, (void)bytes;
    FLASHATTN_SM90A_TRAP();
#endif
}
// Orders this thread's generic-proxy and async-proxy accesses of global memory.
__device__ __forceinline__ void fence_proxy_async_global() {
#if FLASHATTN_SM90A_BODY
    asm volatile("fence.proxy.async.global;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// ---- layout -----------------------------------------------------------------------------------

struct BwdBarriers {
    uint64_t kv_full;                 // K and V landed (one phase: loaded once per CTA)
    uint64_t qdo_full[kBwdMaxStages];   // Q and dO of the buffer's step landed
    uint64_t qdo_empty[kBwdMaxStages];  // every consumer warp (8) is done with the buffer's Q and dO
    // bwd_det_kernel's dQ slots, slot s & 1 for step s, one phase per use: every thread of both
    // consumer warpgroups is done with the step's dQ (its pages stored, its dQ GEMM retired) ...
    uint64_t dq_full[2];
    // ... and every lane of the writer warp is done with the slot (its bulk reduction has read it).
    uint64_t dq_empty[2];
};

// Two layouts. Up to head dim 128, warpgroup w owns keys 64w .. 64w + 63 of the CTA's kBwdBN over
// all kD columns. The split layout (bwd_split, head dim 256) has 64 keys per CTA: warpgroup w
// computes S^T and dP^T for all of them against queries 32w .. 32w + 31 of the step (N = 32),
// writes its half of P^T and dS^T into two shared [64 keys][64 queries] pages, and after a CTA
// barrier reads both pages whole for dV, dK (head-dim columns w kD/2 .. (w + 1) kD/2 - 1, M = 64
// keys, K = 64 queries) and dQ (the same columns, M = 64 queries, K = 64 keys).
template <int kD_>
struct BwdTraits {
    static constexpr int kD = kD_;  // padded head dim, a multiple of 64
    static constexpr bool kSplit = bwd_split(kD);
    static constexpr int kBN = bwd_block_n(kD);  // keys per CTA
    static constexpr int kStages = bwd_stages(kD);
    static constexpr bool kBulkDQ = bwd_bulk_dq(kD);
    static constexpr int kPages = kD / 64;
    static constexpr int kQN = kSplit ? kBwdBM / 2 : kBwdBM;  // query columns of a warpgroup's S^T
    static constexpr int kDW = kSplit ? kD / 2 : kD;          // head-dim columns of a warpgroup's dK, dV, dQ
    static constexpr int kWPages = kDW / 64;                  // ... in 64-column pages
    static constexpr int kKeyW = kSplit ? 0 : 64;             // key offset of warpgroup w: w kKeyW
    static constexpr int kQPage = kBwdBM * 128;  // one 64-column page of a Q / dO tile
    static constexpr int kKPage = kBN * 128;     // ... of the K / V tile
    static constexpr int kQBytes = kPages * kQPage;
    static constexpr int kKBytes = kPages * kKPage;
    // Two [64 keys][kBwdBM queries] 16-bit pages: dS^T of warpgroup 0 and 1 (split: P^T and dS^T).
    static constexpr int kDSBytes = 64 * kBwdBM * 2;
    static constexpr int kRowsBytes = 2 * kBwdBM * 4;  // LSE then row_dot of one step, one warpgroup's copy
    static constexpr int kKOff = 0;
    static constexpr int kVOff = kKBytes;
    static constexpr int kQOff = 2 * kKBytes;  // buffer s: Q at kQOff + s * 2 * kQBytes, dO after it
    static constexpr int kDQBytes = bwd_dq_tiles(kD) ? kBwdBM * kD * 4 : 0;  // one warpgroup's fp32 dQ tile / slot
    static constexpr int kDSOff = kQOff + kStages * 2 * kQBytes;
    static constexpr int kDQOff = kDSOff + 2 * kDSBytes;
    static constexpr int kRowsOff = kDQOff + 2 * kDQBytes;
    static constexpr int kBarOff = kRowsOff + kStages * 2 * kRowsBytes;  // stage s, warpgroup w: s * 2 + w
    // The deterministic mode's turn table (keys rotated: build_turn_table), kBwdTurnTableMax ints
    // in the barriers' padded 1 KB.
    static constexpr int kTurnOff = kBarOff + 128;
    static constexpr int kSmemBytes = bwd_smem_bytes(kD);
    static constexpr int kNT = kQN / 8;   // n8 tiles of S^T per thread row
    static constexpr int kKF = kQN / 16;  // k16 fragments of the warpgroup's P^T
    static constexpr int kKFAll = kBwdBM / 16;  // ... of the whole step's (the split layout reads both halves)
    static_assert(kD % 64 == 0 && kBwdBM == 64, "one 64-column page holds dS^T of a step");
    static_assert(!kSplit || (kBN == 64 && kDW % 64 == 0), "the split layout: 64 keys, whole pages per warpgroup");
    static_assert(kDSOff % 1024 == 0, "SW128 tiles need 1 KB alignment");
    static_assert(kBarOff + static_cast<int>(sizeof(BwdBarriers)) + 1024 <= kSmemBytes, "layout exceeds the budget");
    static_assert(sizeof(BwdBarriers) <= 128 && 128 + 4 * kBwdTurnTableMax <= 1024, "the turn table follows the barriers");
};

// Key blocks of the longest sequence: the grid is kv heads x batch x these (launch_bwd_kernel).
template <class Tr>
__host__ __device__ constexpr int bwd_key_blocks(const BwdParams &p) {
    return static_cast<int>((static_cast<int64_t>(p.seqlen_k) + Tr::kBN - 1) / Tr::kBN);
}

// What every step of a CTA shares.
struct BwdBlock {
    int b, kvh, nb, n0, sq, sk, off;
    int64_t q_row0, k_row0;
    int mb_first, nmb;
    int rot = 0;  // kKeysRotated: the walk's first query block within [0, nmb)
    unsigned char *smem;
    BwdBarriers *bars;
};

// Step s of the key block's walk: query head and first row of its query block.
struct BwdStep {
    int hq, m0;
};
// A step's place in the walk: query head gi of the GQA group, query block m (before the rotation).
// The consumers' loops advance it one step at a time (walk_next) instead of dividing per step.
struct WalkPos {
    int gi, m;
};
__device__ __forceinline__ WalkPos walk_pos(const BwdBlock &a, int s) {
    const int gi = s / a.nmb;
    return WalkPos{gi, s - gi * a.nmb};
}
__device__ __forceinline__ void walk_next(const BwdBlock &a, WalkPos &w) {
    if (++w.m == a.nmb) {
        w.m = 0;
        ++w.gi;
    }
}
__device__ __forceinline__ BwdStep walk_step(const BwdParams &p, const BwdBlock &a, WalkPos w) {
    int m = w.m + a.rot;
    if (m >= a.nmb) m -= a.nmb;
    return BwdStep{a.kvh * p.group + w.gi, (a.mb_first + m) * kBwdBM};
}
__device__ __forceinline__ BwdStep bwd_step(const BwdParams &p, const BwdBlock &a, int s) {
    return walk_step(p, a, walk_pos(a, s));
}

// Ring position of step s: buffer and the parity of its barriers' phase.
template <class Tr>
__device__ __forceinline__ int ring_buf(int s) { return s % Tr::kStages; }
template <class Tr>
__device__ __forceinline__ uint32_t ring_phase(int s) { return static_cast<uint32_t>((s / Tr::kStages) & 1); }

// TMA of Q and dO of step `st` into buffer `buf` (thread 0 only).
template <class Tr>
__device__ __forceinline__ void load_q_do(const BwdParams &p, const CUtensorMap *tm_q, const CUtensorMap *tm_do,
                                          const BwdBlock &a, BwdStep st, int buf) {
    const bool varlen = p.cu_q != nullptr;
    unsigned char *s_q = a.smem + Tr::kQOff + buf * 2 * Tr::kQBytes;
    {
        uint64_t *bar = &a.bars->qdo_full[buf];
        const int32_t row = static_cast<int32_t>(varlen ? a.q_row0 + st.m0 : st.m0);
        const int32_t bc = varlen ? 0 : a.b;
        cuda::mbar_arrive_expect_tx(bar, 2 * Tr::kQBytes);  // out-of-bounds boxes are zero-filled and count
#pragma unroll
        for (int pg = 0; pg < Tr::kPages; ++pg) {
            cuda::tma_load_4d(s_q + pg * Tr::kQPage, tm_q, bar, 64 * pg, row, st.hq, bc);
            cuda::tma_load_4d(s_q + Tr::kQBytes + pg * Tr::kQPage, tm_do, bar, 64 * pg, row, st.hq, bc);
        }
    }
}

// cp.async of the LSE and row_dot of step `st` into warpgroup wg's copy in buffer `buf` (rows
// past the sequence: zeros); one word per thread of the warpgroup. The caller commits the group.
template <class Tr>
__device__ __forceinline__ void load_rows(const BwdParams &p, const BwdBlock &a, BwdStep st, int buf, int wg) {
    static_assert(2 * kBwdBM == 128, "one word per thread of a warpgroup");
    const int wtid = threadIdx.x & 127;
    const int r = wtid < kBwdBM ? wtid : wtid - kBwdBM;
    const int qpos = st.m0 + r;
    const bool ok = qpos < a.sq;
    const int q = ok ? qpos : 0;
    const float *src = wtid < kBwdBM ? p.lse + cuda::lse_offset(p, a.b, st.hq, a.q_row0, q)
                                     : p.row_dot + static_cast<int64_t>(st.hq) * p.total_rows + a.q_row0 + q;
    cuda::cp_async_4(cuda::smem_addr(a.smem + Tr::kRowsOff + (buf * 2 + wg) * Tr::kRowsBytes) + wtid * 4, src,
                     ok ? 4u : 0u);
}

// S^T and dP^T of warpgroup `wg`'s 64 keys against the step's queries (issued and committed; the
// caller waits, so that the deterministic mode's release of the previous step runs under them).
template <class Tr, class E>
__device__ __forceinline__ void scores_and_dp_issue(float (&S)[Tr::kQN / 2], float (&dP)[Tr::kQN / 2], uint32_t s_k,
                                              uint32_t s_v, uint32_t s_q, uint32_t s_do) {
    const uint64_t dk = cuda::make_desc_sw128(s_k), dv = cuda::make_desc_sw128(s_v);
    const uint64_t dq = cuda::make_desc_sw128(s_q), ddo = cuda::make_desc_sw128(s_do);
    cuda::fence_operands(S);
    cuda::fence_operands(dP);
    cuda::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tr::kD / 16; ++ks)
        cuda::wgmma_ss<E, Tr::kQN>(S, dk + k_step(ks, Tr::kKPage), dq + k_step(ks, Tr::kQPage), ks > 0);
#pragma unroll
    for (int ks = 0; ks < Tr::kD / 16; ++ks)
        cuda::wgmma_ss<E, Tr::kQN>(dP, dv + k_step(ks, Tr::kKPage), ddo + k_step(ks, Tr::kQPage), ks > 0);
    cuda::wgmma_commit();
}

// The step's LSE and row_dot of the thread's query columns c0 + 8j + 2t + e (c0: the warpgroup's
// first column in the split layout; `base` = the rows' copy + (c0 + 2t) * 4), a pair of each per
// n8 tile j, at immediate offsets from one base.
template <int kOff>
__device__ __forceinline__ float2 ld_shared_v2_f32_at(uint32_t base) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2+%3];\n" : "=f"(v.x), "=f"(v.y) : "r"(base), "n"(kOff) : "memory");
    return v;
}
template <int j>
__device__ __forceinline__ float2 col_lse(uint32_t base) { return ld_shared_v2_f32_at<32 * j>(base); }
template <int j>
__device__ __forceinline__ float2 col_row_dot(uint32_t base) { return ld_shared_v2_f32_at<4 * kBwdBM + 32 * j>(base); }

// Whether no LSE among the thread's query columns is -inf (-inf, and only -inf, marks a row that
// saw no key in the forward; it takes no part).
// (Every load issued, then one AND: a short-circuit chain made the loads wait on each other.)
template <class Tr, int j = 0>
__device__ __forceinline__ bool cols_live(uint32_t base) {
    if constexpr (j < Tr::kNT) {
        const float2 l = col_lse<j>(base);
        const bool rest = cols_live<Tr, j + 1>(base);
        return (l.x != -INFINITY) & (l.y != -INFINITY) & rest;
    } else {
        return true;
    }
}

// Whether every (query, key) pair of the step against keys [klo, klo + keys) is in range and
// visible (mask.cuh's rule for the step's last row's first key and its first row's last key): then
// no pair needs the element mask, only rows whose LSE is -inf stay out.
__device__ __forceinline__ bool step_keys_unmasked(const BwdParams &p, const BwdBlock &a, BwdStep st, int64_t klo,
                                                   int keys) {
    const int64_t qhi = st.m0 + kBwdBM - 1, khi = klo + keys - 1;
    return qhi < a.sq && khi < a.sk && qhi + a.off - p.left <= klo && st.m0 + a.off + p.right >= khi;
}
// step_keys_unmasked for warpgroup wg's keys. Warpgroup-uniform.
template <class Tr>
__device__ __forceinline__ bool step_unmasked(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg) {
    return step_keys_unmasked(p, a, st, a.n0 + Tr::kKeyW * wg, Tr::kSplit ? Tr::kBN : 64);
}

// ALiBi's bias of the thread's two keys (the masked forms with kAlibi only): key h's bias at query
// column c (relative to m0) is -slope |c + m0 + off - key_h| in score units, computed as
// neg_sign |slope c + base[h]| (cuda::alibi_scores_half's form: an FFMA with c an immediate,
// the absolute value and an FFMA per score).
struct BwdAlibi {
    float slope = 0.f, neg_sign = 0.f, base[2] = {0.f, 0.f};
};

// probs_and_grads_form's n8 tile j of S^T and dP^T (and, recursively, the ones after it), with
// the tile's LSE / row_dot pair loaded where it is used.
template <class Tr, bool kUnmasked, bool kCap, bool kAlibi, int j = 0>
__device__ __forceinline__ void probs_and_grads_tiles(const BwdParams &p, uint32_t base, int c0, const int (&lo)[2],
                                                      const int (&hi)[2], const BwdAlibi &al, float (&S)[Tr::kQN / 2],
                                                      float (&dP)[Tr::kQN / 2]) {
    if constexpr (j < Tr::kNT) {
        const float sl2 = p.score_log2, cap = p.softcap_scale;
        const float2 l = col_lse<j>(base), d = col_row_dot<j>(base);
        const float lse[2] = {l.x, l.y}, rd[2] = {d.x, d.y};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int c = c0 + 8 * j + e;  // the query column (relative to m0)
            const bool row_sees = kUnmasked || lse[e] != -INFINITY;
            const float lse2 = lse[e] * 1.4426950408889634f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 4 * j + 2 * h + e;
                const bool vis = kUnmasked || (row_sees && c >= lo[h] && c <= hi[h]);
                float x = S[i];
                if constexpr (kCap) x = cuda::tanh_accurate(x * cap);
                // The bias joins the (capped) score; the cap's derivative below stays tanh's.
                const float xb = kAlibi ? fmaf(al.neg_sign, fabsf(fmaf(al.slope, static_cast<float>(8 * j + e), al.base[h])), x)
                                        : x;
                const float pr = vis ? cuda::fast_exp2(fmaf(xb, sl2, -lse2)) : 0.f;
                float ds = vis ? pr * (dP[i] - rd[e]) : 0.f;
                if constexpr (kCap) ds *= 1.f - x * x;  // d(cap * tanh(raw * scale / cap)) / d(raw * scale)
                S[i] = pr;
                dP[i] = ds;
            }
        }
        probs_and_grads_tiles<Tr, kUnmasked, kCap, kAlibi, j + 1>(p, base, c0, lo, hi, al, S, dP);
    }
}

// In place: S^T -> P^T and dP^T -> dS^T. Accumulator register i of the thread holds key row
// 16 warp + g + 8 ((i % 4) / 2) of the warpgroup's keys and query column 8 (i / 4) + 2 t + (i % 2)
// of its queries (split layout: the step's queries kQN wg ..). kUnmasked: every pair takes part
// (step_unmasked and no -inf LSE among the warp's columns); else each pair is tested against its
// key's visible query range. kCap: the soft cap's tanh and its derivative. One form per call site,
// so the loop is straight-line code (per-element runtime tests took a third of the step's
// instructions before stop 29: a branch per element, the constants reloaded per element).
// kAlibi (masked forms only: ALiBi steps always take them): the bias of BwdAlibi.
template <class Tr, bool kUnmasked, bool kCap, bool kAlibi = false>
__device__ __forceinline__ void probs_and_grads_form(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                     uint32_t base, float (&S)[Tr::kQN / 2], float (&dP)[Tr::kQN / 2]) {
    static_assert(!(kAlibi && kUnmasked), "ALiBi runs the masked forms");
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    const int c0 = (Tr::kSplit ? Tr::kQN * wg : 0) + 2 * t;
    int lo[2] = {0, 0}, hi[2] = {0, 0};  // the queries (relative to m0) that see each of the thread's two keys
    BwdAlibi al;
    if constexpr (kAlibi) {
        al.slope = p.alibi_slopes[st.hq] * p.alibi_to_score;
        al.neg_sign = al.slope >= 0.f ? -1.f : 1.f;
    }
    if constexpr (!kUnmasked) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = a.n0 + Tr::kKeyW * wg + 16 * warp + g + 8 * h;
            // key j is visible to query i iff j - off - right <= i <= j - off + left (mask.cuh's rule);
            // a sink key (j < sink_tokens) escapes the left window: to the last row
            lo[h] = max(key - a.off - p.right_i, 0) - st.m0;
            const int last = key < p.sink_tokens ? a.sq - 1 : min(key - a.off + p.left_i, a.sq - 1);
            hi[h] = key < a.sk ? last - st.m0 : -1;
            if constexpr (kAlibi) al.base[h] = al.slope * static_cast<float>(c0 + st.m0 + a.off - key);
        }
    }
    probs_and_grads_tiles<Tr, kUnmasked, kCap, kAlibi>(p, base, c0, lo, hi, al, S, dP);
}

// The thread's base address in the step's rows (col_lse / col_row_dot offsets start there).
template <class Tr>
__device__ __forceinline__ uint32_t cols_base(uint32_t s_rows, int wg) {
    return s_rows + ((Tr::kSplit ? Tr::kQN * wg : 0) + 2 * (threadIdx.x & 3)) * 4;
}

// Whether the warp takes probs_and_grads' unmasked form (step_unmasked and no -inf LSE among the
// warp's columns). Evaluated while the S / dP wgmmas run: its loads wait under them.
template <class Tr>
__device__ __forceinline__ bool warp_unmasked(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg, uint32_t s_rows) {
    return step_unmasked<Tr>(p, a, st, wg) && __all_sync(0xffffffffu, cols_live<Tr>(cols_base<Tr>(s_rows, wg)));
}

template <class Tr>
__device__ __forceinline__ void probs_and_grads(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                uint32_t s_rows, bool unmasked, float (&S)[Tr::kQN / 2],
                                                float (&dP)[Tr::kQN / 2]) {
    const uint32_t base = cols_base<Tr>(s_rows, wg);
    if (p.alibi_slopes != nullptr) {  // the masked forms with the bias: every pair's bias differs
        if (p.softcap_scale != 0.f)
            probs_and_grads_form<Tr, false, true, true>(p, a, st, wg, base, S, dP);
        else
            probs_and_grads_form<Tr, false, false, true>(p, a, st, wg, base, S, dP);
    } else if (p.softcap_scale != 0.f) {
        if (unmasked)
            probs_and_grads_form<Tr, true, true>(p, a, st, wg, base, S, dP);
        else
            probs_and_grads_form<Tr, false, true>(p, a, st, wg, base, S, dP);
    } else {
        if (unmasked)
            probs_and_grads_form<Tr, true, false>(p, a, st, wg, base, S, dP);
        else
            probs_and_grads_form<Tr, false, false>(p, a, st, wg, base, S, dP);
    }
}

// The accumulator as the A fragments of m64k16 wgmmas: fragment kk is n8 tiles 2kk, 2kk + 1.
template <class Tr, class E>
__device__ __forceinline__ void to_fragments(const float (&x)[Tr::kQN / 2], uint32_t (&f)[Tr::kKF][4]) {
#pragma unroll
    for (int kk = 0; kk < Tr::kKF; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) f[kk][r] = cuda::pack2<E>(x[8 * kk + 2 * r], x[8 * kk + 2 * r + 1]);
}

// Where fragment register f[kk][2 x + h] of the thread lives in a [64 keys][64 queries] SW128
// page of 16-bit values: key row 16 warp + g + 8 h, query columns 16 kk + 8 x + 2 t, + 1 (in
// 16-byte chunks: chunk 2 kk + x; chunk0: the first chunk of the fragments' queries).
__device__ __forceinline__ uint32_t frag_addr(uint32_t s_page, int chunk0, int kk, int r) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    const int row = 16 * warp + g + 8 * (r & 1), j = chunk0 + 2 * kk + (r >> 1);
    return s_page + row * 128 + ((j ^ (row & 7)) << 4) + 4 * t;
}

// Fragments (the warpgroup's kQN queries) into a [64 keys][64 queries] page from query column
// 8 chunk0 on: dS^T for the dQ GEMM, and in the split layout both halves of P^T and dS^T.
template <class Tr>
__device__ __forceinline__ void store_frags(uint32_t s_page, int chunk0, const uint32_t (&f)[Tr::kKF][4]) {
#pragma unroll
    for (int kk = 0; kk < Tr::kKF; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) cuda::st_shared_b32(frag_addr(s_page, chunk0, kk, r), f[kk][r]);
}

// ... and a whole page back as the A fragments of the step's 64 queries (split layout).
template <class Tr>
__device__ __forceinline__ void load_frags(uint32_t s_page, uint32_t (&f)[Tr::kKFAll][4]) {
#pragma unroll
    for (int kk = 0; kk < Tr::kKFAll; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) f[kk][r] = cuda::ld_shared_b32(frag_addr(s_page, 0, kk, r));
}

// Issues dV += P^T dO and dK += dS^T Q (not waited for): the 16-bit fragments from registers
// (kF of them: the warpgroup's own, or in the split layout the whole step's read back), dO and Q
// MN-major (16 query rows per k16 step, LBO = one 64-column page) from the warpgroup's first
// column page.
template <class Tr, class E, int kF>
__device__ __forceinline__ void issue_dkv(float (&dK)[Tr::kDW / 2], float (&dV)[Tr::kDW / 2],
                                          const uint32_t (&Pf)[kF][4], const uint32_t (&dSf)[kF][4],
                                          uint32_t s_q, uint32_t s_do) {
    const uint64_t dq = cuda::make_desc_sw128(s_q, 1024, Tr::kQPage);
    const uint64_t ddo = cuda::make_desc_sw128(s_do, 1024, Tr::kQPage);
    cuda::fence_operands(dK);
    cuda::fence_operands(dV);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kF; ++kk)
        cuda::wgmma_rs<E, Tr::kDW>(dV, Pf[kk], ddo + static_cast<uint64_t>((kk * 16 * 128) >> 4), 1);
#pragma unroll
    for (int kk = 0; kk < kF; ++kk)
        cuda::wgmma_rs<E, Tr::kDW>(dK, dSf[kk], dq + static_cast<uint64_t>((kk * 16 * 128) >> 4), 1);
    cuda::wgmma_commit();
}

// Deterministic mode: the counter of the step's (query head, query block) and the number of
// key blocks that add to its dQ before this one, in a fixed order either way:
// - heads fastest (the grid order): ascending key blocks. The key blocks that see a query block
//   are contiguous from the one holding key m0 + off - left (mask.cuh's rule for its first row).
// - keys fastest, rotated or not (finalize's det_grid_order): the order in which the key blocks'
//   walks reach the query block (fa3_bwd_turns.h bwd_turn: by step within the head, then by key
//   block). The key blocks of one pair run at the same time and tend to reach different query
//   blocks at each step, so that few turns wait: rotated walks without a mask; under a causal or
//   window mask the plain walks already start at different query blocks (a key block's first is
//   its diagonal), and the order by step is descending key blocks, each a step or two behind the
//   one above it. Where finalize sets p.wave_ctas (rotated walks whose pairs leave a wave's last
//   SMs to the next pair), the key blocks a wave dispatches take their turns before those of the
//   pair's blocks a later wave dispatches (bwd_wave_split). The CTA counts its predecessors for
//   each query block of its walk once (build_turn_table) into the turn table (Traits::kTurnOff).
// - keys descending (a mask without sink tokens): descending key blocks, counted directly
//   (host/bwd_args.h turn_last_block); the grid dispatches each pair's key blocks from the last,
//   so a turn's predecessors are earlier CTAs at any pair size, and walks from later diagonals
//   reach each query block in that order (FA2's deterministic mode, stop 49).
// Each adds in one turn, taken by bwd_det_kernel's writer warp for both consumer warpgroups (the
// split layout: by bwd_kernel's thread 0).
struct BwdTurn {
    int *sem;
    int before;
};
__device__ __forceinline__ int *turn_sem(const BwdParams &p, const BwdBlock &a, BwdStep st) {
    return p.dq_sem + (static_cast<int64_t>(a.b) * p.heads_q + st.hq) * p.sem_blocks + st.m0 / kBwdBM;
}
// kDescending: the caller may run the keys-descending order (finalize gives it only to the kernels
// without a writer warp: computed at the writer's 24 registers it spilled 60 bytes).
template <class Tr, bool kDescending = true>
__device__ __forceinline__ BwdTurn turn_of(const BwdParams &p, const BwdBlock &a, BwdStep st) {
    int *sem = turn_sem(p, a, st);
    if (kDescending && p.grid_order == kKeysDescending)
        return BwdTurn{sem, turn_last_block(min(st.m0 + kBwdBM, a.sq) - 1, a.off, p.right_i, a.sk, Tr::kBN) - a.nb};
    if (p.grid_order != kHeadsFastest)
        return BwdTurn{sem, static_cast<int>(cuda::ld_shared_b32(cuda::smem_addr(a.smem) + Tr::kTurnOff +
                                                                  4 * (st.m0 / kBwdBM - a.mb_first)))};
    const int64_t first_key = st.m0 + a.off - p.left;
    const int nb_first = first_key > 0 ? static_cast<int>(first_key / Tr::kBN) : 0;
    const int nsb = (p.sink_tokens + Tr::kBN - 1) / Tr::kBN;  // sink blocks (0 without sink tokens)
    return BwdTurn{sem, ascending_turn(a.nb, nb_first, nsb)};
}
// One thread spins until the key block's turn at step st's query block has come (acquire: the
// predecessors' adds are visible to it), and returns the turn.
template <class Tr, bool kDescending = true>
__device__ __forceinline__ BwdTurn wait_turn(const BwdParams &p, const BwdBlock &a, BwdStep st) {
    const BwdTurn turn = turn_of<Tr, kDescending>(p, a, st);
    while (cuda::ld_acquire_gpu(turn.sem) != turn.before) {
    }
    return turn;
}

// acc = dS K_page for the step's 64 queries and one 64-column page of K (64 keys from s_kp: the
// warpgroup's, or the split layout's whole block): wgmma with dS^T and K both key-major in shared
// memory (MN-major operands), issued and committed as one group (dq_page_gemm also waits for it,
// and with it for every earlier group of the thread).
// The wgmmas alone, over kKeys keys (the 80-key layout's dQ takes K = 80: bwd_wide_kernel).
template <class Tr, class E, int kKeys>
__device__ __forceinline__ void dq_page_mmas(float (&acc)[32], uint32_t s_ds, uint32_t s_kp) {
    const uint64_t dds = cuda::make_desc_sw128(s_ds, 1024, Tr::kQPage);
    const uint64_t dk = cuda::make_desc_sw128(s_kp, 1024, Tr::kKPage);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma_ss_mn64<E>(acc, dds + static_cast<uint64_t>((kk * 16 * 128) >> 4),
                         dk + static_cast<uint64_t>((kk * 16 * 128) >> 4), kk > 0);
}
template <class Tr, class E>
__device__ __forceinline__ void dq_page_issue(float (&acc)[32], uint32_t s_ds, uint32_t s_kp) {
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
    dq_page_mmas<Tr, E, 64>(acc, s_ds, s_kp);
    cuda::wgmma_commit();
}
template <class Tr, class E>
__device__ __forceinline__ void dq_page_gemm(float (&acc)[32], uint32_t s_ds, uint32_t s_kp) {
    dq_page_issue<Tr, E>(acc, s_ds, s_kp);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(acc);
}

// dQ = dS K_w for the step's 64 queries (this warpgroup's 64 keys), 64 head-dim columns at a time
// (dq_page_gemm), stored at s_dq in the accumulator's layout (also the deterministic kernel's
// writer slot, a page over both warpgroups' keys): fragment order (device/dq_accum.cuh,
// dq_frag_cols(head_dim) columns). Warp w's 16 rows are 16-row block w, and the wgmma fragment of
// an 8-column block j (thread 4g + t: rows g, g + 8, columns 2t, 2t + 1, registers 4j .. 4j + 3)
// is exactly that layout's m16n8 fragment, so each thread stores its four floats as one 16-byte
// vector and the warp's 32 vectors are 512 contiguous bytes: 4 wavefronts, no bank conflict.
// Row-major rows of 512 bytes put an instruction's 8 rows (lanes 0-15: rows 0-3, 32 bytes each) on
// the same 8 banks: 8 wavefronts per 256 bytes (stop 22's profile: 7.3-way); padded rows would
// break the one dense bulk reduction. At head dim 128, per warpgroup and step: 64 STS.128 / 256
// wavefronts where the row-major form took 128 STS.64 / 1024. Blocks past head_dim inside
// dq_frag_cols are stored too (zeros: K's columns there load as zeros): the reduction reads no
// unwritten bytes.
__device__ __forceinline__ void store_dq_frag_page(const float (&acc)[32], int half, uint32_t s_dq, int dcols) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31;
    // this thread's 8-column block 0 in fragment order
    const uint32_t at = s_dq + static_cast<uint32_t>((16 * warp * dcols + 4 * lane) * 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int block = half * 8 + j;  // 8-column block; head_dim is a multiple of 8 and dcols of 16
        if (8 * block >= dcols) continue;
        st_shared_v4_f32(at + block * 512, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    }
}
// The deterministic kernel: dQ page pg (64 head-dim columns) of the step's 64 queries over all
// kBwdBN keys, acc = dS K[:, page] (not waited for): both warpgroups' dS^T pages are contiguous in
// shared memory, [128 keys][64 queries] (kDSBytes = 64 key rows of 128 bytes each), as are the K
// page's 128 key rows, so the K = 128 GEMM is eight k16 steps down both.
template <class Tr, class E>
__device__ __forceinline__ void dq_full_page_issue(float (&acc)[32], uint32_t s_ds0, uint32_t s_kp) {
    static_assert(!Tr::kSplit && Tr::kBN == 128, "both warpgroups' keys in one page");
    const uint64_t dds = cuda::make_desc_sw128(s_ds0, 1024, Tr::kQPage);
    const uint64_t dk = cuda::make_desc_sw128(s_kp, 1024, Tr::kKPage);
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tr::kBN / 16; ++kk)
        wgmma_ss_mn64<E>(acc, dds + static_cast<uint64_t>((kk * 16 * 128) >> 4),
                         dk + static_cast<uint64_t>((kk * 16 * 128) >> 4), kk > 0);
    cuda::wgmma_commit();
}
// Where step st's dQ rows start in the fp32 accumulator in fragment order (the bulk tiles of both
// kernels, the split layout's vector reductions) and how many bytes of them the bulk reduction
// adds: the query block's rows are contiguous there, whole 16-row blocks, the last one's padding
// rows (past the sequence, never converted) included.
__device__ __forceinline__ float *dq_frag_rows(const BwdParams &p, const BwdBlock &a, BwdStep st) {
    return p.dq_accum +
           (static_cast<int64_t>(st.hq) * p.dq_rows + cuda::dq_frag_row0(a.q_row0, a.b) + st.m0) *
               cuda::dq_frag_cols(p.head_dim);
}
__device__ __forceinline__ uint32_t dq_frag_bytes(const BwdParams &p, const BwdBlock &a, BwdStep st) {
    const int rows = min(kBwdBM, (a.sq - st.m0 + 15) & ~15);
    return static_cast<uint32_t>(rows * cuda::dq_frag_cols(p.head_dim) * 4);
}

// The warpgroup's dQ tile, once in shared memory, added by one bulk reduction (thread 0 of the
// warpgroup).
template <class Tr>
__device__ __forceinline__ void reduce_dq_tile(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg, uint32_t s_dq) {
    fence_proxy_async_smem();  // the tile, before the bulk reduction reads it
    warpgroup_sync(wg);
    if ((threadIdx.x & 127) == 0) {
        bulk_reduce_add_f32(dq_frag_rows(p, a, st), s_dq, dq_frag_bytes(p, a, st));
        cuda::bulk_commit();
    }
}

// The default mode's dQ with dV and dK (the layouts with an fp32 tile, bwd_bulk_dq): page 0's
// GEMM issued before dV += P^T dO and dK += dS^T Q, so that its stores run while they do; then
// the other pages, and the bulk reduction (the caller made sure that the previous step's
// reduction has finished reading the tile: the step-top barrier).
template <class Tr, class E>
__device__ __forceinline__ void dkv_and_dq_bulk(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                float (&dK)[Tr::kDW / 2], float (&dV)[Tr::kDW / 2],
                                                const uint32_t (&Pf)[Tr::kKF][4], const uint32_t (&dSf)[Tr::kKF][4],
                                                uint32_t s_q, uint32_t s_do, uint32_t s_ds, uint32_t s_k,
                                                uint32_t s_dq) {
    const int dcols = cuda::dq_frag_cols(p.head_dim);
    {
        float acc[32];
        dq_page_issue<Tr, E>(acc, s_ds, s_k);
        issue_dkv<Tr, E, Tr::kKF>(dK, dV, Pf, dSf, s_q, s_do);
        cuda::wgmma_wait<1>();  // page 0 (dV, dK may still run)
        cuda::fence_operands(acc);
        store_dq_frag_page(acc, 0, s_dq, dcols);
    }
#pragma unroll
    for (int half = 1; half < Tr::kPages; ++half) {
        float acc[32];
        dq_page_gemm<Tr, E>(acc, s_ds, s_k + half * Tr::kKPage);
        store_dq_frag_page(acc, half, s_dq, dcols);
    }
    cuda::wgmma_wait<0>();  // dV, dK (one page: not waited for yet)
    reduce_dq_tile<Tr>(p, a, st, wg, s_dq);
}

// Whether the warp's 16-row band of step st's dQ starts inside the sequence (else it is skipped).
__device__ __forceinline__ bool dq_band_live(const BwdBlock &a, BwdStep st) {
    return st.m0 + 16 * ((threadIdx.x & 127) >> 5) < a.sq;
}
// The lane's four floats of the first 8-column block at column col0 of the warp's 16-row band of
// step st's dQ rows in the fp32 accumulator (fragment order).
__device__ __forceinline__ float *dq_lane_band(const BwdParams &p, const BwdBlock &a, BwdStep st, int col0) {
    const int wtid = threadIdx.x & 127;
    return dq_frag_rows(p, a, st) + static_cast<int64_t>(16 * (wtid >> 5)) * cuda::dq_frag_cols(p.head_dim) +
           col0 * 16 + 4 * (wtid & 31);
}
// One 64-column page pg of a warpgroup's dQ (acc, wgmma fragment) added to the band: one vector
// reduction per 8-column block inside the accumulator's dcols columns.
__device__ __forceinline__ void red_dq_page(float *band, int col0, int dcols, int pg, const float (&acc)[32]) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int block = 8 * pg + j;  // the warpgroup's 8-column block
        if (col0 + 8 * block >= dcols) continue;
        cuda::red_add_f32x4(band + 128 * block, acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    }
}

// dQ += dS K_w from registers: vector reductions into the fp32 accumulator, one 64-column page
// of the warpgroup's columns at a time (dq_page_gemm). The split layout in both modes (no room for
// an fp32 tile; head dim 64's default mode used it until stop 29). The accumulator is in fragment
// order (device/dq_accum.cuh): the wgmma fragment of an 8-column block is the
// layout's m16n8 fragment, so a lane's four floats are one red.v4 and a warp's instruction adds
// 512 contiguous bytes (four whole lines); row-major red.v2 took eight 32-byte pieces of eight
// rows, four times the L2 requests, and kept L2 84 % busy (stop 37's ncu, d 256, 4k). A warp's
// 16-row band is added whole when it starts inside the sequence (its padding rows belong to no
// other sequence and are never converted), skipped otherwise; 8-column blocks past
// dq_frag_cols(head_dim) are skipped (those inside it add zeros: K's padded columns are zeros).
// kDet: the CTA's adds take the key block's turn (turn_of): page 0's GEMM is issued first and runs
// (with dV and dK's) while thread 0 polls for the turn; the CTA meets, every thread adds. Returns
// the turn's counter (kDet, else nullptr), which thread 0 moves on only after the CTA's next
// barrier (release_turn): the barrier orders every thread's adds before thread 0's release at GPU
// scope, so no thread waits on a fence for its own adds (until stop 31 each did, then a CTA
// barrier, then the add: an L2 round trip and a barrier inside every step).
template <class Tr, class E, bool kDet>
__device__ __forceinline__ int *accumulate_dq_red(const BwdParams &p, const BwdBlock &a, BwdStep st, int wg,
                                                  uint32_t s_ds, uint32_t s_k) {
    static_assert(Tr::kSplit, "the other layouts have an fp32 dQ tile (bwd_bulk_dq)");
    const int col0 = wg * Tr::kDW;
    const bool band_ok = dq_band_live(a, st);
    float *band = dq_lane_band(p, a, st, col0);
    float acc[32];
    dq_page_issue<Tr, E>(acc, s_ds, s_k + (col0 / 64) * Tr::kKPage);
    BwdTurn turn{nullptr, 0};
    if constexpr (kDet) {
        if (threadIdx.x == 0) turn = wait_turn<Tr>(p, a, st);
        __syncthreads();
    }
    cuda::wgmma_wait<0>();
    cuda::fence_operands(acc);
#pragma unroll
    for (int pg = 0; pg < Tr::kWPages; ++pg) {
        if (pg > 0) dq_page_gemm<Tr, E>(acc, s_ds, s_k + (col0 / 64 + pg) * Tr::kKPage);
        if (band_ok) red_dq_page(band, col0, cuda::dq_frag_cols(p.head_dim), pg, acc);
    }
    return turn.sem;
}

// Thread 0 moves a turn's counter on (accumulate_dq_red's), after a CTA barrier that followed
// every thread's adds: a release at GPU scope, cumulative over the adds the barrier ordered
// before it (as CUTLASS's split-K semaphore releases after __syncthreads).
__device__ __forceinline__ void release_turn(int *sem) {
    if (threadIdx.x == 0 && sem != nullptr) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
}

// The deterministic kernel's dV, dK and dQ of step s, after the consumers' barrier (both dS^T
// pages stored): warpgroup wg computes the step's dQ pages pg with (pg + s) & 1 == wg over all 128
// keys (dq_full_page_issue: one page each at head dim 128, at 64 the one page every other step),
// issued ahead of dV / dK and waited for alone; it waits for the writer to have read the slot's
// previous tile (dq_empty, two steps back), stores, fences its stores for the async proxy (the
// writer's bulk reduction reads them) and arrives on dq_full, whose completion also tells the
// other warpgroup that its dS^T page has been read (dS_page_free).
template <class Tr, class E>
__device__ __forceinline__ void det_dkv_and_dq(const BwdParams &p, const BwdBlock &a, int s, int wg,
                                               float (&dK)[Tr::kDW / 2], float (&dV)[Tr::kDW / 2],
                                               const uint32_t (&Pf)[Tr::kKF][4], const uint32_t (&dSf)[Tr::kKF][4],
                                               uint32_t s_q, uint32_t s_do, uint32_t s_ds0, uint32_t s_k0) {
    const int slot = s & 1;
    const int pg = Tr::kPages == 1 ? 0 : wg ^ slot;
    const bool owns = Tr::kPages == 1 ? wg == slot : true;
    static_assert(Tr::kPages <= 2, "one page per warpgroup and step");
    if (owns) {
        float acc[32];
        dq_full_page_issue<Tr, E>(acc, s_ds0, s_k0 + pg * Tr::kKPage);
        issue_dkv<Tr, E, Tr::kKF>(dK, dV, Pf, dSf, s_q, s_do);
        cuda::wgmma_wait<1>();  // dQ (dV, dK may still run)
        cuda::fence_operands(acc);
        if (s >= 2) cuda::mbar_wait(&a.bars->dq_empty[slot], static_cast<uint32_t>(((s >> 1) & 1) ^ 1));
        store_dq_frag_page(acc, pg, cuda::smem_addr(a.smem) + Tr::kDQOff + slot * Tr::kDQBytes,
                           cuda::dq_frag_cols(p.head_dim));
        fence_proxy_async_smem();  // this thread's stores, before the writer's bulk reduction reads them
    } else {
        issue_dkv<Tr, E, Tr::kKF>(dK, dV, Pf, dSf, s_q, s_do);
    }
    cuda::mbar_arrive(&a.bars->dq_full[slot]);
    cuda::wgmma_wait<0>();
}

// Before the deterministic kernel's warpgroup overwrites its dS^T page at step s: the other
// warpgroup's dQ GEMM of step s - 1 read it; dq_full of step s - 1 completes after that GEMM.
template <class Tr>
__device__ __forceinline__ void ds_page_free(const BwdBlock &a, int s) {
    if (s > 0) cuda::mbar_wait(&a.bars->dq_full[(s - 1) & 1], static_cast<uint32_t>(((s - 1) >> 1) & 1));
}

// Step s (query block st, buffer buf) for consumer warpgroup wg. The modes differ only in where
// dQ goes: the default mode adds it to the fp32 accumulator itself (bulk or red), the
// deterministic kernel (kDet) hands it to the dQ writer warp through its shared-memory slot (the
// split layout: red in turns). The split layout meets the other warpgroup (a CTA barrier) once its
// half of P^T and dS^T is in shared memory, and reads both halves back for dV, dK and dQ.
// Returns the split layout's deterministic turn for bwd_kernel's thread 0 to release after the
// loop's next CTA barrier (nullptr otherwise).
template <class Tr, class E, bool kDet>
__device__ __forceinline__ int *step_compute(const BwdParams &p, const BwdBlock &a, int s, BwdStep st, int buf, int wg,
                                             float (&dK)[Tr::kDW / 2], float (&dV)[Tr::kDW / 2]) {
    const uint32_t base = cuda::smem_addr(a.smem);
    const uint32_t s_k = base + Tr::kKOff + Tr::kKeyW * wg * 128, s_v = base + Tr::kVOff + Tr::kKeyW * wg * 128;
    const uint32_t s_q = base + Tr::kQOff + buf * 2 * Tr::kQBytes, s_do = s_q + Tr::kQBytes;
    const uint32_t q_rows = Tr::kSplit ? Tr::kQN * wg * 128 : 0;  // the warpgroup's queries of S^T, dP^T
    const uint32_t s_ds = base + Tr::kDSOff + (Tr::kSplit ? 1 : wg) * Tr::kDSBytes;
    const uint32_t s_dq = base + Tr::kDQOff + wg * Tr::kDQBytes;
    const uint32_t s_rows = base + Tr::kRowsOff + (buf * 2 + wg) * Tr::kRowsBytes;

    float S[Tr::kQN / 2], dP[Tr::kQN / 2];
    scores_and_dp_issue<Tr, E>(S, dP, s_k, s_v, s_q + q_rows, s_do + q_rows);
    const bool unmasked = warp_unmasked<Tr>(p, a, st, wg, s_rows);
    cuda::wgmma_wait<0>();
    cuda::fence_operands(S);
    cuda::fence_operands(dP);
    probs_and_grads<Tr>(p, a, st, wg, s_rows, unmasked, S, dP);
    uint32_t Pf[Tr::kKF][4], dSf[Tr::kKF][4];
    to_fragments<Tr, E>(S, Pf);
    to_fragments<Tr, E>(dP, dSf);
    if constexpr (kDet && !Tr::kSplit) {
        ds_page_free<Tr>(a, s);
        store_frags<Tr>(s_ds, 0, dSf);
        fence_proxy_async_smem();                       // the generic-proxy stores, before the wgmma reads them
        cuda::named_barrier_sync(kBwdDetConsumerBar, 256);  // both warpgroups' dS^T pages
        det_dkv_and_dq<Tr, E>(p, a, s, wg, dK, dV, Pf, dSf, s_q, s_do, base + Tr::kDSOff, base + Tr::kKOff);
    } else if constexpr (Tr::kSplit) {
        const uint32_t s_p = base + Tr::kDSOff;  // P^T's page; dS^T's is the next
        store_frags<Tr>(s_p, Tr::kQN / 8 * wg, Pf);
        store_frags<Tr>(s_ds, Tr::kQN / 8 * wg, dSf);
        fence_proxy_async_smem();  // the generic-proxy stores, before the wgmma reads them
        __syncthreads();           // both halves
        uint32_t Pa[Tr::kKFAll][4], dSa[Tr::kKFAll][4];
        load_frags<Tr>(s_p, Pa);
        load_frags<Tr>(s_ds, dSa);
        const uint32_t cols = wg * Tr::kWPages * Tr::kQPage;  // the warpgroup's first column page
        issue_dkv<Tr, E, Tr::kKFAll>(dK, dV, Pa, dSa, s_q + cols, s_do + cols);
    } else {
        store_frags<Tr>(s_ds, 0, dSf);
        fence_proxy_async_smem();  // the generic-proxy stores, before the wgmma reads them
        warpgroup_sync(wg);
        static_assert(Tr::kBulkDQ, "the layouts without the split have an fp32 dQ tile");
        dkv_and_dq_bulk<Tr, E>(p, a, st, wg, dK, dV, Pf, dSf, s_q, s_do, s_ds, s_k, s_dq);
    }
    // (dQ went with dV and dK above: dkv_and_dq_bulk, det_dkv_and_dq)
    int *turn = nullptr;
    if constexpr (Tr::kSplit) turn = accumulate_dq_red<Tr, E, kDet>(p, a, st, wg, s_ds, base + Tr::kKOff);
    cuda::fence_operands(dK);
    cuda::fence_operands(dV);
    __syncwarp();  // every lane's wgmmas reading Q and dO have retired
    if ((threadIdx.x & 31) == 0) cuda::mbar_arrive(&a.bars->qdo_empty[buf]);
    return turn;
}

// Row 0 of the key block's sequence and key/value head in dK and in dV.
struct KvGradOrigins {
    uint16_t *dk, *dv;
};
__device__ __forceinline__ KvGradOrigins kv_grad_origins(const BwdParams &p, const BwdBlock &a) {
    const bool varlen = p.cu_q != nullptr;
    return {static_cast<uint16_t *>(p.dk) + (varlen ? a.k_row0 * p.dk_rs : a.b * p.dk_bs) + a.kvh * p.dk_hs,
            static_cast<uint16_t *>(p.dv) + (varlen ? a.k_row0 * p.dv_rs : a.b * p.dv_bs) + a.kvh * p.dv_hs};
}

// dK * scale and dV of the thread's two keys (16-bit pairs), zeros where no query saw the key.
template <class Tr, class E>
__device__ __forceinline__ void store_dk_dv(const BwdParams &p, const BwdBlock &a, int wg, const float (&dK)[Tr::kDW / 2],
                                            const float (&dV)[Tr::kDW / 2]) {
    const int wtid = threadIdx.x & 127, warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    const KvGradOrigins o = kv_grad_origins(p, a);
    uint16_t *dkg = o.dk, *dvg = o.dv;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = a.n0 + Tr::kKeyW * wg + 16 * warp + g + 8 * h;
        if (key >= a.sk) continue;
        const int col0 = Tr::kSplit ? wg * Tr::kDW : 0;  // the warpgroup's columns
        uint16_t *kr = dkg + key * p.dk_rs + col0 + 2 * t;
        uint16_t *vr = dvg + key * p.dv_rs + col0 + 2 * t;
#pragma unroll
        for (int j = 0; j < Tr::kDW / 8; ++j) {
            const int c = 8 * j;
            if (col0 + c < p.head_dim)
                *reinterpret_cast<uint32_t *>(kr + c) =
                    cuda::pack2<E>(dK[4 * j + 2 * h] * p.scale, dK[4 * j + 2 * h + 1] * p.scale);
            if (col0 + c < p.head_dim_v)
                *reinterpret_cast<uint32_t *>(vr + c) = cuda::pack2<E>(dV[4 * j + 2 * h], dV[4 * j + 2 * h + 1]);
        }
    }
}

// The CTA's key block with its sequence's lengths and diagonal, and the shared-memory base both
// kernels lay their tiles from. Grid order (p.grid_order): kv heads x batch fastest (the
// deterministic mode: a key block's predecessor in the dQ turn order is an earlier wave's CTA, as
// in the FA2 backward), or key blocks fastest (ascending, or descending from each pair's last).
// All enumerate the same blocks; a block past its sequence's keys (variable length: the grid
// covers the longest) exits at once.
template <class Tr>
__device__ __forceinline__ BwdBlock key_block(const BwdParams &p, unsigned char *smem_raw) {
    // SW128 tiles need 1024-byte alignment; the dynamic base is not guaranteed to have it.
    unsigned char *smem = reinterpret_cast<unsigned char *>(
        (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    const unsigned nkb = static_cast<unsigned>(bwd_key_blocks<Tr>(p));
    const unsigned nhb = static_cast<unsigned>(p.heads_kv * p.batch);
    const bool keys_fastest = p.grid_order != kHeadsFastest;
    const int hb = static_cast<int>(keys_fastest ? blockIdx.x / nkb : blockIdx.x % nhb);
    BwdBlock a;
    a.nb = static_cast<int>(keys_fastest ? blockIdx.x % nkb : blockIdx.x / nhb);
    if (p.grid_order == kKeysDescending) a.nb = static_cast<int>(nkb) - 1 - a.nb;
    a.kvh = hb % p.heads_kv;
    a.b = hb / p.heads_kv;
    const cuda::SeqInfo si = cuda::seq_info(p, a.b);
    a.sq = si.sq;
    a.sk = si.sk;
    a.off = cuda::diagonal_offset(p, si.sq, si.sk);
    a.q_row0 = si.q_row0;
    a.k_row0 = si.k_row0;
    a.n0 = a.nb * Tr::kBN;
    a.smem = smem;
    a.bars = reinterpret_cast<BwdBarriers *>(smem + Tr::kBarOff);
    return a;
}

// Key block nb's walk over the query blocks of its sequence that see one of its keys
// (fa3_bwd_turns.h bwd_walk: mask.cuh's rule; rotated in the keys-rotated grid order). The
// deterministic turn table recomputes it for every key block of the pair: one function for both.
// kDet: a kernel that can run the deterministic mode, the only one finalize gives kKeysStaggered
// (the default mode's kernel is then compiled without its test).
template <class Tr, bool kDet = true>
__device__ __forceinline__ BwdWalk key_walk(const BwdParams &p, const BwdBlock &a, int nb) {
    const int rotation = p.grid_order == kKeysRotated              ? kWalkRotated
                         : kDet && p.grid_order == kKeysStaggered ? kWalkStaggered
                                                                   : kWalkPlain;
    return bwd_walk(nb, Tr::kBN, kBwdBM, a.sq, a.sk, a.off, p.left, p.right, bwd_key_blocks<Tr>(p), rotation,
                    p.sink_tokens);
}
// The CTA's own walk into a (false: no query block sees its keys).
template <class Tr, bool kDet = true>
__device__ __forceinline__ bool set_walk(const BwdParams &p, BwdBlock &a) {
    const BwdWalk w = key_walk<Tr, kDet>(p, a, a.nb);
    a.mb_first = w.first;
    a.nmb = w.count;
    a.rot = w.rot;
    return w.count > 0;
}

// The deterministic mode's turn table (keys-fastest grids, rotated or not): for each query block of the CTA's walk,
// how many key blocks of its sequence add into it first (fa3_bwd_turns.h bwd_turn), computed once
// per CTA by `threads` threads (thread index tid; barrier id bar, or __syncthreads for 0) into
// Traits::kTurnOff, the key blocks' walks staged at scratch (3 ints each; a region no one uses
// before the first step). Finalize takes this order only where the walk has at most
// kBwdTurnTableMax query blocks and the pair at most one key block per SM.
template <class Tr>
__device__ __forceinline__ void build_turn_table(const BwdParams &p, const BwdBlock &a, int tid, int threads, int bar,
                                                 uint32_t scratch) {
    const int seq_blocks = (a.sk + Tr::kBN - 1) / Tr::kBN;
    for (int n = tid; n < seq_blocks; n += threads) {
        const BwdWalk w = key_walk<Tr>(p, a, n);
        cuda::st_shared_b32(scratch + 12 * n, static_cast<uint32_t>(w.first));
        cuda::st_shared_b32(scratch + 12 * n + 4, static_cast<uint32_t>(w.count));
        cuda::st_shared_b32(scratch + 12 * n + 8, static_cast<uint32_t>(w.rot));
    }
    if (bar == 0) __syncthreads(); else cuda::named_barrier_sync(bar, threads);
    const auto walks = [scratch](int n) {
        const uint32_t at = scratch + 12 * n;
        return BwdWalk{static_cast<int>(cuda::ld_shared_b32(at)), static_cast<int>(cuda::ld_shared_b32(at + 4)),
                       static_cast<int>(cuda::ld_shared_b32(at + 8))};
    };
    const uint32_t table = cuda::smem_addr(a.smem) + Tr::kTurnOff;
    // the pair's CTAs start at blockIdx.x - nb in the keys-fastest grid
    const int split = bwd_wave_split(static_cast<int64_t>(blockIdx.x) - a.nb, bwd_key_blocks<Tr>(p), p.wave_ctas);
    for (int j = tid; j < a.nmb; j += threads)
        cuda::st_shared_b32(table + 4 * j,
                            static_cast<uint32_t>(bwd_turn(walks, seq_blocks, a.nb, a.mb_first + j, split)));
    if (bar == 0) __syncthreads(); else cuda::named_barrier_sync(bar, threads);  // the table, and scratch free again
}

// One thread: the key block's K and V tiles, once per CTA, by TMA on kv_full.
template <class Tr>
__device__ __forceinline__ void load_k_v(const BwdParams &p, const CUtensorMap *tm_k, const CUtensorMap *tm_v,
                                         const BwdBlock &a) {
    const bool varlen = p.cu_q != nullptr;
    const int32_t krow = static_cast<int32_t>((varlen ? a.k_row0 : 0) + a.n0);
    const int32_t bc = varlen ? 0 : a.b;
    cuda::mbar_arrive_expect_tx(&a.bars->kv_full, 2 * Tr::kKBytes);
#pragma unroll
    for (int pg = 0; pg < Tr::kPages; ++pg) {
        cuda::tma_load_4d(a.smem + Tr::kKOff + pg * Tr::kKPage, tm_k, &a.bars->kv_full, 64 * pg, krow, a.kvh, bc);
        cuda::tma_load_4d(a.smem + Tr::kVOff + pg * Tr::kKPage, tm_v, &a.bars->kv_full, 64 * pg, krow, a.kvh, bc);
    }
}

// Thread 0 of a 256-thread kernel (bwd_kernel, bwd_wide_kernel) initialises kv_full and kBuffers
// Q / dO barrier pairs (full: the TMA thread's arrive; empty: every warp's release); then the CTA
// meets.
template <int kBuffers>
__device__ __forceinline__ void init_ring_barriers(const BwdBlock &a) {
    static_assert(kBuffers <= kBwdMaxStages, "BwdBarriers' slots");
    if (threadIdx.x == 0) {
        cuda::mbar_init(&a.bars->kv_full, 1);
#pragma unroll
        for (int s = 0; s < kBuffers; ++s) {
            cuda::mbar_init(&a.bars->qdo_full[s], 1);
            cuda::mbar_init(&a.bars->qdo_empty[s], kBwdThreads / 32);
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();
}

// The default mode's kernel: two warpgroups (256 threads), no producer warpgroup; thread 0 also
// issues the TMA loads. The deterministic mode runs bwd_det_kernel (below), except in the split
// layout, which runs this one with kDet (its dQ adds take turns: accumulate_dq_red).
template <class Tr, class E, bool kDet>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const __grid_constant__ BwdParams p) {
    extern __shared__ unsigned char smem_raw[];
    BwdBlock a = key_block<Tr>(p, smem_raw);
    if (a.n0 >= a.sk) return;  // the whole CTA: a key block past this sequence's end
    init_ring_barriers<Tr::kStages>(a);

    const int wg = cuda::warp_uniform(threadIdx.x / 128);  // so that its wgmma descriptors are uniform registers
    float dK[Tr::kDW / 2], dV[Tr::kDW / 2];
#pragma unroll
    for (int i = 0; i < Tr::kDW / 2; ++i) dK[i] = dV[i] = 0.f;

    if (set_walk<Tr, kDet>(p, a)) {
        // the split layout's deterministic mode: its turns, staged in the P^T / dS^T pages
        if (kDet && bwd_turn_table(p.grid_order))
            build_turn_table<Tr>(p, a, threadIdx.x, kBwdThreads, 0, cuda::smem_addr(a.smem) + Tr::kDSOff);
        const int nsteps = p.group * a.nmb;
        if (threadIdx.x == 0) load_k_v<Tr>(p, &tm_k, &tm_v, a);
        // Prologue: the first kStages - 1 steps (fresh buffers: no release to wait for).
#pragma unroll
        for (int r = 0; r < Tr::kStages - 1; ++r) {
            if (r < nsteps) {
                if (threadIdx.x == 0) load_q_do<Tr>(p, &tm_q, &tm_do, a, bwd_step(p, a, r), r);
                load_rows<Tr>(p, a, bwd_step(p, a, r), r, wg);
            }
            cuda::cp_async_commit();
        }
        cuda::mbar_wait(&a.bars->kv_full, 0);
        int *held = nullptr;  // the split layout's deterministic mode: the turn thread 0 has yet to release
        WalkPos ws{0, 0}, wr = walk_pos(a, Tr::kStages - 1);  // steps s and r
        for (int s = 0; s < nsteps; ++s, walk_next(a, ws), walk_next(a, wr)) {
            const BwdStep st = walk_step(p, a, ws);
            const int buf = ring_buf<Tr>(s);
            // Step r = s + kStages - 1 refills the buffer of step s - 1: the loader waits for both
            // warpgroups to release it; this warpgroup's own copy of the rows was last read before
            // the warpgroup barrier of its step s - 1.
            const int r = s + Tr::kStages - 1;
            if (r < nsteps) {
                const BwdStep sr = walk_step(p, a, wr);
                if (threadIdx.x == 0) {
                    if (s >= 1) cuda::mbar_wait(&a.bars->qdo_empty[ring_buf<Tr>(s - 1)], ring_phase<Tr>(s - 1));
                    load_q_do<Tr>(p, &tm_q, &tm_do, a, sr, ring_buf<Tr>(r));
                }
                load_rows<Tr>(p, a, sr, ring_buf<Tr>(r), wg);
            }
            cuda::cp_async_commit();
            cuda::cp_async_wait<Tr::kStages - 1>();  // this step's rows, from this thread ...
            if (Tr::kBulkDQ && (threadIdx.x & 127) == 0) cuda::bulk_wait_read_all();  // the previous dQ reduction read its tile
            // ... and from every thread of the warpgroup; the split layout: of the CTA, which
            // also keeps the P^T and dS^T pages until both warpgroups have read them
            if constexpr (Tr::kSplit)
                __syncthreads();
            else
                warpgroup_sync(wg);
            // The previous step's turn, released as early as the barrier above allows (stop 31: after
            // this step's S / dP issue instead, the next key block also waited out the Q / dO wait
            // below, 3-8 % slower at the masked keys-rotated cells).
            if constexpr (kDet && Tr::kSplit) release_turn(held);
            cuda::mbar_wait(&a.bars->qdo_full[buf], ring_phase<Tr>(s));
            held = step_compute<Tr, E, kDet>(p, a, s, st, buf, wg, dK, dV);
        }
        if (Tr::kBulkDQ && (threadIdx.x & 127) == 0) cuda::bulk_wait_all();  // the last reduction, before shared memory goes away
        if constexpr (kDet && Tr::kSplit) {
            __syncthreads();  // the last step's adds, before its turn moves on
            release_turn(held);
        }
    }
    store_dk_dv<Tr, E>(p, a, wg, dK, dV);
}

// ---- the deterministic mode's kernel: a producer warpgroup and its dQ writer ------------------

// Warp 0, one thread: K and V once, then Q and dO of every step into the ring, each buffer once
// every consumer warp has released its previous step (qdo_empty).
template <class Tr>
__device__ __forceinline__ void produce_q_do(const BwdParams &p, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                             const CUtensorMap *tm_v, const CUtensorMap *tm_do, const BwdBlock &a,
                                             int nsteps) {
    load_k_v<Tr>(p, tm_k, tm_v, a);
    for (int r = 0; r < nsteps; ++r) {
        const int buf = ring_buf<Tr>(r);
        if (r >= Tr::kStages) cuda::mbar_wait(&a.bars->qdo_empty[buf], ring_phase<Tr>(r - Tr::kStages));
        load_q_do<Tr>(p, tm_q, tm_do, a, bwd_step(p, a, r), buf);
    }
}

// The dQ writers, warps of the producer warpgroup (every lane runs it; lane 0 issues the bulk
// operations). kOrdered, the deterministic mode: warps 1 and 2, one per slot (`first`: the steps of
// that parity); else warp 1 alone, every step. Per step: waits for the step's slot (dq_full: both
// consumers' pages), in deterministic mode waits for the key block's turn, reduces the slot in one
// bulk reduction, gives the slot back once it has been read (dq_empty, every lane arrives) and, in
// deterministic mode, releases the turn once the adds have completed (fenced). The consumers never
// wait for L2: a turn, a poll or a reduction's latency sits here, in front of no wgmma.
// Why two writers in deterministic mode: a writer waits for a step's adds to complete before it
// releases the turn, so one writer put an L2 round trip per step in series with the consumers
// (det / default 0.63-0.89 at d 64 / 128 on an H100); with one per slot, one slot's adds complete
// while the other slot's turn is taken (1.11-1.39x, stop 43). Two reductions in flight add to
// different query blocks (a walk visits each once), and each query block's adds keep their order
// (the turns). The default mode waits only for the slot to be read, so one writer keeps up.
// kOrdered is a template flag: at the producer's 24 registers the runtime form spilled 60 bytes.
// History: until stop 30 each consumer warpgroup had a slot of its own and the writer reduced the
// two one after the other (two bulk reductions in flight have no defined order): two L2 round
// trips per step in the turn, about the consumers' step at head dim 128. Stop 20 measured a writer
// that summed slot 0 into slot 1 in shared memory (0.64-0.72x of the default mode), stop 43 the
// default mode adding dQ from registers by red.v4 instead of the slot (0.875-0.970x).
template <class Tr, bool kOrdered>
__device__ __forceinline__ void write_dq_det(const BwdParams &p, const BwdBlock &a, int nsteps, int first) {
    // The producer warpgroup runs at kBwdProducerRegs (24): little is held across the loop (32-bit
    // shared addresses; the step's global address computed where it is used).
    const int lane = threadIdx.x & 31;
    const uint32_t s_dq0 = cuda::smem_addr(a.smem) + Tr::kDQOff;
    const uint32_t full0 = cuda::smem_addr(&a.bars->dq_full[0]), empty0 = cuda::smem_addr(&a.bars->dq_empty[0]);
    static_assert(sizeof(BwdBarriers::dq_full) == 16 && sizeof(BwdBarriers::dq_empty) == 16,
                  "slot w's barriers at full0 + 8 w and empty0 + 8 w");
    constexpr int stride = kOrdered ? 2 : 1;
    for (int s = first; s < nsteps; s += stride) {
        const uint32_t slot = static_cast<uint32_t>(s & 1);
        cuda::mbar_wait_s(full0 + 8 * slot, static_cast<uint32_t>((s >> 1) & 1));
        if (lane == 0) {
            const BwdStep st = bwd_step(p, a, s);
            if (kOrdered) {
                wait_turn<Tr, false>(p, a, st);
                fence_proxy_async_global();  // the predecessors' adds, before this one
            }
            bulk_reduce_add_f32(dq_frag_rows(p, a, st), s_dq0 + slot * Tr::kDQBytes, dq_frag_bytes(p, a, st));
            cuda::bulk_commit();
            cuda::bulk_wait_read_all();
        }
        __syncwarp();
        cuda::mbar_arrive_s(empty0 + 8 * slot);
        if (kOrdered && lane == 0) {
            cuda::bulk_wait_all();
            fence_proxy_async_global();
            __threadfence();  // the adds land before the counter moves
            atomicAdd(turn_sem(p, a, bwd_step(p, a, s)), 1);
        }
    }
    if (!kOrdered && lane == 0) cuda::bulk_wait_all();  // the reductions still in flight
}

// The consumer warpgroup wg's walk: its rows copies, the ring, one step after another.
template <class Tr, class E>
__device__ __forceinline__ void det_consume(const BwdParams &p, const BwdBlock &a, int nsteps, int wg,
                                        float (&dK)[Tr::kDW / 2], float (&dV)[Tr::kDW / 2]) {
    // Prologue: the rows of the first kStages - 1 steps (fresh buffers: no release to wait for).
#pragma unroll
    for (int r = 0; r < Tr::kStages - 1; ++r) {
        if (r < nsteps) load_rows<Tr>(p, a, bwd_step(p, a, r), r, wg);
        cuda::cp_async_commit();
    }
    cuda::mbar_wait(&a.bars->kv_full, 0);
    WalkPos ws{0, 0}, wr = walk_pos(a, Tr::kStages - 1);  // steps s and r
    for (int s = 0; s < nsteps; ++s, walk_next(a, ws), walk_next(a, wr)) {
        const BwdStep st = walk_step(p, a, ws);
        const int buf = ring_buf<Tr>(s);
        // Step r = s + kStages - 1's rows go to the buffer of step s - 1: this warpgroup's copy
        // was last read before the warpgroup barrier of its step s - 1.
        const int r = s + Tr::kStages - 1;
        if (r < nsteps) load_rows<Tr>(p, a, walk_step(p, a, wr), ring_buf<Tr>(r), wg);
        cuda::cp_async_commit();
        cuda::cp_async_wait<Tr::kStages - 1>();  // this step's rows, from this thread ...
        warpgroup_sync(wg);                      // ... and from every thread of the warpgroup
        cuda::mbar_wait(&a.bars->qdo_full[buf], ring_phase<Tr>(s));
        step_compute<Tr, E, true>(p, a, s, st, buf, wg, dK, dV);
    }
}

// The deterministic mode's kernel (p.deterministic; stop 20): three warpgroups (kBwdDetThreads).
// Warpgroup 0 produces (warp 0: TMA; warp 1: the dQ writer, which takes the turns), warpgroups 1
// and 2 consume (keys n0 .. n0 + 63 and n0 + 64 .. n0 + 127). The default mode runs it too
// (p.dq_writer, no turns; finalize's writer_kernel): one dQ reduction per step where bwd_kernel
// makes two. Before stop 30 summed the two warpgroups' dQ into one page, it ran the
// default mode 1-14 % slower.
template <class Tr, class E>
__global__ void __launch_bounds__(kBwdDetThreads, 1)
    bwd_det_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const __grid_constant__ BwdParams p) {
    extern __shared__ unsigned char smem_raw[];
    BwdBlock a = key_block<Tr>(p, smem_raw);
    if (a.n0 >= a.sk) return;  // the whole CTA: a key block past this sequence's end

    if (threadIdx.x == 0) {
        cuda::mbar_init(&a.bars->kv_full, 1);
#pragma unroll
        for (int s = 0; s < Tr::kStages; ++s) {
            cuda::mbar_init(&a.bars->qdo_full[s], 1);
            cuda::mbar_init(&a.bars->qdo_empty[s], 2 * 128 / 32);  // every consumer warp
        }
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            cuda::mbar_init(&a.bars->dq_full[w], 2 * 128);  // every thread of both consumer warpgroups
            cuda::mbar_init(&a.bars->dq_empty[w], 32);  // every lane of the writer warp
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();

    const bool any = set_walk<Tr>(p, a);
    const int nsteps = p.group * a.nmb;
    static_assert(setmaxnreg_split_fits(kBwdProducerRegs, kBwdConsumerRegs) && kThreads == kBwdDetThreads,
                  "the backward's register split exceeds the launch's");
    if (threadIdx.x < 128) {
        cuda::setmaxnreg_dec<kBwdProducerRegs>();
        const int warp = threadIdx.x / 32;
        if (!any) return;
        if (warp == 0) {
            if (threadIdx.x == 0) produce_q_do<Tr>(p, &tm_q, &tm_k, &tm_v, &tm_do, a, nsteps);
        } else if (p.deterministic) {  // warps 1 and 2: one writer per slot (write_dq_det)
            if (warp <= 2) write_dq_det<Tr, true>(p, a, nsteps, warp - 1);
        } else if (warp == 1) {
            write_dq_det<Tr, false>(p, a, nsteps, 0);
        }
        return;
    }
    cuda::setmaxnreg_inc<kBwdConsumerRegs>();
    const int wg = cuda::warp_uniform(threadIdx.x / 128 - 1);
    float dK[Tr::kDW / 2], dV[Tr::kDW / 2];
#pragma unroll
    for (int i = 0; i < Tr::kDW / 2; ++i) dK[i] = dV[i] = 0.f;
    if (any) {
        // the turns, staged in the dQ slots (first written at the end of step 0)
        if (p.deterministic && bwd_turn_table(p.grid_order))
            build_turn_table<Tr>(p, a, threadIdx.x - 128, 256, kBwdDetConsumerBar, cuda::smem_addr(a.smem) + Tr::kDQOff);
        det_consume<Tr, E>(p, a, nsteps, wg, dK, dV);
    }
    store_dk_dv<Tr, E>(p, a, wg, dK, dV);
}

// Grid: kv heads x batch x key blocks of the longest sequence, in one dimension (the host checks
// that it fits).
template <int kD, class E, bool kDet>
cudaError_t launch_bwd_kernel(const BwdParams &p, const BwdMaps &maps, cudaStream_t stream) {
    using Tr = BwdTraits<kD>;
    // The split layout's deterministic mode runs bwd_kernel (its turns in accumulate_dq_red).
    constexpr bool kDetKernel = kDet && !Tr::kSplit;
    auto kernel = [] {
        if constexpr (kDetKernel)
            return bwd_det_kernel<Tr, E>;
        else
            return bwd_kernel<Tr, E, kDet>;
    }();
    constexpr int kThreadsPerCta = kDetKernel ? kBwdDetThreads : kBwdThreads;
    constexpr int kSmem = Tr::kSmemBytes;
    static unsigned long long optin_done = 0;  // one per instantiation
    cudaError_t e = cuda::ensure_smem_optin(kernel, kSmem, &optin_done);
    if (e != cudaSuccess) return e;
    const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(p.heads_kv) * p.batch * bwd_key_blocks<Tr>(p)));
    kernel<<<grid, kThreadsPerCta, kSmem, stream>>>(maps.q, maps.k, maps.v, maps.dout, p);
    return cudaSuccess;
}

}  // namespace fa3
}  // namespace flashattn
