// Turning what the user set into a checked, fully resolved Problem, and the checks on the
// tensors of one execute call that do not depend on the backend.
#pragma once

#include <cstddef>

#include "problem/params.h"
#include "problem/problem.h"

namespace flashattn {

// Apply defaults (heads_kv, head_dim_v, contiguous strides, scale) and check every rule between
// parameters. Writes `out` only on success.
flashattn_status_t resolve_problem(const PlanParams &params, Problem *out);

// Null pointers, overlap of an output with any other tensor, workspace size and alignment.
flashattn_status_t check_execute_args(const Problem &p, const Tensors &t, size_t workspace_needed);

// The same for a backward call: q, k, v, o, dout and lse are inputs (lse required), dq, dk, dv
// outputs.
flashattn_status_t check_backward_args(const Problem &p, const Tensors &t, size_t workspace_needed);

}  // namespace flashattn
