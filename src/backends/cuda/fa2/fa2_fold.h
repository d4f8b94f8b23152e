// The split-KV decode tiles' arrival words (fa2_params.h, fold_count; fa2_epilogue.cuh,
// fold_split_combine): one word per (query tile, grid head, sequence) holds tag << 8 | the splits
// arrived so far. Plain constexpr C++ without CUDA headers, so that a CPU test
// (tests/unit/test_fa2_fold.cpp) checks the same step the kernels run inside their atomicCAS loop.
#pragma once

namespace flashattn {
namespace fa2 {

constexpr unsigned long long kFoldTagMask = (1ull << 56) - 1;  // the tag's 56 bits
constexpr int kFoldMaxSplits = 255;                             // what the word's low byte counts

// What one split writes when it finds `cur` in its word: a word of another tag (an earlier
// execute's, or whatever the caller's workspace held), or of this tag with a count no execute
// leaves (>= splits: 0xff.. is this tag's word when the tag is all ones), counts as none arrived;
// the last of `splits` leaves (tag, 0), so that a replayed CUDA graph, whose tag was captured,
// starts from zero again. `tag` <= kFoldTagMask, 2 <= splits <= kFoldMaxSplits.
struct FoldStep {
    unsigned long long next;
    bool last;
};
constexpr FoldStep fold_step(unsigned long long cur, unsigned long long tag, int splits) {
    const unsigned long long base = tag << 8;
    const unsigned long long n = static_cast<unsigned long long>(splits);
    const unsigned long long arrived = (cur >> 8) == tag && (cur & 0xffull) < n ? (cur & 0xffull) : 0ull;
    const bool last = arrived + 1 == n;
    return FoldStep{last ? base : base | (arrived + 1), last};
}

}  // namespace fa2
}  // namespace flashattn
