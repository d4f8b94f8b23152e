// The FA2 backend object: what it supports, its plan (tile variant, pack-GQA, split-KV count and
// the workspace of the split partials) and the enqueue of the forward kernel (+ the split-KV combine).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "backends/backend.h"
#include "backends/cuda/fa2/fa2_append.h"
#include "backends/cuda/fa2/fa2_bwd_host.h"
#include "backends/cuda/fa2/fa2_config.h"
#include "backends/cuda/fa2/fa2_fold.h"
#include "backends/cuda/fa2/fa2_params.h"
#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/tensor_map.h"
#include "backends/cuda/host/tensor_args.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace {

using fa2::TileConfig;

// One row per compiled head dim (fa2_head_dims.h): its launcher.
struct CompiledHeadDim {
    int head_dim;
    fa2::LaunchFwd launch;
};
#define FLASHATTN_FA2_ROW(D) {D, fa2::launch_fwd_hdim##D},
constexpr CompiledHeadDim kHeadDims[] = {FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_ROW)};
#undef FLASHATTN_FA2_ROW
#define FLASHATTN_FA2_CHECK(D) static_assert(fa2::prefill_config(D).head_dim == D, "fa2_config.h has no tile for head dim " #D);
FLASHATTN_FA2_HEAD_DIMS(FLASHATTN_FA2_CHECK)
#undef FLASHATTN_FA2_CHECK
constexpr int64_t kMaxSeqlen = int64_t(1) << 28;  // keeps the int32 mask arithmetic exact
constexpr int kMaxSplits = 128;                   // the combine kernel reduces <= 128 partials
constexpr int kPackMaxSeqlenQ = 127;              // pack GQA heads while queries don't fill a tile
constexpr int64_t kSmallMaxRows = 64;             // decode-like: at most this many packed rows

// The compiled head dim that runs `d` (callers have checked d <= 256).
const CompiledHeadDim &compiled_for(int64_t d) {
    for (const CompiledHeadDim &row : kHeadDims)
        if (d <= row.head_dim) return row;
    return kHeadDims[sizeof kHeadDims / sizeof kHeadDims[0] - 1];
}

// The tile variant and GQA packing, from the problem and the device's shared memory.
struct Variant {
    int pack = 1;     // query heads packed into M (pack-GQA), else 1
    bool small = false;
    TileConfig cfg{};
};

// Everything execute needs, decided at finalize.
struct Fa2Plan : BackendPlan {
    Variant variant;
    fa2::LaunchFwd launch = nullptr;
    // num_splits (BackendPlan): the split-KV factor; > 1 adds the two partial slices and the combine
    int o_part = -1;    // workspace slices of the split partials (when splits > 1)
    int lse_part = -1;
    int rotated_q = -1;  // with a rotary append: Q rotated by the pre-kernel (fa2_append.h)
    // sm_90+: the kernels after the first of an execute (attention after the append, the combine
    // after the attention) are programmatic dependent launches (cuda/device/pdl.cuh).
    bool pdl = false;
    // sm_90, paged decode tiles with pages of a multiple of 16 keys: K/V by TMA (paged_tma_plan)
    bool paged_tma = false;
    bool warp_combine = false;  // the split combine as one warp per row (fa2::warp_combine_fits)
    int fold_words = -1;  // workspace slice of the decode tiles' arrival words when they combine (fold_plan)
    fa2::BwdPlan backward;  // laid out in backward_workspace when the backward can run
};

int pack_for(const Problem &p) {
    const int64_t group = p.heads_q / p.heads_kv;
    return (group > 1 && p.seqlen_q <= kPackMaxSeqlenQ) ? static_cast<int>(group) : 1;
}

Variant variant_for(const Problem &p, size_t smem_optin) {
    Variant pl;
    pl.pack = pack_for(p);
    // head_dim_v != head_dim: the kernel of the wider one; the narrower tensor's columns past its
    // own dim load as zeros (they add nothing to Q K^T, and give O columns that are not stored).
    const int kd = compiled_for(std::max(p.head_dim, p.head_dim_v)).head_dim;
    const TileConfig big = fa2::prefill_config(kd);
    const bool few_rows = p.seqlen_q * pl.pack <= kSmallMaxRows;
    const bool big_fits = smem_optin == 0 || static_cast<size_t>(fa2::smem_bytes(big)) <= smem_optin;
    pl.small = (few_rows || !big_fits) && fa2::has_small_variant(fa2::small_config(kd).head_dim) &&
               fa2::small_config(kd).head_dim >= kd;
    pl.cfg = pl.small ? fa2::small_config(kd) : big;
    return pl;
}

// The split-KV factor FLASHATTN_I64_NUM_SPLITS asked for, within what the kernels take: at most
// kMaxSplits partials, one key tile per split, 65535 grid z.
int forced_splits(const Problem &p, const Variant &pl) {
    const int64_t n_tiles = std::max<int64_t>(1, (p.seqlen_k + pl.cfg.block_n - 1) / pl.cfg.block_n);
    const int64_t limit = std::min<int64_t>({kMaxSplits, n_tiles, 65535 / std::max<int64_t>(p.batch, 1)});
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(p.num_splits, limit)));
}

// The forward grid's CTAs per split (fa2_tile_scheduler.cuh fwd_grid: query tiles x grid heads x
// sequences): what the split count multiplies, and the decode tiles' arrival words (fold_plan).
int64_t ctas_per_split(const Problem &p, const Variant &pl) {
    const int64_t m_blocks = (p.seqlen_q * pl.pack + pl.cfg.block_m - 1) / pl.cfg.block_m;
    return p.batch * (pl.pack > 1 ? p.heads_kv : p.heads_q) * m_blocks;
}

// The fewest splits whose wave efficiency (CTAs over the resident slots of the waves they take,
// at min_blocks CTAs per SM) is within 85 % of the best: fewer, longer splits cost less in the
// combine (29 at b 1 on 132 SMs, 4 at b 8). The decode tiles first take the fewest splits that
// fill one wave to 95 % of the best, when there are such (32 at b 1, still 4 at b 8): the sm_90
// paged TMA walk's rate is its CTAs' (~16 GB/s each at d 128, alike at b 1 and b 8), so it wants
// every slot of the wave (32 splits: 1.04-1.08x 29 at b 1), while the contiguous decode reaches
// DRAM's rate either way (29 or 32: within 1 %). Paged and contiguous plans of one shape must split
// alike for their results to stay bitwise equal (test_serving), so the rule does not look at
// pages. docs/kernel-notes.md, "Decode speed", seventh pass.
int choose_splits(const Problem &p, const Variant &pl, int sm_count) {
    if (p.num_splits > 0) return forced_splits(p, pl);
    if (sm_count <= 0) return 1;
    const int64_t base = ctas_per_split(p, pl);
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
    if (fa2::is_decode_tile(pl.cfg))
        for (int64_t s = 1; s <= max_splits && base * s <= slots; ++s)
            if (efficiency(s) >= 0.95 * best) return static_cast<int>(s);
    for (int64_t s = 1; s <= max_splits; ++s)
        if (efficiency(s) >= 0.85 * best) return static_cast<int>(s);
    return 1;
}

std::string fa2_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    if (!dev.present) return "the fa2 backend needs a CUDA device and none is available";
    if (dev.cc_major < 8)
        return "the fa2 backend needs compute capability 8.0 or newer (device " +
               std::to_string(dev.device) + " is " + std::to_string(dev.cc_major) + "." +
               std::to_string(dev.cc_minor) + ")";
    const std::string shape = tensor_core_shape_problem(p, "fa2", true);
    if (!shape.empty()) return shape;
    if (p.head_dim_v != p.head_dim && p.serving.appends())
        return "the fa2 backend appends to the K/V cache (FLASHATTN_I64_NEW_KV_ROWS) only with head_dim_v equal to head_dim";
    if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen)
        return "the fa2 backend supports sequence lengths below 2^28";
    if (p.heads_q > 65535 || p.batch > 65535)
        return "the fa2 backend supports at most 65535 heads and 65535 sequences";
    const Variant pl = variant_for(p, dev.smem_per_block_optin);
    if (p.serving.paged && (p.sink_tokens > 0 || p.alibi || p.head_dim_v != p.head_dim))
        return std::string("the fa2 backend runs ") +
               (p.sink_tokens > 0 ? "sink tokens (FLASHATTN_I64_SINK_TOKENS)" : p.alibi ? "ALiBi (FLASHATTN_I64_ALIBI)" : "head_dim_v != head_dim") +
               " with a contiguous K/V cache only, not a paged one (FLASHATTN_I64_PAGED_KV)";
    const size_t smem = static_cast<size_t>(fa2::smem_bytes(pl.cfg));
    if (dev.smem_per_block_optin != 0 && smem > dev.smem_per_block_optin)
        return "the fa2 backend needs " + std::to_string(smem / 1024) +
               " KB of shared memory per block for head dim " + std::to_string(p.head_dim) +
               " and the device allows " + std::to_string(dev.smem_per_block_optin / 1024) + " KB";
    return std::string();
}

// The split partials: [splits][heads_q][rows][head_dim_v] outputs and [splits][heads_q][rows] LSEs.
void add_split_slices(const Problem &p, Fa2Plan *plan) {
    const size_t rows = static_cast<size_t>(plan->num_splits) * static_cast<size_t>(p.heads_q) *
                        static_cast<size_t>(p.total_query_rows());
    plan->o_part = plan->workspace.add("fa2 split-KV partial outputs", rows * static_cast<size_t>(p.head_dim_v) * sizeof(float));
    plan->lse_part = plan->workspace.add("fa2 split-KV partial LSE", rows * sizeof(float));
}

// Whether the paged decode tiles load K/V by TMA boxes (fa2_params.h, kv_tma; fa2_mainloop.cuh,
// load_paged_tma): sm_90 and up (the kernel's sm_90 code decides again: other targets gather),
// the decode tile at its compiled head dim (64 or 128: whole 64-column boxes), and pages of a
// multiple of 16 keys that do not hold whole key tiles (those keep the per-tile base shift).
// FLASHATTN_FA2_PAGED_TMA=0 keeps the cp.async gather (a developer's knob for A/B runs and tests).
bool paged_tma_plan(const Problem &p, const DeviceInfo &dev, const Variant &v) {
    if (!p.serving.paged || dev.cc_major < 9 || !fa2::is_decode_tile(v.cfg)) return false;
    if (p.head_dim != v.cfg.head_dim || p.head_dim % 64 != 0 || p.head_dim_v != p.head_dim) return false;
    const int64_t ps = p.serving.page_size;
    if (ps % 16 != 0 || ps % v.cfg.block_n == 0 || ps > (int64_t{1} << 31)) return false;
    // A tensor map's strides are multiples of 16 bytes: check_device_tensors holds the rows and heads
    // (and the pointers) to that, but not the page stride when the queries are varlen.
    if (p.k.batch % 8 != 0 || p.v.batch % 8 != 0) return false;
    return !knob_off("FLASHATTN_FA2_PAGED_TMA");
}

// The split-KV decode tiles combine their own rows (fa2_epilogue.cuh, fold_split_combine) where
// the warp combine would run: the step saves the combine kernel's launch and its wait for the
// whole attention grid. One 8-byte arrival word per (query tile, grid head, sequence), i.e. per
// CTA of one split. FLASHATTN_FA2_FOLD=0 keeps the combine kernel (A/B runs, tests).
void fold_plan(const Problem &p, Fa2Plan *plan) {
    if (plan->num_splits <= 1 || plan->num_splits > fa2::kFoldMaxSplits || !plan->warp_combine ||
        !fa2::is_decode_tile(plan->variant.cfg))
        return;
    if (knob_off("FLASHATTN_FA2_FOLD")) return;
    const int64_t words = ctas_per_split(p, plan->variant);
    plan->fold_words = plan->workspace.add("fa2 split-KV fold arrival words", static_cast<size_t>(words) * 8);
}

// A new arrival tag per execute (fa2_params.h, fold_tag): 56 bits from a process-wide counter
// whose start mixes the clock and an address, so that neither an earlier execute nor another
// process's leftovers in a reused workspace are likely to carry the same tag.
unsigned long long next_fold_tag() {
    static std::atomic<unsigned long long> next{
        (static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         reinterpret_cast<uintptr_t>(&next)) * 0x9E3779B97F4A7C15ull};
    return next.fetch_add(1, std::memory_order_relaxed) & fa2::kFoldTagMask;
}

flashattn_status_t fa2_make_plan(const Problem &p, const DeviceInfo &dev, std::unique_ptr<BackendPlan> *out) {
    auto plan = std::make_unique<Fa2Plan>();
    plan->variant = variant_for(p, dev.smem_per_block_optin);
    plan->launch = compiled_for(plan->variant.cfg.head_dim).launch;  // a small tile may be a wider head dim
    plan->num_splits = choose_splits(p, plan->variant, dev.sm_count);
    // FLASHATTN_FA2_PDL=0: the kernels after an execute's first as ordinary stream-ordered launches.
    plan->pdl = dev.cc_major >= 9 && !knob_off("FLASHATTN_FA2_PDL");
    plan->paged_tma = paged_tma_plan(p, dev, plan->variant);
    if (plan->num_splits > 1) add_split_slices(p, plan.get());
    // FLASHATTN_FA2_WARP_COMBINE=0: the CTA-per-row combine at every split count.
    plan->warp_combine = fa2::warp_combine_fits(plan->num_splits, p.total_query_rows() * p.heads_q) &&
                         !knob_off("FLASHATTN_FA2_WARP_COMBINE");
    fold_plan(p, plan.get());
    if (p.serving.rotary_dim > 0)
        plan->rotated_q = plan->workspace.add("fa2 rotated queries", rotated_q_bytes(p));
    if (fa2::backward_unsupported_reason(p, dev).empty())
        plan->backward = fa2::plan_backward(p, dev, &plan->backward_workspace);
    *out = std::move(plan);
    return FLASHATTN_SUCCESS;
}

// The serving append (issue 18): the new K/V rows into the caches and, with a rotary embedding,
// Q rotated into the workspace, which the attention kernel then reads (host/cache_append.h); in
// the decode tiles the attention kernel rotates Q itself (no workspace slice: q_rot is null).
flashattn_status_t enqueue_append(const Problem &p, const Fa2Plan &plan, const Tensors &t, cudaStream_t stream,
                                  fa2::Params *k) {
    void *q_rot = plan.rotated_q >= 0 ? plan.workspace.at<void>(t.workspace, plan.rotated_q) : nullptr;
    AppendParams a;
    fill_append_params(p, t, q_rot, &a);
    const cudaError_t err = fa2::launch_append(a, p.dtype == FLASHATTN_DTYPE_BF16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa2 serving append");
    FLASHATTN_TRY(check_launch("fa2 serving append kernels"));
    if (q_rot != nullptr) use_rotated_q(p, q_rot, k);
    return FLASHATTN_SUCCESS;
}

// The paged K and V tensor maps (fa2::PagedTmaMaps): rank 4 {head_dim, page_size, heads_kv,
// num_pages}, boxes of 16 rows x 64 columns. The last map per cache and thread is kept: a decode
// loop encodes once. A cache whose strides a tensor map cannot take (byte strides not multiples of
// 16) is not planned for it (paged_tma_plan).
struct PagedMapCache {
    bool valid = false;
    bool bf16 = false;
    const void *base = nullptr;
    uint64_t dims[4] = {}, strides[3] = {};
    CUtensorMap map;
};

flashattn_status_t encode_paged_map(PagedMapCache *c, CUtensorMap *out, bool bf16, const void *base, const Problem &p,
                                    int64_t rs, int64_t hs, int64_t ps_stride) {
    const uint64_t filler = static_cast<uint64_t>(p.head_dim) * 2 * 16;  // stride of an extent-1 dim
    const uint64_t dims[4] = {static_cast<uint64_t>(p.head_dim), static_cast<uint64_t>(p.serving.page_size),
                              static_cast<uint64_t>(p.heads_kv), static_cast<uint64_t>(p.serving.num_pages)};
    const uint64_t strides[3] = {static_cast<uint64_t>(rs) * 2, p.heads_kv > 1 ? static_cast<uint64_t>(hs) * 2 : filler,
                                 p.serving.num_pages > 1 ? static_cast<uint64_t>(ps_stride) * 2 : filler};
    const uint32_t box[4] = {64, 16, 1, 1};
    const bool same = c->valid && c->bf16 == bf16 && c->base == base && std::equal(dims, dims + 4, c->dims) &&
                      std::equal(strides, strides + 3, c->strides);
    if (!same) {
        c->valid = false;
        FLASHATTN_TRY(encode_tensor_map_sw128(&c->map, bf16 ? TmaElement::bf16 : TmaElement::fp16, base, 4, dims,
                                              strides, box));
        c->bf16 = bf16;
        c->base = base;
        std::copy(dims, dims + 4, c->dims);
        std::copy(strides, strides + 3, c->strides);
        c->valid = true;
    }
    *out = c->map;
    return FLASHATTN_SUCCESS;
}

// maps: the caller's, alive until the launch (k->tma_maps points at it).
flashattn_status_t set_paged_tma(const Problem &p, fa2::PagedTmaMaps *maps, fa2::Params *k) {
    thread_local PagedMapCache cache[2];
    const bool bf16 = p.dtype == FLASHATTN_DTYPE_BF16;
    FLASHATTN_TRY(encode_paged_map(&cache[0], &maps->k, bf16, k->k, p, k->k_rs, k->k_hs, k->k_bs));
    FLASHATTN_TRY(encode_paged_map(&cache[1], &maps->v, bf16, k->v, p, k->v_rs, k->v_hs, k->v_bs));
    k->kv_tma = 1;
    k->tma_maps = maps;
    return FLASHATTN_SUCCESS;
}

flashattn_status_t fa2_execute(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const Fa2Plan &plan = static_cast<const Fa2Plan &>(base_plan);
    // First, with the context current where tensor maps are encoded (cuTensorMapEncodeTiled needs one).
    DeviceGuard guard(p.device, /*need_context=*/plan.paged_tma);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "fa2: cudaSetDevice");
    FLASHATTN_TRY(check_device_tensors(p, t));
    const bool no_queries = p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0 || (p.varlen && p.total_q == 0);
    if (no_queries && !p.serving.appends()) return FLASHATTN_SUCCESS;  // (an append still writes the caches)

    fa2::Params k;
    fa2::PagedTmaMaps maps;  // (set_paged_tma)
    fill_tensor_args(p, t, &k);
    k.pack = plan.variant.pack;
    k.num_splits = plan.num_splits;
    k.reverse_m = p.causal ? 1 : 0;
    if (p.serving.paged) {
        k.page_table = t.page_table;
        k.page_table_stride = p.serving.page_table_stride;
        k.page_size = static_cast<int32_t>(p.serving.page_size);
        if (plan.paged_tma && !no_queries) FLASHATTN_TRY(set_paged_tma(p, &maps, &k));
    }
    if (plan.num_splits > 1) {
        k.o_part = plan.workspace.at<float>(t.workspace, plan.o_part);
        k.lse_part = plan.workspace.at<float>(t.workspace, plan.lse_part);
    }
    if (plan.fold_words >= 0) {
        k.fold_count = plan.workspace.at<unsigned long long>(t.workspace, plan.fold_words);
        k.fold_tag = next_fold_tag();
    }

    const bool bf16 = p.dtype == FLASHATTN_DTYPE_BF16;
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    if (p.serving.appends()) FLASHATTN_TRY(enqueue_append(p, plan, t, stream, &k));
    if (no_queries) return FLASHATTN_SUCCESS;
    k.launch_pdl = plan.pdl && p.serving.appends() ? 1 : 0;
    cudaError_t err = plan.launch(k, bf16, plan.variant.small, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa2 forward kernel setup");
    FLASHATTN_TRY(check_launch("fa2 forward kernel"));
    if (plan.num_splits > 1 && plan.fold_words < 0) {
        err = fa2::launch_merge(k, bf16, plan.warp_combine, plan.pdl, stream);
        if (err != cudaSuccess) return cuda_fail(err, "fa2 split-KV combine");
        FLASHATTN_TRY(check_launch("fa2 split-KV combine kernel"));
    }
    return FLASHATTN_SUCCESS;
}

flashattn_status_t fa2_execute_backward(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const Fa2Plan &plan = static_cast<const Fa2Plan &>(base_plan);
    return fa2::run_backward(p, plan.backward, plan.backward_workspace, t);
}

// flashattn_plan_merge_states for a plan of any GPU generation (dispatch.cpp picks this one).
flashattn_status_t fa2_merge_states(const Problem &p, const DeviceInfo &, const MergeCall &m) {
    DeviceGuard guard(p.device);  // first: every CUDA call below runs on the plan's device
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "merge: cudaSetDevice");
    Tensors out;  // device residency and alignment of every pointer, with the plan's O strides
    out.o = m.o;
    out.lse = m.lse;
    FLASHATTN_TRY(check_device_tensors(p, out));
    for (int s = 0; s < m.num_partials; ++s) {
        Tensors part;
        part.o = const_cast<void *>(m.partial_o[s]);
        part.lse = const_cast<float *>(m.partial_lse[s]);
        FLASHATTN_TRY(check_device_tensors(p, part));
    }
    if (p.heads_q > 65535 || p.batch > 65535)
        return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "plan: the merge kernel supports at most 65535 heads and sequences");
    fa2::MergeParams k;
    k.num_partials = m.num_partials;
    for (int s = 0; s < m.num_partials; ++s) {
        k.o_part[s] = m.partial_o[s];
        k.lse_part[s] = m.partial_lse[s];
    }
    k.batch = static_cast<int32_t>(p.batch_extent());
    k.rows = static_cast<int32_t>(p.q_rows());
    k.heads = static_cast<int32_t>(p.heads_q);
    k.head_dim = static_cast<int32_t>(p.head_dim_v);
    k.p_bs = p.varlen ? 0 : p.o.batch;
    k.p_rs = p.o.row;
    k.p_hs = p.o.head;
    k.o_bs = k.p_bs, k.o_rs = k.p_rs, k.o_hs = k.p_hs;
    k.l_bs = p.varlen ? 0 : p.heads_q * p.seqlen_q;
    k.l_hs = p.q_rows();
    k.lse_bs = k.l_bs, k.lse_hs = k.l_hs;
    k.o = m.o;
    k.lse = m.lse;
    if (k.rows == 0) return FLASHATTN_SUCCESS;
    const fa2::MergeInput in = m.partial_dtype == FLASHATTN_DTYPE_FP32   ? fa2::MergeInput::fp32
                               : m.partial_dtype == FLASHATTN_DTYPE_BF16 ? fa2::MergeInput::bf16
                                                                         : fa2::MergeInput::fp16;
    const cudaError_t err = fa2::launch_merge_states(k, in, p.dtype == FLASHATTN_DTYPE_BF16,
                                                     reinterpret_cast<cudaStream_t>(m.stream));
    if (err != cudaSuccess) return cuda_fail(err, "merge of partial states");
    return check_launch("merge of partial states kernel");
}

}  // namespace

const Backend *fa2_backend() {
    static const Backend backend{FLASHATTN_BACKEND_FA2, "fa2", fa2_unsupported_reason,
                                 fa2_make_plan, fa2_execute, nullptr,
                                 fa2::backward_unsupported_reason, fa2_execute_backward,
                                 fa2_merge_states, kVariantTopLeft | kVariantSinkLogits | kVariantAlibi | kVariantSinkTokens | kVariantHeadDimV,
                                 kVariantTopLeft | kVariantSinkLogits | kVariantAlibi | kVariantSinkTokens | kVariantHeadDimV};
    return &backend;
}

}  // namespace flashattn
