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

/**
 * @brief Element type of Q, K, V and O (all four share it, except that an FP8 plan's O is bf16 or
 * fp16: #FLASHATTN_I64_OUTPUT_DTYPE). Values are pinned.
 */
typedef enum flashattn_dtype {
    FLASHATTN_DTYPE_FP16 = 1,     /**< IEEE binary16. */
    FLASHATTN_DTYPE_BF16 = 2,     /**< bfloat16. */
    FLASHATTN_DTYPE_FP32 = 3,     /**< IEEE binary32 (CPU backend only). */
    FLASHATTN_DTYPE_FP8_E4M3 = 4  /**< FP8 E4M3 (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits; no infinity, NaN is S.1111.111, largest finite 448): Q, K and V of a forward pass, with descale factors (see @ref flashattn_fp8). Since 0.3 (reserved before). */
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
    FLASHATTN_I64_SEQLEN_Q = 2,   /**< Query length (maximum query length when variable length; finalize lowers it to total_q when larger, but not below 1, which get_i64 then reports). Required. */
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
    FLASHATTN_I64_TOTAL_K = 16,   /**< Variable length: rows of packed K and V (= cu_seqlens_k[batch]); at most 2^31 - 1. Required when varlen, except with #FLASHATTN_I64_PAGED_KV (paged keys are not packed: the key length then stays seqlen_k). */
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
    FLASHATTN_I64_DV_HEAD_STRIDE = 44,  /**< Backward: elements between heads of dV. Default: head_dim_v. Since 0.2. */
    /* Serving (paged K/V cache, seqused_k, append with rotary): see @ref flashattn_serving. Since 0.3. */
    FLASHATTN_I64_PAGED_KV = 45,        /**< 0 or 1: K and V are caches of pages [num_pages, page_size, heads_kv, dim] addressed through a page table (#FLASHATTN_ARG_PAGE_TABLE); then the K/V BATCH_STRIDE keys are the strides between pages. Run with flashattn_plan_execute_args(). Default 0. Since 0.3. */
    FLASHATTN_I64_PAGE_SIZE = 46,       /**< Paged: keys per page, 1 or more (any size). Required when paged. Since 0.3. */
    FLASHATTN_I64_NUM_PAGES = 47,       /**< Paged: pages in the K and V caches. Required when paged. Since 0.3. */
    FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE = 48, /**< Paged: columns of the page table; page_size times this must be at least seqlen_k. Default: ceil(seqlen_k / page_size). Since 0.3. */
    FLASHATTN_I64_PAGE_TABLE_STRIDE = 49, /**< Paged: int32 entries between rows (sequences) of the page table; at least max_pages_per_sequence. Default: max_pages_per_sequence. Since 0.3. */
    FLASHATTN_I64_SEQUSED_K = 50,       /**< 0 or 1: #FLASHATTN_ARG_SEQUSED_K gives each sequence's number of valid keys (with #FLASHATTN_I64_NEW_KV_ROWS: its cache length before the append). Default 0. Since 0.3. */
    FLASHATTN_I64_NEW_KV_ROWS = 51,     /**< Rows appended to each sequence's cache before attention (#FLASHATTN_ARG_K_NEW, #FLASHATTN_ARG_V_NEW); needs #FLASHATTN_I64_SEQUSED_K = 1. 0 = no append (default). Since 0.3. */
    FLASHATTN_I64_K_NEW_BATCH_STRIDE = 52, /**< Append: elements between batches of K_new [batch, new_kv_rows, heads_kv, head_dim]. Default: contiguous. Since 0.3. */
    FLASHATTN_I64_K_NEW_ROW_STRIDE = 53,   /**< Append: elements between rows of K_new. Default: heads_kv*head_dim. Since 0.3. */
    FLASHATTN_I64_K_NEW_HEAD_STRIDE = 54,  /**< Append: elements between heads of K_new. Default: head_dim. Since 0.3. */
    FLASHATTN_I64_V_NEW_BATCH_STRIDE = 55, /**< Append: elements between batches of V_new [batch, new_kv_rows, heads_kv, head_dim_v]. Default: contiguous. Since 0.3. */
    FLASHATTN_I64_V_NEW_ROW_STRIDE = 56,   /**< Append: elements between rows of V_new. Default: heads_kv*head_dim_v. Since 0.3. */
    FLASHATTN_I64_V_NEW_HEAD_STRIDE = 57,  /**< Append: elements between heads of V_new. Default: head_dim_v. Since 0.3. */
    FLASHATTN_I64_ROTARY_DIM = 58,      /**< Append: rotary embedding over the first rotary_dim columns of Q and K_new; even, at most head_dim; needs #FLASHATTN_I64_NEW_KV_ROWS > 0. 0 = off (default). Since 0.3. */
    FLASHATTN_I64_ROTARY_INTERLEAVED = 59, /**< Rotary pairs: 1 = columns (2i, 2i+1) (GPT-J), 0 = columns (i, i + rotary_dim/2) (GPT-NeoX, default). Since 0.3. */
    /** A #flashattn_mask_align_t: where the diagonal of the causal mask, the windows and ALiBi
     * lies when seqlen_q != seqlen_k. Default #FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT. Since 0.3. */
    FLASHATTN_I64_MASK_ALIGN = 60,
    /** Sink tokens (StreamingLLM): the first n keys of every sequence stay visible to every query
     * whatever #FLASHATTN_I64_WINDOW_LEFT says (the causal mask and the right window still apply to
     * them). n >= 0; default 0. Since 0.3. */
    FLASHATTN_I64_SINK_TOKENS = 61,
    /** 0 or 1: a learned sink logit per query head (gpt-oss) joins every row's softmax denominator
     * and contributes no value: O = sum_j e^(s_j) v_j / (e^sink + sum_j e^(s_j)), and the LSE
     * includes it. The logits (fp32, [heads_q], in the units of the scaled and capped scores) are
     * passed to each call as #FLASHATTN_ARG_SINK_LOGITS; the backward writes their gradient to
     * #FLASHATTN_ARG_DSINK_LOGITS. Default 0. Since 0.3. */
    FLASHATTN_I64_SINK_LOGITS = 62,
    /** 0 or 1: ALiBi. Each score of query head h gets -slope[h]·|i' - j| added after the softcap,
     * where i' is the key on query i's diagonal (i + seqlen_k - seqlen_q bottom-right, as
     * FlashAttention-2 defines it; i with #FLASHATTN_MASK_ALIGN_TOP_LEFT). The slopes (fp32,
     * [heads_q]) are passed to each call as #FLASHATTN_ARG_ALIBI_SLOPES; they get no gradient. The
     * diagonal uses each sequence's own lengths (variable length; with seqused_k or an append, L_b of
     * @ref flashattn_serving), and the LSE includes the bias. Default 0. Since 0.3. */
    FLASHATTN_I64_ALIBI = 63,
    /** Element type of O (a #flashattn_dtype_t). With #FLASHATTN_I64_DTYPE = #FLASHATTN_DTYPE_FP8_E4M3:
     * #FLASHATTN_DTYPE_BF16 (default) or #FLASHATTN_DTYPE_FP16; otherwise it must equal
     * #FLASHATTN_I64_DTYPE (its default). The O strides count elements of this type. Since 0.3. */
    FLASHATTN_I64_OUTPUT_DTYPE = 64,
    /** FP8 plans: fp32 elements between sequences in each descale array (#FLASHATTN_ARG_DESCALE_Q,
     * _K, _V; one layout for the three). 0 or more; 0 together with a head stride of 0 means one value
     * for the whole tensor. Default: #FLASHATTN_I64_HEADS_KV (contiguous [batch, heads_kv]). Only FP8
     * plans may set it. Since 0.3. */
    FLASHATTN_I64_DESCALE_BATCH_STRIDE = 65,
    /** FP8 plans: fp32 elements between key/value heads in each descale array; 0 or more. Default 1.
     * Only FP8 plans may set it. Since 0.3. */
    FLASHATTN_I64_DESCALE_HEAD_STRIDE = 66,
    /** Split-KV: the number of parts the keys of each (sequence, head) are cut into, run as
     * separate CTAs and merged by a second kernel (decode and other few-query problems). 0 = auto
     * (default): the backend picks it from the shape and the SM count. 1 to 128: that many, where
     * the backend has split-KV (fa2); it uses fewer when there are fewer key tiles (or, with a large
     * batch, at most 65535 / batch). Backends without split-KV (cpu, fa1, fa3) run unsplit. After
     * finalize, flashattn_plan_get_i64() returns the number the plan runs (1: unsplit). Meant for
     * tests and tuning; results differ from the unsplit ones by rounding only. Since 0.3. */
    FLASHATTN_I64_NUM_SPLITS = 70
} flashattn_i64_param_t;

/**
 * @brief Values of #FLASHATTN_I64_MASK_ALIGN. Since 0.3.
 *
 * Query i of a sequence with sq queries and sk keys lies on the diagonal key i + sk - sq
 * (bottom-right, the library's default and FlashAttention's: the last query sees the last key) or
 * on key i (top-left, PyTorch's is_causal: the first query sees the first key). The causal mask
 * hides the keys after that key, the windows count from it, ALiBi measures distances from it.
 */
typedef enum flashattn_mask_align {
    FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT = 0, /**< Diagonal key i + seqlen_k - seqlen_q (default). */
    FLASHATTN_MASK_ALIGN_TOP_LEFT = 1      /**< Diagonal key i, as PyTorch's is_causal. */
} flashattn_mask_align_t;

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

/**
 * @brief The tensors of a flashattn_plan_execute_args() or flashattn_plan_execute_backward_args()
 * call, named (pinned values). Since 0.3.
 *
 * Shapes use the plan's sizes; b = batch, n = #FLASHATTN_I64_NEW_KV_ROWS, r = #FLASHATTN_I64_ROTARY_DIM.
 * A new tensor gets a new value; values not listed here are rejected by flashattn_args_set().
 */
typedef enum flashattn_arg {
    FLASHATTN_ARG_Q = 1,            /**< Q, as for flashattn_plan_execute() (packed when varlen). Required. */
    FLASHATTN_ARG_K = 2,            /**< K, or the K cache when paged or appending (written when appending). Required. */
    FLASHATTN_ARG_V = 3,            /**< V, or the V cache (written when appending). Required. */
    FLASHATTN_ARG_O = 4,            /**< Output O. Required. */
    FLASHATTN_ARG_LSE = 5,          /**< Optional output: fp32 LSE, laid out as for flashattn_plan_execute() / _varlen(). */
    FLASHATTN_ARG_CU_SEQLENS_Q = 6, /**< Varlen: int32 [b + 1] query prefix sums. */
    FLASHATTN_ARG_CU_SEQLENS_K = 7, /**< Varlen, not paged: int32 [b + 1] key prefix sums (a paged varlen plan takes key lengths from seqused_k or seqlen_k). */
    FLASHATTN_ARG_PAGE_TABLE = 8,   /**< Paged: int32 [b, max_pages_per_sequence] page indices (row stride #FLASHATTN_I64_PAGE_TABLE_STRIDE). */
    FLASHATTN_ARG_SEQUSED_K = 9,    /**< #FLASHATTN_I64_SEQUSED_K: int32 [b] keys used per sequence (cache lengths before the append). Read, never written. */
    FLASHATTN_ARG_K_NEW = 10,       /**< Append: [b, n, heads_kv, head_dim] rows to append to the K cache. */
    FLASHATTN_ARG_V_NEW = 11,       /**< Append: [b, n, heads_kv, head_dim_v] rows to append to the V cache. */
    FLASHATTN_ARG_ROTARY_COS = 12,  /**< Rotary: fp32 [seqlen_k, r/2] contiguous, cos of position p and frequency i at [p][i]. */
    FLASHATTN_ARG_ROTARY_SIN = 13,  /**< Rotary: fp32 [seqlen_k, r/2] contiguous, the sines. */
    FLASHATTN_ARG_SINK_LOGITS = 20, /**< #FLASHATTN_I64_SINK_LOGITS: fp32 [heads_q] sink logit of each query head. Read only. */
    FLASHATTN_ARG_ALIBI_SLOPES = 21, /**< #FLASHATTN_I64_ALIBI: fp32 [heads_q] ALiBi slope of each query head. Read only. */
    FLASHATTN_ARG_DSINK_LOGITS = 22, /**< Backward with #FLASHATTN_I64_SINK_LOGITS: fp32 [heads_q] output, dLoss/dsink (overwritten): the sum over the head's query rows of -exp(sink - LSE)·(dO·O). Rows that see no key take part too (their LSE is the sink: a term of 0, or NaN when that row's dO holds a NaN). Required there. */
    FLASHATTN_ARG_DOUT = 30,        /**< Backward: dO, laid out as O with the DO_* strides. Required there. */
    FLASHATTN_ARG_DQ = 31,          /**< Backward output: dQ (layout of Q, DQ_* strides). Required there. */
    FLASHATTN_ARG_DK = 32,          /**< Backward output: dK (layout of K, DK_* strides). Required there. */
    FLASHATTN_ARG_DV = 33,          /**< Backward output: dV (layout of V, DV_* strides). Required there. */
    FLASHATTN_ARG_DESCALE_Q = 40,   /**< FP8 plans: fp32 descale factors of Q, one per (sequence, key/value head) as #FLASHATTN_I64_DESCALE_BATCH_STRIDE and _HEAD_STRIDE lay them out (see @ref flashattn_fp8). Read only. Required there, refused elsewhere. Since 0.3. */
    FLASHATTN_ARG_DESCALE_K = 41,   /**< FP8 plans: fp32 descale factors of K, laid out as those of Q. Read only. Required there. Since 0.3. */
    FLASHATTN_ARG_DESCALE_V = 42    /**< FP8 plans: fp32 descale factors of V, laid out as those of Q. Read only. Required there. Since 0.3. */
} flashattn_arg_t;

/**
 * @brief Opaque set of tensor pointers for flashattn_plan_execute_args(): one pointer per
 * #flashattn_arg_t, all NULL when created. Since 0.3.
 *
 * It holds only pointers (it owns no tensor and allocates nothing after creation), so one object
 * can be reused for every call, its pointers replaced between calls. One thread at a time may set
 * it; a call that executes it only reads it.
 */
typedef struct flashattn_args flashattn_args_t;

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
 * runs and why (on Hopper, auto runs FA3's forward and backward, FA2's backward above head dim
 * 128). With
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

/**
 * @defgroup flashattn_serving Serving: paged K/V cache, seqused_k, append with rotary
 * @brief One call per decode or prefill step over a K/V cache. Since 0.3.
 *
 * Plans that use #FLASHATTN_I64_PAGED_KV, #FLASHATTN_I64_SEQUSED_K or #FLASHATTN_I64_NEW_KV_ROWS
 * run with flashattn_plan_execute_args() only (the other execute calls answer
 * #FLASHATTN_ERROR_INVALID_STATE); any plan may use it. They have no backward pass.
 *
 * **Keys.** Sequence b attends over L_b keys: seqused_k[b] (+ n when appending) with
 * #FLASHATTN_I64_SEQUSED_K, otherwise its cu_seqlens_k length (varlen) or seqlen_k. Causal and
 * window masks, and ALiBi's diagonal, are aligned to L_b (query i of a sequence of s_q queries sees
 * key j <= i + L_b - s_q).
 * Paged: key t of sequence b is row t % page_size of page page_table[b][t / page_size] of the caches;
 * only the pages that hold keys below L_b are read.
 *
 * **Append.** With n = #FLASHATTN_I64_NEW_KV_ROWS > 0, before attention the call writes row j of
 * K_new and V_new (for every key/value head) into sequence b's cache at key position
 * seqused_k[b] + j, then attends over the seqused_k[b] + n keys. The library never writes
 * seqused_k: after the call the caller advances it by n (the usual contract of FlashAttention's
 * kvcache call). Two sequences whose page tables share a page slot that both write give undefined
 * results. The K and V caches may interleave (one pool [pages, 2, page_size, heads, dim]) but must
 * not overlap any other tensor.
 *
 * **Rotary.** With r = #FLASHATTN_I64_ROTARY_DIM > 0, the first r columns of Q and of K_new are
 * rotated before use: query row i of sequence b at position p = seqused_k[b] + i, new key row j at
 * p = seqused_k[b] + j. Pairs are (2i, 2i+1) when #FLASHATTN_I64_ROTARY_INTERLEAVED = 1, else
 * (i, i + r/2); a pair (x, y) becomes (x·cos - y·sin, x·sin + y·cos) with cos, sin =
 * table[p][i]. V is never rotated. The rotation is computed in at least fp32 and rounded once to
 * the dtype; the cache receives the rotated K. The result equals, element for element, rotating,
 * writing the cache, then attending with the rotated Q.
 *
 * **Bad input.** The CPU backend reads the int32 arrays and checks them before writing anything:
 * page indices outside [0, num_pages), seqused_k negative or above the cache (seqlen_k; for a
 * varlen contiguous cache, its cu_seqlens_k length) counting the append, rotary positions beyond
 * the table, are #FLASHATTN_ERROR_INVALID_ARGUMENT with a message naming the entry. GPU backends
 * cannot read device memory without synchronising: there the same rules are the caller's
 * contract, and breaking them is undefined behaviour.
 *
 * **Backends.** The CPU, FA2 and FA3 backends run every feature: any page size, fixed-length or
 * varlen queries. FA1 runs seqused_k and the append with rotary, but no paged cache. A GPU backend
 * that lacks a feature answers #FLASHATTN_ERROR_NOT_SUPPORTED at finalize, naming it (under auto
 * another backend then runs the plan).
 * @{
 */

/**
 * @brief Create an argument set with every pointer NULL. Since 0.3.
 * @param[out] args Receives the new object; set to NULL on error.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT @p args is NULL.
 * @retval FLASHATTN_ERROR_ALLOCATION out of host memory.
 */
FLASHATTN_API flashattn_status_t flashattn_args_create(flashattn_args_t **args);

/**
 * @brief Destroy an argument set (the tensors it points to are not touched). Never fails. Since 0.3.
 * @param args The object, or NULL (then nothing happens).
 */
FLASHATTN_API void flashattn_args_destroy(flashattn_args_t *args);

/**
 * @brief Set (or, with NULL, clear) one tensor pointer of an argument set. Since 0.3.
 *
 * Nothing is read through the pointer here; flashattn_plan_execute_args() checks it against the
 * plan. The pointer is const for convenience: the call writes through those of its outputs
 * (O, LSE, and the K and V caches when appending).
 * @param args The argument set.
 * @param which Which tensor.
 * @param ptr Its address (host or device memory, as the plan's backend needs), or NULL.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL @p args, or @p which is not a #flashattn_arg_t value.
 */
FLASHATTN_API flashattn_status_t flashattn_args_set(flashattn_args_t *args, flashattn_arg_t which,
                                                    const void *ptr);

/**
 * @brief Read one tensor pointer of an argument set. Since 0.3.
 * @param args The argument set.
 * @param which Which tensor.
 * @param[out] ptr Receives the pointer (NULL when not set).
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL @p args or @p ptr, or @p which is not a #flashattn_arg_t value.
 */
FLASHATTN_API flashattn_status_t flashattn_args_get(const flashattn_args_t *args, flashattn_arg_t which,
                                                    const void **ptr);

/**
 * @brief Run the forward pass of a finalized plan with the tensors of an argument set: the one
 * call for paged K/V, seqused_k and append with rotary, and usable for any plan. Since 0.3.
 *
 * Every pointer the plan needs must be set (Q, K, V, O always; the cu_seqlens for varlen plans,
 * cu_seqlens_k only without pages; the page table when paged; seqused_k with
 * #FLASHATTN_I64_SEQUSED_K; K_new and V_new when appending; cos and sin with rotary) and no other
 * (LSE is optional): a pointer the plan does not use is an error, not silently ignored. Outputs
 * must not overlap any input; see @ref flashattn_serving for the K/V caches.
 *
 * @param plan A finalized plan.
 * @param args Its tensors.
 * @param workspace, workspace_bytes As for flashattn_plan_execute().
 * @param stream As for flashattn_plan_execute().
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or args, a required pointer NULL, a pointer
 * the plan does not use, overlapping tensors, wrong memory kind; on the CPU backend also bad
 * cu_seqlens, page indices, seqused_k or rotary positions (nothing is written).
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE @p workspace_bytes is below the plan's need.
 * @retval FLASHATTN_ERROR_DEVICE a kernel launch failed.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute_args(const flashattn_plan_t *plan,
                                                             const flashattn_args_t *args,
                                                             void *workspace, size_t workspace_bytes,
                                                             flashattn_stream_t stream);

/** @} */

/**
 * @defgroup flashattn_variants Attention variants and merging partial states
 * @brief Top-left alignment, sink tokens, sink logits, ALiBi, the backward through an argument
 * set, and the merge of partial attention states (cascade and context-parallel attention). Since 0.3.
 *
 * The plan keys #FLASHATTN_I64_MASK_ALIGN and #FLASHATTN_I64_SINK_TOKENS need no per-call data and
 * work with every execute function. #FLASHATTN_I64_SINK_LOGITS and #FLASHATTN_I64_ALIBI need
 * per-head fp32 arrays (#FLASHATTN_ARG_SINK_LOGITS, #FLASHATTN_ARG_ALIBI_SLOPES): run such plans
 * with flashattn_plan_execute_args() and flashattn_plan_execute_backward_args() (the 0.2 execute
 * functions refuse them with #FLASHATTN_ERROR_INVALID_ARGUMENT). With sink logits, a row that sees
 * no key gets O = 0 and LSE = its head's sink logit. Backends that cannot run a variant say so at
 * finalize, naming it (#FLASHATTN_BACKEND_AUTO falls back to one that can). The backward passes
 * of cpu, fa2 and fa3 run every variant; fa1 has none.
 * flashattn_plan_get_backward_backend() says which runs and, where none can, why.
 * @{
 */

/**
 * @brief Run the backward pass of a finalized plan with the tensors of an argument set. Since 0.3.
 *
 * Set Q, K, V, O, LSE (the forward's, required), #FLASHATTN_ARG_DOUT, #FLASHATTN_ARG_DQ,
 * #FLASHATTN_ARG_DK, #FLASHATTN_ARG_DV, the cu_seqlens for a variable-length plan, and the
 * variant arrays the plan uses (#FLASHATTN_ARG_SINK_LOGITS with #FLASHATTN_ARG_DSINK_LOGITS,
 * #FLASHATTN_ARG_ALIBI_SLOPES); no other pointer (the serving features have no backward pass).
 * Layouts and rules are those of flashattn_plan_execute_backward() / _varlen().
 *
 * @param plan A finalized plan.
 * @param args Its tensors.
 * @param workspace, workspace_bytes As for flashattn_plan_execute_backward().
 * @param stream As for flashattn_plan_execute().
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan or args, a required pointer NULL, a pointer
 * the backward does not use, overlapping tensors, wrong memory kind; bad cu_seqlens (CPU backend).
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED no backend can run this plan's backward pass (with the
 * variants it uses: flashattn_plan_get_backward_backend() says why).
 * @retval FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE @p workspace_bytes is below the plan's need.
 * @retval FLASHATTN_ERROR_DEVICE a kernel launch failed.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_execute_backward_args(const flashattn_plan_t *plan,
                                                                      const flashattn_args_t *args,
                                                                      void *workspace, size_t workspace_bytes,
                                                                      flashattn_stream_t stream);

/** @brief The most partial states one flashattn_plan_merge_states() call merges. Since 0.3. */
#define FLASHATTN_MAX_MERGE_PARTIALS 128

/**
 * @brief Merge partial attention states into one: O = sum_s e^(LSE_s - LSE) O_s and
 * LSE = log sum_s e^(LSE_s). Since 0.3.
 *
 * Partial s is the output O_s and LSE_s of attention over a subset of the keys (the subsets
 * disjoint, their union the keys wanted), as this library's forward writes them: merging the
 * states of one plan run over key blocks gives, to rounding, one run over all the keys. A row with
 * LSE_s = -inf (it saw no key of that subset) contributes nothing, whatever its O holds; a row -inf
 * in every partial gets O = 0 and LSE = -inf. NaN propagates: a NaN LSE_s in any partial makes the
 * row's O and LSE NaN, and a NaN in O_s of a partial that contributes makes that column of the
 * row NaN. Sink logits belong to exactly one of the partials.
 *
 * The plan supplies the layout and the place: a finalized plan whose output the partials share
 * (batch, seqlen_q or total_q, heads_q, head_dim_v, the O strides and the LSE layout). The merge
 * runs where the plan runs: on the host for the CPU backend, on the plan's device (stream-ordered,
 * no allocation, no workspace) for the GPU backends.
 *
 * @param plan A finalized plan (its seqlen_k, head_dim and mask do not matter here).
 * @param num_partials Number of partial states, 1 to #FLASHATTN_MAX_MERGE_PARTIALS.
 * @param partial_o Host array of @p num_partials pointers: partial s's O, laid out as the plan's O
 * (its strides, in elements of @p partial_dtype).
 * @param partial_lse Host array of @p num_partials pointers: partial s's fp32 LSE, laid out as the
 * plan's LSE.
 * @param partial_dtype Element type of the partial outputs: #FLASHATTN_DTYPE_FP32 or the plan's
 * dtype.
 * @param o Output, laid out as the plan's O in the plan's dtype; must not overlap any partial.
 * @param lse Optional output (NULL to skip): fp32, the plan's LSE layout; must not overlap any
 * other tensor.
 * @param stream CUDA stream for GPU backends; ignored on the CPU.
 *
 * Pointers of a GPU plan must be device memory on its device, 16-byte aligned (4-byte for the
 * LSEs). The array of pointers is read during the call and not kept.
 *
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT NULL plan, arrays, pointers or @p o; @p num_partials out of
 * range; a @p partial_dtype other than fp32 or the plan's; overlapping outputs; wrong memory kind
 * or device; misaligned pointers.
 * @retval FLASHATTN_ERROR_INVALID_STATE the plan is not finalized.
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED the plan's device has no merge kernel in this build.
 * @retval FLASHATTN_ERROR_DEVICE a kernel launch failed.
 */
FLASHATTN_API flashattn_status_t flashattn_plan_merge_states(const flashattn_plan_t *plan, int32_t num_partials,
                                                             const void *const *partial_o,
                                                             const float *const *partial_lse,
                                                             flashattn_dtype_t partial_dtype, void *o, float *lse,
                                                             flashattn_stream_t stream);

/** @} */

/**
 * @defgroup flashattn_fp8 FP8 (E4M3) inputs
 * @brief Q, K and V in FP8 E4M3 with fp32 descale factors; O in bf16 or fp16. Since 0.3.
 *
 * A plan with #FLASHATTN_I64_DTYPE = #FLASHATTN_DTYPE_FP8_E4M3 takes Q, K and V as E4M3 bytes
 * and computes attention of the dequantized tensors: Q' = descale_q·Q, K' = descale_k·K,
 * V' = descale_v·V, O = softmax(scale·Q'K'ᵀ)V' (with every mask, softcap and variant the plan
 * sets, as for the other dtypes). O is written as #FLASHATTN_I64_OUTPUT_DTYPE (bf16 by default,
 * or fp16); the LSE, when asked for, is fp32 as always and includes the descales.
 *
 * **Descales.** Three fp32 arrays passed to each call in the argument set
 * (#FLASHATTN_ARG_DESCALE_Q, #FLASHATTN_ARG_DESCALE_K, #FLASHATTN_ARG_DESCALE_V), so a plan stays
 * read-only and the factors may change every call. Element [b][h] of each, at offset
 * b·#FLASHATTN_I64_DESCALE_BATCH_STRIDE + h·#FLASHATTN_I64_DESCALE_HEAD_STRIDE, applies to sequence b
 * and key/value head h (Q's to every query head of that group), as FlashAttention-3 and cuDNN take
 * them; the default strides (heads_kv, 1) are a contiguous [batch, heads_kv] array, and strides
 * (0, 0) one value per tensor. For variable-length plans b is the sequence index. FP8 plans run
 * only through flashattn_plan_execute_args() (the 0.2 execute calls have no descale arguments and
 * refuse them with #FLASHATTN_ERROR_INVALID_ARGUMENT naming descale_q); the descales are required
 * there and refused for other plans.
 *
 * **Where they live.** The CPU backend reads host memory and checks it: every factor must be
 * finite (#FLASHATTN_ERROR_INVALID_ARGUMENT naming the entry otherwise). A GPU backend reads them
 * in the kernel from device memory on the plan's device (no synchronisation; finite values are the
 * caller's contract there).
 *
 * **Backends.** The CPU backend converts E4M3 exactly to fp32 (every E4M3 value is an fp32 value),
 * multiplies by the descale in fp32 and computes as for fp32 inputs; it is the reference. FA3 runs
 * FP8 plans on Hopper (sm_90) with an E4M3 tensor-core kernel, and #FLASHATTN_BACKEND_AUTO picks it
 * there: Q·Kᵀ and P·V in E4M3 with fp32 accumulation, P scaled by 256 before its E4M3 rounding;
 * head dims up to 256 in multiples of 16, head_dim_v equal to head_dim, causal, windows, soft cap,
 * GQA/MQA, variable lengths, strides and the LSE; not ALiBi, sink tokens or sink logits
 * (#FLASHATTN_ERROR_NOT_SUPPORTED naming them). Its descales must be positive (or zero). FA1 and
 * FA2 have no FP8 path (#FLASHATTN_ERROR_NOT_SUPPORTED, with the reason), so on other GPUs
 * #FLASHATTN_BACKEND_AUTO fails with #FLASHATTN_ERROR_NOT_SUPPORTED (set #FLASHATTN_BACKEND_CPU
 * to run on the host, as for any plan no GPU backend runs). The serving features that write or page the caches
 * (#FLASHATTN_I64_PAGED_KV, #FLASHATTN_I64_NEW_KV_ROWS) are refused with FP8; there is no backward
 * pass for FP8 plans (flashattn_plan_get_backward_backend() says why), and
 * flashattn_plan_merge_states() refuses them (merge with a bf16 or fp16 plan of the same layout).
 *
 * **Outliers.** A few large coordinates in Q or K force a large scale and crush the rest into
 * E4M3's few mantissa bits. flashattn_rotate_hadamard() multiplies Q and K by the same random
 * orthogonal matrix before they are quantized (incoherent processing, as FlashAttention-3 does):
 * Q·Kᵀ is unchanged and the outliers are spread over every coordinate.
 * @{
 */

/**
 * @brief Rotate each row of a [rows, dim] tensor by a random-sign Hadamard matrix scaled by
 * 1/sqrt(dim): y = x·S·H/sqrt(dim). Since 0.3.
 *
 * H is the Sylvester Hadamard matrix, H[i][j] = (-1)^popcount(i & j); S = diag(s_0 ...
 * s_{dim-1}) with s_j = -1 when the top bit of splitmix64(seed + j) is set, else +1, where
 * splitmix64(x): z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30))·0xBF58476D1CE4E5B9;
 * z = (z ^ (z >> 27))·0x94D049BB133111EB; return z ^ (z >> 31) (arithmetic mod 2^64). The matrix is
 * orthogonal, so rotating Q and K with the same seed leaves every score Q·Kᵀ unchanged (to
 * rounding): the attention result does not change while outliers spread over all coordinates,
 * which is what FP8 quantization of Q and K needs (see @ref flashattn_fp8). V is not rotated.
 * Computed in fp32 (the fast Walsh-Hadamard transform), rounded once to @p dtype.
 *
 * A [batch, seq, heads, dim] tensor whose heads are contiguous is rows = batch·seq·heads rows of
 * row stride dim (its head stride); other layouts are rotated one strided piece per call.
 *
 * @param dtype #FLASHATTN_DTYPE_FP16, #FLASHATTN_DTYPE_BF16 or #FLASHATTN_DTYPE_FP32.
 * @param rows Number of rows, 0 or more (0: nothing is read or written).
 * @param dim Row length: a power of two from 8 to 256.
 * @param src First element of row 0; aligned to the element size.
 * @param src_row_stride Elements between rows of @p src, at least @p dim.
 * @param dst Output, the same shape; either @p src itself with the same row stride (in place) or
 * memory that does not overlap @p src.
 * @param dst_row_stride Elements between rows of @p dst, at least @p dim.
 * @param seed Chooses the signs; use one seed for the Q and K of one attention.
 * @param device -1: @p src and @p dst are host memory and the call runs on the calling thread;
 * otherwise the CUDA device that holds them (device memory), where the call only enqueues a kernel
 * (builds with fa2's kernels, sm_80 and newer).
 * @param stream CUDA stream for @p device >= 0 (NULL: the legacy default stream); ignored on the host.
 * @retval FLASHATTN_SUCCESS
 * @retval FLASHATTN_ERROR_INVALID_ARGUMENT a bad @p dtype, @p dim, @p rows, stride or @p device;
 * NULL or misaligned pointers; @p dst overlapping @p src other than in place; memory of the wrong
 * kind or device (nothing is written).
 * @retval FLASHATTN_ERROR_NOT_SUPPORTED @p device >= 0 in a build without the CUDA kernel, or a
 * device older than sm_80.
 * @retval FLASHATTN_ERROR_DEVICE the CUDA runtime failed (setting the device, the launch).
 */
FLASHATTN_API flashattn_status_t flashattn_rotate_hadamard(flashattn_dtype_t dtype, int64_t rows, int64_t dim,
                                                           const void *src, int64_t src_row_stride, void *dst,
                                                           int64_t dst_row_stride, uint64_t seed, int32_t device,
                                                           flashattn_stream_t stream);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_FLASHATTN_H */
