#!/usr/bin/env python3
"""SM clock and board power per cell of `flashattn-fp8-accuracy --speed-grid` (fp8-ab.sh with
SMI_LOG=1): reads LOGS/smi-NAME-R.csv (nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,
temperature.gpu[,clocks_event_reasons.active][,power.draw.instant] --format=csv,noheader,nounits,
every 20 ms) and LOGS/cells-NAME-R.txt (the grid's stderr: "window DIM CAUSAL SEQ bf16|fp8 T0 T1",
each cell's timed window in seconds since the epoch), and prints per cell and dtype, per library,
the median SM clock (MHz) and power (W) of the samples inside the windows of all rounds, with the
sample count; then each library's whole-grid medians and the throttle reasons seen.

  python3 tests/gpu/fp8_clock_table.py LOGS ROUNDS NAME...
"""
import datetime
import os
import statistics
import sys


def read_smi(path):
    rows = []
    for line in open(path, errors="replace"):
        c = [x.strip() for x in line.split(",")]
        if len(c) < 4:
            continue
        try:
            # nvidia-smi's timestamp is local time, as the bench's system clock read through mktime
            t = datetime.datetime.strptime(c[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(c[1]), float(c[2]), float(c[3]), c[4] if len(c) > 4 else "",
                         float(c[5]) if len(c) > 5 and c[5].replace(".", "", 1).isdigit() else None))
        except ValueError:
            continue
    return rows


def read_windows(path):
    out = []
    for line in open(path, errors="replace"):
        c = line.split()
        if len(c) == 7 and c[0] == "window":
            out.append(((c[1], c[2], c[3]), c[4], float(c[5]), float(c[6])))
    return out


def main(argv):
    logs, rounds, names = argv[0], int(argv[1]), argv[2:]
    cells, order, whole, reasons = {}, [], {}, {}
    for n in names:
        for r in range(1, rounds + 1):
            sp, cp = os.path.join(logs, f"smi-{n}-{r}.csv"), os.path.join(logs, f"cells-{n}-{r}.txt")
            if not (os.path.exists(sp) and os.path.exists(cp)):
                continue
            smi = read_smi(sp)
            for s in smi:
                whole.setdefault(n, []).append(s)
                if s[4]:
                    reasons.setdefault(n, {}).setdefault(s[4], 0)
                    reasons[n][s[4]] += 1
            for key, dt, t0, t1 in read_windows(cp):
                k = key + (dt,)
                if k not in cells:
                    cells[k] = {}
                    order.append(k)
                cells[k].setdefault(n, []).extend(s for s in smi if t0 <= s[0] <= t1)
    print("| dim | causal | seqlen | dtype | " + " | ".join(f"{n}: MHz / W (samples)" for n in names) + " |")
    print("|" + "---|" * (4 + len(names)))
    for k in order:
        cols = []
        for n in names:
            v = cells[k].get(n, [])
            cols.append(f"{statistics.median(s[1] for s in v):.0f} / {statistics.median(s[2] for s in v):.0f} ({len(v)})"
                        if v else "-")
        print("| " + " | ".join(list(k) + cols) + " |")
    print()
    for n in names:
        v = whole.get(n, [])
        if not v:
            continue
        inst = [s[5] for s in v if s[5] is not None]
        print(f"- {n}: whole runs, {len(v)} samples: SM clock median {statistics.median(s[1] for s in v):.0f} MHz "
              f"(min {min(s[1] for s in v):.0f}, max {max(s[1] for s in v):.0f}), power median "
              f"{statistics.median(s[2] for s in v):.0f} W (max {max(s[2] for s in v):.0f}"
              + (f"; instant max {max(inst):.0f}" if inst else "") + f"), temperature max {max(s[3] for s in v):.0f} C; "
              f"event reasons (count): {', '.join(f'{x} {c}' for x, c in sorted(reasons.get(n, {}).items())) or '-'}")


if __name__ == "__main__":
    main(sys.argv[1:])
