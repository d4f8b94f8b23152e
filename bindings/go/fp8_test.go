package flashattn

import (
	"math"
	"strings"
	"testing"
	"unsafe"
)

// FP8 (E4M3) inputs through ExecuteArgs on the CPU backend (since 0.3): per-head descales, O in
// bf16, against a float64 reference that decodes E4M3 here from its definition.
func e4m3Value(b uint8) float64 {
	e, m := int(b>>3)&15, float64(b&7)
	v := math.Ldexp(1+m/8, e-7)
	if e == 0 {
		v = math.Ldexp(m/8, -6)
	}
	if b&0x80 != 0 {
		return -v
	}
	return v
}

func TestFP8Forward(t *testing.T) {
	const b, s, hq, hk, d = 2, 5, 2, 1, 16
	p, err := NewPlan()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, kv := range [][2]int64{{int64(Batch), b}, {int64(SeqlenQ), s}, {int64(SeqlenK), s}, {int64(HeadsQ), hq},
		{int64(HeadsKV), hk}, {int64(HeadDim), d}, {int64(Dtype), int64(FP8E4M3)}, {int64(BackendParam), int64(BackendCPU)}} {
		if err := p.SetI64(I64Param(kv[0]), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Finalize(); err != nil {
		t.Fatal(err)
	}
	if od, _ := p.GetI64(OutputDType); od != int64(BF16) {
		t.Fatalf("OutputDType = %d, want BF16", od)
	}
	n := b * s * hq * d
	q, k, v := make([]uint8, n), make([]uint8, b*s*hk*d), make([]uint8, b*s*hk*d)
	x := uint32(12345)
	next := func() uint8 { // finite codes of magnitude <= 2 (exponent <= 7)
		x = x*1664525 + 1013904223
		c := uint8(x >> 24)
		return c & 0xbf
	}
	for i := range q {
		q[i] = next()
	}
	for i := range k {
		k[i], v[i] = next(), next()
	}
	dq, dk, dv := []float32{0.5, 1.5}, []float32{1.25, 0.75}, []float32{2, 0.5}
	o := make([]BFloat16, n)
	ws, _ := p.WorkspaceSize()
	w := NewWorkspace(ws)
	tens := &Tensors{Q: unsafe.Pointer(&q[0]), K: unsafe.Pointer(&k[0]), V: unsafe.Pointer(&v[0]), O: unsafe.Pointer(&o[0]),
		DescaleQ: unsafe.Pointer(&dq[0]), DescaleK: unsafe.Pointer(&dk[0]), DescaleV: unsafe.Pointer(&dv[0])}
	if err := p.ExecuteArgs(tens, w.ptr(), uintptr(w.Len()), nil); err != nil {
		t.Fatal(err)
	}
	for bi := 0; bi < b; bi++ {
		for h := 0; h < hq; h++ {
			for i := 0; i < s; i++ {
				sc := make([]float64, s)
				m := math.Inf(-1)
				for j := 0; j < s; j++ {
					dot := 0.0
					for c := 0; c < d; c++ {
						dot += e4m3Value(q[((bi*s+i)*hq+h)*d+c]) * float64(dq[bi]) * e4m3Value(k[(bi*s+j)*d+c]) * float64(dk[bi])
					}
					sc[j] = dot / math.Sqrt(d)
					m = math.Max(m, sc[j])
				}
				for c := 0; c < d; c++ {
					num, den := 0.0, 0.0
					for j := 0; j < s; j++ {
						e := math.Exp(sc[j] - m)
						den += e
						num += e * e4m3Value(v[(bi*s+j)*d+c]) * float64(dv[bi])
					}
					want := num / den
					got := float64(math.Float32frombits(uint32(o[((bi*s+i)*hq+h)*d+c]) << 16))
					if math.Abs(got-want) > math.Abs(want)/256+1e-5*(1+math.Abs(want)) {
						t.Fatalf("O[%d,%d,%d,%d] = %g, want %g", bi, i, h, c, got, want)
					}
				}
			}
		}
	}
	// A missing descale is refused, naming it.
	tens.DescaleV = nil
	if err := p.ExecuteArgs(tens, w.ptr(), uintptr(w.Len()), nil); err == nil || !strings.Contains(err.Error(), "descale_v") {
		t.Fatalf("missing descale_v: %v", err)
	}
}

// RotateHadamard keeps Q·Kᵀ and moves the rows (against a float64 product of the scores).
func TestRotateHadamard(t *testing.T) {
	const n, d = 6, 64
	q, k := make([]float32, n*d), make([]float32, n*d)
	for i := range q {
		q[i], k[i] = float32(math.Sin(float64(i))), float32(math.Cos(float64(3*i)))
	}
	qr, kr := append([]float32(nil), q...), append([]float32(nil), k...)
	if err := RotateHadamard(qr, d, 7); err != nil {
		t.Fatal(err)
	}
	if err := RotateHadamard(kr, d, 7); err != nil {
		t.Fatal(err)
	}
	moved := 0.0
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			s, sr := 0.0, 0.0
			for c := 0; c < d; c++ {
				s += float64(q[i*d+c]) * float64(k[j*d+c])
				sr += float64(qr[i*d+c]) * float64(kr[j*d+c])
			}
			if math.Abs(s-sr) > 1e-4 {
				t.Fatalf("score (%d,%d): %g before, %g after", i, j, s, sr)
			}
		}
		moved += math.Abs(float64(qr[i*d] - q[i*d]))
	}
	if moved == 0 {
		t.Fatal("the rotation changed nothing")
	}
	if err := RotateHadamard(make([]float32, 96), 96, 1); err == nil || !strings.Contains(err.Error(), "dim") {
		t.Fatalf("dim 96: %v", err)
	}
}
