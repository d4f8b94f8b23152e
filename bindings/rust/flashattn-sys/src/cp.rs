//! Raw declarations of libflashattn_cp (`include/flashattn/flashattn_cp.h`, experimental: its
//! ABI is provisional). Linked by build.rs when the feature "cp" is on. `tests/cp_header.rs`
//! checks this file against the header as `tests/header.rs` does for the core.
use core::ffi::{c_char, c_int, c_void};
use core::marker::{PhantomData, PhantomPinned};

use crate::{flashattn_plan_t, flashattn_status_t, flashattn_stream_t};

/// `flashattn_cp_plan_t`: opaque.
#[repr(C)]
pub struct flashattn_cp_plan_t {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `flashattn_cp_transport_t`
pub type flashattn_cp_transport_t = c_int;
pub const FLASHATTN_CP_TRANSPORT_LOOPBACK: flashattn_cp_transport_t = 1;
pub const FLASHATTN_CP_TRANSPORT_NCCL: flashattn_cp_transport_t = 2;

/// `flashattn_cp_i64_param_t`
pub type flashattn_cp_i64_param_t = c_int;
pub const FLASHATTN_CP_I64_WORLD_SIZE: flashattn_cp_i64_param_t = 1;
pub const FLASHATTN_CP_I64_RANK: flashattn_cp_i64_param_t = 2;
pub const FLASHATTN_CP_I64_TRANSPORT: flashattn_cp_i64_param_t = 3;

extern "C" {
    pub fn flashattn_cp_last_error() -> *const c_char;
    pub fn flashattn_cp_plan_create(plan: *mut *mut flashattn_cp_plan_t) -> flashattn_status_t;
    pub fn flashattn_cp_plan_destroy(plan: *mut flashattn_cp_plan_t);
    pub fn flashattn_cp_plan_set_i64(
        plan: *mut flashattn_cp_plan_t,
        key: flashattn_cp_i64_param_t,
        value: i64,
    ) -> flashattn_status_t;
    pub fn flashattn_cp_plan_set_nccl_comm(plan: *mut flashattn_cp_plan_t, comm: *mut c_void) -> flashattn_status_t;
    pub fn flashattn_cp_plan_finalize(plan: *mut flashattn_cp_plan_t, local: *const flashattn_plan_t)
        -> flashattn_status_t;
    pub fn flashattn_cp_plan_get_workspace_size(plan: *const flashattn_cp_plan_t, bytes: *mut usize)
        -> flashattn_status_t;
    pub fn flashattn_cp_plan_execute(
        plan: *const flashattn_cp_plan_t,
        num_ranks: i32,
        q: *const *const c_void,
        k: *const *const c_void,
        v: *const *const c_void,
        o: *const *mut c_void,
        lse: *const *mut f32,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
    pub fn flashattn_cp_plan_get_backward_workspace_size(plan: *const flashattn_cp_plan_t, bytes: *mut usize)
        -> flashattn_status_t;
    pub fn flashattn_cp_plan_execute_backward(
        plan: *const flashattn_cp_plan_t,
        num_ranks: i32,
        q: *const *const c_void,
        k: *const *const c_void,
        v: *const *const c_void,
        o: *const *const c_void,
        dout: *const *const c_void,
        lse: *const *const f32,
        dq: *const *mut c_void,
        dk: *const *mut c_void,
        dv: *const *mut c_void,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: flashattn_stream_t,
    ) -> flashattn_status_t;
}
