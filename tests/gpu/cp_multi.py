"""libflashattn_cp over NCCL, one process per GPU (run by tests/gpu/cp-multi.sh under torchrun).

The communicator is our own: rank 0 calls ncclGetUniqueId, torch.distributed broadcasts the id,
every rank calls ncclCommInitRank (ctypes, on the libnccl.so.2 that libflashattn_cp links). Then:

  check  every rank shards the same seeded global Q/K/V by flashattn.cp.shard_rows (zigzag when
         causal), runs the ring, the O and LSE shards are gathered, and rank 0 compares every
         element with one single-GPU call (flashattn.Plan) on the global inputs; causal and not,
         GQA, odd chunks. Then the ring backward on a seeded dO (dK / dV travelling with their
         blocks), its dQ / dK / dV shards gathered and compared with the single-GPU backward.
         Exit status 1 on any mismatch.
  bench  the issue's bar: bf16, head dim 128, 32 heads, TOTAL tokens (default 262144) split over
         the ranks, causal zigzag and non-causal: the ring's time (median of CUDA-event timings,
         all ranks started together), against (a) WORLD x the single-GPU FA3 throughput on the
         whole sequence on one GPU and (b) PyTorch's context_parallel ring with its SDPA backends
         (flash, efficient) on the same inputs. Rank 0 prints a markdown table and writes JSON.

Environment: NCCL_NVLS_ENABLE=0 must be set (the device docs require it; cp-multi.sh sets it).
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import flashattn
from flashattn import cp


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def nccl_library():
    """The libnccl.so.2 already in this process (libflashattn_cp's, or torch's: one soname, one copy)."""
    cp.library_path()  # loads libflashattn_cp and, through it, libnccl.so.2
    lib = ctypes.CDLL("libnccl.so.2")
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId, ctypes.c_int]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


def nccl_comm(lib, rank, world):
    uid = NcclUniqueId()
    if rank == 0:
        r = lib.ncclGetUniqueId(ctypes.byref(uid))
        assert r == 0, lib.ncclGetErrorString(r)
    box = [bytes(uid.internal) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ctypes.memmove(ctypes.addressof(uid), box[0], 128)
    comm = ctypes.c_void_p()
    r = lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank)
    assert r == 0, lib.ncclGetErrorString(r)
    return comm


def local_plan(rows, heads_q, heads_kv, dim, causal, dtype="bf16", batch=1):
    return flashattn.Plan(batch=batch, seqlen_q=rows, seqlen_k=rows, heads_q=heads_q, heads_kv=heads_kv,
                          head_dim=dim, dtype=dtype, causal=causal, device=torch.cuda.current_device()).finalize()


class Ring:
    """One rank's ring: the plan, its workspace, and execute on torch tensors."""

    def __init__(self, comm, rank, world, rows, heads_q, heads_kv, dim, causal, batch=1):
        self.local = local_plan(rows, heads_q, heads_kv, dim, causal, batch=batch)
        self.plan = cp.CpPlan(self.local, world_size=world, transport="nccl", rank=rank, nccl_comm=comm.value)
        self.ws = torch.empty(max(self.plan.workspace_size, 1), dtype=torch.uint8, device="cuda")

    def __call__(self, q, k, v, o, lse):
        self.plan.execute([q], [k], [v], [o], [lse], workspace=self.ws,
                          stream=torch.cuda.current_stream().cuda_stream)

    def backward(self, q, k, v, o, dout, lse, dq, dk, dv):
        ws = torch.empty(max(self.plan.backward_workspace_size, 1), dtype=torch.uint8, device="cuda")
        self.plan.execute_backward([q], [k], [v], [o], [dout], [lse], [dq], [dk], [dv], workspace=ws,
                                   stream=torch.cuda.current_stream().cuda_stream)


def gathered_error(shards, whole, world, L, causal, row_dim):
    """Largest |shard - whole[rows of the shard]| over the gathered shards (inf where NaN)."""
    worst = 0.0
    for r in range(world):
        ridx = torch.tensor(cp.shard_rows(world, r, L, causal), device="cuda")
        diff = (shards[r].float() - whole.index_select(row_dim, ridx).float()).abs()
        worst = max(worst, float("inf") if diff.isnan().any() else float(diff.max()))
    return worst


def check_backward(ring, rank, world, case, q, k, v, ql, kl, vl, o, lse):
    """The ring backward on this rank's shards against rank 0's single-GPU backward; returns
    whether it failed (on rank 0; 0 elsewhere)."""
    batch, L, hq, hkv, d, causal = case
    S = world * L
    g = torch.Generator().manual_seed(4321 + L)
    dout = (torch.rand(batch, S, hq, d, generator=g) - 0.5).to(torch.bfloat16)
    rows = torch.tensor(cp.shard_rows(world, rank, L, causal))
    dol = dout[:, rows].contiguous().cuda()
    grads = [torch.full_like(x, float("nan")) for x in (ql, kl, vl)]
    ring.backward(ql, kl, vl, o, dol, lse, *grads)
    torch.cuda.synchronize()
    gathered = []
    for x in grads:
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        gathered.append(parts)
    if rank != 0:
        return 0
    one = local_plan(S, hq, hkv, d, causal, batch=batch)
    qg, kg, vg, dog = q.cuda(), k.cuda(), v.cuda(), dout.cuda()
    og = torch.empty(batch, S, hq, d, dtype=torch.bfloat16, device="cuda")
    lg = torch.empty(batch, hq, S, dtype=torch.float32, device="cuda")
    one.execute(qg, kg, vg, og, lg, workspace=torch.empty(max(one.workspace_size, 1), dtype=torch.uint8,
                                                           device="cuda"))
    want = [torch.full_like(x, float("nan")) for x in (qg, kg, vg)]
    one.backward(qg, kg, vg, og, dog, lg, *want,
                 workspace=torch.empty(max(one.backward_workspace_size, 1), dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    failed = 0
    for name, parts, whole in zip(("dQ", "dK", "dV"), gathered, want):
        scale = max(1.0, float(whole.float().abs().max()))
        err = gathered_error(parts, whole, world, L, causal, 1) / scale
        ok = err <= 3e-2
        failed |= not ok
        print("check backward W=%d b=%d L=%d hq=%d hkv=%d d=%d causal=%d: %s max err %.2e (relative)  %s"
              % (world, batch, L, hq, hkv, d, causal, name, err, "ok" if ok else "FAIL"), flush=True)
    return failed


def check(comm, rank, world, args):
    failures = 0
    cases = [  # (batch, L, heads_q, heads_kv, dim, causal)
        (1, 1024, 8, 2, 128, False),
        (1, 1024, 8, 2, 128, True),
        (2, 2 * 197, 4, 4, 64, True),   # odd chunks: tile edges inside a chunk
        (1, 301, 6, 1, 128, False),     # multi-query, odd L
    ]
    for batch, L, hq, hkv, d, causal in cases:
        S = world * L
        g = torch.Generator().manual_seed(1234 + L)
        q = (2 * torch.rand(batch, S, hq, d, generator=g) - 1).to(torch.bfloat16)
        k = (2 * torch.rand(batch, S, hkv, d, generator=g) - 1).to(torch.bfloat16)
        v = (torch.rand(batch, S, hkv, d, generator=g) - 0.5).to(torch.bfloat16)
        rows = cp.shard_rows(world, rank, L, causal)
        idx = torch.tensor(rows)
        ql, kl, vl = (x[:, idx].contiguous().cuda() for x in (q, k, v))
        o = torch.full((batch, L, hq, d), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((batch, hq, L), float("nan"), dtype=torch.float32, device="cuda")
        ring = Ring(comm, rank, world, L, hq, hkv, d, causal, batch=batch)
        ring(ql, kl, vl, o, lse)
        torch.cuda.synchronize()
        os_ = [torch.empty_like(o) for _ in range(world)]
        ls = [torch.empty_like(lse) for _ in range(world)]
        dist.all_gather(os_, o)
        dist.all_gather(ls, lse)
        if rank == 0:
            one = local_plan(S, hq, hkv, d, causal, batch=batch)
            qg, kg, vg = q.cuda(), k.cuda(), v.cuda()
            og = torch.full((batch, S, hq, d), float("nan"), dtype=torch.bfloat16, device="cuda")
            lg = torch.full((batch, hq, S), float("nan"), dtype=torch.float32, device="cuda")
            ws = torch.empty(max(one.workspace_size, 1), dtype=torch.uint8, device="cuda")
            one.execute(qg, kg, vg, og, lg, workspace=ws)
            torch.cuda.synchronize()
            worst_o = gathered_error(os_, og, world, L, causal, 1)
            worst_l = gathered_error(ls, lg, world, L, causal, 2)
            ok = worst_o <= 2e-2 and worst_l <= 1e-3
            failures += not ok
            print("check W=%d b=%d L=%d hq=%d hkv=%d d=%d causal=%d: O max err %.2e, LSE max err %.2e  %s"
                  % (world, batch, L, hq, hkv, d, causal, worst_o, worst_l, "ok" if ok else "FAIL"), flush=True)
        case = (batch, L, hq, hkv, d, causal)
        failures += check_backward(ring, rank, world, case, q, k, v, ql, kl, vl, o, lse)
    box = [failures]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def attention_flops(S, heads, dim, causal):
    f = 4.0 * S * S * heads * dim  # QK^T and PV, 2 flops per multiply-add
    return f / 2 if causal else f


def time_cuda(fn, warmup, iters, collective=True):
    """Median milliseconds of fn() over iters runs (CUDA events). collective: every rank runs this
    together (a barrier before each run, the slowest rank's median); False on one rank alone."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if collective:
            dist.barrier()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    t = torch.tensor([statistics.median(times)], device="cuda")
    if collective:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the ring is as slow as its slowest rank
    return float(t)


def bench_single(S, heads, dim, causal, warmup, iters):
    """One GPU, the whole sequence, FA3 forced: the per-GPU baseline."""
    plan = flashattn.Plan(batch=1, seqlen_q=S, seqlen_k=S, heads_q=heads, head_dim=dim, dtype="bf16", causal=causal,
                          backend="fa3").finalize()
    q, k, v = (torch.randn(1, S, heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    o = torch.empty_like(q)
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    s = torch.cuda.current_stream().cuda_stream
    ms = time_cuda(lambda: plan.execute(q, k, v, o, workspace=ws, stream=s), warmup, iters, collective=False)
    del q, k, v, o, ws
    return ms


def bench_torch_cp(rank, world, S, heads, dim, causal, warmup, iters, backend):
    """PyTorch's context_parallel (ring over its SDPA backend) on [1, heads, S, dim] buffers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:  # the rotation method and the load balancer are experimental knobs (names vary by version)
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        set_rotate_method("alltoall")
    except Exception:
        pass
    mesh = init_device_mesh("cuda", (world,))
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(1, heads, S, dim, dtype=torch.bfloat16, device="cuda", generator=g) for _ in range(3))
    sdpa = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]), sdpa_kernel(sdpa):
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        ms = time_cuda(fn, warmup, iters)
    return ms


def bench(comm, rank, world, args):
    S, heads, dim = args.total_tokens, args.heads, args.head_dim
    L = S // world
    rows = []
    single = {}
    for causal in (True, False):
        if rank == 0:  # one GPU, whole sequence, timed on rank 0 alone (the others wait in the broadcast)
            single[causal] = bench_single(S, heads, dim, causal, args.warmup, args.iters) if not args.skip_single \
                else float("nan")
        box = [single.get(causal)]
        dist.broadcast_object_list(box, src=0)
        single[causal] = box[0]
        ring = Ring(comm, rank, world, L, heads, heads, dim, causal)
        q, k, v = (torch.randn(1, L, heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(1, heads, L, dtype=torch.float32, device="cuda")
        ring_ms = time_cuda(lambda: ring(q, k, v, o, lse), args.warmup, args.iters)
        del ring, q, k, v, o, lse
        torch.cuda.empty_cache()
        torch_ms = {}
        for backend in ("flash", "efficient"):
            try:
                torch_ms[backend] = bench_torch_cp(rank, world, S, heads, dim, causal, args.warmup, args.iters, backend)
            except Exception as e:  # report, do not hide: the row says why
                torch_ms[backend] = "failed: %s" % str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            torch.cuda.empty_cache()
        flops = attention_flops(S, heads, dim, causal)
        row = {
            "world": world, "total_tokens": S, "tokens_per_gpu": L, "heads": heads, "head_dim": dim,
            "causal": causal, "layout": "zigzag" if causal else "contiguous", "dtype": "bf16",
            "ring_ms": ring_ms, "ring_tflops": flops / ring_ms / 1e9,
            "single_gpu_fa3_ms": single[causal], "single_gpu_fa3_tflops": flops / single[causal] / 1e9,
            "efficiency_vs_world_x_single": (single[causal] / ring_ms) / world,
            "torch_cp_ms": torch_ms,
        }
        rows.append(row)
    if rank == 0:
        print("\n| W | tokens (per GPU) | mask | ring ms | ring TFLOP/s | 1-GPU FA3 ms | efficiency vs W x 1 GPU "
              "| torch CP flash ms | torch CP efficient ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            t = r["torch_cp_ms"]
            fmt = lambda x: "%.1f" % x if isinstance(x, float) else str(x)  # noqa: E731
            print("| %d | %d (%d) | %s | %.1f | %.0f | %.1f | %.1f%% | %s | %s |"
                  % (r["world"], r["total_tokens"], r["tokens_per_gpu"], "causal zigzag" if r["causal"] else
                     "non-causal", r["ring_ms"], r["ring_tflops"], r["single_gpu_fa3_ms"],
                     100 * r["efficiency_vs_world_x_single"], fmt(t["flash"]), fmt(t["efficient"])))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="*", default=["check", "bench"])
    parser.add_argument("--total-tokens", type=int, default=262144)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        sys.exit("cp_multi.py: set NCCL_NVLS_ENABLE=0 (the device docs require it; cp-multi.sh does)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    print("rank %d: process group up" % rank, flush=True)
    lib = nccl_library()
    comm = nccl_comm(lib, rank, world)
    print("rank %d: NCCL communicator of %d rank(s) ready" % (rank, world), flush=True)
    if rank == 0:
        print("W=%d, libflashattn %s, libflashattn_cp %s, torch %s" % (world, flashattn.version_string(),
                                                                        cp.library_path(), torch.__version__))
    status = 0
    t0 = time.time()
    if "check" in args.stages:
        status = 1 if check(comm, rank, world, args) else 0
    if "bench" in args.stages:
        bench(comm, rank, world, args)
    lib.ncclCommDestroy(comm)
    dist.destroy_process_group()
    if rank == 0:
        print("cp_multi: %s in %.0f s" % ("FAILED" if status else "ok", time.time() - t0))
    sys.exit(status)


if __name__ == "__main__":
    main()
