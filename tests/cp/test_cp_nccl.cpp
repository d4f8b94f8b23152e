// libflashattn_cp's NCCL transport on one GPU, a real NCCL run with a 1-rank communicator:
//  1. the transport itself (compiled into this test) sends a K/V block to its own rank, the
//     grouped ncclSend/ncclRecv a W-rank ring makes each step, on its own stream ordered by events
//     with the caller's; the LSE scatter; a communicator whose size disagrees is refused;
//  2. the public API: a W = 1 plan over the communicator against one single core call on the same
//     GPU and a double reference on sampled rows, causal and not; W = 2 on a 1-rank communicator
//     is refused at finalize.
// Exit 77 (skipped) without a GPU. More ranks need more GPUs: tests/gpu/cp-multi.sh.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cp/cp_transport.h"
#include "flashattn/flashattn_cp.h"

namespace flashattn_cp {
// The transport reports through set_error, which lives in cp_api.cpp inside the library (hidden);
// this test's copy of the transport records here.
static char transport_error[512];
flashattn_status_t set_error(flashattn_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(transport_error, sizeof transport_error, format, args);
    va_end(args);
    return status;
}
}  // namespace flashattn_cp

namespace {

int failures = 0;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            ++failures;                                                         \
            std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            std::fprintf(stderr, __VA_ARGS__);                                  \
            std::fprintf(stderr, "\n");                                         \
        }                                                                       \
    } while (0)

uint64_t rng = 0x243f6a8885a308d3ull;
uint32_t next_u32() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return static_cast<uint32_t>(rng >> 32);
}
float uniform() { return static_cast<float>(next_u32() * (1.0 / 4294967296.0)) * 2.0f - 1.0f; }

uint16_t to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

template <typename T>
T *device_copy(const std::vector<T> &host) {
    T *p = nullptr;
    cudaMalloc(&p, host.size() * sizeof(T));
    cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
}
template <typename T>
std::vector<T> host_copy(const T *device, size_t count) {
    std::vector<T> host(count);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
}
void *device_poisoned(size_t bytes) {
    void *p = nullptr;
    cudaMalloc(&p, bytes);
    cudaMemset(p, 0xff, bytes);
    return p;
}

void test_transport(ncclComm_t comm) {
    using namespace flashattn_cp;
    flashattn_status_t status = FLASHATTN_SUCCESS;
    std::unique_ptr<Transport> wrong = make_nccl_transport(comm, 2, 0, 0, &status);
    CHECK(!wrong && status == FLASHATTN_ERROR_INVALID_ARGUMENT && std::strstr(transport_error, "comm"),
          "a 1-rank communicator for world size 2: status %d, %s", status, transport_error);
    std::unique_ptr<Transport> transport = make_nccl_transport(comm, 1, 0, 0, &status);
    CHECK(transport && status == FLASHATTN_SUCCESS, "transport: %s", transport_error);
    if (!transport) return;

    // Odd byte counts: nothing may assume whole elements or aligned tails.
    const size_t k_bytes = 123457, v_bytes = 777;
    std::vector<uint8_t> k(k_bytes), v(v_bytes);
    for (auto &b : k) b = static_cast<uint8_t>(next_u32());
    for (auto &b : v) b = static_cast<uint8_t>(next_u32());
    uint8_t *dk = device_copy(k), *dv = device_copy(v);
    void *slot_k = device_poisoned(k_bytes), *slot_v = device_poisoned(v_bytes);
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    const KvBlock in_hand{dk, dv};
    const KvSlot next{slot_k, slot_v};
    for (int round = 0; round < 4; ++round) {  // the events and the stream are reused each step
        // Both channels (the backward sends its dK / dV accumulators on the second).
        const Channel channel = round % 2 ? Channel::grad : Channel::kv;
        cudaMemsetAsync(slot_k, 0xff, k_bytes, stream);
        cudaMemsetAsync(slot_v, 0xff, v_bytes, stream);
        CHECK(transport->start_exchange(channel, &in_hand, &next, k_bytes, v_bytes, stream) == FLASHATTN_SUCCESS,
              "start_exchange: %s", transport_error);
        CHECK(transport->finish_exchange(channel, stream) == FLASHATTN_SUCCESS, "finish_exchange: %s",
              transport_error);
        cudaStreamSynchronize(stream);
        CHECK(host_copy(static_cast<uint8_t *>(slot_k), k_bytes) == k, "round %d: K block not received intact", round);
        CHECK(host_copy(static_cast<uint8_t *>(slot_v), v_bytes) == v, "round %d: V block not received intact", round);
    }

    // The LSE scatter: [-inf × cols, src row] per row.
    const size_t rows = 5, cols = 7;
    std::vector<float> src(rows * cols);
    for (auto &x : src) x = uniform();
    float *dsrc = device_copy(src);
    float *ddst = static_cast<float *>(device_poisoned(rows * 2 * cols * sizeof(float)));
    CHECK(transport->prepare(rows, cols) == FLASHATTN_SUCCESS, "prepare: %s", transport_error);
    CHECK(transport->scatter_lse_second_half(ddst, dsrc, rows, cols, stream) == FLASHATTN_SUCCESS, "scatter: %s",
          transport_error);
    cudaStreamSynchronize(stream);
    const std::vector<float> dst = host_copy(ddst, rows * 2 * cols);
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < cols; ++i) {
            CHECK(std::isinf(dst[r * 2 * cols + i]) && dst[r * 2 * cols + i] < 0, "scatter row %zu col %zu: not -inf", r, i);
            CHECK(dst[r * 2 * cols + cols + i] == src[r * cols + i], "scatter row %zu col %zu: wrong value", r, i);
        }
    CHECK(transport->scatter_lse_second_half(ddst, dsrc, rows + 1, cols, stream) == FLASHATTN_ERROR_INTERNAL,
          "scatter of an unprepared size");
    std::printf("transport: self send/recv of %zu + %zu bytes x4 (both channels), LSE scatter %zux%zu: checked\n", k_bytes, v_bytes,
                rows, cols);
    transport.reset();
    cudaStreamDestroy(stream);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(slot_k);
    cudaFree(slot_v);
    cudaFree(dsrc);
    cudaFree(ddst);
}

flashattn_plan_t *core_plan(int64_t rows, int64_t heads_q, int64_t heads_kv, int64_t dim, int causal) {
    flashattn_plan_t *plan = nullptr;
    flashattn_plan_create(&plan);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_BATCH, 1);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_Q, rows);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_SEQLEN_K, rows);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_Q, heads_q);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEADS_KV, heads_kv);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_HEAD_DIM, dim);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_DTYPE, FLASHATTN_DTYPE_BF16);
    flashattn_plan_set_i64(plan, FLASHATTN_I64_CAUSAL, causal);
    if (flashattn_plan_finalize(plan) != FLASHATTN_SUCCESS) {
        std::fprintf(stderr, "core finalize: %s\n", flashattn_last_error());
        flashattn_plan_destroy(plan);
        return nullptr;
    }
    return plan;
}

// Double reference of one query row (bf16 inputs widened), O row and LSE.
void reference_row(const std::vector<uint16_t> &q, const std::vector<uint16_t> &k, const std::vector<uint16_t> &v,
                   int64_t rows, int64_t hq, int64_t hkv, int64_t dim, int causal, int64_t i, int64_t h,
                   std::vector<double> *out, double *lse) {
    const int64_t g = h / (hq / hkv);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    std::vector<double> s(rows, -INFINITY);
    double max = -INFINITY;
    for (int64_t j = 0; j < rows && !(causal && j > i); ++j) {
        double dot = 0;
        for (int64_t d = 0; d < dim; ++d)
            dot += static_cast<double>(from_bf16(q[(i * hq + h) * dim + d])) * from_bf16(k[(j * hkv + g) * dim + d]);
        s[j] = dot * scale;
        if (s[j] > max) max = s[j];
    }
    out->assign(dim, 0.0);
    double sum = 0;
    for (int64_t j = 0; j < rows && !(causal && j > i); ++j) {
        const double p = std::exp(s[j] - max);
        sum += p;
        for (int64_t d = 0; d < dim; ++d) (*out)[d] += p * from_bf16(v[(j * hkv + g) * dim + d]);
    }
    for (auto &x : *out) x /= sum;
    *lse = max + std::log(sum);
}

void test_public_api(ncclComm_t comm, int causal) {
    const int64_t rows = 514, hq = 8, hkv = 2, dim = 128;  // L/2 = 257: odd chunks
    flashattn_plan_t *local = core_plan(rows, hq, hkv, dim, causal);
    CHECK(local, "core plan");
    if (!local) return;
    std::vector<uint16_t> q(rows * hq * dim), k(rows * hkv * dim), v(rows * hkv * dim);
    for (auto &x : q) x = to_bf16(2 * uniform());
    for (auto &x : k) x = to_bf16(2 * uniform());
    for (auto &x : v) x = to_bf16(uniform());
    uint16_t *dq = device_copy(q), *dk = device_copy(k), *dv = device_copy(v);
    const size_t o_count = rows * hq * dim, lse_count = hq * rows;
    void *single_o = device_poisoned(o_count * 2), *ring_o = device_poisoned(o_count * 2);
    float *single_lse = static_cast<float *>(device_poisoned(lse_count * 4));
    float *ring_lse = static_cast<float *>(device_poisoned(lse_count * 4));
    size_t ws_bytes = 0;
    flashattn_plan_get_workspace_size(local, &ws_bytes);
    void *ws = device_poisoned(ws_bytes + 1);
    CHECK(flashattn_plan_execute(local, dq, dk, dv, single_o, single_lse, ws, ws_bytes, nullptr) == FLASHATTN_SUCCESS,
          "single call: %s", flashattn_last_error());

    flashattn_cp_plan_t *cp = nullptr;
    flashattn_cp_plan_create(&cp);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_TRANSPORT, FLASHATTN_CP_TRANSPORT_NCCL);
    flashattn_cp_plan_set_nccl_comm(cp, comm);
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 2);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_ERROR_INVALID_ARGUMENT &&
              std::strstr(flashattn_cp_last_error(), "comm"),
          "world size 2 on a 1-rank communicator: %s", flashattn_cp_last_error());
    flashattn_cp_plan_set_i64(cp, FLASHATTN_CP_I64_WORLD_SIZE, 1);
    CHECK(flashattn_cp_plan_finalize(cp, local) == FLASHATTN_SUCCESS, "finalize: %s", flashattn_cp_last_error());
    size_t cp_bytes = 0;
    flashattn_cp_plan_get_workspace_size(cp, &cp_bytes);
    void *cp_ws = device_poisoned(cp_bytes);
    const void *qs[1] = {dq}, *ks[1] = {dk}, *vs[1] = {dv};
    void *os[1] = {ring_o};
    float *lses[1] = {ring_lse};
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    CHECK(flashattn_cp_plan_execute(cp, 1, qs, ks, vs, os, lses, cp_ws, cp_bytes, stream) == FLASHATTN_SUCCESS,
          "cp execute: %s", flashattn_cp_last_error());
    cudaStreamSynchronize(stream);

    const std::vector<uint16_t> o1 = host_copy(static_cast<uint16_t *>(single_o), o_count),
                                o2 = host_copy(static_cast<uint16_t *>(ring_o), o_count);
    const std::vector<float> l1 = host_copy(single_lse, lse_count), l2 = host_copy(ring_lse, lse_count);
    double worst = 0, worst_ref = 0;
    for (size_t i = 0; i < o_count; ++i) {
        const double d = std::fabs(static_cast<double>(from_bf16(o1[i])) - from_bf16(o2[i]));
        if (!(d <= worst)) worst = d;
    }
    for (size_t i = 0; i < lse_count; ++i) {
        const double d = std::fabs(static_cast<double>(l1[i]) - l2[i]);
        if (!(d <= worst)) worst = d;
    }
    std::vector<double> ref;
    for (int64_t i = 0; i < rows; i += 37)
        for (int64_t h = 0; h < hq; ++h) {
            double ref_lse = 0;
            reference_row(q, k, v, rows, hq, hkv, dim, causal, i, h, &ref, &ref_lse);
            for (int64_t d = 0; d < dim; ++d) {
                const double e = std::fabs(from_bf16(o2[(i * hq + h) * dim + d]) - ref[d]);
                if (!(e <= worst_ref)) worst_ref = e;
            }
            const double e = std::fabs(l2[h * rows + i] - ref_lse);
            if (!(e <= worst_ref)) worst_ref = e;
        }
    CHECK(worst <= 1e-2, "causal=%d: W=1 NCCL ring vs single call: %g", causal, worst);
    CHECK(worst_ref <= 2e-2, "causal=%d: W=1 NCCL ring vs double reference: %g", causal, worst_ref);
    std::printf("public API, 1-rank communicator, L=%lld hq=%lld hkv=%lld d=%lld bf16 causal=%d: vs single %.2e, "
                "vs double reference (sampled rows) %.2e\n",
                static_cast<long long>(rows), static_cast<long long>(hq), static_cast<long long>(hkv),
                static_cast<long long>(dim), causal, worst, worst_ref);
    flashattn_cp_plan_destroy(cp);
    cudaStreamDestroy(stream);
    flashattn_plan_destroy(local);
    for (void *p : {static_cast<void *>(dq), static_cast<void *>(dk), static_cast<void *>(dv), single_o, ring_o,
                    static_cast<void *>(single_lse), static_cast<void *>(ring_lse), ws, cp_ws})
        cudaFree(p);
}

}  // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no CUDA device: skipped\n");
        return 77;
    }
    int version = 0;
    ncclGetVersion(&version);
    ncclComm_t comm = nullptr;
    const int device = 0;
    const ncclResult_t r = ncclCommInitAll(&comm, 1, &device);
    if (r != ncclSuccess) {
        std::fprintf(stderr, "FAIL ncclCommInitAll: %s\n", ncclGetErrorString(r));
        return 1;
    }
    std::printf("NCCL %d, a 1-rank communicator on device 0\n", version);
    test_transport(comm);
    test_public_api(comm, 0);
    test_public_api(comm, 1);
    ncclCommDestroy(comm);
    if (failures) {
        std::fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    std::printf("all cp NCCL tests passed\n");
    return 0;
}
