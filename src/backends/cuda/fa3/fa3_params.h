// Kernel parameters of the FA3 forward backend and its launchers; shared by the host code
// (fa3_backend.cpp) and the kernels (fa3_kernel.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap (type only)
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/fa3/fa3_head_dims.h"
#include "backends/cuda/host/tensor_args.h"

namespace flashattn {
namespace fa3 {

struct Params : TensorArgs {
    int32_t reverse_m = 0;  // schedule the heaviest (last, causal) query tiles first
    int32_t num_ctas = 1;   // persistent grid: at most one CTA per SM
    int32_t section = 1;    // causal schedule: (head, sequence) pairs per L2 section
    // 1: TensorMaps::o describes O and a kernel with O staging (Traits::kOStaged) stores its full
    // warpgroup row blocks with TMA; 0 (O's strides or base not TMA's, or no staging): every O
    // row from the registers.
    int32_t o_tma = 0;
    // Host only: launch_fwd runs the row's wide key tile (fa3_config.h wide_config_for; head dim
    // 64), whose boxes the K / V tensor maps then have. Decided at finalize.
    int32_t wide_tile = 0;

    // Serving (issue 18). gather = 1: the whole producer warpgroup loads K and V with cp.async
    // (fa3_gather.cuh) instead of one thread issuing TMA boxes, so that each row can come from its
    // own page and the rows past a sequence's used keys arrive as zeros (TMA would load whatever the
    // cache holds there, and 0 x NaN in P V poisons the row). Set for paged caches and seqused_k.
    // Paged (page_table non-null): key t of sequence b is row t % page_size of page
    // page_table[b * page_table_stride + t / page_size]; k_bs / v_bs step between pages.
    int32_t gather = 0;
    const int32_t *page_table = nullptr;
    int64_t page_table_stride = 0;
    int32_t page_size = 0;
    // ALiBi (alibi_slopes non-null) without soft cap, head dims below 256: 1 launches the ramp
    // kernel, the column part of a one-sided tile's bias inside S = Q K^T (fa3_mainloop.cuh,
    // kAlibiGemm); 0 the plain one, an FFMA per score. FLASHATTN_FA3_ALIBI_GEMM=0 (knob_off,
    // fa3_backend.cpp) for A/B runs. Last, so the fields before keep their parameter offsets.
    int32_t alibi_gemm = 1;
    // Sink tokens (1..16, head dims below 256): 1 launches the sink kernel, which runs the one sink
    // tile below the window 16 keys wide (fa3_mainloop.cuh, sink_tile_narrow); 0 main's kernel, the
    // sink tile a full key tile. FLASHATTN_FA3_SINK_NARROW=0 (knob_off, fa3_backend.cpp) for A/B runs.
    int32_t sink_narrow = 1;
};

// TMA descriptors of Q, K and V: rank 4 {head_dim, rows, heads, batch} (varlen: rows = total
// tokens, batch 1), 64-column boxes of 128 (Q) or block_n (K, V) rows, 128-byte swizzle; O
// (16-bit forward with Params::o_tma only, else a copy of q): {head_dim_v, rows, heads, batch},
// boxes of 64 rows, the epilogue's store. The FP8 kernel takes q, k, v.
struct TensorMaps {
    CUtensorMap q, k, v, o;
};

// One launcher per row of fa3_head_dims.h (generated fa3_fwd_hdimD.cu); `bf16` picks the element type.
using LaunchFwd = cudaError_t (*)(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
#define FLASHATTN_FA3_DECLARE_LAUNCH(D) \
    cudaError_t launch_fwd_hdim##D(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
FLASHATTN_FA3_HEAD_DIMS(FLASHATTN_FA3_DECLARE_LAUNCH)
#undef FLASHATTN_FA3_DECLARE_LAUNCH
// ... and per P row (generated fa3_fwd_pairDxDV.cu): V of its own width.
#define FLASHATTN_FA3_DECLARE_PAIR_LAUNCH(D, DV) \
    cudaError_t launch_fwd_hdim##D##x##DV(const Params &p, const TensorMaps &maps, bool bf16, cudaStream_t s);
FLASHATTN_FA3_HEAD_DIM_PAIRS(FLASHATTN_FA3_DECLARE_PAIR_LAUNCH)
#undef FLASHATTN_FA3_DECLARE_PAIR_LAUNCH

}  // namespace fa3
}  // namespace flashattn
