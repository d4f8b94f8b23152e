"""
    FlashAttn.Cp

libflashattn_cp from Julia: context parallelism (ring attention), EXPERIMENTAL as its header
`include/flashattn/flashattn_cp.h` says. The raw layer mirrors that header one to one;
`test/check_wrappers.py include/flashattn/flashattn_cp.h src/Cp.jl` checks it. On top:
[`CpPlan`](@ref), [`shard_rows`](@ref) (the zigzag layout of a causal ring), [`execute!`](@ref)
and the ring's backward pass, [`execute_backward!`](@ref).

The library is found through ENV["FLASHATTN_CP_LIBRARY"] (a path), then beside the loaded
libflashattn, then the system loader (`libflashattn_cp.so.0`).
"""
module Cp

using Libdl
import ..FlashAttn
import ..FlashAttn: flashattn_status_t, flashattn_plan_t, flashattn_stream_t, FLASHATTN_SUCCESS, FlashAttnError

export CpPlan, shard_rows, execute!, execute_backward!

const flashattn_cp_plan_t = Cvoid

const flashattn_cp_transport_t = Cint
const FLASHATTN_CP_TRANSPORT_LOOPBACK = flashattn_cp_transport_t(1)
const FLASHATTN_CP_TRANSPORT_NCCL = flashattn_cp_transport_t(2)

const flashattn_cp_i64_param_t = Cint
const FLASHATTN_CP_I64_WORLD_SIZE = flashattn_cp_i64_param_t(1)
const FLASHATTN_CP_I64_RANK = flashattn_cp_i64_param_t(2)
const FLASHATTN_CP_I64_TRANSPORT = flashattn_cp_i64_param_t(3)

const FUNCTIONS = (:flashattn_cp_last_error, :flashattn_cp_plan_create, :flashattn_cp_plan_destroy,
                   :flashattn_cp_plan_set_i64, :flashattn_cp_plan_set_nccl_comm, :flashattn_cp_plan_finalize,
                   :flashattn_cp_plan_get_workspace_size, :flashattn_cp_plan_execute,
                   :flashattn_cp_plan_get_backward_workspace_size, :flashattn_cp_plan_execute_backward)
# Declared after the forward (the ring backward): a libflashattn_cp built before them still
# loads, and calling one of these throws.
const LATER = (:flashattn_cp_plan_get_backward_workspace_size, :flashattn_cp_plan_execute_backward)

const _symbols = Dict{Symbol,Ptr{Cvoid}}()
const _load_lock = ReentrantLock()

function _load!()
    lock(_load_lock) do
        isempty(_symbols) || return
        FlashAttn.fptr(:flashattn_version)  # the core first: libflashattn_cp links against it
        candidates = String[]
        explicit = get(ENV, "FLASHATTN_CP_LIBRARY", "")
        if !isempty(explicit)
            push!(candidates, explicit)
        else
            core = FlashAttn._path[]
            if occursin('/', core)
                push!(candidates, joinpath(dirname(core), "libflashattn_cp.so.0"))
                push!(candidates, joinpath(dirname(dirname(core)), "cp", "libflashattn_cp.so.0"))  # a build tree
            end
            push!(candidates, "libflashattn_cp.so.0")
        end
        for path in candidates
            h = Libdl.dlopen(path; throw_error=false)
            h === nothing && continue
            for f in FUNCTIONS
                if f in LATER
                    p = Libdl.dlsym(h, f; throw_error=false)
                    _symbols[f] = p === nothing ? C_NULL : p
                else
                    _symbols[f] = Libdl.dlsym(h, f)
                end
            end
            return
        end
        error("FlashAttn.Cp: libflashattn_cp could not be loaded; set FLASHATTN_CP_LIBRARY. Tried:\n  " *
              join(candidates, "\n  "))
    end
    return nothing
end

"Whether libflashattn_cp loads."
available() = try
    _load!()
    true
catch
    false
end

@inline function fptr(name::Symbol)
    isempty(_symbols) && _load!()
    p = _symbols[name]
    p == C_NULL && error("FlashAttn.Cp: the loaded libflashattn_cp lacks $name (built before the ring backward)")
    return p
end

# ---------------------------------------------------------------------------------------------
# Raw layer: one function per declaration of flashattn_cp.h, same names and arguments.

flashattn_cp_last_error() = ccall(fptr(:flashattn_cp_last_error), Cstring, ())
flashattn_cp_plan_create(plan) = ccall(fptr(:flashattn_cp_plan_create), flashattn_status_t, (Ptr{Ptr{flashattn_cp_plan_t}},), plan)
flashattn_cp_plan_destroy(plan) = ccall(fptr(:flashattn_cp_plan_destroy), Cvoid, (Ptr{flashattn_cp_plan_t},), plan)
flashattn_cp_plan_set_i64(plan, key, value) = ccall(fptr(:flashattn_cp_plan_set_i64), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, flashattn_cp_i64_param_t, Int64), plan, key, value)
flashattn_cp_plan_set_nccl_comm(plan, comm) = ccall(fptr(:flashattn_cp_plan_set_nccl_comm), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Ptr{Cvoid}), plan, comm)
flashattn_cp_plan_finalize(plan, local_plan) = ccall(fptr(:flashattn_cp_plan_finalize), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Ptr{flashattn_plan_t}), plan, local_plan)
flashattn_cp_plan_get_workspace_size(plan, bytes) = ccall(fptr(:flashattn_cp_plan_get_workspace_size), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Ptr{Csize_t}), plan, bytes)
flashattn_cp_plan_execute(plan, num_ranks, q, k, v, o, lse, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_cp_plan_execute), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Int32, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cfloat}}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, num_ranks, q, k, v, o, lse, workspace, workspace_bytes, stream)
flashattn_cp_plan_get_backward_workspace_size(plan, bytes) = ccall(fptr(:flashattn_cp_plan_get_backward_workspace_size), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Ptr{Csize_t}), plan, bytes)
flashattn_cp_plan_execute_backward(plan, num_ranks, q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream) = ccall(fptr(:flashattn_cp_plan_execute_backward), flashattn_status_t, (Ptr{flashattn_cp_plan_t}, Int32, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cfloat}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Ptr{Cvoid}}, Ptr{Cvoid}, Csize_t, flashattn_stream_t), plan, num_ranks, q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, stream)

@inline function check(status, func::String)
    status == FLASHATTN_SUCCESS && return nothing
    throw(FlashAttnError(status, unsafe_string(flashattn_cp_last_error()), func))
end

# ---------------------------------------------------------------------------------------------
# CpPlan

"""
    shard_rows(world_size, rank, local_rows, causal) -> Vector{Int}

The global rows (0-based, in local order) that `rank` holds: contiguous chunks, or the zigzag
layout when `causal` (chunks `rank` and `2W-1-rank` of `local_rows ÷ 2` tokens).
"""
function shard_rows(world_size::Integer, rank::Integer, local_rows::Integer, causal::Bool)
    causal || return collect(rank*local_rows:(rank+1)*local_rows-1)
    iseven(local_rows) || throw(ArgumentError("the causal zigzag layout needs an even local_rows"))
    c = local_rows ÷ 2
    second = 2world_size - 1 - rank
    return vcat(collect(rank*c:(rank+1)*c-1), collect(second*c:(second+1)*c-1))
end

"""
    CpPlan(local::FlashAttn.Plan, world_size; transport=:loopback, rank=0, comm=C_NULL)

A finalized context-parallel plan over `local` (a finalized plan of one rank's share).
`:loopback` plays every rank in this process; `:nccl` is one rank over `comm` (an `ncclComm_t`).
"""
mutable struct CpPlan
    ptr::Ptr{flashattn_cp_plan_t}
    local_ranks::Int
    function CpPlan(local_plan::FlashAttn.Plan, world_size::Integer; transport::Symbol=:loopback, rank::Integer=0,
                    comm::Ptr{Cvoid}=C_NULL)
        out = Ref{Ptr{flashattn_cp_plan_t}}(C_NULL)
        check(flashattn_cp_plan_create(out), "flashattn_cp_plan_create")
        which = transport === :loopback ? FLASHATTN_CP_TRANSPORT_LOOPBACK :
                transport === :nccl ? FLASHATTN_CP_TRANSPORT_NCCL : throw(ArgumentError("transport: $transport"))
        plan = new(out[], which == FLASHATTN_CP_TRANSPORT_LOOPBACK ? Int(world_size) : 1)
        finalizer(p -> (p.ptr != C_NULL && flashattn_cp_plan_destroy(p.ptr); p.ptr = C_NULL), plan)
        check(flashattn_cp_plan_set_i64(plan.ptr, FLASHATTN_CP_I64_WORLD_SIZE, Int64(world_size)), "flashattn_cp_plan_set_i64")
        check(flashattn_cp_plan_set_i64(plan.ptr, FLASHATTN_CP_I64_RANK, Int64(rank)), "flashattn_cp_plan_set_i64")
        check(flashattn_cp_plan_set_i64(plan.ptr, FLASHATTN_CP_I64_TRANSPORT, Int64(which)), "flashattn_cp_plan_set_i64")
        comm == C_NULL || check(flashattn_cp_plan_set_nccl_comm(plan.ptr, comm), "flashattn_cp_plan_set_nccl_comm")
        GC.@preserve local_plan check(flashattn_cp_plan_finalize(plan.ptr, local_plan.ptr), "flashattn_cp_plan_finalize")
        return plan
    end
end

function workspace_size(plan::CpPlan)
    n = Ref{Csize_t}(0)
    check(flashattn_cp_plan_get_workspace_size(plan.ptr, n), "flashattn_cp_plan_get_workspace_size")
    return Int(n[])
end

"""
    execute!(plan, q, k, v, o; lse=nothing, workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

Raw execute: `q`, `k`, `v`, `o` are vectors of `plan.local_ranks` pointers (device memory, or
host memory for the CPU backend), `lse` nothing or a vector of `Ptr{Cfloat}`.
"""
function execute!(plan::CpPlan, q::Vector{Ptr{Cvoid}}, k::Vector{Ptr{Cvoid}}, v::Vector{Ptr{Cvoid}},
                  o::Vector{Ptr{Cvoid}}; lse::Union{Nothing,Vector{Ptr{Cfloat}}}=nothing,
                  workspace::Ptr{Cvoid}=C_NULL, workspace_bytes::Integer=0, stream::Ptr{Cvoid}=C_NULL)
    n = plan.local_ranks
    all(length(x) == n for x in (q, k, v, o)) || throw(ArgumentError("every pointer vector must hold $n entries"))
    lse === nothing || length(lse) == n || throw(ArgumentError("lse must hold $n entries"))
    lse_ptr = lse === nothing ? Ptr{Ptr{Cfloat}}(C_NULL) : pointer(lse)
    GC.@preserve q k v o lse check(flashattn_cp_plan_execute(plan.ptr, Int32(n), pointer(q), pointer(k), pointer(v),
                                                             pointer(o), lse_ptr, workspace, workspace_bytes, stream),
                                   "flashattn_cp_plan_execute")
    return nothing
end

"""
    backward_workspace_size(plan::CpPlan)

Bytes of workspace one [`execute_backward!`](@ref) needs (separate from `workspace_size`); throws
(`FLASHATTN_ERROR_NOT_SUPPORTED`, with the reason) when the local plan's backend has no backward
pass for this problem.
"""
function backward_workspace_size(plan::CpPlan)
    n = Ref{Csize_t}(0)
    check(flashattn_cp_plan_get_backward_workspace_size(plan.ptr, n), "flashattn_cp_plan_get_backward_workspace_size")
    return Int(n[])
end

"""
    execute_backward!(plan, q, k, v, o, dout, lse, dq, dk, dv; workspace=C_NULL, workspace_bytes=0, stream=C_NULL)

Raw backward: `q`, `k`, `v`, `o`, `dout`, `dq`, `dk`, `dv` are vectors of `plan.local_ranks`
pointers as for [`execute!`](@ref), `lse` (the forward's, required) a vector of `Ptr{Cfloat}`.
Writes every rank's `dq`, `dk`, `dv` (layouts of its `q`, `k`, `v`): the gradients with respect to
the whole sequence, restricted to the rank's rows. The workspace holds at least
[`backward_workspace_size`](@ref) bytes.
"""
function execute_backward!(plan::CpPlan, q::Vector{Ptr{Cvoid}}, k::Vector{Ptr{Cvoid}}, v::Vector{Ptr{Cvoid}},
                           o::Vector{Ptr{Cvoid}}, dout::Vector{Ptr{Cvoid}}, lse::Vector{Ptr{Cfloat}},
                           dq::Vector{Ptr{Cvoid}}, dk::Vector{Ptr{Cvoid}}, dv::Vector{Ptr{Cvoid}};
                           workspace::Ptr{Cvoid}=C_NULL, workspace_bytes::Integer=0, stream::Ptr{Cvoid}=C_NULL)
    n = plan.local_ranks
    all(length(x) == n for x in (q, k, v, o, dout, lse, dq, dk, dv)) ||
        throw(ArgumentError("every pointer vector must hold $n entries"))
    GC.@preserve q k v o dout lse dq dk dv check(
        flashattn_cp_plan_execute_backward(plan.ptr, Int32(n), pointer(q), pointer(k), pointer(v), pointer(o),
                                           pointer(dout), pointer(lse), pointer(dq), pointer(dk), pointer(dv),
                                           workspace, workspace_bytes, stream),
        "flashattn_cp_plan_execute_backward")
    return nothing
end

end # module Cp
