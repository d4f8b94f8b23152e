// Swizzled shared-memory layout of a [kRows x kCols] tile of 16-bit elements, kCols a multiple of
// 32. The tile is stored as column pages: full pages of 64 columns (128-byte rows) and, when
// kCols % 64 == 32, one trailing half page of 32 columns (64-byte rows). Inside a full page the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the TMA SWIZZLE_128B pattern); inside the
// half page at chunk c ^ ((r / 2) % 4). Eight consecutive rows read at one logical chunk (what one
// ldmatrix 8x8 matrix reads) then touch eight distinct 16-byte bank groups: no bank conflicts for
// ldmatrix, cp.async writes or the epilogue's 4-byte fragment writes.
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {

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

}  // namespace cuda
}  // namespace flashattn
