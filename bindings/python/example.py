"""Causal attention with GQA on random numpy inputs (CPU backend), checked against numpy.

    FLASHATTN_LIBRARY=build/src/libflashattn.so.0 PYTHONPATH=bindings/python python3 bindings/python/example.py
"""

import numpy as np

import flashattn

rng = np.random.default_rng(0)
batch, seq, heads_q, heads_kv, dim = 2, 128, 8, 2, 64
q = rng.standard_normal((batch, seq, heads_q, dim), dtype=np.float32)
k = rng.standard_normal((batch, seq, heads_kv, dim), dtype=np.float32)
v = rng.standard_normal((batch, seq, heads_kv, dim), dtype=np.float32)

o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)

# The same with a reusable plan: create, set, finalize, execute (any number of times), close.
with flashattn.Plan(batch=batch, seqlen_q=seq, seqlen_k=seq, heads_q=heads_q, heads_kv=heads_kv, head_dim=dim,
                    dtype="fp32", causal=True, backend="cpu") as plan:
    plan.finalize()
    backend, reason = plan.backend_info()
    workspace = np.empty(plan.workspace_size + 256, dtype=np.uint8)
    aligned = (workspace.ctypes.data + 255) // 256 * 256
    o2 = np.empty_like(o)
    plan.execute(q, k, v, o2, workspace=(aligned, plan.workspace_size))

# numpy reference for the first batch element, first query head (uses kv head 0)
s = q[0, :, 0] @ k[0, :, 0].T / np.sqrt(dim)
s[np.triu_indices(seq, 1)] = -np.inf
p = np.exp(s - s.max(axis=1, keepdims=True))
ref = (p / p.sum(axis=1, keepdims=True)) @ v[0, :, 0]

print("libflashattn %s (%s), backend %s: %s" % (flashattn.version_string(), flashattn.library_path(),
                                                 backend.name.lower(), reason))
print("o %s, lse %s, max |o - numpy| = %.2e, plan == attention(): %s"
      % (o.shape, lse.shape, np.abs(o[0, :, 0] - ref).max(), np.array_equal(o, o2)))
assert np.abs(o[0, :, 0] - ref).max() < 1e-4 and np.array_equal(o, o2)
