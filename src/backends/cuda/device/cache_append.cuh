// The serving pre-kernels, device half (host/cache_append.h): one CTA per row (a new K/V row of one
// kv head, or a query row of one head); its threads walk the row's columns. Rotary pairs are
// computed in double and rounded once (round to odd into fp32, then to the 16-bit type), exactly as
// the CPU backend does, so every backend writes the same cache bits and the result equals "rotate,
// write, then attend".
//
// Shared by the generations without either including the other: each includes this header from
// its own unit (faN_append.cu, compiled for its own architectures) and wraps launch_cache_append.
// Everything here sits in an unnamed namespace on purpose: every unit gets its own kernels (and
// host stubs), so two generations' object libraries never register one kernel symbol twice.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/device/pdl.cuh"
#include "backends/cuda/device/rotary.cuh"
#include "backends/cuda/host/cache_append.h"

namespace flashattn {
namespace cuda {
namespace {

constexpr int kAppendThreads = 128;

struct AppendHalf {
    static constexpr bool kBf16 = false;
};
struct AppendBf16 {
    static constexpr bool kBf16 = true;
};

// dst = src with its first rotary_dim columns rotated at table row pos; work item i < rd/2 is a
// pair, the others copy one column each.
template <class E>
__device__ __forceinline__ void rotate_row(const AppendParams &a, const uint16_t *src, uint16_t *dst, int pos) {
    const int half = a.rotary_dim / 2;
    const int items = half + (a.head_dim - a.rotary_dim);
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        if (i < half) {
            const int c0 = a.interleaved ? 2 * i : i, c1 = a.interleaved ? 2 * i + 1 : i + half;
            const double x = rotary_load(src[c0], E::kBf16), y = rotary_load(src[c1], E::kBf16);
            const double c = a.rotary_cos[static_cast<int64_t>(pos) * half + i];
            const double s = a.rotary_sin[static_cast<int64_t>(pos) * half + i];
            dst[c0] = rotary_store(rotary_output(x, y, c, s, false), E::kBf16);
            dst[c1] = rotary_store(rotary_output(x, y, c, s, true), E::kBf16);
        } else {
            const int c = a.rotary_dim + (i - half);
            dst[c] = src[c];
        }
    }
}

// New K/V row j of kv head h of sequence b into the caches.
template <class E>
__device__ __forceinline__ void append_row(const AppendParams &a, int j, int h, int b) {
    const int pos = a.seqused_k[b] + j;
    const uint16_t *ks = static_cast<const uint16_t *>(a.k_new) + b * a.kn_bs + j * a.kn_rs + h * a.kn_hs;
    const uint16_t *vs = static_cast<const uint16_t *>(a.v_new) + b * a.vn_bs + j * a.vn_rs + h * a.vn_hs;
    // The cache row of key `pos`: through the page table, the packed row (varlen), or the batch's.
    int64_t outer, row;  // outer: the page or the batch (its stride k_bs / v_bs), row: within it
    if (a.page_table != nullptr) {
        outer = a.page_table[b * a.page_table_stride + pos / a.page_size];
        row = pos % a.page_size;
    } else {
        outer = a.cu_k != nullptr ? 0 : b;
        row = (a.cu_k != nullptr ? static_cast<int64_t>(a.cu_k[b]) : 0) + pos;
    }
    uint16_t *kd = static_cast<uint16_t *>(a.k) + outer * a.k_bs + row * a.k_rs + h * a.k_hs;
    uint16_t *vd = static_cast<uint16_t *>(a.v) + outer * a.v_bs + row * a.v_rs + h * a.v_hs;
    rotate_row<E>(a, ks, kd, pos);  // rotary_dim 0: a plain copy
    for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) vd[c] = vs[c];
}

// Query row i of head h of sequence b, at position seqused_k[b] + i, rotated into q_rot.
template <class E>
__device__ __forceinline__ void rotate_q_row(const AppendParams &a, int i, int h, int b) {
    const int sq = a.cu_q != nullptr ? a.cu_q[b + 1] - a.cu_q[b] : a.seqlen_q;
    if (i >= sq) return;
    const int64_t row = (a.cu_q != nullptr ? static_cast<int64_t>(a.cu_q[b]) : static_cast<int64_t>(b) * a.seqlen_q) + i;
    const int64_t src_off = a.cu_q != nullptr ? row * a.q_rs : b * a.q_bs + i * a.q_rs;
    const uint16_t *src = static_cast<const uint16_t *>(a.q) + src_off + h * a.q_hs;
    uint16_t *dst = static_cast<uint16_t *>(a.q_rot) + (row * a.heads_q + h) * a.head_dim;
    rotate_row<E>(a, src, dst, a.seqused_k[b] + i);
}

// One launch for both (two cost a second launch latency, ~3 µs of a 50 µs decode step): grid
// (max(new_rows, seqlen_q), max(heads_kv, heads_q), batch); CTA (x, y, b) appends row x of kv head
// y and rotates query row x of head y where those exist. The attention kernel after it may be a
// programmatic dependent launch (device/pdl.cuh): it is let go at once and waits for this grid.
template <class E>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ AppendParams a) {
    pdl_launch_dependents();
    const int x = blockIdx.x, y = blockIdx.y, b = blockIdx.z;
    if (x < a.new_rows && y < a.heads_kv) append_row<E>(a, x, y, b);
    if (a.q_rot != nullptr && x < a.seqlen_q && y < a.heads_q) rotate_q_row<E>(a, x, y, b);
}

template <class E>
cudaError_t launch_append_rows(const AppendParams &a, cudaStream_t s) {
    const int rows = a.q_rot != nullptr && a.seqlen_q > a.new_rows ? a.seqlen_q : a.new_rows;
    const int heads = a.q_rot != nullptr && a.heads_q > a.heads_kv ? a.heads_q : a.heads_kv;
    append_kernel<E><<<dim3(rows, heads, a.batch), kAppendThreads, 0, s>>>(a);
    return cudaGetLastError();
}

// Enqueue the append (and with q_rot the rotation of Q) on `s`; `bf16` picks the element type.
cudaError_t launch_cache_append(const AppendParams &a, bool bf16, cudaStream_t s) {
    return bf16 ? launch_append_rows<AppendBf16>(a, s) : launch_append_rows<AppendHalf>(a, s);
}

}  // namespace
}  // namespace cuda
}  // namespace flashattn
