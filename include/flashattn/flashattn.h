/*
 * libflashattn: exact, IO-aware attention (FlashAttention 1, 2 and 3) behind a stable C ABI.
 *
 * This header is C99 and needs no CUDA header. Every function is callable through a plain C
 * foreign-function interface (Go's cgo, Rust's extern "C", Julia's ccall, Python's ctypes):
 * no variadic functions, no structs passed or returned by value, fixed-width integer types and
 * enum values pinned for the life of the ABI.
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn/flashattn_export.h"
#include "flashattn/flashattn_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup flashattn_types Types and constants
 * @{
 */

/**
 * @brief Status returned by every fallible function. 0 is success; values are pinned.
 *
 * On any status other than #FLASHATTN_SUCCESS the function has written no output (neither its
 * out-parameters nor any tensor) and flashattn_last_error() holds a message naming the argument
 * and the rule it broke.
 */
typedef enum flashattn_status {
    FLASHATTN_SUCCESS = 0,                  /**< The call did what it was asked. */
    FLASHATTN_ERROR_INVALID_ARGUMENT = 1,   /**< An argument or a plan parameter breaks a rule. */
    FLASHATTN_ERROR_NOT_SUPPORTED = 2,      /**< Valid, but not by the chosen backend or device. */
    FLASHATTN_ERROR_INVALID_STATE = 3,      /**< The plan is not in the state the call needs. */
    FLASHATTN_ERROR_ALLOCATION = 4,         /**< Host memory could not be allocated. */
    FLASHATTN_ERROR_DEVICE = 5,             /**< The CUDA runtime reported an error. */
    FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE = 6, /**< The workspace passed is smaller than needed. */
    FLASHATTN_ERROR_INTERNAL = 7            /**< A bug in the library; please report it. */
} flashattn_status_t;

/** @brief Element type of Q, K, V and O (all four share it). Values are pinned. */
typedef enum flashattn_dtype {
    FLASHATTN_DTYPE_FP16 = 1,     /**< IEEE binary16. */
    FLASHATTN_DTYPE_BF16 = 2,     /**< bfloat16. */
    FLASHATTN_DTYPE_FP32 = 3,     /**< IEEE binary32 (CPU backend only). */
    FLASHATTN_DTYPE_FP8_E4M3 = 4  /**< Reserved for the Hopper path; not supported yet. */
} flashattn_dtype_t;

/** @brief Implementation that runs a plan. Values are pinned. */
typedef enum flashattn_backend {
    FLASHATTN_BACKEND_AUTO = 0, /**< Choose by device capability (see flashattn_plan_finalize()). */
    FLASHATTN_BACKEND_CPU = 1,  /**< Host implementation; tensors in host memory. */
    FLASHATTN_BACKEND_FA1 = 2,  /**< FlashAttention-1 algorithm on CUDA, sm_75 and newer. */
    FLASHATTN_BACKEND_FA2 = 3,  /**< FlashAttention-2 algorithm on CUDA, sm_80 and newer. */
    FLASHATTN_BACKEND_FA3 = 4   /**< FlashAttention-3 algorithm on CUDA, sm_90a (Hopper). */
} flashattn_backend_t;

/**
 * @brief Keys of the plan's integer parameters, set with flashattn_plan_set_i64().
 *
 * Each entry gives its default. Sizes must be set before flashattn_plan_finalize(); the rest have
 * defaults. Values are pinned; 1000 and above is reserved for experimental keys.
 *
 * Tensor layout: Q is [batch, seqlen_q, heads_q, head_dim], K is [batch, seqlen_k, heads_kv,
 * head_dim], V is [batch, seqlen_k, heads_kv, head_dim_v], O is [batch, seqlen_q, heads_q,
 * head_dim_v]; the last dimension is always contiguous and the other three have strides in
 * elements (the STRIDE keys). With #FLASHATTN_I64_VARLEN = 1 the batch dimension is packed away:
 * Q and O are [total_q, heads, dim], K and V [total_k, heads, dim], and the batch strides are
 * ignored.
 */
typedef enum flashattn_i64_param {
    FLASHATTN_I64_BATCH = 1,      /**< Batch size (number of sequences when variable length). Required. */
    FLASHATTN_I64_SEQLEN_Q = 2,   /**< Query length (maximum query length when variable length; finalize lowers it to total_q when larger, which get_i64 then reports). Required. */
    FLASHATTN_I64_SEQLEN_K = 3,   /**< Key length (maximum key length when variable length; finalize lowers it to total_k when larger). Required. */
    FLASHATTN_I64_HEADS_Q = 4,    /**< Query heads. Required. */
    FLASHATTN_I64_HEADS_KV = 5,   /**< Key/value heads; heads_q must be a multiple. Default: heads_q. */
    FLASHATTN_I64_HEAD_DIM = 6,   /**< Head dimension of Q and K: 8..256, a multiple of 8. Required. */
    FLASHATTN_I64_HEAD_DIM_V = 7, /**< Head dimension of V and O: 8..256, a multiple of 8. Default: head_dim. */
    FLASHATTN_I64_DTYPE = 8,      /**< A #flashattn_dtype_t. Default: #FLASHATTN_DTYPE_FP16. */
    FLASHATTN_I64_CAUSAL = 9,     /**< 0 or 1. Key j is visible to query i only if j <= i + seqlen_k - seqlen_q. Default 0. */
    FLASHATTN_I64_WINDOW_LEFT = 10,  /**< Sliding window: key j visible only if j >= i + seqlen_k - seqlen_q - left. -1 = unbounded (default); a window of at least seqlen_q + seqlen_k (up to INT64_MAX) masks nothing and finalize stores it as -1. */
    FLASHATTN_I64_WINDOW_RIGHT = 11, /**< Sliding window: key j visible only if j <= i + seqlen_k - seqlen_q + right. -1 = unbounded (default); at least seqlen_q + seqlen_k: as -1 (see WINDOW_LEFT). */
    FLASHATTN_I64_BACKEND = 12,   /**< A #flashattn_backend_t. Default: #FLASHATTN_BACKEND_AUTO. */
    FLASHATTN_I64_DEVICE = 13,    /**< CUDA device ordinal for GPU backends. Default 0. */
    FLASHATTN_I64_VARLEN = 14,    /**< 0 or 1: variable-length batch, run with flashattn_plan_execute_varlen(). Default 0. */
    FLASHATTN_I64_TOTAL_Q = 15,   /**< Variable length: rows of packed Q and O (= cu_seqlens_q[batch]); at most 2^31 - 1 (cu_seqlens are int32). Required when varlen. */
    FLASHATTN_I64_TOTAL_K = 16,   /**< Variable length: rows of packed K and V (= cu_seqlens_k[batch]); at most 2^31 - 1. Required when varlen. */
    FLASHATTN_I64_Q_BATCH_STRIDE = 20, /**< Elements between batches of Q. Default: contiguous. */
    FLASHATTN_I64_Q_ROW_STRIDE = 21,   /**< Elements between sequence positions of Q. Default: heads_q*head_dim. */
    FLASHATTN_I64_Q_HEAD_STRIDE = 22,  /**< Elements between heads of Q. Default: head_dim. */
    FLASHATTN_I64_K_BATCH_STRIDE = 23, /**< Elements between batches of K. Default: contiguous. */
    FLASHATTN_I64_K_ROW_STRIDE = 24,   /**< Elements between sequence positions of K. Default: heads_kv*head_dim. */
    FLASHATTN_I64_K_HEAD_STRIDE = 25,  /**< Elements between heads of K. Default: head_dim. */
    FLASHATTN_I64_V_BATCH_STRIDE = 26, /**< Elements between batches of V. Default: contiguous. */
    FLASHATTN_I64_V_ROW_STRIDE = 27,   /**< Elements between sequence positions of V. Default: heads_kv*head_dim_v. */
    FLASHATTN_I64_V_HEAD_STRIDE = 28,  /**< Elements between heads of V. Default: head_dim_v. */
    FLASHATTN_I64_O_BATCH_STRIDE = 29, /**< Elements between batches of O. Default: contiguous. */
    FLASHATTN_I64_O_ROW_STRIDE = 30,   /**< Elements between sequence positions of O. Default: heads_q*head_dim_v. */
    FLASHATTN_I64_O_HEAD_STRIDE = 31,  /**< Elements between heads of O. Default: head_dim_v. */
    FLASHATTN_I64_DETERMINISTIC = 32,  /**< 0 or 1: the backward pass reduces every gradient in a fixed order, so two runs give bitwise-identical dQ, dK, dV (GPU: slower). Default 0. Since 0.2. */
    FLASHATTN_I64_DO_BATCH_STRIDE = 33, /**< Backward: elements between batches of dO. Default: contiguous. Since 0.2. */
    FLASHATTN_I64_DO_ROW_STRIDE = 34,   /**< Backward: elements between sequence positions of dO. Default: heads_q*head_dim_v. Since 0.2. */
    FLASHATTN_I64_DO_HEAD_STRIDE = 35,  /**< Backward: elements between heads of dO. Default: head_dim_v. Since 0.2. */
    FLASHATTN_I64_DQ_BATCH_STRIDE = 36, /**< Backward: elements between batches of dQ. Default: contiguous. Since 0.2. */
    FLASHATTN_I64_DQ_ROW_STRIDE = 37,   /**< Backward: elements between sequence positions of dQ. Default: heads_q*head_dim. Since 0.2. */
    FLASHATTN_I64_DQ_HEAD_STRIDE = 38,  /**< Backward: elements between heads of dQ. Default: head_dim. Since 0.2. */
    FLASHATTN_I64_DK_BATCH_STRIDE = 39, /**< Backward: elements between batches of dK. Default: contiguous. Since 0.2. */
    FLASHATTN_I64_DK_ROW_STRIDE = 40,   /**< Backward: elements between sequence positions of dK. Default: heads_kv*head_dim. Since 0.2. */
    FLASHATTN_I64_DK_HEAD_STRIDE = 41,  /**< Backward: elements between heads of dK. Default: head_dim. Since 0.2. */
    FLASHATTN_I64_DV_BATCH_STRIDE = 42, /**< Backward: elements between batches of dV. Default: contiguous. Since 0.2. */
    FLASHATTN_I64_DV_ROW_STRIDE = 43,   /**< Backward: elements between sequence positions of dV. Default: heads_kv*head_dim_v. Since 0.2. */
    FLASHATTN_I64_DV_HEAD_STRIDE = 44   /**< Backward: elements between heads of dV. Default: head_dim_v. Since 0.2. */
} flashattn_i64_param_t;

/** @brief Keys of the plan's floating-point parameters, set with flashattn_plan_set_f64(). */
typedef enum flashattn_f64_param {
    FLASHATTN_F64_SOFTMAX_SCALE = 1, /**< Multiplies Q·Kᵀ; in [2^-126, 2^64] (normal floats the kernels compute with without overflow). Default (never set): 1/sqrt(head_dim); get_f64 reports 0 until finalize. */
    FLASHATTN_F64_SOFTCAP = 2        /**< Logit cap c: s becomes c·tanh(s/c). 0 (default) = off; else in [2^-126, 2^64], and finalize requires scale / c in [2^-126, 2^126]. */
} flashattn_f64_param_t;

/**
 * @brief A CUDA stream: ABI-identical to cudaStream_t and CUstream. NULL is the legacy default
 * stream. The CPU backend ignores it.
 */
typedef struct CUstream_st *flashattn_stream_t;

/** @brief Opaque plan: one attention problem, its options and the kernel chosen for it. */
typedef struct flashattn_plan flashattn_plan_t;

/** @} */

/**
 * @defgroup flashattn_errors Errors
 * @{
 */

/**
 * @brief A short English name for a status ("success", "invalid argument", ...).
 * @param status Any value, known or not.
 * @return A static string, never NULL.
 */
FLASHATTN_API const char *flashattn_status_string(flashattn_status_t status);

/**
 * @brief The message of the last failed call on this thread; "" if none failed yet.
 *
 * A successful call does not clear it.
 * @return A thread-local string, never NULL, valid until the next libflashattn call on this thread.
 */
FLASHATTN_API const char *flashattn_last_error(void);

/**
 * @brief Copy the last error message of this thread into a caller's buffer, for foreign-function
 * interfaces that cannot hold a borrowed pointer.
 * @param[out] buffer Receives the message, always NUL-terminated when @p size > 0; may be NULL.
 * @param size Bytes available at @p buffer.
 * @return The message length in bytes without the NUL; a value >= @p size means it was truncated.
 */
FLASHATTN_API size_t flashattn_last_error_copy(char *buffer, size_t size);

/** @} */

/**
 * @defgroup flashattn_info Library and device information
 * @{
 */

/**
 * @brief The version of the library loaded at run time.
 * @return major*10000 + minor*100 + patch, as the FLASHATTN_VERSION macro encodes it.
 */
FLASHATTN_API uint32_t flashattn_version(void);

/**
 * @brief The version of the library loaded at run time, as text.
 * @return A static string "major.minor.patch".
 */
FLASHATTN_API const char *flashattn_version_string(void);

/**
 * @brief How the library was built.
 * @return A static string such as "cuda=13.0;archs=75,80,86,89,90,90a;backends=cpu,fa1,fa2"
 * ("cuda=none" when built without CUDA): keys separated by ';', values by ','.
 */
FLASHATTN_API const char *flashattn_build_info(void);

/**
 * @brief Number of usable CUDA devices. A machine without a driver or without a GPU reports 0
 * with #FLASHATTN_SUCCESS.
 * @param[out] count Number of devices.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT @p count is NULL.
 */
FLASHATTN_API flashattn_status_t flashattn_device_count(int32_t *count);

/**
 * @brief Compute capability of a CUDA device (9.0 on an H100 or H200).
 * @param device CUDA device ordinal.
 * @param[out] major, minor The compute capability.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT an out-pointer is NULL or @p device is not a device ordinal.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no CUDA device, or the library was built without CUDA.
 */
FLASHATTN_API flashattn_status_t flashattn_device_compute_capability(int32_t device, int32_t *major,
                                                                     int32_t *minor);

/** @} */

/**
 * @defgroup flashattn_plan Plans
 *
 * Lifecycle: flashattn_plan_create(), then the setters, then flashattn_plan_finalize() (checks the
 * problem, chooses the backend, fixes the workspace size), then flashattn_plan_execute() any number
 * of times with new tensors each call, then flashattn_plan_destroy(). A setter called on a finalized
 * plan returns it to the unfinalized state; finalize it again before executing.
 *
 * Threads: a plan is changed (setters, finalize, destroy) by one thread at a time. A finalized plan
 * is read-only: many threads may execute it at once, each with its own workspace and stream, from
 * threads that never used CUDA too, with bitwise the same results as serial calls. Enqueued work
 * does not use the plan: it may be destroyed as soon as execute returns.
 * @{
 */

/**
 * @brief Create an empty plan.
 * @param[out] plan Receives the new plan; set to NULL on error.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT @p plan is NULL.
 * @retval FLASHATTN_ERROR_ALLOCATION out of host memory.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_create(flashattn_plan_t **plan);

/**
 * @brief Destroy a plan and free everything it holds. Never fails.
 * @param plan The plan, or NULL (then nothing happens).
 */
FLASHATTN_API void flashattn_plan_destroy(flashattn_plan_t *plan);

/**
 * @brief Set an integer parameter. The value is checked against its key's own rule now (range,
 * enum value); rules between parameters are checked by flashattn_plan_finalize().
 * @param plan The plan.
 * @param key Which parameter.
 * @param value Its new value.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan, unknown key, or a value outside the key's range.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_i64(flashattn_plan_t *plan,
                                                        flashattn_i64_param_t key, int64_t value);

/**
 * @brief Set a floating-point parameter (see #flashattn_f64_param_t for each key's rule).
 * @param plan The plan.
 * @param key Which parameter.
 * @param value Its new value.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan, unknown key, NaN or infinite value, a scale outside
 * [2^-126, 2^64], a softcap neither 0 nor in [2^-126, 2^64]; the message gives the range.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_set_f64(flashattn_plan_t *plan,
                                                        flashattn_f64_param_t key, double value);

/**
 * @brief Read an integer parameter. Before finalize this is the value set (or the default, -1 for
 * strides left to default and 0 for sizes not set); after finalize, the resolved value.
 * @param plan The plan.
 * @param key Which parameter.
 * @param[out] value Receives the value.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p value, or unknown key.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_i64(const flashattn_plan_t *plan,
                                                        flashattn_i64_param_t key, int64_t *value);

/**
 * @brief Read a floating-point parameter. After finalize, the softmax scale is the resolved one
 * (1/sqrt(head_dim) when never set).
 * @param plan The plan.
 * @param key Which parameter.
 * @param[out] value Receives the value.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p value, or unknown key.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_f64(const flashattn_plan_t *plan,
                                                        flashattn_f64_param_t key, double *value);

/**
 * @brief Check the whole problem, choose the backend and fix the workspace size.
 *
 * #FLASHATTN_BACKEND_AUTO picks by the device's compute capability: sm_90 runs FA3, sm_80 to
 * sm_89 (and newer GPUs without sm_90a code) FA2, sm_75 FA1, and a machine with no usable CUDA
 * device the CPU backend. When the picked generation cannot run the problem (dtype, head dim,
 * feature), auto falls back to the next older generation that can; FA3 also passes decode-shaped
 * problems (seqlen_q <= 64 and seqlen_k > 256) to FA2, whose split-KV path serves them better. The
 * reason is in flashattn_plan_get_backend(). A backend asked for by name that
 * cannot run the problem fails with #FLASHATTN_ERROR_NOT_SUPPORTED and a message saying why. The
 * environment variable FLASHATTN_BACKEND (cpu, fa1, fa2, fa3) overrides auto, for debugging.
 *
 * @param plan The plan.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan, or parameters that break a rule (message names it),
 * including values whose products cannot be represented: tensor sizes past 64 bits, a variable-length
 * batch whose cu_seqlens or work items overflow 64 bits, totals past 2^31 - 1, scale / softcap outside
 * [2^-126, 2^126].
 * @retval FLASHATTN_ERROR_INVALID_STATE a required size was never set.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no backend can run the problem on this machine.
 * @retval FLASHATTN_ERROR_DEVICE the CUDA runtime failed while querying the device.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_finalize(flashattn_plan_t *plan);

/**
 * @brief The backend a finalized plan runs and a sentence saying why it was chosen.
 * @param[in] plan A finalized plan.
 * @param[out] backend The backend (never AUTO).
 * @param[out] reason May be NULL. Receives a string owned by the plan, valid until the plan is
 * changed or destroyed.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p backend.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_backend(const flashattn_plan_t *plan,
                                                            flashattn_backend_t *backend,
                                                            const char **reason);

/**
 * @brief Bytes of workspace every execute of this finalized plan needs (may be 0).
 *
 * The workspace is caller-owned memory (device memory for GPU backends, host memory for the CPU
 * backend), aligned to 256 bytes; its contents do not survive between calls, and concurrent
 * executes need disjoint workspaces.
 * @param plan A finalized plan.
 * @param[out] bytes Receives the size in bytes.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p bytes.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_workspace_size(const flashattn_plan_t *plan,
                                                                   size_t *bytes);

/**
 * @brief Run the forward pass O = softmax(scale·Q·Kᵀ, masked)·V of a finalized, fixed-length plan.
 *
 * Rows whose queries see no key at all (causal or window masks, seqlen_k = 0 rows of a varlen
 * batch) produce O = 0 and LSE = -inf, whatever the inputs hold.
 *
 * NaN propagates, as in PyTorch and FlashAttention: a NaN in a query row, or in a key that row
 * sees, makes the row's O and LSE NaN; a NaN in a value row makes O NaN in the rows that see
 * it (LSE stays finite). On GPU backends a NaN or inf in V may also reach other rows of the same
 * tile that do not see that key (P = 0 times NaN is NaN), except rows that see no key at all; the
 * CPU backend keeps it to the rows that see it. Infinite inputs follow IEEE arithmetic (an infinite
 * score gives NaN). Scores beyond the float range (possible only with bf16 or fp32 inputs around
 * 1e19 and above) are computed exactly by the CPU backend (in double) and are not supported on GPU
 * backends, whose score products overflow (NaN or inf rows).
 *
 * The CPU backend's results are bitwise identical from run to run and for any number of threads;
 * GPU backends' forward results are bitwise identical from run to run on one device.
 *
 * @param plan A finalized plan with #FLASHATTN_I64_VARLEN = 0.
 * @param q, k, v Inputs, laid out as #flashattn_i64_param_t describes.
 * @param o Output; must not overlap q, k, v or lse.
 * @param lse Optional output (NULL to skip): fp32 natural-log log-sum-exp of the scaled, capped
 * scores, contiguous [batch, heads_q, seqlen_q].
 * @param workspace, workspace_bytes Caller-owned scratch of at least
 * flashattn_plan_get_workspace_size() bytes; may be NULL when that size is 0.
 * @param stream CUDA stream for GPU backends; ignored by the CPU backend.
 *
 * On GPU backends the call only enqueues work on @p stream: it neither synchronises nor allocates,
 * so it can be captured in a CUDA graph (any capture mode), and a fault inside the kernel surfaces
 * later through the stream. A captured graph copies every kernel parameter and references no plan
 * state, so the plan may be destroyed before the graph runs; it references the caller's tensors and
 * workspace by address, which must outlive it (mainpage, "CUDA graphs"). The same holds for the
 * other execute entry points. Pointers must be device memory on the plan's device, 16-byte aligned, with strides that
 * keep rows 16-byte aligned. The CPU backend runs on the calling thread plus worker threads and
 * returns when O is written.
 *
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or tensor, overlapping output, wrong memory kind,
 * misaligned or wrong-device pointer.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized, or is a variable-length plan.
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE @p workspace_bytes is below the plan's need.
 * @retval FLASHATTN_ERROR_DEVICE a kernel launch failed.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute(const flashattn_plan_t *plan, const void *q,
                                                        const void *k, const void *v, void *o,
                                                        float *lse, void *workspace,
                                                        size_t workspace_bytes,
                                                        flashattn_stream_t stream);

/**
 * @brief Run the forward pass of a finalized variable-length plan (#FLASHATTN_I64_VARLEN = 1).
 *
 * @param plan A finalized plan with #FLASHATTN_I64_VARLEN = 1.
 * @param q, k, v Packed inputs: Q [total_q, heads_q, head_dim], K [total_k, heads_kv, head_dim],
 * V [total_k, heads_kv, head_dim_v], with the row and head strides of the plan.
 * @param o Packed output [total_q, heads_q, head_dim_v]; must not overlap any other tensor.
 * @param cu_seqlens_q, cu_seqlens_k int32 prefix sums of batch+1 entries: sequence b owns packed
 * rows [cu[b], cu[b+1]). They must start at 0, never decrease, end at total_q / total_k, and no
 * sequence may be longer than seqlen_q / seqlen_k. The CPU backend checks this; GPU backends
 * receive device memory they cannot read without synchronising, so there a violation is undefined
 * behaviour.
 * @param lse Optional (NULL to skip): fp32 log-sum-exp, contiguous [heads_q, total_q].
 * @param workspace, workspace_bytes As for flashattn_plan_execute().
 * @param stream As for flashattn_plan_execute().
 *
 * @return As flashattn_plan_execute(), with #FLASHATTN_ERROR_INVALID_STATE also when the plan is
 * not variable-length, and #FLASHATTN_ERROR_INVALID_ARGUMENT for bad cu_seqlens (CPU backend).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute_varlen(
    const flashattn_plan_t *plan, const void *q, const void *k, const void *v, void *o, float *lse,
    const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, void *workspace,
    size_t workspace_bytes, flashattn_stream_t stream);

/** @} */

/**
 * @defgroup flashattn_backward Backward pass
 * @brief Gradients dQ, dK, dV of the forward pass, recomputed tile by tile from Q, K, V and the
 * forward's LSE (no N×N matrix in memory). Since 0.2.
 *
 * The same finalized plan runs it; every forward option has its gradient (causal, windows,
 * softcap through the tanh, GQA/MQA with dK and dV summed over each key/value head's query group,
 * variable length, explicit scale). dO, dQ, dK, dV have the layouts of O, Q, K, V with their own
 * strides (#FLASHATTN_I64_DO_BATCH_STRIDE ... #FLASHATTN_I64_DV_HEAD_STRIDE, contiguous by
 * default). Gradients accumulate in fp32 and are written in the plan's dtype; each output element
 * is overwritten (not accumulated into). Keys no query sees get dK = dV = 0; queries that see no
 * key get dQ = 0.
 *
 * The backend may differ from the forward's: flashattn_plan_get_backward_backend() says which
 * runs and why (on Hopper, auto runs the FA3 forward and the FA2 backward). With
 * #FLASHATTN_I64_DETERMINISTIC = 1 two runs are bitwise identical; the CPU backend always is.
 * @{
 */

/**
 * @brief The backend that runs a finalized plan's backward pass and why.
 * @param[in] plan A finalized plan.
 * @param[out] backend The backend (never AUTO).
 * @param[out] reason May be NULL. A string owned by the plan, valid until it is changed or destroyed.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p backend.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no compiled backend can run this plan's backward pass on
 * its device; the message says why (*backend is left unchanged).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_backward_backend(const flashattn_plan_t *plan,
                                                                     flashattn_backend_t *backend,
                                                                     const char **reason);

/**
 * @brief Bytes of workspace every backward execute of this finalized plan needs (may be 0).
 *
 * Separate from the forward's size; the same rules apply (caller-owned, 256-byte aligned, one per
 * concurrent call). It grows as O(N): fp32 accumulators of dQ (and of dK, dV for GQA) and the
 * per-row dO·O sums, never an N×N buffer.
 * @param plan A finalized plan.
 * @param[out] bytes Receives the size in bytes.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or @p bytes.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED the plan's backward pass cannot run (see
 * flashattn_plan_get_backward_backend()).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_get_backward_workspace_size(const flashattn_plan_t *plan,
                                                                            size_t *bytes);

/**
 * @brief Run the backward pass of a finalized, fixed-length plan.
 *
 * NaN propagates as in the forward pass: a NaN in Q, K, V, dO or the LSE makes NaN the gradients
 * of the (query, key) pairs it takes part in; rows whose LSE is -inf (they saw no key) take no
 * part. The CPU backend keeps it to exactly those gradients; on GPU backends it may also reach
 * gradients of other rows or keys of the same tile, as in FlashAttention.
 *
 * @param plan A finalized plan with #FLASHATTN_I64_VARLEN = 0.
 * @param q, k, v The forward's inputs.
 * @param o The forward's output.
 * @param dout dO, the gradient of the loss with respect to O (layout of O, strides DO_*).
 * @param lse The forward's LSE output (required): fp32 [batch, heads_q, seqlen_q].
 * @param dq, dk, dv Outputs (layouts of Q, K, V, strides DQ_*, DK_*, DV_*); must not overlap each
 * other or any input.
 * @param workspace, workspace_bytes Caller-owned scratch of at least
 * flashattn_plan_get_backward_workspace_size() bytes; may be NULL when that size is 0.
 * @param stream As for flashattn_plan_execute().
 *
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or tensor, overlapping output, wrong memory
 * kind, misaligned or wrong-device pointer.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized, or is a variable-length plan.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no backend can run this plan's backward pass.
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE @p workspace_bytes is below the plan's need.
 * @retval FLASHATTN_ERROR_DEVICE a kernel launch failed.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward(
    const flashattn_plan_t *plan, const void *q, const void *k, const void *v, const void *o,
    const void *dout, const float *lse, void *dq, void *dk, void *dv, void *workspace,
    size_t workspace_bytes, flashattn_stream_t stream);

/**
 * @brief Run the backward pass of a finalized variable-length plan (#FLASHATTN_I64_VARLEN = 1).
 *
 * Sequences with no keys contribute nothing (their dQ rows are 0).
 *
 * @param plan A finalized plan with #FLASHATTN_I64_VARLEN = 1.
 * @param q, k, v The forward's packed inputs, as for flashattn_plan_execute_varlen().
 * @param o The forward's packed output.
 * @param dout dO, packed like O (strides DO_*).
 * @param lse The forward's LSE (required): fp32 [heads_q, total_q].
 * @param dq, dk, dv Packed outputs (layouts of Q, K, V, strides DQ_*, DK_*, DV_*); must not
 * overlap each other or any input.
 * @param cu_seqlens_q, cu_seqlens_k As for flashattn_plan_execute_varlen().
 * @param workspace, workspace_bytes As for flashattn_plan_execute_backward().
 * @param stream As for flashattn_plan_execute().
 * @return As flashattn_plan_execute_backward(), with #FLASHATTN_ERROR_INVALID_STATE also when the
 * plan is not variable-length, and #FLASHATTN_ERROR_INVALID_ARGUMENT for bad cu_seqlens (CPU backend).
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward_varlen(
    const flashattn_plan_t *plan, const void *q, const void *k, const void *v, const void *o,
    const void *dout, const float *lse, void *dq, void *dk, void *dv, const int32_t *cu_seqlens_q,
    const int32_t *cu_seqlens_k, void *workspace, size_t workspace_bytes, flashattn_stream_t stream);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_FLASHATTN_H */
