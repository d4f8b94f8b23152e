// The CPU backend's FlashAttention tile kernel: one block of query rows of one (sequence, head)
// against all the keys they may see, K/V streamed in blocks with the online softmax.
#pragma once

#include <cstddef>
#include <cstdint>

#include "problem/problem.h"

namespace flashattn {
namespace cpu {

constexpr int kMaxBlockM = 64;  // query rows per tile (upper bound; stack arrays use it)
constexpr int kVector = 8;      // floats per SIMD vector of the kernel

// Sizes the kernel is built around, fixed at make_schedule.
struct TileShape {
    int block_m = 0;  // query rows per tile, <= kMaxBlockM
    int block_n = 0;  // keys per K/V tile, a multiple of kVector
};

// Per-thread scratch (in bytes) for a problem and tile shape; every sub-array starts 64-byte aligned.
size_t scratch_bytes(const Problem &p, const TileShape &shape);

// One (sequence, head) slice: base pointers of row 0 and the element stride between rows.
struct Slice {
    const unsigned char *q = nullptr;
    const unsigned char *k = nullptr;
    const unsigned char *v = nullptr;
    unsigned char *o = nullptr;
    float *lse = nullptr;  // lse of row 0 (rows contiguous); nullptr: not wanted
    int64_t q_row = 0, k_row = 0, v_row = 0, o_row = 0;  // in elements
    int64_t seqlen_q = 0;
    int64_t seqlen_k = 0;
};

// Compute rows [row0, row0 + rows) of `slice` (rows <= shape.block_m) into O (and LSE).
// `scratch` holds scratch_bytes() bytes, 64-byte aligned, private to the calling thread.
void run_tile(const Problem &p, const TileShape &shape, const Slice &slice, int64_t row0,
              int64_t rows, void *scratch);

// Name of the SIMD path run_tile uses on this machine ("avx2+fma" or "generic").
const char *simd_path();

}  // namespace cpu
}  // namespace flashattn
