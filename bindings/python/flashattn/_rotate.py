"""flashattn_rotate_hadamard (since 0.3): the random-sign Hadamard rotation of Q and K that makes
their FP8 quantization robust to outliers while leaving Q·Kᵀ unchanged."""

from ._capi import call
from ._plan import parse_dtype
from ._tensors import as_tensor, stream_handle


def _rows(ref, name):
    """(rows, dim, row stride) of a tensor [..., dim] whose leading dimensions are one strided axis."""
    if not ref.shape:
        raise ValueError("%s: needs at least one dimension" % name)
    dim = ref.shape[-1]
    if dim > 1 and ref.strides[-1] != 1:
        raise ValueError("%s: the last dimension must be contiguous" % name)
    rows = 1
    for n in ref.shape[:-1]:
        rows *= n
    stride = ref.strides[-2] if len(ref.shape) > 1 else dim
    expect = stride
    for i in range(len(ref.shape) - 2, 0, -1):  # every leading axis must step over the ones after it
        expect *= ref.shape[i]
        if ref.shape[i - 1] > 1 and ref.strides[i - 1] != expect:
            raise ValueError("%s: its leading dimensions must collapse into one strided row axis" % name)
    return rows, dim, stride


def rotate_hadamard(src, dst=None, seed=0, stream=None):
    """Rotate every row (the last dimension, a power of two in [8, 256]) of src by the random-sign
    Hadamard matrix of `seed` scaled by 1/sqrt(dim), into dst (None: in place). Rotate Q and K of
    one attention with the same seed. fp16/bf16/float32 arrays on the host (numpy, torch CPU) or on
    a CUDA device (torch, cupy: the kernel is enqueued on `stream`)."""
    s = as_tensor(src, "src")
    d = s if dst is None else as_tensor(dst, "dst")
    if s.shape != d.shape:
        raise ValueError("dst: shape %s, src is %s" % (list(d.shape), list(s.shape)))
    if s.dtype_name != d.dtype_name:
        raise TypeError("dst: %s, src is %s" % (d.dtype_name, s.dtype_name))
    if s.device != d.device:
        raise ValueError("dst: on another device than src")
    rows, dim, ss = _rows(s, "src")
    _, _, ds = _rows(d, "dst")
    device = -1 if s.device is None else int(s.device)
    call("flashattn_rotate_hadamard", int(parse_dtype(s.dtype_name)), rows, dim, s.ptr, ss, d.ptr, ds,
         int(seed) & 0xFFFFFFFFFFFFFFFF, device, stream_handle(stream) or None)
    return dst if dst is not None else src
