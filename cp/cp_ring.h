// The ring schedule of a context-parallel forward pass, built from a finalized core plan that
// describes one rank's share (the layout is documented in flashattn_cp.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

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

class Ring {
public:
    // Reads and checks `local`; builds the per-step core plans. Errors through set_error().
    // The transport knows which ranks this process plays.
    static flashattn_status_t build(const flashattn_plan_t *local, int world_size,
                                    std::unique_ptr<Transport> transport, std::unique_ptr<Ring> *out);
    size_t workspace_bytes() const;
    int local_ranks() const { return transport_->local_ranks(); }
    flashattn_status_t execute(const void *const *q, const void *const *k, const void *const *v, void *const *o,
                               float *const *lse, char *workspace, flashattn_stream_t stream) const;

private:
    enum class Block { own, lower, upper };  // the K/V block in hand relative to the rank (zigzag)
    flashattn_status_t make_plans();
    flashattn_status_t attend(int rank, int step, const void *q, KvBlock in_hand, char *rank_ws, char *core_ws,
                              flashattn_stream_t stream) const;
    Block block_of(int rank, int owner) const;

    LocalShape shape_;
    int world_ = 1;
    std::unique_ptr<Transport> transport_;
    CorePlan full_;   // L x L: own block (causal or not), every non-causal step, and the merge
    CorePlan lower_;  // causal: L queries x the first chunk (c keys) of a lower rank's block
    CorePlan upper_;  // causal: the second chunk (c queries) x a higher rank's whole block
    RankWorkspace rank_ws_;
    size_t core_ws_offset_ = 0, core_ws_bytes_ = 0, total_bytes_ = 0;
};

}  // namespace flashattn_cp
