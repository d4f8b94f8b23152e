// The fa2 backend's instantiation of the shared serving append (device/cache_append.cuh), compiled
// for fa2's architectures.
#include "backends/cuda/device/cache_append.cuh"
#include "backends/cuda/fa2/fa2_append.h"

namespace flashattn {
namespace fa2 {

cudaError_t launch_append(const AppendParams &a, bool bf16, cudaStream_t s) { return cuda::launch_cache_append(a, bf16, s); }

namespace {
// Page table row b = {b}: a contiguous cache [batch, seqlen_k, heads_kv, d] read as one page per
// sequence (kSequencePagesMax sequences at most: 4 KB of device data).
struct SequencePages {
    int32_t page[kSequencePagesMax];
};
constexpr SequencePages make_sequence_pages() {
    SequencePages t{};
    for (int i = 0; i < kSequencePagesMax; ++i) t.page[i] = i;
    return t;
}
__device__ const SequencePages g_sequence_pages = make_sequence_pages();
}  // namespace

cudaError_t sequence_pages(const int32_t **out) {
    void *addr = nullptr;
    const cudaError_t e = cudaGetSymbolAddress(&addr, g_sequence_pages);
    *out = static_cast<const int32_t *>(addr);
    return e;
}

}  // namespace fa2
}  // namespace flashattn
