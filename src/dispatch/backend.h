// The interface every backend implements, and what dispatch knows about the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "problem/problem.h"

namespace flashattn {

// The CUDA device a plan targets, as queried once at finalize.
struct DeviceInfo {
    bool present = false;  // false: no driver, no GPU, or built without CUDA
    int32_t device = 0;
    int32_t cc_major = 0;
    int32_t cc_minor = 0;
    int32_t sm_count = 0;
    size_t smem_per_block_optin = 0;  // bytes a block may opt in to
    int64_t l2_bytes = 0;             // L2 cache size
    bool has_sm90a_code = false;      // the library holds sm_90a kernels (FA3)
    std::string absent_reason = "libflashattn was built without CUDA";  // when !present
};

// Decisions a backend fixes at finalize and reuses on every execute.
struct Schedule {
    int32_t num_splits = 1;     // split-KV factor (GPU decode); 1 = no split
    int32_t cpu_threads = 1;    // worker threads (CPU backend)
    int32_t block_m = 0;        // query rows per tile, backend-specific
    int32_t block_n = 0;        // keys per tile, backend-specific
    int32_t grid_limit = 0;     // persistent kernels: thread blocks launched at most (0: not persistent)
    int32_t tile_group = 1;     // persistent kernels: work items scheduled together for L2 reuse
    int32_t q_blocks_per_cta = 1;  // FA1: query blocks each thread block walks in its inner loop
    size_t workspace_bytes = 0;
};

struct Backend {
    flashattn_backend_t id;
    const char *name;  // "cpu", "fa1", "fa2", "fa3"
    // Empty when the backend can run `p` on `dev`; otherwise one sentence saying why not.
    std::string (*unsupported_reason)(const Problem &p, const DeviceInfo &dev);
    // Fill in the schedule (and its workspace size) for a problem the backend supports.
    flashattn_status_t (*make_schedule)(const Problem &p, const DeviceInfo &dev, Schedule *out);
    // Run. Arguments have been checked by the C boundary; GPU backends only enqueue.
    flashattn_status_t (*execute)(const Problem &p, const Schedule &s, const Tensors &t);
    // Optional (may be null): empty when `auto` may choose this backend for a problem it supports,
    // otherwise why an older generation serves the problem better (forcing the backend still works).
    std::string (*auto_pass_reason)(const Problem &p, const DeviceInfo &dev);
};

// Backends compiled into this build; nullptr for those that are not.
const Backend *cpu_backend();
const Backend *fa1_backend();
const Backend *fa2_backend();
const Backend *fa3_backend();

}  // namespace flashattn
