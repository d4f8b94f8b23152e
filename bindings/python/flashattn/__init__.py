"""libflashattn from Python: exact FlashAttention attention (forward and backward) over the library's C ABI.

    import numpy as np, flashattn
    q = np.random.randn(1, 128, 8, 64).astype(np.float32)
    o, lse = flashattn.attention(q, q, q, causal=True, return_lse=True)

The library is found through FLASHATTN_LIBRARY (a path), then the copy that ``pip install
bindings/python`` built into this package, then ``pkg-config --variable=libdir flashattn``, then
the system loader (``flashattn.library_path()`` says which). ``Plan`` mirrors the C plan for repeated calls and raw
device pointers, including the backward pass (``Plan.backward``, ``Plan.backward_varlen``).
With PyTorch, ``flashattn.flash_attn_func`` / ``flash_attn_varlen_func`` are differentiable
(``flashattn.torch_autograd``; torch is imported only when they are called). ``flashattn.torch``
has the same as ``torch.library`` operators that torch.compile traces and CUDA graphs capture,
plus ``scaled_dot_product_attention`` on SDPA's [batch, heads, seqlen, dim] layout.
"""

from ._capi import (AllocationError, Arg, Backend, DeviceError, DType, F64, FlashAttnError, I64, InsufficientWorkspaceError,
                    InternalError, InvalidArgumentError, InvalidStateError, LibraryNotFoundError, MaskAlign,
                    NotSupportedError,
                    Status, build_info, build_info_string, device_compute_capability, device_count, library_path,
                    status_string, version, version_string)
from ._plan import Plan
from ._attention import attention
from ._rotate import rotate_hadamard


def flash_attn_func(q, k, v, **kwargs):
    """Differentiable attention on torch tensors [batch, seqlen, heads, dim]: see
    flashattn.torch_autograd.flash_attn_func (imports torch)."""
    from .torch_autograd import flash_attn_func as f
    return f(q, k, v, **kwargs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
    """Differentiable variable-length attention on packed torch tensors: see
    flashattn.torch_autograd.flash_attn_varlen_func (imports torch)."""
    from .torch_autograd import flash_attn_varlen_func as f
    return f(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs)


__all__ = [
    "attention", "rotate_hadamard", "flash_attn_func", "flash_attn_varlen_func", "Plan", "Status", "DType", "Backend", "I64", "F64",
    "MaskAlign", "Arg",
    "FlashAttnError", "InvalidArgumentError", "NotSupportedError", "InvalidStateError", "AllocationError",
    "DeviceError", "InsufficientWorkspaceError", "InternalError", "LibraryNotFoundError",
    "version", "version_string", "build_info", "build_info_string", "device_count",
    "device_compute_capability", "status_string", "library_path",
]


def _package_version():
    try:  # the installed distribution's version (the library's project version)
        from importlib.metadata import PackageNotFoundError, version as dist_version
        try:
            return dist_version("libflashattn")
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover (Python < 3.8)
        pass
    return "0.1.0"  # a source checkout on PYTHONPATH: the binding's own API version


__version__ = _package_version()
