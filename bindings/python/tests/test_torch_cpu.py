"""PyTorch CPU tensors go to the CPU backend in place (skipped without torch)."""

import numpy as np
import pytest

import flashattn
from conftest import assert_close, reference_attention

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def cpu_backend(monkeypatch):
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_cpu_tensors(dtype):
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 21, 3, 4, 32, generator=g).to(getattr(torch, dtype))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # strided views
    o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == q.dtype and o.device.type == "cpu"
    ro, rl = reference_attention(q.float().numpy(), k.float().numpy(), v.float().numpy(), causal=True)
    tol = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2e-2}[dtype]
    assert_close(o.float().numpy(), ro, tol, tol, "O")
    assert_close(lse.numpy(), rl, 1e-4, 1e-5, "LSE")


def test_torch_cpu_varlen():
    q = torch.randn(12, 2, 16)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    o = flashattn.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    ro, _ = reference_attention(q[None, :5].numpy(), q[None, :5].numpy(), q[None, :5].numpy(), causal=True)
    assert_close(o[:5].numpy(), ro[0], 2e-5, 2e-5, "O")
