// The FA2 backward pass, host side: what it supports, its plan (tiles, grid, deterministic
// reduction, the workspace slices of the fp32 accumulators and the dO.O row sums) and the enqueue
// of its kernels. fa2_backend.cpp calls these three; the kernels are in fa2_bwd_*.cuh.
#pragma once

#include <cstdint>
#include <string>

#include "backends/cuda/host/bwd_args.h"
#include "base/workspace.h"
#include "device/device.h"
#include "problem/problem.h"

namespace flashattn {
namespace fa2 {

// What the backward decided at finalize: the workspace slices (host/bwd_args.h) and FA2's own.
struct BwdPlan : BwdSlices {
    int head_dim = 0;   // the compiled head dim that runs the problem (fa2_head_dims.h)
    bool fallback = false;  // the fallback tile (fa2_bwd_params.h): the main one exceeds the device's opt-in
    int grid_order = 0;     // BwdGridOrder (fa2_bwd_params.h)
};

// Empty when FA2 can run the backward pass of `p` on `dev`; otherwise one sentence saying why not.
std::string backward_unsupported_reason(const Problem &p, const DeviceInfo &dev);

// Decide tiles, grid and reduction order and add the backward's slices to `ws`.
BwdPlan plan_backward(const Problem &p, const DeviceInfo &dev, WorkspaceLayout *ws);

// Enqueue the backward kernels on t.stream. The C boundary has checked pointers and workspace.
flashattn_status_t run_backward(const Problem &p, const BwdPlan &plan, const WorkspaceLayout &ws, const Tensors &t);

}  // namespace fa2
}  // namespace flashattn
