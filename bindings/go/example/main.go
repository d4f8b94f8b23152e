// Causal attention with GQA over random fp32 host tensors on the CPU backend.
//
//	PKG_CONFIG_PATH=<dir of flashattn.pc> LD_LIBRARY_PATH=build/src go run ./example
package main

import (
	"errors"
	"fmt"
	"log"
	"math/rand"

	flashattn "github.com/libflashattn/libflashattn/bindings/go"
)

func main() {
	shape := flashattn.Shape{Batch: 2, SeqlenQ: 128, SeqlenK: 128, HeadsQ: 8, HeadsKV: 2, HeadDim: 64}
	r := rand.New(rand.NewSource(0))
	random := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
		return s
	}
	q, k, v := random(2*128*8*64), random(2*128*2*64), random(2*128*2*64)

	// One call.
	o, lse, err := flashattn.Attention(q, k, v, shape, flashattn.Options{Causal: true})
	if err != nil {
		log.Fatal(err)
	}

	// The same through a plan: create, set, finalize, execute (any number of times), close.
	plan, err := flashattn.NewPlan()
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()
	for _, kv := range []struct {
		key   flashattn.I64Param
		value int64
	}{{flashattn.Batch, 2}, {flashattn.SeqlenQ, 128}, {flashattn.SeqlenK, 128}, {flashattn.HeadsQ, 8},
		{flashattn.HeadsKV, 2}, {flashattn.HeadDim, 64}, {flashattn.Dtype, int64(flashattn.FP32)},
		{flashattn.Causal, 1}, {flashattn.BackendParam, int64(flashattn.BackendCPU)}} {
		if err := plan.SetI64(kv.key, kv.value); err != nil {
			log.Fatal(err)
		}
	}
	if err := plan.Finalize(); err != nil {
		log.Fatal(err)
	}
	backend, reason, _ := plan.Backend()
	size, _ := plan.WorkspaceSize()
	workspace := flashattn.NewWorkspace(size)
	o2 := make([]float32, len(o))
	if err := plan.Execute(q, k, v, o2, nil, workspace); err != nil {
		log.Fatal(err)
	}
	same := true
	for i := range o {
		same = same && o[i] == o2[i]
	}
	fmt.Printf("libflashattn %s (%s), backend %s: %s\n", flashattn.VersionString(), flashattn.BuildInfo(), backend, reason)
	fmt.Printf("o[0:4] = %v, lse[0] = %v, plan == Attention: %v\n", o[:4], lse[0], same)
	if !same {
		log.Fatal("plan and Attention disagree")
	}

	// Errors carry the status and the library's message.
	err = plan.SetI64(flashattn.HeadDim, 12)
	fmt.Println("expected error:", err, "| is ErrInvalidArgument:", errors.Is(err, flashattn.ErrInvalidArgument))
}
