#!/usr/bin/env bash
# libflashattn_cp over NCCL on a multi-GPU machine (nvidia-h200-x2/-x4/-x8), from the repository
# root: build (tests/gpu/h200-check.sh build, NCCL from /usr/local/cuda or torch's nvidia/nccl),
# the single-process gpu tests of the component, then one process per GPU (torchrun) for 2, 4 and
# 8 GPUs as far as the machine has them: tests/gpu/cp_multi.py's check (the ring vs one single-GPU
# call on the gathered inputs) and its benchmark (256k tokens, bf16, hdim 128, 32 heads, causal
# zigzag and non-causal; vs W x single-GPU FA3 and vs PyTorch's context_parallel).
# Env: BUILD_DIR (default /tmp/fa-cp), WORLDS (default "2 4 8"), STAGES (default "check bench"),
# TOTAL_TOKENS (default 262144). Logs and bench-W.json under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1  # torchrun workers' output reaches the log even when a timeout kills them
out=${OUT:-/tmp/cp-out}; mkdir -p "$out"
export BUILD_DIR=${BUILD_DIR:-/tmp/fa-cp}
export NCCL_NVLS_ENABLE=0  # required on these machines (device docs: NVLink multicast stays off)
if [ -z "${NCCL_ROOT:-}" ] && ! [ -f /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  export NCCL_ROOT
fi
echo "NCCL_ROOT=${NCCL_ROOT:-/usr/local/cuda}"
OUT=$out bash tests/gpu/h200-check.sh build > "$out/build-stage.txt" 2>&1; tail -3 "$out/build-stage.txt"
lib=$BUILD_DIR/cp/libflashattn_cp.so
[ -f "$lib" ] || { echo "no $lib (build failed or NCCL not found)"; exit 1; }
grep -q "NCCL transport ON" "$out/configure.log" || { echo "libflashattn_cp built without NCCL"; exit 1; }
ctest --test-dir "$BUILD_DIR" -V -R 'test_cp_' > "$out/ctest-cp.log" 2>&1
echo "ctest cp rc=$? $(grep -E 'tests passed' "$out/ctest-cp.log")"
export FLASHATTN_LIBRARY=$BUILD_DIR/src/libflashattn.so FLASHATTN_CP_LIBRARY=$lib PYTHONPATH=$PWD/bindings/python
gpus=$(nvidia-smi -L | wc -l)
rc=0
for w in ${WORLDS:-2 4 8}; do
  [ "$w" -le "$gpus" ] || { echo "W=$w: only $gpus GPU(s), not run"; continue; }
  timeout 900 torchrun --standalone --nproc-per-node="$w" tests/gpu/cp_multi.py ${STAGES:-check bench} \
    --total-tokens "${TOTAL_TOKENS:-262144}" --json "$out/bench-$w.json" > "$out/cp-multi-$w.log" 2>&1
  r=$?; [ $r = 0 ] || rc=$r
  echo "W=$w rc=$r"; grep -E '^check|^\||cp_multi:' "$out/cp-multi-$w.log"
done
exit $rc
