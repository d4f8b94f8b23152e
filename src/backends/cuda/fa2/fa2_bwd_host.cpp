// The FA2 backward pass, host side: what it supports, its plan (compiled head dim and tile, the
// deterministic mode's order counters, the workspace slices) and the enqueue of its kernels
// (preprocess, main, dQ convert; see fa2_bwd_params.h for what each does).
//
// Workspace (O(N), never N x N):
//   row_dot   heads_q x rows x 4 bytes
//   dq_accum  heads_q x rows x head_dim x 4 bytes (rows = batch * seqlen_q, or total_q)
//   dq_sem    deterministic only: batch x heads_q x query blocks x 4 bytes
// Determinism: dK and dV are written once by the one CTA that owns the key block (it walks the
// whole GQA group in a fixed order); dQ goes through fp32 reductions. In deterministic mode the
// key blocks that add to one query block's dQ take turns in a fixed order: a counter per (query
// head, query block) says how many have added (fa2_bwd_kernel.cuh), so every dQ element sums its
// terms in one fixed order: ascending key blocks, or descending on the keys-descending grid
// (grid_order). A turn waits only for key blocks of its own pair that the grid dispatches earlier.
#include "backends/cuda/fa2/fa2_bwd_host.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

#include "backends/cuda/fa2/fa2_bwd_params.h"
#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/bwd_args.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace fa2 {
namespace {

struct BwdHeadDim {
    int head_dim;
    LaunchBwd launch;
};
#define FLASHATTN_FA2_BWD_ROW(D) {D, launch_bwd_hdim##D},
constexpr BwdHeadDim kBwdHeadDims[] = {FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_BWD_ROW)};
#undef FLASHATTN_FA2_BWD_ROW

constexpr int64_t kMaxSeqlen = int64_t(1) << 28;  // keeps the int32 mask arithmetic exact
constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;
// The smallest row with a backward kernel (bwd_compiled) that runs `d` (callers have checked
// 8 <= d <= 256).
const BwdHeadDim &bwd_compiled_for(int64_t d) {
    for (const BwdHeadDim &row : kBwdHeadDims)
        if (d <= row.head_dim && bwd_compiled(row.head_dim)) return row;
    return kBwdHeadDims[sizeof kBwdHeadDims / sizeof kBwdHeadDims[0] - 1];
}

// The main tile unless it exceeds the device's per-block opt-in and a fallback is compiled.
// FLASHATTN_FA2_BWD_TILE=fallback forces the fallback where one is compiled: a developer's knob to
// test that tile on a bigger GPU.
bool use_fallback(int kd, size_t smem_optin) {
    if (!bwd_has_fallback(kd)) return false;
    const char *env = std::getenv("FLASHATTN_FA2_BWD_TILE");
    if (env != nullptr && std::string(env) == "fallback") return true;
    const size_t main = static_cast<size_t>(bwd_smem_bytes(bwd_tile_main(kd), kd));
    return smem_optin != 0 && main > smem_optin;
}

// head_dim_v != head_dim runs on the kernel of the wider one (fa2_bwd_kernel.cuh).
int64_t kernel_head_dim(const Problem &p) { return std::max(p.head_dim, p.head_dim_v); }

BwdTile tile_of(int kd, bool fallback) { return fallback ? bwd_tile_fallback(kd) : bwd_tile_main(kd); }

int64_t key_blocks(const Problem &p, const BwdTile &t) { return ceil_div(p.seqlen_k, t.bn); }
int64_t query_blocks(const Problem &p, const BwdTile &t) { return ceil_div(p.seqlen_q, t.bm); }

// The main kernel's grid order (fa2_bwd_params.h). Heads fastest gives the 132 resident CTAs of an
// H100 / H200 about 132 / pairs key blocks per (kv head, sequence) pair to share Q, dO and dQ rows
// in L2 (at 2k tokens x 64 pairs, two); keys fastest, up to a whole pair's. Measured on an H100
// (stop 49, docs/performance.md "stop 49, lead, calls 3-8"; bf16, hidden 2048, 16k tokens):
//  - default mode without a mask: keys fastest 1.00-1.66x at every cell (d 256 1k / 2k / 4k 1.66 /
//    1.46 / 1.10x, d 128 1k / 2k 1.07 / 1.05x: the 64-key tile of d > 128 moves twice the bytes
//    per FLOP); under a causal mask it loses 2-5 % at 4k-8k (heads fastest starts the heaviest
//    key blocks first) and wins on 64-key tiles up to 2k (d 256 1k / 2k 1.52 / 1.13x); on the
//    128-key tiles (d <= 128) keys descending won at 1k (d 64 / 128 1.02 / 1.03-1.04x in two
//    calls; level at 2k);
//  - deterministic mode, up to 2k keys: without a mask keys fastest (d 128 / 256 0.86 / 0.81-0.82x
//    of the default where heads fastest gave 0.80-0.81 / 0.61-0.69x; the 128-row tile of d <= 64
//    0.81x against heads fastest's 0.92x); under a mask keys descending, whose turns follow the
//    order in which walks from later diagonals reach a query block (0.97-1.02x of the default,
//    heads fastest 0.66-0.96x; ascending keys fastest 0.47-0.60x: every turn waits for the block
//    below). From 4k keys heads fastest (0.92-1.02x). Sink tokens keep heads fastest (their
//    blocks go last in a descending walk, which turn_last_block does not count).
// FLASHATTN_FA2_BWD_ORDER=0/1/2 forces an order (a developer's knob for A/B runs and tests; 2 falls
// back to heads fastest in the deterministic mode with sink tokens). Read at finalize.
int grid_order(const Problem &p, const BwdTile &t) {
    const char *knob = std::getenv("FLASHATTN_FA2_BWD_ORDER");
    if (knob != nullptr && (std::string(knob) == "0" || std::string(knob) == "1" || std::string(knob) == "2")) {
        const int forced = knob[0] - '0';
        return forced == kKeysDescending && p.deterministic && p.sink_tokens > 0 ? kHeadsFastest : forced;
    }
    const bool short_keys = p.seqlen_k <= 2048;
    if (!p.deterministic) {
        if (!p.has_mask() || (t.bn == 64 && short_keys)) return kKeysFastest;
        return p.seqlen_k <= 1024 ? kKeysDescending : kHeadsFastest;  // no turns: sink tokens allowed
    }
    if (!short_keys) return kHeadsFastest;
    if (p.has_mask()) return p.sink_tokens > 0 ? kHeadsFastest : kKeysDescending;
    return t.bm < 128 ? kKeysFastest : kHeadsFastest;
}

}  // namespace

std::string backward_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    if (!dev.present) return "the fa2 backward pass needs a CUDA device and none is available";
    if (dev.cc_major < 8)
        return "the fa2 backward pass needs compute capability 8.0 or newer (device " + std::to_string(dev.device) +
               " is " + std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) + ")";
    const std::string shape = tensor_core_shape_problem(p, "fa2", /*any_head_dim_v=*/true);
    if (!shape.empty()) return shape;
    if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen)
        return "the fa2 backward pass supports sequence lengths below 2^28";
    if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ)
        return "the fa2 backward pass supports at most 65535 heads and 65535 sequences";
    const int kd = bwd_compiled_for(kernel_head_dim(p)).head_dim;
    const BwdTile tile = tile_of(kd, use_fallback(kd, dev.smem_per_block_optin));
    if (p.heads_kv * p.batch * key_blocks(p, tile) > kMaxGridX)
        return "the fa2 backward pass supports at most 2^31 - 1 key blocks of " + std::to_string(tile.bn) +
               " keys over all key/value heads and sequences";
    const size_t smem = static_cast<size_t>(bwd_smem_bytes(tile, kd));
    if (dev.smem_per_block_optin != 0 && smem > dev.smem_per_block_optin)
        return "the fa2 backward pass needs " + std::to_string(smem / 1024) + " KB of shared memory per block for head dim " +
               std::to_string(kernel_head_dim(p)) + " and the device allows " + std::to_string(dev.smem_per_block_optin / 1024) +
               " KB";
    return std::string();
}

BwdPlan plan_backward(const Problem &p, const DeviceInfo &dev, WorkspaceLayout *ws) {
    BwdPlan plan;
    plan.head_dim = bwd_compiled_for(kernel_head_dim(p)).head_dim;
    plan.fallback = use_fallback(plan.head_dim, dev.smem_per_block_optin);
    const BwdTile tile = tile_of(plan.head_dim, plan.fallback);
    plan.grid_order = grid_order(p, tile);
    static_cast<BwdSlices &>(plan) =
        add_backward_slices(p, query_blocks(p, tile),
                            {"fa2 backward dQ order counters", "fa2 backward dO.O row sums", "fa2 backward dQ accumulator"},
                            ws, /*dq_frag=*/true);
    return plan;
}

flashattn_status_t run_backward(const Problem &p, const BwdPlan &plan, const WorkspaceLayout &ws, const Tensors &t) {
    DeviceGuard guard(p.device);  // first: every CUDA call below runs on the plan's device
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "fa2 backward: cudaSetDevice");
    FLASHATTN_TRY(check_device_tensors(p, t));
    if (p.heads_q == 0) return FLASHATTN_SUCCESS;
    if (p.batch == 0) return zero_sink_gradient(p, t, "fa2");  // no rows: the sink logits' gradient is 0
    const bool have_q = p.varlen ? p.total_q > 0 : p.seqlen_q > 0;
    const bool have_k = p.varlen ? p.total_k > 0 : p.seqlen_k > 0;

    BwdParams k;
    fill_backward_args(p, t, ws, plan, &k);
    k.grid_order = plan.grid_order;

    const bool bf16 = p.dtype == FLASHATTN_DTYPE_BF16;
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    cudaError_t err;
    if (have_q) {
        err = launch_bwd_preprocess(k, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 backward preprocess");
        FLASHATTN_TRY(check_launch("fa2 backward preprocess kernel"));
    }
    if (k.dsink_logits != nullptr) {  // after the preprocess's D (rows of no sequence: dsink = 0)
        err = launch_bwd_sink_grad(k, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 backward sink gradient");
        FLASHATTN_TRY(check_launch("fa2 backward sink gradient kernel"));
    }
    if (have_k && p.deterministic) {
        err = cudaMemsetAsync(k.dq_sem, 0, ws.bytes(plan.dq_sem), stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 backward: zeroing the dQ order counters");
    }
    if (have_k) {  // also with no queries: dK = dV = 0
        err = bwd_compiled_for(plan.head_dim).launch(k, bf16, plan.fallback, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 backward kernel setup");
        FLASHATTN_TRY(check_launch("fa2 backward kernel"));
    }
    if (have_q) {  // also with no keys: dQ = 0
        err = launch_bwd_convert_dq(k, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 backward dQ convert");
        FLASHATTN_TRY(check_launch("fa2 backward dQ convert kernel"));
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace fa2
}  // namespace flashattn
