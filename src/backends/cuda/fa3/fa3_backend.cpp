// The FA3 backend object (Hopper, sm_90a): what it supports, its schedule, the TMA descriptors of
// each execute and the launch.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "backends/backend.h"
#include "backends/cuda/fa3/fa3_append.h"
#include "backends/cuda/fa3/fa3_bwd_host.h"
#include "backends/cuda/fa3/fa3_config.h"
#include "backends/cuda/fa3/fa3_fp8_params.h"
#include "backends/cuda/fa3/fa3_params.h"
#include "backends/cuda/fa3/fa3_schedule.h"
#include "backends/cuda/host/cuda_host.h"
#include "backends/cuda/host/tensor_args.h"
#include "backends/cuda/host/tensor_map.h"
#include "base/checked_math.h"
#include "base/status.h"

namespace flashattn {
namespace {

constexpr int64_t kMaxSeqlen = int64_t(1) << 28;  // keeps the int32 mask and TMA coordinates exact
constexpr int64_t kMaxStrideBytes = int64_t(1) << 40;
constexpr int64_t kDecodeRows = 64;  // at most this many query rows: fa2's split-KV path is faster

// One row per compiled forward kernel (fa3_head_dims.h: the square X rows, then the P rows with
// V of its own width): its head dim, V width and launcher.
struct CompiledHeadDim {
    int head_dim, head_dim_v;
    fa3::LaunchFwd launch;
};
#define FLASHATTN_FA3_ROW(D) {D, D, fa3::launch_fwd_hdim##D},
#define FLASHATTN_FA3_PAIR_ROW(D, DV) {D, DV, fa3::launch_fwd_hdim##D##x##DV},
constexpr CompiledHeadDim kHeadDims[] = {FLASHATTN_FA3_HEAD_DIMS(FLASHATTN_FA3_ROW)
                                             FLASHATTN_FA3_HEAD_DIM_PAIRS(FLASHATTN_FA3_PAIR_ROW)};
#undef FLASHATTN_FA3_PAIR_ROW
#undef FLASHATTN_FA3_ROW
#define FLASHATTN_FA3_CHECK(D) static_assert(fa3::config_for(D).head_dim == D, "fa3_config.h has no tile for head dim " #D);
FLASHATTN_FA3_HEAD_DIMS(FLASHATTN_FA3_CHECK)
#undef FLASHATTN_FA3_CHECK
#define FLASHATTN_FA3_PAIR_CHECK(D, DV)                                                                  \
    static_assert(D != DV && D % 64 == 0 && DV % 64 == 0 &&                                              \
                      fa3::smem_bytes(fa3::config_for(D, DV)) <= fa3::kMaxSmemBytes,                      \
                  "fa3_head_dims.h: P(" #D ", " #DV ") must be two different multiples of 64 whose tile fits");
FLASHATTN_FA3_HEAD_DIM_PAIRS(FLASHATTN_FA3_PAIR_CHECK)
#undef FLASHATTN_FA3_PAIR_CHECK

// The compiled kernel that runs (head_dim, head_dim_v): the cheapest row holding both (fewest
// D + DV: the GEMMs' width), the columns past them zeros. Every pair up to 256 has one (the square
// 256 holds all: nullptr only past what tensor_core_shape_problem accepts); a square problem runs
// its square row (any other row holding it is wider).
const CompiledHeadDim *kernel_for(const Problem &p) {
    const CompiledHeadDim *best = nullptr;
    for (const CompiledHeadDim &row : kHeadDims)
        if (row.head_dim >= p.head_dim && row.head_dim_v >= p.head_dim_v &&
            (best == nullptr || row.head_dim + row.head_dim_v < best->head_dim + best->head_dim_v))
            best = &row;
    return best;
}

// The tile of kernel_for's row (called after tensor_core_shape_problem: the row exists).
fa3::TileConfig tile_for(const Problem &p) {
    const CompiledHeadDim *k = kernel_for(p);
    return k != nullptr ? fa3::config_for(k->head_dim, k->head_dim_v) : fa3::config_for(256);
}

// Everything execute needs, decided at finalize. The FA3 forward needs no workspace.
struct Fa3Plan : BackendPlan {
    fa3::TileConfig cfg{};  // compiled head dim and keys per K/V tile
    fa3::LaunchFwd launch = nullptr;
    int num_ctas = 1;       // persistent grid size
    int section = 1;        // causal schedule: (head, sequence) pairs per L2 section
    int alibi_gemm = 1;     // fa3::Params::alibi_gemm (FLASHATTN_FA3_ALIBI_GEMM=0: 0)
    int wide_tile = 0;      // fa3::Params::wide_tile: cfg is the row's wide key tile (wide_tile_wins)
    int sink_narrow = 1;    // fa3::Params::sink_narrow (FLASHATTN_FA3_SINK_NARROW=0: 0)
    fa3::BwdPlan backward;  // laid out in backward_workspace when the backward can run
    int rotated_q = -1;     // with a rotary append: Q rotated by the pre-kernel (host/cache_append.h)
    fa3::LaunchFp8Fwd launch_fp8 = nullptr;  // FP8 plans: the E4M3 kernel
};

// Why TMA cannot describe one input tensor of `rows` x `heads` x `batch` rows, or empty. A
// dimension of extent 1 never uses its stride (the tensor map gets a filler); every other stride
// must be a positive multiple of 16 bytes below 2^40.
std::string tma_stride_problem(const char *name, const Strides &s, int64_t rows, int64_t heads, int64_t batch,
                               int64_t elem_bytes = 2) {
    const int64_t align = 16 / elem_bytes;  // elements per 16 bytes
    const struct {
        const char *what;
        int64_t stride, extent;
    } dims[] = {{"row", s.row, rows}, {"head", s.head, heads}, {"batch", s.batch, batch}};
    for (const auto &d : dims) {
        if (d.extent <= 1) continue;
        if (d.stride <= 0 || d.stride % align != 0 || d.stride * elem_bytes >= kMaxStrideBytes)
            return std::string("the fa3 backend loads ") + name + " with TMA, which needs its " + d.what +
                   " stride to be a positive multiple of " + std::to_string(align) + " elements (16 bytes) below 2^" +
                   (elem_bytes == 2 ? "39" : "40") + " (got " + std::to_string(d.stride) + ")";
    }
    return std::string();
}

// Paged caches and seqused_k take the gathering producer (fa3_gather.cuh, Params::gather).
bool uses_gather(const Problem &p) { return p.serving.paged || p.serving.seqused_k; }

// What the FP8 (E4M3) kernel (issue 17, fa3_fp8_kernel.cuh) does not do (yet), or empty. Runs
// instead of tensor_core_shape_problem, so fa3 (and auto on sm_90) takes FP8 plans.
std::string fp8_shape_problem(const Problem &p) {
    if (p.o_dtype != FLASHATTN_DTYPE_BF16 && p.o_dtype != FLASHATTN_DTYPE_FP16)
        return "the fa3 FP8 kernel writes O in bf16 or fp16 only";
    if (p.head_dim_v != p.head_dim)
        return "the fa3 FP8 kernel needs head_dim_v equal to head_dim (got " + std::to_string(p.head_dim) + " and " +
               std::to_string(p.head_dim_v) + ")";
    if (p.head_dim < 16 || p.head_dim > 256 || p.head_dim % 16 != 0)
        return "the fa3 FP8 kernel supports head dims 16..256 in multiples of 16 (got " + std::to_string(p.head_dim) + ")";
    if (p.sink_logits) return "the fa3 FP8 kernel does not take sink logits (FLASHATTN_I64_SINK_LOGITS) yet";
    if (p.sink_tokens > 0) return "the fa3 FP8 kernel does not take sink tokens (FLASHATTN_I64_SINK_TOKENS) yet";
    if (p.alibi) return "the fa3 FP8 kernel does not take ALiBi (FLASHATTN_I64_ALIBI) yet";
    if (p.serving.any()) return "the fa3 FP8 kernel does not take a paged cache, seqused_k or appends yet";
    return std::string();
}

std::string fa3_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    if (!dev.present) return "the fa3 backend needs a CUDA device and none is available";
    if (dev.cc_major != 9 || dev.cc_minor != 0)
        return "the fa3 backend runs only on compute capability 9.0 (Hopper; device " + std::to_string(dev.device) +
               " is " + std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) + ")";
    const bool fp8 = p.fp8();
    const std::string shape = fp8 ? fp8_shape_problem(p) : tensor_core_shape_problem(p, "fa3", true);
    if (!shape.empty()) return shape;
    if (p.seqlen_q >= kMaxSeqlen || p.seqlen_k >= kMaxSeqlen || p.total_q >= kMaxSeqlen || p.total_k >= kMaxSeqlen)
        return "the fa3 backend supports sequence lengths (and varlen totals) below 2^28";
    int64_t tiles;  // checked: a varlen batch may be as large as int64 allows
    if (!mul_add(ceil_div(p.seqlen_q, fa3::kBlockM), p.heads_q, 0, &tiles) || !mul_add(tiles, p.batch, 0, &tiles) ||
        tiles >= (int64_t(1) << 31))
        return "the fa3 backend schedules at most 2^31 - 1 query tiles (128 rows x heads x sequences)";
    const int64_t batch = p.batch_extent();
    if (fp8) {  // no gather, rotary or head_dim_v != head_dim (fp8_shape_problem); one byte per element
        for (const std::string &why : {tma_stride_problem("q", p.q, p.q_rows(), p.heads_q, batch, 1),
                                       tma_stride_problem("k", p.k, p.k_rows(), p.heads_kv, batch, 1),
                                       tma_stride_problem("v", p.v, p.k_rows(), p.heads_kv, batch, 1)})
            if (!why.empty()) return why;
        return std::string();  // its shared memory (at most 226 KB) is checked at compile time
    }
    // A gathering plan (paged, seqused_k) loads K and V with cp.async: 16-byte aligned rows are
    // enough there, which check_device_tensors enforces at execute. An append's rotated Q is a
    // contiguous copy in the workspace.
    const bool gather = uses_gather(p);
    // The gathering producer and the variants' key walk / V width were written side by side and
    // never tested together: refused until a test runs them.
    if (gather && (p.sink_tokens > 0 || p.alibi || p.head_dim_v != p.head_dim))
        return std::string("the fa3 backend runs ") +
               (p.sink_tokens > 0 ? "sink tokens (FLASHATTN_I64_SINK_TOKENS)" : p.alibi ? "ALiBi (FLASHATTN_I64_ALIBI)" : "head_dim_v != head_dim") +
               " without a paged cache or seqused_k (FLASHATTN_I64_PAGED_KV, FLASHATTN_I64_SEQUSED_K) only";
    if (p.sink_tokens > 0 && tile_for(p).head_dim >= 256)
        return "the fa3 backend runs sink tokens (FLASHATTN_I64_SINK_TOKENS) up to head dim 192 (its head dim 256 "
               "kernel has no registers left for them); fa2 and the cpu backend run them there";
    for (const std::string &why : {p.serving.rotary_dim > 0 ? std::string()
                                                          : tma_stride_problem("q", p.q, p.q_rows(), p.heads_q, batch),
                                   gather ? std::string() : tma_stride_problem("k", p.k, p.k_rows(), p.heads_kv, batch),
                                   gather ? std::string() : tma_stride_problem("v", p.v, p.k_rows(), p.heads_kv, batch)})
        if (!why.empty()) return why;
    const size_t smem = static_cast<size_t>(fa3::kernel_smem_bytes(tile_for(p)));
    if (dev.smem_per_block_optin != 0 && smem > dev.smem_per_block_optin)
        return "the fa3 backend needs " + std::to_string(smem / 1024) + " KB of shared memory per block and the device allows " +
               std::to_string(dev.smem_per_block_optin / 1024) + " KB";
    return std::string();
}

// The backward: the forward's conditions (TMA reads Q, K, V again), dO's strides (TMA too), then
// the backward kernels' own (fa3_bwd_host.cpp).
std::string fa3_backward_unsupported_reason(const Problem &p, const DeviceInfo &dev) {
    if (p.fp8()) return "the fa3 backend has no FP8 backward pass";
    std::string why = fa3_unsupported_reason(p, dev);
    if (why.empty()) why = tma_stride_problem("dout", p.dout, p.q_rows(), p.heads_q, p.batch_extent());
    if (why.empty()) why = fa3::backward_unsupported_reason(p, dev);
    return why;
}

// Auto passes fa3 over for decode-shaped problems: it has no split-KV path, fa2's is faster there.
// And, for now, for every serving plan (paged, seqused_k, append): the gathering producer runs
// when fa3 is forced (test_serving_fa3), but it has not been timed against fa2 yet.
std::string fa3_auto_pass_reason(const Problem &p, const DeviceInfo &) {
    if (p.serving.any())
        return "fa3's serving path (paged K/V and seqused_k through its cp.async gathering producer) is not yet "
               "measured against fa2's; auto runs serving plans on fa2 (force fa3 to use it)";
    if (p.seqlen_q <= kDecodeRows && p.seqlen_k > 4 * kDecodeRows)
        return "fa3 has no split-KV path; for " + std::to_string(p.seqlen_q) +
               " query rows per sequence fa2's is faster";
    return std::string();
}

// Test hook: FLASHATTN_FA3_MAX_CTAS=n caps the persistent grid at n CTAs, so that every CTA walks
// many tiles (the ring and Q-buffer phases across tiles, skipped and key-less tiles in between),
// and the causal L2 sections at n pairs (several sections, the last one narrower). Read once.
int test_cta_limit() {
    static const int limit = [] {
        const char *env = std::getenv("FLASHATTN_FA3_MAX_CTAS");
        const long v = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
        return v > 0 && v < INT32_MAX ? static_cast<int>(v) : INT32_MAX;
    }();
    return limit;
}

// Whether a square head-dim row with a wide key tile (fa3_config.h has_wide_tile: head dim 64, 176
// keys) runs it: rows long enough that the per-tile costs it saves outweigh its partly filled last
// tile and, causal, its wider masked diagonal tiles (measured: from 2k keys non-causal, from 4k
// causal; level to 0.99x at 1k non-causal, 0.84-0.96x causal up to 2k). Not with a sliding window
// (few keys per row) nor for the gathering producer (paged, seqused_k: not measured there).
// FLASHATTN_FA3_WIDE_TILE=0 / 1 (tests, A/B): never / wherever compiled.
bool wide_tile_wins(const Problem &p, const fa3::TileConfig &cfg) {
    if (!fa3::has_wide_tile(cfg.head_dim) || cfg.head_dim_v != cfg.head_dim) return false;
    const char *knob = std::getenv("FLASHATTN_FA3_WIDE_TILE");
    if (knob != nullptr && (knob[0] == '0' || knob[0] == '1') && knob[1] == '\0') return knob[0] == '1';
    if (uses_gather(p) || p.window_left >= 0 || p.window_right >= 0) return false;
    return p.seqlen_k >= (p.causal ? 4096 : 2048);
}

flashattn_status_t fa3_make_plan(const Problem &p, const DeviceInfo &dev, std::unique_ptr<BackendPlan> *out) {
    auto plan = std::make_unique<Fa3Plan>();
    if (p.fp8()) {  // the E4M3 kernel (fa3_fp8_kernel.cuh)
        const int kd = fa3::fp8_compiled_head_dim(static_cast<int>(p.head_dim));
        plan->launch_fp8 = kd == 64 ? fa3::launch_fp8_fwd_hdim64 : kd == 128 ? fa3::launch_fp8_fwd_hdim128 : fa3::launch_fp8_fwd_hdim256;
        const int block_n = kd == 64 ? fa3::fp8_block_n_hdim64() : kd == 128 ? fa3::fp8_block_n_hdim128() : fa3::fp8_block_n_hdim256();
        plan->cfg = fa3::TileConfig{kd, block_n};  // (block_n: the K / V boxes' rows)
        plan->num_ctas = std::max(1, std::min(dev.sm_count, test_cta_limit()));
        plan->section = fa3::causal_section(p, dev.l2_bytes, plan->num_ctas, block_n, test_cta_limit());
        *out = std::move(plan);
        return FLASHATTN_SUCCESS;
    }
    const CompiledHeadDim *kernel = kernel_for(p);
    if (kernel == nullptr)
        return fail(FLASHATTN_ERROR_INTERNAL, "fa3: no compiled kernel for head dims %lld / %lld",
                    static_cast<long long>(p.head_dim), static_cast<long long>(p.head_dim_v));
    plan->cfg = fa3::config_for(kernel->head_dim, kernel->head_dim_v);
    if (wide_tile_wins(p, plan->cfg)) {
        plan->cfg = fa3::wide_config_for(kernel->head_dim);
        plan->wide_tile = 1;
    }
    plan->launch = kernel->launch;
    plan->num_ctas = std::max(1, std::min(dev.sm_count, test_cta_limit()));  // one persistent CTA per SM at most
    plan->section = fa3::causal_section(p, dev.l2_bytes, plan->num_ctas, plan->cfg.block_n, test_cta_limit());
    plan->alibi_gemm = knob_off("FLASHATTN_FA3_ALIBI_GEMM") ? 0 : 1;
    plan->sink_narrow = knob_off("FLASHATTN_FA3_SINK_NARROW") ? 0 : 1;
    if (fa3_backward_unsupported_reason(p, dev).empty()) plan->backward = fa3::plan_backward(p, dev.sm_count, &plan->backward_workspace);
    if (p.serving.rotary_dim > 0) plan->rotated_q = plan->workspace.add("fa3 rotated queries", rotated_q_bytes(p));
    *out = std::move(plan);
    return FLASHATTN_SUCCESS;
}

// The last tensor map this thread encoded for one of Q, K, V, with everything it was encoded from.
// A map is a pure function of those inputs, so an equal request reuses it: a serving loop or a
// benchmark passes the same buffers call after call, and three encodes were a large part of FA3's
// host time per execute. Per thread, so concurrent executes share nothing.
struct CachedMap {
    bool valid = false;
    TmaElement el = TmaElement::fp16;
    const void *base = nullptr;
    uint64_t dims[4] = {}, strides[3] = {};
    uint32_t box[4] = {};
    CUtensorMap map;
};

flashattn_status_t encode_cached(CachedMap *c, CUtensorMap *out, TmaElement el, const void *base,
                                 const uint64_t (&dims)[4], const uint64_t (&strides)[3], const uint32_t (&box)[4]) {
    const bool same = c->valid && c->el == el && c->base == base && std::equal(dims, dims + 4, c->dims) &&
                      std::equal(strides, strides + 3, c->strides) && std::equal(box, box + 4, c->box);
    if (!same) {
        c->valid = false;
        FLASHATTN_TRY(encode_tensor_map_sw128(&c->map, el, base, 4, dims, strides, box));
        c->el = el;
        c->base = base;
        std::copy(dims, dims + 4, c->dims);
        std::copy(strides, strides + 3, c->strides);
        std::copy(box, box + 4, c->box);
        c->valid = true;
    }
    *out = c->map;
    return FLASHATTN_SUCCESS;
}

// One rank-4 map {head_dim, rows, heads, batch}: 128-byte boxes (64 16-bit or 128 E4M3 columns)
// of `box_rows` rows. Extent-1
// dimensions get a filler stride (unused, but the encoder checks it). `slot`: 0, 1, 2 for Q, K, V
// of the forward, 3..6 for Q, K, V, dO of the backward, 7 for the forward's O. `cols`: the tensor's head dim (head_dim_v
// for V); the kernel's boxes past it arrive as zeros.
flashattn_status_t encode_map(int slot, CUtensorMap *out, TmaElement el, const void *base, const Problem &p,
                              const Strides &s, int64_t rows, int64_t heads, int box_rows, int64_t cols) {
    thread_local CachedMap cache[8];
    const int64_t batch = p.batch_extent();
    const uint64_t eb = static_cast<uint64_t>(tma_element_bytes(el));
    const uint64_t row_bytes = static_cast<uint64_t>(s.row) * eb;
    const uint64_t filler = (static_cast<uint64_t>(cols) * eb + 15) / 16 * 16 * 16;
    const uint64_t dims[4] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows),
                              static_cast<uint64_t>(heads), static_cast<uint64_t>(batch)};
    const uint64_t strides[3] = {rows > 1 ? row_bytes : filler, heads > 1 ? static_cast<uint64_t>(s.head) * eb : filler,
                                 batch > 1 ? static_cast<uint64_t>(s.batch) * eb : filler};
    const uint32_t box[4] = {static_cast<uint32_t>(128 / eb), static_cast<uint32_t>(box_rows), 1, 1};
    return encode_cached(&cache[slot], out, el, base, dims, strides, box);
}

// Whether the 16-bit forward stores O with TMA (fa3_epilogue.cuh store_output_tma, Params::o_tma):
// the kernel has the O staging and TMA can describe O (strides as for the inputs, a 16-byte
// aligned base). Otherwise the kernel stores O from its registers, as before: never a refusal.
bool o_by_tma(const Problem &p, const fa3::TileConfig &cfg, const void *o) {
    return fa3::o_staged(cfg) && reinterpret_cast<uintptr_t>(o) % 16 == 0 &&
           tma_stride_problem("o", p.o, p.q_rows(), p.heads_q, p.batch_extent()).empty();
}

// The serving append (issue 18): the new K/V rows into the caches and, with a rotary embedding,
// Q rotated into the workspace, from which the Q tensor map is then encoded (host/cache_append.h).
flashattn_status_t enqueue_append(const Problem &p, const Fa3Plan &plan, const Tensors &t, cudaStream_t stream,
                                  fa3::Params *k) {
    void *q_rot = plan.rotated_q >= 0 ? plan.workspace.at<void>(t.workspace, plan.rotated_q) : nullptr;
    AppendParams a;
    fill_append_params(p, t, q_rot, &a);
    const cudaError_t err = fa3::launch_append(a, p.dtype == FLASHATTN_DTYPE_BF16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa3 serving append");
    FLASHATTN_TRY(check_launch("fa3 serving append kernels"));
    if (q_rot != nullptr) use_rotated_q(p, q_rot, k);
    return FLASHATTN_SUCCESS;
}

// The FP8 forward: E4M3 maps (128-column boxes), the descales, the E4M3 kernel.
flashattn_status_t fa3_execute_fp8(const Problem &p, const Fa3Plan &plan, const Tensors &t) {
    fa3::Fp8Params k;
    fill_tensor_args(p, t, &k);
    k.reverse_m = p.causal ? 1 : 0;
    k.descale_q = t.descale_q;
    k.descale_k = t.descale_k;
    k.descale_v = t.descale_v;
    k.descale_bs = p.descale_batch_stride;
    k.descale_hs = p.descale_head_stride;
    const TmaElement el = TmaElement::e4m3;
    const int64_t rows_k = p.k_rows();
    const bool no_keys = rows_k == 0;
    fa3::TensorMaps maps;
    FLASHATTN_TRY(encode_map(0, &maps.q, el, t.q, p, p.q, p.q_rows(), p.heads_q, fa3::kBlockM, p.head_dim));
    FLASHATTN_TRY(encode_map(1, &maps.k, el, no_keys ? t.q : t.k, p, p.k, no_keys ? 1 : rows_k, p.heads_kv, plan.cfg.block_n, p.head_dim));
    FLASHATTN_TRY(encode_map(2, &maps.v, el, no_keys ? t.q : t.v, p, p.v, no_keys ? 1 : rows_k, p.heads_kv, plan.cfg.block_n, p.head_dim));
    k.num_ctas = plan.num_ctas;
    k.section = plan.section;
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    const cudaError_t err = plan.launch_fp8(k, maps, p.o_dtype == FLASHATTN_DTYPE_BF16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa3 FP8 forward kernel setup");
    return check_launch("fa3 FP8 forward kernel");
}

flashattn_status_t fa3_execute(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const Fa3Plan &plan = static_cast<const Fa3Plan &>(base_plan);
    // First, with the context current: the tensor maps are encoded through the driver, which
    // failed with CUresult 201 (no current context) on a thread that had never used CUDA.
    DeviceGuard guard(p.device, /*need_context=*/true);
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "fa3: cudaSetDevice");
    FLASHATTN_TRY(check_device_tensors(p, t));
    const bool no_queries = p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0 || (p.varlen && p.total_q == 0);
    if (no_queries && !p.serving.appends()) return FLASHATTN_SUCCESS;  // (an append still writes the caches)
    if (plan.launch_fp8 != nullptr) return fa3_execute_fp8(p, plan, t);  // (FP8 plans have no appends)
    fa3::Params k;
    fill_tensor_args(p, t, &k);
    k.reverse_m = p.causal ? 1 : 0;
    const bool gather = uses_gather(p);
    k.gather = gather ? 1 : 0;
    if (p.serving.paged) {
        k.page_table = t.page_table;
        k.page_table_stride = p.serving.page_table_stride;
        k.page_size = static_cast<int32_t>(p.serving.page_size);
    }
    const cudaStream_t stream = reinterpret_cast<cudaStream_t>(t.stream);
    if (p.serving.appends()) FLASHATTN_TRY(enqueue_append(p, plan, t, stream, &k));
    if (no_queries) return FLASHATTN_SUCCESS;

    const TmaElement el = p.dtype == FLASHATTN_DTYPE_BF16 ? TmaElement::bf16 : TmaElement::fp16;
    const int64_t rows_k = p.k_rows();
    fa3::TensorMaps maps;
    Strides qs = p.q;  // the caller's Q, or the rotated copy (use_rotated_q)
    qs.batch = k.q_bs, qs.row = k.q_rs, qs.head = k.q_hs;
    FLASHATTN_TRY(encode_map(0, &maps.q, el, k.q, p, qs, p.q_rows(), p.heads_q, fa3::kBlockM, p.head_dim));
    // No keys at all, or a gathering plan (no K/V TMA): the kernel loads no K/V box, but the maps
    // still need a valid base and extent.
    if (rows_k == 0 || gather) {
        maps.k = maps.q;
        maps.v = maps.q;
    } else {
        FLASHATTN_TRY(encode_map(1, &maps.k, el, t.k, p, p.k, rows_k, p.heads_kv, plan.cfg.block_n, p.head_dim));
        FLASHATTN_TRY(encode_map(2, &maps.v, el, t.v, p, p.v, rows_k, p.heads_kv, plan.cfg.block_n, p.head_dim_v));
    }

    maps.o = maps.q;
    if (o_by_tma(p, plan.cfg, t.o)) {
        FLASHATTN_TRY(encode_map(7, &maps.o, el, t.o, p, p.o, p.q_rows(), p.heads_q, 64, p.head_dim_v));
        k.o_tma = 1;
    }

    k.num_ctas = plan.num_ctas;
    k.section = plan.section;
    k.alibi_gemm = plan.alibi_gemm;
    k.wide_tile = plan.wide_tile;
    k.sink_narrow = plan.sink_narrow;
    const cudaError_t err = plan.launch(k, maps, p.dtype == FLASHATTN_DTYPE_BF16, stream);
    if (err != cudaSuccess) return cuda_fail(err, "fa3 forward kernel setup");
    return check_launch("fa3 forward kernel");
}

flashattn_status_t fa3_execute_backward(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const Fa3Plan &plan = static_cast<const Fa3Plan &>(base_plan);
    DeviceGuard guard(p.device, /*need_context=*/true);  // first: the maps are encoded through the driver
    if (guard.error() != cudaSuccess) return cuda_fail(guard.error(), "fa3 backward: cudaSetDevice");
    FLASHATTN_TRY(check_device_tensors(p, t));
    if (p.heads_q == 0) return FLASHATTN_SUCCESS;
    const TmaElement el = p.dtype == FLASHATTN_DTYPE_BF16 ? TmaElement::bf16 : TmaElement::fp16;
    // Without queries or keys the main kernel loads nothing from the empty side, but every map
    // needs a valid base and extent: the other side's tensor stands in.
    const bool no_q = p.batch == 0 || p.q_rows() == 0, no_k = p.batch == 0 || p.k_rows() == 0;
    if (no_q && no_k) return zero_sink_gradient(p, t, "fa3");  // no rows: the sink logits' gradient is 0
    fa3::BwdMaps maps;
    FLASHATTN_TRY(encode_map(3, &maps.q, el, no_q ? t.k : t.q, p, no_q ? p.k : p.q, no_q ? 1 : p.q_rows(),
                             no_q ? p.heads_kv : p.heads_q, fa3::kBwdBM, p.head_dim));
    FLASHATTN_TRY(encode_map(6, &maps.dout, el, no_q ? t.k : t.dout, p, no_q ? p.k : p.dout, no_q ? 1 : p.q_rows(),
                             no_q ? p.heads_kv : p.heads_q, fa3::kBwdBM, no_q ? p.head_dim : p.head_dim_v));
    FLASHATTN_TRY(encode_map(4, &maps.k, el, no_k ? t.q : t.k, p, no_k ? p.q : p.k, no_k ? 1 : p.k_rows(),
                             no_k ? p.heads_q : p.heads_kv, plan.backward.block_n, p.head_dim));
    FLASHATTN_TRY(encode_map(5, &maps.v, el, no_k ? t.q : t.v, p, no_k ? p.q : p.v, no_k ? 1 : p.k_rows(),
                             no_k ? p.heads_q : p.heads_kv, plan.backward.block_n, no_k ? p.head_dim : p.head_dim_v));
    return fa3::run_backward(p, plan.backward, plan.backward_workspace, t, maps);
}

}  // namespace

const Backend *fa3_backend() {
    // The backward (issue 16) runs every head dim (136..256 on its 256 kernel since stop 21;
    // dispatch's kFa3BackwardUnderAuto can keep auto on fa2's everywhere).
    static const Backend backend{FLASHATTN_BACKEND_FA3, "fa3", fa3_unsupported_reason, fa3_make_plan,
                                 fa3_execute, fa3_auto_pass_reason, fa3_backward_unsupported_reason,
                                 fa3_execute_backward, nullptr,
                                 kVariantTopLeft | kVariantSinkLogits | kVariantAlibi | kVariantSinkTokens | kVariantHeadDimV,
                                 kVariantTopLeft | kVariantSinkLogits | kVariantAlibi | kVariantSinkTokens | kVariantHeadDimV};  // merges run on fa2's kernel (dispatch)
    return &backend;
}

}  // namespace flashattn
