// The CPU kernels' SIMD vocabulary, shared by the forward (cpu_kernel.cpp) and the backward
// (cpu_backward.cpp): vectors of 8 floats written with GCC/Clang vector extensions, so the hot loops
// are SIMD at -O2 without relying on the auto-vectoriser; the register-blocked matrix product both
// passes build on; and the run-time choice between the baseline and the AVX2+FMA variants.
//
// Everything here is always inlined: each pass compiles its bodies twice (baseline ISA and
// target("avx2,fma")), and the helpers must take the instruction set of the body they land in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if !defined(__GNUC__) && !defined(__clang__)
#error "the CPU backend needs the GCC/Clang vector extensions"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define FLASHATTN_CPU_X86 1
#else
#define FLASHATTN_CPU_X86 0
#endif

#define FLASHATTN_CPU_INLINE inline __attribute__((always_inline))

namespace flashattn {
namespace cpu {

constexpr int kVector = 8;  // floats per SIMD vector

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));

static_assert(sizeof(vf) == kVector * sizeof(float), "vector width");

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Scratch arrays start on 64-byte boundaries: whole cache lines, so no two threads' slots (nor two
// arrays of one slot) share a line.
constexpr size_t kScratchAlign = 16;  // floats
constexpr size_t align_floats(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Vectors are passed by reference throughout: a 32-byte vector passed by value changes the ABI
// between the two ISA variants, and every helper is inlined anyway.
FLASHATTN_CPU_INLINE void vload(vf &r, const float *p) { std::memcpy(&r, p, sizeof r); }
FLASHATTN_CPU_INLINE void vstore(float *p, const vf &r) { std::memcpy(p, &r, sizeof r); }
FLASHATTN_CPU_INLINE void vsplat(vf &r, float x) { r = vf{x, x, x, x, x, x, x, x}; }

// C[MR x n] = (accumulate ? C : 0) + A[MR x kdim] B[kdim x n], with A(i, k) = a[i * a_row + k *
// a_col] (a_col 1: row-major; a_row 1: a transposed tile), B and C row-major with leading
// dimensions ldb and ldc, n a multiple of kVector. MR rows x 16 columns (WIDE) or x 8 columns of C
// live in registers. Each element of C is summed over k in ascending order whatever the path: the
// reduction order is fixed.
template <int MR, bool WIDE>
FLASHATTN_CPU_INLINE void gemm_rows(int n, int kdim, const float *a, int64_t a_row, int64_t a_col,
                                    const float *b, int ldb, float *c, int ldc, bool accumulate) {
    int j = 0;
    for (; WIDE && j + 2 * kVector <= n; j += 2 * kVector) {
        vf acc0[MR], acc1[MR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            if (accumulate) {
                vload(acc0[r], c + r * ldc + j);
                vload(acc1[r], c + r * ldc + j + kVector);
            } else {
                acc0[r] = vf{};
                acc1[r] = vf{};
            }
        }
        const float *bp = b + j;
        for (int k = 0; k < kdim; ++k, bp += ldb) {
            vf b0, b1;
            vload(b0, bp);
            vload(b1, bp + kVector);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                const float av = a[r * a_row + k * a_col];
                acc0[r] += av * b0;
                acc1[r] += av * b1;
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            vstore(c + r * ldc + j, acc0[r]);
            vstore(c + r * ldc + j + kVector, acc1[r]);
        }
    }
    for (; j < n; j += kVector) {  // one vector of columns at a time
        vf acc[MR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            if (accumulate) {
                vload(acc[r], c + r * ldc + j);
            } else {
                acc[r] = vf{};
            }
        }
        const float *bp = b + j;
        for (int k = 0; k < kdim; ++k, bp += ldb) {
            vf b0;
            vload(b0, bp);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) acc[r] += a[r * a_row + k * a_col] * b0;
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) vstore(c + r * ldc + j, acc[r]);
    }
}

// The register blocking of one instruction set: MR rows x (WIDE ? 16 : 8) columns of C. AVX2 has
// 16 registers of 8 floats: 6 x 16 accumulators use 12 and give enough independent multiply-add
// chains to cover the FMA latency. The baseline (SSE2) holds a vector of 8 in two of its 16
// registers: 4 x 8 accumulators use 8.
struct BlockingAvx2 {
    static constexpr int kRows = 6;
    static constexpr bool kWide = true;
};
struct BlockingGeneric {
    static constexpr int kRows = 4;
    static constexpr bool kWide = false;
};

// C[m x n] = (accumulate ? C : 0) + A[m x kdim] B[kdim x n], A addressed as in gemm_rows, in
// blocks of BL::kRows rows and one block of the rows left over.
template <class BL>
FLASHATTN_CPU_INLINE void gemm(int m, int n, int kdim, const float *a, int64_t a_row, int64_t a_col,
                               const float *b, int ldb, float *c, int ldc, bool accumulate) {
    constexpr int MR = BL::kRows;
    constexpr bool W = BL::kWide;
    int r = 0;
    for (; r + MR <= m; r += MR) {
        gemm_rows<MR, W>(n, kdim, a + r * a_row, a_row, a_col, b, ldb, c + r * ldc, ldc, accumulate);
    }
    const float *ar = a + r * a_row;
    float *cr = c + r * ldc;
    switch (m - r) {
    case 5: gemm_rows<5, W>(n, kdim, ar, a_row, a_col, b, ldb, cr, ldc, accumulate); break;
    case 4: gemm_rows<4, W>(n, kdim, ar, a_row, a_col, b, ldb, cr, ldc, accumulate); break;
    case 3: gemm_rows<3, W>(n, kdim, ar, a_row, a_col, b, ldb, cr, ldc, accumulate); break;
    case 2: gemm_rows<2, W>(n, kdim, ar, a_row, a_col, b, ldb, cr, ldc, accumulate); break;
    case 1: gemm_rows<1, W>(n, kdim, ar, a_row, a_col, b, ldb, cr, ldc, accumulate); break;
    default: break;
    }
}

// Whether to run the AVX2+FMA variants: the machine has both, and FLASHATTN_CPU_SIMD=generic does
// not force the baseline (for testing it on AVX2 machines). Decided once per process, so the
// forward and the backward always run the same variant.
inline bool use_avx2_fma() {
    static const bool avx2_fma = [] {
        const char *force = std::getenv("FLASHATTN_CPU_SIMD");
        if (force != nullptr && std::strcmp(force, "generic") == 0) return false;
#if FLASHATTN_CPU_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        return false;
#endif
    }();
    return avx2_fma;
}

}  // namespace cpu
}  // namespace flashattn
