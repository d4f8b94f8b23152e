// The ring schedule (see flashattn_cp.h for the layout): W steps of "attend to the block in hand,
// pass it on", then one LSE merge of the W partial states. Everything that depends on where the
// tensors live or how blocks travel is behind the Transport; everything attention is the core
// library's public API, so this component needs no private core symbol.
#include "cp/cp_ring.h"

#include <utility>

namespace flashattn_cp {

namespace {

constexpr size_t kAlign = 256;  // the core's workspace alignment; every region starts on it

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Records a core failure with the core's message, naming what the ring was doing.
flashattn_status_t core_failed(flashattn_status_t status, const char *what) {
    return set_error(status, "%s: %s", what, flashattn_last_error());
}

#define CP_CORE(call, what)                                                   \
    do {                                                                      \
        const flashattn_status_t cp_status_ = (call);                         \
        if (cp_status_ != FLASHATTN_SUCCESS) return core_failed(cp_status_, what); \
    } while (0)

size_t element_bytes(int64_t dtype) {
    switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16: return 2;
    case FLASHATTN_DTYPE_FP32: return 4;
    default: return 0;
    }
}

int64_t get(const flashattn_plan_t *plan, flashattn_i64_param_t key) {
    int64_t value = 0;
    flashattn_plan_get_i64(plan, key, &value);  // a finalized plan answers every key
    return value;
}

// Features the first version of the ring does not carry over (each would need its own rule for
// splitting the sequence), refused by name.
flashattn_status_t check_supported(const flashattn_plan_t *local) {
    struct Rule {
        flashattn_i64_param_t key;
        int64_t required;
        const char *name;
    };
    static const Rule rules[] = {
        {FLASHATTN_I64_VARLEN, 0, "FLASHATTN_I64_VARLEN"},
        {FLASHATTN_I64_PAGED_KV, 0, "FLASHATTN_I64_PAGED_KV"},
        {FLASHATTN_I64_SEQUSED_K, 0, "FLASHATTN_I64_SEQUSED_K"},
        {FLASHATTN_I64_NEW_KV_ROWS, 0, "FLASHATTN_I64_NEW_KV_ROWS"},
        {FLASHATTN_I64_WINDOW_LEFT, -1, "FLASHATTN_I64_WINDOW_LEFT"},
        {FLASHATTN_I64_WINDOW_RIGHT, -1, "FLASHATTN_I64_WINDOW_RIGHT"},
        {FLASHATTN_I64_SINK_TOKENS, 0, "FLASHATTN_I64_SINK_TOKENS"},
        {FLASHATTN_I64_SINK_LOGITS, 0, "FLASHATTN_I64_SINK_LOGITS"},
        {FLASHATTN_I64_ALIBI, 0, "FLASHATTN_I64_ALIBI"},
    };
    for (const Rule &rule : rules)
        if (get(local, rule.key) != rule.required)
            return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "local: %s = %lld is not supported by the ring (needs %lld)",
                             rule.name, static_cast<long long>(get(local, rule.key)),
                             static_cast<long long>(rule.required));
    return FLASHATTN_SUCCESS;
}

// The ring copies K/V blocks, partials and gradients as whole contiguous tensors: default strides
// only. first_strided() names the first of `tensors` (Q, K, V, O, or dO, dQ, dK, dV) whose strides
// are not, or returns NULL.
struct Strides {
    const char *name;
    flashattn_i64_param_t batch, row, head;
    bool query_heads, value_dim;
};
constexpr Strides kForwardStrides[] = {
    {"Q", FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE, true, false},
    {"K", FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE, false, false},
    {"V", FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE, false, true},
    {"O", FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE, true, true},
};
constexpr Strides kGradientStrides[] = {
    {"dO", FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE, true, true},
    {"dQ", FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE, true, false},
    {"dK", FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE, false, false},
    {"dV", FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE, false, true},
};

template <size_t N>
const char *first_strided(const flashattn_plan_t *local, const LocalShape &s, const Strides (&tensors)[N]) {
    for (const Strides &t : tensors) {
        const int64_t heads = t.query_heads ? s.heads_q : s.heads_kv, dim = t.value_dim ? s.head_dim_v : s.head_dim;
        const bool contiguous = get(local, t.head) == dim && get(local, t.row) == heads * dim &&
                                (s.batch == 1 || get(local, t.batch) == s.rows * heads * dim);
        if (!contiguous) return t.name;
    }
    return nullptr;
}

flashattn_status_t check_contiguous(const flashattn_plan_t *local, const LocalShape &s) {
    if (const char *name = first_strided(local, s, kForwardStrides))
        return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                         "local: %s strides are not the default contiguous ones, which the ring needs", name);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t read_shape(const flashattn_plan_t *local, LocalShape *s) {
    s->batch = get(local, FLASHATTN_I64_BATCH);
    s->rows = get(local, FLASHATTN_I64_SEQLEN_Q);
    s->heads_q = get(local, FLASHATTN_I64_HEADS_Q);
    s->heads_kv = get(local, FLASHATTN_I64_HEADS_KV);
    s->head_dim = get(local, FLASHATTN_I64_HEAD_DIM);
    s->head_dim_v = get(local, FLASHATTN_I64_HEAD_DIM_V);
    s->dtype = get(local, FLASHATTN_I64_DTYPE);
    s->causal = get(local, FLASHATTN_I64_CAUSAL);
    s->device = get(local, FLASHATTN_I64_DEVICE);
    s->deterministic = get(local, FLASHATTN_I64_DETERMINISTIC);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    CP_CORE(flashattn_plan_get_backend(local, &backend, nullptr), "local");
    s->backend = backend;
    CP_CORE(flashattn_plan_get_f64(local, FLASHATTN_F64_SOFTMAX_SCALE, &s->scale), "local");
    CP_CORE(flashattn_plan_get_f64(local, FLASHATTN_F64_SOFTCAP, &s->softcap), "local");
    s->element_bytes = element_bytes(s->dtype);
    if (s->element_bytes == 0 || get(local, FLASHATTN_I64_OUTPUT_DTYPE) != s->dtype)
        return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "local: dtype %lld is not supported by the ring (fp16, bf16, fp32)",
                         static_cast<long long>(s->dtype));
    if (get(local, FLASHATTN_I64_SEQLEN_K) != s->rows)
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                         "local: seqlen_q (%lld) and seqlen_k (%lld) must both be the rank's L tokens",
                         static_cast<long long>(s->rows), static_cast<long long>(get(local, FLASHATTN_I64_SEQLEN_K)));
    if (s->causal && s->rows % 2 != 0)
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                         "local: seqlen_q = %lld is odd; the causal zigzag layout needs two chunks of L/2 tokens per rank",
                         static_cast<long long>(s->rows));
    return FLASHATTN_SUCCESS;
}

// One core plan of the ring: the local shape with its own lengths, mask and strides.
struct PlanSpec {
    int64_t seqlen_q, seqlen_k, causal;
    int64_t q_batch_stride, o_batch_stride, kv_rows;  // rows between batches of Q/O and of K/V
};

flashattn_status_t make_core_plan(const LocalShape &s, const PlanSpec &spec, CorePlan *out) {
    flashattn_plan_t *raw = nullptr;
    CP_CORE(flashattn_plan_create(&raw), "plan");
    CorePlan plan(raw);
    const struct {
        flashattn_i64_param_t key;
        int64_t value;
    } values[] = {
        {FLASHATTN_I64_BATCH, s.batch},
        {FLASHATTN_I64_SEQLEN_Q, spec.seqlen_q},
        {FLASHATTN_I64_SEQLEN_K, spec.seqlen_k},
        {FLASHATTN_I64_HEADS_Q, s.heads_q},
        {FLASHATTN_I64_HEADS_KV, s.heads_kv},
        {FLASHATTN_I64_HEAD_DIM, s.head_dim},
        {FLASHATTN_I64_HEAD_DIM_V, s.head_dim_v},
        {FLASHATTN_I64_DTYPE, s.dtype},
        {FLASHATTN_I64_CAUSAL, spec.causal},
        {FLASHATTN_I64_BACKEND, s.backend},
        {FLASHATTN_I64_DEVICE, s.device},
        {FLASHATTN_I64_DETERMINISTIC, s.deterministic},
        {FLASHATTN_I64_Q_BATCH_STRIDE, spec.q_batch_stride * s.heads_q * s.head_dim},
        {FLASHATTN_I64_O_BATCH_STRIDE, spec.o_batch_stride * s.heads_q * s.head_dim_v},
        {FLASHATTN_I64_K_BATCH_STRIDE, spec.kv_rows * s.heads_kv * s.head_dim},
        {FLASHATTN_I64_V_BATCH_STRIDE, spec.kv_rows * s.heads_kv * s.head_dim_v},
        // The backward's tensors lie like the forward's (parts written into [batch, L] buffers).
        {FLASHATTN_I64_DO_BATCH_STRIDE, spec.o_batch_stride * s.heads_q * s.head_dim_v},
        {FLASHATTN_I64_DQ_BATCH_STRIDE, spec.q_batch_stride * s.heads_q * s.head_dim},
        {FLASHATTN_I64_DK_BATCH_STRIDE, spec.kv_rows * s.heads_kv * s.head_dim},
        {FLASHATTN_I64_DV_BATCH_STRIDE, spec.kv_rows * s.heads_kv * s.head_dim_v},
    };
    for (const auto &kv : values) CP_CORE(flashattn_plan_set_i64(plan.get(), kv.key, kv.value), "plan");
    CP_CORE(flashattn_plan_set_f64(plan.get(), FLASHATTN_F64_SOFTMAX_SCALE, s.scale), "plan");
    CP_CORE(flashattn_plan_set_f64(plan.get(), FLASHATTN_F64_SOFTCAP, s.softcap), "plan");
    CP_CORE(flashattn_plan_finalize(plan.get()), "plan");
    *out = std::move(plan);
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t Ring::build(const flashattn_plan_t *local, int world_size, std::unique_ptr<Transport> transport,
                               std::unique_ptr<Ring> *out) {
    std::unique_ptr<Ring> ring(new Ring());
    ring->world_ = world_size;
    ring->transport_ = std::move(transport);
    FLASHATTN_CP_TRY(read_shape(local, &ring->shape_));
    FLASHATTN_CP_TRY(check_supported(local));
    FLASHATTN_CP_TRY(check_contiguous(local, ring->shape_));
    FLASHATTN_CP_TRY(ring->make_plans());
    if (const char *name = first_strided(local, ring->shape_, kGradientStrides)) {
        ring->backward_status_ = FLASHATTN_ERROR_NOT_SUPPORTED;
        ring->backward_reason_ = std::string("local: ") + name +
                                 " strides are not the default contiguous ones, which the ring's backward needs";
    } else {
        FLASHATTN_CP_TRY(ring->plan_backward());
    }
    *out = std::move(ring);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t Ring::make_plans() {
    const LocalShape &s = shape_;
    const int64_t L = s.rows, c = L / 2;
    FLASHATTN_CP_TRY(make_core_plan(s, {L, L, s.causal, L, L, L}, &full_));
    if (s.causal && world_ > 1) {
        FLASHATTN_CP_TRY(make_core_plan(s, {L, c, 0, L, L, L}, &lower_));
        FLASHATTN_CP_TRY(make_core_plan(s, {c, L, 0, L, L, L}, &upper_));
        FLASHATTN_CP_TRY(transport_->prepare(static_cast<size_t>(s.batch * s.heads_q), static_cast<size_t>(c)));
    }
    // Workspace: per local rank two K/V slots, W partial outputs and LSEs, one scratch LSE; then
    // one core workspace shared by every call (the calls of this process run one after another).
    const TensorBytes bytes = tensor_bytes();
    RankWorkspace &w = rank_ws_;
    w.o_bytes = align_up(bytes.o);
    w.lse_bytes = align_up(bytes.lse);
    size_t at = 0;
    for (auto &slot : w.kv_slot) {
        slot[0] = at;
        at += align_up(bytes.k);
        slot[1] = at;
        at += align_up(bytes.v);
    }
    w.partial_o = at;
    at += w.o_bytes * world_;
    w.partial_lse = at;
    at += w.lse_bytes * world_;
    w.scratch_lse = at;
    at += w.lse_bytes;
    w.bytes = at;
    for (const CorePlan *plan : {&full_, &lower_, &upper_}) {
        size_t need = 0;
        if (*plan) CP_CORE(flashattn_plan_get_workspace_size(plan->get(), &need), "plan");
        if (need > core_ws_bytes_) core_ws_bytes_ = need;
    }
    core_ws_offset_ = w.bytes * transport_->local_ranks();
    total_bytes_ = core_ws_offset_ + align_up(core_ws_bytes_);
    return FLASHATTN_SUCCESS;
}

size_t Ring::workspace_bytes() const { return total_bytes_; }

TensorBytes Ring::tensor_bytes() const {
    const LocalShape &s = shape_;
    const size_t rows = static_cast<size_t>(s.batch * s.rows);
    TensorBytes t;
    t.q = rows * static_cast<size_t>(s.heads_q * s.head_dim) * s.element_bytes;
    t.k = rows * static_cast<size_t>(s.heads_kv * s.head_dim) * s.element_bytes;
    t.v = rows * static_cast<size_t>(s.heads_kv * s.head_dim_v) * s.element_bytes;
    t.o = rows * static_cast<size_t>(s.heads_q * s.head_dim_v) * s.element_bytes;
    t.lse = rows * static_cast<size_t>(s.heads_q) * sizeof(float);
    return t;
}

// Where the core has no backward pass for one of the ring's plans, the forward ring still runs and
// the backward calls report the core's reason.
flashattn_status_t Ring::plan_backward() {
    size_t core_bytes = 0;
    for (const CorePlan *plan : {&full_, &lower_, &upper_}) {
        if (!*plan) continue;
        size_t need = 0;
        const flashattn_status_t status = flashattn_plan_get_backward_workspace_size(plan->get(), &need);
        if (status != FLASHATTN_SUCCESS) {
            backward_status_ = status;
            backward_reason_ = std::string("backward: ") + flashattn_last_error();
            return FLASHATTN_SUCCESS;
        }
        if (need > core_bytes) core_bytes = need;
    }
    const TensorBytes bytes = tensor_bytes();
    const size_t fp32_per_element = sizeof(float) / shape_.element_bytes;
    GradWorkspace &w = grad_ws_;
    size_t at = 0;
    const auto take = [&at](size_t *offset, size_t size) {
        *offset = at;
        at += align_up(size);
    };
    for (auto &slot : w.kv_slot) {
        take(&slot[0], bytes.k);
        take(&slot[1], bytes.v);
    }
    for (auto &slot : w.grad_slot) {
        take(&slot[0], bytes.k * fp32_per_element);
        take(&slot[1], bytes.v * fp32_per_element);
    }
    take(&w.dq, bytes.q * fp32_per_element);
    w.rank_bytes = at;
    at *= transport_->local_ranks();
    take(&w.dq_part, bytes.q);
    take(&w.dk_part, bytes.k);
    take(&w.dv_part, bytes.v);
    take(&w.lse, shape_.causal && world_ > 1 ? bytes.lse / 2 : 0);
    take(&w.core, core_bytes);
    w.core_bytes = core_bytes;
    w.bytes = at;
    return FLASHATTN_SUCCESS;
}

flashattn_status_t Ring::backward_supported() const {
    if (backward_status_ != FLASHATTN_SUCCESS) return set_error(backward_status_, "%s", backward_reason_.c_str());
    return FLASHATTN_SUCCESS;
}

// At step s rank r holds the block of rank r − s. Zigzag: rank r holds chunks r and 2W−1−r. The
// block of a lower rank j < r (chunks j, 2W−1−j): both local chunks see chunk j entirely and chunk
// 2W−1−j not at all. The block of a higher rank j > r: only the local chunk 2W−1−r sees anything,
// and it sees both of j's chunks entirely. Without a mask every block is seen like the own one.
Ring::Block Ring::block_at(int rank, int step) const {
    const int owner = (rank - step + world_) % world_;
    if (!shape_.causal || owner == rank) return Block::own;
    return owner < rank ? Block::lower : Block::upper;
}

flashattn_status_t Ring::attend(int rank, int step, const void *q, KvBlock in_hand, char *rank_ws, char *core_ws,
                                flashattn_stream_t stream) const {
    const LocalShape &s = shape_;
    void *part_o = rank_ws + rank_ws_.partial_o + rank_ws_.o_bytes * step;
    float *part_lse = reinterpret_cast<float *>(rank_ws + rank_ws_.partial_lse + rank_ws_.lse_bytes * step);
    const Block block = block_at(rank, step);
    if (block == Block::own || block == Block::lower) {
        const flashattn_plan_t *plan = block == Block::own ? full_.get() : lower_.get();
        CP_CORE(flashattn_plan_execute(plan, q, in_hand.k, in_hand.v, part_o, part_lse, core_ws, core_ws_bytes_, stream),
                "ring step");
        return FLASHATTN_SUCCESS;
    }
    // Upper: the second local chunk (rows c..L) against the whole block; the first chunk's rows
    // of this partial get LSE = -inf, so the merge ignores whatever their O holds.
    const int64_t c = s.rows / 2;
    const char *q_second = static_cast<const char *>(q) + c * s.heads_q * s.head_dim * s.element_bytes;
    char *o_second = static_cast<char *>(part_o) + c * s.heads_q * s.head_dim_v * s.element_bytes;
    float *scratch = reinterpret_cast<float *>(rank_ws + rank_ws_.scratch_lse);
    CP_CORE(flashattn_plan_execute(upper_.get(), q_second, in_hand.k, in_hand.v, o_second, scratch, core_ws,
                                   core_ws_bytes_, stream),
            "ring step");
    return transport_->scatter_lse_second_half(part_lse, scratch, static_cast<size_t>(s.batch * s.heads_q),
                                               static_cast<size_t>(c), stream);
}

flashattn_status_t Ring::execute(const void *const *q, const void *const *k, const void *const *v, void *const *o,
                                 float *const *lse, char *workspace, flashattn_stream_t stream) const {
    const int ranks = transport_->local_ranks(), first = transport_->first_rank();
    const TensorBytes bytes = tensor_bytes();
    const size_t k_bytes = bytes.k, v_bytes = bytes.v;
    char *core_ws = core_ws_bytes_ ? workspace + core_ws_offset_ : nullptr;
    std::unique_ptr<KvBlock[]> in_hand(new KvBlock[ranks]);
    std::unique_ptr<KvSlot[]> next(new KvSlot[ranks]);
    for (int p = 0; p < ranks; ++p) in_hand[p] = {k[p], v[p]};
    for (int step = 0; step < world_; ++step) {
        // The block received during step s lands in slot s % 2; the block in hand (the caller's at
        // step 0, else slot (s − 1) % 2) is only read, by the send and by this step's attention.
        const bool pass_on = step + 1 < world_;
        if (pass_on) {
            for (int p = 0; p < ranks; ++p) {
                char *rank_ws = workspace + rank_ws_.bytes * p;
                next[p] = {rank_ws + rank_ws_.kv_slot[step % 2][0], rank_ws + rank_ws_.kv_slot[step % 2][1]};
            }
            FLASHATTN_CP_TRY(transport_->start_exchange(Channel::kv, in_hand.get(), next.get(), k_bytes, v_bytes, stream));
        }
        for (int p = 0; p < ranks; ++p)
            FLASHATTN_CP_TRY(attend(first + p, step, q[p], in_hand[p], workspace + rank_ws_.bytes * p, core_ws, stream));
        if (pass_on) {
            FLASHATTN_CP_TRY(transport_->finish_exchange(Channel::kv, stream));
            for (int p = 0; p < ranks; ++p) in_hand[p] = {next[p].k, next[p].v};
        }
    }
    const void *partial_o[kMaxWorld];
    const float *partial_lse[kMaxWorld];
    for (int p = 0; p < ranks; ++p) {
        const char *rank_ws = workspace + rank_ws_.bytes * p;
        for (int step = 0; step < world_; ++step) {
            partial_o[step] = rank_ws + rank_ws_.partial_o + rank_ws_.o_bytes * step;
            partial_lse[step] = reinterpret_cast<const float *>(rank_ws + rank_ws_.partial_lse + rank_ws_.lse_bytes * step);
        }
        CP_CORE(flashattn_plan_merge_states(full_.get(), world_, partial_o, partial_lse,
                                            static_cast<flashattn_dtype_t>(shape_.dtype), o[p], lse ? lse[p] : nullptr,
                                            stream),
                "merge");
    }
    return FLASHATTN_SUCCESS;
}

// The core backward of one step on the block in hand: dQ, dK, dV parts (plan dtype) into the
// shared part buffers, laid out as [batch, L] like the rank's tensors. A lower rank's block: all
// local queries against its first chunk (dK / dV parts in rows [0, c)); a higher rank's block:
// the second local chunk's queries (dQ part in rows [c, L)) against all of it, with their LSE
// gathered into a [batch, heads_q, c] slice, the layout the core reads for c query rows.
flashattn_status_t Ring::block_backward(int rank, int step, const RankGrads &t, KvBlock in_hand, char *workspace,
                                        flashattn_stream_t stream) const {
    const LocalShape &s = shape_;
    const GradWorkspace &w = grad_ws_;
    char *dq = workspace + w.dq_part, *dk = workspace + w.dk_part, *dv = workspace + w.dv_part;
    char *core_ws = w.core_bytes ? workspace + w.core : nullptr;
    const Block block = block_at(rank, step);
    if (block != Block::upper) {
        const flashattn_plan_t *plan = block == Block::own ? full_.get() : lower_.get();
        CP_CORE(flashattn_plan_execute_backward(plan, t.q, in_hand.k, in_hand.v, t.o, t.dout, t.lse, dq, dk, dv,
                                                core_ws, w.core_bytes, stream),
                "ring backward step");
        return FLASHATTN_SUCCESS;
    }
    const int64_t c = s.rows / 2;
    const size_t q_skip = static_cast<size_t>(c * s.heads_q * s.head_dim) * s.element_bytes;
    const size_t o_skip = static_cast<size_t>(c * s.heads_q * s.head_dim_v) * s.element_bytes;
    float *lse = reinterpret_cast<float *>(workspace + w.lse);
    FLASHATTN_CP_TRY(transport_->gather_lse_second_half(lse, t.lse, static_cast<size_t>(s.batch * s.heads_q),
                                                        static_cast<size_t>(c), stream));
    CP_CORE(flashattn_plan_execute_backward(upper_.get(), static_cast<const char *>(t.q) + q_skip, in_hand.k,
                                            in_hand.v, static_cast<const char *>(t.o) + o_skip,
                                            static_cast<const char *>(t.dout) + o_skip, lse, dq + q_skip, dk, dv,
                                            core_ws, w.core_bytes, stream),
            "ring backward step");
    return FLASHATTN_SUCCESS;
}

// Adds the step's parts to the rank's dQ and to the dK / dV accumulators of the block in hand.
// Step 0 is the own block, whose parts cover every row: they initialize the accumulators.
flashattn_status_t Ring::add_parts(int rank, int step, char *rank_ws, KvSlot grads, char *workspace,
                                   flashattn_stream_t stream) const {
    const LocalShape &s = shape_;
    const size_t batch = static_cast<size_t>(s.batch), L = static_cast<size_t>(s.rows), c = L / 2;
    const Block block = block_at(rank, step);
    const size_t q_begin = block == Block::upper ? c : 0, k_count = block == Block::lower ? c : L;
    const RowRange q_rows{batch, L, q_begin, L - q_begin, static_cast<size_t>(s.heads_q * s.head_dim)};
    const RowRange k_rows{batch, L, 0, k_count, static_cast<size_t>(s.heads_kv * s.head_dim)};
    const RowRange v_rows{batch, L, 0, k_count, static_cast<size_t>(s.heads_kv * s.head_dim_v)};
    const bool add = step > 0;
    float *dq = reinterpret_cast<float *>(rank_ws + grad_ws_.dq);
    FLASHATTN_CP_TRY(transport_->accumulate(dq, workspace + grad_ws_.dq_part, s.dtype, q_rows, add, stream));
    FLASHATTN_CP_TRY(transport_->accumulate(static_cast<float *>(grads.k), workspace + grad_ws_.dk_part, s.dtype,
                                            k_rows, add, stream));
    FLASHATTN_CP_TRY(transport_->accumulate(static_cast<float *>(grads.v), workspace + grad_ws_.dv_part, s.dtype,
                                            v_rows, add, stream));
    return FLASHATTN_SUCCESS;
}

flashattn_status_t Ring::store_gradients(const RankGrads &t, const char *rank_ws, KvSlot grads,
                                         flashattn_stream_t stream) const {
    const TensorBytes bytes = tensor_bytes();
    const size_t e = shape_.element_bytes;
    const float *dq = reinterpret_cast<const float *>(rank_ws + grad_ws_.dq);
    FLASHATTN_CP_TRY(transport_->store(t.dq, dq, shape_.dtype, bytes.q / e, stream));
    FLASHATTN_CP_TRY(transport_->store(t.dk, static_cast<const float *>(grads.k), shape_.dtype, bytes.k / e, stream));
    FLASHATTN_CP_TRY(transport_->store(t.dv, static_cast<const float *>(grads.v), shape_.dtype, bytes.v / e, stream));
    return FLASHATTN_SUCCESS;
}

// W steps of "backward on the block in hand, pass the block on", with the block's fp32 dK / dV
// accumulators one exchange behind it: sent on after this step's parts are added, so they reach
// the next holder of the block while it computes; after the last step rank r holds those of rank
// r + 1's block and sends them home. The outputs are written only at the end. The caller has
// checked backward_supported().
flashattn_status_t Ring::execute_backward(const RankGrads *t, char *workspace, flashattn_stream_t stream) const {
    const int ranks = transport_->local_ranks(), first = transport_->first_rank();
    const TensorBytes bytes = tensor_bytes();
    const size_t fp32_per_element = sizeof(float) / shape_.element_bytes;
    const GradWorkspace &w = grad_ws_;
    const auto rank_ws = [&](int p) { return workspace + w.rank_bytes * p; };
    const auto grad_slot = [&](int p, int slot) {
        return KvSlot{rank_ws(p) + w.grad_slot[slot][0], rank_ws(p) + w.grad_slot[slot][1]};
    };
    std::unique_ptr<KvBlock[]> in_hand(new KvBlock[ranks]), sending(new KvBlock[ranks]);
    std::unique_ptr<KvSlot[]> next(new KvSlot[ranks]), grads(new KvSlot[ranks]), next_grads(new KvSlot[ranks]);
    for (int p = 0; p < ranks; ++p) {
        in_hand[p] = {t[p].k, t[p].v};
        grads[p] = grad_slot(p, 0);
    }
    for (int step = 0; step < world_; ++step) {
        const bool pass_on = step + 1 < world_;
        if (pass_on) {
            for (int p = 0; p < ranks; ++p)
                next[p] = {rank_ws(p) + w.kv_slot[step % 2][0], rank_ws(p) + w.kv_slot[step % 2][1]};
            FLASHATTN_CP_TRY(transport_->start_exchange(Channel::kv, in_hand.get(), next.get(), bytes.k, bytes.v, stream));
        }
        for (int p = 0; p < ranks; ++p) {
            FLASHATTN_CP_TRY(block_backward(first + p, step, t[p], in_hand[p], workspace, stream));
            // The accumulators that came with the block: waited for only now, so their exchange
            // overlaps this process's first backward call of the step (NCCL plays one rank; the
            // loopback's exchanges are complete when started).
            if (p == 0 && step > 0) FLASHATTN_CP_TRY(transport_->finish_exchange(Channel::grad, stream));
            FLASHATTN_CP_TRY(add_parts(first + p, step, rank_ws(p), grads[p], workspace, stream));
        }
        if (pass_on) {
            FLASHATTN_CP_TRY(transport_->finish_exchange(Channel::kv, stream));
            for (int p = 0; p < ranks; ++p) in_hand[p] = {next[p].k, next[p].v};
        }
        if (world_ > 1) {
            for (int p = 0; p < ranks; ++p) {
                sending[p] = {grads[p].k, grads[p].v};
                next_grads[p] = grad_slot(p, (step + 1) % 2);
            }
            FLASHATTN_CP_TRY(transport_->start_exchange(Channel::grad, sending.get(), next_grads.get(),
                                                        bytes.k * fp32_per_element, bytes.v * fp32_per_element,
                                                        stream));
            for (int p = 0; p < ranks; ++p) grads[p] = next_grads[p];
        }
    }
    if (world_ > 1) FLASHATTN_CP_TRY(transport_->finish_exchange(Channel::grad, stream));
    for (int p = 0; p < ranks; ++p) FLASHATTN_CP_TRY(store_gradients(t[p], rank_ws(p), grads[p], stream));
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn_cp
