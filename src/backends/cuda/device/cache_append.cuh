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
// A row's work items over the CTA's threads (a rotary pair or a copied column is one item; so is a
// column of V): head dims go up to 256, so a thread has at most two of each row.
constexpr int kAppendItems = 2;

struct AppendHalf {
    static constexpr bool kBf16 = false;
};
struct AppendBf16 {
    static constexpr bool kBf16 = true;
};

// Work item k of this thread in a rotated row: item i < rotary_dim / 2 is the pair (c0, c1), the
// others copy column c0 alone (c1 = -1); live is false past the row's items.
struct RotatedItem {
    int c0, c1;
    bool live;
};

__device__ __forceinline__ RotatedItem rotated_item(const AppendParams &a, int k) {
    const int i = static_cast<int>(threadIdx.x) + k * kAppendThreads, half = a.rotary_dim / 2;
    if (i < half) return {a.interleaved ? 2 * i : i, a.interleaved ? 2 * i + 1 : i + half, true};
    return {a.rotary_dim + (i - half), -1, i < a.head_dim - half};
}

// A thread's share of one source row (x: column c0 of its items, y: c1 of its pairs; V: x only).
// Every source row is loaded before anything is stored: the kernel is a chain of round trips to
// memory (stop 23 measured 4.3 us for it, its stores holding back the loads that followed them),
// and the decode step waits for it, so all loads that do not need the cache length go out
// together with it, and the rotation's angles (which do) are the only second round trip.
struct RowSlice {
    uint16_t x[kAppendItems], y[kAppendItems];
};

__device__ __forceinline__ RowSlice load_rotated_source(const AppendParams &a, const uint16_t *src) {
    RowSlice r = {};
#pragma unroll
    for (int k = 0; k < kAppendItems; ++k) {
        const RotatedItem it = rotated_item(a, k);
        if (!it.live) continue;
        r.x[k] = src[it.c0];
        if (it.c1 >= 0) r.y[k] = src[it.c1];
    }
    return r;
}

__device__ __forceinline__ RowSlice load_plain_source(const AppendParams &a, const uint16_t *src) {
    RowSlice r = {};
#pragma unroll
    for (int k = 0; k < kAppendItems; ++k) {
        const int c = static_cast<int>(threadIdx.x) + k * kAppendThreads;
        if (c < a.head_dim) r.x[k] = src[c];
    }
    return r;
}

// The cosines and sines of this thread's pairs at table row pos (a CTA's K and Q rows share it).
struct AngleSlice {
    float c[kAppendItems], s[kAppendItems];
};

__device__ __forceinline__ AngleSlice load_angles(const AppendParams &a, int pos) {
    AngleSlice t = {};
    const int half = a.rotary_dim / 2;
#pragma unroll
    for (int k = 0; k < kAppendItems; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * kAppendThreads;
        if (i >= half) continue;
        t.c[k] = a.rotary_cos[static_cast<int64_t>(pos) * half + i];
        t.s[k] = a.rotary_sin[static_cast<int64_t>(pos) * half + i];
    }
    return t;
}

// dst = the row r holds with its pairs rotated by t (rotary_dim 0: a plain copy).
template <class E>
__device__ __forceinline__ void store_rotated(const AppendParams &a, const RowSlice &r, const AngleSlice &t,
                                              uint16_t *dst) {
#pragma unroll
    for (int k = 0; k < kAppendItems; ++k) {
        const RotatedItem it = rotated_item(a, k);
        if (!it.live) continue;
        if (it.c1 < 0) {
            dst[it.c0] = r.x[k];
            continue;
        }
        const double x = rotary_load(r.x[k], E::kBf16), y = rotary_load(r.y[k], E::kBf16);
        dst[it.c0] = rotary_store(rotary_output(x, y, t.c[k], t.s[k], false), E::kBf16);
        dst[it.c1] = rotary_store(rotary_output(x, y, t.c[k], t.s[k], true), E::kBf16);
    }
}

__device__ __forceinline__ void store_plain(const AppendParams &a, const RowSlice &r, uint16_t *dst) {
#pragma unroll
    for (int k = 0; k < kAppendItems; ++k) {
        const int c = static_cast<int>(threadIdx.x) + k * kAppendThreads;
        if (c < a.head_dim) dst[c] = r.x[k];
    }
}

// The cache row of key pos of kv head h of sequence b: through the page table, the packed row
// (varlen), or the batch's.
struct CacheRow {
    uint16_t *k, *v;
};

__device__ __forceinline__ CacheRow cache_row(const AppendParams &a, int h, int b, int pos) {
    int64_t outer, row;  // outer: the page or the batch (its stride k_bs / v_bs), row: within it
    if (a.page_table != nullptr) {
        outer = a.page_table[b * a.page_table_stride + pos / a.page_size];
        row = pos % a.page_size;
    } else {
        outer = a.cu_k != nullptr ? 0 : b;
        row = (a.cu_k != nullptr ? static_cast<int64_t>(a.cu_k[b]) : 0) + pos;
    }
    return {static_cast<uint16_t *>(a.k) + outer * a.k_bs + row * a.k_rs + h * a.k_hs,
            static_cast<uint16_t *>(a.v) + outer * a.v_bs + row * a.v_rs + h * a.v_hs};
}

// Query row i of head h of sequence b and its slot in q_rot; src is null where the row does not
// exist (no rotary, a head or row past the problem's, a shorter varlen sequence).
struct QueryRow {
    const uint16_t *src;
    uint16_t *dst;
};

__device__ __forceinline__ QueryRow query_row(const AppendParams &a, int i, int h, int b) {
    if (a.q_rot == nullptr || i >= a.seqlen_q || h >= a.heads_q) return {nullptr, nullptr};
    const int sq = a.cu_q != nullptr ? a.cu_q[b + 1] - a.cu_q[b] : a.seqlen_q;
    if (i >= sq) return {nullptr, nullptr};
    const int64_t row = (a.cu_q != nullptr ? static_cast<int64_t>(a.cu_q[b]) : static_cast<int64_t>(b) * a.seqlen_q) + i;
    const int64_t src_off = a.cu_q != nullptr ? row * a.q_rs : b * a.q_bs + i * a.q_rs;
    return {static_cast<const uint16_t *>(a.q) + src_off + h * a.q_hs,
            static_cast<uint16_t *>(a.q_rot) + (row * a.heads_q + h) * a.head_dim};
}

// One launch for both (two cost a second launch latency, ~3 µs of a 50 µs decode step): grid
// (max(new_rows, seqlen_q), max(heads_kv, heads_q), batch); CTA (x, y, b) appends new row x of kv
// head y (K rotated) and rotates query row x of head y, both at position seqused_k[b] + x, where
// those exist. The attention kernel after it may be a programmatic dependent launch
// (device/pdl.cuh): it is let go at once and waits for this grid.
template <class E>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ AppendParams a) {
    pdl_launch_dependents();
    const int x = blockIdx.x, y = blockIdx.y, b = blockIdx.z;
    const bool new_row = x < a.new_rows && y < a.heads_kv;
    // First round trip: the cache length and every source row.
    const int pos = a.seqused_k[b] + x;
    RowSlice k_src = {}, v_src = {}, q_src = {};
    if (new_row) {
        k_src = load_rotated_source(a, static_cast<const uint16_t *>(a.k_new) + b * a.kn_bs + x * a.kn_rs + y * a.kn_hs);
        v_src = load_plain_source(a, static_cast<const uint16_t *>(a.v_new) + b * a.vn_bs + x * a.vn_rs + y * a.vn_hs);
    }
    const QueryRow q = query_row(a, x, y, b);
    if (q.src != nullptr) q_src = load_rotated_source(a, q.src);
    // Second: the angles at pos (and a paged cache's entry); then the stores. A CTA with neither
    // row reads no angles: its pos may lie past the table (a shorter varlen sequence's x).
    if (!new_row && q.src == nullptr) return;
    const AngleSlice t = load_angles(a, pos);
    if (new_row) {
        const CacheRow dst = cache_row(a, y, b, pos);
        store_rotated<E>(a, k_src, t, dst.k);
        store_plain(a, v_src, dst.v);
    }
    if (q.src != nullptr) store_rotated<E>(a, q_src, t, q.dst);
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
