// gpu_rotate_hadamard in builds without FA2's kernels (no CUDA, or FLASHATTN_FA2_ARCHS empty).
#include "backends/hadamard.h"

#include "base/status.h"

namespace flashattn {

#ifndef FLASHATTN_HAVE_FA2
flashattn_status_t gpu_rotate_hadamard(const HadamardCall &) {
    return fail(FLASHATTN_ERROR_NOT_SUPPORTED,
                "device: this build has no CUDA rotation kernel (it comes with fa2, sm_80 and newer); pass -1 to "
                "rotate host memory");
}
#endif

}  // namespace flashattn
