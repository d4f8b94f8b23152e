// The FA3 persistent grid's causal schedule, decided at finalize (plain C++): how many (query
// head, sequence) pairs share one L2 section of the heaviest-first tile list that the kernels walk
// (fa3_tile_scheduler.cuh: tile_coords and nth_tile; the FP8 kernel's Fp8TileWalk steps the same).
#pragma once

#include <cstdint>

namespace flashattn {
struct Problem;
namespace fa3 {

// Pairs per section for a causal plan of num_ctas persistent CTAs and block_n-key tiles, at most
// cta_limit (the FLASHATTN_FA3_MAX_CTAS test hook). l2_bytes 0: not known.
int causal_section(const Problem &p, int64_t l2_bytes, int num_ctas, int block_n, int cta_limit);

// The static schedule of `section` pairs per section replayed on the host with a cost per query
// tile (its key tiles plus a fixed part): the busiest CTA's cost over the mean, 1.0 when even.
// 0 when there is nothing to replay (no tiles, or varlen: the lengths live on the device).
double schedule_imbalance(const Problem &p, int64_t section, int num_ctas, int block_n);

}  // namespace fa3
}  // namespace flashattn
