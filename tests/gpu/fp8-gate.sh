# The FP8 kernel's correctness gate, shared by fp8-tune.sh and fp8-ab.sh (sourced, not run; the
# caller defines build, logs, out, note and stamp). fp8_gate_start [EXTRA_TESTS] [LIMIT_S] starts
# ctest's FP8 tests (and test_fa3_sass, plus the EXTRA_TESTS alternatives) and compute-sanitizer
# memcheck / racecheck / synccheck of test_fp8_fa3's reduced grid with three CTAs, all in the
# background; fp8_gate_wait waits for them and notes each result; fp8_res_usage LIB LABEL notes
# the FP8 kernels' registers, stack and local memory.
fp8_gate_start() {
  # (timeout around ctest too: a kernel that hangs must not eat the device call)
  timeout "${2:-150}" ctest --test-dir "$build" --output-on-failure -j 4 --timeout "${2:-150}" \
    -R "^(test_fp8_fa3|test_fp8_fa3_kernel_few_ctas|test_fp8_primitives|test_fa3_sass${1:+|$1})\$" > "$logs/ctest.log" 2>&1 &
  fp8_gate_ctest=$!
  fp8_gate_pids=()
  for tool in memcheck racecheck synccheck; do
    FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_FA3_MAX_CTAS=3 timeout "${2:-150}" compute-sanitizer --tool $tool \
      --error-exitcode 99 "$build/tests/test_fp8_fa3" > "$logs/sanitize-$tool.log" 2>&1 &
    fp8_gate_pids+=($!)
  done
}
fp8_gate_wait() {
  wait "$fp8_gate_ctest"; note "ctest rc=$? $(grep -E 'tests passed' "$logs/ctest.log") ($(stamp))"
  grep -E '^ *[0-9]+/[0-9]+ Test' "$logs/ctest.log" | sed 's/^/   /' >> "$out/summary.txt"
  local i=0 tool
  for tool in memcheck racecheck synccheck; do
    wait "${fp8_gate_pids[$i]}"
    note "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitize-$tool.log" | tail -1) ($(stamp))"
    i=$((i + 1))
  done
}
fp8_res_usage() {
  note "fp8 kernels res-usage$2: $(cuobjdump -res-usage "$1" 2>/dev/null | grep -A1 fp8_fwd | grep -oE 'REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | paste -sd ' ')"
}
