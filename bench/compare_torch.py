#!/usr/bin/env python3
"""libflashattn (fa1/fa2/fa3, through ctypes) against PyTorch SDPA's FLASH_ATTENTION,
EFFICIENT_ATTENTION and CUDNN_ATTENTION backends, in one run, on the FlashAttention-3 paper's grid
and a decode table (with the device's copy bandwidth as its limit).

    python3 bench/compare_torch.py --lib build/src/libflashattn.so --markdown out.md --json out.json

The library is loaded from --lib, else $FLASHATTN_LIBRARY, else the first build*/src/libflashattn.so
under the repository. Every method is timed the same way: 3 warm-ups, then a ~2 ms GPU sleep while
the host enqueues 10 runs, each between two torch.cuda.Event records; the median is reported.
Inputs are fresh torch.randn tensors per cell, [batch, seq, heads, dim] contiguous (SDPA gets the
transposed views, no copies). Each library output is checked once against torch's (max abs error
and relative L2 error); a generation the library cannot run shows "n/a".

Only the minimal ctypes declarations this script needs are written here; it does not use the
Python binding under bindings/.
"""

import argparse
import ctypes
import glob
import json
import math
import os
import statistics
import sys
import time

# --- The C ABI (values pinned by include/flashattn/flashattn.h) --------------------------------

SUCCESS, NOT_SUPPORTED = 0, 2
I64 = {
    "BATCH": 1, "SEQLEN_Q": 2, "SEQLEN_K": 3, "HEADS_Q": 4, "HEADS_KV": 5, "HEAD_DIM": 6,
    "DTYPE": 8, "CAUSAL": 9, "BACKEND": 12, "DEVICE": 13, "NUM_SPLITS": 70,
}
DTYPE = {"fp16": 1, "bf16": 2}
BACKEND = {"fa1": 2, "fa2": 3, "fa3": 4}
GENS = ["fa1", "fa2", "fa3"]
# PyTorch SDPA backends timed beside the library: (column / JSON name, torch.nn.attention.SDPBackend member).
TORCH_PEERS = [("torch-flash", "FLASH_ATTENTION"), ("torch-efficient", "EFFICIENT_ATTENTION"),
               ("cuDNN", "CUDNN_ATTENTION")]


class FlashAttnError(RuntimeError):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Lib:
    """Minimal ctypes view of libflashattn."""

    def __init__(self, path):
        self.path = path
        self.decode_splits = 0  # FLASHATTN_I64_NUM_SPLITS for decode plans (0: the library's choice)
        lib = ctypes.CDLL(path)
        vp, i32, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
        lib.flashattn_status_string.argtypes = [i32]
        lib.flashattn_status_string.restype = ctypes.c_char_p
        lib.flashattn_last_error.argtypes = []
        lib.flashattn_last_error.restype = ctypes.c_char_p
        lib.flashattn_version_string.argtypes = []
        lib.flashattn_version_string.restype = ctypes.c_char_p
        lib.flashattn_build_info.argtypes = []
        lib.flashattn_build_info.restype = ctypes.c_char_p
        lib.flashattn_plan_create.argtypes = [ctypes.POINTER(vp)]
        lib.flashattn_plan_create.restype = i32
        lib.flashattn_plan_destroy.argtypes = [vp]
        lib.flashattn_plan_destroy.restype = None
        lib.flashattn_plan_set_i64.argtypes = [vp, i32, i64]
        lib.flashattn_plan_set_i64.restype = i32
        lib.flashattn_plan_finalize.argtypes = [vp]
        lib.flashattn_plan_finalize.restype = i32
        lib.flashattn_plan_get_workspace_size.argtypes = [vp, ctypes.POINTER(sz)]
        lib.flashattn_plan_get_workspace_size.restype = i32
        lib.flashattn_plan_execute.argtypes = [vp, vp, vp, vp, vp, vp, vp, sz, vp]
        lib.flashattn_plan_execute.restype = i32
        self.lib = lib
        self.version = lib.flashattn_version_string().decode()
        self.build_info = lib.flashattn_build_info().decode()

    def _error(self, status):
        name = self.lib.flashattn_status_string(status).decode()
        msg = (self.lib.flashattn_last_error() or b"").decode(errors="replace")
        return FlashAttnError(status, f"{name}: {msg}" if msg else name)

    def plan(self, backend, b, sq, sk, hq, hkv, d, dtype, causal, device=0):
        """A finalized plan handle and its workspace size; raises FlashAttnError."""
        handle = ctypes.c_void_p()
        st = self.lib.flashattn_plan_create(ctypes.byref(handle))
        if st != SUCCESS:
            raise self._error(st)
        try:
            for key, value in (("BATCH", b), ("SEQLEN_Q", sq), ("SEQLEN_K", sk), ("HEADS_Q", hq),
                               ("HEADS_KV", hkv), ("HEAD_DIM", d), ("DTYPE", dtype),
                               ("CAUSAL", int(causal)), ("BACKEND", backend), ("DEVICE", device)):
                st = self.lib.flashattn_plan_set_i64(handle, I64[key], int(value))
                if st != SUCCESS:
                    raise self._error(st)
            if sq == 1 and self.decode_splits > 0:  # --decode-splits: a forced split count for decode plans
                st = self.lib.flashattn_plan_set_i64(handle, I64["NUM_SPLITS"], self.decode_splits)
                if st != SUCCESS:
                    raise self._error(st)
            st = self.lib.flashattn_plan_finalize(handle)
            if st != SUCCESS:
                raise self._error(st)
            ws = ctypes.c_size_t()
            st = self.lib.flashattn_plan_get_workspace_size(handle, ctypes.byref(ws))
            if st != SUCCESS:
                raise self._error(st)
        except BaseException:
            self.lib.flashattn_plan_destroy(handle)
            raise
        return handle, ws.value

    def destroy(self, handle):
        self.lib.flashattn_plan_destroy(handle)

    def execute(self, handle, q, k, v, o, lse, ws_ptr, ws_bytes, stream):
        """All pointers are ints (data_ptr()) or None; raises FlashAttnError."""
        st = self.lib.flashattn_plan_execute(handle, q, k, v, o, lse, ws_ptr, ws_bytes, stream)
        if st != SUCCESS:
            raise self._error(st)


def find_library(arg):
    if arg:
        return arg
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    hits = sorted(glob.glob(os.path.join(root, "build*", "src", "libflashattn.so")))
    if not hits:
        sys.exit("compare_torch.py: libflashattn.so not found: pass --lib or set FLASHATTN_LIBRARY")
    return hits[0]


# --- Timing and checks ---------------------------------------------------------------------------

class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.props = props
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        clock_khz = 0
        try:  # nvidia-ml not needed: torch exposes the clock on recent versions only
            clock_khz = int(getattr(props, "clock_rate", 0) or 0)
        except Exception:
            clock_khz = 0
        self.spin_cycles = max(clock_khz, 1_000_000) * 4  # ~4 ms
        self.start = time.monotonic()
        self.records = []

    def elapsed(self):
        return time.monotonic() - self.start

    def record(self, shape, backend, ms, reduced, note, flops=0.0, kv_bytes=0, extra_note=""):
        """One --json record (schema flashattn-bench-results/1, bench/README.md). ms None: not
        measured, note says why ("n/a: ...", "ERR: ...", a torch error)."""
        r = dict(shape, backend=backend, status="ok", ms=None, tflops=None, gbps=None, bytes=None,
                 reduced=bool(reduced), note=extra_note)
        if ms is None:
            r["status"] = "n/a" if not note.startswith("ERR") else "error"
            if "out of device memory" in note:
                r["status"] = "oom"
            r["note"] = note
        else:
            r["ms"] = ms
            if flops:
                r["tflops"] = flops / (ms * 1e-3) / 1e12
            if kv_bytes:
                r["bytes"] = kv_bytes
                r["gbps"] = kv_bytes / (ms * 1e-3) / 1e9
        self.records.append(r)

    def copy_gbps(self):
        """The decode table's copy limit: a device-to-device copy of up to 1 GiB, timed like the
        methods; GB/s counts bytes read + written. Recorded as kind "copy"."""
        torch = self.torch
        free, _ = torch.cuda.mem_get_info()
        n = min(1 << 30, free // 4)
        if n < (64 << 20):
            return None
        src = torch.zeros(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms, reduced = self.time_ms(lambda i: dst.copy_(src))
        del src, dst
        torch.cuda.empty_cache()
        gbps = 2 * n / (ms * 1e-3) / 1e9
        self.records.append(dict(kind="copy", backend="memcpy", dtype="", batch=0, seqlen_q=0, seqlen_k=0,
                                 heads_q=0, heads_kv=0, head_dim=0, causal=False, status="ok", ms=ms,
                                 tflops=None, gbps=gbps, bytes=2 * n, reduced=reduced, note=""))
        return gbps

    def time_ms(self, fn, warmup=None, reps=None):
        """Median ms of fn(i) (i = run index, for input rotation) and whether the run was reduced."""
        torch = self.torch
        warmup = self.args.warmup if warmup is None else warmup
        reps = self.args.reps if reps is None else reps
        s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        fn(0)
        e0.record()
        torch.cuda.synchronize()
        reduced = False
        if s0.elapsed_time(e0) > 1000.0:
            reduced, warmup, reps = True, 1, min(reps, 3)
        for i in range(1, warmup):
            fn(i)
        torch.cuda.synchronize()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(self.spin_cycles))  # the host enqueues the runs meanwhile
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            starts[r].record()
            fn(warmup + r)
            ends[r].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)), reduced


def diff(torch, out_bshd, ref_bshd):
    """(max abs error, relative L2 error, non-finite count) of out against ref, in fp32."""
    a = out_bshd.float()
    r = ref_bshd.float()
    bad = int((~torch.isfinite(a)).sum().item())
    d = (a - r).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    max_abs = float(d.abs().max().item())
    rel = float((d.norm() / r.norm().clamp_min(1e-30)).item())
    return max_abs, rel, bad


def check_against(torch, bench, notes, gen, where, out, ref):
    """The error column of one library output against torch's; a wrong result fails the run and is
    noted under its generation."""
    mx, rel, bad = diff(torch, out, ref)
    ok = bad == 0 and rel <= 2e-2
    if not ok:
        bench.failed = True
        notes.setdefault(f"{gen}: WRONG RESULT vs torch", []).append(
            f"{where} (max abs {mx:.3e}, rel L2 {rel:.3e}, {bad} non-finite)")
    return f"{mx:.1e}" + ("" if ok else " BAD")


# --- Runs ------------------------------------------------------------------------------------------

def run_torch(bench, backend, q_sets, k_sets, v_sets, causal, gqa):
    """TFLOP/s-free result: (ms, reduced, out_bshd, note) or (None, None, None, reason)."""
    torch = bench.torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    n = len(q_sets)
    note = ""
    kw = {}
    ks, vs = k_sets, v_sets
    if gqa:
        kw["enable_gqa"] = True

    def call(i, ks=ks, vs=vs):
        j = i % n
        return F.scaled_dot_product_attention(q_sets[j].transpose(1, 2), ks[j].transpose(1, 2),
                                              vs[j].transpose(1, 2), is_causal=causal, **kw)

    try:
        with sdpa_kernel([backend]):
            try:
                out = call(0)
            except Exception:
                if not gqa:
                    raise
                # No GQA support in this backend: expand K/V to the query heads (outside timing);
                # the kernel then reads group x the K/V bytes, which the table marks.
                group = q_sets[0].shape[2] // k_sets[0].shape[2]
                kw.pop("enable_gqa", None)
                ks = [k.repeat_interleave(group, dim=2) for k in k_sets]
                vs = [v.repeat_interleave(group, dim=2) for v in v_sets]
                note = "+"
                out = call(0, ks, vs)
            torch.cuda.synchronize()
            ms, reduced = bench.time_ms(lambda i: call(i, ks, vs))
        ref = out.transpose(1, 2)  # [b, s, h, d] view of the first set's output
        return ms, reduced, ref, note
    except Exception as e:  # unsupported shape or dtype in this backend
        msg = str(e).strip().splitlines()
        return None, None, None, (msg[0] if msg else type(e).__name__)[:160]


def run_standard(bench, q, k, v, causal):
    """PyTorch standard attention, the FlashAttention-1 paper's baseline: S = Q K^T in the input
    dtype, scale and (bottom-right) causal mask, softmax in fp32, P cast back, O = P V; S and P are
    materialised in device memory. (ms, reduced, out_bshd, note) or (None, None, None, reason)."""
    torch = bench.torch
    try:
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        sq, sk = q.shape[1], k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[3])
        mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").triu(sk - sq + 1) if causal else None

        def call(i):
            s = torch.matmul(qh, kh.transpose(-2, -1))
            if mask is not None:
                s.masked_fill_(mask, float("-inf"))
            p = torch.softmax(s.float().mul_(scale), dim=-1).to(q.dtype)
            del s
            return torch.matmul(p, vh)

        out = call(0)
        torch.cuda.synchronize()
        ms, reduced = bench.time_ms(call)
        return ms, reduced, out.transpose(1, 2), ""
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, None, None, "out of device memory (S and P of the whole problem)"


def run_lib(bench, lib, gen, q_sets, k_sets, v_sets, causal, dtype_name):
    """(ms, reduced, out_bshd, note) or (None, None, None, reason)."""
    torch = bench.torch
    q0, k0 = q_sets[0], k_sets[0]
    b, sq, hq, d = q0.shape
    sk, hkv = k0.shape[1], k0.shape[2]
    try:
        handle, ws_bytes = lib.plan(BACKEND[gen], b, sq, sk, hq, hkv, d, DTYPE[dtype_name], causal,
                                    torch.cuda.current_device())
    except FlashAttnError as e:
        if e.status == NOT_SUPPORTED:
            return None, None, None, "n/a: " + str(e)
        return None, None, None, "ERR: plan: " + str(e)
    try:
        ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
        o = torch.empty_like(q0)
        lse = None if bench.args.no_lse else torch.empty((b, hq, sq), dtype=torch.float32, device="cuda")
        lse_ptr = None if lse is None else lse.data_ptr()
        ws_ptr = ws.data_ptr() if ws_bytes > 0 else None
        n = len(q_sets)

        def call(i):
            j = i % n
            lib.execute(handle, q_sets[j].data_ptr(), k_sets[j].data_ptr(), v_sets[j].data_ptr(),
                        o.data_ptr(), lse_ptr, ws_ptr, ws_bytes,
                        torch.cuda.current_stream().cuda_stream)

        ms, reduced = bench.time_ms(call)
        # The checked output: a fresh run on set 0 into a NaN-poisoned O.
        o.fill_(float("nan"))
        call(0)
        torch.cuda.synchronize()
        return ms, reduced, o, ""
    except FlashAttnError as e:
        return None, None, None, "ERR: execute: " + str(e)
    finally:
        lib.destroy(handle)


def fmt_val(v, reduced, spec="{:.1f}"):
    return spec.format(v) + ("*" if reduced else "")


def prefill_table(bench, lib, gens, dtype_name, out_lines, notes):
    torch = bench.torch
    from torch.nn.attention import SDPBackend
    args = bench.args
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    peers = [name for name, _ in TORCH_PEERS] + (["standard"] if args.standard else [])
    head = ["hdim", "causal", "seqlen"] + gens + peers
    ratio_cols = []
    if args.standard:
        ratio_cols += [(g, "standard") for g in gens]
    if "fa2" in gens:
        ratio_cols.append(("fa2", "torch-flash"))
    if "fa3" in gens:
        ratio_cols.append(("fa3", "cuDNN"))
    head += [f"{a}/{b}" for a, b in ratio_cols]
    head += ["max abs err vs " + "torch (" + "/".join(gens) + ")"]
    emit(out_lines, "")
    emit(out_lines, f"## Forward, {dtype_name}: TFLOP/s (hidden {args.hidden}, heads = {args.hidden}/hdim, "
                    f"batch = {args.tokens}/seqlen)")
    emit(out_lines, "")
    emit(out_lines, "| " + " | ".join(head) + " |")
    emit(out_lines, "|" + "---|" * len(head))
    deadline = args.budget_s * (0.8 if not args.no_decode else 1.0)
    for d in args.hdim:
        for causal in args.causal:
            for s in args.seqlen:
                h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                where = f"{dtype_name} hdim {d} causal {causal} seqlen {s}"
                row = [str(d), "yes" if causal else "no", str(s)]
                if bench.elapsed() > deadline:
                    emit(out_lines, "| " + " | ".join(row + ["skip"] * (len(head) - 4) + ["skipped (time budget)"]) + " |")
                    continue
                q = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                k = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                v = torch.randn(b, s, h, d, dtype=dt, device="cuda")
                tf = {}
                outs = {}
                shape = dict(kind="prefill", dtype=dtype_name, batch=b, seqlen_q=s, seqlen_k=s, heads_q=h,
                             heads_kv=h, head_dim=d, causal=bool(causal))
                for name, attr in TORCH_PEERS:
                    ms, red, out, note = run_torch(bench, getattr(SDPBackend, attr), [q], [k], [v], bool(causal), False)
                    bench.record(shape, name, ms, red, note, flops=flops)
                    if ms is None:
                        notes.setdefault(f"{name}: {note}", []).append(where)
                        tf[name] = None
                    else:
                        tf[name] = (flops / (ms * 1e-3) / 1e12, red)
                        outs[name] = out
                if args.standard:
                    ms, red, out, note = run_standard(bench, q, k, v, bool(causal))
                    bench.record(shape, "torch-standard", ms, red, note, flops=flops)
                    tf["standard"] = None if ms is None else (flops / (ms * 1e-3) / 1e12, red)
                    if ms is None:
                        notes.setdefault(f"standard: {note}", []).append(where)
                    del out
                    torch.cuda.empty_cache()
                ref = outs.get("torch-flash", outs.get("cuDNN"))
                errs = []
                for gen in gens:
                    ms, red, out, note = run_lib(bench, lib, gen, [q], [k], [v], bool(causal), dtype_name)
                    bench.record(shape, gen, ms, red, note, flops=flops)
                    if ms is None:
                        tf[gen] = None
                        notes.setdefault(f"{gen}: {note}", []).append(where)
                        errs.append("-")
                        if note.startswith("ERR"):
                            bench.failed = True
                        continue
                    tf[gen] = (flops / (ms * 1e-3) / 1e12, red)
                    if ref is None:
                        errs.append("no ref")
                        continue
                    errs.append(check_against(torch, bench, notes, gen, where, out, ref))
                    if errs[-1].endswith("BAD"):
                        bench.records[-1]["status"] = "bad"
                    del out
                for name in gens + peers:
                    row.append("n/a" if tf.get(name) is None else fmt_val(*tf[name]))
                for a, bb in ratio_cols:
                    row.append(f"{tf[a][0] / tf[bb][0]:.2f}" if tf.get(a) and tf.get(bb) else "-")
                row.append(" / ".join(errs))
                emit(out_lines, "| " + " | ".join(row) + " |")
                del q, k, v, outs, ref


def rotated_rounds(runners, rounds):
    """(first, done) for runners [(name, fn)], each fn returning a tuple whose [0] is its time or
    None (not runnable): every runner called once per round, the order rotating by one each round
    (so that clock drift at the power limit falls on all alike); first[name] the first round's
    result, done[name] every round's result with a time. A runner not runnable in the first round
    is not called again (reported once)."""
    first, done = {}, {name: [] for name, _ in runners}
    for r in range(max(1, rounds)):
        k = r % len(runners)
        for name, fn in runners[k:] + runners[:k]:
            if name in first and first[name][0] is None:
                continue
            result = fn()
            first.setdefault(name, result)
            if result[0] is not None:
                done[name].append(result)
    return first, done


def decode_rounds(bench, lib, gens, qs, ks, vs, gqa):
    """{name: (ms, reduced, out, note)} for every torch peer and generation on one decode cell:
    --decode-rounds rotated rounds (rotated_rounds), ms the median of the rounds' medians; out and
    note from the first round."""
    from torch.nn.attention import SDPBackend
    runners = [(name, lambda a=attr: run_torch(bench, getattr(SDPBackend, a), qs, ks, vs, False, gqa))
               for name, attr in TORCH_PEERS]
    runners += [(gen, lambda g=gen: run_lib(bench, lib, g, qs, ks, vs, False, "bf16")) for gen in gens]
    first, done = rotated_rounds(runners, bench.args.decode_rounds)
    return {name: ((statistics.median(r[0] for r in done[name]),) + first[name][1:]) if done[name] else first[name]
            for name, _ in runners}


def decode_table(bench, lib, gens, out_lines, notes):
    torch = bench.torch
    from torch.nn.attention import SDPBackend
    args = bench.args
    dt, d, hq = torch.bfloat16, 128, 32
    head = ["batch", "heads q / kv", "seqlen_k", "K+V MB", "sets"] + [f"{g} GB/s (µs)" for g in gens]
    head += [f"{name} GB/s (µs)" for name, _ in TORCH_PEERS]
    head += ["max abs err vs torch (" + "/".join(gens) + ")"]
    emit(out_lines, "")
    emit(out_lines, "## Decode (seqlen_q = 1), bf16, head dim 128: GB/s = bytes of K and V / time")
    emit(out_lines, "")
    emit(out_lines, f"Inputs rotate among enough K/V sets to exceed 3x the {bench.l2 / 1e6:.0f} MB L2; shapes whose "
                    f"K+V exceed {args.max_decode_gb:.0f} GB are skipped. `+`: this torch backend has no GQA, so K/V "
                    "were expanded to 32 heads before timing and it reads 4x the bytes counted."
                    + (f" Each cell: {args.decode_rounds} rounds, the libraries' order rotating per round; "
                       "the median of the rounds' medians." if args.decode_rounds > 1 else ""))
    copy = bench.copy_gbps()
    if copy:
        emit(out_lines, "")
        emit(out_lines, f"Copy limit: a device-to-device tensor copy (up to 1 GiB) moves {copy:.0f} GB/s "
                        "(bytes read + written).")
    emit(out_lines, "")
    emit(out_lines, "| " + " | ".join(head) + " |")
    emit(out_lines, "|" + "---|" * len(head))
    for hkv in args.decode_kv_heads:
        for b in args.decode_batch:
            for sk in args.decode_seqlen:
                kv_bytes = 2 * b * sk * hkv * d * 2
                where = f"decode b {b} h {hq}/{hkv} sk {sk}"
                row = [str(b), f"{hq} / {hkv}", str(sk), f"{kv_bytes / 1e6:.0f}"]
                if kv_bytes > args.max_decode_gb * 1e9 or bench.elapsed() > args.budget_s:
                    why = "K+V too large" if kv_bytes > args.max_decode_gb * 1e9 else "time budget"
                    emit(out_lines, "| " + " | ".join(row + ["-"] + ["skip"] * (len(gens) + len(TORCH_PEERS))
                                                       + [f"skipped ({why})"]) + " |")
                    continue
                sets = min(8, max(1, math.ceil(3 * bench.l2 / kv_bytes)))
                row.append(str(sets))
                qs = [torch.randn(b, 1, hq, d, dtype=dt, device="cuda") for _ in range(sets)]
                ks = [torch.randn(b, sk, hkv, d, dtype=dt, device="cuda") for _ in range(sets)]
                vs = [torch.randn(b, sk, hkv, d, dtype=dt, device="cuda") for _ in range(sets)]
                res = {}
                outs = {}
                shape = dict(kind="decode", dtype="bf16", batch=b, seqlen_q=1, seqlen_k=sk, heads_q=hq,
                             heads_kv=hkv, head_dim=d, causal=False)
                rounds = decode_rounds(bench, lib, gens, qs, ks, vs, hkv != hq)
                for name, attr in TORCH_PEERS:
                    ms, red, out, note = rounds[name]
                    # "+": K/V expanded to the query heads, so the kernel read group x the bytes counted.
                    bench.record(shape, name, ms, red, note if ms is None else "", kv_bytes=kv_bytes,
                                 extra_note="K/V expanded (no GQA): reads 4x the bytes counted" if note == "+" else "")
                    if ms is None:
                        notes.setdefault(f"{name}: {note}", []).append(where)
                        res[name] = None
                    else:
                        res[name] = (ms, red, note)
                        outs[name] = out
                ref = outs.get("torch-flash", outs.get("cuDNN"))
                errs = []
                for gen in gens:
                    ms, red, out, note = rounds[gen]
                    bench.record(shape, gen, ms, red, note, kv_bytes=kv_bytes)
                    if ms is None:
                        res[gen] = None
                        notes.setdefault(f"{gen}: {note}", []).append(where)
                        errs.append("-")
                        if note.startswith("ERR"):
                            bench.failed = True
                        continue
                    res[gen] = (ms, red, "")
                    if ref is None:
                        errs.append("no ref")
                        continue
                    errs.append(check_against(torch, bench, notes, gen, where, out, ref))
                    if errs[-1].endswith("BAD"):
                        bench.records[-1]["status"] = "bad"
                for name in gens + [name for name, _ in TORCH_PEERS]:
                    r = res.get(name)
                    if r is None:
                        row.append("n/a")
                    else:
                        ms, red, mark = r
                        row.append(f"{kv_bytes / (ms * 1e-3) / 1e9:.0f} ({ms * 1e3:.1f})" + ("*" if red else "") + mark)
                row.append(" / ".join(errs))
                emit(out_lines, "| " + " | ".join(row) + " |")
                del qs, ks, vs, outs, ref
                torch.cuda.empty_cache()


def write_json(path, bench, lib, torch):
    p = bench.props
    doc = {
        "schema": "flashattn-bench-results/1",
        "tool": "compare_torch.py",
        "library_version": lib.version,
        "build_info": lib.build_info,
        "device": f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 1e9:.1f} GB, "
                  f"L2 {bench.l2 / 1e6:.0f} MB",
        "torch": f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})",
        "timing": f"median of {bench.args.reps} runs after {bench.args.warmup} warm-ups, torch.cuda.Event per run",
        "records": bench.records,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def emit(lines, text):
    print(text, flush=True)
    lines.append(text)


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def finish_report(lines, bench, markdown, failed, failure_note=""):
    """The bench scripts' last lines: the wall time (and failure_note when failed), the markdown
    copy of the report; returns the exit status."""
    emit(lines, f"Total wall time {bench.elapsed():.1f} s." + (f" {failure_note}" if failed and failure_note else ""))
    if markdown:
        with open(markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0

def add_grid_args(ap, hdim, seqlen, warmup, reps, rounds=None):
    """The FA3-paper grid's options shared by the bench scripts (heads = hidden / hdim, batch =
    tokens / seqlen) and their timing options; rounds only where the script alternates rounds."""
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--hdim", default=hdim, type=parse_list)
    ap.add_argument("--seqlen", default=seqlen, type=parse_list)
    ap.add_argument("--causal", default="both", choices=["0", "1", "both"])
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=16384)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so (default: $FLASHATTN_LIBRARY, then build*/src)")
    ap.add_argument("--gens", default="fa1,fa2,fa3", help="library generations to run (default fa1,fa2,fa3)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "both"])
    ap.add_argument("--hdim", default="64,128,256", type=parse_list)
    ap.add_argument("--seqlen", default="512,1024,2048,4096,8192,16384", type=parse_list)
    ap.add_argument("--causal", default="both", choices=["0", "1", "both"])
    ap.add_argument("--decode", action="store_true", help="only the decode table")
    ap.add_argument("--no-decode", action="store_true", help="leave the decode table out")
    ap.add_argument("--no-lse", action="store_true", help="pass lse = NULL to the library")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="wall-clock budget; later cells are skipped (default 240)")
    ap.add_argument("--max-decode-gb", type=float, default=40.0)
    ap.add_argument("--decode-splits", type=int, default=0,
                    help="decode plans with FLASHATTN_I64_NUM_SPLITS = N (default 0: the library's choice)")
    ap.add_argument("--decode-rounds", type=int, default=1,
                    help="decode: time each cell's libraries this many rounds, their order rotating per round, "
                         "and report the median (default 1)")
    ap.add_argument("--decode-batch", default="1,8,32", type=parse_list, help="decode batches (default 1,8,32)")
    ap.add_argument("--decode-kv-heads", default="8,32", type=parse_list,
                    help="decode key/value heads, of 32 query heads (default 8,32)")
    ap.add_argument("--decode-seqlen", default="8192,32768,131072", type=parse_list,
                    help="decode seqlen_k values (default 8192,32768,131072)")
    ap.add_argument("--hidden", type=int, default=2048, help="grid: heads = hidden/hdim (default 2048)")
    ap.add_argument("--tokens", type=int, default=16384, help="grid: batch = tokens/seqlen (default 16384)")
    ap.add_argument("--markdown", help="also write the tables to this markdown file")
    ap.add_argument("--json", help="also write one record per measurement to this file (schema "
                                   "flashattn-bench-results/1, bench/README.md; bench/plot.py draws it)")
    ap.add_argument("--standard", action="store_true",
                    help="also time PyTorch standard attention (matmul, fp32 softmax, matmul; the FA1 paper's "
                         "baseline) and each generation's ratio to it")
    args = ap.parse_args()
    args.causal = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    args.warmup = max(1, args.warmup)
    args.reps = max(1, args.reps)
    gens = [g for g in args.gens.split(",") if g]
    for g in gens:
        if g not in BACKEND:
            ap.error(f"--gens: unknown generation '{g}'")

    import torch  # imported here so that the ctypes layer above can be used without torch
    if not torch.cuda.is_available():
        sys.exit("compare_torch.py: torch sees no CUDA device")
    lib = Lib(find_library(args.lib))
    lib.decode_splits = args.decode_splits
    bench = Bench(torch, args)
    bench.failed = False
    lines = []
    p = bench.props
    emit(lines, "# libflashattn vs PyTorch SDPA (bench/compare_torch.py)")
    emit(lines, "")
    emit(lines, f"Device: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                f"{p.total_memory / 1e9:.1f} GB, L2 {bench.l2 / 1e6:.0f} MB. torch {torch.__version__} "
                f"(CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}).")
    emit(lines, f"libflashattn {lib.version} ({lib.build_info}) from {lib.path}.")
    emit(lines, f"Median of {args.reps} runs after {args.warmup} warm-ups (torch.cuda.Event per run); FLOPs = "
                "4*b*h*sq*sk*d, halved when causal. torch-flash = SDPA FLASH_ATTENTION, torch-efficient = SDPA "
                "EFFICIENT_ATTENTION (memory-efficient), cuDNN = SDPA "
                f"CUDNN_ATTENTION. Library LSE {'not requested' if args.no_lse else 'written (fp32)'}. "
                "Errors: library O vs torch-flash's (cuDNN's where flash cannot run); BAD = rel L2 > 2e-2 or "
                "non-finite. `*`: first run over 1 s, so median of 3 after 1 warm-up."
                + (" standard = PyTorch standard attention (S = Q K^T in the input dtype, mask, fp32 softmax, P "
                   "cast back, O = P V; S and P in device memory), the FlashAttention-1 paper's baseline."
                   if args.standard else ""))
    notes = {}
    with torch.inference_mode():
        if not args.decode:
            for dtype_name in (["bf16", "fp16"] if args.dtype == "both" else [args.dtype]):
                prefill_table(bench, lib, gens, dtype_name, lines, notes)
                torch.cuda.empty_cache()
        if args.decode or not args.no_decode:
            decode_table(bench, lib, gens, lines, notes)
    emit(lines, "")
    for reason, cells in sorted(notes.items()):
        shown = ", ".join(cells[:6]) + (", ..." if len(cells) > 6 else "")
        emit(lines, f"- {reason} [{len(cells)} cell(s): {shown}]")
    emit(lines, "")
    emit(lines, f"Total wall time {bench.elapsed():.1f} s." + (" SOME CELLS FAILED (ERR / BAD above)." if bench.failed else ""))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.json:
        write_json(args.json, bench, lib, torch)
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
