// Device-side inline-PTX wrappers for the Hopper (sm_90a) path: mbarrier, TMA
// (cp.async.bulk.tensor), async-proxy fences, wgmma ordering and the SW128 smem matrix
// descriptor. Every body is guarded by __CUDA_ARCH_FEAT_SM90_ALL (compile with
// -gencode arch=compute_90a,code=sm_90a); other targets get a trap so misuse is loud.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90A_BODY 1
#else
#define FLASHATTN_SM90A_BODY 0
#endif

#if defined(__CUDA_ARCH__)
#define FLASHATTN_SM90A_TRAP() __trap()
#else
#define FLASHATTN_SM90A_TRAP() ((void)0)
#endif

namespace flashattn {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
#if FLASHATTN_SM90A_BODY
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar; (void)count; FLASHATTN_SM90A_TRAP();
#endif
}

// Makes mbarrier.init visible to other threads and to the async proxy (TMA); follow with a
// block-wide barrier (__syncthreads) before any other thread or TMA uses the barrier.
__device__ __forceinline__ void fence_mbar_init() {
#if FLASHATTN_SM90A_BODY
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
#if FLASHATTN_SM90A_BODY
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar; (void)bytes; FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#if FLASHATTN_SM90A_BODY
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#else
    (void)bar; FLASHATTN_SM90A_TRAP();
#endif
}

// One try: true iff the phase with parity `parity` has completed.
__device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, uint32_t parity) {
#if FLASHATTN_SM90A_BODY
    uint32_t ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return ok != 0;
#else
    (void)bar; (void)parity; FLASHATTN_SM90A_TRAP();
    return false;
#endif
}

// Spins until the phase with parity `parity` completes.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    while (!mbar_try_wait(bar, parity)) {
    }
}

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
#if FLASHATTN_SM90A_BODY
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#else
    (void)tmap; FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void tma_load_2d(void *dst_smem, const void *tmap, uint64_t *bar, int32_t c0, int32_t c1) {
#if FLASHATTN_SM90A_BODY
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_addr(dst_smem)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
#else
    (void)dst_smem; (void)tmap; (void)bar; (void)c0; (void)c1; FLASHATTN_SM90A_TRAP();
#endif
}

__device__ __forceinline__ void tma_load_3d(void *dst_smem, const void *tmap, uint64_t *bar, int32_t c0, int32_t c1,
                                            int32_t c2) {
#if FLASHATTN_SM90A_BODY
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_addr(dst_smem)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
#else
    (void)dst_smem; (void)tmap; (void)bar; (void)c0; (void)c1; (void)c2; FLASHATTN_SM90A_TRAP();
#endif
}

// Orders this thread's generic-proxy shared-memory accesses before later async-proxy accesses
// (TMA, wgmma) once the hand-off barrier is passed.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if FLASHATTN_SM90A_BODY
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// D[64x64] (+)= A[64x16] * B[64x16]^T, both operands K-major in shared memory (SS), bf16 in,
// fp32 accumulate. scale_d = 0 overwrites D, 1 accumulates. Register i of thread t (warp w = t/32,
// g = lane/4, q = lane%4) is D[16w + g + 8*((i%4)/2)][8*(i/4) + 2q + (i%2)].
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
#if FLASHATTN_SM90A_BODY
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "setp.ne.b32 p, %34, 0;\n\t"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n\t}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d)
        : "memory");
#else
    (void)d; (void)desc_a; (void)desc_b; (void)scale_d; FLASHATTN_SM90A_TRAP();
#endif
}

}  // namespace sm90
}  // namespace flashattn
