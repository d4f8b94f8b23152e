#!/usr/bin/env python3
"""The decode A/B table of paged-ab.sh and merged-ab.sh: reads DIR/rR-TAG-dD-pP[-ORDER].txt (one
`flashattn-bench --decode` run per round R, library TAG base|new, head dim D, page size P, page
table ORDER shuf|inorder; shuf when absent) and prints per (head dim, batch, keys) the median µs of
each library contiguous and in pages of 16, and the ratios as speeds (> 1: faster). The bar of
issue 18 is "new p16 / contig" (a library's paged step against its own contiguous one; main's
contiguous stands in where a run timed only the new library's contiguous step).

  python3 tests/gpu/decode_ab_table.py DIR
"""
import collections
import glob
import os
import re
import statistics
import sys

ROW = re.compile(r"\|\s*(\d+)\s*\|\s*\d+ / \d+\s*\|\s*(\d+)\s*\|[^|]*\|[^|]*\|\s*([\d.]+)\s*\(([\d.]+)\)")
NAME = re.compile(r"r(\d+)-(base|new)-d(\d+)-p(\d+)(?:-(shuf|inorder))?\.txt")


def read_cells(folder):
    cells = collections.defaultdict(list)  # (d, page, order, tag, batch, keys) -> [µs]
    for path in glob.glob(os.path.join(folder, "r*-*-d*-p*.txt")):
        name = NAME.fullmatch(os.path.basename(path))
        if not name:
            continue
        _, tag, d, page, order = name.groups()
        for line in open(path):
            row = ROW.match(line)
            if row:
                key = (int(d), int(page), order or "shuf", tag, int(row.group(1)), int(row.group(2)))
                cells[key].append(float(row.group(4)))
    return cells


def main(folder):
    cells = read_cells(folder)
    med = {k: statistics.median(v) for k, v in cells.items()}
    f = lambda x: "-" if x is None else f"{x:.1f}"
    speed = lambda x, y: "-" if x is None or y is None else f"{y / x:.3f}"  # x as fast as y: t_y / t_x
    print("| d | batch | keys | base contig µs | new contig µs | base p16 µs | new p16 µs | new p16 in-order µs "
          "| base p16/contig | new p16/contig (bar 0.9) | in-order/contig | new/base contig | new/base p16 | n |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in (128, 64):
        for b in (1, 8, 64):
            for sk in (16384, 32768, 131072):
                g = lambda page, tag, order="shuf": med.get((d, page, order, tag, b, sk))
                bc, nc, bp, np_, io = g(0, "base"), g(0, "new"), g(16, "base"), g(16, "new"), g(16, "new", "inorder")
                if nc is None and np_ is None:
                    continue
                n = len(cells.get((d, 16, "shuf", "new", b, sk), []))
                print(f"| {d} | {b} | {sk} | {f(bc)} | {f(nc)} | {f(bp)} | {f(np_)} | {f(io)} | {speed(bp, bc or nc)} "
                      f"| {speed(np_, nc)} | {speed(io, nc)} | {speed(nc, bc)} | {speed(np_, bp)} | {n} |")


if __name__ == "__main__":
    main(sys.argv[1])
