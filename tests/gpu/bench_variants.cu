// Forward (and, with the -bwd backends, backward) speed of each attention variant against the
// same shape without it, per GPU backend (issue 19's bar: at least 0.95x). One shape (default
// batch 2, 16 heads, seqlen 8192, head dim 128, bf16), each pair timed in alternating rounds
// (median of the rounds' means) so that clock drift falls on both. The baselines' rows also serve
// an A/B of two library builds (run it with each on LD_LIBRARY_PATH). The opt-in CMake target
// flashattn-bench-variants builds it (not part of `all`); tests/gpu/variants-check.sh builds and
// runs it on the GPU machine, A/B included:
//
//   cmake --build $BUILD --target flashattn-bench-variants
//   LD_LIBRARY_PATH=$BUILD/src $BUILD/bench/flashattn-bench-variants [seqlen] [head_dim] [backends: fa2,fa3]
//
//   ... flashattn-bench-variants 8192 192 fa2,fa3 128   (only head_dim_v 128 rows, against the square 192)
//   ... flashattn-bench-variants 8192 128 merge         (merge of 8 partial states against a device copy)
//   ... flashattn-bench-variants 8192 128 fa2-bwd,fa3-bwd (backward pass; they mix: fa2,fa3,fa2-bwd)
//
// Prints a markdown table: backend, variant, its baseline, ms of both, TFLOP/s of the variant
// (2 (d + d_v) FLOPs per visible (query, key) pair of its baseline: FlashAttention's
// 4*b*h*sq*sk*d, halved when causal, windows counted exactly), and the TFLOP/s ratio.
//
// A -bwd backend forces the plan to that generation as the forward rows do, runs each plan's
// forward once (its own O and LSE, so the two plans of a row don't overwrite each other's) and
// times flashattn_plan_execute_backward_args() with random dO. Its TFLOP/s counts 2.5x the
// forward's FLOPs (FlashAttention's convention: 5 matmul-sized products against the forward's 2).
// A row whose backward the library refuses, or runs on another generation than asked (it would
// time another kernel), says so instead of timing it.
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
    {"causal", 1, 0, 0, 0, -1, 0, 1, 0},
    {"window 1024, causal", 1, 0, 0, 0, 1024, 0, 2, 0},
    {"ALiBi", 0, 0, 1, 0, -1, 0, 0, 0},
    {"ALiBi, causal", 1, 0, 1, 0, -1, 0, 1, 0},
    {"sink logits", 0, 0, 0, 1, -1, 0, 0, 0},
    {"sink logits, causal", 1, 0, 0, 1, -1, 0, 1, 0},
    {"top-left causal (sq = sk)", 1, 1, 0, 0, -1, 0, 1, 0},
    {"4 sink tokens, window 1024, causal", 1, 0, 0, 0, 1024, 4, 2, 0},
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
    void *q, *k, *v, *ws = nullptr;
    void *o[2];  // slot 0: the variant's; slot 1: its baseline's in -bwd rows (forward rows share 0)
    float *lse[2];
    void *dout, *dq, *dk, *dv;
    float *sink, *slope, *dsink;
    size_t ws_bytes = 0;
};

flashattn_backend_t backend_of(const char *name) {
    return std::strcmp(name, "fa3") == 0   ? FLASHATTN_BACKEND_FA3
           : std::strcmp(name, "fa1") == 0 ? FLASHATTN_BACKEND_FA1
                                           : FLASHATTN_BACKEND_FA2;
}

const char *backend_name(flashattn_backend_t be) {
    switch (be) {
        case FLASHATTN_BACKEND_CPU: return "cpu";
        case FLASHATTN_BACKEND_FA1: return "fa1";
        case FLASHATTN_BACKEND_FA2: return "fa2";
        case FLASHATTN_BACKEND_FA3: return "fa3";
        default: return "auto";
    }
}

flashattn_plan_t *make_plan(const char *backend, const Variant &v, int64_t b, int64_t h, int64_t s, int64_t d,
                            int64_t dv) {
    const flashattn_backend_t be = backend_of(backend);
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

// One workspace serves every plan, forward and backward: grown to the largest need seen.
void ensure_workspace(Buffers &buf, size_t bytes) {
    if (bytes <= buf.ws_bytes) return;
    if (buf.ws) CHECK_CUDA(cudaFree(buf.ws));
    CHECK_CUDA(cudaMalloc(&buf.ws, bytes));
    buf.ws_bytes = bytes;
}

// The tensors of one plan's execute (O and LSE of its slot); with `backward` also dO and the
// gradients. Only what the plan uses: the library refuses any other pointer.
flashattn_args_t *make_args(const Variant &v, const Buffers &buf, int slot, bool backward) {
    flashattn_args_t *args = nullptr;
    flashattn_args_create(&args);
    flashattn_args_set(args, FLASHATTN_ARG_Q, buf.q);
    flashattn_args_set(args, FLASHATTN_ARG_K, buf.k);
    flashattn_args_set(args, FLASHATTN_ARG_V, buf.v);
    flashattn_args_set(args, FLASHATTN_ARG_O, buf.o[slot]);
    flashattn_args_set(args, FLASHATTN_ARG_LSE, buf.lse[slot]);
    if (v.sink_logits) flashattn_args_set(args, FLASHATTN_ARG_SINK_LOGITS, buf.sink);
    if (v.alibi) flashattn_args_set(args, FLASHATTN_ARG_ALIBI_SLOPES, buf.slope);
    if (backward) {
        flashattn_args_set(args, FLASHATTN_ARG_DOUT, buf.dout);
        flashattn_args_set(args, FLASHATTN_ARG_DQ, buf.dq);
        flashattn_args_set(args, FLASHATTN_ARG_DK, buf.dk);
        flashattn_args_set(args, FLASHATTN_ARG_DV, buf.dv);
        if (v.sink_logits) flashattn_args_set(args, FLASHATTN_ARG_DSINK_LOGITS, buf.dsink);
    }
    return args;
}

// Mean ms of `reps` executes (forward, or backward) enqueued back to back (after `warmup`): the
// events bracket the whole batch, so the host's enqueue time (a busy machine's) stays off the
// GPU's clock.
double time_plan(const flashattn_plan_t *plan, const flashattn_args_t *args, bool backward, Buffers &buf,
                 int warmup, int reps) {
    size_t ws = 0;
    if (backward)
        flashattn_plan_get_backward_workspace_size(plan, &ws);
    else
        flashattn_plan_get_workspace_size(plan, &ws);
    ensure_workspace(buf, ws);
    auto run = [&] {
        return backward ? flashattn_plan_execute_backward_args(plan, args, buf.ws, ws, nullptr)
                        : flashattn_plan_execute_args(plan, args, buf.ws, ws, nullptr);
    };
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    flashattn_status_t st = FLASHATTN_SUCCESS;
    for (int i = 0; i < warmup && st == FLASHATTN_SUCCESS; ++i) st = run();
    CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < reps && st == FLASHATTN_SUCCESS; ++i) st = run();
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (st != FLASHATTN_SUCCESS) {
        std::printf("<!-- %s: %s -->\n", backward ? "execute backward" : "execute", flashattn_last_error());
        return -1.0;
    }
    return t / reps;
}

// A library message fit for a table cell: no '|' or newline, at most ~80 characters.
std::string cell_text(const char *msg) {
    std::string t(msg);
    for (char &c : t)
        if (c == '|' || c == '\n') c = ' ';
    return t.size() > 80 ? t.substr(0, 77) + "..." : t;
}

// Why a -bwd row cannot time this plan's backward ("" when it can): the library refuses it, or
// runs it on another backend than the forced generation (the row would time another kernel).
std::string backward_refusal(const flashattn_plan_t *plan, flashattn_backend_t want) {
    flashattn_backend_t got = want;
    const char *reason = nullptr;
    if (flashattn_plan_get_backward_backend(plan, &got, &reason) != FLASHATTN_SUCCESS)
        return "refused: " + cell_text(flashattn_last_error());
    if (got != want) return std::string("runs on ") + backend_name(got) + ": " + cell_text(reason ? reason : "");
    return "";
}

// The forward that the backward differentiates, once per plan: it fills the slot's O and LSE.
std::string run_forward(const flashattn_plan_t *plan, const Variant &v, Buffers &buf, int slot) {
    size_t ws = 0;
    flashattn_plan_get_workspace_size(plan, &ws);
    ensure_workspace(buf, ws);
    flashattn_args_t *args = make_args(v, buf, slot, false);
    const flashattn_status_t st = flashattn_plan_execute_args(plan, args, buf.ws, ws, nullptr);
    flashattn_args_destroy(args);
    if (st != FLASHATTN_SUCCESS) return "forward failed: " + cell_text(flashattn_last_error());
    CHECK_CUDA(cudaDeviceSynchronize());
    return "";
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

struct Shape {
    int64_t b, h, s, d, dv;
};

// One table row: variant v against its baseline on backend `be` ("fa2", "fa3", or "fa2-bwd",
// "fa3-bwd": the backward of that generation), in alternating rounds (median of the rounds).
void bench_row(const std::string &be, const Variant &v, const Variant &base, const Shape &sh, Buffers &buf) {
    const bool bwd = be.size() > 4 && be.compare(be.size() - 4, 4, "-bwd") == 0;
    const std::string gen = bwd ? be.substr(0, be.size() - 4) : be;
    flashattn_plan_t *pv = make_plan(gen.c_str(), v, sh.b, sh.h, sh.s, sh.d, sh.dv);
    flashattn_plan_t *pb = make_plan(gen.c_str(), base, sh.b, sh.h, sh.s, sh.d, sh.dv);
    std::string why = pv == nullptr || pb == nullptr ? "refused" : "";
    if (why.empty() && bwd) why = backward_refusal(pv, backend_of(gen.c_str()));
    if (why.empty() && bwd) {
        why = backward_refusal(pb, backend_of(gen.c_str()));
        if (!why.empty()) why = "baseline " + why;
    }
    // Backward rows: each plan's own slot, so each differentiates its own forward's O and LSE.
    const int slot_b = bwd ? 1 : 0;
    if (why.empty() && bwd) why = run_forward(pv, v, buf, 0);
    if (why.empty() && bwd) why = run_forward(pb, base, buf, slot_b);
    if (!why.empty()) {
        std::printf("| %s | %s | %s | %s | | | |\n", be.c_str(), v.name, base.name, why.c_str());
    } else {
        const int rounds = 5, warmup = 3, reps = 10;
        flashattn_args_t *av = make_args(v, buf, 0, bwd), *ab = make_args(base, buf, slot_b, bwd);
        std::vector<double> tv, tb;
        for (int r = 0; r < rounds; ++r) {  // alternate which goes first
            if (r & 1) tb.push_back(time_plan(pb, ab, bwd, buf, warmup, reps));
            tv.push_back(time_plan(pv, av, bwd, buf, warmup, reps));
            if (!(r & 1)) tb.push_back(time_plan(pb, ab, bwd, buf, warmup, reps));
        }
        flashattn_args_destroy(av);
        flashattn_args_destroy(ab);
        std::sort(tv.begin(), tv.end());
        std::sort(tb.begin(), tb.end());
        const double mv = tv[rounds / 2], mb = tb[rounds / 2];
        // FLOPs 2 (d + d_v) per visible pair, of the baseline's pairs for both; the backward 2.5x.
        const double pairs = (bwd ? 2.5 : 1.0) * 2.0 * sh.b * sh.h * visible_pairs(base, sh.s);
        const double fv = pairs * static_cast<double>(sh.d + (v.use_dv ? sh.dv : sh.d)), fb = pairs * 2.0 * sh.d;
        if (tv.front() < 0 || tb.front() < 0)  // an execute failed: its comment above says why
            std::printf("| %s | %s | %s | failed | | | |\n", be.c_str(), v.name, base.name);
        else
            std::printf("| %s | %s | %s | %.3f | %.3f | %.0f | %.3f |\n", be.c_str(), v.name, base.name, mv, mb,
                        fv / (mv * 1e-3) / 1e12, (fv / mv) / (fb / mb));
    }
    flashattn_plan_destroy(pv);
    flashattn_plan_destroy(pb);
}

// n small random bf16 values, ~ +-(0.0078 .. 0.0156) (the speed does not depend on them), to `dst`.
void fill_random_bf16(void *dst, size_t n, uint32_t seed) {
    std::vector<uint16_t> host(n);
    uint32_t x = seed;
    for (auto &e : host) {
        x = x * 1664525u + 1013904223u;
        e = static_cast<uint16_t>(0x3c00 | ((x >> 16) & 0x7f) | ((x >> 8) & 0x8000));
    }
    CHECK_CUDA(cudaMemcpy(dst, host.data(), n * 2, cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char **argv) {
    const int64_t s = argc > 1 ? std::atoll(argv[1]) : 8192;
    const int64_t d = argc > 2 ? std::atoll(argv[2]) : 128;
    const std::string backends = argc > 3 ? argv[3] : "fa2,fa3";
    const int64_t dv = argc > 4 ? std::atoll(argv[4]) : 0;  // 0: no head_dim_v rows
    const int64_t b = 2, h = 16;
    // Every [b, s, h, dim] tensor gets room for the wider of d and dv (Q, K, V, O and their gradients).
    const size_t n = static_cast<size_t>(b * s * h * std::max(d, dv));
    const size_t rows = static_cast<size_t>(b * h * s);
    Buffers buf;
    for (void **p : {&buf.q, &buf.k, &buf.v, &buf.o[0], &buf.o[1], &buf.dout, &buf.dq, &buf.dk, &buf.dv})
        CHECK_CUDA(cudaMalloc(p, n * 2));
    for (float **p : {&buf.lse[0], &buf.lse[1]}) CHECK_CUDA(cudaMalloc(p, rows * 4));
    for (float **p : {&buf.sink, &buf.slope, &buf.dsink}) CHECK_CUDA(cudaMalloc(p, static_cast<size_t>(h) * 4));
    for (void *p : {buf.q, buf.k, buf.v}) fill_random_bf16(p, n, 12345);
    fill_random_bf16(buf.dout, n, 54321);
    {  // sink logits 0.5; slopes 2^-8(i+1)/h
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
    std::printf("## Variants' speed (forward; -bwd backends: backward): %s, %s, batch %lld, heads %lld, seqlen %lld, "
                "head dim %lld, bf16\n\n",
                prop.name, flashattn_version_string(), static_cast<long long>(b), static_cast<long long>(h),
                static_cast<long long>(s), static_cast<long long>(d));
    std::printf("| backend | variant | baseline | ms | baseline ms | TFLOP/s | ratio |\n|---|---|---|---|---|---|---|\n");
    const Shape shape{b, h, s, d, dv};
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
            const Variant &v = kVariants[vi];
            if ((v.use_dv != 0) != (dv != 0)) continue;  // with dv: only the head_dim_v rows
            bench_row(be, v, kVariants[v.baseline], shape, buf);
        }
    }
    return 0;
}
