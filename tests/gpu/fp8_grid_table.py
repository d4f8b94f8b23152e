#!/usr/bin/env python3
"""The table of several libraries' runs of `flashattn-fp8-accuracy --speed-grid` (FA3 bf16 and FP8
TFLOP/s per cell), shared by the device scripts fp8-ab.sh and smx-ab.sh: reads DIR/grid-NAME-R.md
for each NAME and round R = 1..ROUNDS (missing runs are skipped: a call cut short), prints per cell
each library's medians "bf16 / **FP8** (FP8 runs)" and each later library's FP8 median over the
first's. --bf16-ratios adds the bf16 medians' ratios; --means adds the means of the ratios.

  python3 tests/gpu/fp8_grid_table.py DIR ROUNDS NAME... [--bf16-ratios] [--means]
"""
import os
import statistics
import sys


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    pos = [a for a in argv if not a.startswith("--")]
    out, rounds, names = pos[0], int(pos[1]), pos[2:]
    cells, order = {}, []
    for n in names:
        for r in range(1, rounds + 1):
            p = os.path.join(out, f"grid-{n}-{r}.md")
            if not os.path.exists(p):
                continue
            for line in open(p):
                c = [x.strip() for x in line.strip().strip("|").split("|")]
                if len(c) != 7 or not c[0].isdigit():
                    continue
                key = (c[0], c[1], c[2])
                if key not in cells:
                    cells[key] = {}
                    order.append(key)
                cells[key].setdefault(n, []).append((float(c[4]), float(c[5])))
    kinds = [("FP8", 1)] + ([("bf16", 0)] if "--bf16-ratios" in flags else [])
    # (FP8 alone: the ratio columns are named as fp8-ab.sh's were, "NAME/FIRST")
    heads = [f"{n}/{names[0]}" + ("" if len(kinds) == 1 else f" {k}") for k, _ in kinds for n in names[1:]]
    print("| dim | causal | seqlen | " + " | ".join(f"{n} bf16 / FP8 (runs)" for n in names) + " | " +
          " | ".join(heads) + " |")
    print("|" + "---|" * (3 + len(names) + len(heads)))
    ratios = {h: [] for h in heads}
    for key in order:
        row = cells[key]
        med = {n: (statistics.median(b for b, _ in row[n]), statistics.median(f for _, f in row[n])) for n in row}
        cols = [f"{med[n][0]:.0f} / **{med[n][1]:.0f}** ({' '.join(f'{f:.0f}' for _, f in row[n])})" if n in med
                else "-" for n in names]
        rat = []
        for h, (k, i) in zip(heads, [(k, i) for k, i in kinds for _ in names[1:]]):
            n = h.split("/")[0]
            if n in med and names[0] in med:
                x = med[n][i] / med[names[0]][i]
                ratios[h].append(x)
                rat.append(f"{x:.3f}")
            else:
                rat.append("-")
        print("| " + " | ".join(list(key) + cols + rat) + " |")
    if "--means" in flags:
        print()
        for h, v in ratios.items():
            if v:
                print(f"- {h}: mean {statistics.mean(v):.3f}, lowest {min(v):.3f}, highest {max(v):.3f}, "
                      f"over {len(v)} cells")


if __name__ == "__main__":
    main(sys.argv[1:])
