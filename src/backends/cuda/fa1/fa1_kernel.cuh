// The FA1 forward kernel (FlashAttention-1, Dao et al. 2022, Algorithm 1) for sm_75 and newer.
//
// One CTA owns one (batch, head) and a range of query blocks of BR rows. Its OUTER loop walks the
// K/V blocks (BC = 4 warps x KPW keys), its INNER loop the query blocks. Every inner step reads the
// block's partial output O (fp32, normalised) and its softmax statistics (running max m, running
// sum l) from the workspace in device memory, and writes them back (Alg. 1 lines 9-13), except on a
// block's first K/V block (nothing to read: the state starts as O = 0, m = -inf, l = 0) and its last
// one (the final O is written in the caller's dtype straight from registers, plus the LSE).
//
// Inside a step the four warps split the KEY dimension of the K/V block (FA1's "split-K" warp
// partition): warp w owns keys [w*KPW, (w+1)*KPW) of K and V, so its K/V slice in shared memory is
// private to it; every warp sees all BR query rows (Q is shared). Each warp computes S = Q K_w^T,
// the row maxima are combined across warps through shared memory, each warp exponentiates its part
// and computes a partial P_w V_w over all D output columns; the partial products are then reduced
// through shared memory: warp w owns output columns [w*D/4, (w+1)*D/4), receives the three other
// warps' partials of those columns (stored in mma-fragment order: 16-byte, conflict-free accesses)
// and applies the FA1 update O = (l_old e^(m_old - m_new) O_old + P V) / l_new to them.
//
// Barriers per inner step: (A) after the row maxima, (B) after the partial products; tiles whose Q
// lives inside the reduction buffer (QALIAS) add (C) before the next step reads its Q. Each warp's
// K/V slice is private, so refilling it needs only __syncwarp.
//
// Only sm_75 instructions (device/ptx.cuh): mma.sync m16n8k8 (fp16; bf16 only on sm_80+), ldmatrix
// (.trans for V), plain 16-byte global loads staged through registers into shared memory (no
// cp.async). Shared tiles use the row-major swizzle of device/swizzle.cuh (RowSwizzle); the mask is
// the rule of device/mask.cuh in FA1's int32 form (Seq); the dynamic shared-memory opt-in is set
// once per device and kernel (host/smem_optin.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "backends/cuda/device/mask.cuh"
#include "backends/cuda/device/online_softmax.cuh"  // normalize_output
#include "backends/cuda/device/ptx.cuh"
#include "backends/cuda/device/swizzle.cuh"
#include "backends/cuda/fa1/fa1_params.h"
#include "backends/cuda/host/smem_optin.h"

namespace flashattn {
namespace fa1 {

using cuda::Bf16;
using cuda::Fp16;

// Compile-time tile: head dim D, query rows per inner step BR, keys per warp KPW. QALIAS places the
// Q tile inside the reduction buffer (saves BR*D*2 bytes of shared memory at the price of one more
// barrier per step): row group gq (rows 8gq..8gq+7) lies in the part of the buffer that only warp
// gq reads, so warp gq refills it for the next step as soon as it has read its partial products.
template <int D_, int BR_, int KPW_, bool QALIAS_>
struct Tile {
    static constexpr int D = D_;
    static constexpr int BR = BR_;
    static constexpr int KPW = KPW_;
    static constexpr bool QALIAS = QALIAS_;
    static constexpr int BC = KPW * kWarps;
    static constexpr int MT = BR / 16;          // m16 tiles (all rows, every warp)
    static constexpr int NS = KPW / 8;          // n8 tiles of S per warp
    static constexpr int NO = D / 8;            // n8 tiles of the output
    static constexpr int NOW = NO / kWarps;     // n8 tiles of the output each warp owns
    // Column groups of the P V product: at most 64 live fp32 accumulators per thread.
    static constexpr int NH = (MT * NO * 4) / 64 > 1 ? (MT * NO * 4) / 64 : 1;
    static_assert(kWarps % NH == 0 && (NO / NH) % 4 == 0, "column groups");
    static constexpr int KC = D / 8;            // 16-byte chunks per row
    static constexpr int ROWB = D * 2;          // bytes per shared row
    // Shared tiles are row-major with the XOR swizzle of swizzle.cuh (RowSwizzle): rows of >= 128
    // bytes use chunk ^ (row % 8), 64-byte rows chunk ^ ((row / 2) % 4). SWC: XOR span in chunks.
    using Swz = cuda::RowSwizzle<ROWB>;
    static constexpr int SWC = Swz::kSpan;

    static_assert(D == 32 || D == 64 || D == 128 || D == 256, "compiled head dims: 32, 64, 128, 256");
    static_assert(BR % 16 == 0 && KPW % 16 == 0, "tile shape");
    static_assert(NOW >= 1, "each warp owns at least one n8 tile");

    // Q is stored in 8-row groups, group gq at kOffQ + gq * kQGroupStride.
    static constexpr int kOwnerBytes = (kWarps - 1) * MT * NOW * 32 * 16;  // one owner's slots
    static constexpr int kQGroupStride = QALIAS ? kOwnerBytes : 8 * ROWB;
    static_assert(!QALIAS || (BR / 8 <= kWarps && 8 * ROWB <= kOwnerBytes), "Q groups in owner slots");
    // Q chunks per thread: non-aliased, the CTA's threads share the tile; aliased, warp gq loads and
    // stores row group gq (warps without a group load nothing).
    static constexpr int QCH = QALIAS ? KC / 4 : BR * KC / kThreads;
    static constexpr int KVCH = KPW * KC / 32;       // K (and V) chunks per lane
    static_assert(QALIAS ? QCH * 32 == 8 * KC : QCH * kThreads == BR * KC, "Q tile load split");
    static_assert(KVCH * 32 == KPW * KC, "K/V slice load split");

    static constexpr int kKBytes = BC * ROWB;
    static constexpr int kVBytes = BC * ROWB;
    static constexpr int kRedBytes = kWarps * (kWarps - 1) * MT * NOW * 32 * 16;
    static constexpr int kQBytes = BR * ROWB;
    static constexpr int kStatBytes = 2 * kWarps * BR * 4;

    static constexpr int kOffK = 0;
    static constexpr int kOffV = kOffK + kKBytes;
    static constexpr int kOffRed = kOffV + kVBytes;
    static constexpr int kOffQ = QALIAS ? kOffRed : kOffRed + kRedBytes;
    static constexpr int kOffStat = kOffRed + kRedBytes + (QALIAS ? 0 : kQBytes);
    static constexpr int kSmemBytes = kOffStat + kStatBytes;
    // The ldmatrix address bases XOR the chunk bits of 128-byte aligned rows (see Fwd::init_smem).
    static_assert(kOffK % 128 == 0 && kOffV % 128 == 0 && kOffQ % 128 == 0 && kQGroupStride % 128 == 0 &&
                      ROWB % 64 == 0 && (ROWB >= 128 || SWC == 4),
                  "tile offsets keep the swizzle bits of row addresses clear");
};

// Per-CTA sequence geometry: the mask rule of mask.cuh in int32 and the (key block, query block)
// bookkeeping of FA1's loop order (mask.cuh says how it derives from key_tiles). Every sum fits in
// int32: rows and keys are below 2^29 (the backend's limit) and the window extents are clamped to
// 2^29 (TensorArgs::left_i / right_i).
template <int BR, int BC>
struct Seq {
    int sq, sk;        // this sequence's lengths
    int off;           // sk - sq
    int left, right;   // window (right already includes causal)
    int ib_begin, ib_end;

    // Visible keys of row r: [lo(r), hi(r)] (empty when lo > hi). These are
    // cuda::first_visible_key(r + off, left) and cuda::last_visible_key(r + off, right, sk), written
    // out: through the helpers ptxas allocates up to 4 more registers and up to 16 more
    // instructions in some FA1 kernels (hdim 32 and 64, CUDA 13.0).
    __device__ __forceinline__ int lo(int r) const { return max(r + off - left, 0); }
    __device__ __forceinline__ int hi(int r) const { return min(r + off + right, sk - 1); }
    // K/V blocks [fj, lj] query block ib needs; false when it sees no key at all.
    __device__ __forceinline__ bool range(int ib, int &fj, int &lj) const {
        const int r0 = ib * BR;
        const int r1 = min(r0 + BR, sq) - 1;
        const int kmin = lo(r0), kmax = hi(r1);
        if (kmin > kmax) return false;
        fj = static_cast<unsigned>(kmin) / BC;
        lj = static_cast<unsigned>(kmax) / BC;
        return true;
    }
    // True when some element of tile (ib, j) is masked (a partial key block or a mask boundary).
    __device__ __forceinline__ bool needs_mask(int ib, int j) const {
        const int r0 = ib * BR;
        const int r1 = min(r0 + BR, sq) - 1;
        return j * BC < lo(r1) || j * BC + BC - 1 > hi(r0);
    }
    // The step after (j, ib) in outer-major order among active (K/V block, query block) pairs, and
    // the K/V block range [fj, lj] of its query block; j > j_end: none.
    __device__ __forceinline__ void next(int &j, int &ib, int &fj, int &lj, int j_end) const {
        int jj = j, ii = ib + 1;
        while (jj <= j_end) {
            for (; ii < ib_end; ++ii) {
                if (range(ii, fj, lj) && fj <= jj && jj <= lj) {
                    j = jj;
                    ib = ii;
                    return;
                }
            }
            ++jj;
            ii = ib_begin;
        }
        j = jj;
        ib = ib_begin;
    }
};

// One thread's view of the kernel: the (batch, head, query range) its CTA owns, the global and
// shared-memory addresses it uses, and the phases of one inner step. run() is the loop.
template <class T, class E>
struct Fwd {
    static constexpr int D = T::D, BR = T::BR, KPW = T::KPW, BC = T::BC;
    static constexpr int MT = T::MT, NS = T::NS, NO = T::NO, NOW = T::NOW, KC = T::KC;
    static constexpr int QCH = T::QCH, KVCH = T::KVCH;

    // Thread coordinates, read from threadIdx where used (not kept as members): the compiler then
    // knows warp() < 4, without which it indexes the P V accumulators dynamically (local memory).
    __device__ static __forceinline__ int tid() { return threadIdx.x; }
    __device__ static __forceinline__ int lane() { return threadIdx.x & 31; }
    __device__ static __forceinline__ int warp() { return threadIdx.x >> 5; }
    __device__ static __forceinline__ int g() { return lane() >> 2; }  // fragment row in an 8-row group
    __device__ static __forceinline__ int t() { return lane() & 3; }   // fragment column pair

    const Params &p;
    Seq<BR, BC> sg;
    const char *qg, *kg, *vg;  // this (sequence, head)'s Q, K, V: row 0, column 0
    char *og;
    float *lseg;      // its LSE row 0, or null
    float *o_lane;    // this lane's O fragment element in the workspace, query block 0
    float2 *ml_lane;  // this lane's (m, l) slot, query block 0
    int kvalid_chunks;  // 16-byte chunks of a row that hold data (head_dim / 8)
    uint32_t sK, sV, sRed, sQ;
    uint32_t q_lb, k_lb, v_lb;  // ldmatrix bases (see init_smem)
    float *smax, *ssum;         // per-row statistics of the four warps, [row][warp]

    __device__ __forceinline__ Fwd(const Params &params, char *smem) : p(params) {
        init_sequence();
        init_smem(smem);
    }

    // ---- which (batch, head, query range) this CTA owns, and its global addresses ----
    __device__ __forceinline__ void init_sequence() {
        int idx = blockIdx.x;
        int split = idx % p.splits;
        idx /= p.splits;
        const int h = idx % p.heads_q;
        const int b = idx / p.heads_q;
        if (p.reverse) split = p.splits - 1 - split;

        const bool varlen = p.cu_q != nullptr;
        const cuda::SeqInfo si = cuda::seq_info(p, b);
        sg.sq = si.sq;
        sg.sk = si.sk;
        sg.off = cuda::diagonal_offset(p, sg.sq, sg.sk);  // sk - sq, or 0 top-left
        sg.left = p.left_i;
        sg.right = p.right_i;
        const int nqb = (sg.sq + BR - 1) / BR;
        sg.ib_begin = split * p.q_blocks_per_cta;
        sg.ib_end = min(nqb, sg.ib_begin + p.q_blocks_per_cta);

        const int hk = h / p.group;
        qg = static_cast<const char *>(p.q) +
             2 * ((varlen ? si.q_row0 * p.q_rs : (long long)b * p.q_bs) + (long long)h * p.q_hs);
        kg = static_cast<const char *>(p.k) +
             2 * ((varlen ? si.k_row0 * p.k_rs : (long long)b * p.k_bs) + (long long)hk * p.k_hs);
        vg = static_cast<const char *>(p.v) +
             2 * ((varlen ? si.k_row0 * p.v_rs : (long long)b * p.v_bs) + (long long)hk * p.v_hs);
        og = static_cast<char *>(p.o) +
             2 * ((varlen ? si.q_row0 * p.o_rs : (long long)b * p.o_bs) + (long long)h * p.o_hs);
        lseg = p.lse != nullptr ? p.lse + cuda::lse_offset(p, b, h, si.q_row0, 0) : nullptr;
        // First workspace row of the sequence (see workspace_rows() in fa1_backend.cpp). The O
        // fragments are stored per (query block, m16 tile, n8 tile) as 32 lanes x float4, (m, l)
        // per row and warp; a step adds its query block to these per-lane bases.
        const long long ws_start = varlen ? (long long)BR * ((si.q_row0 + BR - 1) / BR + b)
                                          : (long long)b * ((p.seqlen_q + BR - 1) / BR) * BR;
        o_lane = p.o_acc + ((long long)h * p.ws_rows + ws_start) * D + warp() * NOW * 128 + lane() * 4;
        ml_lane = p.ml + ((long long)h * p.ws_rows + ws_start + g()) * kWarps + warp();
        kvalid_chunks = p.head_dim / 8;
    }

    __device__ __forceinline__ void init_smem(char *smem) {
        const uint32_t s_base = cuda::smem_addr(smem);
        sK = s_base + T::kOffK;
        sV = s_base + T::kOffV;
        sRed = s_base + T::kOffRed;
        sQ = s_base + T::kOffQ;
        static_assert(kWarps == 4, "one float4 per row of statistics");
        smax = reinterpret_cast<float *>(smem + T::kOffStat);
        ssum = smax + kWarps * BR;

        // Per-lane ldmatrix bases (see RowSwizzle). A lane's row address has zero bits in the XOR
        // span (rows of 64 or 128 bytes x 2^k, 128-byte aligned tiles), so the address of logical
        // chunk c0 + 2s (Q, K) or c0 + 4s (V) is the chunk-c0 base XOR (s << 5) or (s << 6): one
        // LOP3 per swizzle run and step instead of one live register per run.
        const int i8 = lane() >> 3, r8 = lane() & 7;
        const int xq = T::Swz::xor_of(r8);
        // Q (A operand, x4 = rows {0-7, 8-15} x k {0-7, 8-15}): row (i8&1)*8 + r8, chunk 2kk + (i8>>1).
        // K (B operand, x4 = keys {0-7, 8-15} x k {0-7, 8-15}): key (i8>>1)*8 + r8, chunk 2kk + (i8&1).
        q_lb = sQ + (i8 & 1) * T::kQGroupStride + r8 * T::ROWB + (((i8 >> 1) ^ xq) << 4);
        k_lb = sK + (warp() * KPW + (i8 >> 1) * 8 + r8) * T::ROWB + (((i8 & 1) ^ xq) << 4);
        // V (B operand via .trans, x4 = keys 0-7 x four n8 tiles): key r8, chunk 4*nt4 + i8.
        v_lb = sV + (warp() * KPW + r8) * T::ROWB + ((i8 ^ xq) << 4);
    }

    // Query blocks that see no key get O = 0 and LSE = -inf here; [j_begin, j_end] is the K/V
    // block range of the others (j_end < 0: none).
    __device__ __forceinline__ void finish_keyless_blocks(int &j_begin, int &j_end) {
        j_begin = 1 << 30;
        j_end = -1;
        for (int ib = sg.ib_begin; ib < sg.ib_end; ++ib) {
            int fj, lj;
            if (sg.range(ib, fj, lj)) {
                j_begin = min(j_begin, fj);
                j_end = max(j_end, lj);
                continue;
            }
            const int r0 = ib * BR;
            const int rows = min(BR, sg.sq - r0);
            for (int c = tid(); c < rows * kvalid_chunks; c += kThreads) {
                const int r = c / kvalid_chunks, ch = c % kvalid_chunks;
                *reinterpret_cast<uint4 *>(og + 2 * ((long long)(r0 + r) * p.o_rs + ch * 8)) =
                    make_uint4(0, 0, 0, 0);
            }
            if (lseg != nullptr)
                for (int r = tid(); r < rows; r += kThreads) lseg[r0 + r] = -INFINITY;
        }
    }

    // ---- global -> shared staging ----
    // Q chunk i of this thread: tile row q_row(i), 16-byte chunk q_ch(i). Aliased tiles: warp gq
    // loads row group gq (warps without a group load nothing).
    __device__ __forceinline__ bool q_loader() const { return !T::QALIAS || warp() * 8 < BR; }
    __device__ __forceinline__ int q_row(int i) const {
        return T::QALIAS ? warp() * 8 + (lane() + i * 32) / KC : (tid() + i * kThreads) / KC;
    }
    __device__ __forceinline__ int q_ch(int i) const {
        return T::QALIAS ? (lane() + i * 32) % KC : (tid() + i * kThreads) % KC;
    }
    __device__ __forceinline__ void load_q_regs(int ib, uint4 (&qr)[QCH]) const {
#pragma unroll
        for (int i = 0; i < QCH; ++i) {
            const int row = ib * BR + q_row(i), ch = q_ch(i);
            qr[i] = make_uint4(0, 0, 0, 0);
            if (q_loader() && row < sg.sq && ch < kvalid_chunks)
                qr[i] = cuda::ld_global_cg_v4(qg + 2 * ((long long)row * p.q_rs + ch * 8));
        }
    }
    __device__ __forceinline__ void store_q(const uint4 (&qr)[QCH]) const {
        if (!q_loader()) return;
#pragma unroll
        for (int i = 0; i < QCH; ++i) {
            const int r = q_row(i);
            cuda::st_shared_v4(sQ + (r >> 3) * T::kQGroupStride + T::Swz::offset(r & 7, q_ch(i)), qr[i]);
        }
    }

    // This warp's K/V slice of block j (warp-private: only this warp reads it). The aliased tiles
    // issue all K and V loads, then store; the others stage K, then V: with both in flight ptxas
    // runs out of registers there (it spills a few bytes at head dim 64), while the aliased tiles
    // spill with the split. Both are checked with -v.
    __device__ __forceinline__ void load_kv(int j) const {
        if constexpr (T::QALIAS) {
            uint4 kr[KVCH], vr[KVCH];
#pragma unroll
            for (int i = 0; i < KVCH; ++i) {
                const int c = lane() + i * 32;
                const int r = c / KC, ch = c % KC;
                const int key = j * BC + warp() * KPW + r;
                kr[i] = make_uint4(0, 0, 0, 0);
                vr[i] = make_uint4(0, 0, 0, 0);
                if (key < sg.sk && ch < kvalid_chunks) {
                    kr[i] = cuda::ld_global_cg_v4(kg + 2 * ((long long)key * p.k_rs + ch * 8));
                    vr[i] = cuda::ld_global_cg_v4(vg + 2 * ((long long)key * p.v_rs + ch * 8));
                }
            }
#pragma unroll
            for (int i = 0; i < KVCH; ++i) {
                const int c = lane() + i * 32;
                const uint32_t o = T::Swz::offset(warp() * KPW + c / KC, c % KC);
                cuda::st_shared_v4(sK + o, kr[i]);
                cuda::st_shared_v4(sV + o, vr[i]);
            }
        } else {
            for (int pass = 0; pass < 2; ++pass) {
                const char *src = pass ? vg : kg;
                const long long rs = pass ? p.v_rs : p.k_rs;
                const uint32_t dst = pass ? sV : sK;
                uint4 r[KVCH];
#pragma unroll
                for (int i = 0; i < KVCH; ++i) {
                    const int c = lane() + i * 32;
                    const int key = j * BC + warp() * KPW + c / KC, ch = c % KC;
                    r[i] = make_uint4(0, 0, 0, 0);
                    if (key < sg.sk && ch < kvalid_chunks)
                        r[i] = cuda::ld_global_cg_v4(src + 2 * ((long long)key * rs + ch * 8));
                }
#pragma unroll
                for (int i = 0; i < KVCH; ++i) {
                    const int c = lane() + i * 32;
                    cuda::st_shared_v4(dst + T::Swz::offset(warp() * KPW + c / KC, c % KC), r[i]);
                }
            }
        }
        __syncwarp();
    }

    // ---- the phases of one inner step ----

    // S = Q K_w^T: this warp's KPW keys, all BR rows.
    __device__ __forceinline__ void scores(float (&s)[MT][NS][4]) const {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int n = 0; n < NS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
        constexpr int kSubQ = T::SWC / 2;  // k16 steps per swizzle span
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const int sub = kk % kSubQ;
            const uint32_t imm = (kk / kSubQ) * (T::SWC * 16);
            uint32_t qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                cuda::ldmatrix_x4(qa[mt], (q_lb ^ (sub << 5)) + imm + mt * 2 * T::kQGroupStride);
#pragma unroll
            for (int np = 0; np < NS / 2; ++np) {
                uint32_t b[4];
                cuda::ldmatrix_x4(b, (k_lb ^ (sub << 5)) + imm + np * 16 * T::ROWB);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    cuda::mma_1688<E>(s[mt][2 * np], qa[mt][0], qa[mt][1], b[0]);
                    cuda::mma_1688<E>(s[mt][2 * np], qa[mt][2], qa[mt][3], b[1]);
                    cuda::mma_1688<E>(s[mt][2 * np + 1], qa[mt][0], qa[mt][1], b[2]);
                    cuda::mma_1688<E>(s[mt][2 * np + 1], qa[mt][2], qa[mt][3], b[3]);
                }
            }
        }
    }

    // Soft cap, mask, and this warp's row maxima into smax (read by all warps after barrier A).
    __device__ __forceinline__ void mask_and_row_max(float (&s)[MT][NS][4], int ib, int j) const {
        if (p.softcap_scale != 0.f) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NS; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][n][e] = cuda::tanh_accurate(s[mt][n][e] * p.softcap_scale);
        }
        if (sg.needs_mask(ib, j)) {
            const int r0 = ib * BR;
            const int kbase = j * BC + warp() * KPW + 2 * t();
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = r0 + mt * 16 + g() + 8 * hh;
                    const int klo = sg.lo(row), khi = sg.hi(row);
#pragma unroll
                    for (int n = 0; n < NS; ++n)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = kbase + n * 8 + e;
                            if (key < klo || key > khi) s[mt][n][2 * hh + e] = -INFINITY;
                        }
                }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float m = -INFINITY;
#pragma unroll
                for (int n = 0; n < NS; ++n) m = fmaxf(m, fmaxf(s[mt][n][2 * hh], s[mt][n][2 * hh + 1]));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                if (t() == 0) smax[(mt * 16 + g() + 8 * hh) * kWarps + warp()] = m;
            }
    }

    // m_new from the four warps' maxima and m_old, P = exp(S - m_new) packed as A fragments, and
    // this warp's partial row sums into ssum (read by all warps after barrier B).
    __device__ __forceinline__ void softmax(const float (&s)[MT][NS][4], const float2 (&mlold)[MT][2],
                                            float (&mnew)[MT][2], uint32_t (&pa)[MT][NS][2]) const {
        const float sl2 = p.score_log2;
        float moff[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int rl = mt * 16 + g() + 8 * hh;
                const float4 mw = *reinterpret_cast<const float4 *>(smax + rl * kWarps);
                const float m = fmaxf(fmaxf(__shfl_sync(0xffffffffu, mlold[mt][hh].x, lane() & ~3), mw.x),
                                      fmaxf(fmaxf(mw.y, mw.z), mw.w));
                mnew[mt][hh] = m;
                moff[mt][hh] = m == -INFINITY ? 0.f : m * sl2;
            }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
            for (int n = 0; n < NS; ++n) {
                const float p0 = cuda::fast_exp2(fmaf(s[mt][n][0], sl2, -moff[mt][0]));
                const float p1 = cuda::fast_exp2(fmaf(s[mt][n][1], sl2, -moff[mt][0]));
                const float p2 = cuda::fast_exp2(fmaf(s[mt][n][2], sl2, -moff[mt][1]));
                const float p3 = cuda::fast_exp2(fmaf(s[mt][n][3], sl2, -moff[mt][1]));
                ls0 += p0 + p1;
                ls1 += p2 + p3;
                pa[mt][n][0] = cuda::pack2<E>(p0, p1);
                pa[mt][n][1] = cuda::pack2<E>(p2, p3);
            }
            ls0 += __shfl_xor_sync(0xffffffffu, ls0, 1);
            ls0 += __shfl_xor_sync(0xffffffffu, ls0, 2);
            ls1 += __shfl_xor_sync(0xffffffffu, ls1, 1);
            ls1 += __shfl_xor_sync(0xffffffffu, ls1, 2);
            if (t() == 0) {
                ssum[(mt * 16 + g()) * kWarps + warp()] = ls0;
                ssum[(mt * 16 + g() + 8) * kWarps + warp()] = ls1;
            }
        }
    }

    // Reduction slot of (owner warp q, source index src, m16 tile mt, n8 tile n) for this lane:
    // one fragment per lane, 512 contiguous bytes per slot, so every access is a conflict-free
    // 16-byte one.
    __device__ __forceinline__ uint32_t red_slot(int q, int src, int mt, int n) const {
        return sRed + ((((q * (kWarps - 1) + src) * MT + mt) * NOW + n) * 32 + lane()) * 16;
    }

    // Partial O_w = P_w V_w over all D columns. The columns are produced in NH groups (each a whole
    // number of owners' slices) to bound the live accumulators; each group's slices owned by other
    // warps go straight to the reduction buffer, this warp's own slice into `own`.
    __device__ __forceinline__ void pv_and_scatter(const uint32_t (&pa)[MT][NS][2], float4 (&own)[MT][NOW]) const {
        constexpr int kSubVn = T::SWC / 4 > 0 ? T::SWC / 4 : 1;
        // The group holding this warp's own columns goes last: its accumulators then never live
        // alongside the partial products of another group.
#pragma unroll
        for (int gi = 0; gi < T::NH; ++gi) {
            constexpr int NG = NO / T::NH;  // n8 tiles per group
            static_assert((NG / 4) % kSubVn == 0, "V swizzle runs align with the groups");
            const int grp = T::NH == 1 ? 0 : (warp() / (kWarps / T::NH) + 1 + gi) % T::NH;
            float o[MT][NG][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NG; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < NS; ++kc) {
#pragma unroll
                for (int g4 = 0; g4 < NG / 4; ++g4) {
                    const int sub = g4 % kSubVn;  // grp * (NG / 4) is a multiple of kSubVn
                    const uint32_t imm =
                        (grp * (NG / 4) / kSubVn + g4 / kSubVn) * (T::SWC * 16) + kc * 8 * T::ROWB;
                    uint32_t b[4];
                    cuda::ldmatrix_x4_trans(b, (v_lb ^ (sub << 6)) + imm);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            cuda::mma_1688<E>(o[mt][4 * g4 + i], pa[mt][kc][0], pa[mt][kc][1], b[i]);
                }
            }
#pragma unroll
            for (int qq = 0; qq < kWarps / T::NH; ++qq) {
                const int q = grp * (kWarps / T::NH) + qq;  // owner warp of these columns
                if (q == warp()) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int n = 0; n < NOW; ++n)
                            own[mt][n] = make_float4(o[mt][qq * NOW + n][0], o[mt][qq * NOW + n][1],
                                                     o[mt][qq * NOW + n][2], o[mt][qq * NOW + n][3]);
                } else {
                    const int src = warp() < q ? warp() : warp() - 1;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int n = 0; n < NOW; ++n)
                            cuda::st_shared_v4(red_slot(q, src, mt, n),
                                               make_float4(o[mt][qq * NOW + n][0], o[mt][qq * NOW + n][1],
                                                           o[mt][qq * NOW + n][2], o[mt][qq * NOW + n][3]));
                }
            }
        }
    }

    // After barrier B: add the three other warps' partial products of this warp's columns.
    __device__ __forceinline__ void gather(float4 (&own)[MT][NOW]) const {
#pragma unroll
        for (int src = 0; src < kWarps - 1; ++src)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int n = 0; n < NOW; ++n) {
                    const float4 x = cuda::ld_shared_v4_f32(red_slot(warp(), src, mt, n));
                    own[mt][n].x += x.x;
                    own[mt][n].y += x.y;
                    own[mt][n].z += x.z;
                    own[mt][n].w += x.w;
                }
    }

    // The FA1 update of this warp's columns, O = (l_old e^(m_old - m_new) O_old + P V) / l_new,
    // then either the final output (the caller's dtype, straight from registers, and the LSE) or
    // the partial state back to the workspace.
    __device__ __forceinline__ void update_and_store(float4 (&own)[MT][NOW], const float4 (&oold)[MT][NOW],
                                                     const float2 (&mlold)[MT][2], const float (&mnew)[MT][2],
                                                     int r0, bool last, float *o_step, float2 *ml_step) const {
        const float sl2 = p.score_log2;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float cold[2], cnew[2], lnew[2];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int rl = mt * 16 + g() + 8 * hh;
                const float mo = __shfl_sync(0xffffffffu, mlold[mt][hh].x, lane() & ~3);
                const float lo = __shfl_sync(0xffffffffu, mlold[mt][hh].y, lane() & ~3);
                const float4 lw = *reinterpret_cast<const float4 *>(ssum + rl * kWarps);
                const float lb = (lw.x + lw.y) + (lw.z + lw.w);
                const float alpha = mo == -INFINITY ? 0.f : cuda::fast_exp2((mo - mnew[mt][hh]) * sl2);
                const float ln = alpha * lo + lb;
                // ln >= 1 whenever a key is visible (the row maximum contributes e^0), so the
                // approximate reciprocal (no IEEE slow path in the loop) is exact to ~1 ulp. ln is
                // 0 for a row that saw no key yet, and NaN once a NaN score reached the row (fmaxf
                // drops it from m, but its P is NaN): inv is then NaN too, which propagates.
                const float inv = ln == 0.f ? 0.f : cuda::fast_rcp(ln);
                cold[hh] = alpha * lo * inv;
                cnew[hh] = inv;
                lnew[hh] = ln;
            }
#pragma unroll
            for (int n = 0; n < NOW; ++n) {
                own[mt][n].x = fmaf(cold[0], oold[mt][n].x, cnew[0] * own[mt][n].x);
                own[mt][n].y = fmaf(cold[0], oold[mt][n].y, cnew[0] * own[mt][n].y);
                own[mt][n].z = fmaf(cold[1], oold[mt][n].z, cnew[1] * own[mt][n].z);
                own[mt][n].w = fmaf(cold[1], oold[mt][n].w, cnew[1] * own[mt][n].w);
            }
            if (last) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = r0 + mt * 16 + g() + 8 * hh;
                    if (row < sg.sq) {
                        char *orow = og + 2 * (long long)row * p.o_rs;
                        // A row that saw no key stores 0 even if a NaN in V reached it (P = 0).
                        const float keep = lnew[hh] == 0.f ? 0.f : 1.f;
#pragma unroll
                        for (int n = 0; n < NOW; ++n) {
                            const int col = (warp() * NOW + n) * 8 + 2 * t();
                            if (col < p.head_dim) {
                                const uint32_t v =
                                    hh == 0 ? cuda::pack2<E>(cuda::normalize_output(own[mt][n].x, keep),
                                                             cuda::normalize_output(own[mt][n].y, keep))
                                            : cuda::pack2<E>(cuda::normalize_output(own[mt][n].z, keep),
                                                             cuda::normalize_output(own[mt][n].w, keep));
                                *reinterpret_cast<uint32_t *>(orow + 2 * col) = v;
                            }
                        }
                        if (lseg != nullptr && warp() == 0 && t() == 0)
                            lseg[row] = lnew[hh] == 0.f
                                            ? -INFINITY
                                            : (mnew[mt][hh] * sl2 + cuda::fast_log2(lnew[hh])) * 0.6931471805599453f;
                    }
                }
            } else {
#pragma unroll
                for (int n = 0; n < NOW; ++n)
                    __stcg(reinterpret_cast<float4 *>(o_step + (mt * NO + n) * 128), own[mt][n]);
                if (t() == 0) {
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh)
                        __stcg(ml_step + (mt * 16 + 8 * hh) * kWarps, make_float2(mnew[mt][hh], lnew[hh]));
                }
            }
        }
    }

    // ---- the loop: outer over K/V blocks j, inner over this CTA's query blocks ib ----
    __device__ static __forceinline__ void run(const Params &p, char *smem) {
        Fwd f(p, smem);
        if (f.sg.ib_begin >= f.sg.ib_end) return;
        int j_begin, j_end;
        f.finish_keyless_blocks(j_begin, j_end);
        if (j_end < 0) return;

        // Prologue: the first active (j, ib).
        int j = j_begin, ib = f.sg.ib_begin - 1, fj = 0, lj = -1;
        f.sg.next(j, ib, fj, lj, j_end);  // scans from ib_begin at j_begin
        {
            uint4 qr[QCH];
            f.load_q_regs(ib, qr);
            f.load_kv(j);
            f.store_q(qr);
        }
        __syncthreads();

        while (j <= j_end) {
            int jn = j, ibn = ib, fjn = fj, ljn = lj;
            f.sg.next(jn, ibn, fjn, ljn, j_end);
            const bool has_next = jn <= j_end;
            const bool reload_q = has_next && (T::QALIAS || ibn != ib);
            const bool first = j == fj;
            const bool last = j == lj;
            const int r0 = ib * BR;

            // Prefetch: this warp's slice of O_old and its copy of (m, l) for the block's rows.
            float4 oold[MT][NOW];
            float2 mlold[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int n = 0; n < NOW; ++n) oold[mt][n] = make_float4(0.f, 0.f, 0.f, 0.f);
                mlold[mt][0] = mlold[mt][1] = make_float2(-INFINITY, 0.f);
            }
            float *o_step = f.o_lane + (long long)ib * (MT * NO * 128);
            float2 *ml_step = f.ml_lane + (long long)r0 * kWarps;
            if (!first) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int n = 0; n < NOW; ++n)
                        oold[mt][n] = __ldcg(reinterpret_cast<const float4 *>(o_step + (mt * NO + n) * 128));
                    if (f.t() == 0) {
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) mlold[mt][hh] = __ldcg(ml_step + (mt * 16 + 8 * hh) * kWarps);
                    }
                }
            }
            uint4 qn[QCH];
            if (!T::QALIAS && reload_q) f.load_q_regs(ibn, qn);

            float s[MT][NS][4];
            f.scores(s);
            f.mask_and_row_max(s, ib, j);
            __syncthreads();  // (A) row maxima of all warps visible; every warp is done reading Q

            if (!T::QALIAS && reload_q) f.store_q(qn);  // visible after barrier (B)
            float mnew[MT][2];
            uint32_t pa[MT][NS][2];
            f.softmax(s, mlold, mnew, pa);
            float4 own[MT][NOW];
            f.pv_and_scatter(pa, own);

            if (T::QALIAS && reload_q) f.load_q_regs(ibn, qn);  // lands during the reduction
            __syncthreads();  // (B) partial products and row sums of all warps visible

            f.gather(own);
            f.update_and_store(own, oold, mlold, mnew, r0, last, o_step, ml_step);

            if (T::QALIAS && reload_q) {
                __syncwarp();   // every lane of this warp is done reading its slots
                f.store_q(qn);  // this warp's Q row group goes into its own slots
            }
            if (has_next && jn != j) f.load_kv(jn);  // this warp's slice; it finished reading it
            if (T::QALIAS && reload_q) __syncthreads();  // (C) Q of the next step visible
            j = jn;
            ib = ibn;
            fj = fjn;
            lj = ljn;
        }
    }
};

template <class T, class E>
__global__ void __launch_bounds__(kThreads) fa1_fwd_kernel(const Params p) {
    extern __shared__ __align__(128) char fa1_smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    if constexpr (std::is_same<E, Bf16>::value) {
        return;  // no bf16 tensor cores on sm_75; the host never launches this there
    } else
#endif
    {
        Fwd<T, E>::run(p, fa1_smem);
    }
}

template <class T>
Config tile_config(bool large) {
    Config c;
    c.head_dim = T::D;
    c.block_m = T::BR;
    c.keys_per_warp = T::KPW;
    c.smem_bytes = T::kSmemBytes;
    c.large = large;
    return c;
}

template <class T>
void *tile_kernel(bool bf16) {
    return bf16 ? reinterpret_cast<void *>(&fa1_fwd_kernel<T, Bf16>)
                : reinterpret_cast<void *>(&fa1_fwd_kernel<T, Fp16>);
}

// The dynamic shared-memory opt-in of kernel (T, E), set once per device.
template <class T, class E>
cudaError_t tile_prepare() {
    static unsigned long long optin_done = 0;  // one per instantiation, i.e. per kernel
    return cuda::ensure_smem_optin(&fa1_fwd_kernel<T, E>, T::kSmemBytes, &optin_done);
}

template <class T>
cudaError_t tile_prepare(bool bf16) {
    return bf16 ? tile_prepare<T, Bf16>() : tile_prepare<T, Fp16>();
}

template <class T>
cudaError_t tile_launch(const Params &p, bool bf16, cudaStream_t stream) {
    const cudaError_t err = tile_prepare<T>(bf16);
    if (err != cudaSuccess) return err;
    const long long ctas = (long long)p.splits * p.heads_q * p.batch;
    if (ctas <= 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>(ctas));
    if (bf16)
        fa1_fwd_kernel<T, Bf16><<<grid, kThreads, T::kSmemBytes, stream>>>(p);
    else
        fa1_fwd_kernel<T, Fp16><<<grid, kThreads, T::kSmemBytes, stream>>>(p);
    return cudaSuccess;
}

template <class T>
cudaError_t tile_attributes(bool bf16, cudaFuncAttributes *attr) {
    return cudaFuncGetAttributes(attr, tile_kernel<T>(bf16));
}

template <class T>
cudaError_t tile_occupancy(bool bf16, int *blocks) {
    const cudaError_t err = tile_prepare<T>(bf16);
    if (err != cudaSuccess) return err;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, tile_kernel<T>(bf16), kThreads,
                                                         T::kSmemBytes);
}

// Defines the per-head-dim entry points of fa1_params.h for a large and a small tile.
#define FA1_DEFINE_HDIM(HD, LARGE, SMALL)                                                       \
    Config config_hdim##HD(bool large) {                                                        \
        return large ? tile_config<LARGE>(true) : tile_config<SMALL>(false);                    \
    }                                                                                           \
    cudaError_t launch_hdim##HD(const Params &p, bool large, bool bf16, cudaStream_t s) {       \
        return large ? tile_launch<LARGE>(p, bf16, s) : tile_launch<SMALL>(p, bf16, s);         \
    }                                                                                           \
    cudaError_t func_attributes_hdim##HD(bool large, bool bf16, cudaFuncAttributes *attr) {     \
        return large ? tile_attributes<LARGE>(bf16, attr) : tile_attributes<SMALL>(bf16, attr); \
    }                                                                                           \
    cudaError_t occupancy_hdim##HD(bool large, bool bf16, int *blocks) {                        \
        return large ? tile_occupancy<LARGE>(bf16, blocks) : tile_occupancy<SMALL>(bf16, blocks); \
    }

}  // namespace fa1
}  // namespace flashattn
