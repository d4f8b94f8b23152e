#!/usr/bin/env bash
# FA2's split-KV decode with and without the decode tiles' own combine (FLASHATTN_FA2_FOLD=0 runs
# the combine kernel instead), in one device call from the repository root with .devdeps carried:
# an FA2-only sm_90 build, ab-common.sh's serving checks (test_serving_fa2, test_exec_contract,
# test_fa2_sass, the three sanitizers on test_serving_fa2's reduced grid), test_variants_fa2 (the
# public merge) with memcheck, then the decode step at b 1 / 8 with the fold on and off in
# alternated rounds and the append's cost (append-cost.sh). For a change to the fold or the
# combine (a patch applied first; stop 48 ran the b 1 fold this way). Logs go to $OUT.
#
#   OUT=$OUT ROUNDS=2 SEQLENS=16384,32768 bash tests/gpu/fold-ab.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/ab-common.sh"  # ab_setup, el, note, summary, devdeps, serving_checks
ab_setup fold-ab 0 0
( cmake -S "$root" -B $new_bld "${cfg[@]}" -DFLASHATTN_BUILD_DOCS=OFF \
    && cmake --build $new_bld --target flashattn flashattn-bench test_serving_fa2 test_exec_contract \
       test_variants_fa2 -j 16 ) > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
note "built"
serving_checks $new_bld 180 test_variants_fa2  # + the public merge under memcheck
grid=(--backend fa2 --decode --no-standard --decode-batch 1,8 --decode-kv-heads 8 --decode-seqlen "${SEQLENS:-16384,32768}")
for r in $(seq 1 "${ROUNDS:-2}"); do
  for fold in 0 1; do
    for ps in 0 16; do
      FLASHATTN_FA2_FOLD=$fold "$new_bld/bench/flashattn-bench" "${grid[@]}" --page-size $ps \
        --json "$out/bench/fold$fold-p$ps-r$r.json" > /dev/null 2>&1
    done
  done
done
note "decode rounds"
python3 - "$out/bench" <<'PY'
import json, sys, glob, statistics as st
folder = sys.argv[1]; us = {}
for f in glob.glob(folder + '/fold*.json'):
    fold, ps = f.rsplit('/fold', 1)[-1].split('-')[:2]
    d = json.load(open(f))
    for r in (d['records'] if isinstance(d, dict) else d):
        if r.get('kind') == 'decode' and r.get('status') == 'ok':
            us.setdefault((ps, r['batch'], r['seqlen_k']), {}).setdefault(fold, []).append(r['ms'] * 1e3)
print('| pages | batch | keys | FOLD=0 µs | fold µs | FOLD=0 / fold |')
print('|---|---|---|---|---|---|')
for k in sorted(us):
    m = {f: st.median(v) for f, v in us[k].items()}
    if len(m) == 2:
        print(f"| {k[0][1:]} | {k[1]} | {k[2]} | {m['0']:.1f} | {m['1']:.1f} | {m['0'] / m['1']:.3f} |")
PY
for ps in 0 16; do
  APPEND_ROUNDS="${ROUNDS:-2}" APPEND_BATCHES=1,8 APPEND_SEQLENS=32768 bash "$root/tests/gpu/append-cost.sh" \
    $new_bld $ps > "$out/append-p$ps.txt" 2>&1
  grep -E '^\| [0-9]' "$out/append-p$ps.txt"
done
printf '%s\n' "${summary[@]}"
