#!/usr/bin/env bash
# Issue 18's decode measurements in one device call, after `h200-check.sh build` (same BUILD_DIR):
# the decode grid (batch 1, 8, 64; keys 4k-128k; 32 query / 8 KV heads, hdim 128, bf16) on
# contiguous caches and pages of 16 and 256, a sweep of FLASHATTN_I64_NUM_SPLITS at batch 1, the
# append + rotary step, bench/compare_torch.py (PyTorch flash and cuDNN) on the same grid, and
# per-kernel times from ncu at batch 1 / 32k keys. Logs and tables go to $OUT.
# Env: STAGES (default "grid splits append torch ncu"), SPLITS (the sweep's values, 0 = auto),
# SPLIT_BATCH and SPLIT_SEQLEN (its shapes).
set -uo pipefail
out=${OUT:-/tmp/decode-out}
build=${BUILD_DIR:-/tmp/fa-build}
mkdir -p "$out"
bench="$build/bench/flashattn-bench"
common=(--backend fa2 --decode --decode-kv-heads 8 --no-standard)
grid=(--decode-batch 1,8,64 --decode-seqlen 4096,16384,32768,131072)
for stage in ${STAGES:-grid splits append torch ncu}; do
  t0=$(date +%s)
  case $stage in
    grid)
      for ps in 0 16 256; do
        "$bench" "${common[@]}" "${grid[@]}" --page-size $ps --json "$out/grid-p$ps.json" > "$out/grid-p$ps.txt" 2>&1
        echo "== grid page $ps rc=$?"; grep -E '^\| [0-9]' "$out/grid-p$ps.txt"
      done ;;
    splits)
      for s in ${SPLITS:-16 33 48 66 99 128}; do
        "$bench" "${common[@]}" --decode-batch ${SPLIT_BATCH:-1} --decode-seqlen ${SPLIT_SEQLEN:-32768,131072} \
          --num-splits $s > "$out/splits-$s.txt" 2>&1
        echo "== splits $s rc=$?"; grep -E '^\| [0-9]' "$out/splits-$s.txt"
      done ;;
    append)
      for ps in 0 16; do
        "$bench" "${common[@]}" --decode-batch 1,8,64 --decode-seqlen 32768 --page-size $ps --append-rotary > "$out/append-p$ps.txt" 2>&1
        echo "== append+rotary page $ps rc=$?"; grep -E '^\| [0-9]' "$out/append-p$ps.txt"
      done ;;
    torch)
      FLASHATTN_LIBRARY=$(ls "$build"/src/libflashattn.so) python3 bench/compare_torch.py --gens fa2 --decode \
        --decode-kv-heads 8 --decode-batch 1,8,64 --decode-seqlen 4096,16384,32768,131072 \
        --markdown "$out/compare_torch.md" --json "$out/compare_torch.json" > "$out/compare_torch.txt" 2>&1
      echo "== compare_torch rc=$?"; grep -E '^\| [0-9]|Copy' "$out/compare_torch.txt" ;;
    ncu)
      ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
      for ps in 0 16; do
        "$ncu" --kernel-name regex:'fwd_kernel|merge_kernel' --launch-count 4 --section SpeedOfLight \
          --section Occupancy --section LaunchStats "$bench" "${common[@]}" --decode-batch 1 --decode-seqlen 32768 \
          --page-size $ps --warmup 1 --reps 1 > "$out/ncu-p$ps.txt" 2>&1
        echo "== ncu page $ps rc=$?"
        grep -E 'fwd_kernel|merge_kernel|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size' "$out/ncu-p$ps.txt" | head -40
      done ;;
  esac
  echo "== stage $stage took $(( $(date +%s) - t0 ))s"
done
