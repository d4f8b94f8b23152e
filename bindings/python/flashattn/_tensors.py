"""Turning array objects into (pointer, shape, element strides, dtype, device) without copying.

Host: numpy arrays (float32, float16, bfloat16 from ml_dtypes) and PyTorch CPU tensors.
Device: PyTorch CUDA tensors (read directly, so bfloat16 works), any object exposing
``__cuda_array_interface__`` (CuPy, Numba, ...), and any object exposing ``__dlpack__``.
Nothing here imports torch or cupy: an object is only recognised as a torch tensor when torch is
already imported by the caller.
"""

import ctypes
import sys

from ._capi import DType

# E4M3 arrays: torch.float8_e4m3fn or ml_dtypes' float8_e4m3fn; raw uint8 bytes are accepted as
# FP8 by the plan's check (Plan._check_refs) since numpy has no FP8 type of its own.
_FLOAT_DTYPES = {"float16": DType.FP16, "bfloat16": DType.BF16, "float32": DType.FP32, "float8_e4m3fn": DType.FP8_E4M3}
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "uint8": 1, "int8": 1, "int64": 8,
             "float64": 8, "float8_e4m3fn": 1}


class TensorRef:
    """What the C API needs to know about one tensor argument."""

    __slots__ = ("obj", "ptr", "shape", "strides", "dtype_name", "itemsize", "device", "kind",
                 "keepalive", "writeable")

    def __init__(self, obj, ptr, shape, strides, dtype_name, itemsize, device, kind, keepalive=None,
                 writeable=True):
        self.obj = obj
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)  # in elements
        self.dtype_name = dtype_name
        self.itemsize = itemsize
        self.device = device  # None for host memory, else the CUDA device ordinal (int)
        self.kind = kind  # "numpy", "torch", "cupy", "cai", "dlpack"
        self.keepalive = keepalive
        self.writeable = writeable

    @property
    def on_host(self):
        return self.device is None

    @property
    def flash_dtype(self):
        return _FLOAT_DTYPES.get(self.dtype_name)

    @property
    def span_bytes(self):
        """Bytes from ptr to one past the last element (0 when empty)."""
        if any(s == 0 for s in self.shape):
            return 0
        end = 1
        for n, st in zip(self.shape, self.strides):
            if st > 0:
                end += (n - 1) * st
        return end * self.itemsize

    @property
    def is_contiguous(self):
        expected = 1
        for n, st in reversed(list(zip(self.shape, self.strides))):
            if n != 1 and st != expected:
                return False
            expected *= n
        return True

    def describe(self):
        where = "host" if self.on_host else "cuda:%d" % self.device
        return "%s %s%s on %s" % (self.kind, self.dtype_name, list(self.shape), where)


def _torch():
    return sys.modules.get("torch")


def is_torch_tensor(obj):
    torch = _torch()
    return torch is not None and isinstance(obj, torch.Tensor)


def _from_numpy(arr, name):
    import numpy as np

    if not arr.dtype.isnative and arr.dtype.itemsize > 1:
        raise TypeError("%s: numpy array with non-native byte order (%s); use arr.astype(arr.dtype.newbyteorder('='))"
                        % (name, arr.dtype))
    dtype_name = arr.dtype.name
    itemsize = arr.dtype.itemsize
    strides = []
    for n, st in zip(arr.shape, arr.strides):
        if st % itemsize:
            raise ValueError("%s: byte stride %d is not a multiple of the element size %d" % (name, st, itemsize))
        strides.append(st // itemsize)
    return TensorRef(arr, arr.__array_interface__["data"][0], arr.shape, strides, dtype_name, itemsize, None,
                     "numpy", writeable=bool(arr.flags.writeable))


_TORCH_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32",
                 "torch.int32": "int32", "torch.uint8": "uint8", "torch.int64": "int64",
                 "torch.float64": "float64", "torch.int8": "int8", "torch.float8_e4m3fn": "float8_e4m3fn"}


def _from_torch(t, name):
    dtype_name = _TORCH_DTYPES.get(str(t.dtype))
    if dtype_name is None:
        raise TypeError("%s: unsupported torch dtype %s" % (name, t.dtype))
    if t.device.type == "cuda":
        device = t.device.index if t.device.index is not None else _torch().cuda.current_device()
    elif t.device.type == "cpu":
        device = None
    else:
        raise TypeError("%s: torch tensor on device '%s'; libflashattn takes CPU or CUDA tensors" % (name, t.device))
    return TensorRef(t, t.data_ptr(), t.shape, t.stride(), dtype_name, t.element_size(), device, "torch")


_TYPESTR = {"<f2": "float16", "<f4": "float32", "<i4": "int32", "|u1": "uint8", "<u1": "uint8", "|i1": "int8",
            "<i8": "int64", "<f8": "float64"}


def _from_cai(obj, name):
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    dtype_name = _TYPESTR.get(typestr)
    if dtype_name is None and typestr in ("<V2", "|V2"):
        descr = cai.get("descr") or []
        if descr and "bfloat16" in str(descr):
            dtype_name = "bfloat16"
    if dtype_name is None:
        raise TypeError("%s: unsupported __cuda_array_interface__ typestr %r" % (name, typestr))
    itemsize = _ITEMSIZE[dtype_name]
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides = list(reversed(strides))
    else:
        strides = []
        for st in cai["strides"]:
            if st % itemsize:
                raise ValueError("%s: byte stride %d is not a multiple of the element size %d" % (name, st, itemsize))
            strides.append(st // itemsize)
    ptr, readonly = cai["data"]
    device = _device_of(obj)
    kind = "cupy" if type(obj).__module__.split(".")[0] == "cupy" else "cai"
    return TensorRef(obj, ptr or 0, shape, strides, dtype_name, itemsize, device, kind, writeable=not readonly)


def _device_of(obj):
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):
        value = getattr(dev, attr, None)
        if isinstance(value, int):
            return value
    return 0


# DLPack (legacy, unversioned capsule "dltensor"): read the DLManagedTensor in place, keep the
# capsule alive while the pointer is used; the capsule's destructor frees the tensor later.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DTYPES = {(0, 32): "int32", (0, 64): "int64", (0, 8): "int8", (1, 8): "uint8", (2, 16): "float16",
              (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16"}


def _from_dlpack(obj, name, stream):
    try:
        capsule = obj.__dlpack__(stream=stream) if stream is not None else obj.__dlpack__()
    except TypeError:
        capsule = obj.__dlpack__()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, b"dltensor")
    t = _DLTensor.from_address(address)  # DLManagedTensor starts with its DLTensor
    dtype_name = _DL_DTYPES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype_name is None:
        raise TypeError("%s: unsupported DLPack dtype (code %d, bits %d, lanes %d)"
                        % (name, t.dtype.code, t.dtype.bits, t.dtype.lanes))
    itemsize = t.dtype.bits // 8
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
    else:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides = list(reversed(strides))
    if t.device.device_type in (_DL_CPU, _DL_CUDA_HOST):
        device = None
    elif t.device.device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = t.device.device_id
    else:
        raise TypeError("%s: DLPack device type %d is neither CPU nor CUDA" % (name, t.device.device_type))
    ptr = (t.data or 0) + t.byte_offset
    return TensorRef(obj, ptr, shape, strides, dtype_name, itemsize, device, "dlpack", keepalive=capsule)


def as_tensor(obj, name, stream=None):
    """A TensorRef for obj, or TypeError naming what was expected."""
    if isinstance(obj, TensorRef):
        return obj
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _from_numpy(obj, name)
    if is_torch_tensor(obj):
        return _from_torch(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name, stream)
    raise TypeError("%s: expected a numpy array, a torch tensor, or an object with __cuda_array_interface__ "
                    "or __dlpack__; got %s" % (name, type(obj).__name__))


def stream_handle(stream):
    """A cudaStream_t as an int from an int, a torch/cupy stream or a __cuda_stream__ object."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        value = stream.__cuda_stream__()
        return int(value[1]) if isinstance(value, tuple) else int(value)
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError("stream: expected an int (cudaStream_t), a torch.cuda.Stream, a cupy Stream or an object "
                    "with __cuda_stream__; got %s" % type(stream).__name__)


def current_stream(ref):
    """The stream a library's own kernels would use now for this tensor, or 0 (legacy default)."""
    if ref is None or ref.on_host:
        return 0
    if ref.kind == "torch":
        return _torch().cuda.current_stream(ref.device).cuda_stream
    if ref.kind == "cupy":
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.get_current_stream().ptr
    return 0


class Allocator:
    """Allocates outputs and workspaces next to a reference tensor: numpy on the host, torch or
    cupy (the reference tensor's own library when it has one) on a CUDA device, on a given stream."""

    def __init__(self, ref, stream):
        self.ref = ref
        self.stream = stream
        if ref.on_host:
            self.kind = "numpy" if ref.kind != "torch" else "torch"
        elif ref.kind in ("torch", "cupy"):
            self.kind = ref.kind
        elif _torch() is not None:
            self.kind = "torch"
        else:
            try:
                import cupy  # noqa: F401
                self.kind = "cupy"
            except ImportError:
                try:
                    import torch  # noqa: F401
                    self.kind = "torch"
                except ImportError:
                    raise TypeError("%s: cannot allocate outputs next to it; pass torch or cupy tensors, or out="
                                    % ref.describe()) from None

    def empty(self, shape, dtype_name):
        if self.kind == "numpy":
            import numpy as np
            if dtype_name == "bfloat16":
                import ml_dtypes
                return np.empty(shape, dtype=ml_dtypes.bfloat16)
            return np.empty(shape, dtype=dtype_name)
        if self.kind == "torch":
            torch = _torch() or __import__("torch")
            device = torch.device("cpu") if self.ref.on_host else torch.device("cuda", self.ref.device)
            dtype = getattr(torch, dtype_name)
            if self.ref.on_host or self.stream is None:
                return torch.empty(shape, dtype=dtype, device=device)
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.ExternalStream(self.stream, device=device)):
                return torch.empty(shape, dtype=dtype, device=device)
        import cupy
        with cupy.cuda.Device(self.ref.device):
            if self.stream is None:
                return cupy.empty(shape, dtype=dtype_name)
            with cupy.cuda.ExternalStream(self.stream):
                return cupy.empty(shape, dtype=dtype_name)

    def workspace(self, nbytes):
        """(owner, aligned pointer) of at least nbytes, aligned to 256 bytes."""
        buf = self.empty((nbytes + 256,), "uint8")
        ref = as_tensor(buf, "workspace")
        aligned = (ref.ptr + 255) // 256 * 256
        return buf, aligned
