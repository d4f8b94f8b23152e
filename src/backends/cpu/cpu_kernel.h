// The CPU backend's FlashAttention tile kernel: one block of query rows of one (sequence, head)
// against all the keys they may see, K/V streamed in blocks with the online softmax.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "problem/problem.h"

namespace flashattn {
namespace cpu {

constexpr int kMaxBlockM = 128;  // query rows per tile (upper bound; stack arrays use it)

// Empty when the CPU kernels can run `p`: a dtype with an Elem (cpu_convert.h) and head dims of at
// least 1; otherwise why not. The one rule of the backend's forward and backward passes.
std::string unsupported_reason(const Problem &p);

// Sizes the kernel is built around, fixed at make_schedule.
struct TileShape {
    int block_m = 0;  // query rows per tile, <= kMaxBlockM
    int block_n = 0;  // keys per K/V tile, a multiple of kVector (cpu_simd.h)
};

// Per-thread scratch (in bytes) for a problem and tile shape; every sub-array starts 64-byte aligned.
size_t scratch_bytes(const Problem &p, const TileShape &shape);

// One sequence, one key/value head and `heads` (>= 1) of the query heads that share it, packed
// (as FlashAttention-3's PackGQA does): packed row t is query row t / heads of query head
// t % heads, so one K/V block serves every packed head. Pointers are those of row 0 of the first
// packed head; strides are in elements (LSE: in floats, rows contiguous).
struct Slice {
    const unsigned char *q = nullptr;
    const unsigned char *k = nullptr;
    const unsigned char *v = nullptr;
    unsigned char *o = nullptr;
    float *lse = nullptr;  // nullptr: not wanted
    int64_t q_row = 0, k_row = 0, v_row = 0, o_row = 0;
    int64_t q_head = 0, o_head = 0, lse_head = 0;  // from one packed head to the next
    int64_t heads = 1;
    int64_t seqlen_q = 0;  // query rows (per head) of this sequence
    int64_t seqlen_k = 0;
    // Variants: the sink logit and ALiBi slope of the first packed head (the next packed heads'
    // follow); nullptr when the plan uses none.
    const float *sink = nullptr;
    const float *alibi = nullptr;
    // Paged K/V (pages != nullptr): key j is row j % page_size of page pages[j / page_size]; k and
    // v then address row 0 of page 0 (at this head) and k_page / v_page step between pages.
    const int32_t *pages = nullptr;
    int64_t page_size = 0, k_page = 0, v_page = 0;
};

// Element offset of key j from a slice's k (row_stride k_row, page_stride k_page) or v.
inline int64_t key_offset(const Slice &sl, int64_t j, int64_t row_stride, int64_t page_stride) {
    if (sl.pages == nullptr) return j * row_stride;
    return sl.pages[j / sl.page_size] * page_stride + (j % sl.page_size) * row_stride;
}

// Compute packed rows [row0, row0 + rows) of `slice` (rows <= shape.block_m) into O (and LSE).
// `scratch` holds scratch_bytes() bytes, 64-byte aligned, private to the calling thread.
void run_tile(const Problem &p, const TileShape &shape, const Slice &slice, int64_t row0,
              int64_t rows, void *scratch);

// Name of the SIMD path run_tile uses on this machine ("avx2+fma" or "generic").
const char *simd_path();

}  // namespace cpu
}  // namespace flashattn
