"""Differentiable attention on PyTorch tensors: a torch.autograd.Function over the library's
forward (keeping O and LSE) and backward (flashattn_plan_execute_backward).

    from flashattn.torch_autograd import flash_attn_func
    o = flash_attn_func(q, k, v, causal=True)   # q [batch, seqlen_q, heads_q, head_dim], ...
    o.sum().backward()                          # q.grad, k.grad, v.grad

FlashAttention's layout: q [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv,
head_dim], v [batch, seqlen_k, heads_kv, head_dim_v] (flash_attn_varlen_func: packed [total,
heads, dim] with int32 cu_seqlens). CPU tensors run on the CPU backend; CUDA tensors on the GPU
backends, on the current stream, with workspaces allocated by torch. This module imports torch;
``import flashattn`` does not (``flashattn.flash_attn_func`` imports this module when called).
"""

import torch
from torch.autograd.function import once_differentiable

from ._attention import _set_strides
from ._capi import I64, F64, Backend
from ._plan import Plan
from ._tensors import as_tensor


def _last_contiguous(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _plan(cfg, tensors):
    """A finalized plan for cfg with the strides of the given {name: tensor}."""
    q = tensors["q"]
    plan = Plan()
    try:
        for key, value in cfg["i64"]:
            plan.set_i64(key, value)
        plan.set_f64(F64.SOFTCAP, cfg["softcap"])
        if cfg["scale"] is not None:
            plan.set_f64(F64.SOFTMAX_SCALE, cfg["scale"])
        if q.is_cuda:
            plan.set_i64(I64.DEVICE, q.device.index if q.device.index is not None else torch.cuda.current_device())
        for name, t in tensors.items():
            _set_strides(plan, name, t.shape, t.stride(), cfg["varlen"])
        plan.finalize()
    except BaseException:
        plan.close()
        raise
    return plan


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _workspace(nbytes, like):
    """(owner tensor, (aligned address, nbytes)) or (None, None) for nbytes == 0."""
    if nbytes == 0:
        return None, None
    buf = torch.empty(nbytes + 256, dtype=torch.uint8, device=like.device)
    return buf, ((buf.data_ptr() + 255) // 256 * 256, nbytes)


def run_forward(q, k, v, cu_q, cu_k, cfg):
    """The library's forward on torch tensors: (q, k, v as used, o, lse); cu_q/cu_k None unless
    cfg["varlen"]. O is new and contiguous, LSE float32 ([batch, heads_q, seqlen_q], varlen
    [heads_q, total_q]); CUDA work goes to torch's current stream with a workspace from its
    caching allocator. Shared by FlashAttnFunction and the torch.library ops of flashattn.torch."""
    q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
    varlen = cfg["varlen"]
    hq, dv = q.shape[-2], v.shape[-1]
    if varlen:
        o = torch.empty((q.shape[0], hq, dv), dtype=q.dtype, device=q.device)
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=q.device)
    else:
        o = torch.empty((q.shape[0], q.shape[1], hq, dv), dtype=q.dtype, device=q.device)
        lse = torch.empty((q.shape[0], hq, q.shape[1]), dtype=torch.float32, device=q.device)
    with _plan(cfg, {"q": q, "k": k, "v": v, "o": o}) as plan:
        if (plan.backend == Backend.CPU) != (not q.is_cuda):
            raise ValueError("the plan runs on backend '%s', but the tensors are %s"
                             % (plan.backend.name.lower(), q.device))
        ws_owner, ws = _workspace(plan.workspace_size, q)
        if varlen:
            plan.execute_varlen(q, k, v, o, cu_q, cu_k, lse=lse, workspace=ws, stream=_stream(q))
        else:
            plan.execute(q, k, v, o, lse=lse, workspace=ws, stream=_stream(q))
        del ws_owner  # freed in stream order by torch's caching allocator
    return q, k, v, o, lse


def run_backward(cfg, q, k, v, o, lse, cu, dout):
    """The library's backward: new contiguous (dq, dk, dv) from the forward's tensors (run_forward's
    q, k, v, o, lse; cu the (cu_q, cu_k) pair for varlen, else ()) and dout, on the current stream."""
    dout = _last_contiguous(dout)
    if dout.dtype != o.dtype:
        dout = dout.to(o.dtype)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    tensors = {"q": q, "k": k, "v": v, "o": o, "dout": dout, "dq": dq, "dk": dk, "dv": dv}
    with _plan(cfg, tensors) as plan:
        ws_owner, ws = _workspace(plan.backward_workspace_size, q)
        args = (q, k, v, o, dout, lse, dq, dk, dv)
        if cfg["varlen"]:
            plan.backward_varlen(*args, cu[0], cu[1], workspace=ws, stream=_stream(q))
        else:
            plan.backward(*args, workspace=ws, stream=_stream(q))
        del ws_owner
    return dq, dk, dv


class FlashAttnFunction(torch.autograd.Function):
    """forward(q, k, v, cu_seqlens_q, cu_seqlens_k, cfg) -> (o, lse); cu_seqlens None for fixed length."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, cfg):
        q, k, v, o, lse = run_forward(q, k, v, cu_q, cu_k, cfg)
        ctx.cfg = cfg
        ctx.save_for_backward(q, k, v, o, lse, *((cu_q, cu_k) if cfg["varlen"] else ()))
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors[:5]
        dq, dk, dv = run_backward(ctx.cfg, q, k, v, o, lse, ctx.saved_tensors[5:], dout)
        return dq, dk, dv, None, None, None


def _config(q, k, v, varlen, batch, seqlen_q, seqlen_k, causal, softmax_scale, window_size, softcap,
            deterministic):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dim() != (3 if varlen else 4):
            raise ValueError("%s: expected %s, got shape %s"
                             % (name, "[total, heads, dim]" if varlen else "[batch, seqlen, heads, dim]", list(t.shape)))
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError("%s: %s %s, but q is %s %s" % (name, t.dtype, t.device, q.dtype, q.device))
    if q.device.type not in ("cpu", "cuda"):
        raise TypeError("q: tensors on '%s'; libflashattn takes CPU or CUDA tensors" % q.device)
    left, right = window_size if window_size is not None else (-1, -1)
    i64 = [(I64.BATCH, batch), (I64.SEQLEN_Q, seqlen_q), (I64.SEQLEN_K, seqlen_k), (I64.HEADS_Q, q.shape[-2]),
           (I64.HEADS_KV, k.shape[-2]), (I64.HEAD_DIM, q.shape[-1]), (I64.HEAD_DIM_V, v.shape[-1]),
           (I64.DTYPE, as_tensor(q, "q").flash_dtype or 0), (I64.CAUSAL, 1 if causal else 0),
           (I64.WINDOW_LEFT, -1 if left is None else int(left)), (I64.WINDOW_RIGHT, -1 if right is None else int(right)),
           (I64.BACKEND, Backend.AUTO if q.is_cuda else Backend.CPU), (I64.DETERMINISTIC, 1 if deterministic else 0)]
    if varlen:
        i64 += [(I64.VARLEN, 1), (I64.TOTAL_Q, q.shape[0]), (I64.TOTAL_K, k.shape[0])]
    return {"i64": i64, "varlen": varlen, "softcap": float(softcap or 0.0),
            "scale": None if softmax_scale is None else float(softmax_scale)}


def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    deterministic=False, return_lse=False):
    """Differentiable exact attention on [batch, seqlen, heads, dim] torch tensors.

    Returns O [batch, seqlen_q, heads_q, head_dim_v] (and, with return_lse=True, the float32
    LSE [batch, heads_q, seqlen_q], not differentiable). Masks align bottom-right; window_size
    (left, right) with -1 unbounded; softcap c > 0 caps scores as c*tanh(s/c); softmax_scale
    defaults to 1/sqrt(head_dim); deterministic=True asks for bitwise-reproducible gradients.
    """
    cfg = _config(q, k, v, False, q.shape[0], q.shape[1], k.shape[1], causal, softmax_scale, window_size,
                  softcap, deterministic)
    o, lse = FlashAttnFunction.apply(q, k, v, None, None, cfg)
    return (o, lse) if return_lse else o


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           softmax_scale=None, window_size=(-1, -1), softcap=0.0, deterministic=False,
                           return_lse=False):
    """flash_attn_func on packed sequences: q [total_q, heads_q, dim], k/v [total_k, heads_kv, dim],
    cu_seqlens_q/k int32 prefix sums of batch+1 entries (moved to q's device), max_seqlen_q/k the
    longest lengths. LSE is [heads_q, total_q]."""
    cu_q = torch.as_tensor(cu_seqlens_q).to(device=q.device, dtype=torch.int32).contiguous()
    cu_k = torch.as_tensor(cu_seqlens_k).to(device=q.device, dtype=torch.int32).contiguous()
    if cu_q.dim() != 1 or cu_q.shape != cu_k.shape or cu_q.shape[0] < 2:
        raise ValueError("cu_seqlens_q/k: need two 1-D tensors of batch+1 >= 2 entries, got %s and %s"
                         % (list(cu_q.shape), list(cu_k.shape)))
    cfg = _config(q, k, v, True, cu_q.shape[0] - 1, max(1, int(max_seqlen_q)), max(1, int(max_seqlen_k)), causal,
                  softmax_scale, window_size, softcap, deterministic)
    o, lse = FlashAttnFunction.apply(q, k, v, cu_q, cu_k, cfg)
    return (o, lse) if return_lse else o


__all__ = ["FlashAttnFunction", "flash_attn_func", "flash_attn_varlen_func", "run_forward", "run_backward"]
