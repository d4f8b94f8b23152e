#!/usr/bin/env python3
"""The benchmarks' JSON and bench/plot.py, on the CPU.

    test_plot.py PATH/TO/flashattn-bench

1. flashattn-bench --backend cpu --json: the document follows the schema of bench/README.md, has one
   record per (method, mask, seqlen), and each record's TFLOP/s matches its time and shape by the
   FLOP count computed here.
   With --backward --deterministic: the records of the backward kinds (cpu-backward, cpu-fwd-bwd)
   for naive, the library and its deterministic mode, TFLOP/s from 2.5x / 3.5x the forward's FLOPs.
2. plot.py on that file and on a synthetic GPU run (prefill with PyTorch's backends, decode with a
   copy limit, a wrong-result record, an n/a record, a second file repeating a method): exit 0, valid
   PNG files of a plausible size, and per chart the number of points drawn that the records imply
   (only "ok" records, the first file's copy of a repeated method).
3. plot.py exits 1 with a message naming matplotlib when it cannot import it, and 2 on a document of
   another schema.
Exits 77 (skipped) when matplotlib is not importable: the charts cannot be drawn, nothing is passed.
"""

import json
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.join(HERE, "..", "..", "bench", "plot.py")
FIELDS = {"kind": str, "backend": str, "dtype": str, "batch": int, "seqlen_q": int, "seqlen_k": int, "heads_q": int,
          "heads_kv": int, "head_dim": int, "causal": bool, "status": str, "reduced": bool, "note": str}
NUMBERS = ("ms", "tflops", "gbps", "bytes")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, **kw):
    return subprocess.run([sys.executable, PLOT] + args, capture_output=True, text=True, **kw)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def check_png(path, max_bytes=200_000):
    size = png_size(path) if os.path.exists(path) else None
    check(size is not None, f"{path} is a PNG file")
    if size:
        check(200 <= size[0] <= 3000 and 150 <= size[1] <= 2000, f"{path}: {size[0]}x{size[1]} pixels")
        check(os.path.getsize(path) <= max_bytes, f"{path}: {os.path.getsize(path)} bytes (<= {max_bytes})")


def drawn(stdout, name):
    m = re.search(re.escape(name) + r": (\d+) points drawn from (\d+) records", stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_cpu_json(bench, work):
    path = os.path.join(work, "cpu.json")
    seqlens, b, h, d = (64, 96), 1, 2, 32
    p = subprocess.run([bench, "--backend", "cpu", "--seqlen", ",".join(map(str, seqlens)), "--causal", "both",
                        "--heads", str(h), "--hdim", str(d), "--warmup", "0", "--reps", "1", "--json", path],
                       capture_output=True, text=True)
    check(p.returncode == 0, f"flashattn-bench --json exit {p.returncode}: {p.stderr[-400:]}")
    with open(path) as f:
        doc = json.load(f)
    check(doc.get("schema") == "flashattn-bench-results/1", "schema name")
    check(doc.get("tool") == "flashattn-bench", "tool name")
    for key in ("library_version", "build_info", "device", "timing"):
        check(isinstance(doc.get(key), str) and doc[key], f"top-level {key}")
    recs = doc.get("records", [])
    check(len(recs) == 2 * 2 * len(seqlens), f"{len(recs)} records, want {2 * 2 * len(seqlens)}")
    seen = set()
    for r in recs:
        for key, typ in FIELDS.items():
            check(isinstance(r.get(key), typ), f"record field {key} is {typ.__name__}: {r}")
        for key in NUMBERS:
            check(key in r and (r[key] is None or isinstance(r[key], (int, float))), f"record field {key}: {r}")
        check(r["kind"] == "cpu" and r["dtype"] == "fp32" and r["status"] == "ok", f"cpu fp32 ok record: {r}")
        check((r["batch"], r["heads_q"], r["heads_kv"], r["head_dim"]) == (b, h, h, d), f"shape of {r}")
        check(r["seqlen_q"] == r["seqlen_k"] and r["seqlen_q"] in seqlens, f"seqlens of {r}")
        seen.add((r["backend"], r["causal"], r["seqlen_q"]))
        flops = 4.0 * b * h * r["seqlen_q"] * r["seqlen_k"] * d * (0.5 if r["causal"] else 1.0)
        want = flops / (r["ms"] * 1e-3) / 1e12
        check(abs(r["tflops"] - want) <= 1e-3 * want, f"tflops {r['tflops']} vs {want} from ms and shape")
        check(r["gbps"] is None and r["bytes"] is None, f"no GB/s in a cpu record: {r}")
    want = {(m, c, s) for m in ("cpu", "naive") for c in (False, True) for s in seqlens}
    check(seen == want, f"records cover {sorted(seen)}")
    return path


def check_cpu_backward_json(bench, work):
    """flashattn-bench --backward --deterministic: (method, deterministic, causal, seqlen) records of
    both backward kinds, each TFLOP/s matching 2.5x (backward) or 3.5x (fwd-bwd) the forward FLOPs."""
    path = os.path.join(work, "cpu-bwd.json")
    seqlens, b, h, d = (48, 72), 1, 2, 16
    p = subprocess.run([bench, "--backend", "cpu", "--seqlen", ",".join(map(str, seqlens)), "--causal", "both",
                        "--heads", str(h), "--hdim", str(d), "--warmup", "0", "--reps", "1", "--backward",
                        "--deterministic", "--json", path], capture_output=True, text=True)
    check(p.returncode == 0, f"flashattn-bench --backward exit {p.returncode}: {p.stderr[-400:]}")
    with open(path) as f:
        recs = json.load(f).get("records", [])
    factor = {"cpu-backward": 2.5, "cpu-fwd-bwd": 3.5}
    seen = set()
    for r in recs:
        check(isinstance(r.get("deterministic"), bool), f"record field deterministic is bool: {r}")
        if r["kind"] not in factor:
            check(r["kind"] == "cpu" and r["deterministic"] is False, f"forward record: {r}")
            continue
        check(r["status"] == "ok" and r["dtype"] == "fp32", f"backward record ok: {r}")
        check(r["backend"] in ("cpu", "naive") and not (r["backend"] == "naive" and r["deterministic"]),
              f"backward method: {r}")
        seen.add((r["kind"], r["backend"], r["deterministic"], r["causal"], r["seqlen_q"]))
        flops = factor[r["kind"]] * 4.0 * b * h * r["seqlen_q"] * r["seqlen_k"] * d * (0.5 if r["causal"] else 1.0)
        want = flops / (r["ms"] * 1e-3) / 1e12
        check(abs(r["tflops"] - want) <= 1e-3 * want, f"backward tflops {r['tflops']} vs {want}")
    want = {(k, m, det, c, s) for k in factor for (m, det) in (("naive", False), ("cpu", False), ("cpu", True))
            for c in (False, True) for s in seqlens}
    check(seen == want, f"backward records cover {sorted(seen)}")
    return path, len(want) // 2


def gpu_docs(work):
    """Two synthetic documents as compare_torch.py and flashattn-bench write them; the expected
    points per chart."""
    recs = []

    def rec(kind, backend, status="ok", **kw):
        r = dict(kind=kind, backend=backend, dtype=kw.pop("dtype", "bf16"), batch=1, seqlen_q=1, seqlen_k=1,
                 heads_q=16, heads_kv=16, head_dim=128, causal=False, status=status, ms=None, tflops=None,
                 gbps=None, bytes=None, reduced=False, note="")
        r.update(kw)
        return r

    prefill_ok = 0
    for d in (64, 128):
        for causal in (False, True):
            for s in (512, 1024, 2048):
                for i, name in enumerate(("fa2", "fa3", "torch-flash", "torch-efficient", "cuDNN")):
                    status = "ok"
                    if name == "torch-efficient" and d == 128:
                        status = "n/a"
                    if name == "fa3" and (d, causal, s) == (64, True, 1024):
                        status = "bad"
                    tf = 100.0 + 10 * i + s / 100.0
                    recs.append(rec("prefill", name, status, batch=16384 // s, seqlen_q=s, seqlen_k=s,
                                    heads_q=2048 // d, heads_kv=2048 // d, head_dim=d, causal=causal,
                                    ms=1.0 if status == "ok" else None, tflops=tf if status == "ok" else None,
                                    note="" if status == "ok" else "why"))
                    prefill_ok += status == "ok"
    decode_ok = 0
    for hkv in (8, 32):
        for b in (1, 8):
            for sk in (8192, 32768):
                kv = 2 * b * sk * hkv * 128 * 2
                for name in ("fa2", "fa3", "torch-flash", "cuDNN"):
                    recs.append(rec("decode", name, batch=b, seqlen_k=sk, heads_q=32, heads_kv=hkv,
                                    ms=kv / 3e9, gbps=3000.0, bytes=kv))
                    decode_ok += 1
    recs.append(rec("copy", "memcpy", dtype="", ms=0.5, gbps=4100.0, bytes=2 << 30))
    first = {"schema": "flashattn-bench-results/1", "tool": "compare_torch.py", "device": "NVIDIA H200, sm_90",
             "records": recs}
    # flashattn-bench's own run: fa3 again (left out: the first file has it) and its standard baseline.
    second_recs = [rec("prefill", "fa3", seqlen_q=512, seqlen_k=512, ms=1.0, tflops=1.0),
                   rec("prefill", "standard", seqlen_q=512, seqlen_k=512, head_dim=64, ms=2.0, tflops=50.0)]
    second = {"schema": "flashattn-bench-results/1", "tool": "flashattn-bench", "records": second_recs}
    paths = []
    for name, doc in (("torch.json", first), ("bench.json", second)):
        paths.append(os.path.join(work, name))
        with open(paths[-1], "w") as f:
            json.dump(doc, f)
    return paths, prefill_ok + 1, decode_ok


def main():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not importable: skipping (install bench/requirements.txt)")
        return 77
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        cpu_json = check_cpu_json(bench, work)
        out = os.path.join(work, "png")
        p = run(["-o", out, "--prefix", "t-", cpu_json])
        check(p.returncode == 0, f"plot.py on the cpu JSON: exit {p.returncode}: {p.stderr}")
        check(drawn(p.stdout, "t-cpu-fp32.png") == (8, 8), f"cpu chart points: {p.stdout}")
        check_png(os.path.join(out, "t-cpu-fp32.png"))

        bwd_json, bwd_pts = check_cpu_backward_json(bench, work)
        p = run(["-o", out, "--prefix", "b-", bwd_json])
        check(p.returncode == 0, f"plot.py on the backward JSON: exit {p.returncode}: {p.stderr}")
        for name in ("b-cpu-backward-fp32.png", "b-cpu-fwd-bwd-fp32.png"):
            check(drawn(p.stdout, name) == (bwd_pts, bwd_pts), f"{name} points: {p.stdout}")
            check_png(os.path.join(out, name))

        paths, prefill_pts, decode_pts = gpu_docs(work)
        p = run(["-o", out] + paths)
        check(p.returncode == 0, f"plot.py on the GPU JSON: exit {p.returncode}: {p.stderr}")
        check(drawn(p.stdout, "prefill-bf16.png") == (prefill_pts, 61), f"prefill chart points: {p.stdout}")
        check(drawn(p.stdout, "decode.png") == (decode_pts, decode_pts), f"decode chart points: {p.stdout}")
        check("copy limit 4100 GB/s" in p.stdout, f"decode chart has the copy limit: {p.stdout}")
        check("prefill records of fa3 left out" in p.stderr, f"repeated method reported: {p.stderr}")
        for name in ("prefill-bf16.png", "decode.png"):
            check_png(os.path.join(out, name))

        # No matplotlib: a package of that name that fails to import shadows the real one.
        fake = os.path.join(work, "fake")
        os.makedirs(os.path.join(fake, "matplotlib"))
        with open(os.path.join(fake, "matplotlib", "__init__.py"), "w") as f:
            f.write("raise ImportError('no matplotlib here')\n")
        p = run(["-o", out] + paths, env=dict(os.environ, PYTHONPATH=fake))
        check(p.returncode == 1 and "matplotlib is not installed" in p.stderr,
              f"without matplotlib: exit {p.returncode}, {p.stderr}")

        other = os.path.join(work, "other.json")
        with open(other, "w") as f:
            json.dump({"schema": "something-else/1", "records": []}, f)
        p = run(["-o", out, other])
        check(p.returncode == 2 and "schema" in p.stderr, f"another schema: exit {p.returncode}, {p.stderr}")
    print("test_plot:", "FAILED" if failures else "passed", f"({len(failures)} failure(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
