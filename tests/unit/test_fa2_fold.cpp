// The split-KV decode tiles' arrival words (src/backends/cuda/fa2/fa2_fold.h, fold_step), the step
// the kernels run inside their atomicCAS loop, on the CPU: whatever a word holds before an execute
// (zeros, 0xff bytes, another execute's tag at any count), exactly the last of its splits is told
// to combine, and the word ends at (tag, 0), so that a CUDA graph replaying the same tag, or the
// next execute with a new one, starts from zero again. A wrong step leaves a query tile's output
// uncombined (no split told) or combined from partials not yet written (told too early).
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <initializer_list>

extern "C" {
#include <cmocka.h>
}

#include "backends/cuda/fa2/fa2_fold.h"

using namespace flashattn::fa2;

namespace {

// Runs one execute's `splits` arrivals on `word` (any arrival order gives the same steps: the CAS
// serialises them) and checks that only the last one is told to combine.
void arrive_all(unsigned long long &word, unsigned long long tag, int splits) {
    for (int s = 0; s < splits; ++s) {
        const FoldStep step = fold_step(word, tag, splits);
        if (step.last != (s == splits - 1))
            fail_msg("tag %llx, %d splits: arrival %d told last = %d", tag, splits, s, step.last ? 1 : 0);
        word = step.next;
    }
    assert_true(word == tag << 8);
}

uint64_t next_random(uint64_t &x) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
}

void any_prior_word(void **) {
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int trial = 0; trial < 20000; ++trial) {
        const unsigned long long tag = next_random(rng) & kFoldTagMask;
        const int splits = 2 + static_cast<int>(next_random(rng) % (kFoldMaxSplits - 1));
        unsigned long long word;
        switch (trial % 5) {
            case 0: word = 0; break;
            case 1: word = ~0ull; break;                                  // a poisoned workspace
            case 2: word = next_random(rng); break;                       // anything
            case 3: word = (((tag + 1) & kFoldTagMask) << 8) | (next_random(rng) & 0xff); break;  // the next tag, any count
            default: word = (((tag - 1) & kFoldTagMask) << 8); break;    // the previous execute's reset
        }
        if ((word >> 8) == tag) word ^= 1ull << 8;  // (a random word that happens to carry the tag)
        arrive_all(word, tag, splits);
    }
}

void graph_replays_and_new_tags(void **) {
    // A captured tag replayed three times, executes with new tags between, on one workspace word.
    unsigned long long word = ~0ull;
    const unsigned long long captured = 0x00ABCDEF01234567ull & kFoldTagMask;
    for (int round = 0; round < 3; ++round) {
        arrive_all(word, captured, 4);
        arrive_all(word, captured + 1 + round, 4);
        arrive_all(word, captured, 4);
    }
}

void tag_extremes(void **) {
    for (unsigned long long tag : {0ull, 1ull, kFoldTagMask, kFoldTagMask - 1}) {
        for (int splits : {2, 3, 8, kFoldMaxSplits}) {
            unsigned long long word = 0;
            arrive_all(word, tag, splits);
            arrive_all(word, tag, splits);
            word = ~0ull;
            arrive_all(word, tag, splits);
        }
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(any_prior_word),
        cmocka_unit_test(graph_replays_and_new_tags),
        cmocka_unit_test(tag_extremes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
