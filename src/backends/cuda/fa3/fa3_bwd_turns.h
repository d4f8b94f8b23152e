// The FA3 backward's keys-rotated walk and the deterministic mode's turns under it (fa3_bwd_kernel.cuh
// walk_rotation, turn_of). Plain constexpr C++ without CUDA headers, so that a CPU test
// (tests/unit/test_fa3_bwd_turns.cpp) checks the same code the kernels run.
#pragma once

#include <cstdint>

namespace flashattn {
namespace fa3 {

// kKeysRotated: key block nb of nkb starts its walk over nmb query blocks at block r(nb) =
// floor(nb nmb / nkb) (nondecreasing in nb), so that the key blocks of a pair resident together
// add into different dQ rows.
constexpr int bwd_rotation(int nb, int nkb, int nmb) {  // nkb > 0
    return static_cast<int>(static_cast<int64_t>(nb) * nmb / nkb);
}

// The deterministic mode's turn under kKeysRotated (no mask: each of the sequence's seq_blocks
// key blocks visits every one of the nmb query blocks): key block n reaches query block q at step
// t_n(q) = (q - r(n)) mod nmb of its head's walk, and the adds into q go in the order of (t, n).
// Returns how many key blocks add into q before key block nb, which reaches it at step t (q =
// (t + rot) mod nmb, rot = r(nb)): those whose r lies in the cyclic range (q - t, q], and those
// with r = rot and a lower index. 32-bit arithmetic: finalize takes this order only where
// nmb x nkb < 2^31. tests/unit/test_fa3_bwd_turns.cpp checks it against the order it defines.
constexpr int bwd_rotated_turn(int t, int q, int nb, int rot, int nmb, int nkb, int seq_blocks) {
    // below(x): how many key blocks have r(n) <= x (r(n) <= x <=> n < (x + 1) nkb / nmb)
    auto below = [&](int x) {
        if (x < 0) return 0;
        const int n = static_cast<int>((static_cast<uint32_t>(x + 1) * static_cast<uint32_t>(nkb) +
                                        static_cast<uint32_t>(nmb) - 1) / static_cast<uint32_t>(nmb));
        return n < seq_blocks ? n : seq_blocks;
    };
    const int lo = q - t + 1;
    const int earlier = lo >= 0 ? below(q) - below(lo - 1) : below(q) + below(nmb - 1) - below(nmb + lo - 1);
    return earlier + nb - below(rot - 1);
}

}  // namespace fa3
}  // namespace flashattn
