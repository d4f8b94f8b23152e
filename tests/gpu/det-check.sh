#!/usr/bin/env bash
# The FA3 deterministic backward's one-call device check (issue 16), run from the repository root
# on the H200 machine: build this tree (h200-check.sh build) and, beside it, the library of a base
# tree (BASE_SRC, e.g. main's); test_backward_fa3 + test_fa3_sass with the default schedule and
# test_backward_fa3 once per form of TEST_FORMS (the developer knob FLASHATTN_FA3_BWD_DET_FORM,
# which only experiment trees read: e.g. commit 16228e5's schedule bits; main has one
# deterministic kernel, so the defaults below run none), compute-sanitizer memcheck / racecheck /
# synccheck of the reduced grid with SAN_FORM, all of these at once (correctness only); then,
# alone on the GPU, bench/det_forms.py on this library (the default mode against every form of
# FORMS that passed its test, rounds alternated) and on the base library (its deterministic mode
# against its default). Logs under $OUT (the device tool returns only a few files: the per-run
# logs' verdicts are in the summary); summary last. Stop 19 ran it as
#   BASE_SRC=../base BUILD_DIR=/tmp/fa-det BASE_SEQLEN=4096,8192 FORMS=0,1,2,4,6,7 \
#     TEST_FORMS="1 2 4 6 7" SAN_FORM=7 bash tests/gpu/det-check.sh      (from .xfer/det, 178 s)
set -uo pipefail
out=${OUT:-/tmp/det-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-det}
base_src=${BASE_SRC:-}
base_build=${BASE_BUILD:-${build}-base}
forms=${FORMS:-0}
test_forms=${TEST_FORMS:-}
san_form=${SAN_FORM:-}
seqlen=${SEQLEN:-2048,4096,8192,16384}
limit=${LIMIT:-90}  # seconds for each test / sanitizer run
t0=$(date +%s)
summary=()
note() { summary+=("[$(( $(date +%s) - t0 ))s] $1"); echo "== $1"; }

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
if [ -n "$base_src" ]; then
  (cmake -S "$base_src" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS=90-real \
     -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real \
     && cmake --build "$base_build" --target flashattn -j 8) > "$out/base-build.log" 2>&1 &
  base_pid=$!
fi
OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/h200-build.txt" 2>&1
brc=$?
note "build: $(grep -E '^== build' "$out/h200-build.txt") (script rc=$brc)"
[ -x "$build/tests/test_backward_fa3" ] || { tail -30 "$out/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }

# Correctness, all at once: ctest (default schedule), one test_backward_fa3 per schedule, sanitizers.
(timeout $limit ctest --test-dir "$build" --output-on-failure -R 'test_backward_fa3$|test_fa3_sass' > "$out/ctest.log" 2>&1
 echo "rc=$?" >> "$out/ctest.log") &
for f in $test_forms; do
  (FLASHATTN_FA3_BWD_DET_FORM=$f timeout $limit "$build/tests/test_backward_fa3" > "$out/test-form$f.log" 2>&1
   echo "rc=$?" >> "$out/test-form$f.log") &
done
for tool in memcheck racecheck synccheck; do
  (FLASHATTN_FA3_BWD_DET_FORM=$san_form FLASHATTN_TEST_REDUCED=1 timeout $limit compute-sanitizer --tool $tool \
     --error-exitcode 99 "$build/tests/test_backward_fa3" > "$out/san-$tool.log" 2>&1
   echo "rc=$?" >> "$out/san-$tool.log") &
done
[ -n "$base_src" ] && wait $base_pid
note "base library: $(ls "$base_build"/src/libflashattn.so* 2>/dev/null | head -1)"
wait
note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log")"
bench_forms=0
for f in $test_forms; do
  note "test_backward_fa3 form $f: $(tail -1 "$out/test-form$f.log") $(grep -E '^\[ +(PASSED|FAILED) +\]' "$out/test-form$f.log" | tr '\n' ' ')"
  if [ "$(tail -1 "$out/test-form$f.log")" = "rc=0" ] && [[ ",$forms," == *",$f,"* ]]; then bench_forms="$bench_forms,$f"; fi
done
for tool in memcheck racecheck synccheck; do
  note "compute-sanitizer $tool form $san_form: $(tail -1 "$out/san-$tool.log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$tool.log" | tail -1)"
done

# Speed, alone on the GPU.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
timeout 150 python3 bench/det_forms.py --lib "$build/src/libflashattn.so" --forms "$bench_forms" --seqlen "$seqlen" \
  --markdown "$out/det-forms.md" > "$out/det-forms.txt" 2>&1
note "det_forms.py forms $bench_forms rc=$?"
if [ -n "$base_src" ] && [ -f "$base_build/src/libflashattn.so" ]; then
  python3 bench/det_forms.py --lib "$base_build/src/libflashattn.so" --forms 0 --seqlen "${BASE_SEQLEN:-$seqlen}" \
    --rounds "${BASE_ROUNDS:-2}" --markdown "$out/det-forms-base.md" > "$out/det-forms-base.txt" 2>&1
  note "det_forms.py base rc=$?"
fi
echo
cat "$out/det-forms.md" 2>/dev/null | grep -E '^\|' | awk -F'|' '{print $2,$3,$4,$5,$6,$7,$9}' | sed 's/  */ /g'
[ -f "$out/det-forms-base.md" ] && grep -E 'det form' "$out/det-forms-base.md" | awk -F'|' '{print "base",$2,$3,$4,$6,$7}'
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
