"""The Python binding on the CPU backend (numpy), against the float64 reference in conftest."""

import gc
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

import flashattn
from flashattn import I64, F64
from conftest import assert_close, reference_attention, reference_varlen

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

TOL = {"float32": (2e-5, 2e-5), "float16": (4e-3, 4e-3), "bfloat16": (2e-2, 2e-2)}


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def as_dtype(x, name):
    if name == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed")
        return x.astype(ml_dtypes.bfloat16)
    return x.astype(name)


def check(q, k, v, dtype="float32", **kw):
    o, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    ref_kw = {key: kw[key] for key in ("causal", "window", "softcap", "scale") if key in kw}
    ro, rl = reference_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), **ref_kw)
    atol, rtol = TOL[dtype]
    assert o.dtype == q.dtype and o.shape == ro.shape
    assert lse.dtype == np.float32 and lse.shape == rl.shape
    assert_close(o, ro, atol, rtol, "O")
    assert_close(lse, rl, 1e-4, 1e-5, "LSE")
    return o, lse


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtypes(rng, dtype):
    q = as_dtype(randn(rng, (2, 17, 4, 32)), dtype)
    k = as_dtype(randn(rng, (2, 23, 4, 32)), dtype)
    v = as_dtype(randn(rng, (2, 23, 4, 32)), dtype)
    check(q, k, v, dtype)


@pytest.mark.parametrize("sq,sk", [(16, 16), (7, 30), (30, 7), (1, 40)])
def test_causal_bottom_right(rng, sq, sk):
    q, k, v = randn(rng, (2, sq, 2, 16)), randn(rng, (2, sk, 2, 16)), randn(rng, (2, sk, 2, 16))
    o, lse = check(q, k, v, causal=True)
    if sq > sk:  # the first sq - sk rows see no key
        assert np.all(o[:, : sq - sk] == 0) and np.all(np.isneginf(lse[:, :, : sq - sk]))


@pytest.mark.parametrize("window", [(4, 0), (0, 0), (3, 5), (-1, 2), (6, -1)])
def test_window(rng, window):
    q, k, v = randn(rng, (1, 24, 2, 16)), randn(rng, (1, 31, 2, 16)), randn(rng, (1, 31, 2, 16))
    check(q, k, v, window=window)
    check(q, k, v, window=window, causal=True)


def test_softcap_and_scale(rng):
    q, k, v = randn(rng, (2, 12, 2, 32)) * 3, randn(rng, (2, 12, 2, 32)) * 3, randn(rng, (2, 12, 2, 32))
    check(q, k, v, softcap=5.0)
    check(q, k, v, scale=0.05)
    check(q, k, v, softcap=2.0, scale=0.5, causal=True)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 1), (4, 4)])
def test_gqa_mqa(rng, hq, hkv):
    q = randn(rng, (2, 10, hq, 16))
    k, v = randn(rng, (2, 13, hkv, 16)), randn(rng, (2, 13, hkv, 16))
    check(q, k, v, causal=True)


def test_head_dim_v(rng):
    q, k, v = randn(rng, (1, 9, 2, 16)), randn(rng, (1, 11, 2, 16)), randn(rng, (1, 11, 2, 40))
    o, _ = check(q, k, v)
    assert o.shape == (1, 9, 2, 40)


def test_return_lse_false(rng):
    q = randn(rng, (1, 8, 1, 8))
    o = flashattn.attention(q, q, q)
    assert isinstance(o, np.ndarray) and o.shape == q.shape


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_varlen(rng, dtype):
    cu_q = np.array([0, 5, 5, 12, 20], dtype=np.int32)  # one empty query sequence
    cu_k = np.array([0, 7, 16, 16, 30], dtype=np.int32)  # one sequence without keys
    hq, hkv, d = 4, 2, 16
    q = as_dtype(randn(rng, (20, hq, d)), dtype)
    k = as_dtype(randn(rng, (30, hkv, d)), dtype)
    v = as_dtype(randn(rng, (30, hkv, d)), dtype)
    for kw in ({}, {"causal": True}, {"window": (3, 1), "softcap": 4.0}):
        o, lse = flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, **kw)
        ro, rl = reference_varlen(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), cu_q, cu_k, **kw)
        assert o.shape == (20, hq, d) and lse.shape == (hq, 20)
        assert_close(o, ro, *TOL[dtype], what="O")
        assert_close(lse, rl, 1e-4, 1e-5, "LSE")
    # max_seqlen given explicitly, cu_seqlens as lists
    o2 = flashattn.attention(q, k, v, cu_seqlens_q=list(cu_q), cu_seqlens_k=list(cu_k), max_seqlen_q=8, max_seqlen_k=14)
    assert_close(o2, flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k), 0, 0, "O")


def test_strided_views(rng):
    b, s, h, d = 2, 19, 4, 32
    qkv = randn(rng, (b, s, 3, h, d))  # packed projections: q, k, v are strided views
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    check(q, k, v, causal=True)
    # [B, H, S, D] storage seen as [B, S, H, D]
    bhsd = randn(rng, (b, h, s, d))
    qt = bhsd.transpose(0, 2, 1, 3)
    check(qt, k, v)
    # every other sequence position, and batch sliced
    big = randn(rng, (4, 2 * s, h, d))
    check(big[::2, ::2], big[1::2, ::2], big[::2, 1::2])
    # size-1 dimensions with odd strides
    one = randn(rng, (1, 1, 8, 16))[:, :, ::8]
    check(one, randn(rng, (1, 5, 1, 16)), randn(rng, (1, 5, 1, 16)))


def test_out_argument_strided(rng):
    q, k, v = randn(rng, (2, 9, 2, 16)), randn(rng, (2, 9, 2, 16)), randn(rng, (2, 9, 2, 16))
    storage = np.full((2, 2, 9, 16), np.nan, dtype=np.float32)
    out = storage.transpose(0, 2, 1, 3)  # [B, S, H, D] view of [B, H, S, D] memory
    res = flashattn.attention(q, k, v, out=out)
    assert res is out
    ro, _ = reference_attention(q, k, v)
    assert_close(out, ro, *TOL["float32"], what="O")


def test_inputs_untouched(rng):
    q, k, v = randn(rng, (1, 8, 2, 8)), randn(rng, (1, 8, 2, 8)), randn(rng, (1, 8, 2, 8))
    copies = [x.copy() for x in (q, k, v)]
    q.setflags(write=False)
    flashattn.attention(q, k, v)
    for a, b in zip((q, k, v), copies):
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------------------
# Errors


def test_library_error_carries_status_and_message(rng):
    q = randn(rng, (1, 4, 1, 12))  # head_dim 12 is not a multiple of 8
    with pytest.raises(ValueError) as info:
        flashattn.attention(q, q, q)
    err = info.value
    assert isinstance(err, flashattn.FlashAttnError) and isinstance(err, flashattn.InvalidArgumentError)
    assert err.status == flashattn.Status.ERROR_INVALID_ARGUMENT
    assert "multiple of 8" in err.message and "FLASHATTN_I64_HEAD_DIM" in str(err)


def test_heads_not_multiple(rng):
    q, k = randn(rng, (1, 4, 3, 8)), randn(rng, (1, 4, 2, 8))
    with pytest.raises(flashattn.InvalidArgumentError, match="not a multiple"):
        flashattn.attention(q, k, k)


@pytest.mark.parametrize("kw,match", [({"scale": -1.0}, "must be > 0"), ({"softcap": -2.0}, ">= 0"),
                                      ({"window": (-3, 0)}, "WINDOW_LEFT"), ({"scale": float("nan")}, "finite")])
def test_bad_options(rng, kw, match):
    q = randn(rng, (1, 4, 1, 8))
    with pytest.raises(flashattn.InvalidArgumentError, match=match):
        flashattn.attention(q, q, q, **kw)


def test_python_side_errors(rng):
    q = randn(rng, (1, 4, 2, 8))
    with pytest.raises(TypeError, match="dtype"):
        flashattn.attention(q, q.astype(np.float16), q)
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        flashattn.attention(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64))
    with pytest.raises(TypeError, match="expected a numpy array"):
        flashattn.attention([1.0], q, q)
    with pytest.raises(ValueError, match="4 dimensions"):
        flashattn.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        wide = randn(rng, (1, 4, 2, 16))[..., ::2]
        flashattn.attention(wide, wide, wide)
    with pytest.raises(ValueError, match="runs on CUDA"):
        flashattn.attention(q, q, q, backend="fa2")
    with pytest.raises(ValueError, match="backend"):
        flashattn.attention(q, q, q, backend="fa9")
    with pytest.raises(ValueError, match="batch"):
        flashattn.attention(q, randn(rng, (2, 4, 2, 8)), randn(rng, (2, 4, 2, 8)))
    with pytest.raises(ValueError, match="both cu_seqlens"):
        flashattn.attention(q[0], q[0], q[0], cu_seqlens_q=[0, 4])
    with pytest.raises(ValueError, match="out"):
        flashattn.attention(q, q, q, out=np.empty((1, 4, 2, 16), np.float32))


def test_negative_and_zero_strides_rejected_by_library(rng):
    q = randn(rng, (1, 6, 2, 8))
    with pytest.raises(flashattn.InvalidArgumentError, match="at least 1"):
        flashattn.attention(q[:, ::-1], q, q)
    k = np.broadcast_to(randn(rng, (1, 6, 1, 8)), (1, 6, 2, 8))  # stride 0 over heads
    with pytest.raises(flashattn.InvalidArgumentError, match="at least 1"):
        flashattn.attention(q, k, k)


def test_bad_cu_seqlens(rng):
    q = randn(rng, (10, 2, 8))
    with pytest.raises(flashattn.InvalidArgumentError) as info:
        flashattn.attention(q, q, q, cu_seqlens_q=[0, 6, 4], cu_seqlens_k=[0, 5, 10], max_seqlen_q=6)
    assert "cu_seqlens_q" in info.value.message


# ------------------------------------------------------------------------------------------
# Plan


def make_plan(**extra):
    params = dict(batch=2, seqlen_q=12, seqlen_k=20, heads_q=4, heads_kv=2, head_dim=16, dtype="fp32",
                  backend="cpu")
    params.update(extra)
    return flashattn.Plan(**params)


def test_plan_lifecycle_and_queries(rng):
    with make_plan(causal=True) as plan:
        assert plan.get(I64.BATCH) == 2 and plan.get_i64(I64.Q_ROW_STRIDE) == -1
        assert plan.get_f64(F64.SOFTMAX_SCALE) == 0.0
        with pytest.raises(flashattn.InvalidStateError, match="not finalized"):
            plan.workspace_size
        plan.finalize()
        assert plan.get_i64(I64.Q_ROW_STRIDE) == 4 * 16 and plan.get_i64(I64.HEAD_DIM_V) == 16
        assert plan.get_f64(F64.SOFTMAX_SCALE) == pytest.approx(0.25)
        backend, reason = plan.backend_info()
        assert backend == flashattn.Backend.CPU and "cpu" in reason
        need = plan.workspace_size
        assert need > 0
        q, k, v = randn(rng, (2, 12, 4, 16)), randn(rng, (2, 20, 2, 16)), randn(rng, (2, 20, 2, 16))
        ro, rl = reference_attention(q, k, v, causal=True)
        ws = np.empty(need + 256, np.uint8)
        addr = ws.ctypes.data
        aligned = (addr + 255) // 256 * 256
        for _ in range(2):  # new tensors each call
            o = np.empty((2, 12, 4, 16), np.float32)
            lse = np.empty((2, 4, 12), np.float32)
            plan.execute(q, k, v, o, lse, workspace=(aligned, need))
            assert_close(o, ro, *TOL["float32"], what="O")
            assert_close(lse, rl, 1e-4, 1e-5, "LSE")
        with pytest.raises(flashattn.InsufficientWorkspaceError) as info:
            plan.execute(q, k, v, o, workspace=(aligned, need - 1))
        assert info.value.status == flashattn.Status.ERROR_INSUFFICIENT_WORKSPACE
        with pytest.raises(ValueError, match="spans"):
            plan.execute(q[:, :6], k, v, o, workspace=(aligned, need))
        with pytest.raises(TypeError, match="dtype"):
            plan.execute(q.astype(np.float16), k, v, o, workspace=(aligned, need))
        # a setter un-finalizes the plan
        plan.set(I64.CAUSAL, 0)
        with pytest.raises(flashattn.InvalidStateError):
            plan.execute(q, k, v, o, workspace=(aligned, need))
    assert plan.closed
    with pytest.raises(ValueError, match="closed"):
        plan.finalize()
    plan.close()  # again: no-op


def test_plan_varlen_state_errors(rng):
    with make_plan(varlen=1, total_q=10, total_k=10) as plan:
        plan.finalize()
        q = randn(rng, (10, 4, 16))
        with pytest.raises(flashattn.InvalidStateError, match="execute_varlen"):
            plan.execute(q, q[:, :2], q[:, :2], np.empty_like(q))


def test_plan_errors():
    with pytest.raises(KeyError):
        flashattn.Plan(no_such_key=1)
    with pytest.raises(flashattn.InvalidArgumentError, match="at least 1"):
        flashattn.Plan(batch=0)
    with flashattn.Plan() as plan:
        with pytest.raises(flashattn.InvalidStateError, match="never set"):
            plan.finalize()
        with pytest.raises(flashattn.InvalidArgumentError, match="not a flashattn_i64_param_t"):
            plan.set_i64(99, 1)


def test_plans_destroyed_in_any_order(rng):
    plans = [make_plan() for _ in range(20)]
    for p in plans[::3]:
        p.finalize()
    order = list(range(len(plans)))
    random.Random(7).shuffle(order)
    for n, i in enumerate(order):
        if n % 3 == 0:
            plans[i].close()
        if n % 2 == 0:
            plans[i].close()
    del plans
    gc.collect()
    # a plan dropped without close, one closed then collected, one in a reference cycle
    a = make_plan()
    b = make_plan()
    b.close()
    c = make_plan()
    c.self_ref = c
    del a, b, c
    gc.collect()


def test_plan_kept_alive_until_exit():
    code = ("import flashattn, numpy as np\n"
            "keep = [flashattn.Plan(batch=1, seqlen_q=4, seqlen_k=4, heads_q=1, head_dim=8, dtype='fp32',"
            " backend='cpu').finalize() for _ in range(5)]\n"
            "cycle = flashattn.Plan(); cycle.me = cycle\n"
            "keep[2].close()\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(flashattn.__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_concurrent_execute(rng):
    q, k, v = randn(rng, (2, 33, 4, 16)), randn(rng, (2, 33, 4, 16)), randn(rng, (2, 33, 4, 16))
    ro, _ = reference_attention(q, k, v, causal=True)
    with flashattn.Plan(batch=2, seqlen_q=33, seqlen_k=33, heads_q=4, head_dim=16, dtype="fp32", backend="cpu",
                        causal=True) as plan:
        plan.finalize()
        need = plan.workspace_size
        errors = []

        def worker():
            try:
                for _ in range(5):
                    o = np.empty_like(q)
                    ws = np.empty(need + 256, np.uint8)
                    aligned = (ws.ctypes.data + 255) // 256 * 256
                    plan.execute(q, k, v, o, workspace=(aligned, need))
                    assert_close(o, ro, *TOL["float32"], what="O")
                # errors are per thread
                try:
                    plan.execute(q, k, v, o, workspace=(aligned, 0))
                except flashattn.InsufficientWorkspaceError as e:
                    assert "workspace" in e.message
            except Exception as e:  # pragma: no cover
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


def test_info():
    assert flashattn.version()[0] == 0
    assert flashattn.version_string().count(".") == 2
    assert "cpu" in flashattn.build_info()["backends"]
    assert flashattn.device_count() >= 0
    assert flashattn.status_string(flashattn.Status.ERROR_INVALID_ARGUMENT) == "invalid argument"
    if flashattn.device_count() == 0:
        with pytest.raises(flashattn.FlashAttnError):
            flashattn.device_compute_capability(0)


# ------------------------------------------------------------------------------------------
# Finding the library


def _run_import(env_updates):
    env = {key: value for key, value in os.environ.items() if key not in ("FLASHATTN_LIBRARY",)}
    env.update(env_updates)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(flashattn.__file__))
    code = "import flashattn; print(flashattn.library_path()); print(flashattn.version_string())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_explicit_library_path_must_load(tmp_path):
    missing = str(tmp_path / "libflashattn.so.0")
    r = _run_import({"FLASHATTN_LIBRARY": missing})
    assert r.returncode != 0
    assert "FLASHATTN_LIBRARY=" + missing in r.stderr and "LibraryNotFoundError" in r.stderr


def test_found_through_pkg_config(tmp_path):
    libdir = os.path.dirname(os.path.realpath(flashattn.library_path()))
    pc = tmp_path / "flashattn.pc"
    pc.write_text("libdir=%s\nincludedir=/nonexistent\n\nName: flashattn\nDescription: test\nVersion: 0.1.0\n"
                  "Libs: -L${libdir} -lflashattn\nCflags: -I${includedir}\n" % libdir)
    try:
        subprocess.run(["pkg-config", "--version"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("pkg-config is not installed")
    r = _run_import({"PKG_CONFIG_PATH": str(tmp_path), "LD_LIBRARY_PATH": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(libdir)


def test_error_lists_everything_tried(tmp_path):
    r = _run_import({"PKG_CONFIG_PATH": str(tmp_path), "PKG_CONFIG_LIBDIR": str(tmp_path), "LD_LIBRARY_PATH": ""})
    if r.returncode == 0:
        pytest.skip("a libflashattn is installed system-wide: %s" % r.stdout.splitlines()[0])
    for needle in ("FLASHATTN_LIBRARY (not set)", "pkg-config --variable=libdir flashattn", "libflashattn.so.0"):
        assert needle in r.stderr, r.stderr
