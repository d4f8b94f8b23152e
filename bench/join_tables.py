#!/usr/bin/env python3
"""Join the markdown tables of one device call into the table of docs/performance.md's FA1 bar:
compare_torch.py --standard (PyTorch peers and PyTorch's standard attention, one process) and
flashattn-bench (our cuBLAS standard attention, with that process's own FA1 timing).

    python3 bench/compare_torch.py --gens fa1,fa2,fa3 --standard --dtype both --hdim 64,128 \\
        --no-decode --markdown torch.md
    flashattn-bench --backend all-gpu --hdim 64,128 --dtype both --no-decode --markdown bench.md
    python3 bench/join_tables.py torch.md bench.md

Prints, per dtype, one row per (hdim, causal, seqlen) found in both files: fa1, fa2, fa3,
torch-flash, cuDNN, PyTorch standard, fa1 / PyTorch standard, cuBLAS standard,
fa1 / cuBLAS standard (both from flashattn-bench) and fa2 / fa1; then the range of each ratio over
the cells with seqlen >= --min-seqlen, per head dim and causal flag.
"""

import argparse
import sys


def read_tables(path):
    """{(dtype, hdim, causal, seqlen): {column: text}} from the '## Forward, <dtype>:' tables."""
    cells, dtype, head = {}, None, None
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                dtype = line.split(",")[1].split(":")[0].strip() if line.startswith("## Forward,") else None
                head = None
                continue
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if dtype and cols and cols[0] == "hdim":
                head = cols
            elif dtype and head and len(cols) == len(head) and cols[0].isdigit():
                cells[(dtype, cols[0], cols[1], cols[2])] = dict(zip(head, cols))
    return cells


def num(text):
    return float(text.rstrip("*"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("torch_md", help="compare_torch.py --standard --markdown output")
    ap.add_argument("bench_md", help="flashattn-bench --markdown output")
    ap.add_argument("--min-seqlen", type=int, default=1024, help="cells summarised (default 1024)")
    args = ap.parse_args()
    torch_cells, bench_cells = read_tables(args.torch_md), read_tables(args.bench_md)
    keys = [k for k in torch_cells if k in bench_cells]
    if not keys:
        sys.exit("join_tables.py: no (dtype, hdim, causal, seqlen) cell is in both files")
    for path, cells, need in ((args.torch_md, torch_cells, ("fa1", "fa2", "fa3", "torch-flash", "cuDNN", "standard")),
                              (args.bench_md, bench_cells, ("fa1", "standard"))):
        missing = [c for c in need if c not in cells[keys[0]]]
        if missing:
            sys.exit(f"join_tables.py: {path} has no column {', '.join(missing)} (compare_torch.py needs "
                     "--gens fa1,fa2,fa3 --standard; flashattn-bench its standard baseline)")

    ranges = {}
    for dtype in dict.fromkeys(k[0] for k in keys):
        print(f"\n{dtype}:\n")
        print("| hdim | causal | seqlen | fa1 | fa2 | fa3 | torch-flash | cuDNN | PyTorch standard | "
              "**fa1 / PyTorch standard** | cuBLAS standard | fa1 / cuBLAS standard | fa2 / fa1 |")
        print("|" + "---|" * 13)
        for key in (k for k in keys if k[0] == dtype):
            t, b = torch_cells[key], bench_cells[key]
            ratios = {
                # compare_torch's own ratio (from unrounded times) where it printed one
                "fa1 / PyTorch standard": num(t["fa1/standard"]) if "fa1/standard" in t
                else num(t["fa1"]) / num(t["standard"]),
                "fa1 / cuBLAS standard": num(b["fa1"]) / num(b["standard"]),
                "fa2 / fa1": num(t["fa2"]) / num(t["fa1"]),
            }
            print(f"| {key[1]} | {key[2]} | {key[3]} | {t['fa1']} | {t['fa2']} | {t['fa3']} | "
                  f"{t['torch-flash']} | {t['cuDNN']} | {t['standard']} | {ratios['fa1 / PyTorch standard']:.2f} | "
                  f"{b['standard']} | {ratios['fa1 / cuBLAS standard']:.2f} | {ratios['fa2 / fa1']:.2f} |")
            if int(key[3]) >= args.min_seqlen:
                for name, value in ratios.items():
                    ranges.setdefault((key[1], key[2], name), []).append(value)
    print(f"\nRatios over seqlen >= {args.min_seqlen}, both tables' dtypes:\n")
    for (hdim, causal, name), values in ranges.items():
        print(f"- hdim {hdim}, causal {causal}, {name}: {min(values):.2f}-{max(values):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
