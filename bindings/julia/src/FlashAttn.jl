"""
    FlashAttn

libflashattn from Julia: exact FlashAttention attention (forward and backward) over the library's C ABI.

The raw layer mirrors `include/flashattn/flashattn.h` one to one (`flashattn_plan_create`, ...,
with the header's enum constants); `test/check_wrappers.py` checks it against the header. On top:
[`Plan`](@ref) (a mutable struct with a finalizer), [`attention`](@ref) for host `Array`s (CPU
backend) and [`execute!`](@ref) with raw pointers for device memory; the backward pass through
[`backward!`](@ref), [`backward_varlen!`](@ref) and [`attention_backward`](@ref).

Julia arrays are column-major, so the C layout `[batch, seq, heads, dim]` is a Julia array of
size `(dim, heads, seq, batch)` (variable length: `(dim, heads, total)`); LSE `[batch, heads, seq]`
is `(seq, heads, batch)`.

The library is found through ENV["FLASHATTN_LIBRARY"] (a path), then
`pkg-config --variable=libdir flashattn`, then the system loader (`libflashattn.so.0`).
"""
module FlashAttn

using Libdl

export Plan, FlashAttnError, attention, attention_varlen, execute!, execute_varlen!, finalize!,
       set_i64!, set_f64!, get_i64, get_f64, backend, workspace_size,
       attention_backward, attention_varlen_backward, backward!, backward_varlen!, backward_backend,
       backward_workspace_size, execute_args!, backward_args!, execute_variants!, backward_variants!, merge_states!,
       rotate_hadamard!

# ---------------------------------------------------------------------------------------------
# Types and constants (values pinned by the ABI)

const flashattn_status_t = Cint
const FLASHATTN_SUCCESS = flashattn_status_t(0)
const FLASHATTN_ERROR_INVALID_ARGUMENT = flashattn_status_t(1)
const FLASHATTN_ERROR_NOT_SUPPORTED = flashattn_status_t(2)
const FLASHATTN_ERROR_INVALID_STATE = flashattn_status_t(3)
const FLASHATTN_ERROR_ALLOCATION = flashattn_status_t(4)
const FLASHATTN_ERROR_DEVICE = flashattn_status_t(5)
const FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE = flashattn_status_t(6)
const FLASHATTN_ERROR_INTERNAL = flashattn_status_t(7)

const flashattn_dtype_t = Cint
const FLASHATTN_DTYPE_FP16 = flashattn_dtype_t(1)
const FLASHATTN_DTYPE_BF16 = flashattn_dtype_t(2)
const FLASHATTN_DTYPE_FP32 = flashattn_dtype_t(3)
const FLASHATTN_DTYPE_FP8_E4M3 = flashattn_dtype_t(4)

const flashattn_backend_t = Cint
const FLASHATTN_BACKEND_AUTO = flashattn_backend_t(0)
const FLASHATTN_BACKEND_CPU = flashattn_backend_t(1)
const FLASHATTN_BACKEND_FA1 = flashattn_backend_t(2)
const FLASHATTN_BACKEND_FA2 = flashattn_backend_t(3)
const FLASHATTN_BACKEND_FA3 = flashattn_backend_t(4)

const flashattn_i64_param_t = Cint
const FLASHATTN_I64_BATCH = flashattn_i64_param_t(1)
const FLASHATTN_I64_SEQLEN_Q = flashattn_i64_param_t(2)
const FLASHATTN_I64_SEQLEN_K = flashattn_i64_param_t(3)
const FLASHATTN_I64_HEADS_Q = flashattn_i64_param_t(4)
const FLASHATTN_I64_HEADS_KV = flashattn_i64_param_t(5)
const FLASHATTN_I64_HEAD_DIM = flashattn_i64_param_t(6)
const FLASHATTN_I64_HEAD_DIM_V = flashattn_i64_param_t(7)
const FLASHATTN_I64_DTYPE = flashattn_i64_param_t(8)
const FLASHATTN_I64_CAUSAL = flashattn_i64_param_t(9)
const FLASHATTN_I64_WINDOW_LEFT = flashattn_i64_param_t(10)
const FLASHATTN_I64_WINDOW_RIGHT = flashattn_i64_param_t(11)
const FLASHATTN_I64_BACKEND = flashattn_i64_param_t(12)
const FLASHATTN_I64_DEVICE = flashattn_i64_param_t(13)
const FLASHATTN_I64_VARLEN = flashattn_i64_param_t(14)
const FLASHATTN_I64_TOTAL_Q = flashattn_i64_param_t(15)
const FLASHATTN_I64_TOTAL_K = flashattn_i64_param_t(16)
const FLASHATTN_I64_Q_BATCH_STRIDE = flashattn_i64_param_t(20)
const FLASHATTN_I64_Q_ROW_STRIDE = flashattn_i64_param_t(21)
const FLASHATTN_I64_Q_HEAD_STRIDE = flashattn_i64_param_t(22)
const FLASHATTN_I64_K_BATCH_STRIDE = flashattn_i64_param_t(23)
const FLASHATTN_I64_K_ROW_STRIDE = flashattn_i64_param_t(24)
const FLASHATTN_I64_K_HEAD_STRIDE = flashattn_i64_param_t(25)
const FLASHATTN_I64_V_BATCH_STRIDE = flashattn_i64_param_t(26)
const FLASHATTN_I64_V_ROW_STRIDE = flashattn_i64_param_t(27)
const FLASHATTN_I64_V_HEAD_STRIDE = flashattn_i64_param_t(28)
const FLASHATTN_I64_O_BATCH_STRIDE = flashattn_i64_param_t(29)
const FLASHATTN_I64_O_ROW_STRIDE = flashattn_i64_param_t(30)
const FLASHATTN_I64_O_HEAD_STRIDE = flashattn_i64_param_t(31)
const FLASHATTN_I64_DETERMINISTIC = flashattn_i64_param_t(32)
const FLASHATTN_I64_DO_BATCH_STRIDE = flashattn_i64_param_t(33)
const FLASHATTN_I64_DO_ROW_STRIDE = flashattn_i64_param_t(34)
const FLASHATTN_I64_DO_HEAD_STRIDE = flashattn_i64_param_t(35)
const FLASHATTN_I64_DQ_BATCH_STRIDE = flashattn_i64_param_t(36)
const FLASHATTN_I64_DQ_ROW_STRIDE = flashattn_i64_param_t(37)
const FLASHATTN_I64_DQ_HEAD_STRIDE = flashattn_i64_param_t(38)
const FLASHATTN_I64_DK_BATCH_STRIDE = flashattn_i64_param_t(39)
const FLASHATTN_I64_DK_ROW_STRIDE = flashattn_i64_param_t(40)
const FLASHATTN_I64_DK_HEAD_STRIDE = flashattn_i64_param_t(41)
const FLASHATTN_I64_DV_BATCH_STRIDE = flashattn_i64_param_t(42)
const FLASHATTN_I64_DV_ROW_STRIDE = flashattn_i64_param_t(43)
const FLASHATTN_I64_DV_HEAD_STRIDE = flashattn_i64_param_t(44)
const FLASHATTN_I64_PAGED_KV = flashattn_i64_param_t(45)
const FLASHATTN_I64_PAGE_SIZE = flashattn_i64_param_t(46)
const FLASHATTN_I64_NUM_PAGES = flashattn_i64_param_t(47)
const FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE = flashattn_i64_param_t(48)
const FLASHATTN_I64_PAGE_TABLE_STRIDE = flashattn_i64_param_t(49)
const FLASHATTN_I64_SEQUSED_K = flashattn_i64_param_t(50)
const FLASHATTN_I64_NEW_KV_ROWS = flashattn_i64_param_t(51)
const FLASHATTN_I64_K_NEW_BATCH_STRIDE = flashattn_i64_param_t(52)
const FLASHATTN_I64_K_NEW_ROW_STRIDE = flashattn_i64_param_t(53)
const FLASHATTN_I64_K_NEW_HEAD_STRIDE = flashattn_i64_param_t(54)
const FLASHATTN_I64_V_NEW_BATCH_STRIDE = flashattn_i64_param_t(55)
const FLASHATTN_I64_V_NEW_ROW_STRIDE = flashattn_i64_param_t(56)
const FLASHATTN_I64_V_NEW_HEAD_STRIDE = flashattn_i64_param_t(57)
const FLASHATTN_I64_ROTARY_DIM = flashattn_i64_param_t(58)
const FLASHATTN_I64_ROTARY_INTERLEAVED = flashattn_i64_param_t(59)
const FLASHATTN_I64_MASK_ALIGN = flashattn_i64_param_t(60)
const FLASHATTN_I64_SINK_TOKENS = flashattn_i64_param_t(61)
const FLASHATTN_I64_SINK_LOGITS = flashattn_i64_param_t(62)
const FLASHATTN_I64_ALIBI = flashattn_i64_param_t(63)
const FLASHATTN_I64_OUTPUT_DTYPE = flashattn_i64_param_t(64)
const FLASHATTN_I64_DESCALE_BATCH_STRIDE = flashattn_i64_param_t(65)
const FLASHATTN_I64_DESCALE_HEAD_STRIDE = flashattn_i64_param_t(66)
const FLASHATTN_I64_NUM_SPLITS = flashattn_i64_param_t(70)

const flashattn_mask_align_t = Cint
const FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT = flashattn_mask_align_t(0)
const FLASHATTN_MASK_ALIGN_TOP_LEFT = flashattn_mask_align_t(1)

const flashattn_f64_param_t = Cint
const FLASHATTN_F64_SOFTMAX_SCALE = flashattn_f64_param_t(1)
const FLASHATTN_F64_SOFTCAP = flashattn_f64_param_t(2)

"`flashattn_arg_t`: the tensors of [`execute_args!`](@ref) (since 0.3)."
const flashattn_arg_t = Cint
const FLASHATTN_ARG_Q = flashattn_arg_t(1)
const FLASHATTN_ARG_K = flashattn_arg_t(2)
const FLASHATTN_ARG_V = flashattn_arg_t(3)
const FLASHATTN_ARG_O = flashattn_arg_t(4)
const FLASHATTN_ARG_LSE = flashattn_arg_t(5)
const FLASHATTN_ARG_CU_SEQLENS_Q = flashattn_arg_t(6)
const FLASHATTN_ARG_CU_SEQLENS_K = flashattn_arg_t(7)
const FLASHATTN_ARG_PAGE_TABLE = flashattn_arg_t(8)
const FLASHATTN_ARG_SEQUSED_K = flashattn_arg_t(9)
const FLASHATTN_ARG_K_NEW = flashattn_arg_t(10)
const FLASHATTN_ARG_V_NEW = flashattn_arg_t(11)
const FLASHATTN_ARG_ROTARY_COS = flashattn_arg_t(12)
const FLASHATTN_ARG_ROTARY_SIN = flashattn_arg_t(13)
const FLASHATTN_ARG_SINK_LOGITS = flashattn_arg_t(20)
const FLASHATTN_ARG_ALIBI_SLOPES = flashattn_arg_t(21)
const FLASHATTN_ARG_DSINK_LOGITS = flashattn_arg_t(22)
const FLASHATTN_ARG_DOUT = flashattn_arg_t(30)
const FLASHATTN_ARG_DQ = flashattn_arg_t(31)
const FLASHATTN_ARG_DK = flashattn_arg_t(32)
const FLASHATTN_ARG_DV = flashattn_arg_t(33)
const FLASHATTN_ARG_DESCALE_Q = flashattn_arg_t(40)
const FLASHATTN_ARG_DESCALE_K = flashattn_arg_t(41)
const FLASHATTN_ARG_DESCALE_V = flashattn_arg_t(42)

"Opaque `flashattn_args_t` (since 0.3): only used behind `Ptr{flashattn_args_t}`."
const flashattn_args_t = Cvoid

"Opaque `flashattn_plan_t`: only used behind `Ptr{flashattn_plan_t}`."
const flashattn_plan_t = Cvoid
"`flashattn_stream_t`: a `cudaStream_t` (`C_NULL`: the legacy default stream)."
const flashattn_stream_t = Ptr{Cvoid}

"FLASHATTN_MAX_MERGE_PARTIALS: the most partial states one merge takes."
const MAX_MERGE_PARTIALS = 128

# ---------------------------------------------------------------------------------------------
# Loading the library (once, on first use)

const FUNCTIONS = (:flashattn_status_string, :flashattn_last_error, :flashattn_last_error_copy,
                   :flashattn_version, :flashattn_version_string, :flashattn_build_info,
                   :flashattn_device_count, :flashattn_device_compute_capability,
                   :flashattn_plan_create, :flashattn_plan_destroy, :flashattn_plan_set_i64,
                   :flashattn_plan_set_f64, :flashattn_plan_get_i64, :flashattn_plan_get_f64,
                   :flashattn_plan_finalize, :flashattn_plan_get_backend,
                   :flashattn_plan_get_workspace_size, :flashattn_plan_execute,
                   :flashattn_plan_execute_varlen, :flashattn_plan_get_backward_backend,
                   :flashattn_plan_get_backward_workspace_size, :flashattn_plan_execute_backward,
                   :flashattn_plan_execute_backward_varlen,
                   :flashattn_args_create, :flashattn_args_destroy, :flashattn_args_set,
                   :flashattn_args_get, :flashattn_plan_execute_args, :flashattn_plan_execute_backward_args,
                   :flashattn_plan_merge_states, :flashattn_rotate_hadamard)
# Added after 0.1: an older library still loads, and calling one of these throws.
const SINCE_0_2 = (:flashattn_plan_get_backward_backend, :flashattn_plan_get_backward_workspace_size,
                   :flashattn_plan_execute_backward, :flashattn_plan_execute_backward_varlen,
                   :flashattn_args_create, :flashattn_args_destroy, :flashattn_args_set,
                   :flashattn_args_get, :flashattn_plan_execute_args, :flashattn_plan_execute_backward_args,
                   :flashattn_plan_merge_states, :flashattn_rotate_hadamard)  # the last eight since 0.3

const _handle = Ref{Ptr{Cvoid}}(C_NULL)
const _path = Ref{String}("")
const _symbols = Dict{Symbol,Ptr{Cvoid}}()
const _loaded = Threads.Atomic{Bool}(false)
const _load_lock = ReentrantLock()

function _pkg_config_libdir()
    try
        dir = strip(read(pipeline(`pkg-config --variable=libdir flashattn`; stderr=devnull), String))
        return isempty(dir) ? nothing : String(dir)
    catch
        return nothing
    end
end

function _load!()
    lock(_load_lock) do
        _loaded[] && return
        tried = String[]
        handle = C_NULL
        explicit = get(ENV, "FLASHATTN_LIBRARY", "")
        if !isempty(explicit)
            # An explicit path must work: falling back to another copy would hide the mistake.
            handle = Libdl.dlopen(explicit; throw_error=false)
            handle === nothing && error("FlashAttn: FLASHATTN_LIBRARY=$explicit could not be loaded")
            _path[] = explicit
        else
            push!(tried, "FLASHATTN_LIBRARY (not set)")
            libdir = _pkg_config_libdir()
            if libdir === nothing
                push!(tried, "pkg-config --variable=libdir flashattn: no flashattn.pc found")
            else
                for name in ("libflashattn.so.0", "libflashattn.so", "libflashattn.dylib")
                    path = joinpath(libdir, name)
                    h = isfile(path) ? Libdl.dlopen(path; throw_error=false) : nothing
                    if h !== nothing
                        handle, _path[] = h, path
                        break
                    end
                    push!(tried, "$path (pkg-config libdir)")
                end
            end
            if handle == C_NULL
                for name in ("libflashattn.so.0", "libflashattn")
                    h = Libdl.dlopen(name; throw_error=false)
                    if h !== nothing
                        handle, _path[] = h, name
                        break
                    end
                    push!(tried, "system loader: $name")
                end
            end
            handle == C_NULL && error("FlashAttn: libflashattn could not be loaded; set FLASHATTN_LIBRARY. Tried:\n  " *
                                      join(tried, "\n  "))
        end
        for f in FUNCTIONS
            if f in SINCE_0_2
                p = Libdl.dlsym(handle, f; throw_error=false)
                _symbols[f] = p === nothing ? C_NULL : p
            else
                _symbols[f] = Libdl.dlsym(handle, f)
            end
        end
        _handle[] = handle
        _loaded[] = true
    end
    return nothing
end

"The address of a library function (loads the library on first use)."
@inline function fptr(name::Symbol)
    _loaded[] || _load!()
    p = _symbols[name]
    p == C_NULL && error("FlashAttn: the loaded library ($(_path[])) lacks $name (libflashattn >= 0.2, or 0.3 for the variants)")
    return p
end

library_path() = (fptr(:flashattn_version); _path[])

# ---------------------------------------------------------------------------------------------
# Raw wrappers: one per function of flashattn.h, same names, arguments and types.

flashattn_status_string(status) = ccall(fptr(:flashattn_status_string), Cstring, (flashattn_status_t,), status)
flashattn_last_error() = ccall(fptr(:flashattn_last_error), Cstring, ())
flashattn_last_error_copy(buffer, size) = ccall(fptr(:flashattn_last_error_copy), Csize_t, (Ptr{Cchar}, Csize_t), buffer, size)
flashattn_version() = ccall(fptr(:flashattn_version), UInt32, ())
flashattn_version_string() = ccall(fptr(:flashattn_version_string), Cstring, ())
flashattn_build_info() = ccall(fptr(:flashattn_build_info), Cstring, ())
flashattn_device_count(count) = ccall(fptr(:flashattn_device_count), flashattn_status_t, (Ptr{Int32},), count)
flashattn_device_compute_capability(device, major, minor) = ccall(fptr(:flashattn_device_compute_capability), flashattn_status_t, (Int32, Ptr{Int32}, Ptr{Int32}), device, major, minor)
flashattn_plan_create(plan) = ccall(fptr(:flashattn_plan_create), flashattn_status_t, (Ptr{Ptr{flashattn_plan_t}},), plan)
flashattn_plan_destroy(plan) = ccall(fptr(:flashattn_plan_destroy), Cvoid, (Ptr{flashattn_plan_t},), plan)
flashattn_plan_set_i64(plan, key, value) = ccall(fptr(:flashattn_plan_set_i64), flashattn_status_t, (Ptr{flashattn_plan_t}, flashattn_i64_param_t, Int64), plan, key, value)
flashattn_plan_set_f64(plan, key, value) = ccall(fptr(:flashattn_plan_set_f64), flashattn_status_t, (Ptr{flashattn_plan_t}, flashattn_f64_param_t, Cdouble), plan, key, value)
flashattn_plan_get_i64(plan, key, value) = ccall(fptr(:flashattn_plan_get_i64), flashattn_status_t, (Ptr{flashattn_plan_t}, flashattn_i64_param_t, Ptr{Int64}), plan, key, value)
flashattn_plan_get_f64(plan, key, value) = ccall(fptr(:flashattn_plan_get_f64), flashattn_status_t, (Ptr{flashattn_plan_t}, flashattn_f64_param_t, Ptr{Cdouble}), plan, key, value)
flashattn_plan_finalize(plan) = ccall(fptr(:flashattn_plan_finalize), flashattn_status_t, (Ptr{flashattn_plan_t},), plan)
flashattn_plan_get_backend(plan, backend, reason) = ccall(fptr(:flashattn_plan_get_backend), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{flashattn_backend_t}, Ptr{Ptr{Cchar}}), plan, backend, reason)
flashattn_plan_get_workspace_size(plan, bytes) = ccall(fptr(:flashattn_plan_get_workspace_size), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Csize_t}), plan, bytes)
flashattn_plan_execute(plan, q, k, v, o, lse, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cfloat}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, q, k, v, o, lse, workspace, workspace_bytes, stream)
flashattn_plan_execute_varlen(plan, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute_varlen), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cfloat}, Ptr{Int32}, Ptr{Int32}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream)
flashattn_plan_get_backward_backend(plan, backend, reason) = ccall(fptr(:flashattn_plan_get_backward_backend), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{flashattn_backend_t}, Ptr{Ptr{Cchar}}), plan, backend, reason)
flashattn_plan_get_backward_workspace_size(plan, bytes) = ccall(fptr(:flashattn_plan_get_backward_workspace_size), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Csize_t}), plan, bytes)
flashattn_plan_execute_backward(plan, q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute_backward), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cfloat}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream)
flashattn_plan_execute_backward_varlen(plan, q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute_backward_varlen), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cfloat}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Int32}, Ptr{Int32}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream)
flashattn_args_create(args) = ccall(fptr(:flashattn_args_create), flashattn_status_t, (Ptr{Ptr{flashattn_args_t}},), args)
flashattn_args_destroy(args) = ccall(fptr(:flashattn_args_destroy), Cvoid, (Ptr{flashattn_args_t},), args)
flashattn_args_set(args, which, ptr) = ccall(fptr(:flashattn_args_set), flashattn_status_t, (Ptr{flashattn_args_t}, flashattn_arg_t, Ptr{Cvoid}), args, which, ptr)
flashattn_args_get(args, which, ptr) = ccall(fptr(:flashattn_args_get), flashattn_status_t, (Ptr{flashattn_args_t}, flashattn_arg_t, Ptr{Ptr{Cvoid}}), args, which, ptr)
flashattn_plan_execute_args(plan, args, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute_args), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{flashattn_args_t}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, args, workspace, workspace_bytes, stream)
flashattn_plan_execute_backward_args(plan, args, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_plan_execute_backward_args), flashattn_status_t, (Ptr{flashattn_plan_t}, Ptr{flashattn_args_t}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, args, workspace, workspace_bytes, stream)
flashattn_rotate_hadamard(dtype, rows, dim, src, src_row_stride, dst, dst_row_stride, seed, device, stream) = ccall(fptr(:flashattn_rotate_hadamard), flashattn_status_t, (flashattn_dtype_t, Int64, Int64, Ptr{Cvoid}, Int64, Ptr{Cvoid}, Int64, UInt64, Int32, flashattn_stream_t), dtype, rows, dim, src, src_row_stride, dst, dst_row_stride, seed, device, stream)
flashattn_plan_merge_states(plan, num_partials, partial_o, partial_lse, partial_dtype, o, lse, stream) = ccall(fptr(:flashattn_plan_merge_states), flashattn_status_t, (Ptr{flashattn_plan_t}, Int32, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cfloat}}, flashattn_dtype_t, Ptr{Cvoid}, Ptr{Cfloat}, flashattn_stream_t), plan, num_partials, partial_o, partial_lse, partial_dtype, o, lse, stream)

# ---------------------------------------------------------------------------------------------
# Errors and information

"A failed call: `status` (a `flashattn_status_t`), the library's `message` and the C function."
struct FlashAttnError <: Exception
    status::Int32
    message::String
    func::String
end

status_string(status::Integer) = unsafe_string(flashattn_status_string(status))

Base.showerror(io::IO, e::FlashAttnError) =
    print(io, "FlashAttnError: ", e.func, ": ", status_string(e.status), ": ", e.message)

"This thread's last error message, copied."
function last_error()
    n = flashattn_last_error_copy(convert(Ptr{Cchar}, C_NULL), 0)
    len = Int(n)
    buf = Vector{UInt8}(undef, len + 1)
    GC.@preserve buf flashattn_last_error_copy(convert(Ptr{Cchar}, pointer(buf)), length(buf))
    return String(buf[1:len])
end

# The status is checked, and the message read, right after the call: no task switch in between.
@inline function check(status, func::String)
    status == FLASHATTN_SUCCESS && return nothing
    throw(FlashAttnError(status, last_error(), func))
end

"Run-time version as a `VersionNumber`."
function version()
    v = Int(flashattn_version())
    return VersionNumber(v ÷ 10000, v ÷ 100 % 100, v % 100)
end
build_info() = unsafe_string(flashattn_build_info())

function device_count()
    n = Ref{Int32}(0)
    check(flashattn_device_count(n), "flashattn_device_count")
    return Int(n[])
end

function device_compute_capability(device::Integer=0)
    major, minor = Ref{Int32}(0), Ref{Int32}(0)
    check(flashattn_device_compute_capability(Int32(device), major, minor), "flashattn_device_compute_capability")
    return (Int(major[]), Int(minor[]))
end

# ---------------------------------------------------------------------------------------------
# Plan

const I64_KEYS = Dict{Symbol,flashattn_i64_param_t}(
    :batch => FLASHATTN_I64_BATCH, :seqlen_q => FLASHATTN_I64_SEQLEN_Q, :seqlen_k => FLASHATTN_I64_SEQLEN_K,
    :heads_q => FLASHATTN_I64_HEADS_Q, :heads_kv => FLASHATTN_I64_HEADS_KV, :head_dim => FLASHATTN_I64_HEAD_DIM,
    :head_dim_v => FLASHATTN_I64_HEAD_DIM_V, :dtype => FLASHATTN_I64_DTYPE, :causal => FLASHATTN_I64_CAUSAL,
    :window_left => FLASHATTN_I64_WINDOW_LEFT, :window_right => FLASHATTN_I64_WINDOW_RIGHT,
    :backend => FLASHATTN_I64_BACKEND, :device => FLASHATTN_I64_DEVICE, :varlen => FLASHATTN_I64_VARLEN,
    :total_q => FLASHATTN_I64_TOTAL_Q, :total_k => FLASHATTN_I64_TOTAL_K,
    :q_batch_stride => FLASHATTN_I64_Q_BATCH_STRIDE, :q_row_stride => FLASHATTN_I64_Q_ROW_STRIDE,
    :q_head_stride => FLASHATTN_I64_Q_HEAD_STRIDE, :k_batch_stride => FLASHATTN_I64_K_BATCH_STRIDE,
    :k_row_stride => FLASHATTN_I64_K_ROW_STRIDE, :k_head_stride => FLASHATTN_I64_K_HEAD_STRIDE,
    :v_batch_stride => FLASHATTN_I64_V_BATCH_STRIDE, :v_row_stride => FLASHATTN_I64_V_ROW_STRIDE,
    :v_head_stride => FLASHATTN_I64_V_HEAD_STRIDE, :o_batch_stride => FLASHATTN_I64_O_BATCH_STRIDE,
    :o_row_stride => FLASHATTN_I64_O_ROW_STRIDE, :o_head_stride => FLASHATTN_I64_O_HEAD_STRIDE,
    :deterministic => FLASHATTN_I64_DETERMINISTIC,
    :do_batch_stride => FLASHATTN_I64_DO_BATCH_STRIDE, :do_row_stride => FLASHATTN_I64_DO_ROW_STRIDE,
    :do_head_stride => FLASHATTN_I64_DO_HEAD_STRIDE, :dq_batch_stride => FLASHATTN_I64_DQ_BATCH_STRIDE,
    :dq_row_stride => FLASHATTN_I64_DQ_ROW_STRIDE, :dq_head_stride => FLASHATTN_I64_DQ_HEAD_STRIDE,
    :dk_batch_stride => FLASHATTN_I64_DK_BATCH_STRIDE, :dk_row_stride => FLASHATTN_I64_DK_ROW_STRIDE,
    :dk_head_stride => FLASHATTN_I64_DK_HEAD_STRIDE, :dv_batch_stride => FLASHATTN_I64_DV_BATCH_STRIDE,
    :dv_row_stride => FLASHATTN_I64_DV_ROW_STRIDE, :dv_head_stride => FLASHATTN_I64_DV_HEAD_STRIDE,
    :paged_kv => FLASHATTN_I64_PAGED_KV, :page_size => FLASHATTN_I64_PAGE_SIZE,
    :num_pages => FLASHATTN_I64_NUM_PAGES, :max_pages_per_sequence => FLASHATTN_I64_MAX_PAGES_PER_SEQUENCE,
    :page_table_stride => FLASHATTN_I64_PAGE_TABLE_STRIDE, :seqused_k => FLASHATTN_I64_SEQUSED_K,
    :new_kv_rows => FLASHATTN_I64_NEW_KV_ROWS, :k_new_batch_stride => FLASHATTN_I64_K_NEW_BATCH_STRIDE,
    :k_new_row_stride => FLASHATTN_I64_K_NEW_ROW_STRIDE, :k_new_head_stride => FLASHATTN_I64_K_NEW_HEAD_STRIDE,
    :v_new_batch_stride => FLASHATTN_I64_V_NEW_BATCH_STRIDE, :v_new_row_stride => FLASHATTN_I64_V_NEW_ROW_STRIDE,
    :v_new_head_stride => FLASHATTN_I64_V_NEW_HEAD_STRIDE, :rotary_dim => FLASHATTN_I64_ROTARY_DIM,
    :rotary_interleaved => FLASHATTN_I64_ROTARY_INTERLEAVED,
    :mask_align => FLASHATTN_I64_MASK_ALIGN, :sink_tokens => FLASHATTN_I64_SINK_TOKENS,
    :sink_logits => FLASHATTN_I64_SINK_LOGITS, :alibi => FLASHATTN_I64_ALIBI,
    :output_dtype => FLASHATTN_I64_OUTPUT_DTYPE, :descale_batch_stride => FLASHATTN_I64_DESCALE_BATCH_STRIDE,
    :descale_head_stride => FLASHATTN_I64_DESCALE_HEAD_STRIDE, :num_splits => FLASHATTN_I64_NUM_SPLITS)
const F64_KEYS = Dict{Symbol,flashattn_f64_param_t}(
    :softmax_scale => FLASHATTN_F64_SOFTMAX_SCALE, :scale => FLASHATTN_F64_SOFTMAX_SCALE,
    :softcap => FLASHATTN_F64_SOFTCAP)
const BACKENDS = Dict{Symbol,flashattn_backend_t}(:auto => FLASHATTN_BACKEND_AUTO, :cpu => FLASHATTN_BACKEND_CPU,
    :fa1 => FLASHATTN_BACKEND_FA1, :fa2 => FLASHATTN_BACKEND_FA2, :fa3 => FLASHATTN_BACKEND_FA3)
const DTYPES = Dict{Symbol,flashattn_dtype_t}(:fp16 => FLASHATTN_DTYPE_FP16, :bf16 => FLASHATTN_DTYPE_BF16,
    :fp32 => FLASHATTN_DTYPE_FP32, :fp8_e4m3 => FLASHATTN_DTYPE_FP8_E4M3)

_enum(table, value::Symbol) = haskey(table, value) ? table[value] :
    throw(ArgumentError("$value is not one of $(join(sort(collect(keys(table))), ", "))"))
_enum(table, value::Integer) = value

"""
    Plan(; batch=2, seqlen_q=128, ..., dtype=:fp32, backend=:cpu, softcap=0.0)

An owned `flashattn_plan_t` with the given parameters set (names are the header's keys in lower
case without the prefix; `scale` is `softmax_scale`). `close(plan)` destroys it now; otherwise the
finalizer does when it is garbage collected. Closing twice is harmless.
"""
mutable struct Plan
    ptr::Ptr{flashattn_plan_t}
    function Plan(; kwargs...)
        out = Ref{Ptr{flashattn_plan_t}}(C_NULL)
        check(flashattn_plan_create(out), "flashattn_plan_create")
        plan = new(out[])
        finalizer(_destroy!, plan)
        try
            for (key, value) in kwargs
                if haskey(F64_KEYS, key)
                    set_f64!(plan, F64_KEYS[key], value)
                elseif key === :dtype
                    set_i64!(plan, FLASHATTN_I64_DTYPE, _enum(DTYPES, value))
                elseif key === :backend
                    set_i64!(plan, FLASHATTN_I64_BACKEND, _enum(BACKENDS, value))
                elseif haskey(I64_KEYS, key)
                    set_i64!(plan, I64_KEYS[key], Int64(value))
                else
                    throw(ArgumentError("unknown plan parameter $key"))
                end
            end
        catch
            _destroy!(plan)
            rethrow()
        end
        return plan
    end
end

function _destroy!(plan::Plan)
    if plan.ptr != C_NULL
        flashattn_plan_destroy(plan.ptr)
        plan.ptr = C_NULL
    end
    return nothing
end

Base.close(plan::Plan) = _destroy!(plan)
Base.isopen(plan::Plan) = plan.ptr != C_NULL

function _ptr(plan::Plan)
    plan.ptr == C_NULL && throw(ArgumentError("FlashAttn.Plan: the plan is closed"))
    return plan.ptr
end

set_i64!(plan::Plan, key::Integer, value::Integer) =
    (check(flashattn_plan_set_i64(_ptr(plan), key, value), "flashattn_plan_set_i64"); plan)
set_f64!(plan::Plan, key::Integer, value::Real) =
    (check(flashattn_plan_set_f64(_ptr(plan), key, Float64(value)), "flashattn_plan_set_f64"); plan)

function get_i64(plan::Plan, key::Integer)
    out = Ref{Int64}(0)
    check(flashattn_plan_get_i64(_ptr(plan), key, out), "flashattn_plan_get_i64")
    return out[]
end

function get_f64(plan::Plan, key::Integer)
    out = Ref{Cdouble}(0)
    check(flashattn_plan_get_f64(_ptr(plan), key, out), "flashattn_plan_get_f64")
    return out[]
end

finalize!(plan::Plan) = (check(flashattn_plan_finalize(_ptr(plan)), "flashattn_plan_finalize"); plan)

# `(backend::Symbol, reason::String)` through `getter`, the raw wrapper of the C getter `cname`
# (flashattn_plan_get_backend or its backward twin).
function _read_backend(plan::Plan, getter, cname)
    b = Ref{flashattn_backend_t}(0)
    reason = Ref{Ptr{Cchar}}(C_NULL)
    check(getter(_ptr(plan), b, reason), cname)
    name = :unknown
    for (k, v) in BACKENDS
        v == b[] && (name = k)
    end
    return name, reason[] == C_NULL ? "" : unsafe_string(reason[])
end

# Bytes through `getter`, the raw wrapper of the C getter `cname` (a workspace size).
function _read_size(plan::Plan, getter, cname)
    n = Ref{Csize_t}(0)
    check(getter(_ptr(plan), n), cname)
    return Int(n[])
end

"`(backend::Symbol, reason::String)` of a finalized plan."
backend(plan::Plan) = _read_backend(plan, flashattn_plan_get_backend, "flashattn_plan_get_backend")

workspace_size(plan::Plan) = _read_size(plan, flashattn_plan_get_workspace_size, "flashattn_plan_get_workspace_size")

"Host workspace: (owner, 256-byte aligned pointer) of at least `bytes` bytes."
function host_workspace(bytes::Integer)
    bytes == 0 && return (UInt8[], C_NULL)
    buf = Vector{UInt8}(undef, bytes + 256)
    addr = UInt(pointer(buf))
    return buf, Ptr{Cvoid}(addr + (256 - addr % 256) % 256)
end

# (owner, pointer, bytes) of the caller's workspace array, or when it is `nothing` of a host
# workspace of `bytes_of(plan)` bytes (workspace_size or backward_workspace_size) allocated here.
function _workspace(plan, workspace, bytes_of)
    workspace === nothing || return (workspace, pointer(workspace), sizeof(workspace))
    need = bytes_of(plan)
    owner, ws = host_workspace(need)
    return (owner, ws, need)
end

"Elements each tensor of a finalized plan spans (host arrays must hold at least that many)."
function extents(plan::Plan)
    workspace_size(plan)  # INVALID_STATE with the library's message when not finalized
    g(key) = get_i64(plan, key)
    varlen = g(FLASHATTN_I64_VARLEN) == 1
    batch = g(FLASHATTN_I64_BATCH)
    rows_q = varlen ? g(FLASHATTN_I64_TOTAL_Q) : g(FLASHATTN_I64_SEQLEN_Q)
    rows_k = varlen ? g(FLASHATTN_I64_TOTAL_K) : g(FLASHATTN_I64_SEQLEN_K)
    hq, hkv = g(FLASHATTN_I64_HEADS_Q), g(FLASHATTN_I64_HEADS_KV)
    d, dv = g(FLASHATTN_I64_HEAD_DIM), g(FLASHATTN_I64_HEAD_DIM_V)
    function span(rows, heads, dim, bs, rs, hs)
        rows == 0 && return 0
        e = dim + (rows - 1) * g(rs) + (heads - 1) * g(hs)
        return varlen ? e : e + (batch - 1) * g(bs)
    end
    return (q = span(rows_q, hq, d, FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE),
            k = span(rows_k, hkv, d, FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE),
            v = span(rows_k, hkv, dv, FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE),
            o = span(rows_q, hq, dv, FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE),
            lse = (varlen ? 1 : batch) * hq * rows_q, cu_seqlens = varlen ? batch + 1 : 0,
            dtype = flashattn_dtype_t(g(FLASHATTN_I64_DTYPE)),
            dout = span(rows_q, hq, dv, FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE),
            dq = span(rows_q, hq, d, FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE),
            dk = span(rows_k, hkv, d, FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE),
            dv = span(rows_k, hkv, dv, FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE))
end

"The `flashattn_dtype_t` of a Julia element type (Float32, Float16, or a 2-byte BFloat16 type)."
dtype_of(::Type{Float32}) = FLASHATTN_DTYPE_FP32
dtype_of(::Type{Float16}) = FLASHATTN_DTYPE_FP16
function dtype_of(::Type{T}) where {T}
    nameof(T) === :BFloat16 && sizeof(T) == 2 && return FLASHATTN_DTYPE_BF16
    throw(ArgumentError("element type $T: libflashattn takes Float32, Float16 or BFloat16"))
end

# Checks host arrays against a finalized plan whose pass (`pass_backend`: backend or
# backward_backend; `pass` names it in the message) runs on the CPU backend: q's element type, then
# each (name, array) of `arrays` (an array `nothing` is skipped) against the extent of that name,
# then the cu_seqlens when `cu` is not `nothing`.
function _check_arrays(plan, pass_backend, pass, q, arrays, cu)
    e = extents(plan)
    name, _ = pass_backend(plan)
    name === :cpu || throw(ArgumentError("Julia arrays are host memory and need the CPU backend; $pass runs $name"))
    dtype_of(eltype(q)) == e.dtype || throw(ArgumentError("element type $(eltype(q)) does not match the plan's dtype"))
    for (n, a) in arrays
        need = e[n]
        a === nothing || length(a) >= need || throw(DimensionMismatch("$n holds $(length(a)) elements, the plan needs $need"))
    end
    if cu !== nothing
        for c in cu
            length(c) >= e.cu_seqlens || throw(DimensionMismatch("cu_seqlens hold $(length(c)) entries, the plan needs $(e.cu_seqlens)"))
        end
    end
    return nothing
end

_check_host(plan, q, k, v, o, lse, cu) =
    _check_arrays(plan, backend, "this plan", q, ((:q, q), (:k, k), (:v, v), (:o, o), (:lse, lse)), cu)

"""
    execute!(plan, q, k, v, o; lse=nothing, workspace=nothing)

Run a finalized fixed-length plan on host arrays (CPU backend), laid out as the plan's strides
say; `lse` (Float32, `batch*heads_q*seqlen_q` elements) is optional. A workspace is allocated
when none is given.
"""
function execute!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T};
                  lse::Union{Nothing,DenseArray{Float32}}=nothing, workspace=nothing) where {T}
    _check_host(plan, q, k, v, o, lse, nothing)
    owner, ws, nbytes = _workspace(plan, workspace, workspace_size)
    GC.@preserve q k v o lse owner begin
        lp = lse === nothing ? convert(Ptr{Cfloat}, C_NULL) : pointer(lse)
        check(flashattn_plan_execute(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o), lp, ws, nbytes, C_NULL),
              "flashattn_plan_execute")
    end
    return o
end

"""
    execute!(plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr; lse=C_NULL, workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

`flashattn_plan_execute` with raw pointers: device memory and a `cudaStream_t` for GPU backends
(from CUDA.jl: `reinterpret(Ptr{Cvoid}, pointer(x))` and `stream().handle`). Nothing is checked
here; keep the memory alive until the stream has run the work.
"""
function execute!(plan::Plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr; lse::Ptr=C_NULL, workspace::Ptr=C_NULL,
                  workspace_bytes::Integer=0, stream::Ptr=C_NULL)
    check(flashattn_plan_execute(_ptr(plan), q, k, v, o, convert(Ptr{Cfloat}, lse), workspace, workspace_bytes, stream),
          "flashattn_plan_execute")
    return nothing
end

# The tensors execute_args! takes by keyword, in flashattn_arg_t order after q, k, v, o.
const _SERVING_ARGS = (:lse => FLASHATTN_ARG_LSE, :cu_seqlens_q => FLASHATTN_ARG_CU_SEQLENS_Q,
                       :cu_seqlens_k => FLASHATTN_ARG_CU_SEQLENS_K, :page_table => FLASHATTN_ARG_PAGE_TABLE,
                       :seqused_k => FLASHATTN_ARG_SEQUSED_K, :k_new => FLASHATTN_ARG_K_NEW,
                       :v_new => FLASHATTN_ARG_V_NEW, :rotary_cos => FLASHATTN_ARG_ROTARY_COS,
                       :rotary_sin => FLASHATTN_ARG_ROTARY_SIN)

_address(x::Nothing) = C_NULL
# The attention variants' per-head Float32 arrays (since 0.3), for execute_args! and backward_args!.
const _VARIANT_ARGS = (:sink_logits => FLASHATTN_ARG_SINK_LOGITS, :alibi_slopes => FLASHATTN_ARG_ALIBI_SLOPES)
# FP8 plans' Float32 descale arrays (since 0.3), laid out by descale_batch_stride / descale_head_stride.
const _FP8_ARGS = (:descale_q => FLASHATTN_ARG_DESCALE_Q, :descale_k => FLASHATTN_ARG_DESCALE_K,
                   :descale_v => FLASHATTN_ARG_DESCALE_V)
_address(x::Ptr) = convert(Ptr{Cvoid}, x)
_address(x::DenseArray) = convert(Ptr{Cvoid}, pointer(x))

"""
    execute_args!(plan, q, k, v, o; lse, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, k_new,
                  v_new, rotary_cos, rotary_sin, workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

`flashattn_plan_execute_args` (since 0.3): the call for paged K/V caches (`page_table`, Int32
[max_pages, batch] in Julia's column order), `seqused_k` (Int32 per sequence) and appending
`k_new`/`v_new` rows with a rotary embedding (`rotary_cos`/`rotary_sin`, Float32). Tensors are
arrays (kept alive for the call) or raw pointers; `nothing` leaves one unset. `workspace`: an
array, a raw pointer with `workspace_bytes`, or `nothing` (a host workspace allocated for the call). With new_kv_rows > 0
the caches `k`, `v` are written at each sequence's `seqused_k`, which the library never writes:
advance it by new_kv_rows after the call. FP8 plans (since 0.3) take `q`, `k`, `v` as E4M3 bytes
(`UInt8` arrays) and `descale_q`, `descale_k`, `descale_v` (Float32). Nothing is checked here beyond
what the library checks.
"""
function execute_args!(plan::Plan, q, k, v, o; workspace=nothing, workspace_bytes::Integer=0, stream::Ptr=C_NULL,
                       tensors...)
    known = Dict((_SERVING_ARGS..., _VARIANT_ARGS..., _FP8_ARGS...))
    for name in keys(tensors)
        haskey(known, name) || throw(ArgumentError("execute_args!: unknown tensor $name"))
    end
    # a raw workspace pointer as given; an array, or nothing (a host workspace made here), as execute! takes them
    owner, ws, bytes = workspace isa Ptr ? (nothing, workspace, workspace_bytes) : _workspace(plan, workspace, workspace_size)
    handle = Ref{Ptr{flashattn_args_t}}(C_NULL)
    check(flashattn_args_create(handle), "flashattn_args_create")
    try
        GC.@preserve q k v o tensors owner begin
            for (which, x) in ((FLASHATTN_ARG_Q, q), (FLASHATTN_ARG_K, k), (FLASHATTN_ARG_V, v), (FLASHATTN_ARG_O, o))
                check(flashattn_args_set(handle[], which, _address(x)), "flashattn_args_set")
            end
            for (name, x) in pairs(tensors)
                check(flashattn_args_set(handle[], known[name], _address(x)), "flashattn_args_set")
            end
            check(flashattn_plan_execute_args(_ptr(plan), handle[], ws, bytes, stream), "flashattn_plan_execute_args")
        end
    finally
        flashattn_args_destroy(handle[])
    end
    return nothing
end

"Variable-length counterpart of [`execute!`](@ref) on host arrays; `cu_seqlens_*` are Int32 prefix sums."
function execute_varlen!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T},
                         cu_seqlens_q::Vector{Int32}, cu_seqlens_k::Vector{Int32};
                         lse::Union{Nothing,DenseArray{Float32}}=nothing, workspace=nothing) where {T}
    _check_host(plan, q, k, v, o, lse, (cu_seqlens_q, cu_seqlens_k))
    owner, ws, nbytes = _workspace(plan, workspace, workspace_size)
    GC.@preserve q k v o lse owner cu_seqlens_q cu_seqlens_k begin
        lp = lse === nothing ? convert(Ptr{Cfloat}, C_NULL) : pointer(lse)
        check(flashattn_plan_execute_varlen(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o), lp,
                                            pointer(cu_seqlens_q), pointer(cu_seqlens_k), ws, nbytes, C_NULL),
              "flashattn_plan_execute_varlen")
    end
    return o
end

"`flashattn_plan_execute_varlen` with raw (device) pointers; see the raw [`execute!`](@ref)."
function execute_varlen!(plan::Plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr, cu_seqlens_q::Ptr, cu_seqlens_k::Ptr;
                         lse::Ptr=C_NULL, workspace::Ptr=C_NULL, workspace_bytes::Integer=0, stream::Ptr=C_NULL)
    check(flashattn_plan_execute_varlen(_ptr(plan), q, k, v, o, convert(Ptr{Cfloat}, lse),
                                        convert(Ptr{Int32}, cu_seqlens_q), convert(Ptr{Int32}, cu_seqlens_k),
                                        workspace, workspace_bytes, stream),
          "flashattn_plan_execute_varlen")
    return nothing
end

# ---------------------------------------------------------------------------------------------
# Backward pass

"`(backend::Symbol, reason::String)` that runs a finalized plan's backward pass (may differ from the forward's)."
backward_backend(plan::Plan) =
    _read_backend(plan, flashattn_plan_get_backward_backend, "flashattn_plan_get_backward_backend")

"Bytes of workspace each backward execute of a finalized plan needs (separate from [`workspace_size`](@ref))."
backward_workspace_size(plan::Plan) =
    _read_size(plan, flashattn_plan_get_backward_workspace_size, "flashattn_plan_get_backward_workspace_size")

_check_backward_host(plan, q, k, v, o, dout, lse, dq, dk, dv, cu) =
    _check_arrays(plan, backward_backend, "this plan's backward", q,
                  ((:q, q), (:k, k), (:v, v), (:o, o), (:dout, dout), (:lse, lse), (:dq, dq), (:dk, dk), (:dv, dv)), cu)

"""
    backward!(plan, q, k, v, o, dout, lse, dq, dk, dv; workspace=nothing)

The backward pass of a finalized fixed-length plan on host arrays (CPU backend): from the forward's
`q`, `k`, `v`, `o`, its Float32 `lse` and `dout` (the gradient of the loss with respect to `o`,
laid out as `o` with the `do_*` strides), writes `dq`, `dk`, `dv` (layouts of `q`, `k`, `v` with
the `dq_*`, `dk_*`, `dv_*` strides). A workspace of [`backward_workspace_size`](@ref) bytes is
allocated when none is given. Returns `(dq, dk, dv)`.
"""
function backward!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T},
                   dout::DenseArray{T}, lse::DenseArray{Float32}, dq::DenseArray{T}, dk::DenseArray{T},
                   dv::DenseArray{T}; workspace=nothing) where {T}
    _check_backward_host(plan, q, k, v, o, dout, lse, dq, dk, dv, nothing)
    owner, ws, nbytes = _workspace(plan, workspace, backward_workspace_size)
    GC.@preserve q k v o dout lse dq dk dv owner begin
        check(flashattn_plan_execute_backward(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o), pointer(dout),
                                              pointer(lse), pointer(dq), pointer(dk), pointer(dv), ws, nbytes, C_NULL),
              "flashattn_plan_execute_backward")
    end
    return dq, dk, dv
end

"""
    backward!(plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr, dout::Ptr, lse::Ptr, dq::Ptr, dk::Ptr, dv::Ptr;
              workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

`flashattn_plan_execute_backward` with raw (device) pointers; see the raw [`execute!`](@ref).
"""
function backward!(plan::Plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr, dout::Ptr, lse::Ptr, dq::Ptr, dk::Ptr, dv::Ptr;
                   workspace::Ptr=C_NULL, workspace_bytes::Integer=0, stream::Ptr=C_NULL)
    check(flashattn_plan_execute_backward(_ptr(plan), q, k, v, o, dout, convert(Ptr{Cfloat}, lse), dq, dk, dv,
                                          workspace, workspace_bytes, stream),
          "flashattn_plan_execute_backward")
    return nothing
end

"Variable-length counterpart of [`backward!`](@ref) on packed host arrays; `cu_seqlens_*` are Int32 prefix sums."
function backward_varlen!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T},
                          dout::DenseArray{T}, lse::DenseArray{Float32}, dq::DenseArray{T}, dk::DenseArray{T},
                          dv::DenseArray{T}, cu_seqlens_q::Vector{Int32}, cu_seqlens_k::Vector{Int32};
                          workspace=nothing) where {T}
    _check_backward_host(plan, q, k, v, o, dout, lse, dq, dk, dv, (cu_seqlens_q, cu_seqlens_k))
    owner, ws, nbytes = _workspace(plan, workspace, backward_workspace_size)
    GC.@preserve q k v o dout lse dq dk dv owner cu_seqlens_q cu_seqlens_k begin
        check(flashattn_plan_execute_backward_varlen(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o),
                                                     pointer(dout), pointer(lse), pointer(dq), pointer(dk), pointer(dv),
                                                     pointer(cu_seqlens_q), pointer(cu_seqlens_k), ws, nbytes, C_NULL),
              "flashattn_plan_execute_backward_varlen")
    end
    return dq, dk, dv
end

"`flashattn_plan_execute_backward_varlen` with raw (device) pointers; see the raw [`execute!`](@ref)."
function backward_varlen!(plan::Plan, q::Ptr, k::Ptr, v::Ptr, o::Ptr, dout::Ptr, lse::Ptr, dq::Ptr, dk::Ptr, dv::Ptr,
                          cu_seqlens_q::Ptr, cu_seqlens_k::Ptr; workspace::Ptr=C_NULL, workspace_bytes::Integer=0,
                          stream::Ptr=C_NULL)
    check(flashattn_plan_execute_backward_varlen(_ptr(plan), q, k, v, o, dout, convert(Ptr{Cfloat}, lse), dq, dk, dv,
                                                 convert(Ptr{Int32}, cu_seqlens_q), convert(Ptr{Int32}, cu_seqlens_k),
                                                 workspace, workspace_bytes, stream),
          "flashattn_plan_execute_backward_varlen")
    return nothing
end

# ---------------------------------------------------------------------------------------------
# Attention variants and merging partial states (since 0.3)

_head_ptr(plan, x::Nothing, name) = convert(Ptr{Cfloat}, C_NULL)
function _head_ptr(plan, x::DenseArray{Float32}, name)
    length(x) >= get_i64(plan, FLASHATTN_I64_HEADS_Q) || throw(DimensionMismatch("$name holds $(length(x)) values, fewer than heads_q"))
    return pointer(x)
end

"""
    backward_args!(plan, q, k, v, o, dout, lse, dq, dk, dv; cu_seqlens_q, cu_seqlens_k, sink_logits,
                   alibi_slopes, dsink_logits, workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

`flashattn_plan_execute_backward_args` (since 0.3): the backward pass through an argument set, with
the variant arrays the plan uses (`dsink_logits` receives the sink logits' gradient). Tensors are
arrays (kept alive for the call) or raw pointers; `nothing` leaves one unset; `workspace` as for
[`execute_args!`](@ref), sized by [`backward_workspace_size`](@ref).
"""
function backward_args!(plan::Plan, q, k, v, o, dout, lse, dq, dk, dv; workspace=nothing,
                        workspace_bytes::Integer=0, stream::Ptr=C_NULL, tensors...)
    known = Dict((:cu_seqlens_q => FLASHATTN_ARG_CU_SEQLENS_Q, :cu_seqlens_k => FLASHATTN_ARG_CU_SEQLENS_K,
                  :dsink_logits => FLASHATTN_ARG_DSINK_LOGITS, _VARIANT_ARGS...))
    for name in keys(tensors)
        haskey(known, name) || throw(ArgumentError("backward_args!: unknown tensor $name"))
    end
    owner, ws, bytes = workspace isa Ptr ? (nothing, workspace, workspace_bytes) :
                       _workspace(plan, workspace, backward_workspace_size)
    handle = Ref{Ptr{flashattn_args_t}}(C_NULL)
    check(flashattn_args_create(handle), "flashattn_args_create")
    try
        GC.@preserve q k v o dout lse dq dk dv tensors owner begin
            for (which, x) in ((FLASHATTN_ARG_Q, q), (FLASHATTN_ARG_K, k), (FLASHATTN_ARG_V, v), (FLASHATTN_ARG_O, o),
                               (FLASHATTN_ARG_DOUT, dout), (FLASHATTN_ARG_LSE, lse), (FLASHATTN_ARG_DQ, dq),
                               (FLASHATTN_ARG_DK, dk), (FLASHATTN_ARG_DV, dv))
                check(flashattn_args_set(handle[], which, _address(x)), "flashattn_args_set")
            end
            for (name, x) in pairs(tensors)
                x === nothing || check(flashattn_args_set(handle[], known[name], _address(x)), "flashattn_args_set")
            end
            check(flashattn_plan_execute_backward_args(_ptr(plan), handle[], ws, bytes, stream),
                  "flashattn_plan_execute_backward_args")
        end
    finally
        flashattn_args_destroy(handle[])
    end
    return nothing
end

"""
    execute_variants!(plan, q, k, v, o; lse=nothing, cu_seqlens=nothing, sink_logits=nothing,
                      alibi_slopes=nothing, workspace=nothing)

[`execute!`](@ref) (or, with `cu_seqlens = (cu_q, cu_k)`, [`execute_varlen!`](@ref)) on host
arrays through an argument set, with the per-head Float32 arrays the plan's `sink_logits` /
`alibi` keys ask for.
"""
function execute_variants!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T};
                           lse::Union{Nothing,DenseArray{Float32}}=nothing, cu_seqlens=nothing,
                           sink_logits=nothing, alibi_slopes=nothing, workspace=nothing) where {T}
    _check_host(plan, q, k, v, o, lse, cu_seqlens)
    _head_ptr(plan, sink_logits, "sink_logits"), _head_ptr(plan, alibi_slopes, "alibi_slopes")  # lengths
    cq, ck = cu_seqlens === nothing ? (nothing, nothing) : cu_seqlens
    execute_args!(plan, q, k, v, o; lse=lse, cu_seqlens_q=cq, cu_seqlens_k=ck, sink_logits=sink_logits,
                  alibi_slopes=alibi_slopes, workspace=workspace)
    return o
end

"""
    backward_variants!(plan, q, k, v, o, dout, lse, dq, dk, dv; cu_seqlens=nothing, sink_logits=nothing,
                       alibi_slopes=nothing, dsink_logits=nothing, workspace=nothing)

[`backward!`](@ref) through an argument set with the variant arrays; with sink logits,
`dsink_logits` (Float32, `heads_q`) receives their gradient.
"""
function backward_variants!(plan::Plan, q::DenseArray{T}, k::DenseArray{T}, v::DenseArray{T}, o::DenseArray{T},
                            dout::DenseArray{T}, lse::DenseArray{Float32}, dq::DenseArray{T}, dk::DenseArray{T},
                            dv::DenseArray{T}; cu_seqlens=nothing, sink_logits=nothing, alibi_slopes=nothing,
                            dsink_logits=nothing, workspace=nothing) where {T}
    _check_backward_host(plan, q, k, v, o, dout, lse, dq, dk, dv, cu_seqlens)
    for (x, name) in ((sink_logits, "sink_logits"), (alibi_slopes, "alibi_slopes"), (dsink_logits, "dsink_logits"))
        _head_ptr(plan, x, name)  # lengths
    end
    cq, ck = cu_seqlens === nothing ? (nothing, nothing) : cu_seqlens
    backward_args!(plan, q, k, v, o, dout, lse, dq, dk, dv; cu_seqlens_q=cq, cu_seqlens_k=ck, sink_logits=sink_logits,
                   alibi_slopes=alibi_slopes, dsink_logits=dsink_logits, workspace=workspace)
    return dq, dk, dv
end

"""
    rotate_hadamard!(x, dim; seed=0)

`flashattn_rotate_hadamard` (since 0.3) on a host array: each run of `dim` consecutive elements
(a row; `dim` a power of two in [8, 256], `length(x)` a multiple of it) is rotated in place by the
random-sign Hadamard matrix of `seed` scaled by 1/sqrt(dim). Rotating Q and K with one seed leaves
Q·Kᵀ unchanged and spreads outliers before FP8 quantization. Returns `x`.
"""
function rotate_hadamard!(x::DenseArray{T}, dim::Integer; seed::Integer=0) where {T}
    (dim > 0 && length(x) % dim == 0) || throw(ArgumentError("x: $(length(x)) elements is not a whole number of rows of dim = $dim"))
    GC.@preserve x begin
        p = convert(Ptr{Cvoid}, pointer(x))
        check(flashattn_rotate_hadamard(dtype_of(T), Int64(length(x) ÷ dim), Int64(dim), p, Int64(dim), p, Int64(dim),
                                        UInt64(seed), Int32(-1), C_NULL), "flashattn_rotate_hadamard")
    end
    return x
end

"""
    merge_states!(plan, partial_o, partial_lse, o; lse=nothing)

Merge partial attention states on host arrays (CPU backend): `partial_o[s]` laid out as the plan's
O (Float32 or the plan's element type, the same for all), `partial_lse[s]` (Float32) as its LSE;
writes `o` (and `lse`). Returns `o`.
"""
function merge_states!(plan::Plan, partial_o::AbstractVector{<:DenseArray{P}},
                       partial_lse::AbstractVector{<:DenseArray{Float32}}, o::DenseArray{T};
                       lse::Union{Nothing,DenseArray{Float32}}=nothing) where {P,T}
    length(partial_o) == length(partial_lse) ||
        throw(ArgumentError("partial_o and partial_lse: $(length(partial_o)) and $(length(partial_lse)) entries"))
    dtype = P === Float32 ? FLASHATTN_DTYPE_FP32 : flashattn_dtype_t(get_i64(plan, FLASHATTN_I64_DTYPE))
    GC.@preserve partial_o partial_lse o lse begin
        po = Ptr{Cvoid}[pointer(x) for x in partial_o]
        pl = Ptr{Cfloat}[pointer(x) for x in partial_lse]
        lp = lse === nothing ? convert(Ptr{Cfloat}, C_NULL) : pointer(lse)
        check(flashattn_plan_merge_states(plan.ptr, Int32(length(po)), po, pl, dtype, pointer(o), lp, C_NULL),
              "flashattn_plan_merge_states")
    end
    return o
end

# ---------------------------------------------------------------------------------------------
# One-call attention on host arrays

# (batch, row, head) element strides of a (dim, heads, seq[, batch]) array; size-1 dimensions get
# the contiguous value (their stride is meaningless and may be anything).
function _strides(a::AbstractArray)
    stride(a, 1) == 1 || throw(ArgumentError("the head dimension (first Julia dimension) must be contiguous"))
    d, h, s = size(a, 1), size(a, 2), size(a, 3)
    head = h > 1 ? stride(a, 2) : d
    row = s > 1 ? stride(a, 3) : h * head
    batch = ndims(a) == 4 && size(a, 4) > 1 ? stride(a, 4) : s * row
    return batch, row, head
end

function _options!(plan, T, causal, window, softcap, scale, backend_choice)
    set_i64!(plan, FLASHATTN_I64_DTYPE, dtype_of(T))
    set_i64!(plan, FLASHATTN_I64_CAUSAL, causal ? 1 : 0)
    set_i64!(plan, FLASHATTN_I64_WINDOW_LEFT, window[1])
    set_i64!(plan, FLASHATTN_I64_WINDOW_RIGHT, window[2])
    set_i64!(plan, FLASHATTN_I64_BACKEND, _enum(BACKENDS, backend_choice))
    set_f64!(plan, FLASHATTN_F64_SOFTCAP, softcap)
    scale === nothing || set_f64!(plan, FLASHATTN_F64_SOFTMAX_SCALE, scale)
end

const _FORWARD_STRIDES = ((FLASHATTN_I64_Q_BATCH_STRIDE, FLASHATTN_I64_Q_ROW_STRIDE, FLASHATTN_I64_Q_HEAD_STRIDE),
                          (FLASHATTN_I64_K_BATCH_STRIDE, FLASHATTN_I64_K_ROW_STRIDE, FLASHATTN_I64_K_HEAD_STRIDE),
                          (FLASHATTN_I64_V_BATCH_STRIDE, FLASHATTN_I64_V_ROW_STRIDE, FLASHATTN_I64_V_HEAD_STRIDE),
                          (FLASHATTN_I64_O_BATCH_STRIDE, FLASHATTN_I64_O_ROW_STRIDE, FLASHATTN_I64_O_HEAD_STRIDE))
const _BACKWARD_STRIDES = ((FLASHATTN_I64_DO_BATCH_STRIDE, FLASHATTN_I64_DO_ROW_STRIDE, FLASHATTN_I64_DO_HEAD_STRIDE),
                           (FLASHATTN_I64_DQ_BATCH_STRIDE, FLASHATTN_I64_DQ_ROW_STRIDE, FLASHATTN_I64_DQ_HEAD_STRIDE),
                           (FLASHATTN_I64_DK_BATCH_STRIDE, FLASHATTN_I64_DK_ROW_STRIDE, FLASHATTN_I64_DK_HEAD_STRIDE),
                           (FLASHATTN_I64_DV_BATCH_STRIDE, FLASHATTN_I64_DV_ROW_STRIDE, FLASHATTN_I64_DV_HEAD_STRIDE))

function _set_strides!(plan, arrays, keys=_FORWARD_STRIDES)
    for (a, ks) in zip(arrays, keys)
        b, r, h = _strides(a)
        ndims(a) == 4 && set_i64!(plan, ks[1], b)
        set_i64!(plan, ks[2], r)
        set_i64!(plan, ks[3], h)
    end
end

# (d, hq, sq, b, hkv, sk, dv) of fixed-length (dim, heads, seq, batch) arrays q, k, v that fit together.
function _fixed_sizes(q, k, v)
    d, hq, sq, b = size(q)
    dk, hkv, sk, bk = size(k)
    dv, hv, sv, bv = size(v)
    (dk == d && bk == b && bv == b && hv == hkv && sv == sk) ||
        throw(DimensionMismatch("q $(size(q)), k $(size(k)), v $(size(v)) do not fit together"))
    return (d, hq, sq, b, hkv, sk, dv)
end

# (cq, ck, d, hq, tq, hkv, tk, dv): the cu_seqlens as Int32 vectors and the sizes of packed
# (dim, heads, total) arrays q, k, v that fit together.
function _varlen_sizes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    cq, ck = Vector{Int32}(cu_seqlens_q), Vector{Int32}(cu_seqlens_k)
    (length(cq) >= 2 && length(cq) == length(ck)) || throw(ArgumentError("cu_seqlens need batch+1 >= 2 entries each"))
    d, hq, tq = size(q)
    dk, hkv, tk = size(k)
    dv = size(v, 1)
    (dk == d && size(v, 2) == hkv && size(v, 3) == tk) ||
        throw(DimensionMismatch("q $(size(q)), k $(size(k)), v $(size(v)) do not fit together"))
    return (cq, ck, d, hq, tq, hkv, tk, dv)
end

# The longest sequence of a cu_seqlens prefix sum (at least 1).
_maxlen(c) = max(1, maximum(diff(Int64.(c))))

"""
    attention(q, k, v; causal=false, window=(-1, -1), softcap=0.0, scale=nothing, backend=:cpu)

Exact attention on host arrays (CPU backend). `q` is `(head_dim, heads_q, seqlen_q, batch)`,
`k` `(head_dim, heads_kv, seqlen_k, batch)`, `v` `(head_dim_v, heads_kv, seqlen_k, batch)`:
the C layout `[batch, seq, heads, dim]` seen column-major. Strided arrays are used in place when
their first dimension is contiguous. Returns `(o, lse)`: `o` is `(head_dim_v, heads_q, seqlen_q,
batch)`, `lse` is Float32 `(seqlen_q, heads_q, batch)`.
"""
function attention(q::StridedArray{T,4}, k::StridedArray{T,4}, v::StridedArray{T,4};
                   causal::Bool=false, window=(-1, -1), softcap::Real=0.0, scale=nothing,
                   backend::Symbol=:cpu) where {T}
    d, hq, sq, b, hkv, sk, dv = _fixed_sizes(q, k, v)
    o = Array{T}(undef, dv, hq, sq, b)
    lse = Array{Float32}(undef, sq, hq, b)
    plan = Plan(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=d, head_dim_v=dv)
    try
        _options!(plan, T, causal, window, softcap, scale, backend)
        _set_strides!(plan, (q, k, v, o))
        finalize!(plan)
        owner, ws = host_workspace(workspace_size(plan))
        GC.@preserve q k v o lse owner begin
            check(flashattn_plan_execute(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o), pointer(lse), ws,
                                         workspace_size(plan), C_NULL), "flashattn_plan_execute")
        end
    finally
        close(plan)
    end
    return o, lse
end

"""
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k; causal=false, window=(-1, -1), softcap=0.0, scale=nothing)

Variable-length attention on packed host arrays: `q` `(head_dim, heads_q, total_q)`, `k`/`v`
`(dim, heads_kv, total_k)`, `cu_seqlens_*` Int32 prefix sums of batch+1 entries. Returns `(o, lse)`
with `o` `(head_dim_v, heads_q, total_q)` and `lse` `(total_q, heads_q)`.
"""
function attention_varlen(q::StridedArray{T,3}, k::StridedArray{T,3}, v::StridedArray{T,3},
                          cu_seqlens_q::AbstractVector{<:Integer}, cu_seqlens_k::AbstractVector{<:Integer};
                          causal::Bool=false, window=(-1, -1), softcap::Real=0.0, scale=nothing,
                          backend::Symbol=:cpu) where {T}
    cq, ck, d, hq, tq, hkv, tk, dv = _varlen_sizes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    o = Array{T}(undef, dv, hq, tq)
    lse = Array{Float32}(undef, tq, hq)
    plan = Plan(batch=length(cq) - 1, seqlen_q=_maxlen(cq), seqlen_k=_maxlen(ck), heads_q=hq, heads_kv=hkv,
                head_dim=d, head_dim_v=dv, varlen=1, total_q=tq, total_k=tk)
    try
        _options!(plan, T, causal, window, softcap, scale, backend)
        _set_strides!(plan, (q, k, v, o))
        finalize!(plan)
        owner, ws = host_workspace(workspace_size(plan))
        GC.@preserve q k v o lse owner cq ck begin
            check(flashattn_plan_execute_varlen(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o), pointer(lse),
                                                pointer(cq), pointer(ck), ws, workspace_size(plan), C_NULL),
                  "flashattn_plan_execute_varlen")
        end
    finally
        close(plan)
    end
    return o, lse
end

"""
    attention_backward(q, k, v, o, lse, dout; causal=false, window=(-1, -1), softcap=0.0, scale=nothing, deterministic=false)

Gradients of [`attention`](@ref) on host arrays (CPU backend): from the forward's `q`, `k`, `v`,
its `(o, lse)` and `dout` (the gradient of the loss with respect to `o`, same size as `o`), returns
`(dq, dk, dv)` of the sizes of `q`, `k`, `v`. The keyword arguments must be the forward's.
"""
function attention_backward(q::StridedArray{T,4}, k::StridedArray{T,4}, v::StridedArray{T,4}, o::StridedArray{T,4},
                            lse::DenseArray{Float32,3}, dout::StridedArray{T,4}; causal::Bool=false, window=(-1, -1),
                            softcap::Real=0.0, scale=nothing, backend::Symbol=:cpu, deterministic::Bool=false) where {T}
    d, hq, sq, b, hkv, sk, dv_ = _fixed_sizes(q, k, v)
    (size(o) == size(dout) == (dv_, hq, sq, b) && size(lse) == (sq, hq, b)) ||
        throw(DimensionMismatch("o $(size(o)), dout $(size(dout)), lse $(size(lse)) do not fit q, k, v"))
    dq, dk, dv = Array{T}(undef, size(q)), Array{T}(undef, size(k)), Array{T}(undef, size(v))
    sizes = (batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=d, head_dim_v=dv_,
             deterministic=deterministic ? 1 : 0)
    _backward_plan_call(sizes, (causal, window, softcap, scale, backend), q, k, v, o, dout, lse, dq, dk, dv,
                        nothing, nothing)
    return dq, dk, dv
end

"""
    attention_varlen_backward(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k; causal=false, ...)

Gradients of [`attention_varlen`](@ref) on packed host arrays; returns `(dq, dk, dv)`.
"""
function attention_varlen_backward(q::StridedArray{T,3}, k::StridedArray{T,3}, v::StridedArray{T,3},
                                   o::StridedArray{T,3}, lse::DenseArray{Float32,2}, dout::StridedArray{T,3},
                                   cu_seqlens_q::AbstractVector{<:Integer}, cu_seqlens_k::AbstractVector{<:Integer};
                                   causal::Bool=false, window=(-1, -1), softcap::Real=0.0, scale=nothing,
                                   backend::Symbol=:cpu, deterministic::Bool=false) where {T}
    cq, ck, d, hq, tq, hkv, tk, dv_ = _varlen_sizes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    (size(o) == size(dout) == (dv_, hq, tq) && size(lse) == (tq, hq)) ||
        throw(DimensionMismatch("o $(size(o)), dout $(size(dout)), lse $(size(lse)) do not fit q, k, v"))
    dq, dk, dv = Array{T}(undef, size(q)), Array{T}(undef, size(k)), Array{T}(undef, size(v))
    sizes = (batch=length(cq) - 1, seqlen_q=_maxlen(cq), seqlen_k=_maxlen(ck), heads_q=hq, heads_kv=hkv,
             head_dim=d, head_dim_v=dv_, varlen=1, total_q=tq, total_k=tk, deterministic=deterministic ? 1 : 0)
    _backward_plan_call(sizes, (causal, window, softcap, scale, backend), q, k, v, o, dout, lse, dq, dk, dv, cq, ck)
    return dq, dk, dv
end

# A plan of `sizes` (Plan keywords), the options `(causal, window, softcap, scale, backend)` and
# the strides of the host arrays, finalized, run by _backward_call and closed.
function _backward_plan_call(sizes, options, q, k, v, o, dout, lse, dq, dk, dv, cq, ck)
    plan = Plan(; sizes...)
    try
        _options!(plan, eltype(q), options...)
        _set_strides!(plan, (q, k, v, o))
        _set_strides!(plan, (dout, dq, dk, dv), _BACKWARD_STRIDES)
        finalize!(plan)
        _backward_call(plan, q, k, v, o, dout, lse, dq, dk, dv, cq, ck)
    finally
        close(plan)
    end
    return nothing
end

# The C call on (possibly strided) host arrays whose strides the plan already has.
function _backward_call(plan, q, k, v, o, dout, lse, dq, dk, dv, cq, ck)
    need = backward_workspace_size(plan)
    owner, ws = host_workspace(need)
    GC.@preserve q k v o dout lse dq dk dv owner cq ck begin
        if cq === nothing
            check(flashattn_plan_execute_backward(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o),
                                                  pointer(dout), pointer(lse), pointer(dq), pointer(dk), pointer(dv),
                                                  ws, need, C_NULL), "flashattn_plan_execute_backward")
        else
            check(flashattn_plan_execute_backward_varlen(plan.ptr, pointer(q), pointer(k), pointer(v), pointer(o),
                                                         pointer(dout), pointer(lse), pointer(dq), pointer(dk),
                                                         pointer(dv), pointer(cq), pointer(ck), ws, need, C_NULL),
                  "flashattn_plan_execute_backward_varlen")
        end
    end
    return nothing
end

# Context parallelism (libflashattn_cp, optional, experimental): FlashAttn.Cp.
include("Cp.jl")

end # module
