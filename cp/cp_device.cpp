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

namespace {

// Every rank's tensors and workspace on the plan's device; everything on the caller's stream, so
// the copies of an exchange are ordered after the previous step's reads and before the next
// step's (the ring never receives into a block in hand, cp_ring.cpp).
class GpuLoopbackTransport final : public Transport {
public:
    GpuLoopbackTransport(int world_size, int device) : world_(world_size), scatter_(device) {}
    int local_ranks() const override { return world_; }
    int first_rank() const override { return 0; }

    flashattn_status_t start_exchange(const KvBlock *in_hand, const KvSlot *next, size_t k_bytes, size_t v_bytes,
                                      flashattn_stream_t stream) override {
        const auto s = static_cast<cudaStream_t>(stream);
        for (int rank = 0; rank < world_; ++rank) {
            const KvBlock &from = in_hand[(rank + world_ - 1) % world_];
            CP_CUDA(cudaMemcpyAsync(next[rank].k, from.k, k_bytes, cudaMemcpyDeviceToDevice, s), "ring exchange");
            CP_CUDA(cudaMemcpyAsync(next[rank].v, from.v, v_bytes, cudaMemcpyDeviceToDevice, s), "ring exchange");
        }
        return FLASHATTN_SUCCESS;
    }
    flashattn_status_t finish_exchange(flashattn_stream_t) override { return FLASHATTN_SUCCESS; }

    flashattn_status_t prepare(size_t rows, size_t cols) override { return scatter_.prepare(rows, cols); }
    flashattn_status_t scatter_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                               flashattn_stream_t stream) override {
        return scatter_.scatter(dst, src, rows, cols, static_cast<cudaStream_t>(stream));
    }

private:
    int world_;
    DeviceLseScatter scatter_;
};

}  // namespace

std::unique_ptr<Transport> make_gpu_loopback_transport(int world_size, int device, flashattn_status_t *status) {
    *status = FLASHATTN_SUCCESS;
    return std::unique_ptr<Transport>(new GpuLoopbackTransport(world_size, device));
}

}  // namespace flashattn_cp
