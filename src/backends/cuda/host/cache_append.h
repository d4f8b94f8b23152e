// The serving append (issue 18), host half, shared by every CUDA generation that runs it: before
// the attention kernel, write each sequence's new K/V rows into its cache (contiguous or paged) at
// seqused_k[b] - K rotated when the plan has a rotary dim - and rotate Q into a contiguous copy in
// the workspace. The attention kernel then runs unchanged over seqused_k[b] + new_rows keys
// (TensorArgs::seqused_add) with Q read from that copy (use_rotated_q).
//
// The kernels are device/cache_append.cuh; each generation instantiates them in its own unit
// (faN_append.cu, compiled for that generation's architectures) behind its launch_append.
// Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn {

struct Problem;
struct Tensors;
struct TensorArgs;

struct AppendParams {
    const void *k_new = nullptr, *v_new = nullptr;  // [batch][new_rows][heads_kv][d]
    void *k = nullptr, *v = nullptr;                // the caches (written)
    const int32_t *seqused_k = nullptr;             // cache lengths before the append
    const int32_t *cu_q = nullptr, *cu_k = nullptr; // varlen (null otherwise; cu_k null when paged)
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

// Bytes of the rotated-Q copy a plan with a rotary append needs in its workspace (0 without).
size_t rotated_q_bytes(const Problem &p);

// The append of one execute call: `q_rot` is the plan's rotated-Q workspace slice (null without rotary).
void fill_append_params(const Problem &p, const Tensors &t, void *q_rot, AppendParams *out);

// Point the attention kernel's Q at the rotated copy (contiguous [rows][heads_q][d]).
void use_rotated_q(const Problem &p, void *q_rot, TensorArgs *k);

}  // namespace flashattn
