#!/usr/bin/env bash
# The device check of the FA3 FP8 (E4M3) forward kernel (issue 17), in one call on the H200,
# from the repository root: build for sm_90 (tests/gpu/h200-check.sh's build stage), then
#   1. ctest: the SASS check (QGMMA E4M3, no spills), the FP8 wgmma primitives, test_fp8_fa3 (the
#      kernel's grid; also on 3 persistent CTAs), fa1/fa2 refusing FP8, and the 16-bit FA3
#      forward's numerics (the producer and the TMA maps changed under it);
#   2. compute-sanitizer memcheck, racecheck and synccheck on the FP8 kernel's reduced grid
#      (FLASHATTN_TEST_FP8_QUICK=1: six cases, both head dims, 3 CTAs);
#   3. accuracy under outliers on the kernel (flashattn-fp8-accuracy --fp8-backend fa3: RMSE of
#      bf16 and of FP8 per-tensor / per-head + Hadamard against fp64, hdim 128 and 256) and the
#      issue's speed grid, FP8 against bf16 FA3 in one process (--speed-grid; FP8_GRID_DIMS).
# Logs under $OUT (or /tmp/fp8-out); a summary last. Env: BUILD_DIR (default /tmp/fa-fp8k). Every
# step has a timeout (a hang of the new kernel must not eat the call); about 4 minutes in all. A timed-out step shows rc=124 (or ctest's "Timeout").
#
# On the device tool, from this worktree copied to the lead's excluded folder:
#   mkdir -p /work/main/.xfer && rsync -a --delete --exclude '/build*' --exclude .git \
#     /work/wt/fp8k/ /work/main/.xfer/fp8k/
#   run: carry [".xfer/fp8k", ".devdeps"], command
#   cd .xfer/fp8k && ln -sfn ../../.devdeps .devdeps && bash tests/gpu/fp8-check.sh
set -uo pipefail
out=${OUT:-/tmp/fp8-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-fp8k}
summary=()
note() { summary+=("$1"); echo "== $1"; echo "$1" >> "$out/summary.txt"; }  # (the file survives a killed call)
: > "$out/summary.txt"

OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/build-stage.log" 2>&1
if ! [ -x "$build/tests/test_fp8_fa3" ]; then
  tail -40 "$out/build-stage.log"
  echo "build failed (logs in $out)"
  exit 1
fi
note "$(grep -m1 '^== build' "$out/build-stage.log")"
# (Registers and spills: -Xptxas -v on the build machine, no GPU needed; see docs/kernel-notes.md.)
nvcc --version | tail -2 | paste -sd ' ' > "$out/nvcc.txt"; note "nvcc: $(cat "$out/nvcc.txt")"
# The SASS check (label cpu: cuobjdump only) in the background while the GPU steps run.
ctest --test-dir "$build" --output-on-failure --timeout 280 -R '^test_fa3_sass$' > "$out/ctest-sass.log" 2>&1 &
sass_pid=$!

# 0. A first, quick run of the kernel (six cases) under a short timeout: if it hangs, the steps
#    that run it are skipped so that the rest still reports.
FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_TEST_VERBOSE=1 timeout 40 "$build/tests/test_fp8_fa3" \
  > "$out/test_fp8_fa3_kernel-quick.log" 2>&1
rc=$?
note "quick kernel run rc=$rc: $(grep -E 'cases checked|largest' "$out/test_fp8_fa3_kernel-quick.log" | paste -sd ' ')"
kernel_runs=1
if [ $rc = 124 ] || [ $rc -ge 128 ]; then
  kernel_runs=0
  note "the FP8 kernel hung or crashed (rc=$rc): its other steps are skipped"
fi
if [ $kernel_runs = 1 ]; then
FLASHATTN_TEST_VERBOSE=1 timeout 60 "$build/tests/test_fp8_fa3" > "$out/test_fp8_fa3_kernel-direct.log" 2>&1
note "test_fp8_fa3 (kernel, full grid, verbose) rc=$?: $(grep -E 'cases checked|largest' "$out/test_fp8_fa3_kernel-direct.log" | paste -sd ' ')"
fi
tests='test_fp8_primitives|test_fp8_fa1|test_fp8_fa2|test_numerics_fa3|test_fp8_cpu'
[ $kernel_runs = 1 ] && tests="$tests|test_fp8_fa3_kernel_few_ctas"  # (the full grid ran verbose above)

# 1. Tests (gpu-labelled).
ctest --test-dir "$build" --output-on-failure -j 4 \
    --timeout 90 -R "^($tests)\$" \
  > "$out/ctest.log" 2>&1
note "ctest rc=$? $(grep -E 'tests passed' "$out/ctest.log")"
grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest.log" | sed 's/^/   /'
if [ $kernel_runs = 1 ]; then

# 2. The speed grid (hidden 2048, 16k tokens, seqlen 2k-16k, non-causal and causal) of FP8 against
#    bf16 FA3 in the same process, and the accuracy under outliers (the issue's RMSE table).
acc="$build/bench/flashattn-fp8-accuracy"
timeout 60 "$acc" --speed-grid ${FP8_GRID_DIMS:-128,256} > "$out/fp8-speed-grid.md" 2>&1
note "fp8 speed grid rc=$?"
for d in 128 256; do
  timeout 40 "$acc" --backend fa3 --fp8-backend fa3 --seqlen 1024 --heads 8 --dim $d \
    > "$out/fp8-accuracy-d$d.md" 2>&1
  note "fp8 accuracy d$d rc=$?"
done

# 3. Sanitizers on the reduced grid, 3 persistent CTAs.
for tool in memcheck racecheck synccheck; do
  FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_FA3_MAX_CTAS=3 \
    timeout ${SANITIZE_TIMEOUT:-60} compute-sanitizer --tool $tool --error-exitcode 99 "$build/tests/test_fp8_fa3" > "$out/sanitize-fp8-$tool.log" 2>&1
  note "compute-sanitizer $tool fp8 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-fp8-$tool.log" | tail -1)"
done

fi  # kernel_runs

wait $sass_pid
note "sass: $(grep -E 'tests passed|Test *#' "$out/ctest-sass.log" | paste -sd ' ')"
echo
echo "==== FP8 accuracy and speed (RMSE vs fp64; TFLOP/s of the fa3 rows)"
for f in "$out"/fp8-accuracy-d*.md "$out"/fp8-speed-grid.md; do echo "-- $(basename "$f")"; grep '^|' "$f"; done
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
