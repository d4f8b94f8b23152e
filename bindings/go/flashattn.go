// Package flashattn calls libflashattn, exact FlashAttention forward attention
// O = softmax(scale·Q·Kᵀ, masked)·V with an optional fp32 log-sum-exp, and its backward pass
// (dQ, dK, dV), through its C API.
//
// A Plan mirrors the C plan: NewPlan, SetI64/SetF64, Finalize, Execute and Backward (any number of
// times), Close. A Plan not closed is destroyed by a finalizer when it becomes unreachable. Host
// tensors are Go slices ([]float32, []Float16, []BFloat16) checked against the plan; device memory
// goes through ExecuteRaw and BackwardRaw with unsafe.Pointer. Attention and AttentionBackward do
// the whole sequence for contiguous host tensors.
//
// The library is found with pkg-config (flashattn.pc); at run time the dynamic loader must find
// libflashattn.so.0 (LD_LIBRARY_PATH, or an installed library).
package flashattn

/*
#cgo pkg-config: flashattn
#include <stdlib.h>
#include <flashattn/flashattn.h>

// flashattn_plan_execute_args (backward = 0) or _backward_args in one C call: cgo forbids storing
// Go pointers in C memory beyond a call, so the flashattn_args_t object is made, filled, run and
// destroyed here, with every pointer passed as an argument (Go 1.19 has no runtime.Pinner to pin
// them instead). The pointers come in flashattn_arg_t order: 1-13, then 20-22, then 30-33, then 40-42.
static flashattn_status_t goflashattn_run_args(int backward, const flashattn_plan_t *plan, const void *q,
        const void *k, const void *v, const void *o, const void *lse, const void *cu_seqlens_q,
        const void *cu_seqlens_k, const void *page_table, const void *seqused_k, const void *k_new,
        const void *v_new, const void *rotary_cos, const void *rotary_sin, const void *sink_logits,
        const void *alibi_slopes, const void *dsink_logits, const void *dout, const void *dq, const void *dk,
        const void *dv, const void *descale_q, const void *descale_k, const void *descale_v, void *workspace,
        size_t workspace_bytes, flashattn_stream_t stream) {
    const void *ptrs[] = {q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, k_new, v_new,
                          rotary_cos, rotary_sin, sink_logits, alibi_slopes, dsink_logits, dout, dq, dk, dv,
                          descale_q, descale_k, descale_v};
    const flashattn_arg_t which[] = {FLASHATTN_ARG_Q, FLASHATTN_ARG_K, FLASHATTN_ARG_V, FLASHATTN_ARG_O,
        FLASHATTN_ARG_LSE, FLASHATTN_ARG_CU_SEQLENS_Q, FLASHATTN_ARG_CU_SEQLENS_K, FLASHATTN_ARG_PAGE_TABLE,
        FLASHATTN_ARG_SEQUSED_K, FLASHATTN_ARG_K_NEW, FLASHATTN_ARG_V_NEW, FLASHATTN_ARG_ROTARY_COS,
        FLASHATTN_ARG_ROTARY_SIN, FLASHATTN_ARG_SINK_LOGITS, FLASHATTN_ARG_ALIBI_SLOPES,
        FLASHATTN_ARG_DSINK_LOGITS, FLASHATTN_ARG_DOUT, FLASHATTN_ARG_DQ, FLASHATTN_ARG_DK, FLASHATTN_ARG_DV,
        FLASHATTN_ARG_DESCALE_Q, FLASHATTN_ARG_DESCALE_K, FLASHATTN_ARG_DESCALE_V};
    flashattn_args_t *args = NULL;
    flashattn_status_t status = flashattn_args_create(&args);
    for (int i = 0; status == FLASHATTN_SUCCESS && i < (int)(sizeof ptrs / sizeof ptrs[0]); ++i)
        status = flashattn_args_set(args, which[i], ptrs[i]);
    if (status == FLASHATTN_SUCCESS)
        status = backward ? flashattn_plan_execute_backward_args(plan, args, workspace, workspace_bytes, stream)
                          : flashattn_plan_execute_args(plan, args, workspace, workspace_bytes, stream);
    flashattn_args_destroy(args);
    return status;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Status is a flashattn_status_t.
type Status int

const (
	StatusSuccess               Status = C.FLASHATTN_SUCCESS
	StatusInvalidArgument       Status = C.FLASHATTN_ERROR_INVALID_ARGUMENT
	StatusNotSupported          Status = C.FLASHATTN_ERROR_NOT_SUPPORTED
	StatusInvalidState          Status = C.FLASHATTN_ERROR_INVALID_STATE
	StatusAllocation            Status = C.FLASHATTN_ERROR_ALLOCATION
	StatusDevice                Status = C.FLASHATTN_ERROR_DEVICE
	StatusInsufficientWorkspace Status = C.FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE
	StatusInternal              Status = C.FLASHATTN_ERROR_INTERNAL
)

// String is the library's English name for the status ("invalid argument", ...).
func (s Status) String() string {
	return C.GoString(C.flashattn_status_string(C.flashattn_status_t(s)))
}

// Error is a failed call: the status and the library's message, which names the argument and
// the rule it broke. errors.Is(err, flashattn.ErrInvalidArgument) tests the status.
type Error struct {
	Status  Status
	Message string
	Op      string // the C function, or the Go method for checks made in Go
}

func (e *Error) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("flashattn: %s: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("flashattn: %s: %s: %s", e.Op, e.Status, e.Message)
}

// Is matches the sentinel errors below by status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Op == "" && t.Status == e.Status
}

// Sentinels for errors.Is.
var (
	ErrInvalidArgument       = &Error{Status: StatusInvalidArgument}
	ErrNotSupported          = &Error{Status: StatusNotSupported}
	ErrInvalidState          = &Error{Status: StatusInvalidState}
	ErrAllocation            = &Error{Status: StatusAllocation}
	ErrDevice                = &Error{Status: StatusDevice}
	ErrInsufficientWorkspace = &Error{Status: StatusInsufficientWorkspace}
	ErrInternal              = &Error{Status: StatusInternal}
)

// DType is a flashattn_dtype_t.
type DType int

const (
	FP16    DType = C.FLASHATTN_DTYPE_FP16
	BF16    DType = C.FLASHATTN_DTYPE_BF16
	FP32    DType = C.FLASHATTN_DTYPE_FP32
	FP8E4M3 DType = C.FLASHATTN_DTYPE_FP8_E4M3
)

// Backend is a flashattn_backend_t.
type Backend int

const (
	BackendAuto Backend = C.FLASHATTN_BACKEND_AUTO
	BackendCPU  Backend = C.FLASHATTN_BACKEND_CPU
	BackendFA1  Backend = C.FLASHATTN_BACKEND_FA1
	BackendFA2  Backend = C.FLASHATTN_BACKEND_FA2
	BackendFA3  Backend = C.FLASHATTN_BACKEND_FA3
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendCPU:
		return "cpu"
	case BackendFA1:
		return "fa1"
	case BackendFA2:
		return "fa2"
	case BackendFA3:
		return "fa3"
	}
	return fmt.Sprintf("backend(%d)", int(b))
}

// I64Param is a flashattn_i64_param_t.
type I64Param int

const (
	Batch        I64Param = C.FLASHATTN_I64_BATCH
	SeqlenQ      I64Param = C.FLASHATTN_I64_SEQLEN_Q
	SeqlenK      I64Param = C.FLASHATTN_I64_SEQLEN_K
	HeadsQ       I64Param = C.FLASHATTN_I64_HEADS_Q
	HeadsKV      I64Param = C.FLASHATTN_I64_HEADS_KV
	HeadDim      I64Param = C.FLASHATTN_I64_HEAD_DIM
	HeadDimV     I64Param = C.FLASHATTN_I64_HEAD_DIM_V
	Dtype        I64Param = C.FLASHATTN_I64_DTYPE
	Causal       I64Param = C.FLASHATTN_I64_CAUSAL
	WindowLeft   I64Param = C.FLASHATTN_I64_WINDOW_LEFT
	WindowRight  I64Param = C.FLASHATTN_I64_WINDOW_RIGHT
	BackendParam I64Param = C.FLASHATTN_I64_BACKEND
	Device       I64Param = C.FLASHATTN_I64_DEVICE
	Varlen       I64Param = C.FLASHATTN_I64_VARLEN
	TotalQ       I64Param = C.FLASHATTN_I64_TOTAL_Q
	TotalK       I64Param = C.FLASHATTN_I64_TOTAL_K
	QBatchStride I64Param = C.FLASHATTN_I64_Q_BATCH_STRIDE
	QRowStride   I64Param = C.FLASHATTN_I64_Q_ROW_STRIDE
	QHeadStride  I64Param = C.FLASHATTN_I64_Q_HEAD_STRIDE
	KBatchStride I64Param = C.FLASHATTN_I64_K_BATCH_STRIDE
	KRowStride   I64Param = C.FLASHATTN_I64_K_ROW_STRIDE
	KHeadStride  I64Param = C.FLASHATTN_I64_K_HEAD_STRIDE
	VBatchStride I64Param = C.FLASHATTN_I64_V_BATCH_STRIDE
	VRowStride   I64Param = C.FLASHATTN_I64_V_ROW_STRIDE
	VHeadStride  I64Param = C.FLASHATTN_I64_V_HEAD_STRIDE
	OBatchStride I64Param = C.FLASHATTN_I64_O_BATCH_STRIDE
	ORowStride   I64Param = C.FLASHATTN_I64_O_ROW_STRIDE
	OHeadStride  I64Param = C.FLASHATTN_I64_O_HEAD_STRIDE
	// Backward pass (since 0.2): 1 = bitwise-reproducible gradients; strides of dO, dQ, dK, dV.
	Deterministic I64Param = C.FLASHATTN_I64_DETERMINISTIC
	DOBatchStride I64Param = C.FLASHATTN_I64_DO_BATCH_STRIDE
	DORowStride   I64Param = C.FLASHATTN_I64_DO_ROW_STRIDE
	DOHeadStride  I64Param = C.FLASHATTN_I64_DO_HEAD_STRIDE
	DQBatchStride I64Param = C.FLASHATTN_I64_DQ_BATCH_STRIDE
	DQRowStride   I64Param = C.FLASHATTN_I64_DQ_ROW_STRIDE
	DQHeadStride  I64Param = C.FLASHATTN_I64_DQ_HEAD_STRIDE
	DKBatchStride I64Param = C.FLASHATTN_I64_DK_BATCH_STRIDE
	DKRowStride   I64Param = C.FLASHATTN_I64_DK_ROW_STRIDE
	DKHeadStride  I64Param = C.FLASHATTN_I64_DK_HEAD_STRIDE
	DVBatchStride I64Param = C.FLASHATTN_I64_DV_BATCH_STRIDE
	DVRowStride   I64Param = C.FLASHATTN_I64_DV_ROW_STRIDE
	DVHeadStride  I64Param = C.FLASHATTN_I64_DV_HEAD_STRIDE
	// Serving (since 0.3): paged K/V caches, seqused_k, appending rows with a rotary embedding.
	PagedKV             I64Param = C.FLASHATTN_I64_PAGED_KV
	PageSize            I64Param = C.FLASHATTN_I64_PAGE_SIZE
	NumPages            I64Param = C.FLASHATTN_I64_NUM_PAGES
	MaxPagesPerSequence I64Param = C.FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE
	PageTableStride     I64Param = C.FLASHATTN_I64_PAGE_TABLE_STRIDE
	SequsedK            I64Param = C.FLASHATTN_I64_SEQUSED_K
	NewKVRows           I64Param = C.FLASHATTN_I64_NEW_KV_ROWS
	KNewBatchStride     I64Param = C.FLASHATTN_I64_K_NEW_BATCH_STRIDE
	KNewRowStride       I64Param = C.FLASHATTN_I64_K_NEW_ROW_STRIDE
	KNewHeadStride      I64Param = C.FLASHATTN_I64_K_NEW_HEAD_STRIDE
	VNewBatchStride     I64Param = C.FLASHATTN_I64_V_NEW_BATCH_STRIDE
	VNewRowStride       I64Param = C.FLASHATTN_I64_V_NEW_ROW_STRIDE
	VNewHeadStride      I64Param = C.FLASHATTN_I64_V_NEW_HEAD_STRIDE
	RotaryDim           I64Param = C.FLASHATTN_I64_ROTARY_DIM
	RotaryInterleaved   I64Param = C.FLASHATTN_I64_ROTARY_INTERLEAVED
	// Attention variants (since 0.3): a MaskAlign value, sink tokens, and 0/1 switches for the
	// per-head sink logits and ALiBi slopes passed in Tensors (SinkLogits, AlibiSlopes).
	MaskAlignParam I64Param = C.FLASHATTN_I64_MASK_ALIGN
	SinkTokens     I64Param = C.FLASHATTN_I64_SINK_TOKENS
	SinkLogits     I64Param = C.FLASHATTN_I64_SINK_LOGITS
	Alibi          I64Param = C.FLASHATTN_I64_ALIBI
	// FP8 inputs (since 0.3): O's dtype (a DType: BF16 by default for FP8 plans, or FP16) and the
	// layout of the float32 descale arrays in Tensors (DescaleQ, DescaleK, DescaleV), in elements
	// per sequence and per key/value head (both 0: one value per tensor).
	OutputDType        I64Param = C.FLASHATTN_I64_OUTPUT_DTYPE
	DescaleBatchStride I64Param = C.FLASHATTN_I64_DESCALE_BATCH_STRIDE
	DescaleHeadStride  I64Param = C.FLASHATTN_I64_DESCALE_HEAD_STRIDE
	// Split-KV parts (since 0.3): 0 = auto (default) to 128; after Finalize, the number the plan
	// runs (1 on backends without split-KV).
	NumSplits I64Param = C.FLASHATTN_I64_NUM_SPLITS
)

// MaskAlign is a flashattn_mask_align_t (since 0.3): where query i's diagonal key lies.
type MaskAlign int

const (
	// MaskAlignBottomRight: key i + seqlen_k - seqlen_q (the default, FlashAttention's).
	MaskAlignBottomRight MaskAlign = C.FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT
	// MaskAlignTopLeft: key i (PyTorch's is_causal).
	MaskAlignTopLeft MaskAlign = C.FLASHATTN_MASK_ALIGN_TOP_LEFT
)

// MaxMergePartials is FLASHATTN_MAX_MERGE_PARTIALS: the most partial states one merge takes.
const MaxMergePartials = C.FLASHATTN_MAX_MERGE_PARTIALS

// Tensors are the pointers of ExecuteArgs and BackwardArgs, one per flashattn_arg_t; nil ones are
// not passed.
// Host memory for the CPU backend, CUDA device memory for GPU backends. With NewKVRows > 0, K
// and V are the caches and are written at each sequence's SequsedK; SequsedK is never written
// (advance it by NewKVRows after the call).
type Tensors struct {
	Q, K, V, O, LSE        unsafe.Pointer
	CuSeqlensQ, CuSeqlensK unsafe.Pointer // int32 [batch+1]
	PageTable, SequsedK    unsafe.Pointer // int32 [batch, max pages per sequence], int32 [batch]
	KNew, VNew             unsafe.Pointer // [batch, new_kv_rows, heads_kv, dim]
	RotaryCos, RotarySin   unsafe.Pointer // float32 [seqlen_k, rotary_dim/2]
	// Attention variants (since 0.3): float32 [heads_q] each; DSinkLogits is a backward output.
	SinkLogits, AlibiSlopes, DSinkLogits unsafe.Pointer
	// BackwardArgs only: dO (layout of O) in, dQ, dK, dV out.
	DOut, DQ, DK, DV unsafe.Pointer
	// FP8 plans (since 0.3): float32 descale factors of Q, K, V per (sequence, key/value head),
	// laid out by DescaleBatchStride and DescaleHeadStride. Required for FP8 plans.
	DescaleQ, DescaleK, DescaleV unsafe.Pointer
}

// F64Param is a flashattn_f64_param_t.
type F64Param int

const (
	SoftmaxScale F64Param = C.FLASHATTN_F64_SOFTMAX_SCALE
	Softcap      F64Param = C.FLASHATTN_F64_SOFTCAP
)

// Float16 is an IEEE binary16 value stored as its bits.
type Float16 uint16

// BFloat16 is a bfloat16 value stored as its bits.
type BFloat16 uint16

// Element is a host element type.
type Element interface {
	float32 | Float16 | BFloat16
}

// call runs one C call and reads the thread-local error message on the same OS thread.
func call(op string, f func() C.flashattn_status_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := Status(f())
	if s == StatusSuccess {
		return nil
	}
	return &Error{Status: s, Message: lastError(), Op: op}
}

func lastError() string {
	n := C.flashattn_last_error_copy(nil, 0)
	buf := make([]byte, int(n)+1)
	C.flashattn_last_error_copy((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return string(buf[:n])
}

// Version is the run-time version (major, minor, patch).
func Version() (int, int, int) {
	v := int(C.flashattn_version())
	return v / 10000, v / 100 % 100, v % 100
}

// VersionString is "major.minor.patch".
func VersionString() string { return C.GoString(C.flashattn_version_string()) }

// BuildInfo is "cuda=...;archs=...;backends=...".
func BuildInfo() string { return C.GoString(C.flashattn_build_info()) }

// DeviceCount is the number of usable CUDA devices (0 without a GPU or driver).
func DeviceCount() (int, error) {
	var n C.int32_t
	err := call("flashattn_device_count", func() C.flashattn_status_t { return C.flashattn_device_count(&n) })
	return int(n), err
}

// DeviceComputeCapability is the (major, minor) compute capability of a CUDA device.
func DeviceComputeCapability(device int) (int, int, error) {
	var major, minor C.int32_t
	err := call("flashattn_device_compute_capability", func() C.flashattn_status_t {
		return C.flashattn_device_compute_capability(C.int32_t(device), &major, &minor)
	})
	return int(major), int(minor), err
}

// Plan owns a flashattn_plan_t. Setters, Finalize and Close change it: one goroutine at a time.
// A finalized plan may be executed from many goroutines at once, each with its own Workspace.
type Plan struct {
	p *C.flashattn_plan_t
}

// NewPlan creates an empty plan. Close it when done; otherwise a finalizer destroys it.
func NewPlan() (*Plan, error) {
	var raw *C.flashattn_plan_t
	if err := call("flashattn_plan_create", func() C.flashattn_status_t { return C.flashattn_plan_create(&raw) }); err != nil {
		return nil, err
	}
	plan := &Plan{p: raw}
	runtime.SetFinalizer(plan, (*Plan).Close)
	return plan, nil
}

// Close destroys the C plan. Closing twice, or a nil plan, does nothing.
func (p *Plan) Close() {
	if p == nil || p.p == nil {
		return
	}
	C.flashattn_plan_destroy(p.p)
	p.p = nil
	runtime.SetFinalizer(p, nil)
}

// Handle is the plan's flashattn_plan_t * for C code and companion packages (bindings/go/cp);
// nil once closed. The Plan must stay reachable (runtime.KeepAlive) while the handle is in use.
func (p *Plan) Handle() unsafe.Pointer {
	if p == nil {
		return nil
	}
	return unsafe.Pointer(p.p)
}

func (p *Plan) handle(op string) (*C.flashattn_plan_t, error) {
	if p == nil || p.p == nil {
		return nil, &Error{Status: StatusInvalidArgument, Message: "the plan is closed", Op: op}
	}
	return p.p, nil
}

// SetI64 sets an integer parameter (a finalized plan goes back to unfinalized).
func (p *Plan) SetI64(key I64Param, value int64) error {
	h, err := p.handle("SetI64")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_set_i64", func() C.flashattn_status_t {
		return C.flashattn_plan_set_i64(h, C.flashattn_i64_param_t(key), C.int64_t(value))
	})
}

// SetF64 sets a floating-point parameter.
func (p *Plan) SetF64(key F64Param, value float64) error {
	h, err := p.handle("SetF64")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_set_f64", func() C.flashattn_status_t {
		return C.flashattn_plan_set_f64(h, C.flashattn_f64_param_t(key), C.double(value))
	})
}

// GetI64 reads an integer parameter (the resolved value once finalized).
func (p *Plan) GetI64(key I64Param) (int64, error) {
	h, err := p.handle("GetI64")
	if err != nil {
		return 0, err
	}
	defer runtime.KeepAlive(p)
	var v C.int64_t
	err = call("flashattn_plan_get_i64", func() C.flashattn_status_t {
		return C.flashattn_plan_get_i64(h, C.flashattn_i64_param_t(key), &v)
	})
	return int64(v), err
}

// GetF64 reads a floating-point parameter.
func (p *Plan) GetF64(key F64Param) (float64, error) {
	h, err := p.handle("GetF64")
	if err != nil {
		return 0, err
	}
	defer runtime.KeepAlive(p)
	var v C.double
	err = call("flashattn_plan_get_f64", func() C.flashattn_status_t {
		return C.flashattn_plan_get_f64(h, C.flashattn_f64_param_t(key), &v)
	})
	return float64(v), err
}

// Finalize checks the problem, chooses the backend and fixes the workspace size.
func (p *Plan) Finalize() error {
	h, err := p.handle("Finalize")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_finalize", func() C.flashattn_status_t { return C.flashattn_plan_finalize(h) })
}

// Backend is the backend a finalized plan runs and why it was chosen.
func (p *Plan) Backend() (Backend, string, error) {
	return p.readBackend("Backend", "flashattn_plan_get_backend",
		func(h *C.flashattn_plan_t, b *C.flashattn_backend_t, reason **C.char) C.flashattn_status_t {
			return C.flashattn_plan_get_backend(h, b, reason)
		})
}

// WorkspaceSize is the bytes of workspace each execute of a finalized plan needs.
func (p *Plan) WorkspaceSize() (int, error) {
	return p.readSize("WorkspaceSize", "flashattn_plan_get_workspace_size",
		func(h *C.flashattn_plan_t, n *C.size_t) C.flashattn_status_t {
			return C.flashattn_plan_get_workspace_size(h, n)
		})
}

// readBackend is Backend or BackwardBackend: get is the C getter (named cname) of that pass.
func (p *Plan) readBackend(method, cname string,
	get func(*C.flashattn_plan_t, *C.flashattn_backend_t, **C.char) C.flashattn_status_t) (Backend, string, error) {
	h, err := p.handle(method)
	if err != nil {
		return 0, "", err
	}
	defer runtime.KeepAlive(p)
	var b C.flashattn_backend_t
	var reason *C.char
	if err := call(cname, func() C.flashattn_status_t { return get(h, &b, &reason) }); err != nil {
		return 0, "", err
	}
	return Backend(b), C.GoString(reason), nil
}

// readSize is WorkspaceSize or BackwardWorkspaceSize: get is the C getter (named cname) of that pass.
func (p *Plan) readSize(method, cname string, get func(*C.flashattn_plan_t, *C.size_t) C.flashattn_status_t) (int, error) {
	h, err := p.handle(method)
	if err != nil {
		return 0, err
	}
	defer runtime.KeepAlive(p)
	var n C.size_t
	err = call(cname, func() C.flashattn_status_t { return get(h, &n) })
	return int(n), err
}

// Workspace is host scratch memory aligned to 256 bytes, for the CPU backend.
type Workspace struct {
	buf  []byte
	off  int
	size int
}

// NewWorkspace allocates a host workspace of at least bytes bytes.
func NewWorkspace(bytes int) *Workspace {
	if bytes <= 0 {
		return &Workspace{}
	}
	buf := make([]byte, bytes+256)
	off := int((256 - uintptr(unsafe.Pointer(&buf[0]))%256) % 256)
	return &Workspace{buf: buf, off: off, size: bytes}
}

// Len is the usable size in bytes.
func (w *Workspace) Len() int { return w.size }

func (w *Workspace) ptr() unsafe.Pointer {
	if w == nil || w.size == 0 {
		return nil
	}
	return unsafe.Pointer(&w.buf[w.off])
}

// Extents are the elements each tensor of a finalized plan spans (host slices must hold them).
type Extents struct {
	Q, K, V, O, LSE int
	CuSeqlens       int // entries of each cu_seqlens array for a variable-length plan, else 0
	DType           DType
	// Backward: dO (layout of O), dQ, dK, dV (layouts of Q, K, V) with their own strides.
	DOut, DQ, DK, DV int
}

// Extents computes the spans from the finalized plan's resolved sizes and strides.
func (p *Plan) Extents() (Extents, error) {
	if _, err := p.WorkspaceSize(); err != nil { // INVALID_STATE when not finalized
		return Extents{}, err
	}
	var firstErr error
	g := func(k I64Param) int64 {
		v, err := p.GetI64(k)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return v
	}
	varlen := g(Varlen) == 1
	batch := g(Batch)
	rowsQ, rowsK := g(SeqlenQ), g(SeqlenK)
	if varlen {
		rowsQ, rowsK = g(TotalQ), g(TotalK)
	}
	hq, hkv, d, dv := g(HeadsQ), g(HeadsKV), g(HeadDim), g(HeadDimV)
	span := func(rows, heads, dim int64, bs, rs, hs I64Param) int {
		if rows == 0 {
			return 0
		}
		end := dim + (rows-1)*g(rs) + (heads-1)*g(hs)
		if !varlen {
			end += (batch - 1) * g(bs)
		}
		return int(end)
	}
	e := Extents{
		Q:     span(rowsQ, hq, d, QBatchStride, QRowStride, QHeadStride),
		K:     span(rowsK, hkv, d, KBatchStride, KRowStride, KHeadStride),
		V:     span(rowsK, hkv, dv, VBatchStride, VRowStride, VHeadStride),
		O:     span(rowsQ, hq, dv, OBatchStride, ORowStride, OHeadStride),
		DType: DType(g(Dtype)),
		DOut:  span(rowsQ, hq, dv, DOBatchStride, DORowStride, DOHeadStride),
		DQ:    span(rowsQ, hq, d, DQBatchStride, DQRowStride, DQHeadStride),
		DK:    span(rowsK, hkv, d, DKBatchStride, DKRowStride, DKHeadStride),
		DV:    span(rowsK, hkv, dv, DVBatchStride, DVRowStride, DVHeadStride),
	}
	if varlen {
		e.LSE = int(hq * rowsQ)
		e.CuSeqlens = int(batch + 1)
	} else {
		e.LSE = int(batch * hq * rowsQ)
	}
	return e, firstErr
}

// hostSlice: pointer, length and dtype of a []float32, []Float16 or []BFloat16.
func hostSlice(op, name string, x interface{}) (unsafe.Pointer, int, DType, error) {
	var ptr unsafe.Pointer
	var n int
	var dt DType
	switch s := x.(type) {
	case []float32:
		n, dt = len(s), FP32
		if n > 0 {
			ptr = unsafe.Pointer(&s[0])
		}
	case []Float16:
		n, dt = len(s), FP16
		if n > 0 {
			ptr = unsafe.Pointer(&s[0])
		}
	case []BFloat16:
		n, dt = len(s), BF16
		if n > 0 {
			ptr = unsafe.Pointer(&s[0])
		}
	default:
		return nil, 0, 0, &Error{Status: StatusInvalidArgument, Op: op,
			Message: fmt.Sprintf("%s: %T is not a []float32, []Float16 or []BFloat16", name, x)}
	}
	return ptr, n, dt, nil
}

// hostArgs are the C pointers of the host slices one Execute or Backward call passes (nil where
// the call has no such tensor).
type hostArgs struct {
	q, k, v, o, dout, lse, dq, dk, dv, cuQ, cuK unsafe.Pointer
}

// checkHost checks host slices against a finalized plan whose pass (the backward when backward,
// else the forward) runs on the CPU backend, and returns their pointers. tensors are q, k, v, o
// and, for the backward, dout, dq, dk, dv; the forward's lse may be nil (not written).
func (p *Plan) checkHost(op string, backward bool, tensors []interface{}, lse []float32, cuQ, cuK []int32,
	varlen bool) (hostArgs, error) {
	var a hostArgs
	e, err := p.Extents()
	if err != nil {
		return a, err
	}
	backendOf, runs, raw := p.Backend, "this plan runs", "ExecuteRaw"
	if backward {
		backendOf, runs, raw = p.BackwardBackend, "this plan's backward runs", "BackwardRaw"
	}
	b, _, err := backendOf()
	if err != nil {
		return a, err
	}
	if b != BackendCPU {
		return a, &Error{Status: StatusInvalidArgument, Op: op,
			Message: fmt.Sprintf("host slices need the CPU backend; %s %s (use %s with device memory)", runs, b, raw)}
	}
	type check struct {
		name string
		have int
		need int
	}
	var checks []check
	slots := []struct {
		name string
		dst  *unsafe.Pointer
		need int
	}{{"q", &a.q, e.Q}, {"k", &a.k, e.K}, {"v", &a.v, e.V}, {"o", &a.o, e.O}, {"dout", &a.dout, e.DOut},
		{"dq", &a.dq, e.DQ}, {"dk", &a.dk, e.DK}, {"dv", &a.dv, e.DV}}
	for i, x := range tensors {
		t := slots[i]
		ptr, n, dt, err := hostSlice(op, t.name, x)
		if err != nil {
			return a, err
		}
		if dt != e.DType {
			return a, &Error{Status: StatusInvalidArgument, Op: op,
				Message: fmt.Sprintf("%s: %T elements, but the plan's dtype is %d", t.name, x, int(e.DType))}
		}
		*t.dst = ptr
		checks = append(checks, check{t.name, n, t.need})
	}
	if lse != nil || backward {
		checks = append(checks, check{"lse", len(lse), e.LSE})
		if len(lse) > 0 {
			a.lse = unsafe.Pointer(&lse[0])
		}
	}
	if varlen {
		checks = append(checks, check{"cuSeqlensQ", len(cuQ), e.CuSeqlens}, check{"cuSeqlensK", len(cuK), e.CuSeqlens})
		if len(cuQ) > 0 {
			a.cuQ = unsafe.Pointer(&cuQ[0])
		}
		if len(cuK) > 0 {
			a.cuK = unsafe.Pointer(&cuK[0])
		}
	}
	for _, c := range checks {
		if c.have < c.need {
			return a, &Error{Status: StatusInvalidArgument, Op: op,
				Message: fmt.Sprintf("%s: the slice holds %d elements, the plan needs %d", c.name, c.have, c.need)}
		}
	}
	return a, nil
}

// runHost checks host slices (see checkHost), allocates the pass's workspace for this call when ws
// is nil, and runs raw on their pointers, keeping the slices alive until it returns.
func (p *Plan) runHost(op string, backward bool, tensors []interface{}, lse []float32, cuQ, cuK []int32, varlen bool,
	ws *Workspace, raw func(a hostArgs, ws *Workspace) error) error {
	a, err := p.checkHost(op, backward, tensors, lse, cuQ, cuK, varlen)
	if err != nil {
		return err
	}
	if ws == nil {
		size := p.WorkspaceSize
		if backward {
			size = p.BackwardWorkspaceSize
		}
		n, err := size()
		if err != nil {
			return err
		}
		ws = NewWorkspace(n)
	}
	err = raw(a, ws)
	runtime.KeepAlive(tensors)
	runtime.KeepAlive(lse)
	runtime.KeepAlive(cuQ)
	runtime.KeepAlive(cuK)
	runtime.KeepAlive(ws)
	return err
}

// Execute runs a finalized fixed-length plan on host slices (CPU backend): q, k, v, o are
// []float32, []Float16 or []BFloat16 laid out as the plan's strides say; lse (nil to skip)
// receives [batch, heads_q, seqlen_q] values; ws nil allocates a workspace for this call.
func (p *Plan) Execute(q, k, v, o interface{}, lse []float32, ws *Workspace) error {
	return p.runHost("Execute", false, []interface{}{q, k, v, o}, lse, nil, nil, false, ws,
		func(a hostArgs, ws *Workspace) error {
			return p.ExecuteRaw(a.q, a.k, a.v, a.o, a.lse, ws.ptr(), uintptr(ws.Len()), nil)
		})
}

// ExecuteVarlen runs a finalized variable-length plan on packed host slices ([total, heads,
// dim]) with int32 prefix sums of batch+1 entries; lse is [heads_q, total_q].
func (p *Plan) ExecuteVarlen(q, k, v, o interface{}, lse []float32, cuSeqlensQ, cuSeqlensK []int32, ws *Workspace) error {
	return p.runHost("ExecuteVarlen", false, []interface{}{q, k, v, o}, lse, cuSeqlensQ, cuSeqlensK, true, ws,
		func(a hostArgs, ws *Workspace) error {
			return p.ExecuteVarlenRaw(a.q, a.k, a.v, a.o, a.lse, a.cuQ, a.cuK, ws.ptr(), uintptr(ws.Len()), nil)
		})
}

// ExecuteRaw is flashattn_plan_execute with raw pointers: CUDA device memory and a cudaStream_t
// (nil: the legacy default stream) for GPU backends, host memory for the CPU backend. Nothing is
// checked on the Go side: the pointers must match the plan's shapes, strides and dtype. Pointers
// into Go memory must not hold Go pointers (cgo rules) and device memory must stay alive until the
// stream has run the work.
func (p *Plan) ExecuteRaw(q, k, v, o, lse, workspace unsafe.Pointer, workspaceBytes uintptr, stream unsafe.Pointer) error {
	h, err := p.handle("ExecuteRaw")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_execute", func() C.flashattn_status_t {
		return C.flashattn_plan_execute(h, q, k, v, o, (*C.float)(lse), workspace, C.size_t(workspaceBytes),
			C.flashattn_stream_t(stream))
	})
}

// ExecuteVarlenRaw is flashattn_plan_execute_varlen with raw pointers (see ExecuteRaw).
func (p *Plan) ExecuteVarlenRaw(q, k, v, o, lse, cuSeqlensQ, cuSeqlensK, workspace unsafe.Pointer,
	workspaceBytes uintptr, stream unsafe.Pointer) error {
	h, err := p.handle("ExecuteVarlenRaw")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_execute_varlen", func() C.flashattn_status_t {
		return C.flashattn_plan_execute_varlen(h, q, k, v, o, (*C.float)(lse), (*C.int32_t)(cuSeqlensQ),
			(*C.int32_t)(cuSeqlensK), workspace, C.size_t(workspaceBytes), C.flashattn_stream_t(stream))
	})
}

// ExecuteArgs is flashattn_plan_execute_args: the call for paged K/V caches, seqused_k and
// appending K/V rows with a rotary embedding, and for the sink logits and ALiBi slopes of the
// attention variants (any finalized plan may use it). Nothing is checked on the Go side (see
// ExecuteRaw for the pointer rules); the library checks which pointers the plan needs, overlaps,
// and on the CPU backend the page table, seqused_k and rotary positions.
func (p *Plan) ExecuteArgs(t *Tensors, workspace unsafe.Pointer, workspaceBytes uintptr, stream unsafe.Pointer) error {
	return p.runArgs("ExecuteArgs", "flashattn_plan_execute_args", 0, t, workspace, workspaceBytes, stream)
}

// BackwardArgs is flashattn_plan_execute_backward_args (since 0.3): the backward pass with the
// tensors of t (Q, K, V, O, LSE, DOut, DQ, DK, DV, the cu_seqlens of a varlen plan, and the
// variant arrays the plan uses with DSinkLogits). See ExecuteRaw for the pointer rules.
func (p *Plan) BackwardArgs(t *Tensors, workspace unsafe.Pointer, workspaceBytes uintptr, stream unsafe.Pointer) error {
	return p.runArgs("BackwardArgs", "flashattn_plan_execute_backward_args", 1, t, workspace, workspaceBytes, stream)
}

func (p *Plan) runArgs(op, cname string, backward C.int, t *Tensors, workspace unsafe.Pointer, workspaceBytes uintptr,
	stream unsafe.Pointer) error {
	h, err := p.handle(op)
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call(cname, func() C.flashattn_status_t {
		return C.goflashattn_run_args(backward, h, t.Q, t.K, t.V, t.O, t.LSE, t.CuSeqlensQ, t.CuSeqlensK, t.PageTable,
			t.SequsedK, t.KNew, t.VNew, t.RotaryCos, t.RotarySin, t.SinkLogits, t.AlibiSlopes, t.DSinkLogits,
			t.DOut, t.DQ, t.DK, t.DV, t.DescaleQ, t.DescaleK, t.DescaleV, workspace, C.size_t(workspaceBytes),
			C.flashattn_stream_t(stream))
	})
}

// BackwardBackend is the backend that runs a finalized plan's backward pass (it may differ from
// the forward's) and why; StatusNotSupported with the reason when none can.
func (p *Plan) BackwardBackend() (Backend, string, error) {
	return p.readBackend("BackwardBackend", "flashattn_plan_get_backward_backend",
		func(h *C.flashattn_plan_t, b *C.flashattn_backend_t, reason **C.char) C.flashattn_status_t {
			return C.flashattn_plan_get_backward_backend(h, b, reason)
		})
}

// BackwardWorkspaceSize is the bytes of workspace each backward execute of a finalized plan needs
// (separate from the forward's WorkspaceSize).
func (p *Plan) BackwardWorkspaceSize() (int, error) {
	return p.readSize("BackwardWorkspaceSize", "flashattn_plan_get_backward_workspace_size",
		func(h *C.flashattn_plan_t, n *C.size_t) C.flashattn_status_t {
			return C.flashattn_plan_get_backward_workspace_size(h, n)
		})
}

// Backward runs the backward pass of a finalized fixed-length plan on host slices (CPU backend):
// from the forward's q, k, v, o, its lse [batch, heads_q, seqlen_q] and dout (the gradient of the
// loss with respect to O, layout of O with the DO* strides) it writes dq, dk, dv (layouts of Q, K,
// V with the DQ*, DK*, DV* strides). Slices are []float32, []Float16 or []BFloat16 of the plan's
// dtype; ws nil allocates BackwardWorkspaceSize bytes for this call.
func (p *Plan) Backward(q, k, v, o, dout interface{}, lse []float32, dq, dk, dv interface{}, ws *Workspace) error {
	return p.runHost("Backward", true, []interface{}{q, k, v, o, dout, dq, dk, dv}, lse, nil, nil, false, ws,
		func(a hostArgs, ws *Workspace) error {
			return p.BackwardRaw(a.q, a.k, a.v, a.o, a.dout, a.lse, a.dq, a.dk, a.dv, ws.ptr(), uintptr(ws.Len()), nil)
		})
}

// BackwardVarlen runs the backward pass of a finalized variable-length plan on packed host slices
// ([total, heads, dim]); lse is [heads_q, total_q], cuSeqlensQ/K int32 prefix sums of batch+1 entries.
func (p *Plan) BackwardVarlen(q, k, v, o, dout interface{}, lse []float32, dq, dk, dv interface{},
	cuSeqlensQ, cuSeqlensK []int32, ws *Workspace) error {
	return p.runHost("BackwardVarlen", true, []interface{}{q, k, v, o, dout, dq, dk, dv}, lse, cuSeqlensQ, cuSeqlensK,
		true, ws, func(a hostArgs, ws *Workspace) error {
			return p.BackwardVarlenRaw(a.q, a.k, a.v, a.o, a.dout, a.lse, a.dq, a.dk, a.dv, a.cuQ, a.cuK, ws.ptr(),
				uintptr(ws.Len()), nil)
		})
}

// BackwardRaw is flashattn_plan_execute_backward with raw pointers (see ExecuteRaw): dq, dk, dv
// must not overlap each other or any input.
func (p *Plan) BackwardRaw(q, k, v, o, dout, lse, dq, dk, dv, workspace unsafe.Pointer, workspaceBytes uintptr,
	stream unsafe.Pointer) error {
	h, err := p.handle("BackwardRaw")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_execute_backward", func() C.flashattn_status_t {
		return C.flashattn_plan_execute_backward(h, q, k, v, o, dout, (*C.float)(lse), dq, dk, dv, workspace,
			C.size_t(workspaceBytes), C.flashattn_stream_t(stream))
	})
}

// BackwardVarlenRaw is flashattn_plan_execute_backward_varlen with raw pointers (see ExecuteRaw).
func (p *Plan) BackwardVarlenRaw(q, k, v, o, dout, lse, dq, dk, dv, cuSeqlensQ, cuSeqlensK, workspace unsafe.Pointer,
	workspaceBytes uintptr, stream unsafe.Pointer) error {
	h, err := p.handle("BackwardVarlenRaw")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	return call("flashattn_plan_execute_backward_varlen", func() C.flashattn_status_t {
		return C.flashattn_plan_execute_backward_varlen(h, q, k, v, o, dout, (*C.float)(lse), dq, dk, dv,
			(*C.int32_t)(cuSeqlensQ), (*C.int32_t)(cuSeqlensK), workspace, C.size_t(workspaceBytes),
			C.flashattn_stream_t(stream))
	})
}

// Variants are the per-head float32 arrays of the attention variants for the host calls below
// (nil when the plan does not use them); DSinkLogits (backward) receives the sinks' gradient.
type Variants struct {
	SinkLogits, AlibiSlopes, DSinkLogits []float32
}

// pointers checks the arrays' lengths against the plan's query heads and returns their addresses.
func (x Variants) pointers(p *Plan, op string) ([3]unsafe.Pointer, error) {
	var r [3]unsafe.Pointer
	heads, err := p.GetI64(HeadsQ)
	if err != nil {
		return r, err
	}
	for i, a := range []struct {
		name string
		s    []float32
	}{{"SinkLogits", x.SinkLogits}, {"AlibiSlopes", x.AlibiSlopes}, {"DSinkLogits", x.DSinkLogits}} {
		if a.s == nil {
			continue
		}
		if int64(len(a.s)) < heads {
			return r, &Error{Status: StatusInvalidArgument, Op: op,
				Message: fmt.Sprintf("%s: the slice holds %d values, the plan has %d query heads", a.name, len(a.s), heads)}
		}
		r[i] = unsafe.Pointer(&a.s[0])
	}
	return r, nil
}

// ExecuteVariants runs a finalized plan on host slices (CPU backend) through an argument set with
// the per-head arrays the plan's SinkLogits / Alibi keys ask for; cuSeqlensQ/K nil for a
// fixed-length plan.
func (p *Plan) ExecuteVariants(q, k, v, o interface{}, lse []float32, cuSeqlensQ, cuSeqlensK []int32, x Variants,
	ws *Workspace) error {
	xp, err := x.pointers(p, "ExecuteVariants")
	if err != nil {
		return err
	}
	varlen := cuSeqlensQ != nil || cuSeqlensK != nil
	err = p.runHost("ExecuteVariants", false, []interface{}{q, k, v, o}, lse, cuSeqlensQ, cuSeqlensK, varlen, ws,
		func(h hostArgs, ws *Workspace) error {
			t := Tensors{Q: h.q, K: h.k, V: h.v, O: h.o, LSE: h.lse, CuSeqlensQ: h.cuQ, CuSeqlensK: h.cuK,
				SinkLogits: xp[0], AlibiSlopes: xp[1]}
			return p.ExecuteArgs(&t, ws.ptr(), uintptr(ws.Len()), nil)
		})
	runtime.KeepAlive(x)
	return err
}

// BackwardVariants runs the backward pass on host slices (CPU backend) through an argument set
// with the variant arrays; with sink logits, x.DSinkLogits receives their gradient.
func (p *Plan) BackwardVariants(q, k, v, o, dout interface{}, lse []float32, dq, dk, dv interface{},
	cuSeqlensQ, cuSeqlensK []int32, x Variants, ws *Workspace) error {
	xp, err := x.pointers(p, "BackwardVariants")
	if err != nil {
		return err
	}
	varlen := cuSeqlensQ != nil || cuSeqlensK != nil
	err = p.runHost("BackwardVariants", true, []interface{}{q, k, v, o, dout, dq, dk, dv}, lse, cuSeqlensQ, cuSeqlensK,
		varlen, ws, func(h hostArgs, ws *Workspace) error {
			t := Tensors{Q: h.q, K: h.k, V: h.v, O: h.o, LSE: h.lse, CuSeqlensQ: h.cuQ, CuSeqlensK: h.cuK,
				SinkLogits: xp[0], AlibiSlopes: xp[1], DSinkLogits: xp[2], DOut: h.dout, DQ: h.dq, DK: h.dk, DV: h.dv}
			return p.BackwardArgs(&t, ws.ptr(), uintptr(ws.Len()), nil)
		})
	runtime.KeepAlive(x)
	return err
}

// MergeStates merges partial attention states on host slices (CPU backend): partialO[s] is a
// []float32 (or a slice of the plan's dtype) laid out as the plan's O, partialLSE[s] its LSE laid
// out as the plan's; o (the plan's dtype) and lse (nil to skip) receive the merged state.
func (p *Plan) MergeStates(partialO []interface{}, partialLSE [][]float32, o interface{}, lse []float32) error {
	const op = "MergeStates"
	if len(partialO) != len(partialLSE) || len(partialO) == 0 {
		return &Error{Status: StatusInvalidArgument, Op: op,
			Message: fmt.Sprintf("partialO and partialLSE: %d and %d entries (at least 1, equal)", len(partialO), len(partialLSE))}
	}
	e, err := p.Extents()
	if err != nil {
		return err
	}
	if b, _, err := p.Backend(); err != nil || b != BackendCPU {
		if err != nil {
			return err
		}
		return &Error{Status: StatusInvalidArgument, Op: op,
			Message: fmt.Sprintf("host slices need the CPU backend; this plan runs %s (use MergeStatesRaw)", b)}
	}
	oPtr, oLen, oType, err := hostSlice(op, "o", o)
	if err != nil {
		return err
	}
	if oType != e.DType || oLen < e.O || (lse != nil && len(lse) < e.LSE) {
		return &Error{Status: StatusInvalidArgument, Op: op,
			Message: fmt.Sprintf("o (%d elements of %T) or lse (%d): the plan needs %d of its dtype and %d",
				oLen, o, len(lse), e.O, e.LSE)}
	}
	var lsePtr unsafe.Pointer
	if len(lse) > 0 {
		lsePtr = unsafe.Pointer(&lse[0])
	}
	po := make([]unsafe.Pointer, len(partialO))
	pl := make([]unsafe.Pointer, len(partialLSE))
	var dtype DType
	for s := range partialO {
		ptr, n, dt, err := hostSlice(op, "partialO", partialO[s])
		if err != nil {
			return err
		}
		if s == 0 {
			dtype = dt
		}
		if dt != dtype || n < e.O || len(partialLSE[s]) < e.LSE {
			return &Error{Status: StatusInvalidArgument, Op: op,
				Message: fmt.Sprintf("partial %d: %d O and %d LSE elements of type %T, the plan needs %d and %d of one type",
					s, n, len(partialLSE[s]), partialO[s], e.O, e.LSE)}
		}
		po[s], pl[s] = ptr, unsafe.Pointer(&partialLSE[s][0])
	}
	err = p.MergeStatesRaw(po, pl, dtype, oPtr, lsePtr, nil)
	runtime.KeepAlive(partialO)
	runtime.KeepAlive(partialLSE)
	runtime.KeepAlive(o)
	runtime.KeepAlive(lse)
	return err
}

// MergeStatesRaw is flashattn_plan_merge_states with raw pointers (device memory and a stream for
// GPU plans). The pointer arrays are passed as integers (they point at memory the caller keeps
// alive for the call, and a Go array of Go pointers may not be handed to C).
func (p *Plan) MergeStatesRaw(partialO, partialLSE []unsafe.Pointer, partialDtype DType, o, lse unsafe.Pointer,
	stream unsafe.Pointer) error {
	h, err := p.handle("MergeStatesRaw")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(p)
	n := len(partialO)
	if n != len(partialLSE) || n == 0 {
		return &Error{Status: StatusInvalidArgument, Op: "MergeStatesRaw",
			Message: fmt.Sprintf("partialO and partialLSE: %d and %d entries (at least 1, equal)", n, len(partialLSE))}
	}
	addrO := make([]uintptr, n)
	addrL := make([]uintptr, n)
	for s := 0; s < n; s++ {
		addrO[s], addrL[s] = uintptr(partialO[s]), uintptr(partialLSE[s])
	}
	return call("flashattn_plan_merge_states", func() C.flashattn_status_t {
		return C.flashattn_plan_merge_states(h, C.int32_t(n), (*unsafe.Pointer)(unsafe.Pointer(&addrO[0])),
			(**C.float)(unsafe.Pointer(&addrL[0])), C.flashattn_dtype_t(partialDtype), o, (*C.float)(lse),
			C.flashattn_stream_t(stream))
	})
}

// RotateHadamard rotates each dim-long row of the host slice data (float32, Float16 or BFloat16;
// [rows, dim] contiguous) in place by the random-sign Hadamard matrix of seed scaled by
// 1/sqrt(dim) (flashattn_rotate_hadamard, since 0.3). Rotating Q and K with one seed leaves Q·Kᵀ
// unchanged and spreads outliers before FP8 quantization. dim: a power of two in [8, 256].
func RotateHadamard(data interface{}, dim int, seed uint64) error {
	ptr, n, dtype, err := hostSlice("RotateHadamard", "data", data)
	if err != nil {
		return err
	}
	if dim <= 0 || n%dim != 0 {
		return &Error{Status: StatusInvalidArgument, Op: "RotateHadamard",
			Message: fmt.Sprintf("data: %d elements is not a whole number of rows of dim = %d", n, dim)}
	}
	defer runtime.KeepAlive(data)
	return RotateHadamardRaw(dtype, n/dim, dim, ptr, dim, ptr, dim, seed, -1, nil)
}

// RotateHadamardRaw is flashattn_rotate_hadamard with raw pointers: device -1 for host memory,
// else the CUDA device holding src and dst (the kernel is enqueued on stream).
func RotateHadamardRaw(dtype DType, rows, dim int, src unsafe.Pointer, srcRowStride int, dst unsafe.Pointer,
	dstRowStride int, seed uint64, device int, stream unsafe.Pointer) error {
	return call("flashattn_rotate_hadamard", func() C.flashattn_status_t {
		return C.flashattn_rotate_hadamard(C.flashattn_dtype_t(dtype), C.int64_t(rows), C.int64_t(dim), src,
			C.int64_t(srcRowStride), dst, C.int64_t(dstRowStride), C.uint64_t(seed), C.int32_t(device),
			C.flashattn_stream_t(stream))
	})
}

// Shape gives the sizes of a fixed-length problem on contiguous [batch, seq, heads, dim] tensors.
// HeadsKV 0 means HeadsQ and HeadDimV 0 means HeadDim.
type Shape struct {
	Batch, SeqlenQ, SeqlenK, HeadsQ, HeadsKV, HeadDim, HeadDimV int
}

func (s Shape) resolved() Shape {
	if s.HeadsKV == 0 {
		s.HeadsKV = s.HeadsQ
	}
	if s.HeadDimV == 0 {
		s.HeadDimV = s.HeadDim
	}
	return s
}

// Options are the masks, scaling and backend; the zero value is plain attention.
type Options struct {
	Causal  bool
	Window  *[2]int64 // nil: no window; else {left, right}, -1 unbounded on that side
	Softcap float64   // 0: off
	Scale   float64   // 0: 1/sqrt(head_dim)
	Backend Backend   // host slices run on the CPU backend; Auto means CPU here
}

// params are the size parameters of a resolved Shape, for newPlan.
func (s Shape) params() [][2]int64 {
	return [][2]int64{{int64(Batch), int64(s.Batch)}, {int64(SeqlenQ), int64(s.SeqlenQ)},
		{int64(SeqlenK), int64(s.SeqlenK)}, {int64(HeadsQ), int64(s.HeadsQ)}, {int64(HeadsKV), int64(s.HeadsKV)},
		{int64(HeadDim), int64(s.HeadDim)}, {int64(HeadDimV), int64(s.HeadDimV)}}
}

// newPlan is a finalized plan with the given integer parameters, dtype and options (closed again
// when any step fails).
func newPlan(params [][2]int64, dtype DType, opts Options) (*Plan, error) {
	plan, err := NewPlan()
	if err != nil {
		return nil, err
	}
	if err := plan.setAll(params, dtype, opts); err != nil {
		plan.Close()
		return nil, err
	}
	return plan, nil
}

func (p *Plan) setAll(params [][2]int64, dtype DType, opts Options) error {
	backend := opts.Backend
	if backend == BackendAuto {
		backend = BackendCPU
	}
	left, right := int64(-1), int64(-1)
	if opts.Window != nil {
		left, right = opts.Window[0], opts.Window[1]
	}
	causal := int64(0)
	if opts.Causal {
		causal = 1
	}
	params = append(params, [2]int64{int64(Dtype), int64(dtype)}, [2]int64{int64(Causal), causal},
		[2]int64{int64(WindowLeft), left}, [2]int64{int64(WindowRight), right},
		[2]int64{int64(BackendParam), int64(backend)})
	for _, kv := range params {
		if err := p.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			return err
		}
	}
	if err := p.SetF64(Softcap, opts.Softcap); err != nil {
		return err
	}
	if opts.Scale != 0 {
		if err := p.SetF64(SoftmaxScale, opts.Scale); err != nil {
			return err
		}
	}
	return p.Finalize()
}

func dtypeOf[T Element]() DType {
	var zero T
	switch any(zero).(type) {
	case Float16:
		return FP16
	case BFloat16:
		return BF16
	}
	return FP32
}

// Attention runs attention over contiguous host tensors and returns O [batch, seqlen_q, heads_q,
// head_dim_v] and LSE [batch, heads_q, seqlen_q].
func Attention[T Element](q, k, v []T, shape Shape, opts Options) ([]T, []float32, error) {
	s := shape.resolved()
	plan, err := newPlan(s.params(), dtypeOf[T](), opts)
	if err != nil {
		return nil, nil, err
	}
	defer plan.Close()
	o := make([]T, s.Batch*s.SeqlenQ*s.HeadsQ*s.HeadDimV)
	lse := make([]float32, s.Batch*s.HeadsQ*s.SeqlenQ)
	if err := plan.Execute(q, k, v, o, lse, nil); err != nil {
		return nil, nil, err
	}
	return o, lse, nil
}

// AttentionBackward runs the backward pass over contiguous host tensors: from the forward's q, k, v,
// its o and lse (as Attention returned them) and dout (shaped like o), it returns dQ, dK, dV
// shaped like q, k, v. opts must be the forward's.
func AttentionBackward[T Element](q, k, v, o []T, lse []float32, dout []T, shape Shape, opts Options) ([]T, []T, []T, error) {
	s := shape.resolved()
	plan, err := newPlan(s.params(), dtypeOf[T](), opts)
	if err != nil {
		return nil, nil, nil, err
	}
	defer plan.Close()
	dq := make([]T, s.Batch*s.SeqlenQ*s.HeadsQ*s.HeadDim)
	dk := make([]T, s.Batch*s.SeqlenK*s.HeadsKV*s.HeadDim)
	dv := make([]T, s.Batch*s.SeqlenK*s.HeadsKV*s.HeadDimV)
	if err := plan.Backward(q, k, v, o, dout, lse, dq, dk, dv, nil); err != nil {
		return nil, nil, nil, err
	}
	return dq, dk, dv, nil
}

// AttentionVarlen runs attention over packed host tensors ([total, heads, dim]) whose sequences
// are given by int32 prefix sums; it returns O [total_q, heads_q, head_dim_v] and LSE [heads_q,
// total_q]. headDimV 0 means headDim.
func AttentionVarlen[T Element](q, k, v []T, cuSeqlensQ, cuSeqlensK []int32, headsQ, headsKV, headDim, headDimV int,
	opts Options) ([]T, []float32, error) {
	if len(cuSeqlensQ) < 2 || len(cuSeqlensQ) != len(cuSeqlensK) {
		return nil, nil, &Error{Status: StatusInvalidArgument, Op: "AttentionVarlen",
			Message: fmt.Sprintf("cu_seqlens: %d and %d entries; both need batch+1 >= 2", len(cuSeqlensQ), len(cuSeqlensK))}
	}
	if headDimV == 0 {
		headDimV = headDim
	}
	maxLen := func(cu []int32) int64 {
		m := int64(1)
		for i := 1; i < len(cu); i++ {
			if d := int64(cu[i] - cu[i-1]); d > m {
				m = d
			}
		}
		return m
	}
	totalQ, totalK := int64(cuSeqlensQ[len(cuSeqlensQ)-1]), int64(cuSeqlensK[len(cuSeqlensK)-1])
	plan, err := newPlan([][2]int64{{int64(Batch), int64(len(cuSeqlensQ) - 1)}, {int64(SeqlenQ), maxLen(cuSeqlensQ)},
		{int64(SeqlenK), maxLen(cuSeqlensK)}, {int64(HeadsQ), int64(headsQ)}, {int64(HeadsKV), int64(headsKV)},
		{int64(HeadDim), int64(headDim)}, {int64(HeadDimV), int64(headDimV)}, {int64(Varlen), 1},
		{int64(TotalQ), totalQ}, {int64(TotalK), totalK}}, dtypeOf[T](), opts)
	if err != nil {
		return nil, nil, err
	}
	defer plan.Close()
	o := make([]T, int(totalQ)*headsQ*headDimV)
	lse := make([]float32, headsQ*int(totalQ))
	if err := plan.ExecuteVarlen(q, k, v, o, lse, cuSeqlensQ, cuSeqlensK, nil); err != nil {
		return nil, nil, err
	}
	return o, lse, nil
}
