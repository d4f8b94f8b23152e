#!/usr/bin/env bash
# Issue 15 (stop 50): where FA2's backward at head dim 64 loses to FlashAttention-2's own (PyTorch's
# flash backend; 0.86-0.93x at every length in stop 49). One ncu `--set full` launch of each main
# backward kernel at the same shape (bf16, default mode, b,s,h,d = SHAPE, 8,2048,32,64 unless set;
# ONCE_ARGS=--causal for the mask), SASS source counters summarised by ncu-source-summary.py, and
# the headline metrics of both side by side (instructions, IPC, shared-memory wavefronts, L2 and
# DRAM bytes, stall reasons). Run from the repository root on the GPU machine; LIB names a built
# libflashattn.so with FA2 for sm_90, or, unset, the script builds one (FA2 only, ~1 min). Output
# under $OUT: ours-summary.txt, flash-summary.txt, side-by-side.txt (also printed), and the SASS
# source-counter exports src-ours.csv.gz, src-flash.csv.gz (8 files in all with the logs).
#   OUT=$OUT bash tests/gpu/fa2-bwd-vs-flash-profile.sh
set -uo pipefail
out=${OUT:-/tmp/fa2-bwd-prof}; mkdir -p "$out"
shape=${SHAPE:-8,2048,32,64}
if [ -z "${LIB:-}" ]; then
  cmake -S . -B /tmp/fa2prof -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DFLASHATTN_FA1_ARCHS= \
    -DFLASHATTN_FA2_ARCHS=90-real -DFLASHATTN_FA3_ARCHS= -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_BUILD_TOOLS=OFF \
    -DFLASHATTN_BUILD_BENCH=OFF -DFLASHATTN_BUILD_CP=OFF > "$out/build.log" 2>&1 \
    && timeout 300 cmake --build /tmp/fa2prof --target flashattn -j 16 >> "$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
  LIB=/tmp/fa2prof/src/libflashattn.so
fi
profile() {  # NAME KERNEL_REGEX COMMAND...: one launch (the second) of the kernel, exported
  local name=$1 re=$2; shift 2
  timeout 150 ncu -f --clock-control none --kernel-name-base demangled --kernel-name "regex:$re" \
    --launch-skip 1 --launch-count 1 --set full --import-source yes -o "/tmp/prof-$name" "$@" \
    > "$out/ncu-$name.log" 2>&1
  echo "ncu $name rc=$? $(grep -c '==PROF==' "$out/ncu-$name.log") profiler lines"
  ncu -i "/tmp/prof-$name.ncu-rep" --page source --csv --print-source sass > "/tmp/src-$name.csv" 2>/dev/null \
    && python3 tests/gpu/ncu-source-summary.py "/tmp/src-$name.csv" --top 30 > "$out/$name-summary.txt" 2>&1
  ncu -i "/tmp/prof-$name.ncu-rep" --page raw --csv > "/tmp/raw-$name.csv" 2>/dev/null
  # the per-instruction export itself (stop 51 needed a second call for it): with main's SASS
  # (nvcc + cuobjdump here) its row indices name each instruction
  [ -s "/tmp/src-$name.csv" ] && gzip -c "/tmp/src-$name.csv" > "$out/src-$name.csv.gz"
}
profile ours 'fa2::bwd_kernel' python3 bench/bwd_once.py "$LIB" --gen fa2 --shape "$shape" ${ONCE_ARGS:-}
causal=False; case " ${ONCE_ARGS:-} " in *" --causal "*) causal=True ;; esac
cat > /tmp/flash_once.py <<EOF
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
b, s, h, d = (int(x) for x in "$shape".split(","))
q, k, v, do = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
               for _ in range(4))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=$causal)
        torch.autograd.grad(o, (q, k, v), do.detach())
torch.cuda.synchronize()
print("flash backward twice at", "$shape")
EOF
profile flash 'flash_bwd_dq_dk_dv' python3 /tmp/flash_once.py
python3 - "$out" <<'EOF' > "$out/side-by-side.txt"
import csv, sys
def raw(name):  # one profiled launch: the header, a units row (where ncu writes one), the values
    try:
        rows = [r for r in csv.reader(open(f"/tmp/raw-{name}.csv")) if r]
    except OSError:
        return {}
    return dict(zip(rows[0], rows[-1])) if len(rows) > 1 else {}
a, b = raw("ours"), raw("flash")
keys = ["Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum", "launch__registers_per_thread",
        "smsp__inst_executed.sum", "smsp__inst_executed_pipe_tensor.sum",
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
        "lts__t_bytes.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "launch__shared_mem_per_block_dynamic", "launch__occupancy_limit_registers"]
keys += sorted(k for k in a if k.startswith("smsp__average_warps_issue_stalled_") and k.endswith("_per_issue_active.ratio"))
for k in keys:
    va, vb = a.get(k, "-"), b.get(k, "-")
    print(f"{k[:90]:90s} {va[:40]:>40s} {vb[:40]:>40s}")
EOF
cat "$out/side-by-side.txt"
