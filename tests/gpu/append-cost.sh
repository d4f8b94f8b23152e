#!/usr/bin/env bash
# Issue 18's append bar, measured like for like on the GPU machine: one library's FA2 decode step
# (d 128, bf16, 32 / 8 heads) three ways, alternated per round: plain (no seqused_k), with
# seqused_k = seqlen_k (--seqused-k: what a serving step that tracks cache lengths passes), and
# with a one-row append + full-width rotary (--append-rotary, which must pass seqused_k). The
# append's cost is then given against both baselines (the bar: at most 5 % of a decode step).
#
#   APPEND_ROUNDS=3 APPEND_BATCHES=1,8 [APPEND_SEQLENS=32768] tests/gpu/append-cost.sh BUILD_DIR [PAGE_SIZE]
set -uo pipefail
b=$1; page=${2:-0}; rounds=${APPEND_ROUNDS:-3}
tmp=$(mktemp -d)
grid=(--backend fa2 --decode --no-standard --decode-batch "${APPEND_BATCHES:-1,8}" --decode-kv-heads 8
      --decode-seqlen "${APPEND_SEQLENS:-16384,32768,131072}" --page-size "$page" --reps 50 --warmup 10)
for r in $(seq 1 "$rounds"); do
  for mode in plain seqused append; do
    flag=(); [ $mode = seqused ] && flag=(--seqused-k); [ $mode = append ] && flag=(--append-rotary)
    "$b/bench/flashattn-bench" "${grid[@]}" "${flag[@]}" --json "$tmp/$mode-$r.json" > "$tmp/$mode-$r.txt" 2>&1 ||
      { echo "bench $mode round $r failed:"; tail -5 "$tmp/$mode-$r.txt"; }
  done
done
python3 - "$tmp" "$rounds" "$page" <<'PY'
import json, sys, statistics, glob, os
tmp, rounds, page = sys.argv[1], int(sys.argv[2]), sys.argv[3]
us = {}
for path in glob.glob(os.path.join(tmp, '*.json')):
    mode = os.path.basename(path).split('-')[0]
    data = json.load(open(path))
    recs = data['records'] if isinstance(data, dict) else data
    for r in recs:
        if r.get('kind') == 'decode' and r.get('backend') == 'fa2' and r.get('status') == 'ok':
            us.setdefault((r['batch'], r['seqlen_k']), {}).setdefault(mode, []).append(r['ms'] * 1e3)
print(f"| pages | batch | seqlen_k | plain µs | seqused_k µs | append µs | append vs plain | append vs seqused_k |")
print("|---|---|---|---|---|---|---|---|")
for (bt, sk) in sorted(us):
    m = {k: statistics.median(v) for k, v in us[(bt, sk)].items()}
    if len(m) < 3: print(f"| {page} | {bt} | {sk} | incomplete: {sorted(m)} |"); continue
    print(f"| {page} | {bt} | {sk} | {m['plain']:.1f} | {m['seqused']:.1f} | {m['append']:.1f} | "
          f"{100 * (m['append'] / m['plain'] - 1):+.1f} % | {100 * (m['append'] / m['seqused'] - 1):+.1f} % |")
print(f"(medians over {rounds} rounds, each a median of 50 executes; modes alternated per round)")
PY
