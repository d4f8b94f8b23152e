#!/usr/bin/env bash
# FA2's split-KV decode with and without the decode tiles' own combine (FLASHATTN_FA2_FOLD=0 runs
# the combine kernel instead), in one device call from the repository root with .devdeps carried:
# an FA2-only sm_90 build, the fa2 GPU tests (backward left out), compute-sanitizer on
# test_serving_fa2's reduced grid (and memcheck of the variants' merge and the execution contract),
# then the decode step at b 1 / 8 with the fold on and off in alternated rounds, and the append's
# cost (tests/gpu/append-cost.sh). For a change to the fold or the combine (e.g.
# tests/gpu/patches/fa2-b1-fold.patch, applied first). Logs go to $OUT.
#
#   OUT=$OUT ROUNDS=2 SEQLENS=16384,32768 bash tests/gpu/fold-ab.sh
set -uo pipefail
root=$PWD; out=${OUT:-/tmp/fold-ab}; mkdir -p "$out"; b=/tmp/fold-ab-build
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
source tests/gpu/devdeps-env.sh && use_devdeps "$root"
export LD_LIBRARY_PATH=$root/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF \
  -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS= \
  -DFLASHATTN_BENCH_CUDA_ARCHS=90-real -DFLASHATTN_BUILD_DOCS=OFF > "$out/configure.log" 2>&1 &&
  cmake --build $b -j 16 > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "[$(el)s] built"
(cd $b && timeout 200 ctest -L gpu -E "backward|grad|large" -j 10 --output-on-failure) > "$out/ctest.txt" 2>&1
echo "ctest rc=$?"; grep -E "tests passed|Failed|FAILED|Not Run|Timeout" "$out/ctest.txt" | tail -8
san() {  # tool test
  env FLASHATTN_TEST_REDUCED=1 timeout 180 compute-sanitizer --tool "$1" --error-exitcode 99 "$b/tests/$2" \
    > "$out/san-$1-$2.log" 2>&1
  echo "$1 $2 rc=$? $(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san-$1-$2.log" | tail -1)" > "$out/san-$1-$2.rc"
}
for tool in memcheck racecheck synccheck; do san $tool test_serving_fa2 & done
san memcheck test_variants_fa2 & san memcheck test_exec_contract &
wait; echo "[$(el)s] sanitizers"; cat "$out"/san-*.rc
grid=(--backend fa2 --decode --no-standard --decode-batch 1,8 --decode-kv-heads 8 --decode-seqlen "${SEQLENS:-16384,32768}")
for r in $(seq 1 "${ROUNDS:-2}"); do
  for fold in 0 1; do
    for ps in 0 16; do
      FLASHATTN_FA2_FOLD=$fold "$b/bench/flashattn-bench" "${grid[@]}" --page-size $ps \
        --json "$out/decode-fold$fold-p$ps-r$r.json" > /dev/null 2>&1
    done
  done
done
python3 - "$out" <<'PY'
import json, sys, glob, statistics as st
out = sys.argv[1]; us = {}
for f in glob.glob(out + '/decode-fold*.json'):
    fold, ps = f.split('/decode-fold')[-1].split('-')[:2]
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
  APPEND_ROUNDS="${ROUNDS:-2}" APPEND_BATCHES=1,8 APPEND_SEQLENS=32768 bash tests/gpu/append-cost.sh $b $ps \
    > "$out/append-p$ps.txt" 2>&1
  grep -E '^\| [0-9]' "$out/append-p$ps.txt"
done
echo "[$(el)s] done"
