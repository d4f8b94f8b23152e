#!/usr/bin/env bash
# Issue 19's check on the H200, in one device call: build (tests/gpu/h200-check.sh build, plus the
# opt-in flashattn-bench-variants), the variants tests on cpu/fa2/fa3 and test_fa3_sass, the
# forward numerics on the reduced grid, compute-sanitizer (memcheck, racecheck, synccheck) on
# test_variants_<gen> for each generation in SANITIZE_GENS (reduced grid, FA3 on 3 CTAs, each tool
# bounded by SANITIZE_LIMIT seconds), then the variants bench (BENCH_RUNS: "seqlen:d:backends[:dv]"
# items). Logs under $OUT; a short summary last.
#
#   BUILD_DIR=/tmp/fa-var OUT=$OUT bash tests/gpu/variants-check.sh
set -uo pipefail
out=${OUT:-/tmp/variants-out}
build=${BUILD_DIR:-/tmp/fa-variants}
mkdir -p "$out"
summary=()
note() { summary+=("$1"); echo "== $1"; }

OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/h200-build.txt" 2>&1
note "$(grep -E '^== build' "$out/h200-build.txt")"
cmake --build "$build" --target flashattn-bench-variants -j 16 > "$out/build-bench.log" 2>&1
note "bench-variants build rc=$?"
if [ -d .devdeps/root ]; then
  export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi

ctest --test-dir "$build" --output-on-failure -j 4 -R "${CTEST_RE:-^test_variants_(cpu|fa2|fa3)$|^test_fa3_sass$}" \
  > "$out/ctest.log" 2>&1
note "ctest rc=$? $(grep -E 'tests passed' "$out/ctest.log")"
for gen in ${NUMERICS_GENS:-fa3}; do
  FLASHATTN_TEST_REDUCED=1 "$build/tests/test_numerics_$gen" > "$out/numerics-$gen.log" 2>&1
  note "test_numerics_$gen reduced rc=$? $(tail -1 "$out/numerics-$gen.log")"
done

pids=()
for gen in ${SANITIZE_GENS:-fa3}; do
  for tool in memcheck racecheck synccheck; do
    ( FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout "${SANITIZE_LIMIT:-120}" compute-sanitizer \
        --tool $tool --error-exitcode 99 "$build/tests/test_variants_$gen" > "$out/sanitize-$gen-$tool.log" 2>&1
      echo "rc=$?" >> "$out/sanitize-$gen-$tool.log" ) &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
for gen in ${SANITIZE_GENS:-fa3}; do
  for tool in memcheck racecheck synccheck; do
    log="$out/sanitize-$gen-$tool.log"
    note "compute-sanitizer $tool variants $gen $(tail -1 "$log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  done
done

n=0
for run in ${BENCH_RUNS:-8192:128:fa2,fa3 8192:192:fa3:128}; do
  IFS=: read -r s d be dv <<< "$run"
  n=$((n + 1))
  LD_LIBRARY_PATH=$build/src:${LD_LIBRARY_PATH:-} "$build/bench/flashattn-bench-variants" "$s" "$d" "$be" ${dv:-} \
    > "$out/bench-$n.md" 2>&1
  note "bench $run rc=$?"
done
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
for f in "$out"/bench-*.md; do echo; cat "$f"; done
