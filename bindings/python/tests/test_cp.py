"""libflashattn_cp (context parallelism, experimental) through flashattn.cp: the loopback ring on
the CPU backend (every rank in this process) against a float64 reference and one single call,
its backward pass against the core library's single-call backward on the gathered sequence, the
zigzag layout helper, errors, and the ctypes prototypes and enums against flashattn_cp.h.
Skipped when libflashattn_cp is not built (FLASHATTN_BUILD_CP off)."""

import ctypes
import os
import sys

import numpy as np
import pytest

import flashattn
from flashattn import cp

from conftest import assert_close, reference_attention, reference_attention_backward

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import cheader  # noqa: E402

if not cp.available():
    pytest.skip("libflashattn_cp not loaded: %s" % cp.load_error(), allow_module_level=True)

CP_HEADER = os.path.join(os.path.dirname(cheader.DEFAULT_HEADER), "flashattn_cp.h")


def test_shard_rows_zigzag():
    assert cp.shard_rows(2, 0, 4, causal=True) == [0, 1, 6, 7]
    assert cp.shard_rows(2, 1, 4, causal=True) == [2, 3, 4, 5]
    assert cp.shard_rows(3, 2, 3, causal=False) == [6, 7, 8]
    rows = sorted(r for rank in range(4) for r in cp.shard_rows(4, rank, 6, causal=True))
    assert rows == list(range(24))
    with pytest.raises(ValueError):
        cp.shard_rows(2, 0, 5, causal=True)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_loopback_ring(rng, world, causal):
    batch, local_rows, hq, hkv, d = 2, 6, 4, 2, 16
    S = world * local_rows
    q = rng.standard_normal((batch, S, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, S, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, S, hkv, d)).astype(np.float32)
    params = dict(batch=batch, seqlen_q=local_rows, seqlen_k=local_rows, heads_q=hq, heads_kv=hkv, head_dim=d,
                  dtype="fp32", causal=causal, backend="cpu")
    local = flashattn.Plan(**params).finalize()
    ring = cp.CpPlan(local, world_size=world, transport="loopback")
    shards = [cp.shard_rows(world, r, local_rows, causal) for r in range(world)]
    qs = [np.ascontiguousarray(q[:, s]) for s in shards]
    ks = [np.ascontiguousarray(k[:, s]) for s in shards]
    vs = [np.ascontiguousarray(v[:, s]) for s in shards]
    os_ = [np.full((batch, local_rows, hq, d), np.nan, np.float32) for _ in range(world)]
    lses = [np.full((batch, hq, local_rows), np.nan, np.float32) for _ in range(world)]
    ring.execute(qs, ks, vs, os_, lses)
    o_ref, lse_ref = reference_attention(q, k, v, causal=causal)
    o_one, lse_one = flashattn.attention(q, k, v, causal=causal, return_lse=True, backend="cpu")
    for r, s in enumerate(shards):
        assert_close(os_[r], o_ref[:, s], atol=2e-5, what="rank %d O vs float64" % r)
        assert_close(lses[r], lse_ref[:, :, s], atol=2e-5, what="rank %d LSE vs float64" % r)
        assert_close(os_[r], o_one[:, s], atol=2e-5, what="rank %d O vs one call" % r)


def _ring_inputs(rng, world, causal, batch=2, local_rows=6, hq=4, hkv=2, d=16):
    """Global q, k, v, dout and the ring (loopback, CPU, fp32) with every rank's shards of them,
    its forward O and LSE: (global tensors, shards, ring, local plan parameters)."""
    S = world * local_rows
    q = rng.standard_normal((batch, S, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, S, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, S, hkv, d)).astype(np.float32)
    dout = rng.standard_normal((batch, S, hq, d)).astype(np.float32)
    params = dict(batch=batch, seqlen_q=local_rows, seqlen_k=local_rows, heads_q=hq, heads_kv=hkv, head_dim=d,
                  dtype="fp32", causal=causal, backend="cpu")
    ring = cp.CpPlan(flashattn.Plan(**params).finalize(), world_size=world, transport="loopback")
    rows = [cp.shard_rows(world, r, local_rows, causal) for r in range(world)]
    sh = {name: [np.ascontiguousarray(x[:, s]) for s in rows]
          for name, x in (("q", q), ("k", k), ("v", v), ("dout", dout))}
    sh["o"] = [np.empty((batch, local_rows, hq, d), np.float32) for _ in range(world)]
    sh["lse"] = [np.empty((batch, hq, local_rows), np.float32) for _ in range(world)]
    ring.execute(sh["q"], sh["k"], sh["v"], sh["o"], sh["lse"])
    return (q, k, v, dout), rows, sh, ring, params


def _nan_like(arrays):
    return [np.full_like(a, np.nan) for a in arrays]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_loopback_ring_backward(rng, world, causal):
    (q, k, v, dout), rows, sh, ring, params = _ring_inputs(rng, world, causal)
    assert ring.backward_workspace_size > 0
    dqs, dks, dvs = _nan_like(sh["q"]), _nan_like(sh["k"]), _nan_like(sh["v"])
    ring.execute_backward(sh["q"], sh["k"], sh["v"], sh["o"], sh["dout"], sh["lse"], dqs, dks, dvs)
    # The core library's single backward call on the gathered sequence, with its own forward.
    S = world * params["seqlen_q"]
    o, lse = flashattn.attention(q, k, v, causal=causal, return_lse=True, backend="cpu")
    whole = flashattn.Plan(**dict(params, seqlen_q=S, seqlen_k=S)).finalize()
    dq1, dk1, dv1 = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    whole.backward(q, k, v, o, dout, lse, dq1, dk1, dv1)
    dq_ref, dk_ref, dv_ref = reference_attention_backward(q, k, v, dout, causal=causal)
    for r, s in enumerate(rows):
        for name, got, one, ref in (("dQ", dqs[r], dq1, dq_ref), ("dK", dks[r], dk1, dk_ref),
                                    ("dV", dvs[r], dv1, dv_ref)):
            assert_close(got, one[:, s], atol=1e-4, what="rank %d %s vs one call" % (r, name))
            assert_close(got, ref[:, s], atol=1e-4, what="rank %d %s vs float64" % (r, name))
    # On the CPU the ring adds in a fixed order: a second run is bitwise identical.
    again = [_nan_like(sh["q"]), _nan_like(sh["k"]), _nan_like(sh["v"])]
    ring.execute_backward(sh["q"], sh["k"], sh["v"], sh["o"], sh["dout"], sh["lse"], *again)
    for first, second in zip((dqs, dks, dvs), again):
        for a, b in zip(first, second):
            assert np.array_equal(a, b)


def test_backward_errors(rng):
    _, _, sh, ring, _ = _ring_inputs(rng, 2, True)
    need = ring.backward_workspace_size
    args = [sh[name] for name in ("q", "k", "v", "o", "dout", "lse")]

    def outputs():
        return _nan_like(sh["q"]), _nan_like(sh["k"]), _nan_like(sh["v"])

    dq, dk, dv = outputs()
    ws = np.empty(need + 256, np.uint8)
    aligned = (ws.ctypes.data + 255) // 256 * 256
    with pytest.raises(flashattn.InsufficientWorkspaceError):
        ring.execute_backward(*args, dq, dk, dv, workspace=(aligned, need - 1))
    assert all(np.isnan(x).all() for x in dq + dk + dv)  # an error leaves the outputs untouched
    ring.execute_backward(*args, dq, dk, dv, workspace=(aligned, need))  # exactly the size is enough
    assert not any(np.isnan(x).any() for x in dq + dk + dv)
    dq, dk, dv = outputs()
    with pytest.raises(flashattn.InvalidArgumentError):  # a NULL LSE entry (address 0)
        ring.execute_backward(*args[:5], [sh["lse"][0], 0], dq, dk, dv)
    with pytest.raises(flashattn.InvalidArgumentError):  # dK of rank 1 overlaps its dQ
        ring.execute_backward(*args, dq, [dk[0], dq[1]], dv)
    assert all(np.isnan(x).all() for x in dq + dk + dv)
    with pytest.raises(ValueError, match="2 rank"):
        ring.execute_backward(*[x[:1] for x in args], dq[:1], dk[:1], dv[:1])
    with pytest.raises(TypeError, match="lse"):
        ring.execute_backward(*args[:5], None, dq, dk, dv)
    # Arrays are checked against the local plan before the C call, as Plan.backward checks them:
    # a wrong dtype or too short an array would otherwise be read or written past its end.
    with pytest.raises(TypeError, match="rank 1: dq"):
        ring.execute_backward(*args, [dq[0], dq[1].astype(np.float64)], dk, dv)
    with pytest.raises(ValueError, match="rank 0: dk.*spans"):
        ring.execute_backward(*args, dq, [dk[0][:, :2].copy(), dk[1]], dv)
    with pytest.raises(TypeError, match="rank 0: lse"):
        ring.execute_backward(*args[:5], [x.astype(np.float16) for x in sh["lse"]], dq, dk, dv)
    with pytest.raises(ValueError, match="read-only"):
        frozen = [x.copy() for x in dv]
        frozen[1].flags.writeable = False
        ring.execute_backward(*args, dq, dk, frozen)
    with pytest.raises(TypeError, match="rank 0: q"):  # the forward too
        ring.execute([x.astype(np.float16) for x in sh["q"]], sh["k"], sh["v"], sh["o"])
    assert all(np.isnan(x).all() for x in dq + dk + dv)
    ring.close()
    with pytest.raises(ValueError, match="closed"):
        ring.backward_workspace_size

def test_local_plan_may_close_first(rng):
    # The C ring keeps nothing of the local plan, and neither do the binding's checks.
    (q, k, v, dout), rows, sh, ring, params = _ring_inputs(rng, 2, False)
    ring._local.close()
    dq, dk, dv = _nan_like(sh["q"]), _nan_like(sh["k"]), _nan_like(sh["v"])
    ring.execute_backward(sh["q"], sh["k"], sh["v"], sh["o"], sh["dout"], sh["lse"], dq, dk, dv)
    assert not any(np.isnan(x).any() for x in dq + dk + dv)


def test_errors():
    local = flashattn.Plan(batch=1, seqlen_q=3, seqlen_k=3, heads_q=2, head_dim=16, dtype="fp32", causal=True,
                           backend="cpu").finalize()
    with pytest.raises(flashattn.InvalidArgumentError, match="odd"):
        cp.CpPlan(local, world_size=2)
    with pytest.raises(flashattn.InvalidArgumentError, match="world size"):
        cp.CpPlan(local, world_size=0)
    with pytest.raises(ValueError, match="transport"):
        cp.CpPlan(local, world_size=2, transport="carrier pigeon")
    with pytest.raises(flashattn.NotSupportedError, match="GPU"):
        cp.CpPlan(local, world_size=1, transport="nccl", nccl_comm=1)  # refused before the comm is read
    even = flashattn.Plan(batch=1, seqlen_q=4, seqlen_k=4, heads_q=2, head_dim=16, dtype="fp32", causal=True,
                          backend="cpu").finalize()
    ring = cp.CpPlan(even, world_size=2)
    one = [np.zeros((1, 4, 2, 16), np.float32)]
    with pytest.raises(ValueError, match="2 rank"):
        ring.execute(one, one, one, one)
    ring.close()
    with pytest.raises(ValueError, match="closed"):
        ring.workspace_size


def test_prototypes_and_enums_match_the_header():
    functions = cheader.parse_functions(CP_HEADER)
    assert set(functions) == set(cp.PROTOTYPES)
    from test_header import expected_ctype
    for name, (ret, params) in functions.items():
        restype, argtypes = cp.PROTOTYPES[name]
        if ret != "flashattn_status_t":
            assert restype == expected_ctype(ret), name
        assert len(argtypes) == len(params), name
        for (c_type, pname), actual in zip(params, argtypes):
            if c_type in ("flashattn_cp_plan_t*", "const flashattn_cp_plan_t*", "const flashattn_plan_t*"):
                assert actual == ctypes.c_void_p, (name, pname)
            elif c_type == "flashattn_cp_plan_t**":
                assert actual == ctypes.POINTER(ctypes.c_void_p), (name, pname)
            elif c_type == "void*const*":
                assert actual == ctypes.POINTER(ctypes.c_void_p), (name, pname)
            elif c_type == "float*const*":
                assert actual == ctypes.POINTER(ctypes.POINTER(ctypes.c_float)), (name, pname)
            elif c_type.startswith("flashattn_cp_"):
                assert actual == ctypes.c_int, (name, pname)
            else:
                assert actual == expected_ctype(c_type), (name, pname, c_type)
    enums = cheader.parse_enums(CP_HEADER)
    assert set(enums) == set(cp.ENUMS)
    for typedef, (py_enum, prefix) in cp.ENUMS.items():
        values = {n[len(prefix):]: v for n, v in enums[typedef].items()}
        assert values == {m.name: m.value for m in py_enum}, typedef
