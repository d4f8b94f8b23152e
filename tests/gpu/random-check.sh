#!/usr/bin/env bash
# One device call (nvidia-h200) for the random-mix tests on the GPU backends and the CP ring's GPU
# checks, from the repository root: builds only those tests (fa1/fa2/fa3 forward mix, fa2/fa3
# backward mix, the CP loopback/NCCL tests) for sm_90, runs each mix at its default case count
# under a timeout, compute-sanitizer memcheck of each on the reduced grid (FLASHATTN_TEST_REDUCED=1;
# FA3 on 3 persistent CTAs so every CTA walks many tiles), and the CP ring's ctest plus memcheck /
# racecheck / synccheck. Every failing case line names its seed and index for a CPU replay
# (README: "random-mix tests"). Logs packed into $OUT/logs.tgz; the summary prints last.
# MIX_SEED: a fixed FLASHATTN_TEST_SEED (default: each run draws its own and prints it).
set -uo pipefail
out=${OUT:-/tmp/random-check}; mkdir -p "$out"
deadline=${DEADLINE:-540}
source "$(dirname "$0")/stages.sh"
. "$(dirname "$0")/devdeps-env.sh"; use_devdeps "$PWD"
export NCCL_NVLS_ENABLE=0
use_torch_nccl
b=${BUILD_DIR:-/tmp/fa-random}
mixes="test_random_mix_fa1 test_random_mix_fa2 test_random_mix_fa3 test_random_grad_fa2 test_random_grad_fa3"
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF \
  -DFLASHATTN_FA1_ARCHS=90-real -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real \
  -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/cfg.log" 2>&1 &&
  cmake --build "$b" --target $mixes $(ninja -C "$b" -t targets all | grep -q '^test_cp_nccl:' && echo test_cp_nccl) \
    test_cp_ring_gpu test_cp_ring -j 16 > "$out/build.log" 2>&1
note "build rc=$? $(grep -o 'NCCL transport [A-Z]*' "$out/cfg.log")"
[ -x "$b/tests/test_random_mix_fa3" ] || { tail -30 "$out/build.log"; exit 1; }
seed=${MIX_SEED:+FLASHATTN_TEST_SEED=$MIX_SEED}
limit=$(( $(left) - 40 )); [ "$limit" -gt 300 ] && limit=300
for t in $mixes; do
  (env $seed FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout "$limit" compute-sanitizer --tool memcheck \
     --error-exitcode 99 "$b/tests/$t" > "$out/memcheck-$t.log" 2>&1; echo "rc=$?" >> "$out/memcheck-$t.log") &
  (env $seed timeout "$limit" "$b/tests/$t" > "$out/$t.log" 2>&1; echo "rc=$?" >> "$out/$t.log") &
done
(ctest --test-dir "$b" -R 'cp_ring|cp_nccl' --output-on-failure > "$out/ctest-cp.log" 2>&1; echo "rc=$?" >> "$out/ctest-cp.log"
 for tool in memcheck racecheck synccheck; do
   # racecheck needs ~3x memcheck's time on this grid (stop 34: 100 s was not enough)
   FLASHATTN_TEST_REDUCED=1 timeout $([ $tool = racecheck ] && echo 300 || echo 100) compute-sanitizer --tool $tool --error-exitcode 99 "$b/cp/test_cp_ring_gpu" \
     > "$out/$tool-cp-ring-gpu.log" 2>&1; echo "rc=$?" >> "$out/$tool-cp-ring-gpu.log"
 done) &
wait
for t in $mixes; do
  note "$t $(tail -1 "$out/$t.log") $(grep -aE '^(test_random|random backward)' "$out/$t.log" | head -1 | cut -c1-90)"
  grep -aiE 'fail|reproduce|mismatch|error' "$out/$t.log" | head -5 | sed 's/^/    /'
  note "memcheck $t $(tail -1 "$out/memcheck-$t.log") $(grep -E 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"
done
note "ctest cp $(tail -1 "$out/ctest-cp.log") $(grep -aE 'tests passed' "$out/ctest-cp.log")"
for tool in memcheck racecheck synccheck; do
  note "$tool test_cp_ring_gpu $(tail -1 "$out/$tool-cp-ring-gpu.log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool-cp-ring-gpu.log" | tail -1)"
done
echo "==== summary"; printf '%s\n' "${summary[@]}"
(cd "$out" && tar czf /tmp/random-check-logs.tgz . && find . -type f -delete && mv /tmp/random-check-logs.tgz logs.tgz)
