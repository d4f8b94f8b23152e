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
	arrays := make([]unsafe.Pointer, 5)
	for i, list := range [][]unsafe.Pointer{q, k, v, o, lse} {
		if list == nil {
			continue
		}
		arr := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(uintptr(0))))
		defer C.free(arr)
		ptrs := unsafe.Slice((*unsafe.Pointer)(arr), n)
		copy(ptrs, list)
		arrays[i] = arr
	}
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
	n := p.localRanks
	e := p.extents
	check := func(name string, list [][]float32, need int) error {
		if len(list) != n {
			return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
				Message: fmt.Sprintf("%s: %d slices for %d rank(s)", name, len(list), n), Op: "cp.ExecuteHost"}
		}
		for r, s := range list {
			if len(s) < need {
				return &flashattn.Error{Status: flashattn.StatusInvalidArgument,
					Message: fmt.Sprintf("%s[%d]: %d elements, the plan needs %d", name, r, len(s), need), Op: "cp.ExecuteHost"}
			}
		}
		return nil
	}
	for _, c := range []struct {
		name string
		list [][]float32
		need int
	}{{"q", q, e.Q}, {"k", k, e.K}, {"v", v, e.V}, {"o", o, e.O}} {
		if err := check(c.name, c.list, c.need); err != nil {
			return err
		}
	}
	if lse != nil {
		if err := check("lse", lse, e.LSE); err != nil {
			return err
		}
	}
	// C copies (posix-aligned by malloc; the CPU backend needs no more than element alignment).
	toC := func(list [][]float32) []unsafe.Pointer {
		if list == nil {
			return nil
		}
		out := make([]unsafe.Pointer, n)
		for r, s := range list {
			out[r] = C.malloc(C.size_t(len(s)*4 + 4))
			if len(s) > 0 {
				C.memcpy(out[r], unsafe.Pointer(&s[0]), C.size_t(len(s)*4))
			}
		}
		return out
	}
	cq, ck, cv, co, cl := toC(q), toC(k), toC(v), toC(o), toC(lse)
	defer func() {
		for _, list := range [][]unsafe.Pointer{cq, ck, cv, co, cl} {
			for _, ptr := range list {
				C.free(ptr)
			}
		}
	}()
	bytes, err := p.WorkspaceSize()
	if err != nil {
		return err
	}
	ws := C.aligned_alloc(256, C.size_t((bytes+256)/256*256))
	defer C.free(ws)
	if err := p.ExecuteRaw(cq, ck, cv, co, cl, ws, uintptr(bytes), nil); err != nil {
		return err
	}
	for r := 0; r < n; r++ {
		copy(o[r], unsafe.Slice((*float32)(co[r]), len(o[r])))
		if lse != nil {
			copy(lse[r], unsafe.Slice((*float32)(cl[r]), len(lse[r])))
		}
	}
	return nil
}
