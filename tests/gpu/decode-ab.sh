#!/usr/bin/env bash
# Issue 18's decode A/B in one device call, from the candidate tree's root: builds an older source
# tree (BASE, e.g. main's) and this one for FA2 on sm_90 only (FA1/FA3 left out: the decode bench
# runs --backend fa2), runs this tree's serving tests, test_exec_contract, test_fa2_sass and
# compute-sanitizer (memcheck, racecheck, synccheck) on test_serving_fa2's reduced grid, and times
# both libraries' decode steps (flashattn-bench --decode, b 1/8/64 x 16k/32k/128k keys, 32/8 heads,
# d 128, bf16), contiguous and pages of 16, with and without --append-rotary, the two libraries
# alternated per configuration and the order flipped per round. Bench round 1 runs before the tests
# (nothing else on the GPU), round 2 after them while time is left (AB_DEADLINE seconds from the
# start). Logs under $OUT; the summary (decode-ab.md: GB/s, µs, the append's cost) is printed last.
# AB_TEST_TIMEOUT (75): seconds for the tests and for each sanitizer run.
#
#   OUT=$OUT tests/gpu/decode-ab.sh /path/to/base/source
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
base_src=$1
source "$root/tests/gpu/ab-common.sh"  # ab_setup, el, note, summary, devdeps, serving_checks
ab_setup decode-ab 258 30
( cmake -S "$base_src" -B $base_bld "${cfg[@]}" -DBUILD_TESTING=OFF \
    && cmake --build $base_bld --target flashattn-bench -j 7 ) > "$out/build-base.log" 2>&1 & pb=$!
( cmake -S "$root" -B $new_bld "${cfg[@]}" \
    && cmake --build $new_bld --target flashattn flashattn-bench test_serving_fa2 test_exec_contract -j 9 ) \
  > "$out/build-new.log" 2>&1 & pn=$!
wait $pn; rn=$?
wait $pb; rb=$?
note "build new rc=$rn base rc=$rb"
[ $rn = 0 ] || tail -30 "$out/build-new.log"
[ $rb = 0 ] || tail -30 "$out/build-base.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
for tag in base new; do
  bld=$base_bld; [ $tag = new ] && bld=$new_bld
  lib=$(ls $bld/src/libflashattn.so 2>/dev/null) || continue
  cuobjdump --dump-resource-usage "$lib" 2>/dev/null | awk '/Function/ { fn = $2 } /REG:/ && fn ~ /fwd_kernel/ { print $1, $2, $4, fn }' \
    > "$out/regs-$tag.txt"
done

common=(--backend fa2 --decode --decode-kv-heads 8 --no-standard --decode-batch 1,8,64
        --decode-seqlen 16384,32768,131072 --warmup 5 --reps "$reps")
bench_round() {  # round, stop (seconds from the start): configurations by importance, libraries alternated
  local round=$1 stop=$2 order left
  order=(base new); [ $((round % 2)) = 0 ] && order=(new base)
  for conf in "0 append" "0 plain" "16 append" "16 plain"; do
    set -- $conf
    for tag in "${order[@]}"; do
      left=$(( stop - $(el) ))
      [ $left -ge 10 ] || { note "bench round $round stopped at ${stop}s"; return; }
      [ $left -le 40 ] || left=40
      bld=$base_bld; [ $tag = new ] && bld=$new_bld
      [ -x $bld/bench/flashattn-bench ] || continue
      extra=(); [ "$2" = append ] && extra=(--append-rotary)
      timeout $left $bld/bench/flashattn-bench "${common[@]}" --page-size "$1" "${extra[@]}" \
        > "$out/bench/r$round-$tag-p$1-$2.txt" 2>&1
    done
  done
  note "bench round $round done"
}
[ $rb = 0 ] && [ $rn = 0 ] && bench_round 1 "${AB_ROUND1_STOP:-150}"

[ $rn = 0 ] && serving_checks $new_bld ${AB_TEST_TIMEOUT:-75}
[ $rb = 0 ] && [ $rn = 0 ] && bench_round 2 "$deadline"

python3 - "$out/bench" > "$out/decode-ab.md" <<'PY'
import collections, glob, os, re, statistics, sys
cells = collections.defaultdict(list)  # (page, mode, tag, b, sk) -> [µs]
for f in glob.glob(os.path.join(sys.argv[1], "r*-*-p*-*.txt")):
    m = re.match(r"r(\d+)-(base|new)-p(\d+)-(append|plain)\.txt", os.path.basename(f))
    _, tag, page, mode = m.groups()
    for line in open(f):
        r = re.match(r"\|\s*(\d+)\s*\|\s*\d+ / \d+\s*\|\s*(\d+)\s*\|[^|]*\|[^|]*\|\s*([\d.]+)\s*\(([\d.]+)\)", line)
        if r:
            cells[(int(page), mode, tag, int(r.group(1)), int(r.group(2)))].append(float(r.group(4)))
med = {k: statistics.median(v) for k, v in cells.items()}
print("| page | batch | keys | base plain µs | new plain µs | base append µs | new append µs | append cost base | append cost new | new/base append |")
print("|---|---|---|---|---|---|---|---|---|---|")
for page in (0, 16):
    for b in (1, 8, 64):
        for sk in (16384, 32768, 131072):
            g = lambda mode, tag: med.get((page, mode, tag, b, sk))
            bp, np_, ba, na = g("plain", "base"), g("plain", "new"), g("append", "base"), g("append", "new")
            f = lambda x: "-" if x is None else f"{x:.1f}"
            cost = lambda a, p: "-" if a is None or p is None else f"{100 * (a / p - 1):+.1f} %"
            ratio = "-" if ba is None or na is None else f"{ba / na:.3f}x"
            n = len(cells.get((page, "append", "new", b, sk), []))
            print(f"| {page} | {b} | {sk} | {f(bp)} | {f(np_)} | {f(ba)} | {f(na)} | {cost(ba, bp)} | {cost(na, np_)} | {ratio} (n={n}) |")
PY
cat "$out/decode-ab.md"
echo "fwd_kernel resources, base then new, where they differ:"
diff "$out/regs-base.txt" "$out/regs-new.txt" | cut -c1-150 | head -30
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
