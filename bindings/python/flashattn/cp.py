"""Context parallelism (ring attention) from libflashattn_cp, an optional library of its own.

EXPERIMENTAL, like its C header (include/flashattn/flashattn_cp.h): one sequence of S = W * L
tokens split over W ranks, each holding L rows of Q, K and V. Non-causal: rank r holds global
tokens [r L, (r + 1) L). Causal (zigzag, load-balanced): 2W chunks of L / 2 tokens, rank r holds
chunk r then chunk 2W - 1 - r; ``shard_rows`` gives the global rows of a rank in its local order.

    import flashattn, flashattn.cp as cp
    local = flashattn.Plan(batch=1, seqlen_q=L, seqlen_k=L, heads_q=8, head_dim=64,
                           dtype="bf16", causal=True)
    ring = cp.CpPlan(local, world_size=W, transport="nccl", rank=r, nccl_comm=comm_address)
    ring.execute([q], [k], [v], [o], [lse], workspace=(ptr, ring.workspace_size), stream=s)
    ring.execute_backward([q], [k], [v], [o], [dout], [lse], [dq], [dk], [dv],
                          workspace=(ptr2, ring.backward_workspace_size), stream=s)

The library is found through FLASHATTN_CP_LIBRARY (a path), then next to the loaded libflashattn,
then ``pkg-config --variable=libdir flashattn_cp``, then the system loader. ``available()`` says
whether it loaded; nothing else in the flashattn package needs it.
"""

import ctypes
import ctypes.util
import enum
import os
import subprocess

from . import _capi
from ._capi import Status
from ._plan import Plan, _c_ptr, _pointer, check_refs

__all__ = ["Transport", "I64", "CpPlan", "available", "library_path", "shard_rows", "load_error"]


class Transport(enum.IntEnum):
    """flashattn_cp_transport_t (provisional values, as the header says)."""
    LOOPBACK = 1
    NCCL = 2


class I64(enum.IntEnum):
    """flashattn_cp_i64_param_t."""
    WORLD_SIZE = 1
    RANK = 2
    TRANSPORT = 3


# Header typedef name -> Python enum (tests/test_header.py checks them against flashattn_cp.h).
ENUMS = {
    "flashattn_cp_transport_t": (Transport, "FLASHATTN_CP_TRANSPORT_"),
    "flashattn_cp_i64_param_t": (I64, "FLASHATTN_CP_I64_"),
}

_SONAMES = ("libflashattn_cp.so.0", "libflashattn_cp.so")
c_status = ctypes.c_int
c_plan_p = ctypes.c_void_p
P = ctypes.POINTER
_PP = P(ctypes.c_void_p)
_PPF = P(P(ctypes.c_float))
PROTOTYPES = {
    "flashattn_cp_last_error": (ctypes.c_char_p, []),
    "flashattn_cp_plan_create": (c_status, [P(c_plan_p)]),
    "flashattn_cp_plan_destroy": (None, [c_plan_p]),
    "flashattn_cp_plan_set_i64": (c_status, [c_plan_p, ctypes.c_int, ctypes.c_int64]),
    "flashattn_cp_plan_set_nccl_comm": (c_status, [c_plan_p, ctypes.c_void_p]),
    "flashattn_cp_plan_finalize": (c_status, [c_plan_p, ctypes.c_void_p]),
    "flashattn_cp_plan_get_workspace_size": (c_status, [c_plan_p, P(ctypes.c_size_t)]),
    "flashattn_cp_plan_execute": (c_status, [c_plan_p, ctypes.c_int32, _PP, _PP, _PP, _PP, P(P(ctypes.c_float)),
                                             ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "flashattn_cp_plan_get_backward_workspace_size": (c_status, [c_plan_p, P(ctypes.c_size_t)]),
    "flashattn_cp_plan_execute_backward": (c_status, [c_plan_p, ctypes.c_int32, _PP, _PP, _PP, _PP, _PP, _PPF, _PP,
                                                      _PP, _PP, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
}
# Declared after the forward (the ring backward): a libflashattn_cp built before them still loads,
# and these raise NotSupportedError when called (as the core's newer functions do).
_LATER = ("flashattn_cp_plan_get_backward_workspace_size", "flashattn_cp_plan_execute_backward")

_cp = None
_load_error = None


def _candidates():
    explicit = os.environ.get("FLASHATTN_CP_LIBRARY")
    if explicit:
        return [explicit], True
    paths = []
    core = _capi.library_path()
    if os.path.sep in core:
        paths += [os.path.join(os.path.dirname(core), n) for n in _SONAMES]
        # A build tree keeps the component in cp/ beside src/.
        paths += [os.path.join(os.path.dirname(os.path.dirname(core)), "cp", n) for n in _SONAMES]
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "flashattn_cp"], capture_output=True, text=True,
                             timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            paths += [os.path.join(out.stdout.strip(), n) for n in _SONAMES]
    except (OSError, subprocess.SubprocessError):
        pass
    found = ctypes.util.find_library("flashattn_cp")
    paths += ([found] if found else []) + ["libflashattn_cp.so.0"]
    return paths, False


def _lib():
    """The loaded libflashattn_cp (the core is loaded first: the component links against it)."""
    global _cp, _load_error
    if _cp is not None:
        return _cp
    _capi.lib()
    paths, explicit = _candidates()
    tried = []
    for path in paths:
        if os.path.sep in path and not os.path.exists(path):
            tried.append("%s: no such file" % path)
            continue
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s: %s" % (path, e))
            continue
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                if name not in _LATER:
                    raise
                setattr(cdll, name, _missing(name, path))
                continue
            fn.restype, fn.argtypes = restype, argtypes
        cdll.path = path
        _cp = cdll
        return _cp
    _load_error = ("libflashattn_cp could not be loaded (%s). It is built with the core when "
                   "FLASHATTN_BUILD_CP is on; set FLASHATTN_CP_LIBRARY to its path. Tried:\n  %s"
                   % ("FLASHATTN_CP_LIBRARY" if explicit else "search", "\n  ".join(tried)))
    raise _capi.LibraryNotFoundError(_load_error)


def _missing(name, path):
    def fn(*args):
        raise _capi.NotSupportedError(Status.ERROR_NOT_SUPPORTED, "the loaded libflashattn_cp (%s) lacks %s "
                                      "(built before the ring backward)" % (path, name), name)
    return fn


def available():
    """True when libflashattn_cp loads (and the core library does)."""
    try:
        _lib()
        return True
    except OSError:
        return False


def load_error():
    """Why libflashattn_cp did not load (None when it did or was not tried)."""
    return _load_error


def library_path():
    return _lib().path


def _check(status, function):
    if status == Status.SUCCESS:
        return
    message = _lib().flashattn_cp_last_error().decode("utf-8", "replace")
    cls = _capi._ERROR_CLASSES.get(status, _capi.FlashAttnError)
    raise cls(status, message, function)


def _call(name, *args):
    _check(getattr(_lib(), name)(*args), name)


def shard_rows(world_size, rank, local_rows, causal):
    """The global rows (a list of ints, in local order) rank holds: zigzag when causal."""
    if not 0 <= rank < world_size:
        raise ValueError("rank %d is not in 0..%d" % (rank, world_size - 1))
    if not causal:
        return list(range(rank * local_rows, (rank + 1) * local_rows))
    if local_rows % 2:
        raise ValueError("local_rows = %d: the causal zigzag layout needs an even number" % local_rows)
    c = local_rows // 2
    second = 2 * world_size - 1 - rank
    return list(range(rank * c, (rank + 1) * c)) + list(range(second * c, (second + 1) * c))


class CpPlan:
    """flashattn_cp_plan_t, finalized from a finalized core Plan describing one rank's share.

    transport: "loopback" (this process plays all world_size ranks: execute takes W tensors per
    list; on the CPU or one GPU) or "nccl" (one rank; nccl_comm is the ncclComm_t as an int address,
    e.g. from torch's ProcessGroupNCCL or cupy.cuda.nccl.NcclCommunicator.comm)."""

    def __init__(self, local, world_size, transport="loopback", rank=0, nccl_comm=None):
        lib = _lib()
        if not isinstance(local, Plan):
            raise TypeError("local: a flashattn.Plan, got %s" % type(local).__name__)
        if isinstance(transport, str):
            try:
                transport = Transport[transport.upper()]
            except KeyError:
                raise ValueError("transport: %r is not 'loopback' or 'nccl'" % transport) from None
        handle = ctypes.c_void_p()
        _call("flashattn_cp_plan_create", ctypes.byref(handle))
        self._handle = handle
        self._lib = lib
        try:
            self.set_i64(I64.WORLD_SIZE, world_size)
            self.set_i64(I64.RANK, rank)
            self.set_i64(I64.TRANSPORT, transport)
            if nccl_comm is not None:
                _call("flashattn_cp_plan_set_nccl_comm", self._handle, ctypes.c_void_p(int(nccl_comm)))
            if not _finalized(local):
                local.finalize()
            _call("flashattn_cp_plan_finalize", self._handle, local.handle)
        except BaseException:
            self.close()
            raise
        self.world_size = int(world_size)
        self.transport = Transport(transport)
        self.local_ranks = self.world_size if self.transport == Transport.LOOPBACK else 1
        self._local = local
        # What each rank's tensors are checked against (the C ring keeps no reference to the local
        # plan either, so the caller may close it).
        self._extents = local.extents()
        self._per_head_bytes = 4 * local.get_i64(_capi.I64.HEADS_Q)
        self._backend = local.backend
        try:
            self._backward_backend = local.backward_backend
        except _capi.NotSupportedError:
            self._backward_backend = None

    def set_i64(self, key, value):
        _call("flashattn_cp_plan_set_i64", self.handle, int(key), int(value))

    @property
    def handle(self):
        if not self._handle:
            raise ValueError("CpPlan: closed")
        return self._handle

    def close(self):
        if getattr(self, "_handle", None):
            self._lib.flashattn_cp_plan_destroy(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def workspace_size(self):
        size = ctypes.c_size_t()
        _call("flashattn_cp_plan_get_workspace_size", self.handle, ctypes.byref(size))
        return size.value

    @property
    def backward_workspace_size(self):
        """Bytes of workspace each execute_backward needs (separate from workspace_size);
        NotSupportedError when the local plan's backend has no backward pass for this problem."""
        size = ctypes.c_size_t()
        _call("flashattn_cp_plan_get_backward_workspace_size", self.handle, ctypes.byref(size))
        return size.value

    def _lists(self, lists):
        for name, values in lists.items():
            if len(values) != self.local_ranks:
                raise ValueError("%s: %d tensors, this plan's process plays %d rank(s)"
                                 % (name, len(values), self.local_ranks))

    def _addresses(self, refs, name, values, ctype=None, allow_none=False, check=None):
        """A C array of the local_ranks addresses of values (void*, or ctype* when given); the
        arrays/tensors are appended to refs (kept alive through the call). check: (backend,
        output names): each array/tensor is checked against the local plan as its own execute
        checks it (memory kind, dtype, span; int addresses are the caller's word)."""
        n = self.local_ranks
        if ctype is None:
            out = (ctypes.c_void_p * n)()
        else:
            out = (P(ctype) * n)()
        for i, value in enumerate(values):
            ptr, ref = _pointer(value, "%s[%d]" % (name, i), allow_none=allow_none)
            if check is not None and ref is not None:
                try:
                    check_refs(self._extents, check[0], {name: ref}, check[1], self._per_head_bytes)
                except (TypeError, ValueError) as e:
                    raise type(e)("rank %d: %s" % (i, e)) from None
            refs.append(ref)
            out[i] = ptr if ctype is None else _c_ptr(ptr, ctype)
        return ctypes.cast(out, _PP if ctype is None else P(P(ctype)))

    def _workspace_arg(self, workspace, size_of):
        """(address, bytes, owner) of the caller's workspace, or when None of a host one of
        size_of() bytes allocated here (owner: keep it alive through the call)."""
        keep = None
        if workspace is None:
            need = size_of()
            if need > 0:
                keep = _host_workspace(need)
                workspace = (ctypes.addressof(keep) + (-ctypes.addressof(keep)) % 256, need)
        ws_ptr, ws_bytes = self._local._workspace(workspace)
        return ws_ptr, ws_bytes, keep

    def execute(self, q, k, v, o, lse=None, workspace=None, stream=None):
        """flashattn_cp_plan_execute. q, k, v, o: lists of local_ranks tensors (arrays, torch/cupy
        tensors or int addresses); lse None or a list (entries may be None) of float32
        [batch, heads_q, L]. workspace: an array/tensor or (address, bytes); None on the CPU
        allocates one here. stream: an int, a torch/cupy stream or None."""
        n = self.local_ranks
        lists = {"q": q, "k": k, "v": v, "o": o}
        self._lists(lists)
        refs = []  # keep the arrays alive through the call
        check = (self._backend, ("o", "lse"))
        ptrs = {name: self._addresses(refs, name, values, check=check) for name, values in lists.items()}
        lse_arg = None
        if lse is not None:
            if len(lse) != n:
                raise ValueError("lse: %d entries, this plan's process plays %d rank(s)" % (len(lse), n))
            lse_arg = self._addresses(refs, "lse", lse, ctype=ctypes.c_float, allow_none=True, check=check)
        ws_ptr, ws_bytes, keep = self._workspace_arg(workspace, lambda: self.workspace_size)
        s = _capi_stream(stream)
        _call("flashattn_cp_plan_execute", self.handle, n, ptrs["q"], ptrs["k"], ptrs["v"], ptrs["o"], lse_arg,
              ws_ptr, ws_bytes, s)
        del refs, keep

    def execute_backward(self, q, k, v, o, dout, lse, dq, dk, dv, workspace=None, stream=None):
        """flashattn_cp_plan_execute_backward: writes every rank's dq, dk, dv (layouts of its q, k,
        v; gradients with respect to the whole sequence, restricted to the rank's rows) from the
        forward's q, k, v, o and lse (required: float32 [batch, heads_q, L] per rank) and dout
        (layout of o). Lists of local_ranks tensors as in execute(). workspace: an array/tensor or
        (address, bytes) of at least backward_workspace_size bytes; None on the CPU allocates one
        here. stream: an int, a torch/cupy stream or None."""
        n = self.local_ranks
        if lse is None:
            raise TypeError("lse: required by the backward pass (the forward's, one per rank)")
        lists = {"q": q, "k": k, "v": v, "o": o, "dout": dout, "dq": dq, "dk": dk, "dv": dv}
        self._lists(dict(lists, lse=lse))
        if self._backward_backend is None:
            self.backward_workspace_size  # raises NotSupportedError with the library's reason
        refs = []  # keep the arrays alive through the call
        check = (self._backward_backend, ("dq", "dk", "dv"))
        ptrs = {name: self._addresses(refs, name, values, check=check) for name, values in lists.items()}
        lse_arg = self._addresses(refs, "lse", lse, ctype=ctypes.c_float, check=check)
        ws_ptr, ws_bytes, keep = self._workspace_arg(workspace, lambda: self.backward_workspace_size)
        s = _capi_stream(stream)
        _call("flashattn_cp_plan_execute_backward", self.handle, n, ptrs["q"], ptrs["k"], ptrs["v"], ptrs["o"],
              ptrs["dout"], lse_arg, ptrs["dq"], ptrs["dk"], ptrs["dv"], ws_ptr, ws_bytes, s)
        del refs, keep


def _finalized(plan):
    try:
        plan.workspace_size
        return True
    except _capi.InvalidStateError:
        return False


def _host_workspace(nbytes):
    """Host memory with room to align the start to 256 bytes (the CPU backend's workspace)."""
    return (ctypes.c_char * (nbytes + 256))()


def _capi_stream(stream):
    from ._tensors import stream_handle
    return stream_handle(stream) or None
