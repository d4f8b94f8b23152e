#!/usr/bin/env bash
# One device call for the softmax's dependency chains (issues 20 and 17): the working tree against
# a base whose softmax headers (device/online_softmax.cuh, fa3/fa3_fp8_kernel.cuh) are main's.
# The tree builds once (FA2 and FA3, sm_90 / sm_90a); the forward units the A/B times (FA2 and FA3
# bf16 at head dims 64 / 128 / 256, FP8 at 64 / 128) compile a second time in parallel with the
# base headers in front on the include path (BASE_HDR, a directory laid out as src/) and replace
# the tree's objects in a copy of the library: the base. Then, in this order: the gate on the tree
# while the base's units compile (ctest with FLASHATTN_TEST_REDUCED=1: test_numerics_fa3 (+ 3
# CTAs), test_numerics_fa2, test_fp8_fa3, test_variants_fa3 / fa2, test_fa3_sass, test_fa2_sass;
# compute-sanitizer memcheck / racecheck / synccheck of test_numerics_fa3's reduced grid on 3
# CTAs), registers / stack of both forms' kernels (cuobjdump), then the A/B (bench/ab_libs.py, FA3
# and FA2 bf16, rounds alternated in one process; flashattn-fp8-accuracy --speed-grid per
# library, rounds alternated, tabled by fp8_grid_table.py). Summary last; logs in $OUT/logs.tgz.
#
#   mkdir -p base/backends/cuda/device base/backends/cuda/fa3   # untracked
#   git show fd7a472:src/backends/cuda/device/online_softmax.cuh > base/backends/cuda/device/online_softmax.cuh
#   git show fd7a472:src/backends/cuda/fa3/fa3_fp8_kernel.cuh > base/backends/cuda/fa3/fa3_fp8_kernel.cuh
#   BASE_HDR=$PWD/base OUT=$OUT timeout 176 bash tests/gpu/smx-ab.sh
#
# Env: ROUNDS (3), AB_SEQLEN (512,1024,2048,8192), FP8_DIMS (64,128), GATE_LIMIT (seconds, 90:
# the SASS tests, cuobjdump of the whole library, did not finish in 45), CALL_LIMIT (172),
# FP8_RESERVE (40). Stop 21's call (docs/performance.md, "stop 21, smx") ran 045c571's form of it.
set -uo pipefail
root=$PWD
out=${OUT:-/tmp/smx-out}
logs=/tmp/smx-logs
mkdir -p "$out" "$logs"
build=/tmp/smx-build
: > "$out/summary.txt"
t_start=$(date +%s)
stamp() { echo "$(( $(date +%s) - t_start ))s"; }
note() { echo "== $1"; echo "$1" >> "$out/summary.txt"; }
finish() {
  tar -czf "$out/logs.tgz" -C "$logs" . 2>/dev/null
  echo; echo "==== bf16 A/B (A = base, B = tree)"
  [ -s "$out/ab-libs.md" ] || grep -E '^\|' "$logs/ab-libs.log" > "$out/ab-libs.md" 2>/dev/null  # cut short: the rows so far
  cat "$out/ab-libs.md" 2>/dev/null
  echo; echo "==== FP8 grid"; cat "$out/fp8.md" 2>/dev/null
  echo; echo "==== summary ($(stamp))"; cat "$out/summary.txt"
}
trap finish EXIT
trap 'exit 143' TERM

source tests/gpu/devdeps-env.sh && use_devdeps "$root"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$logs/configure.log" 2>&1 ||
  { note "configure failed"; tail -20 "$logs/configure.log"; exit 1; }
units=()
for d in 64 128 256; do units+=(src/CMakeFiles/flashattn_fa2.dir/generated/fa2/fa2_fwd_hdim$d.cu.o); done
for d in 64 128 256; do units+=(src/CMakeFiles/flashattn_fa3.dir/generated/fa3/fa3_fwd_hdim$d.cu.o); done
for d in 64 128; do units+=(src/CMakeFiles/flashattn_fa3.dir/backends/cuda/fa3/fa3_fp8_hdim$d.cu.o); done
libname=$(ninja -C "$build" -t targets all | grep -oE '^src/libflashattn\.so\.[0-9]+\.[0-9]+\.[0-9]+' | head -1)
link_cmd=$(ninja -C "$build" -t commands "$libname" | grep -- "-o $libname" | tail -1)
ninja -C "$build" -t commands "${units[@]}" > /dev/null 2>&1 || true  # (generates nothing: a check of the names)
mkdir -p /tmp/smx-base
bpids=()
i=0
for u in "${units[@]}"; do
  cmd=$(ninja -C "$build" -t commands "$u" | tail -1)
  cmd=${cmd/-MD -MT $u -MF $u.d/}
  cmd=${cmd/-o $u/-o /tmp/smx-base/$i.o}
  cmd=${cmd/nvcc /nvcc -I$BASE_HDR }
  # (the generated .cu sources are written by the configure step, so they exist already)
  (cd "$build" && eval "$cmd") > "$logs/base-unit-$i.log" 2>&1 &
  bpids+=($!)
  i=$((i + 1))
done
GATE_TESTS="test_numerics_fa3|test_numerics_fa3_few_ctas|test_numerics_fa2|test_fp8_fa3|test_variants_fa3|test_variants_fa2|test_fa3_sass|test_fa2_sass"
cmake --build "$build" -j 16 --target flashattn test_numerics_fa3 test_numerics_fa2 test_fp8_fa3 test_variants_fa3 \
  test_variants_fa2 flashattn-fp8-accuracy > "$logs/build.log" 2>&1
rc=$?
note "tree build rc=$rc ($(stamp))"
[ $rc = 0 ] || { tail -30 "$logs/build.log"; exit 1; }
# The gate on the tree, started as soon as the tree is built (the GPU is idle while the base's
# units still compile): ctest and the three sanitizers in parallel.
lim=${GATE_LIMIT:-90}
FLASHATTN_TEST_REDUCED=1 timeout "$lim" ctest --test-dir "$build" --output-on-failure -j 4 --timeout "$lim" \
  -R "^(${GATE_TESTS})\$" > "$logs/ctest.log" 2>&1 &
cpid=$!
spids=()
for tool in memcheck racecheck synccheck; do
  FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout "$lim" compute-sanitizer --tool $tool --error-exitcode 99 \
    "$build/tests/test_numerics_fa3" > "$logs/sanitize-$tool.log" 2>&1 &
  spids+=($!)
done
for p in "${bpids[@]}"; do wait "$p" || { note "a base unit failed"; tail -5 "$logs"/base-unit-*.log; exit 1; }; done
lc=$link_cmd
for j in "${!units[@]}"; do lc=${lc/${units[$j]}//tmp/smx-base/$j.o}; done
lc=${lc/-o $libname/-o /tmp/smx-lib-base.so}
(cd "$build" && eval "$lc") > "$logs/link-base.log" 2>&1 || { note "base link failed"; tail "$logs/link-base.log"; exit 1; }
note "base built ($(stamp))"
wait $cpid; note "ctest rc=$? $(grep -E 'tests passed' "$logs/ctest.log") ($(stamp))"
grep -E '^ *[0-9]+/[0-9]+ Test' "$logs/ctest.log" | sed 's/^/   /' >> "$out/summary.txt"
i=0
for tool in memcheck racecheck synccheck; do
  wait "${spids[$i]}"
  note "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$logs/sanitize-$tool.log" | tail -2 | paste -sd ' ') ($(stamp))"
  i=$((i + 1))
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv,noheader >> "$out/summary.txt"
lib=$(readlink -f "$build/$libname")
cp "$lib" /tmp/smx-lib-tree.so
for n in base tree; do mkdir -p /tmp/smx-ld-$n && cp /tmp/smx-lib-$n.so /tmp/smx-ld-$n/libflashattn.so.0; done
on_lib() { local n=$1; shift; LD_LIBRARY_PATH=/tmp/smx-ld-$n${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }

# Registers and stack of the timed kernels, both forms (the forward kernels of the A/B's units).
for n in base tree; do
  cuobjdump -res-usage /tmp/smx-lib-$n.so 2>/dev/null |
    awk '/Function/ { f = $0 } /REG:/ { if (f ~ /fwd_kernel|fp8_fwd/) { match($0, /REG:[0-9]+ STACK:[0-9]+/); print substr($0, RSTART, RLENGTH) } }' |
    sort | uniq -c | paste -sd ' ' | sed "s/^/res-usage $n: /" >> "$out/summary.txt"
done

# The A/B: bf16 FA2 and FA3 in one process (A = base, B = tree), then the FP8 grid per library.
# (CALL_LIMIT: seconds the whole script may take; the bf16 A/B leaves FP8_RESERVE of them to the FP8
# grid, and an FP8 round starts only with 12 s left.)
left() { echo $(( ${CALL_LIMIT:-172} - ($(date +%s) - t_start) )); }
ab_limit=$(( $(left) - ${FP8_RESERVE:-40} )); [ $ab_limit -gt 90 ] && ab_limit=90; [ $ab_limit -lt 20 ] && ab_limit=20
PYTHONUNBUFFERED=1 timeout $ab_limit python3 bench/ab_libs.py --a /tmp/smx-lib-base.so --b /tmp/smx-lib-tree.so \
  --gens fa3,fa2 --hdim 64,128,256 --seqlen "${AB_SEQLEN:-512,1024,2048,8192}" --rounds "${ROUNDS:-3}" \
  --markdown "$out/ab-libs.md" > "$logs/ab-libs.log" 2>&1
note "ab_libs rc=$? ($(stamp)): $(grep -E '^- ' "$out/ab-libs.md" 2>/dev/null | paste -sd ' ')"
acc="$build/bench/flashattn-fp8-accuracy"
for r in $(seq 1 "${ROUNDS:-3}"); do
  [ "$(left)" -lt 12 ] && { note "fp8 round $r not started: time"; break; }
  order="base tree"; [ $((r % 2)) = 0 ] && order="tree base"
  for n in $order; do on_lib "$n" timeout 30 "$acc" --speed-grid "${FP8_DIMS:-64,128}" > "$logs/grid-$n-$r.md" 2>&1; done
done
note "fp8 grid done ($(stamp))"
python3 "$root/tests/gpu/fp8_grid_table.py" "$logs" "${ROUNDS:-3}" base tree --bf16-ratios --means > "$out/fp8.md"

