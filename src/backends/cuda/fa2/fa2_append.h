// The serving pre-kernels of the FA2 backend (issue 18): before the attention kernel, write each
// sequence's new K/V rows into its cache (contiguous or paged) at seqused_k[b] - K rotated when the plan
// has a rotary dim - and rotate Q into a contiguous copy in the workspace. Then the attention
// kernel runs unchanged over seqused_k[b] + new_rows keys (TensorArgs::seqused_add) with Q read
// from that copy. Plain C++ shared by fa2_backend.cpp and fa2_append.cu.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace flashattn {
namespace fa2 {

struct AppendParams {
    const void *k_new = nullptr, *v_new = nullptr;  // [batch][new_rows][heads_kv][d]
    void *k = nullptr, *v = nullptr;                // the caches (written)
    const int32_t *seqused_k = nullptr;             // cache lengths before the append
    const int32_t *cu_q = nullptr, *cu_k = nullptr; // varlen (null otherwise)
    const float *rotary_cos = nullptr, *rotary_sin = nullptr;  // [seqlen_k][rotary_dim / 2]
    const void *q = nullptr;
    void *q_rot = nullptr;  // null without rotary; else [query rows][heads_q][d], contiguous
    int64_t kn_bs = 0, kn_rs = 0, kn_hs = 0, vn_bs = 0, vn_rs = 0, vn_hs = 0;
    int64_t k_bs = 0, k_rs = 0, k_hs = 0, v_bs = 0, v_rs = 0, v_hs = 0;
    int64_t q_bs = 0, q_rs = 0, q_hs = 0;
    int32_t batch = 0, new_rows = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0;
    int32_t head_dim = 0, rotary_dim = 0, interleaved = 0;
    const int32_t *page_table = nullptr;  // paged caches: k_bs / v_bs step between pages
    int64_t page_table_stride = 0;
    int32_t page_size = 0;
};

// Enqueue the append (and with q_rot the rotation of Q) on `s`; `bf16` picks the element type.
cudaError_t launch_append(const AppendParams &a, bool bf16, cudaStream_t s);

}  // namespace fa2
}  // namespace flashattn
