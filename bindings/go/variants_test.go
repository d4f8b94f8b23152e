package flashattn

import (
	"math"
	"math/rand"
	"testing"
)

// refCausal is O and LSE ([b][h][sq]) of causal attention (diagonal key i + off) on contiguous
// float32 tensors with heads_q == heads_kv, optional per-head sink logits and ALiBi slopes.
func refCausal(q, k, v []float32, b, sq, sk, h, d, off int, sinks, slopes []float32) ([]float64, []float64) {
	o := make([]float64, b*sq*h*d)
	lse := make([]float64, b*h*sq)
	for bi := 0; bi < b; bi++ {
		for hi := 0; hi < h; hi++ {
			for i := 0; i < sq; i++ {
				diag := i + off
				var js []int
				var ss []float64
				m := math.Inf(-1)
				if sinks != nil {
					m = float64(sinks[hi])
				}
				for j := 0; j < sk && j <= diag; j++ {
					dot := 0.0
					for x := 0; x < d; x++ {
						dot += float64(q[((bi*sq+i)*h+hi)*d+x]) * float64(k[((bi*sk+j)*h+hi)*d+x])
					}
					s := dot / math.Sqrt(float64(d))
					if slopes != nil {
						s -= float64(slopes[hi]) * math.Abs(float64(diag-j))
					}
					js, ss = append(js, j), append(ss, s)
					m = math.Max(m, s)
				}
				li := (bi*h+hi)*sq + i
				if math.IsInf(m, -1) {
					lse[li] = m
					continue
				}
				l := 0.0
				if sinks != nil {
					l = math.Exp(float64(sinks[hi]) - m)
				}
				for _, s := range ss {
					l += math.Exp(s - m)
				}
				for n, j := range js {
					p := math.Exp(ss[n]-m) / l
					for x := 0; x < d; x++ {
						o[((bi*sq+i)*h+hi)*d+x] += p * float64(v[((bi*sk+j)*h+hi)*d+x])
					}
				}
				lse[li] = m + math.Log(l)
			}
		}
	}
	return o, lse
}

func variantPlan(t *testing.T, b, sq, sk, h, d int, align MaskAlign, sinks, alibi int64) *Plan {
	p, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []struct {
		k I64Param
		v int64
	}{{Batch, int64(b)}, {SeqlenQ, int64(sq)}, {SeqlenK, int64(sk)}, {HeadsQ, int64(h)}, {HeadDim, int64(d)},
		{Dtype, int64(FP32)}, {BackendParam, int64(BackendCPU)}, {Causal, 1}, {MaskAlignParam, int64(align)},
		{SinkLogits, sinks}, {Alibi, alibi}} {
		if err := p.SetI64(kv.k, kv.v); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Finalize(); err != nil {
		t.Fatal(err)
	}
	return p
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if math.IsInf(want[i], -1) {
			if !math.IsInf(float64(got[i]), -1) {
				t.Fatalf("%s[%d] = %g, want -inf", what, i, got[i])
			}
		} else if math.Abs(float64(got[i])-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

func TestSinksAndAlibi(t *testing.T) {
	r := rand.New(rand.NewSource(19))
	b, sq, sk, h, d := 2, 7, 11, 3, 16
	q, k, v := randSlice(r, b*sq*h*d), randSlice(r, b*sk*h*d), randSlice(r, b*sk*h*d)
	sinks, slopes := []float32{0.5, -1, 2}, []float32{0.5, 0.25, 0.125}
	p := variantPlan(t, b, sq, sk, h, d, MaskAlignTopLeft, 1, 1)
	defer p.Close()
	o, lse := make([]float32, len(q)), make([]float32, b*h*sq)
	if err := p.ExecuteVariants(q, k, v, o, lse, nil, nil, Variants{SinkLogits: sinks, AlibiSlopes: slopes}, nil); err != nil {
		t.Fatal(err)
	}
	ro, rl := refCausal(q, k, v, b, sq, sk, h, d, 0, sinks, slopes)
	closeTo(t, "O", o, ro, 1e-5)
	closeTo(t, "LSE", lse, rl, 1e-5)
	if err := p.Execute(q, k, v, o, nil, nil); err == nil {
		t.Fatal("Execute ran a plan that needs sink logits")
	}
	// The backward's sink gradient, against central differences through the reference.
	g := randSlice(r, len(q))
	dq, dk, dv, dsink := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v)), make([]float32, h)
	x := Variants{SinkLogits: sinks, AlibiSlopes: slopes, DSinkLogits: dsink}
	if err := p.BackwardVariants(q, k, v, o, g, lse, dq, dk, dv, nil, nil, x, nil); err != nil {
		t.Fatal(err)
	}
	for hi := 0; hi < h; hi++ {
		loss := func(delta float32) float64 {
			s := append([]float32(nil), sinks...)
			s[hi] += delta
			ro, _ := refCausal(q, k, v, b, sq, sk, h, d, 0, s, slopes)
			sum := 0.0
			for i := range ro {
				sum += ro[i] * float64(g[i])
			}
			return sum
		}
		const eps = 1.0 / 64 // exact in float32
		fd := (loss(eps) - loss(-eps)) / (2 * eps)
		if math.Abs(float64(dsink[hi])-fd) > 2e-3*(1+math.Abs(fd)) {
			t.Fatalf("dsink[%d] = %g, finite differences %g", hi, dsink[hi], fd)
		}
	}
}

func TestMergeStates(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	b, s, h, d, cut := 2, 12, 2, 8, 5
	q, k, v := randSlice(r, b*s*h*d), randSlice(r, b*s*h*d), randSlice(r, b*s*h*d)
	part := func(x []float32, from, to int) []float32 {
		var out []float32
		for bi := 0; bi < b; bi++ {
			out = append(out, x[(bi*s+from)*h*d:(bi*s+to)*h*d]...)
		}
		return out
	}
	run := func(from, to int, align MaskAlign) (*Plan, []float32, []float32) {
		p := variantPlan(t, b, s, to-from, h, d, align, 0, 0)
		o, lse := make([]float32, len(q)), make([]float32, b*h*s)
		if err := p.Execute(q, part(k, from, to), part(v, from, to), o, lse, nil); err != nil {
			t.Fatal(err)
		}
		return p, o, lse
	}
	p1, o1, l1 := run(0, cut, MaskAlignTopLeft)
	defer p1.Close()
	p2, o2, l2 := run(cut, s, MaskAlignBottomRight)
	defer p2.Close()
	o, lse := make([]float32, len(q)), make([]float32, b*h*s)
	if err := p1.MergeStates([]interface{}{o1, o2}, [][]float32{l1, l2}, o, lse); err != nil {
		t.Fatal(err)
	}
	ro, rl := refCausal(q, k, v, b, s, s, h, d, 0, nil, nil)
	closeTo(t, "O", o, ro, 1e-5)
	closeTo(t, "LSE", lse, rl, 1e-5)
}
