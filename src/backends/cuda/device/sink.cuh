// The learned per-head sink logit (gpt-oss; FLASHATTN_I64_SINK_LOGITS) in the tensor-core kernels:
// the sink is each row's initial (max, sum) pair, as if it were one more key whose value is 0, so
// the online softmax (online_softmax.cuh) carries it through every rescale and the LSE counts it.
// Set before the key loop, where the accumulators are not yet live: a post-loop join made ptxas
// spill 20-24 bytes in FA2's big-tile kernels (hdim 64 and 128, CUDA 13.0); this costs nothing in
// the key loop and one branch per tile of rows without sinks. Rows that see no key keep max =
// sink, sum = 1 and O = 0, hence LSE = sink, as the CPU reference defines.
#pragma once

namespace flashattn {
namespace cuda {

// One row half: `sink` in natural units (the scaled, capped scores'); row_max is kept in the
// kernels' unscaled units (times sl2 = scale * log2(e) in exp2), row_sum is this thread's part of
// the quad's sum (t: lane % 4; the sink's term e^0 = 1 goes to lane t == 0 only). An absent sink
// (-inf) leaves the empty state.
__device__ __forceinline__ void start_with_sink(float sink, float sl2, float &row_max, float &row_sum, int t) {
    if (sink == -INFINITY) return;
    row_max = sink * 1.4426950408889634f / sl2;
    row_sum = t == 0 ? 1.f : 0.f;
}

}  // namespace cuda
}  // namespace flashattn
