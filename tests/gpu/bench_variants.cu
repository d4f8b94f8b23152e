// Forward speed of each attention variant against the same shape without it, per GPU backend
// (issue 19's bar: at least 0.95x). One shape (default batch 2, 16 heads, seqlen 8192, head dim
// 128, bf16), each pair timed in alternating rounds (median of the rounds' means) so that clock
// drift falls on both. The baselines' rows also serve an A/B of two library builds (run it with
// each on LD_LIBRARY_PATH). The opt-in CMake target flashattn-bench-variants builds it (not part
// of `all`); tests/gpu/variants-check.sh builds and runs it on the GPU machine, A/B included:
//
//   cmake --build $BUILD --target flashattn-bench-variants
//   LD_LIBRARY_PATH=$BUILD/src $BUILD/bench/flashattn-bench-variants [seqlen] [head_dim] [backends: fa2,fa3]
//
//   ... flashattn-bench-variants 8192 192 fa2,fa3 128   (only head_dim_v 128 rows, against the square 192)
//   ... flashattn-bench-variants 8192 128 merge         (merge of 8 partial states against a device copy)
//
// Prints a markdown table: backend, variant, its baseline, ms of both, TFLOP/s of the variant
// (2 (d + d_v) FLOPs per visible (query, key) pair of its baseline: FlashAttention's
// 4*b*h*sq*sk*d, halved when causal, windows counted exactly), and the TFLOP/s ratio.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace {

struct Variant {
    const char *name;
    int causal, top_left, alibi, sink_logits;
    int64_t window_left, sink_tokens;
    int baseline;  // index of the row it is compared with (itself: a baseline)
    int use_dv;    // head_dim_v = the command line's dv (only when given) instead of head_dim
};

// Baselines first; each variant names its baseline.
const Variant kVariants[] = {
    {"plain", 0, 0, 0, 0, -1, 0, 0, 0},
    {"causal", 1, 0, 0, 0, -1, 0, 1},
    {"window 1024, causal", 1, 0, 0, 0, 1024, 0, 2},
    {"ALiBi", 0, 0, 1, 0, -1, 0, 0},
    {"ALiBi, causal", 1, 0, 1, 0, -1, 0, 1},
    {"sink logits", 0, 0, 0, 1, -1, 0, 0},
    {"sink logits, causal", 1, 0, 0, 1, -1, 0, 1},
    {"top-left causal (sq = sk)", 1, 1, 0, 0, -1, 0, 1},
    {"4 sink tokens, window 1024, causal", 1, 0, 0, 0, 1024, 4, 2},
    {"head_dim_v", 0, 0, 0, 0, -1, 0, 0, 1},
    {"head_dim_v, causal", 1, 0, 0, 0, -1, 0, 1, 1},
};
constexpr int kCount = sizeof kVariants / sizeof kVariants[0];

#define CHECK_CUDA(x)                                                                 \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));             \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

struct Buffers {
    void *q, *k, *v, *o, *ws = nullptr;
    float *lse, *sink, *slope;
    size_t ws_bytes = 0;
};

flashattn_plan_t *make_plan(const char *backend, const Variant &v, int64_t b, int64_t h, int64_t s, int64_t d,
                            int64_t dv) {
    const flashattn_backend_t be = std::strcmp(backend, "fa3") == 0   ? FLASHATTN_BACKEND_FA3
                                   : std::strcmp(backend, "fa1") == 0 ? FLASHATTN_BACKEND_FA1
                                                                      : FLASHATTN_BACKEND_FA2;
    flashattn_plan_t *plan = nullptr;
    flashattn_plan_create(&plan);
    const struct { flashattn_i64_param_t key; int64_t value; } keys[] = {
        {FLASHATTN_I64_BATCH, b}, {FLASHATTN_I64_SEQLEN_Q, s}, {FLASHATTN_I64_SEQLEN_K, s},
        {FLASHATTN_I64_HEADS_Q, h}, {FLASHATTN_I64_HEADS_KV, h}, {FLASHATTN_I64_HEAD_DIM, d}, {FLASHATTN_I64_HEAD_DIM_V, v.use_dv ? dv : d},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_BF16}, {FLASHATTN_I64_CAUSAL, v.causal},
        {FLASHATTN_I64_WINDOW_LEFT, v.window_left}, {FLASHATTN_I64_BACKEND, be},
        {FLASHATTN_I64_MASK_ALIGN, v.top_left ? FLASHATTN_MASK_ALIGN_TOP_LEFT : FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT},
        {FLASHATTN_I64_SINK_TOKENS, v.sink_tokens}, {FLASHATTN_I64_SINK_LOGITS, v.sink_logits},
        {FLASHATTN_I64_ALIBI, v.alibi}};
    flashattn_status_t st = FLASHATTN_SUCCESS;
    for (const auto &kv : keys)
        if (st == FLASHATTN_SUCCESS) st = flashattn_plan_set_i64(plan, kv.key, kv.value);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_finalize(plan);
    if (st != FLASHATTN_SUCCESS) {
        std::printf("<!-- %s %s: %s -->\n", backend, v.name, flashattn_last_error());
        flashattn_plan_destroy(plan);
        return nullptr;
    }
    return plan;
}

// Mean ms of `reps` executes enqueued back to back (after `warmup`): the events bracket the whole
// batch, so the host's enqueue time (a busy machine's) stays off the GPU's clock.
double time_plan(flashattn_plan_t *plan, const Variant &v, Buffers &buf, int warmup, int reps) {
    size_t ws = 0;
    flashattn_plan_get_workspace_size(plan, &ws);
    if (ws > buf.ws_bytes) {
        if (buf.ws) CHECK_CUDA(cudaFree(buf.ws));
        CHECK_CUDA(cudaMalloc(&buf.ws, ws));
        buf.ws_bytes = ws;
    }
    flashattn_args_t *args = nullptr;
    flashattn_args_create(&args);
    flashattn_args_set(args, FLASHATTN_ARG_Q, buf.q);
    flashattn_args_set(args, FLASHATTN_ARG_K, buf.k);
    flashattn_args_set(args, FLASHATTN_ARG_V, buf.v);
    flashattn_args_set(args, FLASHATTN_ARG_O, buf.o);
    flashattn_args_set(args, FLASHATTN_ARG_LSE, buf.lse);
    if (v.sink_logits) flashattn_args_set(args, FLASHATTN_ARG_SINK_LOGITS, buf.sink);
    if (v.alibi) flashattn_args_set(args, FLASHATTN_ARG_ALIBI_SLOPES, buf.slope);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    flashattn_status_t st = FLASHATTN_SUCCESS;
    for (int i = 0; i < warmup && st == FLASHATTN_SUCCESS; ++i)
        st = flashattn_plan_execute_args(plan, args, buf.ws, ws, nullptr);
    CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < reps && st == FLASHATTN_SUCCESS; ++i)
        st = flashattn_plan_execute_args(plan, args, buf.ws, ws, nullptr);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    flashattn_args_destroy(args);
    if (st != FLASHATTN_SUCCESS) {
        std::printf("<!-- execute: %s -->\n", flashattn_last_error());
        return -1.0;
    }
    return t / reps;
}

// Visible (query, key) pairs of one head: causal bottom-right (sq = sk) and a left window.
double visible_pairs(const Variant &v, int64_t s) {
    double n = 0;
    for (int64_t i = 0; i < s; ++i) {
        int64_t last = v.causal ? i : s - 1;
        int64_t first = v.window_left >= 0 ? std::max<int64_t>(0, i - v.window_left) : 0;
        n += static_cast<double>(last - first + 1);
    }
    return n;
}

// Merge of 8 partial states (flashattn_plan_merge_states) at this shape against a device-to-device
// copy of the same buffer size (issue 19's bar: at least 80% of copy bandwidth). Bandwidth counts
// the bytes every merge must move: each partial's O and LSE read once, O and LSE written once; the
// copy's bytes are read + written.
void bench_merge(int64_t b, int64_t h, int64_t s, int64_t d) {
    constexpr int kParts = 8, kReps = 20;
    const size_t rows = static_cast<size_t>(b * s * h);
    flashattn_plan_t *plan = nullptr;
    flashattn_plan_create(&plan);
    const struct { flashattn_i64_param_t key; int64_t value; } keys[] = {
        {FLASHATTN_I64_BATCH, b}, {FLASHATTN_I64_SEQLEN_Q, s}, {FLASHATTN_I64_SEQLEN_K, s},
        {FLASHATTN_I64_HEADS_Q, h}, {FLASHATTN_I64_HEADS_KV, h}, {FLASHATTN_I64_HEAD_DIM, d},
        {FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_BF16}, {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_FA2}};
    for (const auto &kv : keys) flashattn_plan_set_i64(plan, kv.key, kv.value);
    if (flashattn_plan_finalize(plan) != FLASHATTN_SUCCESS) {
        std::printf("<!-- merge plan: %s -->\n", flashattn_last_error());
        flashattn_plan_destroy(plan);
        return;
    }
    void *part = nullptr, *o = nullptr, *copy_src = nullptr, *copy_dst = nullptr;
    float *lse_part = nullptr, *lse = nullptr;
    const size_t part_bytes = rows * d * 4;  // room for fp32 partials
    CHECK_CUDA(cudaMalloc(&part, kParts * part_bytes));
    CHECK_CUDA(cudaMalloc(&lse_part, kParts * rows * 4));
    CHECK_CUDA(cudaMalloc(&o, rows * d * 2));
    CHECK_CUDA(cudaMalloc(&lse, rows * 4));
    CHECK_CUDA(cudaMemset(part, 0, kParts * part_bytes));
    {  // finite LSEs that differ per partial, so that every partial contributes
        std::vector<float> host(kParts * rows);
        for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
        CHECK_CUDA(cudaMemcpy(lse_part, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    }
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    auto time_ms = [&](auto &&fn) {
        for (int i = 0; i < 3; ++i) fn();
        std::vector<double> t;
        for (int r = 0; r < 5; ++r) {
            CHECK_CUDA(cudaEventRecord(e0));
            for (int i = 0; i < kReps; ++i) fn();
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms = 0.f;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms / kReps);
        }
        std::sort(t.begin(), t.end());
        return t[2];
    };
    // The copy: as many bytes as the bf16 merge reads (src) and writes (dst), one buffer of each.
    const size_t copy_bytes = kParts * rows * d * 2;
    CHECK_CUDA(cudaMalloc(&copy_src, copy_bytes));
    CHECK_CUDA(cudaMalloc(&copy_dst, copy_bytes));
    const double copy_ms = time_ms([&] { CHECK_CUDA(cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice)); });
    const double copy_bw = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;
    std::printf("\n## Merge of %d partials: batch %lld, heads %lld, seqlen %lld, head dim %lld, bf16 output\n\n", kParts,
                static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(s),
                static_cast<long long>(d));
    std::printf("| partials | ms | TB/s (bytes moved) | fraction of copy |\n|---|---|---|---|\n");
    std::printf("| (device-to-device copy, %.0f MiB) | %.3f | %.2f | 1 |\n", copy_bytes / 1048576.0, copy_ms, copy_bw);
    for (const flashattn_dtype_t dt : {FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32}) {
        const size_t elt = dt == FLASHATTN_DTYPE_FP32 ? 4 : 2;
        const void *po[kParts];
        const float *pl[kParts];
        for (int i = 0; i < kParts; ++i) {
            po[i] = static_cast<const char *>(part) + i * rows * d * elt;
            pl[i] = lse_part + i * rows;
        }
        flashattn_status_t st = FLASHATTN_SUCCESS;
        const double ms = time_ms([&] {
            if (st == FLASHATTN_SUCCESS) st = flashattn_plan_merge_states(plan, kParts, po, pl, dt, o, lse, nullptr);
        });
        if (st != FLASHATTN_SUCCESS) {
            std::printf("<!-- merge: %s -->\n", flashattn_last_error());
            continue;
        }
        const double bytes = kParts * rows * (d * elt + 4.0) + rows * (d * 2 + 4.0);
        const double bw = bytes / (ms * 1e-3) / 1e12;
        std::printf("| %s | %.3f | %.2f | %.3f |\n", elt == 4 ? "fp32" : "bf16", ms, bw, bw / copy_bw);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    for (void *ptr : {part, o, copy_src, copy_dst, static_cast<void *>(lse_part), static_cast<void *>(lse)})
        CHECK_CUDA(cudaFree(ptr));
    flashattn_plan_destroy(plan);
}

}  // namespace

int main(int argc, char **argv) {
    const int64_t s = argc > 1 ? std::atoll(argv[1]) : 8192;
    const int64_t d = argc > 2 ? std::atoll(argv[2]) : 128;
    const std::string backends = argc > 3 ? argv[3] : "fa2,fa3";
    const int64_t dv = argc > 4 ? std::atoll(argv[4]) : 0;  // 0: no head_dim_v rows
    const int64_t b = 2, h = 16;
    const size_t n = static_cast<size_t>(b * s * h * std::max(d, dv));  // Q, K and V (dv > d: V's width)
    Buffers buf;
    CHECK_CUDA(cudaMalloc(&buf.q, n * 2));
    CHECK_CUDA(cudaMalloc(&buf.k, n * 2));
    CHECK_CUDA(cudaMalloc(&buf.v, n * 2));
    CHECK_CUDA(cudaMalloc(&buf.o, static_cast<size_t>(b * s * h) * std::max(d, dv) * 2));
    CHECK_CUDA(cudaMalloc(&buf.lse, static_cast<size_t>(b * h * s) * 4));
    CHECK_CUDA(cudaMalloc(&buf.sink, static_cast<size_t>(h) * 4));
    CHECK_CUDA(cudaMalloc(&buf.slope, static_cast<size_t>(h) * 4));
    {  // inputs: small bf16 values (the speed does not depend on them); slopes 2^-8(i+1)/h
        std::vector<uint16_t> host(n);
        uint32_t x = 12345;
        for (auto &e : host) {
            x = x * 1664525u + 1013904223u;
            e = static_cast<uint16_t>(0x3c00 | ((x >> 16) & 0x7f) | ((x >> 8) & 0x8000));  // ~ +-(0.0078 .. 0.0156)
        }
        for (void *p : {buf.q, buf.k, buf.v}) CHECK_CUDA(cudaMemcpy(p, host.data(), n * 2, cudaMemcpyHostToDevice));
        std::vector<float> sinks(h), slopes(h);
        for (int64_t i = 0; i < h; ++i) {
            sinks[i] = 0.5f;
            slopes[i] = static_cast<float>(std::exp2(-8.0 * static_cast<double>(i + 1) / static_cast<double>(h)));
        }
        CHECK_CUDA(cudaMemcpy(buf.sink, sinks.data(), h * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(buf.slope, slopes.data(), h * 4, cudaMemcpyHostToDevice));
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("## Variants' forward speed: %s, %s, batch %lld, heads %lld, seqlen %lld, head dim %lld, bf16\n\n",
                prop.name, flashattn_version_string(), static_cast<long long>(b), static_cast<long long>(h),
                static_cast<long long>(s), static_cast<long long>(d));
    std::printf("| backend | variant | baseline | ms | baseline ms | TFLOP/s | ratio |\n|---|---|---|---|---|---|---|\n");
    const int rounds = 5, warmup = 3, reps = 10;
    size_t pos = 0;
    while (pos <= backends.size()) {
        const size_t comma = std::min(backends.find(',', pos), backends.size());
        const std::string be = backends.substr(pos, comma - pos);
        pos = comma + 1;
        if (be == "merge") {
            bench_merge(b, h, s, d);
            continue;
        }
        for (int vi = 0; vi < kCount; ++vi) {
            const Variant &v = kVariants[vi], &base = kVariants[v.baseline];
            if ((v.use_dv != 0) != (dv != 0)) continue;  // with dv: only the head_dim_v rows
            flashattn_plan_t *pv = make_plan(be.c_str(), v, b, h, s, d, dv);
            flashattn_plan_t *pb = make_plan(be.c_str(), base, b, h, s, d, dv);
            if (pv == nullptr || pb == nullptr) {
                std::printf("| %s | %s | %s | refused | | | |\n", be.c_str(), v.name, base.name);
            } else {
                std::vector<double> tv, tb;
                for (int r = 0; r < rounds; ++r) {  // alternate which goes first
                    if (r & 1) tb.push_back(time_plan(pb, base, buf, warmup, reps));
                    tv.push_back(time_plan(pv, v, buf, warmup, reps));
                    if (!(r & 1)) tb.push_back(time_plan(pb, base, buf, warmup, reps));
                }
                std::sort(tv.begin(), tv.end());
                std::sort(tb.begin(), tb.end());
                const double mv = tv[rounds / 2], mb = tb[rounds / 2];
                // FLOPs 2 (d + d_v) per visible pair, of the baseline's pairs for both.
                const double pairs = 2.0 * b * h * visible_pairs(base, s);
                const double fv = pairs * static_cast<double>(d + (v.use_dv ? dv : d)), fb = pairs * 2.0 * d;
                std::printf("| %s | %s | %s | %.3f | %.3f | %.0f | %.3f |\n", be.c_str(), v.name, base.name, mv, mb,
                            fv / (mv * 1e-3) / 1e12, (fv / mv) / (fb / mb));
            }
            flashattn_plan_destroy(pv);
            flashattn_plan_destroy(pb);
        }
    }
    return 0;
}
