// FA1 backend: FlashAttention-1 forward on CUDA (sm_75 and newer). Host side: what it supports,
// the tile and query-range split, the workspace (the FA1 partial output and softmax statistics),
// and the launch. The kernel is in fa1_kernel.cuh.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "backends/backend.h"
#include "backends/cuda/fa1/fa1_append.h"
#include "backends/cuda/fa1/fa1_params.h"
#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/tensor_args.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace {

// One row per compiled head dim (fa1_head_dims.h): its entry points.
struct CompiledHeadDim {
    int head_dim;
    fa1::Config (*config)(bool large);
    cudaError_t (*launch)(const fa1::Params &p, bool large, bool bf16, cudaStream_t s);
    cudaError_t (*attributes)(bool large, bool bf16, cudaFuncAttributes *attr);
    cudaError_t (*occupancy)(bool large, bool bf16, int *blocks_per_sm);
};
#define FLASHATTN_FA1_ROW(D, ...) \
    {D, fa1::config_hdim##D, fa1::launch_hdim##D, fa1::func_attributes_hdim##D, fa1::occupancy_hdim##D},
constexpr CompiledHeadDim kHeadDims[] = {FLASHATTN_FA1_HEAD_DIMS(FLASHATTN_FA1_ROW)};
#undef FLASHATTN_FA1_ROW

// The compiled head dim that runs `d` (smaller head dims are zero-padded in shared memory).
const CompiledHeadDim &compiled_for(int64_t d) {
    for (const CompiledHeadDim &row : kHeadDims)
        if (d <= row.head_dim) return row;
    return kHeadDims[sizeof kHeadDims / sizeof kHeadDims[0] - 1];
}

// Everything execute needs, decided at finalize.
struct Fa1Plan : BackendPlan {
    const CompiledHeadDim *kernels = nullptr;
    fa1::Config cfg;
    int32_t q_blocks_per_cta = 1;  // the inner loop's length
    int32_t splits = 1;            // CTAs per (batch, head) along the query axis
    int64_t ws_rows = 0;           // workspace rows per head (see workspace_rows)
    int o_acc = -1;                // workspace slices: the running output and (m, l)
    int ml = -1;
    int rotated_q = -1;            // with a rotary append: Q rotated by the pre-kernel (host/cache_append.h)
};

// The large tile where the device's per-block shared memory allows it, else the small one; false
// when neither fits. FLASHATTN_FA1_TILE=small forces the small (sm_75) tile: a developer's knob to
// test that tile on a bigger GPU.
bool pick_config(const Problem &p, size_t smem_optin, fa1::Config *out) {
    const CompiledHeadDim &kernels = compiled_for(p.head_dim);
    const char *env = std::getenv("FLASHATTN_FA1_TILE");
    const bool force_small = env != nullptr && std::string(env) == "small";
    for (bool large : {true, false}) {
        if (large && force_small) continue;
        const fa1::Config c = kernels.config(large);
        if (c.smem_bytes <= smem_optin) {
            *out = c;
            return true;
        }
    }
    return false;
}

// Workspace rows per head: each sequence's rows start at a multiple of block_m (see the kernel's
// ws_start): varlen sequence b starts at block_m * (ceil(cu_q[b] / block_m) + b).
int64_t workspace_rows(const Problem &p, int block_m) {
    if (p.varlen) return block_m * (ceil_div(p.total_q, block_m) + p.batch);
    return p.batch * ceil_div(p.seqlen_q, block_m) * block_m;
}

// The FA1 partial output [heads_q][ws_rows][D] (fp32) and statistics [heads_q][ws_rows][kWarps] (m, l).
void add_workspace_slices(const Problem &p, Fa1Plan *plan) {
    const size_t rows = static_cast<size_t>(p.heads_q) * static_cast<size_t>(plan->ws_rows);
    plan->o_acc = plan->workspace.add("fa1 running output", rows * plan->cfg.head_dim * sizeof(float));
    plan->ml = plan->workspace.add("fa1 running (m, l)", rows * fa1::kWarps * 2 * sizeof(float));
}

std::string fa1_unsupported(const Problem &p, const DeviceInfo &dev) {
    if (!dev.present) return dev.absent_reason;
    const int cc = dev.cc_major * 10 + dev.cc_minor;
    const std::string sm = "sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor);
    if (cc < 75) return "fa1 needs a GPU of compute capability 7.5 (sm_75) or newer; device is " + sm;
    const std::string shape = tensor_core_shape_problem(p, "fa1");
    if (!shape.empty()) return shape;
    if (p.dtype == FLASHATTN_DTYPE_BF16 && cc < 80)
        return "fa1 runs bf16 only on sm_80 or newer (sm_75 has no bf16 tensor-core instruction); device is " + sm;
    if (std::max({p.seqlen_q, p.seqlen_k, p.q_rows(), p.k_rows()}) > (INT32_MAX >> 2))
        return "fa1 supports sequences and packed totals of at most 2^29 rows";
    if (p.batch > INT32_MAX / 2 || p.heads_q > INT32_MAX / 2 || p.batch * p.heads_q > (INT32_MAX >> 2))
        return "fa1 supports at most 2^29 (batch x heads) pairs";
    fa1::Config c;
    if (!pick_config(p, dev.smem_per_block_optin, &c)) {
        const fa1::Config small = compiled_for(p.head_dim).config(false);
        return "fa1 head dim " + std::to_string(p.head_dim) + " needs " + std::to_string(small.smem_bytes) +
               " bytes of shared memory per block; the device (" + sm + ") allows " +
               std::to_string(dev.smem_per_block_optin);
    }
    // The library must hold machine code this device can run.
    DeviceGuard scope(dev.device);
    if (scope.error() != cudaSuccess) {
        cudaGetLastError();
        return std::string("fa1 could not select the device: ") + cudaGetErrorString(scope.error());
    }
    cudaFuncAttributes attr;
    const cudaError_t err = compiled_for(p.head_dim).attributes(c.large, p.dtype == FLASHATTN_DTYPE_BF16, &attr);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return "libflashattn holds no fa1 kernel this device (" + sm + ") can run (" +
               cudaGetErrorString(err) + "); rebuild with FLASHATTN_FA1_ARCHS covering it";
    }
    return "";
}

// Query blocks per CTA (the inner loop's length). Without a causal mask, long inner loops amortise
// each K/V block's load and the CTA's start. H200, FA3-paper grid: at seqlen 1024 (fp16, first
// kernel) 2 / 4 / 8 / 16 / 32 query blocks gave 102 / 111 / 115 / 117 / 117 TFLOP/s at head dim 128
// and 116 / 129 / 134 / 139 / 139 at head dim 64; at seqlen 2k-16k (bf16, kernel of stop 11)
// 4 / 8 / 16 / 32 gave 155 / 166 / 167 / 171 at head dim 64 and 129 / 129 / 129 / 130-133 at 128.
// Causal rows do uneven work, and shorter ranges balance it better (8 ran 1-25% faster than 16
// there). Fewer when that would leave less than one wave of `slots` CTAs. FLASHATTN_FA1_QBLOCKS
// overrides it (a developer's tuning knob).
int q_blocks_per_cta(int64_t nqb, int64_t bh, int64_t slots, bool causal) {
    if (const char *env = std::getenv("FLASHATTN_FA1_QBLOCKS")) {
        const long v = std::strtol(env, nullptr, 10);
        if (v >= 1) return static_cast<int>(std::min<int64_t>(v, std::max<int64_t>(nqb, 1)));
    }
    int64_t nq = std::min<int64_t>(nqb, causal ? 8 : 32);
    while (nq > 1 && bh * ceil_div(nqb, nq) < slots) nq = ceil_div(nq, 2);
    if (nq < 1) nq = 1;
    const int64_t splits = ceil_div(nqb, nq);
    return static_cast<int>(std::max<int64_t>(1, ceil_div(nqb, splits)));  // balance the ranges
}

flashattn_status_t fa1_make_plan(const Problem &p, const DeviceInfo &dev, std::unique_ptr<BackendPlan> *out) {
    auto plan = std::make_unique<Fa1Plan>();
    plan->kernels = &compiled_for(p.head_dim);
    if (!pick_config(p, dev.smem_per_block_optin, &plan->cfg))
        return fail(FLASHATTN_ERROR_INTERNAL, "fa1: no tile fits the device's shared memory");
    // Resident thread blocks per SM for this tile (2 for every large tile on the H200; 1 for the
    // small tile on a 64 KB Turing SM): the query-range split fills one wave of them.
    DeviceGuard scope(dev.device);
    if (scope.error() != cudaSuccess) return cuda_fail(scope.error(), "fa1: cudaSetDevice");
    int per_sm = 0;
    const cudaError_t err = plan->kernels->occupancy(plan->cfg.large, p.dtype == FLASHATTN_DTYPE_BF16, &per_sm);
    if (err != cudaSuccess) return cuda_fail(err, "fa1: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    const int64_t slots = static_cast<int64_t>(std::max(dev.sm_count, 1)) * std::max(per_sm, 1);

    // No split over keys: FA1 walks every K/V block of a row range in one CTA.
    const int64_t nqb = ceil_div(p.seqlen_q, plan->cfg.block_m);
    plan->q_blocks_per_cta = q_blocks_per_cta(nqb, p.batch * p.heads_q, slots, p.causal);
    plan->splits = static_cast<int32_t>(ceil_div(nqb, plan->q_blocks_per_cta));
    plan->ws_rows = workspace_rows(p, plan->cfg.block_m);
    add_workspace_slices(p, plan.get());
    if (p.serving.rotary_dim > 0) plan->rotated_q = plan->workspace.add("fa1 rotated queries", rotated_q_bytes(p));
    *out = std::move(plan);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t fa1_execute(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const Fa1Plan &plan = static_cast<const Fa1Plan &>(base_plan);
    DeviceGuard scope(p.device);  // first: every CUDA call below runs on the plan's device
    if (scope.error() != cudaSuccess) return cuda_fail(scope.error(), "fa1: cudaSetDevice");
    FLASHATTN_TRY(check_device_tensors(p, t));
    const bool no_queries = p.seqlen_q == 0 || p.batch == 0 || p.heads_q == 0 || (p.varlen && p.total_q == 0);
    if (no_queries && !p.serving.appends()) return FLASHATTN_SUCCESS;  // (an append still writes the caches)

    fa1::Params prm;
    fill_tensor_args(p, t, &prm);
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    if (p.serving.appends()) {  // the shared serving pre-kernels (host/cache_append.h)
        void *q_rot = plan.rotated_q >= 0 ? plan.workspace.at<void>(t.workspace, plan.rotated_q) : nullptr;
        AppendParams a;
        fill_append_params(p, t, q_rot, &a);
        const cudaError_t aerr = fa1::launch_append(a, p.dtype == FLASHATTN_DTYPE_BF16, stream);
        if (aerr != cudaSuccess) return cuda_fail(aerr, "fa1 serving append");
        FLASHATTN_TRY(check_launch("fa1 serving append kernels"));
        if (q_rot != nullptr) use_rotated_q(p, q_rot, &prm);
    }
    if (no_queries) return FLASHATTN_SUCCESS;
    prm.o_acc = plan.workspace.at<float>(t.workspace, plan.o_acc);
    prm.ml = plan.workspace.at<float2>(t.workspace, plan.ml);
    prm.ws_rows = plan.ws_rows;
    prm.q_blocks_per_cta = plan.q_blocks_per_cta;
    prm.splits = plan.splits;
    prm.reverse = p.causal ? 1 : 0;  // bottom-right causal: the last query ranges do the most work

    const cudaError_t err = plan.kernels->launch(prm, plan.cfg.large, p.dtype == FLASHATTN_DTYPE_BF16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa1 forward kernel (setup)");
    return check_launch("fa1 forward kernel");
}

// No backward pass: FA1's kernels are forward-only (auto runs the backward on FA2 where it can).
// Of the 0.3 variants only top-left alignment (its diagonal offset, Seq::off); dispatch refuses the
// others by name (merges of its states run on fa2's kernel).
const Backend kFa1Backend = {FLASHATTN_BACKEND_FA1, "fa1", fa1_unsupported, fa1_make_plan, fa1_execute, nullptr,
                             nullptr, nullptr, nullptr, kVariantTopLeft, 0u};

}  // namespace

const Backend *fa1_backend() { return &kFa1Backend; }

}  // namespace flashattn
