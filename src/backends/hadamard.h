// flashattn_rotate_hadamard() where it runs (problem/hadamard.h has the transform): on the host,
// or on a CUDA device by the kernel compiled with FA2 (sm_80 and newer, as the merge kernel). The
// call's argument rules have been checked (check_hadamard_call); each checks the memory kind.
#pragma once

#include "problem/hadamard.h"

namespace flashattn {

flashattn_status_t cpu_rotate_hadamard(const HadamardCall &c);
// NOT_SUPPORTED in builds without FA2's kernels (hadamard_stub.cpp).
flashattn_status_t gpu_rotate_hadamard(const HadamardCall &c);

}  // namespace flashattn
