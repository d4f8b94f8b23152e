// The FA3 backward's walks and the deterministic mode's keys-rotated turns (src/backends/cuda/fa3/
// fa3_bwd_turns.h), the code the kernels run, on the CPU: each key block's walk covers exactly the
// query blocks that see one of its keys under the mask rule, visits each once, and the turns
// (bwd_turn) let every key block of a pair add into every query block of its walk, each query
// block's adds in a fixed order, without a deadlock; and the ascending turns of the heads-fastest
// grid and of FA2 (host/bwd_args.h ascending_turn) count exactly the lower key blocks that visit,
// FA2's walks (ascending_walk_rows) on each of its tiles included, and FA2's descending turns
// (turn_last_block) the higher ones.
// Sink tokens included (their blocks escape the left window). A wrong count hangs the kernel (a
// turn that never comes) or breaks its determinism.
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "backends/cuda/fa3/fa3_bwd_turns.h"
#include "backends/cuda/host/bwd_args.h"

using namespace flashattn::fa3;
using flashattn::ascending_turn;

namespace {

constexpr int64_t kUnbounded = int64_t(1) << 40;  // host/tensor_args.h kUnboundedWindow
constexpr int kBm = 64;                            // query rows per block (kBwdBM)

struct Shape {
    int sq, sk, kbn, nkb;  // nkb: the grid's key blocks per pair (a longer sequence's under varlen)
    int64_t off, left, right;
    int rotation;  // BwdWalkRotation
    int64_t sink_tokens = 0;
    int split = 1 << 30;  // the key blocks of the earlier wave (bwd_wave_split); none split by default
};

std::vector<BwdWalk> walks_of(const Shape &c) {
    std::vector<BwdWalk> w;
    const int seq_blocks = (c.sk + c.kbn - 1) / c.kbn;
    for (int n = 0; n < seq_blocks; ++n)
        w.push_back(bwd_walk(n, c.kbn, kBm, c.sq, c.sk, c.off, c.left, c.right, c.nkb, c.rotation, c.sink_tokens));
    return w;
}

// The walk against the mask rule written out: query block q is in key block n's walk iff one of
// its rows sees one of the block's keys (i + off - left <= j <= i + off + right; j < sink_tokens:
// j <= i + off + right).
bool walks_cover_the_mask(const Shape &c, const std::vector<BwdWalk> &w) {
    for (size_t n = 0; n < w.size(); ++n) {
        for (int q = 0; q * kBm < c.sq; ++q) {
            bool sees = false;
            for (int i = q * kBm; i < c.sq && i < (q + 1) * kBm && !sees; ++i)
                for (int j = static_cast<int>(n) * c.kbn; j < c.sk && j < (static_cast<int>(n) + 1) * c.kbn; ++j)
                    if ((i + c.off - c.left <= j || j < c.sink_tokens) && j <= i + c.off + c.right) {
                        sees = true;
                        break;
                    }
            const bool in = q >= w[n].first && q < w[n].first + w[n].count;
            if (sees != in) {
                print_error("sq %d sk %d off %lld left %lld right %lld: key block %zu, query block %d: %s by the mask, "
                            "%s the walk [%d, +%d)\n", c.sq, c.sk, static_cast<long long>(c.off),
                            static_cast<long long>(c.left), static_cast<long long>(c.right), n, q,
                            sees ? "seen" : "not seen", in ? "in" : "not in", w[n].first, w[n].count);
                return false;
            }
        }
        for (int t = 0; t < w[n].count; ++t)  // the walk visits each of its blocks once, step and block inverse
            if (bwd_walk_step(w[n], bwd_walk_block(w[n], t)) != t) {
                print_error("key block %zu: step %d does not come back\n", n, t);
                return false;
            }
    }
    return true;
}

// Every key block walks its blocks in order and adds into one only when the block's counter equals
// its turn. First only the key blocks below c.split run (the earlier wave: none of them may wait for
// a later one), then all of them (the pair's key blocks are all resident). All must finish, each
// block's counter at the number of key blocks that visit it.
bool turns_complete(const Shape &c, const std::vector<BwdWalk> &w) {
    const int seq_blocks = static_cast<int>(w.size());
    const auto walks = [&w](int n) { return w[static_cast<size_t>(n)]; };
    std::vector<int> sem(static_cast<size_t>((c.sq + kBm - 1) / kBm) + 1, 0), step(w.size(), 0);
    for (int running : {std::min(c.split, seq_blocks), seq_blocks}) {
        for (bool moved = true; moved;) {
            moved = false;
            for (int n = 0; n < running; ++n)
                while (step[static_cast<size_t>(n)] < w[static_cast<size_t>(n)].count) {
                    const int q = bwd_walk_block(w[static_cast<size_t>(n)], step[static_cast<size_t>(n)]);
                    if (sem[static_cast<size_t>(q)] != bwd_turn(walks, seq_blocks, n, q, c.split)) break;
                    ++sem[static_cast<size_t>(q)];
                    ++step[static_cast<size_t>(n)];
                    moved = true;
                }
        }
        for (int n = 0; n < running; ++n) {
            if (step[static_cast<size_t>(n)] == w[static_cast<size_t>(n)].count) continue;
            print_error("sq %d sk %d kbn %d off %lld left %lld right %lld rotation %d split %d: key block %d stuck at "
                        "step %d of %d\n", c.sq, c.sk, c.kbn, static_cast<long long>(c.off), static_cast<long long>(c.left),
                        static_cast<long long>(c.right), c.rotation, c.split, n, step[static_cast<size_t>(n)],
                        w[static_cast<size_t>(n)].count);
            return false;
        }
    }
    for (int q = 0; q * kBm < c.sq; ++q) {
        int visitors = 0;
        for (const BwdWalk &x : w) visitors += q >= x.first && q < x.first + x.count ? 1 : 0;
        if (sem[static_cast<size_t>(q)] != visitors) return false;
    }
    return true;
}

Shape random_shape(unsigned *seed) {
    auto rnd = [seed](int n) { return static_cast<int>(rand_r(seed) % static_cast<unsigned>(n)); };
    Shape c{};
    c.sq = 1 + rnd(700);
    c.sk = 1 + rnd(700);
    c.kbn = rnd(2) ? 128 : 64;
    c.nkb = (c.sk + c.kbn - 1) / c.kbn + rnd(3);  // a longer sequence in the batch (varlen)
    c.off = rnd(2) ? c.sk - c.sq : 0;             // bottom-right or top-left
    switch (rnd(4)) {
    case 0: c.left = c.right = kUnbounded; break;           // no mask
    case 1: c.left = kUnbounded; c.right = 0; break;        // causal
    case 2: c.left = rnd(300); c.right = rnd(2) ? 0 : rnd(100); break;  // sliding window
    default: c.left = rnd(200); c.right = kUnbounded; break;
    }
    c.rotation = rnd(3);  // plain, rotated, staggered
    if (rnd(3) == 0) c.sink_tokens = 1 + rnd(rnd(2) ? 40 : 300);  // inside the first block, or several
    // a wave that ends inside the pair (the grid's pairs before it fill part of the wave)
    if (rnd(2)) c.split = bwd_wave_split(static_cast<int64_t>(rnd(4)) * c.nkb, c.nkb, 1 + rnd(2 * c.nkb + 8));
    return c;
}

// The ascending turn of key block n at query block q against the visitors counted: every lower key
// block whose walk holds q (plain walks: the grid order of FA2 and FA3's heads-fastest).
bool ascending_turns_count_visitors(const Shape &c, const std::vector<BwdWalk> &w) {
    const int nsb = static_cast<int>((c.sink_tokens + c.kbn - 1) / c.kbn);
    for (int q = 0; q * kBm < c.sq; ++q) {
        const int64_t first_key = static_cast<int64_t>(q) * kBm + c.off - c.left;
        const int nb_first = first_key > 0 ? static_cast<int>(first_key / c.kbn) : 0;
        int before = 0;
        for (size_t n = 0; n < w.size(); ++n) {
            if (q < w[n].first || q >= w[n].first + w[n].count) continue;
            if (ascending_turn(static_cast<int>(n), nb_first, nsb) != before) {
                print_error("sq %d sk %d kbn %d off %lld left %lld right %lld sinks %lld: key block %zu at query "
                            "block %d: turn %d, %d visitors before it\n", c.sq, c.sk, c.kbn,
                            static_cast<long long>(c.off), static_cast<long long>(c.left),
                            static_cast<long long>(c.right), static_cast<long long>(c.sink_tokens), n, q,
                            ascending_turn(static_cast<int>(n), nb_first, nsb), before);
                return false;
            }
            ++before;
        }
    }
    return true;
}

// The walks from query block 0 (det_grid_order keeps ascending turns where they are many), counted
// from the walks themselves, which walks_cover_the_mask checks against the mask.
int walks_from_block0_of(const std::vector<BwdWalk> &w) {
    int n = 0;
    for (const BwdWalk &x : w) n += x.count > 0 && x.first == 0 ? 1 : 0;
    return n;
}

void random_masks(void **) {
    unsigned seed = 20261204u;
    for (int i = 0; i < 1500; ++i) {
        const Shape c = random_shape(&seed);
        const std::vector<BwdWalk> w = walks_of(c);
        assert_true(walks_cover_the_mask(c, w));
        assert_true(turns_complete(c, w));
        // The ascending turn serves the plain walks (FA2, FA3 heads fastest) of every shape.
        const std::vector<BwdWalk> plain = walks_of(Shape{c.sq, c.sk, c.kbn, c.nkb, c.off, c.left, c.right,
                                                          kWalkPlain, c.sink_tokens});
        assert_true(ascending_turns_count_visitors(c, plain));
        assert_int_equal(bwd_walks_from_block0(c.kbn, kBm, c.sq, c.sk, c.off, c.left, c.right, c.nkb, c.sink_tokens),
                         walks_from_block0_of(plain));
    }
}

// FA2's walks (the kernel's rows from host/bwd_args.h ascending_walk_rows) on each of its tiles
// (fa2_bwd_params.h: bm x bn 128 x 128, 64 x 128, 64 x 64, 32 x 32; and FA3 d 256's 64 x 80):
// query block q is in key block n's walk iff one of its rows sees one of the block's keys, and the
// deterministic turn (ascending_turn from turn_first_block) counts the lower key blocks whose walks
// hold q; without sink tokens also the descending turn (turn_last_block) the higher ones.
// FA2's descending turns (keys-descending grid, no sink tokens): key block n at query block q has
// every higher visitor before it, turn_last_block - n. visitors[q]: how many key blocks visit q
// (their indices contiguous, ending at the highest, which the walks above checked one by one).
bool fa2_descending_turns(const Shape &c, int bm, int bn, const std::vector<int> &visitors) {
    const int blocks = (c.sk + bn - 1) / bn;
    for (int q = 0; q * bm < c.sq; ++q) {
        int seen = 0;  // visitors above n so far, walking n downwards
        for (int n = blocks - 1; n >= 0; --n) {
            const int64_t n0 = static_cast<int64_t>(n) * bn, n_hi = std::min<int64_t>(n0 + bn, c.sk) - 1;
            const flashattn::BwdRowRange r = flashattn::ascending_walk_rows(n0, n_hi, c.sq, c.off, c.left, c.right, 0);
            if (!(r.lo <= r.hi && q >= r.lo / bm && q <= r.hi / bm)) continue;
            const int last_row = std::min((q + 1) * bm, c.sq) - 1;
            const int right_i = static_cast<int>(std::min<int64_t>(c.right, int64_t(1) << 29));  // as the host clamps it
            const int turn = flashattn::turn_last_block(last_row, static_cast<int>(c.off), right_i, c.sk, bn) - n;
            if (turn != seen) {
                print_error("fa2 descending %dx%d sq %d sk %d off %lld left %lld right %lld: key block %d, query "
                            "block %d: turn %d, %d visitors after it\n", bm, bn, c.sq, c.sk,
                            static_cast<long long>(c.off), static_cast<long long>(c.left),
                            static_cast<long long>(c.right), n, q, turn, seen);
                return false;
            }
            ++seen;
        }
        if (seen != visitors[static_cast<size_t>(q)]) {
            print_error("fa2 descending %dx%d sq %d sk %d: query block %d: %d visitors counted downwards, %d upwards\n",
                        bm, bn, c.sq, c.sk, q, seen, visitors[static_cast<size_t>(q)]);
            return false;
        }
    }
    return true;
}

bool fa2_walks_and_turns(const Shape &c, int bm, int bn) {
    const int blocks = (c.sk + bn - 1) / bn, qblocks = (c.sq + bm - 1) / bm;
    const int nsb = static_cast<int>((c.sink_tokens + bn - 1) / bn);
    std::vector<int> before(static_cast<size_t>(qblocks), 0);
    for (int n = 0; n < blocks; ++n) {
        const int64_t n0 = static_cast<int64_t>(n) * bn, n_hi = std::min<int64_t>(n0 + bn, c.sk) - 1;
        const flashattn::BwdRowRange r = flashattn::ascending_walk_rows(n0, n_hi, c.sq, c.off, c.left, c.right,
                                                                        c.sink_tokens);
        for (int q = 0; q < qblocks; ++q) {
            bool sees = false;
            for (int i = q * bm; i < c.sq && i < (q + 1) * bm && !sees; ++i)
                for (int64_t j = n0; j <= n_hi && !sees; ++j)
                    sees = (i + c.off - c.left <= j || j < c.sink_tokens) && j <= i + c.off + c.right;
            const bool walked = r.lo <= r.hi && q >= r.lo / bm && q <= r.hi / bm;
            const int turn = ascending_turn(n, flashattn::turn_first_block(static_cast<int64_t>(q) * bm, c.off,
                                                                           c.left, bn), nsb);
            if (walked != sees || (walked && turn != before[static_cast<size_t>(q)])) {
                print_error("fa2 %dx%d sq %d sk %d off %lld left %lld right %lld sinks %lld: key block %d, query "
                            "block %d: walked %d, sees %d, turn %d, %d visitors before it\n", bm, bn, c.sq, c.sk,
                            static_cast<long long>(c.off), static_cast<long long>(c.left),
                            static_cast<long long>(c.right), static_cast<long long>(c.sink_tokens), n, q, walked,
                            sees, turn, before[static_cast<size_t>(q)]);
                return false;
            }
            before[static_cast<size_t>(q)] += walked ? 1 : 0;
        }
    }
    return c.sink_tokens > 0 || fa2_descending_turns(c, bm, bn, before);
}

void fa2_tiles(void **) {
    const int tiles[][2] = {{128, 128}, {64, 128}, {64, 64}, {32, 32}, {64, 80}};  // 64 x 80: FA3's d 256
    unsigned seed = 20261205u;
    for (int i = 0; i < 600; ++i) {
        Shape c = random_shape(&seed);
        c.sq = 1 + c.sq % 400;  // the brute-force visibility check is O(sq * sk)
        c.sk = 1 + c.sk % 400;
        if (c.off != 0) c.off = c.sk - c.sq;
        for (const auto &t : tiles) assert_true(fa2_walks_and_turns(c, t[0], t[1]));
    }
}

// Causal bottom-right: only key block 0 walks from query block 0 when seqlen_q = seqlen_k; with
// 1000 queries over 4000 keys every key up to 3063 is seen by row 0's block: 24 of 32 blocks.
void walks_from_block0_causal(void **) {
    assert_int_equal(bwd_walks_from_block0(128, kBm, 4096, 4096, 0, kUnbounded, 0, 32), 1);
    assert_int_equal(bwd_walks_from_block0(128, kBm, 1000, 4000, 3000, kUnbounded, 0, 32), 24);
    assert_int_equal(bwd_walks_from_block0(64, kBm, 4000, 1000, -3000, kUnbounded, 0, 16), 0);
}

// The sizes finalize allows at the edges: up to 132 key blocks per pair (an H200's SMs) and 224
// query blocks per walk (kBwdTurnTableMax), with and without a mask.
void large_pairs(void **) {
    const int64_t rights[] = {kUnbounded, 0};
    for (int64_t right : rights) {
        const Shape a{224 * kBm, 132 * 128, 128, 132, 132 * 128 - 224 * kBm, kUnbounded, right, true};
        const Shape b{224 * kBm - 5, 8192, 64, 130, 8192 - (224 * kBm - 5), kUnbounded, right, true};
        Shape c = b;  // 80-key blocks at 8k: the second pair's first 29 in the first wave of 132
        c.kbn = 80, c.nkb = 103, c.split = bwd_wave_split(103, 103, 132);
        assert_int_equal(c.split, 29);
        for (const Shape &x : {a, b, c}) assert_true(turns_complete(x, walks_of(x)));
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_masks),
        cmocka_unit_test(large_pairs),
        cmocka_unit_test(walks_from_block0_causal),
        cmocka_unit_test(fa2_tiles),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
