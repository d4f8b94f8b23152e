// The fp32 dQ accumulator of the backward passes (BwdTensorArgs::dq_accum) and its two layouts,
// chosen by BwdTensorArgs::dq_frag:
//   row-major (0, FA3)  [heads_q][total_rows][head_dim];
//   fragment  (1, FA2)  per query head, dq_rows rows in blocks of 16 by dq_frag_cols(head_dim)
//                       columns in blocks of 16; a 16 x 16 block is two 16 x 8 halves (columns
//                       0-7, 8-15), each stored as mma.sync's m16n8 accumulator fragment in lane
//                       order: lane 4g + t holds (row g, column 2t), (g, 2t + 1), (g + 8, 2t),
//                       (g + 8, 2t + 1), four consecutive floats. A warp's fragment of one half is
//                       512 contiguous bytes: one red.v4 per lane reduces it as four whole cache
//                       lines, where the row-major form takes eight 32-byte pieces of eight rows
//                       per red.v2. Each sequence starts at a multiple of 16 rows
//                       (dq_frag_row0), so every m16 tile of a query block (16-aligned within its
//                       sequence) is whole blocks; rows past a sequence's end inside its last
//                       block are padding: zeroed by the preprocess with the rest of the
//                       sequence's span, added into (dS = 0 there), never converted.
// Plain device helpers, templated on the parameter struct (a BwdTensorArgs).
#pragma once

#include <cstdint>

namespace flashattn {
namespace cuda {

// First accumulator row of sequence b (first packed query row q_row0) in the fragment layout:
// sequence b's rows [16 (q_row0 / 16 + b), + round_up(sq, 16)) never meet sequence b + 1's, and
// all fit in round_up(total_rows, 16) + 16 batch rows (host: dq_frag_rows in bwd_args.cpp).
__device__ __forceinline__ int64_t dq_frag_row0(int64_t q_row0, int b) { return 16 * (q_row0 / 16 + b); }
__device__ __forceinline__ int dq_frag_cols(int d) { return (d + 15) & ~15; }

// Floats between two copies of the accumulator (BwdTensorArgs::dq_splits).
template <class P>
__device__ __forceinline__ int64_t dq_split_stride(const P &p) {
    return p.dq_frag ? static_cast<int64_t>(p.heads_q) * p.dq_rows * dq_frag_cols(p.head_dim)
                     : static_cast<int64_t>(p.heads_q) * p.total_rows * p.head_dim;
}

}  // namespace cuda
}  // namespace flashattn
