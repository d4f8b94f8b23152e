//go:build flashattn_cp

package cp

import (
	"errors"
	"math"
	"strings"
	"testing"

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
	if got := ShardRows(2, 1, 4, true); len(got) != 4 || got[0] != 2 || got[3] != 5 {
		t.Fatalf("ShardRows(2, 1, 4, causal) = %v", got)
	}
}
