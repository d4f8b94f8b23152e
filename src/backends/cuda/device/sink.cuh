// The learned per-head sink logit (gpt-oss; FLASHATTN_I64_SINK_LOGITS) in the tensor-core kernels:
// after the last key tile, before finish_rows, the sink joins each row's running (max, sum) as one
// more term exp(sink) that carries no value. Outside the key loop, so a plan without sinks pays one
// branch per tile of rows; with sinks, a few instructions per row. Rows that saw no key get
// max = sink, sum = 1 and O = 0, hence LSE = sink, as the CPU reference defines.
#pragma once

#include "backends/cuda/device/ptx.cuh"

namespace flashattn {
namespace cuda {

// One row half: `sink` in natural units (the scaled, capped scores'); row_max is kept in the
// kernels' unscaled units (times sl2 = scale * log2(e) in exp2), row_sum is this thread's part of
// the quad's sum (t: lane % 4; the sink's term goes to lane t == 0 only). Returns the factor the
// row's O accumulators take.
__device__ __forceinline__ float join_sink(float sink, float sl2, float &row_max, float &row_sum, int t) {
    if (sink == -INFINITY) return 1.f;  // an absent sink changes nothing
    const float su = sink * 1.4426950408889634f / sl2;
    const float m_new = fmaxf(row_max, su);
    const float alpha = row_max == -INFINITY ? 0.f : fast_exp2((row_max - m_new) * sl2);
    row_sum = row_sum * alpha + (t == 0 ? fast_exp2((su - m_new) * sl2) : 0.f);
    row_max = m_new;
    return alpha;
}

}  // namespace cuda
}  // namespace flashattn
