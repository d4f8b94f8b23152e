"""libflashattn from Python: exact FlashAttention forward attention over the library's C ABI.

    import numpy as np, flashattn
    q = np.random.randn(1, 128, 8, 64).astype(np.float32)
    o, lse = flashattn.attention(q, q, q, causal=True, return_lse=True)

The library is found through FLASHATTN_LIBRARY (a path), then ``pkg-config --variable=libdir
flashattn``, then the system loader. ``Plan`` mirrors the C plan for repeated calls and raw
device pointers.
"""

from ._capi import (AllocationError, Backend, DeviceError, DType, F64, FlashAttnError, I64, InsufficientWorkspaceError,
                    InternalError, InvalidArgumentError, InvalidStateError, LibraryNotFoundError, NotSupportedError,
                    Status, build_info, build_info_string, device_compute_capability, device_count, library_path,
                    status_string, version, version_string)
from ._plan import Plan
from ._attention import attention

__all__ = [
    "attention", "Plan", "Status", "DType", "Backend", "I64", "F64",
    "FlashAttnError", "InvalidArgumentError", "NotSupportedError", "InvalidStateError", "AllocationError",
    "DeviceError", "InsufficientWorkspaceError", "InternalError", "LibraryNotFoundError",
    "version", "version_string", "build_info", "build_info_string", "device_count",
    "device_compute_capability", "status_string", "library_path",
]
__version__ = "0.1.0"
