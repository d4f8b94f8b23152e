//go:build flashattn_cp

package cp

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"

	flashattn "github.com/libflashattn/libflashattn/bindings/go"
)

func randSlice(n int, seed *uint64) []float32 {
	out := make([]float32, n)
	for i := range out {
		*seed = *seed*6364136223846793005 + 1442695040888963407
		out[i] = float32(float64(*seed>>40)/float64(1<<24)*2 - 1)
	}
	return out
}

// reference is float64 attention of one sequence: O [s][hq][d], LSE [hq][s].
func reference(q, k, v []float32, s, hq, hkv, d int, causal bool) ([]float64, []float64) {
	o, lse := make([]float64, s*hq*d), make([]float64, hq*s)
	scale := 1 / math.Sqrt(float64(d))
	for h := 0; h < hq; h++ {
		g := h / (hq / hkv)
		for i := 0; i < s; i++ {
			last := s - 1
			if causal {
				last = i
			}
			scores := make([]float64, last+1)
			m := math.Inf(-1)
			for j := 0; j <= last; j++ {
				dot := 0.0
				for x := 0; x < d; x++ {
					dot += float64(q[(i*hq+h)*d+x]) * float64(k[(j*hkv+g)*d+x])
				}
				scores[j] = dot * scale
				m = math.Max(m, scores[j])
			}
			sum := 0.0
			for j := 0; j <= last; j++ {
				p := math.Exp(scores[j] - m)
				sum += p
				for x := 0; x < d; x++ {
					o[(i*hq+h)*d+x] += p * float64(v[(j*hkv+g)*d+x])
				}
			}
			for x := 0; x < d; x++ {
				o[(i*hq+h)*d+x] /= sum
			}
			lse[h*s+i] = m + math.Log(sum)
		}
	}
	return o, lse
}

func localPlan(t *testing.T, rows, hq, hkv, d int, causal bool) *flashattn.Plan {
	p, err := flashattn.NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	c := 0
	if causal {
		c = 1
	}
	for _, kv := range []struct {
		key   flashattn.I64Param
		value int64
	}{{flashattn.Batch, 1}, {flashattn.SeqlenQ, int64(rows)}, {flashattn.SeqlenK, int64(rows)},
		{flashattn.HeadsQ, int64(hq)}, {flashattn.HeadsKV, int64(hkv)}, {flashattn.HeadDim, int64(d)},
		{flashattn.Dtype, int64(flashattn.FP32)}, {flashattn.BackendParam, int64(flashattn.BackendCPU)},
		{flashattn.Causal, int64(c)}} {
		if err := p.SetI64(kv.key, kv.value); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Finalize(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoopbackRing(t *testing.T) {
	hq, hkv, d, l := 4, 2, 16, 6
	seed := uint64(11)
	for world := 1; world <= 4; world++ {
		for _, causal := range []bool{false, true} {
			s := world * l
			q, k, v := randSlice(s*hq*d, &seed), randSlice(s*hkv*d, &seed), randSlice(s*hkv*d, &seed)
			local := localPlan(t, l, hq, hkv, d, causal)
			ring, err := NewLoopback(local, world)
			if err != nil {
				t.Fatal(err)
			}
			shard := func(x []float32, heads, r int) []float32 {
				var out []float32
				for _, g := range ShardRows(world, r, l, causal) {
					out = append(out, x[g*heads*d:(g+1)*heads*d]...)
				}
				return out
			}
			qs, ks, vs, os, ls := make([][]float32, world), make([][]float32, world), make([][]float32, world),
				make([][]float32, world), make([][]float32, world)
			for r := 0; r < world; r++ {
				qs[r], ks[r], vs[r] = shard(q, hq, r), shard(k, hkv, r), shard(v, hkv, r)
				os[r], ls[r] = make([]float32, l*hq*d), make([]float32, hq*l)
				for i := range os[r] {
					os[r][i] = float32(math.NaN())
				}
				for i := range ls[r] {
					ls[r][i] = float32(math.NaN())
				}
			}
			if err := ring.ExecuteHost(qs, ks, vs, os, ls); err != nil {
				t.Fatal(err)
			}
			oRef, lseRef := reference(q, k, v, s, hq, hkv, d, causal)
			worst := 0.0
			for r := 0; r < world; r++ {
				for i, g := range ShardRows(world, r, l, causal) {
					for x := 0; x < hq*d; x++ {
						e := math.Abs(float64(os[r][i*hq*d+x]) - oRef[g*hq*d+x])
						if !(e <= worst) {
							worst = e
						}
					}
					for h := 0; h < hq; h++ {
						e := math.Abs(float64(ls[r][h*l+i]) - lseRef[h*s+g])
						if !(e <= worst) {
							worst = e
						}
					}
				}
			}
			if worst > 2e-5 {
				t.Errorf("W=%d causal=%v: max error %g", world, causal, worst)
			}
			ring.Close()
			local.Close()
		}
	}
}

// shardAll is every rank's rows of a global [s][heads][d] tensor, in their local order.
func shardAll(x []float32, world, l, heads, d int, causal bool) [][]float32 {
	out := make([][]float32, world)
	for r := range out {
		for _, g := range ShardRows(world, r, l, causal) {
			out[r] = append(out[r], x[g*heads*d:(g+1)*heads*d]...)
		}
	}
	return out
}

func nanSlices(world, n int) [][]float32 {
	out := make([][]float32, world)
	for r := range out {
		out[r] = make([]float32, n)
		for i := range out[r] {
			out[r][i] = float32(math.NaN())
		}
	}
	return out
}

// ringBackward runs the ring's forward, then its backward: dq, dk, dv per rank.
func ringBackward(t *testing.T, ring *Plan, qs, ks, vs, douts [][]float32, l, hq, hkv, d int) (dq, dk, dv [][]float32) {
	world := len(qs)
	os, ls := nanSlices(world, l*hq*d), nanSlices(world, hq*l)
	if err := ring.ExecuteHost(qs, ks, vs, os, ls); err != nil {
		t.Fatal(err)
	}
	dq, dk, dv = nanSlices(world, l*hq*d), nanSlices(world, l*hkv*d), nanSlices(world, l*hkv*d)
	if err := ring.ExecuteBackwardHost(qs, ks, vs, os, douts, ls, dq, dk, dv); err != nil {
		t.Fatal(err)
	}
	return dq, dk, dv
}

func TestLoopbackRingBackward(t *testing.T) {
	hq, hkv, d, l := 4, 2, 16, 6
	seed := uint64(23)
	for world := 1; world <= 3; world++ {
		for _, causal := range []bool{false, true} {
			s := world * l
			q, k, v := randSlice(s*hq*d, &seed), randSlice(s*hkv*d, &seed), randSlice(s*hkv*d, &seed)
			dout := randSlice(s*hq*d, &seed)
			local := localPlan(t, l, hq, hkv, d, causal)
			ring, err := NewLoopback(local, world)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := ring.BackwardWorkspaceSize(); err != nil || n <= 0 {
				t.Fatalf("BackwardWorkspaceSize: %d, %v", n, err)
			}
			qs, ks, vs := shardAll(q, world, l, hq, d, causal), shardAll(k, world, l, hkv, d, causal),
				shardAll(v, world, l, hkv, d, causal)
			douts := shardAll(dout, world, l, hq, d, causal)
			dqs, dks, dvs := ringBackward(t, ring, qs, ks, vs, douts, l, hq, hkv, d)
			// The core library's single call on the gathered sequence: forward, then backward.
			shape := flashattn.Shape{Batch: 1, SeqlenQ: s, SeqlenK: s, HeadsQ: hq, HeadsKV: hkv, HeadDim: d}
			opts := flashattn.Options{Causal: causal, Backend: flashattn.BackendCPU}
			o, lse, err := flashattn.Attention(q, k, v, shape, opts)
			if err != nil {
				t.Fatal(err)
			}
			dq, dk, dv, err := flashattn.AttentionBackward(q, k, v, o, lse, dout, shape, opts)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for r := 0; r < world; r++ {
				for i, g := range ShardRows(world, r, l, causal) {
					for _, c := range []struct {
						got, one []float32
						heads    int
					}{{dqs[r], dq, hq}, {dks[r], dk, hkv}, {dvs[r], dv, hkv}} {
						for x := 0; x < c.heads*d; x++ {
							e := math.Abs(float64(c.got[i*c.heads*d+x]) - float64(c.one[g*c.heads*d+x]))
							if !(e <= worst) { // NaN (a gradient not written) fails too
								worst = e
							}
						}
					}
				}
			}
			if !(worst <= 1e-4) {
				t.Errorf("W=%d causal=%v: max |ring - one call| %g", world, causal, worst)
			}
			// On the CPU the ring adds in a fixed order: a second run is bitwise identical.
			dqs2, dks2, dvs2 := ringBackward(t, ring, qs, ks, vs, douts, l, hq, hkv, d)
			for _, pair := range [][2][][]float32{{dqs, dqs2}, {dks, dks2}, {dvs, dvs2}} {
				for r := range pair[0] {
					for i := range pair[0][r] {
						if math.Float32bits(pair[0][r][i]) != math.Float32bits(pair[1][r][i]) {
							t.Fatalf("W=%d causal=%v: rank %d differs between two runs at %d", world, causal, r, i)
						}
					}
				}
			}
			ring.Close()
			local.Close()
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	hq, hkv, d, l, world := 4, 2, 16, 4, 2
	local := localPlan(t, l, hq, hkv, d, true)
	defer local.Close()
	ring, err := NewLoopback(local, world)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	seed := uint64(3)
	qs, kvs := make([][]float32, world), make([][]float32, world)
	for r := range qs {
		qs[r], kvs[r] = randSlice(l*hq*d, &seed), randSlice(l*hkv*d, &seed)
	}
	ls := make([][]float32, world)
	for r := range ls {
		ls[r] = make([]float32, hq*l)
	}
	need, err := ring.BackwardWorkspaceSize()
	if err != nil {
		t.Fatal(err)
	}
	// Raw calls on C copies: too small a workspace, then a NULL LSE entry.
	cq, ckv, cl := hostCopies(qs), hostCopies(kvs), hostCopies(ls)
	cdq, cdk, cdv := hostCopies(nanSlices(world, l*hq*d)), hostCopies(nanSlices(world, l*hkv*d)),
		hostCopies(nanSlices(world, l*hkv*d))
	defer freeAll(cq, ckv, cl, cdq, cdk, cdv)
	block := hostCopies([][]float32{make([]float32, need/4+128)})
	defer freeAll(block)
	ws := []unsafe.Pointer{unsafe.Add(block[0], (256-uintptr(block[0])%256)%256)} // aligned to 256 bytes
	err = ring.ExecuteBackwardRaw(cq, ckv, ckv, cq, cq, cl, cdq, cdk, cdv, ws[0], uintptr(need-1), nil)
	if !errors.Is(err, flashattn.ErrInsufficientWorkspace) {
		t.Fatalf("workspace of %d bytes, %d needed: %v", need-1, need, err)
	}
	nullLSE := []unsafe.Pointer{cl[0], nil}
	err = ring.ExecuteBackwardRaw(cq, ckv, ckv, cq, cq, nullLSE, cdq, cdk, cdv, ws[0], uintptr(need), nil)
	if !errors.Is(err, flashattn.ErrInvalidArgument) {
		t.Fatalf("a NULL lse entry: %v", err)
	}
	for _, list := range [][]unsafe.Pointer{cdq, cdk, cdv} { // an error leaves the outputs untouched
		for _, ptr := range list {
			if x := *(*float32)(ptr); !math.IsNaN(float64(x)) {
				t.Fatalf("an output was written by a failed call: %g", x)
			}
		}
	}
	if err := ring.ExecuteBackwardRaw(cq[:1], ckv, ckv, cq, cq, cl, cdq, cdk, cdv, ws[0], uintptr(need), nil); !errors.Is(err, flashattn.ErrInvalidArgument) {
		t.Fatalf("one pointer for 2 ranks: %v", err)
	}
	// Host slices: a short one, and the wrong number of ranks.
	dq, dk, dv := nanSlices(world, l*hq*d), nanSlices(world, l*hkv*d), nanSlices(world, l*hkv*d)
	err = ring.ExecuteBackwardHost(qs, kvs, kvs, qs, qs, [][]float32{ls[0], ls[1][:3]}, dq, dk, dv)
	if err == nil || !strings.Contains(err.Error(), "lse[1]") {
		t.Fatalf("short lse: %v", err)
	}
	if err := ring.ExecuteBackwardHost(qs[:1], kvs, kvs, qs, qs, ls, dq, dk, dv); err == nil || !strings.Contains(err.Error(), "rank") {
		t.Fatalf("one slice for 2 ranks: %v", err)
	}
}

func TestErrors(t *testing.T) {
	odd := localPlan(t, 3, 2, 2, 16, true)
	defer odd.Close()
	_, err := NewLoopback(odd, 2)
	if !errors.Is(err, flashattn.ErrInvalidArgument) || !strings.Contains(err.Error(), "odd") {
		t.Fatalf("odd causal L: %v", err)
	}
	if _, err := NewNCCL(odd, 2, 0, nil); !errors.Is(err, flashattn.ErrInvalidArgument) {
		t.Fatalf("nil comm: %v", err)
	}
	even := localPlan(t, 4, 2, 2, 16, true)
	defer even.Close()
	ring, err := NewLoopback(even, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	one := [][]float32{make([]float32, 128)}
	if err := ring.ExecuteHost(one, one, one, one, nil); err == nil || !strings.Contains(err.Error(), "rank") {
		t.Fatalf("one slice for 2 ranks: %v", err)
	}
	// float32 slices for a bf16 plan: refused (the library would read the copies as bf16).
	half := localPlan(t, 4, 2, 2, 16, true)
	defer half.Close()
	if err := half.SetI64(flashattn.Dtype, int64(flashattn.BF16)); err != nil {
		t.Fatal(err)
	}
	if err := half.Finalize(); err != nil {
		t.Fatal(err)
	}
	halfRing, err := NewLoopback(half, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer halfRing.Close()
	two := [][]float32{make([]float32, 128), make([]float32, 128)}
	if err := halfRing.ExecuteHost(two, two, two, two, nil); err == nil || !strings.Contains(err.Error(), "dtype") {
		t.Fatalf("float32 slices for a bf16 plan: %v", err)
	}
	if got := ShardRows(2, 1, 4, true); len(got) != 4 || got[0] != 2 || got[3] != 5 {
		t.Fatalf("ShardRows(2, 1, 4, causal) = %v", got)
	}
}
