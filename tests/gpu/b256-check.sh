#!/usr/bin/env bash
# The FA3 backward at head dims 192 / 256 (issue 16, helper b256, stop 21): one device call, run
# from this tree's root on the H200 machine. Builds this tree (only the library and the tests it
# runs); then, all at once (correctness): ctest test_backward_fa3, test_backward_fa2, test_fa3_sass,
# test_exec_contract, and compute-sanitizer memcheck / racecheck / synccheck of test_backward_fa3's
# reduced grid; then, alone on the GPU, bench/backward_torch.py (fa2 and fa3, default and
# deterministic mode, beside torch-flash and cuDNN) at head dims 256 and 192, seqlen 2k and 8k,
# causal and not. Every stage has a time limit so that the summary (last) comes back within
# DEADLINE seconds of the start. Logs under $OUT.
#   BUILD_DIR=/tmp/fa-b256 bash tests/gpu/b256-check.sh      (from .xfer/b256)
set -uo pipefail
out=${OUT:-/tmp/b256-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-b256}
deadline=${DEADLINE:-225}  # seconds from the start by which the summary must be out
limit=${LIMIT:-75}         # seconds for each test / sanitizer run
source "$(dirname "$0")/stages.sh"
finish() {
  echo; grep -hE '^\|' "$out/bwd.md" 2>/dev/null || grep -hE '^\|' "$out/bwd.txt" 2>/dev/null
  echo; printf '%s\n' "${summary[@]}"
  tar -C "$out" -czf "$out/../b256-logs.tgz" . 2>/dev/null && mv "$out/../b256-logs.tgz" "$out/"
  exit 0
}

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_BENCH=OFF \
  -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS=90-real -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real \
  > "$out/configure.log" 2>&1 \
  && cmake --build "$build" -j 16 --target flashattn test_backward_fa3 test_backward_fa2 test_exec_contract \
  > "$out/build.log" 2>&1
note "build rc=$?"
[ -x "$build/tests/test_backward_fa3" ] || { grep -E 'error|Error' "$out/build.log" | head -20; tail -20 "$out/build.log"; finish; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1

# Correctness, all at once.
pids=()
(timeout $limit ctest --test-dir "$build" --output-on-failure -j 4 \
   -R 'test_backward_fa3$|test_backward_fa2$|test_fa3_sass|test_exec_contract' > "$out/ctest.log" 2>&1
 echo "rc=$?" >> "$out/ctest.log") & pids+=($!)
san_start "$build/tests/test_backward_fa3" FLASHATTN_FA3_MAX_CTAS=3
wait "${pids[@]}"
note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log") $(grep -E 'Failed|Passed|Skipped' "$out/ctest.log" | grep -E '^ *[0-9]+/' | tr -s ' ' | tr '\n' ';')"
san_notes
grep -E "FAILED|mismatch|differ|rel err" "$out/ctest.log" | head -8 | sed 's/^/   /'
grep -E "hgmma=.*d256|BwdTraitsILi256" "$out/ctest.log" | head -4 | sed 's/^/   /'

# Speed, alone on the GPU.
if [ "$(left)" -gt 30 ]; then
  timeout $(( $(left) - 6 )) python3 bench/backward_torch.py --lib "$build/src/libflashattn.so" --gens fa3,fa2 \
    --hdim 256,192 --seqlen 2048,8192 --markdown "$out/bwd.md" > "$out/bwd.txt" 2>&1
  note "backward_torch.py rc=$? ($(tail -1 "$out/bwd.txt"))"
fi
finish
