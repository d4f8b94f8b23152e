#include "dispatch/dispatch.h"

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "base/status.h"
#include "device/device.h"
#include "dispatch/decide.h"
#include "problem/fp8.h"
#include "problem/resolve.h"

namespace flashattn {
namespace {

flashattn_status_t requested_backend(const PlanParams &params, flashattn_backend_t *out) {
    *out = static_cast<flashattn_backend_t>(params.get(FLASHATTN_I64_BACKEND, FLASHATTN_BACKEND_AUTO));
    if (*out != FLASHATTN_BACKEND_AUTO) return FLASHATTN_SUCCESS;
    const char *env = std::getenv("FLASHATTN_BACKEND");
    if (env == nullptr || *env == '\0') return FLASHATTN_SUCCESS;
    if (!parse_backend_name(env, out))
        return fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
                    "FLASHATTN_BACKEND: environment value '%s' is not one of auto, cpu, fa1, fa2, fa3", env);
    return FLASHATTN_SUCCESS;
}

// Empty when backend `b` runs every variant `p` uses in the pass whose VariantBits are `runs`.
std::string variant_reason(const Problem &p, const Backend &b, unsigned runs, const char *pass) {
    const unsigned missing = variants_used(p) & ~runs;
    if (missing == 0) return std::string();
    char names[256];
    return std::string("the ") + b.name + " " + pass + " does not run " + variant_names(missing, names, sizeof names);
}

// Which backend runs which serving feature (paged K/V, seqused_k, append with rotary), in one
// place while the GPU support grows: the CPU, FA2 and FA3 all of them (FA2 and FA3 add their own
// limits in their unsupported_reason); FA1 seqused_k (its loads stop at each sequence's key count,
// cuda::seq_info) and the append (the shared pre-kernels, host/cache_append.h), but no paged
// cache. Empty when `b` runs everything `problem` uses; otherwise why not, naming the key.
std::string serving_unsupported(const Backend &b, const Problem &problem) {
    const Serving &sv = problem.serving;
    if (!sv.any() || b.id != FLASHATTN_BACKEND_FA1) return std::string();
    const std::string name = b.name;
    if (sv.paged)
        return name + " does not implement a paged K/V cache (FLASHATTN_I64_PAGED_KV); fa2, fa3 and the cpu backend do";
    return std::string();
}

// Each compiled backend's backward support for the problem (unsupported: why not).
void backward_candidates(const Problem &problem, const DeviceInfo &dev, Candidate candidates[5]) {
    for (flashattn_backend_t id : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_FA1, FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA3}) {
        const Backend *b = backend_by_id(id);
        candidates[id] = Candidate{};
        candidates[id].compiled = b != nullptr;
        if (b == nullptr) continue;
        if (b->execute_backward == nullptr)
            candidates[id].unsupported = std::string(b->name) + " has no backward pass";
        else if (id != FLASHATTN_BACKEND_CPU && !dev.present)
            candidates[id].unsupported = dev.absent_reason;
        else if (const char *feature = serving_feature(problem))
            candidates[id].unsupported = std::string("the backward pass does not support ") + feature;
        else if (problem.fp8())
            candidates[id].unsupported = "the backward pass does not support FP8 (E4M3) inputs: quantized Q, K, V "
                                         "are an inference format; train in bf16 or fp16";
        else
            candidates[id].unsupported = b->backward_unsupported_reason(problem, dev);
        if (candidates[id].unsupported.empty())
            candidates[id].unsupported = variant_reason(problem, *b, b->backward_variants, "backward pass");
    }
}

// A backend plan whose workspace layout refused a slice (base/workspace.h: more slices than it
// holds, or a size past size_t): a library bug, stopped at finalize so that no execute ever takes
// the address of a slice that was not laid out.
flashattn_status_t check_layouts(const Backend &b, const BackendPlan &bp) {
    for (const WorkspaceLayout *w : {&bp.workspace, &bp.backward_workspace})
        if (!w->valid())
            return fail(FLASHATTN_ERROR_INTERNAL, "plan: the %s backend's workspace slice '%s' does not fit its layout "
                        "(at most %d slices, sizes within size_t)", b.name, w->invalid_slice(),
                        WorkspaceLayout::kMaxSlices);
    return FLASHATTN_SUCCESS;
}

// Choose the backward pass's backend and, when it is not the forward's, let it make its own plan.
// A plan whose backward cannot run still finalizes: the forward is usable and the backward calls
// report why.
flashattn_status_t plan_backward(flashattn_plan *plan, flashattn_backend_t requested) {
    Candidate candidates[5];
    backward_candidates(plan->problem, plan->device, candidates);
    const DeviceInfo &dev = plan->device;
    const Decision d = decide_backward_backend(requested, plan->backend->id,
                                               {dev.present, dev.cc_major, dev.cc_minor, dev.absent_reason}, candidates);
    plan->backward_reason = d.reason;
    if (d.status != FLASHATTN_SUCCESS) return FLASHATTN_SUCCESS;
    const Backend *b = backend_by_id(d.backend);
    if (b != plan->backend) {
        FLASHATTN_TRY(b->make_plan(plan->problem, dev, &plan->separate_backward_plan));
        FLASHATTN_TRY(check_layouts(*b, *plan->separate_backward_plan));
    }
    plan->backward_backend = b;
    return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status_t finalize_plan(flashattn_plan *plan) {
    plan->finalized = false;
    Problem problem;
    FLASHATTN_TRY(resolve_problem(plan->params, &problem));
    flashattn_backend_t requested;
    FLASHATTN_TRY(requested_backend(plan->params, &requested));

    DeviceInfo dev;
    FLASHATTN_TRY(query_device(problem.device, &dev));
    Candidate candidates[5];
    for (flashattn_backend_t id : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_FA1, FLASHATTN_BACKEND_FA2, FLASHATTN_BACKEND_FA3}) {
        const Backend *b = backend_by_id(id);
        candidates[id].compiled = b != nullptr;
        if (b == nullptr) continue;
        if (id != FLASHATTN_BACKEND_CPU && !dev.present)
            candidates[id].unsupported = dev.absent_reason;
        else
            candidates[id].unsupported = b->unsupported_reason(problem, dev);
        if (candidates[id].unsupported.empty())
            candidates[id].unsupported = variant_reason(problem, *b, b->forward_variants, "backend");
        if (candidates[id].unsupported.empty()) candidates[id].unsupported = serving_unsupported(*b, problem);
        if (candidates[id].unsupported.empty() && b->auto_pass_reason != nullptr)
            candidates[id].auto_pass = b->auto_pass_reason(problem, dev);
    }
    const Decision d = decide_backend(requested, {dev.present, dev.cc_major, dev.cc_minor, dev.absent_reason}, candidates);
    if (d.status != FLASHATTN_SUCCESS) return fail(d.status, "plan: %s", d.reason.c_str());

    const Backend *backend = backend_by_id(d.backend);
    std::unique_ptr<BackendPlan> backend_plan;
    FLASHATTN_TRY(backend->make_plan(problem, dev, &backend_plan));
    FLASHATTN_TRY(check_layouts(*backend, *backend_plan));

    plan->problem = problem;
    plan->device = dev;
    plan->backend = backend;
    plan->backend_plan = std::move(backend_plan);
    plan->reason = d.reason;
    plan->backward_backend = nullptr;
    plan->separate_backward_plan.reset();
    FLASHATTN_TRY(plan_backward(plan, requested));
    plan->finalized = true;
    return FLASHATTN_SUCCESS;
}

flashattn_status_t execute_plan(const flashattn_plan *plan, const Tensors &t) {
    FLASHATTN_TRY(check_variant_args(plan->problem, t, false));
    FLASHATTN_TRY(check_fp8_args(plan->problem, t, false, plan->workspace_bytes()));
    FLASHATTN_TRY(check_execute_args(plan->problem, t, plan->workspace_bytes()));
    return plan->backend->execute(plan->problem, *plan->backend_plan, t);
}

flashattn_status_t execute_backward_plan(const flashattn_plan *plan, const Tensors &t) {
    if (plan->backward_backend == nullptr)
        return fail(FLASHATTN_ERROR_NOT_SUPPORTED, "plan: %s", plan->backward_reason.c_str());
    FLASHATTN_TRY(check_variant_args(plan->problem, t, true));
    FLASHATTN_TRY(check_fp8_args(plan->problem, t, true, plan->backward_workspace_bytes()));
    FLASHATTN_TRY(check_backward_args(plan->problem, t, plan->backward_workspace_bytes()));
    return plan->backward_backend->execute_backward(plan->problem, plan->backward_plan(), t);
}

// The merge runs where the plan runs: the CPU backend's on the host; on a GPU, FA2's kernel for
// the plans of every generation (one kernel, compiled for sm_80 and newer, instead of one per
// generation: the merge is bandwidth-bound and needs no generation's features).
flashattn_status_t merge_plan_states(const flashattn_plan *plan, const MergeCall &m) {
    if (plan->problem.fp8())
        return fail(FLASHATTN_ERROR_NOT_SUPPORTED,
                    "plan: an FP8 plan's partial states cannot be merged with it; merge them with a bf16 or fp16 plan of "
                    "the same layout (its dtype that of O)");
    FLASHATTN_TRY(check_merge_args(plan->problem, m));
    const bool on_host = plan->backend->id == FLASHATTN_BACKEND_CPU;
    const Backend *merger = on_host ? cpu_backend() : fa2_backend();
    if (merger == nullptr || merger->merge_states == nullptr || (!on_host && plan->device.cc_major < 8))
        return fail(FLASHATTN_ERROR_NOT_SUPPORTED,
                    "plan: merging partial states on the %s backend's device needs the fa2 merge kernel "
                    "(compute capability 8.0 or newer, fa2 in the build)", plan->backend->name);
    return merger->merge_states(plan->problem, plan->device, m);
}

}  // namespace flashattn
