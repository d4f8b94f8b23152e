"""FP8 (E4M3) inputs through the Python binding on the CPU backend (since 0.3): E4M3 bytes as
uint8 arrays, per-head and per-tensor descales, O in fp16 (numpy has no bfloat16), against a
float64 reference that decodes E4M3 here from its definition."""

import numpy as np
import pytest

import flashattn
from flashattn import I64, DType


def e4m3_decode(codes):
    codes = codes.astype(np.int64)
    s, e, m = codes >> 7, (codes >> 3) & 15, codes & 7
    v = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1 + m / 8.0, e - 7))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(s == 1, -v, v)


def random_codes(rng, shape):
    codes = rng.integers(0, 256, size=shape).astype(np.uint8)
    return codes & 0xBF  # exponent <= 7: finite, magnitude below 2


@pytest.mark.parametrize("per_tensor", [False, True])
def test_fp8_forward(per_tensor):
    rng = np.random.default_rng(17)
    b, sq, sk, hq, hk, d = 2, 9, 13, 4, 2, 32
    q, k, v = random_codes(rng, (b, sq, hq, d)), random_codes(rng, (b, sk, hk, d)), random_codes(rng, (b, sk, hk, d))
    shape = (1,) if per_tensor else (b, hk)
    dq, dk, dv = (rng.uniform(0.25, 2.0, shape).astype(np.float32) for _ in range(3))
    params = dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hk, head_dim=d, dtype="fp8_e4m3",
                  backend="cpu", causal=1, output_dtype=int(DType.FP16))
    if per_tensor:
        params.update(descale_batch_stride=0, descale_head_stride=0)
    o = np.full((b, sq, hq, d), np.nan, np.float16)
    with flashattn.Plan(**params) as plan:
        plan.finalize()
        assert plan.get_i64(I64.OUTPUT_DTYPE) == DType.FP16
        plan.execute_args(q=q, k=k, v=v, o=o, descale_q=dq, descale_k=dk, descale_v=dv)
        with pytest.raises(flashattn.InvalidArgumentError, match="descale_k"):
            plan.execute_args(q=q, k=k, v=v, o=o, descale_q=dq, descale_v=dv)
    group = hq // hk
    scale_of = (lambda x: np.broadcast_to(x.reshape(1, 1), (b, hk))) if per_tensor else (lambda x: x)
    sq_, sk_, sv_ = (np.repeat(scale_of(x), group, axis=1) for x in (dq, dk, dv))  # [b, hq]
    qf = e4m3_decode(q) * sq_[:, None, :, None]
    kf = np.repeat(e4m3_decode(k), group, axis=2) * sk_[:, None, :, None]
    vf = np.repeat(e4m3_decode(v), group, axis=2) * sv_[:, None, :, None]
    s = np.einsum("bqhd,bkhd->bhqk", qf, kf) / np.sqrt(d)
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    s = np.where((j <= i + sk - sq)[None, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ref = np.einsum("bhqk,bkhd->bqhd", p, vf)
    err = np.abs(o.astype(np.float64) - ref)
    assert np.all(err <= np.abs(ref) * 2.0 ** -11 + 1e-5 * (1 + np.abs(ref).max())), err.max()


def test_fp8_output_dtype_rules():
    with flashattn.Plan(batch=1, seqlen_q=4, seqlen_k=4, heads_q=1, head_dim=8, dtype="fp8_e4m3", backend="cpu",
                        output_dtype=int(DType.FP32)) as plan:
        with pytest.raises(flashattn.InvalidArgumentError, match="OUTPUT_DTYPE"):
            plan.finalize()


def hadamard_matrix(seed, dim):
    def mix(x):
        m = 0xFFFFFFFFFFFFFFFF
        z = (x + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)
    signs = np.array([-1.0 if mix(seed + i) >> 63 else 1.0 for i in range(dim)])
    i, j = np.arange(dim)[:, None], np.arange(dim)[None, :]
    h = np.vectorize(lambda x: -1.0 if bin(x).count("1") % 2 else 1.0)(i & j)
    return signs[:, None] * h / np.sqrt(dim)


@pytest.mark.parametrize("dim", [8, 64, 256])
def test_rotate_hadamard(dim):
    rng = np.random.default_rng(dim)
    q = rng.standard_normal((3, 5, 2, dim)).astype(np.float32)
    k = rng.standard_normal((3, 7, 2, dim)).astype(np.float32)
    qr = np.empty_like(q)
    flashattn.rotate_hadamard(q, qr, seed=42)
    np.testing.assert_allclose(qr, q.astype(np.float64) @ hadamard_matrix(42, dim), atol=1e-5)
    kr = k.copy()
    flashattn.rotate_hadamard(kr, seed=42)  # in place
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k)
    sr = np.einsum("bqhd,bkhd->bhqk", qr.astype(np.float64), kr)
    np.testing.assert_allclose(sr, s, atol=1e-4 * np.abs(s).max())
    with pytest.raises(flashattn.InvalidArgumentError, match="dim"):
        flashattn.rotate_hadamard(np.zeros((2, 96), np.float32))
