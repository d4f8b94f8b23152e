// The loopback transport: this process plays ranks 0 .. W−1 one after another, on the host (CPU
// backend). An exchange is W copies: rank r's receive slot gets rank r − 1's block in hand. The
// slots are never a block in hand (cp_ring.cpp), so the copies may run in any order.
#include <cmath>
#include <cstring>
#include <limits>

#include "cp/cp_transport.h"

namespace flashattn_cp {

namespace {

class LoopbackTransport final : public Transport {
public:
    explicit LoopbackTransport(int world_size) : world_(world_size) {}
    int local_ranks() const override { return world_; }
    int first_rank() const override { return 0; }

    flashattn_status_t start_exchange(const KvBlock *in_hand, const KvSlot *next, size_t k_bytes, size_t v_bytes,
                                      flashattn_stream_t) override {
        for (int rank = 0; rank < world_; ++rank) {
            const KvBlock &from = in_hand[(rank + world_ - 1) % world_];
            std::memcpy(next[rank].k, from.k, k_bytes);
            std::memcpy(next[rank].v, from.v, v_bytes);
        }
        return FLASHATTN_SUCCESS;
    }
    flashattn_status_t finish_exchange(flashattn_stream_t) override { return FLASHATTN_SUCCESS; }

    flashattn_status_t scatter_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                               flashattn_stream_t) override {
        const float minus_inf = -std::numeric_limits<float>::infinity();
        for (size_t row = 0; row < rows; ++row) {
            float *out = dst + row * 2 * cols;
            for (size_t i = 0; i < cols; ++i) out[i] = minus_inf;
            std::memcpy(out + cols, src + row * cols, cols * sizeof(float));
        }
        return FLASHATTN_SUCCESS;
    }

private:
    int world_;
};

}  // namespace

std::unique_ptr<Transport> make_loopback_transport(int world_size) {
    return std::unique_ptr<Transport>(new LoopbackTransport(world_size));
}

}  // namespace flashattn_cp
