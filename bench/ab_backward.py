#!/usr/bin/env python3
"""A/B of the FA2 (or FA3) backward of two libflashattn builds in one process, cell by cell, with
PyTorch's flash backward beside them: each library loaded from its own path (ctypes), the same
inputs for all, rounds alternating which one goes first (clock drift at the power limit falls on
all alike). Optional extra columns run library B again with FLASHATTN_FA2_BWD_TILE set to each value
of --tile-forms (the plan reads it at finalize: an experiment tree's developer knob); --m adds a
third library (an intermediate tree) as column M.

  python3 bench/ab_backward.py --a /tmp/old/src/libflashattn.so --b build/src/libflashattn.so \
      --hdim 64,128,256 --seqlen 2048,8192 --rounds 3 --markdown out.md

Grid as backward_torch.py's (heads = hidden / hdim, batch = tokens / seqlen, bf16); TFLOP/s =
2.5 x the forward's 4*b*h*s*s*d (halved when causal) per backward. Every library cell's dQ, dK, dV
are checked against torch-flash's (relative L2 error; BAD above 2e-2 or non-finite).
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_torch as bt  # noqa: E402
import compare_torch as ct  # noqa: E402


def lib_backward(bench, lib, gen, q, k, v, do, causal, dtype, deterministic, tile_form):
    """(bwd ms, (dq, dk, dv)) or (None, reason). tile_form: FLASHATTN_FA2_BWD_TILE while planning,
    or VAR=value: that environment variable while planning (a knob the plan reads at finalize)."""
    torch = bench.torch
    b, s, h, d = q.shape
    var, value = tile_form.split("=", 1) if "=" in tile_form else ("FLASHATTN_FA2_BWD_TILE", tile_form)
    old = os.environ.pop(var, None)
    if tile_form:
        os.environ[var] = value
    try:
        handle, ws_f, ws_b = bt.lib_plan(lib, gen, b, s, h, d, dtype, causal, deterministic)
    except ct.FlashAttnError as e:
        return None, ("n/a: " if e.status == ct.NOT_SUPPORTED else "ERR: ") + str(e)
    finally:
        os.environ.pop(var, None)
        if old is not None:
            os.environ[var] = old
    c = lib.lib
    try:
        o = torch.empty_like(q)
        lse = torch.empty((b, h, s), dtype=torch.float32, device="cuda")
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        wf = torch.empty(max(ws_f, 1), dtype=torch.uint8, device="cuda")
        wb = torch.empty(max(ws_b, 1), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        lib.execute(handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                    wf.data_ptr() if ws_f else None, ws_f, stream)

        def bwd():
            st = c.flashattn_plan_execute_backward(handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                   do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                                   dv.data_ptr(), wb.data_ptr() if ws_b else None, ws_b, stream)
            if st != ct.SUCCESS:
                raise lib._error(st)

        ms, _ = bench.time_ms(lambda i: bwd())
        torch.cuda.synchronize()
        return ms, (dq, dk, dv)
    except ct.FlashAttnError as e:
        return None, "ERR: execute: " + str(e)
    finally:
        lib.destroy(handle)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="library A (the reference, e.g. main's build)")
    ap.add_argument("--b", required=True, help="library B (the candidate)")
    ap.add_argument("--m", help="optional library M (an intermediate tree): a column between A and B")
    ap.add_argument("--gen", default="fa2")
    ap.add_argument("--deterministic", action="store_true", help="also time both libraries' deterministic mode")
    ap.add_argument("--tile-forms", default="", help="comma list of FLASHATTN_FA2_BWD_TILE values, or of VAR=value "
                    "settings of a knob the plan reads at finalize: extra B columns; det:VAR=value: an extra "
                    "column of B's deterministic mode")
    ct.add_grid_args(ap, hdim="64,128,256", seqlen="2048,8192", warmup=2, reps=5, rounds=3)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    import torch
    from torch.nn.attention import SDPBackend
    if not torch.cuda.is_available():
        sys.exit("ab_backward.py: torch sees no CUDA device")
    libs = {"A": ct.Lib(args.a), "B": ct.Lib(args.b)}
    if args.m:
        libs["M"] = ct.Lib(args.m)
    for lib in libs.values():
        bt.bind_backward(lib)
    bench = ct.Bench(torch, args)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    # column name -> (library, deterministic, tile form)
    cols = {"A": ("A", False, "")}
    if args.m:
        cols["M"] = ("M", False, "")
    cols["B"] = ("B", False, "")
    forms = [f for f in args.tile_forms.split(",") if f]
    for f in [f for f in forms if not f.startswith("det:")]:
        cols[f"B {f}"] = ("B", False, f)
    if args.deterministic:
        cols["A det"] = ("A", True, "")
        cols["B det"] = ("B", True, "")
    for f in [f[len("det:"):] for f in forms if f.startswith("det:")]:
        cols[f"B det {f}"] = ("B", True, f)
    lines = []
    p = bench.props
    ct.emit(lines, f"# A/B of the {args.gen} backward ({p.name}, {p.multi_processor_count} SMs, {args.dtype}, "
                   f"hidden {args.hidden}, {args.tokens} tokens)")
    ct.emit(lines, f"A = {args.a} ({libs['A'].build_info}); B = {args.b} ({libs['B'].build_info})" +
            (f"; M = {args.m} ({libs['M'].build_info})." if args.m else "."))
    ct.emit(lines, f"Backward TFLOP/s, median over {args.rounds} rounds (each the median of {args.reps} event-timed "
                   "runs), the column order rotating per round; tf = torch-flash (timed through autograd); "
                   "err = max rel L2 error of dq/dk/dv against torch-flash over every library column.")
    ct.emit(lines, "")
    names = list(cols)
    head = ["hdim", "causal", "seqlen"] + names + ["tf"] + [f"{n}/A" for n in names[1:]] + [f"{n}/tf" for n in names] + ["err"]
    ct.emit(lines, "| " + " | ".join(head) + " |")
    ct.emit(lines, "|" + "---|" * len(head))
    ratios = {n: [] for n in names[1:]}
    failed = False
    for d in args.hdim:
        for causal in causals:
            for s in args.seqlen:
                h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                q, k, v, do = (torch.randn(b, s, h, d, dtype=dt, device="cuda") for _ in range(4))
                tf = {n: [] for n in names + ["tf"]}
                notes, grads = {}, {}
                ref = None
                order = names + ["tf"]
                for r in range(args.rounds):
                    rot = order[r % len(order):] + order[:r % len(order)]
                    for n in rot:
                        if n == "tf":
                            ms, _, g = bt.run_peer(bench, SDPBackend.FLASH_ATTENTION, q, k, v, do, bool(causal))
                            if ms is not None:
                                tf[n].append(flops / (ms * 1e-3) / 1e12)
                                ref = g
                            continue
                        lib, det, form = cols[n]
                        ms, g = lib_backward(bench, libs[lib], args.gen, q, k, v, do, bool(causal), args.dtype, det, form)
                        if ms is None:
                            notes[n] = g
                            continue
                        tf[n].append(flops / (ms * 1e-3) / 1e12)
                        grads[n] = g
                med = {n: statistics.median(x) if x else None for n, x in tf.items()}
                row = [str(d), "yes" if causal else "no", str(s)]
                row += [f"{med[n]:.1f}" if med[n] else notes.get(n, "-")[:40] for n in names + ["tf"]]
                for n in names[1:]:
                    if med[n] and med["A"]:
                        ratios[n].append(med[n] / med["A"])
                        row.append(f"{med[n] / med['A']:.3f}")
                    else:
                        row.append("-")
                row += [f"{med[n] / med['tf']:.2f}" if med[n] and med["tf"] else "-" for n in names]
                errs = []
                for n in names:
                    if n in notes and notes[n].startswith("ERR"):
                        failed = True
                    if n in grads and ref is not None:
                        errs.append(max(bt.rel_err(torch, a, rr) for a, rr in zip(grads[n], ref)))
                worst = max(errs) if errs else float("nan")
                if errs and not worst < 2e-2:
                    failed = True
                row.append(f"{worst:.1e}" + (" BAD" if errs and not worst < 2e-2 else ""))
                ct.emit(lines, "| " + " | ".join(row) + " |")
                del q, k, v, do, grads, ref
                torch.cuda.empty_cache()
    ct.emit(lines, "")
    for n, rs in ratios.items():
        if rs:
            geo = math.exp(sum(math.log(x) for x in rs) / len(rs))
            ct.emit(lines, f"- {n}/A: lowest {min(rs):.3f}, highest {max(rs):.3f}, geometric mean {geo:.3f} over {len(rs)} cells")
    return ct.finish_report(lines, bench, args.markdown, failed, "SOME CELLS FAILED.")


if __name__ == "__main__":
    sys.exit(main())
