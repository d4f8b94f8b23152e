// Package cp calls libflashattn_cp, context parallelism (ring attention) over libflashattn:
// one sequence of S = W·L tokens split over W ranks, each holding L rows of Q, K and V
// (contiguous chunks when non-causal, the zigzag layout when causal: ShardRows). EXPERIMENTAL,
// as its C header include/flashattn/flashattn_cp.h says.
//
// The package is built with the build tag flashattn_cp (go build -tags flashattn_cp), since
// libflashattn_cp is an optional library (pkg-config flashattn_cp); without the tag it is empty.
package cp
