/**
 * @file flashattn_cp.h
 * @brief Context parallelism (ring attention): one sequence split across ranks. EXPERIMENTAL.
 *
 * A separate library, libflashattn_cp (pkg-config `flashattn_cp`, CMake `flashattn::flashattn_cp`),
 * so the core library keeps no NCCL dependency. Since 0.3.
 *
 * **Provisional ABI.** The symbols carry a version node of their own, FLASHATTN_CP_0 (not the core's
 * FLASHATTN_0, so the component can change or leave without touching the core's ABI), and report
 * the core's #flashattn_status_t codes with a message of their own (flashattn_cp_last_error()).
 * Until the component's first multi-GPU run this header, its enums and its semantics may still
 * change in a later 0.x release. What has run (2026-12-01): the loopback transport on the CPU and
 * on one GPU (H200), and the NCCL transport on a 1-rank communicator (one GPU, including a
 * send/receive to its own rank); a ring of several NCCL ranks has not run yet. The backward
 * (2026-12-04) has run through the CPU loopback only.
 *
 * **Precision.** Each step's partial output is stored in the plan's dtype before the merge (as a
 * single call's output is), so a ring of W steps rounds O once per partial and once after the
 * merge: in bf16 the ring matched one single call to within 4e-3 in the tests.
 *
 * @defgroup flashattn_cp Context parallelism (experimental)
 * @{
 *
 * **Layout.** The global sequence of S = W·L tokens (W ranks, L tokens per rank) is cut into
 * chunks; rank r holds, for every sequence of the batch, L rows of Q, K and V (and writes L rows
 * of O), laid out as the core library's contiguous fixed-length tensors ([batch, L, heads, dim]).
 *  - Non-causal: W contiguous chunks of L tokens; rank r holds global tokens [r·L, (r+1)·L).
 *  - Causal (zigzag, for load balance): 2W chunks of c = L/2 tokens (L must be even); rank r holds
 *    chunk r followed by chunk 2W−1−r, that is global tokens [r·c, (r+1)·c) as its local rows
 *    [0, c) and global tokens [(2W−1−r)·c, (2W−r)·c) as its local rows [c, 2c). Global query i sees
 *    global key j when j <= i (the sequence is square, so both mask alignments agree).
 *
 * The LSE output of rank r is fp32 [batch, heads_q, L] in the rank's local row order.
 *
 * **Schedule.** W steps: each rank attends its Q to the K/V block in hand with the core library's
 * forward, keeps the output and LSE as a partial state, and passes the block to rank r+1 (mod W)
 * while receiving the block of rank r−1; the partials are merged by their LSE with
 * flashattn_plan_merge_states(). In the zigzag layout each step's block is one call: the own block
 * (causal square), a block from a lower rank (all local queries against its first chunk, no mask)
 * or a block from a higher rank (the second local chunk against both of its chunks, no mask).
 *
 * **Backward** (flashattn_cp_plan_execute_backward(), since 0.3): the same W steps with the
 * forward's merged O and LSE. Each step runs the core library's backward pass on the block in
 * hand (flashattn_plan_execute_backward(), so P is recomputed from the global LSE and no N×N
 * matrix exists): its dQ part is added to the rank's fp32 dQ, its dK / dV parts to fp32
 * accumulators that travel around the ring with the K/V block, one step behind it, and come home
 * to their owner after the last step (one more exchange). dQ, dK, dV are written in the plan's
 * dtype once, at the end, so an error leaves them untouched. Each step's parts are stored in the
 * plan's dtype before they are added (as the forward's partial outputs are). With
 * #FLASHATTN_I64_DETERMINISTIC = 1 on the local plan (or on the CPU), two runs are bitwise
 * identical: the ring adds in a fixed order.
 */
#ifndef FLASHATTN_CP_H
#define FLASHATTN_CP_H

#include "flashattn/flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/** @brief An opaque context-parallel plan. */
typedef struct flashattn_cp_plan flashattn_cp_plan_t;

/** @brief How K/V blocks travel between ranks. Values are provisional (see the file's note). */
typedef enum flashattn_cp_transport {
    /** One process plays all W ranks in turn (tests, debugging): execute takes W sets of tensors.
     * A CPU-backend plan takes host memory; a GPU-backend plan takes device memory on its device,
     * and the work (copies included) is enqueued on the execute's stream. */
    FLASHATTN_CP_TRANSPORT_LOOPBACK = 1,
    /** The caller's NCCL communicator (flashattn_cp_plan_set_nccl_comm()), one rank per process or
     * thread: execute takes this rank's tensors. Needs a GPU core plan and a build with NCCL. */
    FLASHATTN_CP_TRANSPORT_NCCL = 2
} flashattn_cp_transport_t;

/** @brief Keys of the context-parallel plan's integer parameters. */
typedef enum flashattn_cp_i64_param {
    FLASHATTN_CP_I64_WORLD_SIZE = 1, /**< W, the number of ranks: 1 to #FLASHATTN_MAX_MERGE_PARTIALS (each rank merges W partial states). Required. */
    FLASHATTN_CP_I64_RANK = 2,       /**< This rank, 0 to W−1 (NCCL; must stay 0 for loopback). Default 0. */
    FLASHATTN_CP_I64_TRANSPORT = 3   /**< A #flashattn_cp_transport_t. Required. */
} flashattn_cp_i64_param_t;

/**
 * @brief The last error message of this thread from a flashattn_cp_ call ("" if none).
 * @return A thread-local string, valid until the thread's next flashattn_cp_ call.
 */
FLASHATTN_API const char *flashattn_cp_last_error(void);

/**
 * @brief Create an empty context-parallel plan.
 * @param[out] plan Receives the plan; destroy it with flashattn_cp_plan_destroy().
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL @p plan.
 * @retval FLASHATTN_ERROR_ALLOCATION the host allocation failed.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_create(flashattn_cp_plan_t **plan);

/**
 * @brief Destroy a plan (NULL is ignored). The NCCL communicator stays the caller's.
 * @param plan The plan.
 */
FLASHATTN_API void flashattn_cp_plan_destroy(flashattn_cp_plan_t *plan);

/**
 * @brief Set an integer parameter; the plan becomes unfinalized.
 * @param plan The plan.
 * @param key The parameter.
 * @param value Its value (ranges checked here, the rest by flashattn_cp_plan_finalize()).
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL @p plan, unknown @p key or a value out of range.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_set_i64(flashattn_cp_plan_t *plan,
                                                           flashattn_cp_i64_param_t key, int64_t value);

/**
 * @brief Give the plan the caller's communicator (an `ncclComm_t`, passed as `void *` so this
 * header needs no nccl.h). The plan borrows it: it must outlive every execute.
 * @param plan The plan.
 * @param comm The communicator; its size and this rank must match #FLASHATTN_CP_I64_WORLD_SIZE and
 * #FLASHATTN_CP_I64_RANK (checked by finalize).
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL @p plan or @p comm.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_set_nccl_comm(flashattn_cp_plan_t *plan, void *comm);

/**
 * @brief Check the parameters and build the per-step core plans.
 *
 * @param plan The plan, with world size and transport set.
 * @param local A finalized core plan describing one rank's share: seqlen_q = seqlen_k = L (even when
 * causal), batch, heads (GQA allowed), head dims, dtype (fp16, bf16, fp32), causal, softmax scale,
 * softcap, backend and device are taken from it; it is not kept. Default (contiguous) strides,
 * fixed length, no window, paging, appending, sinks, ALiBi or FP8 (refused with
 * #FLASHATTN_ERROR_NOT_SUPPORTED).
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL argument; world size or transport unset; rank out of
 * range; odd L with causal; NCCL transport without a communicator.
 * @retval FLASHATTN_ERROR_INVALID_STATE @p local is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED a feature of @p local named above; NCCL with a CPU plan or
 * in a build without NCCL.
 * @retval FLASHATTN_ERROR_DEVICE a CUDA or NCCL call failed (a GPU transport's stream, events or
 * -inf block; the communicator's size or rank could not be read).
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_finalize(flashattn_cp_plan_t *plan,
                                                            const flashattn_plan_t *local);

/**
 * @brief Bytes of workspace one execute needs (for all the ranks this process plays).
 * Host memory for the CPU backend, device memory otherwise; aligned to 256 bytes. Per rank: two
 * K/V blocks in flight, W partial outputs and LSEs (merged once at the end), and the core's own
 * workspace, so it grows with W (a running merge that keeps two partials is left for later).
 * @param plan A finalized plan.
 * @param[out] bytes Receives the size.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL argument.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_get_workspace_size(const flashattn_cp_plan_t *plan,
                                                                      size_t *bytes);

/**
 * @brief Run the ring forward pass.
 *
 * Each array has one entry per rank this process plays: W for loopback (entry r is rank r's),
 * 1 for NCCL (this rank's). Entry r holds the rank's local tensors in the layout above.
 *
 * @param plan A finalized plan.
 * @param num_ranks W for loopback, 1 for NCCL.
 * @param q, k, v Inputs (read only).
 * @param o Outputs [batch, L, heads_q, head_dim_v]; must not overlap any input.
 * @param lse NULL, or an array whose entries are NULL or fp32 [batch, heads_q, L] outputs.
 * @param workspace, workspace_bytes At least flashattn_cp_plan_get_workspace_size() bytes.
 * @param stream CUDA stream (GPU plans); ignored on the CPU. The call only enqueues work: the attention
 * and the merge on @p stream, the exchange on a stream of the plan's own, ordered with @p stream by
 * events, so it overlaps the attention on the block in hand. NCCL: one execute of a plan at a time
 * (the events are the plan's, and the ranks' calls must pair up in order). Loopback: executes of
 * one plan may run at once from any threads on any streams, each with its own workspace (nothing
 * an execute changes is the plan's). Plans do not share state.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT a NULL array or tensor, a wrong @p num_ranks, a
 * misaligned workspace, or an argument the core library refuses (message: flashattn_cp_last_error()).
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE too small a workspace.
 * @retval FLASHATTN_ERROR_DEVICE a kernel, copy or NCCL call failed.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_execute(const flashattn_cp_plan_t *plan, int32_t num_ranks,
                                                           const void *const *q, const void *const *k,
                                                           const void *const *v, void *const *o,
                                                           float *const *lse, void *workspace,
                                                           size_t workspace_bytes, flashattn_stream_t stream);

/**
 * @brief Bytes of workspace one backward execute needs (for all the ranks this process plays).
 *
 * Host memory for the CPU backend, device memory otherwise; aligned to 256 bytes. Per rank: two
 * K/V blocks in flight, two fp32 dK / dV accumulators in flight and an fp32 dQ; shared by the
 * ranks of a process: one step's dQ / dK / dV parts, an LSE slice and the core backward's own
 * workspace. Separate from flashattn_cp_plan_get_workspace_size(). Since 0.3.
 * @param plan A finalized plan.
 * @param[out] bytes Receives the size.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL argument.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED the local plan's backend has no backward pass for this
 * problem (the message says why; the forward ring still runs).
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_get_backward_workspace_size(const flashattn_cp_plan_t *plan,
                                                                               size_t *bytes);

/**
 * @brief Run the ring backward pass: dQ, dK, dV of every rank's share.
 *
 * Each array has one entry per rank this process plays, as for flashattn_cp_plan_execute(); all
 * tensors are the rank's local ones in the layout above (dO like O, dQ like Q, dK like K, dV like
 * V, contiguous). Gradients of the loss with respect to the whole sequence's Q, K, V, restricted
 * to the rank's rows: dK and dV include every rank's queries (GQA: summed over each key/value
 * head's query group). Since 0.3.
 *
 * @param plan A finalized plan.
 * @param num_ranks W for loopback, 1 for NCCL.
 * @param q, k, v The forward's inputs.
 * @param o, lse The forward's outputs (flashattn_cp_plan_execute(); the LSE is required here).
 * @param dout dO [batch, L, heads_q, head_dim_v].
 * @param dq, dk, dv Outputs; must not overlap each other, any input or the workspace.
 * @param workspace, workspace_bytes At least flashattn_cp_plan_get_backward_workspace_size() bytes.
 * @param stream As for flashattn_cp_plan_execute() (the dK / dV accumulators travel on the plan's
 * exchange stream too). At once from several threads and streams as flashattn_cp_plan_execute()
 * allows (loopback: yes, each with its own workspace; NCCL: one at a time); from any thread, and
 * inside CUDA-graph capture on a GPU loopback plan.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT a NULL array or tensor, a wrong @p num_ranks, a
 * misaligned workspace, overlapping outputs, a host pointer for a GPU plan's output, or an
 * argument the core library refuses (message: flashattn_cp_last_error()).
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no backward pass for this plan (see
 * flashattn_cp_plan_get_backward_workspace_size()).
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE too small a workspace.
 * @retval FLASHATTN_ERROR_DEVICE a kernel, copy or NCCL call failed.
 */
FLASHATTN_API flashattn_status_t flashattn_cp_plan_execute_backward(
    const flashattn_cp_plan_t *plan, int32_t num_ranks, const void *const *q, const void *const *k,
    const void *const *v, const void *const *o, const void *const *dout, const float *const *lse, void *const *dq,
    void *const *dk, void *const *dv, void *workspace, size_t workspace_bytes, flashattn_stream_t stream);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_CP_H */
