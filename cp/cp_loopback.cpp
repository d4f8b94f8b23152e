// The loopback transport: this process plays ranks 0 .. W−1 one after another, on the host (CPU
// backend). An exchange is W copies: rank r's receive slot gets rank r − 1's block in hand. The
// slots are never a block in hand (cp_ring.cpp), so the copies may run in any order. The
// backward's gradient arithmetic runs here too, in plain loops (one thread: the core's calls
// around it are the work).
#include <cmath>
#include <cstring>
#include <limits>

#include "cp/cp_host_convert.h"
#include "cp/cp_transport.h"

namespace flashattn_cp {

namespace {

class LoopbackTransport final : public Transport {
public:
    explicit LoopbackTransport(int world_size) : world_(world_size) {}
    int local_ranks() const override { return world_; }
    int first_rank() const override { return 0; }

    flashattn_status_t start_exchange(Channel, const KvBlock *in_hand, const KvSlot *next, size_t k_bytes,
                                      size_t v_bytes, flashattn_stream_t) override {
        for (int rank = 0; rank < world_; ++rank) {
            const KvBlock &from = in_hand[(rank + world_ - 1) % world_];
            std::memcpy(next[rank].k, from.k, k_bytes);
            std::memcpy(next[rank].v, from.v, v_bytes);
        }
        return FLASHATTN_SUCCESS;
    }
    flashattn_status_t finish_exchange(Channel, flashattn_stream_t) override { return FLASHATTN_SUCCESS; }

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

    flashattn_status_t gather_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                              flashattn_stream_t) override {
        for (size_t row = 0; row < rows; ++row) std::memcpy(dst + row * cols, src + (2 * row + 1) * cols, cols * sizeof(float));
        return FLASHATTN_SUCCESS;
    }

    flashattn_status_t accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows, bool add,
                                  flashattn_stream_t) override {
        switch (dtype) {
        case FLASHATTN_DTYPE_FP32: add_rows(acc, static_cast<const float *>(part), rows, add, [](float x) { return x; }); break;
        case FLASHATTN_DTYPE_FP16: add_rows(acc, static_cast<const uint16_t *>(part), rows, add, half_to_float); break;
        case FLASHATTN_DTYPE_BF16: add_rows(acc, static_cast<const uint16_t *>(part), rows, add, bf16_to_float); break;
        default: return set_error(FLASHATTN_ERROR_INTERNAL, "ring: gradient dtype %lld", static_cast<long long>(dtype));
        }
        return FLASHATTN_SUCCESS;
    }

    flashattn_status_t store(void *out, const float *acc, int64_t dtype, size_t count, flashattn_stream_t) override {
        switch (dtype) {
        case FLASHATTN_DTYPE_FP32: std::memcpy(out, acc, count * sizeof(float)); break;
        case FLASHATTN_DTYPE_FP16: round_all(static_cast<uint16_t *>(out), acc, count, float_to_half); break;
        case FLASHATTN_DTYPE_BF16: round_all(static_cast<uint16_t *>(out), acc, count, float_to_bf16); break;
        default: return set_error(FLASHATTN_ERROR_INTERNAL, "ring: gradient dtype %lld", static_cast<long long>(dtype));
        }
        return FLASHATTN_SUCCESS;
    }

private:
    template <typename T, typename ToFloat>
    static void add_rows(float *acc, const T *part, const RowRange &rows, bool add, ToFloat to_float) {
        const size_t count = rows.row_count * rows.width;
        for (size_t b = 0; b < rows.batch; ++b) {
            const size_t at = (b * rows.batch_rows + rows.row_begin) * rows.width;
            for (size_t i = at; i < at + count; ++i) acc[i] = add ? acc[i] + to_float(part[i]) : to_float(part[i]);
        }
    }
    template <typename Round>
    static void round_all(uint16_t *out, const float *acc, size_t count, Round round) {
        for (size_t i = 0; i < count; ++i) out[i] = round(acc[i]);
    }

    int world_;
};

}  // namespace

std::unique_ptr<Transport> make_loopback_transport(int world_size) {
    return std::unique_ptr<Transport>(new LoopbackTransport(world_size));
}

}  // namespace flashattn_cp
