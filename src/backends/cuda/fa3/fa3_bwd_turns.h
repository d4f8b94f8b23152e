// The FA3 backward's walks over query blocks and the deterministic mode's turns under them
// (fa3_bwd_kernel.cuh: key_walk, walk_step, turn_of, build_turn_table). Plain constexpr C++
// without CUDA headers, so that a CPU test (tests/unit/test_fa3_bwd_turns.cpp) checks the same
// code the kernels run.
#pragma once

#include <cstdint>

namespace flashattn {
namespace fa3 {

// kKeysRotated: key block nb of nkb starts its walk over its nmb query blocks at block r(nb) =
// floor(nb nmb / nkb), so that the key blocks of a pair resident together add into different dQ
// rows (nkb > 0).
constexpr int bwd_rotation(int nb, int nkb, int nmb) { return static_cast<int>(static_cast<int64_t>(nb) * nmb / nkb); }

// The query blocks a key block visits, in walk order: blocks first .. first + count - 1 (count 0:
// none), starting at first + rot and wrapping around.
struct BwdWalk {
    int first, count, rot;
};

// Key block nb (keys nb kbn .. min((nb + 1) kbn, sk) - 1) of a sequence with sq queries and sk keys:
// key j is visible to row i iff i + off - left <= j <= i + off + right (device/mask.cuh), so the rows
// that see one of its keys are [n0 - off - right, n_hi - off + left] within [0, sq), in blocks of
// bm rows; a block holding sink keys (j < sink_tokens escapes the left window) to row sq - 1. The walk starts at bwd_rotation (nkb: the grid's key blocks per pair) for kWalkRotated,
// and for kWalkStaggered when it starts at query block 0 (a mask's other walks start at their own
// diagonal; those from block 0, e.g. the keys every query row sees when sk > sq, would otherwise
// all reach the same query block at every step).
enum BwdWalkRotation : int { kWalkPlain = 0, kWalkRotated = 1, kWalkStaggered = 2 };
constexpr BwdWalk bwd_walk(int nb, int kbn, int bm, int sq, int sk, int64_t off, int64_t left, int64_t right,
                           int nkb, int rotation, int64_t sink_tokens = 0) {
    const int64_t n0 = static_cast<int64_t>(nb) * kbn;
    const int64_t n_hi = (n0 + kbn < sk ? n0 + kbn : sk) - 1;
    const int64_t lo_raw = n0 - off - right, hi_raw = n0 < sink_tokens ? sq - 1 : n_hi - off + left;
    const int64_t lo = lo_raw > 0 ? lo_raw : 0, hi = hi_raw < sq - 1 ? hi_raw : sq - 1;
    if (lo > hi) return BwdWalk{0, 0, 0};
    const int first = static_cast<int>(lo / bm), count = static_cast<int>(hi / bm) - first + 1;
    const bool rotate = rotation == kWalkRotated || (rotation == kWalkStaggered && first == 0);
    return BwdWalk{first, count, rotate ? bwd_rotation(nb, nkb, count) : 0};
}

// How many of a sequence's key blocks walk from query block 0 (the keys every query row sees, as
// under causal when sk > sq): their walks reach the same query blocks at the same steps unless
// rotated, so in the deterministic mode their adds queue up. Loops over the sequence's key blocks.
constexpr int bwd_walks_from_block0(int kbn, int bm, int sq, int sk, int64_t off, int64_t left, int64_t right,
                                    int nkb, int64_t sink_tokens = 0) {
    int n = 0;
    for (int nb = 0; static_cast<int64_t>(nb) * kbn < sk; ++nb) {
        const BwdWalk w = bwd_walk(nb, kbn, bm, sq, sk, off, left, right, nkb, kWalkPlain, sink_tokens);
        n += w.count > 0 && w.first == 0 ? 1 : 0;
    }
    return n;
}

// The step of its head's walk at which w reaches query block q (first <= q < first + count).
constexpr int bwd_walk_step(const BwdWalk &w, int q) {
    const int t = q - w.first - w.rot;
    return t < 0 ? t + w.count : t;
}
// ... and the query block it reaches at step t (0 <= t < count): what the kernels' walk_step does.
constexpr int bwd_walk_block(const BwdWalk &w, int t) {
    const int m = t + w.rot;
    return w.first + (m >= w.count ? m - w.count : m);
}

// The deterministic mode's turn (keys-fastest grids): the adds into query block q go in the order
// in which the walks reach it, by step, then by key block; where a wave of the grid ends inside the
// pair, the key blocks below `split` (dispatched in the earlier wave: bwd_wave_split) all go first,
// so that none of them waits for a block that only a later wave dispatches. Returns how many of
// the seq_blocks key blocks add into q before key block nb (which visits q). walks(n): key block
// n's BwdWalk.
template <class Walks>
constexpr int bwd_turn(const Walks &walks, int seq_blocks, int nb, int q, int split) {
    const int t = bwd_walk_step(walks(nb), q);
    const bool late = nb >= split;
    int before = 0;
    for (int n = 0; n < seq_blocks; ++n) {
        const BwdWalk w = walks(n);
        if (q < w.first || q >= w.first + w.count) continue;
        if ((n >= split) != late) {
            before += late ? 1 : 0;  // the other wave's block: first if it is the earlier one
            continue;
        }
        const int tn = bwd_walk_step(w, q);
        before += (tn < t || (tn == t && n < nb)) ? 1 : 0;
    }
    return before;
}

// The key blocks of a pair that the grid's wave holding its first CTA dispatches (keys-fastest
// grid: the pair's CTAs first_cta .. first_cta + nkb - 1; waves of wave_ctas CTAs, one per SM, as
// the in-order dispatch of CTAs of equal length gives them): nkb where the pair fits the wave
// (or wave_ctas is 0: no split).
constexpr int bwd_wave_split(int64_t first_cta, int nkb, int wave_ctas) {
    if (wave_ctas <= 0) return nkb;
    const int64_t left = wave_ctas - first_cta % wave_ctas;
    return left < nkb ? static_cast<int>(left) : nkb;
}

}  // namespace fa3
}  // namespace flashattn
