// The CPU backend: FlashAttention's tiled forward pass on host memory, parallel over
// (query tile, batch, head or pack of GQA heads) work items on all cores.
//
// execute() allocates nothing but the std::thread objects: each thread (the calling one included)
// takes its scratch slot from the caller's workspace, whose one slice make_plan() laid out as
// threads x per-thread scratch (threads: the hardware threads, capped by the work items; 1 for
// problems too small to pay for starting threads). Work items are handed out through an
// atomic counter, heaviest (last, under a causal mask) query tiles first. Every item is computed
// by one thread with the same code whichever thread that is, and a row's result does not depend on
// the item (pack, tile) it falls in (cpu_kernel.cpp aligns key blocks to absolute positions), so
// results are bitwise identical from run to run and for any thread count.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "backends/cpu/cpu_backward.h"
#include "backends/cpu/cpu_fp8.h"
#include "backends/cpu/cpu_kernel.h"
#include "backends/cpu/cpu_merge.h"
#include "backends/cpu/cpu_serving.h"
#include "backends/cpu/cpu_threads.h"
#include "backends/backend.h"
#include "base/checked_math.h"
#include "base/status.h"
#include "device/device.h"

namespace flashattn {
namespace {

constexpr int32_t kMaxThreads = 1024;  // upper bound on worker threads (and workspace slots)
// Problems below this many multiply-adds run on the calling thread alone: starting threads would
// cost more than it saves.
constexpr double kSerialMacs = 1 << 20;

// What finalize decided for the CPU backend.
struct CpuPlan : BackendPlan {
    cpu::TileShape shape;
    int64_t threads = 1;   // worker threads, the calling one included
    int64_t pack = 1;      // query heads per work item (GQA packing)
    size_t slot_bytes = 0; // one thread's scratch, a multiple of kWorkspaceAlignment
    int scratch = 0;       // the workspace slice holding `threads` slots
    int rotated_q = -1;    // the slice holding Q rotated, when the plan has a rotary embedding
    bool gpu_present = false;  // then every pointer must be checked to be host memory
    cpu::BackwardPlan backward;  // laid out in backward_workspace when the backward can run
    cpu::Fp8Staging fp8;   // FP8 plans: the fp32 problem run and its copies (cpu_fp8.h)
};

cpu::TileShape choose_shape(const Problem &p) {
    // Taller query blocks amortise widening each K/V block over more rows; longer key blocks
    // amortise the per-block softmax bookkeeping. 128 x 128 while head_dim + head_dim_v <= 256
    // (at most 320 KiB of scratch per thread), 64 x 64 above (at most 272 KiB): within a
    // core's L2.
    const bool small = p.head_dim + p.head_dim_v <= 256;
    cpu::TileShape shape;
    shape.block_m = small ? 128 : 64;
    shape.block_n = small ? 128 : 64;
    static_assert(cpu::kMaxBlockM >= 128, "block_m bound");
    return shape;
}

// Work items: (query tile, batch, pack of query heads). A pack is `pack` query heads sharing one
// key/value head, their rows interleaved into one tile (see cpu::Slice) so that each K/V block is
// widened once for all of them. Varlen: tiles of the longest sequence; items past a shorter
// sequence's end do nothing.
// Varlen: sized by `rows`, the longest real sequence (execute reads it from cu_seqlens).
// make_plan has checked that the largest product, seqlen_q x heads_q, fits in int64.
int64_t tiles_per_sequence(int64_t rows, int block_m, int64_t pack) {
    return (rows * pack + block_m - 1) / block_m;
}

// Work items of a pass over `tiles` query tiles per sequence, or -1 when the count overflows.
int64_t work_items(const Problem &p, int64_t tiles, int64_t pack) {
    int64_t items;
    return mul_add(tiles, p.batch, 0, &items) && mul_add(items, p.heads_q / pack, 0, &items) ? items : -1;
}

// Heads per pack: the whole GQA group when one head's query rows do not fill a tile (decode,
// short prompts), halved while that would leave some thread without an item; 1 otherwise.
int64_t choose_pack(const Problem &p, int block_m, int64_t threads) {
    const int64_t group = p.group_size();
    if (group <= 1 || p.seqlen_q >= block_m) return 1;
    int64_t pack = group;
    while (pack % 2 == 0 &&
           work_items(p, tiles_per_sequence(p.seqlen_q, block_m, pack), pack) < threads) {
        pack /= 2;
    }
    return pack;
}

std::string cpu_unsupported_reason(const Problem &p, const DeviceInfo &) {
    if (p.fp8()) return cpu::fp8_unsupported_reason(p);
    return cpu::unsupported_reason(p);
}

// Worker threads: the hardware threads, or FLASHATTN_CPU_THREADS=n (read at finalize; tests run
// several counts through it, results do not depend on it), capped by the work items; 1 for
// problems too small to pay for starting threads (unless the variable asks for more).
int64_t choose_threads(const Problem &p, int64_t items) {
    const char *env = std::getenv("FLASHATTN_CPU_THREADS");
    const long forced = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
    const unsigned hw = std::thread::hardware_concurrency();
    int64_t threads = forced >= 1 ? forced : (hw == 0 ? 1 : static_cast<int64_t>(hw));
    threads = std::min<int64_t>(threads, kMaxThreads);
    threads = std::min<int64_t>(threads, std::max<int64_t>(items, 1));
    const double macs = static_cast<double>(p.batch) * static_cast<double>(p.heads_q) *
                        static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_k) *
                        static_cast<double>(p.head_dim + p.head_dim_v);
    return macs < kSerialMacs && forced < 1 ? 1 : threads;
}

flashattn_status_t cpu_make_plan(const Problem &fp8_or_p, const DeviceInfo &dev, std::unique_ptr<BackendPlan> *out) {
    auto plan = std::make_unique<CpuPlan>();
    // An FP8 plan is planned and run as the fp32 problem of its dequantized copies.
    if (fp8_or_p.fp8()) plan->fp8.staged = cpu::fp8_staged_problem(fp8_or_p);
    const Problem &p = fp8_or_p.fp8() ? plan->fp8.staged : fp8_or_p;
    plan->shape = choose_shape(p);
    // Every count execute forms must fit in int64: the rows of all packed heads of the longest
    // sequence, and the work items of both passes (batch x heads x tiles).
    int64_t packed_rows;
    const int64_t items = work_items(p, tiles_per_sequence(p.seqlen_q, plan->shape.block_m, 1), 1);
    if (!mul_add(p.seqlen_q, p.heads_q, plan->shape.block_m, &packed_rows) || items < 0 ||
        !cpu::backward_work_fits(p))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_I64_BATCH: %lld sequences x %lld heads x %lld rows of work overflow 64 bits on the CPU backend",
                    (long long)p.batch, (long long)p.heads_q, (long long)p.seqlen_q);
    plan->threads = choose_threads(p, items);
    plan->pack = choose_pack(p, plan->shape.block_m, plan->threads);
    plan->slot_bytes = align_up(cpu::scratch_bytes(p, plan->shape), kWorkspaceAlignment);
    plan->scratch = plan->workspace.add("cpu per-thread scratch", static_cast<size_t>(plan->threads) * plan->slot_bytes);
    if (p.serving.rotary_dim > 0) plan->rotated_q = plan->workspace.add("cpu rotated queries", cpu::rotated_q_bytes(p));
    if (fp8_or_p.fp8()) FLASHATTN_TRY(cpu::plan_fp8(fp8_or_p, &plan->workspace, &plan->fp8));
    plan->gpu_present = dev.present;
    if (!fp8_or_p.fp8() && cpu::backward_unsupported_reason(p).empty())
        plan->backward = cpu::plan_backward(p, plan->threads, &plan->backward_workspace);
    *out = std::move(plan);
    return FLASHATTN_SUCCESS;
}

// On a machine with a GPU, a device pointer handed to the CPU backend would crash the host loops.
flashattn_status_t check_host_memory(const Tensors &t) {
    const struct { const void *ptr; const char *name; } all[] = {
        {t.q, "q"}, {t.k, "k"}, {t.v, "v"}, {t.o, "o"}, {t.lse, "lse"},
        {t.cu_seqlens_q, "cu_seqlens_q"}, {t.cu_seqlens_k, "cu_seqlens_k"}, {t.workspace, "workspace"},
        {t.dout, "dout"}, {t.dq, "dq"}, {t.dk, "dk"}, {t.dv, "dv"},
        {t.sink_logits, "sink_logits"}, {t.alibi_slopes, "alibi_slopes"}, {t.dsink_logits, "dsink_logits"},
        {t.page_table, "page_table"}, {t.seqused_k, "seqused_k"}, {t.k_new, "k_new"}, {t.v_new, "v_new"},
        {t.rotary_cos, "rotary_cos"}, {t.rotary_sin, "rotary_sin"},
        {t.descale_q, "descale_q"}, {t.descale_k, "descale_k"}, {t.descale_v, "descale_v"}};
    for (const auto &a : all) {
        int32_t owner = -1;
        if (a.ptr != nullptr && memory_kind(a.ptr, &owner) == MemoryKind::device)
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: device memory, but the plan runs on the CPU backend", a.name);
    }
    return FLASHATTN_SUCCESS;
}

// The host-visible rules of one cu_seqlens array (see flashattn_plan_execute_varlen()).
// On success *longest is the longest sequence's length.
flashattn_status_t check_cu_seqlens(const char *name, const int32_t *cu, int64_t batch,
                                    int64_t total, const char *total_name, int64_t max_len,
                                    const char *max_name, int64_t *longest) {
    if (cu == nullptr) {
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL; a variable-length plan needs it",
                    name);
    }
    if (cu[0] != 0) {
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[0] is %" PRId32 "; it must be 0", name,
                    cu[0]);
    }
    int64_t longest_seen = 0;
    for (int64_t i = 0; i < batch; ++i) {
        const int64_t len = static_cast<int64_t>(cu[i + 1]) - cu[i];
        longest_seen = std::max(longest_seen, len);
        if (len < 0) {
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s[%d] is %" PRId32 ", less than %s[%d] = %" PRId32
                        "; the prefix sums must never decrease",
                        name, static_cast<int>(i + 1), cu[i + 1], name, static_cast<int>(i), cu[i]);
        }
        if (len > max_len) {
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s[%d] - %s[%d] = %" PRId64 " exceeds %s = %" PRId64
                        "; no sequence may be longer than %s",
                        name, static_cast<int>(i + 1), name, static_cast<int>(i), len, max_name,
                        max_len, max_name);
        }
    }
    if (cu[batch] != total) {
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "%s[%d] is %" PRId32 " but %s is %" PRId64 "; the last entry must equal %s", name,
                    static_cast<int>(batch), cu[batch], total_name, total, total_name);
    }
    *longest = longest_seen;
    return FLASHATTN_SUCCESS;
}

// Sequence b's keys for key/value head kvh: where row 0 is, the strides, through the page table
// when paged, and how many keys the sequence has.
void set_keys(const Problem &p, const Tensors &t, int64_t b, int64_t kvh, cpu::Slice *sl) {
    const int64_t es = static_cast<int64_t>(p.element_size());
    const bool paged = p.serving.paged;
    const int64_t k_off = paged ? kvh * p.k.head : cpu::cache_offset(p, t, p.k, b, 0, kvh);
    const int64_t v_off = paged ? kvh * p.v.head : cpu::cache_offset(p, t, p.v, b, 0, kvh);
    sl->k = static_cast<const unsigned char *>(t.k) + k_off * es;
    sl->v = static_cast<const unsigned char *>(t.v) + v_off * es;
    sl->k_row = p.k.row;
    sl->v_row = p.v.row;
    sl->seqlen_k = cpu::keys_of_sequence(p, t, b);
    if (paged) {
        sl->pages = t.page_table + b * p.serving.page_table_stride;
        sl->page_size = p.serving.page_size;
        sl->k_page = p.k.batch;
        sl->v_page = p.v.batch;
    }
}

struct Job {
    const Problem *p;
    const Tensors *t;
    cpu::TileShape shape;
    int64_t pack;   // query heads per item
    int64_t tiles;  // (packed) query tiles per sequence
    int64_t units;  // batch x heads_q / pack
    int64_t items;
    size_t elem;
    unsigned char *workspace;
    size_t slot_bytes;
    const unsigned char *rotated_q = nullptr;  // with a rotary embedding: Q rotated (cpu_serving.h)
    std::atomic<int64_t> next{0};
};

void run_item(const Job &job, int64_t item, void *scratch) {
    const Problem &p = *job.p;
    const Tensors &t = *job.t;
    const int64_t heads = p.heads_q;
    const int64_t packs = heads / job.pack;  // packs per sequence
    const int64_t tile = job.tiles - 1 - item / job.units;
    const int64_t unit = item % job.units;
    const int64_t b = unit / packs;
    const int64_t h = (unit % packs) * job.pack;  // first query head of the pack
    const int64_t kvh = h / p.group_size();
    const int64_t es = static_cast<int64_t>(job.elem);

    cpu::Slice sl;
    int64_t q_off, o_off;  // in elements, of row 0 of this (sequence, head)
    int64_t q_start;       // the sequence's first row in Q (all sequences' rows counted)
    if (p.varlen) {
        q_start = t.cu_seqlens_q[b];
        sl.seqlen_q = t.cu_seqlens_q[b + 1] - q_start;
        q_off = q_start * p.q.row + h * p.q.head;
        o_off = q_start * p.o.row + h * p.o.head;
        if (t.lse) sl.lse = t.lse + h * p.total_q + q_start;
        sl.lse_head = p.total_q;
    } else {
        q_start = b * p.seqlen_q;
        sl.seqlen_q = p.seqlen_q;
        q_off = b * p.q.batch + h * p.q.head;
        o_off = b * p.o.batch + h * p.o.head;
        if (t.lse) sl.lse = t.lse + (b * heads + h) * p.seqlen_q;
        sl.lse_head = p.seqlen_q;
    }
    set_keys(p, t, b, kvh, &sl);
    const int64_t packed_rows = sl.seqlen_q * job.pack;
    const int64_t row0 = tile * job.shape.block_m;
    if (row0 >= packed_rows) return;
    const int64_t rows = std::min<int64_t>(job.shape.block_m, packed_rows - row0);

    sl.q = static_cast<const unsigned char *>(t.q) + q_off * es;
    sl.q_row = p.q.row;
    sl.q_head = p.q.head;
    if (job.rotated_q != nullptr) {  // the rotated copy: [rows][heads_q][head_dim]
        sl.q_head = p.head_dim;
        sl.q_row = p.heads_q * p.head_dim;
        sl.q = job.rotated_q + (q_start * sl.q_row + h * sl.q_head) * es;
    }
    sl.o = static_cast<unsigned char *>(t.o) + o_off * es;
    sl.o_row = p.o.row;
    sl.o_head = p.o.head;
    sl.heads = job.pack;
    if (t.sink_logits != nullptr) sl.sink = t.sink_logits + h;
    if (t.alibi_slopes != nullptr) sl.alibi = t.alibi_slopes + h;
    cpu::run_tile(p, job.shape, sl, row0, rows, scratch);
}

void worker(Job *job, size_t slot) noexcept {
    void *scratch = job->workspace + slot * job->slot_bytes;
    for (;;) {
        const int64_t item = job->next.fetch_add(1, std::memory_order_relaxed);
        if (item >= job->items) break;
        run_item(*job, item, scratch);
    }
}

// What the host can check of a call before reading the tensors: memory kinds, then cu_seqlens.
// *rows_q: the longest query sequence (seqlen_q unless varlen), which sizes the work.
flashattn_status_t check_host_call(const Problem &p, const CpuPlan &plan, const Tensors &t, int64_t *rows_q) {
    if (plan.gpu_present) FLASHATTN_TRY(check_host_memory(t));
    *rows_q = p.seqlen_q;
    if (p.varlen) {
        int64_t rows_k;
        FLASHATTN_TRY(check_cu_seqlens("cu_seqlens_q", t.cu_seqlens_q, p.batch, p.total_q,
                                       "total_q", p.seqlen_q, "seqlen_q", rows_q));
        if (!p.serving.paged)  // a paged plan's keys are not packed
            FLASHATTN_TRY(check_cu_seqlens("cu_seqlens_k", t.cu_seqlens_k, p.batch, p.total_k,
                                           "total_k", p.seqlen_k, "seqlen_k", &rows_k));
    }
    return cpu::check_serving_call(p, t);
}

flashattn_status_t run_forward(const Problem &p, const CpuPlan &plan, const Tensors &t, int64_t rows_q) {
    Job job;
    job.p = &p;
    job.t = &t;
    job.shape = plan.shape;
    job.pack = plan.pack;
    job.tiles = tiles_per_sequence(rows_q, plan.shape.block_m, job.pack);
    job.units = p.batch * (p.heads_q / job.pack);
    job.items = job.tiles * job.units;
    job.elem = p.element_size();
    job.slot_bytes = plan.slot_bytes;
    job.workspace = plan.workspace.at<unsigned char>(t.workspace, plan.scratch);
    // Serving: the new rows go into the caches first, then Q is rotated, then attention reads both.
    if (p.serving.appends()) cpu::append_rows(p, t);
    if (plan.rotated_q >= 0) {
        unsigned char *rotated = plan.workspace.at<unsigned char>(t.workspace, plan.rotated_q);
        cpu::rotate_queries(p, t, rotated);
        job.rotated_q = rotated;
    }
    if (job.items <= 0) return FLASHATTN_SUCCESS;
    const int64_t threads = std::min<int64_t>(plan.threads, job.items);

    cpu::run_on_threads(threads, [&job](size_t slot) { worker(&job, slot); });
    return FLASHATTN_SUCCESS;
}

flashattn_status_t execute_impl(const Problem &p, const CpuPlan &plan, const Tensors &t) {
    int64_t rows_q;
    FLASHATTN_TRY(check_host_call(p, plan, t, &rows_q));
    if (!plan.fp8.on) return run_forward(p, plan, t, rows_q);
    // FP8: dequantize into the workspace, run the fp32 problem there, round O into the caller's.
    FLASHATTN_TRY(cpu::check_fp8_descales(p, t));
    const Tensors staged = cpu::stage_fp8_inputs(p, plan.fp8, plan.workspace, t);
    FLASHATTN_TRY(run_forward(plan.fp8.staged, plan, staged, rows_q));
    cpu::write_fp8_output(p, plan.fp8, plan.workspace, t);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t cpu_execute(const Problem &p, const BackendPlan &plan, const Tensors &t) {
    try {
        return execute_impl(p, static_cast<const CpuPlan &>(plan), t);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception: %s", e.what());
    } catch (...) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception");
    }
}

std::string cpu_backward_unsupported_reason(const Problem &p, const DeviceInfo &) {
    if (p.fp8()) return "the cpu backend has no backward pass for FP8 (E4M3) inputs";
    return cpu::backward_unsupported_reason(p);
}

flashattn_status_t cpu_execute_backward(const Problem &p, const BackendPlan &base_plan, const Tensors &t) {
    const CpuPlan &plan = static_cast<const CpuPlan &>(base_plan);
    try {
        int64_t rows_q;
        FLASHATTN_TRY(check_host_call(p, plan, t, &rows_q));
        return cpu::run_backward(p, plan.backward, plan.backward_workspace, t);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend (backward): unexpected exception: %s", e.what());
    } catch (...) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend (backward): unexpected exception");
    }
}

// flashattn_plan_merge_states on the host (cpu_merge.cpp does the arithmetic).
flashattn_status_t cpu_merge_states(const Problem &p, const DeviceInfo &dev, const MergeCall &m) {
    if (dev.present) {
        Tensors t;  // every pointer of the call, checked to be host memory
        t.o = m.o;
        t.lse = m.lse;
        FLASHATTN_TRY(check_host_memory(t));
        for (int s = 0; s < m.num_partials; ++s) {
            int32_t owner = -1;
            if (memory_kind(m.partial_o[s], &owner) == MemoryKind::device ||
                memory_kind(m.partial_lse[s], &owner) == MemoryKind::device)
                return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                            "partial %d: device memory, but the plan runs on the CPU backend", s);
        }
    }
    try {
        cpu::merge_states(p, m);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend (merge): unexpected exception: %s", e.what());
    }
    return FLASHATTN_SUCCESS;
}

constexpr unsigned kAllVariants =
    kVariantTopLeft | kVariantSinkTokens | kVariantSinkLogits | kVariantAlibi | kVariantHeadDimV;

}  // namespace

const Backend *cpu_backend() {
    static const Backend backend = {FLASHATTN_BACKEND_CPU, "cpu", cpu_unsupported_reason,
                                    cpu_make_plan, cpu_execute, nullptr,
                                    cpu_backward_unsupported_reason, cpu_execute_backward,
                                    cpu_merge_states, kAllVariants, kAllVariants};
    return &backend;
}

}  // namespace flashattn
