#!/usr/bin/env python3
"""One shape, run for seconds: a libflashattn generation against PyTorch SDPA's FLASH_ATTENTION
backend, with the GPU's SM clock and power sampled while each runs.

    FLASHATTN_LIBRARY=build/src/libflashattn.so python3 bench/sustained_torch.py --gen fa2 --hdim 256 --seqlen 16384

compare_torch.py times 10-run bursts (tens of milliseconds per method). Where a kernel keeps the GPU
at its power limit, such a burst lands wherever the power controller has the clock at that moment,
and a ratio near 1.0 can swing a few percent either way between runs. This script runs each method
back to back for --runs launches, alternating the methods --rounds times, and prints the time per
launch next to the mean SM clock and board power (nvidia-smi, sampled every 0.1 s over the second
half of each block), so that two kernels can be compared at equal clocks.

Shape: the FlashAttention-3 paper's grid cell (bf16, hidden --hidden, heads = hidden/hdim, batch =
--tokens/seqlen, seqlen_q = seqlen_k), inputs [batch, seq, heads, dim] from torch.randn; the
library writes the LSE. The ctypes layer is compare_torch.py's.
"""

import argparse
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (the minimal ctypes view of the C ABI)


def sample_gpu(stop, samples, device):
    """Append (SM MHz, watts) every 0.1 s until stop is set."""
    cmd = ["nvidia-smi", "-i", str(device), "--query-gpu=clocks.sm,power.draw",
           "--format=csv,noheader,nounits"]
    while not stop.is_set():
        out = subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
        try:
            mhz, watts = (float(x) for x in out.split(","))
            samples.append((mhz, watts))
        except ValueError:
            pass  # nvidia-smi missing or an unparsable line: report without clocks
        time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so (default: $FLASHATTN_LIBRARY, then build*/src)")
    ap.add_argument("--gen", default="fa2", choices=sorted(ct.BACKEND))
    ap.add_argument("--hdim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", type=int, default=0, choices=[0, 1])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=300, help="launches per block (default 300)")
    ap.add_argument("--rounds", type=int, default=2, help="times each method runs a block (default 2)")
    args = ap.parse_args()
    if args.hidden % args.hdim or args.tokens % args.seqlen:
        ap.error("hidden must be a multiple of hdim and tokens a multiple of seqlen")

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if not torch.cuda.is_available():
        sys.exit("sustained_torch.py: torch sees no CUDA device")
    lib = ct.Lib(ct.find_library(args.lib))
    dev = torch.cuda.current_device()
    b, s, h, d = args.tokens // args.seqlen, args.seqlen, args.hidden // args.hdim, args.hdim
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    handle, ws_bytes = lib.plan(ct.BACKEND[args.gen], b, s, s, h, h, d, ct.DTYPE["bf16"], args.causal, dev)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    ws_ptr = ws.data_ptr() if ws_bytes > 0 else None

    def ours():
        lib.execute(handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                    ws_ptr, ws_bytes, torch.cuda.current_stream().cuda_stream)

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def theirs():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(args.causal))

    flops = 4 * b * h * s * s * d / (2 if args.causal else 1)
    print(f"{torch.cuda.get_device_name(dev)}; {args.gen} vs torch-flash; bf16 hdim {d}, seqlen {s}, "
          f"batch {b} x heads {h}, causal {args.causal}; {args.runs} launches per block")
    try:
        with torch.inference_mode():
            for _ in range(args.rounds):
                for name, fn in ((args.gen, ours), ("torch-flash", theirs)):
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    time.sleep(1.0)  # let the clock settle between blocks
                    stop, samples = threading.Event(), []
                    sampler = threading.Thread(target=sample_gpu, args=(stop, samples, dev))
                    sampler.start()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(args.runs):
                        fn()
                    end.record()
                    torch.cuda.synchronize()
                    stop.set()
                    sampler.join()
                    ms = start.elapsed_time(end) / args.runs
                    late = samples[len(samples) // 2:]
                    clocks = (f"SM {sum(x[0] for x in late) / len(late):.0f} MHz, "
                              f"{sum(x[1] for x in late) / len(late):.0f} W") if late else "no clock samples"
                    print(f"{name:12s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s  {clocks}")
    finally:
        lib.destroy(handle)


if __name__ == "__main__":
    main()
