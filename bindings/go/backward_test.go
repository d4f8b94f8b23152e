package flashattn

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

// referenceBackward computes float64 gradients of sum(O * dout) on contiguous tensors: dQ, dK, dV.
// P = softmax(S); dS = P (dO·V - dO·O) through the softcap's tanh; dQ = scale dS K, dK = scale dSᵀ Q,
// dV = Pᵀ dO, dK and dV summed over each kv head's query group.
func referenceBackward(q, k, v, dout []float32, s Shape, o Options) ([]float64, []float64, []float64) {
	s = s.resolved()
	scale := refScale(s, o)
	d, dv := s.HeadDim, s.HeadDimV
	dq := make([]float64, s.Batch*s.SeqlenQ*s.HeadsQ*d)
	dk := make([]float64, s.Batch*s.SeqlenK*s.HeadsKV*d)
	dvv := make([]float64, s.Batch*s.SeqlenK*s.HeadsKV*dv)
	for b := 0; b < s.Batch; b++ {
		for h := 0; h < s.HeadsQ; h++ {
			hk := h / (s.HeadsQ / s.HeadsKV)
			qi := func(i, x int) int { return ((b*s.SeqlenQ+i)*s.HeadsQ+h)*d + x }
			ki := func(j, x int) int { return ((b*s.SeqlenK+j)*s.HeadsKV+hk)*d + x }
			vi := func(j, x int) int { return ((b*s.SeqlenK+j)*s.HeadsKV+hk)*dv + x }
			oi := func(i, x int) int { return ((b*s.SeqlenQ+i)*s.HeadsQ+h)*dv + x }
			for i := 0; i < s.SeqlenQ; i++ {
				scores, tanhs, m := scoreRow(q, k, s, o, b, h, hk, i)
				if math.IsInf(m, -1) {
					continue // sees no key: no gradient flows
				}
				sum := 0.0
				for _, sc := range scores {
					sum += math.Exp(sc - m)
				}
				p := make([]float64, len(scores))
				out := make([]float64, dv)
				for j, sc := range scores {
					p[j] = math.Exp(sc-m) / sum
					for x := 0; x < dv; x++ {
						out[x] += p[j] * float64(v[vi(j, x)])
					}
				}
				delta := 0.0
				for x := 0; x < dv; x++ {
					delta += float64(dout[oi(i, x)]) * out[x]
				}
				for j := range scores {
					if p[j] == 0 {
						continue
					}
					dp := 0.0
					for x := 0; x < dv; x++ {
						dp += float64(dout[oi(i, x)]) * float64(v[vi(j, x)])
					}
					ds := p[j] * (dp - delta)
					if o.Softcap > 0 {
						ds *= 1 - tanhs[j]*tanhs[j]
					}
					for x := 0; x < d; x++ {
						dq[qi(i, x)] += scale * ds * float64(k[ki(j, x)])
						dk[ki(j, x)] += scale * ds * float64(q[qi(i, x)])
					}
					for x := 0; x < dv; x++ {
						dvv[vi(j, x)] += p[j] * float64(dout[oi(i, x)])
					}
				}
			}
		}
	}
	return dq, dk, dvv
}

func TestBackwardAgainstReference(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	for _, c := range []struct {
		shape Shape
		opts  Options
	}{
		{Shape{Batch: 2, SeqlenQ: 9, SeqlenK: 13, HeadsQ: 4, HeadsKV: 2, HeadDim: 16}, Options{}},
		{Shape{Batch: 2, SeqlenQ: 13, SeqlenK: 7, HeadsQ: 2, HeadsKV: 2, HeadDim: 16}, Options{Causal: true}},
		{Shape{Batch: 1, SeqlenQ: 11, SeqlenK: 17, HeadsQ: 6, HeadsKV: 1, HeadDim: 16, HeadDimV: 24},
			Options{Window: &[2]int64{4, 2}, Softcap: 2, Scale: 0.4}},
	} {
		s := c.shape.resolved()
		q := randSlice(r, s.Batch*s.SeqlenQ*s.HeadsQ*s.HeadDim)
		k := randSlice(r, s.Batch*s.SeqlenK*s.HeadsKV*s.HeadDim)
		v := randSlice(r, s.Batch*s.SeqlenK*s.HeadsKV*s.HeadDimV)
		dout := randSlice(r, s.Batch*s.SeqlenQ*s.HeadsQ*s.HeadDimV)
		o, lse, err := Attention(q, k, v, c.shape, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		dq, dk, dv, err := AttentionBackward(q, k, v, o, lse, dout, c.shape, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		rq, rk, rv := referenceBackward(q, k, v, dout, c.shape, c.opts)
		assertClose(t, "dQ", dq, rq, 1e-4, 1e-4)
		assertClose(t, "dK", dk, rk, 1e-4, 1e-4)
		assertClose(t, "dV", dv, rv, 1e-4, 1e-4)
	}
}

// The reference is the gradient: central differences of sum(O * dout) through the library's fp32
// forward, on a few entries of Q and K.
func TestBackwardReferenceIsTheGradient(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	shape := Shape{Batch: 1, SeqlenQ: 4, SeqlenK: 5, HeadsQ: 2, HeadsKV: 1, HeadDim: 8}
	opts := Options{Causal: true, Softcap: 2}
	q, k, v, dout := randSlice(r, 64), randSlice(r, 40), randSlice(r, 40), randSlice(r, 64)
	rq, rk, _ := referenceBackward(q, k, v, dout, shape, opts)
	loss := func(q, k []float32) float64 {
		o, _, err := Attention(q, k, v, shape, opts)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for i := range o {
			sum += float64(o[i]) * float64(dout[i])
		}
		return sum
	}
	const eps = 1e-2
	for _, idx := range []int{0, 9, 31, 63} {
		for _, which := range []string{"q", "k"} {
			x, ref := q, rq
			if which == "k" {
				x, ref, idx = k, rk, idx%40
			}
			up, down := append([]float32(nil), x...), append([]float32(nil), x...)
			up[idx] += eps
			down[idx] -= eps
			var fd float64
			if which == "q" {
				fd = (loss(up, k) - loss(down, k)) / (2 * eps)
			} else {
				fd = (loss(q, up) - loss(q, down)) / (2 * eps)
			}
			if math.Abs(fd-ref[idx]) > 3e-3 {
				t.Fatalf("d%s[%d]: finite difference %g, reference %g", which, idx, fd, ref[idx])
			}
		}
	}
}

func TestBackwardVarlenAndStrides(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	cuQ, cuK := []int32{0, 5, 12, 15}, []int32{0, 7, 7, 16} // the second sequence has no keys
	hq, hkv, d := 4, 2, 16
	q, k, v := randSlice(r, 15*hq*d), randSlice(r, 16*hkv*d), randSlice(r, 16*hkv*d)
	dout := randSlice(r, 15*hq*d)
	opts := Options{Causal: true}
	o, lse, err := AttentionVarlen(q, k, v, cuQ, cuK, hq, hkv, d, d, opts)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	// dK in a buffer twice as wide (head stride 2*d): only the even head slots are written.
	for _, kv := range [][2]int64{{int64(Batch), 3}, {int64(SeqlenQ), 7}, {int64(SeqlenK), 9}, {int64(HeadsQ), int64(hq)},
		{int64(HeadsKV), int64(hkv)}, {int64(HeadDim), int64(d)}, {int64(Varlen), 1}, {int64(TotalQ), 15},
		{int64(TotalK), 16}, {int64(Causal), 1}, {int64(Dtype), int64(FP32)}, {int64(BackendParam), int64(BackendCPU)},
		{int64(DKHeadStride), int64(2 * d)}, {int64(DKRowStride), int64(2 * hkv * d)}, {int64(Deterministic), 1}} {
		if err := plan.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := plan.Finalize(); err != nil {
		t.Fatal(err)
	}
	if b, reason, err := plan.BackwardBackend(); err != nil || b != BackendCPU || reason == "" {
		t.Fatalf("backward backend %v %q %v", b, reason, err)
	}
	dq := make([]float32, len(q))
	dkWide := make([]float32, 2*len(k))
	for i := range dkWide {
		dkWide[i] = 7
	}
	dv := make([]float32, len(v))
	if err := plan.BackwardVarlen(q, k, v, o, dout, lse, dq, dkWide, dv, cuQ, cuK, nil); err != nil {
		t.Fatal(err)
	}
	dk := make([]float32, 0, len(k))
	for i := 0; i < len(dkWide); i += 2 * d {
		dk = append(dk, dkWide[i:i+d]...)
		for _, x := range dkWide[i+d : i+2*d] {
			if x != 7 {
				t.Fatal("wrote outside dK's view")
			}
		}
	}
	rq, rk, rv := make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	for s := 0; s < 3; s++ {
		q0, q1, k0, k1 := int(cuQ[s]), int(cuQ[s+1]), int(cuK[s]), int(cuK[s+1])
		if k1 == k0 {
			continue
		}
		a, b, c := referenceBackward(q[q0*hq*d:q1*hq*d], k[k0*hkv*d:k1*hkv*d], v[k0*hkv*d:k1*hkv*d],
			dout[q0*hq*d:q1*hq*d], Shape{Batch: 1, SeqlenQ: q1 - q0, SeqlenK: k1 - k0, HeadsQ: hq, HeadsKV: hkv, HeadDim: d}, opts)
		copy(rq[q0*hq*d:], a)
		copy(rk[k0*hkv*d:], b)
		copy(rv[k0*hkv*d:], c)
	}
	assertClose(t, "dQ", dq, rq, 1e-4, 1e-4)
	assertClose(t, "dK", dk, rk, 1e-4, 1e-4)
	assertClose(t, "dV", dv, rv, 1e-4, 1e-4)
	for _, x := range dq[5*hq*d : 12*hq*d] {
		if x != 0 {
			t.Fatal("dQ of the sequence without keys must be 0")
		}
	}
}

func TestBackwardErrors(t *testing.T) {
	plan := smallPlanParams(t)
	defer plan.Close()
	if _, err := plan.BackwardWorkspaceSize(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("backward workspace size before finalize: %v", err)
	}
	if _, _, err := plan.BackwardBackend(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("backward backend before finalize: %v", err)
	}
	if err := plan.Finalize(); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 128)
	lse := make([]float32, 16)
	dq, dk, dv := make([]float32, 128), make([]float32, 128), make([]float32, 128)
	need, err := plan.BackwardWorkspaceSize()
	if err != nil {
		t.Fatal(err)
	}
	if need > 0 {
		err := plan.Backward(x, x, x, x, x, lse, dq, dk, dv, NewWorkspace(need-1))
		var fe *Error
		if !errors.As(err, &fe) || fe.Status != StatusInsufficientWorkspace || fe.Message == "" ||
			fe.Op != "flashattn_plan_execute_backward" {
			t.Fatalf("small workspace: %v", err)
		}
	}
	if err := plan.Backward(x, x, x, x, x, lse, dq[:100], dk, dv, nil); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "dq: the slice holds 100") {
		t.Fatalf("short dq: %v", err)
	}
	if err := plan.Backward(x, x, x, x, x, lse[:3], dq, dk, dv, nil); err == nil || !strings.Contains(err.Error(), "lse") {
		t.Fatalf("short lse: %v", err)
	}
	if err := plan.Backward(x, x, x, x, make([]Float16, 128), lse, dq, dk, dv, nil); err == nil ||
		!strings.Contains(err.Error(), "dout") {
		t.Fatalf("wrong dtype: %v", err)
	}
	if err := plan.BackwardVarlen(x, x, x, x, x, lse, dq, dk, dv, []int32{0, 8}, []int32{0, 8}, nil); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("varlen call on a fixed plan: %v", err)
	}
}
