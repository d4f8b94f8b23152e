"""The C library: finding and loading it, the ctypes prototypes, the pinned enums and errors."""

import ctypes
import ctypes.util
import enum
import os
import subprocess
import sys

# ---------------------------------------------------------------------------------------------
# Enums: values copied from include/flashattn/flashattn.h (pinned for the life of the ABI;
# tests/test_header.py checks them against the header).


class Status(enum.IntEnum):
    SUCCESS = 0
    ERROR_INVALID_ARGUMENT = 1
    ERROR_NOT_SUPPORTED = 2
    ERROR_INVALID_STATE = 3
    ERROR_ALLOCATION = 4
    ERROR_DEVICE = 5
    ERROR_INSUFFICIENT_WORKSPACE = 6
    ERROR_INTERNAL = 7


class DType(enum.IntEnum):
    FP16 = 1
    BF16 = 2
    FP32 = 3
    FP8_E4M3 = 4


class Backend(enum.IntEnum):
    AUTO = 0
    CPU = 1
    FA1 = 2
    FA2 = 3
    FA3 = 4


class I64(enum.IntEnum):
    BATCH = 1
    SEQLEN_Q = 2
    SEQLEN_K = 3
    HEADS_Q = 4
    HEADS_KV = 5
    HEAD_DIM = 6
    HEAD_DIM_V = 7
    DTYPE = 8
    CAUSAL = 9
    WINDOW_LEFT = 10
    WINDOW_RIGHT = 11
    BACKEND = 12
    DEVICE = 13
    VARLEN = 14
    TOTAL_Q = 15
    TOTAL_K = 16
    Q_BATCH_STRIDE = 20
    Q_ROW_STRIDE = 21
    Q_HEAD_STRIDE = 22
    K_BATCH_STRIDE = 23
    K_ROW_STRIDE = 24
    K_HEAD_STRIDE = 25
    V_BATCH_STRIDE = 26
    V_ROW_STRIDE = 27
    V_HEAD_STRIDE = 28
    O_BATCH_STRIDE = 29
    O_ROW_STRIDE = 30
    O_HEAD_STRIDE = 31
    DETERMINISTIC = 32
    DO_BATCH_STRIDE = 33
    DO_ROW_STRIDE = 34
    DO_HEAD_STRIDE = 35
    DQ_BATCH_STRIDE = 36
    DQ_ROW_STRIDE = 37
    DQ_HEAD_STRIDE = 38
    DK_BATCH_STRIDE = 39
    DK_ROW_STRIDE = 40
    DK_HEAD_STRIDE = 41
    DV_BATCH_STRIDE = 42
    DV_ROW_STRIDE = 43
    DV_HEAD_STRIDE = 44
    PAGED_KV = 45  # since 0.3: serving (paged K/V, seqused_k, append with rotary)
    PAGE_SIZE = 46
    NUM_PAGES = 47
    MAX_PAGES_PER_SEQUENCE = 48
    PAGE_TABLE_STRIDE = 49
    SEQUSED_K = 50
    NEW_KV_ROWS = 51
    K_NEW_BATCH_STRIDE = 52
    K_NEW_ROW_STRIDE = 53
    K_NEW_HEAD_STRIDE = 54
    V_NEW_BATCH_STRIDE = 55
    V_NEW_ROW_STRIDE = 56
    V_NEW_HEAD_STRIDE = 57
    ROTARY_DIM = 58
    ROTARY_INTERLEAVED = 59
    MASK_ALIGN = 60  # since 0.3: attention variants
    SINK_TOKENS = 61
    SINK_LOGITS = 62
    ALIBI = 63
    OUTPUT_DTYPE = 64  # since 0.3: FP8 inputs
    DESCALE_BATCH_STRIDE = 65
    DESCALE_HEAD_STRIDE = 66
    NUM_SPLITS = 70  # since 0.3: split-KV parts (0 = auto; after finalize: what the plan runs)


class MaskAlign(enum.IntEnum):
    """Values of I64.MASK_ALIGN (since 0.3): where query i's diagonal key lies."""
    BOTTOM_RIGHT = 0
    TOP_LEFT = 1


class Arg(enum.IntEnum):
    """flashattn_arg_t (since 0.3): the tensors of an argument set (flashattn_args_t)."""
    Q = 1
    K = 2
    V = 3
    O = 4
    LSE = 5
    CU_SEQLENS_Q = 6
    CU_SEQLENS_K = 7
    PAGE_TABLE = 8
    SEQUSED_K = 9
    K_NEW = 10
    V_NEW = 11
    ROTARY_COS = 12
    ROTARY_SIN = 13
    SINK_LOGITS = 20
    ALIBI_SLOPES = 21
    DSINK_LOGITS = 22
    DOUT = 30
    DQ = 31
    DK = 32
    DV = 33
    DESCALE_Q = 40  # since 0.3: FP8 plans' float32 descale factors
    DESCALE_K = 41
    DESCALE_V = 42


class F64(enum.IntEnum):
    SOFTMAX_SCALE = 1
    SOFTCAP = 2


# Header typedef name -> Python enum (the header check uses this; prefix stripped).
ENUMS = {
    "flashattn_status_t": (Status, "FLASHATTN_"),
    "flashattn_dtype_t": (DType, "FLASHATTN_DTYPE_"),
    "flashattn_backend_t": (Backend, "FLASHATTN_BACKEND_"),
    "flashattn_i64_param_t": (I64, "FLASHATTN_I64_"),
    "flashattn_mask_align_t": (MaskAlign, "FLASHATTN_MASK_ALIGN_"),
    "flashattn_arg_t": (Arg, "FLASHATTN_ARG_"),
    "flashattn_f64_param_t": (F64, "FLASHATTN_F64_"),
    "flashattn_arg_t": (Arg, "FLASHATTN_ARG_"),
}

# ---------------------------------------------------------------------------------------------
# Errors


class FlashAttnError(Exception):
    """A libflashattn call failed. ``status`` is the Status, ``message`` the library's message."""

    def __init__(self, status, message, function=None):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.message = message
        self.function = function
        name = STATUS_NAMES.get(int(status), "status %d" % int(status))
        where = "%s: " % function if function else ""
        super().__init__("%s%s (%s)" % (where, message or name, name))


class InvalidArgumentError(FlashAttnError, ValueError):
    """FLASHATTN_ERROR_INVALID_ARGUMENT."""


class NotSupportedError(FlashAttnError, ValueError):
    """FLASHATTN_ERROR_NOT_SUPPORTED: valid, but not by the chosen backend or device."""


class InvalidStateError(FlashAttnError, RuntimeError):
    """FLASHATTN_ERROR_INVALID_STATE: the plan is not in the state the call needs."""


class AllocationError(FlashAttnError, MemoryError):
    """FLASHATTN_ERROR_ALLOCATION."""


class DeviceError(FlashAttnError, RuntimeError):
    """FLASHATTN_ERROR_DEVICE: the CUDA runtime reported an error."""


class InsufficientWorkspaceError(FlashAttnError, ValueError):
    """FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE."""


class InternalError(FlashAttnError, RuntimeError):
    """FLASHATTN_ERROR_INTERNAL: a bug in the library."""


_ERROR_CLASSES = {
    Status.ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    Status.ERROR_NOT_SUPPORTED: NotSupportedError,
    Status.ERROR_INVALID_STATE: InvalidStateError,
    Status.ERROR_ALLOCATION: AllocationError,
    Status.ERROR_DEVICE: DeviceError,
    Status.ERROR_INSUFFICIENT_WORKSPACE: InsufficientWorkspaceError,
    Status.ERROR_INTERNAL: InternalError,
}

STATUS_NAMES = {}  # filled from flashattn_status_string once the library is loaded


class LibraryNotFoundError(OSError):
    """libflashattn could not be loaded; the message lists every place that was tried."""


# ---------------------------------------------------------------------------------------------
# Loading

_SONAMES = ("libflashattn.so.0", "libflashattn.so", "libflashattn.0.dylib", "libflashattn.dylib")


def _pkg_config_libdir():
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "flashattn"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return None, "pkg-config --variable=libdir flashattn: %s" % e
    if out.returncode != 0 or not out.stdout.strip():
        detail = (out.stderr.strip().splitlines()[0] if out.stderr.strip()
                  else "no flashattn.pc found (PKG_CONFIG_PATH=%s)" % os.environ.get("PKG_CONFIG_PATH", ""))
        return None, "pkg-config --variable=libdir flashattn: %s" % detail
    return out.stdout.strip(), None


def _bundled():
    """The library a wheel installed next to this file (pip install bindings/python), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _SONAMES:
        path = os.path.join(here, name)
        if os.path.isfile(path):
            return path
    return None


def _load():
    """(CDLL, where) from, in order: FLASHATTN_LIBRARY, the copy bundled in the package, pkg-config's
    libdir, the system loader. The explicit variable comes first so that one wheel can still be
    pointed at another build (an A/B run, a debug build) without uninstalling it."""
    tried = []
    explicit = os.environ.get("FLASHATTN_LIBRARY")
    if explicit:
        # An explicit path must work: falling back to another copy would hide the mistake.
        try:
            return ctypes.CDLL(explicit), explicit
        except OSError as e:
            raise LibraryNotFoundError(
                "libflashattn: FLASHATTN_LIBRARY=%s could not be loaded: %s" % (explicit, e)) from None
    tried.append("FLASHATTN_LIBRARY (not set)")

    bundled = _bundled()
    if bundled is None:
        tried.append("the package directory %s: no bundled library (installed from source without a "
                     "build, or a PYTHONPATH checkout)" % os.path.dirname(os.path.abspath(__file__)))
    else:
        # The wheel's own copy, built with it: a failure here is a broken install, not a reason to
        # silently use some other libflashattn.
        try:
            return ctypes.CDLL(bundled), bundled
        except OSError as e:
            raise LibraryNotFoundError("libflashattn: the bundled %s could not be loaded: %s" % (bundled, e)) from None

    libdir, problem = _pkg_config_libdir()
    if libdir is None:
        tried.append(problem)
    else:
        for name in _SONAMES:
            path = os.path.join(libdir, name)
            if not os.path.exists(path):
                tried.append("%s (pkg-config libdir): no such file" % path)
                continue
            try:
                return ctypes.CDLL(path), path
            except OSError as e:
                tried.append("%s (pkg-config libdir): %s" % (path, e))

    found = ctypes.util.find_library("flashattn")
    candidates = ([found] if found else []) + ["libflashattn.so.0"]
    if not found:
        tried.append("ctypes.util.find_library('flashattn'): not found")
    for name in candidates:
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append("system loader %s: %s" % (name, e))
    raise LibraryNotFoundError(
        "libflashattn could not be loaded. Install the package with its library (pip install "
        "bindings/python), set FLASHATTN_LIBRARY to the path of libflashattn.so, or make `pkg-config --variable=libdir flashattn` or the system loader find it. Tried:\n  "
        + "\n  ".join(tried))


# ---------------------------------------------------------------------------------------------
# Prototypes: one entry per function of flashattn.h, in the header's order.

c_status = ctypes.c_int  # C enums are passed as int
c_enum = ctypes.c_int
c_plan_p = ctypes.c_void_p  # flashattn_plan_t *
c_stream = ctypes.c_void_p  # flashattn_stream_t
c_args_p = ctypes.c_void_p  # flashattn_args_t *
P = ctypes.POINTER

MAX_MERGE_PARTIALS = 128  # FLASHATTN_MAX_MERGE_PARTIALS


PROTOTYPES = {
    "flashattn_status_string": (ctypes.c_char_p, [c_status]),
    "flashattn_last_error": (ctypes.c_char_p, []),
    "flashattn_last_error_copy": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "flashattn_version": (ctypes.c_uint32, []),
    "flashattn_version_string": (ctypes.c_char_p, []),
    "flashattn_build_info": (ctypes.c_char_p, []),
    "flashattn_device_count": (c_status, [P(ctypes.c_int32)]),
    "flashattn_device_compute_capability": (c_status, [ctypes.c_int32, P(ctypes.c_int32), P(ctypes.c_int32)]),
    "flashattn_plan_create": (c_status, [P(c_plan_p)]),
    "flashattn_plan_destroy": (None, [c_plan_p]),
    "flashattn_plan_set_i64": (c_status, [c_plan_p, c_enum, ctypes.c_int64]),
    "flashattn_plan_set_f64": (c_status, [c_plan_p, c_enum, ctypes.c_double]),
    "flashattn_plan_get_i64": (c_status, [c_plan_p, c_enum, P(ctypes.c_int64)]),
    "flashattn_plan_get_f64": (c_status, [c_plan_p, c_enum, P(ctypes.c_double)]),
    "flashattn_plan_finalize": (c_status, [c_plan_p]),
    "flashattn_plan_get_backend": (c_status, [c_plan_p, P(c_enum), P(ctypes.c_char_p)]),
    "flashattn_plan_get_workspace_size": (c_status, [c_plan_p, P(ctypes.c_size_t)]),
    "flashattn_plan_execute": (c_status, [c_plan_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, P(ctypes.c_float), ctypes.c_void_p,
                                          ctypes.c_size_t, c_stream]),
    "flashattn_plan_execute_varlen": (c_status, [c_plan_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                 ctypes.c_void_p, P(ctypes.c_float), P(ctypes.c_int32),
                                                 P(ctypes.c_int32), ctypes.c_void_p, ctypes.c_size_t,
                                                 c_stream]),
    "flashattn_plan_get_backward_backend": (c_status, [c_plan_p, P(c_enum), P(ctypes.c_char_p)]),
    "flashattn_plan_get_backward_workspace_size": (c_status, [c_plan_p, P(ctypes.c_size_t)]),
    "flashattn_plan_execute_backward": (c_status, [c_plan_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_void_p, P(ctypes.c_float),
                                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_size_t, c_stream]),
    "flashattn_plan_execute_backward_varlen": (c_status, [c_plan_p, ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                          P(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_void_p, P(ctypes.c_int32), P(ctypes.c_int32),
                                                          ctypes.c_void_p, ctypes.c_size_t, c_stream]),
    "flashattn_args_create": (c_status, [P(c_args_p)]),
    "flashattn_args_destroy": (None, [c_args_p]),
    "flashattn_args_set": (c_status, [c_args_p, c_enum, ctypes.c_void_p]),
    "flashattn_args_get": (c_status, [c_args_p, c_enum, P(ctypes.c_void_p)]),
    "flashattn_plan_execute_args": (c_status, [c_plan_p, c_args_p, ctypes.c_void_p, ctypes.c_size_t, c_stream]),
    "flashattn_plan_execute_backward_args": (c_status, [c_plan_p, c_args_p, ctypes.c_void_p, ctypes.c_size_t,
                                                        c_stream]),
    "flashattn_plan_merge_states": (c_status, [c_plan_p, ctypes.c_int32, P(ctypes.c_void_p),
                                               P(P(ctypes.c_float)), c_enum, ctypes.c_void_p, P(ctypes.c_float),
                                               c_stream]),
    "flashattn_rotate_hadamard": (c_status, [c_enum, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int32,
                                             c_stream]),
}


# Functions added after 0.1: a library without them still loads, and calling one raises.
SINCE = {
    "flashattn_plan_get_backward_backend": "0.2",
    "flashattn_plan_get_backward_workspace_size": "0.2",
    "flashattn_plan_execute_backward": "0.2",
    "flashattn_plan_execute_backward_varlen": "0.2",
    "flashattn_args_create": "0.3",
    "flashattn_args_destroy": "0.3",
    "flashattn_args_set": "0.3",
    "flashattn_args_get": "0.3",
    "flashattn_plan_execute_args": "0.3",
    "flashattn_plan_execute_backward_args": "0.3",
    "flashattn_plan_merge_states": "0.3",
    "flashattn_rotate_hadamard": "0.3",
}


def _missing(name, path):
    def fn(*args):
        raise NotSupportedError(Status.ERROR_NOT_SUPPORTED,
                                "the loaded library (%s, %s) lacks %s (libflashattn >= %s)"
                                % (path, lib().flashattn_version_string().decode(), name, SINCE[name]), name)
    return fn


class _Lib:
    """The loaded library with typed functions as attributes (lib.flashattn_plan_create, ...)."""

    def __init__(self):
        self.cdll, self.path = _load()
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(self.cdll, name)
            except AttributeError:
                if name in SINCE:  # newer than the loaded library: fails when called, not at load
                    setattr(self, name, _missing(name, self.path))
                    continue
                raise LibraryNotFoundError("%s (loaded from %s) lacks %s: not a compatible libflashattn"
                                           % (self.cdll._name, self.path, name)) from None
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        major = self.flashattn_version() // 10000
        if major != 0:
            raise LibraryNotFoundError("%s is libflashattn %s; this binding needs major version 0"
                                       % (self.path, self.flashattn_version_string().decode()))
        for s in Status:
            STATUS_NAMES[int(s)] = self.flashattn_status_string(int(s)).decode()

    def last_error(self):
        """This thread's last error message (copied: the library's pointer is borrowed)."""
        size = self.flashattn_last_error_copy(None, 0)
        buf = ctypes.create_string_buffer(size + 1)
        self.flashattn_last_error_copy(buf, size + 1)
        return buf.value.decode("utf-8", "replace")

    def check(self, status, function):
        """Raise the FlashAttnError subclass for a failed status (message fetched on this thread)."""
        if status == Status.SUCCESS:
            return
        cls = _ERROR_CLASSES.get(status, FlashAttnError)
        raise cls(status, self.last_error(), function)


_lib = None


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


def call(name, *args):
    """Call a status-returning function and raise on failure."""
    l = lib()
    l.check(getattr(l, name)(*args), name)


# ---------------------------------------------------------------------------------------------
# Library and device information


def version():
    """Run-time version as (major, minor, patch)."""
    v = lib().flashattn_version()
    return (v // 10000, v // 100 % 100, v % 100)


def version_string():
    return lib().flashattn_version_string().decode()


def build_info():
    """The build description as a dict: {'cuda': '13.0', 'archs': [...], 'backends': [...]}."""
    text = lib().flashattn_build_info().decode()
    info = {}
    for item in text.split(";"):
        if "=" in item:
            key, value = item.split("=", 1)
            info[key] = [v for v in value.split(",") if v] if key in ("archs", "backends") else value
    return info


def build_info_string():
    return lib().flashattn_build_info().decode()


def device_count():
    count = ctypes.c_int32()
    call("flashattn_device_count", ctypes.byref(count))
    return count.value


def device_compute_capability(device=0):
    major, minor = ctypes.c_int32(), ctypes.c_int32()
    call("flashattn_device_compute_capability", int(device), ctypes.byref(major), ctypes.byref(minor))
    return (major.value, minor.value)


def status_string(status):
    return lib().flashattn_status_string(int(status)).decode()


def library_path():
    """Where the loaded library came from (the path or name given to the loader)."""
    return lib().path


if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("flashattn: the binding assumes a little-endian host")
