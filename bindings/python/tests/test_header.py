"""The ctypes prototypes and enums of the binding against include/flashattn/flashattn.h."""

import ctypes
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import cheader  # noqa: E402

from flashattn import _capi  # noqa: E402

HEADER = os.environ.get("FLASHATTN_HEADER", cheader.DEFAULT_HEADER)
if not os.path.exists(HEADER):  # pragma: no cover
    pytest.skip("flashattn.h not found at %s" % HEADER, allow_module_level=True)

ENUM_TYPES = cheader.enum_typedef_names(HEADER)


def expected_ctype(c_type):
    """The ctypes type a C parameter or return type must be declared with."""
    if c_type in ENUM_TYPES:
        return ctypes.c_int
    plain = {"void": None, "size_t": ctypes.c_size_t, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
             "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64, "double": ctypes.c_double, "const char*": ctypes.c_char_p,
             "char*": ctypes.c_char_p, "float*": ctypes.POINTER(ctypes.c_float),
             "const float*": ctypes.POINTER(ctypes.c_float),
             "int32_t*": ctypes.POINTER(ctypes.c_int32), "const int32_t*": ctypes.POINTER(ctypes.c_int32),
             "int64_t*": ctypes.POINTER(ctypes.c_int64), "double*": ctypes.POINTER(ctypes.c_double),
             "size_t*": ctypes.POINTER(ctypes.c_size_t), "const char**": ctypes.POINTER(ctypes.c_char_p),
             "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p,
             "flashattn_plan_t*": ctypes.c_void_p, "const flashattn_plan_t*": ctypes.c_void_p,
             "flashattn_plan_t**": ctypes.POINTER(ctypes.c_void_p), "flashattn_stream_t": ctypes.c_void_p,
             "flashattn_args_t*": ctypes.c_void_p, "const flashattn_args_t*": ctypes.c_void_p,
             "flashattn_args_t**": ctypes.POINTER(ctypes.c_void_p), "const void**": ctypes.POINTER(ctypes.c_void_p),
             "const void*const*": ctypes.POINTER(ctypes.c_void_p),
             "const float*const*": ctypes.POINTER(ctypes.POINTER(ctypes.c_float))}
    if c_type in plain:
        return plain[c_type]
    base = c_type.rstrip("*")
    if c_type.endswith("*") and base in ENUM_TYPES:
        return ctypes.POINTER(ctypes.c_int)
    raise AssertionError("test_header.py does not know the C type %r; extend expected_ctype()" % c_type)


def test_every_function_has_a_prototype():
    header = cheader.parse_functions(HEADER)
    assert set(header) == set(_capi.PROTOTYPES), (set(header) ^ set(_capi.PROTOTYPES))


@pytest.mark.parametrize("name", sorted(cheader.parse_functions(HEADER)))
def test_prototype_matches(name):
    ret, params = cheader.parse_functions(HEADER)[name]
    restype, argtypes = _capi.PROTOTYPES[name]
    assert restype is expected_ctype(ret) or restype == expected_ctype(ret), (name, ret, restype)
    assert len(argtypes) == len(params), (name, params, argtypes)
    for (c_type, pname), actual in zip(params, argtypes):
        assert actual == expected_ctype(c_type), (name, pname, c_type, actual)


def test_enums_match():
    enums = cheader.parse_enums(HEADER)
    assert set(enums) == set(_capi.ENUMS)
    for typedef, (py_enum, prefix) in _capi.ENUMS.items():
        header_values = {name[len(prefix):]: value for name, value in enums[typedef].items()}
        assert header_values == {m.name: m.value for m in py_enum}, typedef


def test_exported_symbols_list():
    listed = os.path.join(os.path.dirname(HEADER), "..", "..", "tests", "abi", "exported_symbols.txt")
    if not os.path.exists(listed):
        pytest.skip("tests/abi/exported_symbols.txt not found")
    # A line is "name" or "name version-that-introduced-it".
    with open(listed) as f:
        rows = [line.split() for line in f if line.strip() and not line.lstrip().startswith("#")]
    names = {row[0] for row in rows}
    assert names == set(_capi.PROTOTYPES)
    # Functions newer than 0.1 are optional at load time (_capi.SINCE), with the listed version.
    since = {row[0]: row[1] for row in rows if len(row) > 1 and row[1] not in ("0.1", "0.1.0")}
    assert since == _capi.SINCE
