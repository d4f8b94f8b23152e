// The CPU backend's backward pass: dQ, dK, dV recomputed tile by tile from Q, K, V, O, dO and the
// forward's LSE (FlashAttention-2's algorithm on the host; no N x N buffer). cpu_backend.cpp plans
// it at finalize and calls it at execute; cpu_backward.cpp holds the algorithm.
//
// Two passes, each parallel over its own work items, joined in between:
//   dQ pass:    (query block, batch, query head): D_i = dO_i . O_i into the workspace, then dQ of the
//               block over its visible key blocks in order.
//   dK/dV pass: (key block, batch, key/value head): dK and dV of the block over every query head
//               of the GQA group and every query block that sees the keys, in order.
// Each output element is written by exactly one work item in a fixed reduction order, so results
// are bitwise identical from run to run and for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/workspace.h"
#include "problem/problem.h"

namespace flashattn {
namespace cpu {

// What the backward decided at finalize: tiles, threads and the workspace slices it uses.
struct BackwardPlan {
    int64_t threads = 1;    // worker threads, the calling one included
    int block_m = 64;       // query rows per tile (keys per tile: a constant of cpu_backward.cpp)
    int scratch = -1;       // workspace slice of the per-thread scratch (threads x slot_bytes)
    size_t slot_bytes = 0;  // one thread's scratch, a multiple of kWorkspaceAlignment
    int row_sums = -1;      // workspace slice of D = rowsum(dO * O): fp32, the LSE's layout
};

// Empty when the CPU backend can run the backward pass of `p`; otherwise why not.
std::string backward_unsupported_reason(const Problem &p);

// Whether the backward's work-item counts (tiles x batch x heads of each pass) fit in int64; make_plan
// rejects the problem otherwise.
bool backward_work_fits(const Problem &p);

// Decide the backward's tiles and threads (at most `threads`) and add its slices to `ws`.
BackwardPlan plan_backward(const Problem &p, int64_t threads, WorkspaceLayout *ws);

// Run it. The C boundary has checked the pointers, the workspace against `ws` and, for varlen
// plans, cu_seqlens; outputs are overwritten.
flashattn_status_t run_backward(const Problem &p, const BackwardPlan &plan, const WorkspaceLayout &ws,
                                const Tensors &t);

}  // namespace cpu
}  // namespace flashattn
