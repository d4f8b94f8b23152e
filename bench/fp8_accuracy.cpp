// FP8 accuracy under outliers (issue 17), as the FlashAttention-3 paper measures it: Q, K, V drawn
// N(0, 1) with 0.1% of the entries N(0, 10); RMSE of O against an fp64 reference of the exact
// inputs, for
//   (a) bf16: the inputs rounded to bf16, run on --backend (cpu or fa3);
//   (b) FP8 per-tensor: each of Q, K, V quantized to E4M3 with one scale (amax / 448);
//   (c) FP8 per-head + Hadamard: Q and K rotated by flashattn_rotate_hadamard (one seed), then
//       Q, K, V quantized with one scale per (sequence, key/value head);
// and, to separate the two effects, per-head without the rotation and per-tensor with it.
// By default the FP8 rows run on the CPU backend, which dequantizes exactly and computes in fp32:
// they measure the error of quantizing the inputs, not the extra error of a kernel that also
// quantizes P to E4M3 (FA3's FP8 kernel: --fp8-backend fa3).
//
// --fp8-backend fa3 runs the FP8 rows (b) and (c) on the FA3 FP8 kernel instead (issue 17): the
// RMSE then includes the
// kernel's own rounding of P to E4M3, and each fa3 row (bf16 too, with --backend fa3) is timed
// (the median of 20 runs after a warm-up, in TFLOP/s at 4 seq^2 heads dim flops). --reference 0
// skips the fp64 reference (its cost grows as seq^2; the RMSE column then reads "-"): for timing
// at sizes that fill the GPU.
//
// --emulate 1 adds an emulation (in double, no library call) of a kernel that also rounds P to
// E4M3, with and without FA3's multiplication of P by a power of two before the cast.
//
// --breakdown 1 prints instead which rounding of an FP8 kernel costs what (breakdown below): Q, K,
// V, P to E4M3 each alone and together, for (b) and (c), then the choices the issue leaves open
// on (c): descales per --block N tokens (default 128), the P scale, the row sum, the max. It runs
// on --rows query rows per head (default 256) against their fp64 reference, so seqlen 4k is cheap;
// --seeds N pools the inputs of N seeds from --seed on.
//
// --speed-grid 64,128,256 runs only the performance grid of the issue on FA3 (speed_grid below).
//
// Usage: flashattn-fp8-accuracy [--speed-grid D,D..] [--backend cpu|fa3] [--fp8-backend cpu|fa3] [--reference 0|1] [--seqlen N] [--heads H] [--dim D] [--seed S] [--emulate 0|1]
//        [--breakdown 0|1 [--rows R] [--block N] [--seeds N]]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

#ifdef FLASHATTN_BENCH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

struct Shape {
    int64_t seq = 1024, heads = 8, dim = 128;
    int64_t elems() const { return seq * heads * dim; }
};

// Round to the nearest E4M3 value (ties to even), saturating at +-448 (as FA3's quantization does).
uint8_t to_e4m3(double x) {
    const uint8_t sign = x < 0 ? 0x80 : 0;
    double a = std::fabs(x);
    if (std::isnan(x)) return 0x7f;
    if (a >= 448.0) return sign | 0x7e;
    if (a < std::ldexp(1.0, -6)) {  // subnormal: multiples of 2^-9
        const double m = std::nearbyint(a * 512.0);  // default rounding mode: ties to even
        return sign | static_cast<uint8_t>(m);       // m = 8 encodes 2^-6, the smallest normal
    }
    int e;
    const double f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
    double m = std::nearbyint((f * 2.0 - 1.0) * 8.0);
    int exp = e - 1;
    if (m == 8.0) {
        m = 0;
        ++exp;
    }
    const int biased = exp + 7;
    if (biased > 15 || (biased == 15 && m == 7.0)) return sign | 0x7e;
    return sign | static_cast<uint8_t>((biased << 3) | static_cast<int>(m));
}

double e4m3_value(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    return (b & 0x80) ? -v : v;
}

uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

double bf16_value(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

std::vector<double> outlier_normal(const Shape &s, std::mt19937_64 &rng) {
    std::normal_distribution<double> n01(0.0, 1.0), n10(0.0, 10.0);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<double> x(static_cast<size_t>(s.elems()));
    for (double &v : x) v = u(rng) < 0.001 ? n10(rng) : n01(rng);
    return x;
}

// O = softmax(Q Kᵀ / sqrt(d)) V in double, [seq, heads, dim] (one sequence, heads_q = heads_kv).
std::vector<double> reference(const Shape &s, const std::vector<double> &q, const std::vector<double> &k,
                              const std::vector<double> &v) {
    std::vector<double> o(q.size()), p(static_cast<size_t>(s.seq));
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
    for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seq; ++i) {
            const double *qi = &q[static_cast<size_t>((i * s.heads + h) * s.dim)];
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < s.seq; ++j) {
                const double *kj = &k[static_cast<size_t>((j * s.heads + h) * s.dim)];
                double dot = 0;
                for (int64_t c = 0; c < s.dim; ++c) dot += qi[c] * kj[c];
                p[static_cast<size_t>(j)] = dot * scale;
                m = std::max(m, dot * scale);
            }
            double *oi = &o[static_cast<size_t>((i * s.heads + h) * s.dim)];
            for (int64_t j = 0; j < s.seq; ++j) {
                const double e = std::exp(p[static_cast<size_t>(j)] - m);
                l += e;
                const double *vj = &v[static_cast<size_t>((j * s.heads + h) * s.dim)];
                for (int64_t c = 0; c < s.dim; ++c) oi[c] += e * vj[c];
            }
            for (int64_t c = 0; c < s.dim; ++c) oi[c] /= l;
        }
    return o;
}

bool ok(flashattn_status_t st, const char *what) {
    if (st == FLASHATTN_SUCCESS) return true;
    std::fprintf(stderr, "%s: %s\n", what, flashattn_last_error());
    return false;
}

flashattn_plan_t *make_plan(const Shape &s, flashattn_dtype_t dtype, flashattn_backend_t backend, bool per_head) {
    flashattn_plan_t *plan = nullptr;
    flashattn_plan_create(&plan);
    const struct { flashattn_i64_param_t k; int64_t v; } keys[] = {
        {FLASHATTN_I64_BATCH, 1}, {FLASHATTN_I64_SEQLEN_Q, s.seq}, {FLASHATTN_I64_SEQLEN_K, s.seq},
        {FLASHATTN_I64_HEADS_Q, s.heads}, {FLASHATTN_I64_HEAD_DIM, s.dim}, {FLASHATTN_I64_DTYPE, dtype},
        {FLASHATTN_I64_BACKEND, backend}};
    for (const auto &kv : keys) flashattn_plan_set_i64(plan, kv.k, kv.v);
    if (dtype == FLASHATTN_DTYPE_FP8_E4M3 && !per_head) {
        flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_BATCH_STRIDE, 0);
        flashattn_plan_set_i64(plan, FLASHATTN_I64_DESCALE_HEAD_STRIDE, 0);
    }
    if (!ok(flashattn_plan_finalize(plan), "finalize")) {
        flashattn_plan_destroy(plan);
        return nullptr;
    }
    return plan;
}

#ifdef FLASHATTN_BENCH_WITH_CUDA
// The speed of an fa3 plan's execute (its arguments set): the median of 20 runs after a warm-up,
// as TFLOP/s (4 seq^2 heads dim flops), or 0 on an error.
double time_tflops(const Shape &s, const std::function<bool()> &execute) {
    if (!execute()) return 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> ms;
    bool good = true;
    for (int r = 0; r < 20 && good; ++r) {
        cudaEventRecord(e0);
        good = execute();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (!good) return 0;
    std::sort(ms.begin(), ms.end());
    const double flops = 4.0 * static_cast<double>(s.seq) * static_cast<double>(s.seq) * s.heads * s.dim;
    return flops / (ms[ms.size() / 2] * 1e-3) / 1e12;
}
#endif

double g_last_tflops = 0;  // the timing of the last fa3 row, printed beside its RMSE

double rmse(const std::vector<uint16_t> &o, const std::vector<double> &ref) {
    double sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) sum += std::pow(bf16_value(o[i]) - ref[i], 2);
    return std::sqrt(sum / static_cast<double>(ref.size()));
}

// (a): bf16 inputs on `backend` (host or device memory as it needs).
double run_bf16(const Shape &s, flashattn_backend_t backend, const std::vector<double> &q, const std::vector<double> &k,
                const std::vector<double> &v, const std::vector<double> &ref) {
    flashattn_plan_t *plan = make_plan(s, FLASHATTN_DTYPE_BF16, backend, false);
    if (plan == nullptr) return NAN;
    std::vector<uint16_t> hq(q.size()), hk(k.size()), hv(v.size()), ho(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
        hq[i] = to_bf16(static_cast<float>(q[i]));
        hk[i] = to_bf16(static_cast<float>(k[i]));
        hv[i] = to_bf16(static_cast<float>(v[i]));
    }
    size_t ws = 0;
    flashattn_plan_get_workspace_size(plan, &ws);
    const size_t bytes = q.size() * 2;
    bool good = false;
    if (backend == FLASHATTN_BACKEND_CPU) {
        std::vector<unsigned char> w(ws + 256);
        void *wp = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(w.data()) + 255) & ~uintptr_t{255});
        good = ok(flashattn_plan_execute(plan, hq.data(), hk.data(), hv.data(), ho.data(), nullptr, ws ? wp : nullptr, ws,
                                         nullptr),
                  "bf16 execute");
    } else {
#ifdef FLASHATTN_BENCH_WITH_CUDA
        void *dq, *dk, *dv, *dout, *dws = nullptr;
        cudaMalloc(&dq, bytes), cudaMalloc(&dk, bytes), cudaMalloc(&dv, bytes), cudaMalloc(&dout, bytes);
        if (ws) cudaMalloc(&dws, ws);
        cudaMemcpy(dq, hq.data(), bytes, cudaMemcpyHostToDevice);
        cudaMemcpy(dk, hk.data(), bytes, cudaMemcpyHostToDevice);
        cudaMemcpy(dv, hv.data(), bytes, cudaMemcpyHostToDevice);
        good = ok(flashattn_plan_execute(plan, dq, dk, dv, dout, nullptr, dws, ws, nullptr), "bf16 execute");
        cudaMemcpy(ho.data(), dout, bytes, cudaMemcpyDeviceToHost);
        g_last_tflops = time_tflops(s, [&] {
            return flashattn_plan_execute(plan, dq, dk, dv, dout, nullptr, dws, ws, nullptr) == FLASHATTN_SUCCESS;
        });
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dws);
#else
        (void)bytes;
        std::fprintf(stderr, "built without CUDA: only --backend cpu\n");
#endif
    }
    flashattn_plan_destroy(plan);
    return good ? rmse(ho, ref) : NAN;
}

// Quantize x [seq, heads, dim] to E4M3 with one scale per head (per_head) or one for the tensor.
void quantize(const Shape &s, const std::vector<double> &x, bool per_head, std::vector<uint8_t> *codes,
              std::vector<float> *descale) {
    const int64_t groups = per_head ? s.heads : 1;
    descale->assign(static_cast<size_t>(groups), 1.0f);
    std::vector<double> amax(static_cast<size_t>(groups), 0.0);
    for (int64_t t = 0; t < s.seq; ++t)
        for (int64_t h = 0; h < s.heads; ++h)
            for (int64_t c = 0; c < s.dim; ++c) {
                double &a = amax[static_cast<size_t>(per_head ? h : 0)];
                a = std::max(a, std::fabs(x[static_cast<size_t>((t * s.heads + h) * s.dim + c)]));
            }
    for (int64_t g = 0; g < groups; ++g)
        (*descale)[static_cast<size_t>(g)] = amax[static_cast<size_t>(g)] > 0 ? static_cast<float>(amax[static_cast<size_t>(g)] / 448.0) : 1.0f;
    codes->resize(x.size());
    for (int64_t t = 0; t < s.seq; ++t)
        for (int64_t h = 0; h < s.heads; ++h)
            for (int64_t c = 0; c < s.dim; ++c) {
                const size_t i = static_cast<size_t>((t * s.heads + h) * s.dim + c);
                (*codes)[i] = to_e4m3(x[i] / (*descale)[static_cast<size_t>(per_head ? h : 0)]);
            }
}

// Q and K rotated (one seed) through the library, in fp32.
std::vector<double> rotated(const Shape &s, const std::vector<double> &x, uint64_t seed) {
    std::vector<float> f(x.begin(), x.end());
    if (!ok(flashattn_rotate_hadamard(FLASHATTN_DTYPE_FP32, s.seq * s.heads, s.dim, f.data(), s.dim, f.data(), s.dim, seed,
                                      -1, nullptr),
            "rotate_hadamard"))
        std::exit(1);
    return std::vector<double>(f.begin(), f.end());
}

// FP8 on `backend`: the CPU (exact dequantization) or fa3 (the FP8 kernel); RMSE against ref.
double run_fp8(const Shape &s, flashattn_backend_t backend, bool per_head, bool hadamard, const std::vector<double> &q,
               const std::vector<double> &k, const std::vector<double> &v, const std::vector<double> &ref) {
    const std::vector<double> qx = hadamard ? rotated(s, q, 2024) : q;
    const std::vector<double> kx = hadamard ? rotated(s, k, 2024) : k;
    std::vector<uint8_t> cq, ck, cv;
    std::vector<float> dq, dk, dv;
    quantize(s, qx, per_head, &cq, &dq);
    quantize(s, kx, per_head, &ck, &dk);
    quantize(s, v, per_head, &cv, &dv);
    flashattn_plan_t *plan = make_plan(s, FLASHATTN_DTYPE_FP8_E4M3, backend, per_head);
    if (plan == nullptr) return NAN;
    size_t ws = 0;
    flashattn_plan_get_workspace_size(plan, &ws);
    if (backend != FLASHATTN_BACKEND_CPU) {
        std::vector<uint16_t> o(q.size());
        bool good = false;
#ifdef FLASHATTN_BENCH_WITH_CUDA
        void *d[7] = {}, *dws = nullptr;
        const void *host[7] = {cq.data(), ck.data(), cv.data(), nullptr, dq.data(), dk.data(), dv.data()};
        const size_t bytes[7] = {cq.size(), ck.size(), cv.size(), o.size() * 2, dq.size() * 4, dk.size() * 4, dv.size() * 4};
        for (int i = 0; i < 7; ++i) {
            cudaMalloc(&d[i], bytes[i]);
            if (host[i] != nullptr) cudaMemcpy(d[i], host[i], bytes[i], cudaMemcpyHostToDevice);
        }
        if (ws) cudaMalloc(&dws, ws);
        flashattn_args_t *args = nullptr;
        flashattn_args_create(&args);
        const flashattn_arg_t which[7] = {FLASHATTN_ARG_Q, FLASHATTN_ARG_K, FLASHATTN_ARG_V, FLASHATTN_ARG_O,
                                          FLASHATTN_ARG_DESCALE_Q, FLASHATTN_ARG_DESCALE_K, FLASHATTN_ARG_DESCALE_V};
        for (int i = 0; i < 7; ++i) flashattn_args_set(args, which[i], d[i]);
        good = ok(flashattn_plan_execute_args(plan, args, dws, ws, nullptr), "fp8 execute (fa3)");
        cudaMemcpy(o.data(), d[3], bytes[3], cudaMemcpyDeviceToHost);
        g_last_tflops = time_tflops(s, [&] { return flashattn_plan_execute_args(plan, args, dws, ws, nullptr) == FLASHATTN_SUCCESS; });
        flashattn_args_destroy(args);
        for (void *p : d) cudaFree(p);
        cudaFree(dws);
#else
        std::fprintf(stderr, "built without CUDA: only --fp8-backend cpu\n");
#endif
        flashattn_plan_destroy(plan);
        return good ? rmse(o, ref) : NAN;
    }
    std::vector<unsigned char> w(ws + 256);
    void *wp = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(w.data()) + 255) & ~uintptr_t{255});
    std::vector<uint16_t> o(q.size());
    flashattn_args_t *args = nullptr;
    flashattn_args_create(&args);
    const struct { flashattn_arg_t which; const void *ptr; } set[] = {
        {FLASHATTN_ARG_Q, cq.data()}, {FLASHATTN_ARG_K, ck.data()}, {FLASHATTN_ARG_V, cv.data()}, {FLASHATTN_ARG_O, o.data()},
        {FLASHATTN_ARG_DESCALE_Q, dq.data()}, {FLASHATTN_ARG_DESCALE_K, dk.data()}, {FLASHATTN_ARG_DESCALE_V, dv.data()}};
    for (const auto &a : set) flashattn_args_set(args, a.which, a.ptr);
    const bool good = ok(flashattn_plan_execute_args(plan, args, wp, ws, nullptr), "fp8 execute");
    flashattn_args_destroy(args);
    flashattn_plan_destroy(plan);
    return good ? rmse(o, ref) : NAN;
}

// An emulation of an FP8 kernel's second GEMM on the dequantized inputs of `quantized` (which
// run_fp8 prepares): P = exp(s - rowmax) in (0, 1] is rounded to E4M3 after a multiplication by
// p_scale (a power of two; 1 leaves everything below 2^-10 to flush to zero, 256 moves E4M3's
// range over it) and divided back; the row sum l comes from the unrounded P (as FA3 keeps it in
// fp32). Uses the final row max; a kernel's running max only makes P smaller early in the row.
double emulate_kernel(const Shape &s, bool per_head, bool hadamard, double p_scale, const std::vector<double> &q,
                      const std::vector<double> &k, const std::vector<double> &v, const std::vector<double> &ref) {
    const std::vector<double> qx = hadamard ? rotated(s, q, 2024) : q;
    const std::vector<double> kx = hadamard ? rotated(s, k, 2024) : k;
    std::vector<uint8_t> cq, ck, cv;
    std::vector<float> dq, dk, dv;
    quantize(s, qx, per_head, &cq, &dq);
    quantize(s, kx, per_head, &ck, &dk);
    quantize(s, v, per_head, &cv, &dv);
    auto deq = [&](const std::vector<uint8_t> &c, const std::vector<float> &d, size_t i, int64_t h) {
        return e4m3_value(c[i]) * d[static_cast<size_t>(per_head ? h : 0)];
    };
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
    std::vector<double> p(static_cast<size_t>(s.seq)), o(static_cast<size_t>(s.dim));
    double sum = 0;
    for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seq; ++i) {
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < s.seq; ++j) {
                double dot = 0;
                for (int64_t c = 0; c < s.dim; ++c)
                    dot += deq(cq, dq, static_cast<size_t>((i * s.heads + h) * s.dim + c), h) *
                           deq(ck, dk, static_cast<size_t>((j * s.heads + h) * s.dim + c), h);
                p[static_cast<size_t>(j)] = dot * scale;
                m = std::max(m, dot * scale);
            }
            std::fill(o.begin(), o.end(), 0.0);
            for (int64_t j = 0; j < s.seq; ++j) {
                const double e = std::exp(p[static_cast<size_t>(j)] - m);
                l += e;
                const double e8 = e4m3_value(to_e4m3(e * p_scale)) / p_scale;
                for (int64_t c = 0; c < s.dim; ++c)
                    o[static_cast<size_t>(c)] += e8 * deq(cv, dv, static_cast<size_t>((j * s.heads + h) * s.dim + c), h);
            }
            for (int64_t c = 0; c < s.dim; ++c) {
                const double out = bf16_value(to_bf16(static_cast<float>(o[static_cast<size_t>(c)] / l)));
                sum += std::pow(out - ref[static_cast<size_t>((i * s.heads + h) * s.dim + c)], 2);
            }
        }
    return std::sqrt(sum / static_cast<double>(ref.size()));
}

// --breakdown: what each rounding of an FP8 kernel costs, alone and together (issue 17's bar:
// (c) <= 0.5 x (b)). One configuration of roundings is a Rounding; emulate_rows runs it in double
// on `rows` query rows per head (evenly spaced; the inputs are iid, so a sample of rows estimates
// the RMSE of all of them at seq/rows the cost) against the fp64 reference of the same rows.
struct Rounding {
    const char *name;
    bool q = false, k = false, v = false, p = false;  // which operands go through E4M3
    bool hadamard = false;       // Q and K rotated (one seed) before they are quantized
    int64_t group = -1;          // descale group: -1 the tensor, 0 (sequence, head), N > 0 N tokens of a head
    double p_scale = 256;        // P multiplied by it before the cast and divided after (FA3: 256)
    bool l_rounded = false;      // row sum of the rounded P (the kernel: of the fp32 P)
    bool final_max = false;      // P against the row's final max (the kernel: the running max, 128-key tiles)
    double max_slack = 0.75;     // the running max moves only past max + slack, log2 units (main's kernel)
    bool rotate_v = false;       // V rotated too and O rotated back (outside the definition)
};

// x [seq, heads, dim] quantized to E4M3 and dequantized, one descale (amax / 448, in fp32) per group.
std::vector<double> fake_quant(const Shape &s, const std::vector<double> &x, int64_t group) {
    const int64_t block = group > 0 ? group : s.seq;
    auto gid = [&](int64_t t, int64_t h) { return group < 0 ? 0 : (t / block) * s.heads + h; };
    std::vector<double> amax(static_cast<size_t>((s.seq + block - 1) / block * s.heads), 0.0);
    for (int64_t t = 0; t < s.seq; ++t)
        for (int64_t h = 0; h < s.heads; ++h)
            for (int64_t c = 0; c < s.dim; ++c) {
                double &a = amax[static_cast<size_t>(gid(t, h))];
                a = std::max(a, std::fabs(x[static_cast<size_t>((t * s.heads + h) * s.dim + c)]));
            }
    std::vector<double> y(x.size());
    for (int64_t t = 0; t < s.seq; ++t)
        for (int64_t h = 0; h < s.heads; ++h) {
            const double a = amax[static_cast<size_t>(gid(t, h))];
            const double d = a > 0 ? static_cast<float>(a / 448.0) : 1.0;
            for (int64_t c = 0; c < s.dim; ++c) {
                const size_t i = static_cast<size_t>((t * s.heads + h) * s.dim + c);
                y[i] = e4m3_value(to_e4m3(x[i] / d)) * d;
            }
        }
    return y;
}

// O of `rows` query rows per head ([heads][rows][dim]) under the roundings of r (all off: the fp64
// reference, O not rounded; otherwise O rounded to bf16 as the kernel stores it).
std::vector<double> emulate_rows(const Shape &s, const Rounding &r, int64_t rows, const std::vector<double> &q,
                                 const std::vector<double> &k, const std::vector<double> &v) {
    const bool exact = !r.q && !r.k && !r.v && !r.p;
    const std::vector<double> qr = r.hadamard ? rotated(s, q, 2024) : q, kr = r.hadamard ? rotated(s, k, 2024) : k;
    const std::vector<double> vr = r.rotate_v ? rotated(s, v, 2025) : v;
    const std::vector<double> qx = r.q ? fake_quant(s, qr, r.group) : qr, kx = r.k ? fake_quant(s, kr, r.group) : kr;
    const std::vector<double> vx = r.v ? fake_quant(s, vr, r.group) : vr;
    std::vector<double> rot;  // rows of the V rotation R (row c = e_c R), to take O R back to O
    if (r.rotate_v) {
        std::vector<double> eye(static_cast<size_t>(s.dim * s.dim), 0.0);
        for (int64_t c = 0; c < s.dim; ++c) eye[static_cast<size_t>(c * s.dim + c)] = 1.0;
        rot = rotated(Shape{s.dim, 1, s.dim}, eye, 2025);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
    const int64_t tile = 128;
    std::vector<double> out(static_cast<size_t>(s.heads * rows * s.dim)), sc(static_cast<size_t>(s.seq)),
        o(static_cast<size_t>(s.dim));
    auto at = [&](const std::vector<double> &x, int64_t t, int64_t h) { return &x[static_cast<size_t>((t * s.heads + h) * s.dim)]; };
    for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t n = 0; n < rows; ++n) {
            const int64_t i = n * s.seq / rows;
            const double *qi = at(qx, i, h);
            double m = -INFINITY;
            for (int64_t j = 0; j < s.seq; ++j) {
                const double *kj = at(kx, j, h);
                double dot = 0;
                for (int64_t c = 0; c < s.dim; ++c) dot += qi[c] * kj[c];
                sc[static_cast<size_t>(j)] = dot * scale;
                m = std::max(m, dot * scale);
            }
            std::fill(o.begin(), o.end(), 0.0);
            double l = 0, run = r.final_max ? m : -INFINITY;
            for (int64_t j0 = 0; j0 < s.seq; j0 += tile) {
                const int64_t j1 = std::min(s.seq, j0 + tile);
                double tile_max = -INFINITY;
                for (int64_t j = j0; j < j1; ++j) tile_max = std::max(tile_max, sc[static_cast<size_t>(j)]);
                if (tile_max > run + r.max_slack * std::log(2.0)) run = tile_max;
                const double back = std::exp(run - m);  // the kernel's later rescaling by alpha, exact here
                for (int64_t j = j0; j < j1; ++j) {
                    const double e = std::exp(sc[static_cast<size_t>(j)] - run);
                    const double pe = r.p ? e4m3_value(to_e4m3(e * r.p_scale)) / r.p_scale : e;
                    l += (r.l_rounded ? pe : e) * back;
                    const double *vj = at(vx, j, h);
                    for (int64_t c = 0; c < s.dim; ++c) o[static_cast<size_t>(c)] += pe * back * vj[c];
                }
            }
            double *dst = &out[static_cast<size_t>((h * rows + n) * s.dim)];
            for (int64_t c = 0; c < s.dim; ++c) {
                double y = 0;
                if (r.rotate_v)
                    for (int64_t e = 0; e < s.dim; ++e) y += o[static_cast<size_t>(e)] * rot[static_cast<size_t>(c * s.dim + e)];
                else
                    y = o[static_cast<size_t>(c)];
                dst[c] = exact ? y / l : bf16_value(to_bf16(static_cast<float>(y / l)));
            }
        }
    return out;
}

double rmse_rows(const std::vector<double> &o, const std::vector<double> &ref) {
    double sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) sum += (o[i] - ref[i]) * (o[i] - ref[i]);
    return std::sqrt(sum / static_cast<double>(ref.size()));
}

// The table: (b) per-tensor and (c) per-head + Hadamard, each rounding alone and together, then the
// choices the issue leaves open applied to (c) (descale blocks of `block` tokens, the P scale, the
// row sum, the max P is taken against) and one outside it (V rotated too). RMSE and the ratio to
// (b) with every rounding (the kernel's (b)). With seeds > 1 the inputs of seeds seed, seed + 1, ..
// are pooled (one RMSE over all their rows; the ratio of one seed swings with its few outliers
// that Q and K share a channel with) and each seed's (c) / (b) of the kernel follows the table.
int breakdown(const Shape &s, uint64_t seed, int64_t seeds, int64_t rows, int64_t block) {
    rows = std::min(rows, s.seq);
    auto make = [](const char *name, bool c, bool rq, bool rk, bool rv, bool rp) {
        Rounding r{name};
        r.q = rq, r.k = rk, r.v = rv, r.p = rp;
        r.hadamard = c, r.group = c ? 0 : -1;
        return r;
    };
    std::vector<Rounding> cases;
    for (const bool c : {false, true}) {
        cases.push_back(make(c ? "(c) Q alone" : "(b) Q alone", c, true, false, false, false));
        cases.push_back(make(c ? "(c) K alone" : "(b) K alone", c, false, true, false, false));
        cases.push_back(make(c ? "(c) V alone" : "(b) V alone", c, false, false, true, false));
        cases.push_back(make(c ? "(c) P alone (x256)" : "(b) P alone (x256)", c, false, false, false, true));
        cases.push_back(make(c ? "(c) Q, K" : "(b) Q, K", c, true, true, false, false));
        cases.push_back(make(c ? "(c) Q, K, V (the CPU backend's FP8)" : "(b) Q, K, V (the CPU backend's FP8)", c, true, true, true, false));
        cases.push_back(make(c ? "(c) Q, K, P (all but V)" : "(b) Q, K, P (all but V)", c, true, true, false, true));
        cases.push_back(make(c ? "(c) Q, K, V, P (the kernel)" : "(b) Q, K, V, P (the kernel)", c, true, true, true, true));
    }
    const size_t b_kernel = 7, c_kernel = 15;  // the last case of each loop: every rounding
    const Rounding kernel_c = cases.back();
    auto variant = [&](const char *name, const std::function<void(Rounding &)> &f) {
        Rounding r = kernel_c;
        r.name = name;
        f(r);
        cases.push_back(r);
    };
    static char block_name[64];
    std::snprintf(block_name, sizeof block_name, "(c) kernel, descales per %lld tokens", (long long)block);
    variant(block_name, [&](Rounding &r) { r.group = block; });
    variant("(c) kernel, per-head, no Hadamard", [](Rounding &r) { r.hadamard = false; });
    variant("(c) kernel, per-tensor + Hadamard", [](Rounding &r) { r.group = -1; });
    variant("(c) kernel, P x 1", [](Rounding &r) { r.p_scale = 1; });
    variant("(c) kernel, P x 448, no slack (max to E4M3's top)", [](Rounding &r) { r.p_scale = 448, r.max_slack = 0; });
    variant("(c) kernel, P x 2^-4 (into the subnormals)", [](Rounding &r) { r.p_scale = 1.0 / 16; });
    variant("(c) kernel, row sum of the rounded P", [](Rounding &r) { r.l_rounded = true; });
    variant("(c) kernel, P against the final row max", [](Rounding &r) { r.final_max = true; });
    variant("(c) kernel, no max slack (P <= 256)", [](Rounding &r) { r.max_slack = 0; });
    variant("(c) kernel + V rotated, O rotated back (not the issue's)", [](Rounding &r) { r.rotate_v = true; });
    std::printf("FP8 rounding breakdown: 1 x %lld tokens x %lld heads x dim %lld, seed %llu", (long long)s.seq,
                (long long)s.heads, (long long)s.dim, (unsigned long long)seed);
    if (seeds > 1) std::printf("..%llu pooled", (unsigned long long)(seed + seeds - 1));
    std::printf(", %lld query rows per head; N(0,1) with 0.1%% N(0,10), non-causal; RMSE of O vs fp64\n", (long long)rows);
    std::vector<double> mse(cases.size(), 0.0), ratio;  // mean square error over the seeds; (c) / (b) per seed
    for (int64_t r = 0; r < seeds; ++r) {
        std::mt19937_64 rng(seed + static_cast<uint64_t>(r));
        const std::vector<double> q = outlier_normal(s, rng), k = outlier_normal(s, rng), v = outlier_normal(s, rng);
        const std::vector<double> ref = emulate_rows(s, Rounding{"reference"}, rows, q, k, v);
        std::vector<double> err(cases.size());
        for (size_t n = 0; n < cases.size(); ++n) err[n] = rmse_rows(emulate_rows(s, cases[n], rows, q, k, v), ref);
        for (size_t n = 0; n < cases.size(); ++n) mse[n] += err[n] * err[n] / static_cast<double>(seeds);
        ratio.push_back(err[c_kernel] / err[b_kernel]);
    }
    std::printf("| case | RMSE | / (b) kernel |\n|---|---|---|\n");
    for (size_t n = 0; n < cases.size(); ++n)
        std::printf("| %s | %.3e | %.3f |\n", cases[n].name, std::sqrt(mse[n]), std::sqrt(mse[n] / mse[b_kernel]));
    if (seeds > 1) {
        std::printf("(c) / (b) of the kernel per seed:");
        for (const double x : ratio) std::printf(" %.3f", x);
        std::printf("\n");
    }
    return 0;
}

#ifdef FLASHATTN_BENCH_WITH_CUDA
// Seconds since the epoch (the system clock, as nvidia-smi's log timestamps).
double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// --speed-grid: the performance grid (the FlashAttention-3 paper's: hidden 2048, 16k tokens
// in all: batch = 16384 / seqlen, heads = 2048 / dim) for every dim of --dims, seqlen 2k..16k,
// non-causal and causal, bf16 FA3 against the FP8 kernel in the same process on the same shapes.
// Inputs: random bf16 in [-2, 2) and random E4M3 codes of magnitude <= 2 (speed does not depend
// on them; they keep the softmax away from inf), descales 1 per (sequence, head), no LSE. Each
// cell: the median of 20 runs after a warm-up; TFLOP/s at 4 seq^2 heads dim batch flops (half of
// it causal). Prints a markdown table; each cell's timed window (wall-clock seconds) goes to stderr.
int speed_grid(const std::vector<int64_t> &dims) {
    const int64_t tokens = 16384, hidden = 2048;
    const size_t elems = static_cast<size_t>(tokens * hidden);
    std::mt19937_64 rng(99);
    std::vector<uint16_t> hb(elems);
    std::vector<uint8_t> h8(elems);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (size_t i = 0; i < elems; ++i) {
        hb[i] = to_bf16(u(rng));
        h8[i] = to_e4m3(u(rng));
    }
    void *b16[4] = {}, *f8[3] = {}, *desc = nullptr, *dws = nullptr;
    for (int i = 0; i < 4; ++i) cudaMalloc(&b16[i], elems * 2);
    for (int i = 0; i < 3; ++i) cudaMalloc(&f8[i], elems);
    for (int i = 0; i < 3; ++i) cudaMemcpy(b16[i], hb.data(), elems * 2, cudaMemcpyHostToDevice);
    for (int i = 0; i < 3; ++i) cudaMemcpy(f8[i], h8.data(), elems, cudaMemcpyHostToDevice);
    const std::vector<float> ones(4096, 1.0f);
    cudaMalloc(&desc, ones.size() * 4);
    cudaMemcpy(desc, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
    size_t ws_cap = 0;
    cudaDeviceProp prop{};
    int dev = 0;
    cudaGetDevice(&dev);
    const bool named = cudaGetDeviceProperties(&prop, dev) == cudaSuccess;  // the grid's GPU, not assumed
    std::printf("FA3 bf16 vs FP8 forward, %s, hidden %lld, %lld tokens (batch = %lld / seqlen), TFLOP/s\n",
                named ? prop.name : "unknown GPU", (long long)hidden, (long long)tokens, (long long)tokens);
    std::printf("| dim | causal | seqlen | batch x heads | bf16 fa3 | FP8 fa3 | FP8 / bf16 |\n|---|---|---|---|---|---|---|\n");
    for (const int64_t dim : dims)
        for (const int causal : {0, 1})
            for (const int64_t seq : {2048, 4096, 8192, 16384}) {
                const int64_t batch = tokens / seq, heads = hidden / dim;
                double tf[2] = {0, 0};
                for (int fp8 = 0; fp8 < 2; ++fp8) {
                    flashattn_plan_t *plan = nullptr;
                    flashattn_plan_create(&plan);
                    const struct { flashattn_i64_param_t k; int64_t v; } keys[] = {
                        {FLASHATTN_I64_BATCH, batch}, {FLASHATTN_I64_SEQLEN_Q, seq}, {FLASHATTN_I64_SEQLEN_K, seq},
                        {FLASHATTN_I64_HEADS_Q, heads}, {FLASHATTN_I64_HEAD_DIM, dim},
                        {FLASHATTN_I64_DTYPE, fp8 ? FLASHATTN_DTYPE_FP8_E4M3 : FLASHATTN_DTYPE_BF16},
                        {FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_FA3}, {FLASHATTN_I64_CAUSAL, causal}};
                    for (const auto &kv : keys) flashattn_plan_set_i64(plan, kv.k, kv.v);
                    if (!ok(flashattn_plan_finalize(plan), fp8 ? "finalize (FP8)" : "finalize (bf16)")) {
                        flashattn_plan_destroy(plan);
                        continue;
                    }
                    size_t ws = 0;
                    flashattn_plan_get_workspace_size(plan, &ws);
                    if (ws > ws_cap) {
                        cudaFree(dws);
                        cudaMalloc(&dws, ws);
                        ws_cap = ws;
                    }
                    flashattn_args_t *args = nullptr;
                    flashattn_args_create(&args);
                    flashattn_args_set(args, FLASHATTN_ARG_Q, fp8 ? f8[0] : b16[0]);
                    flashattn_args_set(args, FLASHATTN_ARG_K, fp8 ? f8[1] : b16[1]);
                    flashattn_args_set(args, FLASHATTN_ARG_V, fp8 ? f8[2] : b16[2]);
                    flashattn_args_set(args, FLASHATTN_ARG_O, b16[3]);
                    if (fp8) {
                        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_Q, desc);
                        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_K, desc);
                        flashattn_args_set(args, FLASHATTN_ARG_DESCALE_V, desc);
                    }
                    const Shape one{seq, heads * batch, dim};
                    const double t0 = wall_seconds();
                    tf[fp8] = time_tflops(one, [&] {
                        return ok(flashattn_plan_execute_args(plan, args, dws, ws, nullptr), "execute");
                    }) * (causal ? 0.5 : 1.0);
                    // Each cell's timed window on stderr, to match against a clock / power log
                    // (nvidia-smi's timestamps; tests/gpu/fp8_clock_table.py).
                    std::fprintf(stderr, "window %lld %d %lld %s %.3f %.3f\n", (long long)dim, causal, (long long)seq,
                                 fp8 ? "fp8" : "bf16", t0, wall_seconds());
                    const cudaError_t e = cudaDeviceSynchronize();
                    if (e != cudaSuccess) {
                        std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
                        return 1;
                    }
                    flashattn_args_destroy(args);
                    flashattn_plan_destroy(plan);
                }
                std::printf("| %lld | %d | %lld | %lld x %lld | %.0f | %.0f | %.2f |\n", (long long)dim, causal,
                            (long long)seq, (long long)batch, (long long)heads, tf[0], tf[1],
                            tf[0] > 0 ? tf[1] / tf[0] : 0.0);
                std::fflush(stdout);
            }
    for (void *p : b16) cudaFree(p);
    for (void *p : f8) cudaFree(p);
    cudaFree(desc), cudaFree(dws);
    return 0;
}
#endif

}  // namespace

int main(int argc, char **argv) {
    Shape s;
    uint64_t seed = 17;
    flashattn_backend_t bf16_backend = FLASHATTN_BACKEND_CPU, fp8_backend = FLASHATTN_BACKEND_CPU;
    bool emulate = false, with_reference = true, by_rounding = false;
    int64_t rows = 256, block = 128, seeds = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const long long value = std::atoll(argv[i + 1]);
        if (key == "--seqlen") s.seq = value;
        else if (key == "--heads") s.heads = value;
        else if (key == "--dim") s.dim = value;
        else if (key == "--seed") seed = static_cast<uint64_t>(value);
        else if (key == "--emulate") emulate = value != 0;
        else if (key == "--breakdown") by_rounding = value != 0;
        else if (key == "--rows") rows = value;
        else if (key == "--block") block = value;
        else if (key == "--seeds") seeds = value;
        else if (key == "--reference") with_reference = value != 0;
        else if (key == "--fp8-backend") fp8_backend = std::string(argv[i + 1]) == "fa3" ? FLASHATTN_BACKEND_FA3 : FLASHATTN_BACKEND_CPU;
        else if (key == "--speed-grid") {  // a comma-separated list of head dims
            std::vector<int64_t> dims;
            for (const char *c = argv[i + 1]; *c;) {
                dims.push_back(std::atoll(c));
                while (*c && *c != ',') ++c;
                if (*c == ',') ++c;
            }
#ifdef FLASHATTN_BENCH_WITH_CUDA
            return speed_grid(dims);
#else
            std::fprintf(stderr, "built without CUDA: no --speed-grid\n");
            return 2;
#endif
        } else if (key == "--backend") bf16_backend = std::string(argv[i + 1]) == "fa3" ? FLASHATTN_BACKEND_FA3 : FLASHATTN_BACKEND_CPU;
        else {
            std::fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    for (int c = 0; c < 256; ++c) {  // the quantizer against the decoder: every finite code round-trips
        const uint8_t code = static_cast<uint8_t>(c);
        if ((code & 0x7f) == 0x7f || code == 0x80) continue;  // NaN; -0 encodes as +0's sign-kept twin
        if (to_e4m3(e4m3_value(code)) != code) {
            std::fprintf(stderr, "self-check: code 0x%02x does not round-trip\n", c);
            return 1;
        }
    }
    if (by_rounding) return breakdown(s, seed, std::max<int64_t>(seeds, 1), std::max<int64_t>(rows, 1), std::max<int64_t>(block, 1));
    std::mt19937_64 rng(seed);
    const std::vector<double> q = outlier_normal(s, rng), k = outlier_normal(s, rng), v = outlier_normal(s, rng);
    const std::vector<double> ref = with_reference ? reference(s, q, k, v) : std::vector<double>(q.size(), 0.0);
    std::printf("FP8 accuracy: 1 x %lld tokens x %lld heads x dim %lld, N(0,1) with 0.1%% N(0,10), non-causal; "
                "RMSE of O vs fp64\n",
                (long long)s.seq, (long long)s.heads, (long long)s.dim);
    std::printf("| case | RMSE | TFLOP/s (fa3 rows) |\n|---|---|---|\n");
    auto row = [&](const char *name, double err) {
        char e[32] = "-";
        if (with_reference) std::snprintf(e, sizeof e, "%.3e", err);
        std::printf("| %s | %s | %s |\n", name, e,
                    g_last_tflops > 0 ? std::to_string(static_cast<int>(g_last_tflops + 0.5)).c_str() : "");
        g_last_tflops = 0;
    };
    const bool fp8_gpu = fp8_backend == FLASHATTN_BACKEND_FA3;
    row(bf16_backend == FLASHATTN_BACKEND_FA3 ? "(a) bf16 inputs, fa3" : "(a) bf16 inputs, cpu (fp32 compute)",
        run_bf16(s, bf16_backend, q, k, v, ref));
    row(fp8_gpu ? "(b) FP8 per-tensor (fa3 FP8 kernel)" : "(b) FP8 per-tensor (cpu, exact dequantization)",
        run_fp8(s, fp8_backend, false, false, q, k, v, ref));
    row(fp8_gpu ? "FP8 per-head, no rotation (fa3)" : "FP8 per-head, no rotation (cpu)",
        run_fp8(s, fp8_backend, true, false, q, k, v, ref));
    row(fp8_gpu ? "FP8 per-tensor + Hadamard (fa3)" : "FP8 per-tensor + Hadamard (cpu)",
        run_fp8(s, fp8_backend, false, true, q, k, v, ref));
    row(fp8_gpu ? "(c) FP8 per-head + Hadamard (fa3 FP8 kernel)" : "(c) FP8 per-head + Hadamard (cpu, exact dequantization)",
        run_fp8(s, fp8_backend, true, true, q, k, v, ref));
    if (emulate) {
        for (const double p_scale : {1.0, 256.0}) {
            std::printf("| (b) per-tensor, P in E4M3 x %g (emulated kernel) | %.3e |\n", p_scale,
                        emulate_kernel(s, false, false, p_scale, q, k, v, ref));
            std::printf("| (c) per-head + Hadamard, P in E4M3 x %g (emulated kernel) | %.3e |\n", p_scale,
                        emulate_kernel(s, true, true, p_scale, q, k, v, ref));
        }
    }
    return 0;
}
