// flashattn-bench --backend fa1|fa2|fa3|all-gpu: libflashattn's CUDA generations against the
// unfused "standard attention" (cuBLAS S = Q K^T, a softmax kernel, cuBLAS O = P V), on the
// FlashAttention-3 paper's grid, and a decode table.
//
// Method (bench/README.md has the long form):
//  - inputs are fresh standard-normal values for every cell (never zeros), layout [b, s, h, d]
//    contiguous for the library; the baseline works on its own [b, h, s, d] copies, made before
//    timing;
//  - each method runs `warmup` times, then a spin kernel holds the GPU for ~2 ms while the host
//    enqueues `reps` runs, each bracketed by its own pair of CUDA events; the number reported is
//    the median of the `reps` times. A method whose first run takes over a second is timed with
//    1 warm-up and 3 runs instead (marked '*'), so one slow kernel cannot eat the run's budget;
//  - after timing, the output (and LSE) is poisoned with NaN, the method runs once more, and the
//    result is compared with the baseline's (relative L2 error of O, max abs error of LSE).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench_common.h"

namespace bench {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors. Failures of the bench's own CUDA and cuBLAS calls are fatal (with the call, file and
// line); failures of libflashattn calls are recorded in the table cell and the run goes on.

Report *g_report = nullptr;        // to save the partial tables on a fatal error
const Options *g_options = nullptr;

[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fatal(const char *fmt, ...) {
    std::fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    std::fputs("flashattn-bench: FATAL: ", stderr);
    std::vfprintf(stderr, fmt, ap);
    std::fputc('\n', stderr);
    va_end(ap);
    if (g_report != nullptr && g_options != nullptr && !g_options->markdown.empty()) {
        g_report->line("");
        g_report->line("(run stopped by a fatal error; see stderr)");
        g_report->write(g_options->markdown);
    }
    if (g_report != nullptr && g_options != nullptr && !g_options->json.empty())
        g_report->write_json(g_options->json, "flashattn-bench");  // the records measured so far
    std::exit(4);
}

void check_cuda(cudaError_t e, const char *what, const char *file, int line) {
    if (e != cudaSuccess)
        fatal("%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

void check_cublas(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS)
        fatal("%s:%d: %s failed: cuBLAS status %d (%s)", file, line, what, static_cast<int>(s),
              cublasGetStatusString(s));
}

#define CK(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CKB(call) check_cublas((call), #call, __FILE__, __LINE__)
#define CK_LAUNCH(name) check_cuda(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

// A device allocation; try_alloc reports out-of-memory instead of failing.
struct DevBuf {
    void *ptr = nullptr;
    size_t bytes = 0;
    DevBuf() = default;
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    DevBuf(DevBuf &&other) noexcept : ptr(other.ptr), bytes(other.bytes) {
        other.ptr = nullptr;
        other.bytes = 0;
    }
    DevBuf &operator=(DevBuf &&) = delete;
    ~DevBuf() { release(); }
    void release() {
        if (ptr != nullptr) CK(cudaFree(ptr));
        ptr = nullptr;
        bytes = 0;
    }
    bool try_alloc(size_t n) {
        release();
        if (n == 0) return true;
        const cudaError_t e = cudaMalloc(&ptr, n);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // not sticky: clear it
            ptr = nullptr;
            return false;
        }
        check_cuda(e, "cudaMalloc", __FILE__, __LINE__);
        bytes = n;
        return true;
    }
    void alloc(size_t n) {
        if (!try_alloc(n)) fatal("cudaMalloc of %.1f MB failed: out of device memory", n / 1e6);
    }
    // Grow-only (the workspace).
    bool reserve(size_t n) { return n <= bytes ? true : try_alloc(n); }
    template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

// ---------------------------------------------------------------------------------------------
// Kernels of the bench itself.

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Standard-normal values (Box-Muller on a counter-based hash): never zeros, new per seed.
template <typename T>
__global__ void fill_normal_kernel(T *x, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = splitmix64(seed * 0x2545F4914F6CDD1Dull + i);
        const float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
        const float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);  // [0, 1)
        x[i] = from_float<T>(sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2));
    }
}

// [b, s, h, d] -> [b, h, s, d], 16 bytes at a time (d*sizeof(T) is a multiple of 16).
__global__ void bshd_to_bhsd_kernel(const uint4 *in, uint4 *out, int64_t b, int64_t s, int64_t h, int64_t d16) {
    const int64_t total = b * s * h * d16;
    for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int64_t t = idx;  // idx walks the input, [b, s, h, d16]
        const int64_t x = t % d16; t /= d16;
        const int64_t hi = t % h; t /= h;
        const int64_t si = t % s;
        const int64_t bi = t / s;
        out[((bi * h + hi) * s + si) * d16 + x] = in[idx];
    }
}

// A paged cache [pages, page, h, d] read through `table` ([b][s / page]) -> [b, h, s, d].
__global__ void paged_to_bhsd_kernel(const uint4 *in, uint4 *out, const int32_t *table, int64_t b, int64_t s,
                                     int64_t h, int64_t d16, int64_t page) {
    const int64_t total = b * s * h * d16;
    for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int64_t t = idx;  // idx walks the logical input, [b, s, h, d16]
        const int64_t x = t % d16; t /= d16;
        const int64_t hi = t % h; t /= h;
        const int64_t si = t % s;
        const int64_t bi = t / s;
        const int64_t phys = static_cast<int64_t>(table[bi * (s / page) + si / page]) * page + si % page;
        out[((bi * h + hi) * s + si) * d16 + x] = in[(phys * h + hi) * d16 + x];
    }
}

__global__ void spin_kernel(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

// Online (max, sum) in the log2 domain, and their merge.
__device__ __forceinline__ void online_add(float &m, float &l, float x) {
    if (x > m) {
        l = l * exp2f(m - x) + 1.0f;
        m = x;
    } else {
        l += exp2f(x - m);
    }
}
__device__ __forceinline__ void online_merge(float &m, float &l, float m2, float l2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) {
        m = mm;
        l = 0.0f;
        return;
    }
    l = l * exp2f(m - mm) + l2 * exp2f(m2 - mm);
    m = mm;
}

template <typename T> struct alignas(4 * sizeof(T)) Vec4 { T v[4]; };

// One block per row of S (fp32, rows of sk scores, row index = ((batch*heads)+head)*sq + i):
// P = softmax(scale * S) with the causal mask aligned bottom-right (key j visible to query i when
// j <= i + sk - sq), fp32 math, P written in the input dtype (masked entries 0), and the row's
// natural-log LSE.
template <typename T>
__global__ void __launch_bounds__(256) softmax_kernel(const float *__restrict__ S, T *__restrict__ P,
                                                      float *__restrict__ lse, int sq, int sk, float scale_log2,
                                                      int causal) {
    const size_t row = blockIdx.x;
    const int i = static_cast<int>(row % static_cast<size_t>(sq));
    int visible = sk;
    if (causal) {
        const long long v = static_cast<long long>(i) + sk - sq + 1;
        visible = v < 0 ? 0 : (v > sk ? sk : static_cast<int>(v));
    }
    const float *s = S + row * static_cast<size_t>(sk);
    T *p = P + row * static_cast<size_t>(sk);
    const bool vec = (sk % 4) == 0;

    float m = -INFINITY, l = 0.0f;
    if (vec) {
        const float4 *s4 = reinterpret_cast<const float4 *>(s);
        const int n4 = (visible + 3) / 4;
        for (int c = threadIdx.x; c < n4; c += blockDim.x) {
            const float4 f = s4[c];
            const float xs[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (4 * c + u < visible) online_add(m, l, xs[u] * scale_log2);
        }
    } else {
        for (int j = threadIdx.x; j < visible; j += blockDim.x) online_add(m, l, s[j] * scale_log2);
    }
    // Block reduction of (m, l).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
        online_merge(m, l, m2, l2);
    }
    __shared__ float sm[32], sl[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = (blockDim.x + 31) / 32;
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? sm[lane] : -INFINITY;
        l = lane < nwarps ? sl[lane] : 0.0f;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l, off);
            online_merge(m, l, m2, l2);
        }
        if (lane == 0) {
            sm[0] = m;
            sl[0] = l;
        }
    }
    __syncthreads();
    m = sm[0];
    l = sl[0];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (threadIdx.x == 0 && lse != nullptr)
        lse[row] = l > 0.0f ? m * 0.69314718056f + logf(l) : -INFINITY;

    if (vec) {
        const float4 *s4 = reinterpret_cast<const float4 *>(s);
        Vec4<T> *p4 = reinterpret_cast<Vec4<T> *>(p);
        const int n4 = sk / 4;
        for (int c = threadIdx.x; c < n4; c += blockDim.x) {
            Vec4<T> out;
            if (4 * c >= visible) {
#pragma unroll
                for (int u = 0; u < 4; ++u) out.v[u] = from_float<T>(0.0f);
            } else {
                const float4 f = s4[c];
                const float xs[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    out.v[u] = from_float<T>(4 * c + u < visible ? exp2f(xs[u] * scale_log2 - m) * inv : 0.0f);
            }
            p4[c] = out;
        }
    } else {
        for (int j = threadIdx.x; j < sk; j += blockDim.x)
            p[j] = from_float<T>(j < visible ? exp2f(s[j] * scale_log2 - m) * inv : 0.0f);
    }
}

struct CmpStats {
    double sum_d2;            // sum of squared differences
    double sum_r2;            // sum of squared reference values
    unsigned int max_abs;     // bits of the largest |difference| (non-negative floats order as ints)
    unsigned int pad;
    unsigned long long bad;   // non-finite outputs (where the reference is finite)
};

__device__ __forceinline__ void cmp_accumulate(CmpStats *out, double d2, double r2, float mx,
                                               unsigned long long bad) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        d2 += __shfl_xor_sync(0xffffffffu, d2, off);
        r2 += __shfl_xor_sync(0xffffffffu, r2, off);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        bad += __shfl_xor_sync(0xffffffffu, bad, off);
    }
    if (threadIdx.x % 32 == 0) {
        atomicAdd(&out->sum_d2, d2);
        atomicAdd(&out->sum_r2, r2);
        atomicMax(&out->max_abs, __float_as_uint(mx));
        atomicAdd(&out->bad, bad);
    }
}

// One thread's running error sums: squared error and squared reference (relative L2), the largest
// absolute error, and how many outputs were not finite.
struct ErrorSums {
    double d2 = 0.0, r2 = 0.0;
    float mx = 0.0f;
    unsigned long long bad = 0;
    __device__ void add(float a, float r) {
        if (!isfinite(a)) {
            ++bad;
            return;
        }
        const float e = fabsf(a - r);
        d2 += static_cast<double>(e) * e;
        r2 += static_cast<double>(r) * r;
        mx = fmaxf(mx, e);
    }
};

// O in [b, s, h, d] (the library's) against Oref in [b, h, s, d] (the baseline's).
template <typename T>
__global__ void compare_o_kernel(const T *o, const T *ref, int64_t b, int64_t s, int64_t h, int64_t d,
                                 CmpStats *out) {
    ErrorSums err;
    const int64_t total = b * s * h * d;
    for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        int64_t t = idx;
        const int64_t x = t % d; t /= d;
        const int64_t hi = t % h; t /= h;
        const int64_t si = t % s;
        const int64_t bi = t / s;
        const float a = to_float(o[idx]);
        const float r = to_float(ref[((bi * h + hi) * s + si) * d + x]);
        err.add(a, r);
    }
    cmp_accumulate(out, err.d2, err.r2, err.mx, err.bad);
}

__global__ void compare_lse_kernel(const float *x, const float *ref, int64_t n, CmpStats *out) {
    ErrorSums err;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float a = x[i], r = ref[i];
        if (isinf(r) && a == r) continue;  // both -inf: a fully masked row
        err.add(a, r);
    }
    cmp_accumulate(out, err.d2, err.r2, err.mx, err.bad);
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct Gpu {
    int device = 0;
    cudaDeviceProp prop{};
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    long long spin_cycles = 0;
    CmpStats *stats = nullptr;  // device
    std::vector<cudaEvent_t> events;
};

int grid_for(size_t work, int threads, const Gpu &g) {
    const size_t blocks = (work + threads - 1) / threads;
    const size_t cap = static_cast<size_t>(g.prop.multiProcessorCount) * 16;
    return static_cast<int>(std::max<size_t>(1, std::min(blocks, cap)));
}

size_t elem_size(flashattn_dtype_t dt) { return dt == FLASHATTN_DTYPE_FP32 ? 4 : 2; }

cudaDataType cuda_type(flashattn_dtype_t dt) { return dt == FLASHATTN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

void fill_normal(const Gpu &g, void *x, size_t n, flashattn_dtype_t dt, uint64_t seed) {
    const int grid = grid_for(n, 256, g);
    if (dt == FLASHATTN_DTYPE_BF16)
        fill_normal_kernel<__nv_bfloat16><<<grid, 256, 0, g.stream>>>(static_cast<__nv_bfloat16 *>(x), n, seed);
    else
        fill_normal_kernel<__half><<<grid, 256, 0, g.stream>>>(static_cast<__half *>(x), n, seed);
    CK_LAUNCH("fill_normal_kernel");
}

void to_bhsd(const Gpu &g, const void *in, void *out, int64_t b, int64_t s, int64_t h, int64_t d, size_t es) {
    const int64_t d16 = d * static_cast<int64_t>(es) / 16;
    const size_t work = static_cast<size_t>(b * s * h * d16);
    bshd_to_bhsd_kernel<<<grid_for(work, 256, g), 256, 0, g.stream>>>(static_cast<const uint4 *>(in),
                                                                        static_cast<uint4 *>(out), b, s, h, d16);
    CK_LAUNCH("bshd_to_bhsd_kernel");
}

void paged_to_bhsd(const Gpu &g, const void *in, void *out, const int32_t *table, int64_t b, int64_t s, int64_t h,
                   int64_t d, size_t es, int64_t page) {
    const int64_t d16 = d * static_cast<int64_t>(es) / 16;
    const size_t work = static_cast<size_t>(b * s * h * d16);
    paged_to_bhsd_kernel<<<grid_for(work, 256, g), 256, 0, g.stream>>>(
        static_cast<const uint4 *>(in), static_cast<uint4 *>(out), table, b, s, h, d16, page);
    CK_LAUNCH("paged_to_bhsd_kernel");
}

struct Diff {
    bool valid = false;
    double rel_l2 = 0.0;
    double max_abs = 0.0;
    unsigned long long bad = 0;
};

Diff read_stats(const Gpu &g) {
    CmpStats h{};
    CK(cudaMemcpyAsync(&h, g.stats, sizeof h, cudaMemcpyDeviceToHost, g.stream));
    CK(cudaStreamSynchronize(g.stream));
    Diff d;
    d.valid = true;
    d.rel_l2 = h.sum_r2 > 0 ? std::sqrt(h.sum_d2 / h.sum_r2) : std::sqrt(h.sum_d2);
    float mx;
    std::memcpy(&mx, &h.max_abs, sizeof mx);
    d.max_abs = mx;
    d.bad = h.bad;
    return d;
}

Diff compare_o(const Gpu &g, const void *o, const void *ref, int64_t b, int64_t s, int64_t h, int64_t d,
               flashattn_dtype_t dt) {
    CK(cudaMemsetAsync(g.stats, 0, sizeof(CmpStats), g.stream));
    const size_t n = static_cast<size_t>(b * s * h * d);
    const int grid = grid_for(n, 256, g);
    if (dt == FLASHATTN_DTYPE_BF16)
        compare_o_kernel<__nv_bfloat16><<<grid, 256, 0, g.stream>>>(static_cast<const __nv_bfloat16 *>(o),
                                                                    static_cast<const __nv_bfloat16 *>(ref), b, s,
                                                                    h, d, g.stats);
    else
        compare_o_kernel<__half><<<grid, 256, 0, g.stream>>>(static_cast<const __half *>(o),
                                                             static_cast<const __half *>(ref), b, s, h, d, g.stats);
    CK_LAUNCH("compare_o_kernel");
    return read_stats(g);
}

Diff compare_lse(const Gpu &g, const float *x, const float *ref, int64_t n) {
    CK(cudaMemsetAsync(g.stats, 0, sizeof(CmpStats), g.stream));
    compare_lse_kernel<<<grid_for(static_cast<size_t>(n), 256, g), 256, 0, g.stream>>>(x, ref, n, g.stats);
    CK_LAUNCH("compare_lse_kernel");
    return read_stats(g);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times `launch` (which enqueues one run on g.stream and returns "" or an error message).
struct Timing {
    bool ok = false;
    double ms = 0.0;       // median
    bool reduced = false;  // slow: 1 warm-up + 3 runs
    std::string error;
};

Timing time_runs(Gpu &g, int warmup, int reps, const std::function<std::string(int)> &launch, const char *what) {
    Timing t;
    const size_t need = 2 * static_cast<size_t>(std::max(reps, 3));
    while (g.events.size() < need) {
        cudaEvent_t e;
        CK(cudaEventCreate(&e));
        g.events.push_back(e);
    }
    int run_index = 0;
    auto sync = [&](const char *phase) {
        const cudaError_t e = cudaStreamSynchronize(g.stream);
        if (e != cudaSuccess)
            fatal("CUDA error while running %s (%s): %s (%s); the CUDA context is unusable, stopping", what, phase,
                  cudaGetErrorName(e), cudaGetErrorString(e));
    };
    // First run, timed on its own to spot a pathologically slow method.
    CK(cudaEventRecord(g.events[0], g.stream));
    t.error = launch(run_index++);
    if (!t.error.empty()) return t;
    CK(cudaEventRecord(g.events[1], g.stream));
    sync("first run");
    float first_ms = 0.0f;
    CK(cudaEventElapsedTime(&first_ms, g.events[0], g.events[1]));
    int remaining_warmup = warmup - 1;
    if (first_ms > 1000.0f) {
        t.reduced = true;
        remaining_warmup = 0;
        reps = std::min(reps, 3);
    }
    for (int w = 0; w < remaining_warmup; ++w) {
        t.error = launch(run_index++);
        if (!t.error.empty()) return t;
    }
    sync("warm-up");
    // Hold the GPU while the host enqueues the timed runs, so launch gaps stay out of the times.
    spin_kernel<<<1, 1, 0, g.stream>>>(g.spin_cycles);
    CK_LAUNCH("spin_kernel");
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(g.events[2 * r], g.stream));
        t.error = launch(run_index++);
        if (!t.error.empty()) {
            sync("timed run");
            return t;
        }
        CK(cudaEventRecord(g.events[2 * r + 1], g.stream));
    }
    sync("timed runs");
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
        float x = 0.0f;
        CK(cudaEventElapsedTime(&x, g.events[2 * r], g.events[2 * r + 1]));
        ms.push_back(x);
    }
    t.ms = median(ms);
    t.ok = true;
    return t;
}

// One attention problem in the library's layout.
struct Problem {
    int64_t b, sq, sk, hq, hkv, d;
    flashattn_dtype_t dtype;
    bool causal;
    int64_t page = 0;  // paged K/V: keys per page (sk a multiple of it), else 0
    int64_t splits = 0;   // FLASHATTN_I64_NUM_SPLITS (0: auto)
    bool append = false;  // decode step with an append of one K/V row and rotary (Buffers::seqused ...)
    bool deterministic = false;  // FLASHATTN_I64_DETERMINISTIC (the backward table)
    bool seqused = false;  // FLASHATTN_I64_SEQUSED_K with every key used (--seqused-k; append implies seqused_k)
};

flashattn_status_t make_plan(flashattn_backend_t be, const Problem &p, int device, flashattn_plan_t **out,
                             size_t *ws_bytes, std::string *why) {
    *out = nullptr;
    flashattn_plan_t *plan = nullptr;
    flashattn_status_t st = create_shaped_plan(PlanKeys{p.b, p.sq, p.sk, p.hq, p.hkv, p.d, p.dtype, p.causal, be}, &plan);
    if (st != FLASHATTN_SUCCESS) {
        *why = flashattn_last_error();
        return st;
    }
    auto set = [&](flashattn_i64_param_t key, int64_t v) {
        if (st == FLASHATTN_SUCCESS) st = flashattn_plan_set_i64(plan, key, v);
    };
    set(FLASHATTN_I64_DEVICE, device);
    if (p.page > 0) {  // [b * sk / page pages, page, hkv, d]; the page table is Buffers::table
        set(FLASHATTN_I64_PAGED_KV, 1);
        set(FLASHATTN_I64_PAGE_SIZE, p.page);
        set(FLASHATTN_I64_NUM_PAGES, p.b * p.sk / p.page);
    }
    if (p.splits > 0) set(FLASHATTN_I64_NUM_SPLITS, p.splits);
    if (p.append || p.seqused) set(FLASHATTN_I64_SEQUSED_K, 1);
    if (p.append) {  // the cache holds sk - 1 keys; the step appends the sk-th with a full-width rotary
        set(FLASHATTN_I64_NEW_KV_ROWS, 1);
        set(FLASHATTN_I64_ROTARY_DIM, p.d);
    }
    if (p.deterministic) set(FLASHATTN_I64_DETERMINISTIC, 1);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_finalize(plan);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_workspace_size(plan, ws_bytes);
    if (st != FLASHATTN_SUCCESS) {
        *why = flashattn_last_error();
        flashattn_plan_destroy(plan);
        return st;
    }
    *out = plan;
    return st;
}

// Buffers of the library's side and of the baseline's side.
struct Buffers {
    std::vector<DevBuf> q, k, v;  // rotation sets ([b, s, h, d])
    DevBuf o, lse;
    DevBuf qt, kt, vt, ot, lse_ref;  // baseline ([b, h, s, d] copies and its outputs)
    DevBuf s, p;                     // baseline scores and probabilities
    DevBuf workspace;
    DevBuf table;  // paged decode: int32 [b][sk / page], a random permutation of the pages
    DevBuf seqused, k_new, v_new, cos, sin;  // --append-rotary: int32 [b] = sk - 1 (--seqused-k: sk), [b, 1, hkv, d], fp32 [sk, d/2]
};

// The unfused baseline on buffers qt/kt/vt (set 0). S is fp32, P the input dtype.
std::string standard_launch(Gpu &g, const Problem &p, Buffers &bf) {
    const int64_t group = p.hq / p.hkv;
    const int64_t n_rows = group * p.sq;  // query rows sharing one K/V head
    const int batch = static_cast<int>(p.b * p.hkv);
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = cuda_type(p.dtype);
    // S^T(col-major sk x n_rows) = K (sk x d) * Q^T: row-major S[n_rows, sk] = Q K^T.
    CKB(cublasGemmStridedBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.sk), static_cast<int>(n_rows),
                                   static_cast<int>(p.d), &one, bf.kt.ptr, t, static_cast<int>(p.d), p.sk * p.d,
                                   bf.qt.ptr, t, static_cast<int>(p.d), n_rows * p.d, &zero, bf.s.ptr, CUDA_R_32F,
                                   static_cast<int>(p.sk), n_rows * p.sk, batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    const size_t rows = static_cast<size_t>(p.b * p.hq * p.sq);
    const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(p.d)));
    const int threads = p.sk >= 1024 ? 256 : 128;
    if (p.dtype == FLASHATTN_DTYPE_BF16)
        softmax_kernel<__nv_bfloat16><<<static_cast<unsigned>(rows), threads, 0, g.stream>>>(
            bf.s.as<float>(), bf.p.as<__nv_bfloat16>(), bf.lse_ref.as<float>(), static_cast<int>(p.sq),
            static_cast<int>(p.sk), scale_log2, p.causal ? 1 : 0);
    else
        softmax_kernel<__half><<<static_cast<unsigned>(rows), threads, 0, g.stream>>>(
            bf.s.as<float>(), bf.p.as<__half>(), bf.lse_ref.as<float>(), static_cast<int>(p.sq),
            static_cast<int>(p.sk), scale_log2, p.causal ? 1 : 0);
    CK_LAUNCH("softmax_kernel");
    // O^T(col-major d x n_rows) = V^T (d x sk) * P^T (sk x n_rows): row-major O = P V.
    CKB(cublasGemmStridedBatchedEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.d), static_cast<int>(n_rows),
                                   static_cast<int>(p.sk), &one, bf.vt.ptr, t, static_cast<int>(p.d), p.sk * p.d,
                                   bf.p.ptr, t, static_cast<int>(p.sk), n_rows * p.sk, &zero, bf.ot.ptr, t,
                                   static_cast<int>(p.d), n_rows * p.d, batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return std::string();
}

// Result of one method on one cell.
struct Cell {
    enum Kind { OK, NA, ERR, OOM, SKIP, NOREF } kind = SKIP;
    double ms = 0.0;
    bool reduced = false;
    std::string note;    // reason for NA / ERR / OOM
    Diff o_diff, lse_diff;
    size_t extra_bytes = 0;  // baseline: S + P
};

struct Notes {
    std::map<std::string, std::set<std::string>> na;  // reason -> cells
    std::vector<std::string> errors;
    bool any_reduced = false;
    bool failed = false;
};

const char *gen_name(flashattn_backend_t be) {
    switch (be) {
        case FLASHATTN_BACKEND_FA1: return "fa1";
        case FLASHATTN_BACKEND_FA2: return "fa2";
        case FLASHATTN_BACKEND_FA3: return "fa3";
        default: return "?";
    }
}

// Free device memory minus a safety margin.
size_t usable_free_bytes() {
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const size_t margin = std::max<size_t>(size_t(2) << 30, total_b / 32);
    return free_b > margin ? free_b - margin : 0;
}

// Runs the baseline on (qt, kt, vt) already filled; leaves ot and lse_ref for the checks.
Cell run_standard(Gpu &g, const Options &opt, const Problem &p, Buffers &bf, int reps, int warmup) {
    Cell c;
    const size_t es = elem_size(p.dtype);
    const size_t scores = static_cast<size_t>(p.b * p.hq * p.sq * p.sk);
    c.extra_bytes = scores * (4 + es);
    bf.s.release();
    bf.p.release();
    if (c.extra_bytes > usable_free_bytes() || !bf.s.try_alloc(scores * 4) || !bf.p.try_alloc(scores * es)) {
        bf.s.release();
        bf.p.release();
        c.kind = Cell::OOM;
        c.note = format("S + P need %.0f MB", c.extra_bytes / 1e6);
        return c;
    }
    Timing t = time_runs(g, warmup, reps, [&](int) { return standard_launch(g, p, bf); }, "the standard baseline");
    bf.s.release();
    bf.p.release();
    (void)opt;
    c.kind = t.ok ? Cell::OK : Cell::ERR;
    c.ms = t.ms;
    c.reduced = t.reduced;
    c.note = t.error;
    return c;
}

// Runs generation `be` on rotation sets of bf.q/k/v; checks against ot/lse_ref when have_ref.
Cell run_gen(Gpu &g, const Options &opt, flashattn_backend_t be, const Problem &p, Buffers &bf, int reps, int warmup,
             bool have_ref) {
    Cell c;
    flashattn_plan_t *plan = nullptr;
    size_t ws = 0;
    std::string why;
    const flashattn_status_t st = make_plan(be, p, opt.device, &plan, &ws, &why);
    if (st == FLASHATTN_ERROR_NOT_SUPPORTED) {
        c.kind = Cell::NA;
        c.note = why;
        return c;
    }
    if (st != FLASHATTN_SUCCESS) {
        c.kind = Cell::ERR;
        c.note = std::string("plan: ") + flashattn_status_string(st) + ": " + why;
        return c;
    }
    if (!bf.workspace.reserve(ws)) {
        flashattn_plan_destroy(plan);
        c.kind = Cell::OOM;
        c.note = format("workspace of %.0f MB", ws / 1e6);
        return c;
    }
    float *lse = opt.no_lse ? nullptr : bf.lse.as<float>();
    const size_t sets = bf.q.size();
    const size_t o_bytes = static_cast<size_t>(p.b * p.sq * p.hq * p.d) * elem_size(p.dtype);
    flashattn_args_t *args = nullptr;  // paged: the execute-arguments call (page table)
    if ((p.page > 0 || p.append || p.seqused) && flashattn_args_create(&args) != FLASHATTN_SUCCESS)
        fatal("flashattn_args_create failed");
    auto launch = [&](int run) -> std::string {
        const size_t s = static_cast<size_t>(run) % sets;
        flashattn_status_t e;
        if (args != nullptr) {
            flashattn_args_set(args, FLASHATTN_ARG_Q, bf.q[s].ptr);
            flashattn_args_set(args, FLASHATTN_ARG_K, bf.k[s].ptr);
            flashattn_args_set(args, FLASHATTN_ARG_V, bf.v[s].ptr);
            flashattn_args_set(args, FLASHATTN_ARG_O, bf.o.ptr);
            flashattn_args_set(args, FLASHATTN_ARG_LSE, lse);
            if (p.page > 0) flashattn_args_set(args, FLASHATTN_ARG_PAGE_TABLE, bf.table.ptr);
            if (p.append || p.seqused) flashattn_args_set(args, FLASHATTN_ARG_SEQUSED_K, bf.seqused.ptr);
            if (p.append) {
                flashattn_args_set(args, FLASHATTN_ARG_K_NEW, bf.k_new.ptr);
                flashattn_args_set(args, FLASHATTN_ARG_V_NEW, bf.v_new.ptr);
                flashattn_args_set(args, FLASHATTN_ARG_ROTARY_COS, bf.cos.ptr);
                flashattn_args_set(args, FLASHATTN_ARG_ROTARY_SIN, bf.sin.ptr);
            }
            e = flashattn_plan_execute_args(plan, args, bf.workspace.ptr, ws, reinterpret_cast<flashattn_stream_t>(g.stream));
        } else {
            e = flashattn_plan_execute(plan, bf.q[s].ptr, bf.k[s].ptr, bf.v[s].ptr, bf.o.ptr, lse, bf.workspace.ptr, ws,
                                       reinterpret_cast<flashattn_stream_t>(g.stream));
        }
        return e == FLASHATTN_SUCCESS ? std::string() : std::string("execute: ") + lib_error(e);
    };
    CK(cudaMemsetAsync(bf.o.ptr, 0xFF, o_bytes, g.stream));  // NaN in bf16, fp16 and fp32
    Timing t = time_runs(g, warmup, reps, launch, gen_name(be));
    if (!t.ok) {
        flashattn_plan_destroy(plan);
        flashattn_args_destroy(args);
        c.kind = Cell::ERR;
        c.note = t.error;
        return c;
    }
    c.kind = Cell::OK;
    c.ms = t.ms;
    c.reduced = t.reduced;
    if (have_ref) {
        // A fresh run on set 0 (the baseline's inputs) into poisoned outputs, then compare.
        CK(cudaMemsetAsync(bf.o.ptr, 0xFF, o_bytes, g.stream));
        if (lse) CK(cudaMemsetAsync(lse, 0xFF, static_cast<size_t>(p.b * p.hq * p.sq) * 4, g.stream));
        const std::string e = launch(0);
        if (!e.empty()) {
            c.kind = Cell::ERR;
            c.note = e;
        } else {
            const cudaError_t ce = cudaStreamSynchronize(g.stream);
            if (ce != cudaSuccess)
                fatal("CUDA error while running %s (check run): %s (%s)", gen_name(be), cudaGetErrorName(ce),
                      cudaGetErrorString(ce));
            // The baseline's O is [b*hkv, group*sq, d] = [b, hq, sq, d].
            c.o_diff = compare_o(g, bf.o.ptr, bf.ot.ptr, p.b, p.sq, p.hq, p.d, p.dtype);
            if (lse) c.lse_diff = compare_lse(g, lse, bf.lse_ref.as<float>(), p.b * p.hq * p.sq);
        }
    }
    flashattn_plan_destroy(plan);
    flashattn_args_destroy(args);
    return c;
}

bool cell_bad(const Cell &c) {
    if (c.kind != Cell::OK) return false;
    if (c.o_diff.valid && (c.o_diff.bad > 0 || !(c.o_diff.rel_l2 <= 2e-2))) return true;
    if (c.lse_diff.valid && (c.lse_diff.bad > 0 || !(c.lse_diff.max_abs <= 2e-2))) return true;
    return false;
}

std::string cell_text(const Cell &c, double value, const char *fmt) {
    switch (c.kind) {
        case Cell::OK: return format(fmt, value) + (c.reduced ? "*" : "") + (cell_bad(c) ? " BAD" : "");
        case Cell::NA: return "n/a";
        case Cell::ERR: return "ERR";
        case Cell::OOM: return "OOM";
        case Cell::SKIP: return "skip";
        case Cell::NOREF: return "-";
    }
    return "?";
}

// The --json record of one cell: TFLOP/s for prefill (flops > 0), GB/s of K and V for decode.
Record cell_record(const Cell &c, const char *kind, const std::string &method, const Problem &p, double flops,
                   double kv_bytes) {
    Record r;
    r.kind = kind;
    r.backend = method;
    r.dtype = dtype_name(p.dtype);
    r.batch = p.b;
    r.seqlen_q = p.sq;
    r.seqlen_k = p.sk;
    r.heads_q = p.hq;
    r.heads_kv = p.hkv;
    r.head_dim = p.d;
    r.causal = p.causal;
    r.reduced = c.reduced;
    r.note = c.note;
    switch (c.kind) {
        case Cell::OK: r.status = cell_bad(c) ? "bad" : "ok"; break;
        case Cell::NA: r.status = "n/a"; break;
        case Cell::ERR: r.status = "error"; break;
        case Cell::OOM: r.status = "oom"; break;
        case Cell::SKIP:
        case Cell::NOREF: r.status = "skipped"; break;
    }
    if (c.kind == Cell::OK) {
        r.ms = c.ms;
        if (flops > 0) r.tflops = flops / (c.ms * 1e-3) / 1e12;
        if (kv_bytes > 0) {
            r.bytes = kv_bytes;
            r.gbps = kv_bytes / (c.ms * 1e-3) / 1e9;
        }
    }
    return r;
}

void note_cell(Notes &notes, const Cell &c, const std::string &method, const std::string &where) {
    if (c.reduced) notes.any_reduced = true;
    if (c.kind == Cell::NA) notes.na[method + ": " + c.note].insert(where);
    if (c.kind == Cell::ERR) {
        notes.errors.push_back(method + " at " + where + ": " + c.note);
        notes.failed = true;
    }
    if (cell_bad(c)) {
        notes.errors.push_back(format("%s at %s: WRONG RESULT vs the standard baseline: O rel L2 %.3e (max abs %.3e, "
                                      "%llu non-finite), LSE max abs %.3e (%llu non-finite)",
                                      method.c_str(), where.c_str(), c.o_diff.rel_l2, c.o_diff.max_abs, c.o_diff.bad,
                                      c.lse_diff.max_abs, c.lse_diff.bad));
        notes.failed = true;
    }
}

std::string check_text(const std::vector<Cell> &gens, bool have_ref) {
    if (!have_ref) return "no ref";
    double worst = 0.0, worst_lse = 0.0;
    bool any = false;
    for (const Cell &c : gens) {
        if (c.kind != Cell::OK || !c.o_diff.valid) continue;
        if (cell_bad(c)) return "BAD";
        any = true;
        worst = std::max(worst, c.o_diff.rel_l2);
        if (c.lse_diff.valid) worst_lse = std::max(worst_lse, c.lse_diff.max_abs);
    }
    if (!any) return "-";
    return format("ok %.1e / %.1e", worst, worst_lse);
}

void print_notes(Report &rep, const Notes &notes) {
    for (const auto &kv : notes.na) {
        std::string cells;
        size_t n = 0;
        for (const auto &w : kv.second) {
            if (n++ == 6) {
                cells += ", ...";
                break;
            }
            cells += (cells.empty() ? "" : ", ") + w;
        }
        rep.line(format("- n/a %s [%zu cell(s): %s]", kv.first.c_str(), kv.second.size(), cells.c_str()));
    }
    for (const auto &e : notes.errors) rep.line("- ERROR " + e);
    if (notes.any_reduced) rep.line("- `*`: the first run took over 1 s, so this cell is the median of 3 runs after 1 warm-up.");
}

struct Clock {
    double start = now_s();
    double elapsed() const { return now_s() - start; }
};

// ---------------------------------------------------------------------------------------------
// The prefill grid (FlashAttention-3 paper).

// One cell of the prefill grid: heads = 2048/hdim, batch = 16384/seqlen, its forward FLOPs, its
// name in notes and the start of its table row.
struct PrefillCell {
    int64_t b, h;
    double flops;
    std::string where, row;
};

PrefillCell prefill_cell(flashattn_dtype_t dt, int64_t d, int causal, int64_t s) {
    PrefillCell c;
    c.h = std::max<int64_t>(1, 2048 / d);
    c.b = std::max<int64_t>(1, 16384 / s);
    c.flops = attention_flops(c.b, c.h, s, s, d, causal != 0);
    c.where = format("%s hdim %lld causal %d seqlen %lld", dtype_name(dt), static_cast<long long>(d), causal,
                     static_cast<long long>(s));
    c.row = format("| %lld | %s | %lld | %lld x %lld |", static_cast<long long>(d), causal ? "yes" : "no",
                   static_cast<long long>(s), static_cast<long long>(c.b), static_cast<long long>(c.h));
    return c;
}

// All prefill cells share one size: b*s*h*d = 16384 * 2048 elements per tensor (more when a
// --seqlen above 16384 or one that does not divide it is asked for). Allocates bf's one input set,
// O and LSE for the largest cell (2-byte elements) and returns the sizes, in elements.
void alloc_prefill_buffers(const std::vector<int64_t> &hdims, const std::vector<int64_t> &seqlens, Buffers &bf,
                           size_t *max_elems, size_t *max_lse) {
    *max_elems = *max_lse = 0;
    for (int64_t d : hdims)
        for (int64_t s : seqlens) {
            const int64_t h = std::max<int64_t>(1, 2048 / d), b = std::max<int64_t>(1, 16384 / s);
            *max_elems = std::max(*max_elems, static_cast<size_t>(b * s * h * d));
            *max_lse = std::max(*max_lse, static_cast<size_t>(b * h * s));
        }
    bf.q.resize(1);
    bf.k.resize(1);
    bf.v.resize(1);
    for (auto *x : {&bf.q[0], &bf.k[0], &bf.v[0], &bf.o}) x->alloc(*max_elems * 2);
    bf.lse.alloc(*max_lse * 4);
}

void run_grid(Gpu &g, const Options &opt, const std::vector<flashattn_backend_t> &gens, Report &rep, Notes &all_notes,
              const Clock &clock, double deadline_s) {
    const std::vector<flashattn_dtype_t> dtypes =
        opt.dtypes.empty() ? std::vector<flashattn_dtype_t>{FLASHATTN_DTYPE_BF16} : opt.dtypes;
    const std::vector<int64_t> hdims = opt.hdims.empty() ? std::vector<int64_t>{64, 128, 256} : opt.hdims;
    const std::vector<int64_t> seqlens =
        opt.seqlens.empty() ? std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384} : opt.seqlens;
    const std::vector<int> causals = opt.causal.empty() ? std::vector<int>{0, 1} : opt.causal;
    const int warmup = opt.warmup >= 0 ? opt.warmup : 3;
    const int reps = opt.reps > 0 ? opt.reps : 10;
    const bool want_std = !opt.no_standard;
    bool has[5] = {false, false, false, false, false};
    for (auto be : gens) has[be] = true;

    Buffers bf;
    size_t max_elems = 0, max_lse = 0;
    alloc_prefill_buffers(hdims, seqlens, bf, &max_elems, &max_lse);
    const size_t es_max = 2;
    if (want_std) {
        for (auto *x : {&bf.qt, &bf.kt, &bf.vt, &bf.ot}) x->alloc(max_elems * es_max);
        bf.lse_ref.alloc(max_lse * 4);
    }

    uint64_t seed = 1;
    for (flashattn_dtype_t dt : dtypes) {
        Notes notes;
        rep.line("");
        rep.line(format("## Forward, %s: TFLOP/s (hidden 2048, heads = 2048/hdim, batch = 16384/seqlen, seqlen_q = seqlen_k)",
                        dtype_name(dt)));
        rep.line("");
        std::string head = "| hdim | causal | seqlen | batch x heads |";
        std::string rule = "|---|---|---|---|";
        for (auto be : gens) {
            head += format(" %s |", gen_name(be));
            rule += "---|";
        }
        if (want_std) {
            head += " standard | standard peak MB |";
            rule += "---|---|";
        }
        if (has[FLASHATTN_BACKEND_FA1] && has[FLASHATTN_BACKEND_FA2]) {
            head += " fa2/fa1 |";
            rule += "---|";
        }
        if (has[FLASHATTN_BACKEND_FA2] && has[FLASHATTN_BACKEND_FA3]) {
            head += " fa3/fa2 |";
            rule += "---|";
        }
        head += " check (O rel L2 / LSE abs) |";
        rule += "---|";
        rep.line(head);
        rep.line(rule);

        for (int64_t d : hdims) {
            for (int causal : causals) {
                for (int64_t s : seqlens) {
                    const PrefillCell cell = prefill_cell(dt, d, causal, s);
                    const int64_t h = cell.h, b = cell.b;
                    const Problem p{b, s, s, h, h, d, dt, causal != 0};
                    const double flops = cell.flops;
                    const std::string &where = cell.where;
                    std::string row = cell.row;
                    const bool skip = clock.elapsed() > deadline_s;
                    const size_t n = static_cast<size_t>(b * s * h * d);
                    if (!skip) {
                        fill_normal(g, bf.q[0].ptr, n, dt, seed++);
                        fill_normal(g, bf.k[0].ptr, n, dt, seed++);
                        fill_normal(g, bf.v[0].ptr, n, dt, seed++);
                    }
                    Cell stdc;
                    if (want_std && !skip) {
                        to_bhsd(g, bf.q[0].ptr, bf.qt.ptr, b, s, h, d, 2);
                        to_bhsd(g, bf.k[0].ptr, bf.kt.ptr, b, s, h, d, 2);
                        to_bhsd(g, bf.v[0].ptr, bf.vt.ptr, b, s, h, d, 2);
                        CK(cudaStreamSynchronize(g.stream));
                        stdc = run_standard(g, opt, p, bf, reps, warmup);
                        note_cell(notes, stdc, "standard", where);
                    }
                    const bool have_ref = want_std && stdc.kind == Cell::OK;
                    std::vector<Cell> cells;
                    double tf[5] = {0, 0, 0, 0, 0};
                    if (want_std) rep.record(cell_record(stdc, "prefill", "standard", p, flops, 0));
                    for (auto be : gens) {
                        Cell c = skip ? Cell{} : run_gen(g, opt, be, p, bf, reps, warmup, have_ref);
                        if (c.kind == Cell::OK) tf[be] = flops / (c.ms * 1e-3) / 1e12;
                        rep.record(cell_record(c, "prefill", gen_name(be), p, flops, 0));
                        note_cell(notes, c, gen_name(be), where);
                        row += " " + cell_text(c, tf[be], "%.1f") + " |";
                        cells.push_back(c);
                    }
                    if (want_std) {
                        const double st_tf = stdc.kind == Cell::OK ? flops / (stdc.ms * 1e-3) / 1e12 : 0.0;
                        row += " " + cell_text(stdc, st_tf, "%.1f") + " |";
                        row += skip ? " |" : format(" %.0f |", stdc.extra_bytes / 1e6);
                    }
                    auto ratio = [&](flashattn_backend_t a, flashattn_backend_t bb) {
                        if (tf[a] > 0 && tf[bb] > 0) row += format(" %.2f |", tf[a] / tf[bb]);
                        else row += " - |";
                    };
                    if (has[FLASHATTN_BACKEND_FA1] && has[FLASHATTN_BACKEND_FA2]) ratio(FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA1);
                    if (has[FLASHATTN_BACKEND_FA2] && has[FLASHATTN_BACKEND_FA3]) ratio(FLASHATTN_BACKEND_FA3, FLASHATTN_BACKEND_FA2);
                    row += " " + (skip ? std::string("skipped (time budget)") : check_text(cells, have_ref)) + " |";
                    rep.line(row);
                }
            }
        }
        rep.line("");
        print_notes(rep, notes);
        all_notes.failed = all_notes.failed || notes.failed;
    }
}

// ---------------------------------------------------------------------------------------------
// The backward table (--backward): the prefill grid's shapes, the backward alone and forward +
// backward of each generation (and its deterministic mode with --deterministic).

struct BwdBuffers {
    DevBuf dout, dq, dk, dv;        // [b, s, h, d]
    DevBuf dq_ref, dk_ref, dv_ref;  // the first method's gradients of the cell: the others are checked against them
    DevBuf bwd_ws;
};

struct BwdCell {
    Cell bwd, fwd_bwd;
    Diff grad_diff;       // worst of dQ, dK, dV against the reference method's (or its own finiteness)
    bool is_ref = false;  // this method's gradients are the cell's reference
};

// The worst relative L2 error of dQ, dK, dV against bb's reference copies (same layout).
Diff compare_grads(const Gpu &g, const BwdBuffers &bb, const Problem &p) {
    const int64_t n = p.b * p.sq * p.hq * p.d;
    const DevBuf *mine[3] = {&bb.dq, &bb.dk, &bb.dv};
    const DevBuf *theirs[3] = {&bb.dq_ref, &bb.dk_ref, &bb.dv_ref};
    Diff worst;
    for (int i = 0; i < 3; ++i) {
        // Flat comparison: as [1, 1, 1, n] both layouts are the same.
        const Diff d = compare_o(g, mine[i]->ptr, theirs[i]->ptr, 1, 1, 1, n, p.dtype);
        if (!worst.valid || d.bad > worst.bad || d.rel_l2 > worst.rel_l2) worst = d;
    }
    return worst;
}

// Backward of generation `be` on set 0 of bf with dO = bb.dout: the backward alone, then forward
// + backward, each as one timed launch; then one more run into poisoned gradients, checked
// against the cell's reference (the first method to get here becomes it).
BwdCell run_gen_backward(Gpu &g, flashattn_backend_t be, const Problem &p, Buffers &bf, BwdBuffers &bb, int device,
                         int reps, int warmup, bool *have_ref) {
    BwdCell out;
    flashattn_plan_t *plan = nullptr;
    size_t ws = 0, bws = 0;
    std::string why;
    flashattn_status_t st = make_plan(be, p, device, &plan, &ws, &why);
    flashattn_backend_t bwd_be = FLASHATTN_BACKEND_AUTO;
    const char *reason = nullptr;
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_backward_backend(plan, &bwd_be, &reason);
    if (st == FLASHATTN_SUCCESS) st = flashattn_plan_get_backward_workspace_size(plan, &bws);
    if (st == FLASHATTN_SUCCESS && bwd_be != be) {
        st = FLASHATTN_ERROR_NOT_SUPPORTED;
        why = format("the backward runs on %s (%s)", gen_name(bwd_be), reason ? reason : "");
    } else if (st != FLASHATTN_SUCCESS && plan != nullptr) {
        why = flashattn_last_error();
    }
    Cell fail;
    if (st != FLASHATTN_SUCCESS) {
        fail.kind = st == FLASHATTN_ERROR_NOT_SUPPORTED ? Cell::NA : Cell::ERR;
        fail.note = fail.kind == Cell::NA ? why : std::string("plan: ") + flashattn_status_string(st) + ": " + why;
    } else if (!bf.workspace.reserve(ws) || !bb.bwd_ws.reserve(bws)) {
        fail.kind = Cell::OOM;
        fail.note = format("workspaces of %.0f + %.0f MB", ws / 1e6, bws / 1e6);
    }
    if (fail.kind != Cell::SKIP) {
        flashattn_plan_destroy(plan);
        out.bwd = out.fwd_bwd = fail;
        return out;
    }
    const auto stream = reinterpret_cast<flashattn_stream_t>(g.stream);
    float *lse = bf.lse.as<float>();
    auto forward = [&]() -> std::string {
        const flashattn_status_t e = flashattn_plan_execute(plan, bf.q[0].ptr, bf.k[0].ptr, bf.v[0].ptr, bf.o.ptr, lse,
                                                            bf.workspace.ptr, ws, stream);
        return e == FLASHATTN_SUCCESS ? std::string() : std::string("execute: ") + lib_error(e);
    };
    auto backward = [&]() -> std::string {
        const flashattn_status_t e =
            flashattn_plan_execute_backward(plan, bf.q[0].ptr, bf.k[0].ptr, bf.v[0].ptr, bf.o.ptr, bb.dout.ptr, lse,
                                            bb.dq.ptr, bb.dk.ptr, bb.dv.ptr, bb.bwd_ws.ptr, bws, stream);
        return e == FLASHATTN_SUCCESS ? std::string() : std::string("execute_backward: ") + lib_error(e);
    };
    auto as_cell = [](const Timing &t) {
        Cell c;
        c.kind = t.ok ? Cell::OK : Cell::ERR;
        c.ms = t.ms;
        c.reduced = t.reduced;
        c.note = t.error;
        return c;
    };
    std::string e = forward();  // O and LSE for the backward-alone runs
    out.bwd = e.empty() ? as_cell(time_runs(g, warmup, reps, [&](int) { return backward(); }, gen_name(be)))
                        : as_cell(Timing{false, 0.0, false, e});
    if (out.bwd.kind == Cell::OK)
        out.fwd_bwd = as_cell(time_runs(g, warmup, reps, [&](int) {
            const std::string fe = forward();
            return fe.empty() ? backward() : fe;
        }, gen_name(be)));
    else
        out.fwd_bwd = out.bwd;
    if (out.fwd_bwd.kind == Cell::OK) {
        const size_t bytes = static_cast<size_t>(p.b * p.sq * p.hq * p.d) * elem_size(p.dtype);
        for (DevBuf *x : {&bb.dq, &bb.dk, &bb.dv}) CK(cudaMemsetAsync(x->ptr, 0xFF, bytes, g.stream));  // NaN
        e = forward();
        if (e.empty()) e = backward();
        if (!e.empty()) {
            out.bwd.kind = out.fwd_bwd.kind = Cell::ERR;
            out.bwd.note = out.fwd_bwd.note = e;
        } else if (!*have_ref) {
            // The reference: its own gradients must at least be finite.
            out.grad_diff = compare_o(g, bb.dq.ptr, bb.dq.ptr, 1, 1, 1, p.b * p.sq * p.hq * p.d, p.dtype);
            for (const DevBuf *x : {&bb.dk, &bb.dv}) {
                const Diff d = compare_o(g, x->ptr, x->ptr, 1, 1, 1, p.b * p.sq * p.hq * p.d, p.dtype);
                out.grad_diff.bad += d.bad;
            }
            CK(cudaMemcpyAsync(bb.dq_ref.ptr, bb.dq.ptr, bytes, cudaMemcpyDeviceToDevice, g.stream));
            CK(cudaMemcpyAsync(bb.dk_ref.ptr, bb.dk.ptr, bytes, cudaMemcpyDeviceToDevice, g.stream));
            CK(cudaMemcpyAsync(bb.dv_ref.ptr, bb.dv.ptr, bytes, cudaMemcpyDeviceToDevice, g.stream));
            out.is_ref = out.grad_diff.bad == 0;
            *have_ref = out.is_ref;
        } else {
            out.grad_diff = compare_grads(g, bb, p);
        }
        out.bwd.o_diff = out.fwd_bwd.o_diff = out.grad_diff;  // cell_bad() reads o_diff
    }
    flashattn_plan_destroy(plan);
    return out;
}

void run_backward_grid(Gpu &g, const Options &opt, const std::vector<flashattn_backend_t> &gens, Report &rep,
                       Notes &all_notes, const Clock &clock, double deadline_s) {
    const std::vector<flashattn_dtype_t> dtypes =
        opt.dtypes.empty() ? std::vector<flashattn_dtype_t>{FLASHATTN_DTYPE_BF16} : opt.dtypes;
    const std::vector<int64_t> hdims = opt.hdims.empty() ? std::vector<int64_t>{64, 128, 256} : opt.hdims;
    const std::vector<int64_t> seqlens =
        opt.seqlens.empty() ? std::vector<int64_t>{1024, 2048, 4096, 8192, 16384} : opt.seqlens;
    const std::vector<int> causals = opt.causal.empty() ? std::vector<int>{0, 1} : opt.causal;
    const int warmup = opt.warmup >= 0 ? opt.warmup : 3;
    const int reps = opt.reps > 0 ? opt.reps : 10;
    std::vector<std::pair<flashattn_backend_t, bool>> methods;  // (generation, deterministic)
    for (auto be : gens)
        for (int det = 0; det <= (opt.deterministic ? 1 : 0); ++det) methods.emplace_back(be, det != 0);
    auto method_name = [](const std::pair<flashattn_backend_t, bool> &m) {
        return std::string(gen_name(m.first)) + (m.second ? " det" : "");
    };

    Buffers bf;
    size_t max_elems = 0, max_lse = 0;
    alloc_prefill_buffers(hdims, seqlens, bf, &max_elems, &max_lse);
    BwdBuffers bb;
    for (DevBuf *x : {&bb.dout, &bb.dq, &bb.dk, &bb.dv, &bb.dq_ref, &bb.dk_ref, &bb.dv_ref}) x->alloc(max_elems * 2);

    uint64_t seed = 1000003;
    for (flashattn_dtype_t dt : dtypes) {
        Notes notes;
        rep.line("");
        rep.line(format("## Backward and forward + backward, %s: TFLOP/s (hidden 2048, heads = 2048/hdim, batch = "
                        "16384/seqlen; bwd FLOPs = %.1f x the forward's, fwd+bwd = %.1f x)",
                        dtype_name(dt), kBackwardFlopsFactor, kFwdBwdFlopsFactor));
        rep.line("");
        rep.line(format("bwd: flashattn_plan_execute_backward alone; fwd+bwd: flashattn_plan_execute then "
                        "flashattn_plan_execute_backward, timed as one run. det: FLASHATTN_I64_DETERMINISTIC = 1. Check: "
                        "a fresh run into NaN-poisoned dQ, dK, dV, compared with the first method's of the cell "
                        "(`ref`: finite everywhere), worst relative L2 error of the three; BAD above 2e-2."));
        rep.line("");
        std::string head = "| hdim | causal | seqlen | batch x heads |";
        std::string rule = "|---|---|---|---|";
        for (const char *pass : {"bwd", "fwd+bwd"})
            for (const auto &m : methods) {
                head += " " + method_name(m) + " " + pass + " |";
                rule += "---|";
            }
        if (opt.deterministic) {
            for (auto be : gens) head += format(" %s det/default bwd |", gen_name(be));
            for (size_t i = 0; i < gens.size(); ++i) rule += "---|";
        }
        rep.line(head + " check (dQ/dK/dV rel L2) |");
        rep.line(rule + "---|");
        for (int64_t d : hdims) {
            for (int causal : causals) {
                for (int64_t s : seqlens) {
                    const PrefillCell cell = prefill_cell(dt, d, causal, s);
                    const int64_t h = cell.h, b = cell.b;
                    const double flops = cell.flops;
                    const std::string &where = cell.where;
                    std::string row = cell.row;
                    const bool skip = clock.elapsed() > deadline_s;
                    const size_t n = static_cast<size_t>(b * s * h * d);
                    if (!skip)
                        for (DevBuf *x : {&bf.q[0], &bf.k[0], &bf.v[0], &bb.dout}) fill_normal(g, x->ptr, n, dt, seed++);
                    bool have_ref = false;
                    std::vector<BwdCell> cells;
                    std::string check = skip ? "skipped (time budget)" : "-";
                    double worst = 0.0;
                    for (const auto &m : methods) {
                        Problem p{b, s, s, h, h, d, dt, causal != 0};
                        p.deterministic = m.second;
                        BwdCell c = skip ? BwdCell{} : run_gen_backward(g, m.first, p, bf, bb, opt.device, reps, warmup,
                                                                      &have_ref);
                        const std::string name = method_name(m);
                        Record r1 = cell_record(c.bwd, "backward", gen_name(m.first), p, kBackwardFlopsFactor * flops, 0);
                        Record r2 = cell_record(c.fwd_bwd, "fwd-bwd", gen_name(m.first), p, kFwdBwdFlopsFactor * flops, 0);
                        r1.deterministic = r2.deterministic = m.second;
                        rep.record(r1);
                        rep.record(r2);
                        Cell noted = c.bwd;  // note_cell words a bad cell as a forward's; say it here
                        noted.o_diff.valid = false;
                        note_cell(notes, noted, name, where);
                        if (cell_bad(c.bwd)) {
                            notes.errors.push_back(format("%s at %s: WRONG GRADIENTS: worst dQ/dK/dV rel L2 %.3e "
                                                          "vs the cell's reference (%llu non-finite)",
                                                          name.c_str(), where.c_str(), c.grad_diff.rel_l2,
                                                          c.grad_diff.bad));
                            notes.failed = true;
                        }
                        if (c.is_ref) check = "ref " + name;
                        else if (c.bwd.kind == Cell::OK && c.grad_diff.valid) worst = std::max(worst, c.grad_diff.rel_l2);
                        if (cell_bad(c.bwd)) check = "BAD";
                        cells.push_back(c);
                    }
                    if (check.compare(0, 4, "ref ") == 0 && cells.size() > 1) check += format(", others %.1e", worst);
                    for (int pass = 0; pass < 2; ++pass)
                        for (const BwdCell &c : cells) {
                            const Cell &x = pass == 0 ? c.bwd : c.fwd_bwd;
                            const double f = (pass == 0 ? kBackwardFlopsFactor : kFwdBwdFlopsFactor) * flops;
                            row += " " + cell_text(x, x.kind == Cell::OK ? f / (x.ms * 1e-3) / 1e12 : 0.0, "%.1f") + " |";
                        }
                    if (opt.deterministic)
                        for (size_t i = 0; i + 1 < cells.size(); i += 2) {
                            const Cell &def = cells[i].bwd, &det = cells[i + 1].bwd;
                            row += def.kind == Cell::OK && det.kind == Cell::OK ? format(" %.2f |", def.ms / det.ms)
                                                                                 : std::string(" - |");
                        }
                    row += " " + check + " |";
                    rep.line(row);
                }
            }
        }
        rep.line("");
        print_notes(rep, notes);
        all_notes.failed = all_notes.failed || notes.failed;
    }
}

// ---------------------------------------------------------------------------------------------
// The decode table.

// The copy limit of the decode table: a device-to-device cudaMemcpyAsync of 1 GiB (less when memory
// is short), timed as the attention methods are; GB/s counts the bytes read plus those written, the
// DRAM traffic a bandwidth-bound kernel can hope for. 0 when there is no room for the buffers.
double copy_gbps(Gpu &g, const Options &opt, Report &rep) {
    const size_t bytes = std::min<size_t>(size_t(1) << 30, usable_free_bytes() / 2);
    if (bytes < (size_t(64) << 20)) return 0.0;
    DevBuf src, dst;
    src.alloc(bytes);
    dst.alloc(bytes);
    CK(cudaMemsetAsync(src.ptr, 0, bytes, g.stream));
    const int warmup = opt.warmup >= 0 ? opt.warmup : 3;
    const int reps = opt.reps > 0 ? opt.reps : 10;
    Timing t = time_runs(g, warmup, reps, [&](int) {
        const cudaError_t e = cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, g.stream);
        return e == cudaSuccess ? std::string() : std::string("cudaMemcpyAsync: ") + cudaGetErrorString(e);
    }, "the device-to-device copy");
    Record r;
    r.kind = "copy";
    r.backend = "memcpy";
    r.bytes = 2.0 * static_cast<double>(bytes);
    r.status = t.ok ? "ok" : "error";
    r.note = t.error;
    if (!t.ok) {
        rep.record(r);
        return 0.0;
    }
    r.ms = t.ms;
    r.gbps = r.bytes / (t.ms * 1e-3) / 1e9;
    rep.record(r);
    return r.gbps;
}


void run_decode(Gpu &g, const Options &opt, const std::vector<flashattn_backend_t> &gens, Report &rep,
                Notes &all_notes, const Clock &clock, double deadline_s) {
    const int warmup = opt.warmup >= 0 ? opt.warmup : 3;
    const int reps = opt.reps > 0 ? opt.reps : 10;
    const bool want_std = !opt.no_standard;
    const int64_t d = opt.decode_head_dim;
    const flashattn_dtype_t dt = FLASHATTN_DTYPE_BF16;
    const size_t l2 = static_cast<size_t>(std::max(g.prop.l2CacheSize, 1));
    Notes notes;

    rep.line("");
    const int64_t page = opt.page_size;
    const char *pages_in_order = std::getenv("FLASHATTN_BENCH_PAGES_IN_ORDER");
    const bool in_order_table = pages_in_order != nullptr && std::string(pages_in_order) == "1";
    rep.line(page > 0 ? format("## Decode (seqlen_q = 1), bf16, head dim %lld, paged K/V (%lld keys per page, %s "
                               "page table): time µs and GB/s = bytes of K and V / time",
                               static_cast<long long>(d), static_cast<long long>(page),
                               in_order_table ? "in-order" : "shuffled")
                      : format("## Decode (seqlen_q = 1), bf16, head dim %lld: time µs and GB/s = bytes of K and V / time",
                               static_cast<long long>(d)));
    if (opt.num_splits > 0) rep.line(format("Split-KV forced: FLASHATTN_I64_NUM_SPLITS = %lld.", static_cast<long long>(opt.num_splits)));
    if (opt.seqused_k && !opt.append_rotary)
        rep.line("Each step passes seqused_k = seqlen_k (every key used), as a serving step that tracks per-sequence "
                 "cache lengths does: the like-for-like baseline of an --append-rotary step.");
    if (opt.append_rotary)
        rep.line("Each step appends one K/V row per sequence (seqused_k = seqlen_k - 1) with a rotary embedding over "
                 "the whole head dim, then attends over seqlen_k keys (no reference check).");
    rep.line("");
    rep.line(format("Inputs rotate among enough K/V sets to exceed 3x the %.0f MB L2 (`sets` column); "
                    "shapes whose K+V exceed %.0f GB are skipped. The standard baseline reads one set (copies in "
                    "[b, h, s, d]) and is the correctness reference.",
                    l2 / 1e6, opt.max_decode_gb));
    const double copy = copy_gbps(g, opt, rep);
    if (copy > 0)
        rep.line(format("Copy limit: a device-to-device cudaMemcpy (up to 1 GiB) moves %.0f GB/s (bytes read + written).",
                        copy));
    rep.line("");
    std::string head = "| batch | heads q / kv | seqlen_k | K+V MB | sets |";
    std::string rule = "|---|---|---|---|---|";
    for (auto be : gens) {
        head += format(" %s GB/s (µs) |", gen_name(be));
        rule += "---|";
    }
    if (want_std) {
        head += " standard GB/s (µs) |";
        rule += "---|";
    }
    head += " check (O rel L2 / LSE abs) |";
    rule += "---|";
    rep.line(head);
    rep.line(rule);

    uint64_t seed = 1000003;
    std::vector<std::string> split_counts;  // the plans' FLASHATTN_I64_NUM_SPLITS, listed after the table
    auto pick = [](const std::vector<int64_t> &chosen, std::vector<int64_t> dflt) { return chosen.empty() ? dflt : chosen; };
    for (int64_t hkv : pick(opt.decode_kv_heads, {8, 32})) {
        for (int64_t b : pick(opt.decode_batches, {1, 8, 32})) {
            for (int64_t sk : pick(opt.decode_seqlens, {8192, 32768, 131072})) {
                const int64_t hq = 32;
                if (hq % hkv != 0 || (page > 0 && sk % page != 0)) continue;
                Problem p{b, 1, sk, hq, hkv, d, dt, false, page, opt.num_splits, opt.append_rotary};
                p.seqused = opt.seqused_k;
                for (auto be : gens) {
                    flashattn_plan_t *probe = nullptr;
                    size_t probe_ws = 0;
                    std::string probe_why;
                    int64_t splits = 0;
                    if (make_plan(be, p, opt.device, &probe, &probe_ws, &probe_why) == FLASHATTN_SUCCESS &&
                        flashattn_plan_get_i64(probe, FLASHATTN_I64_NUM_SPLITS, &splits) == FLASHATTN_SUCCESS)
                        split_counts.push_back(format("%s b %lld / %lld keys: %lld", gen_name(be), static_cast<long long>(b),
                                                      static_cast<long long>(sk), static_cast<long long>(splits)));
                    flashattn_plan_destroy(probe);
                }
                const size_t kv_elems = static_cast<size_t>(b * sk * hkv * d);
                const size_t kv_bytes = 2 * kv_elems * 2;
                const std::string where = format("decode b %lld h %lld/%lld sk %lld", static_cast<long long>(b),
                                                 static_cast<long long>(hq), static_cast<long long>(hkv),
                                                 static_cast<long long>(sk));
                std::string row = format("| %lld | %lld / %lld | %lld | %.0f |", static_cast<long long>(b),
                                         static_cast<long long>(hq), static_cast<long long>(hkv),
                                         static_cast<long long>(sk), kv_bytes / 1e6);
                const size_t sets = std::min<size_t>(8, std::max<size_t>(1, (3 * l2 + kv_bytes - 1) / kv_bytes));
                const bool too_big = kv_bytes > opt.max_decode_gb * 1e9;
                const bool late = clock.elapsed() > deadline_s;
                if (too_big || late) {
                    row += " - |";
                    for (size_t i = 0; i < gens.size() + (want_std ? 1 : 0); ++i) row += " skip |";
                    row += too_big ? format(" skipped (K+V over %.0f GB) |", opt.max_decode_gb)
                                   : std::string(" skipped (time budget) |");
                    rep.line(row);
                    continue;
                }
                Buffers bf;
                const size_t q_elems = static_cast<size_t>(b * hq * d);
                const size_t need = sets * kv_bytes + (want_std ? kv_bytes : 0) + 4 * q_elems * 2;
                if (need > usable_free_bytes()) {
                    row += format(" %zu |", sets);
                    for (size_t i = 0; i < gens.size() + (want_std ? 1 : 0); ++i) row += " OOM |";
                    row += " - |";
                    rep.line(row);
                    continue;
                }
                row += format(" %zu |", sets);
                bf.q.resize(sets);
                bf.k.resize(sets);
                bf.v.resize(sets);
                for (size_t s = 0; s < sets; ++s) {
                    bf.q[s].alloc(q_elems * 2);
                    bf.k[s].alloc(kv_elems * 2);
                    bf.v[s].alloc(kv_elems * 2);
                    fill_normal(g, bf.q[s].ptr, q_elems, dt, seed++);
                    fill_normal(g, bf.k[s].ptr, kv_elems, dt, seed++);
                    fill_normal(g, bf.v[s].ptr, kv_elems, dt, seed++);
                }
                bf.o.alloc(q_elems * 2);
                bf.lse.alloc(static_cast<size_t>(b * hq) * 4);
                if (page > 0) {  // every set's K and V read as [b * sk / page, page, hkv, d] through one table
                    std::vector<int32_t> table(static_cast<size_t>(b * sk / page));
                    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
                    std::mt19937_64 rng(seed++);
                    // FLASHATTN_BENCH_PAGES_IN_ORDER=1: an identity table (the gather's cost without
                    // the scattered pages' DRAM and TLB locality).
                    if (!in_order_table) std::shuffle(table.begin(), table.end(), rng);
                    bf.table.alloc(table.size() * 4);
                    CK(cudaMemcpy(bf.table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
                }
                if (p.append || p.seqused) {  // an append fills row sk - 1; --seqused-k alone uses every key
                    std::vector<int32_t> used(static_cast<size_t>(b), static_cast<int32_t>(p.append ? sk - 1 : sk));
                    bf.seqused.alloc(used.size() * 4);
                    CK(cudaMemcpy(bf.seqused.ptr, used.data(), used.size() * 4, cudaMemcpyHostToDevice));
                }
                if (p.append) {  // appending row sk - 1 (every set's last key is overwritten: no reference)
                    const size_t new_elems = static_cast<size_t>(b * hkv * d);
                    bf.k_new.alloc(new_elems * 2);
                    bf.v_new.alloc(new_elems * 2);
                    fill_normal(g, bf.k_new.ptr, new_elems, dt, seed++);
                    fill_normal(g, bf.v_new.ptr, new_elems, dt, seed++);
                    std::vector<float> cs(static_cast<size_t>(sk * d / 2)), sn(cs.size());
                    for (int64_t t = 0; t < sk; ++t)
                        for (int64_t i = 0; i < d / 2; ++i) {
                            const double ang = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / d);
                            cs[t * (d / 2) + i] = static_cast<float>(std::cos(ang));
                            sn[t * (d / 2) + i] = static_cast<float>(std::sin(ang));
                        }
                    bf.cos.alloc(cs.size() * 4);
                    bf.sin.alloc(sn.size() * 4);
                    CK(cudaMemcpy(bf.cos.ptr, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(bf.sin.ptr, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
                }
                Cell stdc;
                if (want_std && !p.append) {
                    bf.qt.alloc(q_elems * 2);
                    bf.kt.alloc(kv_elems * 2);
                    bf.vt.alloc(kv_elems * 2);
                    bf.ot.alloc(q_elems * 2);
                    bf.lse_ref.alloc(static_cast<size_t>(b * hq) * 4);
                    // Q and O with seqlen 1: [b, 1, h, d] is already [b, h, 1, d].
                    CK(cudaMemcpyAsync(bf.qt.ptr, bf.q[0].ptr, q_elems * 2, cudaMemcpyDeviceToDevice, g.stream));
                    if (page > 0) {
                        paged_to_bhsd(g, bf.k[0].ptr, bf.kt.ptr, bf.table.as<int32_t>(), b, sk, hkv, d, 2, page);
                        paged_to_bhsd(g, bf.v[0].ptr, bf.vt.ptr, bf.table.as<int32_t>(), b, sk, hkv, d, 2, page);
                    } else {
                        to_bhsd(g, bf.k[0].ptr, bf.kt.ptr, b, sk, hkv, d, 2);
                        to_bhsd(g, bf.v[0].ptr, bf.vt.ptr, b, sk, hkv, d, 2);
                    }
                    CK(cudaStreamSynchronize(g.stream));
                    stdc = run_standard(g, opt, p, bf, reps, warmup);
                    note_cell(notes, stdc, "standard", where);
                }
                const bool have_ref = want_std && stdc.kind == Cell::OK;
                std::vector<Cell> cells;
                if (want_std) rep.record(cell_record(stdc, "decode", "standard", p, 0, static_cast<double>(kv_bytes)));
                for (auto be : gens) {
                    Cell c = run_gen(g, opt, be, p, bf, reps, warmup, have_ref);
                    rep.record(cell_record(c, "decode", gen_name(be), p, 0, static_cast<double>(kv_bytes)));
                    note_cell(notes, c, gen_name(be), where);
                    row += " " + (c.kind == Cell::OK ? format("%.0f (%.1f)", kv_bytes / (c.ms * 1e-3) / 1e9, c.ms * 1e3) +
                                                           (c.reduced ? "*" : "") + (cell_bad(c) ? " BAD" : "")
                                                     : cell_text(c, 0, "%.0f")) +
                           " |";
                    cells.push_back(c);
                }
                if (want_std)
                    row += " " + (stdc.kind == Cell::OK ? format("%.0f (%.1f)", kv_bytes / (stdc.ms * 1e-3) / 1e9, stdc.ms * 1e3)
                                                        : cell_text(stdc, 0, "%.0f")) +
                           " |";
                row += " " + check_text(cells, have_ref) + " |";
                rep.line(row);
            }
        }
    }
    rep.line("");
    if (!split_counts.empty()) {
        std::string line = "Split-KV counts of the plans (FLASHATTN_I64_NUM_SPLITS after finalize):";
        for (size_t i = 0; i < split_counts.size(); ++i) line += (i ? "; " : " ") + split_counts[i];
        rep.line(line + ".");
        rep.line("");
    }
    print_notes(rep, notes);
    all_notes.failed = all_notes.failed || notes.failed;
}

// Host time of one flashattn_plan_execute (argument checks, pointer checks, launch) on a decode
// shape, where it is a large part of the step: the median and mean over `calls` back-to-back calls
// while a spin kernel holds the GPU (the queue never drains, so no call waits for the device).
// An empty kernel launch on the same stream is the floor any library call pays.
void run_host_cost(Gpu &g, const Options &opt, const std::vector<flashattn_backend_t> &gens, Report &rep) {
    const Problem p{1, 1, 4096, 32, 8, 128, FLASHATTN_DTYPE_BF16, false};
    const int calls = 200;
    rep.line("");
    rep.line("## Host enqueue time per execute (µs): b 1, seqlen_q 1, seqlen_k 4096, heads 32 / 8, d 128, bf16");
    rep.line("");
    rep.line(format("Median and mean of %d back-to-back calls while a spin kernel holds the GPU (lse written). "
                    "The bar of issue 21: at most 20 µs.", calls));
    rep.line("");
    rep.line("| method | median µs | mean µs |");
    rep.line("|---|---|---|");
    auto time_calls = [&](const std::function<void()> &call) {
        std::vector<double> us;
        CK(cudaStreamSynchronize(g.stream));
        spin_kernel<<<1, 1, 0, g.stream>>>(g.spin_cycles * 5);
        CK_LAUNCH("spin_kernel");
        const double t0 = now_s();
        for (int i = 0; i < calls; ++i) {
            const double a = now_s();
            call();
            us.push_back((now_s() - a) * 1e6);
        }
        const double mean = (now_s() - t0) * 1e6 / calls;
        CK(cudaStreamSynchronize(g.stream));
        return std::make_pair(median(us), mean);
    };
    const auto floor = time_calls([&] {
        spin_kernel<<<1, 1, 0, g.stream>>>(0);
        CK_LAUNCH("spin_kernel");
    });
    rep.line(format("| empty kernel launch | %.1f | %.1f |", floor.first, floor.second));
    const size_t q_elems = static_cast<size_t>(p.b * p.hq * p.d);
    const size_t kv_elems = static_cast<size_t>(p.b * p.sk * p.hkv * p.d);
    DevBuf q, k, v, o, lse;
    q.alloc(q_elems * 2);
    k.alloc(kv_elems * 2);
    v.alloc(kv_elems * 2);
    o.alloc(q_elems * 2);
    lse.alloc(static_cast<size_t>(p.b * p.hq) * 4);
    fill_normal(g, q.ptr, q_elems, p.dtype, 7);
    fill_normal(g, k.ptr, kv_elems, p.dtype, 8);
    fill_normal(g, v.ptr, kv_elems, p.dtype, 9);
    // What the library's pointer checks cost: one cudaPointerGetAttributes per tensor (q, k, v, o, lse).
    const auto attrs = time_calls([&] {
        cudaPointerAttributes a;
        for (void *ptr : {q.ptr, k.ptr, v.ptr, o.ptr, lse.ptr}) CK(cudaPointerGetAttributes(&a, ptr));
    });
    rep.line(format("| 5 x cudaPointerGetAttributes | %.1f | %.1f |", attrs.first, attrs.second));
    for (auto be : gens) {
        flashattn_plan_t *plan = nullptr;
        size_t ws_bytes = 0;
        std::string why;
        if (make_plan(be, p, g.device, &plan, &ws_bytes, &why) != FLASHATTN_SUCCESS) {
            rep.line(format("| %s | n/a (%s) | |", gen_name(be), why.c_str()));
            continue;
        }
        DevBuf ws;
        if (ws_bytes > 0) ws.alloc(ws_bytes);
        flashattn_status_t st = FLASHATTN_SUCCESS;
        auto call = [&] {
            const flashattn_status_t s = flashattn_plan_execute(plan, q.ptr, k.ptr, v.ptr, o.ptr, lse.as<float>(),
                                                                ws_bytes ? ws.ptr : nullptr, ws_bytes, g.stream);
            if (s != FLASHATTN_SUCCESS) st = s;
        };
        for (int i = 0; i < 20; ++i) call();  // warm-up: first-call costs (module load, opt-ins) out
        const auto t = time_calls(call);
        if (st != FLASHATTN_SUCCESS)
            rep.line(format("| %s | error (%s) | |", gen_name(be), flashattn_last_error()));
        else
            rep.line(format("| %s | %.1f | %.1f |", gen_name(be), t.first, t.second));
        flashattn_plan_destroy(plan);
    }
    (void)opt;
}

}  // namespace

int run_gpu(const Options &opt) {
    Report rep;
    g_report = &rep;
    g_options = &opt;
    Clock clock;

    int count = 0;
    const cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        // The library words the reason for the user ("no NVIDIA driver found", "no CUDA device
        // found"); the runtime's own text for a missing driver speaks of an insufficient version.
        int32_t major = 0, minor = 0;
        const bool lib_sees = flashattn_device_compute_capability(opt.device, &major, &minor) == FLASHATTN_SUCCESS;
        std::fprintf(stderr, "flashattn-bench: %s\n",
                     lib_sees ? "the library sees a CUDA device, the benchmark's CUDA runtime does not"
                              : flashattn_last_error());
        return 2;
    }
    if (opt.device >= count) {
        std::fprintf(stderr, "flashattn-bench: --device %d but the machine has %d CUDA device(s)\n", opt.device, count);
        return 2;
    }
    if (flashattn_version() / 10000 != FLASHATTN_VERSION_MAJOR) {
        std::fprintf(stderr, "flashattn-bench: built against libflashattn %s but loaded %s (majors differ)\n",
                     FLASHATTN_VERSION_STRING, flashattn_version_string());
        return 2;
    }

    Gpu g;
    g.device = opt.device;
    CK(cudaSetDevice(g.device));
    CK(cudaGetDeviceProperties(&g.prop, g.device));
    CK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    CKB(cublasCreate(&g.blas));
    CKB(cublasSetStream(g.blas, g.stream));
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, g.device));
    g.spin_cycles = static_cast<long long>(std::max(clock_khz, 1000000)) * 2;  // ~2 ms
    CK(cudaMalloc(&g.stats, sizeof(CmpStats)));

    std::vector<flashattn_backend_t> gens;
    if (opt.backend == "fa1") gens = {FLASHATTN_BACKEND_FA1};
    else if (opt.backend == "fa2") gens = {FLASHATTN_BACKEND_FA2};
    else if (opt.backend == "fa3") gens = {FLASHATTN_BACKEND_FA3};
    else gens = {FLASHATTN_BACKEND_FA1, FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA3};

    int rt = 0, drv = 0, blas_ver = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    CKB(cublasGetVersion(g.blas, &blas_ver));
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    rep.line(format("# flashattn-bench --backend %s", opt.backend.c_str()));
    rep.line("");
    rep.line(format("Device %d: %s, sm_%d%d, %d SMs, %.1f GB (%.1f GB free), L2 %.0f MB; CUDA runtime %d, driver %d, "
                    "cuBLAS %d.",
                    g.device, g.prop.name, g.prop.major, g.prop.minor, g.prop.multiProcessorCount, total_b / 1e9,
                    free_b / 1e9, g.prop.l2CacheSize / 1e6, rt, drv, blas_ver));
    rep.line(format("libflashattn %s (%s).", flashattn_version_string(), flashattn_build_info()));
    rep.meta("library_version", flashattn_version_string());
    rep.meta("build_info", flashattn_build_info());
    rep.meta("device", format("%s, sm_%d%d, %d SMs, %.1f GB, L2 %.0f MB; CUDA runtime %d, driver %d", g.prop.name,
                              g.prop.major, g.prop.minor, g.prop.multiProcessorCount, total_b / 1e9,
                              g.prop.l2CacheSize / 1e6, rt, drv));
    rep.meta("timing", format("median of %d runs after %d warm-ups, CUDA events per run", opt.reps > 0 ? opt.reps : 10,
                              opt.warmup >= 0 ? opt.warmup : 3));
    rep.line(format("Timing: median of %d runs after %d warm-ups, CUDA events per run, fresh standard-normal inputs "
                    "per cell; FLOPs = 4*b*h*sq*sk*d, halved when causal. LSE %s. standard = cuBLAS "
                    "GemmStridedBatchedEx S = Q K^T (fp32 scores, fp32 compute) + softmax kernel (fp32 math, "
                    "bottom-right causal mask, P in the input dtype) + cuBLAS O = P V, on [b, h, s, d] copies (copy "
                    "time not counted); its peak extra memory is S + P.",
                    opt.reps > 0 ? opt.reps : 10, opt.warmup >= 0 ? opt.warmup : 3,
                    opt.no_lse ? "not requested (lse = NULL)" : "written by every method and checked"));

    Notes notes;
    const bool grid = !opt.decode;
    const bool decode = opt.decode || !opt.no_decode;
    const double grid_deadline = decode && grid ? 0.8 * opt.budget_s : opt.budget_s;
    // With --backward the forward grid gets half of the grid's time, the backward table the rest.
    const double fwd_deadline = opt.backward ? 0.5 * grid_deadline : grid_deadline;
    if (grid && !opt.host_cost && !opt.backward_only) run_grid(g, opt, gens, rep, notes, clock, fwd_deadline);
    if (opt.backward && grid && !opt.host_cost) run_backward_grid(g, opt, gens, rep, notes, clock, grid_deadline);
    if (decode && !opt.host_cost && !opt.backward_only) run_decode(g, opt, gens, rep, notes, clock, opt.budget_s);
    run_host_cost(g, opt, gens, rep);

    rep.line("");
    rep.line(format("Total wall time %.1f s.%s", clock.elapsed(),
                    notes.failed ? " SOME CELLS FAILED (ERROR / BAD above)." : ""));
    for (cudaEvent_t e : g.events) CK(cudaEventDestroy(e));
    CK(cudaFree(g.stats));
    CKB(cublasDestroy(g.blas));
    CK(cudaStreamDestroy(g.stream));
    if (!opt.markdown.empty() && !rep.write(opt.markdown)) {
        std::fprintf(stderr, "flashattn-bench: cannot write %s\n", opt.markdown.c_str());
        return 1;
    }
    if (!opt.json.empty() && !rep.write_json(opt.json, "flashattn-bench")) {
        std::fprintf(stderr, "flashattn-bench: cannot write %s\n", opt.json.c_str());
        return 1;
    }
    return notes.failed ? 1 : 0;
}

}  // namespace bench
