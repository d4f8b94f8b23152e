"""The 0.3 attention variants through the Python binding on the CPU backend: top-left alignment,
sink logits, ALiBi, sink tokens and the merge of partial states, against a float64 reference
written here (independent of the library and of conftest's)."""

import numpy as np
import pytest

import flashattn
from flashattn import I64, MaskAlign


def reference(q, k, v, causal=False, top_left=False, window=(-1, -1), sink_tokens=0, sinks=None, slopes=None):
    """O [B, Sq, H, Dv] and LSE [B, H, Sq] in float64 (heads_q == heads_kv here)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk = k.shape[1]
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i if top_left else i + sk - sq
    if slopes is not None:
        s = s - slopes[None, :, None, None] * np.abs(diag - j)[None, None]
    last = np.full_like(diag, sk - 1)
    if causal:
        last = np.minimum(last, diag)
    if window[1] >= 0:
        last = np.minimum(last, diag + window[1])
    first = np.zeros_like(diag) if window[0] < 0 else diag - window[0]
    mask = (j <= last) & ((j >= first) | (j < sink_tokens))
    s = np.where(mask[None, None], s, -np.inf)
    cols = [s]
    if sinks is not None:
        cols.append(np.broadcast_to(sinks[None, :, None, None], (b, h, sq, 1)))
    full = np.concatenate(cols, axis=-1)
    m = full.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(full - m_safe)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, e / np.where(l > 0, l, 1), 0.0)[..., :sk]
    o = np.einsum("bhqk,bkhd->bqhd", p, v)
    lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1)), -np.inf)
    return o, lse


def run(q, k, v, **kw):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    sinks, slopes = kw.pop("sinks", None), kw.pop("slopes", None)
    params = dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=h, head_dim=d, head_dim_v=v.shape[3], dtype="fp32",
                  backend="cpu", causal=int(kw.get("causal", False)),
                  mask_align=MaskAlign.TOP_LEFT if kw.get("top_left") else MaskAlign.BOTTOM_RIGHT,
                  window_left=kw.get("window", (-1, -1))[0], window_right=kw.get("window", (-1, -1))[1],
                  sink_tokens=kw.get("sink_tokens", 0), sink_logits=int(sinks is not None),
                  alibi=int(slopes is not None))
    o = np.full((b, sq, h, v.shape[3]), np.nan, np.float32)
    lse = np.full((b, h, sq), np.nan, np.float32)
    with flashattn.Plan(**params) as plan:
        plan.finalize()
        ws = np.empty(plan.workspace_size + 256, np.uint8)
        wsp = ((ws.ctypes.data + 255) // 256 * 256, plan.workspace_size)
        plan.execute_args(q=q, k=k, v=v, o=o, lse=lse, sink_logits=sinks, alibi_slopes=slopes, workspace=wsp)
    return o, lse


@pytest.fixture
def rng():
    return np.random.default_rng(19)


def rand(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("sq,sk", [(7, 13), (13, 7)])
@pytest.mark.parametrize("variant", ["top_left", "sinks", "alibi", "sink_tokens", "all"])
def test_variant(rng, sq, sk, variant):
    h = 3
    q, k, v = rand(rng, 2, sq, h, 16), rand(rng, 2, sk, h, 16), rand(rng, 2, sk, h, 24)
    kw = {"causal": True}
    if variant in ("top_left", "all"):
        kw["top_left"] = True
    if variant in ("sinks", "all"):
        kw["sinks"] = rand(rng, h) * 2
    if variant in ("alibi", "all"):
        kw["slopes"] = np.array([0.5, 0.25, 0.125], np.float32)
    if variant in ("sink_tokens", "all"):
        kw["window"], kw["sink_tokens"] = (2, -1), 2
    o, lse = run(q, k, v, **dict(kw))
    ro, rl = reference(q, k, v, **kw)
    np.testing.assert_allclose(o, ro, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-4, rtol=1e-5)


def test_merge_reproduces_one_call(rng):
    """Causal attention = merge(top-left causal prefix, bottom-right causal suffix); the suffix's
    first rows see nothing (LSE = -inf) and must contribute nothing."""
    b, s, h, d, cut = 2, 20, 2, 16, 8
    q, k, v = rand(rng, b, s, h, d), rand(rng, b, s, h, d), rand(rng, b, s, h, d)
    part = np.ascontiguousarray
    o1, l1 = run(q, part(k[:, :cut]), part(v[:, :cut]), causal=True, top_left=True)
    o2, l2 = run(q, part(k[:, cut:]), part(v[:, cut:]), causal=True)
    assert np.isneginf(l2[:, :, :cut]).all()
    o = np.full_like(o1, np.nan)
    lse = np.full_like(l1, np.nan)
    with flashattn.Plan(batch=b, seqlen_q=s, seqlen_k=cut, heads_q=h, head_dim=d, dtype="fp32", backend="cpu") as plan:
        plan.finalize()
        plan.merge_states([o1, o2], [l1, l2], o, lse)
    ro, rl = reference(q, k, v, causal=True)
    np.testing.assert_allclose(o, ro, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-4, rtol=1e-5)


def test_backward_dsink(rng):
    """dsink against finite differences of sum(O * dO) through the reference."""
    b, s, h, d = 1, 6, 2, 8
    q, k, v, g = rand(rng, b, s, h, d), rand(rng, b, s, h, d), rand(rng, b, s, h, d), rand(rng, b, s, h, d)
    sinks = np.array([0.3, -0.7], np.float32)
    params = dict(batch=b, seqlen_q=s, seqlen_k=s, heads_q=h, head_dim=d, dtype="fp32", backend="cpu", causal=1,
                  sink_logits=1)
    o, lse = run(q, k, v, causal=True, sinks=sinks)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dsink = np.full(h, np.nan, np.float32)
    with flashattn.Plan(**params) as plan:
        plan.finalize()
        plan.backward_args(q=q, k=k, v=v, o=o, dout=g, lse=lse, dq=dq, dk=dk, dv=dv, sink_logits=sinks,
                           dsink_logits=dsink)
    eps = 1e-5
    for i in range(h):
        up, dn = sinks.astype(np.float64), sinks.astype(np.float64)
        up[i] += eps
        dn[i] -= eps
        fd = ((reference(q, k, v, causal=True, sinks=up)[0] - reference(q, k, v, causal=True, sinks=dn)[0]) * g).sum() / (2 * eps)
        assert abs(dsink[i] - fd) <= 1e-4 * (1 + abs(fd)), (i, dsink[i], fd)


def test_plan_without_arrays_refused(rng):
    q = rand(rng, 1, 4, 1, 8)
    with flashattn.Plan(batch=1, seqlen_q=4, seqlen_k=4, heads_q=1, head_dim=8, dtype="fp32", backend="cpu",
                        alibi=1) as plan:
        plan.finalize()
        with pytest.raises(flashattn.InvalidArgumentError, match="alibi_slopes"):
            plan.execute_args(q=q, k=q, v=q, o=np.empty_like(q))
