#!/usr/bin/env python3
"""Device time of each kernel of the FA2 backward (preprocess, main kernel, dQ convert) for several
libflashattn builds in one process, from CUDA's activity trace (torch.profiler: no replay, the
clocks the benchmark sees), so a change to the small kernels can be told from one to the main
kernel. Stop 22 (issue 15) asked where the causal-2k cells lost time; run on the H200 by
tests/gpu/bw2-check.sh (KTIMES=1).

  python3 tests/gpu/bw-kernel-times.py --lib A=/tmp/a/src/libflashattn.so --lib B=build/src/libflashattn.so \
      --cells 128:1:2048,256:1:2048,128:0:8192 --markdown out.md

A cell is hdim:causal:seqlen on bench/ab_backward.py's grid (bf16, hidden 2048, 16k tokens). Per
cell and library: microseconds per backward call of each kernel (the mean over the warm-up and
timed calls of ab_backward.lib_backward), their sum, and the share of the two small kernels.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import ab_backward as ab  # noqa: E402
import backward_torch as bt  # noqa: E402
import compare_torch as ct  # noqa: E402

KINDS = (("prep", "bwd_preprocess"), ("main", "bwd_kernel"), ("convert", "bwd_convert_dq"))


def kind_of(name):
    for kind, key in KINDS:
        if key in name:
            return kind
    return None


def profile_once(torch, bench, lib, d, causal, s, args):
    from torch.profiler import ProfilerActivity, profile
    h, b = max(1, args.hidden // d), max(1, args.tokens // s)
    q, k, v, do = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ms, _ = ab.lib_backward(bench, lib, "fa2", q, k, v, do, causal, "bf16", False, "")
        torch.cuda.synchronize()
    if ms is None:
        return None
    total = {kind: 0.0 for kind, _ in KINDS}
    calls = 0
    for e in prof.key_averages():
        kind = kind_of(e.key)
        if kind is None:
            continue
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        total[kind] += t
        if kind == "main":
            calls += e.count
    return {kind: t / max(calls, 1) for kind, t in total.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH, in column order")
    ap.add_argument("--cells", default="128:1:2048,256:1:2048,128:0:8192")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    import torch

    class Timing:
        warmup, reps = 2, 5

    libs = {}
    for spec in args.lib:
        name, path = spec.split("=", 1)
        libs[name] = ct.Lib(path)
        bt.bind_backward(libs[name])
    bench = ct.Bench(torch, Timing())
    lines = ["| hdim | causal | seqlen | lib | prep us | main us | convert us | sum us | (prep+convert)/sum |",
             "|---|---|---|---|---|---|---|---|---|"]
    names = list(libs)
    for cell in args.cells.split(","):
        d, causal, s = (int(x) for x in cell.split(":"))
        got = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                t = profile_once(torch, bench, libs[n], d, bool(causal), s, args)
                if t is not None:
                    got[n].append(t)
        for n in names:
            if not got[n]:
                lines.append(f"| {d} | {'yes' if causal else 'no'} | {s} | {n} | - | - | - | - | - |")
                continue
            med = {kind: statistics.median(t[kind] for t in got[n]) for kind, _ in KINDS}
            tot = sum(med.values())
            lines.append(f"| {d} | {'yes' if causal else 'no'} | {s} | {n} | {med['prep']:.1f} | {med['main']:.1f} | "
                         f"{med['convert']:.1f} | {tot:.1f} | {(med['prep'] + med['convert']) / tot:.3f} |")
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
