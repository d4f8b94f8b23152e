"""libflashattn as PyTorch operators: torch.compile traces through them, CUDA graphs capture them,
autograd differentiates them.

    import torch
    from flashattn.torch import flash_attn_func, scaled_dot_product_attention
    o = flash_attn_func(q, k, v, causal=True)   # [batch, seqlen, heads, dim], FlashAttention's layout
    o = scaled_dot_product_attention(qt, kt, vt, is_causal=True)   # [batch, heads, seqlen, dim], SDPA's
    o.sum().backward()

The forward and the backward are ``torch.library`` custom operators, ``flashattn::fwd`` and
``flashattn::bwd``, each with a fake (meta) implementation that gives the output shapes without
running anything: ``torch.compile(fullgraph=True)`` keeps them in its graph, and autograd is
registered on ``flashattn::fwd`` with ``flashattn::bwd`` as its derivative. Both run the code of
``flashattn.torch_autograd`` (``run_forward`` / ``run_backward``): CUDA tensors on torch's current
stream with the workspace from torch's caching allocator (so also inside ``torch.cuda.graph``),
CPU tensors on the CPU backend. SDPA's layout needs no copy: the library takes any strides with a
contiguous last dimension. Needs torch >= 2.4 (``torch.library.custom_op``); variable-length
batches stay with ``flashattn.torch_autograd.flash_attn_varlen_func`` (re-exported here), an
autograd.Function that torch.compile runs outside its graph.
"""

from typing import Optional, Tuple

import torch

from . import torch_autograd as _impl
from .torch_autograd import flash_attn_varlen_func

if not hasattr(torch.library, "custom_op"):  # pragma: no cover (torch < 2.4)
    raise ImportError("flashattn.torch needs torch >= 2.4 (torch.library.custom_op); this is torch %s. "
                      "flashattn.torch_autograd works with older versions." % torch.__version__)

Tensor = torch.Tensor


def _cfg(q, k, v, causal, softmax_scale, window_left, window_right, softcap, deterministic):
    return _impl._config(q, k, v, False, q.shape[0], q.shape[1], k.shape[1], causal, softmax_scale,
                         (window_left, window_right), softcap, deterministic)


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: Optional[float], window_left: int,
         window_right: int, softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    """(O [batch, seqlen_q, heads_q, head_dim_v], float32 LSE [batch, heads_q, seqlen_q]), both new
    and contiguous. deterministic only matters to the backward (kept here for autograd)."""
    cfg = _cfg(q, k, v, causal, softmax_scale, window_left, window_right, softcap, deterministic)
    _, _, _, o, lse = _impl.run_forward(q, k, v, None, None, cfg)
    return o, lse


@_fwd.register_fake
def _fwd_fake(q, k, v, causal, softmax_scale, window_left, window_right, softcap, deterministic):
    batch, seqlen_q, heads_q = q.shape[0], q.shape[1], q.shape[2]
    o = q.new_empty((batch, seqlen_q, heads_q, v.shape[-1]))
    lse = q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
         softmax_scale: Optional[float], window_left: int, window_right: int, softcap: float,
         deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV), new and contiguous, shaped as q, k, v."""
    cfg = _cfg(q, k, v, causal, softmax_scale, window_left, window_right, softcap, deterministic)
    # The library reads q, k, v with a contiguous last dimension (run_forward made them so; the
    # saved inputs are the caller's, so repeat it here).
    q, k, v = (_impl._last_contiguous(t) for t in (q, k, v))
    return _impl.run_backward(cfg, q, k, v, o, lse, (), dout)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, o, lse, causal, softmax_scale, window_left, window_right, softcap, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.params = inputs[3:]
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    if dout is None:  # only the (non-differentiable) LSE was used
        dout = torch.zeros_like(o)
    dq, dk, dv = _bwd(dout, q, k, v, o, lse, *ctx.params)
    return (dq, dk, dv) + (None,) * len(ctx.params)


_fwd.register_autograd(_backward, setup_context=_setup_context)


def _window(window_size):
    left, right = window_size if window_size is not None else (-1, -1)
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    deterministic=False, return_lse=False):
    """Exact attention on torch tensors in FlashAttention's layout: q [batch, seqlen_q, heads_q,
    head_dim], k [batch, seqlen_k, heads_kv, head_dim], v [batch, seqlen_k, heads_kv, head_dim_v]
    (heads_q a multiple of heads_kv: GQA/MQA), any strides with a contiguous last dimension.

    Returns O [batch, seqlen_q, heads_q, head_dim_v] (and with return_lse=True the float32 LSE
    [batch, heads_q, seqlen_q], not differentiable). Masks align bottom-right (as FlashAttention's);
    window_size (left, right), -1 unbounded; softcap c > 0 caps scores as c*tanh(s/c);
    softmax_scale defaults to 1/sqrt(head_dim); deterministic=True asks for reproducible gradients.
    Differentiable in q, k and v; traceable by torch.compile; capturable in a CUDA graph.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dim() != 4:
            raise ValueError("%s: expected [batch, seqlen, heads, dim], got shape %s" % (name, list(t.shape)))
    left, right = _window(window_size)
    o, lse = _fwd(q, k, v, bool(causal), None if softmax_scale is None else float(softmax_scale), left, right,
                  float(softcap or 0.0), bool(deterministic))
    return (o, lse) if return_lse else o


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's call on [batch, heads, seqlen, dim] tensors,
    computed by flash_attn_func on transposed views (no copy). Output [batch, heads_q, seqlen_q,
    head_dim_v], a view with SDPA's shape.

    Differences, each refused with an error rather than computed otherwise: no attn_mask and no
    dropout; is_causal with seqlen_q != seqlen_k (SDPA aligns that mask top-left, FlashAttention
    bottom-right: call flash_attn_func(causal=True) for the latter); fewer key/value heads than
    query heads need enable_gqa=True, as in SDPA.
    """
    if attn_mask is not None:
        raise NotImplementedError("flashattn.torch.scaled_dot_product_attention: attn_mask is not supported "
                                  "(use is_causal, or flash_attn_func's window_size)")
    if dropout_p != 0.0:
        raise NotImplementedError("flashattn.torch.scaled_dot_product_attention: dropout_p must be 0")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError("%s: expected a 4-D tensor [batch, heads, seqlen, dim], got %s"
                             % (name, list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__))
    if is_causal and query.shape[2] != key.shape[2]:
        raise ValueError("is_causal with seqlen_q %d != seqlen_k %d: SDPA's mask is top-left aligned, this "
                         "library's bottom-right; use flash_attn_func(..., causal=True) for the bottom-right "
                         "mask" % (query.shape[2], key.shape[2]))
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError("query has %d heads, key %d: pass enable_gqa=True for grouped-query attention"
                         % (query.shape[1], key.shape[1]))
    o = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal,
                        softmax_scale=scale)
    return o.transpose(1, 2)


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention"]
