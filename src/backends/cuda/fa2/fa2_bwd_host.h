// The FA2 backward pass, host side: what it supports, its plan (tiles, grid, deterministic
// reduction, the workspace slices of the fp32 accumulators and the dO.O row sums) and the enqueue
// of its kernels. fa2_backend.cpp calls these three; the kernels are in fa2_bwd_*.cuh.
#pragma once

#include <cstdint>
#include <string>

#include "base/workspace.h"
#include "device/device.h"
#include "problem/problem.h"

namespace flashattn {
namespace fa2 {

// What the backward decided at finalize.
struct BwdPlan {
    int dq_accum = -1;  // workspace slices: [heads_q][rows][head_dim] fp32 dQ accumulator
    int row_dot = -1;   // [heads_q][rows] fp32 dO.O row sums (rows: batch*seqlen_q, or total_q)
    int head_dim = 0;   // the compiled head dim that runs the problem (fa2_head_dims.h)
    bool fallback = false;  // the fallback tile (fa2_bwd_params.h): the main one exceeds the device's opt-in
    int dq_sem = -1;    // deterministic: [batch][heads_q][sem_blocks] int32 dQ order counters
    int sem_blocks = 0; // query blocks of the longest sequence (deterministic)
};

// Empty when FA2 can run the backward pass of `p` on `dev`; otherwise one sentence saying why not.
std::string backward_unsupported_reason(const Problem &p, const DeviceInfo &dev);

// Decide tiles, grid and reduction order and add the backward's slices to `ws`.
BwdPlan plan_backward(const Problem &p, const DeviceInfo &dev, WorkspaceLayout *ws);

// Enqueue the backward kernels on t.stream. The C boundary has checked pointers and workspace.
flashattn_status_t run_backward(const Problem &p, const BwdPlan &plan, const WorkspaceLayout &ws, const Tensors &t);

}  // namespace fa2
}  // namespace flashattn
