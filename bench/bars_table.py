#!/usr/bin/env python3
"""One verdict per performance bar of the open issues (15-20), read from the tables that
tests/gpu/bars.sh writes into one folder (the raw outputs of backward_torch.py, ab_cudnn.py,
flashattn-fp8-accuracy, compare_torch.py --decode, flashattn-bench --decode, append-cost.sh and
flashattn-bench-variants). Prints markdown: a table of every bar (cells read, the worst cell, met or
not), then the cells that miss each bar. A bar whose table is missing reads "not measured"; no
verdict is ever given from a partial table without saying how many cells it read.

  python3 bench/bars_table.py DIR [--misses N]

The bars are the issues' texts (bf16, hidden 2048, 16k tokens per batch):
  15 FA2 backward >= 1.0x torch-flash on every cell (d 64 / 128 / 256, seqlen 1k-16k, causal and
     not); deterministic >= 0.8x the default.
  16 FA3 backward >= 1.5x FA2's from 2k; FA3 forward+backward >= 1.0x cuDNN's at d 128 / 256 from
     2k; deterministic >= 0.8x the default.
  17 FP8 >= 1,100 TFLOP/s at d 128 and >= 1,200 at d 256 (16k, non-causal); FP8 / bf16 FA3 >= 1.4x
     at d 128 / 256 and >= 1.2x at d 64 on every cell from 2k; RMSE under outliers of (c) <= 1.0e-2
     and <= 0.5x (b)'s (seeds pooled, seqlen 4096).
  18 contiguous decode >= 1.0x cuDNN on every cell from 16k keys; b 1 / 32k >= 3.2 TB/s; pages of 16
     >= 0.9x contiguous on those cells; append + rotary <= +5 % at 32k keys (given against the
     seqused_k step, which an append requires, and against the plain step).
  19 ALiBi, sink logits and sink tokens >= 0.95x the same shape without them (fa2 and fa3); merge of
     8 partials at d 128 >= 0.8x copy bandwidth; (192, 128) on fa3 >= 0.95x square 192's TFLOP/s.
  20 FA3 forward >= 1.0x cuDNN on every cell from 1k (d 64 / 128 / 256, causal and not, bf16 and
     fp16), geometric mean over the cells from 2k >= 1.08x, >= 0.9x at seqlen 512.
"""
import glob
import json
import math
import os
import re
import statistics
import sys


def md_tables(path):
    """Every markdown table of a file as a list of row dicts keyed by the header's names."""
    if not os.path.exists(path):
        return []
    lines = [ln.rstrip("\n") for ln in open(path, errors="replace")]
    tables = []
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", lines[i + 1]):
            head = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows = []
            for ln in lines[i + 2:]:
                if not ln.startswith("|"):
                    break
                cells = [c.strip() for c in ln.strip().strip("|").split("|")]
                if len(cells) == len(head):
                    rows.append(dict(zip(head, cells)))
            tables.append(rows)
    return tables


def md_rows(path):
    return [r for t in md_tables(path) for r in t]


def num(text):
    """The leading number of a cell ("1234 (40.1)" -> 1234.0, "**812**" -> 812.0), else None."""
    m = re.match(r"^\**\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)", text or "")
    return float(m.group(1)) if m else None


class Bar:
    """One bar: its cells' values against a threshold (>= unless `most`)."""

    def __init__(self, issue, text, threshold, most=False, fmt="{:.3f}"):
        self.issue, self.text, self.threshold, self.most, self.fmt = issue, text, threshold, most, fmt
        self.cells = []  # (label, value)
        self.unread = []  # labels of cells the table has but without a value (n/a, a failed run)

    def add(self, label, value):
        if value is not None and math.isfinite(value):
            self.cells.append((label, value))
        else:
            self.unread.append(label)

    def misses(self):
        bad = [(lbl, v) for lbl, v in self.cells if (v > self.threshold if self.most else v < self.threshold)]
        return sorted(bad, key=lambda c: -c[1] if self.most else c[1])

    def row(self):
        unread = f"; {len(self.unread)} cells without a value" if self.unread else ""
        if not self.cells:
            return f"| {self.issue} | {self.text} | 0 | - | - | not measured{unread} |"
        worst = max(self.cells, key=lambda c: c[1]) if self.most else min(self.cells, key=lambda c: c[1])
        med = statistics.median(v for _, v in self.cells)
        n_miss = len(self.misses())
        verdict = "**met**" if n_miss == 0 and not self.unread else f"no: {n_miss} of {len(self.cells)} miss"
        return (f"| {self.issue} | {self.text} | {len(self.cells)} | {self.fmt.format(worst[1])} ({worst[0]}) | "
                f"{self.fmt.format(med)} | {verdict}{unread} |")


def ratio(a, b):
    return a / b if a is not None and b else None


def backward_bars(d):
    rows = md_rows(os.path.join(d, "bwd.md"))
    b15 = Bar(15, "fa2 bwd / torch-flash bwd >= 1.0, every cell", 1.0)
    b15d = Bar(15, "fa2 det / fa2 default bwd >= 0.8, every cell", 0.8)
    b16 = Bar(16, "fa3 bwd / fa2 bwd >= 1.5, from 2k", 1.5)
    b16f = Bar(16, "fa3 f+b / cuDNN f+b >= 1.0, d 128 / 256 from 2k", 1.0)
    b16d = Bar(16, "fa3 det / fa3 default bwd >= 0.8, every cell", 0.8)
    for r in rows:
        cell = f"d{r['hdim']} {'c' if r['causal'] == 'yes' else 'nc'} {r['seqlen']}"
        seq, hdim = int(r["seqlen"]), int(r["hdim"])
        v = {k: num(x) for k, x in r.items()}
        b15.add(cell, ratio(v.get("fa2 bwd"), v.get("torch-flash bwd")))
        b15d.add(cell, ratio(v.get("fa2 det bwd"), v.get("fa2 bwd")))
        b16d.add(cell, ratio(v.get("fa3 det bwd"), v.get("fa3 bwd")))
        if seq >= 2048:
            b16.add(cell, ratio(v.get("fa3 bwd"), v.get("fa2 bwd")))
            if hdim in (128, 256):
                b16f.add(cell, ratio(v.get("fa3 f+b"), v.get("cuDNN f+b")))
    return [b15, b15d, b16, b16f, b16d]


def fp8_bars(d):
    grid = md_rows(os.path.join(d, "fp8-grid.md"))
    peak128 = Bar(17, "FP8 TFLOP/s, d 128, 16k non-causal >= 1100", 1100, fmt="{:.0f}")
    peak256 = Bar(17, "FP8 TFLOP/s, d 256, 16k non-causal >= 1200", 1200, fmt="{:.0f}")
    peak = {128: peak128, 256: peak256}
    r14 = Bar(17, "FP8 / bf16 fa3 >= 1.4, d 128 / 256 from 2k", 1.4)
    r12 = Bar(17, "FP8 / bf16 fa3 >= 1.2, d 64 from 2k", 1.2)
    for r in grid:
        dim, causal, seq = int(r["dim"]), r["causal"] == "1", int(r["seqlen"])
        bf, f8 = num(r["bf16 fa3"]), num(r["FP8 fa3"])
        cell = f"d{dim} {'c' if causal else 'nc'} {seq}"
        if seq == 16384 and not causal and dim in peak:
            peak[dim].add(cell, f8)
        if seq >= 2048:
            (r12 if dim == 64 else r14).add(cell, ratio(f8, bf))
    rmse_c = Bar(17, "RMSE (c) <= 1.0e-2, seqlen 4096, seeds pooled", 1.0e-2, most=True, fmt="{:.2e}")
    rmse_r = Bar(17, "RMSE (c) / (b) <= 0.5, seqlen 4096, seeds pooled", 0.5, most=True)
    for dim in (128, 256):
        sq = {"b": [], "c": []}
        for path in sorted(glob.glob(os.path.join(d, f"fp8-acc-d{dim}-s*.md"))):
            for r in md_rows(path):
                name = r.get("case", "")
                for k in ("b", "c"):
                    if name.startswith(f"({k}) ") and "fa3 FP8 kernel" in name and num(r.get("RMSE")) is not None:
                        sq[k].append(num(r["RMSE"]) ** 2)
        if sq["b"] and len(sq["b"]) == len(sq["c"]):
            b, c = math.sqrt(statistics.mean(sq["b"])), math.sqrt(statistics.mean(sq["c"]))
            label = f"d{dim}, {len(sq['c'])} seeds"
            rmse_c.add(label, c)
            rmse_r.add(label, c / b)
    return [peak128, peak256, r14, r12, rmse_c, rmse_r]


def json_records(path):
    try:
        return json.load(open(path))["records"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def decode_bars(d):
    cudnn = Bar(18, "fa2 decode / cuDNN GB/s >= 1.0, keys >= 16k", 1.0)
    b1 = Bar(18, "b 1 / 32k keys >= 3.2 TB/s (GB/s)", 3200, fmt="{:.0f}")
    gbps = {}
    for r in json_records(os.path.join(d, "decode.json")):
        if r.get("kind") == "decode" and r.get("status") == "ok" and r.get("gbps"):
            gbps[(r["backend"], r["batch"], r["seqlen_k"])] = r["gbps"]
    for (be, bt, sk), g in sorted(gbps.items()):
        if be != "fa2" or sk < 16384:
            continue
        cudnn.add(f"b{bt} {sk // 1024}k", ratio(g, gbps.get(("cuDNN", bt, sk))))
        if bt == 1 and sk == 32768:
            b1.add("b1 32k", g)
    paged = Bar(18, "pages of 16 / contiguous >= 0.9, keys >= 16k (flashattn-bench)", 0.9)
    ms = {}
    for path in glob.glob(os.path.join(d, "decode-page*-*.json")):
        page = int(re.search(r"decode-page(\d+)-", path).group(1))
        for r in json_records(path):
            if r.get("kind") == "decode" and r.get("status") == "ok" and r.get("ms"):
                ms.setdefault((page, r["batch"], r["seqlen_k"]), []).append(r["ms"])
    for (page, bt, sk), v in sorted(ms.items()):
        if page == 16 and sk >= 16384 and (0, bt, sk) in ms:
            paged.add(f"b{bt} {sk // 1024}k", statistics.median(ms[(0, bt, sk)]) / statistics.median(v))
    app_used = Bar(18, "append + rotary vs the seqused_k step <= +5 %, 32k", 5.0, most=True, fmt="{:+.1f} %")
    app_plain = Bar(18, "append + rotary vs the plain step <= +5 %, 32k", 5.0, most=True, fmt="{:+.1f} %")
    for page in (0, 16):
        for r in md_rows(os.path.join(d, f"append-page{page}.md")):
            if r.get("seqlen_k") == "32768":
                label = f"{'contiguous' if page == 0 else 'pages of 16'} b{r['batch']}"
                app_used.add(label, num(r.get("append vs seqused_k")))
                app_plain.add(label, num(r.get("append vs plain")))
    return [cudnn, b1, paged, app_used, app_plain]


def variant_bars(d):
    var = Bar(19, "ALiBi / sink logits / sink tokens vs without >= 0.95 (fa2, fa3)", 0.95)
    for path in sorted(glob.glob(os.path.join(d, "variants-*-fa2-fa3.md"))):
        hdim = re.search(r"variants-(\d+)-", path).group(1)
        for r in md_rows(path):
            name = r.get("variant", "")
            if name.startswith(("ALiBi", "sink logits", "4 sink tokens")):
                var.add(f"{r['backend']} d{hdim} {name}", num(r.get("ratio")))
    hdv = Bar(19, "(192, 128) / square 192 TFLOP/s >= 0.95 (fa3)", 0.95)
    for r in md_rows(os.path.join(d, "variants-192-fa3-128.md")):
        if r.get("variant", "").startswith("head_dim_v"):
            hdv.add(f"{r['backend']} {r['variant']}", num(r.get("ratio")))
    merge = Bar(19, "merge of 8 partials, d 128: fraction of copy >= 0.8", 0.8)
    for r in md_rows(os.path.join(d, "variants-128-merge.md")):
        if r.get("partials") in ("fp32", "bf16"):
            merge.add(f"{r['partials']} partials", num(r.get("fraction of copy")))
    return [var, hdv, merge]


def forward_bars(d):
    rows = md_rows(os.path.join(d, "fwd.md"))
    every = Bar(20, "fa3 / cuDNN >= 1.0, every cell from 1k", 1.0)
    short = Bar(20, "fa3 / cuDNN >= 0.9 at seqlen 512", 0.9)
    from2k = []
    for r in rows:
        seq = int(r["seqlen"])
        # A and B are this one library, timed twice beside the same cuDNN figure: their mean.
        a, b, c = num(r.get("A")), num(r.get("B")), num(r.get("cuDNN"))
        if a is None or b is None or not c:
            continue
        x = (a + b) / 2 / c
        cell = f"{r['dtype']} d{r['hdim']} {'c' if r['causal'] == '1' else 'nc'} {seq}"
        (short if seq == 512 else every).add(cell, x)
        if seq >= 2048:
            from2k.append(x)
    geo = Bar(20, "fa3 / cuDNN geometric mean from 2k >= 1.08", 1.08)
    if from2k:
        geo.add(f"{len(from2k)} cells", math.exp(statistics.mean(math.log(x) for x in from2k)))
    return [every, geo, short]


def main(argv):
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    d = argv[0]
    n_miss = int(argv[argv.index("--misses") + 1]) if "--misses" in argv else 12
    bars = backward_bars(d) + fp8_bars(d) + decode_bars(d) + variant_bars(d) + forward_bars(d)
    bars.sort(key=lambda b: b.issue)
    gpu = os.path.join(d, "gpu.txt")
    print(f"# Performance bars ({d})")
    if os.path.exists(gpu):
        print()
        for ln in open(gpu):
            print(f"    {ln.rstrip()}")
    print()
    print("| issue | bar | cells | worst (cell) | median | met |")
    print("|---|---|---|---|---|---|")
    for b in bars:
        print(b.row())
    for b in bars:
        miss = b.misses()
        if miss:
            shown = ", ".join(f"{lbl} {b.fmt.format(v)}" for lbl, v in miss[:n_miss])
            more = f" (+{len(miss) - n_miss} more)" if len(miss) > n_miss else ""
            print(f"- {b.issue}, {b.text}: {shown}{more}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
