"""flashattn.torch: the torch.library operators against an independent float64 reference (conftest)
and torch's own scaled_dot_product_attention, with gradients, under torch.compile and inside a
CUDA graph.

Runs on CPU tensors (CPU backend) wherever torch >= 2.4 is importable, and on CUDA tensors where
torch sees a GPU and the loaded library has a GPU backend; skipped otherwise. On a GPU machine:

    FLASHATTN_LIBRARY=$PWD/build/src/libflashattn.so.0 PYTHONPATH=$PWD/bindings/python \\
        python3 -m pytest -v bindings/python/tests/test_torch_ops.py
"""

import numpy as np
import pytest

import flashattn
from conftest import assert_close, reference_attention, reference_attention_backward

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch %s lacks torch.library.custom_op (needs >= 2.4)" % torch.__version__, allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from flashattn.torch import flash_attn_func, scaled_dot_product_attention  # noqa: E402

CUDA = torch.cuda.is_available() and any(b in flashattn.build_info().get("backends", []) for b in ("fa1", "fa2", "fa3"))
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device visible to torch, or a library without GPU backends")

# (atol, rtol) of outputs and gradients against the float64 reference, per input dtype: the inputs
# are rounded to the dtype before the reference sees them, so this bounds the kernels' own error.
TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}
GRAD_TOL = {torch.float32: (5e-4, 5e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 6e-2)}


@pytest.fixture(autouse=True)
def library_chooses(monkeypatch):
    # CTest sets FLASHATTN_BACKEND=cpu for the binding tests; CUDA tensors need the GPU backends.
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)


def dtypes_for(device):
    return [torch.float32] if device == "cpu" else [torch.float16, torch.bfloat16]


def _cases():
    for device in DEVICES:
        for dtype in dtypes_for(device):
            yield pytest.param(device, dtype, id="%s-%s" % (device, str(dtype).split(".")[1]))


def cases():
    return list(_cases())


def rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def poison_allocator(device, nbytes=64 << 20):
    """Fill memory the caching allocator will hand out next with NaN, so an output element that the
    library leaves unwritten shows up in the comparison."""
    if device == "cuda":
        junk = torch.full((nbytes // 4,), float("nan"), device=device)
        del junk


def reference(q, k, v, dout, **kw):
    """float64 (O, LSE, dQ, dK, dV) of the tensors as rounded to their dtype ([B, S, H, D] layout)."""
    qn, kn, vn, dn = (t.detach().double().cpu().numpy() for t in (q, k, v, dout))
    o, lse = reference_attention(qn, kn, vn, **kw)
    dq, dk, dv = reference_attention_backward(qn, kn, vn, dn, **kw)
    return o, lse, dq, dk, dv


def check_all(got, want, dtype, names=("O", "LSE", "dQ", "dK", "dV")):
    for name, g, w in zip(names, got, want):
        atol, rtol = GRAD_TOL[dtype] if name.startswith("d") else TOL[dtype]
        if name == "LSE":
            atol, rtol = 2e-3, 1e-4  # float32 in every dtype (from the rounded inputs)
        g = g.detach().double().cpu().numpy()
        if name == "LSE":  # -inf exactly on the rows that see no key (bottom-right causal, sq > sk)
            empty = np.isneginf(w)
            assert (np.isneginf(g) == empty).all(), "LSE: -inf rows differ from the reference's"
            g, w = g[~empty], w[~empty]
        assert np.isfinite(g).all(), "%s has non-finite elements" % name
        assert_close(g, w, atol, rtol, name)


def leaves(dtype, device, seed, *shapes):
    return [rand(s, dtype, device, seed + i).requires_grad_(True) for i, s in enumerate(shapes)]


SHAPES = [  # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, causal, window
    (2, 97, 131, 4, 2, 64, 64, False, (-1, -1)),
    (1, 128, 128, 8, 8, 128, 128, True, (-1, -1)),
    (2, 131, 67, 6, 2, 32, 32, True, (-1, -1)),   # seqlen_q > seqlen_k, bottom-right causal, GQA
    (1, 80, 80, 4, 1, 96, 96, False, (17, 5)),     # MQA, sliding window
]


@pytest.mark.parametrize("device,dtype", cases())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d-q%d-k%d-h%d/%d-d%d%s" % (
    s[0], s[1], s[2], s[3], s[4], s[5], "-causal" if s[7] else ("-window" if s[8] != (-1, -1) else "")))
def test_forward_and_gradients_against_reference(device, dtype, shape):
    b, sq, sk, hq, hkv, d, dv, causal, window = shape
    q, k, v = leaves(dtype, device, 10, (b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, dv))
    dout = rand((b, sq, hq, dv), dtype, device, 20)
    poison_allocator(device)
    o, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert o.shape == (b, sq, hq, dv) and o.dtype == dtype and o.device.type == device
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32 and not lse.requires_grad
    poison_allocator(device)
    o.backward(dout)
    check_all((o, lse, q.grad, k.grad, v.grad), reference(q, k, v, dout, causal=causal, window=window), dtype)


@pytest.mark.parametrize("device,dtype", cases())
def test_scale_and_softcap(device, dtype):
    q, k, v = leaves(dtype, device, 30, (1, 45, 2, 64), (1, 45, 2, 64), (1, 45, 2, 64))
    dout = rand((1, 45, 2, 64), dtype, device, 40)
    o, lse = flash_attn_func(q, k, v, softmax_scale=0.3, softcap=5.0, return_lse=True)
    o.backward(dout)
    check_all((o, lse, q.grad, k.grad, v.grad), reference(q, k, v, dout, scale=0.3, softcap=5.0), dtype)


@pytest.mark.parametrize("device,dtype", cases())
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_layout_against_torch_sdpa(device, dtype, causal):
    """[batch, heads, seqlen, dim] tensors (SDPA's layout: strided views for the library, no copy),
    against torch's SDPA in the same dtype and the float64 reference, gradients included."""
    b, h, s, d = 2, 4, 77, 64
    q, k, v = leaves(dtype, device, 50, (b, h, s, d), (b, h, s, d), (b, h, s, d))
    dout = rand((b, h, s, d), dtype, device, 60)
    o = scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert o.shape == (b, h, s, d)
    o.backward(dout)
    ours = [t.detach().clone() for t in (o, q.grad, k.grad, v.grad)]

    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    o2 = F.scaled_dot_product_attention(q2, k2, v2, is_causal=causal)
    o2.backward(dout)
    atol, rtol = GRAD_TOL[dtype]
    for name, a, e in zip(("O", "dQ", "dK", "dV"), ours, (o2, q2.grad, k2.grad, v2.grad)):
        assert_close(a.double().cpu().numpy(), e.detach().double().cpu().numpy(), atol, rtol, name + " vs torch SDPA")

    t = lambda x: x.transpose(1, 2)  # noqa: E731  (to [B, S, H, D] for the reference)
    ro, _, rq, rk, rv = reference(t(q), t(k), t(v), t(dout), causal=causal)
    for name, a, e in zip(("O", "dQ", "dK", "dV"), ours, (ro, rq, rk, rv)):
        atol, rtol = GRAD_TOL[dtype] if name.startswith("d") else TOL[dtype]
        assert_close(t(a).double().cpu().numpy(), e, atol, rtol, name + " vs reference")


@pytest.mark.parametrize("device,dtype", cases())
def test_sdpa_gqa(device, dtype):
    q, k, v = leaves(dtype, device, 70, (1, 8, 33, 64), (1, 2, 33, 64), (1, 2, 33, 64))
    o = scaled_dot_product_attention(q, k, v, enable_gqa=True)
    rep = lambda x: x.detach().repeat_interleave(4, dim=1)  # noqa: E731
    expected = F.scaled_dot_product_attention(q.detach(), rep(k), rep(v))
    atol, rtol = TOL[dtype]
    assert_close(o.detach().double().cpu().numpy(), expected.double().cpu().numpy(), atol, rtol, "O")


def test_sdpa_refuses_what_it_does_not_compute():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="top-left"):
        scaled_dot_product_attention(q, torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        scaled_dot_product_attention(q, q[:, :1], q[:, :1])
    with pytest.raises(ValueError, match="batch, seqlen, heads, dim"):
        flash_attn_func(q[0], q[0], q[0])


@pytest.mark.parametrize("device,dtype", cases())
def test_opcheck(device, dtype):
    """torch's own consistency checks of a custom op: schema, fake (meta) implementation against the
    real one, autograd registration, and AOT dispatch."""
    q, k, v = leaves(dtype, device, 80, (1, 24, 2, 32), (1, 40, 2, 32), (1, 40, 2, 32))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, (q, k, v, True, None, -1, -1, 0.0, False))
    o, lse = torch.ops.flashattn.fwd(q.detach(), k.detach(), v.detach(), True, None, -1, -1, 0.0, False)
    dout = rand(o.shape, dtype, device, 81)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (dout, q.detach(), k.detach(), v.detach(), o, lse, True, None, -1, -1, 0.0, False))


@pytest.mark.parametrize("device,dtype", cases())
def test_torch_compile_full_graph(device, dtype):
    """fullgraph=True fails on any graph break: the ops must be traced, forward and backward."""
    torch._dynamo.reset()

    def loss(q, k, v, w):
        o = flash_attn_func(q, k, v, causal=True)
        return (o.float() * w).sum()

    # Inductor generates C++/Triton for the surrounding ops; on the CPU the lighter aot_eager backend
    # traces the same graph (the point here) without compiling C++.
    compiled = torch.compile(loss, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    q, k, v = leaves(dtype, device, 90, (2, 64, 4, 64), (2, 64, 4, 64), (2, 64, 4, 64))
    w = rand((2, 64, 4, 64), torch.float32, device, 91)
    out = compiled(q, k, v, w)
    out.backward()
    got = [q.grad.clone(), k.grad.clone(), v.grad.clone()]
    dout = w.to(dtype)
    _, _, rq, rk, rv = reference(q, k, v, dout, causal=True)
    for name, g, e in zip(("dQ", "dK", "dV"), got, (rq, rk, rv)):
        atol, rtol = GRAD_TOL[dtype]
        assert_close(g.double().cpu().numpy(), e, atol * 2, rtol * 2, name + " (compiled)")
    o_ref, _ = reference_attention(*(t.detach().double().cpu().numpy() for t in (q, k, v)), causal=True)
    expected = float((torch.from_numpy(o_ref) * w.double().cpu()).sum())
    got = out.detach().item()
    assert abs(got - expected) <= 1e-2 * (1 + abs(expected)), (got, expected)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_graph_forward_and_backward(dtype):
    """Forward and backward captured once, replayed on new inputs copied into the static tensors."""
    shape = (2, 96, 4, 64)
    q, k, v = leaves(dtype, "cuda", 100, shape, shape, shape)
    dout = rand(shape, dtype, "cuda", 104)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (as torch's docs require)
        for _ in range(2):
            flash_attn_func(q, k, v, causal=True).backward(dout)
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = v.grad = None

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = flash_attn_func(q, k, v, causal=True)
        o.backward(dout)
    for seed in (200, 300):
        with torch.no_grad():
            for i, t in enumerate((q, k, v)):
                t.copy_(rand(shape, dtype, "cuda", seed + i))
            dout.copy_(rand(shape, dtype, "cuda", seed + 3))
        graph.replay()
        torch.cuda.synchronize()
        ro, _, rq, rk, rv = reference(q, k, v, dout, causal=True)
        for name, g, e in zip(("O", "dQ", "dK", "dV"), (o, q.grad, k.grad, v.grad), (ro, rq, rk, rv)):
            atol, rtol = GRAD_TOL[dtype] if name.startswith("d") else TOL[dtype]
            assert_close(g.detach().double().cpu().numpy(), e, atol, rtol, "%s (graph replay, seed %d)" % (name, seed))


@needs_cuda
def test_runs_on_the_current_stream():
    """Inputs written on a side stream immediately before the call: correct only if the op runs on
    the current (side) stream, after that write."""
    shape = (4, 512, 8, 64)
    side = torch.cuda.Stream()
    base = rand(shape, torch.float16, "cuda", 400)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy so a wrong stream would race ahead
        q = base * 0.5
        o = flash_attn_func(q, q, q)
    side.synchronize()
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (base * 0.5,) * 3)).transpose(1, 2)
    assert_close(o.double().cpu().numpy(), ref.double().cpu().numpy(), 4e-3, 4e-3, "O on a side stream")
