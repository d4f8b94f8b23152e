#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs missing build dependencies (Debian packages,
# PyPI test packages, and with nvcc the CUDA binary tools the SASS test needs), builds (Release, CUDA
# backends when nvcc is present, docs), runs every CTest test, then builds again with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer, runs the cpu-labelled tests there and a bounded
# libFuzzer campaign over the C API (FLASHATTN_FUZZ_SECONDS, default 180; 0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/install-deps.sh
# bench/plot.py's test (test_bench_plot; skipped without it) needs matplotlib: PyPI, as the Python
# test packages. Here rather than in install-deps.sh, which the demo shares.
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  python3 -m pip install -q -r bench/requirements.txt \
    || python3 -m pip install -q --break-system-packages -r bench/requirements.txt \
    || echo "tests/run.sh: matplotlib could not be installed; test_bench_plot reports skipped" >&2
fi

jobs=$(nproc)
# With CUDA, test_fa3_sass and test_fa2_sass must run: a missing cuobjdump fails it instead of skipping it.
sass_required=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then sass_required=ON; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_DOCS=ON \
      -DFLASHATTN_REQUIRE_SASS_CHECK=$sass_required
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# Sanitizers: host code only (CUDA off), cpu-labelled tests, clang (its shared sanitizer runtime:
# cmake/sanitizers.cmake), -O1 as ASan advises; the same build holds the fuzz target.
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
      -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DFLASHATTN_ENABLE_CUDA=OFF \
      -DFLASHATTN_SANITIZE=address,undefined -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_FUZZ=ON
cmake --build build-asan -j "$jobs"
# The random-mix tests draw 160 cases each here: at their Release counts they took ~49 of the 2-core
# CI machine's minutes under the sanitizers (test_random_mix 835 s, test_random_grad 636 s, each twice).
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 FLASHATTN_TEST_MIX_CASES=160 \
  ctest --test-dir build-asan -L cpu --output-on-failure -j "$jobs"
fuzz_seconds=${FLASHATTN_FUZZ_SECONDS:-180}
if [ "$fuzz_seconds" != 0 ]; then
  tests/fuzz/run-fuzz.sh build-asan/tests/fuzz/fuzz_capi "$fuzz_seconds" build-asan/fuzz-work
fi
# Debian packages: CPU-only build, lintian, dpkg -i, pkg-config and CMake consumers, purge.
tests/packaging/test-debs.sh

# --- Packaging for users (issue 22) -------------------------------------------------------------
# The library's size (file, CUDA fatbin, host code) and its 60 MB budget.
tests/packaging/library-size.sh build
# The Python wheel with the library inside: pip install in a fresh venv (CPU-only), example run
# with no environment variable set.
tests/packaging/test-wheel.sh
# --- end of packaging for users ------------------------------------------------------------------
echo "tests/run.sh: all tests passed"
