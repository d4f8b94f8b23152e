#!/usr/bin/env python3
"""Two backward passes of one libflashattn build at one shape (a warm-up, then the launch to
profile): the driver the device scripts hand to ncu (tests/gpu/bw2-check.sh, bwd128-profile.sh),
which then skips the first launch of the kernel it filters on.

  ncu --kernel-name regex:bwd_kernel --launch-skip 1 --launch-count 1 ... \\
      python3 bench/bwd_once.py LIB --gen fa3 --shape 8,2048,16,128

Inputs are bf16 [batch, seqlen, heads, head_dim], random, non-causal unless --causal; the default
mode unless --deterministic.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab_backward as ab  # noqa: E402
import backward_torch as bt  # noqa: E402
import compare_torch as ct  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib", help="path of libflashattn.so")
    ap.add_argument("--gen", default="fa3")
    ap.add_argument("--shape", default="8,2048,16,128", help="batch,seqlen,heads,head_dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="the deterministic mode's plan")
    args = ap.parse_args()
    import torch
    lib = ct.Lib(args.lib)
    bt.bind_backward(lib)

    class Timing:
        warmup, reps = 1, 1

    bench = ct.Bench(torch, Timing())
    b, s, h, d = (int(x) for x in args.shape.split(","))
    q, k, v, do = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    ms, _ = ab.lib_backward(bench, lib, args.gen, q, k, v, do, args.causal, "bf16", args.deterministic, "")
    mode = (" causal" if args.causal else "") + (" deterministic" if args.deterministic else "")
    print(f"{args.gen} backward {args.shape}{mode}: {ms} ms")
    return 0 if ms is not None else 1


if __name__ == "__main__":
    sys.exit(main())
