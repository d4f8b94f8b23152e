#!/usr/bin/env bash
# FA3's deterministic backward on the keys-descending grid forced at every length
# (FLASHATTN_FA3_BWD_DET_ORDER=4: under a mask without sink tokens, head dims above 128) against
# finalize's order (since stop 51 the same grid where the pair fits a wave, heads fastest beyond),
# in one device call from the repository root with .devdeps carried: an FA3-only sm_90a build;
# first the measurement (ab_backward.py's deterministic columns at d 256 causal 1k-16k; the bar:
# det >= 0.8x the default), then the gates, GATE_S seconds each (300 unless set):
# test_backward_fa3 (+ the knob run), test_fa3_sass, test_fa3_bwd_turns, test_random_grad_fa3 with
# the knob, compute-sanitizer memcheck / racecheck / synccheck of test_backward_fa3's reduced grid
# with the knob. Logs go to $OUT. Stop 51's figures: docs/performance.md, "stop 51, lead".
#   OUT=$OUT bash tests/gpu/fa3-det-desc-check.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/fa3-det-desc}; mkdir -p "$out"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
source "$root/tests/gpu/devdeps-env.sh" && use_devdeps "$root"
B=/tmp/fa3-det-desc
cmake -S "$root" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS= \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_BENCH=OFF \
  -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_BUILD_DOCS=OFF > "$out/build.log" 2>&1 \
  && timeout 300 cmake --build $B --target flashattn test_backward_fa3 test_random_grad_fa3 test_fa3_bwd_turns -j 16 \
     >> "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
el built
L=$B/src/libflashattn.so
timeout 240 python3 "$root/bench/ab_backward.py" --a $L --b $L --gen fa3 --hdim 256 \
  --seqlen 1024,2048,4096,8192,16384 --causal 1 --rounds 3 --deterministic \
  --tile-forms det:FLASHATTN_FA3_BWD_DET_ORDER=4 --markdown "$out/ab.md" > "$out/ab.log" 2>&1
el "ab rc=$?"
grep -E '^\|' "$out/ab.md"
pids=()
( timeout ${GATE_S:-300} ctest --test-dir $B -R 'test_backward_fa3$|test_backward_fa3_det_descending|test_fa3_sass|test_fa3_bwd_turns' \
    --output-on-failure -j 4 > "$out/ctest.log" 2>&1; echo "rc=$?" >> "$out/ctest.log" ) & pids+=($!)
( FLASHATTN_FA3_BWD_DET_ORDER=4 FLASHATTN_TEST_MIX_CASES=400 timeout ${GATE_S:-300} $B/tests/test_random_grad_fa3 \
    > "$out/random.log" 2>&1; echo "rc=$?" >> "$out/random.log" ) & pids+=($!)
for tool in memcheck racecheck synccheck; do
  ( FLASHATTN_FA3_BWD_DET_ORDER=4 FLASHATTN_TEST_REDUCED=1 timeout ${GATE_S:-300} compute-sanitizer --tool $tool --error-exitcode 99 \
      $B/tests/test_backward_fa3 > "$out/san-$tool.log" 2>&1; echo "rc=$?" >> "$out/san-$tool.log" ) & pids+=($!)
done
wait "${pids[@]}"
el gates
grep -E 'tests passed|^ *[0-9]+/[0-9]+ Test|rc=' "$out/ctest.log"
for f in random san-memcheck san-racecheck san-synccheck; do
  echo "$f: $(tail -1 "$out/$f.log") $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY|cases checked' "$out/$f.log" | tail -1)"
done
