"""flashattn.attention(): one call from tensors to O (and LSE), through a temporary Plan."""

import sys

from ._capi import I64, F64, Backend, DType
from ._plan import Plan, parse_backend
from ._tensors import Allocator, as_tensor, current_stream, is_torch_tensor, stream_handle

# (batch, row, head) stride keys of each tensor; dout, dq, dk, dv are the backward's.
_STRIDE_KEYS = {
    "q": (I64.Q_BATCH_STRIDE, I64.Q_ROW_STRIDE, I64.Q_HEAD_STRIDE),
    "k": (I64.K_BATCH_STRIDE, I64.K_ROW_STRIDE, I64.K_HEAD_STRIDE),
    "v": (I64.V_BATCH_STRIDE, I64.V_ROW_STRIDE, I64.V_HEAD_STRIDE),
    "o": (I64.O_BATCH_STRIDE, I64.O_ROW_STRIDE, I64.O_HEAD_STRIDE),
    "dout": (I64.DO_BATCH_STRIDE, I64.DO_ROW_STRIDE, I64.DO_HEAD_STRIDE),
    "dq": (I64.DQ_BATCH_STRIDE, I64.DQ_ROW_STRIDE, I64.DQ_HEAD_STRIDE),
    "dk": (I64.DK_BATCH_STRIDE, I64.DK_ROW_STRIDE, I64.DK_HEAD_STRIDE),
    "dv": (I64.DV_BATCH_STRIDE, I64.DV_ROW_STRIDE, I64.DV_HEAD_STRIDE),
}


def _set_strides(plan, name, shape, strides, varlen):
    """Set tensor name's strides (elements) on the plan from its shape and strides (no batch stride
    for a variable-length plan)."""
    for key, value in zip(_STRIDE_KEYS[name], _layout_strides(shape, strides, varlen)):
        if not (varlen and key.name.endswith("BATCH_STRIDE")):
            plan.set_i64(key, value)


def _layout_strides(shape, strides, varlen):
    """(batch, row, head) element strides of a [b, s, h, d] (or [t, h, d]) tensor for the plan.

    A dimension of size 1 has no meaningful stride (numpy and torch report arbitrary ones, even 0):
    it gets the contiguous value, which the library accepts and which keeps rows aligned."""
    shape, strides = tuple(shape), tuple(strides)
    if varlen:
        shape, strides = (1,) + shape, (0,) + strides
    _, s, h, d = shape
    head = strides[2] if h > 1 else d
    row = strides[1] if s > 1 else h * head
    batch = strides[0] if shape[0] > 1 else max(s, 1) * row
    return batch, row, head


def _cu_seqlens(value, name, ref, alloc):
    """(TensorRef kept alive with its object, host copy for lengths or None) in ref's memory."""
    if value is None:
        raise ValueError("%s: variable-length attention needs both cu_seqlens_q and cu_seqlens_k" % name)
    if ref.on_host:
        import numpy as np
        if is_torch_tensor(value):
            value = value.detach().cpu().numpy()
        host = np.ascontiguousarray(np.asarray(value), dtype=np.int32)
        if host.ndim != 1:
            raise ValueError("%s: must be one-dimensional, got shape %s" % (name, host.shape))
        return as_tensor(host, name), host
    # Device memory: keep device tensors (converted to contiguous int32 in their own library),
    # copy host sequences to the device.
    torch = sys.modules.get("torch")
    if is_torch_tensor(value):
        if value.device.type == "cuda":
            t = value.to(dtype=torch.int32).contiguous()
            return as_tensor(t, name), None
        host = value.to(dtype=torch.int32).contiguous()
        return as_tensor(host.to(device=torch.device("cuda", ref.device)), name), host.numpy()
    if hasattr(value, "__cuda_array_interface__") or (hasattr(value, "__dlpack__") and not _is_numpy(value)):
        t = as_tensor(value, name)
        if t.on_host:
            raise ValueError("%s: host memory, but the tensors are on cuda:%d" % (name, ref.device))
        if t.dtype_name != "int32" or not t.is_contiguous:
            if t.kind == "cupy":
                import cupy
                return as_tensor(cupy.ascontiguousarray(value, dtype=cupy.int32), name), None
            raise TypeError("%s: must be contiguous int32, got %s" % (name, t.describe()))
        return t, None
    import numpy as np
    host = np.ascontiguousarray(np.asarray(value), dtype=np.int32)
    dev = alloc.empty(host.shape, "int32")
    if alloc.kind == "torch":
        dev.copy_(torch.from_numpy(host))
    else:
        dev.set(host)
    return as_tensor(dev, name), host


def _is_numpy(value):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _max_len(cu_ref, host, given, name):
    if given is not None:
        return int(given)
    if host is None:  # a device tensor: this synchronises with its stream
        obj = cu_ref.obj
        if is_torch_tensor(obj):
            host = obj.cpu().numpy()
        else:
            import cupy
            host = cupy.asnumpy(obj)
    import numpy as np
    diffs = np.diff(np.asarray(host, dtype=np.int64))
    return max(1, int(diffs.max()) if diffs.size else 1)


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None, return_lse=False,
              backend="auto", cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              workspace=None, stream=None, out=None):
    """Exact attention O = softmax(scale * Q K^T, masked) V.

    q: [batch, seqlen_q, heads_q, head_dim]; k: [batch, seqlen_k, heads_kv, head_dim];
    v: [batch, seqlen_k, heads_kv, head_dim_v]. With cu_seqlens_q/cu_seqlens_k (int32 prefix sums
    of batch+1 entries) the batch is packed: q [total_q, heads_q, head_dim], k/v [total_k, ...].
    Tensors are used in place with their strides (the last dimension must be contiguous): numpy
    arrays and torch CPU tensors run on the CPU backend; torch CUDA tensors, CuPy arrays and other
    __cuda_array_interface__ / DLPack objects on the GPU backends, on the tensor's current stream
    unless ``stream`` is given. Returns O (a new array of q's library, or ``out``) and, with
    return_lse=True, (O, LSE) where LSE is float32 [batch, heads_q, seqlen_q] ([heads_q, total_q]).

    Masks align bottom-right when seqlen_q != seqlen_k; window=(left, right), -1 unbounded;
    softcap c > 0 caps scores as c*tanh(s/c); scale defaults to 1/sqrt(head_dim).
    backend: "auto", "cpu", "fa1", "fa2" or "fa3" (host tensors with "auto" use "cpu").
    """
    stream_int = stream_handle(stream)
    qr = as_tensor(q, "q", stream_int)
    kr = as_tensor(k, "k", stream_int)
    vr = as_tensor(v, "v", stream_int)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None

    for name, r in (("k", kr), ("v", vr)):
        if r.device != qr.device:
            raise ValueError("%s: %s, but q is %s; all tensors must be in the same memory" % (name, r.describe(), qr.describe()))
        if r.dtype_name != qr.dtype_name:
            raise TypeError("%s: dtype %s differs from q's %s" % (name, r.dtype_name, qr.dtype_name))
    if qr.flash_dtype is None:
        raise TypeError("q: dtype %s; libflashattn takes float16, bfloat16 or float32" % qr.dtype_name)

    ndim = 3 if varlen else 4
    layout = "[total, heads, dim]" if varlen else "[batch, seq, heads, dim]"
    for name, r in (("q", qr), ("k", kr), ("v", vr)):
        if len(r.shape) != ndim:
            raise ValueError("%s: expected %d dimensions %s, got shape %s" % (name, ndim, layout, list(r.shape)))
        if r.shape[-1] > 1 and r.strides[-1] != 1:
            raise ValueError("%s: the last dimension must be contiguous (stride %d elements)" % (name, r.strides[-1]))
    if varlen:
        (tq, hq, d), (tk, hkv, dk), (tv, hv, dv) = qr.shape, kr.shape, vr.shape
        if (tv, hv) != (tk, hkv):
            raise ValueError("v: shape %s does not match k's %s" % (list(vr.shape), list(kr.shape)))
    else:
        (b, sq, hq, d), (bk, sk, hkv, dk), (bv, sv, hv, dv) = qr.shape, kr.shape, vr.shape
        if bk != b or bv != b:
            raise ValueError("k, v: batch sizes %d, %d differ from q's %d" % (bk, bv, b))
        if (sv, hv) != (sk, hkv):
            raise ValueError("v: shape %s does not match k's %s in seqlen and heads" % (list(vr.shape), list(kr.shape)))
    if dk != d:
        raise ValueError("k: head_dim %d differs from q's %d" % (dk, d))

    want = parse_backend(backend)
    if qr.on_host:
        if want not in (Backend.AUTO, Backend.CPU):
            raise ValueError("backend %r runs on CUDA device memory, but q is %s" % (want.name.lower(), qr.describe()))
        want = Backend.CPU
    elif want == Backend.CPU:
        raise ValueError("backend 'cpu' needs host memory, but q is %s" % qr.describe())

    if stream_int is None:
        stream_int = current_stream(qr)
    alloc = Allocator(qr, stream_int if (stream is not None and not qr.on_host) else None)

    keep = []
    if varlen:
        cu_q, host_q = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", qr, alloc)
        cu_k, host_k = _cu_seqlens(cu_seqlens_k, "cu_seqlens_k", qr, alloc)
        keep += [cu_q, cu_k]
        batch = cu_q.shape[0] - 1
        if cu_k.shape[0] != batch + 1:
            raise ValueError("cu_seqlens_k: %d entries, cu_seqlens_q has %d" % (cu_k.shape[0], batch + 1))
        if batch < 1:
            raise ValueError("cu_seqlens_q: needs at least 2 entries (batch + 1)")
        seqlen_q = _max_len(cu_q, host_q, max_seqlen_q, "max_seqlen_q")
        seqlen_k = _max_len(cu_k, host_k, max_seqlen_k, "max_seqlen_k")
        o_shape, lse_shape = (tq, hq, dv), (hq, tq)
    else:
        batch, seqlen_q, seqlen_k = b, sq, sk
        o_shape, lse_shape = (b, sq, hq, dv), (b, hq, sq)

    if out is None:
        o_obj = alloc.empty(o_shape, qr.dtype_name)
    else:
        o_obj = out
    orf = as_tensor(o_obj, "out")
    if orf.shape != o_shape or orf.dtype_name != qr.dtype_name or orf.device != qr.device:
        raise ValueError("out: %s, expected %s%s in the same memory as q" % (orf.describe(), qr.dtype_name, list(o_shape)))
    if orf.shape[-1] > 1 and orf.strides[-1] != 1:
        raise ValueError("out: the last dimension must be contiguous")
    lse_obj = alloc.empty(lse_shape, "float32") if return_lse else None

    left, right = window if window is not None else (-1, -1)
    with Plan() as plan:
        plan.set_i64(I64.BATCH, batch)
        plan.set_i64(I64.SEQLEN_Q, seqlen_q)
        plan.set_i64(I64.SEQLEN_K, seqlen_k)
        plan.set_i64(I64.HEADS_Q, hq)
        plan.set_i64(I64.HEADS_KV, hkv)
        plan.set_i64(I64.HEAD_DIM, d)
        plan.set_i64(I64.HEAD_DIM_V, dv)
        plan.set_i64(I64.DTYPE, qr.flash_dtype)
        plan.set_i64(I64.CAUSAL, 1 if causal else 0)
        plan.set_i64(I64.WINDOW_LEFT, -1 if left is None else left)
        plan.set_i64(I64.WINDOW_RIGHT, -1 if right is None else right)
        plan.set_i64(I64.BACKEND, want)
        if not qr.on_host:
            plan.set_i64(I64.DEVICE, qr.device)
        if varlen:
            plan.set_i64(I64.VARLEN, 1)
            plan.set_i64(I64.TOTAL_Q, tq)
            plan.set_i64(I64.TOTAL_K, tk)
        for name, r in (("q", qr), ("k", kr), ("v", vr), ("o", orf)):
            _set_strides(plan, name, r.shape, r.strides, varlen)
        plan.set_f64(F64.SOFTCAP, softcap or 0.0)
        if scale is not None:
            plan.set_f64(F64.SOFTMAX_SCALE, scale)
        plan.finalize()
        chosen = plan.backend
        if qr.on_host != (chosen == Backend.CPU):
            # A CPU-only build cannot tell device pointers from host ones: never let it read them.
            raise ValueError("the plan runs on backend '%s', but the tensors are %s"
                             % (chosen.name.lower(), "host memory" if qr.on_host else "on cuda:%d" % qr.device))

        ws_owner = None
        if workspace is None:
            need = plan.workspace_size
            if need > 0:
                ws_owner, ws_ptr = alloc.workspace(need)
                workspace = (ws_ptr, need)
        if varlen:
            plan.execute_varlen(qr, kr, vr, orf, keep[0], keep[1], lse=lse_obj, workspace=workspace, stream=stream_int)
        else:
            plan.execute(qr, kr, vr, orf, lse=lse_obj, workspace=workspace, stream=stream_int)
        del ws_owner, keep
    return (o_obj, lse_obj) if return_lse else o_obj
