#!/usr/bin/env bash
# One device call for an FA3 backward change (issue 16), run from the repository root of the
# candidate tree on the H200 machine: builds the candidate (library, test_backward_fa3,
# test_fa3_bwd_turns) and, beside it, the library of a base tree (BASE_SRC, e.g. an archive of main
# unpacked under an ignored folder that travels); times both first, alone on the GPU and under a
# timeout (`bench/ab_backward.py --deterministic`: a turn that never comes hangs the benchmark's
# larger shapes while every test passes - stop 30's first keys-rotated hand-over did), then runs
# test_backward_fa3, ctest's test_fa3_sass / test_fa3_bwd_turns and compute-sanitizer memcheck /
# racecheck / synccheck of the reduced grid. Logs packed into $OUT/logs.tgz (the device tool
# returns a few files only), the A/B table and a summary last. Stop 30 ran the same steps as
#   BASE_SRC=.xfer/main HDIMS=64,128,256 SEQLENS=1024,2048,4096 bash tests/gpu/bwd-branch-check.sh
# TILE_FORMS: ab_backward's --tile-forms (extra B columns, e.g. det:FLASHATTN_FA3_BWD_DET_ORDER=0).
# MID_SRC: a second candidate tree (built like the base), timed as ab_backward's column M; its
# gates are a later call's. The candidate's reduced test_backward_fa3 runs first (SMOKE_LIMIT
# seconds): if it fails or hangs, the A/B times M in its place (B's column then is M's).
# RANDOM_CASES: also test_random_grad_fa3 with that many cases (0: not run).
set -uo pipefail
# Logs are written to a private folder and only ab.md and logs.tgz are copied to OUT, so files that
# the caller's command put there survive (until stop 42 the script's clean-up deleted them).
final=${OUT:-/tmp/bwd-branch} out=/tmp/bwd-branch-work
rm -rf "$out"; mkdir -p "$out" "$final"
deadline=${DEADLINE:-560}
source "$(dirname "$0")/stages.sh"
. "$(dirname "$0")/devdeps-env.sh"; use_devdeps "$PWD"
[ -d .devdeps ] || note "no .devdeps carried (cmocka): the candidate's tests cannot configure"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
cm=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF
    -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real
    -DFLASHATTN_BENCH_CUDA_ARCHS=90-real)
base=/tmp/bwd-branch-base cand=/tmp/bwd-branch-cand  # fresh directories: archived sources carry old mtimes
mid=/tmp/bwd-branch-mid
rm -rf "$base" "$cand" "$mid"
( nice cmake -S "${BASE_SRC:?BASE_SRC: the base tree}" -B "$base" "${cm[@]}" -DBUILD_TESTING=OFF > "$out/cfg-base.log" 2>&1 &&
  nice cmake --build "$base" --target flashattn -j 5 > "$out/build-base.log" 2>&1; echo "base build rc=$?" > "$out/base.rc" ) &
if [ -n "${MID_SRC:-}" ]; then
  ( nice cmake -S "$MID_SRC" -B "$mid" "${cm[@]}" -DBUILD_TESTING=OFF > "$out/cfg-mid.log" 2>&1 &&
    nice cmake --build "$mid" --target flashattn -j 4 > "$out/build-mid.log" 2>&1; echo "mid build rc=$?" > "$out/mid.rc" ) &
fi
cands=(flashattn test_backward_fa3 test_fa3_bwd_turns)
[ "${RANDOM_CASES:-0}" -gt 0 ] && cands+=(test_random_grad_fa3)
cmake -S . -B "$cand" "${cm[@]}" -DBUILD_TESTING=ON > "$out/cfg.log" 2>&1 &&
  cmake --build "$cand" --target "${cands[@]}" -j 9 > "$out/build.log" 2>&1
note "build rc=$? $(tail -1 "$out/build.log" | cut -c1-80)"
wait; note "$(cat "$out/base.rc")${MID_SRC:+; $(cat "$out/mid.rc")}"
lib_b=$cand/src/libflashattn.so mid_args=()
if [ -n "${MID_SRC:-}" ]; then
  FLASHATTN_TEST_REDUCED=1 timeout "${SMOKE_LIMIT:-90}" "$cand/tests/test_backward_fa3" > "$out/smoke.log" 2>&1
  rc=$?; note "smoke (reduced test_backward_fa3 of B) rc=$rc $(grep -aE '^\[ +(PASSED|FAILED) +\]' "$out/smoke.log" | tr '\n' ' ')"
  if [ $rc -eq 0 ]; then mid_args=(--m "$mid/src/libflashattn.so"); else lib_b=$mid/src/libflashattn.so; note "B failed its smoke test: column B is M"; fi
fi
timeout "${AB_LIMIT:-150}" python3 bench/ab_backward.py --a "$base/src/libflashattn.so" --b "$lib_b" "${mid_args[@]}" \
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
if [ "${RANDOM_CASES:-0}" -gt 0 ]; then
  (FLASHATTN_TEST_MIX_CASES=$RANDOM_CASES timeout "$test_limit" "$cand/tests/test_random_grad_fa3" > "$out/random_grad.log" 2>&1
   echo "rc=$?" >> "$out/random_grad.log") &
fi
limit=$(( $(left) - 20 )); [ "$limit" -gt 200 ] && limit=200; pids=()
san_start "$cand/tests/test_backward_fa3"
wait
for order in "" 0; do
  note "test_backward_fa3${order:+ DET_ORDER=$order} $(tail -1 "$out/test_backward_fa3$order.log") $(grep -aE '^\[ +(PASSED|FAILED) +\]' "$out/test_backward_fa3$order.log" | tr '\n' ' ')"
done
note "ctest $(tail -1 "$out/ctest.log") $(grep -aE 'tests passed|Failed' "$out/ctest.log" | tail -1)"
[ -f "$out/random_grad.log" ] && note "test_random_grad_fa3 $(tail -1 "$out/random_grad.log") $(grep -aiE 'cases|fail' "$out/random_grad.log" | tail -2 | tr '\n' ' ' | cut -c1-200)"
san_notes
echo; cat "$out/ab.md" 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
(cd "$out" && tar czf "$final/logs.tgz" .); cp "$out/ab.md" "$final/" 2>/dev/null
