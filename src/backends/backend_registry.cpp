// Which backends this build holds. A generation left out of the build (its FLASHATTN_FAn_ARCHS
// empty, or no CUDA) answers nullptr here, so dispatch needs no knowledge of the build.
#include "backends/backend.h"

namespace flashattn {

#ifndef FLASHATTN_HAVE_FA1
const Backend *fa1_backend() { return nullptr; }
#endif
#ifndef FLASHATTN_HAVE_FA2
const Backend *fa2_backend() { return nullptr; }
#endif
#ifndef FLASHATTN_HAVE_FA3
const Backend *fa3_backend() { return nullptr; }
#endif

const Backend *backend_by_id(flashattn_backend_t id) {
    switch (id) {
        case FLASHATTN_BACKEND_CPU: return cpu_backend();
        case FLASHATTN_BACKEND_FA1: return fa1_backend();
        case FLASHATTN_BACKEND_FA2: return fa2_backend();
        case FLASHATTN_BACKEND_FA3: return fa3_backend();
        default: return nullptr;
    }
}

}  // namespace flashattn
