#!/usr/bin/env bash
# Stop 20's one-call device check of the FA2 backward's tiles (issue 15), run from the repository
# root on the H200 machine: build this tree (library + test_backward_fa2, FA1/FA2 only: FA3 is
# not touched) and, beside it, the library of a base tree (BASE_SRC, e.g. main's); then, all at
# once (correctness only): test_backward_fa2 (main tile), test_backward_fa2_fallback,
# test_fa2_sass, test_backward_fa2 once per TILE_FORMS value of FLASHATTN_FA2_BWD_TILE, and
# compute-sanitizer memcheck / racecheck / synccheck of the reduced grid with the main tile and
# each form; then, alone on the GPU, bench/ab_backward.py (base vs this tree vs each form, with
# the deterministic modes and torch-flash, rounds rotated); last, when NCU=1 and time is left, an
# ncu source export of one main-tile d128 launch. Logs under $OUT; summary last. Stop 20 ran
#   BASE_SRC=../base BUILD_DIR=/tmp/fa-bw2 TILE_FORMS=fa2layout NCU=1 bash tests/gpu/bw2-check.sh
# at 3528de9 (its knob FLASHATTN_FA2_BWD_TILE=fa2layout is gone: the winners became the main
# tiles); TILE_FORMS=fallback still works. Keep the files under $OUT few (the device tool returns
# only a handful: stop 20 lost the ncu summary and the sanitizer logs; their verdicts are in the
# summary; since stop 21 every log goes into one logs.tgz, beside the summary, the A/B table and
# the ncu summary).
# Stop 21 (wip/bw3) added: MID_SRC, a third tree's library timed as column M (ab_backward.py --m);
# FA1_ARCHS (default 90-real; empty builds no FA1); CTEST_REGEX (the ctest selection) and
# BUILD_TARGETS (its executables, default test_backward_fa2); BENCH_FORMS (the A/B's tile forms,
# default TILE_FORMS, which also get their own test and sanitizer runs); NCU_FILTER
# (the ncu stage's kernel regex). It ran
#   BASE_SRC=../bw3-base MID_SRC=../bw3-mid BUILD_DIR=/tmp/fa-bw3 FA1_ARCHS= NCU=1 BENCH_FORMS=fallback \
#     CTEST_REGEX='test_backward_fa2$|test_backward_fa2_fallback|test_fa2_sass|test_backward_contract' \
#     BUILD_TARGETS='test_backward_fa2 test_backward_contract' SEQLENS=2048,8192 bash tests/gpu/bw2-check.sh
# Stop 22 (wip/fa2bw) added KTIMES=1: tests/gpu/bw-kernel-times.py after the A/B (each kernel's
# device time per backward call, A / M / B, on KTIMES_CELLS), its table printed before the A/B's.
set -uo pipefail
out=${OUT:-/tmp/bw2-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-bw2}
base_src=${BASE_SRC:-../base}
base_build=${BASE_BUILD:-${build}-base}
mid_src=${MID_SRC:-}
mid_build=${build}-mid
fa1_archs=${FA1_ARCHS-90-real}
ctest_regex=${CTEST_REGEX:-test_backward_fa2$|test_backward_fa2_fallback|test_fa2_sass}
forms=${TILE_FORMS:-}
limit=${LIMIT:-70}  # seconds for each test / sanitizer run
deadline=${DEADLINE:-205}  # seconds after the start: the optional ncu stage ends by then
t0=$(date +%s)
summary=()
note() { summary+=("[$(( $(date +%s) - t0 ))s] $1"); echo "== [$(( $(date +%s) - t0 ))s] $1" | tee -a "$out/summary.txt"; }

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
configure() {  # src build-dir [extra cmake args]
  local src=$1 dir=$2; shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS="$fa1_archs" \
    -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS= -DFLASHATTN_BENCH_CUDA_ARCHS=90-real "$@"
}
(configure "$base_src" "$base_build" -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
   && cmake --build "$base_build" --target flashattn -j 8) > "$out/base-build.log" 2>&1 &
base_pid=$!
mid_pid=
if [ -n "$mid_src" ]; then
  (configure "$mid_src" "$mid_build" -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
     && cmake --build "$mid_build" --target flashattn -j 6) > "$out/mid-build.log" 2>&1 &
  mid_pid=$!
fi
(configure . "$build" && cmake --build "$build" --target flashattn ${BUILD_TARGETS:-test_backward_fa2} -j 14) > "$out/build.log" 2>&1
note "build rc=$?"
[ -x "$build/tests/test_backward_fa2" ] || { tail -40 "$out/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }
"$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)" --dump-resource-usage "$build/src/libflashattn.so" 2>/dev/null | grep -A1 'bwd_kernel' \
  | grep -oE 'BwdTraitsILi[0-9ELi]+|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | paste - - - - | sort -u > "$out/bwd-resources.txt"

# Correctness, all at once.
(timeout $limit ctest --test-dir "$build" --output-on-failure -j 3 -R "$ctest_regex" \
   > "$out/ctest.log" 2>&1; echo "rc=$?" >> "$out/ctest.log") &
for f in $forms; do
  (FLASHATTN_FA2_BWD_TILE=$f timeout $limit "$build/tests/test_backward_fa2" > "$out/test-$f.log" 2>&1
   echo "rc=$?" >> "$out/test-$f.log") &
done
for tool in memcheck racecheck synccheck; do
  for f in main $forms; do
    (FLASHATTN_FA2_BWD_TILE=$([ $f = main ] || echo $f) FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout $limit \
       compute-sanitizer --tool $tool --error-exitcode 99 "$build/tests/test_backward_fa2" > "$out/san-$tool-$f.log" 2>&1
     echo "rc=$?" >> "$out/san-$tool-$f.log") &
  done
done
wait $base_pid
note "base library rc=$? $(ls "$base_build"/src/libflashattn.so 2>/dev/null)"
if [ -n "$mid_pid" ]; then
  wait $mid_pid
  note "mid library rc=$? $(ls "$mid_build"/src/libflashattn.so 2>/dev/null)"
fi
wait
note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log")"
grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest.log" | sed 's/^/   /' > "$out/ctest-lines.txt"
for f in $forms; do note "test_backward_fa2 $f: $(tail -1 "$out/test-$f.log") $(grep -E '^\[ +(PASSED|FAILED) +\]' "$out/test-$f.log" | tr '\n' ' ')"; done
for tool in memcheck racecheck synccheck; do
  for f in main $forms; do
    note "compute-sanitizer $tool $f: $(tail -1 "$out/san-$tool-$f.log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$tool-$f.log" | tail -1)"
  done
done

# Speed, alone on the GPU.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
if [ -f "$base_build/src/libflashattn.so" ]; then
  mid_arg=()
  [ -f "$mid_build/src/libflashattn.so" ] && mid_arg=(--m "$mid_build/src/libflashattn.so")
  timeout ${BENCH_LIMIT:-110} python3 bench/ab_backward.py --a "$base_build/src/libflashattn.so" --b "$build/src/libflashattn.so" "${mid_arg[@]}" \
    --tile-forms "$(echo ${BENCH_FORMS-$forms} | tr ' ' ',')" --deterministic --hdim ${HDIMS:-64,128,256} --seqlen ${SEQLENS:-2048,8192,16384} \
    --rounds ${ROUNDS:-3} --markdown "$out/ab-backward.md" > "$out/ab-backward.txt" 2>&1
  note "ab_backward.py rc=$?"
fi
if [ "${KTIMES:-0}" = 1 ] && [ -f "$base_build/src/libflashattn.so" ]; then
  mid_lib=()
  [ -f "$mid_build/src/libflashattn.so" ] && mid_lib=(--lib "M=$mid_build/src/libflashattn.so")
  timeout ${KTIMES_LIMIT:-40} python3 tests/gpu/bw-kernel-times.py --lib "A=$base_build/src/libflashattn.so" "${mid_lib[@]}" \
    --lib "B=$build/src/libflashattn.so" --cells "${KTIMES_CELLS:-128:1:2048,256:1:2048,128:0:8192}" \
    --rounds ${KTIMES_ROUNDS:-2} --markdown "$out/ktimes.md" > "$out/ktimes.txt" 2>&1
  note "bw-kernel-times.py rc=$?"
fi
left=$(( deadline - ($(date +%s) - t0) ))
if [ "${NCU:-0}" = 1 ] && [ $left -gt 30 ] && command -v ncu > /dev/null; then
  timeout $((left - 8)) ncu --kernel-name-base demangled --kernel-name "regex:${NCU_FILTER:-bwd_kernel}" --launch-skip 1 --launch-count 1 \
    --set full --import-source yes -o /tmp/bw2-prof python3 bench/bwd_once.py "$build/src/libflashattn.so" --gen fa2 \
    --shape 2,8192,16,128 > "$out/ncu.log" 2>&1
  ncu -i /tmp/bw2-prof.ncu-rep --page source --csv --print-source sass > /tmp/bw2-source.csv 2>/dev/null \
    && python3 tests/gpu/ncu-source-summary.py /tmp/bw2-source.csv --top 15 > "$out/ncu-summary.txt" 2>&1
  ncu -i /tmp/bw2-prof.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
  note "ncu: $(tail -1 "$out/ncu.log" | cut -c1-100)"
fi
echo
cat "$out/bwd-resources.txt"
cat "$out/ctest-lines.txt"
cat "$out/ktimes.md" 2>/dev/null || tail -5 "$out/ktimes.txt" 2>/dev/null
grep -E '^\|' "$out/ab-backward.md" 2>/dev/null
grep -E '^- ' "$out/ab-backward.md" 2>/dev/null
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
# One archive of every log (the device tool returns only a handful of files).
(cd "$out" && tar czf /tmp/bw-logs.tgz --exclude='*.tgz' . && find . -type f ! -name summary.txt ! -name ab-backward.md \
   ! -name ncu-summary.txt ! -name ktimes.md -delete && mv /tmp/bw-logs.tgz logs.tgz)
