#!/usr/bin/env bash
# The GPU check, run on the H200 machine from the repository root (the device tool's working
# copy): build for sm_90 only, run the gpu-labelled tests, compute-sanitizer on a reduced grid,
# then the benchmarks. Stages are chosen by arguments: build tests sanitize bench torch python.
# Logs go to $OUT (or /tmp/h200-out) so they come back even when a stage fails; the bench and torch
# stages also write JSON there (bench.json, compare_torch.json) for bench/plot.py.
set -uo pipefail
out=${OUT:-/tmp/h200-out}
mkdir -p "$out"
stages=${*:-build tests sanitize bench}
build=${BUILD_DIR:-/tmp/fa-build}
summary=()
note() { summary+=("$1"); echo "== $1"; }

source "$(dirname "$0")/devdeps-env.sh" && use_devdeps "$PWD"  # cmocka from Debian, carried

for stage in $stages; do
  case $stage in
    build)
      t0=$(date +%s)
      cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DFLASHATTN_FA1_ARCHS="${FA1_ARCHS:-90-real}" -DFLASHATTN_FA2_ARCHS="${FA2_ARCHS:-90-real}" \
        -DFLASHATTN_FA3_ARCHS="${FA3_ARCHS:-90a-real}" -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 \
        && cmake --build "$build" -j 16 > "$out/build.log" 2>&1
      rc=$?; note "build rc=$rc in $(( $(date +%s) - t0 ))s"
      [ $rc = 0 ] || { tail -40 "$out/build.log"; break; }
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
      ;;
    tests)
      ctest --test-dir "$build" --output-on-failure -j 6 ${CTEST_ARGS:-} > "$out/ctest.log" 2>&1
      note "ctest rc=$? $(grep -E 'tests passed' "$out/ctest.log")"
      grep -E 'Failed|Skipped|Not Run|Passed' "$out/ctest.log" | grep -E '^ *[0-9]+/' | sed 's/^/   /'
      ;;
    sanitize)
      # SANITIZE_TESTS: the suites (test_<name>_<gen> binaries) to run: the forward numerics and the
      # backward by default (a generation without the suite's binary is passed over).
      for suite in ${SANITIZE_TESTS:-numerics backward}; do
      for gen in ${SANITIZE_GENS:-fa1 fa2 fa3}; do
        [ -x "$build/tests/test_${suite}_$gen" ] || continue
        for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
          # FA3 on 3 persistent CTAs: every CTA walks many tiles (ring phases across tiles).
          log="$out/sanitize-$suite-$gen-$tool.log"
          FLASHATTN_TEST_REDUCED=1 FLASHATTN_FA3_MAX_CTAS=3 compute-sanitizer --tool $tool --error-exitcode 99 \
            "$build/tests/test_${suite}_$gen" > "$log" 2>&1
          note "compute-sanitizer $tool $suite $gen rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
        done
      done
      done
      ;;
    bench)
      "$build/bench/flashattn-bench" --backend all-gpu ${BENCH_ARGS:-} --json "$out/bench.json" > "$out/bench.txt" 2>&1
      note "flashattn-bench rc=$?"
      ;;
    torch)
      FLASHATTN_LIBRARY=$(ls "$build"/src/libflashattn.so) python3 bench/compare_torch.py \
        --markdown "$out/compare_torch.md" --json "$out/compare_torch.json" ${TORCH_ARGS:-} > "$out/compare_torch.txt" 2>&1
      note "compare_torch rc=$?"
      ;;
    python)
      FLASHATTN_LIBRARY=$(ls "$build"/src/libflashattn.so) PYTHONPATH=bindings/python \
        python3 -m pytest -q bindings/python/tests > "$out/pytest.log" 2>&1
      note "pytest rc=$? $(tail -1 "$out/pytest.log")"
      ;;
  esac
done
echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
