//! Raw declarations of libflashattn's C API, written by hand from `include/flashattn/flashattn.h`.
//!
//! Everything here is `unsafe` and mirrors the header one to one: C enums are `c_int` type aliases
//! with their pinned values as constants, the plan is an opaque type used behind pointers.
//! `tests/header.rs` parses the header and this file and fails when they disagree (a function
//! missing, an argument count or type different, an enum value different). The safe API is the
//! `flashattn` crate.
#![allow(non_camel_case_types)]
#![no_std]

use core::ffi::{c_char, c_int, c_void};
use core::marker::{PhantomData, PhantomPinned};

// ---------------------------------------------------------------------------------------------
// Types and constants

/// `flashattn_status_t`: 0 is success.
pub type flashattn_status_t = c_int;
pub const FLASHATTN_SUCCESS: flashattn_status_t = 0;
pub const FLASHATTN_ERROR_INVALID_ARGUMENT: flashattn_status_t = 1;
pub const FLASHATTN_ERROR_NOT_SUPPORTED: flashattn_status_t = 2;
pub const FLASHATTN_ERROR_INVALID_STATE: flashattn_status_t = 3;
pub const FLASHATTN_ERROR_ALLOCATION: flashattn_status_t = 4;
pub const FLASHATTN_ERROR_DEVICE: flashattn_status_t = 5;
pub const FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE: flashattn_status_t = 6;
pub const FLASHATTN_ERROR_INTERNAL: flashattn_status_t = 7;

/// `flashattn_dtype_t`
pub type flashattn_dtype_t = c_int;
pub const FLASHATTN_DTYPE_FP16: flashattn_dtype_t = 1;
pub const FLASHATTN_DTYPE_BF16: flashattn_dtype_t = 2;
pub const FLASHATTN_DTYPE_FP32: flashattn_dtype_t = 3;
pub const FLASHATTN_DTYPE_FP8_E4M3: flashattn_dtype_t = 4;

/// `flashattn_backend_t`
pub type flashattn_backend_t = c_int;
pub const FLASHATTN_BACKEND_AUTO: flashattn_backend_t = 0;
pub const FLASHATTN_BACKEND_CPU: flashattn_backend_t = 1;
pub const FLASHATTN_BACKEND_FA1: flashattn_backend_t = 2;
pub const FLASHATTN_BACKEND_FA2: flashattn_backend_t = 3;
pub const FLASHATTN_BACKEND_FA3: flashattn_backend_t = 4;

/// `flashattn_i64_param_t`
pub type flashattn_i64_param_t = c_int;
pub const FLASHATTN_I64_BATCH: flashattn_i64_param_t = 1;
pub const FLASHATTN_I64_SEQLEN_Q: flashattn_i64_param_t = 2;
pub const FLASHATTN_I64_SEQLEN_K: flashattn_i64_param_t = 3;
pub const FLASHATTN_I64_HEADS_Q: flashattn_i64_param_t = 4;
pub const FLASHATTN_I64_HEADS_KV: flashattn_i64_param_t = 5;
pub const FLASHATTN_I64_HEAD_DIM: flashattn_i64_param_t = 6;
pub const FLASHATTN_I64_HEAD_DIM_V: flashattn_i64_param_t = 7;
pub const FLASHATTN_I64_DTYPE: flashattn_i64_param_t = 8;
pub const FLASHATTN_I64_CAUSAL: flashattn_i64_param_t = 9;
pub const FLASHATTN_I64_WINDOW_LEFT: flashattn_i64_param_t = 10;
pub const FLASHATTN_I64_WINDOW_RIGHT: flashattn_i64_param_t = 11;
pub const FLASHATTN_I64_BACKEND: flashattn_i64_param_t = 12;
pub const FLASHATTN_I64_DEVICE: flashattn_i64_param_t = 13;
pub const FLASHATTN_I64_VARLEN: flashattn_i64_param_t = 14;
pub const FLASHATTN_I64_TOTAL_Q: flashattn_i64_param_t = 15;
pub const FLASHATTN_I64_TOTAL_K: flashattn_i64_param_t = 16;
pub const FLASHATTN_I64_Q_BATCH_STRIDE: flashattn_i64_param_t = 20;
pub const FLASHATTN_I64_Q_ROW_STRIDE: flashattn_i64_param_t = 21;
pub const FLASHATTN_I64_Q_HEAD_STRIDE: flashattn_i64_param_t = 22;
pub const FLASHATTN_I64_K_BATCH_STRIDE: flashattn_i64_param_t = 23;
pub const FLASHATTN_I64_K_ROW_STRIDE: flashattn_i64_param_t = 24;
pub const FLASHATTN_I64_K_HEAD_STRIDE: flashattn_i64_param_t = 25;
pub const FLASHATTN_I64_V_BATCH_STRIDE: flashattn_i64_param_t = 26;
pub const FLASHATTN_I64_V_ROW_STRIDE: flashattn_i64_param_t = 27;
pub const FLASHATTN_I64_V_HEAD_STRIDE: flashattn_i64_param_t = 28;
pub const FLASHATTN_I64_O_BATCH_STRIDE: flashattn_i64_param_t = 29;
pub const FLASHATTN_I64_O_ROW_STRIDE: flashattn_i64_param_t = 30;
pub const FLASHATTN_I64_O_HEAD_STRIDE: flashattn_i64_param_t = 31;
pub const FLASHATTN_I64_DETERMINISTIC: flashattn_i64_param_t = 32;
pub const FLASHATTN_I64_DO_BATCH_STRIDE: flashattn_i64_param_t = 33;
pub const FLASHATTN_I64_DO_ROW_STRIDE: flashattn_i64_param_t = 34;
pub const FLASHATTN_I64_DO_HEAD_STRIDE: flashattn_i64_param_t = 35;
pub const FLASHATTN_I64_DQ_BATCH_STRIDE: flashattn_i64_param_t = 36;
pub const FLASHATTN_I64_DQ_ROW_STRIDE: flashattn_i64_param_t = 37;
pub const FLASHATTN_I64_DQ_HEAD_STRIDE: flashattn_i64_param_t = 38;
pub const FLASHATTN_I64_DK_BATCH_STRIDE: flashattn_i64_param_t = 39;
pub const FLASHATTN_I64_DK_ROW_STRIDE: flashattn_i64_param_t = 40;
pub const FLASHATTN_I64_DK_HEAD_STRIDE: flashattn_i64_param_t = 41;
pub const FLASHATTN_I64_DV_BATCH_STRIDE: flashattn_i64_param_t = 42;
pub const FLASHATTN_I64_DV_ROW_STRIDE: flashattn_i64_param_t = 43;
pub const FLASHATTN_I64_DV_HEAD_STRIDE: flashattn_i64_param_t = 44;
pub const FLASHATTN_I64_PAGED_KV: flashattn_i64_param_t = 45;
pub const FLASHATTN_I64_PAGE_SIZE: flashattn_i64_param_t = 46;
pub const FLASHATTN_I64_NUM_PAGES: flashattn_i64_param_t = 47;
pub const FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE: flashattn_i64_param_t = 48;
pub const FLASHATTN_I64_PAGE_TABLE_STRIDE: flashattn_i64_param_t = 49;
pub const FLASHATTN_I64_SEQUSED_K: flashattn_i64_param_t = 50;
pub const FLASHATTN_I64_NEW_KV_ROWS: flashattn_i64_param_t = 51;
pub const FLASHATTN_I64_K_NEW_BATCH_STRIDE: flashattn_i64_param_t = 52;
pub const FLASHATTN_I64_K_NEW_ROW_STRIDE: flashattn_i64_param_t = 53;
pub const FLASHATTN_I64_K_NEW_HEAD_STRIDE: flashattn_i64_param_t = 54;
pub const FLASHATTN_I64_V_NEW_BATCH_STRIDE: flashattn_i64_param_t = 55;
pub const FLASHATTN_I64_V_NEW_ROW_STRIDE: flashattn_i64_param_t = 56;
pub const FLASHATTN_I64_V_NEW_HEAD_STRIDE: flashattn_i64_param_t = 57;
pub const FLASHATTN_I64_ROTARY_DIM: flashattn_i64_param_t = 58;
pub const FLASHATTN_I64_ROTARY_INTERLEAVED: flashattn_i64_param_t = 59;
pub const FLASHATTN_I64_MASK_ALIGN: flashattn_i64_param_t = 60;
pub const FLASHATTN_I64_SINK_TOKENS: flashattn_i64_param_t = 61;
pub const FLASHATTN_I64_SINK_LOGITS: flashattn_i64_param_t = 62;
pub const FLASHATTN_I64_ALIBI: flashattn_i64_param_t = 63;
pub const FLASHATTN_I64_OUTPUT_DTYPE: flashattn_i64_param_t = 64;
pub const FLASHATTN_I64_DESCALE_BATCH_STRIDE: flashattn_i64_param_t = 65;
pub const FLASHATTN_I64_DESCALE_HEAD_STRIDE: flashattn_i64_param_t = 66;
pub const FLASHATTN_I64_NUM_SPLITS: flashattn_i64_param_t = 70;

pub type flashattn_mask_align_t = c_int;
pub const FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT: flashattn_mask_align_t = 0;
pub const FLASHATTN_MASK_ALIGN_TOP_LEFT: flashattn_mask_align_t = 1;

/// `flashattn_f64_param_t`
pub type flashattn_f64_param_t = c_int;
pub const FLASHATTN_F64_SOFTMAX_SCALE: flashattn_f64_param_t = 1;
pub const FLASHATTN_F64_SOFTCAP: flashattn_f64_param_t = 2;

/// `flashattn_arg_t`: the tensors of `flashattn_plan_execute_args` (since 0.3).
pub type flashattn_arg_t = c_int;
pub const FLASHATTN_ARG_Q: flashattn_arg_t = 1;
pub const FLASHATTN_ARG_K: flashattn_arg_t = 2;
pub const FLASHATTN_ARG_V: flashattn_arg_t = 3;
pub const FLASHATTN_ARG_O: flashattn_arg_t = 4;
pub const FLASHATTN_ARG_LSE: flashattn_arg_t = 5;
pub const FLASHATTN_ARG_CU_SEQLENS_Q: flashattn_arg_t = 6;
pub const FLASHATTN_ARG_CU_SEQLENS_K: flashattn_arg_t = 7;
pub const FLASHATTN_ARG_PAGE_TABLE: flashattn_arg_t = 8;
pub const FLASHATTN_ARG_SEQUSED_K: flashattn_arg_t = 9;
pub const FLASHATTN_ARG_K_NEW: flashattn_arg_t = 10;
pub const FLASHATTN_ARG_V_NEW: flashattn_arg_t = 11;
pub const FLASHATTN_ARG_ROTARY_COS: flashattn_arg_t = 12;
pub const FLASHATTN_ARG_ROTARY_SIN: flashattn_arg_t = 13;

/// `struct CUstream_st`: only ever behind a pointer.
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `flashattn_stream_t`: a `cudaStream_t`; null is the legacy default stream.
pub type flashattn_stream_t = *mut CUstream_st;

/// `flashattn_plan_t`: opaque.
#[repr(C)]
pub struct flashattn_plan_t {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

pub const FLASHATTN_ARG_SINK_LOGITS: flashattn_arg_t = 20;
pub const FLASHATTN_ARG_ALIBI_SLOPES: flashattn_arg_t = 21;
pub const FLASHATTN_ARG_DSINK_LOGITS: flashattn_arg_t = 22;
pub const FLASHATTN_ARG_DOUT: flashattn_arg_t = 30;
pub const FLASHATTN_ARG_DQ: flashattn_arg_t = 31;
pub const FLASHATTN_ARG_DK: flashattn_arg_t = 32;
pub const FLASHATTN_ARG_DV: flashattn_arg_t = 33;
pub const FLASHATTN_ARG_DESCALE_Q: flashattn_arg_t = 40;
pub const FLASHATTN_ARG_DESCALE_K: flashattn_arg_t = 41;
pub const FLASHATTN_ARG_DESCALE_V: flashattn_arg_t = 42;

/// `flashattn_args_t`: opaque (since 0.3).
#[repr(C)]
pub struct flashattn_args_t {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ---------------------------------------------------------------------------------------------
// Functions, in the header's order.

extern "C" {
    pub fn flashattn_status_string(status: flashattn_status_t) -> *const c_char;
    pub fn flashattn_last_error() -> *const c_char;
    pub fn flashattn_last_error_copy(buffer: *mut c_char, size: usize) -> usize;

    pub fn flashattn_version() -> u32;
    pub fn flashattn_version_string() -> *const c_char;
    pub fn flashattn_build_info() -> *const c_char;
    pub fn flashattn_device_count(count: *mut i32) -> flashattn_status_t;
    pub fn flashattn_device_compute_capability(device: i32, major: *mut i32, minor: *mut i32) -> flashattn_status_t;

    pub fn flashattn_plan_create(plan: *mut *mut flashattn_plan_t) -> flashattn_status_t;
    pub fn flashattn_plan_destroy(plan: *mut flashattn_plan_t);
    pub fn flashattn_plan_set_i64(plan: *mut flashattn_plan_t, key: flashattn_i64_param_t, value: i64) -> flashattn_status_t;
    pub fn flashattn_plan_set_f64(plan: *mut flashattn_plan_t, key: flashattn_f64_param_t, value: f64) -> flashattn_status_t;
    pub fn flashattn_plan_get_i64(plan: *const flashattn_plan_t, key: flashattn_i64_param_t, value: *mut i64) -> flashattn_status_t;
    pub fn flashattn_plan_get_f64(plan: *const flashattn_plan_t, key: flashattn_f64_param_t, value: *mut f64) -> flashattn_status_t;
    pub fn flashattn_plan_finalize(plan: *mut flashattn_plan_t) -> flashattn_status_t;
    pub fn flashattn_plan_get_backend(
        plan: *const flashattn_plan_t,
        backend: *mut flashattn_backend_t,
        reason: *mut *const c_char,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_get_workspace_size(plan: *const flashattn_plan_t, bytes: *mut usize) -> flashattn_status_t;
    pub fn flashattn_plan_execute(
        plan: *const flashattn_plan_t,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        lse: *mut f32,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_execute_varlen(
        plan: *const flashattn_plan_t,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *mut c_void,
        lse: *mut f32,
        cu_seqlens_q: *const i32,
        cu_seqlens_k: *const i32,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;

    // Backward pass (since 0.2)
    pub fn flashattn_plan_get_backward_backend(
        plan: *const flashattn_plan_t,
        backend: *mut flashattn_backend_t,
        reason: *mut *const c_char,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_get_backward_workspace_size(plan: *const flashattn_plan_t, bytes: *mut usize) -> flashattn_status_t;
    pub fn flashattn_plan_execute_backward(
        plan: *const flashattn_plan_t,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        dout: *const c_void,
        lse: *const f32,
        dq: *mut c_void,
        dk: *mut c_void,
        dv: *mut c_void,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_execute_backward_varlen(
        plan: *const flashattn_plan_t,
        q: *const c_void,
        k: *const c_void,
        v: *const c_void,
        o: *const c_void,
        dout: *const c_void,
        lse: *const f32,
        dq: *mut c_void,
        dk: *mut c_void,
        dv: *mut c_void,
        cu_seqlens_q: *const i32,
        cu_seqlens_k: *const i32,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;

    // Argument sets (serving, attention variants) and merging partial states (since 0.3)
    pub fn flashattn_args_create(args: *mut *mut flashattn_args_t) -> flashattn_status_t;
    pub fn flashattn_args_destroy(args: *mut flashattn_args_t);
    pub fn flashattn_args_set(args: *mut flashattn_args_t, which: flashattn_arg_t, ptr: *const c_void) -> flashattn_status_t;
    pub fn flashattn_args_get(args: *const flashattn_args_t, which: flashattn_arg_t, ptr: *mut *const c_void) -> flashattn_status_t;
    pub fn flashattn_plan_execute_args(
        plan: *const flashattn_plan_t,
        args: *const flashattn_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_execute_backward_args(
        plan: *const flashattn_plan_t,
        args: *const flashattn_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_merge_states(
        plan: *const flashattn_plan_t,
        num_partials: i32,
        partial_o: *const *const c_void,
        partial_lse: *const *const f32,
        partial_dtype: flashattn_dtype_t,
        o: *mut c_void,
        lse: *mut f32,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_rotate_hadamard(
        dtype: flashattn_dtype_t,
        rows: i64,
        dim: i64,
        src: *const c_void,
        src_row_stride: i64,
        dst: *mut c_void,
        dst_row_stride: i64,
        seed: u64,
        device: i32,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
}

/// libflashattn_cp's declarations (feature "cp"; its own header, flashattn_cp.h).
#[cfg(feature = "cp")]
pub mod cp;
