#!/usr/bin/env bash
# One device call for FA3 FP8 forward speed work (issue 17): the working tree's FP8 kernel with its
# speed knobs as set (variant "new"), the same with knobs overridden by -D flags (VARIANTS), and a
# base kernel header (BASE_KERNEL, e.g. main's fa3_fp8_kernel.cuh from `git show`; variant "base")
# are built side by side: the tree builds once (FA3 only, as tests/gpu/fp8-tune.sh), the two FP8
# kernel units of every other variant compile in parallel with it (the same nvcc lines, -D flags
# or an include directory holding the base header in front) and link into their own copy of the
# library. Then the FP8 speed grid (flashattn-fp8-accuracy --speed-grid: FP8 against bf16 FA3)
# runs ROUNDS times per variant, the variants alternating in each round, and the correctness gate
# runs on the working tree's form: test_fp8_fa3 (+ 3 CTAs), test_fp8_primitives, test_fa3_sass,
# compute-sanitizer memcheck / racecheck / synccheck on the reduced grid. A quick kernel test runs
# on every variant before it is timed. Summary last; logs in $OUT.
#
#   git show 6ce9c73:src/backends/cuda/fa3/fa3_fp8_kernel.cuh > tests/gpu/fp8-ab/main-kernel.cuh  # untracked
#   VARIANTS="nolazy:-DFLASHATTN_FP8_LAZY_RESCALE=false" BASE_KERNEL=tests/gpu/fp8-ab/main-kernel.cuh \
#     OUT=$OUT bash tests/gpu/fp8-ab.sh
# (the knobs: FLASHATTN_FP8_* at the top of fa3_fp8_kernel.cuh). A variant whose quick test fails
# or hangs is not timed; only "new" goes through the gate, and only if its quick test passed.
# Order: build, quick tests, one speed round, the gate, then further speed rounds while time is left.
#
# Env: BUILD_DIR (default /tmp/fa-fp8), ROUNDS (2), GATE_EXTRA (variant names that also get the
# kernel tests and sanitizers, on their own library, beside new's gate), VARIANTS (space-separated NAME:FLAGS, FLAGS
# comma-separated), BASE_KERNEL (optional; its head dim 64 unit runs the 128 kernel, as before
# fa3_fp8_hdim64.cu, unless BASE_FLAGS="": the flags of the base's units, for a base from main
# since stop 20), GRID_DIMS (64,128,256), SPEED_DEADLINE (150: seconds
# after which no further speed round starts), CALL_LIMIT (225: seconds the whole script may take;
# the gate gets what the first round left of it, at least 60 s), NCU_DIMS (e.g. "128 64": after the
# first round, ncu profiles new's FP8 kernel on the 16k non-causal cell of each head dim, the
# sections of fp8-tune.sh, summarized by ncu-source-summary.py), GATE_REDUCED (test programs that
# also run beside the gate with FLASHATTN_TEST_REDUCED=1 on new's library, e.g. test_numerics_fa3;
# built here), BASE_TREE (a whole source tree, e.g. main's
# snapshot: its library, configured as the tree's and built beside it in BASE_TREE_BUILD, default
# /tmp/fp8-basetree, is variant "main", so that bf16 FA3 is compared too, not only the FP8
# kernel), SMI_LOG (1: nvidia-smi logs SM clock, power and temperature every 20 ms during each
# speed run, and fp8_clock_table.py matches them to each cell's timed window: clocks.md),
# GRID_TABLE_FLAGS (fp8_grid_table.py's --bf16-ratios, --means).
set -uo pipefail
source "$(dirname "$0")/fp8-gate.sh"  # fp8_gate_start / fp8_gate_wait / fp8_res_usage
out=${OUT:-/tmp/fp8ab-out}
logs=$out/logs
mkdir -p "$out" "$logs"
build=${BUILD_DIR:-/tmp/fa-fp8}
rounds=${ROUNDS:-2}
: > "$out/summary.txt"
note() { echo "== $1"; echo "$1" >> "$out/summary.txt"; }
t_start=$(date +%s)
stamp() { echo "$(( $(date +%s) - t_start ))s"; }
finish() {
  [ -s "$out/clocks.md" ] && { echo; echo "==== SM clock / power per cell"; cat "$out/clocks.md"; }
  echo; echo "==== speed (TFLOP/s FP8; bf16 alongside)"; cat "$out/speed.md" 2>/dev/null
  echo; echo "==== summary ($(stamp))"; cat "$out/summary.txt"
}
trap finish EXIT
trap 'exit 143' TERM

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"  # cmocka from Debian, carried
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS= \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$logs/configure.log" 2>&1 ||
  { note "configure failed"; tail -20 "$logs/configure.log"; exit 1; }
units=(src/CMakeFiles/flashattn_fa3.dir/backends/cuda/fa3/fa3_fp8_hdim64.cu.o
       src/CMakeFiles/flashattn_fa3.dir/backends/cuda/fa3/fa3_fp8_hdim128.cu.o
       src/CMakeFiles/flashattn_fa3.dir/backends/cuda/fa3/fa3_fp8_hdim256.cu.o)
libname=src/libflashattn.so.0.3.0
link_cmd=$(ninja -C "$build" -t commands "$libname" | grep -- "-o $libname" | tail -1)

# A whole base tree's library (variant "main"), built beside the tree's (FA3 only, as configured here).
if [ -n "${BASE_TREE:-}" ]; then
  bt_build=${BASE_TREE_BUILD:-/tmp/fp8-basetree}
  ( cmake -S "$BASE_TREE" -B "$bt_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS= \
      -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real &&
    cmake --build "$bt_build" -j 16 --target flashattn ) > "$logs/build-main.log" 2>&1 &
  bt_pid=$!
fi

unit_cmds=()
for u in "${units[@]}"; do unit_cmds+=("$(ninja -C "$build" -t commands "$u" | tail -1)"); done

# The other variants' units, in the background of the tree's build.
names=() ; vpids=()
compile_variant() {  # name flags...
  local name=$1; shift
  mkdir -p "/tmp/fp8v-$name"
  local i=0 u cmd pids=() rc=0
  for u in "${units[@]}"; do
    cmd=${unit_cmds[$i]}
    cmd=${cmd/-MD -MT $u -MF $u.d/}
    cmd=${cmd/-o $u/-o /tmp/fp8v-$name/$i.o}
    cmd=${cmd/nvcc /nvcc -Xptxas -v $* }
    (cd "$build" && eval "$cmd") > "$logs/ptxas-$name-$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
if [ -n "${BASE_KERNEL:-}" ]; then
  mkdir -p /tmp/fp8v-hdr/backends/cuda/fa3
  cp "$BASE_KERNEL" /tmp/fp8v-hdr/backends/cuda/fa3/fa3_fp8_kernel.cuh
  # A header from before kFp8TileN (the units report it to the host): 128 keys everywhere.
  grep -q kFp8TileN "$BASE_KERNEL" ||
    echo 'namespace flashattn { namespace fa3 { template <int kD> constexpr int kFp8TileN = kFp8BlockN; } }' \
      >> /tmp/fp8v-hdr/backends/cuda/fa3/fa3_fp8_kernel.cuh
  # (head dims <= 64 ran the head-dim-128 kernel before fa3_fp8_hdim64.cu: the base's unit does so too)
  # (BASE_FLAGS="" for a base header that has fa3_fp8_hdim64.cu's own kernel: main since stop 20)
  names+=(base); compile_variant base -I/tmp/fp8v-hdr ${BASE_FLAGS--DFLASHATTN_FP8_HDIM64_TILE=128} & vpids+=($!)
fi
for v in ${VARIANTS:-}; do
  n=${v%%:*}; f=${v#*:}
  names+=("$n"); compile_variant "$n" ${f//,/ } & vpids+=($!)
done
cmake --build "$build" -j 16 --target flashattn test_fp8_fa3 test_fp8_primitives flashattn-fp8-accuracy \
  ${GATE_REDUCED:-} > "$logs/build.log" 2>&1
rc=$?
note "build rc=$rc ($(stamp))"
[ $rc = 0 ] || { tail -30 "$logs/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >> "$out/summary.txt"
lib=$(readlink -f "$build/$libname")
cp "$lib" /tmp/fp8v-lib-new.so
all=(new)
i=0
for n in "${names[@]}"; do
  if wait "${vpids[$i]}"; then
    lc=$link_cmd
    for j in "${!units[@]}"; do lc=${lc/${units[$j]}//tmp/fp8v-$n/$j.o}; done
    lc=${lc/-o $libname/-o /tmp/fp8v-lib-$n.so}
    if (cd "$build" && eval "$lc") > "$logs/link-$n.log" 2>&1; then
      all+=("$n")
      note "variant $n built ($(stamp)): $(cat "$logs"/ptxas-$n-*.log | grep -E 'spill|C75' | sort | uniq -c | paste -sd ' ' | cut -c1-200)"
    else note "variant $n: link failed"; fi
  else note "variant $n: compile failed ($(tail -3 "$logs"/ptxas-$n-*.log | paste -sd ' ' | cut -c1-300))"; fi
  i=$((i + 1))
done

if [ -n "${BASE_TREE:-}" ]; then
  if wait "$bt_pid" && cp "$(readlink -f "$bt_build/$libname")" /tmp/fp8v-lib-main.so; then
    all+=(main); note "variant main (the base tree) built ($(stamp))"
  else note "variant main: build failed ($(tail -3 "$logs/build-main.log" | paste -sd ' ' | cut -c1-300))"; fi
fi

use_lib() { cp "/tmp/fp8v-lib-$1.so" "$lib"; }
# Each variant's library also as libflashattn.so.0 in a directory of its own: with it first in
# LD_LIBRARY_PATH (which beats the tests' RUNPATH) tests of several variants run at once.
for n in "${all[@]}"; do mkdir -p "/tmp/fp8v-ld-$n" && cp "/tmp/fp8v-lib-$n.so" "/tmp/fp8v-ld-$n/libflashattn.so.0"; done
on_lib() { local n=$1; shift; LD_LIBRARY_PATH=/tmp/fp8v-ld-$n${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
ok=() qpids=()
for n in "${all[@]}"; do  # the quick tests of all variants at once
  FLASHATTN_TEST_FP8_QUICK=1 on_lib "$n" timeout 40 "$build/tests/test_fp8_fa3" > "$logs/quick-$n.log" 2>&1 &
  qpids+=($!)
done
i=0
for n in "${all[@]}"; do
  wait "${qpids[$i]}"; rc=$?
  note "quick $n rc=$rc: $(grep -E 'largest' "$logs/quick-$n.log" | paste -sd ' ' | cut -c1-160)"
  [ $rc = 0 ] && ok+=("$n")
  i=$((i + 1))
done
note "quick tests done ($(stamp))"

acc="$build/bench/flashattn-fp8-accuracy"
summarize() {  # the medians so far into speed.md (after every round: the call may be cut short)
python3 "$(dirname "$0")/fp8_grid_table.py" "$out" "${rounds}" "${ok[@]}" ${GRID_TABLE_FLAGS:-} > "$out/speed.md"
[ "${SMI_LOG:-0}" = 1 ] && python3 "$(dirname "$0")/fp8_clock_table.py" "$logs" "${rounds}" "${ok[@]}" > "$out/clocks.md" 2>&1
}
smi_fields=timestamp,clocks.sm,power.draw,temperature.gpu
if [ "${SMI_LOG:-0}" = 1 ]; then  # the throttle reasons and the instant power where this driver has them
  for f in clocks_event_reasons.active power.draw.instant; do
    nvidia-smi --query-gpu=$f --format=csv,noheader > /dev/null 2>&1 && smi_fields+=,$f
  done
  note "smi fields: $smi_fields; $(nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv,noheader)"
fi
speed_round() {
  local n smi
  for n in "${ok[@]}"; do
    use_lib "$n"
    if [ "${SMI_LOG:-0}" = 1 ]; then
      nvidia-smi --query-gpu=$smi_fields --format=csv,noheader,nounits -lms 20 > "$logs/smi-$n-$1.csv" 2>&1 &
      smi=$!
    fi
    timeout 60 "$acc" --speed-grid "${GRID_DIMS:-64,128,256}" > "$out/grid-$n-$1.md" 2> "$logs/cells-$n-$1.txt"
    [ "${SMI_LOG:-0}" = 1 ] && kill "$smi" 2>/dev/null && wait "$smi" 2>/dev/null
  done
  note "speed round $1 done ($(stamp))"
  summarize
}
speed_round 1

# ncu of new's kernel (one launch: the 16k non-causal cell, the fourth of the grid's cells of a
# head dim, 21 FP8 launches each: a warm-up and 20 timed).
use_lib new
for d in ${NCU_DIMS:-}; do
  timeout 60 ncu --clock-control none --kernel-name regex:fp8_fwd_kernel --launch-skip 63 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section SourceCounters --section LaunchStats \
    --section InstructionStats --import-source yes -f -o "$logs/ncu-d$d" "$acc" --speed-grid $d > "$logs/ncu-d$d.log" 2>&1
  note "ncu d$d rc=$? ($(stamp))"
  ncu -i "$logs/ncu-d$d.ncu-rep" --page details > "$out/ncu-d$d-details.txt" 2>&1
  ncu -i "$logs/ncu-d$d.ncu-rep" --page source --csv --print-source sass > "$logs/ncu-d$d-source.csv" 2>&1
  python3 tests/gpu/ncu-source-summary.py "$logs/ncu-d$d-source.csv" --top 30 > "$out/ncu-d$d-summary.txt" 2>&1
done

# The correctness gate on the working tree's form (only if its quick test passed: a hang would
# take the rest of the call), with what the first round left of CALL_LIMIT.
use_lib new
if [[ " ${ok[*]} " == *" new "* ]]; then
  left=$(( ${CALL_LIMIT:-225} - ($(date +%s) - t_start) - 10 ))
  [ $left -lt 60 ] && left=60
  note "gate limit ${left}s"
  fp8_gate_start "" "$left"
  rjobs=() rpids=()
  for tp in ${GATE_REDUCED:-}; do
    FLASHATTN_TEST_REDUCED=1 timeout "$left" "$build/tests/$tp" > "$logs/gate-reduced-$tp.log" 2>&1 &
    rjobs+=("$tp"); rpids+=($!)
  done
  # GATE_EXTRA variants (their quick test passed): test_fp8_fa3 in full and on 3 CTAs, and the
  # three sanitizers on the reduced grid, each on the variant's own library, beside new's gate.
  xjobs=() xpids=()
  for n in ${GATE_EXTRA:-}; do
    [[ " ${ok[*]} " == *" $n "* ]] || { note "gate $n skipped: quick test failed"; continue; }
    on_lib "$n" timeout "$left" "$build/tests/test_fp8_fa3" > "$logs/gate-$n-full.log" 2>&1 &
    xjobs+=("$n full"); xpids+=($!)
    FLASHATTN_FA3_MAX_CTAS=3 on_lib "$n" timeout "$left" "$build/tests/test_fp8_fa3" > "$logs/gate-$n-ctas3.log" 2>&1 &
    xjobs+=("$n ctas3"); xpids+=($!)
    for tool in memcheck racecheck synccheck; do
      FLASHATTN_TEST_FP8_QUICK=1 FLASHATTN_FA3_MAX_CTAS=3 on_lib "$n" timeout "$left" compute-sanitizer --tool $tool \
        --error-exitcode 99 "$build/tests/test_fp8_fa3" > "$logs/gate-$n-$tool.log" 2>&1 &
      xjobs+=("$n $tool"); xpids+=($!)
    done
  done
  fp8_gate_wait
  for i in "${!rpids[@]}"; do
    wait "${rpids[$i]}"
    note "reduced ${rjobs[$i]} rc=$?: $(grep -hE 'PASSED|FAILED|tests' "$logs/gate-reduced-${rjobs[$i]}.log" | tail -2 | paste -sd ' ' | cut -c1-200) ($(stamp))"
  done
  for i in "${!xpids[@]}"; do
    wait "${xpids[$i]}"; rc=$?
    set -- ${xjobs[$i]}
    note "gate $1 $2 rc=$rc: $(grep -hE 'cases checked|largest|ERROR SUMMARY|RACECHECK SUMMARY' "$logs/gate-$1-$2.log" | tail -2 | paste -sd ' ' | cut -c1-200) ($(stamp))"
  done
else
  note "gate skipped: new failed its quick test"
fi
fp8_res_usage "$lib" " (new)"

for r in $(seq 2 "$rounds"); do
  # No new round after SPEED_DEADLINE seconds (default 150).
  if [ $(( $(date +%s) - t_start )) -gt "${SPEED_DEADLINE:-150}" ]; then
    note "speed rounds $r.. skipped (time)"; break
  fi
  speed_round "$r"
done
use_lib new
summarize

