# Sourced by the serving A/B device scripts (decode-ab.sh, paged-ab.sh, fold-ab.sh), after they
# set `root`: ab_setup (the output folder, deadline, bench repetitions, build folders and the
# FA2-only sm_90 configure arguments), the elapsed-time notes printed again as the summary, cmocka
# from .devdeps, and this tree's serving checks (test_serving_fa2 and its gather run,
# test_exec_contract, test_fa2_sass, compute-sanitizer on test_serving_fa2's reduced grid).
t_start=$(date +%s)
el() { echo $(( $(date +%s) - t_start )); }
summary=()
note() { summary+=("[$(el)s] $1"); echo "== [$(el)s] $1"; }

source "$root/tests/gpu/devdeps-env.sh" && use_devdeps "$root"  # cmocka from Debian, carried

ab_setup() {  # NAME DEADLINE_S REPS: $OUT (else /tmp/NAME), AB_DEADLINE, AB_REPS, /tmp/fa-NAME[-base]
  out=${OUT:-/tmp/$1}
  deadline=${AB_DEADLINE:-$2}
  reps=${AB_REPS:-$3}
  mkdir -p "$out/bench"
  base_bld=/tmp/fa-$1-base
  new_bld=/tmp/fa-$1
  cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real
       -DFLASHATTN_FA3_ARCHS= -DFLASHATTN_BENCH_CUDA_ARCHS=90-real -DFLASHATTN_BUILD_EXAMPLES=OFF
       -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF)
}

serving_checks() {  # BUILD_DIR TIMEOUT_S [TEST...]: the tests, the three sanitizers and memcheck of
  # each further TEST (built in BUILD_DIR), all side by side, then their notes
  local bld=$1 limit=$2 tool t pids=()
  shift 2
  ( timeout "$limit" ctest --test-dir "$bld" -R 'test_serving_fa2|test_exec_contract|test_fa2_sass' \
      --output-on-failure -j 4 > "$out/ctest.log" 2>&1; echo "rc=$?" >> "$out/ctest.log" ) & pids+=($!)
  for tool in memcheck racecheck synccheck; do
    ( FLASHATTN_TEST_REDUCED=1 timeout "$limit" compute-sanitizer --tool $tool --error-exitcode 99 \
        "$bld/tests/test_serving_fa2" > "$out/sanitize-$tool.log" 2>&1; echo "rc=$?" >> "$out/sanitize-$tool.log" ) & pids+=($!)
  done
  for t in "$@"; do
    ( FLASHATTN_TEST_REDUCED=1 timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 99 \
        "$bld/tests/$t" > "$out/memcheck-$t.log" 2>&1; echo "rc=$?" >> "$out/memcheck-$t.log" ) & pids+=($!)
  done
  wait "${pids[@]}"
  note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log")"
  grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest.log" | sed 's/^/   /'
  for tool in memcheck racecheck synccheck; do
    note "compute-sanitizer $tool $(tail -1 "$out/sanitize-$tool.log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | tail -1)"
  done
  for t in "$@"; do
    note "memcheck $t $(tail -1 "$out/memcheck-$t.log") $(grep -aE 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"
  done
}
