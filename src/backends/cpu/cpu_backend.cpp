// The CPU backend: FlashAttention's tiled forward pass on host memory, parallel over
// (query tile, batch, head or pack of GQA heads) work items on all cores.
//
// execute() allocates nothing but the std::thread objects: each thread (the calling one included)
// carves its scratch out of the caller's workspace, whose size make_schedule() fixed as
// cpu_threads x per-thread scratch (cpu_threads: the hardware threads, capped by the work items;
// 1 for problems too small to pay for starting threads). Work items are handed out through an
// atomic counter, heaviest (last, under a causal mask) query tiles first. Every item is computed
// by one thread with the same code whichever thread that is, so results are bit-identical from run
// to run.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>

#include "backends/cpu/cpu_kernel.h"
#include "capi/error.h"
#include "dispatch/backend.h"

namespace flashattn {
namespace {

constexpr size_t kSlotAlign = 256;     // per-thread scratch slots start on 256-byte boundaries
constexpr int32_t kMaxThreads = 1024;  // upper bound on worker threads (and workspace slots)
// Problems below this many multiply-adds run on the calling thread alone: starting threads would
// cost more than it saves.
constexpr double kSerialMacs = 1 << 20;

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

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
int64_t tiles_per_sequence(const Problem &p, int block_m, int64_t pack) {
    return (p.seqlen_q * pack + block_m - 1) / block_m;
}

// Heads per pack: the whole GQA group when one head's query rows do not fill a tile (decode,
// short prompts), halved while that would leave some thread without an item; 1 otherwise.
int64_t choose_pack(const Problem &p, int block_m, int64_t threads) {
    const int64_t group = p.group_size();
    if (group <= 1 || p.seqlen_q >= block_m) return 1;
    int64_t pack = group;
    while (pack % 2 == 0 &&
           tiles_per_sequence(p, block_m, pack) * p.batch * (p.heads_q / pack) < threads) {
        pack /= 2;
    }
    return pack;
}

std::string cpu_unsupported_reason(const Problem &p, const DeviceInfo &) {
    switch (p.dtype) {
    case FLASHATTN_DTYPE_FP32:
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16:
        break;
    case FLASHATTN_DTYPE_FP8_E4M3:
        return "the CPU backend does not support FP8 (E4M3) tensors; use fp16, bf16 or fp32";
    default:
        return "the CPU backend supports only fp16, bf16 and fp32 tensors";
    }
    if (p.head_dim < 1 || p.head_dim_v < 1) {
        return "the CPU backend needs head_dim and head_dim_v of at least 1";
    }
    return std::string();
}

flashattn_status_t cpu_make_schedule(const Problem &p, const DeviceInfo &, Schedule *out) {
    const cpu::TileShape shape = choose_shape(p);
    const int64_t items = tiles_per_sequence(p, shape.block_m, 1) * p.batch * p.heads_q;

    unsigned hw = std::thread::hardware_concurrency();
    int64_t threads = hw == 0 ? 1 : static_cast<int64_t>(hw);
    threads = std::min<int64_t>(threads, kMaxThreads);
    threads = std::min<int64_t>(threads, std::max<int64_t>(items, 1));
    const double macs = static_cast<double>(p.batch) * static_cast<double>(p.heads_q) *
                        static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_k) *
                        static_cast<double>(p.head_dim + p.head_dim_v);
    if (macs < kSerialMacs) threads = 1;

    Schedule s;
    s.num_splits = 1;
    s.cpu_threads = static_cast<int32_t>(threads);
    s.block_m = shape.block_m;
    s.block_n = shape.block_n;
    s.workspace_bytes = static_cast<size_t>(threads) * round_up(cpu::scratch_bytes(p, shape), kSlotAlign);
    *out = s;
    return FLASHATTN_SUCCESS;
}

// The host-visible rules of one cu_seqlens array (see flashattn_plan_execute_varlen()).
flashattn_status_t check_cu_seqlens(const char *name, const int32_t *cu, int64_t batch,
                                    int64_t total, const char *total_name, int64_t max_len,
                                    const char *max_name) {
    if (cu == nullptr) {
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL; a variable-length plan needs it",
                    name);
    }
    if (cu[0] != 0) {
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[0] is %" PRId32 "; it must be 0", name,
                    cu[0]);
    }
    for (int64_t i = 0; i < batch; ++i) {
        const int64_t len = static_cast<int64_t>(cu[i + 1]) - cu[i];
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
    return FLASHATTN_SUCCESS;
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
    int64_t q_off, k_off, v_off, o_off;  // in elements, of row 0 of this (sequence, head)
    if (p.varlen) {
        const int64_t q_start = t.cu_seqlens_q[b];
        const int64_t k_start = t.cu_seqlens_k[b];
        sl.seqlen_q = t.cu_seqlens_q[b + 1] - q_start;
        sl.seqlen_k = t.cu_seqlens_k[b + 1] - k_start;
        q_off = q_start * p.q.row + h * p.q.head;
        k_off = k_start * p.k.row + kvh * p.k.head;
        v_off = k_start * p.v.row + kvh * p.v.head;
        o_off = q_start * p.o.row + h * p.o.head;
        if (t.lse) sl.lse = t.lse + h * p.total_q + q_start;
        sl.lse_head = p.total_q;
    } else {
        sl.seqlen_q = p.seqlen_q;
        sl.seqlen_k = p.seqlen_k;
        q_off = b * p.q.batch + h * p.q.head;
        k_off = b * p.k.batch + kvh * p.k.head;
        v_off = b * p.v.batch + kvh * p.v.head;
        o_off = b * p.o.batch + h * p.o.head;
        if (t.lse) sl.lse = t.lse + (b * heads + h) * p.seqlen_q;
        sl.lse_head = p.seqlen_q;
    }
    const int64_t packed_rows = sl.seqlen_q * job.pack;
    const int64_t row0 = tile * job.shape.block_m;
    if (row0 >= packed_rows) return;
    const int64_t rows = std::min<int64_t>(job.shape.block_m, packed_rows - row0);

    sl.q = static_cast<const unsigned char *>(t.q) + q_off * es;
    sl.k = static_cast<const unsigned char *>(t.k) + k_off * es;
    sl.v = static_cast<const unsigned char *>(t.v) + v_off * es;
    sl.o = static_cast<unsigned char *>(t.o) + o_off * es;
    sl.q_row = p.q.row;
    sl.k_row = p.k.row;
    sl.v_row = p.v.row;
    sl.o_row = p.o.row;
    sl.q_head = p.q.head;
    sl.o_head = p.o.head;
    sl.heads = job.pack;
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

flashattn_status_t execute_impl(const Problem &p, const Schedule &s, const Tensors &t) {
    if (p.varlen) {
        FLASHATTN_TRY(check_cu_seqlens("cu_seqlens_q", t.cu_seqlens_q, p.batch, p.total_q,
                                       "total_q", p.seqlen_q, "seqlen_q"));
        FLASHATTN_TRY(check_cu_seqlens("cu_seqlens_k", t.cu_seqlens_k, p.batch, p.total_k,
                                       "total_k", p.seqlen_k, "seqlen_k"));
    }
    cpu::TileShape shape;
    shape.block_m = s.block_m;
    shape.block_n = s.block_n;
    if (shape.block_m < 1 || shape.block_m > cpu::kMaxBlockM || shape.block_n < cpu::kVector ||
        shape.block_n % cpu::kVector != 0) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: invalid schedule (block_m %d, block_n %d)",
                    static_cast<int>(shape.block_m), static_cast<int>(shape.block_n));
    }

    Job job;
    job.p = &p;
    job.t = &t;
    job.shape = shape;
    job.pack = choose_pack(p, shape.block_m, std::max<int32_t>(s.cpu_threads, 1));
    job.tiles = tiles_per_sequence(p, shape.block_m, job.pack);
    job.units = p.batch * (p.heads_q / job.pack);
    job.items = job.tiles * job.units;
    job.elem = p.element_size();
    job.slot_bytes = round_up(cpu::scratch_bytes(p, shape), kSlotAlign);
    if (job.items <= 0) return FLASHATTN_SUCCESS;

    // Scratch: one slot per thread from the workspace; never more threads than slots or items.
    const size_t slots = t.workspace ? t.workspace_bytes / job.slot_bytes : 0;
    if (slots == 0) {
        return fail(FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
                    "the CPU backend needs at least %zu bytes of workspace; %zu were given",
                    job.slot_bytes, t.workspace ? t.workspace_bytes : static_cast<size_t>(0));
    }
    // Align the carve-out ourselves should a caller's pointer not be (the C boundary promises 256).
    unsigned char *ws = static_cast<unsigned char *>(t.workspace);
    const size_t misalign = reinterpret_cast<uintptr_t>(ws) % 64;
    size_t usable = t.workspace_bytes;
    if (misalign != 0) {
        ws += 64 - misalign;
        usable -= 64 - misalign;
    }
    job.workspace = ws;
    int64_t threads = std::max<int32_t>(s.cpu_threads, 1);
    threads = std::min<int64_t>(threads, static_cast<int64_t>(usable / job.slot_bytes));
    threads = std::min<int64_t>(threads, job.items);
    if (threads < 1) {
        return fail(FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
                    "the CPU backend needs at least %zu bytes of aligned workspace; %zu were given",
                    job.slot_bytes + 64, t.workspace_bytes);
    }

    // Workers 1..n-1 on new threads, slot 0 on the calling thread. A thread that cannot be
    // created simply leaves its share to the others.
    std::unique_ptr<std::thread[]> pool;
    int64_t started = 0;
    if (threads > 1) {
        pool.reset(new (std::nothrow) std::thread[static_cast<size_t>(threads - 1)]);
        if (pool) {
            for (int64_t i = 1; i < threads; ++i) {
                try {
                    pool[static_cast<size_t>(started)] = std::thread(worker, &job, static_cast<size_t>(i));
                    ++started;
                } catch (...) {
                    break;
                }
            }
        }
    }
    worker(&job, 0);
    for (int64_t i = 0; i < started; ++i) pool[static_cast<size_t>(i)].join();
    return FLASHATTN_SUCCESS;
}

flashattn_status_t cpu_execute(const Problem &p, const Schedule &s, const Tensors &t) {
    try {
        return execute_impl(p, s, t);
    } catch (const std::exception &e) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception: %s", e.what());
    } catch (...) {
        return fail(FLASHATTN_ERROR_INTERNAL, "CPU backend: unexpected exception");
    }
}

}  // namespace

const Backend *cpu_backend() {
    static const Backend backend = {FLASHATTN_BACKEND_CPU, "cpu", cpu_unsupported_reason,
                                    cpu_make_schedule, cpu_execute, nullptr};
    return &backend;
}

}  // namespace flashattn
