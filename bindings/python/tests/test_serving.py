"""Plan.execute_args on the CPU backend: a decode step over a paged cache (append + rotary) against
a float64 reference written here (it gathers the pages and rotates on its own), and the errors."""

import numpy as np
import pytest

import flashattn
from flashattn import I64

B, SQ, SK, HQ, HKV, D, PAGE, NEW, ROT = 3, 2, 24, 4, 2, 16, 5, 2, 8
MAXP = (SK + PAGE - 1) // PAGE
NPAGES = B * MAXP + 1


def rotate(x, pos, cos, sin, interleaved):
    """x [..., D] rotated at the positions pos (broadcast over x's leading axes), float64."""
    x = x.astype(np.float64).copy()
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    half = ROT // 2
    a = np.arange(half) * 2 if interleaved else np.arange(half)
    b = a + 1 if interleaved else a + half
    xa, xb = x[..., a].copy(), x[..., b].copy()
    x[..., a] = xa * c - xb * s
    x[..., b] = xa * s + xb * c
    return x


def make_case(rng, interleaved):
    q = rng.uniform(-1, 1, (B, SQ, HQ, D)).astype(np.float32)
    k_cache = np.full((NPAGES, PAGE, HKV, D), np.nan, np.float32)
    v_cache = np.full((NPAGES, PAGE, HKV, D), np.nan, np.float32)
    table = rng.permutation(NPAGES)[: B * MAXP].reshape(B, MAXP).astype(np.int32)
    seqused = np.array([0, 7, SK - NEW - 1], np.int32)  # an empty cache, a partial page, nearly full
    k_logical = rng.uniform(-1, 1, (B, SK, HKV, D)).astype(np.float32)
    v_logical = rng.uniform(-1, 1, (B, SK, HKV, D)).astype(np.float32)
    for b in range(B):
        for t in range(seqused[b]):
            k_cache[table[b, t // PAGE], t % PAGE] = k_logical[b, t]
            v_cache[table[b, t // PAGE], t % PAGE] = v_logical[b, t]
    k_new = rng.uniform(-1, 1, (B, NEW, HKV, D)).astype(np.float32)
    v_new = rng.uniform(-1, 1, (B, NEW, HKV, D)).astype(np.float32)
    theta = np.arange(SK)[:, None] * 10000.0 ** (-2.0 * np.arange(ROT // 2) / ROT)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, table=table, seqused=seqused, k_logical=k_logical,
                v_logical=v_logical, k_new=k_new, v_new=v_new, cos=cos, sin=sin)


def reference(c, interleaved):
    """O [B, SQ, HQ, D] in float64: keys = the cache prefix, then the rotated new rows; causal."""
    o = np.zeros((B, SQ, HQ, D))
    for b in range(B):
        used = c["seqused"][b]
        n = used + NEW
        pos = used + np.arange(NEW)
        k = np.concatenate([c["k_logical"][b, :used], rotate(c["k_new"][b], pos[:, None], c["cos"], c["sin"], interleaved)])
        v = np.concatenate([c["v_logical"][b, :used], c["v_new"][b]]).astype(np.float64)
        q = rotate(c["q"][b], (used + np.arange(SQ))[:, None], c["cos"], c["sin"], interleaved)
        for h in range(HQ):
            kh = h // (HQ // HKV)
            s = q[:, h] @ k[:, kh].T / np.sqrt(D)
            s[np.arange(n)[None, :] > np.arange(SQ)[:, None] + n - SQ] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o[b, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kh]
    return o


def make_plan():
    return flashattn.Plan(batch=B, seqlen_q=SQ, seqlen_k=SK, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype="fp32",
                          backend="cpu", causal=1, paged_kv=1, page_size=PAGE, num_pages=NPAGES, seqused_k=1,
                          new_kv_rows=NEW, rotary_dim=ROT)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_decode_step(rng, interleaved):
    c = make_case(rng, interleaved)
    with make_plan() as plan:
        plan.set(I64.ROTARY_INTERLEAVED, interleaved)
        plan.finalize()
        o = np.full((B, SQ, HQ, D), np.nan, np.float32)
        lse = np.full((B, HQ, SQ), np.nan, np.float32)
        seqused = c["seqused"].copy()
        plan.execute_args(c["q"], c["k_cache"], c["v_cache"], o, lse, page_table=c["table"], seqused_k=seqused,
                          k_new=c["k_new"], v_new=c["v_new"], rotary_cos=c["cos"], rotary_sin=c["sin"])
    np.testing.assert_array_equal(seqused, c["seqused"])  # the caller advances it, not the library
    np.testing.assert_allclose(o, reference(c, interleaved), atol=2e-5, rtol=0)
    assert np.isfinite(lse).all()
    for b in range(B):  # the new rows landed in the pages, K rotated
        for j in range(NEW):
            t = c["seqused"][b] + j
            page, slot = c["table"][b, t // PAGE], t % PAGE
            expect_k = rotate(c["k_new"][b, j], t, c["cos"], c["sin"], interleaved)
            np.testing.assert_allclose(c["k_cache"][page, slot], expect_k, atol=1e-6, rtol=0)
            np.testing.assert_array_equal(c["v_cache"][page, slot], c["v_new"][b, j])


def test_errors_write_nothing(rng):
    c = make_case(rng, 0)
    with make_plan() as plan:
        plan.finalize()
        o = np.full((B, SQ, HQ, D), 7.0, np.float32)
        k_before = c["k_cache"].copy()
        table = c["table"].copy()
        table[2, 4] = NPAGES  # sequence 2 reads all five of its pages
        with pytest.raises(flashattn.InvalidArgumentError, match=r"page_table\[2\]\[4\]"):
            plan.execute_args(c["q"], c["k_cache"], c["v_cache"], o, page_table=table, seqused_k=c["seqused"],
                              k_new=c["k_new"], v_new=c["v_new"], rotary_cos=c["cos"], rotary_sin=c["sin"])
        with pytest.raises(flashattn.InvalidArgumentError, match="seqused_k"):
            plan.execute_args(c["q"], c["k_cache"], c["v_cache"], o, page_table=c["table"],
                              k_new=c["k_new"], v_new=c["v_new"], rotary_cos=c["cos"], rotary_sin=c["sin"])
        with pytest.raises(TypeError, match="int32"):
            plan.execute_args(c["q"], c["k_cache"], c["v_cache"], o, page_table=c["table"].astype(np.int64),
                              seqused_k=c["seqused"], k_new=c["k_new"], v_new=c["v_new"], rotary_cos=c["cos"],
                              rotary_sin=c["sin"])
        with pytest.raises(flashattn.InvalidStateError, match="execute_args"):
            plan.execute(c["q"], c["k_cache"], c["v_cache"], o)
        assert (o == 7.0).all()
        np.testing.assert_array_equal(np.isnan(c["k_cache"]), np.isnan(k_before))


def test_num_splits_key():
    """I64.NUM_SPLITS (since 0.3): 0..128, what was set before finalize, the plan's count after it
    (the CPU backend has no split-KV: 1)."""
    with flashattn.Plan(batch=1, seqlen_q=1, seqlen_k=300, heads_q=4, heads_kv=1, head_dim=16, dtype="fp32",
                        backend="cpu") as plan:
        assert plan.get_i64(I64.NUM_SPLITS) == 0
        for bad in (-1, 129):
            with pytest.raises(flashattn.InvalidArgumentError, match="FLASHATTN_I64_NUM_SPLITS"):
                plan.set_i64(I64.NUM_SPLITS, bad)
        plan.set_i64(I64.NUM_SPLITS, 7)
        assert plan.get_i64(I64.NUM_SPLITS) == 7
        plan.finalize()
        assert plan.get_i64(I64.NUM_SPLITS) == 1
