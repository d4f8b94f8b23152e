#!/usr/bin/env bash
# libflashattn_cp on one GPU (nvidia-h200), from the repository root: build for sm_90 with the NCCL
# transport (NCCL from /usr/local/cuda, else torch's nvidia/nccl wheel), the component's gpu tests
# (the GPU loopback ring vs one single-GPU call; a 1-rank NCCL communicator), compute-sanitizer
# memcheck, racecheck and synccheck of the GPU loopback test, and tests/gpu/cp_multi.py's check on a 1-process torchrun
# (the multi-GPU script's communicator set-up, gather and comparison, at W = 1). Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1  # torchrun workers' output reaches the log even when a timeout kills them
out=${OUT:-/tmp/cp-out}; mkdir -p "$out"
export BUILD_DIR=${BUILD_DIR:-/tmp/fa-cp} NCCL_NVLS_ENABLE=0
b=$BUILD_DIR
. "$(dirname "$0")/devdeps-env.sh"; use_torch_nccl
echo "nccl.h: $(ls /usr/local/cuda/include/nccl.h 2>/dev/null) NCCL_ROOT=${NCCL_ROOT:-}"
OUT=$out bash tests/gpu/h200-check.sh build > "$out/build-stage.txt" 2>&1; grep -E 'build rc' "$out/build-stage.txt"
grep -E 'flashattn_cp' "$out/configure.log"
[ -f "$b/cp/libflashattn_cp.so" ] || { tail -30 "$out/build.log"; exit 1; }
ctest --test-dir "$b" -V -R 'cp_ring|cp_nccl|abi_cp' > "$out/ctest-cp.log" 2>&1
echo "ctest cp rc=$?"; grep -E '^ *[0-9]+/[0-9]+ Test' "$out/ctest-cp.log"
grep -E 'ring-vs-single|transport:|public API|NCCL [0-9]' "$out/ctest-cp.log" | sed 's/^[0-9]*: //' > "$out/cp-cases.txt"
# Every tool over the GPU loopback test: the ring's element-wise gradient kernels (cp_grad.cu) and
# the core kernels under the ring's schedule (reduced grid, fewer random shapes).
for tool in ${CP_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  FLASHATTN_TEST_REDUCED=1 timeout ${MEMCHECK_S:-120} compute-sanitizer --tool $tool --error-exitcode 99 \
    "$b/cp/test_cp_ring_gpu" > "$out/$tool-cp-ring-gpu.log" 2>&1
  echo "$tool test_cp_ring_gpu rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool-cp-ring-gpu.log" | tail -1)"
done
FLASHATTN_LIBRARY=$b/src/libflashattn.so FLASHATTN_CP_LIBRARY=$b/cp/libflashattn_cp.so PYTHONPATH=$PWD/bindings/python \
  timeout ${MULTI_S:-240} torchrun --standalone --nproc-per-node=1 tests/gpu/cp_multi.py check > "$out/cp-multi-1.log" 2>&1
echo "cp_multi.py check W=1 rc=$?"; grep -E '^check|cp_multi:|Error|error' "$out/cp-multi-1.log" | head -30
