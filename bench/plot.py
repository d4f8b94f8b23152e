#!/usr/bin/env python3
"""PNG charts from the benchmarks' JSON (schema flashattn-bench-results/1, bench/README.md).

    flashattn-bench --backend all-gpu --json bench.json
    python3 bench/compare_torch.py --json torch.json
    python3 bench/plot.py -o docs/img torch.json bench.json

Charts (one file each, written to --outdir, default the current directory):
  prefill-<dtype>.png  TFLOP/s against sequence length, one panel per head dim and mask, one line per
                       method (ours solid, the baselines and PyTorch's backends dashed);
  decode.png           decode GB/s (bytes of K and V / time) against the size of K and V, one panel
                       per head layout, with the device's copy bandwidth (bytes read + written /
                       time) drawn as the memory limit (a read-only kernel can pass it a little);
  cpu-<dtype>.png      the CPU benchmark: GFLOP/s against sequence length, library vs naive.
  backward-<dtype>.png, fwd-bwd-<dtype>.png, cpu-backward-<dtype>.png, cpu-fwd-bwd-<dtype>.png
                       flashattn-bench --backward: the backward and forward + backward (FLOPs 2.5x and
                       3.5x the forward's) like prefill/cpu; the deterministic mode as "<method> det",
                       dotted.
Only records with status "ok" are drawn; "bad" (a wrong result), "n/a", "error", "oom" and
"skipped" ones are counted in the summary line of their chart. Where several files hold the same
method for the same kind of run, the first file given is used and the later one's records of it are
left out (said on stderr).

Exit status: 0 charts written; 1 matplotlib missing (install bench/requirements.txt); 2 bad input
(unreadable file, another schema, nothing to draw).
"""

import argparse
import json
import os
import sys

SCHEMA = "flashattn-bench-results/1"
OURS = ("fa1", "fa2", "fa3", "cpu")
# One colour per method, the same in every chart.
COLOURS = {
    "fa1": "#9467bd", "fa2": "#1f77b4", "fa3": "#d62728", "cpu": "#1f77b4",
    "torch-flash": "#2ca02c", "torch-efficient": "#bcbd22", "cuDNN": "#ff7f0e",
    "standard": "#7f7f7f", "torch-standard": "#8c564b", "naive": "#7f7f7f",
}
# The decode chart's reference line: the device's copy bandwidth (bytes read + written / time). A
# kernel that only reads can go a little past it; it marks where a decode kernel is memory-bound.
COPY_LABEL = "device copy"
ORDER = ["fa1", "fa2", "fa3", "cpu", "torch-flash", "torch-efficient", "cuDNN", "standard", "torch-standard", "naive"]


def die(message):
    print(f"plot.py: {message}", file=sys.stderr)
    sys.exit(2)


def load(paths):
    """The records of all files, each (kind, backend) from the first file that has it."""
    owner = {}
    records, meta = [], []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read {path}: {e}")
        if not isinstance(doc, dict):
            die(f"{path}: not a JSON object")
        if doc.get("schema") != SCHEMA:
            die(f"{path}: not a {SCHEMA} document (schema {doc.get('schema')!r})")
        meta.append(doc)
        dropped = set()
        for r in doc.get("records", []):
            key = (r.get("kind"), r.get("backend"))
            if owner.setdefault(key, path) != path:
                dropped.add(key)
                continue
            records.append(r)
        for kind, backend in sorted(dropped):
            print(f"plot.py: {path}: {kind} records of {backend} left out ({owner[(kind, backend)]} has them)",
                  file=sys.stderr)
    return records, meta


def method_key(name):
    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


DET = " det"  # the name suffix of a record with "deterministic": true (a backward kind)


def style(name):
    base = name[:-len(DET)] if name.endswith(DET) else name
    ours = base in OURS
    line = ":" if base != name else "-" if ours else "--"
    return dict(color=COLOURS.get(base), linestyle=line, linewidth=2.0 if ours else 1.4,
                marker="o" if ours else "s", markersize=4 if ours else 3, label=name)


def seqlen_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def device_title(meta):
    for doc in meta:
        if doc.get("device"):
            return doc["device"].split(";")[0]
    return ""


def counts_text(records):
    """'18 ok, 2 n/a' for the summary line."""
    counts = {}
    for r in records:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def plot_seqlen_panels(plt, records, value, ylabel, title, path, dpi):
    """One panel per (causal, head dim); x = seqlen_q; one line per backend. Returns the points drawn."""
    hdims = sorted({r["head_dim"] for r in records})
    masks = sorted({bool(r["causal"]) for r in records})
    fig, axes = plt.subplots(len(masks), len(hdims), figsize=(3.6 * len(hdims), 2.8 * len(masks)),
                             squeeze=False, sharex=True)
    drawn = 0
    handles = {}
    for i, causal in enumerate(masks):
        for j, d in enumerate(hdims):
            ax = axes[i][j]
            cell = [r for r in records if r["head_dim"] == d and bool(r["causal"]) == causal and r["status"] == "ok"]
            for name in sorted({r["backend"] for r in cell}, key=method_key):
                pts = {}
                for r in cell:
                    if r["backend"] == name and r.get(value) is not None:
                        pts.setdefault(r["seqlen_q"], r[value])
                xs = sorted(pts)
                line, = ax.plot(xs, [pts[x] for x in xs], **style(name))
                handles.setdefault(name, line)
                drawn += len(xs)
            seqlens = sorted({r["seqlen_q"] for r in records})
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens)
            ax.set_xticklabels([seqlen_label(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"head dim {d}, {'causal' if causal else 'not causal'}", fontsize=9)
            if i == len(masks) - 1:
                ax.set_xlabel("sequence length")
            if j == 0:
                ax.set_ylabel(ylabel)
    names = sorted(handles, key=method_key)
    fig.legend([handles[n] for n in names], names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return drawn


def plot_decode(plt, records, copy, title, path, dpi):
    """GB/s against K+V size, one panel per (heads_q, heads_kv); the copy limit as a line."""
    layouts = sorted({(r["heads_q"], r["heads_kv"]) for r in records}, key=lambda x: -x[0] / x[1])
    fig, axes = plt.subplots(1, len(layouts), figsize=(5.0 * len(layouts), 3.4), squeeze=False, sharey=True)
    drawn = 0
    handles = {}
    for j, (hq, hkv) in enumerate(layouts):
        ax = axes[0][j]
        cell = [r for r in records if (r["heads_q"], r["heads_kv"]) == (hq, hkv) and r["status"] == "ok"]
        for name in sorted({r["backend"] for r in cell}, key=method_key):
            pts = {}
            for r in cell:
                if r["backend"] == name and r.get("gbps") is not None:
                    pts.setdefault(r["bytes"] / 1e6, r["gbps"])
            xs = sorted(pts)
            line, = ax.plot(xs, [pts[x] for x in xs], **style(name))
            handles.setdefault(name, line)
            drawn += len(xs)
        if copy:
            line = ax.axhline(copy, color="black", linestyle=":", linewidth=1.2, label=COPY_LABEL)
            handles.setdefault(COPY_LABEL, line)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_ylim(bottom=0, top=max([copy or 0] + [r["gbps"] for r in cell if r.get("gbps")]) * 1.1 or None)
        ax.grid(True, alpha=0.3)
        kind = "MHA" if hq == hkv else f"GQA {hq // hkv}:1"
        ax.set_title(f"heads {hq} / {hkv} ({kind})", fontsize=9)
        ax.set_xlabel("K + V size (MB)")
        if j == 0:
            ax.set_ylabel("GB/s (bytes of K and V / time)")
    names = sorted(handles, key=lambda n: method_key(n) if n != COPY_LABEL else (len(ORDER) + 1, n))
    fig.legend([handles[n] for n in names], names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.93))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return drawn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="JSON files written by flashattn-bench --json / compare_torch.py --json")
    ap.add_argument("-o", "--outdir", default=".", help="directory for the PNG files (default: .)")
    ap.add_argument("--prefix", default="", help="prefix of the file names (e.g. h200-)")
    ap.add_argument("--dpi", type=int, default=80, help="resolution (default 80: charts of ~50 KB)")
    args = ap.parse_args(argv)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot.py: matplotlib is not installed ({e}); install it with "
              "`python3 -m pip install -r bench/requirements.txt`", file=sys.stderr)
        return 1

    records, meta = load(args.files)
    os.makedirs(args.outdir, exist_ok=True)
    where = device_title(meta)
    written = 0

    def out(name):
        return os.path.join(args.outdir, args.prefix + name)

    titles = {"prefill": "forward", "cpu": "CPU forward", "backward": "backward", "fwd-bwd": "forward + backward",
              "cpu-backward": "CPU backward", "cpu-fwd-bwd": "CPU forward + backward"}
    for kind, what in titles.items():
        value, ylabel, unit = ("tflops", "GFLOP/s", 1e3) if kind.startswith("cpu") else ("tflops", "TFLOP/s", 1.0)
        for dtype in sorted({r["dtype"] for r in records if r["kind"] == kind}):
            recs = [dict(r) for r in records if r["kind"] == kind and r["dtype"] == dtype]
            for r in recs:
                if r.get(value) is not None:
                    r[value] *= unit
                if r.get("deterministic"):
                    r["backend"] += DET
            path = out(f"{kind}-{dtype}.png")
            drawn = plot_seqlen_panels(plt, recs, value, ylabel, f"{what}, {dtype}: {where}", path, args.dpi)
            print(f"{path}: {drawn} points drawn from {len(recs)} records ({counts_text(recs)})")
            written += 1
    decode = [r for r in records if r["kind"] == "decode"]
    if decode:
        copies = [r["gbps"] for r in records if r["kind"] == "copy" and r["status"] == "ok" and r.get("gbps")]
        copy = copies[0] if copies else None
        path = out("decode.png")
        drawn = plot_decode(plt, decode, copy, f"decode (seqlen_q = 1), {decode[0]['dtype']}, head dim "
                            f"{decode[0]['head_dim']}: {where}", path, args.dpi)
        limit = f"copy limit {copy:.0f} GB/s" if copy else "no copy limit recorded"  # tests read this
        print(f"{path}: {drawn} points drawn from {len(decode)} records ({counts_text(decode)}); {limit}")
        written += 1
    if written == 0:
        die("no prefill, decode, cpu or backward records to draw")
    return 0


if __name__ == "__main__":
    sys.exit(main())
