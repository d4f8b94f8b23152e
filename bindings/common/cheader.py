"""Parse include/flashattn/flashattn.h: the exported functions and the enum constants.

Shared by the bindings' consistency checks (the Python binding's test_header.py and the Julia
wrapper check). Deliberately small: the header is C99 written in one style (every function is
declared as ``FLASHATTN_API <return type> <name>(<parameters>);`` and every enum as
``typedef enum name { A = 1, ... } name_t;``), and a declaration this parser cannot read makes the
checks fail rather than pass.
"""

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HEADER = os.path.normpath(os.path.join(HERE, "..", "..", "include", "flashattn", "flashattn.h"))


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _normalize_type(text):
    """'const  char *' -> 'const char*'; 'flashattn_plan_t **' -> 'flashattn_plan_t**'."""
    text = re.sub(r"\s+", " ", text.strip())
    text = re.sub(r"\s*\*\s*", "*", text)
    return text.strip()


def _split_param(param):
    """'const int32_t *cu_seqlens_q' -> ('const int32_t*', 'cu_seqlens_q')."""
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*$", param.strip(), flags=re.S)
    if not m or not m.group(1).strip():
        raise ValueError("cannot parse parameter %r" % param)
    return _normalize_type(m.group(1)), m.group(2)


def parse_functions(path=DEFAULT_HEADER):
    """{name: (return_type, [(param_type, param_name), ...])} for every FLASHATTN_API function."""
    with open(path, encoding="utf-8") as f:
        text = _strip_comments(f.read())
    functions = {}
    for m in re.finditer(r"FLASHATTN_API\s+([^;(]*?)\b(flashattn_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.S):
        ret, name, params = _normalize_type(m.group(1)), m.group(2), m.group(3).strip()
        if params == "void":
            plist = []
        else:
            plist = [_split_param(p) for p in params.split(",")]
        functions[name] = (ret, plist)
    declared = len(re.findall(r"FLASHATTN_API\b", text))
    if declared != len(functions):
        raise ValueError("parsed %d of %d FLASHATTN_API declarations in %s" % (len(functions), declared, path))
    return functions


def parse_enums(path=DEFAULT_HEADER):
    """{typedef_name: {enumerator: value}} for every ``typedef enum ... { ... } name;``."""
    with open(path, encoding="utf-8") as f:
        text = _strip_comments(f.read())
    enums = {}
    for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        body, name = m.group(1), m.group(2)
        values = {}
        next_value = 0
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            em = re.match(r"^([A-Z_][A-Z0-9_]*)\s*(?:=\s*(-?\d+))?$", item)
            if not em:
                raise ValueError("cannot parse enumerator %r of %s" % (item, name))
            value = int(em.group(2)) if em.group(2) is not None else next_value
            values[em.group(1)] = value
            next_value = value + 1
        enums[name] = values
    return enums


def enum_typedef_names(path=DEFAULT_HEADER):
    return set(parse_enums(path))


if __name__ == "__main__":
    import json
    import sys

    header = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_HEADER
    print(json.dumps({"functions": parse_functions(header), "enums": parse_enums(header)}, indent=1))
