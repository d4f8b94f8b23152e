// The GPU loopback transport (W ranks played in turn on one GPU, tests and debugging) and the
// device helpers it shares with the NCCL transport (cp_device.h).
#include "cp/cp_device.h"

#include <limits>
#include <vector>

namespace flashattn_cp {

DeviceLseScatter::~DeviceLseScatter() {
    if (neg_inf_ == nullptr) return;
    const DeviceScope scope(device_);
    cudaFree(neg_inf_);
}

flashattn_status_t DeviceLseScatter::prepare(size_t rows, size_t cols) {
    const std::vector<float> host(rows * cols, -std::numeric_limits<float>::infinity());
    const DeviceScope scope(device_);
    CP_CUDA(scope.error, "device");
    if (neg_inf_ != nullptr) {
        cudaFree(neg_inf_);
        neg_inf_ = nullptr;
    }
    CP_CUDA(cudaMalloc(&neg_inf_, host.size() * sizeof(float)), "-inf block");
    CP_CUDA(cudaMemcpy(neg_inf_, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "-inf block");
    rows_ = rows;
    cols_ = cols;
    return FLASHATTN_SUCCESS;
}

flashattn_status_t DeviceLseScatter::scatter(float *dst, const float *src, size_t rows, size_t cols,
                                             cudaStream_t stream) const {
    if (rows != rows_ || cols != cols_ || neg_inf_ == nullptr)
        return set_error(FLASHATTN_ERROR_INTERNAL, "ring: LSE scatter of an unprepared size");
    const size_t row_bytes = cols * sizeof(float);
    CP_CUDA(cudaMemcpy2DAsync(dst, 2 * row_bytes, neg_inf_, row_bytes, row_bytes, rows, cudaMemcpyDeviceToDevice,
                              stream),
            "LSE scatter");
    CP_CUDA(cudaMemcpy2DAsync(dst + cols, 2 * row_bytes, src, row_bytes, row_bytes, rows, cudaMemcpyDeviceToDevice,
                              stream),
            "LSE scatter");
    return FLASHATTN_SUCCESS;
}

flashattn_status_t DeviceTransport::scatter_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                                            flashattn_stream_t stream) {
    return scatter_.scatter(dst, src, rows, cols, static_cast<cudaStream_t>(stream));
}

flashattn_status_t DeviceTransport::gather_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                                           flashattn_stream_t stream) {
    const size_t row_bytes = cols * sizeof(float);
    CP_CUDA(cudaMemcpy2DAsync(dst, row_bytes, src + cols, 2 * row_bytes, row_bytes, rows, cudaMemcpyDeviceToDevice,
                              static_cast<cudaStream_t>(stream)),
            "LSE gather");
    return FLASHATTN_SUCCESS;
}

// The kernels run on the plan's device whatever the calling thread's current device is (a thread
// that never touched CUDA has device 0 current).
flashattn_status_t DeviceTransport::accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows,
                                               bool add, flashattn_stream_t stream) {
    const DeviceScope scope(device_);
    CP_CUDA(scope.error, "device");
    CP_CUDA(launch_grad_accumulate(acc, part, dtype, rows, add, static_cast<cudaStream_t>(stream)), "gradient sum");
    return FLASHATTN_SUCCESS;
}

flashattn_status_t DeviceTransport::store(void *out, const float *acc, int64_t dtype, size_t count,
                                          flashattn_stream_t stream) {
    const DeviceScope scope(device_);
    CP_CUDA(scope.error, "device");
    CP_CUDA(launch_grad_store(out, acc, dtype, count, static_cast<cudaStream_t>(stream)), "gradient store");
    return FLASHATTN_SUCCESS;
}

flashattn_status_t DeviceTransport::check_output(const void *pointer, const char *name, int rank) const {
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
    if (error != cudaSuccess) {
        cudaGetLastError();  // an unknown pointer is the caller's mistake, not a sticky error
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[%d]: not a pointer CUDA knows (%s)", name, rank,
                         cudaGetErrorString(error));
    }
    const bool device_memory = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
    if (!device_memory || attributes.device != device_)
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[%d]: not device memory of the plan's device %d", name,
                         rank, device_);
    return FLASHATTN_SUCCESS;
}

namespace {

// Every rank's tensors and workspace on the plan's device; everything on the caller's stream, so
// the copies of an exchange are ordered after the previous step's reads and before the next
// step's (the ring never receives into a block in hand, cp_ring.cpp); both channels are in order.
class GpuLoopbackTransport final : public DeviceTransport {
public:
    GpuLoopbackTransport(int world_size, int device) : DeviceTransport(device), world_(world_size) {}
    int local_ranks() const override { return world_; }
    int first_rank() const override { return 0; }

    flashattn_status_t start_exchange(Channel, const KvBlock *in_hand, const KvSlot *next, size_t k_bytes,
                                      size_t v_bytes, flashattn_stream_t stream) override {
        const auto s = static_cast<cudaStream_t>(stream);
        for (int rank = 0; rank < world_; ++rank) {
            const KvBlock &from = in_hand[(rank + world_ - 1) % world_];
            CP_CUDA(cudaMemcpyAsync(next[rank].k, from.k, k_bytes, cudaMemcpyDeviceToDevice, s), "ring exchange");
            CP_CUDA(cudaMemcpyAsync(next[rank].v, from.v, v_bytes, cudaMemcpyDeviceToDevice, s), "ring exchange");
        }
        return FLASHATTN_SUCCESS;
    }
    flashattn_status_t finish_exchange(Channel, flashattn_stream_t) override { return FLASHATTN_SUCCESS; }

private:
    int world_;
};

}  // namespace

std::unique_ptr<Transport> make_gpu_loopback_transport(int world_size, int device, flashattn_status_t *status) {
    *status = FLASHATTN_SUCCESS;
    return std::unique_ptr<Transport>(new GpuLoopbackTransport(world_size, device));
}

}  // namespace flashattn_cp
