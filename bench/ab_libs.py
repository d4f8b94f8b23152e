#!/usr/bin/env python3
"""A/B of two libflashattn builds in one process, cell by cell: each library is loaded from its own
path (ctypes, RTLD_LOCAL), both run the same inputs, and the rounds alternate which one goes first,
so that clock drift at the power limit falls on both alike. For refactors that must not cost speed
(issue 14's rule: no cell more than 2% slower).

  python3 bench/ab_libs.py --a /tmp/old/src/libflashattn.so --b build/src/libflashattn.so \
      --gens fa1,fa2,fa3 --rounds 3 --markdown out.md

Grid as compare_torch.py's prefill table: heads = hidden/hdim, batch = tokens/seqlen, bf16.
Prints one row per (generation, hdim, causal, seqlen): median TFLOP/s of A and B over the rounds
and B/A, and each library's spread over the rounds ((max - min) / median); the summary line gives each
generation's lowest and geometric-mean B/A. An A/A run (the same library twice) shows the noise floor.
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402  (the ctypes layer and the event timer)


def time_lib(bench, lib, gen, q, k, v, causal, dtype_name):
    ms, _, out, note = ct.run_lib(bench, lib, gen, [q], [k], [v], causal, dtype_name)
    return ms, out, note


def spread(values):
    """(max - min) / median of one library's per-round TFLOP/s: the noise a B/A must be read against."""
    return f"{(max(values) - min(values)) / statistics.median(values):.1%}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="library A (the reference, e.g. the old build)")
    ap.add_argument("--b", required=True, help="library B (the candidate)")
    ap.add_argument("--gens", default="fa1,fa2,fa3")
    ct.add_grid_args(ap, hdim="64,128,256", seqlen="512,1024,2048,4096,8192,16384", warmup=3, reps=10, rounds=3)
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    args.no_lse = False
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    gens = [g for g in args.gens.split(",") if g]

    import torch
    if not torch.cuda.is_available():
        sys.exit("ab_libs.py: torch sees no CUDA device")
    libs = {"A": ct.Lib(args.a), "B": ct.Lib(args.b)}
    bench = ct.Bench(torch, args)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    lines = []
    p = bench.props
    ct.emit(lines, f"# A/B of two libflashattn builds ({p.name}, {p.multi_processor_count} SMs, {args.dtype})")
    ct.emit(lines, f"A = {args.a} ({libs['A'].build_info}); B = {args.b} ({libs['B'].build_info}).")
    ct.emit(lines, f"Median TFLOP/s over {args.rounds} rounds (each the median of {args.reps} event-timed runs), "
                   "A and B alternating first; max abs diff = |O_A - O_B| on the same inputs.")
    ct.emit(lines, "")
    ct.emit(lines, "| gen | hdim | causal | seqlen | A TFLOP/s | B TFLOP/s | B/A | max abs diff | A spread | B spread |")
    ct.emit(lines, "|---|---|---|---|---|---|---|---|---|---|")
    ratios = {g: [] for g in gens}
    failed = False
    with torch.inference_mode():
        for gen in gens:
            for d in args.hdim:
                for causal in causals:
                    for s in args.seqlen:
                        h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                        q = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                        k = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                        v = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                        tf = {"A": [], "B": []}
                        outs, note = {}, ""
                        for r in range(args.rounds):
                            for name in (("A", "B") if r % 2 == 0 else ("B", "A")):
                                ms, out, why = time_lib(bench, libs[name], gen, q, k, v, bool(causal), args.dtype)
                                if ms is None:
                                    note = why
                                    continue
                                tf[name].append(flops / (ms * 1e-3) / 1e12)
                                outs[name] = out
                        row = [gen, str(d), "yes" if causal else "no", str(s)]
                        if not tf["A"] or not tf["B"]:
                            ct.emit(lines, "| " + " | ".join(row + ["-", "-", "-", note[:60], "-", "-"]) + " |")
                            failed = failed or note.startswith("ERR")
                            continue
                        a, bb = statistics.median(tf["A"]), statistics.median(tf["B"])
                        diff = (outs["A"].float() - outs["B"].float()).abs().max().item()
                        if not math.isfinite(diff):
                            failed = True
                        ratios[gen].append(bb / a)
                        ct.emit(lines, "| " + " | ".join(row + [f"{a:.1f}", f"{bb:.1f}", f"{bb / a:.3f}", f"{diff:.2e}",
                                                               spread(tf["A"]), spread(tf["B"])]) + " |")
                        del q, k, v, outs
                        torch.cuda.empty_cache()
    ct.emit(lines, "")
    for gen in gens:
        rs = ratios[gen]
        if rs:
            geo = math.exp(sum(math.log(x) for x in rs) / len(rs))
            ct.emit(lines, f"- {gen}: B/A lowest {min(rs):.3f}, geometric mean {geo:.3f} over {len(rs)} cells")
    return ct.finish_report(lines, bench, args.markdown, failed)


if __name__ == "__main__":
    sys.exit(main())
