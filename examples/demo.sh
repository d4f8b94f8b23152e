#!/usr/bin/env bash
# Build the library and run flashattn-demo (random Q/K/V on the auto backend). Arguments are
# passed to the demo (--seqlen, --heads, --head-dim, --batch, --causal, --dtype).
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target flashattn-demo
build/examples/flashattn-demo "$@"
