#!/usr/bin/env bash
# Stop 22 (helper bwd128, issue 16): profile of the FA3 backward's default-mode kernel at head dim
# 128, run from the repository root on the H200 machine. Builds this tree's library (FA2 + FA3,
# sm_90 / sm_90a, no FA1, no tests), then one ncu `--set full` launch of `bwd_kernel` (bf16, b 8,
# s 2048, 16 heads, d 128, non-causal; the second launch, after a warm-up) exported as SASS
# source counters and summarised by ncu-source-summary.py, then bench/backward_torch.py's
# baseline (fa2 and fa3 with cuDNN, d128) in the time left. Logs under $OUT, one logs.tgz.
# KERNEL_RE: the profiled kernel (since 8dcfa18 the default mode runs bwd_det_kernel at every
# length; FLASHATTN_FA3_BWD_WRITER=0 in the environment with KERNEL_RE='fa3.*bwd_kernel' profiles the
# older one); SHAPE: bwd_once.py's b,s,h,d (kernel-notes stop 43 asks for s 8192: 2,8192,16,128);
# ONCE_ARGS: more bwd_once.py flags (--causal, --deterministic; e.g. with
# KERNEL_RE='fa3.*bwd_wide_kernel' SHAPE=2,8192,8,256 the 80-key kernel's deterministic turns).
#   BUILD_DIR=/tmp/bwd128-new DEADLINE=140 bash tests/gpu/bwd128-profile.sh
set -uo pipefail
out=${OUT:-/tmp/bwd128-out}
mkdir -p "$out"
build=${BUILD_DIR:-/tmp/bwd128-new}
deadline=${DEADLINE:-145}
source "$(dirname "$0")/stages.sh"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF \
  -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real \
  -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real > "$out/configure.log" 2>&1 \
  && timeout 110 cmake --build "$build" --target flashattn -j 16 > "$out/build.log" 2>&1
note "build rc=$?"
lib=$(ls "$build"/src/libflashattn.so 2>/dev/null)
[ -n "$lib" ] || tail -30 "$out/build.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/gpu.txt" 2>&1
cuobjdump -res-usage "$lib" 2>/dev/null | grep -A1 -E 'bwd_(det_|wide_)?kernel' > "$out/res-usage.txt"
if [ -n "$lib" ] && [ "$(left)" -gt 25 ]; then
  timeout $(( $(left) - 22 > 25 ? $(left) - 22 : 25 )) ncu -f --clock-control none --kernel-name-base demangled \
    --kernel-name "regex:${KERNEL_RE:-fa3.*bwd_det_kernel}" --launch-skip 1 --launch-count 1 --set full --import-source yes \
    -o /tmp/bwd128-prof python3 bench/bwd_once.py "$lib" --gen fa3 --shape "${SHAPE:-8,2048,16,128}" ${ONCE_ARGS:-} > "$out/ncu.log" 2>&1
  note "ncu rc=$? $(tail -1 "$out/ncu.log" | cut -c1-100)"
  ncu -i /tmp/bwd128-prof.ncu-rep --page source --csv --print-source sass > /tmp/bwd128-source.csv 2>/dev/null \
    && python3 tests/gpu/ncu-source-summary.py /tmp/bwd128-source.csv --top 40 > "$out/ncu-summary.txt" 2>&1
  cp /tmp/bwd128-source.csv "$out/" 2>/dev/null
  ncu -i /tmp/bwd128-prof.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
  ncu -i /tmp/bwd128-prof.ncu-rep --page raw --csv > "$out/ncu-raw.csv" 2>&1
fi
if [ -n "$lib" ] && [ "$(left)" -gt 12 ]; then
  timeout $(( $(left) - 4 )) python3 bench/backward_torch.py --lib "$lib" --gens fa2,fa3 --hdim 128 \
    --seqlen ${SEQLENS:-2048} --markdown "$out/baseline.md" > "$out/baseline.txt" 2>&1
  note "backward_torch.py rc=$?"
fi
echo; grep -E '^\|' "$out/baseline.md" 2>/dev/null
echo; cat "$out/res-usage.txt"
echo; head -60 "$out/ncu-summary.txt" 2>/dev/null
echo "==== summary"; printf '%s\n' "${summary[@]}"
(cd "$out" && tar czf /tmp/bwd128-logs.tgz . && find . -type f ! -name ncu-summary.txt ! -name baseline.md ! -name ncu-details.txt -delete \
  && mv /tmp/bwd128-logs.tgz logs.tgz)
