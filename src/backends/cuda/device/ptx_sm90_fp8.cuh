// The FP8 (E4M3) part of the Hopper PTX vocabulary (issue 17), beside ptx_sm90.cuh whose
// accumulator operand tables it reuses: wgmma m64nNk32 with E4M3 operands (SS: both K-major from
// shared memory; RS: A from registers), the fp32 -> E4M3 conversion that packs four values into
// one A register, and the generic -> async proxy fence for operands written by ordinary stores.
// sm_90a only (other targets trap, as in ptx_sm90.cuh).
//
// E4M3 wgmma has no transpose flags: both operands must be K-major in shared memory, so V is
// transposed into a K-major tile before O += P V. A k32 step is 32 bytes, as a bf16 k16 step, so
// the SW128 descriptors and their +32 B per step are those of the 16-bit kernels.
//
// The A fragment of an 8-bit m64nNk32 (per warp, rows 16w..16w+15; g = lane/4, q = lane%4):
// a0 = row g, k 4q..4q+3 (lowest byte = lowest k); a1 = row g+8, same k; a2 = row g, k 16+4q..;
// a3 = row g+8, k 16+4q... The fp32 accumulator of S gives thread (g, q) columns 2q, 2q+1 of each
// n8 tile instead. Rather than shuffling P between lanes, pack_p_fragment() puts the values the
// thread has into the k slots it owns, and the V tile is permuted to match (fp8_p_column):
// logical k = 16h + 4q + u of a 32-key step holds P's column 16h + 8(u/2) + 2q + (u%2). Any
// permutation of the reduction index applied to both operands leaves P V unchanged.
#pragma once

#include <cstdint>

#include "backends/cuda/device/ptx_sm90.cuh"

namespace flashattn {
namespace cuda {

struct E4m3 {};

// The physical key (within a 32-key step) whose P value sits at logical k slot `k` of the A
// fragment pack_p_fragment() builds; V's row for slot k must be this key.
__host__ __device__ constexpr int fp8_p_column(int k) {
    return 16 * (k / 16) + 8 * ((k % 4) / 2) + 2 * ((k % 16) / 4) + (k % 2);
}

// Generic-proxy stores to shared memory made visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if FLASHATTN_SM90A_BODY
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    FLASHATTN_SM90A_TRAP();
#endif
}

// Four floats to four E4M3 bytes (round to nearest even, saturating to +-448), x0 in the lowest.
__device__ __forceinline__ uint32_t cvt_e4m3x4(float x0, float x1, float x2, float x3) {
#if FLASHATTN_SM90A_BODY
    uint32_t out;
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"  // upper byte from the first source
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(out)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return out;
#else
    (void)x0, (void)x1, (void)x2, (void)x3;
    FLASHATTN_SM90A_TRAP();
    return 0;
#endif
}

// The A fragment of k-step t (keys 32t..32t+31) from the fp32 accumulator s of a 64xN S tile
// (each value times p_scale before the cast), in the permuted order described above.
template <int kRegs>
__device__ __forceinline__ void pack_p_fragment(const float (&s)[kRegs], int t, float p_scale, uint32_t (&a)[4]) {
    const int b = 16 * t;
    a[0] = cvt_e4m3x4(s[b + 0] * p_scale, s[b + 1] * p_scale, s[b + 4] * p_scale, s[b + 5] * p_scale);
    a[1] = cvt_e4m3x4(s[b + 2] * p_scale, s[b + 3] * p_scale, s[b + 6] * p_scale, s[b + 7] * p_scale);
    a[2] = cvt_e4m3x4(s[b + 8] * p_scale, s[b + 9] * p_scale, s[b + 12] * p_scale, s[b + 13] * p_scale);
    a[3] = cvt_e4m3x4(s[b + 10] * p_scale, s[b + 11] * p_scale, s[b + 14] * p_scale, s[b + 15] * p_scale);
}

// D[64xN] (+)= A[64x32] * B[Nx32]^T, E4M3, both K-major in shared memory (SW128 descriptors).
template <int N>
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
// D[64xN] (+)= A[64x32] * B[Nx32]^T, A from registers (the fragment above), B K-major in smem.
template <int N>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

#if FLASHATTN_SM90A_BODY
#define FLASHATTN_WGMMA_E4M3(N)                                                                          \
    template <>                                                                                         \
    __device__ __forceinline__ void wgmma_ss_e4m3<N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                                     int scale_d) {                                      \
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " FLASHATTN_WGMMA_N##N##_IN2                 \
                     ", 0;\n\twgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                 \
                     FLASHATTN_WGMMA_N##N##_REGS ", " FLASHATTN_WGMMA_N##N##_IN0                          \
                     ", " FLASHATTN_WGMMA_N##N##_IN1 ", p, 1, 1;\n\t}"                                     \
                     : FLASHATTN_WGMMA_N##N##_OPS(d)                                                    \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d)                                           \
                     : "memory");                                                                       \
    }                                                                                                   \
    template <>                                                                                         \
    __device__ __forceinline__ void wgmma_rs_e4m3<N>(float(&d)[N / 2], const uint32_t(&a)[4],          \
                                                     uint64_t desc_b, int scale_d) {                     \
        asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " FLASHATTN_WGMMA_N##N##_IN5                 \
                     ", 0;\n\twgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 "                 \
                     FLASHATTN_WGMMA_N##N##_REGS ", {" FLASHATTN_WGMMA_N##N##_IN0 ", "                   \
                     FLASHATTN_WGMMA_N##N##_IN1 ", " FLASHATTN_WGMMA_N##N##_IN2 ", "                     \
                     FLASHATTN_WGMMA_N##N##_IN3 "}, " FLASHATTN_WGMMA_N##N##_IN4 ", p, 1, 1;\n\t}"         \
                     : FLASHATTN_WGMMA_N##N##_OPS(d)                                                    \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)            \
                     : "memory");                                                                       \
    }
#else
#define FLASHATTN_WGMMA_E4M3(N)                                                                          \
    template <>                                                                                         \
    __device__ __forceinline__ void wgmma_ss_e4m3<N>(float(&)[N / 2], uint64_t, uint64_t, int) {       \
        FLASHATTN_SM90A_TRAP();                                                                         \
    }                                                                                                   \
    template <>                                                                                         \
    __device__ __forceinline__ void wgmma_rs_e4m3<N>(float(&)[N / 2], const uint32_t(&)[4], uint64_t,  \
                                                     int) {                                             \
        FLASHATTN_SM90A_TRAP();                                                                         \
    }
#endif
// Key tiles of S = Q K^T (128, and 160 / 192 / 224 for the wider tiles, kFp8TileN) and the head
// dims of O += P V.
FLASHATTN_WGMMA_E4M3(64)
FLASHATTN_WGMMA_E4M3(128)
FLASHATTN_WGMMA_E4M3(160)
FLASHATTN_WGMMA_E4M3(192)
FLASHATTN_WGMMA_E4M3(224)
FLASHATTN_WGMMA_E4M3(256)
#undef FLASHATTN_WGMMA_E4M3

// Shared loads and stores by 32-bit shared-window address, for the FP8 producer warpgroup at 24
// registers (its mbarrier and TMA forms are ptx_sm90.cuh's `_s` ones).
__device__ __forceinline__ uint32_t ld_volatile_shared_u32(uint32_t addr) {
    uint32_t v = 0;
#if FLASHATTN_SM90A_BODY
    asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
#else
    (void)addr; FLASHATTN_SM90A_TRAP();
#endif
    return v;
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
#if FLASHATTN_SM90A_BODY
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
#else
    (void)addr; (void)v; FLASHATTN_SM90A_TRAP();
#endif
}

// A shared store of v0, v1 under a predicate that is false at run time (`never`), placed just
// before a wgmma_wait: ptxas keeps shared-memory accesses in program order with the wgmma wait, so
// whatever computes v0 and v1 is scheduled ahead of the wait. Without it ptxas put the wait
// (WARPGROUP.DEPBAR) first in its basic block, ahead of computation that does not need it (the
// FP8 kernel's softmax, under a P V it should overlap). Costs one predicated-off instruction;
// `addr` must be a harmless shared word in case `never` is ever true.
__device__ __forceinline__ void order_before_wgmma_wait(float v0, float v1, bool never, uint32_t addr) {
#if FLASHATTN_SM90A_BODY
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %0, 0;\n\t@q st.shared.v2.f32 [%1], {%2, %3};\n\t}" ::"r"(
                     static_cast<uint32_t>(never)),
                 "r"(addr), "f"(v0), "f"(v1)
                 : "memory");
#else
    (void)v0; (void)v1; (void)never; (void)addr; FLASHATTN_SM90A_TRAP();
#endif
}

}  // namespace cuda
}  // namespace flashattn
