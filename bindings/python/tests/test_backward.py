"""The backward pass through Plan on the CPU backend (numpy, fp32), against the float64 gradients
in conftest, and its errors."""

import numpy as np
import pytest

import flashattn
from flashattn import I64
from conftest import (assert_close, reference_attention, reference_attention_backward, reference_varlen,
                      reference_varlen_backward)

ATOL, RTOL = 1e-4, 1e-4  # fp32 accumulation of short sums


def randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def workspace(nbytes):
    """A 256-byte aligned uint8 view of nbytes (the view keeps its buffer alive during the call)."""
    buf = np.zeros(nbytes + 256, dtype=np.uint8)
    off = -buf.ctypes.data % 256
    return buf[off:off + nbytes]


def make_plan(q, k, v, varlen=False, cu_q=None, cu_k=None, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              **extra):
    if varlen:
        batch = len(cu_q) - 1
        sq, sk = int(np.diff(cu_q).max()), int(np.diff(cu_k).max())
        params = dict(varlen=1, total_q=q.shape[0], total_k=k.shape[0])
    else:
        batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        params = {}
    params.update(batch=batch, seqlen_q=max(sq, 1), seqlen_k=max(sk, 1), heads_q=q.shape[-2], heads_kv=k.shape[-2],
                  head_dim=q.shape[-1], head_dim_v=v.shape[-1], dtype="fp32", backend="cpu", causal=causal,
                  window_left=window[0], window_right=window[1], softcap=softcap, **extra)
    if scale is not None:
        params["scale"] = scale
    return flashattn.Plan(**params).finalize()


def forward(plan, q, k, v, cu=None):
    o = np.empty(q.shape[:-1] + (plan.get(I64.HEAD_DIM_V),), dtype=np.float32)
    if cu is None:
        lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
        plan.execute(q, k, v, o, lse=lse, workspace=workspace(plan.workspace_size))
    else:
        lse = np.empty((q.shape[1], q.shape[0]), dtype=np.float32)
        plan.execute_varlen(q, k, v, o, cu[0], cu[1], lse=lse, workspace=workspace(plan.workspace_size))
    return o, lse


CASES = [
    dict(shape=(2, 9, 13, 4, 2, 16, 16), opts={}),
    dict(shape=(2, 13, 7, 2, 2, 16, 16), opts=dict(causal=True)),  # bottom-right: rows without keys
    dict(shape=(1, 11, 17, 6, 1, 16, 24), opts=dict(window=(4, 2), softcap=2.0, scale=0.4)),  # MQA, dv != d
    dict(shape=(2, 8, 12, 4, 2, 8, 8), opts=dict(causal=True, window=(3, -1))),
]


def test_reference_backward_is_the_gradient(rng):
    """The float64 reference itself, by central differences of sum(O * dO)."""
    q, k, v = rng.standard_normal((1, 5, 2, 8)), rng.standard_normal((1, 6, 1, 8)), rng.standard_normal((1, 6, 1, 8))
    dout = rng.standard_normal((1, 5, 2, 8))
    kw = dict(causal=True, window=(3, -1), softcap=1.5, scale=0.7)
    grads = reference_attention_backward(q, k, v, dout, **kw)
    eps = 1e-6
    for x, g in zip((q, k, v), grads):
        for idx in [(0, 0, 0, 0), (0, 4, 0, 3), (0, 2, 0, 7), tuple(i - 1 for i in x.shape)]:
            old = x[idx]
            x[idx] = old + eps
            up = np.sum(reference_attention(q, k, v, **kw)[0] * dout)
            x[idx] = old - eps
            down = np.sum(reference_attention(q, k, v, **kw)[0] * dout)
            x[idx] = old
            assert abs((up - down) / (2 * eps) - g[idx]) < 1e-6, idx


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c["shape"])) + str(sorted(c["opts"])))
def test_backward_against_reference(rng, case):
    b, sq, sk, hq, hkv, d, dv = case["shape"]
    q, k, v = randn(rng, (b, sq, hq, d)), randn(rng, (b, sk, hkv, d)), randn(rng, (b, sk, hkv, dv))
    dout = randn(rng, (b, sq, hq, dv))
    with make_plan(q, k, v, **case["opts"]) as plan:
        backend, reason = plan.backward_backend_info()
        assert backend == flashattn.Backend.CPU and reason
        assert plan.backward_backend == flashattn.Backend.CPU
        o, lse = forward(plan, q, k, v)
        dq, dk, dvv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)  # overwritten
        plan.backward(q, k, v, o, dout, lse, dq, dk, dvv, workspace=workspace(plan.backward_workspace_size))
    rq, rk, rv = reference_attention_backward(q, k, v, dout, **case["opts"])
    assert_close(dq, rq, ATOL, RTOL, "dQ")
    assert_close(dk, rk, ATOL, RTOL, "dK")
    assert_close(dvv, rv, ATOL, RTOL, "dV")
    if case["opts"].get("causal") and sq > sk:  # queries that see no key get dQ = 0
        assert np.all(dq[:, : sq - sk] == 0)


def test_backward_strided_gradients_and_default_workspace(rng):
    """dO, dQ, dK, dV with their own strides (views into wider buffers); workspace=None allocates."""
    b, sq, sk, hq, hkv, d = 2, 7, 10, 4, 2, 16
    q, k, v = randn(rng, (b, sq, hq, d)), randn(rng, (b, sk, hkv, d)), randn(rng, (b, sk, hkv, d))
    dout_wide = randn(rng, (b, sq, hq, 2 * d))
    dout = dout_wide[..., d:]
    dq_wide, dk_wide, dv_wide = (np.zeros((x.shape[0], x.shape[1], x.shape[2] * 2, d), np.float32) for x in (q, k, v))
    dq, dk, dvv = dq_wide[:, :, ::2], dk_wide[:, :, 1::2], dv_wide[:, :, ::2]

    def strides(name, a):
        e = a.itemsize
        return {name + "_batch_stride": a.strides[0] // e, name + "_row_stride": a.strides[1] // e,
                name + "_head_stride": a.strides[2] // e}

    extra = {**strides("do", dout), **strides("dq", dq), **strides("dk", dk), **strides("dv", dvv)}
    with make_plan(q, k, v, causal=True, **extra) as plan:
        assert plan.get("dq_head_stride") == 2 * d and plan.get(I64.DO_ROW_STRIDE) == hq * 2 * d
        o, lse = forward(plan, q, k, v)
        plan.backward(q, k, v, o, dout, lse, dq, dk, dvv)
    rq, rk, rv = reference_attention_backward(q, k, v, dout, causal=True)
    assert_close(dq, rq, ATOL, RTOL, "dQ")
    assert_close(dk, rk, ATOL, RTOL, "dK")
    assert_close(dvv, rv, ATOL, RTOL, "dV")
    assert np.all(dq_wide[:, :, 1::2] == 0) and np.all(dk_wide[:, :, ::2] == 0)  # nothing outside the views


def test_backward_varlen(rng):
    cu_q = np.array([0, 5, 5, 12, 15], dtype=np.int32)  # an empty query sequence
    cu_k = np.array([0, 7, 10, 10, 19], dtype=np.int32)  # a sequence without keys
    hq, hkv, d = 4, 2, 16
    q, k, v = randn(rng, (15, hq, d)), randn(rng, (19, hkv, d)), randn(rng, (19, hkv, d))
    dout = randn(rng, (15, hq, d))
    opts = dict(causal=True, softcap=3.0)
    with make_plan(q, k, v, varlen=True, cu_q=cu_q, cu_k=cu_k, **opts) as plan:
        o, lse = forward(plan, q, k, v, cu=(cu_q, cu_k))
        ro, rl = reference_varlen(q, k, v, cu_q, cu_k, **opts)
        assert_close(o, ro, 2e-5, 2e-5, "O")
        dq, dk, dvv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)
        plan.backward_varlen(q, k, v, o, dout, lse, dq, dk, dvv, cu_q, cu_k,
                             workspace=workspace(plan.backward_workspace_size))
    rq, rk, rv = reference_varlen_backward(q, k, v, dout, cu_q, cu_k, **opts)
    assert_close(dq, rq, ATOL, RTOL, "dQ")
    assert_close(dk, rk, ATOL, RTOL, "dK")
    assert_close(dvv, rv, ATOL, RTOL, "dV")
    assert np.all(dq[5:12] == 0)  # the sequence without keys


def test_backward_deterministic(rng):
    q, k, v, dout = (randn(rng, (1, 16, 2, 8)) for _ in range(4))
    with make_plan(q, k, v, deterministic=1) as plan:
        assert plan.get(I64.DETERMINISTIC) == 1
        o, lse = forward(plan, q, k, v)
        runs = []
        for _ in range(2):
            g = [np.empty_like(q), np.empty_like(k), np.empty_like(v)]
            plan.backward(q, k, v, o, dout, lse, *g)
            runs.append(g)
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_backward_errors(rng):
    q, k, v, dout = (randn(rng, (1, 8, 2, 8)) for _ in range(4))
    g = [np.empty_like(q), np.empty_like(k), np.empty_like(v)]
    with flashattn.Plan(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, head_dim=8, dtype="fp32", backend="cpu") as plan:
        with pytest.raises(flashattn.InvalidStateError) as e:  # not finalized
            plan.backward_workspace_size
        assert e.value.status == flashattn.Status.ERROR_INVALID_STATE and e.value.message
        with pytest.raises(flashattn.InvalidStateError):
            plan.backward_backend_info()
        plan.finalize()
        o, lse = forward(plan, q, k, v)
        need = plan.backward_workspace_size
        if need > 0:
            with pytest.raises(flashattn.InsufficientWorkspaceError) as e:
                plan.backward(q, k, v, o, dout, lse, *g, workspace=workspace(need - 1))
            assert e.value.status == flashattn.Status.ERROR_INSUFFICIENT_WORKSPACE
            assert e.value.function == "flashattn_plan_execute_backward" and e.value.message
        with pytest.raises(flashattn.InvalidStateError) as e:  # a fixed-length plan through the varlen call
            plan.backward_varlen(q, k, v, o, dout, lse, *g, np.array([0, 8], np.int32), np.array([0, 8], np.int32))
        assert e.value.function == "flashattn_plan_execute_backward_varlen"
        with pytest.raises(ValueError, match="dq: .* spans"):  # checked by the binding
            plan.backward(q, k, v, o, dout, lse, g[0][:, :4], g[1], g[2])
        with pytest.raises(TypeError, match="dout"):
            plan.backward(q, k, v, o, dout.astype(np.float16), lse, *g)
        ro = np.empty_like(q)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            plan.backward(q, k, v, o, dout, lse, ro, g[1], g[2])
        with pytest.raises(TypeError, match="lse: must not be None"):
            plan.backward(q, k, v, o, dout, None, *g)


def test_missing_backward_symbol_raises_when_called():
    """A library older than 0.2 still loads; its missing backward functions raise NotSupportedError."""
    from flashattn import _capi
    fn = _capi._missing("flashattn_plan_execute_backward", "libold.so")
    with pytest.raises(flashattn.NotSupportedError, match="lacks flashattn_plan_execute_backward"):
        fn(None)
