"""GPU backends with PyTorch CUDA tensors, against torch.nn.functional.scaled_dot_product_attention.

Skipped when torch, a CUDA device or a GPU backend in the loaded libflashattn is missing. Run on a
GPU machine with a CUDA build of the library, e.g.

    FLASHATTN_LIBRARY=$PWD/build/src/libflashattn.so.0 PYTHONPATH=$PWD/bindings/python \
        python3 -m pytest -v bindings/python/tests/test_gpu_torch.py
"""

import itertools

import pytest

import flashattn

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
GPU_BACKENDS = [b for b in ("fa1", "fa2", "fa3") if b in flashattn.build_info().get("backends", [])]
if not GPU_BACKENDS:
    pytest.skip("libflashattn was built without GPU backends (%s)" % flashattn.build_info_string(),
                allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

BACKENDS = ["auto"] + GPU_BACKENDS
DTYPES = [torch.float16, torch.bfloat16]
TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def no_backend_override(monkeypatch):
    # CTest sets FLASHATTN_BACKEND=cpu for the binding tests; the GPU tests choose their own.
    monkeypatch.delenv("FLASHATTN_BACKEND", raising=False)


def run(*args, **kw):
    """flashattn.attention, skipping when the backend asked for cannot run this problem."""
    try:
        return flashattn.attention(*args, **kw)
    except flashattn.NotSupportedError as e:
        if kw.get("backend", "auto") != "auto":
            pytest.skip("%s: %s" % (kw["backend"], e.message))
        raise


def mask_for(sq, sk, causal=False, window=(-1, -1), device="cuda"):
    """Bottom-right aligned boolean mask, True where the key is visible."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + sk - sq
    m = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal:
        m &= j <= diag
    if window[0] >= 0:
        m &= j >= diag - window[0]
    if window[1] >= 0:
        m &= j <= diag + window[1]
    return m


def expand_kv(k, hq):
    return k.repeat_interleave(hq // k.shape[2], dim=2)


def sdpa(q, k, v, causal=False, window=(-1, -1), scale=None):
    """SDPA on [B, S, H, D] tensors (GQA by repeating K/V; bottom-right masks as boolean masks)."""
    hq = q.shape[2]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, expand_kv(k, hq), expand_kv(v, hq)))
    mask = None
    if causal or window != (-1, -1):
        mask = mask_for(q.shape[1], k.shape[1], causal, window, q.device)
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).transpose(1, 2)


def math_reference(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """float32 math with softcap, returning (O, LSE [B, H, Sq])."""
    hq, d = q.shape[2], q.shape[3]
    scale = scale if scale is not None else d ** -0.5
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, expand_kv(k, hq), expand_kv(v, hq)))
    s = qf @ kf.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask_for(q.shape[1], k.shape[1], causal, window, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vf).transpose(1, 2), lse


def assert_close(a, b, tol, what):
    torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol, msg=lambda m: "%s: %s" % (what, m))


def rand(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 128, 8, 64), (1, 77, 4, 128), (3, 200, 2, 32)], ids=str)
def test_matches_sdpa(backend, dtype, causal, shape):
    b, s, h, d = shape
    q, k, v = (rand(b, s, h, d, dtype=dtype, seed=i) for i in range(3))
    o = run(q, k, v, causal=causal, backend=backend)
    assert o.shape == q.shape and o.dtype == dtype and o.device == q.device
    assert_close(o, sdpa(q, k, v, causal=causal), TOL[dtype], "O vs SDPA")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sq,sk", [(64, 256), (1, 300), (128, 96)])
def test_bottom_right_causal_and_lse(backend, sq, sk):
    q, k, v = rand(2, sq, 4, 64, seed=1), rand(2, sk, 4, 64, seed=2), rand(2, sk, 4, 64, seed=3)
    o, lse = run(q, k, v, causal=True, return_lse=True, backend=backend)
    ro, rl = math_reference(q, k, v, causal=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, sq)
    assert_close(o, ro, TOL[q.dtype], "O")
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_close(lse[finite], rl[finite], 1e-3, "LSE")
    assert torch.all(o[~finite.transpose(1, 2)] == 0)
    if sq <= sk:
        assert_close(o, sdpa(q, k, v, causal=True), TOL[q.dtype], "O vs SDPA")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hq,hkv", [(8, 2), (8, 1)])
def test_gqa(backend, hq, hkv):
    q, k, v = rand(2, 96, hq, 64, seed=4), rand(2, 130, hkv, 64, seed=5), rand(2, 130, hkv, 64, seed=6)
    o = run(q, k, v, causal=True, backend=backend)
    assert_close(o, sdpa(q, k, v, causal=True), TOL[q.dtype], "O vs SDPA")


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_softcap_scale(backend):
    q, k, v = rand(1, 160, 4, 64, seed=7), rand(1, 160, 4, 64, seed=8), rand(1, 160, 4, 64, seed=9)
    o = run(q, k, v, window=(32, 8), backend=backend)
    assert_close(o, sdpa(q, k, v, window=(32, 8)), TOL[q.dtype], "window vs SDPA")
    o, lse = run(q * 4, k * 4, v, softcap=10.0, scale=0.1, return_lse=True, backend=backend)
    ro, rl = math_reference(q * 4, k * 4, v, softcap=10.0, scale=0.1)
    assert_close(o, ro, TOL[q.dtype], "softcap O")
    assert_close(lse, rl, 1e-3, "softcap LSE")


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views(backend):
    qkv = rand(2, 100, 3, 8, 64, seed=10)  # packed projection output
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.is_contiguous()
    o = run(q, k, v, causal=True, backend=backend)
    assert_close(o, sdpa(q, k, v, causal=True), TOL[q.dtype], "packed qkv")
    bhsd = rand(2, 8, 100, 64, seed=11)
    qt = bhsd.transpose(1, 2)  # [B, S, H, D] view of [B, H, S, D]
    o = run(qt, k, v, backend=backend)
    assert_close(o, sdpa(qt, k, v), TOL[q.dtype], "transposed q")
    out = torch.empty(2, 8, 100, 64, device="cuda", dtype=q.dtype).transpose(1, 2)
    res = run(q, k, v, out=out, backend=backend)
    assert res is out
    assert_close(out, sdpa(q, k, v), TOL[q.dtype], "strided out")


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen(backend):
    lens_q, lens_k = [37, 1, 128, 64], [50, 17, 128, 200]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device="cuda")
    q = rand(sum(lens_q), 8, 64, seed=12)
    k, v = rand(sum(lens_k), 2, 64, seed=13), rand(sum(lens_k), 2, 64, seed=14)
    o, lse = run(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                 max_seqlen_k=max(lens_k), causal=True, return_lse=True, backend=backend)
    assert o.shape == q.shape and lse.shape == (8, sum(lens_q))
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        ro, rl = math_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=True)
        assert_close(o[q0:q1], ro[0], TOL[q.dtype], "sequence %d O" % i)
        assert_close(lse[:, q0:q1], rl[0], 1e-3, "sequence %d LSE" % i)


@pytest.mark.parametrize("backend", BACKENDS)
def test_streams(backend):
    q, k, v = rand(2, 256, 8, 64, seed=15), rand(2, 256, 8, 64, seed=16), rand(2, 256, 8, 64, seed=17)
    expected = sdpa(q, k, v, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the current stream is used by default
        o1 = run(q, k, v, causal=True, backend=backend)
    side.synchronize()
    assert_close(o1, expected, TOL[q.dtype], "current stream")
    o2 = run(q, k, v, causal=True, backend=backend, stream=side)  # explicit torch stream
    side.synchronize()
    assert_close(o2, expected, TOL[q.dtype], "explicit stream")
    o3 = run(q, k, v, causal=True, backend=backend, stream=side.cuda_stream)  # raw cudaStream_t
    side.synchronize()
    assert_close(o3, expected, TOL[q.dtype], "raw stream")


def test_cuda_graph_capture():
    q, k, v = rand(1, 128, 4, 64, seed=18), rand(1, 128, 4, 64, seed=19), rand(1, 128, 4, 64, seed=20)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside capture
        run(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(q, k, v, causal=True)
    q.copy_(rand(1, 128, 4, 64, seed=21))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, sdpa(q, k, v, causal=True), TOL[q.dtype], "graph replay")


def test_plan_with_raw_device_pointers():
    b, s, h, d = 2, 64, 4, 64
    q, k, v = rand(b, s, h, d, seed=22), rand(b, s, h, d, seed=23), rand(b, s, h, d, seed=24)
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    with flashattn.Plan(batch=b, seqlen_q=s, seqlen_k=s, heads_q=h, head_dim=d, dtype="fp16",
                        device=torch.cuda.current_device()) as plan:
        plan.finalize()
        backend, reason = plan.backend_info()
        assert backend in (flashattn.Backend.FA1, flashattn.Backend.FA2, flashattn.Backend.FA3), reason
        need = plan.workspace_size
        ws = torch.empty(max(need, 1) + 256, dtype=torch.uint8, device="cuda")
        aligned = (ws.data_ptr() + 255) // 256 * 256
        stream = torch.cuda.current_stream().cuda_stream
        plan.execute(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                     workspace=(aligned, need), stream=stream)
        torch.cuda.synchronize()
        assert_close(o, sdpa(q, k, v), TOL[q.dtype], "raw pointers")
        # tensors are checked against the plan when passed as tensors
        with pytest.raises(ValueError, match="spans"):
            plan.execute(q[:, :10], k, v, o, workspace=(aligned, need), stream=stream)


def test_gpu_errors():
    q = rand(1, 32, 2, 64)
    with pytest.raises(ValueError, match="same memory"):
        flashattn.attention(q, q.cpu(), q)
    with pytest.raises(ValueError, match="host memory"):
        flashattn.attention(q, q, q, backend="cpu")
    with pytest.raises(flashattn.FlashAttnError) as info:  # fp32 is a CPU-only dtype
        qf = q.float()
        flashattn.attention(qf, qf, qf)
    assert isinstance(info.value, ValueError) and info.value.status == flashattn.Status.ERROR_NOT_SUPPORTED
    with pytest.raises(flashattn.InvalidArgumentError):
        flashattn.attention(q, q, q, scale=0.0)


def test_device_queries():
    assert flashattn.device_count() == torch.cuda.device_count()
    assert flashattn.device_compute_capability(0) == torch.cuda.get_device_capability(0)
