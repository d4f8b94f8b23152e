// A build without NCCL: the NCCL transport is refused at finalize.
#include "cp/cp_transport.h"

namespace flashattn_cp {

std::unique_ptr<Transport> make_nccl_transport(void *, int, int, int, flashattn_status_t *status) {
    *status = set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                        "transport: this libflashattn_cp was built without NCCL (FLASHATTN_CP_TRANSPORT_NCCL)");
    return nullptr;
}

}  // namespace flashattn_cp
