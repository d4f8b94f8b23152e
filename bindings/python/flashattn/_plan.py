"""Plan: the C plan's lifecycle (create, set, finalize, execute, destroy) as a Python object."""

import ctypes
import weakref

from . import _capi
from ._capi import I64, F64, Arg, Backend, DType, Status, call, lib
from ._tensors import TensorRef, as_tensor, stream_handle

_I64_NAMES = {k.name.lower(): k for k in I64}
_F64_NAMES = {k.name.lower(): k for k in F64}
_F64_NAMES["scale"] = F64.SOFTMAX_SCALE
_BACKEND_NAMES = {b.name.lower(): b for b in Backend}
_DTYPE_NAMES = {"fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16, "bf16": DType.BF16,
                "bfloat16": DType.BF16, "fp32": DType.FP32, "float32": DType.FP32, "fp8_e4m3": DType.FP8_E4M3}


def parse_backend(value):
    if isinstance(value, Backend):
        return value
    if isinstance(value, str):
        try:
            return _BACKEND_NAMES[value.lower()]
        except KeyError:
            raise ValueError("backend: %r is not one of %s" % (value, ", ".join(_BACKEND_NAMES))) from None
    return Backend(int(value))


def parse_dtype(value):
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        try:
            return _DTYPE_NAMES[value.lower()]
        except KeyError:
            raise ValueError("dtype: %r is not one of %s" % (value, ", ".join(_DTYPE_NAMES))) from None
    name = getattr(value, "name", None)  # a numpy dtype or scalar type
    if name is None and isinstance(value, type):
        name = value.__name__
    if isinstance(name, str) and name.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[name.lower()]
    return DType(int(value))


def _key(key):
    """(is_i64, enum) for an I64/F64 member or a lower-case name ('batch', 'softcap', ...)."""
    if isinstance(key, I64):
        return True, key
    if isinstance(key, F64):
        return False, key
    if isinstance(key, str):
        k = key.lower()
        if k in _I64_NAMES:
            return True, _I64_NAMES[k]
        if k in _F64_NAMES:
            return False, _F64_NAMES[k]
        raise KeyError("unknown plan parameter %r (I64: %s; F64: %s)" % (key, ", ".join(_I64_NAMES), ", ".join(_F64_NAMES)))
    raise TypeError("plan parameter key: expected flashattn.I64, flashattn.F64 or a name, got %r" % (key,))


# Plan.execute_args's keyword tensors (flashattn_arg_t beyond q, k, v, o, lse), and the tensors
# that must be contiguous.
_SERVING_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "page_table", "seqused_k", "k_new", "v_new", "rotary_cos", "rotary_sin")
_VARIANT_ARGS = ("sink_logits", "alibi_slopes")  # float32 [heads_q] (since 0.3)
_FP8_ARGS = ("descale_q", "descale_k", "descale_v")  # float32, FP8 plans (since 0.3)
_CONTIGUOUS_ARGS = ("lse", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "rotary_cos", "rotary_sin")


def _destroy(library, handle):
    library.flashattn_plan_destroy(handle)


def _c_ptr(address, ctype):
    """A ctypes pointer to ctype at an int address, or None for a null one."""
    return ctypes.cast(ctypes.c_void_p(address), ctypes.POINTER(ctype)) if address else None


def _pointers(specs):
    """({name: pointer}, {name: TensorRef or None}) of (name, value, may be None) triples (see _pointer)."""
    ptrs, refs = {}, {}
    for name, value, optional in specs:
        ptrs[name], refs[name] = _pointer(value, name, allow_none=optional)
    return ptrs, refs


def _pointer(value, name, allow_none=False):
    """(pointer, TensorRef or None) for a tensor object, an int address or None."""
    if value is None:
        if not allow_none:
            raise TypeError("%s: must not be None" % name)
        return None, None
    if isinstance(value, int):
        return value, None
    ref = value if isinstance(value, TensorRef) else as_tensor(value, name)
    return ref.ptr, ref


def check_refs(ext, chosen, refs, outputs, per_head_bytes):
    """Checks tensors against a finalized plan's extents (Plan.extents()) for a pass that runs on
    backend `chosen`: memory kind, dtype, contiguity, writability of `outputs`, and span;
    per_head_bytes: the span of the [heads_q] arrays. Raises TypeError / ValueError naming the tensor."""
    on_cpu = chosen == Backend.CPU
    for name, ref in refs.items():
        if ref is None:
            continue
        if ref.on_host != on_cpu:
            raise ValueError("%s: %s, but the plan runs on backend '%s'"
                             % (name, ref.describe(), chosen.name.lower()))
        key = "cu" if name.startswith("cu_seqlens") else name
        if name == "o" and ext["o_dtype"] != ext["dtype"]:  # FP8 plans: O is bf16 or fp16
            if ref.flash_dtype != ext["o_dtype"]:
                raise TypeError("o: %s, but the plan's output dtype is %s" % (ref.describe(), ext["o_dtype"].name.lower()))
        elif name in ("q", "k", "v") and ext["dtype"] == DType.FP8_E4M3:
            if ref.flash_dtype != DType.FP8_E4M3 and ref.dtype_name not in ("uint8", "int8"):
                raise TypeError("%s: %s, but the plan's dtype is fp8_e4m3 (E4M3 bytes)" % (name, ref.describe()))
        elif name in ("q", "k", "v", "o", "dout", "dq", "dk", "dv", "k_new", "v_new"):
            if ref.flash_dtype != ext["dtype"]:
                raise TypeError("%s: %s, but the plan's dtype is %s" % (name, ref.describe(), ext["dtype"].name.lower()))
        elif name in ("lse", "rotary_cos", "rotary_sin") + _VARIANT_ARGS + _FP8_ARGS + ("dsink_logits",) and \
                ref.dtype_name != "float32":
            raise TypeError("%s: %s; it must be float32" % (name, ref.describe()))
        elif name in ("cu_seqlens_q", "cu_seqlens_k", "page_table", "seqused_k") and ref.dtype_name != "int32":
            raise TypeError("%s: %s; it must be int32" % (name, ref.describe()))
        if name in _CONTIGUOUS_ARGS and not ref.is_contiguous:
            raise ValueError("%s: must be contiguous" % name)
        if name in outputs and not ref.writeable:
            raise ValueError("%s: the array is read-only" % name)
        need = ext[key] if key in ext else per_head_bytes  # the [heads_q] arrays
        if ref.span_bytes < need:
            raise ValueError("%s: %s spans %d bytes, the plan needs %d (check its shape and strides)"
                             % (name, ref.describe(), ref.span_bytes, need))


class Plan:
    """One attention problem: ``flashattn_plan_t`` with its lifecycle.

    ``Plan(batch=2, seqlen_q=128, ..., dtype="fp32", backend="cpu")`` creates the plan and sets
    the given parameters (names are the lower-case key names without the prefix; ``scale`` is
    ``softmax_scale``). ``close()`` destroys it; so do leaving a ``with`` block and garbage
    collection, in any order, any number of times.
    """

    def __init__(self, **params):
        handle = ctypes.c_void_p()
        call("flashattn_plan_create", ctypes.byref(handle))
        self._handle = handle.value
        self._finalizer = weakref.finalize(self, _destroy, lib(), handle.value)
        try:
            for key, value in params.items():
                self.set(key, value)
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self):
        """Destroy the C plan now (idempotent)."""
        self._handle = None
        self._finalizer()

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def handle(self):
        """The flashattn_plan_t* as an int (ValueError once closed)."""
        if self._handle is None:
            raise ValueError("flashattn.Plan: the plan is closed")
        return self._handle

    def __repr__(self):
        if self.closed:
            return "<flashattn.Plan closed>"
        return "<flashattn.Plan at 0x%x>" % self._handle

    # -- parameters --------------------------------------------------------------------------
    def set_i64(self, key, value):
        call("flashattn_plan_set_i64", self.handle, int(key), int(value))

    def set_f64(self, key, value):
        call("flashattn_plan_set_f64", self.handle, int(key), float(value))

    def get_i64(self, key):
        out = ctypes.c_int64()
        call("flashattn_plan_get_i64", self.handle, int(key), ctypes.byref(out))
        return out.value

    def get_f64(self, key):
        out = ctypes.c_double()
        call("flashattn_plan_get_f64", self.handle, int(key), ctypes.byref(out))
        return out.value

    def set(self, key, value):
        """Set a parameter by I64/F64 key or name; dtype and backend also take names."""
        is_i64, k = _key(key)
        if not is_i64:
            return self.set_f64(k, value)
        if k == I64.DTYPE:
            value = parse_dtype(value)
        elif k == I64.BACKEND:
            value = parse_backend(value)
        elif isinstance(value, bool):
            value = int(value)
        return self.set_i64(k, value)

    def get(self, key):
        is_i64, k = _key(key)
        return self.get_i64(k) if is_i64 else self.get_f64(k)

    # -- finalize and queries ----------------------------------------------------------------
    def finalize(self):
        call("flashattn_plan_finalize", self.handle)
        return self

    def _get_backend(self, function):
        """(Backend, reason) from flashattn_plan_get_backend or its backward twin."""
        backend = ctypes.c_int()
        reason = ctypes.c_char_p()
        call(function, self.handle, ctypes.byref(backend), ctypes.byref(reason))
        return Backend(backend.value), (reason.value or b"").decode("utf-8", "replace")

    def _get_size(self, function):
        """The size_t that flashattn_plan_get_workspace_size (or its backward twin) reports."""
        out = ctypes.c_size_t()
        call(function, self.handle, ctypes.byref(out))
        return out.value

    def backend_info(self):
        """(Backend, reason) of a finalized plan."""
        return self._get_backend("flashattn_plan_get_backend")

    @property
    def backend(self):
        return self.backend_info()[0]

    @property
    def backend_reason(self):
        return self.backend_info()[1]

    @property
    def workspace_size(self):
        return self._get_size("flashattn_plan_get_workspace_size")

    def backward_backend_info(self):
        """(Backend, reason) that runs a finalized plan's backward pass (may differ from the forward's)."""
        return self._get_backend("flashattn_plan_get_backward_backend")

    @property
    def backward_backend(self):
        return self.backward_backend_info()[0]

    @property
    def backward_workspace_size(self):
        """Bytes of workspace each backward execute of this finalized plan needs (separate from the forward's)."""
        return self._get_size("flashattn_plan_get_backward_workspace_size")

    def extents(self):
        """Bytes each tensor of a finalized plan spans from its pointer: dict q, k, v, o, lse, cu and the
        backward's dout, dq, dk, dv."""
        g = self.get_i64
        varlen = g(I64.VARLEN) == 1
        es = 4 if g(I64.DTYPE) == DType.FP32 else (1 if g(I64.DTYPE) == DType.FP8_E4M3 else 2)
        out_dtype = DType(g(I64.OUTPUT_DTYPE))
        es_o = 4 if out_dtype == DType.FP32 else 2
        batch = g(I64.BATCH)
        rows_q = g(I64.TOTAL_Q) if varlen else g(I64.SEQLEN_Q)
        rows_k = g(I64.TOTAL_K) if varlen else g(I64.SEQLEN_K)

        def span(prefix, rows, heads, dim):
            if rows == 0:
                return 0
            end = dim + (rows - 1) * g(I64[prefix + "_ROW_STRIDE"]) + (heads - 1) * g(I64[prefix + "_HEAD_STRIDE"])
            if not varlen:
                end += (batch - 1) * g(I64[prefix + "_BATCH_STRIDE"])
            return end * (es_o if prefix == "O" else es)

        def new_rows_span(prefix, dim):  # K_new / V_new: [batch, new_kv_rows, heads_kv, dim]
            n = g(I64.NEW_KV_ROWS)
            if n == 0:
                return 0
            return (dim + (batch - 1) * g(I64[prefix + "_NEW_BATCH_STRIDE"]) + (n - 1) * g(I64[prefix + "_NEW_ROW_STRIDE"])
                    + (hkv - 1) * g(I64[prefix + "_NEW_HEAD_STRIDE"])) * es

        hq, hkv, d, dv = g(I64.HEADS_Q), g(I64.HEADS_KV), g(I64.HEAD_DIM), g(I64.HEAD_DIM_V)
        ext = {"q": span("Q", rows_q, hq, d), "k": span("K", rows_k, hkv, d), "v": span("V", rows_k, hkv, dv),
               "o": span("O", rows_q, hq, dv), "lse": (1 if varlen else batch) * hq * rows_q * 4,
               "cu": (batch + 1) * 4 if varlen else 0, "dtype": DType(g(I64.DTYPE)),
               "dout": span("DO", rows_q, hq, dv), "dq": span("DQ", rows_q, hq, d),
               "dk": span("DK", rows_k, hkv, d), "dv": span("DV", rows_k, hkv, dv),
               "page_table": 0, "seqused_k": batch * 4 if g(I64.SEQUSED_K) else 0,
               "k_new": new_rows_span("K", d), "v_new": new_rows_span("V", dv),
               "rotary_cos": g(I64.SEQLEN_K) * (g(I64.ROTARY_DIM) // 2) * 4}
        ext["rotary_sin"] = ext["rotary_cos"]
        ext["o_dtype"] = out_dtype
        descale = 0
        if ext["dtype"] == DType.FP8_E4M3:
            descale = ((batch - 1) * g(I64.DESCALE_BATCH_STRIDE) + (hkv - 1) * g(I64.DESCALE_HEAD_STRIDE) + 1) * 4
        for name in _FP8_ARGS:
            ext[name] = descale
        if g(I64.PAGED_KV):  # the caches are [num_pages, page_size, heads_kv, dim]; the batch stride steps pages
            pages, page = g(I64.NUM_PAGES), g(I64.PAGE_SIZE)
            for name, prefix, dim in (("k", "K", d), ("v", "V", dv)):
                ext[name] = (dim + (pages - 1) * g(I64[prefix + "_BATCH_STRIDE"]) + (page - 1) * g(I64[prefix + "_ROW_STRIDE"])
                             + (hkv - 1) * g(I64[prefix + "_HEAD_STRIDE"])) * es
            ext["page_table"] = ((batch - 1) * g(I64.PAGE_TABLE_STRIDE) + g(I64.MAX_PAGES_PER_SEQUENCE)) * 4
        return ext

    # -- execute -----------------------------------------------------------------------------
    def _check_refs(self, refs, outputs=("o", "lse"), backend=None):
        chosen = backend if backend is not None else self.backend
        check_refs(self.extents(), chosen, refs, outputs, 4 * self.get_i64(I64.HEADS_Q))

    def _workspace(self, workspace):
        if workspace is None:
            return None, 0
        if isinstance(workspace, tuple) and len(workspace) == 2:
            return int(workspace[0]), int(workspace[1])
        ref = workspace if isinstance(workspace, TensorRef) else as_tensor(workspace, "workspace")
        return ref.ptr, ref.span_bytes

    def execute(self, q, k, v, o, lse=None, workspace=None, stream=None):
        """flashattn_plan_execute. Tensors are arrays/tensors (checked against the plan's extents
        and dtype) or raw int addresses (not checked); workspace is an array or (address, bytes);
        stream an int, a torch/cupy stream or None (the legacy default stream)."""
        self._execute(False, q, k, v, o, lse, None, None, workspace, stream)

    def execute_varlen(self, q, k, v, o, cu_seqlens_q, cu_seqlens_k, lse=None, workspace=None, stream=None):
        """flashattn_plan_execute_varlen; arguments as execute(), plus int32 cu_seqlens_q/k."""
        self._execute(True, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, workspace, stream)

    def _execute(self, varlen, q, k, v, o, lse, cu_q, cu_k, workspace, stream):
        handle = self.handle
        ptrs, refs = _pointers((("q", q, False), ("k", k, False), ("v", v, False), ("o", o, False),
                                ("lse", lse, True), ("cu_seqlens_q", cu_q, not varlen),
                                ("cu_seqlens_k", cu_k, not varlen)))
        finalized = True
        try:
            self.workspace_size
        except _capi.InvalidStateError:
            finalized = False  # let the C call report it
        if finalized:
            self._check_refs(refs)
        self._call("flashattn_plan_execute", handle, ptrs, ("q", "k", "v", "o", "lse"), varlen, workspace, stream)
        del refs  # the arrays stayed referenced for the whole call

    def _call(self, function, handle, ptrs, names, varlen, workspace, stream):
        """function (its _varlen twin when varlen, with the cu_seqlens) on the pointers of names (lse
        as float*), then the workspace and the stream; raises on a failed status."""
        ws_ptr, ws_bytes = self._workspace(workspace)
        s = stream_handle(stream) or None
        args = [handle] + [_c_ptr(ptrs[n], ctypes.c_float) if n == "lse" else ptrs[n] for n in names]
        if varlen:
            function += "_varlen"
            args += [_c_ptr(ptrs["cu_seqlens_q"], ctypes.c_int32), _c_ptr(ptrs["cu_seqlens_k"], ctypes.c_int32)]
        call(function, *args, ws_ptr, ws_bytes, s)

    def execute_args(self, q, k, v, o, lse=None, workspace=None, stream=None, **tensors):
        """flashattn_plan_execute_args: the one call for paged K/V caches, seqused_k and the append
        of new K/V rows with a rotary embedding, and for the sink logits and ALiBi slopes of the
        attention variants (any plan may use it), and for FP8 plans (descale_q, descale_k,
        descale_v: float32 laid out by I64.DESCALE_BATCH_STRIDE / _HEAD_STRIDE; q, k, v as E4M3
        bytes: uint8 or float8_e4m3fn arrays; o in I64.OUTPUT_DTYPE). Keyword tensors (as in execute()): sink_logits
        and alibi_slopes (float32 [heads_q]), cu_seqlens_q, cu_seqlens_k, page_table [batch, max_pages_per_sequence] and
        seqused_k [batch] (int32), k_new and v_new [batch, new_kv_rows, heads_kv, dim] (the plan's
        dtype), rotary_cos and rotary_sin [seqlen_k, rotary_dim / 2] (float32). With
        new_kv_rows > 0, k and v are the caches and are written at each sequence's seqused_k;
        seqused_k is never written: advance it by new_kv_rows after the call. workspace None on
        the CPU backend allocates one for this call."""
        known = _SERVING_ARGS + _VARIANT_ARGS + _FP8_ARGS
        unknown = set(tensors) - set(known)
        if unknown:
            raise TypeError("execute_args: unknown tensors %s (known: %s)" % (sorted(unknown), ", ".join(known)))
        specs = [("q", q, False), ("k", k, False), ("v", v, False), ("o", o, False), ("lse", lse, True)]
        specs += [(name, tensors.get(name), True) for name in known]
        ptrs, refs = _pointers(specs)
        backend = None
        try:
            backend = self.backend
        except _capi.InvalidStateError:
            pass  # not finalized: let the C call report it
        if backend is not None:
            outputs = ("o", "lse", "k", "v") if self.get_i64(I64.NEW_KV_ROWS) > 0 else ("o", "lse")
            self._check_refs(refs, outputs=outputs, backend=backend)
        ws_owner = None
        if workspace is None and backend == Backend.CPU and self.workspace_size > 0:
            import numpy as np
            ws_owner = np.empty(self.workspace_size + 256, dtype=np.uint8)
            workspace = ((ws_owner.ctypes.data + 255) // 256 * 256, self.workspace_size)
        ws_ptr, ws_bytes = self._workspace(workspace)
        handle = ctypes.c_void_p()
        call("flashattn_args_create", ctypes.byref(handle))
        try:
            for name, ptr in ptrs.items():
                if ptr is not None:
                    call("flashattn_args_set", handle, int(Arg[name.upper()]), ptr)
            call("flashattn_plan_execute_args", self.handle, handle, ws_ptr, ws_bytes, stream_handle(stream) or None)
        finally:
            lib().flashattn_args_destroy(handle)
        del refs, ws_owner  # kept referenced for the whole call

    # -- backward ----------------------------------------------------------------------------
    def backward(self, q, k, v, o, dout, lse, dq, dk, dv, workspace=None, stream=None):
        """flashattn_plan_execute_backward: writes dq, dk, dv (layouts of q, k, v with the plan's
        DQ_/DK_/DV_ strides) from the forward's q, k, v, o, its float32 lse [batch, heads_q,
        seqlen_q] and dout (layout of o, DO_ strides). Tensors as in execute(). workspace: an
        array or (address, bytes) of at least backward_workspace_size bytes; None on the CPU
        backend allocates one for this call (elsewhere None passes no workspace)."""
        self._backward(False, q, k, v, o, dout, lse, dq, dk, dv, None, None, workspace, stream)

    def backward_varlen(self, q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, workspace=None,
                        stream=None):
        """flashattn_plan_execute_backward_varlen: as backward() on packed [total, heads, dim]
        tensors, lse float32 [heads_q, total_q], plus int32 cu_seqlens_q/k."""
        self._backward(True, q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, workspace, stream)

    def _backward(self, varlen, q, k, v, o, dout, lse, dq, dk, dv, cu_q, cu_k, workspace, stream):
        handle = self.handle
        ptrs, refs = _pointers((("q", q, False), ("k", k, False), ("v", v, False), ("o", o, False),
                                ("dout", dout, False), ("lse", lse, False), ("dq", dq, False), ("dk", dk, False),
                                ("dv", dv, False), ("cu_seqlens_q", cu_q, not varlen),
                                ("cu_seqlens_k", cu_k, not varlen)))
        backend = None
        try:
            backend = self.backward_backend
        except (_capi.InvalidStateError, _capi.NotSupportedError):
            pass  # not finalized, or no backward backend: let the C call report it
        if backend is not None:
            self._check_refs(refs, outputs=("dq", "dk", "dv"), backend=backend)
        ws_owner = None
        if workspace is None and backend == Backend.CPU:
            need = self.backward_workspace_size
            if need > 0:
                import numpy as np
                ws_owner = np.empty(need + 256, dtype=np.uint8)
                workspace = ((ws_owner.ctypes.data + 255) // 256 * 256, need)
        self._call("flashattn_plan_execute_backward", handle, ptrs, ("q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"),
                   varlen, workspace, stream)
        del refs, ws_owner  # kept referenced for the whole call

    # -- argument sets (since 0.3) -----------------------------------------------------------
    def _run_args(self, function, workspace, stream, tensors):
        """function (flashattn_plan_execute_backward_args) on a temporary flashattn_args_t holding
        tensors: {lower-case flashattn.Arg name: array, int address or None}."""
        names = {a.name.lower(): a for a in _capi.Arg}
        ptrs, refs = {}, {}
        for name, value in tensors.items():
            if name not in names:
                raise TypeError("%s: not a flashattn.Arg name (%s)" % (name, ", ".join(sorted(names))))
            ptrs[name], refs[name] = _pointer(value, name, allow_none=True)
        for name in ("sink_logits", "alibi_slopes", "dsink_logits", "lse"):
            ref = refs.get(name)
            if ref is not None and ref.dtype_name != "float32":
                raise TypeError("%s: %s; it must be float32" % (name, ref.describe()))
        handle = ctypes.c_void_p()
        call("flashattn_args_create", ctypes.byref(handle))
        try:
            for name, ptr in ptrs.items():
                call("flashattn_args_set", handle, int(names[name]), ptr)
            ws_ptr, ws_bytes = self._workspace(workspace)
            call(function, self.handle, handle, ws_ptr, ws_bytes, stream_handle(stream) or None)
        finally:
            lib().flashattn_args_destroy(handle)
        del refs  # the arrays stayed referenced for the whole call

    def backward_args(self, workspace=None, stream=None, **tensors):
        """flashattn_plan_execute_backward_args with the named tensors (q, k, v, o, lse, dout, dq,
        dk, dv, cu_seqlens_*, sink_logits with dsink_logits, alibi_slopes). workspace None on the
        CPU backend allocates one for this call."""
        ws_owner = None
        if workspace is None and self.backward_backend == Backend.CPU:
            need = self.backward_workspace_size
            if need > 0:
                import numpy as np
                ws_owner = np.empty(need + 256, dtype=np.uint8)
                workspace = ((ws_owner.ctypes.data + 255) // 256 * 256, need)
        self._run_args("flashattn_plan_execute_backward_args", workspace, stream, tensors)
        del ws_owner

    def merge_states(self, partial_o, partial_lse, o, lse=None, partial_dtype=None, stream=None):
        """flashattn_plan_merge_states: merge the partial states (lists of O tensors laid out as
        the plan's O, in partial_dtype (default: the plan's dtype, or float32 when the arrays are
        float32), and their float32 LSEs) into o (and lse). Runs where the plan runs."""
        if len(partial_o) != len(partial_lse):
            raise ValueError("partial_o and partial_lse: %d and %d entries" % (len(partial_o), len(partial_lse)))
        n = len(partial_o)
        handle = self.handle
        refs = []
        po = (ctypes.c_void_p * max(n, 1))()
        pl = (ctypes.POINTER(ctypes.c_float) * max(n, 1))()
        for i in range(n):
            ptr, ref = _pointer(partial_o[i], "partial_o[%d]" % i)
            po[i] = ptr
            refs.append(ref)
            ptr, ref = _pointer(partial_lse[i], "partial_lse[%d]" % i)
            pl[i] = _c_ptr(ptr, ctypes.c_float)
            refs.append(ref)
        if partial_dtype is None:
            first = refs[0] if refs else None
            partial_dtype = DType.FP32 if first is not None and first.dtype_name == "float32" \
                else DType(self.get_i64(I64.DTYPE))
        o_ptr, o_ref = _pointer(o, "o")
        lse_ptr, lse_ref = _pointer(lse, "lse", allow_none=True)
        call("flashattn_plan_merge_states", handle, n, po, pl, int(parse_dtype(partial_dtype)), o_ptr,
             _c_ptr(lse_ptr, ctypes.c_float), stream_handle(stream) or None)
        del refs, o_ref, lse_ref


__all__ = ["Plan", "parse_backend", "parse_dtype", "Status"]
