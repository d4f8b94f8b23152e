// A build without the CUDA backends: the GPU loopback transport is refused at finalize.
#include "cp/cp_transport.h"

namespace flashattn_cp {

std::unique_ptr<Transport> make_gpu_loopback_transport(int, int, flashattn_status_t *status) {
    *status = set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                        "local: a GPU-backend plan, but this libflashattn_cp was built without CUDA");
    return nullptr;
}

}  // namespace flashattn_cp
