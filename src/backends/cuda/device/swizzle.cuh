// The two swizzled shared-memory layouts of 16-bit tiles. Both apply the same XOR pattern to the
// 16-byte chunks of a row: inside a 128-byte span chunk c of row r sits at chunk c ^ (r % 8) (the
// TMA SWIZZLE_128B pattern), inside a 64-byte span at chunk c ^ ((r / 2) % 4). Eight consecutive
// rows read at one logical chunk (what one ldmatrix 8x8 matrix reads) then touch eight distinct
// 16-byte bank groups: no bank conflicts for ldmatrix, 16-byte stores or cp.async writes, or the
// epilogue's 4-byte fragment writes. They differ in where the spans of a row go:
//   SwizzledTile (FA2): column pages - all rows' first 64 columns, then the next 64, ... - the
//     layout a TMA box of 64 columns with SWIZZLE_128B writes (what FA3's tensor maps produce).
//   RowSwizzle (FA1): row-major, a row's spans contiguous, so each warp's private K/V slice and each
//     8-row Q group (which FA1 may place inside its reduction buffer) is one contiguous block.
// For rows of 64 or 32 columns (FA1's head dims 64 and 32) the two layouts are the same bytes:
// RowSwizzle<128> is one full page of SwizzledTile<R, 64> and RowSwizzle<64> is SwizzledTile<R, 32>.
// FA1 keeps RowSwizzle for all head dims: addressing its tiles through SwizzledTile (tried: per
// 8-row Q group and per warp K/V slice, CUDA 13.0) changed the SASS of every FA1 kernel, even where
// the bytes are the same, and made most of them worse (up to +15 registers, up to +328 instructions)
// for no bank-conflict gain.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {

// Column-page layout of a [kRows x kCols] tile, kCols a multiple of 32: full pages of 64 columns
// (128-byte rows) and, when kCols % 64 == 32, one trailing half page of 32 columns (64-byte rows).
template <int kRows, int kCols>
struct SwizzledTile {
    static_assert(kCols % 32 == 0, "tile width must be a multiple of 32 elements");
    static_assert(kRows % 8 == 0, "tile height must be a multiple of 8 rows");
    static constexpr int kFullPages = kCols / 64;
    static constexpr bool kHalfPage = (kCols % 64) != 0;
    static constexpr int kPageBytes = kRows * 128;
    static constexpr int kBytes = kRows * kCols * 2;
    static constexpr int kChunksPerRow = kCols / 8;

    // Byte offset of 16-byte chunk `c` (0 <= c < kCols/8) of row `r`.
    __host__ __device__ static constexpr uint32_t offset(int r, int c) {
        return (c >> 3) < kFullPages
                   ? static_cast<uint32_t>((c >> 3) * kPageBytes + r * 128 +
                                           (((c & 7) ^ (r & 7)) << 4))
                   : static_cast<uint32_t>(kFullPages * kPageBytes + r * 64 +
                                           (((c & 3) ^ ((r >> 1) & 3)) << 4));
    }

    // Fragment loads (ldmatrix) address row `row0 + lr` (row0 a multiple of 8, lr the lane's row
    // in 0..15) at chunk `2*kc + lb` (kc a compile-time pair index, lb the lane's bit). The lane
    // part is precomputed once with lane_base_full / lane_base_half; the per-instruction address is
    // then (lane_base ^ xor_term(kc)) + const_term(row0, kc): one LOP per ldmatrix.
    // `base` must be 128-byte aligned.
    __device__ static uint32_t lane_base_full(uint32_t base, int lr, int lb) {
        return base + lr * 128 + ((lb ^ (lr & 7)) << 4);
    }
    __device__ static uint32_t lane_base_half(uint32_t base, int lr, int lb) {
        return base + kFullPages * kPageBytes + lr * 64 + ((lb ^ ((lr >> 1) & 3)) << 4);
    }
    // kc = chunk pair index (logical chunk 2*kc + lb).
    __host__ __device__ static constexpr bool in_full_page(int kc) { return (kc >> 2) < kFullPages; }
    __host__ __device__ static constexpr uint32_t xor_term(int kc) {
        return in_full_page(kc) ? static_cast<uint32_t>((2 * kc) & 6) << 4
                                : static_cast<uint32_t>((2 * kc) & 2) << 4;
    }
    __host__ __device__ static constexpr uint32_t const_term(int row0, int kc) {
        return in_full_page(kc) ? static_cast<uint32_t>((kc >> 2) * kPageBytes + row0 * 128)
                                : static_cast<uint32_t>(row0 * 64);
    }
};

// Row-major layout of rows of kRowBytes bytes (a multiple of 64): the XOR span is 128 bytes (8
// chunks) when a row has at least 128 bytes, else 64 bytes (4 chunks); the XOR touches only the
// chunk bits inside a span, so a row address with zero bits there (rows of 64 or 128 bytes x 2^k
// from a 128-byte aligned base) can be combined with a chunk offset by XOR (see FA1's init_smem).
template <int kRowBytes>
struct RowSwizzle {
    static_assert(kRowBytes % 64 == 0, "rows of whole 64-byte spans");
    static constexpr int kSpan = kRowBytes >= 128 ? 8 : 4;  // chunks per XOR span

    // The XOR term of a row whose index is (a multiple of 8) + r8.
    __device__ static __forceinline__ int xor_of(int r8) { return kSpan == 8 ? r8 : ((r8 >> 1) & 3); }

    // Byte offset of 16-byte chunk c (0 <= c < kRowBytes/16) of row r.
    __device__ static __forceinline__ uint32_t offset(int r, int c) {
        const int x = kSpan == 8 ? (r & 7) : ((r >> 1) & 3);
        return static_cast<uint32_t>(r * kRowBytes + ((c ^ x) << 4));
    }
};

}  // namespace cuda
}  // namespace flashattn
