// flashattn-bench --backend cpu: the library's CPU backend against a naive attention.
//
// The naive method is the unfused "standard attention" written plainly on the host, in three
// phases per (batch, head): S = scale * Q K^T into a full seqlen_q x seqlen_k fp32 matrix (keys
// transposed once so the inner loop is contiguous), a row softmax of S in place (std::exp, causal
// mask applied after the full product), then O = P V. Its loops are vectorised by the compiler,
// with an AVX2+FMA build chosen at run time exactly as the CPU backend chooses its own, and it runs
// on as many threads as the CPU backend (one (batch, head) per thread at a time), so the
// comparison is between algorithms, not between thread counts or instruction sets.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "bench_common.h"

namespace bench {
namespace {

struct AlignedFree {
    void operator()(void *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, AlignedFree>;

Buffer alloc_floats(size_t n) {
    size_t bytes = std::max<size_t>(n * sizeof(float), 256);
    bytes = (bytes + 255) / 256 * 256;
    void *p = std::aligned_alloc(256, bytes);
    if (p == nullptr) {
        std::fprintf(stderr, "flashattn-bench: out of host memory (%zu bytes)\n", bytes);
        std::exit(3);
    }
    return Buffer(static_cast<float *>(p));
}

struct Shape {
    int64_t b, sq, sk, h, d;
    bool causal;
    float scale;
};

// One (batch, head) of the naive method. S holds sq*sk floats, kt d*sk floats (thread-private).
// Layout of q, k, v, o: [b, s, h, d] contiguous; lse: [b, h, sq].
__attribute__((always_inline)) inline void naive_head_body(const Shape &s, const float *q, const float *k,
                                                           const float *v, float *o, float *lse, int64_t bi,
                                                           int64_t hi, float *S, float *kt) {
    const int64_t row = s.h * s.d;  // elements between sequence positions
    const float *qh = q + bi * s.sq * row + hi * s.d;
    const float *kh = k + bi * s.sk * row + hi * s.d;
    const float *vh = v + bi * s.sk * row + hi * s.d;
    float *oh = o + bi * s.sq * row + hi * s.d;
    float *lseh = lse ? lse + (bi * s.h + hi) * s.sq : nullptr;
    const int64_t sq = s.sq, sk = s.sk, d = s.d;

    // K^T, so that the inner loop of Q K^T runs over contiguous keys.
    for (int64_t j = 0; j < sk; ++j)
        for (int64_t x = 0; x < d; ++x) kt[x * sk + j] = kh[j * row + x];

    // Phase 1: S = scale * Q K^T, the full matrix.
    for (int64_t i = 0; i < sq; ++i) {
        float *srow = S + i * sk;
        for (int64_t j = 0; j < sk; ++j) srow[j] = 0.0f;
        for (int64_t x = 0; x < d; ++x) {
            const float qv = qh[i * row + x] * s.scale;
            const float *ktx = kt + x * sk;
            for (int64_t j = 0; j < sk; ++j) srow[j] += qv * ktx[j];
        }
    }
    // Phase 2: masked row softmax of S, in place (P overwrites S), fp32.
    for (int64_t i = 0; i < sq; ++i) {
        float *srow = S + i * sk;
        int64_t visible = sk;  // keys j < visible are unmasked (bottom-right causal)
        if (s.causal) visible = std::min<int64_t>(sk, std::max<int64_t>(0, i + sk - sq + 1));
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) m = std::max(m, srow[j]);
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) {
            const float e = std::exp(srow[j] - m);
            srow[j] = e;
            sum += e;
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t j = 0; j < visible; ++j) srow[j] *= inv;
        for (int64_t j = visible; j < sk; ++j) srow[j] = 0.0f;
        if (lseh) lseh[i] = sum > 0.0f ? m + std::log(sum) : -std::numeric_limits<float>::infinity();
    }
    // Phase 3: O = P V.
    float acc[256];
    for (int64_t i = 0; i < sq; ++i) {
        const float *prow = S + i * sk;
        for (int64_t x = 0; x < d; ++x) acc[x] = 0.0f;
        for (int64_t j = 0; j < sk; ++j) {
            const float p = prow[j];
            const float *vj = vh + j * row;
            for (int64_t x = 0; x < d; ++x) acc[x] += p * vj[x];
        }
        for (int64_t x = 0; x < d; ++x) oh[i * row + x] = acc[x];
    }
}

__attribute__((target("avx2,fma"))) void naive_head_avx2(const Shape &s, const float *q, const float *k,
                                                         const float *v, float *o, float *lse, int64_t bi,
                                                         int64_t hi, float *S, float *kt) {
    naive_head_body(s, q, k, v, o, lse, bi, hi, S, kt);
}

void naive_head_generic(const Shape &s, const float *q, const float *k, const float *v, float *o, float *lse,
                        int64_t bi, int64_t hi, float *S, float *kt) {
    naive_head_body(s, q, k, v, o, lse, bi, hi, S, kt);
}

bool has_avx2_fma() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// Runs head(t, batch index, head index) for every (batch, head) pair on `threads` threads, each
// pair once; t is the worker (0 .. threads-1), for its private scratch.
template <typename HeadFn> void for_each_head(const Shape &s, int threads, const HeadFn &head) {
    const int64_t items = s.b * s.h;
    std::atomic<int64_t> next{0};
    auto work = [&](int t) {
        for (;;) {
            const int64_t it = next.fetch_add(1);
            if (it >= items) break;
            head(static_cast<size_t>(t), it / s.h, it % s.h);
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto &th : pool) th.join();
}

// The naive method over all (batch, head) pairs on `threads` threads; `scratch` holds one
// (S, K^T) pair per thread.
void naive_attention(const Shape &s, const float *q, const float *k, const float *v, float *o, float *lse,
                     int threads, std::vector<Buffer> &scratch_s, std::vector<Buffer> &scratch_kt) {
    static const bool avx2 = has_avx2_fma();
    for_each_head(s, threads, [&](size_t t, int64_t bi, int64_t hi) {
        float *S = scratch_s[t].get();
        float *kt = scratch_kt[t].get();
        if (avx2) naive_head_avx2(s, q, k, v, o, lse, bi, hi, S, kt);
        else naive_head_generic(s, q, k, v, o, lse, bi, hi, S, kt);
    });
}

// Gradients of one (batch, head) by the naive method: the forward's three phases recompute P into
// S (and O into `o`, which the backward does not read), then, a query row at a time,
// dV += P^T dO, dP = dO V^T (one row, in `dp`), D = rowsum(P * dP), dS = P * (dP - D),
// dQ = scale dS K, dK += scale dS^T Q. dQ/dK/dV: [b, s, h, d] like Q/K/V. `kt` holds d*sk floats,
// `dp` sk floats.
__attribute__((always_inline)) inline void naive_backward_body(const Shape &s, const float *q, const float *k,
                                                               const float *v, const float *dout, float *o,
                                                               float *dq, float *dk, float *dv, int64_t bi,
                                                               int64_t hi, float *S, float *kt, float *dp) {
    naive_head_body(s, q, k, v, o, nullptr, bi, hi, S, kt);
    const int64_t row = s.h * s.d;
    const int64_t base_q = bi * s.sq * row + hi * s.d, base_k = bi * s.sk * row + hi * s.d;
    const int64_t sq = s.sq, sk = s.sk, d = s.d;
    for (int64_t j = 0; j < sk; ++j)
        for (int64_t x = 0; x < d; ++x) dk[base_k + j * row + x] = dv[base_k + j * row + x] = 0.0f;
    float acc[256];
    for (int64_t i = 0; i < sq; ++i) {
        const float *prow = S + i * sk;
        const float *doi = dout + base_q + i * row;
        const float *qi = q + base_q + i * row;
        float dsum = 0.0f;
        for (int64_t j = 0; j < sk; ++j) {
            const float *vj = v + base_k + j * row;
            float *dvj = dv + base_k + j * row;
            float dot = 0.0f;
            for (int64_t x = 0; x < d; ++x) {
                dvj[x] += prow[j] * doi[x];
                dot += doi[x] * vj[x];
            }
            dp[j] = dot;
            dsum += prow[j] * dot;
        }
        for (int64_t x = 0; x < d; ++x) acc[x] = 0.0f;
        for (int64_t j = 0; j < sk; ++j) {
            const float ds = prow[j] * (dp[j] - dsum) * s.scale;
            const float *kj = k + base_k + j * row;
            float *dkj = dk + base_k + j * row;
            for (int64_t x = 0; x < d; ++x) {
                acc[x] += ds * kj[x];
                dkj[x] += ds * qi[x];
            }
        }
        for (int64_t x = 0; x < d; ++x) dq[base_q + i * row + x] = acc[x];
    }
}

__attribute__((target("avx2,fma"))) void naive_backward_avx2(const Shape &s, const float *q, const float *k,
                                                             const float *v, const float *dout, float *o, float *dq,
                                                             float *dk, float *dv, int64_t bi, int64_t hi, float *S,
                                                             float *kt, float *dp) {
    naive_backward_body(s, q, k, v, dout, o, dq, dk, dv, bi, hi, S, kt, dp);
}

void naive_backward_generic(const Shape &s, const float *q, const float *k, const float *v, const float *dout,
                            float *o, float *dq, float *dk, float *dv, int64_t bi, int64_t hi, float *S, float *kt,
                            float *dp) {
    naive_backward_body(s, q, k, v, dout, o, dq, dk, dv, bi, hi, S, kt, dp);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (all threads), in seconds: less sensitive than wall time to other
// processes competing for the cores.
double cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void fill_random(float *x, size_t n, std::mt19937_64 &rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) x[i] = dist(rng);
}

void poison(float *x, size_t n) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < n; ++i) x[i] = nan;
}

struct Diff {
    double max_abs = 0.0;
    double rel_l2 = 0.0;
    size_t nonfinite = 0;
};

Diff compare(const float *x, const float *ref, size_t n) {
    Diff r;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i]) && !(std::isinf(x[i]) && x[i] == ref[i])) {
            ++r.nonfinite;
            continue;
        }
        if (std::isinf(ref[i])) continue;  // equal infinities (fully masked LSE rows)
        const double e = std::fabs(static_cast<double>(x[i]) - ref[i]);
        r.max_abs = std::max(r.max_abs, e);
        num += e * e;
        den += static_cast<double>(ref[i]) * ref[i];
    }
    r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    return r;
}

std::string bytes_text(double bytes) {
    if (bytes >= 1024.0 * 1024.0) return format("%.2f MiB", bytes / (1024.0 * 1024.0));
    if (bytes >= 1024.0) return format("%.1f KiB", bytes / 1024.0);
    return format("%.0f B", bytes);
}

// The CPU grid, as run_cpu reads it from the options.
struct CpuGrid {
    int64_t b, h, d;
    std::vector<int64_t> seqlens;
    std::vector<int> causal_list;
    int warmup, reps, naive_threads;
};

// One method of the backward table: its timings (backward alone, forward + backward back to back)
// and its gradients.
struct BwdMethod {
    const char *name;        // "naive" or "cpu" (the library)
    bool deterministic;      // the library with FLASHATTN_I64_DETERMINISTIC = 1
    flashattn_plan_t *plan;  // null for naive
    size_t ws_bytes;
    Buffer ws, o, lse, dq, dk, dv;
    std::vector<double> t_bwd, t_fwd_bwd;
};

// A finalized fp32 plan of the CPU backend for shape s.
flashattn_status_t make_cpu_plan(const Shape &s, bool deterministic, flashattn_plan_t **out) {
    flashattn_status_t st =
        create_shaped_plan(PlanKeys{s.b, s.sq, s.sk, s.h, s.h, s.d, FLASHATTN_DTYPE_FP32, s.causal, FLASHATTN_BACKEND_CPU}, out);
    if (st == FLASHATTN_SUCCESS && deterministic) st = flashattn_plan_set_i64(*out, FLASHATTN_I64_DETERMINISTIC, 1);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_finalize(*out);
    if (st != FLASHATTN_SUCCESS) {
        flashattn_plan_destroy(*out);
        *out = nullptr;
    }
    return st;
}

// A record of the CPU benchmark: the shape of one cell, the rest left to the caller.
Record cpu_cell_record(const char *kind, const char *method, const Shape &s) {
    Record r;
    r.kind = kind;
    r.backend = method;
    r.dtype = "fp32";
    r.batch = s.b;
    r.seqlen_q = s.sq;
    r.seqlen_k = s.sk;
    r.heads_q = r.heads_kv = s.h;
    r.head_dim = s.d;
    r.causal = s.causal;
    return r;
}

// Relative L2 error of the worst of dQ, dK, dV against the reference's; non-finite counts as +inf.
double worst_grad_error(const BwdMethod &m, const BwdMethod &ref, size_t elems) {
    double worst = 0.0;
    const float *mine[3] = {m.dq.get(), m.dk.get(), m.dv.get()};
    const float *theirs[3] = {ref.dq.get(), ref.dk.get(), ref.dv.get()};
    for (int g = 0; g < 3; ++g) {
        const Diff diff = compare(mine[g], theirs[g], elems);
        worst = std::max(worst, diff.nonfinite ? std::numeric_limits<double>::infinity() : diff.rel_l2);
    }
    return worst;
}

// The --backward table: the library's backward (and, with --deterministic, its deterministic mode)
// against the naive backward on the forward table's shapes. Returns false on a failure.
bool run_cpu_backward(const Options &opt, const CpuGrid &grid, Report &rep, std::mt19937_64 &rng) {
    static const bool avx2 = has_avx2_fma();
    rep.line("");
    rep.line("## Backward (--backward)");
    rep.line("");
    rep.line(format("Same shapes, fp32. bwd GFLOP/s = %.1f x the forward's FLOPs / backward time, fwd+bwd = %.1f x / "
                    "(forward + backward, run back to back); FlashAttention's count. naive = the forward's three "
                    "phases recompute P (N x N), then per query row dV += P^T dO, dP = dO V^T, dS = P (dP - "
                    "rowsum(P dP)), dQ = scale dS K, dK += scale dS^T Q. flash = flashattn_plan_execute_backward "
                    "(det: FLASHATTN_I64_DETERMINISTIC = 1) after flashattn_plan_execute. Error: the worst relative "
                    "L2 error of dQ, dK, dV against naive's (above 1e-4 fails the run).",
                    kBackwardFlopsFactor, kFwdBwdFlopsFactor));
    rep.line("");
    rep.line("| causal | seqlen | method | bwd ms | bwd GFLOP/s | fwd+bwd ms | fwd+bwd GFLOP/s | bwd speedup vs naive | "
             "extra memory | dQ/dK/dV rel L2 err |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    bool ok = true;
    const int64_t b = grid.b, h = grid.h, d = grid.d;
    for (int causal : grid.causal_list) {
        for (int64_t n : grid.seqlens) {
            const Shape s{b, n, n, h, d, causal != 0, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
            const size_t elems = static_cast<size_t>(b * n * h * d);
            const size_t lse_elems = static_cast<size_t>(b * h * n);
            Buffer q = alloc_floats(elems), k = alloc_floats(elems), v = alloc_floats(elems), dout = alloc_floats(elems);
            for (float *x : {q.get(), k.get(), v.get(), dout.get()}) fill_random(x, elems, rng);
            const double fwd_flops = attention_flops(b, h, n, n, d, causal != 0);
            const std::string where = format("| %s | %lld |", causal ? "yes" : "no", static_cast<long long>(n));

            std::vector<BwdMethod> methods;
            methods.push_back(BwdMethod{"naive", false, nullptr, 0, {}, {}, {}, {}, {}, {}, {}, {}});
            for (int det = 0; det <= (opt.deterministic ? 1 : 0); ++det) {
                BwdMethod m{"cpu", det != 0, nullptr, 0, {}, {}, {}, {}, {}, {}, {}, {}};
                flashattn_status_t st = make_cpu_plan(s, det != 0, &m.plan);
                size_t fwd_ws = 0;
                if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_workspace_size(m.plan, &fwd_ws);
                if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_backward_workspace_size(m.plan, &m.ws_bytes);
                if (st != FLASHATTN_SUCCESS) {
                    rep.line(where + format(" flash%s | ERROR: %s | | | | | | |", det ? " det" : "",
                                            lib_error(st).c_str()));
                    flashattn_plan_destroy(m.plan);
                    ok = false;
                    continue;
                }
                m.ws_bytes = std::max(m.ws_bytes, fwd_ws);  // one buffer serves both passes
                m.ws = alloc_floats((m.ws_bytes + 3) / 4);
                methods.push_back(std::move(m));
            }
            std::vector<Buffer> sc_s, sc_kt;
            for (int t = 0; t < grid.naive_threads; ++t) {
                sc_s.push_back(alloc_floats(static_cast<size_t>(n * n)));
                sc_kt.push_back(alloc_floats(static_cast<size_t>((d + 1) * n)));
            }
            for (BwdMethod &m : methods) {
                m.o = alloc_floats(elems);
                m.lse = alloc_floats(lse_elems);
                m.dq = alloc_floats(elems);
                m.dk = alloc_floats(elems);
                m.dv = alloc_floats(elems);
            }
            auto naive_forward = [&](BwdMethod &m) {
                naive_attention(s, q.get(), k.get(), v.get(), m.o.get(), m.lse.get(), grid.naive_threads, sc_s, sc_kt);
                return FLASHATTN_SUCCESS;
            };
            auto naive_backward = [&](BwdMethod &m) {
                for_each_head(s, grid.naive_threads, [&](size_t t, int64_t bi, int64_t hi) {
                    float *S = sc_s[t].get(), *kt = sc_kt[t].get(), *dp = kt + d * n;
                    if (avx2)
                        naive_backward_avx2(s, q.get(), k.get(), v.get(), dout.get(), m.o.get(), m.dq.get(),
                                            m.dk.get(), m.dv.get(), bi, hi, S, kt, dp);
                    else
                        naive_backward_generic(s, q.get(), k.get(), v.get(), dout.get(), m.o.get(), m.dq.get(),
                                               m.dk.get(), m.dv.get(), bi, hi, S, kt, dp);
                });
                return FLASHATTN_SUCCESS;
            };
            auto flash_forward = [&](BwdMethod &m) {
                return flashattn_plan_execute(m.plan, q.get(), k.get(), v.get(), m.o.get(), m.lse.get(), m.ws.get(),
                                              m.ws_bytes, nullptr);
            };
            auto flash_backward = [&](BwdMethod &m) {
                return flashattn_plan_execute_backward(m.plan, q.get(), k.get(), v.get(), m.o.get(), dout.get(),
                                                       m.lse.get(), m.dq.get(), m.dk.get(), m.dv.get(), m.ws.get(),
                                                       m.ws_bytes, nullptr);
            };
            // Each run: the forward then the backward, each timed; methods alternate within a run so
            // that load from other processes falls on all alike.
            flashattn_status_t st = FLASHATTN_SUCCESS;
            for (int r = 0; r < grid.warmup + grid.reps && st == FLASHATTN_SUCCESS; ++r) {
                for (BwdMethod &m : methods) {
                    for (float *x : {m.dq.get(), m.dk.get(), m.dv.get()}) poison(x, elems);
                    const double t0 = now_s();
                    st = m.plan ? flash_forward(m) : naive_forward(m);
                    const double t1 = now_s();
                    if (st == FLASHATTN_SUCCESS) st = m.plan ? flash_backward(m) : naive_backward(m);
                    const double t2 = now_s();
                    if (st != FLASHATTN_SUCCESS) {
                        rep.line(where + format(" flash%s | ERROR: %s | | | | | | |", m.deterministic ? " det" : "",
                                                lib_error(st).c_str()));
                        ok = false;
                        break;
                    }
                    if (r >= grid.warmup) {
                        m.t_bwd.push_back(t2 - t1);
                        m.t_fwd_bwd.push_back(t2 - t0);
                    }
                }
            }
            sc_s.clear();
            sc_kt.clear();
            const double naive_bwd_ms = median(methods[0].t_bwd) * 1e3;
            for (BwdMethod &m : methods) {
                const bool lib = m.plan != nullptr;
                flashattn_plan_destroy(m.plan);
                m.plan = nullptr;
                if (st != FLASHATTN_SUCCESS) continue;
                const double bwd_ms = median(m.t_bwd) * 1e3, fb_ms = median(m.t_fwd_bwd) * 1e3;
                const double bwd_flops = kBackwardFlopsFactor * fwd_flops, fb_flops = kFwdBwdFlopsFactor * fwd_flops;
                const double extra = lib ? static_cast<double>(m.ws_bytes)
                                            : 4.0 * grid.naive_threads * (static_cast<double>(n) * n + (d + 1.0) * n);
                const double err = lib ? worst_grad_error(m, methods[0], elems) : 0.0;
                const bool bad = lib && !(err <= 1e-4);
                rep.line(where + format(" %s%s | %.2f | %.1f | %.2f | %.1f | %s | %s | %s |", lib ? "flash" : "naive",
                                        m.deterministic ? " det" : "", bwd_ms, bwd_flops / (bwd_ms * 1e-3) / 1e9, fb_ms,
                                        fb_flops / (fb_ms * 1e-3) / 1e9,
                                        lib ? format("**%.2f**", naive_bwd_ms / bwd_ms).c_str() : "1.00",
                                        bytes_text(extra).c_str(),
                                        lib ? format("%.2e%s", err, bad ? " BAD" : "").c_str() : "(reference)"));
                for (int pass = 0; pass < 2; ++pass) {
                    Record rec = cpu_cell_record(pass == 0 ? "cpu-backward" : "cpu-fwd-bwd", m.name, s);
                    rec.deterministic = m.deterministic;
                    rec.status = bad ? "bad" : "ok";
                    rec.note = bad ? format("dQ/dK/dV rel L2 %.3e vs naive", err) : "";
                    rec.ms = pass == 0 ? bwd_ms : fb_ms;
                    rec.tflops = (pass == 0 ? bwd_flops : fb_flops) / (rec.ms * 1e-3) / 1e12;
                    rep.record(rec);
                }
                if (bad) {
                    rep.line(format("MISMATCH: flash%s backward and naive disagree at causal %d seqlen %lld (rel L2 "
                                    "%.3e, tolerance 1e-4)",
                                    m.deterministic ? " det" : "", causal, static_cast<long long>(n), err));
                    ok = false;
                }
            }
        }
    }
    return ok;
}

}  // namespace

int run_cpu(const Options &opt) {
    std::vector<int64_t> seqlens = opt.seqlens.empty() ? std::vector<int64_t>{512, 1024, 2048, 4096} : opt.seqlens;
    const std::vector<int> causal_list = opt.causal.empty() ? std::vector<int>{0} : opt.causal;
    const int warmup = opt.warmup >= 0 ? opt.warmup : 1;
    const int reps = opt.reps > 0 ? opt.reps : 5;
    const int64_t b = opt.cpu_batch, h = opt.cpu_heads, d = opt.cpu_hdim;
    if (d > 256 || d % 8 != 0) {
        std::fprintf(stderr, "flashattn-bench: --hdim must be a multiple of 8 in 8..256\n");
        return 2;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    const int cores = hw == 0 ? 1 : static_cast<int>(hw);
    const int naive_threads_req = opt.naive_threads > 0 ? opt.naive_threads : cores;
    const int naive_threads = static_cast<int>(std::min<int64_t>(naive_threads_req, b * h));

    Report rep;
    rep.line(format("# flashattn-bench --backend cpu (libflashattn %s; %s)", flashattn_version_string(),
                    flashattn_build_info()));
    rep.meta("library_version", flashattn_version_string());
    rep.meta("build_info", flashattn_build_info());
    rep.meta("device", format("CPU, %d hardware threads", cores));
    rep.meta("timing", format("median of %d run(s) after %d warm-up(s), steady_clock around the call", reps, warmup));
    rep.line("");
    rep.line(format("Shape: batch %lld, heads %lld (q = kv), head dim %lld, fp32, seqlen_q = seqlen_k, "
                    "scale 1/sqrt(%lld), layout [batch, seq, heads, dim] contiguous, LSE %s.",
                    static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(d),
                    static_cast<long long>(d), opt.no_lse ? "not requested" : "written by both methods"));
    rep.line(format("Host: %d hardware threads; naive SIMD path %s; the CPU backend uses all cores, the naive "
                    "method %d thread(s), one (batch, head) each at a time.",
                    cores, has_avx2_fma() ? "avx2+fma" : "generic", naive_threads));
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) == 3)
        rep.line(format("Load average before the run: %.2f %.2f %.2f (other processes on %d cores skew the times; "
                        "naive and flash runs alternate so both see the same load).",
                        load[0], load[1], load[2], cores));
    rep.line(format("Time: median of %d run(s) after %d warm-up(s), steady_clock around the call. "
                    "GFLOP/s = 4*b*h*sq*sk*d (halved when causal) / time.",
                    reps, warmup));
    rep.line("Extra memory: bytes beyond Q, K, V, O and LSE. naive = per worker thread one N x N fp32 score "
             "matrix (P overwrites S) + one K^T copy (N x d fp32), times the threads that run; flash = the "
             "plan's workspace size (flashattn_plan_get_workspace_size).");
    rep.line("CPU ms: process CPU time (all threads) during the call, median; its ratio is the speedup in core-seconds, "
             "which other processes on the host disturb less than wall time.");
    rep.line("");
    rep.line("| causal | seqlen | method | time ms | GFLOP/s | extra memory | speedup vs naive | CPU ms | CPU-time speedup | "
             "max abs err | rel L2 err | LSE max err |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|---|---|");

    std::mt19937_64 rng(20261129);
    bool failed = false;
    double speedup_4096 = -1.0, cpu_speedup_4096 = -1.0;
    for (int causal : causal_list) {
        for (int64_t n : seqlens) {
            const Shape s{b, n, n, h, d, causal != 0, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
            const size_t elems = static_cast<size_t>(b * n * h * d);
            const size_t lse_elems = static_cast<size_t>(b * h * n);
            Buffer q = alloc_floats(elems), k = alloc_floats(elems), v = alloc_floats(elems);
            Buffer o_naive = alloc_floats(elems), o_flash = alloc_floats(elems);
            Buffer lse_naive = alloc_floats(lse_elems), lse_flash = alloc_floats(lse_elems);
            fill_random(q.get(), elems, rng);
            fill_random(k.get(), elems, rng);
            fill_random(v.get(), elems, rng);
            const double flops = attention_flops(b, h, n, n, d, causal != 0);

            // --- flash plan (the library's CPU backend)
            flashattn_plan_t *plan = nullptr;
            flashattn_status_t st = make_cpu_plan(s, false, &plan);
            size_t ws_bytes = 0;
            if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_workspace_size(plan, &ws_bytes);
            if (st != FLASHATTN_SUCCESS) {
                rep.line(format("| %s | %lld | flash | ERROR: %s | | | | | | | | |", causal ? "yes" : "no",
                                static_cast<long long>(n), lib_error(st).c_str()));
                flashattn_plan_destroy(plan);
                failed = true;
                continue;
            }
            Buffer ws = alloc_floats((ws_bytes + 3) / 4);

            // --- naive scratch: one (S, K^T) pair per worker thread
            std::vector<Buffer> sc_s, sc_kt;
            for (int t = 0; t < naive_threads; ++t) {
                sc_s.push_back(alloc_floats(static_cast<size_t>(n * n)));
                sc_kt.push_back(alloc_floats(static_cast<size_t>(d * n)));
            }
            const double naive_extra = static_cast<double>(naive_threads) * 4.0 *
                                       (static_cast<double>(n) * n + static_cast<double>(d) * n);

            // Runs alternate naive, flash, naive, flash... so that load from other processes on the
            // host falls on both methods alike.
            poison(o_naive.get(), elems);
            poison(lse_naive.get(), lse_elems);
            poison(o_flash.get(), elems);
            poison(lse_flash.get(), lse_elems);
            float *lse_n = opt.no_lse ? nullptr : lse_naive.get();
            float *lse_f = opt.no_lse ? nullptr : lse_flash.get();
            std::vector<double> t_naive, t_flash, c_naive, c_flash;
            for (int r = 0; r < warmup + reps && st == FLASHATTN_SUCCESS; ++r) {
                double c0 = cpu_s(), t0 = now_s();
                naive_attention(s, q.get(), k.get(), v.get(), o_naive.get(), lse_n, naive_threads, sc_s, sc_kt);
                double t1 = now_s(), c1 = cpu_s();
                if (r >= warmup) {
                    t_naive.push_back(t1 - t0);
                    c_naive.push_back(c1 - c0);
                }
                c0 = cpu_s();
                t0 = now_s();
                st = flashattn_plan_execute(plan, q.get(), k.get(), v.get(), o_flash.get(), lse_f, ws.get(), ws_bytes,
                                            nullptr);
                t1 = now_s();
                c1 = cpu_s();
                if (r >= warmup) {
                    t_flash.push_back(t1 - t0);
                    c_flash.push_back(c1 - c0);
                }
            }
            sc_s.clear();
            sc_kt.clear();
            auto cpu_record = [&](const char *method, double ms, const char *status, const std::string &note) {
                Record r = cpu_cell_record("cpu", method, s);
                r.status = status;
                r.note = note;
                if (std::isfinite(ms)) {
                    r.ms = ms;
                    r.tflops = flops / (ms * 1e-3) / 1e12;
                }
                rep.record(r);
            };
            const double naive_ms = median(t_naive) * 1e3;
            cpu_record("naive", naive_ms, "ok", "");
            const double naive_cpu_ms = median(c_naive) * 1e3;
            rep.line(format("| %s | %lld | naive | %.2f | %.1f | %s | 1.00 | %.1f | 1.00 | (reference) | | |",
                            causal ? "yes" : "no", static_cast<long long>(n), naive_ms,
                            flops / (naive_ms * 1e-3) / 1e9, bytes_text(naive_extra).c_str(), naive_cpu_ms));
            if (st != FLASHATTN_SUCCESS) {
                rep.line(format("| %s | %lld | flash | ERROR: %s | | | | | | | | |", causal ? "yes" : "no",
                                static_cast<long long>(n), lib_error(st).c_str()));
                cpu_record("cpu", std::nan(""), "error", lib_error(st));
                flashattn_plan_destroy(plan);
                failed = true;
                continue;
            }
            flashattn_plan_destroy(plan);
            const double flash_ms = median(t_flash) * 1e3;
            const double flash_cpu_ms = median(c_flash) * 1e3;
            const Diff od = compare(o_flash.get(), o_naive.get(), elems);
            std::string lse_text = "-";
            bool bad = od.nonfinite > 0 || od.rel_l2 > 1e-4;
            if (!opt.no_lse) {
                const Diff ld = compare(lse_flash.get(), lse_naive.get(), lse_elems);
                lse_text = ld.nonfinite ? format("%zu non-finite", ld.nonfinite) : format("%.2e", ld.max_abs);
                bad = bad || ld.nonfinite > 0 || ld.max_abs > 1e-3;
            }
            const double speedup = naive_ms / flash_ms;
            if (n == 4096 && causal == 0) {
                speedup_4096 = speedup;
                cpu_speedup_4096 = naive_cpu_ms / flash_cpu_ms;
            }
            rep.line(format("| %s | %lld | flash | %.2f | %.1f | %s | **%.2f** | %.1f | %.2f | %s | %.2e | %s |",
                            causal ? "yes" : "no", static_cast<long long>(n), flash_ms, flops / (flash_ms * 1e-3) / 1e9,
                            bytes_text(static_cast<double>(ws_bytes)).c_str(), speedup, flash_cpu_ms,
                            naive_cpu_ms / flash_cpu_ms,
                            od.nonfinite ? format("%zu non-finite", od.nonfinite).c_str() : format("%.2e", od.max_abs).c_str(),
                            od.rel_l2, lse_text.c_str()));
            cpu_record("cpu", flash_ms, bad ? "bad" : "ok", bad ? format("rel L2 %.3e vs naive", od.rel_l2) : "");
            if (bad) {
                rep.line(format("MISMATCH: flash and naive disagree at causal %d seqlen %lld (rel L2 %.3e, tolerance 1e-4)",
                                causal, static_cast<long long>(n), od.rel_l2));
                failed = true;
            }
        }
    }
    rep.line("");
    if (speedup_4096 > 0)
        rep.line(format("Bar (flash >= 2x naive at seqlen 4096, causal off, %d cores): wall-time speedup %.2fx -> %s "
                        "(CPU-time speedup %.2fx).",
                        cores, speedup_4096, speedup_4096 >= 2.0 ? "met" : "NOT met", cpu_speedup_4096));
    if (opt.backward &&
        !run_cpu_backward(opt, CpuGrid{b, h, d, seqlens, causal_list, warmup, reps, naive_threads}, rep, rng))
        failed = true;
    if (!opt.markdown.empty() && !rep.write(opt.markdown)) {
        std::fprintf(stderr, "flashattn-bench: cannot write %s\n", opt.markdown.c_str());
        failed = true;
    }
    if (!opt.json.empty() && !rep.write_json(opt.json, "flashattn-bench")) {
        std::fprintf(stderr, "flashattn-bench: cannot write %s\n", opt.json.c_str());
        failed = true;
    }
    return failed ? 1 : 0;
}

}  // namespace bench
