// The one inline-PTX vocabulary of the CUDA attention kernels (FA1 on sm_75+, FA2 on sm_80+, FA3 on
// sm_90a; the Hopper-only wrappers - wgmma, TMA, mbarrier - are in ptx_sm90.cuh on top of this):
// the element-type tags, mma.sync (m16n8k16 and m16n8k8), ldmatrix, cp.async, fp32 -> 16-bit pair
// packing, plain vector accesses to shared and global memory, and fast exp2 / log2 / reciprocal.
// Each group below says which architecture it needs. Every function is an inline wrapper that is
// emitted only where it is called, so including this header is fine for any target: a kernel
// compiled for sm_75 just must not call the sm_80+ groups.
//
// Fragment conventions (g = lane / 4, t = lane % 4), from the PTX ISA's mma.sync descriptions for
// 16-bit inputs. In every packed pair the lower 16 bits hold the lower column (or k).
//   m16n8k16:  A 16x16 (row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//              B 16x8  (col): b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8.., n = g)
//   m16n8k8:   A 16x8  (row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..2t+1)
//              B 8x8   (col): b0 = (k = 2t..2t+1, n = g)
//   both:      C 16x8  (f32): c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// So the C fragment of one n8 tile, packed as (c0,c1), (c2,c3), is an m16n8k8 A fragment, and two
// neighbouring n8 tiles form an m16n8k16 A fragment: P never leaves registers between the two
// products of attention.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {

// Element-type tags: the kernels are templated on these rather than on __half / __nv_bfloat16 so
// that host code can name them without the CUDA fp16 headers.
struct Fp16 {};
struct Bf16 {};

// Any architecture: the 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------
// sm_80+: mma.sync m16n8k16, D = A * B + D, fp32 accumulators (FA2).
template <class E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<Fp16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<Bf16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---------------------------------------------------------------------------------------------
// fp16: sm_75+, bf16: sm_80+: mma.sync m16n8k8, D = A * B + D, fp32 accumulators (FA1, whose
// split of a k16 ldmatrix fragment into two k8 halves is why A comes as two registers).
template <class E>
__device__ __forceinline__ void mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0);

template <>
__device__ __forceinline__ void mma_1688<Fp16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

template <>
__device__ __forceinline__ void mma_1688<Bf16>(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 has no bf16 tensor-core instruction; the host never launches bf16 kernels there.
    (void)d; (void)a0; (void)a1; (void)b0;
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// ---------------------------------------------------------------------------------------------
// sm_80+ (cvt.rn.{f16x2,bf16x2}.f32), with an sm_75 fallback: pack two fp32 values into one
// 32-bit register of 16-bit values (round to nearest even), lo in bits 0..15.
template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<Fp16>(float lo, float hi) {
    uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // sm_75 has no paired conversion: convert each half, then pack.
    asm("{\n\t.reg .f16 l, h;\n\tcvt.rn.f16.f32 l, %1;\n\tcvt.rn.f16.f32 h, %2;\n\t"
        "mov.b32 %0, {l, h};\n}\n"
        : "=r"(r)
        : "f"(lo), "f"(hi));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

template <>
__device__ __forceinline__ uint32_t pack2<Bf16>(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // Round-to-nearest-even by integer arithmetic (only reachable from sm_75 code the host never
    // runs: there are no bf16 kernels on sm_75).
    auto one = [](float f) -> uint32_t {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    };
    return one(lo) | (one(hi) << 16);
#else
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// A value every lane of the (converged, whole) warp holds alike, re-read from lane 0 so that ptxas
// knows it is warp-uniform: a branch on it around mma.sync then needs no WARPSYNC, and the mma of
// skipped column groups become predicated HMMAs that ptxas schedules across (FA2 backward: a
// per-warp head-dim bound had cost 63 WARPSYNCs per query step at d128).
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// ---------------------------------------------------------------------------------------------
// sm_75+: ldmatrix, four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i and
// register i receives matrix i (row lane/4, columns 2*(lane%4)..+1), or its transpose with .trans
// (rows 2*(lane%4)..+1, column lane/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// sm_80+: cp.async, 16 bytes global -> shared through L2 only. src_bytes < 16 zero-fills the rest
// (src_bytes == 0 reads nothing and writes 16 zero bytes).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// 4 bytes (cp.async.ca: sm_80 copies words through L1); src_bytes 0 writes a zero word.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void *src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Any architecture: plain shared-memory accesses through 32-bit shared addresses.
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// The same for four fp32 values (FA1's reduction of partial products).
__device__ __forceinline__ void st_shared_v4(uint32_t addr, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
}

__device__ __forceinline__ float4 ld_shared_v4_f32(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// Any architecture: 16-byte global accesses (the address must be 16-byte aligned).
// The store is written out because the compiler splits a uint4 store through a 16-bit element
// pointer into four 4-byte stores when it cannot see that alignment.
__device__ __forceinline__ void st_global_v4(void *p, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w)
                 : "memory");
}

// Load that bypasses L1 (.cg: data streamed into shared memory once; where cp.async is missing).
__device__ __forceinline__ uint4 ld_global_cg_v4(const void *p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// fp32 reduction of two adjacent values into global memory (8-byte aligned): one vector red on
// sm_90+ (red.global.add.v2.f32), two scalar reds below. Nothing is returned, so nothing waits.
__device__ __forceinline__ void red_add_f32x2(float *p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1,%2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// fp32 reduction of four adjacent values into global memory (16-byte aligned): one vector red on
// sm_90+ (red.global.add.v4.f32), four scalar reds below.
__device__ __forceinline__ void red_add_f32x4(float *p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
    atomicAdd(p + 2, c);
    atomicAdd(p + 3, d);
#endif
}

// Semaphore reads at GPU scope (sm_70+): a relaxed poll and an acquiring one.
__device__ __forceinline__ int ld_relaxed_gpu(const int *p) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---------------------------------------------------------------------------------------------
// Any architecture: fast math. ex2.approx(-inf) = +0, which the online softmax relies on.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float fast_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 over the whole range (tanh.approx, sm_75+,
// has a 2^-11 relative error, too coarse once multiplied by a large soft cap). Saturates to +-1.
__device__ __forceinline__ float tanh_accurate(float x) {
    const float e = fast_exp2(x * 2.8853900817779268f);  // 2*log2(e)
    return 1.0f - 2.0f * fast_rcp(e + 1.0f);
}

}  // namespace cuda
}  // namespace flashattn
