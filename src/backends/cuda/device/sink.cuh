// The learned per-head sink logit (gpt-oss; FLASHATTN_I64_SINK_LOGITS) in the tensor-core kernels:
// the sink is one more key of the row whose value is 0. It is joined to each finished row after
// the key loop, as the CPU reference does (cpu_kernel.cpp join_sink): the LSE takes its term and
// O's 1/l the matching factor, so O itself is never rescaled. Nothing of it lives across the key
// loop: set before the loop as the initial (max, sum), it cost FA2's big-tile kernels ~500 SASS
// instructions and (with split == 0 kept live) spills, even with no sink given (CUDA 13.0).
#pragma once

#include "backends/cuda/device/ptx.cuh"

namespace flashattn {
namespace cuda {

// One finished row (finish_rows: inv = 1/l, lse in natural units) joins its sink:
// lse' = log(e^lse + e^sink) and inv' = inv * e^(lse - lse'), computed from d = lse - sink
// without cancellation. A row that saw no key (lse = -inf, inv = 0) gets lse' = sink and O = 0;
// an absent sink (-inf) changes nothing; a NaN on either side gives NaN.
__device__ __forceinline__ void join_sink(float sink, float &inv, float &lse) {
    if (sink == -INFINITY) return;
    const float d = lse - sink;
    const float e = fast_exp2(-fabsf(d) * 1.4426950408889634f);  // e^-|d| in [0, 1]
    const float r = __fdividef(1.f, 1.f + e);
    inv *= d > 0.f ? r : e * r;
    lse = (d > 0.f ? lse : sink) + fast_log2(1.f + e) * 0.6931471805599453f;
}

}  // namespace cuda
}  // namespace flashattn
