#!/usr/bin/env bash
# Checks the compiled FA1 and FA2 kernels in libflashattn without running them (no GPU needed):
# every forward and backward kernel (fa1::fa1_fwd_kernel, fa2::fwd_kernel, fa2::bwd_kernel; not
# FA1's bf16 stubs on sm_75) must use the tensor cores (HMMA in SASS: mma.sync, not FFMA), and in every fa1/fa2 kernel local-memory
# traffic (LDL/STL: register spills or arrays indexed at run time) must stay within the budget
# below, per kernel. The budgets are what the kernels have today, so any growth is seen; lower
# them when a kernel sheds its spills. Prints one line per kernel (arch, HMMA and LDL/STL counts).
# Usage: check_fa2_sass.sh CUOBJDUMP LIBRARY
set -euo pipefail
cuobjdump=$1
lib=$2
# Local-memory instructions allowed per kernel (SASS counts, any arch in the library):
#  - fa1, plain fa2 forward/backward and paged forward: 8 (7 at most today, on any arch; the one
#    looked at, the hdim-64 forward on sm_90, stores two registers before the key loop and reloads
#    them in the epilogue);
#  - variants forward (ALiBi, sink tokens, V of its own width; template flag kVariants): 80
#    (hdim 64 with its 128x128 tile: 71 today, docs/kernel-notes.md "Attention variants").
budget_plain=${FA2_LOCAL_BUDGET_PLAIN:-8}
budget_variants=${FA2_LOCAL_BUDGET_VARIANTS:-80}
# cuobjdump disassembles through nvdisasm, found on PATH: the one beside it (toolkit or wheel).
PATH=$(dirname "$cuobjdump"):$PATH
report=$("$cuobjdump" -sass "$lib" | awk '
  /arch = / { arch = $3 }
  /Function : / {
    # One entry per kernel and architecture (a multi-arch library holds each kernel once per arch).
    fn = $3; key = fn " arch=" arch
    if (fn ~ /9flashattn3fa[12]/) { kernels[key] = 1; hmma[key] = 0; local[key] = 0 } else key = ""
    next
  }
  key != "" {
    if ($0 ~ /HMMA/) hmma[key]++
    if ($0 ~ /[^A-Z](LDL|STL)[. ]/) local[key]++
  }
  END { for (k in kernels) printf "%s hmma=%d local=%d\n", k, hmma[k], local[k] }')
if ! grep -q "fa210fwd_kernel" <<<"$report"; then
  echo "no fa2 forward kernel found in $lib" >&2
  exit 1
fi
echo "$report"
# fwd_kernel<Traits, Elem, kPaged, kVariants>: the mangled name ends ...ELb<paged>ELb<variants>EEEv.
bad=$(awk -v plain="$budget_plain" -v variants="$budget_variants" '
  {
    split($4, l, "="); split($3, h, "=")
    is_variants = $1 ~ /ELb[01]ELb1EEEv/
    limit = is_variants ? variants : plain
    # sm_75 has no bf16 mma: FA1 compiles its bf16 kernels there as empty stubs the host never launches.
    needs_mma = $1 ~ /fa210fwd_kernel|fa210bwd_kernel|fa114fa1_fwd_kernel/ && !($2 == "arch=sm_75" && $1 ~ /4Bf16/)
    if (l[2] + 0 > limit || (needs_mma && h[2] + 0 == 0)) print
  }' <<<"$report")
if [ -n "$bad" ]; then
  echo "FA1/FA2 kernels failing the SASS check (forward/backward need HMMA; LDL/STL at most $budget_plain, variants $budget_variants):" >&2
  echo "$bad" >&2
  exit 1
fi
echo "all $(wc -l <<<"$report") fa1/fa2 kernels: forward and backward use HMMA, local memory within budget ($budget_plain; variants $budget_variants)"
