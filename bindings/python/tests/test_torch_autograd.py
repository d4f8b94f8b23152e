"""flashattn.flash_attn_func / flash_attn_varlen_func: differentiable attention on PyTorch CPU
tensors (CPU backend), against the float64 numpy gradients in conftest (skipped without torch)."""

import subprocess
import sys

import numpy as np
import pytest

import flashattn
from conftest import assert_close, reference_attention, reference_attention_backward, reference_varlen_backward

ATOL, RTOL = 1e-4, 1e-4


def test_import_does_not_need_torch():
    code = "import sys, flashattn; assert 'torch' not in sys.modules; print(flashattn.flash_attn_func.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def cpu_backend(monkeypatch):
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)


def leaf(x):
    return torch.from_numpy(x).requires_grad_(True)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(3, 1), softcap=2.0, softmax_scale=0.4)],
                         ids=["plain", "causal", "window-softcap-scale"])
def test_gradients_against_reference(rng, kw):
    q = rng.standard_normal((2, 9, 4, 16)).astype(np.float32)
    k = rng.standard_normal((2, 13, 2, 16)).astype(np.float32)
    v = rng.standard_normal((2, 13, 2, 24)).astype(np.float32)
    dout = rng.standard_normal((2, 9, 4, 24)).astype(np.float32)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    o, lse = flashattn.flash_attn_func(tq, tk, tv, return_lse=True, **kw)
    assert o.shape == (2, 9, 4, 24) and o.dtype == torch.float32 and lse.shape == (2, 4, 9)
    assert o.requires_grad and not lse.requires_grad
    ref = dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
               scale=kw.get("softmax_scale"))
    ro, rl = reference_attention(q, k, v, **ref)
    assert_close(o.detach().numpy(), ro, 2e-5, 2e-5, "O")
    assert_close(lse.numpy(), rl, 1e-4, 1e-5, "LSE")
    o.backward(torch.from_numpy(dout))
    rq, rk, rv = reference_attention_backward(q, k, v, dout, **ref)
    assert_close(tq.grad.numpy(), rq, ATOL, RTOL, "dQ")
    assert_close(tk.grad.numpy(), rk, ATOL, RTOL, "dK")
    assert_close(tv.grad.numpy(), rv, ATOL, RTOL, "dV")


def test_strided_inputs_and_non_contiguous_grad(rng):
    """q, k, v as views of one packed qkv tensor; a loss whose dO is not contiguous."""
    qkv = leaf(rng.standard_normal((1, 11, 3, 2, 16)).astype(np.float32))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    w = torch.from_numpy(rng.standard_normal((1, 16, 2, 11)).astype(np.float32)).permute(0, 3, 2, 1)
    (o * w).sum().backward()
    x = qkv.detach().numpy()
    rq, rk, rv = reference_attention_backward(x[:, :, 0], x[:, :, 1], x[:, :, 2], w.numpy(), causal=True)
    g = qkv.grad.numpy()
    assert_close(g[:, :, 0], rq, ATOL, RTOL, "dQ")
    assert_close(g[:, :, 1], rk, ATOL, RTOL, "dK")
    assert_close(g[:, :, 2], rv, ATOL, RTOL, "dV")


def test_gradcheck_float64_reference_agrees(rng):
    """torch.autograd on torch's own float64 attention gives the same gradients as the library."""
    q, k, v = (rng.standard_normal((1, 6, 2, 8)).astype(np.float32) for _ in range(3))
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    flashattn.flash_attn_func(tq, tk, tv, causal=True).pow(2).sum().backward()
    dq, dk, dv = (torch.from_numpy(x.astype(np.float64)).requires_grad_(True) for x in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", dq, dk) / np.sqrt(8)
    s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), dv).pow(2).sum().backward()
    for name, mine, theirs in (("dQ", tq, dq), ("dK", tk, dk), ("dV", tv, dv)):
        assert_close(mine.grad.numpy(), theirs.grad.numpy(), ATOL, RTOL, name)


def test_varlen_gradients(rng):
    cu_q, cu_k = np.array([0, 5, 12, 15], np.int32), np.array([0, 7, 7, 16], np.int32)  # one sequence without keys
    q = rng.standard_normal((15, 4, 16)).astype(np.float32)
    k = rng.standard_normal((16, 2, 16)).astype(np.float32)
    v = rng.standard_normal((16, 2, 16)).astype(np.float32)
    dout = rng.standard_normal((15, 4, 16)).astype(np.float32)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    o = flashattn.flash_attn_varlen_func(tq, tk, tv, torch.from_numpy(cu_q), cu_k, 7, 9, causal=True)
    o.backward(torch.from_numpy(dout))
    rq, rk, rv = reference_varlen_backward(q, k, v, dout, cu_q, cu_k, causal=True)
    assert_close(tq.grad.numpy(), rq, ATOL, RTOL, "dQ")
    assert_close(tk.grad.numpy(), rk, ATOL, RTOL, "dK")
    assert_close(tv.grad.numpy(), rv, ATOL, RTOL, "dV")


def test_errors():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="expected"):
        flashattn.flash_attn_func(q[0], q, q)
    with pytest.raises(ValueError, match="q is"):
        flashattn.flash_attn_func(q, q.double(), q)
    with pytest.raises(flashattn.InvalidArgumentError):  # heads_q not a multiple of heads_kv
        flashattn.flash_attn_func(torch.zeros(1, 4, 3, 8), q, q)


def _gpu_backends():
    if not torch.cuda.is_available():
        return []
    return [b for b in ("fa1", "fa2", "fa3") if b in flashattn.build_info().get("backends", [])]


@pytest.mark.skipif(not _gpu_backends(), reason="needs a CUDA device and a libflashattn with a GPU backend")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_gradients_against_torch(dtype):
    """CUDA tensors: grads of flash_attn_func against torch's own attention in float32 (causal, GQA)."""
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 70, 4, 64, device="cuda", generator=g)
    k = torch.randn(2, 90, 2, 64, device="cuda", generator=g)
    v = torch.randn(2, 90, 2, 64, device="cuda", generator=g)
    dout = torch.randn(2, 70, 4, 64, device="cuda", generator=g)
    x = [t.to(dt).requires_grad_(True) for t in (q, k, v)]
    flashattn.flash_attn_func(*x, causal=True).backward(dout.to(dt))
    r = [t.detach().to(dt).float().requires_grad_(True) for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(2, dim=2) for t in r[1:])
    s = torch.einsum("bqhd,bkhd->bhqk", r[0], kk) / 8.0
    i, j = torch.arange(70, device="cuda")[:, None], torch.arange(90, device="cuda")[None, :]
    s = s.masked_fill(j > i + 20, float("-inf"))
    torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vv).backward(dout.to(dt).float())
    tol = {"float16": 2e-2, "bfloat16": 1e-1}[dtype]
    for name, a, b in zip(("dQ", "dK", "dV"), x, r):
        err = (a.grad.float() - b.grad).abs().max().item()
        assert err <= tol * max(1.0, b.grad.abs().max().item()), (name, err)
