// The FA3 causal schedule's section choice (src/backends/cuda/fa3/fa3_schedule.cpp): the host
// replay follows the kernels' tile order, short causal sequences get sections whose K/V fit the L2,
// long ones keep the balancing section.
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <vector>

extern "C" {
#include <cmocka.h>
}

#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_schedule.h"
#include "problem/problem.h"

using namespace flashattn;

namespace {

constexpr int64_t kL2 = int64_t(50) << 20;  // an H100 / H200's L2
constexpr int kSms = 132;

Problem causal(int64_t batch, int64_t heads, int64_t seqlen, int64_t head_dim, int64_t heads_kv = 0) {
    Problem p;
    p.batch = batch;
    p.heads_q = heads;
    p.heads_kv = heads_kv > 0 ? heads_kv : heads;
    p.seqlen_q = p.seqlen_k = seqlen;
    p.head_dim = p.head_dim_v = head_dim;
    p.dtype = FLASHATTN_DTYPE_BF16;
    p.causal = true;
    return p;
}

// The kernels' order written out the other way round: CTA x walks rounds r, taking tile
// r * g + x (even rounds) or r * g + g - 1 - x (odd); the tile's query block counts down within
// each section of `section` pairs (fa3_tile_scheduler.cuh). Cost: key tiles under the causal
// diagonal (square, bottom-right = top-left) plus one.
double imbalance_by_cta(const Problem &p, int64_t section, int g, int block_n) {
    const int64_t pairs = p.heads_q * p.batch, mb = (p.seqlen_q + fa3::kBlockM - 1) / fa3::kBlockM, n = pairs * mb;
    std::vector<double> load(static_cast<size_t>(g), 0.0);
    double total = 0.0;
    for (int x = 0; x < g; ++x)
        for (int64_t r = 0;; ++r) {
            const int64_t t = r * g + ((r & 1) ? g - 1 - x : x);
            if (t >= n) break;
            const int64_t per = section * mb, first = t / per * section, width = std::min(section, pairs - first);
            const int64_t mblk = mb - 1 - (t % per) / width;
            const int64_t last_key = std::min((mblk + 1) * fa3::kBlockM, p.seqlen_q) - 1;
            const double c = 1.0 + static_cast<double>(last_key / block_n + 1);
            load[static_cast<size_t>(x)] += c;
            total += c;
        }
    return *std::max_element(load.begin(), load.end()) * std::min<int64_t>(g, n) / total;
}

void test_replay_matches_the_kernels_order(void **) {
    const struct {
        int64_t b, h, s, d;
        int block_n;
    } cases[] = {{32, 8, 512, 256, 80}, {16, 16, 1000, 128, 128}, {2, 3, 4096, 64, 128}, {1, 8, 8192, 256, 80}};
    for (const auto &c : cases) {
        const Problem p = causal(c.b, c.h, c.s, c.d);
        for (int64_t section : {int64_t(1), int64_t(2), int64_t(5), c.b * c.h})
            for (int g : {3, 132}) {
                const double host = fa3::schedule_imbalance(p, section, g, c.block_n);
                const double ref = imbalance_by_cta(p, section, g, c.block_n);
                if (host < ref - 1e-9 || host > ref + 1e-9)
                    fail_msg("b %lld h %lld s %lld section %lld g %d: replay %.6f, by CTA %.6f", (long long)c.b,
                             (long long)c.h, (long long)c.s, (long long)section, g, host, ref);
            }
    }
}

void test_short_causal_sections_fit_the_l2(void **) {
    // 16k tokens, hidden 2048: the bar's grid. A pair's K and V: seqlen x d x 4 bytes.
    const struct {
        int64_t s, d;
        int block_n;
    } cases[] = {{512, 256, 80}, {1024, 256, 80}, {512, 128, 128}, {1024, 128, 128}, {2048, 128, 128}, {1024, 64, 128}};
    for (const auto &c : cases) {
        const Problem p = causal(16384 / c.s, 2048 / c.d, c.s, c.d);
        const int section = fa3::causal_section(p, kL2, kSms, c.block_n, 1 << 30);
        const int64_t kv = c.s * c.d * 4;
        if (section * kv > kL2 / 2)
            fail_msg("seqlen %lld d %lld: section of %d pairs holds %lld MB of K/V", (long long)c.s, (long long)c.d,
                     section, (long long)(section * kv >> 20));
        assert_true(fa3::schedule_imbalance(p, section, kSms, c.block_n) < 1.06);
    }
}

void test_long_causal_keeps_the_balancing_section(void **) {
    const Problem p = causal(1, 16, 16384, 128);  // 16 pairs of 8 MB each: one pair fits half the L2
    const int section = fa3::causal_section(p, kL2, kSms, 128, 1 << 30);
    assert_int_equal(section, 13);  // 12 rounds of 132 CTAs: 13 pairs of 128 query tiles
    assert_true(fa3::schedule_imbalance(p, section, kSms, 128) < fa3::schedule_imbalance(p, 1, kSms, 128));
}

void test_limits(void **) {
    Problem p = causal(32, 8, 512, 256);
    assert_true(fa3::causal_section(p, kL2, 3, 80, 3) <= 3);  // FLASHATTN_FA3_MAX_CTAS caps it
    assert_true(fa3::causal_section(p, 0, kSms, 80, 1 << 30) >= 1);  // L2 size unknown
    p.varlen = true;
    p.total_q = p.total_k = 32 * 512;
    assert_true(fa3::schedule_imbalance(p, 1, kSms, 80) == 0.0);  // lengths on the device: no replay
    assert_true(fa3::causal_section(p, kL2, kSms, 80, 1 << 30) >= 1);
    Problem gqa = causal(32, 8, 512, 256, 2);  // K/V shared by four query heads: a quarter per pair
    assert_true(fa3::causal_section(gqa, kL2, kSms, 80, 1 << 30) * 512 * 256 * 4 / 4 <= kL2 / 2);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_matches_the_kernels_order),
        cmocka_unit_test(test_short_causal_sections_fit_the_l2),
        cmocka_unit_test(test_long_causal_keeps_the_balancing_section),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
