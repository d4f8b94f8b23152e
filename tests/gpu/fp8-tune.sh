#!/usr/bin/env bash
# One lean device call for tuning the FA3 FP8 forward kernel (issue 17), from the repository root on
# the H200: build (h200-check.sh's build stage), a quick kernel run, the issue's speed grid (FP8 vs
# bf16 FA3), ncu on one launch per head dim (NCU=1: --set full with source counters; the source
# view summarised by ncu-source-summary.py), then the correctness gate for a changed kernel in
# parallel: test_fp8_fa3 (+ 3 CTAs), test_fp8_primitives, test_fa3_sass and compute-sanitizer
# memcheck / racecheck / synccheck on the reduced grid. tests/gpu/fp8-check.sh is the full check
# (adds the RMSE table); this one leaves it out to save device time. Logs under $OUT; summary last.
# Env: BUILD_DIR (default /tmp/fa-fp8k), NCU (1: profile), GRID_DIMS (default 128,256).
set -uo pipefail
out=${OUT:-/tmp/fp8-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-fp8k}
: > "$out/summary.txt"
note() { echo "== $1"; echo "$1" >> "$out/summary.txt"; }
t_start=$(date +%s)
stamp() { echo "$(( $(date +%s) - t_start ))s"; }

OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/build-stage.log" 2>&1
[ -x "$build/tests/test_fp8_fa3" ] || { tail -40 "$out/build-stage.log"; echo "build failed"; exit 1; }
note "$(grep -m1 '^== build' "$out/build-stage.log") ($(stamp))"
if [ -d .devdeps/root ]; then export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}; fi

FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_TEST_VERBOSE=1 timeout 40 "$build/tests/test_fp8_fa3" > "$out/quick.log" 2>&1
rc=$?
note "quick kernel run rc=$rc: $(grep -E 'cases checked|largest' "$out/quick.log" | paste -sd ' ') ($(stamp))"
[ $rc = 0 ] || { tail -30 "$out/quick.log"; cat "$out/summary.txt"; exit 1; }

acc="$build/bench/flashattn-fp8-accuracy"
timeout 90 "$acc" --speed-grid "${GRID_DIMS:-128,256}" > "$out/fp8-speed-grid.md" 2>&1
note "speed grid rc=$? ($(stamp))"

if [ "${NCU:-0}" = 1 ]; then
  for d in 128 256; do
    heads=$(( d == 128 ? 16 : 8 ))
    timeout 120 ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:Fp8Traits<$d>" \
      --launch-count 1 --set full --import-source yes -f -o "$out/ncu-d$d" \
      "$acc" --backend fa3 --fp8-backend fa3 --reference 0 --seqlen 4096 --heads $heads --dim $d \
      > "$out/ncu-d$d.log" 2>&1
    note "ncu d$d rc=$? ($(stamp))"
    ncu -i "$out/ncu-d$d.ncu-rep" --page details > "$out/ncu-d$d-details.txt" 2>&1
    ncu -i "$out/ncu-d$d.ncu-rep" --page source --csv --print-source sass > "$out/ncu-d$d-source.csv" 2>/dev/null
    python3 tests/gpu/ncu-source-summary.py "$out/ncu-d$d-source.csv" --top 25 > "$out/ncu-d$d-summary.txt" 2>&1
  done
fi

# The correctness gate, in parallel (GPU-light sanitizers; ctest -j).
ctest --test-dir "$build" --output-on-failure -j 4 --timeout 120 \
  -R '^(test_fp8_fa3|test_fp8_fa3_kernel_few_ctas|test_fp8_primitives|test_fa3_sass)$' > "$out/ctest.log" 2>&1 &
ct=$!
pids=()
for tool in memcheck racecheck synccheck; do
  FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_FA3_MAX_CTAS=3 timeout 150 compute-sanitizer --tool $tool --error-exitcode 99 \
    "$build/tests/test_fp8_fa3" > "$out/sanitize-$tool.log" 2>&1 &
  pids+=($!)
done
wait $ct; note "ctest rc=$? $(grep -E 'tests passed' "$out/ctest.log") ($(stamp))"
grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest.log" | sed 's/^/   /'
i=0
for tool in memcheck racecheck synccheck; do
  wait ${pids[$i]}; note "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | tail -1)"
  i=$((i + 1))
done
lib=$(find "$build" -name "libflashattn.so*" -type f | head -1)
cuobjdump -res-usage "$lib" 2>/dev/null | grep -A1 fp8_fwd | grep -oE 'REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | paste -sd ' ' > "$out/fp8-res.txt"
note "fp8 kernels res-usage: $(cat "$out/fp8-res.txt")"
echo; echo "==== speed grid"; grep '^|' "$out/fp8-speed-grid.md"
if [ "${NCU:-0}" = 1 ]; then
  for d in 128 256; do echo "==== ncu d$d"; head -60 "$out/ncu-d$d-summary.txt"; done
fi
echo; echo "==== summary ($(stamp))"; cat "$out/summary.txt"
