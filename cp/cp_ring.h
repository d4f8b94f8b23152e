// The ring schedule of a context-parallel forward and backward pass, built from a finalized core
// plan that describes one rank's share (the layout is documented in flashattn_cp.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cp/cp_transport.h"

namespace flashattn_cp {

// A core plan owned by the ring.
struct CorePlanDeleter {
    void operator()(flashattn_plan_t *plan) const { flashattn_plan_destroy(plan); }
};
using CorePlan = std::unique_ptr<flashattn_plan_t, CorePlanDeleter>;

// The local problem's sizes, read from the caller's core plan.
struct LocalShape {
    int64_t batch = 0, rows = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
    int64_t dtype = 0, causal = 0, backend = 0, device = 0, deterministic = 0;
    double scale = 0, softcap = 0;
    size_t element_bytes = 0;
};

// Byte offsets of one rank's share of the workspace.
struct RankWorkspace {
    size_t kv_slot[2][2] = {};  // [slot][k, v]
    size_t partial_o = 0, partial_lse = 0, scratch_lse = 0;
    size_t o_bytes = 0, lse_bytes = 0, bytes = 0;
};

// The backward's workspace: per rank the K/V blocks and the fp32 dK / dV accumulators in flight
// and its fp32 dQ; then, shared by the ranks a process plays (their calls run one after another
// on one stream), one step's parts in the plan's dtype, an LSE slice and the core's workspace.
struct GradWorkspace {
    size_t kv_slot[2][2] = {};    // [slot][k, v]
    size_t grad_slot[2][2] = {};  // [slot][dk, dv], fp32
    size_t dq = 0, rank_bytes = 0;
    size_t dq_part = 0, dk_part = 0, dv_part = 0, lse = 0, core = 0, core_bytes = 0, bytes = 0;
};

// Bytes of one rank's tensors (all contiguous, [batch, L, heads, dim]; the LSE [batch, heads_q, L]).
struct TensorBytes {
    size_t q = 0, k = 0, v = 0, o = 0, lse = 0;
};

// One rank's tensors of a backward execute (flashattn_cp_plan_execute_backward()).
struct RankGrads {
    const void *q, *k, *v, *o, *dout;
    const float *lse;
    void *dq, *dk, *dv;
};

class Ring {
public:
    // Reads and checks `local`; builds the per-step core plans. Errors through set_error().
    // The transport knows which ranks this process plays.
    static flashattn_status_t build(const flashattn_plan_t *local, int world_size,
                                    std::unique_ptr<Transport> transport, std::unique_ptr<Ring> *out);
    size_t workspace_bytes() const;
    int local_ranks() const { return transport_->local_ranks(); }
    TensorBytes tensor_bytes() const;
    const Transport &transport() const { return *transport_; }
    flashattn_status_t execute(const void *const *q, const void *const *k, const void *const *v, void *const *o,
                               float *const *lse, char *workspace, flashattn_stream_t stream) const;

    // The backward: NOT_SUPPORTED (with the core's reason) where the backend has none.
    flashattn_status_t backward_supported() const;
    size_t backward_workspace_bytes() const { return grad_ws_.bytes; }
    // `ranks` has local_ranks() entries; only where backward_supported().
    flashattn_status_t execute_backward(const RankGrads *ranks, char *workspace, flashattn_stream_t stream) const;

private:
    enum class Block { own, lower, upper };  // the K/V block in hand relative to the rank (zigzag)
    flashattn_status_t make_plans();
    flashattn_status_t plan_backward();
    flashattn_status_t attend(int rank, int step, const void *q, KvBlock in_hand, char *rank_ws, char *core_ws,
                              flashattn_stream_t stream) const;
    Block block_at(int rank, int step) const;
    flashattn_status_t block_backward(int rank, int step, const RankGrads &t, KvBlock in_hand, char *workspace,
                                      flashattn_stream_t stream) const;
    flashattn_status_t add_parts(int rank, int step, char *rank_ws, KvSlot grads, char *workspace,
                                 flashattn_stream_t stream) const;
    flashattn_status_t store_gradients(const RankGrads &t, const char *rank_ws, KvSlot grads,
                                       flashattn_stream_t stream) const;

    LocalShape shape_;
    int world_ = 1;
    std::unique_ptr<Transport> transport_;
    CorePlan full_;   // L x L: own block (causal or not), every non-causal step, and the merge
    CorePlan lower_;  // causal: L queries x the first chunk (c keys) of a lower rank's block
    CorePlan upper_;  // causal: the second chunk (c queries) x a higher rank's whole block
    RankWorkspace rank_ws_;
    size_t core_ws_offset_ = 0, core_ws_bytes_ = 0, total_bytes_ = 0;
    GradWorkspace grad_ws_;
    flashattn_status_t backward_status_ = FLASHATTN_SUCCESS;
    std::string backward_reason_;  // the core's message where backward_status_ is not SUCCESS
};

}  // namespace flashattn_cp
