# Causal attention with GQA on random Float32 host arrays (CPU backend).
#
#     FLASHATTN_LIBRARY=build/src/libflashattn.so.0 julia --project=bindings/julia bindings/julia/examples/example.jl
using FlashAttn

# Julia arrays are column-major: the C layout [batch, seq, heads, dim] is (dim, heads, seq, batch).
dim, heads_q, heads_kv, seq, batch = 64, 8, 2, 128, 2
q = randn(Float32, dim, heads_q, seq, batch)
k = randn(Float32, dim, heads_kv, seq, batch)
v = randn(Float32, dim, heads_kv, seq, batch)

o, lse = attention(q, k, v; causal=true)          # o: (dim, heads_q, seq, batch); lse: (seq, heads_q, batch)

# The same through a plan: create, set, finalize!, execute! (any number of times), close.
plan = Plan(batch=batch, seqlen_q=seq, seqlen_k=seq, heads_q=heads_q, heads_kv=heads_kv, head_dim=dim,
            dtype=:fp32, causal=true, backend=:cpu)
finalize!(plan)
name, reason = backend(plan)
o2 = similar(o)
execute!(plan, q, k, v, o2)
close(plan)

println("libflashattn $(FlashAttn.version()) ($(FlashAttn.library_path())), backend $name: $reason")
println("o[1:4] = $(o[1:4]), lse[1] = $(lse[1]), plan == attention(): $(o == o2)")
o == o2 || error("plan and attention() disagree")
try
    Plan(head_dim=12)
catch e
    println("expected error: ", sprint(showerror, e))
end
