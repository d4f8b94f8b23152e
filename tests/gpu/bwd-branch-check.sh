#!/usr/bin/env bash
# One device call for an FA3 backward change (issue 16), run from the repository root of the
# candidate tree on the H200 machine: builds the candidate (library, test_backward_fa3,
# test_fa3_bwd_turns) and, beside it, the library of a base tree (BASE_SRC, e.g. an archive of main
# unpacked under an ignored folder that travels); times both first, alone on the GPU and under a
# timeout (`bench/ab_backward.py --deterministic`: a turn that never comes hangs the benchmark's
# larger shapes while every test passes - stop 30's first keys-rotated hand-over did), then runs
# test_backward_fa3, ctest's test_fa3_sass / test_fa3_bwd_turns and compute-sanitizer memcheck /
# racecheck / synccheck of the reduced grid. Logs under $OUT packed into logs.tgz (the device tool
# returns a few files only), the A/B table and a summary last. Stop 30 ran the same steps as
#   BASE_SRC=.xfer/main HDIMS=64,128,256 SEQLENS=1024,2048,4096 bash tests/gpu/bwd-branch-check.sh
# TILE_FORMS: ab_backward's --tile-forms (extra B columns, e.g. det:FLASHATTN_FA3_BWD_DET_ORDER=0).
set -uo pipefail
out=${OUT:-/tmp/bwd-branch}
mkdir -p "$out"
deadline=${DEADLINE:-560}
source "$(dirname "$0")/stages.sh"
. "$(dirname "$0")/devdeps-env.sh"; use_devdeps "$PWD"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
cm=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF
    -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real
    -DFLASHATTN_BENCH_CUDA_ARCHS=90-real)
base=/tmp/bwd-branch-base cand=/tmp/bwd-branch-cand  # fresh directories: archived sources carry old mtimes
rm -rf "$base" "$cand"
( nice cmake -S "${BASE_SRC:?BASE_SRC: the base tree}" -B "$base" "${cm[@]}" -DBUILD_TESTING=OFF > "$out/cfg-base.log" 2>&1 &&
  nice cmake --build "$base" --target flashattn -j 5 > "$out/build-base.log" 2>&1; echo "base build rc=$?" > "$out/base.rc" ) &
cmake -S . -B "$cand" "${cm[@]}" -DBUILD_TESTING=ON > "$out/cfg.log" 2>&1 &&
  cmake --build "$cand" --target flashattn test_backward_fa3 test_fa3_bwd_turns -j 11 > "$out/build.log" 2>&1
note "build rc=$? $(tail -1 "$out/build.log" | cut -c1-80)"
wait; note "$(cat "$out/base.rc")"
timeout "${AB_LIMIT:-150}" python3 bench/ab_backward.py --a "$base/src/libflashattn.so" --b "$cand/src/libflashattn.so" \
  --gen fa3 --deterministic --hdim "${HDIMS:-64,128,256}" --seqlen "${SEQLENS:-1024,2048,4096}" --rounds "${ROUNDS:-2}" \
  --tile-forms "${TILE_FORMS:-}" --markdown "$out/ab.md" > "$out/ab.txt" 2>&1
note "ab_backward rc=$? (124: timed out - a hang?)"
(cd "$cand" && timeout 150 ctest -R "test_fa3_sass|test_fa3_bwd_turns" --output-on-failure > "$out/ctest.log" 2>&1
 echo "rc=$?" >> "$out/ctest.log") &
# The test twice (the second with the deterministic mode's ascending order, which the first runs
# only where the keys-rotated one is not taken) and the sanitizers, all at once.
test_limit=$(( $(left) - 20 )); [ "$test_limit" -gt 300 ] && test_limit=300
for order in "" 0; do
  (FLASHATTN_FA3_BWD_DET_ORDER=$order timeout "$test_limit" "$cand/tests/test_backward_fa3" > "$out/test_backward_fa3$order.log" 2>&1
   echo "rc=$?" >> "$out/test_backward_fa3$order.log") &
done
limit=$(( $(left) - 20 )); [ "$limit" -gt 200 ] && limit=200; pids=()
san_start "$cand/tests/test_backward_fa3"
wait
for order in "" 0; do
  note "test_backward_fa3${order:+ DET_ORDER=$order} $(tail -1 "$out/test_backward_fa3$order.log") $(grep -aE '^\[ +(PASSED|FAILED) +\]' "$out/test_backward_fa3$order.log" | tr '\n' ' ')"
done
note "ctest $(tail -1 "$out/ctest.log") $(grep -aE 'tests passed|Failed' "$out/ctest.log" | tail -1)"
san_notes
echo; cat "$out/ab.md" 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
(cd "$out" && tar czf /tmp/bwd-branch-logs.tgz . && find . -type f ! -name ab.md -delete && mv /tmp/bwd-branch-logs.tgz logs.tgz)
