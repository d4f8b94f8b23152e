#!/usr/bin/env bash
# Checks the compiled FA3 kernels in libflashattn without running them (no GPU needed): every
# fa3::fwd_kernel, fa3::bwd_kernel and fa3::bwd_det_kernel (the backward and its deterministic
# kernel, issue 16; head dims 64, 128 and 256, each present), fa3::bwd_wide_kernel (the 80-key
# layout at head dim 256) instantiation must be sm_90a code
# whose SASS uses HGMMA (wgmma: the tensor-core path of Hopper, not HMMA/FFMA), every
# fa3::fp8_fwd_kernel (the FP8 forward, issue 17) QGMMA with E4M3 operands (FP8 wgmma's SASS
# name: QGMMA.64xNx32.F32.E4M3.E4M3), and none may have local-memory traffic (LDL/STL: register
# spills or arrays indexed at run time). Usage: check_fa3_sass.sh CUOBJDUMP LIBRARY
set -euo pipefail
cuobjdump=$1
lib=$2
# cuobjdump disassembles through nvdisasm, found on PATH: the one beside it (toolkit or wheel).
PATH=$(dirname "$cuobjdump"):$PATH
sass=$("$cuobjdump" -sass "$lib")
report=$(awk '
  /arch = / { arch = $3 }
  /Function : / {
    fn = $3
    if (fn ~ /fa310(fwd|bwd)_kernel|fa314(fp8_fwd|bwd_det)_kernel|fa315bwd_wide_kernel/) { kernels[fn] = arch; hgmma[fn] = 0; local[fn] = 0 }
    next
  }
  fn != "" && (fn in kernels) {
    if (fn ~ /fp8_fwd/ ? $0 ~ /QGMMA\.[0-9x]+\.F32\.E4M3\.E4M3/ : $0 ~ /HGMMA/) hgmma[fn]++
    if ($0 ~ /[^A-Z](LDL|STL)[. ]/) local[fn]++
  }
  END {
    for (k in kernels) printf "%s arch=%s hgmma=%d local=%d\n", k, kernels[k], hgmma[k], local[k]
  }' <<<"$sass")
for role in 10fwd 10bwd 14fp8_fwd 14bwd_det 15bwd_wide; do
  if ! grep -q "fa3${role}_kernel" <<<"$report"; then
    echo "no fa3 ${role} kernel found in $lib" >&2
    exit 1
  fi
done
# expect N WHAT PATTERN: exactly N kernels of the report match PATTERN (extended regex).
expect() {
  local n
  n=$(grep -cE "$3" <<<"$report" || true)
  if [ "$n" != "$1" ]; then
    echo "expected $1 fa3 $2, found $n" >&2
    exit 1
  fi
}
# The forward kernels with V of its own width (P(D, DV) rows of the head-dim table, the optional
# third argument, FA3_HEAD_DIMS_H): both element types of each must be there (and pass the checks below).
if [ -n "${3:-}" ]; then
  for pair in $(grep -oE 'P\([0-9]+, *[0-9]+\)' "$3" | tr -d 'P() ' ); do
    d=${pair%,*} dv=${pair#*,}
    expect 2 "forward kernels of head dim $d with V $dv wide" "fa310fwd_kernelINS0_6TraitsILi${d}ELi[0-9]+ELi${dv}EEE"
  done
fi
# The FP8 forward's compiled head dims (fp8_compiled_head_dim, fa3_fp8_params.h): O in bf16 and
# fp16 for each, so that a head dim that falls back to a wider kernel is noticed.
for d in 64 128 256; do
  expect 2 "FP8 forward kernels of head dim $d" "fa314fp8_fwd_kernelINS0_9Fp8TraitsILi${d}E"
done
# The backward's compiled head dims (bwd_compiled, fa3_bwd_params.h): 64 and 128 with bwd_kernel
# (default mode) and bwd_det_kernel, 256 (the split layout) with bwd_kernel for both modes; two
# element types each.
for d in 64 128 256; do
  expect 4 "backward kernels of head dim $d" "fa3(10bwd|14bwd_det)_kernelINS0_9BwdTraitsILi${d}EEE"
done
# The 80-key layout (fa3_bwd_wide.cuh): head dim 256, both modes and element types.
expect 4 "80-key backward kernels of head dim 256" "fa315bwd_wide_kernelINS0_13BwdWideTraitsILi256EEE"
echo "$report"
bad=$(awk '$2 != "arch=sm_90a" || $3 == "hgmma=0" || $4 != "local=0"' <<<"$report")
if [ -n "$bad" ]; then
  echo "FA3 kernels failing the SASS check (need arch sm_90a, HGMMA (FP8: QGMMA E4M3) > 0, no LDL/STL):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "all $(wc -l <<<"$report") fa3 kernels: sm_90a, HGMMA (FP8: QGMMA E4M3), no local memory"
