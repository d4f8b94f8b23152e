#!/usr/bin/env python3
"""The FA3 backward of two libraries in one process (A = the base, e.g. main's; B = the candidate),
default and deterministic mode each, rounds alternated (even rounds in the listed order, odd rounds
reversed) so that clock drift at the power limit falls on all four alike. Each library is loaded
from its own path (ctypes, RTLD_LOCAL), as bench/ab_libs.py does.

  python3 bench/bwd_ab.py --a /tmp/base/src/libflashattn.so --b build/src/libflashattn.so \
      --markdown bwd-ab.md

Grid as backward_torch.py's (heads = hidden/hdim, batch = tokens/seqlen, bf16). Per cell and mode:
the backward's TFLOP/s (2.5 x the forward's FLOPs) of A and B (median over the rounds of each
round's median), B/A, each library's det/default, the spread ((max - min) / median over the
rounds), and the checks: each library's deterministic rerun is bitwise identical to its first
run, and B's gradients (both modes) are within 1e-2 relative L2 of A's default mode's (BAD
otherwise; the exit status is then 1).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_torch as bt  # noqa: E402
import compare_torch as ct  # noqa: E402
from det_forms import Config  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="library A (the base)")
    ap.add_argument("--b", required=True, help="library B (the candidate)")
    ct.add_grid_args(ap, hdim="64,128", seqlen="2048,4096,8192", warmup=2, reps=10, rounds=3)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    args.no_lse = False
    import torch
    libs = {"A": ct.Lib(ct.find_library(args.a)), "B": ct.Lib(ct.find_library(args.b))}
    for lib in libs.values():
        bt.bind_backward(lib)
    bench = ct.Bench(torch, args)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    lines, failed = [], False
    p = bench.props
    ct.emit(lines, f"# FA3 backward, A/B ({p.name}, {p.multi_processor_count} SMs)")
    ct.emit(lines, "")
    for n, lib in libs.items():
        ct.emit(lines, f"- {n}: {lib.path} (libflashattn {lib.version} {lib.build_info})")
    ct.emit(lines, "")
    ct.emit(lines, f"{args.dtype}, hidden {args.hidden}, {args.tokens} tokens per batch. Backward TFLOP/s (2.5 x fwd "
                   f"FLOPs), median over {args.rounds} alternated rounds of the median of {args.reps} event-timed runs.")
    ct.emit(lines, "")
    ct.emit(lines, "| hdim | causal | seqlen | mode | A | B | B/A | A det/def | B det/def | spread A / B | check |")
    ct.emit(lines, "|---|---|---|---|---|---|---|---|---|---|---|")
    names = ["A def", "B def", "A det", "B det"]
    for d in args.hdim:
        for causal in causals:
            for s in args.seqlen:
                h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                q, k, v, do = (torch.randn(b, s, h, d, dtype=dt, device="cuda") for _ in range(4))
                cfgs = {n: Config(torch, libs[n[0]], q, k, v, do, bool(causal), args.dtype,
                                  0 if n.endswith("det") else None) for n in names}
                tf = {n: [] for n in names}
                for r in range(args.rounds):
                    for n in (names if r % 2 == 0 else names[::-1]):
                        ms, _ = bench.time_ms(lambda i, c=cfgs[n]: c.bwd())
                        tf[n].append(flops / (ms * 1e-3) / 1e12)
                ref = cfgs["A def"].snapshot()
                med = {n: statistics.median(tf[n]) for n in names}
                spr = {n: (max(tf[n]) - min(tf[n])) / med[n] for n in names}
                for mode in ("def", "det"):
                    checks = []
                    for lib in "AB":
                        n = f"{lib} {mode}"
                        if n == "A def":
                            continue
                        first = cfgs[n].snapshot()
                        err = max(bt.rel_err(torch, x, y) for x, y in zip(first, ref))
                        ok = err < 1e-2
                        note = f"{lib} err {err:.1e}"
                        if mode == "det":
                            again = cfgs[n].snapshot()
                            same = all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                                       for x, y in zip(first, again))
                            ok = ok and same
                            note += " bitwise" if same else " DIFFERS"
                        failed = failed or not ok
                        checks.append(note + ("" if ok else " BAD"))
                    a, bb = med[f"A {mode}"], med[f"B {mode}"]
                    ct.emit(lines, f"| {d} | {'yes' if causal else 'no'} | {s} | {mode} | {a:.1f} | {bb:.1f} | "
                                   f"{bb / a:.3f} | {med['A det'] / med['A def']:.3f} | "
                                   f"{med['B det'] / med['B def']:.3f} | {spr[f'A {mode}']:.1%} / "
                                   f"{spr[f'B {mode}']:.1%} | {'; '.join(checks)} |")
                for c in cfgs.values():
                    c.close()
                del q, k, v, do, cfgs, ref
                torch.cuda.empty_cache()
    ct.emit(lines, "")
    return ct.finish_report(lines, bench, args.markdown, failed, "SOME CHECKS FAILED.")


if __name__ == "__main__":
    sys.exit(main())
