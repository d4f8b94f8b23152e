#!/usr/bin/env bash
# A merged tree's whole H200 check plus its A/B against an older tree, in one device call, for a
# session whose helpers could not run their own calls: builds this tree (h200-check.sh's build
# stage) and BASE_SRC's library beside it, times first while the GPU is quiet (decode contiguous /
# pages of 16, the FA2 and FA3 backward, the FP8 / bf16 FA3 forward grid; both libraries under this
# tree's benches, LD_LIBRARY_PATH picking the library, rounds alternated), then runs
# merged-check.sh (gpu tests, SASS tests, sanitizers) in the time left. Tables printed last.
#
#   OUT=$OUT BASE_SRC=../base DEADLINE=560 bash tests/gpu/merged-ab.sh
#
# Environment: MAB_PARTS (default "decode bwd fp8"; also "fwd": the FA3 forward against cuDNN,
# bench/ab_cudnn.py, "append": the append + rotary cost of each library, append-cost.sh, and
# "cudnn_decode": this tree's decode table against cuDNN, compare_torch.py, once per round, and
# "variants": flashattn-bench-variants' ratios, hdim 128 fa2/fa3, (192, 128) fa3 and hdim 96 fa2
# (ALiBi's ramp), per library; MAB_VARIANTS_RUNS="seqlen:hdim:backends[:dv] ..." replaces that
# list, e.g. "8192:128:fa2-bwd,fa3-bwd" for the backward variants),
# MAB_APPEND_TAGS ("base new"; "new:VAR=value" runs this tree under a knob), MAB_APPEND_PAGE (0),
# MAB_ROUNDS (2), MAB_BWD_HDIMS (64,128; MAB_BWD_HDIMS_FA2 / _FA3 per generation), MAB_BWD_SEQLENS
# (2048,8192), MAB_FWD_HDIMS (64,128), MAB_FWD_SEQLENS (512,1024,2048,8192), MAB_FWD_DTYPES (bf16),
# MAB_FWD_ROUNDS (MAB_ROUNDS), MAB_APPEND_SEQLENS
# (32768), MAB_CHECK (1: run merged-check.sh after the parts; 0: timing only), and merged-check.sh's
# own (T, TC, SAN_TESTS, SAN_MEMCHECK_ONLY); MAB_RESERVE (0): seconds of DEADLINE the parts leave to
# the gates; MAB_CHECK_MAX (200): the gates' longest time.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
final_out=${OUT:-/tmp/mab}; out=/tmp/mab-log; rm -rf $out; mkdir -p "$out/bench" "$final_out"
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
note() { echo "[$(el)s] $*" | tee -a "$out/notes.txt"; }
deadline=${DEADLINE:-560}; rounds=${MAB_ROUNDS:-2}
base_bld=/tmp/mab-base new_bld=/tmp/fa-final
export PYTHONUNBUFFERED=1
( nice cmake -S "${BASE_SRC:?}" -B $base_bld -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF -DFLASHATTN_BUILD_CP=OFF \
    -DFLASHATTN_FA1_ARCHS= -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS=90a-real \
  && nice cmake --build $base_bld --target flashattn -j 6 ) > "$out/build-base.log" 2>&1 & pb=$!
(cd "$root" && BUILD_DIR=$new_bld OUT=$out bash tests/gpu/h200-check.sh build) > "$out/build-new.log" 2>&1
wait $pb; note "builds done: base rc=$? new $(ls $new_bld/src/libflashattn.so 2>&1)"
[ -f $new_bld/src/libflashattn.so ] && [ -f $base_bld/src/libflashattn.so ] || {
  tail -30 "$out/build-new.log" "$out/build-base.log"; tar czf "$final_out/logs.tgz" -C $out .; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader > "$out/gpu.txt" 2>&1
on() { local lib=$1; shift; LD_LIBRARY_PATH=$lib/src${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
left() { echo $(( deadline - $(el) )); }
pleft() { echo $(( $(left) - ${MAB_RESERVE:-0} )); }  # the parts' time: MAB_RESERVE seconds stay for the gates
decode_part() {  # d 128 b 1/8/64 x 16k/32k/128k and d 64 b 1/8 x 32k; contiguous and pages of 16
  local r tag ps d cells bld
  for r in $(seq 1 $rounds); do
    for d in 128 64; do
      cells=(--decode-batch 1,8,64 --decode-seqlen 16384,32768,131072); [ $d = 64 ] && cells=(--decode-batch 1,8 --decode-seqlen 32768)
      for ps in 16 0; do
        for tag in $( [ $((r % 2)) = 1 ] && echo base new || echo new base ); do
          bld=$base_bld; [ $tag = new ] && bld=$new_bld
          on $bld timeout 40 $new_bld/bench/flashattn-bench --backend fa2 --decode --decode-kv-heads 8 --no-standard \
            "${cells[@]}" --decode-head-dim $d --page-size $ps --warmup 5 --reps 20 \
            > "$out/bench/r$r-$tag-d$d-p$ps.txt" 2>&1
        done
      done
    done
  done
  note "decode done"
}
bwd_hdims() {  # MAB_BWD_HDIMS_FA2 / _FA3, else MAB_BWD_HDIMS
  local v=MAB_BWD_HDIMS_${1^^}; echo "${!v:-${MAB_BWD_HDIMS:-64,128}}"
}
bwd_part() {
  local gen
  for gen in fa3 fa2; do
    [ $(pleft) -gt 60 ] || { note "bwd $gen skipped"; continue; }
    timeout $(( $(pleft) - 30 )) python3 "$root/bench/ab_backward.py" --a $base_bld/src/libflashattn.so \
      --b $new_bld/src/libflashattn.so --gen $gen --deterministic --hdim "$(bwd_hdims $gen)" \
      --seqlen "${MAB_BWD_SEQLENS:-2048,8192}" --rounds $rounds --markdown "$out/bwd-$gen.md" > "$out/bwd-$gen.txt" 2>&1
    note "bwd $gen rc=$?"
  done
}
fp8_part() {
  local r tag acc=$new_bld/bench/flashattn-fp8-accuracy
  for r in $(seq 1 $rounds); do
    for tag in $( [ $((r % 2)) = 1 ] && echo base new || echo new base ); do
      [ $(pleft) -gt 40 ] || { note "fp8 round $r skipped"; return; }
      local bld=$base_bld; [ $tag = new ] && bld=$new_bld
      nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50 > "$out/smi-$tag-$r.csv" 2>&1 & smi=$!
      on $bld timeout 60 $acc --speed-grid 64,128,256 > "$out/grid-$tag-$r.md" 2> "$out/cells-$tag-$r.txt"
      kill $smi 2>/dev/null; wait $smi 2>/dev/null
    done
  done
  note "fp8 done"
}
fwd_part() {  # FA3 forward, main and this tree against cuDNN in one process (issue 20's ratio)
  [ $(pleft) -gt 60 ] || { note "fwd skipped"; return; }
  timeout $(( $(pleft) - 30 )) python3 "$root/bench/ab_cudnn.py" --a $base_bld/src/libflashattn.so \
    --b $new_bld/src/libflashattn.so --gen fa3 --hdim "${MAB_FWD_HDIMS:-64,128}" \
    --seqlen "${MAB_FWD_SEQLENS:-512,1024,2048,8192}" --dtypes "${MAB_FWD_DTYPES:-bf16}" \
    --rounds "${MAB_FWD_ROUNDS:-$rounds}" --markdown "$out/fwd-fa3.md" \
    > "$out/fwd-fa3.txt" 2>&1
  note "fwd rc=$?"
}
cudnn_decode_part() {  # issue 18's contiguous bar: this tree's decode against cuDNN, two runs of three rotated rounds
  local r
  for r in $(seq 1 $rounds); do
    [ $(pleft) -gt 60 ] || { note "cudnn decode $r skipped"; return; }
    on $new_bld timeout 90 python3 -W ignore "$root/bench/compare_torch.py" --lib $new_bld/src/libflashattn.so \
      --gens fa2 --decode --decode-rounds 3 --decode-batch 1,8,64 --decode-kv-heads 8 --decode-seqlen 16384,32768,131072 \
      > "$out/cudnn-decode-$r.txt" 2>&1
    note "cudnn decode $r rc=$?"
  done
}
variants_part() {  # issue 19's ratios (each variant against its plain shape) for both libraries
  local tag bld run s d be dv n=0
  cmake --build $new_bld --target flashattn-bench-variants -j 16 > "$out/build-variants.log" 2>&1 ||
    { note "bench-variants build failed"; return; }
  for tag in base new; do
    bld=$base_bld; [ $tag = new ] && bld=$new_bld
    for run in ${MAB_VARIANTS_RUNS:-8192:128:fa2,fa3 8192:192:fa3:128 8192:96:fa2}; do
      [ $(pleft) -gt 40 ] || { note "variants $tag $run skipped"; continue; }
      IFS=: read -r s d be dv <<< "$run"; n=$((n + 1))
      on $bld timeout 60 $new_bld/bench/flashattn-bench-variants "$s" "$d" "$be" ${dv:-} > "$out/variants-$tag-$n.md" 2>&1
    done
  done
  note "variants done"
}
append_part() {  # issue 18's append bar: each library's plain / seqused_k / append step, d 128
  local tag bld env_
  for tag in ${MAB_APPEND_TAGS:-base new}; do  # "new:VAR=value": this tree under an environment knob
    [ $(pleft) -gt 50 ] || { note "append $tag skipped"; continue; }
    bld=$base_bld; [ $tag != base ] && bld=$new_bld
    env_=(); [ "${tag#new:}" != "$tag" ] && env_=("${tag#new:}")
    on $bld env "${env_[@]}" APPEND_ROUNDS=$rounds APPEND_BATCHES=1,8 APPEND_SEQLENS="${MAB_APPEND_SEQLENS:-32768}" \
      timeout 120 bash "$root/tests/gpu/append-cost.sh" $new_bld "${MAB_APPEND_PAGE:-0}" > "$out/append-${tag//[:=]/_}.md" 2>&1
    note "append $tag rc=$?"
  done
}
for part in ${MAB_PARTS:-decode bwd fp8}; do ${part}_part; done
# The gates in the time left (merged-check.sh's build stage finds the tree built).
if [ "${MAB_CHECK:-1}" = 1 ]; then
  mc_t=$(( $(left) - 40 )); [ $mc_t -gt ${MAB_CHECK_MAX:-200} ] && mc_t=${MAB_CHECK_MAX:-200}
  (cd "$root" && OUT=$out/mc T=$((mc_t - 20)) TC=$mc_t BENCH=0 DECODE_PAGES="" timeout $((mc_t + 30)) bash tests/gpu/merged-check.sh) > "$out/merged-check.txt" 2>&1
  note "merged-check rc=$?"
fi
python3 "$root/tests/gpu/decode_ab_table.py" "$out/bench" > "$out/decode.md"
tar czf "$final_out/logs.tgz" -C $out . 2>/dev/null
cp "$out"/bwd-*.md "$out"/fwd-*.md "$out"/variants-*.md "$out"/append-*.md "$out/decode.md" "$final_out/" 2>/dev/null
echo "==== notes"; cat "$out/notes.txt"; cat "$out/gpu.txt"
echo "==== merged check"; tail -45 "$out/merged-check.txt"
echo "==== fp8 grid"; python3 "$root/tests/gpu/fp8_grid_table.py" "$out" $rounds base new --bf16-ratios --means 2>&1 | tail -30
echo "==== decode (µs; ratios are speed ratios: >1 = faster)"; cat "$out/decode.md"
for gen in fa3 fa2; do echo "==== bwd $gen"; tail -22 "$out/bwd-$gen.md" 2>/dev/null || tail -5 "$out/bwd-$gen.txt"; done
[ -f "$out/fwd-fa3.txt" ] && { echo "==== fwd fa3 vs cuDNN"; tail -24 "$out/fwd-fa3.md" 2>/dev/null || tail -5 "$out/fwd-fa3.txt"; }
for r in $(seq 1 $rounds); do [ -f "$out/cudnn-decode-$r.txt" ] && { echo "==== decode vs cuDNN, run $r"; grep "^|" "$out/cudnn-decode-$r.txt" | tail -12; }; done
for f in "$out"/variants-*.md; do [ -f "$f" ] && { echo "==== $(basename "$f")"; grep "^|" "$f" | tail -12; }; done
for f in "$out"/append-*.md; do [ -f "$f" ] && { echo "==== $(basename "$f")"; tail -6 "$f"; }; done
