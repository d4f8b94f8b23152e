#!/usr/bin/env python3
"""A/B of two libflashattn builds against cuDNN, all three in one process, cell by cell: for each
cell of the FlashAttention-3 paper's grid (heads = hidden/hdim, batch = tokens/seqlen) cuDNN
(torch's CUDNN_ATTENTION), library A and library B are timed on the same inputs, the order of the
three rotating from round to round so that clock drift at the power limit falls on all alike.
For a kernel change whose bar is a ratio to cuDNN (issue 20): it prints A/cuDNN and B/cuDNN side
by side, so the old and the new kernel are read against the same cuDNN figures.

  python3 bench/ab_cudnn.py --a /tmp/base/src/libflashattn.so --b build/src/libflashattn.so \
      --gen fa3 --hdim 64 --dtype both --rounds 4 --markdown out.md

Each TFLOP/s is the median over the rounds of each round's median of --reps event-timed runs.
"max diff" is max |O_B - O_cuDNN| on the same inputs (a sanity check, not the tests' reference).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (the ctypes layer, the event timer, torch's runners)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="library A (the reference, e.g. main's build)")
    ap.add_argument("--b", required=True, help="library B (the candidate)")
    ap.add_argument("--gen", default="fa3")
    ct.add_grid_args(ap, hdim="64", seqlen="512,1024,2048,4096,8192,16384", warmup=3, reps=15, rounds=4)
    ap.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    args.no_lse = False
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]

    import torch
    from torch.nn.attention import SDPBackend
    if not torch.cuda.is_available():
        sys.exit("ab_cudnn.py: torch sees no CUDA device")
    libs = {"A": ct.Lib(args.a), "B": ct.Lib(args.b)}
    bench = ct.Bench(torch, args)
    lines = []
    ct.emit(lines, f"# {args.gen} A/B against cuDNN ({bench.props.name}; torch {torch.__version__}, "
                   f"cuDNN {torch.backends.cudnn.version()})")
    ct.emit(lines, f"A = {args.a}; B = {args.b}. Median TFLOP/s over {args.rounds} rounds of {args.reps} runs, "
                   "the order of cuDNN, A and B rotating per round.")
    ct.emit(lines, "")
    ct.emit(lines, "| dtype | hdim | causal | seqlen | cuDNN | A | B | A/cuDNN | B/cuDNN | B/A | max diff B |")
    ct.emit(lines, "|---|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    with torch.inference_mode():
        for dtype_name in [d for d in args.dtypes.split(",") if d]:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
            for d in args.hdim:
                for causal in causals:
                    for s in args.seqlen:
                        h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                        q, k, v = (torch.randn(b, s, h, d, dtype=dt, device="cuda") for _ in range(3))
                        tf = {"cuDNN": [], "A": [], "B": []}
                        outs, note = {}, ""
                        names = ["cuDNN", "A", "B"]
                        for r in range(args.rounds):
                            for name in names[r % 3:] + names[:r % 3]:
                                if name == "cuDNN":
                                    ms, _, out, why = ct.run_torch(bench, SDPBackend.CUDNN_ATTENTION, [q], [k], [v],
                                                                   bool(causal), False)
                                else:
                                    ms, _, out, why = ct.run_lib(bench, libs[name], args.gen, [q], [k], [v],
                                                                 bool(causal), dtype_name)
                                if ms is None:
                                    note = f"{name}: {why}"
                                    continue
                                tf[name].append(flops / (ms * 1e-3) / 1e12)
                                outs[name] = out
                        med = {n: statistics.median(x) if x else None for n, x in tf.items()}
                        if any(m is None for m in med.values()):
                            failed = True
                            ct.emit(lines, f"| {dtype_name} | {d} | {causal} | {s} | ERR {note} |")
                            continue
                        diff = (outs["B"].float() - outs["cuDNN"].float()).abs().max().item()
                        ct.emit(lines, f"| {dtype_name} | {d} | {causal} | {s} | {med['cuDNN']:.1f} | {med['A']:.1f} | "
                                       f"{med['B']:.1f} | {med['A'] / med['cuDNN']:.3f} | {med['B'] / med['cuDNN']:.3f} | "
                                       f"{med['B'] / med['A']:.3f} | {diff:.2e} |")
                        del q, k, v, outs
                        torch.cuda.empty_cache()
    return ct.finish_report(lines, bench, args.markdown, failed)


if __name__ == "__main__":
    sys.exit(main())
