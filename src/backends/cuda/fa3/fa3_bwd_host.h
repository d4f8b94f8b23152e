// The FA3 backward pass, host side: what it supports, its plan (compiled head dim, the
// deterministic mode's order counters, the workspace slices) and the enqueue of its kernels
// (preprocess, main, dQ convert). fa3_backend.cpp calls these three and encodes the TMA maps.
#pragma once

#include <cstdint>
#include <string>

#include "backends/cuda/fa3/fa3_bwd_params.h"
#include "base/workspace.h"
#include "device/device.h"
#include "problem/problem.h"

namespace flashattn {
namespace fa3 {

// What the backward decided at finalize: the workspace slices (host/bwd_args.h; sem_blocks counts
// query blocks of kBwdBM rows) and the kernel.
struct BwdPlan : BwdSlices {
    int head_dim = 0;    // the compiled head dim that runs the problem (fa3_head_dims.h)
    LaunchBwd launch = nullptr;
    int grid_order = 0;  // BwdGridOrder (fa3_bwd_params.h): default_grid_order / det_grid_order
    int block_n = 0;     // keys per CTA: bwd_block_n(head_dim), or kBwdWideBN (wide_layout)
    bool dq_writer = false;  // bwd_det_kernel runs it (writer_kernel)
    int wave_ctas = 0;       // CTAs of one wave (the SMs): the deterministic turns' bwd_wave_split
};

// Empty when the FA3 backward kernels can run `p` on `dev` (the forward's own conditions, TMA
// strides included, are the caller's); otherwise one sentence saying why not.
std::string backward_unsupported_reason(const Problem &p, const DeviceInfo &dev);

// Pick the kernel and the grid order (sm_count: the deterministic mode's keys-rotated order needs a
// pair's key blocks resident at once) and add the backward's slices to `ws`.
BwdPlan plan_backward(const Problem &p, int sm_count, WorkspaceLayout *ws);

// Enqueue the backward kernels on t.stream. The C boundary has checked pointers and workspace;
// `maps` describe Q, K, V and dO (fa3_bwd_params.h).
flashattn_status_t run_backward(const Problem &p, const BwdPlan &plan, const WorkspaceLayout &ws, const Tensors &t,
                                const BwdMaps &maps);

}  // namespace fa3
}  // namespace flashattn
