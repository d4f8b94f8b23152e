// The FA3 backward pass, host side (see fa3_bwd_host.h and, for the kernels, fa3_bwd_params.h).
//
// Workspace (O(N), never N x N), as the FA2 backward's:
//   row_dot   heads_q x rows x 4 bytes
//   dq_accum  heads_q x rows x head_dim x 4 bytes (rows = batch * seqlen_q, or total_q), in
//             fragment order: rows and head_dim rounded up (device/dq_accum.cuh)
//   dq_sem    deterministic only: batch x heads_q x query blocks x 4 bytes
// Determinism: dK and dV are written once by the one CTA that owns the key block (it walks the
// whole GQA group in a fixed order); dQ goes through fp32 reductions that, in deterministic mode,
// take turns per (query head, query block) in ascending key order (fa3_bwd_kernel.cuh).
#include "backends/cuda/fa3/fa3_bwd_host.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

#include "backends/cuda/fa3/fa3_bwd_turns.h"
#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/bwd_args.h"
#include "backends/cuda/host/tensor_args.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace fa3 {
namespace {

struct BwdHeadDim {
    int head_dim;
    LaunchBwd launch;
};
#define FLASHATTN_FA3_BWD_ROW(D) {D, launch_bwd_hdim##D},
constexpr BwdHeadDim kBwdHeadDims[] = {FLASHATTN_FA3_HEAD_DIMS(FLASHATTN_FA3_BWD_ROW)};
#undef FLASHATTN_FA3_BWD_ROW

constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;

// The smallest head dim with a compiled backward (bwd_compiled) that holds `d` (callers have
// checked 8 <= d <= 256): 136..256 run on the 256 row.
const BwdHeadDim &compiled_for(int64_t d) {
    for (const BwdHeadDim &row : kBwdHeadDims)
        if (d <= row.head_dim && bwd_compiled(row.head_dim)) return row;
    return kBwdHeadDims[sizeof kBwdHeadDims / sizeof kBwdHeadDims[0] - 1];
}

// head_dim_v != head_dim runs on the kernel of the wider one (fa3_bwd_kernel.cuh).
int64_t kernel_head_dim(const Problem &p) { return p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v; }

}  // namespace

std::string backward_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    // A developer's knob for A/B runs: FLASHATTN_FA3_BACKWARD=off makes auto pair the FA3 forward
    // with FA2's backward (a plan forced to fa3 then has no backward), e.g. to tell the forward's
    // share of a gradient error from the backward's. Read at finalize.
    const char *knob = std::getenv("FLASHATTN_FA3_BACKWARD");
    if (knob != nullptr && std::string(knob) == "off")
        return "the fa3 backward pass is turned off (FLASHATTN_FA3_BACKWARD=off)";
    const int kd = compiled_for(kernel_head_dim(p)).head_dim;
    if (!bwd_compiled(kd))
        return "the fa3 backward pass has no kernel for head dim " + std::to_string(kernel_head_dim(p));
    if (p.heads_q > 65535 || p.batch > 65535)
        return "the fa3 backward pass supports at most 65535 heads and 65535 sequences";
    if (p.heads_kv * p.batch * ceil_div(p.seqlen_k, bwd_block_n(kd)) > kMaxGridX)
        return "the fa3 backward pass supports at most 2^31 - 1 key blocks of " + std::to_string(bwd_block_n(kd)) +
               " keys over all key/value heads and sequences";
    // Either layout of the head dim may run (wide_layout): the larger one must fit (every sm_90a
    // part has 227 KB; the 80-key layout takes 217 KB, the split one 212 KB).
    const size_t smem = static_cast<size_t>(bwd_split(kd) ? std::max(bwd_smem_bytes(kd), bwd_wide_smem_bytes(kd))
                                                          : bwd_smem_bytes(kd));
    if (dev.smem_per_block_optin != 0 && smem > dev.smem_per_block_optin)
        return "the fa3 backward pass needs " + std::to_string(smem / 1024) + " KB of shared memory per block and the "
               "device allows " + std::to_string(dev.smem_per_block_optin / 1024) + " KB";
    return std::string();
}

// Up to how many keys the keys-rotated order wins (below). Key blocks fastest (with rotated query
// walks) lets the CTAs resident at once share a few pairs' Q, dO and dQ rows in L2, where heads
// fastest gives each a pair of its own (2 MB at d 128 / 2k; stop 22's ncu: L2 hit 46 %). Measured
// on the H200: at 2k keys 1.04-1.28x at d 64 / 128 and 1.33-1.51x at d 256 (stop 26,
// performance.md "stop 26, lead", calls 4-5); at 4k 1.23-1.36x at d 64, 1.18-1.41x at d 128, d 256
// 1.25x non-causal and 0.97x causal; at 8k 1.17-1.26x at d 64, 0.93-0.98x at d 128, 1.00x at d 256
// (stop 30, call 5). Longer keys keep heads fastest under a mask. Without one, keys rotated at any
// length: on the H200 (stop 30) level with heads fastest at 8k (d 128 0.98-1.00x, d 256 1.00x),
// on an H100 80GB (stop 36, two calls) 1.65-1.90x at 8k d 128 / 256, 1.01-1.15x at 16k, where
// heads fastest falls to 0.53-0.57x torch-flash at d 256 8k. Under a causal mask the two GPUs
// disagree at 8k d 128 (H200 0.93x, H100 1.19x; stop 38 on the H200 again 0.95x), so the H200's
// measured rule stays there; at d 64 16k both prefer keys rotated (H200 1.07x in stop 38, H100
// 1.07x in stop 36), at d 256 8k-16k the two orders are level.
int64_t rotated_order_max_keys(const Problem &p) { return compiled_for(kernel_head_dim(p)).head_dim == 64 ? 16384 : 4096; }

// The default mode's grid order. FLASHATTN_FA3_BWD_ORDER=0/1/2 forces one (a developer's knob for
// A/B runs). Read at finalize.
int default_grid_order(const Problem &p) {
    const char *knob = std::getenv("FLASHATTN_FA3_BWD_ORDER");
    if (knob != nullptr && (std::string(knob) == "0" || std::string(knob) == "1" || std::string(knob) == "2"))
        return knob[0] - '0';
    if (!p.has_mask()) return kKeysRotated;
    return p.seqlen_k <= rotated_order_max_keys(p) ? kKeysRotated : kHeadsFastest;
}

// The key blocks (of the longest sequence) whose walks start at query block 0 (fa3_bwd_turns.h).
int64_t walks_from_block0(const Problem &p, int kbn, int64_t key_blocks) {
    const MaskBounds m = mask_bounds(p);
    const int64_t off = p.top_left ? 0 : p.seqlen_k - p.seqlen_q;
    return bwd_walks_from_block0(kbn, kBwdBM, static_cast<int>(p.seqlen_q), static_cast<int>(p.seqlen_k), off, m.left,
                                 m.right, static_cast<int>(key_blocks), p.sink_tokens);
}

// The deterministic mode's grid order: its dQ adds take turns in a fixed order per query block
// (fa3_bwd_kernel.cuh, turn_of). Heads fastest (ascending key blocks, earlier CTAs first) is right
// for any size. Keys fastest: the adds into a query block in the order the walks reach it
// (fa3_bwd_turns.h bwd_turn), counted by each CTA into a table of kBwdTurnTableMax entries (so at
// most that many query blocks); the pair's key blocks must fit one wave (one CTA per SM): a turn
// waits only for key blocks of its own pair, which the in-order dispatch then guarantees to make
// progress. Without a mask the walks are rotated (plain walks would all reach query block 0 at
// step 0); under a mask only those that start at query block 0 (kKeysStaggered): the others start
// at their own diagonal, the order by step is then descending key blocks, and each key block
// reaches a query block a step or two after the one above it, so no turn waits (the ascending
// order makes key block n of a resident pair wait about 2n steps for key block 0 to reach its
// diagonal). Measured on the H200 (stop 34, bf16, d 64 / 128 / 256, 1k-8k, causal and not): the
// deterministic mode 0.82-0.97x the default where the ascending order gave 0.71-0.97x.
// Keys descending (kKeysDescending, FA2's deterministic order under a mask since stop 49): the
// staggered walks' turn order, descending key blocks, on a grid that dispatches each pair from its
// last key block, so no turn waits for an undispatched CTA and none needs the table; only for the
// kernels without bwd_det_kernel's writer warp (head dims above 128: the writer has no registers
// for it), under a mask without sink tokens, where the pair fits a wave and few walks start at
// query block 0 (those would queue there as plain walks). Measured on an H100 (stop 51, d 256
// causal, one call): det / default 0.886 / 0.875 / 0.856 / 0.804 at 1k / 2k / 4k / 8k against
// 0.870 / 0.858 / 0.841 (staggered) / 0.798 (heads fastest); at 16k (205 key blocks of 80 for 132
// SMs) 0.748 against heads fastest's 0.807: dispatched from the last block, causal's short walks
// go first and the long ones end the grid.
// FLASHATTN_FA3_BWD_DET_ORDER=0 forces heads fastest, =2 keys fastest wherever the pair and the walk
// fit (rotated, or staggered under a mask), =4 keys descending under any mask without sink tokens
// at head dims above 128 (developer knobs for A/B runs).
int det_grid_order(const Problem &p, int sm_count, int kbn, bool dq_writer) {
    const char *knob = std::getenv("FLASHATTN_FA3_BWD_DET_ORDER");
    if (knob != nullptr && std::string(knob) == "0") return kHeadsFastest;
    const bool descending_ok = !dq_writer && p.has_mask() && p.sink_tokens == 0;
    if (knob != nullptr && std::string(knob) == "4" && descending_ok) return kKeysDescending;
    const int64_t key_blocks = ceil_div(p.seqlen_k, kbn);
    const bool forced = knob != nullptr && std::string(knob) == "2";  // keys fastest wherever it fits
    if (descending_ok && !forced && key_blocks <= sm_count && 4 * walks_from_block0(p, kbn, key_blocks) <= key_blocks)
        return kKeysDescending;
    const bool fits = key_blocks <= sm_count && ceil_div(p.seqlen_q, kBwdBM) <= kBwdTurnTableMax;
    if (!fits) return kHeadsFastest;
    // Without a mask, rotated wherever the pair fits a wave: where a wave ends inside a pair, the
    // turns of the blocks it dispatched come first (det_wave_ctas).
    if (!p.has_mask()) return kKeysRotated;
    if (forced) return kKeysStaggered;
    // Staggered turns wait on the key blocks above, which the grid dispatches later: a pair that
    // spans two waves leaves its first-dispatched (lowest) key blocks waiting for SMs to free
    // (stop 31 call 6: d256 causal 8k, 128 key blocks, 0.61x the default against 0.83x ascending).
    // Walks from query block 0 (chunked prefill) queue up as under the rotated order.
    return key_blocks <= sm_count / 2 && 4 * walks_from_block0(p, kbn, key_blocks) <= key_blocks ? kKeysStaggered
                                                                                                : kHeadsFastest;
}

// The wave for the deterministic keys-rotated turns' split (fa3_bwd_turns.h bwd_wave_split: the key
// blocks of a pair that a wave dispatches take their turns before the blocks a later wave
// dispatches, instead of waiting a CTA's lifetime for them), or 0 for none: only where the pairs
// leave more than a sixteenth of a wave over. d 256's 80-key pairs at 4k / 8k keys (52 / 103
// blocks of 132 SMs): 0.87 / 0.89x the default (stop 41 call 5, H100; rotated without the split
// 0.78x, ascending 0.72 / 0.82x). The 64- / 128-key layouts' pairs leave 4 SMs (d 64 moved by
// -1..-2 % with the split there), and under a mask the staggered walks' lower key blocks, the
// long ones, would go first and hold every later block back (3-18 % slower).
int det_wave_ctas(const Problem &p, int sm_count, int kbn, int grid_order) {
    const int64_t key_blocks = ceil_div(p.seqlen_k, kbn);
    if (grid_order != kKeysRotated || key_blocks == 0) return 0;
    return sm_count % key_blocks > sm_count / 16 ? sm_count : 0;
}

// Whether the 80-key layout (fa3_bwd_wide.cuh) runs `p` on its compiled head dim kd: the split
// layout's head dims, both modes, without ALiBi (its bias has a form in the split layout only).
// Measured on an H100 (stop 39): 1.11-1.31x the split layout at d 256, 1k-8k, causal and not.
// FLASHATTN_FA3_BWD_WIDE=0 keeps the split layout (a developer's knob for A/B runs). Read at
// finalize.
bool wide_layout(const Problem &p, int kd) {
    const char *knob = std::getenv("FLASHATTN_FA3_BWD_WIDE");
    if (knob != nullptr && std::string(knob) == "0") return false;
    return bwd_split(kd) && !p.alibi;
}

// Whether bwd_det_kernel (a producer warpgroup; its writer warp adds each step's dQ, summed over
// the CTA's 128 keys, in one bulk reduction) runs `p` on compiled head dim kd: up to head dim 128
// in both modes (the deterministic one's writer takes the turns). bwd_kernel adds each
// warpgroup's 64-key partial dQ on its own, two reductions per step (64 of the 96 KB a d 128 step
// moves through L2). Stop 41 (H200) measured the writer kernel 1.01-1.08x bwd_kernel at 1k-4k keys
// and 0.965-1.006x at 8k, so it ran the default mode up to 4k; stop 42 stored its dQ slot in
// fragment order (no bank conflicts: fa3_bwd_params.h) and measured it, forced, 1.08-1.24x at
// 1k-4k and 1.14-1.42x at 8k-16k (H100, bf16, hidden 2048, 16k tokens, d 64 and 128): every length.
// FLASHATTN_FA3_BWD_WRITER=0 keeps bwd_kernel for the default mode (a developer's knob for A/B
// runs; test_backward_fa3_nowriter keeps it tested). Read at finalize.
bool writer_kernel(const Problem &p, int kd) {
    if (bwd_split(kd)) return false;
    if (p.deterministic) return true;
    const char *knob = std::getenv("FLASHATTN_FA3_BWD_WRITER");
    return knob == nullptr || std::string(knob) != "0";
}

BwdPlan plan_backward(const Problem &p, int sm_count, WorkspaceLayout *ws) {
    BwdPlan plan;
    plan.head_dim = compiled_for(kernel_head_dim(p)).head_dim;
    plan.block_n = wide_layout(p, plan.head_dim) ? kBwdWideBN : bwd_block_n(plan.head_dim);
    plan.dq_writer = writer_kernel(p, plan.head_dim);
    plan.grid_order =
        p.deterministic ? det_grid_order(p, sm_count, plan.block_n, plan.dq_writer) : default_grid_order(p);
    plan.wave_ctas = p.deterministic ? det_wave_ctas(p, sm_count, plan.block_n, plan.grid_order) : 0;
    plan.launch = compiled_for(kernel_head_dim(p)).launch;
    static_cast<BwdSlices &>(plan) =
        add_backward_slices(p, ceil_div(p.seqlen_q, kBwdBM),
                            {"fa3 backward dQ order counters", "fa3 backward dO.O row sums", "fa3 backward dQ accumulator"},
                            ws, /*dq_frag=*/true);  // every kernel (fa3_bwd_params.h)
    return plan;
}

flashattn_status_t run_backward(const Problem &p, const BwdPlan &plan, const WorkspaceLayout &ws, const Tensors &t,
                                const BwdMaps &maps) {
    if (p.heads_q == 0) return FLASHATTN_SUCCESS;
    const bool have_q = p.batch > 0 && (p.varlen ? p.total_q > 0 : p.seqlen_q > 0);
    const bool have_k = p.batch > 0 && (p.varlen ? p.total_k > 0 : p.seqlen_k > 0);
    if (!have_q) FLASHATTN_TRY(zero_sink_gradient(p, t, "fa3"));  // no rows: the sink logits' gradient is 0
    if (p.batch == 0) return FLASHATTN_SUCCESS;

    BwdParams k;
    fill_backward_args(p, t, ws, plan, &k);
    k.grid_order = plan.grid_order;
    k.block_n = plan.block_n;
    k.dq_writer = plan.dq_writer ? 1 : 0;
    k.wave_ctas = plan.wave_ctas;

    const bool bf16 = p.dtype == FLASHATTN_DTYPE_BF16;
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    cudaError_t err;
    if (have_q) {
        err = launch_bwd_preprocess(k, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa3 backward preprocess");
        FLASHATTN_TRY(check_launch("fa3 backward preprocess kernel"));
        if (k.dsink_logits != nullptr) {  // after the preprocess's D
            err = launch_bwd_sink_grad(k, stream);
            if (err != cudaSuccess) return cuda_fail(err, "fa3 backward sink gradient");
            FLASHATTN_TRY(check_launch("fa3 backward sink gradient kernel"));
        }
    }
    if (have_k && p.deterministic) {
        err = cudaMemsetAsync(k.dq_sem, 0, ws.bytes(plan.dq_sem), stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa3 backward: zeroing the dQ order counters");
    }
    if (have_k) {  // also with no queries: dK = dV = 0
        err = plan.launch(k, maps, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa3 backward kernel setup");
        FLASHATTN_TRY(check_launch("fa3 backward kernel"));
    }
    if (have_q) {  // also with no keys: dQ = 0
        err = launch_bwd_convert_dq(k, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa3 backward dQ convert");
        FLASHATTN_TRY(check_launch("fa3 backward dQ convert kernel"));
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace fa3
}  // namespace flashattn
