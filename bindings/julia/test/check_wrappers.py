#!/usr/bin/env python3
"""Check bindings/julia/src/FlashAttn.jl against include/flashattn/flashattn.h (no Julia needed).

Every function the header declares must have a raw wrapper of the same name whose ccall names that
symbol, lists the same number of arguments with the Julia types that match the C types, takes that
many arguments and passes them all; every enum constant must exist with the header's value and the
enum's type alias; FUNCTIONS (the symbols loaded) must list exactly the header's functions.

Usage: check_wrappers.py [HEADER] [FlashAttn.jl]; exits 1 listing every mismatch.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common"))
import cheader  # noqa: E402

DEFAULT_JL = os.path.join(HERE, "..", "src", "FlashAttn.jl")

# C type (as cheader spells it) -> the Julia types accepted for it.
SCALARS = {
    "void": {"Cvoid"},
    "size_t": {"Csize_t"},
    "int64_t": {"Int64"},
    "int32_t": {"Int32", "Cint"},
    "uint32_t": {"UInt32", "Cuint"},
    "uint64_t": {"UInt64"},
    "double": {"Cdouble", "Float64"},
    "float": {"Cfloat", "Float32"},
    "char": {"Cchar"},
    "flashattn_plan_t": {"flashattn_plan_t"},
    "flashattn_args_t": {"flashattn_args_t"},
    "flashattn_stream_t": {"flashattn_stream_t"},
    "flashattn_args_t": {"flashattn_args_t"},
    # flashattn_cp.h (checked with src/Cp.jl): the core's types it uses, and its own plan.
    "flashattn_status_t": {"flashattn_status_t", "Cint"},
    "flashattn_cp_plan_t": {"flashattn_cp_plan_t"},
}


def julia_types(c_type, enums, returning=False):
    c_type = re.sub(r"\bconst\b", "", c_type).replace(" ", "").strip()
    if c_type == "char*" and returning:
        return {"Cstring", "Ptr{Cchar}", "Ptr{UInt8}"}
    if c_type.endswith("*"):
        inner = julia_types(c_type[:-1], enums)
        return {"Ptr{%s}" % t for t in inner} | ({"Ptr{Cvoid}"} if c_type == "void*" else set())
    if c_type in enums:
        return {c_type, "Cint", "Int32"}
    if c_type in SCALARS:
        return SCALARS[c_type]
    raise SystemExit("check_wrappers.py: no Julia type known for C type %r" % c_type)


def split_top(text, sep=","):
    """Split at separators outside {} and ()."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def parse_wrappers(jl):
    wrappers = {}
    for line in jl.splitlines():
        m = re.match(r"^(flashattn_\w+)\(([^)]*)\)\s*=\s*ccall\(fptr\(:(\w+)\),\s*(.*)\)\s*$", line)
        if not m:
            continue
        name, formals, symbol, rest = m.groups()
        formals = [f.strip() for f in formals.split(",") if f.strip()]
        # rest: RET, (TYPES...), args...
        ret_end = rest.index(", (")
        ret = rest[:ret_end].strip()
        depth, i = 0, ret_end + 2
        start = i
        while True:
            ch = rest[i]
            depth += ch == "("
            depth -= ch == ")"
            i += 1
            if depth == 0:
                break
        types = split_top(rest[start + 1:i - 1])
        args = split_top(rest[i:].lstrip(", ")) if rest[i:].strip() else []
        wrappers[name] = dict(symbol=symbol, formals=formals, ret=ret, types=types, args=args)
    return wrappers


def main(argv):
    header = argv[1] if len(argv) > 1 else cheader.DEFAULT_HEADER
    jl_path = argv[2] if len(argv) > 2 else DEFAULT_JL
    with open(jl_path, encoding="utf-8") as f:
        jl = f.read()
    functions = cheader.parse_functions(header)
    enums = cheader.parse_enums(header)
    problems = []

    wrappers = parse_wrappers(jl)
    for name, (ret, params) in sorted(functions.items()):
        w = wrappers.get(name)
        if w is None:
            problems.append("%s: no raw wrapper `%s(...) = ccall(fptr(:%s), ...)`" % (name, name, name))
            continue
        if w["symbol"] != name:
            problems.append("%s: ccall names :%s" % (name, w["symbol"]))
        n = len(params)
        if not (len(w["types"]) == len(w["formals"]) == len(w["args"]) == n):
            problems.append("%s: %d C parameters, but %d ccall types, %d wrapper arguments, %d passed"
                            % (name, n, len(w["types"]), len(w["formals"]), len(w["args"])))
        if w["ret"] not in julia_types(ret, enums, returning=True):
            problems.append("%s: returns %s in C, %s in Julia" % (name, ret, w["ret"]))
        for (c_type, pname), jt in zip(params, w["types"]):
            if jt not in julia_types(c_type, enums):
                problems.append("%s: parameter %s is %s in C, %s in Julia (expected one of %s)"
                                % (name, pname, c_type, jt, sorted(julia_types(c_type, enums))))
        if [a for a in w["args"]] != w["formals"]:
            problems.append("%s: passes %s, takes %s" % (name, w["args"], w["formals"]))
    for extra in sorted(set(wrappers) - set(functions)):
        problems.append("%s: wrapped but not declared in the header" % extra)

    m = re.search(r"const FUNCTIONS = \((.*?)\)\n", jl, flags=re.S)
    listed = set(re.findall(r":(\w+)", m.group(1))) if m else set()
    if listed != set(functions):
        problems.append("FUNCTIONS differs from the header: %s" % sorted(listed ^ set(functions)))

    aliases = dict(re.findall(r"^const (flashattn_\w+_t) = (\S+)\s*$", jl, flags=re.M))
    consts = {name: (ty, int(value)) for name, ty, value in
              re.findall(r"^const (FLASHATTN_\w+) = (\w+)\((-?\d+)\)\s*$", jl, flags=re.M)}
    seen = set()
    for typedef, values in sorted(enums.items()):
        if aliases.get(typedef) not in ("Cint", "Int32"):
            problems.append("%s: expected `const %s = Cint`, got %r" % (typedef, typedef, aliases.get(typedef)))
        for name, value in values.items():
            seen.add(name)
            if name not in consts:
                problems.append("%s: missing" % name)
            elif consts[name] != (typedef, value):
                problems.append("%s: %s(%d) in Julia, %s = %d in the header" % (name, consts[name][0], consts[name][1],
                                                                            typedef, value))
    for extra in sorted(set(consts) - seen):
        problems.append("%s: defined in Julia but not in the header" % extra)

    if problems:
        print("FlashAttn.jl does not match %s:\n  %s" % (header, "\n  ".join(problems)))
        return 1
    print("FlashAttn.jl matches %s: %d functions, %d enum constants" % (header, len(functions), len(seen)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
