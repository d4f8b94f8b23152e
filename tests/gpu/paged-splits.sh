#!/usr/bin/env bash
# The split count of FA2's paged decode (issue 18) in one device call, from the tree's root, for a
# change that touches only the host's choice of splits (fa2_backend.cpp, choose_splits): the
# kernels are the base's, so the base's plan is this library with FLASHATTN_I64_NUM_SPLITS forced
# to the base's choice (29 at b 1 on 132 SMs; b 8 and b 64 choose as before) and no second build
# is needed (BASE_SPLITS: the base's count at b 1 on the device, 29 on an H200). Builds this
# tree (FA2 on sm_90), runs test_serving_fa2 (and its gather run),
# test_exec_contract, test_fa2_sass and compute-sanitizer memcheck / racecheck / synccheck of
# test_serving_fa2's reduced grid while flashattn-bench builds, then times decode steps
# (flashattn-bench --decode, 32 / 8 heads, bf16, d 128): pages of 16 (shuffled) with the new
# choice against the forced base choice at b 1, contiguous, alternated per round with the order
# flipped, then a sweep of forced split counts at b 1 (pages of 16 and contiguous) while time is
# left (AB_DEADLINE seconds from the start). The summary (paged-splits.md) is printed last.
#
#   OUT=$OUT AB_DEADLINE=172 tests/gpu/paged-splits.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/ab-common.sh"  # ab_setup, el, note, summary, devdeps, serving_checks
ab_setup paged-splits 172 20
base_splits=${BASE_SPLITS:-29}
( cmake -S "$root" -B $new_bld "${cfg[@]}" \
    && cmake --build $new_bld --target flashattn test_serving_fa2 test_exec_contract -j 16 ) \
  > "$out/build-new.log" 2>&1
rn=$?
note "build lib+tests rc=$rn"
[ $rn = 0 ] || { tail -30 "$out/build-new.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
cmake --build $new_bld --target flashattn-bench -j 8 > "$out/build-bench.log" 2>&1 & pb=$!
serving_checks $new_bld ${AB_TEST_TIMEOUT:-70}
wait $pb; rb=$?
note "build bench rc=$rb"
[ $rb = 0 ] || { tail -30 "$out/build-bench.log"; exit 1; }
bench=$new_bld/bench/flashattn-bench

common=(--backend fa2 --decode --decode-kv-heads 8 --no-standard --decode-head-dim 128 --warmup 5 --reps "$reps")
run_one() {  # name page splits batches
  local name=$1 page=$2 splits=$3 batches=$4 left
  left=$(( deadline - $(el) ))
  [ $left -ge 8 ] || { note "bench stopped before $name"; return 1; }
  [ $left -le 40 ] || left=40
  timeout $left $bench "${common[@]}" --decode-batch "$batches" --decode-seqlen 16384,32768,131072 \
    --page-size "$page" --num-splits "$splits" > "$out/bench/$name.txt" 2>&1
}
bench_round() {  # round: new choice, base choice (b 1), contiguous; the order flipped per round
  local r=$1 conf confs=("new 16 0 1,8,64" "base 16 $base_splits 1" "contig 0 0 1,8,64")
  [ $((r % 2)) = 0 ] && confs=("contig 0 0 1,8,64" "base 16 $base_splits 1" "new 16 0 1,8,64")
  for conf in "${confs[@]}"; do
    set -- $conf
    run_one r$r-$1-p$2-s$3 $2 $3 $4 || return 1
  done
  note "bench round $r done"
}
bench_round 1 && bench_round 2
for conf in "16 33" "0 32" "16 24" "0 33" "16 40" "0 24" "16 48" "16 64"; do  # the sweep, b 1
  set -- $conf
  run_one sweep-p$1-s$2 $1 $2 1 || break
done

python3 - "$out/bench" "$base_splits" > "$out/paged-splits.md" <<'PY'
import collections, glob, os, re, statistics, sys
cells = collections.defaultdict(list)  # (name, b, sk) -> [µs]
for f in glob.glob(os.path.join(sys.argv[1], "*.txt")):
    name = re.sub(r"^r\d+-", "", os.path.basename(f)[:-4])
    for line in open(f):
        r = re.match(r"\|\s*(\d+)\s*\|\s*\d+ / \d+\s*\|\s*(\d+)\s*\|[^|]*\|[^|]*\|\s*([\d.]+)\s*\(([\d.]+)\)", line)
        if r:
            cells[(name, int(r.group(1)), int(r.group(2)))].append(float(r.group(4)))
med = {k: statistics.median(v) for k, v in cells.items()}
names = sorted({k[0] for k in cells})
f = lambda x: "-" if x is None else f"{x:.1f}"
print("| batch | keys | " + " | ".join(f"{n} µs (n)" for n in names) + " | new p16/contig | base p16/contig |")
print("|---|---|" + "---|" * len(names) + "---|---|")
for b in (1, 8, 64):
    for sk in (16384, 32768, 131072):
        row = [f"{f(med.get((n, b, sk)))} ({len(cells.get((n, b, sk), []))})" for n in names]
        c = med.get(("contig-p0-s0", b, sk))
        q = lambda n: "-" if c is None or med.get((n, b, sk)) is None else f"{c / med[(n, b, sk)]:.3f}"
        print(f"| {b} | {sk} | " + " | ".join(row) + f" | {q('new-p16-s0')} | {q('base-p16-s' + sys.argv[2])} |")
PY
cat "$out/paged-splits.md"
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
