// The NCCL transport: one rank per process (or thread), the caller's communicator. The exchange
// runs on a stream of its own so it overlaps the attention on the block in hand:
//   start: comm stream waits for the work enqueued so far on the caller's stream (the previous
//          step, which last read the slot about to be overwritten); grouped send to rank + 1 and
//          receive from rank − 1;
//   finish: the caller's stream waits for the channel's exchange before the next step reads the
//          slot. The backward's two channels (K/V blocks, dK / dV accumulators) share the comm
//          stream, in the order they start, but each has its own completion event.
// Run so far on one GPU only (2026-12-01, H200): a 1-rank communicator, including a send/receive
// to its own rank (tests/cp/test_cp_nccl.cpp); a ring of several ranks waits for a multi-GPU
// machine (tests/gpu/cp-multi.sh, issue 23).
#include <nccl.h>

#include "cp/cp_device.h"

namespace flashattn_cp {

namespace {

flashattn_status_t nccl_failed(ncclResult_t result, const char *what) {
    return set_error(FLASHATTN_ERROR_DEVICE, "%s: %s", what, ncclGetErrorString(result));
}

#define CP_NCCL(call, what)                                                   \
    do {                                                                      \
        const ncclResult_t cp_result_ = (call);                               \
        if (cp_result_ != ncclSuccess) return nccl_failed(cp_result_, what);   \
    } while (0)

// One execute at a time per plan: the events below are the plan's (documented in flashattn_cp.h).
class NcclTransport final : public DeviceTransport {
public:
    NcclTransport(ncclComm_t comm, int world, int rank, int device)
        : DeviceTransport(device), comm_(comm), world_(world), rank_(rank) {}
    ~NcclTransport() override {
        const DeviceScope scope(device_);
        if (ready_) cudaEventDestroy(ready_);
        for (cudaEvent_t done : done_)
            if (done) cudaEventDestroy(done);
        if (comm_stream_) cudaStreamDestroy(comm_stream_);
    }

    flashattn_status_t init() {
        int count = 0, user_rank = 0;
        CP_NCCL(ncclCommCount(comm_, &count), "comm");
        CP_NCCL(ncclCommUserRank(comm_, &user_rank), "comm");
        if (count != world_ || user_rank != rank_)
            return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                             "comm: has %d ranks and this is rank %d, but the plan says world size %d, rank %d", count,
                             user_rank, world_, rank_);
        const DeviceScope scope(device_);
        CP_CUDA(scope.error, "device");
        CP_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "comm stream");
        CP_CUDA(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "event");
        for (cudaEvent_t &done : done_) CP_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event");
        return FLASHATTN_SUCCESS;
    }

    int local_ranks() const override { return 1; }
    int first_rank() const override { return rank_; }

    flashattn_status_t start_exchange(Channel channel, const KvBlock *in_hand, const KvSlot *next, size_t k_bytes,
                                      size_t v_bytes, flashattn_stream_t stream) override {
        const auto caller = reinterpret_cast<cudaStream_t>(stream);
        const int to = (rank_ + 1) % world_, from = (rank_ + world_ - 1) % world_;
        CP_CUDA(cudaEventRecord(ready_, caller), "ring exchange");
        CP_CUDA(cudaStreamWaitEvent(comm_stream_, ready_, 0), "ring exchange");
        CP_NCCL(ncclGroupStart(), "ring exchange");
        ncclResult_t r = ncclSend(in_hand[0].k, k_bytes, ncclChar, to, comm_, comm_stream_);
        if (r == ncclSuccess) r = ncclSend(in_hand[0].v, v_bytes, ncclChar, to, comm_, comm_stream_);
        if (r == ncclSuccess) r = ncclRecv(next[0].k, k_bytes, ncclChar, from, comm_, comm_stream_);
        if (r == ncclSuccess) r = ncclRecv(next[0].v, v_bytes, ncclChar, from, comm_, comm_stream_);
        const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after a failure
        CP_NCCL(r, "ring exchange");
        CP_NCCL(end, "ring exchange");
        CP_CUDA(cudaEventRecord(done_[static_cast<int>(channel)], comm_stream_), "ring exchange");
        return FLASHATTN_SUCCESS;
    }

    flashattn_status_t finish_exchange(Channel channel, flashattn_stream_t stream) override {
        CP_CUDA(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), done_[static_cast<int>(channel)], 0),
                "ring exchange");
        return FLASHATTN_SUCCESS;
    }

private:
    ncclComm_t comm_;
    int world_, rank_;
    cudaStream_t comm_stream_ = nullptr;
    cudaEvent_t ready_ = nullptr, done_[kChannels] = {};
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(void *comm, int world_size, int rank, int device,
                                               flashattn_status_t *status) {
    std::unique_ptr<NcclTransport> transport(
        new NcclTransport(static_cast<ncclComm_t>(comm), world_size, rank, device));
    *status = transport->init();
    if (*status != FLASHATTN_SUCCESS) return nullptr;
    return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace flashattn_cp
