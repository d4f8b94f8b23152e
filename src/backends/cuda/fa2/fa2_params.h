// Kernel parameters of the FA2 forward backend and the host-side choice of compiled variant.
// Shared by the host code (fa2_backend.cpp) and the kernels (fa2_kernel.cuh); plain C++.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_runtime_api.h>

#include "backends/cuda/fa2/fa2_head_dims.h"
#include "backends/cuda/host/tensor_args.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace fa2 {

struct Params : TensorArgs {
    float *o_part = nullptr;            // split-KV partials: [splits][heads_q][total_rows][head_dim]
    float *lse_part = nullptr;          // [splits][heads_q][total_rows]

    int32_t pack = 1;       // pack-GQA: query heads of one kv head share the M dimension (group), else 1
    int32_t num_splits = 1;
    int32_t reverse_m = 0;  // launch the heaviest (last, causal) query tiles first
    int32_t launch_pdl = 0;  // host only: launch as a programmatic dependent (after the serving append; sm_90+)

    // Paged K/V (page_table null otherwise): key t of sequence b is row t % page_size of page
    // page_table[b * page_table_stride + t / page_size]; k_bs / v_bs step between pages. Any page
    // size: pages of whole key tiles move the tile's base, others are gathered row by row
    // (fa2_mainloop.cuh, load_kv_tile).
    const int32_t *page_table = nullptr;
    int64_t page_table_stride = 0;
    int32_t page_size = 0;

    // sm_90, paged decode tiles (kv_tma = 1): K/V tiles arrive by TMA boxes (PagedTmaMaps, the
    // paged kernels' second parameter; fa2_mainloop.cuh, load_paged_tma) instead of the cp.async
    // row gather. Set by the host only for pages of a multiple of 16 keys (not of the key tile) at
    // the compiled head dim. tma_maps: host only, the maps the launcher passes (null: none).
    // (Last in Params, and the maps outside it: the fields before keep their parameter offsets, so
    // the other kernels' SASS does not change; a CUtensorMap member would align Params to 64.)
    int32_t kv_tma = 0;
    const struct PagedTmaMaps *tma_maps = nullptr;

    // Split-KV decode tiles that combine their own rows (fa2_fwd_kernel.cuh, fold_split_combine;
    // null: the combine kernel runs): one arrival word per (query tile, grid head, sequence) in
    // the workspace, holding fold_tag << 8 | the splits arrived so far (fa2_fold.h: the caller's
    // workspace is not zeroed, so a word of another tag counts as none arrived, and the last
    // split leaves (tag, 0) for a replayed CUDA graph's same tag). A new 56-bit tag per execute.
    unsigned long long *fold_count = nullptr;
    unsigned long long fold_tag = 0;
};

// The paged K and V caches as TMA tensor maps: rank 4 {head_dim, page_size, heads_kv, num_pages},
// boxes of 16 rows x 64 columns, SWIZZLE_128B (SwizzledTile's layout). The second parameter of the
// paged forward kernels (a __grid_constant__ whose address the TMA instructions take); the other
// kernels get NoPagedTmaMaps (PagedTmaMapsFor).
struct PagedTmaMaps {
    CUtensorMap k, v;
};
struct NoPagedTmaMaps {};
template <bool kPaged>
struct PagedTmaMapsFor {
    using type = NoPagedTmaMaps;
};
template <>
struct PagedTmaMapsFor<true> {
    using type = PagedTmaMaps;
};

// Launchers, one per row of fa2_head_dims.h (generated fa2_fwd_hdimD.cu). `bf16` picks the
// element type, `small` the small configuration (fa2_config.h) where one is compiled.
using LaunchFwd = cudaError_t (*)(const Params &p, bool bf16, bool small, cudaStream_t s);
#define FLASHATTN_FA2_DECLARE_LAUNCH(D) cudaError_t launch_fwd_hdim##D(const Params &p, bool bf16, bool small, cudaStream_t s);
FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_DECLARE_LAUNCH)
#undef FLASHATTN_FA2_DECLARE_LAUNCH

// Split-KV combine (fa2_merge.cu); by_warps: one warp per row (only where warp_combine_fits);
// pdl: launched as a programmatic dependent of the attention kernel (sm_90+, cuda/device/pdl.cuh).
cudaError_t launch_merge(const Params &p, bool bf16, bool by_warps, bool pdl, cudaStream_t s);

// Whether the combine of `splits` partials of `units` (query row, head) rows can run one warp per
// row: few enough splits for a warp to hold them all, and a grid within CUDA's limit.
bool warp_combine_fits(int splits, int64_t units);

// The merge of partial states (fa2_merge.cu): partial s's element (sequence b, row, head, col) at
// o_part[s] + b*p_bs + row*p_rs + head*p_hs + col (elements of its type), its LSE at
// lse_part[s][b*l_bs + head*l_hs + row]; the output likewise with o_* and lse_* strides. Every
// stride a multiple of 8 elements and head_dim a multiple of 8 <= 256 (16-byte accesses).
constexpr int kMaxMergePartials = 128;  // FLASHATTN_MAX_MERGE_PARTIALS and the split-KV bound
struct MergeParams {
    const void *o_part[kMaxMergePartials] = {};
    const float *lse_part[kMaxMergePartials] = {};
    int64_t p_bs = 0, p_rs = 0, p_hs = 0;
    int64_t l_bs = 0, l_hs = 0;
    void *o = nullptr;
    float *lse = nullptr;  // optional
    int64_t o_bs = 0, o_rs = 0, o_hs = 0;
    int64_t lse_bs = 0, lse_hs = 0;
    int32_t num_partials = 0, batch = 0, rows = 0, heads = 0, head_dim = 0;
};
enum class MergeInput { fp32, fp16, bf16 };
cudaError_t launch_merge_states(const MergeParams &p, MergeInput in, bool bf16_out, cudaStream_t s);

}  // namespace fa2
}  // namespace flashattn
