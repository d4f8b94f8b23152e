// The C boundary of libflashattn_cp: argument checks, the component's thread-local error message,
// and no exception past this file.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <cstring>

#include "cp/cp_ring.h"
#include "flashattn/flashattn_cp.h"

struct flashattn_cp_plan {
    int64_t world_size = 0;
    int64_t rank = 0;
    int64_t transport = 0;
    void *nccl_comm = nullptr;
    std::unique_ptr<flashattn_cp::Ring> ring;  // set by finalize; null while unfinalized
};

namespace flashattn_cp {

namespace {
thread_local char last_error[512] = "";
}

flashattn_status_t set_error(flashattn_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

}  // namespace flashattn_cp

using flashattn_cp::set_error;

namespace {

template <typename F>
flashattn_status_t guarded(const char *function, F &&body) noexcept {
    try {
        flashattn_cp::last_error[0] = '\0';
        return body();
    } catch (const std::bad_alloc &) {
        return set_error(FLASHATTN_ERROR_ALLOCATION, "%s: host allocation failed", function);
    } catch (const std::exception &e) {
        return set_error(FLASHATTN_ERROR_INTERNAL, "%s: %s", function, e.what());
    } catch (...) {
        return set_error(FLASHATTN_ERROR_INTERNAL, "%s: unknown exception", function);
    }
}

flashattn_status_t check_finalized(const flashattn_cp_plan_t *plan, const char *function) {
    if (plan == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL passed to %s", function);
    if (!plan->ring)
        return set_error(FLASHATTN_ERROR_INVALID_STATE, "plan: not finalized; call flashattn_cp_plan_finalize");
    return FLASHATTN_SUCCESS;
}

// Byte range [begin, end) of one rank's contiguous tensor.
bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + b_bytes && y < x + a_bytes;
}

flashattn_status_t check_num_ranks(const flashattn_cp::Ring &ring, int32_t num_ranks) {
    if (num_ranks != ring.local_ranks())
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "num_ranks: %d, but this plan's process plays %d rank(s)",
                         static_cast<int>(num_ranks), ring.local_ranks());
    return FLASHATTN_SUCCESS;
}

flashattn_status_t check_workspace(const void *workspace, size_t workspace_bytes, size_t need) {
    if (workspace_bytes < need)
        return set_error(FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE, "workspace_bytes: %zu, the plan needs %zu",
                         workspace_bytes, need);
    if (need > 0 && workspace == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: NULL");
    if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
        return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: not aligned to 256 bytes");
    return FLASHATTN_SUCCESS;
}

// One argument's per-rank tensors, `bytes` each (the caller's array copied, so arrays of any
// pointer type are read as what they are).
struct Tensors {
    template <typename T>
    Tensors(T *const *array, const char *tensor_name, size_t tensor_bytes, int ranks)
        : name(tensor_name), bytes(tensor_bytes), count(ranks), null_array(array == nullptr) {
        for (int p = 0; p < ranks && array != nullptr; ++p) at[p] = array[p];
    }
    const char *name;
    size_t bytes;
    int count;
    bool null_array;
    const void *at[flashattn_cp::kMaxWorld] = {};
};

flashattn_status_t check_tensors(const Tensors &t) {
    if (t.null_array) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: NULL array", t.name);
    for (int p = 0; p < t.count; ++p)
        if (t.at[p] == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[%d]: NULL tensor", t.name, p);
    return FLASHATTN_SUCCESS;
}

// Every tensor of `a` apart from every tensor of `b` (from the others of `a` when b is a).
flashattn_status_t check_apart(const Tensors &a, const Tensors &b) {
    for (int p = 0; p < a.count; ++p)
        for (int r = 0; r < b.count; ++r)
            if (!(&a == &b && p == r) && overlaps(a.at[p], a.bytes, b.at[r], b.bytes))
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s[%d]: overlaps %s[%d]", a.name, p, b.name, r);
    return FLASHATTN_SUCCESS;
}

int64_t local_device(const flashattn_plan_t *local) {
    int64_t device = 0;
    flashattn_plan_get_i64(local, FLASHATTN_I64_DEVICE, &device);  // a finalized plan answers every key
    return device;
}

}  // namespace

extern "C" {

FLASHATTN_API const char *flashattn_cp_last_error(void) { return flashattn_cp::last_error; }

FLASHATTN_API flashattn_status_t flashattn_cp_plan_create(flashattn_cp_plan_t **plan) {
    return guarded(__func__, [&] {
        if (plan == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL output pointer");
        *plan = new flashattn_cp_plan_t();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API void flashattn_cp_plan_destroy(flashattn_cp_plan_t *plan) { delete plan; }

FLASHATTN_API flashattn_status_t flashattn_cp_plan_set_i64(flashattn_cp_plan_t *plan, flashattn_cp_i64_param_t key,
                                                           int64_t value) {
    return guarded(__func__, [&] {
        if (plan == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL");
        int key_value = 0;
        std::memcpy(&key_value, &key, sizeof key_value);  // an out-of-range enum is not loaded as one
        switch (key_value) {
        case FLASHATTN_CP_I64_WORLD_SIZE:
            if (value < 1 || value > flashattn_cp::kMaxWorld)
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: world size %lld is not in 1..%d",
                                 static_cast<long long>(value), flashattn_cp::kMaxWorld);
            plan->world_size = value;
            break;
        case FLASHATTN_CP_I64_RANK:
            if (value < 0 || value >= flashattn_cp::kMaxWorld)
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: rank %lld is not in 0..%d",
                                 static_cast<long long>(value), flashattn_cp::kMaxWorld - 1);
            plan->rank = value;
            break;
        case FLASHATTN_CP_I64_TRANSPORT:
            if (value != FLASHATTN_CP_TRANSPORT_LOOPBACK && value != FLASHATTN_CP_TRANSPORT_NCCL)
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "value: %lld is not a flashattn_cp_transport_t",
                                 static_cast<long long>(value));
            plan->transport = value;
            break;
        default:
            return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "key: %d is not a flashattn_cp_i64_param_t", key_value);
        }
        plan->ring.reset();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_set_nccl_comm(flashattn_cp_plan_t *plan, void *comm) {
    return guarded(__func__, [&] {
        if (plan == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL");
        if (comm == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "comm: NULL");
        plan->nccl_comm = comm;
        plan->ring.reset();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_finalize(flashattn_cp_plan_t *plan, const flashattn_plan_t *local) {
    return guarded(__func__, [&]() -> flashattn_status_t {
        if (plan == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NULL");
        if (local == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "local: NULL");
        plan->ring.reset();
        flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
        if (flashattn_plan_get_backend(local, &backend, nullptr) != FLASHATTN_SUCCESS)
            return set_error(FLASHATTN_ERROR_INVALID_STATE, "local: %s", flashattn_last_error());
        if (plan->world_size == 0)
            return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: FLASHATTN_CP_I64_WORLD_SIZE is not set");
        if (plan->transport == 0)
            return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: FLASHATTN_CP_I64_TRANSPORT is not set");
        if (plan->rank >= plan->world_size)
            return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: rank %lld is not below the world size %lld",
                             static_cast<long long>(plan->rank), static_cast<long long>(plan->world_size));
        const int world = static_cast<int>(plan->world_size), rank = static_cast<int>(plan->rank);
        std::unique_ptr<flashattn_cp::Transport> transport;
        if (plan->transport == FLASHATTN_CP_TRANSPORT_LOOPBACK) {
            if (rank != 0)
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: the loopback transport plays every rank; rank must be 0");
            if (backend == FLASHATTN_BACKEND_CPU) {
                transport = flashattn_cp::make_loopback_transport(world);
            } else {
                flashattn_status_t status = FLASHATTN_SUCCESS;
                transport = flashattn_cp::make_gpu_loopback_transport(world, static_cast<int>(local_device(local)), &status);
                if (!transport) return status;
            }
        } else {
            if (plan->nccl_comm == nullptr)
                return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "plan: NCCL transport without a communicator (flashattn_cp_plan_set_nccl_comm)");
            if (backend == FLASHATTN_BACKEND_CPU)
                return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "local: the NCCL transport needs a GPU-backend plan");
            flashattn_status_t status = FLASHATTN_SUCCESS;
            transport = flashattn_cp::make_nccl_transport(plan->nccl_comm, world, rank,
                                                          static_cast<int>(local_device(local)), &status);
            if (!transport) return status;
        }
        return flashattn_cp::Ring::build(local, world, std::move(transport), &plan->ring);
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_get_workspace_size(const flashattn_cp_plan_t *plan, size_t *bytes) {
    return guarded(__func__, [&, entry = __func__] {
        FLASHATTN_CP_TRY(check_finalized(plan, entry));
        if (bytes == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: NULL");
        *bytes = plan->ring->workspace_bytes();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_execute(const flashattn_cp_plan_t *plan, int32_t num_ranks,
                                                           const void *const *q, const void *const *k,
                                                           const void *const *v, void *const *o, float *const *lse,
                                                           void *workspace, size_t workspace_bytes,
                                                           flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        FLASHATTN_CP_TRY(check_finalized(plan, entry));
        const flashattn_cp::Ring &ring = *plan->ring;
        FLASHATTN_CP_TRY(check_num_ranks(ring, num_ranks));
        const int n = num_ranks;
        const flashattn_cp::TensorBytes size = ring.tensor_bytes();
        const Tensors arrays[] = {{q, "q", size.q, n}, {k, "k", size.k, n}, {v, "v", size.v, n}, {o, "o", size.o, n}};
        for (const Tensors &t : arrays) FLASHATTN_CP_TRY(check_tensors(t));
        const size_t need = ring.workspace_bytes();
        FLASHATTN_CP_TRY(check_workspace(workspace, workspace_bytes, need));
        // No tensor may overlap the workspace: the ring writes K/V blocks and partials there, and
        // the core checks each call's own tensors, not the partials it is handed later. (LSE
        // entries may be NULL here: a NULL one overlaps nothing.)
        const Tensors scratch(&workspace, "workspace", need, 1);
        const Tensors lses(lse, "lse", size.lse, lse ? n : 0);
        for (const Tensors &t : arrays) FLASHATTN_CP_TRY(check_apart(t, scratch));
        FLASHATTN_CP_TRY(check_apart(lses, scratch));
        return ring.execute(q, k, v, o, lse, static_cast<char *>(workspace), stream);
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_get_backward_workspace_size(const flashattn_cp_plan_t *plan,
                                                                               size_t *bytes) {
    return guarded(__func__, [&, entry = __func__] {
        FLASHATTN_CP_TRY(check_finalized(plan, entry));
        if (bytes == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: NULL");
        FLASHATTN_CP_TRY(plan->ring->backward_supported());
        *bytes = plan->ring->backward_workspace_bytes();
        return FLASHATTN_SUCCESS;
    });
}

FLASHATTN_API flashattn_status_t flashattn_cp_plan_execute_backward(
    const flashattn_cp_plan_t *plan, int32_t num_ranks, const void *const *q, const void *const *k,
    const void *const *v, const void *const *o, const void *const *dout, const float *const *lse, void *const *dq,
    void *const *dk, void *const *dv, void *workspace, size_t workspace_bytes, flashattn_stream_t stream) {
    return guarded(__func__, [&, entry = __func__] {
        FLASHATTN_CP_TRY(check_finalized(plan, entry));
        const flashattn_cp::Ring &ring = *plan->ring;
        FLASHATTN_CP_TRY(ring.backward_supported());
        FLASHATTN_CP_TRY(check_num_ranks(ring, num_ranks));
        const flashattn_cp::TensorBytes size = ring.tensor_bytes();
        const int n = num_ranks;
        const Tensors inputs[] = {{q, "q", size.q, n}, {k, "k", size.k, n},       {v, "v", size.v, n},
                                  {o, "o", size.o, n}, {dout, "dout", size.o, n}, {lse, "lse", size.lse, n}};
        const Tensors outputs[] = {{dq, "dq", size.q, n}, {dk, "dk", size.k, n}, {dv, "dv", size.v, n}};
        for (const Tensors &t : inputs) FLASHATTN_CP_TRY(check_tensors(t));
        for (const Tensors &t : outputs) FLASHATTN_CP_TRY(check_tensors(t));
        const size_t need = ring.backward_workspace_bytes();
        FLASHATTN_CP_TRY(check_workspace(workspace, workspace_bytes, need));
        // The ring writes the outputs itself, at the end: nothing it reads may lie under them, and
        // nothing may lie in the workspace, which it writes all along.
        const Tensors scratch(&workspace, "workspace", need, 1);
        for (const Tensors &in : inputs) FLASHATTN_CP_TRY(check_apart(in, scratch));
        for (const Tensors &out : outputs) {
            for (int p = 0; p < n; ++p) FLASHATTN_CP_TRY(ring.transport().check_output(out.at[p], out.name, p));
            for (const Tensors &other : inputs) FLASHATTN_CP_TRY(check_apart(out, other));
            for (const Tensors &other : outputs) FLASHATTN_CP_TRY(check_apart(out, other));
            FLASHATTN_CP_TRY(check_apart(out, scratch));
        }
        std::unique_ptr<flashattn_cp::RankGrads[]> ranks(new flashattn_cp::RankGrads[num_ranks]);
        for (int p = 0; p < num_ranks; ++p)
            ranks[p] = {q[p], k[p], v[p], o[p], dout[p], lse[p], dq[p], dk[p], dv[p]};
        return ring.execute_backward(ranks.get(), static_cast<char *>(workspace), stream);
    });
}

}  // extern "C"
