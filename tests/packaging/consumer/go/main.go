// A user's own Go program (module example.com/attention-app) calling the binding by its module
// path: causal GQA attention with seqlen_q != seqlen_k on the CPU backend, every output element
// checked against a float64 reference computed here. tests/packaging/test-installed-prefix.sh
// builds it against an installed, relocated libflashattn.
package main

import (
	"fmt"
	"math"
	"math/rand"
	"os"

	flashattn "github.com/libflashattn/libflashattn/bindings/go"
)

func main() {
	shape := flashattn.Shape{Batch: 2, SeqlenQ: 37, SeqlenK: 53, HeadsQ: 6, HeadsKV: 2, HeadDim: 40}
	r := rand.New(rand.NewSource(int64(os.Getpid())))
	random := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
		return s
	}
	b, sq, sk, hq, hkv, d := shape.Batch, shape.SeqlenQ, shape.SeqlenK, shape.HeadsQ, shape.HeadsKV, shape.HeadDim
	q, k, v := random(b*sq*hq*d), random(b*sk*hkv*d), random(b*sk*hkv*d)
	o, lse, err := flashattn.Attention(q, k, v, shape, flashattn.Options{Causal: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "attention:", err)
		os.Exit(1)
	}
	worst := 0.0
	for bi := 0; bi < b; bi++ {
		for h := 0; h < hq; h++ {
			kh := h / (hq / hkv)
			for i := 0; i < sq; i++ {
				last := i + sk - sq // bottom-right causal: key j is visible when j <= last
				scores := make([]float64, sk)
				maxS := math.Inf(-1)
				for j := 0; j <= last && j < sk; j++ {
					dot := 0.0
					for c := 0; c < d; c++ {
						dot += float64(q[((bi*sq+i)*hq+h)*d+c]) * float64(k[((bi*sk+j)*hkv+kh)*d+c])
					}
					scores[j] = dot / math.Sqrt(float64(d))
					maxS = math.Max(maxS, scores[j])
				}
				sum := 0.0
				for j := 0; j <= last && j < sk; j++ {
					sum += math.Exp(scores[j] - maxS)
				}
				for c := 0; c < d; c++ {
					acc := 0.0
					for j := 0; j <= last && j < sk; j++ {
						acc += math.Exp(scores[j]-maxS) / sum * float64(v[((bi*sk+j)*hkv+kh)*d+c])
					}
					worst = math.Max(worst, math.Abs(float64(o[((bi*sq+i)*hq+h)*d+c])-acc))
				}
				worst = math.Max(worst, math.Abs(float64(lse[(bi*hq+h)*sq+i])-(maxS+math.Log(sum))))
			}
		}
	}
	if worst > 1e-4 || math.IsNaN(worst) {
		fmt.Fprintf(os.Stderr, "max error %.3g against the float64 reference\n", worst)
		os.Exit(1)
	}
	fmt.Printf("ok libflashattn %s: max error %.2g against float64\n", flashattn.VersionString(), worst)
}
