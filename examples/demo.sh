#!/usr/bin/env bash
# Build the library and run flashattn-demo (random Q/K/V on the auto backend). Arguments are
# passed to the demo (--seqlen, --heads, --head-dim, --batch, --causal, --dtype).
#   FLASHATTN_ENABLE_CUDA=OFF examples/demo.sh    CPU-only build: no CUDA kernels (seconds, not minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/install-deps.sh
cuda_flag=()
[ -z "${FLASHATTN_ENABLE_CUDA:-}" ] || cuda_flag=(-DFLASHATTN_ENABLE_CUDA="$FLASHATTN_ENABLE_CUDA")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}"
cmake --build build -j "$(nproc)" --target flashattn-demo
build/examples/flashattn-demo "$@"
