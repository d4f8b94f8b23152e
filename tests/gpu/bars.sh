#!/usr/bin/env bash
# Every open issue's performance bar, measured on one build in one device call (stop 54, an H100,
# one bwd round: 76 s for build bwd fwd, 74 s for the rest; three rounds add ~65 s; pass stage
# names to split it over two calls on a warm machine, which keeps BUILD_DIR): the raw tables go to
# $OUT/bars.tgz, and bench/bars_table.py turns them into one verdict per bar (run here at the end,
# and again on this machine on the returned files).
#
#   bash tests/gpu/bars.sh                       # build bwd fwd fp8 decode variants
#   bash tests/gpu/bars.sh build bwd fwd         # then, while the machine is warm:
#   bash tests/gpu/bars.sh fp8 decode variants   # (finds BUILD_DIR and skips the build)
#   python3 bench/bars_table.py DIR/bars         # here: every call's bars.tgz unpacked into DIR
# (bars.sh carries no gates: run h200-check.sh or merged-check.sh for the tests and sanitizers.)
#
# Stages (the issue, the tool, what the bar reads; bf16, hidden 2048, 16k tokens unless said):
#   build     FA2 (sm_90) + FA3 (sm_90a), flashattn-bench, flashattn-fp8-accuracy,
#             flashattn-bench-variants; no tests (h200-check.sh / merged-check.sh are the gates).
#   bwd       15, 16: bench/backward_torch.py --gens fa2,fa3, d 64 / 128 / 256, seqlen 1k-16k,
#             causal and not, beside torch-flash and cuDNN, BWD_ROUNDS (3) rotated rounds (one
#             round took 32 s on an H100; stop 54's single reading put d 256 1k at 0.83 of
#             torch-flash where rotated A/B runs had 0.95-0.99) (bwd.md).
#   fwd       20: bench/ab_cudnn.py with A = B = this library (two readings per cell, the order of
#             cuDNN, A and B rotating per round), bf16 and fp16, d 64 / 128 / 256, seqlen 512-16k
#             (fwd.md).
#   fp8       17: flashattn-fp8-accuracy at seqlen 4096 (8 heads, d 128 and 256, seeds 17-20, in
#             parallel: the fp64 reference is single-threaded CPU work; fp8-acc-dD-sS.md), then
#             its --speed-grid 64,128,256 alone on the GPU (fp8-grid.md).
#   decode    18: compare_torch.py --gens fa2 --decode (auto's decode path on sm_90; 3 rounds
#             rotated; b 1 / 8 / 64 x 16k / 32k / 128k, 32 / 8 heads, d 128; decode.json / .md),
#             flashattn-bench --decode with pages of 0 and 16 in alternated rounds
#             (decode-pageP-R.json), tests/gpu/append-cost.sh at 32k (append-page0.md, -page16.md).
#   variants  19: flashattn-bench-variants 8192 at d 64 and 128 (fa2, fa3), the (192, 128) rows
#             against square 192 (fa3) and the merge of 8 partials at d 128 (variants-*.md).
# Each stage runs under its own timeout; a stage that fails leaves its log and the rest go on.
set -uo pipefail
out=${OUT:-/tmp/bars-out}
dir=$out/bars
mkdir -p "$dir"
b=${BUILD_DIR:-/tmp/fa-bars}
stages=${*:-build bwd fwd fp8 decode variants}
t0=$(date +%s)
note() { echo "== [$(( $(date +%s) - t0 ))s] $1" | tee -a "$dir/stages.txt"; }
lib=$b/src/libflashattn.so
export FLASHATTN_LIBRARY=$lib PYTHONUNBUFFERED=1

build() {
  if [ -f "$lib" ] && [ -x "$b/bench/flashattn-bench-variants" ]; then note "build: found $b"; return 0; fi
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_FA1_ARCHS= \
    -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real -DFLASHATTN_BENCH_CUDA_ARCHS=90-real \
    > "$dir/configure.log" 2>&1 &&
    cmake --build "$b" -j 16 --target flashattn flashattn-bench flashattn-fp8-accuracy flashattn-bench-variants \
      > "$dir/build.log" 2>&1
  note "build rc=$?"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader > "$dir/gpu.txt" 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' >> "$dir/gpu.txt" 2>&1
  git log -1 --format='commit %H %s' >> "$dir/gpu.txt" 2>/dev/null || true
  cat "$dir/gpu.txt"
}

bwd() {
  timeout "${BWD_LIMIT:-240}" python3 bench/backward_torch.py --gens fa2,fa3 --hdim 64,128,256 \
    --seqlen 1024,2048,4096,8192,16384 --causal both --rounds "${BWD_ROUNDS:-3}" --markdown "$dir/bwd.md" > "$dir/bwd.log" 2>&1
  note "bwd rc=$?"
}

fwd() {
  timeout "${FWD_LIMIT:-200}" python3 bench/ab_cudnn.py --a "$lib" --b "$lib" --gen fa3 --dtypes bf16,fp16 \
    --hdim 64,128,256 --seqlen 512,1024,2048,4096,8192,16384 --causal both --rounds 2 \
    --markdown "$dir/fwd.md" > "$dir/fwd.log" 2>&1
  note "fwd rc=$?"
}

fp8() {
  local acc=$b/bench/flashattn-fp8-accuracy pids=() d s
  for d in 128 256; do
    for s in 17 18 19 20; do
      timeout "${FP8_ACC_LIMIT:-150}" "$acc" --backend fa3 --fp8-backend fa3 --seqlen 4096 --heads 8 --dim $d \
        --seed $s > "$dir/fp8-acc-d$d-s$s.md" 2>&1 &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  note "fp8 accuracy done"
  timeout "${FP8_GRID_LIMIT:-90}" "$acc" --speed-grid 64,128,256 > "$dir/fp8-grid.md" 2> "$dir/fp8-grid.log"
  note "fp8 speed grid rc=$?"
}

decode() {
  timeout "${DECODE_LIMIT:-150}" python3 bench/compare_torch.py --gens fa2 --decode --decode-rounds 3 \
    --decode-batch 1,8,64 --decode-kv-heads 8 --decode-seqlen 16384,32768,131072 \
    --markdown "$dir/decode.md" --json "$dir/decode.json" > "$dir/decode.log" 2>&1
  note "decode (compare_torch) rc=$?"
  local r ps
  for r in 1 2; do
    for ps in 0 16; do
      timeout 60 "$b/bench/flashattn-bench" --backend fa2 --decode --no-standard --decode-batch 1,8,64 \
        --decode-kv-heads 8 --decode-seqlen 16384,32768,131072 --page-size $ps \
        --json "$dir/decode-page$ps-$r.json" > "$dir/decode-page$ps-$r.txt" 2>&1
    done
  done
  note "decode pages 0 / 16 done"
  for ps in 0 16; do
    APPEND_ROUNDS=3 APPEND_BATCHES=1,8 APPEND_SEQLENS=32768 timeout 120 bash tests/gpu/append-cost.sh "$b" $ps \
      > "$dir/append-page$ps.md" 2>&1
    note "append page $ps rc=$?"
  done
}

variants() {
  local v=$b/bench/flashattn-bench-variants run
  for run in "8192 128 fa2,fa3" "8192 64 fa2,fa3" "8192 192 fa3 128" "8192 128 merge"; do
    set -- $run
    timeout 120 env LD_LIBRARY_PATH="$b/src:${LD_LIBRARY_PATH:-}" "$v" "$@" > "$dir/variants-${2}-${3//,/-}${4:+-$4}.md" 2>&1
    note "variants $run rc=$?"
  done
}

for stage in $stages; do
  case $stage in
    build|bwd|fwd|fp8|decode|variants) "$stage" ;;
    *) note "unknown stage $stage" ;;
  esac
  [ "$stage" = build ] && [ ! -f "$lib" ] && { tail -30 "$dir/build.log"; break; }
  # One archive (the device tool brings back only a handful of files), renewed after every stage
  # so that a call cut off by its time limit still returns the stages it finished.
  (cd "$out" && tar czf bars.tgz.tmp bars && mv bars.tgz.tmp bars.tgz)
done
python3 bench/bars_table.py "$dir" > "$out/bars.md" 2>&1
cat "$dir/stages.txt"
cat "$out/bars.md"
(cd "$out" && tar czf bars.tgz bars && rm -rf bars)
