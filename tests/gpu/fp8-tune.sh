#!/usr/bin/env bash
# One lean device call for tuning the FA3 FP8 forward kernel (issue 17), from the repository root on
# the H200: a build of FA3 only (FA1/FA2 off: the FP8 kernel, its tests and the speed grid need
# none of them; about half the build), a quick kernel run, the issue's speed grid (FP8 vs bf16 FA3,
# alone on the GPU), then the correctness gate for a changed kernel in the background -- test_fp8_fa3
# (+ 3 CTAs), test_fp8_primitives, test_fa3_sass, compute-sanitizer memcheck / racecheck / synccheck
# on the reduced grid -- while ncu (NCU=1) profiles the first FP8 launch of the grid per head dim
# (seqlen 2048, 8 x 2048/d heads; stall sampling and source counters, summarised by
# ncu-source-summary.py). tests/gpu/fp8-check.sh is the full check (all backends, the RMSE table).
# Logs in /tmp/fp8-logs (a tarball under $OUT); summary last.
# Env: BUILD_DIR (default /tmp/fa-fp8k), NCU (1: profile), GRID_DIMS (default 128,256), NUMERICS (set:
# also test_numerics_fa3, for changes the 16-bit forward shares; it alone takes over a minute).
set -uo pipefail
source "$(dirname "$0")/fp8-gate.sh"  # fp8_gate_start / fp8_gate_wait / fp8_res_usage
out=${OUT:-/tmp/fp8-out}
logs=/tmp/fp8-logs
mkdir -p "$out" "$logs"
build=${BUILD_DIR:-/tmp/fa-fp8k}
: > "$out/summary.txt"
note() { echo "== $1"; echo "$1" >> "$out/summary.txt"; }
t_start=$(date +%s)
stamp() { echo "$(( $(date +%s) - t_start ))s"; }
finish() {
  tar -C "$logs" -czf "$out/logs.tgz" . 2>/dev/null
  echo; echo "==== speed grid"; grep '^|' "$out/fp8-speed-grid.md" 2>/dev/null
  echo; echo "==== summary ($(stamp))"; cat "$out/summary.txt"
}
trap finish EXIT

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"  # cmocka from Debian, carried
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS= \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$logs/configure.log" 2>&1 &&
  cmake --build "$build" -j 16 --target flashattn test_fp8_fa3 test_fp8_primitives flashattn-fp8-accuracy ${NUMERICS:+test_numerics_fa3} \
    > "$logs/build.log" 2>&1
rc=$?
note "build rc=$rc ($(stamp))"
[ $rc = 0 ] || { tail -30 "$logs/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >> "$out/summary.txt"

FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_TEST_VERBOSE=1 timeout 40 "$build/tests/test_fp8_fa3" > "$logs/quick.log" 2>&1
rc=$?
note "quick kernel run rc=$rc: $(grep -E 'cases checked|largest' "$logs/quick.log" | paste -sd ' ') ($(stamp))"
[ $rc = 0 ] || { tail -30 "$logs/quick.log"; exit 1; }

acc="$build/bench/flashattn-fp8-accuracy"
timeout 60 "$acc" --speed-grid "${GRID_DIMS:-128,256}" > "$out/fp8-speed-grid.md" 2>&1
note "speed grid rc=$? ($(stamp))"

# The correctness gate in the background.
fp8_gate_start "${NUMERICS:+test_numerics_fa3}" 150

if [ "${NCU:-0}" = 1 ]; then
  for d in 128 256; do
    timeout 45 ncu --clock-control none --kernel-name regex:fp8_fwd_kernel --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section SourceCounters --section LaunchStats \
      --import-source yes -f -o "$logs/ncu-d$d" "$acc" --speed-grid $d > "$logs/ncu-d$d.log" 2>&1
    note "ncu d$d rc=$? ($(stamp))"
    ncu -i "$logs/ncu-d$d.ncu-rep" --page details > "$out/ncu-d$d-details.txt" 2>&1
    ncu -i "$logs/ncu-d$d.ncu-rep" --page source --csv --print-source sass > "$logs/ncu-d$d-source.csv" 2>&1
    python3 tests/gpu/ncu-source-summary.py "$logs/ncu-d$d-source.csv" --top 25 > "$out/ncu-d$d-summary.txt" 2>&1
  done
fi

fp8_gate_wait
fp8_res_usage "$(find "$build" -name "libflashattn.so*" -type f | head -1)" ""
