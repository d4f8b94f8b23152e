#include "backends/cuda/host/cuda_host.h"

#include <algorithm>

#include "backends/cuda/host/tensor_args.h"

#include <cstdint>
#include <string>

#include "capi/error.h"

namespace flashattn {

flashattn_status_t cuda_fail(cudaError_t err, const char *what) {
    return fail(FLASHATTN_ERROR_DEVICE, "%s: CUDA error %d (%s): %s", what, static_cast<int>(err), cudaGetErrorName(err),
                cudaGetErrorString(err));
}

flashattn_status_t query_device(int32_t device, DeviceInfo *out) {
    DeviceInfo info;
    info.device = device;
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        // No driver ("driver version is insufficient"), no GPU: the machine has no device.
        cudaGetLastError();
        info.absent_reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
        *out = info;
        return FLASHATTN_SUCCESS;
    }
    if (device >= count) {
        info.absent_reason = "FLASHATTN_I64_DEVICE is " + std::to_string(device) + " but the machine has " +
                             std::to_string(count) + " CUDA device(s)";
        *out = info;
        return FLASHATTN_SUCCESS;
    }
    cudaDeviceProp prop;
    const cudaError_t perr = cudaGetDeviceProperties(&prop, device);
    if (perr != cudaSuccess) return cuda_fail(perr, "cudaGetDeviceProperties");
    info.present = true;
    info.absent_reason.clear();
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
    info.l2_bytes = prop.l2CacheSize;
#ifdef FLASHATTN_HAVE_FA3
    info.has_sm90a_code = true;
#endif
    *out = info;
    return FLASHATTN_SUCCESS;
}

namespace {

enum class Kind { host, device_on_plan, device_elsewhere, unknown };

Kind classify(const void *ptr, int device, int *owner) {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return Kind::unknown;
    }
    *owner = attr.device;
    switch (attr.type) {
        case cudaMemoryTypeDevice:
            return attr.device == device ? Kind::device_on_plan : Kind::device_elsewhere;
        case cudaMemoryTypeManaged:
            return Kind::device_on_plan;  // reachable from any device
        default:
            return Kind::host;
    }
}

flashattn_status_t check_device_pointer(const void *ptr, const char *name, int device, size_t alignment) {
    if (ptr == nullptr) return FLASHATTN_SUCCESS;
    int owner = -1;
    switch (classify(ptr, device, &owner)) {
        case Kind::device_on_plan: break;
        case Kind::device_elsewhere:
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
    FLASHATTN_TRY(check_device_pointer(t.cu_seqlens_q, "cu_seqlens_q", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.cu_seqlens_k, "cu_seqlens_k", dev, 4));
    FLASHATTN_TRY(check_device_pointer(t.workspace, "workspace", dev, 256));
    const size_t es = p.element_size();
    FLASHATTN_TRY(check_row_alignment(p.q, p.varlen, es, "Q"));
    FLASHATTN_TRY(check_row_alignment(p.k, p.varlen, es, "K"));
    FLASHATTN_TRY(check_row_alignment(p.v, p.varlen, es, "V"));
    FLASHATTN_TRY(check_row_alignment(p.o, p.varlen, es, "O"));
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_host_tensors(const Problem &p, const Tensors &t) {
    const struct { const void *ptr; const char *name; } all[] = {
        {t.q, "q"}, {t.k, "k"}, {t.v, "v"}, {t.o, "o"}, {t.lse, "lse"},
        {t.cu_seqlens_q, "cu_seqlens_q"}, {t.cu_seqlens_k, "cu_seqlens_k"}, {t.workspace, "workspace"}};
    for (const auto &a : all) {
        if (a.ptr == nullptr) continue;
        int owner = -1;
        const Kind kind = classify(a.ptr, p.device, &owner);
        if (kind == Kind::device_on_plan || kind == Kind::device_elsewhere) {
            cudaPointerAttributes attr;
            if (cudaPointerGetAttributes(&attr, a.ptr) == cudaSuccess && attr.type == cudaMemoryTypeManaged) continue;
            return fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: device memory, but the plan runs on the CPU backend", a.name);
        }
    }
    return FLASHATTN_SUCCESS;
}

DeviceGuard::DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
        cudaGetLastError();
        saved_ = -1;
    }
    if (saved_ != device) {
        err_ = cudaSetDevice(device);
        switched_ = err_ == cudaSuccess;
    }
}

DeviceGuard::~DeviceGuard() {
    if (switched_ && saved_ >= 0) cudaSetDevice(saved_);
}

void fill_tensor_args(const Problem &p, const Tensors &t, TensorArgs *out) {
    TensorArgs a;
    a.q = t.q;
    a.k = t.k;
    a.v = t.v;
    a.o = t.o;
    a.lse = t.lse;
    a.cu_q = p.varlen ? t.cu_seqlens_q : nullptr;
    a.cu_k = p.varlen ? t.cu_seqlens_k : nullptr;
    a.q_bs = p.q.batch, a.q_rs = p.q.row, a.q_hs = p.q.head;
    a.k_bs = p.k.batch, a.k_rs = p.k.row, a.k_hs = p.k.head;
    a.v_bs = p.v.batch, a.v_rs = p.v.row, a.v_hs = p.v.head;
    a.o_bs = p.o.batch, a.o_rs = p.o.row, a.o_hs = p.o.head;
    a.batch = static_cast<int32_t>(p.batch);
    a.seqlen_q = static_cast<int32_t>(p.seqlen_q);
    a.seqlen_k = static_cast<int32_t>(p.seqlen_k);
    a.heads_q = static_cast<int32_t>(p.heads_q);
    a.heads_kv = static_cast<int32_t>(p.heads_kv);
    a.group = static_cast<int32_t>(p.group_size());
    a.head_dim = static_cast<int32_t>(p.head_dim);
    a.total_rows = p.total_query_rows();
    // exp2 with log2(e) folded in; with a softcap the kernels compute cap*tanh(raw*scale/cap) and
    // the exp2 multiplier applies to that.
    constexpr double kLog2e = 1.4426950408889634;
    a.score_log2 = static_cast<float>((p.softcap > 0.0 ? p.softcap : p.scale) * kLog2e);
    a.softcap_scale = p.softcap > 0.0 ? static_cast<float>(p.scale / p.softcap) : 0.f;
    int64_t right = kUnboundedWindow;
    if (p.causal) right = 0;
    if (p.window_right >= 0) right = std::min(right, p.window_right);
    a.right = right;
    a.left = p.window_left >= 0 ? p.window_left : kUnboundedWindow;
    a.right_i = static_cast<int32_t>(std::min<int64_t>(a.right, int64_t(1) << 29));
    a.left_i = static_cast<int32_t>(std::min<int64_t>(a.left, int64_t(1) << 29));
    *out = a;
}

std::string tensor_core_shape_problem(const Problem &p, const char *backend) {
    const std::string who = std::string("the ") + backend + " backend";
    if (p.dtype != FLASHATTN_DTYPE_FP16 && p.dtype != FLASHATTN_DTYPE_BF16)
        return who + " supports only fp16 and bf16 tensors";
    if (p.head_dim_v != p.head_dim)
        return who + " needs head_dim_v equal to head_dim (got " + std::to_string(p.head_dim) + " and " +
               std::to_string(p.head_dim_v) + ")";
    if (p.head_dim < 8 || p.head_dim > 256 || p.head_dim % 8 != 0)
        return who + " supports head dims 8..256 in multiples of 8 (got " + std::to_string(p.head_dim) + ")";
    return std::string();
}

flashattn_status_t check_launch(const char *kernel_name) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cuda_fail(err, kernel_name);
    return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
