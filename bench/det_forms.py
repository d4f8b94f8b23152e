#!/usr/bin/env python3
"""The FA3 backward's deterministic mode against its default mode, one library, every form of the
deterministic mode that the library has (FLASHATTN_FA3_BWD_DET_FORM, read at finalize, exists only
in experiment trees: the forms of commit 53947b8's patch, the schedule bits of commit 16228e5; in
libraries without the knob every form runs the library's one deterministic kernel, so `--forms 0`
times the deterministic mode against the default) in one
process, rounds alternated (even rounds in the listed order, odd rounds reversed) so that clock
drift at the power limit falls on all alike.

  python3 bench/det_forms.py --lib build/src/libflashattn.so --forms 0 --markdown det.md

Grid as backward_torch.py's (heads = hidden/hdim, batch = tokens/seqlen, bf16). Per cell: the
backward's TFLOP/s (2.5 x the forward's FLOPs) of the default mode and of each form (median over
the rounds of each round's median), each form's det/default ratio, and the checks: each form's
rerun is bitwise identical to its first run, and its gradients are within 1e-2 relative L2 of the
default mode's (BAD otherwise; the exit status is then 1).
"""
import argparse
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_torch as bt  # noqa: E402
import compare_torch as ct  # noqa: E402

KNOB = "FLASHATTN_FA3_BWD_DET_FORM"


class Config:
    """One plan (default mode, or deterministic with a form) and its buffers."""

    def __init__(self, torch, lib, q, k, v, do, causal, dtype, form):
        b, s, h, d = q.shape
        if form is None:
            os.environ.pop(KNOB, None)
        else:
            os.environ[KNOB] = str(form)
        self.handle, self.ws_f, self.ws_b = bt.lib_plan(lib, "fa3", b, s, h, d, dtype, causal, form is not None)
        os.environ.pop(KNOB, None)
        self.lib, self.torch = lib, torch
        self.q, self.k, self.v, self.do = q, k, v, do
        self.o = torch.empty_like(q)
        self.lse = torch.empty((b, h, s), dtype=torch.float32, device="cuda")
        self.grads = tuple(torch.empty_like(x) for x in (q, k, v))
        self.wf = torch.empty(max(self.ws_f, 1), dtype=torch.uint8, device="cuda")
        self.wb = torch.empty(max(self.ws_b, 1), dtype=torch.uint8, device="cuda")
        self.stream = torch.cuda.current_stream().cuda_stream
        lib.execute(self.handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), self.o.data_ptr(), self.lse.data_ptr(),
                    self.wf.data_ptr() if self.ws_f else None, self.ws_f, self.stream)

    def bwd(self):
        dq, dk, dv = self.grads
        st = self.lib.lib.flashattn_plan_execute_backward(
            self.handle, self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.o.data_ptr(),
            self.do.data_ptr(), self.lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            self.wb.data_ptr() if self.ws_b else None, self.ws_b, self.stream)
        if st != ct.SUCCESS:
            raise self.lib._error(st)

    def snapshot(self):
        for g in self.grads:
            g.fill_(float("nan"))
        self.bwd()
        self.torch.cuda.synchronize()
        return tuple(g.clone() for g in self.grads)

    def close(self):
        self.lib.destroy(self.handle)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so (default: $FLASHATTN_LIBRARY)")
    ap.add_argument("--forms", default="0", type=ct.parse_list, help="deterministic forms to time")
    ap.add_argument("--forms64", type=ct.parse_list, help="forms at head dim 64 (default: --forms)")
    ct.add_grid_args(ap, hdim="64,128", seqlen="2048,4096", warmup=2, reps=10, rounds=3)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    args.no_lse = False
    import torch
    lib = ct.Lib(ct.find_library(args.lib))
    bt.bind_backward(lib)
    bench = ct.Bench(torch, args)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    lines, failed = [], False
    p = bench.props
    ct.emit(lines, f"# FA3 backward: deterministic forms vs the default mode ({p.name}, {p.multi_processor_count} SMs; "
                   f"libflashattn {lib.version} {lib.build_info})")
    ct.emit(lines, "")
    ct.emit(lines, f"{args.dtype}, hidden {args.hidden}, {args.tokens} tokens per batch. Backward TFLOP/s (2.5 x fwd "
                   f"FLOPs), median over {args.rounds} alternated rounds of the median of {args.reps} event-timed runs; "
                   "ratio = det / default of the same cell; spread = (max - min) / median over the rounds.")
    ct.emit(lines, "")
    ct.emit(lines, "| hdim | causal | seqlen | mode | TFLOP/s | det/default | spread | check |")
    ct.emit(lines, "|---|---|---|---|---|---|---|---|")
    for d in args.hdim:
        forms = args.forms64 if (d <= 64 and args.forms64) else args.forms
        for causal in causals:
            for s in args.seqlen:
                h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                q, k, v, do = (torch.randn(b, s, h, d, dtype=dt, device="cuda") for _ in range(4))
                names = ["default"] + [f"det form {f}" for f in forms]
                cfgs = {"default": Config(torch, lib, q, k, v, do, bool(causal), args.dtype, None)}
                for f in forms:
                    cfgs[f"det form {f}"] = Config(torch, lib, q, k, v, do, bool(causal), args.dtype, f)
                tf = {n: [] for n in names}
                for r in range(args.rounds):
                    for n in (names if r % 2 == 0 else names[::-1]):
                        ms, _ = bench.time_ms(lambda i, c=cfgs[n]: c.bwd())
                        tf[n].append(flops / (ms * 1e-3) / 1e12)
                ref = cfgs["default"].snapshot()
                base = statistics.median(tf["default"])
                for n in names:
                    med = statistics.median(tf[n])
                    check = ""
                    if n != "default":
                        first = cfgs[n].snapshot()
                        again = cfgs[n].snapshot()
                        same = all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(first, again))
                        err = max(bt.rel_err(torch, x, y) for x, y in zip(first, ref))
                        ok = same and err < 1e-2
                        failed = failed or not ok
                        check = f"rerun {'bitwise' if same else 'DIFFERS'}, rel err {err:.1e}" + ("" if ok else " BAD")
                    spread = (max(tf[n]) - min(tf[n])) / med
                    ct.emit(lines, f"| {d} | {'yes' if causal else 'no'} | {s} | {n} | {med:.1f} | "
                                   f"{med / base:.3f} | {spread:.1%} | {check} |")
                for c in cfgs.values():
                    c.close()
                del q, k, v, do, cfgs, ref
                torch.cuda.empty_cache()
    ct.emit(lines, "")
    return ct.finish_report(lines, bench, args.markdown, failed, "SOME CHECKS FAILED.")


if __name__ == "__main__":
    sys.exit(main())
