#!/usr/bin/env bash
# The FA3 backward's producer warpgroup / dQ writer (issue 16, helper dqw): one device call, run
# from this tree's root on the H200 machine. Builds this tree (h200-check.sh build) and, beside it,
# the library of a base tree (BASE_SRC, main's as it was); then, all at once (correctness only):
# ctest test_backward_fa3 + test_fa3_sass, compute-sanitizer memcheck / racecheck / synccheck of
# test_backward_fa3's reduced grid; then, alone on the GPU, bench/bwd_ab.py (base vs this tree,
# default and deterministic mode, rounds alternated) and, if time is left, backward_torch.py's
# cuDNN column at d128. Every stage has a time limit so that the summary (last) comes back within
# DEADLINE seconds of the start. Logs under $OUT.
#   BASE_SRC=../base BUILD_DIR=/tmp/fa-dqw bash tests/gpu/dqw-check.sh      (from .xfer/dqw)
set -uo pipefail
out=${OUT:-/tmp/dqw-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/fa-dqw}
base_src=${BASE_SRC:-}
base_build=${BASE_BUILD:-${build}-base}
deadline=${DEADLINE:-205}  # seconds from the start by which the summary must be out
limit=${LIMIT:-80}         # seconds for each test / sanitizer run
source "$(dirname "$0")/stages.sh"
finish() { echo; cat "$out/bwd-ab.md" 2>/dev/null | grep -E '^\|'; echo; printf '%s\n' "${summary[@]}"; exit 0; }

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
if [ -n "$base_src" ]; then
  (cmake -S "$base_src" -B "$base_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
     -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_FA1_ARCHS=90-real \
     -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real \
     && cmake --build "$base_build" --target flashattn -j 8) > "$out/base-build.log" 2>&1 &
  base_pid=$!
fi
OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/h200-build.txt" 2>&1
note "build: $(grep -E '^== build' "$out/h200-build.txt")"
[ -x "$build/tests/test_backward_fa3" ] || { tail -30 "$out/build.log"; finish; }

# Correctness, all at once.
pids=()
(timeout $limit ctest --test-dir "$build" --output-on-failure -j 2 -R 'test_backward_fa3$|test_fa3_sass' > "$out/ctest.log" 2>&1
 echo "rc=$?" >> "$out/ctest.log") & pids+=($!)
san_start "$build/tests/test_backward_fa3"
[ -n "$base_src" ] && { wait $base_pid; note "base library: rc=$? $(ls "$base_build"/src/libflashattn.so 2>/dev/null)"; }
wait "${pids[@]}"
note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log") $(grep -E 'Failed|Passed' "$out/ctest.log" | grep -E '^ *[0-9]+/' | tr -s ' ' | tr '\n' ';')"
san_notes
grep -E "FAIL|mismatch|differ" "$out/ctest.log" | head -5 | sed 's/^/   /'

# Speed, alone on the GPU.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
if [ -f "$base_build/src/libflashattn.so" ] && [ "$(left)" -gt 30 ]; then
  timeout $(( $(left) - 8 )) python3 bench/bwd_ab.py --a "$base_build/src/libflashattn.so" --b "$build/src/libflashattn.so" \
    --hdim 64,128 --seqlen ${SEQLEN:-2048,4096,8192} --rounds ${ROUNDS:-3} --markdown "$out/bwd-ab.md" > "$out/bwd-ab.txt" 2>&1
  note "bwd_ab.py rc=$? ($(tail -1 "$out/bwd-ab.txt"))"
fi
if [ "$(left)" -gt 35 ]; then
  timeout $(( $(left) - 5 )) python3 bench/backward_torch.py --lib "$build/src/libflashattn.so" --gens fa3 --hdim 128 \
    --seqlen 2048,4096,8192 --markdown "$out/cudnn.md" > "$out/cudnn.txt" 2>&1
  note "backward_torch.py d128 rc=$?"
  grep -E '^\|' "$out/cudnn.md" 2>/dev/null | head -12
fi
finish
