//! Safe Rust API over libflashattn: exact FlashAttention forward attention
//! `O = softmax(scale · Q·Kᵀ, masked) · V`, plus the optional fp32 natural-log LSE, and its
//! backward pass (dQ, dK, dV from Q, K, V, O, dO and the LSE).
//!
//! [`Plan`] mirrors the C plan: create, set parameters, [`Plan::finalize`], execute any number of
//! times, and the C plan is destroyed when the `Plan` is dropped. Host tensors are slices
//! ([`Plan::execute`], [`Plan::backward`], checked against the plan's sizes, strides and dtype);
//! device memory goes through the `unsafe` [`Plan::execute_raw`] and [`Plan::backward_raw`].
//! [`attention`] and [`attention_backward`] do the whole sequence for contiguous host tensors in
//! one call.
//!
//! ```no_run
//! use flashattn::{attention, Options, Shape};
//! let shape = Shape::new(1, 128, 128, 8, 8, 64);
//! let q = vec![0.1f32; shape.q_len()];
//! let out = attention(&q, &q, &q, &shape, &Options { causal: true, ..Options::default() }).unwrap();
//! println!("o[0] = {}, lse[0] = {}", out.o[0], out.lse[0]);
//! ```
use std::alloc::{self, Layout};
use std::ffi::{c_void, CStr};
use std::fmt;
use std::os::raw::c_char;
use std::ptr::{self, NonNull};

pub use flashattn_sys as sys;

// ---------------------------------------------------------------------------------------------
// Errors

/// A `flashattn_status_t` other than success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    NotSupported,
    InvalidState,
    Allocation,
    Device,
    InsufficientWorkspace,
    Internal,
    /// A value this crate does not know (a newer library).
    Unknown(i32),
}

impl Status {
    pub fn from_raw(raw: sys::flashattn_status_t) -> Option<Status> {
        Some(match raw {
            sys::FLASHATTN_SUCCESS => return None,
            sys::FLASHATTN_ERROR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::FLASHATTN_ERROR_NOT_SUPPORTED => Status::NotSupported,
            sys::FLASHATTN_ERROR_INVALID_STATE => Status::InvalidState,
            sys::FLASHATTN_ERROR_ALLOCATION => Status::Allocation,
            sys::FLASHATTN_ERROR_DEVICE => Status::Device,
            sys::FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE => Status::InsufficientWorkspace,
            sys::FLASHATTN_ERROR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }

    pub fn raw(self) -> sys::flashattn_status_t {
        match self {
            Status::InvalidArgument => sys::FLASHATTN_ERROR_INVALID_ARGUMENT,
            Status::NotSupported => sys::FLASHATTN_ERROR_NOT_SUPPORTED,
            Status::InvalidState => sys::FLASHATTN_ERROR_INVALID_STATE,
            Status::Allocation => sys::FLASHATTN_ERROR_ALLOCATION,
            Status::Device => sys::FLASHATTN_ERROR_DEVICE,
            Status::InsufficientWorkspace => sys::FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE,
            Status::Internal => sys::FLASHATTN_ERROR_INTERNAL,
            Status::Unknown(v) => v,
        }
    }

    /// The library's English name for the status ("invalid argument", ...).
    pub fn name(self) -> &'static str {
        unsafe { static_str(sys::flashattn_status_string(self.raw())) }
    }
}

/// A failed call: the status and the library's message (which names the argument and the rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// This thread's last error message, copied (the library's pointer is only borrowed).
pub fn last_error() -> String {
    unsafe {
        let len = sys::flashattn_last_error_copy(ptr::null_mut(), 0);
        let mut buf = vec![0u8; len + 1];
        sys::flashattn_last_error_copy(buf.as_mut_ptr() as *mut c_char, buf.len());
        buf.truncate(len);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// Turn a status into a Result, reading the message on this thread right after the call.
fn check(raw: sys::flashattn_status_t) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => Err(Error::new(status, last_error())),
    }
}

unsafe fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        ""
    } else {
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

// ---------------------------------------------------------------------------------------------
// Enums

/// Element type of Q, K, V and O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Fp16,
    Bf16,
    Fp32,
    Fp8E4m3,
}

impl DType {
    pub fn raw(self) -> sys::flashattn_dtype_t {
        match self {
            DType::Fp16 => sys::FLASHATTN_DTYPE_FP16,
            DType::Bf16 => sys::FLASHATTN_DTYPE_BF16,
            DType::Fp32 => sys::FLASHATTN_DTYPE_FP32,
            DType::Fp8E4m3 => sys::FLASHATTN_DTYPE_FP8_E4M3,
        }
    }
    pub fn from_raw(raw: i64) -> Option<DType> {
        [DType::Fp16, DType::Bf16, DType::Fp32, DType::Fp8E4m3].into_iter().find(|d| d.raw() as i64 == raw)
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Fp32 => 4,
            DType::Fp8E4m3 => 1,
            _ => 2,
        }
    }
}

/// The implementation that runs a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    Auto,
    Cpu,
    Fa1,
    Fa2,
    Fa3,
}

impl Backend {
    pub fn raw(self) -> sys::flashattn_backend_t {
        match self {
            Backend::Auto => sys::FLASHATTN_BACKEND_AUTO,
            Backend::Cpu => sys::FLASHATTN_BACKEND_CPU,
            Backend::Fa1 => sys::FLASHATTN_BACKEND_FA1,
            Backend::Fa2 => sys::FLASHATTN_BACKEND_FA2,
            Backend::Fa3 => sys::FLASHATTN_BACKEND_FA3,
        }
    }
    pub fn from_raw(raw: i64) -> Option<Backend> {
        [Backend::Auto, Backend::Cpu, Backend::Fa1, Backend::Fa2, Backend::Fa3].into_iter().find(|b| b.raw() as i64 == raw)
    }
}

/// Integer plan parameters (`flashattn_i64_param_t`); see the header for each one's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum I64Param {
    Batch = sys::FLASHATTN_I64_BATCH,
    SeqlenQ = sys::FLASHATTN_I64_SEQLEN_Q,
    SeqlenK = sys::FLASHATTN_I64_SEQLEN_K,
    HeadsQ = sys::FLASHATTN_I64_HEADS_Q,
    HeadsKv = sys::FLASHATTN_I64_HEADS_KV,
    HeadDim = sys::FLASHATTN_I64_HEAD_DIM,
    HeadDimV = sys::FLASHATTN_I64_HEAD_DIM_V,
    Dtype = sys::FLASHATTN_I64_DTYPE,
    Causal = sys::FLASHATTN_I64_CAUSAL,
    WindowLeft = sys::FLASHATTN_I64_WINDOW_LEFT,
    WindowRight = sys::FLASHATTN_I64_WINDOW_RIGHT,
    Backend = sys::FLASHATTN_I64_BACKEND,
    Device = sys::FLASHATTN_I64_DEVICE,
    Varlen = sys::FLASHATTN_I64_VARLEN,
    TotalQ = sys::FLASHATTN_I64_TOTAL_Q,
    TotalK = sys::FLASHATTN_I64_TOTAL_K,
    QBatchStride = sys::FLASHATTN_I64_Q_BATCH_STRIDE,
    QRowStride = sys::FLASHATTN_I64_Q_ROW_STRIDE,
    QHeadStride = sys::FLASHATTN_I64_Q_HEAD_STRIDE,
    KBatchStride = sys::FLASHATTN_I64_K_BATCH_STRIDE,
    KRowStride = sys::FLASHATTN_I64_K_ROW_STRIDE,
    KHeadStride = sys::FLASHATTN_I64_K_HEAD_STRIDE,
    VBatchStride = sys::FLASHATTN_I64_V_BATCH_STRIDE,
    VRowStride = sys::FLASHATTN_I64_V_ROW_STRIDE,
    VHeadStride = sys::FLASHATTN_I64_V_HEAD_STRIDE,
    OBatchStride = sys::FLASHATTN_I64_O_BATCH_STRIDE,
    ORowStride = sys::FLASHATTN_I64_O_ROW_STRIDE,
    OHeadStride = sys::FLASHATTN_I64_O_HEAD_STRIDE,
    /// Backward: 1 = bitwise-reproducible dQ, dK, dV (since 0.2).
    Deterministic = sys::FLASHATTN_I64_DETERMINISTIC,
    DoBatchStride = sys::FLASHATTN_I64_DO_BATCH_STRIDE,
    DoRowStride = sys::FLASHATTN_I64_DO_ROW_STRIDE,
    DoHeadStride = sys::FLASHATTN_I64_DO_HEAD_STRIDE,
    DqBatchStride = sys::FLASHATTN_I64_DQ_BATCH_STRIDE,
    DqRowStride = sys::FLASHATTN_I64_DQ_ROW_STRIDE,
    DqHeadStride = sys::FLASHATTN_I64_DQ_HEAD_STRIDE,
    DkBatchStride = sys::FLASHATTN_I64_DK_BATCH_STRIDE,
    DkRowStride = sys::FLASHATTN_I64_DK_ROW_STRIDE,
    DkHeadStride = sys::FLASHATTN_I64_DK_HEAD_STRIDE,
    DvBatchStride = sys::FLASHATTN_I64_DV_BATCH_STRIDE,
    DvRowStride = sys::FLASHATTN_I64_DV_ROW_STRIDE,
    DvHeadStride = sys::FLASHATTN_I64_DV_HEAD_STRIDE,
    /// Serving (since 0.3): K and V are caches of pages addressed through a page table.
    PagedKv = sys::FLASHATTN_I64_PAGED_KV,
    PageSize = sys::FLASHATTN_I64_PAGE_SIZE,
    NumPages = sys::FLASHATTN_I64_NUM_PAGES,
    MaxPagesPerSequence = sys::FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE,
    PageTableStride = sys::FLASHATTN_I64_PAGE_TABLE_STRIDE,
    SequsedK = sys::FLASHATTN_I64_SEQUSED_K,
    NewKvRows = sys::FLASHATTN_I64_NEW_KV_ROWS,
    KNewBatchStride = sys::FLASHATTN_I64_K_NEW_BATCH_STRIDE,
    KNewRowStride = sys::FLASHATTN_I64_K_NEW_ROW_STRIDE,
    KNewHeadStride = sys::FLASHATTN_I64_K_NEW_HEAD_STRIDE,
    VNewBatchStride = sys::FLASHATTN_I64_V_NEW_BATCH_STRIDE,
    VNewRowStride = sys::FLASHATTN_I64_V_NEW_ROW_STRIDE,
    VNewHeadStride = sys::FLASHATTN_I64_V_NEW_HEAD_STRIDE,
    RotaryDim = sys::FLASHATTN_I64_ROTARY_DIM,
    RotaryInterleaved = sys::FLASHATTN_I64_ROTARY_INTERLEAVED,
    /// A [`MaskAlign`] value: where query i's diagonal key lies (since 0.3).
    MaskAlign = sys::FLASHATTN_I64_MASK_ALIGN,
    /// Sink tokens: the first n keys escape the left window (since 0.3).
    SinkTokens = sys::FLASHATTN_I64_SINK_TOKENS,
    /// 1: per-head sink logits, passed in an [`Args`] as [`Arg::SinkLogits`] (since 0.3).
    SinkLogits = sys::FLASHATTN_I64_SINK_LOGITS,
    /// 1: per-head ALiBi slopes, passed in an [`Args`] as [`Arg::AlibiSlopes`] (since 0.3).
    Alibi = sys::FLASHATTN_I64_ALIBI,
    /// O's [`DType`] (since 0.3): for FP8 plans `Bf16` (default) or `Fp16`; otherwise the plan's dtype.
    OutputDtype = sys::FLASHATTN_I64_OUTPUT_DTYPE,
    /// FP8 plans: f32 elements between sequences in each descale array (default heads_kv; 0 with a
    /// head stride of 0: one value per tensor) (since 0.3).
    DescaleBatchStride = sys::FLASHATTN_I64_DESCALE_BATCH_STRIDE,
    /// FP8 plans: f32 elements between key/value heads in each descale array (default 1) (since 0.3).
    DescaleHeadStride = sys::FLASHATTN_I64_DESCALE_HEAD_STRIDE,
    /// Split-KV parts, 0 (auto, default) to 128; after finalize, the number the plan runs (1 on
    /// backends without split-KV) (since 0.3).
    NumSplits = sys::FLASHATTN_I64_NUM_SPLITS,
}

/// The tensors of [`Plan::execute_args`] (`flashattn_arg_t`, since 0.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Arg {
    Q = sys::FLASHATTN_ARG_Q,
    K = sys::FLASHATTN_ARG_K,
    V = sys::FLASHATTN_ARG_V,
    O = sys::FLASHATTN_ARG_O,
    Lse = sys::FLASHATTN_ARG_LSE,
    CuSeqlensQ = sys::FLASHATTN_ARG_CU_SEQLENS_Q,
    CuSeqlensK = sys::FLASHATTN_ARG_CU_SEQLENS_K,
    PageTable = sys::FLASHATTN_ARG_PAGE_TABLE,
    SequsedK = sys::FLASHATTN_ARG_SEQUSED_K,
    KNew = sys::FLASHATTN_ARG_K_NEW,
    VNew = sys::FLASHATTN_ARG_V_NEW,
    RotaryCos = sys::FLASHATTN_ARG_ROTARY_COS,
    RotarySin = sys::FLASHATTN_ARG_ROTARY_SIN,
    SinkLogits = sys::FLASHATTN_ARG_SINK_LOGITS,
    AlibiSlopes = sys::FLASHATTN_ARG_ALIBI_SLOPES,
    DsinkLogits = sys::FLASHATTN_ARG_DSINK_LOGITS,
    Dout = sys::FLASHATTN_ARG_DOUT,
    Dq = sys::FLASHATTN_ARG_DQ,
    Dk = sys::FLASHATTN_ARG_DK,
    Dv = sys::FLASHATTN_ARG_DV,
    /// FP8 plans: f32 descale factors of Q per (sequence, key/value head) (since 0.3).
    DescaleQ = sys::FLASHATTN_ARG_DESCALE_Q,
    /// FP8 plans: f32 descale factors of K (since 0.3).
    DescaleK = sys::FLASHATTN_ARG_DESCALE_K,
    /// FP8 plans: f32 descale factors of V (since 0.3).
    DescaleV = sys::FLASHATTN_ARG_DESCALE_V,
}

/// A set of tensor pointers for [`Plan::execute_args`] (`flashattn_args_t`): every one null when
/// made, replaced between calls; destroyed on drop. Setting a pointer reads nothing through it;
/// the `unsafe` execute does.
pub struct Args {
    raw: NonNull<sys::flashattn_args_t>,
}

unsafe impl Send for Args {}

impl Drop for Args {
    fn drop(&mut self) {
        unsafe { sys::flashattn_args_destroy(self.raw.as_ptr()) }
    }
}

/// The most partial states one [`Plan::merge_states`] call merges (FLASHATTN_MAX_MERGE_PARTIALS).
pub const MAX_MERGE_PARTIALS: usize = 128;

/// Values of [`I64Param::MaskAlign`] (`flashattn_mask_align_t`, since 0.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum MaskAlign {
    /// Query i's diagonal key is i + seqlen_k - seqlen_q (the default, FlashAttention's).
    BottomRight = sys::FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT,
    /// Query i's diagonal key is i (PyTorch's is_causal).
    TopLeft = sys::FLASHATTN_MASK_ALIGN_TOP_LEFT,
}

impl Args {
    pub fn new() -> Result<Args> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashattn_args_create(&mut raw) })?;
        Ok(Args { raw: NonNull::new(raw).expect("flashattn_args_create returned success and NULL") })
    }

    /// Set (or with null, clear) one pointer: host memory for the CPU backend, device memory for GPUs.
    #[allow(clippy::not_unsafe_ptr_arg_deref)] // stored only; the unsafe execute dereferences it
    pub fn set(&mut self, which: Arg, ptr: *const c_void) -> Result<&mut Args> {
        check(unsafe { sys::flashattn_args_set(self.raw.as_ptr(), which as sys::flashattn_arg_t, ptr) })?;
        Ok(self)
    }

    pub fn get(&self, which: Arg) -> Result<*const c_void> {
        let mut out = ptr::null();
        check(unsafe { sys::flashattn_args_get(self.raw.as_ptr(), which as sys::flashattn_arg_t, &mut out) })?;
        Ok(out)
    }

    pub fn as_ptr(&self) -> *const sys::flashattn_args_t {
        self.raw.as_ptr()
    }
}

/// Floating-point plan parameters (`flashattn_f64_param_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum F64Param {
    SoftmaxScale = sys::FLASHATTN_F64_SOFTMAX_SCALE,
    Softcap = sys::FLASHATTN_F64_SOFTCAP,
}

// ---------------------------------------------------------------------------------------------
// Element types

mod sealed {
    pub trait Sealed {}
}

/// A host element type: `f32`, [`F16`] or [`Bf16`].
pub trait Element: Copy + Default + sealed::Sealed + 'static {
    const DTYPE: DType;
}

/// IEEE binary16, stored as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, stored as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl sealed::Sealed for f32 {}
impl sealed::Sealed for F16 {}
impl sealed::Sealed for Bf16 {}
impl Element for f32 {
    const DTYPE: DType = DType::Fp32;
}
impl Element for F16 {
    const DTYPE: DType = DType::Fp16;
}
impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
}

impl Bf16 {
    /// Round to nearest even.
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x40);
        }
        let round = 0x7FFF + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl F16 {
    /// Round to nearest even (subnormals, infinities and NaN handled).
    pub fn from_f32(x: f32) -> F16 {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exp = ((bits >> 23) & 0xFF) as i32;
        let mant = bits & 0x7F_FFFF;
        if exp == 0xFF {
            return F16(sign | 0x7C00 | if mant != 0 { 0x200 } else { 0 });
        }
        let e = exp - 127 + 15;
        if e >= 0x1F {
            return F16(sign | 0x7C00);
        }
        if e <= 0 {
            if e < -10 {
                return F16(sign);
            }
            let m = mant | 0x80_0000;
            let shift = (14 - e) as u32;
            let half = 1u32 << (shift - 1);
            let rest = m & ((1u32 << shift) - 1);
            let mut h = m >> shift;
            if rest > half || (rest == half && (h & 1) == 1) {
                h += 1;
            }
            return F16(sign | h as u16);
        }
        let mut h = ((e as u32) << 10) | (mant >> 13);
        let rest = mant & 0x1FFF;
        if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
            h += 1; // may carry into the exponent, up to infinity: still correct
        }
        F16(sign | h as u16)
    }
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1F;
        let mant = h & 0x3FF;
        let bits = if exp == 0 {
            if mant == 0 {
                sign
            } else {
                // subnormal: normalise
                let mut e = 113u32;
                let mut m = mant;
                while m & 0x400 == 0 {
                    m <<= 1;
                    e -= 1;
                }
                sign | (e << 23) | ((m & 0x3FF) << 13)
            }
        } else if exp == 0x1F {
            sign | 0x7F80_0000 | (mant << 13)
        } else {
            sign | ((exp + 112) << 23) | (mant << 13)
        };
        f32::from_bits(bits)
    }
}

// ---------------------------------------------------------------------------------------------
// Workspace

/// Host scratch memory for the CPU backend, 256-byte aligned as the library requires.
pub struct Workspace {
    ptr: NonNull<u8>,
    layout: Option<Layout>,
}

unsafe impl Send for Workspace {}

impl Workspace {
    pub fn new(bytes: usize) -> Workspace {
        if bytes == 0 {
            return Workspace { ptr: NonNull::dangling(), layout: None };
        }
        let layout = Layout::from_size_align(bytes, 256).expect("workspace size overflows");
        let ptr = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        Workspace { ptr, layout: Some(layout) }
    }
    pub fn len(&self) -> usize {
        self.layout.map_or(0, |l| l.size())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The address to pass to the `unsafe` raw calls (null when empty).
    pub fn as_mut_ptr(&mut self) -> *mut c_void {
        self.raw().0
    }
    fn raw(&mut self) -> (*mut c_void, usize) {
        if self.layout.is_none() {
            (ptr::null_mut(), 0)
        } else {
            (self.ptr.as_ptr() as *mut c_void, self.len())
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plan

/// Elements each tensor of a finalized plan spans (what host slices must hold at least).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extents {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub lse: usize,
    /// Entries of each cu_seqlens array (batch + 1) for a variable-length plan, else 0.
    pub cu_seqlens: usize,
    /// Backward: dO (layout of O), dQ, dK, dV (layouts of Q, K, V) with their own strides.
    pub dout: usize,
    pub dq: usize,
    pub dk: usize,
    pub dv: usize,
}

/// One attention problem: owns a `flashattn_plan_t`, destroyed on drop.
///
/// Setters take `&mut self` (one thread changes a plan at a time); a finalized plan is read-only
/// and may be executed from many threads at once (`Plan: Sync`), each with its own workspace.
pub struct Plan {
    raw: NonNull<sys::flashattn_plan_t>,
}

unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        unsafe { sys::flashattn_plan_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Plan({:p})", self.raw.as_ptr())
    }
}

impl Plan {
    /// An empty plan (`flashattn_plan_create`).
    pub fn new() -> Result<Plan> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::flashattn_plan_create(&mut raw) })?;
        NonNull::new(raw)
            .map(|raw| Plan { raw })
            .ok_or_else(|| Error::new(Status::Internal, "flashattn_plan_create returned NULL"))
    }

    /// A plan with the given integer parameters set.
    pub fn with(params: &[(I64Param, i64)]) -> Result<Plan> {
        let mut plan = Plan::new()?;
        for &(key, value) in params {
            plan.set_i64(key, value)?;
        }
        Ok(plan)
    }

    pub fn as_ptr(&self) -> *mut sys::flashattn_plan_t {
        self.raw.as_ptr()
    }

    pub fn set_i64(&mut self, key: I64Param, value: i64) -> Result<&mut Plan> {
        check(unsafe { sys::flashattn_plan_set_i64(self.raw.as_ptr(), key as i32, value) })?;
        Ok(self)
    }

    pub fn set_f64(&mut self, key: F64Param, value: f64) -> Result<&mut Plan> {
        check(unsafe { sys::flashattn_plan_set_f64(self.raw.as_ptr(), key as i32, value) })?;
        Ok(self)
    }

    pub fn get_i64(&self, key: I64Param) -> Result<i64> {
        let mut value = 0i64;
        check(unsafe { sys::flashattn_plan_get_i64(self.raw.as_ptr(), key as i32, &mut value) })?;
        Ok(value)
    }

    pub fn get_f64(&self, key: F64Param) -> Result<f64> {
        let mut value = 0f64;
        check(unsafe { sys::flashattn_plan_get_f64(self.raw.as_ptr(), key as i32, &mut value) })?;
        Ok(value)
    }

    pub fn finalize(&mut self) -> Result<&mut Plan> {
        check(unsafe { sys::flashattn_plan_finalize(self.raw.as_ptr()) })?;
        Ok(self)
    }

    /// The backend a finalized plan runs and why it was chosen.
    pub fn backend(&self) -> Result<(Backend, String)> {
        self.read_backend(sys::flashattn_plan_get_backend)
    }

    /// (backend, reason) through `get`: `flashattn_plan_get_backend` or its backward twin.
    fn read_backend(&self, get: unsafe extern "C" fn(*const sys::flashattn_plan_t, *mut sys::flashattn_backend_t,
                                                     *mut *const c_char) -> sys::flashattn_status_t)
                    -> Result<(Backend, String)> {
        let mut backend = 0;
        let mut reason: *const c_char = ptr::null();
        check(unsafe { get(self.raw.as_ptr(), &mut backend, &mut reason) })?;
        let reason = if reason.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(reason) }.to_string_lossy().into_owned()
        };
        let b = Backend::from_raw(backend as i64)
            .ok_or_else(|| Error::new(Status::Internal, format!("unknown backend value {backend}")))?;
        Ok((b, reason))
    }

    /// Bytes of workspace each execute of this finalized plan needs.
    pub fn workspace_size(&self) -> Result<usize> {
        self.read_size(sys::flashattn_plan_get_workspace_size)
    }

    /// Bytes through `get`: `flashattn_plan_get_workspace_size` or its backward twin.
    fn read_size(&self, get: unsafe extern "C" fn(*const sys::flashattn_plan_t, *mut usize) -> sys::flashattn_status_t)
                 -> Result<usize> {
        let mut bytes = 0usize;
        check(unsafe { get(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// A workspace of the size this finalized plan needs.
    pub fn workspace(&self) -> Result<Workspace> {
        Ok(Workspace::new(self.workspace_size()?))
    }

    /// Elements each tensor spans, from the finalized plan's resolved sizes and strides.
    pub fn extents(&self) -> Result<Extents> {
        self.workspace_size()?; // INVALID_STATE with the library's message when not finalized
        let g = |k| self.get_i64(k);
        let varlen = g(I64Param::Varlen)? == 1;
        let batch = g(I64Param::Batch)?;
        let rows_q = if varlen { g(I64Param::TotalQ)? } else { g(I64Param::SeqlenQ)? };
        let rows_k = if varlen { g(I64Param::TotalK)? } else { g(I64Param::SeqlenK)? };
        let (hq, hkv) = (g(I64Param::HeadsQ)?, g(I64Param::HeadsKv)?);
        let (d, dv) = (g(I64Param::HeadDim)?, g(I64Param::HeadDimV)?);
        let span = |rows: i64, heads: i64, dim: i64, s: [I64Param; 3]| -> Result<usize> {
            if rows == 0 {
                return Ok(0);
            }
            let mut end = dim + (rows - 1) * g(s[1])? + (heads - 1) * g(s[2])?;
            if !varlen {
                end += (batch - 1) * g(s[0])?;
            }
            Ok(end as usize)
        };
        use I64Param::*;
        Ok(Extents {
            q: span(rows_q, hq, d, [QBatchStride, QRowStride, QHeadStride])?,
            k: span(rows_k, hkv, d, [KBatchStride, KRowStride, KHeadStride])?,
            v: span(rows_k, hkv, dv, [VBatchStride, VRowStride, VHeadStride])?,
            o: span(rows_q, hq, dv, [OBatchStride, ORowStride, OHeadStride])?,
            lse: ((if varlen { 1 } else { batch }) * hq * rows_q) as usize,
            cu_seqlens: if varlen { batch as usize + 1 } else { 0 },
            dout: span(rows_q, hq, dv, [DoBatchStride, DoRowStride, DoHeadStride])?,
            dq: span(rows_q, hq, d, [DqBatchStride, DqRowStride, DqHeadStride])?,
            dk: span(rows_k, hkv, d, [DkBatchStride, DkRowStride, DkHeadStride])?,
            dv: span(rows_k, hkv, dv, [DvBatchStride, DvRowStride, DvHeadStride])?,
        })
    }

    fn check_host<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &[T], lse: Option<&[f32]>,
                              cu: Option<(&[i32], &[i32])>) -> Result<()> {
        self.check_host_lengths::<T>(false, cu, |e| {
            let mut checks = vec![("q", q.len(), e.q), ("k", k.len(), e.k), ("v", v.len(), e.v), ("o", o.len(), e.o)];
            if let Some(l) = lse {
                checks.push(("lse", l.len(), e.lse));
            }
            checks
        })
    }

    /// Checks host slices of `T` against this finalized plan, whose pass (the backward when
    /// `backward`, else the forward) must run on the CPU backend: `lengths` gives each slice's
    /// (name, elements it holds, elements the plan needs), checked in order, then the cu_seqlens.
    fn check_host_lengths<T: Element>(&self, backward: bool, cu: Option<(&[i32], &[i32])>,
                                      lengths: impl FnOnce(&Extents) -> Vec<(&'static str, usize, usize)>)
                                      -> Result<()> {
        let e = self.extents()?;
        let dtype = DType::from_raw(self.get_i64(I64Param::Dtype)?);
        if dtype != Some(T::DTYPE) {
            return Err(Error::new(Status::InvalidArgument,
                format!("slices of {:?} elements, but the plan's dtype is {:?}", T::DTYPE, dtype)));
        }
        let ((backend, _), runs, raw) = if backward {
            (self.backward_backend()?, "this plan's backward runs", "backward_raw")
        } else {
            (self.backend()?, "this plan runs", "execute_raw")
        };
        if backend != Backend::Cpu {
            return Err(Error::new(Status::InvalidArgument,
                format!("host slices need the CPU backend; {runs} {backend:?} (use {raw} with device memory)")));
        }
        let mut checks = lengths(&e);
        if let Some((cq, ck)) = cu {
            checks.push(("cu_seqlens_q", cq.len(), e.cu_seqlens));
            checks.push(("cu_seqlens_k", ck.len(), e.cu_seqlens));
        }
        for (name, have, need) in checks {
            if have < need {
                return Err(Error::new(Status::InvalidArgument,
                    format!("{name}: the slice holds {have} elements, the plan needs {need}")));
            }
        }
        Ok(())
    }

    /// Run a finalized fixed-length plan on host slices (CPU backend). `lse`, when given, receives
    /// [batch, heads_q, seqlen_q] fp32 values; `workspace` None allocates one for this call.
    pub fn execute<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &mut [T], lse: Option<&mut [f32]>,
                               workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_host(q, k, v, o, lse.as_deref(), None)?;
        let lse_ptr = lse.map_or(ptr::null_mut(), |l| l.as_mut_ptr());
        self.with_workspace(workspace, Plan::workspace, |ws_ptr, ws_bytes| unsafe {
            self.execute_raw(q.as_ptr() as *const c_void, k.as_ptr() as *const c_void, v.as_ptr() as *const c_void,
                             o.as_mut_ptr() as *mut c_void, lse_ptr, ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// Run a finalized variable-length plan on host slices: packed [total, heads, dim] tensors and
    /// int32 prefix sums of batch+1 entries; `lse` is [heads_q, total_q].
    #[allow(clippy::too_many_arguments)]
    pub fn execute_varlen<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &mut [T], lse: Option<&mut [f32]>,
                                      cu_seqlens_q: &[i32], cu_seqlens_k: &[i32],
                                      workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_host(q, k, v, o, lse.as_deref(), Some((cu_seqlens_q, cu_seqlens_k)))?;
        let lse_ptr = lse.map_or(ptr::null_mut(), |l| l.as_mut_ptr());
        self.with_workspace(workspace, Plan::workspace, |ws_ptr, ws_bytes| unsafe {
            self.execute_varlen_raw(q.as_ptr() as *const c_void, k.as_ptr() as *const c_void,
                                    v.as_ptr() as *const c_void, o.as_mut_ptr() as *mut c_void, lse_ptr,
                                    cu_seqlens_q.as_ptr(), cu_seqlens_k.as_ptr(), ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// Runs `run` with the caller's workspace, or when None with one that `alloc` (the forward's
    /// [`Plan::workspace`] or [`Plan::backward_workspace`]) makes for this call.
    fn with_workspace<R>(&self, workspace: Option<&mut Workspace>, alloc: fn(&Plan) -> Result<Workspace>,
                         run: impl FnOnce(*mut c_void, usize) -> Result<R>) -> Result<R> {
        let mut own;
        let ws = match workspace {
            Some(w) => w,
            None => {
                own = alloc(self)?;
                &mut own
            }
        };
        let (ptr, bytes) = ws.raw();
        run(ptr, bytes)
    }

    /// `flashattn_plan_execute` with raw pointers: device memory (and a `cudaStream_t`) for GPU
    /// backends, host memory for the CPU backend.
    ///
    /// # Safety
    /// The pointers must be valid for the plan's shapes, strides and dtype in the memory kind the
    /// plan's backend expects, `o`/`lse` must not alias the inputs, the workspace must hold
    /// `workspace_bytes` bytes, and (on GPUs) all of it must stay alive until the stream reaches
    /// the enqueued work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_raw(&self, q: *const c_void, k: *const c_void, v: *const c_void, o: *mut c_void,
                              lse: *mut f32, workspace: *mut c_void, workspace_bytes: usize,
                              stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute(self.raw.as_ptr(), q, k, v, o, lse, workspace, workspace_bytes,
                                          stream as sys::flashattn_stream_t))
    }

    /// `flashattn_plan_execute_varlen` with raw pointers.
    ///
    /// # Safety
    /// As [`Plan::execute_raw`]; `cu_seqlens_q`/`cu_seqlens_k` hold batch+1 int32 each, in the
    /// same memory kind as the tensors.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_varlen_raw(&self, q: *const c_void, k: *const c_void, v: *const c_void, o: *mut c_void,
                                     lse: *mut f32, cu_seqlens_q: *const i32, cu_seqlens_k: *const i32,
                                     workspace: *mut c_void, workspace_bytes: usize,
                                     stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute_varlen(self.raw.as_ptr(), q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
                                                 workspace, workspace_bytes, stream as sys::flashattn_stream_t))
    }

    /// `flashattn_plan_execute_args`: the call for paged K/V caches, seqused_k and appending K/V
    /// rows with a rotary embedding (any finalized plan may use it). With new_kv_rows > 0 the K and
    /// V caches are written at each sequence's seqused_k; seqused_k is never written (the caller
    /// advances it by new_kv_rows).
    ///
    /// # Safety
    /// As [`Plan::execute_raw`] for every pointer `args` holds (shapes of the plan's keys, memory
    /// kind of its backend); the outputs (O, LSE, the caches when appending) must be writable.
    pub unsafe fn execute_args(&self, args: &Args, workspace: *mut c_void, workspace_bytes: usize,
                               stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute_args(self.raw.as_ptr(), args.as_ptr(), workspace, workspace_bytes,
                                               stream as sys::flashattn_stream_t))
    }

    // -- backward pass -------------------------------------------------------------------------

    /// The backend that runs a finalized plan's backward pass and why (it may differ from the
    /// forward's); `NotSupported` with the reason when none can.
    pub fn backward_backend(&self) -> Result<(Backend, String)> {
        self.read_backend(sys::flashattn_plan_get_backward_backend)
    }

    /// Bytes of workspace each backward execute of this finalized plan needs (not the forward's).
    pub fn backward_workspace_size(&self) -> Result<usize> {
        self.read_size(sys::flashattn_plan_get_backward_workspace_size)
    }

    /// A workspace of the size this finalized plan's backward pass needs.
    pub fn backward_workspace(&self) -> Result<Workspace> {
        Ok(Workspace::new(self.backward_workspace_size()?))
    }

    #[allow(clippy::too_many_arguments)]
    fn check_backward_host<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &[T], dout: &[T], lse: &[f32],
                                       dq: &[T], dk: &[T], dv: &[T], cu: Option<(&[i32], &[i32])>) -> Result<()> {
        self.check_host_lengths::<T>(true, cu, |e| {
            vec![("q", q.len(), e.q), ("k", k.len(), e.k), ("v", v.len(), e.v), ("o", o.len(), e.o),
                 ("dout", dout.len(), e.dout), ("lse", lse.len(), e.lse), ("dq", dq.len(), e.dq),
                 ("dk", dk.len(), e.dk), ("dv", dv.len(), e.dv)]
        })
    }

    /// The backward pass of a finalized fixed-length plan on host slices (CPU backend): from the
    /// forward's `q`, `k`, `v`, `o`, its `lse` [batch, heads_q, seqlen_q] and `dout` (layout of O,
    /// strides `Do*`), writes `dq`, `dk`, `dv` (layouts of Q, K, V, strides `Dq*`, `Dk*`, `Dv*`).
    /// `workspace` None allocates [`Plan::backward_workspace_size`] bytes for this call.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &[T], dout: &[T], lse: &[f32],
                                dq: &mut [T], dk: &mut [T], dv: &mut [T],
                                workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_backward_host(q, k, v, o, dout, lse, dq, dk, dv, None)?;
        self.with_workspace(workspace, Plan::backward_workspace, |ws_ptr, ws_bytes| unsafe {
            self.backward_raw(q.as_ptr() as *const c_void, k.as_ptr() as *const c_void, v.as_ptr() as *const c_void,
                              o.as_ptr() as *const c_void, dout.as_ptr() as *const c_void, lse.as_ptr(),
                              dq.as_mut_ptr() as *mut c_void, dk.as_mut_ptr() as *mut c_void,
                              dv.as_mut_ptr() as *mut c_void, ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// The backward pass of a finalized variable-length plan on packed host slices; `lse` is
    /// [heads_q, total_q], `cu_seqlens_*` int32 prefix sums of batch+1 entries.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_varlen<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &[T], dout: &[T], lse: &[f32],
                                       dq: &mut [T], dk: &mut [T], dv: &mut [T], cu_seqlens_q: &[i32],
                                       cu_seqlens_k: &[i32], workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_backward_host(q, k, v, o, dout, lse, dq, dk, dv, Some((cu_seqlens_q, cu_seqlens_k)))?;
        self.with_workspace(workspace, Plan::backward_workspace, |ws_ptr, ws_bytes| unsafe {
            self.backward_varlen_raw(q.as_ptr() as *const c_void, k.as_ptr() as *const c_void,
                                     v.as_ptr() as *const c_void, o.as_ptr() as *const c_void,
                                     dout.as_ptr() as *const c_void, lse.as_ptr(), dq.as_mut_ptr() as *mut c_void,
                                     dk.as_mut_ptr() as *mut c_void, dv.as_mut_ptr() as *mut c_void,
                                     cu_seqlens_q.as_ptr(), cu_seqlens_k.as_ptr(), ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// `flashattn_plan_execute_backward` with raw pointers (device memory and a `cudaStream_t`
    /// for GPU backends, host memory for the CPU backend).
    ///
    /// # Safety
    /// As [`Plan::execute_raw`]: the pointers must be valid for the plan's shapes, strides and
    /// dtype, `dq`, `dk`, `dv` must not overlap each other or any input, and the workspace must
    /// hold `workspace_bytes` bytes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_raw(&self, q: *const c_void, k: *const c_void, v: *const c_void, o: *const c_void,
                               dout: *const c_void, lse: *const f32, dq: *mut c_void, dk: *mut c_void,
                               dv: *mut c_void, workspace: *mut c_void, workspace_bytes: usize,
                               stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute_backward(self.raw.as_ptr(), q, k, v, o, dout, lse, dq, dk, dv, workspace,
                                                   workspace_bytes, stream as sys::flashattn_stream_t))
    }

    /// `flashattn_plan_execute_backward_varlen` with raw pointers.
    ///
    /// # Safety
    /// As [`Plan::backward_raw`]; `cu_seqlens_q`/`cu_seqlens_k` hold batch+1 int32 each, in the
    /// same memory kind as the tensors.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_varlen_raw(&self, q: *const c_void, k: *const c_void, v: *const c_void, o: *const c_void,
                                      dout: *const c_void, lse: *const f32, dq: *mut c_void, dk: *mut c_void,
                                      dv: *mut c_void, cu_seqlens_q: *const i32, cu_seqlens_k: *const i32,
                                      workspace: *mut c_void, workspace_bytes: usize,
                                      stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute_backward_varlen(self.raw.as_ptr(), q, k, v, o, dout, lse, dq, dk, dv,
                                                          cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes,
                                                          stream as sys::flashattn_stream_t))
    }

    // -- attention variants and merging partial states (since 0.3) -------------------------------

    fn check_heads(&self, arrays: &[(&'static str, Option<usize>)]) -> Result<()> {
        let heads = self.get_i64(I64Param::HeadsQ)? as usize;
        for &(name, len) in arrays {
            if let Some(len) = len {
                if len < heads {
                    return Err(Error::new(Status::InvalidArgument,
                        format!("{name}: the slice holds {len} values, the plan has {heads} query heads")));
                }
            }
        }
        Ok(())
    }

    /// [`Plan::execute`] (or, with `cu_seqlens`, [`Plan::execute_varlen`]) on host slices (CPU
    /// backend) through an argument set, with the per-head arrays the plan's
    /// [`I64Param::SinkLogits`] / [`I64Param::Alibi`] ask for.
    #[allow(clippy::too_many_arguments)]
    pub fn execute_variants<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &mut [T], lse: Option<&mut [f32]>,
                                        cu_seqlens: Option<(&[i32], &[i32])>, sink_logits: Option<&[f32]>,
                                        alibi_slopes: Option<&[f32]>, workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_host(q, k, v, o, lse.as_deref(), cu_seqlens)?;
        self.check_heads(&[("sink_logits", sink_logits.map(<[f32]>::len)), ("alibi_slopes", alibi_slopes.map(<[f32]>::len))])?;
        let mut args = Args::new()?;
        // The slices were checked against the plan above and outlive the call below.
        {
            args.set(Arg::Q, q.as_ptr() as *const c_void)?
                .set(Arg::K, k.as_ptr() as *const c_void)?
                .set(Arg::V, v.as_ptr() as *const c_void)?
                .set(Arg::O, o.as_mut_ptr() as *const c_void)?
                .set(Arg::Lse, lse.map_or(ptr::null(), |l| l.as_mut_ptr() as *const c_void))?
                .set(Arg::SinkLogits, sink_logits.map_or(ptr::null(), |s| s.as_ptr() as *const c_void))?
                .set(Arg::AlibiSlopes, alibi_slopes.map_or(ptr::null(), |s| s.as_ptr() as *const c_void))?;
            if let Some((cq, ck)) = cu_seqlens {
                args.set(Arg::CuSeqlensQ, cq.as_ptr() as *const c_void)?.set(Arg::CuSeqlensK, ck.as_ptr() as *const c_void)?;
            }
        }
        self.with_workspace(workspace, Plan::workspace, |ws_ptr, ws_bytes| unsafe {
            self.execute_args(&args, ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// `flashattn_plan_execute_backward_args`.
    ///
    /// # Safety
    /// As [`Plan::execute_args`], for the backward's tensors (see [`Plan::backward_raw`]).
    pub unsafe fn backward_args(&self, args: &Args, workspace: *mut c_void, workspace_bytes: usize,
                                stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_execute_backward_args(self.raw.as_ptr(), args.raw.as_ptr(), workspace,
                                                        workspace_bytes, stream as sys::flashattn_stream_t))
    }

    /// [`Plan::backward`] (or [`Plan::backward_varlen`] with `cu_seqlens`) through an argument set
    /// with the variant arrays; with sink logits, `dsink_logits` receives their gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_variants<T: Element>(&self, q: &[T], k: &[T], v: &[T], o: &[T], dout: &[T], lse: &[f32],
                                         dq: &mut [T], dk: &mut [T], dv: &mut [T],
                                         cu_seqlens: Option<(&[i32], &[i32])>, sink_logits: Option<&[f32]>,
                                         alibi_slopes: Option<&[f32]>, dsink_logits: Option<&mut [f32]>,
                                         workspace: Option<&mut Workspace>) -> Result<()> {
        self.check_backward_host(q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens)?;
        self.check_heads(&[("sink_logits", sink_logits.map(<[f32]>::len)),
                           ("alibi_slopes", alibi_slopes.map(<[f32]>::len)),
                           ("dsink_logits", dsink_logits.as_deref().map(<[f32]>::len))])?;
        let mut args = Args::new()?;
        // The slices were checked against the plan above and outlive the call below.
        {
            args.set(Arg::Q, q.as_ptr() as *const c_void)?
                .set(Arg::K, k.as_ptr() as *const c_void)?
                .set(Arg::V, v.as_ptr() as *const c_void)?
                .set(Arg::O, o.as_ptr() as *const c_void)?
                .set(Arg::Dout, dout.as_ptr() as *const c_void)?
                .set(Arg::Lse, lse.as_ptr() as *const c_void)?
                .set(Arg::Dq, dq.as_mut_ptr() as *const c_void)?
                .set(Arg::Dk, dk.as_mut_ptr() as *const c_void)?
                .set(Arg::Dv, dv.as_mut_ptr() as *const c_void)?
                .set(Arg::SinkLogits, sink_logits.map_or(ptr::null(), |s| s.as_ptr() as *const c_void))?
                .set(Arg::AlibiSlopes, alibi_slopes.map_or(ptr::null(), |s| s.as_ptr() as *const c_void))?
                .set(Arg::DsinkLogits, dsink_logits.map_or(ptr::null(), |d| d.as_mut_ptr() as *const c_void))?;
            if let Some((cq, ck)) = cu_seqlens {
                args.set(Arg::CuSeqlensQ, cq.as_ptr() as *const c_void)?.set(Arg::CuSeqlensK, ck.as_ptr() as *const c_void)?;
            }
        }
        self.with_workspace(workspace, Plan::backward_workspace, |ws_ptr, ws_bytes| unsafe {
            self.backward_args(&args, ws_ptr, ws_bytes, ptr::null_mut())
        })
    }

    /// Merge partial attention states (`flashattn_plan_merge_states`) on host slices (CPU
    /// backend): each partial O laid out as the plan's O in `P` (fp32 or the plan's dtype), each
    /// partial LSE as the plan's LSE; writes `o` (and `lse`).
    pub fn merge_states<T: Element, P: Element>(&self, partial_o: &[&[P]], partial_lse: &[&[f32]], o: &mut [T],
                                                lse: Option<&mut [f32]>) -> Result<()> {
        if partial_o.len() != partial_lse.len() {
            return Err(Error::new(Status::InvalidArgument,
                format!("partial_o and partial_lse: {} and {} entries", partial_o.len(), partial_lse.len())));
        }
        self.check_host_lengths::<T>(false, None, |e| {
            let mut checks = vec![("o", o.len(), e.o)];
            for (po, pl) in partial_o.iter().zip(partial_lse) {
                checks.push(("partial_o", po.len(), e.o));
                checks.push(("partial_lse", pl.len(), e.lse));
            }
            if let Some(l) = lse.as_deref() {
                checks.push(("lse", l.len(), e.lse));
            }
            checks
        })?;
        let po: Vec<*const c_void> = partial_o.iter().map(|p| p.as_ptr() as *const c_void).collect();
        let pl: Vec<*const f32> = partial_lse.iter().map(|p| p.as_ptr()).collect();
        let lse_ptr = lse.map_or(ptr::null_mut(), |l| l.as_mut_ptr());
        unsafe {
            self.merge_states_raw(po.len() as i32, po.as_ptr(), pl.as_ptr(), P::DTYPE, o.as_mut_ptr() as *mut c_void,
                                  lse_ptr, ptr::null_mut())
        }
    }

    /// `flashattn_plan_merge_states` with raw pointers.
    ///
    /// # Safety
    /// `partial_o` and `partial_lse` hold `num_partials` pointers to tensors laid out as the
    /// plan's O (elements of `partial_dtype`) and LSE in the plan's memory kind; `o`/`lse` as for
    /// [`Plan::execute_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn merge_states_raw(&self, num_partials: i32, partial_o: *const *const c_void,
                                   partial_lse: *const *const f32, partial_dtype: DType, o: *mut c_void,
                                   lse: *mut f32, stream: *mut c_void) -> Result<()> {
        check(sys::flashattn_plan_merge_states(self.raw.as_ptr(), num_partials, partial_o, partial_lse,
                                               partial_dtype.raw(), o, lse,
                                               stream as sys::flashattn_stream_t))
    }
}

// ---------------------------------------------------------------------------------------------
// The incoherent-processing rotation (since 0.3)

/// Rotate each `dim`-long row of the host slice `data` ([rows, dim], contiguous) in place by the
/// random-sign Hadamard matrix of `seed` scaled by 1/sqrt(dim) (`flashattn_rotate_hadamard`).
/// Rotating Q and K with one seed leaves Q·Kᵀ unchanged and spreads outliers before FP8
/// quantization. `dim`: a power of two in [8, 256]; `data.len()` a multiple of it.
pub fn rotate_hadamard<T: Element>(data: &mut [T], dim: usize, seed: u64) -> Result<()> {
    if dim == 0 || data.len() % dim != 0 {
        return Err(Error::new(Status::InvalidArgument,
            format!("data: {} elements is not a whole number of rows of dim = {}", data.len(), dim)));
    }
    let rows = (data.len() / dim) as i64;
    let ptr = data.as_mut_ptr() as *mut c_void;
    unsafe { rotate_hadamard_raw(T::DTYPE, rows, dim as i64, ptr, dim as i64, ptr, dim as i64, seed, -1, ptr::null_mut()) }
}

/// `flashattn_rotate_hadamard` with raw pointers: `device` -1 for host memory, else the CUDA device
/// holding `src` and `dst` (the kernel is enqueued on `stream`).
///
/// # Safety
/// `src` and `dst` hold `rows` rows of `dim` elements of `dtype` at their row strides, in the
/// memory `device` names, alive until the work has run; `dst` is `src` (same stride) or apart from it.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rotate_hadamard_raw(dtype: DType, rows: i64, dim: i64, src: *const c_void, src_row_stride: i64,
                                  dst: *mut c_void, dst_row_stride: i64, seed: u64, device: i32,
                                  stream: *mut c_void) -> Result<()> {
    check(sys::flashattn_rotate_hadamard(dtype.raw(), rows, dim, src, src_row_stride, dst, dst_row_stride, seed, device,
                                         stream as sys::flashattn_stream_t))
}

// ---------------------------------------------------------------------------------------------
// One-call attention on contiguous host tensors

/// Sizes of a fixed-length problem; tensors are contiguous [batch, seq, heads, dim].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
}

impl Shape {
    /// head_dim_v = head_dim.
    pub fn new(batch: usize, seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_kv: usize, head_dim: usize) -> Shape {
        Shape { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v: head_dim }
    }
    pub fn q_len(&self) -> usize {
        self.batch * self.seqlen_q * self.heads_q * self.head_dim
    }
    pub fn k_len(&self) -> usize {
        self.batch * self.seqlen_k * self.heads_kv * self.head_dim
    }
    pub fn v_len(&self) -> usize {
        self.batch * self.seqlen_k * self.heads_kv * self.head_dim_v
    }
    pub fn o_len(&self) -> usize {
        self.batch * self.seqlen_q * self.heads_q * self.head_dim_v
    }
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads_q * self.seqlen_q
    }
}

/// Masking and scaling options; `Options::default()` is plain attention on the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    pub causal: bool,
    /// (left, right); -1 is unbounded.
    pub window: (i64, i64),
    /// 0 = off.
    pub softcap: f64,
    /// None = 1/sqrt(head_dim).
    pub scale: Option<f64>,
    pub backend: Backend,
}

impl Default for Options {
    fn default() -> Options {
        Options { causal: false, window: (-1, -1), softcap: 0.0, scale: None, backend: Backend::Cpu }
    }
}

/// O and LSE of [`attention`].
#[derive(Clone, Debug)]
pub struct Output<T> {
    pub o: Vec<T>,
    pub lse: Vec<f32>,
}

/// A finalized plan with `params`, then the dtype and `opts`, set.
fn options_plan(params: &[(I64Param, i64)], dtype: DType, opts: &Options) -> Result<Plan> {
    let mut plan = Plan::with(params)?;
    plan.set_i64(I64Param::Dtype, dtype.raw() as i64)?
        .set_i64(I64Param::Causal, opts.causal as i64)?
        .set_i64(I64Param::WindowLeft, opts.window.0)?
        .set_i64(I64Param::WindowRight, opts.window.1)?
        .set_i64(I64Param::Backend, opts.backend.raw() as i64)?
        .set_f64(F64Param::Softcap, opts.softcap)?;
    if let Some(scale) = opts.scale {
        plan.set_f64(F64Param::SoftmaxScale, scale)?;
    }
    plan.finalize()?;
    Ok(plan)
}

/// [`options_plan`] for a fixed-length problem on contiguous tensors of `s`.
fn shape_plan(s: &Shape, dtype: DType, opts: &Options) -> Result<Plan> {
    options_plan(&[
        (I64Param::Batch, s.batch as i64),
        (I64Param::SeqlenQ, s.seqlen_q as i64),
        (I64Param::SeqlenK, s.seqlen_k as i64),
        (I64Param::HeadsQ, s.heads_q as i64),
        (I64Param::HeadsKv, s.heads_kv as i64),
        (I64Param::HeadDim, s.head_dim as i64),
        (I64Param::HeadDimV, s.head_dim_v as i64),
    ], dtype, opts)
}

/// Attention over contiguous host tensors: builds, finalizes and runs a plan, returns O and LSE.
pub fn attention<T: Element>(q: &[T], k: &[T], v: &[T], shape: &Shape, opts: &Options) -> Result<Output<T>> {
    let s = shape;
    let plan = shape_plan(s, T::DTYPE, opts)?;
    let mut out = Output { o: vec![T::default(); s.o_len()], lse: vec![0f32; s.lse_len()] };
    plan.execute(q, k, v, &mut out.o, Some(&mut out.lse), None)?;
    Ok(out)
}

/// dQ, dK, dV of [`attention_backward`].
#[derive(Clone, Debug)]
pub struct Gradients<T> {
    pub dq: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
}

/// The backward pass over contiguous host tensors: from the forward's inputs, its [`Output`] and
/// `dout` (the gradient of the loss with respect to O, shaped like O), returns dQ, dK, dV shaped
/// like Q, K, V. `opts` must be the forward's.
pub fn attention_backward<T: Element>(q: &[T], k: &[T], v: &[T], out: &Output<T>, dout: &[T], shape: &Shape,
                                      opts: &Options) -> Result<Gradients<T>> {
    let s = shape;
    let plan = shape_plan(s, T::DTYPE, opts)?;
    let mut g = Gradients { dq: vec![T::default(); s.q_len()], dk: vec![T::default(); s.k_len()],
                            dv: vec![T::default(); s.v_len()] };
    plan.backward(q, k, v, &out.o, dout, &out.lse, &mut g.dq, &mut g.dk, &mut g.dv, None)?;
    Ok(g)
}

/// Variable-length attention over packed host tensors ([total, heads, dim]); the lengths come from
/// the int32 prefix sums. Returns O [total_q, heads_q, head_dim_v] and LSE [heads_q, total_q].
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen<T: Element>(q: &[T], k: &[T], v: &[T], cu_seqlens_q: &[i32], cu_seqlens_k: &[i32],
                                    heads_q: usize, heads_kv: usize, head_dim: usize, head_dim_v: usize,
                                    opts: &Options) -> Result<Output<T>> {
    let invalid = |m: String| Error::new(Status::InvalidArgument, m);
    if cu_seqlens_q.len() < 2 || cu_seqlens_q.len() != cu_seqlens_k.len() {
        return Err(invalid(format!("cu_seqlens: {} and {} entries; both need batch+1 >= 2",
                                   cu_seqlens_q.len(), cu_seqlens_k.len())));
    }
    let max_len = |cu: &[i32]| cu.windows(2).map(|w| (w[1] - w[0]) as i64).max().unwrap_or(1).max(1);
    let (total_q, total_k) = (*cu_seqlens_q.last().unwrap() as i64, *cu_seqlens_k.last().unwrap() as i64);
    let plan = options_plan(&[
        (I64Param::Batch, cu_seqlens_q.len() as i64 - 1),
        (I64Param::SeqlenQ, max_len(cu_seqlens_q)),
        (I64Param::SeqlenK, max_len(cu_seqlens_k)),
        (I64Param::HeadsQ, heads_q as i64),
        (I64Param::HeadsKv, heads_kv as i64),
        (I64Param::HeadDim, head_dim as i64),
        (I64Param::HeadDimV, head_dim_v as i64),
        (I64Param::Varlen, 1),
        (I64Param::TotalQ, total_q.max(0)),
        (I64Param::TotalK, total_k.max(0)),
    ], T::DTYPE, opts)?;
    let tq = total_q.max(0) as usize;
    let mut out = Output { o: vec![T::default(); tq * heads_q * head_dim_v], lse: vec![0f32; heads_q * tq] };
    plan.execute_varlen(q, k, v, &mut out.o, Some(&mut out.lse), cu_seqlens_q, cu_seqlens_k, None)?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Library and device information

/// Run-time version (major, minor, patch).
pub fn version() -> (u32, u32, u32) {
    let v = unsafe { sys::flashattn_version() };
    (v / 10000, v / 100 % 100, v % 100)
}

pub fn version_string() -> &'static str {
    unsafe { static_str(sys::flashattn_version_string()) }
}

/// "cuda=...;archs=...;backends=cpu,..."
pub fn build_info() -> &'static str {
    unsafe { static_str(sys::flashattn_build_info()) }
}

pub fn device_count() -> Result<i32> {
    let mut n = 0;
    check(unsafe { sys::flashattn_device_count(&mut n) })?;
    Ok(n)
}

pub fn device_compute_capability(device: i32) -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    check(unsafe { sys::flashattn_device_compute_capability(device, &mut major, &mut minor) })?;
    Ok((major, minor))
}

/// Context parallelism (ring attention) through libflashattn_cp: feature "cp", experimental.
#[cfg(feature = "cp")]
pub mod cp;
