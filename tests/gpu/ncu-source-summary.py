#!/usr/bin/env python3
"""Summarise an ncu source-counter export of one kernel (SASS view) on the GPU machine or here.

Make the input on the GPU machine:
    ncu --kernel-name-base demangled --kernel-name regex:NAME --launch-skip 2 --launch-count 1 \\
        --set full --import-source yes -o /tmp/prof <program and arguments>
    ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $OUT/source.csv

Then: python3 tests/gpu/ncu-source-summary.py source.csv [--per N] [--top K] [--min-share S]

Prints the stall reasons of all samples, the instruction mix (share of executed instructions and
of stall samples per opcode), the K instructions with the most samples, and the kernel cut into
segments at every barrier and every executed branch, each with its share of samples, its
instructions per unit and its three main stall reasons. --per N divides executed counts by N (for
example the number of warp-steps of a loop) so that segment sizes read as instructions per step.
"""
import argparse
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head_at = next((i for i, r in enumerate(rows) if "Source" in r and "Address" in r), None)
    if head_at is None:
        sys.exit(f"{path}: no 'Address'/'Source' header: not an ncu --page source --csv export")
    head = rows[head_at]
    col = {h: i for i, h in enumerate(head)}
    stalls = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    recs = []
    for r in rows[head_at + 1:]:
        if len(r) < len(head):
            continue
        try:
            samples = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
            executed = int(r[col["Instructions Executed"]] or 0)
        except ValueError:
            continue
        recs.append({
            "src": r[col["Source"]].strip(),
            "samples": samples,
            "executed": executed,
            "stalls": {s[len("stall_"):]: int(r[col[s]] or 0) for s in stalls},
        })
    if not recs:
        sys.exit(f"{path}: no instruction rows")
    return recs


def opcode(src):
    words = src.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def top_stalls(stalls, total, n=3):
    best = sorted(stalls.items(), key=lambda kv: -kv[1])[:n]
    return " ".join(f"{k}:{100.0 * v / total:.0f}%" for k, v in best if v and total)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=0, help="divide executed counts by this (e.g. warp-steps)")
    ap.add_argument("--top", type=int, default=20, help="instructions with the most samples to list")
    ap.add_argument("--min-share", type=float, default=0.4,
                    help="list segments holding at least this %% of samples or instructions")
    a = ap.parse_args()
    recs = load(a.csv)
    samples = sum(r["samples"] for r in recs) or 1
    executed = sum(r["executed"] for r in recs) or 1
    per = a.per if a.per > 0 else 1.0
    unit = "per unit" if a.per > 0 else "total"

    print(f"{len(recs)} SASS instructions, {samples} stall samples, {executed} warp instructions executed"
          + (f" ({executed / per:.1f} per unit)" if a.per > 0 else ""))
    totals = {}
    for r in recs:
        for k, v in r["stalls"].items():
            totals[k] = totals.get(k, 0) + v
    print("\nstall reasons (share of samples):")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"  {k:22s} {100.0 * v / samples:5.1f}%")

    mix = {}
    for r in recs:
        m = mix.setdefault(opcode(r["src"]), [0, 0])
        m[0] += r["executed"]
        m[1] += r["samples"]
    print(f"\nopcodes: executed ({unit}), % of executed, % of samples")
    for k, (e, s) in sorted(mix.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {k:12s} {e / per:12.1f} {100.0 * e / executed:6.1f} {100.0 * s / samples:6.1f}")

    print(f"\ninstructions with the most samples:")
    for r in sorted(recs, key=lambda r: -r["samples"])[:a.top]:
        print(f"  {r['samples']:7d} {r['src'][:64]:64s} {top_stalls(r['stalls'], r['samples'])}")

    print(f"\nsegments (cut after each barrier and each executed branch): "
          f"[first-last] samples%, instructions ({unit}), main stalls, last instruction")
    start, seg = 0, []

    def flush(end):
        s = sum(r["samples"] for r in seg)
        e = sum(r["executed"] for r in seg)
        if 100.0 * s / samples >= a.min_share or 100.0 * e / executed >= a.min_share:
            st = {}
            for r in seg:
                for k, v in r["stalls"].items():
                    st[k] = st.get(k, 0) + v
            print(f"  [{start:5d}-{end:5d}] {100.0 * s / samples:5.1f}% {e / per:10.1f}  "
                  f"{top_stalls(st, s):40s} {seg[-1]['src'][:40]}")

    for i, r in enumerate(recs):
        seg.append(r)
        op = opcode(r["src"])
        if op in ("BAR", "EXIT") or (op == "BRA" and r["executed"] > 0):
            flush(i)
            start, seg = i + 1, []
    if seg:
        flush(len(recs) - 1)


if __name__ == "__main__":
    main()
