#!/usr/bin/env bash
# Stop 37 (issue 16): where the FA3 backward's head dim 256 (split layout) spends its steps. Run
# from the repository root on the device: builds the library (FA2 sm_90, FA3 sm_90a), one ncu
# `--set full` launch of bwd_kernel<256> (bf16, b 4, s 4096, 8 heads, non-causal unless
# CAUSAL=1) exported as SASS source counters and summarised by ncu-source-summary.py, then
# issue 16's table (backward_torch.py, fa3 + fa2 with the peers) at SEQLENS / HDIMS. One logs.tgz.
# KERNEL: ncu's kernel regex (default the split layout's bwd_kernel; 'fa3.*bwd_wide_kernel' for
# the 80-key layout, which runs d 256 by default since stop 39).
set -uo pipefail
out=${OUT:-/tmp/bwd256-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/bwd256}
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
  -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 \
  && timeout 200 cmake --build "$build" --target flashattn -j 16 > "$out/build.log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 ))s"
lib=$build/src/libflashattn.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
cuobjdump -res-usage "$lib" 2>/dev/null | grep -A1 -E 'bwd_(wide_)?kernel' > "$out/res-usage.txt"
causal=""; [ "${CAUSAL:-0}" = 1 ] && causal=--causal
timeout ${NCU_T:-150} ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:${KERNEL:-fa3.*bwd_kernel}" \
  --launch-skip 1 --launch-count 1 --set full --import-source yes -o /tmp/bwd256-prof \
  python3 bench/bwd_once.py "$lib" --gen fa3 --shape ${SHAPE:-4,4096,8,256} $causal > "$out/ncu.log" 2>&1
echo "ncu rc=$?"; tail -3 "$out/ncu.log"
ncu -i /tmp/bwd256-prof.ncu-rep --page source --csv --print-source sass > "$out/source.csv" 2>/dev/null \
  && python3 tests/gpu/ncu-source-summary.py "$out/source.csv" --top 40 > "$out/ncu-summary.txt" 2>&1
ncu -i /tmp/bwd256-prof.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
if [ -n "${SEQLENS:-}" ]; then
  timeout ${TABLE_T:-240} python3 bench/backward_torch.py --lib "$lib" --gens fa3,fa2 --hdim ${HDIMS:-128,256} \
    --seqlen $SEQLENS --markdown "$out/table.md" > "$out/table.txt" 2>&1
  echo "table rc=$?"
fi
grep -E '^\|' "$out/table.md" 2>/dev/null
cat "$out/res-usage.txt"
head -70 "$out/ncu-summary.txt"
(cd "$out" && tar czf /tmp/bwd256-logs.tgz . && rm -f source.csv && mv /tmp/bwd256-logs.tgz logs.tgz)
