//go:build flashattn_cp

package cp

/*
#cgo pkg-config: flashattn_cp
#include <stdlib.h>
#include <string.h>
#include <flashattn/flashattn_cp.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"

	flashattn "github.com/libflashattn/libflashattn/bindings/go"
)

// Transport is a flashattn_cp_transport_t.
type Transport int

const (
	TransportLoopback Transport = C.FLASHATTN_CP_TRANSPORT_LOOPBACK
	TransportNCCL     Transport = C.FLASHATTN_CP_TRANSPORT_NCCL
)

// I64Param is a flashattn_cp_i64_param_t.
type I64Param int

const (
	WorldSize    I64Param = C.FLASHATTN_CP_I64_WORLD_SIZE
	Rank         I64Param = C.FLASHATTN_CP_I64_RANK
	TransportKey I64Param = C.FLASHATTN_CP_I64_TRANSPORT
)

func call(op string, f func() C.flashattn_status_t) error {
	runtime.LockOSThread() // the message is thread-local
	defer runtime.UnlockOSThread()
	s := flashattn.Status(f())
	if s == flashattn.StatusSuccess {
		return nil
	}
	return &flashattn.Error{Status: s, Message: C.GoString(C.flashattn_cp_last_error()), Op: op}
}

// ShardRows is the global rows rank holds in its local order (L = localRows; zigzag when causal).
func ShardRows(worldSize, rank, localRows int, causal bool) []int {
	rows := make([]int, 0, localRows)
	if !causal {
		for i := 0; i < localRows; i++ {
			rows = append(rows, rank*localRows+i)
		}
		return rows
	}
	c, second := localRows/2, 2*worldSize-1-rank
	for i := 0; i < c; i++ {
		rows = append(rows, rank*c+i)
	}
	for i := 0; i < c; i++ {
		rows = append(rows, second*c+i)
	}
	return rows
}

// Plan is a finalized flashattn_cp_plan_t. Close it when done (a finalizer also does).
type Plan struct {
	p          *C.flashattn_cp_plan_t
	localRanks int
	extents    flashattn.Extents
}

func newPlan(local *flashattn.Plan, worldSize, rank int, transport Transport, comm unsafe.Pointer) (*Plan, error) {
	extents, err := local.Extents()
	if err != nil {
		return nil, err
	}
	var raw *C.flashattn_cp_plan_t
	if err := call("flashattn_cp_plan_create", func() C.flashattn_status_t { return C.flashattn_cp_plan_create(&raw) }); err != nil {
		return nil, err
	}
	plan := &Plan{p: raw, localRanks: 1, extents: extents}
	if transport == TransportLoopback {
		plan.localRanks = worldSize
	}
	runtime.SetFinalizer(plan, (*Plan).Close)
	set := func(key I64Param, value int) error {
		return call("flashattn_cp_plan_set_i64", func() C.flashattn_status_t {
			return C.flashattn_cp_plan_set_i64(raw, C.flashattn_cp_i64_param_t(key), C.int64_t(value))
		})
	}
	for _, kv := range [][2]int{{int(WorldSize), worldSize}, {int(Rank), rank}, {int(TransportKey), int(transport)}} {
		if err := set(I64Param(kv[0]), kv[1]); err != nil {
			plan.Close()
			return nil, err
		}
	}
	if comm != nil {
		if err := call("flashattn_cp_plan_set_nccl_comm", func() C.flashattn_status_t {
			return C.flashattn_cp_plan_set_nccl_comm(raw, comm)
		}); err != nil {
			plan.Close()
			return nil, err
		}
	}
	err = call("flashattn_cp_plan_finalize", func() C.flashattn_status_t {
		return C.flashattn_cp_plan_finalize(raw, (*C.flashattn_plan_t)(local.Handle()))
	})
	runtime.KeepAlive(local)
	if err != nil {
		plan.Close()
		return nil, err
	}
	return plan, nil
}

// NewLoopback plays all worldSize ranks in this process (local: a finalized plan of one rank's
// share, CPU or GPU backend).
func NewLoopback(local *flashattn.Plan, worldSize int) (*Plan, error) {
	return newPlan(local, worldSize, 0, TransportLoopback, nil)
}

// NewNCCL is one rank over the caller's NCCL communicator (comm: an ncclComm_t, which must
// outlive the plan's executes).
func NewNCCL(local *flashattn.Plan, worldSize, rank int, comm unsafe.Pointer) (*Plan, error) {
	if comm == nil {
		return nil, &flashattn.Error{Status: flashattn.StatusInvalidArgument, Message: "comm: nil", Op: "cp.NewNCCL"}
	}
	return newPlan(local, worldSize, rank, TransportNCCL, comm)
}

// Close destroys the C plan; closing twice does nothing.
func (p *Plan) Close() {
	if p == nil || p.p == nil {
		return
	}
	C.flashattn_cp_plan_destroy(p.p)
	p.p = nil
	runtime.SetFinalizer(p, nil)
}

// LocalRanks is how many ranks' tensors one execute takes (W for loopback, 1 for NCCL).
func (p *Plan) LocalRanks() int { return p.localRanks }

// WorkspaceSize is the bytes one execute needs.
func (p *Plan) WorkspaceSize() (int, error) {
	if p == nil || p.p == nil {
		return 0, &flashattn.Error{Status: flashattn.StatusInvalidArgument, Message: "the plan is closed", Op: "cp.WorkspaceSize"}
	}
	var n C.size_t
	err := call("flashattn_cp_plan_get_workspace_size", func() C.flashattn_status_t {
		return C.flashattn_cp_plan_get_workspace_size(p.p, &n)
	})
	return int(n), err
}

// BackwardWorkspaceSize is the bytes one ExecuteBackward needs (separate from WorkspaceSize);
// StatusNotSupported with the reason when the local plan's backend has no backward pass for
// this problem.
func (p *Plan) BackwardWorkspaceSize() (int, error) {
	if p == nil || p.p == nil {
		return 0, &flashattn.Error{Status: flashattn.StatusInvalidArgument, Message: "the plan is closed", Op: "cp.BackwardWorkspaceSize"}
	}
	var n C.size_t
	err := call("flashattn_cp_plan_get_backward_workspace_size", func() C.flashattn_status_t {
		return C.flashattn_cp_plan_get_backward_workspace_size(p.p, &n)
	})
	return int(n), err
}

// pointerArrays copies each list of n addresses into a C array (cgo passes no Go memory that
// holds pointers); a nil list gives a nil array. free releases them.
func pointerArrays(n int, lists ...[]unsafe.Pointer) (arrays []unsafe.Pointer, free func()) {
	arrays = make([]unsafe.Pointer, len(lists))
	for i, list := range lists {
		if list == nil {
			continue
		}
		arr := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(uintptr(0))))
		copy(unsafe.Slice((*unsafe.Pointer)(arr), n), list)
		arrays[i] = arr
	}
	return arrays, func() {
		for _, arr := range arrays {
			C.free(arr)
		}
	}
}

// checkHost checks that list holds one slice per rank, each of at least need elements, and that
// the plan's elements are float32 (a 16-bit plan would read the copies as other numbers).
func (p *Plan) checkHost(op, name string, list [][]float32, need int) error {
	if p.extents.DType != flashattn.FP32 {
		return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
			Message: fmt.Sprintf("%s: float32 slices, but the plan's dtype is %d (use the Raw call)", name,
				int(p.extents.DType)), Op: op}
	}
	n := p.localRanks
	if len(list) != n {
		return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
			Message: fmt.Sprintf("%s: %d slices for %d rank(s)", name, len(list), n), Op: op}
	}
	for r, s := range list {
		if len(s) < need {
			return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
				Message: fmt.Sprintf("%s[%d]: %d elements, the plan needs %d", name, r, len(s), need), Op: op}
		}
	}
	return nil
}

// hostCopies copies each slice of list to C memory (malloc'd, aligned enough for the CPU
// backend, which needs no more than element alignment); nil gives nil. Free them with freeAll.
func hostCopies(list [][]float32) []unsafe.Pointer {
	if list == nil {
		return nil
	}
	out := make([]unsafe.Pointer, len(list))
	for r, s := range list {
		out[r] = C.malloc(C.size_t(len(s)*4 + 4))
		if len(s) > 0 {
			C.memcpy(out[r], unsafe.Pointer(&s[0]), C.size_t(len(s)*4))
		}
	}
	return out
}

func freeAll(lists ...[]unsafe.Pointer) {
	for _, list := range lists {
		for _, ptr := range list {
			C.free(ptr)
		}
	}
}

// copyBack copies each C array of src back into the Go slice of dst.
func copyBack(dst [][]float32, src []unsafe.Pointer) {
	for r := range dst {
		copy(dst[r], unsafe.Slice((*float32)(src[r]), len(dst[r])))
	}
}

// ExecuteRaw is flashattn_cp_plan_execute on device (or host) addresses, LocalRanks() of each;
// lse may be nil. The addresses must not point into Go memory (cgo forbids C arrays of Go
// pointers): device memory, or C memory for the CPU backend.
func (p *Plan) ExecuteRaw(q, k, v, o, lse []unsafe.Pointer, workspace unsafe.Pointer, workspaceBytes uintptr,
	stream unsafe.Pointer) error {
	n := p.localRanks
	if len(q) != n || len(k) != n || len(v) != n || len(o) != n || (lse != nil && len(lse) != n) {
		return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
			Message: fmt.Sprintf("every pointer list must hold %d entries", n), Op: "cp.ExecuteRaw"}
	}
	arrays, free := pointerArrays(n, q, k, v, o, lse)
	defer free()
	return call("flashattn_cp_plan_execute", func() C.flashattn_status_t {
		return C.flashattn_cp_plan_execute(p.p, C.int32_t(n), (*unsafe.Pointer)(arrays[0]), (*unsafe.Pointer)(arrays[1]),
			(*unsafe.Pointer)(arrays[2]), (*unsafe.Pointer)(arrays[3]), (**C.float)(arrays[4]), workspace,
			C.size_t(workspaceBytes), C.flashattn_stream_t(stream))
	})
}

// ExecuteHost runs the loopback ring on the CPU backend with fp32 Go slices, one per rank
// (lse nil, or one [batch, heads_q, L] slice per rank). The tensors are copied to C memory for
// the call (cgo passes no arrays of Go pointers) and the outputs copied back.
func (p *Plan) ExecuteHost(q, k, v, o, lse [][]float32) error {
	e := p.extents
	for _, c := range []struct {
		name string
		list [][]float32
		need int
	}{{"q", q, e.Q}, {"k", k, e.K}, {"v", v, e.V}, {"o", o, e.O}} {
		if err := p.checkHost("cp.ExecuteHost", c.name, c.list, c.need); err != nil {
			return err
		}
	}
	if lse != nil {
		if err := p.checkHost("cp.ExecuteHost", "lse", lse, e.LSE); err != nil {
			return err
		}
	}
	cq, ck, cv, co, cl := hostCopies(q), hostCopies(k), hostCopies(v), hostCopies(o), hostCopies(lse)
	defer freeAll(cq, ck, cv, co, cl)
	bytes, err := p.WorkspaceSize()
	if err != nil {
		return err
	}
	ws := C.aligned_alloc(256, C.size_t((bytes+256)/256*256))
	defer C.free(ws)
	if err := p.ExecuteRaw(cq, ck, cv, co, cl, ws, uintptr(bytes), nil); err != nil {
		return err
	}
	copyBack(o, co)
	if lse != nil {
		copyBack(lse, cl)
	}
	return nil
}

// ExecuteBackwardRaw is flashattn_cp_plan_execute_backward on device (or host) addresses,
// LocalRanks() of each; lse is required. The addresses must not point into Go memory (see
// ExecuteRaw); dq, dk, dv must not overlap each other, any input or the workspace.
func (p *Plan) ExecuteBackwardRaw(q, k, v, o, dout, lse, dq, dk, dv []unsafe.Pointer, workspace unsafe.Pointer,
	workspaceBytes uintptr, stream unsafe.Pointer) error {
	n := p.localRanks
	for _, list := range [][]unsafe.Pointer{q, k, v, o, dout, lse, dq, dk, dv} {
		if len(list) != n {
			return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
				Message: fmt.Sprintf("every pointer list must hold %d entries", n), Op: "cp.ExecuteBackwardRaw"}
		}
	}
	a, free := pointerArrays(n, q, k, v, o, dout, lse, dq, dk, dv)
	defer free()
	return call("flashattn_cp_plan_execute_backward", func() C.flashattn_status_t {
		return C.flashattn_cp_plan_execute_backward(p.p, C.int32_t(n), (*unsafe.Pointer)(a[0]), (*unsafe.Pointer)(a[1]),
			(*unsafe.Pointer)(a[2]), (*unsafe.Pointer)(a[3]), (*unsafe.Pointer)(a[4]), (**C.float)(a[5]),
			(*unsafe.Pointer)(a[6]), (*unsafe.Pointer)(a[7]), (*unsafe.Pointer)(a[8]), workspace,
			C.size_t(workspaceBytes), C.flashattn_stream_t(stream))
	})
}

// ExecuteBackwardHost runs the loopback ring's backward pass on the CPU backend with fp32 Go
// slices, one per rank: from the forward's q, k, v, o and lse (required, [batch, heads_q, L]) and
// dout (layout of o) it writes dq, dk, dv (layouts of q, k, v): the gradients with respect to the
// whole sequence, restricted to each rank's rows. The tensors are copied to C memory for the call
// (cgo passes no arrays of Go pointers) and the gradients copied back.
func (p *Plan) ExecuteBackwardHost(q, k, v, o, dout, lse, dq, dk, dv [][]float32) error {
	e := p.extents
	for _, c := range []struct {
		name string
		list [][]float32
		need int
	}{{"q", q, e.Q}, {"k", k, e.K}, {"v", v, e.V}, {"o", o, e.O}, {"dout", dout, e.DOut}, {"lse", lse, e.LSE},
		{"dq", dq, e.DQ}, {"dk", dk, e.DK}, {"dv", dv, e.DV}} {
		if err := p.checkHost("cp.ExecuteBackwardHost", c.name, c.list, c.need); err != nil {
			return err
		}
	}
	cq, ck, cv, co, cdo, cl := hostCopies(q), hostCopies(k), hostCopies(v), hostCopies(o), hostCopies(dout), hostCopies(lse)
	cdq, cdk, cdv := hostCopies(dq), hostCopies(dk), hostCopies(dv)
	defer freeAll(cq, ck, cv, co, cdo, cl, cdq, cdk, cdv)
	bytes, err := p.BackwardWorkspaceSize()
	if err != nil {
		return err
	}
	ws := C.aligned_alloc(256, C.size_t((bytes+256)/256*256))
	defer C.free(ws)
	if err := p.ExecuteBackwardRaw(cq, ck, cv, co, cdo, cl, cdq, cdk, cdv, ws, uintptr(bytes), nil); err != nil {
		return err
	}
	copyBack(dq, cdq)
	copyBack(dk, cdk)
	copyBack(dv, cdv)
	return nil
}
