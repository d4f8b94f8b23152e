// The transport seam of the ring: how the K/V block in hand reaches the next rank. The schedule
// (cp_ring.cpp) is written once against this interface; the loopback transport plays every rank
// in one process (tests; on the host or on one GPU), the NCCL transport one rank per process. Memory operations the schedule
// needs besides the core library's calls (copies, the LSE scatter) also go through here, since
// they depend on where the tensors live (host for the CPU loopback, device for the GPU loopback and NCCL).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "flashattn/flashattn.h"

namespace flashattn_cp {

// Each rank merges one partial state per rank in one call.
constexpr int kMaxWorld = FLASHATTN_MAX_MERGE_PARTIALS;

#define FLASHATTN_CP_TRY(expr)                                          \
    do {                                                                \
        const flashattn_status_t cp_try_ = (expr);                      \
        if (cp_try_ != FLASHATTN_SUCCESS) return cp_try_;               \
    } while (0)

// One rank's K/V block buffers: what it holds now and where the next block arrives.
struct KvBlock {
    const void *k = nullptr;
    const void *v = nullptr;
};
struct KvSlot {
    void *k = nullptr;
    void *v = nullptr;
};

// What an exchange carries: the K/V blocks (forward and backward) or, in the backward, the fp32
// dK / dV accumulators that travel one step behind them. Each has its own completion, so the
// backward can wait for the accumulators without waiting for the next K/V block.
enum class Channel { kv = 0, grad = 1 };
constexpr int kChannels = 2;

// Rows [row_begin, row_begin + row_count) of every batch of a [batch][batch_rows][width] tensor:
// the rows one backward step's gradient part covers.
struct RowRange {
    size_t batch = 0, batch_rows = 0, row_begin = 0, row_count = 0, width = 0;
};

class Transport {
public:
    virtual ~Transport() = default;
    // Ranks this process plays (W for loopback, 1 otherwise) and the first of them.
    virtual int local_ranks() const = 0;
    virtual int first_rank() const = 0;
    // Pass each local rank's block in hand to rank + 1 and receive rank − 1's into its slot. The
    // loopback version copies at once; the NCCL version enqueues on its own stream, ordered after
    // the work enqueued so far on `stream`, and finish_exchange() orders `stream` after the
    // channel's last exchange.
    virtual flashattn_status_t start_exchange(Channel channel, const KvBlock *in_hand, const KvSlot *next,
                                              size_t k_bytes, size_t v_bytes, flashattn_stream_t stream) = 0;
    virtual flashattn_status_t finish_exchange(Channel channel, flashattn_stream_t stream) = 0;
    // dst[row][0 .. cols) = -inf and dst[row][cols .. 2·cols) = src[row][0 .. cols), for `rows` rows:
    // the LSE of a step that only the second local chunk took part in.
    // Called once by finalize with the LSE scatter's sizes (a device transport keeps a -inf row block).
    virtual flashattn_status_t prepare(size_t rows, size_t cols) {
        (void)rows;
        (void)cols;
        return FLASHATTN_SUCCESS;
    }
    virtual flashattn_status_t scatter_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                                       flashattn_stream_t stream) = 0;

    // The backward's arithmetic, where the tensors live:
    // dst[row][0 .. cols) = src[row][cols .. 2·cols): the LSE of the second local chunk's queries.
    virtual flashattn_status_t gather_lse_second_half(float *dst, const float *src, size_t rows, size_t cols,
                                                      flashattn_stream_t stream) = 0;
    // acc = part (add false) or acc += part (add true) on `rows`; part in `dtype`, acc fp32, both
    // laid out as [batch][batch_rows][width].
    virtual flashattn_status_t accumulate(float *acc, const void *part, int64_t dtype, const RowRange &rows,
                                          bool add, flashattn_stream_t stream) = 0;
    // out[i] = acc[i] rounded to `dtype`, for `count` elements.
    virtual flashattn_status_t store(void *out, const float *acc, int64_t dtype, size_t count,
                                     flashattn_stream_t stream) = 0;
    // Whether an output the ring writes itself (not through the core) is memory of the right
    // kind; the core checks the tensors it is handed.
    virtual flashattn_status_t check_output(const void *pointer, const char *name, int rank) const {
        (void)pointer;
        (void)name;
        (void)rank;
        return FLASHATTN_SUCCESS;
    }
};

// Loopback on the host (CPU-backend plans).
std::unique_ptr<Transport> make_loopback_transport(int world_size);
// Loopback on one GPU (GPU-backend plans: device pointers, the caller's stream); NULL when the
// build has no CUDA (cp_device_none.cpp), errors recorded through set_error.
std::unique_ptr<Transport> make_gpu_loopback_transport(int world_size, int device, flashattn_status_t *status);
// NULL when the build has no NCCL (cp_nccl_none.cpp); errors recorded through set_error.
std::unique_ptr<Transport> make_nccl_transport(void *comm, int world_size, int rank, int device,
                                               flashattn_status_t *status);

// Thread-local error message of the component (cp_api.cpp).
flashattn_status_t set_error(flashattn_status_t status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace flashattn_cp
