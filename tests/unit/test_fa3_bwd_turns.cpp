// The FA3 deterministic backward's turns under the keys-rotated walk (src/backends/cuda/fa3/
// fa3_bwd_turns.h): for every query block, the counts the key blocks wait for must be exactly the
// order in which their walks reach it (step, then key block), a permutation of 0 .. seq_blocks - 1.
// A wrong count hangs the kernel (a turn that never comes) or breaks its determinism.
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <algorithm>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "backends/cuda/fa3/fa3_bwd_turns.h"

using namespace flashattn::fa3;

namespace {

// One (nmb, nkb, seq_blocks): every query block q, against the order written out directly.
bool turns_follow_the_walks(int nmb, int nkb, int seq_blocks, int q) {
    struct Visit {
        int64_t t;
        int n;
    };
    std::vector<Visit> visits;
    std::vector<int> turns;
    for (int n = 0; n < seq_blocks; ++n) {
        const int rot = bwd_rotation(n, nkb, nmb);
        const int t = ((q - rot) % nmb + nmb) % nmb;  // the step at which key block n reaches q
        visits.push_back({t, n});
        turns.push_back(bwd_rotated_turn(t, q, n, rot, nmb, nkb, seq_blocks));
    }
    std::sort(visits.begin(), visits.end(),
              [](const Visit &a, const Visit &b) { return a.t != b.t ? a.t < b.t : a.n < b.n; });
    for (int pos = 0; pos < seq_blocks; ++pos)
        if (turns[static_cast<size_t>(visits[static_cast<size_t>(pos)].n)] != pos) {
            print_error("nmb %d nkb %d seq_blocks %d q %d: key block %d reaches it at step %lld, position %d, "
                        "counts %d before it\n", nmb, nkb, seq_blocks, q, visits[static_cast<size_t>(pos)].n,
                        static_cast<long long>(visits[static_cast<size_t>(pos)].t), pos,
                        turns[static_cast<size_t>(visits[static_cast<size_t>(pos)].n)]);
            return false;
        }
    return true;
}

// Every small shape: more query blocks than key blocks and fewer (ties in the rotation), and
// sequences shorter than the grid's longest (variable length: seq_blocks < nkb).
void small_shapes(void **) {
    for (int nmb = 1; nmb <= 24; ++nmb)
        for (int nkb = 1; nkb <= 24; ++nkb)
            for (int seq_blocks = 1; seq_blocks <= nkb; ++seq_blocks)
                for (int q = 0; q < nmb; ++q) assert_true(turns_follow_the_walks(nmb, nkb, seq_blocks, q));
}

// The sizes finalize allows at the edges: 132 key blocks (one per SM of an H200), query blocks up
// to nmb x nkb < 2^31 (the 32-bit arithmetic), a few query blocks each.
void large_shapes(void **) {
    const int nkbs[] = {16, 31, 132};
    for (int nkb : nkbs) {
        const int nmbs[] = {nkb, 2 * nkb + 3, 4093, static_cast<int>(((int64_t{1} << 31) - 1) / nkb)};
        for (int nmb : nmbs) {
            const int qs[] = {0, 1, nmb / 3, nmb - 2, nmb - 1};
            for (int q : qs)
                if (q >= 0 && q < nmb) {
                    assert_true(turns_follow_the_walks(nmb, nkb, nkb, q));
                    assert_true(turns_follow_the_walks(nmb, nkb, nkb / 2 + 1, q));
                }
        }
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_shapes),
        cmocka_unit_test(large_shapes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
