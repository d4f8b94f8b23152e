// The FA2 backend object: what it supports, the schedule (tile variant, pack-GQA, split-KV count
// and workspace) and the enqueue of the forward kernel (+ the split-KV combine).
#include <algorithm>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/tensor_args.h"
#include "backends/cuda/fa2/fa2_config.h"
#include "backends/cuda/fa2/fa2_params.h"
#include "capi/error.h"
#include "dispatch/backend.h"

namespace flashattn {
namespace {

using fa2::TileConfig;

constexpr int kCompiledDims[] = {32, 64, 96, 128, 160, 192, 224, 256};
constexpr int64_t kMaxSeqlen = int64_t(1) << 28;  // keeps the int32 mask arithmetic exact
constexpr int kMaxSplits = 128;                   // the combine kernel reduces <= 128 partials
constexpr int kPackMaxSeqlenQ = 127;              // pack GQA heads while queries don't fill a tile
constexpr int64_t kSmallMaxRows = 64;             // decode-like: at most this many packed rows

int compiled_dim(int64_t d) {
    for (int k : kCompiledDims)
        if (d <= k) return k;
    return 0;
}

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// Everything about the launch that follows from the problem and the device.
struct Plan {
    int pack = 1;     // query heads packed into M (pack-GQA), else 1
    bool small = false;
    TileConfig cfg{};
};

int pack_for(const Problem &p) {
    const int64_t group = p.heads_q / p.heads_kv;
    return (group > 1 && p.seqlen_q <= kPackMaxSeqlenQ) ? static_cast<int>(group) : 1;
}

Plan plan_for(const Problem &p, size_t smem_optin) {
    Plan pl;
    pl.pack = pack_for(p);
    const int kd = compiled_dim(p.head_dim);
    const TileConfig big = fa2::prefill_config(kd);
    const bool few_rows = p.seqlen_q * pl.pack <= kSmallMaxRows;
    const bool big_fits = smem_optin == 0 || static_cast<size_t>(fa2::smem_bytes(big)) <= smem_optin;
    pl.small = (few_rows || !big_fits) && fa2::has_small_variant(fa2::small_config(kd).head_dim) &&
               fa2::small_config(kd).head_dim >= kd;
    pl.cfg = pl.small ? fa2::small_config(kd) : big;
    return pl;
}

// Execute only sees the schedule: the variant is the one whose tile shape the schedule recorded.
Plan plan_from_schedule(const Problem &p, const Schedule &s) {
    Plan pl;
    pl.pack = pack_for(p);
    const int kd = compiled_dim(p.head_dim);
    const TileConfig sm = fa2::small_config(kd);
    pl.small = fa2::has_small_variant(sm.head_dim) && sm.head_dim >= kd &&
               s.block_m == sm.block_m && s.block_n == sm.block_n &&
               !(s.block_m == fa2::prefill_config(kd).block_m &&
                 s.block_n == fa2::prefill_config(kd).block_n);
    pl.cfg = pl.small ? sm : fa2::prefill_config(kd);
    return pl;
}

int choose_splits(const Problem &p, const Plan &pl, int sm_count) {
    if (sm_count <= 0) return 1;
    const int64_t m_blocks = (p.seqlen_q * pl.pack + pl.cfg.block_m - 1) / pl.cfg.block_m;
    const int64_t heads = pl.pack > 1 ? p.heads_kv : p.heads_q;
    const int64_t base = p.batch * heads * m_blocks;
    if (base <= 0 || base * 5 >= static_cast<int64_t>(sm_count) * 4) return 1;  // >= 80% of SMs
    const int64_t n_tiles = (p.seqlen_k + pl.cfg.block_n - 1) / pl.cfg.block_n;
    const int64_t max_splits =
        std::min<int64_t>({kMaxSplits, n_tiles / 2, 65535 / std::max<int64_t>(p.batch, 1)});
    if (max_splits < 2) return 1;
    const int64_t slots = static_cast<int64_t>(sm_count) * std::max(pl.cfg.min_blocks, 1);
    auto efficiency = [&](int64_t s) {
        const int64_t blocks = base * s;
        const int64_t waves = (blocks + slots - 1) / slots;
        return static_cast<double>(blocks) / static_cast<double>(waves * slots);
    };
    double best = 0.0;
    for (int64_t s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
    for (int64_t s = 1; s <= max_splits; ++s)
        if (efficiency(s) >= 0.85 * best) return static_cast<int>(s);
    return 1;
}

size_t workspace_for(const Problem &p, int splits) {
    if (splits <= 1) return 0;
    const size_t rows = static_cast<size_t>(splits) * static_cast<size_t>(p.heads_q) *
                        static_cast<size_t>(p.total_query_rows());
    return align256(rows * static_cast<size_t>(p.head_dim) * sizeof(float)) +
           align256(rows * sizeof(float));
}

std::string fa2_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    if (!dev.present) return "the fa2 backend needs a CUDA device and none is available";
    if (dev.cc_major < 8)
        return "the fa2 backend needs compute capability 8.0 or newer (device " +
               std::to_string(dev.device) + " is " + std::to_string(dev.cc_major) + "." +
               std::to_string(dev.cc_minor) + ")";
    const std::string shape = tensor_core_shape_problem(p, "fa2");
    if (!shape.empty()) return shape;
    if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen)
        return "the fa2 backend supports sequence lengths below 2^28";
    if (p.heads_q > 65535 || p.batch > 65535)
        return "the fa2 backend supports at most 65535 heads and 65535 sequences";
    const Plan pl = plan_for(p, dev.smem_per_block_optin);
    const size_t smem = static_cast<size_t>(fa2::smem_bytes(pl.cfg));
    if (dev.smem_per_block_optin != 0 && smem > dev.smem_per_block_optin)
        return "the fa2 backend needs " + std::to_string(smem / 1024) +
               " KB of shared memory per block for head dim " + std::to_string(p.head_dim) +
               " and the device allows " + std::to_string(dev.smem_per_block_optin / 1024) + " KB";
    return std::string();
}

flashattn_status_t fa2_make_schedule(const Problem &p, const DeviceInfo &dev, Schedule *out) {
    if (out == nullptr) return fail(FLASHATTN_ERROR_INTERNAL, "fa2: no schedule to fill");
    const Plan pl = plan_for(p, dev.smem_per_block_optin);
    Schedule s;
    s.block_m = pl.cfg.block_m;
    s.block_n = pl.cfg.block_n;
    s.num_splits = choose_splits(p, pl, dev.sm_count);
    s.workspace_bytes = workspace_for(p, s.num_splits);
    *out = s;
    return FLASHATTN_SUCCESS;
}

cudaError_t launch_variant(const fa2::Params &k, const Plan &pl, bool bf16, cudaStream_t st) {
    switch (pl.cfg.head_dim) {
        case 32: return fa2::launch_fwd_hdim32(k, bf16, pl.small, st);
        case 64: return fa2::launch_fwd_hdim64(k, bf16, pl.small, st);
        case 96: return fa2::launch_fwd_hdim96(k, bf16, pl.small, st);
        case 128: return fa2::launch_fwd_hdim128(k, bf16, pl.small, st);
        case 160: return fa2::launch_fwd_hdim160(k, bf16, pl.small, st);
        case 192: return fa2::launch_fwd_hdim192(k, bf16, pl.small, st);
        case 224: return fa2::launch_fwd_hdim224(k, bf16, pl.small, st);
        case 256: return fa2::launch_fwd_hdim256(k, bf16, pl.small, st);
        default: return cudaErrorInvalidValue;
    }
}

flashattn_status_t fa2_execute(const Problem &p, const Schedule &s, const Tensors &t) {
    FLASHATTN_TRY(check_device_tensors(p, t));
    if (p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0 || (p.varlen && p.total_q == 0))
        return FLASHATTN_SUCCESS;
    const Plan pl = plan_from_schedule(p, s);
    const int splits = std::max(s.num_splits, 1);
    if (splits > 1 && (t.workspace == nullptr || t.workspace_bytes < workspace_for(p, splits)))
        return fail(FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
                    "fa2: split-KV needs %zu bytes of workspace, got %zu",
                    workspace_for(p, splits), t.workspace_bytes);

    fa2::Params k;
    fill_tensor_args(p, t, &k);
    k.pack = pl.pack;
    k.num_splits = splits;
    k.reverse_m = p.causal ? 1 : 0;

    if (splits > 1) {
        const size_t rows = static_cast<size_t>(splits) * static_cast<size_t>(p.heads_q) *
                            static_cast<size_t>(k.total_rows);
        k.o_part = static_cast<float *>(t.workspace);
        k.lse_part = reinterpret_cast<float *>(static_cast<char *>(t.workspace) +
                                               align256(rows * p.head_dim * sizeof(float)));
    }

    DeviceGuard guard(p.device);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "fa2: cudaSetDevice");
    const bool bf16 = p.dtype == FLASHATTN_DTYPE_BF16;
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    cudaError_t err = launch_variant(k, pl, bf16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa2 forward kernel setup");
    FLASHATTN_TRY(check_launch("fa2 forward kernel"));
    if (splits > 1) {
        err = fa2::launch_merge(k, bf16, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 split-KV combine");
        FLASHATTN_TRY(check_launch("fa2 split-KV combine kernel"));
    }
    return FLASHATTN_SUCCESS;
}

}  // namespace

const Backend *fa2_backend() {
    static const Backend backend{FLASHATTN_BACKEND_FA2, "fa2", fa2_unsupported_reason,
                                 fa2_make_schedule, fa2_execute, nullptr};
    return &backend;
}

}  // namespace flashattn
