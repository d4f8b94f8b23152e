#!/usr/bin/env bash
# The whole H200 check of a merged tree in one device call (~4 min after a ~1 min start): build,
# every gpu test and the SASS test, sanitizers on reduced grids,
# pytest (torch), host cost, a short paged-decode table; all in parallel after the build. Run from the
# repository root with .devdeps carried (../shared/tools/device-deps.sh); T = per-job timeout (s).
# Short of device time: SAN_TESTS (the tests under all three sanitizers), SAN_MEMCHECK_ONLY (more
# under memcheck; test_fp8_fa3 always), BENCH=0 (no backward table), DECODE_PAGES (page sizes).
set -uo pipefail
final_out=${OUT:-/tmp/out}; out=/tmp/flog; rm -rf $out; mkdir -p "$out" "$final_out"
export BUILD_DIR=/tmp/fa-final NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
b=$BUILD_DIR
. "$(dirname "$0")/devdeps-env.sh"; use_torch_nccl
OUT=$out bash tests/gpu/h200-check.sh build > "$out/build-stage.txt" 2>&1
tail -3 "$out/build-stage.txt"
[ -f "$b/src/libflashattn.so" ] || { echo BUILD FAILED; tail -60 "$out/build.log" 2>/dev/null; tar czf "$final_out/logs.tgz" -C "$out" .; exit 1; }
export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
T=${T:-240}
# TC: ctest's own limit. Its 32 gpu tests share the GPU with ~45 sanitizer jobs; at 170 s (stop 16)
# it finished only 15 of them, so it gets twice the per-job limit by default. The SASS tests get it
# too: under the sanitizers' CPU load test_fa2_sass ran past T (stops 41-42).
TC=${TC:-$((2 * T))}
run() { local name=$1; shift; local limit=$T; case $name in ctest|sass) limit=$TC;; esac
        ( timeout $limit "$@" > "$out/$name.log" 2>&1; echo "$name rc=$? $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failures|tests passed' "$out/$name.log" | tail -1)" > "$out/$name.rc" ) & }
run ctest ctest --test-dir $b --output-on-failure -j 8 -L gpu
# The SASS check is labelled cpu (it needs no GPU) but a merge can break it (stop 15: a spill).
run sass ctest --test-dir $b --output-on-failure -R "test_fa[23]_sass"
S="FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3"
for tool in memcheck racecheck synccheck; do
  for t in ${SAN_TESTS:-numerics_fa1 numerics_fa2 numerics_fa3 backward_fa2 backward_fa3 serving_fa1 serving_fa2 serving_fa3 variants_fa1 variants_fa2 variants_fa3}; do
    run $tool-$t env $S compute-sanitizer --tool $tool --error-exitcode 99 $b/tests/test_$t
  done
done
for t in ${SAN_MEMCHECK_ONLY:-special_values_fa2 special_values_fa3 hadamard_fa2} fp8_fa3; do
  run memcheck-$t env $S compute-sanitizer --tool memcheck --error-exitcode 99 $b/tests/test_$t
done
for tool in racecheck synccheck; do run $tool-fp8_fa3 env $S compute-sanitizer --tool $tool --error-exitcode 99 $b/tests/test_fp8_fa3; done
[ -x $b/cp/test_cp_ring_gpu ] && run memcheck-cp_ring_gpu compute-sanitizer --tool memcheck --error-exitcode 99 $b/cp/test_cp_ring_gpu
# The execution contract (fresh threads, concurrent streams, graph capture; the decode step's
# PDL chain included) under memcheck.
run memcheck-exec_contract env FLASHATTN_TEST_REDUCED=1 compute-sanitizer --tool memcheck --error-exitcode 99 $b/tests/test_exec_contract
run racecheck-bwd-fallback env $S FLASHATTN_FA2_BWD_TILE=fallback compute-sanitizer --tool racecheck --error-exitcode 99 $b/tests/test_backward_fa2
run bwd-verbose-fa2 env FLASHATTN_TEST_VERBOSE=1 $b/tests/test_backward_fa2
run bwd-verbose-fa3 env FLASHATTN_TEST_VERBOSE=1 $b/tests/test_backward_fa3
run pytest env FLASHATTN_LIBRARY=$b/src/libflashattn.so PYTHONPATH=bindings/python python3 -m pytest -q -x bindings/python/tests
wait
[ "${BENCH:-1}" = 1 ] && timeout 60 $b/bench/flashattn-bench --backend all-gpu --backward-only --deterministic --hdim 64,128 --seqlen 4096 > "$out/backward.txt" 2>&1
$b/bench/flashattn-bench --backend all-gpu --host-cost > "$out/hostcost.txt" 2>&1
for ps in ${DECODE_PAGES-0 16 256}; do
  timeout 40 $b/bench/flashattn-bench --backend all-gpu --decode --decode-batch 1 --decode-kv-heads 8 --decode-seqlen 32768,131072 --page-size $ps > "$out/decode-page$ps.txt" 2>&1
done
grep -E 'Failed|Skipped|Not Run|Passed|\*\*\*' "$out/ctest.log" | grep -E '^ *[0-9]+/' > "$out/ctest-summary.txt"
tar czf "$final_out/logs.tgz" -C "$out" . 2>/dev/null
echo; echo "==== ctest"; grep -vE ' Passed ' "$out/ctest-summary.txt"; tail -3 "$out/ctest.log"
echo "==== backward"; tail -14 "$out/backward.txt"
echo "==== host cost"; tail -8 "$out/hostcost.txt"
echo "==== decode"; for ps in 0 16 256; do tail -6 "$out/decode-page$ps.txt"; done
echo "==== summary (non-zero rc first)"; cat "$out"/*.rc | sort -t= -k2 -r | grep -v "rc=0 " ; echo "--- rc=0:"; cat "$out"/*.rc | grep -c "rc=0 "
