// Small GPU tests of the FA3 (sm_90a) building blocks, each found in isolation before attention
// uses them: a TMA SWIZZLE_128B load of a 64x128 bf16 tile (smem read back through the swizzle),
// a wgmma m64n64k16 SS GEMM over K=128 with the SW128 K-major descriptors and the accumulator
// layout of kernel-guide §3.5, and a 2-stage full/empty mbarrier ring over many tiles (every wait
// has a clock64 timeout that sets an error flag instead of hanging).
// Exit 0 pass, 1 fail, 77 skipped (no CUDA device, or the device is not sm_90).
// Usage: test_hopper_primitives [--tiles N]   (N tiles for the ring check, default 10000)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/device/ptx_sm90.cuh"
#include "backends/cuda/host/tensor_map.h"

namespace {

using namespace flashattn;

constexpr int kRows = 64;           // rows of an A or B tile
constexpr int kK = 128;             // reduction length
constexpr int kPageBytes = 64 * 128;  // 64 rows x 128 B (one 64-column box)
constexpr int kTileBytes = 2 * kPageBytes;  // 16384: a 64x128 bf16 tile
constexpr uint32_t kTxBytes = 2 * kTileBytes;  // A and B tiles per stage
constexpr long long kTimeout = 20000000000LL;  // clock64 cycles (~10 s at 1.98 GHz; sanitizers are slow)
constexpr int kStages = 2;
constexpr int kDistinct = 16;  // distinct A and B tiles in the ring check

enum Err : int { kErrNone = 0, kErrFullTimeout = 1, kErrEmptyTimeout = 2 };

__device__ __forceinline__ uint8_t *align1024(uint8_t *p) {
    return reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t{1023});
}

// Issue the loads of one 64x128 tile at row `row0` as two 64-column boxes, back to back.
__device__ __forceinline__ void load_tile(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int row0) {
    cuda::tma_load_2d(dst, map, bar, 0, row0);
    cuda::tma_load_2d(dst + kPageBytes, map, bar, 64, row0);
}

// acc = A_tile * B_tile^T over K = 128: 8 k16 steps, 4 per 64-column page at +32 B each.
__device__ __forceinline__ void gemm_tile(float (&acc)[32], const uint8_t *a, const uint8_t *b) {
    const uint32_t a0 = cuda::smem_addr(a), b0 = cuda::smem_addr(b);
    cuda::fence_operands(acc);
    cuda::wgmma_fence();
#pragma unroll
    for (int k = 0; k < kK / 16; ++k) {
        const uint32_t off = (k / 4) * kPageBytes + (k % 4) * 32;
        cuda::wgmma_ss<cuda::Bf16, 64>(acc, cuda::make_desc_sw128(a0 + off), cuda::make_desc_sw128(b0 + off),
                                      k > 0 ? 1 : 0);
    }
    cuda::wgmma_commit();
    cuda::wgmma_wait<0>();
    cuda::fence_operands(acc);
}

// Accumulator register i -> (row, col) of the 64x64 tile (kernel-guide §3.5).
__device__ __forceinline__ void store_acc(float *c, const float (&acc)[32]) {
    const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        const int row = 16 * w + g + 8 * ((i % 4) / 2);
        const int col = 8 * (i / 4) + 2 * q + (i % 2);
        c[row * 64 + col] = acc[i];
    }
}

// One tile: TMA A and B, dump A's raw smem bytes, wgmma, store C.
__global__ void __launch_bounds__(128) single_tile_kernel(const __grid_constant__ CUtensorMap map_a,
                                                          const __grid_constant__ CUtensorMap map_b, uint8_t *a_raw,
                                                          float *c, int *error) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full;
    uint8_t *sa = align1024(smem_raw);
    uint8_t *sb = sa + kTileBytes;
    if (threadIdx.x == 0) {
        cuda::prefetch_tensormap(&map_a);
        cuda::prefetch_tensormap(&map_b);
        cuda::mbar_init(&full, 1);
        cuda::fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        cuda::mbar_arrive_expect_tx(&full, kTxBytes);
        load_tile(sa, &map_a, &full, 0);
        load_tile(sb, &map_b, &full, 0);
    }
    if (!cuda::mbar_wait_timeout(&full, 0, kTimeout)) {
        atomicExch(error, kErrFullTimeout);
        return;
    }
    for (int i = threadIdx.x; i < kTileBytes / 16; i += blockDim.x)
        reinterpret_cast<uint4 *>(a_raw)[i] = reinterpret_cast<const uint4 *>(sa)[i];
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    gemm_tile(acc, sa, sb);
    store_acc(c, acc);
}

// Ring check: warps 0-3 consume (wgmma), warp 4 lane 0 produces (TMA). Tile t uses A tile
// t % 16 and B tile (t / 16) % 16 and writes C tile t.
__global__ void __launch_bounds__(160) ring_kernel(const __grid_constant__ CUtensorMap map_a,
                                                   const __grid_constant__ CUtensorMap map_b, float *c, int ntiles,
                                                   int *error) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ uint64_t full[kStages], empty[kStages];
    uint8_t *base = align1024(smem_raw);
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            cuda::mbar_init(&full[s], 1);
            cuda::mbar_init(&empty[s], 128);  // every consumer thread arrives
        }
        cuda::fence_mbar_init();
    }
    __syncthreads();
    const int my_tiles = ntiles > static_cast<int>(blockIdx.x)
                             ? (ntiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                                   static_cast<int>(gridDim.x)
                             : 0;
    if (threadIdx.x >= 128) {  // producer warp
        if (threadIdx.x != 128) return;
        cuda::prefetch_tensormap(&map_a);
        cuda::prefetch_tensormap(&map_b);
        for (int it = 0; it < my_tiles; ++it) {
            const int s = it % kStages;
            const uint32_t ph = (it / kStages) & 1;
            if (!cuda::mbar_wait_timeout(&empty[s], ph ^ 1, kTimeout)) {  // first pass falls through
                atomicExch(error, kErrEmptyTimeout);
                return;
            }
            const int t = static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x);
            uint8_t *sa = base + s * 2 * kTileBytes;
            cuda::mbar_arrive_expect_tx(&full[s], kTxBytes);
            load_tile(sa, &map_a, &full[s], (t % kDistinct) * kRows);
            load_tile(sa + kTileBytes, &map_b, &full[s], ((t / kDistinct) % kDistinct) * kRows);
        }
        return;
    }
    for (int it = 0; it < my_tiles; ++it) {
        const int s = it % kStages;
        const uint32_t ph = (it / kStages) & 1;
        if (!cuda::mbar_wait_timeout(&full[s], ph, kTimeout)) {
            atomicExch(error, kErrFullTimeout);
            return;
        }
        const uint8_t *sa = base + s * 2 * kTileBytes;
        float acc[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] = 0.f;
        gemm_tile(acc, sa, sa + kTileBytes);  // returns after wgmma.wait_group 0: the stage is read
        cuda::mbar_arrive(&empty[s]);
        const int t = static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x);
        store_acc(c + static_cast<size_t>(t) * 64 * 64, acc);
    }
}

uint16_t to_bf16(float f) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

#define CHECK_CUDA(expr)                                                                              \
    do {                                                                                              \
        const cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess) {                                                                      \
            std::printf("FAIL cuda: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
            return 1;                                                                                 \
        }                                                                                             \
    } while (0)

// Map of a [rows x 128] bf16 row-major matrix, box 64 columns x 64 rows.
int make_map(CUtensorMap *map, const void *dev, int rows) {
    const uint64_t dims[2] = {static_cast<uint64_t>(kK), static_cast<uint64_t>(rows)};
    const uint64_t strides[1] = {kK * 2};
    const uint32_t box[2] = {64, static_cast<uint32_t>(kRows)};
    const flashattn_status_t st = encode_tensor_map_sw128(map, TmaElement::bf16, dev, 2, dims, strides, box);
    if (st != FLASHATTN_SUCCESS) {
        std::printf("FAIL tensor map: %s\n", flashattn_last_error());
        return 1;
    }
    return 0;
}

// Reference C[i][j] = sum_k A[i][k] * B[j][k] in double, then compare.
int compare_tile(const uint16_t *a, const uint16_t *b, const float *c, double *max_rel) {
    int bad = 0;
    for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kRows; ++j) {
            double r = 0;
            for (int k = 0; k < kK; ++k) r += double(from_bf16(a[i * kK + k])) * double(from_bf16(b[j * kK + k]));
            const double d = c[i * 64 + j];
            const double err = std::fabs(d - r) / std::fmax(std::fabs(r), 1.0);
            if (!(err <= 1e-3)) ++bad;
            if (!(err <= *max_rel)) *max_rel = std::isnan(err) ? INFINITY : std::fmax(err, *max_rel);
        }
    return bad;
}

}  // namespace

int main(int argc, char **argv) {
    int ntiles = 10000;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
            ntiles = std::atoi(argv[++i]);
        } else {
            std::printf("usage: %s [--tiles N]\n", argv[0]);
            return 1;
        }
    }
    if (ntiles < 1) ntiles = 1;

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
        std::printf("SKIP: device 0 is sm_%d%d, not sm_90\n", prop.major, prop.minor);
        return 77;
    }

    // kDistinct A tiles and kDistinct B tiles, stacked: [16*64 x 128] each; tile 0 is the single test.
    const int rows = kDistinct * kRows;
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<uint16_t> ha(static_cast<size_t>(rows) * kK), hb(ha.size());
    for (auto &x : ha) x = to_bf16(dist(rng));
    for (auto &x : hb) x = to_bf16(dist(rng));

    uint16_t *da = nullptr, *db = nullptr;
    uint8_t *draw = nullptr;
    float *dc = nullptr, *dring = nullptr;
    int *derr = nullptr;
    CHECK_CUDA(cudaMalloc(&da, ha.size() * 2));
    CHECK_CUDA(cudaMalloc(&db, hb.size() * 2));
    CHECK_CUDA(cudaMalloc(&draw, kTileBytes));
    CHECK_CUDA(cudaMalloc(&dc, 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&dring, static_cast<size_t>(ntiles) * 64 * 64 * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&derr, sizeof(int)));
    CHECK_CUDA(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(derr, 0, sizeof(int)));
    CHECK_CUDA(cudaMemset(dc, 0xFF, 64 * 64 * sizeof(float)));  // NaN poison
    CHECK_CUDA(cudaMemset(dring, 0xFF, static_cast<size_t>(ntiles) * 64 * 64 * sizeof(float)));

    CUtensorMap map_a, map_b;
    if (make_map(&map_a, da, rows) || make_map(&map_b, db, rows)) return 1;
    std::printf("PASS tensor map encode (2D bf16 SWIZZLE_128B, box 64x64)\n");

    int failures = 0;

    // (a)-(c): one tile.
    const int single_smem = 2 * kTileBytes + 1024;
    CHECK_CUDA(cudaFuncSetAttribute(single_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, single_smem));
    single_tile_kernel<<<1, 128, single_smem>>>(map_a, map_b, draw, dc, derr);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    int herr = 0;
    CHECK_CUDA(cudaMemcpy(&herr, derr, sizeof(int), cudaMemcpyDeviceToHost));
    if (herr != 0) {
        std::printf("FAIL single tile: mbarrier wait timed out (error %d)\n", herr);
        return 1;
    }
    std::vector<uint8_t> raw(kTileBytes);
    CHECK_CUDA(cudaMemcpy(raw.data(), draw, kTileBytes, cudaMemcpyDeviceToHost));
    int tma_bad = 0;
    for (int r = 0; r < kRows; ++r)
        for (int k = 0; k < kK; ++k) {
            const int page = k / 64, col = k % 64, chunk = col / 8;
            const size_t off = static_cast<size_t>(page) * kPageBytes + r * 128 + ((chunk ^ (r % 8)) * 16) + (col % 8) * 2;
            uint16_t v;
            std::memcpy(&v, raw.data() + off, 2);
            if (v != ha[r * kK + k]) ++tma_bad;
        }
    std::printf("%s TMA SWIZZLE_128B load: %d of %d smem elements differ from A through the 128B swizzle\n",
                tma_bad ? "FAIL" : "PASS", tma_bad, kRows * kK);
    failures += tma_bad != 0;

    std::vector<float> hc(64 * 64);
    CHECK_CUDA(cudaMemcpy(hc.data(), dc, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double max_rel = 0;
    const int gemm_bad = compare_tile(ha.data(), hb.data(), hc.data(), &max_rel);
    std::printf("%s wgmma m64n64k16 SS GEMM 64x64x128: %d of 4096 elements beyond 1e-3 (max rel err %.3g)\n",
                gemm_bad ? "FAIL" : "PASS", gemm_bad, max_rel);
    failures += gemm_bad != 0;

    // (d): the 2-stage full/empty ring over ntiles tiles.
    const int ring_smem = kStages * 2 * kTileBytes + 1024;
    CHECK_CUDA(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_smem));
    int grid = prop.multiProcessorCount * 2;
    if (grid > (ntiles + 7) / 8) grid = (ntiles + 7) / 8;  // several tiles per block
    if (grid < 1) grid = 1;
    ring_kernel<<<grid, 160, ring_smem>>>(map_a, map_b, dring, ntiles, derr);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(&herr, derr, sizeof(int), cudaMemcpyDeviceToHost));
    if (herr != 0) {
        std::printf("FAIL ring: %s mbarrier wait timed out (deadlock or lost transaction)\n",
                    herr == kErrFullTimeout ? "full" : "empty");
        return 1;
    }
    std::vector<float> hring(static_cast<size_t>(ntiles) * 64 * 64);
    CHECK_CUDA(cudaMemcpy(hring.data(), dring, hring.size() * sizeof(float), cudaMemcpyDeviceToHost));
    // Reference per (A tile, B tile) pair, computed once.
    std::vector<float> refs(static_cast<size_t>(kDistinct) * kDistinct * 64 * 64);
    for (int ia = 0; ia < kDistinct; ++ia)
        for (int ib = 0; ib < kDistinct; ++ib) {
            const uint16_t *a = ha.data() + static_cast<size_t>(ia) * kRows * kK;
            const uint16_t *b = hb.data() + static_cast<size_t>(ib) * kRows * kK;
            float *r = refs.data() + (static_cast<size_t>(ia) * kDistinct + ib) * 4096;
            for (int i = 0; i < 64; ++i)
                for (int j = 0; j < 64; ++j) {
                    double s = 0;
                    for (int k = 0; k < kK; ++k) s += double(from_bf16(a[i * kK + k])) * double(from_bf16(b[j * kK + k]));
                    r[i * 64 + j] = static_cast<float>(s);
                }
        }
    long long ring_bad = 0;
    int bad_tiles = 0;
    double ring_max = 0;
    for (int t = 0; t < ntiles; ++t) {
        const float *r = refs.data() + (static_cast<size_t>(t % kDistinct) * kDistinct + (t / kDistinct) % kDistinct) * 4096;
        const float *c = hring.data() + static_cast<size_t>(t) * 4096;
        int tb = 0;
        for (int e = 0; e < 4096; ++e) {
            const double err = std::fabs(double(c[e]) - double(r[e])) / std::fmax(std::fabs(double(r[e])), 1.0);
            if (!(err <= 1e-3)) ++tb;
            ring_max = std::isnan(err) ? INFINITY : std::fmax(ring_max, err);
        }
        ring_bad += tb;
        bad_tiles += tb != 0;
    }
    std::printf("%s mbarrier 2-stage ring: %d tiles on %d blocks, no timeout, %d tiles / %lld elements beyond 1e-3 "
                "(max rel err %.3g)\n",
                ring_bad ? "FAIL" : "PASS", ntiles, grid, bad_tiles, ring_bad, ring_max);
    failures += ring_bad != 0;

    cudaFree(da);
    cudaFree(db);
    cudaFree(draw);
    cudaFree(dc);
    cudaFree(dring);
    cudaFree(derr);
    std::printf("%s test_hopper_primitives\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
