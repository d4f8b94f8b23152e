#!/usr/bin/env bash
# Stop 22 (helper bwd128, issue 16): the one-call check of the FA3 backward's default-mode levers,
# run from this tree's root on the H200 machine. Builds, at once: this tree (B: FA2 + FA3, the
# library and test_backward_fa3 / test_exec_contract), the library of a base tree (A, BASE_SRC,
# FA3 only) and, when MID_PATCH is given, of this tree with that patch reversed (M: the
# intermediate lever alone, FA3 only). Then, alone on the GPU, bench/ab_backward.py --gen fa3
# --deterministic (A, M, B, A det, B det, torch-flash, rounds rotated), leaving CHECK_RESERVE
# seconds; then, all at once (correctness only, in the time left): ctest test_backward_fa3 +
# test_exec_contract + test_fa3_sass, compute-sanitizer memcheck / racecheck / synccheck of
# test_backward_fa3's reduced grid (3 CTAs); last, if time is left, backward_torch.py's FA2 /
# cuDNN columns for B at d128. Every
# stage has a time limit so that the summary (last) is out within DEADLINE seconds. Logs under $OUT
# (one logs.tgz beside the tables).
#   BASE_SRC=../base MID_PATCH=lever2.patch DEADLINE=190 bash tests/gpu/bwd128-check.sh   (from .xfer/bwd128)
# Stop 22 wrote it for the levers of commits 3680cab (M) and c6564e7 (B), with lever2.patch =
# `git diff 3680cab c6564e7`; they were reverted unmeasured (d31996b: no machine for the call), so
# run it from a tree with both applied (e.g. `git revert d31996b` on a branch).
set -uo pipefail
out=${OUT:-/tmp/bwd128-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/bwd128-new}
base_src=${BASE_SRC:-../base}
mid_patch=${MID_PATCH:-}
deadline=${DEADLINE:-190}
source "$(dirname "$0")/stages.sh"
source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"
fa3only=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF
         -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS= -DFLASHATTN_FA3_ARCHS=90a-real)
finish() {
  echo; grep -E '^\|' "$out/ab-backward.md" 2>/dev/null; echo; grep -E '^\|' "$out/cudnn.md" 2>/dev/null
  echo; echo "==== summary"; printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
  (cd "$out" && tar czf /tmp/bwd128-logs.tgz . && find . -type f ! -name summary.txt ! -name ab-backward.md ! -name cudnn.md -delete \
     && mv /tmp/bwd128-logs.tgz logs.tgz)
  exit 0
}
(cmake -S "$base_src" -B /tmp/bwd128-base "${fa3only[@]}" && cmake --build /tmp/bwd128-base --target flashattn -j 12) > "$out/base-build.log" 2>&1 &
base_pid=$!
mid_pid=
if [ -n "$mid_patch" ]; then
  rm -rf /tmp/bwd128-msrc && cp -r "$PWD/." /tmp/bwd128-msrc \
    && (cd /tmp/bwd128-msrc && { patch -R -p1 < "$mid_patch" || git apply -R "$mid_patch"; }) > "$out/mid-patch.log" 2>&1
  note "mid tree: patch -R rc=$?"
  (cmake -S /tmp/bwd128-msrc -B /tmp/bwd128-mid "${fa3only[@]}" && cmake --build /tmp/bwd128-mid --target flashattn -j 12) > "$out/mid-build.log" 2>&1 &
  mid_pid=$!
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF \
  -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real \
  -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 \
  && cmake --build "$build" --target flashattn test_backward_fa3 test_exec_contract -j 16 > "$out/build.log" 2>&1
note "build B rc=$?"
[ -x "$build/tests/test_backward_fa3" ] || { tail -30 "$out/build.log"; finish; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1

# Speed first, alone on the GPU (the tests and sanitizers take whatever time is left after it).
wait $base_pid; note "base library: rc=$? $(ls /tmp/bwd128-base/src/libflashattn.so 2>/dev/null)"
[ -n "$mid_pid" ] && { wait $mid_pid; note "mid library: rc=$? $(ls /tmp/bwd128-mid/src/libflashattn.so 2>/dev/null)"; }
if [ -f /tmp/bwd128-base/src/libflashattn.so ] && [ "$(left)" -gt 30 ]; then
  m_arg=()
  [ -f /tmp/bwd128-mid/src/libflashattn.so ] && m_arg=(--m /tmp/bwd128-mid/src/libflashattn.so)
  timeout $(( $(left) - ${CHECK_RESERVE:-60} )) python3 bench/ab_backward.py --gen fa3 --deterministic \
    --a /tmp/bwd128-base/src/libflashattn.so --b "$build/src/libflashattn.so" "${m_arg[@]}" \
    --hdim ${HDIMS:-64,128,256} --seqlen ${SEQLENS:-2048,8192} --rounds ${ROUNDS:-3} \
    --markdown "$out/ab-backward.md" > "$out/ab-backward.txt" 2>&1
  note "ab_backward.py rc=$? ($(tail -1 "$out/ab-backward.txt" | cut -c1-120))"
fi
# Correctness, all at once.
pids=()
(timeout $(( $(left) - 6 )) ctest --test-dir "$build" --output-on-failure -j 3 -R 'test_backward_fa3$|test_fa3_sass|test_exec_contract' \
   > "$out/ctest.log" 2>&1; echo "rc=$?" >> "$out/ctest.log") & pids+=($!)
limit=$(( $(left) - 6 )); san_start "$build/tests/test_backward_fa3" FLASHATTN_FA3_MAX_CTAS=3
wait "${pids[@]}"
note "ctest $(tail -1 "$out/ctest.log") $(grep -E 'tests passed' "$out/ctest.log") $(grep -E 'Failed|Passed|Skipped' "$out/ctest.log" | grep -E '^ *[0-9]+/' | tr -s ' ' | tr '\n' ';')"
san_notes
grep -E "FAIL|mismatch|differ" "$out/ctest.log" | head -5 | sed 's/^/   /'

if [ "$(left)" -gt 15 ]; then
  timeout $(( $(left) - 3 )) python3 bench/backward_torch.py --lib "$build/src/libflashattn.so" --gens fa2,fa3 --hdim 128 \
    --seqlen 2048,8192 --markdown "$out/cudnn.md" > "$out/cudnn.txt" 2>&1
  note "backward_torch.py d128 rc=$?"
fi
finish
