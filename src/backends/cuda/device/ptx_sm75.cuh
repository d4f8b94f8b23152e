// Inline-PTX wrappers for the warp-level building blocks that exist on sm_75 (Turing) and newer:
// mma.sync m16n8k8 (fp16 in, fp32 accumulate; bf16 in on sm_80+), ldmatrix (plain and .trans),
// fp32 -> 16-bit pair packing and the fast exp2 / log2 / reciprocal. Nothing here needs cp.async,
// so every function compiles for compute_75. Used by the FA1 backend (src/backends/cuda/fa1/).
//
// Fragment conventions of mma.sync.aligned.m16n8k8.row.col (g = lane / 4, t = lane % 4), from the
// PTX ISA's description of the m16n8k8 shape for 16-bit inputs:
//   A 16x8 (row, 2 x b32): a0 = (row g,   cols 2t..2t+1), a1 = (row g+8, cols 2t..2t+1)
//   B 8x8  (col, 1 x b32): b0 = (k = 2t..2t+1, n = g)
//   C 16x8 (4 x f32):      c0,c1 = (row g, cols 2t, 2t+1), c2,c3 = (row g+8, cols 2t, 2t+1)
// In every packed pair the lower 16 bits hold the lower column (or k). The C fragment of one n8
// tile therefore is, after packing (c0,c1) and (c2,c3), exactly an A fragment for a k8 step: the
// probabilities P never leave registers between the two products of attention.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {
namespace sm75 {

// Element-type tags: kernels are templated on these so host code needs no fp16 headers.
struct Half {};
struct BHalf {};

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------------------------
// D = A * B + D, m16n8k8, fp32 accumulators.
template <class E>
__device__ __forceinline__ void mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0);

template <>
__device__ __forceinline__ void mma_1688<Half>(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

template <>
__device__ __forceinline__ void mma_1688<BHalf>(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t b0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
#else
    // sm_75 has no bf16 tensor-core instruction; the host never launches bf16 kernels there.
    (void)d; (void)a0; (void)a1; (void)b0;
    __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Two fp32 values -> one register of two 16-bit values (round to nearest even); lo in bits 0..15.
template <class E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<Half>(float lo, float hi) {
    uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
    // The paired conversion is sm_80+; sm_75 converts each half and packs them.
    asm("{\n\t.reg .f16 l, h;\n\tcvt.rn.f16.f32 l, %1;\n\tcvt.rn.f16.f32 h, %2;\n\t"
        "mov.b32 %0, {l, h};\n}\n"
        : "=r"(r)
        : "f"(lo), "f"(hi));
#endif
    return r;
}

template <>
__device__ __forceinline__ uint32_t pack2<BHalf>(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    // Round-to-nearest-even by integer arithmetic (only reachable from code the host never runs).
    auto one = [](float f) -> uint32_t {
        const uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    };
    return one(lo) | (one(hi) << 16);
#endif
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: four 8x8 b16 matrices. Lanes 8i..8i+7 give the shared addresses of the 8 rows of
// matrix i; register i receives matrix i as (row lane/4, cols 2*(lane%4)..+1), or with .trans
// (rows 2*(lane%4)..+1, col lane/4).
__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                        uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                              uint32_t &r3, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// Plain memory accesses (shared through 32-bit shared-window addresses).
__device__ __forceinline__ void sts_128(uint32_t addr, const uint4 &v) {
    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ void sts_f32x4(uint32_t addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c),
                 "f"(d)
                 : "memory");
}

__device__ __forceinline__ float4 lds_f32x4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// 16-byte global load that bypasses L1 (the data is streamed into shared memory once).
__device__ __forceinline__ uint4 ldg_128_cg(const void *p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// ---------------------------------------------------------------------------------------------
// Fast math. ex2.approx(-inf) = +0, which the online softmax relies on.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error ~1e-7 everywhere, saturates to +-1 (tanh.approx
// exists only from sm_75 on and has a 2^-11 relative error, too coarse once scaled by a soft cap).
__device__ __forceinline__ float tanh_acc(float x) {
    const float e = ex2(x * 2.8853900817779268f);  // 2 * log2(e)
    return 1.0f - 2.0f * rcp(e + 1.0f);
}

}  // namespace sm75
}  // namespace cuda
}  // namespace flashattn
