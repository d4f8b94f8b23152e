// The FA3 causal schedule's section size (fa3_schedule.h).
#include "backends/cuda/fa3/fa3_schedule.h"

#include <algorithm>
#include <vector>

#include "backends/cuda/fa3/fa3_config.h"
#include "problem/problem.h"

namespace flashattn {
namespace fa3 {
namespace {

// A query tile's fixed cost in key tiles (Q load, the first S GEMM without overlap, the epilogue),
// and that of a tile with no visible key (skipped after its coordinates are known).
constexpr double kTileFixedCost = 1.0;
constexpr double kEmptyTileCost = 0.25;
// Tiles replayed at most (a prefix of longer lists: their balance is decided by then), so that
// finalize stays within a few milliseconds.
constexpr int64_t kMaxReplayTiles = int64_t(1) << 18;
// A section that fits the L2 is taken when it balances the CTAs within this much of the section
// the balance rule alone would pick.
constexpr double kImbalanceSlack = 0.04;

// Key tiles query block mblk visits (the window's, plus the sink tiles below it), as the kernels'
// cuda::key_tiles and sink_tile_last count them, from the host's single mask definition.
double query_tile_cost(const Problem &p, int64_t mblk, int block_n) {
    const int64_t sq = p.seqlen_q, sk = p.seqlen_k;
    const int64_t lo = mblk * kBlockM, hi = std::min(lo + kBlockM, sq) - 1;
    const KeyRange first_row = visible_keys(p, lo, sq, sk), last_row = visible_keys(p, hi, sq, sk);
    const int64_t first = std::max<int64_t>(first_row.first, 0), last = std::min(last_row.last, sk - 1);
    int64_t tiles = last >= first ? last / block_n - first / block_n + 1 : 0;
    const int64_t sink_last = visible_sink_last(p, hi, sq, sk);
    if (sink_last >= 0 && tiles > 0) tiles += std::min(sink_last / block_n, first / block_n - 1) + 1;
    return tiles > 0 ? kTileFixedCost + static_cast<double>(tiles) : kEmptyTileCost;
}

// The section that balances the heaviest-first dealing alone: as many pairs as have their K and V
// (seqlen_k x head_dim, shared by a GQA group) in half the L2, but enough for 12 rounds of the
// persistent grid (with one or two rounds per section, hdim 256 causal at 16k lost 40 %).
int64_t balancing_section(int64_t pairs, int64_t m_blocks, int64_t for_l2, int num_ctas) {
    const int64_t for_balance = (int64_t(12) * num_ctas + m_blocks - 1) / std::max<int64_t>(1, m_blocks);
    return std::min(pairs, std::max(for_l2, for_balance));
}

}  // namespace

double schedule_imbalance(const Problem &p, int64_t section, int num_ctas, int block_n) {
    const int64_t pairs = p.heads_q * p.batch;
    const int64_t m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int64_t n = std::min(pairs * m_blocks, kMaxReplayTiles);
    if (p.varlen || n <= 0 || num_ctas <= 0 || section <= 0 || block_n <= 0) return 0.0;
    std::vector<double> cost(static_cast<size_t>(m_blocks));
    for (int64_t m = 0; m < m_blocks; ++m) cost[static_cast<size_t>(m)] = query_tile_cost(p, m, block_n);
    std::vector<double> load(static_cast<size_t>(num_ctas), 0.0);
    const int64_t per_section = section * m_blocks, g = num_ctas;
    double total = 0.0;
    for (int64_t t = 0; t < n; ++t) {
        const int64_t first = t / per_section * section, u = t % per_section;  // tile_coords
        const int64_t width = std::min(section, pairs - first);
        const int64_t mblk = m_blocks - 1 - u / width;
        const int64_t r = t / g, i = t % g;  // nth_tile's snake: forwards in even rounds
        const int64_t x = (r & 1) ? g - 1 - i : i;
        load[static_cast<size_t>(x)] += cost[static_cast<size_t>(mblk)];
        total += cost[static_cast<size_t>(mblk)];
    }
    const double busiest = *std::max_element(load.begin(), load.end());
    return total > 0.0 ? busiest * static_cast<double>(std::min(g, n)) / total : 0.0;
}

// Among the sections that fit half the L2 (1, 2, 4, ... pairs and the largest that fits), the one
// the replay balances best, when it is within kImbalanceSlack of the balancing section; else that
// one. Short causal sequences need it: at 512 keys, hdim 256, the balancing section held all 256
// pairs (128 MB of K and V), so a pair's four query tiles ran a whole list apart and re-read its
// K/V from DRAM (1.85x the compulsory bytes, ncu); a section of one pair runs them side by side,
// and the snake dealing still pairs each CTA's heavy tiles with light ones.
int causal_section(const Problem &p, int64_t l2_bytes, int num_ctas, int block_n, int cta_limit) {
    const int64_t pairs = p.heads_q * p.batch;
    const int64_t m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
    const int64_t elem_bytes = p.fp8() ? 1 : 2;  // K and V: E4M3 or 16-bit
    const int64_t kv_per_pair = std::max<int64_t>(1, p.seqlen_k * p.head_dim * elem_bytes * 2 / p.group_size());
    const int64_t budget = l2_bytes > 0 ? l2_bytes / 2 : (int64_t(16) << 20);
    const int64_t for_l2 = std::min(pairs, std::max<int64_t>(1, budget / kv_per_pair));
    const int64_t limit = std::max(1, cta_limit);
    int64_t section = std::min(balancing_section(pairs, m_blocks, for_l2, num_ctas), limit);
    const double balanced = section > for_l2 ? schedule_imbalance(p, section, num_ctas, block_n) : 0.0;
    if (balanced > 0.0) {
        std::vector<int64_t> fitting;
        for (int64_t s = 1; s < for_l2; s *= 2) fitting.push_back(s);
        fitting.push_back(for_l2);
        double best = balanced + kImbalanceSlack;
        for (const int64_t s : fitting) {  // the fewest pairs among equals
            const double imbalance = schedule_imbalance(p, s, num_ctas, block_n);
            if (imbalance > 0.0 && imbalance < best - 1e-9) best = imbalance, section = s;
        }
    }
    return static_cast<int>(std::max<int64_t>(1, std::min(section, limit)));
}

}  // namespace fa3
}  // namespace flashattn
