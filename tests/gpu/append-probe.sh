#!/usr/bin/env bash
# Where issue 18's append cost goes (b 1, d 128, 32 / 8 heads): each kernel's own duration under
# ncu (serialized, so no PDL overlap) for a plain, a seqused_k and an append + rotary decode step at
# 16k / 32k / 128k keys, then the event-timed steps (append-cost.sh) at forced split counts. If
# the attention kernel alone is slower in the append step, the cost is inside it (per tile if it
# grows with the keys); if not, it is the chain (the pre-kernel, the wait, the launches).
#
#   OUT=$OUT bash tests/gpu/append-probe.sh        # FA2-only sm_90 build in /tmp/probe-bld
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); out=${OUT:-/tmp/probe}; mkdir -p "$out"; bld=/tmp/probe-bld
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
cmake -S "$root" -B $bld -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
  -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real \
  -DFLASHATTN_FA3_ARCHS= -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 &&
  cmake --build $bld --target flashattn flashattn-bench -j 16 > "$out/build.log" 2>&1 ||
  { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
echo "[$(el)s] built"; command -v nsys || echo "no nsys"
bench=$bld/bench/flashattn-bench
grid=(--backend fa2 --decode --no-standard --decode-batch 1 --decode-kv-heads 8 --decode-seqlen 16384,32768,131072)
for mode in plain seqused append; do
  flag=(); [ $mode = seqused ] && flag=(--seqused-k); [ $mode = append ] && flag=(--append-rotary)
  timeout 90 ncu --metrics gpu__time_duration.sum --csv --print-units base "$bench" "${grid[@]}" "${flag[@]}" \
    --warmup 1 --reps 3 > "$out/ncu-$mode.csv" 2> "$out/ncu-$mode.err"
  echo "[$(el)s] ncu $mode rc=$?"
done
python3 - "$out" <<'PY'
import csv, sys, os, collections, statistics
out = sys.argv[1]
for mode in ("plain", "seqused", "append"):
    path = os.path.join(out, f"ncu-{mode}.csv")
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    # launches in order: group consecutive launches per kernel name, keep durations in us
    seq = [(r["Kernel Name"].split("(")[0].split("<")[0][-40:], float(r["Metric Value"]) / 1e3) for r in rows
           if r.get("Metric Name") == "gpu__time_duration.sum"]
    print(f"== {mode}: {len(seq)} launches")
    agg = collections.OrderedDict()
    for name, us in seq:
        agg.setdefault(name, []).append(us)
    for name, v in agg.items():
        print(f"  {name:42s} n={len(v):3d} us: " + " ".join(f"{x:.1f}" for x in v[:24]))
PY
for s in 24 32 40; do
  for mode in seqused append; do
    flag=(--seqused-k); [ $mode = append ] && flag=(--append-rotary)
    "$bench" "${grid[@]}" "${flag[@]}" --num-splits $s --warmup 10 --reps 50 2>&1 | grep -E "^\| *1 " | sed "s/^/splits $s $mode /"
  done
done
echo "[$(el)s] done"
