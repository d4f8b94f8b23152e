// Device-side inline-PTX wrappers for the Hopper (sm_90a) path: mbarrier, TMA
// (cp.async.bulk.tensor), setmaxnreg, wgmma (ordering, SS and RS forms for any N) and the SW128
// smem matrix descriptor. The wgmma and setmaxnreg bodies are guarded by __CUDA_ARCH_FEAT_SM90_ALL
// (compile with -gencode arch=compute_90a,code=sm_90a), the mbarrier, fence and TMA ones by sm_90
// (FLASHATTN_SM90_BODY); other targets get a trap so misuse is loud.
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx.cuh"  // element-type tags, smem_addr
#include "backends/cuda/device/wgmma_operands.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90A_BODY 1
#else
#define FLASHATTN_SM90A_BODY 0
#endif

// The mbarrier, proxy-fence and TMA (cp.async.bulk.tensor) forms below need only sm_90, not the
// sm_90a features: FA2's paged decode (sm_90 code) uses them too.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASHATTN_SM90_BODY 1
#else
#define FLASHATTN_SM90_BODY 0
#endif

#if defined(__CUDA_ARCH__)
#define FLASHATTN_SM90A_TRAP() __trap()
#else
#define FLASHATTN_SM90A_TRAP() ((void)0)
#endif

namespace flashattn {
namespace cuda {

// ---- mbarrier ------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
#if FLASHATTN_SM90_BODY
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar; (void)count; FLASHATTN_SM90A_TRAP();
#endif
}

// Makes mbarrier.init visible to other threads and to the async proxy (TMA); follow with a
// block-wide barrier (__syncthreads) before any other thread or TMA uses the barrier.
__device__ __forceinline__ void fence_mbar_init() {
#if FLASHATTN_SM90_BODY
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// Each mbarrier / TMA operation below comes in two forms: one taking the shared-window address
// (32 bits, `smem_addr`; the `_s` names) that holds the asm, and one taking a pointer that
// converts and calls it. Code at very few registers (the FP8 producer at 24) keeps the addresses
// as 32-bit values: a 64-bit generic pointer per barrier or buffer is two registers ptxas spilled.
__device__ __forceinline__ void mbar_arrive_expect_tx_s(uint32_t bar, uint32_t bytes) {
#if FLASHATTN_SM90_BODY
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#else
    (void)bar; (void)bytes; FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    mbar_arrive_expect_tx_s(smem_addr(bar), bytes);
}

__device__ __forceinline__ void mbar_arrive_s(uint32_t bar) {
#if FLASHATTN_SM90_BODY
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#else
    (void)bar; FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) { mbar_arrive_s(smem_addr(bar)); }

// One try: true iff the phase with parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait_s(uint32_t bar, uint32_t parity) {
#if FLASHATTN_SM90_BODY
    uint32_t ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
#else
    (void)bar; (void)parity; FLASHATTN_SM90A_TRAP();
    return false;
#endif
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, uint32_t parity) {
    return mbar_try_wait_s(smem_addr(bar), parity);
}

// Orders this thread's completed generic-proxy writes to shared memory (st.shared, finished
// cp.async copies) before later async-proxy accesses (wgmma operand reads, TMA): a thread that
// filled a wgmma operand buffer without TMA runs it before signalling the buffer full.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FLASHATTN_SM90_BODY
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// Spins until the phase with parity `parity` completes.
__device__ __forceinline__ void mbar_wait_s(uint32_t bar, uint32_t parity) {
    while (!mbar_try_wait_s(bar, parity)) {
    }
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) { mbar_wait_s(smem_addr(bar), parity); }

// Spins at most `timeout_cycles` clock64 cycles; false on timeout (for tests and debugging:
// report instead of hanging).
__device__ __forceinline__ bool mbar_wait_timeout(uint64_t *bar, uint32_t parity, long long timeout_cycles) {
    const long long start = clock64();
    while (!mbar_try_wait(bar, parity)) {
        if (clock64() - start > timeout_cycles) return false;
    }
    return true;
}

// ---- TMA -----------------------------------------------------------------------------------

// `tmap` is the generic address of a __grid_constant__ CUtensorMap kernel parameter (or of one in
// global memory). Coordinates are element indices, innermost first.
__device__ __forceinline__ void prefetch_tensormap(const void *tmap) {
#if FLASHATTN_SM90_BODY
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#else
    (void)tmap; FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void tma_load_2d(void *dst_smem, const void *tmap, uint64_t *bar, int32_t c0, int32_t c1) {
#if FLASHATTN_SM90_BODY
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst_smem)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
#else
    (void)dst_smem; (void)tmap; (void)bar; (void)c0; (void)c1; FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void tma_load_4d_s(uint32_t dst, const void *tmap, uint32_t bar, int32_t c0, int32_t c1,
                                              int32_t c2, int32_t c3) {
#if FLASHATTN_SM90_BODY
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
#else
    (void)dst; (void)tmap; (void)bar; (void)c0; (void)c1; (void)c2; (void)c3; FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void tma_load_4d(void *dst_smem, const void *tmap, uint64_t *bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
    tma_load_4d_s(smem_addr(dst_smem), tmap, smem_addr(bar), c0, c1, c2, c3);
}

// Shared -> global tile store (the inverse of tma_load_4d_s), tracked by this thread's bulk groups:
// bulk_commit() closes a group; bulk_wait_read_all() returns once every committed group has read
// its shared-memory source (the buffer may be written again), bulk_wait_all() once their global
// writes are performed. The box is clipped at the tensor's extents, as a load's is zero-filled.
__device__ __forceinline__ void tma_store_4d_s(const void *tmap, uint32_t src, int32_t c0, int32_t c1, int32_t c2,
                                               int32_t c3) {
#if FLASHATTN_SM90_BODY
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
                 : "memory");
#else
    (void)tmap; (void)src; (void)c0; (void)c1; (void)c2; (void)c3; FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if FLASHATTN_SM90_BODY
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void bulk_wait_read_all() {
#if FLASHATTN_SM90_BODY
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}
__device__ __forceinline__ void bulk_wait_all() {
#if FLASHATTN_SM90_BODY
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// stmatrix (sm_90): four 8x8 b16 matrices to shared memory, the inverse of ldmatrix_x4 (ptx.cuh):
// lanes 8i..8i+7 give the row addresses of matrix i, register i holds its row lane/4, columns
// 2*(lane%4)..+1 (the mma / wgmma accumulator layout of an n8 block, once packed to 16 bits).
__device__ __forceinline__ void stmatrix_x4(const uint32_t (&r)[4], uint32_t addr) {
#if FLASHATTN_SM90_BODY
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
#else
    (void)r, (void)addr;
    FLASHATTN_SM90A_TRAP();
#endif
}

// The same with .trans: block i is stored transposed, so that the row whose address lane 8i + c
// gives receives column c of the fragment's block (eight 16-bit values, one from each fragment
// row): an accumulator tile [rows][cols] lands as [cols][rows] (the FA3 backward's P^T / dS^T).
__device__ __forceinline__ void stmatrix_x4_trans(const uint32_t (&r)[4], uint32_t addr) {
#if FLASHATTN_SM90_BODY
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#else
    (void)r, (void)addr;
    FLASHATTN_SM90A_TRAP();
#endif
}
// Two blocks (lanes 0-15 give the row addresses; the others' are not read).
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t r0, uint32_t r1, uint32_t addr) {
#if FLASHATTN_SM90_BODY
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1,%2};\n" ::"r"(addr), "r"(r0), "r"(r1)
                 : "memory");
#else
    (void)r0, (void)r1, (void)addr;
    FLASHATTN_SM90A_TRAP();
#endif
}

// Barrier `id` (1..15; 0 is __syncthreads') of `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- warpgroup roles -------------------------------------------------------------------------

// Register reallocation between warpgroups (every warp of the warpgroup executes it). Takes effect
// only when the kernel has a register cap at entry: __launch_bounds__(threads, 1).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, step 8");
#if FLASHATTN_SM90A_BODY
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg takes 24..256, step 8");
#if FLASHATTN_SM90A_BODY
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// ---- wgmma ---------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() {
#if FLASHATTN_SM90A_BODY
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if FLASHATTN_SM90A_BODY
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
#if FLASHATTN_SM90A_BODY
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// Keeps the compiler from moving accesses of accumulator registers across the async window.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Shared-memory matrix descriptor for wgmma (sm_90), 128-byte swizzle:
//   bits [0,14) start address >> 4, [16,30) leading byte offset >> 4, [32,46) stride byte offset >> 4,
//   [49,52) base offset (0: the 1024 B swizzle atom is 1024 B aligned), [62,64) layout type, 1 = 128B.
// K-major SW128 operand: SBO = 1024 B (next 8-row group), LBO unused (1); a k16 step adds 32 B to
// the start address inside the 128 B row; the next 64-column page starts rows*128 B further.
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t smem_byte_addr, uint32_t sbo_bytes = 1024,
                                                    uint32_t lbo_bytes = 16) {
    uint64_t desc = 0;
    desc |= static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4);
    desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
    desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
    desc |= uint64_t{1} << 62;
    return desc;
}

// ---- wgmma instructions, for any N of the operand tables (16..256, step 16) -----------------
//
// Accumulator register i of thread t (warp w = t/32 of the warpgroup, g = lane/4, q = lane%4) is
// D[16w + g + 8*((i%4)/2)][8*(i/4) + 2q + (i%2)]: the n8 tiles of mma.sync's m16n8 layout in
// order, so d[4j..4j+3] is n8 tile j. scale_d = 0 overwrites D, 1 accumulates.

// D[64xN] (+)= A[64x16] * B[Nx16]^T: A and B in shared memory, both K-major (SW128 descriptors).
template <class E, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);

// D[64xN] (+)= A[64x16] * B[16xN]: A from registers (the m16k16 fragment of each warp: a0 = (g,
// 2q..2q+1), a1 = (g+8, 2q..), a2 = (g, 8+2q..), a3 = (g+8, 8+2q..)), B in shared memory MN-major
// (N contiguous; SW128 descriptor with LBO = the distance between 64-column pages, SBO = 1024).
template <class E, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

#if FLASHATTN_SM90A_BODY
#define FLASHATTN_WGMMA_SS(N, E, T)                                                                     \
    template <>                                                                                        \
    __device__ __forceinline__ void wgmma_ss<E, N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                   int scale_d) {                                      \
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " FLASHATTN_WGMMA_N##N##_IN2                \
                     ", 0;\n\twgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " "               \
                     FLASHATTN_WGMMA_N##N##_REGS ", " FLASHATTN_WGMMA_N##N##_IN0                         \
                     ", " FLASHATTN_WGMMA_N##N##_IN1 ", p, 1, 1, 0, 0;\n\t}"                              \
                     : FLASHATTN_WGMMA_N##N##_OPS(d)                                                   \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                          \
                     : "memory");                                                                      \
    }
// An RS wgmma function NAME<E, N>; TB: the tnspB bit ("1": B MN-major, "0": K-major).
#define FLASHATTN_WGMMA_RS_AS(NAME, N, E, T, TB)                                                        \
    template <>                                                                                        \
    __device__ __forceinline__ void NAME<E, N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc_b, \
                                               int scale_d) {                                          \
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " FLASHATTN_WGMMA_N##N##_IN5                \
                     ", 0;\n\twgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " "               \
                     FLASHATTN_WGMMA_N##N##_REGS ", {" FLASHATTN_WGMMA_N##N##_IN0 ", "                  \
                     FLASHATTN_WGMMA_N##N##_IN1 ", " FLASHATTN_WGMMA_N##N##_IN2 ", "                    \
                     FLASHATTN_WGMMA_N##N##_IN3 "}, " FLASHATTN_WGMMA_N##N##_IN4 ", p, 1, 1, " TB ";\n\t}" \
                     : FLASHATTN_WGMMA_N##N##_OPS(d)                                                   \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)           \
                     : "memory");                                                                      \
    }
#define FLASHATTN_WGMMA_RS(N, E, T) FLASHATTN_WGMMA_RS_AS(wgmma_rs, N, E, T, "1")
#else
#define FLASHATTN_WGMMA_SS(N, E, T)                                                                     \
    template <>                                                                                        \
    __device__ __forceinline__ void wgmma_ss<E, N>(float(&)[N / 2], uint64_t, uint64_t, int) {        \
        FLASHATTN_SM90A_TRAP();                                                                        \
    }
#define FLASHATTN_WGMMA_RS_AS(NAME, N, E, T, TB)                                                        \
    template <>                                                                                        \
    __device__ __forceinline__ void NAME<E, N>(float(&)[N / 2], const uint32_t(&)[4], uint64_t, int) { \
        FLASHATTN_SM90A_TRAP();                                                                        \
    }
#define FLASHATTN_WGMMA_RS(N, E, T) FLASHATTN_WGMMA_RS_AS(wgmma_rs, N, E, T, "1")
#endif
#define FLASHATTN_WGMMA_BOTH_TYPES(N)          \
    FLASHATTN_WGMMA_SS(N, cuda::Bf16, "bf16") \
    FLASHATTN_WGMMA_SS(N, cuda::Fp16, "f16")  \
    FLASHATTN_WGMMA_RS(N, cuda::Bf16, "bf16") \
    FLASHATTN_WGMMA_RS(N, cuda::Fp16, "f16")
// The N the kernels use: key tiles of 64..128 for S = Q K^T, padded head dims for O += P V, and
// 32 for the FA3 backward's S^T = K Q^T in its split layout (each warpgroup half the queries).
FLASHATTN_WGMMA_BOTH_TYPES(32)
FLASHATTN_WGMMA_BOTH_TYPES(64)
FLASHATTN_WGMMA_BOTH_TYPES(80)
FLASHATTN_WGMMA_BOTH_TYPES(96)
FLASHATTN_WGMMA_BOTH_TYPES(112)
FLASHATTN_WGMMA_BOTH_TYPES(128)
FLASHATTN_WGMMA_BOTH_TYPES(176)
FLASHATTN_WGMMA_BOTH_TYPES(192)
FLASHATTN_WGMMA_BOTH_TYPES(256)
// n40 for S = Q K^T and dP = dO V^T of the FA3 backward's 80-key layout (fa3_bwd_wide.cuh: each
// warpgroup 40 of the CTA's keys).
FLASHATTN_WGMMA_SS(40, cuda::Bf16, "bf16")
FLASHATTN_WGMMA_SS(40, cuda::Fp16, "f16")
// n16 for S = Q K^T alone: the FA3 sink kernel's sink tile (fa3_mainloop.cuh sink_tile_narrow).
FLASHATTN_WGMMA_SS(16, cuda::Bf16, "bf16")
FLASHATTN_WGMMA_SS(16, cuda::Fp16, "f16")
#undef FLASHATTN_WGMMA_BOTH_TYPES
#undef FLASHATTN_WGMMA_SS
#undef FLASHATTN_WGMMA_RS

// D[64xN] (+)= A[64x16] * B[16xN], both operands in shared memory (SW128 descriptors), each K-major
// (0) or MN-major (1): kTA, kTB are the instruction's transpose bits (wgmma_ss is <0, 0>). The FA3
// backward's forms: <64, 1, 1> for dQ = dS K with dS^T and K stored key-major, <80, 1, 0> for the
// 80-key layout's dV^T = dO^T P and dK^T = Q^T dS (A read transposed from the row-major Q / dO
// pages, B the [80 keys][64 queries] P^T / dS^T page).
template <class E, int N, int kTA, int kTB>
__device__ __forceinline__ void wgmma_ss_t(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);

#if FLASHATTN_SM90A_BODY
#define FLASHATTN_WGMMA_SS_T(N, E, T, TA, TB)                                                                \
    template <>                                                                                            \
    __device__ __forceinline__ void wgmma_ss_t<E, N, TA, TB>(float(&d)[N / 2], uint64_t desc_a,            \
                                                             uint64_t desc_b, int scale_d) {               \
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " FLASHATTN_WGMMA_N##N##_IN2                      \
                     ", 0;\n\twgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " "                     \
                     FLASHATTN_WGMMA_N##N##_REGS ", " FLASHATTN_WGMMA_N##N##_IN0                             \
                     ", " FLASHATTN_WGMMA_N##N##_IN1 ", p, 1, 1, " #TA ", " #TB ";\n\t}"                       \
                     : FLASHATTN_WGMMA_N##N##_OPS(d)                                                       \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                              \
                     : "memory");                                                                          \
    }
#else
#define FLASHATTN_WGMMA_SS_T(N, E, T, TA, TB)                                                                \
    template <>                                                                                            \
    __device__ __forceinline__ void wgmma_ss_t<E, N, TA, TB>(float(&)[N / 2], uint64_t, uint64_t, int) {   \
        FLASHATTN_SM90A_TRAP();                                                                            \
    }
#endif
FLASHATTN_WGMMA_SS_T(64, cuda::Bf16, "bf16", 1, 1)
FLASHATTN_WGMMA_SS_T(64, cuda::Fp16, "f16", 1, 1)
FLASHATTN_WGMMA_SS_T(80, cuda::Bf16, "bf16", 1, 0)
FLASHATTN_WGMMA_SS_T(80, cuda::Fp16, "f16", 1, 0)
#undef FLASHATTN_WGMMA_SS_T

// Keeps the compiler from defining a wgmma A-fragment register inside the issue window (as
// fence_operands for the accumulators): an ordinary instruction writing a wgmma operand between
// wgmma.fence and the wgmma makes ptxas serialize the wgmmas (C7513).
__device__ __forceinline__ void fence_operands(uint32_t (&r)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// D[64xN] (+)= A[64x16] * B[Nx16]^T: A from registers (wgmma_rs's fragment), B in shared memory
// K-major (wgmma_ss's B: tnspB = 0). FA3's ALiBi column ramp (fa3_mainloop.cuh): a static
// [keys x 16] block read as one more k16 slice of S = Q K^T.
template <class E, int N>
__device__ __forceinline__ void wgmma_rs_kmajor(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                                int scale_d);

#define FLASHATTN_WGMMA_RS_K(N, E, T) FLASHATTN_WGMMA_RS_AS(wgmma_rs_kmajor, N, E, T, "0")
// The key tiles of the FA3 forward kernels that take the ramp (fa3_config.h: 96, 128, and 176 keys
// in head dim 64's wide tile).
FLASHATTN_WGMMA_RS_K(96, cuda::Bf16, "bf16")
FLASHATTN_WGMMA_RS_K(96, cuda::Fp16, "f16")
FLASHATTN_WGMMA_RS_K(128, cuda::Bf16, "bf16")
FLASHATTN_WGMMA_RS_K(128, cuda::Fp16, "f16")
FLASHATTN_WGMMA_RS_K(176, cuda::Bf16, "bf16")
FLASHATTN_WGMMA_RS_K(176, cuda::Fp16, "f16")
#undef FLASHATTN_WGMMA_RS_K
#undef FLASHATTN_WGMMA_RS_AS

}  // namespace cuda
}  // namespace flashattn
