// FP8 (E4M3) inputs (issue 17, since 0.3): what finalize resolves from the FP8 keys (the output
// dtype, the descale arrays' layout) and what every call of an FP8 plan checks before a backend
// runs: the three descale arrays present exactly when the plan is FP8, and apart from the outputs.
#pragma once

#include <cstddef>

#include "problem/params.h"
#include "problem/problem.h"

namespace flashattn {

// O's dtype and the descale strides, with their rules: an FP8 plan writes bf16 (default) or fp16;
// any other plan writes its own dtype; only FP8 plans may set the descale strides.
flashattn_status_t resolve_fp8(const PlanParams &params, Problem *p);

// Bytes spanned by one descale array of a resolved problem (0 when it is not FP8).
size_t fp8_descale_bytes(const Problem &p);

// The descale pointers of a forward (backward = false) or backward call: all three required in an
// FP8 forward call, none anywhere else; O, LSE and the workspace (its first workspace_needed
// bytes) must not overlap them.
flashattn_status_t check_fp8_args(const Problem &p, const Tensors &t, bool backward, size_t workspace_needed);

}  // namespace flashattn
