#!/usr/bin/env bash
# Issue 19's check on the H200, in one device call: build (tests/gpu/h200-check.sh build, plus the
# opt-in flashattn-bench-variants), the variants tests on cpu/fa2/fa3 and test_fa3_sass, the
# forward numerics on the reduced grid, compute-sanitizer (memcheck, racecheck, synccheck) on
# test_variants_<gen> for each generation in SANITIZE_GENS (reduced grid, FA3 on 3 CTAs, each tool
# bounded by SANITIZE_LIMIT seconds), then the variants bench (BENCH_RUNS: "seqlen:d:backends[:dv]"
# items, against AB_CONFIGS library builds). Logs under $OUT; a short summary last.
#
#   BUILD_DIR=/tmp/fa-var OUT=$OUT bash tests/gpu/variants-check.sh
set -uo pipefail
out=${OUT:-/tmp/variants-out}
build=${BUILD_DIR:-/tmp/fa-variants}
mkdir -p "$out"
summary=()
note() { summary+=("$1"); echo "== $1"; }

OUT=$out BUILD_DIR=$build bash tests/gpu/h200-check.sh build > "$out/h200-build.txt" 2>&1
note "$(grep -E '^== build' "$out/h200-build.txt")"
cmake --build "$build" --target flashattn-bench-variants -j 16 > "$out/build-bench.log" 2>&1
note "bench-variants build rc=$?"
if [ -d .devdeps/root ]; then  # cmocka, unpacked by h200-check.sh
  export CMAKE_PREFIX_PATH=$PWD/.devdeps/root/usr
  export LD_LIBRARY_PATH=$PWD/.devdeps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
# "ref" in AB_CONFIGS: the library of the tree at REF_DIR (FA2 and FA3 only, same archs), built in
# the background while the tests and sanitizers run.
ref_pid=
if [[ " ${AB_CONFIGS:-mine} " == *" ref "* ]]; then
  ( t0=$(date +%s)
    cmake -S "${REF_DIR:?REF_DIR}" -B "$build-ref" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_FA1_ARCHS= \
      -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real \
      -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF \
      > "$out/configure-ref.log" 2>&1 && nice cmake --build "$build-ref" --target flashattn -j 12 > "$out/build-ref.log" 2>&1
    echo "ref build rc=$? in $(( $(date +%s) - t0 ))s" > "$out/ref-build.txt" ) &
  ref_pid=$!
fi

ctest --test-dir "$build" --output-on-failure -j 4 -R "${CTEST_RE:-^test_variants_(cpu|fa2|fa3)$|^test_fa3_sass$}" \
  > "$out/ctest.log" 2>&1
note "ctest rc=$? $(grep -E 'tests passed' "$out/ctest.log")"
for gen in ${NUMERICS_GENS:-fa3}; do
  FLASHATTN_TEST_REDUCED=1 "$build/tests/test_numerics_$gen" > "$out/numerics-$gen.log" 2>&1
  note "test_numerics_$gen reduced rc=$? $(tail -1 "$out/numerics-$gen.log")"
done

pids=()
for gen in ${SANITIZE_GENS:-fa3}; do
  for tool in memcheck racecheck synccheck; do
    ( FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 timeout "${SANITIZE_LIMIT:-120}" compute-sanitizer \
        --tool $tool --error-exitcode 99 "$build/tests/test_variants_$gen" > "$out/sanitize-$gen-$tool.log" 2>&1
      echo "rc=$?" >> "$out/sanitize-$gen-$tool.log" ) &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
for gen in ${SANITIZE_GENS:-fa3}; do
  for tool in memcheck racecheck synccheck; do
    log="$out/sanitize-$gen-$tool.log"
    note "compute-sanitizer $tool variants $gen $(tail -1 "$log") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
  done
done

# The bench: BENCH_RUNS items ("seqlen:d:backends[:dv]") for each library configuration of
# AB_CONFIGS, alternated over AB_ROUNDS rounds: "mine" (this tree), "mine:VAR=value" (this tree with
# an environment knob), "ref" (the REF_DIR library above). Tables: $OUT/bench-<config>-<round>-<item>.md.
[ -n "$ref_pid" ] && { wait "$ref_pid"; note "$(cat "$out/ref-build.txt")"; }
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for cfg in ${AB_CONFIGS:-mine}; do
    lib=$build/src
    envs=()
    case $cfg in
      ref) lib=$build-ref/src ;;
      mine:*) envs=("${cfg#mine:}") ;;
    esac
    n=0
    for run in ${BENCH_RUNS:-8192:128:fa2,fa3 8192:192:fa3:128}; do
      IFS=: read -r s d be dv <<< "$run"
      n=$((n + 1))
      env "${envs[@]}" LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-} "$build/bench/flashattn-bench-variants" "$s" "$d" "$be" ${dv:-} \
        > "$out/bench-${cfg//[:=]/_}-$round-$n.md" 2>&1
      [ $? = 0 ] || note "bench $cfg $run rc!=0"
    done
  done
done
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
# The ratio column of every bench table, one column per configuration and round.
python3 - "$out" <<'PY'
import glob, os, re, sys
rows, cols = {}, []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.md"))):
    col = os.path.basename(f)[6:-3]
    cols.append(col)
    for line in open(f):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) == 7 and c[0] in ("fa2", "fa3") and c[3] not in ("refused",):
            d = re.search(r"head dim (\d+)", open(f).read()).group(1)
            rows.setdefault((c[0], d, c[1]), {})[col] = "%s %s" % (c[3], c[6])
print("| backend | d | variant | " + " | ".join(cols) + " |")
for k, v in rows.items():
    print("| %s | %s | %s | " % k + " | ".join(v.get(c, "") for c in cols) + " |")
PY
