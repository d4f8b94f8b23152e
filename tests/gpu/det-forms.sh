#!/usr/bin/env bash
# Issue 16's deterministic forms of the FA3 backward on the H200, in one call (run from the
# repository root with .devdeps carried): apply tests/gpu/det-forms.patch (the forms and their knob,
# FLASHATTN_FA3_BWD_DET_FORM; main ships none of them: docs/kernel-notes.md, "Deterministic mode")
# unless the tree has it, build (sm_90 only), then
#   1. test_backward_fa3 once per form (FLASHATTN_FA3_BWD_DET_FORM, read at finalize; the grid's
#      deterministic cases check bitwise reruns) and ctest's test_backward_fa3 / test_fa3_sass with
#      the default form, all in parallel, each under a timeout (a form that deadlocks is killed);
#   2. bench/det_forms.py alone on the GPU: default mode vs every form that passed, rounds
#      alternated (form 0 is main's kernel: the forms are template instantiations of one source);
#   3. compute-sanitizer memcheck / racecheck / synccheck of the reduced test_backward_fa3 grid for
#      the best form per head dim (highest geometric-mean det/default) and for form 0.
# Env: FORMS (default "1 2 3 4 5"), BENCH_ARGS, BUILD_DIR. Under $OUT: summary.txt, det-forms.md
# and logs.tgz (every log; the device tool returns only a few files per call).
set -uo pipefail
final_out=${OUT:-/tmp/det-out}
out=/tmp/det-logs
rm -rf "$out"; mkdir -p "$out" "$final_out"
finish() { tar czf "$final_out/logs.tgz" -C "$out" . 2>/dev/null; cp "$out/det-forms.md" "$final_out/" 2>/dev/null; }
trap finish EXIT
if ! grep -q FLASHATTN_FA3_BWD_DET_FORM src/backends/cuda/fa3/fa3_bwd_host.cpp; then
  patch -p1 -N < tests/gpu/det-forms.patch > "$out/patch.log" 2>&1 || { echo "patch failed"; cat "$out/patch.log"; exit 1; }
fi
b=${BUILD_DIR:-/tmp/fa-det}
forms=${FORMS:-1 2 3 4 5}
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 ))s: $*"; }

OUT=$out BUILD_DIR=$b bash tests/gpu/h200-check.sh build > "$out/build-stage.txt" 2>&1
tail -3 "$out/build-stage.txt"
[ -f "$b/src/libflashattn.so" ] || { echo BUILD FAILED; tail -40 "$out/build.log"; exit 1; }
export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
stamp built

( timeout 75 ctest --test-dir "$b" --output-on-failure -R 'test_backward_fa3|test_fa3_sass' > "$out/ctest.log" 2>&1
  echo "ctest (form 0) rc=$? $(grep -E 'tests passed' "$out/ctest.log")" > "$out/ctest.rc" ) &
for f in $forms; do
  ( FLASHATTN_FA3_BWD_DET_FORM=$f timeout 75 "$b/tests/test_backward_fa3" > "$out/test-form$f.log" 2>&1
    echo "test_backward_fa3 form $f rc=$? $(grep -aE 'PASSED|FAILED' "$out/test-form$f.log" | tail -1)" > "$out/test-form$f.rc" ) &
done
wait
cat "$out"/ctest.rc "$out"/test-form*.rc
stamp tests

ok=0
for f in $forms; do grep -q " rc=0 " "$out/test-form$f.rc" && ok="$ok,$f"; done
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout 100 python3 bench/det_forms.py --lib "$b/src/libflashattn.so" --forms "$ok" \
  ${BENCH_ARGS:---seqlen 2048,4096,8192 --rounds 3} --markdown "$out/det-forms.md" > "$out/det-forms.log" 2>&1
echo "det_forms rc=$?"
stamp bench

# The best form per head dim: the highest geometric mean of det/default over the cells.
best=$(python3 - "$out/det-forms.log" <<'PY'
import math, re, sys
r = {}
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in lines:
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) >= 6 and c[3].startswith("det form"):
        r.setdefault((c[0], c[3].split()[-1]), []).append(float(c[5]))
best = {}
for (d, f), v in r.items():
    g = math.exp(sum(map(math.log, v)) / len(v))
    print(f"hdim {d} form {f}: geometric mean det/default {g:.3f}, lowest {min(v):.3f}", file=sys.stderr)
    if g > best.get(d, (0, None))[0]:
        best[d] = (g, f)
print(" ".join(sorted({f for _, f in best.values()} | {"0"})))
PY
)
san_limit=$(( 258 - ($(date +%s) - t0) )); [ $san_limit -gt 100 ] && san_limit=100
echo "sanitizing forms: $best (limit ${san_limit}s each)"
for f in $best; do
  for tool in memcheck racecheck synccheck; do
    ( FLASHATTN_FA3_BWD_DET_FORM=$f FLASHATTN_TEST_REDUCED=1 timeout $san_limit compute-sanitizer --tool $tool --error-exitcode 99 \
        "$b/tests/test_backward_fa3" > "$out/san-$tool-form$f.log" 2>&1
      echo "$tool form $f rc=$? $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$tool-form$f.log" | tail -1)" \
        > "$out/san-$tool-form$f.rc" ) &
  done
done
wait
stamp sanitizers

{ echo
echo "==== summary"
tail -3 "$out/build-stage.txt" | grep -E "build rc"
cat "$out"/ctest.rc "$out"/test-form*.rc "$out"/san-*.rc 2>/dev/null
awk -F'|' '/^\| (64|128) /{ printf "%s %s %s %-12s %s %s\n", $2, $3, $4, $5, $6, $7 }' "$out/det-forms.log" 2>/dev/null
grep -E "BAD|DIFFERS|FAILED" "$out/det-forms.log" 2>/dev/null | head -5
tail -2 "$out/det-forms.log" 2>/dev/null
} | tee "$final_out/summary.txt"
