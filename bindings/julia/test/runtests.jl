# Tests of FlashAttn.jl on the CPU backend: a Float64 reference, the cross-language reference file
# (ENV["FLASHATTN_REFERENCE_FILE"], written by bindings/common/make_reference.c), errors and GC.
#
#     FLASHATTN_LIBRARY=build/src/libflashattn.so.0 julia --project=bindings/julia bindings/julia/test/runtests.jl
using Test
using FlashAttn
const FA = FlashAttn

# Row i of the Float64 softmax of the scores sc·q·kᵀ (masked, through the softcap) of query head h
# (kv head hk) in batch bi on Julia-layout arrays: (probabilities, log-sum-exp, each key's
# tanh(score/softcap) (0 without a softcap)), or `nothing` when the row sees no key.
function softmax_row(q, k, h, hk, i, bi; causal, window, softcap, sc)
    d, sq, sk = size(q, 1), size(q, 3), size(k, 3)
    diag = (i - 1) + sk - sq
    s = fill(-Inf, sk)
    t = zeros(sk)
    for j in 1:sk
        j0 = j - 1
        (causal && j0 > diag) && continue
        (window[1] >= 0 && j0 < diag - window[1]) && continue
        (window[2] >= 0 && j0 > diag + window[2]) && continue
        x = sc * sum(Float64(q[u, h, i, bi]) * Float64(k[u, hk, j, bi]) for u in 1:d)
        if softcap > 0
            t[j] = tanh(x / softcap)
            x = softcap * t[j]
        end
        s[j] = x
    end
    m = maximum(s)
    isinf(m) && return nothing
    p = exp.(s .- m)
    total = sum(p)
    return p ./ total, log(total) + m, t
end

# Float64 reference on Julia-layout arrays: q (d, hq, sq, b) -> o (dv, hq, sq, b), lse (sq, hq, b).
function reference(q, k, v; causal=false, window=(-1, -1), softcap=0.0, scale=nothing)
    d, hq, sq, b = size(q)
    hkv, sk = size(k, 2), size(k, 3)
    dv = size(v, 1)
    sc = scale === nothing ? 1 / sqrt(d) : scale
    o = zeros(Float64, dv, hq, sq, b)
    lse = fill(-Inf, sq, hq, b)
    for bi in 1:b, h in 1:hq
        hk = (h - 1) ÷ (hq ÷ hkv) + 1
        for i in 1:sq
            row = softmax_row(q, k, h, hk, i, bi; causal=causal, window=window, softcap=softcap, sc=sc)
            row === nothing && continue
            p, l, _ = row
            lse[i, h, bi] = l
            for j in 1:sk, t in 1:dv
                o[t, h, i, bi] += p[j] * Float64(v[t, hk, j, bi])
            end
        end
    end
    return o, lse
end

# Float64 gradients of sum(o .* dout) on Julia-layout arrays: (dq, dk, dv) of the sizes of q, k, v.
# P = softmax(S); dS = P (dO·V - dO·O) through the softcap's tanh; dQ = scale dS K, dK = scale dSᵀ Q,
# dV = Pᵀ dO, dK and dV summed over each kv head's query group.
function reference_backward(q, k, v, dout; causal=false, window=(-1, -1), softcap=0.0, scale=nothing)
    d, hq, sq, b = size(q)
    hkv, sk = size(k, 2), size(k, 3)
    dv = size(v, 1)
    sc = scale === nothing ? 1 / sqrt(d) : scale
    gq, gk, gv = zeros(size(q)), zeros(size(k)), zeros(size(v))
    for bi in 1:b, h in 1:hq
        hk = (h - 1) ÷ (hq ÷ hkv) + 1
        for i in 1:sq
            row = softmax_row(q, k, h, hk, i, bi; causal=causal, window=window, softcap=softcap, sc=sc)
            row === nothing && continue  # sees no key: no gradient flows
            p, _, t = row
            o = [sum(p[j] * Float64(v[u, hk, j, bi]) for j in 1:sk) for u in 1:dv]
            delta = sum(Float64(dout[u, h, i, bi]) * o[u] for u in 1:dv)
            for j in 1:sk
                p[j] == 0 && continue
                dp = sum(Float64(dout[u, h, i, bi]) * Float64(v[u, hk, j, bi]) for u in 1:dv)
                ds = p[j] * (dp - delta)
                softcap > 0 && (ds *= 1 - t[j]^2)
                for u in 1:d
                    gq[u, h, i, bi] += sc * ds * Float64(k[u, hk, j, bi])
                    gk[u, hk, j, bi] += sc * ds * Float64(q[u, h, i, bi])
                end
                for u in 1:dv
                    gv[u, hk, j, bi] += p[j] * Float64(dout[u, h, i, bi])
                end
            end
        end
    end
    return gq, gk, gv
end

function close_enough(a, b; atol, rtol)
    size(a) == size(b) || return false
    for (x, y) in zip(a, b)
        if isinf(y)
            x == y || return false
        elseif abs(x - y) > atol + rtol * abs(y)
            return false
        end
    end
    return true
end

# FlashAttn.Cp (libflashattn_cp) helpers: the pointer vectors its raw calls take, and one ring's
# forward then backward on every rank's shards (host arrays, CPU backend), sizes (d, hq, hkv, l).
cp_voids(xs) = Ptr{Cvoid}[Ptr{Cvoid}(pointer(x)) for x in xs]
cp_floats(xs) = Ptr{Cfloat}[pointer(x) for x in xs]

function cp_ring_pass(ring, qs, ks, vs, douts, sizes)
    Cp = FA.Cp
    d, hq, hkv, l = sizes
    w = length(qs)
    os = [fill(NaN32, d, hq, l, 1) for _ in 1:w]
    lses = [fill(NaN32, l, hq, 1) for _ in 1:w]  # C [batch, heads_q, L]
    nbytes = Cp.workspace_size(ring)
    owner, ws = FA.host_workspace(nbytes)
    GC.@preserve qs ks vs os lses owner Cp.execute!(ring, cp_voids(qs), cp_voids(ks), cp_voids(vs), cp_voids(os);
                                                   lse=cp_floats(lses), workspace=ws, workspace_bytes=nbytes)
    dqs = [fill(NaN32, d, hq, l, 1) for _ in 1:w]
    dks = [fill(NaN32, d, hkv, l, 1) for _ in 1:w]
    dvs = [fill(NaN32, d, hkv, l, 1) for _ in 1:w]
    need = Cp.backward_workspace_size(ring)
    bowner, bws = FA.host_workspace(need)
    GC.@preserve qs ks vs os douts lses dqs dks dvs bowner Cp.execute_backward!(
        ring, cp_voids(qs), cp_voids(ks), cp_voids(vs), cp_voids(os), cp_voids(douts), cp_floats(lses), cp_voids(dqs),
        cp_voids(dks), cp_voids(dvs); workspace=bws, workspace_bytes=need)
    return os, lses, dqs, dks, dvs
end

@testset "FlashAttn.jl" begin
    @testset "information" begin
        @test FA.version().major == 0
        @test occursin("backends=cpu", FA.build_info())
        @test FA.device_count() >= 0
        @test FA.status_string(FA.FLASHATTN_ERROR_INVALID_ARGUMENT) == "invalid argument"
    end

    @testset "against the Float64 reference" begin
        q = randn(Float32, 16, 4, 13, 2)
        k = randn(Float32, 16, 2, 21, 2)
        v = randn(Float32, 24, 2, 21, 2)
        for kw in ((;), (causal=true,), (window=(4, 1), softcap=3.0, scale=0.3), (causal=true, window=(3, -1)))
            o, lse = attention(q, k, v; kw...)
            ro, rl = reference(q, k, v; kw...)
            @test close_enough(o, ro; atol=2e-5, rtol=2e-5)
            @test close_enough(lse, rl; atol=1e-4, rtol=1e-5)
        end
        # strided views: every other head of a wider array
        wide = randn(Float32, 16, 8, 13, 2)
        qv = view(wide, :, 1:2:8, :, :)
        o, _ = attention(qv, k, v; causal=true)
        ro, _ = reference(collect(qv), k, v; causal=true)
        @test close_enough(o, ro; atol=2e-5, rtol=2e-5)
        # Float16
        o16, _ = attention(Float16.(q), Float16.(k), Float16.(v); causal=true)
        ro, _ = reference(Float16.(q), Float16.(k), Float16.(v); causal=true)
        @test close_enough(Float64.(o16), ro; atol=5e-3, rtol=5e-3)
    end

    @testset "variable length" begin
        cu_q, cu_k = Int32[0, 4, 4, 11], Int32[0, 6, 9, 9]
        q = randn(Float32, 8, 2, 11)
        k = randn(Float32, 8, 1, 9)
        v = randn(Float32, 8, 1, 9)
        o, lse = attention_varlen(q, k, v, cu_q, cu_k; causal=true)
        ro, rl = reference(reshape(q[:, :, 1:4], 8, 2, 4, 1), reshape(k[:, :, 1:6], 8, 1, 6, 1),
                           reshape(v[:, :, 1:6], 8, 1, 6, 1); causal=true)
        @test close_enough(o[:, :, 1:4], ro[:, :, :, 1]; atol=2e-5, rtol=2e-5)
        @test close_enough(lse[1:4, :], rl[:, :, 1]; atol=1e-4, rtol=1e-5)
        @test all(isinf, lse[5:11, :]) && all(iszero, o[:, :, 5:11])
    end

    @testset "reference file from the C API" begin
        path = get(ENV, "FLASHATTN_REFERENCE_FILE", "")
        if isempty(path)
            @info "FLASHATTN_REFERENCE_FILE is not set (CTest sets it): skipped"
        else
            open(path) do io
                @test String(read(io, 8)) == "FAREF01\n"
                ncases = read(io, Int64)
                @test ncases >= 3
                for _ in 1:ncases
                    p = [read(io, Int64) for _ in 1:16]
                    softcap, scale = read(io, Float64), read(io, Float64)
                    b, sq, sk, hq, hkv, d, dv = p[1:7]
                    kw = (causal=p[8] == 1, window=(p[9], p[10]), softcap=softcap, scale=scale > 0 ? scale : nothing)
                    floats(n) = read!(io, Vector{Float32}(undef, n))
                    if p[11] == 1
                        cu_q = read!(io, Vector{Int32}(undef, b + 1))
                        cu_k = read!(io, Vector{Int32}(undef, b + 1))
                        tq, tk = p[12], p[13]
                        q = reshape(floats(tq * hq * d), d, hq, tq)
                        k = reshape(floats(tk * hkv * d), d, hkv, tk)
                        v = reshape(floats(tk * hkv * dv), dv, hkv, tk)
                        o_ref = reshape(floats(tq * hq * dv), dv, hq, tq)
                        lse_ref = reshape(floats(tq * hq), tq, hq)
                        o, lse = attention_varlen(q, k, v, cu_q, cu_k; kw...)
                    else
                        q = reshape(floats(b * sq * hq * d), d, hq, sq, b)
                        k = reshape(floats(b * sk * hkv * d), d, hkv, sk, b)
                        v = reshape(floats(b * sk * hkv * dv), dv, hkv, sk, b)
                        o_ref = reshape(floats(b * sq * hq * dv), dv, hq, sq, b)
                        lse_ref = reshape(floats(b * sq * hq), sq, hq, b)
                        o, lse = attention(q, k, v; kw...)
                    end
                    @test close_enough(o, o_ref; atol=1e-6, rtol=1e-5)
                    @test close_enough(lse, lse_ref; atol=1e-6, rtol=1e-6)
                end
                @test eof(io)
            end
        end
    end

    @testset "errors" begin
        err = try
            Plan(head_dim=12)
            nothing
        catch e
            e
        end
        @test err isa FlashAttnError
        @test err.status == FA.FLASHATTN_ERROR_INVALID_ARGUMENT
        @test occursin("multiple of 8", err.message)
        plan = Plan()
        @test_throws FlashAttnError finalize!(plan)
        e2 = try finalize!(plan) catch e; e end
        @test e2.status == FA.FLASHATTN_ERROR_INVALID_STATE
        @test_throws FlashAttnError workspace_size(plan)
        @test_throws FlashAttnError set_f64!(plan, FA.FLASHATTN_F64_SOFTMAX_SCALE, -1.0)
        close(plan)
        @test_throws ArgumentError finalize!(plan)
        x = zeros(Float32, 8, 3, 4, 1)
        @test_throws FlashAttnError attention(x, zeros(Float32, 8, 2, 4, 1), zeros(Float32, 8, 2, 4, 1))
        @test_throws DimensionMismatch attention(x, zeros(Float32, 8, 3, 4, 2), x)
    end

    @testset "backward pass" begin
        for (shape, kw) in (((16, 4, 9, 2, 2, 13, 16), (;)),
                            ((16, 2, 13, 2, 2, 7, 16), (causal=true,)),
                            ((16, 6, 11, 1, 1, 17, 24), (window=(4, 2), softcap=2.0, scale=0.4)))
            d, hq, sq, b, hkv, sk, dv = shape
            q, k, v = randn(Float32, d, hq, sq, b), randn(Float32, d, hkv, sk, b), randn(Float32, dv, hkv, sk, b)
            dout = randn(Float32, dv, hq, sq, b)
            o, lse = attention(q, k, v; kw...)
            dq, dk, dvv = attention_backward(q, k, v, o, lse, dout; kw...)
            rq, rk, rv = reference_backward(q, k, v, dout; kw...)
            @test close_enough(dq, rq; atol=1e-4, rtol=1e-4)
            @test close_enough(dk, rk; atol=1e-4, rtol=1e-4)
            @test close_enough(dvv, rv; atol=1e-4, rtol=1e-4)
        end
        # variable length: the second sequence has no keys (dQ = 0 there)
        cu_q, cu_k = Int32[0, 5, 12, 15], Int32[0, 7, 7, 16]
        q, k, v = randn(Float32, 16, 4, 15), randn(Float32, 16, 2, 16), randn(Float32, 16, 2, 16)
        dout = randn(Float32, 16, 4, 15)
        o, lse = attention_varlen(q, k, v, cu_q, cu_k; causal=true)
        dq, dk, dvv = attention_varlen_backward(q, k, v, o, lse, dout, cu_q, cu_k; causal=true)
        rq, rk, rv = zeros(size(q)), zeros(size(k)), zeros(size(v))
        for s in 1:3
            q0, q1, k0, k1 = cu_q[s] + 1, cu_q[s + 1], cu_k[s] + 1, cu_k[s + 1]
            k1 < k0 && continue
            a, b_, c = reference_backward(reshape(q[:, :, q0:q1], 16, 4, :, 1), reshape(k[:, :, k0:k1], 16, 2, :, 1),
                                          reshape(v[:, :, k0:k1], 16, 2, :, 1), reshape(dout[:, :, q0:q1], 16, 4, :, 1);
                                          causal=true)
            rq[:, :, q0:q1] .= a[:, :, :, 1]
            rk[:, :, k0:k1] .= b_[:, :, :, 1]
            rv[:, :, k0:k1] .= c[:, :, :, 1]
        end
        @test close_enough(dq, rq; atol=1e-4, rtol=1e-4)
        @test close_enough(dk, rk; atol=1e-4, rtol=1e-4)
        @test close_enough(dvv, rv; atol=1e-4, rtol=1e-4)
        @test all(iszero, dq[:, :, 6:12])

        # a plan: backward!, the backward backend, DETERMINISTIC, and the errors
        plan = Plan(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, head_dim=8, dtype=:fp32, backend=:cpu, deterministic=1)
        @test_throws FlashAttnError backward_workspace_size(plan)  # not finalized
        finalize!(plan)
        @test backward_backend(plan)[1] === :cpu
        @test !isempty(backward_backend(plan)[2])
        @test get_i64(plan, FA.FLASHATTN_I64_DETERMINISTIC) == 1
        q, k, v, dout = (randn(Float32, 8, 2, 8, 1) for _ in 1:4)
        o = similar(q)
        lse = Vector{Float32}(undef, 16)
        execute!(plan, q, k, v, o; lse=lse)
        dq, dk, dvv = similar(q), similar(k), similar(v)
        backward!(plan, q, k, v, o, dout, lse, dq, dk, dvv)
        rq, rk, rv = reference_backward(q, k, v, dout)
        @test close_enough(dq, rq; atol=1e-4, rtol=1e-4)
        @test close_enough(dvv, rv; atol=1e-4, rtol=1e-4)
        @test_throws DimensionMismatch backward!(plan, q, k, v, o, dout, lse, dq[:, :, 1:4, :], dk, dvv)
        need = backward_workspace_size(plan)
        if need > 0
            owner, ws = FA.host_workspace(need)
            err = GC.@preserve q k v o dout lse dq dk dvv owner try
                backward!(plan, pointer(q), pointer(k), pointer(v), pointer(o), pointer(dout), pointer(lse),
                          pointer(dq), pointer(dk), pointer(dvv); workspace=ws, workspace_bytes=need - 1)
                nothing
            catch e
                e
            end
            @test err isa FlashAttnError
            @test err.status == FA.FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE
            @test !isempty(err.message)
        end
        e3 = try
            backward_varlen!(plan, q, k, v, o, dout, lse, dq, dk, dvv, Int32[0, 8], Int32[0, 8])
            nothing
        catch e
            e
        end
        @test e3 isa FlashAttnError && e3.status == FA.FLASHATTN_ERROR_INVALID_STATE
        close(plan)
    end

    @testset "serving: paged cache, append and rotary (execute_args!)" begin
        # C layouts in Julia's column order: caches (D, HKV, PAGE, NPAGES), page table (MAXP, B).
        B, SK, HQ, D, PAGE, MAXP, NPAGES, ROT = 2, 10, 2, 8, 3, 4, 9, 4
        plan = Plan(batch=B, seqlen_q=1, seqlen_k=SK, heads_q=HQ, heads_kv=1, head_dim=D, dtype=:fp32, backend=:cpu)
        for (key, value) in ((FA.FLASHATTN_I64_PAGED_KV, 1), (FA.FLASHATTN_I64_PAGE_SIZE, PAGE),
                             (FA.FLASHATTN_I64_NUM_PAGES, NPAGES), (FA.FLASHATTN_I64_SEQUSED_K, 1),
                             (FA.FLASHATTN_I64_NEW_KV_ROWS, 1), (FA.FLASHATTN_I64_ROTARY_DIM, ROT))
            set_i64!(plan, key, value)
        end
        finalize!(plan)
        q = rand(Float32, D, HQ, 1, B) .- 0.5f0
        kc = rand(Float32, D, 1, PAGE, NPAGES) .- 0.5f0
        vc = rand(Float32, D, 1, PAGE, NPAGES) .- 0.5f0
        k_new = rand(Float32, D, 1, 1, B) .- 0.5f0
        v_new = rand(Float32, D, 1, 1, B) .- 0.5f0
        table = Int32[4 2; 0 8; 7 1; 6 3]  # column b: sequence b's pages
        seqused = Int32[5, 0]
        cosines = Float32[cos(p * 10000.0^(-2i / ROT)) for i in 0:ROT÷2-1, p in 0:SK-1]
        sines = Float32[sin(p * 10000.0^(-2i / ROT)) for i in 0:ROT÷2-1, p in 0:SK-1]
        kc0 = copy(kc)
        o = fill(NaN32, D, HQ, 1, B)
        execute_args!(plan, q, kc, vc, o; page_table=table, seqused_k=seqused, k_new=k_new, v_new=v_new,
                      rotary_cos=cosines, rotary_sin=sines)
        @test seqused == Int32[5, 0]  # the caller advances it
        function rotated(x, pos)  # half-split pairs (i, i + ROT/2), Float64
            y = Float64.(x)
            for i in 1:ROT÷2
                c, s = cosines[i, pos+1], sines[i, pos+1]
                a, b = Float64(x[i]), Float64(x[i+ROT÷2])
                y[i], y[i+ROT÷2] = a * c - b * s, a * s + b * c
            end
            return y
        end
        slot(b, t) = (Int(table[t ÷ PAGE + 1, b]) + 1, t % PAGE + 1)  # (page, row), 1-based
        for b in 1:B
            used = Int(seqused[b])
            knew = rotated(k_new[:, 1, 1, b], used)
            page, row = slot(b, used)
            @test maximum(abs.(kc[:, 1, row, page] .- knew)) < 1e-6
            @test vc[:, 1, row, page] == v_new[:, 1, 1, b]
            keys = [[Float64.(kc0[:, 1, slot(b, t)[2], slot(b, t)[1]]) for t in 0:used-1]; [knew]]
            vals = [[Float64.(vc[:, 1, slot(b, t)[2], slot(b, t)[1]]) for t in 0:used-1]; [Float64.(v_new[:, 1, 1, b])]]
            for h in 1:HQ
                qr = rotated(q[:, h, 1, b], used)
                s = [sum(qr .* key) / sqrt(D) for key in keys]
                p = exp.(s .- maximum(s))
                ref = sum(p[j] / sum(p) .* vals[j] for j in eachindex(p))
                @test maximum(abs.(o[:, h, 1, b] .- ref)) < 2e-5
            end
        end
        bad = copy(table)
        bad[2, 1] = NPAGES  # sequence 1 (0-based 0) reads pages 0 and 1
        o .= 7f0
        err = try
            execute_args!(plan, q, kc, vc, o; page_table=bad, seqused_k=seqused, k_new=k_new, v_new=v_new,
                          rotary_cos=cosines, rotary_sin=sines)
            nothing
        catch e
            e
        end
        @test err isa FlashAttnError && err.status == FA.FLASHATTN_ERROR_INVALID_ARGUMENT
        @test occursin("page_table[0][1]", err.message)
        @test all(o .== 7f0)
        close(plan)
    end

    @testset "plan lifecycle, execute! and GC in any order" begin
        plan = Plan(batch=1, seqlen_q=8, seqlen_k=8, heads_q=2, head_dim=8, dtype=:fp32, backend=:cpu)
        finalize!(plan)
        @test backend(plan)[1] === :cpu
        @test get_i64(plan, FA.FLASHATTN_I64_Q_ROW_STRIDE) == 16
        @test get_f64(plan, FA.FLASHATTN_F64_SOFTMAX_SCALE) ≈ 1 / sqrt(8)
        q = randn(Float32, 8, 2, 8, 1)
        o = similar(q)
        lse = Vector{Float32}(undef, 16)
        execute!(plan, q, q, q, o; lse=lse)
        ro, rl = reference(q, q, q)
        @test close_enough(o, ro; atol=2e-5, rtol=2e-5)
        @test_throws DimensionMismatch execute!(plan, q[:, :, 1:4, :], q, q, o)
        @test_throws ArgumentError execute!(plan, Float16.(q), Float16.(q), Float16.(q), Float16.(o))
        plans = [Plan(batch=1, seqlen_q=4, seqlen_k=4, heads_q=1, head_dim=8) for _ in 1:50]
        foreach(finalize!, plans[1:3:end])
        foreach(close, plans[2:4:end])
        plans = nothing
        GC.gc()
        close(plan)
        close(plan)
        GC.gc()
        @test true
    end

    @testset "merge of partial states (since 0.3)" begin
        # Causal attention = merge(top-left causal over the first keys, bottom-right causal over the
        # rest); the suffix's first rows see nothing (LSE = -Inf) and contribute nothing.
        d, h, s, cut = 8, 2, 12, 5
        q, k, v = randn(Float32, d, h, s, 1), randn(Float32, d, h, s, 1), randn(Float32, d, h, s, 1)
        function part(from, to, align)
            p = Plan(batch=1, seqlen_q=s, seqlen_k=to - from + 1, heads_q=h, head_dim=d, dtype=:fp32,
                     backend=:cpu, causal=1, mask_align=align)
            finalize!(p)
            o, l = similar(q), Vector{Float32}(undef, h * s)
            execute!(p, q, copy(k[:, :, from:to, :]), copy(v[:, :, from:to, :]), o; lse=l)
            return p, o, l
        end
        p1, o1, l1 = part(1, cut, FA.FLASHATTN_MASK_ALIGN_TOP_LEFT)
        p2, o2, l2 = part(cut + 1, s, FA.FLASHATTN_MASK_ALIGN_BOTTOM_RIGHT)
        @test all(isinf, reshape(l2, s, h)[1:cut, :])
        o, l = similar(q), Vector{Float32}(undef, h * s)
        merge_states!(p1, [o1, o2], [l1, l2], o; lse=l)
        ro, rl = reference(q, k, v; causal=true)
        @test close_enough(o, ro; atol=2e-5, rtol=2e-5)
        close(p1)
        close(p2)
    end

    @testset "context parallelism: the loopback ring and its backward (FlashAttn.Cp)" begin
        Cp = FA.Cp
        if !Cp.available()
            @info "libflashattn_cp not loaded (FLASHATTN_CP_LIBRARY, which CTest sets when it is built): skipped"
        else
            @test Cp.shard_rows(2, 0, 4, true) == [0, 1, 6, 7]
            @test Cp.shard_rows(2, 1, 4, false) == [4, 5, 6, 7]
            d, hq, hkv, l = 16, 4, 2, 6
            for world in 1:3, causal in (false, true)
                s = world * l
                q, k, v = randn(Float32, d, hq, s, 1), randn(Float32, d, hkv, s, 1), randn(Float32, d, hkv, s, 1)
                dout = randn(Float32, d, hq, s, 1)
                local_plan = Plan(batch=1, seqlen_q=l, seqlen_k=l, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=:fp32,
                                  backend=:cpu, causal=causal ? 1 : 0)
                finalize!(local_plan)
                ring = Cp.CpPlan(local_plan, world)
                @test ring.local_ranks == world
                @test Cp.backward_workspace_size(ring) > 0
                rows = [Cp.shard_rows(world, r, l, causal) .+ 1 for r in 0:world-1]  # 1-based global rows
                shard(x) = [x[:, :, rs, :] for rs in rows]
                qs, ks, vs, douts = shard(q), shard(k), shard(v), shard(dout)
                os, lses, dqs, dks, dvs = cp_ring_pass(ring, qs, ks, vs, douts, (d, hq, hkv, l))
                # The core library's single calls on the gathered sequence, and the Float64 reference.
                o1, lse1 = attention(q, k, v; causal=causal)
                dq1, dk1, dv1 = attention_backward(q, k, v, o1, lse1, dout; causal=causal)
                rq, rk, rv = reference_backward(q, k, v, dout; causal=causal)
                for r in 1:world
                    @test close_enough(os[r], o1[:, :, rows[r], :]; atol=2e-5, rtol=0)
                    @test close_enough(lses[r], lse1[rows[r], :, :]; atol=2e-5, rtol=0)
                    for (got, one, ref) in ((dqs[r], dq1, rq), (dks[r], dk1, rk), (dvs[r], dv1, rv))
                        @test all(isfinite, got)  # close_enough lets NaN through
                        @test close_enough(got, one[:, :, rows[r], :]; atol=1e-4, rtol=0)
                        @test close_enough(got, ref[:, :, rows[r], :]; atol=1e-4, rtol=0)
                    end
                end
                # On the CPU the ring adds in a fixed order: a second run is bitwise identical.
                _, _, dqs2, dks2, dvs2 = cp_ring_pass(ring, qs, ks, vs, douts, (d, hq, hkv, l))
                @test dqs2 == dqs && dks2 == dks && dvs2 == dvs
                close(local_plan)
            end

            # Errors: too small a workspace, a NULL LSE entry, the wrong number of pointers.
            let
                local_plan = Plan(batch=1, seqlen_q=l, seqlen_k=l, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=:fp32,
                                  backend=:cpu, causal=1)
                finalize!(local_plan)
                ring = Cp.CpPlan(local_plan, 2)
                qs, kvs = [randn(Float32, d, hq, l, 1) for _ in 1:2], [randn(Float32, d, hkv, l, 1) for _ in 1:2]
                lses = [zeros(Float32, l, hq, 1) for _ in 1:2]
                dqs, dks, dvs = [fill(NaN32, d, hq, l, 1) for _ in 1:2], [fill(NaN32, d, hkv, l, 1) for _ in 1:2],
                                [fill(NaN32, d, hkv, l, 1) for _ in 1:2]
                need = Cp.backward_workspace_size(ring)
                owner, ws = FA.host_workspace(need)
                function attempt(lse_ptrs, nbytes)
                    try
                        GC.@preserve qs kvs lses dqs dks dvs owner Cp.execute_backward!(
                            ring, cp_voids(qs), cp_voids(kvs), cp_voids(kvs), cp_voids(qs), cp_voids(qs), lse_ptrs, cp_voids(dqs),
                            cp_voids(dks), cp_voids(dvs); workspace=ws, workspace_bytes=nbytes)
                        return nothing
                    catch e
                        return e
                    end
                end
                err = GC.@preserve lses attempt(cp_floats(lses), need - 1)
                @test err isa FlashAttnError && err.status == FA.FLASHATTN_ERROR_INSUFFICIENT_WORKSPACE
                @test err isa FlashAttnError && !isempty(err.message)
                err = GC.@preserve lses attempt(Ptr{Cfloat}[pointer(lses[1]), Ptr{Cfloat}(C_NULL)], need)
                @test err isa FlashAttnError && err.status == FA.FLASHATTN_ERROR_INVALID_ARGUMENT
                @test all(x -> all(isnan, x), dqs) && all(x -> all(isnan, x), dks) && all(x -> all(isnan, x), dvs)
                @test attempt(cp_floats(lses[1:1]), need) isa ArgumentError
                close(local_plan)
            end
        end
    end
end
