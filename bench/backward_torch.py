#!/usr/bin/env python3
"""The backward pass against PyTorch's SDPA backends, in one process: libflashattn's backward
(default and deterministic mode) beside the FLASH_ATTENTION and CUDNN_ATTENTION backwards, and the
forward + backward of each. FLOPs as FlashAttention counts them: forward 4*b*h*s*s*d (halved when
causal), backward 2.5x that. Grid as compare_torch.py's (heads = hidden/hdim, batch = tokens/seqlen).

  FLASHATTN_LIBRARY=build/src/libflashattn.so python3 bench/backward_torch.py --markdown bwd.md

Each library cell is checked: dQ, dK, dV against torch-flash's gradients (cuDNN's where flash cannot
run); BAD = relative L2 error above 2e-2 or non-finite. The peers are timed through autograd
(torch.autograd.grad on a retained graph), so their time includes autograd's bookkeeping (a few us).
"""
import argparse
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch as ct  # noqa: E402

I64_DETERMINISTIC = 32


def bind_backward(lib):
    vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    c = lib.lib
    c.flashattn_plan_get_backward_workspace_size.argtypes = [vp, ctypes.POINTER(sz)]
    c.flashattn_plan_get_backward_workspace_size.restype = i32
    c.flashattn_plan_get_backward_backend.argtypes = [vp, ctypes.POINTER(i32), ctypes.POINTER(ctypes.c_char_p)]
    c.flashattn_plan_get_backward_backend.restype = i32
    c.flashattn_plan_execute_backward.argtypes = [vp] * 10 + [vp, sz, vp]
    c.flashattn_plan_execute_backward.restype = i32


def lib_plan(lib, gen, b, s, h, d, dtype, causal, deterministic):
    """(handle, fwd ws bytes, bwd ws bytes) with the backward backend checked to be `gen`."""
    handle, ws = lib.plan(ct.BACKEND[gen], b, s, s, h, h, d, ct.DTYPE[dtype], causal)
    c = lib.lib
    try:
        if deterministic:
            for st in (c.flashattn_plan_set_i64(handle, I64_DETERMINISTIC, 1), c.flashattn_plan_finalize(handle)):
                if st != ct.SUCCESS:
                    raise lib._error(st)
            w = ctypes.c_size_t()
            st = c.flashattn_plan_get_workspace_size(handle, ctypes.byref(w))
            if st != ct.SUCCESS:
                raise lib._error(st)
            ws = w.value
        bw = ctypes.c_size_t()
        st = c.flashattn_plan_get_backward_workspace_size(handle, ctypes.byref(bw))
        if st != ct.SUCCESS:
            raise lib._error(st)
        return handle, ws, bw.value
    except BaseException:
        lib.destroy(handle)
        raise


def rel_err(torch, a, ref):
    a, ref = a.float(), ref.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run_lib(bench, lib, gen, q, k, v, do, causal, dtype, deterministic):
    """(bwd ms, fwd+bwd ms, (dq, dk, dv)) or (None, None, reason)."""
    torch = bench.torch
    b, s, h, d = q.shape
    try:
        handle, ws_f, ws_b = lib_plan(lib, gen, b, s, h, d, dtype, causal, deterministic)
    except ct.FlashAttnError as e:
        return None, None, ("n/a: " if e.status == ct.NOT_SUPPORTED else "ERR: ") + str(e)
    c = lib.lib
    try:
        o = torch.empty_like(q)
        lse = torch.empty((b, h, s), dtype=torch.float32, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        wf = torch.empty(max(ws_f, 1), dtype=torch.uint8, device="cuda")
        wb = torch.empty(max(ws_b, 1), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream

        def fwd():
            lib.execute(handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                        wf.data_ptr() if ws_f else None, ws_f, stream)

        def bwd():
            st = c.flashattn_plan_execute_backward(handle, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                   do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                                   dv.data_ptr(), wb.data_ptr() if ws_b else None, ws_b, stream)
            if st != ct.SUCCESS:
                raise lib._error(st)

        fwd()
        ms_b, _ = bench.time_ms(lambda i: bwd())
        ms_fb, _ = bench.time_ms(lambda i: (fwd(), bwd()))
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
        fwd()
        bwd()
        torch.cuda.synchronize()
        return ms_b, ms_fb, (dq, dk, dv)
    except ct.FlashAttnError as e:
        return None, None, "ERR: execute: " + str(e)
    finally:
        lib.destroy(handle)


def run_peer(bench, backend, q, k, v, do, causal):
    """(bwd ms, fwd+bwd ms, (dq, dk, dv)) or (None, None, reason)."""
    torch = bench.torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    try:
        with sdpa_kernel([backend]):
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            dot = do.transpose(1, 2)

            def fwd():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            out = fwd()
            ms_b, _ = bench.time_ms(lambda i: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True))
            ms_fb, _ = bench.time_ms(lambda i: torch.autograd.grad(fwd(), (qt, kt, vt), dot))
            grads = torch.autograd.grad(fwd(), (qt, kt, vt), dot)
            return ms_b, ms_fb, tuple(g.transpose(1, 2) for g in grads)
    except Exception as e:
        msg = str(e).strip().splitlines()
        return None, None, (msg[0] if msg else type(e).__name__)[:120]


def timed_rounds(runners, rounds):
    """{column: (bwd ms, fwd+bwd ms, grads or reason)} for runners [(column, fn)] over rotated
    rounds (compare_torch.rotated_rounds): the times the medians over the rounds, the gradients
    (or the failure) those of the first round."""
    first, done = ct.rotated_rounds(runners, rounds)
    def med(c, i):
        return statistics.median(r[i] for r in done[c])
    return {c: (med(c, 0), med(c, 1), first[c][2]) if done[c] else first[c] for c, _ in runners}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libflashattn.so (default: $FLASHATTN_LIBRARY)")
    ap.add_argument("--gens", default="fa2")
    ct.add_grid_args(ap, hdim="64,128,256", seqlen="1024,2048,4096,8192,16384", warmup=2, reps=5, rounds=1)
    ap.add_argument("--markdown")
    args = ap.parse_args()
    args.no_lse = False
    import torch
    from torch.nn.attention import SDPBackend
    lib = ct.Lib(ct.find_library(args.lib))
    bind_backward(lib)
    bench = ct.Bench(torch, args)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    gens = [g for g in args.gens.split(",") if g]
    cols = [f"{g}{' det' if det else ''}" for g in gens for det in (False, True)] + ["torch-flash", "cuDNN"]
    lines = []
    p = bench.props
    ct.emit(lines, f"# Backward pass vs PyTorch SDPA ({p.name}, {p.multi_processor_count} SMs; torch {torch.__version__}, "
                   f"cuDNN {torch.backends.cudnn.version()}; libflashattn {lib.version} {lib.build_info})")
    ct.emit(lines, "")
    ct.emit(lines, f"{args.dtype}, hidden {args.hidden}, {args.tokens} tokens per batch. TFLOP/s; bwd = 2.5 x fwd FLOPs, "
                   f"fwd+bwd = 3.5 x. Median of the event-timed runs over {args.rounds} round(s), the columns' "
                   "order rotating per round. det = FLASHATTN_I64_DETERMINISTIC = 1.")
    ct.emit(lines, "")
    head = ["hdim", "causal", "seqlen"] + [f"{c} bwd" for c in cols] + [f"{c} f+b" for c in cols] + ["max rel err (dq/dk/dv)"]
    ct.emit(lines, "| " + " | ".join(head) + " |")
    ct.emit(lines, "|" + "---|" * len(head))
    failed = False
    causals = {"0": [0], "1": [1], "both": [0, 1]}[args.causal]
    for d in args.hdim:
        for causal in causals:
            for s in args.seqlen:
                h, b = max(1, args.hidden // d), max(1, args.tokens // s)
                fwd_flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                q, k, v, do = (torch.randn(b, s, h, d, dtype=dt, device="cuda") for _ in range(4))
                runners = [(f"{g}{' det' if det else ''}",
                            lambda g=g, det=det: run_lib(bench, lib, g, q, k, v, do, bool(causal), args.dtype, det))
                           for g in gens for det in (False, True)]
                runners += [(name, lambda be=be: run_peer(bench, be, q, k, v, do, bool(causal)))
                            for name, be in (("torch-flash", SDPBackend.FLASH_ATTENTION),
                                             ("cuDNN", SDPBackend.CUDNN_ATTENTION))]
                res = timed_rounds(runners, args.rounds)
                ref = res["torch-flash"][2] if res["torch-flash"][0] else res["cuDNN"][2] if res["cuDNN"][0] else None
                row = [str(d), "yes" if causal else "no", str(s)]
                row += [f"{2.5 * fwd_flops / (res[c][0] * 1e-3) / 1e12:.1f}" if res[c][0] else "n/a" for c in cols]
                row += [f"{3.5 * fwd_flops / (res[c][1] * 1e-3) / 1e12:.1f}" if res[c][0] else "n/a" for c in cols]
                errs = []
                for c in cols[:-2]:
                    if res[c][0] is None:
                        errs.append(res[c][2][:40])
                        failed = failed or res[c][2].startswith("ERR")
                    elif ref is None:
                        errs.append("no ref")
                    else:
                        e = max(rel_err(torch, a, r) for a, r in zip(res[c][2], ref))
                        errs.append(f"{e:.1e}" + (" BAD" if not e < 2e-2 else ""))
                        failed = failed or not e < 2e-2
                row.append(" / ".join(errs))
                ct.emit(lines, "| " + " | ".join(row) + " |")
                del q, k, v, do, res, ref
                torch.cuda.empty_cache()
    ct.emit(lines, "")
    return ct.finish_report(lines, bench, args.markdown, failed, "SOME CELLS FAILED.")


if __name__ == "__main__":
    sys.exit(main())
