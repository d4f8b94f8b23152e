#!/usr/bin/env bash
# Issue 18's paged decode bar in one device call, from the candidate tree's root: builds this tree
# (FA2 on sm_90: the library, flashattn-bench, test_serving_fa2, test_exec_contract) and an older
# source tree's library alone (BASE), runs this tree's serving tests (test_serving_fa2 and its
# gather run), test_exec_contract and test_fa2_sass, compute-sanitizer memcheck / racecheck /
# synccheck on test_serving_fa2's reduced grid, then times decode steps (flashattn-bench --decode,
# b 1/8/64 x 16k/32k/128k keys, 32/8 heads, bf16) at head dims 128 and 64, contiguous and in pages
# of 16 (shuffled; this tree also with an in-order table, FLASHATTN_BENCH_PAGES_IN_ORDER=1). Both
# libraries run under this tree's bench (the C ABI is the same; LD_LIBRARY_PATH picks the library
# over the bench's RUNPATH), alternated per configuration, the order flipped per round, while time
# is left (AB_DEADLINE seconds from the start); between the rounds, if PAGED_AB_NCU=1 and time is
# left, ncu of this tree's paged step (b 8, 32k, d 128); last, which kernels' SASS differs. The
# summary (paged-ab.md) is printed last. For a short call: PAGED_AB_DIMS="128" (head dims timed,
# default "128 64"), PAGED_AB_INORDER=0 (no in-order table runs), PAGED_AB_SASS=0 (no SASS diff),
# PAGED_AB_D64_CELLS="--decode-batch 1,8 --decode-seqlen 32768" (head dim 64 on fewer cells: the
# bench's last value of an option wins).
#
#   OUT=$OUT tests/gpu/paged-ab.sh /path/to/base/source
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
base_src=$1
source "$root/tests/gpu/ab-common.sh"  # ab_setup, el, note, summary, devdeps, serving_checks
ab_setup paged-ab 225 20
( cmake -S "$base_src" -B $base_bld "${cfg[@]}" -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_BENCH=OFF \
    && cmake --build $base_bld --target flashattn -j 6 ) > "$out/build-base.log" 2>&1 & pb=$!
( cmake -S "$root" -B $new_bld "${cfg[@]}" \
    && cmake --build $new_bld --target flashattn flashattn-bench test_serving_fa2 test_exec_contract -j 12 ) \
  > "$out/build-new.log" 2>&1 & pn=$!
wait $pn; rn=$?
note "build new rc=$rn"
[ $rn = 0 ] || tail -30 "$out/build-new.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1

# The tests first, while the base library still builds (CPU only).
[ $rn = 0 ] && serving_checks $new_bld ${AB_TEST_TIMEOUT:-70}
wait $pb; rb=$?
note "build base rc=$rb"
[ $rb = 0 ] || tail -30 "$out/build-base.log"
for tag in base new; do
  bld=$base_bld; [ $tag = new ] && bld=$new_bld
  lib=$(ls $bld/src/libflashattn.so 2>/dev/null) || continue
  cuobjdump --dump-resource-usage "$lib" 2>/dev/null | awk '/Function/ { fn = $2 } /REG:/ && fn ~ /fwd_kernel/ { print $1, $2, $3, $4, fn }' \
    > "$out/regs-$tag.txt"
done
bench=$new_bld/bench/flashattn-bench
LD_LIBRARY_PATH=$base_bld/src:${LD_LIBRARY_PATH:-} ldd $bench | grep flashattn > "$out/ldd-base.txt" 2>&1

common=(--backend fa2 --decode --decode-kv-heads 8 --no-standard --decode-batch 1,8,64
        --decode-seqlen 16384,32768,131072 --warmup 5 --reps "$reps")
run_one() {  # round tag d page order(shuf|inorder) stop
  local round=$1 tag=$2 d=$3 page=$4 order=$5 stop=$6 left bld
  left=$(( stop - $(el) ))
  [ $left -ge 12 ] || { note "bench round $round stopped at ${stop}s"; return 1; }
  [ $left -le 40 ] || left=40
  bld=$base_bld; [ $tag = new ] && bld=$new_bld
  [ -f $bld/src/libflashattn.so ] || return 0
  local io=0; [ $order = inorder ] && io=1
  local cells=(); [ $d = 64 ] && cells=(${PAGED_AB_D64_CELLS:-})
  FLASHATTN_BENCH_PAGES_IN_ORDER=$io LD_LIBRARY_PATH=$bld/src:${LD_LIBRARY_PATH:-} timeout $left $bench "${common[@]}" \
    "${cells[@]}" --decode-head-dim "$d" --page-size "$page" > "$out/bench/r$round-$tag-d$d-p$page-$order.txt" 2>&1
}
bench_round() {  # round stop: configurations by importance, libraries alternated
  local round=$1 stop=$2 a=base b=new
  [ $((round % 2)) = 0 ] && { a=new; b=base; }
  local confs=() dd
  for dd in ${PAGED_AB_DIMS:-128 64}; do confs+=("$dd 16" "$dd 0"); done
  for conf in "${confs[@]}"; do
    set -- $conf
    if [ $2 = 0 ]; then  # contiguous: the same kernels in both trees (checked by the SASS test): this tree's only
      run_one $round new $1 0 shuf $stop || return
    else
      run_one $round $a $1 $2 shuf $stop || return
      run_one $round $b $1 $2 shuf $stop || return
    fi
  done
  if [ "${PAGED_AB_INORDER:-1}" = 1 ]; then run_one $round new 128 16 inorder $stop || return; fi
  note "bench round $round done"
}
ncu_step() {  # this tree's paged step (b 8, 32k, d 128, pages of 16), between the rounds
  [ "${PAGED_AB_NCU:-0}" = 1 ] && [ $(( deadline - $(el) )) -ge 45 ] || return 0
  LD_LIBRARY_PATH=$new_bld/src:${LD_LIBRARY_PATH:-} timeout 25 ncu --clock-control none -k regex:fwd_kernel -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats $bench --backend fa2 --decode --decode-kv-heads 8 --no-standard --decode-batch 8 \
    --decode-seqlen 32768 --warmup 0 --reps 1 --page-size 16 > "$out/ncu-new.txt" 2>&1
  note "ncu new rc=$?"
}
if [ $rn = 0 ]; then
  bench_round 1 $(( deadline - ${PAGED_AB_R2:-60} ))  # round 2 gets the last PAGED_AB_R2 seconds
  ncu_step
  bench_round 2 "$deadline"
fi

# Which kernels' SASS differs between the libraries (addresses, constants and branch labels
# stripped; anonymous namespaces carry per-build names). Last: dumping both libraries takes ~60 s.
for tag in base new; do
  [ "${PAGED_AB_SASS:-1}" = 1 ] || break
  bld=$base_bld; [ $tag = new ] && bld=$new_bld
  [ -f $bld/src/libflashattn.so ] && cuobjdump -sass $bld/src/libflashattn.so 2>/dev/null \
    | sed -E 's@/\*[0-9a-f]{4}\*/@@; s@/\* 0x[0-9a-f]+ \*/@@; s@0x[0-9a-f]+@X@g; s@\.L_x_[0-9]+@L@g; s@_GLOBAL__N__[0-9a-f]+_@_GLOBAL__N__@g' > /tmp/pg-sass-$tag.txt
done
[ "${PAGED_AB_SASS:-1}" = 1 ] && python3 - /tmp/pg-sass-base.txt /tmp/pg-sass-new.txt > "$out/sass-diff.txt" 2>&1 <<'PY'
import re, sys
def funcs(path):
    d, cur = {}, None
    for line in open(path):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1); d[cur] = []
        elif cur and line.strip():
            d[cur].append(line.split())
    return d
a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
same = [k for k in a if a[k] == b.get(k)]
print(f"{len(a)} base / {len(b)} new kernels, {len(same)} identical")
for k in sorted(set(a) | set(b)):
    if a.get(k) != b.get(k): print("differs:", k[:150], len(a.get(k, [])), len(b.get(k, [])))
PY

python3 "$root/tests/gpu/decode_ab_table.py" "$out/bench" > "$out/paged-ab.md"
cat "$out/paged-ab.md"
echo "fwd_kernel resources, base then new, where they differ:"
diff "$out/regs-base.txt" "$out/regs-new.txt" | cut -c1-170 | head -20
cat "$out/ldd-base.txt"
head -12 "$out/sass-diff.txt" 2>/dev/null
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
