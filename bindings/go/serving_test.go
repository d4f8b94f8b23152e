package flashattn

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"
)

// One decode step over a paged cache (page size 3, a shuffled page table) that appends a row with
// an interleaved rotary embedding, through ExecuteArgs on the CPU backend, against a float64
// reference written here (it gathers the pages and rotates on its own); then a seqused_k beyond
// the cache, which must fail with nothing written.
const (
	svB, svSK, svHQ, svD, svPage, svMaxP, svPages, svRot = 2, 10, 2, 8, 3, 4, 9, 4
)

type servingCase struct {
	q, k, v, kNew, vNew, cos, sin []float32
	table, seqused                []int32
}

func newServingCase() *servingCase {
	rng := func(n int, seed float64) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(math.Sin(seed*float64(i+1)*12.9898) * 0.9)
		}
		return out
	}
	c := &servingCase{q: rng(svB*svHQ*svD, 1.1), k: rng(svPages*svPage*svD, 2.3), v: rng(svPages*svPage*svD, 3.7),
		kNew: rng(svB*svD, 4.1), vNew: rng(svB*svD, 5.3), table: []int32{4, 0, 7, 2, 8, 1, 6, 3}, seqused: []int32{5, 0}}
	c.cos = make([]float32, svSK*svRot/2)
	c.sin = make([]float32, svSK*svRot/2)
	for p := 0; p < svSK; p++ {
		for i := 0; i < svRot/2; i++ {
			theta := float64(p) * math.Pow(10000, -2*float64(i)/svRot)
			c.cos[p*svRot/2+i], c.sin[p*svRot/2+i] = float32(math.Cos(theta)), float32(math.Sin(theta))
		}
	}
	return c
}

func (c *servingCase) slot(b, t int) int {
	return (int(c.table[b*svMaxP+t/svPage])*svPage + t%svPage) * svD
}

// rotate is x rotated at table row pos, interleaved pairs (2i, 2i+1), in float64.
func (c *servingCase) rotate(x []float32, pos int) []float64 {
	out := make([]float64, len(x))
	for i := range x {
		out[i] = float64(x[i])
	}
	for i := 0; i < svRot/2; i++ {
		co, si := float64(c.cos[pos*svRot/2+i]), float64(c.sin[pos*svRot/2+i])
		a, b := float64(x[2*i]), float64(x[2*i+1])
		out[2*i], out[2*i+1] = a*co-b*si, a*si+b*co
	}
	return out
}

func servingPlan(t *testing.T) *Plan {
	p, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]int64{{int64(Batch), svB}, {int64(SeqlenQ), 1}, {int64(SeqlenK), svSK}, {int64(HeadsQ), svHQ},
		{int64(HeadsKV), 1}, {int64(HeadDim), svD}, {int64(Dtype), int64(FP32)}, {int64(BackendParam), int64(BackendCPU)},
		{int64(PagedKV), 1}, {int64(PageSize), svPage}, {int64(NumPages), svPages}, {int64(SequsedK), 1},
		{int64(NewKVRows), 1}, {int64(RotaryDim), svRot}, {int64(RotaryInterleaved), 1}} {
		if err := p.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Finalize(); err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *servingCase) run(p *Plan, o []float32) error {
	n, err := p.WorkspaceSize()
	if err != nil {
		return err
	}
	ws := NewWorkspace(n)
	return p.ExecuteArgs(&Tensors{Q: unsafe.Pointer(&c.q[0]), K: unsafe.Pointer(&c.k[0]), V: unsafe.Pointer(&c.v[0]),
		O: unsafe.Pointer(&o[0]), PageTable: unsafe.Pointer(&c.table[0]), SequsedK: unsafe.Pointer(&c.seqused[0]),
		KNew: unsafe.Pointer(&c.kNew[0]), VNew: unsafe.Pointer(&c.vNew[0]), RotaryCos: unsafe.Pointer(&c.cos[0]),
		RotarySin: unsafe.Pointer(&c.sin[0])}, ws.ptr(), uintptr(ws.Len()), nil)
}

func TestServingDecodeStep(t *testing.T) {
	p := servingPlan(t)
	defer p.Close()
	c := newServingCase()
	kBefore := append([]float32(nil), c.k...)
	o := make([]float32, svB*svHQ*svD)
	if err := c.run(p, o); err != nil {
		t.Fatal(err)
	}
	if c.seqused[0] != 5 || c.seqused[1] != 0 {
		t.Fatalf("seqused_k was written: %v", c.seqused)
	}
	scale := 1 / math.Sqrt(svD)
	for b := 0; b < svB; b++ {
		used := int(c.seqused[b])
		kNew := c.rotate(c.kNew[b*svD:(b+1)*svD], used)
		keys, vals := [][]float64{}, [][]float64{}
		for j := 0; j <= used; j++ {
			kr, vr := make([]float64, svD), make([]float64, svD)
			for x := 0; x < svD; x++ {
				if j < used {
					kr[x], vr[x] = float64(kBefore[c.slot(b, j)+x]), float64(c.v[c.slot(b, j)+x])
				} else {
					kr[x], vr[x] = kNew[x], float64(c.vNew[b*svD+x])
				}
			}
			keys, vals = append(keys, kr), append(vals, vr)
		}
		for x := 0; x < svD; x++ {
			if d := math.Abs(float64(c.k[c.slot(b, used)+x]) - kNew[x]); d > 1e-6 {
				t.Fatalf("K cache slot of sequence %d, column %d: off by %g", b, x, d)
			}
		}
		for h := 0; h < svHQ; h++ {
			q := c.rotate(c.q[(b*svHQ+h)*svD:(b*svHQ+h+1)*svD], used)
			s := make([]float64, len(keys))
			m := math.Inf(-1)
			for j := range keys {
				for x := 0; x < svD; x++ {
					s[j] += q[x] * keys[j][x]
				}
				s[j] *= scale
				m = math.Max(m, s[j])
			}
			sum := 0.0
			for j := range s {
				sum += math.Exp(s[j] - m)
			}
			for x := 0; x < svD; x++ {
				r := 0.0
				for j := range s {
					r += math.Exp(s[j]-m) / sum * vals[j][x]
				}
				if d := math.Abs(float64(o[(b*svHQ+h)*svD+x]) - r); d > 2e-5 {
					t.Fatalf("O[%d][%d][%d] = %g, reference %g", b, h, x, o[(b*svHQ+h)*svD+x], r)
				}
			}
		}
	}
}

func TestServingBadSequsedWritesNothing(t *testing.T) {
	p := servingPlan(t)
	defer p.Close()
	c := newServingCase()
	c.seqused[1] = svSK // no room for the appended row
	kBefore := append([]float32(nil), c.k...)
	o := make([]float32, svB*svHQ*svD)
	for i := range o {
		o[i] = 7
	}
	err := c.run(p, o)
	var fe *Error
	if !errors.As(err, &fe) || fe.Status != StatusInvalidArgument || !strings.Contains(fe.Message, "seqused_k[1]") {
		t.Fatalf("expected an invalid-argument error naming seqused_k[1], got %v", err)
	}
	for i := range o {
		if o[i] != 7 || c.k[i%len(c.k)] != kBefore[i%len(c.k)] {
			t.Fatal("a failed call wrote its outputs")
		}
	}
}

// NumSplits (since 0.3): 0..128; before Finalize what was set, after it the plan's count (the CPU
// backend has no split-KV: 1).
func TestNumSplitsKey(t *testing.T) {
	p, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, kv := range [][2]int64{{int64(Batch), 1}, {int64(SeqlenQ), 1}, {int64(SeqlenK), 300}, {int64(HeadsQ), 4},
		{int64(HeadsKV), 1}, {int64(HeadDim), 16}, {int64(Dtype), int64(FP32)}, {int64(BackendParam), int64(BackendCPU)}} {
		if err := p.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := p.GetI64(NumSplits); err != nil || v != 0 {
		t.Fatalf("NumSplits before setting = %d, %v; want 0", v, err)
	}
	for _, bad := range []int64{-1, 129} {
		err := p.SetI64(NumSplits, bad)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "FLASHATTN_I64_NUM_SPLITS") {
			t.Fatalf("NumSplits = %d: %v", bad, err)
		}
	}
	if err := p.SetI64(NumSplits, 7); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.GetI64(NumSplits); v != 7 {
		t.Fatalf("NumSplits before Finalize = %d, want 7", v)
	}
	if err := p.Finalize(); err != nil {
		t.Fatal(err)
	}
	if v, _ := p.GetI64(NumSplits); v != 1 {
		t.Fatalf("NumSplits after Finalize on the CPU = %d, want 1", v)
	}
}
