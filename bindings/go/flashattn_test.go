package flashattn

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// refScale is the softmax scale of o for the resolved shape s.
func refScale(s Shape, o Options) float64 {
	if o.Scale == 0 {
		return 1 / math.Sqrt(float64(s.HeadDim))
	}
	return o.Scale
}

// scoreRow is row i of the masked scores scale·q·kᵀ (through the softcap) of query head h and kv
// head hk in batch b on contiguous tensors (s resolved): the scores (-Inf where masked), each key's
// tanh(score/softcap) (0 without a softcap) and the row's maximum (-Inf when it sees no key).
func scoreRow(q, k []float32, s Shape, o Options, b, h, hk, i int) ([]float64, []float64, float64) {
	left, right := int64(-1), int64(-1)
	if o.Window != nil {
		left, right = o.Window[0], o.Window[1]
	}
	scale, d := refScale(s, o), s.HeadDim
	diag := int64(i + s.SeqlenK - s.SeqlenQ)
	scores := make([]float64, s.SeqlenK)
	tanhs := make([]float64, s.SeqlenK)
	m := math.Inf(-1)
	for j := range scores {
		j64 := int64(j)
		if (o.Causal && j64 > diag) || (left >= 0 && j64 < diag-left) || (right >= 0 && j64 > diag+right) {
			scores[j] = math.Inf(-1)
			continue
		}
		dot := 0.0
		for x := 0; x < d; x++ {
			dot += float64(q[((b*s.SeqlenQ+i)*s.HeadsQ+h)*d+x]) * float64(k[((b*s.SeqlenK+j)*s.HeadsKV+hk)*d+x])
		}
		sc := dot * scale
		if o.Softcap > 0 {
			tanhs[j] = math.Tanh(sc / o.Softcap)
			sc = o.Softcap * tanhs[j]
		}
		scores[j] = sc
		m = math.Max(m, sc)
	}
	return scores, tanhs, m
}

// reference computes float64 attention on contiguous tensors: O and LSE [b, hq, sq].
func reference(q, k, v []float32, s Shape, o Options) ([]float64, []float64) {
	s = s.resolved()
	out := make([]float64, s.Batch*s.SeqlenQ*s.HeadsQ*s.HeadDimV)
	lse := make([]float64, s.Batch*s.HeadsQ*s.SeqlenQ)
	dv := s.HeadDimV
	for b := 0; b < s.Batch; b++ {
		for h := 0; h < s.HeadsQ; h++ {
			hk := h / (s.HeadsQ / s.HeadsKV)
			for i := 0; i < s.SeqlenQ; i++ {
				scores, _, m := scoreRow(q, k, s, o, b, h, hk, i)
				li := (b*s.HeadsQ+h)*s.SeqlenQ + i
				if math.IsInf(m, -1) {
					lse[li] = m
					continue
				}
				sum := 0.0
				for _, sc := range scores {
					sum += math.Exp(sc - m)
				}
				lse[li] = math.Log(sum) + m
				for j, sc := range scores {
					p := math.Exp(sc-m) / sum
					for x := 0; x < dv; x++ {
						out[((b*s.SeqlenQ+i)*s.HeadsQ+h)*dv+x] += p * float64(v[((b*s.SeqlenK+j)*s.HeadsKV+hk)*dv+x])
					}
				}
			}
		}
	}
	return out, lse
}

func assertClose(t *testing.T, what string, got []float32, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := float64(got[i]), want[i]
		if math.IsInf(w, 0) {
			if g != w {
				t.Fatalf("%s[%d] = %g, want %g", what, i, g, w)
			}
			continue
		}
		if math.Abs(g-w) > atol+rtol*math.Abs(w) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, g, w)
		}
	}
}

func TestAgainstReference(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	shape := Shape{Batch: 2, SeqlenQ: 13, SeqlenK: 21, HeadsQ: 4, HeadsKV: 2, HeadDim: 16, HeadDimV: 24}
	q := randSlice(r, 2*13*4*16)
	k := randSlice(r, 2*21*2*16)
	v := randSlice(r, 2*21*2*24)
	for _, opts := range []Options{
		{},
		{Causal: true},
		{Window: &[2]int64{4, 1}, Softcap: 3, Scale: 0.3},
		{Causal: true, Window: &[2]int64{3, -1}},
	} {
		o, lse, err := Attention(q, k, v, shape, opts)
		if err != nil {
			t.Fatal(err)
		}
		ro, rl := reference(q, k, v, shape, opts)
		assertClose(t, "O", o, ro, 2e-5, 2e-5)
		assertClose(t, "LSE", lse, rl, 1e-4, 1e-5)
	}
}

func readReference(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data[:8]) != "FAREF01\n" {
		t.Fatalf("%s: not a reference file", path)
	}
	pos := 8
	i64 := func() int64 { v := int64(binary.LittleEndian.Uint64(data[pos:])); pos += 8; return v }
	f64 := func() float64 { v := math.Float64frombits(binary.LittleEndian.Uint64(data[pos:])); pos += 8; return v }
	i32s := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = int32(binary.LittleEndian.Uint32(data[pos:]))
			pos += 4
		}
		return s
	}
	f32s := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[pos:]))
			pos += 4
		}
		return s
	}
	ncases := i64()
	if ncases < 3 {
		t.Fatalf("%d cases", ncases)
	}
	for c := int64(0); c < ncases; c++ {
		p := make([]int64, 16)
		for i := range p {
			p[i] = i64()
		}
		softcap, scale := f64(), f64()
		batch, sq, sk, hq, hkv, d, dv := int(p[0]), int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6])
		opts := Options{Causal: p[7] == 1, Window: &[2]int64{p[8], p[9]}, Softcap: softcap, Scale: scale}
		varlen := p[10] == 1
		var cuQ, cuK []int32
		rowsQ, rowsK := batch*sq, batch*sk
		if varlen {
			cuQ, cuK = i32s(batch+1), i32s(batch+1)
			rowsQ, rowsK = int(p[11]), int(p[12])
		}
		q, k, v := f32s(rowsQ*hq*d), f32s(rowsK*hkv*d), f32s(rowsK*hkv*dv)
		oRef, lseRef := f32s(rowsQ*hq*dv), f32s(rowsQ*hq)
		var o, lse []float32
		var err error
		if varlen {
			o, lse, err = AttentionVarlen(q, k, v, cuQ, cuK, hq, hkv, d, dv, opts)
		} else {
			o, lse, err = Attention(q, k, v, Shape{batch, sq, sk, hq, hkv, d, dv}, opts)
		}
		if err != nil {
			t.Fatalf("case %d: %v", c, err)
		}
		want := func(s []float32) []float64 {
			w := make([]float64, len(s))
			for i, x := range s {
				w[i] = float64(x)
			}
			return w
		}
		assertClose(t, "O", o, want(oRef), 1e-6, 1e-5)
		assertClose(t, "LSE", lse, want(lseRef), 1e-6, 1e-6)
	}
	if pos != len(data) {
		t.Fatalf("trailing bytes: %d of %d read", pos, len(data))
	}
}

// The cross-language check: reproduce the C API's outputs stored by bindings/common/make_reference.c.
func TestReferenceFile(t *testing.T) {
	path := os.Getenv("FLASHATTN_REFERENCE_FILE")
	if path == "" {
		t.Skip("FLASHATTN_REFERENCE_FILE is not set (CTest sets it)")
	}
	readReference(t, path)
}

func TestHalfPrecision(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	shape := Shape{Batch: 1, SeqlenQ: 8, SeqlenK: 8, HeadsQ: 2, HeadDim: 16}
	q, k, v := randSlice(r, 256), randSlice(r, 256), randSlice(r, 256)
	toBF := func(s []float32) []BFloat16 {
		out := make([]BFloat16, len(s))
		for i, x := range s {
			out[i] = BFloat16(math.Float32bits(x) >> 16) // truncation is fine for a test input
		}
		return out
	}
	qb, kb, vb := toBF(q), toBF(k), toBF(v)
	o, _, err := Attention(qb, kb, vb, shape, Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	back := func(s []BFloat16) []float32 {
		out := make([]float32, len(s))
		for i, x := range s {
			out[i] = math.Float32frombits(uint32(x) << 16)
		}
		return out
	}
	ro, _ := reference(back(qb), back(kb), back(vb), shape, Options{Causal: true})
	assertClose(t, "bf16 O", back(o), ro, 2e-2, 2e-2)
}

func TestVarlen(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	cuQ, cuK := []int32{0, 4, 4, 11}, []int32{0, 6, 9, 9}
	q, k, v := randSlice(r, 11*2*8), randSlice(r, 9*1*8), randSlice(r, 9*1*8)
	o, lse, err := AttentionVarlen(q, k, v, cuQ, cuK, 2, 1, 8, 0, Options{Causal: true})
	if err != nil {
		t.Fatal(err)
	}
	// sequence 0 against the fixed-length reference; sequence 2 has no keys
	ro, rl := reference(q[:4*16], k[:6*8], v[:6*8], Shape{Batch: 1, SeqlenQ: 4, SeqlenK: 6, HeadsQ: 2, HeadsKV: 1, HeadDim: 8}, Options{Causal: true})
	assertClose(t, "O", o[:4*16], ro, 2e-5, 2e-5)
	for h := 0; h < 2; h++ {
		assertClose(t, "LSE", lse[h*11:h*11+4], rl[h*4:h*4+4], 1e-4, 1e-5)
		for i := 4; i < 11; i++ {
			if !math.IsInf(float64(lse[h*11+i]), -1) {
				t.Fatalf("row %d of a sequence without keys: LSE %g", i, lse[h*11+i])
			}
		}
	}
	for _, x := range o[4*16:] {
		if x != 0 {
			t.Fatal("O of rows without keys must be 0")
		}
	}
}

func TestErrors(t *testing.T) {
	plan, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	err = plan.SetI64(HeadDim, 12)
	var fe *Error
	if !errors.As(err, &fe) || fe.Status != StatusInvalidArgument || !strings.Contains(fe.Message, "multiple of 8") {
		t.Fatalf("got %v", err)
	}
	if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrInvalidState) {
		t.Fatal("errors.Is does not match by status")
	}
	if !strings.Contains(err.Error(), "invalid argument") || !strings.Contains(err.Error(), "flashattn_plan_set_i64") {
		t.Fatalf("message %q", err.Error())
	}
	if err := plan.Finalize(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("finalize of an empty plan: %v", err)
	}
	if _, err := plan.WorkspaceSize(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("workspace size before finalize: %v", err)
	}
	if err := plan.SetF64(SoftmaxScale, -1); err == nil || !strings.Contains(err.Error(), "> 0") {
		t.Fatalf("negative scale: %v", err)
	}
	x := make([]float32, 64)
	if _, _, err := Attention(x, x, x, Shape{Batch: 1, SeqlenQ: 4, SeqlenK: 4, HeadsQ: 3, HeadsKV: 2, HeadDim: 8}, Options{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("heads not a multiple: %v", err)
	}
}

// smallPlanParams is a plan with the sizes of smallPlan set, not yet finalized.
func smallPlanParams(t testing.TB) *Plan {
	plan, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]int64{{int64(Batch), 1}, {int64(SeqlenQ), 8}, {int64(SeqlenK), 8}, {int64(HeadsQ), 2},
		{int64(HeadDim), 8}, {int64(Dtype), int64(FP32)}, {int64(BackendParam), int64(BackendCPU)}} {
		if err := plan.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	return plan
}

func smallPlan(t testing.TB) *Plan {
	plan := smallPlanParams(t)
	if err := plan.Finalize(); err != nil {
		t.Fatal(err)
	}
	return plan
}

func TestPlanChecksHostSlices(t *testing.T) {
	plan := smallPlan(t)
	defer plan.Close()
	e, err := plan.Extents()
	if err != nil || e.Q != 128 || e.LSE != 16 {
		t.Fatalf("extents %+v %v", e, err)
	}
	x := make([]float32, e.Q)
	o := make([]float32, e.O)
	if err := plan.Execute(x, x, x, o, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := plan.Execute(x[:10], x, x, o, nil, nil); err == nil || !strings.Contains(err.Error(), "q: the slice holds 10") {
		t.Fatalf("short q: %v", err)
	}
	if err := plan.Execute(make([]Float16, 128), x, x, o, nil, nil); err == nil || !strings.Contains(err.Error(), "dtype") {
		t.Fatalf("wrong dtype: %v", err)
	}
	if err := plan.Execute([]float64{1}, x, x, o, nil, nil); err == nil {
		t.Fatal("[]float64 accepted")
	}
	if err := plan.Execute(x, x, x, o, nil, NewWorkspace(8)); !errors.Is(err, ErrInsufficientWorkspace) {
		t.Fatalf("small workspace: %v", err)
	}
	if err := plan.ExecuteVarlen(x, x, x, o, nil, []int32{0, 8}, []int32{0, 8}, nil); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("varlen call on a fixed plan: %v", err)
	}
	b, reason, err := plan.Backend()
	if err != nil || b != BackendCPU || reason == "" {
		t.Fatalf("backend %v %q %v", b, reason, err)
	}
	plan.Close()
	plan.Close()
	if err := plan.Finalize(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("use after close: %v", err)
	}
}

func TestCloseAndFinalizersInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	plans := make([]*Plan, 40)
	for i := range plans {
		plans[i] = smallPlan(t)
	}
	for _, i := range r.Perm(len(plans)) {
		if i%3 == 0 {
			plans[i].Close()
		}
		if i%2 == 0 {
			plans[i] = nil // left to the finalizer (closed or not)
		}
	}
	runtime.GC()
	runtime.GC()
	for _, p := range plans {
		p.Close() // nil plans and closed plans are fine
	}
	for i := 0; i < 100; i++ {
		p, _ := NewPlan()
		_ = p
	}
	runtime.GC()
	runtime.GC()
}

func TestConcurrentExecute(t *testing.T) {
	plan := smallPlan(t)
	defer plan.Close()
	r := rand.New(rand.NewSource(5))
	q, k, v := randSlice(r, 128), randSlice(r, 128), randSlice(r, 128)
	want, _ := reference(q, k, v, Shape{Batch: 1, SeqlenQ: 8, SeqlenK: 8, HeadsQ: 2, HeadDim: 8}, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := make([]float32, 128)
			for i := 0; i < 20; i++ {
				if err := plan.Execute(q, k, v, o, nil, nil); err != nil {
					errs <- err
					return
				}
				// errors stay per call even though goroutines move between threads
				if err := plan.Execute(q, k, v, o, nil, NewWorkspace(1)); err == nil || !strings.Contains(err.Error(), "workspace") {
					errs <- err
					return
				}
			}
			for i := range o {
				if math.Abs(float64(o[i])-want[i]) > 2e-5 {
					errs <- &Error{Message: "wrong value"}
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestInfo(t *testing.T) {
	if major, _, _ := Version(); major != 0 {
		t.Fatalf("major %d", major)
	}
	if !strings.Contains(BuildInfo(), "backends=cpu") || strings.Count(VersionString(), ".") != 2 {
		t.Fatal(BuildInfo(), VersionString())
	}
	if n, err := DeviceCount(); err != nil || n < 0 {
		t.Fatal(n, err)
	}
	if StatusInvalidArgument.String() != "invalid argument" {
		t.Fatal(StatusInvalidArgument.String())
	}
}
