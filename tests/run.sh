#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs missing Debian build dependencies, builds
# (Release, CUDA backends when nvcc is present, docs), runs every CTest test, then runs the
# cpu-labelled tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/install-deps.sh

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_DOCS=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# Sanitizers: host code only (CUDA off), cpu-labelled tests.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLASHATTN_ENABLE_CUDA=OFF \
      -DFLASHATTN_SANITIZE=address,undefined -DFLASHATTN_BUILD_BENCH=OFF
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L cpu --output-on-failure -j "$jobs"
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
