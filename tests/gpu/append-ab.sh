#!/usr/bin/env bash
# The append pre-kernel's A/B in one call (issue 18): FA2-only sm_90 builds of this tree (library,
# bench, test_serving) and of BASE_SRC (library), test_serving_fa2 (TMA and gather runs), then each
# library's plain / seqused_k / append decode steps (append-cost.sh, libraries alternated per
# round through LD_LIBRARY_PATH) and the append kernel's own duration under ncu.
#
#   OUT=$OUT BASE_SRC=.xfer/base bash tests/gpu/append-ab.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); out=${OUT:-/tmp/aab}; mkdir -p "$out"
new=/tmp/aab-new base=/tmp/aab-base; start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
source "$root/tests/gpu/devdeps-env.sh" && use_devdeps "$root"
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF
       -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=
       -DFLASHATTN_BENCH_CUDA_ARCHS=90-real -DFLASHATTN_BUILD_DOCS=OFF)
( cmake -S "${BASE_SRC:?}" -B $base "${flags[@]}" -DBUILD_TESTING=OFF && cmake --build $base --target flashattn -j 6 ) \
  > "$out/build-base.log" 2>&1 & pb=$!
( cmake -S "$root" -B $new "${flags[@]}" && cmake --build $new --target flashattn flashattn-bench test_serving_fa2 -j 10 ) \
  > "$out/build-new.log" 2>&1 || { echo "new build failed"; tail -30 "$out/build-new.log"; exit 1; }
wait $pb || { echo "base build failed"; tail -30 "$out/build-base.log"; exit 1; }
echo "[$(el)s] built"
(cd $new && timeout 120 ctest -R "test_serving_fa2" --output-on-failure) > "$out/ctest.txt" 2>&1; echo "ctest rc=$?"
grep -E "tests passed|Passed|Failed|FAILED" "$out/ctest.txt" | tail -5
echo "[$(el)s] tests done"
for r in 1 2 3; do
  for tag in $( [ $((r % 2)) = 1 ] && echo base new || echo new base ); do
    lib=$base; [ $tag = new ] && lib=$new
    LD_LIBRARY_PATH=$lib/src APPEND_ROUNDS=1 APPEND_BATCHES=1,8 APPEND_SEQLENS=16384,32768 \
      bash "$root/tests/gpu/append-cost.sh" $new > "$out/append-$tag-$r.md" 2>&1
  done
done
for tag in base new; do echo "== $tag"; cat "$out"/append-$tag-*.md | grep "^| 0"; done
for tag in base new; do
  lib=$base; [ $tag = new ] && lib=$new
  LD_LIBRARY_PATH=$lib/src timeout 60 ncu --metrics gpu__time_duration.sum --csv -k regex:append_kernel \
    $new/bench/flashattn-bench --backend fa2 --decode --no-standard --decode-batch 1 --decode-kv-heads 8 \
    --decode-seqlen 32768 --append-rotary --warmup 1 --reps 5 2>/dev/null | grep append_kernel | \
    awk -F'","' '{gsub(/[",]/,"",$NF); printf "%s ", $NF} END {print ""}' | sed "s/^/ncu append_kernel ns $tag: /"
done
echo "[$(el)s] done"
