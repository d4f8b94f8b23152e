#!/usr/bin/env bash
# A short device call for a backward change that touches the variants (ALiBi, top-left, sink
# logits): builds this tree's library and the backward / variants / random-grad tests for sm_90
# only, times the backward against torch-flash in the same process (bench/ab_backward.py with this
# library as both A and B: the B/tf column is the anchor to compare with an earlier call's), each
# backward variant against its baseline (flashattn-bench-variants' -bwd backends, where the tree
# has them), and runs the tests with memcheck of the reduced grids, all under DEADLINE (s).
set -uo pipefail
out=${OUT:-/tmp/bvc}; mkdir -p "$out"
deadline=${DEADLINE:-220}
source "$(dirname "$0")/stages.sh"
. "$(dirname "$0")/devdeps-env.sh"; use_devdeps "$PWD"
b=/tmp/bvc-build
tests="test_variants_fa2 test_variants_fa3 test_random_grad_fa2 test_random_grad_fa3 test_backward_fa2 test_backward_fa3"
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF \
  -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real \
  -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/cfg.log" 2>&1 && cmake --build $b --target flashattn $tests -j 16 > "$out/build.log" 2>&1 &&
  { cmake --build $b --target flashattn-bench-variants -j 16 >> "$out/build.log" 2>&1 || true; }
note "build rc=$?"
[ -x $b/tests/test_backward_fa3 ] || { tail -30 "$out/build.log"; exit 1; }
lib=$b/src/libflashattn.so
for gen in fa3 fa2; do
  timeout 40 python3 bench/ab_backward.py --a $lib --b $lib --gen $gen --hdim 64,128 --seqlen 2048,8192 --rounds 1 \
    --markdown "$out/ab-$gen.md" > "$out/ab-$gen.txt" 2>&1; note "ab $gen rc=$?"
done
# Each backward variant against its baseline (where the bench knows backends ending -bwd).
[ -x $b/bench/flashattn-bench-variants ] && LD_LIBRARY_PATH=$b/src timeout 60 $b/bench/flashattn-bench-variants \
  ${VAR_SEQLEN:-8192} 128 fa2-bwd,fa3-bwd > "$out/variants-bwd.md" 2>&1; note "bench-variants bwd rc=$?"
limit=$(( $(left) - 15 ))
for t in $tests; do
  (FLASHATTN_TEST_MIX_CASES=${MIX_CASES:-600} timeout $limit $b/tests/$t > "$out/$t.log" 2>&1; echo "rc=$?" >> "$out/$t.log") &
done
for t in test_variants_fa3 test_random_grad_fa3 test_variants_fa2; do
  (FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout $limit compute-sanitizer --tool memcheck --error-exitcode 99 \
     $b/tests/$t > "$out/memcheck-$t.log" 2>&1; echo "rc=$?" >> "$out/memcheck-$t.log") &
done
wait
for t in $tests; do note "$t $(tail -1 "$out/$t.log") $(grep -aE 'cases checked|PASSED|FAILED' "$out/$t.log" | tail -1 | cut -c1-120)"
  grep -aiE 'fail|reproduce|mismatch' "$out/$t.log" | grep -v "0 failures" | head -4 | sed 's/^/    /'; done
for t in test_variants_fa3 test_random_grad_fa3 test_variants_fa2; do
  note "memcheck $t $(tail -1 "$out/memcheck-$t.log") $(grep -E 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"; done
for gen in fa3 fa2; do echo "== $gen"; grep "^|" "$out/ab-$gen.md" 2>/dev/null | cut -d'|' -f2-9,11-; done
echo "== backward variants / baseline"; grep "^|" "$out/variants-bwd.md" 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
(cd "$out" && tar czf /tmp/bvc-logs.tgz . && find . -type f ! -name '*.md' -delete && mv /tmp/bvc-logs.tgz logs.tgz)
