"""Shared helpers: an independent float64 reference and the cross-language reference file."""

import os
import struct
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package, when PYTHONPATH does not name it already


def _reference_softmax(q, k, v, causal, window, softcap, scale):
    """The float64 softmax of reference_attention's scores: dict with P [B, Hq, Sq, Sk], K and V
    repeated per query head, the scale, tanh(S / softcap) (None without a softcap) and LSE [B, Hq, Sq, 1]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    kk = np.repeat(k, group, axis=2)
    vv = np.repeat(v, group, axis=2)
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    mask = np.ones((sq, sk), dtype=bool)
    if causal:
        mask &= j <= diag
    left, right = window
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(total) + m_safe, -np.inf)
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    return {"p": p, "kk": kk, "vv": vv, "scale": scale, "tanh": t, "lse": lse}


def reference_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """float64 attention of [B, Sq, Hq, D], [B, Sk, Hkv, D], [B, Sk, Hkv, Dv] -> (O, LSE[B, Hq, Sq])."""
    r = _reference_softmax(q, k, v, causal, window, softcap, scale)
    o = np.einsum("bhqk,bkhd->bqhd", r["p"], r["vv"])
    return o, r["lse"][..., 0]


def reference_attention_backward(q, k, v, dout, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """float64 gradients (dQ, dK, dV) of sum(O * dout) for reference_attention's inputs.

    P = softmax(S), dP = dO V^T, dS = P * (dP - rowsum(dO * O)), through the softcap's tanh,
    dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO; dK, dV summed over each kv head's query group."""
    r = _reference_softmax(q, k, v, causal, window, softcap, scale)
    p, kk, vv, scale, t = r["p"], r["kk"], r["vv"], r["scale"], r["tanh"]
    q, dout = np.asarray(q, dtype=np.float64), np.asarray(dout, dtype=np.float64)
    b, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    o = np.einsum("bhqk,bkhd->bqhd", p, vv)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vv)
    delta = np.einsum("bqhd,bqhd->bhq", dout, o)[..., None]
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk) * scale
    dk = (np.einsum("bhqk,bqhd->bkhd", ds, q) * scale).reshape(b, sk, hkv, group, d).sum(axis=3)
    dvv = np.einsum("bhqk,bqhd->bkhd", p, dout).reshape(b, sk, hkv, group, dv).sum(axis=3)
    return dq, dk, dvv


def _sequences(cu_q, cu_k):
    """(q0, q1, k0, k1) row ranges of each sequence of packed tensors that has queries and keys."""
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        if q1 > q0 and k1 > k0:
            yield q0, q1, k0, k1


def reference_varlen_backward(q, k, v, dout, cu_q, cu_k, **kw):
    """Packed [total, H, D] tensors -> (dQ, dK, dV) of the same shapes (0 where nothing flows)."""
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        g = reference_attention_backward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], dout[None, q0:q1], **kw)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def reference_varlen(q, k, v, cu_q, cu_k, **kw):
    """Packed [total, H, D] tensors -> (O [total_q, Hq, Dv], LSE [Hq, total_q])."""
    tq, hq = q.shape[0], q.shape[1]
    o = np.zeros((tq, hq, v.shape[2]))
    lse = np.full((hq, tq), -np.inf)
    for q0, q1, k0, k1 in _sequences(cu_q, cu_k):  # a sequence without keys: O = 0, LSE = -inf
        os_, ls = reference_attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **kw)
        o[q0:q1] = os_[0]
        lse[:, q0:q1] = ls[0]
    return o, lse


def assert_close(actual, expected, atol, rtol=0.0, what=""):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    inf_a, inf_e = np.isinf(actual), np.isinf(expected)
    assert np.array_equal(inf_a, inf_e), "%s: infinities differ at %s" % (what, np.argwhere(inf_a != inf_e)[:5])
    assert np.array_equal(actual[inf_a], expected[inf_e]), what
    finite = ~inf_e
    err = np.abs(actual[finite] - expected[finite])
    bound = atol + rtol * np.abs(expected[finite])
    worst = float((err - bound).max()) if err.size else -1.0
    assert worst <= 0, "%s: max error %.3g exceeds tolerance (atol %g, rtol %g)" % (what, float(err.max()), atol, rtol)


def read_reference_file(path):
    """The cases of bindings/common/make_reference.c's file, as dicts of numpy arrays."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"FAREF01\n", "not a reference file: %s" % path
    (ncases,) = struct.unpack_from("<q", data, 8)
    pos = 16
    cases = []

    def take(dtype, count):
        nonlocal pos
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=pos)
        pos += arr.nbytes
        return arr

    for _ in range(ncases):
        p = struct.unpack_from("<16q", data, pos)
        pos += 128
        softcap, scale = struct.unpack_from("<2d", data, pos)
        pos += 16
        c = dict(batch=p[0], seqlen_q=p[1], seqlen_k=p[2], heads_q=p[3], heads_kv=p[4], head_dim=p[5],
                 head_dim_v=p[6], causal=bool(p[7]), window=(p[8], p[9]), varlen=bool(p[10]), total_q=p[11],
                 total_k=p[12], softcap=softcap, scale=scale if scale > 0 else None)
        if c["varlen"]:
            c["cu_q"] = take("<i4", c["batch"] + 1)
            c["cu_k"] = take("<i4", c["batch"] + 1)
            rows_q, rows_k = c["total_q"], c["total_k"]
            qs, ks, vs = (rows_q, c["heads_q"], c["head_dim"]), (rows_k, c["heads_kv"], c["head_dim"]), (rows_k, c["heads_kv"], c["head_dim_v"])
            os_, ls = (rows_q, c["heads_q"], c["head_dim_v"]), (c["heads_q"], rows_q)
        else:
            b = c["batch"]
            qs = (b, c["seqlen_q"], c["heads_q"], c["head_dim"])
            ks = (b, c["seqlen_k"], c["heads_kv"], c["head_dim"])
            vs = (b, c["seqlen_k"], c["heads_kv"], c["head_dim_v"])
            os_, ls = (b, c["seqlen_q"], c["heads_q"], c["head_dim_v"]), (b, c["heads_q"], c["seqlen_q"])
        for name, shape in (("q", qs), ("k", ks), ("v", vs), ("o", os_), ("lse", ls)):
            c[name] = take("<f4", int(np.prod(shape))).reshape(shape)
        cases.append(c)
    assert pos == len(data), "trailing bytes in %s" % path
    return cases


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
