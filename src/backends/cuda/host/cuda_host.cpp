#include "backends/cuda/host/cuda_host.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/status.h"
#include "device/cuda_status.h"
#include "device/device.h"

namespace flashattn {

namespace {

flashattn_status_t check_device_pointer(const void *ptr, const char *name, int device, size_t alignment) {
    if (ptr == nullptr) return FLASHATTN_SUCCESS;
    int32_t owner = -1;
    switch (memory_kind(ptr, &owner)) {
        case MemoryKind::managed: break;  // reachable from any device
        case MemoryKind::device:
            if (owner == device) break;
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: device memory of device %d, but the plan runs on device %d", name,
                        owner, device);
        default:
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                        "%s: not device memory; GPU backends need cudaMalloc'd (or managed) memory on device %d", name, device);
    }
    if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0)
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: must be aligned to %zu bytes", name, alignment);
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_row_alignment(const Strides &s, bool varlen, size_t element_size, const char *name) {
    const int64_t vec = static_cast<int64_t>(16 / element_size);
    if (s.row % vec != 0 || s.head % vec != 0 || (!varlen && s.batch % vec != 0))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "%s strides: GPU backends need every stride to be a multiple of %lld elements (16 bytes)", name,
                    (long long)vec);
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t check_device_tensors(const Problem &p, const Tensors &t) {
    const int dev = p.device;
    FLASHATTN_TRY(check_device_pointer(t.q, "q", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.k, "k", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.v, "v", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.o, "o", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.lse, "lse", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.sink_logits, "sink_logits", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.alibi_slopes, "alibi_slopes", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.dsink_logits, "dsink_logits", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.cu_seqlens_q, "cu_seqlens_q", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.cu_seqlens_k, "cu_seqlens_k", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.workspace, "workspace", dev, 1));  // aligned: checked at the C boundary
    // serving (null unless the plan uses them)
    FLASHATTN_TRY(check_device_pointer(t.page_table, "page_table", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.seqused_k, "seqused_k", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.k_new, "k_new", dev, 2));
    FLASHATTN_TRY(check_device_pointer(t.v_new, "v_new", dev, 2));
    FLASHATTN_TRY(check_device_pointer(t.rotary_cos, "rotary_cos", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.rotary_sin, "rotary_sin", dev, 4));
    const size_t es = p.element_size();
    FLASHATTN_TRY(check_row_alignment(p.q, p.varlen, es, "Q"));
    FLASHATTN_TRY(check_row_alignment(p.k, p.varlen, es, "K"));
    FLASHATTN_TRY(check_row_alignment(p.v, p.varlen, es, "V"));
    FLASHATTN_TRY(check_row_alignment(p.o, p.varlen, es, "O"));
    if (t.dq == nullptr) return FLASHATTN_SUCCESS;  // a forward call: the gradients' layouts do not matter
    FLASHATTN_TRY(check_device_pointer(t.dout, "dout", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.dq, "dq", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.dk, "dk", dev, 16));
    FLASHATTN_TRY(check_device_pointer(t.dv, "dv", dev, 16));
    FLASHATTN_TRY(check_row_alignment(p.dout, p.varlen, es, "dO"));
    FLASHATTN_TRY(check_row_alignment(p.dq, p.varlen, es, "dQ"));
    FLASHATTN_TRY(check_row_alignment(p.dk, p.varlen, es, "dK"));
    FLASHATTN_TRY(check_row_alignment(p.dv, p.varlen, es, "dV"));
    return FLASHATTN_SUCCESS;
}

DeviceGuard::DeviceGuard(int device, bool need_context) {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
        cudaGetLastError();
        saved_ = -1;
    }
    if (saved_ != device) {
        err_ = cudaSetDevice(device);
        switched_ = err_ == cudaSuccess;
    } else if (need_context) {
        err_ = cudaSetDevice(device);  // the device is already the current one: nothing to restore
    }
}

DeviceGuard::~DeviceGuard() {
    if (switched_ && saved_ >= 0) cudaSetDevice(saved_);
}

std::string tensor_core_shape_problem(const Problem &p, const char *backend, bool any_head_dim_v) {
    const std::string who = std::string("the ") + backend + " backend";
    if (p.fp8())
        return who + " has no FP8 (E4M3) kernel" +
               (std::string(backend) == "fa3" ? " in this release yet (issue 17); the cpu backend runs FP8 plans"
                                              : "; FP8 tensor cores are Hopper's (fa3); the cpu backend runs FP8 plans");
    if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16)
        return who + " supports only fp16 and bf16 tensors";
    if (p.head_dim_v != p.head_dim && !any_head_dim_v)
        return who + " needs head_dim_v equal to head_dim (got " + std::to_string(p.head_dim) + " and " +
               std::to_string(p.head_dim_v) + ")";
    if (p.head_dim < 8 || p.head_dim > 256 || p.head_dim % 8 != 0)
        return who + " supports head dims 8..256 in multiples of 8 (got " + std::to_string(p.head_dim) + ")";
    if (p.head_dim_v < 8 || p.head_dim_v > 256 || p.head_dim_v % 8 != 0)
        return who + " supports head_dim_v 8..256 in multiples of 8 (got " + std::to_string(p.head_dim_v) + ")";
    return std::string();
}

flashattn_status_t check_launch(const char *kernel_name) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, kernel_name);
    return FLASHATTN_SUCCESS;
}

bool knob_off(const char *name) {
    const char *env = std::getenv(name);
    return env != nullptr && std::strcmp(env, "0") == 0;
}

flashattn_status_t zero_sink_gradient(const Problem &p, const Tensors &t, const char *what) {
    if (t.dsink_logits == nullptr || p.heads_q == 0) return FLASHATTN_SUCCESS;
    const cudaError_t err = cudaMemsetAsync(t.dsink_logits, 0, static_cast<size_t>(p.heads_q) * sizeof(float),
                                            reinterpret_cast<cudaStream_t>(t.stream));
    return err == cudaSuccess ? FLASHATTN_SUCCESS
                              : cuda_fail(err, (std::string(what) + " backward: zeroing dsink_logits").c_str());
}

}  // namespace flashattn
