#!/usr/bin/env python3
"""The include rule of docs/architecture.md, checked on the source tree (no build needed): no file
includes a header of a layer above its own, the three kernel generations do not include each
other, the shared CUDA halves include no generation, and dispatch/ holds no CUDA call or
FLASHATTN_WITH_CUDA test. Usage: check_layers.py SRC_DIR. Exit 1 with one line per violation."""
import pathlib
import re
import sys

# Bottom first. A file may include headers of its own layer and of the layers below it.
LAYERS = ["base", "problem", "device", "backends", "dispatch", "capi"]
GENERATIONS = ["fa1", "fa2", "fa3"]


def layer_of(rel):
    return LAYERS.index(rel.parts[0]) if rel.parts[0] in LAYERS else None


def unit_of(rel):
    """The backend part: cpu, cuda/host, cuda/device, cuda/faN, or '' (backends/ itself)."""
    parts = rel.parts
    if parts[0] != "backends" or len(parts) < 3:
        return ""
    return "/".join(parts[1:3]) if parts[1] == "cuda" else parts[1]


def main():
    src = pathlib.Path(sys.argv[1])
    bad = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in {".h", ".cuh", ".cpp", ".cu", ".in"} or not path.is_file():
            continue
        rel = path.relative_to(src)
        own = layer_of(rel)
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            target = pathlib.Path(m.group(1))
            other = layer_of(target)
            where = f"{rel}:{n}: includes {target}"
            if own is not None and other is not None and other > own:
                bad.append(f"{where}: {LAYERS[other]}/ is above {LAYERS[own]}/")
            mine, theirs = unit_of(rel), unit_of(target)
            if mine.startswith("cuda/fa") and theirs.startswith("cuda/fa") and mine != theirs:
                bad.append(f"{where}: one generation includes another")
            if mine in ("cuda/host", "cuda/device", "cpu") and theirs.startswith("cuda/fa"):
                bad.append(f"{where}: shared code includes a generation")
            if mine == "cpu" and theirs.startswith("cuda"):
                bad.append(f"{where}: the CPU backend includes CUDA code")
        if rel.parts[0] == "dispatch":
            for n, line in enumerate(text.splitlines(), 1):
                if re.search(r"\bcuda[A-Z]\w*\s*\(|FLASHATTN_WITH_CUDA|cuda_runtime", line):
                    bad.append(f"{rel}:{n}: dispatch/ must not call CUDA or test FLASHATTN_WITH_CUDA")
    for b in bad:
        print(b)
    print(f"check_layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
