#!/usr/bin/env bash
# Stop 19's one device call for FA3 head dim 64 (issue 20, the 3-consumer 192-row tile), from the
# repository root with .devdeps carried: builds this tree (everything) and BASE_SRC's library (FA1
# off) side by side; then, the GPU to itself, the A/B
# against cuDNN in one process (bench/ab_cudnn.py: base = A, this tree = B, rounds rotated); then
# in parallel the FA3 gpu tests and the SASS test (ctest) and compute-sanitizer memcheck /
# racecheck / synccheck on the reduced grid with FA3 on 3 CTAs. Every job has a deadline so that
# the whole call ends by DEADLINE seconds (default 228); logs under $OUT, summary last.
# Stop 19's run: build 58 s (base 68 s), A/B 52 s for 24 cells x 3 rounds; test_numerics_fa3 and
# its few-CTA form need ~100-130 s each (stop 15-18 logs), more than the ~100 s left to the
# tests: they timed out unfinished (a 40 s gate on test_numerics_fa3, dropped since, cost the
# rest). Give the tests a call of their own, or leave the bench out, to see them finish. The
# device tool returns at most 8 files from $OUT: the .rc files stay there, their lines are in the
# summary.
#
#   BASE_SRC=.xfer/base OUT=$OUT bash tests/gpu/f64-check.sh
set -uo pipefail
t_start=$(date +%s)
out=${OUT:-/tmp/f64-out}; mkdir -p "$out"
b=${BUILD_DIR:-/tmp/fa-f64}
base_src=${BASE_SRC:?BASE_SRC: main\'s source tree}
deadline=${DEADLINE:-228}
left() { echo $(( deadline - ($(date +%s) - t_start) )); }
summary=()
note() { summary+=("$1"); echo "== $1"; }

# shellcheck source=devdeps-env.sh
source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
( cmake -S "$base_src" -B /tmp/fa-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_FA1_ARCHS= \
    -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real > "$out/base-configure.log" 2>&1 \
  && cmake --build /tmp/fa-base --target flashattn -j 8 > "$out/base-build.log" 2>&1 ) & base_pid=$!
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS=90-real -DFLASHATTN_FA2_ARCHS=90-real \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 \
  && cmake --build "$b" -j 16 > "$out/build.log" 2>&1
rc=$?; note "build rc=$rc at $(( $(date +%s) - t_start ))s"
[ $rc = 0 ] || { tail -40 "$out/build.log"; }
wait $base_pid; rc_base=$?; note "base build rc=$rc_base at $(( $(date +%s) - t_start ))s"
[ $rc_base = 0 ] || tail -20 "$out/base-build.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1

if [ $rc_base = 0 ] && [ -f "$b/src/libflashattn.so" ]; then
  timeout "${BENCH_S:-75}" python3 bench/ab_cudnn.py --a /tmp/fa-base/src/libflashattn.so --b "$b/src/libflashattn.so" \
    --gen fa3 --hdim 64 --dtypes "${DTYPES:-bf16,fp16}" --rounds "${ROUNDS:-3}" --reps 12 \
    --markdown "$out/ab-cudnn.md" > "$out/ab-cudnn.log" 2>&1
  note "ab_cudnn rc=$? at $(( $(date +%s) - t_start ))s"
fi

# Tests and sanitizers together, each bounded by what is left of the call.
T=$(( $(left) - 8 )); [ $T -gt 10 ] || T=10
export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
jobs_=()
run() { local name=$1; shift
        ( timeout $T "$@" > "$out/$name.log" 2>&1; echo "$name rc=$? $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY|tests passed|passed|failed' "$out/$name.log" | tail -1)" > "$out/$name.rc" ) & jobs_+=($!); }
run ctest ctest --test-dir "$b" --output-on-failure -j 6 -R "${CTEST_RE:-fa3|gpu_contract|exec_contract}" -E fp8
S="FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3"
for tool in memcheck racecheck synccheck; do
  for t in ${SAN_TESTS:-numerics_fa3 variants_fa3 serving_fa3}; do
    # shellcheck disable=SC2086  # S is a list of VAR=value words
    run "$tool-$t" env $S compute-sanitizer --tool $tool --error-exitcode 99 "$b/tests/test_$t"
  done
done
wait "${jobs_[@]}"
grep -E 'Failed|Skipped|Not Run|Passed|\*\*\*' "$out/ctest.log" | grep -E '^ *[0-9]+/' > "$out/ctest-summary.txt"

echo; echo "==== ctest"; cat "$out/ctest-summary.txt"; tail -3 "$out/ctest.log"
echo "==== A/B against cuDNN"; cat "$out/ab-cudnn.md" 2>/dev/null || tail -20 "$out/ab-cudnn.log"
echo "==== summary"; printf '%s\n' "${summary[@]}"; cat "$out"/*.rc
echo "total $(( $(date +%s) - t_start ))s"
